"""The benchmark's report: the detailed line of each case, the targets with their verdicts, the plot.
The table a run ends with is table.py's."""
from __future__ import annotations

import os
import re

import numpy as np

from timing import FOREIGN_FLAG


class Log:
    """The run's output: progress and the closing table always; the detailed lines (each row's
    numbers as it is measured, the cache-format and sweep tables, the targets' evidence) with
    --verbose only. The JSON record keeps all of them."""

    def __init__(self, verbose=False):
        self.verbose = verbose

    def __call__(self, msg=""):
        print(msg, flush=True)

    def detail(self, msg=""):
        if self.verbose:
            print(msg, flush=True)

    def brief(self, msg=""):
        """A progress line that a detailed one replaces under --verbose."""
        if not self.verbose:
            print(msg, flush=True)

# The targets, each bar once: targets() judges the run by them, table.py each row.
BW_B8 = 0.80           # decode & spec at B >= 8: share of the bandwidth beside the row (f32 and bf16 state)
BW_B1 = 0.50           # decode & spec at B = 1: the same share
DECODE_PASS = 0.85     # decode rows (B = 1 and 8, f32 and bf16 state): share of their own bare state pass
SPEC_BW_B8 = 0.50      # spec decode at B >= 8, the first bandwidth bar (f32 state)
SPEC_VS_TORCH = 5.0    # spec decode at B >= 8: torch fallback time / ours
PREFILL_PEAK = 0.70    # chunked prefill of 2048 tokens: share of the matmul peak
PREFILL_VS_TORCH = 3.0  # chunked prefill of 2048 tokens: torch fallback time / ours
CONV_VS_BYTES = 2.0    # the 2048-token prefill's conv alone: its time / its bytes' time at the run's bandwidth
KV_VS_VK = 1.2         # kv ssm layout's time / vk's, every decode / spec row
FLAT = 1.2             # prefill per-token cost, largest / smallest
PLAIN_CALL_US = 40.0   # plain pygdn.attention() per call, tiny padded batch
PREPARED_CALL_US = 60.0  # prepared pygdn call
C_ABI_US = 12.0        # C ABI per call with GDN_VALIDATE_COUNTS
C_ABI_FIRST_US = 20.0  # ... the first bar
KDA_VS_GDN = 1.3       # KDA decode B=8 and prefill 2048: time / GDN's at the same H*K*V (same state traffic)

# The record key of a row's KDA twin (cases.add_twin): a decode / spec / prefill step with Kimi
# Linear's per-channel gates at the same H*K*V as the row, timed in the row's rounds.
KDA_TWIN = "ours_kda"


def _fmt_ms(s):
    return f"{s * 1e3:9.2f}" if s < 10 else f"{s:8.1f}s"


def _peer_cell(rec, name):
    p = rec.get(name)
    if p is None:
        return "       -          "
    if "error" in p:
        return " not installed    " if p.get("not_installed") else "     FAILED       "
    bad = "" if p["agreement_vs_ours"]["ok"] else "!"
    return f"{_fmt_ms(p['median_s'])} {p['ratio']:6.2f}x{bad:1s} "


# The reference's stream kernels timed beside each decode / spec row (machine.reference_passes):
# record key, kind. "ref_pass" (in place, read + write) is the row's reference.
REFERENCE_PASSES = (("ref_pass", "rw"), ("ref_read", "read"), ("ref_write", "write"))
REFERENCE_PASS = REFERENCE_PASSES[0][0]


def rw_bound_share(rec, name, plan):
    """Of a decode / spec row's implementation `name` (ours or a cache-format variant): the time of
    its read/write bound (bytes read at the read-only stream rate and bytes written at the
    write-only rate, both timed beside the row, else at the run's start and end; overlapped: the
    larger of the two) over its measured time; None when the run has no read/write rates."""
    v = rec.get(name, {})
    rw = v.get("bytes_read_written")  # in its state dtype's bytes (cases.run_case)
    read, write = (rec.get(k, {}).get("GBps") for k, _ in REFERENCE_PASSES[1:])
    if not (read and write):  # not timed beside the row: the run's start and end
        read, write = plan["bw"].get("kernel_read_GBps"), plan["bw"].get("kernel_write_GBps")
    if not (read and write and rw and "median_s" in v):
        return None
    return max(rw[0] / read, rw[1] / write) / 1e9 / v["median_s"]


def row_reference(rec, plan):
    """The bandwidth a row's % is of: for a decode / spec row, the reference's stream kernel timed
    beside it in the row's rounds (the best of its repeats: what the memory moved in the row's
    minutes, machine.reference_passes); else, or where that was not measured, the run's reference
    (measured at its start and end)."""
    return rec.get(REFERENCE_PASS, {}).get("GBps") or plan["bw"]["reference_GBps"]


def beside_GBps(records):
    """The rates of the reference's stream kernel timed beside the rows (those that have one)."""
    return [r[REFERENCE_PASS]["GBps"] for r in records if "GBps" in r.get(REFERENCE_PASS, {})]


def state_pass_share(rec, name, plan):
    """Of a decode / spec row: its state pass `name` (STATE_PASSES) as the row is read -- the
    traffic model's bytes over the pass's time, as a share of the row's reference: what the row
    would read if its step took no longer than moving its state alone."""
    v = rec.get(name, {})
    return v["GBps"] / row_reference(rec, plan) if "GBps" in v else None


