// validate.cpp — see validate.hpp. Each check throws gdn::Failure with the field's name.
#include "validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "errors.hpp"

namespace gdn {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string ptr_str(const void *p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

std::string fstr(float v) {  // shortest round-trip-ish text: -0.5, 0, 1e-06
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", (double)v);
  return buf;
}

// Struct versions (gdn_xpu.h, "Structs are versioned"): the sizes of every version of each struct
// this library knows, oldest first. Version 1 is the layout libgdn_xpu 0.1.0 shipped, the oldest
// caller accepted; gdn_batch_t's version 1 ends where its first version-2 field begins. On LP64
// platforms (x86-64, aarch64 Linux) version 1 was 88 (config), 112 (batch) and 184 (tensors) bytes.
constexpr size_t kConfigVersions[] = {sizeof(gdn_config_t)};
constexpr size_t kBatchVersions[] = {offsetof(gdn_batch_t, non_spec_read_state_indices), sizeof(gdn_batch_t)};
constexpr size_t kTensorsVersions[] = {sizeof(gdn_tensors_t)};
static_assert(sizeof(void *) != 8 || (kConfigVersions[0] == 88 && kBatchVersions[0] == 112 && kTensorsVersions[0] == 184),
              "a version-1 struct layout changed: that breaks every caller built against 0.1.0 (ABI 1)");

// Copies a caller's versioned struct. An older caller (struct_size = the size of an earlier
// version) gets the defaults of `init` for the fields its header did not have; a newer (larger)
// struct is accepted only if the fields this library does not know are zero (their defaults).
// Only the caller's struct_size bytes are read.
template <class T, size_t N>
T copy_versioned(const T *in, const char *name, void (*init)(T *), const size_t (&versions)[N]) {
  if (!in) fail(GDN_ERROR_NULL_POINTER, std::string(name) + " is NULL");
  T out;
  init(&out);
  const size_t size = in->struct_size;
  const std::string what = std::string(name) + "->struct_size = " + str((int64_t)size);
  if (size < versions[0])
    fail(GDN_ERROR_BAD_STRUCT_SIZE, what + " is older than the oldest version this library accepts (" +
                                        str((int64_t)versions[0]) + " bytes, gdn_xpu.h of libgdn_xpu 0.1.0)");
  if (size < sizeof(T) && std::find(versions, versions + N, size) == versions + N) {
    std::string sizes;
    for (size_t v : versions) sizes += (sizes.empty() ? "" : ", ") + str((int64_t)v);
    fail(GDN_ERROR_BAD_STRUCT_SIZE, what + " is the size of no version of this struct (" + sizes + " bytes)");
  }
  const unsigned char *tail = reinterpret_cast<const unsigned char *>(in) + sizeof(T);
  for (size_t i = 0; i + sizeof(T) < size; ++i)
    if (tail[i])
      fail(GDN_ERROR_UNSUPPORTED, what + ": the caller sets fields newer than this library (version " + gdn_version() + ")");
  std::memcpy(&out, in, std::min(size, sizeof(T)));
  out.struct_size = sizeof(T);
  return out;
}

void require(bool ok, gdn_status_t status, const std::string &message) {
  if (!ok) fail(status, message);
}

void check_range(int64_t v, int64_t lo, int64_t hi, gdn_status_t status, const char *field) {
  if (v < lo || v > hi)
    fail(status, std::string(field) + " = " + str(v) + " is outside [" + str(lo) + ", " + str(hi) + "]");
}

void check_stride(int64_t &stride, int64_t dense, const char *field) {
  if (stride == 0) stride = dense;
  if (stride < dense) fail(GDN_ERROR_BAD_LAYOUT, std::string(field) + " = " + str(stride) + " < row width " + str(dense));
}

void check_usm(const sycl::queue &q, const void *p, const char *field) {
  if (!p) return;
  if (sycl::get_pointer_type(p, q.get_context()) == sycl::usm::alloc::unknown)
    fail(GDN_ERROR_BAD_POINTER, std::string(field) + " is not a USM allocation of the queue's context");
}

// Every array is aligned to its element size: what element loads need on any device. Wider vector
// accesses are the kernels' own business and never a reason to refuse a view: they check and fall
// back (common.hpp vstore_stream), or load through memcpy (load_act16).
void check_aligned(const void *p, size_t align, const char *what, const char *field) {
  const size_t off = (size_t)((uintptr_t)p % align);
  if (p && off)
    fail(GDN_ERROR_BAD_POINTER, std::string(field) + " = " + ptr_str(p) + " is not aligned to its element size (" +
                                    str((int64_t)align) + " bytes, " + what + "): " + str((int64_t)off) +
                                    " byte(s) past a boundary");
}

void need(const void *p, const char *field, const char *why) {
  if (!p) fail(GDN_ERROR_NULL_POINTER, std::string(field) + " is NULL but " + why);
}

// Host copies of the caller's metadata arrays. Arrays in host-accessible USM (host, shared) are
// read in place once the queue is idle: no command is enqueued. Device USM is copied by the
// queue into a per-thread staging buffer of that array kind, kept from call to call, never into
// a fresh vector: the OpenCL CPU runtime (intel-opencl-rt 2026.1) keeps ~106 bytes for every
// distinct pointer value a USM memcpy ever touched, for the life of the process, so reading into
// per-call vectors grew the process by ~14 bytes per call (README "Memory over many calls",
// tests/repro/usm_memcpy_growth.cpp).
class MetaReader {
 public:
  explicit MetaReader(sycl::queue &q) : q_(q) {}
  // Fills dst with n elements of src; `kind` names dst's staging buffer (one per array kind).
  template <class T>
  void read(std::vector<T> &dst, const T *src, int64_t n, int kind) {
    dst.resize((size_t)n);
    if (n <= 0 || !src) return;
    const size_t bytes = sizeof(T) * (size_t)n;
    const sycl::usm::alloc type = sycl::get_pointer_type(src, q_.get_context());
    if (type == sycl::usm::alloc::host || type == sycl::usm::alloc::shared) {
      direct_.push_back({dst.data(), src, bytes});
      return;
    }
    std::vector<char> &stage = staging()[kind];
    if (stage.size() < bytes) stage.resize(std::max(bytes, 2 * stage.size()));
    copies_.push_back(q_.memcpy(stage.data(), src, bytes));
    staged_.push_back({dst.data(), stage.data(), bytes});
  }
  // Waits for the copies (and, when an array is read in place, for all work on the queue).
  void finish() {
    for (auto &e : copies_) e.wait_and_throw();
    if (!direct_.empty()) q_.wait();
    for (const Copy &c : staged_) std::memcpy(c.dst, c.src, c.bytes);
    for (const Copy &c : direct_) std::memcpy(c.dst, c.src, c.bytes);
  }
  static constexpr int kKinds = 12;  // the metadata arrays read_metadata reads

 private:
  struct Copy {
    void *dst;
    const void *src;
    size_t bytes;
  };
  static std::vector<char> *staging() {
    thread_local std::vector<char> buffers[kKinds];
    return buffers;
  }
  sycl::queue &q_;
  std::vector<sycl::event> copies_;
  std::vector<Copy> staged_, direct_;
};

void check_start_loc(const std::vector<int32_t> &qsl, int32_t tokens, const char *field, const char *count_field) {
  if (qsl.empty()) return;
  require(qsl[0] == 0, GDN_ERROR_BAD_START_LOC, std::string(field) + "[0] = " + str(qsl[0]) + ", expected 0");
  for (size_t i = 1; i < qsl.size(); ++i)
    require(qsl[i] >= qsl[i - 1], GDN_ERROR_BAD_START_LOC,
            std::string(field) + " decreases at [" + str((int64_t)i) + "]: " + str(qsl[i - 1]) + " -> " + str(qsl[i]));
  require(qsl.back() == tokens, GDN_ERROR_BAD_START_LOC,
          std::string(field) + "[last] = " + str(qsl.back()) + " but " + count_field + " = " + str(tokens));
}

void check_slot(int32_t slot, const gdn_batch_t &b, int32_t num_slots, const std::string &field) {
  if (slot == b.pad_slot_id) return;
  require(slot >= 0 && slot < num_slots, GDN_ERROR_BAD_STATE_INDEX,
          field + " = " + str(slot) + " is outside [0, num_slots=" + str(num_slots) + ") and is not pad_slot_id (" +
              str(b.pad_slot_id) + ")");
}

// One use of a state slot by one sequence of the call. The rules between uses (gdn_xpu.h "State
// caches") are checked on these records sorted by slot, so the cost is O(uses log uses) whatever
// num_slots is: a table indexed by slot cost O(num_slots) per call (issue 18: 1 s at 134M slots).
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
    if (slot == c.batch.pad_slot_id) return;
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

// Full content checks of the metadata (GDN_VALIDATE_FULL): O(rows + sequences + slots addressed)
// time and memory, independent of num_slots.
void check_contents(const Checked &c) {
  const gdn_batch_t &b = c.batch;
  const HostMeta &m = c.meta;
  const int32_t slots = c.cfg.num_slots, cols = b.num_spec + 1, nns = c.num_non_spec_seqs;
  const int32_t pad = b.pad_slot_id;
  check_start_loc(m.ns_qsl, b.non_spec_token_count, "non_spec_query_start_loc", "non_spec_token_count");
  check_start_loc(m.s_qsl, b.spec_token_count, "spec_query_start_loc", "spec_token_count");

  // Values one by one: slots in range, counts of the spec sequences, start positions.
  for (int32_t i = 0; i < nns; ++i) {
    check_slot(m.ns_slots[(size_t)i], b, slots, "non_spec_state_indices[" + str(i) + "]");
    if (!m.ns_read.empty()) check_slot(m.ns_read[(size_t)i], b, slots, "non_spec_read_state_indices[" + str(i) + "]");
    if (!m.start_pos.empty())
      require(m.start_pos[(size_t)i] >= 0, GDN_ERROR_BAD_COUNT,
              "non_spec_start_pos[" + str(i) + "] = " + str(m.start_pos[(size_t)i]) + " is negative");
  }
  for (int32_t n = 0; n < b.num_spec_decodes; ++n) {
    const int32_t len = m.s_qsl[(size_t)n + 1] - m.s_qsl[(size_t)n];
    require(len <= cols, GDN_ERROR_BAD_START_LOC,
            "spec_query_start_loc: spec sequence " + str(n) + " has " + str(len) + " tokens > 1 + num_spec = " + str(cols));
    const int32_t a = m.accepted[(size_t)n];
    require(a >= 1 && a <= cols, GDN_ERROR_BAD_ACCEPTED,
            "num_accepted_tokens[" + str(n) + "] = " + str(a) + " is outside [1, 1 + num_spec = " + str(cols) + "]");
    for (int32_t t = 0; t < cols; ++t)
      check_slot(m.s_slots[(size_t)n * cols + t], b, slots, "spec_state_indices[" + str(n) + "][" + str(t) + "]");
    if (!m.s_read.empty()) check_slot(m.s_read[(size_t)n], b, slots, "spec_read_state_indices[" + str(n) + "]");
  }
  const int64_t ck_cols = m.ckpt.empty() ? 0 : b.checkpoint_cols;
  for (int64_t e = 0; e < (int64_t)m.ckpt.size(); ++e)
    check_slot(m.ckpt[(size_t)e], b, slots,
               "checkpoint_state_indices[" + str(e / ck_cols) + "][" + str(e % ck_cols) + "]");

  // Uses of slots, in the order the rules are stated (this order picks the use an error names).
  SlotUses u{c, {}};
  for (int32_t i = 0; i < nns; ++i)  // a zero-length sequence still claims its write slot
    u.add(m.ns_slots[(size_t)i], i, Use::Write, Field::NonSpecWrite);
  for (int32_t n = 0; n < b.num_spec_decodes; ++n)
    for (int32_t t = 0; t < m.s_qsl[(size_t)n + 1] - m.s_qsl[(size_t)n]; ++t)
      u.add(m.s_slots[(size_t)n * cols + t], nns + n, Use::Write, Field::SpecWrite, t);
  for (int32_t i = 0; i < nns; ++i) {  // reads other than the write slot itself
    if (m.ns_read.empty() || m.ns_qsl[(size_t)i + 1] == m.ns_qsl[(size_t)i] || m.ns_slots[(size_t)i] == pad) continue;
    if (!m.has_init.empty() && !m.has_init[(size_t)i]) continue;  // nothing is read
    if (m.ns_read[(size_t)i] != m.ns_slots[(size_t)i]) u.add(m.ns_read[(size_t)i], i, Use::Read, Field::NonSpecRead);
  }
  for (int32_t n = 0; n < b.num_spec_decodes; ++n) {
    if (m.s_qsl[(size_t)n + 1] == m.s_qsl[(size_t)n]) continue;
    if (!m.s_read.empty()) {
      u.add(m.s_read[(size_t)n], nns + n, Use::Read, Field::SpecRead);
    } else {  // SSM and SNAPSHOT conv read [n][A-1]; the ROLLED line [n][0] is a write slot already
      const int32_t col = m.accepted[(size_t)n] - 1;
      u.add(m.s_slots[(size_t)n * cols + col], nns + n, Use::Read, Field::SpecDefaultRead, col);
    }
  }
  if (b.checkpoint_interval > 0) {
    const int64_t I = b.checkpoint_interval;
    for (int32_t i = 0; i < nns; ++i) {
      const int64_t len = m.ns_qsl[(size_t)i + 1] - m.ns_qsl[(size_t)i];
      if (len == 0 || m.ns_slots[(size_t)i] == pad) continue;  // padding stores no checkpoints
      const int64_t p = m.start_pos.empty() ? 0 : m.start_pos[(size_t)i];
      const int64_t crossed = (p + len) / I - p / I;  // tokens j with (p + j + 1) % I == 0
      require(crossed <= b.checkpoint_cols, GDN_ERROR_BAD_COUNT,
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

  // Token rows: inside [0, num_actual_tokens), each claimed once.
  std::vector<uint8_t> owned((size_t)b.num_actual_tokens, 0);
  auto own_rows = [&](const std::vector<int32_t> &tok, int32_t count, const char *field, uint8_t tag) {
    for (int32_t j = 0; j < count; ++j) {
      const int64_t row = tok.empty() ? j : tok[(size_t)j];
      require(row >= 0 && row < b.num_actual_tokens, GDN_ERROR_BAD_TOKEN_INDEX,
              std::string(field) + "[" + str(j) + "] = " + str(row) + " is outside [0, num_actual_tokens=" +
                  str(b.num_actual_tokens) + ")" + (tok.empty() ? " (NULL index = identity)" : ""));
      require(!owned[(size_t)row], GDN_ERROR_BAD_TOKEN_INDEX,
              std::string(field) + "[" + str(j) + "] = row " + str(row) + " is already claimed by " +
                  (owned[(size_t)row] == 1 ? "a non-spec token" : "a spec token") +
                  (tok.empty() ? " (NULL index = identity)" : ""));
      owned[(size_t)row] = tag;
    }
  };
  own_rows(m.ns_tok, b.non_spec_token_count, "non_spec_token_indx", 1);
  own_rows(m.s_tok, b.spec_token_count, "spec_token_indx", 2);
}

// The batch stores block checkpoints (the checkpoint fields are read only then).
bool checkpoints(const Checked &c) { return c.batch.checkpoint_interval > 0 && c.num_non_spec_seqs > 0; }

// Every array given is USM of the queue's context and aligned to its element size.
void check_pointers(const Checked &c) {
  const gdn_batch_t &b = c.batch;
  const gdn_tensors_t &t = c.t;
  const sycl::queue &q = c.q;
  struct Array {
    const void *p;
    const char *field;
    size_t align;      // the element size
    const char *what;  // the element type, for the message
  };
  const size_t act = c.act_bytes, state = dtype_bytes(c.cfg.state_dtype);
  const char *act_t = c.cfg.act_dtype == GDN_DTYPE_F32 ? "f32 act_dtype" : c.cfg.act_dtype == GDN_DTYPE_F16 ? "f16 act_dtype" : "bf16 act_dtype";
  const Array arrays[] = {
      {b.non_spec_query_start_loc, "batch->non_spec_query_start_loc", 4, "int32"},
      {b.non_spec_state_indices, "batch->non_spec_state_indices", 4, "int32"},
      {b.has_initial_state, "batch->has_initial_state", 1, "uint8"},
      {b.non_spec_token_indx, "batch->non_spec_token_indx", 4, "int32"},
      {b.spec_query_start_loc, "batch->spec_query_start_loc", 4, "int32"},
      {b.spec_state_indices, "batch->spec_state_indices", 4, "int32"},
      {b.num_accepted_tokens, "batch->num_accepted_tokens", 4, "int32"},
      {b.spec_token_indx, "batch->spec_token_indx", 4, "int32"},
      {b.non_spec_read_state_indices, "batch->non_spec_read_state_indices", 4, "int32"},
      {b.spec_read_state_indices, "batch->spec_read_state_indices", 4, "int32"},
      {b.non_spec_start_pos, "batch->non_spec_start_pos", 4, "int32"},
      {checkpoints(c) ? b.checkpoint_state_indices : nullptr, "batch->checkpoint_state_indices", 4, "int32"},
      {t.mixed_qkv, "tensors->mixed_qkv", act, act_t},
      {t.conv_weight, "tensors->conv_weight", act, act_t},
      {t.conv_bias, "tensors->conv_bias", act, act_t},
      {t.conv_state, "tensors->conv_state", act, act_t},
      {t.conv_out, "tensors->conv_out", act, act_t},
      {t.a, "tensors->a", act, act_t},
      {t.b, "tensors->b", act, act_t},
      {t.A_log, "tensors->A_log", 4, "f32"},
      {t.dt_bias, "tensors->dt_bias", 4, "f32"},
      {t.g, "tensors->g", 4, "f32"},
      {t.beta, "tensors->beta", 4, "f32"},
      {t.ssm_state, "tensors->ssm_state", state, "state_dtype"},
      {t.core_attn_out, "tensors->core_attn_out", act, act_t},
      {t.z, "tensors->z", act, act_t},
      {t.norm_weight, "tensors->norm_weight", act, act_t},
      {t.workspace, "tensors->workspace", 4, "f32 and int32 scratch"}};
  for (const Array &a : arrays) {
    check_usm(q, a.p, a.field);
    check_aligned(a.p, a.align, a.what, a.field);
  }
}

// Host copies of the metadata arrays (waits for the work already on the queue).
void read_metadata(Checked &c) {
  const gdn_batch_t &b = c.batch;
  MetaReader r(c.q);
  HostMeta &m = c.meta;
  const int32_t nns = c.num_non_spec_seqs;
  if (nns > 0) {
    r.read(m.ns_qsl, b.non_spec_query_start_loc, (int64_t)nns + 1, 0);
    r.read(m.ns_slots, b.non_spec_state_indices, nns, 1);
    if (b.non_spec_token_indx) r.read(m.ns_tok, b.non_spec_token_indx, b.non_spec_token_count, 2);
    if (b.non_spec_read_state_indices) {  // has_initial_state == 0 means the read slot is not read
      r.read(m.ns_read, b.non_spec_read_state_indices, nns, 7);
      if (b.has_initial_state) r.read(m.has_init, b.has_initial_state, nns, 8);
    }
    if (b.non_spec_start_pos) r.read(m.start_pos, b.non_spec_start_pos, nns, 9);
    if (checkpoints(c) && b.checkpoint_cols > 0)
      r.read(m.ckpt, b.checkpoint_state_indices, (int64_t)nns * b.checkpoint_cols, 10);
  }
  if (b.num_spec_decodes > 0) {
    r.read(m.s_qsl, b.spec_query_start_loc, (int64_t)b.num_spec_decodes + 1, 3);
    r.read(m.s_slots, b.spec_state_indices, (int64_t)b.num_spec_decodes * (b.num_spec + 1), 4);
    r.read(m.accepted, b.num_accepted_tokens, b.num_spec_decodes, 5);
    if (b.spec_token_indx) r.read(m.s_tok, b.spec_token_indx, b.spec_token_count, 6);
    if (b.spec_read_state_indices) r.read(m.s_read, b.spec_read_state_indices, b.num_spec_decodes, 11);
  }
  r.finish();
}

}  // namespace

size_t dtype_bytes(int32_t dtype) {
  switch (dtype) {
    case GDN_DTYPE_F32: return 4;
    case GDN_DTYPE_F16: return 2;
    case GDN_DTYPE_BF16: return 2;
    default: return 0;
  }
}

gdn_config_t validate_config(const gdn_config_t *in) {
  gdn_config_t cfg = copy_versioned(in, "cfg", gdn_config_init, kConfigVersions);
  check_range(cfg.num_k_heads, 1, 1024, GDN_ERROR_BAD_SHAPE, "cfg->num_k_heads");
  check_range(cfg.num_v_heads, 1, 4096, GDN_ERROR_BAD_SHAPE, "cfg->num_v_heads");
  require(cfg.num_v_heads % cfg.num_k_heads == 0, GDN_ERROR_BAD_SHAPE,
          "cfg->num_v_heads = " + str(cfg.num_v_heads) + " is not a multiple of num_k_heads = " + str(cfg.num_k_heads));
  check_range(cfg.head_k_dim, 1, 256, GDN_ERROR_BAD_SHAPE, "cfg->head_k_dim");
  check_range(cfg.head_v_dim, 1, 256, GDN_ERROR_BAD_SHAPE, "cfg->head_v_dim");
  check_range(cfg.conv_width, 2, 8, GDN_ERROR_BAD_SHAPE, "cfg->conv_width");
  require(dtype_bytes(cfg.act_dtype) != 0, GDN_ERROR_BAD_DTYPE, "cfg->act_dtype = " + str(cfg.act_dtype) + " is not a gdn_dtype_t");
  require(dtype_bytes(cfg.state_dtype) != 0, GDN_ERROR_BAD_DTYPE,
          "cfg->state_dtype = " + str(cfg.state_dtype) + " is not a gdn_dtype_t");
  check_range(cfg.ssm_layout, 0, 1, GDN_ERROR_BAD_LAYOUT, "cfg->ssm_layout");
  check_range(cfg.conv_layout, 0, 1, GDN_ERROR_BAD_LAYOUT, "cfg->conv_layout");
  check_range(cfg.conv_spec_layout, 0, 1, GDN_ERROR_BAD_LAYOUT, "cfg->conv_spec_layout");
  check_range(cfg.num_slots, 1, INT32_MAX, GDN_ERROR_BAD_COUNT, "cfg->num_slots");
  check_range(cfg.conv_state_len, cfg.conv_width - 1, 1 << 20, GDN_ERROR_BAD_LAYOUT, "cfg->conv_state_len");
  const int64_t conv_dim = 2LL * cfg.num_k_heads * cfg.head_k_dim + (int64_t)cfg.num_v_heads * cfg.head_v_dim;
  check_stride(cfg.conv_slot_stride, conv_dim * cfg.conv_state_len, "cfg->conv_slot_stride");
  check_stride(cfg.ssm_slot_stride, (int64_t)cfg.num_v_heads * cfg.head_k_dim * cfg.head_v_dim, "cfg->ssm_slot_stride");
  require(cfg.scale >= 0.0f, GDN_ERROR_BAD_SHAPE, "cfg->scale = " + fstr(cfg.scale) + " is negative (0 = 1/sqrt(K))");
  if (cfg.scale == 0.0f) cfg.scale = 1.0f / std::sqrt((float)cfg.head_k_dim);
  require(cfg.l2norm_eps > 0.0f, GDN_ERROR_BAD_SHAPE, "cfg->l2norm_eps = " + fstr(cfg.l2norm_eps) + " must be > 0");
  require(cfg.norm_eps > 0.0f, GDN_ERROR_BAD_SHAPE, "cfg->norm_eps = " + fstr(cfg.norm_eps) + " must be > 0");
  require((cfg.flags & ~GDN_FLAG_ALL) == 0, GDN_ERROR_UNSUPPORTED, "cfg->flags has unknown bits: " + str(cfg.flags));
  return cfg;
}

gdn_batch_t validate_batch_counts(const gdn_batch_t *in) {
  gdn_batch_t b = copy_versioned(in, "batch", gdn_batch_init, kBatchVersions);
  check_range(b.num_prefills, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->num_prefills");
  check_range(b.num_decodes, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->num_decodes");
  check_range(b.num_spec_decodes, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->num_spec_decodes");
  check_range(b.num_spec, 0, 64, GDN_ERROR_BAD_COUNT, "batch->num_spec");
  check_range(b.num_actual_tokens, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->num_actual_tokens");
  check_range(b.non_spec_token_count, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->non_spec_token_count");
  check_range(b.spec_token_count, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->spec_token_count");
  check_range(b.validate, 0, 1, GDN_ERROR_BAD_COUNT, "batch->validate");
  require((int64_t)b.non_spec_token_count + b.spec_token_count == b.num_actual_tokens, GDN_ERROR_BAD_COUNT,
          "non_spec_token_count (" + str(b.non_spec_token_count) + ") + spec_token_count (" + str(b.spec_token_count) +
              ") != num_actual_tokens (" + str(b.num_actual_tokens) + ")");
  const int64_t non_spec_seqs = (int64_t)b.num_prefills + b.num_decodes;
  require(non_spec_seqs <= INT32_MAX, GDN_ERROR_BAD_COUNT, "num_prefills + num_decodes overflows int32");
  require(non_spec_seqs > 0 || b.non_spec_token_count == 0, GDN_ERROR_BAD_COUNT,
          "non_spec_token_count = " + str(b.non_spec_token_count) + " but there are no non-spec sequences");
  require(b.num_spec_decodes > 0 || b.spec_token_count == 0, GDN_ERROR_BAD_COUNT,
          "spec_token_count = " + str(b.spec_token_count) + " but num_spec_decodes = 0");
  require((int64_t)b.spec_token_count <= (int64_t)b.num_spec_decodes * (b.num_spec + 1), GDN_ERROR_BAD_COUNT,
          "spec_token_count = " + str(b.spec_token_count) + " > num_spec_decodes * (1 + num_spec) = " +
              str((int64_t)b.num_spec_decodes * (b.num_spec + 1)));
  check_range(b.checkpoint_interval, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->checkpoint_interval");
  require(b.checkpoint_interval % GDN_CHUNK_SIZE == 0, GDN_ERROR_BAD_COUNT,
          "batch->checkpoint_interval = " + str(b.checkpoint_interval) + " is not a multiple of GDN_CHUNK_SIZE (" +
              str(GDN_CHUNK_SIZE) + ")");
  check_range(b.checkpoint_cols, 0, INT32_MAX, GDN_ERROR_BAD_COUNT, "batch->checkpoint_cols");
  return b;
}

Checked validate_call(void *queue, const gdn_config_t *cfg_in, const gdn_batch_t *batch_in, const gdn_tensors_t *t_in, Op op) {
  if (!queue) fail(GDN_ERROR_BAD_QUEUE, "queue is NULL (pass a sycl::queue*, e.g. dpctl.SyclQueue.addressof_ref())");
  Checked c;
  c.q = *static_cast<sycl::queue *>(queue);
  c.cfg = validate_config(cfg_in);
  c.batch = validate_batch_counts(batch_in);
  c.t = copy_versioned(t_in, "tensors", gdn_tensors_init, kTensorsVersions);
  const gdn_config_t &cfg = c.cfg;
  gdn_batch_t &b = c.batch;
  gdn_tensors_t &t = c.t;
  c.conv_dim = 2 * cfg.num_k_heads * cfg.head_k_dim + cfg.num_v_heads * cfg.head_v_dim;
  c.num_non_spec_seqs = b.num_prefills + b.num_decodes;
  c.act_bytes = dtype_bytes(cfg.act_dtype);
  const int32_t hv = cfg.num_v_heads, ov = cfg.num_v_heads * cfg.head_v_dim;
  check_stride(t.mixed_qkv_stride, c.conv_dim, "tensors->mixed_qkv_stride");
  check_stride(t.conv_out_stride, c.conv_dim, "tensors->conv_out_stride");
  check_stride(t.ab_stride, hv, "tensors->ab_stride");
  check_stride(t.out_stride, ov, "tensors->out_stride");
  check_stride(t.z_stride, ov, "tensors->z_stride");

  const bool conv = op != Op::Delta, delta = op != Op::Conv;
  const bool work = b.num_actual_tokens > 0;
  if (conv && b.num_spec_decodes > 0 && cfg.conv_spec_layout == GDN_CONV_SPEC_ROLLED)
    require(cfg.conv_state_len >= cfg.conv_width - 1 + b.num_spec, GDN_ERROR_BAD_LAYOUT,
            "cfg->conv_state_len = " + str(cfg.conv_state_len) + " < W-1+num_spec = " +
                str(cfg.conv_width - 1 + b.num_spec) + " needed by GDN_CONV_SPEC_ROLLED");
  if (work && c.num_non_spec_seqs > 0) {
    need(b.non_spec_query_start_loc, "batch->non_spec_query_start_loc", "num_prefills + num_decodes > 0");
    need(b.non_spec_state_indices, "batch->non_spec_state_indices", "num_prefills + num_decodes > 0");
  }
  if (work && checkpoints(c) && b.checkpoint_cols > 0)
    need(b.checkpoint_state_indices, "batch->checkpoint_state_indices", "checkpoint_interval > 0 and checkpoint_cols > 0");
  if (work && b.num_spec_decodes > 0) {
    need(b.spec_query_start_loc, "batch->spec_query_start_loc", "num_spec_decodes > 0");
    need(b.spec_state_indices, "batch->spec_state_indices", "num_spec_decodes > 0");
    need(b.num_accepted_tokens, "batch->num_accepted_tokens", "num_spec_decodes > 0");
  }
  if (work && conv) {
    need(t.mixed_qkv, "tensors->mixed_qkv", "the conv stage reads it");
    need(t.conv_weight, "tensors->conv_weight", "the conv stage reads it");
    need(t.conv_state, "tensors->conv_state", "the conv stage reads and writes it");
    if (op == Op::Conv) need(t.conv_out, "tensors->conv_out", "gdn_causal_conv1d writes it");
  }
  if (work && delta) {
    if (op == Op::Delta) need(t.conv_out, "tensors->conv_out", "gdn_gated_delta_rule reads q|k|v from it");
    require(!t.g == !t.beta, GDN_ERROR_NULL_POINTER, "tensors->g and tensors->beta must be given together");
    if (!t.g) {
      need(t.a, "tensors->a", "no precomputed g/beta were given");
      need(t.b, "tensors->b", "no precomputed g/beta were given");
      need(t.A_log, "tensors->A_log", "no precomputed g/beta were given");
      need(t.dt_bias, "tensors->dt_bias", "no precomputed g/beta were given");
    }
    need(t.ssm_state, "tensors->ssm_state", "the delta rule reads and writes it");
    need(t.core_attn_out, "tensors->core_attn_out", "the delta rule writes it");
    if (op == Op::Attention && t.z) need(t.norm_weight, "tensors->norm_weight", "z is given (fused gated RMSNorm)");
  }
  if (!work) return c;

  check_pointers(c);

  // GDN_VALIDATE_FULL: read the metadata back and check its contents. GDN_VALIDATE_COUNTS trusts
  // the contents, except the start locations of a batch with prefills for the delta rule: the
  // chunk kernels walk whole prefills, and a decreasing or overlong start location would send them
  // outside the token rows (a crash, not a wrong result). Decode-only batches read nothing back.
  if (b.validate != GDN_VALIDATE_FULL) {
    if (delta && b.num_prefills > 0 && !(cfg.flags & GDN_FLAG_FORCE_RECURRENT)) {
      MetaReader r(c.q);
      r.read(c.meta.ns_qsl, b.non_spec_query_start_loc, (int64_t)c.num_non_spec_seqs + 1, 0);
      r.finish();
      check_start_loc(c.meta.ns_qsl, b.non_spec_token_count, "non_spec_query_start_loc", "non_spec_token_count");
    }
    return c;
  }
  read_metadata(c);
  check_contents(c);
  return c;
}

}  // namespace gdn
