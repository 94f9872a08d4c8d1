// delta_prep.cpp — the per-row preprocessing of the gated delta rule and the chunk plan.
#include "delta.hpp"

// The log-decay g = -exp(A_log) * softplus(x), x = a + dt_bias, as the value of that product
// however large or small its factors (README "Non-finite gates"). Where both factors are normal
// f32 numbers it is their product (rounded once, as it always was): -inf when it overflows
// (decay 0, a reset), 0 when it underflows. Elsewhere -- exp(A_log) overflowing (A_log >~ 88.7) or
// underflowing, softplus(x) = 0 (x <~ -87) or +inf -- the product is taken in log space,
// -exp(A_log + log softplus(x)), with log softplus(x) = x below -15 (softplus(x) = e^x (1 - e^x/2
// ...)): A_log = 100 with a = -200 is g = -e^-100 (no decay), never 0 * inf = NaN. A factor that is
// exactly 0 (A_log = -inf or x = -inf) gives g = 0 even against an infinite other factor. NaN in
// gives NaN out (it stays in its sequence). pygdn/reference.py gates() is the float64 twin.
static inline float log_decay(float A_log, float x) {
  const float e = sycl::exp(A_log), sp = softplus(x);
  const float lo = 1.17549435e-38f, hi = 3.40282347e38f;  // FLT_MIN, FLT_MAX: normal numbers
  if (e >= lo && e <= hi && sp >= lo && sp <= hi) return -e * sp;  // (NaN fails every comparison)
  if (sycl::isnan(A_log) || sycl::isnan(x)) return A_log + x;
  if (sycl::isinf(A_log) && A_log < 0.0f) return 0.0f;
  if (sycl::isinf(x) && x < 0.0f) return 0.0f;
  return -sycl::exp(A_log + (x < -15.0f ? x : sycl::log(sp)));
}

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
  float rq = 1.0f, rk = 1.0f;
  if (p.l2norm) {
    rq = p.l2_div ? 1.0f / (sycl::sqrt(sq) + p.eps) : sycl::rsqrt(sq + p.eps);
    rk = p.l2_div ? 1.0f / (sycl::sqrt(sk) + p.eps) : sycl::rsqrt(sk + p.eps);
  }
  rq *= p.scale;
  float *qn = p.qn + (row * p.H + h) * KD, *kn = p.kn + (row * p.H + h) * KD;
  for (int k = 0; k < KD; ++k) {
    qn[k] = load_act(p.qkv, qbase + k) * rq;
    kn[k] = load_act(p.qkv, kbase + k) * rk;
  }
  const int32_t ratio = p.HV / p.H;
  for (int32_t r = 0; r < ratio; ++r) {
    const int32_t hv = h * ratio + r;
    const int64_t gi = row * p.HV + hv;
    if (p.g_in) {
      p.g[gi] = p.g_in[gi];
      p.beta[gi] = p.beta_in[gi];
    } else {
      const float a = load_act(p.a, row * p.ab_stride + hv), b = load_act(p.b, row * p.ab_stride + hv);
      p.g[gi] = log_decay(p.A_log[hv], a + p.dt_bias[hv]);
      p.beta[gi] = sigmoid(b);
    }
  }
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
