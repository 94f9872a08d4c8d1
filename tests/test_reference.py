"""pygdn/reference.py checked against itself, so that the suite's float64 reference is a reference:
its chunked and recurrent forms, its batched op and its single-head walks, MTP steps against one
prefill, the state-cache rules (read slots, block checkpoints, rounding once per store) and the
8-bit state formats (i8 and OCP E4M3 codes with a scale per state row)."""
import numpy as np

from pygdn.reference import (causal_conv1d, chunked_gated_delta_rule, dequantize_state, e4m3_to_float,
                             float_to_e4m3, gated_delta_rule, gated_rmsnorm, gates, gdn_attention, l2norm,
                             quantize_state, recurrent_single, round_e4m3, round_state)


def test_reference_self_consistency():
    """The reference against itself: 1. the chunked form equals the recurrent one (with resets and
    extreme gates); 2. l2norm's modes agree; 3. a two-step MTP run equals one long prefill, both conv
    layouts; 4. the batched delta rule equals the chunked form per head; 5. _state_caches."""
    rng = np.random.default_rng(0)
    # 1. chunked vs recurrent
    Kd, Vd = 8, 6
    for T in (1, 63, 64, 65, 200):
        q = l2norm(rng.standard_normal((T, Kd))) * Kd ** -0.5
        k = l2norm(rng.standard_normal((T, Kd)))
        v = rng.standard_normal((T, Vd))
        g = -np.abs(rng.standard_normal(T)) * 0.3
        beta = rng.uniform(0, 1, T)
        S0 = rng.standard_normal((Kd, Vd))
        o1, s1 = recurrent_single(q, k, v, g, beta, S0)
        for ch in (64, 16):
            o2, s2 = chunked_gated_delta_rule(q, k, v, g, beta, S0, chunk=ch)
            err = max(np.abs(o1 - o2).max(), np.abs(s1 - s2).max())
            assert err < 1e-10, (T, ch, err)
    # 1b. resets (decay 0: g = -inf, or a huge finite g) inside and across chunks, first and last
    # tokens included: the chunked form equals the recurrence and stays finite
    T = 150
    q = l2norm(rng.standard_normal((T, Kd))) * Kd ** -0.5
    k = l2norm(rng.standard_normal((T, Kd)))
    v = rng.standard_normal((T, Vd))
    beta = rng.uniform(0, 1, T)
    S0 = rng.standard_normal((Kd, Vd))
    for bad in (-np.inf, -1e30, -800.0):
        g = -np.abs(rng.standard_normal(T)) * 0.3
        g[[0, 5, 6, 63, 64, 100, 149]] = bad
        o1, s1 = recurrent_single(q, k, v, g, beta, S0)
        for ch in (64, 16):
            o2, s2 = chunked_gated_delta_rule(q, k, v, g, beta, S0, chunk=ch)
            assert np.isfinite(o2).all() and np.isfinite(s2).all(), (bad, ch)
            err = max(np.abs(o1 - o2).max(), np.abs(s1 - s2).max())
            assert err < 1e-10, (bad, ch, err)
    # 1c. gates: overflow -> -inf, 0 * inf -> the true tiny value, exact zero factors, NaN stays NaN
    gg, _ = gates([[np.inf, 1e38, -200.0, -np.inf, np.nan]], np.zeros((1, 5)), np.zeros(5), np.zeros(5))
    assert np.isneginf(gg[0, 0]) and gg[0, 1] == -1e38 and gg[0, 3] == 0.0 and np.isnan(gg[0, 4])
    assert abs(gg[0, 2] + np.exp(-200.0)) < 1e-100
    gA, _ = gates([[0.0, -200.0, -np.inf]], np.zeros((1, 3)), [1000.0, 100.0, np.inf], np.zeros(3))
    assert np.isneginf(gA[0, 0]) and abs(gA[0, 1] + np.exp(-100.0)) < 1e-50 and gA[0, 2] == 0.0
    # 2. l2norm modes differ negligibly for non-tiny vectors
    xx = rng.standard_normal((5, 128))
    assert np.abs(l2norm(xx) - l2norm(xx, mode="div")).max() < 1e-6

    # 3. two-step MTP scenario, both conv layouts, vs one long prefill
    H, HV, K, V, W, NS = 1, 2, 4, 3, 4, 2
    C = 2 * H * K + HV * V
    slots, state_len = 6, W - 1 + NS
    wt, bs = rng.standard_normal((C, W)), rng.standard_normal(C)
    A_log, dt_bias = rng.standard_normal(HV) * 0.5, rng.standard_normal(HV)
    h = rng.standard_normal((C, W - 1))                       # history before the spec steps
    S_init = rng.standard_normal((HV, K, V))
    X1, X2 = rng.standard_normal((3, C)), rng.standard_normal((2, C))   # step tokens
    a1, b1 = rng.standard_normal((4, HV)), rng.standard_normal((4, HV))
    a2, b2 = rng.standard_normal((2, HV)), rng.standard_normal((2, HV))
    xd = rng.standard_normal(C)                               # interleaved plain decode token
    cols = [1, 2, 3]
    conv0 = rng.standard_normal((slots, C, state_len))        # garbage everywhere ...
    conv0[1][:, :W - 1] = h                                   # ... but slot 1's A=1 window
    ssm0 = rng.standard_normal((slots, HV, K, V))
    ssm0[1] = S_init
    # step 1: rows 0,2,3 spec seq (A=1, 3 tokens), row 1 non-spec decode (slot 0),
    # row 4: a second spec sequence whose slots are all pad (graph padding).
    X1full = np.stack([X1[0], xd, X1[1], X1[2], rng.standard_normal(C)])
    a1f, b1f = np.vstack([a1, a1[:1]]), np.vstack([b1, b1[:1]])
    batch1 = dict(num_decodes=1, num_spec_decodes=2, num_spec=NS, num_actual_tokens=5,
                  non_spec_query_start_loc=[0, 1], non_spec_state_indices=[0],
                  non_spec_token_indx=[1], spec_query_start_loc=[0, 3, 4],
                  spec_state_indices=[cols, [-1, -1, -1]], num_accepted_tokens=[1, 1],
                  spec_token_indx=[0, 2, 3, 4])
    # step 2: A=2 (tokens 0,1 of step 1 accepted), 2 tokens
    batch2 = dict(num_spec_decodes=1, num_spec=NS, num_actual_tokens=2,
                  spec_query_start_loc=[0, 2], spec_state_indices=[cols],
                  num_accepted_tokens=[2])
    res = {}
    for lay in ("snapshot", "rolled"):
        o1, c1, s1 = gdn_attention(X1full, a1f, b1f, wt, bs, A_log, dt_bias, conv0, ssm0,
                                   batch1, H, HV, K, V, spec_layout=lay)
        assert np.all(o1[4] == 0)                             # padded spec sequence
        o2, c2, s2 = gdn_attention(X2, a2, b2, wt, bs, A_log, dt_bias, c1, s1, batch2,
                                   H, HV, K, V, spec_layout=lay)
        res[lay] = (o1, o2, c1, s1, s2)
        if lay == "rolled":   # hand-checked line: [h1, h2, x0, x1, x2]
            assert np.allclose(c1[1], np.concatenate([h[:, 1:], X1.T], axis=1), 0, 0)
            assert np.allclose(c2[1][:, :W - 2], X1[:2].T[:, -(W - 2):], 0, 0)  # [x0, x1]
            assert np.allclose(c2[1][:, W - 2:W], X2.T, 0, 0)
        else:                 # window after token t of step 1 in slot cols[t]
            full = np.concatenate([h, X1.T], axis=1)
            for t in range(3):
                assert np.allclose(c1[cols[t]][:, :W - 1], full[:, t + 1:t + W], 0, 0)
            assert np.allclose(c1[cols[0]][:, W - 1:], conv0[cols[0]][:, W - 1:], 0, 0)
        assert np.allclose(c1[4:], conv0[4:], 0, 0) and np.allclose(s1[4:], ssm0[4:], 0, 0)
    (o1s, o2s, _, s1s, s2s), (o1r, o2r, _, s1r, s2r) = res["snapshot"], res["rolled"]
    assert np.abs(o1s - o1r).max() < 1e-12 and np.abs(o2s - o2r).max() < 1e-12
    assert np.abs(s2s - s2r).max() < 1e-12
    # ... and both equal one prefill over h ++ x0 x1 ++ step-2 tokens.
    Xp = np.vstack([X1[:2], X2])
    ap, bp = np.vstack([a1[[0, 2]], a2]), np.vstack([b1[[0, 2]], b2])
    bpre = dict(num_prefills=1, num_actual_tokens=4, non_spec_query_start_loc=[0, 4],
                non_spec_state_indices=[1], has_initial_state=[1])
    op, cp, sp = gdn_attention(Xp, ap, bp, wt, bs, A_log, dt_bias, conv0, ssm0, bpre,
                               H, HV, K, V)
    assert np.abs(op[2:] - o2s).max() < 1e-12 and np.abs(op[:2] - o1s[[0, 2]]).max() < 1e-12
    assert np.abs(sp[1] - s2s[cols[1]]).max() < 1e-12        # state after last step-2 token
    assert np.allclose(cp[1][:, :W - 1], np.concatenate([h, Xp.T], 1)[:, -(W - 1):], 0, 0)
    # conv itself vs np.convolve, one channel
    y, _ = causal_conv1d(Xp, wt, bs, conv0, bpre, silu=False)
    fc = np.concatenate([h[5], Xp[:, 5]])
    assert np.allclose(y[:, 5], np.convolve(fc, wt[5][::-1], "valid") + bs[5], atol=1e-12)
    # has_initial_state = 0 -> zero history and zero initial S
    y0, _ = causal_conv1d(Xp, wt, bs, conv0, dict(bpre, has_initial_state=[0]), silu=False)
    fc0 = np.concatenate([np.zeros(W - 1), Xp[:, 5]])
    assert np.allclose(y0[:, 5], np.convolve(fc0, wt[5][::-1], "valid") + bs[5], atol=1e-12)
    # 4. batched delta rule on a long prefill vs the chunked form per head (GVA)
    H, HV, K, V, T = 2, 4, 8, 5, 130
    qkv = rng.standard_normal((T, 2 * H * K + HV * V))
    g, beta = gates(rng.standard_normal((T, HV)), rng.standard_normal((T, HV)),
                    rng.standard_normal(HV) * 0.3, rng.standard_normal(HV))
    ssm = rng.standard_normal((2, HV, K, V))
    bb = dict(num_prefills=1, num_actual_tokens=T, non_spec_query_start_loc=[0, T],
              non_spec_state_indices=[1])
    o, s = gated_delta_rule(qkv, g, beta, ssm, bb, H, HV, K, V)
    qn = l2norm(qkv[:, :H * K].reshape(T, H, K)) * K ** -0.5
    kn = l2norm(qkv[:, H * K:2 * H * K].reshape(T, H, K))
    vv = qkv[:, 2 * H * K:].reshape(T, HV, V)
    for hh in range(HV):
        kh = hh // (HV // H)
        oc, sc = chunked_gated_delta_rule(qn[:, kh], kn[:, kh], vv[:, hh], g[:, hh],
                                          beta[:, hh], ssm[1, hh])
        assert np.abs(oc - o[:, hh]).max() < 1e-10 and np.abs(sc - s[1, hh]).max() < 1e-10
    assert np.all(s[0] == ssm[0])
    # gated rmsnorm of zero rows stays zero; shape check
    zz = rng.standard_normal((T, HV, V))
    on = gated_rmsnorm(o, zz, np.ones(V))
    assert on.shape == o.shape and np.isfinite(on).all()
    _state_caches(rng)


