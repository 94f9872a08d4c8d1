// errors.hpp — how failures travel inside the library: throw gdn::Failure, and every C entry
// point converts it (or any SYCL / C++ exception) into a status + thread-local message.
#pragma once
#include <string>
#include <sycl/sycl.hpp>
#include "gdn_xpu.h"

namespace gdn {

struct Failure {
  gdn_status_t status;
  std::string message;
};

[[noreturn]] inline void fail(gdn_status_t status, std::string message) { throw Failure{status, std::move(message)}; }

void set_last_error(const std::string &message);

// Runs body(); maps every exception to a status and records its message for gdn_last_error().
template <class Body>
gdn_status_t guarded(Body &&body) noexcept {
  try {
    body();
    set_last_error("");
    return GDN_SUCCESS;
  } catch (const Failure &f) {
    set_last_error(f.message);
    return f.status;
  } catch (const sycl::exception &e) {
    set_last_error(std::string("SYCL runtime error: ") + e.what());
    return e.code() == sycl::errc::memory_allocation ? GDN_ERROR_OUT_OF_MEMORY : GDN_ERROR_DEVICE;
  } catch (const std::bad_alloc &) {
    set_last_error("host out of memory");
    return GDN_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception &e) {
    set_last_error(std::string("internal error: ") + e.what());
    return GDN_ERROR_INTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return GDN_ERROR_INTERNAL;
  }
}

}  // namespace gdn
