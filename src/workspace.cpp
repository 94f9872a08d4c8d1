// workspace.cpp — see workspace.hpp; and gdn_attention_workspace_size, the workspace a call's plan lays out.
#include "workspace.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "errors.hpp"
#include "kernels/params.hpp"
#include "plan.hpp"
#include "validate/validate.hpp"

namespace gdn {
namespace {

struct Workspace {
  sycl::queue q;
  std::mutex m;
  void *ptr = nullptr;
  size_t bytes = 0;
  // A graph recorded a call with ptr (gdn_xpu.h "Graphs"): its replays use that address, so a
  // larger buffer does not free it but retires it, until gdn_release_caches().
  bool recorded = false;
  std::vector<void *> retired;
  ~Workspace() {
    try {
      q.wait();
      if (ptr) sycl::free(ptr, q);
      for (void *p : retired) sycl::free(p, q);
    } catch (...) {}
  }
};
// Never destroyed at exit (see kernel_cache.cpp); gdn_release_caches() drops them. A call holds
// its queue's workspace by a shared_ptr: a gdn_release_caches() on another thread during the
// call only drops the list's reference, and the call's Scratch frees the buffer after its
// kernels (~Workspace waits for them).
std::mutex &workspaces_mutex = *new std::mutex;
std::vector<std::shared_ptr<Workspace>> &workspaces = *new std::vector<std::shared_ptr<Workspace>>;

std::shared_ptr<Workspace> workspace_for(const sycl::queue &q) {
  std::lock_guard<std::mutex> lock(workspaces_mutex);
  for (auto &w : workspaces)
    if (w->q == q) return w;
  workspaces.push_back(std::make_shared<Workspace>());
  workspaces.back()->q = q;
  return workspaces.back();
}

// recording: the call is recorded into a graph (no wait possible, its replays keep the address).
void grow(Workspace &w, size_t bytes, bool recording) {
  if (w.bytes < bytes) {
    if (w.ptr && (w.recorded || recording)) {
      w.retired.push_back(w.ptr);
    } else if (w.ptr) {
      w.q.wait();  // kernels of earlier calls may still use the old buffer
      sycl::free(w.ptr, w.q);
    }
    w.ptr = nullptr;
    w.bytes = 0;
    w.recorded = false;
    w.ptr = sycl::malloc_device(bytes, w.q);
    if (!w.ptr) fail(GDN_ERROR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(bytes) + " bytes of workspace");
    w.bytes = bytes;
  }
  if (recording) w.recorded = true;
}

}  // namespace

Scratch acquire_workspace(const sycl::queue &q, const gdn_tensors_t &t, size_t bytes, bool recording) {
  Scratch s;
  char *start;
  if (t.workspace) {
    if (t.workspace_bytes < bytes)
      fail(GDN_ERROR_OUT_OF_MEMORY, "tensors->workspace_bytes = " + std::to_string(t.workspace_bytes) + " < " +
                                        std::to_string(bytes) + " needed by this batch");
    start = static_cast<char *>(t.workspace);
  } else {
    std::shared_ptr<Workspace> w = workspace_for(q);
    s.owner = w;  // first: if grow() throws, s unlocks before the workspace can go
    s.lock = std::unique_lock<std::mutex>(w->m);
    grow(*w, bytes, recording);
    start = static_cast<char *>(w->ptr);
  }
  s.ptr = start + (-reinterpret_cast<uintptr_t>(start) & (GDN_SCRATCH_ALIGN - 1));  // within the slack
  return s;
}

void release_workspaces() {
  std::vector<std::shared_ptr<Workspace>> dropped;
  {
    std::lock_guard<std::mutex> lock(workspaces_mutex);
    dropped.swap(workspaces);
  }
  // Freed here unless a call on another thread still holds one (then at the end of that call).
}

}  // namespace gdn

extern "C" {

// The plan of a gdn_attention call without conv_out: its workspace on any target. The layout does
// not depend on the kernel variants, only on the chunk kernels' form, which prefill_precision AUTO
// picks by the device: the larger of the two forms' layouts (a device with XMX and one without).
GDN_API gdn_status_t gdn_attention_workspace_size(const gdn_config_t *cfg, const gdn_batch_t *batch, size_t *bytes) {
  return gdn::guarded([&] {
    if (!bytes) gdn::fail(GDN_ERROR_NULL_POINTER, "bytes is NULL");
    const gdn_config_t c = gdn::validate_config(cfg);
    const gdn_batch_t b = gdn::validate_batch_counts(batch);
    const gdn::PlanInputs in{gdn::Op::Attention, false, false};
    gdn::Target xmx;
    xmx.matrix.engine = gdn::MatrixEngine::Xmx;
    xmx.matrix.tile = gdn::emulation_tile();
    *bytes = std::max(gdn::make_plan(c, b, in, gdn::Target{}).layout.total, gdn::make_plan(c, b, in, xmx).layout.total);
  });
}

}  // extern "C"
