"""Accuracy of the SSM state dtypes: the 8-bit states (i8 and f8e4m3, a scale per state row, round
to nearest even or stochastic) and bf16 against an unrounded float64 state (the f32 state's
model), on the same inputs. numpy only: the math is pygdn/reference.py's (round_state, gates,
l2norm, gated_rmsnorm), loaded from this checkout by path, so no compiled library is needed.

Runs (Qwen3-Next head shapes K = V = 128, two v-heads per k-head; a subset of the 32 v-heads of a
layer at TP1, printed in the table's heading):
  decode  one token per call, every state stored (rounded) after each token; errors after N steps
  mtp     spec decodes with num_spec = 3: a call runs 1 + 3 tokens from the stored state of the
          previous call's accepted token, acceptance cycling 1, 2, 3, 4; the states after rejected
          tokens are stored too but never read, so they are not computed
  stack   decode through a stack of GDN layers: each layer's gated-RMS-normed output goes through a
          fixed random projection into a residual stream whose RMS norm is the next layer's input
Gates: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), A_log = log U(1, 16) per head,
dt_bias ~ N(0, 0.1^2), a, b ~ N(0, 1) ("gates N(0,1)": a head's median decay e^g is 0.5 at
A_log = 0 down to 1.5e-5 at A_log = log 16); the "long memory" rows shift a by -6 (median decays
0.9975 .. 0.96). q, k l2-normalized, q scaled by K^-0.5, v ~ N(0, 1).
Errors: ||x - x_ref||_F / ||x_ref||_F over the simulated heads; o over the last 128 tokens
(decode, stack) or the accepted tokens of the last 128 calls (mtp) before the step count, S at it.

    python benchmarks/state_precision.py --quick    # under a minute
    python benchmarks/state_precision.py            # the table in docs/op.md (~6 minutes on one core)
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

_spec = importlib.util.spec_from_file_location(
    "gdn_reference", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pygdn", "reference.py"))
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

K = V = 128
WINDOW = 128
# (column, state dtype, stochastic rounding); the unrounded float64 state is the baseline
CONFIGS = [("bf16", "bf16", False), ("i8", "i8", False), ("i8 SR", "i8", True),
           ("f8e4m3", "f8e4m3", False), ("f8e4m3 SR", "f8e4m3", True)]


def step(S, q, k, v, g, beta):
    """One token of the gated delta rule for a batch of states, in place: S [n, HV, K, V];
    q, k [HV, K] or [n, HV, K]; v [.., HV, V]; g, beta [.., HV]. Returns o [n, HV, V]
    (reference._delta_step per head, batched)."""
    S *= np.exp(g)[..., None, None]
    u = beta[..., None] * (v - np.einsum("...hkv,...hk->...hv", S, k))
    S += k[..., :, None] * u[..., None, :]
    return np.einsum("...hkv,...hk->...hv", S, q)


def store(S, rngs):
    """Every config's state (S[1:]) as stored in its dtype; S[0] is the unrounded baseline."""
    for c, (_, dtype, sr) in enumerate(CONFIGS):
        S[c + 1] = ref.round_state(S[c + 1], dtype, rngs[c] if sr else None)


def head_params(rng, HV):
    return np.log(rng.uniform(1, 16, HV)), 0.1 * rng.standard_normal(HV)


def tokens(rng, T, H, HV, A_log, dt_bias, a_shift):
    """T tokens of inputs: q, k [T, HV, K] (k-head h // (HV // H)), v [T, HV, V], g, beta [T, HV]."""
    grp = HV // H
    q = ref.l2norm(rng.standard_normal((T, H, K))) * K ** -0.5
    k = ref.l2norm(rng.standard_normal((T, H, K)))
    v = rng.standard_normal((T, HV, V))
    g, beta = ref.gates(rng.standard_normal((T, HV)) + a_shift, rng.standard_normal((T, HV)), A_log, dt_bias)
    return np.repeat(q, grp, axis=1), np.repeat(k, grp, axis=1), v, g, beta


