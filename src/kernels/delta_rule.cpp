// delta_rule.cpp — gated delta rule kernels. Built per (activation dtype, head_k_dim):
// -DGDN_HEAD_K=<K> sizes the per-work-item state column so loops over K are fixed-trip.
//
// Decomposition (same on the CPU device and Intel GPUs; see README "Kernel design"):
//   gdn_prep        one work-item per (row, k-head): l2norm q/k, scale q, gates of its v-heads.
//   gdn_recurrent   one work-item per (sequence, v-head, v): owns column S[:, v] (K floats) in
//                   registers, walks the sequence's tokens. Decode, spec decode (state written
//                   after every token) and, with FORCE_RECURRENT, prefill.
//   gdn_chunk_prep  one work-group of 64 per (chunk, v-head), all chunks in parallel: the WY/UT
//                   matrices of the chunk in work-group local memory (A, T = (I+A)^-1), writes
//                   W = T(beta e^G K), U = T(beta V), Aqk = tril(e^(Gi-Gj) q_i.k_j) and G.
//   gdn_chunk_scan  one work-item per (prefill sequence, v-head, v): carries S[:, v] through the
//                   sequence's chunks: u = U - W S, o = e^G (q S) + Aqk u, S = e^Glast S + K^T(e^(Glast-G) u).
#include "common.hpp"
#include <sycl/ext/oneapi/work_group_static.hpp>

#ifndef GDN_HEAD_K
#error "GDN_HEAD_K must be defined"
#endif
#define KD GDN_HEAD_K
#define CHUNK 64
#define SCAN_RB 4  // chunk_scan register blocking: rows of W / q per pass
#define SCAN_KB 8  // and state rows per pass of the state update
// ssm_state layout is a compile-time variant (-DGDN_SSM_VK=0/1): with constant strides the
// column of a work-item is contiguous across the work-group and the CPU device vectorizes it.
#if GDN_SSM_VK
#define K_STRIDE 1
#define V_STRIDE KD
#else
#define K_STRIDE p.V
#define V_STRIDE 1
#endif

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
      p.g[gi] = -sycl::exp(p.A_log[hv]) * softplus(a + p.dt_bias[hv]);
      p.beta[gi] = sigmoid(b);
    }
  }
}

static inline float *state_column(const GdnDeltaParams &p, int32_t slot, int32_t hv, int32_t v) {
  return p.ssm + (int64_t)slot * p.slot_stride + (int64_t)hv * KD * p.V + (int64_t)v * V_STRIDE;
}

static inline void store_column(const GdnDeltaParams &p, int32_t slot, int32_t hv, int32_t v, const float *s) {
  float *S = state_column(p, slot, hv, v);
  for (int k = 0; k < KD; ++k) S[k * K_STRIDE] = s[k];
}

static inline void zero_outputs(const GdnDeltaParams &p, int32_t j0, int32_t len, int32_t hv, int32_t v) {
  for (int32_t t = 0; t < len; ++t)
    store_act(p.out, global_row(p.token_indx, j0 + t) * p.out_stride + (int64_t)hv * p.V + v, 0.0f);
}

// How a work-item of gdn_recurrent holds its part of the state (-DGDN_CPU_VEC, chosen by the host):
//   0  one state column S[:, v] as K floats: one v per work-item (GPUs; any dims)
//   1  kv layout on the CPU device: 16 consecutive columns as K x float16-vectors (needs V % 16 == 0)
//   2  vk layout on the CPU device: rows S[v, :] as K/16 float16-vectors (needs K % 16 == 0),
//      see recurrent_rows_vk
// The CPU runtime's work-group vectorizer turns uniform loads into gathers when it cannot prove
// uniformity; explicit vectors inside a work-item make every load contiguous or a broadcast.
#ifndef GDN_CPU_VEC
#define GDN_CPU_VEC 0
#endif
// Which chunk kernels this build contains (-DGDN_CPU_CHUNK=1: the *_cpu variants), so a device
// compiles only the kernels it runs.
#ifndef GDN_CPU_CHUNK
#define GDN_CPU_CHUNK 0
#endif
static inline vf16 vload(const float *p) {
  vf16 r;
  for (int i = 0; i < 16; ++i) r[i] = p[i];
  return r;
}
static inline void vstore(float *p, const vf16 &x) {
  for (int i = 0; i < 16; ++i) p[i] = x[i];
}
// Speculative decoding writes a state per token that nothing reads in this call: a streaming
// (non-temporal) store skips the read-for-ownership of each line, which cost the CPU device a
// second pass over the written bytes (recurrent kernel ~5.9 -> ~4.8 ms at spec S=3, B=8 here).
// It needs the 64-byte alignment of the vector; other addresses take the plain store.
static inline void vstore_stream(float *p, const vf16 &x) {
  if (((uintptr_t)p & 63u) == 0) __builtin_nontemporal_store(sycl::bit_cast<native_vf16>(x), (native_vf16 *)p);
  else vstore(p, x);
}
// Horizontal sum as a tree (4 dependent adds, not 16: the sum sits on the token's critical path).
static inline float hsum(const vf16 &x) {
  typedef float n8 __attribute__((ext_vector_type(8)));
  typedef float n4 __attribute__((ext_vector_type(4)));
  const native_vf16 a = sycl::bit_cast<native_vf16>(x);
  const n8 b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
  const n4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
  return (c[0] + c[2]) + (c[1] + c[3]);
}

