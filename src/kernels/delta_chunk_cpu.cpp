// delta_chunk_cpu.cpp — the CPU device's chunk kernels (the host picks them when K % 16 == 0 and
// V % 16 == 0). Same algorithm and workspace as the generic ones (delta_chunk.hpp); every inner loop
// runs over 16-wide vectors inside one work-item, so nothing depends on the runtime's
// cross-work-item vectorizer (work-groups of one work-item, coordinates from GROUP ids only:
// vec16.hpp, "CPU-device kernels").
#include "delta_chunk.hpp"

#define KV16 (kHeadK / 16)
#define PREP_VB 8  // 16-wide column blocks of U per pass (V = 128 in one)
#define PREP_SUB_ROWS 16  // per-channel decays: rows per sub-chunk of the A and Aqk products
static_assert(GDN_CHUNK_SIZE % PREP_SUB_ROWS == 0 && PREP_SUB_ROWS % 4 == 0, "whole sub-chunks of whole sums8 groups");
// The chunk scan's register blocking here: SCAN_CPU_CB 16-column blocks x SCAN_CPU_RB rows x 2
// products = 24 accumulators for W S and q S (each loaded state vector feeds 6 FMAs, each
// broadcast of W or q 4), SCAN_CPU_CB x SCAN_CPU_KB for the state update. The generic blocking
// with 2 column blocks (4 rows, 8 state rows) made the scan ~5% longer; 2 or 4 rows, 2 or 3
// state rows measured no better.
#define SCAN_CPU_CB 4
#define SCAN_CPU_RB 3
#define SCAN_CPU_KB 4

