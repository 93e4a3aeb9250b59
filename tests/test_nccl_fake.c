/* test_nccl_fake.c — the NCCL transport (runtime/transport_nccl.c) on P = 3 or 4 ranks without a
 * GPU: CTest points LD_LIBRARY_PATH at a fake libnccl.so.2 and libcuda.so.1 (tests/fake/), built
 * from this tree, which the transport then dlopens. Each rank is a thread with its own
 * communicator (made by the transport from one unique id, or made by the test and passed in)
 * and its own fake device and streams; the fakes count what each rank did to its communicator
 * (abort, finalize, destroy, misuse) and every device access to memory that is not allocated.
 * Checked: a ring of group send/recv (every byte), all-gather, gather8, barrier and the release
 * of the communicators; a fingerprint mismatch and a rank that tells it failed, with no
 * caller's communicator aborted; a missing rank's timeout; abort from another thread, while a
 * rank waits and while it is idle; failed waits (timeout, sizes that differ) that still order
 * the caller's stream after the communication stream; a destroy with a group in flight. */
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
#include <time.h>

#include "backend.h"
#include "rda_test.h"
#include "transport.h"

#if defined(__has_include) && defined(RDA_TEST_FAKE_LIBS)
#if __has_include(<nccl.h>) && __has_include(<cuda.h>)
#define TEST_HAVE_FAKE 1
#endif
#endif

#ifndef TEST_HAVE_FAKE

static void test_nccl_fake_not_built(void **state) {
  (void)state;
  print_message("skipped: no nccl.h and cuda.h here, so neither the transport nor the fakes\n");
  skip();
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_nccl_fake_not_built)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

#include "fake_api.h" /* cuda.h, nccl.h */
#include "fake_cuda.h"
#include "fake_nccl.h"

/* --- helpers ------------------------------------------------------------------------------- */

enum { MAXP = 4, ID_BYTES = 128 };
static const uint64_t FP = 0x0123456789abcdefull;

static void assert_one_line(const char *msg) {
  assert_true(msg[0] != '\0');
  if (strchr(msg, '\n') != NULL) fail_msg("error message spans lines: %s", msg);
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27, x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Byte i of message `msg` from rank src to rank dst in round `round`. */
static unsigned char pattern(int src, int dst, int msg, int round, size_t i) {
  return (unsigned char)mix(((uint64_t)src << 48) ^ ((uint64_t)dst << 40) ^ ((uint64_t)msg << 36) ^
                            ((uint64_t)round << 32) ^ (uint64_t)i);
}

typedef struct world world;

/* One rank's thread: what it was given, what it saw. Rank threads never assert (cmocka's asserts
 * are the main thread's): the first unexpected thing goes to `fail`. */
typedef struct rank_ctx {
  world *w;
  int rank;
  CUstream comm, caller; /* the communication stream; the caller's (rda_backend_cuda_use_stream) */
  rda_transport *t;
  rda_status status, status2; /* the calls under test */
  char msg[1024], msg2[1024]; /* rda_err.msg sized */
  double called, returned;
  long mark, mark2; /* a counter read at a point the test names */
  char fail[1280];
} rank_ctx;

struct world {
  int P, caller_owned;
  unsigned char id[ID_BYTES]; /* the communicators' unique id, whoever makes them */
  ncclComm_t comm[MAXP];      /* caller_owned: made by the rank threads, destroyed by the test */
  int odd;                    /* the rank a test singles out */
  int variant;
  double t_abort;
  pthread_barrier_t bar;  /* the P rank threads */
  pthread_barrier_t sync; /* the rank threads and the main thread */
  pthread_barrier_t pair; /* one rank thread and the main thread */
  pthread_t hooked;       /* the thread whose poll runs the hook */
  int hook_armed;
  void (*body)(rank_ctx *r);
  rank_ctx r[MAXP];
  long bad0, noctx0;
};

static void rank_fail(rank_ctx *r, const char *fmt, ...) {
  if (r->fail[0] != '\0') return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->fail, sizeof r->fail, fmt, ap);
  va_end(ap);
}

static void *rank_thread(void *arg) {
  rank_ctx *r = arg;
  fk.ctx_set(fk.context(r->rank)); /* one device per rank, as one GPU per rank would be */
  rda_backend_cuda_use_stream(r->caller);
  r->w->body(r);
  return NULL;
}

static void world_open(world *w, int P, int caller_owned) {
  fake_load();
  /* The main thread aborts transports and destroys comms: it has a context, as a host thread
   * of a real program would. */
  fk.ctx_set(fk.context(0));
  memset(w, 0, sizeof *w);
  w->P = P, w->caller_owned = caller_owned;
  rda_err err = {0};
  if (rda_transport_nccl_unique_id(w->id, &err) != RDA_OK)
    fail_msg("rda_transport_nccl_unique_id: %s", err.msg);
  assert_int_equal(pthread_barrier_init(&w->bar, NULL, (unsigned)P), 0);
  assert_int_equal(pthread_barrier_init(&w->sync, NULL, (unsigned)P + 1), 0);
  assert_int_equal(pthread_barrier_init(&w->pair, NULL, 2), 0);
  for (int q = 0; q < P; q++) {
    w->r[q].w = w, w->r[q].rank = q;
    w->r[q].comm = fk.stream_create();
    w->r[q].caller = fk.stream_create();
    assert_true(w->r[q].comm != NULL && w->r[q].caller != NULL);
  }
  w->bad0 = fk.bad_accesses(), w->noctx0 = fk.no_context_calls();
}

