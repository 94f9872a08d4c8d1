"""DLPack intake: arrays of frameworks that offer `__dlpack__` / `__dlpack_device__` (torch XPU,
JAX) instead of `__sycl_usm_array_interface__`.

The protocol (dmlc/dlpack, "Python specification"): the consumer asks the producer for a capsule
named "dltensor_versioned" (DLManagedTensorVersioned, when it passes max_version >= (1, 0)) or
"dltensor" (DLManagedTensor, older producers), renames it "used_..." to take ownership, and calls
the tensor's deleter exactly once when it no longer needs the memory. Device type kDLOneAPI (14)
means USM memory; its device_id is the device's index in sycl::device::get_devices() (what
dpctl.get_devices() lists, and what torch's getGlobalIdxFromDevice and dpctl's
SyclDevice.get_device_id() return).
"""
from __future__ import annotations

import ctypes as _ctypes
import os as _os
import sys as _sys

import cffi as _cffi
import dpctl as _dpctl

_ffi = _cffi.FFI()
_ffi.cdef("""
typedef struct { uint32_t major; uint32_t minor; } DLPackVersion;
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
  void *data; DLDevice device; int32_t ndim; DLDataType dtype;
  int64_t *shape; int64_t *strides; uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor; void *manager_ctx; void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
typedef struct DLManagedTensorVersioned {
  DLPackVersion version; void *manager_ctx; void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags; DLTensor dl_tensor;
} DLManagedTensorVersioned;
""")

KDL_CPU, KDL_ONEAPI = 1, 14
_DEVICE_NAMES = {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan", 8: "kDLMetal",
                 10: "kDLROCM", 11: "kDLROCMHost", 13: "kDLCUDAManaged", 14: "kDLOneAPI"}
# (type code, bits) -> pygdn dtype name. Codes: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6.
# uint16 is taken as bf16 bit patterns, as on the SUAI path.
# int64 is named only to be refused by name (the ABI's index arrays are int32).
DTYPES = {(2, 32): "f32", (2, 16): "f16", (4, 16): "bf16", (1, 16): "bf16", (0, 32): "i32", (0, 8): "i8", (1, 8): "u8", (6, 8): "u8",
          (0, 64): "i64"}

# Own prototypes of the capsule API (ctypes.pythonapi's function objects are shared process-wide:
# setting their argtypes here would change them for everyone).
_capsule_is_valid = _ctypes.PYFUNCTYPE(_ctypes.c_int, _ctypes.py_object, _ctypes.c_char_p)(
    ("PyCapsule_IsValid", _ctypes.pythonapi))
_capsule_pointer = _ctypes.PYFUNCTYPE(_ctypes.c_void_p, _ctypes.py_object, _ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _ctypes.pythonapi))
_capsule_rename = _ctypes.PYFUNCTYPE(_ctypes.c_int, _ctypes.py_object, _ctypes.c_char_p)(
    ("PyCapsule_SetName", _ctypes.pythonapi))
_capsule_new = _ctypes.PYFUNCTYPE(_ctypes.py_object, _ctypes.c_void_p, _ctypes.c_char_p, _ctypes.c_void_p)(
    ("PyCapsule_New", _ctypes.pythonapi))


# (struct, capsule name before, after consumption). A capsule keeps the pointer to its name, not a
# copy: the names live here, as long as the module.
_CAPSULE_NAMES = ((_ffi.typeof("DLManagedTensorVersioned *"), b"dltensor_versioned", b"used_dltensor_versioned"),
                  (_ffi.typeof("DLManagedTensor *"), b"dltensor", b"used_dltensor"))
_VERSIONED, _UINTPTR = _CAPSULE_NAMES[0][0], _ffi.typeof("uintptr_t")
_QUEUE_CAPSULE_NAME = b"SyclQueueRef"


def is_producer(obj) -> bool:
    return hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")


