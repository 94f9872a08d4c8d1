// delta_recurrent_cpu.cpp — the CPU device's recurrent kernels, one per ssm layout (the host picks
// them when the dims allow; GDN_XPU_GENERIC_KERNELS=1 runs the generic delta_recurrent.cpp instead).
// The CPU runtime's work-group vectorizer turns uniform loads into gathers when it cannot prove
// uniformity; explicit 16-wide vectors inside a work-item make every load contiguous or a
// broadcast. Work-groups of one work-item, coordinates from GROUP ids only (common.hpp, "CPU-device
// kernels").
#include "conv1d.hpp"  // gdn_fused_cpu
#include "delta_prep.hpp"
#include "delta_recurrent.hpp"

// A work-item's walk (recurrent_item, one per layout) is ONE function both kernels of this build
// call (gdn_recurrent_*_cpu and gdn_fused_cpu), not an inlined copy in each: the copy made the
// build's back end take twice as long (cold compile, K = 128: ~3 -> ~7 s).
#define GDN_NOINLINE static __attribute__((noinline))

// Whether a store of this walk's state to slot `to` streams: not when it is in place, to the slot
// the walk read its initial state from, whose lines are still in this core's caches
// (vstore_states: plain stores there).
static inline bool streaming_to(const RecurrentSeq &rs, int32_t to) { return !(rs.init && to == rs.read_slot); }

// Asks for the n states from p to be brought into this core's caches, without waiting for them
// (prefetch_bytes, common.hpp). Inline on an x86-64 host, alternated in one process on the Zen 5
// host of stop 34: cache-resident decode B=8 bf16 0.190 -> 0.166 ms, f32 0.253 -> 0.224; from DRAM
// 0-5% on the vk rows. (Stop 32 had measured an inline form 1-6% slower on the same host, before
// stop 33 changed the walks' stores; benchmarks/HISTORY.md.)
static inline void prefetch_states(const state_t *p, size_t n) { prefetch_bytes(p, n * sizeof(state_t)); }

// Token t of the walk, for k-head h and v-head hv: returns its global row; kn, qn point to its
// l2-normalized k and q (KD floats each), decay = e^g, beta. They are the prep kernel's outputs,
// or, when the call launched no gdn_prep (p.prep_inline: no chunk kernels in it, K % 16 == 0),
// prepared here from the conv output into kb, qb with the prep kernel's own arithmetic
// (delta_prep.hpp). Both walks below take their tokens through this (out-parameters: returning a
// struct measured 1.5x slower in an earlier build of these kernels).
static inline int64_t token_in(const GdnDeltaParams &p, const RecurrentSeq &rs, int32_t t, int32_t h, int32_t hv,
                               float *kb, float *qb, const float *&kn, const float *&qn, float &decay, float &beta) {
  const int64_t row = global_row(p.token_indx, rs.j0 + t);
  float g;
  if (KD % 16 == 0 && p.prep_inline) {
    vf16 k[KD / 16 + (KD % 16 != 0)], q[KD / 16 + (KD % 16 != 0)];
    prep_qk16(p.prep, row, h, q, k);
    for (int c = 0; c < KD / 16; ++c) {
      vstore(kb + 16 * c, k[c]);
      vstore(qb + 16 * c, q[c]);
    }
    kn = kb, qn = qb;
    gates(p.prep, row, hv, &g, &beta);
  } else {
    kn = p.kn + (row * p.H + h) * KD, qn = p.qn + (row * p.H + h) * KD;
    g = p.g[row * p.HV + hv], beta = p.beta[row * p.HV + hv];
  }
  decay = sycl::exp(g);
  return row;
}

// The conv channels of k-head h: its q, k, and its v-heads' v channels, as [begin, end) ranges.
struct KHeadChannels {
  int32_t r[3][2];
};
static inline KHeadChannels k_head_channels(const GdnDeltaParams &p, int32_t h) {
  const int32_t per_k = p.HV / p.H;
  return {{{h * KD, (h + 1) * KD},
           {(p.H + h) * KD, (p.H + h + 1) * KD},
           {p.v_offset + h * per_k * p.V, p.v_offset + (h + 1) * per_k * p.V}}};
}

// A step's conv and recurrence in ONE launch per token group, gdn_fused_cpu (at the end of this
// file), instead of the group's conv kernel then its recurrent kernel: for the spec group of a
// step without chunk kernels, and for the non-spec group of a step without prefills. Global
// (group's seqs * H, 1), local (1, 1). The work-item of (seq, k-head h) first convolves its
// sequence's tokens in the channels of h -- its q and k channels and the v channels of its
// v-heads (a k-head's q/k conv state has one owner that way; a work-item per v-head would race
// on it) -- then walks the states of those v-heads, whose tokens it prepares from the conv output
// it just wrote. The conv is the conv kernels' own code: conv_spec_channels per 16-channel block;
// for a plain decode's one token conv_decode_blocks (conv1d.hpp), else conv_non_spec_tile with
// tile_len 1 (tile j is compact token j: the tiles of the sequence's tokens cover it whole, the
// first, the owner, reading and writing the conv state). Conv width 4
// only (plan.cpp; Qwen3-Next and Qwen3.5): each width is another copy of the conv in this build.
static inline void fused_conv(const GdnConvParams &c, const GdnDeltaParams &p, int32_t seq, int32_t h) {
  const KHeadChannels k_head = k_head_channels(p, h);
  const auto &ranges = k_head.r;
  if (p.group == GDN_GROUP_SPEC) {
    for (const auto &r : ranges)
      for (int32_t ch = r[0]; ch < r[1]; ch += 16) conv_spec_channels<16, 4>(c, seq, ch);
    return;
  }
  if (c.query_start_loc[seq + 1] - c.query_start_loc[seq] == 1) {  // plain decode
    for (const auto &r : ranges) conv_decode_blocks(c, seq, r[0], r[1]);
    return;
  }
  for (int32_t tile = c.query_start_loc[seq]; tile < c.query_start_loc[seq + 1]; ++tile)
    for (const auto &r : ranges)
      for (int32_t ch = r[0]; ch < r[1]; ch += 16 * GDN_CONV_BLOCKS)
        conv_non_spec_tile<16, 4, GDN_CONV_BLOCKS, 2>(c, tile, ch, r[1]);
}

