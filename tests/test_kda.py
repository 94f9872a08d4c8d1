"""Kimi Delta Attention (cfg.gate_mode = "channel": a decay per key channel) against the float64
reference on every path of the op: the conv, decode, spec decode, chunked and token-recurrent
prefills, mixed batches, read/write slots and block checkpoints, every state dtype and layout,
the CPU-device kernels and the generic (GPU) kernels."""
import numpy as np
import pytest

import pygdn
from pygdn import reference as ref
from pygdn.batch import make_batch, to_device
from helpers import (EditedSUAI, assert_close, conv_from_canonical, conv_to_canonical, dequantize, quantize, ssm_from_canonical,
                     ssm_to_canonical, usm)
from replay_checks import Twins, mtp_loop


def kda_config(H, K, V, num_slots, num_spec=0, **kw):
    W = kw.pop("conv_width", 4)
    return pygdn.Config(num_k_heads=H, num_v_heads=H, head_k_dim=K, head_v_dim=V, num_slots=num_slots, conv_width=W,
                        conv_state_len=W - 1 + num_spec, gate_mode="channel", out_gate="sigmoid", **kw)


class KdaLayer:
    """Weights and caches of one KDA layer on the device, float64 copies for the reference. Gates as
    Kimi Linear's: A_log [H], dt_bias [H*K] (lower_bound: its lower-bound form)."""

    def __init__(self, queue, rng, cfg, lower_bound=0.0):
        self.queue, self.cfg, self.lower_bound = queue, cfg, lower_bound
        C, W, H, K, V, dt = cfg.conv_dim, cfg.conv_width, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.act_dtype
        self.w_s, self.w = quantize(rng.standard_normal((C, W)) * 0.5, dt)
        self.bias_s, self.bias = quantize(rng.standard_normal(C) * 0.1, dt)
        self.A_log = np.log(rng.uniform(0.5, 4.0, H)).astype(np.float32)
        self.dt_bias = rng.uniform(-1, 1, H * K).astype(np.float32)
        self.norm_w_s, self.norm_w = quantize(rng.uniform(0.5, 1.5, V), dt)
        self.conv0 = quantize(rng.standard_normal((cfg.num_slots, C, cfg.state_len)), dt)
        self.ssm0 = (rng.standard_normal((cfg.num_slots, H, K, V)) * 0.5).astype(np.float32)
        if cfg.state_dtype != "f32":  # the stored start state is what the reference reads
            self.ssm0 = dequantize(quantize(self.ssm0, cfg.state_dtype)[0], cfg.state_dtype).astype(np.float32)
        self.d_conv = usm(queue, conv_from_canonical(self.conv0[0], cfg.conv_layout))
        self.d_ssm = usm(queue, ssm_from_canonical(quantize(self.ssm0, cfg.state_dtype)[0], cfg.ssm_layout))
        self.d_w, self.d_bias = usm(queue, self.w_s), usm(queue, self.bias_s)
        self.d_A, self.d_dt = usm(queue, self.A_log), usm(queue, self.dt_bias)
        self.d_norm_w = usm(queue, self.norm_w_s)

    def inputs(self, rng, T, gate_scale=1.0):
        cfg, dt = self.cfg, self.cfg.act_dtype
        H, K, V = cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
        return dict(x=quantize(rng.standard_normal((T, cfg.conv_dim)), dt),
                    a=quantize(rng.standard_normal((T, H * K)) * gate_scale, dt),
                    b=quantize(rng.standard_normal((T, H)), dt), z=quantize(rng.standard_normal((T, H, V)), dt))

    def step(self, meta, inp, norm=True):
        cfg, T = self.cfg, meta["num_actual_tokens"]
        d_out = usm(self.queue, quantize(np.full((T + 1, cfg.num_v_heads, cfg.head_v_dim), 5.0), cfg.act_dtype)[0])
        pygdn.attention(self.queue, cfg, to_device(meta, self.queue), mixed_qkv=usm(self.queue, inp["x"][0]),
                        a=usm(self.queue, inp["a"][0]), b=usm(self.queue, inp["b"][0]), conv_weight=self.d_w,
                        conv_bias=self.d_bias, A_log=self.d_A, dt_bias=self.d_dt, conv_state=self.d_conv,
                        ssm_state=self.d_ssm, core_attn_out=d_out, z=usm(self.queue, inp["z"][0]) if norm else None,
                        norm_weight=self.d_norm_w if norm else None)
        return dequantize(d_out.to_numpy(), cfg.act_dtype)

    def reference(self, meta, inp, norm=True):
        cfg = self.cfg
        H, K, V = cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
        sd = None if cfg.state_dtype == "f32" else cfg.state_dtype
        return ref.gdn_attention(inp["x"][1], inp["a"][1], inp["b"][1], self.w, self.bias, self.A_log, self.dt_bias,
                                 self.conv0[1], self.ssm0.astype(np.float64), meta, H, H, K, V,
                                 spec_layout=cfg.conv_spec_layout, z=inp["z"][1] if norm else None,
                                 norm_weight=self.norm_w if norm else None, state_dtype=sd,
                                 lower_bound=self.lower_bound, out_gate="sigmoid")

    def ssm_state(self):
        raw = ssm_to_canonical(self.d_ssm.to_numpy(), self.cfg.ssm_layout)
        return dequantize(raw, self.cfg.state_dtype).astype(np.float64)

    def check(self, meta, inp, norm=True, tol=None):
        T = meta["num_actual_tokens"]
        got = self.step(meta, inp, norm)
        want_o, want_conv, want_ssm = self.reference(meta, inp, norm)
        f32 = self.cfg.act_dtype == "f32" and self.cfg.state_dtype == "f32"
        tol = tol or (2e-4 if f32 else 5e-2)
        assert_close(got[:T], want_o, tol, "core_attn_out")
        assert np.all(got[T] == 5.0), "canary row past num_actual_tokens was written"
        if self.cfg.act_dtype == "f32":
            assert np.array_equal(dequantize(conv_to_canonical(self.d_conv.to_numpy(), self.cfg.conv_layout), "f32"),
                                  want_conv), "conv_state"
        got_ssm = self.ssm_state()
        assert_close(got_ssm, want_ssm, tol if f32 else 2e-2, "ssm_state")
        for s in range(self.cfg.num_slots):  # slots no sequence writes stay bit for bit
            if np.array_equal(want_ssm[s], self.ssm0[s]):
                assert np.array_equal(got_ssm[s], self.ssm0[s].astype(np.float64)), f"slot {s} changed"


