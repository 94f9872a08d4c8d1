// delta_recurrent_kv_cpu.hpp — the CPU device's recurrent walks in the kv layout [.., K, V]
// (gdn_recurrent_kv_cpu and gdn_fused_cpu, delta_recurrent_cpu.cpp). A work-item owns 16 NV
// consecutive state columns, NV = gdn_kv_cpu_vecs(V) (params.hpp): whole rows when V = 128,
// s[k][j] = S[k, v+16j ..]. With d = e^g: u = beta (v - d S^T k), S' = d S + k u^T,
// o = d S^T q + u (k.q); with a decay per state row (GDN_CHANNEL_GATE, d_k = e^{g_k}, D = Diag(d)):
// u = beta (v - S^T (d k)), S' = D S + k u^T, o = S^T (d q) + u (k.q), row k's decay a scalar
// beside its k_k. A column's u needs every row of the state, so a kv walk cannot go row by
// row as the vk f32 walk does: walks of up to GDN_WALK_TOKENS tokens (decode, spec decoding,
// short recurrent prefills) take the WY form, walk_columns_kv_wy; longer ones hold the block,
// walk_columns_kv.
// Why NV vectors, whole rows: a walk reads and writes NV*64 contiguous bytes of each of the K
// state rows, and the NV column vectors are NV independent FMA chains. With one vector (64 bytes
// a row) the kv layout took ~1.6x the vk layout's time at spec S=3, bound by that access pattern,
// not by instructions. Half rows cost too: two work-items on alternate 256-byte halves of every
// 512-byte row made a decode ~50% longer, one work-item walking the two halves in turn a spec
// decode ~10% longer.
#pragma once
#include "delta_recurrent_cpu.hpp"

static_assert(!GDN_STATE_8BIT, "8-bit kv states take the generic kernel (plan.cpp: a column's scale needs all of its rows)");

// 2-byte states: a walk's last pass (the WY write pass, the held block's last update) reads no
// memory but this core's caches, so each of its rows asks for the same row and columns of the
// next head (the next walk of this work-item in gdn_fused_cpu, else likely of the next
// work-item), as the vk walks do for the rows ahead: bf16 decode and spec steps ~10% longer
// without. Not for f32 states (a head is 64 KB, the whole L1 twice over): decode 3-8% slower.
static inline bool ask_next_head(const GdnDeltaParams &p, const RecurrentSeq &rs, int32_t hv) {
  return sizeof(state_t) == 2 && rs.init && hv + 1 < p.HV;
}
static inline const state_t *next_head(const GdnDeltaParams &p, const state_t *S) { return S + (int64_t)kHeadK * p.V; }

