// conv1d.cpp — the generic conv1d kernels (Intel GPUs; the CPU device runs conv1d_cpu.cpp unless
// GDN_XPU_GENERIC_KERNELS=1): one channel per work-item. The algorithm is in conv1d.hpp.
#include "conv1d.hpp"

// Global (num spec sequences, conv_dim rounded up), local (1, w): one channel per work-item.
GDN_KERNEL(2) void gdn_conv_spec(GdnConvParams p) {
  int32_t seq, c;
  if (!seq_and_channel(p, &seq, &c)) return;
  if (p.width == 4) conv_spec_channels<1, 4>(p, seq, c);  // Qwen3-Next / Qwen3.5
  else conv_spec_channels<1, 0>(p, seq, c);
}

// Global (num tiles, conv_dim rounded up), local (1, w): the tile comes from the group id, so the
// CPU device's vectorizer sees the sequence walk as uniform across the work-group.
GDN_KERNEL(2) void gdn_conv_non_spec(GdnConvParams p) {
  const auto it = item2();
  const int32_t c = (int32_t)it.get_global_id(1);
  if (c < p.conv_dim) conv_non_spec_tile<1, 0, 1, 1>(p, (int32_t)it.get_group(0), c, p.conv_dim);
}
