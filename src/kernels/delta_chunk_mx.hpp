// delta_chunk_mx.hpp — the chunk kernels' matrix form: delta_chunk.cpp's -DGDN_MX=1 builds
// (cfg->prefill_precision BF16, docs/op.md "Prefill precision"). The algorithm of delta_chunk.hpp
// with every dense product a sub-group tile product (tiles.hpp): bf16 operands, r() below (round to
// nearest even), f32 accumulators. Per chunk and v-head:
//   prep (GDN)  KK = r(k) r(k)^T, QK = r(q) r(k)^T; A = tril(beta_i D KK, -1), Aqk = tril(D QK) in f32
//        (KDA)  A and Aqk by the f32 per-channel walks (delta_chunk.cpp, channel_pair_terms)
//               T = (I + A)^-1 in f32 (forward substitution, delta_chunk.cpp)
//               W = r(T diag(beta d)) r(k) (KDA: r(T diag(beta)) r(k (.) dstart)),  U = r(T diag(beta)) r(v)
//   scan        u = U - r(W) r(S),  o = r(q (.) dstart) r(S) + r(Aqk) r(u),  S = dlast S + r(k (.) dend)^T r(u)
// with the state S f32 throughout (rounded to bf16 only as an operand, and to the state dtype where it
// is stored). pygdn/reference.py (chunked_gated_delta_rule_bf16) models the same roundings in float64.
// The scan's operands are bf16 arrays of the workspace, written by the prep (GdnDeltaParams.chunk_wb,
// chunk_qb, chunk_kb, chunk_aqkb: -r(W), r(q (.) dstart), r(k (.) dend), r(Aqk)); U stays f32 (the
// accumulator u starts from). Rows of a chunk past its length are zeros in every operand, so a
// partial chunk's tiles need no masks. Sub-groups of GDN_MX_SG lanes take a product's tiles in turn.
// The tile loops and the depth loop of the two-product tiles are not unrolled (#pragma unroll 1):
// unrolled, the depth loop's loads were hoisted ahead of its DPAS and spilled registers on Xe2. Every operand is loaded row-major: a transposed operand (k^T of k k^T, u^T of the state update) is
// written transposed where it is made (IGC has no column-major bf16 load for dg2's SIMD8 tiles).
#pragma once
#include "tiles.hpp"

#define MX_SGS (GDN_CHUNK_SIZE / GDN_MX_SG)  // sub-groups of a work-group (GDN_CHUNK_SIZE work-items)
#define MX_COLS gdn_mx_cols(kHeadK)          // gdn_chunk_scan's state columns
#define GDN_MX_KERNEL(dims) GDN_KERNEL(dims) SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<GDN_MX_SG>))
static_assert(GDN_CHUNK_SIZE % GDN_MX_SG == 0 && GDN_CHUNK_SIZE % GDN_MX_M == 0 && GDN_CHUNK_SIZE % GDN_MX_N == 0 &&
                  GDN_CHUNK_SIZE % GDN_MX_K == 0, "a chunk is whole tiles");
static_assert(GDN_MX_DIM % GDN_MX_M == 0 && GDN_MX_DIM % GDN_MX_N == 0 && GDN_MX_DIM % GDN_MX_K == 0 &&
                  kHeadK % GDN_MX_DIM == 0 && MX_COLS % GDN_MX_DIM == 0 && GDN_MX_VCOLS % GDN_MX_DIM == 0,
              "K, V (a multiple of GDN_MX_DIM: the plan's condition) and the column blocks are whole tiles");

static inline uint16_t mx_round(float x) { return float_to_bf16(x); }

// Row i's decay of channel k from a chunk_dstart / chunk_dend row (one value per row without KDA).
static inline float row_decay(const float *d, int32_t i, int k) { return d[i * kGateK + (kGateK > 1 ? k : 0)]; }

