// delta_recurrent.hpp — the token recurrence over NL state columns of one (sequence, v-head):
// S[:, v .. v+NL-1] in registers (the generic kernel: NL = 1, one column per work-item, any
// layout; the CPU device's variants, one per layout, are in delta_recurrent_cpu.cpp). Per token:
//   S = e^g S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
#pragma once
#include "delta.hpp"

template <int NL>
static inline void recurrent_columns(const GdnDeltaParams &p, int32_t seq, int32_t hv, int32_t v) {
  typedef Lanes<NL> L;
  typedef typename L::T lane_t;
  static_assert(NL == 1 || !GDN_VK_LAYOUT, "vector lanes need contiguous columns (kv layout)");
  RecurrentSeq r;
  if (!recurrent_seq(p, seq, &r)) return;
  if (r.skip) {
    for (int32_t l = 0; l < NL; ++l) zero_outputs(p, r.j0, r.len, hv, v + l);
    return;
  }
  const int32_t h = hv / (p.HV / p.H);
  lane_t s[KD];
  if (r.init) {
    const state_t *S = state_column(p, r.read_slot, hv, v);
    for (int k = 0; k < KD; ++k) s[k] = L::load_state(S + k * K_STRIDE);
  } else {
    for (int k = 0; k < KD; ++k) s[k] = lane_t(0.0f);
  }
  for (int32_t t = 0; t < r.len; ++t) {
    const int64_t row = global_row(p.token_indx, r.j0 + t);
    const float *kn = p.kn + (row * p.H + h) * KD, *qn = p.qn + (row * p.H + h) * KD;
    const float decay = sycl::exp(p.g[row * p.HV + hv]), beta = p.beta[row * p.HV + hv];
    const lane_t vv = L::load_act(p.qkv, row * p.qkv_stride + p.v_offset + (int64_t)hv * p.V + v);
    lane_t kv(0.0f);
    for (int k = 0; k < KD; ++k) {
      s[k] *= decay;
      kv += s[k] * kn[k];
    }
    const lane_t u = beta * (vv - kv);
    lane_t o(0.0f);
    for (int k = 0; k < KD; ++k) {
      s[k] += u * kn[k];
      o += s[k] * qn[k];
    }
    L::store_act(p.out, row * p.out_stride + (int64_t)hv * p.V + v, o);
    const int32_t to = token_store_slot(r, t);  // spec write-back or block checkpoint
    if (to != p.pad_slot_id) {
      state_t *S = state_column(p, to, hv, v);
      for (int k = 0; k < KD; ++k) L::store_state(S + k * K_STRIDE, s[k]);
    }
  }
  if (!r.spec) {
    state_t *S = state_column(p, r.cols[0], hv, v);
    for (int k = 0; k < KD; ++k) L::store_state(S + k * K_STRIDE, s[k]);
  }
}
