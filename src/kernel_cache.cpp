// kernel_cache.cpp — compiles the embedded SYCL sources with sycl_ext_oneapi_kernel_compiler.
#include "kernel_cache.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include "errors.hpp"
#include "kernel_sources.hpp"  // generated at build time from src/kernels/*

namespace syclexp = sycl::ext::oneapi::experimental;

namespace {

// Switch the SYCL runtime's persistent device-code cache on (unless the user decided), before
// the first build. Opt out with GDN_XPU_DISK_CACHE=0.
struct EnablePersistentCache {
  EnablePersistentCache() {
    const char *opt = std::getenv("GDN_XPU_DISK_CACHE");
    if (opt && opt[0] == '0') return;
    if (std::getenv("SYCL_CACHE_PERSISTENT")) return;
    setenv("SYCL_CACHE_PERSISTENT", "1", 0);
    if (!std::getenv("SYCL_CACHE_DIR")) {
      std::string dir;
      if (const char *xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) dir = std::string(xdg) + "/libgdn_xpu";
      else if (const char *home = std::getenv("HOME"); home && *home) dir = std::string(home) + "/.cache/libgdn_xpu";
      if (!dir.empty()) setenv("SYCL_CACHE_DIR", dir.c_str(), 0);
    }
  }
} enable_persistent_cache;

// The source file of a family (its name in gdn::kernel_files).
const char *family_file(gdn::Family f) {
  switch (f) {
    case gdn::Family::Conv1d: return "conv1d.cpp";
    case gdn::Family::Conv1dCpu: return "conv1d_cpu.cpp";
    case gdn::Family::DeltaPrep: return "delta_prep.cpp";
    case gdn::Family::DeltaRecurrent: return "delta_recurrent.cpp";
    case gdn::Family::DeltaRecurrentCpu: return "delta_recurrent_cpu.cpp";
    case gdn::Family::DeltaChunk: return "delta_chunk.cpp";
    case gdn::Family::DeltaChunkCpu: return "delta_chunk_cpu.cpp";
    case gdn::Family::GatedNorm: return "gated_norm.cpp";
  }
  return "?";
}
const char *family_name(gdn::Family f) { return family_file(f); }

const char *family_source(gdn::Family f) {
  const std::string name = family_file(f);
  for (size_t i = 0; i < gdn::num_kernel_files; ++i)
    if (name == gdn::kernel_files[i].name) return gdn::kernel_files[i].text;
  gdn::fail(GDN_ERROR_INTERNAL, "kernel source " + name + " is not embedded");
}

// Every embedded file that is not a kernel source is an include file of every build.
syclexp::include_files kernel_headers() {
  syclexp::include_files headers;
  for (size_t i = 0; i < gdn::num_kernel_files; ++i) {
    const std::string name = gdn::kernel_files[i].name;
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".cpp") != 0) headers.add(name, gdn::kernel_files[i].text);
  }
  return headers;
}

struct Entry {
  sycl::context context;
  sycl::device device;
  gdn::Family family;
  std::string options;
  sycl::kernel_bundle<sycl::bundle_state::executable> bundle;
  std::vector<std::pair<std::string, sycl::kernel>> kernels;  // looked up by name once

  sycl::kernel get(const char *name) {
    for (auto &k : kernels)
      if (k.first == name) return k.second;
    kernels.emplace_back(name, bundle.ext_oneapi_get_kernel(name));
    return kernels.back().second;
  }
};

// Never destroyed: at process exit the SYCL runtime may already be torn down, and destroying
// kernel bundles after it aborts the process. A handful of entries: linear search is enough.
std::mutex &cache_mutex = *new std::mutex;
std::vector<Entry> &cache = *new std::vector<Entry>;

bool verbose() {
  const char *v = std::getenv("GDN_XPU_VERBOSE");
  return v && v[0] && v[0] != '0';
}

// Where the runtime keeps kernel-compiler output when its persistent cache is on ("" if off).
std::string persistent_ir_dir() {
  const char *on = std::getenv("SYCL_CACHE_PERSISTENT");
  if (!on || on[0] != '1') return "";
  std::string root;
  if (const char *d = std::getenv("SYCL_CACHE_DIR"); d && *d) root = d;
  else if (const char *x = std::getenv("XDG_CACHE_HOME"); x && *x) root = std::string(x) + "/libsycl_cache";
  else if (const char *h = std::getenv("HOME"); h && *h) root = std::string(h) + "/.cache/libsycl_cache";
  return root.empty() ? "" : root + "/ext_kernel_compiler";
}