// The recurrence of one sequence and v-head over the state part at v (see GDN_CPU_VEC).
static inline void recurrent_part(const GdnDeltaParams &p, int32_t seq, int32_t hv, int32_t v) {
  const int32_t j0 = p.query_start_loc[seq], len = p.query_start_loc[seq + 1] - j0;
  const bool spec = p.mode == 2;
  if (len == 0 || (p.mode == 0 && len != 1)) return;  // mode 0: longer sequences go to the chunk kernels
  const int32_t *cols = spec ? p.state_indices + (int64_t)seq * p.slot_cols : p.state_indices + seq;
  const int32_t read_slot = spec ? cols[p.num_accepted[seq] - 1] : cols[0];
  const int32_t nv = GDN_CPU_VEC == 1 ? 16 : 1;
  if (read_slot == p.pad_slot_id) {
    for (int32_t i = 0; i < nv; ++i) zero_outputs(p, j0, len, hv, v + i);
    return;
  }
  const int32_t h = hv / (p.HV / p.H);
  const bool init = spec || !p.has_initial_state || p.has_initial_state[seq];
  const int64_t head = (int64_t)hv * KD * p.V;
#if GDN_CPU_VEC == 1
  vf16 s[KD];  // s[k] = S[k, v .. v+15]
  {
    const float *S = p.ssm + (int64_t)read_slot * p.slot_stride + head + v;
    for (int k = 0; k < KD; ++k) s[k] = init ? vload(S + (int64_t)k * p.V) : vf16(0.0f);
  }
#else
  float s[KD];
  {
    const float *S = state_column(p, read_slot, hv, v);
    for (int k = 0; k < KD; ++k) s[k] = init ? S[k * K_STRIDE] : 0.0f;
  }
#endif
  for (int32_t t = 0; t < len; ++t) {
    const int64_t row = global_row(p.token_indx, j0 + t);
    const float *kn = p.kn + (row * p.H + h) * KD, *qn = p.qn + (row * p.H + h) * KD;
    const float decay = sycl::exp(p.g[row * p.HV + hv]), beta = p.beta[row * p.HV + hv];
    const int64_t vrow = row * p.qkv_stride + p.v_offset + (int64_t)hv * p.V + v;
    const int64_t orow = row * p.out_stride + (int64_t)hv * p.V + v;
#if GDN_CPU_VEC == 1
    vf16 vv;
    for (int i = 0; i < 16; ++i) vv[i] = load_act(p.qkv, vrow + i);
    vf16 kv(0.0f);
    for (int k = 0; k < KD; ++k) {
      s[k] *= decay;
      kv += s[k] * kn[k];
    }
    const vf16 u = beta * (vv - kv);
    vf16 o(0.0f);
    for (int k = 0; k < KD; ++k) {
      s[k] += u * kn[k];
      o += s[k] * qn[k];
    }
    for (int i = 0; i < 16; ++i) store_act(p.out, orow + i, o[i]);
    if (spec && cols[t] != p.pad_slot_id) {
      float *S = p.ssm + (int64_t)cols[t] * p.slot_stride + head + v;
      for (int k = 0; k < KD; ++k) vstore(S + (int64_t)k * p.V, s[k]);
    }
#else
    const float vv = load_act(p.qkv, vrow);
    float kv = 0.0f;
    for (int k = 0; k < KD; ++k) {
      s[k] *= decay;
      kv += s[k] * kn[k];
    }
    const float u = beta * (vv - kv);
    float o = 0.0f;
    for (int k = 0; k < KD; ++k) {
      s[k] += kn[k] * u;
      o += s[k] * qn[k];
    }
    store_act(p.out, orow, o);
    if (spec && cols[t] != p.pad_slot_id) store_column(p, cols[t], hv, v, s);
#endif
  }
  if (!spec) {
#if GDN_CPU_VEC == 1
    float *S = p.ssm + (int64_t)read_slot * p.slot_stride + head + v;
    for (int k = 0; k < KD; ++k) vstore(S + (int64_t)k * p.V, s[k]);
#else
    store_column(p, read_slot, hv, v, s);
#endif
  }
}

