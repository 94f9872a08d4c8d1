// info.cpp — version, status strings, the thread-local error message, struct defaults.
#include <cstring>
#include "errors.hpp"

namespace {
thread_local std::string last_error;
#define GDN_STR2(x) #x
#define GDN_STR(x) GDN_STR2(x)
const char version_string[] = GDN_STR(GDN_VERSION_MAJOR) "." GDN_STR(GDN_VERSION_MINOR) "." GDN_STR(GDN_VERSION_PATCH);
}  // namespace

void gdn::set_last_error(const std::string &message) { last_error = message; }

extern "C" {

GDN_API const char *gdn_version(void) { return version_string; }
GDN_API int32_t gdn_abi_version(void) { return GDN_ABI_VERSION; }
GDN_API const char *gdn_last_error(void) { return last_error.c_str(); }
GDN_API size_t gdn_sizeof_config(void) { return sizeof(gdn_config_t); }
GDN_API size_t gdn_sizeof_batch(void) { return sizeof(gdn_batch_t); }
GDN_API size_t gdn_sizeof_tensors(void) { return sizeof(gdn_tensors_t); }

GDN_API const char *gdn_status_string(gdn_status_t status) {
  switch (status) {
    case GDN_SUCCESS: return "success";
    case GDN_ERROR_NULL_POINTER: return "a required array is NULL";
    case GDN_ERROR_BAD_COUNT: return "a count is negative or counts are inconsistent";
    case GDN_ERROR_BAD_SHAPE: return "unsupported or inconsistent model dimensions";
    case GDN_ERROR_BAD_DTYPE: return "unknown or unsupported dtype";
    case GDN_ERROR_BAD_LAYOUT: return "unknown layout or stride too small";
    case GDN_ERROR_BAD_START_LOC: return "query_start_loc not monotonic or not matching the token count";
    case GDN_ERROR_BAD_STATE_INDEX: return "state index out of range";
    case GDN_ERROR_DUPLICATE_SLOT: return "a state slot has two writers, or a writer and a reader, in one call";
    case GDN_ERROR_BAD_ACCEPTED: return "num_accepted_tokens outside [1, 1 + num_spec]";
    case GDN_ERROR_BAD_TOKEN_INDEX: return "token index out of range or rows overlapping";
    case GDN_ERROR_BAD_STRUCT_SIZE: return "struct_size of an older, unsupported caller";
    case GDN_ERROR_BAD_POINTER: return "not USM of the queue's context or device, misaligned, or past the end of its allocation";
    case GDN_ERROR_BAD_QUEUE: return "NULL queue";
    case GDN_ERROR_UNSUPPORTED: return "not supported by this build or device";
    case GDN_ERROR_COMPILE: return "run-time kernel compilation failed";
    case GDN_ERROR_DEVICE: return "SYCL device or runtime error";
    case GDN_ERROR_OUT_OF_MEMORY: return "out of memory";
    case GDN_ERROR_INTERNAL: return "internal error";
    default: return "unknown status";
  }
}

GDN_API void gdn_config_init(gdn_config_t *cfg) {
  if (!cfg) return;
  std::memset(cfg, 0, sizeof(*cfg));
  cfg->struct_size = sizeof(*cfg);
  cfg->act_dtype = GDN_DTYPE_BF16;
  cfg->state_dtype = GDN_DTYPE_F32;
  cfg->l2norm_eps = 1e-6f;
  cfg->norm_eps = 1e-6f;
}

GDN_API void gdn_batch_init(gdn_batch_t *batch) {
  if (!batch) return;
  std::memset(batch, 0, sizeof(*batch));
  batch->struct_size = sizeof(*batch);
  batch->pad_slot_id = -1;
}

GDN_API void gdn_tensors_init(gdn_tensors_t *t) {
  if (!t) return;
  std::memset(t, 0, sizeof(*t));
  t->struct_size = sizeof(*t);
}

}  // extern "C"
