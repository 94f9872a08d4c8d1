"""causal_conv1d against the float64 reference: every mode x dtype x width x state layout."""
import numpy as np
import pytest

import pygdn
from pygdn import reference as ref
from pygdn.batch import make_batch, to_device
from helpers import ACT_DTYPES, conv_from_canonical, conv_to_canonical, quantize, usm
from op_checks import CONV_DIMS, CONV_MODES, CONV_SLOTS, run_conv

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


# The CPU device's conv kernels give a work-item blocks of 16 channels: the spec kernel 8
# (GDN_CONV_BLOCKS), the non-spec kernel 64 (GDN_CONV_ROW_BLOCKS), in runs of 32 for other widths
# than 4. conv_dim 144 (H=1, K=16, HV=7, V=16) is nine blocks, a full spec group and a group of one;
# 1040 (HV=63) is 65, a full non-spec work-item and one block (two full runs and one at width 3).
@pytest.mark.parametrize("mode", ["mixed_padded", "time_tiles"])
@pytest.mark.parametrize("layout", ["dim_major", "time_major"])
@pytest.mark.parametrize("hv,width", [(7, 4), (63, 4), (63, 3)])
def test_conv_partial_channel_group(queue, layout, mode, hv, width):
    run_conv(queue, np.random.default_rng(9), "f32", width, layout, "rolled", mode, dims=(1, hv, 16, 16))


# f16 activations on a host with AVX-512: the CPU variants convert 16 lanes by one instruction each way
# (vec16.hpp, GDN_CPU_F16_INSN), the generic kernels by the scalar bit operations (dtype.hpp). The conv
# is exact per element, so both give the same bits: every f16 value (subnormals, infinities, NaNs
# with payloads) as 32 one-token sequences on zero states, times 1 (loaded and stored back) and times
# 0.7998 (products rounded to f16, to subnormals and zero too), and the windows they leave.
@pytest.mark.parametrize("scale", [1.0, 0.7998])
def test_f16_instructions_keep_the_scalar_bits(queue, monkeypatch, scale):
    h, hv, k, v = 2, 4, 256, 256  # conv_dim 2048: 32 rows of 2048 hold the 65536 patterns
    cfg = pygdn.Config(num_k_heads=h, num_v_heads=hv, head_k_dim=k, head_v_dim=v, num_slots=32, conv_width=4,
                       act_dtype="f16", conv_layout="time_major", no_silu=True)
    meta = make_batch(np.random.default_rng(0), num_slots=32, num_decodes=32, order="grouped", identity_indices=True)
    C = cfg.conv_dim
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(32, C)
    w = np.zeros((C, 4), np.float16)
    w[:, 3] = scale
    got = {}
    for generic in (False, True):
        monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1" if generic else "0")
        d_state, d_out = usm(queue, np.zeros((32, 3, C), np.float16)), usm(queue, np.zeros((32, C), np.float16))
        pygdn.causal_conv1d(queue, cfg, to_device(meta, queue), mixed_qkv=usm(queue, x), conv_weight=usm(queue, w),
                            conv_state=d_state, conv_out=d_out)
        got[generic] = [d_out.to_numpy().view(np.uint16), d_state.to_numpy().view(np.uint16)]
    for name, cpu, generic in zip(("conv_out", "conv_state"), got[False], got[True]):
        assert np.array_equal(cpu, generic), f"{name}: {np.count_nonzero(cpu != generic)} values differ"
    bits, newest = x.view(np.uint16), got[False][1][meta["non_spec_state_indices"], 2]  # each sequence's window
    assert np.array_equal(newest, np.where(np.isnan(x), (bits & 0x8000) | 0x7e00, bits))  # its input, NaN as 0x7e00


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


# The conv state holds its inputs as they came (conv1d.hpp's window stores, store_act_exact): bf16
# patterns a rounding store would change -- NaNs with payloads, signaling NaNs -- come back bit
# for bit. Where each input lands is the reference's answer on unique values (ids) in their place.
NAN_BITS = np.array([0x7F81, 0xFF81, 0x7FC1, 0x7FFF, 0xFFFF, 0x7FA5], np.uint16)


