// plan.cpp — see plan.hpp. Kernel variants, build options, launch shapes, workspace layout.
#include "plan.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "errors.hpp"
#include "kernels/params.hpp"

namespace gdn {
namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

std::string act_option(const gdn_config_t &cfg) {
  switch (cfg.act_dtype) {
    case GDN_DTYPE_F16: return "-DGDN_ACT_F16";
    case GDN_DTYPE_BF16: return "-DGDN_ACT_BF16";
    default: return "-DGDN_ACT_F32";
  }
}
// The delta-rule builds: per (activation dtype, head_k_dim[, ssm layout]) (kernels/delta.hpp).
// GDN_GATE_CHANNEL configs (KDA) build with GDN_CHANNEL_GATE: each state row decays by its own
// gate (kernels/delta.hpp, kGateK).
std::string head_option(const gdn_config_t &cfg) {
  return act_option(cfg) + " -DGDN_HEAD_K=" + std::to_string(cfg.head_k_dim) +
         (cfg.gate_mode == GDN_GATE_CHANNEL ? " -DGDN_CHANNEL_GATE=1" : "");
}
// The builds that load or store ssm_state: also per ssm layout and state dtype.
std::string state_option(const gdn_config_t &cfg) {
  const char *dtype = "";
  switch (cfg.state_dtype) {
    case GDN_DTYPE_BF16: dtype = " -DGDN_STATE_BF16"; break;
    case GDN_DTYPE_F16: dtype = " -DGDN_STATE_F16"; break;
    case GDN_DTYPE_I8: dtype = " -DGDN_STATE_I8"; break;
    case GDN_DTYPE_F8E4M3: dtype = " -DGDN_STATE_F8E4M3"; break;
    default: break;
  }
  return head_option(cfg) + " -DGDN_VK_LAYOUT=" + (cfg.ssm_layout == GDN_SSM_VK ? "1" : "0") + dtype;
}

// The chunk kernels' matrix form (delta_chunk_mx.hpp): its tile, and joint_matrix or the emulation.
std::string matrix_option(const PrefillPath &pp) {
  const MatrixTile &t = pp.tile;
  return " -DGDN_MX=1 -DGDN_MX_M=" + std::to_string(t.m) + " -DGDN_MX_N=" + std::to_string(t.n) +
         " -DGDN_MX_K=" + std::to_string(t.k) + " -DGDN_MX_SG=" + std::to_string(t.sub_group) +
         " -DGDN_MX_JOINT=" + (pp.engine == GDN_PREFILL_ENGINE_EMULATED ? "0" : "1");
}

Launch kernel(Family family, std::string options, const char *name) {
  Launch l;
  l.on = true;
  l.family = family;
  l.options = std::move(options);
  l.name = name;
  return l;
}
// groups x n work-items: global (groups, n rounded up to wg), local (1, wg).
void shape2(Launch &l, int64_t groups, int64_t n, int64_t wg) {
  l.dims = 2;
  l.global[0] = (size_t)groups, l.global[1] = (size_t)std::max(round_up(n, wg), wg);
  l.local[0] = 1, l.local[1] = (size_t)wg;
}
// The generic recurrent kernel and chunk scan: a sub-group per tile of gdn_tile_cols(K, gk) state
// columns of each of `groups` (sequence, v-head) pairs, up to GDN_TILE_SUB_GROUPS per work-group.
void shape_tiles(Launch &l, int64_t groups, int64_t V, const gdn_config_t &cfg) {
  const int32_t cols = gdn_tile_cols(cfg.head_k_dim, gate_k_of(cfg));
  const int64_t tiles = (V + cols - 1) / cols;
  shape2(l, groups, tiles * GDN_SUB_GROUP, std::min<int64_t>(tiles, GDN_TILE_SUB_GROUPS) * GDN_SUB_GROUP);
}
void shape1(Launch &l, int64_t n, int64_t wg) {
  l.dims = 1;
  l.global[0] = (size_t)std::max(round_up(n, wg), wg), l.local[0] = (size_t)wg;
}

// The CPU conv variants move 16 channels as one vector: each 16-channel block must lie in one
// part of a packed row (GROUPED: a k-head's q, k, v parts are whole blocks) and the z elements
// copied to z_out must come in whole blocks.
bool conv_blocks(const gdn_config_t &cfg, bool z_out) {
  const int64_t L = GDN_CPU_LANES, vg = (int64_t)cfg.num_v_heads / cfg.num_k_heads * cfg.head_v_dim;
  if (conv_dim_of(cfg) % L) return false;
  if (cfg.packed_order == GDN_PACKED_GROUPED && (cfg.head_k_dim % L || vg % L)) return false;
  return !z_out || (int64_t)cfg.num_v_heads * cfg.head_v_dim % L == 0;
}

void plan_conv(Plan &p, const gdn_config_t &cfg, const gdn_batch_t &b, const Target &t, bool z_out) {
  // Channels of the launches: conv_dim, then the z elements the same work-items copy to z_out.
  const int64_t channels = conv_dim_of(cfg) + (z_out ? (int64_t)cfg.num_v_heads * cfg.head_v_dim : 0);
  const bool cpu = t.cpu_variants && conv_blocks(cfg, z_out);
  const Family family = cpu ? Family::Conv1dCpu : Family::Conv1d;
  // *_cpu: channels of a work-item, alone in its group (the spec kernel's, the non-spec kernel's)
  const int64_t per_item = GDN_CPU_LANES * GDN_CONV_BLOCKS, row_item = GDN_CPU_LANES * GDN_CONV_ROW_BLOCKS;
  const int64_t non_spec_seqs = (int64_t)b.num_prefills + b.num_decodes;
  if (non_spec_seqs > 0 && b.non_spec_token_count > 0) {
    // Time tiles (conv1d.hpp): long enough to amortize re-reading the W-1 window and a binary
    // search, short enough that one prefill spreads over many work-groups.
    p.conv_tile = cpu ? GDN_CONV_TILE_CPU : GDN_CONV_TILE;
    const int64_t tiles = (b.non_spec_token_count + p.conv_tile - 1) / p.conv_tile;
    p.conv_non_spec = kernel(family, act_option(cfg), cpu ? "gdn_conv_non_spec_cpu" : "gdn_conv_non_spec");
    if (cpu) shape2(p.conv_non_spec, tiles, (channels + row_item - 1) / row_item, 1);
    else shape2(p.conv_non_spec, tiles, channels, 64);
  }
  if (b.num_spec_decodes > 0 && b.spec_token_count > 0) {
    p.conv_spec = kernel(family, act_option(cfg), cpu ? "gdn_conv_spec_cpu" : "gdn_conv_spec");
    if (cpu) shape2(p.conv_spec, b.num_spec_decodes, (channels + per_item - 1) / per_item, 1);
    else shape2(p.conv_spec, b.num_spec_decodes, channels, 64);
  }
}

// The recurrent kernel's variant: on the CPU device explicit 16-wide vectors when the dims allow
// (kv layout: 16 state columns, needs V % 16 == 0; vk: state rows, needs K % 16 == 0). An 8-bit
// kv state takes the generic kernel: the kv walks store a column's K values row by row, before the
// column's scale (its largest magnitude) is known.
// The CPU variants of a config without replay mode leave its code out (kernels/delta.hpp, GDN_WITH_REPLAY).
Launch recurrent(const gdn_config_t &cfg, const Target &t, int64_t num_seqs) {
  const int64_t groups = num_seqs * cfg.num_v_heads, V = cfg.head_v_dim;
  const bool vk = cfg.ssm_layout == GDN_SSM_VK;
  const std::string cpu_options = state_option(cfg) + (cfg.replay_tokens > 0 ? "" : " -DGDN_WITH_REPLAY=0");
  Launch l;
  if (t.cpu_variants && vk && cfg.head_k_dim % GDN_CPU_LANES == 0) {
    l = kernel(Family::DeltaRecurrentCpu, cpu_options, "gdn_recurrent_vk_cpu");
    shape2(l, groups, (V + GDN_VK_ITEM_ROWS - 1) / GDN_VK_ITEM_ROWS, 1);  // alone in its work-group
  } else if (t.cpu_variants && !vk && V % GDN_CPU_LANES == 0 && !state_8bit(cfg.state_dtype)) {
    l = kernel(Family::DeltaRecurrentCpu, cpu_options, "gdn_recurrent_kv_cpu");
    shape2(l, groups, V / (GDN_CPU_LANES * gdn_kv_cpu_vecs((int32_t)V)), 1);  // alone in its work-group
  } else {
    l = kernel(Family::DeltaRecurrent, state_option(cfg), "gdn_recurrent");
    shape_tiles(l, groups, V, cfg);
  }
  return l;
}

Launch replay_count(const gdn_config_t &cfg, int64_t seqs) {
  Launch l = kernel(Family::DeltaPrep, head_option(cfg), "gdn_replay_count");
  shape1(l, seqs, GDN_SUB_GROUP);
  return l;
}

void plan_delta(Plan &p, const gdn_config_t &cfg, const gdn_batch_t &b, const Target &t) {
  const int64_t HV = cfg.num_v_heads, V = cfg.head_v_dim, rows = b.num_actual_tokens;
  const int64_t non_spec_seqs = (int64_t)b.num_prefills + b.num_decodes;
  if (t.cpu_variants && cfg.head_k_dim % GDN_CPU_LANES == 0) {
    p.prep = kernel(Family::DeltaPrepCpu, head_option(cfg), "gdn_prep_cpu");
    shape1(p.prep, rows, 1);  // a row per work-item, alone in its group
  } else {
    p.prep = kernel(Family::DeltaPrep, head_option(cfg), "gdn_prep");  // a sub-group per (row, k-head)
    shape2(p.prep, cfg.num_k_heads, rows * GDN_SUB_GROUP, (int64_t)GDN_SUB_GROUP * GDN_TILE_SUB_GROUPS);
  }
  if (non_spec_seqs > 0 && b.non_spec_token_count > 0) {
    p.recurrent_non_spec = recurrent(cfg, t, non_spec_seqs);
    // Capacities from the counts: a chunked sequence has >= 2 tokens, and its chunks are its
    // whole GDN_CHUNK_SIZE blocks plus one partial one -- two with block checkpoints, where the
    // chunks are aligned to the request's positions (gdn_chunk_plan). Only num_prefills sequences
    // are expected to be longer than one token; gdn_chunk_plan sends any others through the recurrence.
    if (b.num_prefills > 0 && !(cfg.flags & GDN_FLAG_FORCE_RECURRENT)) {
      p.seq_capacity = std::min<int32_t>(b.num_prefills, b.non_spec_token_count / 2);
      p.chunk_capacity = b.non_spec_token_count / GDN_CHUNK_SIZE + p.seq_capacity * (b.checkpoint_interval > 0 ? 2 : 1);
    }
  }
  p.prefill = prefill_path(cfg, t);
  if (p.seq_capacity > 0) {
    p.chunk_plan = kernel(Family::DeltaPrep, head_option(cfg), "gdn_chunk_plan");
    shape1(p.chunk_plan, GDN_SUB_GROUP, GDN_SUB_GROUP);  // work-item 0 works
    // The matrix form (prefill_precision BF16) is a build of the generic file on every device.
    const bool mx = p.prefill.engine != GDN_PREFILL_ENGINE_F32;
    const bool cpu = !mx && t.cpu_variants && cfg.head_k_dim % GDN_CPU_LANES == 0 && V % GDN_CPU_LANES == 0;
    const Family family = cpu ? Family::DeltaChunkCpu : Family::DeltaChunk;
    const std::string options = state_option(cfg) + (mx ? matrix_option(p.prefill) : "");
    p.chunk_prep = kernel(family, options, cpu ? "gdn_chunk_prep_cpu" : "gdn_chunk_prep");
    p.chunk_scan = kernel(family, options, cpu ? "gdn_chunk_scan_cpu" : "gdn_chunk_scan");
    if (cpu) {
      shape1(p.chunk_prep, (int64_t)p.chunk_capacity * cfg.num_k_heads, 1);  // per (chunk, k-head)
      const int64_t cols = GDN_CPU_LANES * GDN_SCAN_BLOCKS;  // per work-item, alone in its work-group
      shape2(p.chunk_scan, p.seq_capacity * HV, (V + cols - 1) / cols, 1);
    } else if (mx) {  // per (chunk, v-head); per (sequence, v-head, gdn_mx_cols(K) state columns)
      shape2(p.chunk_prep, p.chunk_capacity * HV, GDN_CHUNK_SIZE, GDN_CHUNK_SIZE);
      const int64_t cols = gdn_mx_cols(cfg.head_k_dim);
      shape2(p.chunk_scan, p.seq_capacity * HV, (V + cols - 1) / cols * GDN_CHUNK_SIZE, GDN_CHUNK_SIZE);
    } else {
      shape2(p.chunk_prep, p.chunk_capacity * HV, GDN_CHUNK_SIZE, GDN_CHUNK_SIZE);
      shape_tiles(p.chunk_scan, p.seq_capacity * HV, V, cfg);
    }
  }
  if (b.num_spec_decodes > 0 && b.spec_token_count > 0) p.recurrent_spec = recurrent(cfg, t, b.num_spec_decodes);
  if (cfg.replay_tokens > 0) {  // the replay: the spec walk's own kernel and shape, a launch before it
    p.replay_spec = p.recurrent_spec;
    if (non_spec_seqs > 0 && b.non_spec_token_count > 0) p.replay_count_non_spec = replay_count(cfg, non_spec_seqs);
    if (p.replay_spec.on) p.replay_count_spec = replay_count(cfg, b.num_spec_decodes);
  }
  // A call without chunk kernels whose recurrent kernels are CPU variants launches no gdn_prep:
  // they prepare each token's q, k and gates themselves (GdnDeltaParams.prep_inline), one launch
  // less per decode step (a launch costs the CPU device's runtime microseconds of host time).
  // The workspace layout keeps the prep outputs all the same (it does not depend on the target).
  auto cpu_or_off = [](const Launch &l) { return !l.on || l.family == Family::DeltaRecurrentCpu; };  // (replay_spec: as recurrent_spec)
  p.prep_inline = p.seq_capacity == 0 && cfg.head_k_dim % GDN_CPU_LANES == 0 && cpu_or_off(p.recurrent_non_spec) &&
                  cpu_or_off(p.recurrent_spec);
  if (p.prep_inline) p.prep.on = false;
}

Layout plan_layout(const Plan &p, const gdn_config_t &cfg, const gdn_batch_t &b, bool delta) {
  Layout l;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t off = at;
    at += (bytes + 255) / 256 * 256;
    return off;
  };
  const size_t rows = (size_t)b.num_actual_tokens, H = (size_t)cfg.num_k_heads, HV = (size_t)cfg.num_v_heads;
  const size_t K = (size_t)cfg.head_k_dim, V = (size_t)cfg.head_v_dim;
  if (p.conv_out_in_workspace) l.conv_out = take(rows * (size_t)conv_dim_of(cfg) * dtype_bytes(cfg.act_dtype));
  if (delta) {
    l.qn = take(rows * H * K * 4);
    l.kn = take(rows * H * K * 4);
    l.g = take(rows * HV * (size_t)gate_k_of(cfg) * 4);
    l.beta = take(rows * HV * 4);
  }
  if (p.seq_capacity > 0) {
    const size_t chunk_rows = HV * (size_t)p.chunk_capacity * GDN_CHUNK_SIZE;
    l.chunk_table = take((size_t)p.chunk_capacity * GDN_TABLE_INTS * 4);
    l.seq_table = take((size_t)p.seq_capacity * GDN_TABLE_INTS * 4);
    l.chunked = take(((size_t)b.num_prefills + (size_t)b.num_decodes) * 4);
    l.cw = take(chunk_rows * K * 4);  // (the matrix form: W before it becomes cwb)
    l.cu = take(chunk_rows * V * 4);
    const bool mx = p.prefill.engine != GDN_PREFILL_ENGINE_F32;
    if (!mx) l.caqk = take(chunk_rows * GDN_CHUNK_SIZE * 4);
    l.cdstart = take(chunk_rows * (size_t)gate_k_of(cfg) * 4);  // (a decay per key channel with GDN_GATE_CHANNEL)
    l.cdend = take(chunk_rows * (size_t)gate_k_of(cfg) * 4);
    if (mx) {  // the bf16 operands (delta_chunk_mx.hpp)
      l.cwb = take(chunk_rows * K * 2);
      l.cqb = take(chunk_rows * K * 2);
      l.ckb = take(chunk_rows * K * 2);
      l.caqkb = take(chunk_rows * GDN_CHUNK_SIZE * 2);
    }
  }
  l.total = std::max<size_t>(at, 256) + GDN_SCRATCH_ALIGN;  // + the slack to align its start (params.hpp)
  return l;
}