static void world_start(world *w, void (*body)(rank_ctx *), pthread_t *th) {
  w->body = body;
  for (int q = 0; q < w->P; q++)
    assert_int_equal(pthread_create(&th[q], NULL, rank_thread, &w->r[q]), 0);
}

static void world_join(world *w, pthread_t *th) {
  for (int q = 0; q < w->P; q++) assert_int_equal(pthread_join(th[q], NULL), 0);
  for (int q = 0; q < w->P; q++)
    if (w->r[q].fail[0] != '\0') fail_msg("rank %d: %s", q, w->r[q].fail);
}

static void world_run(world *w, void (*body)(rank_ctx *)) {
  pthread_t th[MAXP];
  world_start(w, body, th);
  world_join(w, th);
}

/* Rank q's counter of the fake (fake_nccl.h). */
static long count(const world *w, int q, const char *what) {
  return fk.count(w->id, q, what);
}

/* Rank q's communicator: inits, aborts, destroys and finalizes as given, and no misuse. */
static void expect_counts(const world *w, int q, long init, long abort_, long destroy,
                          long finalize) {
  const long got[5] = {count(w, q, "init"), count(w, q, "abort"), count(w, q, "destroy"),
                       count(w, q, "finalize"), count(w, q, "misuse")};
  const long want[5] = {init, abort_, destroy, finalize, 0};
  if (memcmp(got, want, sizeof got) != 0)
    fail_msg(
        "rank %d's communicator: init %ld abort %ld destroy %ld finalize %ld misuse %ld, "
        "expected %ld %ld %ld %ld 0",
        q, got[0], got[1], got[2], got[3], got[4], init, abort_, destroy, finalize);
}

/* Nothing left pending, no device access outside allocated memory, no driver call without a
 * context; then the streams and barriers go. */
static void world_close(world *w) {
  for (int q = 0; q < w->P; q++)
    if (fk.pending(w->id, q) > 0)
      fail_msg("rank %d: %ld operations still pending", q, fk.pending(w->id, q));
  if (fk.bad_accesses() != w->bad0)
    fail_msg("%ld device accesses to memory that is not allocated", fk.bad_accesses() - w->bad0);
  if (fk.no_context_calls() != w->noctx0)
    fail_msg("%ld driver calls without a current context", fk.no_context_calls() - w->noctx0);
  for (int q = 0; q < w->P; q++) {
    fk.stream_destroy(w->r[q].comm);
    fk.stream_destroy(w->r[q].caller);
  }
  pthread_barrier_destroy(&w->bar);
  pthread_barrier_destroy(&w->sync);
  pthread_barrier_destroy(&w->pair);
}

/* The test destroys the caller's communicators it still holds (not aborted by the transport). */
static void world_destroy_comms(world *w, int except) {
  for (int q = 0; q < w->P; q++)
    if (q != except && w->comm[q] != NULL) {
      assert_int_equal(fk.comm_destroy(w->comm[q]), ncclSuccess);
      w->comm[q] = NULL;
    }
}

/* In a rank thread: its own communicator, non-blocking, as a host program makes it. */
static int rank_init_comm(rank_ctx *r) {
  world *w = r->w;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclUniqueId u;
  memcpy(&u, w->id, sizeof u);
  const ncclResult_t x = fk.init(&w->comm[r->rank], w->P, u, r->rank, &cfg);
  if (x != ncclSuccess && x != ncclInProgress) {
    rank_fail(r, "ncclCommInitRankConfig: %d", (int)x);
    return 0;
  }
  return 1;
}

static rda_status rank_create(rank_ctx *r, uint64_t fp, double timeout_s, rda_err *err) {
  world *w = r->w;
  void *comm = w->caller_owned ? (void *)w->comm[r->rank] : NULL;
  const void *id = w->caller_owned ? NULL : (const void *)w->id;
  r->t = NULL;
  return rda_transport_nccl_create(comm, id, r->rank, w->P, r->comm, NULL, fp, timeout_s, &r->t,
                                   err);
}

/* Records a call under test: status, one-line message, when it was called and returned. */
static void rank_record(rank_ctx *r, rda_status s, const rda_err *err, double called) {
  r->called = called, r->returned = rt_now_s();
  r->status = s;
  snprintf(r->msg, sizeof r->msg, "%s", err->msg);
}

static CUdeviceptr rank_alloc(rank_ctx *r, size_t bytes) {
  CUdeviceptr p = 0;
  if (fk.mem_alloc(&p, bytes) != CUDA_SUCCESS) rank_fail(r, "cuMemAlloc of %zu bytes", bytes);
  return p;
}

/* A one-operation group (send or recv of `bytes` with peer), posted. */
static rda_status rank_group1(rank_ctx *r, int send, int peer, CUdeviceptr buf, size_t bytes,
                              rda_err *err) {
  void *p = (void *)(uintptr_t)buf;
  RDA_TRY(rda_transport_group_start(r->t, err));
  RDA_TRY(send ? rda_transport_send(r->t, peer, p, bytes, err)
               : rda_transport_recv(r->t, peer, p, bytes, err));
  return rda_transport_group_end(r->t, err);
}

/* The same, where posting must succeed: 1 when posted. */
static int rank_post1(rank_ctx *r, int send, int peer, CUdeviceptr buf, size_t bytes) {
  rda_err err = {0};
  if (rank_group1(r, send, peer, buf, bytes, &err) != RDA_OK) {
    rank_fail(r, "posting a group: %s", err.msg);
    return 0;
  }
  return 1;
}

