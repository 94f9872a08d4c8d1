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
#define KD GDN_HEAD_K
#if GDN_VK_LAYOUT
#define K_STRIDE 1
#define V_STRIDE KD
#else
#define K_STRIDE p.V
#define V_STRIDE 1
#endif

// S[:, v] of (slot, v-head): element k at [k * K_STRIDE].
static inline state_t *state_column(const GdnDeltaParams &p, int32_t slot, int32_t hv, int32_t v) {
  return (state_t *)p.ssm + (int64_t)slot * p.slot_stride + (int64_t)hv * KD * p.V + (int64_t)v * V_STRIDE;
}

static inline void zero_outputs(const GdnDeltaParams &p, int32_t j0, int32_t len, int32_t hv, int32_t v) {
  for (int32_t t = 0; t < len; ++t)
    store_act(p.out, global_row(p.token_indx, j0 + t) * p.out_stride + (int64_t)hv * p.V + v, 0.0f);
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
    s.read_slot = u.read_indices ? u.read_indices[seq] : s.cols[p.num_accepted[seq] - 1];
    s.skip = !u.read_indices && s.read_slot == p.pad_slot_id;
    s.init = s.read_slot != p.pad_slot_id;
  } else {
    s.read_slot = u.read_indices ? u.read_indices[seq] : s.cols[0];
    s.skip = s.cols[0] == p.pad_slot_id;
    s.init = (!p.has_initial_state || p.has_initial_state[seq]) && s.read_slot != p.pad_slot_id;
  }
  return s;
}

// The token walk of one sequence of the bound group, as the recurrent kernels see it.
struct RecurrentSeq : SeqSlots {
  int32_t j0, len;        // compact tokens [j0, j0 + len)
  bool spec;
  Checkpoints ckpt;       // non-spec: its block checkpoints
};

// False when the recurrent kernels have nothing to do for this sequence: no tokens, or a
// prefill the chunk kernels take (gdn_chunk_plan marked it).
static inline bool recurrent_seq(const GdnDeltaParams &p, int32_t seq, RecurrentSeq *r) {
  r->j0 = p.query_start_loc[seq];
  r->len = p.query_start_loc[seq + 1] - r->j0;
  r->spec = p.group == GDN_GROUP_SPEC;
  if (r->len == 0 || (!r->spec && p.chunked && p.chunked[seq])) return false;
  *static_cast<SeqSlots *>(r) = seq_slots(p, seq, r->spec);
  r->ckpt = r->spec ? Checkpoints{nullptr, -1, 0, 0, 0, p.pad_slot_id} : checkpoints(p.slots, seq, r->start, 0, p.pad_slot_id);
  return true;
}

// The slot the walk stores the state after token t to (t ascending; pad_slot_id: none): spec
// sequences their column t, non-spec sequences their checkpoint at a boundary.
static inline int32_t token_store_slot(RecurrentSeq &r, int32_t t) { return r.spec ? r.cols[t] : r.ckpt.after(t); }
