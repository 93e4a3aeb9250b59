/* test_transport.c — the virtual-rank transports: P threads exchange deterministic random K/V
 * blocks exactly as the ring plan says, every received byte checked, bytes moved equal to the
 * plan's and `rdagen ring-sim`'s; fingerprint mismatch, injected failures, adversarial orders.
 * Each test runs over the host world and over the device world with emulator backends (the
 * plan matrix with one backend per rank, as with one GPU context per rank thread; the others
 * with one backend shared by every rank, as a process would share one GPU backend), buffers
 * in backend memory filled and read back through the backend. A fake backend with truly
 * asynchronous streams checks the device transport's event ordering. */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gen.h"
#include "rda_test.h"
#include "ring_plan.h"
#include "transport.h"

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27, x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* The "K/V" element of a global row: what every rank would hold for that row. */
static uint16_t kv_value(uint64_t seed, int64_t row, int kvh, int which, int d) {
  return (uint16_t)mix(seed ^ mix((uint64_t)row * 1000003u + (uint64_t)kvh * 131u +
                                  (uint64_t)which * 7u + (uint64_t)d * 0x10001u));
}

/* A block as the ring packs it: ranges, rows, the class's kv heads, K then V, D elements. */
static void pack_block(uint16_t *buf, const rda_ring_xfer *x, int64_t stride,
                       const rda_ring_class *cl, int D, uint64_t seed) {
  size_t o = 0;
  for (int g = 0; g < x->nranges; g++)
    for (int64_t t = 0; t < x->count[g]; t++)
      for (int v = 0; v < cl->nkv; v++)
        for (int which = 0; which < 2; which++)
          for (int d = 0; d < D; d++)
            buf[o++] = kv_value(seed, x->first[g] + t * stride, cl->kv_heads[v], which, d);
}

/* Elements of buf that differ from the packed block. */
static long long check_block(const uint16_t *buf, const rda_ring_xfer *x, int64_t stride,
                             const rda_ring_class *cl, int D, uint64_t seed) {
  size_t o = 0;
  long long bad = 0;
  for (int g = 0; g < x->nranges; g++)
    for (int64_t t = 0; t < x->count[g]; t++)
      for (int v = 0; v < cl->nkv; v++)
        for (int which = 0; which < 2; which++)
          for (int d = 0; d < D; d++)
            bad += buf[o++] != kv_value(seed, x->first[g] + t * stride, cl->kv_heads[v], which, d);
  return bad;
}

/* malloc for rank threads (cmocka's asserts are not for threads): out of memory aborts. */
static void *xmalloc(size_t n) {
  void *p = malloc(n > 0 ? n : 1);
  if (p == NULL) abort();
  return p;
}

/* --- a world of either kind ------------------------------------------------------------------ */

enum { KIND_HOST = 0, KIND_DEVICE = 1 };

typedef struct tworld {
  int kind;
  rda_host_world *host;
  rda_device_world *dev;
  rda_backend *shared; /* device world: every rank's backend, or NULL for one per rank */
} tworld;

static rda_status tworld_create(tworld *w, int kind, int shared, int P, double timeout_s,
                                rda_err *err) {
  memset(w, 0, sizeof *w);
  w->kind = kind;
  if (kind == KIND_HOST) return rda_host_world_create(P, timeout_s, &w->host, err);
  if (shared) RDA_TRY(rda_backend_emu_open(&w->shared, 90, err));
  return rda_device_world_create(P, timeout_s, &w->dev, err);
}

static void tworld_destroy(tworld *w) {
  rda_host_world_destroy(w->host);
  rda_device_world_destroy(w->dev);
  if (w->shared != NULL) w->shared->destroy(w->shared);
  memset(w, 0, sizeof *w);
}

/* A rank's backend: NULL in a host world (buffers are malloc'd), else the shared one or one
 * opened for the rank (*own set: the rank destroys it). */
static rda_backend *rank_backend(const tworld *w, int *own) {
  *own = 0;
  if (w->kind == KIND_HOST) return NULL;
  if (w->shared != NULL) return w->shared;
  rda_backend *b = NULL;
  rda_err err = {0};
  if (rda_backend_emu_open(&b, 90, &err) != RDA_OK) abort();
  *own = 1;
  return b;
}

static rda_status tworld_join(tworld *w, int rank, uint64_t fp, rda_backend *b, rda_transport **t,
                              rda_err *err) {
  if (w->kind == KIND_HOST) return rda_host_world_join(w->host, rank, fp, t, err);
  return rda_device_world_join(w->dev, rank, fp, b, t, err);
}

/* Buffers of a rank: host memory, or backend memory written and read through the backend. */
static void *buf_alloc(rda_backend *b, size_t n) {
  if (b == NULL) return xmalloc(n);
  void *p = NULL;
  rda_err err = {0};
  if (b->alloc(b, n > 0 ? n : 1, &p, &err) != RDA_OK) abort();
  return p;
}

static void buf_free(rda_backend *b, void *p) {
  if (b == NULL)
    free(p);
  else if (p != NULL)
    b->free(b, p);
}

static void buf_put(rda_backend *b, void *dst, const void *src, size_t n) {
  rda_err err = {0};
  if (b == NULL)
    memcpy(dst, src, n);
  else if (b->upload(b, dst, src, n, &err) != RDA_OK)
    abort();
}

static void buf_get(rda_backend *b, void *dst, const void *src, size_t n) {
  rda_err err = {0};
  if (b == NULL)
    memcpy(dst, src, n);
  else if (b->download(b, dst, src, n, &err) != RDA_OK)
    abort();
}

/* Poison: the device path goes through the backend's stream-ordered memset. */
static void buf_poison(rda_backend *b, void *p, int byte, size_t n) {
  rda_err err = {0};
  if (b == NULL)
    memset(p, byte, n);
  else if (b->memset_async(b, p, byte, n, &err) != RDA_OK)
    abort();
}

static void rank_backend_close(rda_backend *b, int own) {
  if (own) b->destroy(b);
}

enum { MODE_PLAN = 0, MODE_ABORT = 1, MODE_SILENT = 2, MODE_ABSENT = 3 };

typedef struct rank_ctx {
  tworld *world;
  const rda_ring_plan *plan;
  int rank, mode;
  uint64_t fingerprint, seed;
  int jitter;           /* random sleeps between posting and waiting */
  int fail_after;       /* MODE_ABORT, MODE_SILENT: steps done before failing */
  long silent_us;       /* MODE_SILENT: the longest the rank stays away */
  struct rank_ctx *all; /* every rank's context (run_world), and their count */
  int P;
  /* Non-NULL: every rank that joins waits here first (its backend open) and times itself from
   * there, so that a thread the machine starts late is neither the one a timeout names nor
   * counted in the others' time. */
  pthread_barrier_t *start;
  atomic_int finished;
  /* results */
  rda_status status;
  char msg[1024];
  uint64_t sent, received;
  long long bad, checked;
  double elapsed;
} rank_ctx;

static void *plan_rank(void *arg) {
  rank_ctx *c = arg;
  double t0 = rt_now_s();
  rda_err err = {0};
  rda_transport *t = NULL;
  rda_ring_step *steps = NULL;
  int64_t nsteps = 0;
  rt_rng rng;
  rt_rng_seed(&rng, c->seed + 977u * (uint64_t)c->rank);
  const rda_config *cfg = rda_ring_plan_config(c->plan);
  const int D = cfg->head_dim;
  int own = 0;
  rda_backend *b = rank_backend(c->world, &own);
  if (c->mode == MODE_ABSENT) goto done;
  if (c->start != NULL) {
    pthread_barrier_wait(c->start);
    t0 = rt_now_s();
  }
  if (tworld_join(c->world, c->rank, c->fingerprint, b, &t, &err) != RDA_OK) goto done;
  if (rda_ring_plan_steps(c->plan, c->rank, &steps, &nsteps, &err) != RDA_OK) goto done;
  for (int64_t s = 0; s < nsteps && err.status == RDA_OK; s++) {
    const rda_ring_step *st = &steps[s];
    if (c->mode == MODE_ABORT && s == c->fail_after) {
      rda_transport_abort(t, "injected failure");
      rda_err_set(&err, RDA_ERR_NCCL, "rank %d: aborted on purpose", c->rank);
      break;
    }
    if (c->mode == MODE_SILENT && s == c->fail_after) {
      /* Posts nothing more; leaves only after the others gave up (or silent_us passed). */
      for (int x = 0; x < c->P; x++)
        while (x != c->rank && !atomic_load(&c->all[x].finished) &&
               rt_now_s() - t0 < 1e-6 * (double)c->silent_us)
          sleep_us(5000);
      rda_err_set(&err, RDA_ERR_NCCL, "rank %d: stayed silent on purpose", c->rank);
      break;
    }
    rda_ring_class cl;
    rda_ring_plan_class(c->plan, st->cls, &cl);
    uint16_t *sb[2] = {NULL, NULL}, *rb[2] = {NULL, NULL}; /* the rank's buffers */
    uint16_t *host = NULL;                                 /* staging for packing and checking */
    size_t most = 0;
    for (int k = 0; k < st->nsend; k++) most = st->send[k].bytes > most ? st->send[k].bytes : most;
    for (int k = 0; k < st->nrecv; k++) most = st->recv[k].bytes > most ? st->recv[k].bytes : most;
    host = xmalloc(most);
    for (int k = 0; k < st->nsend; k++) {
      sb[k] = buf_alloc(b, st->send[k].bytes);
      pack_block(host, &st->send[k], st->stride, &cl, D, c->seed);
      buf_put(b, sb[k], host, st->send[k].bytes);
    }
    for (int k = 0; k < st->nrecv; k++) {
      rb[k] = buf_alloc(b, st->recv[k].bytes);
      buf_poison(b, rb[k], 0xA5, st->recv[k].bytes);
    }
    /* Post the group's operations in a random order. */
    int order[4], nops = 0;
    for (int k = 0; k < st->nsend; k++) order[nops++] = k;
    for (int k = 0; k < st->nrecv; k++) order[nops++] = 2 + k;
    for (int k = nops - 1; k > 0; k--) {
      const int q = (int)rt_rng_range(&rng, 0, k), tmp = order[k];
      order[k] = order[q], order[q] = tmp;
    }
    rda_transport_group_start(t, &err); /* on failure nothing below posts; buffers freed */
    for (int k = 0; k < nops && err.status == RDA_OK; k++) {
      if (order[k] < 2)
        rda_transport_send(t, st->send[order[k]].peer, sb[order[k]], st->send[order[k]].bytes,
                           &err);
      else
        rda_transport_recv(t, st->recv[order[k] - 2].peer, rb[order[k] - 2],
                           st->recv[order[k] - 2].bytes, &err);
    }
    if (err.status == RDA_OK && rda_transport_group_end(t, &err) == RDA_OK) {
      if (c->jitter) sleep_us((long)rt_rng_range(&rng, 0, 300));
      if (rda_transport_wait(t, &err) == RDA_OK)
        for (int k = 0; k < st->nrecv; k++) {
          buf_get(b, host, rb[k], st->recv[k].bytes);
          c->bad += check_block(host, &st->recv[k], st->stride, &cl, D, c->seed);
          c->checked += (long long)(st->recv[k].bytes / 2);
        }
    }
    for (int k = 0; k < 2; k++) buf_free(b, sb[k]), buf_free(b, rb[k]);
    free(host);
  }
done:
  if (t != NULL) rda_transport_bytes(t, &c->sent, &c->received);
  rda_transport_destroy(t);
  rank_backend_close(b, own);
  free(steps);
  c->status = err.status;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  c->elapsed = rt_now_s() - t0;
  atomic_store(&c->finished, 1);
  return NULL;
}

