"""Non-finite gates (docs/op.md "Non-finite gates"): a token whose decay is 0 -- g = -inf from
a = +inf, a = 1e38 or an overflowing exp(A_log), or g = -inf given directly -- resets the state
before its update, on every path: the chunked prefill (where a naive form computes e^(-inf - -inf) = NaN
for the whole sequence), the forced-recurrent prefill, decode and spec decode. A_log = 100 with
a = -200 is the 0 * inf of -exp(A_log) * softplus(a + dt_bias): defined as the true (tiny) product;
a = -inf makes softplus exactly 0: g = 0, no decay.

One batch: a 150-token prefill (three chunks), a 70-token prefill, two decodes and two spec
sequences, tokens interleaved. The first prefill, the first decode and the first spec sequence get
the bad gate on v-head 1 at some tokens (the first and last token, both sides of a chunk boundary,
two in a row). Checked: chunked and recurrent results finite wherever the float64 reference is,
both within the normal f32 tolerance of it; the other sequences, and v-head 0 of all, bit-identical
to a run without the bad values; NaN inputs change nothing outside their sequence.

Shapes reuse other tests' kernel builds (K = V = 16 f32 as test_delta_rule for the CPU variants,
K = V = 32 as test_generic_kernels for the generic kernels): these tests add no kernel build."""
import numpy as np
import pytest

import pygdn
from pygdn import reference as ref
from pygdn.batch import make_batch, to_device
from helpers import assert_close, ssm_from_canonical, ssm_to_canonical, usm
from op_checks import RTOL_F32

H, HV, SLOTS = 1, 2, 16
BAD_HEAD = 1
PREFILL_POSITIONS = [0, 5, 6, 63, 64, 100, 149]  # tokens of the 150-token prefill that get the bad gate
CASES = ["a=+inf", "a=-inf", "a=1e38", "A_log=100", "g=-inf", "a=nan"]


def make_meta():
    rng = np.random.default_rng(180)
    return make_batch(rng, num_slots=SLOTS, prefill_lens=[150, 70], num_decodes=2, spec_lens=[3, 3], num_spec=2,
                      accepted=[2, 1], has_initial_state=[1, 1, 1, 1], order="random")


def sequences(meta):
    """Global rows of each sequence: ("prefill", 0), ("prefill", 1), ("decode", 0), ..., ("spec", 1)."""
    out = {}
    qsl, tok = meta["non_spec_query_start_loc"], meta["non_spec_token_indx"]
    names = [("prefill", 0), ("prefill", 1), ("decode", 0), ("decode", 1)]
    for i, name in enumerate(names):
        out[name] = [int(r) for r in tok[qsl[i]:qsl[i + 1]]]
    sqsl, stok = meta["spec_query_start_loc"], meta["spec_token_indx"]
    for n in range(meta["num_spec_decodes"]):
        out[("spec", n)] = [int(r) for r in stok[sqsl[n]:sqsl[n + 1]]]
    return out


def poisoned_rows(meta):
    seqs = sequences(meta)
    return [seqs[("prefill", 0)][p] for p in PREFILL_POSITIONS] + seqs[("decode", 0)] + [seqs[("spec", 0)][1]]