#if GDN_CPU_VEC == 2
// The vk variant: GDN_VK_ILV consecutive rows S[v, :] (K/16 vectors each) at once. Per token
// and row, with d = e^g:  u = beta (v - d S.k),  S' = d S + u k,  o = S'.q = d S.q + u (k.q),
// so one read pass over the row gives both dot products (k.q is shared by every row) and one
// pass updates it. A row's step is a chain of dependent operations (dot products, horizontal
// sums); GDN_VK_ILV independent rows let the core overlap the chains (one row at a time was
// latency-bound: recurrent ~6 -> ~4 ms at spec S=3 B=8 on the 2-core test host).
#ifndef GDN_VK_ILV
#define GDN_VK_ILV 8
#endif
#define KC (KD / 16)
static inline void recurrent_rows_vk(const GdnDeltaParams &p, int32_t seq, int32_t hv, int32_t v0) {
  const int32_t j0 = p.query_start_loc[seq], len = p.query_start_loc[seq + 1] - j0;
  const bool spec = p.mode == 2;
  if (len == 0 || (p.mode == 0 && len != 1)) return;  // mode 0: longer sequences go to the chunk kernels
  const int32_t nr = sycl::min(GDN_VK_ILV, p.V - v0);  // rows of this block (the last may be short)
  const int32_t *cols = spec ? p.state_indices + (int64_t)seq * p.slot_cols : p.state_indices + seq;
  const int32_t read_slot = spec ? cols[p.num_accepted[seq] - 1] : cols[0];
  if (read_slot == p.pad_slot_id) {
    for (int32_t r = 0; r < nr; ++r) zero_outputs(p, j0, len, hv, v0 + r);
    return;
  }
  const int32_t h = hv / (p.HV / p.H);
  const bool init = spec || !p.has_initial_state || p.has_initial_state[seq];
  const int64_t rows0 = (int64_t)hv * KD * p.V + (int64_t)v0 * KD;  // S[v0, 0] within a slot
  vf16 s[GDN_VK_ILV][KC];  // s[r][c] = S[v0 + r, 16c .. 16c+15]
  {
    const float *S = p.ssm + (int64_t)read_slot * p.slot_stride + rows0;
    for (int32_t r = 0; r < GDN_VK_ILV; ++r)
      for (int c = 0; c < KC; ++c) s[r][c] = init && r < nr ? vload(S + r * KD + 16 * c) : vf16(0.0f);
  }
  for (int32_t t = 0; t < len; ++t) {
    // The same token setup as recurrent_part's. Shared through a helper returning a struct it
    // measured 1.5x slower here (the CPU device's compiler), so it is written out twice.
    const int64_t row = global_row(p.token_indx, j0 + t);
    const float *kn = p.kn + (row * p.H + h) * KD, *qn = p.qn + (row * p.H + h) * KD;
    const float decay = sycl::exp(p.g[row * p.HV + hv]), beta = p.beta[row * p.HV + hv];
    const int64_t vrow = row * p.qkv_stride + p.v_offset + (int64_t)hv * p.V + v0;
    const int64_t orow = row * p.out_stride + (int64_t)hv * p.V + v0;
    vf16 k[KC], q[KC], kq(0.0f);
    for (int c = 0; c < KC; ++c) {
      k[c] = vload(kn + 16 * c);
      q[c] = vload(qn + 16 * c);
      kq += k[c] * q[c];
    }
    const float kdotq = hsum(kq);
    float u[GDN_VK_ILV];
    for (int32_t r = 0; r < GDN_VK_ILV; ++r) {
      vf16 ak(0.0f), aq(0.0f);
      for (int c = 0; c < KC; ++c) {
        ak += s[r][c] * k[c];
        aq += s[r][c] * q[c];
      }
      u[r] = r < nr ? beta * (load_act(p.qkv, vrow + r) - decay * hsum(ak)) : 0.0f;
      if (r < nr) store_act(p.out, orow + r, decay * hsum(aq) + u[r] * kdotq);
    }
    for (int32_t r = 0; r < GDN_VK_ILV; ++r)
      for (int c = 0; c < KC; ++c) s[r][c] = s[r][c] * decay + k[c] * u[r];
    if (spec && cols[t] != p.pad_slot_id) {
      float *S = p.ssm + (int64_t)cols[t] * p.slot_stride + rows0;
      for (int32_t r = 0; r < nr; ++r)
        for (int c = 0; c < KC; ++c) vstore_stream(S + r * KD + 16 * c, s[r][c]);
    }
  }
  if (!spec) {
    float *S = p.ssm + (int64_t)read_slot * p.slot_stride + rows0;
    for (int32_t r = 0; r < nr; ++r)
      for (int c = 0; c < KC; ++c) vstore(S + r * KD + 16 * c, s[r][c]);
  }
}
#undef KC
#endif