/* Run P rank threads over one world of `kind` (device: one emulator backend per rank); ctx[P]
 * filled by the caller except world and results. */
static void run_world(int kind, rank_ctx *ctx, int P, double timeout_s) {
  tworld w;
  rda_err err = {0};
  if (tworld_create(&w, kind, 0, P, timeout_s, &err) != RDA_OK) fail_msg("%s", err.msg);
  pthread_t *th = calloc((size_t)P, sizeof *th);
  for (int x = 0; x < P; x++) {
    ctx[x].world = &w, ctx[x].all = ctx, ctx[x].P = P;
    atomic_store(&ctx[x].finished, 0);
  }
  for (int x = 0; x < P; x++) {
    assert_int_equal(pthread_create(&th[x], NULL, plan_rank, &ctx[x]), 0);
  }
  for (int x = 0; x < P; x++) pthread_join(th[x], NULL);
  free(th);
  tworld_destroy(&w);
}

/* The plan executed over P virtual ranks: every byte right, byte counts equal the plan's. */
static void exchange_plan(int kind, const rda_config *c, long long n, int P, int layout,
                          int jitter) {
  rda_ring_plan *plan = NULL;
  rda_err err = {0};
  if (rda_ring_plan_create(c, n, P, layout, &plan, &err) != RDA_OK) fail_msg("%s", err.msg);
  rank_ctx *ctx = calloc((size_t)P, sizeof *ctx);
  const uint64_t fp = rda_ring_fingerprint(c, n, P, layout);
  for (int x = 0; x < P; x++) {
    ctx[x].plan = plan, ctx[x].rank = x, ctx[x].fingerprint = fp;
    ctx[x].seed = rt_seed_value() + (uint64_t)n, ctx[x].jitter = jitter;
  }
  run_world(kind, ctx, P, 20.0);
  for (int x = 0; x < P; x++) {
    const rda_ring_rank *rk = rda_ring_plan_rank(plan, x);
    if (ctx[x].status != RDA_OK)
      fail_msg("%s N %lld P %d %s rank %d: %s", kind ? "device" : "host", n, P,
               rda_ring_layout_name(layout), x, ctx[x].msg);
    if (ctx[x].bad != 0)
      fail_msg("N %lld P %d rank %d: %lld of %lld received elements wrong (seed %llu)", n, P, x,
               ctx[x].bad, ctx[x].checked, (unsigned long long)rt_seed_value());
    if (ctx[x].sent != rk->bytes_sent || ctx[x].received != rk->bytes_received)
      fail_msg("N %lld P %d rank %d: moved %llu/%llu bytes, plan says %llu/%llu", n, P, x,
               (unsigned long long)ctx[x].sent, (unsigned long long)ctx[x].received,
               (unsigned long long)rk->bytes_sent, (unsigned long long)rk->bytes_received);
    if (ctx[x].checked * 2 != (long long)rk->bytes_received) fail_msg("not every byte checked");
  }
  free(ctx);
  rda_ring_plan_destroy(plan);
}

static void moves_exactly_the_plans_blocks(int kind) {
  static const struct {
    int heads, kv, offsets, nb;
    long long w[3], r[3];
  } cases[] = {
      {4, 2, RDA_OFFSETS_MOD, 3, {8, 16, 1000}, {1, 2, 4}},
      {6, 2, RDA_OFFSETS_GROUP, 3, {16, 24, 1000}, {1, 2, 3}},
      {8, 4, RDA_OFFSETS_BLOCK, 2, {12, 40, 0}, {2, 3, 0}},
      {2, 1, RDA_OFFSETS_MOD, 1, {30, 0, 0}, {1, 0, 0}},
  };
  static const long long ns[] = {37, 96};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int causal = 0; causal < 2; causal++) {
      rda_config c;
      rt_config_make(&c, cases[k].heads, cases[k].kv, 32, RDA_DTYPE_BF16, causal, cases[k].offsets,
                     cases[k].nb, cases[k].w, cases[k].r);
      for (size_t a = 0; a < 2; a++)
        for (int P = 1; P <= 8; P++) {
          exchange_plan(kind, &c, ns[a], P, RDA_RING_CONTIGUOUS, (P + (int)a) % 3 == 0);
          if (ns[a] % (2 * P) == 0) exchange_plan(kind, &c, ns[a], P, RDA_RING_ZIGZAG, P % 2);
        }
    }
}

static void test_transport_moves_exactly_the_plans_blocks(void **state) {
  (void)state;
  moves_exactly_the_plans_blocks(KIND_HOST);
}

static void test_device_transport_moves_exactly_the_plans_blocks(void **state) {
  (void)state;
  moves_exactly_the_plans_blocks(KIND_DEVICE);
}

/* The bytes of `rdagen ring-sim --json` per rank, in rank order. */
static void sim_bytes_cli(const char *config, long long n, int P, const char *layout,
                          uint64_t *sent, uint64_t *recvd) {
  char nbuf[32], pbuf[16];
  snprintf(nbuf, sizeof nbuf, "%lld", n);
  snprintf(pbuf, sizeof pbuf, "%d", P);
  char *argv[] = {(char *)(uintptr_t)RDAGEN_PATH,
                  (char *)(uintptr_t) "ring-sim",
                  (char *)(uintptr_t)config,
                  (char *)(uintptr_t) "--n",
                  nbuf,
                  (char *)(uintptr_t) "--ranks",
                  pbuf,
                  (char *)(uintptr_t) "--layout",
                  (char *)(uintptr_t)layout,
                  (char *)(uintptr_t) "--json",
                  NULL};
  rt_proc pr;
  assert_true(rt_run(argv, 120, &pr));
  if (pr.exit_code != 0) fail_msg("ring-sim exit %d: %s", pr.exit_code, pr.err);
  const char *s = pr.out;
  for (int x = 0; x < P; x++) {
    s = strstr(s, "\"bytes_sent\": ");
    assert_non_null(s);
    sent[x] = strtoull(s + 14, NULL, 10);
    s = strstr(s, "\"bytes_received\": ");
    assert_non_null(s);
    recvd[x] = strtoull(s + 18, NULL, 10);
  }
  assert_null(strstr(s, "\"bytes_sent\": "));
  rt_proc_free(&pr);
}

static void test_transport_bytes_equal_ring_sim(void **state) {
  (void)state;
  char *dir = rt_mkdtemp();
  char *path = rt_path(dir, "ring.lua");
  const char text[] =
      "return { heads = 6, kv_heads = 3, head_dim = 32, dtype = 'fp16',\n"
      "  segments = { 10, 40, 4096 }, dilations = { 1, 3, 5 }, causal = true }\n";
  assert_true(rt_write_file(path, text, strlen(text)));
  rda_gen *g = NULL;
  rda_err err = {0};
  rda_config cfg;
  assert_int_equal(rda_gen_open(&g, &err), RDA_OK);
  if (rda_gen_config_file(g, path, &cfg, &err) != RDA_OK) fail_msg("%s", err.msg);
  rda_gen_close(g);
  static const struct {
    long long n;
    int P, layout;
  } runs[] = {
      {203, 5, RDA_RING_CONTIGUOUS}, {96, 4, RDA_RING_ZIGZAG}, {97, 8, RDA_RING_CONTIGUOUS}};
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
    const long long n = runs[k].n;
    const int P = runs[k].P, layout = runs[k].layout;
    uint64_t sent[8], recvd[8];
    sim_bytes_cli(path, n, P, rda_ring_layout_name(layout), sent, recvd);
    rda_ring_plan *plan = NULL;
    assert_int_equal(rda_ring_plan_create(&cfg, n, P, layout, &plan, &err), RDA_OK);
    rank_ctx ctx[8];
    memset(ctx, 0, sizeof ctx);
    for (int x = 0; x < P; x++) {
      ctx[x].plan = plan, ctx[x].rank = x, ctx[x].seed = 7;
      ctx[x].fingerprint = rda_ring_fingerprint(&cfg, n, P, layout);
    }
    run_world(KIND_HOST, ctx, P, 20.0);
    uint64_t total = 0;
    for (int x = 0; x < P; x++) {
      if (ctx[x].status != RDA_OK || ctx[x].bad != 0) fail_msg("rank %d: %s", x, ctx[x].msg);
      if (ctx[x].sent != sent[x] || ctx[x].received != recvd[x])
        fail_msg("N %lld P %d rank %d: transport moved %llu/%llu bytes, ring-sim says %llu/%llu", n,
                 P, x, (unsigned long long)ctx[x].sent, (unsigned long long)ctx[x].received,
                 (unsigned long long)sent[x], (unsigned long long)recvd[x]);
      total += ctx[x].sent;
    }
    assert_true(total > 0); /* the config does communicate */
    rda_ring_plan_destroy(plan);
  }
  free(path);
  rt_rmtree(dir);
  free(dir);
}

