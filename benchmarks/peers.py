"""What a user on this machine would run instead of pygdn, for the benchmark (bench.py).

Two peers, each doing the same work as one pygdn.attention step (conv update, gates, q/k
l2norm, gated delta rule, outputs, and the state write-back to the slots the metadata names):

  NumpyPeer  a vectorized float32 numpy implementation written here: batched over sequences and
             heads with matmul (decode / spec decode: one state update per token for all
             sequences at once; prefill: the chunked WY/UT form in chunks of CHUNK tokens, the
             library's chunk length, all heads at once). It keeps its caches in pygdn's layouts (conv time-major, ssm [slots, HV, V, K]).
  TorchPeer  HF transformers' torch fallbacks of Qwen3-Next (modeling_qwen3_next):
             causal_conv1d_update, causal_conv1d_fn, torch_recurrent_gated_delta_rule and
             torch_chunk_gated_delta_rule, on torch CPU with 2 threads. It keeps its caches in
             the layouts those functions take ("native"): conv [slots, conv_dim, state_len],
             ssm [slots, HV, K, V], so no transposes are charged to it.

torch / transformers are imported lazily, only by TorchPeer: they are never a dependency of
pygdn. `torch_status()` says whether they can be used and why not.

Both peers take a `Case` (see cases.py): host float arrays holding exactly the values pygdn gets
(bf16-rounded when the activations are bf16), the initial caches in pygdn's layouts and the
batch metadata from pygdn.batch.make_batch(order="grouped"), so every sequence's tokens are
contiguous rows (decode / spec / prefill batches are of one kind each).
  .step()    one timed step on the peer's own (warm) caches, in place.
  .result()  (out [rows, HV, V] f32, ssm [slots, HV, V, K] f32) after the steps so far, for the
             agreement check against pygdn.
"""
from __future__ import annotations

import numpy as np

from pygdn import lib

# The library's chunk length: the numpy peer chunks as the library does, and cases.chunked_flops
# counts the library's work with it.
CHUNK = lib.GDN_CHUNK_SIZE  # the library's chunk length (include/gdn_xpu.h)


# ----------------------------------------------------------------------------- helpers
def _silu(x):
    return x / (1.0 + np.exp(-x))


def _softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _l2norm(x, eps):
    return x * (1.0 / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps))


def _spec_arrays(meta):
    n = meta["num_spec_decodes"]
    cols = np.asarray(meta["spec_state_indices"], np.int64).reshape(n, meta["num_spec"] + 1)
    acc = np.asarray(meta["num_accepted_tokens"], np.int64)[:n]
    qsl = np.asarray(meta["spec_query_start_loc"], np.int64)
    lens = np.diff(qsl)
    if not np.all(lens == lens[0]):
        raise ValueError("the peers take spec batches whose sequences all have the same length")
    return cols, acc, int(lens[0]), int(meta["non_spec_token_count"])


