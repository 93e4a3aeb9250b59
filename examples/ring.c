/* ring.c — a host program using librda's ring API: one attention over P ranks, each holding
 * only its N/P rows of q, k, v and o. The ranks are P threads of this process sharing one
 * rda_ring_world (virtual ranks); across processes or GPUs the same calls take an NCCL
 * communicator in rda_ring_desc instead. Every rank's rows are checked against the
 * single-device rda_forward. Runs on the CPU emulator device (host pointers). */
#include <math.h>
#include <pthread.h>
#include <rda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 4 ranks of 32 rows: branch 0's segments (16) lie inside one rank and need no transfer;
 * branch 1's (64, dilation 2) span two ranks, whose K/V rows the ring moves. */
enum { P = 4, B = 2, N = 128, H = 4, HKV = 2, D = 32, K = 2 };
static const long long kSeg[K] = {16, 64}, kDil[K] = {1, 2};

/* ---- inputs: normal(0, 1) draws rounded to bf16 ---- */
static uint64_t rng = 0x2545f4914f6cdd1dull;
static double uniform(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}
static uint16_t bf16_normal(void) { /* round to nearest even */
  const float f = (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()));
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static uint16_t q[B * N * H * D], k[B * N * HKV * D], v[B * N * HKV * D]; /* the whole sequence */

/* One rank: what its thread was given, and what it returns to main. */
typedef struct rank_job {
  int rank;
  rda_ring_world *world;
  rda_plan *plan;
  long long lo, hi; /* its global rows [lo, hi) */
  float *o;         /* its output rows [B, hi - lo, H, D], fp32 */
  rda_ring_stats stats;
  rda_status status;
  char error[512]; /* the rank's rda_last_error line when status != RDA_OK */
} rank_job;

/* Rows [lo, hi) of a global [B, N, heads, D] array into a new [B, hi - lo, heads, D] one. */
static uint16_t *take_rows(const uint16_t *global, int heads, long long lo, long long hi) {
  const size_t row = (size_t)heads * D, n = (size_t)(hi - lo);
  uint16_t *local = aligned_alloc(256, ((size_t)B * n * row * 2 + 255) / 256 * 256);
  if (local == NULL) return NULL;
  for (int b = 0; b < B; ++b)
    memcpy(local + (size_t)b * n * row, global + ((size_t)b * N + (size_t)lo) * row, n * row * 2);
  return local;
}

/* Record this rank's failure and leave: rda_last_error(NULL) is this thread's own failure
 * (the context's may be another rank's). */
#define RANK_FAIL(s, ...)                             \
  do {                                                \
    j->status = (s);                                  \
    snprintf(j->error, sizeof j->error, __VA_ARGS__); \
    goto done;                                        \
  } while (0)
#define RANK_CHECK(call)                                         \
  do {                                                           \
    rda_status s_ = (call);                                      \
    if (s_ != RDA_OK) RANK_FAIL(s_, "%s", rda_last_error(NULL)); \
  } while (0)