// Global: (num_seqs*HV, work-items along v), local (1, w). v mapping: GDN_CPU_VEC 0 one column,
// 1 sixteen columns, 2 GDN_VK_ROWS rows (blocks of GDN_VK_ILV rows, run in turn;
// fewer, larger work-items keep the CPU runtime's per-work-group cost small).
#ifndef GDN_VK_ROWS
#define GDN_VK_ROWS 1
#endif
// The body, as a GDN_CPU_WORK_ITEM on the CPU device (variants 1, 2: explicit vectors).
#if GDN_CPU_VEC
GDN_CPU_WORK_ITEM
#else
static inline void
#endif
recurrent_work_item(const GdnDeltaParams &p) {
  const auto it = item2();
  // (sequence, v-head) from the GROUP id (the local range is 1 in dimension 0): uniform across
  // the work-group by construction.
  const int32_t seq = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);
#if GDN_CPU_VEC == 1
  const int32_t v = (int32_t)it.get_global_id(1) * 16;  // first of 16 columns
  if (seq < p.num_seqs && v < p.V) recurrent_part(p, seq, hv, v);
  return {};
#elif GDN_CPU_VEC == 2
  static_assert(GDN_VK_ROWS % GDN_VK_ILV == 0, "a work-item's rows are whole blocks");
  for (int32_t r = 0; r < GDN_VK_ROWS && seq < p.num_seqs; r += GDN_VK_ILV) {
    const int32_t v = (int32_t)it.get_global_id(1) * GDN_VK_ROWS + r;
    if (v < p.V) recurrent_rows_vk(p, seq, hv, v);
  }
  return {};
#else
  const int32_t v = (int32_t)it.get_global_id(1);
  if (seq < p.num_seqs && v < p.V) recurrent_part(p, seq, hv, v);
#endif
}
GDN_KERNEL(2) void gdn_recurrent(GdnDeltaParams p) { recurrent_work_item(p); }

// Workspace addressing: chunk c, row i of v-head hv sits at position (hv*num_chunks + c)*CHUNK + i.
static inline int64_t chunk_pos(const GdnDeltaParams &p, int32_t hv, int32_t c) {
  return ((int64_t)hv * p.num_chunks + c) * CHUNK;
}