# ----------------------------------------------------------------------------- numpy
class NumpyPeer:
    """Vectorized float32 numpy. Activations are handed over as float32 (numpy has no bf16):
    that costs it 2x activation bytes at bf16, which are small next to the state traffic."""

    name = "numpy"

    def __init__(self, case):
        c = self.c = case
        f = np.float32
        self.x = c.x.astype(f)
        self.a, self.b = c.a.astype(f), c.b.astype(f)
        self.w = c.conv_w.astype(f)                      # [C, W]
        self.bias = None if c.conv_b is None else c.conv_b.astype(f)
        self.neg_A = -np.exp(c.A_log.astype(f))
        self.dt_bias = c.dt_bias.astype(f)
        self.conv = c.conv0.astype(f, copy=True)         # [slots, state_len, C] (time-major)
        self.ssm = c.ssm0.astype(f, copy=True)           # [slots, HV, V, K]
        self.out = np.zeros((c.rows, c.HV, c.V), f)
        self.scale = np.float32(c.K ** -0.5)

    # q|k|v rows -> q, k [n, H, K] (normalized, q scaled), v [n, HV, V]
    def _split(self, y):
        c = self.c
        hk = c.H * c.K
        q = _l2norm(y[..., :hk].reshape(y.shape[:-1] + (c.H, c.K)), c.l2_eps) * self.scale
        k = _l2norm(y[..., hk:2 * hk].reshape(y.shape[:-1] + (c.H, c.K)), c.l2_eps)
        v = y[..., 2 * hk:].reshape(y.shape[:-1] + (c.HV, c.V))
        return q, k, v

    def _gates(self, rows):
        g = self.neg_A * _softplus(self.a[rows] + self.dt_bias)
        beta = 1.0 / (1.0 + np.exp(-self.b[rows]))
        return np.exp(g), beta

    def _token(self, S, q, k, v, decay, beta, tmp):
        """One token for n sequences at once. S [n, H, r, V, K] (a view of [n, HV, V, K]);
        q, k [n, H, K]; v [n, HV, V]; decay, beta [n, HV]. Returns o [n, HV, V]."""
        n, H, r, V, K = S.shape
        S *= decay.reshape(n, H, r, 1, 1)
        kk = k.reshape(n, H, 1, K, 1)
        kv = np.matmul(S, kk)[..., 0]                                   # [n, H, r, V]
        u = beta.reshape(n, H, r, 1) * (v.reshape(n, H, r, V) - kv)
        np.multiply(u[..., :, None], k.reshape(n, H, 1, 1, K), out=tmp)  # outer(u, k)
        S += tmp
        return np.matmul(S, q.reshape(n, H, 1, K, 1))[..., 0].reshape(n, H * r, V)

    def step(self):
        c = self.c
        if c.kind == "decode":
            self._decode()
        elif c.kind == "spec":
            self._spec()
        else:
            self._prefill()

    def _decode(self):
        c, m = self.c, self.c.meta
        n = m["num_decodes"]
        slots = np.asarray(m["non_spec_state_indices"], np.int64)[:n]
        rows = np.arange(n)  # grouped order, one token each
        W = c.W
        full = np.concatenate([self.conv[slots, :W - 1], self.x[rows][:, None, :]], axis=1)  # [n, W, C]
        y = np.einsum("nwc,cw->nc", full, self.w)
        if self.bias is not None:
            y += self.bias
        y = _silu(y)
        self.conv[slots, :W - 1] = full[:, 1:]
        q, k, v = self._split(y)
        decay, beta = self._gates(rows)
        r = c.HV // c.H
        S = self.ssm[slots].reshape(n, c.H, r, c.V, c.K)
        tmp = np.empty_like(S)
        self.out[rows] = self._token(S, q, k, v, decay, beta, tmp)
        self.ssm[slots] = S.reshape(n, c.HV, c.V, c.K)

    def _spec(self):
        c, m = self.c, self.c.meta
        cols, acc, L, t0 = _spec_arrays(m)
        n, W = cols.shape[0], c.W
        rows = t0 + np.arange(n * L)
        line = cols[:, 0]
        win = self.conv[line[:, None], (acc - 1)[:, None] + np.arange(W - 1)[None, :]]   # [n, W-1, C]
        xs = self.x[rows].reshape(n, L, -1)
        full = np.concatenate([win, xs], axis=1)                                         # [n, W-1+L, C]
        y = full[:, 0:L] * self.w[:, 0]
        for i in range(1, W):
            y += full[:, i:i + L] * self.w[:, i]
        if self.bias is not None:
            y += self.bias
        y = _silu(y)
        # rolled line: the W-2 inputs before token 0, then the L new inputs
        self.conv[line, :W - 2 + L] = np.concatenate([win[:, 1:], xs], axis=1)
        q, k, v = self._split(y)                                    # [n, L, ...]
        decay, beta = self._gates(rows)
        decay, beta = decay.reshape(n, L, c.HV), beta.reshape(n, L, c.HV)
        r = c.HV // c.H
        S = self.ssm[cols[np.arange(n), acc - 1]].reshape(n, c.H, r, c.V, c.K)
        tmp = np.empty_like(S)
        out = np.empty((n, L, c.HV, c.V), np.float32)
        for t in range(L):
            out[:, t] = self._token(S, q[:, t], k[:, t], v[:, t], decay[:, t], beta[:, t], tmp)
            self.ssm[cols[:, t]] = S.reshape(n, c.HV, c.V, c.K)   # per-token write-back
        self.out[rows] = out.reshape(n * L, c.HV, c.V)

    def _prefill(self):
        c, m = self.c, self.c.meta
        nseq = m["num_prefills"] + m["num_decodes"]
        qsl = np.asarray(m["non_spec_query_start_loc"], np.int64)
        slots = np.asarray(m["non_spec_state_indices"], np.int64)
        his = m.get("has_initial_state")
        W = c.W
        for i in range(nseq):
            rows = np.arange(qsl[i], qsl[i + 1])
            init = his is None or bool(his[i])
            s = int(slots[i])
            hist = self.conv[s, :W - 1] if init else np.zeros((W - 1, c.C), np.float32)
            full = np.concatenate([hist, self.x[rows]], axis=0)    # [W-1+L, C]
            Lq = len(rows)
            y = full[0:Lq] * self.w[:, 0]
            for j in range(1, W):
                y += full[j:j + Lq] * self.w[:, j]
            if self.bias is not None:
                y += self.bias
            y = _silu(y)
            self.conv[s, :W - 1] = full[-(W - 1):]
            q, k, v = self._split(y)
            g = self.neg_A * _softplus(self.a[rows] + self.dt_bias)
            beta = 1.0 / (1.0 + np.exp(-self.b[rows]))
            S0 = self.ssm[s].transpose(0, 2, 1) if init else np.zeros((c.HV, c.K, c.V), np.float32)
            o, S = chunked(q, k, v, g, beta, np.ascontiguousarray(S0))
            self.out[rows] = o
            self.ssm[s] = S.transpose(0, 2, 1)

    def result(self):
        return self.out.copy(), self.ssm.copy()


