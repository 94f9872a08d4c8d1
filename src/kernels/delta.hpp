// delta.hpp — what every gated-delta-rule kernel shares (compiled at run time).
// Built per (activation dtype, head_k_dim, ssm layout): -DGDN_HEAD_K=<K> sizes the per-work-item
// state so loops over K are fixed-trip; -DGDN_VK_LAYOUT=0/1 makes the ssm_state layout a compile-time
// variant (constant strides: a work-item's column is contiguous across the work-group, and the CPU
// device vectorizes it).
//
// The algorithm forms (docs/design.md; the same decomposition on the CPU device and GPUs):
//   delta_prep.cpp       gdn_prep: l2norm q/k, scale q, gates, per (row, k-head);
//                        gdn_chunk_plan: the chunk tables of the prefills, on the device
//   delta_recurrent.cpp  the token recurrence (decode, spec decode, FORCE_RECURRENT prefill);
//                        delta_recurrent_cpu.cpp: its CPU-device variants and the fused step
//                        (walks in delta_recurrent_{vk,kv}_cpu.hpp)
//   delta_chunk.cpp      the chunked WY/UT prefill form; delta_chunk_cpu.cpp: CPU-device variants
#pragma once
#include "common.hpp"

#ifndef GDN_HEAD_K
#error "GDN_HEAD_K must be defined"
#endif
// The build's head_k_dim.
constexpr int kHeadK = GDN_HEAD_K;
// -DGDN_CHANNEL_GATE=1 (a config with gdn_xpu.h's GDN_GATE_CHANNEL, KDA): state row k decays by its
// own gate; the gate arrays (prep's g, a ring entry's g) hold kGateK values per v-head and token.
#ifndef GDN_CHANNEL_GATE
#define GDN_CHANNEL_GATE 0
#endif
constexpr int kGateK = gdn_gate_k(GDN_CHANNEL_GATE ? GDN_GATE_CHANNEL : GDN_GATE_HEAD, kHeadK);
// -DGDN_WITH_REPLAY=0 (the CPU recurrent builds of a config without replay mode, replay_tokens = 0)
// leaves replay's code out (gdn_xpu.h "Replay mode": the state-only walk instances, the ring
// writes): about 40% less back-end compile time for that build. The CPU walks round a state alike in
// either build (explicit FMAs, delta_recurrent_cpu.hpp held_update); the generic recurrent kernel
// leaves contraction to the compiler, so its per-token and replay modes share one build.
#ifndef GDN_WITH_REPLAY
#define GDN_WITH_REPLAY 1
#endif

// A v-head's state S[k, v] (K x V) in the build's ssm layout (-DGDN_VK_LAYOUT): element (k, v) at
// k * k_stride(p) + v * kVStride.
static inline int32_t k_stride(const GdnDeltaParams &p) {
#if GDN_VK_LAYOUT
  return 1;
#else
  return p.V;
#endif
}
#if GDN_VK_LAYOUT
constexpr int kVStride = kHeadK;
#else
constexpr int kVStride = 1;
#endif

// S[:, v] of (slot, v-head): element k at [k * k_stride(p)].
static inline state_t *state_column(const GdnDeltaParams &p, int32_t slot, int32_t hv, int32_t v) {
  return (state_t *)p.ssm + (int64_t)slot * p.slot_stride + (int64_t)hv * kHeadK * p.V + (int64_t)v * kVStride;
}

// The scale of state row v of (slot, v-head) (gdn_xpu.h "State dtype"): 8-bit states' f32 scale,
// where the row's codes are stored with it; 1 for the other dtypes (no scales).
static inline float *row_scale_at(const GdnDeltaParams &p, int32_t slot, int32_t hv, int32_t v) {
  return p.ssm_scale + (int64_t)slot * p.scale_stride + (int64_t)hv * p.V + v;
}
static inline float row_scale(const GdnDeltaParams &p, int32_t slot, int32_t hv, int32_t v) {
#if GDN_STATE_8BIT
  return *row_scale_at(p, slot, hv, v);
#else
  (void)p, (void)slot, (void)hv, (void)v;
  return 1.0f;
#endif
}

// Where a stored row's scale goes: row_scale_at for 8-bit states, nullptr otherwise (no scales).
static inline float *row_scale_dst(const GdnDeltaParams &p, int32_t slot, int32_t hv, int32_t v) {
#if GDN_STATE_8BIT
  return row_scale_at(p, slot, hv, v);
#else
  (void)p, (void)slot, (void)hv, (void)v;
  return nullptr;
#endif
}

static inline void zero_outputs(const GdnDeltaParams &p, int32_t j0, int32_t len, int32_t hv, int32_t v) {
  for (int32_t t = 0; t < len; ++t)
    store_act(p.out, global_row(p.token_indx, j0 + t) * p.out_stride + (int64_t)hv * p.V + v, 0.0f);
}

