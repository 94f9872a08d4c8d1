"""What serving engines hand the op as they hand it: dt_bias in the activations' dtype (vLLM's
parameter, vllm-xpu-kernels' contract; gdn_tensors_t.dt_bias_dtype) and num_accepted_tokens outside
[1, 1 + num_spec] under GDN_VALIDATE_COUNTS (0 as vllm-xpu-kernels clamps it, graph padding's
values, garbage), which every reader clamps to that range.

dt_bias: the same values in the activations' dtype and widened to f32 give bit-identical results,
on the per-head gates (GDN) and the per-channel gates (KDA, the 16-lane gate path), prefill
(chunked), decodes and spec sequences. Accepted counts: a batch with counts out of range gives
bit for bit the outputs, caches (and, in replay mode, rings) of the same batch with the counts
clamped, in both conv spec layouts, with read slots apart and in replay mode; 0 is checked against
the float64 reference as 1. Kernel builds: f32, bf16 and f16 activations at K = V = 16 (shared with
the other modules' shapes)."""
import numpy as np
import pytest

import pygdn
from pygdn import ffi, lib, reference as ref
from pygdn.batch import make_batch, to_device
from helpers import assert_close, conv_from_canonical, conv_to_canonical, dequantize, quantize, ssm_to_canonical, usm

W, SLOTS = 4, 40


def config(act, S, spec_layout="snapshot", gate_mode="head", replay=0):
    H, HV = (2, 2) if gate_mode == "channel" else (1, 2)
    return pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=16, head_v_dim=16, num_slots=SLOTS, conv_width=W,
                        act_dtype=act, ssm_layout="vk", conv_layout="time_major", conv_spec_layout=spec_layout,
                        conv_state_len=W - 1 + S, gate_mode=gate_mode, replay_tokens=replay,
                        out_gate="sigmoid" if gate_mode == "channel" else "silu")


class Layer:
    """One layer's weights (host, exact values as float64 too) and a fresh copy of its caches per run."""

    def __init__(self, rng, cfg):
        self.cfg, act, C, HV, gk = cfg, cfg.act_dtype, cfg.conv_dim, cfg.num_v_heads, cfg.gate_k
        self.w_s, self.w = quantize(rng.standard_normal((C, W)) * 0.5, act)
        self.bias_s, self.bias = quantize(rng.standard_normal(C) * 0.1, act)
        self.A_log = np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32)
        self.dt_s, self.dt = quantize(rng.uniform(-1, 1, HV * gk), act)  # values the act dtype holds exactly
        self.conv0_s, self.conv0 = quantize(rng.standard_normal((SLOTS, C, cfg.state_len)), act)
        self.ssm0 = (rng.standard_normal(cfg.ssm_state_shape) * 0.5).astype(np.float32)  # vk: [slots, HV, V, K]

    def tokens(self, rng, T):
        act, HV, gk = self.cfg.act_dtype, self.cfg.num_v_heads, self.cfg.gate_k
        return (quantize(rng.standard_normal((T, self.cfg.conv_dim)), act), quantize(rng.standard_normal((T, HV * gk)), act),
                quantize(rng.standard_normal((T, HV)), act))


class Run:
    """The layer's caches (and rings) on the device, stepped by attention() calls."""

    def __init__(self, queue, layer):
        self.q, self.layer, cfg = queue, layer, layer.cfg
        self.conv = usm(queue, conv_from_canonical(layer.conv0_s, cfg.conv_layout))
        self.ssm = usm(queue, layer.ssm0)
        self.rings = {}
        if cfg.replay_tokens:
            self.rings = dict(replay_ring=usm(queue, np.zeros(cfg.replay_ring_shape, np.float32)),
                              replay_count=usm(queue, np.zeros(cfg.replay_count_shape, np.int32)))

    def step(self, meta, tokens, dt_bias, validate="counts"):
        (x_s, _), (a_s, _), (b_s, _) = tokens
        cfg, q, L = self.layer.cfg, self.q, self.layer
        T = meta["num_actual_tokens"]
        out = usm(q, quantize(np.full((T + 1, cfg.num_v_heads, cfg.head_v_dim), 5.0), cfg.act_dtype)[0])
        pygdn.attention(q, cfg, to_device(meta, q, validate=validate), mixed_qkv=usm(q, x_s), a=usm(q, a_s),
                        b=usm(q, b_s), conv_weight=usm(q, L.w_s), conv_bias=usm(q, L.bias_s), A_log=usm(q, L.A_log),
                        dt_bias=usm(q, dt_bias), conv_state=self.conv, ssm_state=self.ssm, core_attn_out=out,
                        **self.rings)
        return out.to_numpy()

    def state(self):
        """Every array the calls write, as raw bytes."""
        arrays = [self.conv, self.ssm, *self.rings.values()]
        return [a.to_numpy().view(np.uint8) for a in arrays]