def chunked(q, k, v, g, beta, S, chunk=CHUNK):
    """Chunked (WY/UT) gated delta rule of one sequence, all heads at once, float32.
    q, k [L, H, K] (normalized, q scaled); v [L, HV, V]; g, beta [L, HV]; S [HV, K, V].
    Returns (o [L, HV, V], S). The k-heads' products (K K^T, Q K^T) are computed once per
    k-head and broadcast over its HV/H v-heads."""
    L, H, K = q.shape
    HV, V = v.shape[1:]
    r = HV // H
    qh = q.transpose(1, 0, 2)[:, None]                       # [H, 1, L, K]
    kh = k.transpose(1, 0, 2)[:, None]
    vh = v.reshape(L, H, r, V).transpose(1, 2, 0, 3)          # [H, r, L, V]
    gh = g.reshape(L, H, r).transpose(1, 2, 0)                # [H, r, L]
    bh = beta.reshape(L, H, r).transpose(1, 2, 0)
    S = S.reshape(H, r, K, V).astype(np.float32)
    out = np.empty((H, r, L, V), np.float32)
    tri_s = np.tril(np.ones((chunk, chunk), bool), -1)
    tri_i = np.tril(np.ones((chunk, chunk), bool), 0)
    eye = np.eye(chunk, dtype=np.float32)
    for c0 in range(0, L, chunk):
        n = min(chunk, L - c0)
        sl = slice(c0, c0 + n)
        qc, kc, vc, bc = qh[:, :, sl], kh[:, :, sl], vh[:, :, sl], bh[:, :, sl]
        G = np.cumsum(gh[:, :, sl], axis=-1)                  # [H, r, n]
        diff = G[..., :, None] - G[..., None, :]
        ts, ti = tri_s[:n, :n], tri_i[:n, :n]
        d_s = np.exp(np.where(ts, diff, -np.inf))
        d_i = np.exp(np.where(ti, diff, -np.inf))
        kkt = np.matmul(kc, kc.swapaxes(-1, -2))             # [H, 1, n, n]
        qkt = np.matmul(qc, kc.swapaxes(-1, -2))
        A = bc[..., :, None] * d_s * kkt + eye[:n, :n]        # I + A  [H, r, n, n]
        eG = np.exp(G)
        rhs = np.concatenate([bc[..., None] * vc, (bc * eG)[..., None] * kc.repeat(r, axis=1)], axis=-1)
        sol = np.linalg.solve(A, rhs)                         # T [beta V | beta e^G K]
        U, Wm = sol[..., :V], sol[..., V:]
        u = U - np.matmul(Wm, S)                              # [H, r, n, V]
        out[:, :, sl] = eG[..., None] * np.matmul(qc, S) + np.matmul(qkt * d_i, u)
        glast = G[..., -1:]
        kd = np.exp(glast - G)[..., None] * kc                # [H, r, n, K]
        S = np.exp(glast)[..., None] * S + np.matmul(kd.swapaxes(-1, -2), u)
    return out.transpose(2, 0, 1, 3).reshape(L, HV, V), S.reshape(HV, K, V)


# ----------------------------------------------------------------------------- torch (HF)
_TORCH = {}


