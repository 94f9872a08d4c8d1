// device_binary.cpp — see device_binary.hpp. OpenCL only; every failure is a std::runtime_error
// the disk cache turns into "compile from source instead".
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>  // types and constants only: the functions are looked up at run time
#include <dlfcn.h>

#include "device_binary.hpp"

#include <stdexcept>

namespace gdn::device_binary {
namespace {

// The few OpenCL entry points used here, from the ICD loader the runtime's OpenCL adapter loaded.
struct OpenCl {
  decltype(&::clGetProgramInfo) GetProgramInfo = nullptr;
  decltype(&::clGetProgramBuildInfo) GetProgramBuildInfo = nullptr;
  decltype(&::clCreateProgramWithBinary) CreateProgramWithBinary = nullptr;
  decltype(&::clBuildProgram) BuildProgram = nullptr;
  decltype(&::clCreateKernel) CreateKernel = nullptr;
  decltype(&::clReleaseKernel) ReleaseKernel = nullptr;
  decltype(&::clReleaseProgram) ReleaseProgram = nullptr;
  decltype(&::clReleaseContext) ReleaseContext = nullptr;
  decltype(&::clReleaseDevice) ReleaseDevice = nullptr;
  bool ok = false;
};

const OpenCl &opencl() {
  static const OpenCl api = [] {
    OpenCl a;
    // Already loaded whenever an OpenCL device is in use; RTLD_NOLOAD takes that copy.
    void *h = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h) h = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return a;
    bool all = true;
    auto get = [&](auto &fn, const char *name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      all = all && fn;
    };
    get(a.GetProgramInfo, "clGetProgramInfo");
    get(a.GetProgramBuildInfo, "clGetProgramBuildInfo");
    get(a.CreateProgramWithBinary, "clCreateProgramWithBinary");
    get(a.BuildProgram, "clBuildProgram");
    get(a.CreateKernel, "clCreateKernel");
    get(a.ReleaseKernel, "clReleaseKernel");
    get(a.ReleaseProgram, "clReleaseProgram");
    get(a.ReleaseContext, "clReleaseContext");
    get(a.ReleaseDevice, "clReleaseDevice");
    a.ok = all;
    return a;
  }();
  return api;
}

const OpenCl &api_or_throw() {
  const OpenCl &cl = opencl();
  if (!cl.ok) throw std::runtime_error("OpenCL entry points not found in libOpenCL.so.1");
  return cl;
}

void check(cl_int err, const char *what) {
  if (err != CL_SUCCESS) throw std::runtime_error(std::string(what) + " failed (OpenCL error " + std::to_string(err) + ")");
}

// get_native hands out retained OpenCL objects: these give them back.
struct NativeContext {
  cl_context c;
  explicit NativeContext(const sycl::context &ctx) : c(sycl::get_native<sycl::backend::opencl>(ctx)) {}
  ~NativeContext() { opencl().ReleaseContext(c); }
};
struct NativeDevice {
  cl_device_id d;
  explicit NativeDevice(const sycl::device &dev) : d(sycl::get_native<sycl::backend::opencl>(dev)) {}
  ~NativeDevice() { opencl().ReleaseDevice(d); }
};

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos <= s.size();) {
    size_t end = s.find(sep, pos);
    if (end == std::string::npos) end = s.size();
    if (end > pos) out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

class OpenClProgram : public Program {
 public:
  // Takes p (released on failure too) and makes every kernel the image lists now: a binary that
  // builds but cannot give its kernels is then a miss of disk_cache::load (a warning, a recompile
  // and a replaced entry), not a failed call later, in this process and every next one.
  OpenClProgram(cl_program p, const sycl::context &ctx, const std::vector<std::pair<std::string, std::string>> &names)
      : program_(p) {
    try {
      const OpenCl &cl = api_or_throw();
      if (names.empty()) throw std::runtime_error("no kernels listed");
      for (const auto &n : names) {
        cl_int err = CL_SUCCESS;
        cl_kernel k = cl.CreateKernel(program_, n.second.c_str(), &err);
        check(err, ("clCreateKernel(" + n.second + ")").c_str());
        try {
          kernels_.emplace_back(n.first, sycl::make_kernel<sycl::backend::opencl>(k, ctx));  // retains k
        } catch (...) {
          cl.ReleaseKernel(k);
          throw;
        }
        cl.ReleaseKernel(k);
      }
    } catch (...) {
      opencl().ReleaseProgram(program_);
      throw;
    }
  }
  ~OpenClProgram() override { opencl().ReleaseProgram(program_); }

  sycl::kernel kernel(const std::string &name) override {
    for (const auto &k : kernels_)
      if (k.first == name) return k.second;
    throw std::runtime_error("no kernel named '" + name + "' in the cached binary");
  }

 private:
  cl_program program_;
  std::vector<std::pair<std::string, sycl::kernel>> kernels_;
};

}  // namespace

bool supported(const sycl::device &dev) {
  return dev.get_backend() == sycl::backend::opencl && opencl().ok;
}

