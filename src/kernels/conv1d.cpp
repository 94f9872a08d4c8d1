// conv1d.cpp — the generic conv1d kernels (Intel GPUs; the CPU device runs conv1d_cpu.cpp unless
// GDN_XPU_GENERIC_KERNELS=1): one channel per work-item. The algorithm is in conv1d.hpp.
#include "conv1d.hpp"

// f(std::integral_constant<int, width>()) for the run-time width (2 .. GDN_MAX_CONV_WIDTH,
// validated): every loop over the input window then has a fixed trip count and the window lives in
// registers. With a run-time width the window is indexed by a variable, which puts it in private
// memory: scratch on a GPU, read and written per token.
template <int W = 2, class F>
static inline void with_width(int32_t width, F f) {
  if (width == W) f(std::integral_constant<int, W>());
  else if constexpr (W < GDN_MAX_CONV_WIDTH) with_width<W + 1>(width, f);
}

// Both kernels in SIMD16 (a required sub-group size, though no sub-group function is called): the
// tile's code for every width in one kernel spills registers in SIMD32 on pvc.

// Global (num spec sequences, conv_dim + z_dim rounded up), local (1, w): one channel (or z
// element, copied) per work-item.
GDN_SUB_GROUP_KERNEL(2) void gdn_conv_spec(GdnConvParams p) {
  int32_t seq, c;
  if (!seq_and_channel(p, &seq, &c)) return;
  if (c >= p.conv_dim) return copy_z_seq<1>(p, seq, true, c - p.conv_dim);
  with_width(p.width, [&](auto w) { conv_spec_channels<1, decltype(w)::value>(p, seq, c); });
}

// Global (num tiles, conv_dim + z_dim rounded up), local (1, w): the tile comes from the group id, so
// the CPU device's vectorizer sees the sequence walk as uniform across the work-group.
GDN_SUB_GROUP_KERNEL(2) void gdn_conv_non_spec(GdnConvParams p) {
  const auto it = item2();
  const int32_t c = (int32_t)it.get_global_id(1), tile = (int32_t)it.get_group(0);
  if (c < p.conv_dim)
    with_width(p.width, [&](auto w) { conv_non_spec_tile<1, decltype(w)::value, 1>(p, tile, c, p.conv_dim); });
  else if (c < p.conv_dim + p.z_dim)
    copy_z_tile<1>(p, tile, c - p.conv_dim);
}
