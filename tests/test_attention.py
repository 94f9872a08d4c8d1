"""gdn_attention (conv -> gates -> delta rule -> optional gated RMSNorm) on randomized mixed
batches against the float64 reference, and a multi-step MTP simulation checked against the
plain recurrence over the accepted tokens only."""
import numpy as np
import pytest

import pygdn
from pygdn import reference as ref
from pygdn.batch import make_batch, to_device
from helpers import assert_close, quantize, usm
from op_checks import Layer, random_case, run_mixed_batch


@pytest.mark.parametrize("seed", range(32))
def test_mixed_batch_matches_reference(queue, seed):
    run_mixed_batch(queue, seed)


def single_sequence(layer, x, a, b):
    """Reference over ONE sequence from zero states: outputs of every token, final states."""
    H, HV, K, V = (layer.cfg.num_k_heads, layer.cfg.num_v_heads, layer.cfg.head_k_dim, layer.cfg.head_v_dim)
    n, C = len(x), layer.cfg.conv_dim
    meta = dict(num_prefills=1, num_actual_tokens=n, non_spec_token_count=n,
                non_spec_query_start_loc=np.array([0, n], np.int32), non_spec_state_indices=np.array([0], np.int32),
                has_initial_state=np.array([0], np.uint8), non_spec_token_indx=None)
    conv0 = np.zeros((1, C, layer.cfg.state_len))
    ssm0 = np.zeros((1, HV, K, V))
    o, conv, ssm = ref.gdn_attention(x, a, b, layer.w, layer.bias, layer.A_log, layer.dt_bias, conv0, ssm0, meta,
                                     H, HV, K, V)
    return o, conv[0], ssm[0]


@pytest.mark.parametrize("conv_spec_layout", ["rolled", "snapshot"])
@pytest.mark.parametrize("ssm_layout", ["vk", "kv"])
def test_mtp_simulation(queue, conv_spec_layout, ssm_layout):
    """Prefill 3 requests, then 5 speculative steps with random acceptance (plus a plain decode
    request in every step). After each step, the states a scheduler would continue from and the
    outputs of the accepted tokens equal the plain recurrence over the accepted tokens only."""
    rng = np.random.default_rng(77)
    H, HV, K, V, W, S = 1, 2, 16, 16, 4, 2
    reqs, cols = 3, S + 1
    num_slots = reqs * cols + 1  # + the decode request's slot
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=num_slots, conv_width=W,
                       act_dtype="f32", ssm_layout=ssm_layout, conv_layout="time_major",
                       conv_spec_layout=conv_spec_layout, conv_state_len=W - 1 + S)
    layer = Layer(queue, rng, cfg)
    C = cfg.conv_dim
    blocks = rng.permutation(reqs * cols).reshape(reqs, cols).astype(np.int32)  # each request's slots
    dec_slot = np.int32(reqs * cols)
    new_tok = lambda n: (rng.standard_normal((n, C)).astype(np.float32), rng.standard_normal((n, HV)).astype(np.float32),
                         rng.standard_normal((n, HV)).astype(np.float32))
    hist = [new_tok(int(n)) for n in (70, 5, 130)]  # accepted tokens so far per request: (x, a, b)
    dec_hist = new_tok(3)

    # Step 0: prefill the three requests and the decode request's prompt into slot column 0.
    lens = [len(h[0]) for h in hist] + [3]
    cat = lambda parts, i: np.concatenate([p[i] for p in parts])
    x, a, b = (cat(hist + [dec_hist], i) for i in range(3))
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    meta = dict(num_prefills=4, num_actual_tokens=int(qsl[-1]), non_spec_token_count=int(qsl[-1]),
                non_spec_query_start_loc=qsl, non_spec_state_indices=np.array(list(blocks[:, 0]) + [dec_slot], np.int32),
                has_initial_state=np.zeros(4, np.uint8), non_spec_token_indx=None, pad_slot_id=-1)
    layer.step(meta, x, a, b)
    accepted = np.ones(reqs, np.int32)

    for step in range(5):
        L = rng.integers(1, cols + 1, reqs)                    # ragged: some requests carry fewer drafts
        toks = [new_tok(int(n)) for n in L]
        dtok = new_tok(1)
        T = int(L.sum()) + 1
        rows = rng.permutation(T).astype(np.int32)              # interleave everything
        s_qsl = np.concatenate([[0], np.cumsum(L)]).astype(np.int32)
        X = np.zeros((T, C), np.float32); A = np.zeros((T, HV), np.float32); B = np.zeros((T, HV), np.float32)
        X[rows[:-1]], A[rows[:-1]], B[rows[:-1]] = (cat(toks, i) for i in range(3))
        X[rows[-1]], A[rows[-1]], B[rows[-1]] = dtok[0][0], dtok[1][0], dtok[2][0]
        meta = dict(num_decodes=1, num_spec_decodes=reqs, num_spec=S, num_actual_tokens=T, non_spec_token_count=1,
                    spec_token_count=T - 1, pad_slot_id=-1, non_spec_query_start_loc=np.array([0, 1], np.int32),
                    non_spec_state_indices=np.array([dec_slot], np.int32), has_initial_state=None,
                    non_spec_token_indx=rows[-1:].copy(), spec_query_start_loc=s_qsl, spec_state_indices=blocks,
                    num_accepted_tokens=accepted, spec_token_indx=rows[:-1].copy())
        out = layer.step(meta, X, A, B)
        ssm, conv = layer.ssm_state(), layer.conv_state()
        new_accepted = np.array([rng.integers(1, int(n) + 1) for n in L], np.int32)
        for r in range(reqs):
            o_all, _, _ = single_sequence(layer, *(np.concatenate([hist[r][i], toks[r][i]]) for i in range(3)))
            n_hist = len(hist[r][0])
            got = out[rows[s_qsl[r]:s_qsl[r + 1]]]
            assert_close(got, o_all[n_hist:], 2e-4, f"step {step} request {r}: outputs of its {L[r]} tokens")
            acc = int(new_accepted[r])
            hist[r] = tuple(np.concatenate([hist[r][i], toks[r][i][:acc]]) for i in range(3))
            _, conv_ref, ssm_ref = single_sequence(layer, *hist[r])
            assert_close(ssm[blocks[r, acc - 1]], ssm_ref, 2e-4, f"step {step} request {r}: state after {acc} accepted")
            if conv_spec_layout == "rolled":
                window = conv[blocks[r, 0]][:, acc - 1: acc - 1 + W - 1]
            else:
                window = conv[blocks[r, acc - 1]][:, : W - 1]
            np.testing.assert_array_equal(window, conv_ref[:, : W - 1], err_msg=f"step {step} request {r}: conv window")
        dec_hist = tuple(np.concatenate([dec_hist[i], dtok[i]]) for i in range(3))
        o_dec, _, ssm_dec = single_sequence(layer, *dec_hist)
        assert_close(out[rows[-1]], o_dec[-1], 2e-4, f"step {step}: decode request output")
        assert_close(ssm[dec_slot], ssm_dec, 2e-4, f"step {step}: decode request state")
        accepted = new_accepted