/* The caller's stream has run everything queued on it (the fake runs streams synchronously, so
 * an event not complete here waits for something that will never come). */
static void rank_expect_caller_idle(rank_ctx *r, const char *when) {
  CUevent ev = NULL;
  if (fk.ev_create(&ev, 0) != CUDA_SUCCESS || fk.ev_record(ev, r->caller) != CUDA_SUCCESS) {
    rank_fail(r, "cuEventCreate/Record");
    return;
  }
  if (fk.ev_query(ev) != CUDA_SUCCESS) rank_fail(r, "%s: the caller's stream is stuck", when);
  fk.ev_destroy(ev);
}

/* Rank q's transport aborted from the main thread while the rank is idle (at a barrier): the
 * abort takes effect at once (its communicator's abort count is 1 as rda_transport_abort
 * returns), not at the destroy. */
static void main_abort_idle(world *w, int q, const char *reason) {
  rda_transport_abort(w->r[q].t, reason);
  if (count(w, q, "abort") != 1)
    fail_msg(
        "rank %d: idle transport aborted from another thread, its communicator aborted %ld "
        "times before its destroy (expected at once)",
        q, count(w, q, "abort"));
}

/* --- a. every rank joins: a ring of blocks, all-gather, gather8, barrier, release ---------- */

enum { ROUNDS = 2, GATHER = 333 };

static size_t msg_bytes(int msg, int from) {
  return msg == 0 ? 1000 + 37 * (size_t)from + 1 : 3 * 4096 + (size_t)from;
}

static void body_ring(rank_ctx *r) {
  world *w = r->w;
  const int P = w->P, me = r->rank, next = (me + 1) % P, prev = (me + P - 1) % P;
  rda_err err = {0};
  if (w->caller_owned && !rank_init_comm(r)) return;
  if (rank_create(r, FP, 30.0, &err) != RDA_OK) {
    rank_fail(r, "create: %s", err.msg);
    return;
  }
  const int peers[2] = {prev, next};
  if (rda_transport_connect(r->t, peers, 2, &err) != RDA_OK) rank_fail(r, "connect: %s", err.msg);
  /* Message 0 goes to the next rank, message 1 to the previous one. */
  const size_t bytes[4] = {msg_bytes(0, me), msg_bytes(1, me), msg_bytes(0, prev),
                           msg_bytes(1, next)};
  const int from[4] = {me, me, prev, next}, to[4] = {next, prev, me, me}, msg[4] = {0, 1, 0, 1};
  CUdeviceptr d[4];
  unsigned char *h[4];
  for (int k = 0; k < 4; k++) {
    d[k] = rank_alloc(r, bytes[k]);
    h[k] = malloc(bytes[k]);
    if (d[k] == 0 || h[k] == NULL) return;
    memset((void *)(uintptr_t)d[k], 0x11, bytes[k]); /* fake device memory is host memory */
  }
  for (int round = 0; r->fail[0] == '\0' && round < ROUNDS; round++) {
    /* The sends' data and the receives' poison are queued on the caller's stream, held until
     * after group_end: the group must wait for them (the transport's `ready` event). */
    fk.hold(r->caller, 1);
    for (int k = 0; k < 4; k++) {
      for (size_t i = 0; i < bytes[k]; i++)
        h[k][i] = k < 2 ? pattern(from[k], to[k], msg[k], round, i) : 0xEE;
      fk.htod(d[k], h[k], bytes[k], r->caller);
    }
    rda_status s = rda_transport_group_start(r->t, &err);
    if (s == RDA_OK) s = rda_transport_send(r->t, next, (void *)(uintptr_t)d[0], bytes[0], &err);
    if (s == RDA_OK) s = rda_transport_send(r->t, prev, (void *)(uintptr_t)d[1], bytes[1], &err);
    if (s == RDA_OK) s = rda_transport_recv(r->t, prev, (void *)(uintptr_t)d[2], bytes[2], &err);
    if (s == RDA_OK) s = rda_transport_recv(r->t, next, (void *)(uintptr_t)d[3], bytes[3], &err);
    if (s == RDA_OK) s = rda_transport_group_end(r->t, &err);
    if (s == RDA_OK && fk.pending(w->id, me) != 4)
      rank_fail(r, "round %d: %ld of 4 operations pending behind the held caller's stream", round,
                fk.pending(w->id, me));
    fk.hold(r->caller, 0);
    if (s == RDA_OK) s = rda_transport_wait(r->t, &err);
    if (s != RDA_OK) {
      rank_fail(r, "round %d: %s", round, err.msg);
      break;
    }
    for (int k = 2; k < 4; k++) fk.dtoh(h[k], d[k], bytes[k], r->caller);
    rank_expect_caller_idle(r, "after wait");
    for (int k = 2; k < 4; k++)
      for (size_t i = 0; i < bytes[k]; i++)
        if (h[k][i] != pattern(from[k], to[k], msg[k], round, i)) {
          rank_fail(r, "round %d: byte %zu of message %d from rank %d is 0x%02x, expected 0x%02x",
                    round, i, msg[k], from[k], h[k][i], pattern(from[k], to[k], msg[k], round, i));
          break;
        }
  }
  /* The all-gather: every rank's block, the own one included. */
  CUdeviceptr gs = rank_alloc(r, GATHER), gr = rank_alloc(r, (size_t)P * GATHER);
  unsigned char *hg = malloc((size_t)P * GATHER);
  if (gs != 0 && gr != 0 && hg != NULL && r->fail[0] == '\0') {
    for (size_t i = 0; i < GATHER; i++) hg[i] = pattern(me, -1, 2, 0, i);
    fk.htod(gs, hg, GATHER, r->caller);
    if (rda_transport_allgather(r->t, (void *)(uintptr_t)gs, (void *)(uintptr_t)gr, GATHER, &err) !=
        RDA_OK)
      rank_fail(r, "allgather: %s", err.msg);
    fk.dtoh(hg, gr, (size_t)P * GATHER, r->caller);
    rank_expect_caller_idle(r, "after the all-gather");
    for (int q = 0; q < P && r->fail[0] == '\0'; q++)
      for (size_t i = 0; i < GATHER; i++)
        if (hg[(size_t)q * GATHER + i] != pattern(q, -1, 2, 0, i)) {
          rank_fail(r, "all-gather: byte %zu of rank %d's block is wrong", i, q);
          break;
        }
  }
  uint64_t all[MAXP] = {0};
  if (r->fail[0] == '\0' &&
      rda_transport_gather8(r->t, 1000u * (uint64_t)me + 7, all, &err) != RDA_OK)
    rank_fail(r, "gather8: %s", err.msg);
  for (int q = 0; q < P && r->fail[0] == '\0'; q++)
    if (all[q] != 1000u * (uint64_t)q + 7)
      rank_fail(r, "gather8: all[%d] = %llu", q, (unsigned long long)all[q]);
  if (r->fail[0] == '\0' && rda_transport_barrier(r->t, &err) != RDA_OK)
    rank_fail(r, "barrier: %s", err.msg);
  uint64_t sent = 0, received = 0;
  rda_transport_bytes(r->t, &sent, &received);
  const uint64_t g = (uint64_t)(P - 1) * GATHER;
  if (r->fail[0] == '\0' && (sent != ROUNDS * (bytes[0] + bytes[1]) + g ||
                             received != ROUNDS * (bytes[2] + bytes[3]) + g))
    rank_fail(r, "bytes sent %llu, received %llu", (unsigned long long)sent,
              (unsigned long long)received);
  /* Every rank releases its transport at once, as ranks do (an owned communicator's finalize
   * waits for every rank's). */
  rda_transport_destroy(r->t);
  r->t = NULL;
  for (int k = 0; k < 4; k++) fk.mem_free(d[k]), free(h[k]);
  if (gs != 0) fk.mem_free(gs);
  if (gr != 0) fk.mem_free(gr);
  free(hg);
}