def inputs(meta, K, case):
    """(host inputs of the call, clean=False/True): the same random data, with or without the bad gates."""
    rng = np.random.default_rng(181)
    T, V = meta["num_actual_tokens"], K
    d = dict(qkv=rng.standard_normal((T, 2 * H * K + HV * V)).astype(np.float32),
             a=rng.standard_normal((T, HV)).astype(np.float32), b=rng.standard_normal((T, HV)).astype(np.float32),
             A_log=np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32),
             dt_bias=rng.uniform(-1.0, 1.0, HV).astype(np.float32),
             s0=(rng.standard_normal((SLOTS, HV, K, V)) * 0.5).astype(np.float32))
    if case == "g=-inf":  # the g/beta form: the gates computed from the same a/b, then -inf put in
        g, beta = ref.gates(d["a"], d["b"], d["A_log"], d["dt_bias"])
        d["g"], d["beta"] = g.astype(np.float32), beta.astype(np.float32)
    bad = dict(d)
    rows = poisoned_rows(meta)
    if case == "g=-inf":
        bad["g"] = d["g"].copy()
        bad["g"][rows, BAD_HEAD] = -np.inf
    elif case == "A_log=100":  # every token of head 1 resets, except where a = -200 (no decay at all)
        bad["A_log"] = d["A_log"].copy()
        bad["A_log"][BAD_HEAD] = 100.0
        bad["a"] = d["a"].copy()
        bad["a"][rows, BAD_HEAD] = -200.0
    else:
        bad["a"] = d["a"].copy()
        bad["a"][rows, BAD_HEAD] = {"a=+inf": np.inf, "a=-inf": -np.inf, "a=1e38": 1e38, "a=nan": np.nan}[case]
    return bad, d


def run(queue, meta, d, K, layout, force_recurrent=False):
    """The device call (gdn_gated_delta_rule on given conv output) -> (out [T, HV, V], ssm canonical)."""
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=K, num_slots=SLOTS,
                       act_dtype="f32", ssm_layout=layout, force_recurrent=force_recurrent)
    T = meta["num_actual_tokens"]
    d_ssm = usm(queue, ssm_from_canonical(d["s0"], layout))
    d_out = usm(queue, np.full((T, HV, K), 3.0, np.float32))
    kw = (dict(g=usm(queue, d["g"]), beta=usm(queue, d["beta"])) if "g" in d else
          dict(a=usm(queue, d["a"]), b=usm(queue, d["b"]), A_log=usm(queue, d["A_log"]), dt_bias=usm(queue, d["dt_bias"])))
    pygdn.gated_delta_rule(queue, cfg, to_device(meta, queue), conv_out=usm(queue, d["qkv"]), ssm_state=d_ssm,
                           core_attn_out=d_out, **kw)
    queue.wait()
    return d_out.to_numpy(), ssm_to_canonical(d_ssm.to_numpy(), layout)


def reference(meta, d, K):
    g, beta = (d["g"], d["beta"]) if "g" in d else ref.gates(d["a"], d["b"], d["A_log"], d["dt_bias"])
    return ref.gated_delta_rule(d["qkv"], g, beta, d["s0"].astype(np.float64), meta, H, HV, K, K)