def torch_status():
    """(ok, message): whether torch + transformers' Qwen3-Next fallbacks can be imported."""
    if "status" in _TORCH:
        return _TORCH["status"]
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        _TORCH["status"] = (False, f"torch not installed ({type(e).__name__}: {e}); pip install torch==2.13.0")
        return _TORCH["status"]
    try:
        import logging
        import os
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("USE_HUB_KERNELS", "0")
        import transformers
        from transformers.models.qwen3_next import modeling_qwen3_next as mq
        transformers.logging.set_verbosity_error()
        logging.getLogger("transformers").setLevel(logging.ERROR)
    except Exception as e:  # noqa: BLE001
        _TORCH["status"] = (False, f"transformers not installed or without Qwen3-Next ({type(e).__name__}: {e}); "
                                   "pip install transformers")
        return _TORCH["status"]
    fns = {}
    for name in ("causal_conv1d_update", "causal_conv1d_fn", "torch_recurrent_gated_delta_rule",
                 "torch_chunk_gated_delta_rule"):
        fn = getattr(mq, name, None)
        if fn is None:
            _TORCH["status"] = (False, f"transformers {transformers.__version__}: modeling_qwen3_next has no {name}")
            return _TORCH["status"]
        # The hub-kernel decorator may route to an optimized package (FLA, causal-conv1d: CUDA /
        # Triton) when installed; __wrapped__ is the torch fallback itself, which is the peer.
        fns[name] = getattr(fn, "__wrapped__", fn)
    torch.set_num_threads(2)
    _TORCH.update(torch=torch, fns=fns, version=f"torch {torch.__version__}, transformers {transformers.__version__}")
    _TORCH["status"] = (True, _TORCH["version"])
    return _TORCH["status"]


