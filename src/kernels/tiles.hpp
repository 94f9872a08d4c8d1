// tiles.hpp — the sub-group tile products of the chunk kernels' matrix form (device code, the
// -DGDN_MX=1 builds of delta_chunk.cpp): C += A B with C a GDN_MX_M x GDN_MX_N tile of f32
// accumulators, A (GDN_MX_M x GDN_MX_K) and B (GDN_MX_K x GDN_MX_N) bf16 operands, one sub-group
// of GDN_MX_SG lanes per tile. The build options (plan.cpp, from src/matrix.cpp's decision) give
// the tile and pick one of two implementations of the one interface:
//   GDN_MX_JOINT=1  sycl_ext_oneapi_matrix joint_matrix: DPAS on Intel GPUs' XMX, AMX on the CPU
//                   device (its products are exact in f32; the sums' order is the engine's).
//   GDN_MX_JOINT=0  the same products on FMA units: lane l holds columns l, l + GDN_MX_SG, ... of C
//                   and B and a copy of A, C[i][j] += A[i][k] B[k][j] for k in order, one f32 FMA each.
// Operands are bf16 bit patterns (uint16_t, rounded by dtype.hpp's float_to_bf16: no
// sycl::ext::oneapi::bfloat16 arithmetic, which would pull in its device library) and the
// accumulators f32, in global (workspace) or local (SLM) memory, row-major at a stride in
// elements (IGC has no column-major bf16 load for dg2's SIMD8 tiles). Only fill, load, mad and store: no element of a joint_matrix is touched
// (which work-item holds which element is the implementation's), so the emulation, which reads
// and writes the same addresses with the same strides and layouts, checks the data movement of
// the joint_matrix build wherever it runs.
#pragma once
#include <stddef.h>
#include "dtype.hpp"

#if !defined(GDN_MX_M) || !defined(GDN_MX_N) || !defined(GDN_MX_K) || !defined(GDN_MX_SG) || !defined(GDN_MX_JOINT)
#error "the matrix form needs GDN_MX_M, GDN_MX_N, GDN_MX_K, GDN_MX_SG and GDN_MX_JOINT"
#endif
static_assert(GDN_MX_N % GDN_MX_SG == 0, "a lane holds whole columns of a tile");

enum { MX_GLOBAL = 0, MX_LOCAL = 1 };   // where an operand is

#if GDN_MX_JOINT
#include <sycl/ext/oneapi/matrix/matrix.hpp>
namespace mxj = sycl::ext::oneapi::experimental::matrix;
typedef sycl::ext::oneapi::bfloat16 mx_bf16;  // storage only: loaded from bit patterns, never converted here

template <int S, class T>
static inline auto mx_ptr(T *p) {
  constexpr auto space = S == MX_GLOBAL ? sycl::access::address_space::global_space : sycl::access::address_space::local_space;
  return sycl::address_space_cast<space, sycl::access::decorated::no>(p);
}

struct mx_acc {
  mxj::joint_matrix<sycl::sub_group, float, mxj::use::accumulator, GDN_MX_M, GDN_MX_N> m;
};
struct mx_a {
  mxj::joint_matrix<sycl::sub_group, mx_bf16, mxj::use::a, GDN_MX_M, GDN_MX_K, mxj::layout::row_major> m;
};
struct mx_b {
  mxj::joint_matrix<sycl::sub_group, mx_bf16, mxj::use::b, GDN_MX_K, GDN_MX_N, mxj::layout::row_major> m;
};

static inline void mx_fill(const sycl::sub_group &sg, mx_acc &c, float v) { mxj::joint_matrix_fill(sg, c.m, v); }
template <int S>
static inline void mx_load(const sycl::sub_group &sg, mx_a &a, const uint16_t *p, size_t stride) {
  mxj::joint_matrix_load(sg, a.m, mx_ptr<S>(reinterpret_cast<const mx_bf16 *>(p)), stride);
}
template <int S>
static inline void mx_load(const sycl::sub_group &sg, mx_b &b, const uint16_t *p, size_t stride) {
  mxj::joint_matrix_load(sg, b.m, mx_ptr<S>(reinterpret_cast<const mx_bf16 *>(p)), stride);
}
template <int S>
static inline void mx_load(const sycl::sub_group &sg, mx_acc &c, const float *p, size_t stride) {
  mxj::joint_matrix_load(sg, c.m, mx_ptr<S>(p), stride, mxj::layout::row_major);
}
static inline void mx_mad(const sycl::sub_group &sg, mx_acc &c, const mx_a &a, const mx_b &b) {
  mxj::joint_matrix_mad(sg, c.m, a.m, b.m, c.m);
}
template <int S>
static inline void mx_store(const sycl::sub_group &sg, const mx_acc &c, float *p, size_t stride) {
  mxj::joint_matrix_store(sg, c.m, mx_ptr<S>(p), stride, mxj::layout::row_major);
}

