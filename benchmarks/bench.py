"""`python benchmarks/bench.py`: pygdn.attention against what a user would otherwise run here,
and against the machine's own limits.

One run measures, on Qwen3-Next TP=1 shapes (H=16, HV=32, K=V=128, W=4; bf16 activations unless
--dtype f32; fp32 ssm state in the "vk" layout [slots, HV, V, K]; conv state "time_major";
"rolled" spec conv with conv_state_len = W-1+num_spec):

  - decode (1 token per sequence) and spec decode (num_spec 1, 2, 3 and 7: 1+num_spec tokens
    per sequence, num_accepted random in [1, 1+num_spec]) at batch 1, 8, 32, and prefill
    (512..8192 tokens in one or a few sequences);
  - our time per step (median of repeats of pygdn.attention(..., wait=True) on warm caches,
    kernels compiled before timing), and the same work by the peers of benchmarks/peers.py: a
    vectorized float32 numpy implementation and HF transformers' torch fallbacks; the ratio
    peer time / our time; an agreement check of every peer's outputs and states against ours;
  - decode / spec decode again with the ssm cache in the "kv" layout and, when the build has
    Config(state_dtype=...), with a bf16 state cache in both layouts and 8-bit state caches (i8 and
    f8e4m3 codes with an f32 scale per state row, vk layout), each against its own bare state pass
    and checked against the f32-state step; the SSM state one sequence holds in the whole model per
    state dtype, and the sequences 1 GiB of it holds (cases.model_state_bytes);
  - achieved bytes/s of state + activation traffic (cases.traffic_bytes, in the state dtype's
    bytes) against memory bandwidth measured in the same run (best of a numpy copy of 256 MiB,
    a USM device-to-device queue.memcpy and an in-place read+write kernel on all the device's
    threads, at the run's start and end; a decode / spec row against that kernel timed beside it
    in its rounds: report.row_reference), and for prefill FLOP/s of the chunked algorithm against
    a numpy float32 2048^3 matmul; decode / spec steps rotate over copies of their caches (>= 256
    MiB together), so the state comes from DRAM as in a model, not from the last-level cache;
    beside that, each decode / spec row's share of its read/write bound (reads at a read-only,
    writes at a write-only kernel's rate, overlapped: report.rw_bound_share);
  - the prefill sweep (pygdn alone, µs/token and CPU-µs/token): 512 .. 131072 tokens in one
    sequence and 16 x 8192 in two rounds, each point keeping its faster one (--quick: 512 and 2048,
    one round), and a prefill with block checkpoints every 256 tokens against none (when the build
    has them);
  - host overhead: time per call of a tiny, fully padded batch (pygdn, and the C ABI through
    benchmarks/host_overhead.c), and, with torch installed, the host work the vLLM glue adds per
    layer call over its prepared call (benchmarks/dropin_overhead.py: the XPU drop-in and the CPU
    plugin, decode B = 1 and 8);
  - each prefill row again with the cfg.prefill_precision setting the default ("auto") does not take on
    the device (f32, or bf16 operands with f32 accumulators: docs/op.md "Prefill precision"), in the
    row's rounds: the two settings' ratio in one run, and the path each takes (pygdn.prefill_path);
  - KDA (Kimi Linear's per-channel gates: gate_mode "channel", H = HV = 32, the same H*K*V as
    Qwen3-Next's 32 v-heads) beside decode B=8, spec S=2 B=8 and prefill 2048: the same step with
    KDA's inputs, timed in the row's rounds, against the row's own bound (the bandwidth beside it,
    the matmul peak) and the row's time (KDA / GDN; --kda: only those rows);
  - the targets (report.py's bars), PASS / FAIL / NOISY (met while other processes shared the
    cores: never claimed) / n/a, with their numbers.
The run ends with one table (table.py): case, time, GB/s or GFLOP/s, % of the bound the row is
limited by, the fastest peer's time against ours, and the verdict of each target of the row, under
a line saying whether the run was quiet; --verbose also prints each row as it is measured, the
cache-format, sweep and agreement tables and the targets' evidence.
Writes a JSON record (--json) and a PNG plot (--plot, needs matplotlib). --quick: fewer sizes
and repeats (~2 min on 2 cores); the full run takes ~10-16 min on the 2-core test host (its
131072-token points need ~14 GiB of memory each, skipped with a message when it is not there).
--replay: only the spec rows of the per-token / replay mode table (S = 1, 3, 7 at B = 1, 8, 32).
--state8: only the rows of the state dtype comparison (decode B = 1, 8, 32 and spec S=3 B=8).

Run it from a source checkout with the environment pygdn is installed in (the script's folder,
not the checkout, goes on sys.path, so the installed pygdn is imported):
    python benchmarks/bench.py --quick      (or tests/setup_and_run.sh bench --quick)
The other modules here: cases.py (the work, one case measured), prefill_sweep.py (the sweep and
the checkpoint rows), peers.py, timing.py, machine.py (bandwidth, peak, host overhead),
report.py (detailed rows, cache-format table, targets, plot), table.py (the closing table).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import sys
import time

import numpy as np

import pygdn  # first: it points OpenCL at the wheel's CPU runtime before dpctl starts it
import dpctl

import peers as P
from cases import H, HV, K, KDA_H, V, W, chunked_flops, make_case, model_state_bytes, model_state_line, run_case, \
    traffic_bytes
from dropin_overhead import measure as glue_overhead
from machine import c_host_overhead, cpu_model, host_overhead, measure_bandwidth, measure_peak
from prefill_sweep import CHECKPOINT_INTERVAL, checkpoint_line, run_checkpoint_case, run_sweep, sweep_line
from report import HEADER, Log, beside_GBps, c_abi_us, conv_vs_bytes, plain_call_us, plot, prepared_call_us, \
    replay_lines, row_line, targets, variants_lines
from table import table_lines, table_rows
from timing import FOREIGN_FLAG, CpuWatch, wait_quiet

# specs: (num_spec, batches) of the spec decode cases; sweep: the prefill sweep's points (pygdn
# alone; a tuple of sequence lengths each); checkpoints: prefills timed with and without block
# checkpoints; kda: the cases (kind, batch, num_spec, prefill lengths) timed with a KDA twin.
# --quick keeps to what runs in ~2 minutes; the sweep's long points are full-run only.
KDA_TWINS = (("decode", 8, 0, ()), ("spec", 8, 2, ()), ("prefill", 0, 0, (2048,)))
QUICK_PLAN = dict(batches=(1, 8), specs=((1, (1, 8)), (2, (1, 8)), (3, (1, 8)), (7, (8,))),
                  prefills=[(512,), (2048,)], sweep=[(512,), (2048,)], checkpoints=[(2048,)],
                  deadline_s=240.0, host_calls=300,
                  reps_ours={"decode": 9, "spec": 9, "prefill": 3}, reps_peer={"decode": 5, "spec": 5, "prefill": 2},
                  budget_s=5.0, retry_left_s=30.0, quiet_left_s=30.0, sweep_reps=3, sweep_budget_s=5.0,
                  sweep_rounds=1, kda=KDA_TWINS)
FULL_PLAN = dict(batches=(1, 8, 32), specs=tuple((s, (1, 8, 32)) for s in (1, 2, 3, 7)),
                 prefills=[(512,), (1024,), (2048,), (4096,), (8192,), (1024,) * 4],
                 sweep=[(512,), (2048,), (8192,), (32768,), (131072,), (8192,) * 16], checkpoints=[(2048,), (8192,)],
                 deadline_s=3600.0, host_calls=2000,
                 reps_ours={"decode": 15, "spec": 15, "prefill": 5}, reps_peer={"decode": 5, "spec": 5, "prefill": 3},
                 budget_s=20.0, retry_left_s=300.0, quiet_left_s=300.0, sweep_reps=5, sweep_budget_s=30.0,
                 sweep_rounds=2, kda=KDA_TWINS)
# --replay: the spec rows replay mode is judged on (S = 1, 3, 7 at B = 1, 8, 32) with the full run's
# repeats, and nothing else (no decode, prefill, sweep or checkpoint rows).
REPLAY_PLAN = dict(FULL_PLAN, batches=(), specs=tuple((s, (1, 8, 32)) for s in (1, 3, 7)), prefills=[], sweep=[],
                   checkpoints=[], deadline_s=1800.0, host_calls=300, kda=())


def kda_only(sizes):
    """--kda: the rows with a KDA twin (KDA_TWINS) and nothing else, with the repeats of `sizes`
    (FULL_PLAN, or QUICK_PLAN with --quick)."""
    return dict(sizes, batches=(8,), specs=((2, (8,)),), prefills=[(2048,)], sweep=[], checkpoints=[],
                host_calls=300)


def state8_only(sizes):
    """--state8: the rows the state dtypes (f32, bf16, i8, f8e4m3) are compared on -- decode B = 1, 8, 32
    and spec S=3 B=8 -- and nothing else, with the repeats of `sizes` (FULL_PLAN, or QUICK_PLAN with --quick)."""
    return dict(sizes, batches=(1, 8, 32), specs=((3, (8,)),), prefills=[], sweep=[], checkpoints=[], host_calls=300,
                kda=())


log = Log()


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python benchmarks/bench.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repeats (< 5 min on 2 cores)")
    ap.add_argument("--replay", action="store_true", help="only the spec rows of the per-token / replay mode "
                    "table: S = 1, 3, 7 at B = 1, 8, 32 (REPLAY_PLAN)")
    ap.add_argument("--kda", action="store_true", help="only the rows with a KDA twin: decode B=8, spec S=2 B=8, "
                    "prefill 2048, each beside its KDA twin (kda_only; with --quick, the quick run's repeats)")
    ap.add_argument("--state8", action="store_true", help="only the rows of the state dtype comparison (f32, bf16, "
                    "i8, f8e4m3 state): decode B=1, 8, 32 and spec S=3 B=8 (state8_only; with --quick, the quick "
                    "run's repeats)")
    ap.add_argument("--dtype", choices=("bf16", "f32"), default="bf16", help="activation dtype (default bf16)")
    ap.add_argument("--json", default=os.path.join("bench_results", "bench.json"), help="JSON record path")
    ap.add_argument("--plot", default=os.path.join("bench_results", "bench.png"), help="PNG plot path")
    ap.add_argument("--device", default=None, help="dpctl filter string (default: the default SYCL device)")
    ap.add_argument("--peers", default="numpy,torch", help="comma list of peers to run (numpy, torch, or none)")
    ap.add_argument("--verbose", action="store_true", help="print each row's numbers as it is measured, the "
                    "cache-format, sweep and agreement tables and the targets' evidence before the closing table")
    return ap.parse_args(argv)


def describe_run(queue, args):
    """Logs what runs where; returns the facts the JSON record keeps."""
    dev = queue.sycl_device
    is_cpu = bool(dev.is_cpu)
    log(f"pygdn {pygdn.__version__} benchmark{' (--quick)' if args.quick else ''}: Gated DeltaNet attention, "
        f"Qwen3-Next TP=1 shapes H={H} HV={HV} K={K} V={V} W={W}, {args.dtype} activations, fp32 ssm state "
        f"(layout vk; decode/spec also kv layout, bf16, i8 and f8e4m3 state when the build has them), conv time_major, "
        f"spec conv rolled; KDA twins (per-channel gates) H=HV={KDA_H} K={K} V={V}")
    log(f"device: {dev.name} [{dev.backend.name}, {dev.device_type.name}, {dev.max_compute_units} compute units, "
        f"driver {dev.driver_version}]")
    if is_cpu:
        log(f"  This is the SYCL CPU device (OpenCL CPU runtime on the host CPU, {cpu_model()}, "
            f"{os.cpu_count()} cores): no GPU is involved; the numbers say nothing about Intel GPUs.")
    else:
        log("  This is NOT the SYCL CPU device; the peers still run on the host CPU.")
    load = os.getloadavg()
    log(f"host: {cpu_model()}, {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"numpy {np.__version__}; python {platform.python_version()}")
    paths = {}
    if hasattr(pygdn, "prefill_path"):  # the prefill rows' chunk products, per cfg.prefill_precision
        cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=1, act_dtype=args.dtype)
        for p in ("auto", "f32", "bf16"):
            paths[p] = pygdn.prefill_path(queue, dataclasses.replace(cfg, prefill_precision=p))[1]
            log(f"prefill products, prefill_precision {p}: {paths[p]}")
    return {"device": {"name": dev.name, "backend": dev.backend.name, "type": dev.device_type.name,
                       "is_sycl_cpu_device": is_cpu, "compute_units": dev.max_compute_units,
                       "driver": dev.driver_version},
            "host": {"cpu": cpu_model(), "cores": os.cpu_count(), "loadavg_at_start": list(load),
                     "python": platform.python_version(), "numpy": np.__version__},
            "prefill_paths": paths}


def build_check():
    """Which build the run measures: the imported pygdn's library against the checkout this script
    sits in -- its VERSION and its kernel sources and public header, which the library embeds
    verbatim (tools/embed_kernels.py). An environment installed before the last change measures the
    old kernels under the new benchmark's rows, and nothing in the numbers shows it. Returns the
    facts and a line to log (a WARNING when they differ)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lib_path = pygdn._lib.LIBRARY_PATH
    facts = {"pygdn": pygdn.__version__, "library": lib_path}
    try:
        with open(os.path.join(root, "VERSION"), encoding="utf-8") as f:
            facts["checkout_version"] = f.read().strip()
        with open(lib_path, "rb") as f:
            lib_bytes = f.read()
    except OSError as e:
        facts["matches_checkout"] = None
        return facts, f"build: pygdn {pygdn.__version__} ({lib_path}); not compared with a checkout ({e})"
    # src/kernels/meson.build's kernel_files: the kernel sources and the headers they include
    kernel_dir = os.path.join(root, "src", "kernels")
    with open(os.path.join(kernel_dir, "meson.build"), encoding="utf-8") as f:
        listed = re.findall(r"'([^']+)'", re.search(r"kernel_files = files\((.*?)\)", f.read(), re.S).group(1))
    kernels = sorted(os.path.normpath(os.path.join(kernel_dir, name)) for name in listed)
    differ = []
    for path in kernels:
        with open(path, "rb") as f:
            if f.read() not in lib_bytes:
                differ.append(os.path.basename(path))
    facts.update(kernel_files=len(kernels), kernel_files_differing=differ,
                 matches_checkout=facts["checkout_version"] == pygdn.__version__ and not differ and bool(kernels))
    where = f"pygdn {pygdn.__version__} ({lib_path})"
    if facts["matches_checkout"]:
        return facts, (f"build: {where}: this checkout's version and kernel sources ({len(kernels)} files); "
                       f"host code is not compared")
    return facts, (f"WARNING: build {where} is NOT this checkout's (VERSION {facts['checkout_version']}; kernel "
                   f"files differing: {', '.join(differ) or 'none'}): reinstall pygdn from this checkout to "
                   f"measure its code")


