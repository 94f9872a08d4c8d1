// conv1d.cpp — depthwise causal conv1d over time (+ SiLU) for GDN, one work-item per
// (sequence, channel). A work-item walks its sequence's tokens in order with the W-1 input
// window in registers, so it reads its history before anyone writes it and needs no temporary
// state buffer: a sequence's slot is owned by exactly one sequence in a call (validated).
#include "common.hpp"

#define GDN_MAX_WIDTH 8

static inline int64_t state_off(const GdnConvStateView &s, int32_t slot, int32_t c, int32_t col) {
  return (int64_t)slot * s.slot_stride + (int64_t)c * s.chan_stride + (int64_t)col * s.col_stride;
}

// One token: y = bias + sum_i w[i] * window_i, window = [hist(W-1) ..., x]; shifts x into hist.
// T is float (one channel) or vf16 (16 channels, the CPU variant).
template <class T>
static inline T conv_token(const T *w, T bias, T *hist, int32_t width, T x, bool act) {
  T y = bias;
  for (int32_t i = 0; i < width - 1; ++i) y += w[i] * hist[i];
  y += w[width - 1] * x;
  for (int32_t i = 0; i + 1 < width - 1; ++i) hist[i] = hist[i + 1];
  if (width > 1) hist[width - 2] = x;
  return act ? silu(y) : y;
}

static inline void load_weights(const GdnConvParams &p, int32_t c, float *w, float *bias) {
  for (int32_t i = 0; i < p.width; ++i) w[i] = load_act(p.weight, (int64_t)c * p.width + i);
  *bias = p.bias ? load_act(p.bias, c) : 0.0f;
}

// The sequence comes from the group id of dimension 0 (local range 1 there), so the CPU device's
// vectorizer sees it, the token loop bounds and the slot as uniform across the work-group.
static inline bool seq_and_channel(const GdnConvParams &p, int32_t *seq, int32_t *c) {
  const auto it = item2();
  *seq = (int32_t)it.get_group(0);
  *c = (int32_t)it.get_global_id(1);
  return *seq < p.num_seqs && *c < p.conv_dim;
}

// Prefill and plain decode sequences. Global (num_seqs, conv_dim rounded up), local (1, w).
GDN_KERNEL(2) void gdn_conv_non_spec(GdnConvParams p) {
  int32_t seq, c;
  if (!seq_and_channel(p, &seq, &c)) return;
  const int32_t j0 = p.query_start_loc[seq], j1 = p.query_start_loc[seq + 1];
  if (j0 == j1) return;  // a zero-length sequence touches nothing, its state included
  const int32_t slot = p.state_indices[seq];
  if (slot == p.pad_slot_id) {  // graph padding: zero outputs, no state access
    for (int32_t j = j0; j < j1; ++j) store_act(p.out, global_row(p.token_indx, j) * p.out_stride + c, 0.0f);
    return;
  }
  float w[GDN_MAX_WIDTH], bias, hist[GDN_MAX_WIDTH];
  load_weights(p, c, w, &bias);
  const bool has_init = !p.has_initial_state || p.has_initial_state[seq];
  for (int32_t i = 0; i < p.width - 1; ++i)
    hist[i] = has_init ? load_act(p.state.base, state_off(p.state, slot, c, i)) : 0.0f;
  for (int32_t j = j0; j < j1; ++j) {
    const int64_t row = global_row(p.token_indx, j);
    const float x = load_act(p.x, row * p.x_stride + c);
    store_act(p.out, row * p.out_stride + c, conv_token(w, bias, hist, p.width, x, p.silu));
  }
  for (int32_t i = 0; i < p.width - 1; ++i) store_act(p.state.base, state_off(p.state, slot, c, i), hist[i]);
}

