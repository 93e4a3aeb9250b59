/* test_random.c — a randomized differential test: whole configs drawn at random from the legal
 * space (SPEC §1-3), each run forward and backward on every backend here and through the ring
 * on P virtual ranks (emulator, host transport), every result against the float64 reference
 * with SPEC §5's tolerances. Hand-picked matrices (test_fwd, test_bwd, test_ring) miss planner
 * and kernel edge cases that random configs find.
 *
 * Reproduce a failure with the line it prints: RDA_TEST_SEED=S RDA_RANDOM_CASES=K
 * RDA_RANDOM_CASE=i runs case i of the same K draws (each case draws from its own stream of
 * (seed, i), so one case runs alone exactly as it ran among the others). */
// clang-format off
#include "backend.h"
#include "bwd.h"
#include "fwd.h"
#include "gen.h"
#include "rda_test.h"
#include "rda_test_backend.h"
#include "rda_test_ring.h"
#include "reference.h"
#include "ring.h"
#include "ring_plan.h"
#include "transport.h"

#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */
// clang-format on

enum {
  MAXP = 8, /* virtual ranks at most */
  MAXB = 3, /* branches at most */
  MAXCASES = 10000,
  /* The default number of cases: a Release build on two cores took 62 s with a cold kernel
   * cache (nearly all of it building kernel variants) and 10 s with a warm one; ASan ~4x. */
  DEFAULT_CASES = 20
};

/* ------------------------------------------------------------------ fixture */

static rt_backends g_rt;          /* the generator, emu (and cuda when usable): single device */
static rda_backend *g_rank[MAXP]; /* one emulator backend per virtual rank */

static int group_setup(void **state) {
  (void)state;
  if (rt_backends_open(&g_rt, "test_random") != 0) return -1;
  return rt_ring_backends_open(g_rank, MAXP, "test_random");
}

static int group_teardown(void **state) {
  (void)state;
  rt_ring_backends_close(g_rank, MAXP);
  rt_backends_close(&g_rt);
  return 0;
}

/* ------------------------------------------------------------------ one drawn case */

typedef struct rcase {
  int kv_heads, heads, head_dim, dtype, causal, offsets, nbranch;
  long long w[MAXB], r[MAXB];
  long long n, batch;
  double scale;  /* 0: the default 1/sqrt(head_dim) */
  int with_dlse; /* a random dLSE (else NULL) */
  int seq_first; /* single device: [N, B, H, D + pad] tensors, padded LSE rows */
  int pad[6];    /* with seq_first: q, k, v, do (multiples of 8), o (of 4), grads (any) */
  int atomic;    /* plan the atomic-dQ backward and run it non-deterministic */
  int wgmma;     /* plan with RDA_PLAN_WGMMA */
  int ranks;     /* the ring's P */
  int zigzag;    /* the ring's layout */
  int one_class; /* ring bundles of one class each (else the default cap) */
  int refused;   /* draws the generator refused before this one */
} rcase;

/* The config as the Lua chunk a user would write (SPEC §3); it is what gets validated. */
static void case_chunk(const rcase *c, char *buf, size_t len) {
  size_t at = 0;
  at += (size_t)snprintf(buf + at, len - at,
                         "return { heads = %d, kv_heads = %d, head_dim = %d, dtype = \"%s\", "
                         "segments = {",
                         c->heads, c->kv_heads, c->head_dim, rda_dtype_name(c->dtype));
  for (int i = 0; i < c->nbranch; ++i)
    at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? ", " : "", c->w[i]);
  at += (size_t)snprintf(buf + at, len - at, "}, dilations = {");
  for (int i = 0; i < c->nbranch; ++i)
    at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? ", " : "", c->r[i]);
  at += (size_t)snprintf(buf + at, len - at, "}, offsets = \"%s\", causal = %s",
                         rda_offsets_name(c->offsets), c->causal ? "true" : "false");
  if (c->scale != 0.0) at += (size_t)snprintf(buf + at, len - at, ", scale = %.17g", c->scale);
  snprintf(buf + at, len - at, " }");
}

