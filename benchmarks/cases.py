"""The benchmark's work: one step at Qwen3-Next TP=1 shapes as a Case (host inputs, initial
caches, metadata), its useful bytes and FLOPs, pygdn running it (Ours), and one case measured
against the peers (run_case)."""
from __future__ import annotations

import dataclasses as dc
import time

import numpy as np

import pygdn
from pygdn.batch import make_batch, to_device

from peers import CHUNK
from report import row_line
from timing import LATE_BUDGET_S, RETRY_SHARE, first_call_s, timed_blocks, wait_quiet

H, HV, K, V, W = 16, 32, 128, 128, 4          # Qwen3-Next-80B-A3B linear attention, TP=1


# ----------------------------------------------------------------------------- the work
@dc.dataclass
class Case:
    """One benchmark step: host float32 inputs (bf16-rounded for bf16), initial caches in
    pygdn's layouts (conv [slots, state_len, C], ssm [slots, HV, V, K]) and the metadata."""

    kind: str              # "decode" | "spec" | "prefill"
    label: str
    batch: int             # sequences
    num_spec: int
    lens: tuple            # tokens per sequence
    act: str
    meta: dict
    x: np.ndarray
    a: np.ndarray
    b: np.ndarray
    conv_w: np.ndarray
    conv_b: object
    A_log: np.ndarray
    dt_bias: np.ndarray
    conv0: np.ndarray
    ssm0: np.ndarray
    H: int = H
    HV: int = HV
    K: int = K
    V: int = V
    W: int = W
    l2_eps: float = 1e-6

    @property
    def C(self):
        return 2 * self.H * self.K + self.HV * self.V

    @property
    def rows(self):
        return int(self.meta["num_actual_tokens"])

    @property
    def state_len(self):
        return self.W - 1 + self.num_spec

    @property
    def num_slots(self):
        return int(self.ssm0.shape[0])


def _round_act(x, act):
    x = np.asarray(x, np.float32)
    return pygdn.from_bf16_bits(pygdn.to_bf16_bits(x)) if act == "bf16" else x


def make_case(kind, act, batch=1, num_spec=0, lens=(), seed=0):
    rng = np.random.default_rng(seed)
    if kind == "decode":
        slots = batch
        meta = make_batch(rng, num_slots=slots, num_decodes=batch, order="grouped", identity_indices=True)
        label, lens = f"decode B={batch}", (1,) * batch
    elif kind == "spec":
        slots = batch * (1 + num_spec)
        meta = make_batch(rng, num_slots=slots, spec_lens=[1 + num_spec] * batch, num_spec=num_spec,
                          order="grouped", identity_indices=True)
        label, lens = f"spec S={num_spec} B={batch}", (1 + num_spec,) * batch
    else:
        slots = batch = len(lens)
        meta = make_batch(rng, num_slots=slots, prefill_lens=list(lens), has_initial_state=[1] * batch,
                          order="grouped", identity_indices=True)
        label = f"prefill {lens[0]}" if batch == 1 else f"prefill {batch}x{lens[0]}"
    T = int(meta["num_actual_tokens"])
    C = 2 * H * K + HV * V
    st = W - 1 + num_spec
    f32 = np.float32
    return Case(kind=kind, label=label, batch=batch, num_spec=num_spec, lens=tuple(lens), act=act, meta=meta,
                x=_round_act(rng.standard_normal((T, C), f32), act),
                a=_round_act(rng.standard_normal((T, HV), f32), act),
                b=_round_act(rng.standard_normal((T, HV), f32), act),
                conv_w=_round_act(rng.standard_normal((C, W), f32) * 0.5, act), conv_b=None,  # Qwen3-Next: no conv bias
                A_log=np.log(rng.uniform(1.0, 16.0, HV)).astype(f32), dt_bias=np.ones(HV, f32),
                conv0=_round_act(rng.standard_normal((slots, st, C), f32), act),
                ssm0=rng.standard_normal((slots, HV, V, K), f32) * f32(0.05))


def traffic_bytes(case, state_bytes=4):
    """Useful memory traffic of one step: ssm state read once per sequence and written once per
    token written back (decode/prefill: once), conv state read + written, mixed_qkv and a/b in,
    core_attn_out out, conv weight. Workspace intermediates are not counted. state_bytes: 4 (f32
    ssm state) or 2 (bf16)."""
    act = 2 if case.act == "bf16" else 4
    C, T, n = case.C, case.rows, case.batch
    sb = case.HV * case.K * case.V * state_bytes
    acts = T * C * act + T * case.HV * case.V * act + 2 * T * case.HV * act + C * case.W * act
    if case.kind == "spec":
        L = case.num_spec + 1
        ssm = n * (1 + L) * sb
        conv = n * ((case.W - 1) + (case.W - 2 + L)) * C * act
    else:
        ssm = n * 2 * sb
        conv = n * 2 * (case.W - 1) * C * act
    return ssm + conv + acts