// The chunk's matrices in SLM, each array reused once its values are dead (a barrier between).
union MxPrepA {
  float A[GDN_CHUNK_SIZE][GDN_CHUNK_SIZE];           // A (GDN: first k k^T)
  uint16_t T16[2][GDN_CHUNK_SIZE][GDN_CHUNK_SIZE];    // then r(T diag(beta)), r(T diag(beta d))
};
union MxPrepT {
  float T[GDN_CHUNK_SIZE][GDN_CHUNK_SIZE];           // Aqk (GDN: first q k^T), then T = (I + A)^-1
  uint16_t V16[GDN_CHUNK_SIZE][GDN_MX_VCOLS];         // then r(v) of GDN_MX_VCOLS columns at a time
};

#if !GDN_CHANNEL_GATE
// KK = r(k) r(k)^T into KK, QK = r(q) r(k)^T into QK: the tiles on or below the diagonal (the
// others are not read), from the chunk's rows of r(k) and r(q) in kb and qb and r(k)^T in kt.
static inline void mx_pair_products(const sycl::sub_group &sg, int32_t me, const uint16_t *kb, const uint16_t *qb,
                                    const uint16_t *kt, float (*KK)[GDN_CHUNK_SIZE], float (*QK)[GDN_CHUNK_SIZE]) {
  constexpr int RB = GDN_CHUNK_SIZE / GDN_MX_M, CB = GDN_CHUNK_SIZE / GDN_MX_N;
#pragma unroll 1
  for (int t = me; t < RB * CB; t += MX_SGS) {
    const int rb = t / CB, cb = t % CB;
    if (cb * GDN_MX_N > rb * GDN_MX_M + GDN_MX_M - 1) continue;  // above the diagonal
    mx_acc kk, qk;
    mx_fill(sg, kk, 0.0f);
    mx_fill(sg, qk, 0.0f);
#pragma unroll 1
    for (int k0 = 0; k0 < kHeadK; k0 += GDN_MX_K) {
      mx_a ak, aq;
      mx_b bk;
      mx_load<MX_GLOBAL>(sg, ak, kb + rb * GDN_MX_M * kHeadK + k0, kHeadK);
      mx_load<MX_GLOBAL>(sg, aq, qb + rb * GDN_MX_M * kHeadK + k0, kHeadK);
      mx_load<MX_GLOBAL>(sg, bk, kt + k0 * GDN_CHUNK_SIZE + cb * GDN_MX_N, GDN_CHUNK_SIZE);
      mx_mad(sg, kk, ak, bk);
      mx_mad(sg, qk, aq, bk);
    }
    mx_store<MX_LOCAL>(sg, kk, &KK[rb * GDN_MX_M][cb * GDN_MX_N], GDN_CHUNK_SIZE);
    mx_store<MX_LOCAL>(sg, qk, &QK[rb * GDN_MX_M][cb * GDN_MX_N], GDN_CHUNK_SIZE);
  }
}
#endif

// C = A B for the chunk's GDN_CHUNK_SIZE rows and n columns: A lower triangular (r(T ...), SLM, stride
// GDN_CHUNK_SIZE), B rows of stride ldb (SLM or the workspace), C f32 to the workspace at stride ldc.
// The depth stops at each row block's diagonal.
template <int SB>
static inline void mx_lower_product(const sycl::sub_group &sg, int32_t me, const uint16_t (*A)[GDN_CHUNK_SIZE],
                                    const uint16_t *B, size_t ldb, int32_t n, float *C, size_t ldc) {
  constexpr int RB = GDN_CHUNK_SIZE / GDN_MX_M;
  const int CB = n / GDN_MX_N;
#pragma unroll 1
  for (int t = me; t < RB * CB; t += MX_SGS) {
    const int rb = t / CB, cb = t % CB;
    mx_acc acc;
    mx_fill(sg, acc, 0.0f);
    mx_mad_depth<MX_LOCAL, SB>(sg, acc, &A[rb * GDN_MX_M][0], GDN_CHUNK_SIZE, B + cb * GDN_MX_N, ldb, rb * GDN_MX_M + GDN_MX_M);
    mx_store<MX_GLOBAL>(sg, acc, C + rb * GDN_MX_M * ldc + cb * GDN_MX_N, ldc);
  }
}

