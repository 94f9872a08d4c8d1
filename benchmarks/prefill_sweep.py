"""Prefill rows measured for pygdn alone (no peers): the per-token cost sweep from 512 to 131072
tokens (the flatness target: within 1.2x), and the cost of block checkpoints during a prefill
(every 256 tokens against none)."""
from __future__ import annotations

import numpy as np

import pygdn

from cases import H, HV, K, V, Ours, Unsupported, chunked_flops, make_case, rel_err
from timing import FOREIGN_FLAG, CpuWatch, call_times, first_call_s, timed_blocks, wait_quiet

CHECKPOINT_INTERVAL = 256


def mem_available():
    """Bytes the kernel says can be allocated without swapping (MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def bytes_needed(lens, act):
    """Host + USM bytes of one sweep point: mixed_qkv (host copy and USM), a/b, the output and
    the call's workspace (conv output, normalized q/k, gates and the chunk matrices)."""
    T, n = sum(lens), len(lens)
    e = 2 if act == "bf16" else 4
    C = 2 * H * K + HV * V
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=n, act_dtype=act)
    ws = pygdn.workspace_size(cfg, pygdn.Batch(num_actual_tokens=T, num_prefills=n, non_spec_token_count=T))
    return 2 * T * C * e + 4 * T * HV * e + T * HV * V * e + ws


def sweep_label(lens):
    return f"{lens[0]}" if len(lens) == 1 else f"{len(lens)}x{lens[0]}"


def run_sweep_point(queue, lens, act, plan, log, seed=0):
    """One prefill (one sequence, or several of equal length) timed alone: a warm-up call (it
    also touches the workspace's pages), then repeats within plan["sweep_budget_s"] (at least 2).
    Returns its record: median seconds, µs/token, FLOP rate, other processes' CPU share."""
    T = sum(lens)
    rec = {"kind": "sweep", "label": f"prefill {sweep_label(lens)}", "lens": list(lens), "tokens": T, "act": act}
    need, avail = bytes_needed(lens, act), mem_available()
    rec["bytes_needed"] = need
    if avail is not None and need > 0.8 * avail:
        rec["skipped"] = (f"needs ~{need / 2**30:.1f} GiB of memory, {avail / 2**30:.1f} GiB available now "
                          f"(other processes hold the rest)")
        log(f"{rec['label']:<18s} {T:7d}  SKIPPED: {rec['skipped']}")
        return rec
    case = make_case("prefill", act, lens=lens, seed=seed, lean=True)
    rec["flops"] = chunked_flops(case)
    ours = Ours(queue, case, own_workspace=True)   # its workspace is freed with it
    case.x = None  # uploaded: the host copy (2 GiB at 131072 tokens) is not needed any more
    rec["waited_for_quiet_s"] = wait_quiet(plan)
    first = first_call_s(ours.step)
    reps = max(2, min(plan["sweep_reps"], int(plan["sweep_budget_s"] / max(first, 1e-6))))
    watch, cpu0 = CpuWatch(), own_cpu_s()
    ts = call_times(ours.step, reps)
    cpu = (own_cpu_s() - cpu0) / reps
    rec["foreign_cpu"] = watch.foreign()
    del ours
    med = float(np.median(ts))
    rec["ours"] = {"median_s": med, "min_s": min(ts), "reps": reps, "first_s": first,
                   "us_per_token": med / T * 1e6, "GFLOPs": rec["flops"] / med / 1e9,
                   "cpu_us_per_token": cpu / T * 1e6}
    return rec


def own_cpu_s():
    """CPU seconds of this process (all its threads): a point's CPU time per token is not
    charged for preemption by other processes, which the wall time is (a stalled core is charged,
    and so are the runtime's spinning threads), so it tells growth from noise on a shared host."""
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_sweep(queue, points, act, plan, log):
    """The points in plan["sweep_rounds"] rounds, every other round in reverse order, each point
    keeping its fastest round: other tenants of the host (invisible to the foreign-CPU flag) move a
    single measurement by tens of percent, and a flatness verdict compares points measured minutes
    apart."""
    rounds = plan.get("sweep_rounds", 1)
    log.detail("")
    log(f"prefill sweep: pygdn alone, per-token cost of {', '.join(sweep_label(p) for p in points)} tokens "
        f"(median of >= 2 calls after a warm-up call, the faster of {rounds} round{'s' if rounds > 1 else ''}; "
        f"{act} activations, f32 state, one sequence unless NxL) ...")
    log.detail(f"{'case':<18s} {'tokens':>7s} {'ms/call':>10s} {'us/token':>9s} {'GFLOP/s':>8s} {'% peak':>7s}  vs first  "
        f"cpu-us/token (vs first)")
    best = {}
    for r in range(rounds):
        for lens in (points if r % 2 == 0 else points[::-1]):
            rec = run_sweep_point(queue, lens, act, plan, log)
            old = best.get(lens)
            if "ours" in rec:
                rec["rounds_us_per_token"] = (old or {}).get("rounds_us_per_token", []) + [rec["ours"]["us_per_token"]]
                if old is None or "ours" not in old or rec["ours"]["us_per_token"] < old["ours"]["us_per_token"]:
                    best[lens] = rec
                else:
                    old["rounds_us_per_token"] = rec["rounds_us_per_token"]
            elif old is None:
                best[lens] = rec
    out = [best[lens] for lens in points]
    for rec in out:
        if "ours" in rec:
            log.detail(sweep_line(rec, out, plan) + (f"  rounds: {', '.join(f'{x:.1f}' for x in rec['rounds_us_per_token'])}"
                                              if rounds > 1 else ""))
    return out


