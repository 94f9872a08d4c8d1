"""causal_conv1d against the float64 reference: every mode x dtype x width x state layout."""
import numpy as np
import pytest

import pygdn
from pygdn.batch import to_device
from helpers import ACT_DTYPES, conv_from_canonical, usm
from op_checks import CONV_DIMS, CONV_MODES, run_conv

H, HV, K, V = CONV_DIMS


@pytest.mark.parametrize("mode", list(CONV_MODES))
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_conv_modes(queue, dtype, width, mode):
    rng = np.random.default_rng(hash((dtype, width, mode)) % 2**32)
    layout = "time_major" if width % 2 else "dim_major"
    run_conv(queue, rng, dtype, width, layout, "snapshot", mode)
    if mode in ("spec", "mixed_padded", "grouped", "time_tiles"):
        run_conv(queue, rng, dtype, width, "dim_major" if layout == "time_major" else "time_major", "rolled", mode)


# The CPU device's conv kernels give a work-item GDN_CONV_BLOCKS (8) blocks of 16 channels:
# conv_dim 144 (H=1, K=16, HV=7, V=16) is nine blocks, a full group and a group of one.
@pytest.mark.parametrize("mode", ["mixed_padded", "time_tiles"])
@pytest.mark.parametrize("layout", ["dim_major", "time_major"])
def test_conv_partial_channel_group(queue, layout, mode):
    run_conv(queue, np.random.default_rng(9), "f32", 4, layout, "rolled", mode, dims=(1, 7, 16, 16))


# Exactly W-1 = 3 history columns, dim-major (vLLM's conv cache shape): the CPU variants move a
# 16-channel window as 48 contiguous values (conv1d.hpp load_window / store_window).
@pytest.mark.parametrize("mode", ["decode", "spec", "time_tiles"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_conv_dim_major_exact_window(queue, dtype, mode):
    run_conv(queue, np.random.default_rng(11), dtype, 4, "dim_major", "snapshot", mode, spare=0)


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
