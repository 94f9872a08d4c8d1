"""Engine-native state caches (include/gdn_xpu.h "State caches"): bf16/f16 SSM states,
read slots apart from write slots, block checkpoints during a prefill -- against the float64
reference (pygdn/reference.py), which rounds a stored state exactly where docs/op.md "State dtype"
says.

Tolerances, and why. Outputs: a call computes in f32 from the states as they are stored and
rounds only what it stores, so its outputs stay within the f32 bound of the delta-rule tests
(2e-5 of the largest output) of the rounding reference, whatever the state dtype. Stored states:
the kernel rounds its f32 state, the reference its exact state; both round to the same value
unless they straddle a rounding midpoint, so every element is within one unit in the last place
(ulp) of the state dtype (plus the f32 bound), and at most 1% of the elements may differ at all
(here the f32 error is ~1e-6 relative against ulps of 2^-8 and 2^-11). Rounding at any other point
(per chunk, per token) moves most elements by one or more ulps and fails that count.

Kernel builds: every test uses K = 16, V = 16 (two tests V = 64 and 128, a run-time size) and f32 activations, the shapes of test_delta_rule.py
and test_attention.py, so the f32-state kernels are shared with those files. bf16 and f16 states add
the recurrent and chunk builds of the CPU variants per ssm layout (8) and, for the generic kernels,
of (kv, bf16) and (vk, f16) (4): 12 builds, ~19 s of cold compile on the 2-core test host.
test_bf16_instructions_store_the_bit_operations_bits uses K = 32 (rows of several vectors in both
layouts), built with and without GDN_XPU_SOFT_BF16 (on a host with AVX512-BF16: ~13 builds more,
~21 s of cold compile); test_bf16_instructions_store_one_vector_as_the_bit_operations K = V = 16
with bf16 activations and states, both ways (~20 s more); test_bf16_store_flushes_denormal_states_both_ways
K = V = 32, the delta rule alone with g and beta given, both ways.
"""
import sys

import numpy as np
import pytest

import pygdn
from pygdn import reference as ref
from pygdn.batch import make_batch, to_device
from helpers import (assert_close, conv_from_canonical, conv_to_canonical, dequantize, quantize, ssm_from_canonical,
                      ssm_to_canonical, usm)

H, HV, K, V, W = 1, 2, 16, 16, 4
RTOL_OUT = 2e-5
STATE_DTYPES = ["f32", "bf16", "f16"]
PAD = -1


def ulp(x, dtype):
    bits, emin, _ = ref._FORMATS[dtype]
    _, e = np.frexp(np.asarray(x, np.float64))
    return np.ldexp(1.0, np.maximum(e, emin) - bits)


