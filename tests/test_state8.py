"""8-bit SSM states (include/gdn_xpu.h "State dtype"; docs/op.md): int8 and OCP E4M3 codes with an
f32 scale per state row in ssm_scale, against the float64 reference (pygdn/reference.py
quantize_state / dequantize_state model the codes exactly).

Tolerances, and why. A call dequantizes the states it reads (code x scale, exact in f32), computes
in f32 and quantizes only what it stores, so its outputs stay within the f32 bound of the delta-rule
tests (2e-5 of the largest output) of the reference started from the same dequantized states. A
stored row: its scale is the row's largest magnitude / 127 (i8) or / 448 (E4M3), the kernel's from
its f32 state, the reference's from its exact state (relative 1e-5 apart); the codes are the
reference's codes of the exact state unless the two straddle a rounding midpoint: every code within
one step of the reference's, at most 1% of them differing (round to nearest). Stochastic rounding:
every code is one of the two neighbours of the exact value (within one step), the same bits in two
equal calls and alone or inside a batch.

Kernel builds: K = V = 32, f32 activations: per (dtype, layout, kernel family) the recurrent and
chunk builds, ~1-2 minutes of cold compile on the 2-core test host for the whole file.
"""

import numpy as np
import pytest

import pygdn
from pygdn import reference as ref
from pygdn.batch import make_batch, to_device
from helpers import assert_close, ssm_from_canonical, ssm_to_canonical, usm

H, HV, K, V, W = 1, 2, 32, 32, 4
RTOL_OUT = 2e-5
STATE8 = ["i8", "f8e4m3"]


def config(num_slots, state_dtype, ssm_layout, **kw):
    fields = dict(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=num_slots, conv_width=W,
                  act_dtype="f32", state_dtype=state_dtype, ssm_layout=ssm_layout, conv_state_len=W - 1 + 2)
    fields.update(num_k_heads=kw.pop("H", H), num_v_heads=kw.pop("HV", HV), **kw)
    return pygdn.Config(**fields)


class State8:
    """An 8-bit ssm_state and its ssm_scale on the device, and the float64 state they hold
    (canonical [slots, HV, K, V]) for the reference."""

    def __init__(self, queue, rng, cfg):
        self.queue, self.cfg = queue, cfg
        hv = cfg.num_v_heads
        S0 = rng.standard_normal((cfg.num_slots, hv, K, V)) * 0.5
        codes, scales = ref.quantize_state(S0, cfg.state_dtype)
        self.d_ssm = usm(queue, ssm_from_canonical(codes, cfg.ssm_layout))
        self.d_scale = usm(queue, np.asarray(scales, np.float32))

    def codes(self):
        return ssm_to_canonical(self.d_ssm.to_numpy(), self.cfg.ssm_layout)

    def scales(self):
        return self.d_scale.to_numpy()

    def values(self):
        return ref.dequantize_state(self.codes(), self.scales(), self.cfg.state_dtype)


def delta_call(queue, cfg, st, meta, x, g, beta):
    T = meta["num_actual_tokens"]
    out = usm(queue, np.full((T + 1, cfg.num_v_heads, V), 5.0, np.float32))
    pygdn.gated_delta_rule(queue, cfg, to_device(meta, queue), conv_out=usm(queue, x), g=usm(queue, g),
                           beta=usm(queue, beta), ssm_state=st.d_ssm, ssm_scale=st.d_scale, core_attn_out=out)
    o = out.to_numpy().astype(np.float64)
    assert np.all(o[T] == 5.0), "canary row past num_actual_tokens was written"
    return o[:T]


def inputs(rng, T, hv=HV, gate_k=1):
    x = rng.standard_normal((T, 2 * H * K + hv * V)).astype(np.float32)
    g = -rng.uniform(0.01, 1.0, (T, hv * gate_k)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (T, hv)).astype(np.float32)
    return x, g, beta