def load_peers(names):
    """(peer classes, torch status message, [(peer, why it is missing)]) for --peers."""
    want = [p.strip() for p in names.split(",") if p.strip() and p.strip() != "none"]
    peers, torch_msg, missing = [], "not requested (--peers)", []
    if "numpy" in want:
        peers.append(P.NumpyPeer)
    if "torch" in want:
        t = time.perf_counter()
        ok, torch_msg = P.torch_status()
        if ok:
            import torch
            peers.append(P.TorchPeer)
            log(f"peer torch: {torch_msg} (imported in {time.perf_counter() - t:.1f} s), "
                f"torch.set_num_threads(2) -> {torch.get_num_threads()} threads; HF transformers' torch "
                f"fallbacks from transformers.models.qwen3_next.modeling_qwen3_next")
        else:
            missing.append(("torch", torch_msg))
            log(f"peer torch: not installed -> its cells say so. {torch_msg}")
    log("peer numpy: vectorized float32 numpy (benchmarks/peers.py NumpyPeer)" if "numpy" in want
        else "peer numpy: not run")
    return peers, torch_msg, missing


def compile_kernels(queue, dtype):
    """Compiles every kernel the run uses before any timing (a first call is only a warm-up,
    never a compile); returns the seconds it took. The bf16-state builds only where the build
    has a state_dtype."""
    t = time.perf_counter()
    # (replay mode's builds are the same for every replay_tokens > 0)
    for label, shape, layout, sd, extra in (
            (f"act={dtype} K={K} ssm vk (benchmark shapes)", (H, HV, K, V), "vk", "f32", {}),
            (f"act={dtype} K={K} ssm kv (layout column)", (H, HV, K, V), "kv", "f32", {}),
            (f"act={dtype} K={K} ssm vk, bf16 state", (H, HV, K, V), "vk", "bf16", {}),
            (f"act={dtype} K={K} ssm kv, bf16 state", (H, HV, K, V), "kv", "bf16", {}),
            (f"act={dtype} K={K} ssm vk, i8 state", (H, HV, K, V), "vk", "i8", {}),
            (f"act={dtype} K={K} ssm vk, f8e4m3 state", (H, HV, K, V), "vk", "f8e4m3", {}),
            (f"act={dtype} K={K} ssm vk, replay mode", (H, HV, K, V), "vk", "f32", {"replay_tokens": 1}),
            (f"act={dtype} K={K} ssm vk, bf16 state, replay mode", (H, HV, K, V), "vk", "bf16", {"replay_tokens": 1}),
            (f"act={dtype} K={K} ssm vk, KDA (the twins)", (KDA_H, HV, K, V), "vk", "f32", {"gate_mode": "channel"}),
            (f"act={dtype} K={K} ssm vk, prefill_precision f32", (H, HV, K, V), "vk", "f32", {"prefill_precision": "f32"}),
            (f"act={dtype} K={K} ssm vk, prefill_precision bf16", (H, HV, K, V), "vk", "f32", {"prefill_precision": "bf16"}),
            (f"act={dtype} K=16 (host-overhead probe)", (1, 1, 16, 16), "vk", "f32", {})):
        t1 = time.perf_counter()
        kw = {} if sd == "f32" else {"state_dtype": sd}
        kw.update(extra)
        try:
            cfg = pygdn.Config(num_k_heads=shape[0], num_v_heads=shape[1], head_k_dim=shape[2], head_v_dim=shape[3],
                               num_slots=1, act_dtype=dtype, ssm_layout=layout, **kw)
        except (TypeError, ValueError) as e:
            log(f"compiling kernels: {label}: skipped, not supported by this build ({e})")
            continue
        log.detail(f"compiling kernels: {label} ...")
        try:
            pygdn.warmup(queue, cfg)
        except pygdn.GdnError as e:
            log(f"compiling kernels: {label}: failed: {e} (the cases using it will say so)")
            continue
        log.detail(f"  done in {time.perf_counter() - t1:.1f} s (run-time SYCL compile, or the on-disk cache)")
    log(f"kernels compiled in {time.perf_counter() - t:.1f} s (run-time SYCL compile, or the on-disk cache)")
    return time.perf_counter() - t


