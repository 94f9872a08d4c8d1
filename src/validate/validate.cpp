// validate.cpp — see validate.hpp: the caller's structs, the config, the counts and the arrays
// they require; then the other parts (checks.hpp). Each check throws gdn::Failure with the field's name.
#include "validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "batch_arrays.hpp"
#include "checks.hpp"
#include "errors.hpp"
#include "kernels/params.hpp"

namespace gdn {
namespace {

std::string fstr(float v) {  // shortest round-trip-ish text: -0.5, 0, 1e-06
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", (double)v);
  return buf;
}

// Struct versions (gdn_xpu.h, "Structs are versioned"): where the fields of every version of each
// struct this library knows end, oldest first; the last is the struct's own size. Version 1 is the
// layout libgdn_xpu 0.1.0 shipped, the oldest caller accepted; gdn_batch_t's version 1 ends where its
// first version-2 field begins. On LP64 platforms (x86-64, aarch64 Linux) version 1 was 88 (config),
// 112 (batch) and 184 (tensors) bytes. A caller passes its header's sizeof: a version's fields' end
// rounded up to the struct's alignment (gdn_config_t version 3: fields end at 108 bytes, sizeof 112),
// and only the fields are read (the padding after them is the caller's, not a newer field).
constexpr size_t kConfigVersions[] = {offsetof(gdn_config_t, packed_order), offsetof(gdn_config_t, gate_mode),
                                      offsetof(gdn_config_t, prefill_precision),
                                      offsetof(gdn_config_t, ssm_scale_slot_stride), sizeof(gdn_config_t)};
constexpr size_t kBatchVersions[] = {offsetof(gdn_batch_t, non_spec_read_state_indices), sizeof(gdn_batch_t)};
constexpr size_t kTensorsVersions[] = {offsetof(gdn_tensors_t, qkvz), offsetof(gdn_tensors_t, b_stride),
                                       offsetof(gdn_tensors_t, dt_bias_dtype), offsetof(gdn_tensors_t, ssm_scale),
                                       sizeof(gdn_tensors_t)};
static_assert(sizeof(void *) != 8 || (kConfigVersions[0] == 88 && kBatchVersions[0] == 112 && kTensorsVersions[0] == 184),
              "a version-1 struct layout changed: that breaks every caller built against 0.1.0 (ABI 1)");
static_assert(sizeof(void *) != 8 || (kConfigVersions[2] == 108 && kConfigVersions[3] == 120),
              "gdn_config_t version 4 must end past version 3's padded size (112 bytes on LP64)");
static_assert(sizeof(void *) != 8 || (sizeof(gdn_config_t) == 136 && kTensorsVersions[3] == 264),
              "version 5 appends to version 4's padded sizes (120 and 264 bytes on LP64)");

template <class T>
constexpr size_t padded(size_t end) {
  return (end + alignof(T) - 1) / alignof(T) * alignof(T);
}

// Copies a caller's versioned struct. An older caller (struct_size = the padded size of an earlier
// version) gets the defaults of `init` for the fields its header did not have; a newer (larger)
// struct is accepted only if the fields this library does not know are zero (their defaults).
// Only the caller's fields are read.
template <class T, size_t N>
T copy_versioned(const T *in, const char *name, void (*init)(T *), const size_t (&versions)[N]) {
  if (!in) fail(GDN_ERROR_NULL_POINTER, std::string(name) + " is NULL");
  T out;
  init(&out);
  const size_t size = in->struct_size;
  auto what = [&] { return std::string(name) + "->struct_size = " + str((int64_t)size); };  // for messages only
  if (size < versions[0])
    fail(GDN_ERROR_BAD_STRUCT_SIZE, what() + " is older than the oldest version this library accepts (" +
                                        str((int64_t)versions[0]) + " bytes, gdn_xpu.h of libgdn_xpu 0.1.0)");
  size_t fields = sizeof(T);  // the bytes of the caller's fields
  if (size < sizeof(T)) {
    const size_t *v = std::find_if(versions, versions + N, [&](size_t end) { return padded<T>(end) == size; });
    if (v == versions + N) {
      std::string sizes;
      for (size_t end : versions) sizes += (sizes.empty() ? "" : ", ") + str((int64_t)padded<T>(end));
      fail(GDN_ERROR_BAD_STRUCT_SIZE, what() + " is the size of no version of this struct (" + sizes + " bytes)");
    }
    fields = *v;
  }
  const unsigned char *tail = reinterpret_cast<const unsigned char *>(in) + sizeof(T);
  for (size_t i = 0; i + sizeof(T) < size; ++i)
    if (tail[i])
      fail(GDN_ERROR_UNSUPPORTED, what() + ": the caller sets fields newer than this library (version " + gdn_version() + ")");
  std::memcpy(&out, in, fields);
  out.struct_size = sizeof(T);
  return out;
}

void check_range(int64_t v, int64_t lo, int64_t hi, gdn_status_t status, const char *field) {
  if (v < lo || v > hi)
    fail(status, std::string(field) + " = " + str(v) + " is outside [" + str(lo) + ", " + str(hi) + "]");
}

void check_stride(int64_t &stride, int64_t dense, const char *field) {
  if (stride == 0) stride = dense;
  if (stride < dense) fail(GDN_ERROR_BAD_LAYOUT, std::string(field) + " = " + str(stride) + " < row width " + str(dense));
}

void need(const void *p, const char *field, const char *why) {
  if (!p) fail(GDN_ERROR_NULL_POINTER, std::string(field) + " is NULL but " + why);
}

// Packed projections (gdn_xpu.h, gdn_packed_order_t): qkvz / ba / z_out with a packed order only,
// and then none of the unpacked arrays they replace (one source for each input).
void check_packed(const Checked &c, Op op) {
  const gdn_tensors_t &t = c.t;
  if (c.cfg.packed_order == GDN_PACKED_NONE) {
    const char *given = t.qkvz ? "tensors->qkvz" : t.ba ? "tensors->ba" : t.z_out ? "tensors->z_out" : nullptr;
    if (given)
      fail(GDN_ERROR_BAD_LAYOUT, std::string(given) + " is given but cfg->packed_order is GDN_PACKED_NONE (packed "
                                                      "projections need GDN_PACKED_GROUPED or GDN_PACKED_CONTIGUOUS)");
    return;
  }
  const char *unpacked = t.mixed_qkv ? "tensors->mixed_qkv" : t.a ? "tensors->a" : t.b ? "tensors->b" : t.z ? "tensors->z" : nullptr;
  if (unpacked)
    fail(GDN_ERROR_BAD_LAYOUT, std::string(unpacked) + " is given but cfg->packed_order = " + str(c.cfg.packed_order) +
                                   " reads the packed projections (qkvz, ba) instead: pass it as NULL");
  GDN_REQUIRE(!t.z_out || op != Op::Delta, GDN_ERROR_BAD_LAYOUT,
              "tensors->z_out is given to gdn_gated_delta_rule, which does not read qkvz (the conv copies z)");
}

}  // namespace

gdn_config_t validate_config(const gdn_config_t *in) {
  gdn_config_t cfg = copy_versioned(in, "cfg", gdn_config_init, kConfigVersions);
  check_range(cfg.num_k_heads, 1, kMaxKHeads, GDN_ERROR_BAD_SHAPE, "cfg->num_k_heads");
  check_range(cfg.num_v_heads, 1, kMaxVHeads, GDN_ERROR_BAD_SHAPE, "cfg->num_v_heads");
  GDN_REQUIRE(cfg.num_v_heads % cfg.num_k_heads == 0, GDN_ERROR_BAD_SHAPE,
          "cfg->num_v_heads = " + str(cfg.num_v_heads) + " is not a multiple of num_k_heads = " + str(cfg.num_k_heads));
  check_range(cfg.head_k_dim, 1, kMaxHeadDim, GDN_ERROR_BAD_SHAPE, "cfg->head_k_dim");
  check_range(cfg.head_v_dim, 1, kMaxHeadDim, GDN_ERROR_BAD_SHAPE, "cfg->head_v_dim");
  check_range(cfg.conv_width, 2, GDN_MAX_CONV_WIDTH, GDN_ERROR_BAD_SHAPE, "cfg->conv_width");
  GDN_REQUIRE(dtype_bytes(cfg.act_dtype) != 0, GDN_ERROR_BAD_DTYPE, "cfg->act_dtype = " + str(cfg.act_dtype) + " is not a gdn_dtype_t");
  GDN_REQUIRE(!state_8bit(cfg.act_dtype), GDN_ERROR_BAD_DTYPE,
              "cfg->act_dtype = " + str(cfg.act_dtype) + ": GDN_DTYPE_I8 / GDN_DTYPE_F8E4M3 are state dtypes only");
  GDN_REQUIRE(dtype_bytes(cfg.state_dtype) != 0, GDN_ERROR_BAD_DTYPE,
          "cfg->state_dtype = " + str(cfg.state_dtype) + " is not a gdn_dtype_t");
  check_range(cfg.ssm_layout, 0, 1, GDN_ERROR_BAD_LAYOUT, "cfg->ssm_layout");
  check_range(cfg.conv_layout, 0, 1, GDN_ERROR_BAD_LAYOUT, "cfg->conv_layout");
  check_range(cfg.conv_spec_layout, 0, 1, GDN_ERROR_BAD_LAYOUT, "cfg->conv_spec_layout");
  check_range(cfg.num_slots, 1, INT32_MAX, GDN_ERROR_BAD_COUNT, "cfg->num_slots");
  check_range(cfg.conv_state_len, cfg.conv_width - 1, 1 << 20, GDN_ERROR_BAD_LAYOUT, "cfg->conv_state_len");
  const int64_t conv_dim = conv_dim_of(cfg);
  check_stride(cfg.conv_slot_stride, conv_dim * cfg.conv_state_len, "cfg->conv_slot_stride");
  check_stride(cfg.ssm_slot_stride, (int64_t)cfg.num_v_heads * cfg.head_k_dim * cfg.head_v_dim, "cfg->ssm_slot_stride");
  check_stride(cfg.ssm_scale_slot_stride, (int64_t)cfg.num_v_heads * cfg.head_v_dim, "cfg->ssm_scale_slot_stride");
  GDN_REQUIRE(cfg.scale >= 0.0f, GDN_ERROR_BAD_SHAPE, "cfg->scale = " + fstr(cfg.scale) + " is negative (0 = 1/sqrt(K))");
  if (cfg.scale == 0.0f) cfg.scale = 1.0f / std::sqrt((float)cfg.head_k_dim);
  GDN_REQUIRE(cfg.l2norm_eps > 0.0f, GDN_ERROR_BAD_SHAPE, "cfg->l2norm_eps = " + fstr(cfg.l2norm_eps) + " must be > 0");
  GDN_REQUIRE(cfg.norm_eps > 0.0f, GDN_ERROR_BAD_SHAPE, "cfg->norm_eps = " + fstr(cfg.norm_eps) + " must be > 0");
  GDN_REQUIRE((cfg.flags & ~GDN_FLAG_ALL) == 0, GDN_ERROR_UNSUPPORTED, "cfg->flags has unknown bits: " + str(cfg.flags));
  check_range(cfg.packed_order, GDN_PACKED_NONE, GDN_PACKED_CONTIGUOUS, GDN_ERROR_BAD_LAYOUT, "cfg->packed_order");
  check_range(cfg.replay_tokens, 0, GDN_REPLAY_MAX_TOKENS, GDN_ERROR_BAD_COUNT, "cfg->replay_tokens");
  check_range(cfg.gate_mode, GDN_GATE_HEAD, GDN_GATE_CHANNEL, GDN_ERROR_BAD_LAYOUT, "cfg->gate_mode");
  check_range(cfg.out_gate, GDN_OUT_GATE_SILU, GDN_OUT_GATE_SIGMOID, GDN_ERROR_BAD_LAYOUT, "cfg->out_gate");
  GDN_REQUIRE(std::isfinite(cfg.gate_lower_bound) && cfg.gate_lower_bound <= 0.0f, GDN_ERROR_BAD_SHAPE,
          "cfg->gate_lower_bound = " + fstr(cfg.gate_lower_bound) + " must be 0 (no bound) or finite and negative");
  if (cfg.gate_mode == GDN_GATE_CHANNEL) {  // (KDA: Kimi Linear has as many k-heads as v-heads)
    GDN_REQUIRE(cfg.num_v_heads == cfg.num_k_heads, GDN_ERROR_BAD_SHAPE,
            "cfg->num_v_heads = " + str(cfg.num_v_heads) + " != num_k_heads = " + str(cfg.num_k_heads) +
                ": GDN_GATE_CHANNEL needs one v-head per k-head");
    GDN_REQUIRE(cfg.packed_order == GDN_PACKED_NONE, GDN_ERROR_UNSUPPORTED,
            "cfg->packed_order = " + str(cfg.packed_order) + " with GDN_GATE_CHANNEL: packed projections are "
                "Qwen3-Next / Qwen3.5's (GDN_GATE_HEAD)");
  }
  GDN_REQUIRE(cfg.prefill_precision >= GDN_PREFILL_AUTO && cfg.prefill_precision <= GDN_PREFILL_BF16, GDN_ERROR_BAD_DTYPE,
          "cfg->prefill_precision = " + str(cfg.prefill_precision) +
              " is not a gdn_prefill_precision_t (GDN_PREFILL_AUTO 0, GDN_PREFILL_F32 1, GDN_PREFILL_BF16 2)");
  GDN_REQUIRE(cfg.reserved1 == 0, GDN_ERROR_UNSUPPORTED, "cfg->reserved1 = " + str(cfg.reserved1) + " must be 0");
  GDN_REQUIRE(cfg.reserved2 == 0, GDN_ERROR_UNSUPPORTED, "cfg->reserved2 = " + str(cfg.reserved2) + " must be 0");
  check_range(cfg.state_rounding, GDN_ROUND_NEAREST, GDN_ROUND_STOCHASTIC, GDN_ERROR_BAD_DTYPE, "cfg->state_rounding");
  GDN_REQUIRE(cfg.state_rounding == GDN_ROUND_NEAREST || state_8bit(cfg.state_dtype), GDN_ERROR_UNSUPPORTED,
              "cfg->state_rounding = GDN_ROUND_STOCHASTIC with state_dtype = " + str(cfg.state_dtype) +
                  ": stochastic rounding is for 8-bit states (GDN_DTYPE_I8, GDN_DTYPE_F8E4M3)");
  GDN_REQUIRE(cfg.replay_tokens == 0 || !state_8bit(cfg.state_dtype), GDN_ERROR_UNSUPPORTED,
              "cfg->replay_tokens = " + str(cfg.replay_tokens) + " with an 8-bit state_dtype (" + str(cfg.state_dtype) +
                  "): replay mode takes f32, bf16 or f16 states");
  GDN_REQUIRE(cfg.replay_tokens == 0 || cfg.conv_spec_layout == GDN_CONV_SPEC_ROLLED, GDN_ERROR_UNSUPPORTED,
          "cfg->conv_spec_layout = GDN_CONV_SPEC_SNAPSHOT with replay_tokens = " + str(cfg.replay_tokens) +
              ": replay mode keeps one slot per spec sequence and needs GDN_CONV_SPEC_ROLLED");
  return cfg;
}

gdn_batch_t validate_batch_counts(const gdn_batch_t *in) {
  gdn_batch_t b = copy_versioned(in, "batch", gdn_batch_init, kBatchVersions);
  check_range(b.num_prefills, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->num_prefills");
  check_range(b.num_decodes, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->num_decodes");
  check_range(b.num_spec_decodes, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->num_spec_decodes");
  check_range(b.num_spec, 0, 64, GDN_ERROR_BAD_COUNT, "batch->num_spec");
  check_range(b.num_actual_tokens, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->num_actual_tokens");
  check_range(b.non_spec_token_count, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->non_spec_token_count");
  check_range(b.spec_token_count, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->spec_token_count");
  check_range(b.validate, 0, 1, GDN_ERROR_BAD_COUNT, "batch->validate");
  GDN_REQUIRE((int64_t)b.non_spec_token_count + b.spec_token_count == b.num_actual_tokens, GDN_ERROR_BAD_COUNT,
          "non_spec_token_count (" + str(b.non_spec_token_count) + ") + spec_token_count (" + str(b.spec_token_count) +
              ") != num_actual_tokens (" + str(b.num_actual_tokens) + ")");
  const int64_t non_spec_seqs = (int64_t)b.num_prefills + b.num_decodes;
  GDN_REQUIRE(non_spec_seqs <= INT32_MAX, GDN_ERROR_BAD_COUNT, "num_prefills + num_decodes overflows int32");
  GDN_REQUIRE(non_spec_seqs > 0 || b.non_spec_token_count == 0, GDN_ERROR_BAD_COUNT,
          "non_spec_token_count = " + str(b.non_spec_token_count) + " but there are no non-spec sequences");
  GDN_REQUIRE(b.num_spec_decodes > 0 || b.spec_token_count == 0, GDN_ERROR_BAD_COUNT,
          "spec_token_count = " + str(b.spec_token_count) + " but num_spec_decodes = 0");
  GDN_REQUIRE((int64_t)b.spec_token_count <= (int64_t)b.num_spec_decodes * (b.num_spec + 1), GDN_ERROR_BAD_COUNT,
          "spec_token_count = " + str(b.spec_token_count) + " > num_spec_decodes * (1 + num_spec) = " +
              str((int64_t)b.num_spec_decodes * (b.num_spec + 1)));
  check_range(b.checkpoint_interval, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->checkpoint_interval");
  GDN_REQUIRE(b.checkpoint_interval % GDN_CHUNK_SIZE == 0, GDN_ERROR_BAD_COUNT,
          "batch->checkpoint_interval = " + str(b.checkpoint_interval) + " is not a multiple of GDN_CHUNK_SIZE (" +
              str(GDN_CHUNK_SIZE) + ")");
  check_range(b.checkpoint_cols, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->checkpoint_cols");
  return b;
}

Checked validate_call(void *queue, const gdn_config_t *cfg_in, const gdn_batch_t *batch_in, const gdn_tensors_t *t_in, Op op) {
  if (!queue) fail(GDN_ERROR_BAD_QUEUE, "queue is NULL (pass a sycl::queue*, e.g. dpctl.SyclQueue.addressof_ref())");
  Checked c(*static_cast<sycl::queue *>(queue));
  c.cfg = validate_config(cfg_in);
  c.batch = validate_batch_counts(batch_in);
  c.t = copy_versioned(t_in, "tensors", gdn_tensors_init, kTensorsVersions);
  const gdn_config_t &cfg = c.cfg;
  gdn_batch_t &b = c.batch;
  gdn_tensors_t &t = c.t;
  c.conv_dim = (int32_t)conv_dim_of(cfg);  // at most 2*kMaxKHeads*kMaxHeadDim + kMaxVHeads*kMaxHeadDim
  c.num_non_spec_seqs = b.num_prefills + b.num_decodes;
  c.act_bytes = dtype_bytes(cfg.act_dtype);
  const int32_t hv = cfg.num_v_heads, ov = cfg.num_v_heads * cfg.head_v_dim;
  check_stride(t.mixed_qkv_stride, c.conv_dim, "tensors->mixed_qkv_stride");
  check_stride(t.conv_out_stride, c.conv_dim, "tensors->conv_out_stride");
  const int64_t given_ab_stride = t.ab_stride;
  check_stride(t.ab_stride, (int64_t)hv * gate_k_of(cfg), "tensors->ab_stride");
  if (t.b_stride == 0) t.b_stride = given_ab_stride;  // (gdn_xpu.h: b shares a's stride unless given)
  check_stride(t.b_stride, hv, "tensors->b_stride");
  check_stride(t.out_stride, ov, "tensors->out_stride");
  check_stride(t.z_stride, ov, "tensors->z_stride");
  check_stride(t.qkvz_stride, c.conv_dim + (int64_t)ov, "tensors->qkvz_stride");
  check_stride(t.ba_stride, 2 * hv, "tensors->ba_stride");
  check_stride(t.z_out_stride, ov, "tensors->z_out_stride");
  check_packed(c, op);
  if (t.dt_bias_dtype == 0) t.dt_bias_dtype = GDN_DTYPE_F32;  // (a version-3 caller's, and the default)
  GDN_REQUIRE(t.dt_bias_dtype == GDN_DTYPE_F32 || t.dt_bias_dtype == cfg.act_dtype, GDN_ERROR_BAD_DTYPE,
              "tensors->dt_bias_dtype = " + str(t.dt_bias_dtype) + ": dt_bias is GDN_DTYPE_F32 or cfg->act_dtype (" +
                  str(cfg.act_dtype) + ")");

  GDN_REQUIRE(!t.ssm_scale || state_8bit(cfg.state_dtype), GDN_ERROR_BAD_DTYPE,
              "tensors->ssm_scale is given but cfg->state_dtype = " + str(cfg.state_dtype) +
                  " has no scales (only GDN_DTYPE_I8 and GDN_DTYPE_F8E4M3 states do): pass it as NULL");

  const bool conv = op != Op::Delta, delta = op != Op::Conv;
  const bool work = b.num_actual_tokens > 0;
  if (conv && b.num_spec_decodes > 0 && cfg.conv_spec_layout == GDN_CONV_SPEC_ROLLED)
    GDN_REQUIRE(cfg.conv_state_len >= cfg.conv_width - 1 + b.num_spec, GDN_ERROR_BAD_LAYOUT,
            "cfg->conv_state_len = " + str(cfg.conv_state_len) + " < W-1+num_spec = " +
                str(cfg.conv_width - 1 + b.num_spec) + " needed by GDN_CONV_SPEC_ROLLED");
  if (work && c.num_non_spec_seqs > 0) {
    need(b.non_spec_query_start_loc, "batch->non_spec_query_start_loc", "num_prefills + num_decodes > 0");
    need(b.non_spec_state_indices, "batch->non_spec_state_indices", "num_prefills + num_decodes > 0");
  }
  if (work && checkpoints(c) && b.checkpoint_cols > 0)
    need(b.checkpoint_state_indices, "batch->checkpoint_state_indices", "checkpoint_interval > 0 and checkpoint_cols > 0");
  if (work && b.num_spec_decodes > 0) {
    need(b.spec_query_start_loc, "batch->spec_query_start_loc", "num_spec_decodes > 0");
    need(b.spec_state_indices, "batch->spec_state_indices", "num_spec_decodes > 0");
    need(b.num_accepted_tokens, "batch->num_accepted_tokens", "num_spec_decodes > 0");
  }
  const bool packed = cfg.packed_order != GDN_PACKED_NONE;
  if (work && conv) {
    need(packed ? t.qkvz : t.mixed_qkv, packed ? "tensors->qkvz" : "tensors->mixed_qkv", "the conv stage reads it");
    need(t.conv_weight, "tensors->conv_weight", "the conv stage reads it");
    need(t.conv_state, "tensors->conv_state", "the conv stage reads and writes it");
    if (op == Op::Conv) need(t.conv_out, "tensors->conv_out", "gdn_causal_conv1d writes it");
  }
  if (work && delta) {
    if (op == Op::Delta) need(t.conv_out, "tensors->conv_out", "gdn_gated_delta_rule reads q|k|v from it");
    GDN_REQUIRE(!t.g == !t.beta, GDN_ERROR_NULL_POINTER, "tensors->g and tensors->beta must be given together");
    if (!t.g && packed) need(t.ba, "tensors->ba", "no precomputed g/beta were given");
    if (!t.g && !packed) {
      need(t.a, "tensors->a", "no precomputed g/beta were given");
      need(t.b, "tensors->b", "no precomputed g/beta were given");
    }
    if (!t.g) {
      need(t.A_log, "tensors->A_log", "no precomputed g/beta were given");
      need(t.dt_bias, "tensors->dt_bias", "no precomputed g/beta were given");
    }
    need(t.ssm_state, "tensors->ssm_state", "the delta rule reads and writes it");
    if (state_8bit(cfg.state_dtype))
      need(t.ssm_scale, "tensors->ssm_scale", "the state_dtype is 8-bit: its rows' scales are read and written with it");
    need(t.core_attn_out, "tensors->core_attn_out", "the delta rule writes it");
    if (op == Op::Attention && t.z) need(t.norm_weight, "tensors->norm_weight", "z is given (fused gated RMSNorm)");
    if (cfg.replay_tokens > 0) {  // gdn_xpu.h "Replay mode"
      need(t.replay_ring, "tensors->replay_ring", "cfg->replay_tokens > 0 (replay mode)");
      need(t.replay_count, "tensors->replay_count", "cfg->replay_tokens > 0 (replay mode)");
      GDN_REQUIRE(cfg.replay_tokens >= 1 + b.num_spec, GDN_ERROR_BAD_COUNT,
              "cfg->replay_tokens = " + str(cfg.replay_tokens) + " < 1 + batch->num_spec = " + str(1 + b.num_spec) +
                  ": a slot's ring holds a step's tokens");
    }
  }
  if (!work) return c;

  check_pointers(c, op);

  // A queue recording a graph (gdn_xpu.h "Graphs"): nothing may be read back or waited for.
  c.recording = recording(c.q);
  if (c.recording) {
    GDN_REQUIRE(c.q.is_in_order(), GDN_ERROR_UNSUPPORTED,
                "the queue records a graph but is out of order (a call on it waits for its last kernel): record on an "
                "in-order queue");
    GDN_REQUIRE(b.validate != GDN_VALIDATE_FULL, GDN_ERROR_UNSUPPORTED,
                "batch->validate = GDN_VALIDATE_FULL reads the metadata back, which a queue recording a graph cannot "
                "do: record with GDN_VALIDATE_COUNTS");
  }

  // GDN_VALIDATE_FULL: read the metadata back and check its contents. GDN_VALIDATE_COUNTS trusts
  // the contents and reads nothing back: the kernels clamp start locations into their group's
  // token count (seq_span, kernels/batch.hpp), so no sequence walks outside the token rows.
  if (b.validate != GDN_VALIDATE_FULL) return c;
  check_metadata(c);
  if (delta && cfg.replay_tokens > 0) check_replay_counts(c);
  return c;
}

}  // namespace gdn

GDN_API gdn_status_t gdn_batch_array_elements(const gdn_batch_t *batch, int64_t *elements, int32_t capacity) {
  return gdn::guarded([&] {
    gdn::check_range(capacity, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "capacity");
    if (capacity > 0 && !elements) gdn::fail(GDN_ERROR_NULL_POINTER, "elements is NULL");
    const gdn_batch_t b = gdn::validate_batch_counts(batch);
    for (int i = 0; i < std::min<int32_t>(capacity, gdn::kNumBatchArrays); ++i)
      elements[i] = gdn::batch_span(b, static_cast<gdn::BatchArray>(i)).n;
  });
}