def row_line(rec, plan):
    bw = row_reference(rec, plan)
    o = rec["ours"]
    extra = f"{o['GBps']:6.2f} GB/s {100 * o['GBps'] / bw:5.1f}%"
    extra += f" of {bw:.1f}" + (" beside" if REFERENCE_PASS in rec else "")
    share = rw_bound_share(rec, "ours", plan)
    extra += f" (r/w bound {100 * share:.0f}%)" if share is not None else ""
    sp = state_pass_share(rec, "state_pass", plan)
    extra += f" [state pass alone {100 * sp:.0f}%]" if sp is not None else ""
    if "GFLOPs" in o:
        extra += f" {o['GFLOPs']:6.1f} GF/s {100 * o['GFLOPs'] / plan['peak']['numpy_matmul_GFLOPs']:5.1f}%"
    kv = rec.get("ours_kv_layout", {})
    extra += f"  kv {kv['vs_ours']:.2f}x" if "vs_ours" in kv else ""
    for name, sd in STATE_DTYPE_VARIANTS[1:]:
        v = rec.get(name, {})
        extra += f"  {sd} state {v['median_s'] * 1e3:.2f} ms {100 * v['GBps'] / bw:.0f}%" if "GBps" in v else ""
    for name, precision in (("ours_prefill_f32", "f32"), ("ours_prefill_bf16", "bf16")):
        v = rec.get(name, {})
        extra += f"  {precision} prefill {v['median_s'] * 1e3:.2f} ms ({v['vs_ours']:.2f}x ours)" if "vs_ours" in v else ""
    kda = rec.get(KDA_TWIN, {})
    if "vs_gdn" in kda:
        rate = (f"{100 * kda['GFLOPs'] / plan['peak']['numpy_matmul_GFLOPs']:.0f}% of peak" if "GFLOPs" in kda
                else f"{100 * kda['GBps'] / bw:.0f}%")
        ag = kda.get("agreement_vs_reference", {})
        extra += f"  KDA {kda['median_s'] * 1e3:.2f} ms {rate} ({kda['vs_gdn']:.2f}x GDN)" + (
            f" ref {ag['out']:.1e}/{ag['ssm']:.1e}{'' if ag['ok'] else ' MISMATCH'}" if ag else "")
    busy = rec.get("foreign_cpu", 0.0)
    extra += f"  [other processes {100 * busy:.0f}% CPU]" if busy > FOREIGN_FLAG else ""
    single = [n for n in ("ours", "numpy", "torch") if rec.get(n, {}).get("first_call_only")]
    extra += f"  [{'/'.join(single)}: one call only]" if single else ""
    return (f"{rec['label']:<18s} {rec['tokens']:6d} {_fmt_ms(o['median_s'])} "
            f"{_peer_cell(rec, 'numpy')}{_peer_cell(rec, 'torch')}{extra}")


def progress_line(rec, plan):
    """A row as it finishes, in brief: our time and its share of the row's bound."""
    o = rec["ours"]
    if "GFLOPs" in o:
        share = f"{100 * o['GFLOPs'] / plan['peak']['numpy_matmul_GFLOPs']:.0f}% of the matmul peak"
    else:
        share = f"{100 * o['GBps'] / row_reference(rec, plan):.0f}% of {row_reference(rec, plan):.0f} GB/s"
    return f"  {rec['label']:<18s} {o['median_s'] * 1e3:9.3f} ms  {share}"


HEADER = (f"{'case':<18s} {'tokens':>6s} {'ours ms':>9s} {'numpy ms':>9s} {'ratio':>7s}  {'torch ms':>9s} "
          f"{'ratio':>7s}  {'ours: traffic rate, % of BW':<27s} [prefill: FLOP rate, % of peak] [kv layout / vk time]"
          f" [bf16 / i8 / f8e4m3 state: time, % of BW]")


# ----------------------------------------------------------------------------- cache variants
VARIANT_LABELS = (("ours", "f32 vk"), ("ours_kv_layout", "f32 kv"), ("ours_bf16_state", "bf16 vk"),
                  ("ours_bf16_state_kv", "bf16 kv"), ("ours_i8_state", "i8 vk"), ("ours_f8e4m3_state", "f8e4m3 vk"))
# A decode / spec row's step per state dtype, vk layout: (record key, state dtype).
STATE_DTYPE_VARIANTS = (("ours", "f32"), ("ours_bf16_state", "bf16"), ("ours_i8_state", "i8"),
                        ("ours_f8e4m3_state", "f8e4m3"))
# Each decode / spec row's state traffic alone, moved by bare stream kernels (machine.StatePass),
# in each state dtype's bytes (8-bit: the codes and the row scales): name, state dtype.
STATE_PASSES = (("state_pass", "f32"), ("state_pass_bf16", "bf16"), ("state_pass_i8", "i8"),
                ("state_pass_f8e4m3", "f8e4m3"))
PASS_OF_DTYPE = {sd: name for name, sd in STATE_PASSES}  # state dtype -> its bare pass's name


def own_pass_share(rec, name):
    """Of a decode / spec row's step `name` in a state dtype (STATE_DTYPE_VARIANTS): the time of its
    own bare state pass (the pass in that dtype's bytes) / the step's time; None when either is missing."""
    sd = dict(STATE_DTYPE_VARIANTS).get(name)
    v, p = rec.get(name, {}), rec.get(PASS_OF_DTYPE.get(sd), {})
    return p["median_s"] / v["median_s"] if "median_s" in v and "median_s" in p else None


