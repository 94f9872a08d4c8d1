// disk_cache.cpp — see disk_cache.hpp.
//
// Entry file (little-endian):
//   "GDNKCACH" | u32 format | u32 0 | u64 payload bytes | SHA-256 of the payload (32 bytes) | payload
//   payload = str key text | u32 kernel count | (str name, str backend name) ... | u64 size + binary
//   str = u32 size + bytes
// A file is used only if every field checks out (size, format, checksum, key text equal to ours),
// so truncated, overwritten or foreign files are misses, never crashes or wrong kernels.
#include "disk_cache.hpp"

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <link.h>
#include <mutex>
#include <set>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "gdn_xpu.h"
#include "sha256.hpp"

namespace gdn::disk_cache {
namespace {

constexpr char kMagic[8] = {'G', 'D', 'N', 'K', 'C', 'A', 'C', 'H'};
constexpr uint32_t kFormat = 1;
constexpr size_t kHeader = 8 + 4 + 4 + 8 + 32;
constexpr uint64_t kMaxPayload = uint64_t(1) << 30;  // a kernel binary is megabytes; more is damage

#define GDN_STR2(x) #x
#define GDN_STR(x) GDN_STR2(x)
constexpr const char *kLibraryVersion =
    GDN_STR(GDN_VERSION_MAJOR) "." GDN_STR(GDN_VERSION_MINOR) "." GDN_STR(GDN_VERSION_PATCH);

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

// ---- file format ---------------------------------------------------------------------------

void put_u32(std::string &o, uint32_t v) {
  for (int i = 0; i < 4; ++i) o.push_back((char)(v >> (8 * i)));
}
void put_u64(std::string &o, uint64_t v) {
  for (int i = 0; i < 8; ++i) o.push_back((char)(v >> (8 * i)));
}
void put_str(std::string &o, const std::string &s) {
  put_u32(o, (uint32_t)s.size());
  o += s;
}

struct Reader {
  const std::string &b;
  size_t at;
  bool ok = true;
  uint64_t num(int bytes) {
    if (!ok || b.size() - at < (size_t)bytes) return ok = false, 0;
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= (uint64_t)(uint8_t)b[at + i] << (8 * i);
    at += bytes;
    return v;
  }
  std::string str(uint64_t n) {
    if (!ok || b.size() - at < n) return ok = false, std::string();
    std::string s = b.substr(at, n);
    at += n;
    return s;
  }
};

std::string serialize(const std::string &key, const device_binary::Image &img) {
  std::string payload;
  put_str(payload, key);
  put_u32(payload, (uint32_t)img.kernels.size());
  for (const auto &k : img.kernels) {
    put_str(payload, k.first);
    put_str(payload, k.second);
  }
  put_u64(payload, img.binary.size());
  payload.append(reinterpret_cast<const char *>(img.binary.data()), img.binary.size());
  std::string out(kMagic, sizeof kMagic);
  put_u32(out, kFormat);
  put_u32(out, 0);
  put_u64(out, payload.size());
  const auto sum = Sha256().update(payload).digest();
  out.append(reinterpret_cast<const char *>(sum.data()), sum.size());
  return out + payload;
}

// "" if file holds an entry for key (then *img is filled), else why not.
std::string parse(const std::string &file, const std::string &key, device_binary::Image *img) {
  if (file.size() < kHeader || std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) return "not a cache entry";
  Reader r{file, sizeof kMagic};
  const uint64_t format = r.num(4);
  r.num(4);
  const uint64_t size = r.num(8);
  if (format != kFormat) return "format " + std::to_string(format) + ", expected " + std::to_string(kFormat);
  if (size > kMaxPayload || file.size() != kHeader + size) return "truncated or overlong";
  const auto sum = Sha256().update(file.data() + kHeader, size).digest();
  if (std::memcmp(sum.data(), file.data() + kHeader - 32, 32) != 0) return "checksum mismatch";
  r.at = kHeader;
  if (r.str(r.num(4)) != key) return r.ok ? "built from different inputs" : "malformed";
  const uint64_t n = r.num(4);
  for (uint64_t i = 0; i < n && r.ok; ++i) {
    std::string ours = r.str(r.num(4));
    std::string native = r.str(r.num(4));
    img->kernels.emplace_back(std::move(ours), std::move(native));
  }
  const std::string bin = r.str(r.num(8));
  if (!r.ok || r.at != file.size()) return "malformed";
  img->binary.assign(bin.begin(), bin.end());
  return "";
}

std::string entry_path(const std::string &dir, const std::string &key, const std::string &label) {
  std::string safe;
  for (char ch : label) safe.push_back(std::isalnum((unsigned char)ch) || ch == '_' || ch == '-' ? ch : '_');
  return dir + "/" + (safe.empty() ? "" : safe + "-") + hex_sha256(key) + ".bin";
}

// Reads a whole file; "" in *err on success, ENOENT-style misses give "missing".
bool read_file(const std::string &path, std::string *out, std::string *err) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    // no entry, or no folder (a folder problem is reported when storing)
    *err = errno == ENOENT || errno == ENOTDIR ? "missing" : std::strerror(errno);
    return false;
  }
  struct stat st;
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size <= kMaxPayload + kHeader;
  if (!ok) *err = "not a regular file of a plausible size";
  if (ok) {
    out->resize((size_t)st.st_size);
    size_t got = 0;
    while (ok && got < out->size()) {
      const ssize_t n = ::read(fd, &(*out)[got], out->size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ok = false;
        *err = n < 0 ? std::strerror(errno) : "file shrank while reading";
      } else {
        got += (size_t)n;
      }
    }
  }
  ::close(fd);
  return ok;
}

