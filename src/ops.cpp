// ops.cpp — the C entry points: validate, plan, then enqueue the plan's kernels in one dependency
// chain (no host wait inside it).
#include <algorithm>
#include <cstring>

#include "errors.hpp"
#include "kernels/params.hpp"
#include "launch.hpp"
#include "plan.hpp"
#include "validate/alloc_extent.hpp"
#include "validate/validate.hpp"
#include "workspace.hpp"

namespace gdn {
namespace {

// Binds one token group of the batch (GdnConvParams and GdnDeltaParams carry the same fields).
template <class P>
void bind_group(P &p, const Checked &c, bool spec) {
  const gdn_batch_t &b = c.batch;
  p.query_start_loc = spec ? b.spec_query_start_loc : b.non_spec_query_start_loc;
  p.state_indices = spec ? b.spec_state_indices : b.non_spec_state_indices;
  p.has_initial_state = spec ? nullptr : b.has_initial_state;
  p.token_indx = spec ? b.spec_token_indx : b.non_spec_token_indx;
  p.num_accepted = spec ? b.num_accepted_tokens : nullptr;
  p.num_seqs = spec ? b.num_spec_decodes : c.num_non_spec_seqs;
  p.num_tokens = spec ? b.spec_token_count : b.non_spec_token_count;  // (the kernels clamp start locations to it)
  p.slot_cols = spec ? b.num_spec + 1 : 1;
  // Read slots and block checkpoints (gdn_xpu.h "State caches"); checkpoints are non-spec only.
  const bool ckpt = !spec && b.checkpoint_interval > 0;
  p.slots = GdnSlotUse{spec ? b.spec_read_state_indices : b.non_spec_read_state_indices,
                       spec ? nullptr : b.non_spec_start_pos, ckpt ? b.checkpoint_state_indices : nullptr,
                       ckpt ? b.checkpoint_interval : 0, ckpt ? b.checkpoint_cols : 0};
}

// The column groups of the rows the kernels read (params.hpp): one per k-head for GROUPED packing,
// else one (CONTIGUOUS packing, and the unpacked arrays, where the mappings are the identity).
GdnPackedCols packed_cols(const gdn_config_t &cfg) {
  const int32_t groups = cfg.packed_order == GDN_PACKED_GROUPED ? cfg.num_k_heads : 1;
  const int32_t kg = cfg.num_k_heads * cfg.head_k_dim / groups, vg = cfg.num_v_heads * cfg.head_v_dim / groups;
  return {cfg.num_k_heads * cfg.head_k_dim, kg, vg, 2 * kg + 2 * vg};
}
bool packed(const Checked &c) { return c.cfg.packed_order != GDN_PACKED_NONE; }

// The conv's tensors and config; bind_group adds a token group.
GdnConvParams conv_params(const Checked &c, void *conv_out, int64_t conv_out_stride) {
  const gdn_config_t &cfg = c.cfg;
  const bool dim_major = cfg.conv_layout == GDN_CONV_DIM_MAJOR;
  GdnConvParams p{};
  p.x = packed(c) ? c.t.qkvz : c.t.mixed_qkv;
  p.weight = c.t.conv_weight;
  p.bias = c.t.conv_bias;
  p.out = conv_out;
  p.state = GdnConvStateView{c.t.conv_state, cfg.conv_slot_stride, dim_major ? cfg.conv_state_len : 1,
                             dim_major ? 1 : c.conv_dim, cfg.conv_state_len, 0};
  p.x_stride = packed(c) ? c.t.qkvz_stride : c.t.mixed_qkv_stride;
  p.pack = packed_cols(cfg);
  p.z_out = c.t.z_out, p.z_out_stride = c.t.z_out_stride;
  p.z_dim = c.t.z_out ? cfg.num_v_heads * cfg.head_v_dim : 0;
  p.out_stride = conv_out_stride;
  p.conv_dim = c.conv_dim;
  p.width = cfg.conv_width;
  p.pad_slot_id = c.batch.pad_slot_id;
  p.silu = (cfg.flags & GDN_FLAG_NO_SILU) ? 0 : 1;
  p.rolled = cfg.conv_spec_layout == GDN_CONV_SPEC_ROLLED;
  return p;
}

void enqueue_conv(Chain &ch, Checked &c, const Plan &plan, const Kernels &ks, void *conv_out, int64_t conv_out_stride) {
  GdnConvParams p = conv_params(c, conv_out, conv_out_stride);
  if (plan.conv_non_spec.on) {
    bind_group(p, c, false);
    p.tile_len = plan.conv_tile;
    launch(ch, ks, plan.conv_non_spec, p);
  }
  if (plan.conv_spec.on) {
    bind_group(p, c, true);
    launch(ch, ks, plan.conv_spec, p);
  }
}

void enqueue_delta(Chain &ch, Checked &c, const Plan &plan, const Kernels &ks, char *ws, void *qkv, int64_t qkv_stride) {
  const gdn_config_t &cfg = c.cfg;
  const gdn_tensors_t &t = c.t;
  const Layout &l = plan.layout;
  float *qn = reinterpret_cast<float *>(ws + l.qn), *kn = reinterpret_cast<float *>(ws + l.kn);
  float *g = reinterpret_cast<float *>(ws + l.g), *beta = reinterpret_cast<float *>(ws + l.beta);
  // Gates: packed, b and a are the two parts of each group of ba (rg heads each); else apart.
  const int32_t rg = cfg.packed_order == GDN_PACKED_GROUPED ? cfg.num_v_heads / cfg.num_k_heads : cfg.num_v_heads;
  const void *b = packed(c) ? t.ba : t.b;
  const void *a = packed(c) && t.ba ? static_cast<const char *>(t.ba) + rg * c.act_bytes : t.a;
  const GdnPrepParams pp{qkv, a, b, t.A_log, t.dt_bias, t.g, t.beta, qn, kn, g, beta, qkv_stride,
                         packed(c) ? t.ba_stride : t.ab_stride, c.batch.num_actual_tokens, cfg.num_k_heads,
                         cfg.num_v_heads, cfg.head_k_dim, cfg.scale, cfg.l2norm_eps,
                         (cfg.flags & GDN_FLAG_NO_QK_L2NORM) ? 0 : 1, (cfg.flags & GDN_FLAG_L2NORM_DIV) ? 1 : 0,
                         rg, packed(c) ? 2 * rg : rg, packed(c) ? t.ba_stride : t.b_stride, gate_k_of(cfg),
                         cfg.gate_lower_bound, t.dt_bias_dtype == cfg.act_dtype && cfg.act_dtype != GDN_DTYPE_F32, 0};
  if (plan.prep.on) launch(ch, ks, plan.prep, pp);

  GdnDeltaParams p{};
  p.prep_inline = plan.prep_inline ? 1 : 0;
  p.prep = pp;
  p.qkv = qkv;
  p.qn = qn, p.kn = kn, p.g = g, p.beta = beta;
  p.ssm = t.ssm_state;
  p.out = t.core_attn_out;
  p.qkv_stride = qkv_stride;
  p.out_stride = t.out_stride;
  p.slot_stride = cfg.ssm_slot_stride;
  p.ssm_scale = t.ssm_scale, p.scale_stride = cfg.ssm_scale_slot_stride;
  p.stochastic = cfg.state_rounding == GDN_ROUND_STOCHASTIC ? 1 : 0;
  p.H = cfg.num_k_heads, p.HV = cfg.num_v_heads, p.K = cfg.head_k_dim, p.V = cfg.head_v_dim;
  p.v_offset = 2 * cfg.num_k_heads * cfg.head_k_dim;
  p.pad_slot_id = c.batch.pad_slot_id;
  p.ring = t.replay_ring, p.ring_count = t.replay_count, p.ring_tokens = cfg.replay_tokens;
  p.ring_floats = ring_floats_of(cfg);
  if (plan.replay_count_non_spec.on) {  // (no walk reads the ring count of a slot a non-spec sequence writes)
    bind_group(p, c, false);
    launch(ch, ks, plan.replay_count_non_spec, p);
  }
  if (plan.recurrent_non_spec.on) {
    bind_group(p, c, false);
    p.group = GDN_GROUP_NON_SPEC;
    if (plan.seq_capacity > 0) {  // the chunk plan first: the recurrence skips what it marks chunked
      p.chunk_table = reinterpret_cast<int32_t *>(ws + l.chunk_table);
      p.seq_table = reinterpret_cast<int32_t *>(ws + l.seq_table);
      p.chunked = reinterpret_cast<int32_t *>(ws + l.chunked);
      p.chunk_w = reinterpret_cast<float *>(ws + l.cw);
      p.chunk_u = reinterpret_cast<float *>(ws + l.cu);
      p.chunk_aqk = reinterpret_cast<float *>(ws + l.caqk);
      p.chunk_dstart = reinterpret_cast<float *>(ws + l.cdstart);
      p.chunk_dend = reinterpret_cast<float *>(ws + l.cdend);
      if (plan.prefill.engine != GDN_PREFILL_ENGINE_F32) {  // the matrix form's bf16 operands
        p.chunk_wb = reinterpret_cast<uint16_t *>(ws + l.cwb);
        p.chunk_qb = reinterpret_cast<uint16_t *>(ws + l.cqb);
        p.chunk_kb = reinterpret_cast<uint16_t *>(ws + l.ckb);
        p.chunk_aqkb = reinterpret_cast<uint16_t *>(ws + l.caqkb);
      }
      p.chunk_capacity = plan.chunk_capacity;
      p.seq_capacity = plan.seq_capacity;
      launch(ch, ks, plan.chunk_plan, p);
    }
    launch(ch, ks, plan.recurrent_non_spec, p);
    if (plan.seq_capacity > 0) {
      launch(ch, ks, plan.chunk_prep, p);
      launch(ch, ks, plan.chunk_scan, p);
    }
  }
  // A group's conv (writing qkv, the conv output) and recurrence fused.
  auto fused = [&](const Launch &l, bool spec) {
    GdnFusedParams f{conv_params(c, qkv, qkv_stride), p};
    bind_group(f.conv, c, spec);
    f.conv.tile_len = 1;  // (non-spec: a tile per token)
    bind_group(f.delta, c, spec);
    f.delta.group = spec ? GDN_GROUP_SPEC : GDN_GROUP_NON_SPEC;
    f.delta.chunked = nullptr;
    launch(ch, ks, l, f);
  };
  if (plan.fused_non_spec.on) fused(plan.fused_non_spec, false);
  bind_group(p, c, true);
  p.group = GDN_GROUP_SPEC;
  p.chunked = nullptr;
  if (plan.replay_spec.on) {  // replay mode: the replay, then the group's walk (p.replay: WALK)
    p.replay = GDN_REPLAY_APPLY;
    launch(ch, ks, plan.replay_spec, p);
  }
  p.replay = cfg.replay_tokens > 0 ? GDN_REPLAY_WALK : GDN_REPLAY_OFF;
  if (plan.fused_spec.on) fused(plan.fused_spec, true);
  if (plan.recurrent_spec.on) launch(ch, ks, plan.recurrent_spec, p);
  if (plan.replay_count_spec.on) launch(ch, ks, plan.replay_count_spec, p);
}

void enqueue_norm(Chain &ch, Checked &c, const Plan &plan, const Kernels &ks) {
  const gdn_config_t &cfg = c.cfg;
  // Packed: z is the z part of qkvz's groups (vg elements each); else the z array, one group.
  const GdnPackedCols pk = packed_cols(cfg);
  const void *z = packed(c) ? static_cast<const char *>(c.t.qkvz) + gdn_z_col(pk, 0) * c.act_bytes : c.t.z;
  const int32_t ov = cfg.num_v_heads * cfg.head_v_dim;
  const GdnNormParams p{c.t.core_attn_out, z, c.t.norm_weight, c.t.out_stride, packed(c) ? c.t.qkvz_stride : c.t.z_stride,
                        c.batch.num_actual_tokens, cfg.num_v_heads, cfg.head_v_dim, cfg.norm_eps,
                        packed(c) ? pk.vg : ov, packed(c) ? pk.group_cols : ov,
                        cfg.out_gate == GDN_OUT_GATE_SIGMOID ? 1 : 0, 0};
  launch(ch, ks, plan.norm, p);
}

void run(Op op, void *queue, const gdn_config_t *cfg, const gdn_batch_t *batch, const gdn_tensors_t *tensors) {
  Checked c = validate_call(queue, cfg, batch, tensors, op);
  const bool norm = packed(c) ? c.t.norm_weight != nullptr : c.t.z != nullptr;
  const Plan plan = make_plan(c.cfg, c.batch, PlanInputs{op, c.t.conv_out != nullptr, norm, c.t.z_out != nullptr},
                              target_of(c.q));
  const auto launches = plan.launches();
  if (launches.empty()) return;
  const Kernels ks(c.q, launches);

  const bool scratch = op != Op::Conv;  // the delta rule's prep outputs (and maybe the conv output)
  Scratch ws = scratch ? acquire_workspace(c.q, c.t, plan.layout.total, c.recording) : Scratch{};
  void *conv_out = plan.conv_out_in_workspace ? ws.ptr + plan.layout.conv_out : c.t.conv_out;
  const int64_t conv_out_stride = plan.conv_out_in_workspace ? c.conv_dim : c.t.conv_out_stride;

  Chain ch(c.q, c.recording);
  if (op != Op::Delta) enqueue_conv(ch, c, plan, ks, conv_out, conv_out_stride);
  if (op != Op::Conv) enqueue_delta(ch, c, plan, ks, ws.ptr, conv_out, conv_out_stride);
  if (plan.norm.on) enqueue_norm(ch, c, plan, ks);
  // Out-of-order queues give the caller no ordering after our last kernel: finish here.
  // (On an in-order queue the next call's kernels, which may reuse the workspace, run after ours.)
  if (!ch.in_order) ch.last.wait_and_throw();
}

}  // namespace
}  // namespace gdn

