// conv1d_cpu.cpp — the CPU device's conv1d kernels (the host picks them when conv_dim % 16 == 0):
// 16 consecutive channels per work-item as one vector, so every x/out access is 16 contiguous
// elements. Same algorithm as the generic kernels in conv1d.cpp (conv1d.hpp holds it).
// Like every *_cpu kernel, they run in work-groups of one work-item and take their coordinates
// from GROUP ids only (vec16.hpp, "CPU-device kernels").
#include "conv1d.hpp"

// Speculative sequences. Global (num spec sequences,
// (conv_dim + z_dim) / (16 * GDN_CONV_BLOCKS) rounded up), local (1, 1). A work-item owns
// GDN_CONV_BLOCKS (params.hpp) blocks of 16 consecutive channels (or z elements, copied) as
// vectors, run in turn.
GDN_KERNEL(2) void gdn_conv_spec_cpu(GdnConvParams p) {
  const auto it = item2();
  const int32_t seq = (int32_t)it.get_group(0);
  for (int32_t blk = 0; blk < GDN_CONV_BLOCKS && seq < p.num_seqs; ++blk) {
    const int32_t c = ((int32_t)it.get_group(1) * GDN_CONV_BLOCKS + blk) * 16;
    if (c >= p.conv_dim + p.z_dim) break;
    if (c >= p.conv_dim) copy_z_seq<16>(p, seq, true, c - p.conv_dim);
    else if (p.width == 4) conv_spec_channels<16, 4>(p, seq, c);
    else conv_spec_channels<16, 0>(p, seq, c);
  }
}

// Prefill and decode sequences, tiled over time: global (num tiles, (conv_dim + z_dim) / (16 *
// GDN_CONV_ROW_BLOCKS) rounded up), local (1, 1): GDN_CONV_ROW_BLOCKS blocks of 16 channels per
// work-item, walked row by row (conv_non_spec_rows). Other widths than 4 (rare) in runs of 32
// blocks: their window, weights and ring are up to GDN_MAX_CONV_WIDTH vectors a block in private
// memory. Blocks past conv_dim copy z elements.
GDN_KERNEL(2) void gdn_conv_non_spec_cpu(GdnConvParams p) {
  constexpr int32_t NB = GDN_CONV_ROW_BLOCKS, NB_ANY_WIDTH = 32;
  const auto it = item2();
  const int32_t c = (int32_t)it.get_group(1) * 16 * NB, tile = (int32_t)it.get_group(0);
  const int32_t conv_end = sycl::min(c + 16 * NB, p.conv_dim);
  if (p.width == 4) {
    if (c < conv_end) conv_non_spec_rows<4, NB>(p, tile, c, conv_end);
  } else {
    for (int32_t cc = c; cc < conv_end; cc += 16 * NB_ANY_WIDTH) conv_non_spec_rows<0, NB_ANY_WIDTH>(p, tile, cc, conv_end);
  }
  const int32_t z0 = sycl::max(c, p.conv_dim), z1 = sycl::min(c + 16 * NB, p.conv_dim + p.z_dim);
  if (z0 < z1) copy_z_rows<NB>(p, tile, z0 - p.conv_dim, z1 - p.conv_dim);
}