def chunked_flops(case):
    """FLOPs of the chunked (WY/UT, chunks of CHUNK tokens) gated delta rule + conv of a prefill, per
    v-head and chunk of n tokens (multiply-add = 2, triangular products counted half):
    K K^T and Q K^T: 2 n^2 K; T=(I+A)^-1: n^3/3; W = T(beta e^G K): n^2 K; U = T(beta V): n^2 V;
    u = U - W S, q S, S += K^T u: 6 n K V; Aqk u: n^2 V; decay of S: K V. Conv: 2 W C per token."""
    f = 0.0
    for L in case.lens:
        for c0 in range(0, L, CHUNK):
            n = min(CHUNK, L - c0)
            f += case.HV * (3 * n * n * case.K + 2 * n * n * case.V + n ** 3 / 3 + 6 * n * case.K * case.V
                            + case.K * case.V)
        f += 2 * case.W * case.C * L
    return f


# ----------------------------------------------------------------------------- pygdn
class Ours:
    """pygdn.attention on USM shared arrays of the queue, caches kept between steps."""

    name = "ours"

    def __init__(self, queue, case, ssm_layout="vk", state_dtype="f32", checkpoint_every=0):
        """state_dtype: of the ssm cache ("bf16": the case's state rounded); checkpoint_every > 0:
        prefills store a block checkpoint every that many tokens, into extra slots of the caches."""
        self.q, self.case, self.layout, self.state_dtype = queue, case, ssm_layout, state_dtype
        meta, conv0, ssm0 = case.meta, case.conv0, case.ssm0
        if checkpoint_every:
            cols = max(case.lens) // checkpoint_every + 1
            n = len(case.lens)
            extra = np.arange(case.num_slots, case.num_slots + n * cols, dtype=np.int32).reshape(n, cols)
            meta = dict(meta, checkpoint_interval=checkpoint_every, checkpoint_cols=cols, checkpoint_state_indices=extra,
                        non_spec_start_pos=np.zeros(n, np.int32))
            conv0 = np.concatenate([conv0, np.zeros((extra.size,) + conv0.shape[1:], conv0.dtype)])
            ssm0 = np.concatenate([ssm0, np.zeros((extra.size,) + ssm0.shape[1:], ssm0.dtype)])
        self.cfg = pygdn.Config(num_k_heads=case.H, num_v_heads=case.HV, head_k_dim=case.K, head_v_dim=case.V,
                                num_slots=ssm0.shape[0], conv_width=case.W, act_dtype=case.act, state_dtype=state_dtype,
                                ssm_layout=ssm_layout, conv_layout="time_major", conv_spec_layout="rolled",
                                conv_state_len=case.state_len)
        enc = pygdn.to_bf16_bits if case.act == "bf16" else (lambda v: np.ascontiguousarray(v, np.float32))
        U = lambda v: pygdn.UsmArray.from_numpy(v, queue)  # noqa: E731
        ssm = ssm0 if ssm_layout == "vk" else np.ascontiguousarray(np.swapaxes(ssm0, 2, 3))
        ssm = pygdn.to_bf16_bits(ssm) if state_dtype == "bf16" else ssm
        act_np = np.uint16 if case.act == "bf16" else np.float32
        self.arrays = dict(mixed_qkv=U(enc(case.x)), a=U(enc(case.a)), b=U(enc(case.b)),
                           conv_weight=U(enc(case.conv_w)), A_log=U(case.A_log), dt_bias=U(case.dt_bias),
                           conv_state=U(enc(conv0)), ssm_state=U(ssm),
                           core_attn_out=pygdn.UsmArray((case.rows, case.HV, case.V), act_np, queue))
        self.conv_out = pygdn.UsmArray((case.rows, case.C), act_np, queue)
        self.batch = to_device(meta, queue)

    def step(self):
        pygdn.attention(self.q, self.cfg, self.batch, **self.arrays)

    def conv_only(self):
        A = self.arrays
        pygdn.causal_conv1d(self.q, self.cfg, self.batch, mixed_qkv=A["mixed_qkv"], conv_weight=A["conv_weight"],
                                 conv_state=A["conv_state"], conv_out=self.conv_out)

    def delta_only(self):
        A = self.arrays
        pygdn.gated_delta_rule(self.q, self.cfg, self.batch, conv_out=self.conv_out, ssm_state=A["ssm_state"],
                                    core_attn_out=A["core_attn_out"], a=A["a"], b=A["b"], A_log=A["A_log"],
                                    dt_bias=A["dt_bias"])

    def result(self):
        out = self.arrays["core_attn_out"].to_numpy()
        out = pygdn.from_bf16_bits(out) if self.case.act == "bf16" else out
        ssm = self.arrays["ssm_state"].to_numpy()[:self.case.num_slots]
        ssm = pygdn.from_bf16_bits(ssm) if self.state_dtype == "bf16" else ssm
        return out.astype(np.float32), (ssm if self.layout == "vk" else np.swapaxes(ssm, 2, 3))


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), 1e-6)
    return float(np.max(np.abs(got - want))) / scale


