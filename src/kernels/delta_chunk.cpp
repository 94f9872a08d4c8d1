// delta_chunk.cpp — the generic chunk kernels (Intel GPUs; the CPU device runs delta_chunk_cpu.cpp
// when K and V are multiples of 16, unless GDN_XPU_GENERIC_KERNELS=1). Algorithm: delta_chunk.hpp.
// Two forms, a build each: f32 products (below), and with -DGDN_MX=1 the products as sub-group tile
// products with bf16 operands (cfg->prefill_precision BF16: delta_chunk_mx.hpp), which shares the
// decays, the per-channel pair terms and the triangular solve defined here.
#include "delta_chunk.hpp"
#include "delta_recurrent.hpp"  // the state tile
#include <sycl/ext/oneapi/work_group_static.hpp>
#include <sycl/group_algorithm.hpp>
#include <sycl/group_barrier.hpp>

#ifndef GDN_MX
#define GDN_MX 0
#endif

// Channels per pass of the per-channel (GDN_CHANNEL_GATE) A and Aqk products: a work-item's
// running k_i (.) D and q_i (.) D slices stay in registers.
#define CHUNK_KB 8

// The prep's parts both forms share (the f32 form here, the matrix form in delta_chunk_mx.hpp): a
// work-group of GDN_CHUNK_SIZE work-items per (chunk, v-head), work-item i for the chunk's row i,
// the chunk's matrices in SLM.
struct PrepRow {
  int32_t c, hv, h, i, jfirst, len;
  bool valid;      // i < len
  int64_t row;     // row i's global row (0 past len)
  int64_t pos;     // chunk_pos of (hv, c)
  float b;         // row i's beta (0 past len)
};
static inline PrepRow prep_row(const GdnDeltaParams &p, const sycl::nd_item<2> &it) {
  PrepRow r;
  r.c = (int32_t)(it.get_group(0) / p.HV), r.hv = (int32_t)(it.get_group(0) % p.HV);
  r.i = (int32_t)it.get_local_id(1);
  const int32_t *ct = p.chunk_table + (int64_t)r.c * GDN_TABLE_INTS;
  r.jfirst = ct[1], r.len = ct[2];
  r.h = r.hv / (p.HV / p.H);
  r.valid = r.i < r.len;
  r.row = r.valid ? global_row(p.token_indx, r.jfirst + r.i) : 0;
  r.pos = chunk_pos(p, r.hv, r.c);
  r.b = r.valid ? p.beta[r.row * p.HV + r.hv] : 0.0f;
  return r;
}