def vs_bf16_lines(records):
    """The 8-bit states' step time / the bf16 state's (same rounds), every decode / spec row that has both."""
    out = []
    for name, sd in STATE_DTYPE_VARIANTS[2:]:
        vals = [f"{r['label']} {r[name]['vs_bf16']:.2f}x" for r in records if "vs_bf16" in r.get(name, {})]
        if vals:
            out.append(f"{sd} / bf16 state time: " + ", ".join(vals))
    return out
# A spec row's replay-mode state traffic alone (each state read once, written once), per
# cases.REPLAY_VARIANTS entry: name, state dtype.
REPLAY_PASSES = (("state_pass_replay", "f32"), ("state_pass_replay_bf16", "bf16"))


# The arithmetic of one token update per state element (FLOPs, an FMA counting 2): with outputs
# S^T k and S^T q (an FMA each) and the update d S + k u^T (a product and an FMA); a replayed
# token, state only, has no S^T q.
TOKEN_FLOPS, REPLAY_TOKEN_FLOPS = 7, 5


def replay_flops(r, state_elems):
    """FLOPs of a spec row's step in replay mode: its 1+S tokens with outputs and the accepted
    tokens of the step before replayed, on each of its sequences' states (state_elems = HV K V);
    the state arithmetic only."""
    return state_elems * (r["batch"] * (r["num_spec"] + 1) * TOKEN_FLOPS + sum(r["num_accepted"]) * REPLAY_TOKEN_FLOPS)


def _cell_mark(v):
    """A variant's cell mark: '!' its results disagree with the step it is checked against, '*'
    one step only (it outlasted the row's time budget), else none."""
    if not v.get("agreement_vs_ours", {}).get("ok", True):
        return "!"
    return "*" if v.get("first_call_only") else ""


def replay_lines(records, peak_gflops=None, state_elems=None):
    """Spec rows in the per-token mode against replay mode (same rounds), f32 and bf16 state:
    times, the speedup (per-token / replay), the replay's share of its bare pass (the time a pass
    reading and writing each state once takes / the replay's time) and of the FMA peak (its
    replay_flops at the numpy f32 matmul peak / its time)."""
    lines = [f"{'case':<18s} " + " | ".join(f"{sd + ' per-token ms':>17s} {'replay ms':>10s} {'speedup':>7s} {'%pass':>5s} "
                                           f"{'%peak':>5s}" for sd in ("f32", "bf16"))]
    for r in records:
        if r["kind"] != "spec" or "ours_replay" not in r:
            continue
        cells = []
        for pt, name, pname in (("ours", "ours_replay", "state_pass_replay"),
                                ("ours_bf16_state", "ours_replay_bf16_state", "state_pass_replay_bf16")):
            v, p = r.get(name, {}), r.get(pname, {})
            if "median_s" not in v or "median_s" not in r.get(pt, {}):
                cells.append(f"{'-':>17s} {'':>10s} {'':>7s} {'':>5s} {'':>5s}")
                continue
            bad = _cell_mark(v)
            share = f"{100 * p['median_s'] / v['median_s']:4.0f}%" if "median_s" in p else "    -"
            fma = f"{100 * replay_flops(r, state_elems) / 1e9 / peak_gflops / v['median_s']:4.0f}%" if peak_gflops and state_elems else "    -"
            cells.append(f"{r[pt]['median_s'] * 1e3:17.3f} {v['median_s'] * 1e3:9.3f}{bad:1s} "
                         f"{r[pt]['median_s'] / v['median_s']:6.2f}x {share:>5s} {fma:>5s}")
        lines.append(f"{r['label']:<18s} " + " | ".join(cells))
    return lines