static void *rank_main(void *arg) {
  rank_job *j = arg;
  rda_ring *ring = NULL;
  uint16_t *lq = NULL, *lk = NULL, *lv = NULL;
  void *ws = NULL;
  long long rows = 0;
  size_t ws_bytes = 0;
  long long qs[4] = {B, 0, H, D}, kvs[4] = {B, 0, HKV, D}; /* [B, rows, heads, D] */
  rda_tensor tq, tk, tv, to;
  rda_ring_desc desc = RDA_RING_DESC_INIT;
  desc.n = N, desc.ranks = P, desc.rank = j->rank, desc.layout = RDA_LAYOUT_CONTIGUOUS;
  desc.world = j->world;
  RANK_CHECK(rda_ring_create(&ring, j->plan, &desc)); /* waits for every rank to join */
  long long lo[2], hi[2]; /* zigzag gives up to two pieces; contiguous always one */
  RANK_CHECK(rda_ring_rows(ring, &rows, NULL, lo, hi));
  j->lo = lo[0], j->hi = hi[0];

  /* This rank's rows only: nothing here is the size of the whole sequence. */
  lq = take_rows(q, H, j->lo, j->hi), lk = take_rows(k, HKV, j->lo, j->hi);
  lv = take_rows(v, HKV, j->lo, j->hi);
  j->o = aligned_alloc(256, ((size_t)(B * rows * H * D) * 4 + 255) / 256 * 256);
  if (!lq || !lk || !lv || !j->o) RANK_FAIL(RDA_ERR_OUT_OF_MEMORY, "out of host memory");
  for (long long i = 0; i < B * rows * H * D; ++i) j->o[i] = NAN; /* unwritten outputs show */
  qs[1] = kvs[1] = rows;
  RANK_CHECK(rda_tensor_contiguous(&tq, lq, RDA_BF16, 4, qs));
  RANK_CHECK(rda_tensor_contiguous(&tk, lk, RDA_BF16, 4, kvs));
  RANK_CHECK(rda_tensor_contiguous(&tv, lv, RDA_BF16, 4, kvs));
  RANK_CHECK(rda_tensor_contiguous(&to, j->o, RDA_FP32, 4, qs));

  RANK_CHECK(rda_ring_workspace_size(ring, B, 0, &ws_bytes));
  ws = aligned_alloc(256, (ws_bytes + 256) / 256 * 256); /* never 0 bytes; cudaMalloc on a GPU */
  if (ws == NULL) RANK_FAIL(RDA_ERR_OUT_OF_MEMORY, "out of host memory");
  /* Every rank calls this together; it returns RDA_OK on all ranks or an error on all. */
  RANK_CHECK(rda_ring_forward(ring, &tq, &tk, &tv, &to, NULL, ws, ws_bytes, NULL)); /* no lse */
  RANK_CHECK(rda_ring_get_stats(ring, &j->stats));
done:
  /* A failure of this rank alone (here: out of memory) must reach the others at once: without
   * the abort they would find out only at their timeout. After a failed ring call it is a no-op. */
  if (j->status != RDA_OK && ring != NULL) rda_ring_abort(ring, j->error);
  rda_ring_destroy(ring);
  free(ws), free(lq), free(lk), free(lv);
  return NULL;
}

