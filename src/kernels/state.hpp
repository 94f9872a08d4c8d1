// state.hpp — the SSM state cache's element type (device code, compiled at run time): chosen per
// build with -DGDN_STATE_BF16 / -DGDN_STATE_F16 / -DGDN_STATE_I8 / -DGDN_STATE_F8E4M3 (default f32)
// by the kernels that load or store ssm_state; scalar and 16-lane loads and stores, plain and
// streaming; the 8-bit states' codes and row scales.
#pragma once
#include <sycl/builtins.hpp>
#include "dtype.hpp"
#include "vec16.hpp"

// The SSM state cache (gdn_config_t.state_dtype; docs/op.md, state caches): a
// state is widened when loaded and rounded once when stored, by these helpers only.
// vstore_state2(_nt): x0 then x1 to 32 consecutive states (64 bytes for 2-byte states: one store).
#if defined(GDN_STATE_I8) || defined(GDN_STATE_F8E4M3)
#define GDN_STATE_8BIT 1
#else
#define GDN_STATE_8BIT 0
#endif

#if GDN_STATE_8BIT
// 8-bit states (gdn_xpu.h "State dtype"): a code per element and an f32 scale per state row (the K
// values of one v index), value = code x scale. load_state / vload_state give the codes' values;
// the callers multiply by the row's scale (row_scale, delta.hpp). A row is stored whole: its
// largest magnitude m sets scale = m / kStateQ and every code = round(x kStateQ / m)
// (RowQuant, store_code), m = 0: scale 0, codes 0.
#if defined(GDN_STATE_I8)
typedef int8_t state_t;
constexpr float kStateQ = 127.0f;
static inline float state_value(state_t c) { return (float)c; }
#else
typedef uint8_t state_t;  // OCP FP8 E4M3 ("fn": no inf, 0x7f / 0xff NaN, never stored; max 448)
constexpr float kStateQ = 448.0f;
static inline float state_value(state_t c) {
  const uint32_t e = (c >> 3) & 15u, m = c & 7u;
  const float sub = (float)m * 0.001953125f;                             // e == 0: m 2^-9
  const float normal = sycl::bit_cast<float>(((e + 120u) << 23) | (m << 20));  // (1 + m/8) 2^(e-7)
  const float a = e == 0 ? sub : normal;
  return (c & 0x80u) ? -a : a;
}
#endif
static inline float load_state(const state_t *p) { return state_value(*p); }
// A row's store: codes = round(x * inv), scale = m (1 / kStateQ); seed (stochastic rounding only, else 0)
// keys the row's random bits.
struct RowQuant {
  float inv, scale;
  uint32_t seed;
  bool stochastic;
};
static inline uint32_t mix32(uint32_t h) {  // a 32-bit finalizer (murmur3's fmix32)
  h ^= h >> 16, h *= 0x85ebca6bu, h ^= h >> 13, h *= 0xc2b2ae35u;
  return h ^ (h >> 16);
}
// m: the row's largest magnitude; (hv, v): the row, which with m's bits keys its random bits -- a
// pure function of the stored row, not of the slot or the batch (batch invariance, graph replays).
static inline RowQuant row_quant(float m, int32_t hv, int32_t v, bool stochastic) {
  RowQuant q;
  q.inv = m > 0.0f ? kStateQ / m : 0.0f;
  q.scale = m * (1.0f / kStateQ);  // (one division a row instead of two)
  q.stochastic = stochastic;
  q.seed = stochastic ? mix32(mix32(sycl::bit_cast<uint32_t>(m) ^ 0x9e3779b9u * (uint32_t)(hv + 1)) + (uint32_t)v) : 0u;
  return q;
}
// u in [0, 1) for element k of the row.
static inline float row_uniform(const RowQuant &q, int32_t k) {
  return (float)(mix32(q.seed + 0x632be5abu * (uint32_t)(k + 1)) >> 8) * 5.9604644775390625e-8f;  // 2^-24
}
#if defined(GDN_STATE_I8)
static inline state_t encode_state(float y, const RowQuant &q, int32_t k) {
  const float r = q.stochastic ? sycl::floor(y + row_uniform(q, k)) : sycl::rint(y);
  return (state_t)(int32_t)sycl::clamp(r, -kStateQ, kStateQ);
}
#else
// |y| <= 448 (up to the scaling's rounding): to E4M3, nearest even or stochastic, saturating at 448.
static inline state_t encode_state(float y, const RowQuant &q, int32_t k) {
  float a = sycl::fmin(sycl::fabs(y), kStateQ);
  const uint32_t sign = sycl::bit_cast<uint32_t>(y) >> 31 << 7;
  uint32_t code;
  if (q.stochastic) {  // a + u ulp(a), truncated to the grid: the neighbour above with probability by distance
    const float ulp = a < 0.015625f ? 0.001953125f : sycl::bit_cast<float>((sycl::bit_cast<uint32_t>(a) & 0x7f800000u) - (3u << 23));
    a = sycl::fmin(a + row_uniform(q, k) * ulp, kStateQ);
    const uint32_t b = sycl::bit_cast<uint32_t>(a);
    code = a < 0.015625f ? (uint32_t)(a * 512.0f) : (b >> 20) - (120u << 3);
  } else {
    const uint32_t b = sycl::bit_cast<uint32_t>(a);
    code = a < 0.015625f ? (uint32_t)sycl::rint(a * 512.0f)  // subnormal: multiples of 2^-9 (8: 2^-6, the first normal)
                         : ((b + 0x7ffffu + ((b >> 20) & 1u)) >> 20) - (120u << 3);
  }
  return (state_t)(sign | sycl::min(code, 0x7eu));
}
#endif
static inline void store_code(state_t *p, float x, const RowQuant &q, int32_t k) { *p = encode_state(x * q.inv, q, k); }

