/* test_ring.c — the ring forward and backward (runtime/ring.c) with P virtual ranks (threads,
 * host transport, one emulator backend per rank): every rank's rows of O, LSE, dQ, dK and dV
 * against the float64 single-device reference (SPEC §5), bytes moved against the ring plan,
 * zero bytes for local branches, peak ~ 1/P, a failing rank failing every rank. */
#include "backend.h"
#include "bwd.h"
#include "rda_test_backend.h"
#include "fwd.h"
#include "gen.h"
#include "rda_test.h"
#include "rda_test_ring.h"
#include "reference.h"
#include "ring.h"
#include "ring_plan.h"
#include "transport.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#define MAXP 8

static rda_gen *g_gen;
static rda_backend *g_b[MAXP];
static rda_hw g_hw;

/* Kernel launches per rank backend (each rank's thread uses only its own): the emulator's
 * launch, counted. */
static rda_status (*g_emu_launch)(rda_backend *, rda_module *, const unsigned[3], unsigned,
                                  unsigned, const void *, size_t, rda_err *);
static long g_launches[MAXP];

/* Each rank's plan and loaded kernels while it runs (else NULL), and its launches of a backward
 * kv-table dK/dV twin: all of them, and those with two entries of one (class, kv slot), whose
 * blocks would read-modify-write the same rows at once on a GPU (the emulator runs blocks one
 * after another, so only this check can see it). */
static const rda_plan_k *g_pk[MAXP];
static const rda_fwd_kernels *g_kern[MAXP];
static long g_dkdv_kt[MAXP], g_dkdv_kt_shared[MAXP];

static void check_dkdv_table(int rank, const rda_module *m, const unsigned grid[3],
                             const void *params, size_t bytes) {
  const rda_plan_k *pk = g_pk[rank];
  const rda_fwd_kernels *k = g_kern[rank];
  if (pk == NULL || k == NULL || !pk->has_bwd || bytes != sizeof(rda_bwd_params)) return;
  for (int s = 0; s < pk->nsteps; ++s) {
    const int kt = pk->bwd_steps[s].dkdv_ring_kernel;
    if (kt < 0 || k->modules[kt] != m) continue;
    rda_bwd_params bp;
    memcpy(&bp, params, sizeof bp);
    g_dkdv_kt[rank]++;
    for (unsigned y = 0; y < grid[1]; ++y)
      for (unsigned x = 0; x < y; ++x)
        if (bp.kvt.kv.cls[x] == bp.kvt.kv.cls[y] && bp.kvt.kv.slot[x] == bp.kvt.kv.slot[y]) {
          g_dkdv_kt_shared[rank]++;
          return;
        }
    return;
  }
}

static rda_status counting_launch(rda_backend *b, rda_module *m, const unsigned grid[3],
                                  unsigned threads, unsigned smem, const void *params,
                                  size_t bytes, rda_err *err) {
  for (int i = 0; i < MAXP; ++i)
    if (g_b[i] == b) {
      g_launches[i]++;
      check_dkdv_table(i, m, grid, params, bytes);
    }
  return g_emu_launch(b, m, grid, threads, smem, params, bytes, err);
}

/* Device memory a rank's ring pass allocates itself (beyond the caller's workspace). */
static rda_status (*g_emu_alloc)(rda_backend *, size_t, void **, rda_err *);
static void (*g_emu_free)(rda_backend *, void *);
static int g_in_ring[MAXP];
static size_t g_ring_live[MAXP], g_ring_hw[MAXP];
static struct { void *p; size_t n; } g_ring_allocs[MAXP][256];
static rda_status counting_alloc(rda_backend *b, size_t bytes, void **dptr, rda_err *err) {
  const rda_status s = g_emu_alloc(b, bytes, dptr, err);
  for (int i = 0; i < MAXP && s == RDA_OK; ++i)
    if (g_b[i] == b && g_in_ring[i]) {
      for (int k = 0; k < 256; ++k)
        if (g_ring_allocs[i][k].p == NULL) {
          g_ring_allocs[i][k].p = *dptr, g_ring_allocs[i][k].n = bytes;
          break;
        }
      g_ring_live[i] += bytes;
      if (g_ring_live[i] > g_ring_hw[i]) g_ring_hw[i] = g_ring_live[i];
    }
  return s;
}
static void counting_free(rda_backend *b, void *dptr) {
  for (int i = 0; i < MAXP; ++i)
    if (g_b[i] == b)
      for (int k = 0; k < 256; ++k)
        if (dptr != NULL && g_ring_allocs[i][k].p == dptr) {
          g_ring_live[i] -= g_ring_allocs[i][k].n;
          g_ring_allocs[i][k].p = NULL;
        }
  g_emu_free(b, dptr);
}

