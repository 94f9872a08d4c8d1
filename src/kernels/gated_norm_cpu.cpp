// gated_norm_cpu.cpp — the fused gated RMSNorm on the CPU device (the host picks it when V % 16 ==
// 0; gated_norm.cpp is the generic kernel): a work-item per row, each v-head's V values as 16-lane
// vectors, the gate's e^x by exp16. Work-groups of one work-item, coordinates from GROUP ids only
// (common.hpp, "CPU-device kernels"): every row runs the same code whatever else the launch holds.
// On the CPU device the generic kernel takes 4-10x its time, a work-item per (row, v-head) (the
// runtime vectorizing across them) 1.8x (decode B=8) to 6x (prefill 2048 tokens): bf16 at
// Qwen3-Next TP=1 shapes, the norm kernel alone, processes alternated on a loaded 2-core host.
#include "common.hpp"

// e^-x by exp16_ieee: a NaN gate input stays NaN (exp16 would take it as -87).
static inline vf16 gate16(vf16 z, bool sigmoid) {
  const vf16 d = 1.0f + exp16_ieee(-z);
  return sigmoid ? 1.0f / d : z / d;
}

// Global (rows), local (1).
GDN_KERNEL(1) void gdn_gated_rmsnorm_cpu(GdnNormParams p) {
  const int64_t row = (int64_t)item1().get_group(0);
  if (row >= p.rows) return;
  const bool sig = p.sigmoid != 0;
  for (int32_t hv = 0; hv < p.HV; ++hv) {
    const int64_t o0 = row * p.out_stride + (int64_t)hv * p.V;
    const int64_t z0 = row * p.z_stride + gdn_group_col((int64_t)hv * p.V, p.z_per_group, p.z_group_cols);
    vf16 ss(0.0f);
    for (int32_t c = 0; c < p.V; c += 16) {
      const vf16 o = load_act16(p.out, o0 + c);
      ss += o * o;
    }
    const float r = sycl::rsqrt(hsum(ss) / (float)p.V + p.eps);
    for (int32_t c = 0; c < p.V; c += 16)
      store_act16(p.out, o0 + c, load_act16(p.out, o0 + c) * r * load_act16(p.weight, c) * gate16(load_act16(p.z, z0 + c), sig));
  }
}
