// delta_recurrent_vk_cpu.hpp — the CPU device's recurrent walks in the vk layout [.., V, K],
// K % 16 == 0 (gdn_recurrent_vk_cpu and gdn_fused_cpu, delta_recurrent_cpu.cpp). A work-item owns
// GDN_VK_ITEM_ROWS state ROWS S[v, :] (at V = 128 the head's whole state) and walks them
// GDN_VK_ROWS = 16 at a time (K/16 vectors each): walk_rows_vk, or for f32 walks of up to
// GDN_WALK_TOKENS tokens one row at a time, walk_rows_vk_by_row. Per token and row, with d = e^g:
//   u = beta (v - d S.k),  S' = d S + u k,  o = S'.q = d S.q + u (k.q),
// so one read pass over the rows gives both dot products (k.q is shared by every row) and one pass
// updates them. The 16 rows' dot products are reduced together (row_sums: one vector, lane r =
// row r), so u, v and o are vectors too: per token ~45 shuffles and adds instead of 32 horizontal
// sums and 16 scalar u / v / o computations. With a decay per key channel (GDN_CHANNEL_GATE,
// d_k = e^{g_k}) the decays are a vector along k, as k and q are:
//   u = beta (v - S.(d k)),  S' = d * S + u k,  o = S.(d q) + u (k.q).
#pragma once
#include "delta_recurrent_cpu.hpp"

#define KC (kHeadK / 16)

static_assert(GDN_VK_ROWS == 16, "a work-item's rows are the lanes of one vector");

// Row r of the 16 rows from v0 to D (= slot_state(p, slot, hv, v0)): KC vectors, and for an 8-bit
// state the row's scale in ssm_scale (state.hpp, vstore_state_row).
static inline void store_row(const GdnDeltaParams &p, state_t *D, int32_t slot, int32_t hv, int32_t v0, int32_t r,
                             const vf16 *x, bool stream) {
  vstore_state_row(D + r * kHeadK, row_scale_dst(p, slot, hv, v0 + r), x, KC, hv, v0 + r, p.stochastic != 0, stream);
}