def check_stored(st, before_codes, before_scales, S0, S1, stochastic=False):
    """Slots the reference changed hold its state's codes and scales; every other slot (pads
    included) is bit-identical, codes and scales."""
    dtype = st.cfg.state_dtype
    codes, scales = st.codes(), st.scales()
    written = 0
    for s in range(st.cfg.num_slots):
        if np.array_equal(S1[s], S0[s]):
            assert np.array_equal(codes[s], before_codes[s]), f"ssm_state[{s}] not written but changed"
            assert np.array_equal(scales[s], before_scales[s]), f"ssm_scale[{s}] not written but changed"
            continue
        written += 1
        want_codes, want_scales = ref.quantize_state(S1[s], dtype)
        np.testing.assert_allclose(scales[s], want_scales, rtol=1e-5, err_msg=f"ssm_scale[{s}]")
        # On the row's code grid (y = value / scale): the stored code within half a step of the exact
        # y (stochastic: within one step), plus the f32 bound (2e-5 of the row's largest |y|).
        y = S1[s] / np.where(want_scales > 0, want_scales, 1.0)[:, None, :]
        got = ref.dequantize_state(codes[s], np.ones_like(want_scales), dtype)
        if dtype == "i8":
            step = np.ones_like(y)
        else:  # E4M3: 2^(e-3) in the binade [2^e, 2^(e+1)), 2^-9 below 2^-6
            step = np.ldexp(1.0, np.maximum(np.frexp(np.abs(y))[1] - 1, -6) - 3)
        allowed = (1.0 if stochastic else 0.5) * step + 2e-5 * ref._QMAX[dtype]
        assert np.all(np.abs(got - y) <= allowed), f"ssm_state[{s}]: a code off its value's step"
        if not stochastic:
            differ = np.mean(codes[s] != want_codes)
            assert differ <= 0.01, f"ssm_state[{s}]: {differ:.1%} of the codes differ from the reference's rounding"
    return written


# ----------------------------------------------------------------------------- every path
@pytest.mark.parametrize("ssm_layout", ["vk", "kv"])
@pytest.mark.parametrize("dtype", STATE8)
def test_every_path(queue, kernels, dtype, ssm_layout):
    """One mixed batch with chunked prefills (70, 130 tokens), a 1-token prefill, decodes, ragged
    spec sequences with every acceptance count (a state per token), graph padding; then a prefill
    with a read slot apart from its write slot and block checkpoints (every 64 tokens)."""
    rng = np.random.default_rng(800 + STATE8.index(dtype) * 2 + (ssm_layout == "vk"))
    num_slots = 40
    cfg = config(num_slots, dtype, ssm_layout)
    st = State8(queue, rng, cfg)
    meta = make_batch(rng, num_slots=num_slots, prefill_lens=[70, 130, 1], num_decodes=3, spec_lens=[3, 1, 2, 3],
                      num_spec=2, accepted=[1, 2, 3, 2], order="random", pad_non_spec=1, pad_spec=1, pad_len=1)
    x, g, beta = inputs(rng, meta["num_actual_tokens"])
    for step in range(2):
        if step == 1:  # read slot 3, write slot 4, checkpoints to 5, 6 (the third column never reached)
            n = 150
            meta = dict(num_prefills=1, num_actual_tokens=n, non_spec_token_count=n,
                        non_spec_query_start_loc=np.array([0, n], np.int32), non_spec_state_indices=np.array([4], np.int32),
                        non_spec_read_state_indices=np.array([3], np.int32), has_initial_state=np.array([1], np.uint8),
                        non_spec_start_pos=np.array([0], np.int32), checkpoint_interval=64, checkpoint_cols=3,
                        checkpoint_state_indices=np.array([[5, 6, 7]], np.int32))
            x, g, beta = inputs(rng, n)
        codes0, scales0, S0 = st.codes(), st.scales(), st.values()
        got = delta_call(queue, cfg, st, meta, x, g, beta)
        want, S1 = ref.gated_delta_rule(x.astype(np.float64), g.astype(np.float64), beta.astype(np.float64), S0, meta,
                                        H, HV, K, V)
        assert_close(got, want, RTOL_OUT, "core_attn_out")
        assert check_stored(st, codes0, scales0, S0, S1) > 0