// Every launch of a plan, on or off (Plan::launches keeps those that are on).
template <class P>
auto all_launches(P &p) {
  return std::array{&p.conv_non_spec, &p.conv_spec,      &p.prep,           &p.chunk_plan,   &p.recurrent_non_spec,
                    &p.chunk_prep,    &p.chunk_scan,     &p.fused_non_spec, &p.replay_count_non_spec,
                    &p.replay_spec,   &p.recurrent_spec, &p.fused_spec,     &p.replay_count_spec, &p.norm};
}

// Every CPU-variant build may round bf16 by AVX512-BF16's instructions (vec16.hpp, to_bf16x32,
// store_bf16x16), convert f16 by AVX-512's (vec16.hpp, load_act16, store_act16) and prefetch by x86
// instructions (vec16.hpp, prefetch_bytes).
void cpu_options(Plan &p, const Target &t) {
  for (Launch *l : all_launches(p))
    if (l->on && family_file(l->family).cpu) {
      if (t.bf16_instructions) l->options += " -DGDN_CPU_BF16_INSN";
      if (t.f16_instructions) l->options += " -DGDN_CPU_F16_INSN";
      if (t.x86) l->options += " -DGDN_CPU_X86";
    }
}

}  // namespace

// What this process's CPU has (the CPU device runs on it).
struct HostIsa {
  bool avx512_bf16 = false, avx512f = false;
};
static HostIsa host_isa() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const HostIsa isa{__builtin_cpu_supports("avx512bf16") != 0, __builtin_cpu_supports("avx512f") != 0};
  return isa;
