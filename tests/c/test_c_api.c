/* test_c_api.c — the ABI from plain C: version, error API, struct sizes, and one real
 * causal_conv1d decode call checked against values computed here. Exit 0 = pass. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gdn_xpu.h"

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
  float expect[C], slot0[C * L];
  memcpy(slot0, state, sizeof slot0);
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

  /* A bad slot index is refused and changes nothing. */
  slots[0] = 7;
  float before[SLOTS * C * L];
  memcpy(before, state, sizeof before);
  st = gdn_causal_conv1d(q, &cfg, &batch, &t);
  CHECK(st == GDN_ERROR_BAD_STATE_INDEX, "slot 7 gave %d", (int)st);
  CHECK(strstr(gdn_last_error(), "non_spec_state_indices[0] = 7") != NULL, "message: %s", gdn_last_error());
  CHECK(memcmp(before, state, sizeof before) == 0, "failed call changed conv_state");

  gdn_free(q, x); gdn_free(q, w); gdn_free(q, state); gdn_free(q, out); gdn_free(q, qsl); gdn_free(q, slots);
  gdn_queue_destroy(q);
  printf(failures ? "c_api: %d checks FAILED\n" : "c_api: all checks passed\n", failures);
  return failures ? 1 : 0;
}
