"""A call's arrays checked and marshalled into gdn_tensors_t (and its config and batch into their
structs): shapes, dtypes, strides, writability and queues checked in Python, with errors naming the
argument; the library checks every pointer again (USM of the queue's context, extents)."""
from __future__ import annotations

import math as _math
import weakref as _weakref

from ._lib import ffi as _ffi, lib as _lib
from . import _dlpack
from ._c import (VOIDP as _VOIDP, TENSORS_P as _TENSORS_P, cast as _cast, DTYPES as _DTYPES)
from ._usm import (NUMPY_DTYPES as _NUMPY_DTYPES, UsmArray as _UsmArray, c_contiguous as _c_contiguous,
                   leading_stride as _leading_stride, usm_view as _usm_view)
from .config import Config


def arrays_cached(cfg: Config, queue, rows: int, arrays: dict, keep: list):
    """(gdn_tensors_t, bound) of the last call with this config, when this call passes the same
    pygdn.UsmArray objects (whose address, shape and dtype never change) under the same names,
    with the same queue object and row count: their checks would give what they gave then. None
    otherwise. Appends the arrays to keep. The config holds the arrays by weak reference only."""
    cached = cfg.__dict__.get("_arrays_cache")
    if cached is None or cached[0] is not queue or cached[1] != rows or cached[2] != tuple(arrays):
        return None
    for obj, ref in zip(arrays.values(), cached[3]):
        if obj is not (None if ref is None else ref()):
            return None
    keep.extend(obj for obj in arrays.values() if obj is not None)
    return _ffi.new(_TENSORS_P, cached[4][0]), cached[5]


def view(obj, name, queue, written=False, strided=False):
    """(address, shape, dtype name, hold, leading stride) of an array argument, after the checks every
    array gets (written: the call writes it, so memory marked read-only, or a producer's copy, is
    refused). strided: the leading dimension (slots, rows) may have any stride, the others must be
    C-contiguous; else the whole array must be (its leading stride is then the dense one)."""
    address, shape, dtype, strides, q, hold, unwritable = _usm_view(obj, name, queue)
    lead = _leading_stride(shape, strides) if strided else None
    if strided and lead is None:
        raise ValueError(f"{name}: the dimensions after the first must be C-contiguous (strides {strides})")
    if not strided and not _c_contiguous(shape, strides):
        raise ValueError(f"{name}: must be C-contiguous")
    if written and unwritable:
        raise ValueError(f"{name}: {unwritable}, but the call writes it")
    # The same queue object is the common case; comparing contexts builds dpctl objects (~µs each).
    # (A DLPack tensor has no queue: its device and context were checked when it was consumed.)
    if q is not None and q is not queue and q.sycl_context != queue.sycl_context:
        raise ValueError(f"{name}: lives in another SYCL context than the queue")
    return address, shape, dtype, hold, lead



TENSORS_INIT = _ffi.new(_TENSORS_P)  # gdn_tensors_init's defaults, copied by every call
_lib.gdn_tensors_init(TENSORS_INIT)


# The arrays a call writes (but gdn_gated_delta_rule reads conv_out).
WRITTEN = frozenset(("conv_state", "conv_out", "ssm_state", "ssm_scale", "core_attn_out", "workspace", "z_out", "replay_ring",
                      "replay_count"))
# Arrays whose leading stride is free: token arrays (their gdn_tensors_t row-stride field) and the
# caches (the slot stride of the config, which the array must match: engines page their caches).
ROW_STRIDES = {"mixed_qkv": "mixed_qkv_stride", "conv_out": "conv_out_stride", "a": "ab_stride", "b": "b_stride",
                "core_attn_out": "out_stride", "z": "z_stride", "qkvz": "qkvz_stride", "ba": "ba_stride",
                "z_out": "z_out_stride"}
SLOT_STRIDES = {"conv_state": "conv_slot_stride", "ssm_state": "ssm_slot_stride", "ssm_scale": "ssm_scale_slot_stride"}


def marshal(fn, queue, cfg: Config, batch, arrays: dict):
    """Check every argument of a call of C function fn (batch: a pygdn.Batch) and build the three C
    structs. Returns (c_cfg, c_batch, c_tensors, keep, bound): keep holds every array object (and
    consumed DLPack tensor), so their memory outlives the call; a DLPack tensor's deleter runs when
    keep is dropped.
    bound: field -> (hold, entries, leading stride, dense stride) of each array (what rebinding needs)."""
    keep = []
    c_cfg = cfg._to_c(_dlpack.host_memory_ok(queue))
    c_batch = batch._to_c(queue, keep)
    rows = batch.num_actual_tokens
    hit = arrays_cached(cfg, queue, rows, arrays, keep)
    if hit is not None:
        return (c_cfg, c_batch, *hit[:1], keep, hit[1])
    c_t = _ffi.new(_TENSORS_P, TENSORS_INIT[0])
    bound = {}
    fixed = marshal_arrays(fn, queue, cfg, rows, arrays, c_t, bound)
    keep.extend(entry[0] for entry in bound.values())
    if fixed:
        refs = tuple(None if obj is None else _weakref.ref(obj) for obj in arrays.values())
        object.__setattr__(cfg, "_arrays_cache", (queue, rows, tuple(arrays), refs, _ffi.new(_TENSORS_P, c_t[0]),
                                                  {f: (None, *rest) for f, (_, *rest) in bound.items()}))
    return c_cfg, c_batch, c_t, keep, bound


