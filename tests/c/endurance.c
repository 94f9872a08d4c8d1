/* endurance.c — many C-ABI calls of mixed batches in one process: resident memory, heap, calls/s
 * and per-call latency. tests/test_memory.py runs it for 20,000 calls (the RSS check);
 * tests/soak.sh for 1,000,000 (not in CI); both build it against the installed library.
 *   usage: gdn_endurance [calls] [warmup] [samples] [only]
 * `only` (0..6) repeats one kind of call instead of the cycle: batch 0..4 below, 5 the conv call,
 * 6 the delta-rule call (to find which call a growth comes from).
 * Tiny layer (H=1, HV=2, K=V=16, W=4, f32: the shapes of tests/test_attention.py, so no new
 * kernel builds). The calls cycle through five batches an engine would send, each with its own
 * persistent metadata buffers (as CUDA-graph-style engines keep them), in both validation modes:
 *   decode x8 (full), mixed prefill 70 + 2 decodes + 2 spec (full, token rows permuted),
 *   the same mixed batch (counts), spec-only x4 (full), two prefills 33 + 130 (counts),
 * every 7th call a gdn_causal_conv1d and every 11th a gdn_gated_delta_rule of the decode batch.
 * Latency = the call plus gdn_queue_wait (its results are ready), so calls/s is the synchronous
 * rate. RSS is sampled after `warmup` calls (first-use allocations of the runtime and the
 * library: kernel builds, workspace, staging buffers), then `samples` times evenly, and at the end.
 * Before the first and the last sample malloc_trim(0) returns free heap pages to the system:
 * otherwise the free space the warm-up leaves in the heap absorbs a leak of ~1 MB unseen by RSS.
 * Output: key=value lines (parsed by the test), then a summary line. Exit 0 unless a call failed. */
#define _GNU_SOURCE /* clock_gettime, sysconf, mallinfo2 under -std=c99 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gdn_xpu.h"

/* glibc: bytes in use in malloc's heap (all arenas) and malloc_trim; elsewhere heap reads 0. */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
#include <malloc.h>
static size_t heap_in_use(void) { return mallinfo2().uordblks; }
static void trim(void) { malloc_trim(0); }
#else
static size_t heap_in_use(void) { return 0; }
static void trim(void) {}
#endif

