// kernel_cache.hpp — run-time compiled kernels, memoised per (context, device, family, options).
#pragma once
#include <string>
#include <sycl/sycl.hpp>

#include "kernels/families.hpp"

namespace gdn {

// The kernel `name` of `family` built with `options` (e.g. "-DGDN_ACT_BF16") for q's device.
// The first request in a process loads the family from the library's disk cache (disk_cache.hpp)
// or compiles its source (seconds) and stores it there; later requests are a lookup.
// Throws Failure{GDN_ERROR_COMPILE | GDN_ERROR_UNSUPPORTED} with the compiler log.
sycl::kernel get_kernel(const sycl::queue &q, Family family, const std::string &options, const char *name);

void release_kernel_cache();

}  // namespace gdn
