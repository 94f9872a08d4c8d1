// delta_chunk.hpp — the chunked (WY/UT) prefill form, shared by the generic kernels
// (delta_chunk.cpp, GPUs) and the CPU device's variants (delta_chunk_cpu.cpp). Per chunk of
// GDN_CHUNK_SIZE tokens and v-head, with D[i][j] the decay from token j to token i (the product of
// e^g over tokens j+1..i) and d_i the decay from the chunk's initial state to token i:
//   chunk prep  (all chunks in parallel)  A = tril(beta_i D[i][j] k_i.k_j, -1), T = (I + A)^-1,
//               W = T (beta d K), U = T (beta V), Aqk = tril(D[i][j] q_i.k_j), d, D[last][i]
//   chunk scan  (per sequence, chunk after chunk, the state carried in registers)
//               u = U - W S,  o = d (q S) + Aqk u,  S = d_last S + K^T (D[last][.] u)
// Chunks come from the device-built plan (gdn_chunk_plan, delta_prep.cpp); the workspace holds
// row i of chunk c of v-head hv at (hv * chunk_capacity + c) * GDN_CHUNK_SIZE + i.
//
// Decays and resets (docs/op.md, non-finite gates). Without resets D[i][j] = e^(G_i - G_j) and
// d_i = e^(G_i), G the cumulative g: every exponent <= 0, so nothing overflows. A token whose
// decay e^g is 0 -- g = -inf (a = +inf, an overflowing exp(A_log)), or g so negative that e^g
// underflows -- is a RESET: the recurrence's S = e^g S zeroes the state there. Its g must not
// enter G: e^(-inf - -inf) is NaN (a whole prefill and its saved state became NaN), and a huge
// finite g would absorb the gates after it (f32 keeps 24 bits). So, with P_i the cumulative g of
// the chunk's tokens <= i that are not resets and R_i the last reset at or before i (-1: none),
//   D[i][j] = R_i > j ? 0 : e^(P_i - P_j)      d_i = R_i >= 0 ? 0 : e^(P_i)
// exactly the products the recurrence forms, and finite wherever it is. is_reset() is the
// recurrence's own e^g, so both paths agree on which tokens reset.
//
// A decay per key channel (GDN_CHANNEL_GATE, KDA). With alpha_t = e^(g_t) in [0, 1]^K, D[i][j] and
// d_i become K-vectors, and the chunk's terms become
//   A[i][j] = beta_i sum_k k_i[k] k_j[k] D[i][j][k],   Aqk[i][j] = sum_k q_i[k] k_j[k] D[i][j][k],
//   D[i][j] = prod_{s=j+1..i} alpha_s,  dstart_i = prod_{s<=i} alpha_s,  dend_i = prod_{s=i+1..last} alpha_s,
//   W = T (beta K (.) dstart),  o_i = (q_i (.) dstart_i) S + Aqk u,  S = Diag(dstart_last) S + (K (.) dend)^T u.
// chunk_dstart / chunk_dend hold the vectors, kGateK floats per chunk row. Everything is a running
// product of alphas in linear space: no quotient and no difference of cumulative logs, the two
// forms that fail here. A per-channel reset (alpha = 0 on some channels) makes every product across
// it exactly 0 on those channels only, with no special case (the head gate's P/R bookkeeping does
// that for one value per token); e^(G_i - G_j) with G a cumulative log would make -inf - -inf =
// NaN there, and a factorization (k_i e^G_i).(k_j e^-G_j) overflows once a chunk's decay passes
// e^-88. Every factor is <= 1, so nothing overflows; a product that underflows is one the
// recurrence also takes to (nearly) 0. The pair terms A[i][j], Aqk[i][j] come in two forms:
//   walk         D[i][j] for all j <= i of row i from ONE walk, j from i down, multiplying k_i (.) D
//                and q_i (.) D by one more alpha per step: 2K multiplies per pair on top of the 2K
//                FMAs of the two dot products, no vector of D[i][j] stored (gdn_chunk_prep: one
//                loop, no block bookkeeping across its work-items).
//   sub-chunks   FLA's secondary sub-chunking (gdn_chunk_prep_cpu): rows in blocks of 16, r the
//                block's first row; columns j < r as plain dot products of k_i (.) prod_{r+1..i}
//                alpha and k_j (.) prod_{j+1..r} alpha, both <= 1 (K multiplies per row and block
//                instead of per pair; a matrix product for a matrix engine); columns r..i by the walk.
// Both multiply every alpha in once, in order, as the recurrence does.
#pragma once
#include "delta.hpp"