#if GDN_CHANNEL_GATE
// A decay per key channel (delta_chunk.hpp, "A decay per key channel"). Work-item i walks the rows
// for channels i, i + GDN_CHUNK_SIZE, ...: dstart by its running product, and each row's alpha =
// e^g to dend's row, which the pair terms read and channel_dend turns into dend.
static inline void channel_dstart(const GdnDeltaParams &p, const PrepRow &r, const int64_t *row_s) {
  float *dstart = p.chunk_dstart + r.pos * kGateK, *dend = p.chunk_dend + r.pos * kGateK;
  for (int k = r.i; k < kHeadK; k += GDN_CHUNK_SIZE) {
    float d = 1.0f;
    for (int32_t s = 0; s < r.len; ++s) {
      const float alpha = sycl::exp(p.g[(row_s[s] * p.HV + r.hv) * kGateK + k]);
      d *= alpha;
      dstart[s * kGateK + k] = d;
      dend[s * kGateK + k] = alpha;
    }
  }
}
// Row i of A (beta applied, strictly lower) into A and of Aqk (lower, the diagonal included) into
// T, CHUNK_KB channels at a time, j from i down: kd = k_i (.) D and qd = q_i (.) D with
// D = prod_{s=j+1..i} alpha_s, one more factor per step.
static inline void channel_pair_terms(const GdnDeltaParams &p, const PrepRow &r, const int64_t *row_s,
                                      float (*A)[GDN_CHUNK_SIZE], float (*T)[GDN_CHUNK_SIZE]) {
  const int32_t i = r.i;
  const float *ki = p.kn + (r.row * p.H + r.h) * kHeadK, *qi = p.qn + (r.row * p.H + r.h) * kHeadK;
  const float *dend = p.chunk_dend + r.pos * kGateK;
  for (int32_t j = 0; j < GDN_CHUNK_SIZE; ++j) A[i][j] = T[i][j] = 0.0f;
  if (r.valid)
    for (int k0 = 0; k0 < kHeadK; k0 += CHUNK_KB) {
      float kd[CHUNK_KB], qd[CHUNK_KB];
#pragma unroll
      for (int kk = 0; kk < CHUNK_KB; ++kk) kd[kk] = k0 + kk < kHeadK ? ki[k0 + kk] : 0.0f, qd[kk] = k0 + kk < kHeadK ? qi[k0 + kk] : 0.0f;
      for (int32_t j = i; j >= 0; --j) {
        const float *kj = p.kn + (row_s[j] * p.H + r.h) * kHeadK + k0, *al = dend + j * kGateK + k0;
        float a = 0.0f, aq = 0.0f;
#pragma unroll
        for (int kk = 0; kk < CHUNK_KB; ++kk)
          if (k0 + kk < kHeadK) {
            a += kd[kk] * kj[kk];
            aq += qd[kk] * kj[kk];
            kd[kk] *= al[kk];
            qd[kk] *= al[kk];
          }
        A[i][j] += a;
        T[i][j] += aq;
      }
    }
  for (int32_t j = 0; j < GDN_CHUNK_SIZE; ++j) {
    A[i][j] = j < i ? r.b * A[i][j] : 0.0f;
    T[i][j] = j <= i ? T[i][j] : 0.0f;
  }
}
// dend from the alphas, in place (nothing else reads them).
static inline void channel_dend(const GdnDeltaParams &p, const PrepRow &r) {
  float *dend = p.chunk_dend + r.pos * kGateK;
  for (int k = r.i; k < kHeadK; k += GDN_CHUNK_SIZE) {
    float d = 1.0f;
    for (int32_t s = r.len - 1; s >= 0; --s) {
      const float alpha = dend[s * kGateK + k];
      dend[s * kGateK + k] = d;
      d *= alpha;
    }
  }
}
#else
// A decay per v-head: row i's cumulative log-decay P and last reset R (delta_chunk.hpp) by scans
// over the work-group, d to D_s and the workspace's dstart, the decay to the chunk's end to dend.
struct HeadDecay {
  float P, d;
  int32_t R;
};
static inline HeadDecay head_decays(const GdnDeltaParams &p, const sycl::group<2> &grp, const PrepRow &r, float *P_s,
                                    int32_t *R_s, float *D_s) {
  const float g = r.valid ? p.g[r.row * p.HV + r.hv] : 0.0f;
  const bool reset = r.valid && is_reset(g);
  HeadDecay hd;
  hd.P = sycl::inclusive_scan_over_group(grp, reset ? 0.0f : g, sycl::plus<float>());
  hd.R = sycl::inclusive_scan_over_group(grp, reset ? r.i : -1, sycl::maximum<int32_t>());
  hd.d = decay_from_start(hd.P, hd.R);
  P_s[r.i] = hd.P;
  R_s[r.i] = hd.R;
  D_s[r.i] = hd.d;
  sycl::group_barrier(grp);
  p.chunk_dstart[r.pos + r.i] = hd.d;
  p.chunk_dend[r.pos + r.i] = r.valid ? decay_between(P_s[r.len - 1], R_s[r.len - 1], hd.P, r.i) : 0.0f;
  return hd;
}
#endif

// T = (I + A)^-1 by forward substitution, work-item i owns column i: T[r][i] = -sum_{l=i}^{r-1}
// A[r][l] T[l][i]. The column lives in T itself, not in a per-work-item array: an array indexed
// by the loop variables is private memory (scratch on a GPU, and spilled registers on pvc).
static inline void solve_unit_lower(int32_t i, int32_t len, const float (*A)[GDN_CHUNK_SIZE], float (*T)[GDN_CHUNK_SIZE]) {
  for (int32_t r = 0; r < GDN_CHUNK_SIZE; ++r) T[r][i] = r == i ? 1.0f : 0.0f;
  for (int32_t r = i + 1; r < len; ++r) {
    float acc = 0.0f;
    for (int32_t l = i; l < r; ++l) acc += A[r][l] * T[l][i];
    T[r][i] = -acc;
  }
}

