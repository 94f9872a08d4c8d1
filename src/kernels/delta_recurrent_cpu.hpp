// delta_recurrent_cpu.hpp — what the CPU device's recurrent walks of both ssm layouts share: a
// walk's tokens (prepared by the prep kernel or here), where its states go, and how they are
// stored and asked for. The walks are in delta_recurrent_kv_cpu.hpp and delta_recurrent_vk_cpu.hpp,
// the kernels in delta_recurrent_cpu.cpp (one run-time build, which includes one layout's walks).
#pragma once
#include "delta_prep.hpp"

// A work-item's walk (recurrent_item, one per layout) is ONE function both kernels of this build
// call (gdn_recurrent_*_cpu and gdn_fused_cpu), not an inlined copy in each: an inlined copy
// doubled the build's back-end time (a cold compile at K = 128 over twice as long).
#define GDN_NOINLINE static __attribute__((noinline))

// Whether a store of this walk's state to slot `to` streams: not when it is in place, to the slot
// the walk read its initial state from, whose lines are still in this core's caches
// (vstore_states: plain stores there).
static inline bool streaming_to(const RecurrentSeq &rs, int32_t to) { return !(rs.init && to == rs.read_slot); }

// Asks for the n states from p to be brought into this core's caches, without waiting for them
// (prefetch_bytes, vec16.hpp: prefetcht0 inline on an x86-64 host).
static inline void prefetch_states(const state_t *p, size_t n) { prefetch_bytes(p, n * sizeof(state_t)); }

// A token's kGateK decays e^g from its log-decays g: as vectors for KDA's K (exp16_ieee), else sycl::exp.
static inline void token_decays(const float *g, float *decay) {
  if (kGateK % 16 == 0)
    for (int c = 0; c < kGateK; c += 16) vstore(decay + c, exp16_ieee(vload(g + c)));
  else
    for (int c = 0; c < kGateK; ++c) decay[c] = sycl::exp(g[c]);
}

// Token t of the walk, for k-head h and v-head hv: returns its global row; kn, qn point to its
// l2-normalized k and q (kHeadK floats each), decay[0 .. kGateK) = e^g (GDN_CHANNEL_GATE: one per key
// channel, i.e. per state row k), beta. They are the prep kernel's outputs,
// or, when the call launched no gdn_prep (p.prep_inline: no chunk kernels in it, K % 16 == 0),
// prepared here from the conv output into kb, qb with the prep kernel's own arithmetic
// (delta_prep.hpp: prep_qk16, and the gates as prep_gates computes them). Every walk takes its
// tokens through this. Out-parameters, not a returned struct: the struct form ran 1.5x slower.
static inline int64_t token_in(const GdnDeltaParams &p, const RecurrentSeq &rs, int32_t t, int32_t h, int32_t hv,
                               float *kb, float *qb, const float *&kn, const float *&qn, float *decay, float &beta) {
  if (GDN_WITH_REPLAY && rs.ring_in) {  // a replay (GDN_REPLAY_APPLY): ring entry t; no q (k stands in), no outputs
    const float *e = rs.ring_in + (int64_t)t * p.ring_floats;
    kn = qn = e + h * kHeadK;
    token_decays(e + ring_g(p, hv), decay);  // (the decays of the walk that wrote the entry, below)
    beta = e[ring_beta(p, hv)];
    return t;
  }
  const int64_t row = global_row(p.token_indx, rs.j0 + t);
  float g[kGateK];
  if (kHeadK % 16 == 0 && p.prep_inline) {
    vf16 k[kHeadK / 16 + (kHeadK % 16 != 0)], q[kHeadK / 16 + (kHeadK % 16 != 0)];
    prep_qk16(p.prep, row, h, q, k);
    for (int c = 0; c < kHeadK / 16; ++c) {
      vstore(kb + 16 * c, k[c]);
      vstore(qb + 16 * c, q[c]);
    }
    kn = kb, qn = qb;
    if (kGateK % 16 == 0)  // (KDA: as gdn_prep_cpu computes them)
      for (int c = 0; c < kGateK; c += 16) vstore(g + c, gate_g16(p.prep, row, hv * kGateK + c));
    else
      for (int c = 0; c < kGateK; ++c) g[c] = gate_g(p.prep, row, hv * kGateK + c);
    beta = gate_beta(p.prep, row, hv);
  } else {
    kn = p.kn + (row * p.H + h) * kHeadK, qn = p.qn + (row * p.H + h) * kHeadK;
    for (int c = 0; c < kGateK; ++c) g[c] = p.g[(row * p.HV + hv) * kGateK + c];
    beta = p.beta[row * p.HV + hv];
  }
  token_decays(g, decay);
  if (GDN_WITH_REPLAY && rs.ring_out) {  // replay mode's walk: the token's inputs to the ring (RecurrentSeq)
    if (rs.ring_k)
      for (int k = 0; k < kHeadK; ++k) rs.ring_out[(int64_t)t * p.ring_floats + h * kHeadK + k] = kn[k];
    ring_write_v(p, rs, t, row, hv, g, beta);
  }
  return row;
}