#else
  return {};
#endif
}

// What a device reports for the matrix decision (matrix.hpp), asked once per device: the
// runtime's queries cost more than a call should spend on them.
static MatrixFacts device_matrix_facts(const sycl::device &dev) {
  static std::mutex &m = *new std::mutex;  // (never destroyed: see kernel_cache.cpp)
  static auto &known = *new std::vector<std::pair<sycl::device, MatrixFacts>>;
  std::lock_guard<std::mutex> lock(m);
  for (const auto &k : known)
    if (k.first == dev) return k.second;
  namespace mx = sycl::ext::oneapi::experimental::matrix;
  MatrixFacts f;
  const sycl::backend be = dev.get_backend();
  if (be == sycl::backend::ext_oneapi_level_zero || be == sycl::backend::opencl)
    f.device = dev.is_gpu() ? DeviceKind::Gpu : dev.is_cpu() ? DeviceKind::Cpu : DeviceKind::Other;
  f.aspect = dev.has(sycl::aspect::ext_intel_matrix);
  try {
    for (const auto &c : dev.get_info<sycl::ext::oneapi::experimental::info::device::matrix_combinations>())
      if (c.atype == mx::matrix_type::bf16 && c.btype == mx::matrix_type::bf16 && c.ctype == mx::matrix_type::fp32 &&
          c.dtype == mx::matrix_type::fp32)
        f.bf16.push_back(MatrixCombination{c.max_msize, c.max_nsize, c.max_ksize, c.msize, c.nsize, c.ksize});
  } catch (const sycl::exception &) {  // a device the query does not know: no combinations
  }
  f.sub_groups = dev.get_info<sycl::info::device::sub_group_sizes>();
  known.emplace_back(dev, f);
  return f;
}