/* The whole case on one line: the config chunk and everything else that was drawn. */
static void case_describe(const rcase *c, char *buf, size_t len) {
  char chunk[512];
  case_chunk(c, chunk, sizeof chunk);
  snprintf(buf, len,
           "%s; n = %lld, batch = %lld, dlse %d, layout %s, atomic %d, wgmma %d, ring P = %d %s%s",
           chunk, c->n, c->batch, c->with_dlse, c->seq_first ? "seq-first" : "contiguous",
           c->atomic, c->wgmma, c->ranks, c->zigzag ? "zigzag" : "contiguous",
           c->one_class ? " one-class bundles" : "");
}

/* A segment length for a sequence of n rows: powers of two, arbitrary lengths inside the
 * sequence, around n, and past it (clamped by SPEC §1). */
static long long draw_segment(rt_rng *r, long long n) {
  const double u = rt_rng_uniform(r);
  if (u < 0.3) return 1LL << rt_rng_range(r, 0, 9);
  if (u < 0.7) return rt_rng_range(r, 1, n);
  if (u < 0.85) {
    const long long w = n + rt_rng_range(r, -1, 1);
    return w > 0 ? w : 1;
  }
  return rt_rng_uniform(r) < 0.5 ? n + rt_rng_range(r, 1, 300) : 1LL << 20;
}

/* Kinds that every run must reach at least once; a case can be forced to reach them. */
enum { F_RING = 1u, F_ZIGZAG = 2u, F_WGMMA = 4u, F_REFUSE = 8u };

/* Draw one case from r. force: F_* kinds it must have (F_REFUSE: first one draw that the
 * generator must refuse). The result is not yet validated. */
static void draw_case(rt_rng *r, unsigned force, int refuse_now, rcase *c) {
  memset(c, 0, sizeof *c);
  c->kv_heads = (int)rt_rng_range(r, 1, 3);
  c->heads = c->kv_heads * (int)rt_rng_range(r, 1, 3);
  /* d = 128 rarely: the emulator's cost grows with it. */
  c->head_dim = rt_rng_uniform(r) < 0.1 ? 128 : (rt_rng_uniform(r) < 0.5 ? 32 : 64);
  c->dtype = rt_rng_uniform(r) < 0.5 ? RDA_DTYPE_BF16 : RDA_DTYPE_FP16;
  c->causal = rt_rng_uniform(r) < 0.5;
  c->offsets = (int)rt_rng_range(r, 0, 2);
  c->nbranch = (int)rt_rng_range(r, 1, MAXB);
  c->n = rt_rng_uniform(r) < 0.25 ? rt_rng_range(r, 1, 16) : rt_rng_range(r, 17, 300);
  c->batch = rt_rng_range(r, 1, 2);
  if (rt_rng_uniform(r) < 0.5) {
    /* log-uniform in [0.05, 2], either sign (SPEC §1 puts no sign on τ) */
    c->scale = exp(log(0.05) + rt_rng_uniform(r) * (log(2.0) - log(0.05)));
    if (rt_rng_uniform(r) < 0.3) c->scale = -c->scale;
  }
  c->with_dlse = rt_rng_uniform(r) < 0.5;
  c->seq_first = rt_rng_uniform(r) < 0.3;
  for (int i = 0; i < 4; ++i) c->pad[i] = 8 * (int)rt_rng_range(r, 0, 3);
  c->pad[4] = 4 * (int)rt_rng_range(r, 0, 2);
  c->pad[5] = (int)rt_rng_range(r, 0, 5);
  c->atomic = rt_rng_uniform(r) < 0.15;
  c->wgmma = c->head_dim != 32 && rt_rng_uniform(r) < 0.2;
  if (force & F_WGMMA) {
    if (c->head_dim == 32) c->head_dim = 64;
    c->wgmma = 1;
  }
  if (refuse_now) {
    /* "group" offsets with fewer heads than branches: SPEC §3's documented refusal. */
    c->offsets = RDA_OFFSETS_GROUP;
    c->nbranch = 3;
    c->kv_heads = 1;
    c->heads = (int)rt_rng_range(r, 1, 2);
  }
  for (int i = 0; i < c->nbranch; ++i) {
    c->w[i] = draw_segment(r, c->n);
    c->r[i] = rt_rng_range(r, 1, c->w[i] < 8 ? c->w[i] : 8);
  }
  if ((force & (F_RING | F_ZIGZAG)) && c->n < 2) c->n = rt_rng_range(r, 2, 40);
  /* Now and then more ranks than rows (SPEC §1: any P): the ranks past the rows own none. */
  const long long pmax = c->n < MAXP && rt_rng_uniform(r) < 0.5 ? c->n : MAXP;
  c->ranks = (int)rt_rng_range(r, (force & (F_RING | F_ZIGZAG)) ? 2 : 1, pmax);
  const long long chunk = 2LL * c->ranks;
  if ((force & F_ZIGZAG) ||
      (c->ranks <= c->n && c->n % chunk != 0 && rt_rng_uniform(r) < 0.25)) {
    /* a sequence the zigzag layout can split: a multiple of 2P */
    c->n = c->n / chunk * chunk;
    if (c->n == 0) c->n = chunk;
  }
  c->zigzag = c->n % chunk == 0 && ((force & F_ZIGZAG) || rt_rng_uniform(r) < 0.6);
  c->one_class = rt_rng_uniform(r) < 0.25;
}