/* A plan in which every rank exchanges with every other: non-causal, one segment over all. */
static rda_ring_plan *all_to_all_plan(int P, rda_config *c) {
  const long long w[] = {1 << 20}, r[] = {1};
  rt_config_make(c, 2, 1, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, w, r);
  rda_ring_plan *plan = NULL;
  rda_err err = {0};
  assert_int_equal(rda_ring_plan_create(c, 16 * P, P, RDA_RING_CONTIGUOUS, &plan, &err), RDA_OK);
  return plan;
}

static void fingerprint_mismatch_errors_every_rank(int kind) {
  enum { P = 4 };
  rda_config c;
  rda_ring_plan *plan = all_to_all_plan(P, &c);
  rank_ctx ctx[P];
  memset(ctx, 0, sizeof ctx);
  pthread_barrier_t start; /* every rank joins */
  assert_int_equal(pthread_barrier_init(&start, NULL, P), 0);
  for (int x = 0; x < P; x++) {
    ctx[x].plan = plan, ctx[x].rank = x, ctx[x].start = &start;
    ctx[x].fingerprint = rda_ring_fingerprint(&c, 16 * P, P, RDA_RING_CONTIGUOUS);
  }
  /* Rank 2 thinks the sequence is one row longer. Then, as well, rank 1 failed before it could
   * join and joins with its failure word (what rda_ring_create does over NCCL): that comes
   * first, with its status, on every rank. */
  ctx[2].fingerprint = rda_ring_fingerprint(&c, 16 * P + 1, P, RDA_RING_CONTIGUOUS);
  for (int round = 0; round < 2; round++) {
    if (round == 1) ctx[1].fingerprint = rda_transport_join_failed(RDA_ERR_OUT_OF_MEMORY);
    for (int x = 0; x < P; x++) ctx[x].status = RDA_OK, ctx[x].msg[0] = '\0';
    run_world(kind, ctx, P, 10.0);
    for (int x = 0; x < P; x++) {
      /* Not a hang, not even a timeout; timed from the joins (ctx.start), not thread starts. */
      if (ctx[x].elapsed >= 5.0) fail_msg("rank %d took %.1f s", x, ctx[x].elapsed);
      assert_int_equal(ctx[x].status, RDA_ERR_INVALID_ARGUMENT); /* the calls disagree */
      const char *want = round == 0 ? "rank 2 has" : "rank 1 failed in rda_ring_create before";
      if (strstr(ctx[x].msg, round == 0 ? "fingerprint mismatch" : "RDA_ERR_OUT_OF_MEMORY") ==
              NULL ||
          strstr(ctx[x].msg, want) == NULL)
        fail_msg("round %d: rank %d: %s", round, x, ctx[x].msg);
      assert_int_equal(ctx[x].sent + ctx[x].received, 0);
    }
  }
  pthread_barrier_destroy(&start);
  rda_ring_plan_destroy(plan);
}

static void test_transport_fingerprint_mismatch_errors_every_rank(void **state) {
  (void)state;
  fingerprint_mismatch_errors_every_rank(KIND_HOST);
}

static void test_device_transport_fingerprint_mismatch_errors_every_rank(void **state) {
  (void)state;
  fingerprint_mismatch_errors_every_rank(KIND_DEVICE);
}

static void rank_that_aborts_fails_the_others_promptly(int kind) {
  enum { P = 5 };
  rda_config c;
  rda_ring_plan *plan = all_to_all_plan(P, &c);
  rank_ctx ctx[P];
  memset(ctx, 0, sizeof ctx);
  pthread_barrier_t start; /* every rank joins */
  assert_int_equal(pthread_barrier_init(&start, NULL, P), 0);
  for (int x = 0; x < P; x++) {
    ctx[x].plan = plan, ctx[x].rank = x, ctx[x].jitter = 1, ctx[x].start = &start;
    ctx[x].fingerprint = rda_ring_fingerprint(&c, 16 * P, P, RDA_RING_CONTIGUOUS);
  }
  /* Before its first step, and mid-ring after two: every other rank still needs it later. */
  for (int fail_after = 0; fail_after <= 2; fail_after += 2) {
    for (int x = 0; x < P; x++) ctx[x].status = RDA_OK, ctx[x].msg[0] = '\0';
    ctx[3].mode = MODE_ABORT, ctx[3].fail_after = fail_after;
    run_world(kind, ctx, P, 30.0);
    for (int x = 0; x < P; x++) {
      if (x == 3) continue;
      assert_int_equal(ctx[x].status, RDA_ERR_NCCL);
      if (strstr(ctx[x].msg, "rank 3: injected failure") == NULL)
        fail_msg("fail_after %d: rank %d: %s", fail_after, x, ctx[x].msg);
      if (ctx[x].elapsed > 5.0)
        fail_msg("rank %d took %.1f s to notice the abort", x, ctx[x].elapsed);
    }
  }
  pthread_barrier_destroy(&start);
  rda_ring_plan_destroy(plan);
}

static void test_transport_rank_that_aborts_fails_the_others_promptly(void **state) {
  (void)state;
  rank_that_aborts_fails_the_others_promptly(KIND_HOST);
}

static void test_device_transport_rank_that_aborts_fails_the_others_promptly(void **state) {
  (void)state;
  rank_that_aborts_fails_the_others_promptly(KIND_DEVICE);
}

static void silent_rank_times_the_others_out_without_a_hang(int kind, double timeout_s) {
  enum { P = 4 };
  rda_config c;
  rda_ring_plan *plan = all_to_all_plan(P, &c);
  for (int mode = MODE_SILENT; mode <= MODE_ABSENT; mode++) {
    rank_ctx ctx[P];
    memset(ctx, 0, sizeof ctx);
    pthread_barrier_t start; /* the ranks that join: an absent one does not */
    assert_int_equal(pthread_barrier_init(&start, NULL, mode == MODE_ABSENT ? P - 1 : P), 0);
    for (int x = 0; x < P; x++) {
      ctx[x].plan = plan, ctx[x].rank = x, ctx[x].start = &start;
      ctx[x].fingerprint = rda_ring_fingerprint(&c, 16 * P, P, RDA_RING_CONTIGUOUS);
    }
    /* Silent from its first step on: every other rank ends up waiting on it directly, so the
     * first timeout (whichever rank's timer fires first) names it. Silence later in the ring,
     * where a rank may first wait on a live peer that is itself stuck, is left to the abort
     * test below, which does not depend on which timer fires first. */
    ctx[P - 1].mode = mode, ctx[P - 1].fail_after = 0;
    ctx[P - 1].silent_us = (long)(5e6 * timeout_s);
    /* A timeout generous enough that a live rank slowed by a loaded CI machine is never the
     * one blamed; the silent rank stays away far longer. The ranks join together (ctx.start):
     * one whose thread started late would otherwise be the rank a join timeout names. */
    run_world(kind, ctx, P, timeout_s);
    pthread_barrier_destroy(&start);
    char expect[64];
    snprintf(expect, sizeof expect, "timed out after %.1f s", timeout_s);
    int named = 0;
    for (int x = 0; x < P - 1; x++) {
      assert_int_equal(ctx[x].status, RDA_ERR_NCCL);
      if (strstr(ctx[x].msg, expect) == NULL) fail_msg("rank %d: %s", x, ctx[x].msg);
      /* Slack for a loaded CI machine, yet well before the silent rank leaves (5 timeouts). */
      if (ctx[x].elapsed > 3.5 * timeout_s)
        fail_msg("rank %d took %.1f s (timeout %.1f s)", x, ctx[x].elapsed, timeout_s);
      named += strstr(ctx[x].msg, mode == MODE_ABSENT ? "waiting for rank 3 to join"
                                                      : "waiting for rank 3") != NULL;
    }
    assert_true(named > 0);
  }
  rda_ring_plan_destroy(plan);
}

static void test_transport_silent_rank_times_the_others_out_without_a_hang(void **state) {
  (void)state;
  silent_rank_times_the_others_out_without_a_hang(KIND_HOST, 2.0);
}

static void test_device_transport_silent_rank_times_the_others_out_without_a_hang(void **state) {
  (void)state;
  silent_rank_times_the_others_out_without_a_hang(KIND_DEVICE, 1.5);
}

/* Every rank sends two messages to every rank (itself included) and receives them all, in one
 * group, posting sends and receives in a random order; FIFO matching per pair is checked. */
