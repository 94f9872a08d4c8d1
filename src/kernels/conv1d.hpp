// conv1d.hpp — depthwise causal conv1d over time (+ SiLU) for GDN: the algorithm, shared by the
// generic kernels (conv1d.cpp, one channel per work-item: GPUs) and the CPU device's variants
// (conv1d_cpu.cpp, blocks of 16 channels as one vector each), through Lanes<N> (vec16.hpp).
// Speculative sequences: one work-item per (sequence, channel) walks the sequence's few tokens
// in order with the W-1 input window in registers. Non-spec sequences (prefills can be thousands
// of tokens long) are tiled over time as well, see for_tile_parts. Either way a slot's state
// is read and written by one work-item only, and a slot belongs to one sequence of a call
// (validated), so no temporary state buffer is needed.
// Packed input (gdn_xpu.h, gdn_packed_order_t): every read of channel c of x goes to its column
// gdn_qkv_col(p.pack, c) (params.hpp; the identity for mixed_qkv), taken once per block of
// channels: a block of 16 never straddles a part of a packed row (plan.cpp, conv_blocks).
#pragma once
#include "common.hpp"

static inline int64_t state_off(const GdnConvStateView &s, int32_t slot, int32_t c, int32_t col) {
  return (int64_t)slot * s.slot_stride + (int64_t)c * s.chan_stride + (int64_t)col * s.col_stride;
}

// Shift x into the W-1 input history (oldest first), newest to oldest with the displaced value carried
// in a variable: the plain copy hist[i] = hist[i + 1] is the pattern LLVM turns into a memmove, which
// keeps the window in private memory (scratch on a GPU: dg2's gdn_conv_non_spec at width 8).
template <class T>
static inline void push_history(T *hist, int32_t width, T x) {
  for (int32_t i = width - 2; i >= 0; --i) {
    const T older = hist[i];
    hist[i] = x;
    x = older;
  }
}

// One token: y = bias + sum_i w[i] * window_i, window = [hist(W-1) ..., x]; shifts x into hist.
// T is float (one channel) or vf16 (16 channels, the CPU variant).
template <class T>
static inline T conv_token(const T *w, T bias, T *hist, int32_t width, T x, bool act) {
  T y = bias;
  for (int32_t i = 0; i < width - 1; ++i) y += w[i] * hist[i];
  y += w[width - 1] * x;
  push_history(hist, width, x);
  return act ? silu(y) : y;
}

