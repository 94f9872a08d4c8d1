"""USM arrays: reading __sycl_usm_array_interface__ (SUAI), and a small array type of our own.

pygdn accepts any object exposing SUAI (dpnp.ndarray, dpnp.tensor.usm_ndarray, dpctl.memory
objects, UsmArray below) and DLPack producers of USM memory (torch XPU tensors, see _dlpack.py)
or, where the device addresses host memory, of host memory (NumPy, torch CPU tensors).
SUAI strides and offset are in ELEMENTS, not bytes.
"""
from __future__ import annotations

import math as _math
import operator as _operator

import numpy as _np

import dpctl as _dpctl
import dpctl.memory as _dpmem

from . import _dlpack

# numpy dtype -> gdn dtype name. bf16 has no numpy type: its arrays carry the bit pattern as
# uint16, made with to_bf16_bits(). Typestrs are compared as dtypes: producers differ in the
# byte-order character (dpnp 0.20 writes '|i4', numpy '<i4').
DTYPE_NAMES = {_np.dtype(_np.float32): "f32", _np.dtype(_np.float16): "f16", _np.dtype(_np.uint16): "bf16",
               _np.dtype(_np.int32): "i32", _np.dtype(_np.int8): "i8", _np.dtype(_np.uint8): "u8", _np.dtype(_np.bool_): "u8",
               _np.dtype(_np.int64): "i64"}  # (i64: named only to be refused by name; the ABI's indices are int32)
NUMPY_DTYPES = {name: dt for dt, name in DTYPE_NAMES.items() if dt.kind != "b"}  # gdn dtype name -> numpy


def dtype_name(typestr):
    """SUAI typestr -> gdn dtype name, or None. Only little-endian (or byte-order free) types."""
    return _typestr_info(typestr)[0]


# dpctl's USM memory objects: their SUAI data[1] is always True (see usm_view).
_MEMORY_TYPES = (_dpmem.MemoryUSMDevice, _dpmem.MemoryUSMShared, _dpmem.MemoryUSMHost)

_TYPESTR_INFO = {}  # typestr -> (gdn dtype name or None, itemsize): np.dtype() costs ~1 µs a call


def _typestr_info(typestr):
    info = _TYPESTR_INFO.get(typestr)
    if info is None:
        try:
            dt = _np.dtype(typestr)
        except TypeError:
            return None, 0
        name = None if dt.byteorder == ">" else DTYPE_NAMES.get(dt.newbyteorder("=") if dt.byteorder == "<" else dt)
        info = _TYPESTR_INFO[typestr] = (name, dt.itemsize)
    return info


# numpy dtype -> its SUAI typestr (dtype.str builds a new string on every access, ~0.14 us; equal
# dtypes have the same .str).
_SUAI_TYPESTR = {}


class UsmArray:
    """A C-contiguous array in USM memory of one queue (a minimal stand-in for dpnp.ndarray).

    usm_type is "shared" (default: host-readable), "device" or "host". Its attributes are
    read-only once made (a Batch keeps its arrays' checked addresses between calls).
    """

    def __init__(self, shape, dtype, queue, usm_type="shared"):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = _np.dtype(dtype)
        self.queue = queue
        nbytes = max(1, int(_np.prod(self.shape, dtype=_np.int64)) * self.dtype.itemsize)
        cls = {"shared": _dpmem.MemoryUSMShared, "device": _dpmem.MemoryUSMDevice, "host": _dpmem.MemoryUSMHost}[usm_type]
        self.memory = cls(nbytes, queue=queue)

    def __setattr__(self, name, value):
        if name in self.__dict__:
            raise AttributeError(f"pygdn.UsmArray.{name} is read-only (make a new array)")
        object.__setattr__(self, name, value)

    @classmethod
    def from_numpy(cls, array, queue, usm_type="shared"):
        array = _np.ascontiguousarray(array)
        out = cls(array.shape, array.dtype, queue, usm_type)
        if array.size:
            out.memory.copy_from_host(array.reshape(-1).view(_np.uint8))
        return out

    def to_numpy(self):
        host = _np.empty(self.shape, self.dtype)
        if host.size:
            self.memory.copy_to_host(host.reshape(-1).view(_np.uint8))
        return host

    def copy_from(self, array):
        array = _np.ascontiguousarray(array, dtype=self.dtype).reshape(self.shape)
        if array.size:
            self.memory.copy_from_host(array.reshape(-1).view(_np.uint8))

    def _usm_fields(self):
        """(address, shape, typestr, queue): what __sycl_usm_array_interface__ is made of (C order,
        no offset). usm_view() reads these directly rather than building the dict each call."""
        typestr = _SUAI_TYPESTR.get(self.dtype)
        if typestr is None:
            typestr = _SUAI_TYPESTR[self.dtype] = self.dtype.str if self.dtype.str != "|b1" else "|u1"
        return self.memory._pointer, self.shape, typestr, self.queue

    @property
    def __sycl_usm_array_interface__(self):
        address, shape, typestr, queue = self._usm_fields()
        return {"data": (address, False), "shape": shape, "strides": None, "typestr": typestr, "version": 1,
                "syclobj": queue}


def to_bf16_bits(x):
    """float array -> uint16 bf16 bit patterns (round to nearest even; a NaN stays a NaN, quieted,
    as the kernels store it: rounding a NaN's low bits up could carry into the sign, -0)."""
    f = _np.ascontiguousarray(x, dtype=_np.float32)
    u = f.view(_np.uint32).astype(_np.uint64)
    u = _np.where(_np.isnan(f), (u >> 16) | 0x40, (u + 0x7FFF + ((u >> 16) & 1)) >> 16)
    return u.astype(_np.uint16)