def measure_machine(queue, torch_ok):
    """The references of the report: memory bandwidth and matmul peak, measured now."""
    log("measuring memory bandwidth and matmul peak ...")
    wait_quiet({"quiet_left_s": 10.0})
    w = CpuWatch()
    bw = measure_bandwidth(queue)
    peak = measure_peak(torch_ok)
    bw["foreign_cpu_start"] = peak["foreign_cpu"] = w.foreign()
    log(f"  bandwidth {bw['reference_GBps']:.1f} GB/s (the largest below), matmul peak "
        f"{peak['numpy_matmul_GFLOPs']:.0f} GFLOP/s")
    log.detail(f"  bandwidth: numpy copy of 256 MiB {bw['numpy_copy_GBps']:.2f} GB/s, USM device->device "
               f"queue.memcpy "
               + (f"{bw['usm_memcpy_GBps']:.2f} GB/s" if "usm_memcpy_GBps" in bw
                  else f"failed ({bw.get('usm_memcpy_error')})")
               + (f", in-place read+write kernel (all threads) {bw['kernel_rw_GBps']:.2f} GB/s"
                  if "kernel_rw_GBps" in bw else f", stream kernel not run ({bw.get('kernel_rw_error')})")
               + f" (read+write bytes, best of 5); reference = the largest, {bw['reference_GBps']:.2f} GB/s"
               + (f"; read-only pass {bw['kernel_read_GBps']:.2f} GB/s, write-only pass "
                  f"{bw['kernel_write_GBps']:.2f} GB/s (the read/write bound of decode/spec rows)"
                  if "kernel_write_GBps" in bw else ""))
    log.detail(f"  peak: numpy float32 matmul 2048^3 {peak['numpy_matmul_GFLOPs']:.1f} GFLOP/s (best of 3)"
               + (f"; torch matmul {peak['torch_matmul_GFLOPs']:.1f} GFLOP/s (info)"
                  if "torch_matmul_GFLOPs" in peak else "")
               + (f"; note OPENBLAS_CORETYPE={peak['OPENBLAS_CORETYPE']} is set in this environment"
                  if peak["OPENBLAS_CORETYPE"] else ""))
    return bw, peak


