// activations.hpp — e^x, ln x and the activations (SiLU, sigmoid, softplus) on one value and on 16
// lanes (device code, compiled at run time).
#pragma once
#include <sycl/builtins.hpp>
#include "vec16.hpp"

// e^x on 16 lanes with vector operations only (sycl::exp of a vf16 is a library call the CPU
// device's compiler may run lane by lane; the prefill's conv, 16 channels per vector, timed up
// to ~10% faster with this, near the noise). x = n ln2 + r, |r| <= ln2/2
// (Cody-Waite split of ln2), e^r by its degree-6 Taylor polynomial (relative error < 2e-7),
// 2^n by the exponent bits. Inputs are clamped to [-87, 88], where f32 e^x is normal, each bound
// by a select on a compare (one vmaxps / vminps; sycl::fmax/fmin and sycl::max/min took four
// more instructions each for NaN rules): a NaN input gives e^-87 -- silu, its one user, divides
// that NaN input by it, NaN either way.
static inline vf16 exp16(vf16 x) {
  native_vf16 c = sycl::bit_cast<native_vf16>(x);
  c = c > -87.0f ? c : -87.0f;
  c = c < 88.0f ? c : 88.0f;
  x = sycl::bit_cast<vf16>(c);
  const vf16 n = sycl::floor(x * 1.44269504f + 0.5f);
  const vf16 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  vf16 e = r * (1.0f / 720.0f) + 1.0f / 120.0f;
  e = e * r + 1.0f / 24.0f;
  e = e * r + 1.0f / 6.0f;
  e = e * r + 0.5f;
  e = e * r + 1.0f;
  e = e * r + 1.0f;
  // n is integral already: truncation (one instruction), not the default round-to-nearest
  // conversion, which the CPU device's compiler made a library call.
  const sycl::vec<int32_t, 16> bits = (convert16<sycl::vec<int32_t, 16>, native_vf16, native_vi16>(n) + 127) << 23;
  return e * sycl::bit_cast<vf16>(bits);
}
// e^x on 16 lanes as exp16, with IEEE results outside its clamp: 0 below -87.33 (where f32 e^x is
// no longer normal), +inf above 88.72, NaN for NaN (a decay e^g: 0 is a reset, NaN stays NaN).
static inline vf16 exp16_ieee(vf16 x) {
  const native_vf16 xn = sycl::bit_cast<native_vf16>(x);
  native_vf16 r = sycl::bit_cast<native_vf16>(exp16(x));
  r = xn < -87.33f ? 0.0f : r;
  r = xn > 88.72f ? __builtin_inff() : r;
  return sycl::bit_cast<vf16>(xn == xn ? r : xn);
}
// ln x on 16 lanes, vector operations only, for normal positive x (others give no meaningful
// value): x = m 2^k with m in [sqrt(1/2), sqrt(2)) from the exponent bits, ln m = 2 atanh(s),
// s = (m-1)/(m+1), |s| <= 0.172, by its odd series to s^9 (truncation < 1e-9).
static inline vf16 log16(vf16 x) {
  typedef sycl::vec<int32_t, 16> vi16;
  const vi16 bits = sycl::bit_cast<vi16>(x);
  const vi16 k = (bits - 0x3f3504f3) >> 23;  // (0x3f3504f3: sqrt(1/2); an arithmetic shift)
  const vf16 m = sycl::bit_cast<vf16>(bits - (k << 23));
  const vf16 s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
  vf16 p = s2 * (1.0f / 9.0f) + 1.0f / 7.0f;
  p = p * s2 + 1.0f / 5.0f;
  p = p * s2 + 1.0f / 3.0f;
  p = p * s2 + 1.0f;
  return convert16<vf16, native_vi16, native_vf16>(k) * 0.693147181f + 2.0f * s * p;
}
// softplus(x) = max(x, 0) + ln(1 + e^-|x|) on 16 lanes, x for x > 20 (as the scalar softplus), for
// finite x >= -80 (e^-|x| normal; others give no meaningful value). ln(1 + t) as ln(u) t / (u - 1),
// u = 1 + t rounded: exact to rounding however small t (t for u = 1).
static inline vf16 softplus16(vf16 x) {
  const vf16 t = exp16(-sycl::fabs(x)), u = 1.0f + t;
  const native_vf16 un = sycl::bit_cast<native_vf16>(u), tn = sycl::bit_cast<native_vf16>(t);
  const native_vf16 l1p = un == 1.0f ? tn : sycl::bit_cast<native_vf16>(log16(u) * (t / (u - 1.0f)));
  const native_vf16 xn = sycl::bit_cast<native_vf16>(x);
  const native_vf16 sp = (xn > 0.0f ? xn : 0.0f) + l1p;
  return sycl::bit_cast<vf16>(xn > 20.0f ? xn : sp);
}

static inline float silu(float x) { return x / (1.0f + sycl::exp(-x)); }
static inline vf16 silu(vf16 x) { return x / (1.0f + exp16(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + sycl::exp(-x)); }
static inline float softplus(float x) { return x > 20.0f ? x : sycl::log1p(sycl::exp(x)); }