static inline int64_t chunk_pos(const GdnDeltaParams &p, int32_t hv, int32_t c) {
  return ((int64_t)hv * p.chunk_capacity + c) * GDN_CHUNK_SIZE;
}

static inline bool is_reset(float g) { return sycl::exp(g) == 0.0f; }
// D[i][j] (j <= i) and d_i from P and R (above).
static inline float decay_between(float Pi, int32_t Ri, float Pj, int32_t j) {
  return Ri > j ? 0.0f : sycl::exp(Pi - Pj);
}
static inline float decay_from_start(float Pi, int32_t Ri) { return Ri >= 0 ? 0.0f : sycl::exp(Pi); }

// S[:, v .. v+NL-1] of a work-item to slot, rounded to the state dtype.
template <int NL>
static inline void store_state_columns(const GdnDeltaParams &p, int32_t slot, int32_t hv, int32_t v,
                                       typename Lanes<NL>::T *s) {
  for (int32_t l = 0; l < NL; ++l) {
    state_t *S = state_column(p, slot, hv, v + l);
#if GDN_STATE_8BIT  // the column's scale from its largest magnitude, then its codes
    float m = 0.0f;
    for (int k = 0; k < kHeadK; ++k) m = sycl::fmax(m, sycl::fabs(Lanes<NL>::at(s[k], l)));
    const RowQuant q = row_quant(m, hv, v + l, p.stochastic != 0);
    *row_scale_at(p, slot, hv, v + l) = q.scale;
    for (int k = 0; k < kHeadK; ++k) store_code(S + k * k_stride(p), Lanes<NL>::at(s[k], l), q, k);
#else
    for (int k = 0; k < kHeadK; ++k) store_state(S + k * k_stride(p), Lanes<NL>::at(s[k], l));
#endif
  }
}

