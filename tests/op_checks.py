"""One op call on the device checked against the float64 reference, shared by the test modules
that run it in several settings (test_conv, test_delta_rule, test_attention and, with the
generic kernels, test_generic_kernels): run_conv, run_delta, run_mixed_batch and the Layer they
build on."""
import numpy as np

import pygdn
from pygdn import reference as ref
from pygdn.batch import make_batch, to_device
from helpers import (RTOL, assert_close, conv_from_canonical, conv_to_canonical, dequantize, quantize,
                     ssm_from_canonical, ssm_to_canonical, usm)


# ----------------------------------------------------------------------------- causal_conv1d
CONV_DIMS = (2, 4, 8, 8)  # H, HV, K, V
CONV_SLOTS = 24

CONV_MODES = {
    # name: make_batch keyword arguments
    "prefill": dict(prefill_lens=[1, 2, 5, 9], order="random"),
    "decode": dict(num_decodes=5, order="random"),
    "spec": dict(spec_lens=[3, 1, 2, 3], num_spec=2, order="random"),
    "mixed_padded": dict(prefill_lens=[7, 3], num_decodes=2, spec_lens=[2, 3, 1], num_spec=2, order="random",
                         pad_non_spec=1, pad_spec=1, pad_len=1),
    "grouped": dict(prefill_lens=[6], num_decodes=1, spec_lens=[2, 2], num_spec=1, order="grouped"),
    # Non-spec convs are tiled over time (64 tokens on the CPU variant, 16 generic): sequences that
    # start just before, at and after tile edges, shorter than the W-1 window across an edge, and
    # spanning several tiles, with decodes and padding sharing tiles.
    "time_tiles": dict(prefill_lens=[62, 2, 1, 3, 13, 2, 67, 130, 2, 5], num_decodes=3, order="random",
                       pad_non_spec=1, pad_len=3),
}


def run_conv(queue, rng, dtype, width, layout, spec_layout, mode, bias=True, silu=True, dims=CONV_DIMS, spare=1):
    kw = CONV_MODES[mode]
    H, HV, K, V = dims
    meta = make_batch(rng, num_slots=CONV_SLOTS, **kw)
    num_spec = meta["num_spec"]
    state_len = width - 1 + (num_spec if spec_layout == "rolled" else 0) + spare  # spare columns must stay
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=CONV_SLOTS,
                       conv_width=width, act_dtype=dtype, conv_layout=layout, conv_spec_layout=spec_layout,
                       conv_state_len=state_len, no_silu=not silu)
    C, T = cfg.conv_dim, meta["num_actual_tokens"]
    x_s, x = quantize(rng.standard_normal((T, C)), dtype)
    w_s, w = quantize(rng.standard_normal((C, width)) * 0.5, dtype)
    b_s, b = quantize(rng.standard_normal(C) * 0.1, dtype) if bias else (None, None)
    st_s, st = quantize(rng.standard_normal((CONV_SLOTS, C, state_len)), dtype)
    out_canary = quantize(np.full((T + 2, C), 7.0), dtype)[0]  # two rows past the end must stay

    d_state = usm(queue, conv_from_canonical(st_s, layout))
    d_out = usm(queue, out_canary)
    pygdn.causal_conv1d(queue, cfg, to_device(meta, queue), mixed_qkv=usm(queue, x_s), conv_weight=usm(queue, w_s),
                        conv_bias=None if b_s is None else usm(queue, b_s), conv_state=d_state, conv_out=d_out)
    want_out, want_state = ref.causal_conv1d(x, w, b, st, meta, spec_layout=spec_layout, silu=silu)
    got_out = d_out.to_numpy()
    got_state = conv_to_canonical(d_state.to_numpy(), layout)
    assert_close(dequantize(got_out[:T], dtype), want_out, RTOL[dtype], "conv_out")
    assert np.array_equal(got_out[T:], out_canary[T:]), "rows past num_actual_tokens were written"
    # The state holds raw inputs: bit-exact, and every slot no sequence addresses is untouched.
    assert np.array_equal(dequantize(got_state, dtype), want_state), "conv_state differs"
    return meta


# ----------------------------------------------------------------------------- gated delta rule
RTOL_F32 = 2e-5
RTOL_LOW = {"f16": 5e-3, "bf16": 3e-2}  # outputs rounded to the activation dtype


def written_slots(meta):
    """Slots a call may write: non-spec slots, spec slots of tokens t < L (when the read slot is valid)."""
    pad, out = meta.get("pad_slot_id", -1), set()
    is_pad = lambda s: s < 0 or s == pad  # noqa: E731
    for s in meta["non_spec_state_indices"] if meta.get("non_spec_state_indices") is not None else []:
        if not is_pad(s):
            out.add(int(s))
    if meta.get("num_spec_decodes", 0):
        qsl, cols, acc = meta["spec_query_start_loc"], meta["spec_state_indices"], meta["num_accepted_tokens"]
        for n in range(meta["num_spec_decodes"]):
            if is_pad(cols[n][acc[n] - 1]):
                continue
            for t in range(qsl[n + 1] - qsl[n]):
                if not is_pad(cols[n][t]):
                    out.add(int(cols[n][t]))
    return out


