// disk_cache.cpp — see disk_cache.hpp.
//
#include "disk_cache.hpp"

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <initializer_list>
#include <link.h>
#include <mutex>
#include <set>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "gdn_xpu.h"
#include "cache_file.hpp"
#include "sha256.hpp"

namespace gdn::disk_cache {
namespace {

#define GDN_STR2(x) #x
#define GDN_STR(x) GDN_STR2(x)

// What a store removes (cache_file::tidy): a temporary entry file this old was left by a crash (a
// write takes milliseconds); an entry no process wrote or loaded for this long belongs to a
// library version, runtime or device no longer in use (a loaded entry is touched).
constexpr long kStaleTemporarySeconds = 3600;
constexpr long kUnusedEntrySeconds = 30L * 24 * 3600;

// One line on stderr per `what` per process.
void warn_once(const std::string &what, const std::string &message) {
  static std::mutex m;
  static std::set<std::string> *said = new std::set<std::string>;  // never destroyed (exit order)
  std::lock_guard<std::mutex> lock(m);
  if (!said->insert(what).second) return;
  std::fprintf(stderr, "libgdn_xpu: warning: %s\n", message.c_str());
}

std::string env(const char *name) {
  const char *v = std::getenv(name);
  return v ? v : "";
}

// ---- location ------------------------------------------------------------------------------

struct Location {
  std::string dir;  // "" = off
};

// mkdir -p with the last component private to the user.
bool make_dirs(const std::string &dir, std::string *err) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), pos == dir.size() ? 0700 : 0755) != 0 && errno != EEXIST) {
      *err = part + ": " + std::strerror(errno);
      return false;
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *err = dir + ": not a directory";
    return false;
  }
  return true;
}

