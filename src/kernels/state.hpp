// state.hpp — the SSM state cache's element type (device code, compiled at run time): chosen per
// build with -DGDN_STATE_BF16 / -DGDN_STATE_F16 (default f32) by the kernels that load or store
// ssm_state; scalar and 16-lane loads and stores, plain and streaming.
#pragma once
#include "dtype.hpp"
#include "vec16.hpp"

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
