// batch_arrays.hpp — the metadata arrays of gdn_batch_t and how many elements of each a call reads,
// from the counts alone: the one table of those lengths. pointers.cpp checks that each array holds
// them, metadata.cpp reads them back; the index of an array is also its MetaReader staging kind.
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

struct BatchArrayInfo {
  const char *field;   // for messages
  const char *type;    // the element type, for messages
  size_t elem;         // its size
  const char *length;  // the length in words, for messages
};
inline constexpr BatchArrayInfo kBatchArrays[kNumBatchArrays] = {
    {"batch->non_spec_query_start_loc", "int32", 4, "entries: num_prefills + num_decodes + 1"},
    {"batch->non_spec_state_indices", "int32", 4, "entries: num_prefills + num_decodes"},
    {"batch->has_initial_state", "uint8", 1, "entries: num_prefills + num_decodes"},
    {"batch->non_spec_token_indx", "int32", 4, "entries: non_spec_token_count"},
    {"batch->spec_query_start_loc", "int32", 4, "entries: num_spec_decodes + 1"},
    {"batch->spec_state_indices", "int32", 4, "entries: num_spec_decodes * (1 + num_spec)"},
    {"batch->num_accepted_tokens", "int32", 4, "entries: num_spec_decodes"},
    {"batch->spec_token_indx", "int32", 4, "entries: spec_token_count"},
    {"batch->non_spec_read_state_indices", "int32", 4, "entries: num_prefills + num_decodes"},
    {"batch->spec_read_state_indices", "int32", 4, "entries: num_spec_decodes"},
    {"batch->non_spec_start_pos", "int32", 4, "entries: num_prefills + num_decodes"},
    {"batch->checkpoint_state_indices", "int32", 4, "entries: (num_prefills + num_decodes) * checkpoint_cols"},
};
inline const BatchArrayInfo &batch_array_info(BatchArray a) { return kBatchArrays[static_cast<int>(a)]; }

// One array of a batch with validated counts: its pointer (NULL: not given, or not read at all --
// checkpoint_state_indices without block checkpoints) and the elements the call reads of it. A token
// group without sequences reads none of its arrays.
struct BatchSpan {
  const void *p;
  int64_t n;
};
inline BatchSpan batch_span(const gdn_batch_t &b, BatchArray a) {
  const int64_t ns = (int64_t)b.num_prefills + b.num_decodes, sp = b.num_spec_decodes;
  switch (a) {
    case BatchArray::NonSpecQueryStartLoc: return {b.non_spec_query_start_loc, ns ? ns + 1 : 0};
    case BatchArray::NonSpecStateIndices: return {b.non_spec_state_indices, ns};
    case BatchArray::HasInitialState: return {b.has_initial_state, ns};
    case BatchArray::NonSpecTokenIndx: return {b.non_spec_token_indx, ns ? b.non_spec_token_count : 0};
    case BatchArray::SpecQueryStartLoc: return {b.spec_query_start_loc, sp ? sp + 1 : 0};
    case BatchArray::SpecStateIndices: return {b.spec_state_indices, sp * (b.num_spec + 1)};
    case BatchArray::NumAcceptedTokens: return {b.num_accepted_tokens, sp};
    case BatchArray::SpecTokenIndx: return {b.spec_token_indx, sp ? b.spec_token_count : 0};
    case BatchArray::NonSpecReadStateIndices: return {b.non_spec_read_state_indices, ns};
    case BatchArray::SpecReadStateIndices: return {b.spec_read_state_indices, sp};
    case BatchArray::NonSpecStartPos: return {b.non_spec_start_pos, ns};
    case BatchArray::CheckpointStateIndices:
      if (b.checkpoint_interval <= 0 || ns == 0) return {nullptr, 0};
      return {b.checkpoint_state_indices, ns * b.checkpoint_cols};
  }
  return {nullptr, 0};
}

}  // namespace gdn