def variants_lines(records, plan):
    """Decode / spec rows once per ssm cache format: time, traffic (MB per step, in the state dtype's
    bytes; 8-bit: with the row scales), its rate and % of the measured bandwidth, % of the read/write
    bound (rw_bound_share), % of its own bare state pass (own_pass_share, vk layouts), and the kv
    layout's time against the vk layout's; then the row's state passes (state_pass_share), and the
    8-bit states' times against the bf16 state's (vs_bf16_lines)."""
    lines = [f"{'case':<18s} " + " | ".join([f"{lab + ' ms':>12s} {'MB':>6s} {'GB/s':>6s} {'%BW':>5s} {'%rw':>4s} "
                                             f"{'%own':>4s} {'/vk':>5s}" for _, lab in VARIANT_LABELS]
                                            + [f"{sd + ' pass ms':>14s} {'%BW':>5s}" for _, sd in STATE_PASSES])]
    for r in records:
        if r["kind"] not in ("decode", "spec"):
            continue
        bw, cells = row_reference(r, plan), []
        for name, lab in VARIANT_LABELS:
            v = r.get(name)
            if not v or "median_s" not in v:
                cells.append(f"{'-':>12s} {'':>6s} {'':>6s} {'':>5s} {'':>4s} {'':>4s} {'':>5s}")
                continue
            vs_vk = ""
            if name == "ours_kv_layout":
                vs_vk = f"{v['vs_ours']:5.2f}"
            elif name == "ours_bf16_state_kv" and "median_s" in r.get("ours_bf16_state", {}):
                vs_vk = f"{v['median_s'] / r['ours_bf16_state']['median_s']:5.2f}"
            bad = _cell_mark(v)
            share = rw_bound_share(r, name, plan)
            rw = f"{100 * share:3.0f}%" if share is not None else ""
            own = own_pass_share(r, name)
            own = f"{100 * own:3.0f}%" if own is not None else ""
            mb = sum(v["bytes_read_written"]) / 1e6 if "bytes_read_written" in v else float("nan")
            cells.append(f"{v['median_s'] * 1e3:11.3f}{bad:1s} {mb:6.2f} {v['GBps']:6.2f} {100 * v['GBps'] / bw:4.0f}% "
                         f"{rw:>4s} {own:>4s} {vs_vk:>5s}")
        for name, _ in STATE_PASSES:
            v, f = r.get(name, {}), state_pass_share(r, name, plan)
            cells.append(f"{v['median_s'] * 1e3:14.3f} {100 * f:4.0f}%" if f is not None else f"{'-':>14s} {'':>5s}")
        lines.append(f"{r['label']:<18s} " + " | ".join(cells))
    for name, lab in VARIANT_LABELS:
        if name in plan.get("unsupported", {}):
            lines.append(f"  {lab.split()[0]} state{' (' + lab.split()[1] + ' layout)' if 'kv' in lab else ''}: "
                         f"not supported by this build ({plan['unsupported'][name]})")
    return lines + vs_bf16_lines(records)


# ----------------------------------------------------------------------------- targets
def verdict(ok, foreign):
    """PASS only from a quiet measurement: a target met while other processes shared the cores
    reads NOISY (the shared bandwidth / peak reference can flatter a ratio as much as the
    contention hurts it)."""
    if ok is None:
        return "n/a"
    if not ok:
        return "FAIL"
    return "PASS" if foreign <= FOREIGN_FLAG else "NOISY"


def _noise_note(verdict, foreign):
    if foreign <= FOREIGN_FLAG or verdict == "n/a":
        return ""
    if verdict == "NOISY":
        return f" [met on these numbers, NOT claimed: other processes used up to {100 * foreign:.0f}% of the CPU]"
    return f" [noisy: other processes used up to {100 * foreign:.0f}% of the CPU]"


def _target(out, key, name, ok, detail, foreign, value=None, at=None):
    """One target's verdict; key names it for table.py, value (and the row it is `at`) is the
    number judged."""
    v = verdict(ok, foreign)
    out.append({"key": key, "target": name, "verdict": v, "detail": detail + _noise_note(v, foreign),
                "foreign_cpu": foreign, "value": value, "at": at})


def rows_foreign(recs, base):
    return max([base] + [r.get("foreign_cpu", 0.0) for r in recs])


def base_foreign(plan, run_foreign):
    """The noise share every verdict carries: the largest of the whole run's and of the reference
    measurements' (the bandwidth measurement that became the reference, the peak)."""
    end = plan["bw"].get("end", {})
    end_used = end.get("reference_GBps", 0.0) >= plan["bw"]["reference_GBps"]  # the end measurement became it
    return max(run_foreign, plan["bw"].get("foreign_cpu_start", 0.0), end.get("foreign_cpu", 0.0) if end_used else 0.0,
               plan["peak"].get("foreign_cpu", 0.0))


def targets(records, plan, torch_msg, ho=None, sweep=(), run_foreign=0.0):
    """The targets with their verdicts (table.py shows each beside its rows; --verbose and the JSON
    record list them with their evidence). Each verdict's noise share is the larger of
    base_foreign's and that of the rows it uses."""
    bw, peak = plan["bw"]["reference_GBps"], plan["peak"]["numpy_matmul_GFLOPs"]
    base = base_foreign(plan, run_foreign)
    out = []
    _limit_targets(out, records, plan, ho, sweep, base, bw, peak)
    _peer_targets(out, records, plan, torch_msg, ho, base)
    _kda_targets(out, records, plan, base, peak)
    return out


def kda_ratios(records, kinds=("decode", "spec", "prefill")):
    """(KDA twin's time / the row's, row label) of every row of these kinds with a timed twin."""
    return [(r[KDA_TWIN]["vs_gdn"], r["label"]) for r in records
            if r["kind"] in kinds and "vs_gdn" in r.get(KDA_TWIN, {})]


