"""causal_conv1d against the float64 reference: every mode x dtype x width x state layout."""
import numpy as np
import pytest

import pygdn
from pygdn.batch import make_batch, to_device
from pygdn import reference as ref
from conftest import (ACT_DTYPES, RTOL, assert_close, conv_from_canonical, conv_to_canonical, dequantize, quantize,
                      usm)

H, HV, K, V = 2, 4, 8, 8
NUM_SLOTS = 24

MODES = {
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


def run_conv(queue, rng, dtype, width, layout, spec_layout, mode, bias=True, silu=True):
    kw = MODES[mode]
    meta = make_batch(rng, num_slots=NUM_SLOTS, **kw)
    num_spec = meta["num_spec"]
    state_len = width - 1 + (num_spec if spec_layout == "rolled" else 0) + 1  # one spare column
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=NUM_SLOTS,
                       conv_width=width, act_dtype=dtype, conv_layout=layout, conv_spec_layout=spec_layout,
                       conv_state_len=state_len, no_silu=not silu)
    C, T = cfg.conv_dim, meta["num_actual_tokens"]
    x_s, x = quantize(rng.standard_normal((T, C)), dtype)
    w_s, w = quantize(rng.standard_normal((C, width)) * 0.5, dtype)
    b_s, b = quantize(rng.standard_normal(C) * 0.1, dtype) if bias else (None, None)
    st_s, st = quantize(rng.standard_normal((NUM_SLOTS, C, state_len)), dtype)
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


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_conv_modes(queue, dtype, width, mode):
    rng = np.random.default_rng(hash((dtype, width, mode)) % 2**32)
    layout = "time_major" if width % 2 else "dim_major"
    run_conv(queue, rng, dtype, width, layout, "snapshot", mode)
    if mode in ("spec", "mixed_padded", "grouped", "time_tiles"):
        run_conv(queue, rng, dtype, width, "dim_major" if layout == "time_major" else "time_major", "rolled", mode)


@pytest.mark.parametrize("layout", ["dim_major", "time_major"])
@pytest.mark.parametrize("spec_layout", ["snapshot", "rolled"])
def test_conv_no_bias_no_silu(queue, layout, spec_layout):
    run_conv(queue, np.random.default_rng(5), "f32", 4, layout, spec_layout, "mixed_padded", bias=False, silu=False)


def test_conv_width_8_long_prefill(queue):
    run_conv(queue, np.random.default_rng(6), "f32", 8, "time_major", "rolled", "prefill")


def test_conv_rolled_equals_snapshot_over_steps(queue):
    """Three MTP steps with acceptance 1, 2, 3: both spec layouts give the same conv outputs."""
    width, num_spec, C = 4, 2, 2 * H * K + HV * V
    outs = {}
    for spec_layout in ("snapshot", "rolled"):
        r = np.random.default_rng(8)  # same inputs for both layouts
        state_len = width - 1 + num_spec
        cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=3, conv_width=width,
                           act_dtype="f32", conv_layout="time_major", conv_spec_layout=spec_layout,
                           conv_state_len=state_len)
        st = np.zeros((3, C, state_len), np.float32)
        st[0, :, : width - 1] = r.standard_normal((C, width - 1))  # a prefill's window: columns 0..W-2 of slot 0
        d_state = usm(queue, conv_from_canonical(st, "time_major"))
        weight = usm(queue, r.standard_normal((C, width)).astype(np.float32))
        got = []
        for accepted in (1, 2, 3):
            meta = dict(num_spec_decodes=1, num_spec=num_spec, num_actual_tokens=3, spec_token_count=3,
                        spec_query_start_loc=np.array([0, 3], np.int32),
                        spec_state_indices=np.array([[0, 1, 2]], np.int32),
                        num_accepted_tokens=np.array([accepted], np.int32), spec_token_indx=None)
            x = r.standard_normal((3, C)).astype(np.float32)
            d_out = usm(queue, np.zeros((3, C), np.float32))
            pygdn.causal_conv1d(queue, cfg, to_device(dict(meta, num_prefills=0, num_decodes=0, non_spec_token_count=0,
                                                           pad_slot_id=-1), queue),
                                mixed_qkv=usm(queue, x), conv_weight=weight, conv_state=d_state, conv_out=d_out)
            got.append(d_out.to_numpy())
        outs[spec_layout] = got
    for step, (a, b) in enumerate(zip(outs["snapshot"], outs["rolled"])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=f"step {step}")