MODES = {
    "decode": dict(num_decodes=5),
    "spec": dict(spec_lens=[3, 1, 2, 3], num_spec=2),
    "prefill": dict(prefill_lens=[70, 5, 130]),
    "mixed": dict(prefill_lens=[67, 3], num_decodes=2, spec_lens=[2, 3, 1], num_spec=2, pad_non_spec=1, pad_spec=1,
                  pad_len=1),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
def test_kda_layer_step(queue, kernels, mode, ssm_layout):
    rng = np.random.default_rng(46)
    meta = make_batch(rng, num_slots=32, order="random", **MODES[mode])
    cfg = kda_config(2, 16, 16, 32, num_spec=meta["num_spec"], act_dtype="f32", ssm_layout=ssm_layout)
    layer = KdaLayer(queue, rng, cfg)
    layer.check(meta, layer.inputs(rng, meta["num_actual_tokens"]))


def test_kda_lower_bound_gate(queue, kernels):
    """Kimi Linear's lower-bound gate form (g = lb * sigmoid(exp(A_log) * (a + dt_bias))) on a mixed batch."""
    rng = np.random.default_rng(461)
    meta = make_batch(rng, num_slots=32, order="random", **MODES["mixed"])
    cfg = kda_config(2, 16, 16, 32, num_spec=meta["num_spec"], act_dtype="f32", gate_lower_bound=-5.0)
    layer = KdaLayer(queue, rng, cfg, lower_bound=-5.0)
    layer.check(meta, layer.inputs(rng, meta["num_actual_tokens"], gate_scale=3.0))


def test_kda_precomputed_gates_and_b_stride(queue, kernels):
    """gdn_gated_delta_rule with g [rows, H*K] and beta given, and with raw gates whose b has a row
    stride of its own (a column slice of a wider array; gdn_tensors_t.b_stride)."""
    rng = np.random.default_rng(462)
    meta = make_batch(rng, num_slots=32, order="random", **MODES["mixed"])
    H, K, V = 2, 16, 16
    cfg = kda_config(H, K, V, 32, num_spec=meta["num_spec"], act_dtype="f32")
    T, C = meta["num_actual_tokens"], cfg.conv_dim
    qkv = rng.standard_normal((T, C)).astype(np.float32)
    a = rng.standard_normal((T, H * K)).astype(np.float32)
    b_wide = rng.standard_normal((T, 3 * H)).astype(np.float32)
    A_log = np.log(rng.uniform(0.5, 4.0, H)).astype(np.float32)
    dt_bias = rng.uniform(-1, 1, H * K).astype(np.float32)
    s0 = (rng.standard_normal((32, H, K, V)) * 0.5).astype(np.float32)
    g, beta = ref.gates(a, b_wide[:, :H], A_log, dt_bias)
    want_o, want_s = ref.gated_delta_rule(qkv, g, beta, s0.astype(np.float64), meta, H, H, K, V)
    for gates in ("precomputed", "raw"):
        d_ssm, d_out = usm(queue, ssm_from_canonical(s0, cfg.ssm_layout)), usm(queue, np.zeros((T, H, V), np.float32))
        if gates == "precomputed":
            kw = dict(g=usm(queue, g.reshape(T, H * K).astype(np.float32)), beta=usm(queue, beta.astype(np.float32)))
        else:
            b_view = EditedSUAI(usm(queue, b_wide), lambda d: d.update(shape=(T, H), strides=(3 * H, 1)))
            kw = dict(a=usm(queue, a), b=b_view, A_log=usm(queue, A_log), dt_bias=usm(queue, dt_bias))
        pygdn.gated_delta_rule(queue, cfg, to_device(meta, queue), conv_out=usm(queue, qkv), ssm_state=d_ssm,
                               core_attn_out=d_out, **kw)
        assert_close(d_out.to_numpy(), want_o, 2e-4, f"core_attn_out ({gates})")
        assert_close(ssm_to_canonical(d_ssm.to_numpy(), cfg.ssm_layout), want_s, 2e-4, f"ssm_state ({gates})")


def test_kda_config_rules(queue):
    """GDN_GATE_CHANNEL needs one v-head per k-head and unpacked inputs; its gate arrays are H*K wide."""
    rng = np.random.default_rng(463)
    meta = make_batch(rng, num_slots=8, num_decodes=2)
    bad = [(dict(num_v_heads=4), "GDN_ERROR_BAD_SHAPE", "GDN_GATE_CHANNEL needs one v-head per k-head"),
           (dict(packed_order="grouped"), "GDN_ERROR_UNSUPPORTED", "cfg->packed_order = 1 with GDN_GATE_CHANNEL")]
    for change, status, text in bad:
        cfg = kda_config(2, 16, 16, 8)
        for field, value in change.items():
            setattr(cfg, field, value)
        with pytest.raises(pygdn.GdnError) as e:
            pygdn.warmup(queue, cfg)
        assert status in str(e.value) and text in str(e.value)
    cfg = kda_config(2, 16, 16, 8, act_dtype="f32")
    T = meta["num_actual_tokens"]
    f32 = lambda *shape: usm(queue, np.zeros(shape, np.float32))  # noqa: E731
    with pytest.raises(ValueError, match="a: shape"):  # a per-head gate where a per-channel one is due
        pygdn.gated_delta_rule(queue, cfg, to_device(meta, queue), conv_out=f32(T, cfg.conv_dim),
                               ssm_state=f32(8, 2, 16, 16), core_attn_out=f32(T, 2, 16), a=f32(T, 2), b=f32(T, 2),
                               A_log=f32(2), dt_bias=f32(32))


# ----------------------------------------------------------------------------- CPU-device recurrent walks
# The CPU device's recurrent kernels (gdn_recurrent_{vk,kv}_cpu, gdn_fused_cpu) in their forms: one-token
# and short walks (vk by row / 16 rows, kv WY), walks longer than GDN_WALK_TOKENS (held), the gates
# prepared inline or by gdn_prep.


@pytest.mark.parametrize("mode", ["prefill", "mixed"])
@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
def test_kda_force_recurrent(queue, mode, ssm_layout):
    """Prefills through the token recurrence: walks of 3..130 tokens (held and short forms)."""
    rng = np.random.default_rng(461)
    meta = make_batch(rng, num_slots=32, order="random", **MODES[mode])
    cfg = kda_config(2, 16, 16, 32, num_spec=meta["num_spec"], act_dtype="f32", ssm_layout=ssm_layout,
                     force_recurrent=True)
    layer = KdaLayer(queue, rng, cfg)
    layer.check(meta, layer.inputs(rng, meta["num_actual_tokens"]))


def with_read_slots(rng, meta, num_slots):
    """meta with read slots apart from the write slots: slots no sequence of the step writes, one
    spec sequence's pad (it starts from zeros)."""
    written = set(meta["non_spec_state_indices"].tolist()) | set(meta["spec_state_indices"].ravel().tolist())
    free = rng.permutation(sorted(set(range(num_slots)) - written)).astype(np.int32)
    n_ns, n_s = len(meta["non_spec_state_indices"]), len(meta["spec_state_indices"])
    meta["non_spec_read_state_indices"] = free[:n_ns].copy()
    meta["spec_read_state_indices"] = free[n_ns:n_ns + n_s].copy()
    meta["spec_read_state_indices"][-1] = -1
    return meta


@pytest.mark.parametrize("state_dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
def test_kda_state_dtypes_and_read_slots(queue, ssm_layout, state_dtype):
    """Every state dtype, the initial states read from other slots than the written ones; prefills
    of 3 and 12 tokens (short and held walks), decodes, spec sequences."""
    rng = np.random.default_rng(462)
    meta = make_batch(rng, num_slots=40, order="random", prefill_lens=[12, 3], num_decodes=2, spec_lens=[3, 1, 2],
                      num_spec=2)
    meta = with_read_slots(rng, meta, 40)
    cfg = kda_config(2, 16, 16, 40, num_spec=2, act_dtype="f32", ssm_layout=ssm_layout, state_dtype=state_dtype,
                     force_recurrent=True)
    layer = KdaLayer(queue, rng, cfg)
    layer.check(meta, layer.inputs(rng, meta["num_actual_tokens"]))


@pytest.mark.parametrize("ssm_layout,K", [("kv", 64), ("vk", 64), ("kv", 128), ("vk", 128), ("kv", 24)])
def test_kda_head_dims(queue, ssm_layout, K):
    """K = V = 64 and 128 (one k-head); K = 24 (kv only: gdn_prep prepares the tokens, the walks'
    dot products go element by element)."""
    rng = np.random.default_rng(463)
    meta = make_batch(rng, num_slots=16, order="random", prefill_lens=[10], num_decodes=2, spec_lens=[3, 2],
                      num_spec=2)
    cfg = kda_config(1, K, 16 if K % 16 else K, 16, num_spec=2, act_dtype="f32", ssm_layout=ssm_layout,
                     force_recurrent=True)
    layer = KdaLayer(queue, rng, cfg)
    layer.check(meta, layer.inputs(rng, meta["num_actual_tokens"]))


def nonfinite_gates(rng, a):
    """Raw gates a (storage, float64) with +inf on ~20% of the elements (g = -inf: alpha = 0, that
    state row is reset before the token's update), -inf on ~10% (g = 0: alpha = 1)."""
    pick = rng.uniform(size=a[0].shape)
    for x in a:
        x[pick < 0.2] = np.inf
        x[(pick >= 0.2) & (pick < 0.3)] = -np.inf
    return a


@pytest.mark.parametrize("mode", ["decode", "spec", "prefill"])
@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
def test_kda_nonfinite_gates(queue, ssm_layout, mode):
    """alpha = 0 and alpha = 1 on a subset of the key channels, in every walk form (prefills of 5, 70
    and 130 tokens through the recurrence)."""
    rng = np.random.default_rng(464)
    meta = make_batch(rng, num_slots=32, order="random", **MODES[mode])
    cfg = kda_config(2, 16, 16, 32, num_spec=meta["num_spec"], act_dtype="f32", ssm_layout=ssm_layout,
                     force_recurrent=True)
    layer = KdaLayer(queue, rng, cfg)
    inp = layer.inputs(rng, meta["num_actual_tokens"])
    inp["a"] = nonfinite_gates(rng, inp["a"])
    layer.check(meta, inp)


class KdaTwins(Twins):
    """Replay mode's twins (tests/replay_checks.py) of a KDA layer, with alpha = 0 and alpha = 1 on
    some key channels of every step (nonfinite_gates): g = -inf goes through the ring too."""

    def __init__(self, queue, rng, K, V, S, num_slots, state_dtype, ssm_layout, act="f32", H=2):
        super().__init__(queue, rng, H, H, K, V, S, num_slots, state_dtype, ssm_layout, act, gate_mode="channel",
                         force_recurrent=True)

    def tokens(self, n):
        x, a, b = super().tokens(n)
        if self.act == "bf16":
            a = pygdn.to_bf16_bits(nonfinite_gates(self.rng, [pygdn.from_bf16_bits(a)])[0])
        else:
            a = nonfinite_gates(self.rng, [a])[0]
        return x, a, b


@pytest.mark.parametrize("ssm_layout,state_dtype,S,op,K", [
    ("vk", "f32", 3, "attention", 16), ("kv", "f32", 3, "attention", 16), ("kv", "f32", 7, "attention", 16),
    ("vk", "f32", 9, "attention", 16), ("kv", "f32", 9, "attention", 16), ("vk", "bf16", 2, "attention", 16),
    ("kv", "f16", 2, "attention", 16), ("vk", "f32", 2, "delta", 16), ("kv", "f32", 2, "delta", 16),
    ("vk", "f32", 3, "attention", 64), ("kv", "bf16", 3, "attention", 64)])
def test_kda_replay_equals_per_token(queue, ssm_layout, state_dtype, S, op, K):
    """Replay mode against the per-token mode (tests/test_replay.py's loop): every step's outputs
    bit-identical, the flushed states bit-identical to the per-token mode's. S = 7: walks of up to
    8 tokens (the CPU walks' prepared forms); S = 9: longer (held) walks."""
    tw = KdaTwins(queue, np.random.default_rng(465 + S), K, K, S, num_slots=3 * (S + 1) + 2, state_dtype=state_dtype,
                  ssm_layout=ssm_layout)
    mtp_loop(tw, steps=6 if S > 3 else 8, op=op)
# ----------------------------------------------------------------------------- chunked prefill
# The chunk kernels (gdn_chunk_prep / gdn_chunk_scan and their CPU-device variants) with a decay per
# key channel, on the delta rule alone (conv output, g and beta given), against the float64
# recurrence. Gates: decays from e^-2.7 to ~1 per channel (a chunk's products of them underflow to
# 0 on the strongly decaying channels); channels ONE never decay (alpha = 1); channels ZERO reset
# (alpha = 0: g = -inf, or g = -1e4, whose e^g underflows) at some tokens, both sides of a chunk
# boundary, two in a row; the shortest prefill has no decay at all.
PAD = -1
ONE, ZERO = [1, 6], [0, 3, 7]
RESET_POSITIONS = [0, 5, 6, 63, 64, 100, 149]


def chunk_gates(rng, meta, H, K):
    T = meta["num_actual_tokens"]
    g = -np.exp(rng.uniform(-5.0, 1.0, (T, H, K)))
    g[:, :, ONE] = 0.0
    qsl, tok = meta["non_spec_query_start_loc"], meta["non_spec_token_indx"]
    lens = np.diff(qsl)
    for s in range(len(lens)):
        rows = tok[qsl[s]:qsl[s + 1]]
        if lens[s] <= 2:
            g[rows] = 0.0
        for n, t in enumerate(p for p in RESET_POSITIONS if p < lens[s]):
            g[rows[t], n % H, ZERO] = -np.inf if n % 2 else -1e4
    beta = rng.uniform(0.0, 1.0, (T, H))
    return g.astype(np.float32), beta.astype(np.float32)


def chunk_run(queue, meta, H, K, V, ssm_layout, state_dtype="f32", rng_seed=7, num_slots=16):
    """(device out [T, H, V], device ssm [slots, H, K, V] canonical, reference out, reference ssm)."""
    rng = np.random.default_rng(rng_seed)
    T = meta["num_actual_tokens"]
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=H, head_k_dim=K, head_v_dim=V, num_slots=num_slots,
                       act_dtype="f32", ssm_layout=ssm_layout, state_dtype=state_dtype, gate_mode="channel")
    qkv = rng.standard_normal((T, 2 * H * K + H * V)).astype(np.float32)
    g, beta = chunk_gates(rng, meta, H, K)
    s0 = (rng.standard_normal((num_slots, H, K, V)) * 0.5).astype(np.float32)
    if state_dtype != "f32":  # the stored start state is what the reference reads
        s0 = dequantize(quantize(s0, state_dtype)[0], state_dtype).astype(np.float32)
    d_ssm = usm(queue, ssm_from_canonical(quantize(s0, state_dtype)[0], ssm_layout))
    d_out = usm(queue, np.full((T + 1, H, V), 5.0, np.float32))
    pygdn.gated_delta_rule(queue, cfg, to_device(meta, queue), conv_out=usm(queue, qkv), ssm_state=d_ssm,
                           core_attn_out=d_out, g=usm(queue, g.reshape(T, H * K)), beta=usm(queue, beta))
    queue.wait()
    out = d_out.to_numpy()
    assert np.all(out[T] == 5.0), "canary row past num_actual_tokens was written"
    got_ssm = dequantize(ssm_to_canonical(d_ssm.to_numpy(), ssm_layout), state_dtype).astype(np.float64)
    want_o, want_ssm = ref.gated_delta_rule(qkv, g, beta, s0.astype(np.float64), meta, H, H, K, V,
                                            state_dtype=None if state_dtype == "f32" else state_dtype)
    return out[:T], got_ssm, want_o, want_ssm, s0


def chunk_check(got_o, got_ssm, want_o, want_ssm, s0, state_dtype, tol=2e-4):
    assert_close(got_o, want_o, tol, "core_attn_out")
    assert_close(got_ssm, want_ssm, tol if state_dtype == "f32" else {"bf16": 1e-2, "f16": 2e-3}[state_dtype], "ssm_state")
    for s in range(s0.shape[0]):  # slots no sequence writes stay bit for bit
        if np.array_equal(want_ssm[s], s0[s]):
            assert np.array_equal(got_ssm[s], s0[s].astype(np.float64)), f"slot {s} changed"


@pytest.mark.parametrize("K,ssm_layout,state_dtype", [(64, "kv", "f32"), (64, "vk", "f32"), (64, "kv", "f16"),
                                                      (128, "kv", "f32"), (128, "vk", "bf16")])
def test_kda_chunked_prefill(queue, kernels, K, ssm_layout, state_dtype):
    """Prefills of 150 (three chunks, the last partial), 64 (one whole chunk) and 2 tokens, with and
    without initial state, interleaved rows, 2 heads."""
    rng = np.random.default_rng(461)
    meta = make_batch(rng, num_slots=16, prefill_lens=[150, 64, 2], has_initial_state=[1, 0, 1], order="random")
    chunk_check(*chunk_run(queue, meta, 2, K, K, ssm_layout, state_dtype), state_dtype)


@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
def test_kda_chunked_prefill_checkpoints(queue, kernels, ssm_layout):
    """Block checkpoints every 64 tokens: a 300-token prefill of a request holding 100 tokens, reading
    slot 1, storing 5 boundaries (the third not stored); a 70-token prefill from position 0 with one
    checkpoint and no initial state. Chunks end at the boundaries (positions 128, 192, ... of the
    request), so the per-channel decays of chunks shorter than 64 tokens are checked too."""
    T_ns = 370
    rows = np.random.default_rng(462).permutation(T_ns).astype(np.int32)
    ckpt = np.array([[10, 11, PAD, 12, 13], [14, PAD, PAD, PAD, PAD]], np.int32)
    meta = dict(num_prefills=2, num_actual_tokens=T_ns, non_spec_token_count=T_ns,
                non_spec_query_start_loc=np.array([0, 300, 370], np.int32),
                non_spec_state_indices=np.array([2, 3], np.int32),
                non_spec_read_state_indices=np.array([1, 3], np.int32),
                non_spec_start_pos=np.array([100, 0], np.int32), has_initial_state=np.array([1, 0], np.uint8),
                non_spec_token_indx=rows, checkpoint_interval=64, checkpoint_cols=5, checkpoint_state_indices=ckpt)
    chunk_check(*chunk_run(queue, meta, 2, 64, 64, ssm_layout), "f32")


def test_kda_long_prefill(queue, kernels):
    """One prefill of 32768 tokens (512 chunks), one head, K = V = 64: outputs and final state finite
    and close to the float64 recurrence (channels that never decay, resets on others)."""
    T = 32768
    meta = make_batch(np.random.default_rng(463), num_slots=4, prefill_lens=[T], has_initial_state=[1],
                      order="grouped")
    got_o, got_ssm, want_o, want_ssm, s0 = chunk_run(queue, meta, 1, 64, 64, "kv", num_slots=4)
    assert np.isfinite(got_o).all() and np.isfinite(got_ssm).all()
    chunk_check(got_o, got_ssm, want_o, want_ssm, s0, "f32", tol=1e-3)
