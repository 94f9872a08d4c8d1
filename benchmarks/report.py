"""The benchmark's report: one line per case, the targets of the issues with their verdicts, the plot."""
from __future__ import annotations

import os
import re

import numpy as np

from timing import FOREIGN_FLAG


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
    """Of a decode / spec row: its state pass `name` (STATE_PASSES) in the issue's metric -- the
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
    kv, b16 = rec.get("ours_kv_layout", {}), rec.get("ours_bf16_state", {})
    extra += f"  kv {kv['vs_ours']:.2f}x" if "vs_ours" in kv else ""
    extra += f"  bf16 state {b16['median_s'] * 1e3:.2f} ms {100 * b16['GBps'] / bw:.0f}%" if "GBps" in b16 else ""
    busy = rec.get("foreign_cpu", 0.0)
    extra += f"  [other processes {100 * busy:.0f}% CPU]" if busy > FOREIGN_FLAG else ""
    single = [n for n in ("ours", "numpy", "torch") if rec.get(n, {}).get("first_call_only")]
    extra += f"  [{'/'.join(single)}: one call only]" if single else ""
    return (f"{rec['label']:<18s} {rec['tokens']:6d} {_fmt_ms(o['median_s'])} "
            f"{_peer_cell(rec, 'numpy')}{_peer_cell(rec, 'torch')}{extra}")


HEADER = (f"{'case':<18s} {'tokens':>6s} {'ours ms':>9s} {'numpy ms':>9s} {'ratio':>7s}  {'torch ms':>9s} "
          f"{'ratio':>7s}  {'ours: traffic rate, % of BW':<27s} [prefill: FLOP rate, % of peak] [kv layout / vk time]"
          f" [bf16 state: time, % of BW]")


# ----------------------------------------------------------------------------- cache variants
VARIANT_LABELS = (("ours", "f32 vk"), ("ours_kv_layout", "f32 kv"), ("ours_bf16_state", "bf16 vk"),
                  ("ours_bf16_state_kv", "bf16 kv"))
# Each decode / spec row's state traffic alone, moved by bare stream kernels (machine.StatePass),
# in f32 and in bf16 bytes: name, state dtype.
STATE_PASSES = (("state_pass", "f32"), ("state_pass_bf16", "bf16"))


def variants_lines(records, plan):
    """Decode / spec rows once per ssm cache format: time, traffic rate and % of the measured
    bandwidth (bytes of the state dtype), % of the read/write bound (rw_bound_share), and the kv
    layout's time against the vk layout's; then the row's state passes (state_pass_share)."""
    lines = [f"{'case':<18s} " + " | ".join([f"{lab + ' ms':>10s} {'GB/s':>6s} {'%BW':>5s} {'%rw':>4s} {'/vk':>5s}"
                                             for _, lab in VARIANT_LABELS]
                                            + [f"{sd + ' pass ms':>13s} {'%BW':>5s}" for _, sd in STATE_PASSES])]
    for r in records:
        if r["kind"] not in ("decode", "spec"):
            continue
        bw, cells = row_reference(r, plan), []
        for name, lab in VARIANT_LABELS:
            v = r.get(name)
            if not v or "median_s" not in v:
                cells.append(f"{'-':>10s} {'':>6s} {'':>5s} {'':>4s} {'':>5s}")
                continue
            vs_vk = ""
            if name == "ours_kv_layout":
                vs_vk = f"{v['vs_ours']:5.2f}"
            elif name == "ours_bf16_state_kv" and "median_s" in r.get("ours_bf16_state", {}):
                vs_vk = f"{v['median_s'] / r['ours_bf16_state']['median_s']:5.2f}"
            bad = "" if v.get("agreement_vs_ours", {}).get("ok", True) else "!"
            share = rw_bound_share(r, name, plan)
            rw = f"{100 * share:3.0f}%" if share is not None else ""
            cells.append(f"{v['median_s'] * 1e3:9.3f}{bad:1s} {v['GBps']:6.2f} {100 * v['GBps'] / bw:4.0f}% {rw:>4s} {vs_vk:>5s}")
        for name, _ in STATE_PASSES:
            v, f = r.get(name, {}), state_pass_share(r, name, plan)
            cells.append(f"{v['median_s'] * 1e3:13.3f} {100 * f:4.0f}%" if f is not None else f"{'-':>13s} {'':>5s}")
        lines.append(f"{r['label']:<18s} " + " | ".join(cells))
    for name, lab in VARIANT_LABELS:
        if name in plan.get("unsupported", {}):
            lines.append(f"  {lab.split()[0]} state{' (' + lab.split()[1] + ' layout)' if 'kv' in lab else ''}: "
                         f"not supported by this build ({plan['unsupported'][name]})")
    return lines


