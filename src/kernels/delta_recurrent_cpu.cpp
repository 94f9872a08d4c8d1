// delta_recurrent_cpu.cpp — the CPU device's recurrent kernels, one per ssm layout, and the fused
// step (a token group's conv and recurrence in one launch). The host picks them when the dims
// allow; GDN_XPU_GENERIC_KERNELS=1 runs the generic delta_recurrent.cpp and conv1d.cpp instead.
// The CPU runtime's work-group vectorizer turns uniform loads into gathers when it cannot prove
// uniformity; explicit 16-wide vectors inside a work-item make every load contiguous or a
// broadcast. Work-groups of one work-item, coordinates from GROUP ids only (vec16.hpp, "CPU-device
// kernels"). One run-time build per (layout, dtypes, K): the build includes its layout's walks
// (delta_recurrent_vk_cpu.hpp or delta_recurrent_kv_cpu.hpp, what both share in
// delta_recurrent_cpu.hpp), so a call compiles one layout's walks only.
#include "conv1d.hpp"  // the fused step's conv
#if GDN_VK_LAYOUT
#include "delta_recurrent_vk_cpu.hpp"
#else
#include "delta_recurrent_kv_cpu.hpp"
#endif

// The conv channels of k-head h: its q, k, and its v-heads' v channels, as [begin, end) ranges.
struct KHeadChannels {
  int32_t r[3][2];
};
static inline KHeadChannels k_head_channels(const GdnDeltaParams &p, int32_t h) {
  const int32_t per_k = p.HV / p.H;
  return {{{h * kHeadK, (h + 1) * kHeadK},
           {(p.H + h) * kHeadK, (p.H + h + 1) * kHeadK},
           {p.v_offset + h * per_k * p.V, p.v_offset + (h + 1) * per_k * p.V}}};
}

// A step's conv and recurrence in ONE launch per token group, gdn_fused_cpu (at the end of this
// file), instead of the group's conv kernel then its recurrent kernel: for the spec group of a
// step without chunk kernels, and for the non-spec group of a step without prefills. Global
// (group's seqs * H, 1), local (1, 1). The work-item of (seq, k-head h) first convolves its
// sequence's tokens in the channels of h -- its q and k channels and the v channels of its
// v-heads (a k-head's q/k conv state has one owner that way; a work-item per v-head would race
// on it) -- then walks the states of those v-heads, whose tokens it prepares from the conv output
// it just wrote. The conv is the conv kernels' own code: conv_spec_channels per 16-channel block;
// for a plain decode's one token conv_decode_blocks (conv1d.hpp), else conv_non_spec_tile with
// tile_len 1 (tile j is compact token j: the tiles of the sequence's tokens cover it whole, the
// first, the owner, reading and writing the conv state), one block at a time: that path takes
// only a step's non-spec sequences of other lengths than one, and pairs of blocks took ~2 s more
// of this build's back end at K = 128, a third of it. Conv width 4 only (plan.cpp; Qwen3-Next and Qwen3.5): each width is
// another copy of the conv in this build.
static inline void fused_conv(const GdnConvParams &c, const GdnDeltaParams &p, int32_t seq, int32_t h) {
  const KHeadChannels k_head = k_head_channels(p, h);
  const auto &ranges = k_head.r;
  if (p.group == GDN_GROUP_SPEC) {
    for (const auto &r : ranges)
      for (int32_t ch = r[0]; ch < r[1]; ch += 16) conv_spec_channels<16, 4>(c, seq, ch);
    return;
  }
  const SeqSpan span = conv_span(c, seq, false);
  if (span.len == 1) {  // plain decode
    for (const auto &r : ranges) conv_decode_blocks(c, seq, r[0], r[1]);
    return;
  }
  for (int32_t tile = span.j0; tile < span.j0 + span.len; ++tile)
    for (const auto &r : ranges)
      for (int32_t ch = r[0]; ch < r[1]; ch += 16 * GDN_CONV_BLOCKS)
        conv_non_spec_tile<16, 4, GDN_CONV_BLOCKS>(c, tile, ch, r[1]);
}

#if GDN_VK_LAYOUT
// Global (num_seqs*HV, V / GDN_VK_ITEM_ROWS rounded up), local (1, 1): a work-item walks
// GDN_VK_ITEM_ROWS rows. (A work-item per 16 rows made a decode's kernel ~12% longer.)
GDN_KERNEL(2) void gdn_recurrent_vk_cpu(GdnDeltaParams p) {
  const auto it = item2();
  recurrent_item(p, (int32_t)(it.get_group(0) / p.HV), (int32_t)(it.get_group(0) % p.HV),
                 (int32_t)it.get_group(1) * item_span(p));
}
#else
// Global (num_seqs*HV, V / (16 gdn_kv_cpu_vecs(V))), local (1, 1) (plan.cpp).
GDN_KERNEL(2) void gdn_recurrent_kv_cpu(GdnDeltaParams p) {
  const auto it = item2();
  const int32_t seq = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);
  const int32_t v = (int32_t)it.get_group(1) * item_span(p);
  if (seq >= p.num_seqs || v >= p.V) return;
  recurrent_item(p, seq, hv, v);
}
#endif

GDN_KERNEL(2) void gdn_fused_cpu(GdnFusedParams fp) {  // (see fused_conv)
  const GdnDeltaParams &p = fp.delta;
  const auto it = item2();
  const int32_t seq = (int32_t)(it.get_group(0) / p.H), h = (int32_t)(it.get_group(0) % p.H);
  if (seq >= p.num_seqs) return;
  fused_conv(fp.conv, p, seq, h);
  if (fp.conv.z_dim)  // z_out: the z elements of k-head h's v-heads, this sequence's rows
    for (int32_t e = h * (p.HV / p.H) * p.V; e < (h + 1) * (p.HV / p.H) * p.V; e += 16)
      copy_z_seq<16>(fp.conv, seq, p.group == GDN_GROUP_SPEC, e);
  // While this work-item walks its states, the lines the next one's conv reads first come in
  // (conv_prefetch; the next group id: the work-item this core most likely runs next). Without it
  // the conv's first loads of each window column waited for DRAM (time-major conv state, bf16:
  // a spec decode step ~12% longer, a decode step ~3%).
  const int32_t next = (int32_t)it.get_group(0) + 1;
  if (next / p.H < p.num_seqs) {
    const KHeadChannels next_head = k_head_channels(p, next % p.H);
    for (const auto &r : next_head.r) conv_prefetch(fp.conv, next / p.H, r[0], r[1], p.group == GDN_GROUP_SPEC);
  }
  // Replay mode's walk (gdn_xpu.h "Replay mode"): the replay of the k-head's v-heads first, in
  // this work-item, in place of a replay launch: it alone reads and writes the ring entries of k-head
  // h (k; g, beta and v of its v-heads), so every replay reads them before any walk overwrites
  // them, and the walks find their committed states in this core's caches: a step moves each state
  // from memory once each way.
  if (GDN_WITH_REPLAY && p.replay == GDN_REPLAY_WALK) {
    GdnDeltaParams a = p;
    a.replay = GDN_REPLAY_APPLY;
    for (int32_t hv = h * (p.HV / p.H); hv < (h + 1) * (p.HV / p.H); ++hv)
      for (int32_t v = 0; v < p.V; v += item_span(p)) recurrent_item(a, seq, hv, v);
  }
  for (int32_t hv = h * (p.HV / p.H); hv < (h + 1) * (p.HV / p.H); ++hv)
    for (int32_t v = 0; v < p.V; v += item_span(p)) recurrent_item(p, seq, hv, v);
}
