/* test_kernel_times.c — the benchmarks' profiling backend (bench/kernel_times.c): launches
 * through the wrapper counted exactly per variant (with the event pool growing past its first
 * size and reused after a reset), times >= 0 that sum to the total, sorted by time, and
 * forward + backward results through the wrapper bit-identical to the unwrapped backend's. */
#include "backend.h"
#include "bwd.h"
#include "fwd.h"
#include "gen.h"
#include "kernel_times.h"
#include "rda_test.h"
#include "rda_test_backend.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* clang-format off: cmocka.h needs the headers above first */
#include <cmocka.h>
/* clang-format on */

static rt_backends g_rt;

static int group_setup(void **state) {
  (void)state;
  return rt_backends_open(&g_rt, "test_kernel_times");
}

static int group_teardown(void **state) {
  (void)state;
  rt_backends_close(&g_rt);
  return 0;
}

/* A small problem's device buffers: inputs, poisoned outputs, the backward's workspace. */
enum { B = 1, N = 80, H = 2, HKV = 2, D = 32 };
enum { NQ = B * N * H * D, NK = B * N * HKV * D, NL = B * H * N };

typedef struct problem {
  void *q, *k, *v, *dout, *ws;
  float *o, *lse, *dq, *dk, *dv;
  rda_fwd_args a;
  rda_bwd_args ga;
} problem;

/* Host copies of a run's outputs. */
typedef struct outputs {
  float *f[5]; /* o, lse, dq, dk, dv */
} outputs;

static const size_t kOutCount[5] = {NQ, NL, NQ, NK, NK};

static void *upload_normal_bits(rda_backend *b, size_t n) {
  double *x = rt_normal(n, RDA_DTYPE_BF16);
  long long s[3];
  rt_strides_contig(n / (size_t)D, 1, D, s);
  uint16_t *bits = rt_make_bits(x, 1, (long long)(n / (size_t)D), 1, D, s, RDA_DTYPE_BF16, NULL);
  void *d = rt_dev_alloc(b, n * 2);
  rt_dev_upload(b, d, bits, n * 2);
  free(bits);
  free(x);
  return d;
}

static void problem_open(problem *p, rda_backend *b, const rda_config *cfg,
                         const rda_plan_k *plan) {
  p->q = upload_normal_bits(b, NQ);
  p->k = upload_normal_bits(b, NK);
  p->v = upload_normal_bits(b, NK);
  p->dout = upload_normal_bits(b, NQ);
  p->o = rt_dev_poisoned(b, NQ);
  p->lse = rt_dev_poisoned(b, NL);
  p->dq = rt_dev_poisoned(b, NQ);
  p->dk = rt_dev_poisoned(b, NK);
  p->dv = rt_dev_poisoned(b, NK);
  p->ws = rt_dev_alloc(b, rda_bwd_workspace_bytes(plan, B, N));
  rda_fwd_args_contiguous(&p->a, cfg, B, N, p->q, p->k, p->v, p->o, p->lse);
  rda_bwd_args_like_fwd(&p->ga, &p->a, p->dout, NULL, p->dq, p->dk, p->dv, p->ws);
}

static void problem_close(problem *p, rda_backend *b) {
  void *const all[] = {p->q, p->k, p->v, p->dout, p->ws, p->o, p->lse, p->dq, p->dk, p->dv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) b->free(b, all[i]);
}

/* Poison the outputs, run forward and backward on b with kern, and download the outputs. */
static void run_passes(rda_backend *b, const rda_plan_k *plan, const rda_fwd_kernels *kern,
                       problem *p, outputs *out, const char *what) {
  float *dev[5] = {p->o, p->lse, p->dq, p->dk, p->dv};
  rda_err err = {0};
  for (int i = 0; i < 5; ++i) {
    float *nan = malloc(kOutCount[i] * sizeof *nan);
    assert_non_null(nan);
    rt_poison_f32(nan, kOutCount[i]);
    rt_dev_upload(b, dev[i], nan, kOutCount[i] * sizeof *nan);
    free(nan);
  }
  if (rda_fwd_run(b, plan, kern, &p->a, &err) != RDA_OK ||
      rda_bwd_run(b, plan, kern, &p->ga, &err) != RDA_OK || b->synchronize(b, &err) != RDA_OK)
    fail_msg("%s: %s", what, err.msg);
  for (int i = 0; i < 5; ++i) out->f[i] = rt_download_f32(b, dev[i], kOutCount[i]);
}

static void outputs_free(outputs *o) {
  for (int i = 0; i < 5; ++i) free(o->f[i]);
}

/* The collected totals, checked for what holds of any collection: ms >= 0, sorted by ms
 * descending, launches > 0, distinct names, and a total that is their sum. */