// The tokens of sequence seq of the bound group (seq_span; a spec sequence has 1 + num_spec at most).
static inline SeqSpan delta_span(const GdnDeltaParams &p, int32_t seq, bool spec) {
  return seq_span(p.query_start_loc, seq, p.num_tokens, spec ? p.slot_cols : p.num_tokens);
}

// The slots of one sequence of the bound group (gdn_xpu.h "State caches").
struct SeqSlots {
  const int32_t *cols;    // write slots: spec [n][t], non-spec the one slot [0]
  int32_t read_slot;      // where the initial state comes from (when init)
  bool skip, init;        // skip: graph padding (zero outputs, nothing read or written);
                          // init: start from the read slot's state (else zeros)
  int64_t start;          // non-spec: tokens already in the state (block checkpoints)
};

static inline SeqSlots seq_slots(const GdnDeltaParams &p, int32_t seq, bool spec) {
  SeqSlots s;
  const GdnSlotUse &u = p.slots;
  s.cols = spec ? p.state_indices + (int64_t)seq * p.slot_cols : p.state_indices + seq;
  s.start = !spec && u.start_pos ? u.start_pos[seq] : 0;
  if (spec) {
    // An explicit read slot may be pad ("nothing to read": zeros); the version-1 default read
    // slot [n][A-1] being pad makes the sequence padding.
    s.read_slot = u.read_indices ? u.read_indices[seq] : s.cols[gdn_accepted(p.num_accepted, seq, p.slot_cols) - 1];
    s.skip = !u.read_indices && gdn_is_pad(s.read_slot, p.pad_slot_id);
    s.init = !gdn_is_pad(s.read_slot, p.pad_slot_id);
  } else {
    s.read_slot = u.read_indices ? u.read_indices[seq] : s.cols[0];
    s.skip = gdn_is_pad(s.cols[0], p.pad_slot_id);
    s.init = (!p.has_initial_state || p.has_initial_state[seq]) && !gdn_is_pad(s.read_slot, p.pad_slot_id);
  }
  return s;
}

// The token walk of one sequence of the bound group, as the recurrent kernels see it.
struct RecurrentSeq : SeqSlots {
  int32_t j0, len;        // compact tokens [j0, j0 + len)
  bool spec;
  Checkpoints ckpt;       // non-spec: its block checkpoints
  // Replay mode (GDN_REPLAY_*). mode APPLY walks len = A ring entries from ring_in (token t: entry
  // t, its "row" t), no outputs, as a walk of form_len = R tokens would (the per-token mode's walk
  // whose states it reproduces: a CPU walk's form depends on its length). mode WALK writes each
  // token's inputs to ring_out (entry t): k by the item with ring_k, v of the item's columns
  // [ring_v0, ring_v0 + ring_vn), g and beta by the item with ring_v0 == 0.
  int32_t mode, form_len;
  int32_t final_slot;     // where the state after the walk goes (pad: nowhere)
  const float *ring_in;
  float *ring_out;
  int32_t ring_v0, ring_vn;
  bool ring_k;
};

static inline float *ring_entry(const GdnDeltaParams &p, int32_t slot) {
  return p.ring + (int64_t)slot * p.ring_tokens * p.ring_floats;
}

// The replay's view of spec sequence seq (GDN_REPLAY_APPLY; gdn_xpu.h "Replay mode"): false
// when there is nothing to do (padding, no tokens, nothing to replay with the state already in
// place). len 0: copy the read slot's state (zeros: pad) to the committed slot.
static inline bool replay_seq(const GdnDeltaParams &p, int32_t seq, RecurrentSeq *r) {
  if (p.query_start_loc && delta_span(p, seq, true).len == 0) return false;
  r->cols = p.state_indices + (int64_t)seq * p.slot_cols;
  const int32_t c = r->cols[0];
  if (gdn_is_pad(c, p.pad_slot_id)) return false;
  const int32_t read = p.slots.read_indices ? p.slots.read_indices[seq] : c;
  r->read_slot = read < 0 ? p.pad_slot_id : read;  // any pad as pad_slot_id (gdn_is_pad)
  r->init = r->read_slot != p.pad_slot_id;
  const int32_t R = r->init ? sycl::clamp(p.ring_count[r->read_slot], 0, p.ring_tokens) : 0;
  // A step's A (clamped as every reader's); gdn_flush_replay (no start locations) binds its
  // num_tokens here, 0..R, checked on the host. A <= R: checked under GDN_VALIDATE_FULL.
  const int32_t A = p.query_start_loc ? gdn_accepted(p.num_accepted, seq, p.slot_cols) : p.num_accepted[seq];
  r->len = sycl::min(A, R);
  if (r->len <= 0 && r->read_slot == c) return false;
  r->len = sycl::max(r->len, 0);
  r->skip = false, r->start = 0, r->j0 = 0, r->spec = true;
  r->ckpt = Checkpoints{nullptr, -1, 0, 0, 0, p.pad_slot_id};
  r->mode = GDN_REPLAY_APPLY, r->form_len = R, r->final_slot = c;
  r->ring_in = r->len > 0 ? ring_entry(p, r->read_slot) : nullptr;
  r->ring_out = nullptr;
  return true;
}