typedef struct a2a_ctx {
  tworld *world;
  int rank, P, rounds;
  rda_status status;
  char msg[1024];
  long long bad;
} a2a_ctx;

static uint32_t a2a_word(int from, int to, int round, int k, int i) {
  return (uint32_t)mix(((uint64_t)from << 40) ^ ((uint64_t)to << 28) ^ ((uint64_t)round << 12) ^
                       ((uint64_t)k << 8) ^ (uint64_t)i);
}

enum { A2A_WORDS = 257, A2A_MAXP = 8 };
typedef uint32_t a2a_bufs[A2A_MAXP][2][A2A_WORDS];

static void *a2a_rank(void *arg) {
  a2a_ctx *c = arg;
  rda_err err = {0};
  rda_transport *t = NULL;
  rt_rng rng;
  rt_rng_seed(&rng, 1234u + (uint64_t)c->rank);
  int own = 0;
  rda_backend *b = rank_backend(c->world, &own);
  /* Host copies of what is sent and received; the transport moves the rank's buffers. */
  a2a_bufs *shost = xmalloc(sizeof *shost), *rhost = xmalloc(sizeof *rhost);
  a2a_bufs *sbuf = buf_alloc(b, sizeof *sbuf), *rbuf = buf_alloc(b, sizeof *rbuf);
  if (tworld_join(c->world, c->rank, 42, b, &t, &err) != RDA_OK) goto done;
  for (int round = 0; round < c->rounds && err.status == RDA_OK; round++) {
    const int n = 4 * c->P;
    int order[4 * A2A_MAXP];
    for (int q = 0; q < n; q++) order[q] = q;
    if (round % 3 == 1) {        /* every send before any receive: deadlocks a blocking transport */
    } else if (round % 3 == 2) { /* every receive first, peers in reverse */
      for (int q = 0; q < n; q++) order[q] = n - 1 - q;
    } else {
      for (int q = n - 1; q > 0; q--) {
        const int z = (int)rt_rng_range(&rng, 0, q), tmp = order[q];
        order[q] = order[z], order[z] = tmp;
      }
    }
    for (int peer = 0; peer < c->P; peer++)
      for (int k = 0; k < 2; k++)
        for (int i = 0; i < A2A_WORDS; i++)
          (*shost)[peer][k][i] = a2a_word(c->rank, peer, round, k, i);
    buf_put(b, sbuf, shost, sizeof *sbuf);
    buf_poison(b, rbuf, 0xEF, sizeof *rbuf);
    rda_transport_group_start(t, &err);
    /* op q: kind q / (2P) (0 send, 1 recv), peer (q / 2) % P, message q % 2; the two messages
     * of one pair keep their relative order, as FIFO matching requires. */
    int next_k[2][A2A_MAXP] = {{0}};
    for (int q = 0; q < n && err.status == RDA_OK; q++) {
      const int kind = order[q] / (2 * c->P), peer = (order[q] / 2) % c->P;
      const int k = next_k[kind][peer]++;
      if (kind == 0)
        rda_transport_send(t, peer, (*sbuf)[peer][k], sizeof(*sbuf)[peer][k], &err);
      else
        rda_transport_recv(t, peer, (*rbuf)[peer][k], sizeof(*rbuf)[peer][k], &err);
    }
    if (err.status == RDA_OK) rda_transport_group_end(t, &err);
    if (err.status == RDA_OK && rt_rng_range(&rng, 0, 1))
      sleep_us((long)rt_rng_range(&rng, 0, 500));
    if (err.status == RDA_OK) rda_transport_wait(t, &err);
    if (err.status != RDA_OK) break;
    buf_get(b, rhost, rbuf, sizeof *rbuf);
    for (int peer = 0; peer < c->P; peer++)
      for (int k = 0; k < 2; k++)
        for (int i = 0; i < A2A_WORDS; i++)
          c->bad += (*rhost)[peer][k][i] != a2a_word(peer, c->rank, round, k, i);
  }
done:
  rda_transport_destroy(t);
  buf_free(b, sbuf), buf_free(b, rbuf);
  free(shost), free(rhost);
  rank_backend_close(b, own);
  c->status = err.status;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  return NULL;
}

static void adversarial_post_orders_never_deadlock(int kind) {
  for (int P = 1; P <= 8; P += 3) {
    tworld w;
    rda_err err = {0};
    if (tworld_create(&w, kind, 1, P, 20.0, &err) != RDA_OK) fail_msg("%s", err.msg);
    a2a_ctx ctx[8];
    pthread_t th[8];
    memset(ctx, 0, sizeof ctx);
    for (int x = 0; x < P; x++) {
      ctx[x].world = &w, ctx[x].rank = x, ctx[x].P = P, ctx[x].rounds = 24;
      assert_int_equal(pthread_create(&th[x], NULL, a2a_rank, &ctx[x]), 0);
    }
    for (int x = 0; x < P; x++) pthread_join(th[x], NULL);
    for (int x = 0; x < P; x++) {
      if (ctx[x].status != RDA_OK) fail_msg("P %d rank %d: %s", P, x, ctx[x].msg);
      assert_int_equal(ctx[x].bad, 0);
    }
    tworld_destroy(&w);
  }
}

static void test_transport_adversarial_post_orders_never_deadlock(void **state) {
  (void)state;
  adversarial_post_orders_never_deadlock(KIND_HOST);
}

static void test_device_transport_adversarial_post_orders_never_deadlock(void **state) {
  (void)state;
  adversarial_post_orders_never_deadlock(KIND_DEVICE);
}

/* --- small semantics ------------------------------------------------------------------------ */

typedef struct pair_ctx {
  tworld *world;
  int rank, P;
  size_t send_bytes, recv_bytes; /* rank 0 sends to 1 */
  rda_status status, misuse;
  char msg[1024];
  int gathered_ok, barriers_ok, gathered8_ok;
  uint64_t sent, received;
} pair_ctx;

static void *mismatch_rank(void *arg) {
  pair_ctx *c = arg;
  rda_err err = {0};
  rda_transport *t = NULL;
  int own = 0;
  rda_backend *b = rank_backend(c->world, &own);
  char *buf = buf_alloc(b, 64);
  if (tworld_join(c->world, c->rank, 1, b, &t, &err) == RDA_OK &&
      rda_transport_group_start(t, &err) == RDA_OK) {
    if (c->rank == 0)
      rda_transport_send(t, 1, buf, c->send_bytes, &err);
    else
      rda_transport_recv(t, 0, buf, c->recv_bytes, &err);
    if (err.status == RDA_OK && rda_transport_group_end(t, &err) == RDA_OK)
      rda_transport_wait(t, &err);
  }
  rda_transport_destroy(t);
  buf_free(b, buf);
  rank_backend_close(b, own);
  c->status = err.status;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  return NULL;
}

static void size_mismatch_errors_both_sides(int kind) {
  tworld w;
  rda_err err = {0};
  if (tworld_create(&w, kind, 1, 2, 10.0, &err) != RDA_OK) fail_msg("%s", err.msg);
  pair_ctx ctx[2];
  pthread_t th[2];
  memset(ctx, 0, sizeof ctx);
  for (int x = 0; x < 2; x++) {
    ctx[x].world = &w, ctx[x].rank = x, ctx[x].send_bytes = 48, ctx[x].recv_bytes = 40;
    assert_int_equal(pthread_create(&th[x], NULL, mismatch_rank, &ctx[x]), 0);
  }
  for (int x = 0; x < 2; x++) pthread_join(th[x], NULL);
  for (int x = 0; x < 2; x++) {
    assert_int_equal(ctx[x].status, RDA_ERR_NCCL);
    if (strstr(ctx[x].msg, "received 48 bytes from rank 0 but expected 40") == NULL)
      fail_msg("rank %d: %s", x, ctx[x].msg);
  }
  tworld_destroy(&w);
}

/* connect: ranks 0-1-2 in a line connect to their neighbours (mirrored lists): done, byte
 * counters untouched; then rank 0 lists rank 2, which does not list it back: rank 0 times out
 * (over NCCL that would hang, which is why rda_ring_steps_peers lists are mirrored). The
 * barriers fix the order: rank 0's lopsided connect starts once ranks 1 and 2 have their
 * results (an abort of the world may fail a wait that has not yet seen its own completion), and
 * rank 2 leaves only after it, so rank 0 fails by its timeout, not by rank 2's departure. The
 * world's timeout is long, so that the joins and the mirrored connects never time out when a
 * thread starts late on a loaded machine; only rank 0's endpoint gets 1 s for its lopsided
 * connect. */
typedef struct connect_ctx {
  tworld *world;
  pthread_barrier_t *phase;
  int rank, lopsided;
  rda_status status;
  uint64_t sent, received;
  char msg[1024];
} connect_ctx;

static void *connect_rank(void *arg) {
  connect_ctx *c = arg;
  rda_err err = {0};
  rda_transport *t = NULL;
  static const int line[3][2] = {{1, -1}, {0, 2}, {1, -1}};
  static const int count[3] = {1, 2, 1};
  const int joined = tworld_join(c->world, c->rank, 4, NULL, &t, &err) == RDA_OK;
  if (joined && rda_transport_connect(t, line[c->rank], count[c->rank], &err) == RDA_OK)
    rda_transport_bytes(t, &c->sent, &c->received);
  pthread_barrier_wait(c->phase); /* every rank has its result */
  if (joined && err.status == RDA_OK && c->lopsided && c->rank == 0) {
    const int far[1] = {2};
    t->timeout_s = 1.0;
    rda_transport_connect(t, far, 1, &err);
  }
  pthread_barrier_wait(c->phase); /* rank 0 is done */
  rda_transport_destroy(t);
  c->status = err.status;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  return NULL;
}