def from_bf16_bits(bits):
    """uint16 bf16 bit patterns -> float32 array."""
    return (_np.asarray(bits, dtype=_np.uint16).astype(_np.uint32) << 16).view(_np.float32)


def usm_view(obj, name, queue):
    """What pygdn needs from an array argument, an SUAI object or a DLPack producer, as a tuple
    (address, shape, dtype, strides, queue, hold, unwritable): element-0 address, shape, dtype
    name, strides in elements (None: C order), the producer's queue (SUAI; None for DLPack, whose device and context are
    checked on intake), hold, what must stay alive while a call may use the memory (the object;
    for DLPack the consumed tensor, which holds the object), and why a call must not write the
    memory, or None (read-only: SUAI data[1], DLPack 1.x flags; a DLPack copy). Read afresh on every
    call: an object may change what it describes. (A tuple, not an object: ~16 of them per call.)"""
    if type(obj) is UsmArray:  # (exactly: a subclass may describe itself differently)
        # pygdn's own array: the fields its SUAI dict is made of, read as the dict would be,
        # without building it (~0.6 of ~1 us per array).
        address, shape, typestr, syclobj = obj._usm_fields()
        dtype = _typestr_info(typestr)[0]
        if dtype is None:
            raise TypeError(f"{name}: unsupported element type {typestr!r}")
        q = syclobj if isinstance(syclobj, _dpctl.SyclQueue) else _queue_of(syclobj, obj)
        return address, tuple(shape), dtype, None, q, obj, False
    fast = _dlpack.torch_host_view(obj, queue)
    if fast is not None:
        hold, address, shape, strides, dtype = fast
        return address, shape, dtype, strides, None, hold, None
    try:
        s = obj.__sycl_usm_array_interface__
    except AttributeError:
        if not _dlpack.is_producer(obj):
            raise TypeError(f"{name}: expected an object with __sycl_usm_array_interface__ (dpnp.ndarray, "
                            f"dpctl.memory, pygdn.UsmArray) or a kDLOneAPI DLPack tensor (__dlpack__: torch "
                            f"XPU, JAX), got {type(obj).__name__}") from None
        hold, address, shape, strides, dtype = _dlpack.consume(obj, name, queue)
        return address, shape, dtype, strides, None, hold, hold.unwritable
    shape = tuple(s["shape"])
    typestr = s["typestr"]
    dtype, itemsize = _typestr_info(typestr)
    if dtype is None:
        raise TypeError(f"{name}: unsupported element type {typestr!r}")
    address = int(s["data"][0]) + int(s.get("offset", 0) or 0) * itemsize
    # data[1] is the read-only flag (usm_ndarray, dpnp); dpctl.memory objects set it True always,
    # meaning "writable" in their own docstring: not read there.
    data = s["data"]
    read_only = len(data) > 1 and bool(data[1]) and not isinstance(obj, _MEMORY_TYPES)
    strides = s.get("strides")
    return (address, shape, dtype, None if strides is None else tuple(strides), _queue_of(s.get("syclobj"), obj), obj,
            "read-only memory (its producer says so)" if read_only else None)


def c_contiguous(shape, strides):
    """Strides in elements (SUAI and DLPack alike), None = C order. A dimension of one element
    may have any stride; an empty array is contiguous."""
    if strides is None or 0 in shape:
        return True
    acc = 1
    for n, st in zip(reversed(shape), reversed(tuple(strides))):
        if n != 1 and st != acc:
            return False
        acc *= n
    return True


def leading_stride(shape, strides):
    """Elements between entries of the leading dimension (slots of a cache, rows of a token
    array) when the dimensions after it are C-contiguous, else None. An array of one entry (or
    none) reports the dense stride, whatever its producer says."""
    dense = _math.prod(shape[1:])
    if strides is None or len(shape) < 1:
        return dense
    if not c_contiguous(shape[1:], strides[1:]):
        return None
    return int(strides[0]) if shape[0] > 1 else dense


def _queue_of(syclobj, obj):
    if isinstance(syclobj, _dpctl.SyclQueue):
        return syclobj
    q = getattr(obj, "sycl_queue", None)
    if isinstance(q, _dpctl.SyclQueue):
        return q
    return _dpmem.as_usm_memory(obj).sycl_queue


def as_queue(queue):
    """The queue argument as a dpctl.SyclQueue: a dpctl.SyclQueue itself, a sycl::queue* as a
    Python int (torch: torch.xpu.current_stream().sycl_queue), or a "SyclQueueRef" capsule
    (dpctl.SyclQueue._get_capsule(); consumed, as dpctl consumes one). The int and the capsule
    become a dpctl copy of the queue, which shares its implementation (the same queue)."""
    if isinstance(queue, _dpctl.SyclQueue):
        return queue
    if hasattr(queue, "__index__") and not isinstance(queue, bool):  # int, numpy integer
        return _dlpack.queue_from_pointer(_operator.index(queue))
    if type(queue).__name__ == "PyCapsule":
        try:
            return _dpctl.SyclQueue(queue)
        except (TypeError, ValueError) as e:
            raise TypeError(f"queue: a capsule dpctl cannot take as a queue ({e})") from None
    raise TypeError(f"queue: expected a dpctl.SyclQueue, a sycl::queue* as int, or a 'SyclQueueRef' capsule, "
                    f"got {type(queue).__name__}")
