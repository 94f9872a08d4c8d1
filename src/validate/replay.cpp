// replay.cpp — replay mode's checks (gdn_xpu.h "Replay mode"): a call's ring counts
// (GDN_VALIDATE_FULL) and gdn_flush_replay's arguments.
#include <algorithm>
#include <string>
#include <vector>

#include "batch_arrays.hpp"
#include "checks.hpp"
#include "errors.hpp"
#include "meta_reader.hpp"

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
  r.read(c.v, count + *lo, (int64_t)*hi - *lo + 1, MetaReader::kRingCountKind);
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
    r.read(m.has_init, b.has_initial_state, nns, static_cast<int>(BatchArray::HasInitialState));
    r.finish();
  }
  // The read slots whose counts matter: each non-spec sequence's that reads a state (it must be
  // empty), each spec sequence's (its replay).
  std::vector<int32_t> ns_read((size_t)nns, pad), s_read((size_t)b.num_spec_decodes, pad), all;
  for (int32_t i = 0; i < nns; ++i) {
    if (m.ns_qsl[(size_t)i + 1] == m.ns_qsl[(size_t)i] || gdn_is_pad(m.ns_slots[(size_t)i], pad)) continue;
    if (!m.has_init.empty() && !m.has_init[(size_t)i]) continue;
    ns_read[(size_t)i] = m.ns_read.empty() ? m.ns_slots[(size_t)i] : m.ns_read[(size_t)i];
  }
  for (int32_t n = 0; n < b.num_spec_decodes; ++n) {
    const int32_t committed = m.s_slots[(size_t)n * cols];
    if (m.s_qsl[(size_t)n + 1] == m.s_qsl[(size_t)n] || gdn_is_pad(committed, pad)) continue;
    s_read[(size_t)n] = m.s_read.empty() ? committed : m.s_read[(size_t)n];
  }
  for (const auto *v : {&ns_read, &s_read})
    for (int32_t s : *v)
      if (!gdn_is_pad(s, pad)) all.push_back(s);
  const Counts counts = read_counts(c.q, c.t.replay_count, all);
  for (int32_t i = 0; i < nns; ++i) {
    const int32_t s = ns_read[(size_t)i];
    if (gdn_is_pad(s, pad)) continue;
    check_count(counts.of(s), s, c.cfg.replay_tokens);
    GDN_REQUIRE(counts.of(s) == 0, GDN_ERROR_BAD_STATE_INDEX,
            std::string(m.ns_read.empty() ? "non_spec_state_indices[" : "non_spec_read_state_indices[") + str(i) +
                "] = " + str(s) + " is read by non-spec sequence " + str(i) + " but holds " + str(counts.of(s)) +
                " unreplayed tokens (replay_count); gdn_flush_replay it first");
  }
  for (int32_t n = 0; n < b.num_spec_decodes; ++n) {
    const int32_t s = s_read[(size_t)n];
    if (gdn_is_pad(s, pad)) continue;
    const int32_t R = counts.of(s), A = m.accepted[(size_t)n];
    check_count(R, s, c.cfg.replay_tokens);
    GDN_REQUIRE(R == 0 || A <= R, GDN_ERROR_BAD_ACCEPTED,
            "num_accepted_tokens[" + str(n) + "] = " + str(A) + " > the " + str(R) + " tokens in the ring of slot " +
                str(s) + " (replay_count[" + str(s) + "]), spec sequence " + str(n) + "'s read slot");
  }
}

gdn_config_t validate_flush(void *queue, const gdn_config_t *cfg_in, int32_t num_flush, const int32_t *slots,
                            const int32_t *num_tokens, const void *ssm_state, const float *replay_ring,
                            const int32_t *replay_count) {
  if (!queue) fail(GDN_ERROR_BAD_QUEUE, "queue is NULL");
  const gdn_config_t cfg = validate_config(cfg_in);
  GDN_REQUIRE(cfg.replay_tokens > 0, GDN_ERROR_BAD_COUNT, "cfg->replay_tokens = 0: gdn_flush_replay needs replay mode");
  GDN_REQUIRE(num_flush >= 0, GDN_ERROR_BAD_COUNT, "num_flush = " + str(num_flush) + " is negative");
  if (num_flush == 0) return cfg;
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
  const int64_t HV = cfg.num_v_heads, K = cfg.head_k_dim, V = cfg.head_v_dim, S = cfg.num_slots;
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
  r.read(sl, slots, num_flush, 0);  // (the staging buffers of two batch arrays: a flush is no call)
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
  return cfg;
}

}  // namespace gdn