#if !GDN_CPU_CHUNK  // the generic chunk_prep (GPUs); the CPU device uses gdn_chunk_prep_cpu
// Global: (num_chunks*HV, CHUNK), local (1, CHUNK).
GDN_KERNEL(2) void gdn_chunk_prep(GdnDeltaParams p) {
  const auto it = item2();
  const auto grp = it.get_group();
  const int32_t c = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);
  const int32_t i = (int32_t)it.get_local_id(1);
  const int32_t *ct = p.chunk_table + (int64_t)c * 4;
  const int32_t jfirst = ct[1], len = ct[2];
  const int32_t h = hv / (p.HV / p.H);
  static syclexp::work_group_static<float[CHUNK][CHUNK]> A_s;   // A, strictly lower
  static syclexp::work_group_static<float[CHUNK][CHUNK]> T_s;   // (I + A)^-1, unit lower
  static syclexp::work_group_static<float[CHUNK]> G_s, B_s;
  static syclexp::work_group_static<int64_t[CHUNK]> row_s;

  const bool valid = i < len;
  const int64_t row = valid ? global_row(p.token_indx, jfirst + i) : 0;
  const float g = valid ? p.g[row * p.HV + hv] : 0.0f, b = valid ? p.beta[row * p.HV + hv] : 0.0f;
  const float G = sycl::inclusive_scan_over_group(grp, g, sycl::plus<float>());
  G_s[i] = G;
  B_s[i] = b;
  row_s[i] = row;
  const int64_t pos = chunk_pos(p, hv, c);
  p.chunk_g[pos + i] = G;
  sycl::group_barrier(grp);

  const float *ki = p.kn + (row * p.H + h) * KD, *qi = p.qn + (row * p.H + h) * KD;
  float *aqk = p.chunk_aqk + (pos + i) * CHUNK;
  for (int32_t j = 0; j < CHUNK; ++j) {
    float a = 0.0f, aq = 0.0f;
    if (valid && j <= i) {
      const float *kj = p.kn + (row_s[j] * p.H + h) * KD;
      float dk = 0.0f, dq = 0.0f;
      for (int k = 0; k < KD; ++k) {
        dk += ki[k] * kj[k];
        dq += qi[k] * kj[k];
      }
      const float decay = sycl::exp(G - G_s[j]);
      if (j < i) a = b * decay * dk;
      aq = decay * dq;
    }
    A_s[i][j] = a;
    aqk[j] = aq;
  }
  sycl::group_barrier(grp);

  // Forward substitution, work-item i owns column i: T[r][i] = -sum_{l=i}^{r-1} A[r][l] T[l][i].
  float tcol[CHUNK];
  for (int32_t r = 0; r < CHUNK; ++r) tcol[r] = r == i ? 1.0f : 0.0f;
  for (int32_t r = i + 1; r < len; ++r) {
    float acc = 0.0f;
    for (int32_t l = i; l < r; ++l) acc += A_s[r][l] * tcol[l];
    tcol[r] = -acc;
  }
  for (int32_t r = 0; r < CHUNK; ++r) T_s[r][i] = tcol[r];
  sycl::group_barrier(grp);

  if (!valid) return;
  float cw[CHUNK], cu[CHUNK];
  for (int32_t j = 0; j <= i; ++j) {
    cu[j] = T_s[i][j] * B_s[j];
    cw[j] = cu[j] * sycl::exp(G_s[j]);
  }
  float *w = p.chunk_w + (pos + i) * KD;
  for (int k = 0; k < KD; ++k) {
    float acc = 0.0f;
    for (int32_t j = 0; j <= i; ++j) acc += cw[j] * p.kn[(row_s[j] * p.H + h) * KD + k];
    w[k] = acc;
  }
  float *u = p.chunk_u + (pos + i) * p.V;
  const int64_t vcol = p.v_offset + (int64_t)hv * p.V;
  for (int32_t vv = 0; vv < p.V; ++vv) {
    float acc = 0.0f;
    for (int32_t j = 0; j <= i; ++j) acc += cu[j] * load_act(p.qkv, row_s[j] * p.qkv_stride + vcol + vv);
    u[vv] = acc;
  }
}

#endif

// gdn_chunk_scan over NL lanes (state columns) per work-item: NL = 1 with float lanes (generic,
// GPUs), NL = 16 with 16-wide vectors (CPU device). One body, so both carry the same algorithm.
template <int NL>
struct Lanes {
  typedef vf16 T;
  static T load(const float *p) { return vload(p); }
  static void store_out(const GdnDeltaParams &p, int64_t at, const T &o) {
    for (int l = 0; l < NL; ++l) store_act(p.out, at + l, o[l]);
  }
  static float &at(T &x, int l) { return x[l]; }
};
template <>
struct Lanes<1> {
  typedef float T;
  static T load(const float *p) { return *p; }
  static void store_out(const GdnDeltaParams &p, int64_t at, const T &o) { store_act(p.out, at, o); }
  static float &at(T &x, int) { return x; }
};

