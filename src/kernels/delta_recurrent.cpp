// delta_recurrent.cpp — the generic recurrent kernel (Intel GPUs; on the CPU device
// delta_recurrent_cpu.cpp takes over when the dims allow, unless GDN_XPU_GENERIC_KERNELS=1).
#include "delta_recurrent.hpp"

// Global (num_seqs*HV, V rounded up), local (1, w): one state column S[:, v] per work-item, K
// floats in registers. (sequence, v-head) come from the GROUP id (local range 1 in dimension 0):
// uniform across the work-group by construction.
GDN_KERNEL(2) void gdn_recurrent(GdnDeltaParams p) {
  const auto it = item2();
  const int32_t seq = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);
  const int32_t v = (int32_t)it.get_global_id(1);
  if (seq < p.num_seqs && v < p.V) recurrent_column(p, seq, hv, v);
}