static void test_nccl_fake_ring_moves_every_byte(void **state) {
  (void)state;
  for (int owned = 0; owned < 2; owned++) {
    world w;
    world_open(&w, 4, !owned);
    const double t0 = rt_now_s();
    world_run(&w, body_ring);
    print_message(
        "%s communicators: 4 ranks, %d ring rounds, all-gather, gather8, barrier and "
        "release in %.3f s\n",
        owned ? "the transport's" : "the caller's", ROUNDS, rt_now_s() - t0);
    /* Released: the transport's own finalized and destroyed once; a caller's left alone. */
    for (int q = 0; q < w.P; q++) expect_counts(&w, q, 1, 0, owned ? 1 : 0, owned ? 1 : 0);
    world_destroy_comms(&w, -1);
    world_close(&w);
  }
}

/* --- b. a fingerprint that differs: an error on every rank, no communicator aborted -------- */

/* Checks a failed creation on every rank but `except` (-1: none): status, one line naming
 * `what`, no transport, and at once: within `bound` s of the last rank's call. */
static void expect_failed_creates(const world *w, int except, rda_status want, const char *what,
                                  const char *what2, double bound) {
  double last = 0.0;
  for (int q = 0; q < w->P; q++)
    if (w->r[q].called > last) last = w->r[q].called;
  for (int q = 0; q < w->P; q++) {
    if (q == except) continue;
    const rank_ctx *r = &w->r[q];
    if (r->status != want)
      fail_msg("rank %d: %s, expected %s: %s", q, rda_status_string(r->status),
               rda_status_string(want), r->msg);
    assert_one_line(r->msg);
    if (strstr(r->msg, what) == NULL || (what2 != NULL && strstr(r->msg, what2) == NULL))
      fail_msg("rank %d: \"%s\" does not say \"%s\"%s%s", q, r->msg, what, what2 ? " and " : "",
               what2 ? what2 : "");
    if (r->returned - last > bound)
      fail_msg("rank %d failed %.2f s after the last rank's call (bound %.1f s): %s", q,
               r->returned - last, bound, r->msg);
  }
}

static void body_mismatch(rank_ctx *r) {
  world *w = r->w;
  rda_err err = {0};
  if (w->caller_owned && !rank_init_comm(r)) return;
  const double t = rt_now_s();
  const rda_status s = rank_create(r, r->rank == w->odd ? FP ^ 0x5 : FP, 60.0, &err);
  rank_record(r, s, &err, t);
  if (r->t != NULL) {
    rank_fail(r, "a failed creation left a transport");
    rda_transport_destroy(r->t);
  }
  if (!w->caller_owned) return;
  /* Every rank's check done: no caller's communicator aborted, and each still works. */
  pthread_barrier_wait(&w->bar);
  r->mark = count(w, r->rank, "abort");
  rda_err_clear(&err);
  if (rank_create(r, FP, 60.0, &err) != RDA_OK) {
    rank_fail(r, "create again on the same communicators: %s", err.msg);
    return;
  }
  if (rda_transport_barrier(r->t, &err) != RDA_OK) rank_fail(r, "barrier: %s", err.msg);
  rda_transport_destroy(r->t);
}