def make_plan(sizes, bw, peak, t_start):
    """(plan, case list) of a plan's sizes (QUICK_PLAN, FULL_PLAN, REPLAY_PLAN, kda_only): repeats, time
    budgets and the soft deadline of the run, and its cases as (kind, batch, num_spec, prefill lengths)."""
    plan = {k: sizes[k] for k in ("reps_ours", "reps_peer", "budget_s", "retry_left_s", "quiet_left_s", "sweep_reps",
                                  "sweep_budget_s", "sweep_rounds", "sweep", "checkpoints")}
    plan.update(bw=bw, peak=peak, deadline=t_start + sizes["deadline_s"], unsupported={}, kda=set(sizes["kda"]))
    specs = [("decode", b, 0, ()) for b in sizes["batches"]] \
        + [("spec", b, s, ()) for s, batches in sizes["specs"] for b in batches] \
        + [("prefill", 0, 0, lens) for lens in sizes["prefills"]]
    return plan, specs


def run_checkpoints(queue, plan, dtype):
    if not plan["checkpoints"]:
        return []
    log.detail("")
    log(f"block checkpoints every {CHECKPOINT_INTERVAL} tokens during a prefill, against none (pygdn alone) ...")
    out = []
    for lens in plan["checkpoints"]:
        out.append(run_checkpoint_case(queue, lens, dtype, plan, log))
        if "unsupported" in out[-1]:
            break
    return out