@pytest.mark.parametrize("dtype", STATE8)
def test_kda_every_path(queue, kernels, dtype):
    """KDA (a decay per key channel) on an 8-bit vk state: prefill, decodes and spec sequences."""
    rng = np.random.default_rng(830 + STATE8.index(dtype))
    num_slots = 24
    cfg = config(num_slots, dtype, "vk", H=2, HV=2, gate_mode="channel")
    st = State8(queue, rng, cfg)
    meta = make_batch(rng, num_slots=num_slots, prefill_lens=[90], num_decodes=2, spec_lens=[3, 2], num_spec=2,
                      accepted=[2, 1], order="random")
    T = meta["num_actual_tokens"]
    x = rng.standard_normal((T, 2 * 2 * K + 2 * V)).astype(np.float32)
    g = -rng.uniform(0.0, 0.5, (T, 2 * K)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (T, 2)).astype(np.float32)
    codes0, scales0, S0 = st.codes(), st.scales(), st.values()
    got = delta_call(queue, cfg, st, meta, x, g, beta)
    want, S1 = ref.gated_delta_rule(x.astype(np.float64), g.astype(np.float64).reshape(T, 2, K), beta.astype(np.float64),
                                    S0, meta, 2, 2, K, V)
    assert_close(got, want, RTOL_OUT, "core_attn_out")
    assert check_stored(st, codes0, scales0, S0, S1) > 0


@pytest.mark.parametrize("dtype", STATE8)
def test_matrix_form_prefill(queue, dtype):
    """prefill_precision "bf16" (the chunk kernels' matrix form; emulated tiles on the CPU device)
    stores an 8-bit final state and checkpoint with the f32 form's scales and codes, to the bf16
    operands' rounding."""
    rng = np.random.default_rng(850 + STATE8.index(dtype))
    n = 140
    meta = dict(num_prefills=1, num_actual_tokens=n, non_spec_token_count=n,
                non_spec_query_start_loc=np.array([0, n], np.int32), non_spec_state_indices=np.array([1], np.int32),
                has_initial_state=np.array([1], np.uint8), non_spec_start_pos=np.array([0], np.int32),
                checkpoint_interval=64, checkpoint_cols=2, checkpoint_state_indices=np.array([[2, 3]], np.int32))
    x, g, beta = inputs(rng, n)
    got = {}
    for precision in ("f32", "bf16"):
        cfg = config(4, dtype, "vk", prefill_precision=precision)
        st = State8(queue, np.random.default_rng(7), cfg)
        delta_call(queue, cfg, st, meta, x, g, beta)
        got[precision] = st
    S32, Sbf = got["f32"].values(), got["bf16"].values()
    scale = got["f32"].scales()
    for s in (1, 2, 3):
        # bf16 operands move the state by ~1e-2 of its magnitude; then one code step more at most
        tol = 2e-2 * np.abs(S32[s]).max() + (1.0 if dtype == "i8" else 32.0) * scale[s].max()
        assert np.abs(Sbf[s] - S32[s]).max() <= tol, f"slot {s}: the matrix form's 8-bit state"
        np.testing.assert_allclose(got["bf16"].scales()[s], scale[s], rtol=3e-2, err_msg=f"ssm_scale[{s}]")