// The lane sums of a[0..7]: lane 2m (and 2m+1) of the result holds the sum of a[m]'s lanes. Three
// rounds of pairwise folding (each adds two vectors' halves into one) and one swap of neighbours:
// ~20 shuffles and adds for 8 sums, against 8 horizontal sums of ~7 operations each.
static inline vf16 sums8(const vf16 *a) {
  native_vf16 w[4], x[2];
  for (int r = 0; r < 4; ++r) {  // w[r]: lanes 0-7 partials of a[r], 8-15 of a[r+4]
    const native_vf16 lo = sycl::bit_cast<native_vf16>(a[r]), hi = sycl::bit_cast<native_vf16>(a[r + 4]);
    w[r] = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(lo, hi, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int r = 0; r < 2; ++r)  // x[r]: 4 lanes each of a[r], a[r+2], a[r+4], a[r+6]
    x[r] = __builtin_shufflevector(w[r], w[r + 2], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
           __builtin_shufflevector(w[r], w[r + 2], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  const native_vf16 y =  // lanes 2m, 2m+1: a[m]
      __builtin_shufflevector(x[0], x[1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
      __builtin_shufflevector(x[0], x[1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  return sycl::bit_cast<vf16>(y + __builtin_shufflevector(y, y, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
}

// X = (I + A)^-1 R for a chunk's strictly lower-triangular A, by forward substitution, row by row:
// X_i = R_i - sum_{l<i} A[i][l] X_l, NV vectors a row (NV independent accumulators). rhs(i, x)
// gives R_i; each row is kept in xb for the rows below it and handed to out(i, x). The chunk prep's
// W and U this way cost the FMAs of multiplying by T = (I + A)^-1, without forming T (64 x 64 per
// chunk and v-head, which took about as long as W or U, and the kernel ~15% longer). Two rows
// per pass (each row read back feeding both) or 4 of the 8 column vectors per pass (an L1-sized
// xb) measured no better.
template <int NV, class Rhs, class Out>
static inline void substitute_rows(const float (*A)[GDN_CHUNK_SIZE], int32_t len, vf16 (*xb)[NV], Rhs rhs, Out out) {
  for (int32_t i = 0; i < len; ++i) {
    vf16 x[NV];
    rhs(i, x);
    for (int32_t l = 0; l < i; ++l) {
      const float a = A[i][l];
      for (int c = 0; c < NV; ++c) x[c] -= a * xb[l][c];
    }
    for (int c = 0; c < NV; ++c) xb[i][c] = x[c];
    out(i, x);
  }
}

// Global: chunk_capacity*H work-items, local 1: one work-item builds one chunk for one k-head and all
// the v-heads that share it (GVA): the q.k and k.k products depend on the k-head only, so they are
// computed once; the gates (and everything after them) are per v-head.
GDN_KERNEL(1) void gdn_chunk_prep_cpu(GdnDeltaParams p) {
  const int64_t gid = item1().get_group(0);
  if (gid >= (int64_t)p.chunk_capacity * p.H) return;
  const int32_t c = (int32_t)(gid / p.H), h = (int32_t)(gid % p.H);
  const int32_t jfirst = p.chunk_table[(int64_t)c * GDN_TABLE_INTS + 1], len = p.chunk_table[(int64_t)c * GDN_TABLE_INTS + 2];
  if (len == 0) return;  // an unused row of the table
  int64_t rows[GDN_CHUNK_SIZE];
  for (int32_t i = 0; i < len; ++i) rows[i] = global_row(p.token_indx, jfirst + i);
  // The chunk's k rows, contiguous. In kn a head's rows lie H*K floats apart (8 KiB at H = 16, K =
  // 128): the same few L1 sets for every row, so a loop that walks all rows for each row (the
  // products below; the W loop did when it multiplied by T) missed L1 on its k loads.
  vf16 kc[GDN_CHUNK_SIZE][KV16];
  for (int32_t i = 0; i < len; ++i)
    for (int cc = 0; cc < KV16; ++cc) kc[i][cc] = vload(p.kn + (rows[i] * p.H + h) * kHeadK + 16 * cc);
  // k_i.k_j and q_i.k_j (j <= i), 4 j at a time: 8 vector accumulators, reduced together by
  // sums8 (above) instead of a horizontal sum per product (which made this kernel ~8% longer;
  // 8 j at a time, 16 accumulators, spilled and ran slower). A block may reach past the
  // diagonal, and past len, where the kc rows are zeros; those entries are never read.
  for (int32_t i = len; i < (len + 3) / 4 * 4; ++i)
    for (int cc = 0; cc < KV16; ++cc) kc[i][cc] = vf16(0.0f);
#if !GDN_CHANNEL_GATE  // (per channel the decays enter the products: per v-head, below)
  float KK[GDN_CHUNK_SIZE][GDN_CHUNK_SIZE], QK[GDN_CHUNK_SIZE][GDN_CHUNK_SIZE];
  for (int32_t i = 0; i < len; ++i) {
    const float *qi = p.qn + (rows[i] * p.H + h) * kHeadK;
    vf16 qv[KV16];
    for (int cc = 0; cc < KV16; ++cc) qv[cc] = vload(qi + 16 * cc);
    for (int32_t j0 = 0; j0 <= i; j0 += 4) {
      vf16 a[8];
      for (int l = 0; l < 8; ++l) a[l] = vf16(0.0f);
      for (int cc = 0; cc < KV16; ++cc)
        for (int l = 0; l < 4; ++l) {
          const vf16 x = kc[j0 + l][cc];
          a[l] += kc[i][cc] * x;
          a[4 + l] += qv[cc] * x;
        }
      const vf16 r = sums8(a);
      for (int l = 0; l < 4; ++l) KK[i][j0 + l] = r[2 * l], QK[i][j0 + l] = r[8 + 2 * l];
    }
  }
#endif
  const int32_t ratio = p.HV / p.H;
  const int64_t vcol0 = p.v_offset;
  // W, U and Aqk go out by streaming stores (vstore_nt; each row is 64-byte aligned: the arrays are,
  // GDN_SCRATCH_ALIGN, and K, V, GDN_CHUNK_SIZE are multiples of 16 floats). Nothing reads them in
  // this kernel, and the chunk scan after it finds them in memory either way (from ~1000 tokens on
  // they outgrow the last-level cache), so plain stores only made every written line be read
  // first: the chunk prep ~10% longer with them, the chunk scan after it unchanged.
  for (int32_t r = 0; r < ratio; ++r) {
    const int32_t hv = h * ratio + r;
    const int64_t pos = chunk_pos(p, hv, c);
#if GDN_CHANNEL_GATE
    // A decay per key channel (delta_chunk.hpp): alpha = e^g of every row, dstart and dend by
    // running products over the rows.
    float B[GDN_CHUNK_SIZE];
    vf16 al[GDN_CHUNK_SIZE][KV16];
    float *const dstart = p.chunk_dstart + pos * kGateK, *const dend = p.chunk_dend + pos * kGateK;
    {
      vf16 d[KV16];
      for (int cc = 0; cc < KV16; ++cc) d[cc] = vf16(1.0f);
      for (int32_t i = 0; i < len; ++i) {
        const float *gi = p.g + (rows[i] * p.HV + hv) * kGateK;
        B[i] = p.beta[rows[i] * p.HV + hv];
        for (int cc = 0; cc < KV16; ++cc) {
          al[i][cc] = exp16_ieee(vload(gi + 16 * cc));  // (sycl::exp of a vector: a call per lane)
          d[cc] *= al[i][cc];
          vstore(dstart + i * kGateK + 16 * cc, d[cc]);
        }
      }
      for (int cc = 0; cc < KV16; ++cc) d[cc] = vf16(1.0f);
      for (int32_t i = len - 1; i >= 0; --i)
        for (int cc = 0; cc < KV16; ++cc) {
          vstore(dend + i * kGateK + 16 * cc, d[cc]);
          d[cc] *= al[i][cc];
        }
    }
    // Row i of A = beta_i (k_i (.) D).k_j (j < i) and of Aqk = (q_i (.) D).k_j (j <= i), with
    // D = prod_{s=j+1..i} alpha_s, by FLA's secondary sub-chunking (delta_chunk.hpp): rows in blocks
    // of PREP_SUB_ROWS from r0 on; columns j < r0 as plain dot products of k_i (.) F and q_i (.) F,
    // F = prod_{s=r0+1..i} alpha_s, with kb_j = k_j (.) prod_{s=j+1..r0} alpha_s; columns r0..i
    // by the walk from i down, kd = k_i (.) D and qd = q_i (.) D taking one more factor per step.
    // 4 j per sums8 reduction; Aqk's rows whole, zeros past the diagonal. The walk over all j
    // made the kernel ~15% longer at 2048 tokens.
    float A[GDN_CHUNK_SIZE][GDN_CHUNK_SIZE];
    vf16 kb[GDN_CHUNK_SIZE][KV16];
    for (int32_t r0 = 0; r0 < len; r0 += PREP_SUB_ROWS) {
      {
        vf16 pb[KV16];
        for (int cc = 0; cc < KV16; ++cc) pb[cc] = al[r0][cc];
        for (int32_t j = r0 - 1; j >= 0; --j)
          for (int cc = 0; cc < KV16; ++cc) {
            kb[j][cc] = kc[j][cc] * pb[cc];
            pb[cc] *= al[j][cc];
          }
      }
      vf16 f[KV16];
      for (int cc = 0; cc < KV16; ++cc) f[cc] = vf16(1.0f);
      for (int32_t i = r0; i < sycl::min(r0 + PREP_SUB_ROWS, len); ++i) {
        const float *qi = p.qn + (rows[i] * p.H + h) * kHeadK;
        float aq[GDN_CHUNK_SIZE];
        for (int32_t jb = 0; jb < GDN_CHUNK_SIZE; jb += 16) vstore(aq + jb, vf16(0.0f));
        if (i > r0)
          for (int cc = 0; cc < KV16; ++cc) f[cc] *= al[i][cc];
        if (r0 > 0) {
          vf16 kf[KV16], qf[KV16];
          for (int cc = 0; cc < KV16; ++cc) kf[cc] = kc[i][cc] * f[cc], qf[cc] = vload(qi + 16 * cc) * f[cc];
          for (int32_t j0 = 0; j0 < r0; j0 += 4) {  // (r0 is a multiple of 4)
            vf16 a[8];
            for (int l = 0; l < 8; ++l) a[l] = vf16(0.0f);
            for (int cc = 0; cc < KV16; ++cc)
              for (int l = 0; l < 4; ++l) {
                const vf16 x = kb[j0 + l][cc];
                a[l] += kf[cc] * x;
                a[4 + l] += qf[cc] * x;
              }
            const vf16 r = sums8(a);
            for (int l = 0; l < 4; ++l) A[i][j0 + l] = B[i] * r[2 * l], aq[j0 + l] = r[8 + 2 * l];
          }
        }
        vf16 kd[KV16], qd[KV16];
        for (int cc = 0; cc < KV16; ++cc) kd[cc] = kc[i][cc], qd[cc] = vload(qi + 16 * cc);
        for (int32_t j0 = i; j0 >= r0; j0 -= 4) {
          vf16 a[8];
          for (int l = 0; l < 8; ++l) a[l] = vf16(0.0f);
          for (int l = 0; l < 4 && j0 - l >= r0; ++l) {
            const int32_t j = j0 - l;
            for (int cc = 0; cc < KV16; ++cc) {
              const vf16 x = kc[j][cc];
              a[l] += kd[cc] * x;
              a[4 + l] += qd[cc] * x;
              kd[cc] *= al[j][cc];
              qd[cc] *= al[j][cc];
            }
          }
          const vf16 r = sums8(a);
          for (int l = 0; l < 4 && j0 - l >= r0; ++l) {
            A[i][j0 - l] = j0 - l < i ? B[i] * r[2 * l] : 0.0f;
            aq[j0 - l] = r[8 + 2 * l];
          }
        }
        float *aqk = p.chunk_aqk + (pos + i) * GDN_CHUNK_SIZE;
        for (int32_t jb = 0; jb < GDN_CHUNK_SIZE; jb += 16) vstore_nt(aqk + jb, vload(aq + jb));
      }
    }
#else
    // P, R and d of delta_chunk.hpp ("Decays and resets"): cumulative g without the resets, the
    // last reset at or before each row, the decay from the chunk's initial state.
    float P[GDN_CHUNK_SIZE], B[GDN_CHUNK_SIZE], D[GDN_CHUNK_SIZE];
    int32_t R[GDN_CHUNK_SIZE];
    float acc = 0.0f;
    int32_t last_reset = -1;
    for (int32_t i = 0; i < len; ++i) {
      const float g = p.g[rows[i] * p.HV + hv];
      if (is_reset(g)) last_reset = i;
      else acc += g;
      P[i] = acc;
      R[i] = last_reset;
      B[i] = p.beta[rows[i] * p.HV + hv];
      D[i] = decay_from_start(acc, last_reset);
      p.chunk_dstart[pos + i] = D[i];
    }
    for (int32_t i = 0; i < len; ++i) p.chunk_dend[pos + i] = decay_between(P[len - 1], R[len - 1], P[i], i);
    // A = beta_i D[i][j] k_i.k_j (strictly lower); Aqk = D[i][j] q_i.k_j (lower with diagonal);
    // D[i][j] = 0 for j < R_i (a reset in between). 16 j at a time, whole rows stored (zeros
    // outside [R_i, i]: chunk_scan reads Aqk's row blocks past the diagonal): a loop over
    // [R_i, i] alone ran its remainder one entry at a time, each a 16-wide exp call.
    for (int32_t i = len; i < GDN_CHUNK_SIZE; ++i) P[i] = 0.0f;
    const sycl::vec<int32_t, 16> lane(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    float A[GDN_CHUNK_SIZE][GDN_CHUNK_SIZE];
    for (int32_t i = 0; i < len; ++i) {
      float *aqk = p.chunk_aqk + (pos + i) * GDN_CHUNK_SIZE;
      const int32_t j0 = sycl::max(R[i], 0);
      for (int32_t jb = 0; jb < GDN_CHUNK_SIZE; jb += 16) {
        vf16 a(0.0f), q(0.0f);
        if (jb <= i && jb + 16 > j0) {
          const vf16 decay = sycl::exp(P[i] - vload(P + jb));
          const sycl::vec<int32_t, 16> j = lane + jb;
          const vu32 keep = sycl::bit_cast<vu32>((j >= j0) & (j <= i));  // all ones in [j0, i]
          a = sycl::bit_cast<vf16>(sycl::bit_cast<vu32>(B[i] * decay * vload(&KK[i][jb])) & keep);
          q = sycl::bit_cast<vf16>(sycl::bit_cast<vu32>(decay * vload(&QK[i][jb])) & keep);
        }
        vstore(&A[i][jb], a);
        vstore_nt(aqk + jb, q);
      }
    }
#endif
    // W = T (beta d K) and U = T (beta V), T = (I + A)^-1, without forming T (substitute_rows).
    vf16 wb[GDN_CHUNK_SIZE][KV16];
    float *const wout = p.chunk_w + pos * kHeadK;
    substitute_rows<KV16>(A, len, wb, [&](int32_t i, vf16 *x) {
#if GDN_CHANNEL_GATE
      for (int cc = 0; cc < KV16; ++cc) x[cc] = B[i] * (kc[i][cc] * vload(dstart + i * kGateK + 16 * cc));
#else
      const float bd = B[i] * D[i];
      for (int cc = 0; cc < KV16; ++cc) x[cc] = bd * kc[i][cc];
#endif
    }, [&](int32_t i, const vf16 *x) {
      for (int cc = 0; cc < KV16; ++cc) vstore_nt(wout + i * kHeadK + 16 * cc, x[cc]);
    });
    // U per pass of PREP_VB column blocks (V = 128 in one), zeros past V.
    const int64_t vcol = vcol0 + (int64_t)hv * p.V;
    float *const uout = p.chunk_u + pos * p.V;
    for (int32_t vb0 = 0; vb0 < p.V; vb0 += 16 * PREP_VB) {
      const int32_t nb = sycl::min(PREP_VB, (p.V - vb0) / 16);
      vf16 ub[GDN_CHUNK_SIZE][PREP_VB];
      substitute_rows<PREP_VB>(A, len, ub, [&](int32_t i, vf16 *x) {
        for (int q = 0; q < PREP_VB; ++q)
          x[q] = q < nb ? B[i] * load_act16(p.qkv, rows[i] * p.qkv_stride + vcol + vb0 + 16 * q) : vf16(0.0f);
      }, [&](int32_t i, const vf16 *x) {
        for (int q = 0; q < nb; ++q) vstore_nt(uout + i * p.V + vb0 + 16 * q, x[q]);
      });
    }
  }
}

// Global: (seq_capacity*HV, V/16 / GDN_SCAN_BLOCKS rounded up), local (1, 1): a work-item carries
// GDN_SCAN_BLOCKS blocks of 16 state columns (all of a v-head's at V = 128, 64 KiB of f32 state)
// and walks them inside the chunk loop (delta_chunk.hpp, chunk_scan_body).
GDN_KERNEL(2) void gdn_chunk_scan_cpu(GdnDeltaParams p) {
  const auto it = item2();
  const int32_t e = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);
  const int32_t v0 = (int32_t)it.get_group(1) * 16 * GDN_SCAN_BLOCKS;
  if (e < p.seq_capacity && v0 < p.V) chunk_scan_body<16, GDN_SCAN_BLOCKS, SCAN_CPU_CB, SCAN_CPU_RB, SCAN_CPU_KB>(p, e, hv, v0);
}
