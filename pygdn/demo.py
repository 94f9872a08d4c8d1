"""The main job: one linear-attention layer step of a model (MODELS: Qwen3-Next-80B-A3B's GDN
layer, or Kimi-Linear-48B-A3B's KDA layer) on a realistic MTP batch (prefills + speculative
decodes, interleaved), on the default SYCL device: checked against the float64 reference on a
subset of heads, and timed per phase.

    python -m pygdn demo [--model qwen3-next|kimi-linear] [--tp 1] [--prefills 4 --prefill-len 512]
                         [--spec 16 --num-spec 2] ... [--spec-mode replay]

--spec-mode replay runs the spec sequences in replay mode (docs/op.md "Replay mode"): two steps,
the second replaying the first's accepted tokens, each against the reference's per-token
semantics, then gdn_flush_replay and the flushed states against the reference's.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import dpctl

from . import reference as ref
from ._usm import UsmArray, from_bf16_bits, to_bf16_bits
from .batch import make_batch, to_device
from .config import Config
from .ops import attention, causal_conv1d, flush_replay, gated_delta_rule, prefill_path, warmup
from ._lib import version


# The layers the demo runs, at their models' real shapes (TP=1): k-heads, v-heads, head dim (K = V),
# conv width, and the gates. Kimi-Linear-48B-A3B (linear_attn_config: num_heads 32, head_dim 128,
# short_conv_kernel_size 4; vLLM kimi_gdn_linear_attn.py) decays the state per key channel
# (gate_mode "channel": a, dt_bias [H*K], A_log [H]) and gates the output norm with a sigmoid; its
# config sets no gate_lower_bound, so the gate is the softplus form (lower bound 0 here).
MODELS = {
    "qwen3-next": dict(name="Qwen3-Next-80B-A3B GDN layer", k_heads=16, v_heads=32, head_dim=128, conv_width=4,
                       gate_mode="head", out_gate="silu", gate_lower_bound=0.0),
    "kimi-linear": dict(name="Kimi-Linear-48B-A3B KDA layer", k_heads=32, v_heads=32, head_dim=128, conv_width=4,
                        gate_mode="channel", out_gate="sigmoid", gate_lower_bound=0.0),
}


def _say(msg):
    print(msg, flush=True)


def _queue(device):
    q = dpctl.SyclQueue(device, property="in_order") if device else dpctl.SyclQueue(property="in_order")
    return q


def _device_line(q):
    d = q.sycl_device
    kind = "CPU" if d.is_cpu else "GPU" if d.is_gpu else "accelerator"
    return f"{d.name} [{d.backend.name}, {kind}, {d.max_compute_units} compute units]"


def _model_config(model, tp, dtype, **kw):
    m = MODELS[model]
    return Config(num_k_heads=m["k_heads"] // tp, num_v_heads=m["v_heads"] // tp, head_k_dim=m["head_dim"],
                  head_v_dim=m["head_dim"], num_slots=1, conv_width=m["conv_width"], act_dtype=dtype,
                  gate_mode=m["gate_mode"], out_gate=m["out_gate"], **kw)


def info(argv) -> int:
    """The library, the device and the path a prefill's chunk products take there (gdn_prefill_path)
    for the demo's layers with bf16 activations, per cfg.prefill_precision."""
    q = _queue(argv[0] if argv else None)
    _say(f"libgdn_xpu {version()}  device: {_device_line(q)}")
    _say("prefill products, bf16 activations (Config.prefill_precision; docs/op.md \"Prefill precision\"):")
    for precision in ("auto", "bf16", "f32"):
        engine, text = prefill_path(q, _model_config("qwen3-next", 1, "bf16", prefill_precision=precision))
        _say(f"  {precision:4}: {text}")
    return 0


class _Act:
    """Host values of an activation-dtype array: storage (for the device) and exact float64."""

    def __init__(self, values, dtype):
        v = np.asarray(values, np.float32)
        if dtype == "bf16":
            self.store = to_bf16_bits(v)
            self.f64 = from_bf16_bits(self.store).astype(np.float64)
        elif dtype == "f16":
            self.store = v.astype(np.float16)
            self.f64 = self.store.astype(np.float64)
        else:
            self.store, self.f64 = v, v.astype(np.float64)


