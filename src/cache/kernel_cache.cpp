// kernel_cache.cpp — compiles the embedded SYCL sources with sycl_ext_oneapi_kernel_compiler, or
// loads them from the library's disk cache (disk_cache.hpp).
#include "kernel_cache.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <sched.h>
#include <system_error>
#include <thread>
#include <vector>

#include "disk_cache.hpp"
#include "errors.hpp"
#include "kernels/kernel_sources.hpp"  // generated at build time (src/kernels/meson.build)

namespace syclexp = sycl::ext::oneapi::experimental;

namespace {

// The embedded source of a family (kernels/families.hpp names its file).
const char *family_source(gdn::Family f) {
  const std::string name = gdn::family_file(f).file;
  for (size_t i = 0; i < gdn::num_kernel_files; ++i)
    if (name == gdn::kernel_files[i].name) return gdn::kernel_files[i].text;
  gdn::fail(GDN_ERROR_INTERNAL, "kernel source " + name + " is not embedded");
}

// Every embedded file that is not a kernel source (.cpp) is an include file of every build.
std::vector<std::pair<std::string, const char *>> kernel_includes() {
  std::vector<std::pair<std::string, const char *>> includes;
  for (size_t i = 0; i < gdn::num_kernel_files; ++i) {
    const std::string name = gdn::kernel_files[i].name;
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".cpp") != 0) includes.emplace_back(name, gdn::kernel_files[i].text);
  }
  return includes;
}

// The order a request's builds start in: the longest first, so that the others run beside it.
// On the CPU device the OpenCL runtime runs one program's back end at a time (front ends run side
// by side: docs/design.md "Cold start and warm-up"); the CPU recurrent build has the largest share.
int build_rank(gdn::Family f) {
  switch (f) {
    case gdn::Family::DeltaRecurrentCpu: return 0;
    case gdn::Family::DeltaChunkCpu: case gdn::Family::DeltaRecurrent: case gdn::Family::DeltaChunk: return 1;
    default: return 2;
  }
}

// One build: a family for one (context, device, options), freshly compiled or loaded from the
// disk cache. `done`, `error` and `kernels` change under cache_mutex; bundle and program are
// written by the one thread that makes the build, before `done`, and only read after it.
struct Build {
  sycl::context context;
  sycl::device device;
  gdn::Family family;
  std::string options;
  bool done = false;
  std::exception_ptr error;  // the build failed (it is then no longer in the cache)
  std::optional<sycl::kernel_bundle<sycl::bundle_state::executable>> bundle;
  std::unique_ptr<gdn::device_binary::Program> program;
  std::vector<std::pair<std::string, sycl::kernel>> kernels;  // looked up by name once

  Build(sycl::context c, sycl::device d, gdn::Family f, std::string o)
      : context(std::move(c)), device(std::move(d)), family(f), options(std::move(o)) {}
  sycl::kernel get(const char *name) {
    for (auto &k : kernels)
      if (k.first == name) return k.second;
    kernels.emplace_back(name, bundle ? bundle->ext_oneapi_get_kernel(name) : program->kernel(name));
    return kernels.back().second;
  }
};

// Never destroyed: at process exit the SYCL runtime may already be torn down, and destroying
// kernel bundles after it aborts the process. A handful of builds: linear search is enough.
std::mutex &cache_mutex = *new std::mutex;
std::condition_variable &build_done = *new std::condition_variable;  // a Build became done
std::vector<std::shared_ptr<Build>> &cache = *new std::vector<std::shared_ptr<Build>>;

// Threads a request's builds may use: the CPUs this process may run on, at most 4 (a build's
// front end takes a few hundred MB).
size_t build_threads() {
  size_t n = std::thread::hardware_concurrency();
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = (size_t)CPU_COUNT(&set);
  return std::min<size_t>(std::max<size_t>(n, 1), 4);
}

