// gated_norm.cpp — fused output gate of the layer, in place on core_attn_out:
// o = rmsnorm(o) * weight * act(z), fp32 inside; act = silu (Qwen3-Next, Qwen3.5) or sigmoid
// (Kimi Linear: GdnNormParams.sigmoid). z: the z array, or the z columns of packed qkvz
// (GdnNormParams.z_per_group: where a head's V elements are).
#include "common.hpp"
#include <sycl/group_algorithm.hpp>

// A sub-group of GDN_SUB_GROUP lanes per (row, v-head): lane l takes elements l, l + GDN_SUB_GROUP,
// ... (loads and stores contiguous across the lanes), the sum of squares by a sub-group reduction.
// Global rows * HV * GDN_SUB_GROUP rounded up, local GDN_SUB_GROUP * GDN_TILE_SUB_GROUPS; a
// sub-group past the last (row, v-head) returns as a whole. So every (row, v-head) runs the same
// instructions whatever else the launch holds: a row's result does not depend on the batch. (With
// a work-item per (row, v-head), a work-group whose last items return early runs a masked copy of
// the code on the CPU device, and its rows differ from a full group's by an ulp.)
GDN_SUB_GROUP_KERNEL(1) void gdn_gated_rmsnorm(GdnNormParams p) {
  const auto it = item1();
  const auto sg = it.get_sub_group();
  const int64_t item = (int64_t)(it.get_global_id(0) / GDN_SUB_GROUP);  // uniform across the sub-group
  const int32_t lane = (int32_t)sg.get_local_linear_id();
  if (item >= (int64_t)p.rows * p.HV) return;
  const int64_t row = item / p.HV, hv = item % p.HV;
  const int64_t o0 = row * p.out_stride + hv * p.V, z0 = row * p.z_stride + gdn_group_col(hv * p.V, p.z_per_group, p.z_group_cols);
  float ss = 0.0f;
  for (int32_t v = lane; v < p.V; v += GDN_SUB_GROUP) {
    const float o = load_act(p.out, o0 + v);
    ss += o * o;
  }
  const float r = sycl::rsqrt(sycl::reduce_over_group(sg, ss, sycl::plus<float>()) / (float)p.V + p.eps);
  for (int32_t v = lane; v < p.V; v += GDN_SUB_GROUP) {
    const float z = load_act(p.z, z0 + v);
    store_act(p.out, o0 + v, load_act(p.out, o0 + v) * r * load_act(p.weight, v) * (p.sigmoid ? sigmoid(z) : silu(z)));
  }
}