def _state_caches(rng):
    """5. Read slots and block checkpoints: a prefill of a request that already holds 5 tokens,
    reading slot 0 and storing a checkpoint every 8 tokens (the reference takes any interval),
    then resumed from each checkpoint as a prefill, a decode and a spec continuation (both conv
    layouts), equals the unbroken run; the read slot is left as it was; shared read slots; and
    with a bf16 state every stored state is the exact run's state rounded once."""
    H, HV, K, V, W, NS = 1, 2, 4, 3, 4, 2
    C, T, I, p0 = 2 * H * K + HV * V, 37, 8, 5
    slots = 24
    X, a, b = rng.standard_normal((T, C)), rng.standard_normal((T, HV)), rng.standard_normal((T, HV))
    wt, bs = rng.standard_normal((C, W)) * 0.5, rng.standard_normal(C) * 0.1
    A_log, dt_bias = rng.standard_normal(HV) * 0.5, rng.standard_normal(HV)
    conv0, ssm0 = rng.standard_normal((slots, C, W - 1 + NS)), rng.standard_normal((slots, HV, K, V))
    bounds = [j for j in range(T) if (p0 + j + 1) % I == 0]       # 2, 10, 18, 26, 34
    ck_slots = [3, 4, 5, 6, 7, -1]

    def run(lay, rows, batch, conv, ssm, sd=None):
        return gdn_attention(X[rows], a[rows], b[rows], wt, bs, A_log, dt_bias, conv, ssm, batch, H, HV, K, V,
                             spec_layout=lay, state_dtype=sd)

    def prefill(n, write, read, pos, cks=(), cols=0):
        return dict(num_prefills=1, num_actual_tokens=n, non_spec_query_start_loc=[0, n], non_spec_state_indices=[write],
                    non_spec_read_state_indices=[read], non_spec_start_pos=[pos], checkpoint_interval=I if cols else 0,
                    checkpoint_cols=cols, checkpoint_state_indices=list(cks))

    for lay in ("snapshot", "rolled"):
        o, c1, s1 = run(lay, range(T), prefill(T, 1, 0, p0, ck_slots, 6), conv0, ssm0)
        assert np.array_equal(c1[0], conv0[0]) and np.array_equal(s1[0], ssm0[0]), "read slot written"
        assert np.array_equal(s1[ck_slots[-2] + 1:], ssm0[ck_slots[-2] + 1:]), "slot past the checkpoints written"
        full = np.concatenate([conv0[0][:, :W - 1], X.T], axis=1)
        for k, j in enumerate(bounds):
            ck, pos = ck_slots[k], j + 1                             # the checkpoint holds tokens 0..j
            assert np.array_equal(c1[ck][:, :W - 1], full[:, j + 1:j + W]), "checkpoint conv history"
            # prefill continuation, storing its own checkpoints (slots 10..): the unbroken run's later ones
            rest = T - pos
            o2, c2, s2 = run(lay, range(pos, T), prefill(rest, 9, ck, p0 + pos, [10, 11, 12, 13, 14], 5), c1, s1)
            assert np.abs(o2 - o[pos:]).max() < 1e-12 and np.abs(s2[9] - s1[1]).max() < 1e-12
            assert np.array_equal(c2[9][:, :W - 1], c1[1][:, :W - 1])
            for kk in range(len(bounds) - k - 1):
                assert np.abs(s2[10 + kk] - s1[ck_slots[k + 1 + kk]]).max() < 1e-12
                assert np.array_equal(c2[10 + kk][:, :W - 1], c1[ck_slots[k + 1 + kk]][:, :W - 1])
            # decode continuation: the token after the checkpoint
            o3, _, s3 = run(lay, [pos], dict(num_decodes=1, num_actual_tokens=1, non_spec_query_start_loc=[0, 1],
                                            non_spec_state_indices=[9], non_spec_read_state_indices=[ck]), c1, s1)
            assert np.abs(o3[0] - o[pos]).max() < 1e-12
            # spec continuation (A = 1) over up to 3 tokens; the state after token t goes to [9, 10, 11][t]
            L = min(3, T - pos)
            sb = dict(num_spec_decodes=1, num_spec=NS, num_actual_tokens=L, spec_query_start_loc=[0, L],
                      spec_state_indices=[[9, 10, 11]], num_accepted_tokens=[1], spec_read_state_indices=[ck])
            o4, c4, s4 = run(lay, range(pos, pos + L), sb, c1, s1)
            assert np.abs(o4 - o[pos:pos + L]).max() < 1e-12
            if pos + L == T:
                assert np.abs(s4[9 + L - 1] - s1[1]).max() < 1e-12
            window = c4[9][:, L - 1:L + W - 2] if lay == "rolled" else c4[9 + L - 1][:, :W - 1]
            assert np.array_equal(window, full[:, pos + L:pos + L + W - 1]), "spec continuation conv window"
            assert np.array_equal(c4[ck], c1[ck]) and np.array_equal(s4[ck], s1[ck]), "read slot written"
        # a bf16 state: each stored state is the exact one rounded once, the run itself unrounded
        ob, cb, sb16 = run(lay, range(T), prefill(T, 1, 0, p0, ck_slots, 6), conv0, ssm0, "bf16")
        assert np.array_equal(ob, o) and np.array_equal(cb, c1)
        for slot in [1] + ck_slots[:-1]:
            assert np.array_equal(sb16[slot], round_state(s1[slot], "bf16"))
        assert np.abs(sb16[1] - s1[1]).max() > 0, "bf16 rounding did nothing"

    # Shared read slot: a prefill, a decode and a spec sequence read slot 0 and write elsewhere, each
    # as if alone; has_initial_state = 0 and a pad read slot both start from zeros.
    meta = dict(num_prefills=2, num_decodes=1, num_spec_decodes=1, num_spec=NS, num_actual_tokens=9,
                non_spec_query_start_loc=[0, 4, 6, 7], non_spec_state_indices=[1, 2, 3],
                non_spec_read_state_indices=[0, 0, -1], has_initial_state=[1, 0, 1], non_spec_token_indx=[0, 1, 2, 3, 4, 5, 6],
                spec_query_start_loc=[0, 2], spec_state_indices=[[4, 5, 6]], num_accepted_tokens=[1],
                spec_read_state_indices=[0], spec_token_indx=[7, 8])
    o, c1, s1 = run("rolled", range(9), meta, conv0, ssm0)
    assert np.array_equal(c1[0], conv0[0]) and np.array_equal(s1[0], ssm0[0])
    zero_c, zero_s = conv0.copy(), ssm0.copy()
    zero_c[0], zero_s[0] = 0.0, 0.0
    for rows, write, base_c, base_s in (([0, 1, 2, 3], 1, conv0, ssm0), ([4, 5], 2, zero_c, zero_s),
                                        ([6], 3, zero_c, zero_s)):
        oo, cc, ss = run("rolled", rows, prefill(len(rows), write, 0, 0), base_c, base_s)
        assert np.abs(oo - o[rows]).max() < 1e-12 and np.abs(ss[write] - s1[write]).max() < 1e-12
        assert np.array_equal(cc[write][:, :W - 1], c1[write][:, :W - 1])
    oo, cc, ss = run("rolled", [7, 8], dict(num_spec_decodes=1, num_spec=NS, num_actual_tokens=2, spec_query_start_loc=[0, 2],
                                            spec_state_indices=[[0, 5, 6]], num_accepted_tokens=[1]), conv0, ssm0)
    assert np.abs(oo - o[7:9]).max() < 1e-12 and np.abs(ss[5] - s1[5]).max() < 1e-12