class ManagedTensor:
    """Owns one consumed DLPack capsule's tensor: release() (or dropping this object) calls its
    deleter, exactly once. `producer` is kept alive with it; `tensor` (the DLTensor) is valid
    until release()."""

    __slots__ = ("_ptr", "producer", "tensor", "unwritable")
    _NULL = _ffi.NULL  # (held by the class: at interpreter exit the module's globals may be gone first)

    def __init__(self, capsule, producer, name):
        self.producer, self._ptr = producer, None
        for ctype, unused, used in _CAPSULE_NAMES:
            if _capsule_is_valid(capsule, unused):
                address = _capsule_pointer(capsule, unused)
                if _capsule_rename(capsule, used):
                    raise BufferError(f"{name}: could not rename the DLPack capsule (consume it)")
                self._ptr = _ffi.cast(ctype, address)  # ours from here on: release() frees it
                break
        else:
            raise TypeError(f"{name}: __dlpack__() returned {capsule!r}, not an unused 'dltensor' or "
                            "'dltensor_versioned' capsule")
        if ctype is _VERSIONED and self._ptr.version.major != 1:
            raise BufferError(f"{name}: DLPack version {self._ptr.version.major}.{self._ptr.version.minor} "
                              "(pygdn reads 1.x)")
        self.tensor = self._ptr.dl_tensor
        # Why a call must not write it, or None. DLPack 1.x flags (a legacy capsule cannot say):
        # bit 0 READ_ONLY, bit 1 IS_COPIED (the producer exported a copy: writes would be lost).
        flags = self._ptr.flags if ctype is _VERSIONED else 0
        self.unwritable = ("read-only memory (its producer says so)" if flags & 1 else
                           "a copy its producer made (DLPack IS_COPIED): what the call writes would be lost"
                           if flags & 2 else None)

    def release(self):
        ptr, self._ptr = self._ptr, None
        if ptr is not None and ptr.deleter != self._NULL:
            ptr.deleter(ptr)

    def __del__(self):
        self.release()


def _export(obj):
    """The producer's capsule: versioned when it speaks DLPack >= 1.0, else the legacy one."""
    try:
        return obj.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer from before DLPack 1.0 takes no max_version
        return obj.__dlpack__()


class _QueueFacts:
    """What intake checks against, of one queue: its context (and the context's handle) and the
    DLPack device ids already found to be devices of that context. Kept for the last queue seen
    (a call passes ~20 arrays with one queue; dpctl objects cost ~µs each to make). This holds
    that one queue object alive until another queue is used."""

    __slots__ = ("queue", "context", "context_ref", "device_ids")

    def __init__(self, queue):
        self.queue, self.context = queue, queue.sycl_context
        self.context_ref, self.device_ids = self.context.addressof_ref(), set()


_DEVICES = []  # dpctl.get_devices(): the runtime's enumeration does not change in a process
_LAST = [None]
_USM_TYPE = []  # dpctl's DPCTLUSM_GetPointerType, or None where dpctl's C library does not offer it


def _facts(queue, device_id, name):
    """The queue's facts, with device_id checked: dpctl.get_devices()[device_id] must be a device of
    the queue's context."""
    f = _LAST[0]
    if f is None or f.queue is not queue:
        f = _LAST[0] = _QueueFacts(queue)
    if device_id in f.device_ids:
        return f
    if not _DEVICES:
        _DEVICES.extend(_dpctl.get_devices())
    if not 0 <= device_id < len(_DEVICES):
        raise ValueError(f"{name}: DLPack kDLOneAPI device {device_id} is not one of the {len(_DEVICES)} SYCL "
                         "devices of this process (sycl::device::get_devices())")
    dev = _DEVICES[device_id]
    if dev != queue.sycl_device and dev not in f.context.get_devices():
        raise ValueError(f"{name}: DLPack device {device_id} ({dev.name}) is not a device of the queue's context")
    f.device_ids.add(device_id)
    return f


def _is_usm_of(address, facts):
    """Whether address is a USM allocation of the queue's context (True when dpctl cannot tell)."""
    if not _USM_TYPE:
        try:
            c = _ctypes.CDLL(_os.path.join(_os.path.dirname(_dpctl.__file__), "libDPCTLSyclInterface.so"))
            fn = c.DPCTLUSM_GetPointerType
            fn.restype, fn.argtypes = _ctypes.c_int, [_ctypes.c_void_p, _ctypes.c_void_p]
        except (OSError, AttributeError):
            fn = None  # the library's own pointer check (GDN_ERROR_BAD_POINTER) still applies
        _USM_TYPE.append(fn)
    fn = _USM_TYPE[0]
    return fn is None or fn(address, facts.context_ref) != 0  # 0 = DPCTL_USM_UNKNOWN


def host_memory_ok(queue) -> bool:
    """Whether the queue's device addresses system memory (sycl::aspect::usm_system_allocations: the
    SYCL CPU device), so that host arrays (kDLCPU DLPack: NumPy, torch CPU) are passed as they are
    (gdn_xpu.h, "Host memory")."""
    if _HOST_OK[0] is not queue:
        _HOST_OK[:] = [queue, bool(queue.sycl_device.has_aspect_usm_system_allocations)]
    return _HOST_OK[1]


_HOST_OK = [None, False]  # the last queue asked about (holding it, as _LAST does) and the answer