static void test_nccl_fake_fingerprint_mismatch_fails_every_rank(void **state) {
  (void)state;
  for (int owned = 0; owned < 2; owned++) {
    world w;
    world_open(&w, 4, !owned);
    w.odd = 2;
    world_run(&w, body_mismatch);
    expect_failed_creates(&w, -1, RDA_ERR_INVALID_ARGUMENT, "fingerprint mismatch", "rank 2 has",
                          20.0);
    print_message("fingerprint mismatch, %s communicators: %s\n",
                  owned ? "the transport's" : "the caller's", w.r[0].msg);
    for (int q = 0; q < w.P; q++) {
      if (!owned && w.r[q].mark != 0)
        fail_msg("rank %d: the caller's communicator was aborted after a fingerprint mismatch", q);
      /* The transport's own communicators are gone (aborted: a finalize would wait for peers
       * that may never get that far); a caller's are the caller's, and worked again. */
      expect_counts(&w, q, 1, owned ? 1 : 0, 0, 0);
    }
    world_destroy_comms(&w, -1);
    world_close(&w);
  }
}

/* --- c. a rank that tells it failed before joining ---------------------------------------- */

static void body_tell(rank_ctx *r) {
  world *w = r->w;
  rda_err err = {0};
  if (w->caller_owned && !rank_init_comm(r)) return;
  const double t = rt_now_s();
  rda_status s;
  if (r->rank == w->odd) {
    void *comm = w->caller_owned ? (void *)w->comm[r->rank] : NULL;
    s = rda_transport_nccl_tell(comm, w->caller_owned ? NULL : w->id, r->rank, w->P, r->comm, NULL,
                                RDA_ERR_OUT_OF_MEMORY, 60.0, &err);
  } else {
    s = rank_create(r, FP, 60.0, &err);
    if (r->t != NULL) {
      rank_fail(r, "a failed creation left a transport");
      rda_transport_destroy(r->t);
    }
  }
  rank_record(r, s, &err, t);
  if (!w->caller_owned) return;
  pthread_barrier_wait(&w->bar);
  r->mark = count(w, r->rank, "abort");
  rda_err_clear(&err);
  if (rank_create(r, FP, 60.0, &err) != RDA_OK) {
    rank_fail(r, "create after the tell on the same communicators: %s", err.msg);
    return;
  }
  if (rda_transport_barrier(r->t, &err) != RDA_OK) rank_fail(r, "barrier: %s", err.msg);
  rda_transport_destroy(r->t);
}

static void test_nccl_fake_told_failure_fails_the_others_at_once(void **state) {
  (void)state;
  for (int owned = 0; owned < 2; owned++) {
    world w;
    world_open(&w, 3, !owned);
    w.odd = 1;
    world_run(&w, body_tell);
    if (w.r[1].status != RDA_OK) fail_msg("the tell: %s", w.r[1].msg);
    expect_failed_creates(&w, 1, RDA_ERR_INVALID_ARGUMENT, "rank 1 failed", "RDA_ERR_OUT_OF_MEMORY",
                          20.0);
    print_message("told, %s communicators: %s\n", owned ? "the transport's" : "the caller's",
                  w.r[0].msg);
    for (int q = 0; q < w.P; q++) {
      if (!owned && w.r[q].mark != 0)
        fail_msg("rank %d: the caller's communicator was aborted after a tell", q);
      expect_counts(&w, q, 1, owned ? 1 : 0, 0, 0);
    }
    world_destroy_comms(&w, -1);
    world_close(&w);
  }
}

/* --- d. a rank that never joins: the others time out ------------------------------------- */

/* Variants: the transport makes the communicators and rank 2 never comes; the caller makes
 * them and rank 2 never makes its own; the caller makes every one, rank 2 never joins the
 * transport (the fingerprint all-gather waits for it). */
enum { ABSENT_OWNED, ABSENT_NO_COMM, ABSENT_NO_JOIN, ABSENT_VARIANTS };
static const double ABSENT_TIMEOUT = 0.5;

static void body_absent(rank_ctx *r) {
  world *w = r->w;
  rda_err err = {0};
  if (w->variant == ABSENT_NO_JOIN || (w->variant == ABSENT_NO_COMM && r->rank != w->odd))
    if (!rank_init_comm(r)) return;
  pthread_barrier_wait(&w->bar); /* ABSENT_NO_JOIN: every communicator initialized by now */
  if (r->rank == w->odd) return;
  const double t = rt_now_s();
  const rda_status s = rank_create(r, FP, ABSENT_TIMEOUT, &err);
  rank_record(r, s, &err, t);
  if (r->t != NULL) {
    rank_fail(r, "a creation without rank %d came up", w->odd);
    rda_transport_destroy(r->t);
  }
}

