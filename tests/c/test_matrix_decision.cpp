// The matrix-engine decision (src/matrix.cpp) on hosts and devices given by hand: whether the
// chunked prefill's products may use joint_matrix, and with which tile. Built against
// src/matrix.cpp alone (no SYCL): tests/test_prefill_precision.py compiles and runs it, meson test
// too. Prints one line per case; exits 1 on the first wrong decision.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "matrix.hpp"

using gdn::DeviceKind;
using gdn::MatrixEngine;
using gdn::MatrixFacts;

namespace {

int failures = 0;

void expect(const char *name, const MatrixFacts &f, MatrixEngine engine, int m = 0, int n = 0, int k = 0, int sg = 0,
            const char *why = nullptr) {
  const gdn::MatrixDecision d = gdn::decide_matrix(f);
  bool ok = d.engine == engine;
  if (engine != MatrixEngine::None)
    ok = ok && d.tile.m == m && d.tile.n == n && d.tile.k == k && d.tile.sub_group == sg && d.why.empty();
  else
    ok = ok && !d.why.empty() && (!why || d.why.find(why) != std::string::npos);
  std::printf("%s %s: engine %d tile %dx%dx%d/%d%s%s\n", ok ? "ok  " : "FAIL", name, (int)d.engine, d.tile.m, d.tile.n,
              d.tile.k, d.tile.sub_group, d.why.empty() ? "" : " -- ", d.why.c_str());
  if (!ok) ++failures;
}

// What the 2026 runtime reports (sycl/source/detail/device_impl.hpp, get_matrix_combinations).
MatrixFacts xe2_gpu() {  // pvc, bmg, lnl-m: bf16 8 x 16 x 16 (and fixed larger shapes), sub-groups 16 and 32
  MatrixFacts f;
  f.device = DeviceKind::Gpu;
  f.aspect = true;
  f.bf16 = {{8, 0, 0, 0, 16, 16}, {0, 0, 0, 16, 16, 16}, {0, 0, 0, 1, 64, 16}, {0, 0, 0, 32, 64, 16}};
  f.sub_groups = {16, 32};
  return f;
}
MatrixFacts dg2_gpu() {  // dg2, arl: bf16 8 x 8 x 16, sub-groups 8, 16 and 32
  MatrixFacts f;
  f.device = DeviceKind::Gpu;
  f.aspect = true;
  f.bf16 = {{8, 0, 0, 0, 8, 16}, {0, 0, 0, 32, 32, 16}};
  f.sub_groups = {8, 16, 32};
  return f;
}
MatrixFacts amx_cpu() {  // a Sapphire Rapids host whose JIT targets it: every fact present
  MatrixFacts f;
  f.device = DeviceKind::Cpu;
  f.aspect = true;
  f.bf16 = {{16, 16, 32, 0, 0, 0}};
  f.sub_groups = {4, 8, 16, 32, 64};
  f.amx_tile = f.amx_bf16 = f.xcr0_tile = true;
  f.jit_target = "sapphirerapids";
  return f;
}

}  // namespace

int main() {
  expect("xe2 gpu", xe2_gpu(), MatrixEngine::Xmx, 8, 16, 16, 16);
  expect("dg2 gpu", dg2_gpu(), MatrixEngine::Xmx, 8, 8, 16, 8);
  MatrixFacts f = dg2_gpu();
  f.sub_groups = {16, 32};
  expect("gpu without the tile's sub-group size", f, MatrixEngine::None, 0, 0, 0, 0, "sub-group");
  f = xe2_gpu();
  f.bf16.clear();
  expect("gpu reporting no bf16 combination (tgllp)", f, MatrixEngine::None);
  f = xe2_gpu();
  f.device = DeviceKind::Other;
  expect("a device of another backend", f, MatrixEngine::None, 0, 0, 0, 0, "neither");

  expect("amx cpu, jit target sapphirerapids", amx_cpu(), MatrixEngine::Amx, 8, 16, 16, 16);
  f = amx_cpu();
  f.jit_target = "GraniteRapids";
  expect("amx cpu, jit target graniterapids (any case)", f, MatrixEngine::Amx, 8, 16, 16, 16);
  f = amx_cpu();
  f.jit_target = "";
  expect("the device reports the aspect, the jit target is unset", f, MatrixEngine::None, 0, 0, 0, 0,
         "CL_CONFIG_CPU_TARGET_ARCH is unset");
  f = amx_cpu();
  f.jit_target = "auto";
  expect("the device reports the aspect, the jit target is auto", f, MatrixEngine::None, 0, 0, 0, 0, "names no CPU with AMX");
  f = amx_cpu();
  f.jit_target = "skx";
  expect("the device reports the aspect, the jit target has no amx", f, MatrixEngine::None, 0, 0, 0, 0, "names no CPU with AMX");
  f = amx_cpu();
  f.amx_tile = f.amx_bf16 = f.xcr0_tile = false;  // this Ice Lake host under CL_CONFIG_CPU_TARGET_ARCH=sapphirerapids
  expect("the jit target is amx, cpuid has none", f, MatrixEngine::None, 0, 0, 0, 0, "CPUID");
  f = amx_cpu();
  f.amx_bf16 = false;
  expect("amx-tile without amx-bf16", f, MatrixEngine::None, 0, 0, 0, 0, "CPUID");
  f = amx_cpu();
  f.xcr0_tile = false;
  expect("the os does not enable the tile state", f, MatrixEngine::None, 0, 0, 0, 0, "XCR0");
  f = amx_cpu();
  f.aspect = false;
  f.bf16.clear();
  expect("the device reports no aspect", f, MatrixEngine::None, 0, 0, 0, 0, "ext_intel_matrix");
  f = amx_cpu();
  f.bf16 = {{8, 8, 16, 0, 0, 0}};
  expect("cpu combinations smaller than the tile", f, MatrixEngine::None, 0, 0, 0, 0, "8 x 16 x 16");

  // The facts of the host this runs on (CPUID, XCR0, CL_CONFIG_CPU_TARGET_ARCH): printed for the log.
  MatrixFacts host = amx_cpu();
  gdn::host_cpu_facts(host);
  const gdn::MatrixDecision d = gdn::decide_matrix(host);
  std::printf("this host: amx-tile %d amx-bf16 %d xcr0-tile %d jit target '%s' -> engine %d %s\n", host.amx_tile,
              host.amx_bf16, host.xcr0_tile, host.jit_target.c_str(), (int)d.engine, d.why.c_str());
  if (std::getenv("EXPECT_HOST_ENGINE") && (int)d.engine != std::atoi(std::getenv("EXPECT_HOST_ENGINE"))) {
    std::printf("FAIL this host's decision: engine %d, expected %s\n", (int)d.engine, std::getenv("EXPECT_HOST_ENGINE"));
    ++failures;
  }
  std::printf("%d failures\n", failures);
  return failures ? 1 : 0;
}
