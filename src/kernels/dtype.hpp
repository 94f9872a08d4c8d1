// dtype.hpp — the activation dtype and the scalar bf16 / f16 conversions (device code, compiled at
// run time). The activation type is chosen per build with -DGDN_ACT_F32 / -DGDN_ACT_F16 /
// -DGDN_ACT_BF16; math is f32 either way: values widen on load and round to nearest even on store.
#pragma once
#include <sycl/bit_cast.hpp>
#include <stdint.h>

// bf16 by bit operations: sycl::ext::oneapi::bfloat16 pulls in a device library that crashes the
// runtime's persistent cache (2026.1/2026.2: a segfault in PersistentDeviceCodeCache, cold or warm).
static inline float bf16_to_float(uint16_t h) { return sycl::bit_cast<float>((uint32_t)h << 16); }
static inline uint16_t float_to_bf16(float f) {
  uint32_t u = sycl::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  // keep NaN a NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                            // round to nearest even
  return (uint16_t)(u >> 16);
}

// f16 by bit operations too (activations and states): a kernel that uses sycl::half needs the
// device's fp16 aspect, and the runtime puts kernels with different needs into separate device
// images -- a build of two programs, which the disk cache cannot keep (delta_prep.cpp: gdn_prep
// reads activations, gdn_chunk_plan does not; delta_chunk*.cpp: only the scan touches the state).
// Both without branches, every case computed and the result selected: on GPUs a branch per case
// took 4-15% more instructions in the f16 builds, and flag registers enough to spill dg2's
// gdn_conv_non_spec (docs/gpu.md).
static inline float f16_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  const uint32_t sub = sycl::bit_cast<uint32_t>((float)m * 5.9604644775390625e-8f);  // e == 0: m 2^-24
  const uint32_t other = e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13);
  return sycl::bit_cast<float>(sign | (e == 0 ? sub : other));
}
static inline uint16_t float_to_f16(float f) {  // round to nearest even
  const uint32_t u = sycl::bit_cast<uint32_t>(f), a = u & 0x7fffffffu;
  const uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
  // subnormal (a < 0x38800000): the nearest multiple of 2^-24, ties to even; a = mant 2^(e-150) with
  // e = a >> 23 <= 112, so mant >> shift, shift = 126 - e (25 and more: zero; kept at 25)
  const uint32_t e = a < 0x38800000u ? a >> 23 : 112u, shift = e > 101u ? 126u - e : 25u;
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  const uint32_t sub = q + (rem > half || (rem == half && (q & 1u)));
  const uint32_t mag = a > 0x7f800000u   ? 0x7e00u   // NaN
                       : a >= 0x477ff000u ? 0x7c00u   // rounds to >= 65520: inf
                       : a >= 0x38800000u ? normal
                                          : sub;
  return (uint16_t)(((u >> 16) & 0x8000u) | mag);
}

#if defined(GDN_ACT_BF16)
typedef uint16_t act_t;
static inline float act_to_float(act_t h) { return bf16_to_float(h); }
static inline act_t float_to_act(float f) { return float_to_bf16(f); }
#elif defined(GDN_ACT_F16)
typedef uint16_t act_t;
static inline float act_to_float(act_t h) { return f16_to_float(h); }
static inline act_t float_to_act(float f) { return float_to_f16(f); }
#else
typedef float act_t;
static inline float act_to_float(act_t h) { return h; }
static inline act_t float_to_act(float f) { return f; }
#endif

static inline float load_act(const void *p, int64_t i) { return act_to_float(((const act_t *)p)[i]); }
static inline void store_act(void *p, int64_t i, float f) { ((act_t *)p)[i] = float_to_act(f); }
// An activation stored back as it was loaded (the conv state keeps its inputs: conv1d.hpp's window
// stores): exact in act_t, so no rounding -- bf16 keeps the upper half of the float's bits (a NaN
// keeps its payload, which rounding would quiet); f16 and f32 convert exactly anyway. The CPU
// variants' 16-lane form (vec16.hpp, store_act16_exact) took ~7 instructions a vector off a
// decode's conv windows.
#if defined(GDN_ACT_BF16)
static inline void store_act_exact(void *p, int64_t i, float f) { ((act_t *)p)[i] = (act_t)(sycl::bit_cast<uint32_t>(f) >> 16); }
#else
static inline void store_act_exact(void *p, int64_t i, float f) { store_act(p, i, f); }
#endif