// Global (chunk_capacity*HV, GDN_CHUNK_SIZE), local (1, GDN_CHUNK_SIZE), as the f32 form: a
// work-group per (chunk, v-head), work-item i for row i.
GDN_MX_KERNEL(2) void gdn_chunk_prep(GdnDeltaParams p) {
  const auto it = item2();
  const auto grp = it.get_group();
  const auto sg = it.get_sub_group();
  const PrepRow r = prep_row(p, it);
  if (r.len == 0) return;  // an unused row of the table (the whole work-group leaves)
  const int32_t i = r.i, me = (int32_t)sg.get_group_linear_id();
  static syclexp::work_group_static<MxPrepA> slm_a;
  static syclexp::work_group_static<MxPrepT> slm_t;
  static syclexp::work_group_static<float[GDN_CHUNK_SIZE]> P_s, B_s, D_s;  // P, beta, d (delta_chunk.hpp)
  static syclexp::work_group_static<int32_t[GDN_CHUNK_SIZE]> R_s;
  static syclexp::work_group_static<int64_t[GDN_CHUNK_SIZE]> row_s;
  MxPrepA &sa = slm_a;
  MxPrepT &st = slm_t;
  uint16_t *wb = p.chunk_wb + r.pos * kHeadK, *qb = p.chunk_qb + r.pos * kHeadK, *kb = p.chunk_kb + r.pos * kHeadK;
  uint16_t *ab = p.chunk_aqkb + r.pos * GDN_CHUNK_SIZE;
  const float *ki = p.kn + (r.row * p.H + r.h) * kHeadK, *qi = p.qn + (r.row * p.H + r.h) * kHeadK;
  const float *dstart = p.chunk_dstart + r.pos * kGateK, *dend = p.chunk_dend + r.pos * kGateK;
  B_s[i] = r.b;
  row_s[i] = r.row;
#if GDN_CHANNEL_GATE
  sycl::group_barrier(grp);
  channel_dstart(p, r, row_s);
  sycl::group_barrier(grp);
  channel_pair_terms(p, r, row_s, sa.A, st.T);
  for (int k = 0; k < kHeadK; ++k) kb[i * kHeadK + k] = r.valid ? mx_round(ki[k] * dstart[i * kGateK + k]) : 0;  // W's B
  sycl::group_barrier(grp);
  channel_dend(p, r);
#else
  const HeadDecay hd = head_decays(p, grp, r, P_s, R_s, D_s);
  for (int k = 0; k < kHeadK; ++k) {  // r(k), r(q) and r(k)^T (in wb's rows, which -r(W) replaces at the end)
    const uint16_t kr = r.valid ? mx_round(ki[k]) : 0;
    kb[i * kHeadK + k] = wb[k * GDN_CHUNK_SIZE + i] = kr;
    qb[i * kHeadK + k] = r.valid ? mx_round(qi[k]) : 0;
  }
  sycl::group_barrier(grp);
  mx_pair_products(sg, me, kb, qb, wb, sa.A, st.T);
  sycl::group_barrier(grp);
  for (int32_t j = 0; j < GDN_CHUNK_SIZE; ++j) {
    const float decay = r.valid && j <= i ? decay_between(hd.P, hd.R, P_s[j], j) : 0.0f;
    sa.A[i][j] = j < i ? r.b * decay * sa.A[i][j] : 0.0f;
    st.T[i][j] = j <= i ? decay * st.T[i][j] : 0.0f;
  }
#endif
  for (int32_t j = 0; j < GDN_CHUNK_SIZE; ++j) ab[i * GDN_CHUNK_SIZE + j] = mx_round(st.T[i][j]);
  sycl::group_barrier(grp);
  solve_unit_lower(i, r.len, sa.A, st.T);
  sycl::group_barrier(grp);
  // Rows of r(T diag(beta)) (U) and r(T diag(beta d)) (W; per channel dstart is in W's B, so the first).
  for (int32_t j = 0; j < GDN_CHUNK_SIZE; ++j) {
    const float tb = j <= i ? st.T[i][j] * B_s[j] : 0.0f;
    sa.T16[0][i][j] = mx_round(tb);
    sa.T16[1][i][j] = mx_round(GDN_CHANNEL_GATE ? tb : tb * D_s[j]);
  }
  sycl::group_barrier(grp);
  mx_lower_product<MX_GLOBAL>(sg, me, sa.T16[1], kb, kHeadK, kHeadK, p.chunk_w + r.pos * kHeadK, kHeadK);
  const int64_t vcol = p.v_offset + (int64_t)r.hv * p.V;
  for (int32_t v0 = 0; v0 < p.V; v0 += GDN_MX_VCOLS) {  // U, GDN_MX_VCOLS columns of r(v) at a time
    const int32_t nv = sycl::min((int32_t)GDN_MX_VCOLS, p.V - v0);
    for (int32_t e = i; e < GDN_CHUNK_SIZE * nv; e += GDN_CHUNK_SIZE) {
      const int32_t j = e / nv, c = e % nv;
      st.V16[j][c] = j < r.len ? mx_round(load_act(p.qkv, row_s[j] * p.qkv_stride + vcol + v0 + c)) : 0;
    }
    sycl::group_barrier(grp);
    mx_lower_product<MX_LOCAL>(sg, me, sa.T16[0], &st.V16[0][0], GDN_MX_VCOLS, nv, p.chunk_u + r.pos * p.V + v0, p.V);
    sycl::group_barrier(grp);
  }
  // The scan's operands of row i: -r(W) (u = U - W S is a multiply-add), r(k (.) dend), r(q (.) dstart).
  const float *w = p.chunk_w + (r.pos + i) * kHeadK;
  for (int k = 0; k < kHeadK; ++k) {
    wb[i * kHeadK + k] = r.valid ? mx_round(-w[k]) : 0;
    kb[i * kHeadK + k] = r.valid ? mx_round(ki[k] * row_decay(dend, i, k)) : 0;
    qb[i * kHeadK + k] = r.valid ? mx_round(qi[k] * row_decay(dstart, i, k)) : 0;
  }
}