// The held walk of the 16 NV columns from v over a sequence's tokens, for walks longer than
// GDN_WALK_TOKENS (forced-recurrent prefills): the K x 16 NV block stays in registers (on the
// stack) across the tokens, and token t's read pass applies token t-1's update and stores the
// updated row as it goes: one pass over the block per token, not three (products, update, store;
// three made f32 spec steps ~10% longer). Token 0's read pass loads the block, without a copy
// pass before it (~5% of a short spec step; the vk 16-row walk gains nothing that way and keeps
// its load loop).
template <int NV, bool SO>
static inline void walk_columns_kv(const GdnDeltaParams &p, RecurrentSeq rs, int32_t hv, int32_t v, int32_t h) {
  const state_t *S = state_column(p, rs.read_slot, hv, v);  // read only when rs.init
  vf16 s[kHeadK][NV];
  // The update of the token before (S' = d S + k u^T; GDN_CHANNEL_GATE: row k by dp[k]) and where
  // its state goes (A: none).
  float kp[kHeadK], dp[kGateK] = {1.0f};
  vf16 up[NV];
  state_t *Ap = nullptr;
  bool stream_p = false;
  for (int32_t t = 0; t < rs.len; ++t) {
    float kb[kHeadK], qb[kHeadK], decay[kGateK], beta;
    const float *kn, *qn;
    const int64_t row = token_in(p, rs, t, h, hv, kb, qb, kn, qn, decay, beta);
    const float dsum = GDN_CHANNEL_GATE ? 1.0f : decay[0];  // the decay of the sums (per row: in the products)
    const int64_t vrow = v_index(p, rs, row, hv, v);
    const int64_t orow = row * p.out_stride + (int64_t)hv * p.V + v;
    const float kdotq = SO ? 0.0f : dot_kd(kn, qn);
    vf16 ak[NV], aq[NV], u[NV];
    for (int j = 0; j < NV; ++j) ak[j] = aq[j] = vf16(0.0f);
    for (int k = 0; k < kHeadK; ++k) {
      const float kd = GDN_CHANNEL_GATE ? kn[k] * decay[k] : kn[k];
      const float qd = GDN_CHANNEL_GATE && !SO ? qn[k] * decay[k] : qn[k];
      for (int j = 0; j < NV; ++j) {  // row k of the block before the token
        if (t == 0) s[k][j] = rs.init ? vload_state(S + k * p.V + 16 * j) : vf16(0.0f);
        else s[k][j] = held_update(s[k][j], dp[GDN_CHANNEL_GATE ? k : 0], up[j] * kp[k]);
        ak[j] = sycl::fma(s[k][j], vf16(kd), ak[j]);
        if constexpr (!SO) aq[j] += s[k][j] * qd;
      }
      if (Ap) vstore_states(Ap + k * p.V, s[k], NV, stream_p);
    }
    for (int j = 0; j < NV; ++j) {
      u[j] = beta * sycl::fma(vf16(-dsum), ak[j], v_at16(p, rs, vrow + 16 * j));
      if constexpr (!SO) store_act16(p.out, orow + 16 * j, dsum * aq[j] + u[j] * kdotq);
    }
    // Applied by the next token's read pass, or after the walk; the state after the token goes
    // to its store slot (a spec write-back or a checkpoint). Nothing in this call reads the
    // stored states again: streaming stores unless in place.
    const int32_t to = token_store_slot(rs, t);
    for (int k = 0; k < kHeadK; ++k) kp[k] = kn[k];
    for (int j = 0; j < NV; ++j) up[j] = u[j];
    for (int c = 0; c < kGateK; ++c) dp[c] = decay[c];
    Ap = slot_state(p, to, hv, v), stream_p = streaming_to(rs, to);
  }
  // The last token's update, also to the walk's final slot (a non-spec sequence's, a replay's).
  state_t *const B = slot_state(p, rs.final_slot, hv, v);
  const bool ahead = ask_next_head(p, rs, hv);
  for (int k = 0; k < kHeadK; ++k) {
    if (ahead) prefetch_states(next_head(p, S) + k * p.V, 16 * NV);
    for (int j = 0; j < NV; ++j) s[k][j] = held_update(s[k][j], dp[GDN_CHANNEL_GATE ? k : 0], up[j] * kp[k]);
    if (Ap) vstore_states(Ap + k * p.V, s[k], NV, stream_p);
    if (B) vstore_states(B + k * p.V, s[k], NV, streaming_to(rs, rs.final_slot));
  }
}

