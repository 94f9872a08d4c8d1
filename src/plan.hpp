// plan.hpp — what a call will do, decided from the checked config and the batch COUNTS alone:
// which kernels run (variant, build options, launch shape) and where everything lives in the
// workspace. Pure: no device access, no metadata contents (the chunk tables of prefills are
// built on the device by gdn_chunk_plan), so gdn_attention, gdn_gated_delta_rule,
// gdn_causal_conv1d, gdn_attention_workspace_size and gdn_warmup all use the same plan.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <sycl/sycl.hpp>

#include "gdn_xpu.h"
#include "kernels/families.hpp"
#include "matrix.hpp"
#include "validate/call.hpp"

namespace gdn {

// The device facts a plan depends on. CPU-device kernel variants (explicit 16-wide vectors) are
// used on CPU devices unless GDN_XPU_GENERIC_KERNELS=1 asks for the generic kernels Intel GPUs get
// (tests use it to check those kernels on the CPU device).
struct Target {
  bool cpu_variants = false;
  // The CPU variants round f32 to bf16 with AVX512-BF16's vcvtne2ps2bf16 / vcvtneps2bf16
  // (vec16.hpp, to_bf16x32, store_bf16x16) when the host CPU (the CPU device) has it, unless
  // GDN_XPU_SOFT_BF16=1 asks for the bit operations (tests use it to check those on such a host too).
  bool bf16_instructions = false;
  // The CPU variants convert f16 activations with the 16-lane vcvtph2ps / vcvtps2ph (vec16.hpp,
  // load_act16, store_act16) when the host CPU has AVX-512 (AVX512F); else lane by lane.
  bool f16_instructions = false;
  // The CPU variants issue x86 prefetch instructions inline (vec16.hpp, prefetch_bytes) when the
  // host CPU (the CPU device) is x86-64, as the Intel CPU runtime's is.
  bool x86 = false;
  // The device's matrix engine, when the library can use it (matrix.hpp): the chunk kernels'
  // matrix form runs on it (joint_matrix), else that form is emulated on FMA units.
  MatrixDecision matrix;
  // gdn_warmup under GDN_XPU_MATRIX_BUILD: build the matrix form with `matrix`'s tile as
  // joint_matrix whatever the precision setting (a tool's build for inspecting the ISA; nothing runs).
  bool force_matrix_build = false;
};
Target target_of(const sycl::queue &q);
// target_of for gdn_warmup: GDN_XPU_MATRIX_BUILD=MxNxK/SG (e.g. 8x16x16/16) makes the warmup build
// the matrix form with that joint_matrix tile, where building it cannot abort the process: a GPU,
// or the CPU device with CL_CONFIG_CPU_TARGET_ARCH naming an AMX CPU (matrix.hpp). Calls ignore it.
Target warmup_target_of(const sycl::queue &q);

// How a plan's prefill computes its chunk products (gdn_prefill_path).
struct PrefillPath {
  int32_t engine = GDN_PREFILL_ENGINE_F32;  // gdn_prefill_engine_t
  MatrixTile tile;                          // engine != F32
  std::string text;                         // what gdn_prefill_path reports
};
// The path of a prefill with this config on the target: cfg->prefill_precision resolved (AUTO:
// BF16 for bf16 / f16 activations on XMX), and the matrix form only where K and V allow it.
PrefillPath prefill_path(const gdn_config_t &cfg, const Target &t);

// One kernel launch: which kernel of which build, and its nd_range (dims 1 or 2).
struct Launch {
  bool on = false;
  Family family{};
  std::string options;
  const char *name = "";
  int dims = 2;
  size_t global[2] = {1, 1}, local[2] = {1, 1};
};

// Byte offsets of everything a call keeps in workspace (256-byte aligned), and the total.
struct Layout {
  size_t conv_out = 0, qn = 0, kn = 0, g = 0, beta = 0;         // conv output, prep outputs
  size_t chunk_table = 0, seq_table = 0, chunked = 0;            // the chunk plan (int32)
  size_t cw = 0, cu = 0, caqk = 0, cdstart = 0, cdend = 0;        // chunk matrices (f32)
  size_t cwb = 0, cqb = 0, ckb = 0, caqkb = 0;                    // the matrix form's operands (bf16; caqk unused)
  size_t total = 0;
};

struct Plan {
  Launch conv_non_spec, conv_spec;                                // causal conv1d
  Launch prep, chunk_plan, recurrent_non_spec, chunk_prep, chunk_scan, recurrent_spec;  // delta rule
  Launch norm;                                                    // fused gated RMSNorm
  // On the CPU device a token group's conv and recurrence as ONE launch (gdn_fused_cpu): the
  // non-spec group of a step without prefills, the spec group of a step without chunk kernels;
  // the group's conv and recurrent launches are then off.
  Launch fused_non_spec, fused_spec;
  // Replay mode (gdn_xpu.h "Replay mode"): the spec group's replay, the recurrent kernel with
  // GDN_REPLAY_APPLY before the group's walk (fused_spec replays in its own work-items instead);
  // each group's ring counts after its walks (gdn_replay_count).
  Launch replay_spec, replay_count_non_spec, replay_count_spec;
  int32_t conv_tile = 0;          // tokens per time tile of the non-spec conv
  int32_t chunk_capacity = 0;     // rows of the device-built chunk table (0: no chunked path)
  int32_t seq_capacity = 0;       // rows of its sequence table
  bool prep_inline = false;       // no gdn_prep: the recurrent CPU kernels prepare their tokens
  bool conv_out_in_workspace = false;
  PrefillPath prefill;            // the chunk kernels' form (engine F32: the f32 form)
  Layout layout;

  // Every launch the call makes, in order (the kernels to compile before anything runs).
  std::vector<const Launch *> launches() const;
};

struct PlanInputs {
  Op op = Op::Attention;
  bool conv_out_given = false;  // gdn_attention: else the conv output lives in workspace
  bool z_given = false;         // gdn_attention: the fused gated RMSNorm runs
  bool z_out_given = false;     // packed input: the conv kernels also copy z to z_out
};

// cfg: validated (normalized); batch: counts validated.
Plan make_plan(const gdn_config_t &cfg, const gdn_batch_t &batch, const PlanInputs &in, const Target &target);
// gdn_flush_replay: the replay (replay_spec) of num_flush slots, then their ring counts emptied
// (replay_count_non_spec).
Plan make_flush_plan(const gdn_config_t &cfg, int32_t num_flush, const Target &target);

}  // namespace gdn