static void test_transport_connect_mirrored_lists_only(void **state) {
  (void)state;
  for (int lopsided = 0; lopsided < 2; lopsided++) {
    tworld w;
    rda_err err = {0};
    if (tworld_create(&w, KIND_HOST, 1, 3, 30.0, &err) != RDA_OK) fail_msg("%s", err.msg);
    pthread_barrier_t phase;
    assert_int_equal(pthread_barrier_init(&phase, NULL, 3), 0);
    connect_ctx ctx[3];
    pthread_t th[3];
    memset(ctx, 0, sizeof ctx);
    for (int x = 0; x < 3; x++) {
      ctx[x].world = &w, ctx[x].phase = &phase, ctx[x].rank = x, ctx[x].lopsided = lopsided;
      assert_int_equal(pthread_create(&th[x], NULL, connect_rank, &ctx[x]), 0);
    }
    for (int x = 0; x < 3; x++) pthread_join(th[x], NULL);
    pthread_barrier_destroy(&phase);
    for (int x = 0; x < 3; x++) {
      assert_int_equal(ctx[x].sent, 0);
      assert_int_equal(ctx[x].received, 0);
      if (!lopsided || x != 0) {
        if (ctx[x].status != RDA_OK) fail_msg("rank %d: %s", x, ctx[x].msg);
      } else if (ctx[x].status != RDA_ERR_NCCL ||
                 strstr(ctx[x].msg, "timed out after 1.0 s waiting for rank 2") == NULL) {
        fail_msg("rank 0 connecting to a rank that does not connect back: %s", ctx[x].msg);
      }
    }
    tworld_destroy(&w);
  }
}

static void test_transport_size_mismatch_errors_both_sides(void **state) {
  (void)state;
  size_mismatch_errors_both_sides(KIND_HOST);
}

static void test_device_transport_size_mismatch_errors_both_sides(void **state) {
  (void)state;
  size_mismatch_errors_both_sides(KIND_DEVICE);
}

static void *collective_rank(void *arg) {
  pair_ctx *c = arg;
  rda_err err = {0};
  rda_transport *t = NULL;
  int own = 0;
  rda_backend *b = rank_backend(c->world, &own);
  double *mine_d = buf_alloc(b, 3 * sizeof(double)), *all_d = buf_alloc(b, 8 * 3 * sizeof(double));
  char *one_d = buf_alloc(b, 1);
  if (tworld_join(c->world, c->rank, 9, b, &t, &err) != RDA_OK) goto done;
  /* Misuse is an argument error, not a hang: send outside a group, a peer out of range. */
  rda_err e2 = {0};
  c->misuse = rda_transport_send(t, 0, one_d, 1, &e2);
  rda_err_clear(&e2);
  if (rda_transport_group_start(t, &e2) == RDA_OK) {
    if (rda_transport_send(t, c->P, one_d, 1, &e2) != RDA_ERR_INVALID_ARGUMENT) c->misuse = RDA_OK;
    rda_err_clear(&e2);
    if (rda_transport_group_end(t, &e2) != RDA_OK || rda_transport_wait(t, &e2) != RDA_OK)
      c->misuse = RDA_OK; /* an empty group completes */
  }
  c->gathered_ok = c->gathered8_ok = 1;
  for (int round = 0; round < 5; round++) {
    double mine[3], all[8 * 3];
    for (int i = 0; i < 3; i++) mine[i] = c->rank * 10.0 + round + 0.25 * i;
    buf_put(b, mine_d, mine, sizeof mine);
    buf_poison(b, all_d, 0xFF, sizeof all); /* NaN */
    if (rda_transport_allgather(t, mine_d, all_d, sizeof mine, &err) != RDA_OK) goto done;
    buf_get(b, all, all_d, sizeof all);
    for (int q = 0; q < c->P; q++)
      for (int i = 0; i < 3; i++)
        if (all[q * 3 + i] != q * 10.0 + round + 0.25 * i) c->gathered_ok = 0;
    if (rda_transport_barrier(t, &err) != RDA_OK) goto done;
    c->barriers_ok++;
    /* Two 8-byte gathers back to back: a fast rank's second value must not overwrite the
     * first before a slow rank has read it. Not counted as bytes moved. */
    for (int k = 0; k < 2; k++) {
      uint64_t all8[8];
      memset(all8, 0xFF, sizeof all8);
      if (rda_transport_gather8(t, (uint64_t)(c->rank * 1000 + round * 10 + k), all8, &err) !=
          RDA_OK)
        goto done;
      for (int q = 0; q < c->P; q++)
        if (all8[q] != (uint64_t)(q * 1000 + round * 10 + k)) c->gathered8_ok = 0;
    }
  }
  /* Rank 0 gives its word without reading the others' (as a failed rank tells the ring why):
   * the others still read it, and their own. */
  uint64_t all8[8];
  memset(all8, 0xFF, sizeof all8);
  if (c->rank == 0 ? rda_transport_give8(t, 4242, &err) != RDA_OK
                   : rda_transport_gather8(t, (uint64_t)c->rank, all8, &err) != RDA_OK)
    goto done;
  for (int q = 1; c->rank > 0 && q < c->P; q++)
    if (all8[0] != 4242 || all8[q] != (uint64_t)q) c->gathered8_ok = 0;
done:
  if (t != NULL) rda_transport_bytes(t, &c->sent, &c->received);
  rda_transport_destroy(t);
  buf_free(b, mine_d), buf_free(b, all_d), buf_free(b, one_d);
  rank_backend_close(b, own);
  c->status = err.status;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  return NULL;
}

static void allgather_barrier_and_misuse(int kind) {
  enum { P = 5 };
  tworld w;
  rda_err err = {0};
  assert_int_equal(tworld_create(&w, kind, 1, 0, 1.0, &err), RDA_ERR_INVALID_ARGUMENT);
  tworld_destroy(&w);
  rda_err_clear(&err);
  assert_int_equal(tworld_create(&w, kind, 1, 2, 0.0, &err), RDA_ERR_INVALID_ARGUMENT);
  tworld_destroy(&w);
  rda_err_clear(&err);
  if (tworld_create(&w, kind, 1, P, 10.0, &err) != RDA_OK) fail_msg("%s", err.msg);
  pair_ctx ctx[P];
  pthread_t th[P];
  memset(ctx, 0, sizeof ctx);
  for (int x = 0; x < P; x++) {
    ctx[x].world = &w, ctx[x].rank = x, ctx[x].P = P;
    assert_int_equal(pthread_create(&th[x], NULL, collective_rank, &ctx[x]), 0);
  }
  for (int x = 0; x < P; x++) pthread_join(th[x], NULL);
  for (int x = 0; x < P; x++) {
    if (ctx[x].status != RDA_OK) fail_msg("rank %d: %s", x, ctx[x].msg);
    assert_int_equal(ctx[x].misuse, RDA_ERR_INVALID_ARGUMENT);
    assert_true(ctx[x].gathered_ok);
    assert_true(ctx[x].gathered8_ok);
    assert_int_equal(ctx[x].barriers_ok, 5);
    /* Five all-gathers of 24 bytes with 4 other ranks; the own block is not counted. */
    assert_int_equal(ctx[x].sent, 5 * 24 * (P - 1));
    assert_int_equal(ctx[x].received, 5 * 24 * (P - 1));
  }
  tworld_destroy(&w);
}

static void test_transport_allgather_barrier_and_misuse(void **state) {
  (void)state;
  allgather_barrier_and_misuse(KIND_HOST);
}

static void test_device_transport_allgather_barrier_and_misuse(void **state) {
  (void)state;
  allgather_barrier_and_misuse(KIND_DEVICE);
}

/* A rank whose backend cannot do the device transport's work fails its join, and the others
 * fail at once instead of waiting for it to time out. */
typedef struct nob_ctx {
  rda_device_world *world;
  rda_backend *b;
  int rank;
  rda_status status;
  char msg[1024];
} nob_ctx;

static void *nob_rank(void *arg) {
  nob_ctx *c = arg;
  rda_err err = {0};
  rda_transport *t = NULL;
  rda_device_world_join(c->world, c->rank, 3, c->b, &t, &err);
  rda_transport_destroy(t);
  c->status = err.status;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  return NULL;
}

static void test_device_transport_rank_without_a_usable_backend_fails_every_rank(void **state) {
  (void)state;
  enum { P = 3 };
  rda_backend *emu = NULL, crippled;
  rda_err err = {0};
  assert_int_equal(rda_backend_emu_open(&emu, 90, &err), RDA_OK);
  crippled = *emu;
  crippled.copy_async = NULL; /* say, a backend from before the stream-ordered operations */
  for (int which = 0; which < 2; which++) {
    rda_device_world *w = NULL;
    assert_int_equal(rda_device_world_create(P, 30.0, &w, &err), RDA_OK);
    nob_ctx ctx[P];
    pthread_t th[P];
    memset(ctx, 0, sizeof ctx);
    const double t0 = rt_now_s();
    for (int x = 0; x < P; x++) {
      ctx[x].world = w, ctx[x].rank = x, ctx[x].b = x != 1 ? emu : which ? &crippled : NULL;
      assert_int_equal(pthread_create(&th[x], NULL, nob_rank, &ctx[x]), 0);
    }
    for (int x = 0; x < P; x++) pthread_join(th[x], NULL);
    assert_true(rt_now_s() - t0 < 10.0); /* not the 30 s timeout */
    const char *why = which ? "rank 1: device transport: the emu backend has no stream-ordered"
                            : "rank 1: device transport: no backend";
    assert_int_equal(ctx[1].status, RDA_ERR_INVALID_ARGUMENT);
    for (int x = 0; x < P; x++) {
      if (strstr(ctx[x].msg, why) == NULL) fail_msg("rank %d: %s", x, ctx[x].msg);
      if (x != 1) assert_int_equal(ctx[x].status, RDA_ERR_NCCL);
    }
    rda_device_world_destroy(w);
  }
  emu->destroy(emu);
}

