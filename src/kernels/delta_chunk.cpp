// delta_chunk.cpp — the generic chunk kernels (Intel GPUs; the CPU device runs delta_chunk_cpu.cpp
// when K and V are multiples of 16, unless GDN_XPU_GENERIC_KERNELS=1). Algorithm: delta_chunk.hpp.
#include "delta_chunk.hpp"
#include <sycl/ext/oneapi/work_group_static.hpp>
#include <sycl/group_algorithm.hpp>
#include <sycl/group_barrier.hpp>

// Global: (chunk_capacity*HV, GDN_CHUNK_SIZE), local (1, GDN_CHUNK_SIZE): one work-group per (chunk, v-head),
// the chunk's matrices in work-group local memory.
GDN_KERNEL(2) void gdn_chunk_prep(GdnDeltaParams p) {
  const auto it = item2();
  const auto grp = it.get_group();
  const int32_t c = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);
  const int32_t i = (int32_t)it.get_local_id(1);
  const int32_t *ct = p.chunk_table + (int64_t)c * GDN_TABLE_INTS;
  const int32_t jfirst = ct[1], len = ct[2];
  if (len == 0) return;  // an unused row of the table (the whole work-group leaves)
  const int32_t h = hv / (p.HV / p.H);
  static syclexp::work_group_static<float[GDN_CHUNK_SIZE][GDN_CHUNK_SIZE]> A_s;   // A, strictly lower
  static syclexp::work_group_static<float[GDN_CHUNK_SIZE][GDN_CHUNK_SIZE]> T_s;   // (I + A)^-1, unit lower
  static syclexp::work_group_static<float[GDN_CHUNK_SIZE]> P_s, B_s, D_s;  // P, beta, d (delta_chunk.hpp)
  static syclexp::work_group_static<int32_t[GDN_CHUNK_SIZE]> R_s;
  static syclexp::work_group_static<int64_t[GDN_CHUNK_SIZE]> row_s;

  const bool valid = i < len;
  const int64_t row = valid ? global_row(p.token_indx, jfirst + i) : 0;
  const float g = valid ? p.g[row * p.HV + hv] : 0.0f, b = valid ? p.beta[row * p.HV + hv] : 0.0f;
  const bool reset = valid && is_reset(g);
  const float P = sycl::inclusive_scan_over_group(grp, reset ? 0.0f : g, sycl::plus<float>());
  const int32_t R = sycl::inclusive_scan_over_group(grp, reset ? i : -1, sycl::maximum<int32_t>());
  const float d = decay_from_start(P, R);
  P_s[i] = P;
  R_s[i] = R;
  B_s[i] = b;
  D_s[i] = d;
  row_s[i] = row;
  const int64_t pos = chunk_pos(p, hv, c);
  sycl::group_barrier(grp);
  p.chunk_dstart[pos + i] = d;
  p.chunk_dend[pos + i] = valid ? decay_between(P_s[len - 1], R_s[len - 1], P, i) : 0.0f;

  const float *ki = p.kn + (row * p.H + h) * KD, *qi = p.qn + (row * p.H + h) * KD;
  float *aqk = p.chunk_aqk + (pos + i) * GDN_CHUNK_SIZE;
  for (int32_t j = 0; j < GDN_CHUNK_SIZE; ++j) {
    float a = 0.0f, aq = 0.0f;
    if (valid && j <= i) {
      const float *kj = p.kn + (row_s[j] * p.H + h) * KD;
      float dk = 0.0f, dq = 0.0f;
      for (int k = 0; k < KD; ++k) {
        dk += ki[k] * kj[k];
        dq += qi[k] * kj[k];
      }
      const float decay = decay_between(P, R, P_s[j], j);
      if (j < i) a = b * decay * dk;
      aq = decay * dq;
    }
    A_s[i][j] = a;
    aqk[j] = aq;
  }
  sycl::group_barrier(grp);

  // Forward substitution, work-item i owns column i: T[r][i] = -sum_{l=i}^{r-1} A[r][l] T[l][i].
  float tcol[GDN_CHUNK_SIZE];
  for (int32_t r = 0; r < GDN_CHUNK_SIZE; ++r) tcol[r] = r == i ? 1.0f : 0.0f;
  for (int32_t r = i + 1; r < len; ++r) {
    float acc = 0.0f;
    for (int32_t l = i; l < r; ++l) acc += A_s[r][l] * tcol[l];
    tcol[r] = -acc;
  }
  for (int32_t r = 0; r < GDN_CHUNK_SIZE; ++r) T_s[r][i] = tcol[r];
  sycl::group_barrier(grp);

  if (!valid) return;
  float cw[GDN_CHUNK_SIZE], cu[GDN_CHUNK_SIZE];
  for (int32_t j = 0; j <= i; ++j) {
    cu[j] = T_s[i][j] * B_s[j];
    cw[j] = cu[j] * D_s[j];
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

// Global: (seq_capacity*HV, V rounded up), one work-item per state column.
GDN_KERNEL(2) void gdn_chunk_scan(GdnDeltaParams p) {
  const auto it = item2();
  const int32_t e = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);  // uniform
  const int32_t v = (int32_t)it.get_global_id(1);
  if (e < p.seq_capacity && v < p.V) chunk_scan_body<1, 1, 1, SCAN_RB, SCAN_KB>(p, e, hv, v);
}