class _Edge:
    """A stand-in for a numpy Generator whose random() is always `u`: stochastic rounding then picks
    the lower neighbour (u = 0) or, for any value off the grid, the upper one (u just below 1)."""
    def __init__(self, u):
        self.u = u

    def random(self, shape):
        return np.full(shape, self.u)


def test_e4m3_codes():
    """Every OCP E4M3 bit pattern: its value, and the pattern back from the value."""
    c = np.arange(256, dtype=np.uint8)
    v = e4m3_to_float(c)
    nan = np.isnan(v)
    assert list(np.flatnonzero(nan)) == [0x7F, 0xFF]
    assert np.array_equal(float_to_e4m3(v[~nan]), c[~nan]), "every code round-trips"
    assert np.array_equal(round_e4m3(v[~nan]), v[~nan])
    assert np.array_equal(e4m3_to_float(c[0x80:]), -e4m3_to_float(c[:0x80]), equal_nan=True)
    expect = {0x00: 0.0, 0x01: 2.0 ** -9, 0x07: 7 * 2.0 ** -9, 0x08: 2.0 ** -6, 0x09: 1.125 * 2.0 ** -6, 0x38: 1.0,
              0x39: 1.125, 0x3F: 1.875, 0x40: 2.0, 0x77: 240.0, 0x78: 256.0, 0x7E: 448.0, 0xFE: -448.0, 0xB8: -1.0}
    for code, value in expect.items():
        assert v[code] == value, hex(code)
    assert v[0x80] == 0.0 and np.signbit(v[0x80]) and float_to_e4m3(-0.0) == 0x80
    assert np.all(np.diff(v[:0x7F]) > 0), "codes 0x00..0x7E increase"
    assert len(np.unique(v[~nan])) == 253