Image extract(const sycl::kernel_bundle<sycl::bundle_state::executable> &bundle, const sycl::device &dev) {
  const OpenCl &cl = api_or_throw();
  if (dev.get_backend() != sycl::backend::opencl) throw std::runtime_error("not an OpenCL device");
  std::vector<cl_program> programs = sycl::get_native<sycl::backend::opencl>(bundle);  // retained for us
  struct Release {
    std::vector<cl_program> &p;
    ~Release() {
      for (cl_program x : p) opencl().ReleaseProgram(x);
    }
  } release{programs};
  if (programs.size() != 1) throw std::runtime_error(std::to_string(programs.size()) + " programs in the bundle");
  cl_program p = programs[0];
  NativeDevice want(dev);

  // The binary of our device (a program may be built for several).
  cl_uint ndev = 0;
  check(cl.GetProgramInfo(p, CL_PROGRAM_NUM_DEVICES, sizeof(ndev), &ndev, nullptr), "clGetProgramInfo");
  std::vector<cl_device_id> devs(ndev);
  check(cl.GetProgramInfo(p, CL_PROGRAM_DEVICES, ndev * sizeof(cl_device_id), devs.data(), nullptr),
        "clGetProgramInfo");
  size_t at = ndev;
  for (size_t i = 0; i < ndev; ++i)
    if (devs[i] == want.d) at = i;
  if (at == ndev) throw std::runtime_error("program not built for the device");
  std::vector<size_t> sizes(ndev);
  check(cl.GetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, ndev * sizeof(size_t), sizes.data(), nullptr),
        "clGetProgramInfo");
  if (sizes[at] == 0) throw std::runtime_error("empty program binary");
  Image img;
  img.binary.resize(sizes[at]);
  std::vector<unsigned char *> ptrs(ndev, nullptr);  // NULL entries: binaries of other devices are skipped
  ptrs[at] = img.binary.data();
  check(cl.GetProgramInfo(p, CL_PROGRAM_BINARIES, ndev * sizeof(unsigned char *), ptrs.data(), nullptr),
        "clGetProgramInfo");

  // Backend kernel names, each matched to the name the runtime knows it by: free-function kernels
  // are "__sycl_kernel_" + name today; asking the bundle keeps that convention out of the cache.
  size_t len = 0;
  check(cl.GetProgramInfo(p, CL_PROGRAM_KERNEL_NAMES, 0, nullptr, &len), "clGetProgramInfo");
  std::string names(len, '\0');
  check(cl.GetProgramInfo(p, CL_PROGRAM_KERNEL_NAMES, len, names.data(), nullptr), "clGetProgramInfo");
  names.resize(names.find('\0') == std::string::npos ? names.size() : names.find('\0'));
  const std::string prefix = "__sycl_kernel_";
  sycl::kernel_bundle<sycl::bundle_state::executable> b = bundle;  // the lookups are non-const
  for (const std::string &native : split(names, ';')) {
    const std::string ours = native.rfind(prefix, 0) == 0 ? native.substr(prefix.size()) : native;
    if (!b.ext_oneapi_has_kernel(ours) ||
        b.ext_oneapi_get_kernel(ours).get_info<sycl::info::kernel::function_name>() != native)
      throw std::runtime_error("cannot tell which kernel '" + native + "' is");
    img.kernels.emplace_back(ours, native);
  }
  if (img.kernels.empty()) throw std::runtime_error("no kernels in the program");
  return img;
}

std::unique_ptr<Program> load(const sycl::context &ctx, const sycl::device &dev, const Image &img) {
  const OpenCl &cl = api_or_throw();
  if (dev.get_backend() != sycl::backend::opencl) throw std::runtime_error("not an OpenCL device");
  NativeContext c(ctx);
  NativeDevice d(dev);
  const unsigned char *bin = img.binary.data();
  const size_t len = img.binary.size();
  cl_int status = CL_SUCCESS, err = CL_SUCCESS;
  cl_program p = cl.CreateProgramWithBinary(c.c, 1, &d.d, &len, &bin, &status, &err);
  if (err != CL_SUCCESS || status != CL_SUCCESS) {
    if (p) cl.ReleaseProgram(p);
    check(err != CL_SUCCESS ? err : status, "clCreateProgramWithBinary");
  }
  err = cl.BuildProgram(p, 1, &d.d, "", nullptr, nullptr);
  if (err != CL_SUCCESS) {
    std::string log(4096, '\0');
    size_t n = 0;
    cl.GetProgramBuildInfo(p, d.d, CL_PROGRAM_BUILD_LOG, log.size(), log.data(), &n);
    log.resize(n ? n - 1 : 0);
    cl.ReleaseProgram(p);
    throw std::runtime_error("clBuildProgram of the binary failed (OpenCL error " + std::to_string(err) + ")" +
                             (log.empty() ? "" : ": " + log));
  }
  return std::make_unique<OpenClProgram>(p, ctx, img.kernels);
}

}  // namespace gdn::device_binary
