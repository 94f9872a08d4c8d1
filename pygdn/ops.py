"""The public functions: causal_conv1d, gated_delta_rule, attention (the whole GDN op).

Each checks shapes, dtypes, contiguity and queues in Python (ValueError / TypeError naming the
argument), then calls the C ABI, which validates the metadata contents and every array's extent
against its USM allocation (an array object describing more memory than its allocation holds is
refused there) and raises GdnError with the library's message on failure. Layouts: see
include/gdn_xpu.h and docs/op.md.

The queue: a dpctl.SyclQueue, a sycl::queue* as an int (torch.xpu.current_stream().sycl_queue)
or a "SyclQueueRef" capsule. Arrays: objects with __sycl_usm_array_interface__, or DLPack
producers of kDLOneAPI (USM) tensors, or, on a device that addresses host memory (the SYCL CPU
device: sycl::aspect::usm_system_allocations), of kDLCPU tensors (NumPy, torch CPU) as they are
(see _usm.py, _dlpack.py). Arrays are C-contiguous, except that the leading dimension of the token
arrays (rows) and of the caches (slots: Config.conv_slot_stride / ssm_slot_stride) may be strided.
"""
from __future__ import annotations

import dataclasses as _dc
import inspect as _inspect
import math as _math
import operator as _operator
import typing as _t
import weakref as _weakref

from ._lib import ffi as _ffi, last_error as _last_error, lib as _lib, status_name as _status_name
from . import _dlpack
from ._usm import (NUMPY_DTYPES as _NUMPY_DTYPES, UsmArray as _UsmArray, as_queue as _as_queue,
                   c_contiguous as _c_contiguous, leading_stride as _leading_stride, usm_view as _usm_view)

# cffi types looked up once (a type given as a string is parsed or looked up on every use).
_VOIDP = _ffi.typeof("void *")
_BATCH_P = _ffi.typeof("gdn_batch_t *")
_TENSORS_P = _ffi.typeof("gdn_tensors_t *")
# ffi.cast and ffi.new without their Python wrappers (which first look a type given by name up), for
# the types above on the per-step paths (rebind, a bound batch): ~0.3 µs a call less each.
_cast, _new = _ffi._backend.cast, _ffi._backend.newp

_DTYPES = {"f32": _lib.GDN_DTYPE_F32, "f16": _lib.GDN_DTYPE_F16, "bf16": _lib.GDN_DTYPE_BF16}
_SSM_LAYOUTS = {"kv": _lib.GDN_SSM_KV, "vk": _lib.GDN_SSM_VK}
_CONV_LAYOUTS = {"dim_major": _lib.GDN_CONV_DIM_MAJOR, "time_major": _lib.GDN_CONV_TIME_MAJOR}
_CONV_SPEC = {"snapshot": _lib.GDN_CONV_SPEC_SNAPSHOT, "rolled": _lib.GDN_CONV_SPEC_ROLLED}
_PACKED = {"none": _lib.GDN_PACKED_NONE, "grouped": _lib.GDN_PACKED_GROUPED, "contiguous": _lib.GDN_PACKED_CONTIGUOUS}
_GATE_MODES = {"head": _lib.GDN_GATE_HEAD, "channel": _lib.GDN_GATE_CHANNEL}
_OUT_GATES = {"silu": _lib.GDN_OUT_GATE_SILU, "sigmoid": _lib.GDN_OUT_GATE_SIGMOID}


class GdnError(RuntimeError):
    """A libgdn_xpu call failed. .status is the gdn_status_t, .status_name its name."""

    def __init__(self, status: int, message: str):
        self.status = int(status)
        self.status_name = _status_name(status)
        super().__init__(f"{self.status_name}: {message}")


def _check(status: int) -> None:
    if status != _lib.GDN_SUCCESS:
        raise GdnError(status, _last_error())


def _choice(table, value, name):
    if value not in table:
        raise ValueError(f"{name}={value!r}: expected one of {sorted(table)}")
    return table[value]


def _int(value, name, bits):
    """value for an int<bits>_t field of a C struct, or an error naming the field (an int-like
    value only: 3.7 is not silently 3)."""
    try:
        v = _operator.index(value)
    except TypeError:
        raise TypeError(f"{name}={value!r}: expected an integer, got {type(value).__name__}") from None
    if not -2**(bits - 1) <= v < 2**(bits - 1):
        raise ValueError(f"{name}={v}: does not fit int{bits}")
    return v


def _int32(value, name):
    return _int(value, name, 32)


def _int64(value, name):
    return _int(value, name, 64)


def _float(value, name):
    """value for a float field of a C struct, or an error naming the field (a number, not text)."""
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}={value!r}: expected a number, got {type(value).__name__}") from None


# What a Config derives from its fields and keeps until one of them changes (Config.__setattr__).
_CONFIG_CACHES = ("_c_cache", "_specs_cache", "_arrays_cache")


