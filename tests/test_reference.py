"""pygdn/reference.py checked against itself, so that the suite's float64 reference is a reference:
its chunked and recurrent forms, its batched op and its single-head walks, MTP steps against one
prefill, and the state-cache rules (read slots, block checkpoints, rounding once per store)."""
import numpy as np

from pygdn.reference import (causal_conv1d, chunked_gated_delta_rule, gated_delta_rule, gated_rmsnorm, gates,
                             gdn_attention, l2norm, recurrent_single, round_state)


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
