// checks.hpp — the validation stage's parts, declared for one another (validate.hpp is its face).
#pragma once
#include <cstdint>
#include <string>
#include <sycl/sycl.hpp>
#include "errors.hpp"
#include "validate.hpp"

namespace gdn {

// A check with its failure message built only when it fails: these run on every call, and
// building every message eagerly (std::to_string, "%g" formatting, heap strings) costs ~1 us a
// call on the host path.
#define GDN_REQUIRE(ok, status, message)            \
  do {                                              \
    if (!(ok)) ::gdn::fail((status), (message));    \
  } while (0)

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

// metadata.cpp: the metadata arrays' contents, read to the host and checked (GDN_VALIDATE_FULL).
void check_metadata(Checked &c);

// replay.cpp: replay mode's checks of a call's ring counts (GDN_VALIDATE_FULL, after check_metadata).
void check_replay_counts(Checked &c);

}  // namespace gdn
