// params.hpp — kernel argument structs, shared verbatim by the host library (g++/clang++/icpx)
// and the device sources compiled at run time (handed to the kernel compiler as an include file).
// One definition means host and device can never disagree on a field's offset.
// Only fixed-width scalars and raw pointers: the struct is passed to kernels by value.
// Every number both sides must agree on (a table's row width, a variant's block size) is defined
// here or in gdn_xpu.h (GDN_CHUNK_SIZE), never written twice.
#pragma once
#include <stdint.h>
#include "gdn_xpu.h"

// Chunk plan, built on the device by gdn_chunk_plan (delta_prep.cpp) from non_spec_query_start_loc:
// rows of GDN_TABLE_INTS int32 each.
//   chunk table [chunk_capacity]: seq, first compact token, length (0 = unused row), 0; with block
//               checkpoints a sequence's chunks end where its request holds a multiple of
//               GDN_CHUNK_SIZE tokens (non_spec_start_pos), so every checkpoint is a chunk end
//   seq table   [seq_capacity]:   seq, first chunk, number of chunks (0 = unused row), 0
//   chunked     [num non-spec sequences]: 1 when the sequence takes the chunk kernels, else 0
enum { GDN_TABLE_INTS = 4 };

// Where every workspace array starts: at a multiple of this many bytes. The host aligns the
// scratch start (acquire_workspace: a caller's workspace need only be 4-byte aligned, so the
// workspace size includes this much slack) and places the arrays at 256-byte offsets from it; the
// CPU chunk prep writes W, U and Aqk with 64-byte streaming stores, which need it.
enum { GDN_SCRATCH_ALIGN = 64 };

// The widest causal conv (cfg->conv_width): validation's bound and the kernels' window arrays.
enum { GDN_MAX_CONV_WIDTH = 8 };

// Which token group a state-carrying kernel walks (GdnDeltaParams.group).
enum { GDN_GROUP_NON_SPEC = 0, GDN_GROUP_SPEC = 1 };

// Replay mode (gdn_xpu.h "Replay mode"), GdnDeltaParams.replay: what a spec walk does.
//   OFF:   the per-token mode (each token's state to its column).
//   WALK:  from the committed slot [n][0], outputs only; the tokens' inputs to that slot's ring.
//   APPLY: the replay launch, before the WALK: the read slot's ring entries 0..A-1 onto its state,
//          stored to [n][0] (gdn_replay, gdn_replay_*_cpu; also gdn_flush_replay, no tokens bound).
enum { GDN_REPLAY_OFF = 0, GDN_REPLAY_WALK = 1, GDN_REPLAY_APPLY = 2 };
// The most ring entries a slot may hold: 1 + the largest batch->num_spec.
enum { GDN_REPLAY_MAX_TOKENS = 65 };
// Gate values per v-head and token: 1 (GDN_GATE_HEAD) or K (GDN_GATE_CHANNEL). The device code
// of the delta rule knows it at compile time (delta.hpp, kGateK); the gate arrays are [rows, HV * gk].
static inline constexpr int32_t gdn_gate_k(int32_t gate_mode, int32_t K) { return gate_mode == GDN_GATE_CHANNEL ? K : 1; }

// A ring entry (f32): k [H, K] | v [HV, V] | g [HV, gk] | beta [HV]. Offsets of v, g, beta, and its size.
static inline int64_t gdn_ring_v(int32_t H, int32_t K) { return (int64_t)H * K; }
static inline int64_t gdn_ring_g(int32_t H, int32_t HV, int32_t K, int32_t V) { return (int64_t)H * K + (int64_t)HV * V; }
static inline int64_t gdn_ring_beta(int32_t H, int32_t HV, int32_t K, int32_t V, int32_t gk) {
  return gdn_ring_g(H, HV, K, V) + (int64_t)HV * gk;
}
static inline int64_t gdn_ring_floats(int32_t H, int32_t HV, int32_t K, int32_t V, int32_t gk) {
  return gdn_ring_beta(H, HV, K, V, gk) + HV;
}