def test_e4m3_rounding():
    """Round to nearest, ties to the even mantissa, in the normal and the subnormal range; saturation
    at +-448 (no inf); stochastic rounding lands on a neighbour."""
    s = 2.0 ** -9
    cases = [(1 + 1 / 16, 1.0), (1.125 + 1 / 16, 1.25), (1 + 1 / 16 + 1e-12, 1.125), (-(1 + 3 / 16), -1.25),
             (0.5 * s, 0.0), (0.5 * s + 1e-15, s), (1.5 * s, 2 * s), (2.5 * s, 2 * s), (7.5 * s, 2.0 ** -6),
             (400.0, 384.0), (432.0, 448.0), (440.0, 448.0), (464.0, 448.0), (500.0, 448.0), (1e30, 448.0),
             (-1e30, -448.0), (np.inf, 448.0), (-np.inf, -448.0), (2.0 ** -12, 0.0)]
    x = np.array([c[0] for c in cases])
    assert np.array_equal(round_e4m3(x), [c[1] for c in cases])
    assert np.signbit(round_e4m3(-2.0 ** -12))
    y = np.array([1.03, 1.0, -1.03, 300.0, 0.3 * s, 447.0])
    assert np.array_equal(round_e4m3(y, _Edge(0.0)), [1.0, 1.0, -1.125, 288.0, 0.0, 416.0])
    assert np.array_equal(round_e4m3(y, _Edge(1 - 2.0 ** -40)), [1.125, 1.0, -1.0, 320.0, s, 448.0])