def _median_ms(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pygdn demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="dpctl filter string (default: the default SYCL device)")
    p.add_argument("--model", default="qwen3-next", choices=sorted(MODELS), help="the layer (default qwen3-next)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree: the model's heads / tp "
                   "(qwen3-next: H=16/tp, HV=32/tp; kimi-linear: H=HV=32/tp)")
    p.add_argument("--prefills", type=int, default=4)
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--decodes", type=int, default=0, help="plain 1-token decodes")
    p.add_argument("--spec", type=int, default=16, help="speculative sequences")
    p.add_argument("--num-spec", type=int, default=2, help="draft tokens per speculative sequence")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--spec-mode", default="per-token", choices=["per-token", "replay"],
                   help="spec decoding writing each token's state (per-token) or one state per step (replay)")
    p.add_argument("--gate-lower-bound", type=float, default=None,
                   help="< 0: the gate's lower-bound form, g = lb * sigmoid(exp(A_log) * (a + dt_bias)) "
                   "(default: the model's, MODELS)")
    p.add_argument("--force-recurrent", action="store_true",
                   help="prefills through the token recurrence instead of the chunked algorithm (cfg.force_recurrent)")
    p.add_argument("--prefill-precision", default="auto", choices=["auto", "f32", "bf16"],
                   help="the chunked prefill's products (cfg.prefill_precision): f32, or bf16 operands with f32 "
                   "accumulators; auto: bf16 on an Intel GPU's XMX for bf16/f16 activations, else f32")
    args = p.parse_args(argv)

    model = MODELS[args.model]
    if args.tp < 1 or model["k_heads"] % args.tp or model["v_heads"] % args.tp:
        p.error(f"--tp {args.tp}: expected a divisor of the model's {model['k_heads']} k-heads")
    H, HV = model["k_heads"] // args.tp, model["v_heads"] // args.tp
    K = V = model["head_dim"]
    W = model["conv_width"]
    lower_bound = model["gate_lower_bound"] if args.gate_lower_bound is None else args.gate_lower_bound
    rng = np.random.default_rng(args.seed)
    q = _queue(args.device)
    _say(f"libgdn_xpu {version()} | device: {_device_line(q)}")
    if q.sycl_device.is_cpu:
        _say("  (the SYCL CPU device: the Intel GPU path runs the same kernels but is untested on this machine)")
    cols = args.num_spec + 1
    num_slots = args.prefills + args.decodes + args.spec * cols + 8
    meta = make_batch(rng, num_slots=num_slots, prefill_lens=[args.prefill_len] * args.prefills,
                      num_decodes=args.decodes, spec_lens=list(rng.integers(1, cols + 1, args.spec)) if args.spec else [],
                      num_spec=args.num_spec, order="blocks")
    T = meta["num_actual_tokens"]
    cfg = Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=num_slots, conv_width=W,
                 act_dtype=args.dtype, ssm_layout="vk", conv_layout="time_major", conv_spec_layout="rolled",
                 conv_state_len=W - 1 + args.num_spec, replay_tokens=cols if args.spec_mode == "replay" else 0,
                 gate_mode=model["gate_mode"], out_gate=model["out_gate"], gate_lower_bound=lower_bound,
                 force_recurrent=args.force_recurrent, prefill_precision=args.prefill_precision)
    C, GK = cfg.conv_dim, cfg.gate_k
    gate = "a gate per key channel" if GK > 1 else "a gate per head"
    gate += f", lower bound {lower_bound:g}" if lower_bound else ""
    _say(f"{model['name']}, TP={args.tp}: H={H} HV={HV} K={K} V={V} W={W}, {gate}, {cfg.out_gate} output gate, "
         f"{args.dtype} activations, f32 state, spec decoding: {args.spec_mode} mode"
         + (", prefills through the token recurrence" if args.force_recurrent else ""))
    _say(f"batch: {args.prefills} prefills x {args.prefill_len} tokens, {args.decodes} decodes, {args.spec} spec "
         f"sequences (<= {args.num_spec} drafts, ragged), {T} tokens interleaved, {num_slots} state slots")
    engine, path = prefill_path(q, cfg)
    _say(f"prefill products (prefill_precision {args.prefill_precision}): {path}")

    # ---- inputs (host) and device arrays
    x = _Act(rng.standard_normal((T, C)), args.dtype)
    a = _Act(rng.standard_normal((T, HV * GK)), args.dtype)
    b = _Act(rng.standard_normal((T, HV)), args.dtype)
    z = _Act(rng.standard_normal((T, HV, V)), args.dtype)
    w = _Act(rng.standard_normal((C, W)) * 0.5, args.dtype)
    bias = _Act(rng.standard_normal(C) * 0.1, args.dtype)
    norm_w = _Act(rng.uniform(0.5, 1.5, V), args.dtype)
    A_log = np.log(rng.uniform(1, 16, HV)).astype(np.float32)
    dt_bias = rng.uniform(-1, 1, HV * GK).astype(np.float32)
    conv0 = _Act(rng.standard_normal((num_slots, cfg.state_len, C)), args.dtype)      # time-major
    ssm0 = (rng.standard_normal((num_slots, HV, V, K)) * 0.1).astype(np.float32)      # vk
    replay = {}
    if cfg.replay_tokens:  # the rings, and the state each spec sequence's committed slot [n][0] starts from
        replay = dict(replay_ring=UsmArray.from_numpy(np.zeros(cfg.replay_ring_shape, np.float32), q),
                      replay_count=UsmArray.from_numpy(np.zeros(cfg.replay_count_shape, np.int32), q))
    up = lambda arr: UsmArray.from_numpy(arr, q, usm_type="device")
    d = dict(mixed_qkv=up(x.store), a=up(a.store), b=up(b.store), conv_weight=up(w.store), conv_bias=up(bias.store),
             A_log=up(A_log), dt_bias=up(dt_bias), z=up(z.store), norm_weight=up(norm_w.store))
    conv_state, ssm_state = UsmArray.from_numpy(conv0.store, q), UsmArray.from_numpy(ssm0, q)
    out = UsmArray((T, HV, V), x.store.dtype, q)
    batch = to_device(meta, q)

    # ---- kernels: compiled on first use, then cached in memory and on disk
    _say("kernels: compiled on first use and kept in the library's disk cache (GDN_XPU_CACHE_DIR, default "
         "~/.cache/libgdn_xpu); a cold compile takes ~8 s on a quiet 2-core CPU host, a cached start under 0.1 s ...")
    t0 = time.perf_counter()
    warmup(q, cfg)
    t_compile = time.perf_counter() - t0
    _say(f"  kernels ready in {t_compile:.2f} s")

    if replay:
        ok, batch = _replay_check(q, cfg, meta, rng, x, a, b, z, w, bias, norm_w, A_log, dt_bias, conv0, ssm0, d,
                                  replay, T)
        _say(f"timing ({args.repeat} repeats, median) ...")
        t_all = _median_ms(lambda: attention(q, cfg, batch, conv_state=conv_state, ssm_state=ssm_state,
                                             core_attn_out=out, **d, **replay), args.repeat)
        _say(f"  gdn_attention, replay mode (whole op, fused norm): {t_all:9.2f} ms  -> {T / t_all * 1e3:,.0f} tokens/s")
        return 0 if ok else 1

    # ---- one checked step
    t0 = time.perf_counter()
    attention(q, cfg, batch, conv_state=conv_state, ssm_state=ssm_state, core_attn_out=out, **d)
    t_first = (time.perf_counter() - t0) * 1e3
    got = out.to_numpy()
    got = from_bf16_bits(got).astype(np.float64) if args.dtype == "bf16" else got.astype(np.float64)
    _say("checking against the float64 reference on k-head 0 and its v-heads ...")
    t0 = time.perf_counter()
    err = _check_subset(cfg, meta, x, a, b, z, w, bias, norm_w, A_log, dt_bias, conv0, ssm0, got, ssm_state.to_numpy())
    tol = 2e-3 if args.dtype == "f32" and engine == "f32" else 5e-2  # (bf16 operands: docs/op.md "Prefill precision")
    ok = err["out"] <= tol and err["state"] <= tol
    _say(f"  max relative error: output {err['out']:.2e}, ssm state {err['state']:.2e} (tolerance {tol:g}) -> "
         f"{'OK' if ok else 'FAILED'}   [{time.perf_counter() - t0:.1f} s]")

    # ---- timing per phase (states keep evolving; that does not change the work)
    _say(f"timing ({args.repeat} repeats, median) ...")
    conv_out = UsmArray((T, C), x.store.dtype, q, usm_type="device")
    t_conv = _median_ms(lambda: causal_conv1d(q, cfg, batch, mixed_qkv=d["mixed_qkv"], conv_weight=d["conv_weight"],
                                              conv_bias=d["conv_bias"], conv_state=conv_state, conv_out=conv_out),
                        args.repeat)
    t_delta = _median_ms(lambda: gated_delta_rule(q, cfg, batch, conv_out=conv_out, ssm_state=ssm_state,
                                                  core_attn_out=out, a=d["a"], b=d["b"], A_log=d["A_log"],
                                                  dt_bias=d["dt_bias"]), args.repeat)
    t_all = _median_ms(lambda: attention(q, cfg, batch, conv_state=conv_state, ssm_state=ssm_state, core_attn_out=out,
                                         **d), args.repeat)
    _say(f"  first call (incl. workspace allocation): {t_first:9.2f} ms")
    _say(f"  causal_conv1d                          : {t_conv:9.2f} ms")
    _say(f"  gated delta rule (prep+recurrent+chunk): {t_delta:9.2f} ms")
    _say(f"  gdn_attention (whole op, fused norm)   : {t_all:9.2f} ms  -> {T / t_all * 1e3:,.0f} tokens/s")
    return 0 if ok else 1


