// delta_prep_cpu.cpp — the CPU device's gdn_prep (the host picks it when K % 16 == 0): one
// work-item per row, every k-head's q and k as 16-lane vectors. The generic kernel, vectorized by
// the CPU runtime ACROSS its 16 rows, read each row's q/k through lane inserts and gathers.
// Work-groups of one work-item, coordinates from GROUP ids only (vec16.hpp, "CPU-device kernels").
#include "delta_prep.hpp"

// Global (rows), local (1).
GDN_KERNEL(1) void gdn_prep_cpu(GdnPrepParams p) {
  const int64_t row = (int64_t)item1().get_group(0);
  if (row >= p.rows) return;
  for (int32_t h = 0; h < p.H; ++h) {
    vf16 q[kHeadK / 16], k[kHeadK / 16];
    prep_qk16(p, row, h, q, k);
    float *qn = p.qn + (row * p.H + h) * kHeadK, *kn = p.kn + (row * p.H + h) * kHeadK;
    for (int c = 0; c < kHeadK / 16; ++c) {
      vstore(qn + 16 * c, q[c]);
      vstore(kn + 16 * c, k[c]);
    }
  }
  prep_gates(p, row, 0, p.HV);
}