def test_out_of_order_queue_matches_in_order(queue):
    """dpctl queues are out-of-order by default: the library chains its kernels with events and
    waits before returning, so results equal the in-order queue's bit for bit."""
    import dpctl
    ooo = dpctl.SyclQueue(queue.sycl_context, queue.sycl_device)
    assert not ooo.is_in_order
    results = []
    for q in (queue, ooo):
        rng, kw, layout, (H, HV, K, V), with_z = random_case(4)
        meta = make_batch(rng, num_slots=64, **kw)
        cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=64,
                           conv_state_len=3 + meta["num_spec"], **layout)
        layer = Layer(q, rng, cfg, with_z=with_z)
        T = meta["num_actual_tokens"]
        x_s, _ = quantize(rng.standard_normal((T, cfg.conv_dim)), cfg.act_dtype)
        a_s, _ = quantize(rng.standard_normal((T, HV)), cfg.act_dtype)
        b_s, _ = quantize(rng.standard_normal((T, HV)), cfg.act_dtype)
        z_s = quantize(rng.standard_normal((T, HV, V)), cfg.act_dtype)[0] if with_z else None
        results.append((layer.step(meta, x_s, a_s, b_s, z_s), layer.ssm_state(), layer.conv_state()))
    for a, b in zip(results[0], results[1]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("act_dtype,conv_layout,ssm_layout,V", [  # kernel builds other tests make
    ("f32", "time_major", "vk", 16), ("bf16", "dim_major", "vk", 16), ("f32", "time_major", "kv", 32),
    ("f32", "dim_major", "kv", 32), ("f32", "time_major", "vk", 8)])
def test_step_without_prefills_fused_equals_op_by_op(queue, act_dtype, conv_layout, ssm_layout, V):
    """On the CPU device a step without prefills runs each token group's conv and recurrence as ONE
    kernel (gdn_fused_cpu, plan.cpp), a work-item per (sequence, k-head); gdn_causal_conv1d then
    gdn_gated_delta_rule run the same code as separate kernels. Outputs, conv_out, conv and SSM
    states must agree bit for bit: two k-heads of two v-heads each (and, V = 8, of one v-head: 8 v
    channels a k-head, which the fused conv's 16-channel blocks cannot split, so the plan fuses
    nothing); decodes with and without an initial state, one reading another slot and one reading
    pad (read slots), a checkpoint at a block boundary, graph padding, spec sequences (their own
    fused launch; conv spec layouts rolled and snapshot); both ssm layouts (kv: V = 32, two
    16-column groups a head); conv states time-major and dim-major with exactly W-1 columns (the
    CPU conv's window moves). The reference checks of the fused kernels are
    test_mixed_batch_matches_reference's steps without prefills and test_mtp_simulation's steps."""
    rng = np.random.default_rng(300)
    H, K, W, S, num_slots = 2, 16, 4, 2, 32
    HV = 2 if V == 8 else 4  # V = 8: a k-head's v channels are 8, not whole 16-channel blocks (not fused)
    meta = make_batch(rng, num_slots=num_slots, num_decodes=5, spec_lens=[3, 2], num_spec=S, accepted=[2, 3],
                      has_initial_state=[1, 0, 1, 1, 1, 1], pad_non_spec=1, pad_len=1, order="random")
    used = set(meta["non_spec_state_indices"].tolist()) | set(meta["spec_state_indices"].ravel().tolist())
    free = [s for s in range(num_slots) if s not in used]
    reads = meta["non_spec_state_indices"].copy()
    reads[0], reads[2] = free[0], -1
    meta.update(non_spec_read_state_indices=reads, checkpoint_interval=64, checkpoint_cols=1,
                non_spec_start_pos=np.array([63, 0, 10, 127, 5, 0], np.int32),
                checkpoint_state_indices=np.array([free[1], -1, -1, free[2], -1, -1], np.int32))
    dim_major = conv_layout == "dim_major"
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=num_slots, conv_width=W,
                       act_dtype=act_dtype, ssm_layout=ssm_layout, conv_layout=conv_layout,
                       conv_spec_layout="snapshot" if dim_major else "rolled",
                       conv_state_len=W - 1 if dim_major else W - 1 + S)
    T, C = meta["num_actual_tokens"], cfg.conv_dim
    q = lambda shape, scale=1.0: usm(queue, quantize(rng.standard_normal(shape) * scale, act_dtype)[0])
    x, a, b, w, bias = q((T, C)), q((T, HV)), q((T, HV)), q((C, W), 0.5), q(C, 0.1)
    A_log = usm(queue, np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32))
    dt_bias = usm(queue, rng.uniform(-1, 1, HV).astype(np.float32))
    conv0 = quantize(rng.standard_normal((num_slots, C, cfg.state_len) if dim_major else
                                         (num_slots, cfg.state_len, C)), act_dtype)[0]
    ssm0 = (rng.standard_normal((num_slots, HV, V, K)) * 0.5).astype(np.float32)  # (either layout: same bytes)
    batch = to_device(meta, queue)
    runs = []
    for fused in (True, False):
        conv, ssm = usm(queue, conv0), usm(queue, ssm0)
        out = usm(queue, quantize(np.full((T + 1, HV, V), 5.0), act_dtype)[0])  # + a canary row
        conv_out = usm(queue, quantize(np.full((T, C), 5.0), act_dtype)[0])  # every row written, padding's as 0
        if fused:
            pygdn.attention(queue, cfg, batch, mixed_qkv=x, a=a, b=b, conv_weight=w, conv_bias=bias, A_log=A_log,
                            dt_bias=dt_bias, conv_state=conv, ssm_state=ssm, core_attn_out=out, conv_out=conv_out)
        else:
            pygdn.causal_conv1d(queue, cfg, batch, mixed_qkv=x, conv_weight=w, conv_bias=bias, conv_state=conv,
                                conv_out=conv_out)
            pygdn.gated_delta_rule(queue, cfg, batch, conv_out=conv_out, ssm_state=ssm, core_attn_out=out, a=a, b=b,
                                   A_log=A_log, dt_bias=dt_bias)
        runs.append([r.to_numpy() for r in (out, conv_out, conv, ssm)])
    for name, f, o in zip(["core_attn_out", "conv_out", "conv_state", "ssm_state"], *runs):
        assert np.array_equal(f.view(np.uint8), o.view(np.uint8)), f"{name}: fused step differs from op by op"
    assert not np.array_equal(runs[0][3], ssm0), "the step changed no state"
