// delta_recurrent.hpp — the generic token recurrence (Intel GPUs; the CPU device's variants, one
// per layout, are in delta_recurrent_cpu.cpp) and the state tile the generic chunk scan shares.
// A sub-group of GDN_SUB_GROUP lanes walks one (sequence, v-head) for TILE_COLS state columns
// v0 .. v0+TILE_COLS-1, the tile S[:, v0..] spread over its lanes in registers: lane l holds rows
// k = l + GDN_SUB_GROUP i (i < TILE_KS) of every column (params.hpp, gdn_tile_cols). Per token,
// with d = e^g and one pass over the tile for both dot products:
//   a = S^T k,  c = S^T q,  kq = k.q        lane sums, then sub-group reductions
//   u = beta (v - d a);  o = d c + u kq;    S = d S + k u^T
// (o = S'^T q for the updated S' = d S + k u^T; the reference's order, S = d S; u = beta (v - S^T k);
// S += k u^T; o = S^T q, is the same sum.) With a decay per state row (GDN_CHANNEL_GATE,
// D = Diag(d)) the tile decays first, each lane's rows by their own decays, S = D S, and the walk
// goes on with d = 1: no decays held beside the tile and the k slice (held, they spilled
// registers on dg2 at K = 128, tests/gpu_isa).
#pragma once
#include <sycl/group_algorithm.hpp>
#include "delta.hpp"

#define TILE_KS ((kHeadK + GDN_SUB_GROUP - 1) / GDN_SUB_GROUP)
#define TILE_COLS gdn_tile_cols(kHeadK, kGateK)
// Where a lane's row i of a column is, from the column's start. vk: the lane's offset plus a
// constant. kv: the lane's first row plus i uniform steps of GDN_SUB_GROUP rows (per-lane offsets
// (lane + 16 i) V for every i stay live across the chunk scan's loop and spill registers).
#if GDN_VK_LAYOUT
#define TILE_LANE(p, S, lane) (S)
#define TILE_AT(p, S, lane, i) ((S) + ((lane) + GDN_SUB_GROUP * (i)))
#else
#define TILE_LANE(p, S, lane) ((S) + (lane) * k_stride(p))
#define TILE_AT(p, S, lane, i) ((S) + (int64_t)GDN_SUB_GROUP * k_stride(p) * (i))
#endif
// Row i of a lane's slice exists (K need not be a multiple of GDN_SUB_GROUP).
static inline bool tile_row(int lane, int i) { return kHeadK % GDN_SUB_GROUP == 0 || lane + GDN_SUB_GROUP * i < kHeadK; }

typedef float state_tile[TILE_COLS][TILE_KS];

// The tile of columns v0.. of (slot, v-head) into s: zeros when !init, and past V or K.
static inline void load_tile(const GdnDeltaParams &p, int32_t slot, int32_t hv, int32_t v0, int lane, bool init,
                             state_tile &s) {
#pragma unroll
  for (int b = 0; b < TILE_COLS; ++b) {
    const bool col = init && v0 + b < p.V;
    const state_t *S = TILE_LANE(p, state_column(p, col ? slot : 0, hv, col ? v0 + b : 0), lane);
    const float sc = col ? row_scale(p, slot, hv, v0 + b) : 0.0f;  // (8-bit states; 1 otherwise)
#pragma unroll
    for (int i = 0; i < TILE_KS; ++i)
      s[b][i] = col && tile_row(lane, i) ? load_state(TILE_AT(p, S, lane, i)) * sc : 0.0f;
  }
}