#if GDN_MX
#include "delta_chunk_mx.hpp"
#else
// Global: (chunk_capacity*HV, GDN_CHUNK_SIZE), local (1, GDN_CHUNK_SIZE): one work-group per (chunk, v-head),
// the chunk's matrices in work-group local memory. In sub-groups of GDN_SUB_GROUP as gdn_chunk_scan:
// kernels of one file with different sub-group sizes become separate programs, which the disk
// cache cannot keep.
GDN_SUB_GROUP_KERNEL(2) void gdn_chunk_prep(GdnDeltaParams p) {
  const auto it = item2();
  const auto grp = it.get_group();
  const PrepRow r = prep_row(p, it);
  if (r.len == 0) return;  // an unused row of the table (the whole work-group leaves)
  const int32_t i = r.i, h = r.h;
  const int64_t pos = r.pos, row = r.row;
  const float b = r.b;
  static syclexp::work_group_static<float[GDN_CHUNK_SIZE][GDN_CHUNK_SIZE]> A_s;   // A, strictly lower; then T diag(beta d)
  static syclexp::work_group_static<float[GDN_CHUNK_SIZE][GDN_CHUNK_SIZE]> T_s;   // Aqk; then (I + A)^-1, unit lower; then T diag(beta)
  static syclexp::work_group_static<float[GDN_CHUNK_SIZE]> P_s, B_s, D_s;  // P, beta, d (delta_chunk.hpp)
  static syclexp::work_group_static<int32_t[GDN_CHUNK_SIZE]> R_s;
  static syclexp::work_group_static<int64_t[GDN_CHUNK_SIZE]> row_s;
  float *aqk = p.chunk_aqk + (pos + i) * GDN_CHUNK_SIZE;
  B_s[i] = b;
  row_s[i] = row;
#if GDN_CHANNEL_GATE
  const float *dstart = p.chunk_dstart + pos * kGateK;
  sycl::group_barrier(grp);
  channel_dstart(p, r, row_s);
  sycl::group_barrier(grp);
  channel_pair_terms(p, r, row_s, A_s, T_s);
  for (int32_t j = 0; j < GDN_CHUNK_SIZE; ++j) aqk[j] = T_s[i][j];
  sycl::group_barrier(grp);
  channel_dend(p, r);
#else
  const HeadDecay hd = head_decays(p, grp, r, P_s, R_s, D_s);
  const float *ki = p.kn + (row * p.H + h) * kHeadK, *qi = p.qn + (row * p.H + h) * kHeadK;
  for (int32_t j = 0; j < GDN_CHUNK_SIZE; ++j) {
    float a = 0.0f, aq = 0.0f;
    if (r.valid && j <= i) {
      const float *kj = p.kn + (row_s[j] * p.H + h) * kHeadK;
      float dk = 0.0f, dq = 0.0f;
      for (int k = 0; k < kHeadK; ++k) {
        dk += ki[k] * kj[k];
        dq += qi[k] * kj[k];
      }
      const float decay = decay_between(hd.P, hd.R, P_s[j], j);
      if (j < i) a = b * decay * dk;
      aq = decay * dq;
    }
    A_s[i][j] = a;
    aqk[j] = aq;
  }
#endif
  sycl::group_barrier(grp);
  solve_unit_lower(i, r.len, A_s, T_s);
  sycl::group_barrier(grp);

  if (!r.valid) return;
  // Row i of T diag(beta) (for U) in place of T's, row i of T diag(beta d) (for W) in place of A's
  // (per channel: T diag(beta), dstart in the sum): work-item i alone reads either row from here on.
  for (int32_t j = 0; j <= i; ++j) {
    const float tb = T_s[i][j] * B_s[j];
    T_s[i][j] = tb;
    if (!GDN_CHANNEL_GATE) A_s[i][j] = tb * D_s[j];
  }
  float *w = p.chunk_w + (pos + i) * kHeadK;
  for (int k = 0; k < kHeadK; ++k) {
    float acc = 0.0f;
#if GDN_CHANNEL_GATE
    for (int32_t j = 0; j <= i; ++j) acc += T_s[i][j] * (p.kn[(row_s[j] * p.H + h) * kHeadK + k] * dstart[j * kGateK + k]);
#else
    for (int32_t j = 0; j <= i; ++j) acc += A_s[i][j] * p.kn[(row_s[j] * p.H + h) * kHeadK + k];
#endif
    w[k] = acc;
  }
  float *u = p.chunk_u + (pos + i) * p.V;
  const int64_t vcol = p.v_offset + (int64_t)r.hv * p.V;
  for (int32_t vv = 0; vv < p.V; ++vv) {
    float acc = 0.0f;
    for (int32_t j = 0; j <= i; ++j) acc += T_s[i][j] * load_act(p.qkv, row_s[j] * p.qkv_stride + vcol + vv);
    u[vv] = acc;
  }
}

