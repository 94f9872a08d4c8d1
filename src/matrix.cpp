// matrix.cpp — see matrix.hpp.
#include "matrix.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "kernels/params.hpp"

namespace gdn {

namespace {

MatrixDecision none(std::string why) {
  MatrixDecision d;
  d.why = std::move(why);
  return d;
}

MatrixDecision engine(MatrixEngine e, int32_t m, int32_t n, int32_t k, int32_t sg) {
  MatrixDecision d;
  d.engine = e;
  d.tile = MatrixTile{m, n, k, sg};
  return d;
}

}  // namespace

bool jit_target_has_amx(const std::string &target) {
  std::string t;
  for (char c : target) t.push_back((char)std::tolower((unsigned char)c));
  for (const char *amx : {"sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d", "diamondrapids"})
    if (t == amx) return true;
  return false;
}

MatrixDecision decide_matrix(const MatrixFacts &f) {
  auto sub_group = [&](size_t s) { return std::find(f.sub_groups.begin(), f.sub_groups.end(), s) != f.sub_groups.end(); };
  if (f.device == DeviceKind::Gpu) {
    // XMX: fixed N and K, M up to a bound (Intel GPUs report 8 x 16 x 16; dg2 and arl 8 x 8 x 16),
    // a sub-group of N lanes per tile. The kernels take 8 rows a tile.
    for (const MatrixCombination &c : f.bf16)
      if (c.m == 0 && c.max_m >= 8 && (c.n == 8 || c.n == 16) && c.k == 16 && sub_group(c.n))
        return engine(MatrixEngine::Xmx, 8, (int32_t)c.n, 16, (int32_t)c.n);
    return none("the GPU reports no bf16 x bf16 -> f32 tile of up to 8 rows by 8 or 16 columns, depth 16, at a "
                "sub-group size it supports");
  }
  if (f.device == DeviceKind::Cpu) {
    if (!f.aspect) return none("the CPU device does not report sycl::aspect::ext_intel_matrix");
    if (!f.amx_tile || !f.amx_bf16) return none("the host CPU has no AMX-TILE and AMX-BF16 (CPUID)");
    if (!f.xcr0_tile) return none("the OS does not enable AMX's tile state (XCR0 bits 17 and 18)");
    if (!jit_target_has_amx(f.jit_target))
      return none(f.jit_target.empty()
                      ? "CL_CONFIG_CPU_TARGET_ARCH is unset: the CPU runtime's JIT at its own target can abort the "
                        "process on a joint_matrix kernel (docs/usage.md, \"AMX on the CPU device\")"
                      : "CL_CONFIG_CPU_TARGET_ARCH=" + f.jit_target + " names no CPU with AMX");
    // AMX: bounds only (16 x 16 x 32 for bf16); the kernels take 8 x 16 x 16 in sub-groups of 16.
    for (const MatrixCombination &c : f.bf16)
      if (c.m == 0 && c.max_m >= 8 && c.max_n >= 16 && c.max_k >= 16 && sub_group(16))
        return engine(MatrixEngine::Amx, 8, 16, 16, 16);
    return none("the CPU device reports no bf16 x bf16 -> f32 tile of 8 x 16 x 16 or more with sub-groups of 16");
  }
  return none("the device is neither a GPU nor the CPU device of Level Zero or OpenCL");
}

void host_cpu_facts(MatrixFacts &f) {
  struct Cpu {
    bool amx_tile = false, amx_bf16 = false, xcr0_tile = false;
  };
  static const Cpu cpu = [] {  // (CPUID exits to the hypervisor in a VM: asked once)
    Cpu c;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, cx = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &cx, &d)) {
      c.amx_bf16 = (d >> 22) & 1u;
      c.amx_tile = (d >> 24) & 1u;
    }
    if (__get_cpuid(1, &a, &b, &cx, &d) && ((cx >> 27) & 1u)) {  // OSXSAVE: xgetbv is there
      unsigned lo = 0, hi = 0;
      __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
      c.xcr0_tile = ((lo >> 17) & 3u) == 3u;
    }
#endif
    return c;
  }();
  f.amx_tile = cpu.amx_tile, f.amx_bf16 = cpu.amx_bf16, f.xcr0_tile = cpu.xcr0_tile;
  const char *target = std::getenv("CL_CONFIG_CPU_TARGET_ARCH");
  f.jit_target = target ? target : "";
}

MatrixTile emulation_tile() { return MatrixTile{GDN_MX_EMU_M, GDN_MX_EMU_N, GDN_MX_EMU_K, GDN_MX_EMU_SG}; }

}  // namespace gdn
