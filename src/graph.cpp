// graph.cpp — recording the work submitted to a queue into a SYCL command graph and replaying it
// (sycl_ext_oneapi_graph), for callers without SYCL objects of their own: C programs, Python with
// dpctl (gdn_xpu.h "Graphs").
#include <optional>
#include <string>

#include "errors.hpp"
#include "validate/validate.hpp"

namespace syclexp = sycl::ext::oneapi::experimental;

struct gdn_graph {
  sycl::queue q;  // the recording queue
  syclexp::command_graph<syclexp::graph_state::modifiable> graph;
  mutable std::optional<syclexp::command_graph<syclexp::graph_state::executable>> exec;  // after gdn_graph_end
  bool recording = false;
};

namespace {

sycl::queue &in_order_queue(void *queue, const char *what) {
  if (!queue) gdn::fail(GDN_ERROR_BAD_QUEUE, "queue is NULL");
  sycl::queue &q = *static_cast<sycl::queue *>(queue);
  if (!q.is_in_order()) gdn::fail(GDN_ERROR_UNSUPPORTED, std::string("queue is out of order: ") + what + " needs an in-order queue");
  return q;
}

}  // namespace

extern "C" {

GDN_API gdn_status_t gdn_graph_begin(void *queue, gdn_graph_t **graph) {
  return gdn::guarded([&] {
    if (!graph) gdn::fail(GDN_ERROR_NULL_POINTER, "graph (output) is NULL");
    *graph = nullptr;
    sycl::queue &q = in_order_queue(queue, "gdn_graph_begin");
    const sycl::device d = q.get_device();
    if (!d.has(sycl::aspect::ext_oneapi_graph) && !d.has(sycl::aspect::ext_oneapi_limited_graph))
      gdn::fail(GDN_ERROR_UNSUPPORTED, "the queue's device (" + d.get_info<sycl::info::device::name>() +
                                           ") cannot record graphs (neither sycl::aspect::ext_oneapi_graph nor "
                                           "ext_oneapi_limited_graph)");
    if (gdn::recording(q)) gdn::fail(GDN_ERROR_UNSUPPORTED, "the queue is recording a graph already");
    gdn_graph *g = new gdn_graph{q, syclexp::command_graph<syclexp::graph_state::modifiable>(q.get_context(), d), {}, false};
    try {
      g->graph.begin_recording(g->q);
    } catch (...) {
      delete g;
      throw;
    }
    g->recording = true;
    *graph = g;
  });
}

GDN_API gdn_status_t gdn_graph_end(gdn_graph_t *graph) {
  return gdn::guarded([&] {
    if (!graph) gdn::fail(GDN_ERROR_NULL_POINTER, "graph is NULL");
    if (!graph->recording) gdn::fail(GDN_ERROR_UNSUPPORTED, "graph is not recording (gdn_graph_end was called already)");
    graph->graph.end_recording(graph->q);
    graph->recording = false;
    graph->exec.emplace(graph->graph.finalize());
  });
}

GDN_API gdn_status_t gdn_graph_replay(void *queue, const gdn_graph_t *graph) {
  return gdn::guarded([&] {
    if (!graph) gdn::fail(GDN_ERROR_NULL_POINTER, "graph is NULL");
    sycl::queue &q = in_order_queue(queue, "gdn_graph_replay");
    if (!graph->exec) gdn::fail(GDN_ERROR_UNSUPPORTED, "graph is still recording: call gdn_graph_end first");
    if (q.get_context() != graph->q.get_context() || q.get_device() != graph->q.get_device())
      gdn::fail(GDN_ERROR_BAD_QUEUE, "queue is not of the context and device the graph was recorded on");
    syclexp::execute_graph(q, *graph->exec);
  });
}

GDN_API void gdn_graph_destroy(gdn_graph_t *graph) {
  if (!graph) return;
  if (graph->recording) {
    try {
      graph->graph.end_recording(graph->q);
    } catch (...) {
    }
  }
  delete graph;
}

GDN_API int32_t gdn_queue_recording(void *queue) {
  try {
    return queue && gdn::recording(*static_cast<sycl::queue *>(queue)) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

}  // extern "C"