// Tap I of 16 channels from their 64 weights (width 4), contiguous as v[0..3]: lanes I, I+4, ... of each.
template <int I>
static inline vf16 tap16x4(const native_vf16 *v) {
  typedef float n8 __attribute__((ext_vector_type(8)));
  const n8 a = __builtin_shufflevector(v[0], v[1], I, I + 4, I + 8, I + 12, I + 16, I + 20, I + 24, I + 28);
  const n8 b = __builtin_shufflevector(v[2], v[3], I, I + 4, I + 8, I + 12, I + 16, I + 20, I + 24, I + 28);
  return sycl::bit_cast<vf16>(__builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

// The weights ([C, W], row-major) of channels c..c+N-1: w[i] = tap i of each channel. 16 channels
// of width 4 (Qwen3-Next / Qwen3.5): four vector loads of their 64 contiguous weights, regrouped
// by shuffles (a strided load per tap went lane by lane: ~1/3 of the spec conv's time at S=3 B=8).
template <int N, int WIDTH>
static inline void load_weights(const void *weight, int32_t c, int32_t width, typename Lanes<N>::T *w) {
  if constexpr (N == 16 && WIDTH == 4) {
    native_vf16 v[4];
    for (int m = 0; m < 4; ++m) v[m] = sycl::bit_cast<native_vf16>(load_act16(weight, (int64_t)c * 4 + 16 * m));
    w[0] = tap16x4<0>(v), w[1] = tap16x4<1>(v), w[2] = tap16x4<2>(v), w[3] = tap16x4<3>(v);
  } else {
    for (int32_t i = 0; i < width; ++i) w[i] = Lanes<N>::load_act(weight, (int64_t)c * width + i, width);
  }
}

// The W-1 history columns from col0 of channels c..c+N-1 in a slot, and back. 16 channels of
// width 4 in the dim-major layout with exactly W-1 = 3 columns (chan_stride 3, col_stride 1):
// the window is 48 contiguous values, moved as three vectors regrouped by shuffles (a strided
// 16-lane load or store went lane by lane, ~200 instructions a window, and a dim-major decode's
// conv took ~15% longer). Elsewhere one load or store per column (contiguous in the
// time-major layout). The state holds inputs as they came: stores are store_act_exact (no rounding).
static inline bool window16x3(const GdnConvStateView &s) { return s.chan_stride == 3 && s.col_stride == 1; }
typedef float native_vf32 __attribute__((ext_vector_type(32)));
static inline native_vf32 cat16(const vf16 &a, const vf16 &b) {  // a's lanes, then b's
  return __builtin_shufflevector(sycl::bit_cast<native_vf16>(a), sycl::bit_cast<native_vf16>(b), 0, 1, 2, 3, 4, 5,
                                 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
                                 28, 29, 30, 31);
}
template <int N, int WIDTH>
static inline void load_window(const GdnConvStateView &s, int32_t slot, int32_t c, int32_t col0, int32_t w1,
                               typename Lanes<N>::T *hist) {
  if constexpr (N == 16 && WIDTH == 4)
    if (window16x3(s) && col0 == 0) {  // value e of the 48: column e % 3 of channel e / 3
      const int64_t off = state_off(s, slot, c, 0);
      const vf16 v2 = load_act16(s.base, off + 32);
      const native_vf32 a = cat16(load_act16(s.base, off), load_act16(s.base, off + 16)), b = cat16(v2, v2);
      hist[0] = sycl::bit_cast<vf16>(__builtin_shufflevector(a, b, 0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 36, 39, 42, 45));
      hist[1] = sycl::bit_cast<vf16>(__builtin_shufflevector(a, b, 1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 37, 40, 43, 46));
      hist[2] = sycl::bit_cast<vf16>(__builtin_shufflevector(a, b, 2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 44, 47));
      return;
    }
  for (int32_t i = 0; i < w1; ++i) hist[i] = Lanes<N>::load_act(s.base, state_off(s, slot, c, col0 + i), s.chan_stride);
}
template <int N, int WIDTH>
static inline void store_window(const GdnConvStateView &s, int32_t slot, int32_t c, int32_t w1,
                                const typename Lanes<N>::T *hist) {
  if constexpr (N == 16 && WIDTH == 4)
    if (window16x3(s)) {  // lanes 0-15: hist[0], 16-31: hist[1], 32-47: hist[2]
      const int64_t off = state_off(s, slot, c, 0);
      const native_vf32 a = cat16(hist[0], hist[1]), b = cat16(hist[2], hist[2]);
      store_act16_exact(s.base, off, sycl::bit_cast<vf16>(__builtin_shufflevector(a, b, 0, 16, 32, 1, 17, 33, 2, 18, 34, 3, 19, 35, 4, 20, 36, 5)));
      store_act16_exact(s.base, off + 16, sycl::bit_cast<vf16>(__builtin_shufflevector(a, b, 21, 37, 6, 22, 38, 7, 23, 39, 8, 24, 40, 9, 25, 41, 10, 26)));
      store_act16_exact(s.base, off + 32, sycl::bit_cast<vf16>(__builtin_shufflevector(a, b, 42, 11, 27, 43, 12, 28, 44, 13, 29, 45, 14, 30, 46, 15, 31, 47)));
      return;
    }
  for (int32_t i = 0; i < w1; ++i) Lanes<N>::store_act_exact(s.base, state_off(s, slot, c, i), hist[i], s.chan_stride);
}

// The sequence comes from the group id of dimension 0 (local range 1 there), so the CPU device's
// vectorizer sees it, the token loop bounds and the slot as uniform across the work-group.
static inline bool seq_and_channel(const GdnConvParams &p, int32_t *seq, int32_t *c) {
  const auto it = item2();
  *seq = (int32_t)it.get_group(0);
  *c = (int32_t)it.get_global_id(1);
  return *seq < p.num_seqs && *c < p.conv_dim + p.z_dim;
}

// The tokens of sequence seq of the bound group (seq_span; a spec sequence has 1 + num_spec at most).
static inline SeqSpan conv_span(const GdnConvParams &p, int32_t seq, bool spec) {
  return seq_span(p.query_start_loc, seq, p.num_tokens, spec ? p.slot_cols : p.num_tokens);
}

// z_out (packed x): the z elements [e, e+N) of the rows of the bound group's compact tokens
// [j0, j1) (copy_z_seq: sequence seq's tokens), copied bit for bit. The conv kernels run them as
// their channels conv_dim .. conv_dim+z_dim-1, each row by the work-item whose tile or sequence
// holds its token, in the pass that reads the row's q|k|v already.
template <int N>
static inline void copy_z_row(const GdnConvParams &p, int64_t row, int64_t zc, int32_t e) {  // zc: e's column
  act_t v[N];
  __builtin_memcpy(v, (const act_t *)p.x + row * p.x_stride + zc, sizeof v);
  __builtin_memcpy((act_t *)p.z_out + row * p.z_out_stride + e, v, sizeof v);
}
template <int N>
static inline void copy_z(const GdnConvParams &p, int32_t j0, int32_t j1, int32_t e) {
  const int64_t zc = gdn_z_col(p.pack, e);
  for (int32_t j = j0; j < j1; ++j) copy_z_row<N>(p, global_row(p.token_indx, j), zc, e);
}
template <int N>
static inline void copy_z_seq(const GdnConvParams &p, int32_t seq, bool spec, int32_t e) {
  const SeqSpan span = conv_span(p, seq, spec);
  copy_z<N>(p, span.j0, span.j0 + span.len, e);
}
// ... for the compact tokens of the non-spec conv's time tile `tile`.
template <int N>
static inline void copy_z_tile(const GdnConvParams &p, int32_t tile, int32_t e) {
  const int32_t t0 = tile * p.tile_len;
  copy_z<N>(p, t0, sycl::min(t0 + p.tile_len, p.num_tokens), e);
}
// ... in the z elements [e, e_end) (at most NB blocks of 16), row by row as conv_non_spec_rows
// walks (gdn_conv_non_spec_cpu).
template <int NB>
static inline void copy_z_rows(const GdnConvParams &p, int32_t tile, int32_t e, int32_t e_end) {
  const int32_t t0 = tile * p.tile_len, t1 = sycl::min(t0 + p.tile_len, p.num_tokens);
  const int32_t nb = sycl::min(NB, (e_end - e) / 16);
  int64_t zc[NB];
  for (int32_t b = 0; b < nb; ++b) zc[b] = gdn_z_col(p.pack, e + 16 * b);
  for (int32_t j = t0; j < t1; ++j)
    for (int32_t b = 0; b < nb; ++b) copy_z_row<16>(p, global_row(p.token_indx, j), zc[b], e + 16 * b);
}

// Where a speculative sequence's window comes from: ROLLED keeps one line (cols[0]) and reads the
// window at column A-1 of the read slot's line (by default that line itself); SNAPSHOT reads the
// slot of the last accepted token (by default). An explicit read slot (spec_read_state_indices)
// replaces the default; pad reads zeros.
struct SpecRead {
  int32_t line, slot, col0;
};
static inline SpecRead spec_read(const GdnConvParams &p, int32_t seq) {
  const int32_t *cols = p.state_indices + (int64_t)seq * p.slot_cols;
  const int32_t accepted = gdn_accepted(p.num_accepted, seq, p.slot_cols);
  return {cols[0], p.slots.read_indices ? p.slots.read_indices[seq] : p.rolled ? cols[0] : cols[accepted - 1],
          p.rolled ? accepted - 1 : 0};
}

// Speculative sequences, both conv-state layouts (see gdn_conv_spec_layout_t in gdn_xpu.h):
// channels c..c+N-1 of sequence seq. WIDTH is the conv width when known at compile time (0:
// p.width): a fixed width keeps the input history in registers (with a run-time width the CPU
// device's compiler moved it through memory, a memmove per token).
template <int N, int WIDTH>
static inline void conv_spec_channels(const GdnConvParams &p, int32_t seq, int32_t c) {
  typedef Lanes<N> L;
  typedef typename L::T T;
  const int32_t width = WIDTH ? WIDTH : p.width, w1 = width - 1;
  const SeqSpan span = conv_span(p, seq, true);
  const int32_t j0 = span.j0, len = span.len;
  if (len == 0) return;  // graph padding: no rows, no state change (ROLLED would otherwise shift the line)
  const int32_t *cols = p.state_indices + (int64_t)seq * p.slot_cols;
  const int64_t cs = p.state.chan_stride;
  const SpecRead rd = spec_read(p, seq);
  const int32_t line = rd.line, read_slot = rd.slot, read_col0 = rd.col0;
  if (p.rolled && gdn_is_pad(line, p.pad_slot_id)) {
    for (int32_t t = 0; t < len; ++t)
      L::store_act(p.out, global_row(p.token_indx, j0 + t) * p.out_stride + c, T(0.0f));
    return;
  }
  T w[GDN_MAX_CONV_WIDTH], hist[GDN_MAX_CONV_WIDTH];
  load_weights<N, WIDTH>(p.weight, c, width, w);
  const T bias = p.bias ? L::load_act(p.bias, c, 1) : T(0.0f);
  const int64_t xc = gdn_qkv_col(p.pack, c);
  if (gdn_is_pad(read_slot, p.pad_slot_id))
    for (int32_t i = 0; i < w1; ++i) hist[i] = T(0.0f);
  else
    load_window<N, WIDTH>(p.state, read_slot, c, read_col0, w1, hist);
  if (p.rolled) {
    // Columns 0..W-3 := the W-2 inputs just before token 0 (hist[1..W-2]); the tokens follow below.
    for (int32_t i = 0; i + 1 < w1; ++i) L::store_act_exact(p.state.base, state_off(p.state, line, c, i), hist[i + 1], cs);
  }
  for (int32_t t = 0; t < len; ++t) {
    const int64_t row = global_row(p.token_indx, j0 + t);
    const T x = L::load_act(p.x, row * p.x_stride + xc, 1);
    L::store_act(p.out, row * p.out_stride + c, conv_token(w, bias, hist, width, x, p.silu));
    if (p.rolled) {
      L::store_act_exact(p.state.base, state_off(p.state, line, c, w1 - 1 + t), x, cs);
    } else if (!gdn_is_pad(cols[t], p.pad_slot_id)) {
      store_window<N, WIDTH>(p.state, cols[t], c, w1, hist);
    }
  }
}

// A non-spec sequence's slot use (gdn_xpu.h "State caches"), the same for the tile and
// conv_decode_blocks: the slot its window is read from (an explicit read slot, else its own),
// whether it starts from that window (has_initial_state, and not a pad read), and its block
// checkpoints from token t0 of the step on.
struct NonSpecSlots {
  int32_t read;
  bool init;
  Checkpoints ckpt;
};
static inline NonSpecSlots non_spec_slots(const GdnConvParams &p, int32_t seq, int32_t slot, int32_t t0) {
  const int32_t read = p.slots.read_indices ? p.slots.read_indices[seq] : slot;
  return {read, (!p.has_initial_state || p.has_initial_state[seq]) && !gdn_is_pad(read, p.pad_slot_id),
          checkpoints(p.slots, seq, p.slots.start_pos ? p.slots.start_pos[seq] : 0, t0, p.pad_slot_id)};
}

// Prefill and plain decode sequences are tiled over time: the work-item of (tile, channel group)
// convolves the compact tokens [tile*tile_len, +tile_len) of every sequence overlapping the tile,
// in its channels. (One work-item per whole sequence strode a long prefill's rows one page apart
// and ran 5-10x slower on the CPU device; tiles also give a single long prefill parallelism.)
// A tile re-reads the W-1 inputs before its first token from x, so tiles are independent. The
// state is touched only by the owner, the tile holding the sequence's first token: it reads the
// slot, takes the sequence's first W-1 tokens even past its tile end (so later tiles never need
// the old state) and writes the new state, the last W-1 inputs of [old state, x of the sequence].
// Block checkpoints: the history after each boundary token, stored by the tile that convolves
// that token (tiles never share a token).
// A sequence's part of a tile: its compact tokens [j0, j1), the tokens [first, end) the tile
// convolves, its slot and slot use. The inputs before `first` are the read slot's window (owner,
// use.init), zeros (owner) or x's rows first-W+1 .. first-1.
struct TilePart {
  int32_t j0, j1, first, end, slot;
  bool owner;
  NonSpecSlots use;
};
// f(part) for each sequence with tokens to convolve in tile `tile`, from the last sequence
// starting at or before the tile's first token on (a binary search). A sequence with a pad
// slot (graph padding) gets zero outputs in channels [c, c + n) instead: no state access.
template <int N, class F>
static inline void for_tile_parts(const GdnConvParams &p, int32_t tile, int32_t w1, int32_t c, int32_t n, F f) {
  const int32_t *qsl = p.query_start_loc;
  const int32_t t0 = tile * p.tile_len, t1 = sycl::min(t0 + p.tile_len, p.num_tokens);
  int32_t lo = 0, hi = p.num_seqs;
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (qsl[mid] <= t0) lo = mid; else hi = mid;
  }
  for (int32_t seq = lo; seq < p.num_seqs && qsl[seq] < t1; ++seq) {
    const SeqSpan span = conv_span(p, seq, false);
    const int32_t j0 = span.j0, j1 = span.j0 + span.len;
    if (j0 == j1) continue;  // a zero-length sequence touches nothing, its state included
    const bool owner = j0 >= t0;
    const int32_t first = owner ? j0 : sycl::max(t0, j0 + w1);
    const int32_t end = owner ? sycl::max(sycl::min(t1, j1), sycl::min(j1, j0 + w1)) : sycl::min(t1, j1);
    if (first >= end) continue;
    const int32_t slot = p.state_indices[seq];
    if (gdn_is_pad(slot, p.pad_slot_id)) {
      for (int32_t j = first; j < end; ++j)
        for (int32_t e = c; e < c + n; e += N)
          Lanes<N>::store_act(p.out, global_row(p.token_indx, j) * p.out_stride + e, typename Lanes<N>::T(0.0f));
      continue;
    }
    f(TilePart{j0, j1, first, end, slot, owner, non_spec_slots(p, seq, slot, first - j0)});
  }
}

// The generic kernel's tile (and gdn_fused_cpu's conv, one token a tile): NB blocks of N channels
// from c (fewer where c_end comes first: gdn_fused_cpu takes one k-head's q, k or v channels),
// one block at a time over a sequence's tokens of the tile, its window in registers.
template <int N, int WIDTH, int NB>
static inline void conv_non_spec_tile(const GdnConvParams &p, int32_t tile, int32_t c, int32_t c_end) {
  typedef Lanes<N> L;
  typedef typename L::T T;
  const int32_t width = WIDTH ? WIDTH : p.width, w1 = width - 1;
  // (c < c_end, the callers': one channel at a time has a constant count, so w and bias are indexed
  // by constants, which keeps them in registers on GPUs)
  const int32_t nb = N == 1 && NB == 1 ? 1 : sycl::min(NB, (c_end - c) / N);
  T w[NB][GDN_MAX_CONV_WIDTH], bias[NB];
  for (int32_t b = 0; b < nb; ++b) {
    load_weights<N, WIDTH>(p.weight, c + N * b, width, w[b]);
    bias[b] = p.bias ? L::load_act(p.bias, c + N * b, 1) : T(0.0f);
  }
  for_tile_parts<N>(p, tile, w1, c, N * nb, [&](const TilePart &s) {
    for (int32_t b = 0; b < nb; ++b) {
      const int32_t cb = c + N * b;
      const int64_t xc = gdn_qkv_col(p.pack, cb);
      T hist[GDN_MAX_CONV_WIDTH];
      if (s.owner && s.use.init)
        load_window<N, WIDTH>(p.state, s.use.read, cb, 0, w1, hist);
      else
        for (int32_t i = 0; i < w1; ++i)
          hist[i] = s.owner ? T(0.0f) : L::load_act(p.x, global_row(p.token_indx, s.first - w1 + i) * p.x_stride + xc, 1);
      Checkpoints ckpt = s.use.ckpt;
      for (int32_t j = s.first; j < s.end; ++j) {
        const int64_t row = global_row(p.token_indx, j);
        const T x = L::load_act(p.x, row * p.x_stride + xc, 1);
        L::store_act(p.out, row * p.out_stride + cb, conv_token(w[b], bias[b], hist, width, x, p.silu));
        const int32_t to = ckpt.after(j - s.j0);
        if (!gdn_is_pad(to, p.pad_slot_id)) store_window<N, WIDTH>(p.state, to, cb, w1, hist);
      }
      if (!s.owner) continue;
      for (int32_t j = sycl::max(s.end, s.j1 - w1); j < s.j1; ++j)  // the inputs other tiles convolve
        push_history(hist, width, L::load_act(p.x, global_row(p.token_indx, j) * p.x_stride + xc, 1));
      store_window<N, WIDTH>(p.state, s.slot, cb, w1, hist);
    }
  });
}

// The CPU device's tile (gdn_conv_non_spec_cpu), walked row by row: NB blocks of 16 channels from
// c (fewer where c_end comes first), each token's NB blocks in turn, so loads and stores run along
// the rows -- GDN_CONV_ROW_BLOCKS blocks, 1024 channels, a 2 KB run of a bf16 row -- and the next
// token's run is asked for (prefetch_line) while this one computes. (Walked down a column of
// blocks, four at a time with their windows in registers, each token's lines a row past the last
// -- 16 KB at Qwen3-Next's bf16 conv_dim, a walk no hardware prefetcher follows -- a 2048-token
// prefill's conv took ~2x as long.) The W-1 inputs before a token come from a ring of rows of
// floats in private memory: R >= W rows of NB vectors, a token's input going into the row of the
// oldest, no longer needed. The weights of all NB blocks stay there for the tile. The formula per
// element is conv_token's, in the same order: the same bits as conv_non_spec_tile.
template <int WIDTH, int NB>
static inline void conv_non_spec_rows(const GdnConvParams &p, int32_t tile, int32_t c, int32_t c_end) {
  typedef Lanes<16> L;
  typedef vf16 T;
  constexpr int WMAX = WIDTH ? WIDTH : GDN_MAX_CONV_WIDTH, R = WIDTH == 4 ? 4 : GDN_MAX_CONV_WIDTH;  // R: 2^k >= W
  const int32_t width = WIDTH ? WIDTH : p.width, w1 = width - 1;
  const int32_t nb = sycl::min(NB, (c_end - c) / 16);
  T w[NB][WMAX], bias[NB], ring[R][NB];
  int64_t xc[NB];  // the blocks' columns in x
  for (int32_t b = 0; b < nb; ++b) {
    load_weights<16, WIDTH>(p.weight, c + 16 * b, width, w[b]);
    bias[b] = p.bias ? L::load_act(p.bias, c + 16 * b, 1) : T(0.0f);
    xc[b] = gdn_qkv_col(p.pack, c + 16 * b);
  }
  auto at = [&](int32_t k) { return ring[(k + R) & (R - 1)]; };  // input k of the part (k >= -W+1)
  auto load_row = [&](int32_t j, int32_t k) {  // x's row of token j as input k
    const int64_t row = global_row(p.token_indx, j) * p.x_stride;
    for (int32_t b = 0; b < nb; ++b) at(k)[b] = L::load_act(p.x, row + xc[b], 1);
  };
  auto store_ring = [&](int32_t to, int32_t k) {  // the window of inputs k-W+2 .. k to slot `to`
    for (int32_t b = 0; b < nb; ++b) {
      T hist[WMAX];
      for (int32_t i = 0; i < w1; ++i) hist[i] = at(k - w1 + 1 + i)[b];
      store_window<16, WIDTH>(p.state, to, c + 16 * b, w1, hist);
    }
  };
  for_tile_parts<16>(p, tile, w1, c, 16 * nb, [&](const TilePart &s) {
    if (!s.owner)
      for (int32_t i = 0; i < w1; ++i) load_row(s.first - w1 + i, i - w1);
    else
      for (int32_t b = 0; b < nb; ++b) {
        T hist[WMAX];
        if (s.use.init) load_window<16, WIDTH>(p.state, s.use.read, c + 16 * b, 0, w1, hist);
        for (int32_t i = 0; i < w1; ++i) at(i - w1)[b] = s.use.init ? hist[i] : T(0.0f);
      }
    Checkpoints ckpt = s.use.ckpt;
    for (int32_t j = s.first; j < s.end; ++j) {
      const int32_t k = j - s.first;
      const int64_t row = global_row(p.token_indx, j);
      const act_t *next = j + 1 < s.end ? (const act_t *)p.x + global_row(p.token_indx, j + 1) * p.x_stride : nullptr;
      auto token = [&](int32_t b) {
        if (next) prefetch_line(next + xc[b]);
        T hist[WMAX];
        for (int32_t i = 0; i < w1; ++i) hist[i] = at(k - w1 + i)[b];
        const T x = L::load_act(p.x, row * p.x_stride + xc[b], 1);
        at(k)[b] = x;
        return conv_token(w[b], bias[b], hist, width, x, p.silu);
      };
      int32_t b = 0;
      for (; b + 2 <= nb; b += 2) {
        const T y0 = token(b), y1 = token(b + 1);
        store_act32(p.out, row * p.out_stride + c + 16 * b, y0, y1);
      }
      if (b < nb) L::store_act(p.out, row * p.out_stride + c + 16 * b, token(b));
      const int32_t to = ckpt.after(j - s.j0);
      if (!gdn_is_pad(to, p.pad_slot_id)) store_ring(to, k);
    }
    if (!s.owner) return;
    for (int32_t j = sycl::max(s.end, s.j1 - w1); j < s.j1; ++j) load_row(j, j - s.first);  // the inputs other tiles convolve
    store_ring(s.slot, s.j1 - 1 - s.first);
  });
}

// A plain decode sequence (exactly one token, conv_span) in the 16-channel blocks [c, c_end), width
// 4: what conv_non_spec_tile does for it (owner of its only token: pad slot, read slot, initial state,
// the checkpoint after the token, the new state), in pairs of blocks, each block's weights and
// window loaded just before its token. gdn_fused_cpu's decode conv: through the tile with its
// eight blocks' weights loaded up front, cache-resident bf16 decode steps took ~10% longer.
static inline void conv_decode_blocks(const GdnConvParams &p, int32_t seq, int32_t c, int32_t c_end) {
  typedef Lanes<16> L;
  typedef L::T T;
  const int64_t row = global_row(p.token_indx, conv_span(p, seq, false).j0);
  const int32_t slot = p.state_indices[seq];
  if (gdn_is_pad(slot, p.pad_slot_id)) {  // graph padding: zero outputs, no state access
    for (int32_t cb = c; cb < c_end; cb += 16) L::store_act(p.out, row * p.out_stride + cb, T(0.0f));
    return;
  }
  NonSpecSlots use = non_spec_slots(p, seq, slot, 0);
  const int32_t to = use.ckpt.after(0);
  constexpr int32_t W = 4, W1 = W - 1;
  auto block = [&](int32_t cb) {
    T w[W], hist[W1];
    load_weights<16, W>(p.weight, cb, W, w);
    const T bias = p.bias ? L::load_act(p.bias, cb, 1) : T(0.0f);
    if (use.init) load_window<16, W>(p.state, use.read, cb, 0, W1, hist);
    else for (int32_t i = 0; i < W1; ++i) hist[i] = T(0.0f);
    const T y = conv_token(w, bias, hist, W, L::load_act(p.x, row * p.x_stride + gdn_qkv_col(p.pack, cb), 1), p.silu);
    if (!gdn_is_pad(to, p.pad_slot_id)) store_window<16, W>(p.state, to, cb, W1, hist);
    store_window<16, W>(p.state, slot, cb, W1, hist);
    return y;
  };
  int32_t cb = c;
  for (; cb + 32 <= c_end; cb += 32) {
    const T y0 = block(cb), y1 = block(cb + 16);
    store_act32(p.out, row * p.out_stride + cb, y0, y1);
  }
  if (cb < c_end) L::store_act(p.out, row * p.out_stride + cb, block(cb));
}

// Asks for the lines the fused conv of sequence seq reads first in channels [c, c_end) -- the W-1
// columns of its read window and its tokens' inputs -- without waiting for them (prefetch_bytes):
// gdn_fused_cpu asks for the next work-item's while its own walk runs. A plain decode
// (conv_decode_blocks) or a speculative sequence (conv_spec_channels, spec true); nothing for
// other sequences (the tile), pad slots or pad reads. In the time-major layout a window is W-1
// runs of a few lines each, conv_dim values apart, and the conv's first load of each run waited
// for DRAM (seen in a profile).
static inline void conv_prefetch(const GdnConvParams &p, int32_t seq, int32_t c, int32_t c_end, bool spec) {
  const SeqSpan span = conv_span(p, seq, spec);
  const int32_t j0 = span.j0, len = span.len, w1 = p.width - 1;
  if (len == 0 || (!spec && len != 1)) return;
  int32_t slot = p.pad_slot_id, col0 = 0;
  if (spec) {
    const SpecRead rd = spec_read(p, seq);
    if (p.rolled && gdn_is_pad(rd.line, p.pad_slot_id)) return;
    slot = rd.slot, col0 = rd.col0;
  } else {
    const int32_t own = p.state_indices[seq];
    if (gdn_is_pad(own, p.pad_slot_id)) return;
    const NonSpecSlots use = non_spec_slots(p, seq, own, 0);
    if (use.init) slot = use.read;
  }
  const GdnConvStateView &s = p.state;
  if (!gdn_is_pad(slot, p.pad_slot_id)) {
    if (s.col_stride == 1) {  // dim-major: the window's columns interleave, one span
      const int64_t a = state_off(s, slot, c, col0), b = state_off(s, slot, c_end - 1, col0 + w1 - 1) + 1;
      prefetch_bytes((const act_t *)s.base + a, (b - a) * sizeof(act_t));
    } else {  // time-major: a span per column
      for (int32_t i = 0; i < w1; ++i)
        prefetch_bytes((const act_t *)s.base + state_off(s, slot, c, col0 + i),
                       ((int64_t)(c_end - c - 1) * s.chan_stride + 1) * sizeof(act_t));
    }
  }
  for (int32_t t = 0; t < len; ++t)
    prefetch_bytes((const act_t *)p.x + global_row(p.token_indx, j0 + t) * p.x_stride + gdn_qkv_col(p.pack, c),
                   (c_end - c) * sizeof(act_t));  // (one part of a packed row: contiguous there too)
}