Location resolve() {
  Location loc;
  const std::string off = env("GDN_XPU_DISK_CACHE");
  if (!off.empty() && off[0] == '0') return loc;
  if (std::string d = env("GDN_XPU_CACHE_DIR"); !d.empty()) {
    loc.dir = d;
  } else if (std::string x = env("XDG_CACHE_HOME"); !x.empty() && x[0] == '/') {  // relative: ignored (XDG spec)
    loc.dir = x + "/libgdn_xpu";
  } else if (std::string h = env("HOME"); !h.empty()) {
    loc.dir = h + "/.cache/libgdn_xpu";
  } else {
    // A shared temp folder: the entry folder must be ours and private, or someone else could
    // hand us binaries to run.
    std::string tmp = env("TMPDIR");
    if (tmp.empty() || tmp[0] != '/') tmp = "/tmp";
    const std::string dir = tmp + "/libgdn_xpu-" + std::to_string(::geteuid());
    struct stat st;
    if ((::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) || ::lstat(dir.c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
      warn_once("location", "HOME and XDG_CACHE_HOME are not set and " + dir +
                                " is not a private folder of this user: compiled kernels are not kept on disk "
                                "(set GDN_XPU_CACHE_DIR)");
      return loc;
    }
    warn_once("location", "HOME and XDG_CACHE_HOME are not set: keeping compiled kernels in " + dir +
                              " (set GDN_XPU_CACHE_DIR to choose)");
    loc.dir = dir;
  }
  while (loc.dir.size() > 1 && loc.dir.back() == '/') loc.dir.pop_back();
  // The binaries in the folder run in this process: a folder other users may write to (world-
  // writable, or group-writable and someone else's) is not used. (A missing one is made private.)
  struct stat st;
  if (::stat(loc.dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
      ((st.st_mode & S_IWOTH) || (st.st_uid != ::geteuid() && (st.st_mode & S_IWGRP)))) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", (unsigned)(st.st_mode & 0777));
    warn_once("location", "the kernel cache folder " + loc.dir + " is writable by other users (mode " + mode +
                              "): compiled kernels are neither loaded from it nor kept there, since its files "
                              "would run in this process (GDN_XPU_CACHE_DIR chooses another)");
    loc.dir.clear();
  }
  return loc;
}

const Location &location() {
  static const Location loc = resolve();  // the environment is read once, at first use
  return loc;
}

// ---- key -----------------------------------------------------------------------------------

std::string hex_sha256(const std::string &s) {
  auto d = Sha256().update(s).digest();
  return to_hex(d.data(), d.size());
}

std::string file_identity(const std::string &path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return path + " (missing)";
  return path + " " + std::to_string((long long)st.st_size) + " bytes, mtime " + std::to_string((long long)st.st_mtime);
}

// The SYCL runtime in this process: libsycl.so and its kernel compiler libsycl-jit.so beside it.
// Size and mtime change with any reinstall, which only costs one recompile.
std::string runtime_identity() {
  std::string sycl;
  dl_iterate_phdr(
      [](struct dl_phdr_info *info, size_t, void *out) {
        const char *name = info->dlpi_name ? info->dlpi_name : "";
        const char *base = std::strrchr(name, '/');
        base = base ? base + 1 : name;
        if (std::strncmp(base, "libsycl.so", 10) == 0) {
          *static_cast<std::string *>(out) = name;
          return 1;
        }
        return 0;
      },
      &sycl);
  if (sycl.empty()) return "libsycl not found";
  char real[4096];
  if (::realpath(sycl.c_str(), real)) sycl = real;
  const std::string dir = sycl.substr(0, sycl.rfind('/') + 1);
  return file_identity(sycl) + "; " + file_identity(dir + "libsycl-jit.so");
}

// The host CPU, for CPU devices: their binaries are compiled for its instruction set, and the
// device name alone ("AMD EPYC") does not say which.
std::string host_cpu() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d, max = __get_cpuid_max(0, nullptr);
  std::string s;
  auto leaf = [&](unsigned l, unsigned sub) {
    if (l > max) return;
    __cpuid_count(l, sub, a, b, c, d);
    if (l == 1) b = 0;  // APIC id of the core we happen to run on, CLFLUSH size, logical count
    char buf[80];
    std::snprintf(buf, sizeof buf, " %x.%x:%08x,%08x,%08x,%08x", l, sub, a, b, c, d);
    s += buf;
  };
  leaf(0, 0);  // vendor
  leaf(1, 0);  // family/model/stepping, SSE..AVX, FMA
  leaf(7, 0);  // AVX2, AVX-512 subsets, AMX
  leaf(7, 1);  // AVX-512 BF16, AVX-VNNI
  return "cpuid" + s;
#else
  return "host cpu unknown";
#endif
}

std::string device_identity(const sycl::device &dev) {
  const sycl::platform plat = dev.get_platform();
  std::string s = "backend " + std::to_string((int)dev.get_backend()) + " | platform " +
                  plat.get_info<sycl::info::platform::name>() + " | " + plat.get_info<sycl::info::platform::version>() +
                  "\ndevice " + dev.get_info<sycl::info::device::name>() + " | " +
                  dev.get_info<sycl::info::device::vendor>() + " | driver " +
                  dev.get_info<sycl::info::device::driver_version>() + " | " +
                  dev.get_info<sycl::info::device::version>();
  if (dev.is_cpu()) {
    s += "\nhost " + host_cpu();
    // The OpenCL CPU runtime's own ISA override.
    if (const char *arch = std::getenv("CL_CONFIG_CPU_TARGET_ARCH")) s += " CL_CONFIG_CPU_TARGET_ARCH=" + std::string(arch);
  }
  return s;
}

std::string entry_path(const std::string &dir, const std::string &key, const std::string &label) {
  std::string safe;
  for (char ch : label) safe.push_back(std::isalnum((unsigned char)ch) || ch == '_' || ch == '-' ? ch : '_');
  return dir + "/" + (safe.empty() ? "" : safe + "-") + hex_sha256(key) + ".bin";
}

}  // namespace

