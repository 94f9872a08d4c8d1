// queue.cpp — queue and USM helpers for C callers that cannot construct SYCL objects.
#include <cstring>
#include <string>

#include "errors.hpp"

extern "C" {

GDN_API gdn_status_t gdn_queue_create(const char *device, void **queue) {
  return gdn::guarded([&] {
    if (!queue) gdn::fail(GDN_ERROR_NULL_POINTER, "queue (output) is NULL");
    *queue = nullptr;
    const std::string which = device ? device : "default";
    const sycl::property_list in_order{sycl::property::queue::in_order()};
    sycl::queue *q = nullptr;
    if (which == "default") q = new sycl::queue(sycl::default_selector_v, in_order);
    else if (which == "cpu") q = new sycl::queue(sycl::cpu_selector_v, in_order);
    else if (which == "gpu") q = new sycl::queue(sycl::gpu_selector_v, in_order);
    else gdn::fail(GDN_ERROR_UNSUPPORTED, "device = '" + which + "': expected \"default\", \"cpu\" or \"gpu\"");
    *queue = q;
  });
}

GDN_API void gdn_queue_destroy(void *queue) { delete static_cast<sycl::queue *>(queue); }

GDN_API gdn_status_t gdn_queue_wait(void *queue) {
  return gdn::guarded([&] {
    if (!queue) gdn::fail(GDN_ERROR_BAD_QUEUE, "queue is NULL");
    static_cast<sycl::queue *>(queue)->wait_and_throw();
  });
}

GDN_API gdn_status_t gdn_malloc_shared(void *queue, size_t bytes, void **ptr) {
  return gdn::guarded([&] {
    if (!queue) gdn::fail(GDN_ERROR_BAD_QUEUE, "queue is NULL");
    if (!ptr) gdn::fail(GDN_ERROR_NULL_POINTER, "ptr (output) is NULL");
    *ptr = sycl::malloc_shared(bytes, *static_cast<sycl::queue *>(queue));
    if (!*ptr) gdn::fail(GDN_ERROR_OUT_OF_MEMORY, "malloc_shared of " + std::to_string(bytes) + " bytes failed");
  });
}

GDN_API void gdn_free(void *queue, void *ptr) {
  if (queue && ptr) sycl::free(ptr, *static_cast<sycl::queue *>(queue));
}

GDN_API gdn_status_t gdn_device_name(void *queue, char *buf, size_t len) {
  return gdn::guarded([&] {
    if (!queue) gdn::fail(GDN_ERROR_BAD_QUEUE, "queue is NULL");
    if (!buf || len == 0) gdn::fail(GDN_ERROR_NULL_POINTER, "buf is NULL or len is 0");
    const std::string name = static_cast<sycl::queue *>(queue)->get_device().get_info<sycl::info::device::name>();
    std::strncpy(buf, name.c_str(), len - 1);
    buf[len - 1] = '\0';
  });
}

}  // extern "C"