def _replay_check(q, cfg, meta, rng, x, a, b, z, w, bias, norm_w, A_log, dt_bias, conv0, ssm0, d, replay, T):
    """Replay mode: two steps of the batch (the second replays the first's accepted tokens), each
    step's outputs against the reference's (per-token semantics) on k-head 0's v-heads, then the
    spec sequences' committed slots flushed and their states against the reference's. Returns
    (ok, a batch to time: the last acceptance, which the rings hold enough tokens for)."""
    n_spec = meta["num_spec_decodes"]
    slots = np.asarray(meta["spec_state_indices"], np.int32).reshape(n_spec, -1)
    accepted = np.asarray(meta["num_accepted_tokens"], np.int32)
    lens = np.diff(np.asarray(meta["spec_query_start_loc"]))
    # Replay mode keeps a spec sequence's state in [n][0]: start it from what the per-token mode reads.
    ssm_r = ssm0.copy()
    ssm_r[slots[:, 0]] = ssm0[slots[np.arange(n_spec), accepted - 1]]
    conv_state, ssm_state = UsmArray.from_numpy(conv0.store, q), UsmArray.from_numpy(ssm_r, q)
    out = UsmArray((T, cfg.num_v_heads, cfg.head_v_dim), x.store.dtype, q)
    r = cfg.num_v_heads // cfg.num_k_heads
    ref_conv, ref_ssm = _subset_caches(cfg, conv0, ssm0)                    # the reference's caches, k-head 0
    ok, tol = True, 2e-3 if cfg.act_dtype == "f32" else 5e-2
    for step in range(2):
        if step:  # new tokens; this step's acceptance of the last step's drafts
            accepted = np.array([rng.integers(1, n + 1) for n in lens], np.int32)
            meta = dict(meta, num_accepted_tokens=accepted)
            x = _Act(rng.standard_normal(x.store.shape), cfg.act_dtype)
            d["mixed_qkv"] = UsmArray.from_numpy(x.store, q, usm_type="device")
        attention(q, cfg, to_device(meta, q), conv_state=conv_state, ssm_state=ssm_state, core_attn_out=out, **d,
                  **replay)
        got = out.to_numpy()
        got = from_bf16_bits(got).astype(np.float64) if cfg.act_dtype == "bf16" else got.astype(np.float64)
        o, ref_conv, ref_ssm = _subset_reference(cfg, meta, x, a, b, z, w, bias, norm_w, A_log, dt_bias, ref_conv,
                                                 ref_ssm)
        err = float(np.max(np.abs(got[:, :r] - o)) / max(np.max(np.abs(o)), 1e-12))
        ok = ok and err <= tol
        _say(f"  replay mode, step {step + 1}: max relative output error {err:.2e} against the reference "
             f"(tolerance {tol:g}) -> {'OK' if err <= tol else 'FAILED'}")
    final = np.array([rng.integers(1, n + 1) for n in lens], np.int32)  # the next step's acceptance
    flush_replay(q, cfg, UsmArray.from_numpy(slots[:, 0].copy(), q), UsmArray.from_numpy(final, q),
                 ssm_state=ssm_state, **replay)
    got = np.swapaxes(ssm_state.to_numpy()[slots[:, 0], :r].astype(np.float64), 2, 3)
    want = ref_ssm[slots[np.arange(n_spec), final - 1]]
    err = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-12)) if n_spec else 0.0
    ok = ok and err <= tol
    _say(f"  replay mode, flushed states against the reference's per-token states: max relative error {err:.2e} -> "
         f"{'OK' if err <= tol else 'FAILED'}")
    return ok, to_device(dict(meta, num_accepted_tokens=final), q)