def run_cases(queue, specs, dtype, peers, plan, missing):
    log.detail("")
    log(f"timing {len(specs)} cases (ours in six cache formats beside bare state passes, and the peers) ...")
    log.detail(f"per step, median of repeats; ratio = peer time / our time ('!' = peer disagrees with ours beyond "
               f"{'5e-2' if dtype == 'bf16' else '2e-3'} relative)")
    log.detail(HEADER)
    records = []
    for i, (kind, b, s, lens) in enumerate(specs):
        case = make_case(kind, dtype, batch=b, num_spec=s, lens=lens, seed=100 + i)
        twin = make_case(kind, dtype, batch=b, num_spec=s, lens=lens, seed=100 + i, gate_mode="channel") \
            if (kind, b, s, lens) in plan["kda"] else None
        try:
            records.append(run_case(queue, case, peers, plan, log, missing, twin))
        except Exception as e:  # noqa: BLE001
            log(f"{case.label:<18s} FAILED: {type(e).__name__}: {e}")
            records.append({"kind": kind, "label": case.label, "error": f"{type(e).__name__}: {e}"})
        del case, twin
    return records


def measure_host_overhead(queue, dtype, calls):
    log.detail("")
    log("host overhead: a tiny, fully padded batch through pygdn (Python) and the C ABI, kernels cached ...")
    watch = CpuWatch()
    ho = host_overhead(queue, dtype, calls)
    log.detail(f"  {ho['config']}: {ho['wait_full_us']:.0f} us/call (wait=True, validate=full), "
               f"{ho['wait_counts_us']:.0f} us/call (wait=True, validate=counts), "
               f"{ho['nowait_counts_us']:.0f} us/call (wait=False loop + one queue.wait, validate=counts); "
               f"Python marshalling alone {ho['python_marshal_us']:.0f} us (the structs checked by the call before), "
               f"{ho.get('python_marshal_uncached_us', float('nan')):.0f} us checking every array again.")
    log.detail(f"  prepared once (pygdn.prepare, the serving-loop form): {ho['prepared_wait_counts_us']:.0f} us/call "
               f"(wait=True), {ho['prepared_nowait_counts_us']:.0f} us/call (wait=False), validate=counts; "
               f"{ho['prepared_wait_full_us']:.0f} us/call with validate=full.")
    ho["c_abi"] = c_host_overhead(calls)
    for line in ho["c_abi"]:
        log.detail(f"  C ABI: {line}")
    c = c_abi_us(ho)
    log(f"  plain call {plain_call_us(ho):.1f} us, prepared call {prepared_call_us(ho):.1f} us, C ABI "
        + (f"{c:.1f} us" if c is not None else "not measured: " + "; ".join(ho["c_abi"])))
    ho["vllm_glue"] = glue = glue_overhead(min(calls, 300), 5)
    if "skipped" in glue:
        log.detail(f"  vLLM glue (benchmarks/dropin_overhead.py): not measured: {glue['skipped']}")
    for name, r in glue.items() if "skipped" not in glue else ():
        log(f"  {name}: host work {r['cpu']['host_us']:.1f} us of CPU time per call ({r['wall']['host_us']:.1f} us "
            f"wall); with the call {r['wall']['glue_us']:.1f} us against its prepared call's "
            f"{r['wall']['prepared_us']:.1f} us (wall; {r['wall']['gap_us']:.1f} us after a gap as long as the host work)")
    ho["foreign_cpu"] = watch.foreign()
    if ho["foreign_cpu"] > FOREIGN_FLAG:
        log(f"  [other processes used {100 * ho['foreign_cpu']:.0f}% of the CPU while these were measured]")
    return ho