static rda_kernel_time *collect_checked(rda_backend *kb, int *n, const char *what) {
  rda_kernel_time *t = NULL;
  double total = -1;
  rda_err err = {0};
  if (rda_kernel_times_collect(kb, &t, n, &total, &err) != RDA_OK)
    fail_msg("%s: collect: %s", what, err.msg);
  double sum = 0;
  for (int i = 0; i < *n; ++i) {
    if (!(t[i].ms >= 0) || t[i].launches <= 0)
      fail_msg("%s: %s: %lld launches, %f ms", what, t[i].name, t[i].launches, t[i].ms);
    if (i > 0 && t[i].ms > t[i - 1].ms) fail_msg("%s: not sorted by time at %d", what, i);
    for (int j = 0; j < i; ++j)
      if (strcmp(t[i].name, t[j].name) == 0) fail_msg("%s: %s listed twice", what, t[i].name);
    sum += t[i].ms;
  }
  if (fabs(sum - total) > 1e-9 * (1 + sum)) fail_msg("%s: total %f, sum %f", what, total, sum);
  return t;
}

static const rda_kernel_time *find(const rda_kernel_time *t, int n, const char *name) {
  for (int i = 0; i < n; ++i)
    if (strcmp(t[i].name, name) == 0) return &t[i];
  return NULL;
}

/* Exactly one variant, `v`, with `launches` launches. */
static void expect_only(const rda_kernel_time *t, int n, const rda_variant *v, long long launches,
                        const char *what) {
  if (n != 1 || strcmp(t[0].name, v->name) != 0 || strcmp(t[0].kind, v->kind) != 0 ||
      t[0].launches != launches)
    fail_msg("%s: want only %s (%s) x %lld; got %d kernels, the first %s (%s) x %lld", what,
             v->name, v->kind, launches, n, n > 0 ? t[0].name : "-", n > 0 ? t[0].kind : "-",
             n > 0 ? t[0].launches : 0);
}

/* Launches per variant index that rda_fwd_run + rda_bwd_run make (init aside: it depends on
 * coverage, so the caller allows 0 or 1): one forward launch per step, one backward prep, and
 * per step one dK/dV (kv_heads == heads: one group member) and one dQ launch. */
static void expected_pass_launches(const rda_plan_k *plan, long long *want) {
  for (int i = 0; i < plan->nvariants; ++i) want[i] = 0;
  for (int i = 0; i < plan->nsteps; ++i) {
    want[plan->steps[i].kernel]++;
    want[plan->bwd_steps[i].dkdv_kernel]++;
    want[plan->bwd_steps[i].dq_kernel]++;
  }
  want[plan->bwd_prep_kernel]++;
}