static void test_nccl_fake_missing_rank_times_out(void **state) {
  (void)state;
  static const char *const names[ABSENT_VARIANTS] = {"the transport's communicators",
                                                     "the caller's, one never made",
                                                     "the caller's, one rank never joins"};
  static const char *const where[ABSENT_VARIANTS] = {"ncclCommInitRankConfig", "initialization",
                                                     "all-gather"};
  for (int v = 0; v < ABSENT_VARIANTS; v++) {
    world w;
    world_open(&w, 3, v != ABSENT_OWNED);
    w.odd = 2, w.variant = v;
    world_run(&w, body_absent);
    print_message("%s: %s (%.2f s)\n", names[v], w.r[0].msg, w.r[0].returned - w.r[0].called);
    for (int q = 0; q < 2; q++) {
      const rank_ctx *r = &w.r[q];
      if (r->status != RDA_ERR_NCCL) fail_msg("rank %d: %s", q, r->msg);
      assert_one_line(r->msg);
      if (strstr(r->msg, "timed out") == NULL || strstr(r->msg, where[v]) == NULL)
        fail_msg("rank %d: \"%s\" does not say it timed out in the %s", q, r->msg, where[v]);
      const double took = r->returned - r->called;
      if (took < 0.9 * ABSENT_TIMEOUT || took > ABSENT_TIMEOUT + 15.0)
        fail_msg("rank %d: failed after %.2f s with a timeout of %.1f s", q, took, ABSENT_TIMEOUT);
      /* Aborted after the timeout: the transport's, and a caller's too (transport.h). */
      expect_counts(&w, q, 1, 1, 0, 0);
    }
    expect_counts(&w, 2, v == ABSENT_NO_JOIN, 0, 0, 0);
    w.comm[0] = w.comm[1] = NULL; /* aborted: gone */
    world_destroy_comms(&w, -1);
    world_close(&w);
  }
}

/* --- e. abort from another thread: in a wait, and idle ------------------------------------ */

static void body_abort(rank_ctx *r) {
  world *w = r->w;
  rda_err err = {0};
  if (rank_create(r, FP, 30.0, &err) != RDA_OK) rank_fail(r, "create: %s", err.msg);
  pthread_barrier_wait(&w->sync); /* [1] all created */
  CUdeviceptr buf = 0;
  const int me = r->rank;
  int posted = 0;
  if ((me == 0 || me == 2) && r->t != NULL) {
    /* A receive from rank 1, which never sends. Rank 0 waits for it until the abort; rank 2
     * is aborted while idle with it posted, then waits. */
    buf = rank_alloc(r, 64);
    const long waits = fk.waits(r->caller, r->comm);
    posted = buf != 0 && rank_post1(r, 0, 1, buf, 64);
    /* Rank 0: the polls so far, group_end's included; the next one is its wait's. */
    r->mark = me == 0 ? count(w, 0, "poll") : waits;
  }
  pthread_barrier_wait(&w->sync); /* [2] posted; the main thread watches rank 0's polls */
  if (me == 0 && posted) {
    const double t = rt_now_s();
    const rda_status s = rda_transport_wait(r->t, &err);
    rank_record(r, s, &err, t);
    rda_err_clear(&err);
    r->status2 = rda_transport_barrier(r->t, &err);
    snprintf(r->msg2, sizeof r->msg2, "%s", err.msg);
  }
  pthread_barrier_wait(&w->sync); /* [3] the main thread aborted every rank */
  if (me == 2 && posted) {
    const double t = rt_now_s();
    const rda_status s = rda_transport_wait(r->t, &err);
    rank_record(r, s, &err, t);
    r->mark2 = fk.waits(r->caller, r->comm);
  }
  rda_transport_destroy(r->t);
  if (buf != 0) fk.mem_free(buf);
}

static void test_nccl_fake_abort_from_another_thread(void **state) {
  (void)state;
  world w;
  world_open(&w, 3, 0);
  pthread_t th[MAXP];
  world_start(&w, body_abort, th);
  pthread_barrier_wait(&w.sync); /* [1] */
  pthread_barrier_wait(&w.sync); /* [2] */
  /* Rank 0 is inside its wait once its communicator is polled past the mark it read after
   * posting: from then on it holds the call, so the abort is a request the wait carries out. */
  const double give_up = rt_now_s() + 20.0;
  while (w.r[0].t != NULL && count(&w, 0, "poll") <= w.r[0].mark && rt_now_s() < give_up) {
    struct timespec nap = {0, 100 * 1000};
    nanosleep(&nap, NULL);
  }
  w.t_abort = rt_now_s();
  if (w.r[0].t != NULL) rda_transport_abort(w.r[0].t, "test: stop rank 0");
  for (int q = 1; q < w.P; q++)
    if (w.r[q].t != NULL) main_abort_idle(&w, q, "test: stop idle ranks");
  pthread_barrier_wait(&w.sync); /* [3] */
  world_join(&w, th);
  const rank_ctx *r = &w.r[0];
  if (r->status != RDA_ERR_NCCL || strstr(r->msg, "test: stop rank 0") == NULL)
    fail_msg("rank 0's wait: %s, %s", rda_status_string(r->status), r->msg);
  assert_one_line(r->msg);
  if (r->returned - w.t_abort > 10.0)
    fail_msg("rank 0's wait returned %.2f s after the abort (timeout 30 s)",
             r->returned - w.t_abort);
  print_message("aborted in a wait: returned %.3f s after the abort: %s\n", r->returned - w.t_abort,
                r->msg);
  /* Later calls fail at once, naming the first reason. */
  if (r->status2 != RDA_ERR_NCCL || strstr(r->msg2, "test: stop rank 0") == NULL)
    fail_msg("rank 0's barrier after the abort: %s, %s", rda_status_string(r->status2), r->msg2);
  /* Rank 2, aborted while idle with a group posted: its wait fails with the reason and still
   * orders the caller's stream after the communication stream. */
  const rank_ctx *r2 = &w.r[2];
  if (r2->status != RDA_ERR_NCCL || strstr(r2->msg, "test: stop idle ranks") == NULL)
    fail_msg("rank 2's wait after an idle abort: %s, %s", rda_status_string(r2->status), r2->msg);
  if (r2->mark2 <= r2->mark)
    fail_msg("rank 2: its failed wait did not order the caller's stream (%ld, %ld waits)", r2->mark,
             r2->mark2);
  /* Aborted exactly once each, by the abort, never finalized. */
  for (int q = 0; q < w.P; q++) expect_counts(&w, q, 1, 1, 0, 0);
  world_close(&w);
}