/* The generator's validation of the case (SPEC §3). Returns 1 with *cfg when it passes, 0 when
 * it is refused the documented way (fails the test for any other refusal), and checks that the
 * validated config is the one drawn. */
static int case_validate(const rcase *c, rda_config *cfg, const char *label) {
  char chunk[512];
  case_chunk(c, chunk, sizeof chunk);
  rda_err err = {0};
  const rda_status s = rda_gen_config_string(g_rt.gen, chunk, "random.lua", cfg, &err);
  if (s != RDA_OK) {
    const int group_short = c->offsets == RDA_OFFSETS_GROUP && c->heads < c->nbranch;
    if (!group_short || s != RDA_ERR_CONFIG ||
        strstr(err.msg, "offsets = \"group\": needs heads >= the number of branches") == NULL)
      fail_msg("%s: %s refused (%s): %s", label, chunk, rda_status_string(s), err.msg);
    return 0;
  }
  int same = cfg->heads == c->heads && cfg->kv_heads == c->kv_heads &&
             cfg->head_dim == c->head_dim && cfg->dtype == c->dtype && cfg->causal == c->causal &&
             cfg->offsets == c->offsets && cfg->nbranch == c->nbranch &&
             cfg->scale == (c->scale != 0.0 ? c->scale : 1.0 / sqrt((double)c->head_dim));
  for (int i = 0; i < c->nbranch; ++i)
    same = same && cfg->segments[i] == c->w[i] && cfg->dilations[i] == c->r[i];
  if (!same) fail_msg("%s: the validated config differs from the drawn one: %s", label, chunk);
  return 1;
}

/* Case i's random streams: its own (seed, i, salt), independent of every other case. */
static void case_rng(rt_rng *r, uint64_t seed, int i, uint64_t salt) {
  rt_rng_seed(r, seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)) ^ (salt << 56));
}

/* Draw case i until the generator accepts it (counting refusals); *cfg the validated config. */
static void case_draw(uint64_t seed, int i, unsigned force, rcase *c, rda_config *cfg) {
  rt_rng r;
  case_rng(&r, seed, i, force ? 2 : 1);
  char label[64];
  snprintf(label, sizeof label, "case %d", i);
  int refused = 0;
  for (int tries = 0;; ++tries) {
    if (tries == 1000) fail_msg("%s: 1000 draws in a row refused", label);
    draw_case(&r, force, (force & F_REFUSE) && refused == 0, c);
    if (case_validate(c, cfg, label)) break;
    refused++;
  }
  c->refused = refused;
}

static unsigned case_kinds(const rcase *c) {
  return (c->ranks >= 2 ? F_RING : 0u) | (c->zigzag ? F_ZIGZAG : 0u) | (c->wgmma ? F_WGMMA : 0u) |
         (c->refused > 0 ? F_REFUSE : 0u);
}

