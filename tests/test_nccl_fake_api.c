/* test_nccl_fake_api.c — the public ring API over NCCL (runtime/api_ring.c) on P = 3 ranks
 * without a GPU: CTest points LD_LIBRARY_PATH at the fake libcuda.so.1 and libnccl.so.2
 * (tests/fake/), so rda_ctx_create_cuda opens the fake's one sm_90 device and rda_plan_create
 * compiles with the real NVRTC and loads the cubins into the fake (nothing is launched). Each
 * rank is a thread with its own context and plan, so rda_last_error(ctx) is its own.
 * Checked: rda_ring_create from one unique id on every rank, its rows, and the release of the
 * communicators; a rank whose desc fails the shape checks (zigzag, N % 2P != 0) still joins to
 * tell the others, which then fail at once naming it, with communicators rda made and with
 * the caller's (never aborted, and usable for a correct ring afterwards). */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
// clang-format on

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rda.h"
#include "rda_test.h"

#if defined(__has_include) && defined(RDA_TEST_FAKE_LIBS)
#if __has_include(<nccl.h>) && __has_include(<cuda.h>)
#define TEST_HAVE_FAKE 1
#endif
#endif

#ifndef TEST_HAVE_FAKE

static void test_nccl_fake_api_not_built(void **state) {
  (void)state;
  print_message("skipped: no nccl.h and cuda.h here, so neither the transport nor the fakes\n");
  skip();
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_nccl_fake_api_not_built)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

#include "fake_api.h" /* cuda.h, nccl.h */
#include "fake_cuda.h"
#include "fake_nccl.h"

/* --- ranks ---------------------------------------------------------------------------------- */

enum { P = 3, ID_BYTES = 128 };
static const long long kN = 66; /* a multiple of 2P: both layouts */
static const double kTimeout = 30.0;

typedef struct rank_ctx {
  int rank;
  rda_ctx *ctx;
  rda_plan *plan;
  rda_status status;
  char msg[1024];
  double called, returned;
  long long rows;
  char fail[1280]; /* rank threads never assert: the first unexpected thing goes here */
} rank_ctx;

typedef struct world {
  unsigned char id[ID_BYTES];
  int caller_owned;
  ncclComm_t comm[P]; /* caller_owned: made by the rank threads, destroyed by the test */
  int odd;            /* the rank whose desc is bad, or -1 */
  pthread_barrier_t bar;
  void (*body)(struct world *w, rank_ctx *r);
  rank_ctx r[P];
} world;

/* One context and plan per rank for the whole test, as one process per GPU would have. */
static rda_ctx *g_ctx[P];
static rda_plan *g_plan[P];

static void rank_fail(rank_ctx *r, const char *fmt, ...) {
  if (r->fail[0] != '\0') return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->fail, sizeof r->fail, fmt, ap);
  va_end(ap);
}

typedef struct rank_arg {
  world *w;
  rank_ctx *r;
} rank_arg;

static void *rank_thread(void *arg) {
  const rank_arg *a = arg;
  fk.ctx_set(fk.context(0)); /* for the caller's ncclCommInitRankConfig: the one fake device */
  a->w->body(a->w, a->r);
  return NULL;
}

static void world_open(world *w, int caller_owned, int odd) {
  memset(w, 0, sizeof *w);
  w->caller_owned = caller_owned, w->odd = odd;
  if (rda_ring_nccl_unique_id(w->id) != RDA_OK)
    fail_msg("rda_ring_nccl_unique_id: %s", rda_last_error(NULL));
  assert_int_equal(pthread_barrier_init(&w->bar, NULL, P), 0);
  for (int q = 0; q < P; q++) w->r[q].rank = q, w->r[q].ctx = g_ctx[q], w->r[q].plan = g_plan[q];
}

static void world_run(world *w, void (*body)(world *, rank_ctx *)) {
  pthread_t th[P];
  rank_arg a[P];
  w->body = body;
  for (int q = 0; q < P; q++) {
    a[q].w = w, a[q].r = &w->r[q];
    assert_int_equal(pthread_create(&th[q], NULL, rank_thread, &a[q]), 0);
  }
  for (int q = 0; q < P; q++) assert_int_equal(pthread_join(th[q], NULL), 0);
  for (int q = 0; q < P; q++)
    if (w->r[q].fail[0] != '\0') fail_msg("rank %d: %s", q, w->r[q].fail);
}

static void world_close(world *w) {
  for (int q = 0; q < P; q++)
    if (fk.pending(w->id, q) > 0)
      fail_msg("rank %d: %ld NCCL operations still pending", q, fk.pending(w->id, q));
  pthread_barrier_destroy(&w->bar);
}

