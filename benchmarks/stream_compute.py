"""`python benchmarks/stream_compute.py`: how much arithmetic a state stream carries on this host before the
arithmetic, not the memory, sets its time.

A decode row's bare state pass (bench.py) reads and writes each state in place with no arithmetic. A decode
step does at least two dot products and the update per state element: 4 FMAs an element, 32 16-wide FMAs
per 512-byte row of an f32 state. This runs the bare pass's in-place stream kernel over decode B=8's f32
state (256 heads of 64 KiB, a work-group each) with R rounds of 8 independent FMAs per 512-byte row (R = 0:
the bare pass; R = 4: the walk's minimal arithmetic), from DRAM (each step on the next region of a pool of
max(256 MiB, 4 x the last-level cache), as bench.py's rows) and cache-resident (one region), alternated in
one process. It prints each R's time against R = 0's, in wall time and in the process's CPU time (which
other processes sharing the cores do not inflate).

Needs an OpenCL device queue (the SYCL CPU device).
"""
import ctypes
import os
import statistics
import sys
import time

import numpy as np

import pygdn  # noqa: F401  (first: it points OpenCL at the wheel's CPU runtime)
import dpctl
import dpctl.memory as dpmem
import dpctl.program as dpprog

from cases import l3_bytes

SRC = r"""
__kernel void gdn_stream_fma(__global float16 *p, long at, int n16, float d, int rounds) {
  __global float16 *b = p + at + (long)get_group_id(0) * n16;
  for (int i = 0; i < n16; i += 8) {
    float16 x0 = b[i], x1 = b[i + 1], x2 = b[i + 2], x3 = b[i + 3], x4 = b[i + 4], x5 = b[i + 5], x6 = b[i + 6],
            x7 = b[i + 7];
    float16 a0 = x0, a1 = x1, a2 = x2, a3 = x3, a4 = x4, a5 = x5, a6 = x6, a7 = x7;
    for (int r = 0; r < rounds; ++r) {
      a0 = fma(a0, d, x1); a1 = fma(a1, d, x2); a2 = fma(a2, d, x3); a3 = fma(a3, d, x4);
      a4 = fma(a4, d, x5); a5 = fma(a5, d, x6); a6 = fma(a6, d, x7); a7 = fma(a7, d, x0);
    }
    b[i] = a0; b[i + 1] = a1; b[i + 2] = a2; b[i + 3] = a3; b[i + 4] = a4; b[i + 5] = a5; b[i + 6] = a6; b[i + 7] = a7;
  }
}
"""
HEADS, HEAD_BYTES = 256, 64 << 10  # decode B=8: 8 sequences x 32 v-heads, 128 x 128 f32
ROUNDS = (0, 2, 4, 8, 16)


def main():
    q = dpctl.SyclQueue(property="in_order")
    if q.sycl_device.backend.name != "opencl":
        sys.exit(f"needs an OpenCL queue (the SYCL CPU device), not {q.sycl_device.backend.name}")
    k = dpprog.create_program_from_source(q, SRC).get_sycl_kernel("gdn_stream_fma")
    foot = HEADS * HEAD_BYTES
    regions = max(2, -(-max(256 << 20, 4 * l3_bytes()) // foot))
    buf = dpmem.MemoryUSMDevice(regions * foot, queue=q)
    buf.copy_from_host(np.zeros(regions * foot // 4, np.float32).view(np.uint8))
    at = [0]

    def step(rounds, hot):
        region = 0 if hot else at[0]
        at[0] = (at[0] + 1) % regions
        q.submit(k, [buf, ctypes.c_long(region * foot // 64), ctypes.c_int(HEAD_BYTES // 64), ctypes.c_float(0.0),
                     ctypes.c_int(rounds)], [HEADS], [1])
        q.wait()

    keys = [(r, hot) for r in ROUNDS for hot in (False, True)]
    for key in keys:
        step(*key)
    wall, cpu = {key: [] for key in keys}, {key: [] for key in keys}
    for n in range(12):
        for key in (keys if n % 2 == 0 else keys[::-1]):
            step(*key)
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(5):
                step(*key)
            wall[key].append((time.perf_counter() - t0) / 5)
            cpu[key].append((time.process_time() - c0) / 5)
    print(f"{q.sycl_device.name}: in-place pass over {HEADS} x {HEAD_BYTES >> 10} KiB, R rounds of 8 FMAs per 512-byte "
          f"row; load average {os.getloadavg()[0]:.2f}")
    print("| FMAs per row | DRAM ms (wall / CPU) | bare pass / this | cache-resident ms (wall / CPU) |")
    print("|---|---|---|---|")
    med = {key: (statistics.median(wall[key]), statistics.median(cpu[key])) for key in keys}
    for r in ROUNDS:
        (dw, dc), (hw, hc), (bw, bc) = med[(r, False)], med[(r, True)], med[(0, False)]
        print(f"| {8 * r} | {dw * 1e3:.3f} / {dc * 1e3:.3f} | {bw / dw * 100:.0f}% / {bc / dc * 100:.0f}% | "
              f"{hw * 1e3:.3f} / {hc * 1e3:.3f} |")


if __name__ == "__main__":
    main()