// One chunk for CB blocks of NL state columns, block b at columns v[b] .. v[b]+NL-1 with
// s[b][k] = S[k, v[b] ..] (updated in place); blocks b >= cb repeat block cb-1: computed, not stored.
//   u = U - W S,  o = d (q S) + Aqk u,  S = d_last S + K^T (D[last][.] u).
// up and qs are scratch of GDN_CHUNK_SIZE rows per block. Every product is blocked so that
// CB x RB (rows) or CB x KB (state rows) independent accumulators are in flight: one
// accumulator per dot product left the CPU device waiting on the FMA latency, and each load
// (a state or u vector, a broadcast of W, q, Aqk or k) feeds several FMAs. qd and kd hold the
// chunk's q and k rows (chunk_qk_rows; with a decay per key channel q (.) dstart and K (.) dend).
template <int NL, int CB, int RB, int KB>
static inline void chunk_scan_columns(const GdnDeltaParams &p, int64_t pos, int32_t jfirst, int32_t len,
                                      const int64_t *qk_off, const float (*qd)[kHeadK], const float (*kd)[kHeadK], int32_t hv,
                                      const int32_t *v, int32_t cb, typename Lanes<NL>::T *const *s,
                                      typename Lanes<NL>::T (*up)[GDN_CHUNK_SIZE],
                                      typename Lanes<NL>::T (*qs)[GDN_CHUNK_SIZE]) {
  typedef Lanes<NL> L;
  typedef typename L::T lane_t;
  const float *dstart = p.chunk_dstart + pos * kGateK, *dend = p.chunk_dend + pos * kGateK;
  for (int32_t i0 = 0; i0 < len; i0 += RB) {  // u = U - W S and q S, RB rows at a time
    const float *w[RB], *qi[RB];
    for (int r = 0; r < RB; ++r) {  // rows past len repeat row i0: computed, not stored
      const int32_t i = i0 + r < len ? i0 + r : i0;
      w[r] = p.chunk_w + (pos + i) * kHeadK;
      qi[r] = qd[i];
    }
    lane_t ws[CB][RB], q_s[CB][RB];
    for (int b = 0; b < CB; ++b)
      for (int r = 0; r < RB; ++r) ws[b][r] = q_s[b][r] = lane_t(0.0f);
    for (int k = 0; k < kHeadK; ++k) {
      lane_t sk[CB];
      for (int b = 0; b < CB; ++b) sk[b] = s[b][k];
      for (int r = 0; r < RB; ++r) {
        const float wk = w[r][k], qk = qi[r][k];
        for (int b = 0; b < CB; ++b) {
          ws[b][r] += sk[b] * wk;
          q_s[b][r] += sk[b] * qk;
        }
      }
    }
    for (int b = 0; b < CB; ++b)
      for (int r = 0; r < RB && i0 + r < len; ++r) {
        up[b][i0 + r] = L::load(p.chunk_u + (pos + i0 + r) * p.V + v[b]) - ws[b][r];
        qs[b][i0 + r] = q_s[b][r];
      }
  }
  for (int32_t i0 = 0; i0 < len; i0 += RB) {  // o = d (q S) + Aqk u (Aqk is 0 above the diagonal)
    const int32_t nr = sycl::min(RB, len - i0);
    lane_t o[CB][RB];
    const float *aqk[RB];
    for (int r = 0; r < RB; ++r) {
      const int32_t i = r < nr ? i0 + r : i0;
      for (int b = 0; b < CB; ++b) o[b][r] = GDN_CHANNEL_GATE ? qs[b][i] : dstart[i] * qs[b][i];
      aqk[r] = p.chunk_aqk + (pos + i) * GDN_CHUNK_SIZE;
    }
    for (int32_t j = 0; j < i0 + nr; ++j) {
      lane_t uj[CB];
      for (int b = 0; b < CB; ++b) uj[b] = up[b][j];
      for (int r = 0; r < RB; ++r) {
        const float a = aqk[r][j];
        for (int b = 0; b < CB; ++b) o[b][r] += a * uj[b];
      }
    }
    for (int r = 0; r < nr; ++r) {
      const int64_t at = global_row(p.token_indx, jfirst + i0 + r) * p.out_stride + (int64_t)hv * p.V;
      for (int b = 0; b < cb; ++b) L::store_act(p.out, at + v[b], o[b][r]);
    }
  }
  // S = d_last S + K^T (D[last][.] u); per channel: Diag(dlast) S + (K (.) dend)^T u.
  const float *dlast_k = dstart + (len - 1) * kGateK, dlast = dlast_k[0];
  if (!GDN_CHANNEL_GATE)
    for (int32_t j = 0; j < len; ++j)
      for (int b = 0; b < CB; ++b) up[b][j] *= dend[j];
  for (int k0 = 0; k0 < kHeadK; k0 += KB) {
    lane_t acc[CB][KB];
    for (int b = 0; b < CB; ++b)
      for (int kk = 0; kk < KB; ++kk)
        acc[b][kk] = k0 + kk < kHeadK ? s[b][k0 + kk] * (GDN_CHANNEL_GATE ? dlast_k[k0 + kk] : dlast) : lane_t(0.0f);
    for (int32_t j = 0; j < len; ++j) {
      lane_t uj[CB];
      for (int b = 0; b < CB; ++b) uj[b] = up[b][j];
      const float *kj = kd[j] + k0;
      for (int kk = 0; kk < KB && k0 + kk < kHeadK; ++kk)
        for (int b = 0; b < CB; ++b) acc[b][kk] += uj[b] * kj[kk];
    }
    for (int b = 0; b < cb; ++b)
      for (int kk = 0; kk < KB && k0 + kk < kHeadK; ++kk) s[b][k0 + kk] = acc[b][kk];
  }
}

// A chunk's q and k rows as chunk_scan_columns's products take them, contiguous: q_i and k_i, or with a
// decay per key channel q_i (.) dstart_i and k_i (.) dend_i (each product rounded once), formed once
// per chunk instead of once per block and FMA group. In qn and kn a head's rows lie H*K floats apart
// (8 KiB at H = 16, K = 128), the same few L1 sets for every row (docs/performance.md, "KDA prefill"
// under "Why each row reads as it does", has the scan's time with and without the copies).
static inline void chunk_qk_rows(const GdnDeltaParams &p, int64_t pos, int32_t len, const int64_t *qk_off,
                                 float (*qd)[kHeadK], float (*kd)[kHeadK]) {
  const float *dstart = p.chunk_dstart + pos * kGateK, *dend = p.chunk_dend + pos * kGateK;
  for (int32_t i = 0; i < len; ++i)
    for (int k = 0; k < kHeadK; ++k) {
      qd[i][k] = GDN_CHANNEL_GATE ? p.qn[qk_off[i] + k] * dstart[i * kGateK + k] : p.qn[qk_off[i] + k];
      kd[i][k] = GDN_CHANNEL_GATE ? p.kn[qk_off[i] + k] * dend[i * kGateK + k] : p.kn[qk_off[i] + k];
    }
}