# ----------------------------------------------------------------------------- stochastic rounding
@pytest.mark.parametrize("ssm_layout", ["vk", "kv"])
@pytest.mark.parametrize("dtype", STATE8)
def test_stochastic_rounding(queue, kernels, dtype, ssm_layout):
    """state_rounding "stochastic": every code one of its value's two neighbours; the rounding
    errors average out (their mean well under a tenth of a step); the same bits from the same call
    again, and for a sequence alone as inside a batch (the random bits do not depend on the slot)."""
    rng = np.random.default_rng(870 + STATE8.index(dtype) * 2 + (ssm_layout == "vk"))
    num_slots = 30
    cfg = config(num_slots, dtype, ssm_layout, state_rounding="stochastic")
    meta = make_batch(rng, num_slots=num_slots, prefill_lens=[100], num_decodes=4, spec_lens=[3, 2], num_spec=2,
                      accepted=[1, 3], order="random")
    x, g, beta = inputs(rng, meta["num_actual_tokens"])
    runs = []
    for _ in range(2):
        st = State8(queue, np.random.default_rng(5), cfg)
        codes0, scales0, S0 = st.codes(), st.scales(), st.values()
        delta_call(queue, cfg, st, meta, x, g, beta)
        _, S1 = ref.gated_delta_rule(x.astype(np.float64), g.astype(np.float64), beta.astype(np.float64), S0, meta,
                                     H, HV, K, V)
        check_stored(st, codes0, scales0, S0, S1, stochastic=True)
        runs.append((st.codes(), st.scales(), S1))
    assert np.array_equal(runs[0][0], runs[1][0]) and np.array_equal(runs[0][1], runs[1][1]), "not deterministic"
    codes, scales, S1 = runs[0]
    written = [s for s in range(num_slots) if not np.array_equal(S1[s], S0[s])]
    err = (ref.dequantize_state(codes[written], scales[written], dtype) - S1[written]) / scales[written][:, :, None, :]
    nearest = ref.dequantize_state(*ref.quantize_state(S1[written], dtype), dtype) - S1[written]
    assert np.mean(codes[written] != ref.quantize_state(S1[written], dtype)[0]) > 0.05, "no code rounded away from nearest"
    if dtype == "i8":  # (E4M3's steps vary with magnitude: the unbiasedness is checked on i8's uniform grid)
        assert abs(err.mean()) < 0.05, f"stochastic rounding biased: mean error {err.mean():.3f} steps"
        assert np.abs(nearest).max() <= 0.5 * scales[written].max() * (1 + 1e-5)
    # The decode of slot-set 0 alone, in other slots: the same codes and scales as inside the batch.
    ns = meta["non_spec_state_indices"]
    qsl = meta["non_spec_query_start_loc"]
    i = int(np.argmax(np.diff(qsl) == 1))  # a decode
    rows = meta["non_spec_token_indx"][qsl[i]:qsl[i + 1]] if meta.get("non_spec_token_indx") is not None else [qsl[i]]
    r = int(rows[0])
    st = State8(queue, np.random.default_rng(5), cfg)
    src = int(ns[i])
    alone = dict(num_decodes=1, num_actual_tokens=1, non_spec_token_count=1, non_spec_query_start_loc=np.array([0, 1], np.int32),
                 non_spec_state_indices=np.array([src], np.int32), has_initial_state=np.array([1], np.uint8))
    delta_call(queue, cfg, st, alone, x[r:r + 1], g[r:r + 1], beta[r:r + 1])
    assert np.array_equal(st.codes()[src], codes[src]) and np.array_equal(st.scales()[src], scales[src]), \
        "a decode's stochastic rounding differs alone and inside the batch"


# ----------------------------------------------------------------------------- across steps
@pytest.mark.parametrize("dtype", STATE8)
def test_decode_steps_against_an_f32_state(queue, dtype):
    """256 decode steps of one sequence (8 v-heads, K = V = 128, the gates of docs/op.md's study:
    A_log = log U(1, 16), a, b ~ N(0, 1), dt_bias ~ N(0, 0.1^2)) on an 8-bit state against the same
    steps on an f32 state: the outputs' and the final state's relative error (Frobenius) within the
    bounds the study sets for its "gates N(0,1)" rows (about 2.5x its measured levels, which do not
    grow with the step count)."""
    bound = {"i8": (2e-2, 2e-2), "f8e4m3": (6e-2, 7e-2)}[dtype]  # (outputs, state)
    rng = np.random.default_rng(890 + STATE8.index(dtype))
    steps, hk, hv, kd = 256, 4, 8, 128
    x = rng.standard_normal((steps, 2 * hk * kd + hv * kd)).astype(np.float32)
    A_log = np.log(rng.uniform(1, 16, hv))
    g, beta = ref.gates(rng.standard_normal((steps, hv)), rng.standard_normal((steps, hv)), A_log,
                        rng.normal(0.0, 0.1, hv))
    g, beta = g.astype(np.float32), beta.astype(np.float32)
    meta = dict(num_decodes=1, num_actual_tokens=1, non_spec_token_count=1, non_spec_query_start_loc=np.array([0, 1], np.int32),
                non_spec_state_indices=np.array([0], np.int32), has_initial_state=np.array([1], np.uint8))
    batch = to_device(meta, queue)
    outs, states = {}, {}
    for state_dtype in ("f32", dtype):
        cfg = pygdn.Config(num_k_heads=hk, num_v_heads=hv, head_k_dim=kd, head_v_dim=kd, num_slots=1, act_dtype="f32",
                           state_dtype=state_dtype, ssm_layout="vk")
        npdt = {"f32": np.float32, "i8": np.int8, "f8e4m3": np.uint8}[state_dtype]
        ssm = usm(queue, np.zeros(cfg.ssm_state_shape, npdt))
        sc = usm(queue, np.zeros(cfg.ssm_scale_shape, np.float32)) if state_dtype != "f32" else None
        out = usm(queue, np.zeros((1, hv, kd), np.float32))
        o = []
        for t in range(steps):
            pygdn.gated_delta_rule(queue, cfg, batch, conv_out=usm(queue, x[t:t + 1]), g=usm(queue, g[t:t + 1]),
                                   beta=usm(queue, beta[t:t + 1]), ssm_state=ssm, ssm_scale=sc, core_attn_out=out)
            o.append(out.to_numpy().astype(np.float64))
        outs[state_dtype] = np.concatenate(o)
        s = ssm.to_numpy()
        states[state_dtype] = (s.astype(np.float64) if sc is None else
                               ref.dequantize_state(np.swapaxes(s, 2, 3), sc.to_numpy(), state_dtype))
    states["f32"] = np.swapaxes(states["f32"], 2, 3)
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
    err = (rel(outs[dtype], outs["f32"]), rel(states[dtype], states["f32"]))
    assert err[0] <= bound[0] and err[1] <= bound[1], \
        f"{dtype}: outputs / state {err[0]:.2%} / {err[1]:.2%} from the f32 state's after {steps} steps (bounds {bound})"


