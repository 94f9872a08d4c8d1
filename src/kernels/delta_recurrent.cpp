// delta_recurrent.cpp — the generic recurrent kernel (Intel GPUs; on the CPU device
// delta_recurrent_cpu.cpp takes over when the dims allow, unless GDN_XPU_GENERIC_KERNELS=1).
#include "delta_recurrent.hpp"

// Global (num_seqs*HV, column tiles * GDN_SUB_GROUP rounded up), local (1, up to
// GDN_TILE_SUB_GROUPS sub-groups): a sub-group per tile of TILE_COLS state columns
// (delta_recurrent.hpp). (sequence, v-head) come from the GROUP id (local range 1 in dimension 0)
// and the tile from the sub-group's place: uniform across the sub-group by construction.
GDN_SUB_GROUP_KERNEL(2) void gdn_recurrent(GdnDeltaParams p) {
  const auto it = item2();
  const int32_t seq = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);
  const int32_t v0 = (int32_t)(it.get_global_id(1) / GDN_SUB_GROUP) * TILE_COLS;
  if (seq < p.num_seqs && v0 < p.V) recurrent_tile(p, it.get_sub_group(), seq, hv, v0);
}
