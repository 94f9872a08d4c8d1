// metadata.cpp — the contents of the metadata arrays (checks.hpp): read to the host and checked
// under GDN_VALIDATE_FULL in O(rows + sequences + slots addressed), independent of num_slots.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "batch_arrays.hpp"
#include "checks.hpp"
#include "errors.hpp"
#include "meta_reader.hpp"

namespace gdn {
namespace {

void check_start_loc(const std::vector<int32_t> &qsl, int32_t tokens, const char *field, const char *count_field) {
  if (qsl.empty()) return;
  GDN_REQUIRE(qsl[0] == 0, GDN_ERROR_BAD_START_LOC, std::string(field) + "[0] = " + str(qsl[0]) + ", expected 0");
  for (size_t i = 1; i < qsl.size(); ++i)
    GDN_REQUIRE(qsl[i] >= qsl[i - 1], GDN_ERROR_BAD_START_LOC,
            std::string(field) + " decreases at [" + str((int64_t)i) + "]: " + str(qsl[i - 1]) + " -> " + str(qsl[i]));
  GDN_REQUIRE(qsl.back() == tokens, GDN_ERROR_BAD_START_LOC,
          std::string(field) + "[last] = " + str(qsl.back()) + " but " + count_field + " = " + str(tokens));
}

// field() names the element; called only to build the error message.
template <class Field>
void check_slot(int32_t slot, const gdn_batch_t &b, int32_t num_slots, const Field &field) {
  if (gdn_is_pad(slot, b.pad_slot_id)) return;
  GDN_REQUIRE(slot < num_slots, GDN_ERROR_BAD_STATE_INDEX,
          field() + " = " + str(slot) + " is outside [0, num_slots=" + str(num_slots) + ") and is not padding (pad_slot_id " +
              str(b.pad_slot_id) + " or negative)");
}

// One use of a state slot by one sequence of the call. The rules between uses (gdn_xpu.h "State
// caches") are checked on these records sorted by slot, so the cost is O(uses log uses) whatever
// num_slots is: a table indexed by slot would cost O(num_slots) per call (about 1 s at 134M slots).
enum class Use : uint8_t { Write, Read, Checkpoint };
enum class Field : uint8_t { NonSpecWrite, SpecWrite, NonSpecRead, SpecRead, SpecDefaultRead, Checkpoint };
struct SlotUse {
  int32_t slot;
  int32_t seq;    // non-spec i, or num_non_spec_seqs + n for spec sequence n
  int32_t order;  // position in the order the rules are stated: writes, then reads, then checkpoints
  int32_t col;    // column of the field (spec_state_indices, checkpoint_state_indices)
  int32_t token;  // checkpoints: the boundary token (0-based in the step)
  Use use;
  Field field;
  bool last;      // checkpoints: the boundary is the sequence's last token
};

struct SlotUses {
  const Checked &c;
  std::vector<SlotUse> uses;

  std::string who(const SlotUse &u) const {
    return u.seq < c.num_non_spec_seqs ? "non-spec sequence " + str(u.seq)
                                       : "spec sequence " + str(u.seq - c.num_non_spec_seqs);
  }
  std::string field(const SlotUse &u) const {
    const int32_t i = u.seq < c.num_non_spec_seqs ? u.seq : u.seq - c.num_non_spec_seqs;
    switch (u.field) {
      case Field::NonSpecWrite: return "non_spec_state_indices[" + str(i) + "]";
      case Field::SpecWrite:
      case Field::SpecDefaultRead: return "spec_state_indices[" + str(i) + "][" + str(u.col) + "]";
      case Field::NonSpecRead: return "non_spec_read_state_indices[" + str(i) + "]";
      case Field::SpecRead: return "spec_read_state_indices[" + str(i) + "]";
      case Field::Checkpoint: return "checkpoint_state_indices[" + str(i) + "][" + str(u.col) + "]";
    }
    return "?";
  }
  void add(int32_t slot, int32_t seq, Use use, Field f, int32_t col = 0, int32_t token = 0, bool last = false) {
    if (gdn_is_pad(slot, c.batch.pad_slot_id)) return;
    uses.push_back(SlotUse{slot, seq, (int32_t)uses.size(), col, token, use, f, last});
  }