# ----------------------------------------------------------------------------- targets
def _verdict(ok, foreign):
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


def _target(out, issue, name, ok, detail, foreign):
    v = _verdict(ok, foreign)
    out.append({"issue": issue, "target": name, "verdict": v, "detail": detail + _noise_note(v, foreign),
                "foreign_cpu": foreign})


def _rows_foreign(recs, base):
    return max([base] + [r.get("foreign_cpu", 0.0) for r in recs])


def targets(records, plan, torch_msg, ho=None, sweep=(), run_foreign=0.0):
    """The targets of issues 6 and 17 with their verdicts. Each verdict's noise share is the
    largest of: the rows it uses, the reference measurements it depends on (the bandwidth
    measurement that became the reference, the peak) and the whole run."""
    bw, peak = plan["bw"]["reference_GBps"], plan["peak"]["numpy_matmul_GFLOPs"]
    end = plan["bw"].get("end", {})
    end_used = end.get("reference_GBps", 0.0) >= bw  # the end measurement became the reference
    base = max(run_foreign, plan["bw"].get("foreign_cpu_start", 0.0), end.get("foreign_cpu", 0.0) if end_used else 0.0,
               plan["peak"].get("foreign_cpu", 0.0))
    out = []
    _targets17(out, records, plan, ho, sweep, base, bw, peak)
    _targets6(out, records, plan, torch_msg, ho, base)
    return out


def _bw_target(out, records, plan, name, key, sd, pick, share, base, bw, need_specs):
    unsupported = plan.get("unsupported", {}).get(key)
    rows = [r for r in records if r["kind"] in ("decode", "spec") and pick(r)]
    if unsupported:
        return _target(out, 17, name, None, f"{sd} state: not supported by this build ({unsupported})", base)
    vals = [(r[key]["GBps"] / row_reference(r, plan), r["label"], row_reference(r, plan)) for r in rows
            if "GBps" in r.get(key, {})]
    if not vals:
        return _target(out, 17, name, None, "no such case ran", base)
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
    _target(out, 17, name, None if missing and worst[0] >= share else ok, detail, _rows_foreign(rows, base))


def _targets17(out, records, plan, ho, sweep, base, bw, peak):
    need = (0, 1, 2, 3, 7)
    for key, sd in (("ours", "f32"), ("ours_bf16_state", "bf16")):
        _bw_target(out, records, plan, f"decode & spec S=1,2,3,7 at B>=8 >= 80% of measured bandwidth, {sd} state",
                   key, sd, lambda r: r["batch"] >= 8 and r["num_spec"] in need, 0.8, base, bw, need)
        _bw_target(out, records, plan, f"decode & spec at B=1 >= 50% of measured bandwidth, {sd} state",
                   key, sd, lambda r: r["batch"] == 1, 0.5, base, bw, ())
    ratios = []
    for r in records:
        if r["kind"] not in ("decode", "spec"):
            continue
        if "median_s" in r.get("ours_kv_layout", {}):
            ratios.append((r["ours_kv_layout"]["vs_ours"], f"{r['label']} f32"))
        if "median_s" in r.get("ours_bf16_state_kv", {}) and "median_s" in r.get("ours_bf16_state", {}):
            ratios.append((r["ours_bf16_state_kv"]["median_s"] / r["ours_bf16_state"]["median_s"], f"{r['label']} bf16"))
    rows = [r for r in records if r["kind"] in ("decode", "spec")]
    if ratios:
        worst = max(ratios)
        _target(out, 17, "kv ssm layout within 1.2x of vk on every decode/spec row", worst[0] <= 1.2,
                f"worst {worst[0]:.2f}x ({worst[1]}); all: " + ", ".join(f"{lab} {x:.2f}x" for x, lab in ratios),
                _rows_foreign(rows, base))
    else:
        _target(out, 17, "kv ssm layout within 1.2x of vk on every decode/spec row", None, "no kv-layout row ran", base)
    p2k = [r for r in records if r["kind"] == "prefill" and r["tokens"] == 2048 and r["batch"] == 1]
    name = "chunked prefill 2048 tokens >= 70% of measured matmul peak"
    if p2k:
        f = p2k[0]["ours"]["GFLOPs"] / peak
        _target(out, 17, name, f >= 0.7, f"{100 * f:.1f}% ({p2k[0]['ours']['GFLOPs']:.1f} of {peak:.1f} GFLOP/s; "
                f"chunked-form FLOPs / median time)", _rows_foreign(p2k, base))
    else:
        _target(out, 17, name, None, "no 2048-token prefill ran", base)
    _flat_targets(out, sweep, base)
    if ho is not None:
        hf = max(base, ho.get("foreign_cpu", 0.0))
        plain = min(ho["wait_counts_us"], ho["nowait_counts_us"])
        _target(out, 17, "plain pygdn.attention() host overhead <= 40 us/call", plain <= 40,
                f"{plain:.1f} us (best of wait=True {ho['wait_counts_us']:.1f} / wait=False {ho['nowait_counts_us']:.1f}, "
                f"validate=counts; tiny padded batch)", hf)
        c = _c_abi_us(ho)
        if c is None:
            _target(out, 17, "C ABI host overhead <= 12 us/call (GDN_VALIDATE_COUNTS)", None,
                    "; ".join(ho.get("c_abi", [])) or "not measured", hf)
        else:
            _target(out, 17, "C ABI host overhead <= 12 us/call (GDN_VALIDATE_COUNTS)", c <= 12, f"{c:.1f} us", hf)


