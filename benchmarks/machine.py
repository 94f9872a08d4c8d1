"""What the machine offers and what a call costs on it: memory bandwidth and matmul peak measured
in the same run (the references of the report), and the host overhead of a call through pygdn
and through the C ABI (benchmarks/host_overhead.c)."""
from __future__ import annotations

import os
import platform
import subprocess
import tempfile
import time

import numpy as np

import pygdn
from pygdn.batch import make_batch, to_device

from timing import best_seconds, us_per_call


def measure_bandwidth(queue):
    nbytes = 256 << 20
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        ts.append(time.perf_counter() - t)
    res = {"numpy_copy_bytes": nbytes, "numpy_copy_GBps": 2 * nbytes / min(ts) / 1e9,
           "note": "copy bandwidth = (read + write) bytes / best time of 5"}
    del dst
    try:
        import dpctl.memory as dpmem
        a = dpmem.MemoryUSMDevice(nbytes, queue=queue)
        b = dpmem.MemoryUSMDevice(nbytes, queue=queue)
        # Fill the source with data: untouched pages all map to the kernel's zero page, which
        # would make the copy read from cache and overstate the bandwidth (by ~1.6x here).
        a.copy_from_host(src.view(np.uint8))
        del src
        queue.memcpy(b, a, nbytes)   # first touch of the destination
        queue.wait()
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            queue.memcpy(b, a, nbytes)
            queue.wait()
            ts.append(time.perf_counter() - t)
        res["usm_memcpy_GBps"] = 2 * nbytes / min(ts) / 1e9
        del a, b
    except Exception as e:  # noqa: BLE001
        res["usm_memcpy_error"] = f"{type(e).__name__}: {e}"
    try:
        res["kernel_rw_GBps"] = kernel_stream_GBps(queue, nbytes)
        res["kernel_read_GBps"] = kernel_stream_GBps(queue, nbytes, kind="read")
        res["kernel_write_GBps"] = kernel_stream_GBps(queue, nbytes, kind="write")
    except Exception as e:  # noqa: BLE001
        res["kernel_rw_error"] = f"{type(e).__name__}: {e}"
    res["reference_GBps"] = max(res["numpy_copy_GBps"], res.get("usm_memcpy_GBps", 0.0), res.get("kernel_rw_GBps", 0.0))
    return res


# The state traffic's own pattern as a reference: every line read and written back in place by
# all of the device's threads (numpy's copy runs on one thread; USM memcpy may not use them all).
# An OpenCL C program built by the device's runtime through dpctl: measurement only, it exists
# where the queue's backend is OpenCL (the SYCL CPU device); elsewhere the other references stand.
# Beside it, a read-only and a write-only pass: a spec step writes its state L times for one read,
# and on the 2-core test hosts reads and writes each stream at about half the read+write rate
# while overlapping each other (docs/performance.md), so the read/write bound of a row is
# max(read bytes / read rate, written bytes / write rate), reported beside its share of bandwidth.
# Every kernel works on chunk g (n16 float16s) from float16 `at` of p, chunk g per work-group.
_STREAM_SRC = r"""
__kernel void gdn_bench_rw(__global float16 *p, long at, int n16, float d) {
  __global float16 *b = p + at + (long)get_group_id(0) * n16;
  for (int i = 0; i < n16; ++i) b[i] = b[i] * d;
}
__kernel void gdn_bench_r(__global float16 *p, long at, int n16, float d) {
  __global float16 *b = p + at + (long)get_group_id(0) * n16;
  float16 s = 0.0f;
  for (int i = 0; i < n16; ++i) s += b[i];
  if (s.s0 == d) b[0] = s;  /* never true here (d = 1, the sum is n16): keeps the reads */
}
__kernel void gdn_bench_w(__global float16 *p, long at, int n16, float d) {
  __global float16 *b = p + at + (long)get_group_id(0) * n16;
  for (int i = 0; i < n16; ++i) b[i] = (float16)(d);
}
__kernel void gdn_bench_r1wn(__global float16 *p, long at, int n16, float d, int copies) {
  long g = get_group_id(0), G = get_num_groups(0);
  __global float16 *b = p + at + g * n16;
  for (int i = 0; i < n16; ++i) {
    float16 x = b[i] * d;
    for (int t = 1; t <= copies; ++t) __builtin_nontemporal_store(x, b + t * G * n16 + i);
  }
}
"""
_STREAM_KERNELS = {"rw": ("gdn_bench_rw", 2), "read": ("gdn_bench_r", 1), "write": ("gdn_bench_w", 1)}
_STREAM_PROGRAMS = {}  # queue -> the built program (one build per queue and run)


def _stream_kernel(queue, name):
    """Kernel `name` of _STREAM_SRC for queue; RuntimeError where the backend is not OpenCL."""
    if queue.sycl_device.backend.name != "opencl":
        raise RuntimeError(f"backend {queue.sycl_device.backend.name}: the stream kernels are OpenCL C")
    if queue not in _STREAM_PROGRAMS:
        import dpctl.program as dpprog
        _STREAM_PROGRAMS[queue] = dpprog.create_program_from_source(queue, _STREAM_SRC)
    return _STREAM_PROGRAMS[queue].get_sycl_kernel(name)


