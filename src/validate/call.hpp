// call.hpp — what the validation stage hands on: which op a call is, and the facts of a config it
// accepted. The plan and the entry points take these from here without the validator's functions
// (validate.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include "gdn_xpu.h"
#include "kernels/params.hpp"

namespace gdn {

enum class Op { Conv, Delta, Attention };

// The model dims validate_config accepts (gdn_xpu.h, gdn_config_t): 1..these.
constexpr int32_t kMaxKHeads = 1024, kMaxVHeads = 4096, kMaxHeadDim = 256;

// Bytes of one element; 0 for a value that is not a gdn_dtype_t.
inline size_t dtype_bytes(int32_t dtype) {
  switch (dtype) {
    case GDN_DTYPE_F32: return 4;
    case GDN_DTYPE_F16: return 2;
    case GDN_DTYPE_BF16: return 2;
    case GDN_DTYPE_I8: return 1;
    case GDN_DTYPE_F8E4M3: return 1;
    default: return 0;
  }
}
// The 8-bit state dtypes (gdn_xpu.h "State dtype"): codes with a scale per state row in ssm_scale.
inline bool state_8bit(int32_t dtype) { return dtype == GDN_DTYPE_I8 || dtype == GDN_DTYPE_F8E4M3; }

// conv_dim = 2*H*K + HV*V: the channels of mixed_qkv, conv_out and a conv slot.
inline int64_t conv_dim_of(const gdn_config_t &cfg) {
  return 2LL * cfg.num_k_heads * cfg.head_k_dim + (int64_t)cfg.num_v_heads * cfg.head_v_dim;
}

// Gate values per v-head and token (params.hpp, gdn_gate_k) and f32 values of a replay ring entry,
// of a validated config.
inline int32_t gate_k_of(const gdn_config_t &cfg) { return gdn_gate_k(cfg.gate_mode, cfg.head_k_dim); }
inline int64_t ring_floats_of(const gdn_config_t &cfg) {
  return gdn_ring_floats(cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim, gate_k_of(cfg));
}

}  // namespace gdn