def rel(x, x0):
    return np.sqrt(np.sum((x - x0) ** 2, axis=tuple(range(1, x.ndim))) / np.sum(x0 ** 2))


class Window:
    """Sums of squared output errors over a sliding window of tokens, per config."""
    def __init__(self):
        self.items = []

    def add(self, o):  # o [1 + configs, ...]
        self.items.append((np.sum((o[1:] - o[:1]) ** 2, axis=tuple(range(1, o.ndim))), np.sum(o[0] ** 2)))
        self.items = self.items[-WINDOW:]

    def err(self):
        return np.sqrt(sum(e for e, _ in self.items) / sum(r for _, r in self.items))


def check_step(rng):
    """The batched step against reference.recurrent_single."""
    A_log, dt_bias = head_params(rng, 2)
    q, k, v, g, beta = tokens(rng, 20, 1, 2, A_log, dt_bias, 0.0)
    S0 = rng.standard_normal((2, K, V))
    S = S0[None].copy()
    o = np.stack([step(S, q[t], k[t], v[t], g[t], beta[t])[0] for t in range(20)])
    for h in range(2):
        o_ref, s_ref = ref.recurrent_single(q[:, h], k[:, h], v[:, h], g[:, h], beta[:, h], S0[h])
        assert np.abs(o[:, h] - o_ref).max() < 1e-12 and np.abs(S[0, h] - s_ref).max() < 1e-12


def run_decode(seed, H, HV, steps, marks, a_shift):
    rng = np.random.default_rng(seed)
    rngs = [np.random.default_rng(seed + 100 + c) for c in range(len(CONFIGS))]
    A_log, dt_bias = head_params(rng, HV)
    S = np.zeros((1 + len(CONFIGS), HV, K, V))
    win, out, chunk = Window(), {}, 256
    for t0 in range(0, steps, chunk):
        q, k, v, g, beta = tokens(rng, chunk, H, HV, A_log, dt_bias, a_shift)
        for t in range(chunk):
            win.add(step(S, q[t], k[t], v[t], g[t], beta[t]))
            store(S, rngs)
            if t0 + t + 1 in marks:
                out[t0 + t + 1] = (win.err(), rel(S[1:], S[0]))
    return out


def run_mtp(seed, H, HV, calls, marks, a_shift, num_spec=3):
    rng = np.random.default_rng(seed)
    rngs = [np.random.default_rng(seed + 200 + c) for c in range(len(CONFIGS))]
    A_log, dt_bias = head_params(rng, HV)
    S = np.zeros((1 + len(CONFIGS), HV, K, V))
    win, out = Window(), {}
    q, k, v, g, beta = tokens(rng, calls * (1 + num_spec), H, HV, A_log, dt_bias, a_shift)
    p = 0
    for n in range(calls):
        A = 1 + n % (1 + num_spec)  # accepted tokens of this call
        per_call = []
        for t in range(p, p + A):
            per_call.append(step(S, q[t], k[t], v[t], g[t], beta[t]))
        store(S, rngs)  # the state after the accepted token, read by the next call
        win.add(np.stack(per_call, axis=1))
        p += A
        if n + 1 in marks:
            out[n + 1] = (win.err(), rel(S[1:], S[0]))
    return out, p


