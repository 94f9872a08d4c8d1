// delta_prep.hpp — the per-row preprocessing of the gated delta rule: what the generic gdn_prep
// (delta_prep.cpp), the CPU device's gdn_prep_cpu (delta_prep_cpu.cpp) and its recurrent kernels
// (delta_recurrent_cpu.cpp, when a call launches no prep) share.
#pragma once
#include "delta.hpp"

// The log-decay g = -exp(A_log) * softplus(x), x = a + dt_bias, as the value of that product
// however large or small its factors (docs/op.md, non-finite gates). Where both factors are normal
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

// The lower-bound form of the log-decay (gdn_xpu.h, gdn_gate_mode_t): lb * sigmoid(exp(A_log) * x),
// in [lb, 0] whatever the inputs (exp(A_log) * x = +-inf saturates the sigmoid); x = 0 gives lb / 2
// even against an infinite exp(A_log). NaN in gives NaN out.
static inline float bounded_log_decay(float lb, float A_log, float x) {
  return lb * sigmoid(x == 0.0f ? 0.0f : sycl::exp(A_log) * x);
}

// The factor a row's q (times scale) or k is multiplied by, from its sum of squares.
static inline float l2_factor(const GdnPrepParams &p, float sum_sq) {
  if (!p.l2norm) return 1.0f;
  return p.l2_div ? 1.0f / (sycl::sqrt(sum_sq) + p.eps) : sycl::rsqrt(sum_sq + p.eps);
}

// Gate element e of a row (v-head e / gate_k, key channel e % gate_k): its log-decay g. Packed,
// a is the a part of ba's groups (GDN_GATE_HEAD only; unpacked the column mapping is the identity).
static inline float gate_g(const GdnPrepParams &p, int64_t row, int32_t e) {
  if (p.g_in) return p.g_in[row * p.HV * p.gate_k + e];
  const int32_t hv = e / p.gate_k;
  const float x = load_act(p.a, row * p.ab_stride + gdn_group_col(e, p.ab_per_group, p.ab_group_cols)) + p.dt_bias[e];
  return p.lower_bound != 0.0f ? bounded_log_decay(p.lower_bound, p.A_log[hv], x) : log_decay(p.A_log[hv], x);
}
// beta of v-head hv of a row.
static inline float gate_beta(const GdnPrepParams &p, int64_t row, int32_t hv) {
  if (p.beta_in) return p.beta_in[row * p.HV + hv];
  return sigmoid(load_act(p.b, row * p.b_stride + gdn_group_col(hv, p.ab_per_group, p.ab_group_cols)));
}

// Gate elements e0 .. e0+15 of a row as one vector, for the CPU kernels: 16 of one v-head's gates
// (gate_k % 16 == 0: KDA's K per v-head and row, unpacked a). Lane by lane, gate_g called K times a
// row took the CPU prep ~100x GDN's time at Kimi Linear's shapes, and sycl::exp / log1p of a
// vector still ~10x (library calls per lane). Here the formulas run on vectors (exp16, softplus16:
// relative errors ~1e-7) where every lane is in their range -- exp(A_log) normal, x = a + dt_bias
// finite and >= -80 (the softplus form; its result then normal: gate_g's product) or not NaN (the
// lower-bound form) -- and a vector with any other lane (non-finite or extreme gates, docs/op.md)
// takes gate_g lane by lane.
static inline vf16 gate_g16(const GdnPrepParams &p, int64_t row, int32_t e0) {
  if (p.g_in) return vload(p.g_in + row * p.HV * p.gate_k + e0);
  const float lo = 1.17549435e-38f, hi = 3.40282347e38f;  // FLT_MIN, FLT_MAX (log_decay)
  const float e = sycl::exp(p.A_log[e0 / p.gate_k]);
  if (e >= lo && e <= hi) {
    const vf16 x = load_act16(p.a, row * p.ab_stride + e0) + vload(p.dt_bias + e0);
    typedef int32_t lanes_t __attribute__((ext_vector_type(16)));  // (a compare's all-ones / zero lanes)
    const native_vf16 xn = sycl::bit_cast<native_vf16>(x);
    const lanes_t in = p.lower_bound != 0.0f ? (lanes_t)(xn == xn) : (lanes_t)((xn >= -80.0f) & (xn <= hi));
    if (__builtin_reduce_and(in))
      return p.lower_bound != 0.0f ? p.lower_bound / (1.0f + exp16(-(e * x)))  // (e * 0 = 0)
                                   : -e * softplus16(x);
  }
  vf16 g;
  for (int l = 0; l < 16; ++l) g[l] = gate_g(p, row, e0 + l);
  return g;
}

// The gates g (gate_k elements each) and beta of v-heads hv0 .. hv0+n-1 of a row, stored (the CPU
// kernels: K % 16 == 0).
static inline void prep_gates(const GdnPrepParams &p, int64_t row, int32_t hv0, int32_t n) {
  for (int32_t hv = hv0; hv < hv0 + n; ++hv) {
    float *g = p.g + row * p.HV * p.gate_k;
    if (p.gate_k % 16 == 0)
      for (int32_t e = hv * p.gate_k; e < (hv + 1) * p.gate_k; e += 16) vstore(g + e, gate_g16(p, row, e));
    else
      for (int32_t e = hv * p.gate_k; e < (hv + 1) * p.gate_k; ++e) g[e] = gate_g(p, row, e);
    p.beta[row * p.HV + hv] = gate_beta(p, row, hv);
  }
}

// q (times scale) and k of (row, k-head h), l2-normalized, as kHeadK/16 vectors each (kHeadK % 16 == 0):
// what gdn_prep_cpu stores, and what the recurrent CPU kernels compute themselves when no
// gdn_prep ran (GdnDeltaParams.prep_inline): the same arithmetic either way.
static inline void prep_qk16(const GdnPrepParams &p, int64_t row, int32_t h, vf16 *q, vf16 *k) {
  const int64_t qbase = row * p.qkv_stride + (int64_t)h * kHeadK, kbase = qbase + (int64_t)p.H * kHeadK;
  vf16 sq(0.0f), sk(0.0f);
  for (int c = 0; c < kHeadK / 16; ++c) {
    q[c] = load_act16(p.qkv, qbase + 16 * c);
    k[c] = load_act16(p.qkv, kbase + 16 * c);
    sq += q[c] * q[c];
    sk += k[c] * k[c];
  }
  const float rq = l2_factor(p, hsum(sq)) * p.scale, rk = l2_factor(p, hsum(sk));
  for (int c = 0; c < kHeadK / 16; ++c) {
    q[c] *= rq;
    k[c] *= rk;
  }
}