// Speculative sequences, both conv-state layouts (see gdn_conv_spec_layout_t in gdn_xpu.h).
GDN_KERNEL(2) void gdn_conv_spec(GdnConvParams p) {
  int32_t seq, c;
  if (!seq_and_channel(p, &seq, &c)) return;
  const int32_t j0 = p.query_start_loc[seq], len = p.query_start_loc[seq + 1] - j0;
  if (len == 0) return;  // graph padding: no rows, no state change (ROLLED would otherwise shift the line)
  const int32_t *cols = p.state_indices + (int64_t)seq * p.slot_cols;
  const int32_t accepted = p.num_accepted[seq];
  const int32_t w1 = p.width - 1;
  // ROLLED keeps one line (cols[0]) and offsets into it; SNAPSHOT reads the slot of the last accepted token.
  const int32_t read_slot = p.rolled ? cols[0] : cols[accepted - 1];
  const int32_t read_col0 = p.rolled ? accepted - 1 : 0;
  if (p.rolled && read_slot == p.pad_slot_id) {
    for (int32_t t = 0; t < len; ++t) store_act(p.out, global_row(p.token_indx, j0 + t) * p.out_stride + c, 0.0f);
    return;
  }
  float w[GDN_MAX_WIDTH], bias, hist[GDN_MAX_WIDTH];
  load_weights(p, c, w, &bias);
  for (int32_t i = 0; i < w1; ++i)
    hist[i] = read_slot == p.pad_slot_id ? 0.0f : load_act(p.state.base, state_off(p.state, read_slot, c, read_col0 + i));
  if (p.rolled) {
    // Columns 0..W-3 := the W-2 inputs just before token 0 (hist[1..W-2]); the tokens follow below.
    for (int32_t i = 0; i + 1 < w1; ++i) store_act(p.state.base, state_off(p.state, read_slot, c, i), hist[i + 1]);
  }
  for (int32_t t = 0; t < len; ++t) {
    const int64_t row = global_row(p.token_indx, j0 + t);
    const float x = load_act(p.x, row * p.x_stride + c);
    store_act(p.out, row * p.out_stride + c, conv_token(w, bias, hist, p.width, x, p.silu));
    if (p.rolled) {
      store_act(p.state.base, state_off(p.state, read_slot, c, w1 - 1 + t), x);
    } else if (cols[t] != p.pad_slot_id) {
      for (int32_t i = 0; i < w1; ++i) store_act(p.state.base, state_off(p.state, cols[t], c, i), hist[i]);
    }
  }
}

// CPU-device variant of gdn_conv_non_spec (host picks it when conv_dim % 16 == 0): a work-item
// owns 16 consecutive channels as vectors, so every load and store is 16 contiguous elements.
GDN_KERNEL(2) void gdn_conv_non_spec_cpu(GdnConvParams p) {
  const auto it = item2();
  const int32_t seq = (int32_t)it.get_group(0), c0 = (int32_t)it.get_global_id(1) * 16;
  if (seq >= p.num_seqs || c0 >= p.conv_dim) return;
  const int32_t j0 = p.query_start_loc[seq], j1 = p.query_start_loc[seq + 1];
  if (j0 == j1) return;  // a zero-length sequence touches nothing, its state included
  const int32_t slot = p.state_indices[seq];
  if (slot == p.pad_slot_id) {
    for (int32_t j = j0; j < j1; ++j) store_act16(p.out, global_row(p.token_indx, j) * p.out_stride + c0, vf16(0.0f));
    return;
  }
  vf16 w[GDN_MAX_WIDTH], hist[GDN_MAX_WIDTH];
  for (int32_t i = 0; i < p.width; ++i)
    for (int l = 0; l < 16; ++l) w[i][l] = load_act(p.weight, (int64_t)(c0 + l) * p.width + i);
  const vf16 bias = p.bias ? load_act16(p.bias, c0) : vf16(0.0f);
  const bool has_init = !p.has_initial_state || p.has_initial_state[seq];
  for (int32_t i = 0; i < p.width - 1; ++i)
    for (int l = 0; l < 16; ++l) hist[i][l] = has_init ? load_act(p.state.base, state_off(p.state, slot, c0 + l, i)) : 0.0f;
  for (int32_t j = j0; j < j1; ++j) {
    const int64_t row = global_row(p.token_indx, j);
    const vf16 x = load_act16(p.x, row * p.x_stride + c0);
    store_act16(p.out, row * p.out_stride + c0, conv_token(w, bias, hist, p.width, x, p.silu));
  }
  for (int32_t i = 0; i < p.width - 1; ++i)
    for (int l = 0; l < 16; ++l) store_act(p.state.base, state_off(p.state, slot, c0 + l, i), hist[i][l]);
}