/* A second join of a rank already in the world is refused, and leaves the ring its first join
 * made alone, even when the second one's own setup failed too (here: no backend). */
static void test_device_transport_second_join_leaves_the_ring_alone(void **state) {
  (void)state;
  rda_backend *emu = NULL;
  rda_err err = {0};
  assert_int_equal(rda_backend_emu_open(&emu, 90, &err), RDA_OK);
  rda_device_world *w = NULL;
  assert_int_equal(rda_device_world_create(1, 30.0, &w, &err), RDA_OK);
  rda_transport *t = NULL, *again = NULL;
  assert_int_equal(rda_device_world_join(w, 0, 3, emu, &t, &err), RDA_OK);
  for (int usable = 0; usable < 2; usable++) {
    rda_err_clear(&err);
    assert_int_equal(rda_device_world_join(w, 0, 3, usable ? emu : NULL, &again, &err),
                     RDA_ERR_INVALID_ARGUMENT);
    assert_null(again);
    if (strstr(err.msg, "joined the ring twice") == NULL) fail_msg("second join: %s", err.msg);
  }
  rda_err_clear(&err);
  if (rda_transport_barrier(t, &err) != RDA_OK) fail_msg("the ring after it: %s", err.msg);
  rda_transport_destroy(t);
  rda_device_world_destroy(w);
  emu->destroy(emu);
}

/* --- device-side ordering, on a fake device with truly asynchronous streams ------------------ */

/* One fake device shared by every fake backend: streams are queues of operations that a device
 * thread runs in a random interleaving with random delays; an event wait blocks its stream
 * until the record it names ran (CUDA's semantics: the last record when the wait is enqueued).
 * Any missing edge in the transport's event protocol lets a copy overtake the work it must
 * follow, which the ranks below see as wrong data. */
enum { AB_COPY, AB_MEMSET, AB_RECORD, AB_WAIT };

typedef struct ab_event {
  uint64_t seq;        /* records enqueued so far */
  unsigned char *done; /* done[k]: record k ran */
  size_t cap;
  struct ab_event *next; /* every event, freed at the end */
} ab_event;

typedef struct ab_op {
  int kind, value;
  void *dst;
  const void *src;
  size_t n;
  ab_event *ev;
  uint64_t seq;
  struct ab_op *next;
} ab_op;

typedef struct ab_stream {
  ab_op *head, *tail;
} ab_stream;

enum { AB_MAX_STREAMS = 64 };

static struct {
  pthread_mutex_t mu;
  ab_stream streams[AB_MAX_STREAMS];
  ab_stream *paused; /* runs nothing while set */
  rda_backend *fail_wait; /* its next stream_wait_event fails (an injected CUDA error) */
  int nstreams, stop;
  ab_event *events;
  pthread_t th;
  rt_rng rng;
} abd = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local struct {
  rda_backend *b;
  ab_stream *s;
} ab_cur[4];

static ab_stream *ab_current(rda_backend *b) {
  for (int q = 0; q < 4; q++)
    if (ab_cur[q].b == b) return ab_cur[q].s;
  return b->impl; /* the backend's own stream */
}

static void *ab_set_stream(rda_backend *b, void *s) {
  void *was = NULL;
  for (int q = 0; q < 4; q++)
    if (ab_cur[q].b == b) ab_cur[q].b = NULL, was = ab_cur[q].s;
  if (s == NULL) return was;
  for (int q = 0; q < 4; q++)
    if (ab_cur[q].b == NULL) {
      ab_cur[q].b = b, ab_cur[q].s = s;
      return was;
    }
  abort();
}

static int ab_event_done(const ab_event *e, uint64_t seq) {
  return seq == 0 || (seq < e->cap && e->done[seq]);
}

/* Lock held. */
static void ab_push(ab_stream *s, ab_op *op) {
  op->next = NULL;
  if (s->tail != NULL)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
}

static rda_status ab_enqueue(rda_backend *b, int kind, void *dst, const void *src, size_t n,
                             int value, ab_event *ev) {
  ab_op *op = xmalloc(sizeof *op);
  *op = (ab_op){.kind = kind, .value = value, .dst = dst, .src = src, .n = n, .ev = ev};
  pthread_mutex_lock(&abd.mu);
  if (kind == AB_RECORD) {
    op->seq = ++ev->seq;
    if (op->seq >= ev->cap) {
      const size_t cap = 2 * (size_t)op->seq;
      ev->done = realloc(ev->done, cap);
      if (ev->done == NULL) abort();
      memset(ev->done + ev->cap, 0, cap - ev->cap);
      ev->cap = cap;
    }
  }
  if (kind == AB_WAIT) op->seq = ev->seq;
  ab_push(ab_current(b), op);
  pthread_mutex_unlock(&abd.mu);
  return RDA_OK;
}

static void *ab_device(void *arg) {
  (void)arg;
  pthread_mutex_lock(&abd.mu);
  while (!abd.stop) {
    int ready[AB_MAX_STREAMS], nready = 0;
    for (int q = 0; q < abd.nstreams; q++) {
      const ab_op *h = abd.streams[q].head;
      if (h != NULL && &abd.streams[q] != abd.paused &&
          (h->kind != AB_WAIT || ab_event_done(h->ev, h->seq)))
        ready[nready++] = q;
    }
    if (nready == 0) {
      pthread_mutex_unlock(&abd.mu);
      sleep_us(20);
      pthread_mutex_lock(&abd.mu);
      continue;
    }
    ab_stream *s = &abd.streams[ready[rt_rng_range(&abd.rng, 0, nready - 1)]];
    ab_op *op = s->head;
    s->head = op->next;
    if (s->head == NULL) s->tail = NULL;
    const long nap = (long)rt_rng_range(&abd.rng, 0, 60);
    pthread_mutex_unlock(&abd.mu);
    sleep_us(nap);
    if (op->kind == AB_COPY) memcpy(op->dst, op->src, op->n);
    if (op->kind == AB_MEMSET) memset(op->dst, op->value, op->n);
    pthread_mutex_lock(&abd.mu);
    if (op->kind == AB_RECORD) op->ev->done[op->seq] = 1;
    free(op);
  }
  pthread_mutex_unlock(&abd.mu);
  return NULL;
}

static rda_status ab_copy_async(rda_backend *b, void *dst, const void *src, size_t n,
                                rda_err *err) {
  (void)err;
  return ab_enqueue(b, AB_COPY, dst, src, n, 0, NULL);
}

static rda_status ab_memset_async(rda_backend *b, void *dst, int value, size_t n, rda_err *err) {
  (void)err;
  return ab_enqueue(b, AB_MEMSET, dst, NULL, n, value, NULL);
}

static rda_status ab_event_create(rda_backend *b, void **ev, rda_err *err) {
  (void)b, (void)err;
  ab_event *e = calloc(1, sizeof *e);
  if (e == NULL) abort();
  pthread_mutex_lock(&abd.mu);
  e->next = abd.events, abd.events = e;
  pthread_mutex_unlock(&abd.mu);
  *ev = e;
  return RDA_OK;
}

static void ab_event_destroy(rda_backend *b, void *ev) {
  (void)b, (void)ev; /* queued waits may still name it: freed when the device stops */
}

static rda_status ab_event_record(rda_backend *b, void *ev, rda_err *err) {
  (void)err;
  return ab_enqueue(b, AB_RECORD, NULL, NULL, 0, 0, ev);
}

static rda_status ab_stream_wait_event(rda_backend *b, void *ev, rda_err *err) {
  pthread_mutex_lock(&abd.mu);
  const int fail = abd.fail_wait == b;
  if (fail) abd.fail_wait = NULL;
  pthread_mutex_unlock(&abd.mu);
  if (fail) return rda_err_set(err, RDA_ERR_CUDA, "cuStreamWaitEvent: injected failure");
  return ab_enqueue(b, AB_WAIT, NULL, NULL, 0, 0, ev);
}

static rda_status ab_event_query(rda_backend *b, void *ev, int *done, rda_err *err) {
  (void)b, (void)err;
  ab_event *e = ev;
  pthread_mutex_lock(&abd.mu);
  *done = ab_event_done(e, e->seq);
  pthread_mutex_unlock(&abd.mu);
  return RDA_OK;
}

static rda_status ab_stream_create(rda_backend *b, void **s, rda_err *err) {
  (void)b, (void)err;
  pthread_mutex_lock(&abd.mu);
  if (abd.nstreams == AB_MAX_STREAMS) abort();
  *s = &abd.streams[abd.nstreams++];
  pthread_mutex_unlock(&abd.mu);
  return RDA_OK;
}

static void ab_stream_destroy(rda_backend *b, void *s) {
  (void)b, (void)s; /* its queued work still runs */
}

static void ab_destroy(rda_backend *b) {
  free(b);
}

static rda_backend *ab_open(void) {
  rda_backend *b = calloc(1, sizeof *b);
  if (b == NULL) abort();
  b->name = "fake-async";
  void *own = NULL;
  ab_stream_create(b, &own, NULL);
  b->impl = own;
  b->memset_async = ab_memset_async;
  b->copy_async = ab_copy_async;
  b->event_create = ab_event_create;
  b->event_destroy = ab_event_destroy;
  b->event_record = ab_event_record;
  b->stream_wait_event = ab_stream_wait_event;
  b->event_query = ab_event_query;
  b->stream_create = ab_stream_create;
  b->stream_destroy = ab_stream_destroy;
  b->set_stream = ab_set_stream;
  b->destroy = ab_destroy;
  return b;
}

