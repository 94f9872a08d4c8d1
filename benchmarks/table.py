"""The table a `python benchmarks/bench.py` run ends with, for a person to read: one line per row --
case, time, rate, share of the bound the row is limited by, the fastest peer's time against ours,
and each target that applies to the row with its verdict. The detailed lines (every row's
formats, state passes, rounds, the targets' evidence) are report.py's, printed with --verbose and
kept in the JSON record."""
from __future__ import annotations

from report import (BW_B1, BW_B8, C_ABI_US, CONV_VS_BYTES, DECODE_PASS, FLAT, KDA_TWIN, KDA_VS_GDN, KV_VS_VK,
                    PLAIN_CALL_US, PREFILL_PEAK, PREFILL_VS_TORCH, PREPARED_CALL_US, SPEC_BW_B8, SPEC_VS_TORCH,
                    STATE_PASSES, base_foreign, conv_vs_bytes, row_reference, rows_foreign, state_pass_share, verdict)

COLUMNS = ("case", "time", "rate", "% of bound", "vs peer", "verdict")
_WIDTHS = (24, 10, 14, 20, 12)
# A decode / spec row per state dtype: (record key, case suffix, its bare state pass).
_STATES = (("ours", "", STATE_PASSES[0][0]), ("ours_bf16_state", " bf16 state", STATE_PASSES[1][0]))
_PEERS = ("numpy", "torch")


def _time(s):
    """Seconds with three significant digits, in ms (µs under 0.1 ms)."""
    if s < 1e-4:
        return f"{s * 1e6:.1f} us"
    ms = s * 1e3
    return f"{ms:.3f} ms" if ms < 1 else f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


def _peer(rec, key):
    """The fastest peer against ours ("numpy 4.1x": its time / ours; "!" when it disagreed with
    ours): what a user would otherwise run."""
    ran = [(rec[n]["median_s"], n) for n in _PEERS if "median_s" in rec.get(n, {})]
    if key != "ours" or not ran:
        return "-"
    _, name = min(ran)
    p = rec[name]
    return f"{name} {p['ratio']:.1f}x" + ("" if p["agreement_vs_ours"]["ok"] else "!")


def _verdicts(checks, foreign):
    """checks: (ok or None, bar, note) -> "PASS >= 80% BW; FAIL ..." ('-' when none applies)."""
    out = [f"{verdict(ok, foreign)} {bar}" + (f" {note}" if note else "") for ok, bar, note in checks]
    return "; ".join(out) or "-"


def _row(case, time="", rate="", bound="", peer="", verdicts="-", span=None):
    """One table row; span: text over the time .. vs peer columns (the rows of a ratio)."""
    return {"case": case, "time": time, "rate": rate, "bound": bound, "peer": peer, "verdict": verdicts, "span": span}


def _state_rows(r, plan, base):
    ref, f = row_reference(r, plan), rows_foreign([r], base)
    out = []
    for key, suffix, pass_name in _STATES:
        v = r.get(key, {})
        if "GBps" not in v:
            continue
        share = v["GBps"] / ref
        checks = []
        bar = BW_B8 if r["batch"] >= 8 else BW_B1 if r["batch"] == 1 else None
        if bar is not None:
            sp = state_pass_share(r, pass_name, plan)
            note = f"(bare state pass {100 * sp:.0f}%)" if share < bar and sp is not None else ""
            checks.append((share >= bar, f">= {bar:.0%} BW", note))
        sp = state_pass_share(r, pass_name, plan)
        if r["kind"] == "decode" and r["batch"] in (1, 8) and sp:
            checks.append((share >= DECODE_PASS * sp, f">= {DECODE_PASS:.0%} of its bare pass", f"({share / sp:.0%})"))
        if key == "ours" and r["kind"] == "spec" and r["batch"] >= 8:
            checks.append((share >= SPEC_BW_B8, f">= {SPEC_BW_B8:.0%} BW", ""))
            if "ratio" in r.get("torch", {}):
                checks.append((r["torch"]["ratio"] >= SPEC_VS_TORCH, f">= {SPEC_VS_TORCH:.0f}x torch",
                               f"({r['torch']['ratio']:.1f}x)" if _peer(r, key).split()[0] != "torch" else ""))
        out.append(_row(r["label"] + suffix, _time(v["median_s"]), f"{v['GBps']:.1f} GB/s",
                        f"{100 * share:.0f}% of {ref:.0f} GB/s", _peer(r, key), _verdicts(checks, f)))
    return out


