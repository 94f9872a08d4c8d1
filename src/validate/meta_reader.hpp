// meta_reader.hpp — host copies of a call's metadata arrays (metadata.cpp, replay.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>
#include <sycl/sycl.hpp>
#include "batch_arrays.hpp"

namespace gdn {

// Host copies of the caller's metadata arrays. Arrays in host-accessible USM (host, shared) or in
// system memory are read in place once the queue is idle: no command is enqueued. Device USM is
// copied by the queue into a per-thread staging buffer of that array kind, kept from call to call,
// never into a fresh vector: the OpenCL CPU runtime (intel-opencl-rt 2026.1) keeps ~106 bytes for every
// distinct pointer value a USM memcpy ever touched, for the life of the process, so reading into
// per-call vectors would grow the process by ~14 bytes per call (docs/design.md "Memory over many calls",
// tests/repro/usm_memcpy_growth.cpp).
class MetaReader {
 public:
  explicit MetaReader(sycl::queue &q) : q_(q) {}
  // Fills dst with n elements of src; `kind` names dst's staging buffer (one per array kind).
  template <class T>
  void read(std::vector<T> &dst, const T *src, int64_t n, int kind) {
    dst.resize((size_t)n);
    if (n <= 0 || !src) return;
    const size_t bytes = sizeof(T) * (size_t)n;
    const sycl::usm::alloc type = sycl::get_pointer_type(src, q_.get_context());
    // (unknown: system memory, which validation admits only where the host addresses it too)
    if (type == sycl::usm::alloc::host || type == sycl::usm::alloc::shared || type == sycl::usm::alloc::unknown) {
      direct_.push_back({dst.data(), src, bytes});
      return;
    }
    std::vector<char> &stage = staging()[kind];
    if (stage.size() < bytes) stage.resize(std::max(bytes, 2 * stage.size()));
    copies_.push_back(q_.memcpy(stage.data(), src, bytes));
    staged_.push_back({dst.data(), stage.data(), bytes});
  }
  // Waits for the copies (and, when an array is read in place, for all work on the queue).
  void finish() {
    for (auto &e : copies_) e.wait_and_throw();
    if (!direct_.empty()) q_.wait();
    for (const Copy &c : staged_) std::memcpy(c.dst, c.src, c.bytes);
    for (const Copy &c : direct_) std::memcpy(c.dst, c.src, c.bytes);
  }
  // Kinds: a BatchArray's index (batch_arrays.hpp), and replay_count's.
  static constexpr int kRingCountKind = kNumBatchArrays, kKinds = kNumBatchArrays + 1;

 private:
  struct Copy {
    void *dst;
    const void *src;
    size_t bytes;
  };
  static std::vector<char> *staging() {
    thread_local std::vector<char> buffers[kKinds];
    return buffers;
  }
  sycl::queue &q_;
  std::vector<sycl::event> copies_;
  std::vector<Copy> staged_, direct_;
};

}  // namespace gdn
