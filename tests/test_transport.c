/* test_transport.c — the host virtual-rank transport: P threads exchange deterministic random
 * K/V blocks exactly as the ring plan says, every received byte checked, bytes moved equal to
 * the plan's and `rdagen ring-sim`'s; fingerprint mismatch, injected failures, adversarial orders.
 */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gen.h"
#include "rda_test.h"
#include "ring_plan.h"
#include "transport.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

enum { MODE_PLAN = 0, MODE_ABORT = 1, MODE_SILENT = 2, MODE_ABSENT = 3 };

typedef struct rank_ctx {
  rda_host_world *world;
  const rda_ring_plan *plan;
  int rank, mode;
  uint64_t fingerprint, seed;
  int jitter;     /* random sleeps between posting and waiting */
  int fail_after; /* MODE_ABORT, MODE_SILENT: steps done before failing */
  /* results */
  rda_status status;
  char msg[1024];
  uint64_t sent, received;
  long long bad, checked;
  double elapsed;
} rank_ctx;

static void *plan_rank(void *arg) {
  rank_ctx *c = arg;
  const double t0 = now_s();
  rda_err err = {0};
  rda_transport *t = NULL;
  rda_ring_step *steps = NULL;
  int64_t nsteps = 0;
  rt_rng rng;
  rt_rng_seed(&rng, c->seed + 977u * (uint64_t)c->rank);
  const rda_config *cfg = rda_ring_plan_config(c->plan);
  const int D = cfg->head_dim;
  if (c->mode == MODE_ABSENT) goto done;
  if (rda_host_world_join(c->world, c->rank, c->fingerprint, &t, &err) != RDA_OK) goto done;
  if (rda_ring_plan_steps(c->plan, c->rank, &steps, &nsteps, &err) != RDA_OK) goto done;
  for (int64_t s = 0; s < nsteps && err.status == RDA_OK; s++) {
    const rda_ring_step *st = &steps[s];
    if (c->mode == MODE_ABORT && s == c->fail_after) {
      rda_transport_abort(t, "injected failure");
      rda_err_set(&err, RDA_ERR_NCCL, "rank %d: aborted on purpose", c->rank);
      break;
    }
    if (c->mode == MODE_SILENT && s == c->fail_after) {
      sleep_us(10000000); /* posts nothing more; leaves long after the others gave up */
      rda_err_set(&err, RDA_ERR_NCCL, "rank %d: stayed silent on purpose", c->rank);
      break;
    }
    rda_ring_class cl;
    rda_ring_plan_class(c->plan, st->cls, &cl);
    uint16_t *sb[2] = {NULL, NULL}, *rb[2] = {NULL, NULL};
    for (int k = 0; k < st->nsend; k++) {
      sb[k] = xmalloc(st->send[k].bytes);
      pack_block(sb[k], &st->send[k], st->stride, &cl, D, c->seed);
    }
    for (int k = 0; k < st->nrecv; k++) {
      rb[k] = xmalloc(st->recv[k].bytes);
      memset(rb[k], 0xA5, st->recv[k].bytes); /* poison */
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
          c->bad += check_block(rb[k], &st->recv[k], st->stride, &cl, D, c->seed);
          c->checked += (long long)(st->recv[k].bytes / 2);
        }
    }
    for (int k = 0; k < 2; k++) free(sb[k]), free(rb[k]);
  }
done:
  if (t != NULL) rda_transport_bytes(t, &c->sent, &c->received);
  rda_transport_destroy(t);
  free(steps);
  c->status = err.status;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  c->elapsed = now_s() - t0;
  return NULL;
}

/* Run P rank threads over one world; ctx[P] filled by the caller except world and results. */
static void run_world(rank_ctx *ctx, int P, double timeout_s) {
  rda_host_world *w = NULL;
  rda_err err = {0};
  assert_int_equal(rda_host_world_create(P, timeout_s, &w, &err), RDA_OK);
  pthread_t *th = calloc((size_t)P, sizeof *th);
  for (int x = 0; x < P; x++) {
    ctx[x].world = w;
    assert_int_equal(pthread_create(&th[x], NULL, plan_rank, &ctx[x]), 0);
  }
  for (int x = 0; x < P; x++) pthread_join(th[x], NULL);
  free(th);
  rda_host_world_destroy(w);
}