def remeasure_bandwidth(queue, bw):
    """Bandwidth once more at the end (another process may have shared the memory bus at the
    start): the reference becomes the best of both, so the % of bandwidth is not flattered."""
    w = CpuWatch()
    bw_end = measure_bandwidth(queue)
    bw["end"] = {k: v for k, v in bw_end.items() if k.endswith("GBps")}
    bw["end"]["foreign_cpu"] = w.foreign()
    if bw_end["reference_GBps"] > bw["reference_GBps"] * 1.05:
        log.detail(f"note: bandwidth measured again at the end is {bw_end['reference_GBps']:.2f} GB/s (start "
                   f"{bw['reference_GBps']:.2f}); the rows above used the start value; the "
                   f"tables and targets below use the larger.")
    bw["reference_GBps"] = max(bw["reference_GBps"], bw_end["reference_GBps"])
    for k in ("kernel_read_GBps", "kernel_write_GBps"):  # the read/write bound: the larger too
        if k in bw_end:
            bw[k] = max(bw.get(k, 0.0), bw_end[k])


def quiet_line(foreign):
    """The run's verdict on its own conditions (the first thing a reader of the results needs)."""
    if foreign > FOREIGN_FLAG:
        return (f"RUN NOT QUIET: other processes used {100 * foreign:.0f}% of this machine's CPU time during the run "
                f"(quiet: < {100 * FOREIGN_FLAG:.0f}%); every timing shares the {os.cpu_count()} cores with them, and "
                f"no target is claimed from this run (NOISY = met on these numbers, not claimed). Rerun on an idle "
                f"machine for the record.")
    return f"run quiet: other processes used {100 * foreign:.1f}% of the CPU during the run (< {100 * FOREIGN_FLAG:.0f}%)."


