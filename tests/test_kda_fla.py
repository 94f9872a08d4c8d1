"""KDA against FLA's own naive reference, called from the installed flash-linear-attention package
(fla-core: fla.ops.kda.naive.naive_recurrent_kda, fla.ops.kda.gate.naive_kda_gate and
naive_kda_lowerbound_gate), on shapes and inputs of FLA's tests/ops/test_kda.py: outputs and final
states of pygdn.gated_delta_rule with the gates given (g, beta) or raw (a, b, A_log, dt_bias, the
lower-bound form too), q/k normalized by the caller or by the library as FLA's call does, each
sequence a prefill (the chunked form and the token recurrence) or a run of decode steps.

Optional: it needs torch and fla, which the main suite does not install; it skips, saying why, when
either cannot be imported. How to install them and run it: docs/usage.md "Optional tests: KDA against FLA"."""
import numpy as np
import pytest

try:
    import torch
    import torch.nn.functional as F
    from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate
    from fla.ops.kda.naive import naive_recurrent_kda
except Exception as e:  # noqa: BLE001 (any failure to import them: the test cannot run here)
    pytest.skip(f"FLA's naive KDA reference cannot be imported ({type(e).__name__}: {e}); it needs torch and "
                f"flash-linear-attention (fla-core, which imports triton): see docs/usage.md \"Optional tests: KDA against FLA\"",
                allow_module_level=True)

import pygdn
from pygdn.batch import make_batch, to_device
from helpers import assert_close, usm

# FLA's tests/ops/test_kda.py shapes: (B, T, H, D, scale, gate_logit_normalizer, use_qk_l2norm_in_kernel)
# of test_fused_recurrent; gates as its test_chunk's use_gate_in_kernel cases (raw g, A_log [H],
# dt_bias [H*D]) on (B, T, H, D, scale); test_chunk_varlen's (H, D, mask_p, cu_seqlens,
# use_gate_in_kernel, safe_gate).
RECURRENT_SHAPES = [(1, 64, 1, 64, 1, 1, False), (2, 512, 3, 60, 1, 1, False), (3, 1000, 4, 100, 0.1, 1, True),
                    (4, 1024, 4, 128, 0.1, 1, False)]
GATE_SHAPES = [(2, 1500, 4, 128, 0.1), (4, 2048, 8, 64, 0.1)]
VARLEN = [(4, 60, 0.1, [0, 15], True, False), (4, 64, 0.9, [0, 256, 500, 1000], True, False),
          (4, 128, 0.5, [0, 256, 500, 1000], False, False), (4, 100, 0, [0, 15, 100, 300, 1200, 2000], True, False),
          (4, 256, 0, [0, 100, 300, 1200, 3000, 4096], False, True)]
TOL = 1e-4  # f32 against f32: both sides run the same recurrence in a different order


def _np(t):
    return t.detach().to(torch.float32).contiguous().numpy()


def _run(queue, *, q, k, v, h0, lens, scale, l2norm, path, gates):
    """pygdn.gated_delta_rule on sequences of `lens` tokens laid out one after another (q, k [T, H, D],
    v [T, H, D], h0 [N, H, D, D] as FLA's [B, HV, K, V] state), as prefills with initial states
    (path "chunk": the library's choice; "recurrent": cfg.force_recurrent) or as one decode step per
    token (path "decode"). gates: dict(g=[T, H, D], beta=[T, H]) or dict(a=, b=, A_log=, dt_bias=,
    lower_bound=). Returns (o [T, H, D], final states [N, H, D, D])."""
    T, H, D = q.shape
    N = len(lens)
    gates = dict(gates)
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=H, head_k_dim=D, head_v_dim=D, num_slots=N, act_dtype="f32",
                       ssm_layout="kv", gate_mode="channel", out_gate="sigmoid", scale=scale,
                       no_qk_l2norm=not l2norm, gate_lower_bound=gates.pop("lower_bound", 0.0),
                       force_recurrent=path == "recurrent")
    rows = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], axis=1).astype(np.float32)
    per_row = {n: np.ascontiguousarray(x.reshape(T, -1), np.float32) for n, x in gates.items()
               if n in ("g", "beta", "a", "b")}
    params = {n: usm(queue, np.ascontiguousarray(x, np.float32).reshape(-1)) for n, x in gates.items()
              if n in ("A_log", "dt_bias")}
    d_ssm = usm(queue, np.ascontiguousarray(h0, np.float32))
    out = np.zeros((T, H, D))
    starts = np.concatenate([[0], np.cumsum(lens)])
    rng = np.random.default_rng(0)
    # Sequence i reads and writes slot i (FLA's initial_state[i] and final state [i]).
    if path == "decode":  # step t: token t of every sequence still running, one decode each
        live = [[i for i, L in enumerate(lens) if t < L] for t in range(max(lens))]
        steps = [[int(starts[i] + t) for i in seqs] for t, seqs in enumerate(live)]
        metas = [dict(make_batch(rng, num_slots=N, num_decodes=len(seqs), order="grouped", identity_indices=True),
                      non_spec_state_indices=np.array(seqs, np.int32)) for seqs in live]
    else:
        steps = [list(range(T))]
        meta = make_batch(rng, num_slots=N, prefill_lens=list(lens), has_initial_state=[1] * N, order="grouped",
                          identity_indices=True)
        metas = [dict(meta, non_spec_state_indices=np.arange(N, dtype=np.int32))]
    for idx, meta in zip(steps, metas):
        d_out = usm(queue, np.zeros((len(idx), H, D), np.float32))
        pygdn.gated_delta_rule(queue, cfg, to_device(meta, queue), conv_out=usm(queue, rows[idx]), ssm_state=d_ssm,
                               core_attn_out=d_out, **{n: usm(queue, x[idx]) for n, x in per_row.items()}, **params)
        out[idx] = d_out.to_numpy()
    return out, d_ssm.to_numpy()


