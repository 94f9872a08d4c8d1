// kernel_cache.hpp — run-time compiled kernels, memoised per (context, device, family, options).
#pragma once
#include <string>
#include <vector>
#include <sycl/sycl.hpp>

#include "kernels/families.hpp"

namespace gdn {

// A kernel: its name in the build of `family` with `options` (e.g. "-DGDN_ACT_BF16").
struct KernelRef {
  Family family;
  std::string options;
  const char *name;
};

// The kernels of refs, in their order, for q's device. The first request of a build in a process
// loads it from the library's disk cache (disk_cache.hpp) or compiles its source (seconds) and
// stores it there; later requests are a lookup. The builds one request needs run on several
// threads at once (up to the CPUs this process may use, at most 4), and a build another thread
// is already making is waited for, not made twice. Throws Failure{GDN_ERROR_COMPILE | GDN_ERROR_UNSUPPORTED} with the compiler log
// (the first failing build of refs; the others are still made and kept).
std::vector<sycl::kernel> get_kernels(const sycl::queue &q, const std::vector<KernelRef> &refs);

void release_kernel_cache();

}  // namespace gdn