template <int NL>
static inline void chunk_scan_body(const GdnDeltaParams &p, int32_t e, int32_t hv, int32_t v) {
  typedef Lanes<NL> L;
  typedef typename L::T lane_t;
  const int32_t *st = p.seq_table + (int64_t)e * 4;
  const int32_t seq = st[0], c0 = st[1], nc = st[2];
  const int32_t slot = p.state_indices[seq];
  if (slot == p.pad_slot_id) {
    const int32_t j0 = p.query_start_loc[seq], len = p.query_start_loc[seq + 1] - j0;
    for (int32_t l = 0; l < NL; ++l) zero_outputs(p, j0, len, hv, v + l);
    return;
  }
  const int32_t h = hv / (p.HV / p.H);
  const bool init = !p.has_initial_state || p.has_initial_state[seq];
  lane_t s[KD];  // s[k] = S[k, v .. v+NL-1]
  for (int32_t l = 0; l < NL; ++l) {
    const float *S = state_column(p, slot, hv, v + l);
    for (int k = 0; k < KD; ++k) L::at(s[k], l) = init ? S[k * K_STRIDE] : 0.0f;
  }
  // Every product below is blocked so that SCAN_RB (rows) or SCAN_KB (state rows) independent
  // accumulators are in flight: one accumulator per dot product left the CPU device waiting on
  // the FMA latency, and each s[k] / up[j] load now feeds several FMAs.
  lane_t up[CHUNK], qs[CHUNK];
  int64_t qk_off[CHUNK];  // offset of row i's q and k (qn and kn share the layout)
  for (int32_t c = c0; c < c0 + nc; ++c) {
    const int32_t jfirst = p.chunk_table[(int64_t)c * 4 + 1], len = p.chunk_table[(int64_t)c * 4 + 2];
    const int64_t pos = chunk_pos(p, hv, c);
    const float *G = p.chunk_g + pos;
    for (int32_t i = 0; i < len; ++i) qk_off[i] = (global_row(p.token_indx, jfirst + i) * p.H + h) * KD;
    for (int32_t i0 = 0; i0 < len; i0 += SCAN_RB) {  // u = U - W S and q S, SCAN_RB rows at a time
      const float *w[SCAN_RB], *qi[SCAN_RB];
      for (int r = 0; r < SCAN_RB; ++r) {  // rows past len repeat row i0: computed, not stored
        const int32_t i = i0 + r < len ? i0 + r : i0;
        w[r] = p.chunk_w + (pos + i) * KD;
        qi[r] = p.qn + qk_off[i];
      }
      lane_t ws[SCAN_RB], q_s[SCAN_RB];
      for (int r = 0; r < SCAN_RB; ++r) ws[r] = q_s[r] = lane_t(0.0f);
      for (int k = 0; k < KD; ++k) {
        const lane_t sk = s[k];
        for (int r = 0; r < SCAN_RB; ++r) {
          ws[r] += sk * w[r][k];
          q_s[r] += sk * qi[r][k];
        }
      }
      for (int r = 0; r < SCAN_RB && i0 + r < len; ++r) {
        up[i0 + r] = L::load(p.chunk_u + (pos + i0 + r) * p.V + v) - ws[r];
        qs[i0 + r] = q_s[r];
      }
    }
    for (int32_t i0 = 0; i0 < len; i0 += SCAN_RB) {  // o = e^G (q S) + Aqk u (Aqk is 0 above the diagonal)
      const int32_t nr = sycl::min(SCAN_RB, len - i0);
      lane_t o[SCAN_RB];
      const float *aqk[SCAN_RB];
      for (int r = 0; r < SCAN_RB; ++r) {
        const int32_t i = r < nr ? i0 + r : i0;
        o[r] = sycl::exp(G[i]) * qs[i];
        aqk[r] = p.chunk_aqk + (pos + i) * CHUNK;
      }
      for (int32_t j = 0; j < i0 + nr; ++j) {
        const lane_t uj = up[j];
        for (int r = 0; r < SCAN_RB; ++r) o[r] += aqk[r][j] * uj;
      }
      for (int r = 0; r < nr; ++r)
        L::store_out(p, global_row(p.token_indx, jfirst + i0 + r) * p.out_stride + (int64_t)hv * p.V + v, o[r]);
    }
    const float glast = G[len - 1], dlast = sycl::exp(glast);  // S = e^Glast S + K^T (e^(Glast-G) u)
    for (int32_t j = 0; j < len; ++j) up[j] *= sycl::exp(glast - G[j]);
    for (int k0 = 0; k0 < KD; k0 += SCAN_KB) {
      lane_t acc[SCAN_KB];
      for (int kk = 0; kk < SCAN_KB; ++kk) acc[kk] = k0 + kk < KD ? s[k0 + kk] * dlast : lane_t(0.0f);
      for (int32_t j = 0; j < len; ++j) {
        const lane_t uj = up[j];
        const float *kj = p.kn + qk_off[j] + k0;
        for (int kk = 0; kk < SCAN_KB && k0 + kk < KD; ++kk) acc[kk] += uj * kj[kk];
      }
      for (int kk = 0; kk < SCAN_KB && k0 + kk < KD; ++kk) s[k0 + kk] = acc[kk];
    }
  }
  for (int32_t l = 0; l < NL; ++l) {
    float *S = state_column(p, slot, hv, v + l);
    for (int k = 0; k < KD; ++k) S[k * K_STRIDE] = L::at(s[k], l);
  }
}