def _kda_targets(out, records, plan, base, peak):
    """The KDA twins: the time bar against GDN (decode B=8 and prefill 2048 tokens, the rows it is set
    on; every twin listed), and the bounds of the GDN rows applied to them (bandwidth at B >= 8,
    matmul peak at 2048 tokens)."""
    rows = [r for r in records if "vs_gdn" in r.get(KDA_TWIN, {})]
    on = [r for r in rows if (r["kind"] == "decode" and r["batch"] == 8)
          or (r["kind"] == "prefill" and r["tokens"] == 2048 and r["batch"] == 1)]
    name = f"KDA decode B=8 and prefill 2048 within {KDA_VS_GDN}x of GDN's time at the same H*K*V"
    if not on:
        _target(out, "kda_vs_gdn", name, None, "no KDA twin of decode B=8 or prefill 2048 ran", base)
    else:
        worst = max(kda_ratios(on))
        _target(out, "kda_vs_gdn", name, worst[0] <= KDA_VS_GDN, f"worst {worst[0]:.2f}x ({worst[1]}); all: "
                + ", ".join(f"{lab} {x:.2f}x" for x, lab in kda_ratios(rows)) + " (KDA time / GDN time, same rounds)",
                rows_foreign(on, base), worst[0], worst[1])
    b8 = [r for r in rows if r["kind"] in ("decode", "spec") and r["batch"] >= 8]
    name = f"KDA decode & spec at B>=8 >= {BW_B8:.0%} of measured bandwidth, f32 state"
    if b8:
        vals = [(r[KDA_TWIN]["GBps"] / row_reference(r, plan), r[KDA_TWIN]["label"]) for r in b8]
        worst = min(vals)
        _target(out, "kda_bw_b8", name, worst[0] >= BW_B8, f"min {100 * worst[0]:.1f}% ({worst[1]}); all: "
                + ", ".join(f"{lab} {100 * f:.0f}%" for f, lab in vals) + "; of the stream kernel timed beside the row",
                rows_foreign(b8, base), worst[0], worst[1])
    else:
        _target(out, "kda_bw_b8", name, None, "no KDA twin at B >= 8 ran", base)
    _prefill_peak_target(out, "kda_prefill_peak", "KDA chunked prefill", rows, KDA_TWIN,
                         "chunked-form FLOPs with per-channel decays", "no KDA twin of the 2048-token prefill ran",
                         base, peak)


def _prefill_peak_target(out, tkey, what, records, key, flops, missing, base, peak):
    """The 2048-token prefill's share of the matmul peak, its record r[key] ("ours" or a KDA twin)."""
    p2k = [r for r in records if r["kind"] == "prefill" and r["tokens"] == 2048 and r["batch"] == 1]
    name = f"{what} 2048 tokens >= {PREFILL_PEAK:.0%} of measured matmul peak"
    if not p2k:
        return _target(out, tkey, name, None, missing, base)
    k = p2k[0][key]
    f = k["GFLOPs"] / peak
    _target(out, tkey, name, f >= PREFILL_PEAK, f"{100 * f:.1f}% ({k['GFLOPs']:.1f} of {peak:.1f} GFLOP/s; {flops} / "
            "median time)", rows_foreign(p2k, base), f, k.get("label", p2k[0]["label"]))  # (a twin has its own label)


def _bw_target(out, tkey, records, plan, name, key, sd, pick, share, base, bw, need_specs):
    unsupported = plan.get("unsupported", {}).get(key)
    rows = [r for r in records if r["kind"] in ("decode", "spec") and pick(r)]
    if unsupported:
        return _target(out, tkey, name, None, f"{sd} state: not supported by this build ({unsupported})", base)
    vals = [(r[key]["GBps"] / row_reference(r, plan), r["label"], row_reference(r, plan)) for r in rows
            if "GBps" in r.get(key, {})]
    if not vals:
        return _target(out, tkey, name, None, "no such case ran", base)
    worst = min(vals)
    ran = {(r["kind"], r["num_spec"]) for r in rows}
    missing = [f"spec S={s}" if s else "decode" for s in need_specs
               if ("spec" if s else "decode", s) not in ran]
    ok = worst[0] >= share and not missing
    shares = [(rw_bound_share(r, key, plan), r["label"]) for r in rows]
    pass_name = {d: n for n, d in STATE_PASSES}[sd]
    passes = [(state_pass_share(r, pass_name, plan), r["label"]) for r in rows]
    detail = (f"min {100 * worst[0]:.1f}% ({worst[1]}, of {worst[2]:.2f} GB/s); all: "
              + ", ".join(f"{lab} {100 * f:.0f}%" for f, lab, _ in vals)
              + f"; each of the stream kernel timed beside the row (the run's {bw:.2f} GB/s where not measured)"
              + (f"; not run here: {', '.join(missing)} (full run)" if missing else "")
              + ("; info, of each row's read/write bound: " + ", ".join(f"{lab} {100 * f:.0f}%" for f, lab in shares)
                 if shares and all(f is not None for f, _ in shares) else "")
              + ("; info, the same metric for each row's bare state pass (its state bytes moved by a stream "
                 "kernel, nothing else): " + ", ".join(f"{lab} {100 * f:.0f}%" for f, lab in passes)
                 if passes and all(f is not None for f, _ in passes) else ""))
    _target(out, tkey, name, None if missing and worst[0] >= share else ok, detail, rows_foreign(rows, base),
            worst[0], worst[1])


def kv_ratios(records):
    """(kv layout time / vk time, row) of every decode / spec row, in each state dtype that ran."""
    ratios = []
    for r in records:
        if r["kind"] not in ("decode", "spec"):
            continue
        if "median_s" in r.get("ours_kv_layout", {}):
            ratios.append((r["ours_kv_layout"]["vs_ours"], f"{r['label']} f32"))
        if "median_s" in r.get("ours_bf16_state_kv", {}) and "median_s" in r.get("ours_bf16_state", {}):
            ratios.append((r["ours_bf16_state_kv"]["median_s"] / r["ours_bf16_state"]["median_s"], f"{r['label']} bf16"))
    return ratios


def plain_call_us(ho):
    """The plain call's host overhead: the better of its wait=True and wait=False loops."""
    return min(ho["wait_counts_us"], ho["nowait_counts_us"])