/* An abort that comes while a call runs, late: after that call's last look for a request (here:
 * inside its poll, whose group has completed). The call may succeed, but the communicator must
 * be aborted by the time it returns, not left for a later call or the destroy. */
static void race_hook(void *arg) {
  world *w = arg;
  if (!pthread_equal(pthread_self(), w->hooked) ||
      !__atomic_exchange_n(&w->hook_armed, 0, __ATOMIC_ACQ_REL))
    return;
  pthread_barrier_wait(&w->pair); /* [A] the main thread aborts now */
  pthread_barrier_wait(&w->pair); /* [B] its abort returned */
}

static void body_race(rank_ctx *r) {
  world *w = r->w;
  rda_err err = {0};
  if (rank_create(r, FP, 30.0, &err) != RDA_OK) {
    rank_fail(r, "create: %s", err.msg);
    return;
  }
  const int me = r->rank;
  CUdeviceptr buf = rank_alloc(r, 64);
  pthread_barrier_wait(&w->bar); /* all created */
  if (me == 1 && buf != 0) rank_post1(r, 1, 0, buf, 64);
  pthread_barrier_wait(&w->bar); /* rank 1's send posted */
  if (me == 0 && buf != 0 && rank_post1(r, 0, 1, buf, 64)) {
    /* The pair matched as rank 0 posted: its wait's first poll finds the group done. */
    w->hooked = pthread_self();
    __atomic_store_n(&w->hook_armed, 1, __ATOMIC_RELEASE);
    fk.on_poll(race_hook, w);
    const double t = rt_now_s();
    const rda_status s = rda_transport_wait(r->t, &err);
    rank_record(r, s, &err, t);
    r->mark = count(w, 0, "abort");
    fk.on_poll(NULL, NULL);
    rda_err_clear(&err);
    r->status2 = rda_transport_barrier(r->t, &err);
    snprintf(r->msg2, sizeof r->msg2, "%s", err.msg);
  }
  if (me == 1 && buf != 0 && rda_transport_wait(r->t, &err) != RDA_OK)
    rank_fail(r, "wait: %s", err.msg);
  pthread_barrier_wait(&w->sync); /* [C] every call done */
  pthread_barrier_wait(&w->sync); /* [D] ranks 1 and 2 aborted */
  rda_transport_destroy(r->t);
  if (buf != 0) fk.mem_free(buf);
}

static void test_nccl_fake_abort_during_a_call_is_not_lost(void **state) {
  (void)state;
  world w;
  world_open(&w, 3, 0);
  pthread_t th[MAXP];
  world_start(&w, body_race, th);
  pthread_barrier_wait(&w.pair); /* [A] rank 0 is in its wait, past its look for a request */
  rda_transport_abort(w.r[0].t, "test: abort during a call");
  const long during = count(&w, 0, "abort");
  pthread_barrier_wait(&w.pair); /* [B] */
  pthread_barrier_wait(&w.sync); /* [C] */
  for (int q = 1; q < w.P; q++) main_abort_idle(&w, q, "test: stop the others");
  pthread_barrier_wait(&w.sync); /* [D] */
  world_join(&w, th);
  /* The call held the endpoint: the abort was filed for it to carry out. */
  if (during != 0) fail_msg("the abort did not wait for the running call (%ld aborts)", during);
  const rank_ctx *r = &w.r[0];
  print_message("an abort late in a wait: the wait returned %s; aborted %ld times by then\n",
                rda_status_string(r->status), r->mark);
  if (r->status != RDA_OK && strstr(r->msg, "test: abort during a call") == NULL)
    fail_msg("rank 0's wait: %s", r->msg);
  if (r->mark != 1)
    fail_msg(
        "rank 0: an abort filed during its wait was not carried out when the wait returned "
        "(the communicator aborted %ld times, expected 1)",
        r->mark);
  if (r->status2 != RDA_ERR_NCCL || strstr(r->msg2, "test: abort during a call") == NULL)
    fail_msg("rank 0's barrier after the abort: %s, %s", rda_status_string(r->status2), r->msg2);
  for (int q = 0; q < w.P; q++) expect_counts(&w, q, 1, 1, 0, 0);
  world_close(&w);
}

/* --- f, g. failed waits still order the caller's stream after the communication ---------- */

/* f: rank 0 receives from rank 1, which never sends (rank 0's timeout lowered to 0.5 s after a
 * creation under a long one); g: rank 0 sends 100 bytes to rank 1, which receives 99. */
enum { FAILED_TIMEOUT, FAILED_SIZES };