Target target_of(const sycl::queue &q) {
  // Both read per call: tests compare both ways.
  const char *generic = std::getenv("GDN_XPU_GENERIC_KERNELS"), *soft = std::getenv("GDN_XPU_SOFT_BF16");
  Target t;
  t.cpu_variants = q.get_device().is_cpu() && !(generic && generic[0] == '1');
  t.bf16_instructions = t.cpu_variants && host_isa().avx512_bf16 && !(soft && soft[0] == '1');
  t.f16_instructions = t.cpu_variants && host_isa().avx512f;
#if defined(__x86_64__)
  t.x86 = t.cpu_variants;
#endif
  MatrixFacts f = device_matrix_facts(q.get_device());
  host_cpu_facts(f);  // (the JIT target read per call, as the variables above)
  t.matrix = decide_matrix(f);
  return t;
}

Target warmup_target_of(const sycl::queue &q) {
  Target t = target_of(q);
  const char *v = std::getenv("GDN_XPU_MATRIX_BUILD");
  if (!v || !v[0]) return t;
  MatrixTile tile;
  char end = 0;
  if (std::sscanf(v, "%dx%dx%d/%d%c", &tile.m, &tile.n, &tile.k, &tile.sub_group, &end) != 4 || tile.m <= 0 || tile.n <= 0 ||
      tile.k <= 0 || tile.sub_group <= 0)
    fail(GDN_ERROR_UNSUPPORTED, std::string("GDN_XPU_MATRIX_BUILD=") + v + ": expected MxNxK/SG, e.g. 8x16x16/16");
  MatrixFacts f = device_matrix_facts(q.get_device());
  host_cpu_facts(f);
  if (f.device == DeviceKind::Cpu && !jit_target_has_amx(f.jit_target))
    fail(GDN_ERROR_UNSUPPORTED, std::string("GDN_XPU_MATRIX_BUILD=") + v + " on the CPU device needs CL_CONFIG_CPU_TARGET_ARCH naming "
                                "an AMX CPU (e.g. sapphirerapids): at the JIT's own target a joint_matrix build can abort the process");
  t.matrix.engine = f.device == DeviceKind::Cpu ? MatrixEngine::Amx : MatrixEngine::Xmx;
  t.matrix.tile = tile;
  t.force_matrix_build = true;
  return t;
}

