// usm_memcpy_growth.cpp — the SYCL CPU device (OpenCL CPU runtime, intel-opencl-rt 2026.1.2) keeps
// ~110 bytes for every distinct pointer value ever passed to a USM memcpy, source or destination,
// host or USM, for the life of the process (freeing the USM allocation does not release them).
// Without libgdn_xpu. Not part of CI; docs/design.md "Memory over many calls" explains what it shows.
//   build: P=<venv prefix>; g++ -std=c++17 -O2 -DSYCL_DISABLE_FSYCL_SYCLHPP_WARNING
//            -Wno-deprecated-declarations -I$P/include usm_memcpy_growth.cpp -L$P/lib -lsycl -Wl,-rpath,$P/lib
//          (one line)
//   run:   OCL_ICD_FILENAMES=$P/lib/libintelocl.so ./a.out MODE [calls] [step] [spread]
// MODE, each call:
//   d2h          q.memcpy(host buffer <- USM shared), wait; always the same two addresses  -> no growth
//   d2h-spread   the same into one of `spread` host addresses (a fresh std::vector per call
//                lands on ever different heap addresses: what libgdn_xpu's validation did)   -> grows
//   src-spread   from one of `spread` addresses inside one USM device allocation           -> grows
//   u2u-spread   USM shared -> one of `spread` addresses inside one USM host allocation     -> grows
//   direct       q.wait(), then read the USM shared buffer on the host (no command)         -> no growth
//   kernel-wait  a trivial run-time compiled kernel, then q.wait()                          -> no growth
// Prints malloc's bytes in use (mallinfo2, glibc) and RSS relative to the start, after a warm-up.
// Measured here (2026-12-03, spread 100000): d2h-spread, src-spread and u2u-spread +106 B/call over
// the first 100,000 calls, flat once every address has been used, kept after the buffers are freed;
// with spread 1,000,000, +109 B/call over 200,000 calls. d2h, direct, kernel-wait: < 0.2 B/call.
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <sycl/sycl.hpp>
#include <vector>

namespace syclexp = sycl::ext::oneapi::experimental;

static long rss_kb() {
  long pages = 0, rss = 0;
  if (FILE *f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    std::fclose(f);
  }
  return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static const char *kSource = R"(
#include <sycl/sycl.hpp>
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((sycl::ext::oneapi::experimental::nd_range_kernel<1>))
void bump(int *p) { p[sycl::ext::oneapi::this_work_item::get_nd_item<1>().get_global_id(0)] += 1; }
)";

int main(int argc, char **argv) {
  const std::string mode = argc > 1 ? argv[1] : "d2h-spread";
  const long calls = argc > 2 ? std::atol(argv[2]) : 200000, step = argc > 3 ? std::atol(argv[3]) : calls / 10;
  const long spread = argc > 4 ? std::atol(argv[4]) : 100000;
  sycl::queue q{sycl::cpu_selector_v, sycl::property::queue::in_order()};
  int *shared = sycl::malloc_shared<int>(64, q);
  std::memset(shared, 0, 64 * sizeof(int));
  std::vector<int> host_spread(mode == "d2h-spread" ? (size_t)spread * 16 : 0);
  int *dev_spread = mode == "src-spread" ? sycl::malloc_device<int>((size_t)spread * 16, q) : nullptr;
  int *usm_host_spread = mode == "u2u-spread" ? sycl::malloc_host<int>((size_t)spread * 16, q) : nullptr;
  std::optional<sycl::kernel> k;
  if (mode == "kernel-wait") {
    auto src = syclexp::create_kernel_bundle_from_source(q.get_context(), syclexp::source_language::sycl, kSource);
    k = syclexp::build(src).ext_oneapi_get_kernel("bump");
  }
  long sink = 0;
  auto one = [&](long i) {
    int buf[16];
    const size_t at = (size_t)(i % spread) * 16;
    if (mode == "d2h") {
      q.memcpy(buf, shared, sizeof buf).wait();
      sink += buf[i % 16];
    } else if (mode == "d2h-spread") {
      q.memcpy(host_spread.data() + at, shared, sizeof buf).wait();
      sink += host_spread[at];
    } else if (mode == "src-spread") {
      q.memcpy(buf, dev_spread + at, sizeof buf).wait();
      sink += buf[0];
    } else if (mode == "u2u-spread") {
      q.memcpy(usm_host_spread + at, shared, sizeof buf).wait();
      sink += usm_host_spread[at];
    } else if (mode == "direct") {
      q.wait();
      sink += shared[i % 16];
    } else if (mode == "kernel-wait") {
      q.submit([&](sycl::handler &h) {
        h.set_args(shared);
        h.parallel_for(sycl::nd_range<1>{64, 64}, *k);
      });
      q.wait();
    } else {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      std::exit(2);
    }
  };
  for (long i = 0; i < 5000; ++i) one(i + spread / 2);  // warm-up: the runtime's first-use allocations
  q.wait();
  const struct mallinfo2 m0 = mallinfo2();
  const long r0 = rss_kb();
  std::printf("%s: start rss %ld kB, heap in use %zu B\n", mode.c_str(), r0, m0.uordblks);
  for (long i = 1; i <= calls; ++i) {
    one(i);
    if (i % step == 0) {
      q.wait();
      const long heap = (long)mallinfo2().uordblks - (long)m0.uordblks, rss = rss_kb() - r0;
      std::printf("%s %8ld calls: heap %+9ld B (%5.1f B/call)  rss %+7ld kB\n", mode.c_str(), i, heap,
                  (double)heap / i, rss);
      std::fflush(stdout);
    }
  }
  sycl::free(shared, q);
  if (dev_spread) sycl::free(dev_spread, q);
  if (usm_host_spread) sycl::free(usm_host_spread, q);
  q.wait();
  std::printf("%s: after freeing the USM buffers heap %+ld B (sink %ld)\n", mode.c_str(),
              (long)mallinfo2().uordblks - (long)m0.uordblks, sink);
  return 0;
}
