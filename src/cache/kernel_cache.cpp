// kernel_cache.cpp — compiles the embedded SYCL sources with sycl_ext_oneapi_kernel_compiler, or
// loads them from the library's disk cache (disk_cache.hpp).
#include "kernel_cache.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
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

// A family built for one (context, device, options): freshly compiled, or loaded from the disk cache.
struct Entry {
  sycl::context context;
  sycl::device device;
  gdn::Family family;
  std::string options;
  std::optional<sycl::kernel_bundle<sycl::bundle_state::executable>> bundle;
  std::unique_ptr<gdn::device_binary::Program> program;
  std::vector<std::pair<std::string, sycl::kernel>> kernels;  // looked up by name once

  sycl::kernel get(const char *name) {
    for (auto &k : kernels)
      if (k.first == name) return k.second;
    kernels.emplace_back(name, bundle ? bundle->ext_oneapi_get_kernel(name) : program->kernel(name));
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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Fills e.bundle (compiled now) or e.program (from the disk cache).
void compile(Entry &e) {
  sycl::device dev = e.device;  // (ext_oneapi_can_build is not const)
  const char *family = gdn::family_file(e.family).file;
  if (!dev.ext_oneapi_can_build(syclexp::source_language::sycl))
    gdn::fail(GDN_ERROR_UNSUPPORTED, "device '" + dev.get_info<sycl::info::device::name>() +
                                         "' cannot build SYCL source at run time (sycl_ext_oneapi_kernel_compiler)");
  const auto t0 = std::chrono::steady_clock::now();
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
  if (verbose()) std::fprintf(stderr, "libgdn_xpu: compiled %s in %.2f s\n", family, seconds_since(t0));
  const std::string stored = gdn::disk_cache::store(*e.bundle, dev, key, family);
  if (verbose() && !stored.empty()) std::fprintf(stderr, "libgdn_xpu: kept %s in %s\n", family, stored.c_str());
}

}  // namespace

sycl::kernel gdn::get_kernel(const sycl::queue &q, Family family, const std::string &options, const char *name) {
  const sycl::context ctx = q.get_context();
  const sycl::device dev = q.get_device();
  std::lock_guard<std::mutex> lock(cache_mutex);
  for (Entry &e : cache)
    if (e.family == family && e.options == options && e.device == dev && e.context == ctx) return e.get(name);
  // Compiling under the lock: two threads asking for the same family compile it once.
  Entry e{ctx, dev, family, options, std::nullopt, nullptr, {}};
  compile(e);
  cache.push_back(std::move(e));
  return cache.back().get(name);
}

void gdn::release_kernel_cache() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  cache.clear();
}
