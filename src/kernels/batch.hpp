// batch.hpp — what a kernel reads of a batch's token groups (device code, compiled at run time): a
// token's global row, a sequence's tokens, its block checkpoints.
#pragma once
#include <stdint.h>
#include "params.hpp"

// Global row of the j-th token of a group (non-spec or spec): identity when no index array.
static inline int64_t global_row(const int32_t *token_indx, int32_t j) {
  return token_indx ? (int64_t)token_indx[j] : (int64_t)j;
}

// The compact tokens [j0, j0 + len) of sequence seq of a token group of num_tokens tokens, from its
// start locations clamped into [0, num_tokens] (the end not before the start), len at most
// max_len (spec sequences: 1 + num_spec). Whatever start locations a call brings
// (GDN_VALIDATE_COUNTS reads none back), a sequence's tokens are tokens of its group: no kernel
// walks outside the group's rows, a spec sequence outside its row of slots.
struct SeqSpan {
  int32_t j0, len;
};
static inline SeqSpan seq_span(const int32_t *qsl, int32_t seq, int32_t num_tokens, int32_t max_len) {
  const int32_t b = qsl[seq], e = qsl[seq + 1];
  const int32_t j0 = b < 0 ? 0 : b > num_tokens ? num_tokens : b;
  const int32_t j1 = e < j0 ? j0 : e > num_tokens ? num_tokens : e;
  return {j0, j1 - j0 < max_len ? j1 - j0 : max_len};
}

// The block checkpoints of a non-spec sequence (gdn_xpu.h "State caches"), walked token by token
// in ascending order: after(t) is the slot to store the state after token t (0-based in the step)
// to, pad_slot_id when t is no boundary or its checkpoint is not stored. One comparison per
// token; the divisions happen once, in checkpoints(). The range check keeps a call under
// GDN_VALIDATE_COUNTS inside the checkpoint row whatever the metadata says.
struct Checkpoints {
  const int32_t *row;  // the sequence's checkpoint slots, null: none
  int64_t next, k;     // the next boundary token and its index among the step's boundaries
  int64_t interval;
  int32_t cols, pad;
  int32_t after(int64_t t) {
    if (!row || t != next) return pad;
    const int32_t slot = k >= 0 && k < cols ? row[k] : pad;
    next += interval, ++k;
    return slot;
  }
};
// The walk of sequence seq from its token t0 on; start = tokens already in its state.
static inline Checkpoints checkpoints(const GdnSlotUse &u, int32_t seq, int64_t start, int64_t t0, int32_t pad) {
  Checkpoints w{nullptr, -1, 0, u.ckpt_interval, u.ckpt_cols, pad};
  if (u.ckpt_interval <= 0 || !u.ckpt_indices) return w;
  const int64_t I = u.ckpt_interval, m = (start + t0 + I) / I;  // first boundary: (start + t + 1) = m I, t >= t0
  w.row = u.ckpt_indices + (int64_t)seq * u.ckpt_cols;
  w.next = m * I - start - 1;
  w.k = m - start / I - 1;
  return w;
}
