// common.hpp — device-side helpers shared by every kernel family (compiled at run time).
// The activation type is chosen per build with -DGDN_ACT_F32 / -DGDN_ACT_F16 / -DGDN_ACT_BF16, the
// SSM state type (the kernels that load or store ssm_state) with -DGDN_STATE_BF16 / -DGDN_STATE_F16
// (default f32). Math is f32 either way: values widen on load and round to nearest even on store.
#pragma once
// Only the SYCL headers the kernels use: <sycl/sycl.hpp> costs ~2 s of front end per build.
#include <sycl/bit_cast.hpp>
#include <sycl/builtins.hpp>
#include <sycl/ext/oneapi/free_function_queries.hpp>
#include <sycl/ext/oneapi/kernel_properties/properties.hpp>
#include <sycl/multi_ptr.hpp>
#include <sycl/vector.hpp>
#include <stdint.h>
#include "params.hpp"

namespace syclexp = sycl::ext::oneapi::experimental;
#define GDN_KERNEL(dims) extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<dims>))
// A kernel whose work-items cooperate through sub-group functions in sub-groups of GDN_SUB_GROUP lanes.
#define GDN_SUB_GROUP_KERNEL(dims) GDN_KERNEL(dims) SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<GDN_SUB_GROUP>))

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
static inline float f16_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return sycl::bit_cast<float>(sign | sycl::bit_cast<uint32_t>((float)m * 5.9604644775390625e-8f));  // m 2^-24
  return sycl::bit_cast<float>(sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13)));
}
static inline uint16_t float_to_f16(float f) {  // round to nearest even
  const uint32_t u = sycl::bit_cast<uint32_t>(f), a = u & 0x7fffffffu;
  uint16_t h = (uint16_t)((u >> 16) & 0x8000u);
  if (a > 0x7f800000u) h |= 0x7e00u;                        // NaN
  else if (a >= 0x477ff000u) h |= 0x7c00u;                   // rounds to >= 65520: inf
  else if (a >= 0x38800000u) h |= (uint16_t)((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13);  // normal
  else {  // subnormal: the nearest multiple of 2^-24, ties to even
    const uint32_t shift = 126u - (a >> 23), mant = (a & 0x7fffffu) | 0x800000u;  // a = mant 2^(e-150)
    if (shift <= 24u) {
      const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
      h |= (uint16_t)(q + (rem > half || (rem == half && (q & 1u))));
    }
  }
  return h;
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
// variants' 16-lane form below took ~7 instructions a vector off a decode's conv windows.
#if defined(GDN_ACT_BF16)
static inline void store_act_exact(void *p, int64_t i, float f) { ((act_t *)p)[i] = (act_t)(sycl::bit_cast<uint32_t>(f) >> 16); }
#else
static inline void store_act_exact(void *p, int64_t i, float f) { store_act(p, i, f); }
#endif

// Work-items of the CPU-device kernels (*_cpu.cpp) hold 16 lanes (channels, state columns) in one vector.
typedef sycl::vec<float, 16> vf16;
// CPU-device kernels (*_cpu): a work-item computes on 16-wide vectors itself, so the CPU
// runtime's compiler must not also vectorize the kernel ACROSS work-items (16 x vf16 = 256-lane
// code: seconds to tens of seconds of register allocation per kernel at build time, and lane-by-lane
// gathers at run time). Its back end leaves a kernel scalar when the kernel never asks for a
// work-item id (no get_global_id / get_local_id / sub-group or group functions: no work-group
// loop to vectorize), so every *_cpu kernel runs in work-groups of ONE work-item and takes its
// coordinates from GROUP ids only (get_group(d) == get_global_id(d) with local size 1, so the
// meaning is the same on any device). The back-end time of the demo's CPU kernels: 44-54 s
// vectorized across work-items, ~3.5 s this way (0.2.0; docs/design.md, "Cold start").

// Asks for the bytes [p, p + n), n > 0, to be brought into this core's caches, without waiting for them
// (prefetcht0 on each 64-byte line they touch; never faults). On an x86-64 host (GDN_CPU_X86,
// plan.cpp: the CPU-variant builds) the instructions inline -- a fixed count, unrolled where n is
// known, then the last byte's line for a span not line-aligned; else the CPU runtime's
// __cpu_lprefetch, a call looping the same instruction, after which the callers reload the
// vectors the call may clobber (inline against the call, alternated in one process: cache-resident
// bf16 decode B=8 0.190 -> 0.166 ms, 0.2.18). (Register operands only: a memory operand does not
// link through SPIR-V.)
static inline void prefetch_bytes(const void *p, size_t n) {
#if defined(GDN_CPU_X86)
  const char *first = (const char *)p;
  for (size_t o = 0; o < n; o += 64) asm volatile("prefetcht0 (%0)" : : "r"(first + o));
  asm volatile("prefetcht0 (%0)" : : "r"(first + n - 1));
#else
  sycl::address_space_cast<sycl::access::address_space::global_space, sycl::access::decorated::no>((const char *)p).prefetch(n);
#endif
}

// The compiler's own vector types, for its builtins (shuffles, non-temporal stores, conversions);
// bit_cast to/from the sycl::vec types.
typedef float native_vf16 __attribute__((ext_vector_type(16)));
typedef int32_t native_vi16 __attribute__((ext_vector_type(16)));
typedef uint32_t native_vu32x16 __attribute__((ext_vector_type(16)));
typedef uint16_t native_vu16x16 __attribute__((ext_vector_type(16)));
typedef _Float16 native_vh16 __attribute__((ext_vector_type(16)));
// Lane-wise conversion of a 16-lane vector, as the compiler's own __builtin_convertvector (float to
// integer truncates; integer narrowing keeps the low bits; float to half rounds to nearest even).
// sycl::vec::convert is a library template whose instantiations the run-time compiler of some
// runtimes does not provide: 2026.2 fails the CPU kernels with "Symbols not found:
// vec<float,16>::convert<int, rte>" and its kin. Nothing here calls it.
template <typename To, typename NativeFrom, typename NativeTo, typename From>
static inline To convert16(const From &x) {
  return sycl::bit_cast<To>(__builtin_convertvector(sycl::bit_cast<NativeFrom>(x), NativeTo));
}
// 16 contiguous floats as ONE vector move. A lane-by-lane loop (r[i] = p[i]) compiled to 16
// scalar loads + 16 scalar stores through the stack per vector on the CPU device: ~57% of a
// decode work-item's instructions in the recurrent kernels.
// memcpy of the whole vector is what load_bf16x16 does already; any alignment is fine.
static inline vf16 vload(const float *p) {
  native_vf16 r;
  __builtin_memcpy(&r, p, sizeof(r));
  return sycl::bit_cast<vf16>(r);
}
static inline void vstore(float *p, const vf16 &x) {
  const native_vf16 r = sycl::bit_cast<native_vf16>(x);
  __builtin_memcpy(p, &r, sizeof(r));
}
// 16 bf16 values as whole-vector integer operations: a lane-by-lane loop of bf16_to_float stayed
// scalar on the CPU device and dominated the kernels that stream activations.
typedef sycl::vec<uint16_t, 16> vu16;
typedef sycl::vec<uint32_t, 16> vu32;
static inline vf16 load_bf16x16(const uint16_t *p) {
  vu16 h;
  __builtin_memcpy(&h, p, sizeof(h));
  return sycl::bit_cast<vf16>(convert16<vu32, native_vu16x16, native_vu32x16>(h) << 16u);
}
// Each lane of v rounded to bf16 (to nearest even, as float_to_bf16; a NaN stays a NaN) in the
// upper half of its 32-bit word.
static inline vu32 bf16_in_upper_half(const vf16 &v) {
  const vu32 u = sycl::bit_cast<vu32>(v);
  const vu32 rounded = u + 0x7fffu + ((u >> 16u) & 1u);
  // All-ones where NaN, by a float compare (one vcmpunordps into a mask register; the integer
  // test of the magnitude took an AND besides: bf16 whole steps ~3-5% faster, decode and spec
  // B=8 alternated in one process, 0.2.5). A blend by bit masks: sycl::select on the CPU device
  // went lane by lane. Kept NaN: rounding adds up to 0x8000, which carries a NaN's all-ones low
  // bits into the sign (0x7fffffff -> -0; test_bf16_store_keeps_nan_payloads).
  const native_vf16 f = sycl::bit_cast<native_vf16>(v);
  const vu32 is_nan = sycl::bit_cast<vu32>(f != f);
  return (rounded & ~is_nan) | ((u | 0x400000u) & is_nan);
}
// The upper halves of 16 32-bit words as 16 consecutive 2-byte values at p (one 32-byte store).
static inline void store_upper_halves(uint16_t *p, const vu32 &w) {
  const vu16 h = convert16<vu16, native_vu32x16, native_vu16x16>(w >> 16u);
  __builtin_memcpy(p, &h, sizeof(h));
}
// 32 two-byte values (64 bytes) as the compiler's own vector, for whole-line stores.
typedef uint16_t native_vu16x32 __attribute__((ext_vector_type(32)));
// x0's lanes then x1's rounded to bf16, as one 64-byte vector: the upper halves of the two
// vectors' words picked by one shuffle (narrowing each vector on its own, vpmovdw, took two
// instructions per vector and a third to join them).
// GDN_CPU_BF16_INSN (make_plan: every CPU-variant build on a host with AVX512-BF16, unless
// GDN_XPU_SOFT_BF16=1): one vcvtne2ps2bf16 instead of the ~13 vector instructions of the bit
// operations below. It rounds as they do (to nearest even, a NaN truncated and quieted, inf kept)
// except that it takes a denormal input as zero -- as every fp32 instruction of a CPU build does:
// those are compiled with -cl-denorms-are-zero (kernel_cache.cpp), so no arithmetic result is
// denormal and every value these stores round comes out of arithmetic. The same bits either way
// (test_bf16_instructions_store_the_bit_operations_bits, and with denormal states
// test_bf16_store_flushes_denormal_states_both_ways). (The runtime's compiler takes x86 assembly
// through SPIR-V: sycl::ext::oneapi::bfloat16 is not usable, above.) No test for denormal inputs
// before it: two vfpclassps and a branch per pair cost ~9% of a cache-resident bf16 decode step
// (0.2.16), for values that cannot occur.
static inline native_vu16x32 to_bf16x32(const vf16 &x0, const vf16 &x1) {
#if defined(GDN_CPU_BF16_INSN)
  const native_vf16 f0 = sycl::bit_cast<native_vf16>(x0), f1 = sycl::bit_cast<native_vf16>(x1);
  native_vu16x32 r;  // lanes 0-15 from x0, 16-31 from x1
  asm("vcvtne2ps2bf16 %1, %2, %0" : "=v"(r) : "v"(f0), "v"(f1));
  return r;
#else
  const native_vu16x32 a = sycl::bit_cast<native_vu16x32>(bf16_in_upper_half(x0));
  const native_vu16x32 b = sycl::bit_cast<native_vu16x32>(bf16_in_upper_half(x1));
  return __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39,
                                 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63);
#endif
}
// 16 values to bf16 at p (one 32-byte store): vcvtneps2bf16 under GDN_CPU_BF16_INSN, as above.
static inline void store_bf16x16(uint16_t *p, const vf16 &v) {
#if defined(GDN_CPU_BF16_INSN)
  uint16_t r __attribute__((ext_vector_type(16)));
  asm("vcvtneps2bf16 %1, %0" : "=v"(r) : "v"(sycl::bit_cast<native_vf16>(v)));
  __builtin_memcpy(p, &r, sizeof(r));
#else
  store_upper_halves(p, bf16_in_upper_half(v));
#endif
}
// x0 then x1 to 32 consecutive bf16 values: one 64-byte store.
static inline void store_bf16x32(uint16_t *p, const vf16 &x0, const vf16 &x1) {
  const native_vu16x32 c = to_bf16x32(x0, x1);
  __builtin_memcpy(p, &c, sizeof(c));
}
// 16 f16 values: one vector conversion each way (round to nearest even on the way down).
typedef sycl::vec<sycl::half, 16> vh16;
static inline vf16 load_f16x16(const sycl::half *p) {
  vh16 h;
  __builtin_memcpy(&h, p, sizeof(h));
  return convert16<vf16, native_vh16, native_vf16>(h);
}
static inline void store_f16x16(sycl::half *p, const vf16 &v) {
  const vh16 h = convert16<vh16, native_vf16, native_vh16>(v);
  __builtin_memcpy(p, &h, sizeof(h));
}
#if defined(GDN_ACT_BF16)
static inline vf16 load_act16(const void *p, int64_t i) { return load_bf16x16((const act_t *)p + i); }
static inline void store_act16(void *p, int64_t i, const vf16 &v) { store_bf16x16((act_t *)p + i, v); }
#elif defined(GDN_ACT_F32)
static inline vf16 load_act16(const void *p, int64_t i) { return vload((const float *)p + i); }
static inline void store_act16(void *p, int64_t i, const vf16 &v) { vstore((float *)p + i, v); }
#else
static inline vf16 load_act16(const void *p, int64_t i) {
  vf16 r;
  for (int l = 0; l < 16; ++l) r[l] = load_act(p, i + l);
  return r;
}
static inline void store_act16(void *p, int64_t i, const vf16 &v) {
  for (int l = 0; l < 16; ++l) store_act(p, i + l, v[l]);
}
#endif
#if defined(GDN_ACT_BF16)
static inline void store_act16_exact(void *p, int64_t i, const vf16 &v) {
  store_upper_halves((act_t *)p + i, sycl::bit_cast<vu32>(v));  // bf16: the upper halves, unrounded
}
#else
static inline void store_act16_exact(void *p, int64_t i, const vf16 &v) { store_act16(p, i, v); }
#endif
// 32 consecutive activations, x0's lanes then x1's (bf16: one 64-byte store of both, rounded
// together by to_bf16x32).
static inline void store_act32(void *p, int64_t i, const vf16 &x0, const vf16 &x1) {
#if defined(GDN_ACT_BF16)
  store_bf16x32((act_t *)p + i, x0, x1);
#else
  store_act16(p, i, x0);
  store_act16(p, i + 16, x1);
#endif
}

// e^x on 16 lanes with vector operations only (sycl::exp of a vf16 is a library call the CPU
// device's compiler may run lane by lane; the prefill's conv, 16 channels per vector, timed up
// to ~10% faster with this, near the noise, 0.2.0). x = n ln2 + r, |r| <= ln2/2
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
// A store of data nothing reads in this call (spec decoding's per-token states, a step's final
// state) to lines not in the caches: a streaming (non-temporal) store skips the read-for-ownership
// of each line, which cost the CPU device a second pass over the written bytes (recurrent kernel
// ~5.9 -> ~4.8 ms at spec S=3, B=8, 0.2.0). It needs a 64-byte aligned address:
// vstore_states_stream checks once per state.
static inline void vstore_nt(float *p, const vf16 &x) {
  __builtin_nontemporal_store(sycl::bit_cast<native_vf16>(x), (native_vf16 *)p);
}
// 32 two-byte values as ONE 64-byte streaming store. A streaming store of 16 narrowed values (32
// bytes) was folded by the compiler into a narrowing store (vpmovdw to memory), which has no
// streaming form: the hint was silently dropped (seen in the generated assembly).
static inline void store_64_nt(void *p, const native_vu16x32 &c) { __builtin_nontemporal_store(c, (native_vu16x32 *)p); }
// h0's 16 values then h1's, as one vector.
static inline native_vu16x32 join_16x2(const vu16 &h0, const vu16 &h1) {
  typedef uint16_t n16 __attribute__((ext_vector_type(16)));
  const n16 a = sycl::bit_cast<n16>(h0), b = sycl::bit_cast<n16>(h1);
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
}

// The SSM state cache (gdn_config_t.state_dtype; docs/op.md, state caches): a
// state is widened when loaded and rounded once when stored, by these helpers only.
// vstore_state2(_nt): x0 then x1 to 32 consecutive states (64 bytes for 2-byte states: one store).
#if defined(GDN_STATE_BF16)
typedef uint16_t state_t;
static inline float load_state(const state_t *p) { return bf16_to_float(*p); }
static inline void store_state(state_t *p, float f) { *p = float_to_bf16(f); }
static inline vf16 vload_state(const state_t *p) { return load_bf16x16(p); }
static inline void vstore_state(state_t *p, const vf16 &x) { store_bf16x16(p, x); }
static inline void vstore_state2_nt(state_t *p, const vf16 &x0, const vf16 &x1) { store_64_nt(p, to_bf16x32(x0, x1)); }
#elif defined(GDN_STATE_F16)
// f16 bit patterns with the scalar bit-operation conversions above; the 16-lane helpers (the
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
// cache-resident bf16 decode step (0.2.17; the streaming stores' count unchanged in the
// generated assembly of the vk and kv decode and spec builds).
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
// store to a cached line evicts it first (decode B=8 recurrent kernel 1.27 -> 1.08 ms with plain
// stores in place, 0.2.1; stores to other slots, which no cache holds, stay streaming).
static inline void vstore_states(state_t *p, const vf16 *x, int n, bool stream) {
  if (stream) {
    vstore_states_stream(p, x, n);
  } else {
    int i = 0;
    for (; i + 1 < n; i += 2) vstore_state2(p + 16 * i, x[i], x[i + 1]);
    if (i < n) vstore_state(p + 16 * i, x[i]);
  }
}

// Horizontal sum as a tree (4 dependent adds, not 16: sums sit on the token's critical path).
static inline float hsum(const vf16 &x) {
  typedef float n8 __attribute__((ext_vector_type(8)));
  typedef float n4 __attribute__((ext_vector_type(4)));
  const native_vf16 a = sycl::bit_cast<native_vf16>(x);
  const n8 b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
  const n4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
  return (c[0] + c[2]) + (c[1] + c[3]);
}

// N consecutive channels / state columns of a work-item: one float (generic kernels, GPUs) or
// one vf16 (the CPU device's variants). One algorithm body serves both through these members:
//   load             N floats at p (contiguous)
//   load_act(p,i,s)  activations i, i+s, ... (s = 1: contiguous) widened to float
//   store_act(p,i,v,s) N activations at i, i+s, ..., rounded
//   store_act_exact(p,i,v,s) the same for values loaded from act_t (no rounding; see store_act_exact)
//   at(x,l)          lane l
template <int N> struct Lanes;
template <> struct Lanes<1> {
  typedef float T;
  static T load(const float *p) { return *p; }
  static T load_act(const void *p, int64_t i, int64_t = 1) { return ::load_act(p, i); }
  static void store_act(void *p, int64_t i, const T &v, int64_t = 1) { ::store_act(p, i, v); }
  static void store_act_exact(void *p, int64_t i, const T &v, int64_t = 1) { ::store_act_exact(p, i, v); }
  static float &at(T &x, int) { return x; }
};
// 16 lanes: contiguous (step 1) as one vector, else lane by lane in a function of its own. Inline,
// the lane-by-lane forms had the compiler keep 16 lane offsets per call site live across the
// fused conv's loops (moved between stack slots every block, though a contiguous layout never
// takes them): with them inline, cache-resident bf16 decode B=8 steps through conv_decode_blocks
// took ~0.41 ms against ~0.19 (0.2.17). They take the vector BY VALUE: a
// reference to the caller's variable (a conv window column, hist[i]) let its address escape into
// the call, so the whole window lived on the stack and every token moved it through memory, even
// in a layout that never makes the call (the fused conv's loops in the generated assembly). By
// value, alternated in one process, bf16 state: a fused conv alone, cache-resident, decode B=32
// 0.135 -> 0.109 ms, spec S=3 B=8 0.155 -> 0.123 (0.2.21).
template <> struct Lanes<16> {
  typedef vf16 T;
  static T load(const float *p) { return vload(p); }
  static T load_act(const void *p, int64_t i, int64_t step = 1) {
    return step == 1 ? load_act16(p, i) : load_strided(p, i, step);
  }
  static void store_act(void *p, int64_t i, const T &v, int64_t step = 1) {
    if (step == 1) store_act16(p, i, v); else store_strided(p, i, v, step);
  }
  static void store_act_exact(void *p, int64_t i, const T &v, int64_t step = 1) {
    if (step == 1) store_act16_exact(p, i, v); else store_strided_exact(p, i, v, step);
  }
  static float &at(T &x, int l) { return x[l]; }

 private:
  __attribute__((noinline)) static T load_strided(const void *p, int64_t i, int64_t step) {
    vf16 r;
    for (int l = 0; l < 16; ++l) r[l] = ::load_act(p, i + l * step);
    return r;
  }
  __attribute__((noinline)) static void store_strided(void *p, int64_t i, T v, int64_t step) {
    for (int l = 0; l < 16; ++l) ::store_act(p, i + l * step, v[l]);
  }
  __attribute__((noinline)) static void store_strided_exact(void *p, int64_t i, T v, int64_t step) {
    for (int l = 0; l < 16; ++l) ::store_act_exact(p, i + l * step, v[l]);
  }
};

static inline float silu(float x) { return x / (1.0f + sycl::exp(-x)); }
static inline vf16 silu(vf16 x) { return x / (1.0f + exp16(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + sycl::exp(-x)); }
static inline float softplus(float x) { return x > 20.0f ? x : sycl::log1p(sycl::exp(x)); }

// Global row of the j-th token of a group (non-spec or spec): identity when no index array.
static inline int64_t global_row(const int32_t *token_indx, int32_t j) {
  return token_indx ? (int64_t)token_indx[j] : (int64_t)j;
}

// The compact tokens [j0, j0 + len) of sequence seq of a token group of num_tokens tokens, from its
// start locations clamped into [0, num_tokens] (the end not before the start), len at most
// max_len (spec sequences: 1 + num_spec). Whatever start locations a call brings
// (GDN_VALIDATE_COUNTS reads none back), a sequence's tokens are tokens of its group: no kernel
// walks outside the group's rows, a spec sequence outside its row of slots.
struct SeqSpan {
  int32_t j0, len;
};
static inline SeqSpan seq_span(const int32_t *qsl, int32_t seq, int32_t num_tokens, int32_t max_len) {
  const int32_t j0 = sycl::clamp(qsl[seq], 0, num_tokens);
  return {j0, sycl::min(sycl::clamp(qsl[seq + 1], j0, num_tokens) - j0, max_len)};
}

// The block checkpoints of a non-spec sequence (gdn_xpu.h "State caches"), walked token by token
// in ascending order: after(t) is the slot to store the state after token t (0-based in the step)
// to, pad_slot_id when t is no boundary or its checkpoint is not stored. One comparison per
// token; the divisions happen once, in checkpoints(). The range check keeps a call under
// GDN_VALIDATE_COUNTS inside the checkpoint row whatever the metadata says.
struct Checkpoints {
  const int32_t *row;  // the sequence's checkpoint slots, null: none
  int64_t next, k;     // the next boundary token and its index among the step's boundaries
  int64_t interval;
  int32_t cols, pad;
  int32_t after(int64_t t) {
    if (!row || t != next) return pad;
    const int32_t slot = k >= 0 && k < cols ? row[k] : pad;
    next += interval, ++k;
    return slot;
  }
};
// The walk of sequence seq from its token t0 on; start = tokens already in its state.
static inline Checkpoints checkpoints(const GdnSlotUse &u, int32_t seq, int64_t start, int64_t t0, int32_t pad) {
  Checkpoints w{nullptr, -1, 0, u.ckpt_interval, u.ckpt_cols, pad};
  if (u.ckpt_interval <= 0 || !u.ckpt_indices) return w;
  const int64_t I = u.ckpt_interval, m = (start + t0 + I) / I;  // first boundary: (start + t + 1) = m I, t >= t0
  w.row = u.ckpt_indices + (int64_t)seq * u.ckpt_cols;
  w.next = m * I - start - 1;
  w.k = m - start / I - 1;
  return w;
}

static inline sycl::nd_item<1> item1() { return sycl::ext::oneapi::this_work_item::get_nd_item<1>(); }
static inline sycl::nd_item<2> item2() { return sycl::ext::oneapi::this_work_item::get_nd_item<2>(); }
