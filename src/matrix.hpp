// matrix.hpp — whether the chunked prefill's products may run on the device's matrix engine
// (sycl_ext_oneapi_matrix joint_matrix: XMX on Intel GPUs, AMX on the CPU device), and with which
// tile. Decided before anything is built, by decide_matrix: a pure function of the facts below,
// which the library gathers once per device (plan.cpp) and tests give it by hand
// (tests/c/test_matrix_decision.cpp). Plain C++: no SYCL here.
//
// Why the CPU device needs more than the device's word: on a host whose CPU has AMX, the CPU
// runtime's JIT, left at its default target, aborts the process (no exception) when it compiles a
// joint_matrix kernel on some hosts (a VM whose CPUID names no CPU model the JIT knows); with
// CL_CONFIG_CPU_TARGET_ARCH naming an AMX CPU it compiles AMX code. That code dies of SIGILL on a
// host without AMX, where the device still reports the matrix aspect under such a target. So the
// CPU device takes joint_matrix only when the host CPU has AMX (CPUID), the OS enabled its tile
// state (XCR0), the device reports the aspect, and the JIT's target names an AMX CPU. The library
// never sets that variable (it is process-wide): docs/usage.md says how a user does.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gdn {

// A bf16 x bf16 -> f32 (accumulator and result f32) combination the device reports
// (sycl::ext::oneapi::experimental::info::device::matrix_combinations): fixed sizes m, n, k, or
// bounds max_m, max_n, max_k (0 = not given).
struct MatrixCombination {
  size_t max_m = 0, max_n = 0, max_k = 0, m = 0, n = 0, k = 0;
};

enum class DeviceKind { Other, Gpu, Cpu };  // Gpu: Level Zero or OpenCL GPU; Cpu: the OpenCL CPU device

struct MatrixFacts {
  DeviceKind device = DeviceKind::Other;
  bool aspect = false;                    // sycl::aspect::ext_intel_matrix
  std::vector<MatrixCombination> bf16;    // its bf16 x bf16 -> f32 combinations
  std::vector<size_t> sub_groups;         // the sub-group sizes it supports
  // The host CPU, which the CPU device runs on (not read for other devices):
  bool amx_tile = false, amx_bf16 = false;  // CPUID.(EAX=7,ECX=0):EDX bits 24 and 22
  bool xcr0_tile = false;                   // XCR0 bits 17 and 18: the OS saves the tile state
  std::string jit_target;                   // CL_CONFIG_CPU_TARGET_ARCH as set, "" when unset
};

enum class MatrixEngine { None, Xmx, Amx };

// The tile of the chunk kernels' matrix form: C (m x n, f32) += A (m x k) B (k x n), bf16
// operands, one sub-group of sub_group lanes per tile.
struct MatrixTile {
  int32_t m = 0, n = 0, k = 0, sub_group = 0;
};

struct MatrixDecision {
  MatrixEngine engine = MatrixEngine::None;
  MatrixTile tile;   // engine != None
  std::string why;   // engine == None: the fact that ruled it out
};

MatrixDecision decide_matrix(const MatrixFacts &f);

// Whether a CL_CONFIG_CPU_TARGET_ARCH value names a CPU with AMX (sapphirerapids, emeraldrapids,
// graniterapids, graniterapids-d, diamondrapids; any case). "" (unset) and "auto" do not.
bool jit_target_has_amx(const std::string &target);

// The host CPU's facts (CPUID, XCR0; the CPU device runs on this CPU) and the JIT target from the
// environment, into f.
void host_cpu_facts(MatrixFacts &f);

// The tile the matrix form is emulated with on FMA units where no engine can be used
// (params.hpp's GDN_MX_EMU_*).
MatrixTile emulation_tile();

}  // namespace gdn