size_t count_entries(const std::string &dir) {
  std::error_code ec;
  size_t n = 0;
  if (dir.empty()) return 0;
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec))
    ++n;
  return n;
}

sycl::kernel_bundle<sycl::bundle_state::executable> compile(const sycl::queue &q, gdn::Family family,
                                                           const std::string &options) {
  sycl::device dev = q.get_device();
  if (!dev.ext_oneapi_can_build(syclexp::source_language::sycl))
    gdn::fail(GDN_ERROR_UNSUPPORTED, "device '" + dev.get_info<sycl::info::device::name>() +
                                         "' cannot build SYCL source at run time (sycl_ext_oneapi_kernel_compiler)");
  const auto t0 = std::chrono::steady_clock::now();
  if (verbose())
    std::fprintf(stderr, "libgdn_xpu: compiling %s [%s] for %s ...\n", family_name(family), options.c_str(),
                 dev.get_info<sycl::info::device::name>().c_str());
  std::string log;
  try {
    const syclexp::include_files headers = kernel_headers();
    std::vector<std::string> opts{"-O2"};
    if (dev.is_cpu()) {
      // Flush fp32 denormals on the CPU device. The gates make exp(g) and the decayed state
      // products land in the denormal range all the time (|g| of ~1..16 per token), and x86
      // handles denormal operands in microcode: on a Xeon the chunked prefill ran 2-4x slower,
      // data-dependently, without this. Values below 1.2e-38 carry no information at fp32
      // precision here. GPUs flush by default (and their compilers spell the option differently).
      opts.push_back("-Xs");
      opts.push_back("-cl-denorms-are-zero");
    }
    // Let the compiler fuse a * b + c into one FMA (rounded once: no less accurate). The SYCL
    // front end does not contract by default, and the CPU device then issues a multiply and an
    // add for every state update (recurrent ~8%, chunked prefill ~6% slower here).
    opts.push_back("-ffp-contract=fast");
    for (size_t pos = 0; pos < options.size();) {  // options: space-separated -D flags
      size_t end = options.find(' ', pos);
      if (end == std::string::npos) end = options.size();
      if (end > pos) opts.push_back(options.substr(pos, end - pos));
      pos = end + 1;
    }
    auto build = [&] {
      auto source = syclexp::create_kernel_bundle_from_source(q.get_context(), syclexp::source_language::sycl,
                                                              family_source(family), syclexp::properties{headers});
      return syclexp::build(source, std::vector<sycl::device>{dev},
                            syclexp::properties{syclexp::build_options{opts}, syclexp::save_log{&log}});
    };
    const std::string ir_dir = persistent_ir_dir();
    const size_t ir_entries = count_entries(ir_dir);
    auto bundle = build();
    if (!ir_dir.empty() && count_entries(ir_dir) > ir_entries) {
      // A cold compile. The 2026.1 runtime keys the cached device binary by the device image,
      // which differs between freshly compiled IR and IR read back from the cache, so the next
      // process would miss the binary cache. Building once more from the cached IR stores the
      // binary under the key later processes look up (~0.3 s, cold path only).
      bundle = build();
    }
    if (verbose())
      std::fprintf(stderr, "libgdn_xpu: compiled %s in %.2f s\n", family_name(family),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return bundle;
  } catch (const sycl::exception &e) {
    gdn::fail(GDN_ERROR_COMPILE, std::string("compiling kernel family '") + family_name(family) + "' [" + options +
                                     "] failed: " + e.what() + (log.empty() ? "" : "\n" + log));
  }
}

}  // namespace

sycl::kernel gdn::get_kernel(const sycl::queue &q, Family family, const std::string &options, const char *name) {
  const sycl::context ctx = q.get_context();
  const sycl::device dev = q.get_device();
  std::lock_guard<std::mutex> lock(cache_mutex);
  for (Entry &e : cache)
    if (e.family == family && e.options == options && e.device == dev && e.context == ctx) return e.get(name);
  // Compiling under the lock: two threads asking for the same family compile it once.
  cache.push_back(Entry{ctx, dev, family, options, compile(q, family, options), {}});
  return cache.back().get(name);
}

void gdn::release_kernel_cache() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  cache.clear();
}
