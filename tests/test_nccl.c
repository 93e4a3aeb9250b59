/* test_nccl.c — the NCCL transport (runtime/transport_nccl.c) and the ring over NCCL through the
 * public API, on a one-rank communicator of GPU 0: every byte of grouped self send/recv, the
 * all-gather, the barrier, the byte counters, abort and a missing peer's timeout; rda_ring_*
 * with desc.nccl_unique_id against rda_forward / rda_backward. Needs a GPU and libnccl.so.2:
 * each GPU test skips (and says why) without them; the argument checks run everywhere. */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
// clang-format on

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "rda.h"
#include "rda_test.h"
#include "transport.h"

/* NVRTC, NCCL and the driver keep process-lifetime allocations of their own; not rda's leaks. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
  return "leak:libnvrtc\nleak:libnvrtc-builtins\nleak:libnccl\nleak:libcuda\n";
}

enum { NCCL_ID_BYTES = 128 };

static void assert_one_line(const char *msg) {
  assert_true(msg[0] != '\0');
  if (strchr(msg, '\n') != NULL) fail_msg("error message spans lines: %s", msg);
}

/* The cuda backend on GPU 0, or NULL (the caller skips, having said why). */
static rda_backend *open_gpu(void) {
  rda_backend *b = NULL;
  rda_err err = {0};
  if (rda_backend_cuda_open(&b, 0, &err) != RDA_OK) {
    print_message("skipped: no usable GPU: %s\n", err.msg);
    return NULL;
  }
  return b;
}

/* A fresh NCCL unique id, or 0 (the caller skips, having said why): libnccl.so.2 missing, or
 * rda built without nccl.h. */
static int nccl_id(void *id) {
  rda_err err = {0};
  if (rda_transport_nccl_unique_id(id, &err) != RDA_OK) {
    print_message("skipped: no NCCL: %s\n", err.msg);
    return 0;
  }
  return 1;
}

/* The GPU's backend and a fresh NCCL id, or NULL (the caller skips, having been told why). */
static rda_backend *open_gpu_and_nccl(void *id) {
  rda_backend *b = open_gpu();
  if (b != NULL && !nccl_id(id)) {
    b->destroy(b);
    return NULL;
  }
  return b;
}

/* Host-wait for everything enqueued so far on b's current stream, through an event. */
static rda_status sync_current(rda_backend *b, void *ev, rda_err *err) {
  int done = 0;
  RDA_TRY(b->event_record(b, ev, err));
  while (!done) RDA_TRY(b->event_query(b, ev, &done, err));
  return RDA_OK;
}

static void fill_random(unsigned char *x, size_t n) {
  rt_rng *r = rt_global_rng();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rt_rng_next(r);
    memcpy(x + i, &v, 8);
  }
  for (; i < n; i++) x[i] = (unsigned char)rt_rng_next(r);
}

/* Bytes that differ, and the first one. */
static size_t count_diff(const unsigned char *got, const unsigned char *want, size_t n,
                         size_t *first) {
  size_t bad = 0;
  *first = n;
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      if (bad++ == 0) *first = i;
    }
  return bad;
}

/* --- argument checks (no GPU needed) ------------------------------------------------------- */

