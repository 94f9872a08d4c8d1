/* test_c_api.c — the ABI from plain C: version, error API, struct sizes, one real
 * causal_conv1d decode call checked against values computed here, the same call made by a
 * caller built against the previous header (version-1 structs), the call recorded into a graph and
 * replayed on new contents, and arrays that run past their allocations refused. Exit 0 = pass. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "gdn_xpu.h"

/* gdn_batch_t exactly as gdn_xpu.h of libgdn_xpu 0.1.0 declared it (struct version 1), i.e. what
 * a caller compiled against the previous header passes. gdn_config_t and gdn_tensors_t have not
 * changed since, so such a caller passes them at today's sizes. */
typedef struct gdn_batch_v1 {
  size_t struct_size;
  int32_t num_prefills, num_decodes, num_spec_decodes, num_spec, num_actual_tokens, non_spec_token_count,
      spec_token_count, pad_slot_id, validate, reserved0;
  const int32_t *non_spec_query_start_loc;
  const int32_t *non_spec_state_indices;
  const uint8_t *has_initial_state;
  const int32_t *non_spec_token_indx;
  const int32_t *spec_query_start_loc;
  const int32_t *spec_state_indices;
  const int32_t *num_accepted_tokens;
  const int32_t *spec_token_indx;
} gdn_batch_v1_t;
/* Append-only: every version-1 field sits where it sat. */
#define SAME_OFFSET(f) _Static_assert(offsetof(gdn_batch_v1_t, f) == offsetof(gdn_batch_t, f), #f " moved")
SAME_OFFSET(num_prefills);
SAME_OFFSET(validate);
SAME_OFFSET(non_spec_query_start_loc);
SAME_OFFSET(has_initial_state);
SAME_OFFSET(spec_state_indices);
SAME_OFFSET(spec_token_indx);
_Static_assert(sizeof(gdn_batch_v1_t) == offsetof(gdn_batch_t, non_spec_read_state_indices),
               "version 2 starts right after version 1");

static int failures = 0;
#define CHECK(cond, ...)                                       \
  do {                                                         \
    if (!(cond)) {                                             \
      ++failures;                                              \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);     \
      fprintf(stderr, __VA_ARGS__);                            \
      fprintf(stderr, "\n");                                   \
    }                                                          \
  } while (0)