#if !GDN_CPU_CHUNK
// Global: (num_chunk_seqs*HV, V rounded up), one work-item per state column.
GDN_KERNEL(2) void gdn_chunk_scan(GdnDeltaParams p) {
  const auto it = item2();
  const int32_t e = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);  // uniform
  const int32_t v = (int32_t)it.get_global_id(1);
  if (e < p.num_seqs && v < p.V) chunk_scan_body<1>(p, e, hv, v);
}

#else
// Global: (num_chunk_seqs*HV, V/16), local (1, w): a work-item carries 16 state columns (CPU device).
GDN_KERNEL(2) void gdn_chunk_scan_cpu(GdnDeltaParams p) {
  const auto it = item2();
  const int32_t e = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);
  const int32_t v = (int32_t)it.get_global_id(1) * 16;
  if (e < p.num_seqs && v < p.V) chunk_scan_body<16>(p, e, hv, v);
}
#endif

// ---- CPU-device variants of the chunk kernels (host picks them when K % 16 == 0 and V % 16 == 0).
// Same algorithm and workspace as above; every inner loop runs over 16-wide vectors inside one
// work-item, so nothing depends on the runtime's cross-work-item vectorizer.
#if GDN_CPU_CHUNK  // host sets it only when K % 16 == 0 and V % 16 == 0
#define KV16 (KD / 16)
#define PREP_VB 8  // 16-wide column blocks of U per pass (V = 128 in one)