static void test_nccl_create_rejects_bad_arguments(void **state) {
  (void)state;
  unsigned char id[NCCL_ID_BYTES];
  memset(id, 0x5A, sizeof id);
  void *fake_comm = id;   /* never used: every call below fails its checks first */
  rda_transport sentinel; /* *out must be set to NULL even on failure */
  rda_transport *t = &sentinel;
  rda_err err = {0};
  /* Neither or both of a communicator and a unique id. */
  assert_int_equal(rda_transport_nccl_create(NULL, NULL, 0, 1, NULL, NULL, 1, 5.0, &t, &err),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_null(t);
  assert_one_line(err.msg);
  assert_non_null(strstr(err.msg, "either a communicator or a unique id"));
  rda_err_clear(&err);
  t = &sentinel;
  assert_int_equal(rda_transport_nccl_create(fake_comm, id, 0, 1, NULL, NULL, 1, 5.0, &t, &err),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_null(t);
  assert_one_line(err.msg);
  /* Rank, size and timeout: checked before NCCL is loaded (a build without nccl.h reports
   * that instead). */
  unsigned char probe[NCCL_ID_BYTES];
  rda_err perr = {0};
  const int built_with_nccl = rda_transport_nccl_unique_id(probe, &perr) != RDA_ERR_UNSUPPORTED;
  const struct {
    int rank, size;
    double timeout;
  } bad[] = {{1, 1, 5.0}, {-1, 2, 5.0}, {0, 0, 5.0}, {0, 1, 0.0}, {0, 1, -1.0}, {0, 1, NAN}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rda_err_clear(&err);
    t = &sentinel;
    const rda_status s = rda_transport_nccl_create(NULL, id, bad[i].rank, bad[i].size, NULL,
                                                   NULL, 1, bad[i].timeout, &t, &err);
    assert_int_equal(s, built_with_nccl ? RDA_ERR_INVALID_ARGUMENT : RDA_ERR_UNSUPPORTED);
    assert_null(t);
    assert_one_line(err.msg);
  }
  /* The public API: a NULL id is an argument error; otherwise OK, or a clear reason. */
  assert_int_equal(rda_ring_nccl_unique_id(NULL), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line(rda_last_error(NULL));
  const rda_status s = rda_ring_nccl_unique_id(probe);
  if (s != RDA_OK) {
    assert_true(s == RDA_ERR_UNSUPPORTED || s == RDA_ERR_NCCL);
    assert_one_line(rda_last_error(NULL));
    print_message("note: rda_ring_nccl_unique_id: %s\n", rda_last_error(NULL));
  }
}

/* --- the transport on a one-rank communicator (GPU + NCCL) -------------------------------- */

enum { MSG_A = (3 << 20) + 7, MSG_B = (1 << 20) + 1, GATHER = 64 << 10, ROUNDS = 3 };

static void test_nccl_transport_one_rank_moves_every_byte(void **state) {
  (void)state;
  unsigned char id[NCCL_ID_BYTES];
  rda_backend *b = open_gpu_and_nccl(id);
  if (b == NULL) skip();
  rda_err err = {0};
  void *comm = NULL, *compute = NULL, *ev = NULL;
  assert_int_equal(b->stream_create(b, &comm, &err), RDA_OK);
  assert_int_equal(b->stream_create(b, &compute, &err), RDA_OK);
  assert_int_equal(b->event_create(b, &ev, &err), RDA_OK);
  /* The caller's stream: the transport orders its communication stream against it. */
  rda_backend_cuda_use_stream(compute);

  rda_transport *t = NULL;
  const double t0 = rt_now_s();
  if (rda_transport_nccl_create(NULL, id, 0, 1, comm, b, 0x0123456789abcdefULL, 30.0, &t, &err) !=
      RDA_OK)
    fail_msg("rda_transport_nccl_create: %s", err.msg);
  print_message("one-rank communicator up in %.2f s (fingerprint all-gather included)\n",
                rt_now_s() - t0);
  assert_non_null(t);
  assert_string_equal(t->vt->name, "nccl");
  assert_int_equal(t->rank, 0);
  assert_int_equal(t->size, 1);
  uint64_t sent = 1, received = 1;
  rda_transport_bytes(t, &sent, &received);
  assert_true(sent == 0 && received == 0); /* the fingerprint check is not counted */

  /* Two sends to self and two receives from self per group: the k-th send matches the k-th
   * receive, so A lands in ra and B in rb. Odd sizes, fresh random bytes every round, the
   * receive buffers poisoned on the caller's stream right before group_end. */
  const size_t sizes[2] = {MSG_A, MSG_B};
  unsigned char *host[2], *back[2];
  void *stage[2], *sbuf[2], *rbuf[2], *chk[2];
  for (int m = 0; m < 2; m++) {
    host[m] = malloc(sizes[m]);
    back[m] = malloc(sizes[m]);
    assert_true(host[m] != NULL && back[m] != NULL);
    assert_int_equal(b->alloc(b, sizes[m], &stage[m], &err), RDA_OK);
    assert_int_equal(b->alloc(b, sizes[m], &sbuf[m], &err), RDA_OK);
    assert_int_equal(b->alloc(b, sizes[m], &rbuf[m], &err), RDA_OK);
    assert_int_equal(b->alloc(b, sizes[m], &chk[m], &err), RDA_OK);
  }
  for (int round = 0; round < ROUNDS; round++) {
    for (int m = 0; m < 2; m++) {
      fill_random(host[m], sizes[m]);
      assert_int_equal(b->upload(b, stage[m], host[m], sizes[m], &err), RDA_OK);
      assert_int_equal(b->memset_async(b, sbuf[m], 0x11, sizes[m], &err), RDA_OK);
      assert_int_equal(b->copy_async(b, sbuf[m], stage[m], sizes[m], &err), RDA_OK);
      assert_int_equal(b->memset_async(b, rbuf[m], 0xEE, sizes[m], &err), RDA_OK);
    }
    assert_int_equal(rda_transport_group_start(t, &err), RDA_OK);
    assert_int_equal(rda_transport_send(t, 0, sbuf[0], MSG_A, &err), RDA_OK);
    assert_int_equal(rda_transport_send(t, 0, sbuf[1], MSG_B, &err), RDA_OK);
    assert_int_equal(rda_transport_recv(t, 0, rbuf[0], MSG_A, &err), RDA_OK);
    assert_int_equal(rda_transport_recv(t, 0, rbuf[1], MSG_B, &err), RDA_OK);
    if (rda_transport_group_end(t, &err) != RDA_OK || rda_transport_wait(t, &err) != RDA_OK)
      fail_msg("round %d: %s", round, err.msg);
    /* Ordered after the transfers by wait, with no host synchronization in between. */
    for (int m = 0; m < 2; m++)
      assert_int_equal(b->copy_async(b, chk[m], rbuf[m], sizes[m], &err), RDA_OK);
    if (sync_current(b, ev, &err) != RDA_OK) fail_msg("%s", err.msg);
    for (int m = 0; m < 2; m++) {
      memset(back[m], 0, sizes[m]);
      assert_int_equal(b->download(b, back[m], chk[m], sizes[m], &err), RDA_OK);
      size_t first = 0;
      const size_t bad = count_diff(back[m], host[m], sizes[m], &first);
      if (bad != 0)
        fail_msg(
            "round %d, message %c: %zu of %zu bytes wrong, the first at %zu (0x%02x, "
            "expected 0x%02x)",
            round, "AB"[m], bad, sizes[m], first, back[m][first], host[m][first]);
    }
  }
  rda_transport_bytes(t, &sent, &received);
  assert_true(sent == (uint64_t)ROUNDS * (MSG_A + MSG_B));
  assert_true(received == (uint64_t)ROUNDS * (MSG_A + MSG_B));

  /* The all-gather of one rank is a copy of the own block, not counted as moved. */
  fill_random(host[0], GATHER);
  assert_int_equal(b->upload(b, stage[0], host[0], GATHER, &err), RDA_OK);
  assert_int_equal(b->memset_async(b, rbuf[0], 0xEE, GATHER, &err), RDA_OK);
  if (rda_transport_allgather(t, stage[0], rbuf[0], GATHER, &err) != RDA_OK)
    fail_msg("rda_transport_allgather: %s", err.msg);
  assert_int_equal(b->copy_async(b, chk[0], rbuf[0], GATHER, &err), RDA_OK);
  if (sync_current(b, ev, &err) != RDA_OK) fail_msg("%s", err.msg);
  assert_int_equal(b->download(b, back[0], chk[0], GATHER, &err), RDA_OK);
  assert_memory_equal(back[0], host[0], GATHER);
  uint64_t sent2 = 0, received2 = 0;
  rda_transport_bytes(t, &sent2, &received2);
  assert_true(sent2 == sent && received2 == received);

  if (rda_transport_barrier(t, &err) != RDA_OK) fail_msg("rda_transport_barrier: %s", err.msg);

  /* Misuse is an argument error (one line) and leaves the communicator usable. */
  assert_int_equal(rda_transport_send(t, 0, sbuf[0], 16, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line(err.msg);
  rda_err_clear(&err);
  assert_int_equal(rda_transport_send(t, 1, sbuf[0], 16, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line(err.msg);
  rda_err_clear(&err);
  assert_int_equal(rda_transport_wait(t, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line(err.msg);
  rda_err_clear(&err);
  if (rda_transport_barrier(t, &err) != RDA_OK) fail_msg("barrier after misuse: %s", err.msg);

  /* Abort: every later call fails at once with one line naming the reason. */
  rda_transport_abort(t, "test: abort now");
  const double ta = rt_now_s();
  assert_int_equal(rda_transport_barrier(t, &err), RDA_ERR_NCCL);
  assert_one_line(err.msg);
  assert_non_null(strstr(err.msg, "test: abort now"));
  rda_err_clear(&err);
  assert_int_equal(rda_transport_group_start(t, &err), RDA_ERR_NCCL);
  assert_one_line(err.msg);
  rda_err_clear(&err);
  assert_int_equal(rda_transport_allgather(t, stage[0], rbuf[0], GATHER, &err), RDA_ERR_NCCL);
  assert_true(rt_now_s() - ta < 5.0);
  rda_transport_abort(t, "a second abort"); /* the first reason stays */
  rda_err_clear(&err);
  assert_int_equal(rda_transport_barrier(t, &err), RDA_ERR_NCCL);
  assert_non_null(strstr(err.msg, "test: abort now"));
  rda_transport_destroy(t);

  rda_backend_cuda_own_stream();
  for (int m = 0; m < 2; m++) {
    b->free(b, stage[m]), b->free(b, sbuf[m]), b->free(b, rbuf[m]), b->free(b, chk[m]);
    free(host[m]), free(back[m]);
  }
  b->event_destroy(b, ev);
  b->stream_destroy(b, compute);
  b->stream_destroy(b, comm);
  b->destroy(b);
}

/* A communicator of two ranks that only rank 0 joins: creation fails with RDA_ERR_NCCL after
 * the timeout (non-blocking init, then ncclCommAbort), never hangs. Run on a thread so that a
 * hang inside NCCL fails the test instead of blocking it. */
typedef struct lone_rank {
  rda_backend *b;
  unsigned char id[NCCL_ID_BYTES];
  double timeout_s, took_s;
  rda_status status;
  rda_transport *t;
  char msg[1024];
  pthread_mutex_t lock;
  int done;
} lone_rank;

static void *lone_rank_main(void *arg) {
  lone_rank *c = arg;
  rda_err err = {0};
  void *ev = NULL;
  rda_transport *t = NULL;
  const double t0 = rt_now_s();
  rda_status s = c->b->event_create(c->b, &ev, &err); /* makes the context current here */
  if (s == RDA_OK)
    s = rda_transport_nccl_create(NULL, c->id, 0, 2, NULL, NULL, 42, c->timeout_s, &t, &err);
  c->b->event_destroy(c->b, ev);
  pthread_mutex_lock(&c->lock);
  c->took_s = rt_now_s() - t0;
  c->status = s;
  c->t = t;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  c->done = 1;
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

static void test_nccl_transport_missing_peer_times_out(void **state) {
  (void)state;
  rda_backend *b = open_gpu();
  if (b == NULL) skip();
  static lone_rank c; /* static: a hung thread may still hold it after the test gives up */
  memset(&c, 0, sizeof c);
  pthread_mutex_init(&c.lock, NULL);
  if (!nccl_id(c.id)) {
    b->destroy(b);
    skip();
  }
  c.b = b;
  c.timeout_s = 2.0;
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, lone_rank_main, &c), 0);
  const double t0 = rt_now_s(), give_up = 90.0;
  int done = 0;
  while (!done && rt_now_s() - t0 < give_up) {
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL);
    pthread_mutex_lock(&c.lock);
    done = c.done;
    pthread_mutex_unlock(&c.lock);
  }
  if (!done) {
    pthread_detach(th); /* the backend stays alive for it: leaked on purpose */
    fail_msg(
        "rda_transport_nccl_create with a missing peer did not return within %.0f s "
        "(timeout %.1f s)",
        give_up, c.timeout_s);
  }
  pthread_join(th, NULL);
  print_message("missing peer: %s after %.2f s: %s\n", rda_status_string(c.status), c.took_s,
                c.msg);
  if (c.status == RDA_OK) {
    rda_transport_destroy(c.t);
    fail_msg("a communicator of 2 ranks came up with one rank");
  }
  assert_null(c.t);
  assert_int_equal(c.status, RDA_ERR_NCCL);
  assert_one_line(c.msg);
  assert_non_null(strstr(c.msg, "timed out"));
  assert_true(c.took_s >= c.timeout_s * 0.9 && c.took_s < c.timeout_s + 30.0);
  pthread_mutex_destroy(&c.lock);
  b->destroy(b);
}

/* --- the public ring API over NCCL, P = 1 (GPU + NCCL) ------------------------------------ */

enum { R_H = 4, R_HKV = 2, R_D = 64, R_B = 2, R_N = 512 };

static rda_attn_config ring_config(void) {
  rda_attn_config c = RDA_CONFIG_INIT;
  c.heads = R_H, c.kv_heads = R_HKV, c.head_dim = R_D, c.dtype = RDA_BF16, c.causal = 1;
  c.nbranch = 2;
  c.segments[0] = 64, c.dilations[0] = 1;
  c.segments[1] = 256, c.dilations[1] = 2;
  return c;
}

typedef int (*cu_sync_fn)(void);

/* A device buffer of n bytes filled from host (NULL: NaN-poisoned floats). */
static void *dev_from(rda_backend *b, const void *host, size_t n) {
  rda_err err = {0};
  void *d = NULL;
  if (b->alloc(b, n, &d, &err) != RDA_OK) fail_msg("alloc %zu bytes: %s", n, err.msg);
  if (host != NULL) {
    if (b->upload(b, d, host, n, &err) != RDA_OK) fail_msg("upload: %s", err.msg);
  } else {
    float *nan = malloc(n);
    assert_non_null(nan);
    rt_poison_f32(nan, n / sizeof(float));
    if (b->upload(b, d, nan, n, &err) != RDA_OK) fail_msg("upload: %s", err.msg);
    free(nan);
  }
  return d;
}

static float *host_from(rda_backend *b, const void *dev, size_t n) {
  rda_err err = {0};
  float *h = malloc(n);
  assert_non_null(h);
  if (b->download(b, h, dev, n, &err) != RDA_OK) fail_msg("download: %s", err.msg);
  return h;
}

static double *to_double(const float *x, size_t n) {
  double *d = malloc(n * sizeof *d);
  assert_non_null(d);
  for (size_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

/* Ring vs single device: within tol (relative L2), and whether bit-identical. */
static void compare_outputs(const char *what, const float *ring, const float *one, size_t n,
                            double tol) {
  double *a = to_double(ring, n), *e = to_double(one, n);
  assert_true(rt_check_rel_l2(what, a, e, n, tol));
  print_message("%s: %s\n", what,
                memcmp(ring, one, n * sizeof *ring) == 0 ? "bit-identical" : "within tolerance");
  free(a), free(e);
}

/* A caller's communicator, non-blocking and handed over while it may still be initializing
 * (NCCL refuses other calls on it until then): creation waits for it. Then a call from a
 * thread that has no context current (a framework's worker) still works: every transport call
 * makes the ring's context current. The communicator stays the caller's. */
#if defined(__has_include)
#if __has_include(<nccl.h>)
/* nccl.h (and the fp16/bf16 headers it pulls in) test undefined macros and declare f(). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#define TEST_HAVE_NCCL_H 1
#endif
#endif

typedef struct other_thread_call {
  rda_transport *t;
  uint64_t all[1];
  rda_status status;
  char msg[1024];
} other_thread_call;

static void *other_thread_gather(void *arg) {
  other_thread_call *c = arg;
  rda_err err = {0};
  c->status = rda_transport_gather8(c->t, 99, c->all, &err);
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  return NULL;
}

static void test_nccl_caller_comm_initializing_and_other_threads(void **state) {
  (void)state;
#ifndef TEST_HAVE_NCCL_H
  print_message("skipped: rda was built without nccl.h\n");
  skip();
#else
  unsigned char id[NCCL_ID_BYTES];
  rda_backend *b = open_gpu_and_nccl(id);
  if (b == NULL) skip();
  void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  assert_non_null(lib);
  typedef ncclResult_t (*init_fn)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
  typedef ncclResult_t (*comm_fn)(ncclComm_t);
  typedef ncclResult_t (*err_fn)(ncclComm_t, ncclResult_t *);
  void *si = dlsym(lib, "ncclCommInitRankConfig"), *sd = dlsym(lib, "ncclCommDestroy");
  void *se = dlsym(lib, "ncclCommGetAsyncError");
  assert_true(si != NULL && sd != NULL && se != NULL);
  init_fn init;
  comm_fn destroy;
  err_fn async_error;
  memcpy(&init, &si, sizeof si), memcpy(&destroy, &sd, sizeof sd);
  memcpy(&async_error, &se, sizeof se);
  rda_err err = {0};
  void *ev = NULL;
  assert_int_equal(b->event_create(b, &ev, &err), RDA_OK); /* makes the context current */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  ncclComm_t comm = NULL;
  const ncclResult_t r = init(&comm, 1, u, 0, &cfg);
  assert_true(r == ncclSuccess || r == ncclInProgress);
  void *cstream = NULL;
  assert_int_equal(b->stream_create(b, &cstream, &err), RDA_OK);
  rda_transport *t = NULL;
  if (rda_transport_nccl_create(comm, NULL, 0, 1, cstream, b, 7, 30.0, &t, &err) != RDA_OK)
    fail_msg("create with a communicator still initializing: %s", err.msg);
  other_thread_call c = {.t = t};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, other_thread_gather, &c), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  if (c.status != RDA_OK) fail_msg("a call from another thread: %s", c.msg);
  assert_true(c.all[0] == 99);
  rda_transport_destroy(t);
  ncclResult_t state_now = ncclInProgress;
  assert_int_equal(async_error(comm, &state_now), ncclSuccess);
  assert_int_equal(state_now, ncclSuccess); /* untouched: still the caller's, healthy */
  /* A rank that failed before it could join tells the others on the caller's communicator and
   * leaves it healthy: a ring joins it again afterwards. */
  if (rda_transport_nccl_tell(comm, NULL, 0, 1, cstream, b, RDA_ERR_INVALID_ARGUMENT, 30.0, &err) !=
      RDA_OK)
    fail_msg("tell on the caller's communicator: %s", err.msg);
  state_now = ncclInProgress;
  assert_int_equal(async_error(comm, &state_now), ncclSuccess);
  assert_int_equal(state_now, ncclSuccess);
  t = NULL;
  if (rda_transport_nccl_create(comm, NULL, 0, 1, cstream, b, 7, 30.0, &t, &err) != RDA_OK)
    fail_msg("create after a tell: %s", err.msg);
  rda_transport_destroy(t);
  assert_int_equal(destroy(comm), ncclSuccess);
  b->stream_destroy(b, cstream);
  b->event_destroy(b, ev);
  b->destroy(b);
#endif
}

static void test_ring_over_nccl_one_rank_matches_single_device(void **state) {
  (void)state;
  rda_ctx *ctx = NULL;
  if (rda_ctx_create_cuda(&ctx, 0) != RDA_OK) {
    print_message("skipped: no usable GPU: %s\n", rda_last_error(NULL));
    skip();
  }
  unsigned char id[NCCL_ID_BYTES];
  if (rda_ring_nccl_unique_id(id) != RDA_OK) {
    print_message("skipped: no NCCL: %s\n", rda_last_error(NULL));
    rda_ctx_destroy(ctx);
    skip();
  }
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  assert_non_null(lib);
  void *sym = dlsym(lib, "cuCtxSynchronize");
  assert_non_null(sym);
  cu_sync_fn ctx_sync;
  memcpy(&ctx_sync, &sym, sizeof sym);
  rda_backend *b = NULL;
  rda_err err = {0};
  assert_int_equal(rda_backend_cuda_open(&b, 0, &err), RDA_OK);

  const rda_attn_config cfg = ring_config();
  rda_plan *plan = NULL;
  if (rda_plan_create(&plan, ctx, &cfg, RDA_PLAN_WITH_BACKWARD) != RDA_OK)
    fail_msg("rda_plan_create: %s", rda_last_error(ctx));
  rda_ring_desc desc = RDA_RING_DESC_INIT;
  desc.n = R_N, desc.ranks = 1, desc.rank = 0, desc.timeout_s = 30.0;
  desc.nccl_unique_id = id;
  rda_ring *ring = NULL;
  /* A desc its shape checks refuse: the rank still joins, on its own id, to tell the others
   * (here none), and returns its own error, at once and in one line. */
  unsigned char id_bad[NCCL_ID_BYTES];
  assert_int_equal(rda_ring_nccl_unique_id(id_bad), RDA_OK);
  rda_ring_desc bad = desc;
  bad.nccl_unique_id = id_bad, bad.n = 2 * R_N + 1, bad.layout = RDA_LAYOUT_ZIGZAG;
  const double t_bad = rt_now_s();
  assert_int_equal(rda_ring_create(&ring, plan, &bad), RDA_ERR_INVALID_ARGUMENT);
  assert_null(ring);
  assert_one_line(rda_last_error(ctx));
  if (strstr(rda_last_error(ctx), "zigzag") == NULL) fail_msg("%s", rda_last_error(ctx));
  if (rt_now_s() - t_bad > 20.0) fail_msg("a refused desc took %.1f s", rt_now_s() - t_bad);
  if (rda_ring_create(&ring, plan, &desc) != RDA_OK)
    fail_msg("rda_ring_create over NCCL: %s", rda_last_error(ctx));
  long long rows = 0;
  int npieces = 0;
  long long lo[2], hi[2];
  assert_int_equal(rda_ring_rows(ring, &rows, &npieces, lo, hi), RDA_OK);
  assert_true(rows == R_N && npieces == 1 && lo[0] == 0 && hi[0] == R_N);

  /* Inputs rounded to bf16; dlse random too. */
  const long long B = R_B, N = R_N, H = R_H, Hkv = R_HKV, D = R_D;
  const size_t nq = (size_t)(B * N * H * D), nk = (size_t)(B * N * Hkv * D);
  const size_t nl = (size_t)(B * H * N);
  rda_config c;
  rt_config_make(&c, R_H, R_HKV, R_D, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, cfg.nbranch, cfg.segments,
                 cfg.dilations);
  double *q = rt_normal(nq, RDA_DTYPE_BF16), *k = rt_normal(nk, RDA_DTYPE_BF16);
  double *v = rt_normal(nk, RDA_DTYPE_BF16), *dout = rt_normal(nq, RDA_DTYPE_BF16);
  double *dlse = rt_normal(nl, RT_DTYPE_F64);
  long long qs[3], ks[3];
  rt_strides_contig(N, H, D, qs);
  rt_strides_contig(N, Hkv, D, ks);
  uint16_t *qb = rt_make_bits(q, B, N, H, D, qs, RDA_DTYPE_BF16, NULL);
  uint16_t *kb = rt_make_bits(k, B, N, Hkv, D, ks, RDA_DTYPE_BF16, NULL);
  uint16_t *vb = rt_make_bits(v, B, N, Hkv, D, ks, RDA_DTYPE_BF16, NULL);
  uint16_t *dob = rt_make_bits(dout, B, N, H, D, qs, RDA_DTYPE_BF16, NULL);
  float *dlsef = malloc(nl * sizeof *dlsef);
  assert_non_null(dlsef);
  for (size_t i = 0; i < nl; i++) dlsef[i] = (float)dlse[i];

  void *dq_in = dev_from(b, qb, nq * 2), *dk_in = dev_from(b, kb, nk * 2);
  void *dv_in = dev_from(b, vb, nk * 2), *ddo = dev_from(b, dob, nq * 2);
  void *ddl = dev_from(b, dlsef, nl * 4);
  /* [0]: the ring, [1]: the single device; every output poisoned. */
  void *o[2], *l[2], *gq[2], *gk[2], *gv[2];
  for (int i = 0; i < 2; i++) {
    o[i] = dev_from(b, NULL, nq * 4), l[i] = dev_from(b, NULL, nl * 4);
    gq[i] = dev_from(b, NULL, nq * 4), gk[i] = dev_from(b, NULL, nk * 4);
    gv[i] = dev_from(b, NULL, nk * 4);
  }
  const long long sq[4] = {B, N, H, D}, sk[4] = {B, N, Hkv, D}, sl[3] = {B, H, N};
  rda_tensor tq, tk, tv, tdo, tdl, to[2], tl[2], tgq[2], tgk[2], tgv[2];
  rda_tensor_contiguous(&tq, dq_in, RDA_BF16, 4, sq);
  rda_tensor_contiguous(&tk, dk_in, RDA_BF16, 4, sk);
  rda_tensor_contiguous(&tv, dv_in, RDA_BF16, 4, sk);
  rda_tensor_contiguous(&tdo, ddo, RDA_BF16, 4, sq);
  rda_tensor_contiguous(&tdl, ddl, RDA_FP32, 3, sl);
  for (int i = 0; i < 2; i++) {
    rda_tensor_contiguous(&to[i], o[i], RDA_FP32, 4, sq);
    rda_tensor_contiguous(&tl[i], l[i], RDA_FP32, 3, sl);
    rda_tensor_contiguous(&tgq[i], gq[i], RDA_FP32, 4, sq);
    rda_tensor_contiguous(&tgk[i], gk[i], RDA_FP32, 4, sk);
    rda_tensor_contiguous(&tgv[i], gv[i], RDA_FP32, 4, sk);
  }

  /* Forward: the ring over NCCL, then the single device, on the default stream. */
  size_t wr = 0, w1 = 0, wbr = 0, wb1 = 0;
  assert_int_equal(rda_ring_workspace_size(ring, B, 0, &wr), RDA_OK);
  assert_int_equal(rda_plan_workspace_size(plan, B, N, &w1), RDA_OK);
  assert_int_equal(rda_ring_workspace_size(ring, B, 1, &wbr), RDA_OK);
  assert_int_equal(rda_plan_backward_workspace_size(plan, B, N, &wb1), RDA_OK);
  size_t wmax = wr > w1 ? wr : w1;
  wmax = wmax > wbr ? wmax : wbr;
  wmax = wmax > wb1 ? wmax : wb1;
  void *ws = NULL;
  assert_int_equal(b->alloc(b, wmax > 0 ? wmax : 256, &ws, &err), RDA_OK);
  if (rda_ring_forward(ring, &tq, &tk, &tv, &to[0], &tl[0], ws, wr, NULL) != RDA_OK)
    fail_msg("rda_ring_forward: %s", rda_last_error(ctx));
  assert_int_equal(ctx_sync(), 0);
  if (rda_forward(plan, &tq, &tk, &tv, &to[1], &tl[1], ws, w1, NULL) != RDA_OK)
    fail_msg("rda_forward: %s", rda_last_error(ctx));
  assert_int_equal(ctx_sync(), 0);
  float *of[2], *lf[2];
  for (int i = 0; i < 2; i++)
    of[i] = host_from(b, o[i], nq * 4), lf[i] = host_from(b, l[i], nl * 4);
  const rt_tol tol = rt_tolerance(RDA_DTYPE_BF16);
  compare_outputs("ring O vs single-device O", of[0], of[1], nq, tol.o_rel_l2);
  double lse_diff = 0.0;
  for (size_t i = 0; i < nl; i++) {
    if (isinf(lf[0][i]) || isinf(lf[1][i])) {
      if (lf[0][i] != lf[1][i])
        fail_msg("LSE %zu: ring %g, single device %g", i, lf[0][i], lf[1][i]);
      continue;
    }
    const double d = fabs((double)lf[0][i] - (double)lf[1][i]);
    if (!(d <= tol.lse_abs)) fail_msg("LSE %zu: ring %g, single device %g", i, lf[0][i], lf[1][i]);
    lse_diff = d > lse_diff ? d : lse_diff;
  }
  print_message("ring LSE vs single-device LSE: max |diff| %.3g\n", lse_diff);
  double *o_ref, *lse_ref;
  rt_reference(&c, B, N, q, k, v, &o_ref, &lse_ref);
  const long long ls[2] = {H * N, N};
  assert_true(rt_check_fwd("ring over NCCL vs reference", &c, B, N, of[0], qs, lf[0], ls, o_ref,
                           lse_ref, NULL));
  assert_true(rt_check_fwd("single device vs reference", &c, B, N, of[1], qs, lf[1], ls, o_ref,
                           lse_ref, NULL));

  /* Backward: each from its own forward's o and lse. */
  if (rda_ring_backward(ring, &tq, &tk, &tv, &to[0], &tl[0], &tdo, &tdl, &tgq[0], &tgk[0], &tgv[0],
                        ws, wbr, NULL) != RDA_OK)
    fail_msg("rda_ring_backward: %s", rda_last_error(ctx));
  assert_int_equal(ctx_sync(), 0);
  if (rda_backward(plan, &tq, &tk, &tv, &to[1], &tl[1], &tdo, &tdl, &tgq[1], &tgk[1], &tgv[1], ws,
                   wb1, NULL) != RDA_OK)
    fail_msg("rda_backward: %s", rda_last_error(ctx));
  assert_int_equal(ctx_sync(), 0);
  float *gqf[2], *gkf[2], *gvf[2];
  for (int i = 0; i < 2; i++) {
    gqf[i] = host_from(b, gq[i], nq * 4);
    gkf[i] = host_from(b, gk[i], nk * 4);
    gvf[i] = host_from(b, gv[i], nk * 4);
  }
  compare_outputs("ring dQ vs single-device dQ", gqf[0], gqf[1], nq, tol.grad_rel_l2);
  compare_outputs("ring dK vs single-device dK", gkf[0], gkf[1], nk, tol.grad_rel_l2);
  compare_outputs("ring dV vs single-device dV", gvf[0], gvf[1], nk, tol.grad_rel_l2);
  double *dq_ref, *dk_ref, *dv_ref;
  rt_reference_bwd(&c, B, N, q, k, v, dout, dlse, &dq_ref, &dk_ref, &dv_ref);
  assert_true(rt_check_bwd("ring over NCCL gradients vs reference", &c, B, N, gqf[0], qs, gkf[0],
                           ks, gvf[0], ks, dq_ref, dk_ref, dv_ref, NULL));

  /* One rank moves nothing between ranks. */
  rda_ring_stats st;
  assert_int_equal(rda_ring_get_stats(ring, &st), RDA_OK);
  assert_true(st.rows == N && st.bytes_sent == st.bytes_received);
  print_message("ring stats: rows %lld, sent %llu, received %llu, peak %llu bytes\n", st.rows,
                st.bytes_sent, st.bytes_received, st.peak_bytes);

  /* Abort: the next call fails with RDA_ERR_NCCL and one line naming the reason. */
  rda_ring_abort(ring, "test: ring stopped");
  assert_int_equal(rda_ring_forward(ring, &tq, &tk, &tv, &to[0], &tl[0], ws, wr, NULL),
                   RDA_ERR_NCCL);
  assert_one_line(rda_last_error(ctx));
  assert_non_null(strstr(rda_last_error(ctx), "test: ring stopped"));
  assert_int_equal(ctx_sync(), 0);
  rda_ring_destroy(ring);

  for (int i = 0; i < 2; i++) {
    b->free(b, o[i]), b->free(b, l[i]), b->free(b, gq[i]), b->free(b, gk[i]), b->free(b, gv[i]);
    free(of[i]), free(lf[i]), free(gqf[i]), free(gkf[i]), free(gvf[i]);
  }
  b->free(b, dq_in), b->free(b, dk_in), b->free(b, dv_in), b->free(b, ddo), b->free(b, ddl);
  b->free(b, ws);
  b->destroy(b);
  rda_plan_destroy(plan);
  rda_ctx_destroy(ctx);
  dlclose(lib);
  free(q), free(k), free(v), free(dout), free(dlse), free(dlsef);
  free(qb), free(kb), free(vb), free(dob);
  free(o_ref), free(lse_ref), free(dq_ref), free(dk_ref), free(dv_ref);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nccl_create_rejects_bad_arguments),
      cmocka_unit_test(test_nccl_transport_one_rank_moves_every_byte),
      cmocka_unit_test(test_ring_over_nccl_one_rank_matches_single_device),
      cmocka_unit_test(test_nccl_caller_comm_initializing_and_other_threads),
      /* Last: if NCCL hangs in an abort, the thread it leaves behind affects nothing else. */
      cmocka_unit_test(test_nccl_transport_missing_peer_times_out),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