def sweep_line(rec, recs, plan):
    o = rec["ours"]
    first = next((r for r in recs if "ours" in r), rec)["ours"]
    base, cbase = first["us_per_token"], first.get("cpu_us_per_token")
    peak = plan["peak"]["numpy_matmul_GFLOPs"]
    busy = rec.get("foreign_cpu", 0.0)
    return (f"{rec['label']:<18s} {rec['tokens']:7d} {o['median_s'] * 1e3:10.1f} {o['us_per_token']:9.1f} "
            f"{o['GFLOPs']:8.1f} {100 * o['GFLOPs'] / peak:6.1f}%  {o['us_per_token'] / base:5.2f}x"
            + (f"   {o['cpu_us_per_token']:8.1f} ({o['cpu_us_per_token'] / cbase:4.2f}x)" if cbase else "")
            + (f"  [other processes {100 * busy:.0f}% CPU]" if busy > FOREIGN_FLAG else ""))


def run_checkpoint_case(queue, lens, act, plan, log, interval=CHECKPOINT_INTERVAL):
    """The same prefill with block checkpoints every `interval` tokens and without:
    their times, the cost, and a check that checkpoints leave outputs and final state as they were.
    Model of the cost: the checkpoint states written (one ssm state per boundary) at the measured
    bandwidth."""
    case = make_case("prefill", act, lens=lens, seed=7)
    label = f"prefill {sweep_label(lens)}"
    rec = {"kind": "checkpoints", "label": f"{label} ckpt/{interval}", "lens": list(lens), "tokens": case.rows,
           "interval": interval}
    if "checkpoints" in plan["unsupported"]:
        rec["unsupported"] = plan["unsupported"]["checkpoints"]
        return rec
    plain = Ours(queue, case)
    first = first_call_s(plain.step)
    try:
        ck = Ours(queue, case, checkpoint_interval=interval)
        ck_first = first_call_s(ck.step)
    except Unsupported as e:
        plan["unsupported"]["checkpoints"] = rec["unsupported"] = str(e)
        log(f"{rec['label']:<18s} checkpoints: not supported by this build ({e})")
        return rec
    (o1, s1), (o2, s2) = plain.result(), ck.result()
    rec["agreement"] = {"out": rel_err(o2, o1), "ssm": rel_err(s2, s1)}
    rec["agreement"]["ok"] = bool(max(rec["agreement"]["out"], rec["agreement"]["ssm"]) <= 1e-3)
    boundaries = sum(L // interval for L in lens)
    rec["checkpoint_bytes"] = boundaries * case.HV * case.K * case.V * 4 + boundaries * (case.W - 1) * case.C * \
        (2 if act == "bf16" else 4)
    rec["waited_for_quiet_s"] = wait_quiet(plan)
    reps = plan["reps_ours"]["prefill"]
    stats, foreign = timed_blocks({"ours": (plain.step, reps, first), "ours_checkpoints": (ck.step, reps, ck_first)},
                                  plan["budget_s"], together=("ours", "ours_checkpoints"))
    rec.update(stats)
    rec["foreign_cpu"] = foreign
    rec["cost"] = stats["ours_checkpoints"]["median_s"] / stats["ours"]["median_s"] - 1.0
    rec["model_cost_s"] = rec["checkpoint_bytes"] / (plan["bw"]["reference_GBps"] * 1e9)
    log.detail(checkpoint_line(rec))
    log.brief(f"  {rec['label']}: {100 * rec['cost']:+.1f}% against none")
    return rec


def checkpoint_line(rec):
    if "unsupported" in rec:
        return f"{rec['label']:<22s} checkpoints: not supported by this build ({rec['unsupported']})"
    busy = rec.get("foreign_cpu", 0.0)
    a = rec["agreement"]
    return (f"{rec['label']:<22s} none {rec['ours']['median_s'] * 1e3:8.2f} ms, every {rec['interval']} tokens "
            f"{rec['ours_checkpoints']['median_s'] * 1e3:8.2f} ms: cost {100 * rec['cost']:+.1f}% "
            f"({rec['checkpoint_bytes'] / 2**20:.0f} MiB of checkpoints = {rec['model_cost_s'] * 1e3:.2f} ms at the "
            f"measured bandwidth); outputs/state vs none {a['out']:.1e}/{a['ssm']:.1e}{'' if a['ok'] else ' MISMATCH'}"
            + (f"  [other processes {100 * busy:.0f}% CPU]" if busy > FOREIGN_FLAG else ""))