/* ------------------------------------------------------------------ inputs and references */

typedef struct rdata {
  double *q, *k, *v, *dout, *dlse; /* dlse NULL unless with_dlse */
  double *o_ref, *lse_ref;
  rt_bwd_ref grad; /* the reference gradients and their magnitudes */
} rdata;

/* Inputs and references of case c. Where dQ or dK cancel (every key of a row is one key, or
 * the softmax has saturated on one key), the check judges them against their magnitude
 * (check.h, RDA_CHECK_GRAD_MAG_FRACTION), so such cases need nothing special. */
static void data_make(const rcase *c, const rda_config *cfg, rt_rng *r, rdata *d) {
  const long long B = c->batch, N = c->n, H = c->heads, Hkv = c->kv_heads, D = c->head_dim;
  const size_t nq = (size_t)(B * N * H * D), nkv = (size_t)(B * N * Hkv * D);
  d->q = rt_normal_from(r, nq, c->dtype);
  d->k = rt_normal_from(r, nkv, c->dtype);
  d->v = rt_normal_from(r, nkv, c->dtype);
  d->dout = rt_normal_from(r, nq, c->dtype);
  rt_reference(cfg, B, N, d->q, d->k, d->v, &d->o_ref, &d->lse_ref);
  /* dLSE rounded to bf16: exact in the kernels' fp32 */
  d->dlse = c->with_dlse ? rt_normal_from(r, (size_t)(B * H * N), RDA_DTYPE_BF16) : NULL;
  rt_reference_bwd_mag(cfg, B, N, d->q, d->k, d->v, d->dout, d->dlse, &d->grad);
}

static void data_free(rdata *d) {
  free(d->q);
  free(d->k);
  free(d->v);
  free(d->dout);
  free(d->dlse);
  free(d->o_ref);
  free(d->lse_ref);
  rt_bwd_ref_free(&d->grad);
  memset(d, 0, sizeof *d);
}

/* ------------------------------------------------------------------ single device */

/* Strides over (batch, n, head) of a [B, N, heads, D] tensor of the case's layout. */
static void strides_of(const rcase *c, long long heads, int pad, long long s[3]) {
  if (c->seq_first)
    rt_strides_seq_first(c->batch, heads, c->head_dim, pad, s);
  else
    rt_strides_contig(c->n, heads, c->head_dim, s);
}

static uint16_t *dev_bits(rda_backend *b, const double *x, const rcase *c, long long heads,
                          const long long s[3]) {
  size_t count = 0;
  uint16_t *host = rt_make_bits(x, c->batch, c->n, heads, c->head_dim, s, c->dtype, &count);
  uint16_t *dev = rt_dev_alloc(b, count * sizeof *dev);
  rt_dev_upload(b, dev, host, count * sizeof *dev);
  free(host);
  return dev;
}

/* Forward, then backward on its O and LSE, on one backend; both against the reference.
 * Returns 0 when the backend cannot run the case (wgmma off sm_90), else 1. */