PrefillPath prefill_path(const gdn_config_t &cfg, const Target &t) {
  PrefillPath pp;
  const int32_t asked = t.force_matrix_build ? GDN_PREFILL_BF16 : cfg.prefill_precision;
  const bool low = cfg.act_dtype == GDN_DTYPE_BF16 || cfg.act_dtype == GDN_DTYPE_F16;
  const MatrixDecision &m = t.matrix;
  const bool bf16 = asked == GDN_PREFILL_BF16 || (asked == GDN_PREFILL_AUTO && low && m.engine == MatrixEngine::Xmx);
  const std::string f32 = "f32 products on FMA units";
  if (cfg.flags & GDN_FLAG_FORCE_RECURRENT) {
    pp.text = f32 + " (GDN_FLAG_FORCE_RECURRENT: the token recurrence, no chunk products)";
  } else if (!bf16) {
    pp.text = f32 + (asked == GDN_PREFILL_F32 ? " (prefill_precision f32)"
                     : !low ? " (auto: f32 activations)"
                     : m.engine == MatrixEngine::Amx ? " (auto: the CPU device keeps its f32 kernels, which have no AMX form)"
                     : m.engine == MatrixEngine::None ? " (auto: no matrix engine the library can use: " + m.why + ")"
                                                      : "");
  } else if (cfg.head_k_dim % GDN_MX_DIM || cfg.head_v_dim % GDN_MX_DIM) {
    pp.text = f32 + " (bf16 needs K and V multiples of " + std::to_string(GDN_MX_DIM) + "; K = " +
              std::to_string(cfg.head_k_dim) + ", V = " + std::to_string(cfg.head_v_dim) + ")";
  } else {
    pp.engine = m.engine == MatrixEngine::Xmx ? GDN_PREFILL_ENGINE_XMX
                : m.engine == MatrixEngine::Amx ? GDN_PREFILL_ENGINE_AMX
                                                : GDN_PREFILL_ENGINE_EMULATED;
    pp.tile = pp.engine == GDN_PREFILL_ENGINE_EMULATED ? emulation_tile() : m.tile;
    const std::string tile = std::to_string(pp.tile.m) + "x" + std::to_string(pp.tile.n) + "x" + std::to_string(pp.tile.k) +
                             ", sub-group " + std::to_string(pp.tile.sub_group);
    pp.text = pp.engine == GDN_PREFILL_ENGINE_EMULATED
                  ? "bf16 operands, f32 accumulators, emulated on FMA units (tiles " + tile + "; no matrix engine: " + m.why + ")"
                  : "bf16 operands, f32 accumulators on " + std::string(pp.engine == GDN_PREFILL_ENGINE_XMX ? "XMX" : "AMX") +
                        " (joint_matrix " + tile + ")";
  }
  return pp;
}