def _prefill_row(r, plan, base):
    o, peak = r["ours"], plan["peak"]["numpy_matmul_GFLOPs"]
    share, checks = o["GFLOPs"] / peak, []
    if r["tokens"] == 2048 and r["batch"] == 1:
        checks.append((share >= PREFILL_PEAK, f">= {PREFILL_PEAK:.0%} peak", ""))
        if "ratio" in r.get("torch", {}):
            checks.append((r["torch"]["ratio"] >= PREFILL_VS_TORCH, f">= {PREFILL_VS_TORCH:.0f}x torch",
                           f"({r['torch']['ratio']:.1f}x)" if _peer(r, "ours").split()[0] != "torch" else ""))
    return _row(r["label"], _time(o["median_s"]), f"{o['GFLOPs']:.0f} GFLOP/s", f"{100 * share:.0f}% of {peak:.0f} "
                f"GFLOP/s", _peer(r, "ours"), _verdicts(checks, rows_foreign([r], base)))


def _conv_row(r, plan, base):
    """A prefill row's conv, timed alone (its "ours_conv" part), under the row: its rate in its own bytes
    (cases.conv_traffic_bytes) against the run's bandwidth, and at 2048 tokens the bar of its time
    against the time those bytes take."""
    bw = plan["bw"]["reference_GBps"]
    x = conv_vs_bytes(r, bw)
    if x is None:
        return None
    c = r["ours_conv"]
    judged = r["tokens"] == 2048 and r["batch"] == 1
    checks = [(x <= CONV_VS_BYTES if judged else None, f"<= {CONV_VS_BYTES:.0f}x its bytes' time", f"({x:.2f}x)")]
    return _row(f"  {r['label']}: conv", _time(c["median_s"]), f"{c['GBps']:.1f} GB/s", f"{100 / x:.0f}% of {bw:.0f} GB/s",
                "-", _verdicts(checks, rows_foreign([r], base)))
def _precision_rows(r, plan):
    """A prefill row's other prefill_precision setting (cases.add_prefill_precisions), under the row:
    its time and rate, the path it took, and in the peer column its time against the row's (which
    names its own path in the case column)."""
    rows = []
    for name, precision in (("ours_prefill_f32", "f32"), ("ours_prefill_bf16", "bf16")):
        v = r.get(name)
        if v is None or "median_s" not in v:
            continue
        peak = plan["peak"]["numpy_matmul_GFLOPs"]
        ok = v.get("agreement_vs_ours", {}).get("ok", True)
        rows.append(_row(f"  prefill_precision {precision}", _time(v["median_s"]), f"{v['GFLOPs']:.3g} GFLOP/s",
                         f"{100 * v['GFLOPs'] / peak:.2g}% of {peak:.0f} GFLOP/s",
                         f"{v['vs_ours']:.2f}x row" + ("" if ok else "!"),
                         r.get(f"path_{name}", ("", ""))[1].split(" (")[0]))
    return rows


def _kda_row(r, plan, base):
    """A row's KDA twin (cases.add_twin), under the row: its time and rate against the row's own bound
    (the bandwidth beside it, or the matmul peak), the bar of the row's kind and size, and its time
    against the row's ("<= 1.3x GDN", the rows the bar is set on: decode B=8 and prefill 2048). In
    the peer column, its check against the float64 reference ("ref ok", or the error and "!")."""
    k = r.get(KDA_TWIN)
    if k is None:
        return None
    if "median_s" not in k:
        return _row(k["label"], verdicts="not run: " + k.get("error", "no time"))
    checks, f = [], rows_foreign([r], base)
    if "GFLOPs" in k:
        peak = plan["peak"]["numpy_matmul_GFLOPs"]
        share = k["GFLOPs"] / peak
        rate, bound = f"{k['GFLOPs']:.0f} GFLOP/s", f"{100 * share:.0f}% of {peak:.0f} GFLOP/s"
        if r["tokens"] == 2048 and r["batch"] == 1:
            checks.append((share >= PREFILL_PEAK, f">= {PREFILL_PEAK:.0%} peak", ""))
    else:
        ref = row_reference(r, plan)
        share = k["GBps"] / ref
        rate, bound = f"{k['GBps']:.1f} GB/s", f"{100 * share:.0f}% of {ref:.0f} GB/s"
        bar = BW_B8 if r["batch"] >= 8 else BW_B1 if r["batch"] == 1 else None
        if bar is not None:
            checks.append((share >= bar, f">= {bar:.0%} BW", ""))
    judged = (r["kind"] == "decode" and r["batch"] == 8) or (r["kind"] == "prefill" and r["tokens"] == 2048
                                                             and r["batch"] == 1)
    checks.append((k["vs_gdn"] <= KDA_VS_GDN if judged else None, f"<= {KDA_VS_GDN}x GDN", f"({k['vs_gdn']:.2f}x)"))
    ag = k.get("agreement_vs_reference")  # it has no peer: its first step against the float64 reference
    peer = "-" if ag is None else "ref ok" if ag["ok"] else f"ref {max(ag['out'], ag['ssm']):.0e}!"
    return _row(k["label"], _time(k["median_s"]), rate, bound, peer, _verdicts(checks, f))