def _filled_usm(queue, nbytes):
    """nbytes of device USM holding ones: real pages, not the zero page (untouched pages all map to
    it, and a pass over them reads from cache)."""
    import dpctl.memory as dpmem
    buf = dpmem.MemoryUSMDevice(nbytes, queue=queue)
    buf.copy_from_host(np.ones(nbytes // 4, np.float32).view(np.uint8))
    return buf


def kernel_stream_GBps(queue, nbytes, chunk=64 << 10, kind="rw"):
    """Bytes moved / best time of 5 of a pass over nbytes, chunk bytes per work-group: kind "rw"
    an in-place read-modify-write (read + write bytes), "read" a read-only, "write" a write-only pass."""
    import ctypes
    name, moved = _STREAM_KERNELS[kind]
    k = _stream_kernel(queue, name)
    buf = _filled_usm(queue, nbytes)
    args = [buf, ctypes.c_long(0), ctypes.c_int(chunk // 64), ctypes.c_float(1.0)]
    ts = []
    for i in range(6):
        t = time.perf_counter()
        queue.submit(k, args, [nbytes // chunk], [1])
        queue.wait()
        if i:  # the first pass builds nothing but warms the runtime's threads
            ts.append(time.perf_counter() - t)
    return moved * nbytes / min(ts) / 1e9


# A decode / spec row's state traffic alone, as bare stream kernels: what a kernel that only moved
# the row's state -- no arithmetic, no activations, no conv, no host-side call -- takes on this host
# in the same minutes, so a row's time can be read against what its own bytes allow (its "state
# pass"). Decode: every state read and written back in place (gdn_bench_rw); spec: read once and
# streamed (non-temporal stores, as ours) to `copies` = 1 + num_spec places (gdn_bench_r1wn). A
# work-group per head's state (K x V elements, 64 KiB at f32), as our kernels; each call works on
# the next region of a pool of at least 256 MiB and two footprints, so the state comes from DRAM
# as the rows' rotating caches do.
class StatePass:
    """step(): one pass over `heads` head states of `head_bytes` each (in place when copies == 0,
    else read once and streamed to `copies` places), on the next region of its pool; waits. Its
    `cycle` is the regions' count (one turn over the pool, see timing.timed_blocks).
    kernel: another in-place kernel of _STREAM_SRC for copies == 0 (the read-only or write-only
    pass); pool: a buffer of pool_bytes(...) to share with other passes instead of its own."""

    @staticmethod
    def pool_bytes(heads, head_bytes, copies):
        footprint = heads * head_bytes * (1 + copies)
        return max(2, -(-(256 << 20) // footprint)) * footprint  # >= 256 MiB and >= 2 footprints

    def __init__(self, queue, heads, head_bytes, copies, kernel=None, pool=None):
        import ctypes
        k = _stream_kernel(queue, kernel or ("gdn_bench_r1wn" if copies else "gdn_bench_rw"))
        self.q, self.groups = queue, heads
        footprint = heads * head_bytes * (1 + copies)
        self.regions = self.pool_bytes(heads, head_bytes, copies) // footprint
        self.buf = pool if pool is not None else _filled_usm(queue, self.regions * footprint)
        n16, tail = ctypes.c_int(head_bytes // 64), [ctypes.c_int(copies)] if copies else []
        self.calls = [(k, [self.buf, ctypes.c_long(r * footprint // 64), n16, ctypes.c_float(1.0)] + tail)
                      for r in range(self.regions)]
        self.i = 0

        def step():
            k, args = self.calls[self.i]
            self.i = (self.i + 1) % self.regions
            self.q.submit(k, args, [self.groups], [1])
            self.q.wait()
        step.cycle = self.regions
        self.step = step


# The reference's stream kernels, timed beside every decode / spec row in the row's rounds: the
# row's % is of what the memory moved then (report.row_reference), its read/write bound of the
# read-only and write-only rates then (report.rw_bound_share). A shared VM's memory can move about
# half or about twice its usual rate for minutes at a time: against a reference taken only at the
# run's start and end, a row timed in fast minutes can read up to ~190% (a decode row's own bare
# pass, the same kernel) and, against a fast start, a row timed in slow minutes half what it moved.
# measure_bandwidth's kernels as StatePass runs them, 64 KB a work-group, its 256 MiB a step (two
# such regions of one pool in turn, shared by the three); one set per run, made when the first row
# needs it.
REFERENCE_PASS_BYTES, REFERENCE_PASS_CHUNK = 256 << 20, 64 << 10


def reference_passes(queue):
    """kind ("rw", "read", "write": _STREAM_KERNELS) -> (step, bytes one step moves)."""
    heads = REFERENCE_PASS_BYTES // REFERENCE_PASS_CHUNK
    pool = _filled_usm(queue, StatePass.pool_bytes(heads, REFERENCE_PASS_CHUNK, 0))
    return {kind: (StatePass(queue, heads, REFERENCE_PASS_CHUNK, 0, kernel=name, pool=pool).step,
                   moved * REFERENCE_PASS_BYTES)
            for kind, (name, moved) in _STREAM_KERNELS.items()}


def measure_peak(torch_ok):
    n = 2048
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n), np.float32)
    b = rng.standard_normal((n, n), np.float32)
    res = {"numpy_matmul_GFLOPs": 2 * n ** 3 / best_seconds(lambda: a @ b) / 1e9, "n": n,
           "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}
    if torch_ok:
        try:
            import torch
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            res["torch_matmul_GFLOPs"] = 2 * n ** 3 / best_seconds(lambda: ta @ tb) / 1e9
        except Exception as e:  # noqa: BLE001
            res["torch_matmul_error"] = str(e)
    return res


def host_overhead(queue, act, calls):
    """µs per pygdn.attention call of a tiny batch whose 8 decode sequences are all PAD_SLOT_ID."""
    cfg = pygdn.Config(num_k_heads=1, num_v_heads=1, head_k_dim=16, head_v_dim=16, num_slots=8, act_dtype=act,
                       ssm_layout="vk", conv_layout="time_major", conv_spec_layout="rolled")
    meta = make_batch(np.random.default_rng(0), num_slots=8, pad_non_spec=8, pad_len=1, order="grouped",
                      identity_indices=True)
    T, C = meta["num_actual_tokens"], cfg.conv_dim
    dt = np.uint16 if act == "bf16" else np.float32
    U = lambda shape, d=dt: pygdn.UsmArray.from_numpy(np.zeros(shape, d), queue)  # noqa: E731
    arrays = dict(mixed_qkv=U((T, C)), a=U((T, 1)), b=U((T, 1)), conv_weight=U((C, cfg.conv_width)),
                  A_log=U((1,), np.float32), dt_bias=U((1,), np.float32), conv_state=U(cfg.conv_state_shape),
                  ssm_state=U(cfg.ssm_state_shape, np.float32), core_attn_out=U((T, 1, 16)))
    res = {"config": "H=HV=1, K=V=16, num_decodes=8 all PAD_SLOT_ID", "calls": calls}
    for validate in ("full", "counts"):
        batch = to_device(meta, queue, validate=validate)
        # The plain call, and the serving-loop form: arguments marshalled once by pygdn.prepare().
        step = pygdn.prepare(pygdn.attention, queue, cfg, batch, **arrays)
        plain = lambda wait, batch=batch: pygdn.attention(queue, cfg, batch, wait=wait, **arrays)  # noqa: E731
        for prefix, run in (("", plain), ("prepared_", step)):
            for _ in range(20):
                run(wait=True)
            res[f"{prefix}wait_{validate}_us"] = us_per_call(lambda: run(wait=True), calls)
            res[f"{prefix}nowait_{validate}_us"] = us_per_call(lambda: run(wait=False), calls, queue.wait)
    # The same call's pure Python marshalling cost (no C call): cffi structs + SUAI views. A
    # repeated call with the same pygdn.UsmArray objects reuses the structs checked by the one
    # before (pygdn._marshal.arrays_cached, Batch._to_c); "uncached" drops them before every call, so
    # every array is checked again (what other array kinds -- dpnp, DLPack -- always cost).
    batch = to_device(meta, queue, validate="counts")
    marshal = lambda: pygdn._marshal.marshal(pygdn.lib.gdn_attention, queue, cfg, batch, arrays)  # noqa: E731
    res["python_marshal_us"] = us_per_call(marshal, calls)

    # pygdn's private names for the kept structs, checked once: a renamed one would silently time
    # the kept path as "uncached" (then the number is left out: the report prints nan).
    kept = ((cfg, "_arrays_cache"), (batch, "_views_cache"))
    if not all(obj.__dict__.get(name) for obj, name in kept):
        return res

    def uncached():
        for obj, name in kept:
            object.__setattr__(obj, name, None)
        marshal()
    res["python_marshal_uncached_us"] = us_per_call(uncached, calls)
    return res


def c_host_overhead(calls):
    """The same measurement through the C ABI: benchmarks/host_overhead.c, built here against the
    installed library and header (the wheel ships no programs)."""
    with tempfile.TemporaryDirectory(prefix="gdn_host_overhead") as tmp:
        exe, why = _build_host_overhead(tmp)
        if exe is None:
            return [f"not measured: {why}"]
        run = subprocess.run([exe, str(calls)], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    if run.returncode != 0:
        return [f"not measured: gdn_host_overhead failed: {run.stderr.strip()[:200]}"]
    return [line.replace("host_overhead ", "") for line in run.stdout.splitlines() if line.startswith("host_overhead")]


def _build_host_overhead(out_dir):
    """Compiles host_overhead.c with the system C compiler (cc, or $CC): (path, None), or
    (None, why not)."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_overhead.c")
    exe = os.path.join(out_dir, "gdn_host_overhead")
    cmd = [os.environ.get("CC", "cc"), "-O2", src, *pygdn._lib.c_build_args(), "-o", exe]
    try:
        built = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except OSError as e:
        return None, f"no C compiler to build {src} ({e})"
    if built.returncode != 0:
        return None, f"building {src} failed: {built.stderr.strip()[:300]}"
    return exe, None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