// v of the 16 columns from index i (v_index).
static inline vf16 v_at16(const GdnDeltaParams &p, const RecurrentSeq &rs, int64_t i) {
  return rs.ring_in ? vload(rs.ring_in + i) : load_act16(p.qkv, i);
}

// Replay mode: the item's columns [v, v + n) of (seq, hv) take ring writes (RecurrentSeq).
static inline void ring_item(const GdnDeltaParams &p, RecurrentSeq &rs, int32_t hv, int32_t v, int32_t n) {
  rs.ring_v0 = v, rs.ring_vn = sycl::min(n, p.V - v), rs.ring_k = v == 0 && hv % (p.HV / p.H) == 0;
}

// The replay of a sequence with nothing to replay and another read slot (RecurrentSeq, len 0):
// the item's state columns [v, v + n) of the read slot (zeros: none) to the committed slot.
static inline void copy_state(const GdnDeltaParams &p, const RecurrentSeq &rs, int32_t hv, int32_t v, int32_t n) {
  for (int32_t j = v; j < sycl::min(p.V, v + n); ++j) {
    const state_t *S = state_column(p, rs.read_slot, hv, j);
    state_t *D = state_column(p, rs.final_slot, hv, j);
    for (int k = 0; k < kHeadK; ++k) D[k * k_stride(p)] = rs.init ? S[k * k_stride(p)] : state_t(0);
  }
}

// S' = d S + xy: every walk's state update, one explicit FMA over the rounded product xy. Left to
// -ffp-contract=fast the compiler contracts either product, differently at different places (a
// held walk updates in the next token's read pass and after its last token) and in different
// instances, and a replay (gdn_xpu.h "Replay mode"), whose walk ends where the per-token mode's
// continued and runs in the walk's state-only instance, must round each state as the per-token
// walk did. The products a state depends on (S^T k, k.k, u) are explicit FMAs for the same reason.
static inline vf16 held_update(const vf16 &s, float d, const vf16 &xy) { return sycl::fma(s, vf16(d), xy); }
// ... with a decay per lane (GDN_CHANNEL_GATE in the vk layout: a state row's 16 key channels).
static inline vf16 held_update(const vf16 &s, const vf16 &d, const vf16 &xy) { return sycl::fma(s, d, xy); }

// The state of (slot, hv) from column / row v (state_column), nullptr for pad_slot_id: where a
// walk stores a state.
static inline state_t *slot_state(const GdnDeltaParams &p, int32_t slot, int32_t hv, int32_t v) {
  return !gdn_is_pad(slot, p.pad_slot_id) ? state_column(p, slot, hv, v) : nullptr;
}

// a . b over kHeadK floats (l2-normalized k and q: |a . b| <= 1).
static inline float dot_kd(const float *a, const float *b) {
  if (kHeadK % 16 == 0) {
    vf16 x(0.0f);
    for (int c = 0; c < kHeadK / 16; ++c) x = sycl::fma(vload(a + 16 * c), vload(b + 16 * c), x);
    return hsum(x);
  }
  float x = 0.0f;
  for (int k = 0; k < kHeadK; ++k) x = sycl::fma(a[k], b[k], x);
  return x;
}
// (a * w) . b over kHeadK floats, the rounded products a * w as the FMAs' factors (GDN_CHANNEL_GATE:
// w a key channel's decays, in [0, 1]).
static inline float dot_kd_w(const float *a, const float *w, const float *b) {
  if (kHeadK % 16 == 0) {
    vf16 x(0.0f);
    for (int c = 0; c < kHeadK / 16; ++c) x = sycl::fma(vload(a + 16 * c) * vload(w + 16 * c), vload(b + 16 * c), x);
    return hsum(x);
  }
  float x = 0.0f;
  for (int k = 0; k < kHeadK; ++k) x = sycl::fma(a[k] * w[k], b[k], x);
  return x;
}

// A walk's tokens prepared once (token_in), at most GDN_WALK_TOKENS of them: for a vk work-item's
// several passes over them (GDN_VK_ITEM_ROWS / GDN_VK_ROWS; n = 0: none, each pass prepares its
// own), and for the kv walk in WY form, which needs every token's k and q at once. With
// prep_inline each preparation normalizes k and q and computes the gates (several exp/log calls):
// done once instead of once per pass.
struct PreparedTokens {
  int32_t n;
  int64_t row[GDN_WALK_TOKENS];
  const float *kn[GDN_WALK_TOKENS], *qn[GDN_WALK_TOKENS];
  float decay[GDN_WALK_TOKENS][kGateK], beta[GDN_WALK_TOKENS];
  float kb[GDN_WALK_TOKENS][kHeadK], qb[GDN_WALK_TOKENS][kHeadK];
  void prepare(const GdnDeltaParams &p, const RecurrentSeq &rs, int32_t h, int32_t hv) {
    for (n = 0; n < rs.len; ++n) row[n] = token_in(p, rs, n, h, hv, kb[n], qb[n], kn[n], qn[n], decay[n], beta[n]);
  }
  int64_t get(int32_t t, const float *&k, const float *&q, const float *&d, float &b) const {
    k = kn[t], q = qn[t], d = decay[t], b = beta[t];
    return row[t];
  }
};
