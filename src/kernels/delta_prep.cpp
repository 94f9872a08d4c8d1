// delta_prep.cpp — the per-row preprocessing of the gated delta rule (generic kernel; the CPU
// device's variant is delta_prep_cpu.cpp) and the chunk plan.
#include "delta_prep.hpp"
#include <sycl/group_algorithm.hpp>

// A sub-group of GDN_SUB_GROUP lanes per (row, k-head): lane l takes q and k elements
// l, l + GDN_SUB_GROUP, ... (loads and stores contiguous across the lanes), the sums of squares
// by sub-group reductions, and gate elements l, l + GDN_SUB_GROUP, ... of the k-head's v-heads.
// Global (H, rows * GDN_SUB_GROUP rounded up), local (1, GDN_SUB_GROUP * GDN_TILE_SUB_GROUPS): the
// sub-groups run along the last dimension (on the CPU device the only one they can span).
#define PREP_KS ((kHeadK + GDN_SUB_GROUP - 1) / GDN_SUB_GROUP)
GDN_SUB_GROUP_KERNEL(2) void gdn_prep(GdnPrepParams p) {
  const auto it = item2();
  const auto sg = it.get_sub_group();
  const int64_t row = (int64_t)(it.get_global_id(1) / GDN_SUB_GROUP);  // uniform across the sub-group
  const int32_t h = (int32_t)it.get_group(0), lane = (int32_t)sg.get_local_linear_id();
  if (row >= p.rows || h >= p.H) return;
  const int64_t qbase = row * p.qkv_stride + (int64_t)h * kHeadK, kbase = qbase + (int64_t)p.H * kHeadK;
  float q[PREP_KS], k[PREP_KS], sq = 0.0f, sk = 0.0f;
#pragma unroll
  for (int i = 0; i < PREP_KS; ++i) {
    const int32_t e = lane + GDN_SUB_GROUP * i;
    const bool in = kHeadK % GDN_SUB_GROUP == 0 || e < kHeadK;
    q[i] = in ? load_act(p.qkv, qbase + e) : 0.0f;
    k[i] = in ? load_act(p.qkv, kbase + e) : 0.0f;
    sq += q[i] * q[i];
    sk += k[i] * k[i];
  }
  const float rq = l2_factor(p, sycl::reduce_over_group(sg, sq, sycl::plus<float>())) * p.scale;
  const float rk = l2_factor(p, sycl::reduce_over_group(sg, sk, sycl::plus<float>()));
  float *qn = p.qn + (row * p.H + h) * kHeadK, *kn = p.kn + (row * p.H + h) * kHeadK;
#pragma unroll
  for (int i = 0; i < PREP_KS; ++i) {
    const int32_t e = lane + GDN_SUB_GROUP * i;
    if (kHeadK % GDN_SUB_GROUP == 0 || e < kHeadK) {
      qn[e] = q[i] * rq;
      kn[e] = k[i] * rk;
    }
  }
  // The k-head's gate elements (its v-heads' gate_k each) and betas, lane by lane.
  const int32_t ratio = p.HV / p.H, e0 = h * ratio * p.gate_k;
  for (int32_t j = lane; j < ratio * p.gate_k; j += GDN_SUB_GROUP) p.g[row * p.HV * p.gate_k + e0 + j] = gate_g(p, row, e0 + j);
  for (int32_t j = lane; j < ratio; j += GDN_SUB_GROUP) p.beta[row * p.HV + h * ratio + j] = gate_beta(p, row, h * ratio + j);
}

