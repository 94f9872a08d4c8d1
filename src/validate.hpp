// validate.hpp — every check of a call, in one place, before anything is launched.
// A call that passes has consistent counts, non-null arrays where the counts need them, USM
// pointers of the queue's context each inside its allocation for the bytes the call may touch,
// and (GDN_VALIDATE_FULL) metadata whose contents are in range and free of write conflicts.
// docs/op.md "Errors and validation" lists each rule and its status.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <sycl/sycl.hpp>
#include "gdn_xpu.h"
#include "kernels/params.hpp"

namespace gdn {

// A check with its failure message built only when it fails: these run on every call, and
// building every message eagerly (std::to_string, "%g" formatting, heap strings) costs ~1 us a
// call on the host path.
#define GDN_REQUIRE(ok, status, message)            \
  do {                                              \
    if (!(ok)) ::gdn::fail((status), (message));    \
  } while (0)

enum class Op { Conv, Delta, Attention };

// Host copies of the metadata arrays that were read back.
struct HostMeta {
  std::vector<int32_t> ns_qsl, ns_slots, s_qsl, s_slots, accepted, ns_tok, s_tok;
  std::vector<int32_t> ns_read, s_read, start_pos, ckpt;  // empty when the batch leaves them NULL / unused
  std::vector<uint8_t> has_init;                          // read back only with non_spec_read_state_indices
};

struct Checked {
  // Made from the caller's queue: a default-constructed sycl::queue would be a new queue on the
  // default device (an OpenCL command queue created and destroyed per call, ~3 us here).
  explicit Checked(const sycl::queue &queue) : q(queue) {}
  sycl::queue q;
  gdn_config_t cfg;   // the caller's structs, copied and normalized (struct_size handled,
  gdn_batch_t batch;  // zero strides replaced by dense ones, scale filled in)
  gdn_tensors_t t;
  int32_t conv_dim = 0;
  int32_t num_non_spec_seqs = 0;
  size_t act_bytes = 0;
  bool recording = false;  // the queue records into a command graph (gdn_xpu.h "Graphs")
  HostMeta meta;      // read back under GDN_VALIDATE_FULL only
};

// Validates one call of `op`. Throws Failure naming the field and value on the first violation.
Checked validate_call(void *queue, const gdn_config_t *cfg, const gdn_batch_t *batch, const gdn_tensors_t *t, Op op);

// Config-only checks (gdn_warmup, gdn_attention_workspace_size).
gdn_config_t validate_config(const gdn_config_t *cfg);
gdn_batch_t validate_batch_counts(const gdn_batch_t *batch);

size_t dtype_bytes(int32_t dtype);  // 0 for a value that is not a gdn_dtype_t

// conv_dim = 2*H*K + HV*V: the channels of mixed_qkv, conv_out and a conv slot.
inline int64_t conv_dim_of(const gdn_config_t &cfg) {
  return 2LL * cfg.num_k_heads * cfg.head_k_dim + (int64_t)cfg.num_v_heads * cfg.head_v_dim;
}

// Gate values per v-head and token (params.hpp, gdn_gate_k) and f32 values of a replay ring entry,
// of a validated config.
inline int32_t gate_k_of(const gdn_config_t &cfg) { return gdn_gate_k(cfg.gate_mode, cfg.head_k_dim); }
inline int64_t ring_floats_of(const gdn_config_t &cfg) {
  return gdn_ring_floats(cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim, gate_k_of(cfg));
}

// The model dims validate_config accepts (gdn_xpu.h, gdn_config_t): 1..these.
constexpr int32_t kMaxKHeads = 1024, kMaxVHeads = 4096, kMaxHeadDim = 256;

// The queue records what is submitted to it into a command graph (sycl_ext_oneapi_graph; gdn_xpu.h
// "Graphs"): nothing submitted runs now, and nothing may wait for it.
inline bool recording(const sycl::queue &q) {
  return q.ext_oneapi_get_state() == sycl::ext::oneapi::experimental::queue_state::recording;
}

// Decimal text of a value, for failure messages.
inline std::string str(int64_t v) { return std::to_string(v); }

// The batch stores block checkpoints (its checkpoint fields are read only then).
inline bool checkpoints(const Checked &c) { return c.batch.checkpoint_interval > 0 && c.num_non_spec_seqs > 0; }

// pointers.cpp: every array given is USM of the queue's context, aligned to its element size, and
// (where the backend reports allocation extents, alloc_extent.hpp) holds the bytes `op` may touch
// from its pointer to the end of its allocation.
void check_pointers(const Checked &c, Op op);

// What a call may touch of one array: `bytes` from its pointer, for `count` of `unit` (named in
// the message). bytes 0: the call does not read or write the array.
struct Need {
  int64_t bytes;
  int64_t count;
  const char *unit;
};
struct Array {
  const void *p;     // NULL: not given, not checked
  const char *field;
  size_t align;      // the element size
  const char *what;  // the element type, for the message
  Need need;
};
// Bytes of `count` rows (or slots) of `width` elements at `stride` elements apart, saturated at
// INT64_MAX (strides are unbounded above: the extent then fails to fit); 0 for none.
int64_t rows_bytes(int64_t count, int64_t stride, int64_t width, size_t elem);
// check_pointers' checks of a list of arrays (flags: cfg->flags, for GDN_FLAG_HOST_MEMORY).
void check_arrays(const sycl::queue &q, int32_t flags, const Array *arrays, size_t n);

// replay.cpp: replay mode's checks of a call's ring counts (GDN_VALIDATE_FULL, after check_metadata).
void check_replay_counts(Checked &c);

// metadata.cpp: the metadata arrays' contents, read to the host and checked (GDN_VALIDATE_FULL).
void check_metadata(Checked &c);

}  // namespace gdn