def marshal_arrays(fn, queue, cfg: Config, rows: int, arrays: dict, c_t, bound: dict) -> bool:
    """Check arrays (field -> object or None) for a call of C function fn with rows token rows, write
    their addresses into c_t and record them in bound (field -> (hold, entries, leading stride, dense
    stride)), which may hold arrays checked before (a rebind, whose c_t keeps their stride fields):
    the stride fields of c_t are set from the arrays given. Returns whether every array given is a
    pygdn.UsmArray."""
    specs = cfg._tensor_specs(rows)
    fixed, given, checked = True, [], []
    # (the per-step path of torch token arrays reads its names once: a serving loop's layers run it)
    torch_layout, seen_before, row_strides, qid = _dlpack.torch_layout, TORCH_CHECKED.get, ROW_STRIDES, id(queue)
    for field, obj in arrays.items():
        if obj is None:
            continue
        layout = torch_layout(obj) if field in row_strides else None
        if layout is not None:
            spec = specs[field]
            key = (qid, field, spec, layout)
            seen = seen_before(key)
            if seen is not None and seen[2] is queue:  # (held as it is: the tensor keeps its memory alive)
                bound[field] = (obj, seen[0], seen[1], spec[2])
                fixed = False
                setattr(c_t, field, _cast(_VOIDP, obj.data_ptr()))
                setattr(c_t, row_strides[field], seen[3])
                continue
            checked.append((key, field))
        given.append(field)
        if field not in specs:
            raise TypeError(f"unknown array argument {field!r}")
        if field.startswith("replay_") and not cfg.replay_tokens:
            raise ValueError(f"{field}: given, but cfg.replay_tokens = 0 (the per-token mode has no rings)")
        dtype, lead, inner = specs[field]
        written = field in WRITTEN and not (field == "conv_out" and fn is _lib.gdn_gated_delta_rule)
        address, shape, got, hold, stride = view(obj, field, queue, written,
                                                  field in ROW_STRIDES or field in SLOT_STRIDES)
        if field == "workspace":
            c_t.workspace_bytes = _math.prod(shape) * _NUMPY_DTYPES[got].itemsize
        else:
            if field == "dt_bias":  # f32, or the activations' dtype (gdn_tensors_t.dt_bias_dtype)
                if got == cfg.act_dtype:
                    dtype = got
                elif got != dtype:
                    raise TypeError(f"dt_bias: dtype {got}, expected f32 or act_dtype ({cfg.act_dtype!r})")
                c_t.dt_bias_dtype = _DTYPES[dtype]
            if dtype == "f8e4m3" and got == "u8":  # (E4M3 codes: uint8 bit patterns, as bf16's are uint16)
                got = dtype
            if got != dtype:
                if field in ("A_log", "g", "beta"):
                    raise TypeError(f"{field}: dtype {got}, expected f32 (the ABI's gate parameters are f32 whatever "
                                    "act_dtype is: convert once, at load time)")
                which = "state_dtype" if field == "ssm_state" else "act_dtype"
                raise TypeError(f"{field}: dtype {got}, expected {dtype} (cfg.{which}={getattr(cfg, which)!r})")
            if not shape or shape[0] < lead or _math.prod(shape[1:]) != inner:
                raise ValueError(f"{field}: shape {shape}, expected [{'>=' if lead == rows else ''}"
                                 f"{lead}, ...{inner} elements per row]")
        bound[field] = (hold, shape[0] if shape else 0, stride, inner)
        fixed = fixed and type(obj) is _UsmArray
        setattr(c_t, field, _ffi.cast(_VOIDP, address))
    if given:  # (a rebind of torch token arrays whose layouts passed before gives none)
        apply_strides(cfg, c_t, bound, given)
        if checked and len(TORCH_CHECKED) >= 1024:
            TORCH_CHECKED.clear()
        for key, field in checked:
            TORCH_CHECKED[key] = (*bound[field][1:3], queue, getattr(c_t, ROW_STRIDES[field]))
    return fixed


# Token arrays given as torch tensors (what a serving loop passes anew at every layer and step): the
# checks above depend on a tensor's type, device, dtype, shape and strides (_dlpack.torch_layout), not
# on its address, so a tensor of a layout that passed them for the same field, spec and queue object
# passes again; only its address is read (data_ptr()). The library checks every pointer on every
# call (USM of the queue's context, extents) whatever Python checked. Keys hold the queue's id, values
# (entries, leading stride, the queue, the gdn_tensors_t row-stride field's value).
TORCH_CHECKED = {}


def apply_strides(cfg: Config, c_t, bound, fields):
    """bound: field -> (hold, entries, leading stride or None, dense stride) of the arrays of a call.
    The row strides of the token arrays among fields go to their gdn_tensors_t fields (0: dense; b's
    always set: its 0 would mean a's stride); the slot strides of the caches among them are checked
    against the config's (which the library reads from gdn_config_t)."""
    for field in fields:
        _, entries, stride, dense = bound[field]
        if stride is None:
            continue
        if field in SLOT_STRIDES:
            cfg_field = SLOT_STRIDES[field]
            want = getattr(cfg, cfg_field) or dense
            if entries > 1 and stride != want:
                raise ValueError(f"{field}: slot stride {stride} elements, but cfg.{cfg_field}="
                                 f"{getattr(cfg, cfg_field)} ({want} elements; 0 = dense)")
        else:
            setattr(c_t, ROW_STRIDES[field], stride if field == "b" or stride != dense else 0)