/* Rank q's communicator: inits, aborts, destroys and finalizes as given, and no misuse. */
static void expect_counts(const world *w, int q, long init, long abort_, long destroy,
                          long finalize) {
  const char *const what[5] = {"init", "abort", "destroy", "finalize", "misuse"};
  const long want[5] = {init, abort_, destroy, finalize, 0};
  for (int i = 0; i < 5; i++) {
    const long got = fk.count(w->id, q, what[i]);
    if (got != want[i])
      fail_msg("rank %d's communicator: %s %ld times, expected %ld", q, what[i], got, want[i]);
  }
}

/* In a rank thread: its own communicator, non-blocking, as a host program makes it. */
static int rank_init_comm(world *w, rank_ctx *r) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclUniqueId u;
  memcpy(&u, w->id, sizeof u);
  const ncclResult_t x = fk.init(&w->comm[r->rank], P, u, r->rank, &cfg);
  if (x != ncclSuccess && x != ncclInProgress) {
    rank_fail(r, "ncclCommInitRankConfig: %d", (int)x);
    return 0;
  }
  return 1;
}

static rda_ring_desc rank_desc(const world *w, const rank_ctx *r, int bad) {
  rda_ring_desc d = RDA_RING_DESC_INIT;
  d.n = bad ? kN - 2 : kN; /* kN - 2 = 64: not a multiple of 2P = 6 */
  d.ranks = P, d.rank = r->rank;
  d.layout = RDA_LAYOUT_ZIGZAG;
  d.timeout_s = kTimeout;
  if (w->caller_owned)
    d.nccl_comm = w->comm[r->rank];
  else
    d.nccl_unique_id = w->id;
  return d;
}

/* rda_ring_create as the test's rank; the status and message land in r. */
static rda_ring *rank_create(world *w, rank_ctx *r, int bad) {
  const rda_ring_desc d = rank_desc(w, r, bad);
  rda_ring *ring = NULL;
  r->called = rt_now_s();
  r->status = rda_ring_create(&ring, r->plan, &d);
  r->returned = rt_now_s();
  snprintf(r->msg, sizeof r->msg, "%s", r->status == RDA_OK ? "" : rda_last_error(r->ctx));
  if ((r->status == RDA_OK) != (ring != NULL))
    rank_fail(r, "status %s with ring %p", rda_status_string(r->status), (void *)ring);
  return ring;
}

/* A ring that was made: its rows are the zigzag layout's two chunks of N / 2P rows. */
static void rank_check_rows(rank_ctx *r, rda_ring *ring) {
  long long rows = -1, lo[2], hi[2];
  int npieces = -1;
  if (rda_ring_rows(ring, &rows, &npieces, lo, hi) != RDA_OK) {
    rank_fail(r, "rda_ring_rows: %s", rda_last_error(NULL));
    return;
  }
  const long long c = kN / (2 * P), q = r->rank;
  const long long want_lo[2] = {q * c, (2 * P - 1 - q) * c};
  const int touch = q == P - 1; /* chunks P - 1 and P make one piece */
  r->rows = rows;
  if (rows != 2 * c || npieces != (touch ? 1 : 2) || lo[0] != want_lo[0] ||
      hi[0] != (touch ? want_lo[0] + 2 * c : want_lo[0] + c) ||
      (!touch && (lo[1] != want_lo[1] || hi[1] != want_lo[1] + c)))
    rank_fail(r, "rda_ring_rows: rows %lld in %d pieces [%lld, %lld) [%lld, %lld)", rows, npieces,
              lo[0], hi[0], lo[1], hi[1]);
}

static void body_good(world *w, rank_ctx *r) {
  if (w->caller_owned && !rank_init_comm(w, r)) return;
  rda_ring *ring = rank_create(w, r, 0);
  if (r->status != RDA_OK) {
    rank_fail(r, "rda_ring_create: %s: %s", rda_status_string(r->status), r->msg);
    return;
  }
  rank_check_rows(r, ring);
  pthread_barrier_wait(&w->bar); /* every rank joined before any leaves */
  rda_ring_destroy(ring);
}

/* Rank w->odd's desc fails the shape check; then, with the caller's communicators, every rank
 * makes a correct ring on the same communicators. */
static void body_told(world *w, rank_ctx *r) {
  if (w->caller_owned && !rank_init_comm(w, r)) return;
  pthread_barrier_wait(&w->bar); /* the calls start together: timings compare */
  rda_ring *ring = rank_create(w, r, r->rank == w->odd);
  if (ring != NULL) {
    rank_fail(r, "rda_ring_create succeeded beside a rank with a bad desc");
    rda_ring_destroy(ring);
    return;
  }
  if (!w->caller_owned) return;
  pthread_barrier_wait(&w->bar);
  rank_ctx again = *r;
  ring = rank_create(w, &again, 0);
  if (again.status != RDA_OK) {
    rank_fail(r, "rda_ring_create on the same communicators afterwards: %s: %s",
              rda_status_string(again.status), again.msg);
    return;
  }
  rank_check_rows(r, ring);
  pthread_barrier_wait(&w->bar);
  rda_ring_destroy(ring);
}

