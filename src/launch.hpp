// launch.hpp — enqueueing a plan's kernels: the compiled kernels of a call and the chain that
// submits them one after another (ops.cpp binds their parameters).
#pragma once
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <utility>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "plan.hpp"

namespace gdn {

// GDN_XPU_PROFILE=1: every kernel is waited for and its wall time printed, with the CPU time the
// process spent meanwhile (on the CPU device: the kernel's work on all its threads, which other
// processes sharing the cores do not inflate as they do the wall time; measurement only).
inline bool profiling() {
  static const bool on = [] {
    const char *v = std::getenv("GDN_XPU_PROFILE");
    return v && v[0] && v[0] != '0';
  }();
  return on;
}

// The process's CPU time (std::clock: all its threads on POSIX).
inline double process_cpu_ms() { return 1e3 * (double)std::clock() / CLOCKS_PER_SEC; }

// The kernels of a plan, compiled or looked up before anything is enqueued (a compile failure
// must not leave a half-done call).
struct Kernels {
  std::vector<std::pair<const Launch *, sycl::kernel>> all;
  Kernels(const sycl::queue &q, const std::vector<const Launch *> &launches) {
    std::vector<KernelRef> refs;
    for (const Launch *l : launches) refs.push_back({l->family, l->options, l->name});
    const std::vector<sycl::kernel> ks = get_kernels(q, refs);
    for (size_t i = 0; i < launches.size(); ++i) all.emplace_back(launches[i], ks[i]);
  }
  const sycl::kernel &of(const Launch &l) const {
    size_t i = 0;
    while (all[i].first != &l) ++i;
    return all[i].second;
  }
};

// The kernels of one call, enqueued one after another. On an in-order queue the queue itself
// orders them, so they are submitted without events: the runtime then creates, tracks and
// releases no event per kernel (each costs host time). On an out-of-order queue
// each kernel depends on the previous one's event, and the last event is waited for.
struct Chain {
  sycl::queue &q;
  const bool in_order;
  const bool profile;  // GDN_XPU_PROFILE, unless the queue records a graph (nothing runs, nothing can be waited for)
  sycl::event last;    // out-of-order queues (and GDN_XPU_PROFILE) only
  Chain(sycl::queue &queue, bool recording) : q(queue), in_order(queue.is_in_order()), profile(profiling() && !recording) {}
};

// Submits the launch's kernel with params after the chain's previous kernel.
template <class P>
void launch(Chain &ch, const Kernels &ks, const Launch &l, const P &params) {
  const sycl::kernel &k = ks.of(l);
  const auto t0 = std::chrono::steady_clock::now();
  if (ch.profile) ch.last.wait();
  auto submit = [&](sycl::handler &h) {
    if (!ch.in_order) h.depends_on(ch.last);
    h.set_args(params);
    if (l.dims == 1) h.parallel_for(sycl::nd_range<1>{l.global[0], l.local[0]}, k);
    else h.parallel_for(sycl::nd_range<2>{{l.global[0], l.global[1]}, {l.local[0], l.local[1]}}, k);
  };
  if (ch.in_order && !ch.profile) {
    sycl::ext::oneapi::experimental::submit(ch.q, submit);
    return;
  }
  const double cpu0 = profiling() ? process_cpu_ms() : 0.0;
  ch.last = ch.q.submit(submit);
  if (ch.profile) {
    ch.last.wait();
    std::fprintf(stderr, "libgdn_xpu: %-22s %9.3f ms  cpu %9.3f ms\n", l.name,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                 process_cpu_ms() - cpu0);
  }
}

}  // namespace gdn
