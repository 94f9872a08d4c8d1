// replay.cpp — replay mode (gdn_xpu.h "Replay mode"): the checks of a call's ring counts
// (GDN_VALIDATE_FULL) and gdn_flush_replay.
#include <algorithm>
#include <string>
#include <vector>

#include "errors.hpp"
#include "kernels/params.hpp"
#include "launch.hpp"
#include "meta_reader.hpp"
#include "plan.hpp"
#include "validate.hpp"

namespace gdn {
namespace {

// replay_count of the slots [lo, hi] on the host (O(hi - lo), not O(num_slots)).
struct Counts {
  int32_t lo = 0;
  std::vector<int32_t> v;
  int32_t of(int32_t slot) const { return v[(size_t)(slot - lo)]; }
};
Counts read_counts(sycl::queue &q, const int32_t *count, const std::vector<int32_t> &slots) {
  Counts c;
  if (slots.empty()) return c;
  const auto [lo, hi] = std::minmax_element(slots.begin(), slots.end());
  c.lo = *lo;
  MetaReader r(q);
  r.read(c.v, count + *lo, (int64_t)*hi - *lo + 1, MetaReader::kKinds - 1);
  r.finish();
  return c;
}

// A count is the library's own: outside [0, replay_tokens] the cache was not zero-filled.
void check_count(int32_t count, int32_t slot, int32_t replay_tokens) {
  GDN_REQUIRE(count >= 0 && count <= replay_tokens, GDN_ERROR_BAD_COUNT,
          "replay_count[" + str(slot) + "] = " + str(count) + " is outside [0, cfg->replay_tokens = " +
              str(replay_tokens) + "] (replay_count is written by the library only; zero-fill it with the cache)");
}

}  // namespace

void check_replay_counts(Checked &c) {
  const gdn_batch_t &b = c.batch;
  HostMeta &m = c.meta;
  const int32_t pad = b.pad_slot_id, cols = b.num_spec + 1, nns = c.num_non_spec_seqs;
  if (nns > 0 && b.has_initial_state && m.has_init.empty()) {  // (read back only with read slots)
    MetaReader r(c.q);
    r.read(m.has_init, b.has_initial_state, nns, 8);
    r.finish();
  }
  // The read slots whose counts matter: each non-spec sequence's that reads a state (it must be
  // empty), each spec sequence's (its replay).
  std::vector<int32_t> ns_read((size_t)nns, pad), s_read((size_t)b.num_spec_decodes, pad), all;
  for (int32_t i = 0; i < nns; ++i) {
    if (m.ns_qsl[(size_t)i + 1] == m.ns_qsl[(size_t)i] || m.ns_slots[(size_t)i] == pad) continue;
    if (!m.has_init.empty() && !m.has_init[(size_t)i]) continue;
    ns_read[(size_t)i] = m.ns_read.empty() ? m.ns_slots[(size_t)i] : m.ns_read[(size_t)i];
  }
  for (int32_t n = 0; n < b.num_spec_decodes; ++n) {
    const int32_t committed = m.s_slots[(size_t)n * cols];
    if (m.s_qsl[(size_t)n + 1] == m.s_qsl[(size_t)n] || committed == pad) continue;
    s_read[(size_t)n] = m.s_read.empty() ? committed : m.s_read[(size_t)n];
  }
  for (const auto *v : {&ns_read, &s_read})
    for (int32_t s : *v)
      if (s != pad) all.push_back(s);
  const Counts counts = read_counts(c.q, c.t.replay_count, all);
  for (int32_t i = 0; i < nns; ++i) {
    const int32_t s = ns_read[(size_t)i];
    if (s == pad) continue;
    check_count(counts.of(s), s, c.cfg.replay_tokens);
    GDN_REQUIRE(counts.of(s) == 0, GDN_ERROR_BAD_STATE_INDEX,
            std::string(m.ns_read.empty() ? "non_spec_state_indices[" : "non_spec_read_state_indices[") + str(i) +
                "] = " + str(s) + " is read by non-spec sequence " + str(i) + " but holds " + str(counts.of(s)) +
                " unreplayed tokens (replay_count); gdn_flush_replay it first");
  }
  for (int32_t n = 0; n < b.num_spec_decodes; ++n) {
    const int32_t s = s_read[(size_t)n];
    if (s == pad) continue;
    const int32_t R = counts.of(s), A = m.accepted[(size_t)n];
    check_count(R, s, c.cfg.replay_tokens);
    GDN_REQUIRE(R == 0 || A <= R, GDN_ERROR_BAD_ACCEPTED,
            "num_accepted_tokens[" + str(n) + "] = " + str(A) + " > the " + str(R) + " tokens in the ring of slot " +
                str(s) + " (replay_count[" + str(s) + "]), spec sequence " + str(n) + "'s read slot");
  }
}

}  // namespace gdn

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
    if (!queue) fail(GDN_ERROR_BAD_QUEUE, "queue is NULL");
    const gdn_config_t cfg = validate_config(cfg_in);
    GDN_REQUIRE(cfg.replay_tokens > 0, GDN_ERROR_BAD_COUNT, "cfg->replay_tokens = 0: gdn_flush_replay needs replay mode");
    GDN_REQUIRE(num_flush >= 0, GDN_ERROR_BAD_COUNT, "num_flush = " + str(num_flush) + " is negative");
    if (num_flush == 0) return;
    const char *why = "num_flush > 0";
    if (!slots) fail(GDN_ERROR_NULL_POINTER, std::string("slots is NULL but ") + why);
    if (!num_tokens) fail(GDN_ERROR_NULL_POINTER, std::string("num_tokens is NULL but ") + why);
    if (!ssm_state) fail(GDN_ERROR_NULL_POINTER, std::string("ssm_state is NULL but ") + why);
    if (!replay_ring) fail(GDN_ERROR_NULL_POINTER, std::string("replay_ring is NULL but ") + why);
    if (!replay_count) fail(GDN_ERROR_NULL_POINTER, std::string("replay_count is NULL but ") + why);
    sycl::queue &q = *static_cast<sycl::queue *>(queue);
    GDN_REQUIRE(!recording(q), GDN_ERROR_UNSUPPORTED,
                "the queue records a graph, and gdn_flush_replay reads slots, num_tokens and replay_count back: call it "
                "outside the recording");
    const int64_t H = cfg.num_k_heads, HV = cfg.num_v_heads, K = cfg.head_k_dim, V = cfg.head_v_dim, S = cfg.num_slots;
    const int64_t ring = cfg.replay_tokens * ring_floats_of(cfg);
    const size_t state = dtype_bytes(cfg.state_dtype);
    const Array arrays[] = {
        {slots, "slots", 4, "int32", Need{4LL * num_flush, num_flush, "entries: num_flush"}},
        {num_tokens, "num_tokens", 4, "int32", Need{4LL * num_flush, num_flush, "entries: num_flush"}},
        {ssm_state, "ssm_state", state, "state_dtype",
         Need{rows_bytes(S, cfg.ssm_slot_stride, HV * K * V, state), S, "slots: num_slots"}},
        {replay_ring, "replay_ring", 4, "f32", Need{rows_bytes(S, ring, ring, 4), S, "slots: num_slots"}},
        {replay_count, "replay_count", 4, "int32", Need{rows_bytes(S, 1, 1, 4), S, "slots: num_slots"}}};
    check_arrays(q, cfg.flags, arrays, sizeof arrays / sizeof arrays[0]);

    std::vector<int32_t> sl, nt, flushed;
    MetaReader r(q);
    r.read(sl, slots, num_flush, 0);
    r.read(nt, num_tokens, num_flush, 1);
    r.finish();
    for (int32_t i = 0; i < num_flush; ++i) {
      if (sl[(size_t)i] == -1) continue;
      GDN_REQUIRE(sl[(size_t)i] >= 0 && sl[(size_t)i] < S, GDN_ERROR_BAD_STATE_INDEX,
              "slots[" + str(i) + "] = " + str(sl[(size_t)i]) + " is outside [0, num_slots=" + str(S) + ") and is not -1");
      flushed.push_back(sl[(size_t)i]);
    }
    std::vector<int32_t> sorted = flushed;
    std::sort(sorted.begin(), sorted.end());
    const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    GDN_REQUIRE(dup == sorted.end(), GDN_ERROR_DUPLICATE_SLOT, "slots holds slot " + str(dup == sorted.end() ? 0 : *dup) + " twice");
    const Counts counts = read_counts(q, replay_count, flushed);
    for (int32_t i = 0; i < num_flush; ++i) {
      const int32_t s = sl[(size_t)i];
      if (s == -1) continue;
      check_count(counts.of(s), s, cfg.replay_tokens);
      const int32_t R = counts.of(s);  // (R = 0: the state is current, num_tokens[i] unused)
      GDN_REQUIRE(nt[(size_t)i] >= 0 && (R == 0 || nt[(size_t)i] <= R), GDN_ERROR_BAD_ACCEPTED,
              "num_tokens[" + str(i) + "] = " + str(nt[(size_t)i]) + " is outside [0, replay_count[" + str(s) +
                  "] = " + str(R) + "]");
    }

    const Plan plan = make_flush_plan(cfg, num_flush, target_of(q));
    const Kernels ks(q, plan.launches());
    GdnDeltaParams p{};
    p.ssm = ssm_state;
    p.slot_stride = cfg.ssm_slot_stride;
    p.H = (int32_t)H, p.HV = (int32_t)HV, p.K = (int32_t)K, p.V = (int32_t)V;
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