// A work-group's block of state columns v0 .. v0+ncol-1 of (slot, v-head) between SLM (f32,
// transposed: S^T[c][k] = S[k][v0 + c]) and ssm_state; work-item t takes every GDN_CHUNK_SIZE-th
// element, in the layout's order (vk: k fastest, kv: columns fastest). load: zeros when !init and
// past ncol.
static inline void mx_state_block(const GdnDeltaParams &p, int32_t slot, int32_t hv, int32_t v0, int32_t ncol, int32_t t,
                                  float (*ST)[kHeadK], bool load, bool init) {
#if GDN_STATE_8BIT
  int32_t qc = -1;  // the column whose RowQuant q holds (8-bit stores: each item scans a column it stores)
  RowQuant q{};
#endif
  for (int32_t x = t; x < kHeadK * MX_COLS; x += GDN_CHUNK_SIZE) {
    const int32_t k = GDN_VK_LAYOUT ? x % kHeadK : x / MX_COLS, c = GDN_VK_LAYOUT ? x / kHeadK : x % MX_COLS;
    if (load) {
      ST[c][k] = init && c < ncol ? load_state(state_column(p, slot, hv, v0 + c) + k * k_stride(p)) * row_scale(p, slot, hv, v0 + c) : 0.0f;
    } else if (c < ncol) {
#if GDN_STATE_8BIT
      if (c != qc) {
        float m = 0.0f;
        for (int kk = 0; kk < kHeadK; ++kk) m = sycl::fmax(m, sycl::fabs(ST[c][kk]));
        q = row_quant(m, hv, v0 + c, p.stochastic != 0), qc = c;
      }
      if (k == 0) *row_scale_at(p, slot, hv, v0 + c) = q.scale;
      store_code(state_column(p, slot, hv, v0 + c) + k * k_stride(p), ST[c][k], q, k);
#else
      store_state(state_column(p, slot, hv, v0 + c) + k * k_stride(p), ST[c][k]);
#endif
    }
  }
}

