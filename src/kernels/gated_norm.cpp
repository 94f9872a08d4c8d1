// gated_norm.cpp — fused output gate of the layer, in place on core_attn_out:
// o = rmsnorm(o) * weight * act(z), fp32 inside; act = silu (Qwen3-Next, Qwen3.5) or sigmoid
// (Kimi Linear: GdnNormParams.sigmoid). One work-item per (row, v-head). z: the z array,
// or the z columns of packed qkvz (GdnNormParams.z_per_group: where a head's V elements are).
#include "common.hpp"

GDN_KERNEL(1) void gdn_gated_rmsnorm(GdnNormParams p) {
  const int64_t gid = item1().get_global_id(0);
  if (gid >= (int64_t)p.rows * p.HV) return;
  const int64_t row = gid / p.HV, hv = gid % p.HV;
  const int64_t o0 = row * p.out_stride + hv * p.V, z0 = row * p.z_stride + gdn_group_col(hv * p.V, p.z_per_group, p.z_group_cols);
  float ss = 0.0f;
  for (int32_t v = 0; v < p.V; ++v) {
    const float o = load_act(p.out, o0 + v);
    ss += o * o;
  }
  const float r = sycl::rsqrt(ss / (float)p.V + p.eps);
  for (int32_t v = 0; v < p.V; ++v) {
    const float z = load_act(p.z, z0 + v);
    store_act(p.out, o0 + v, load_act(p.out, o0 + v) * r * load_act(p.weight, v) * (p.sigmoid ? sigmoid(z) : silu(z)));
  }
}