#define CHECK(call)                                                                             \
  do {                                                                                          \
    rda_status s_ = (call);                                                                     \
    if (s_ != RDA_OK) {                                                                         \
      fprintf(stderr, "ring: %s: %s: %s\n", #call, rda_status_string(s_), rda_last_error(ctx)); \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

int main(void) {
  for (int i = 0; i < B * N * H * D; ++i) q[i] = bf16_normal();
  for (int i = 0; i < B * N * HKV * D; ++i) k[i] = bf16_normal(), v[i] = bf16_normal();

  rda_ctx *ctx = NULL;
  CHECK(rda_ctx_create_emulator(&ctx));
  rda_attn_config cfg = RDA_CONFIG_INIT;
  cfg.heads = H, cfg.kv_heads = HKV, cfg.head_dim = D, cfg.dtype = RDA_BF16, cfg.causal = 1;
  cfg.nbranch = K;
  for (int i = 0; i < K; ++i) cfg.segments[i] = kSeg[i], cfg.dilations[i] = kDil[i];
  rda_plan *plan = NULL;
  CHECK(rda_plan_create(&plan, ctx, &cfg, RDA_PLAN_FORWARD));

  /* The single-device result, to compare the ranks with. */
  static float o1[B * N * H * D];
  const long long qs[4] = {B, N, H, D}, kvs[4] = {B, N, HKV, D};
  rda_tensor tq, tk, tv, to;
  CHECK(rda_tensor_contiguous(&tq, q, RDA_BF16, 4, qs));
  CHECK(rda_tensor_contiguous(&tk, k, RDA_BF16, 4, kvs));
  CHECK(rda_tensor_contiguous(&tv, v, RDA_BF16, 4, kvs));
  CHECK(rda_tensor_contiguous(&to, o1, RDA_FP32, 4, qs));
  size_t ws_bytes = 0;
  CHECK(rda_plan_workspace_size(plan, B, N, &ws_bytes));
  void *ws = aligned_alloc(256, (ws_bytes + 256) / 256 * 256);
  if (ws == NULL) {
    fprintf(stderr, "ring: out of host memory\n");
    return 1;
  }
  CHECK(rda_forward(plan, &tq, &tk, &tv, &to, NULL, ws, ws_bytes, NULL));
  free(ws);

  /* The ring: one world of P virtual ranks, one thread (and one rda_ring) per rank. */
  rda_ring_world *world = NULL;
  CHECK(rda_ring_world_create(&world, ctx, P, 30.0 /* s per ring operation */));
  rank_job jobs[P];
  pthread_t threads[P];
  memset(jobs, 0, sizeof jobs);
  int started = 0;
  for (; started < P; ++started) {
    jobs[started].rank = started, jobs[started].world = world, jobs[started].plan = plan;
    if (pthread_create(&threads[started], NULL, rank_main, &jobs[started]) != 0) break;
  }
  /* Ranks that never started make the others fail after the timeout (no hang). */
  for (int p = 0; p < started; ++p) pthread_join(threads[p], NULL);
  rda_ring_world_destroy(world); /* after every rank's rda_ring_destroy */
  rda_plan_destroy(plan);        /* the rings kept their own references; now unused */
  if (started < P) fprintf(stderr, "ring: pthread_create failed for rank %d\n", started);

  int ok = started == P;
  unsigned long long sent = 0, received = 0;
  printf("rank  rows [lo, hi)   bytes sent  bytes received  peak bytes  max|o - o1|  rel_l2\n");
  for (int p = 0; p < started; ++p) {
    const rank_job *j = &jobs[p];
    if (j->status != RDA_OK) {
      fprintf(stderr, "ring: rank %d: %s: %s\n", p, rda_status_string(j->status), j->error);
      ok = 0;
      continue;
    }
    const long long rows = j->hi - j->lo;
    double max_err = 0, num = 0, den = 0;
    for (long long b = 0; b < B; ++b)
      for (long long i = 0; i < rows * H * D; ++i) {
        const double want = o1[(b * N + j->lo) * H * D + i];
        const double e = fabs((double)j->o[b * rows * H * D + i] - want);
        max_err = e > max_err || isnan(e) ? e : max_err; /* a NaN (unwritten) sticks */
        num += e * e, den += want * want;
      }
    const double rel = sqrt(num / den);
    printf("%4d  %4lld [%3lld, %3lld)  %10llu  %14llu  %10llu  %11.3g  %.3g\n", p, rows, j->lo,
           j->hi, j->stats.bytes_sent, j->stats.bytes_received, j->stats.peak_bytes, max_err, rel);
    sent += j->stats.bytes_sent, received += j->stats.bytes_received;
    /* Not bit-equal: the kernels round the softmax weights to bf16 for the P.V product, and a
     * rank sees the remote keys in other blocks than the single device does. SPEC §5 bounds
     * both against the exact result: rel_l2 <= 1e-2 for bf16 inputs. */
    ok = ok && rel <= 1e-2 && j->stats.rows == rows;
  }
  /* Every transfer is counted once by its sender and once by its receiver; and branch 1 spans
   * ranks, so some K/V rows must have moved. */
  if (ok && (sent != received || sent == 0)) {
    fprintf(stderr, "ring: %llu bytes sent in all, %llu received\n", sent, received);
    ok = 0;
  }
  for (int p = 0; p < P; ++p) free(jobs[p].o);
  rda_ctx_destroy(ctx);
  printf("ring: %s (%d ranks of %d rows against the single-device rda_forward, rel_l2 <= 1e-2)\n",
         ok ? "PASS" : "FAIL", P, N / P);
  return ok ? 0 : 1;
}