// Whether a state index is padding (gdn_xpu.h, gdn_batch_t.pad_slot_id): pad_slot_id, or any negative
// value, whatever pad_slot_id is (vLLM pads with its null block 0 and with -1). Every kernel and
// every check asks this, and nothing dereferences an index for which it holds.
static inline constexpr bool gdn_is_pad(int32_t slot, int32_t pad_slot_id) { return slot < 0 || slot == pad_slot_id; }

// A spec sequence's accepted count as every reader indexes with it (gdn_xpu.h, num_accepted_tokens):
// num_accepted_tokens[seq] clamped to [1, cols], cols = 1 + num_spec, so that column A-1 lies in the
// sequence's own row of spec_state_indices whatever the array holds (GDN_VALIDATE_COUNTS trusts it).
static inline int32_t gdn_accepted(const int32_t *num_accepted, int32_t seq, int32_t cols) {
  const int32_t a = num_accepted[seq];
  return a < 1 ? 1 : a > cols ? cols : a;
}

// Shapes of the CPU-device kernel variants, used by the host for launch ranges and by the kernels.
enum {
  GDN_CPU_LANES = 16,        // channels / state columns per vector (vf16)
  GDN_CONV_BLOCKS = 8,       // gdn_conv_spec_cpu (and gdn_fused_cpu's conv): 16-channel blocks per work-item
  GDN_CONV_ROW_BLOCKS = 64,  // gdn_conv_non_spec_cpu: 16-channel blocks per work-item (walked row by row)
  GDN_VK_ROWS = 16,          // gdn_recurrent_vk_cpu: state rows per pass (one vector's lanes)
  GDN_VK_ITEM_ROWS = 128,    // ... and per work-item, in passes of GDN_VK_ROWS
  GDN_WALK_TOKENS = 8,       // tokens a CPU recurrent walk prepares once (vk: for all its passes, f32 walks
                             // up to this long go row by row; kv: walks of 2 up to this long take the WY form)
  GDN_KV_VECS = 4,           // gdn_recurrent_kv_cpu: 16-column vectors of a work-item (V % 64 == 0; of a walk: K > 128)
  GDN_KV_ROW_VECS = 8,       // ... and of a work-item when they make whole rows (V = 128)
  GDN_SCAN_BLOCKS = 8,       // gdn_chunk_scan_cpu: 16-column state blocks per work-item (V = 128 in one)
  GDN_CONV_TILE_CPU = 64,    // gdn_conv_non_spec_cpu: tokens per time tile
  GDN_CONV_TILE = 16         // gdn_conv_non_spec (GPUs): shorter tiles, more work-items (untuned)
};

// Shapes of the generic kernels on Intel GPUs (docs/gpu.md): the recurrent kernel and the chunk
// scan run sub-groups of GDN_SUB_GROUP lanes (a required sub-group size), each holding a tile of
// the state in registers: lane l keeps rows k = l, l + GDN_SUB_GROUP, ... of gdn_tile_cols(K, gk)
// state columns, GDN_TILE_FLOATS floats a lane. On Xe-HPG / Xe-LP a SIMD16 float takes two of a
// thread's 128 registers: 16 tile floats, with the token's k and q slices beside them, fit there
// (32 spill on dg2 at K = 128); pvc's registers are twice as wide. With a decay per state row
// (gk > 1: GDN_GATE_CHANNEL) a lane also keeps its rows' decays beside the k slice: half the
// tile floats (at K = 128 the full tile spilled 2.4-2.7 KB a thread on dg2, tests/gpu_isa).
// GDN_TILE_SUB_GROUPS sub-groups (tiles) share a work-group.
enum { GDN_SUB_GROUP = 16, GDN_TILE_FLOATS = 16, GDN_TILE_SUB_GROUPS = 4 };
static inline constexpr int32_t gdn_tile_cols(int32_t K, int32_t gk) {
  return (K + GDN_SUB_GROUP - 1) / GDN_SUB_GROUP >= GDN_TILE_FLOATS / (gk > 1 ? 2 : 1)
             ? 1
             : GDN_TILE_FLOATS / (gk > 1 ? 2 : 1) / ((K + GDN_SUB_GROUP - 1) / GDN_SUB_GROUP);
}