#else  // the emulation

#define MX_LANE_COLS (GDN_MX_N / GDN_MX_SG)
struct mx_acc {
  float c[GDN_MX_M][MX_LANE_COLS];  // c[i][n] = C[i][lane + GDN_MX_SG n]
};
struct mx_a {
  float a[GDN_MX_M][GDN_MX_K];      // all of A, in every lane
};
struct mx_b {
  float b[GDN_MX_K][MX_LANE_COLS];  // b[k][n] = B[k][lane + GDN_MX_SG n]
};
static inline int mx_col(const sycl::sub_group &sg, int n) { return (int)sg.get_local_linear_id() + GDN_MX_SG * n; }

static inline void mx_fill(const sycl::sub_group &, mx_acc &c, float v) {
  for (int i = 0; i < GDN_MX_M; ++i)
    for (int n = 0; n < MX_LANE_COLS; ++n) c.c[i][n] = v;
}
template <int S>
static inline void mx_load(const sycl::sub_group &, mx_a &a, const uint16_t *p, size_t stride) {
  for (int i = 0; i < GDN_MX_M; ++i)
    for (int k = 0; k < GDN_MX_K; ++k) a.a[i][k] = bf16_to_float(p[i * stride + k]);
}
template <int S>
static inline void mx_load(const sycl::sub_group &sg, mx_b &b, const uint16_t *p, size_t stride) {
  for (int k = 0; k < GDN_MX_K; ++k)
    for (int n = 0; n < MX_LANE_COLS; ++n) b.b[k][n] = bf16_to_float(p[k * stride + (size_t)mx_col(sg, n)]);
}
template <int S>
static inline void mx_load(const sycl::sub_group &sg, mx_acc &c, const float *p, size_t stride) {
  for (int i = 0; i < GDN_MX_M; ++i)
    for (int n = 0; n < MX_LANE_COLS; ++n) c.c[i][n] = p[i * stride + (size_t)mx_col(sg, n)];
}
static inline void mx_mad(const sycl::sub_group &, mx_acc &c, const mx_a &a, const mx_b &b) {
  for (int i = 0; i < GDN_MX_M; ++i)
    for (int n = 0; n < MX_LANE_COLS; ++n) {
      float s = c.c[i][n];
      for (int k = 0; k < GDN_MX_K; ++k) s = sycl::fma(a.a[i][k], b.b[k][n], s);
      c.c[i][n] = s;
    }
}
template <int S>
static inline void mx_store(const sycl::sub_group &sg, const mx_acc &c, float *p, size_t stride) {
  for (int i = 0; i < GDN_MX_M; ++i)
    for (int n = 0; n < MX_LANE_COLS; ++n) p[i * stride + (size_t)mx_col(sg, n)] = c.c[i][n];
}
#endif

// c += A B over the depth 0 .. depth-1 (rounded up to whole GDN_MX_K tiles: rows of B past the depth
// must hold zeros or finite values A multiplies by zeros): A's rows at a (stride lda) in SA, B's at b
// (stride ldb) in SB.
template <int SA, int SB>
static inline void mx_mad_depth(const sycl::sub_group &sg, mx_acc &c, const uint16_t *a, size_t lda, const uint16_t *b,
                                size_t ldb, int depth) {
  for (int k0 = 0; k0 < depth; k0 += GDN_MX_K) {
    mx_a ta;
    mx_b tb;
    mx_load<SA>(sg, ta, a + k0, lda);
    mx_load<SB>(sg, tb, b + (size_t)k0 * ldb, ldb);
    mx_mad(sg, c, ta, tb);
  }
}
