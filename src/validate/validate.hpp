// validate.hpp — the validation stage: every check of a call, before anything is launched.
// A call that passes has consistent counts, non-null arrays where the counts need them, USM
// pointers of the queue's context each inside its allocation for the bytes the call may touch,
// and (GDN_VALIDATE_FULL) metadata whose contents are in range and free of write conflicts.
// docs/op.md "Errors and validation" lists each rule and its status. The stage's parts, in call
// order: validate.cpp (structs, config, counts, required arrays), pointers.cpp (every pointer),
// metadata.cpp (the metadata's contents), replay.cpp (replay mode's ring counts).
#pragma once
#include <cstdint>
#include <vector>
#include <sycl/sycl.hpp>
#include "gdn_xpu.h"
#include "call.hpp"

namespace gdn {

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

// The queue records what is submitted to it into a command graph (sycl_ext_oneapi_graph; gdn_xpu.h
// "Graphs"): nothing submitted runs now, and nothing may wait for it.
inline bool recording(const sycl::queue &q) {
  return q.ext_oneapi_get_state() == sycl::ext::oneapi::experimental::queue_state::recording;
}

// Validates one call of `op`. Throws Failure naming the field and value on the first violation.
Checked validate_call(void *queue, const gdn_config_t *cfg, const gdn_batch_t *batch, const gdn_tensors_t *t, Op op);

// Config-only checks (gdn_warmup, gdn_attention_workspace_size).
gdn_config_t validate_config(const gdn_config_t *cfg);
gdn_batch_t validate_batch_counts(const gdn_batch_t *batch);

// gdn_flush_replay's checks (replay.cpp): a replay-mode config, the arrays, slots in range and
// distinct, each num_tokens within its slot's ring count. Returns the validated config.
gdn_config_t validate_flush(void *queue, const gdn_config_t *cfg, int32_t num_flush, const int32_t *slots,
                            const int32_t *num_tokens, const void *ssm_state, const float *replay_ring,
                            const int32_t *replay_count);

}  // namespace gdn
