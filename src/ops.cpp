// ops.cpp — the C entry points: validate, plan, then enqueue the kernels in a dependency chain.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "errors.hpp"
#include "kernel_cache.hpp"
#include "kernels/params.hpp"
#include "validate.hpp"

namespace gdn {
namespace {

constexpr int64_t kChunk = 64;  // chunk length of the WY/UT prefill form (delta_rule.cpp CHUNK)
constexpr size_t kWorkGroup = 16;
constexpr int64_t kConvSpecBlocks = 8;  // 16-channel blocks per work-item of gdn_conv_spec_cpu (GDN_CONV_SPEC_BLOCKS)
constexpr int64_t kVkRows = 8;  // rows per work-item of the CPU vk recurrent variant (GDN_VK_ROWS)

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

std::string act_option(int32_t dtype) {
  switch (dtype) {
    case GDN_DTYPE_F16: return "-DGDN_ACT_F16";
    case GDN_DTYPE_BF16: return "-DGDN_ACT_BF16";
    default: return "-DGDN_ACT_F32";
  }
}
// CPU-device kernel variants (explicit 16-wide vectors) are used on CPU devices unless
// GDN_XPU_GENERIC_KERNELS=1, which runs the generic kernels Intel GPUs get (tests use it to check
// those kernels on the CPU device; read per call so a process can compare both).
bool cpu_variants(const sycl::queue &q) {
  const char *generic = std::getenv("GDN_XPU_GENERIC_KERNELS");
  return q.get_device().is_cpu() && !(generic && generic[0] == '1');
}

// The recurrent kernel's state mapping (delta_rule.cpp, GDN_CPU_VEC): explicit 16-wide vectors
// on the CPU device when the dims allow it, one state column per work-item otherwise.
int cpu_vec_variant(const sycl::queue &q, const gdn_config_t &cfg) {
  if (!cpu_variants(q)) return 0;
  if (cfg.ssm_layout == GDN_SSM_KV) return cfg.head_v_dim % 16 == 0 ? 1 : 0;
  return cfg.head_k_dim % 16 == 0 ? 2 : 0;
}
// The chunk kernels' CPU variants (explicit 16-wide vectors) need K and V to be multiples of 16.
bool cpu_chunk_variant(const sycl::queue &q, const gdn_config_t &cfg) {
  return cpu_variants(q) && cfg.head_k_dim % 16 == 0 && cfg.head_v_dim % 16 == 0;
}

std::string conv_options(const gdn_config_t &cfg) {
  return act_option(cfg.act_dtype) + " -DGDN_CONV_SPEC_BLOCKS=" + std::to_string(kConvSpecBlocks);
}

std::string delta_options(const sycl::queue &q, const gdn_config_t &cfg) {
  return act_option(cfg.act_dtype) + " -DGDN_HEAD_K=" + std::to_string(cfg.head_k_dim) +
         " -DGDN_SSM_VK=" + (cfg.ssm_layout == GDN_SSM_VK ? "1" : "0") +
         " -DGDN_CPU_VEC=" + std::to_string(cpu_vec_variant(q, cfg)) +
         " -DGDN_CPU_CHUNK=" + (cpu_chunk_variant(q, cfg) ? "1" : "0") + " -DGDN_VK_ROWS=" + std::to_string(kVkRows);
}

// The chunk plan of the non-spec sequences that take the chunked path (length > 1).
struct ChunkPlan {
  std::vector<int32_t> chunks;  // [n][4] seq, first compact token, len, 0
  std::vector<int32_t> seqs;    // [m][4] seq, first chunk, num chunks, 0
  int64_t num_chunks() const { return (int64_t)chunks.size() / 4; }
  int64_t num_seqs() const { return (int64_t)seqs.size() / 4; }
};

ChunkPlan plan_chunks(const Checked &c) {
  ChunkPlan plan;
  const auto &qsl = c.meta.ns_qsl;  // empty when not read back (no prefills, GDN_VALIDATE_COUNTS)
  if ((c.cfg.flags & GDN_FLAG_FORCE_RECURRENT) || qsl.empty()) return plan;
  for (int32_t i = 0; i < c.num_non_spec_seqs; ++i) {
    const int32_t j0 = qsl[(size_t)i], len = qsl[(size_t)i + 1] - j0;
    if (len < 2) continue;  // decodes (and 1-token prefills) use the recurrence
    const int32_t first = (int32_t)plan.num_chunks();
    for (int32_t s = 0; s < len; s += (int32_t)kChunk)
      plan.chunks.insert(plan.chunks.end(), {i, j0 + s, std::min<int32_t>((int32_t)kChunk, len - s), 0});
    plan.seqs.insert(plan.seqs.end(), {i, first, (int32_t)plan.num_chunks() - first, 0});
  }
  return plan;
}

// Byte offsets of everything the call keeps in workspace, 256-byte aligned.
struct Layout {
  size_t conv_out = 0, qn = 0, kn = 0, g = 0, beta = 0, tables = 0, cw = 0, cu = 0, caqk = 0, cg = 0, total = 0;
};

Layout plan_layout(const gdn_config_t &cfg, int64_t rows, int64_t num_chunks, int64_t table_ints, bool conv_out,
                   bool delta) {
  Layout l;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t off = at;
    at += (bytes + 255) / 256 * 256;
    return off;
  };
  const int64_t conv_dim = 2LL * cfg.num_k_heads * cfg.head_k_dim + (int64_t)cfg.num_v_heads * cfg.head_v_dim;
  if (conv_out) l.conv_out = take((size_t)(rows * conv_dim) * dtype_bytes(cfg.act_dtype));
  if (delta) {
    const size_t qk = (size_t)(rows * cfg.num_k_heads * cfg.head_k_dim) * 4, gates = (size_t)(rows * cfg.num_v_heads) * 4;
    l.qn = take(qk);
    l.kn = take(qk);
    l.g = take(gates);
    l.beta = take(gates);
    if (num_chunks > 0) {
      const size_t rows_c = (size_t)(cfg.num_v_heads * num_chunks * kChunk);
      l.tables = take((size_t)table_ints * 4);
      l.cw = take(rows_c * cfg.head_k_dim * 4);
      l.cu = take(rows_c * cfg.head_v_dim * 4);
      l.caqk = take(rows_c * kChunk * 4);
      l.cg = take(rows_c * 4);
    }
  }
  l.total = std::max<size_t>(at, 256);
  return l;
}

// A library-owned device scratch buffer per queue, grown on demand. The per-queue mutex keeps
// concurrent callers of one queue from resizing it under each other.
struct Workspace {
  sycl::queue q;
  std::mutex m;
  void *ptr = nullptr;
  size_t bytes = 0;
  ~Workspace() {
    if (ptr) {
      try { q.wait(); sycl::free(ptr, q); } catch (...) {}
    }
  }
};
// Never destroyed at exit (see kernel_cache.cpp); gdn_release_caches() frees them explicitly.
std::mutex &workspaces_mutex = *new std::mutex;
std::vector<std::unique_ptr<Workspace>> &workspaces = *new std::vector<std::unique_ptr<Workspace>>;

Workspace &workspace_for(const sycl::queue &q) {
  std::lock_guard<std::mutex> lock(workspaces_mutex);
  for (auto &w : workspaces)
    if (w->q == q) return *w;
  workspaces.push_back(std::make_unique<Workspace>());
  workspaces.back()->q = q;
  return *workspaces.back();
}

void grow(Workspace &w, size_t bytes) {
  if (w.bytes >= bytes) return;
  w.q.wait();  // kernels of earlier calls may still use the old buffer
  if (w.ptr) sycl::free(w.ptr, w.q);
  w.ptr = nullptr;
  w.bytes = 0;
  w.ptr = sycl::malloc_device(bytes, w.q);
  if (!w.ptr) fail(GDN_ERROR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(bytes) + " bytes of workspace");
  w.bytes = bytes;
}

// GDN_XPU_PROFILE=1: every kernel is waited for and its wall time printed (measurement only).
bool profiling() {
  static const bool on = [] {
    const char *v = std::getenv("GDN_XPU_PROFILE");
    return v && v[0] && v[0] != '0';
  }();
  return on;
}

// Submits kernel(params) over range after dep; returns the new tail of the chain.
template <int N, class P>
sycl::event launch(sycl::queue &q, const sycl::kernel &k, const sycl::nd_range<N> &range, const P &params,
                   const sycl::event &dep) {
  const auto t0 = std::chrono::steady_clock::now();
  if (profiling()) sycl::event(dep).wait();
  sycl::event ev = q.submit([&](sycl::handler &h) {
    h.depends_on(dep);
    h.set_args(params);
    h.parallel_for(range, k);
  });
  if (profiling()) {
    ev.wait();
    std::fprintf(stderr, "libgdn_xpu: %-18s %9.3f ms\n", k.get_info<sycl::info::kernel::function_name>().c_str(),
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return ev;
}

sycl::nd_range<1> range1(int64_t n, int64_t wg) {
  return sycl::nd_range<1>{sycl::range<1>((size_t)std::max<int64_t>(round_up(n, wg), wg)), sycl::range<1>((size_t)wg)};
}
sycl::nd_range<2> range2(int64_t groups, int64_t n, int64_t wg) {
  return sycl::nd_range<2>{sycl::range<2>((size_t)groups, (size_t)round_up(n, wg)), sycl::range<2>(1, (size_t)wg)};
}

// The two token groups of a batch, and binding one of them into a kernel's parameters (both
// GdnConvParams and GdnDeltaParams carry the same per-group fields).
enum class Group { NonSpec, Spec };

template <class P>
void bind_group(P &p, const Checked &c, Group g) {
  const gdn_batch_t &b = c.batch;
  const bool spec = g == Group::Spec;
  p.query_start_loc = spec ? b.spec_query_start_loc : b.non_spec_query_start_loc;
  p.state_indices = spec ? b.spec_state_indices : b.non_spec_state_indices;
  p.has_initial_state = spec ? nullptr : b.has_initial_state;
  p.token_indx = spec ? b.spec_token_indx : b.non_spec_token_indx;
  p.num_accepted = spec ? b.num_accepted_tokens : nullptr;
  p.num_seqs = spec ? b.num_spec_decodes : c.num_non_spec_seqs;
  p.slot_cols = spec ? b.num_spec + 1 : 1;
}

GdnConvParams conv_params(const Checked &c, void *conv_out, int64_t conv_out_stride) {
  const gdn_config_t &cfg = c.cfg;
  GdnConvParams p{};
  p.x = c.t.mixed_qkv;
  p.weight = c.t.conv_weight;
  p.bias = c.t.conv_bias;
  p.out = conv_out;
  p.state.base = c.t.conv_state;
  p.state.slot_stride = cfg.conv_slot_stride;
  const bool dim_major = cfg.conv_layout == GDN_CONV_DIM_MAJOR;
  p.state.chan_stride = dim_major ? cfg.conv_state_len : 1;
  p.state.col_stride = dim_major ? 1 : c.conv_dim;
  p.state.state_len = cfg.conv_state_len;
  p.x_stride = c.t.mixed_qkv_stride;
  p.out_stride = conv_out_stride;
  p.conv_dim = c.conv_dim;
  p.width = cfg.conv_width;
  p.pad_slot_id = c.batch.pad_slot_id;
  p.silu = (cfg.flags & GDN_FLAG_NO_SILU) ? 0 : 1;
  p.rolled = cfg.conv_spec_layout == GDN_CONV_SPEC_ROLLED;
  return p;
}

sycl::event enqueue_conv(Checked &c, void *conv_out, int64_t conv_out_stride, sycl::event ev) {
  const gdn_batch_t &b = c.batch;
  const std::string opt = conv_options(c.cfg);
  // CPU device: the 16-channel vector variant of the non-spec kernel (delta_rule.cpp explains why).
  const bool cpu = cpu_variants(c.q) && c.conv_dim % 16 == 0;
  sycl::kernel k_ns = get_kernel(c.q, Family::Conv, opt, cpu ? "gdn_conv_non_spec_cpu" : "gdn_conv_non_spec");
  sycl::kernel k_s = get_kernel(c.q, Family::Conv, opt, cpu ? "gdn_conv_spec_cpu" : "gdn_conv_spec");
  GdnConvParams p = conv_params(c, conv_out, conv_out_stride);
  if (c.num_non_spec_seqs > 0 && b.non_spec_token_count > 0) {
    bind_group(p, c, Group::NonSpec);
    // Time tiles (conv1d.cpp): long enough to amortize re-reading the W-1 window and a binary
    // search, short enough that one prefill spreads over many work-groups. The generic kernel
    // takes shorter tiles for the many more, narrower work-items a GPU wants (untuned: no GPU here).
    p.tile_len = cpu ? 64 : 16;
    p.num_tokens = (int32_t)b.non_spec_token_count;
    const int64_t tiles = (b.non_spec_token_count + p.tile_len - 1) / p.tile_len;
    ev = launch(c.q, k_ns, cpu ? range2(tiles, c.conv_dim / 16, 4) : range2(tiles, c.conv_dim, 64), p, ev);
  }
  if (b.num_spec_decodes > 0 && b.spec_token_count > 0) {
    bind_group(p, c, Group::Spec);
    // CPU: kConvSpecBlocks blocks of 16 channels per work-item, alone in its group.
    const int64_t per_item = 16 * kConvSpecBlocks;
    ev = launch(c.q, k_s, cpu ? range2(p.num_seqs, (c.conv_dim + per_item - 1) / per_item, 1)
                              : range2(p.num_seqs, c.conv_dim, 64), p, ev);
  }
  return ev;
}

sycl::nd_range<2> recurrent_range(const Checked &c, int64_t num_seqs) {
  const int64_t groups = num_seqs * c.cfg.num_v_heads, V = c.cfg.head_v_dim;
  switch (cpu_vec_variant(c.q, c.cfg)) {
    case 1: return range2(groups, V / 16, std::min<int64_t>(V / 16, 8));
    case 2: return range2(groups, (V + kVkRows - 1) / kVkRows, 1);  // kVkRows rows per work-item, alone in its group
    default: return range2(groups, V, kWorkGroup);
  }
}

struct DeltaKernels {
  sycl::kernel prep, recurrent, chunk_prep, chunk_scan;
};

DeltaKernels delta_kernels(const Checked &c) {
  const std::string opt = delta_options(c.q, c.cfg);
  const bool cpu = cpu_chunk_variant(c.q, c.cfg);
  return {get_kernel(c.q, Family::Delta, opt, "gdn_prep"), get_kernel(c.q, Family::Delta, opt, "gdn_recurrent"),
          get_kernel(c.q, Family::Delta, opt, cpu ? "gdn_chunk_prep_cpu" : "gdn_chunk_prep"),
          get_kernel(c.q, Family::Delta, opt, cpu ? "gdn_chunk_scan_cpu" : "gdn_chunk_scan")};
}

sycl::event enqueue_delta(Checked &c, const DeltaKernels &k, const ChunkPlan &plan, const Layout &l, char *ws,
                          const void *qkv, int64_t qkv_stride, sycl::event ev) {
  const gdn_config_t &cfg = c.cfg;
  const gdn_batch_t &b = c.batch;
  const gdn_tensors_t &t = c.t;
  const int64_t rows = b.num_actual_tokens;

  GdnPrepParams pp{};
  pp.qkv = qkv;
  pp.a = t.a;
  pp.b = t.b;
  pp.A_log = t.A_log;
  pp.dt_bias = t.dt_bias;
  pp.g_in = t.g;
  pp.beta_in = t.beta;
  pp.qn = reinterpret_cast<float *>(ws + l.qn);
  pp.kn = reinterpret_cast<float *>(ws + l.kn);
  pp.g = reinterpret_cast<float *>(ws + l.g);
  pp.beta = reinterpret_cast<float *>(ws + l.beta);
  pp.qkv_stride = qkv_stride;
  pp.ab_stride = t.ab_stride;
  pp.rows = (int32_t)rows;
  pp.H = cfg.num_k_heads;
  pp.HV = cfg.num_v_heads;
  pp.K = cfg.head_k_dim;
  pp.scale = cfg.scale;
  pp.eps = cfg.l2norm_eps;
  pp.l2norm = (cfg.flags & GDN_FLAG_NO_QK_L2NORM) ? 0 : 1;
  pp.l2_div = (cfg.flags & GDN_FLAG_L2NORM_DIV) ? 1 : 0;
  ev = launch(c.q, k.prep,
              sycl::nd_range<2>{sycl::range<2>((size_t)round_up(rows, kWorkGroup), (size_t)cfg.num_k_heads),
                                sycl::range<2>(kWorkGroup, 1)},
              pp, ev);

  GdnDeltaParams p{};
  p.qkv = qkv;
  p.qn = pp.qn;
  p.kn = pp.kn;
  p.g = pp.g;
  p.beta = pp.beta;
  p.ssm = static_cast<float *>(t.ssm_state);
  p.out = t.core_attn_out;
  p.qkv_stride = qkv_stride;
  p.out_stride = t.out_stride;
  p.slot_stride = cfg.ssm_slot_stride;
  p.H = cfg.num_k_heads;
  p.HV = cfg.num_v_heads;
  p.K = cfg.head_k_dim;
  p.V = cfg.head_v_dim;
  p.v_offset = 2 * cfg.num_k_heads * cfg.head_k_dim;
  p.pad_slot_id = b.pad_slot_id;
  const int64_t HV = cfg.num_v_heads, V = cfg.head_v_dim;

  if (c.num_non_spec_seqs > 0 && b.non_spec_token_count > 0) {
    bind_group(p, c, Group::NonSpec);
    p.mode = plan.num_chunks() > 0 ? 0 : 1;  // without a chunk plan the recurrence takes every length
    ev = launch(c.q, k.recurrent, recurrent_range(c, p.num_seqs), p, ev);
    if (plan.num_chunks() > 0) {
      int32_t *tables = reinterpret_cast<int32_t *>(ws + l.tables);
      ev = c.q.memcpy(tables, plan.chunks.data(), plan.chunks.size() * 4, ev);
      ev = c.q.memcpy(tables + plan.chunks.size(), plan.seqs.data(), plan.seqs.size() * 4, ev);
      ev.wait();  // the host tables are locals of this call
      GdnDeltaParams pc = p;
      pc.chunk_table = tables;
      pc.seq_table = tables + plan.chunks.size();
      pc.chunk_w = reinterpret_cast<float *>(ws + l.cw);
      pc.chunk_u = reinterpret_cast<float *>(ws + l.cu);
      pc.chunk_aqk = reinterpret_cast<float *>(ws + l.caqk);
      pc.chunk_g = reinterpret_cast<float *>(ws + l.cg);
      pc.num_chunks = (int32_t)plan.num_chunks();
      if (cpu_chunk_variant(c.q, cfg)) {
        ev = launch(c.q, k.chunk_prep, range1(plan.num_chunks() * cfg.num_k_heads, 1), pc, ev);  // per k-head
        pc.num_seqs = (int32_t)plan.num_seqs();
        ev = launch(c.q, k.chunk_scan, range2(plan.num_seqs() * HV, V / 16, std::min<int64_t>(V / 16, 8)), pc, ev);
      } else {
        ev = launch(c.q, k.chunk_prep,
                    sycl::nd_range<2>{sycl::range<2>((size_t)(plan.num_chunks() * HV), (size_t)kChunk),
                                      sycl::range<2>(1, (size_t)kChunk)},
                    pc, ev);
        pc.num_seqs = (int32_t)plan.num_seqs();
        ev = launch(c.q, k.chunk_scan, range2(plan.num_seqs() * HV, V, kWorkGroup), pc, ev);
      }
    }
  }
  if (b.num_spec_decodes > 0 && b.spec_token_count > 0) {
    bind_group(p, c, Group::Spec);
    p.mode = 2;
    ev = launch(c.q, k.recurrent, recurrent_range(c, p.num_seqs), p, ev);
  }
  return ev;
}

sycl::event enqueue_norm(Checked &c, sycl::event ev) {
  const gdn_config_t &cfg = c.cfg;
  sycl::kernel k = get_kernel(c.q, Family::Norm, act_option(cfg.act_dtype), "gdn_gated_rmsnorm");
  GdnNormParams p{};
  p.out = c.t.core_attn_out;
  p.z = c.t.z;
  p.weight = c.t.norm_weight;
  p.out_stride = c.t.out_stride;
  p.z_stride = c.t.z_stride;
  p.rows = c.batch.num_actual_tokens;
  p.HV = cfg.num_v_heads;
  p.V = cfg.head_v_dim;
  p.eps = cfg.norm_eps;
  return launch(c.q, k, range1((int64_t)p.rows * p.HV, kWorkGroup), p, ev);
}

// Upper bound of the chunks of a batch, from counts alone (each sequence adds at most one partial chunk).
int64_t max_chunks(const gdn_batch_t &b) {
  const int64_t seqs = (int64_t)b.num_prefills + b.num_decodes;
  return seqs == 0 ? 0 : b.non_spec_token_count / kChunk + seqs;
}

void run(Op op, void *queue, const gdn_config_t *cfg, const gdn_batch_t *batch, const gdn_tensors_t *tensors) {
  Checked c = validate_call(queue, cfg, batch, tensors, op);
  if (c.batch.num_actual_tokens == 0) return;
  const bool conv = op != Op::Delta, delta = op != Op::Conv;
  const bool norm = op == Op::Attention && c.t.z;
  // Compile (or look up) every kernel first: a compile failure must not leave a half-done call.
  std::optional<DeltaKernels> dk;
  if (delta) dk = delta_kernels(c);
  if (conv) get_kernel(c.q, Family::Conv, conv_options(c.cfg), "gdn_conv_spec");
  if (norm) get_kernel(c.q, Family::Norm, act_option(c.cfg.act_dtype), "gdn_gated_rmsnorm");

  const ChunkPlan plan = delta ? plan_chunks(c) : ChunkPlan{};
  const bool conv_in_ws = op == Op::Attention && !c.t.conv_out;
  const Layout l = plan_layout(c.cfg, c.batch.num_actual_tokens, plan.num_chunks(),
                               (int64_t)(plan.chunks.size() + plan.seqs.size()), conv_in_ws, delta);
  Workspace *owned = nullptr;
  std::unique_lock<std::mutex> ws_lock;
  char *ws = static_cast<char *>(c.t.workspace);
  if (delta || conv_in_ws) {
    if (ws) {
      if (c.t.workspace_bytes < l.total)
        fail(GDN_ERROR_OUT_OF_MEMORY, "tensors->workspace_bytes = " + std::to_string(c.t.workspace_bytes) +
                                          " < " + std::to_string(l.total) + " needed by this batch");
    } else {
      owned = &workspace_for(c.q);
      ws_lock = std::unique_lock<std::mutex>(owned->m);
      grow(*owned, l.total);
      ws = static_cast<char *>(owned->ptr);
    }
  }
  void *conv_out = conv_in_ws ? ws + l.conv_out : c.t.conv_out;
  const int64_t conv_out_stride = conv_in_ws ? c.conv_dim : c.t.conv_out_stride;

  sycl::event ev;
  if (conv) ev = enqueue_conv(c, conv_out, conv_out_stride, ev);
  if (delta) ev = enqueue_delta(c, *dk, plan, l, ws, conv_out, conv_out_stride, ev);
  if (norm) ev = enqueue_norm(c, ev);
  // Out-of-order queues give the caller no ordering after our last kernel: finish here.
  // (On an in-order queue the next call's kernels, which may reuse the workspace, run after ours.)
  if (!c.q.is_in_order()) ev.wait_and_throw();
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

GDN_API gdn_status_t gdn_attention_workspace_size(const gdn_config_t *cfg, const gdn_batch_t *batch, size_t *bytes) {
  return gdn::guarded([&] {
    if (!bytes) gdn::fail(GDN_ERROR_NULL_POINTER, "bytes is NULL");
    const gdn_config_t c = gdn::validate_config(cfg);
    const gdn_batch_t b = gdn::validate_batch_counts(batch);
    const int64_t chunks = gdn::max_chunks(b);
    *bytes = gdn::plan_layout(c, b.num_actual_tokens, chunks, chunks * 4 + ((int64_t)b.num_prefills + b.num_decodes) * 4,
                              true, true)
                 .total;
  });
}

GDN_API gdn_status_t gdn_warmup(void *queue, const gdn_config_t *cfg) {
  return gdn::guarded([&] {
    if (!queue) gdn::fail(GDN_ERROR_BAD_QUEUE, "queue is NULL");
    const gdn_config_t c = gdn::validate_config(cfg);
    const sycl::queue &q = *static_cast<sycl::queue *>(queue);
    gdn::get_kernel(q, gdn::Family::Conv, gdn::conv_options(c), "gdn_conv_spec");
    gdn::get_kernel(q, gdn::Family::Delta, gdn::delta_options(q, c), "gdn_prep");
    gdn::get_kernel(q, gdn::Family::Norm, gdn::act_option(c.act_dtype), "gdn_gated_rmsnorm");
  });
}

GDN_API void gdn_release_caches(void) {
  {
    std::lock_guard<std::mutex> lock(gdn::workspaces_mutex);
    gdn::workspaces.clear();
  }
  gdn::release_kernel_cache();
}

}  // extern "C"