  // Why `b` may not use its slot given the earlier uses of that slot, or "" when it may.
  // Per slot and kind of use it is enough to keep the first use and the first use by a
  // different sequence than that one: "an earlier use by a sequence other than b's" is then one
  // of those two.
  struct Seen {
    const SlotUse *first = nullptr, *other = nullptr;
    void add(const SlotUse &u) {
      if (!first) first = &u;
      else if (!other && u.seq != first->seq) other = &u;
    }
    const SlotUse *by_other_than(int32_t seq) const { return first && first->seq != seq ? first : other; }
    const SlotUse *by(int32_t seq) const { return first && first->seq == seq ? first : other && other->seq == seq ? other : nullptr; }
  };
  std::string conflict(const SlotUse &b, const Seen &w, const Seen &r, const Seen &ck) const {
    const std::string head = field(b) + " = " + str(b.slot);
    if (b.use == Use::Write) {
      if (const SlotUse *a = w.by_other_than(b.seq)) return head + " is also written by " + who(*a);
      return "";
    }
    if (b.use == Use::Read) {
      if (const SlotUse *a = w.by_other_than(b.seq))
        return head + " is read as an initial state by " + who(b) + " but written by " + who(*a) + " (" + field(*a) +
               ") in the same call";
      return "";
    }
    const std::string mine = " (a checkpoint of " + who(b) + ")";
    if (const SlotUse *a = w.by_other_than(b.seq)) return head + mine + " is also written by " + who(*a) + " (" + field(*a) + ")";
    if (const SlotUse *a = r.by_other_than(b.seq))
      return head + mine + " is also read by " + who(*a) + " (" + field(*a) + ") as an initial state";
    if (ck.first) return head + mine + " is also " + field(*ck.first) + (ck.first->seq == b.seq ? "" : " of " + who(*ck.first));
    if (const SlotUse *a = r.by(b.seq)) return head + mine + " is also that sequence's read slot (" + field(*a) + ")";
    if (const SlotUse *a = w.by(b.seq); a && !b.last)
      return head + mine + " is also that sequence's write slot (" + field(*a) + ") but its boundary, token " +
             str(b.token) + ", is not the sequence's last token";
    return "";
  }