/* --- a. every rank joins ---------------------------------------------------------------------- */

static void test_nccl_fake_api_ring_create_on_every_rank(void **state) {
  (void)state;
  world w;
  world_open(&w, 0, -1);
  world_run(&w, body_good);
  for (int q = 0; q < P; q++) {
    if (w.r[q].rows != 2 * (kN / (2 * P))) fail_msg("rank %d: %lld rows", q, w.r[q].rows);
    expect_counts(&w, q, 1, 0, 1, 1); /* rda's own communicator: finalized, destroyed */
  }
  world_close(&w);
}

/* --- b, c. a rank that fails the shape checks tells the others ------------------------------- */

static void check_told(const world *w) {
  double last = 0.0;
  for (int q = 0; q < P; q++) last = w->r[q].called > last ? w->r[q].called : last;
  for (int q = 0; q < P; q++) {
    const rank_ctx *r = &w->r[q];
    if (r->status != RDA_ERR_INVALID_ARGUMENT)
      fail_msg("rank %d: %s: %s", q, rda_status_string(r->status), r->msg);
    if (strchr(r->msg, '\n') != NULL) fail_msg("rank %d: message spans lines: %s", q, r->msg);
    if (q == w->odd) {
      if (strstr(r->msg, "zigzag") == NULL || strstr(r->msg, "rank 1 failed") != NULL)
        fail_msg("rank %d (the bad desc): %s", q, r->msg);
    } else if (strstr(r->msg, "rank 1 failed in rda_ring_create before it joined") == NULL ||
               strstr(r->msg, "RDA_ERR_INVALID_ARGUMENT") == NULL) {
      fail_msg("rank %d: %s", q, r->msg);
    }
    /* Told at once: far from the 30 s timeout (generous for a loaded machine or ASan). */
    if (r->returned - last > 15.0)
      fail_msg("rank %d returned %.1f s after the last rank's call (timeout %.0f s): %s", q,
               r->returned - last, kTimeout, r->msg);
  }
  print_message("rank 1: %s\nrank 0: %s\n", w->r[1].msg, w->r[0].msg);
}

static void test_nccl_fake_api_told_failure_own_comms(void **state) {
  (void)state;
  world w;
  world_open(&w, 0, 1);
  world_run(&w, body_told);
  check_told(&w);
  /* rda's own communicators: aborted by the failed creates (rda frees them so). */
  for (int q = 0; q < P; q++) expect_counts(&w, q, 1, 1, 0, 0);
  world_close(&w);
}

static void test_nccl_fake_api_told_failure_callers_comms(void **state) {
  (void)state;
  world w;
  world_open(&w, 1, 1);
  world_run(&w, body_told);
  check_told(&w);
  /* The caller's: never aborted, and they carried a correct ring afterwards; the test
   * destroys them. */
  for (int q = 0; q < P; q++) {
    expect_counts(&w, q, 1, 0, 0, 0);
    assert_int_equal(fk.comm_destroy(w.comm[q]), ncclSuccess);
    expect_counts(&w, q, 1, 0, 1, 0);
  }
  world_close(&w);
}

/* --- the contexts and plans ------------------------------------------------------------------- */

static int setup(void **state) {
  (void)state;
  fake_load();
  /* A tiny config: one kernel shape to compile (the kernel cache makes reruns fast). */
  rda_attn_config c = RDA_CONFIG_INIT;
  c.heads = 2, c.head_dim = 32, c.dtype = RDA_BF16, c.nbranch = 2;
  c.segments[0] = 16, c.dilations[0] = 1;
  c.segments[1] = 32, c.dilations[1] = 2;
  for (int q = 0; q < P; q++) {
    if (rda_ctx_create_cuda(&g_ctx[q], 0) != RDA_OK)
      fail_msg("rda_ctx_create_cuda on the fake driver: %s", rda_last_error(NULL));
    if (rda_plan_create(&g_plan[q], g_ctx[q], &c, RDA_PLAN_FORWARD) != RDA_OK)
      fail_msg("rda_plan_create on the fake driver: %s", rda_last_error(g_ctx[q]));
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  for (int q = 0; q < P; q++) {
    rda_plan_destroy(g_plan[q]);
    rda_ctx_destroy(g_ctx[q]);
  }
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nccl_fake_api_ring_create_on_every_rank),
      cmocka_unit_test(test_nccl_fake_api_told_failure_own_comms),
      cmocka_unit_test(test_nccl_fake_api_told_failure_callers_comms),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

#endif
