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

// The gates g (gate_k elements each) and beta of v-heads hv0 .. hv0+n-1 of a row, stored.
static inline void prep_gates(const GdnPrepParams &p, int64_t row, int32_t hv0, int32_t n) {
  for (int32_t hv = hv0; hv < hv0 + n; ++hv) {
    for (int32_t e = hv * p.gate_k; e < (hv + 1) * p.gate_k; ++e) p.g[row * p.HV * p.gate_k + e] = gate_g(p, row, e);
    p.beta[row * p.HV + hv] = gate_beta(p, row, hv);
  }
}

// q (times scale) and k of (row, k-head h), l2-normalized, as KD/16 vectors each (KD % 16 == 0):
// what gdn_prep_cpu stores, and what the recurrent CPU kernels compute themselves when no
// gdn_prep ran (GdnDeltaParams.prep_inline): the same arithmetic either way.
static inline void prep_qk16(const GdnPrepParams &p, int64_t row, int32_t h, vf16 *q, vf16 *k) {
  const int64_t qbase = row * p.qkv_stride + (int64_t)h * KD, kbase = qbase + (int64_t)p.H * KD;
  vf16 sq(0.0f), sk(0.0f);
  for (int c = 0; c < KD / 16; ++c) {
    q[c] = load_act16(p.qkv, qbase + 16 * c);
    k[c] = load_act16(p.qkv, kbase + 16 * c);
    sq += q[c] * q[c];
    sk += k[c] * k[c];
  }
  const float rq = l2_factor(p, hsum(sq)) * p.scale, rk = l2_factor(p, hsum(sk));
  for (int c = 0; c < KD / 16; ++c) {
    q[c] *= rq;
    k[c] *= rk;
  }
}