static void check_on(const rt_backend *be) {
  rda_backend *b = be->b;
  char what[64];
  snprintf(what, sizeof what, "%s", b->name);
  rda_config cfg;
  const long long w[2] = {16, 32}, r[2] = {1, 2};
  rt_config_make(&cfg, H, HKV, D, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, 2, w, r);
  rda_plan_k plan;
  rda_err err = {0};
  if (rda_gen_plan_ex(g_rt.gen, &cfg, &be->hw, RDA_PLAN_BACKWARD, &plan, &err) != RDA_OK)
    fail_msg("%s: plan: %s", what, err.msg);
  problem p;
  problem_open(&p, b, &cfg, &plan);

  /* The reference: the same passes on the backend itself. */
  rda_fwd_kernels plain = {0};
  if (rda_fwd_load(b, &plan, &plain, &err) != RDA_OK) fail_msg("%s: load: %s", what, err.msg);
  outputs want_out, got_out;
  run_passes(b, &plan, &plain, &p, &want_out, what);

  rda_backend *kb = NULL;
  if (rda_kernel_times_wrap(b, &kb, &err) != RDA_OK) fail_msg("%s: wrap: %s", what, err.msg);
  assert_string_equal(kb->name, b->name);
  assert_int_equal(kb->arch, b->arch);
  rda_fwd_kernels kern = {0};
  if (rda_fwd_load(kb, &plan, &kern, &err) != RDA_OK)
    fail_msg("%s: load through the wrapper: %s", what, err.msg);
  int n = -1;
  rda_kernel_time *t = collect_checked(kb, &n, what);
  assert_int_equal(n, 0); /* loads launch nothing */
  assert_null(t);

  /* 100 init launches grow the event pool past its first 64 slots; after a reset the same
   * slots are reused and the count starts over. */
  for (int round = 0; round < 2; ++round) {
    const int times = round == 0 ? 100 : 37;
    rda_kernel_times_reset(kb);
    for (int i = 0; i < times; ++i)
      if (rda_fwd_init(kb, &plan, &kern, &p.a, &err) != RDA_OK)
        fail_msg("%s: init %d: %s", what, i, err.msg);
    if (kb->synchronize(kb, &err) != RDA_OK) fail_msg("%s: sync: %s", what, err.msg);
    t = collect_checked(kb, &n, what);
    expect_only(t, n, &plan.variants[plan.init_kernel], times, "init launches");
    free(t);
  }
  rda_kernel_times_reset(kb);
  for (int i = 0; i < 2; ++i)
    if (rda_bwd_prep(kb, &plan, &kern, &p.ga, &err) != RDA_OK)
      fail_msg("%s: prep: %s", what, err.msg);
  if (kb->synchronize(kb, &err) != RDA_OK) fail_msg("%s: sync: %s", what, err.msg);
  t = collect_checked(kb, &n, what);
  expect_only(t, n, &plan.variants[plan.bwd_prep_kernel], 2, "bwd_prep launches");
  free(t);

  /* Whole passes: the same results as unwrapped, every launch of the model counted. */
  rda_kernel_times_reset(kb);
  run_passes(kb, &plan, &kern, &p, &got_out, what);
  for (int i = 0; i < 5; ++i)
    if (memcmp(want_out.f[i], got_out.f[i], kOutCount[i] * sizeof(float)) != 0)
      fail_msg("%s: output %d differs through the wrapper", what, i);
  t = collect_checked(kb, &n, what);
  long long *want = calloc((size_t)plan.nvariants, sizeof *want);
  assert_non_null(want);
  expected_pass_launches(&plan, want);
  int listed = 0;
  for (int i = 0; i < plan.nvariants; ++i) {
    const rda_variant *v = &plan.variants[i];
    const rda_kernel_time *k = find(t, n, v->name);
    const long long got = k != NULL ? k->launches : 0;
    if (k != NULL && strcmp(k->kind, v->kind) != 0)
      fail_msg("%s: %s listed as kind %s, not %s", what, v->name, k->kind, v->kind);
    const int ok = i == plan.init_kernel ? got <= 1 : got == want[i];
    if (!ok)
      fail_msg("%s: %s (%s): %lld launches, want %lld", what, v->name, v->kind, got, want[i]);
    listed += k != NULL;
  }
  assert_int_equal(listed, n); /* nothing listed that is not a variant of the plan */
  int kinds = 0;
  for (int i = 0; i < n; ++i)
    kinds |= (strcmp(t[i].kind, "bwd_prep") == 0) | (strcmp(t[i].kind, "bwd_dkdv") == 0) << 1 |
             (strcmp(t[i].kind, "bwd_dq") == 0) << 2 | (strcmp(t[i].kind, "fwd") == 0) << 3;
  assert_int_equal(kinds, 15);
  free(want);
  free(t);

  outputs_free(&want_out);
  outputs_free(&got_out);
  rda_fwd_unload(kb, &kern);
  kb->destroy(kb);
  rda_fwd_unload(b, &plain);
  problem_close(&p, b);
  rda_plan_k_free(&plan);
}

static void test_kernel_times_counts_launches_and_keeps_results(void **state) {
  (void)state;
  for (int i = 0; i < g_rt.n; ++i) check_on(&g_rt.be[i]);
}

static void test_kernel_times_rejects_bad_arguments(void **state) {
  (void)state;
  rda_err err = {0};
  rda_backend *kb = (rda_backend *)&err; /* must be reset to NULL */
  assert_int_equal(rda_kernel_times_wrap(NULL, &kb, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_null(kb);
  assert_non_null(strstr(err.msg, "NULL backend"));
  rda_err_clear(&err);
  rda_kernel_time *t = NULL;
  int n = 5;
  double total = 1;
  rda_backend *b = g_rt.be[0].b;
  assert_int_equal(rda_kernel_times_collect(b, &t, &n, &total, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "not a backend of rda_kernel_times_wrap"));
  assert_null(t);
  assert_int_equal(n, 0);
  rda_kernel_times_reset(b); /* a no-op on a plain backend */
  /* A wrapper destroyed without any launch frees cleanly (ASan checks), and leaves inner
   * usable. */
  rda_err_clear(&err);
  assert_int_equal(rda_kernel_times_wrap(b, &kb, &err), RDA_OK);
  kb->destroy(kb);
  void *d = NULL;
  assert_int_equal(b->alloc(b, 64, &d, &err), RDA_OK);
  b->free(b, d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kernel_times_counts_launches_and_keeps_results),
      cmocka_unit_test(test_kernel_times_rejects_bad_arguments),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
