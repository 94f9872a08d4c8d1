// queue.cpp — queue and USM helpers for C callers that cannot construct SYCL objects.
#include <cstdlib>
#include <cstring>
#include <string>

#include "errors.hpp"

namespace {

// A selector that matches nothing throws "No device of requested type available". From C the
// usual cause is the pip-installed OpenCL CPU runtime, which the OpenCL loader only finds through
// OCL_ICD_FILENAMES (pygdn sets it; a C program must), or a too narrow ONEAPI_DEVICE_SELECTOR.
template <class Selector>
sycl::queue *make_queue(const Selector &selector, const std::string &which) {
  try {
    return new sycl::queue(selector, sycl::property_list{sycl::property::queue::in_order()});
  } catch (const sycl::exception &e) {
    const char *icd = std::getenv("OCL_ICD_FILENAMES");
    const char *filter = std::getenv("ONEAPI_DEVICE_SELECTOR");
    gdn::fail(GDN_ERROR_DEVICE,
              "device = '" + which + "': no SYCL device found (" + e.what() + "). For the CPU device of the " +
                  "intel-opencl-rt wheel set OCL_ICD_FILENAMES=<prefix>/lib/libintelocl.so before the SYCL " +
                  "runtime starts (now " + (icd ? "'" + std::string(icd) + "'" : std::string("unset")) +
                  "); ONEAPI_DEVICE_SELECTOR filters the devices (now " +
                  (filter ? "'" + std::string(filter) + "'" : std::string("unset")) +
                  "; on the 2026.2 runtime 'opencl:*' finds nothing, use '*:cpu')");
  }
}

}  // namespace

extern "C" {

GDN_API gdn_status_t gdn_queue_create(const char *device, void **queue) {
  return gdn::guarded([&] {
    if (!queue) gdn::fail(GDN_ERROR_NULL_POINTER, "queue (output) is NULL");
    *queue = nullptr;
    const std::string which = device ? device : "default";
    sycl::queue *q = nullptr;
    if (which == "default") q = make_queue(sycl::default_selector_v, which);
    else if (which == "cpu") q = make_queue(sycl::cpu_selector_v, which);
    else if (which == "gpu") q = make_queue(sycl::gpu_selector_v, which);
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