class TorchPeer:
    """HF transformers' torch fallbacks, called as Qwen3NextGatedDeltaNet.forward calls them,
    plus the slot gather / scatter a serving engine's slot caches need.

    GVA: the fallbacks take q/k with H heads and repeat them to HV heads themselves
    (repeat_interleave inside the function), so that cost is inside the timed step, as it is for
    any user of them; we pass H-head q/k as the model produces them.
    Spec decode: the fallbacks return only the final state, so the per-token states (written to
    spec_state_indices[n][t]) need one torch_recurrent_gated_delta_rule call per token, each
    followed by an index_copy_ into the cache: what a user would have to write."""

    name = "torch"

    def __init__(self, case):
        ok, msg = torch_status()
        if not ok:
            raise RuntimeError(msg)
        torch = self.torch = _TORCH["torch"]
        f = _TORCH["fns"]
        self.conv_update, self.conv_fn = f["causal_conv1d_update"], f["causal_conv1d_fn"]
        self.recurrent, self.chunk = f["torch_recurrent_gated_delta_rule"], f["torch_chunk_gated_delta_rule"]
        c = self.c = case
        act = torch.bfloat16 if c.act == "bf16" else torch.float32
        t = lambda a, dt=act: torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(dt)  # noqa: E731
        self.x, self.a, self.b = t(c.x), t(c.a), t(c.b)
        self.w = t(c.conv_w)                                                   # [C, W] (weight.squeeze(1))
        self.bias = None if c.conv_b is None else t(c.conv_b)
        self.A_log, self.dt_bias = t(c.A_log, torch.float32), t(c.dt_bias, torch.float32)
        self.conv = t(np.swapaxes(c.conv0, 1, 2))                              # [slots, C, state_len]
        self.ssm = t(np.swapaxes(c.ssm0, 2, 3), torch.float32).contiguous()    # [slots, HV, K, V]
        self.out = torch.zeros((c.rows, c.HV, c.V), dtype=act)
        m = c.meta
        if c.kind == "spec":
            cols, acc, L, t0 = _spec_arrays(m)
            self.cols, self.acc, self.L, self.t0 = torch.from_numpy(cols), torch.from_numpy(acc), L, t0
            W = c.W
            self.win_idx = (self.acc - 1)[:, None] + torch.arange(W - 1)[None, :]        # [n, W-1]
        elif c.kind == "decode":
            self.slots = torch.from_numpy(np.asarray(m["non_spec_state_indices"], np.int64)[:m["num_decodes"]])

    def _qkv(self, y):
        """conv output [n, L, C] -> q, k [n, L, H, K], v [n, L, HV, V] (views, as HF splits)."""
        c = self.c
        n, L = y.shape[:2]
        hk = c.H * c.K
        return (y[..., :hk].reshape(n, L, c.H, c.K), y[..., hk:2 * hk].reshape(n, L, c.H, c.K),
                y[..., 2 * hk:].reshape(n, L, c.HV, c.V))

    def _gates(self, a, b):
        torch = self.torch
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * torch.nn.functional.softplus(a.float() + self.dt_bias)
        return g, beta

    def step(self):
        with self.torch.inference_mode():
            if self.c.kind == "decode":
                self._decode()
            elif self.c.kind == "spec":
                self._spec()
            else:
                self._prefill()

    def _decode(self):
        c, n = self.c, len(self.slots)
        cs = self.conv.index_select(0, self.slots)                      # [n, C, W-1]: gather the slots
        y = self.conv_update(self.x[:n].view(n, 1, c.C).transpose(1, 2), cs, self.w, self.bias, "silu")
        self.conv.index_copy_(0, self.slots, cs)                        # conv_update wrote cs in place
        q, k, v = self._qkv(y.transpose(1, 2))
        g, beta = self._gates(self.a[:n].view(n, 1, c.HV), self.b[:n].view(n, 1, c.HV))
        S0 = self.ssm.index_select(0, self.slots)
        o, S = self.recurrent(q, k, v, g=g, beta=beta, initial_state=S0, output_final_state=True,
                              use_qk_l2norm_in_kernel=True)
        self.ssm.index_copy_(0, self.slots, S)
        self.out[:n] = o.reshape(n, c.HV, c.V)

    def _spec(self):
        torch, c = self.torch, self.c
        cols, L, t0, W = self.cols, self.L, self.t0, c.W
        n = cols.shape[0]
        rows = slice(t0, t0 + n * L)
        line = self.conv.index_select(0, cols[:, 0])                                  # [n, C, state_len]
        win = torch.gather(line, 2, self.win_idx[:, None, :].expand(n, c.C, W - 1))   # [n, C, W-1]
        xs = self.x[rows].view(n, L, c.C).transpose(1, 2)                              # [n, C, L]
        new_line = torch.cat([win[:, :, 1:], xs], dim=2)                               # rolled: W-2 old + L new
        y = self.conv_update(xs, win, self.w, self.bias, "silu")                      # [n, C, L]
        self.conv[cols[:, 0], :, :W - 2 + L] = new_line
        q, k, v = self._qkv(y.transpose(1, 2))
        g, beta = self._gates(self.a[rows].view(n, L, c.HV), self.b[rows].view(n, L, c.HV))
        S = self.ssm.index_select(0, cols[torch.arange(n), self.acc - 1])
        out = self.out[rows].view(n, L, c.HV, c.V)
        for t in range(L):
            o, S = self.recurrent(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g=g[:, t:t + 1],
                                  beta=beta[:, t:t + 1], initial_state=S, output_final_state=True,
                                  use_qk_l2norm_in_kernel=True)
            self.ssm.index_copy_(0, cols[:, t], S)                                     # per-token write-back
            out[:, t] = o[:, 0]

    def _prefill(self):
        torch, c, m = self.torch, self.c, self.c.meta
        nseq = m["num_prefills"] + m["num_decodes"]
        qsl = np.asarray(m["non_spec_query_start_loc"], np.int64)
        slots = np.asarray(m["non_spec_state_indices"], np.int64)
        his = m.get("has_initial_state")
        W = c.W
        lens = np.diff(qsl[:nseq + 1])
        # Equal lengths go through one batched call (what a user would do); else one call each.
        groups = [list(range(nseq))] if np.all(lens == lens[0]) else [[i] for i in range(nseq)]
        for grp in groups:
            sl = torch.from_numpy(slots[grp])
            init = torch.tensor([his is None or bool(his[i]) for i in grp])
            xs = torch.stack([self.x[qsl[i]:qsl[i + 1]] for i in grp]).transpose(1, 2)      # [n, C, L]
            hist = self.conv.index_select(0, sl)[:, :, :W - 1] * init[:, None, None]
            xin = torch.cat([hist, xs], dim=2)
            y = self.conv_fn(xin, self.w, self.bias, activation="silu")[:, :, W - 1:]       # drop the history
            self.conv[sl, :, :W - 1] = xin[:, :, -(W - 1):]
            q, k, v = self._qkv(y.transpose(1, 2))
            a = torch.stack([self.a[qsl[i]:qsl[i + 1]] for i in grp])
            b = torch.stack([self.b[qsl[i]:qsl[i + 1]] for i in grp])
            g, beta = self._gates(a, b)
            S0 = self.ssm.index_select(0, sl) * init[:, None, None, None]
            o, S = self.chunk(q, k, v, g=g, beta=beta, initial_state=S0, output_final_state=True,
                              use_qk_l2norm_in_kernel=True)
            self.ssm.index_copy_(0, sl, S)
            for j, i in enumerate(grp):
                self.out[qsl[i]:qsl[i + 1]] = o[j]

    def result(self):
        return self.out.float().numpy().copy(), np.swapaxes(self.ssm.numpy(), 2, 3).copy()
