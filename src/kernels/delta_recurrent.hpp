// delta_recurrent.hpp — the token recurrence over one state column of one (sequence, v-head):
// S[:, v] in registers (the generic kernel: one column per work-item, any layout; the CPU
// device's variants, one per layout, are in delta_recurrent_cpu.cpp). Per token:
//   S = e^g S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
#pragma once
#include "delta.hpp"

static inline void recurrent_column(const GdnDeltaParams &p, int32_t seq, int32_t hv, int32_t v) {
  RecurrentSeq r;
  if (!recurrent_seq(p, seq, &r)) return;
  if (r.skip) {
    zero_outputs(p, r.j0, r.len, hv, v);
    return;
  }
  const int32_t h = hv / (p.HV / p.H);
  float s[KD];
  if (r.init) {
    const state_t *S = state_column(p, r.read_slot, hv, v);
    for (int k = 0; k < KD; ++k) s[k] = load_state(S + k * K_STRIDE);
  } else {
    for (int k = 0; k < KD; ++k) s[k] = 0.0f;
  }
  for (int32_t t = 0; t < r.len; ++t) {
    const int64_t row = global_row(p.token_indx, r.j0 + t);
    const float *kn = p.kn + (row * p.H + h) * KD, *qn = p.qn + (row * p.H + h) * KD;
    const float decay = sycl::exp(p.g[row * p.HV + hv]), beta = p.beta[row * p.HV + hv];
    const float vv = load_act(p.qkv, row * p.qkv_stride + p.v_offset + (int64_t)hv * p.V + v);
    float kv = 0.0f;
    for (int k = 0; k < KD; ++k) {
      s[k] *= decay;
      kv += s[k] * kn[k];
    }
    const float u = beta * (vv - kv);
    float o = 0.0f;
    for (int k = 0; k < KD; ++k) {
      s[k] += u * kn[k];
      o += s[k] * qn[k];
    }
    store_act(p.out, row * p.out_stride + (int64_t)hv * p.V + v, o);
    const int32_t to = token_store_slot(r, t);  // spec write-back or block checkpoint
    if (to != p.pad_slot_id) {
      state_t *S = state_column(p, to, hv, v);
      for (int k = 0; k < KD; ++k) store_state(S + k * K_STRIDE, s[k]);
    }
  }
  if (!r.spec) {
    state_t *S = state_column(p, r.cols[0], hv, v);
    for (int k = 0; k < KD; ++k) store_state(S + k * K_STRIDE, s[k]);
  }
}