// The chunk scan (delta_chunk.hpp) with the state tile of the recurrent kernel: a sub-group per
// tile of TILE_COLS state columns of a (sequence, v-head), lane l holding rows k = l + GDN_SUB_GROUP i
// in registers (delta_recurrent.hpp). Per chunk, each product split so that no lane needs another
// lane's registers and nothing in registers is indexed by a variable:
//   W S, q S   lane l takes chunk rows l, l + GDN_SUB_GROUP, ... (SCAN_ROWS of them) against the
//              tile copied to SLM (a broadcast read per k); u = U - W S and q S go to SLM
//   o          the same rows: d (q S) + Aqk u (Aqk is 0 above the diagonal), u from SLM
//   S          lane l's state rows: d_last S + K^T (D[last][.] u), u from SLM
#define SCAN_ROWS (GDN_CHUNK_SIZE / GDN_SUB_GROUP)
static_assert(GDN_CHUNK_SIZE % GDN_SUB_GROUP == 0, "chunk rows spread evenly over a sub-group");

// Global (seq_capacity*HV, column tiles * GDN_SUB_GROUP rounded up), local (1, up to
// GDN_TILE_SUB_GROUPS sub-groups), as gdn_recurrent. SLM per sub-group: its tile, u and q S.
GDN_SUB_GROUP_KERNEL(2) void gdn_chunk_scan(GdnDeltaParams p) {
  const auto it = item2();
  const auto sg = it.get_sub_group();
  const int32_t e = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);  // uniform
  const int32_t v0 = (int32_t)(it.get_global_id(1) / GDN_SUB_GROUP) * TILE_COLS;
  const int32_t me = (int32_t)sg.get_group_linear_id(), lane = (int32_t)sg.get_local_linear_id();
  static syclexp::work_group_static<float[GDN_TILE_SUB_GROUPS][GDN_SUB_GROUP * TILE_KS][TILE_COLS]> S_s;
  static syclexp::work_group_static<float[GDN_TILE_SUB_GROUPS][TILE_COLS][GDN_CHUNK_SIZE]> U_s, Q_s;
  if (e >= p.seq_capacity || v0 >= p.V) return;
  const int32_t *st = p.seq_table + (int64_t)e * GDN_TABLE_INTS;
  const int32_t seq = st[0], c0 = st[1], nc = st[2];
  if (nc == 0) return;  // an unused row of the table
  const SeqSlots ss = seq_slots(p, seq, false);
  const SeqSpan span = delta_span(p, seq, false);
  const int32_t j0 = span.j0;
  if (ss.skip) {
    if (lane < TILE_COLS && v0 + lane < p.V) zero_outputs(p, j0, span.len, hv, v0 + lane);
    return;
  }
  const int32_t h = hv / (p.HV / p.H);
  Checkpoints ckpt = checkpoints(p.slots, seq, ss.start, 0, p.pad_slot_id);
  state_tile s;
  load_tile(p, ss.read_slot, hv, v0, lane, ss.init, s);
  for (int32_t c = c0; c < c0 + nc; ++c) {
    const int32_t jfirst = p.chunk_table[(int64_t)c * GDN_TABLE_INTS + 1], len = p.chunk_table[(int64_t)c * GDN_TABLE_INTS + 2];
    const int64_t pos = chunk_pos(p, hv, c);
    const float *dstart = p.chunk_dstart + pos * kGateK, *dend = p.chunk_dend + pos * kGateK;
    sycl::group_barrier(sg);  // the previous chunk's reads of U_s are done
#pragma unroll
    for (int b = 0; b < TILE_COLS; ++b)
#pragma unroll
      for (int i = 0; i < TILE_KS; ++i) S_s[me][lane + GDN_SUB_GROUP * i][b] = s[b][i];
    sycl::group_barrier(sg);
    // This lane's chunk rows one at a time (a loop, not unrolled: one row's addresses live at a
    // time; with all SCAN_ROWS rows' 64-bit addresses live, SIMD16 spills on Xe-HPG). Rows past
    // len repeat the last row: computed, not stored.
#pragma unroll 1
    for (int m = 0; m < SCAN_ROWS; ++m) {  // u = U - W S and q S
      const int32_t i = lane + GDN_SUB_GROUP * m, ic = sycl::min(i, len - 1);
      const float *w = p.chunk_w + (pos + ic) * kHeadK;
      const float *q = p.qn + (global_row(p.token_indx, jfirst + ic) * p.H + h) * kHeadK, *dq = dstart + ic * kGateK;
      float ws[TILE_COLS] = {}, qs[TILE_COLS] = {};
      for (int k = 0; k < kHeadK; ++k) {
        const float wk = w[k], qk = GDN_CHANNEL_GATE ? q[k] * dq[k] : q[k];  // per channel: (q (.) dstart) S
#pragma unroll
        for (int b = 0; b < TILE_COLS; ++b) {
          const float sk = S_s[me][k][b];
          ws[b] += wk * sk;
          qs[b] += qk * sk;
        }
      }
      if (i < len)
#pragma unroll
        for (int b = 0; b < TILE_COLS; ++b) {
          U_s[me][b][i] = (v0 + b < p.V ? p.chunk_u[(pos + i) * p.V + v0 + b] : 0.0f) - ws[b];
          Q_s[me][b][i] = qs[b];
        }
    }
    sycl::group_barrier(sg);
#pragma unroll 1
    for (int m = 0; m < SCAN_ROWS; ++m) {  // o = d (q S) + Aqk u (Aqk is 0 above the diagonal)
      const int32_t i = lane + GDN_SUB_GROUP * m, ic = sycl::min(i, len - 1);
      const float *aqk = p.chunk_aqk + (pos + ic) * GDN_CHUNK_SIZE;
      float o[TILE_COLS];
#pragma unroll
      for (int b = 0; b < TILE_COLS; ++b) o[b] = GDN_CHANNEL_GATE ? Q_s[me][b][ic] : dstart[ic] * Q_s[me][b][ic];
      for (int32_t j = 0; j < len; ++j) {
        const float a = aqk[j];
#pragma unroll
        for (int b = 0; b < TILE_COLS; ++b) o[b] += a * U_s[me][b][j];
      }
      if (i < len) {
        const int64_t at = global_row(p.token_indx, jfirst + i) * p.out_stride + (int64_t)hv * p.V + v0;
#pragma unroll
        for (int b = 0; b < TILE_COLS; ++b)
          if (v0 + b < p.V) store_act(p.out, at + b, o[b]);
      }
    }
    // S = d_last S + K^T (D[last][.] u); per channel: Diag(dlast) S + (K (.) dend)^T u, the lane's
    // rows' dlast and dend beside its k slice.
#if GDN_CHANNEL_GATE
    float dl[TILE_KS];
    load_slice(dstart + (len - 1) * kGateK, lane, dl);
#pragma unroll
    for (int b = 0; b < TILE_COLS; ++b)
#pragma unroll
      for (int i = 0; i < TILE_KS; ++i) s[b][i] *= dl[i];
#else
    const float dlast = dstart[len - 1];
#pragma unroll
    for (int b = 0; b < TILE_COLS; ++b)
#pragma unroll
      for (int i = 0; i < TILE_KS; ++i) s[b][i] *= dlast;
#endif
    for (int32_t j = 0; j < len; ++j) {
      float kk[TILE_KS];
      load_slice(p.kn + (global_row(p.token_indx, jfirst + j) * p.H + h) * kHeadK, lane, kk);
#if GDN_CHANNEL_GATE
      const float *de = dend + j * kGateK + lane;
#pragma unroll
      for (int i = 0; i < TILE_KS; ++i) kk[i] *= tile_row(lane, i) ? de[GDN_SUB_GROUP * i] : 0.0f;
      const float dj = 1.0f;  // (in k)
#else
      const float dj = dend[j];
#endif
#pragma unroll
      for (int b = 0; b < TILE_COLS; ++b) {
        const float ub = U_s[me][b][j] * dj;
#pragma unroll
        for (int i = 0; i < TILE_KS; ++i) s[b][i] += kk[i] * ub;
      }
    }
    // A block checkpoint is always a chunk end (gdn_chunk_plan aligns the chunks to it).
    const int32_t ck = ckpt.after(jfirst + len - 1 - j0);
    if (!gdn_is_pad(ck, p.pad_slot_id)) store_tile(p, sg, ck, hv, v0, lane, s);
  }
  store_tile(p, sg, ss.cols[0], hv, v0, lane, s);
}
#endif  // GDN_MX