def log_results(title, records, plan, sweep, checkpoints, foreign):
    """The final tables: every case again (against the final bandwidth), the cache formats,
    the prefill sweep, checkpoints, failures, agreement."""
    bw, peak = plan["bw"], plan["peak"]
    ok_records = [r for r in records if "ours" in r]
    log("")
    log("=" * 118)
    log(f"RESULTS on {title}")
    log(quiet_line(foreign))
    log(f"reference bandwidth {bw['reference_GBps']:.2f} GB/s (best of numpy copy / USM memcpy / stream "
        f"kernel, start and end of the run); reference peak {peak['numpy_matmul_GFLOPs']:.1f} GFLOP/s (numpy f32 matmul 2048^3)")
    beside = beside_GBps(ok_records)
    if beside:
        log(f"each decode / spec row's % is of the same stream kernel timed beside the row in its rounds, the best "
            f"of its repeats ('of X beside'; the memory's rate in the row's minutes): {min(beside):.1f} .. "
            f"{max(beside):.1f} GB/s in this run; its read/write bound ('r/w') of the read-only and write-only "
            f"kernels timed beside it too")
    log(HEADER)
    for r in ok_records:
        log(row_line(r, plan))
    for r in records:
        if "error" in r:
            log(f"{r['label']:<18s} FAILED: {r['error']}")
    errs = {}
    for r in ok_records:
        for name in ("numpy", "torch"):
            if "error" in r.get(name, {}):
                errs.setdefault(name, r[name]["error"])
    for name, e in errs.items():
        log(f"  {name} did not run: {e}")
    log("")
    log("decode / spec decode per ssm cache format (traffic model: each state touched read once and written once per "
        "stored state, in the state dtype's bytes, plus activations; '%rw' = the time the read/write bound allows "
        "(reads at the read-only, writes at the write-only stream rate timed beside the row, overlapped) / the time; "
        "'/vk' = time against the vk layout's; '!' = "
        "bf16 / i8 / f8e4m3-state results disagree with the f32-state step beyond 2e-2 / 5e-2 / 1.5e-1; "
        "'%own' = its own bare state pass's time (in its state dtype's bytes) / its time; "
        "'*' = one step only, it outlasted the row's "
        "time budget):")
    for line in variants_lines(ok_records, plan):
        log(line)
    if sweep:
        log("")
        log("prefill sweep (pygdn alone; us/token = median time / tokens; 'vs first' = against the first point):")
        for r in sweep:
            log(sweep_line(r, sweep, plan) if "ours" in r else f"{r['label']:<18s} SKIPPED: {r.get('skipped')}")
    if checkpoints:
        log("")
        log("block checkpoints during a prefill, against none:")
        for r in checkpoints:
            log(checkpoint_line(r))
    log("")
    log("agreement with ours (max |diff| / max |ours|, out and ssm state), and our step broken down:")
    for r in ok_records:
        ag = []
        for name in ("numpy", "torch"):
            a = r.get(name, {}).get("agreement_vs_ours")
            if a:
                ag.append(f"{name} {a['out']:.1e}/{a['ssm']:.1e}{'' if a['ok'] else ' MISMATCH'}")
        x = conv_vs_bytes(r, plan["bw"]["reference_GBps"])
        log(f"  {r['label']:<18s} {'; '.join(ag) or 'no peers':<44s} conv {r['ours_conv']['median_s'] * 1e3:8.2f} ms "
            f"({x:.1f}x its bytes' time), delta rule {r['ours_delta']['median_s'] * 1e3:8.2f} ms")


def log_targets(tg, foreign):
    log("")
    log("targets" + ("" if foreign <= FOREIGN_FLAG else " (run not quiet: nothing below is claimed as met)") + ":")
    for t in tg:
        log(f"  {t['verdict']:<5s} {t['target']}: {t['detail']}")


def log_table(title, plan, foreign, rows):
    """The closing table (table.py) under what it was measured on and against."""
    bw, peak = plan["bw"], plan["peak"]
    log("")
    log("=" * 118)
    log(title)
    log(quiet_line(foreign))
    log(f"bound: a decode / spec row's is the bandwidth (BW) of a stream kernel timed beside it (the run's reference "
        f"{bw['reference_GBps']:.1f} GB/s);")
    log(f"  a prefill's the numpy f32 matmul peak, {peak['numpy_matmul_GFLOPs']:.0f} GFLOP/s. vs peer: the fastest "
        f"peer's time / ours ('!': it disagreed with ours)")
    for line in table_lines(rows):
        log(line)


def write_json(path, result):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=float)