def assert_state_close(got, want, dtype, what):
    """Stored states: within one ulp of the state dtype (+ the f32 bound); bf16/f16: <= 1% differ."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.all(np.isfinite(got)), f"{what}: non-finite values"
    if not want.size:
        return
    allowed = RTOL_OUT * max(np.abs(want).max(), 1e-6) + (ulp(want, dtype) if dtype != "f32" else 0.0)
    excess = np.abs(got - want) - allowed
    assert excess.max() <= 0, f"{what}: {(excess > 0).sum()} elements beyond one {dtype} ulp (worst by {excess.max():.3g})"
    if dtype != "f32":
        differ = np.mean(got != want)
        assert differ <= 0.01, f"{what}: {differ:.1%} of the elements differ from the reference's rounding"


class Layer:
    """Weights and caches of one GDN layer on the device; `conv` / `ssm` are the float64 caches the
    reference starts its next call from (stored SSM states are rounded to the state dtype)."""

    def __init__(self, queue, rng, cfg):
        self.queue, self.cfg = queue, cfg
        C, S = cfg.conv_dim, cfg.num_slots
        self.w = (rng.standard_normal((C, W)) * 0.5).astype(np.float32)
        self.bias = (rng.standard_normal(C) * 0.1).astype(np.float32)
        self.A_log = np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32)
        self.dt_bias = rng.uniform(-1, 1, HV).astype(np.float32)
        conv_s, self.conv = quantize(rng.standard_normal((S, C, cfg.state_len)), "f32")
        ssm_s, self.ssm = quantize(rng.standard_normal((S, HV, K, V)) * 0.5, cfg.state_dtype)
        self.d_conv = usm(queue, conv_from_canonical(conv_s, cfg.conv_layout))
        self.d_ssm = usm(queue, ssm_from_canonical(ssm_s, cfg.ssm_layout))
        self.d = dict(conv_weight=usm(queue, self.w), conv_bias=usm(queue, self.bias), A_log=usm(queue, self.A_log),
                      dt_bias=usm(queue, self.dt_bias))

    def device_conv(self):
        return conv_to_canonical(self.d_conv.to_numpy(), self.cfg.conv_layout).astype(np.float64)

    def device_ssm(self):
        return dequantize(ssm_to_canonical(self.d_ssm.to_numpy(), self.cfg.ssm_layout), self.cfg.state_dtype)

    def run(self, meta, x, a, b, op="attention"):
        """One library call; returns the outputs of its rows (the canary row past them is checked)."""
        q, cfg, T = self.queue, self.cfg, meta["num_actual_tokens"]
        d_out = usm(q, np.full((T + 1, HV, V), 5.0, np.float32))
        x, a, b = (usm(q, np.asarray(v, np.float32)) for v in (x, a, b))
        batch = to_device(meta, q)
        if op == "attention":
            pygdn.attention(q, cfg, batch, mixed_qkv=x, a=a, b=b, conv_state=self.d_conv, ssm_state=self.d_ssm,
                            core_attn_out=d_out, **self.d)
        else:  # the delta rule alone, x taken as the conv output (q|k|v rows)
            pygdn.gated_delta_rule(q, cfg, batch, conv_out=x, a=a, b=b, A_log=self.d["A_log"], dt_bias=self.d["dt_bias"],
                                   ssm_state=self.d_ssm, core_attn_out=d_out)
        out = d_out.to_numpy().astype(np.float64)
        assert np.all(out[T] == 5.0), "canary row past num_actual_tokens was written"
        return out[:T]

    def reference(self, meta, x, a, b, op="attention", conv=None, ssm=None):
        """(out, conv, ssm) of the reference from the given caches (default: the carried ones)."""
        conv = self.conv if conv is None else conv
        ssm = self.ssm if ssm is None else ssm
        x, a, b = (np.asarray(v, np.float32).astype(np.float64) for v in (x, a, b))
        if op == "attention":
            return ref.gdn_attention(x, a, b, self.w, self.bias, self.A_log, self.dt_bias, conv, ssm, meta, H, HV, K, V,
                                     spec_layout=self.cfg.conv_spec_layout, state_dtype=self.cfg.state_dtype)
        g, beta = ref.gates(a, b, self.A_log, self.dt_bias)
        o, s = ref.gated_delta_rule(x, g, beta, ssm, meta, H, HV, K, V, state_dtype=self.cfg.state_dtype)
        return o, conv, s

    def step(self, meta, x, a, b, op="attention"):
        """Runs the call on the device and in the reference, both from the caches as the device
        stored them (so a one-ulp difference of an earlier stored state cannot leak into this
        call's check), checks outputs, stored states and canaries (every slot the reference leaves
        as it was is bit-identical on the device). Returns the outputs."""
        before_conv, before_ssm = self.d_conv.to_numpy(), self.d_ssm.to_numpy()
        self.conv, self.ssm = self.device_conv(), self.device_ssm()
        got = self.run(meta, x, a, b, op)
        want_o, want_conv, want_ssm = self.reference(meta, x, a, b, op)
        assert_close(got, want_o, RTOL_OUT, "core_attn_out")
        dtype = self.cfg.state_dtype
        got_ssm, got_conv = self.device_ssm(), self.device_conv()
        for s in range(self.cfg.num_slots):
            if np.array_equal(want_ssm[s], self.ssm[s]):
                assert np.array_equal(self.d_ssm.to_numpy()[s], before_ssm[s]), f"ssm slot {s} not written but changed"
            else:
                assert_state_close(got_ssm[s], want_ssm[s], dtype, f"ssm_state[{s}]")
        if op == "attention":
            assert np.array_equal(got_conv, want_conv), "conv_state (raw inputs: exact)"
        else:
            assert np.array_equal(self.d_conv.to_numpy(), before_conv), "the delta rule touched conv_state"
        self.conv, self.ssm = want_conv, want_ssm
        return got


def config(num_slots, state_dtype="f32", ssm_layout="vk", conv_spec_layout="rolled", num_spec=2,
           conv_layout="time_major", **kw):
    """conv_layout "dim_major": exactly W-1 history columns (vLLM's shape; snapshot spec layout)."""
    state_len = W - 1 if conv_layout == "dim_major" else W - 1 + num_spec
    return pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=num_slots, conv_width=W,
                        act_dtype="f32", state_dtype=state_dtype, ssm_layout=ssm_layout, conv_layout=conv_layout,
                        conv_spec_layout=conv_spec_layout, conv_state_len=state_len, **kw)


def tokens(rng, n, C):
    return (rng.standard_normal((n, C)).astype(np.float32), rng.standard_normal((n, HV)).astype(np.float32),
            rng.standard_normal((n, HV)).astype(np.float32))


# ----------------------------------------------------------------------------- every path x state dtype x layout
@pytest.mark.parametrize("path", ["delta", "delta_recurrent", "attention"])
@pytest.mark.parametrize("ssm_layout", ["kv", "vk"])
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_every_path(queue, state_dtype, ssm_layout, path):
    """One mixed batch holds every path: chunked prefills (70, 130 tokens; with FORCE_RECURRENT the
    token recurrence), a 1-token prefill, plain decodes, ragged spec sequences with every acceptance
    count (per-token write-back), graph padding; the delta rule alone and inside gdn_attention."""
    rng = np.random.default_rng(150 + 10 * STATE_DTYPES.index(state_dtype) + (ssm_layout == "vk"))
    num_slots = 40
    meta = make_batch(rng, num_slots=num_slots, prefill_lens=[70, 130, 1], num_decodes=3, spec_lens=[3, 1, 2, 3],
                      num_spec=2, accepted=[1, 2, 3, 2], order="random", pad_non_spec=1, pad_spec=1, pad_len=1)
    cfg = config(num_slots, state_dtype, ssm_layout, force_recurrent=path == "delta_recurrent")
    layer = Layer(queue, rng, cfg)
    x, a, b = tokens(rng, meta["num_actual_tokens"], cfg.conv_dim)
    layer.step(meta, x, a, b, op="attention" if path == "attention" else "delta")


# The CPU device's kv-layout recurrent kernel gives a work-item whole rows when V = 128 (8 column
# vectors; several tokens are walked 4 vectors at a time, twice), 4 vectors when V % 64 == 0 and
# one otherwise (params.hpp gdn_kv_cpu_vecs): V = 64 and 128 run the wide forms on every state dtype.
@pytest.mark.parametrize("path", ["delta", "delta_recurrent"])
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("v", [64, 128])
def test_every_path_wide_kv_rows(queue, monkeypatch, v, state_dtype, path):
    monkeypatch.setattr(sys.modules[__name__], "V", v)
    test_every_path(queue, state_dtype, "kv", path)


