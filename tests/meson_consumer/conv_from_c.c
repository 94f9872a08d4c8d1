/* conv_from_c.c — one causal_conv1d decode step on the SYCL CPU device, from C, checked here.
 * Exit 0 and "conv_from_c: ok" on success; on failure the library's message goes to stderr. */
#include <math.h>
#include <stdio.h>

#include <gdn_xpu.h>

#define TRY(call)                                                                      \
  do {                                                                                 \
    if ((call) != GDN_SUCCESS) {                                                       \
      fprintf(stderr, "conv_from_c: %s failed: %s\n", #call, gdn_last_error());        \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

int main(void) {
  enum { C = 12, W = 3, L = W - 1 }; /* H = HV = 1, K = V = 4: conv_dim 12; one slot */
  void *q = NULL;
  TRY(gdn_queue_create("cpu", &q));

  gdn_config_t cfg;
  gdn_batch_t batch;
  gdn_tensors_t t;
  gdn_config_init(&cfg);
  gdn_batch_init(&batch);
  gdn_tensors_init(&t);
  cfg.num_k_heads = 1; cfg.num_v_heads = 1; cfg.head_k_dim = 4; cfg.head_v_dim = 4;
  cfg.conv_width = W; cfg.conv_state_len = L; cfg.num_slots = 1; cfg.act_dtype = GDN_DTYPE_F32;

  float *x, *w, *state, *out;
  int32_t *qsl, *slot;
  TRY(gdn_malloc_shared(q, sizeof(float) * C, (void **)&x));
  TRY(gdn_malloc_shared(q, sizeof(float) * C * W, (void **)&w));
  TRY(gdn_malloc_shared(q, sizeof(float) * C * L, (void **)&state));
  TRY(gdn_malloc_shared(q, sizeof(float) * C, (void **)&out));
  TRY(gdn_malloc_shared(q, sizeof(int32_t) * 2, (void **)&qsl));
  TRY(gdn_malloc_shared(q, sizeof(int32_t), (void **)&slot));
  for (int c = 0; c < C; ++c) {
    x[c] = 0.1f * (float)(c + 1);
    for (int i = 0; i < W; ++i) w[c * W + i] = 0.5f - 0.1f * (float)i;
    for (int j = 0; j < L; ++j) state[c * L + j] = 0.0f; /* empty history */
  }
  qsl[0] = 0; qsl[1] = 1; slot[0] = 0;
  batch.num_decodes = 1; batch.num_actual_tokens = 1; batch.non_spec_token_count = 1;
  batch.non_spec_query_start_loc = qsl; batch.non_spec_state_indices = slot;
  t.mixed_qkv = x; t.conv_weight = w; t.conv_state = state; t.conv_out = out;

  TRY(gdn_causal_conv1d(q, &cfg, &batch, &t));
  TRY(gdn_queue_wait(q));
  int bad = 0;
  for (int c = 0; c < C; ++c) {
    const float y = w[c * W + W - 1] * x[c]; /* the history is zero: only the newest tap */
    const float want = y / (1.0f + expf(-y));  /* SiLU */
    if (fabsf(out[c] - want) > 1e-5f) {
      fprintf(stderr, "conv_from_c: out[%d] = %g, want %g\n", c, out[c], want);
      bad = 1;
    }
  }
  gdn_free(q, x); gdn_free(q, w); gdn_free(q, state); gdn_free(q, out); gdn_free(q, qsl); gdn_free(q, slot);
  gdn_queue_destroy(q);
  if (!bad) printf("conv_from_c: ok\n");
  return bad;
}
