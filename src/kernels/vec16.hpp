// vec16.hpp — the CPU-device variants' 16-lane vectors (device code, compiled at run time): loads
// and stores of floats, activations and bf16 / f16 values as whole vectors, streaming stores,
// prefetches, the horizontal sum; and Lanes<N>, one algorithm body for 1 lane (generic kernels) or 16.
#pragma once
#include <sycl/bit_cast.hpp>
#include <sycl/half_type.hpp>
#include <sycl/multi_ptr.hpp>
#include <sycl/vector.hpp>
#include <stdint.h>
#include "dtype.hpp"

// Work-items of the CPU-device kernels (*_cpu.cpp) hold 16 lanes (channels, state columns) in one vector.
typedef sycl::vec<float, 16> vf16;
// CPU-device kernels (*_cpu): a work-item computes on 16-wide vectors itself, so the CPU
// runtime's compiler must not also vectorize the kernel ACROSS work-items (16 x vf16 = 256-lane
// code: seconds to tens of seconds of register allocation per kernel at build time, and lane-by-lane
// gathers at run time). Its back end leaves a kernel scalar when the kernel never asks for a
// work-item id (no get_global_id / get_local_id / sub-group or group functions: no work-group
// loop to vectorize), so every *_cpu kernel runs in work-groups of ONE work-item and takes its
// coordinates from GROUP ids only (get_group(d) == get_global_id(d) with local size 1, so the
// meaning is the same on any device). Vectorized across work-items, the demo's CPU kernels took
// over ten times the back-end time (docs/design.md, "Generic kernels and CPU variants").

// Asks for the bytes [p, p + n), n > 0, to be brought into this core's caches, without waiting for them
// (prefetcht0 on each 64-byte line they touch; never faults). On an x86-64 host (GDN_CPU_X86,
// plan.cpp: the CPU-variant builds) the instructions inline -- a fixed count, unrolled where n is
// known, then the last byte's line for a span not line-aligned; else the CPU runtime's
// __cpu_lprefetch, a call looping the same instruction, after which the callers reload the
// vectors the call may clobber (the call made a cache-resident bf16 decode step ~14% longer).
// (Register operands only: a memory operand does not link through SPIR-V.)
static inline void prefetch_bytes(const void *p, size_t n) {
#if defined(GDN_CPU_X86)
  const char *first = (const char *)p;
  for (size_t o = 0; o < n; o += 64) asm volatile("prefetcht0 (%0)" : : "r"(first + o));
  asm volatile("prefetcht0 (%0)" : : "r"(first + n - 1));
#else
  sycl::address_space_cast<sycl::access::address_space::global_space, sycl::access::decorated::no>((const char *)p).prefetch(n);
#endif
}
// ... the one line holding the byte at p.
static inline void prefetch_line(const void *p) {
#if defined(GDN_CPU_X86)
  asm volatile("prefetcht0 (%0)" : : "r"(p));
#else
  prefetch_bytes(p, 1);
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
  // test of the magnitude took an AND besides, and bf16 steps ~4% longer). A blend by bit masks:
  // sycl::select on the CPU device went lane by lane. Kept NaN: rounding adds up to 0x8000,
  // which carries a NaN's all-ones low bits into the sign (0x7fffffff -> -0;
  // test_bf16_store_keeps_nan_payloads).
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
// through SPIR-V: sycl::ext::oneapi::bfloat16 is not usable, dtype.hpp.) No test for denormal inputs
// before it: two vfpclassps and a branch per pair cost ~9% of a cache-resident bf16 decode step,
// for values that cannot occur.
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
#elif defined(GDN_ACT_F16) && defined(GDN_CPU_F16_INSN)
// f16 by AVX-512's conversions (GDN_CPU_F16_INSN, make_plan: a host with AVX512F), one instruction
// each way; lane by lane they are scalar bit operations (dtype.hpp), ~20 instructions a lane. The
// same bits as those -- f16 subnormals and the CPU builds' denormals-are-zero included -- except a
// NaN's, whose payload the instruction keeps in part: the store sets NaN lanes to float_to_f16's
// 0x7e00 and sign (test_f16_instructions_keep_the_scalar_bits). Assembly, not sycl::half: a kernel
// using sycl::half needs the fp16 aspect (dtype.hpp).
static inline vf16 load_act16(const void *p, int64_t i) {
  native_vu16x16 h;
  __builtin_memcpy(&h, (const act_t *)p + i, sizeof(h));
  native_vf16 r;
  asm("vcvtph2ps %1, %0" : "=v"(r) : "v"(h));
  return sycl::bit_cast<vf16>(r);
}
static inline void store_act16(void *p, int64_t i, const vf16 &v) {
  const native_vf16 f = sycl::bit_cast<native_vf16>(v);
  native_vu16x16 h;
  asm("vcvtps2ph $0, %1, %0" : "=v"(h) : "v"(f));
  const native_vu16x16 nan = __builtin_convertvector(f != f, native_vu16x16);  // all-ones where NaN
  h = (h & ~nan) | (((h & 0x8000) | 0x7e00) & nan);
  __builtin_memcpy((act_t *)p + i, &h, sizeof(h));
}
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

// A store of data nothing reads in this call (spec decoding's per-token states, a step's final
// state) to lines not in the caches: a streaming (non-temporal) store skips the read-for-ownership
// of each line, which cost the CPU device a second pass over the written bytes (a spec decode's
// recurrent kernel ~20% longer). It needs a 64-byte aligned address:
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
// takes them): with them inline, cache-resident bf16 decode steps through conv_decode_blocks
// took more than twice as long. They take the vector BY VALUE: a
// reference to the caller's variable (a conv window column, hist[i]) let its address escape into
// the call, so the whole window lived on the stack and every token moved it through memory, even
// in a layout that never makes the call (the fused conv's loops in the generated assembly): a
// cache-resident fused conv ~25% longer by reference.
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