def _flat_targets(out, sweep, base):
    pts = [r for r in sweep if "ours" in r]
    single = sorted((r for r in pts if len(r["lens"]) == 1), key=lambda r: r["tokens"])
    skipped = [r["label"] + ": " + r["skipped"] for r in sweep if "skipped" in r]
    name = "prefill per-token cost flat within 1.2x, 512 .. 131072 tokens (one sequence)"
    have = {r["tokens"] for r in single}
    if not {512, 131072} <= have:
        part = ""
        if len(single) >= 2:
            part = (f"; measured {single[0]['tokens']}..{single[-1]['tokens']}: "
                    f"{max(r['ours']['us_per_token'] for r in single) / min(r['ours']['us_per_token'] for r in single):.2f}x")
        _target(out, 17, name, None, "needs the full run's sweep (512 and 131072 tokens)" + part
                + (f"; skipped: {'; '.join(skipped)}" if skipped else ""), base)
    else:
        us = [r["ours"]["us_per_token"] for r in single]
        x = max(us) / min(us)
        cpu = [r["ours"].get("cpu_us_per_token") for r in single]
        cpu_note = (f"; in CPU time per token (not charged for preemption) {max(cpu) / min(cpu):.2f}x"
                    if all(cpu) else "")
        _target(out, 17, name, x <= 1.2, f"max/min {x:.2f}x; " + ", ".join(
            f"{r['tokens']}: {r['ours']['us_per_token']:.1f}" for r in single) + " us/token" + cpu_note,
            _rows_foreign(single, base))
    name = "prefill per-token cost flat within 1.2x: 16 x 8192 against 512 tokens"
    many = [r for r in pts if len(r["lens"]) == 16 and r["lens"][0] == 8192]
    one = [r for r in single if r["tokens"] == 512]
    if many and one:
        x = many[0]["ours"]["us_per_token"] / one[0]["ours"]["us_per_token"]
        _target(out, 17, name, max(x, 1 / x) <= 1.2, f"{x:.2f}x ({many[0]['ours']['us_per_token']:.1f} vs "
                f"{one[0]['ours']['us_per_token']:.1f} us/token)", _rows_foreign(many + one, base))
    else:
        _target(out, 17, name, None, "needs the full run's sweep (16 x 8192 and 512 tokens)"
                + (f"; skipped: {'; '.join(skipped)}" if skipped else ""), base)


def _c_abi_us(ho):
    c = [float(m.group(1)) for line in ho.get("c_abi", []) if "COUNTS" in line
         for m in [re.search(r"([0-9.]+) us per call", line)] if m]
    return c[0] if c else None