static int run_single(rt_backend *be, const rcase *c, const rda_config *cfg, const rdata *d,
                      const char *label) {
  rda_backend *b = be->b;
  if (c->wgmma && !rt_wgmma_runs_on(be, label)) return 0;
  const long long B = c->batch, N = c->n, H = c->heads, Hkv = c->kv_heads, D = c->head_dim;
  char what[1024];
  rda_err err = {0};
  rda_plan_k plan;
  memset(&plan, 0, sizeof plan);
  const unsigned flags = RDA_PLAN_BACKWARD | (c->atomic ? RDA_PLAN_BACKWARD_ATOMIC : 0u) |
                         (c->wgmma ? RDA_PLAN_WGMMA : 0u);
  snprintf(what, sizeof what, "%s [%s]", label, b->name);
  rt_plan_with_tile(g_rt.gen, cfg, &be->hw, flags, "fwd", NULL, &plan, what);
  rt_check_wgmma_plan(&plan, "fwd", c->wgmma, what);
  rt_check_wgmma_plan(&plan, "bwd_dkdv", c->wgmma, what);
  rt_check_wgmma_plan(&plan, "bwd_dq", c->wgmma, what);
  rda_fwd_kernels kern = {0, NULL};
  if (rda_fwd_load(b, &plan, &kern, &err) != RDA_OK) fail_msg("%s: load: %s", what, err.msg);

  rda_bwd_args ba;
  memset(&ba, 0, sizeof ba);
  ba.batch = B;
  ba.n = N;
  strides_of(c, H, c->pad[0], ba.q_s);
  strides_of(c, Hkv, c->pad[1], ba.k_s);
  strides_of(c, Hkv, c->pad[2], ba.v_s);
  strides_of(c, H, c->pad[3], ba.do_s);
  strides_of(c, H, c->pad[4], ba.o_s);
  strides_of(c, H, c->pad[5], ba.dq_s);
  strides_of(c, Hkv, c->pad[5] + 1, ba.dk_s);
  strides_of(c, Hkv, c->pad[5] + 2, ba.dv_s);
  ba.lse_s[1] = N + (c->seq_first ? c->pad[5] : 0);
  ba.lse_s[0] = H * ba.lse_s[1] + (c->seq_first ? 1 : 0);
  memcpy(ba.dlse_s, ba.lse_s, sizeof ba.lse_s);
  const size_t lse_count = rt_lse_span(B, H, N, ba.lse_s);
  const size_t o_count = rt_span(B, N, H, D, ba.o_s), dq_count = rt_span(B, N, H, D, ba.dq_s),
               dk_count = rt_span(B, N, Hkv, D, ba.dk_s), dv_count = rt_span(B, N, Hkv, D, ba.dv_s);
  uint16_t *q = dev_bits(b, d->q, c, H, ba.q_s), *k = dev_bits(b, d->k, c, Hkv, ba.k_s),
           *v = dev_bits(b, d->v, c, Hkv, ba.v_s), *dout = dev_bits(b, d->dout, c, H, ba.do_s);
  float *o = rt_dev_poisoned(b, o_count), *lse = rt_dev_poisoned(b, lse_count);

  /* forward */
  rda_fwd_args fa;
  memset(&fa, 0, sizeof fa);
  fa.batch = B;
  fa.n = N;
  fa.q = q, fa.k = k, fa.v = v, fa.o = o, fa.lse = lse;
  memcpy(fa.q_s, ba.q_s, sizeof fa.q_s);
  memcpy(fa.k_s, ba.k_s, sizeof fa.k_s);
  memcpy(fa.v_s, ba.v_s, sizeof fa.v_s);
  memcpy(fa.o_s, ba.o_s, sizeof fa.o_s);
  memcpy(fa.lse_s, ba.lse_s, sizeof fa.lse_s);
  if (rda_fwd_run(b, &plan, &kern, &fa, &err) != RDA_OK || b->synchronize(b, &err) != RDA_OK)
    fail_msg("%s: forward: %s", what, err.msg);
  float *o_host = rt_download_f32(b, o, o_count), *lse_host = rt_download_f32(b, lse, lse_count);
  snprintf(what, sizeof what, "%s [%s forward]", label, b->name);
  rt_report rep;
  const bool fwd_ok =
      rt_check_fwd(what, cfg, B, N, o_host, ba.o_s, lse_host, ba.lse_s, d->o_ref, d->lse_ref, &rep);
  free(o_host);
  free(lse_host);

  /* backward on the forward's O and LSE; gradients and workspace poisoned */
  float *dlse = d->dlse != NULL ? rt_dev_lse_f32(b, d->dlse, B, H, N, ba.lse_s) : NULL;
  ba.q = q, ba.k = k, ba.v = v, ba.dout = dout, ba.o = o, ba.lse = lse, ba.dlse = dlse;
  ba.dq = rt_dev_poisoned(b, dq_count);
  ba.dk = rt_dev_poisoned(b, dk_count);
  ba.dv = rt_dev_poisoned(b, dv_count);
  const size_t ws_bytes = rda_bwd_workspace_bytes(&plan, B, N);
  ba.workspace = rt_dev_poisoned(b, (ws_bytes + sizeof(float) - 1) / sizeof(float));
  ba.deterministic = !c->atomic;
  bool bwd_ok = false;
  rt_grad_report grep = {0};
  if (fwd_ok) {
    if (rda_bwd_run(b, &plan, &kern, &ba, &err) != RDA_OK || b->synchronize(b, &err) != RDA_OK)
      fail_msg("%s: backward: %s", what, err.msg);
    float *dq_host = rt_download_f32(b, ba.dq, dq_count);
    float *dk_host = rt_download_f32(b, ba.dk, dk_count);
    float *dv_host = rt_download_f32(b, ba.dv, dv_count);
    snprintf(what, sizeof what, "%s [%s backward]", label, b->name);
    bwd_ok = rt_check_bwd_ref(what, cfg, B, N, dq_host, ba.dq_s, dk_host, ba.dk_s, dv_host, ba.dv_s,
                              &d->grad, &grep);
    free(dq_host);
    free(dk_host);
    free(dv_host);
  }
  fprintf(stderr, "    %-4s O %.1e LSE %.1e | dQ %.1e dK %.1e dV %.1e\n", b->name, rep.o_rel_l2,
          rep.lse_max_abs, grep.dq_rel_l2, grep.dk_rel_l2, grep.dv_rel_l2);

  void *bufs[] = {q, k, v, dout, o, lse, dlse, ba.dq, ba.dk, ba.dv, ba.workspace};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i)
    if (bufs[i] != NULL) b->free(b, bufs[i]);
  rda_fwd_unload(b, &kern);
  rda_plan_k_free(&plan);
  if (!fwd_ok || !bwd_ok)
    fail_msg("%s: single device on %s differs from the reference", label, b->name);
  return 1;
}

