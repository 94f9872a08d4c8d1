// cache_file.cpp — see cache_file.hpp.
// Entry file (little-endian):
//   "GDNKCACH" | u32 format | u32 0 | u64 payload bytes | SHA-256 of the payload (32 bytes) | payload
//   payload = str key text | u32 kernel count | (str name, str backend name) ... | u64 size + binary
//   str = u32 size + bytes
// A file is used only if every field checks out (size, format, checksum, key text equal to ours),
// so truncated, overwritten or foreign files are misses, never crashes or wrong kernels.
#include "cache_file.hpp"

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sha256.hpp"

namespace gdn::disk_cache::cache_file {
namespace {

constexpr char kMagic[8] = {'G', 'D', 'N', 'K', 'C', 'A', 'C', 'H'};
constexpr size_t kHeader = 8 + 4 + 4 + 8 + 32;
constexpr uint64_t kMaxPayload = uint64_t(1) << 30;  // a kernel binary is megabytes; more is damage

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

}  // namespace

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

// Reads a whole file; "" in *err on success, ENOENT-style misses give "missing".
bool read_file(const std::string &path, std::string *out, std::string *err) {
  // O_NONBLOCK: a FIFO put at an entry's path must not block the call (a regular file reads as usual).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
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

namespace {

// Whether `name` is an entry file's name, "<label>-<64 hex digits>.bin" (disk_cache.cpp
// entry_path), or, with a suffix after ".bin", one of its temporary files.
bool entry_name(const std::string &name, bool temporary) {
  const size_t bin = name.find(".bin");
  if (bin == std::string::npos || bin < 64 || (bin + 4 == name.size()) == temporary) return false;
  if (temporary && name.compare(bin + 4, 5, ".tmp.") != 0) return false;
  for (size_t i = bin - 64; i < bin; ++i)
    if (!std::isxdigit((unsigned char)name[i])) return false;
  return bin == 64 || name[bin - 65] == '-';
}

// Whether the file starts as an entry does (a name alone could be someone else's file).
bool has_magic(const std::string &path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  char head[sizeof kMagic];
  const bool ok = ::read(fd, head, sizeof head) == (ssize_t)sizeof head && std::memcmp(head, kMagic, sizeof head) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

void tidy(const std::string &dir, long temporary_age_s, long entry_age_s) {
  DIR *d = ::opendir(dir.c_str());
  if (!d) return;
  const time_t now = ::time(nullptr);
  while (const dirent *e = ::readdir(d)) {
    const std::string name = e->d_name;
    const bool temporary = entry_name(name, true);
    if (!temporary && !entry_name(name, false)) continue;
    const std::string path = dir + "/" + name;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (now - st.st_mtime > (temporary ? temporary_age_s : entry_age_s) && (temporary || has_magic(path)))
      ::unlink(path.c_str());
  }
  ::closedir(d);
}

void touch(const std::string &path) { ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0); }

}  // namespace gdn::disk_cache::cache_file