def check(queue, case, K, layout):
    meta = make_meta()
    bad, clean = inputs(meta, K, case)
    runs = {path: (run(queue, meta, bad, K, layout, force_recurrent=path == "recurrent"),
                   run(queue, meta, clean, K, layout, force_recurrent=path == "recurrent"))
            for path in ("chunked", "recurrent")}

    # Untouched by the bad values, bit for bit against the same path without them: the other
    # sequences (rows and slots), v-head 0 of every sequence (all v-head 1 gates change when
    # A_log[1] does: it is per v-head), and every slot no sequence addresses.
    seqs = sequences(meta)
    ns_slots, spec_cols = meta["non_spec_state_indices"], meta["spec_state_indices"]
    slots = {name: [int(ns_slots[i])] for i, name in enumerate([("prefill", 0), ("prefill", 1), ("decode", 0), ("decode", 1)])}
    slots.update({("spec", n): [int(c) for c in spec_cols[n]] for n in range(2)})
    dirty = {("prefill", 0), ("decode", 0), ("spec", 0)}
    addressed = {sl for v in slots.values() for sl in v}
    for path, ((o, s), (co, cs)) in runs.items():
        for name, rows in seqs.items():
            for h in ([0] if name in dirty or case == "A_log=100" else [0, 1]):
                assert np.array_equal(o[rows, h], co[rows, h]), f"{case} {path}: {name} v-head {h} output changed"
                for sl in slots[name]:
                    assert np.array_equal(s[sl, h], cs[sl, h]), f"{case} {path}: {name} v-head {h} slot {sl} changed"
        for sl in set(range(SLOTS)) - addressed:
            assert np.array_equal(s[sl], clean["s0"][sl]), f"{case} {path}: unaddressed slot {sl} changed"
    if case == "a=nan":
        return  # NaN stays in its sequence (checked above); nothing to compare it with

    want_o, want_s = reference(meta, bad, K)
    assert np.isfinite(want_o).all() and np.isfinite(want_s).all(), "the reference recurrence is finite here"
    written = sorted(set(int(x) for x in ns_slots) |
                     {int(spec_cols[n][t]) for n in range(2) for t in range(len(seqs[("spec", n)]))})
    (chunk_o, chunk_s), (rec_o, rec_s) = runs["chunked"][0], runs["recurrent"][0]
    for o, s, path in ((chunk_o, chunk_s, "chunked"), (rec_o, rec_s, "recurrent")):
        assert np.isfinite(o).all() and np.isfinite(s).all(), f"{case} {path}: non-finite values"
        assert_close(o, want_o, RTOL_F32, f"{case} {path}: core_attn_out vs reference")
        for sl in written:
            assert_close(s[sl], want_s[sl], RTOL_F32, f"{case} {path}: ssm_state[{sl}] vs reference")
    assert_close(chunk_o, rec_o, RTOL_F32, f"{case}: chunked vs recurrent output")
    assert_close(chunk_s[written], rec_s[written], RTOL_F32, f"{case}: chunked vs recurrent state")


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("case", CASES)
def test_nonfinite_gates(queue, case, layout):
    check(queue, case, 16, layout)


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("case", CASES)
def test_nonfinite_gates_generic_kernels(queue, monkeypatch, case, layout):
    monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1")
    check(queue, case, 32, layout)


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("path", ["chunked", "recurrent"])
@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_reset_is_exact(queue, monkeypatch, layout, path, generic):
    """A decay of 0 resets the state exactly ("exactly as the recurrence computes it"): whatever
    comes at and after a reset token does not depend on the state before it. The g = -inf batch run
    from two initial states, the second 1e30 times the first: from each poisoned sequence's first
    reset on (the prefill's token 0, the decode's token, spec token 1 of 3 -- inside the kv walk's
    WY form, whose products of decays must give exact zeros there), the outputs and stored states of
    v-head 1 are equal in both runs. A reset that kept even a 1e-30 weight of the old state fails
    (checked by mutation: a WY walk with P = 1e-30 at a reset). CPU variants (K = 16) and generic
    kernels (K = 32), as the tests above."""
    K = 32 if generic else 16
    if generic:
        monkeypatch.setenv("GDN_XPU_GENERIC_KERNELS", "1")
    meta = make_meta()
    bad, _ = inputs(meta, K, "g=-inf")
    big = dict(bad, s0=(bad["s0"] * np.float32(1e30)).astype(np.float32))
    (o1, s1), (o2, s2) = (run(queue, meta, d, K, layout, force_recurrent=path == "recurrent") for d in (bad, big))
    assert not np.array_equal(o1[:, 0], o2[:, 0]), "the second initial state was not used"
    seqs = sequences(meta)
    ns_slots, spec_cols = meta["non_spec_state_indices"], meta["spec_state_indices"]
    after = {("prefill", 0): (0, [int(ns_slots[0])]), ("decode", 0): (0, [int(ns_slots[2])]),
             ("spec", 0): (1, [int(c) for c in spec_cols[0][1:3]])}
    for name, (first, written) in after.items():
        rows = seqs[name][first:]
        assert np.isfinite(o1[rows, BAD_HEAD]).all()
        assert np.array_equal(o1[rows, BAD_HEAD], o2[rows, BAD_HEAD]), f"{path}: {name} output after its reset"
        for sl in written:
            assert np.array_equal(s1[sl, BAD_HEAD], s2[sl, BAD_HEAD]), f"{path}: {name} slot {sl} after its reset"