# ----------------------------------------------------------------------------- prefix caching
PROMPT, EVERY = 1100, 256


def prefill_meta(n, write, read=None, start=0, has_init=True, interval=0, ckpt=None):
    m = dict(num_prefills=1, num_actual_tokens=n, non_spec_token_count=n,
             non_spec_query_start_loc=np.array([0, n], np.int32), non_spec_state_indices=np.array([write], np.int32),
             has_initial_state=np.array([has_init], np.uint8), non_spec_start_pos=np.array([start], np.int32))
    if read is not None:
        m["non_spec_read_state_indices"] = np.array([read], np.int32)
    if interval:
        m.update(checkpoint_interval=interval, checkpoint_cols=len(ckpt), checkpoint_state_indices=np.array(ckpt, np.int32))
    return m


# ("kv", "snapshot", "f32") keeps its conv history dim-major in exactly W-1 columns: the CPU conv
# moves those windows as 48 contiguous values (conv1d.hpp load_window / store_window).
@pytest.mark.parametrize("ssm_layout,conv_spec_layout,state_dtype",
                         [("vk", "rolled", "f32"), ("kv", "snapshot", "f32"), ("vk", "snapshot", "bf16"),
                          ("kv", "rolled", "f16")])
def test_prefix_caching_resume_from_every_checkpoint(queue, ssm_layout, conv_spec_layout, state_dtype):
    """A 1100-token prompt prefilled in one call with a checkpoint every 256 tokens (slots 1..4; the
    fifth column, slot 5, is never reached and stays untouched). Then, for each checkpoint, one
    call resumes it three ways at once, all reading the checkpoint slot: a prefill of the rest of
    the prompt (storing its own checkpoints), a decode of the next token and a spec sequence over
    the next 3 tokens. Each equals the unbroken run: outputs, final state, later checkpoints, conv
    history (f32 states: within the f32 bound; bf16/f16: the resumed run starts from a rounded
    checkpoint, so it is held to the rounding reference tightly and to the unbroken run loosely).
    Finally a request already holding 100 tokens (not a multiple of 64) prefills 500 more with
    checkpoints: they land at positions 256 and 512 like the unbroken run's."""
    rng = np.random.default_rng(160)
    exact = (ssm_layout, conv_spec_layout, state_dtype) == ("kv", "snapshot", "f32")
    cfg = config(32, state_dtype, ssm_layout, conv_spec_layout, conv_layout="dim_major" if exact else "time_major")
    layer = Layer(queue, rng, cfg)
    x, a, b = tokens(rng, PROMPT, cfg.conv_dim)
    ck_slots = [1, 2, 3, 4, 5]
    out = layer.step(prefill_meta(PROMPT, 0, has_init=False, interval=EVERY, ckpt=ck_slots), x, a, b)
    unbroken_conv, unbroken_ssm = layer.device_conv(), layer.device_ssm()
    loose = {"f32": RTOL_OUT, "bf16": 2e-2, "f16": 3e-3}[state_dtype]  # vs the unbroken run
    for k in range(PROMPT // EVERY):
        pos, ck = EVERY * (k + 1), ck_slots[k]
        rest, L = PROMPT - pos, 3
        rows = rng.permutation(rest + 1 + L).astype(np.int32)  # interleave the three continuations
        src = np.concatenate([np.arange(pos, PROMPT), [pos], np.arange(pos, pos + L)])  # prompt token of each
        X, A, B = (np.zeros((len(rows),) + v.shape[1:], np.float32) for v in (x, a, b))
        X[rows], A[rows], B[rows] = x[src], a[src], b[src]
        later = [11, 12, 13, PAD]  # the prefill continuation's own checkpoints
        meta = dict(num_prefills=1, num_decodes=1, num_spec_decodes=1, num_spec=2, num_actual_tokens=len(rows),
                    non_spec_token_count=rest + 1, spec_token_count=L,
                    non_spec_query_start_loc=np.array([0, rest, rest + 1], np.int32),
                    non_spec_state_indices=np.array([10, 20], np.int32), non_spec_read_state_indices=np.array([ck, ck], np.int32),
                    non_spec_start_pos=np.array([pos, pos], np.int32), has_initial_state=np.array([1, 1], np.uint8),
                    non_spec_token_indx=rows[:rest + 1].copy(), checkpoint_interval=EVERY, checkpoint_cols=4,
                    checkpoint_state_indices=np.array([later, [PAD] * 4], np.int32),
                    spec_query_start_loc=np.array([0, L], np.int32), spec_state_indices=np.array([[21, 22, 23]], np.int32),
                    num_accepted_tokens=np.array([1], np.int32), spec_read_state_indices=np.array([ck], np.int32),
                    spec_token_indx=rows[rest + 1:].copy())
        got = layer.step(meta, X, A, B)
        ssm, conv = layer.device_ssm(), layer.device_conv()
        what = f"resumed from checkpoint {k} (position {pos})"
        assert_close(got[rows[:rest]], out[pos:], loose, f"{what}: prefill outputs vs the unbroken run")
        assert_close(got[rows[rest]], out[pos], loose, f"{what}: decode output vs the unbroken run")
        assert_close(got[rows[rest + 1:]], out[pos:pos + L], loose, f"{what}: spec outputs vs the unbroken run")
        assert_close(ssm[10], unbroken_ssm[0], max(loose, 1e-2) if state_dtype != "f32" else RTOL_OUT,
                     f"{what}: final state vs the unbroken run")
        assert np.array_equal(conv[10][:, :W - 1], unbroken_conv[0][:, :W - 1]), f"{what}: final conv history"
        for kk, slot in enumerate(later[:PROMPT // EVERY - k - 1]):
            assert_close(ssm[slot], unbroken_ssm[ck_slots[k + 1 + kk]], max(loose, 1e-2) if state_dtype != "f32"
                         else RTOL_OUT, f"{what}: its checkpoint {kk} vs the unbroken run's")
            assert np.array_equal(conv[slot][:, :W - 1], unbroken_conv[ck_slots[k + 1 + kk]][:, :W - 1])
    assert np.array_equal(layer.device_ssm()[5], unbroken_ssm[5]) and np.array_equal(layer.device_conv()[5],
                                                                                       unbroken_conv[5])

    # A request holding 100 tokens (slot 25) prefills tokens 100..599 with checkpoints (slots 27, 28).
    layer.step(prefill_meta(100, 25, has_init=False), x[:100], a[:100], b[:100])
    got = layer.step(prefill_meta(500, 26, read=25, start=100, interval=EVERY, ckpt=[27, 28]), x[100:600], a[100:600],
                     b[100:600])
    ssm, conv = layer.device_ssm(), layer.device_conv()
    assert_close(got, out[100:600], loose, "unaligned start: outputs vs the unbroken run")
    for slot, unbroken in ((27, 1), (28, 2)):
        assert_close(ssm[slot], unbroken_ssm[unbroken], max(loose, 1e-2) if state_dtype != "f32" else RTOL_OUT,
                     f"unaligned start: checkpoint slot {slot} vs the unbroken run's")
        assert np.array_equal(conv[slot][:, :W - 1], unbroken_conv[unbroken][:, :W - 1])


# ----------------------------------------------------------------------------- read slots
@pytest.mark.parametrize("conv_spec_layout", ["rolled", "snapshot"])
def test_read_slot_shared_by_four_sequences(queue, conv_spec_layout):
    """Two prefills (70 and 5 tokens), a decode and a spec sequence all start from slot 7 and write
    elsewhere; slot 7 is left as it was. Beside them: a decode reading the prefill's write slot with
    has_initial_state = 0 (nothing is read: allowed, starts from zeros), a decode whose read slot is
    padding (starts from zeros), and a decode reading and writing its own slot."""
    rng = np.random.default_rng(170)
    cfg = config(16, conv_spec_layout=conv_spec_layout)
    layer = Layer(queue, rng, cfg)
    lens = [70, 5, 1, 1, 1, 1]
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T_ns, L = int(qsl[-1]), 3
    rows = rng.permutation(T_ns + L).astype(np.int32)
    meta = dict(num_prefills=2, num_decodes=4, num_spec_decodes=1, num_spec=2, num_actual_tokens=T_ns + L,
                non_spec_token_count=T_ns, spec_token_count=L, non_spec_query_start_loc=qsl,
                non_spec_state_indices=np.array([1, 2, 3, 8, 9, 10], np.int32),
                non_spec_read_state_indices=np.array([7, 7, 7, 1, PAD, 10], np.int32),
                has_initial_state=np.array([1, 1, 1, 0, 1, 1], np.uint8), non_spec_token_indx=rows[:T_ns].copy(),
                spec_query_start_loc=np.array([0, L], np.int32), spec_state_indices=np.array([[4, 5, 6]], np.int32),
                num_accepted_tokens=np.array([2], np.int32), spec_read_state_indices=np.array([7], np.int32),
                spec_token_indx=rows[T_ns:].copy())
    x, a, b = tokens(rng, T_ns + L, cfg.conv_dim)
    before = layer.d_ssm.to_numpy()[7].copy(), layer.d_conv.to_numpy()[7].copy()
    layer.step(meta, x, a, b)
    assert np.array_equal(layer.d_ssm.to_numpy()[7], before[0]) and np.array_equal(layer.d_conv.to_numpy()[7], before[1])


# ----------------------------------------------------------------------------- MTP with a bf16 state
@pytest.mark.parametrize("ssm_layout", ["vk", "kv"])
def test_mtp_simulation_bf16_state(queue, ssm_layout):
    """Prefill 3 requests and a decode request, then 8 speculative steps with ragged drafts and random
    acceptance, a bf16 SSM cache throughout. Each step is held (1) to the reference run from the
    caches the device holds before the step (the tolerances above), and (2) to the reference that
    carries its own rounded caches from the start, with the step's stored states rounded at the
    same points (outputs 1e-3, states 2 bf16 ulps: earlier one-ulp differences it read may move a
    state once more)."""
    rng = np.random.default_rng(180)
    reqs, S = 3, 2
    cols = S + 1
    cfg = config(reqs * cols + 1, "bf16", ssm_layout, "rolled", num_spec=S)
    layer = Layer(queue, rng, cfg)
    own_conv, own_ssm = layer.conv.copy(), layer.ssm.copy()  # the independent reference's caches
    C = cfg.conv_dim
    blocks = rng.permutation(reqs * cols).reshape(reqs, cols).astype(np.int32)
    dec = reqs * cols

    def both(meta, x, a, b):
        nonlocal own_conv, own_ssm
        got = layer.step(meta, x, a, b)  # (1) from what the device stored
        o2, own_conv, own_ssm = layer.reference(meta, x, a, b, conv=own_conv, ssm=own_ssm)
        assert_close(got, o2, 1e-3, "outputs vs the independent rounding reference")
        ssm = layer.device_ssm()
        assert np.all(np.abs(ssm - own_ssm) <= 2 * ulp(own_ssm, "bf16") + RTOL_OUT * np.abs(own_ssm).max())
        return got

    lens = [70, 5, 130, 3]
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    x, a, b = tokens(rng, int(qsl[-1]), C)
    both(dict(num_prefills=4, num_actual_tokens=int(qsl[-1]), non_spec_token_count=int(qsl[-1]),
              non_spec_query_start_loc=qsl, non_spec_state_indices=np.array(list(blocks[:, 0]) + [dec], np.int32),
              has_initial_state=np.zeros(4, np.uint8)), x, a, b)
    accepted = np.ones(reqs, np.int32)
    for step in range(8):
        L = rng.integers(1, cols + 1, reqs)
        T = int(L.sum()) + 1
        rows = rng.permutation(T).astype(np.int32)
        x, a, b = tokens(rng, T, C)
        meta = dict(num_decodes=1, num_spec_decodes=reqs, num_spec=S, num_actual_tokens=T, non_spec_token_count=1,
                    spec_token_count=T - 1, non_spec_query_start_loc=np.array([0, 1], np.int32),
                    non_spec_state_indices=np.array([dec], np.int32), non_spec_token_indx=rows[-1:].copy(),
                    spec_query_start_loc=np.concatenate([[0], np.cumsum(L)]).astype(np.int32),
                    spec_state_indices=blocks, num_accepted_tokens=accepted, spec_token_indx=rows[:-1].copy())
        both(meta, x, a, b)
        accepted = np.array([rng.integers(1, int(n) + 1) for n in L], np.int32)


# ----------------------------------------------------------------------------- everything at once, both kernel sets
@pytest.mark.parametrize("kernels,ssm_layout,state_dtype",
                         [("cpu", "kv", "bf16"), ("cpu", "vk", "f16"), ("generic", "kv", "bf16"), ("generic", "vk", "f16")])
def test_state_caches_in_one_mixed_batch(queue, monkeypatch, kernels, ssm_layout, state_dtype):
    """One call with every feature at once, on the CPU device's kernel variants and on the generic
    kernels Intel GPUs run (GDN_XPU_GENERIC_KERNELS=1; non-spec conv tiles of 16 tokens there):
    a 300-token prefill of a request holding 100 tokens (not a multiple of 64) reading slot 1 and
    storing a checkpoint every 64 tokens (5 boundaries, the third not stored), a 70-token prefill
    from position 0 with one checkpoint and has_initial_state = 0, a decode whose token completes
    a block (its checkpoint is its own write slot), a decode reading slot 1 too, a decode in place
    whose token completes a block stored to another slot (the CPU kernels store in place with
    plain stores, elsewhere streaming), a padded decode, and spec sequences: one reading slot 1
    explicitly, one reading its own second write slot."""
    if kernels == "generic":
        monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1")
    rng = np.random.default_rng(190)
    cfg = config(40, state_dtype, ssm_layout, "rolled")
    layer = Layer(queue, rng, cfg)
    lens = [300, 70, 1, 1, 1, 1]
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T_ns, s_lens = int(qsl[-1]), [3, 2]
    T = T_ns + sum(s_lens)
    rows = rng.permutation(T).astype(np.int32)
    ckpt = np.full((6, 5), PAD, np.int32)
    ckpt[0] = [10, 11, PAD, 12, 13]
    ckpt[1, 0] = 14
    ckpt[2, 0] = 4  # the decode's own write slot: its boundary is its last token
    ckpt[4, 0] = 15  # the in-place decode's boundary
    meta = dict(num_prefills=2, num_decodes=4, num_spec_decodes=2, num_spec=2, num_actual_tokens=T,
                non_spec_token_count=T_ns, spec_token_count=T - T_ns, non_spec_query_start_loc=qsl,
                non_spec_state_indices=np.array([2, 3, 4, 5, 6, PAD], np.int32),
                non_spec_read_state_indices=np.array([1, 3, 4, 1, 6, PAD], np.int32),
                non_spec_start_pos=np.array([100, 0, 127, 9, 191, 0], np.int32),
                has_initial_state=np.array([1, 0, 1, 1, 1, 1], np.uint8), non_spec_token_indx=rows[:T_ns].copy(),
                checkpoint_interval=64, checkpoint_cols=5, checkpoint_state_indices=ckpt,
                spec_query_start_loc=np.array([0, 3, 5], np.int32),
                spec_state_indices=np.array([[20, 21, 22], [23, 24, 25]], np.int32),
                num_accepted_tokens=np.array([2, 2], np.int32), spec_read_state_indices=np.array([1, 24], np.int32),
                spec_token_indx=rows[T_ns:].copy())
    x, a, b = tokens(rng, T, cfg.conv_dim)
    layer.step(meta, x, a, b)


def test_state_caches_in_one_mixed_batch_kv_whole_rows(queue, monkeypatch):
    """The same batch with V = 128 in the kv layout: the CPU kernel's whole-row work-items, the
    spec and prefill walks in two halves, each storing its own checkpoints."""
    monkeypatch.setattr(sys.modules[__name__], "V", 128)
    test_state_caches_in_one_mixed_batch(queue, monkeypatch, "cpu", "kv", "f32")


# The CPU kernels walk up to GDN_WALK_TOKENS = 8 tokens in another form than longer walks (vk f32:
# row by row, walk_rows_vk_by_row, against 16 rows at a time; kv: the WY form, walk_columns_kv_wy,
# against the held block): the 7- and 5-token prefills take the first, the 9-token one the second.
# A non-spec sequence of several tokens takes the recurrence only when forced (or when the chunk
# tables overflow).
@pytest.mark.parametrize("ssm_layout", ["vk", "kv"])
@pytest.mark.parametrize("v", [16, 20])
def test_short_recurrent_prefills_store_checkpoints(queue, monkeypatch, ssm_layout, v):
    """Forced-recurrent prefills of 7, 5 and 9 tokens whose block boundary falls inside them (after
    their 3rd, 4th and 6th token), one reading another slot, one with no initial state, beside a
    decode; V = 20 gives the vk kernel a last pass of 4 rows. Outputs, final states, checkpoints
    and untouched slots against the reference, on the delta rule alone and inside the whole op."""
    monkeypatch.setattr(sys.modules[__name__], "V", v)
    rng = np.random.default_rng(170 + v + (ssm_layout == "vk"))
    cfg = config(24, "f32", ssm_layout, force_recurrent=True)
    layer = Layer(queue, rng, cfg)
    lens = [7, 5, 9, 1]
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T = int(qsl[-1])
    ckpt = np.full((4, 2), PAD, np.int32)
    ckpt[0, 0], ckpt[1, 0], ckpt[2, 0] = 10, 11, 12
    meta = dict(num_prefills=3, num_decodes=1, num_actual_tokens=T, non_spec_token_count=T,
                non_spec_query_start_loc=qsl, non_spec_state_indices=np.array([2, 3, 4, 5], np.int32),
                non_spec_read_state_indices=np.array([2, 1, 4, 5], np.int32),
                non_spec_start_pos=np.array([61, 60, 58, 9], np.int32),
                has_initial_state=np.array([1, 1, 0, 1], np.uint8),
                non_spec_token_indx=rng.permutation(T).astype(np.int32),
                checkpoint_interval=64, checkpoint_cols=2, checkpoint_state_indices=ckpt)
    for op in ("delta", "attention"):
        x, a, b = tokens(rng, T, cfg.conv_dim)
        layer.step(meta, x, a, b, op=op)


# ----------------------------------------------------------------------------- widening and rounding, bit for bit
@pytest.mark.parametrize("path", ["decode", "prefill"])
@pytest.mark.parametrize("state_dtype", ["bf16", "f16"])
def test_state_load_store_round_trip_every_value(queue, state_dtype, path):
    """With g = 0 and beta = 0 a token leaves the state as it is (S = e^0 S, u = 0), so a call stores
    exactly what it loaded: every finite value of the state dtype survives the widening load and
    the rounding store bit for bit, through the recurrent kernel (decodes) and the chunk scan (2-token
    prefills). Left out: -0 (the update's S + k*0 makes it +0), bf16 values below 2^-126 (the CPU
    device flushes f32 denormals) and above 2^100 (S^T k overflows, and beta*inf is NaN)."""
    rng = np.random.default_rng(200)
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    vals = pygdn.from_bf16_bits(bits) if state_dtype == "bf16" else bits.view(np.float16).astype(np.float32)
    keep = (np.abs(vals) <= 2.0 ** 100) & (bits != 0x8000) & \
        ((np.abs(vals) >= 2.0 ** -126) | (bits == 0) | (state_dtype == "f16"))
    per_slot = HV * K * V
    stored = bits[keep]
    n = -(-stored.size // per_slot)
    stored = np.concatenate([stored, np.zeros(n * per_slot - stored.size, np.uint16)]).reshape(n, HV, V, K)
    cfg = config(n, state_dtype, "vk")
    L = 1 if path == "decode" else 2
    meta = make_batch(rng, num_slots=n, **({"num_decodes": n} if path == "decode" else {"prefill_lens": [L] * n}),
                      has_initial_state=[1] * n, order="random")
    T = meta["num_actual_tokens"]
    d_ssm = usm(queue, stored if state_dtype == "bf16" else stored.view(np.float16))
    x = rng.standard_normal((T, cfg.conv_dim)).astype(np.float32)
    zeros = usm(queue, np.zeros((T, HV), np.float32))
    pygdn.gated_delta_rule(queue, cfg, to_device(meta, queue), conv_out=usm(queue, x), ssm_state=d_ssm,
                           core_attn_out=usm(queue, np.zeros((T, HV, V), np.float32)), g=zeros, beta=zeros)
    got = d_ssm.to_numpy().view(np.uint16)
    bad = np.flatnonzero(got != stored)
    assert not bad.size, (f"{bad.size} stored states are not the loaded ones, e.g. "
                          + ", ".join(f"{stored.flat[i]:#06x} -> {got.flat[i]:#06x}" for i in bad[:8]))


def both_roundings(monkeypatch, run):
    """run() with GDN_XPU_SOFT_BF16=1 (the bit operations), then =0 (AVX512-BF16's instructions
    where the host has them; else the bit operations again): {"1": its result, "0": its result}."""
    got = {}
    for soft in ("1", "0"):
        monkeypatch.setenv("GDN_XPU_SOFT_BF16", soft)
        got[soft] = run()
    return got


def assert_same_bits(got, names):
    """Every array of both_roundings' two results (sequences named by names) bit for bit the same."""
    for what, soft, hard in zip(names, got["1"], got["0"]):
        assert np.array_equal(soft.view(np.uint8), hard.view(np.uint8)), f"{what} differs between the two roundings"


@pytest.mark.parametrize("ssm_layout", ["vk", "kv"])
def test_bf16_instructions_store_the_bit_operations_bits(queue, monkeypatch, ssm_layout):
    """On a host with AVX512-BF16 the CPU variants round bf16 states with vcvtne2ps2bf16 (vec16.hpp
    to_bf16x32); GDN_XPU_SOFT_BF16=1 asks for the bit operations instead (the only form elsewhere).
    The same mixed batch (chunked and 1-token prefills, decodes, spec sequences, padding) from the
    same caches both ways: every output and every stored state bit for bit the same. (Without the
    instructions both runs take the bit operations.) K = 32, V = 64: rows of two or more vectors,
    stored 32 values at a time in both layouts (K = V = 16 stores one vector at a time)."""
    monkeypatch.setattr(sys.modules[__name__], "K", 32)
    monkeypatch.setattr(sys.modules[__name__], "V", 64)
    rng = np.random.default_rng(205)
    meta = make_batch(rng, num_slots=40, prefill_lens=[70, 130, 1], num_decodes=3, spec_lens=[3, 1, 2, 3],
                      num_spec=2, accepted=[1, 2, 3, 2], order="random", pad_non_spec=1, pad_spec=1, pad_len=1)
    layer = Layer(queue, rng, config(40, "bf16", ssm_layout))
    x, a, b = tokens(rng, meta["num_actual_tokens"], layer.cfg.conv_dim)
    conv0, ssm0 = layer.d_conv.to_numpy(), layer.d_ssm.to_numpy()

    def run():
        layer.d_conv, layer.d_ssm = usm(queue, conv0), usm(queue, ssm0)
        return layer.run(meta, x, a, b), layer.d_ssm.to_numpy(), layer.d_conv.to_numpy()

    got = both_roundings(monkeypatch, run)
    assert not np.array_equal(got["1"][1], ssm0), "the call stored no state"
    assert_same_bits(got, ("core_attn_out", "ssm_state", "conv_state"))


@pytest.mark.parametrize("ssm_layout", ["vk", "kv"])
def test_bf16_instructions_store_one_vector_as_the_bit_operations(queue, monkeypatch, ssm_layout):
    """The same as above for the stores of one vector (vec16.hpp store_bf16x16: vcvtneps2bf16):
    K = V = 16, so a state row is one vector, and bf16 activations, so the outputs are stored 16
    at a time (the spec conv's too). Outputs, ssm and conv states bit for bit both ways."""
    rng = np.random.default_rng(206)
    meta = make_batch(rng, num_slots=40, prefill_lens=[70, 1], num_decodes=3, spec_lens=[3, 1, 2],
                      num_spec=2, accepted=[1, 2, 3], order="random", pad_non_spec=1, pad_spec=1, pad_len=1)
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=16, head_v_dim=16, num_slots=40, conv_width=W,
                       act_dtype="bf16", state_dtype="bf16", ssm_layout=ssm_layout, conv_state_len=W - 1 + 2)
    T = meta["num_actual_tokens"]
    bf16 = lambda *shape: quantize(rng.standard_normal(shape), "bf16")[0]  # noqa: E731
    ins = dict(mixed_qkv=bf16(T, cfg.conv_dim), a=bf16(T, HV), b=bf16(T, HV), conv_weight=bf16(cfg.conv_dim, W),
               conv_bias=bf16(cfg.conv_dim), A_log=np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32),
               dt_bias=rng.uniform(-1, 1, HV).astype(np.float32))
    conv0 = bf16(*cfg.conv_state_shape)
    ssm0 = quantize(rng.standard_normal(cfg.ssm_state_shape) * 0.5, "bf16")[0]
    fill = quantize(np.full((T + 1, HV, 16), 5.0), "bf16")[0]
    names = ("core_attn_out", "ssm_state", "conv_state")

    def run():
        d = {k: usm(queue, v) for k, v in dict(ins, conv_state=conv0, ssm_state=ssm0, core_attn_out=fill).items()}
        pygdn.attention(queue, cfg, to_device(meta, queue), **d)
        return [d[k].to_numpy() for k in names]

    got = both_roundings(monkeypatch, run)
    assert not np.array_equal(got["1"][0][:T], fill[:T]) and not np.array_equal(got["1"][1], ssm0), "nothing stored"
    assert_same_bits(got, names)


@pytest.mark.parametrize("path", ["decode", "spec"])
@pytest.mark.parametrize("ssm_layout", ["vk", "kv"])
def test_bf16_store_flushes_denormal_states_both_ways(queue, monkeypatch, ssm_layout, path):
    """With g = 0 and beta = 0 a token leaves every state as it was (S' = 1 S + k 0). The CPU
    device's builds take denormal fp32 values as zero (-cl-denorms-are-zero, kernel_cache.cpp), so
    a bf16 state holding a denormal comes back with +-0 there and every other value (zeros
    included) bit for bit -- the same bits whether AVX512-BF16's instructions round the stores
    (they take a denormal input as zero, as those builds' arithmetic does; vec16.hpp to_bf16x32)
    or the bit operations do (GDN_XPU_SOFT_BF16=1). K = V = 32: rows of two vectors, stored in
    place (decode) and streamed to the spec slots (spec)."""
    monkeypatch.setattr(sys.modules[__name__], "K", 32)
    monkeypatch.setattr(sys.modules[__name__], "V", 32)
    rng = np.random.default_rng(207)
    n, slots = 4, 16
    cfg = config(slots, "bf16", ssm_layout)
    meta = make_batch(rng, num_slots=slots, **({"num_decodes": n, "has_initial_state": [1] * n} if path == "decode"
                                               else {"spec_lens": [2] * n, "num_spec": 2, "accepted": [1] * n}))
    T = meta["num_actual_tokens"]
    stored = pygdn.to_bf16_bits(rng.standard_normal(cfg.ssm_state_shape).astype(np.float32))
    flat = stored.reshape(-1, 32)  # one state row (vk) or one row of a column block (kv) per line
    flat[::3, 5] = 0x0003  # a denormal lane
    flat[1::7, 20] = 0x8042  # a negative denormal lane
    flat[2::5] = 0  # rows of +0
    flat[4::11, 31] = 0  # a +0 lane
    denormal = ((stored & 0x7F80) == 0) & ((stored & 0x7F) != 0)
    want = np.where(denormal, 0, stored)  # compared without the sign of the flushed lanes
    x = rng.standard_normal((T, cfg.conv_dim)).astype(np.float32)
    zeros = usm(queue, np.zeros((T, HV), np.float32))

    def run():
        d_ssm = usm(queue, stored)
        pygdn.gated_delta_rule(queue, cfg, to_device(meta, queue), conv_out=usm(queue, x), ssm_state=d_ssm,
                               core_attn_out=usm(queue, np.zeros((T, HV, V), np.float32)), g=zeros, beta=zeros)
        return d_ssm.to_numpy().view(np.uint16)

    got = both_roundings(monkeypatch, run)
    assert np.array_equal(got["1"], got["0"]), f"{int((got['1'] != got['0']).sum())} values differ between the two roundings"
    if path == "decode":
        pairs = [(int(s), int(s)) for s in meta["non_spec_state_indices"]]
    else:  # token j's state (to column j) is the read slot's (column 0: accepted = 1)
        pairs = [(int(row[j]), int(row[0])) for row in meta["spec_state_indices"] for j in range(2)]
    for dst, src in pairs:
        g = got["0"][dst] & np.where(denormal[src], 0x7FFF, 0xFFFF)
        assert np.array_equal(g, want[src]), f"slot {dst}: {int((g != want[src]).sum())} values are not slot {src}'s"


NAN_PAYLOADS = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7FFF8000, 0x7FC00001], np.uint32)  # low halves that carry when rounded