// Global: num_chunks*H work-items, local 1: one work-item builds one chunk for one k-head and all
// the v-heads that share it (GVA): the q.k and k.k products depend on the k-head only, so they are
// computed once; the gates (and everything after them) are per v-head.
GDN_KERNEL(1) void gdn_chunk_prep_cpu(GdnDeltaParams p) {
  const int64_t gid = item1().get_global_id(0);
  if (gid >= (int64_t)p.num_chunks * p.H) return;
  const int32_t c = (int32_t)(gid / p.H), h = (int32_t)(gid % p.H);
  const int32_t jfirst = p.chunk_table[(int64_t)c * 4 + 1], len = p.chunk_table[(int64_t)c * 4 + 2];
  int64_t rows[CHUNK];
  for (int32_t i = 0; i < len; ++i) rows[i] = global_row(p.token_indx, jfirst + i);
  float KK[CHUNK][CHUNK], QK[CHUNK][CHUNK];  // k_i.k_j (j < i) and q_i.k_j (j <= i)
  for (int32_t i = 0; i < len; ++i) {
    const float *ki = p.kn + (rows[i] * p.H + h) * KD, *qi = p.qn + (rows[i] * p.H + h) * KD;
    vf16 kv[KV16], qv[KV16];
    for (int cc = 0; cc < KV16; ++cc) {
      kv[cc] = vload(ki + 16 * cc);
      qv[cc] = vload(qi + 16 * cc);
    }
    for (int32_t j = 0; j <= i; ++j) {
      const float *kj = p.kn + (rows[j] * p.H + h) * KD;
      vf16 dk(0.0f), dq(0.0f);
      for (int cc = 0; cc < KV16; ++cc) {
        const vf16 x = vload(kj + 16 * cc);
        dk += kv[cc] * x;
        dq += qv[cc] * x;
      }
      KK[i][j] = hsum(dk);
      QK[i][j] = hsum(dq);
    }
  }
  const int32_t ratio = p.HV / p.H;
  const int64_t vcol0 = p.v_offset;
  for (int32_t r = 0; r < ratio; ++r) {
    const int32_t hv = h * ratio + r;
    const int64_t pos = chunk_pos(p, hv, c);
    float G[CHUNK], B[CHUNK], cu[CHUNK];
    float acc = 0.0f;
    for (int32_t i = 0; i < len; ++i) {
      acc += p.g[rows[i] * p.HV + hv];
      G[i] = acc;
      B[i] = p.beta[rows[i] * p.HV + hv];
      p.chunk_g[pos + i] = acc;
    }
    // A = beta_i e^(Gi-Gj) k_i.k_j (strictly lower); Aqk = e^(Gi-Gj) q_i.k_j (lower with diagonal).
    float A[CHUNK][CHUNK];
    for (int32_t i = 0; i < len; ++i) {
      float *aqk = p.chunk_aqk + (pos + i) * CHUNK;
      for (int32_t j = 0; j <= i; ++j) {
        const float decay = sycl::exp(G[i] - G[j]);
        A[i][j] = B[i] * decay * KK[i][j];
        aqk[j] = decay * QK[i][j];
      }
      for (int32_t j = i + 1; j < CHUNK; ++j) aqk[j] = 0.0f;  // chunk_scan reads row blocks past the diagonal
    }
    // T = (I + A)^-1 row by row: T[r] = e_r - sum_{l<r} A[r][l] T[l], rows as 64-wide vectors.
    vf16 T[CHUNK][CHUNK / 16];
    for (int32_t rr = 0; rr < len; ++rr) {
      vf16 t[CHUNK / 16];
      for (int q = 0; q < CHUNK / 16; ++q) t[q] = vf16(0.0f);
      t[rr / 16][rr % 16] = 1.0f;
      for (int32_t l = 0; l < rr; ++l) {
        const float a = A[rr][l];
        for (int q = 0; q < CHUNK / 16; ++q) t[q] -= a * T[l][q];
      }
      for (int q = 0; q < CHUNK / 16; ++q) T[rr][q] = t[q];
    }
    // W = T (beta e^G K), U = T (beta V), row by row; the j loops carry KV16 (W) and up to
    // PREP_VB (U) independent vector accumulators.
    const int64_t vcol = vcol0 + (int64_t)hv * p.V;
    float eG[CHUNK];
    for (int32_t j = 0; j < len; ++j) eG[j] = sycl::exp(G[j]);
    for (int32_t i = 0; i < len; ++i) {
      vf16 w[KV16];
      for (int cc = 0; cc < KV16; ++cc) w[cc] = vf16(0.0f);
      for (int32_t j = 0; j <= i; ++j) {
        cu[j] = T[i][j / 16][j % 16] * B[j];
        const float cw = cu[j] * eG[j];
        const float *kj = p.kn + (rows[j] * p.H + h) * KD;
        for (int cc = 0; cc < KV16; ++cc) w[cc] += cw * vload(kj + 16 * cc);
      }
      float *wout = p.chunk_w + (pos + i) * KD;
      for (int cc = 0; cc < KV16; ++cc) vstore(wout + 16 * cc, w[cc]);
      float *uout = p.chunk_u + (pos + i) * p.V;
      for (int32_t vb0 = 0; vb0 < p.V; vb0 += 16 * PREP_VB) {
        const int32_t nb = sycl::min(PREP_VB, (p.V - vb0) / 16);
        vf16 u[PREP_VB];
        for (int q = 0; q < PREP_VB; ++q) u[q] = vf16(0.0f);
        for (int32_t j = 0; j <= i; ++j) {
          const int64_t at = rows[j] * p.qkv_stride + vcol + vb0;
          for (int q = 0; q < PREP_VB; ++q)
            if (q < nb) u[q] += cu[j] * load_act16(p.qkv, at + 16 * q);
        }
        for (int q = 0; q < nb; ++q) vstore(uout + vb0 + 16 * q, u[q]);
      }
    }
  }
}
#endif  // GDN_CPU_CHUNK