Plan make_plan(const gdn_config_t &cfg, const gdn_batch_t &b, const PlanInputs &in, const Target &t) {
  Plan p;
  if (b.num_actual_tokens == 0) return p;
  const bool conv = in.op != Op::Delta, delta = in.op != Op::Conv;
  if (conv) plan_conv(p, cfg, b, t, in.z_out_given);
  if (delta) plan_delta(p, cfg, b, t);
  if (in.op == Op::Attention && in.z_given) {
    if (t.cpu_variants && cfg.head_v_dim % GDN_CPU_LANES == 0) {
      p.norm = kernel(Family::GatedNormCpu, act_option(cfg), "gdn_gated_rmsnorm_cpu");
      shape1(p.norm, b.num_actual_tokens, 1);  // a row per work-item, alone in its group
    } else {
      p.norm = kernel(Family::GatedNorm, act_option(cfg), "gdn_gated_rmsnorm");  // a sub-group per (row, v-head)
      shape1(p.norm, (int64_t)b.num_actual_tokens * cfg.num_v_heads * GDN_SUB_GROUP, (int64_t)GDN_SUB_GROUP * GDN_TILE_SUB_GROUPS);
    }
  }
  // A token group's conv and recurrence fused (gdn_fused_cpu, a work-item per (sequence, k-head))
  // where the plan picked the CPU variants of both and no prep launch: the spec group of a step
  // without chunk kernels, the non-spec group of a step without prefills (a long forced-recurrent
  // prefill's conv would run in one work-item). Its conv takes a k-head's q, k and v channels in
  // 16-channel blocks: each range a whole number of them (q, k: K % 16 == 0 with prep_inline); conv
  // width 4. One launch less a step: separate launches made a decode step 8-30% longer (the more,
  // the smaller the batch).
  const bool v_blocks = (int64_t)cfg.num_v_heads / cfg.num_k_heads * cfg.head_v_dim % GDN_CPU_LANES == 0;
  const bool width4 = cfg.conv_width == 4;  // the fused conv's one compiled width (delta_recurrent_cpu.cpp)
  auto fuse = [&](Launch &fused, Launch &conv, Launch &rec, int64_t seqs) {
    if (!(in.op == Op::Attention && p.prep_inline && v_blocks && width4 && conv.on && conv.family == Family::Conv1dCpu &&
          rec.on && rec.family == Family::DeltaRecurrentCpu))
      return;
    fused = kernel(Family::DeltaRecurrentCpu, rec.options, "gdn_fused_cpu");
    shape2(fused, seqs * cfg.num_k_heads, 1, 1);  // alone in its work-group
    conv.on = rec.on = false;
  };
  if (b.num_prefills == 0) fuse(p.fused_non_spec, p.conv_non_spec, p.recurrent_non_spec, b.num_decodes);
  fuse(p.fused_spec, p.conv_spec, p.recurrent_spec, b.num_spec_decodes);
  if (p.fused_spec.on) p.replay_spec.on = false;  // (gdn_fused_cpu replays in its work-items)
  cpu_options(p, t);
  p.conv_out_in_workspace = in.op == Op::Attention && !in.conv_out_given;
  p.layout = plan_layout(p, cfg, b, delta);
  return p;
}

std::vector<const Launch *> Plan::launches() const {
  std::vector<const Launch *> all;
  for (const Launch *l : all_launches(*this))
    if (l->on) all.push_back(l);
  return all;
}

Plan make_flush_plan(const gdn_config_t &cfg, int32_t num_flush, const Target &t) {
  Plan p;
  p.replay_spec = recurrent(cfg, t, num_flush);
  p.replay_count_non_spec = replay_count(cfg, num_flush);
  cpu_options(p, t);
  return p;
}

}  // namespace gdn