# ----------------------------------------------------------------------------- one case, ours and the peers
def run_case(queue, case, peers, plan, log, missing=()):
    late = time.perf_counter() > plan["deadline"]
    if late:
        # Past the run's soft deadline (--quick: a loaded machine): no waiting, no retries, and
        # LATE_BUDGET_S of repeats per implementation (a slower one: its first call alone).
        plan["quiet_left_s"] = plan["retry_left_s"] = 0.0
    rec = {"kind": case.kind, "label": case.label, "batch": case.batch, "num_spec": case.num_spec,
           "tokens": case.rows, "lens": list(case.lens), "act": case.act, "bytes": traffic_bytes(case)}
    if case.kind == "spec":
        rec["num_accepted"] = [int(v) for v in case.meta["num_accepted_tokens"]]
    if case.kind == "prefill":
        rec["flops"] = chunked_flops(case)
    reps_ours, reps_peer, budget = plan["reps_ours"][case.kind], plan["reps_peer"][case.kind], plan["budget_s"]
    if late:
        budget = LATE_BUDGET_S
        rec["past_deadline"] = True
    rec["waited_for_quiet_s"] = wait_quiet(plan)
    tol = 5e-2 if case.act == "bf16" else 2e-3

    # The first call of each implementation warms it up (workspace growth, allocator, caches)
    # and is the agreement check: all start from the same caches and inputs.
    ours = Ours(queue, case)
    first = first_call_s(ours.step)
    ref_out, ref_ssm = ours.result()
    impls = {"ours": (ours.step, reps_ours, first)}
    variants = {}  # name -> the same step run differently, with its agreement vs ours
    if case.kind != "prefill":
        # Diagnostic: the same step with the ssm cache in the "kv" layout [slots, HV, K, V].
        kv = Ours(queue, case, ssm_layout="kv")
        impls["ours_kv_layout"] = (kv.step, reps_ours, first_call_s(kv.step))
        # The ssm cache in bf16 (vLLM's default for Qwen3-Next): half the state bytes of a step.
        variants["ours_bf16_state"] = Ours(queue, case, state_dtype="bf16")
    else:
        # Block checkpoints every 256 tokens (prefix caching, mamba_cache_mode="all") against none.
        variants["ours_ckpt256"] = Ours(queue, case, checkpoint_every=256)
    for name, o in variants.items():
        impls[name] = (o.step, reps_ours, first_call_s(o.step))
        out, ssm = o.result()
        rec[name + "_agreement"] = {"out": rel_err(out, ref_out), "ssm": rel_err(ssm, ref_ssm)}
        del out, ssm
    # Breakdown of our step: the conv alone and the delta rule alone (two calls instead of one).
    reps_part = max(1, reps_ours // 2)
    impls["ours_conv"] = (ours.conv_only, reps_part, first_call_s(ours.conv_only))
    impls["ours_delta"] = (ours.delta_only, reps_part, first_call_s(ours.delta_only))
    agreement = {}
    for name, why in missing:
        rec[name] = {"error": why, "not_installed": True}
    for peer_cls in peers:
        name = peer_cls.name
        try:
            p = peer_cls(case)
            pfirst = first_call_s(p.step)
            out, ssm = p.result()
        except Exception as e:  # noqa: BLE001
            rec[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        a = {"out": rel_err(out, ref_out), "ssm": rel_err(ssm, ref_ssm)}
        a["ok"] = bool(a["out"] <= tol and a["ssm"] <= tol)
        agreement[name] = a
        impls[name] = (p.step, reps_peer, pfirst)
        del out, ssm

    t_block = time.perf_counter()
    stats, foreign = timed_blocks(impls, budget)
    t_block = time.perf_counter() - t_block
    if foreign > RETRY_SHARE and plan["retry_left_s"] >= t_block + 1.0:
        # Other processes took a large share of the 2 cores: wait a little, measure again, keep
        # the quieter of the two measurements.
        t = time.perf_counter()
        time.sleep(1.0)
        stats2, foreign2 = timed_blocks(impls, budget)
        plan["retry_left_s"] -= time.perf_counter() - t
        rec["retried"] = {"foreign_first": foreign, "foreign_second": foreign2}
        if foreign2 < foreign:
            stats, foreign = stats2, foreign2
    rec["foreign_cpu"] = foreign
    for name, st in stats.items():
        rec[name] = st
    for name, a in agreement.items():
        rec[name]["ratio"] = rec[name]["median_s"] / rec["ours"]["median_s"]
        rec[name]["agreement_vs_ours"] = a
    t_ours = rec["ours"]["median_s"]
    rec["ours"]["GBps"] = rec["bytes"] / t_ours / 1e9
    if "ours_bf16_state" in rec:
        rec["bytes_bf16_state"] = traffic_bytes(case, state_bytes=2)
        rec["ours_bf16_state"]["GBps"] = rec["bytes_bf16_state"] / rec["ours_bf16_state"]["median_s"] / 1e9
    if "ours_ckpt256" in rec:
        rec["ours_ckpt256"]["ratio"] = rec["ours_ckpt256"]["median_s"] / t_ours
    if "flops" in rec:
        rec["ours"]["GFLOPs"] = rec["flops"] / t_ours / 1e9
    log(row_line(rec, plan))
    return rec