@_dc.dataclass
class Config:
    """Model dims, dtypes and cache layouts of one GDN layer (gdn_config_t).

    The layouts default to vLLM >= 0.34's caches (vk / time_major / rolled); the C library's
    gdn_config_init gives kv / dim_major / snapshot (zeros). Set them explicitly when porting."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    num_slots: int
    conv_width: int = 4
    act_dtype: str = "bf16"            # "f32" | "f16" | "bf16" (bf16 arrays hold uint16 bit patterns)
    state_dtype: str = "f32"           # of ssm_state: "f32" | "bf16" | "f16"
    ssm_layout: str = "vk"             # "kv": [slots, HV, K, V]; "vk": [slots, HV, V, K]
    conv_layout: str = "time_major"    # "dim_major": [slots, conv_dim, state_len]; "time_major": transposed
    conv_spec_layout: str = "rolled"   # "snapshot" | "rolled"
    conv_state_len: int = 0            # 0 = conv_width - 1 (+ num_spec for "rolled": set it!)
    conv_slot_stride: int = 0          # elements between conv_state slots; 0 = dense (one slot's size)
    ssm_slot_stride: int = 0           # elements between ssm_state slots; 0 = dense
    scale: float = 0.0                 # 0 = head_k_dim ** -0.5
    l2norm_eps: float = 1e-6
    norm_eps: float = 1e-6
    no_silu: bool = False
    no_qk_l2norm: bool = False
    force_recurrent: bool = False
    l2norm_div: bool = False
    # Packed projections (gdn_xpu.h gdn_packed_order_t): "grouped" (Qwen3-Next) or "contiguous"
    # (Qwen3.5) reads qkvz / ba instead of mixed_qkv / a / b / z; "none" the unpacked arrays.
    packed_order: str = "none"
    replay_tokens: int = 0             # > 0: replay mode, ring entries per slot (>= 1 + num_spec); gdn_xpu.h "Replay mode"
    # Gate modes (gdn_xpu.h gdn_gate_mode_t): "head" (GDN: Qwen3-Next, Qwen3.5) or "channel" (KDA:
    # Kimi Linear; a, dt_bias and g then hold HV*K gates per row); the fused norm's "silu" or "sigmoid".
    gate_mode: str = "head"
    out_gate: str = "silu"
    gate_lower_bound: float = 0.0      # < 0: g = lb * sigmoid(exp(A_log) * (a + dt_bias))

    @property
    def gate_k(self) -> int:
        """Gates per v-head and row: 1 ("head") or head_k_dim ("channel")."""
        return self.head_k_dim if self.gate_mode == "channel" else 1

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    @property
    def state_len(self) -> int:
        return self.conv_state_len or self.conv_width - 1

    @property
    def conv_state_shape(self):
        if self.conv_layout == "dim_major":
            return (self.num_slots, self.conv_dim, self.state_len)
        return (self.num_slots, self.state_len, self.conv_dim)

    @property
    def ssm_state_shape(self):
        k, v = self.head_k_dim, self.head_v_dim
        inner = (k, v) if self.ssm_layout == "kv" else (v, k)
        return (self.num_slots, self.num_v_heads) + inner

    @property
    def replay_token_floats(self) -> int:
        """f32 values of one ring entry (k [H, K] | v [HV, V] | g [HV, gate_k] | beta [HV])."""
        n = _lib.gdn_replay_token_floats(self._to_c())
        if n == 0:
            raise ValueError("num_k_heads, num_v_heads, head_k_dim or head_v_dim out of range")
        return n

    @property
    def replay_ring_shape(self):
        """Shape of replay_ring (f32): [num_slots, replay_tokens, replay_token_floats]."""
        return (self.num_slots, self.replay_tokens, self.replay_token_floats)

    @property
    def replay_count_shape(self):
        """Shape of replay_count (int32, zero-filled with the caches, then the library's own)."""
        return (self.num_slots,)

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name not in _CONFIG_CACHES:  # any field change drops what was derived from the fields
            for cache in _CONFIG_CACHES:
                object.__setattr__(self, cache, None)

    def _tensor_specs(self, rows: int):
        """_tensor_specs(self, rows), kept for the last row count (one dict less per call)."""
        cached = getattr(self, "_specs_cache", None)
        if cached is None or cached[0] != rows:
            cached = (rows, _tensor_specs(self, rows))
            object.__setattr__(self, "_specs_cache", cached)
        return cached[1]

    def _to_c(self, host_memory=False):
        """The gdn_config_t, built once per set of field values (a rebuild costs ~10 µs a call).
        host_memory: with GDN_FLAG_HOST_MEMORY, for calls on a device that addresses host memory,
        whose arrays pygdn has checked itself (a host array is a live NumPy/DLPack object)."""
        c = getattr(self, "_c_cache", None)
        if c is None:
            base = self._build_c()
            host = _ffi.new("gdn_config_t *", base[0])
            host.flags |= _lib.GDN_FLAG_HOST_MEMORY
            c = (base, host)
            object.__setattr__(self, "_c_cache", c)
        return c[1 if host_memory else 0]

    def _build_c(self):
        c = _ffi.new("gdn_config_t *")
        _lib.gdn_config_init(c)
        for f in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_width", "num_slots"):
            setattr(c, f, _int32(getattr(self, f), f"cfg.{f}"))
        c.act_dtype = _choice(_DTYPES, self.act_dtype, "act_dtype")
        c.state_dtype = _choice(_DTYPES, self.state_dtype, "state_dtype")
        c.ssm_layout = _choice(_SSM_LAYOUTS, self.ssm_layout, "ssm_layout")
        c.conv_layout = _choice(_CONV_LAYOUTS, self.conv_layout, "conv_layout")
        c.conv_spec_layout = _choice(_CONV_SPEC, self.conv_spec_layout, "conv_spec_layout")
        c.packed_order = _choice(_PACKED, self.packed_order, "packed_order")
        c.conv_state_len = _int32(self.state_len, "cfg.conv_state_len")
        c.replay_tokens = _int32(self.replay_tokens, "cfg.replay_tokens")
        c.gate_mode = _choice(_GATE_MODES, self.gate_mode, "gate_mode")
        c.out_gate = _choice(_OUT_GATES, self.out_gate, "out_gate")
        c.gate_lower_bound = _float(self.gate_lower_bound, "cfg.gate_lower_bound")
        for f in ("conv_slot_stride", "ssm_slot_stride"):
            setattr(c, f, _int64(getattr(self, f), f"cfg.{f}"))
        c.scale, c.l2norm_eps, c.norm_eps = (_float(getattr(self, f), f"cfg.{f}") for f in ("scale", "l2norm_eps", "norm_eps"))
        c.flags = ((_lib.GDN_FLAG_NO_SILU if self.no_silu else 0) | (_lib.GDN_FLAG_NO_QK_L2NORM if self.no_qk_l2norm else 0)
                   | (_lib.GDN_FLAG_FORCE_RECURRENT if self.force_recurrent else 0)
                   | (_lib.GDN_FLAG_L2NORM_DIV if self.l2norm_div else 0))
        return c


# ---- gdn_batch_t's fields: the one table of them in Python (marshalling, batch.py, the tests) ----
# Read from the header through cffi: its int32 fields are the counts (and the two settings
# below), its pointer fields the metadata arrays, with their element type. What the header does
# not say in a machine-readable way is how many elements the counts require of each array.
_BATCH_SETTINGS = ("pad_slot_id", "validate")  # int32 fields of gdn_batch_t that are not counts
_BATCH_ARRAY_LENGTHS = {  # field: elements the counts require (counts: any mapping of count names)
    "non_spec_query_start_loc": lambda c: c["num_prefills"] + c["num_decodes"] + 1,
    "non_spec_state_indices": lambda c: c["num_prefills"] + c["num_decodes"],
    "has_initial_state": lambda c: c["num_prefills"] + c["num_decodes"],
    "non_spec_token_indx": lambda c: c["non_spec_token_count"],
    "spec_query_start_loc": lambda c: c["num_spec_decodes"] + 1,
    "spec_state_indices": lambda c: c["num_spec_decodes"] * (c["num_spec"] + 1),
    "num_accepted_tokens": lambda c: c["num_spec_decodes"],
    "spec_token_indx": lambda c: c["spec_token_count"],
    "non_spec_read_state_indices": lambda c: c["num_prefills"] + c["num_decodes"],
    "spec_read_state_indices": lambda c: c["num_spec_decodes"],
    "non_spec_start_pos": lambda c: c["num_prefills"] + c["num_decodes"],
    "checkpoint_state_indices": lambda c: (c["num_prefills"] + c["num_decodes"]) * c["checkpoint_cols"]
    if c["checkpoint_interval"] else 0,
}
_C_ELEMENT_TYPES = {"int32_t": "i32", "uint8_t": "u8"}


class BatchArray(_t.NamedTuple):
    """One metadata array of gdn_batch_t: its element type (a pygdn dtype name) and the number
    of elements the counts require, length(counts) with counts a mapping of count names."""

    dtype: str
    length: _t.Callable[[_t.Mapping[str, int]], int]


def _batch_table():
    counts, arrays = [], {}
    for name, field in _ffi.typeof("gdn_batch_t").fields:
        t = field.type
        if t.kind == "pointer":
            arrays[name] = BatchArray(_C_ELEMENT_TYPES[t.item.cname], _BATCH_ARRAY_LENGTHS.get(name))
        elif t.cname == "int32_t" and name not in _BATCH_SETTINGS and not name.startswith("reserved"):
            counts.append(name)
    unknown = sorted(set(arrays) ^ set(_BATCH_ARRAY_LENGTHS))
    if unknown:
        raise ImportError(f"gdn_batch_t arrays and pygdn's length table differ: {unknown}")
    return tuple(counts), arrays


BATCH_COUNTS, BATCH_ARRAYS = _batch_table()  # in struct order


_COUNTS_CACHE = {}  # (counts, pad_slot_id, validate) -> Batch._counts_c() of them (read-only once made)


@_dc.dataclass
class Batch:
    """One step's mixed batch (gdn_batch_t). Arrays are SUAI objects or DLPack producers (int32;
    has_initial_state uint8/bool) or None. Arrays may be longer than needed (graph padding); only the prefix is read."""

    num_actual_tokens: int
    num_prefills: int = 0
    num_decodes: int = 0
    num_spec_decodes: int = 0
    num_spec: int = 0
    non_spec_token_count: int = 0
    spec_token_count: int = 0
    pad_slot_id: int = -1
    validate: str = "full"  # "full" | "counts"
    non_spec_query_start_loc: object = None
    non_spec_state_indices: object = None
    has_initial_state: object = None
    non_spec_token_indx: object = None
    spec_query_start_loc: object = None
    spec_state_indices: object = None
    num_accepted_tokens: object = None
    spec_token_indx: object = None
    # State caches as engines keep them (read slots, block checkpoints): see gdn_xpu.h "State caches".
    checkpoint_interval: int = 0
    checkpoint_cols: int = 0
    non_spec_read_state_indices: object = None
    spec_read_state_indices: object = None
    non_spec_start_pos: object = None
    checkpoint_state_indices: object = None

    @property
    def num_non_spec_seqs(self) -> int:
        return self.num_prefills + self.num_decodes

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        object.__setattr__(self, "_views_cache", None)  # any field: the arrays' checks again
        if name not in BATCH_ARRAYS:  # a count or setting changed
            object.__setattr__(self, "_counts_cache", None)

    def _counts_c(self):
        """(gdn_batch_t with the counts and settings, arrays NULL; ((field, message name, dtype,
        elements the counts need), ...)), built once per set of count values like Config._to_c:
        the ints only change through setattr. The arrays are read on every call (_to_c)."""
        cached = getattr(self, "_counts_cache", None)
        if cached is None:
            # Batches of the same counts (an engine's steps) share one: a key of plain ints and the
            # validate string only (3.0 == 3 must still be refused by _int32).
            key = (*(getattr(self, f) for f in BATCH_COUNTS), self.pad_slot_id, self.validate)
            plain = all(type(v) is int for v in key[:-1])
            cached = _COUNTS_CACHE.get(key) if plain else None
        if cached is None:
            c = _ffi.new(_BATCH_P)
            _lib.gdn_batch_init(c)
            for f in BATCH_COUNTS:
                setattr(c, f, _int32(getattr(self, f), f"batch.{f}"))
            c.pad_slot_id = _int32(self.pad_slot_id, "batch.pad_slot_id")
            c.validate = _choice({"full": _lib.GDN_VALIDATE_FULL, "counts": _lib.GDN_VALIDATE_COUNTS}, self.validate,
                                 "validate")
            counts = vars(self)
            needs = tuple((field, f"batch.{field}", dtype, length(counts)) for field, (dtype, length) in BATCH_ARRAYS.items())
            cached = (c, needs)
            if plain:
                if len(_COUNTS_CACHE) >= 256:
                    _COUNTS_CACHE.clear()
                _COUNTS_CACHE[key] = cached
        object.__setattr__(self, "_counts_cache", cached)
        return cached

    def bind(self, queue) -> "Batch":
        """Check the metadata arrays now and keep their checked addresses for the following calls
        on this queue object, whatever kind of arrays they are (a batch of pygdn.UsmArrays keeps
        them anyway), until a field of the batch is set. For a step's metadata passed to several
        calls (an engine's layers): the arrays must go on describing the same memory (torch and
        NumPy arrays do unless resized in place). Returns the batch."""
        object.__setattr__(self, "_bound", True)
        self._to_c(_as_queue(queue), [])
        return self

    def _to_c(self, queue, keep):
        """gdn_batch_t with the arrays' addresses, after their checks (appends what must stay
        alive to keep). When every array is a pygdn.UsmArray, whose address, shape and dtype never
        change, or the batch is bound (bind()), the checked struct is kept for the next call on the
        same queue object: setting any field of the batch drops it (a serving loop's plain call
        saves ~1 us per array)."""
        views = self.__dict__.get("_views_cache")
        if views is not None and views[0] is queue:
            keep.extend(views[2])
            return _new(_BATCH_P, views[1][0])
        template, needs = self._counts_c()
        c = _ffi.new(_BATCH_P, template[0])  # a copy: the caller owns it (a PreparedCall keeps it)
        holds, fixed = [], True
        for field, name, dtype, need in needs:
            obj = getattr(self, field)
            if obj is None:
                continue
            address, shape, got, hold, _ = _view(obj, name, queue)
            if got != dtype:
                raise TypeError(f"{name}: dtype {got}, expected {dtype}" + (
                    " (int64 index arrays are not accepted: convert them to int32 once per step)" if got == "i64" else ""))
            n = _math.prod(shape)
            if n < need:
                raise ValueError(f"{name}: {n} elements, the counts need {need}")
            holds.append(hold)
            fixed = fixed and type(obj) is _UsmArray
            setattr(c, field, _ffi.cast(_VOIDP, address))
        keep.extend(holds)
        if fixed or self.__dict__.get("_bound"):
            object.__setattr__(self, "_views_cache", (queue, _ffi.new(_BATCH_P, c[0]), tuple(holds)))
        return c


_missing = {f.name for f in _dc.fields(Batch)} ^ {*BATCH_COUNTS, *_BATCH_SETTINGS, *BATCH_ARRAYS}
if _missing:  # the dataclass is written out for its readers; the header decides what it must hold
    raise ImportError(f"pygdn.Batch and gdn_batch_t differ in {sorted(_missing)}")


def _arrays_cached(cfg: Config, queue, rows: int, arrays: dict, keep: list):
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


def _view(obj, name, queue, written=False, strided=False):
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


def _tensor_specs(cfg: Config, rows: int):
    """field -> (dtype, leading dim or None, elements after the leading dim)."""
    act, hv, v, gk = cfg.act_dtype, cfg.num_v_heads, cfg.head_v_dim, cfg.gate_k
    per_slot_conv = cfg.conv_dim * cfg.state_len
    per_slot_ssm = hv * cfg.head_k_dim * v
    return {
        "mixed_qkv": (act, rows, cfg.conv_dim), "conv_weight": (act, cfg.conv_dim, cfg.conv_width),
        "conv_bias": (act, cfg.conv_dim, 1), "conv_state": (act, cfg.num_slots, per_slot_conv),
        "conv_out": (act, rows, cfg.conv_dim), "a": (act, rows, hv * gk), "b": (act, rows, hv),
        "A_log": ("f32", hv, 1), "dt_bias": ("f32", hv * gk, 1), "g": ("f32", rows, hv * gk), "beta": ("f32", rows, hv),
        "ssm_state": (cfg.state_dtype, cfg.num_slots, per_slot_ssm), "core_attn_out": (act, rows, hv * v),
        "z": (act, rows, hv * v), "norm_weight": (act, v, 1), "workspace": (None, None, None),
        "qkvz": (act, rows, cfg.conv_dim + hv * v), "ba": (act, rows, 2 * hv), "z_out": (act, rows, hv * v),
        "replay_ring": ("f32", cfg.num_slots, cfg.replay_tokens * _lib.gdn_replay_token_floats(cfg._to_c())),
        "replay_count": ("i32", cfg.num_slots, 1),
    }


_TENSORS_INIT = _ffi.new(_TENSORS_P)  # gdn_tensors_init's defaults, copied by every call
_lib.gdn_tensors_init(_TENSORS_INIT)


# The arrays a call writes (but gdn_gated_delta_rule reads conv_out).
_WRITTEN = frozenset(("conv_state", "conv_out", "ssm_state", "core_attn_out", "workspace", "z_out", "replay_ring",
                      "replay_count"))
# Arrays whose leading stride is free: token arrays (their gdn_tensors_t row-stride field) and the
# caches (the slot stride of the config, which the array must match: engines page their caches).
_ROW_STRIDES = {"mixed_qkv": "mixed_qkv_stride", "conv_out": "conv_out_stride", "a": "ab_stride", "b": "b_stride",
                "core_attn_out": "out_stride", "z": "z_stride", "qkvz": "qkvz_stride", "ba": "ba_stride",
                "z_out": "z_out_stride"}
_SLOT_STRIDES = {"conv_state": "conv_slot_stride", "ssm_state": "ssm_slot_stride"}


def _marshal(fn, queue, cfg: Config, batch: Batch, arrays: dict):
    """Check every argument of a call of C function fn and build the three C structs. Returns
    (c_cfg, c_batch, c_tensors, keep, bound): keep holds every array object (and consumed DLPack
    tensor), so their memory outlives the call; a DLPack tensor's deleter runs when keep is dropped.
    bound: field -> (hold, entries, leading stride, dense stride) of each array (what rebinding needs)."""
    keep = []
    c_cfg = cfg._to_c(_dlpack.host_memory_ok(queue))
    c_batch = batch._to_c(queue, keep)
    rows = batch.num_actual_tokens
    hit = _arrays_cached(cfg, queue, rows, arrays, keep)
    if hit is not None:
        return (c_cfg, c_batch, *hit[:1], keep, hit[1])
    c_t = _ffi.new(_TENSORS_P, _TENSORS_INIT[0])
    bound = {}
    fixed = _marshal_arrays(fn, queue, cfg, rows, arrays, c_t, bound)
    keep.extend(entry[0] for entry in bound.values())
    if fixed:
        refs = tuple(None if obj is None else _weakref.ref(obj) for obj in arrays.values())
        object.__setattr__(cfg, "_arrays_cache", (queue, rows, tuple(arrays), refs, _ffi.new(_TENSORS_P, c_t[0]),
                                                  {f: (None, *rest) for f, (_, *rest) in bound.items()}))
    return c_cfg, c_batch, c_t, keep, bound


def _marshal_arrays(fn, queue, cfg: Config, rows: int, arrays: dict, c_t, bound: dict) -> bool:
    """Check arrays (field -> object or None) for a call of C function fn with rows token rows, write
    their addresses into c_t and record them in bound (field -> (hold, entries, leading stride, dense
    stride)), which may hold arrays checked before (a rebind, whose c_t keeps their stride fields):
    the stride fields of c_t are set from the arrays given. Returns whether every array given is a
    pygdn.UsmArray."""
    reads_conv_out = fn is _lib.gdn_gated_delta_rule
    specs = cfg._tensor_specs(rows)
    fixed, given, checked = True, [], []
    for field, obj in arrays.items():
        if obj is None:
            continue
        layout = _dlpack.torch_layout(obj) if field in _ROW_STRIDES else None
        if layout is not None:
            key = (id(queue), field, specs[field], layout)
            seen = _TORCH_CHECKED.get(key)
            if seen is not None and seen[2] is queue:  # (held as it is: the tensor keeps its memory alive)
                bound[field] = (obj, seen[0], seen[1], specs[field][2])
                fixed = False
                setattr(c_t, field, _cast(_VOIDP, obj.data_ptr()))
                setattr(c_t, _ROW_STRIDES[field], seen[3])
                continue
            checked.append((key, field))
        given.append(field)
        if field not in specs:
            raise TypeError(f"unknown array argument {field!r}")
        if field.startswith("replay_") and not cfg.replay_tokens:
            raise ValueError(f"{field}: given, but cfg.replay_tokens = 0 (the per-token mode has no rings)")
        dtype, lead, inner = specs[field]
        written = field in _WRITTEN and not (reads_conv_out and field == "conv_out")
        address, shape, got, hold, stride = _view(obj, field, queue, written,
                                                  field in _ROW_STRIDES or field in _SLOT_STRIDES)
        if field == "workspace":
            c_t.workspace_bytes = _math.prod(shape) * _NUMPY_DTYPES[got].itemsize
        else:
            if field == "dt_bias":  # f32, or the activations' dtype (gdn_tensors_t.dt_bias_dtype)
                if got == cfg.act_dtype:
                    dtype = got
                elif got != dtype:
                    raise TypeError(f"dt_bias: dtype {got}, expected f32 or act_dtype ({cfg.act_dtype!r})")
                c_t.dt_bias_dtype = _DTYPES[dtype]
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
    _apply_strides(cfg, c_t, bound, given)
    if checked and len(_TORCH_CHECKED) >= 1024:
        _TORCH_CHECKED.clear()
    for key, field in checked:
        _TORCH_CHECKED[key] = (*bound[field][1:3], queue, getattr(c_t, _ROW_STRIDES[field]))
    return fixed


# Token arrays given as torch tensors (what a serving loop passes anew at every layer and step): the
# checks above depend on a tensor's type, device, dtype, shape and strides (_dlpack.torch_layout), not
# on its address, so a tensor of a layout that passed them for the same field, spec and queue object
# passes again; only its address is read (data_ptr()). The library checks every pointer on every
# call (USM of the queue's context, extents) whatever Python checked. Keys hold the queue's id, values
# (entries, leading stride, the queue, the gdn_tensors_t row-stride field's value).
_TORCH_CHECKED = {}


def _apply_strides(cfg: Config, c_t, bound, fields):
    """bound: field -> (hold, entries, leading stride or None, dense stride) of the arrays of a call.
    The row strides of the token arrays among fields go to their gdn_tensors_t fields (0: dense; b's
    always set: its 0 would mean a's stride); the slot strides of the caches among them are checked
    against the config's (which the library reads from gdn_config_t)."""
    for field in fields:
        _, entries, stride, dense = bound[field]
        if stride is None:
            continue
        if field in _SLOT_STRIDES:
            cfg_field = _SLOT_STRIDES[field]
            want = getattr(cfg, cfg_field) or dense
            if entries > 1 and stride != want:
                raise ValueError(f"{field}: slot stride {stride} elements, but cfg.{cfg_field}="
                                 f"{getattr(cfg, cfg_field)} ({want} elements; 0 = dense)")
        else:
            setattr(c_t, _ROW_STRIDES[field], stride if field == "b" or stride != dense else 0)


def _call(fn, queue, cfg: Config, batch: Batch, arrays: dict, wait: bool = True):
    queue = _as_queue(queue)
    PreparedCall(fn, queue, cfg, _marshal(fn, queue, cfg, batch, arrays)).run(wait)


def causal_conv1d(queue, cfg: Config, batch: Batch, *, conv_weight, conv_state, conv_out, mixed_qkv=None, conv_bias=None,
                  qkvz=None, z_out=None, wait=True):
    """Depthwise causal conv (+SiLU) of mixed_qkv (cfg.packed_order != "none": of qkvz's q|k|v
    columns, copying its z columns to z_out if given) into conv_out; updates conv_state."""
    _call(_lib.gdn_causal_conv1d, queue, cfg, batch, dict(mixed_qkv=mixed_qkv, conv_weight=conv_weight,
                                                           conv_state=conv_state, conv_out=conv_out, conv_bias=conv_bias,
                                                           qkvz=qkvz, z_out=z_out), wait)


def gated_delta_rule(queue, cfg: Config, batch: Batch, *, conv_out, ssm_state, core_attn_out, a=None, b=None,
                     A_log=None, dt_bias=None, g=None, beta=None, workspace=None, ba=None, replay_ring=None,
                     replay_count=None, wait=True):
    """Gated delta rule over q|k|v rows of conv_out; gates from a/b (packed: ba)/A_log/dt_bias or given g/beta.
    replay_ring / replay_count: the rings of replay mode (cfg.replay_tokens > 0)."""
    _call(_lib.gdn_gated_delta_rule, queue, cfg, batch, dict(conv_out=conv_out, ssm_state=ssm_state,
                                                              core_attn_out=core_attn_out, a=a, b=b, A_log=A_log,
                                                              dt_bias=dt_bias, g=g, beta=beta, workspace=workspace,
                                                              ba=ba, replay_ring=replay_ring,
                                                              replay_count=replay_count), wait)


def attention(queue, cfg: Config, batch: Batch, *, conv_weight, A_log, dt_bias, conv_state, ssm_state, core_attn_out,
              mixed_qkv=None, a=None, b=None, conv_bias=None, z=None, norm_weight=None, conv_out=None, workspace=None,
              qkvz=None, ba=None, z_out=None, replay_ring=None, replay_count=None, wait=True):
    """The whole GDN op of one step: conv -> gates -> gated delta rule (-> gated RMSNorm with z).

    Unpacked (cfg.packed_order == "none"): mixed_qkv, a, b (and z for the norm). Packed: qkvz and
    ba as the in-projections produce them (include/gdn_xpu.h, gdn_packed_order_t); the norm runs
    with norm_weight on qkvz's z columns, and z_out, if given, receives those columns [rows, HV, V].
    replay_ring / replay_count: the rings of replay mode (cfg.replay_tokens > 0)."""
    _call(_lib.gdn_attention, queue, cfg, batch, dict(mixed_qkv=mixed_qkv, a=a, b=b, conv_weight=conv_weight,
                                                       A_log=A_log, dt_bias=dt_bias, conv_state=conv_state,
                                                       ssm_state=ssm_state, core_attn_out=core_attn_out,
                                                       conv_bias=conv_bias, z=z, norm_weight=norm_weight,
                                                       conv_out=conv_out, workspace=workspace, qkvz=qkvz, ba=ba,
                                                       z_out=z_out, replay_ring=replay_ring,
                                                       replay_count=replay_count), wait)


def flush_replay(queue, cfg: Config, slots, num_tokens, *, ssm_state, replay_ring, replay_count, wait=True):
    """Replay mode: replays the first num_tokens[i] ring entries of slot slots[i] onto its state and
    empties its ring (gdn_flush_replay): the slot then holds the per-token mode's state. slots and
    num_tokens: int32 arrays of one length (-1 in slots: skipped)."""
    queue = _as_queue(queue)
    # The caches get the checks of every call's arrays (dtype, shape, slot stride, writable).
    c_t, bound = _ffi.new(_TENSORS_P, _TENSORS_INIT[0]), {}
    _marshal_arrays(_lib.gdn_flush_replay, queue, cfg, 0,
                    dict(ssm_state=ssm_state, replay_ring=replay_ring, replay_count=replay_count), c_t, bound)
    keep, index, n = [hold for hold, *_ in bound.values()], [], None
    for name, obj in (("slots", slots), ("num_tokens", num_tokens)):
        address, shape, got, hold, _ = _view(obj, name, queue)
        if got != "i32":
            raise TypeError(f"{name}: dtype {got}, expected i32")
        if n is not None and _math.prod(shape) != n:
            raise ValueError(f"num_tokens: {_math.prod(shape)} elements, slots has {n}")
        n = _math.prod(shape)
        keep.append(hold)
        index.append(_ffi.cast(_VOIDP, address))
    c_cfg = cfg._to_c(_dlpack.host_memory_ok(queue))
    _check(_lib.gdn_flush_replay(_ffi.cast(_VOIDP, queue.addressof_ref()), c_cfg, _int32(n, "len(slots)"), *index,
                                 c_t.ssm_state, c_t.replay_ring, c_t.replay_count))
    if wait:
        queue.wait()


class PreparedCall:
    """One op with its arguments checked and marshalled once, to be run many times (the
    CUDA-graph pattern of a serving loop): made by prepare(). Each run costs the C call alone.

    What is bound: the config and batch VALUES at prepare() time (later changes to the Config or
    Batch objects do not reach it: prepare again) and every array by ADDRESS. Between runs
    write new contents into the same arrays — this step's tokens into mixed_qkv, its metadata
    into the batch's index arrays (the library validates their contents on every run unless
    batch.validate == "counts"). The arrays are kept alive by this object, so run(wait=False)
    is safe as long as it lives; wait on the queue before reading results on the host. DLPack
    arguments were consumed at prepare() time; their deleters run when this object goes.

    rebind(batch=..., **arrays) gives a call with another batch and/or other arrays in some
    fields and the rest as bound (an engine's layer: weights and caches bound once, each step's
    activations and metadata rebound).
    """

    __slots__ = ("_fn", "_q", "_queue", "_cfg", "_c_cfg", "_c_batch", "_c_t", "_keep", "_bound", "_rows", "op_name")

    def __init__(self, fn, queue, cfg, structs, op_name=""):
        self._fn, self._queue, self._cfg, self.op_name = fn, queue, cfg, op_name
        self._c_cfg, self._c_batch, self._c_t, self._keep, self._bound = structs
        self._rows = int(self._c_batch.num_actual_tokens)
        self._q = _ffi.cast(_VOIDP, queue.addressof_ref())

    def run(self, wait: bool = True) -> None:
        _check(self._fn(self._q, self._c_cfg, self._c_batch, self._c_t))
        if wait and not _lib.gdn_queue_recording(self._q):
            # The kernels run asynchronously; arrays nobody else keeps alive (a plain call's
            # temporaries) would be freed under them. wait=False relies on a living holder. (A
            # queue recording a graph ran nothing, and waiting on it is an error: the graph's
            # owner keeps the arrays alive, pygdn.Graph.)
            self._queue.wait()

    __call__ = run

    def rebind(self, batch: "Batch | None" = None, **arrays) -> "PreparedCall":
        """A new PreparedCall of the same op, config and queue, with batch (when given) and the given
        arrays in place of the bound ones; every other array stays bound as it is (not checked again:
        same address). Only arrays bound at prepare() can be rebound. The new batch and arrays get
        prepare()'s checks; a token array that stays bound must have rows for the new batch's
        num_actual_tokens. This object is unchanged (a call of it may still be running)."""
        if not arrays.keys() <= self._bound.keys():
            unknown = sorted(arrays.keys() - self._bound.keys())
            raise TypeError(f"rebind: {', '.join(unknown)} not bound by this call (prepare() again to add arrays)")
        for obj in arrays.values():
            if obj is None:
                given = [f for f, obj in arrays.items() if obj is None]
                raise TypeError(f"rebind: {', '.join(given)}=None (prepare() again to drop arrays)")
        keep, rows, c_batch = [], self._rows, self._c_batch
        if batch is not None:
            c_batch = batch._to_c(self._queue, keep)
            rows = batch.num_actual_tokens
        bound = dict(self._bound)
        if rows != self._rows:
            specs = self._cfg._tensor_specs(rows)
            for field in bound.keys() - arrays.keys():
                entries = bound[field][1]
                if entries < rows and specs[field][1] == rows:
                    raise ValueError(f"{field}: bound with {entries} rows, the batch has num_actual_tokens={rows}: "
                                     "rebind it too")
        c_t = _new(_TENSORS_P, self._c_t[0])
        _marshal_arrays(self._fn, self._queue, self._cfg, rows, arrays, c_t, bound)
        keep.extend([entry[0] for entry in bound.values()])
        out = PreparedCall.__new__(PreparedCall)
        out._fn, out._q, out._queue, out._cfg, out.op_name = self._fn, self._q, self._queue, self._cfg, self.op_name
        out._c_cfg, out._c_batch, out._c_t, out._keep, out._bound, out._rows = (self._c_cfg, c_batch, c_t, keep,
                                                                               bound, rows)
        return out

    def __repr__(self):
        return f"<pygdn.PreparedCall {self.op_name}: {len(self._bound)} arrays bound>"


def prepare(op, queue, cfg: Config, batch: Batch, **arrays) -> PreparedCall:
    """prepare(pygdn.attention, queue, cfg, batch, mixed_qkv=..., ...) -> PreparedCall.

    op is pygdn.attention, pygdn.causal_conv1d or pygdn.gated_delta_rule; the keyword arrays
    are that function's (same names, same required ones, same checks). The returned object's
    run(wait=True) performs the call: see PreparedCall for what stays bound."""
    name = getattr(op, "__name__", repr(op))
    if op not in _C_FUNCTIONS:
        raise TypeError(f"op: expected one of pygdn.{', pygdn.'.join(f.__name__ for f in _C_FUNCTIONS)}, got {name}")
    if "wait" in arrays:
        raise TypeError("wait: not an argument of prepare(); pass it to PreparedCall.run()")
    try:  # the op's own signature says which arrays exist and which are required
        bound = _inspect.signature(op).bind(queue, cfg, batch, **arrays)
    except TypeError as e:
        raise TypeError(f"prepare({name}): {e}") from None
    given = {k: v for k, v in bound.arguments.items() if k not in ("queue", "cfg", "batch")}
    queue = _as_queue(queue)
    fn = getattr(_lib, _C_FUNCTIONS[op])
    # (a copy of the config: rebind() checks against the values bound here)
    return PreparedCall(fn, queue, _dc.replace(cfg), _marshal(fn, queue, cfg, batch, given), name)


def warmup(queue, cfg: Config) -> None:
    """Compile (or load from cache) every kernel cfg needs, so later calls start at once."""
    q = _as_queue(queue)  # held through the call: an int or capsule queue becomes a dpctl copy, freed with it
    _check(_lib.gdn_warmup(_ffi.cast("void *", q.addressof_ref()), cfg._to_c()))


def workspace_size(cfg: Config, batch: Batch) -> int:
    """Upper bound of the workspace bytes attention() needs for this batch's counts."""
    n = _ffi.new("size_t *")
    _check(_lib.gdn_attention_workspace_size(cfg._to_c(), _counts_only(batch), n))
    return int(n[0])


def _counts_only(batch: Batch):
    c = _ffi.new("gdn_batch_t *")
    _lib.gdn_batch_init(c)
    for f in BATCH_COUNTS:
        setattr(c, f, _int32(getattr(batch, f), f"batch.{f}"))
    return c


# The public ops and the C entry points they call (prepare() maps one to the other).
_C_FUNCTIONS = {attention: "gdn_attention", causal_conv1d: "gdn_causal_conv1d", gated_delta_rule: "gdn_gated_delta_rule"}