@pytest.mark.parametrize("path", ["decode", "spec"])
def test_bf16_store_keeps_nan_payloads(queue, path):
    """A NaN stays a NaN when a bf16 state is stored, whatever its payload: rounding adds up to
    0x8000 to the f32 bits, which carries a NaN with all-ones low bits into the sign (0x7fffffff ->
    -0). f32 v inputs carry the payloads; with beta = 0, u = 0 * NaN keeps the payload and the
    update S + k u spreads it over the whole state row of that value index (vk: S[v, :]); every
    other row keeps its value. pygdn.to_bf16_bits, the host's rounding, is checked alongside."""
    host = pygdn.to_bf16_bits(NAN_PAYLOADS.view(np.float32))
    assert np.all(np.isnan(pygdn.from_bf16_bits(host))), [f"{h:#06x}" for h in host]
    rng = np.random.default_rng(201)
    n, slots = 4, 12
    cfg = config(slots, "bf16", "vk")
    meta = make_batch(rng, num_slots=slots, **({"num_decodes": n, "has_initial_state": [1] * n} if path == "decode"
                                               else {"spec_lens": [2] * n, "num_spec": 2, "accepted": [1] * n}))
    T = meta["num_actual_tokens"]
    stored = pygdn.to_bf16_bits(rng.standard_normal((slots, HV, V, K)).astype(np.float32))
    x = rng.standard_normal((T, cfg.conv_dim)).astype(np.float32)
    v0 = 2 * H * K  # the v channels: v-head hv's value index v is channel v0 + hv * V + v
    bad_v = [(t % HV, (3 * t) % V) for t in range(T)]  # (v-head, value index) poisoned at token t
    for t, (hv, v) in enumerate(bad_v):
        x[t, v0 + hv * V + v] = NAN_PAYLOADS[t % NAN_PAYLOADS.size].view(np.float32)
    d_ssm = usm(queue, stored)
    zeros = usm(queue, np.zeros((T, HV), np.float32))
    pygdn.gated_delta_rule(queue, cfg, to_device(meta, queue), conv_out=usm(queue, x), ssm_state=d_ssm,
                           core_attn_out=usm(queue, np.zeros((T, HV, V), np.float32)), g=zeros, beta=zeros)
    got = pygdn.from_bf16_bits(d_ssm.to_numpy().view(np.uint16))
    seqs = meta["non_spec_token_indx" if path == "decode" else "spec_token_indx"]
    want_nan = np.zeros(got.shape, bool)
    if path == "decode":
        for i in range(n):  # the one token of decode i: its slot's poisoned row
            hv, v = bad_v[int(seqs[i])]
            want_nan[int(meta["non_spec_state_indices"][i]), hv, v, :] = True
    else:
        sqsl = meta["spec_query_start_loc"]
        for i in range(n):  # token j of spec sequence i stores the state after it to slot spec_state_indices[i, j]
            toks = [int(r) for r in seqs[sqsl[i]:sqsl[i + 1]]]
            for j in range(len(toks)):
                for hv, v in {bad_v[r] for r in toks[:j + 1]}:
                    want_nan[int(meta["spec_state_indices"][i][j]), hv, v, :] = True
    assert np.array_equal(np.isnan(got), want_nan), (
        f"{int((np.isnan(got) != want_nan).sum())} stored states NaN where the rule says otherwise "
        f"(e.g. at {np.argwhere(np.isnan(got) != want_nan)[:4].tolist()})")
    untouched = ~want_nan & ~np.isin(np.arange(slots), [int(s) for s in np.ravel(
        meta["non_spec_state_indices"] if path == "decode" else meta["spec_state_indices"])])[:, None, None, None]
    assert np.array_equal(got[untouched], pygdn.from_bf16_bits(stored)[untouched])