// r[i] = the sum of a[i]'s lanes, i = 0..15, by four rounds of pairwise folding: each round adds
// two vectors' halves into one, so lane ranges of a vector hold partial sums of several rows.
static inline vf16 row_sums(const vf16 *a) {
  native_vf16 w[8], x[4], y[2];
  for (int r = 0; r < 8; ++r) {  // w[r]: lanes 0-7 partials of row r, 8-15 of row r+8
    const native_vf16 lo = sycl::bit_cast<native_vf16>(a[r]), hi = sycl::bit_cast<native_vf16>(a[r + 8]);
    w[r] = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(lo, hi, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int r = 0; r < 4; ++r)  // x[r]: 4 lanes each of rows r, r+4, r+8, r+12
    x[r] = __builtin_shufflevector(w[r], w[r + 4], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
           __builtin_shufflevector(w[r], w[r + 4], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int r = 0; r < 2; ++r)  // y[r]: 2 lanes each of rows r, r+2, ..., r+14
    y[r] = __builtin_shufflevector(x[r], x[r + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           __builtin_shufflevector(x[r], x[r + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  return sycl::bit_cast<vf16>(  // lane r: row r
      __builtin_shufflevector(y[0], y[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
      __builtin_shufflevector(y[0], y[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31));
}

// The 16 rows' activations from index i (lane r: row r; lanes from nr on read as zero), and
// their outputs back (lanes from nr on not stored): the vk walks' v and o.
static inline vf16 load_rows(const void *p, int64_t i, int32_t nr) {
  if (nr == 16) return load_act16(p, i);
  vf16 x;
  for (int32_t r = 0; r < 16; ++r) x[r] = r < nr ? load_act(p, i + r) : 0.0f;
  return x;
}
static inline void store_rows(void *p, int64_t i, int32_t nr, const vf16 &x) {
  if (nr == 16) store_act16(p, i, x);
  else for (int32_t r = 0; r < nr; ++r) store_act(p, i + r, x[r]);
}
// The 16 rows' v from index i (v_index): the conv output's, or in a replay the ring's.
static inline vf16 v_rows(const GdnDeltaParams &p, const RecurrentSeq &rs, int64_t i, int32_t nr) {
  if (!rs.ring_in) return load_rows(p.qkv, i, nr);
  vf16 x;
  for (int32_t r = 0; r < 16; ++r) x[r] = r < nr ? rs.ring_in[i + r] : 0.0f;
  return x;
}
// The state rows of a slot from row v0 of head hv to the slot's end (this head's and the later
// heads'): how far ahead of row v0 a walk may ask for rows (prefetch_states).
static inline int32_t slot_rows_from(const GdnDeltaParams &p, int32_t hv, int32_t v0) { return (p.HV - hv) * p.V - v0; }

// The walk of 16 rows from v0 (nr of them real) over the sequence's tokens (2-byte states, and f32
// walks longer than GDN_WALK_TOKENS; other f32 walks go row by row, walk_rows_vk_by_row below), in
// one of two forms:
// HOLD (several tokens): the rows stay in registers across the tokens (on the stack, as far as
// they do not fit: 16 rows of K = 128 are 128 vectors, four times the register file), and token
// t's read pass (its two dot products) applies token t-1's update as it goes and stores the
// updated row: one pass over the held rows per token instead of three (read for the products,
// update, read again for the store; three made f32 spec steps ~6% longer). One token (a decode
// step, !HOLD): the rows are read twice, once for the two dot products and once more (from this
// core's caches by then) for the update and its store, instead of being held: the copy the
// compiler kept on the stack cost a store and two loads per vector (and a decode's recurrent
// kernel up to 1.5x its time).
template <bool HOLD, bool SO>
static inline void walk_rows_vk(const GdnDeltaParams &p, RecurrentSeq &rs, const PreparedTokens &pt, int32_t hv,
                                int32_t v0, int32_t nr, int32_t h) {
  const state_t *S = state_column(p, rs.read_slot, hv, v0);  // S[v0, 0]; read only when rs.init
  // Row r, vector c of the codes' values as stored (8-bit states: before the row's scale; zeros
  // without an initial state and past nr), row r's scale (0 there; 1 for the other dtypes), and the
  // two together: the state's values.
  auto codes_in = [&](int32_t r, int c) -> vf16 {
    return rs.init && r < nr ? vload_state(S + r * kHeadK + 16 * c) : vf16(0.0f);
  };
  auto scale_of = [&](int32_t r) { return rs.init && r < nr ? row_scale(p, rs.read_slot, hv, v0 + r) : 0.0f; };
  auto value_in = [&](int32_t r, int c) -> vf16 { return GDN_STATE_8BIT ? codes_in(r, c) * scale_of(r) : codes_in(r, c); };
  vf16 s[HOLD ? 16 : 1][KC];  // HOLD: s[r][c] = S[v0 + r, 16c .. 16c+15]; rows past nr stay zero
  if constexpr (HOLD)
    for (int32_t r = 0; r < 16; ++r)
      for (int c = 0; c < KC; ++c) s[r][c] = value_in(r, c);
  // HOLD: the update of the token before (S' = d S + u k^T; GDN_CHANNEL_GATE: d along k, dpv) and
  // where its state goes (A: none).
  vf16 kp[HOLD ? KC : 1], up(0.0f), dpv[HOLD && GDN_CHANNEL_GATE ? KC : 1];
  float dp = 1.0f;
  state_t *Ap = nullptr;
  int32_t ap_slot = p.pad_slot_id;  // Ap's slot (8-bit states: the rows' scales)
  bool stream_p = false;
  // The walk's last pass (a decode's update pass, the held rows' last update) runs from this
  // core's caches and reads no memory, which would idle through it: each of its rows asks for
  // the row walk_ahead rows on (this head's rows, or the next head's, which this work-item or the
  // one after it walks; within the slot), so the walks ahead find their rows arrived (a decode
  // ~7% longer without). How far, bf16 state: 32 rows on (the same row of the walk after next)
  // beat 16 by ~10-15%; for a one-token walk (a decode) 24 beat 32 by ~10%, where spec steps lost
  // ~1-3%: 24 rows on for a decode, 32 otherwise; 8-bit states twice as many rows, the same bytes
  // ahead. (The kv walks do the same for 2-byte states only, one head on.)
  const int32_t walk_ahead = (rs.len == 1 ? 24 : 32) * (GDN_STATE_8BIT ? 2 : 1);
  const bool ahead = rs.init && slot_rows_from(p, hv, v0) >= walk_ahead + 16;  // every row's request in the slot
  // Row r, vector c of the state before the token (HOLD: after applying the pending update).
  auto state_in = [&](int32_t t, int32_t r, int c) -> vf16 {
    if constexpr (HOLD) {
      if (t > 0)
        s[r][c] = GDN_CHANNEL_GATE ? held_update(s[r][c], dpv[c], kp[c] * up[r]) : held_update(s[r][c], dp, kp[c] * up[r]);
      return s[r][c];
    } else {
      return value_in(r, c);
    }
  };
  // An 8-bit state's one-token walk (!HOLD) takes the codes' values as they are and applies the
  // row's scale once per row, not once per vector: to the row's two sums in the read pass, and to
  // the decay factor of the update (S' = (d scale) codes + u k).
  constexpr bool ROW_SCALED = GDN_STATE_8BIT && !HOLD;
  for (int32_t t = 0; t < rs.len; ++t) {
    float kb[kHeadK], qb[kHeadK], db[kGateK], beta;
    const float *kn, *qn, *decay = db;
    const int64_t row = pt.n ? pt.get(t, kn, qn, decay, beta) : token_in(p, rs, t, h, hv, kb, qb, kn, qn, db, beta);
    const int64_t vrow = v_index(p, rs, row, hv, v0);
    const int64_t orow = row * p.out_stride + (int64_t)hv * p.V + v0;
    // GDN_CHANNEL_GATE: the decays dv along k, the products' factors d k and d q in kd, qd.
    constexpr int KG = GDN_CHANNEL_GATE ? KC : 1;
    vf16 k[KC], q[SO ? 1 : KC], kq(0.0f), dv[KG], kd[KG], qd[SO ? 1 : KG];
    const float d1 = decay[0], dsum = GDN_CHANNEL_GATE ? 1.0f : d1;  // (the sums' decay; per channel: in kd, qd)
    for (int c = 0; c < KC; ++c) {
      k[c] = vload(kn + 16 * c);
      if constexpr (GDN_CHANNEL_GATE) dv[c] = vload(decay + 16 * c), kd[c] = k[c] * dv[c];
      if constexpr (!SO) {
        q[c] = vload(qn + 16 * c);
        kq += k[c] * q[c];
        if constexpr (GDN_CHANNEL_GATE) qd[c] = q[c] * dv[c];
      }
    }
    vf16 ak[16], aq[SO ? 1 : 16];
    for (int32_t r = 0; r < 16; ++r) {
      ak[r] = vf16(0.0f);
      if constexpr (!SO) aq[r] = vf16(0.0f);
      for (int c = 0; c < KC; ++c) {
        const vf16 x = ROW_SCALED ? codes_in(r, c) : state_in(t, r, c);
        ak[r] = sycl::fma(x, GDN_CHANNEL_GATE ? kd[c] : k[c], ak[r]);
        if constexpr (!SO) aq[r] += x * (GDN_CHANNEL_GATE ? qd[c] : q[c]);
      }
      if constexpr (ROW_SCALED) {
        const float sc = scale_of(r);
        ak[r] *= sc;
        if constexpr (!SO) aq[r] *= sc;
      }
      if (HOLD && Ap && r < nr) store_row(p, Ap, ap_slot, hv, v0, r, s[r], stream_p);
    }
    const vf16 u = beta * sycl::fma(vf16(-dsum), row_sums(ak), v_rows(p, rs, vrow, nr));
    if constexpr (!SO) store_rows(p.out, orow, nr, dsum * row_sums(aq) + u * hsum(kq));
    // Where the state after the token goes: its store slot (a spec write-back or a checkpoint)
    // and, for a one-token walk, the walk's final slot (a non-spec sequence's, a replay's).
    // Nothing in this call reads the stored states again: streaming stores unless in place.
    const int32_t to = token_store_slot(rs, t), last = !HOLD ? rs.final_slot : p.pad_slot_id;
    state_t *const A = slot_state(p, to, hv, v0), *const B = slot_state(p, last, hv, v0);
    const bool stream_a = streaming_to(rs, to), stream_b = streaming_to(rs, last);
    if constexpr (HOLD) {  // applied by the next token's read pass, or after the walk
      for (int c = 0; c < KC; ++c) kp[c] = k[c];
      if constexpr (GDN_CHANNEL_GATE)
        for (int c = 0; c < KC; ++c) dpv[c] = dv[c];
      up = u, dp = d1, Ap = A, ap_slot = to, stream_p = stream_a;
    } else {
      for (int32_t r = 0; r < nr; ++r) {
        if (ahead) prefetch_states(S + (walk_ahead + r) * kHeadK, kHeadK);
        vf16 x[KC];
        if constexpr (ROW_SCALED && !GDN_CHANNEL_GATE) {
          const float ds = d1 * scale_of(r);
          for (int c = 0; c < KC; ++c) x[c] = held_update(codes_in(r, c), ds, k[c] * u[r]);
        } else {
          for (int c = 0; c < KC; ++c)
            x[c] = GDN_CHANNEL_GATE ? held_update(state_in(t, r, c), dv[c], k[c] * u[r])
                                    : held_update(state_in(t, r, c), d1, k[c] * u[r]);
        }
        if (A) store_row(p, A, to, hv, v0, r, x, stream_a);
        if (B) store_row(p, B, last, hv, v0, r, x, stream_b);
      }
    }
  }
  if constexpr (HOLD) {  // the last token's update
    state_t *const B = slot_state(p, rs.final_slot, hv, v0);
    for (int32_t r = 0; r < nr; ++r) {
      if (ahead) prefetch_states(S + (walk_ahead + r) * kHeadK, kHeadK);
      for (int c = 0; c < KC; ++c)
        s[r][c] = GDN_CHANNEL_GATE ? held_update(s[r][c], dpv[c], kp[c] * up[r]) : held_update(s[r][c], dp, kp[c] * up[r]);
      if (Ap) store_row(p, Ap, ap_slot, hv, v0, r, s[r], stream_p);
      if (B) store_row(p, B, rs.final_slot, hv, v0, r, s[r], streaming_to(rs, rs.final_slot));
    }
  }
}

// x[0] + ... + x[N-1] as a tree (N = 1..4).
template <int N>
static inline vf16 sum_partials(const vf16 *x) {
  static_assert(N >= 1 && N <= 4, "one to four partial sums");
  if constexpr (N == 4) return (x[0] + x[1]) + (x[2] + x[3]);
  else if constexpr (N == 3) return (x[0] + x[1]) + x[2];
  else if constexpr (N == 2) return x[0] + x[1];
  else return x[0];
}

// f32 states, walks of at most GDN_WALK_TOKENS tokens (decode, spec decoding): row by row. In the
// vk layout each state row is a recurrence of its own (row r's u and o need row r alone), so a row
// walks all the tokens in KC registers: read once, stored after each token, then the next row -- a
// decode moves its state as a bare state pass does, not in walk_rows_vk's two passes over 16 rows,
// and a spec walk holds no block on the stack (walk_rows_vk made f32 decode and spec steps
// ~13-16% longer). 2-byte states keep walk_rows_vk: row by row they took up to 1.4x as long, as
// slow with the state cache-resident (compute: with the rounding a row's chain is ~100
// instructions a token, and fewer rows overlap; two rows interleaved were still slower). The kv
// layout cannot walk this way: a column's u needs every row of the state.
// Each of the two dot products is summed in BY_ROW_SUMS = 4 partial sums (fewer for K < 64), then
// by hsum: chains of KC / 4 FMAs on the token's critical path, not KC (one chain made a
// cache-resident decode ~15% longer). Those sums, and the scalar u and o, contract into FMAs
// differently from walk_rows_vk's, so a state can differ from that walk's in its last bits.
// Every row asks for the row BY_ROW_AHEAD = 12 rows on (6 KB at K = 128; within the slot, so the
// last rows of a head ask for the next head's first, which this work-item or the next one walks
// next), a prefetch that never waits (without it, decode and short spec steps ~20-27% longer).
// 8 or 16 rows on are about as good, 4 less; one row every row against two every other row 0-5%
// faster; the next 16 rows at once slower than none.
// LC: the walk's token count when fixed at compile time (1: a decode step, whose k and q stay in
// registers across the rows: loading them per row made a decode ~6% longer),
// else 0. With a decay per key channel (GDN_CHANNEL_GATE) the products' factors are d k and d q,
// formed once per token before the rows (fkq), and each update reads the token's d and k.
template <int LC, bool SO>
static inline void walk_rows_vk_by_row(const GdnDeltaParams &p, RecurrentSeq &rs, const PreparedTokens &pt, int32_t hv,
                                       int32_t v0, int32_t nr) {
  const state_t *S = state_column(p, rs.read_slot, hv, v0);  // S[v0, 0]; read only when rs.init
  const int32_t L = LC ? LC : pt.n;
  // Per token: v and o of the 16 rows (lane r: row r), k.q, where the state after it goes.
  float vs[GDN_WALK_TOKENS][16], os[SO ? 1 : GDN_WALK_TOKENS][16], kq[GDN_WALK_TOKENS];
  int64_t orow[GDN_WALK_TOKENS];
  state_t *A[GDN_WALK_TOKENS];
  int32_t a_slot[GDN_WALK_TOKENS];
  bool stream_a[GDN_WALK_TOKENS];
  for (int32_t t = 0; t < L; ++t) {
    const float *k, *q, *d;
    float b;
    const int64_t row = pt.get(t, k, q, d, b);
    orow[t] = row * p.out_stride + (int64_t)hv * p.V + v0;
    vstore(vs[t], v_rows(p, rs, v_index(p, rs, row, hv, v0), nr));
    if constexpr (!SO) kq[t] = dot_kd(k, q);
    const int32_t to = token_store_slot(rs, t);
    A[t] = slot_state(p, to, hv, v0);
    a_slot[t] = to;
    stream_a[t] = streaming_to(rs, to);
  }
  // The state after the last token also goes to the walk's final slot (a non-spec sequence's, a replay's).
  state_t *const B = slot_state(p, rs.final_slot, hv, v0);
  const bool stream_b = streaming_to(rs, rs.final_slot);
  // The products' factors of token t: its k and q, GDN_CHANNEL_GATE: d k and d q (fkq[t][0], [1]).
  float fkq[GDN_CHANNEL_GATE ? GDN_WALK_TOKENS : 1][2][kHeadK];
  if constexpr (GDN_CHANNEL_GATE)
    for (int32_t t = 0; t < L; ++t)
      for (int c = 0; c < kHeadK; ++c) {
        fkq[t][0][c] = pt.kn[t][c] * pt.decay[t][c];
        fkq[t][1][c] = SO ? 0.0f : pt.qn[t][c] * pt.decay[t][c];
      }
  auto fk = [&](int32_t t) { return GDN_CHANNEL_GATE ? fkq[t][0] : pt.kn[t]; };
  auto fq = [&](int32_t t) { return GDN_CHANNEL_GATE ? fkq[t][1] : pt.qn[t]; };
  vf16 k1[KC], q1[KC];  // LC == 1: the token's factors
  if constexpr (LC == 1)
    for (int c = 0; c < KC; ++c) k1[c] = vload(fk(0) + 16 * c), q1[c] = SO ? vf16(0.0f) : vload(fq(0) + 16 * c);
  auto k_of = [&](int32_t t, int c) { return LC == 1 ? k1[c] : vload(fk(t) + 16 * c); };
  auto q_of = [&](int32_t t, int c) { return LC == 1 ? q1[c] : vload(fq(t) + 16 * c); };
  constexpr int32_t BY_ROW_AHEAD = 12, BY_ROW_ASK = 1;  // every BY_ROW_ASK-th row asks for BY_ROW_ASK rows
  constexpr int BY_ROW_SUMS = KC < 4 ? KC : 4;
  const int32_t ahead_end = rs.init ? slot_rows_from(p, hv, v0) - BY_ROW_AHEAD - (BY_ROW_ASK - 1) : 0;  // in the slot
  for (int32_t r = 0; r < nr; ++r) {
    if (r % BY_ROW_ASK == 0 && r < ahead_end) prefetch_states(S + (r + BY_ROW_AHEAD) * kHeadK, BY_ROW_ASK * kHeadK);
    vf16 s[KC];
    for (int c = 0; c < KC; ++c) s[c] = rs.init ? vload_state(S + r * kHeadK + 16 * c) * row_scale(p, rs.read_slot, hv, v0 + r) : vf16(0.0f);
    for (int32_t t = 0; t < L; ++t) {
      const float d = GDN_CHANNEL_GATE ? 1.0f : pt.decay[t][0], b = pt.beta[t];  // (per channel: in the factors)
      // The row's two dot products as BY_ROW_SUMS partial sums each: chains of KC / BY_ROW_SUMS
      // FMAs, not KC (the next token's products wait for this token's update).
      vf16 akp[BY_ROW_SUMS], aqp[BY_ROW_SUMS];
      for (int c = 0; c < BY_ROW_SUMS; ++c) {
        akp[c] = s[c] * k_of(t, c);
        if constexpr (!SO) aqp[c] = s[c] * q_of(t, c);
      }
      for (int c = BY_ROW_SUMS; c < KC; ++c) {
        akp[c % BY_ROW_SUMS] = sycl::fma(s[c], k_of(t, c), akp[c % BY_ROW_SUMS]);
        if constexpr (!SO) aqp[c % BY_ROW_SUMS] += s[c] * q_of(t, c);
      }
      const float u = b * sycl::fma(-d, hsum(sum_partials<BY_ROW_SUMS>(akp)), vs[t][r]);
      if constexpr (!SO) os[t][r] = d * hsum(sum_partials<BY_ROW_SUMS>(aqp)) + u * kq[t];
      for (int c = 0; c < KC; ++c)
        s[c] = GDN_CHANNEL_GATE ? held_update(s[c], vload(pt.decay[t] + 16 * c), vload(pt.kn[t] + 16 * c) * u)
                                : held_update(s[c], d, k_of(t, c) * u);
      if (A[t]) store_row(p, A[t], a_slot[t], hv, v0, r, s, stream_a[t]);
    }
    if (B) store_row(p, B, rs.final_slot, hv, v0, r, s, stream_b);
  }
  if constexpr (!SO)
    for (int32_t t = 0; t < L; ++t) store_rows(p.out, orow[t], nr, vload(os[t]));
}

// The pass of 16 rows from v0 in the form of RecurrentSeq.form_len (a replay walks as the walk
// whose states it reproduces), state only (SO: a replay's tokens, whose q products and outputs
// nobody reads) or with outputs: the two instances round every state alike (the products the state
// depends on are explicit FMAs, held_update).
template <bool SO>
static inline void rows_vk(const GdnDeltaParams &p, RecurrentSeq &rs, const PreparedTokens &pt, int32_t hv,
                           int32_t v0, int32_t nr, int32_t h) {
  if constexpr (sizeof(state_t) == 4) {  // f32: walk_rows_vk<false> is not built (one token: by row)
    if (rs.form_len == 1) walk_rows_vk_by_row<1, SO>(p, rs, pt, hv, v0, nr);
    else if (pt.n) walk_rows_vk_by_row<0, SO>(p, rs, pt, hv, v0, nr);
    else walk_rows_vk<true, SO>(p, rs, pt, hv, v0, nr, h);  // (pt.n = 0: longer than GDN_WALK_TOKENS)
  } else if (rs.form_len == 1) {
    walk_rows_vk<false, SO>(p, rs, pt, hv, v0, nr, h);
  } else {
    walk_rows_vk<true, SO>(p, rs, pt, hv, v0, nr, h);
  }
}

static inline void recurrent_rows_vk(const GdnDeltaParams &p, RecurrentSeq rs, const PreparedTokens &pt, int32_t hv,
                                     int32_t v0, int32_t h) {
  const int32_t nr = sycl::min(16, p.V - v0);  // rows of this pass (the last may be short)
  if (rs.skip) {
    for (int32_t r = 0; r < nr; ++r) zero_outputs(p, rs.j0, rs.len, hv, v0 + r);
    return;
  }
  if (GDN_WITH_REPLAY && rs.ring_in) rows_vk<true>(p, rs, pt, hv, v0, nr, h);
  else rows_vk<false>(p, rs, pt, hv, v0, nr, h);
}
#undef KC

// The state rows of a work-item: v .. v + GDN_VK_ITEM_ROWS - 1 (at V = 128: the whole state of
// the head, 64 KB contiguous) of (seq, hv), 16 at a time.
static inline int32_t item_span(const GdnDeltaParams &) { return GDN_VK_ITEM_ROWS; }
GDN_NOINLINE void recurrent_item(const GdnDeltaParams &p, int32_t seq, int32_t hv, int32_t v) {
  RecurrentSeq rs;
  if (seq >= p.num_seqs || !recurrent_seq(p, seq, &rs)) return;
  if (rs.len == 0) return copy_state(p, rs, hv, v, GDN_VK_ITEM_ROWS);  // a replay with nothing to replay
  ring_item(p, rs, hv, v, GDN_VK_ITEM_ROWS);
  const int32_t h = hv / (p.HV / p.H);
  PreparedTokens pt;
  pt.n = 0;
  if (!rs.skip && rs.form_len <= GDN_WALK_TOKENS) pt.prepare(p, rs, h, hv);
  // (rs by value: each pass advances its own copy of the checkpoint cursor)
  for (int32_t r = v; r < sycl::min(p.V, v + GDN_VK_ITEM_ROWS); r += GDN_VK_ROWS) recurrent_rows_vk(p, rs, pt, hv, r, h);
}