def run_delta(queue, rng, meta, *, H=2, HV=4, K=16, V=16, num_slots=32, dtype="f32", ssm_layout="kv",
              force_recurrent=False, gates="ab", l2norm=True, l2_mode="rsqrt", rtol=None, check=True):
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=num_slots,
                       act_dtype=dtype, ssm_layout=ssm_layout, force_recurrent=force_recurrent,
                       no_qk_l2norm=not l2norm, l2norm_div=l2_mode == "div")
    T, C = meta["num_actual_tokens"], cfg.conv_dim
    x = rng.standard_normal((T, C))
    if not l2norm:  # caller-normalized q/k
        x[:, : 2 * H * K] /= np.sqrt(K)
    qkv_s, qkv = quantize(x, dtype)
    a_s, a = quantize(rng.standard_normal((T, HV)), dtype)
    b_s, b = quantize(rng.standard_normal((T, HV)), dtype)
    A_log = np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32)
    dt_bias = rng.uniform(-1.0, 1.0, HV).astype(np.float32)
    s0 = (rng.standard_normal((num_slots, HV, K, V)) * 0.5).astype(np.float32)
    g, beta = ref.gates(a, b, A_log, dt_bias)
    d_ssm = usm(queue, ssm_from_canonical(s0, ssm_layout))
    d_out = usm(queue, quantize(np.full((T + 1, HV, V), 3.0), dtype)[0])
    kw = dict(a=usm(queue, a_s), b=usm(queue, b_s), A_log=usm(queue, A_log), dt_bias=usm(queue, dt_bias))
    if gates == "g_beta":
        kw = dict(g=usm(queue, g.astype(np.float32)), beta=usm(queue, beta.astype(np.float32)))
        g, beta = g.astype(np.float32).astype(np.float64), beta.astype(np.float32).astype(np.float64)
    pygdn.gated_delta_rule(queue, cfg, to_device(meta, queue), conv_out=usm(queue, qkv_s), ssm_state=d_ssm,
                           core_attn_out=d_out, **kw)
    want_o, want_s = ref.gated_delta_rule(qkv, g, beta, s0.astype(np.float64), meta, H, HV, K, V,
                                          l2norm_qk=l2norm, l2_mode=l2_mode)
    got_o = dequantize(d_out.to_numpy(), dtype)
    got_s = ssm_to_canonical(d_ssm.to_numpy(), ssm_layout)
    if check:
        tol = rtol or (RTOL_F32 if dtype == "f32" else RTOL_LOW[dtype])
        assert_close(got_o[:T], want_o, tol, "core_attn_out")
        assert np.all(got_o[T:] == 3.0), "row past num_actual_tokens written"
        written = written_slots(meta)
        for s in range(num_slots):
            if s in written:
                assert_close(got_s[s], want_s[s], tol if dtype == "f32" else 1e-2, f"ssm_state[{s}]")
            else:
                assert np.array_equal(got_s[s], s0[s]), f"slot {s} not addressed but changed"
    return got_o[:T], got_s, want_o, want_s


# ----------------------------------------------------------------------------- the whole op
class Layer:
    """Weights and caches of one GDN layer on the device, with float64 copies for the reference."""

    def __init__(self, queue, rng, cfg, with_z=False):
        self.queue, self.cfg = queue, cfg
        C, W, HV, V, dt = cfg.conv_dim, cfg.conv_width, cfg.num_v_heads, cfg.head_v_dim, cfg.act_dtype
        self.w_s, self.w = quantize(rng.standard_normal((C, W)) * 0.5, dt)
        self.bias_s, self.bias = quantize(rng.standard_normal(C) * 0.1, dt)
        self.A_log = np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32)
        self.dt_bias = rng.uniform(-1, 1, HV).astype(np.float32)
        self.norm_w_s, self.norm_w = quantize(rng.uniform(0.5, 1.5, V), dt) if with_z else (None, None)
        self.conv0 = quantize(rng.standard_normal((cfg.num_slots, C, cfg.state_len)), dt)
        self.ssm0 = (rng.standard_normal(cfg.ssm_state_shape[:2] + (cfg.head_k_dim, V)) * 0.5).astype(np.float32)
        self.d_conv = usm(queue, conv_from_canonical(self.conv0[0], cfg.conv_layout))
        self.d_ssm = usm(queue, ssm_from_canonical(self.ssm0, cfg.ssm_layout))
        self.d_w, self.d_bias = usm(queue, self.w_s), usm(queue, self.bias_s)
        self.d_A, self.d_dt = usm(queue, self.A_log), usm(queue, self.dt_bias)
        self.d_norm_w = usm(queue, self.norm_w_s) if with_z else None

    def conv_state(self):
        return dequantize(conv_to_canonical(self.d_conv.to_numpy(), self.cfg.conv_layout), self.cfg.act_dtype)

    def ssm_state(self):
        return ssm_to_canonical(self.d_ssm.to_numpy(), self.cfg.ssm_layout).astype(np.float64)

    def step(self, meta, x_s, a_s, b_s, z_s=None, out_fill=5.0):
        """Runs gdn_attention; returns the output rows (plus one canary row) as float64."""
        cfg, T = self.cfg, meta["num_actual_tokens"]
        d_out = usm(self.queue, quantize(np.full((T + 1, cfg.num_v_heads, cfg.head_v_dim), out_fill), cfg.act_dtype)[0])
        pygdn.attention(self.queue, cfg, to_device(meta, self.queue), mixed_qkv=usm(self.queue, x_s),
                        a=usm(self.queue, a_s), b=usm(self.queue, b_s), conv_weight=self.d_w, conv_bias=self.d_bias,
                        A_log=self.d_A, dt_bias=self.d_dt, conv_state=self.d_conv, ssm_state=self.d_ssm,
                        core_attn_out=d_out, z=None if z_s is None else usm(self.queue, z_s),
                        norm_weight=self.d_norm_w if z_s is not None else None)
        return dequantize(d_out.to_numpy(), cfg.act_dtype)


