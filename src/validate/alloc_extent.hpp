// alloc_extent.hpp — the extent of the USM allocation holding a pointer, asked of the backend
// (validate.cpp: every array a call touches must lie inside its allocation).
//
// OpenCL (the CPU device): clGetMemAllocInfoINTEL with CL_MEM_ALLOC_BASE_PTR_INTEL and
// CL_MEM_ALLOC_SIZE_INTEL, looked up with clGetExtensionFunctionAddressForPlatform (the ICD loader
// does not export it). Level Zero (Intel GPUs): zeMemGetAddressRange from the libze_loader.so.1
// the runtime loaded. Both are found with dlopen/dlsym, as cache/device_binary.cpp finds its
// OpenCL entry points: no link dependency. Any other backend, a missing entry point or a pointer
// the backend does not know answers "unknown", and the caller then skips the check: the library's
// environment never fails a call.
//
// Nothing about an allocation is cached: one can be freed and another made at the same address,
// so every call asks afresh (two OpenCL queries or one Level Zero query per array). What is kept
// is per context: its native handle and the entry point (getting an OpenCL context's native
// handle costs tens of microseconds).
#pragma once
#include <cstddef>
#include <sycl/sycl.hpp>

namespace gdn::alloc_extent {

// [base, base + size) of one allocation; base == nullptr: the backend could not say.
struct Extent {
  const char *base = nullptr;
  size_t size = 0;
};

// The backend's lookup for one context, resolved once per call (cheap after the context's first).
class Lookup {
 public:
  explicit Lookup(const sycl::context &ctx);
  // The allocation holding p (interior pointers included), or an unknown Extent.
  Extent of(const void *p) const;
  // Whether a known Extent also proves p USM of this context. OpenCL: the extent queries ask the
  // context's own table of USM allocations, the one sycl::get_pointer_type asks for the pointer's
  // kind (a pointer of another context, host malloc or freed memory has no base there). Level Zero:
  // not relied upon (the driver's tables may span contexts).
  bool proves_usm() const { return proves_usm_; }

 private:
  int (*query_)(void *native, void *fn, const void *p, Extent &out) = nullptr;  // nullptr: unknown backend
  void *native_ = nullptr;  // cl_context / ze_context_handle_t
  void *fn_ = nullptr;      // the backend entry point
  bool proves_usm_ = false;
};

// Drops the per-context entries (gdn_release_caches).
void release();

}  // namespace gdn::alloc_extent
