// sha256.hpp — SHA-256 (FIPS 180-4), for naming and checking disk-cache entries. No dependencies.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gdn {

class Sha256 {
 public:
  Sha256();
  Sha256 &update(const void *data, size_t bytes);
  Sha256 &update(const std::string &s) { return update(s.data(), s.size()); }
  std::array<uint8_t, 32> digest();  // finishes the hash; the object is spent afterwards

 private:
  void block(const uint8_t *p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

std::string to_hex(const uint8_t *p, size_t n);

}  // namespace gdn