bool verbose() {
  const char *v = std::getenv("GDN_XPU_VERBOSE");
  return v && v[0] && v[0] != '0';
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Fills e.bundle (compiled now) or e.program (from the disk cache).
void compile(Build &e) {
  sycl::device dev = e.device;  // (ext_oneapi_can_build is not const)
  const char *family = gdn::family_file(e.family).file;
  if (!dev.ext_oneapi_can_build(syclexp::source_language::sycl))
    gdn::fail(GDN_ERROR_UNSUPPORTED, "device '" + dev.get_info<sycl::info::device::name>() +
                                         "' cannot build SYCL source at run time (sycl_ext_oneapi_kernel_compiler)");
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_seconds();
  const std::vector<std::pair<std::string, const char *>> includes = kernel_includes();
  std::vector<std::string> opts{"-O2"};
  if (dev.is_cpu()) {
    // Flush fp32 denormals on the CPU device. The gates make exp(g) and the decayed state
    // products land in the denormal range all the time (|g| of ~1..16 per token), and x86
    // handles denormal operands in microcode: on a Xeon the chunked prefill ran 2-4x slower,
    // data-dependently, without this. Values below 1.2e-38 carry no information at fp32
    // precision here. GPUs flush by default (and their compilers spell the option differently).
    // The CPU variants' bf16 instructions (vec16.hpp to_bf16x32, store_bf16x16) rely on it:
    // they take a denormal input as zero, as this makes every fp32 instruction do.
    opts.push_back("-Xs");
    opts.push_back("-cl-denorms-are-zero");
  }
  // Let the compiler fuse a * b + c into one FMA (rounded once: no less accurate). The SYCL
  // front end does not contract by default, and the CPU device then issues a multiply and an
  // add for every state update (recurrent ~8%, chunked prefill ~6% slower).
  opts.push_back("-ffp-contract=fast");
  for (size_t pos = 0; pos < e.options.size();) {  // options: space-separated -D flags
    size_t end = e.options.find(' ', pos);
    if (end == std::string::npos) end = e.options.size();
    if (end > pos) opts.push_back(e.options.substr(pos, end - pos));
    pos = end + 1;
  }

  // The library's own disk cache first (disk_cache.hpp): everything the binary depends on is in the key.
  gdn::disk_cache::BuildInputs inputs;
  inputs.add("source " + std::string(family), family_source(e.family));
  for (const auto &inc : includes) inputs.add("include " + inc.first, inc.second);
  std::string all_opts;
  for (const auto &o : opts) all_opts += o + "\n";
  inputs.add("options", all_opts);
  const std::string key = gdn::disk_cache::key_text(dev, inputs);
  std::string path;
  e.program = gdn::disk_cache::load(e.context, dev, key, family, &path);
  if (e.program) {
    if (verbose())
      std::fprintf(stderr, "libgdn_xpu: loaded %s [%s] from %s in %.2f s\n", family, e.options.c_str(), path.c_str(),
                   seconds_since(t0));
    return;
  }

  if (verbose())
    std::fprintf(stderr, "libgdn_xpu: compiling %s [%s] for %s ...\n", family, e.options.c_str(),
                 dev.get_info<sycl::info::device::name>().c_str());
  std::string log;
  try {
    syclexp::include_files headers;
    for (const auto &inc : includes) headers.add(inc.first, inc.second);
    auto source = syclexp::create_kernel_bundle_from_source(e.context, syclexp::source_language::sycl,
                                                            family_source(e.family), syclexp::properties{headers});
    e.bundle = syclexp::build(source, std::vector<sycl::device>{dev},
                              syclexp::properties{syclexp::build_options{opts}, syclexp::save_log{&log}});
  } catch (const sycl::exception &ex) {
    gdn::fail(GDN_ERROR_COMPILE, std::string("compiling kernel family '") + family + "' [" + e.options +
                                     "] failed: " + ex.what() + (log.empty() ? "" : "\n" + log));
  }
  if (verbose())
    std::fprintf(stderr, "libgdn_xpu: compiled %s [%s] in %.2f s (%.2f s of CPU)\n", family, e.options.c_str(),
                 seconds_since(t0), thread_cpu_seconds() - cpu0);
  const std::string stored = gdn::disk_cache::store(*e.bundle, dev, key, family);
  if (verbose() && !stored.empty()) std::fprintf(stderr, "libgdn_xpu: kept %s in %s\n", family, stored.c_str());
}

// Makes the builds (none made yet), the longest first, on up to build_threads() threads: this
// one and helpers. Each build ends done, or failed and out of the cache; waiters are woken.
void make(std::vector<std::shared_ptr<Build>> builds) {
  std::stable_sort(builds.begin(), builds.end(),
                   [](const auto &a, const auto &b) { return build_rank(a->family) < build_rank(b->family); });
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < builds.size();) {
      Build &b = *builds[i];
      std::exception_ptr error;
      try {
        compile(b);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(cache_mutex);
      b.done = true;
      b.error = error;
      if (error) {  // a later request tries again
        auto it = std::find(cache.begin(), cache.end(), builds[i]);
        if (it != cache.end()) cache.erase(it);
      }
      build_done.notify_all();
    }
  };
  std::vector<std::thread> helpers;
  for (size_t n = std::min(builds.size(), build_threads()); helpers.size() + 1 < n;) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error &) {  // no thread to be had: fewer helpers
      break;
    }
  }
  work();
  for (std::thread &t : helpers) t.join();
}

}  // namespace

std::vector<sycl::kernel> gdn::get_kernels(const sycl::queue &q, const std::vector<KernelRef> &refs) {
  const sycl::context ctx = q.get_context();
  const sycl::device dev = q.get_device();
  std::vector<std::shared_ptr<Build>> of(refs.size()), mine;  // the build of each ref; those made here
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    for (size_t i = 0; i < refs.size(); ++i) {
      for (const auto &b : cache)
        if (b->family == refs[i].family && b->options == refs[i].options && b->device == dev && b->context == ctx) {
          of[i] = b;
          break;
        }
      if (!of[i]) {
        of[i] = std::make_shared<Build>(ctx, dev, refs[i].family, refs[i].options);
        cache.push_back(of[i]);
        mine.push_back(of[i]);
      }
    }
  }
  if (!mine.empty()) make(mine);
  std::unique_lock<std::mutex> lock(cache_mutex);
  build_done.wait(lock, [&] { return std::all_of(of.begin(), of.end(), [](const auto &b) { return b->done; }); });
  for (const auto &b : of)
    if (b->error) std::rethrow_exception(b->error);
  std::vector<sycl::kernel> kernels;
  kernels.reserve(refs.size());
  for (size_t i = 0; i < refs.size(); ++i) kernels.push_back(of[i]->get(refs[i].name));
  return kernels;
}

void gdn::release_kernel_cache() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  cache.clear();
}
