// pointers.cpp — the checks of every array pointer of a call (checks.hpp check_pointers): USM of
// the queue's context (device USM: of the queue's device), aligned to its element size, and inside
// its allocation for the bytes the call may touch.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "alloc_extent.hpp"
#include "batch_arrays.hpp"
#include "checks.hpp"
#include "errors.hpp"
#include "kernels/params.hpp"

namespace gdn {
namespace {

std::string ptr_str(const void *p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// USM of the queue's context; in a context of several devices (dpctl's default context holds all
// GPUs of a platform) device USM must be the queue's device's own. (The device lookup is one more
// runtime call per array: made only when the context has more than one device.) A pointer the
// context does not know is system memory when the caller says so (host_ok: GDN_FLAG_HOST_MEMORY on a
// device with sycl::aspect::usm_system_allocations, whose kernels address any host memory;
// gdn_xpu.h "Host memory"), else refused: a freed pointer looks the same.
void check_usm(const sycl::queue &q, const sycl::context &ctx, bool several_devices, bool host_ok, const void *p,
               const char *field) {
  const sycl::usm::alloc kind = sycl::get_pointer_type(p, ctx);
  if (kind == sycl::usm::alloc::unknown) {
    if (host_ok) return;
    fail(GDN_ERROR_BAD_POINTER, std::string(field) + " is not a USM allocation of the queue's context (host memory "
                                    "is accepted only with GDN_FLAG_HOST_MEMORY, on devices with "
                                    "sycl::aspect::usm_system_allocations)");
  }
  if (several_devices && kind == sycl::usm::alloc::device && sycl::get_pointer_device(p, ctx) != q.get_device())
    fail(GDN_ERROR_BAD_POINTER, std::string(field) + " is device USM of another device than the queue's ('" +
                                    sycl::get_pointer_device(p, ctx).get_info<sycl::info::device::name>() + "')");
}

// Every array is aligned to its element size: what element loads need on any device. Wider vector
// accesses are the kernels' own business and never a reason to refuse a view: they check and fall
// back (state.hpp vstore_states_stream), or load through memcpy (vec16.hpp load_act16).
void check_aligned(const void *p, size_t align, const char *what, const char *field) {
  const size_t off = (size_t)((uintptr_t)p % align);
  if (off)
    fail(GDN_ERROR_BAD_POINTER, std::string(field) + " = " + ptr_str(p) + " is not aligned to its element size (" +
                                    str((int64_t)align) + " bytes, " + what + "): " + str((int64_t)off) +
                                    " byte(s) past a boundary");
}

// a * b + c, saturated at INT64_MAX (strides are unbounded above; the extent then fails to fit).
int64_t mul_add(int64_t a, int64_t b, int64_t c) {
  if (a > 0 && b > (INT64_MAX - c) / a) return INT64_MAX;
  return a * b + c;
}

}  // namespace

int64_t rows_bytes(int64_t count, int64_t stride, int64_t width, size_t elem) {
  if (count <= 0) return 0;
  const int64_t elems = mul_add(count - 1, stride, width);
  return mul_add(elems, (int64_t)elem, 0);
}

namespace {

// [p, p + need.bytes) lies inside e, the allocation holding p, when the backend could tell.
void check_extent(const alloc_extent::Extent &e, const void *p, const Need &need, const char *field) {
  if (need.bytes <= 0 || !e.base) return;  // not touched, or the backend cannot say: sizes trusted
  const char *c = static_cast<const char *>(p);
  const int64_t have = c >= e.base && c < e.base + e.size ? (int64_t)(e.base + e.size - c) : 0;
  if (need.bytes > have)
    fail(GDN_ERROR_BAD_POINTER, std::string(field) + " = " + ptr_str(p) + " needs " + str(need.bytes) + " bytes (" +
                                    need.unit + " = " + str(need.count) + ") but its allocation has " + str(have) +
                                    " bytes from that pointer on (an allocation of " + str((int64_t)e.size) +
                                    " bytes at " + ptr_str(e.base) + ")");
}

}  // namespace

void check_pointers(const Checked &c, Op op) {
  const gdn_config_t &cfg = c.cfg;
  const gdn_batch_t &b = c.batch;
  const gdn_tensors_t &t = c.t;
  const sycl::queue &q = c.q;
  const bool packed = cfg.packed_order != GDN_PACKED_NONE;
  const bool conv = op != Op::Delta, delta = op != Op::Conv, gates = delta && !t.g;
  const bool norm = op == Op::Attention && (packed ? t.norm_weight != nullptr : t.z != nullptr);
  const int64_t T = b.num_actual_tokens;
  const int64_t hv = cfg.num_v_heads, gk = gate_k_of(cfg), ov = (int64_t)cfg.num_v_heads * cfg.head_v_dim, C = c.conv_dim;
  const size_t act = c.act_bytes, state = dtype_bytes(cfg.state_dtype);
  const int64_t ws = (int64_t)std::min<size_t>(t.workspace_bytes, INT64_MAX);
  // Row arrays: num_actual_tokens rows at their stride; weights: their shapes; caches: every slot.
  auto rows = [&](bool used, int64_t stride, int64_t width, size_t elem) {
    return Need{used ? rows_bytes(T, stride, width, elem) : 0, T, "rows: num_actual_tokens"};
  };
  auto fixed = [](bool used, int64_t n, size_t elem) { return Need{used ? n * (int64_t)elem : 0, n, "elements"}; };
  auto slots = [&](bool used, int64_t stride, int64_t width, size_t elem) {
    return Need{used ? rows_bytes(cfg.num_slots, stride, width, elem) : 0, cfg.num_slots, "slots: num_slots"};
  };
  const bool replay = delta && cfg.replay_tokens > 0;
  const int64_t ring = (int64_t)cfg.replay_tokens * ring_floats_of(cfg);
  const size_t dt_bias = dtype_bytes(t.dt_bias_dtype);  // (validated: f32 or act_dtype)
  const char *act_t = cfg.act_dtype == GDN_DTYPE_F32 ? "f32 act_dtype" : cfg.act_dtype == GDN_DTYPE_F16 ? "f16 act_dtype" : "bf16 act_dtype";
  // Metadata first, every BatchArray: the lengths the counts imply (batch_arrays.hpp; metadata.cpp
  // reads these).
  auto meta = [&](BatchArray a) {
    const BatchSpan s = batch_span(b, a);
    return Array{s.p, s.field, s.elem, s.type, Need{s.n * (int64_t)s.elem, s.n, s.length}};
  };
  using A = BatchArray;
  const Array arrays[] = {
      meta(A::NonSpecQueryStartLoc), meta(A::NonSpecStateIndices), meta(A::HasInitialState), meta(A::NonSpecTokenIndx),
      meta(A::SpecQueryStartLoc), meta(A::SpecStateIndices), meta(A::NumAcceptedTokens), meta(A::SpecTokenIndx),
      meta(A::NonSpecReadStateIndices), meta(A::SpecReadStateIndices), meta(A::NonSpecStartPos),
      meta(A::CheckpointStateIndices),
      {t.mixed_qkv, "tensors->mixed_qkv", act, act_t, rows(conv, t.mixed_qkv_stride, C, act)},
      {t.conv_weight, "tensors->conv_weight", act, act_t, fixed(conv, C * cfg.conv_width, act)},
      {t.conv_bias, "tensors->conv_bias", act, act_t, fixed(conv, C, act)},
      {t.conv_state, "tensors->conv_state", act, act_t, slots(conv, cfg.conv_slot_stride, C * cfg.conv_state_len, act)},
      {t.conv_out, "tensors->conv_out", act, act_t, rows(true, t.conv_out_stride, C, act)},
      {t.a, "tensors->a", act, act_t, rows(gates, t.ab_stride, hv * gk, act)},
      {t.b, "tensors->b", act, act_t, rows(gates, t.b_stride, hv, act)},
      {t.A_log, "tensors->A_log", 4, "f32", fixed(gates, hv, 4)},
      {t.dt_bias, "tensors->dt_bias", dt_bias, dt_bias == 4 ? "f32" : act_t, fixed(gates, hv * gk, dt_bias)},
      {t.g, "tensors->g", 4, "f32", rows(delta, hv * gk, hv * gk, 4)},
      {t.beta, "tensors->beta", 4, "f32", rows(delta, hv, hv, 4)},
      {t.ssm_state, "tensors->ssm_state", state, "state_dtype",
       slots(delta, cfg.ssm_slot_stride, hv * cfg.head_k_dim * cfg.head_v_dim, state)},
      {t.ssm_scale, "tensors->ssm_scale", 4, "f32", slots(delta && state_8bit(cfg.state_dtype), cfg.ssm_scale_slot_stride, ov, 4)},
      {t.core_attn_out, "tensors->core_attn_out", act, act_t, rows(delta, t.out_stride, ov, act)},
      {t.z, "tensors->z", act, act_t, rows(norm, t.z_stride, ov, act)},
      {t.norm_weight, "tensors->norm_weight", act, act_t, fixed(norm, cfg.head_v_dim, act)},
      {t.qkvz, "tensors->qkvz", act, act_t, rows(conv || norm, t.qkvz_stride, C + ov, act)},
      {t.ba, "tensors->ba", act, act_t, rows(gates, t.ba_stride, 2 * hv, act)},
      {t.z_out, "tensors->z_out", act, act_t, rows(conv, t.z_out_stride, ov, act)},
      {t.workspace, "tensors->workspace", 4, "f32 and int32 scratch", Need{delta ? ws : 0, ws, "workspace_bytes"}},
      {t.replay_ring, "tensors->replay_ring", 4, "f32", slots(replay, ring, ring, 4)},
      {t.replay_count, "tensors->replay_count", 4, "int32", slots(replay, 1, 1, 4)}};
  check_arrays(q, cfg.flags, arrays, sizeof arrays / sizeof arrays[0]);
}

void check_arrays(const sycl::queue &q, int32_t flags, const Array *arrays, size_t n) {
  const sycl::context ctx = q.get_context();  // once: each get_context() copies a shared_ptr
  const bool several_devices = ctx.get_devices().size() > 1;
  const alloc_extent::Lookup lookup(ctx);
  const bool host_ok = (flags & GDN_FLAG_HOST_MEMORY) && q.get_device().has(sycl::aspect::usm_system_allocations);
  for (const Array &a : sycl::span<const Array>(arrays, n)) {
    if (!a.p) continue;
    const alloc_extent::Extent e = a.need.bytes > 0 ? lookup.of(a.p) : alloc_extent::Extent{};
    // An allocation the backend found in this context is USM of it (proves_usm): the runtime's
    // pointer-type lookup would ask again (~0.13 us an array). Several devices: the device check.
    if (!e.base || !lookup.proves_usm() || several_devices) check_usm(q, ctx, several_devices, host_ok, a.p, a.field);
    check_aligned(a.p, a.align, a.what, a.field);
    check_extent(e, a.p, a.need, a.field);
  }
}

}  // namespace gdn
