// alloc_extent.cpp — see alloc_extent.hpp.
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>  // types and constants only: the functions are looked up at run time
#include <CL/cl_ext.h>
#include <dlfcn.h>

#include "alloc_extent.hpp"

#include <cstdint>
#include <mutex>
#include <vector>

#include <sycl/ext/oneapi/backend/level_zero.hpp>

namespace gdn::alloc_extent {
namespace {

// Level Zero's entry point, declared here (ze_api.h is not among the runtime wheel's headers):
// ze_result_t zeMemGetAddressRange(ze_context_handle_t, const void *ptr, void **pBase, size_t *pSize),
// ZE_RESULT_SUCCESS = 0.
using ZeMemGetAddressRange = int32_t (*)(ze_context_handle_t, const void *, void **, size_t *);
using ClGetExtensionFunctionAddressForPlatform = void *(*)(cl_platform_id, const char *);
using ClReleaseContext = cl_int (*)(cl_context);

// A library the runtime has loaded (RTLD_NOLOAD: its copy), else loaded here; nullptr if absent.
void *library(const char *name) {
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  return h ? h : dlopen(name, RTLD_NOW | RTLD_LOCAL);
}

void *opencl_symbol(const char *name) {
  static void *const h = library("libOpenCL.so.1");
  return h ? dlsym(h, name) : nullptr;
}

int query_opencl(void *native, void *fn, const void *p, Extent &out) {
  const auto info = reinterpret_cast<clGetMemAllocInfoINTEL_fn>(fn);
  const cl_context ctx = static_cast<cl_context>(native);
  void *base = nullptr;
  size_t size = 0;
  if (info(ctx, p, CL_MEM_ALLOC_BASE_PTR_INTEL, sizeof base, &base, nullptr) != CL_SUCCESS || !base) return 0;
  if (info(ctx, p, CL_MEM_ALLOC_SIZE_INTEL, sizeof size, &size, nullptr) != CL_SUCCESS) return 0;
  out = Extent{static_cast<const char *>(base), size};
  return 1;
}

int query_level_zero(void *native, void *fn, const void *p, Extent &out) {
  void *base = nullptr;
  size_t size = 0;
  if (reinterpret_cast<ZeMemGetAddressRange>(fn)(static_cast<ze_context_handle_t>(native), p, &base, &size) != 0 ||
      !base)
    return 0;
  out = Extent{static_cast<const char *>(base), size};
  return 1;
}

// One context's lookup. The entry holds the context, so its native handle stays valid and no
// other context can take its place in the list.
struct Entry {
  sycl::context ctx;
  int (*query)(void *, void *, const void *, Extent &) = nullptr;
  void *native = nullptr;
  void *fn = nullptr;
  bool retained_cl = false;  // native is a cl_context get_native retained for us
};

// Never destroyed at exit (see cache/kernel_cache.cpp); release() empties it.
std::mutex &entries_mutex = *new std::mutex;
std::vector<Entry> &entries = *new std::vector<Entry>;

void drop(Entry &e) {
  if (!e.retained_cl) return;
  if (auto rel = reinterpret_cast<ClReleaseContext>(opencl_symbol("clReleaseContext"))) rel(static_cast<cl_context>(e.native));
}

Entry resolve(const sycl::context &ctx) {
  Entry e{ctx};
  try {
    const sycl::backend be = ctx.get_backend();
    if (be == sycl::backend::opencl) {
      const auto get = reinterpret_cast<ClGetExtensionFunctionAddressForPlatform>(
          opencl_symbol("clGetExtensionFunctionAddressForPlatform"));
      if (!get || !opencl_symbol("clReleaseContext")) return e;
      e.fn = get(sycl::get_native<sycl::backend::opencl>(ctx.get_platform()), "clGetMemAllocInfoINTEL");
      if (!e.fn) return e;
      e.native = sycl::get_native<sycl::backend::opencl>(ctx);  // retained: drop() releases it
      e.retained_cl = true;
      e.query = query_opencl;
    } else if (be == sycl::backend::ext_oneapi_level_zero) {
      static void *const h = library("libze_loader.so.1");
      e.fn = h ? dlsym(h, "zeMemGetAddressRange") : nullptr;
      if (!e.fn) return e;
      e.native = sycl::get_native<sycl::backend::ext_oneapi_level_zero>(ctx);
      e.query = query_level_zero;
    }
  } catch (...) {  // no native handle: unknown, as for any other backend
    e.query = nullptr;
  }
  return e;
}

}  // namespace

Lookup::Lookup(const sycl::context &ctx) {
  std::lock_guard<std::mutex> lock(entries_mutex);
  const Entry *found = nullptr;
  for (const Entry &e : entries)
    if (e.ctx == ctx) found = &e;
  if (!found) {
    entries.push_back(resolve(ctx));
    found = &entries.back();
  }
  query_ = found->query, native_ = found->native, fn_ = found->fn;
  proves_usm_ = query_ == query_opencl;
  // (The caller's queue keeps the context, hence native_, alive for the call after a release().)
}

Extent Lookup::of(const void *p) const {
  Extent e;
  if (query_ && p && !query_(native_, fn_, p, e)) e = Extent{};
  return e;
}

void release() {
  std::vector<Entry> dropped;
  {
    std::lock_guard<std::mutex> lock(entries_mutex);
    dropped.swap(entries);
  }
  for (Entry &e : dropped) drop(e);
}

}  // namespace gdn::alloc_extent