enum { H = 1, HV = 2, K = 16, V = 16, W = 4, S = 2, SLOTS = 32, C = 2 * H * K + HV * V, MAX_ROWS = 256 };

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static long rss_kb(void) {
  long pages = 0, rss = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    fclose(f);
  }
  return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static int by_value(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

static void *q;
static void *alloc(size_t bytes) {
  void *p = NULL;
  if (gdn_malloc_shared(q, bytes, &p) != GDN_SUCCESS) {
    fprintf(stderr, "gdn_malloc_shared: %s\n", gdn_last_error());
    exit(1);
  }
  memset(p, 0, bytes);
  return p;
}
static int32_t *ints(const int32_t *values, int n) {
  int32_t *p = alloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  memcpy(p, values, sizeof(int32_t) * (size_t)n);
  return p;
}

/* One batch: counts on the host, metadata in its own USM buffers. */
static gdn_batch_t make_batch(int validate, int num_prefills, int num_decodes, const int *ns_lens, const int *ns_slots,
                              int num_spec_decodes, const int *spec_lens, const int *spec_slots, const int *accepted,
                              int permute_rows) {
  gdn_batch_t b;
  gdn_batch_init(&b);
  b.validate = validate;
  b.num_prefills = num_prefills;
  b.num_decodes = num_decodes;
  b.num_spec_decodes = num_spec_decodes;
  b.num_spec = S;
  const int ns = num_prefills + num_decodes;
  int32_t qsl[64] = {0}, sqsl[64] = {0}, slots[64], sslots[64 * (S + 1)], acc[64];
  for (int i = 0; i < ns; ++i) qsl[i + 1] = qsl[i] + ns_lens[i], slots[i] = ns_slots[i];
  for (int n = 0; n < num_spec_decodes; ++n) {
    sqsl[n + 1] = sqsl[n] + spec_lens[n];
    acc[n] = accepted[n];
    for (int t = 0; t <= S; ++t) sslots[n * (S + 1) + t] = spec_slots[n * (S + 1) + t];
  }
  b.non_spec_token_count = qsl[ns];
  b.spec_token_count = sqsl[num_spec_decodes];
  b.num_actual_tokens = b.non_spec_token_count + b.spec_token_count;
  if (ns > 0) b.non_spec_query_start_loc = ints(qsl, ns + 1), b.non_spec_state_indices = ints(slots, ns);
  if (num_spec_decodes > 0) {
    b.spec_query_start_loc = ints(sqsl, num_spec_decodes + 1);
    b.spec_state_indices = ints(sslots, num_spec_decodes * (S + 1));
    b.num_accepted_tokens = ints(acc, num_spec_decodes);
  }
  if (permute_rows) { /* spec tokens first, then the non-spec ones: both index arrays non-trivial */
    int32_t rows[MAX_ROWS];
    for (int j = 0; j < b.non_spec_token_count; ++j) rows[j] = b.spec_token_count + j;
    b.non_spec_token_indx = ints(rows, b.non_spec_token_count);
    for (int j = 0; j < b.spec_token_count; ++j) rows[j] = j;
    b.spec_token_indx = ints(rows, b.spec_token_count);
  }
  return b;
}

#define CHECKED(call)                                                \
  do {                                                               \
    gdn_status_t st_ = (call);                                       \
    if (st_ != GDN_SUCCESS) {                                        \
      fprintf(stderr, "%s failed: %s\n", #call, gdn_last_error());   \
      return 1;                                                      \
    }                                                                \
  } while (0)

int main(int argc, char **argv) {
  const long calls = argc > 1 ? atol(argv[1]) : 20000;
  const long warmup = argc > 2 ? atol(argv[2]) : 5000;
  const long samples = argc > 3 ? atol(argv[3]) : 4;
  const int only = argc > 4 ? atoi(argv[4]) : -1;
  CHECKED(gdn_queue_create("default", &q));
  char name[256];
  CHECKED(gdn_device_name(q, name, sizeof name));

  gdn_config_t cfg;
  gdn_config_init(&cfg);
  cfg.num_k_heads = H; cfg.num_v_heads = HV; cfg.head_k_dim = K; cfg.head_v_dim = V; cfg.conv_width = W;
  cfg.act_dtype = GDN_DTYPE_F32; cfg.conv_state_len = W - 1; cfg.num_slots = SLOTS;

  /* Inputs: small deterministic values (the loop is about memory, not numerics). */
  float *x = alloc(sizeof(float) * MAX_ROWS * C), *ab = alloc(sizeof(float) * MAX_ROWS * HV);
  float *w = alloc(sizeof(float) * C * W), *alog = alloc(sizeof(float) * HV), *dtb = alloc(sizeof(float) * HV);
  for (int i = 0; i < MAX_ROWS * C; ++i) x[i] = 0.01f * (float)((i * 37) % 101 - 50);
  for (int i = 0; i < MAX_ROWS * HV; ++i) ab[i] = 0.02f * (float)((i * 13) % 41 - 20);
  for (int i = 0; i < C * W; ++i) w[i] = 0.05f * (float)((i * 7) % 9 - 4);
  for (int i = 0; i < HV; ++i) alog[i] = -0.5f, dtb[i] = 0.1f;
  gdn_tensors_t t;
  gdn_tensors_init(&t);
  t.mixed_qkv = x; t.a = ab; t.b = ab; t.conv_weight = w; t.A_log = alog; t.dt_bias = dtb;
  t.conv_state = alloc(sizeof(float) * SLOTS * C * (W - 1));
  t.ssm_state = alloc(sizeof(float) * SLOTS * HV * K * V);
  t.core_attn_out = alloc(sizeof(float) * MAX_ROWS * HV * V);
  gdn_tensors_t t_conv = t, t_delta = t;
  t_conv.conv_out = alloc(sizeof(float) * MAX_ROWS * C);
  t_delta.conv_out = t_conv.conv_out;

  const int dec_lens[8] = {1, 1, 1, 1, 1, 1, 1, 1}, dec_slots[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const int mix_lens[3] = {70, 1, 1}, mix_slots[3] = {8, 9, 10};
  const int mix_spec_lens[2] = {3, 2}, mix_spec_slots[2 * (S + 1)] = {11, 12, 13, 14, 15, 16}, mix_acc[2] = {1, 3};
  const int sp_lens[4] = {3, 3, 1, 2}, sp_acc[4] = {2, 1, 3, 1};
  const int sp_slots[4 * (S + 1)] = {17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28};
  const int pre_lens[2] = {33, 130}, pre_slots[2] = {29, 30};
  gdn_batch_t batches[5] = {
      make_batch(GDN_VALIDATE_FULL, 0, 8, dec_lens, dec_slots, 0, NULL, NULL, NULL, 0),
      make_batch(GDN_VALIDATE_FULL, 1, 2, mix_lens, mix_slots, 2, mix_spec_lens, mix_spec_slots, mix_acc, 1),
      make_batch(GDN_VALIDATE_COUNTS, 1, 2, mix_lens, mix_slots, 2, mix_spec_lens, mix_spec_slots, mix_acc, 1),
      make_batch(GDN_VALIDATE_FULL, 0, 0, NULL, NULL, 4, sp_lens, sp_slots, sp_acc, 0),
      make_batch(GDN_VALIDATE_COUNTS, 2, 0, pre_lens, pre_slots, 0, NULL, NULL, NULL, 0),
  };
  gdn_batch_t decode_counts = batches[0];
  decode_counts.validate = GDN_VALIDATE_COUNTS;

  /* Latencies, 4 bytes per call: every page written now, not during the run, where it would count
   * as growth (a zero memset after malloc would not do: the compiler turns the pair into calloc,
   * whose fresh pages stay untouched). */
  float *lat = malloc(sizeof(float) * (size_t)(calls > 0 ? calls : 1));
  if (!lat) return 1;
  for (long i = 0; i < calls; ++i) lat[i] = -1.0f;
  long rss0 = 0;
  size_t heap0 = 0;
  double t_start = 0;
  for (long i = -warmup; i < calls; ++i) {
    if (i == 0) {
      CHECKED(gdn_queue_wait(q));
      trim(); /* free heap pages back to the system, so later heap growth shows in RSS */
      rss0 = rss_kb();
      heap0 = heap_in_use();
      printf("device=%s\nrss_start_kb=%ld\nheap_start=%zu\n", name, rss0, heap0);
      fflush(stdout);
      t_start = now_us();
    }
    const double t0 = now_us();
    const long k = i + warmup;
    const int kind = only >= 0 ? only : k % 7 == 3 ? 5 : k % 11 == 5 ? 6 : (int)(k % 5);
    if (kind == 5) CHECKED(gdn_causal_conv1d(q, &cfg, &decode_counts, &t_conv));
    else if (kind == 6) CHECKED(gdn_gated_delta_rule(q, &cfg, &batches[0], &t_delta));
    else CHECKED(gdn_attention(q, &cfg, &batches[kind], &t));
    CHECKED(gdn_queue_wait(q));
    if (i >= 0) lat[i] = (float)(now_us() - t0);
    if (i >= 0 && samples > 0 && (i + 1) % (calls / samples > 0 ? calls / samples : 1) == 0) {
      printf("sample calls=%ld rss_kb=%ld heap=%zu\n", i + 1, rss_kb(), heap_in_use());
      fflush(stdout);
    }
  }
  const double secs = (now_us() - t_start) / 1e6;
  trim();
  const long rss1 = rss_kb();
  const size_t heap1 = heap_in_use();
  qsort(lat, (size_t)calls, sizeof(float), by_value);
  const float p50 = calls ? lat[calls / 2] : 0, p99 = calls ? lat[(long)(calls * 0.99)] : 0, mx = calls ? lat[calls - 1] : 0;
  printf("calls=%ld\nrss_end_kb=%ld\nheap_end=%zu\nseconds=%.2f\ncalls_per_s=%.0f\n", calls, rss1, heap1, secs,
         calls / (secs > 0 ? secs : 1));
  printf("p50_us=%.1f\np99_us=%.1f\nmax_us=%.1f\n", p50, p99, mx);
  printf("endurance: %ld calls, RSS %ld -> %ld kB (%+ld kB, %+.2f B/call), heap %+ld B, %.0f calls/s, "
         "latency p50 %.1f us p99 %.1f us max %.1f us (call + wait, %s)\n",
         calls, rss0, rss1, rss1 - rss0, calls ? (rss1 - rss0) * 1024.0 / calls : 0.0, (long)heap1 - (long)heap0,
         calls / (secs > 0 ? secs : 1), p50, p99, mx, name);
  free(lat);
  gdn_queue_destroy(q); /* USM buffers go with the process */
  return 0;
}