/* The plan executed over P virtual ranks: every byte right, byte counts equal the plan's. */
static void exchange_plan(const rda_config *c, long long n, int P, int layout, int jitter) {
  rda_ring_plan *plan = NULL;
  rda_err err = {0};
  if (rda_ring_plan_create(c, n, P, layout, &plan, &err) != RDA_OK) fail_msg("%s", err.msg);
  rank_ctx *ctx = calloc((size_t)P, sizeof *ctx);
  const uint64_t fp = rda_ring_fingerprint(c, n, P, layout);
  for (int x = 0; x < P; x++) {
    ctx[x].plan = plan, ctx[x].rank = x, ctx[x].fingerprint = fp;
    ctx[x].seed = rt_seed_value() + (uint64_t)n, ctx[x].jitter = jitter;
  }
  run_world(ctx, P, 20.0);
  for (int x = 0; x < P; x++) {
    const rda_ring_rank *rk = rda_ring_plan_rank(plan, x);
    if (ctx[x].status != RDA_OK)
      fail_msg("N %lld P %d %s rank %d: %s", n, P, rda_ring_layout_name(layout), x, ctx[x].msg);
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

static void test_transport_moves_exactly_the_plans_blocks(void **state) {
  (void)state;
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
          exchange_plan(&c, ns[a], P, RDA_RING_CONTIGUOUS, (P + (int)a) % 3 == 0);
          if (ns[a] % (2 * P) == 0) exchange_plan(&c, ns[a], P, RDA_RING_ZIGZAG, P % 2);
        }
    }
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
    run_world(ctx, P, 20.0);
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

static void test_transport_fingerprint_mismatch_errors_every_rank(void **state) {
  (void)state;
  enum { P = 4 };
  rda_config c;
  rda_ring_plan *plan = all_to_all_plan(P, &c);
  rank_ctx ctx[P];
  memset(ctx, 0, sizeof ctx);
  for (int x = 0; x < P; x++) {
    ctx[x].plan = plan, ctx[x].rank = x;
    ctx[x].fingerprint = rda_ring_fingerprint(&c, 16 * P, P, RDA_RING_CONTIGUOUS);
  }
  /* Rank 2 thinks the sequence is one row longer. */
  ctx[2].fingerprint = rda_ring_fingerprint(&c, 16 * P + 1, P, RDA_RING_CONTIGUOUS);
  const double t0 = now_s();
  run_world(ctx, P, 10.0);
  assert_true(now_s() - t0 < 5.0); /* not a hang, not even a timeout */
  for (int x = 0; x < P; x++) {
    assert_int_equal(ctx[x].status, RDA_ERR_NCCL);
    if (strstr(ctx[x].msg, "fingerprint mismatch") == NULL ||
        strstr(ctx[x].msg, "rank 2 has") == NULL)
      fail_msg("rank %d: %s", x, ctx[x].msg);
    assert_int_equal(ctx[x].sent + ctx[x].received, 0);
  }
  rda_ring_plan_destroy(plan);
}

static void test_transport_rank_that_aborts_fails_the_others_promptly(void **state) {
  (void)state;
  enum { P = 5 };
  rda_config c;
  rda_ring_plan *plan = all_to_all_plan(P, &c);
  rank_ctx ctx[P];
  memset(ctx, 0, sizeof ctx);
  for (int x = 0; x < P; x++) {
    ctx[x].plan = plan, ctx[x].rank = x, ctx[x].jitter = 1;
    ctx[x].fingerprint = rda_ring_fingerprint(&c, 16 * P, P, RDA_RING_CONTIGUOUS);
  }
  /* Before its first step, and mid-ring after two: every other rank still needs it later. */
  for (int fail_after = 0; fail_after <= 2; fail_after += 2) {
    for (int x = 0; x < P; x++) ctx[x].status = RDA_OK, ctx[x].msg[0] = '\0';
    ctx[3].mode = MODE_ABORT, ctx[3].fail_after = fail_after;
    run_world(ctx, P, 30.0);
    for (int x = 0; x < P; x++) {
      if (x == 3) continue;
      assert_int_equal(ctx[x].status, RDA_ERR_NCCL);
      if (strstr(ctx[x].msg, "rank 3: injected failure") == NULL)
        fail_msg("fail_after %d: rank %d: %s", fail_after, x, ctx[x].msg);
      if (ctx[x].elapsed > 5.0)
        fail_msg("rank %d took %.1f s to notice the abort", x, ctx[x].elapsed);
    }
  }
  rda_ring_plan_destroy(plan);
}

static void test_transport_silent_rank_times_the_others_out_without_a_hang(void **state) {
  (void)state;
  enum { P = 4 };
  rda_config c;
  rda_ring_plan *plan = all_to_all_plan(P, &c);
  for (int mode = MODE_SILENT; mode <= MODE_ABSENT; mode++) {
    rank_ctx ctx[P];
    memset(ctx, 0, sizeof ctx);
    for (int x = 0; x < P; x++) {
      ctx[x].plan = plan, ctx[x].rank = x;
      ctx[x].fingerprint = rda_ring_fingerprint(&c, 16 * P, P, RDA_RING_CONTIGUOUS);
    }
    /* Silent from its first step on: every other rank ends up waiting on it directly, so the
     * first timeout (whichever rank's timer fires first) names it. Silence later in the ring,
     * where a rank may first wait on a live peer that is itself stuck, is left to the abort
     * test below, which does not depend on which timer fires first. */
    ctx[P - 1].mode = mode, ctx[P - 1].fail_after = 0;
    /* A timeout generous enough that a live rank slowed by a loaded CI machine is never the
     * one blamed; the silent rank stays away far longer. */
    run_world(ctx, P, 2.0);
    int named = 0;
    for (int x = 0; x < P - 1; x++) {
      assert_int_equal(ctx[x].status, RDA_ERR_NCCL);
      if (strstr(ctx[x].msg, "timed out after 2.0 s") == NULL)
        fail_msg("rank %d: %s", x, ctx[x].msg);
      /* Slack for a loaded CI machine, yet well before the silent rank leaves (10 s). */
      if (ctx[x].elapsed > 7.0) fail_msg("rank %d took %.1f s (timeout 2.0 s)", x, ctx[x].elapsed);
      named += strstr(ctx[x].msg, mode == MODE_ABSENT ? "waiting for rank 3 to join"
                                                      : "waiting for rank 3") != NULL;
    }
    assert_true(named > 0);
  }
  rda_ring_plan_destroy(plan);
}

/* Every rank sends two messages to every rank (itself included) and receives them all, in one
 * group, posting sends and receives in a random order; FIFO matching per pair is checked. */
typedef struct a2a_ctx {
  rda_host_world *world;
  int rank, P, rounds;
  rda_status status;
  char msg[1024];
  long long bad;
} a2a_ctx;

static uint32_t a2a_word(int from, int to, int round, int k, int i) {
  return (uint32_t)mix(((uint64_t)from << 40) ^ ((uint64_t)to << 28) ^ ((uint64_t)round << 12) ^
                       ((uint64_t)k << 8) ^ (uint64_t)i);
}

static void *a2a_rank(void *arg) {
  a2a_ctx *c = arg;
  rda_err err = {0};
  rda_transport *t = NULL;
  rt_rng rng;
  rt_rng_seed(&rng, 1234u + (uint64_t)c->rank);
  enum { WORDS = 257, MAXP = 8 };
  uint32_t sbuf[MAXP][2][WORDS], rbuf[MAXP][2][WORDS];
  if (rda_host_world_join(c->world, c->rank, 42, &t, &err) != RDA_OK) goto done;
  for (int round = 0; round < c->rounds && err.status == RDA_OK; round++) {
    const int n = 4 * c->P;
    int order[4 * MAXP];
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
        for (int i = 0; i < WORDS; i++) {
          sbuf[peer][k][i] = a2a_word(c->rank, peer, round, k, i);
          rbuf[peer][k][i] = 0xdeadbeefu;
        }
    rda_transport_group_start(t, &err);
    /* op q: kind q / (2P) (0 send, 1 recv), peer (q / 2) % P, message q % 2; the two messages
     * of one pair keep their relative order, as FIFO matching requires. */
    int next_k[2][MAXP] = {{0}};
    for (int q = 0; q < n && err.status == RDA_OK; q++) {
      const int kind = order[q] / (2 * c->P), peer = (order[q] / 2) % c->P;
      const int k = next_k[kind][peer]++;
      if (kind == 0)
        rda_transport_send(t, peer, sbuf[peer][k], sizeof sbuf[peer][k], &err);
      else
        rda_transport_recv(t, peer, rbuf[peer][k], sizeof rbuf[peer][k], &err);
    }
    if (err.status == RDA_OK) rda_transport_group_end(t, &err);
    if (err.status == RDA_OK && rt_rng_range(&rng, 0, 1))
      sleep_us((long)rt_rng_range(&rng, 0, 500));
    if (err.status == RDA_OK) rda_transport_wait(t, &err);
    if (err.status != RDA_OK) break;
    for (int peer = 0; peer < c->P; peer++)
      for (int k = 0; k < 2; k++)
        for (int i = 0; i < WORDS; i++)
          c->bad += rbuf[peer][k][i] != a2a_word(peer, c->rank, round, k, i);
  }
done:
  rda_transport_destroy(t);
  c->status = err.status;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  return NULL;
}

static void test_transport_adversarial_post_orders_never_deadlock(void **state) {
  (void)state;
  for (int P = 1; P <= 8; P += 3) {
    rda_host_world *w = NULL;
    rda_err err = {0};
    assert_int_equal(rda_host_world_create(P, 20.0, &w, &err), RDA_OK);
    a2a_ctx ctx[8];
    pthread_t th[8];
    memset(ctx, 0, sizeof ctx);
    for (int x = 0; x < P; x++) {
      ctx[x].world = w, ctx[x].rank = x, ctx[x].P = P, ctx[x].rounds = 24;
      assert_int_equal(pthread_create(&th[x], NULL, a2a_rank, &ctx[x]), 0);
    }
    for (int x = 0; x < P; x++) pthread_join(th[x], NULL);
    for (int x = 0; x < P; x++) {
      if (ctx[x].status != RDA_OK) fail_msg("P %d rank %d: %s", P, x, ctx[x].msg);
      assert_int_equal(ctx[x].bad, 0);
    }
    rda_host_world_destroy(w);
  }
}

/* --- small semantics ------------------------------------------------------------------------ */

typedef struct pair_ctx {
  rda_host_world *world;
  int rank, P;
  size_t send_bytes, recv_bytes; /* rank 0 sends to 1 */
  rda_status status, misuse;
  char msg[1024];
  int gathered_ok, barriers_ok;
} pair_ctx;

static void *mismatch_rank(void *arg) {
  pair_ctx *c = arg;
  rda_err err = {0};
  rda_transport *t = NULL;
  char buf[64] = {0};
  if (rda_host_world_join(c->world, c->rank, 1, &t, &err) == RDA_OK &&
      rda_transport_group_start(t, &err) == RDA_OK) {
    if (c->rank == 0)
      rda_transport_send(t, 1, buf, c->send_bytes, &err);
    else
      rda_transport_recv(t, 0, buf, c->recv_bytes, &err);
    if (err.status == RDA_OK && rda_transport_group_end(t, &err) == RDA_OK)
      rda_transport_wait(t, &err);
  }
  rda_transport_destroy(t);
  c->status = err.status;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  return NULL;
}

static void test_transport_size_mismatch_errors_both_sides(void **state) {
  (void)state;
  rda_host_world *w = NULL;
  rda_err err = {0};
  assert_int_equal(rda_host_world_create(2, 10.0, &w, &err), RDA_OK);
  pair_ctx ctx[2];
  pthread_t th[2];
  memset(ctx, 0, sizeof ctx);
  for (int x = 0; x < 2; x++) {
    ctx[x].world = w, ctx[x].rank = x, ctx[x].send_bytes = 48, ctx[x].recv_bytes = 40;
    assert_int_equal(pthread_create(&th[x], NULL, mismatch_rank, &ctx[x]), 0);
  }
  for (int x = 0; x < 2; x++) pthread_join(th[x], NULL);
  for (int x = 0; x < 2; x++) {
    assert_int_equal(ctx[x].status, RDA_ERR_NCCL);
    if (strstr(ctx[x].msg, "received 48 bytes from rank 0 but expected 40") == NULL)
      fail_msg("rank %d: %s", x, ctx[x].msg);
  }
  rda_host_world_destroy(w);
}

static void *collective_rank(void *arg) {
  pair_ctx *c = arg;
  rda_err err = {0};
  rda_transport *t = NULL;
  if (rda_host_world_join(c->world, c->rank, 9, &t, &err) != RDA_OK) goto done;
  /* Misuse is an argument error, not a hang: send outside a group, a peer out of range. */
  char one = 1;
  rda_err e2 = {0};
  c->misuse = rda_transport_send(t, 0, &one, 1, &e2);
  rda_err_clear(&e2);
  if (rda_transport_group_start(t, &e2) == RDA_OK) {
    if (rda_transport_send(t, c->P, &one, 1, &e2) != RDA_ERR_INVALID_ARGUMENT) c->misuse = RDA_OK;
    rda_err_clear(&e2);
    if (rda_transport_group_end(t, &e2) != RDA_OK || rda_transport_wait(t, &e2) != RDA_OK)
      c->misuse = RDA_OK; /* an empty group completes */
  }
  c->gathered_ok = 1;
  for (int round = 0; round < 5; round++) {
    double mine[3], all[8 * 3];
    for (int i = 0; i < 3; i++) mine[i] = c->rank * 10.0 + round + 0.25 * i;
    if (rda_transport_allgather(t, mine, all, sizeof mine, &err) != RDA_OK) goto done;
    for (int q = 0; q < c->P; q++)
      for (int i = 0; i < 3; i++)
        if (all[q * 3 + i] != q * 10.0 + round + 0.25 * i) c->gathered_ok = 0;
    if (rda_transport_barrier(t, &err) != RDA_OK) goto done;
    c->barriers_ok++;
  }
done:
  rda_transport_destroy(t);
  c->status = err.status;
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  return NULL;
}

static void test_transport_allgather_barrier_and_misuse(void **state) {
  (void)state;
  enum { P = 5 };
  rda_host_world *w = NULL;
  rda_err err = {0};
  assert_int_equal(rda_host_world_create(0, 1.0, &w, &err), RDA_ERR_INVALID_ARGUMENT);
  rda_err_clear(&err);
  assert_int_equal(rda_host_world_create(2, 0.0, &w, &err), RDA_ERR_INVALID_ARGUMENT);
  rda_err_clear(&err);
  assert_int_equal(rda_host_world_create(P, 10.0, &w, &err), RDA_OK);
  pair_ctx ctx[P];
  pthread_t th[P];
  memset(ctx, 0, sizeof ctx);
  for (int x = 0; x < P; x++) {
    ctx[x].world = w, ctx[x].rank = x, ctx[x].P = P;
    assert_int_equal(pthread_create(&th[x], NULL, collective_rank, &ctx[x]), 0);
  }
  for (int x = 0; x < P; x++) pthread_join(th[x], NULL);
  for (int x = 0; x < P; x++) {
    if (ctx[x].status != RDA_OK) fail_msg("rank %d: %s", x, ctx[x].msg);
    assert_int_equal(ctx[x].misuse, RDA_ERR_INVALID_ARGUMENT);
    assert_true(ctx[x].gathered_ok);
    assert_int_equal(ctx[x].barriers_ok, 5);
  }
  rda_host_world_destroy(w);
}

/* Without a GPU (CI here) the NCCL transport must fail with one clear line, not crash. */
static void test_transport_nccl_without_a_gpu_fails_cleanly(void **state) {
  (void)state;
  unsigned char id[128] = {0};
  rda_err err = {0};
  rda_transport *t = NULL;
  rda_status s = rda_transport_nccl_unique_id(id, &err);
  if (s == RDA_OK) s = rda_transport_nccl_create(NULL, id, 0, 1, NULL, 1, 1.0, &t, &err);
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
  assert_int_equal(rda_transport_nccl_create(NULL, NULL, 0, 1, NULL, 1, 1.0, &t, &err),
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
      cmocka_unit_test(test_transport_allgather_barrier_and_misuse),
      cmocka_unit_test(test_transport_nccl_without_a_gpu_fails_cleanly),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