int main(void) {
  printf("libgdn_xpu %s (ABI %d)\n", gdn_version(), gdn_abi_version());
  CHECK(gdn_abi_version() == GDN_ABI_VERSION, "ABI version mismatch");
  CHECK(gdn_sizeof_config() == sizeof(gdn_config_t), "gdn_config_t size differs");
  CHECK(gdn_sizeof_batch() == sizeof(gdn_batch_t), "gdn_batch_t size differs");
  CHECK(gdn_sizeof_tensors() == sizeof(gdn_tensors_t), "gdn_tensors_t size differs");
  CHECK(strcmp(gdn_status_string(GDN_SUCCESS), "success") == 0, "status string");
  CHECK(strcmp(gdn_status_string(12345), "unknown status") == 0, "unknown status string");

  gdn_config_t cfg;
  gdn_batch_t batch;
  gdn_tensors_t t;
  gdn_config_init(&cfg);
  gdn_batch_init(&batch);
  gdn_tensors_init(&t);
  CHECK(batch.pad_slot_id == -1, "default pad_slot_id");

  /* The elements a call reads of each metadata array: 3 decodes read 4 start locations and 3 slots,
   * the spec group's arrays nothing; inconsistent counts are refused. */
  {
    gdn_batch_t b = batch;
    b.num_decodes = b.num_actual_tokens = b.non_spec_token_count = 3;
    int64_t n[6];
    CHECK(gdn_batch_array_elements(&b, n, 6) == GDN_SUCCESS, "array elements: %s", gdn_last_error());
    CHECK(n[0] == 4 && n[1] == 3 && n[2] == 3 && n[3] == 3 && n[4] == 0 && n[5] == 0,
          "array elements %lld %lld %lld %lld %lld %lld", (long long)n[0], (long long)n[1], (long long)n[2],
          (long long)n[3], (long long)n[4], (long long)n[5]);
    b.num_actual_tokens = 4;
    CHECK(gdn_batch_array_elements(&b, n, 6) == GDN_ERROR_BAD_COUNT, "inconsistent counts accepted");
  }

  /* Errors: NULL queue, then a bad config on a real queue. */
  gdn_status_t st = gdn_causal_conv1d(NULL, &cfg, &batch, &t);
  CHECK(st == GDN_ERROR_BAD_QUEUE, "NULL queue gave %d", (int)st);
  CHECK(strstr(gdn_last_error(), "queue") != NULL, "message: %s", gdn_last_error());

  void *q = NULL;
  st = gdn_queue_create("default", &q);
  CHECK(st == GDN_SUCCESS, "queue: %s", gdn_last_error());
  if (st != GDN_SUCCESS) return 1;
  char name[256];
  gdn_device_name(q, name, sizeof name);
  printf("device: %s\n", name);

  st = gdn_causal_conv1d(q, &cfg, &batch, &t); /* num_k_heads = 0 */
  CHECK(st == GDN_ERROR_BAD_SHAPE, "zero dims gave %d", (int)st);
  CHECK(strstr(gdn_last_error(), "cfg->num_k_heads") != NULL, "message: %s", gdn_last_error());
  cfg.struct_size = 8;
  st = gdn_causal_conv1d(q, &cfg, &batch, &t);
  CHECK(st == GDN_ERROR_BAD_STRUCT_SIZE, "old struct_size gave %d", (int)st);

  /* One decode step of a tiny layer: H=HV=1, K=V=4 -> conv_dim 12, W=3, f32, 2 slots. */
  enum { C = 12, W = 3, SLOTS = 2, L = W - 1 };
  gdn_config_init(&cfg);
  cfg.num_k_heads = 1; cfg.num_v_heads = 1; cfg.head_k_dim = 4; cfg.head_v_dim = 4;
  cfg.conv_width = W; cfg.act_dtype = GDN_DTYPE_F32; cfg.conv_state_len = L; cfg.num_slots = SLOTS;
  cfg.conv_layout = GDN_CONV_DIM_MAJOR;
  float *x, *w, *state, *out;
  int32_t *qsl, *slots;
  gdn_malloc_shared(q, sizeof(float) * C, (void **)&x);
  gdn_malloc_shared(q, sizeof(float) * C * W, (void **)&w);
  gdn_malloc_shared(q, sizeof(float) * SLOTS * C * L, (void **)&state);
  gdn_malloc_shared(q, sizeof(float) * C, (void **)&out);
  gdn_malloc_shared(q, sizeof(int32_t) * 2, (void **)&qsl);
  gdn_malloc_shared(q, sizeof(int32_t) * 1, (void **)&slots);
  for (int c = 0; c < C; ++c) {
    x[c] = 0.1f * (float)(c + 1);
    for (int i = 0; i < W; ++i) w[c * W + i] = 0.05f * (float)(i + 1) - 0.01f * (float)c;
    for (int s = 0; s < SLOTS; ++s)
      for (int j = 0; j < L; ++j) state[(s * C + c) * L + j] = 0.3f * (float)(s + 1) - 0.02f * (float)(c + j);
  }
  qsl[0] = 0; qsl[1] = 1; slots[0] = 1;
  batch.num_decodes = 1; batch.num_actual_tokens = 1; batch.non_spec_token_count = 1;
  batch.non_spec_query_start_loc = qsl; batch.non_spec_state_indices = slots;
  t.mixed_qkv = x; t.conv_weight = w; t.conv_state = state; t.conv_out = out;
  float expect[C], slot0[C * L], initial[SLOTS * C * L];
  memcpy(slot0, state, sizeof slot0);
  memcpy(initial, state, sizeof initial);
  for (int c = 0; c < C; ++c) {
    const float *h = state + (1 * C + c) * L;
    float y = w[c * W + 0] * h[0] + w[c * W + 1] * h[1] + w[c * W + 2] * x[c];
    expect[c] = y / (1.0f + expf(-y));
  }
  float old1 = state[(1 * C + 5) * L + 1];
  st = gdn_causal_conv1d(q, &cfg, &batch, &t);
  CHECK(st == GDN_SUCCESS, "conv: %s", gdn_last_error());
  gdn_queue_wait(q);
  for (int c = 0; c < C; ++c) CHECK(fabsf(out[c] - expect[c]) < 1e-5f, "out[%d] = %g, want %g", c, out[c], expect[c]);
  CHECK(state[(1 * C + 5) * L + 0] == old1, "state shifted");
  CHECK(state[(1 * C + 5) * L + 1] == x[5], "newest input stored");
  CHECK(memcmp(slot0, state, sizeof slot0) == 0, "slot 0 was not addressed and must be unchanged");

  /* The same call from a caller built against the previous header: a version-1 batch (its
   * struct_size), followed in memory by bytes that are not part of it (0xA5 here), which the
   * library must not read. Same result, bit for bit. */
  {
    float out_v2[C], state_v2[SLOTS * C * L];
    memcpy(out_v2, out, sizeof out_v2);
    memcpy(state_v2, state, sizeof state_v2);
    memcpy(state, initial, sizeof initial);
    for (int c = 0; c < C; ++c) out[c] = -1.0f;
    struct {
      gdn_batch_v1_t batch;
      unsigned char after[sizeof(gdn_batch_t)];
    } old;
    memset(&old, 0xA5, sizeof old);
    old.batch.struct_size = sizeof(gdn_batch_v1_t);
    old.batch.num_prefills = 0; old.batch.num_decodes = 1; old.batch.num_spec_decodes = 0; old.batch.num_spec = 0;
    old.batch.num_actual_tokens = 1; old.batch.non_spec_token_count = 1; old.batch.spec_token_count = 0;
    old.batch.pad_slot_id = -1; old.batch.validate = GDN_VALIDATE_FULL; old.batch.reserved0 = 0;
    old.batch.non_spec_query_start_loc = qsl; old.batch.non_spec_state_indices = slots;
    old.batch.has_initial_state = NULL; old.batch.non_spec_token_indx = NULL; old.batch.spec_query_start_loc = NULL;
    old.batch.spec_state_indices = NULL; old.batch.num_accepted_tokens = NULL; old.batch.spec_token_indx = NULL;
    st = gdn_causal_conv1d(q, &cfg, (const gdn_batch_t *)&old.batch, &t);
    CHECK(st == GDN_SUCCESS, "version-1 batch: %s", gdn_last_error());
    gdn_queue_wait(q);
    CHECK(memcmp(out, out_v2, sizeof out_v2) == 0, "version-1 batch: outputs differ from the version-2 call");
    CHECK(memcmp(state, state_v2, sizeof state_v2) == 0, "version-1 batch: conv_state differs from the version-2 call");
    old.batch.struct_size = sizeof(gdn_batch_v1_t) - 8; /* older than any version */
    st = gdn_causal_conv1d(q, &cfg, (const gdn_batch_t *)&old.batch, &t);
    CHECK(st == GDN_ERROR_BAD_STRUCT_SIZE, "a struct older than version 1 gave %d", (int)st);
  }

  /* A bad slot index is refused and changes nothing. */
  slots[0] = 7;
  float before[SLOTS * C * L];
  memcpy(before, state, sizeof before);
  st = gdn_causal_conv1d(q, &cfg, &batch, &t);
  CHECK(st == GDN_ERROR_BAD_STATE_INDEX, "slot 7 gave %d", (int)st);
  CHECK(strstr(gdn_last_error(), "non_spec_state_indices[0] = 7") != NULL, "message: %s", gdn_last_error());
  CHECK(memcmp(before, state, sizeof before) == 0, "failed call changed conv_state");
  slots[0] = 1;

  /* A graph (gdn_xpu.h "Graphs"): the call recorded once with GDN_VALIDATE_COUNTS (recording runs
   * nothing), then new inputs and another slot written into the same arrays and the graph replayed:
   * it computes the call on the new contents. */
  {
    batch.validate = GDN_VALIDATE_COUNTS;
    gdn_graph_t *g = NULL;
    st = gdn_graph_begin(q, &g);
    CHECK(st == GDN_SUCCESS, "gdn_graph_begin: %s", gdn_last_error());
    CHECK(gdn_queue_recording(q) == 1, "the queue does not report its recording");
    memcpy(before, state, sizeof before);
    st = gdn_causal_conv1d(q, &cfg, &batch, &t);
    CHECK(st == GDN_SUCCESS, "recorded conv: %s", gdn_last_error());
    st = gdn_graph_end(g);
    CHECK(st == GDN_SUCCESS, "gdn_graph_end: %s", gdn_last_error());
    CHECK(gdn_queue_recording(q) == 0, "still recording after gdn_graph_end");
    CHECK(memcmp(before, state, sizeof before) == 0, "the recording ran the call");
    slots[0] = 0;
    for (int c = 0; c < C; ++c) {
      x[c] = -0.07f * (float)(c + 2);
      const float *h = state + (0 * C + c) * L;
      float y = w[c * W + 0] * h[0] + w[c * W + 1] * h[1] + w[c * W + 2] * x[c];
      expect[c] = y / (1.0f + expf(-y));
    }
    for (int rep = 0; rep < 2; ++rep) { /* the second replay convolves the window the first stored */
      st = gdn_graph_replay(q, g);
      CHECK(st == GDN_SUCCESS, "gdn_graph_replay: %s", gdn_last_error());
      gdn_queue_wait(q);
      for (int c = 0; c < C; ++c)
        CHECK(fabsf(out[c] - expect[c]) < 1e-5f, "replay %d: out[%d] = %g, want %g", rep, c, out[c], expect[c]);
      CHECK(state[(0 * C + 5) * L + 1] == x[5], "replay %d: newest input not stored in slot 0", rep);
      for (int c = 0; c < C; ++c) {
        const float *h = state + (0 * C + c) * L;
        float y = w[c * W + 0] * h[0] + w[c * W + 1] * h[1] + w[c * W + 2] * x[c];
        expect[c] = y / (1.0f + expf(-y));
      }
    }
    gdn_graph_destroy(g);
    slots[0] = 1;
    batch.validate = GDN_VALIDATE_FULL;
  }

  /* Arrays running past their allocations: conv_out one element short of the row the call writes,
   * conv_state one element short of its num_slots slots (the slot addressed, 1, is the last one).
   * Each is refused with the array, the bytes it needs and the bytes it has named; nothing is
   * written, in it or in the allocation made after it. */
  {
    float *short_out, *short_state, *after;
    gdn_malloc_shared(q, sizeof(float) * (C - 1), (void **)&short_out);
    gdn_malloc_shared(q, sizeof(float) * (SLOTS * C * L - 1), (void **)&short_state);
    gdn_malloc_shared(q, sizeof(float) * 16, (void **)&after);
    for (int i = 0; i < C - 1; ++i) short_out[i] = -1.0f;
    memcpy(short_state, state, sizeof(float) * (SLOTS * C * L - 1));
    for (int i = 0; i < 16; ++i) after[i] = 7.0f;
    char needs[64], has[96];
    t.conv_out = short_out;
    st = gdn_causal_conv1d(q, &cfg, &batch, &t);
    CHECK(st == GDN_ERROR_BAD_POINTER, "conv_out one element short gave %d", (int)st);
    snprintf(needs, sizeof needs, "needs %d bytes", (int)(sizeof(float) * C));
    snprintf(has, sizeof has, "its allocation has %d bytes from that pointer on", (int)(sizeof(float) * (C - 1)));
    CHECK(strstr(gdn_last_error(), "tensors->conv_out") && strstr(gdn_last_error(), needs) &&
              strstr(gdn_last_error(), has), "message: %s", gdn_last_error());
    gdn_queue_wait(q); /* (a failed call enqueues nothing: this only makes the check below airtight) */
    for (int i = 0; i < C - 1; ++i) CHECK(short_out[i] == -1.0f, "short conv_out written at %d", i);
    t.conv_out = out;
    t.conv_state = short_state;
    st = gdn_causal_conv1d(q, &cfg, &batch, &t);
    CHECK(st == GDN_ERROR_BAD_POINTER, "conv_state one element short gave %d", (int)st);
    snprintf(needs, sizeof needs, "needs %d bytes", (int)(sizeof(float) * SLOTS * C * L));
    CHECK(strstr(gdn_last_error(), "tensors->conv_state") && strstr(gdn_last_error(), needs), "message: %s",
          gdn_last_error());
    gdn_queue_wait(q);
    CHECK(memcmp(short_state, state, sizeof(float) * (SLOTS * C * L - 1)) == 0, "short conv_state written");
    for (int i = 0; i < 16; ++i) CHECK(after[i] == 7.0f, "the allocation after the short arrays was written");
    t.conv_state = state;
    gdn_free(q, short_out); gdn_free(q, short_state); gdn_free(q, after);
  }

  gdn_free(q, x); gdn_free(q, w); gdn_free(q, state); gdn_free(q, out); gdn_free(q, qsl); gdn_free(q, slots);
  gdn_queue_destroy(q);
  printf(failures ? "c_api: %d checks FAILED\n" : "c_api: all checks passed\n", failures);
  return failures ? 1 : 0;
}