def _input_bits(rng, shape):
    bits = quantize(rng.standard_normal(shape), "bf16")[0]
    flat = bits.reshape(-1)
    flat[rng.choice(flat.size, size=flat.size // 4, replace=False)] = rng.choice(NAN_BITS, size=flat.size // 4)
    return bits


def _expected_state_bits(meta, x_bits, st_bits, spec_layout):
    """The conv state after the step, as bits: the reference on ids (x: 1.., state: -1..)."""
    T, C = x_bits.shape
    x_ids = np.arange(1, x_bits.size + 1, dtype=np.float64).reshape(x_bits.shape)
    st_ids = -np.arange(1, st_bits.size + 1, dtype=np.float64).reshape(st_bits.shape)
    _, ids = ref.causal_conv1d(x_ids, np.zeros((C, 4)), None, st_ids, meta, spec_layout=spec_layout, silu=True)
    ids = ids.astype(np.int64)
    table = np.concatenate([st_bits.reshape(-1)[::-1], [0], x_bits.reshape(-1)])  # index id + st_bits.size
    return table[ids + st_bits.size].astype(np.uint16)


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("layout,spec_layout", [("time_major", "rolled"), ("dim_major", "snapshot")])
def test_conv_state_keeps_input_bits(queue, monkeypatch, generic, layout, spec_layout):
    if generic:
        monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1")
    rng = np.random.default_rng(13)
    meta = make_batch(rng, num_slots=CONV_SLOTS, **CONV_MODES["mixed_padded"])
    state_len = 3 + (meta["num_spec"] if spec_layout == "rolled" else 0)
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=CONV_SLOTS, conv_width=4,
                       act_dtype="bf16", conv_layout=layout, conv_spec_layout=spec_layout, conv_state_len=state_len)
    C, T = cfg.conv_dim, meta["num_actual_tokens"]
    x_bits, st_bits = _input_bits(rng, (T, C)), _input_bits(rng, (CONV_SLOTS, C, state_len))
    d_state = usm(queue, conv_from_canonical(st_bits, layout))
    pygdn.causal_conv1d(queue, cfg, to_device(meta, queue), mixed_qkv=usm(queue, x_bits),
                        conv_weight=usm(queue, quantize(rng.standard_normal((C, 4)), "bf16")[0]), conv_state=d_state,
                        conv_out=usm(queue, np.zeros((T, C), np.uint16)))
    got = conv_to_canonical(d_state.to_numpy(), layout)
    assert np.array_equal(got, _expected_state_bits(meta, x_bits, st_bits, spec_layout))


# The same through gdn_attention on a step without prefills: on the CPU device its conv runs inside
# the fused launch (gdn_fused_cpu; K = 16 and whole 16-channel v blocks per k-head let it fuse).
@pytest.mark.parametrize("generic", [False, True])
def test_attention_conv_state_keeps_input_bits(queue, monkeypatch, generic):
    if generic:
        monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1")
    rng = np.random.default_rng(14)
    h, hv, k, v, slots = 1, 2, 16, 16, 8
    meta = make_batch(rng, num_slots=slots, num_decodes=3, spec_lens=[2, 1], num_spec=1, order="random")
    cfg = pygdn.Config(num_k_heads=h, num_v_heads=hv, head_k_dim=k, head_v_dim=v, num_slots=slots, conv_width=4,
                       act_dtype="bf16", conv_layout="time_major", conv_spec_layout="snapshot", conv_state_len=3)
    C, T = cfg.conv_dim, meta["num_actual_tokens"]
    x_bits, st_bits = _input_bits(rng, (T, C)), _input_bits(rng, (slots, C, 3))
    d_state = usm(queue, conv_from_canonical(st_bits, "time_major"))
    bf = lambda *shape: usm(queue, quantize(rng.standard_normal(shape), "bf16")[0])  # noqa: E731
    pygdn.attention(queue, cfg, to_device(meta, queue), mixed_qkv=usm(queue, x_bits), a=bf(T, hv), b=bf(T, hv),
                    conv_weight=bf(C, 4), A_log=usm(queue, np.zeros(hv, np.float32)),
                    dt_bias=usm(queue, np.zeros(hv, np.float32)), conv_state=d_state,
                    ssm_state=usm(queue, np.zeros(cfg.ssm_state_shape, np.float32)),
                    core_attn_out=usm(queue, np.zeros((T, hv, v), np.uint16)))
    got = conv_to_canonical(d_state.to_numpy(), "time_major")
    assert np.array_equal(got, _expected_state_bits(meta, x_bits, st_bits, "snapshot"))