// The chunk scan of one (sequence, v-head) over NB blocks of NL state columns from v0 on
// (Lanes<NL>, vec16.hpp), CB blocks per pass: the CPU device's kernel (NL = 16; the generic
// kernel in delta_chunk.cpp computes the same products with the state spread over a sub-group,
// docs/gpu.md). The blocks are walked INSIDE the chunk loop: a
// chunk's W, q, k and Aqk (~112 KiB per v-head at K = 128) are read from memory once and reused
// from the cache by every block. A work-item per block each walking the whole sequence alone
// re-read them per block, from DRAM once a sequence's chunk data outgrew the caches.
template <int NL, int NB, int CB, int RB, int KB>
static inline void chunk_scan_body(const GdnDeltaParams &p, int32_t e, int32_t hv, int32_t v0) {
  typedef Lanes<NL> L;
  typedef typename L::T lane_t;
  const int32_t *st = p.seq_table + (int64_t)e * GDN_TABLE_INTS;
  const int32_t seq = st[0], c0 = st[1], nc = st[2];
  if (nc == 0) return;  // an unused row of the table
  const int32_t nb = sycl::min(NB, (p.V - v0) / NL);  // the last group may hold fewer blocks
  const SeqSlots ss = seq_slots(p, seq, false);
  const SeqSpan span = delta_span(p, seq, false);
  const int32_t j0 = span.j0;
  if (ss.skip) {
    for (int32_t l = 0; l < nb * NL; ++l) zero_outputs(p, j0, span.len, hv, v0 + l);
    return;
  }
  const int32_t h = hv / (p.HV / p.H);
  Checkpoints ckpt = checkpoints(p.slots, seq, ss.start, 0, p.pad_slot_id);
  lane_t s[NB][kHeadK];  // s[b][k] = S[k, v0 + b NL .. v0 + (b+1) NL - 1]
  for (int32_t b = 0; b < nb; ++b)
    for (int32_t l = 0; l < NL; ++l) {
      const state_t *S = state_column(p, ss.read_slot, hv, v0 + b * NL + l);
      const float sc = ss.init ? row_scale(p, ss.read_slot, hv, v0 + b * NL + l) : 0.0f;  // (8-bit states; else 1)
      for (int k = 0; k < kHeadK; ++k) L::at(s[b][k], l) = ss.init ? load_state(S + k * k_stride(p)) * sc : 0.0f;
    }
  lane_t up[CB][GDN_CHUNK_SIZE], qs[CB][GDN_CHUNK_SIZE];
  int64_t qk_off[GDN_CHUNK_SIZE];  // offset of row i's q and k (qn and kn share the layout)
  float qd[GDN_CHUNK_SIZE][kHeadK], kd[GDN_CHUNK_SIZE][kHeadK];  // the chunk's q and k rows (chunk_qk_rows)
  for (int32_t c = c0; c < c0 + nc; ++c) {
    const int32_t jfirst = p.chunk_table[(int64_t)c * GDN_TABLE_INTS + 1], len = p.chunk_table[(int64_t)c * GDN_TABLE_INTS + 2];
    const int64_t pos = chunk_pos(p, hv, c);
    for (int32_t i = 0; i < len; ++i) qk_off[i] = (global_row(p.token_indx, jfirst + i) * p.H + h) * kHeadK;
    chunk_qk_rows(p, pos, len, qk_off, qd, kd);
    for (int32_t b0 = 0; b0 < nb; b0 += CB) {
      const int32_t cb = sycl::min(CB, nb - b0);
      lane_t *sb[CB];
      int32_t vb[CB];
      for (int b = 0; b < CB; ++b) {
        const int32_t bb = b0 + (b < cb ? b : cb - 1);
        sb[b] = s[bb];
        vb[b] = v0 + bb * NL;
      }
      chunk_scan_columns<NL, CB, RB, KB>(p, pos, jfirst, len, qk_off, qd, kd, hv, vb, cb, sb, up, qs);
    }
    // A block checkpoint is always a chunk end (gdn_chunk_plan aligns the chunks to it).
    const int32_t ck = ckpt.after(jfirst + len - 1 - j0);
    if (!gdn_is_pad(ck, p.pad_slot_id))
      for (int32_t b = 0; b < nb; ++b) store_state_columns<NL>(p, ck, hv, v0 + b * NL, s[b]);
  }
  for (int32_t b = 0; b < nb; ++b) store_state_columns<NL>(p, ss.cols[0], hv, v0 + b * NL, s[b]);
}