def prepared_call_us(ho):
    return min(ho["prepared_wait_counts_us"], ho["prepared_nowait_counts_us"])


def _limit_targets(out, records, plan, ho, sweep, base, bw, peak):
    """The targets against the machine's limits: bandwidth, matmul peak, flat prefill, host overhead."""
    need = (0, 1, 2, 3, 7)
    for key, sd in (("ours", "f32"), ("ours_bf16_state", "bf16")):
        _bw_target(out, f"bw_b8_{sd}", records, plan,
                   f"decode & spec S=1,2,3,7 at B>=8 >= {BW_B8:.0%} of measured bandwidth, {sd} state",
                   key, sd, lambda r: r["batch"] >= 8 and r["num_spec"] in need, BW_B8, base, bw, need)
        _bw_target(out, f"bw_b1_{sd}", records, plan, f"decode & spec at B=1 >= {BW_B1:.0%} of measured bandwidth, "
                   f"{sd} state", key, sd, lambda r: r["batch"] == 1, BW_B1, base, bw, ())
        _decode_pass_target(out, f"decode_pass_{sd}", records, plan, key, sd, base)
    ratios = kv_ratios(records)
    rows = [r for r in records if r["kind"] in ("decode", "spec")]
    name = f"kv ssm layout within {KV_VS_VK}x of vk on every decode/spec row"
    if ratios:
        worst = max(ratios)
        _target(out, "kv", name, worst[0] <= KV_VS_VK,
                f"worst {worst[0]:.2f}x ({worst[1]}); all: " + ", ".join(f"{lab} {x:.2f}x" for x, lab in ratios),
                rows_foreign(rows, base), worst[0], worst[1])
    else:
        _target(out, "kv", name, None, "no kv-layout row ran", base)
    _prefill_peak_target(out, "prefill_peak", "chunked prefill", records, "ours", "chunked-form FLOPs",
                         "no 2048-token prefill ran", base, peak)
    _conv_target(out, records, plan, base, bw)
    _flat_targets(out, sweep, base)
    if ho is not None:
        hf = max(base, ho.get("foreign_cpu", 0.0))
        plain = plain_call_us(ho)
        _target(out, "plain_call", f"plain pygdn.attention() host overhead <= {PLAIN_CALL_US:.0f} us/call",
                plain <= PLAIN_CALL_US, f"{plain:.1f} us (best of wait=True {ho['wait_counts_us']:.1f} / wait=False "
                f"{ho['nowait_counts_us']:.1f}, validate=counts; tiny padded batch)", hf, plain)
        c = c_abi_us(ho)
        name = f"C ABI host overhead <= {C_ABI_US:.0f} us/call (GDN_VALIDATE_COUNTS)"
        if c is None:
            _target(out, "c_abi", name, None, "; ".join(ho.get("c_abi", [])) or "not measured", hf)
        else:
            _target(out, "c_abi", name, c <= C_ABI_US, f"{c:.1f} us", hf, c)


def conv_vs_bytes(rec, bw):
    """A row's conv alone (its "ours_conv" part) against its bytes (cases.conv_traffic_bytes) at bw GB/s:
    the conv's time / the time those bytes take; None when the part was not timed."""
    c = rec.get("ours_conv", {})
    return c["median_s"] * bw * 1e9 / rec["bytes_conv"] if "median_s" in c and "bytes_conv" in rec else None


def _conv_target(out, records, plan, base, bw):
    """The 2048-token prefill's conv, timed alone, against the time its bytes take at the run's bandwidth."""
    p2k = [r for r in records if r["kind"] == "prefill" and r["tokens"] == 2048 and r["batch"] == 1
           and conv_vs_bytes(r, bw) is not None]
    name = f"prefill 2048's conv within {CONV_VS_BYTES}x of its bytes' time at measured bandwidth"
    if not p2k:
        return _target(out, "conv_bytes", name, None, "no 2048-token prefill's conv was timed", base)
    r = p2k[0]
    x = conv_vs_bytes(r, bw)
    _target(out, "conv_bytes", name, x <= CONV_VS_BYTES, f"{x:.2f}x ({r['ours_conv']['median_s'] * 1e3:.2f} ms; "
            f"{r['bytes_conv'] / 1e6:.1f} MB at {bw:.1f} GB/s take {r['bytes_conv'] / bw / 1e6:.2f} ms)",
            rows_foreign(p2k, base), x, r["label"])


def _decode_pass_target(out, tkey, records, plan, key, sd, base):
    """The decode rows of B = 1 and 8 against their own bare state pass, timed in the same rounds: the
    row's time against that of moving its state alone (state_pass_share of the row's reference)."""
    pass_name = {d: n for n, d in STATE_PASSES}[sd]
    name = f"decode B=1 and B=8 >= {DECODE_PASS:.0%} of their own bare state pass, {sd} state"
    rows = [r for r in records if r["kind"] == "decode" and r["batch"] in (1, 8) and "GBps" in r.get(key, {})
            and state_pass_share(r, pass_name, plan)]
    if not rows:
        return _target(out, tkey, name, None, "no decode row with its state pass ran", base)
    vals = [(r[key]["GBps"] / r[pass_name]["GBps"], r["label"]) for r in rows]
    worst = min(vals)
    _target(out, tkey, name, worst[0] >= DECODE_PASS, f"min {100 * worst[0]:.1f}% ({worst[1]}); all: "
            + ", ".join(f"{lab} {100 * f:.0f}%" for f, lab in vals) + " (the pass's time / the row's)",
            rows_foreign(rows, base), worst[0], worst[1])


