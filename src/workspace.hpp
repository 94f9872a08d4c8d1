// workspace.hpp — device scratch memory of a call: the caller's (tensors->workspace), or a buffer
// the library keeps per queue and grows on demand.
#pragma once
#include <cstddef>
#include <memory>
#include <mutex>
#include <sycl/sycl.hpp>

#include "gdn_xpu.h"

namespace gdn {

// The scratch memory of one call: ptr is the first GDN_SCRATCH_ALIGN boundary of a region of
// `bytes` (a plan's layout.total, which includes that much slack). With the library's
// buffer the returned lock is held: concurrent callers of one queue do not resize it under each
// other while they enqueue (on an in-order queue the next call's kernels run after this call's),
// and `owner` keeps the buffer alive through a concurrent gdn_release_caches(). Declared before
// `lock`, so it is destroyed after the lock is released.
struct Scratch {
  char *ptr = nullptr;
  std::shared_ptr<void> owner;
  std::unique_lock<std::mutex> lock;
};
// recording: the queue records the call into a graph (gdn_xpu.h "Graphs"): the buffer it gets is
// then kept at its address until release_workspaces(), and growing it waits for nothing.
Scratch acquire_workspace(const sycl::queue &q, const gdn_tensors_t &t, size_t bytes, bool recording);

// Drops the library's buffers (gdn_release_caches); a buffer a call is using is freed when that
// call ends.
void release_workspaces();

}  // namespace gdn
