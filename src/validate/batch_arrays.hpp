// batch_arrays.hpp — the metadata arrays of gdn_batch_t and how many elements of each a call reads,
// from the counts alone: the one place of those lengths. pointers.cpp checks that each array holds
// them, metadata.cpp reads them back; an array's index is also its MetaReader staging kind.
#pragma once
#include <cstddef>
#include <cstdint>
#include "gdn_xpu.h"

namespace gdn {

// In gdn_batch_t's order.
enum class BatchArray {
  NonSpecQueryStartLoc, NonSpecStateIndices, HasInitialState, NonSpecTokenIndx, SpecQueryStartLoc, SpecStateIndices,
  NumAcceptedTokens, SpecTokenIndx, NonSpecReadStateIndices, SpecReadStateIndices, NonSpecStartPos, CheckpointStateIndices
};
constexpr int kNumBatchArrays = static_cast<int>(BatchArray::CheckpointStateIndices) + 1;
// (gdn_batch_array_elements reports them by this index: the struct's order, checked here)
static_assert(offsetof(gdn_batch_t, non_spec_query_start_loc) < offsetof(gdn_batch_t, non_spec_state_indices) &&
                  offsetof(gdn_batch_t, non_spec_state_indices) < offsetof(gdn_batch_t, has_initial_state) &&
                  offsetof(gdn_batch_t, has_initial_state) < offsetof(gdn_batch_t, non_spec_token_indx) &&
                  offsetof(gdn_batch_t, non_spec_token_indx) < offsetof(gdn_batch_t, spec_query_start_loc) &&
                  offsetof(gdn_batch_t, spec_query_start_loc) < offsetof(gdn_batch_t, spec_state_indices) &&
                  offsetof(gdn_batch_t, spec_state_indices) < offsetof(gdn_batch_t, num_accepted_tokens) &&
                  offsetof(gdn_batch_t, num_accepted_tokens) < offsetof(gdn_batch_t, spec_token_indx) &&
                  offsetof(gdn_batch_t, spec_token_indx) < offsetof(gdn_batch_t, non_spec_read_state_indices) &&
                  offsetof(gdn_batch_t, non_spec_read_state_indices) < offsetof(gdn_batch_t, spec_read_state_indices) &&
                  offsetof(gdn_batch_t, spec_read_state_indices) < offsetof(gdn_batch_t, non_spec_start_pos) &&
                  offsetof(gdn_batch_t, non_spec_start_pos) < offsetof(gdn_batch_t, checkpoint_state_indices),
              "BatchArray is in gdn_batch_t's order of its arrays");

// One array of a batch with validated counts.
struct BatchSpan {
  const char *field;   // for messages
  const void *p;       // NULL: not given, or not read at all (checkpoint_state_indices without checkpoints)
  int64_t n;           // the elements the call reads (a token group without sequences reads none)
  size_t elem;         // the element size
  const char *type;    // the element type, for messages
  const char *length;  // n in words, for messages
};

template <class T>
inline BatchSpan batch_span_of(const char *field, const T *p, int64_t n, const char *length) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 1, "metadata arrays are int32 or uint8");
  return {field, p, n, sizeof(T), sizeof(T) == 1 ? "uint8" : "int32", length};
}

inline BatchSpan batch_span(const gdn_batch_t &b, BatchArray a) {
  const int64_t ns = (int64_t)b.num_prefills + b.num_decodes, sp = b.num_spec_decodes;
  const bool checkpoints = b.checkpoint_interval > 0 && ns > 0;
  const char *per_non_spec_seq = "entries: num_prefills + num_decodes";
  switch (a) {
    case BatchArray::NonSpecQueryStartLoc:
      return batch_span_of("batch->non_spec_query_start_loc", b.non_spec_query_start_loc, ns ? ns + 1 : 0,
                           "entries: num_prefills + num_decodes + 1");
    case BatchArray::NonSpecStateIndices:
      return batch_span_of("batch->non_spec_state_indices", b.non_spec_state_indices, ns, per_non_spec_seq);
    case BatchArray::HasInitialState:
      return batch_span_of("batch->has_initial_state", b.has_initial_state, ns, per_non_spec_seq);
    case BatchArray::NonSpecTokenIndx:
      return batch_span_of("batch->non_spec_token_indx", b.non_spec_token_indx, ns ? b.non_spec_token_count : 0,
                           "entries: non_spec_token_count");
    case BatchArray::SpecQueryStartLoc:
      return batch_span_of("batch->spec_query_start_loc", b.spec_query_start_loc, sp ? sp + 1 : 0,
                           "entries: num_spec_decodes + 1");
    case BatchArray::SpecStateIndices:
      return batch_span_of("batch->spec_state_indices", b.spec_state_indices, sp * (b.num_spec + 1),
                           "entries: num_spec_decodes * (1 + num_spec)");
    case BatchArray::NumAcceptedTokens:
      return batch_span_of("batch->num_accepted_tokens", b.num_accepted_tokens, sp, "entries: num_spec_decodes");
    case BatchArray::SpecTokenIndx:
      return batch_span_of("batch->spec_token_indx", b.spec_token_indx, sp ? b.spec_token_count : 0,
                           "entries: spec_token_count");
    case BatchArray::NonSpecReadStateIndices:
      return batch_span_of("batch->non_spec_read_state_indices", b.non_spec_read_state_indices, ns, per_non_spec_seq);
    case BatchArray::SpecReadStateIndices:
      return batch_span_of("batch->spec_read_state_indices", b.spec_read_state_indices, sp, "entries: num_spec_decodes");
    case BatchArray::NonSpecStartPos:
      return batch_span_of("batch->non_spec_start_pos", b.non_spec_start_pos, ns, per_non_spec_seq);
    case BatchArray::CheckpointStateIndices:
      return batch_span_of("batch->checkpoint_state_indices", checkpoints ? b.checkpoint_state_indices : nullptr,
                           checkpoints ? ns * b.checkpoint_cols : 0,
                           "entries: (num_prefills + num_decodes) * checkpoint_cols");
  }
  return {};
}

}  // namespace gdn