def _subset_channels(cfg):
    """conv_dim columns of k-head 0 and the v-heads that use it (GVA group 0): q0 | k0 | v of heads 0..r-1."""
    H, HV, K, V = cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
    return np.r_[0:K, H * K:H * K + K, 2 * H * K:2 * H * K + HV // H * V]


def _subset_caches(cfg, conv0, ssm0):
    """The reference's caches of that subset: conv [slots, C_sub, state_len], ssm [slots, r, K, V] (from vk)."""
    r = cfg.num_v_heads // cfg.num_k_heads
    return (np.swapaxes(conv0.f64, 1, 2)[:, _subset_channels(cfg), :],
            np.swapaxes(ssm0[:, :r].astype(np.float64), 2, 3))


def _subset_reference(cfg, meta, x, a, b, z, w, bias, norm_w, A_log, dt_bias, conv, ssm):
    """ref.gdn_attention on k-head 0 and its v-heads, every input sliced to them (gates: cfg.gate_k per
    v-head), with the config's gate and output-gate settings. Returns (out, conv, ssm) of the subset."""
    r, gk, ch = cfg.num_v_heads // cfg.num_k_heads, cfg.gate_k, _subset_channels(cfg)
    return ref.gdn_attention(x.f64[:, ch], a.f64[:, :r * gk], b.f64[:, :r], w.f64[ch], bias.f64[ch], A_log[:r],
                             dt_bias[:r * gk], conv, ssm, meta, 1, r, cfg.head_k_dim, cfg.head_v_dim,
                             spec_layout=cfg.conv_spec_layout, z=z.f64[:, :r], norm_weight=norm_w.f64,
                             lower_bound=cfg.gate_lower_bound, out_gate=cfg.out_gate)


def _check_subset(cfg, meta, x, a, b, z, w, bias, norm_w, A_log, dt_bias, conv0, ssm0, got_out, got_ssm):
    """Reference on k-head 0 and the v-heads that use it (GVA group 0): slice every array."""
    r = cfg.num_v_heads // cfg.num_k_heads
    conv_canon, ssm_canon = _subset_caches(cfg, conv0, ssm0)
    o, _, ssm = _subset_reference(cfg, meta, x, a, b, z, w, bias, norm_w, A_log, dt_bias, conv_canon, ssm_canon)
    rel = lambda g, w_: float(np.max(np.abs(g - w_)) / max(np.max(np.abs(w_)), 1e-12))
    got_ssm_canon = np.swapaxes(got_ssm[:, :r].astype(np.float64), 2, 3)
    return {"out": rel(got_out[:, :r], o), "state": rel(got_ssm_canon, ssm)}


if __name__ == "__main__":
    sys.exit(main())