// The state of (slot, hv) from column / row v (state_column), nullptr for pad_slot_id: where a
// walk stores a state.
static inline state_t *slot_state(const GdnDeltaParams &p, int32_t slot, int32_t hv, int32_t v) {
  return slot != p.pad_slot_id ? state_column(p, slot, hv, v) : nullptr;
}

// a . b over KD floats (l2-normalized k and q: |a . b| <= 1).
static inline float dot_kd(const float *a, const float *b) {
  if (KD % 16 == 0) {
    vf16 x(0.0f);
    for (int c = 0; c < KD / 16; ++c) x += vload(a + 16 * c) * vload(b + 16 * c);
    return hsum(x);
  }
  float x = 0.0f;
  for (int k = 0; k < KD; ++k) x += a[k] * b[k];
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
  float decay[GDN_WALK_TOKENS], beta[GDN_WALK_TOKENS];
  float kb[GDN_WALK_TOKENS][KD], qb[GDN_WALK_TOKENS][KD];
  void prepare(const GdnDeltaParams &p, const RecurrentSeq &rs, int32_t h, int32_t hv) {
    for (n = 0; n < rs.len; ++n) row[n] = token_in(p, rs, n, h, hv, kb[n], qb[n], kn[n], qn[n], decay[n], beta[n]);
  }
  int64_t get(int32_t t, const float *&k, const float *&q, float &d, float &b) const {
    k = kn[t], q = qn[t], d = decay[t], b = beta[t];
    return row[t];
  }
};

#if !GDN_VK_LAYOUT
// kv layout [.., K, V]: a work-item owns 16 NV consecutive state columns, NV = gdn_kv_cpu_vecs(V)
// (params.hpp): whole rows when V = 128, s[k][j] = S[k, v+16j ..]. The same algebra as the vk
// kernel below (with d = e^g: u = beta (v - d S^T k), S' = d S + k u^T, o = d S^T q + u (k.q)),
// but a column's u needs every row of the state, so a kv walk cannot go row by row. Walks of up
// to GDN_WALK_TOKENS tokens (decode, spec decoding, short recurrent prefills) take the WY form,
// walk_columns_kv_wy; longer ones hold the block, walk_columns_kv. Why NV vectors: a walk reads
// and writes NV*64 contiguous bytes of each of the K state rows; with one vector (64 bytes per
// row) the kv layout ran ~1.6x the vk layout's time at spec S=3 even on one thread, bound by that
// access pattern, not by instructions. Whole rows at K = V = 128 (a 64 KB block) against half
// rows in two walks (the held walk then): spec B=8 f32 S=1 2.42 -> 2.19 ms, S=3 4.47 -> 4.02, S=7
// 7.07 -> 6.92, bf16 S=1 2.15 -> 1.95, S=3 3.72 -> 3.42 (alternated in one process; an earlier
// build measured the two equal). The NV column vectors are also NV independent FMA chains. Whole
// rows per work-item: with half rows (64 of 128 columns) decode B=8 took 1.64 ms here against
// 1.07 with whole rows (same run): two work-items reading alternate 256-byte halves of every
// 512-byte row.
// 2-byte states: a walk's last pass (the WY write pass, the held block's last update) reads no
// memory but this core's caches, so each of its rows asks for the same row and columns of the
// next head (the next walk of this work-item in gdn_fused_cpu, else likely of the next
// work-item), as the vk walk below does for its next 16 rows. Alternated in one process, bf16
// state, when the decode and the spec walks had passes of their own (stop 26): decode B=8 0.708
// -> 0.624 ms, B=1 0.178 -> 0.173; spec S=1 B=8 1.385 -> 1.289, S=3 B=8 2.79 -> 2.53, S=7 B=8
// 3.61 -> 3.57, S=3 B=32 9.10 -> 8.54. Not for f32 states (a head is 64 KB, the whole L1 twice
// over): decode B=8 3-8% slower, spec S=1 B=8 1.88 -> 2.00.
static inline bool ask_next_head(const GdnDeltaParams &p, const RecurrentSeq &rs, int32_t hv) {
  return sizeof(state_t) == 2 && rs.init && hv + 1 < p.HV;
}
static inline const state_t *next_head(const GdnDeltaParams &p, const state_t *S) { return S + (int64_t)KD * p.V; }

