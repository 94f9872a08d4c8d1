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
// Deletes, in dir, the temporary files of writes that never finished (a crash between create and
// rename) older than temporary_age_s, and entries not written or used (touch) for entry_age_s:
// those of other library versions, runtimes or devices. Only files named as entries' temporaries,
// and files named and starting as entries, are removed (dir may be shared with other files). Best
// effort: errors are ignored.
void tidy(const std::string &dir, long temporary_age_s, long entry_age_s);
// Marks an entry as used now (its modification time): tidy() keeps it. Best effort.
void touch(const std::string &path);

}  // namespace gdn::disk_cache::cache_file
