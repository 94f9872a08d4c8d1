// common.hpp — device-side helpers shared by every kernel family (compiled at run time).
// The activation type is chosen per build with -DGDN_ACT_F32 / -DGDN_ACT_F16 / -DGDN_ACT_BF16.
#pragma once
#include <sycl/sycl.hpp>
#include <stdint.h>
#include "params.hpp"

namespace syclexp = sycl::ext::oneapi::experimental;
#define GDN_KERNEL(dims) extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<dims>))

#if defined(GDN_ACT_BF16)
// bf16 by bit operations: sycl::ext::oneapi::bfloat16 pulls in a device library that crashes the
// runtime's persistent cache (TOOLCHAIN.md fact 6).
typedef uint16_t act_t;
static inline float act_to_float(act_t h) { return sycl::bit_cast<float>((uint32_t)h << 16); }
static inline act_t float_to_act(float f) {
  uint32_t u = sycl::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (act_t)((u >> 16) | 0x40u);  // keep NaN a NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest even
  return (act_t)(u >> 16);
}
#elif defined(GDN_ACT_F16)
typedef sycl::half act_t;
static inline float act_to_float(act_t h) { return (float)h; }
static inline act_t float_to_act(float f) { return (act_t)f; }
#else
typedef float act_t;
static inline float act_to_float(act_t h) { return h; }
static inline act_t float_to_act(float f) { return f; }
#endif

static inline float load_act(const void *p, int64_t i) { return act_to_float(((const act_t *)p)[i]); }
static inline void store_act(void *p, int64_t i, float f) { ((act_t *)p)[i] = float_to_act(f); }

// Work-items on the CPU device hold 16 lanes (channels, state columns) in one vector; see delta_rule.cpp.
typedef sycl::vec<float, 16> vf16;
static inline vf16 load_act16(const void *p, int64_t i) {
  vf16 r;
  for (int l = 0; l < 16; ++l) r[l] = load_act(p, i + l);
  return r;
}
static inline void store_act16(void *p, int64_t i, const vf16 &v) {
  for (int l = 0; l < 16; ++l) store_act(p, i + l, v[l]);
}

template <class T>  // float or vf16
static inline T silu(T x) { return x / (1.0f + sycl::exp(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + sycl::exp(-x)); }
static inline float softplus(float x) { return x > 20.0f ? x : sycl::log1p(sycl::exp(x)); }

// Global row of the j-th token of a group (non-spec or spec): identity when no index array.
static inline int64_t global_row(const int32_t *token_indx, int32_t j) {
  return token_indx ? (int64_t)token_indx[j] : (int64_t)j;
}

static inline sycl::nd_item<1> item1() { return sycl::ext::oneapi::this_work_item::get_nd_item<1>(); }
static inline sycl::nd_item<2> item2() { return sycl::ext::oneapi::this_work_item::get_nd_item<2>(); }