extern "C" {

GDN_API gdn_status_t gdn_causal_conv1d(void *queue, const gdn_config_t *cfg, const gdn_batch_t *batch,
                                       const gdn_tensors_t *t) {
  return gdn::guarded([&] { gdn::run(gdn::Op::Conv, queue, cfg, batch, t); });
}

GDN_API gdn_status_t gdn_gated_delta_rule(void *queue, const gdn_config_t *cfg, const gdn_batch_t *batch,
                                          const gdn_tensors_t *t) {
  return gdn::guarded([&] { gdn::run(gdn::Op::Delta, queue, cfg, batch, t); });
}

GDN_API gdn_status_t gdn_attention(void *queue, const gdn_config_t *cfg, const gdn_batch_t *batch,
                                   const gdn_tensors_t *t) {
  return gdn::guarded([&] { gdn::run(gdn::Op::Attention, queue, cfg, batch, t); });
}

// Every kernel a call with this config can launch: the plan of a batch with a prefill, a decode
// and a spec decode, and the fused norm.
GDN_API gdn_status_t gdn_warmup(void *queue, const gdn_config_t *cfg) {
  return gdn::guarded([&] {
    if (!queue) gdn::fail(GDN_ERROR_BAD_QUEUE, "queue is NULL");
    const gdn_config_t c = gdn::validate_config(cfg);
    const sycl::queue &q = *static_cast<sycl::queue *>(queue);
    gdn_batch_t b;
    gdn_batch_init(&b);
    b.num_prefills = b.num_decodes = b.num_spec_decodes = 1;
    b.num_spec = 1;
    b.non_spec_token_count = 3, b.spec_token_count = 2, b.num_actual_tokens = 5;
    const bool z_out = c.packed_order != GDN_PACKED_NONE;  // (packed callers take z: the conv variant may depend on it)
    const gdn::Plan plan =
        gdn::make_plan(c, b, gdn::PlanInputs{gdn::Op::Attention, false, true, z_out}, gdn::warmup_target_of(q));
    const gdn::Kernels kernels(q, plan.launches());
  });
}

GDN_API gdn_status_t gdn_prefill_path(void *queue, const gdn_config_t *cfg, int32_t *engine, char *buf, size_t len) {
  return gdn::guarded([&] {
    if (!queue) gdn::fail(GDN_ERROR_BAD_QUEUE, "queue is NULL");
    const gdn_config_t c = gdn::validate_config(cfg);
    const gdn::PrefillPath path = gdn::prefill_path(c, gdn::target_of(*static_cast<sycl::queue *>(queue)));
    if (engine) *engine = path.engine;
    if (buf && len > 0) {
      const size_t n = std::min(len - 1, path.text.size());
      std::memcpy(buf, path.text.data(), n);
      buf[n] = '\0';
    }
  });
}

GDN_API void gdn_release_caches(void) {
  gdn::release_workspaces();
  gdn::release_kernel_cache();
  gdn::alloc_extent::release();
}

}  // extern "C"