def _targets6(out, records, plan, torch_msg, ho, base):
    """The earlier issue's targets (kept: the README reports them)."""
    spec8 = [r for r in records if r["kind"] == "spec" and r["batch"] >= 8]
    name_x, name_bw = "spec decode >= 5x torch fallback at batch >= 8", "spec decode >= 50% of measured bandwidth at batch >= 8"
    if not spec8:
        _target(out, 6, name_x, None, "no spec case with batch >= 8 ran", base)
        _target(out, 6, name_bw, None, "no spec case with batch >= 8 ran", base)
    else:
        f8 = _rows_foreign(spec8, base)
        ratios = [(r["torch"]["ratio"], r["label"]) for r in spec8 if "ratio" in r.get("torch", {})]
        if ratios:
            worst = min(ratios)
            _target(out, 6, name_x, worst[0] >= 5.0, f"min {worst[0]:.2f}x ({worst[1]}); all: "
                    + ", ".join(f"{lab} {x:.2f}x" for x, lab in ratios), f8)
        else:
            _target(out, 6, name_x, None, f"torch peer did not run: {torch_msg}", base)
        fr = [(r["ours"]["GBps"] / row_reference(r, plan), r["label"]) for r in spec8]
        worst = min(fr)
        _target(out, 6, name_bw, worst[0] >= 0.5, f"min {100 * worst[0]:.1f}% ({worst[1]}); all: "
                + ", ".join(f"{lab} {100 * f:.1f}%" for f, lab in fr), f8)
    p2k = [r for r in records if r["kind"] == "prefill" and r["tokens"] == 2048 and r["batch"] == 1]
    name = "chunked prefill >= 3x torch fallback at 2048 tokens"
    if not p2k:
        _target(out, 6, name, None, "no 2048-token prefill ran", base)
    elif "ratio" not in p2k[0].get("torch", {}):
        _target(out, 6, name, None, f"torch peer did not run: {torch_msg}", base)
    else:
        r = p2k[0]
        x = r["torch"]["ratio"]
        _target(out, 6, name, x >= 3, f"{x:.2f}x (ours {r['ours']['median_s'] * 1e3:.1f} ms, torch "
                f"{r['torch']['median_s'] * 1e3:.1f} ms)", _rows_foreign(p2k, base))
    if ho is not None:
        hf = max(base, ho.get("foreign_cpu", 0.0))
        c = _c_abi_us(ho)
        _target(out, 6, "C ABI host overhead < 20 us/call", None if c is None else c < 20,
                "not measured" if c is None else f"{c:.1f} us (GDN_VALIDATE_COUNTS, tiny padded batch)", hf)
        best = min(ho["prepared_wait_counts_us"], ho["prepared_nowait_counts_us"])
        _target(out, 6, "pygdn host overhead < 60 us/call (prepared call)", best < 60,
                f"prepared call {ho['prepared_nowait_counts_us']:.1f} us (wait=False) / "
                f"{ho['prepared_wait_counts_us']:.1f} us (wait=True)", hf)


def plot(records, path, title, bw_GBps=None, sweep=()):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return f"matplotlib not available ({type(e).__name__}: {e}): no plot written (pip install matplotlib)"
    colors = {"ours": "tab:blue", "ours_kv_layout": "tab:cyan", "ours_bf16_state": "tab:purple", "numpy": "tab:orange",
              "torch": "tab:red"}
    labels = {"ours": "ours (pygdn)", "ours_kv_layout": "ours, ssm kv layout", "ours_bf16_state": "ours, bf16 state",
              "numpy": "numpy peer", "torch": "torch (HF fallback)"}
    fig, axes = plt.subplots(2, 4, figsize=(19, 8.5))
    panels = [("decode", 0, "decode (1 token / seq)"), ("spec", 1, "spec decode S=1"), ("spec", 2, "spec decode S=2"),
              ("spec", 3, "spec decode S=3"), ("spec", 7, "spec decode S=7"), ("prefill", None, "chunked prefill (one sequence)")]
    for ax, (kind, s, title_p) in zip(axes.flat, panels):
        key = (lambda r: r["tokens"]) if kind == "prefill" else (lambda r: r["batch"])
        for impl in ("ours", "ours_kv_layout", "ours_bf16_state", "numpy", "torch"):
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
        ax.axhline(1.2 * lo, color="gray", ls=":", label="1.2x the lowest (issue 17)")
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