def _flat_targets(out, sweep, base):
    pts = [r for r in sweep if "ours" in r]
    single = sorted((r for r in pts if len(r["lens"]) == 1), key=lambda r: r["tokens"])
    skipped = [r["label"] + ": " + r["skipped"] for r in sweep if "skipped" in r]
    name = f"prefill per-token cost flat within {FLAT}x, 512 .. 131072 tokens (one sequence)"
    have = {r["tokens"] for r in single}
    x = (max(r["ours"]["us_per_token"] for r in single) / min(r["ours"]["us_per_token"] for r in single)
         if len(single) >= 2 else None)
    at = f"{single[0]['tokens']}..{single[-1]['tokens']}" if single else None
    if not {512, 131072} <= have:
        part = f"; measured {at}: {x:.2f}x" if x is not None else ""
        _target(out, "flat", name, None, "needs the full run's sweep (512 and 131072 tokens)" + part
                + (f"; skipped: {'; '.join(skipped)}" if skipped else ""), base, x, at)
    else:
        cpu = [r["ours"].get("cpu_us_per_token") for r in single]
        cpu_note = (f"; in CPU time per token (not charged for preemption) {max(cpu) / min(cpu):.2f}x"
                    if all(cpu) else "")
        _target(out, "flat", name, x <= FLAT, f"max/min {x:.2f}x; " + ", ".join(
            f"{r['tokens']}: {r['ours']['us_per_token']:.1f}" for r in single) + " us/token" + cpu_note,
            rows_foreign(single, base), x, at)
    name = f"prefill per-token cost flat within {FLAT}x: 16 x 8192 against 512 tokens"
    many = [r for r in pts if len(r["lens"]) == 16 and r["lens"][0] == 8192]
    one = [r for r in single if r["tokens"] == 512]
    if many and one:
        x = many[0]["ours"]["us_per_token"] / one[0]["ours"]["us_per_token"]
        _target(out, "flat_16x8192", name, max(x, 1 / x) <= FLAT, f"{x:.2f}x ({many[0]['ours']['us_per_token']:.1f} "
                f"vs {one[0]['ours']['us_per_token']:.1f} us/token)", rows_foreign(many + one, base), x)
    else:
        _target(out, "flat_16x8192", name, None, "needs the full run's sweep (16 x 8192 and 512 tokens)"
                + (f"; skipped: {'; '.join(skipped)}" if skipped else ""), base)


def c_abi_us(ho):
    """The C ABI's host overhead with GDN_VALIDATE_COUNTS (benchmarks/host_overhead.c), or None."""
    c = [float(m.group(1)) for line in ho.get("c_abi", []) if "COUNTS" in line
         for m in [re.search(r"([0-9.]+) us per call", line)] if m]
    return c[0] if c else None


def _peer_targets(out, records, plan, torch_msg, ho, base):
    """The first targets: against the torch fallback, spec decode's first bandwidth bar, and the
    first host-overhead bars."""
    spec8 = [r for r in records if r["kind"] == "spec" and r["batch"] >= 8]
    name_x = f"spec decode >= {SPEC_VS_TORCH:.0f}x torch fallback at batch >= 8"
    name_bw = f"spec decode >= {SPEC_BW_B8:.0%} of measured bandwidth at batch >= 8"
    if not spec8:
        _target(out, "spec_vs_torch", name_x, None, "no spec case with batch >= 8 ran", base)
        _target(out, "spec_bw_b8", name_bw, None, "no spec case with batch >= 8 ran", base)
    else:
        f8 = rows_foreign(spec8, base)
        ratios = [(r["torch"]["ratio"], r["label"]) for r in spec8 if "ratio" in r.get("torch", {})]
        if ratios:
            worst = min(ratios)
            _target(out, "spec_vs_torch", name_x, worst[0] >= SPEC_VS_TORCH, f"min {worst[0]:.2f}x ({worst[1]}); all: "
                    + ", ".join(f"{lab} {x:.2f}x" for x, lab in ratios), f8, worst[0], worst[1])
        else:
            _target(out, "spec_vs_torch", name_x, None, f"torch peer did not run: {torch_msg}", base)
        fr = [(r["ours"]["GBps"] / row_reference(r, plan), r["label"]) for r in spec8]
        worst = min(fr)
        _target(out, "spec_bw_b8", name_bw, worst[0] >= SPEC_BW_B8, f"min {100 * worst[0]:.1f}% ({worst[1]}); all: "
                + ", ".join(f"{lab} {100 * f:.1f}%" for f, lab in fr), f8, worst[0], worst[1])
    p2k = [r for r in records if r["kind"] == "prefill" and r["tokens"] == 2048 and r["batch"] == 1]
    name = f"chunked prefill >= {PREFILL_VS_TORCH:.0f}x torch fallback at 2048 tokens"
    if not p2k:
        _target(out, "prefill_vs_torch", name, None, "no 2048-token prefill ran", base)
    elif "ratio" not in p2k[0].get("torch", {}):
        _target(out, "prefill_vs_torch", name, None, f"torch peer did not run: {torch_msg}", base)
    else:
        r = p2k[0]
        x = r["torch"]["ratio"]
        _target(out, "prefill_vs_torch", name, x >= PREFILL_VS_TORCH, f"{x:.2f}x (ours "
                f"{r['ours']['median_s'] * 1e3:.1f} ms, torch {r['torch']['median_s'] * 1e3:.1f} ms)",
                rows_foreign(p2k, base), x, r["label"])
    if ho is not None:
        hf = max(base, ho.get("foreign_cpu", 0.0))
        c = c_abi_us(ho)
        _target(out, "c_abi_first", f"C ABI host overhead < {C_ABI_FIRST_US:.0f} us/call",
                None if c is None else c < C_ABI_FIRST_US,
                "not measured" if c is None else f"{c:.1f} us (GDN_VALIDATE_COUNTS, tiny padded batch)", hf, c)
        best = prepared_call_us(ho)
        _target(out, "prepared_call", f"pygdn host overhead < {PREPARED_CALL_US:.0f} us/call (prepared call)",
                best < PREPARED_CALL_US, f"prepared call {ho['prepared_nowait_counts_us']:.1f} us (wait=False) / "
                f"{ho['prepared_wait_counts_us']:.1f} us (wait=True)", hf, best)