std::string key_text(const sycl::device &dev, const BuildInputs &inputs) {
  std::string k = "libgdn_xpu kernel cache format " + std::to_string(cache_file::kFormat) + ", library " + gdn_version() +
                  "\nsycl headers " GDN_STR(__LIBSYCL_MAJOR_VERSION) "." GDN_STR(__LIBSYCL_MINOR_VERSION) "." GDN_STR(
                      __LIBSYCL_PATCH_VERSION) ", compiler " GDN_STR(__SYCL_COMPILER_VERSION) "\nruntime " +
                  runtime_identity() + "\n" + device_identity(dev);
  // Build options the SYCL runtime takes from the environment and applies to every program it
  // builds, ours included: a binary built under them is not the one a process without them builds.
  for (const char *var : {"SYCL_PROGRAM_COMPILE_OPTIONS", "SYCL_PROGRAM_APPEND_COMPILE_OPTIONS",
                          "SYCL_PROGRAM_LINK_OPTIONS", "SYCL_PROGRAM_APPEND_LINK_OPTIONS"})
    if (const char *value = std::getenv(var)) k += "\n" + std::string(var) + "=" + value;
  for (const auto &p : inputs.parts) k += "\n" + p.first + " sha256 " + hex_sha256(p.second);
  return k;
}

std::unique_ptr<device_binary::Program> load(const sycl::context &ctx, const sycl::device &dev, const std::string &key,
                                             const std::string &label, std::string *path) {
  const Location &loc = location();
  if (loc.dir.empty() || !device_binary::supported(dev)) return nullptr;
  *path = entry_path(loc.dir, key, label);
  try {  // anything that goes wrong with an entry (std::bad_alloc of a huge file too) is a miss
    std::string file, err;
    if (!cache_file::read_file(*path, &file, &err)) {
      if (err != "missing")
        warn_once(*path, "cannot read kernel cache entry " + *path + " (" + err + "); compiling again");
      return nullptr;
    }
    device_binary::Image img;
    if (std::string why = cache_file::parse(file, key, &img); !why.empty()) {
      warn_once(*path, "ignoring kernel cache entry " + *path + " (" + why + "); compiling again and replacing it");
      return nullptr;
    }
    std::unique_ptr<device_binary::Program> program = device_binary::load(ctx, dev, img);
    cache_file::touch(*path);  // in use: tidy() keeps it
    return program;
  } catch (const std::exception &e) {
    warn_once(*path, "cannot load kernel cache entry " + *path + " (" + e.what() +
                         "); compiling again and replacing it");
    return nullptr;
  }
}

std::string store(const sycl::kernel_bundle<sycl::bundle_state::executable> &bundle, const sycl::device &dev,
                  const std::string &key, const std::string &label) {
  const Location &loc = location();
  if (loc.dir.empty() || !device_binary::supported(dev)) return "";
  device_binary::Image img;
  try {
    img = device_binary::extract(bundle, dev);
  } catch (const std::exception &e) {
    warn_once("extract", std::string("cannot take the compiled kernels out of the SYCL runtime (") + e.what() +
                             "): they are not kept on disk");
    return "";
  }
  std::string err;
  if (!make_dirs(loc.dir, &err)) {
    warn_once("write", "cannot create the kernel cache folder (" + err +
                           "): compiled kernels are not kept on disk (GDN_XPU_CACHE_DIR chooses another)");
    return "";
  }
  const std::string path = entry_path(loc.dir, key, label);
  if (!cache_file::write_atomic(path, cache_file::serialize(key, img), &err)) {
    warn_once("write", "cannot write to the kernel cache folder " + loc.dir + " (" + err +
                           "): compiled kernels are not kept on disk (GDN_XPU_CACHE_DIR chooses another)");
    return "";
  }
  cache_file::tidy(loc.dir, kStaleTemporarySeconds, kUnusedEntrySeconds);
  return path;
}

}  // namespace gdn::disk_cache
