// cache_file.hpp — the disk cache's entry files (disk_cache.hpp): their format, and reading and
// writing them safely.
#pragma once
#include <cstdint>
#include <string>

#include "device_binary.hpp"

namespace gdn::disk_cache::cache_file {

constexpr uint32_t kFormat = 1;  // bump on any change of the layout below (it is part of the key)

// The file holding `img`, stored under `key`.
std::string serialize(const std::string &key, const device_binary::Image &img);
// "" if `file` holds an entry for `key` (then *img is filled), else why not.
std::string parse(const std::string &file, const std::string &key, device_binary::Image *img);

// Reads a whole file; false with *err = "missing" when there is none, or another reason.
bool read_file(const std::string &path, std::string *out, std::string *err);
// Writes data to path atomically (a private temporary file in the same folder, then rename()).
bool write_atomic(const std::string &path, const std::string &data, std::string *err);
// Deletes the temporary files of writes that never finished (a crash between create and rename)
// older than max_age_s. Best effort: errors are ignored.
void remove_stale_temporaries(const std::string &dir, long max_age_s);

}  // namespace gdn::disk_cache::cache_file
