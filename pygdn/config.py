"""Config: one GDN layer's dims, dtypes and cache layouts (gdn_config_t), and what a call's arrays
must be for it (_tensor_specs)."""
from __future__ import annotations

import dataclasses as _dc

from ._lib import ffi as _ffi, lib as _lib
from ._c import (DTYPES as _DTYPES, SSM_LAYOUTS as _SSM_LAYOUTS, CONV_LAYOUTS as _CONV_LAYOUTS,
                 CONV_SPEC as _CONV_SPEC, PACKED as _PACKED, GATE_MODES as _GATE_MODES, OUT_GATES as _OUT_GATES,
                 PREFILL_PRECISIONS as _PREFILL_PRECISIONS, STATE_ROUNDING as _STATE_ROUNDING,
                 choice as _choice, int32 as _int32, int64 as _int64, float_field as _float)


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
    state_dtype: str = "f32"           # of ssm_state: "f32" | "bf16" | "f16" | "i8" | "f8e4m3" (8-bit: + ssm_scale)
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
    # The chunked prefill's products (gdn_xpu.h gdn_prefill_precision_t, docs/op.md "Prefill
    # precision"): "f32", "bf16" (bf16 operands, f32 accumulators: on the device's matrix engine where
    # the library can use one, else emulated) or "auto" (bf16 for bf16 / f16 activations on XMX, else f32).
    # pygdn.prefill_path(queue, cfg) says which a config takes on a device.
    prefill_precision: str = "auto"
    # 8-bit states (state_dtype "i8" / "f8e4m3"; gdn_xpu.h "State dtype"): the calls take ssm_scale
    # [num_slots, HV, V] f32 (ssm_scale_shape), one scale per state row; slot stride (0 = dense) and
    # the stores' rounding, "nearest" or "stochastic".
    ssm_scale_slot_stride: int = 0
    state_rounding: str = "nearest"

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
    def ssm_scale_shape(self):
        """Shape of ssm_scale (f32) for 8-bit states: [num_slots, HV, V], one scale per state row."""
        return (self.num_slots, self.num_v_heads, self.head_v_dim)

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
        c.prefill_precision = _choice(_PREFILL_PRECISIONS, self.prefill_precision, "prefill_precision")
        c.state_rounding = _choice(_STATE_ROUNDING, self.state_rounding, "state_rounding")
        for f in ("conv_slot_stride", "ssm_slot_stride", "ssm_scale_slot_stride"):
            setattr(c, f, _int64(getattr(self, f), f"cfg.{f}"))
        c.scale, c.l2norm_eps, c.norm_eps = (_float(getattr(self, f), f"cfg.{f}") for f in ("scale", "l2norm_eps", "norm_eps"))
        c.flags = ((_lib.GDN_FLAG_NO_SILU if self.no_silu else 0) | (_lib.GDN_FLAG_NO_QK_L2NORM if self.no_qk_l2norm else 0)
                   | (_lib.GDN_FLAG_FORCE_RECURRENT if self.force_recurrent else 0)
                   | (_lib.GDN_FLAG_L2NORM_DIV if self.l2norm_div else 0))
        return c



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
        "ssm_scale": ("f32", cfg.num_slots, hv * v),
        "z": (act, rows, hv * v), "norm_weight": (act, v, 1), "workspace": (None, None, None),
        "qkvz": (act, rows, cfg.conv_dim + hv * v), "ba": (act, rows, 2 * hv), "z_out": (act, rows, hv * v),
        "replay_ring": ("f32", cfg.num_slots, cfg.replay_tokens * _lib.gdn_replay_token_floats(cfg._to_c())),
        "replay_count": ("i32", cfg.num_slots, 1),
    }