/* ------------------------------------------------------------------ the ring */

/* The case through the ring on P virtual ranks, forward and backward; every rank's rows of O,
 * LSE, dQ, dK and dV against the reference, its bytes against the ring plan. */
static void run_ring(const rcase *c, const rda_config *cfg, const rdata *d, const char *label) {
  const long long B = c->batch, N = c->n, H = c->heads, Hkv = c->kv_heads, D = c->head_dim;
  const int P = c->ranks, layout = c->zigzag ? RDA_RING_ZIGZAG : RDA_RING_CONTIGUOUS;
  rda_err err = {0};
  rda_hw hw;
  if (rda_gen_hw_builtin(g_rt.gen, g_rank[0]->arch, &hw, &err) != RDA_OK)
    fail_msg("%s: hw: %s", label, err.msg);
  char what[1024];
  snprintf(what, sizeof what, "%s [ring P = %d %s]", label, P, rda_ring_layout_name(layout));
  rda_plan_k plan;
  memset(&plan, 0, sizeof plan);
  rt_plan_with_tile(g_rt.gen, cfg, &hw, RDA_PLAN_BACKWARD | (c->wgmma ? RDA_PLAN_WGMMA : 0u), "fwd",
                    NULL, &plan, what);
  rda_ring_plan *rp = NULL;
  const uint64_t bundle = c->one_class ? 1u : RDA_RING_BUNDLE_BYTES;
  if (rda_ring_plan_create_bundled(cfg, N, P, layout, bundle, &rp, &err) != RDA_OK)
    fail_msg("%s: ring plan: %s", what, err.msg);
  rt_ring_world world;
  if (rt_ring_world_create(&world, g_rank[0], P, 60.0, &err) != RDA_OK)
    fail_msg("%s: world: %s", what, err.msg);

  rt_ring_job jobs[MAXP];
  const uint64_t fp = rda_ring_fingerprint(cfg, N, P, layout);
  for (int p = 0; p < P; ++p) {
    jobs[p] = (rt_ring_job){
        .b = g_rank[p], .pk = &plan, .rp = rp, .world = &world, .fp = fp, .rank = p, .backward = 1};
    rt_ring_job_setup(&jobs[p], B, N, d->q, d->k, d->v, d->dout, d->dlse, what);
  }
  rt_ring_run(jobs, P);

  rt_ring_out out;
  rt_ring_out_alloc(&out, cfg, B, N, 1);
  int bytes_bad = 0;
  for (int p = 0; p < P; ++p) {
    rt_ring_job *j = &jobs[p];
    const rda_ring_rank *rk = j->rk;
    const long long R = rk->rows;
    if (j->status != RDA_OK) fail_msg("%s: rank %d: %s", what, p, j->err.msg);
    rt_ring_out_gather(&out, j);
    /* What moved is what the plan says (per batch element); the backward moves K/V again and
     * returns fp32 gradients, twice the bytes, for every received block. The memory the
     * forward held is the plan's blocks for the batch, each aligned. */
    const uint64_t ub = (uint64_t)B;
    if (j->stats.rows != R || j->stats.peak_bytes != rt_ring_planned_peak(rk, B) ||
        j->stats.bytes_sent != rk->bytes_sent * ub ||
        j->stats.bytes_received != rk->bytes_received * ub ||
        j->bstats.bytes_sent != (rk->bytes_sent + 2 * rk->bytes_received) * ub ||
        j->bstats.bytes_received != (rk->bytes_received + 2 * rk->bytes_sent) * ub) {
      fprintf(stderr,
              "FAIL %s: rank %d: %" PRId64 " rows, sent/received %" PRIu64 "/%" PRIu64
              " bytes forward, %" PRIu64 "/%" PRIu64 " backward, held %" PRIu64
              "; the plan says %lld rows, %" PRIu64 "/%" PRIu64 " and %" PRIu64
              " per batch element\n",
              what, p, j->stats.rows, j->stats.bytes_sent, j->stats.bytes_received,
              j->bstats.bytes_sent, j->bstats.bytes_received, j->stats.peak_bytes, R,
              rk->bytes_sent, rk->bytes_received, rk->peak_bytes);
      bytes_bad = 1;
    }
    rt_ring_job_free(j);
  }

  long long o_s[3], kv_s[3];
  const long long lse_s[2] = {H * N, N};
  rt_strides_contig(N, H, D, o_s);
  rt_strides_contig(N, Hkv, D, kv_s);
  rt_report rep;
  rt_grad_report grep = {0};
  bool ok = rt_check_fwd(what, cfg, B, N, out.o, o_s, out.lse, lse_s, d->o_ref, d->lse_ref, &rep);
  ok = ok &&
       rt_check_bwd_ref(what, cfg, B, N, out.dq, o_s, out.dk, kv_s, out.dv, kv_s, &d->grad, &grep);
  fprintf(stderr, "    ring O %.1e LSE %.1e | dQ %.1e dK %.1e dV %.1e (P = %d %s)\n", rep.o_rel_l2,
          rep.lse_max_abs, grep.dq_rel_l2, grep.dk_rel_l2, grep.dv_rel_l2, P,
          rda_ring_layout_name(layout));
  if (!ok)
    for (int p = 0; p < P; ++p) {
      const rda_ring_rank *rk = rda_ring_plan_rank(rp, p);
      fprintf(stderr, "  rank %d owns rows [%" PRId64 ", %" PRId64 ")", p, rk->lo[0], rk->hi[0]);
      if (rk->npieces == 2)
        fprintf(stderr, " and [%" PRId64 ", %" PRId64 ")", rk->lo[1], rk->hi[1]);
      fprintf(stderr, "\n");
    }
  rt_ring_out_free(&out);
  rt_ring_world_destroy(&world);
  rda_ring_plan_destroy(rp);
  rda_plan_k_free(&plan);
  if (!ok || bytes_bad) fail_msg("%s: the ranks' rows differ from the reference", what);
}

