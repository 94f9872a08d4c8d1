// families.hpp — the kernel families (host code): one run-time build per kernel source file of this
// folder and option set, so a call compiles only the files of the kernels it launches. A new family
// is a .cpp file here, its line in meson.build beside this file (the files the library embeds) and
// its row below; the build checks that the two lists name the same files (tools/embed_kernels.py).
#pragma once

namespace gdn {

enum class Family { Conv1d, Conv1dCpu, DeltaPrep, DeltaPrepCpu, DeltaRecurrent, DeltaRecurrentCpu, DeltaChunk, DeltaChunkCpu, GatedNorm, GatedNormCpu };

struct FamilyFile {
  Family family;
  const char *file;  // the kernel source, as embedded (its name in gdn::kernel_files)
  bool cpu;          // a CPU-device variant (docs/design.md "Generic kernels and CPU variants")
};

constexpr int kNumFamilies = static_cast<int>(Family::GatedNormCpu) + 1;

// One row per Family, in the enum's order (checked below).
inline constexpr FamilyFile kFamilies[kNumFamilies] = {
    {Family::Conv1d, "conv1d.cpp", false},
    {Family::Conv1dCpu, "conv1d_cpu.cpp", true},
    {Family::DeltaPrep, "delta_prep.cpp", false},
    {Family::DeltaPrepCpu, "delta_prep_cpu.cpp", true},
    {Family::DeltaRecurrent, "delta_recurrent.cpp", false},
    {Family::DeltaRecurrentCpu, "delta_recurrent_cpu.cpp", true},
    {Family::DeltaChunk, "delta_chunk.cpp", false},
    {Family::DeltaChunkCpu, "delta_chunk_cpu.cpp", true},
    {Family::GatedNorm, "gated_norm.cpp", false},
    {Family::GatedNormCpu, "gated_norm_cpu.cpp", true},
};

constexpr const FamilyFile &family_file(Family f) { return kFamilies[static_cast<int>(f)]; }

constexpr bool families_in_enum_order() {
  for (int i = 0; i < kNumFamilies; ++i)
    if (static_cast<int>(kFamilies[i].family) != i || !kFamilies[i].file) return false;
  return true;
}
static_assert(families_in_enum_order(), "kFamilies has one row per Family, in the enum's order");

}  // namespace gdn