def test_quantize_state_i8():
    """i8 rows: ties to even, a zero row, the amax element at exactly +-127 (never -128), the clamp."""
    x = np.zeros((2, 8, 1))
    x[0, :, 0] = [127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5]  # scale 1: y = x
    codes, scales = quantize_state(x, "i8")
    assert codes.dtype == np.int8 and scales.shape == (2, 1)
    assert list(codes[0, :, 0]) == [127, 0, 2, 2, 0, -2, -2, 126] and scales[0, 0] == 1.0
    assert not codes[1].any() and scales[1, 0] == 0.0, "amax 0: scale 0, codes 0"
    assert np.array_equal(round_state(x, "i8"), np.rint(x))
    xn = np.array([[-3.0], [1.0], [2.0]])
    c, sc = quantize_state(xn, "i8")
    assert list(c[:, 0]) == [-127, 42, 85] and sc[0] == 3.0 / 127
    # amax = 1.01134: x * (127 / amax) is 127 + 2^-46 in float64; u near 1 would give 128
    a = 1.01134
    assert a * (127.0 / a) > 127.0
    c, _ = quantize_state(np.array([[a], [-a], [a / 3]]), "i8", rng=_Edge(1 - 2.0 ** -40))
    assert list(c[:, 0]) == [127, -127, 43]