/* ------------------------------------------------------------------ the test */

static long env_long(const char *name, long dflt, long lo, long hi) {
  const char *s = getenv(name);
  if (s == NULL || *s == '\0') return dflt;
  char *end = NULL;
  const long v = strtol(s, &end, 10);
  if (*end != '\0' || v < lo || v > hi)
    fail_msg("%s=%s: must be an integer in [%ld, %ld]", name, s, lo, hi);
  return v;
}

static void test_random_configs_match_reference(void **state) {
  (void)state;
  const uint64_t seed = rt_seed_value();
  const int K = (int)env_long("RDA_RANDOM_CASES", DEFAULT_CASES, 1, MAXCASES);
  const int only = (int)env_long("RDA_RANDOM_CASE", -1, -1, K - 1);
  rcase *cases = calloc((size_t)K, sizeof *cases);
  rda_config *cfgs = calloc((size_t)K, sizeof *cfgs);
  assert_true(cases != NULL && cfgs != NULL);

  /* Draw every case first (cheap: validation only). Kinds that no case but the last reached
   * are then forced into the last one, so no seed can run without them. */
  unsigned seen = 0;
  for (int i = 0; i < K; ++i) {
    case_draw(seed, i, 0, &cases[i], &cfgs[i]);
    if (i < K - 1) seen |= case_kinds(&cases[i]);
  }
  const unsigned need = (F_RING | F_ZIGZAG | F_WGMMA | F_REFUSE) & ~seen;
  if (need != 0 && (case_kinds(&cases[K - 1]) & need) != need)
    case_draw(seed, K - 1, need, &cases[K - 1], &cfgs[K - 1]);

  long ran = 0, fwd = 0, bwd = 0, ring = 0, zigzag = 0, wgmma = 0, refused = 0, dlse = 0,
       atomic = 0, empty = 0, by_p[MAXP + 1] = {0};
  const double t0 = rt_now_s();
  for (int i = 0; i < K; ++i) {
    if (only >= 0 && i != only) continue;
    rcase *c = &cases[i];
    const double tc = rt_now_s();
    rt_rng r;
    case_rng(&r, seed, i, 3);
    rdata d;
    memset(&d, 0, sizeof d);
    data_make(c, &cfgs[i], &r, &d);
    char desc[768], label[900];
    case_describe(c, desc, sizeof desc);
    snprintf(label, sizeof label,
             "case %d (RDA_TEST_SEED=%" PRIu64 " RDA_RANDOM_CASES=%d RDA_RANDOM_CASE=%d): %s", i,
             seed, K, i, desc);
    fprintf(stderr, "  %s\n", label);
    for (int b = 0; b < g_rt.n; ++b) {
      const int runs = run_single(&g_rt.be[b], c, &cfgs[i], &d, label);
      fwd += runs;
      bwd += runs;
    }
    run_ring(c, &cfgs[i], &d, label);
    data_free(&d);
    ran++;
    ring++;
    by_p[c->ranks]++;
    zigzag += c->zigzag;
    empty += c->ranks > c->n;
    wgmma += c->wgmma;
    refused += c->refused;
    dlse += c->with_dlse;
    atomic += c->atomic;
    fprintf(stderr, "    %.1f s\n", rt_now_s() - tc);
  }
  print_message("test_random: seed %" PRIu64
                ", %ld of %d cases in %.0f s: fwd %ld, bwd %ld "
                "(dlse %ld, atomic %ld), ring %ld (P = 1..8: %ld %ld %ld %ld %ld %ld %ld %ld; "
                "P > N %ld), zigzag %ld, wgmma %ld, refused draws %ld\n",
                seed, ran, K, rt_now_s() - t0, fwd, bwd, dlse, atomic, ring, by_p[1], by_p[2],
                by_p[3], by_p[4], by_p[5], by_p[6], by_p[7], by_p[8], empty, zigzag, wgmma,
                refused);
  free(cases);
  free(cfgs);
  /* Every kind ran at least once (a single case chosen by RDA_RANDOM_CASE: only that one). */
  if (only < 0) {
    long multi = 0;
    for (int p = 2; p <= MAXP; ++p) multi += by_p[p];
    if (fwd == 0 || bwd == 0 || ring == 0 || multi == 0 || zigzag == 0 || wgmma == 0 ||
        refused == 0)
      fail_msg(
          "test_random: a kind never ran (fwd %ld, bwd %ld, ring %ld, ring P >= 2 %ld, "
          "zigzag %ld, wgmma %ld, refused %ld)",
          fwd, bwd, ring, multi, zigzag, wgmma, refused);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_configs_match_reference),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
