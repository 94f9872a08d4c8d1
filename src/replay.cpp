// replay.cpp — replay mode's entry points (gdn_xpu.h "Replay mode"): the ring's size, and
// gdn_flush_replay (validate/replay.cpp checks its arguments).
#include "errors.hpp"
#include "kernels/params.hpp"
#include "launch.hpp"
#include "plan.hpp"
#include "validate/validate.hpp"

extern "C" {

// From the dims alone (validate_config's ranges), so a binding can size a ring before a call
// checks the rest of its config.
GDN_API int32_t gdn_replay_token_floats(const gdn_config_t *cfg) {
  using namespace gdn;
  auto in = [](int32_t v, int32_t hi) { return v >= 1 && v <= hi; };
  if (!cfg || !in(cfg->num_k_heads, kMaxKHeads) || !in(cfg->num_v_heads, kMaxVHeads) ||
      !in(cfg->head_k_dim, kMaxHeadDim) || !in(cfg->head_v_dim, kMaxHeadDim))
    return 0;
  // (gate_mode: a version-3 field; an older caller's struct ends before it)
  const int32_t mode = cfg->struct_size >= offsetof(gdn_config_t, gate_mode) + sizeof(int32_t) ? cfg->gate_mode : GDN_GATE_HEAD;
  if (mode != GDN_GATE_HEAD && mode != GDN_GATE_CHANNEL) return 0;
  return (int32_t)gdn_ring_floats(cfg->num_k_heads, cfg->num_v_heads, cfg->head_k_dim, cfg->head_v_dim,
                                  gdn_gate_k(mode, cfg->head_k_dim));
}

GDN_API gdn_status_t gdn_flush_replay(void *queue, const gdn_config_t *cfg_in, int32_t num_flush, const int32_t *slots,
                                      const int32_t *num_tokens, void *ssm_state, float *replay_ring,
                                      int32_t *replay_count) {
  using namespace gdn;
  return guarded([&] {
    const gdn_config_t cfg = validate_flush(queue, cfg_in, num_flush, slots, num_tokens, ssm_state, replay_ring, replay_count);
    if (num_flush == 0) return;
    sycl::queue &q = *static_cast<sycl::queue *>(queue);
    const Plan plan = make_flush_plan(cfg, num_flush, target_of(q));
    const Kernels ks(q, plan.launches());
    GdnDeltaParams p{};
    p.ssm = ssm_state;
    p.slot_stride = cfg.ssm_slot_stride;
    p.H = cfg.num_k_heads, p.HV = cfg.num_v_heads, p.K = cfg.head_k_dim, p.V = cfg.head_v_dim;
    p.v_offset = 2 * cfg.num_k_heads * cfg.head_k_dim;
    p.pad_slot_id = -1;
    p.state_indices = slots, p.num_accepted = num_tokens, p.slot_cols = 1, p.num_seqs = num_flush;
    p.group = GDN_GROUP_SPEC, p.replay = GDN_REPLAY_APPLY;
    p.ring = replay_ring, p.ring_count = replay_count, p.ring_tokens = cfg.replay_tokens;
    p.ring_floats = ring_floats_of(cfg);
    Chain ch(q, false);
    launch(ch, ks, plan.replay_spec, p);
    p.group = GDN_GROUP_NON_SPEC;
    launch(ch, ks, plan.replay_count_non_spec, p);
    if (!ch.in_order) ch.last.wait_and_throw();
  });
}

}  // extern "C"