def run_stack(seed, H, HV, layers, steps, marks, a_shift, d_model=512):
    rng = np.random.default_rng(seed)
    rngs = [np.random.default_rng(seed + 300 + c) for c in range(len(CONFIGS))]
    n = 1 + len(CONFIGS)
    W = []
    for _ in range(layers):
        A_log, dt_bias = head_params(rng, HV)
        W.append(dict(A_log=A_log, dt_bias=dt_bias,
                      qk=rng.standard_normal((d_model, 2 * H * K)) / np.sqrt(d_model),
                      v=rng.standard_normal((d_model, HV * V)) / np.sqrt(d_model),
                      z=rng.standard_normal((d_model, HV * V)) / np.sqrt(d_model),
                      ab=rng.standard_normal((d_model, 2 * HV)) / np.sqrt(d_model),
                      o=rng.standard_normal((HV * V, d_model)) / np.sqrt(HV * V)))
    S = np.zeros((layers, n, HV, K, V))
    win, out = Window(), {}
    grp = HV // H
    for t in range(steps):
        h = np.broadcast_to(rng.standard_normal(d_model), (n, d_model)).copy()
        for li, w in enumerate(W):
            x = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + 1e-6)
            qk = (x @ w["qk"]).reshape(n, 2, H, K)
            q = np.repeat(ref.l2norm(qk[:, 0]) * K ** -0.5, grp, axis=1)
            k = np.repeat(ref.l2norm(qk[:, 1]), grp, axis=1)
            ab = x @ w["ab"]
            g, beta = ref.gates(ab[:, :HV] + a_shift, ab[:, HV:], w["A_log"], w["dt_bias"])
            o = step(S[li], q, k, (x @ w["v"]).reshape(n, HV, V), g, beta)
            store(S[li], rngs)
            y = ref.gated_rmsnorm(o, (x @ w["z"]).reshape(n, HV, V), np.ones(V))
            h = h + y.reshape(n, HV * V) @ w["o"]
        win.add(o)  # the last layer's
        if t + 1 in marks:
            out[t + 1] = (win.err(), rel(S[:, 1:].transpose(1, 0, 2, 3, 4), S[:, 0]))
    return out


def cell(o_err, s_err):
    return f"{o_err:.1e} / {s_err:.1e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs (under a minute)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    check_step(np.random.default_rng(args.seed))
    # k-heads, v-heads, decode steps and where they are reported, MTP calls and where, stack steps, layers
    if args.quick:
        H, HV, dec, dec_marks, mtp_calls, mtp_marks, stack_steps, layers = \
            2, 4, 4096, (512, 4096), 512, (512,), 128, 3
    else:
        H, HV, dec, dec_marks, mtp_calls, mtp_marks, stack_steps, layers = \
            4, 8, 32768, (512, 4096, 32768), 4096, (1024, 4096), 384, 4
    t_start = time.time()
    rows = []
    for label, shift in (("gates N(0,1)", 0.0), ("long memory", -6.0)):
        for N, (oe, se) in sorted(run_decode(args.seed, H, HV, dec, set(dec_marks), shift).items()):
            rows.append((f"decode, {label}", f"{N} steps", oe, se))
        res, toks = run_mtp(args.seed + 1, H, HV, mtp_calls, set(mtp_marks), shift)
        for N, (oe, se) in sorted(res.items()):
            rows.append((f"MTP num_spec=3, acceptance 1..4, {label}", f"{N} calls", oe, se))
        for N, (oe, se) in sorted(run_stack(args.seed + 2, H, HV, layers, stack_steps, {stack_steps}, shift).items()):
            rows.append((f"{layers}-layer stack, {label}", f"{N} steps", oe, se))
        print(f"[{label}: {time.time() - t_start:.0f} s]", file=sys.stderr)
    print(f"Relative error (Frobenius) vs an unrounded float64 state, output o / final state S; "
          f"K = V = {K}, {HV} v-heads ({H} k-head{'s' if H > 1 else ''}) simulated; "
          f"`python benchmarks/state_precision.py{' --quick' if args.quick else ''} --seed {args.seed}`\n")
    print("| run | length | " + " | ".join(c[0] for c in CONFIGS) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in CONFIGS) + " |")
    for run, length, oe, se in rows:
        print(f"| {run} | {length} | " + " | ".join(cell(a, b) for a, b in zip(oe, se)) + " |")


if __name__ == "__main__":
    main()