# ----------------------------------------------------------------------------- arguments
def test_validation(queue):
    """ssm_scale is checked like every array; the 8-bit dtypes are state dtypes only; stochastic
    rounding is for 8-bit states; replay mode takes no 8-bit state."""
    rng = np.random.default_rng(3)
    cfg = config(4, "i8", "vk")
    st = State8(queue, rng, cfg)
    meta = dict(num_decodes=1, num_actual_tokens=1, non_spec_token_count=1, non_spec_query_start_loc=np.array([0, 1], np.int32),
                non_spec_state_indices=np.array([1], np.int32), has_initial_state=np.array([1], np.uint8))
    x, g, beta = inputs(rng, 1)
    before = st.codes(), st.scales()
    args = dict(conv_out=usm(queue, x), g=usm(queue, g), beta=usm(queue, beta), core_attn_out=usm(queue, np.zeros((1, HV, V), np.float32)))
    batch = to_device(meta, queue)
    with pytest.raises(pygdn.GdnError, match=r"tensors->ssm_scale is NULL.*8-bit"):
        pygdn.gated_delta_rule(queue, cfg, batch, ssm_state=st.d_ssm, **args)
    with pytest.raises(ValueError, match=r"ssm_scale: shape"):
        pygdn.gated_delta_rule(queue, cfg, batch, ssm_state=st.d_ssm, ssm_scale=usm(queue, np.zeros((4, HV, V - 1), np.float32)), **args)
    with pytest.raises(TypeError, match=r"ssm_state: dtype u8, expected i8"):
        pygdn.gated_delta_rule(queue, cfg, batch, ssm_state=usm(queue, st.codes().view(np.uint8)), ssm_scale=st.d_scale, **args)
    f32 = config(4, "f32", "vk")
    with pytest.raises(pygdn.GdnError, match=r"tensors->ssm_scale is given but cfg->state_dtype = 1 has no scales"):
        pygdn.gated_delta_rule(queue, f32, batch, ssm_state=usm(queue, np.zeros(f32.ssm_state_shape, np.float32)),
                               ssm_scale=st.d_scale, **args)
    for bad, match in ((dict(state_dtype="bf16", state_rounding="stochastic"), r"cfg->state_rounding = GDN_ROUND_STOCHASTIC"),
                       (dict(act_dtype="i8"), r"cfg->act_dtype = 4: GDN_DTYPE_I8 / GDN_DTYPE_F8E4M3 are state dtypes only"),
                       (dict(replay_tokens=3), r"cfg->replay_tokens = 3 with an 8-bit state_dtype"),
                       (dict(ssm_scale_slot_stride=HV * V - 1), r"cfg->ssm_scale_slot_stride")):
        c = config(4, bad.pop("state_dtype", "i8"), "vk", **bad)
        with pytest.raises(pygdn.GdnError, match=match):
            pygdn.warmup(queue, c)
    assert np.array_equal(st.codes(), before[0]) and np.array_equal(st.scales(), before[1]), "a refused call wrote"