// The CPU variants' 16-lane forms of the above, as whole-vector operations on the compiler's own
// vector types (the same values bit for bit: the same formulas, lane-wise; a lane-by-lane loop over
// sycl::vec elements stays scalar on the CPU device and made an i8 decode step several times a bf16
// one's).
typedef uint8_t native_vu8x16 __attribute__((ext_vector_type(16)));
typedef int8_t native_vi8x16 __attribute__((ext_vector_type(16)));
static inline native_vu32x16 mix32x16(native_vu32x16 h) {
  h ^= h >> 16u, h *= 0x85ebca6bu, h ^= h >> 13u, h *= 0xc2b2ae35u;
  return h ^ (h >> 16u);
}
// row_uniform of elements k0 .. k0+15.
static inline native_vf16 row_uniform16(const RowQuant &q, int32_t k0) {
  const native_vu32x16 k = (native_vu32x16){1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 10u, 11u, 12u, 13u, 14u, 15u, 16u} + (uint32_t)k0;
  return __builtin_convertvector(mix32x16(q.seed + 0x632be5abu * k) >> 8u, native_vf16) * 5.9604644775390625e-8f;
}
static inline vf16 vload_state(const state_t *p) {
#if defined(GDN_STATE_I8)
  native_vi8x16 c;
  __builtin_memcpy(&c, p, sizeof(c));
  return sycl::bit_cast<vf16>(__builtin_convertvector(c, native_vf16));
#else
  native_vu8x16 c8;
  __builtin_memcpy(&c8, p, sizeof(c8));
  const native_vu32x16 c = __builtin_convertvector(c8, native_vu32x16);
  const native_vf16 sub = __builtin_convertvector(c & 7u, native_vf16) * 0.001953125f;
  const native_vu32x16 normal = ((c & 0x7fu) + (120u << 3)) << 20u;
  const native_vu32x16 is_sub = __builtin_convertvector(((c >> 3u) & 15u) == 0u, native_vu32x16);  // all-ones lanes
  const native_vu32x16 mag = (sycl::bit_cast<native_vu32x16>(sub) & is_sub) | (normal & ~is_sub);
  return sycl::bit_cast<vf16>(mag | ((c & 0x80u) << 24u));
#endif
}
// encode_state of 16 lanes y (elements k0 ..) as 16 codes; SR: q.stochastic, as a template parameter
// (a run-time select computed the random bits of every store: an i8 decode step ~2x as long).
template <bool SR>
static inline native_vu8x16 encode_state16(native_vf16 y, const RowQuant &q, int32_t k0) {
#if defined(GDN_STATE_I8)
  // |y| <= 127 up to the scaling's rounding, so the nearest codes are in [-127, 127] with no clamp,
  // and stochastic ones once floored at -127 (a row holding inf or NaN has inv 0: NaN lanes, whose
  // conversion's low byte is 0).
  // The conversion to int32: on an x86-64 host one vcvtps2dq, which rounds to nearest even (the
  // compiler's float-to-int conversion is two instructions, a truncation and a conversion, after
  // its own rounding: three a vector instead of one).
  native_vf16 r = y;
  if constexpr (SR) r = __builtin_elementwise_max(__builtin_elementwise_floor(y + row_uniform16(q, k0)), (native_vf16)(-kStateQ));
  native_vi16 c;
#if defined(GDN_CPU_X86)
  asm("vcvtps2dq %1, %0" : "=v"(c) : "v"(r));
#else
  c = __builtin_convertvector(SR ? r : __builtin_elementwise_roundeven(r), native_vi16);
#endif
  return sycl::bit_cast<native_vu8x16>(__builtin_convertvector(c, native_vi8x16));
#else
  const native_vu32x16 yb = sycl::bit_cast<native_vu32x16>(y);
  native_vf16 a = __builtin_elementwise_min(sycl::bit_cast<native_vf16>(yb & 0x7fffffffu), (native_vf16)kStateQ);
  native_vu32x16 code;
  if constexpr (SR) {
    const native_vu32x16 sub = __builtin_convertvector(a < 0.015625f, native_vu32x16);
    const native_vu32x16 ulp = (sycl::bit_cast<native_vu32x16>((native_vf16)0.001953125f) & sub) |
                               (((sycl::bit_cast<native_vu32x16>(a) & 0x7f800000u) - (3u << 23)) & ~sub);
    a = __builtin_elementwise_min(a + row_uniform16(q, k0) * sycl::bit_cast<native_vf16>(ulp), (native_vf16)kStateQ);
    const native_vu32x16 b = sycl::bit_cast<native_vu32x16>(a), sub2 = __builtin_convertvector(a < 0.015625f, native_vu32x16);
    code = (__builtin_convertvector(a * 512.0f, native_vu32x16) & sub2) | (((b >> 20u) - (120u << 3)) & ~sub2);
  } else {
    const native_vu32x16 b = sycl::bit_cast<native_vu32x16>(a), sub = __builtin_convertvector(a < 0.015625f, native_vu32x16);
    code = (__builtin_convertvector(__builtin_elementwise_roundeven(a * 512.0f), native_vu32x16) & sub) |
           ((((b + 0x7ffffu + ((b >> 20u) & 1u)) >> 20u) - (120u << 3)) & ~sub);
  }
  code = __builtin_elementwise_min(code, (native_vu32x16)0x7eu) | ((yb >> 31u) << 7u);
  return __builtin_convertvector(code, native_vu8x16);
#endif
}
// A row of n vectors to p (codes) and *scale: the CPU variants' rows (K = 16 n values), in plain
// stores (a row's codes are K bytes, a fraction of a 2-byte state's streaming pairs). The row's
// largest magnitude as the largest bit pattern of the magnitudes (non-negative floats order as
// their bits).
static inline void vstore_state_row(state_t *p, float *scale, const vf16 *x, int n, int32_t hv, int32_t v, bool stochastic,
                                    bool /*stream*/) {
  native_vu32x16 m = (native_vu32x16)0u;
  for (int i = 0; i < n; ++i) m = __builtin_elementwise_max(m, sycl::bit_cast<native_vu32x16>(x[i]) & 0x7fffffffu);
  // Lanes folded in halves (the reduction builtin went lane by lane: 16 extractions and 15
  // compare-and-moves a row, ~40% of an i8 decode step cache-resident).
  typedef uint32_t n8 __attribute__((ext_vector_type(8)));
  typedef uint32_t n4 __attribute__((ext_vector_type(4)));
  const n8 m8 = __builtin_elementwise_max(__builtin_shufflevector(m, m, 0, 1, 2, 3, 4, 5, 6, 7),
                                          __builtin_shufflevector(m, m, 8, 9, 10, 11, 12, 13, 14, 15));
  n4 m4 = __builtin_elementwise_max(__builtin_shufflevector(m8, m8, 0, 1, 2, 3), __builtin_shufflevector(m8, m8, 4, 5, 6, 7));
  m4 = __builtin_elementwise_max(m4, __builtin_shufflevector(m4, m4, 2, 3, 0, 1));
  m4 = __builtin_elementwise_max(m4, __builtin_shufflevector(m4, m4, 1, 0, 3, 2));
  const RowQuant q = row_quant(sycl::bit_cast<float>((uint32_t)m4[0]), hv, v, stochastic);
  if (stochastic) {
    for (int i = 0; i < n; ++i) {
      const native_vu8x16 c = encode_state16<true>(sycl::bit_cast<native_vf16>(x[i]) * q.inv, q, 16 * i);
      __builtin_memcpy(p + 16 * i, &c, sizeof(c));
    }
  } else {
    for (int i = 0; i < n; ++i) {
      const native_vu8x16 c = encode_state16<false>(sycl::bit_cast<native_vf16>(x[i]) * q.inv, q, 16 * i);
      __builtin_memcpy(p + 16 * i, &c, sizeof(c));
    }
  }
  *scale = q.scale;
}
#elif defined(GDN_STATE_BF16)
typedef uint16_t state_t;
static inline float load_state(const state_t *p) { return bf16_to_float(*p); }
static inline void store_state(state_t *p, float f) { *p = float_to_bf16(f); }
static inline vf16 vload_state(const state_t *p) { return load_bf16x16(p); }
static inline void vstore_state(state_t *p, const vf16 &x) { store_bf16x16(p, x); }
static inline void vstore_state2_nt(state_t *p, const vf16 &x0, const vf16 &x1) { store_64_nt(p, to_bf16x32(x0, x1)); }
#elif defined(GDN_STATE_F16)
// f16 bit patterns with the scalar bit-operation conversions of dtype.hpp; the 16-lane helpers (the
// recurrent kernels, alone in their builds) use sycl::half vector conversions.
typedef uint16_t state_t;
static inline float load_state(const state_t *p) { return f16_to_float(*p); }
static inline void store_state(state_t *p, float f) { *p = float_to_f16(f); }
static inline vf16 vload_state(const state_t *p) { return load_f16x16((const sycl::half *)p); }
static inline void vstore_state(state_t *p, const vf16 &x) { store_f16x16((sycl::half *)p, x); }
static inline void vstore_state2_nt(state_t *p, const vf16 &x0, const vf16 &x1) {
  store_64_nt(p, join_16x2(convert16<vu16, native_vf16, native_vh16>(x0), convert16<vu16, native_vf16, native_vh16>(x1)));
}
#else
typedef float state_t;
static inline float load_state(const state_t *p) { return *p; }
static inline void store_state(state_t *p, float f) { *p = f; }
static inline vf16 vload_state(const state_t *p) { return vload(p); }
static inline void vstore_state(state_t *p, const vf16 &x) { vstore(p, x); }
static inline void vstore_state2_nt(state_t *p, const vf16 &x0, const vf16 &x1) {
  vstore_nt(p, x0);
  vstore_nt(p + 16, x1);
}
#endif
#if !GDN_STATE_8BIT
static inline void vstore_state2(state_t *p, const vf16 &x0, const vf16 &x1) {
#if defined(GDN_STATE_BF16)
  store_bf16x32(p, x0, x1);  // rounded together, one 64-byte store
#else
  vstore_state(p, x0);
  vstore_state(p + 16, x1);
#endif
}
// The vectors x[0..n) to p (contiguous), streaming when p is 64-byte aligned (pairs of vectors: 64
// bytes of 2-byte states; an odd last vector takes a plain store). The fallback for a misaligned
// view of the state (rare) takes plain stores: vector stores of bf16 (16 values, where the
// streaming ones store 32), lane by lane otherwise -- a loop of plain f32 vector stores there was
// merged with the streaming loop by the compiler, dropping the hint (f16: not checked). Lane by
// lane, the walks kept their rows on the stack for it: the bf16 vector stores took 4-9% off a
// cache-resident bf16 decode step (the streaming stores' count unchanged in the generated
// assembly of the vk and kv decode and spec builds).
static inline void vstore_states_stream(state_t *p, const vf16 *x, int n) {
  if (((uintptr_t)p & 63u) == 0) {
    int i = 0;
    for (; i + 1 < n; i += 2) vstore_state2_nt(p + 16 * i, x[i], x[i + 1]);
    if (i < n) vstore_state(p + 16 * i, x[i]);
  } else {
#if defined(GDN_STATE_BF16)
    for (int i = 0; i < n; ++i) vstore_state(p + 16 * i, x[i]);
#else
    for (int i = 0; i < n; ++i)
      for (int l = 0; l < 16; ++l) store_state(p + 16 * i + l, x[i][l]);
#endif
  }
}

// The vectors x[0..n) to p: streaming, or plain stores where p is the state this work-item read
// (in place, a decode's usual case): its lines are still in this core's caches, and a streaming
// store to a cached line evicts it first (a decode's recurrent kernel ~18% longer with streaming
// stores in place; stores to other slots, which no cache holds, stay streaming).
static inline void vstore_states(state_t *p, const vf16 *x, int n, bool stream) {
  if (stream) {
    vstore_states_stream(p, x, n);
  } else {
    int i = 0;
    for (; i + 1 < n; i += 2) vstore_state2(p + 16 * i, x[i], x[i + 1]);
    if (i < n) vstore_state(p + 16 * i, x[i]);
  }
}
// A row of n vectors to p: vstore_states (the scale and the row's key are for 8-bit states).
static inline void vstore_state_row(state_t *p, float *, const vf16 *x, int n, int32_t, int32_t, bool, bool stream) {
  vstore_states(p, x, n, stream);
}
#endif