def _target_rows(tg):
    """The rows of the targets that span rows or stand alone (layouts, flatness, host overhead)."""
    by = {t["key"]: t for t in tg}
    out = []

    def add(key, case, bar, time="", span=None, note=""):
        v = by[key]["verdict"]
        out.append(_row(case, time=time, span=span, verdicts=f"n/a ({bar}{note})" if v == "n/a" else f"{v} {bar}"))

    def value(key):
        return by.get(key, {}).get("value")

    if value("kv") is not None:
        add("kv", "kv / vk layout", f"<= {KV_VS_VK}x", span=f"worst {value('kv'):.2f}x ({by['kv']['at']})")
    if value("kda_vs_gdn") is not None:
        add("kda_vs_gdn", "KDA / GDN time", f"<= {KDA_VS_GDN}x",
            span=f"worst {value('kda_vs_gdn'):.2f}x ({by['kda_vs_gdn']['at']}; same H*K*V, same rounds)")
    if value("flat") is not None:
        add("flat", f"prefill flat {by['flat']['at']}", f"<= {FLAT}x", span=f"max/min {value('flat'):.2f}x per token",
            note=" over 512..131072 tokens: full run only")
    if value("flat_16x8192") is not None:
        add("flat_16x8192", "prefill 16x8192 vs 512", f"<= {FLAT}x", span=f"{value('flat_16x8192'):.2f}x per token")
    for key, case, bar in (("plain_call", "plain call (pygdn)", f"<= {PLAIN_CALL_US:.0f} us"),
                           ("prepared_call", "prepared call (pygdn)", f"< {PREPARED_CALL_US:.0f} us"),
                           ("c_abi", "C ABI call", f"<= {C_ABI_US:.0f} us")):
        if value(key) is not None:
            add(key, case, bar, time=f"{value(key):.1f} us")
    return out


def table_rows(records, plan, tg, run_foreign):
    """The closing table's rows (dicts of COLUMNS' cells), in the order the run measured them."""
    base = base_foreign(plan, run_foreign)
    rows = []
    for r in records:
        if "ours" not in r:
            rows.append(_row(r["label"], verdicts="FAILED: " + r.get("error", "")))
            continue
        if r["kind"] in ("decode", "spec"):
            rows += _state_rows(r, plan, base)
        else:
            rows.append(_prefill_row(r, plan, base))
            conv = _conv_row(r, plan, base)
            rows += [conv] if conv else []
            rows += _precision_rows(r, plan)
        kda = _kda_row(r, plan, base)
        rows += [kda] if kda else []
    return rows + _target_rows(tg)


def table_lines(rows):
    def line(cells, span=None):
        head = f"{cells[0]:<{_WIDTHS[0]}s}"
        if span is not None:
            mid = f" {span:<{sum(_WIDTHS[1:]) + len(_WIDTHS) - 2}s}"
        else:
            mid = "".join(f" {c:>{w}s}" for c, w in zip(cells[1:5], _WIDTHS[1:]))
        return f"{head}{mid}  {cells[5]}"
    out = [line(COLUMNS), "-" * (sum(_WIDTHS) + len(_WIDTHS) + 8)]
    for r in rows:
        out.append(line((r["case"], r["time"], r["rate"], r["bound"], r["peer"], r["verdict"]), r["span"]))
    return out