def main(argv=None) -> int:
    args = parse_args(argv)
    log.verbose = args.verbose
    t_start = time.perf_counter()
    watch_all = CpuWatch()
    queue = dpctl.SyclQueue(args.device, property="in_order") if args.device else dpctl.SyclQueue(property="in_order")
    facts = describe_run(queue, args)
    facts["build"], build_line = build_check()
    log(build_line)
    peers, torch_msg, missing = load_peers(args.peers)
    facts["host"]["peers"] = torch_msg
    compile_s = compile_kernels(queue, args.dtype)
    bw, peak = measure_machine(queue, P.TorchPeer in peers)
    model_state = model_state_bytes()
    log(model_state_line(model_state))
    sizes = QUICK_PLAN if args.quick else FULL_PLAN
    if args.replay:
        sizes = REPLAY_PLAN
    elif args.kda or args.state8:
        sizes = kda_only(sizes) if args.kda else state8_only(sizes)
    plan, specs = make_plan(sizes, bw, peak, t_start)
    records = run_cases(queue, specs, args.dtype, peers, plan, missing)
    plan.pop("reference_passes", None)  # (their 512 MiB back before the prefills)
    checkpoints = run_checkpoints(queue, plan, args.dtype)
    sweep = run_sweep(queue, plan["sweep"], args.dtype, plan, log)
    ho = measure_host_overhead(queue, args.dtype, sizes["host_calls"])
    remeasure_bandwidth(queue, bw)

    dev = facts["device"]
    on = dev["name"] + (" (the SYCL CPU device)" if dev["is_sycl_cpu_device"] else "")
    foreign = watch_all.foreign()
    ok_records = [r for r in records if "ours" in r]
    tg = targets(ok_records, plan, torch_msg, ho, sweep, foreign)
    rows = table_rows(records, plan, tg, foreign)
    if args.verbose:
        log_results(f"{on}, {args.dtype} activations", records, plan, sweep, checkpoints, foreign)
        log_targets(tg, foreign)

    total = time.perf_counter() - t_start
    write_json(args.json, {
        "pygdn_version": pygdn.__version__, "quick": args.quick, "act_dtype": args.dtype,
        "shapes": {"H": H, "HV": HV, "K": K, "V": V, "W": W, "ssm_layout": "vk (ours), kv (ours_kv_layout)",
                   "conv_layout": "time_major", "conv_spec_layout": "rolled",
                   "state_dtype": "f32 (ours), bf16 (ours_bf16_state*), i8 (ours_i8_state), f8e4m3 (ours_f8e4m3_state)",
                   "kda_twin": {"H": KDA_H, "HV": HV, "K": K, "V": V, "gate_mode": "channel", "state_dtype": "f32",
                                "ssm_layout": "vk", "rows": [list(t[:3]) + [list(t[3])] for t in sorted(plan["kda"])]}},
        **facts, "model_state_bytes": model_state,
        "compile_s": compile_s, "bandwidth": bw, "peak": peak, "cases": records, "host_overhead": ho,
        "sweep": sweep, "checkpoints": checkpoints, "unsupported": plan["unsupported"],
        "targets": tg, "table": rows, "total_s": total, "foreign_cpu_share": foreign, "quiet": foreign <= FOREIGN_FLAG,
        "notes": {"time": "median of repeats of one step with wait=True (synchronous), warm caches",
                  "bytes": traffic_bytes.__doc__.strip(), "flops": chunked_flops.__doc__.strip(),
                  "ratio": "peer median time / our median time"}})
    msg = plot(ok_records, args.plot, f"pygdn {pygdn.__version__} on {dev['name']}"
               + (" (SYCL CPU device)" if dev["is_sycl_cpu_device"] else "") + f", Qwen3-Next TP=1, {args.dtype}",
               max([bw["reference_GBps"]] + beside_GBps(ok_records)), sweep)
    log("")
    log(f"wrote {args.json}" + (f" and {args.plot}" if msg is None else f"; {msg}") + f"; total run time {total:.0f} s")
    if not facts["build"].get("matches_checkout"):
        log(build_line)
    cpu = "" if facts["host"]["cpu"] == dev["name"] else f", {facts['host']['cpu']}"
    log_table(f"pygdn {pygdn.__version__} on {on}{cpu}, {facts['host']['cores']} cores; Qwen3-Next TP=1 shapes, "
              f"{args.dtype} activations, {'--quick' if args.quick else 'full run'}", plan, foreign, rows)
    log("")
    log("spec decode, per-token mode against replay mode (cfg.replay_tokens: one state read and written per step), "
        "same rounds; speedup = per-token / replay time; %pass = a bare pass reading and writing each state once / "
        "the replay's time; %peak = its state arithmetic (report.replay_flops) at the numpy f32 matmul peak / its "
        "time ('!': replay outputs differ from the per-token step's; '*': one step only, it outlasted the row's "
        "time budget):")
    for line in replay_lines(ok_records, plan["peak"]["numpy_matmul_GFLOPs"], HV * K * V):
        log(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