// The kv walk of up to GDN_WALK_TOKENS tokens (decode, spec decoding, short recurrent prefills) in
// WY form. With S the state before the walk, d_j token j's decay, D(t, i) the product of the
// decays of tokens i+1 .. t (1 when i = t) and P(t) that of tokens 0 .. t, the recurrence
// unrolls to
//   u_t = beta_t (v_t - P(t) S^T k_t - sum_{i<t} D(t, i) (k_i.k_t) u_i)
//   o_t = P(t) S^T q_t + sum_{i<=t} D(t, i) (k_i.q_t) u_i,
// so the walk reads S for the products S^T k_t and S^T q_t of every token (one pass per token,
// loads only: S stays in this core's caches after the first), solves those small triangular
// systems for the u_t (a lane is a column), and writes the L states in ONE pass over S, each
// element walking the tokens in a register (S_t = d_t S_{t-1} + k_t u_t^T, the held walk's update
// expression), where the held walk passes over its block once per token, storing it back each
// time. Products of decays only, never ratios: a decay of 0 (g = -inf, docs/op.md, non-finite
// gates) zeroes every term across it, as the token-by-token walk does. With a decay per state row
// (GDN_CHANNEL_GATE) D(t, i) and P(t) are diagonal, one product per key channel: P(t) S^T k_t is
// S^T (P(t) k_t) and D(t, i) (k_i.k_t) is (D(t, i) k_i).k_t, the same walk otherwise (K products
// per coefficient: L(L+1)/2 of them, few beside the state's passes). The u and o differ from the
// held walk's by the summation order: rounding only, the coefficients being bounded (|k_i.k_t| <= 1
// for l2-normalized k and q, decays in [0, 1]). The held walk made spec steps ~10-20% longer.
// One token (a decode)
// reads the block twice, for its products and then from this core's caches for the write pass
// (holding the block spilled it through the stack). A decode walk of its own took the same time,
// and the build compiles faster from cold without one.
template <int NV, bool SO>
static inline void walk_columns_kv_wy(const GdnDeltaParams &p, RecurrentSeq &rs, const PreparedTokens &pt, int32_t hv,
                                      int32_t v) {
  const state_t *S = state_column(p, rs.read_slot, hv, v);  // read only when rs.init
  const int32_t L = pt.n;
  // ck[t][i] = D(t, i) k_i.k_t (i < t), cq[t][i] = D(t, i) k_i.q_t (i <= t), P[t] = P(t) (kGateK values).
  float ck[GDN_WALK_TOKENS][GDN_WALK_TOKENS], cq[GDN_WALK_TOKENS][GDN_WALK_TOKENS], P[GDN_WALK_TOKENS][kGateK];
  for (int32_t t = 0; t < L; ++t) {
    if constexpr (GDN_CHANNEL_GATE) {
      float D[kHeadK];  // D(t, i), per key channel
      for (int k = 0; k < kHeadK; ++k) D[k] = 1.0f;
      for (int32_t i = t; i >= 0; --i) {
        if (i < t) ck[t][i] = dot_kd_w(pt.kn[i], D, pt.kn[t]);
        if constexpr (!SO) cq[t][i] = dot_kd_w(pt.kn[i], D, pt.qn[t]);
        for (int k = 0; k < kHeadK; ++k) D[k] *= pt.decay[i][k];
      }
      for (int k = 0; k < kHeadK; ++k) P[t][k] = D[k];
    } else {
      P[t][0] = t ? P[t - 1][0] * pt.decay[t][0] : pt.decay[t][0];
      float D = 1.0f;
      for (int32_t i = t; i >= 0; --i) {
        if (i < t) ck[t][i] = D * dot_kd(pt.kn[i], pt.kn[t]);
        if constexpr (!SO) cq[t][i] = D * dot_kd(pt.kn[i], pt.qn[t]);
        D *= pt.decay[i][0];
      }
    }
  }
  vf16 u[GDN_WALK_TOKENS][NV];
  for (int32_t t = 0; t < L; ++t) {
    vf16 a[NV], b[NV];  // S^T k_t, S^T q_t (GDN_CHANNEL_GATE: S^T (P(t) k_t), S^T (P(t) q_t))
    const float Pt = GDN_CHANNEL_GATE ? 1.0f : P[t][0];  // P(t) of the sums (per row: in the products)
    for (int j = 0; j < NV; ++j) a[j] = b[j] = vf16(0.0f);
    if (rs.init)
      for (int k = 0; k < kHeadK; ++k) {
        const float kk = GDN_CHANNEL_GATE ? P[t][k] * pt.kn[t][k] : pt.kn[t][k];
        const float qk = GDN_CHANNEL_GATE && !SO ? P[t][k] * pt.qn[t][k] : pt.qn[t][k];
        for (int j = 0; j < NV; ++j) {
          const vf16 x = vload_state(S + k * p.V + 16 * j);
          a[j] = sycl::fma(x, vf16(kk), a[j]);
          if constexpr (!SO) b[j] += x * qk;
        }
      }
    const int64_t vrow = v_index(p, rs, pt.row[t], hv, v);
    const int64_t orow = pt.row[t] * p.out_stride + (int64_t)hv * p.V + v;
    for (int j = 0; j < NV; ++j) {
      vf16 w = sycl::fma(vf16(-Pt), a[j], v_at16(p, rs, vrow + 16 * j));
      for (int32_t i = 0; i < t; ++i) w = sycl::fma(vf16(-ck[t][i]), u[i][j], w);
      u[t][j] = pt.beta[t] * w;
      if constexpr (!SO) {
        vf16 o = Pt * b[j];
        for (int32_t i = 0; i <= t; ++i) o += cq[t][i] * u[i][j];
        store_act16(p.out, orow + 16 * j, o);
      }
    }
  }
  // Where each state goes (a spec write-back or a checkpoint; the last state also to the walk's
  // final slot). Nothing in this call reads them again: streaming stores unless in place.
  state_t *A[GDN_WALK_TOKENS];
  bool stream_a[GDN_WALK_TOKENS];
  for (int32_t t = 0; t < L; ++t) {
    const int32_t to = token_store_slot(rs, t);
    A[t] = slot_state(p, to, hv, v);
    stream_a[t] = streaming_to(rs, to);
  }
  state_t *const B = slot_state(p, rs.final_slot, hv, v);
  const bool stream_b = streaming_to(rs, rs.final_slot);
  const bool ahead = ask_next_head(p, rs, hv);
  for (int k = 0; k < kHeadK; ++k) {
    if (ahead) prefetch_states(next_head(p, S) + k * p.V, 16 * NV);
    vf16 s[NV];
    for (int j = 0; j < NV; ++j) s[j] = rs.init ? vload_state(S + k * p.V + 16 * j) : vf16(0.0f);
    for (int32_t t = 0; t < L; ++t) {
      const float d = pt.decay[t][GDN_CHANNEL_GATE ? k : 0], kk = pt.kn[t][k];
      for (int j = 0; j < NV; ++j) s[j] = held_update(s[j], d, u[t][j] * kk);
      if (A[t]) vstore_states(A[t] + k * p.V, s, NV, stream_a[t]);
    }
    if (B) vstore_states(B + k * p.V, s, NV, stream_b);
  }
}

