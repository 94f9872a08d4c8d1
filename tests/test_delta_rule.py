"""gated delta rule kernels (recurrent decode, speculative decode, chunked prefill) against the
float64 reference recurrence. fp32 inputs: <= 2e-5 relative; f16/bf16 inputs: see RTOL_LOW."""
import numpy as np
import pytest

import pygdn
from pygdn.batch import make_batch, to_device
from pygdn import reference as ref
from conftest import assert_close, dequantize, quantize, ssm_from_canonical, ssm_to_canonical, usm

RTOL_F32 = 2e-5
RTOL_LOW = {"f16": 5e-3, "bf16": 3e-2}  # outputs rounded to the activation dtype


def written_slots(meta):
    """Slots a call may write: non-spec slots, spec slots of tokens t < L (when the read slot is valid)."""
    pad, out = meta.get("pad_slot_id", -1), set()
    for s in meta["non_spec_state_indices"] if meta.get("non_spec_state_indices") is not None else []:
        if s != pad:
            out.add(int(s))
    if meta.get("num_spec_decodes", 0):
        qsl, cols, acc = meta["spec_query_start_loc"], meta["spec_state_indices"], meta["num_accepted_tokens"]
        for n in range(meta["num_spec_decodes"]):
            if cols[n][acc[n] - 1] == pad:
                continue
            for t in range(qsl[n + 1] - qsl[n]):
                if cols[n][t] != pad:
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


@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
@pytest.mark.parametrize("gva", [(1, 1), (2, 4), (1, 3)])
def test_recurrent_decode(queue, ssm_layout, gva):
    rng = np.random.default_rng(10 + gva[1])
    meta = make_batch(rng, num_slots=32, num_decodes=6, pad_non_spec=2, pad_len=1, order="random")
    run_delta(queue, rng, meta, H=gva[0], HV=gva[1], ssm_layout=ssm_layout)


# (48, 20): on the CPU device the vk recurrent variant holds rows in blocks of 8; 20 rows end
# with a short block.
@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
@pytest.mark.parametrize("dims", [(128, 128), (64, 32), (32, 96), (256, 16), (48, 20), (5, 7)])
def test_head_dims(queue, dims, ssm_layout):
    K, V = dims
    rng = np.random.default_rng(K + V)
    meta = make_batch(rng, num_slots=16, num_decodes=2, prefill_lens=[70], spec_lens=[2], num_spec=1)
    run_delta(queue, rng, meta, H=1, HV=2, K=K, V=V, num_slots=16, ssm_layout=ssm_layout)


@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
@pytest.mark.parametrize("num_spec", [1, 2, 3])
def test_spec_decode_ragged(queue, num_spec, ssm_layout):
    """Ragged spec lengths 1..1+num_spec, every acceptance count, padded sequences."""
    rng = np.random.default_rng(20 + num_spec)
    cols = num_spec + 1
    lens = [cols, 1, max(1, cols - 1), cols, 2 if cols >= 2 else 1]
    accepted = [(i % cols) + 1 for i in range(len(lens))]
    meta = make_batch(rng, num_slots=48, spec_lens=lens, num_spec=num_spec, accepted=accepted, pad_spec=2,
                      pad_len=1, order="random")
    run_delta(queue, rng, meta, ssm_layout=ssm_layout, num_slots=48)


def test_spec_pad_read_slot_skips_sequence(queue):
    """A spec sequence whose initial slot is padding: zero outputs, nothing written."""
    rng = np.random.default_rng(3)
    meta = make_batch(rng, num_slots=16, spec_lens=[3, 3], num_spec=2, accepted=[2, 1], order="grouped")
    meta["spec_state_indices"][0, 1] = -1  # read slot of sequence 0 (accepted 2 -> column 1)
    got_o, *_ = run_delta(queue, rng, meta, num_slots=16)
    assert np.all(got_o[meta["spec_token_indx"][:3]] == 0)


PREFILL_LENS = [1, 63, 64, 65, 200, 1000]


@pytest.mark.parametrize("initial", ["none", "all", "mixed"])
def test_chunked_prefill_matches_recurrence(queue, initial):
    rng = np.random.default_rng(30)
    init = {"none": [0] * 6, "all": [1] * 6, "mixed": [1, 0, 1, 0, 1, 0]}[initial]
    meta = make_batch(rng, num_slots=12, prefill_lens=PREFILL_LENS, has_initial_state=init, order="blocks")
    chunk_o, chunk_s, want_o, want_s = run_delta(queue, np.random.default_rng(31), meta, num_slots=12)
    rec_o, rec_s, _, _ = run_delta(queue, np.random.default_rng(31), meta, num_slots=12, force_recurrent=True)
    assert_close(chunk_o, rec_o, RTOL_F32, "chunked vs recurrent kernel output")
    assert_close(chunk_s, rec_s, RTOL_F32, "chunked vs recurrent kernel state")


def test_chunked_prefill_qwen_head(queue):
    """K = V = 128 (the production head), GVA 2, interleaved with decodes and spec sequences."""
    rng = np.random.default_rng(40)
    meta = make_batch(rng, num_slots=20, prefill_lens=[130, 64], num_decodes=3, spec_lens=[3, 2], num_spec=2,
                      order="random")
    run_delta(queue, rng, meta, H=1, HV=2, K=128, V=128, num_slots=20)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_low_precision_inputs(queue, dtype):
    rng = np.random.default_rng(50)
    meta = make_batch(rng, num_slots=20, prefill_lens=[90], num_decodes=3, spec_lens=[3, 1], num_spec=2)
    run_delta(queue, rng, meta, dtype=dtype, num_slots=20)


@pytest.mark.parametrize("variant", ["g_beta", "no_l2norm", "l2_div"])
def test_gate_and_norm_variants(queue, variant):
    rng = np.random.default_rng(60)
    meta = make_batch(rng, num_slots=20, prefill_lens=[80], num_decodes=2, spec_lens=[2], num_spec=1)
    kw = {"g_beta": dict(gates="g_beta"), "no_l2norm": dict(l2norm=False), "l2_div": dict(l2_mode="div")}[variant]
    run_delta(queue, rng, meta, num_slots=20, **kw)