// Global (seq_capacity*HV, column blocks * GDN_CHUNK_SIZE), local (1, GDN_CHUNK_SIZE): a work-group per
// (sequence, v-head, MX_COLS state columns), the state block f32 in SLM across the sequence's
// chunks, transposed (S^T: the state update is S^T = dlast S^T + r(u)^T r(k (.) dend), row-major
// operands only). Per chunk: S's operand r(S) and S *= dlast; u = U - W r(S) (tiles of the chunk's
// rows); r(u) and r(u)^T; then o and the state update, whose tiles the sub-groups take in turn; the
// outputs.
GDN_MX_KERNEL(2) void gdn_chunk_scan(GdnDeltaParams p) {
  const auto it = item2();
  const auto grp = it.get_group();
  const auto sg = it.get_sub_group();
  const int32_t e = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);
  const int32_t v0 = (int32_t)it.get_group(1) * MX_COLS, t = (int32_t)it.get_local_id(1);
  const int32_t me = (int32_t)sg.get_group_linear_id();
  static syclexp::work_group_static<float[MX_COLS][kHeadK]> ST_s;               // S^T (f32)
  static syclexp::work_group_static<uint16_t[kHeadK][MX_COLS]> Sb_s;            // r(S)
  static syclexp::work_group_static<float[GDN_CHUNK_SIZE][MX_COLS]> U_s;        // u, then o
  static syclexp::work_group_static<uint16_t[GDN_CHUNK_SIZE][MX_COLS]> Ub_s;    // r(u)
  static syclexp::work_group_static<uint16_t[MX_COLS][GDN_CHUNK_SIZE]> UbT_s;   // r(u)^T
  if (e >= p.seq_capacity || v0 >= p.V) return;
  const int32_t *st = p.seq_table + (int64_t)e * GDN_TABLE_INTS;
  const int32_t seq = st[0], c0 = st[1], nc = st[2];
  if (nc == 0) return;  // an unused row of the table
  const int32_t ncol = sycl::min((int32_t)MX_COLS, p.V - v0);
  const SeqSlots ss = seq_slots(p, seq, false);
  const SeqSpan span = delta_span(p, seq, false);
  if (ss.skip) {
    for (int32_t c = t; c < ncol; c += GDN_CHUNK_SIZE) zero_outputs(p, span.j0, span.len, hv, v0 + c);
    return;
  }
  Checkpoints ckpt = checkpoints(p.slots, seq, ss.start, 0, p.pad_slot_id);
  mx_state_block(p, ss.read_slot, hv, v0, ncol, t, ST_s, true, ss.init);
  constexpr int RB = GDN_CHUNK_SIZE / GDN_MX_M, SB = MX_COLS / GDN_MX_M, KB = kHeadK / GDN_MX_N;
  const int CB = ncol / GDN_MX_N;
  for (int32_t c = c0; c < c0 + nc; ++c) {
    const int32_t jfirst = p.chunk_table[(int64_t)c * GDN_TABLE_INTS + 1], len = p.chunk_table[(int64_t)c * GDN_TABLE_INTS + 2];
    const int64_t pos = chunk_pos(p, hv, c);
    const float *dlast = p.chunk_dstart + (pos + len - 1) * kGateK;
    const uint16_t *wb = p.chunk_wb + pos * kHeadK, *qb = p.chunk_qb + pos * kHeadK, *kb = p.chunk_kb + pos * kHeadK;
    const uint16_t *ab = p.chunk_aqkb + pos * GDN_CHUNK_SIZE;
    const int rows = (len + GDN_MX_M - 1) / GDN_MX_M;  // row blocks holding the chunk's rows
    sycl::group_barrier(grp);  // the previous chunk's state stores and reads are done
    for (int32_t x = t; x < kHeadK * MX_COLS; x += GDN_CHUNK_SIZE) {
      const int32_t k = x / MX_COLS, cc = x % MX_COLS;
      Sb_s[k][cc] = mx_round(ST_s[cc][k]);
      ST_s[cc][k] *= dlast[kGateK > 1 ? k : 0];
    }
    sycl::group_barrier(grp);
#pragma unroll 1
    for (int tt = me; tt < RB * CB; tt += MX_SGS) {  // u = U - W S
      const int rb = tt / CB, cb = tt % CB;
      if (rb >= rows) continue;
      mx_acc acc;
      mx_load<MX_GLOBAL>(sg, acc, p.chunk_u + (pos + rb * GDN_MX_M) * p.V + v0 + cb * GDN_MX_N, p.V);
      mx_mad_depth<MX_GLOBAL, MX_LOCAL>(sg, acc, wb + rb * GDN_MX_M * kHeadK, kHeadK, &Sb_s[0][cb * GDN_MX_N], MX_COLS, kHeadK);
      mx_store<MX_LOCAL>(sg, acc, &U_s[rb * GDN_MX_M][cb * GDN_MX_N], MX_COLS);
    }
    sycl::group_barrier(grp);
    for (int32_t x = t; x < GDN_CHUNK_SIZE * MX_COLS; x += GDN_CHUNK_SIZE) {
      const int32_t j = x / MX_COLS, cc = x % MX_COLS;
      Ub_s[j][cc] = UbT_s[cc][j] = j < len ? mx_round(U_s[j][cc]) : 0;
    }
    sycl::group_barrier(grp);
    // o = r(q (.) dstart) r(S) + r(Aqk) r(u) into U_s (row blocks of the chunk's rows), and the state
    // update S^T = dlast S^T + r(u)^T r(k (.) dend) (ST_s holds dlast S^T), the tiles of both in one turn.
#pragma unroll 1
    for (int tt = me; tt < rows * CB + SB * KB; tt += MX_SGS) {
      mx_acc acc;
      if (tt < rows * CB) {
        const int rb = tt / CB, cb = tt % CB;
        mx_fill(sg, acc, 0.0f);
        mx_mad_depth<MX_GLOBAL, MX_LOCAL>(sg, acc, qb + rb * GDN_MX_M * kHeadK, kHeadK, &Sb_s[0][cb * GDN_MX_N], MX_COLS, kHeadK);
        mx_mad_depth<MX_GLOBAL, MX_LOCAL>(sg, acc, ab + rb * GDN_MX_M * GDN_CHUNK_SIZE, GDN_CHUNK_SIZE, &Ub_s[0][cb * GDN_MX_N],
                                          MX_COLS, sycl::min(len, rb * GDN_MX_M + GDN_MX_M));  // Aqk is 0 above the diagonal
        mx_store<MX_LOCAL>(sg, acc, &U_s[rb * GDN_MX_M][cb * GDN_MX_N], MX_COLS);
      } else {
        const int sb = (tt - rows * CB) / KB, kb0 = (tt - rows * CB) % KB;
        if (sb * GDN_MX_M >= ncol) continue;  // (the state block's columns past V)
        mx_load<MX_LOCAL>(sg, acc, &ST_s[sb * GDN_MX_M][kb0 * GDN_MX_N], kHeadK);
        mx_mad_depth<MX_LOCAL, MX_GLOBAL>(sg, acc, &UbT_s[sb * GDN_MX_M][0], GDN_CHUNK_SIZE, kb + kb0 * GDN_MX_N, kHeadK, len);
        mx_store<MX_LOCAL>(sg, acc, &ST_s[sb * GDN_MX_M][kb0 * GDN_MX_N], kHeadK);
      }
    }
    sycl::group_barrier(grp);
    for (int32_t x = t; x < len * ncol; x += GDN_CHUNK_SIZE) {
      const int32_t i = x / ncol, cc = x % ncol;
      store_act(p.out, global_row(p.token_indx, jfirst + i) * p.out_stride + (int64_t)hv * p.V + v0 + cc, U_s[i][cc]);
    }
    // A block checkpoint is always a chunk end (gdn_chunk_plan aligns the chunks to it).
    const int32_t ck = ckpt.after(jfirst + len - 1 - span.j0);
    if (!gdn_is_pad(ck, p.pad_slot_id)) mx_state_block(p, ck, hv, v0, ncol, t, ST_s, false, false);
  }
  mx_state_block(p, ss.cols[0], hv, v0, ncol, t, ST_s, false, false);
}