def test_quantize_state_rows():
    """One scale per (..., v) over axis -2; a power-of-two factor on one column scales only that
    column's scale; dequantize_state inverts the codes; the float32 path (the kernels' f32
    arithmetic) gives f32 scales and the same codes up to one step."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 16, 5))
    f = 2.0 ** np.array([-20, 0, 3, 40, -3])
    for dt, Q in (("i8", 127.0), ("f8e4m3", 448.0)):
        codes, scales = quantize_state(x, dt)
        assert codes.shape == x.shape and scales.shape == (2, 3, 5)
        assert np.array_equal(scales, np.abs(x).max(axis=-2) / Q)
        codes2, scales2 = quantize_state(x * f, dt)
        assert np.array_equal(codes2, codes) and np.array_equal(scales2, scales * f)
        assert np.array_equal(round_state(x * f, dt), round_state(x, dt) * f)
        vals = dequantize_state(codes, scales, dt)
        assert np.array_equal(vals, round_state(x, dt))
        # the largest error: half the largest code step, relative to amax (i8: 0.5 / 127, e4m3: 16 / 448),
        # and for e4m3 also half a step relative to the value itself above the subnormals (2^-4)
        err = np.abs(vals - x) / np.abs(x).max(axis=-2, keepdims=True)
        assert err.max() <= (0.5 / 127 if dt == "i8" else 16 / 448) * (1 + 1e-12), err.max()
        if dt == "f8e4m3":
            normal = np.abs(x) / scales[..., None, :] >= 2.0 ** -6
            assert (np.abs(vals - x) / np.abs(x))[normal].max() <= 2.0 ** -4 * (1 + 1e-12)
        c32, s32 = quantize_state(x, dt, scale_dtype=np.float32)
        assert s32.dtype == np.float32
        assert np.array_equal(s32, np.abs(x.astype(np.float32)).max(axis=-2) / np.float32(Q))
        v32 = dequantize_state(c32, s32, dt)
        assert np.abs(v32 - vals).max() <= np.max(scales) * (1 if dt == "i8" else 32) + 1e-12
        assert np.mean(c32 != codes) < 0.01
    # a column's outlier leaves the other columns' codes alone
    y = x.copy()
    y[..., 4, 2] = 1e6
    for dt in ("i8", "f8e4m3"):
        c1, _ = quantize_state(x, dt)
        c2, _ = quantize_state(y, dt)
        cols = [0, 1, 3, 4]
        assert np.array_equal(c1[..., cols], c2[..., cols])


def test_stochastic_rounding_unbiased():
    """Stochastic rounding: every result is one of the two neighbours of x; the mean of n draws
    is x within 5 standard deviations of a mean of n Bernoulli draws (p = distance / spacing);
    round to nearest is one of the neighbours as well."""
    rng = np.random.default_rng(11)
    n, K, V = 4000, 16, 4
    row = rng.standard_normal((K, V))
    row[3, 1] = 0.0
    finite = np.sort(np.unique(e4m3_to_float(np.arange(256))[~np.isnan(e4m3_to_float(np.arange(256)))]))
    for dt, Q in (("i8", 127.0), ("f8e4m3", 448.0)):
        x = np.broadcast_to(row, (n, K, V))
        vals = round_state(x, dt, rng=rng)
        scale = np.abs(row).max(axis=0) / Q
        y = row / scale
        if dt == "i8":
            lo, hi = np.floor(y), np.ceil(y)
        else:
            lo = finite[np.searchsorted(finite, y, side="right") - 1]
            hi = finite[np.searchsorted(finite, y, side="left")]
        lo, hi = lo * scale, hi * scale
        assert np.all((vals == lo) | (vals == hi)), dt
        width = hi - lo
        p = np.where(width > 0, (row - lo) / np.where(width > 0, width, 1), 0)
        sigma = width * np.sqrt(p * (1 - p) / n)
        assert np.all(np.abs(vals.mean(axis=0) - row) <= 5 * sigma + 1e-12), dt
        assert np.all(vals[:, 3, 1] == 0.0)
        rne = round_state(row, dt)
        assert np.all((rne == lo) | (rne == hi))
        # both neighbours occur wherever the value is off the grid
        off = width > 0
        assert np.all((vals == lo[None]).any(axis=0)[off] & (vals == hi[None]).any(axis=0)[off])
    b = round_state(np.full(n, 1 + 2.0 ** -9), "bf16", rng=rng)  # a quarter of the way from 1 to 1 + 2^-7
    assert set(b) == {1.0, 1 + 2.0 ** -7} and abs(b.mean() - (1 + 2.0 ** -9)) < 5 * 2.0 ** -7 * np.sqrt(3 / 16 / n)


def test_delta_rule_8bit_states():
    """gated_delta_rule with an 8-bit state: outputs of the call as without rounding, each stored state
    the exact one rounded once with a scale per (v-head, v), a later call from the stored value;
    with state_rng the stored state is one of the two neighbours per element."""
    rng = np.random.default_rng(5)
    H, HV, K, V, T = 1, 2, 8, 4, 5
    qkv = rng.standard_normal((T, 2 * H * K + HV * V))
    g, beta = -rng.uniform(0.01, 1, (T, HV)), rng.uniform(0, 1, (T, HV))
    ssm0 = rng.standard_normal((3, HV, K, V))
    pre = dict(num_prefills=1, num_actual_tokens=T, non_spec_query_start_loc=[0, T], non_spec_state_indices=[1],
               non_spec_read_state_indices=[0], has_initial_state=[1])
    o, s = gated_delta_rule(qkv, g, beta, ssm0, pre, H, HV, K, V)
    for dt, Q in (("i8", 127.0), ("f8e4m3", 448.0)):
        o8, s8 = gated_delta_rule(qkv, g, beta, ssm0, pre, H, HV, K, V, state_dtype=dt)
        assert np.array_equal(o8, o) and np.array_equal(s8[[0, 2]], ssm0[[0, 2]])
        assert np.array_equal(s8[1], round_state(s[1], dt))
        codes, scales = quantize_state(s[1], dt)
        assert scales.shape == (HV, V) and np.array_equal(scales, np.abs(s[1]).max(axis=1) / Q)
        assert np.abs(s8[1] - s[1]).max() > 0
        # a decode from the stored state: its first token sees the rounded state
        dec = dict(num_decodes=1, num_actual_tokens=1, non_spec_query_start_loc=[0, 1], non_spec_state_indices=[2],
                   non_spec_read_state_indices=[1])
        od, _ = gated_delta_rule(qkv[:1], g[:1], beta[:1], s8, dec, H, HV, K, V, state_dtype=dt)
        oe, _ = gated_delta_rule(qkv[:1], g[:1], beta[:1], s8, dec, H, HV, K, V)
        assert np.array_equal(od, oe)
        osr, ssr = gated_delta_rule(qkv, g, beta, ssm0, pre, H, HV, K, V, state_dtype=dt, state_rng=rng)
        assert np.array_equal(osr, o)
        lo = round_state(s[1], dt, rng=_Edge(0.0))
        hi = round_state(s[1], dt, rng=_Edge(1 - 2.0 ** -40))
        assert np.all((ssr[1] == lo) | (ssr[1] == hi)) and np.all(lo <= s[1] + 1e-12) and np.all(s[1] <= hi + 1e-12)


def test_spec_write_backs_8bit():
    """Spec decodes with an 8-bit state: the state after each token goes to its column rounded once
    (a scale per (v-head, v) of that state), the outputs are the unrounded run's, and the next call
    continues from the accepted token's stored state."""
    rng = np.random.default_rng(9)
    H, HV, K, V, NS = 1, 2, 8, 4, 2
    qkv = rng.standard_normal((6, 2 * H * K + HV * V))
    g, beta = -rng.uniform(0.01, 1, (6, HV)), rng.uniform(0, 1, (6, HV))
    ssm0 = rng.standard_normal((8, HV, K, V))
    spec = lambda cols, A: dict(num_spec_decodes=1, num_spec=NS, num_actual_tokens=3,  # noqa: E731
                                spec_query_start_loc=[0, 3], spec_state_indices=[cols], num_accepted_tokens=[A])
    for dt in ("i8", "f8e4m3"):
        o, s = gated_delta_rule(qkv[:3], g[:3], beta[:3], ssm0, spec([1, 2, 3], 1), H, HV, K, V)
        o8, s8 = gated_delta_rule(qkv[:3], g[:3], beta[:3], ssm0, spec([1, 2, 3], 1), H, HV, K, V, state_dtype=dt)
        assert np.array_equal(o8, o)
        for c in (1, 2, 3):
            assert np.array_equal(s8[c], round_state(s[c], dt)) and np.abs(s8[c] - s[c]).max() > 0
        # the next call with A = 2 reads its cols[1] = 2 (the state after the second token), as stored
        o2, _ = gated_delta_rule(qkv[3:], g[3:], beta[3:], s8, spec([4, 2, 5], 2), H, HV, K, V, state_dtype=dt)
        o2e, _ = gated_delta_rule(qkv[3:], g[3:], beta[3:], s8, spec([4, 2, 5], 2), H, HV, K, V)
        assert np.array_equal(o2, o2e)
        o2x, _ = gated_delta_rule(qkv[3:], g[3:], beta[3:], s, spec([4, 2, 5], 2), H, HV, K, V)
        assert 0 < np.abs(o2 - o2x).max() < 0.1, "the rounded start changes the outputs a little"