// The chunk kernels' matrix form (-DGDN_MX=1 builds of delta_chunk.cpp: cfg->prefill_precision
// BF16, docs/design.md "The chunk products as tile products"). Tiles come from the device's matrix
// engine (src/matrix.cpp); where none can be used the same tile products run on FMA units with
// GDN_MX_EMU_* (Xe2's XMX tile). gdn_chunk_prep stages GDN_MX_VCOLS columns of v at a time. K and V
// must be multiples of GDN_MX_DIM.
enum {
  GDN_MX_EMU_M = 8, GDN_MX_EMU_N = 16, GDN_MX_EMU_K = 16, GDN_MX_EMU_SG = 16,
  GDN_MX_VCOLS = 64, GDN_MX_DIM = 16
};
// State columns of a (sequence, v-head) a gdn_chunk_scan work-group of the matrix form carries
// (in SLM: K x cols f32, K x cols bf16 and 64 x cols of u thrice, 40 KiB at K = 128 and 32 KiB at
// K = 256 of dg2's 64 KiB).
static inline constexpr int32_t gdn_mx_cols(int32_t K) { return K > 128 ? 16 : 32; }

// gdn_recurrent_kv_cpu's 16-column vectors per work-item, V % 16 == 0: whole rows when V is
// 16 GDN_KV_ROW_VECS, else GDN_KV_VECS when they divide V, else one.
static inline int32_t gdn_kv_cpu_vecs(int32_t V) {
  return V == 16 * GDN_KV_ROW_VECS ? GDN_KV_ROW_VECS : V % (16 * GDN_KV_VECS) == 0 ? GDN_KV_VECS : 1;
}

// How a kernel finds a conv-state element: slot*slot_stride + channel*chan_stride + col*col_stride.
struct GdnConvStateView {
  void *base;
  int64_t slot_stride, chan_stride, col_stride;
  int32_t state_len;
  int32_t pad0;
};

// Where a sequence of the bound group reads its initial state and stores block checkpoints
// (gdn_xpu.h "State caches"); all null / 0 = the version-1 behaviour.
struct GdnSlotUse {
  const int32_t *read_indices;  // [num_seqs] read slot of each sequence, null = the group's default
  const int32_t *start_pos;     // non-spec: [num_seqs] tokens already in the state, null = 0
  const int32_t *ckpt_indices;  // non-spec: [num_seqs, ckpt_cols] checkpoint slots (null: none)
  int32_t ckpt_interval;        // tokens between checkpoints (0: none)
  int32_t ckpt_cols;
};

// Columns of the packed projections (gdn_xpu.h, gdn_packed_order_t). A packed qkvz row is `groups`
// groups of [q (kg) | k (kg) | v (vg) | z (vg)], a ba row groups of [b (rg) | a (rg)]: GROUPED has one
// group per k-head, CONTIGUOUS one group. The unpacked arrays are the one-group case without z
// (mixed_qkv = [q|k|v], a and b apart), where gdn_qkv_col and gdn_group_col are the identity; so
// the kernels always map, and one code path reads both.
struct GdnPackedCols {
  int32_t qk_dim;      // H*K: the q channels (the k channels follow)
  int32_t kg, vg;      // q (and k) channels, v (and z) channels of a group
  int32_t group_cols;  // columns from one group to the next: 2*kg + 2*vg
};
// Column of element i of a part whose groups hold per_group elements, group_cols columns apart.
static inline int64_t gdn_group_col(int64_t i, int32_t per_group, int32_t group_cols) {
  return i / per_group * group_cols + i % per_group;
}
// Column of conv channel c (q|k|v order: mixed_qkv's, conv_out's) in an input row.
static inline int64_t gdn_qkv_col(const GdnPackedCols &pk, int32_t c) {
  if (c < pk.qk_dim) return gdn_group_col(c, pk.kg, pk.group_cols);
  if (c < 2 * pk.qk_dim) return pk.kg + gdn_group_col(c - pk.qk_dim, pk.kg, pk.group_cols);
  return 2 * pk.kg + gdn_group_col(c - 2 * pk.qk_dim, pk.vg, pk.group_cols);
}
// Column of z element e (v-head * V + d) in a packed qkvz row.
static inline int64_t gdn_z_col(const GdnPackedCols &pk, int32_t e) {
  return 2 * pk.kg + pk.vg + gdn_group_col(e, pk.vg, pk.group_cols);
}