# ----------------------------------------------------------------------------- graphs, padding
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", STATE8)
def test_graph_replays_equal_eager_calls(queue, dtype, rounding):
    """A decode + MTP step on an 8-bit state recorded once (pygdn.Graph) and replayed four times
    with new inputs: codes, scales and outputs bit-identical to the same steps called eagerly on a
    twin cache."""
    rng = np.random.default_rng(910 + STATE8.index(dtype) * 2 + (rounding == "stochastic"))
    num_slots = 16
    cfg = config(num_slots, dtype, "vk", state_rounding=rounding)
    meta = make_batch(rng, num_slots=num_slots, num_decodes=3, spec_lens=[3, 2], num_spec=2, accepted=[2, 1],
                      order="random", pad_non_spec=1)
    T = meta["num_actual_tokens"]
    batch = to_device(meta, queue, validate="counts")
    twins = [State8(queue, np.random.default_rng(11), cfg) for _ in range(2)]
    ins = [dict(conv_out=usm(queue, np.zeros((T, 2 * H * K + HV * V), np.float32)), g=usm(queue, np.zeros((T, HV), np.float32)),
                beta=usm(queue, np.zeros((T, HV), np.float32)), core_attn_out=usm(queue, np.zeros((T, HV, V), np.float32)))
           for _ in twins]

    def call(i):
        pygdn.gated_delta_rule(queue, cfg, batch, ssm_state=twins[i].d_ssm, ssm_scale=twins[i].d_scale, **ins[i])

    def new_inputs():
        x, g, beta = inputs(rng, T)
        for d in ins:
            d["conv_out"].copy_from(x), d["g"].copy_from(g), d["beta"].copy_from(beta)

    new_inputs()
    call(1)  # (kernels built, workspace grown), then the twin's caches reset to the recorded run's
    twins[1].d_ssm.copy_from(twins[0].d_ssm.to_numpy()), twins[1].d_scale.copy_from(twins[0].d_scale.to_numpy())
    with pygdn.Graph(queue) as graph:
        call(0)
    for step in range(4):
        new_inputs()
        graph.replay()
        call(1)
        for name in ("d_ssm", "d_scale"):
            got, want = (getattr(t, name).to_numpy() for t in twins)
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), f"step {step}: {name} differs from the eager call's"
        assert np.array_equal(ins[0]["core_attn_out"].to_numpy(), ins[1]["core_attn_out"].to_numpy()), f"step {step}: outputs"


@pytest.mark.parametrize("dtype", STATE8)
def test_null_block_padding(queue, kernels, dtype):
    """vLLM's padding (pad_slot_id 0, the null block): padded decode and spec rows index slot 0,
    whose codes and scale stay bit-identical; the real rows match the reference."""
    rng = np.random.default_rng(940 + STATE8.index(dtype))
    num_slots = 20
    cfg = config(num_slots, dtype, "vk")
    st = State8(queue, rng, cfg)
    meta = make_batch(rng, num_slots=num_slots - 1, num_decodes=3, spec_lens=[3, 2], num_spec=2, accepted=[2, 3],
                      order="random", pad_non_spec=2, pad_spec=1, pad_len=1)
    for key in ("non_spec_state_indices", "spec_state_indices"):  # slots 1.. real, -1 -> 0 (the null block)
        idx = np.asarray(meta[key]).copy()
        meta[key] = np.where(idx < 0, 0, idx + 1).astype(np.int32)
    meta["pad_slot_id"] = 0
    x, g, beta = inputs(rng, meta["num_actual_tokens"])
    codes0, scales0, S0 = st.codes(), st.scales(), st.values()
    got = delta_call(queue, cfg, st, meta, x, g, beta)
    want, S1 = ref.gated_delta_rule(x.astype(np.float64), g.astype(np.float64), beta.astype(np.float64), S0, meta, H, HV, K, V)
    assert_close(got, want, RTOL_OUT, "core_attn_out")
    assert np.array_equal(st.codes()[0], codes0[0]) and np.array_equal(st.scales()[0], scales0[0]), "the null block changed"
    assert check_stored(st, codes0, scales0, S0, S1) > 0