// The chunk plan of the non-spec sequences, built on the device from non_spec_query_start_loc
// (so the host neither reads metadata back nor waits inside the kernel chain). Sequences of two or
// more tokens take the chunk kernels, split into GDN_CHUNK_SIZE-token chunks, while the tables
// (capacities from the counts: GDN_CHUNK_SIZE-token chunks of the non-spec tokens plus one partial
// chunk per prefill) have room; every other sequence, and any overflow of a batch whose
// "decodes" are longer than one token, takes the recurrence. Unused table rows get length 0.
// With block checkpoints (checkpoint_interval > 0) a sequence's chunks are aligned to its
// request's absolute positions: the first one ends where the request holds a multiple of
// GDN_CHUNK_SIZE tokens (non_spec_start_pos), so every boundary is a chunk end and the chunk scan
// stores the checkpoint there (one more partial chunk per sequence at most: the host's capacity).
// Global GDN_SUB_GROUP, local GDN_SUB_GROUP: work-item 0 makes one serial pass, O(sequences + chunks)
// (one sub-group, as gdn_prep's: kernels of one file with different sub-group sizes become
// separate programs, which the disk cache cannot keep).
GDN_SUB_GROUP_KERNEL(1) void gdn_chunk_plan(GdnDeltaParams p) {
  if (item1().get_global_id(0) != 0) return;
  const bool align = p.slots.ckpt_interval > 0 && p.slots.start_pos;
  int32_t chunks = 0, seqs = 0;
  for (int32_t i = 0; i < p.num_seqs; ++i) {
    const SeqSpan span = delta_span(p, i, false);
    const int32_t j0 = span.j0, len = span.len;
    // (start_pos >= 0 under GDN_VALIDATE_FULL; the modulo stays in [0, 64) for any value)
    const int32_t off = align ? (p.slots.start_pos[i] % GDN_CHUNK_SIZE + GDN_CHUNK_SIZE) % GDN_CHUNK_SIZE : 0;
    const int32_t nc = (off + len + GDN_CHUNK_SIZE - 1) / GDN_CHUNK_SIZE;
    const bool take = len >= 2 && seqs < p.seq_capacity && nc <= p.chunk_capacity - chunks;
    p.chunked[i] = take ? 1 : 0;
    if (!take) continue;
    int32_t *st = p.seq_table + (int64_t)seqs++ * GDN_TABLE_INTS;
    st[0] = i, st[1] = chunks, st[2] = nc, st[3] = 0;
    for (int32_t s = 0; s < len;) {
      const int32_t n = sycl::min(GDN_CHUNK_SIZE - (s == 0 ? off : 0), len - s);
      int32_t *ct = p.chunk_table + (int64_t)chunks++ * GDN_TABLE_INTS;
      ct[0] = i, ct[1] = j0 + s, ct[2] = n, ct[3] = 0;
      s += n;
    }
  }
  for (; chunks < p.chunk_capacity; ++chunks)
    for (int f = 0; f < GDN_TABLE_INTS; ++f) p.chunk_table[(int64_t)chunks * GDN_TABLE_INTS + f] = 0;
  for (; seqs < p.seq_capacity; ++seqs)
    for (int f = 0; f < GDN_TABLE_INTS; ++f) p.seq_table[(int64_t)seqs * GDN_TABLE_INTS + f] = 0;
}

// Replay mode (gdn_xpu.h "Replay mode"): the ring counts of the slots a group wrote, after its
// walks (a launch of its own: every work-item of a spec sequence reads its read slot's count
// before its replay, and that may be the slot written here). Spec group: the committed slot's
// ring holds the step's tokens. Non-spec group: the write slots and the checkpoint slots stored
// hold exact states, their rings are emptied; gdn_flush_replay binds its slots here as a non-spec
// group without start locations (every slot), after its replay.
// Global num_seqs rounded up to GDN_SUB_GROUP, local GDN_SUB_GROUP: a work-item per sequence.
GDN_SUB_GROUP_KERNEL(1) void gdn_replay_count(GdnDeltaParams p) {
  const int32_t i = (int32_t)item1().get_global_id(0);
  if (i >= p.num_seqs) return;
  const int64_t len = p.query_start_loc ? delta_span(p, i, p.group == GDN_GROUP_SPEC).len : 1;
  const int32_t slot = p.state_indices[(int64_t)i * p.slot_cols];
  if (len == 0 || gdn_is_pad(slot, p.pad_slot_id)) return;  // nothing written (padding stores no checkpoints)
  if (p.group == GDN_GROUP_SPEC) {
    p.ring_count[slot] = (int32_t)len;
    return;
  }
  p.ring_count[slot] = 0;
  const int64_t start = p.slots.start_pos ? p.slots.start_pos[i] : 0;
  for (Checkpoints w = checkpoints(p.slots, i, start, 0, p.pad_slot_id); w.row && w.next < len;) {
    const int32_t to = w.after(w.next);
    if (!gdn_is_pad(to, p.pad_slot_id)) p.ring_count[to] = 0;
  }
}