def random_case(seed):
    rng = np.random.default_rng(1000 + seed)
    num_spec = int(rng.integers(0, 4))
    n_pre, n_dec = int(rng.integers(0, 4)), int(rng.integers(0, 4))
    n_spec = int(rng.integers(0, 5)) if num_spec else 0
    if n_pre + n_dec + n_spec == 0:
        n_dec = 1
    kw = dict(prefill_lens=list(rng.integers(2, 150, n_pre)), num_decodes=n_dec,
              spec_lens=list(rng.integers(1, num_spec + 2, n_spec)), num_spec=num_spec,
              order=["random", "blocks", "grouped"][seed % 3],
              pad_non_spec=int(seed % 5 == 1), pad_spec=int(seed % 7 == 2 and num_spec > 0),
              pad_len=int(seed % 2))
    layout = dict(ssm_layout=["kv", "vk"][seed % 2], conv_layout=["dim_major", "time_major"][(seed // 2) % 2],
                  conv_spec_layout=["snapshot", "rolled"][(seed // 4) % 2],
                  act_dtype="bf16" if seed % 10 == 9 else "f32")
    dims = [(1, 1, 8, 8), (2, 4, 16, 8), (1, 3, 8, 16), (2, 2, 32, 32)][seed % 4]
    return rng, kw, layout, dims, seed % 3 == 0


def run_mixed_batch(queue, seed):
    """gdn_attention on random_case(seed) against the reference: outputs, canary row, states."""
    rng, kw, layout, (H, HV, K, V), with_z = random_case(seed)
    num_slots = 64
    meta = make_batch(rng, num_slots=num_slots, **kw)
    W = 4
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=num_slots, conv_width=W,
                       conv_state_len=W - 1 + meta["num_spec"], **layout)
    layer = Layer(queue, rng, cfg, with_z=with_z)
    T = meta["num_actual_tokens"]
    x_s, x = quantize(rng.standard_normal((T, cfg.conv_dim)), cfg.act_dtype)
    a_s, a = quantize(rng.standard_normal((T, HV)), cfg.act_dtype)
    b_s, b = quantize(rng.standard_normal((T, HV)), cfg.act_dtype)
    z_s, z = quantize(rng.standard_normal((T, HV, V)), cfg.act_dtype) if with_z else (None, None)
    got = layer.step(meta, x_s, a_s, b_s, z_s)
    want_o, want_conv, want_ssm = ref.gdn_attention(
        x, a, b, layer.w, layer.bias, layer.A_log, layer.dt_bias, layer.conv0[1], layer.ssm0.astype(np.float64), meta,
        H, HV, K, V, spec_layout=cfg.conv_spec_layout, z=z, norm_weight=layer.norm_w)
    tol = 2e-4 if cfg.act_dtype == "f32" else 5e-2
    assert_close(got[:T], want_o, tol, "core_attn_out")
    assert np.all(got[T] == 5.0), "canary row past num_actual_tokens was written"
    if cfg.act_dtype == "f32":
        assert np.array_equal(layer.conv_state(), want_conv), "conv_state"
    assert_close(layer.ssm_state(), want_ssm, tol, "ssm_state")  # unaddressed slots: exact by construction
    untouched = [s for s in range(num_slots) if np.array_equal(want_ssm[s], layer.ssm0[s])]
    for s in untouched:
        assert np.array_equal(layer.ssm_state()[s], layer.ssm0[s].astype(np.float64)), f"slot {s} changed"