static int group_setup(void **state) {
  (void)state;
  rda_err err = {0};
  if (rda_gen_open(&g_gen, &err) != RDA_OK) {
    fprintf(stderr, "test_ring: rda_gen_open: %s\n", err.msg);
    return -1;
  }
  if (rt_ring_backends_open(g_b, MAXP, "test_ring") != 0) return -1;
  g_emu_launch = g_b[0]->launch;
  for (int i = 0; i < MAXP; ++i) g_b[i]->launch = counting_launch;
  g_emu_alloc = g_b[0]->alloc, g_emu_free = g_b[0]->free;
  for (int i = 0; i < MAXP; ++i) g_b[i]->alloc = counting_alloc, g_b[i]->free = counting_free;
  if (rda_gen_hw_builtin(g_gen, g_b[0]->arch, &g_hw, &err) != RDA_OK) {
    fprintf(stderr, "test_ring: hw: %s\n", err.msg);
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  rt_ring_backends_close(g_b, MAXP);
  rda_gen_close(g_gen);
  return 0;
}

/* What this test watches around one rank's ring passes (its job's hook, on its thread). */
typedef struct rank_watch {
  int fail_wait;                   /* > 0: this rank's transport fails at that wait (mid-ring) */
  int local_abort;                 /* this rank's abort stays on its rank (flaky_transport) */
  long launches0;                  /* the rank's launch count when the current pass began */
  long fwd_launches, bwd_launches; /* kernel launches of each pass */
  size_t ring_alloc_hw; /* device bytes the ring passes allocated themselves, at most at once */
  rda_ring_trace trace; /* the forward pass's host timeline (no steps kept) */
} rank_watch;

/* A transport that passes everything to an inner endpoint, except that its `fail_at`-th wait
 * fails (as a broken link would, mid-ring; 0: none does), and with local_abort its abort stays
 * on its own rank, as ncclCommAbort's does: the other ranks are not told. The inner endpoint's
 * counters are mirrored. */
typedef struct flaky_transport {
  rda_transport base;
  rda_transport *inner;
  int waits, fail_at, local_abort;
  rda_transport_vtbl vt; /* flaky_vtbl under the inner transport's name */
} flaky_transport;

static void flaky_sync(flaky_transport *f) {
  f->base.bytes_sent = f->inner->bytes_sent;
  f->base.bytes_received = f->inner->bytes_received;
}
static rda_status flaky_group_start(rda_transport *t, rda_err *err) {
  return rda_transport_group_start(((flaky_transport *)t)->inner, err);
}
static rda_status flaky_send(rda_transport *t, int peer, const void *buf, size_t n, rda_err *err) {
  return rda_transport_send(((flaky_transport *)t)->inner, peer, buf, n, err);
}
static rda_status flaky_recv(rda_transport *t, int peer, void *buf, size_t n, rda_err *err) {
  return rda_transport_recv(((flaky_transport *)t)->inner, peer, buf, n, err);
}
static rda_status flaky_group_end(rda_transport *t, rda_err *err) {
  return rda_transport_group_end(((flaky_transport *)t)->inner, err);
}
static rda_status flaky_wait(rda_transport *t, rda_err *err) {
  flaky_transport *f = (flaky_transport *)t;
  if (++f->waits == f->fail_at)
    return rda_err_set(err, RDA_ERR_NCCL, "rank %d: injected link failure", t->rank);
  const rda_status s = rda_transport_wait(f->inner, err);
  flaky_sync(f);
  return s;
}
static rda_status flaky_gather8(rda_transport *t, uint64_t mine, uint64_t *all, rda_err *err) {
  rda_transport *inner = ((flaky_transport *)t)->inner;
  return all != NULL ? rda_transport_gather8(inner, mine, all, err)
                     : rda_transport_give8(inner, mine, err);
}
static void flaky_abort(rda_transport *t, const char *reason) {
  flaky_transport *f = (flaky_transport *)t;
  if (!f->local_abort) rda_transport_abort(f->inner, reason);
}
static void flaky_destroy(rda_transport *t) {
  rda_transport_destroy(((flaky_transport *)t)->inner);
  free(t);
}
static const rda_transport_vtbl flaky_vtbl = {.name = "flaky",
                                              .group_start = flaky_group_start,
                                              .send = flaky_send,
                                              .recv = flaky_recv,
                                              .group_end = flaky_group_end,
                                              .wait = flaky_wait,
                                              .gather8 = flaky_gather8,
                                              .abort = flaky_abort,
                                              .destroy = flaky_destroy};

static rda_transport *flaky_wrap(rda_transport *inner, int fail_at, int local_abort) {
  flaky_transport *f = calloc(1, sizeof *f);
  assert_non_null(f);
  f->base = *inner;
  f->vt = flaky_vtbl;
  f->vt.name = inner->vt->name; /* the ring checks which transport it runs over */
  f->base.vt = &f->vt;
  f->inner = inner;
  f->fail_at = fail_at;
  f->local_abort = local_abort;
  return &f->base;
}

/* Around a rank's passes: its transport made flaky when the case asks, its kernel launches per
 * pass counted, and the device memory the passes allocate themselves tracked. */
static void rank_hook(rt_ring_job *j, rt_ring_stage stage, rda_transport **t) {
  rank_watch *w = j->user;
  const int r = j->rank;
  switch (stage) {
    case RT_RING_JOINED:
      if (j->status == RDA_OK && (w->fail_wait > 0 || w->local_abort))
        *t = flaky_wrap(*t, w->fail_wait, w->local_abort);
      w->launches0 = g_launches[r];
      g_ring_hw[r] = g_ring_live[r] = 0;
      g_in_ring[r] = 1;
      rda_ring_trace_thread(&w->trace);
      break;
    case RT_RING_FWD_DONE:
      rda_ring_trace_thread(NULL);
      w->fwd_launches = g_launches[r] - w->launches0;
      w->launches0 = g_launches[r];
      break;
    case RT_RING_BWD_DONE:
      w->bwd_launches = g_launches[r] - w->launches0;
      g_in_ring[r] = 0;
      w->ring_alloc_hw = g_ring_hw[r];
      break;
  }
}

typedef struct ring_case {
  int heads, kv_heads, head_dim, causal, offsets, nbranch;
  long long w[4], r[4];
  long long n, batch;
  int ranks, layout;
  int backward;        /* also the ring backward against the reference gradients */
  int fail_rank_plus1; /* > 0: that rank (minus one) is given a wrong row count and must fail */
  int fail_wait;       /* with fail_rank_plus1: instead its transport fails at this wait */
  int local_abort;     /* with fail_rank_plus1: its abort does not reach the others (as over
                          NCCL), and the world times out after 10 s instead of 60 */
  long long bundle_bytes; /* 0: the plan's default bundles; else rda_ring_plan_create_bundled's
                             cap (1: one class per bundle) */
  int wgmma;              /* plan with RDA_PLAN_WGMMA (sm_90a forward kernels and twins) */
  const char *fwd_tile;   /* NULL, or the tile branch 0's forward kernel is planned with */
  const char *dq_tile;    /* else NULL, or the tile branch 0's dQ kernel is planned with */
} ring_case;

typedef struct ring_result {
  rda_ring_run_stats stats[MAXP];
  long fwd_launches[MAXP], bwd_launches[MAXP];
  rt_ring_out out; /* the gathered outputs; gradients only in backward cases (ring_result_free) */
  uint64_t plan_sent[MAXP], plan_received[MAXP];
  rda_ring_trace fwd_trace[MAXP]; /* each rank's forward timeline (host times, no steps) */
} ring_result;

static void ring_result_free(ring_result *r) { rt_ring_out_free(&r->out); }

/* Run one case on P virtual ranks and check every row against the reference. */
static void run_ring(const char *what, const ring_case *rc, ring_result *res) {
  const long long B = rc->batch, N = rc->n, H = rc->heads, Hkv = rc->kv_heads, D = rc->head_dim;
  const int P = rc->ranks;
  assert_true(P >= 1 && P <= MAXP);
  rda_config cfg;
  rt_config_make(&cfg, rc->heads, rc->kv_heads, rc->head_dim, RDA_DTYPE_BF16, rc->causal,
                 rc->offsets, rc->nbranch, rc->w, rc->r);
  rda_err err = {0};
  rda_plan_k plan;
  memset(&plan, 0, sizeof plan);
  const unsigned flags =
      (rc->backward ? RDA_PLAN_BACKWARD : 0u) | (rc->wgmma ? RDA_PLAN_WGMMA : 0u);
  rt_plan_with_tile(g_gen, &cfg, &g_hw, flags, rc->fwd_tile ? "fwd" : "bwd_dq",
                    rc->fwd_tile ? rc->fwd_tile : rc->dq_tile, &plan, what);
  if (rc->wgmma) { /* the case must reach the wgmma twins of every kernel kind it runs, or it
                     tests nothing */
    static const char *const kinds[] = {"fwd", "bwd_dkdv", "bwd_dq"};
    for (int k = 0; k < (rc->backward ? 3 : 1); ++k) {
      int twins = 0;
      for (int i = 0; i < plan.nvariants; ++i)
        twins += strcmp(plan.variants[i].kind, kinds[k]) == 0 &&
                 strstr(plan.variants[i].name, "_wg") != NULL &&
                 strstr(plan.variants[i].name, "_kt") != NULL;
      if (g_hw.arch != 90 || twins == 0)
        fail_msg("%s: sm_%d plan without wgmma %s kv-table twins", what, g_hw.arch, kinds[k]);
    }
  }
  rda_ring_plan *rp = NULL;
  const uint64_t bundle = rc->bundle_bytes > 0 ? (uint64_t)rc->bundle_bytes : RDA_RING_BUNDLE_BYTES;
  if (rda_ring_plan_create_bundled(&cfg, N, P, rc->layout, bundle, &rp, &err) != RDA_OK)
    fail_msg("%s: ring plan: %s", what, err.msg);
  rt_ring_world world;
  assert_int_equal(rt_ring_world_create(&world, g_b[0], P, rc->local_abort ? 10.0 : 60.0, &err),
                   RDA_OK);

  const size_t nq = (size_t)(B * N * H * D), nkv = (size_t)(B * N * Hkv * D);
  double *q = rt_normal(nq, RDA_DTYPE_BF16);
  double *k = rt_normal(nkv, RDA_DTYPE_BF16);
  double *v = rt_normal(nkv, RDA_DTYPE_BF16);
  double *dout = rc->backward ? rt_normal(nq, RDA_DTYPE_BF16) : NULL;
  double *dlse = rc->backward ? rt_normal((size_t)(B * H * N), RDA_DTYPE_BF16) : NULL;
  double *o_ref = NULL, *lse_ref = NULL;
  rt_reference(&cfg, B, N, q, k, v, &o_ref, &lse_ref);

  rt_ring_job jobs[MAXP];
  rank_watch watch[MAXP];
  memset(watch, 0, sizeof watch);
  const uint64_t fp = rda_ring_fingerprint(&cfg, N, P, rc->layout);
  for (int p = 0; p < P; ++p) {
    jobs[p] = (rt_ring_job){.b = g_b[p],
                            .pk = &plan,
                            .rp = rp,
                            .world = &world,
                            .fp = fp,
                            .rank = p,
                            .backward = rc->backward,
                            .hook = rank_hook,
                            .user = &watch[p]};
    rt_ring_job_setup(&jobs[p], B, N, q, k, v, dout, dlse, what);
    g_pk[p] = &plan;
    g_kern[p] = &jobs[p].kern;
  }
  if (rc->fail_rank_plus1 > 0) watch[rc->fail_rank_plus1 - 1].local_abort = rc->local_abort;
  if (rc->fail_rank_plus1 > 0 && rc->fail_wait > 0)
    watch[rc->fail_rank_plus1 - 1].fail_wait = rc->fail_wait;
  else if (rc->fail_rank_plus1 > 0 && rc->backward) /* the forward passes, the backward fails */
    jobs[rc->fail_rank_plus1 - 1].ba.n += 1;
  else if (rc->fail_rank_plus1 > 0)
    jobs[rc->fail_rank_plus1 - 1].a.n += 1;
  rt_ring_run(jobs, P);
  int failed = 0;
  for (int p = 0; rc->fail_rank_plus1 > 0 && p < P; ++p) {
    rt_ring_job *j = &jobs[p];
    if (j->status == RDA_OK) fail_msg("%s: rank %d succeeded beside a failing rank", what, p);
    const char *cause = rc->fail_wait > 0 ? "injected link failure" : "owns";
    if (p == rc->fail_rank_plus1 - 1 && strstr(j->err.msg, cause) == NULL)
      fail_msg("%s: rank %d: unexpected error: %s", what, p, j->err.msg);
    if (p != rc->fail_rank_plus1 - 1 && strstr(j->err.msg, "abort") == NULL)
      fail_msg("%s: rank %d: expected an abort, got: %s", what, p, j->err.msg);
    /* A rank failing before its pass names itself in the pass's agreement, which completes
     * before its abort can reach anyone: the others learn of it there, not by their timeout. */
    char named[64];
    snprintf(named, sizeof named, "rank %d failed before the ring", rc->fail_rank_plus1 - 1);
    if (p != rc->fail_rank_plus1 - 1 && rc->fail_wait == 0 && strstr(j->err.msg, named) == NULL)
      fail_msg("%s: rank %d: expected \"%s\", got: %s", what, p, named, j->err.msg);
    j->status = RDA_OK; /* checked; skip the comparisons below */
    failed = 1;
  }

  /* Gathered results in the global layout. */
  rt_ring_out out;
  rt_ring_out_alloc(&out, &cfg, B, N, rc->backward && !failed);
  for (int p = 0; p < P; ++p) {
    rt_ring_job *j = &jobs[p];
    if (j->status != RDA_OK) fail_msg("%s: rank %d: %s", what, p, j->err.msg);
    const rda_ring_rank *rk = j->rk;
    const long long R = rk->rows;
    rt_ring_out_gather(&out, j);
    if (res != NULL) {
      res->stats[p] = j->stats;
      res->fwd_launches[p] = watch[p].fwd_launches;
      res->bwd_launches[p] = watch[p].bwd_launches;
      res->fwd_trace[p] = watch[p].trace;
      res->plan_sent[p] = rk->bytes_sent;
      res->plan_received[p] = rk->bytes_received;
    }
    /* Bytes moved are the plan's (its counts are per batch element); the backward moves the
     * K/V again and returns fp32 gradients (twice the bytes) for every received block. */
    if (!failed) {
      assert_int_equal(j->stats.bytes_sent, rk->bytes_sent * (uint64_t)B);
      assert_int_equal(j->stats.bytes_received, rk->bytes_received * (uint64_t)B);
      assert_int_equal(j->stats.rows, R);
      /* The memory the ring held is what the plan (and ring-sim) says: its blocks for the
       * batch, each rounded up to RDA_RING_BLOCK_ALIGN; for B = 1 the plan's peak exactly. */
      const uint64_t planned = rt_ring_planned_peak(rk, B);
      if (j->stats.peak_bytes != planned || (B == 1 && planned != rk->peak_bytes))
        fail_msg("%s: rank %d held %llu bytes, the plan says %llu (%llu for batch 1)", what, p,
                 (unsigned long long)j->stats.peak_bytes, (unsigned long long)planned,
                 (unsigned long long)rk->peak_bytes);
      /* The workspace is the caller's; whatever the ring allocates besides must not be O(N). */
      if (watch[p].ring_alloc_hw > planned)
        fail_msg("%s: rank %d allocated %zu device bytes itself beside a %llu-byte workspace", what,
                 p, watch[p].ring_alloc_hw, (unsigned long long)planned);
      if (rc->backward) {
        assert_int_equal(j->bstats.bytes_sent,
                         (rk->bytes_sent + 2 * rk->bytes_received) * (uint64_t)B);
        assert_int_equal(j->bstats.bytes_received,
                         (rk->bytes_received + 2 * rk->bytes_sent) * (uint64_t)B);
      }
    }
    rt_ring_job_free(j);
    g_pk[p] = NULL;
    g_kern[p] = NULL;
  }
  long long o_s[3], kv_s[3], lse_s[2] = {H * N, N};
  rt_strides_contig(N, H, D, o_s);
  rt_strides_contig(N, Hkv, D, kv_s);
  char label[256];
  snprintf(label, sizeof label, "%s (P = %d, N = %lld, %s)", what, P, N,
           rda_ring_layout_name(rc->layout));
  bool ok =
      failed || rt_check_fwd(label, &cfg, B, N, out.o, o_s, out.lse, lse_s, o_ref, lse_ref, NULL);
  if (ok && rc->backward && !failed) {
    double *dq_ref = NULL, *dk_ref = NULL, *dv_ref = NULL;
    rt_reference_bwd(&cfg, B, N, q, k, v, dout, dlse, &dq_ref, &dk_ref, &dv_ref);
    ok = rt_check_bwd(label, &cfg, B, N, out.dq, o_s, out.dk, kv_s, out.dv, kv_s, dq_ref, dk_ref,
                      dv_ref, NULL);
    free(dq_ref);
    free(dk_ref);
    free(dv_ref);
  }
  free(q);
  free(k);
  free(v);
  free(dout);
  free(dlse);
  free(o_ref);
  free(lse_ref);
  if (res != NULL)
    res->out = out; /* the caller's now */
  else
    rt_ring_out_free(&out);
  rt_ring_world_destroy(&world);
  rda_ring_plan_destroy(rp);
  rda_plan_k_free(&plan);
  if (!ok) fail_msg("%s: ranks' rows differ from the single-device reference", label);
}

static ring_case base_case(void) {
  ring_case rc;
  memset(&rc, 0, sizeof rc);
  rc.heads = 2;
  rc.kv_heads = 2;
  rc.head_dim = 32;
  rc.batch = 1;
  rc.layout = RDA_RING_CONTIGUOUS;
  return rc;
}

/* The configurations both passes are checked on. */

/* Mixed branches: segments inside one rank (w = 16), spanning some (w = 64) and all (w = N). */
static ring_case case_causal_mod(void) {
  ring_case rc = base_case();
  rc.causal = 1;
  rc.offsets = RDA_OFFSETS_MOD;
  rc.nbranch = 3;
  rc.w[0] = 16, rc.r[0] = 1;
  rc.w[1] = 64, rc.r[1] = 2;
  rc.w[2] = 1 << 20, rc.r[2] = 4;
  rc.n = 101;
  return rc;
}

static ring_case case_noncausal_block_gqa(void) {
  ring_case rc = base_case();
  rc.heads = 4;
  rc.kv_heads = 2;
  rc.offsets = RDA_OFFSETS_BLOCK;
  rc.nbranch = 2;
  rc.w[0] = 32, rc.r[0] = 1;
  rc.w[1] = 1 << 20, rc.r[1] = 2;
  rc.n = 83;
  rc.batch = 2;
  return rc;
}

/* Mod offsets with GQA: each (branch, offset) class carries two kv heads. */
static ring_case case_causal_mod_gqa(void) {
  ring_case rc = case_causal_mod();
  rc.heads = 4;
  rc.kv_heads = 2;
  rc.w[1] = 32;
  rc.w[2] = 256;
  rc.n = 72;
  rc.batch = 2;
  return rc;
}

static ring_case case_causal_group_gqa(void) {
  ring_case rc = base_case();
  rc.heads = 4;
  rc.kv_heads = 1;
  rc.causal = 1;
  rc.offsets = RDA_OFFSETS_GROUP;
  rc.nbranch = 2;
  rc.w[0] = 24, rc.r[0] = 1;
  rc.w[1] = 96, rc.r[1] = 3;
  rc.n = 130;
  return rc;
}

static ring_case case_zigzag(int causal) {
  ring_case rc = base_case();
  rc.causal = causal;
  rc.offsets = RDA_OFFSETS_MOD;
  rc.nbranch = 2;
  rc.w[0] = 16, rc.r[0] = 1;
  rc.w[1] = 1 << 20, rc.r[1] = 2;
  rc.n = 96;
  rc.layout = RDA_RING_ZIGZAG;
  return rc;
}

/* Mod offsets over r = 4 with GQA: four classes of two kv heads each per segment, so a round
 * carries several classes' blocks (one launch covers them) unless bundles are capped. */
static ring_case case_bundles(void) {
  ring_case rc = base_case();
  rc.heads = 8;
  rc.kv_heads = 4;
  rc.causal = 1;
  rc.offsets = RDA_OFFSETS_MOD;
  rc.nbranch = 2;
  rc.w[0] = 16, rc.r[0] = 1;
  rc.w[1] = 1 << 20, rc.r[1] = 4;
  rc.n = 98;
  return rc;
}

/* Non-causal, 3 ranks: branch 1's four small groups are all-gathers inside the receive block
 * branch 0's ring needs (test_ring_plan), so the gathered steps run beside ring steps. */
static ring_case case_allgather(void) {
  ring_case rc = base_case();
  rc.heads = 4;
  rc.kv_heads = 4;
  rc.offsets = RDA_OFFSETS_MOD;
  rc.nbranch = 2;
  rc.w[0] = 60, rc.r[0] = 1;
  rc.w[1] = 60, rc.r[1] = 4;
  rc.n = 60;
  rc.batch = 2;
  rc.ranks = 3;
  return rc;
}

/* Run rc for every rank count of ps (forward, or forward and backward). */
static void run_ranks(const char *what, ring_case rc, int backward, const int *ps, int nps) {
  rc.backward = backward;
  for (int i = 0; i < nps; ++i) {
    rc.ranks = ps[i];
    run_ring(what, &rc, NULL);
  }
}

static void test_ring_matches_reference_every_rank_count_causal_mod(void **state) {
  (void)state;
  const int ps[] = {1, 2, 3, 4, 5, 6, 7, 8};
  run_ranks("causal mod 3 branches", case_causal_mod(), 0, ps, 8);
}

/* Pieces of one row: a rank's own diagonal is then its only own key, so skipping own blocks
 * one row too early (an off-by-one in the causal skip) loses it. Contiguous and zigzag,
 * forward and backward. */
static void test_ring_causal_single_row_pieces(void **state) {
  (void)state;
  ring_case rc = case_causal_mod();
  const int ps[] = {5};
  rc.n = 5; /* every rank owns one row */
  run_ranks("causal one row per rank", rc, 0, ps, 1);
  run_ranks("causal one row per rank, backward", rc, 1, ps, 1);
  rc.n = 7;
  run_ranks("causal one or two rows per rank", rc, 0, ps, 1);
  rc = case_zigzag(1);
  rc.n = 10; /* 2P chunks of one row */
  run_ranks("causal zigzag one-row chunks", rc, 0, ps, 1);
  run_ranks("causal zigzag one-row chunks, backward", rc, 1, ps, 1);
}

/* More ranks than rows (SPEC §1: any P): the first N ranks own a row each, the others none.
 * An empty rank sends, receives, holds and launches nothing, yet takes part in every call, so
 * the ranks with rows still match the reference, forward and backward. */
static void test_ring_more_ranks_than_rows(void **state) {
  (void)state;
  struct { const char *what; ring_case rc; long long n; int ranks; } cases[] = {
      {"causal mod, 5 rows over 8 ranks", case_causal_mod(), 5, 8},
      {"non-causal block GQA batch 2, 3 rows over 7 ranks", case_noncausal_block_gqa(), 3, 7},
      {"causal group GQA (uncovered rows), 1 row over 4 ranks", case_causal_group_gqa(), 1, 4},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c)
    for (int backward = 0; backward < 2; ++backward) {
      ring_case rc = cases[c].rc;
      rc.n = cases[c].n, rc.ranks = cases[c].ranks, rc.backward = backward;
      ring_result res;
      memset(&res, 0, sizeof res);
      run_ring(cases[c].what, &rc, &res);
      for (int p = 0; p < rc.ranks; ++p) {
        const int empty = p >= rc.n;
        assert_int_equal(res.stats[p].rows, empty ? 0 : 1);
        /* Every rank's pass has a timeline (bench_ring --trace / --timeline of all ranks), an
         * empty one where there are no rows. */
        const rda_ring_trace *tr = &res.fwd_trace[p];
        if (!(tr->begin > 0.0 && tr->own >= tr->begin && tr->end >= tr->own))
          fail_msg("%s: rank %d: no forward timeline (begin %g, own %g, end %g)", cases[c].what, p,
                   tr->begin, tr->own, tr->end);
        if (!empty) continue;
        assert_int_equal(tr->count, 0);
        assert_int_equal(res.stats[p].bytes_sent + res.stats[p].bytes_received, 0);
        assert_int_equal(res.stats[p].peak_bytes, 0);
        assert_int_equal(res.fwd_launches[p] + res.bwd_launches[p], 0);
      }
      ring_result_free(&res);
    }
}

static void test_ring_matches_reference_noncausal_block_offsets_gqa(void **state) {
  (void)state;
  const int ps[] = {2, 3, 5};
  run_ranks("non-causal block GQA batch 2", case_noncausal_block_gqa(), 0, ps, 3);
}

static void test_ring_matches_reference_group_offsets_causal_gqa(void **state) {
  (void)state;
  const int ps[] = {3, 4, 7};
  run_ranks("causal group GQA", case_causal_group_gqa(), 0, ps, 3);
}

/* The sm_90a wgmma path on the ring: d = 64, a dilated branch of four offsets spanning every
 * rank (its received blocks go through the wgmma kv-table twins of the forward, dK/dV and dQ),
 * a dense one inside a rank, GQA, batch 2, forward and backward. */
static void test_ring_wgmma_forward_matches_reference(void **state) {
  (void)state;
  ring_case rc = case_bundles();
  rc.head_dim = 64;
  rc.batch = 2;
  rc.n = 90;
  rc.wgmma = 1;
  const int ps[] = {3};
  run_ranks("wgmma causal mod GQA", rc, 1, ps, 1);
}

/* The overlapped wgmma forward and dQ (templates/rda_fwd.cuh, rda_bwd.cuh) on the ring: a dense
 * causal branch spanning every rank, so the own rows and each received block take several key
 * tiles (each tile's softmax or dS beside the previous tile's product), beside a dilated branch
 * of two offsets on the plain wgmma twins; GQA, uneven ranks. */
static void test_ring_wgmma_overlap_matches_reference(void **state) {
  (void)state;
  ring_case rc = base_case();
  rc.heads = 4;
  rc.kv_heads = 2;
  rc.head_dim = 64;
  rc.causal = 1;
  rc.offsets = RDA_OFFSETS_MOD;
  rc.nbranch = 2;
  rc.w[0] = 1 << 20, rc.r[0] = 1;
  rc.w[1] = 1 << 20, rc.r[1] = 2;
  rc.n = 400;
  rc.wgmma = 1;
  rc.fwd_tile = "bm128_bn128_w8_s3_wgo";
  const int ps[] = {3};
  run_ranks("wgmma overlap causal mod GQA", rc, 0, ps, 1);
  /* The backward with the overlapped dQ on the dilated branch, first: its own rows and its
   * rounds' received blocks (the kv-table twin, "_wgo_kt") take two key tiles of 64 per
   * launch at d = 128, so a product is pending at the second. */
  rc.fwd_tile = NULL;
  rc.dq_tile = "bm128_bn64_w8_s3_wgo";
  rc.head_dim = 128;
  rc.r[0] = 2;
  rc.r[1] = 1;
  run_ranks("wgmma overlap dQ causal mod GQA", rc, 1, ps, 1);
}

static void test_ring_matches_reference_zigzag(void **state) {
  (void)state;
  const int ps[] = {2, 3, 4}, p3[] = {3};
  run_ranks("causal zigzag", case_zigzag(1), 0, ps, 3);
  run_ranks("non-causal zigzag", case_zigzag(0), 0, p3, 1);
}

/* Rounds of all classes of a segment (the default), of two classes (a cap of about two class
 * blocks: 8 rows x 2 kv heads x 32 x 4 bytes each) and of one: the same results, forward and
 * backward, contiguous and zigzag. */
static void test_ring_bundles_of_classes_match_reference(void **state) {
  (void)state;
  const long long caps[] = {0, 4500, 1};
  const int ps[] = {3, 4};
  /* A round of four classes from one peer is one launch per query piece; one class per bundle
   * takes one per class (the classes' two heads are not adjacent: h and h + 4). Each head sees
   * the same merges in the same order either way, and the kv-table twin computes exactly what
   * its base kernel does: the outputs are bit-identical, on the same inputs. */
  long launches[3] = {0, 0, 0};
  ring_result res[3];
  const uint64_t seed = rt_seed_value() + 0x5eed;
  for (int i = 0; i < 3; ++i) {
    ring_case rc = case_bundles();
    rc.bundle_bytes = caps[i];
    rc.ranks = 4;
    rt_seed(seed);
    run_ring("bundle launches", &rc, &res[i]);
    for (int p = 0; p < 4; ++p) launches[i] += res[i].fwd_launches[p];
  }
  for (int i = 0; i < 2; ++i) {
    assert_int_equal(res[i].out.no, res[2].out.no);
    if (memcmp(res[i].out.o, res[2].out.o, res[i].out.no * sizeof(float)) != 0 ||
        memcmp(res[i].out.lse, res[2].out.lse, res[i].out.nlse * sizeof(float)) != 0)
      fail_msg("bundle cap %lld: outputs differ bitwise from one class per bundle", caps[i]);
  }
  for (int i = 0; i < 3; ++i) ring_result_free(&res[i]);
  print_message("forward launches by bundle cap: %ld, %ld, %ld\n", launches[0], launches[1], launches[2]);
  if (!(launches[0] < launches[1] && launches[1] < launches[2]))
    fail_msg("forward launches %ld (one bundle), %ld (two classes), %ld (one class): expected "
             "fewer launches for larger bundles",
             launches[0], launches[1], launches[2]);
  for (int i = 0; i < 3; ++i) {
    ring_case rc = case_bundles();
    rc.bundle_bytes = caps[i];
    run_ranks("bundles causal", rc, 1, ps, 2);
    rc.causal = 0;
    rc.layout = RDA_RING_ZIGZAG;
    rc.n = 96;
    const int p2[] = {2};
    run_ranks("bundles non-causal zigzag", rc, 1, p2, 1);
  }
}

/* Block offsets over r = 4 with GQA (8 heads, 4 kv heads): each class's two heads share ONE kv
 * head, so the backward's table launches must put them in successive dK/dV launches. */
static ring_case case_bundles_shared_slot(void) {
  ring_case rc = case_bundles();
  rc.offsets = RDA_OFFSETS_BLOCK;
  rc.causal = 0;
  rc.n = 90;
  return rc;
}

/* Zigzag ranks hold two query pieces of a segment; with mod offsets and more heads per kv head
 * than offsets (8 heads, 2 kv heads, r = 2), heads of one class share a kv slot without being
 * adjacent, so the order of a dK row's additions over pieces and heads is what is tested. */
static ring_case case_bundles_zigzag_pieces(void) {
  ring_case rc = base_case();
  rc.heads = 8;
  rc.kv_heads = 2;
  rc.offsets = RDA_OFFSETS_MOD;
  rc.nbranch = 1;
  rc.w[0] = 1 << 20, rc.r[0] = 2;
  rc.n = 96;
  rc.layout = RDA_RING_ZIGZAG;
  return rc;
}

/* 96 heads in groups of 3 per kv head: heads 63-65 share kv head 21 across the kv-table
 * launches' 64-head chunks. */
static ring_case case_bundles_chunk_straddle(void) {
  ring_case rc = case_bundles_zigzag_pieces();
  rc.heads = 96;
  rc.kv_heads = 32;
  rc.offsets = RDA_OFFSETS_BLOCK;
  rc.n = 32;
  return rc;
}

/* The backward over rounds of all classes (one kv-table dK/dV launch per slot-sharing layer and
 * one dQ launch per peer and query piece) against one class per bundle (launches per class and
 * head run): fewer launches, and dQ, dK, dV bit-identical on the same inputs, since every dQ and
 * dK/dV row sees the same additions in the same order. Both also match the reference (run_ring). */
static void test_ring_backward_bundles_fewer_launches_bit_identical(void **state) {
  (void)state;
  const long long caps[] = {0, 1};
  const ring_case cases[] = {case_bundles(), case_bundles_shared_slot(),
                             case_bundles_zigzag_pieces(), case_bundles_chunk_straddle()};
  const char *names[] = {"backward bundles mod GQA", "backward bundles block GQA shared slot",
                         "backward bundles zigzag pieces", "backward bundles 64-head chunks"};
  const int ranks[] = {4, 4, 2, 2};
  for (int c = 0; c < 4; ++c) {
    long launches[2] = {0, 0}, kt = 0, shared = 0;
    ring_result res[2];
    const uint64_t seed = rt_seed_value() + 0xb4d + (uint64_t)c;
    memset(g_dkdv_kt, 0, sizeof g_dkdv_kt);
    memset(g_dkdv_kt_shared, 0, sizeof g_dkdv_kt_shared);
    for (int i = 0; i < 2; ++i) {
      ring_case rc = cases[c];
      rc.bundle_bytes = caps[i];
      rc.ranks = ranks[c];
      rc.backward = 1;
      rt_seed(seed);
      run_ring(names[c], &rc, &res[i]);
      for (int p = 0; p < ranks[c]; ++p) launches[i] += res[i].bwd_launches[p];
    }
    for (int p = 0; p < MAXP; ++p) kt += g_dkdv_kt[p], shared += g_dkdv_kt_shared[p];
    if (kt == 0) fail_msg("%s: no kv-table dK/dV launch", names[c]);
    if (shared > 0)
      fail_msg("%s: %ld of %ld kv-table dK/dV launches have two blocks on one (class, kv slot)",
               names[c], shared, kt);
    print_message("%s: backward launches %ld (one bundle), %ld (one class per bundle)\n",
                  names[c], launches[0], launches[1]);
    if (launches[0] >= launches[1])
      fail_msg("%s: backward launches %ld (one bundle) vs %ld (one class per bundle): expected "
               "fewer with kv-table rounds",
               names[c], launches[0], launches[1]);
    assert_non_null(res[0].out.dq);
    assert_non_null(res[1].out.dq);
    assert_int_equal(res[0].out.no, res[1].out.no);
    assert_int_equal(res[0].out.nkv, res[1].out.nkv);
    const struct {
      const char *what;
      const float *a, *b;
      size_t n;
    } g[] = {{"dQ", res[0].out.dq, res[1].out.dq, res[0].out.no},
             {"dK", res[0].out.dk, res[1].out.dk, res[0].out.nkv},
             {"dV", res[0].out.dv, res[1].out.dv, res[0].out.nkv}};
    for (int x = 0; x < 3; ++x)
      for (size_t e = 0; e < g[x].n; ++e)
        if (memcmp(&g[x].a[e], &g[x].b[e], sizeof(float)) != 0)
          fail_msg("%s: %s element %zu: %.9g with one bundle, %.9g with one class per bundle",
                   names[c], g[x].what, e, (double)g[x].a[e], (double)g[x].b[e]);
    for (int i = 0; i < 2; ++i) ring_result_free(&res[i]);
  }
}

/* Segments of 8 rows with ranks of 40 rows each: nothing leaves any rank. */
static void test_ring_local_branches_send_zero_bytes(void **state) {
  (void)state;
  ring_case rc = base_case();
  rc.offsets = RDA_OFFSETS_MOD;
  rc.nbranch = 2;
  rc.w[0] = 8, rc.r[0] = 1;
  rc.w[1] = 40, rc.r[1] = 2;
  rc.n = 120;
  rc.ranks = 3;
  ring_result res;
  run_ring("local branches", &rc, &res);
  for (int p = 0; p < 3; ++p) {
    assert_int_equal(res.stats[p].bytes_sent, 0);
    assert_int_equal(res.stats[p].bytes_received, 0);
  }
  ring_result_free(&res);
}

/* One segment spanning everything: the ring's memory per rank shrinks about as 1/P. */
static void test_ring_peak_bytes_shrink_with_ranks(void **state) {
  (void)state;
  ring_case rc = base_case();
  rc.offsets = RDA_OFFSETS_MOD;
  rc.nbranch = 1;
  rc.w[0] = 1 << 20, rc.r[0] = 1;
  rc.n = 192;
  ring_result r2, r8;
  rc.ranks = 2;
  run_ring("peak P = 2", &rc, &r2);
  rc.ranks = 8;
  run_ring("peak P = 8", &rc, &r8);
  uint64_t p2 = 0, p8 = 0;
  for (int p = 0; p < 2; ++p)
    if (r2.stats[p].peak_bytes > p2) p2 = r2.stats[p].peak_bytes;
  for (int p = 0; p < 8; ++p)
    if (r8.stats[p].peak_bytes > p8) p8 = r8.stats[p].peak_bytes;
  assert_true(p8 > 0);
  /* 4x the ranks: at most a third of the memory (1/4 plus rounding of uneven blocks). */
  assert_true(3 * p8 <= p2);
  assert_true(r8.stats[0].bytes_sent > 0);
  ring_result_free(&r2);
  ring_result_free(&r8);
}

/* One rank fails (a wrong row count): every other rank returns an abort error, no hang (the
 * world's timeout is 60 s; an abort ends the waits at once). */
static void test_ring_failing_rank_errors_every_rank(void **state) {
  (void)state;
  ring_case rc = base_case();
  rc.causal = 1;
  rc.nbranch = 1;
  rc.w[0] = 1 << 20, rc.r[0] = 1;
  rc.n = 64;
  rc.ranks = 4;
  rc.fail_rank_plus1 = 3;
  const time_t t0 = time(NULL);
  run_ring("failing rank", &rc, NULL);
  assert_true(time(NULL) - t0 < 30);
}

/* The same with the failing rank's abort kept on its rank, as ncclCommAbort keeps it: the others
 * still fail, naming that rank, from the pass's agreement instead of their timeout (10 s here;
 * before the agreement carried failures they waited for it and reported the barrier timing
 * out). Backward too, and with a rank that owns no rows among them. */
static void test_ring_failing_rank_named_without_abort_reaching_peers(void **state) {
  (void)state;
  ring_case rc = base_case();
  rc.causal = 1;
  rc.nbranch = 1;
  rc.w[0] = 16, rc.r[0] = 2;
  rc.n = 64;
  rc.ranks = 4;
  rc.fail_rank_plus1 = 2;
  rc.local_abort = 1;
  run_ring("failing rank, local abort", &rc, NULL);
  rc.backward = 1;
  rc.fail_rank_plus1 = 4;
  run_ring("failing rank, local abort, backward", &rc, NULL);
  rc.n = 3; /* rank 3 owns no rows */
  run_ring("failing rank, local abort, idle rank", &rc, NULL);
}

/* The ring backward: dQ from local work, dK/dV including what other ranks computed for the
 * rank's rows and returned in fp32, against the float64 reference gradients. */
static void test_ring_allgathers_beside_rings_match_reference(void **state) {
  (void)state;
  ring_case rc = case_allgather();
  rda_config cfg;
  rt_config_make(&cfg, rc.heads, rc.kv_heads, rc.head_dim, RDA_DTYPE_BF16, rc.causal, rc.offsets,
                 rc.nbranch, rc.w, rc.r);
  rda_ring_plan *p = NULL;
  rda_err err = {0};
  assert_int_equal(rda_ring_plan_create(&cfg, rc.n, rc.ranks, rc.layout, &p, &err), RDA_OK);
  assert_int_equal(rda_ring_plan_branch(p, 0)->nallgather, 0);
  assert_int_equal(rda_ring_plan_branch(p, 1)->nallgather, 4);
  rda_ring_plan_destroy(p);
  run_ring("all-gathers beside rings", &rc, NULL);
  rc.backward = 1;
  run_ring("all-gathers beside rings, backward", &rc, NULL);
}

static void test_ring_backward_matches_reference_causal_mod(void **state) {
  (void)state;
  const int ps[] = {1, 2, 3, 5, 8};
  run_ranks("backward causal mod 3 branches", case_causal_mod(), 1, ps, 5);
}

static void test_ring_backward_noncausal_block_gqa_batch2(void **state) {
  (void)state;
  const int ps[] = {2, 3};
  run_ranks("backward non-causal block GQA batch 2", case_noncausal_block_gqa(), 1, ps, 2);
}

static void test_ring_backward_causal_mod_gqa_batch2(void **state) {
  (void)state;
  const int ps[] = {2, 3};
  run_ranks("backward causal mod GQA batch 2", case_causal_mod_gqa(), 1, ps, 2);
}

static void test_ring_backward_group_causal_gqa(void **state) {
  (void)state;
  const int ps[] = {4, 7};
  run_ranks("backward causal group GQA", case_causal_group_gqa(), 1, ps, 2);
}

static void test_ring_backward_zigzag(void **state) {
  (void)state;
  const int ps[] = {2, 3};
  run_ranks("backward causal zigzag", case_zigzag(1), 1, ps, 2);
}

/* A rank's link breaks in the middle of the ring (its 3rd wait, forward, or its 5th, which falls
 * in the backward pass): every rank returns an error, none hangs. */
static void test_ring_mid_ring_failure_errors_every_rank(void **state) {
  (void)state;
  ring_case rc = base_case();
  rc.causal = 0;
  rc.nbranch = 1;
  rc.w[0] = 1 << 20, rc.r[0] = 1;
  rc.n = 64;
  rc.ranks = 4;
  rc.backward = 1;
  rc.fail_rank_plus1 = 2;
  const int at[] = {3, 5};
  for (int i = 0; i < 2; ++i) {
    rc.fail_wait = at[i];
    const time_t t0 = time(NULL);
    run_ring("mid-ring failure", &rc, NULL);
    assert_true(time(NULL) - t0 < 30);
  }
}

/* A segment of 2^31 grid rows spans ranks that each hold fewer rows: the ring checks grid rows
 * over the whole sequence (the kernels count them in 32-bit ints) before anything runs, and
 * aborts the world so that no rank waits. Nothing of the 2^31 rows is touched. */
static void test_ring_refuses_segments_of_2_31_grid_rows(void **state) {
  (void)state;
  rda_config cfg;
  const long long w[1] = {1LL << 32}, r[1] = {1};
  rt_config_make(&cfg, 2, 2, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, w, r);
  const long long N = 1LL << 31;
  rda_err err = {0};
  rda_ring_plan *rp = NULL;
  assert_int_equal(rda_ring_plan_create(&cfg, N, 1, RDA_RING_CONTIGUOUS, &rp, &err), RDA_OK);
  rda_plan_k pk;
  memset(&pk, 0, sizeof pk);
  assert_int_equal(rda_gen_plan(g_gen, &cfg, &g_hw, &pk, &err), RDA_OK);
  rda_fwd_kernels kern = {0, NULL};
  assert_int_equal(rda_fwd_load(g_b[0], &pk, &kern, &err), RDA_OK);
  rt_ring_world world;
  assert_int_equal(rt_ring_world_create(&world, g_b[0], 1, 5.0, &err), RDA_OK);
  rda_transport *t = NULL;
  assert_int_equal(
      rt_ring_world_join(&world, 0, rda_ring_fingerprint(&cfg, N, 1, RDA_RING_CONTIGUOUS), g_b[0],
                         &t, &err),
      RDA_OK);
  static uint16_t in[64] __attribute__((aligned(16)));
  static float out[64] __attribute__((aligned(16)));
  rda_fwd_args a;
  rda_fwd_args_contiguous(&a, &cfg, 1, N, in, in, in, out, out);
  rda_err_clear(&err);
  assert_int_equal(rda_ring_fwd_run(g_b[0], &pk, &kern, rp, 0, t, &a, NULL, 0, NULL, &err),
                   RDA_ERR_UNSUPPORTED);
  if (strstr(err.msg, "ring forward: branch 0: 2147483648 grid rows per segment") == NULL)
    fail_msg("unexpected error: %s", err.msg);
  rda_transport_destroy(t);
  rt_ring_world_destroy(&world);
  rda_fwd_unload(g_b[0], &kern);
  rda_plan_k_free(&pk);
  rda_ring_plan_destroy(rp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_causal_single_row_pieces),
      cmocka_unit_test(test_ring_refuses_segments_of_2_31_grid_rows),
      cmocka_unit_test(test_ring_matches_reference_every_rank_count_causal_mod),
      cmocka_unit_test(test_ring_more_ranks_than_rows),
      cmocka_unit_test(test_ring_matches_reference_noncausal_block_offsets_gqa),
      cmocka_unit_test(test_ring_matches_reference_group_offsets_causal_gqa),
      cmocka_unit_test(test_ring_matches_reference_zigzag),
      cmocka_unit_test(test_ring_wgmma_forward_matches_reference),
      cmocka_unit_test(test_ring_wgmma_overlap_matches_reference),
      cmocka_unit_test(test_ring_bundles_of_classes_match_reference),
      cmocka_unit_test(test_ring_local_branches_send_zero_bytes),
      cmocka_unit_test(test_ring_peak_bytes_shrink_with_ranks),
      cmocka_unit_test(test_ring_failing_rank_errors_every_rank),
    cmocka_unit_test(test_ring_failing_rank_named_without_abort_reaching_peers),
      cmocka_unit_test(test_ring_mid_ring_failure_errors_every_rank),
      cmocka_unit_test(test_ring_allgathers_beside_rings_match_reference),
      cmocka_unit_test(test_ring_backward_matches_reference_causal_mod),
      cmocka_unit_test(test_ring_backward_noncausal_block_gqa_batch2),
      cmocka_unit_test(test_ring_backward_causal_mod_gqa_batch2),
      cmocka_unit_test(test_ring_backward_group_causal_gqa),
      cmocka_unit_test(test_ring_backward_zigzag),
      cmocka_unit_test(test_ring_backward_bundles_fewer_launches_bit_identical),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