struct GdnConvParams {
  const void *x;            // [rows, conv_dim] act
  const void *weight;       // [conv_dim, W] act
  const void *bias;         // [conv_dim] act or null
  void *out;                // [rows, conv_dim] act
  GdnConvStateView state;
  const int32_t *query_start_loc;  // [num_seqs+1] compact offsets
  const int32_t *state_indices;    // non-spec: [num_seqs]; spec: [num_seqs, slot_cols]
  const uint8_t *has_initial_state;// non-spec only, may be null
  const int32_t *token_indx;       // compact -> global row, may be null (identity)
  const int32_t *num_accepted;     // spec only
  int64_t x_stride, out_stride;
  int32_t num_seqs, conv_dim, width, slot_cols;
  int32_t pad_slot_id, silu, rolled, tile_len;  // tile_len: non-spec tokens per work-item (time tiling)
  int32_t num_tokens, pad1;                     // num_tokens: compact tokens of the bound group (seq_span)
  GdnSlotUse slots;
  GdnPackedCols pack;       // where channel c of x is (gdn_qkv_col); the identity for mixed_qkv
  void *z_out;              // [rows, z_dim] act or null: the rows' z columns of x copied (packed x only)
  int64_t z_out_stride;
  int32_t z_dim, pad2;      // HV*V with z_out, else 0: the kernels' channels beyond conv_dim copy z
};

// Per-row preprocessing: l2-normalized, scaled q and k, and the gates, all f32, by global row.
// Gate element e of a row (v-head e / gate_k, key channel e % gate_k) in a, dt_bias, g_in and g;
// b, beta_in and beta hold one per v-head.
struct GdnPrepParams {
  const void *qkv;          // conv output [rows, conv_dim] act
  const void *a, *b;        // [rows, HV * gate_k], [rows, HV] act (null when g/beta given)
  const float *A_log;       // [HV]
  const void *dt_bias;      // [HV * gate_k], f32 or act (dt_bias_act)
  const float *g_in, *beta_in;
  float *qn, *kn;           // [rows, H, K]
  float *g, *beta;          // [rows, HV * gate_k], [rows, HV]
  int64_t qkv_stride, ab_stride;
  int32_t rows, H, HV, K;
  float scale, eps;
  int32_t l2norm, l2_div;
  int32_t ab_per_group, ab_group_cols;  // v-head hv's a and b at gdn_group_col(hv, ...) of their rows
  int64_t b_stride;                     // b's row stride (ab_stride: a's)
  int32_t gate_k;                       // gdn_gate_k of the config
  float lower_bound;                    // 0, or the lower-bound gate form's bound (gdn_config_t)
  int32_t dt_bias_act, pad0;            // 1: dt_bias holds act values (gdn_tensors_t.dt_bias_dtype), 0: f32
};