/* Host-synchronize with everything enqueued so far on b's current stream. */
static void ab_sync(rda_backend *b, void *ev) {
  int done = 0;
  b->event_record(b, ev, NULL);
  while (b->event_query(b, ev, &done, NULL) == RDA_OK && !done) sleep_us(20);
}

/* Starts the fake device's thread, its interleaving drawn from the test seed plus salt. */
static pthread_t ab_device_start(uint64_t salt) {
  rt_rng_seed(&abd.rng, rt_seed_value() + salt);
  abd.stop = 0;
  pthread_t dev;
  assert_int_equal(pthread_create(&dev, NULL, ab_device, NULL), 0);
  return dev;
}

/* Stops the fake device once every stream drained, frees its events and streams. */
static void ab_device_drain_and_stop(pthread_t dev) {
  for (int busy = 1; busy;) {
    pthread_mutex_lock(&abd.mu);
    busy = 0;
    for (int q = 0; q < abd.nstreams; q++) busy |= abd.streams[q].head != NULL;
    abd.stop = !busy;
    pthread_mutex_unlock(&abd.mu);
    if (busy) sleep_us(100);
  }
  pthread_join(dev, NULL);
  while (abd.events != NULL) {
    ab_event *e = abd.events;
    abd.events = e->next;
    free(e->done), free(e);
  }
  abd.nstreams = 0;
}

typedef struct ord_ctx {
  rda_device_world *world;
  rda_backend *shared; /* NULL: a backend of the rank's own; else every rank's, on a stream of
                          its own chosen with set_stream, which must stay its choice */
  int rank, P, rounds;
  rda_status status;
  char msg[1024];
  long long bad, lost_stream;
  unsigned char *mem[4 + 64]; /* freed once the device drained: it reads them late */
} ord_ctx;

enum { ORD_BYTES = 2048 };

static unsigned char ord_byte(int from, int round, int i) {
  return (unsigned char)mix(((uint64_t)from << 32) ^ ((uint64_t)round << 16) ^ (uint64_t)i);
}

/* Each round: the rank's stream writes its send block (from a fresh host copy), poisons its
 * receive blocks, sends to its right neighbour and to itself, receives from its left one,
 * then copies what arrived into a check buffer on the same stream; only that copy is host-
 * synchronized. The next round's write reuses the send block at once. */
static void *ord_rank(void *arg) {
  ord_ctx *c = arg;
  rda_err err = {0};
  rda_transport *t = NULL;
  rda_backend *b = c->shared != NULL ? c->shared : ab_open();
  void *ev = NULL, *mine = NULL;
  ab_event_create(b, &ev, NULL);
  if (c->shared != NULL) {
    ab_stream_create(b, &mine, NULL);
    b->set_stream(b, mine);
  }
  unsigned char *sbuf = c->mem[0] = xmalloc(ORD_BYTES);
  unsigned char *rbuf = c->mem[1] = xmalloc(2 * ORD_BYTES);
  unsigned char *check = c->mem[2] = xmalloc(2 * ORD_BYTES);
  unsigned char **host = &c->mem[4];
  const int right = (c->rank + 1) % c->P, left = (c->rank + c->P - 1) % c->P;
  if (rda_device_world_join(c->world, c->rank, 5, b, &t, &err) != RDA_OK) goto done;
  for (int round = 0; round < c->rounds && round < 64; round++) {
    host[round] = xmalloc(ORD_BYTES); /* a fresh one: the device reads it some time later */
    for (int i = 0; i < ORD_BYTES; i++) host[round][i] = ord_byte(c->rank, round, i);
    b->copy_async(b, sbuf, host[round], ORD_BYTES, &err);
    b->memset_async(b, rbuf, 0xEE, 2 * ORD_BYTES, &err);
    if (rda_transport_group_start(t, &err) != RDA_OK) break;
    if (round % 2 == 0) rda_transport_recv(t, left, rbuf, ORD_BYTES, &err);
    rda_transport_send(t, right, sbuf, ORD_BYTES, &err);
    rda_transport_send(t, c->rank, sbuf, ORD_BYTES, &err);
    rda_transport_recv(t, c->rank, rbuf + ORD_BYTES, ORD_BYTES, &err);
    if (round % 2 == 1) rda_transport_recv(t, left, rbuf, ORD_BYTES, &err);
    if (err.status != RDA_OK || rda_transport_group_end(t, &err) != RDA_OK ||
        rda_transport_wait(t, &err) != RDA_OK)
      break;
    c->lost_stream += c->shared != NULL && ab_current(b) != mine;
    b->copy_async(b, check, rbuf, 2 * ORD_BYTES, &err);
    if (round % 4 == 3) { /* now and then, check the data on the host */
      ab_sync(b, ev);
      for (int i = 0; i < ORD_BYTES; i++) {
        c->bad += check[i] != ord_byte(left, round, i);
        c->bad += check[ORD_BYTES + i] != ord_byte(c->rank, round, i);
      }
    }
  }
  if (t != NULL) ab_sync(b, ev);
done:
  rda_transport_destroy(t);
  if (c->shared != NULL) {
    c->lost_stream += ab_current(b) != mine;
    b->set_stream(b, NULL);
  } else {
    b->destroy(b);
  }
  c->status = err.status;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  return NULL;
}

/* ord_rank's rounds on P ranks, each with a backend of its own or all on `shared`. */
static void ord_run(uint64_t salt, rda_backend *shared) {
  enum { P = 3 };
  const pthread_t dev = ab_device_start(salt);
  rda_device_world *w = NULL;
  rda_err err = {0};
  assert_int_equal(rda_device_world_create(P, 20.0, &w, &err), RDA_OK);
  ord_ctx ctx[P];
  pthread_t th[P];
  memset(ctx, 0, sizeof ctx);
  for (int x = 0; x < P; x++) {
    ctx[x].world = w, ctx[x].shared = shared, ctx[x].rank = x, ctx[x].P = P, ctx[x].rounds = 40;
    assert_int_equal(pthread_create(&th[x], NULL, ord_rank, &ctx[x]), 0);
  }
  for (int x = 0; x < P; x++) pthread_join(th[x], NULL);
  ab_device_drain_and_stop(dev);
  rda_device_world_destroy(w);
  for (int x = 0; x < P; x++)
    for (size_t k = 0; k < sizeof ctx[x].mem / sizeof ctx[x].mem[0]; k++) free(ctx[x].mem[k]);
  for (int x = 0; x < P; x++) {
    if (ctx[x].status != RDA_OK) fail_msg("rank %d: %s", x, ctx[x].msg);
    if (ctx[x].bad != 0) fail_msg("rank %d: %lld bytes wrong", x, ctx[x].bad);
    if (ctx[x].lost_stream != 0)
      fail_msg("rank %d: its set_stream choice was lost %lld times", x, ctx[x].lost_stream);
  }
}

static void test_device_transport_orders_copies_with_events(void **state) {
  (void)state;
  ord_run(99, NULL);
}

/* Virtual ranks on one GPU share one backend. A rank's thread that completes a match queues
 * the copy on the receiver's communication stream with set_stream, and must then give the
 * thread back the stream it had chosen, or the rank's later work silently leaves its stream. */
static void test_device_transport_keeps_each_threads_stream_on_a_shared_backend(void **state) {
  (void)state;
  rda_backend *b = ab_open();
  ord_run(7, b);
  b->destroy(b);
}

typedef struct join_ctx {
  rda_device_world *world;
  int rank;
  rda_backend *b;
  rda_transport *t;
  rda_status status;
} join_ctx;

static void *join_main(void *arg) {
  join_ctx *c = arg;
  rda_err err = {0};
  c->status = rda_device_world_join(c->world, c->rank, 9, c->b, &c->t, &err);
  return NULL;
}

/* Ranks 0 and 1 of w join with backends b (joining is a barrier of both: one thread each). */
static void ab_join_pair(rda_device_world *w, rda_backend *b[2], rda_transport *t[2]) {
  join_ctx jc[2];
  pthread_t th[2];
  for (int x = 0; x < 2; x++) {
    jc[x] = (join_ctx){.world = w, .rank = x, .b = b[x]};
    assert_int_equal(pthread_create(&th[x], NULL, join_main, &jc[x]), 0);
  }
  for (int x = 0; x < 2; x++) {
    pthread_join(th[x], NULL);
    assert_int_equal(jc[x].status, RDA_OK);
    t[x] = jc[x].t;
  }
}

/* Holds the fake device's `paused` stream for up to 0.1 s or until ev (on b's stream) ran,
 * then releases it and waits for ev: a write that ev follows, ordered after the paused
 * stream's copies, cannot run before them. */
static void ab_release_after(rda_backend *b, void *ev) {
  int done = 0;
  for (int i = 0; i < 2000 && !done; i++) {
    b->event_query(b, ev, &done, NULL);
    sleep_us(50);
  }
  pthread_mutex_lock(&abd.mu);
  abd.paused = NULL;
  pthread_mutex_unlock(&abd.mu);
  while (b->event_query(b, ev, &done, NULL) == RDA_OK && !done) sleep_us(20);
}

/* Rank 1 sends rank 0 nops blocks whose copies are held back (rank 1's stream paused, so its
 * ready event waits), and rank 0's wait fails: by an abort (the world aborted while the
 * sender's data was not yet ready; inject 0), or by the first stream_wait_event with which it
 * orders its stream after the copies (an injected CUDA error; inject 1). Rank 0 then rewrites
 * its receive buffers on its stream, as a caller told of the error may. The failed wait must
 * still have ordered that stream after every copy it began (but the one whose ordering failed),
 * or a copy lands later in the reused buffer: once the device is released, the rewrite must be
 * what stays. Both ranks on this thread, in turn. */