def plot(records, path, title, bw_GBps=None, sweep=()):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return f"matplotlib not available ({type(e).__name__}: {e}): no plot written (pip install matplotlib)"
    colors = {"ours": "tab:blue", "ours_kv_layout": "tab:cyan", "ours_bf16_state": "tab:purple",
              "ours_i8_state": "tab:brown", "ours_f8e4m3_state": "tab:pink", "numpy": "tab:orange", "torch": "tab:red"}
    labels = {"ours": "ours (pygdn)", "ours_kv_layout": "ours, ssm kv layout", "ours_bf16_state": "ours, bf16 state",
              "ours_i8_state": "ours, i8 state", "ours_f8e4m3_state": "ours, f8e4m3 state",
              "numpy": "numpy peer", "torch": "torch (HF fallback)"}
    fig, axes = plt.subplots(2, 4, figsize=(19, 8.5))
    panels = [("decode", 0, "decode (1 token / seq)"), ("spec", 1, "spec decode S=1"), ("spec", 2, "spec decode S=2"),
              ("spec", 3, "spec decode S=3"), ("spec", 7, "spec decode S=7"), ("prefill", None, "chunked prefill (one sequence)")]
    for ax, (kind, s, title_p) in zip(axes.flat, panels):
        key = (lambda r: r["tokens"]) if kind == "prefill" else (lambda r: r["batch"])
        for impl in ("ours", "ours_kv_layout", "ours_bf16_state", "ours_i8_state", "ours_f8e4m3_state", "numpy",
                     "torch"):
            rs = [r for r in records if r["kind"] == kind and (s is None or r["num_spec"] == s)
                  and (kind != "prefill" or r["batch"] == 1) and "median_s" in r.get(impl, {})]
            rs.sort(key=key)
            if rs:
                ax.plot([key(r) for r in rs], [r[impl]["median_s"] * 1e3 for r in rs], marker="o", color=colors[impl],
                        label=labels[impl], linestyle="-" if impl in ("ours", "numpy", "torch") else "--")
        rs = sorted((r for r in records if r["kind"] == kind and (s is None or r["num_spec"] == s)
                     and (kind != "prefill" or r["batch"] == 1)), key=key)
        if bw_GBps and rs and kind != "prefill":
            ax.plot([key(r) for r in rs], [r["bytes"] / (bw_GBps * 1e9) * 1e3 for r in rs], ":", color="gray",
                    label="state+activation bytes at measured BW")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prefill tokens" if kind == "prefill" else "batch (sequences)")
        ax.set_ylabel("time per step (ms)")
        ax.set_title(title_p, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes.flat[6]
    pts = sorted((r for r in sweep if "ours" in r and len(r["lens"]) == 1), key=lambda r: r["tokens"])
    if pts:
        ax.plot([r["tokens"] for r in pts], [r["ours"]["us_per_token"] for r in pts], marker="o", color=colors["ours"],
                label="ours, one sequence")
        lo = min(r["ours"]["us_per_token"] for r in pts)
        ax.axhline(FLAT * lo, color="gray", ls=":", label=f"{FLAT}x the lowest (the flatness target)")
    for r in sweep:
        if "ours" in r and len(r["lens"]) > 1:
            ax.plot([r["tokens"]], [r["ours"]["us_per_token"]], marker="s", color="tab:green", ls="none",
                    label=r["label"])
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("prefill tokens")
    ax.set_ylabel("µs per token")
    ax.set_title("prefill sweep (pygdn alone)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes.flat[7]
    names = [r["label"] for r in records]
    xs = np.arange(len(records))
    for k, impl in enumerate(("numpy", "torch")):
        vals = [r.get(impl, {}).get("ratio", np.nan) for r in records]
        ax.bar(xs + (k - 0.5) * 0.4, vals, 0.4, color=colors[impl], label=f"{labels[impl]} / ours")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels(names, rotation=70, fontsize=7)
    ax.set_ylabel("peer time / our time  (> 1: ours faster)")
    ax.set_title("ratios", fontsize=10)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