def _fla_inputs(B, T, H, D, normalizer):
    """FLA's test_fused_recurrent inputs (torch.manual_seed(42), f32)."""
    torch.manual_seed(42)
    q, k, v = (torch.rand(B, T, H, D, dtype=torch.float) for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H, D, dtype=torch.float)) / normalizer
    beta_logit = torch.randn(B, T, H, dtype=torch.float)
    h0 = torch.randn(B, H, D, D, dtype=torch.float32)
    return q, k, v, g, beta_logit, h0


def _flat(x):
    """[B, T, ...] -> [B*T, ...] numpy (the sequences one after another)."""
    return _np(x.reshape(-1, *x.shape[2:]))


PATHS = ["chunk", "recurrent", "decode"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("B,T,H,D,scale,normalizer,l2norm_in_kernel", RECURRENT_SHAPES,
                         ids=[f"B{s[0]}-T{s[1]}-H{s[2]}-D{s[3]}-scale{s[4]}-l2norm{s[6]}" for s in RECURRENT_SHAPES])
def test_fla_naive_recurrent_kda(queue, path, B, T, H, D, scale, normalizer, l2norm_in_kernel):
    """g and beta given; q, k normalized by the library where FLA's call has use_qk_l2norm_in_kernel."""
    if path == "decode" and B * T > 1024:
        pytest.skip("decode path: one call per token, run on the shorter shapes")
    q, k, v, g, beta_logit, h0 = _fla_inputs(B, T, H, D, normalizer)
    beta = beta_logit.sigmoid()
    qn, kn = F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1)
    want_o, want_s = naive_recurrent_kda(q=qn, k=kn, v=v, g=g, beta=beta, scale=scale, initial_state=h0,
                                         output_final_state=True)
    qi, ki = (q, k) if l2norm_in_kernel else (qn, kn)
    got_o, got_s = _run(queue, q=_flat(qi), k=_flat(ki), v=_flat(v), h0=_np(h0), lens=[T] * B, scale=scale,
                        l2norm=l2norm_in_kernel, path=path, gates=dict(g=_flat(g), beta=_flat(beta)))
    assert_close(got_o, _flat(want_o), TOL, "o")
    assert_close(got_s, _np(want_s), TOL, "final state")