// False when the recurrent kernels have nothing to do for this sequence: no tokens, or a
// prefill the chunk kernels take (gdn_chunk_plan marked it).
static inline bool recurrent_seq(const GdnDeltaParams &p, int32_t seq, RecurrentSeq *r) {
  const bool spec = p.group == GDN_GROUP_SPEC;
  if (GDN_WITH_REPLAY && spec && p.replay == GDN_REPLAY_APPLY) return replay_seq(p, seq, r);
  const SeqSpan span = delta_span(p, seq, spec);
  r->j0 = span.j0, r->len = span.len;
  r->spec = spec;
  if (r->len == 0 || (!r->spec && p.chunked && p.chunked[seq])) return false;
  *static_cast<SeqSlots *>(r) = seq_slots(p, seq, r->spec);
  r->ckpt = r->spec ? Checkpoints{nullptr, -1, 0, 0, 0, p.pad_slot_id} : checkpoints(p.slots, seq, r->start, 0, p.pad_slot_id);
  r->mode = GDN_WITH_REPLAY && spec ? p.replay : GDN_REPLAY_OFF, r->form_len = r->len;
  r->final_slot = spec ? p.pad_slot_id : r->cols[0];
  r->ring_in = nullptr, r->ring_out = nullptr;
  r->ring_v0 = r->ring_vn = 0, r->ring_k = false;
  if (r->mode == GDN_REPLAY_WALK) {  // the replay (its launch, or gdn_fused_cpu's work-item) made [n][0] current
    r->read_slot = r->cols[0];
    r->skip = gdn_is_pad(r->read_slot, p.pad_slot_id);
    r->init = !r->skip;
    if (!r->skip) r->ring_out = ring_entry(p, r->read_slot);
  }
  return true;
}

// The slot the walk stores the state after token t to (t ascending; pad_slot_id: none): spec
// sequences their column t (in replay mode none), non-spec sequences their checkpoint at a boundary.
static inline int32_t token_store_slot(RecurrentSeq &r, int32_t t) {
  return r.mode != GDN_REPLAY_OFF ? r.ckpt.pad : r.spec ? r.cols[t] : r.ckpt.after(t);
}

// Token `row`'s v at column v of v-head hv: index into the conv output (row: a global row), or in
// a replay into the read slot's ring (row: the entry).
static inline int64_t v_index(const GdnDeltaParams &p, const RecurrentSeq &r, int64_t row, int32_t hv, int32_t v) {
  const int64_t col = (int64_t)hv * p.V + v;
  return r.ring_in ? row * p.ring_floats + gdn_ring_v(p.H, kHeadK) + col : row * p.qkv_stride + p.v_offset + col;
}
static inline float v_at(const GdnDeltaParams &p, const RecurrentSeq &r, int64_t i) {
  return r.ring_in ? r.ring_in[i] : load_act(p.qkv, i);
}

// Offsets of a ring entry's g and beta of v-head hv (params.hpp).
static inline int64_t ring_g(const GdnDeltaParams &p, int32_t hv) { return gdn_ring_g(p.H, p.HV, kHeadK, p.V) + (int64_t)hv * kGateK; }
static inline int64_t ring_beta(const GdnDeltaParams &p, int32_t hv) { return gdn_ring_beta(p.H, p.HV, kHeadK, p.V, kGateK) + hv; }

// Replay WALK: token t's g (kGateK values) and beta of v-head hv and the v of the item's columns to its
// ring entry (k: the CPU walks' token_in). GDN_REPLAY_APPLY reads them back bit for bit (v widened
// to f32 exactly).
static inline void ring_write_v(const GdnDeltaParams &p, const RecurrentSeq &r, int32_t t, int64_t row, int32_t hv,
                                const float *g, float beta) {
  float *e = r.ring_out + (int64_t)t * p.ring_floats;
  if (r.ring_v0 == 0) {
    for (int c = 0; c < kGateK; ++c) e[ring_g(p, hv) + c] = g[c];
    e[ring_beta(p, hv)] = beta;
  }
  const int64_t src = row * p.qkv_stride + p.v_offset + (int64_t)hv * p.V, dst = gdn_ring_v(p.H, kHeadK) + (int64_t)hv * p.V;
  for (int32_t v = r.ring_v0; v < r.ring_v0 + r.ring_vn; ++v) e[dst + v] = load_act(p.qkv, src + v);
}
