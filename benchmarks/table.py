"""The table a `python benchmarks/bench.py` run ends with, for a person to read: one line per row --
case, time, rate, bytes per step (decode / spec: in the state dtype's bytes), share of the bound the
row is limited by, share of its own bare state pass (decode / spec), the fastest peer's time against
ours, and each target that applies to the row with its verdict. The detailed lines (every row's
formats, state passes, rounds, the targets' evidence) are report.py's, printed with --verbose and
kept in the JSON record."""
from __future__ import annotations

from report import (BW_B1, BW_B8, C_ABI_US, CONV_VS_BYTES, DECODE_PASS, FLAT, KDA_TWIN, KDA_VS_GDN, KV_VS_VK,
                    PLAIN_CALL_US, PREFILL_PEAK, PREFILL_VS_TORCH, PREPARED_CALL_US, SPEC_BW_B8, SPEC_VS_TORCH,
                    PASS_OF_DTYPE, STATE_DTYPE_VARIANTS, base_foreign, conv_vs_bytes, own_pass_share, row_reference,
                    rows_foreign, state_pass_share, verdict)
from cases import STATE_TOLS

COLUMNS = ("case", "time", "rate", "bytes/step", "% of bound", "% own pass", "vs peer", "verdict")
_WIDTHS = (26, 10, 14, 10, 20, 10, 12)
# A decode / spec row per state dtype: (record key, case suffix, its bare state pass). The bars of
# report.py are set on f32 and bf16 states; an 8-bit state's row has its check against the f32-state
# step (cases.STATE_TOLS) in the verdict column instead.
_STATES = tuple((key, f" {sd} state" if key != "ours" else "", PASS_OF_DTYPE[sd]) for key, sd in STATE_DTYPE_VARIANTS)
_JUDGED = ("ours", "ours_bf16_state")
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


def _row(case, time="", rate="", bound="", peer="", verdicts="-", span=None, nbytes="", own_pass=""):
    """One table row; span: text over the time .. vs peer columns (the rows of a ratio)."""
    return {"case": case, "time": time, "rate": rate, "bytes": nbytes, "bound": bound, "own_pass": own_pass,
            "peer": peer, "verdict": verdicts, "span": span}


def _bytes(n):
    return f"{n / 1e6:.2f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def _check_8bit(v, sd):
    """An 8-bit state's first step against the f32-state step's (max |diff| / max |f32|, out and ssm)."""
    a = v.get("agreement_vs_ours")
    if a is None:
        return "-"
    return (f"{'ok' if a['ok'] else 'MISMATCH'} vs f32 state ({a['out']:.1e}/{a['ssm']:.1e}, "
            f"tol {STATE_TOLS[sd]:.2g})")


def _state_rows(r, plan, base):
    ref, f = row_reference(r, plan), rows_foreign([r], base)
    out = []
    for key, suffix, pass_name in _STATES:
        v = r.get(key, {})
        if "GBps" not in v:
            continue
        share = v["GBps"] / ref
        own = own_pass_share(r, key)
        nbytes = _bytes(sum(v["bytes_read_written"])) if "bytes_read_written" in v else ""
        own = f"{100 * own:.0f}%" if own is not None else "-"
        if key not in _JUDGED:
            check = _check_8bit(v, dict(STATE_DTYPE_VARIANTS)[key])
            out.append(_row(r["label"] + suffix, _time(v["median_s"]), f"{v['GBps']:.1f} GB/s",
                            f"{100 * share:.0f}% of {ref:.0f} GB/s", "-", check, nbytes=nbytes, own_pass=own))
            continue
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
                        f"{100 * share:.0f}% of {ref:.0f} GB/s", _peer(r, key), _verdicts(checks, f), nbytes=nbytes,
                        own_pass=own))
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


def _vs_bf16_rows(records):
    """The 8-bit states' time against the bf16 state's at decode B=8 (same rounds; cases.run_case "vs_bf16")."""
    rows = []
    for r in records:
        if r.get("kind") != "decode" or r.get("batch") != 8:
            continue
        for key, sd in STATE_DTYPE_VARIANTS[2:]:
            if "vs_bf16" in r.get(key, {}):
                v, b = r[key], r["ours_bf16_state"]
                rows.append(_row(f"{sd} / bf16 state time", span=f"{v['vs_bf16']:.2f}x ({r['label']}: "
                                 f"{_time(v['median_s'])} / {_time(b['median_s'])}, same rounds)"))
    return rows


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
    return rows + _vs_bf16_rows(records) + _target_rows(tg)


def table_lines(rows):
    def line(cells, span=None):
        head = f"{cells[0]:<{_WIDTHS[0]}s}"
        if span is not None:
            mid = f" {span:<{sum(_WIDTHS[1:]) + len(_WIDTHS) - 2}s}"
        else:
            mid = "".join(f" {c:>{w}s}" for c, w in zip(cells[1:-1], _WIDTHS[1:]))
        return f"{head}{mid}  {cells[-1]}"
    out = [line(COLUMNS), "-" * (sum(_WIDTHS) + len(_WIDTHS) + 8)]
    for r in rows:
        out.append(line((r["case"], r["time"], r["rate"], r.get("bytes", ""), r["bound"], r.get("own_pass", ""),
                         r["peer"], r["verdict"]), r["span"]))
    return out