def consume(obj, name, queue):
    """A DLPack producer -> (ManagedTensor, address of element 0, shape, strides or None, dtype name).
    Devices other than oneAPI, and host memory where the queue's device cannot address it, are
    refused before any capsule is made."""
    dev_type, dev_id = (int(v) for v in obj.__dlpack_device__())
    host = dev_type == KDL_CPU and host_memory_ok(queue)
    if dev_type != KDL_ONEAPI and not host:
        where = _DEVICE_NAMES.get(dev_type, f"device type {dev_type}")
        raise TypeError(f"{name}: expected an object with __sycl_usm_array_interface__ or a kDLOneAPI DLPack "
                        f"tensor (USM memory of the queue's context), got a {where} DLPack tensor "
                        f"({type(obj).__name__})" + (" in host memory, which the queue's device "
                                                     f"({queue.sycl_device.name}) cannot address (no "
                                                     "usm_system_allocations)" if dev_type == KDL_CPU else ""))
    facts = None if host else _facts(queue, dev_id, name)
    held = ManagedTensor(_export(obj), obj, name)
    t = held.tensor
    dt, ndim = t.dtype, t.ndim
    code, bits, lanes = dt.code, dt.bits, dt.lanes
    dtype = DTYPES.get((code, bits)) if lanes == 1 else None
    if dtype is None:
        raise TypeError(f"{name}: unsupported DLPack dtype (code {code}, bits {bits}, lanes {lanes})")
    shape = tuple(_ffi.unpack(t.shape, ndim)) if ndim else ()
    strides = None if t.strides == _ffi.NULL else tuple(_ffi.unpack(t.strides, ndim))
    address = int(_ffi.cast(_UINTPTR, t.data)) + t.byte_offset
    if facts is not None and 0 not in shape and not _is_usm_of(address, facts):  # (an empty tensor: no memory)
        raise ValueError(f"{name}: lives in another SYCL context than the queue (its DLPack data pointer is not "
                         "USM memory of the queue's context)")
    return held, address, shape, strides, dtype


_TORCH_DTYPES = {}  # torch dtype -> pygdn dtype name, as DTYPES maps the DLPack types torch exports them as


def torch_host_view(obj, queue):
    """(hold, address, shape, strides, dtype name) of a torch CPU tensor, read from the tensor (~1 us)
    instead of through a DLPack capsule (~10 us; a serving engine passes a few per layer step), or None
    for anything else: consume() then decides, with its errors. Taken only where consume() would take
    the tensor as it is: torch already imported by the process, a strided CPU tensor without autograd
    and without a conjugate or negative bit (torch exports none of those), a queue whose device
    addresses host memory. hold is a detached alias of the tensor: like a capsule, it keeps the memory
    alive even if the tensor object is later pointed elsewhere (set_)."""
    torch = _sys.modules.get("torch")
    if (torch is None or not isinstance(obj, torch.Tensor) or not obj.is_cpu or obj.requires_grad
            or obj.layout is not torch.strided or obj.is_conj() or obj.is_neg() or not host_memory_ok(queue)):
        return None
    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int32: "i32", torch.int8: "i8",
                              torch.uint8: "u8", torch.bool: "u8", torch.int64: "i64"})
    dtype = _TORCH_DTYPES.get(obj.dtype)
    if dtype is None:
        return None
    return obj.detach(), obj.data_ptr(), tuple(obj.shape), obj.stride(), dtype


def torch_layout(obj):
    """What the checks of a torch tensor argument depend on besides its address -- device, dtype,
    shape, strides (True: contiguous), autograd and negative bits -- as a hashable tuple, or None for
    anything but a strided torch tensor (_marshal.marshal_arrays keeps the layouts that passed; the
    conjugate bit is left out: only complex tensors have it, and no check passes those). Torch is
    not imported here: only a tensor of an imported torch is one."""
    if not _TORCH:
        torch = _sys.modules.get("torch")
        if torch is None:
            return None
        _TORCH[:] = torch.Tensor, torch.strided
    tensor, strided = _TORCH
    if not isinstance(obj, tensor) or obj.layout is not strided:
        return None
    return obj.device, obj.dtype, obj.shape, obj.is_contiguous() or obj.stride(), obj.requires_grad, obj.is_neg()


_TORCH = []  # torch.Tensor and torch.strided, once torch is imported (torch_layout)


def queue_from_pointer(address):
    """A dpctl.SyclQueue of the sycl::queue at address (dpctl copies the handle: the copy shares
    the queue's implementation, so work, waits and ordering are the same queue's)."""
    if not address:
        raise ValueError("queue: NULL sycl::queue pointer")
    return _dpctl.SyclQueue(_capsule_new(address, _QUEUE_CAPSULE_NAME, None))