// The held walk of the 16 NV columns from v over a sequence's tokens, for walks longer than
// GDN_WALK_TOKENS (forced-recurrent prefills): the K x 16 NV block stays in registers (on the
// stack) across the tokens, and token t's read pass applies token t-1's update and stores the
// updated row as it goes (one pass over the block per token, not three: spec B=8 whole steps S=3
// f32 3.92 -> 3.51-3.67 ms, bf16 3.03 -> 2.95; S=1 f32 2.11 -> 1.97-1.99, bf16 1.54 -> 1.52;
// alternated in one process, when spec walks took this form). The block is loaded by token 0's
// read pass, not by a copy pass before it: spec B=8 f32 S=1 1.665 -> 1.592 ms, S=3 2.75 -> 2.67,
// bf16 S=1 1.195 -> 1.149 (alternated in one process, then too; the vk 16-row walk gained nothing
// that way: bf16 S=1 1.69 -> 1.65, S=3 1.83 -> 1.86, S=7 3.59 -> 3.71).
template <int NV>
static inline void walk_columns_kv(const GdnDeltaParams &p, RecurrentSeq rs, int32_t hv, int32_t v, int32_t h) {
  const state_t *S = state_column(p, rs.read_slot, hv, v);  // read only when rs.init
  vf16 s[KD][NV];
  // The update of the token before (S' = d S + k u^T) and where its state goes (A: none).
  float kp[KD], dp = 1.0f;
  vf16 up[NV];
  state_t *Ap = nullptr;
  bool stream_p = false;
  for (int32_t t = 0; t < rs.len; ++t) {
    float kb[KD], qb[KD], decay, beta;
    const float *kn, *qn;
    const int64_t row = token_in(p, rs, t, h, hv, kb, qb, kn, qn, decay, beta);
    const int64_t vrow = row * p.qkv_stride + p.v_offset + (int64_t)hv * p.V + v;
    const int64_t orow = row * p.out_stride + (int64_t)hv * p.V + v;
    const float kdotq = dot_kd(kn, qn);
    vf16 ak[NV], aq[NV], u[NV];
    for (int j = 0; j < NV; ++j) ak[j] = aq[j] = vf16(0.0f);
    for (int k = 0; k < KD; ++k) {
      for (int j = 0; j < NV; ++j) {  // row k of the block before the token
        if (t == 0) s[k][j] = rs.init ? vload_state(S + k * p.V + 16 * j) : vf16(0.0f);
        else s[k][j] = s[k][j] * dp + up[j] * kp[k];
        ak[j] += s[k][j] * kn[k];
        aq[j] += s[k][j] * qn[k];
      }
      if (Ap) vstore_states(Ap + k * p.V, s[k], NV, stream_p);
    }
    for (int j = 0; j < NV; ++j) {
      u[j] = beta * (load_act16(p.qkv, vrow + 16 * j) - decay * ak[j]);
      store_act16(p.out, orow + 16 * j, decay * aq[j] + u[j] * kdotq);
    }
    // Applied by the next token's read pass, or after the walk; the state after the token goes
    // to its store slot (a spec write-back or a checkpoint). Nothing in this call reads the
    // stored states again: streaming stores unless in place.
    const int32_t to = token_store_slot(rs, t);
    for (int k = 0; k < KD; ++k) kp[k] = kn[k];
    for (int j = 0; j < NV; ++j) up[j] = u[j];
    dp = decay, Ap = slot_state(p, to, hv, v), stream_p = streaming_to(rs, to);
  }
  // The last token's update, also to a non-spec sequence's slot.
  state_t *const B = rs.spec ? nullptr : state_column(p, rs.cols[0], hv, v);
  const bool ahead = ask_next_head(p, rs, hv);
  for (int k = 0; k < KD; ++k) {
    if (ahead) prefetch_states(next_head(p, S) + k * p.V, 16 * NV);
    for (int j = 0; j < NV; ++j) s[k][j] = s[k][j] * dp + up[j] * kp[k];
    if (Ap) vstore_states(Ap + k * p.V, s[k], NV, stream_p);
    if (B) vstore_states(B + k * p.V, s[k], NV, streaming_to(rs, rs.cols[0]));
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
// time. Products of decays only, never ratios: a decay of 0 (g = -inf, README "Non-finite gates")
// zeroes every term across it, as the token-by-token walk does. The u and o differ from the held
// walk's by the summation order: rounding only, the coefficients being bounded (|k_i.k_t| <= 1 for
// l2-normalized k and q, decays in [0, 1]). Alternated in one process against the held walk,
// spec B=8 (7 rounds): f32 S=1 1.620 -> 1.485 ms, S=3 2.460 -> 2.069; bf16 S=1 1.174 -> 1.048,
// S=3 2.072 -> 1.903, S=7 4.271 -> 4.187 -- the kv f32 spec rows at 1.02-1.06x the vk ones (were
// up to 1.2x); the next head's rows asked for in the write pass (2-byte states, above): bf16 spec
// B=8 S=1 1.055 -> 1.018 ms, S=3 1.904 -> 1.871. One token (a decode) reads the block twice, for
// its products and then from this core's caches for the write pass, as the decode's own walk did
// before (holding the block spilled it through the stack); as the WY walk's L = 1 it takes the
// same time (alternated: decode B=8 f32 0.879 / 0.879 ms, bf16 0.738 / 0.749) and the kv build
// compiles ~1.6 s faster from cold without that walk.
template <int NV>
static inline void walk_columns_kv_wy(const GdnDeltaParams &p, RecurrentSeq &rs, const PreparedTokens &pt, int32_t hv,
                                      int32_t v) {
  const state_t *S = state_column(p, rs.read_slot, hv, v);  // read only when rs.init
  const int32_t L = pt.n;
  // ck[t][i] = D(t, i) k_i.k_t (i < t), cq[t][i] = D(t, i) k_i.q_t (i <= t), P[t] = P(t).
  float ck[GDN_WALK_TOKENS][GDN_WALK_TOKENS], cq[GDN_WALK_TOKENS][GDN_WALK_TOKENS], P[GDN_WALK_TOKENS];
  for (int32_t t = 0; t < L; ++t) {
    P[t] = t ? P[t - 1] * pt.decay[t] : pt.decay[t];
    float D = 1.0f;
    for (int32_t i = t; i >= 0; --i) {
      if (i < t) ck[t][i] = D * dot_kd(pt.kn[i], pt.kn[t]);
      cq[t][i] = D * dot_kd(pt.kn[i], pt.qn[t]);
      D *= pt.decay[i];
    }
  }
  vf16 u[GDN_WALK_TOKENS][NV];
  for (int32_t t = 0; t < L; ++t) {
    vf16 a[NV], b[NV];  // S^T k_t, S^T q_t
    for (int j = 0; j < NV; ++j) a[j] = b[j] = vf16(0.0f);
    if (rs.init)
      for (int k = 0; k < KD; ++k)
        for (int j = 0; j < NV; ++j) {
          const vf16 x = vload_state(S + k * p.V + 16 * j);
          a[j] += x * pt.kn[t][k];
          b[j] += x * pt.qn[t][k];
        }
    const int64_t vrow = pt.row[t] * p.qkv_stride + p.v_offset + (int64_t)hv * p.V + v;
    const int64_t orow = pt.row[t] * p.out_stride + (int64_t)hv * p.V + v;
    for (int j = 0; j < NV; ++j) {
      vf16 w = load_act16(p.qkv, vrow + 16 * j) - P[t] * a[j];
      for (int32_t i = 0; i < t; ++i) w -= ck[t][i] * u[i][j];
      u[t][j] = pt.beta[t] * w;
      vf16 o = P[t] * b[j];
      for (int32_t i = 0; i <= t; ++i) o += cq[t][i] * u[i][j];
      store_act16(p.out, orow + 16 * j, o);
    }
  }
  // Where each state goes (a spec write-back or a checkpoint; a non-spec sequence's last state
  // also to its slot). Nothing in this call reads them again: streaming stores unless in place.
  state_t *A[GDN_WALK_TOKENS];
  bool stream_a[GDN_WALK_TOKENS];
  for (int32_t t = 0; t < L; ++t) {
    const int32_t to = token_store_slot(rs, t);
    A[t] = slot_state(p, to, hv, v);
    stream_a[t] = streaming_to(rs, to);
  }
  state_t *const B = rs.spec ? nullptr : state_column(p, rs.cols[0], hv, v);
  const bool stream_b = !rs.spec && streaming_to(rs, rs.cols[0]);
  const bool ahead = ask_next_head(p, rs, hv);
  for (int k = 0; k < KD; ++k) {
    if (ahead) prefetch_states(next_head(p, S) + k * p.V, 16 * NV);
    vf16 s[NV];
    for (int j = 0; j < NV; ++j) s[j] = rs.init ? vload_state(S + k * p.V + 16 * j) : vf16(0.0f);
    for (int32_t t = 0; t < L; ++t) {
      const float d = pt.decay[t], kk = pt.kn[t][k];
      for (int j = 0; j < NV; ++j) s[j] = s[j] * d + u[t][j] * kk;
      if (A[t]) vstore_states(A[t] + k * p.V, s, NV, stream_a[t]);
    }
    if (B) vstore_states(B + k * p.V, s, NV, stream_b);
  }
}

// The 16 NV columns from v of (seq, hv): up to GDN_WALK_TOKENS tokens in WY form; longer walks
// held, all NV vectors at once while that block is at most 64 KB (K <= 128), else GDN_KV_VECS
// vectors at a time (rs copied: each walk advances its own checkpoints).
template <int NV>
static inline void recurrent_columns_kv(const GdnDeltaParams &p, int32_t seq, int32_t hv, int32_t v) {
  RecurrentSeq rs;
  if (!recurrent_seq(p, seq, &rs)) return;
  if (rs.skip) {
    for (int32_t l = 0; l < 16 * NV; ++l) zero_outputs(p, rs.j0, rs.len, hv, v + l);
    return;
  }
  const int32_t h = hv / (p.HV / p.H);
  if (rs.len <= GDN_WALK_TOKENS) {
    PreparedTokens pt;
    pt.prepare(p, rs, h, hv);
    return walk_columns_kv_wy<NV>(p, rs, pt, hv, v);
  }
  constexpr int NW = KD <= 128 || NV < GDN_KV_VECS ? NV : GDN_KV_VECS;
  for (int j = 0; j < NV; j += NW) walk_columns_kv<NW>(p, rs, hv, v + 16 * j, h);
}

// The state columns of a work-item: 16 gdn_kv_cpu_vecs(V) from v of (seq, hv).
static inline int32_t item_span(const GdnDeltaParams &p) { return 16 * gdn_kv_cpu_vecs(p.V); }
GDN_NOINLINE void recurrent_item(const GdnDeltaParams &p, int32_t seq, int32_t hv, int32_t v) {
  const int32_t nv = gdn_kv_cpu_vecs(p.V);
  if (nv == GDN_KV_ROW_VECS) recurrent_columns_kv<GDN_KV_ROW_VECS>(p, seq, hv, v);
  else if (nv == GDN_KV_VECS) recurrent_columns_kv<GDN_KV_VECS>(p, seq, hv, v);
  else recurrent_columns_kv<1>(p, seq, hv, v);
}

// Global (num_seqs*HV, V / (16 gdn_kv_cpu_vecs(V))), local (1, 1) (plan.cpp).
GDN_KERNEL(2) void gdn_recurrent_kv_cpu(GdnDeltaParams p) {
  const auto it = item2();
  const int32_t seq = (int32_t)(it.get_group(0) / p.HV), hv = (int32_t)(it.get_group(0) % p.HV);
  const int32_t v = (int32_t)it.get_group(1) * item_span(p);
  if (seq >= p.num_seqs || v >= p.V) return;
  recurrent_item(p, seq, hv, v);
}

#else
// vk layout [.., V, K], K % 16 == 0: a work-item owns GDN_VK_ROWS = 16 state ROWS S[v0 + r, :]
// (K/16 vectors each). Per token and row, with d = e^g:  u = beta (v - d S.k),  S' = d S + u k,
// o = S'.q = d S.q + u (k.q), so one read pass over the rows gives both dot products (k.q is
// shared by every row) and one pass updates them. The 16 rows' dot products are reduced together
// (row_sums: one vector, lane r = row r), so u, v and o are vectors too: per token ~45 shuffles
// and adds instead of 32 horizontal sums and 16 scalar u / v / o computations.
#define KC (KD / 16)

static_assert(GDN_VK_ROWS == 16, "a work-item's rows are the lanes of one vector");

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
// update, read again for the store; spec B=8 f32 whole steps S=1 1.78 -> 1.71 ms, S=7 5.23 ->
// 4.93, alternated in one process). One token (a decode step, !HOLD): the rows are read twice,
// once for the two dot products and once more (from this core's caches by then) for the update
// and its store, instead of being held: the copy the compiler kept on the stack cost a store and
// two loads per vector (with the in-place plain stores, decode B=8 here: recurrent kernel 1.5 ->
// 0.9-1.3 ms, B=1 0.33 -> 0.14 ms).
template <bool HOLD>
static inline void walk_rows_vk(const GdnDeltaParams &p, RecurrentSeq &rs, const PreparedTokens &pt, int32_t hv,
                                int32_t v0, int32_t nr, int32_t h) {
  const state_t *S = state_column(p, rs.read_slot, hv, v0);  // S[v0, 0]; read only when rs.init
  vf16 s[HOLD ? 16 : 1][KC];  // HOLD: s[r][c] = S[v0 + r, 16c .. 16c+15]; rows past nr stay zero
  if constexpr (HOLD)
    for (int32_t r = 0; r < 16; ++r)
      for (int c = 0; c < KC; ++c) s[r][c] = rs.init && r < nr ? vload_state(S + r * KD + 16 * c) : vf16(0.0f);
  // HOLD: the update of the token before (S' = d S + u k^T) and where its state goes (A: none).
  vf16 kp[HOLD ? KC : 1], up(0.0f);
  float dp = 1.0f;
  state_t *Ap = nullptr;
  bool stream_p = false;
  // The walk's last pass (a decode's update pass, the held rows' last update) runs from this
  // core's caches and reads no memory, which would idle through it: each of its rows asks for
  // the row walk_ahead rows on (32: the same row of the walk after next; this head's rows, or the
  // next head's, which this work-item or the one after it walks; within the slot), so the walks
  // ahead find their rows arrived. One walk on (16 rows), alternated in one process (stop 26,
  // the Zen 4 host, when f32 states walked here too): decode B=8 0.93 -> 0.87 ms, bf16 state 0.69
  // -> 0.64, B=32 3.96 -> 3.80, B=1 0.160 -> 0.152; spec B=8 S=1 2.07 -> 2.05, S=3 3.68 -> 3.52,
  // S=7 6.76 -> 6.42, bf16 S=3 2.37 -> 2.01 (8, 32 or 48 rows on: no gain or slower there; the
  // same request during a spec walk's last read pass instead: about as fast). On stop 31's host
  // (Zen 5) 32 rows on against 16, bf16 state, two alternated runs: decode B=8 0.375 / 0.369 ->
  // 0.326 / 0.350 ms, B=32 1.388 / 1.342 -> 1.175 / 1.222, spec B=8 S=1 0.665 / 0.623 -> 0.575 /
  // 0.551, S=3 1.049 / 1.173 -> 0.956 / 1.000 (24 rows on less, 48 about the same). Stop 34, with
  // the prefetch inline, 24 against 32, bf16, two alternated runs from DRAM: decode B=8 0.359 ->
  // 0.339 / 0.331 ms, B=32 1.400 -> 1.262, B=1 0.073 / 0.072 -> 0.069 / 0.068, but spec S=3 B=8
  // 0.976 / 0.971 -> 0.984 / 0.998: 24 rows on for a one-token sequence (a decode), 32 otherwise.
  // (The kv walk above does the same for 2-byte states only, one head on.)
  const int32_t walk_ahead = rs.len == 1 ? 24 : 32;
  const bool ahead = rs.init && slot_rows_from(p, hv, v0) >= walk_ahead + 16;  // every row's request in the slot
  // Row r, vector c of the state before the token (HOLD: after applying the pending update).
  auto state_in = [&](int32_t t, int32_t r, int c) -> vf16 {
    if constexpr (HOLD) {
      if (t > 0) s[r][c] = s[r][c] * dp + kp[c] * up[r];
      return s[r][c];
    } else {
      return rs.init && r < nr ? vload_state(S + r * KD + 16 * c) : vf16(0.0f);
    }
  };
  for (int32_t t = 0; t < rs.len; ++t) {
    float kb[KD], qb[KD], decay, beta;
    const float *kn, *qn;
    const int64_t row = pt.n ? pt.get(t, kn, qn, decay, beta) : token_in(p, rs, t, h, hv, kb, qb, kn, qn, decay, beta);
    const int64_t vrow = row * p.qkv_stride + p.v_offset + (int64_t)hv * p.V + v0;
    const int64_t orow = row * p.out_stride + (int64_t)hv * p.V + v0;
    vf16 k[KC], q[KC], kq(0.0f);
    for (int c = 0; c < KC; ++c) {
      k[c] = vload(kn + 16 * c);
      q[c] = vload(qn + 16 * c);
      kq += k[c] * q[c];
    }
    vf16 ak[16], aq[16];
    for (int32_t r = 0; r < 16; ++r) {
      ak[r] = aq[r] = vf16(0.0f);
      for (int c = 0; c < KC; ++c) {
        const vf16 x = state_in(t, r, c);
        ak[r] += x * k[c];
        aq[r] += x * q[c];
      }
      if (HOLD && Ap && r < nr) vstore_states(Ap + r * KD, s[r], KC, stream_p);
    }
    const vf16 u = beta * (load_rows(p.qkv, vrow, nr) - decay * row_sums(ak));
    store_rows(p.out, orow, nr, decay * row_sums(aq) + u * hsum(kq));
    // Where the state after the token goes: its store slot (a spec write-back or a checkpoint)
    // and, for the one token of a non-spec sequence, the sequence's slot. Nothing in this call
    // reads the stored states again: streaming stores unless in place.
    const int32_t to = token_store_slot(rs, t), last = !HOLD && !rs.spec ? rs.cols[0] : p.pad_slot_id;
    state_t *const A = slot_state(p, to, hv, v0), *const B = slot_state(p, last, hv, v0);
    const bool stream_a = streaming_to(rs, to), stream_b = streaming_to(rs, last);
    if constexpr (HOLD) {  // applied by the next token's read pass, or after the walk
      for (int c = 0; c < KC; ++c) kp[c] = k[c];
      up = u, dp = decay, Ap = A, stream_p = stream_a;
    } else {
      for (int32_t r = 0; r < nr; ++r) {
        if (ahead) prefetch_states(S + (walk_ahead + r) * KD, KD);
        vf16 x[KC];
        for (int c = 0; c < KC; ++c) x[c] = state_in(t, r, c) * decay + k[c] * u[r];
        if (A) vstore_states(A + r * KD, x, KC, stream_a);
        if (B) vstore_states(B + r * KD, x, KC, stream_b);
      }
    }
  }
  if constexpr (HOLD) {  // the last token's update
    state_t *const B = rs.spec ? nullptr : slot_state(p, rs.cols[0], hv, v0);
    for (int32_t r = 0; r < nr; ++r) {
      if (ahead) prefetch_states(S + (walk_ahead + r) * KD, KD);
      for (int c = 0; c < KC; ++c) s[r][c] = s[r][c] * dp + kp[c] * up[r];
      if (Ap) vstore_states(Ap + r * KD, s[r], KC, stream_p);
      if (B) vstore_states(B + r * KD, s[r], KC, streaming_to(rs, rs.cols[0]));
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
// and a spec walk holds no block on the stack. Each of the two dot products is summed in four
// partial sums (BY_ROW_SUMS, fewer for K < 64; one chain of KC FMAs before stop 37), then by hsum,
// and the same expressions as walk_rows_vk's are contracted into FMAs differently (scalar u and o
// here), so a state can differ from that walk's in its last bits (benchmarks/HISTORY.md "Stop 29").
// The four sums, alternated in one process (stop 37, f32): cache-resident decode B=8 0.263 -> 0.228
// ms, B=1 0.050 -> 0.046; from DRAM in slow-memory minutes (~63 GB/s) unchanged, in fast ones
// (~110-120 GB/s, 20 rounds) spec S=3 B=8 1.201 -> 1.118 ms, decode B=8 / B=32 within noise (0.357
// / 0.367, 1.253 / 1.243); spec rows cache-resident unchanged (their streaming stores go to DRAM
// anyway). Row by row against walk_rows_vk (stop 29), alternated in one process, f32 state, 7-9
// rounds: decode B=8 1.06 -> 0.94 ms, B=32 3.32 -> 2.94, B=1 0.199 -> 0.198 (the host's launch and
// call); spec B=8 S=1 2.46 -> 1.91, S=3 3.64 -> 3.13, S=7 6.36 -> 5.63, S=3 B=32 12.4 -> 10.2, S=3
// B=1 0.55 -> 0.49. 2-byte states keep walk_rows_vk: row by row they took up to 1.4x as long (bf16
// decode B=8 0.64 -> 0.81 ms, spec S=3 B=8 1.79 -> 2.53, as slow with the state cache-resident:
// compute -- with the rounding a row's chain is ~100 instructions a token, and fewer rows overlap;
// two rows interleaved: spec 2.18, still slower). Every row asks for the row BY_ROW_AHEAD = 12 rows
// on (6 KB at K = 128; within the slot, so the last rows of a head ask for the next head's first,
// which this work-item or the next one walks next), a prefetch that never waits. Alternated in one
// process on stop 31's host (a Zen 5 VM; benchmarks/HISTORY.md "Stop 31"), in a fast-memory minute:
// decode B=8 0.493 -> 0.388 ms, B=32 1.651 -> 1.304, spec S=1 B=8 0.728 -> 0.596, S=3 B=8 1.341 ->
// 1.214, S=1 B=1 0.132 -> 0.110. 8 or 16 rows on about as good, 4 rows on or 4 rows every 4th row
// less, one row a row about the same; the next 16 rows at once (at a pass's start, or every 16th
// row) slower than none (the runtime's prefetch is a call looping over the lines). On stop 29's
// host (Zen 4) one row a row, 16 on, was slower (decode B=32 3.91 -> 4.14 ms). Stop 34, the
// prefetch inline (no call): one row a row against two every other row, f32, three alternated runs
// from DRAM: 0-5% off every vk row (spec S=1 B=8 1.075-1.083 -> 1.038-1.049 ms, S=3 B=1 0.248 ->
// 0.236, decode B=1 0.100-0.105 -> 0.097-0.102), 8 or 16 rows on about the same. The kv layout
// cannot walk this way: a column's u needs every row of the state.
// LC: the walk's token count when fixed at compile time (1: a decode step, whose k and q stay in
// registers across the rows: decode B=8 0.91 -> 0.86 ms against loading them per row), else 0.
template <int LC>
static inline void walk_rows_vk_by_row(const GdnDeltaParams &p, RecurrentSeq &rs, const PreparedTokens &pt, int32_t hv,
                                       int32_t v0, int32_t nr) {
  const state_t *S = state_column(p, rs.read_slot, hv, v0);  // S[v0, 0]; read only when rs.init
  const int32_t L = LC ? LC : pt.n;
  // Per token: v and o of the 16 rows (lane r: row r), k.q, where the state after it goes.
  float vs[GDN_WALK_TOKENS][16], os[GDN_WALK_TOKENS][16], kq[GDN_WALK_TOKENS];
  int64_t orow[GDN_WALK_TOKENS];
  state_t *A[GDN_WALK_TOKENS];
  bool stream_a[GDN_WALK_TOKENS];
  for (int32_t t = 0; t < L; ++t) {
    const float *k, *q;
    float d, b;
    const int64_t row = pt.get(t, k, q, d, b);
    const int64_t vrow = row * p.qkv_stride + p.v_offset + (int64_t)hv * p.V + v0;
    orow[t] = row * p.out_stride + (int64_t)hv * p.V + v0;
    vstore(vs[t], load_rows(p.qkv, vrow, nr));
    kq[t] = dot_kd(k, q);
    const int32_t to = token_store_slot(rs, t);
    A[t] = slot_state(p, to, hv, v0);
    stream_a[t] = streaming_to(rs, to);
  }
  // A non-spec sequence's state after its last token also goes to its slot.
  state_t *const B = rs.spec ? nullptr : slot_state(p, rs.cols[0], hv, v0);
  const bool stream_b = !rs.spec && streaming_to(rs, rs.cols[0]);
  vf16 k1[KC], q1[KC];  // LC == 1: the token's k and q
  if constexpr (LC == 1)
    for (int c = 0; c < KC; ++c) k1[c] = vload(pt.kn[0] + 16 * c), q1[c] = vload(pt.qn[0] + 16 * c);
  auto k_of = [&](int32_t t, int c) { return LC == 1 ? k1[c] : vload(pt.kn[t] + 16 * c); };
  auto q_of = [&](int32_t t, int c) { return LC == 1 ? q1[c] : vload(pt.qn[t] + 16 * c); };
  constexpr int32_t BY_ROW_AHEAD = 12, BY_ROW_ASK = 1;  // every BY_ROW_ASK-th row asks for BY_ROW_ASK rows
  constexpr int BY_ROW_SUMS = KC < 4 ? KC : 4;
  const int32_t ahead_end = rs.init ? slot_rows_from(p, hv, v0) - BY_ROW_AHEAD - (BY_ROW_ASK - 1) : 0;  // in the slot
  for (int32_t r = 0; r < nr; ++r) {
    if (r % BY_ROW_ASK == 0 && r < ahead_end) prefetch_states(S + (r + BY_ROW_AHEAD) * KD, BY_ROW_ASK * KD);
    vf16 s[KC];
    for (int c = 0; c < KC; ++c) s[c] = rs.init ? vload_state(S + r * KD + 16 * c) : vf16(0.0f);
    for (int32_t t = 0; t < L; ++t) {
      const float d = pt.decay[t], b = pt.beta[t];
      // The row's two dot products as BY_ROW_SUMS partial sums each: chains of KC / BY_ROW_SUMS
      // FMAs, not KC (the next token's products wait for this token's update).
      vf16 akp[BY_ROW_SUMS], aqp[BY_ROW_SUMS];
      for (int c = 0; c < BY_ROW_SUMS; ++c) akp[c] = s[c] * k_of(t, c), aqp[c] = s[c] * q_of(t, c);
      for (int c = BY_ROW_SUMS; c < KC; ++c) {
        akp[c % BY_ROW_SUMS] += s[c] * k_of(t, c);
        aqp[c % BY_ROW_SUMS] += s[c] * q_of(t, c);
      }
      const vf16 ak = sum_partials<BY_ROW_SUMS>(akp), aq = sum_partials<BY_ROW_SUMS>(aqp);
      const float u = b * (vs[t][r] - d * hsum(ak));
      os[t][r] = d * hsum(aq) + u * kq[t];
      for (int c = 0; c < KC; ++c) s[c] = s[c] * d + k_of(t, c) * u;
      if (A[t]) vstore_states(A[t] + r * KD, s, KC, stream_a[t]);
    }
    if (B) vstore_states(B + r * KD, s, KC, stream_b);
  }
  for (int32_t t = 0; t < L; ++t) store_rows(p.out, orow[t], nr, vload(os[t]));
}

static inline void recurrent_rows_vk(const GdnDeltaParams &p, RecurrentSeq rs, const PreparedTokens &pt, int32_t hv,
                                     int32_t v0, int32_t h) {
  const int32_t nr = sycl::min(16, p.V - v0);  // rows of this pass (the last may be short)
  if (rs.skip) {
    for (int32_t r = 0; r < nr; ++r) zero_outputs(p, rs.j0, rs.len, hv, v0 + r);
    return;
  }
  if constexpr (sizeof(state_t) == 4) {  // f32: walk_rows_vk<false> is not built (one token: by row)
    if (pt.n == 1) walk_rows_vk_by_row<1>(p, rs, pt, hv, v0, nr);
    else if (pt.n) walk_rows_vk_by_row<0>(p, rs, pt, hv, v0, nr);
    else walk_rows_vk<true>(p, rs, pt, hv, v0, nr, h);  // (pt.n = 0: longer than GDN_WALK_TOKENS)
  } else if (rs.len == 1) {
    walk_rows_vk<false>(p, rs, pt, hv, v0, nr, h);
  } else {
    walk_rows_vk<true>(p, rs, pt, hv, v0, nr, h);
  }
}
#undef KC

// The state rows of a work-item: v .. v + GDN_VK_ITEM_ROWS - 1 (at V = 128: the whole state of
// the head, 64 KB contiguous) of (seq, hv), 16 at a time.
static inline int32_t item_span(const GdnDeltaParams &) { return GDN_VK_ITEM_ROWS; }
GDN_NOINLINE void recurrent_item(const GdnDeltaParams &p, int32_t seq, int32_t hv, int32_t v) {
  RecurrentSeq rs;
  if (seq >= p.num_seqs || !recurrent_seq(p, seq, &rs)) return;
  const int32_t h = hv / (p.HV / p.H);
  PreparedTokens pt;
  pt.n = 0;
  if (!rs.skip && rs.len <= GDN_WALK_TOKENS) pt.prepare(p, rs, h, hv);
  // (rs by value: each pass advances its own copy of the checkpoint cursor)
  for (int32_t r = v; r < sycl::min(p.V, v + GDN_VK_ITEM_ROWS); r += GDN_VK_ROWS) recurrent_rows_vk(p, rs, pt, hv, r, h);
}

// Global (num_seqs*HV, V / GDN_VK_ITEM_ROWS rounded up), local (1, 1): a work-item walks
// GDN_VK_ITEM_ROWS rows. (A work-item per 16 rows: decode B=8 1.01 ms against 0.90 here, same run.)
GDN_KERNEL(2) void gdn_recurrent_vk_cpu(GdnDeltaParams p) {
  const auto it = item2();
  recurrent_item(p, (int32_t)(it.get_group(0) / p.HV), (int32_t)(it.get_group(0) % p.HV),
                 (int32_t)it.get_group(1) * item_span(p));
}
#endif

GDN_KERNEL(2) void gdn_fused_cpu(GdnFusedParams fp) {  // (see fused_conv)
  const GdnDeltaParams &p = fp.delta;
  const auto it = item2();
  const int32_t seq = (int32_t)(it.get_group(0) / p.H), h = (int32_t)(it.get_group(0) % p.H);
  if (seq >= p.num_seqs) return;
  fused_conv(fp.conv, p, seq, h);
  // While this work-item walks its states, the lines the next one's conv reads first come in
  // (conv_prefetch; the next group id: the work-item this core most likely runs next). Without it
  // the conv's first loads of each window column waited for DRAM. Alternated in one process from
  // DRAM, stop 35 (the bench's time-major conv state, balanced order): bf16 decode B=8 / B=32
  // 0.351 -> 0.342 / 0.998 -> 0.975 ms, spec B=8 S=1 0.594 -> 0.563, S=3 1.124 -> 1.002 (a slower
  // run: S=1 / S=3 / S=7 2-4%); f32 decode within 1%, spec B=8 S=3 / S=7 3-4%; B=1 within noise.
  const int32_t next = (int32_t)it.get_group(0) + 1;
  if (next / p.H < p.num_seqs) {
    const KHeadChannels next_head = k_head_channels(p, next % p.H);
    for (const auto &r : next_head.r) conv_prefetch(fp.conv, next / p.H, r[0], r[1], p.group == GDN_GROUP_SPEC);
  }
  for (int32_t hv = h * (p.HV / p.H); hv < (h + 1) * (p.HV / p.H); ++hv)
    for (int32_t v = 0; v < p.V; v += item_span(p)) recurrent_item(p, seq, hv, v);
}