def assert_same(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"{what}: array {i} differs"


# ----------------------------------------------------------------------------- dt_bias dtype
@pytest.mark.parametrize("act,gate_mode", [("bf16", "head"), ("f16", "head"), ("bf16", "channel")])
def test_dt_bias_in_act_dtype_matches_its_f32_widening(queue, act, gate_mode):
    rng = np.random.default_rng(7)
    cfg = config(act, 2, gate_mode=gate_mode)
    layer = Layer(rng, cfg)
    meta = make_batch(rng, num_slots=SLOTS, prefill_lens=[70, 5], num_decodes=2, spec_lens=[3, 1, 2], num_spec=2)
    tokens = layer.tokens(rng, meta["num_actual_tokens"])
    runs = [Run(queue, layer), Run(queue, layer)]
    o_act = runs[0].step(meta, tokens, layer.dt_s)
    o_f32 = runs[1].step(meta, tokens, layer.dt.astype(np.float32))
    assert np.array_equal(o_act.view(np.uint8), o_f32.view(np.uint8)), "outputs differ"
    assert_same(runs[0].state(), runs[1].state(), "caches")


def test_dt_bias_dtype_outside_f32_and_act_is_refused(queue):
    """gdn_tensors_t.dt_bias_dtype is 0 / F32 or cfg->act_dtype: F16 with f32 activations is refused by
    name before anything runs."""
    rng = np.random.default_rng(8)
    layer = Layer(rng, config("f32", 2))
    run = Run(queue, layer)
    meta = make_batch(rng, num_slots=SLOTS, num_decodes=2)
    (x_s, _), (a_s, _), (b_s, _) = layer.tokens(rng, 2)
    q, before = queue, run.state()
    call = pygdn.prepare(pygdn.attention, q, layer.cfg, to_device(meta, q), mixed_qkv=usm(q, x_s), a=usm(q, a_s),
                         b=usm(q, b_s), conv_weight=usm(q, layer.w_s), A_log=usm(q, layer.A_log),
                         dt_bias=usm(q, layer.dt_s), conv_state=run.conv, ssm_state=run.ssm,
                         core_attn_out=usm(q, np.zeros((2, 2, 16), np.float32)))
    assert call._c_t.dt_bias_dtype == lib.GDN_DTYPE_F32
    call._c_t.dt_bias_dtype = lib.GDN_DTYPE_F16
    with pytest.raises(pygdn.GdnError, match=r"GDN_ERROR_BAD_DTYPE: tensors->dt_bias_dtype = 2: dt_bias is "
                                             r"GDN_DTYPE_F32 or cfg->act_dtype \(1\)"):
        call.run()
    assert_same(run.state(), before, "a refused call's caches")


# ----------------------------------------------------------------------------- num_accepted_tokens
BAD = [0, -3, 7, 2, 0, 2**31 - 1]  # spec sequences' counts with num_spec = 2: three columns


@pytest.mark.parametrize("spec_layout,read", [("snapshot", False), ("rolled", False), ("rolled", True)])
def test_accepted_out_of_range_reads_as_clamped_under_counts(queue, spec_layout, read):
    """Out-of-range counts under GDN_VALIDATE_COUNTS: bit for bit the batch with the counts clamped
    to [1, 3] (which touches its own slots only: its every slot is compared), and for 0 the float64
    reference's A = 1. FULL refuses the same batch."""
    rng = np.random.default_rng(11)
    cfg = config("f32", 2, spec_layout)
    layer = Layer(rng, cfg)
    meta = make_batch(rng, num_slots=SLOTS, prefill_lens=[6], num_decodes=2, spec_lens=[3, 2, 3, 1, 2, 3],
                      num_spec=2, accepted=BAD)
    if read:  # an explicit read slot: the SSM state's and SNAPSHOT's A is not read, ROLLED's window column is
        meta["spec_read_state_indices"] = meta["spec_state_indices"][:, 1].copy()
    clamped = dict(meta, num_accepted_tokens=np.clip(np.asarray(BAD, np.int64), 1, 3).astype(np.int32))
    tokens = layer.tokens(rng, meta["num_actual_tokens"])
    runs = [Run(queue, layer), Run(queue, layer)]
    o_bad = runs[0].step(meta, tokens, layer.dt_s)
    o_ok = runs[1].step(clamped, tokens, layer.dt_s)
    assert np.array_equal(o_bad.view(np.uint8), o_ok.view(np.uint8)), "outputs differ from the clamped batch's"
    assert_same(runs[0].state(), runs[1].state(), "caches")

    (_, x), (_, a), (_, b) = tokens
    want_o, want_conv, want_ssm = ref.gdn_attention(x, a, b, layer.w, layer.bias, layer.A_log, layer.dt, layer.conv0,
                                                    ssm_to_canonical(layer.ssm0, "vk").astype(np.float64), clamped,
                                                    cfg.num_k_heads, cfg.num_v_heads, 16, 16, spec_layout=spec_layout)
    T = meta["num_actual_tokens"]
    assert_close(o_bad[:T], want_o, 2e-4, "core_attn_out")
    assert np.all(o_bad[T] == 5.0), "canary row written"
    assert np.array_equal(dequantize(conv_to_canonical(runs[0].conv.to_numpy(), cfg.conv_layout), "f32"), want_conv)
    assert_close(ssm_to_canonical(runs[0].ssm.to_numpy(), "vk"), want_ssm, 2e-4, "ssm_state")

    with pytest.raises(pygdn.GdnError, match=r"GDN_ERROR_BAD_ACCEPTED: num_accepted_tokens\[0\] = 0 is outside"):
        runs[0].step(meta, tokens, layer.dt_s, validate="full")


def test_accepted_out_of_range_in_replay_mode_reads_as_clamped(queue):
    """Replay mode: the replayed ring entries are min(A, ring count) with A clamped, bit for bit the
    clamped batch's (outputs, caches, rings, counts)."""
    rng = np.random.default_rng(12)
    cfg = config("f32", 2, "rolled", replay=3)
    layer = Layer(rng, cfg)
    first = make_batch(rng, num_slots=SLOTS, spec_lens=[3, 3, 2, 1], num_spec=2, accepted=[1, 1, 1, 1],
                       has_initial_state=False)
    second = dict(first, num_accepted_tokens=np.asarray([0, 9, -1, 3], np.int32))
    clamped = dict(first, num_accepted_tokens=np.asarray([1, 3, 1, 3], np.int32))
    t1, t2 = layer.tokens(rng, first["num_actual_tokens"]), layer.tokens(rng, first["num_actual_tokens"])
    runs = [Run(queue, layer), Run(queue, layer)]
    for run in runs:
        run.step(first, t1, layer.dt_s)
    o_bad = runs[0].step(second, t2, layer.dt_s)
    o_ok = runs[1].step(clamped, t2, layer.dt_s)
    assert np.array_equal(o_bad.view(np.uint8), o_ok.view(np.uint8)), "outputs differ from the clamped batch's"
    assert_same(runs[0].state(), runs[1].state(), "caches and rings")


def test_version_3_tensors_caller_gets_f32_dt_bias(queue):
    """A caller of the version-3 header (gdn_tensors_t ending before dt_bias_dtype) passes an f32
    dt_bias whatever follows its struct in memory."""
    rng = np.random.default_rng(13)
    layer = Layer(rng, config("bf16", 2))
    meta = make_batch(rng, num_slots=SLOTS, num_decodes=3, spec_lens=[2], num_spec=2)
    tokens = layer.tokens(rng, meta["num_actual_tokens"])
    runs = [Run(queue, layer), Run(queue, layer)]
    want = runs[0].step(meta, tokens, layer.dt.astype(np.float32))
    (x_s, _), (a_s, _), (b_s, _) = tokens
    q, T = queue, meta["num_actual_tokens"]
    out = usm(q, np.zeros((T, 2, 16), np.uint16))
    call = pygdn.prepare(pygdn.attention, q, layer.cfg, to_device(meta, q), mixed_qkv=usm(q, x_s), a=usm(q, a_s),
                         b=usm(q, b_s), conv_weight=usm(q, layer.w_s), conv_bias=usm(q, layer.bias_s),
                         A_log=usm(q, layer.A_log), dt_bias=usm(q, layer.dt.astype(np.float32)),
                         conv_state=runs[1].conv, ssm_state=runs[1].ssm, core_attn_out=out)
    n, size = ffi.sizeof("gdn_tensors_t"), ffi.offsetof("gdn_tensors_t", "dt_bias_dtype")
    buf = ffi.new("unsigned char[]", n)
    ffi.memmove(buf, b"\xa5" * n, n)
    ffi.memmove(buf, call._c_t, size)
    old = ffi.cast("gdn_tensors_t *", buf)
    old.struct_size = size
    assert lib.gdn_attention(ffi.cast("void *", q.addressof_ref()), call._c_cfg, call._c_batch, old) == lib.GDN_SUCCESS
    q.wait()
    assert np.array_equal(out.to_numpy(), want[:T]), "outputs differ"
    assert_same(runs[1].state(), runs[0].state(), "caches")