// State-carrying kernels. ssm element (slot, head, k, v) at slot*slot_stride + head*K*V + (k*V + v | v*K + k),
// the layout being a compile-time variant of the kernels (GDN_VK_LAYOUT).
struct GdnDeltaParams {
  const void *qkv;          // conv output rows (v is read from here), act
  const float *qn, *kn, *g, *beta;  // from the prep kernel, by global row
  void *ssm;                // state_t (state.hpp): the state dtype of the build
  // 8-bit states (GDN_STATE_8BIT builds): a f32 scale per state row (slot, head, v) at
  // slot*scale_stride + head*V + v; stochastic: 1 = GDN_ROUND_STOCHASTIC stores. Unused otherwise.
  float *ssm_scale;
  int64_t scale_stride;
  int32_t stochastic, pad1;
  void *out;                // [rows, HV, V] act
  const int32_t *query_start_loc, *state_indices, *token_indx, *num_accepted;
  const uint8_t *has_initial_state;
  int32_t *chunk_table, *seq_table, *chunked;  // the chunk plan (see GDN_TABLE_INTS); null: no chunking
  // Chunk workspace, rows by chunk: [HV][chunk_capacity][GDN_CHUNK_SIZE]. Per row i of a chunk:
  // chunk_dstart = the decay from the chunk's initial state to i, chunk_dend = from i to the
  // chunk's last token (products of e^g, 0 across a reset: delta_chunk.hpp).
  float *chunk_w, *chunk_u, *chunk_aqk, *chunk_dstart, *chunk_dend;
  int64_t qkv_stride, out_stride, slot_stride;
  int32_t num_seqs, H, HV, K, V, v_offset;  // v_offset = 2*H*K: first v column in qkv
  int32_t slot_cols, pad_slot_id, group;    // group: GDN_GROUP_*
  int32_t chunk_capacity, seq_capacity;     // rows of the chunk and seq tables
  int32_t prep_inline;                      // 1: no gdn_prep ran; the recurrent CPU kernels prepare
                                            // each token's q, k and gates themselves, from prep
  int32_t num_tokens;                       // compact tokens of the bound group (seq_span, common.hpp)
  GdnSlotUse slots;
  GdnPrepParams prep;                       // (prep_inline only; its outputs qn, kn, g, beta unused)
  // Replay mode (GDN_REPLAY_*): the spec group's rings, [num_slots][ring_tokens][ring_floats] f32,
  // and their counts [num_slots]; null in the per-token mode.
  float *ring;
  int32_t *ring_count;
  int64_t ring_floats;                      // gdn_ring_floats of the config (ring offsets: kGateK, delta.hpp)
  int32_t ring_tokens, replay;              // entries per slot; GDN_REPLAY_*
  // The chunk kernels' matrix form (GDN_MX builds): bf16 operands (bit patterns), rows by chunk as
  // chunk_w: chunk_wb = -W [.][K], chunk_qb = q (.) dstart [.][K], chunk_kb = k (.) dend [.][K],
  // chunk_aqkb = Aqk [.][GDN_CHUNK_SIZE] (delta_chunk_mx.hpp). Null in the f32 form.
  uint16_t *chunk_wb, *chunk_qb, *chunk_kb, *chunk_aqkb;
};

// gdn_fused_cpu (delta_recurrent_cpu.cpp, the CPU device): one token group's conv and
// recurrence in one launch, a work-item per (sequence, k-head). conv: bound to the group (the
// non-spec group with tile_len 1: a work-item convolves its own sequence's tokens); delta: as for
// the recurrent CPU kernels, prep_inline.
struct GdnFusedParams {
  GdnConvParams conv;
  GdnDeltaParams delta;
};

struct GdnNormParams {
  void *out;                // [rows, HV, V] act, normalized in place
  const void *z;            // [rows, HV, V] act
  const void *weight;       // [V] act
  int64_t out_stride, z_stride;
  int32_t rows, HV, V;
  float eps;
  int32_t z_per_group, z_group_cols;    // z element e of a row at gdn_group_col(e, ...)
  int32_t sigmoid, pad0;                // the gate: sigmoid(z) (GDN_OUT_GATE_SIGMOID), else silu(z)
};
