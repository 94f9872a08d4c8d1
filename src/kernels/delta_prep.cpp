// delta_prep.cpp — the per-row preprocessing of the gated delta rule (generic kernel; the CPU
// device's variant is delta_prep_cpu.cpp) and the chunk plan.
#include "delta_prep.hpp"

// Global (rows rounded up, H), local (16, 1): one work-item per (row, k-head) writes the
// l2-normalized, scaled q and k of its row (f32) and the gates of the v-heads sharing the k-head.
GDN_KERNEL(2) void gdn_prep(GdnPrepParams p) {
  const auto it = item2();
  const int64_t row = it.get_global_id(0);
  const int32_t h = (int32_t)it.get_global_id(1);
  if (row >= p.rows || h >= p.H) return;
  const int64_t qbase = row * p.qkv_stride + (int64_t)h * KD, kbase = qbase + (int64_t)p.H * KD;
  float sq = 0.0f, sk = 0.0f;
  for (int k = 0; k < KD; ++k) {
    const float q = load_act(p.qkv, qbase + k), kk = load_act(p.qkv, kbase + k);
    sq += q * q;
    sk += kk * kk;
  }
  const float rq = l2_factor(p, sq) * p.scale, rk = l2_factor(p, sk);
  float *qn = p.qn + (row * p.H + h) * KD, *kn = p.kn + (row * p.H + h) * KD;
  for (int k = 0; k < KD; ++k) {
    qn[k] = load_act(p.qkv, qbase + k) * rq;
    kn[k] = load_act(p.qkv, kbase + k) * rk;
  }
  const int32_t ratio = p.HV / p.H;
  prep_gates(p, row, h * ratio, ratio);
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
// Global 1, local 1: one serial pass, O(sequences + chunks).
GDN_KERNEL(1) void gdn_chunk_plan(GdnDeltaParams p) {
  const bool align = p.slots.ckpt_interval > 0 && p.slots.start_pos;
  int32_t chunks = 0, seqs = 0;
  for (int32_t i = 0; i < p.num_seqs; ++i) {
    const int32_t j0 = p.query_start_loc[i], len = p.query_start_loc[i + 1] - j0;
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
