// device_binary.hpp — the compiled device binary of a kernel bundle, taken out of the SYCL runtime
// and built back into kernels, through the backend's own API (for the library's disk cache).
//
// Implemented for the OpenCL backend (the CPU device): clGetProgramInfo(CL_PROGRAM_BINARIES) on
// the bundle's native cl_program, clCreateProgramWithBinary + clBuildProgram to load it,
// clCreateKernel + sycl::make_kernel<backend::opencl> for each kernel. The OpenCL functions are
// looked up in the libOpenCL.so.1 the SYCL runtime has already loaded (no link dependency).
// (The runtime's ext_oneapi_get_backend_content() gives SPIR-V on this backend, not the compiled
// code, so it would save only the front end.) Other backends (Level Zero: zeModuleGetNativeBinary
// / zeModuleCreate(ZE_MODULE_FORMAT_NATIVE)) are not implemented: supported() is false there.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <sycl/sycl.hpp>

namespace gdn::device_binary {

// A bundle's binary for one device, and which backend kernel implements each of our kernel names.
struct Image {
  std::vector<uint8_t> binary;
  std::vector<std::pair<std::string, std::string>> kernels;  // (name given to get_kernel, backend name)
};

// A loaded binary: kernels by the names the library asks for.
class Program {
 public:
  virtual ~Program() = default;
  virtual sycl::kernel kernel(const std::string &name) = 0;  // throws std::runtime_error if absent
};

// Whether this device's backend can hand out and take back compiled binaries.
bool supported(const sycl::device &dev);

// The compiled binary of an executable bundle built for dev. Throws std::runtime_error.
Image extract(const sycl::kernel_bundle<sycl::bundle_state::executable> &bundle, const sycl::device &dev);

// Builds img for (ctx, dev). Throws std::runtime_error with the backend's message.
std::unique_ptr<Program> load(const sycl::context &ctx, const sycl::device &dev, const Image &img);

}  // namespace gdn::device_binary