// The walk of the 16 NV columns from v in the form of RecurrentSeq.form_len (a replay walks as the
// walk whose states it reproduces), state only (SO: a replay's tokens, whose q products and
// outputs nobody reads) or with outputs: the two instances round every state alike (the products
// the state depends on are explicit FMAs, held_update).
template <int NV, bool SO>
static inline void columns_kv(const GdnDeltaParams &p, RecurrentSeq &rs, int32_t hv, int32_t v) {
  const int32_t h = hv / (p.HV / p.H);
  if (rs.form_len <= GDN_WALK_TOKENS) {
    PreparedTokens pt;
    pt.prepare(p, rs, h, hv);
    walk_columns_kv_wy<NV, SO>(p, rs, pt, hv, v);
  } else {
    constexpr int NW = kHeadK <= 128 || NV < GDN_KV_VECS ? NV : GDN_KV_VECS;
    for (int j = 0; j < NV; j += NW) walk_columns_kv<NW, SO>(p, rs, hv, v + 16 * j, h);
  }
}

// The 16 NV columns from v of (seq, hv): walks of up to GDN_WALK_TOKENS tokens (a replay: of a
// walk of up to that many, RecurrentSeq.form_len) in WY form; longer walks held, all NV vectors at
// once while that block is at most 64 KB (K <= 128), else GDN_KV_VECS vectors at a time (rs
// copied: each walk advances its own checkpoints).
template <int NV>
static inline void recurrent_columns_kv(const GdnDeltaParams &p, int32_t seq, int32_t hv, int32_t v) {
  RecurrentSeq rs;
  if (!recurrent_seq(p, seq, &rs)) return;
  if (rs.skip) {
    for (int32_t l = 0; l < 16 * NV; ++l) zero_outputs(p, rs.j0, rs.len, hv, v + l);
    return;
  }
  if (rs.len == 0) return copy_state(p, rs, hv, v, 16 * NV);  // a replay with nothing to replay
  ring_item(p, rs, hv, v, 16 * NV);
  if (GDN_WITH_REPLAY && rs.ring_in) columns_kv<NV, true>(p, rs, hv, v);
  else columns_kv<NV, false>(p, rs, hv, v);
}

// The state columns of a work-item: 16 gdn_kv_cpu_vecs(V) from v of (seq, hv).
static inline int32_t item_span(const GdnDeltaParams &p) { return 16 * gdn_kv_cpu_vecs(p.V); }
GDN_NOINLINE void recurrent_item(const GdnDeltaParams &p, int32_t seq, int32_t hv, int32_t v) {
  const int32_t nv = gdn_kv_cpu_vecs(p.V);
  if (nv == GDN_KV_ROW_VECS) recurrent_columns_kv<GDN_KV_ROW_VECS>(p, seq, hv, v);
  else if (nv == GDN_KV_VECS) recurrent_columns_kv<GDN_KV_VECS>(p, seq, hv, v);
  else recurrent_columns_kv<1>(p, seq, hv, v);
}
