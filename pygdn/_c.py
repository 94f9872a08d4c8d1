"""What pygdn's modules share about the C side: cffi's types, the ABI's enums by their Python
names, Python values checked into C struct fields (errors naming the field), and a status code
turned into GdnError."""
from __future__ import annotations

import operator as _operator

from ._lib import ffi as _ffi, last_error as _last_error, lib as _lib, status_name as _status_name

# cffi types looked up once (a type given as a string is parsed or looked up on every use).
VOIDP = _ffi.typeof("void *")
BATCH_P = _ffi.typeof("gdn_batch_t *")
TENSORS_P = _ffi.typeof("gdn_tensors_t *")
# ffi.cast and ffi.new without their Python wrappers (which first look a type given by name up), for
# the types above on the per-step paths (rebind, a bound batch): ~0.3 µs a call less each.
cast, new = _ffi._backend.cast, _ffi._backend.newp

DTYPES = {"f32": _lib.GDN_DTYPE_F32, "f16": _lib.GDN_DTYPE_F16, "bf16": _lib.GDN_DTYPE_BF16, "i8": _lib.GDN_DTYPE_I8,
          "f8e4m3": _lib.GDN_DTYPE_F8E4M3}  # (i8, f8e4m3: state dtypes only)
STATE_ROUNDING = {"nearest": _lib.GDN_ROUND_NEAREST, "stochastic": _lib.GDN_ROUND_STOCHASTIC}
SSM_LAYOUTS = {"kv": _lib.GDN_SSM_KV, "vk": _lib.GDN_SSM_VK}
CONV_LAYOUTS = {"dim_major": _lib.GDN_CONV_DIM_MAJOR, "time_major": _lib.GDN_CONV_TIME_MAJOR}
CONV_SPEC = {"snapshot": _lib.GDN_CONV_SPEC_SNAPSHOT, "rolled": _lib.GDN_CONV_SPEC_ROLLED}
PACKED = {"none": _lib.GDN_PACKED_NONE, "grouped": _lib.GDN_PACKED_GROUPED, "contiguous": _lib.GDN_PACKED_CONTIGUOUS}
GATE_MODES = {"head": _lib.GDN_GATE_HEAD, "channel": _lib.GDN_GATE_CHANNEL}
OUT_GATES = {"silu": _lib.GDN_OUT_GATE_SILU, "sigmoid": _lib.GDN_OUT_GATE_SIGMOID}
PREFILL_PRECISIONS = {"auto": _lib.GDN_PREFILL_AUTO, "f32": _lib.GDN_PREFILL_F32, "bf16": _lib.GDN_PREFILL_BF16}
PREFILL_ENGINES = {_lib.GDN_PREFILL_ENGINE_F32: "f32", _lib.GDN_PREFILL_ENGINE_XMX: "xmx",
                   _lib.GDN_PREFILL_ENGINE_AMX: "amx", _lib.GDN_PREFILL_ENGINE_EMULATED: "bf16-emulated"}


class GdnError(RuntimeError):
    """A libgdn_xpu call failed. .status is the gdn_status_t, .status_name its name."""

    def __init__(self, status: int, message: str):
        self.status = int(status)
        self.status_name = _status_name(status)
        super().__init__(f"{self.status_name}: {message}")


def check(status: int) -> None:
    if status != _lib.GDN_SUCCESS:
        raise GdnError(status, _last_error())


def choice(table, value, name):
    if value not in table:
        raise ValueError(f"{name}={value!r}: expected one of {sorted(table)}")
    return table[value]


def int_field(value, name, bits):
    """value for an int<bits>_t field of a C struct, or an error naming the field (an int-like
    value only: 3.7 is not silently 3)."""
    try:
        v = _operator.index(value)
    except TypeError:
        raise TypeError(f"{name}={value!r}: expected an integer, got {type(value).__name__}") from None
    if not -2**(bits - 1) <= v < 2**(bits - 1):
        raise ValueError(f"{name}={v}: does not fit int{bits}")
    return v


def int32(value, name):
    return int_field(value, name, 32)


def int64(value, name):
    return int_field(value, name, 64)


def float_field(value, name):
    """value for a float field of a C struct, or an error naming the field (a number, not text)."""
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}={value!r}: expected a number, got {type(value).__name__}") from None