// Writes data to path atomically: a private temporary file in the same folder, then rename().
// Readers see the old file or the new one, never a part. Concurrent writers of the same entry
// each rename a complete file; the last one stays. (No fsync: a file damaged by a crash is caught
// by the checksum and rewritten.)
bool write_atomic(const std::string &path, const std::string &data, std::string *err) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    *err = std::strerror(errno);
    return false;
  }
  size_t put = 0;
  bool ok = true;
  while (ok && put < data.size()) {
    const ssize_t n = ::write(fd, data.data() + put, data.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      *err = n < 0 ? std::strerror(errno) : "short write";
    } else {
      put += (size_t)n;
    }
  }
  if (::close(fd) != 0 && ok) {
    ok = false;
    *err = std::strerror(errno);
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    *err = std::strerror(errno);
  }
  if (!ok) ::unlink(tmp.c_str());
  return ok;
}

}  // namespace

std::string key_text(const sycl::device &dev, const BuildInputs &inputs) {
  std::string k = "libgdn_xpu kernel cache format " + std::to_string(kFormat) + ", library " + kLibraryVersion +
                  "\nsycl headers " GDN_STR(__LIBSYCL_MAJOR_VERSION) "." GDN_STR(__LIBSYCL_MINOR_VERSION) "." GDN_STR(
                      __LIBSYCL_PATCH_VERSION) ", compiler " GDN_STR(__SYCL_COMPILER_VERSION) "\nruntime " +
                  runtime_identity() + "\n" + device_identity(dev);
  for (const auto &p : inputs.parts) k += "\n" + p.first + " sha256 " + hex_sha256(p.second);
  return k;
}

std::unique_ptr<device_binary::Program> load(const sycl::context &ctx, const sycl::device &dev, const std::string &key,
                                             const std::string &label, std::string *path) {
  const Location &loc = location();
  if (loc.dir.empty() || !device_binary::supported(dev)) return nullptr;
  *path = entry_path(loc.dir, key, label);
  std::string file, err;
  if (!read_file(*path, &file, &err)) {
    if (err != "missing")
      warn_once(*path, "cannot read kernel cache entry " + *path + " (" + err + "); compiling again");
    return nullptr;
  }
  device_binary::Image img;
  if (std::string why = parse(file, key, &img); !why.empty()) {
    warn_once(*path, "ignoring kernel cache entry " + *path + " (" + why + "); compiling again and replacing it");
    return nullptr;
  }
  try {
    return device_binary::load(ctx, dev, img);
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
  if (!write_atomic(path, serialize(key, img), &err)) {
    warn_once("write", "cannot write to the kernel cache folder " + loc.dir + " (" + err +
                           "): compiled kernels are not kept on disk (GDN_XPU_CACHE_DIR chooses another)");
    return "";
  }
  return path;
}

}  // namespace gdn::disk_cache