// The tile to slot; an 8-bit state's columns with their scales, each column's largest magnitude
// reduced over the sub-group (every lane stores; uniform in the sub-group).
static inline void store_tile(const GdnDeltaParams &p, const sycl::sub_group &sg, int32_t slot, int32_t hv, int32_t v0,
                              int lane, const state_tile &s) {
#pragma unroll
  for (int b = 0; b < TILE_COLS; ++b) {
    if (v0 + b >= p.V) break;
    state_t *S = TILE_LANE(p, state_column(p, slot, hv, v0 + b), lane);
#if GDN_STATE_8BIT
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < TILE_KS; ++i) m = sycl::fmax(m, sycl::fabs(s[b][i]));  // (rows past K hold 0)
    const RowQuant q = row_quant(sycl::reduce_over_group(sg, m, sycl::maximum<float>()), hv, v0 + b, p.stochastic != 0);
    if (lane == 0) *row_scale_at(p, slot, hv, v0 + b) = q.scale;
#pragma unroll
    for (int i = 0; i < TILE_KS; ++i)
      if (tile_row(lane, i)) store_code(TILE_AT(p, S, lane, i), s[b][i], q, lane + GDN_SUB_GROUP * i);
#else
    (void)sg;
#pragma unroll
    for (int i = 0; i < TILE_KS; ++i)
      if (tile_row(lane, i)) store_state(TILE_AT(p, S, lane, i), s[b][i]);
#endif
  }
}

// A lane's slice of a K-vector (q or k of a token): x[lane + GDN_SUB_GROUP i], 0 past K.
static inline void load_slice(const float *x, int lane, float (&r)[TILE_KS]) {
#pragma unroll
  for (int i = 0; i < TILE_KS; ++i) r[i] = tile_row(lane, i) ? x[lane + GDN_SUB_GROUP * i] : 0.0f;
}

static inline float sg_sum(const sycl::sub_group &sg, float x) { return sycl::reduce_over_group(sg, x, sycl::plus<float>()); }

