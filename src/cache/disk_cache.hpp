// disk_cache.hpp — the library's own disk cache of compiled kernel binaries.
//
// The library never touches the SYCL runtime's configuration (no SYCL_CACHE_* or any other
// environment change): it keeps the device binaries itself, one file per build, named by the
// SHA-256 of everything the binary depends on (see key_text()). Location: GDN_XPU_CACHE_DIR, else
// $XDG_CACHE_HOME/libgdn_xpu, else $HOME/.cache/libgdn_xpu, else <tmp>/libgdn_xpu-<uid> (with a
// warning). GDN_XPU_DISK_CACHE=0 turns it off. A failure to read, parse, check or load an entry
// is a miss (one warning naming the file); the caller compiles and store() replaces the entry
// atomically (temporary file + rename). A failure to write is a warning, never an error. A store
// also tidies the folder (cache_file::tidy: crashed writes' temporaries, entries unused for 30
// days); a load marks its entry used.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <sycl/sycl.hpp>

#include "device_binary.hpp"

namespace gdn::disk_cache {

// What a build consists of, for key_text(): named parts (source texts, include files, options).
struct BuildInputs {
  std::vector<std::pair<std::string, std::string>> parts;
  void add(std::string name, std::string value) { parts.emplace_back(std::move(name), std::move(value)); }
};

// The text whose SHA-256 names the entry: the inputs (texts hashed), the device, its driver and
// backend, the SYCL runtime, the library version and the file format.
std::string key_text(const sycl::device &dev, const BuildInputs &inputs);

// The kernels stored under key for dev, or nullptr (cache off, backend unsupported, no entry, or an
// entry that could not be used: then one warning names the file). label names the entry file
// (e.g. the kernel family) for people looking at the folder; *path gets the file's path.
std::unique_ptr<device_binary::Program> load(const sycl::context &ctx, const sycl::device &dev,
                                             const std::string &key, const std::string &label, std::string *path);

// Keeps bundle's binary under key. Best effort: warns (once per process) when it cannot.
// Returns the path written, or "" if nothing was written.
std::string store(const sycl::kernel_bundle<sycl::bundle_state::executable> &bundle, const sycl::device &dev,
                  const std::string &key, const std::string &label);

}  // namespace gdn::disk_cache