  // Fails with the conflict whose later use comes first in `order` (the one a sequential check
  // in that order would meet first).
  void check() {
    std::sort(uses.begin(), uses.end(),
              [](const SlotUse &x, const SlotUse &y) { return x.slot != y.slot ? x.slot < y.slot : x.order < y.order; });
    int32_t best = INT32_MAX;
    std::string message;
    for (size_t g = 0; g < uses.size();) {
      size_t end = g;
      while (end < uses.size() && uses[end].slot == uses[g].slot) ++end;
      Seen w, r, ck;
      for (size_t i = g; i < end && uses[i].order < best; ++i) {
        const SlotUse &u = uses[i];
        std::string why = conflict(u, w, r, ck);
        if (!why.empty()) {
          best = u.order;
          message = std::move(why);
          break;
        }
        (u.use == Use::Write ? w : u.use == Use::Read ? r : ck).add(u);
      }
      g = end;
    }
    if (!message.empty()) fail(GDN_ERROR_DUPLICATE_SLOT, message);
  }
};

// Values one by one: start locations, slots in range, counts of the spec sequences, start positions.
void check_values(const Checked &c) {
  const gdn_batch_t &b = c.batch;
  const HostMeta &m = c.meta;
  const int32_t slots = c.cfg.num_slots, cols = b.num_spec + 1, nns = c.num_non_spec_seqs;
  check_start_loc(m.ns_qsl, b.non_spec_token_count, "non_spec_query_start_loc", "non_spec_token_count");
  check_start_loc(m.s_qsl, b.spec_token_count, "spec_query_start_loc", "spec_token_count");

  for (int32_t i = 0; i < nns; ++i) {
    check_slot(m.ns_slots[(size_t)i], b, slots, [&] { return "non_spec_state_indices[" + str(i) + "]"; });
    if (!m.ns_read.empty()) check_slot(m.ns_read[(size_t)i], b, slots, [&] { return "non_spec_read_state_indices[" + str(i) + "]"; });
    if (!m.start_pos.empty())
      GDN_REQUIRE(m.start_pos[(size_t)i] >= 0, GDN_ERROR_BAD_COUNT,
              "non_spec_start_pos[" + str(i) + "] = " + str(m.start_pos[(size_t)i]) + " is negative");
  }
  for (int32_t n = 0; n < b.num_spec_decodes; ++n) {
    const int32_t len = m.s_qsl[(size_t)n + 1] - m.s_qsl[(size_t)n];
    GDN_REQUIRE(len <= cols, GDN_ERROR_BAD_START_LOC,
            "spec_query_start_loc: spec sequence " + str(n) + " has " + str(len) + " tokens > 1 + num_spec = " + str(cols));
    const int32_t a = m.accepted[(size_t)n];
    GDN_REQUIRE(a >= 1 && a <= cols, GDN_ERROR_BAD_ACCEPTED,
            "num_accepted_tokens[" + str(n) + "] = " + str(a) + " is outside [1, 1 + num_spec = " + str(cols) + "]");
    for (int32_t t = 0; t < cols; ++t)
      check_slot(m.s_slots[(size_t)n * cols + t], b, slots, [&] { return "spec_state_indices[" + str(n) + "][" + str(t) + "]"; });
    if (!m.s_read.empty()) check_slot(m.s_read[(size_t)n], b, slots, [&] { return "spec_read_state_indices[" + str(n) + "]"; });
  }
  const int64_t ck_cols = m.ckpt.empty() ? 0 : b.checkpoint_cols;
  for (int64_t e = 0; e < (int64_t)m.ckpt.size(); ++e)
    check_slot(m.ckpt[(size_t)e], b, slots,
               [&] { return "checkpoint_state_indices[" + str(e / ck_cols) + "][" + str(e % ck_cols) + "]"; });
}

// The rules between uses of slots (writers, readers, checkpoints), on the sorted list of uses.
void check_slot_uses(const Checked &c) {
  const gdn_batch_t &b = c.batch;
  const HostMeta &m = c.meta;
  const int32_t cols = c.batch.num_spec + 1, nns = c.num_non_spec_seqs, pad = b.pad_slot_id;
  const int64_t ck_cols = m.ckpt.empty() ? 0 : b.checkpoint_cols;
  // In the order the rules are stated (this order picks the use an error names).
  SlotUses u{c, {}};
  for (int32_t i = 0; i < nns; ++i)  // a zero-length sequence still claims its write slot
    u.add(m.ns_slots[(size_t)i], i, Use::Write, Field::NonSpecWrite);
  for (int32_t n = 0; n < b.num_spec_decodes; ++n)
    for (int32_t t = 0; t < m.s_qsl[(size_t)n + 1] - m.s_qsl[(size_t)n]; ++t)
      u.add(m.s_slots[(size_t)n * cols + t], nns + n, Use::Write, Field::SpecWrite, t);
  for (int32_t i = 0; i < nns; ++i) {  // reads other than the write slot itself
    if (m.ns_read.empty() || m.ns_qsl[(size_t)i + 1] == m.ns_qsl[(size_t)i] || gdn_is_pad(m.ns_slots[(size_t)i], pad)) continue;
    if (!m.has_init.empty() && !m.has_init[(size_t)i]) continue;  // nothing is read
    if (m.ns_read[(size_t)i] != m.ns_slots[(size_t)i]) u.add(m.ns_read[(size_t)i], i, Use::Read, Field::NonSpecRead);
  }
  for (int32_t n = 0; n < b.num_spec_decodes; ++n) {
    if (m.s_qsl[(size_t)n + 1] == m.s_qsl[(size_t)n]) continue;
    if (!m.s_read.empty()) {
      u.add(m.s_read[(size_t)n], nns + n, Use::Read, Field::SpecRead);
    } else {  // SSM and SNAPSHOT conv read [n][A-1]; the ROLLED line [n][0] is a write slot already
      const int32_t col = gdn_accepted(m.accepted.data(), n, cols) - 1;  // (in range: check_values)
      u.add(m.s_slots[(size_t)n * cols + col], nns + n, Use::Read, Field::SpecDefaultRead, col);
    }
  }
  if (b.checkpoint_interval > 0) {
    const int64_t I = b.checkpoint_interval;
    for (int32_t i = 0; i < nns; ++i) {
      const int64_t len = m.ns_qsl[(size_t)i + 1] - m.ns_qsl[(size_t)i];
      if (len == 0 || gdn_is_pad(m.ns_slots[(size_t)i], pad)) continue;  // padding stores no checkpoints
      const int64_t p = m.start_pos.empty() ? 0 : m.start_pos[(size_t)i];
      const int64_t crossed = (p + len) / I - p / I;  // tokens j with (p + j + 1) % I == 0
      GDN_REQUIRE(crossed <= b.checkpoint_cols, GDN_ERROR_BAD_COUNT,
              "non-spec sequence " + str(i) + " (non_spec_start_pos " + str(p) + ", " + str(len) + " tokens) crosses " +
                  str(crossed) + " checkpoint boundaries (checkpoint_interval " + str(I) + ") but checkpoint_cols = " +
                  str(b.checkpoint_cols));
      for (int64_t k = 0; k < crossed; ++k) {
        const int64_t j = (p / I + k + 1) * I - p - 1;
        u.add(m.ckpt[(size_t)(i * ck_cols + k)], i, Use::Checkpoint, Field::Checkpoint, (int32_t)k, (int32_t)j, j == len - 1);
      }
    }
  }
  u.check();
}

// Token rows: inside [0, num_actual_tokens), each claimed once.
void check_token_rows(const Checked &c) {
  const gdn_batch_t &b = c.batch;
  const HostMeta &m = c.meta;
  std::vector<uint8_t> owned((size_t)b.num_actual_tokens, 0);
  auto own_rows = [&](const std::vector<int32_t> &tok, int32_t count, const char *field, uint8_t tag) {
    for (int32_t j = 0; j < count; ++j) {
      const int64_t row = tok.empty() ? j : tok[(size_t)j];
      GDN_REQUIRE(row >= 0 && row < b.num_actual_tokens, GDN_ERROR_BAD_TOKEN_INDEX,
              std::string(field) + "[" + str(j) + "] = " + str(row) + " is outside [0, num_actual_tokens=" +
                  str(b.num_actual_tokens) + ")" + (tok.empty() ? " (NULL index = identity)" : ""));
      GDN_REQUIRE(!owned[(size_t)row], GDN_ERROR_BAD_TOKEN_INDEX,
              std::string(field) + "[" + str(j) + "] = row " + str(row) + " is already claimed by " +
                  (owned[(size_t)row] == 1 ? "a non-spec token" : "a spec token") +
                  (tok.empty() ? " (NULL index = identity)" : ""));
      owned[(size_t)row] = tag;
    }
  };
  own_rows(m.ns_tok, b.non_spec_token_count, "non_spec_token_indx", 1);
  own_rows(m.s_tok, b.spec_token_count, "spec_token_indx", 2);
}

// Full content checks of the metadata (GDN_VALIDATE_FULL): O(rows + sequences + slots addressed)
// time and memory, independent of num_slots.
void check_contents(const Checked &c) {
  check_values(c);
  check_slot_uses(c);
  check_token_rows(c);
}

// Host copies of the metadata arrays, as long as the counts make them (batch_arrays.hpp); an
// array not given stays empty. Waits for the work already on the queue.
void read_metadata(Checked &c) {
  const gdn_batch_t &b = c.batch;
  MetaReader r(c.q);
  HostMeta &m = c.meta;
  auto read = [&](auto &dst, BatchArray a) {
    using T = typename std::decay_t<decltype(dst)>::value_type;
    const BatchSpan s = batch_span(b, a);
    if (s.p) r.read(dst, static_cast<const T *>(s.p), s.n, static_cast<int>(a));
  };
  read(m.ns_qsl, BatchArray::NonSpecQueryStartLoc);
  read(m.ns_slots, BatchArray::NonSpecStateIndices);
  read(m.ns_tok, BatchArray::NonSpecTokenIndx);
  if (b.non_spec_read_state_indices) {  // has_initial_state == 0 means the read slot is not read
    read(m.ns_read, BatchArray::NonSpecReadStateIndices);
    read(m.has_init, BatchArray::HasInitialState);
  }
  read(m.start_pos, BatchArray::NonSpecStartPos);
  read(m.ckpt, BatchArray::CheckpointStateIndices);
  read(m.s_qsl, BatchArray::SpecQueryStartLoc);
  read(m.s_slots, BatchArray::SpecStateIndices);
  read(m.accepted, BatchArray::NumAcceptedTokens);
  read(m.s_tok, BatchArray::SpecTokenIndx);
  read(m.s_read, BatchArray::SpecReadStateIndices);
  r.finish();
}

}  // namespace

void check_metadata(Checked &c) {
  read_metadata(c);
  check_contents(c);
}

}  // namespace gdn