@pytest.mark.parametrize("path", PATHS[:2])
@pytest.mark.parametrize("lower_bound", [0.0, -5.0])
@pytest.mark.parametrize("B,T,H,D,scale", GATE_SHAPES, ids=[f"B{s[0]}-T{s[1]}-H{s[2]}-D{s[3]}" for s in GATE_SHAPES])
def test_fla_naive_kda_gate(queue, path, lower_bound, B, T, H, D, scale):
    """Raw gates (a = FLA's g, A_log [H], dt_bias [H*D], b = beta's logits) through the library's gate,
    against naive_kda_gate (lower_bound 0) or naive_kda_lowerbound_gate (lower_bound -5) feeding FLA's
    naive recurrence; q, k normalized by the library."""
    torch.manual_seed(42)
    q, k, v = (torch.rand(B, T, H, D, dtype=torch.float) for _ in range(3))
    g_raw = torch.randn(B, T, H, D, dtype=torch.float)
    A_log, dt_bias = torch.randn(H, dtype=torch.float), torch.randn(H * D, dtype=torch.float)
    beta_logit = torch.randn(B, T, H, dtype=torch.float)
    h0 = torch.randn(B, H, D, D, dtype=torch.float32)
    g = (naive_kda_lowerbound_gate(g_raw, A_log, dt_bias, lower_bound=lower_bound) if lower_bound
         else naive_kda_gate(g_raw, A_log, dt_bias))
    want_o, want_s = naive_recurrent_kda(q=F.normalize(q, p=2, dim=-1), k=F.normalize(k, p=2, dim=-1), v=v, g=g,
                                         beta=beta_logit.sigmoid(), scale=scale, initial_state=h0,
                                         output_final_state=True)
    got_o, got_s = _run(queue, q=_flat(q), k=_flat(k), v=_flat(v), h0=_np(h0), lens=[T] * B, scale=scale, l2norm=True,
                        path=path, gates=dict(a=_flat(g_raw), b=_flat(beta_logit), A_log=_np(A_log),
                                              dt_bias=_np(dt_bias), lower_bound=lower_bound))
    assert_close(got_o, _flat(want_o), TOL, "o")
    assert_close(got_s, _np(want_s), TOL, "final state")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("H,D,mask_p,cu,gate_in_kernel,safe_gate", VARLEN,
                         ids=[f"H{c[0]}-D{c[1]}-mask_p{c[2]}-N{len(c[3]) - 1}-gate{c[4]}-safe_gate{c[5]}"
                              for c in VARLEN])
def test_fla_naive_kda_varlen(queue, path, H, D, mask_p, cu, gate_in_kernel, safe_gate):
    """test_chunk_varlen's batches: sequences of different lengths in one call, each with its own
    initial state; k normalized by the caller, q by the library (FLA's reference normalizes it), the
    default scale. Gates given (log decays; -1000 on a mask_p share of the channels: decay 0 there;
    safe_gate: clamped to [-5, 0]) or raw (A_log, dt_bias; -1000 raw: decay 1 there)."""
    if path == "decode" and cu[-1] > 1024:
        pytest.skip("decode path: one call per token, run on the shorter batches")
    lens = list(np.diff(cu))
    torch.manual_seed(42)
    T, N = cu[-1], len(lens)
    q = torch.randn(1, T, H, D, dtype=torch.float)
    k = F.normalize(torch.randn(1, T, H, D, dtype=torch.float32), p=2, dim=-1)
    v = torch.randn(1, T, H, D, dtype=torch.float)
    g = torch.randn(1, T, H, D, dtype=torch.float)
    if gate_in_kernel:
        A_log = torch.log(torch.randn(1, 1, H, 1, dtype=torch.float32).uniform_(1, 16))
        dt_bias = torch.randn(H * D, dtype=torch.float32)
    else:
        g = F.logsigmoid(g)
        g = g * (torch.rand_like(g) > mask_p)
    mask = torch.rand_like(g) > mask_p
    g = g * mask + (~mask) * (-1000)
    if safe_gate:
        g = g.clamp(-5, 0)
    beta = torch.rand(1, T, H, dtype=torch.float).sigmoid()
    h0 = torch.randn(N, H, D, D, dtype=torch.float32)
    g_log = naive_kda_gate(g, A_log, dt_bias) if gate_in_kernel else g
    outs, states = [], []
    for i in range(N):
        s = slice(cu[i], cu[i + 1])
        o, st = naive_recurrent_kda(q=F.normalize(q[:, s], p=2, dim=-1), k=k[:, s], v=v[:, s], g=g_log[:, s],
                                    beta=beta[:, s], initial_state=h0[i], output_final_state=True)
        outs.append(_flat(o))
        states.append(_np(st))
    gates = (dict(a=_flat(g), b=_np(torch.logit(beta.reshape(T, H).double())), A_log=_np(A_log.reshape(-1)),
                  dt_bias=_np(dt_bias)) if gate_in_kernel else dict(g=_flat(g), beta=_flat(beta)))
    got_o, got_s = _run(queue, q=_flat(q), k=_flat(k), v=_flat(v), h0=_np(h0), lens=lens, scale=0.0, l2norm=True,
                        path=path, gates=gates)
    assert_close(got_o, np.concatenate(outs), TOL, "o")
    assert_close(got_s, np.concatenate(states), TOL, "final states")