static void body_failed_wait(rank_ctx *r) {
  world *w = r->w;
  rda_err err = {0};
  if (rank_create(r, FP, 30.0, &err) != RDA_OK) {
    rank_fail(r, "create: %s", err.msg);
    return;
  }
  pthread_barrier_wait(&w->bar); /* all created */
  const int me = r->rank;
  const int active = me == 0 || (w->variant == FAILED_SIZES && me == 1);
  CUdeviceptr buf = 0;
  if (active) {
    buf = rank_alloc(r, 100);
    if (w->variant == FAILED_TIMEOUT) r->t->timeout_s = 0.5;
    r->mark = fk.waits(r->caller, r->comm);
    /* Sizes that differ may fail the later rank's group_end already (the fake matches the
     * pair as it is posted): either call fails, and either fences. */
    const double t = rt_now_s();
    rda_status s = buf == 0                       ? RDA_ERR_OUT_OF_MEMORY
                   : w->variant == FAILED_TIMEOUT ? rank_group1(r, 0, 1, buf, 64, &err)
                   : me == 0                      ? rank_group1(r, 1, 1, buf, 100, &err)
                                                  : rank_group1(r, 0, 0, buf, 99, &err);
    if (s == RDA_OK) s = rda_transport_wait(r->t, &err);
    rank_record(r, s, &err, t);
    r->mark2 = fk.waits(r->caller, r->comm);
    rank_expect_caller_idle(r, "after the failure");
  }
  pthread_barrier_wait(&w->bar); /* the failures are in */
  if (!active) rda_transport_abort(r->t, "test: a peer failed");
  rda_transport_destroy(r->t);
  if (buf != 0) fk.mem_free(buf);
}

static void test_nccl_fake_failed_wait_orders_the_caller(void **state) {
  (void)state;
  for (int v = 0; v < 2; v++) {
    world w;
    world_open(&w, 3, 0);
    w.variant = v;
    world_run(&w, body_failed_wait);
    for (int q = 0; q < (v == FAILED_SIZES ? 2 : 1); q++) {
      const rank_ctx *r = &w.r[q];
      const char *what = v == FAILED_TIMEOUT ? "timed out" : "invalid usage";
      if (r->status != RDA_ERR_NCCL || strstr(r->msg, what) == NULL)
        fail_msg("rank %d's group: %s, %s (expected RDA_ERR_NCCL, \"%s\")", q,
                 rda_status_string(r->status), r->msg, what);
      assert_one_line(r->msg);
      if (v == FAILED_SIZES && r->returned - r->called > 10.0)
        fail_msg("rank %d: sizes that differ failed only after %.2f s", q, r->returned - r->called);
      /* transport.h: a failed group still orders the caller's stream after the transfers. */
      if (r->mark2 <= r->mark)
        fail_msg(
            "rank %d: after the failure the caller's stream never waited for the "
            "communication stream (%ld waits before, %ld after)",
            q, r->mark, r->mark2);
      print_message("%s: %s (%.2f s); the caller's stream ordered after it\n",
                    v == FAILED_TIMEOUT ? "a peer that never sends" : "sizes that differ", r->msg,
                    r->returned - r->called);
    }
    for (int q = 0; q < w.P; q++) expect_counts(&w, q, 1, 1, 0, 0);
    world_close(&w);
  }
}

/* --- h. destroyed with a group posted: aborted before the buffers go back ---------------- */

static void body_destroy_in_flight(rank_ctx *r) {
  world *w = r->w;
  rda_err err = {0};
  if (rank_create(r, FP, 30.0, &err) != RDA_OK) {
    rank_fail(r, "create: %s", err.msg);
    return;
  }
  pthread_barrier_wait(&w->bar);
  CUdeviceptr buf = rank_alloc(r, 64);
  if (r->rank == 0) {
    /* Posted, never waited for: the destroy must stop it before the buffer is freed. */
    if (buf != 0) rank_post1(r, 0, 1, buf, 64);
    rda_transport_destroy(r->t);
    r->t = NULL;
    fk.mem_free(buf);
    buf = 0;
  }
  pthread_barrier_wait(&w->bar); /* rank 0 gone, its buffer freed */
  if (r->rank == 1 && buf != 0 && r->t != NULL) {
    /* The matching send: it must never land in rank 0's freed buffer. */
    r->t->timeout_s = 0.5;
    const double t = rt_now_s();
    if (rank_post1(r, 1, 0, buf, 64)) {
      const rda_status s = rda_transport_wait(r->t, &err);
      rank_record(r, s, &err, t);
    }
  } else if (r->t != NULL) {
    rda_transport_abort(r->t, "test: rank 0 left");
  }
  rda_transport_destroy(r->t);
  if (buf != 0) fk.mem_free(buf);
}

static void test_nccl_fake_destroy_with_a_group_in_flight(void **state) {
  (void)state;
  world w;
  world_open(&w, 3, 0);
  world_run(&w, body_destroy_in_flight);
  if (w.r[1].status != RDA_ERR_NCCL || strstr(w.r[1].msg, "timed out") == NULL)
    fail_msg("rank 1's send to the destroyed rank 0: %s, %s", rda_status_string(w.r[1].status),
             w.r[1].msg);
  /* Rank 0's communicator aborted by the destroy, not finalized (it had work in flight). */
  for (int q = 0; q < w.P; q++) expect_counts(&w, q, 1, 1, 0, 0);
  world_close(&w); /* no device access to the freed buffer */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nccl_fake_ring_moves_every_byte),
      cmocka_unit_test(test_nccl_fake_fingerprint_mismatch_fails_every_rank),
      cmocka_unit_test(test_nccl_fake_told_failure_fails_the_others_at_once),
      cmocka_unit_test(test_nccl_fake_missing_rank_times_out),
      cmocka_unit_test(test_nccl_fake_abort_from_another_thread),
      cmocka_unit_test(test_nccl_fake_abort_during_a_call_is_not_lost),
      cmocka_unit_test(test_nccl_fake_failed_wait_orders_the_caller),
      cmocka_unit_test(test_nccl_fake_destroy_with_a_group_in_flight),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
