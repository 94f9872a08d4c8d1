// common.hpp — what every kernel file includes (device code, compiled at run time): the kernel
// declarations, the work-item queries and the helpers by concern -- dtype.hpp (activation dtype,
// scalar conversions), vec16.hpp (the CPU variants' 16-lane vectors), state.hpp (the SSM state's
// dtype), activations.hpp, batch.hpp (token rows, block checkpoints).
#pragma once
// Only the SYCL headers the kernels use: <sycl/sycl.hpp> costs ~2 s of front end per build.
#include <sycl/ext/oneapi/free_function_queries.hpp>
#include <sycl/ext/oneapi/kernel_properties/properties.hpp>
#include <stdint.h>
#include "params.hpp"
#include "dtype.hpp"
#include "vec16.hpp"
#include "state.hpp"
#include "activations.hpp"
#include "batch.hpp"

namespace syclexp = sycl::ext::oneapi::experimental;
#define GDN_KERNEL(dims) extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<dims>))
// A kernel whose work-items cooperate through sub-group functions in sub-groups of GDN_SUB_GROUP lanes.
#define GDN_SUB_GROUP_KERNEL(dims) GDN_KERNEL(dims) SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<GDN_SUB_GROUP>))

static inline sycl::nd_item<1> item1() { return sycl::ext::oneapi::this_work_item::get_nd_item<1>(); }
static inline sycl::nd_item<2> item2() { return sycl::ext::oneapi::this_work_item::get_nd_item<2>(); }