// The walk of sequence seq of the bound group for the tile of columns v0..; lane l < TILE_COLS
// stores column v0 + l's outputs. In replay mode (RecurrentSeq.mode) the same walk is the replay
// launch (GDN_REPLAY_APPLY: ring entries in, the state to the committed slot) in its state-only
// form (state_only, uniform across the sub-group: no q products, no outputs), and the step's walk
// (GDN_REPLAY_WALK: outputs, and each token's inputs to the ring: k by the v0 = 0 tile of the
// k-head's first v-head, v by each tile for its columns, g and beta by the v0 = 0 tile). The two
// forms round every state alike: the products the state depends on are explicit FMAs. It is a
// run-time flag here, not a template: two inlined instances of the walk in one kernel took 4 bytes
// of scratch per thread on dg2 and pvc (docs/gpu.md: this kernel keeps everything in registers).
static inline void recurrent_tile(const GdnDeltaParams &p, const sycl::sub_group &sg, int32_t seq, int32_t hv,
                                  int32_t v0) {
  const int lane = (int)sg.get_local_linear_id();
  RecurrentSeq r;
  if (!recurrent_seq(p, seq, &r)) return;
  const int32_t vl = v0 + lane;
  const bool writer = lane < TILE_COLS && vl < p.V;
  if (r.skip) {
    if (writer) zero_outputs(p, r.j0, r.len, hv, vl);
    return;
  }
  const int32_t h = hv / (p.HV / p.H);
  const bool state_only = GDN_WITH_REPLAY && r.ring_in != nullptr;
  state_tile s;
  load_tile(p, r.read_slot, hv, v0, lane, r.init, s);
  for (int32_t t = 0; t < r.len; ++t) {
    const int64_t row = state_only ? t : global_row(p.token_indx, r.j0 + t);
    const float *e = r.ring_in + (int64_t)t * p.ring_floats;  // (replay only)
    // k stays in registers for the update; q is used in this pass only, one value at a time (at
    // K = 256 both slices beside the tile spill on Xe-HPG). A replay has no q: k stands in.
    const float *kn = state_only ? e + h * kHeadK : p.kn + (row * p.H + h) * kHeadK;
    float kk[TILE_KS];
    load_slice(kn, lane, kk);
    const float *qn = state_only ? kn : p.qn + (row * p.H + h) * kHeadK;
    // The token's gates: g of v-head hv (kGateK values: the lane's rows' with GDN_CHANNEL_GATE), beta.
    const float *gs = state_only ? e + ring_g(p, hv) : p.g + (row * p.HV + hv) * kGateK;
    const float beta = state_only ? e[ring_beta(p, hv)] : p.beta[row * p.HV + hv];
    // The decay of the sums and the update: the head's one, or 1 after the tile's rows decayed by
    // their own (GDN_CHANNEL_GATE).
    const float decay = GDN_CHANNEL_GATE ? 1.0f : sycl::exp(gs[0]);
    if (GDN_CHANNEL_GATE)
#pragma unroll
      for (int i = 0; i < TILE_KS; ++i) {
        const float d = tile_row(lane, i) ? sycl::exp(gs[lane + GDN_SUB_GROUP * i]) : 0.0f;
#pragma unroll
        for (int b = 0; b < TILE_COLS; ++b) s[b][i] *= d;
      }
    if (GDN_WITH_REPLAY && r.ring_out) {
      float *o = r.ring_out + (int64_t)t * p.ring_floats;
      if (v0 == 0 && hv % (p.HV / p.H) == 0)
#pragma unroll
        for (int i = 0; i < TILE_KS; ++i)
          if (tile_row(lane, i)) o[h * kHeadK + lane + GDN_SUB_GROUP * i] = kk[i];
      if (v0 == 0)  // (a loop, not unrolled: its addresses live one at a time)
#pragma unroll 1
        for (int i = 0; i < (kGateK + GDN_SUB_GROUP - 1) / GDN_SUB_GROUP; ++i)
          if (lane + GDN_SUB_GROUP * i < kGateK) o[ring_g(p, hv) + lane + GDN_SUB_GROUP * i] = gs[lane + GDN_SUB_GROUP * i];
      if (v0 == 0 && lane == 0) o[ring_beta(p, hv)] = beta;
      if (writer) o[gdn_ring_v(p.H, kHeadK) + (int64_t)hv * p.V + vl] = v_at(p, r, v_index(p, r, row, hv, vl));
    }
    float a[TILE_COLS] = {}, c[TILE_COLS] = {}, kq = 0.0f;
#pragma unroll
    for (int i = 0; i < TILE_KS; ++i) {
      const float qi = !state_only && tile_row(lane, i) ? qn[lane + GDN_SUB_GROUP * i] : 0.0f;
      if (!state_only) kq += kk[i] * qi;
#pragma unroll
      for (int b = 0; b < TILE_COLS; ++b) {
        a[b] = sycl::fma(s[b][i], kk[i], a[b]);
        if (!state_only) c[b] += s[b][i] * qi;
      }
    }
    if (!state_only) kq = sg_sum(sg, kq);
    const int64_t vrow = v_index(p, r, row, hv, v0);
    float o = 0.0f;
#pragma unroll
    for (int b = 0; b < TILE_COLS; ++b) {
      const float vv = v0 + b < p.V ? v_at(p, r, vrow + b) : 0.0f;  // one address: a broadcast load
      const float u = beta * sycl::fma(-decay, sg_sum(sg, a[b]), vv);
      if (!state_only) {
        const float ob = decay * sg_sum(sg, c[b]) + u * kq;
        o = lane == b ? ob : o;
      }
#pragma unroll
      for (int i = 0; i < TILE_KS; ++i) s[b][i] = sycl::fma(s[b][i], decay, kk[i] * u);
    }
    if (writer && !state_only) store_act(p.out, row * p.out_stride + (int64_t)hv * p.V + vl, o);
    const int32_t to = token_store_slot(r, t);  // spec write-back or block checkpoint
    if (!gdn_is_pad(to, p.pad_slot_id)) store_tile(p, sg, to, hv, v0, lane, s);
  }
  if (!gdn_is_pad(r.final_slot, p.pad_slot_id)) store_tile(p, sg, r.final_slot, hv, v0, lane, s);
}