static void late_copies_after_a_failed_wait(int nops, int inject, uint64_t salt) {
  const pthread_t dev = ab_device_start(salt);
  rda_device_world *w = NULL;
  rda_err err = {0};
  assert_int_equal(rda_device_world_create(2, 20.0, &w, &err), RDA_OK);
  rda_backend *b[2] = {ab_open(), ab_open()};
  rda_transport *t[2] = {NULL, NULL};
  void *ev = NULL;
  ab_event_create(b[0], &ev, NULL);
  ab_join_pair(w, b, t);
  const size_t bytes = (size_t)nops * ORD_BYTES;
  unsigned char *src = xmalloc(bytes), *dst = xmalloc(bytes);
  memset(src, 0x5A, bytes), memset(dst, 0, bytes);
  pthread_mutex_lock(&abd.mu);
  abd.paused = (ab_stream *)b[1]->impl;
  pthread_mutex_unlock(&abd.mu);
  assert_int_equal(rda_transport_group_start(t[1], &err), RDA_OK);
  for (int q = 0; q < nops; q++)
    assert_int_equal(rda_transport_send(t[1], 0, src + q * ORD_BYTES, ORD_BYTES, &err), RDA_OK);
  assert_int_equal(rda_transport_group_end(t[1], &err), RDA_OK);
  assert_int_equal(rda_transport_group_start(t[0], &err), RDA_OK);
  for (int q = 0; q < nops; q++)
    assert_int_equal(rda_transport_recv(t[0], 1, dst + q * ORD_BYTES, ORD_BYTES, &err), RDA_OK);
  assert_int_equal(rda_transport_group_end(t[0], &err), RDA_OK); /* matched: copies enqueued */
  pthread_mutex_lock(&abd.mu);
  if (inject) abd.fail_wait = b[0];
  pthread_mutex_unlock(&abd.mu);
  if (!inject) rda_transport_abort(t[0], "a launch failed");
  assert_int_not_equal(rda_transport_wait(t[0], &err), RDA_OK);
  if (strstr(err.msg, inject ? "injected failure" : "a launch failed") == NULL)
    fail_msg("rank 0: %s", err.msg);
  b[0]->memset_async(b[0], dst, 0x33, bytes, NULL); /* the caller reuses the buffers */
  b[0]->event_record(b[0], ev, NULL);
  /* Unordered, the write runs now, while the copies cannot; ordered, it waits for them. */
  ab_release_after(b[0], ev);
  rda_err_clear(&err);
  assert_int_not_equal(rda_transport_wait(t[1], &err), RDA_OK);
  rda_transport_destroy(t[0]);
  rda_transport_destroy(t[1]);
  ab_device_drain_and_stop(dev);
  rda_device_world_destroy(w);
  const size_t from = inject ? ORD_BYTES : 0; /* op 0's ordering is the one that failed */
  size_t kept = 0;
  for (size_t i = from; i < bytes; i++) kept += dst[i] == 0x33;
  free(src), free(dst);
  b[0]->destroy(b[0]), b[1]->destroy(b[1]);
  if (kept != bytes - from)
    fail_msg("%zu of %zu bytes of the reused buffers were overwritten by late copies",
             bytes - from - kept, bytes - from);
}

static void test_device_transport_failed_wait_orders_the_copies_it_began(void **state) {
  (void)state;
  late_copies_after_a_failed_wait(1, 0, 7);
}

/* A wait whose ordering of the caller's stream fails part way must order the rest. */
static void test_device_transport_failed_ordering_still_orders_the_other_copies(void **state) {
  (void)state;
  late_copies_after_a_failed_wait(2, 1, 11);
}

/* Without a GPU (CI here) the NCCL transport must fail with one clear line, not crash. */
/* A barrier that times out names a rank that did not arrive; a rank that leaves (destroys its
 * endpoint) while the others still need it ends their waits at once, naming it. */
typedef struct host_join {
  rda_host_world *world;
  int rank;
  rda_transport *t;
  rda_status status;
} host_join;

static void *host_join_main(void *arg) {
  host_join *c = arg;
  rda_err err = {0};
  c->status = rda_host_world_join(c->world, c->rank, 9, &c->t, &err);
  return NULL;
}

/* Both ranks joined on their threads. The world's timeout, which the joins run under, is long:
 * a thread that starts late on a loaded machine must not fail the join; a test that wants a
 * wait or barrier to time out sets that endpoint's timeout_s after the join. */
static void host_pair(rda_host_world **w, rda_transport *t[2]) {
  rda_err err = {0};
  assert_int_equal(rda_host_world_create(2, 30.0, w, &err), RDA_OK);
  host_join jc[2];
  pthread_t th[2];
  for (int x = 0; x < 2; x++) {
    jc[x] = (host_join){.world = *w, .rank = x};
    assert_int_equal(pthread_create(&th[x], NULL, host_join_main, &jc[x]), 0);
  }
  for (int x = 0; x < 2; x++) {
    pthread_join(th[x], NULL);
    assert_int_equal(jc[x].status, RDA_OK);
    t[x] = jc[x].t;
  }
}

static void test_transport_barrier_timeout_and_leaving_name_the_rank(void **state) {
  (void)state;
  rda_host_world *w = NULL;
  rda_transport *t[2];
  rda_err err = {0};
  host_pair(&w, t);
  t[0]->timeout_s = 0.3; /* this barrier's alone: rank 1 never comes */
  assert_int_equal(rda_transport_barrier(t[0], &err), RDA_ERR_NCCL);
  if (strstr(err.msg, "timed out after 0.3 s in a barrier (1 of 2 ranks arrived; "
                      "rank 1 did not)") == NULL)
    fail_msg("%s", err.msg);
  rda_transport_destroy(t[0]), rda_transport_destroy(t[1]);
  rda_host_world_destroy(w);

  host_pair(&w, t);
  rda_transport_destroy(t[1]); /* leaves, nothing pending */
  const double t0 = rt_now_s();
  rda_err_clear(&err);
  assert_int_equal(rda_transport_barrier(t[0], &err), RDA_ERR_NCCL);
  if (strstr(err.msg, "rank 1: left the ring") == NULL) fail_msg("%s", err.msg);
  assert_true(rt_now_s() - t0 < 5.0);
  rda_transport_destroy(t[0]);
  rda_host_world_destroy(w);
}

static void test_transport_nccl_without_a_gpu_fails_cleanly(void **state) {
  (void)state;
  unsigned char id[128] = {0};
  rda_err err = {0};
  rda_transport *t = NULL;
  rda_status s = rda_transport_nccl_unique_id(id, &err);
  if (s == RDA_OK) s = rda_transport_nccl_create(NULL, id, 0, 1, NULL, NULL, 1, 1.0, &t, &err);
  if (s == RDA_OK) {
    rda_transport_destroy(t);
    skip(); /* a GPU and NCCL are usable: the ring driver's tests cover this transport */
  }
  assert_null(t);
  assert_true(s == RDA_ERR_NCCL || s == RDA_ERR_CUDA || s == RDA_ERR_UNSUPPORTED);
  assert_true(err.msg[0] != '\0');
  assert_null(strchr(err.msg, '\n'));
  /* Both arguments or neither: an argument error before anything loads. */
  rda_err_clear(&err);
  assert_int_equal(rda_transport_nccl_create(NULL, NULL, 0, 1, NULL, NULL, 1, 1.0, &t, &err),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_null(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_transport_moves_exactly_the_plans_blocks),
      cmocka_unit_test(test_transport_bytes_equal_ring_sim),
      cmocka_unit_test(test_transport_fingerprint_mismatch_errors_every_rank),
      cmocka_unit_test(test_transport_rank_that_aborts_fails_the_others_promptly),
      cmocka_unit_test(test_transport_silent_rank_times_the_others_out_without_a_hang),
      cmocka_unit_test(test_transport_adversarial_post_orders_never_deadlock),
      cmocka_unit_test(test_transport_size_mismatch_errors_both_sides),
      cmocka_unit_test(test_transport_connect_mirrored_lists_only),
      cmocka_unit_test(test_transport_allgather_barrier_and_misuse),
      cmocka_unit_test(test_transport_barrier_timeout_and_leaving_name_the_rank),
      cmocka_unit_test(test_transport_nccl_without_a_gpu_fails_cleanly),
      cmocka_unit_test(test_device_transport_moves_exactly_the_plans_blocks),
      cmocka_unit_test(test_device_transport_fingerprint_mismatch_errors_every_rank),
      cmocka_unit_test(test_device_transport_rank_that_aborts_fails_the_others_promptly),
      cmocka_unit_test(test_device_transport_silent_rank_times_the_others_out_without_a_hang),
      cmocka_unit_test(test_device_transport_adversarial_post_orders_never_deadlock),
      cmocka_unit_test(test_device_transport_size_mismatch_errors_both_sides),
      cmocka_unit_test(test_device_transport_allgather_barrier_and_misuse),
      cmocka_unit_test(test_device_transport_rank_without_a_usable_backend_fails_every_rank),
      cmocka_unit_test(test_device_transport_second_join_leaves_the_ring_alone),
      cmocka_unit_test(test_device_transport_orders_copies_with_events),
      cmocka_unit_test(test_device_transport_keeps_each_threads_stream_on_a_shared_backend),
      cmocka_unit_test(test_device_transport_failed_wait_orders_the_copies_it_began),
      cmocka_unit_test(test_device_transport_failed_ordering_still_orders_the_other_copies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
