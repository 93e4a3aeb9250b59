/* test_reference.c — the float64 reference against independent facts: dense softmax attention
 * (plain, causal, on gathered dilated rows, over the multiset union of branches), the offset
 * rules, uncovered rows, GQA; its gradient against finite differences and the textbook dense
 * gradient; the SPEC §5 checks; bf16/fp16 rounding (ties to even, subnormals, overflow). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "rda_test.h"
#include "check.h"
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- an independent dense attention: one query row against an explicit list of keys ----------- */

static void dense_row(int d, double scale, const double *qrow, int nkeys,
                      const double *const *krows, const double *const *vrows, double *o,
                      double *lse) {
  if (nkeys == 0) {
    for (int x = 0; x < d; x++) o[x] = 0.0;
    *lse = -INFINITY;
    return;
  }
  double *s = malloc((size_t)nkeys * sizeof *s);
  assert_non_null(s);
  double mx = -INFINITY;
  for (int i = 0; i < nkeys; i++) {
    double dot = 0.0;
    for (int x = 0; x < d; x++) dot += qrow[x] * krows[i][x];
    s[i] = scale * dot;
    mx = fmax(mx, s[i]);
  }
  double z = 0.0;
  for (int i = 0; i < nkeys; i++) z += exp(s[i] - mx);
  for (int x = 0; x < d; x++) o[x] = 0.0;
  for (int i = 0; i < nkeys; i++)
    for (int x = 0; x < d; x++) o[x] += exp(s[i] - mx) / z * vrows[i][x];
  *lse = mx + log(z);
  free(s);
}

typedef struct problem {
  rda_config c;
  long long b, n;
  double *q, *k, *v; /* random inputs */
  double *o, *lse;   /* reference outputs */
} problem;

static void problem_make(problem *p, const rda_config *c, long long b, long long n) {
  p->c = *c;
  p->b = b;
  p->n = n;
  p->q = rt_normal((size_t)(b * n * c->heads * c->head_dim), RT_DTYPE_F64);
  p->k = rt_normal((size_t)(b * n * c->kv_heads * c->head_dim), RT_DTYPE_F64);
  p->v = rt_normal((size_t)(b * n * c->kv_heads * c->head_dim), RT_DTYPE_F64);
  rt_reference(c, b, n, p->q, p->k, p->v, &p->o, &p->lse);
}

static void problem_free(problem *p) {
  free(p->q), free(p->k), free(p->v), free(p->o), free(p->lse);
}

static const double *qrow(const problem *p, long long b, long long t, long long h) {
  return p->q + ((b * p->n + t) * p->c.heads + h) * p->c.head_dim;
}
static const double *krow(const problem *p, long long b, long long t, long long hk) {
  return p->k + ((b * p->n + t) * p->c.kv_heads + hk) * p->c.head_dim;
}
static const double *vrow(const problem *p, long long b, long long t, long long hk) {
  return p->v + ((b * p->n + t) * p->c.kv_heads + hk) * p->c.head_dim;
}

/* The reference's row (b, t, h) equals a dense (o, lse): LSE to 1e-12 relative, every O element
 * to 1e-12. */
static void assert_row_equals(const problem *p, long long b, long long t, long long h,
                              const double *o, double lse) {
  const long long H = p->c.heads, D = p->c.head_dim;
  assert_true(fabs(p->lse[(b * H + h) * p->n + t] - lse) < 1e-12 * (1 + fabs(lse)));
  for (long long x = 0; x < D; x++)
    assert_true(fabs(p->o[((b * p->n + t) * H + h) * D + x] - o[x]) < 1e-12);
}

/* A predicate over (branch, head, query p, key q): does the branch pair p with q? Written from
 * SPEC §1 by membership (same segment, both on the grid by modular arithmetic), not by stepping
 * through the grid as the reference does. */
static int pairs(const rda_config *c, long long n, int br, long long h, long long p, long long q) {
  const long long w = c->segments[br] < n ? c->segments[br] : n;
  const long long r = c->dilations[br];
  const long long j = rda_config_offset(c, br, (int)h);
  if (j < 0) return 0;
  if (p / w != q / w) return 0;
  const long long a = p / w * w;
  if (p - a < j || q - a < j) return 0;
  if ((p - a - j) % r != 0 || (q - a - j) % r != 0) return 0;
  if (c->causal && q > p) return 0;
  return 1;
}

/* Compare the reference outputs with one softmax per row over the multiset union of all
 * branches' keys (a key paired by two branches counts twice). */
static void check_against_union(const problem *p, double tol) {
  const rda_config *c = &p->c;
  const int H = c->heads, D = c->head_dim, group = c->heads / c->kv_heads;
  const long long n = p->n;
  const double **ks = malloc((size_t)(n * c->nbranch) * sizeof *ks);
  const double **vs = malloc((size_t)(n * c->nbranch) * sizeof *vs);
  double *o = malloc((size_t)D * sizeof *o);
  assert_non_null(ks), assert_non_null(vs), assert_non_null(o);
  for (long long b = 0; b < p->b; b++)
    for (int h = 0; h < H; h++)
      for (long long t = 0; t < n; t++) {
        int nk = 0;
        for (int br = 0; br < c->nbranch; br++)
          for (long long u = 0; u < n; u++)
            if (pairs(c, n, br, h, t, u)) {
              ks[nk] = krow(p, b, u, h / group);
              vs[nk] = vrow(p, b, u, h / group);
              nk++;
            }
        double lse;
        dense_row(D, c->scale, qrow(p, b, t, h), nk, ks, vs, o, &lse);
        const double got_lse = p->lse[(b * H + h) * n + t];
        const double *got_o = p->o + ((b * n + t) * H + h) * D;
        if (nk == 0) {
          assert_true(isinf(got_lse) && got_lse < 0);
          for (int x = 0; x < D; x++) assert_true(got_o[x] == 0.0);
          continue;
        }
        if (fabs(got_lse - lse) > tol * (1.0 + fabs(lse))) {
          fprintf(stderr, "lse b=%lld h=%d n=%lld: %.17g vs %.17g\n", b, h, t, got_lse, lse);
          fail();
        }
        for (int x = 0; x < D; x++)
          if (fabs(got_o[x] - o[x]) > tol * (1.0 + fabs(o[x]))) {
            fprintf(stderr, "o b=%lld n=%lld h=%d d=%d: %.17g vs %.17g\n", b, t, h, x, got_o[x],
                    o[x]);
            fail();
          }
      }
  free(ks), free(vs), free(o);
}

/* --- dense equivalences ----------------------------------------------------------------------- */

/* One branch covering everything equals plain softmax attention over all keys. */
static void test_reference_full_window_equals_dense(void **state) {
  (void)state;
  const long long w[] = {1000}, r[] = {1};
  rda_config c;
  rt_config_make(&c, 2, 2, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, w, r);
  problem p;
  problem_make(&p, &c, 2, 37);
  const int D = c.head_dim;
  const double *ks[37], *vs[37];
  double o[32], lse;
  for (long long b = 0; b < p.b; b++)
    for (int h = 0; h < c.heads; h++)
      for (long long t = 0; t < p.n; t++) {
        for (long long u = 0; u < p.n; u++) ks[u] = krow(&p, b, u, h), vs[u] = vrow(&p, b, u, h);
        dense_row(D, c.scale, qrow(&p, b, t, h), (int)p.n, ks, vs, o, &lse);
        assert_row_equals(&p, b, t, h, o, lse);
      }
  problem_free(&p);
}

/* Causal with one full-window branch equals dense attention masked to keys q <= p. */
static void test_reference_causal_full_window_equals_masked_dense(void **state) {
  (void)state;
  const long long w[] = {64}, r[] = {1};
  rda_config c;
  rt_config_make(&c, 3, 3, 32, RDA_DTYPE_FP16, 1, RDA_OFFSETS_MOD, 1, w, r);
  problem p;
  problem_make(&p, &c, 1, 41);
  const int D = c.head_dim;
  const double *ks[41], *vs[41];
  double o[32], lse;
  for (int h = 0; h < c.heads; h++)
    for (long long t = 0; t < p.n; t++) {
      for (long long u = 0; u <= t; u++) ks[u] = krow(&p, 0, u, h), vs[u] = vrow(&p, 0, u, h);
      dense_row(D, c.scale, qrow(&p, 0, t, h), (int)t + 1, ks, vs, o, &lse);
      assert_row_equals(&p, 0, t, h, o, lse);
    }
  /* The first row attends to itself only: o = v[0]. */
  for (int h = 0; h < c.heads; h++)
    for (int x = 0; x < D; x++) assert_true(fabs(p.o[h * D + x] - vrow(&p, 0, 0, h)[x]) < 1e-12);
  problem_free(&p);
}

/* A dilated branch equals dense attention on the sub-sequence gathered from each segment
 * (positions a + j, a + j + r, ...), and leaves every other row uncovered. */
static void test_reference_dilated_equals_dense_on_gathered_rows(void **state) {
  (void)state;
  for (int causal = 0; causal <= 1; causal++) {
    const long long w[] = {16}, r[] = {3};
    rda_config c;
    rt_config_make(&c, 4, 4, 32, RDA_DTYPE_BF16, causal, RDA_OFFSETS_MOD, 1, w, r);
    problem p;
    problem_make(&p, &c, 1, 43); /* segments [0,16) [16,32) [32,43) */
    const int D = c.head_dim;
    for (int h = 0; h < c.heads; h++) {
      const long long j = h % 3;
      for (long long a = 0; a < p.n; a += 16) {
        const long long e = a + 16 < p.n ? a + 16 : p.n;
        long long rows[16];
        int g = 0;
        for (long long t = a + j; t < e; t += 3) rows[g++] = t; /* gather */
        const double *ks[16], *vs[16];
        for (int i = 0; i < g; i++)
          ks[i] = krow(&p, 0, rows[i], h), vs[i] = vrow(&p, 0, rows[i], h);
        for (int i = 0; i < g; i++) {
          double o[32], lse;
          dense_row(D, c.scale, qrow(&p, 0, rows[i], h), causal ? i + 1 : g, ks, vs, o, &lse);
          assert_row_equals(&p, 0, rows[i], h, o, lse);
        }
        for (long long t = a; t < e; t++) {
          if (t >= a + j && (t - a - j) % 3 == 0) continue;
          assert_true(isinf(p.lse[h * p.n + t]) && p.lse[h * p.n + t] < 0);
          for (int x = 0; x < D; x++) assert_true(p.o[(t * c.heads + h) * D + x] == 0.0);
        }
      }
    }
    problem_free(&p);
  }
}

/* Several branches combine into one softmax over the multiset union of their keys. */
static void test_reference_branches_equal_softmax_over_multiset_union(void **state) {
  (void)state;
  const long long w[] = {8, 16, 200}, r[] = {1, 2, 4}; /* 200 > N: clamped */
  for (int causal = 0; causal <= 1; causal++)
    for (int off = RDA_OFFSETS_MOD; off <= RDA_OFFSETS_GROUP; off++) {
      rda_config c;
      rt_config_make(&c, 5, 5, 32, RDA_DTYPE_BF16, causal, off, 3, w, r);
      problem p;
      problem_make(&p, &c, 2, 45);
      check_against_union(&p, 1e-11);
      problem_free(&p);
    }
}

/* A key that two branches select counts twice in the combined softmax (multiset union). */
static void test_reference_duplicate_key_counts_twice(void **state) {
  (void)state;
  /* Branch 0 (w=4, r=1) and branch 1 (w=8, r=1): row 5 gets keys {4..7} twice and {0..3} once. */
  const long long w[] = {4, 8}, r[] = {1, 1};
  rda_config c;
  rt_config_make(&c, 1, 1, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 2, w, r);
  problem p;
  problem_make(&p, &c, 1, 8);
  const double *ks[12], *vs[12];
  int nk = 0;
  for (int u = 0; u < 8; u++) ks[nk] = krow(&p, 0, u, 0), vs[nk++] = vrow(&p, 0, u, 0);
  for (int u = 4; u < 8; u++) ks[nk] = krow(&p, 0, u, 0), vs[nk++] = vrow(&p, 0, u, 0);
  double o[32], lse;
  dense_row(32, c.scale, qrow(&p, 0, 5, 0), nk, ks, vs, o, &lse);
  assert_row_equals(&p, 0, 5, 0, o, lse);
  /* And not the set union (each key once). */
  double o1[32], lse1;
  dense_row(32, c.scale, qrow(&p, 0, 5, 0), 8, ks, vs, o1, &lse1);
  assert_true(fabs(p.lse[5] - lse1) > 1e-6);
  problem_free(&p);
}

/* --- offsets, uncovered rows, GQA ------------------------------------------------------------- */

static void expect_offsets(const rda_config *c, int branch, const long long *want) {
  for (int h = 0; h < c->heads; h++) {
    if (rda_config_offset(c, branch, h) != want[h])
      fprintf(stderr, "%s branch %d head %d: offset %lld, expected %lld\n",
              rda_offsets_name(c->offsets), branch, h, (long long)rda_config_offset(c, branch, h),
              want[h]);
    assert_int_equal(rda_config_offset(c, branch, h), want[h]);
  }
}

static void test_reference_offset_rules_match_hand_tables(void **state) {
  (void)state;
  rda_config c;
  const long long w[] = {8, 8, 8}, r[] = {1, 3, 2};
  /* mod: h mod r */
  rt_config_make(&c, 7, 7, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 3, w, r);
  expect_offsets(&c, 0, (const long long[]){0, 0, 0, 0, 0, 0, 0});
  expect_offsets(&c, 1, (const long long[]){0, 1, 2, 0, 1, 2, 0});
  expect_offsets(&c, 2, (const long long[]){0, 1, 0, 1, 0, 1, 0});
  /* block: floor(h / ceil(H / r)); H = 7: r = 3 -> per 3; r = 2 -> per 4 */
  c.offsets = RDA_OFFSETS_BLOCK;
  expect_offsets(&c, 0, (const long long[]){0, 0, 0, 0, 0, 0, 0});
  expect_offsets(&c, 1, (const long long[]){0, 0, 0, 1, 1, 1, 2});
  expect_offsets(&c, 2, (const long long[]){0, 0, 0, 0, 1, 1, 1});
  /* group: k = 3 groups of 3, 2, 2 heads; group i uses branch i only, offset i mod r_i */
  c.offsets = RDA_OFFSETS_GROUP;
  expect_offsets(&c, 0, (const long long[]){0, 0, 0, -1, -1, -1, -1});
  expect_offsets(&c, 1, (const long long[]){-1, -1, -1, 1, 1, -1, -1});
  expect_offsets(&c, 2, (const long long[]){-1, -1, -1, -1, -1, 0, 0});
  /* H = 8, k = 3: groups 3, 3, 2 */
  c.heads = c.kv_heads = 8;
  expect_offsets(&c, 1, (const long long[]){-1, -1, -1, 1, 1, 1, -1, -1});
  expect_offsets(&c, 2, (const long long[]){-1, -1, -1, -1, -1, -1, 0, 0});
}

/* Rows off every grid (including segments shorter than the offset) are exactly -inf / 0. */
static void test_reference_uncovered_rows_are_exact(void **state) {
  (void)state;
  const long long w[] = {8}, r[] = {4};
  rda_config c;
  rt_config_make(&c, 4, 2, 32, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, 1, w, r);
  problem p;
  problem_make(&p, &c, 1, 10); /* segments [0,8) [8,10): heads 2, 3 have no grid in the last */
  long long covered = 0;
  for (int h = 0; h < 4; h++)
    for (long long t = 0; t < 10; t++) {
      const long long a = t / 8 * 8;
      const int on = (t - a) % 4 == h % 4;
      const double l = p.lse[h * 10 + t];
      if (on) {
        covered++;
        assert_true(isfinite(l));
      } else {
        assert_true(isinf(l) && l < 0);
        for (int x = 0; x < 32; x++) assert_true(p.o[(t * 4 + h) * 32 + x] == 0.0);
      }
    }
  assert_int_equal(covered, 2 + 2 + 2 + 2 + 1 + 1); /* heads 0, 1 get one row of the last */
  problem_free(&p);
}

/* GQA: the result equals MHA on K/V with each kv head repeated for its H/Hkv query heads. */
static void test_reference_gqa_maps_head_to_kv_head(void **state) {
  (void)state;
  const long long w[] = {16, 32}, r[] = {1, 2};
  rda_config gqa, mha;
  rt_config_make(&gqa, 6, 2, 32, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, 2, w, r);
  mha = gqa;
  mha.kv_heads = 6;
  const long long n = 40, D = 32;
  problem p;
  problem_make(&p, &gqa, 1, n);
  double *k6 = malloc((size_t)(n * 6 * D) * sizeof *k6);
  double *v6 = malloc((size_t)(n * 6 * D) * sizeof *v6);
  assert_non_null(k6), assert_non_null(v6);
  for (long long t = 0; t < n; t++)
    for (int h = 0; h < 6; h++)
      for (long long x = 0; x < D; x++) {
        k6[(t * 6 + h) * D + x] = krow(&p, 0, t, h / 3)[x];
        v6[(t * 6 + h) * D + x] = vrow(&p, 0, t, h / 3)[x];
      }
  double *o, *lse;
  rt_reference(&mha, 1, n, p.q, k6, v6, &o, &lse);
  for (long long i = 0; i < n * 6 * D; i++) assert_true(o[i] == p.o[i]);
  for (long long i = 0; i < 6 * n; i++)
    assert_true(lse[i] == p.lse[i] || (isinf(lse[i]) && isinf(p.lse[i])));
  free(o), free(lse), free(k6), free(v6);
  problem_free(&p);
}

/* Custom scale and the batch axis: batch element b depends on its own inputs only. */
static void test_reference_batches_are_independent_and_scale_applies(void **state) {
  (void)state;
  const long long w[] = {12}, r[] = {2};
  rda_config c;
  rt_config_make(&c, 2, 1, 32, RDA_DTYPE_FP16, 0, RDA_OFFSETS_BLOCK, 1, w, r);
  c.scale = 0.37;
  problem p;
  problem_make(&p, &c, 3, 20);
  check_against_union(&p, 1e-11);
  /* Batch 1 alone gives the same rows as batch 1 of the batched run. */
  const long long n = 20, D = 32;
  double *o, *lse;
  rt_reference(&c, 1, n, p.q + n * 2 * D, p.k + n * D, p.v + n * D, &o, &lse);
  for (long long i = 0; i < n * 2 * D; i++) assert_true(o[i] == p.o[n * 2 * D + i]);
  free(o), free(lse);
  problem_free(&p);
}

/* --- the backward pass ------------------------------------------------------------------------ */

/* The scalar loss whose gradient rda_ref_backward computes: L = Σ dO·O + Σ dLSE·LSE, the LSE
 * sum over covered rows only (an uncovered row's LSE is -inf and its dLSE must not matter). */
static double bwd_loss(const rda_config *c, long long b, long long n, const double *q,
                       const double *k, const double *v, const double *dout, const double *dlse) {
  double *o, *lse;
  rt_reference(c, b, n, q, k, v, &o, &lse);
  double l = 0.0;
  for (long long i = 0; i < b * n * c->heads * c->head_dim; i++) l += dout[i] * o[i];
  if (dlse != NULL)
    for (long long i = 0; i < b * c->heads * n; i++)
      if (lse[i] != -INFINITY) l += dlse[i] * lse[i];
  free(o), free(lse);
  return l;
}

/* Central differences of bwd_loss on `samples` random elements of each of Q, K, V against
 * rda_ref_backward; every element within 1e-6 of max(|analytic|, rms of that gradient).
 * Returns how many sampled elements had a nonzero gradient (so a caller can tell the check
 * was not vacuous). */
static int check_bwd_by_finite_differences(const rda_config *c, long long b, long long n,
                                           int with_dlse, int samples) {
  const long long nq = b * n * c->heads * c->head_dim, nk = b * n * c->kv_heads * c->head_dim;
  double *q = rt_normal((size_t)nq, RT_DTYPE_F64);
  double *k = rt_normal((size_t)nk, RT_DTYPE_F64);
  double *v = rt_normal((size_t)nk, RT_DTYPE_F64);
  double *dout = rt_normal((size_t)nq, RT_DTYPE_F64);
  double *dlse = with_dlse ? rt_normal((size_t)(b * c->heads * n), RT_DTYPE_F64) : NULL;
  double *g[3];
  rt_reference_bwd(c, b, n, q, k, v, dout, dlse, &g[0], &g[1], &g[2]);
  double *x[3] = {q, k, v};
  const long long count[3] = {nq, nk, nk};
  const char *names[3] = {"dQ", "dK", "dV"};
  rt_rng *rng = rt_global_rng();
  int nonzero = 0;
  for (int t = 0; t < 3; t++) {
    double rms = 0.0;
    for (long long i = 0; i < count[t]; i++) rms += g[t][i] * g[t][i];
    rms = sqrt(rms / (double)count[t]);
    assert_true(rms > 0.0);
    for (int s = 0; s < samples; s++) {
      const long long i = rt_rng_range(rng, 0, count[t] - 1);
      const double keep = x[t][i], h = 1e-5;
      x[t][i] = keep + h;
      const double lp = bwd_loss(c, b, n, q, k, v, dout, dlse);
      x[t][i] = keep - h;
      const double lm = bwd_loss(c, b, n, q, k, v, dout, dlse);
      x[t][i] = keep;
      const double fd = (lp - lm) / (2 * h), an = g[t][i];
      if (an != 0.0) nonzero++;
      if (!(fabs(fd - an) <= 1e-6 * fmax(fabs(an), rms))) {
        fprintf(stderr,
                "%s[%lld]: analytic %.12g, finite difference %.12g (H=%d Hkv=%d causal=%d "
                "offsets=%s branches=%d, seed %llu)\n",
                names[t], i, an, fd, c->heads, c->kv_heads, c->causal, rda_offsets_name(c->offsets),
                c->nbranch, (unsigned long long)rt_seed_value());
        fail();
      }
    }
  }
  free(q), free(k), free(v), free(dout), free(dlse), free(g[0]), free(g[1]), free(g[2]);
  return nonzero;
}

/* Overlapping branches (keys counted twice, a clamped segment), every offset rule, causal and
 * not, with dLSE. */
static void test_reference_bwd_matches_finite_differences_multibranch(void **state) {
  (void)state;
  const long long w[] = {4, 8, 200}, r[] = {1, 2, 3};
  for (int causal = 0; causal <= 1; causal++)
    for (int off = RDA_OFFSETS_MOD; off <= RDA_OFFSETS_GROUP; off++) {
      rda_config c;
      rt_config_make(&c, 4, 4, 32, RDA_DTYPE_BF16, causal, off, 3, w, r);
      assert_true(check_bwd_by_finite_differences(&c, 1, 21, 1, 12) > 0);
    }
}

/* GQA (dK/dV sum over the query heads of a kv head), two batch elements, with and without
 * dLSE. */
static void test_reference_bwd_matches_finite_differences_gqa(void **state) {
  (void)state;
  const long long w[] = {6, 16}, r[] = {1, 2};
  for (int with_dlse = 0; with_dlse <= 1; with_dlse++) {
    rda_config c;
    rt_config_make(&c, 6, 2, 32, RDA_DTYPE_FP16, 1, RDA_OFFSETS_MOD, 2, w, r);
    assert_true(check_bwd_by_finite_differences(&c, 2, 19, with_dlse, 12) > 0);
    rt_config_make(&c, 4, 1, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_BLOCK, 2, w, r);
    assert_true(check_bwd_by_finite_differences(&c, 1, 23, with_dlse, 12) > 0);
    rt_config_make(&c, 6, 3, 32, RDA_DTYPE_BF16, 1, RDA_OFFSETS_GROUP, 2, w, r);
    assert_true(check_bwd_by_finite_differences(&c, 1, 17, with_dlse, 12) > 0);
  }
}

/* Uncovered rows (a dilation larger than some segments' free room) and a custom scale. */
static void test_reference_bwd_matches_finite_differences_uncovered_and_scale(void **state) {
  (void)state;
  const long long w[] = {8}, r[] = {4};
  rda_config c;
  rt_config_make(&c, 4, 2, 32, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, 1, w, r);
  c.scale = 0.37;
  assert_true(check_bwd_by_finite_differences(&c, 1, 10, 1, 16) > 0);
  c.causal = 0;
  c.scale = 1.9;
  assert_true(check_bwd_by_finite_differences(&c, 2, 11, 1, 16) > 0);
  c.scale = -0.45; /* SPEC §1 puts no sign on τ */
  assert_true(check_bwd_by_finite_differences(&c, 1, 12, 1, 16) > 0);
}

/* A negative scale: the reference still equals one softmax over the multiset union (of
 * τ <q, k>, so the keys least aligned with q weigh most). */
static void test_reference_negative_scale_equals_union_softmax(void **state) {
  (void)state;
  const long long w[] = {8, 30}, r[] = {1, 3};
  rda_config c;
  rt_config_make(&c, 4, 2, 32, RDA_DTYPE_FP16, 1, RDA_OFFSETS_BLOCK, 2, w, r);
  c.scale = -0.3;
  problem p;
  problem_make(&p, &c, 1, 37);
  check_against_union(&p, 1e-11);
  problem_free(&p);
}

/* Segment lengths and dilation rates up to INT64_MAX (validation stops at 2^40, the reference
 * must not overflow anyway): w clamps to N and only a grid's first position fits, exactly as
 * with w = r = N. Under UBSan a signed overflow aborts. */
static void test_reference_huge_segments_and_dilations_do_not_overflow(void **state) {
  (void)state;
  const long long n = 9;
  const long long big_w[] = {INT64_MAX, INT64_MAX - 1}, big_r[] = {INT64_MAX, INT64_MAX / 3};
  const long long small_w[] = {n, n}, small_r[] = {n, n};
  for (int off = RDA_OFFSETS_MOD; off <= RDA_OFFSETS_GROUP; off++) {
    rda_config big, small;
    rt_config_make(&big, 4, 2, 32, RDA_DTYPE_BF16, 1, off, 2, big_w, big_r);
    rt_config_make(&small, 4, 2, 32, RDA_DTYPE_BF16, 1, off, 2, small_w, small_r);
    for (int h = 0; h < 4; h++)
      for (int i = 0; i < 2; i++) assert_true(rda_config_offset(&big, i, h) < n);
    problem p;
    problem_make(&p, &big, 2, n);
    double *o, *lse;
    rt_reference(&small, 2, n, p.q, p.k, p.v, &o, &lse);
    for (long long i = 0; i < 2 * n * 4 * 32; i++) assert_true(p.o[i] == o[i]);
    for (long long i = 0; i < 2 * 4 * n; i++)
      assert_true(p.lse[i] == lse[i] || (isinf(p.lse[i]) && isinf(lse[i])));
    for (long long t = 0; t < n; t++)
      for (int h = 0; h < 4; h++)
        assert_int_equal(rda_config_covers(&big, n, h, t), rda_config_covers(&small, n, h, t));
    double *dout = rt_normal((size_t)(2 * n * 4 * 32), RT_DTYPE_F64);
    double *g[3], *gs[3];
    rt_reference_bwd(&big, 2, n, p.q, p.k, p.v, dout, NULL, &g[0], &g[1], &g[2]);
    rt_reference_bwd(&small, 2, n, p.q, p.k, p.v, dout, NULL, &gs[0], &gs[1], &gs[2]);
    const long long count[3] = {2 * n * 4 * 32, 2 * n * 2 * 32, 2 * n * 2 * 32};
    for (int t = 0; t < 3; t++) {
      for (long long i = 0; i < count[t]; i++) assert_true(g[t][i] == gs[t][i]);
      free(g[t]), free(gs[t]);
    }
    free(dout), free(o), free(lse);
    problem_free(&p);
  }
}

/* Rows no branch covers get exactly zero dQ whatever their dO and dLSE; keys no branch selects
 * get exactly zero dK and dV. */
static void test_reference_bwd_uncovered_rows_are_exactly_zero(void **state) {
  (void)state;
  const long long w[] = {8}, r[] = {4};
  rda_config c;
  rt_config_make(&c, 4, 4, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, w, r);
  const long long n = 10, H = 4, D = 32;
  double *q = rt_normal((size_t)(n * H * D), RT_DTYPE_F64);
  double *k = rt_normal((size_t)(n * H * D), RT_DTYPE_F64);
  double *v = rt_normal((size_t)(n * H * D), RT_DTYPE_F64);
  double *dout = rt_normal((size_t)(n * H * D), RT_DTYPE_F64);
  double *dlse = rt_normal((size_t)(H * n), RT_DTYPE_F64);
  double *dq, *dk, *dv;
  rt_reference_bwd(&c, 1, n, q, k, v, dout, dlse, &dq, &dk, &dv);
  long long zero_rows = 0;
  for (long long t = 0; t < n; t++)
    for (long long h = 0; h < H; h++) {
      const int on = (t % 8) % 4 == h; /* mod rule: offset h, one grid point per segment */
      for (long long x = 0; x < D; x++) {
        const long long i = (t * H + h) * D + x;
        if (on) continue;
        assert_true(dq[i] == 0.0 && dk[i] == 0.0 && dv[i] == 0.0);
      }
      if (!on) zero_rows++;
      if (on) {
        double s = 0.0;
        for (long long x = 0; x < D; x++) s += fabs(dv[(t * H + h) * D + x]);
        assert_true(s > 0.0);
      }
    }
  assert_int_equal(zero_rows, 4 * 10 - 10);
  free(q), free(k), free(v), free(dout), free(dlse), free(dq), free(dk), free(dv);
}

/* Two identical branches select every key twice: the combined softmax (and so O) is that of one
 * branch and LSE is larger by log 2, so the gradient must equal the one-branch gradient exactly:
 * each pair counts twice with P halved by the combined LSE. A reference that used per-branch
 * LSEs would double it; one that merged duplicate keys would halve it. */
static void test_reference_bwd_duplicate_branches_equal_one_branch(void **state) {
  (void)state;
  const long long w[] = {8, 8}, r[] = {2, 2};
  rda_config one, two;
  rt_config_make(&one, 4, 2, 32, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, 1, w, r);
  rt_config_make(&two, 4, 2, 32, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, 2, w, r);
  const long long n = 19, nq = n * 4 * 32, nk = n * 2 * 32;
  double *q = rt_normal((size_t)nq, RT_DTYPE_F64), *k = rt_normal((size_t)nk, RT_DTYPE_F64);
  double *v = rt_normal((size_t)nk, RT_DTYPE_F64), *dout = rt_normal((size_t)nq, RT_DTYPE_F64);
  double *dlse = rt_normal((size_t)(4 * n), RT_DTYPE_F64);
  double *g1[3], *g2[3];
  rt_reference_bwd(&one, 1, n, q, k, v, dout, dlse, &g1[0], &g1[1], &g1[2]);
  rt_reference_bwd(&two, 1, n, q, k, v, dout, dlse, &g2[0], &g2[1], &g2[2]);
  const long long count[3] = {nq, nk, nk};
  for (int t = 0; t < 3; t++) {
    double norm = 0.0;
    for (long long i = 0; i < count[t]; i++) {
      norm += fabs(g1[t][i]);
      if (fabs(g2[t][i] - g1[t][i]) > 1e-12 * (1.0 + fabs(g1[t][i]))) {
        fprintf(stderr, "gradient %d [%lld]: two branches %.17g, one branch %.17g\n", t, i,
                g2[t][i], g1[t][i]);
        fail();
      }
    }
    assert_true(norm > 0.0);
  }
  for (int t = 0; t < 3; t++) free(g1[t]), free(g2[t]);
  free(q), free(k), free(v), free(dout), free(dlse);
}

/* The textbook gradient of dense softmax attention, one head: S = τ Q Kᵀ (masked if causal),
 * P = softmax(S), O = P V, LSE = logsumexp(S); with upstream dO and dLSE: dV = Pᵀ dO,
 * dP = dO Vᵀ, dS = P ∘ (dP − rowsum(dP ∘ P) + dLSE), dQ = τ dS K, dK = τ dSᵀ Q. Rows and
 * tensors here are [n, d] for one head. */
static void dense_textbook_bwd(int n, int d, double tau, int causal, const double *q,
                               const double *k, const double *v, const double *dout,
                               const double *dlse, double *dq, double *dk, double *dv) {
  double *pm = calloc((size_t)(n * n), sizeof *pm), *dpm = calloc((size_t)(n * n), sizeof *dpm);
  double *ds = calloc((size_t)(n * n), sizeof *ds);
  assert_non_null(pm), assert_non_null(dpm), assert_non_null(ds);
  for (int i = 0; i < n; i++) { /* P, row by row */
    double mx = -INFINITY;
    for (int j = 0; j < n; j++) {
      if (causal && j > i) continue;
      double s = 0.0;
      for (int x = 0; x < d; x++) s += q[i * d + x] * k[j * d + x];
      pm[i * n + j] = tau * s;
      mx = fmax(mx, tau * s);
    }
    double z = 0.0;
    for (int j = 0; j < n; j++)
      if (!(causal && j > i)) z += exp(pm[i * n + j] - mx);
    for (int j = 0; j < n; j++) pm[i * n + j] = causal && j > i ? 0.0 : exp(pm[i * n + j] - mx) / z;
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      double s = 0.0;
      for (int x = 0; x < d; x++) s += dout[i * d + x] * v[j * d + x];
      dpm[i * n + j] = s;
    }
  for (int i = 0; i < n; i++) {
    double rs = 0.0;
    for (int j = 0; j < n; j++) rs += dpm[i * n + j] * pm[i * n + j];
    for (int j = 0; j < n; j++) ds[i * n + j] = pm[i * n + j] * (dpm[i * n + j] - rs + dlse[i]);
  }
  for (int i = 0; i < n; i++)
    for (int x = 0; x < d; x++) {
      double a = 0.0, b = 0.0, e = 0.0;
      for (int j = 0; j < n; j++) {
        a += ds[i * n + j] * k[j * d + x];    /* (dS K)[i] */
        b += ds[j * n + i] * q[j * d + x];    /* (dSᵀ Q)[i] */
        e += pm[j * n + i] * dout[j * d + x]; /* (Pᵀ dO)[i] */
      }
      dq[i * d + x] = tau * a;
      dk[i * d + x] = tau * b;
      dv[i * d + x] = e;
    }
  free(pm), free(dpm), free(ds);
}

/* A single branch covering the whole sequence: the reference gradient equals the textbook
 * dense one (per head, causal and not, with dLSE). */
static void test_reference_bwd_single_dense_branch_equals_textbook(void **state) {
  (void)state;
  const long long w[] = {64}, r[] = {1};
  for (int causal = 0; causal <= 1; causal++) {
    rda_config c;
    rt_config_make(&c, 3, 3, 32, RDA_DTYPE_BF16, causal, RDA_OFFSETS_MOD, 1, w, r);
    const int n = 29, H = 3, D = 32;
    double *q = rt_normal((size_t)(n * H * D), RT_DTYPE_F64);
    double *k = rt_normal((size_t)(n * H * D), RT_DTYPE_F64);
    double *v = rt_normal((size_t)(n * H * D), RT_DTYPE_F64);
    double *dout = rt_normal((size_t)(n * H * D), RT_DTYPE_F64);
    double *dlse = rt_normal((size_t)(H * n), RT_DTYPE_F64);
    double *dq, *dk, *dv;
    rt_reference_bwd(&c, 1, n, q, k, v, dout, dlse, &dq, &dk, &dv);
    double *hx[4], *hg[3];
    for (int i = 0; i < 4; i++) hx[i] = malloc((size_t)(n * D) * sizeof *hx[i]);
    for (int i = 0; i < 3; i++) hg[i] = malloc((size_t)(n * D) * sizeof *hg[i]);
    for (int h = 0; h < H; h++) {
      for (int t = 0; t < n; t++)
        for (int x = 0; x < D; x++) {
          const long long i = ((long long)t * H + h) * D + x;
          hx[0][t * D + x] = q[i], hx[1][t * D + x] = k[i], hx[2][t * D + x] = v[i];
          hx[3][t * D + x] = dout[i];
        }
      dense_textbook_bwd(n, D, c.scale, causal, hx[0], hx[1], hx[2], hx[3], dlse + h * n, hg[0],
                         hg[1], hg[2]);
      const double *got[3] = {dq, dk, dv};
      for (int g = 0; g < 3; g++)
        for (int t = 0; t < n; t++)
          for (int x = 0; x < D; x++) {
            const double want = hg[g][t * D + x], have = got[g][((long long)t * H + h) * D + x];
            if (fabs(have - want) > 1e-12 * (1.0 + fabs(want))) {
              fprintf(stderr, "grad %d h=%d n=%d d=%d: %.17g vs textbook %.17g\n", g, h, t, x, have,
                      want);
              fail();
            }
          }
    }
    for (int i = 0; i < 4; i++) free(hx[i]);
    for (int i = 0; i < 3; i++) free(hg[i]);
    free(q), free(k), free(v), free(dout), free(dlse), free(dq), free(dk), free(dv);
  }
}

/* --- gradient magnitudes ---------------------------------------------------------------------- */

/* The magnitudes of rda_ref_backward written from their definition by membership (pairs()):
 * for every branch and every pair (p, q) it selects, with P from the reference's LSE,
 * |τ| P (|<dO(p), V[q]>| + sum_d |dO(p)_d O(p)_d| + |dLSE(p)|) |K[q]| into dQ[p], the same
 * with |Q[p]| into dK[q], and P |dO(p)| into dV[q]. Returns malloc'd mags[3]. */
static void magnitudes_by_definition(const rda_config *c, long long b, long long n, const double *q,
                                     const double *k, const double *v, const double *dout,
                                     const double *dlse, double *mags[3]) {
  const long long H = c->heads, Hkv = c->kv_heads, D = c->head_dim, group = H / Hkv;
  double *o, *lse;
  rt_reference(c, b, n, q, k, v, &o, &lse);
  mags[0] = calloc((size_t)(b * n * H * D), sizeof *mags[0]);
  mags[1] = calloc((size_t)(b * n * Hkv * D), sizeof *mags[1]);
  mags[2] = calloc((size_t)(b * n * Hkv * D), sizeof *mags[2]);
  assert_non_null(mags[0]), assert_non_null(mags[1]), assert_non_null(mags[2]);
  for (long long bb = 0; bb < b; bb++)
    for (long long h = 0; h < H; h++)
      for (long long p = 0; p < n; p++) {
        const long long qo = ((bb * n + p) * H + h) * D, row = (bb * H + h) * n + p;
        double dp_abs = dlse != NULL ? fabs(dlse[row]) : 0.0;
        for (long long x = 0; x < D; x++) dp_abs += fabs(dout[qo + x] * o[qo + x]);
        for (int br = 0; br < c->nbranch; br++)
          for (long long u = 0; u < n; u++) {
            if (!pairs(c, n, br, h, p, u)) continue;
            const long long ko = ((bb * n + u) * Hkv + h / group) * D;
            double qk = 0.0, dov = 0.0;
            for (long long x = 0; x < D; x++) {
              qk += q[qo + x] * k[ko + x];
              dov += dout[qo + x] * v[ko + x];
            }
            const double pw = exp(c->scale * qk - lse[row]);
            const double ds_abs = fabs(c->scale) * pw * (fabs(dov) + dp_abs);
            for (long long x = 0; x < D; x++) {
              mags[0][qo + x] += ds_abs * fabs(k[ko + x]);
              mags[1][ko + x] += ds_abs * fabs(q[qo + x]);
              mags[2][ko + x] += pw * fabs(dout[qo + x]);
            }
          }
      }
  free(o), free(lse);
}

/* On fresh random inputs (GQA, MQA, causal and not, one to three branches, dLSE, a negative
 * scale, uncovered rows): the magnitudes equal their definition (magnitudes_by_definition), bound
 * the gradient elementwise (|ref| <= mag, up to the rounding of a sum of up to n terms), are
 * > 0 on every element of a row that has keys (dQ) or a key that some row selects (dK, dV) and
 * exactly 0 elsewhere. Without magnitudes rda_ref_backward gives the same gradients. */
static void test_reference_bwd_magnitudes_bound_the_gradient(void **state) {
  (void)state;
  typedef struct mcase {
    int heads, kv_heads, causal, offsets, nbranch, with_dlse;
    long long w[3], r[3], batch, n;
    double scale; /* 0: 1/sqrt(D) */
  } mcase;
  const mcase cases[] = {
      {4, 2, 1, RDA_OFFSETS_MOD, 2, 1, {8, 16, 0}, {1, 2, 0}, 2, 37, 0.0},
      {4, 1, 0, RDA_OFFSETS_BLOCK, 3, 0, {4, 12, 64}, {2, 3, 4}, 1, 30, -0.7},
      {3, 1, 1, RDA_OFFSETS_GROUP, 2, 1, {6, 10, 0}, {2, 3, 0}, 2, 25, 0.4},
      {2, 2, 0, RDA_OFFSETS_MOD, 1, 1, {1, 0, 0}, {1, 0, 0}, 1, 9, 0.0}, /* one key per row */
  };
  const long long D = 32;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const mcase *m = &cases[ci];
    rda_config c;
    rt_config_make(&c, m->heads, m->kv_heads, (int)D, RDA_DTYPE_BF16, m->causal, m->offsets,
                   m->nbranch, m->w, m->r);
    if (m->scale != 0.0) c.scale = m->scale;
    const long long B = m->batch, n = m->n, H = m->heads, Hkv = m->kv_heads, group = H / Hkv;
    const long long nq = B * n * H * D, nk = B * n * Hkv * D;
    double *q = rt_normal((size_t)nq, RDA_DTYPE_BF16), *k = rt_normal((size_t)nk, RDA_DTYPE_BF16);
    double *v = rt_normal((size_t)nk, RDA_DTYPE_BF16);
    double *dout = rt_normal((size_t)nq, RDA_DTYPE_BF16);
    double *dlse = m->with_dlse ? rt_normal((size_t)(B * H * n), RDA_DTYPE_BF16) : NULL;
    rt_bwd_ref ref;
    rt_reference_bwd_mag(&c, B, n, q, k, v, dout, dlse, &ref);
    double *plain[3], *def[3];
    rt_reference_bwd(&c, B, n, q, k, v, dout, dlse, &plain[0], &plain[1], &plain[2]);
    magnitudes_by_definition(&c, B, n, q, k, v, dout, dlse, def);
    const double *g[3] = {ref.dq, ref.dk, ref.dv}, *mag[3] = {ref.dq_mag, ref.dk_mag, ref.dv_mag};
    const long long heads[3] = {H, Hkv, Hkv};
    long long positive = 0, zero = 0;
    for (int t = 0; t < 3; t++)
      for (long long bb = 0; bb < B; bb++)
        for (long long u = 0; u < n; u++)
          for (long long h = 0; h < heads[t]; h++) {
            /* dQ: does row u of head h have keys; dK, dV: does some row select key u */
            int used = 0;
            for (int br = 0; br < c.nbranch && !used; br++)
              for (long long hq = t == 0 ? h : h * group; hq < (t == 0 ? h + 1 : (h + 1) * group);
                   hq++)
                for (long long p = 0; p < n && !used; p++)
                  used = t == 0 ? pairs(&c, n, br, hq, u, p) : pairs(&c, n, br, hq, p, u);
            for (long long x = 0; x < D; x++) {
              const long long i = ((bb * n + u) * heads[t] + h) * D + x;
              if (!(fabs(g[t][i]) <= mag[t][i] * (1.0 + 1e-12) && g[t][i] == plain[t][i] &&
                    fabs(mag[t][i] - def[t][i]) <= 1e-12 * def[t][i] &&
                    (used ? mag[t][i] > 0.0 : mag[t][i] == 0.0))) {
                fprintf(stderr,
                        "case %zu, %s[b=%lld n=%lld h=%lld d=%lld]: gradient %.17g (without "
                        "magnitudes %.17g), magnitude %.17g, by definition %.17g, %s keys\n",
                        ci,
                        t == 0   ? "dQ"
                        : t == 1 ? "dK"
                                 : "dV",
                        bb, u, h, x, g[t][i], plain[t][i], mag[t][i], def[t][i],
                        used ? "has" : "no");
                fail();
              }
              positive += used, zero += !used;
            }
          }
    assert_true(positive > 0);
    if (ci == 1 || ci == 2) assert_true(zero > 0); /* dilated grids leave rows uncovered */
    rt_bwd_ref_free(&ref);
    for (int t = 0; t < 3; t++) free(plain[t]), free(def[t]);
    free(q), free(k), free(v), free(dout), free(dlse);
  }
}

/* N = 1 with three branches that all pair the row with itself: dQ and dK are exactly 0 (the
 * reference leaves float64 noise), dV is not. Measured against their magnitude, a result off by
 * fp32-size noise (1e-7 of the magnitude, every element) passes where SPEC §5's plain ratio
 * fails it, and a real error (1e-2 of the magnitude on one row) still fails, in dQ and in dK,
 * through rda_check_grad and rt_check_bwd_ref alike. Both dtypes, causal and not. */
static void test_check_grad_magnitude_judges_a_cancelled_gradient(void **state) {
  (void)state;
  const long long w[] = {4, 8, 16}, r[] = {1, 2, 3};
  const long long H = 4, Hk = 2, D = 32, n = 1;
  const long long count[3] = {n * H * D, n * Hk * D, n * Hk * D};
  const long long sq[3] = {n * H * D, H * D, D}, sk[3] = {n * Hk * D, Hk * D, D};
  for (int variant = 0; variant < 4; variant++) {
    const int dt = variant & 1 ? RDA_DTYPE_FP16 : RDA_DTYPE_BF16, causal = variant >> 1;
    rda_config c;
    rt_config_make(&c, (int)H, (int)Hk, (int)D, dt, causal, RDA_OFFSETS_BLOCK, 3, w, r);
    double *q = rt_normal((size_t)count[0], dt), *k = rt_normal((size_t)count[1], dt);
    double *v = rt_normal((size_t)count[1], dt), *dout = rt_normal((size_t)count[0], dt);
    rt_bwd_ref ref;
    rt_reference_bwd_mag(&c, 1, n, q, k, v, dout, NULL, &ref);
    const double *g[3] = {ref.dq, ref.dk, ref.dv}, *mag[3] = {ref.dq_mag, ref.dk_mag, ref.dv_mag};
    double ref2[3] = {0, 0, 0}, mag2[3] = {0, 0, 0};
    for (int t = 0; t < 3; t++)
      for (long long i = 0; i < count[t]; i++)
        ref2[t] += g[t][i] * g[t][i], mag2[t] += mag[t][i] * mag[t][i];
    /* the premise: dQ and dK cancel to float64 noise, dV does not */
    assert_true(sqrt(ref2[0]) < 1e-12 * sqrt(mag2[0]) && sqrt(ref2[1]) < 1e-12 * sqrt(mag2[1]));
    assert_true(sqrt(ref2[2]) > 0.1 * sqrt(mag2[2]));
    float *got[3];
    for (int t = 0; t < 3; t++) {
      got[t] = malloc((size_t)count[t] * sizeof *got[t]);
      assert_non_null(got[t]);
    }
    const long long *st[3] = {sq, sk, sk};
    for (int kind = 0; kind < 3; kind++) { /* 0: noise; 1: dQ row 2 off; 2: dK row 1 off */
      for (int t = 0; t < 3; t++)
        for (long long i = 0; i < count[t]; i++)
          got[t][i] = (float)(g[t][i] + 1e-7 * mag[t][i] * rt_rng_normal(rt_global_rng()));
      if (kind == 1)
        for (long long x = 0; x < D; x++) got[0][2 * D + x] += (float)(1e-2 * mag[0][2 * D + x]);
      if (kind == 2)
        for (long long x = 0; x < D; x++) got[1][1 * D + x] -= (float)(1e-2 * mag[1][1 * D + x]);
      rda_check_grad_result with, without;
      rda_check_grad(&c, 1, n, got[0], st[0], got[1], st[1], got[2], st[2], ref.dq, ref.dk, ref.dv,
                     ref.dq_mag, ref.dk_mag, ref.dv_mag, &with);
      rda_check_grad(&c, 1, n, got[0], st[0], got[1], st[1], got[2], st[2], ref.dq, ref.dk, ref.dv,
                     NULL, NULL, NULL, &without);
      char what[96];
      snprintf(what, sizeof what, "cancelled gradient, variant %d, kind %d%s", variant, kind,
               kind ? " (expected)" : "");
      rt_grad_report rep;
      const bool ok =
          rt_check_bwd_ref(what, &c, 1, n, got[0], st[0], got[1], st[1], got[2], st[2], &ref, &rep);
      if ((kind == 0) != with.pass)
        fprintf(stderr, "%s: dQ %.3g dK %.3g dV %.3g: %s\n", what, with.dq_rel_l2, with.dk_rel_l2,
                with.dv_rel_l2, with.first_failure);
      assert_int_equal(with.pass, kind == 0);
      assert_int_equal(ok, kind == 0);
      assert_true(rep.dq_rel_l2 == with.dq_rel_l2 && rep.dk_rel_l2 == with.dk_rel_l2);
      assert_false(without.pass); /* the plain ratio cannot judge it: noise is all it sees */
      if (kind == 0) assert_true(with.dq_rel_l2 < 1e-3 && with.dk_rel_l2 < 1e-3);
      if (kind == 1) assert_non_null(strstr(with.first_failure, "dQ"));
      if (kind == 2) assert_non_null(strstr(with.first_failure, "dK"));
      assert_true(with.dv_rel_l2 == without.dv_rel_l2); /* dV does not cancel */
    }
    for (int t = 0; t < 3; t++) free(got[t]);
    rt_bwd_ref_free(&ref);
    free(q), free(k), free(v), free(dout);
  }
}

/* The magnitude floor acts only where ||ref|| < RDA_CHECK_GRAD_MAG_FRACTION ||mag||: above it
 * the relative error is exactly the plain one (bit for bit), below it the error is taken
 * against the floor. On an arbitrary ref with mag scaled so that ||ref|| / (fraction ||mag||)
 * is 4, 1 and 1/4. */
static void test_check_grad_magnitude_floor_acts_only_below_the_fraction(void **state) {
  (void)state;
  const long long n = 5, H = 2, D = 32, count = n * H * D;
  const long long s[3] = {count, H * D, D};
  double *ref = rt_normal((size_t)count, RT_DTYPE_F64);
  double *mag = malloc((size_t)count * sizeof *mag);
  float *got = malloc((size_t)count * sizeof *got);
  assert_non_null(mag), assert_non_null(got);
  double ref2 = 0.0, base2 = 0.0;
  for (long long i = 0; i < count; i++) {
    got[i] = (float)(ref[i] * (1.0 + 1e-3 * rt_rng_normal(rt_global_rng())));
    ref2 += ref[i] * ref[i];
    const double b = fabs(ref[i]) + 1.0;
    base2 += b * b;
  }
  const double ratios[] = {4.0, 1.0, 0.25};
  long long bad = -1;
  const double plain = rda_check_grad_rel_l2(got, s, ref, NULL, 1, n, (int)H, (int)D, &bad);
  assert_int_equal(bad, 0);
  assert_true(plain > 1e-4 && plain < 1e-2);
  for (size_t f = 0; f < sizeof ratios / sizeof ratios[0]; f++) {
    /* ||mag|| = ||ref|| / (ratio * fraction) */
    const double scale = sqrt(ref2 / base2) / (ratios[f] * RDA_CHECK_GRAD_MAG_FRACTION);
    for (long long i = 0; i < count; i++) mag[i] = (fabs(ref[i]) + 1.0) * scale;
    const double rel = rda_check_grad_rel_l2(got, s, ref, mag, 1, n, (int)H, (int)D, &bad);
    if (ratios[f] > 1.0) {
      assert_true(rel == plain);
    } else {
      assert_true(fabs(rel - plain * ratios[f]) <= 1e-12 * plain);
    }
  }
  free(ref), free(mag), free(got);
}

/* rda_check_grad / rt_check_bwd pass the reference rounded to fp32 (strided), and one off by
 * half the tolerance, and fail each kind of wrong gradient: an element off, a NaN, an Inf, all
 * of dQ off by 2.5 tolerances, dK and dV swapped; with the magnitudes too, and then with the
 * same relative errors to the bit (none of these gradients cancels). */
static void test_check_bwd_rejects_each_kind_of_wrong_gradient(void **state) {
  (void)state;
  const long long w[] = {8, 16}, r[] = {1, 2};
  for (int dt = RDA_DTYPE_BF16; dt <= RDA_DTYPE_FP16; dt++) {
    rda_config c;
    rt_config_make(&c, 4, 2, 32, dt, 1, RDA_OFFSETS_MOD, 2, w, r);
    const long long n = 20, H = 4, Hk = 2, D = 32, P = 40; /* head stride 40: padded */
    double *q = rt_normal((size_t)(n * H * D), RT_DTYPE_F64);
    double *k = rt_normal((size_t)(n * Hk * D), RT_DTYPE_F64);
    double *v = rt_normal((size_t)(n * Hk * D), RT_DTYPE_F64);
    double *dout = rt_normal((size_t)(n * H * D), RT_DTYPE_F64);
    rt_bwd_ref full; /* with magnitudes: none of these gradients cancels */
    rt_reference_bwd_mag(&c, 1, n, q, k, v, dout, NULL, &full);
    const double *ref[3] = {full.dq, full.dk, full.dv};
    const long long sq[3] = {n * H * P, H * P, P}, sk[3] = {n * Hk * P, Hk * P, P};
    float *g[3];
    const long long heads[3] = {H, Hk, Hk};
    const long long *st[3] = {sq, sk, sk};
    for (int i = 0; i < 3; i++) g[i] = malloc((size_t)(n * heads[i] * P) * sizeof *g[i]);
    const double tol = rt_tolerance(dt).grad_rel_l2;
    for (int kind = 0; kind <= 6; kind++) {
      for (int i = 0; i < 3; i++) {
        rt_poison_f32(g[i], (size_t)(n * heads[i] * P)); /* the padding stays NaN */
        const double *src = kind == 5 && i > 0 ? ref[3 - i] : ref[i];
        for (long long t = 0; t < n; t++)
          for (long long h = 0; h < heads[i]; h++)
            for (long long x = 0; x < D; x++)
              g[i][t * st[i][1] + h * st[i][2] + x] = (float)src[(t * heads[i] + h) * D + x];
      }
      double norm = 0.0;
      for (long long i = 0; i < n * Hk * D; i++) norm += ref[1][i] * ref[1][i];
      switch (kind) {
        case 1: g[1][3 * sk[1] + 5] += (float)(3.0 * tol * sqrt(norm)); break; /* dK off */
        case 2: g[0][7 * sq[1] + 2 * P + 1] = NAN; break;                      /* NaN in dQ */
        case 3: g[2][11 * sk[1] + 9] = INFINITY; break;                        /* Inf in dV */
        case 4: /* all of dQ off by 2.5 tolerances */
        case 6: /* all of dQ off by half a tolerance: still passes */
          for (long long t = 0; t < n; t++)
            for (long long x = 0; x < H * P; x++)
              g[0][t * sq[1] + x] *= (float)(1.0 + (kind == 4 ? 2.5 : 0.5) * tol);
          break;
        default: break;
      }
      const int good = kind == 0 || kind == 6;
      rda_check_grad_result res;
      rda_check_grad(&c, 1, n, g[0], sq, g[1], sk, g[2], sk, ref[0], ref[1], ref[2], NULL, NULL,
                     NULL, &res);
      char what[80];
      snprintf(what, sizeof what, "deliberately wrong gradient, kind %d (expected)", kind);
      rt_grad_report rep;
      const bool ok =
          rt_check_bwd(what, &c, 1, n, g[0], sq, g[1], sk, g[2], sk, ref[0], ref[1], ref[2], &rep);
      if (good && !ok) fprintf(stderr, "a good gradient failed: %s\n", res.first_failure);
      assert_int_equal(ok, good);
      assert_int_equal(res.pass, good);
      assert_int_equal(res.first_failure[0] == '\0', good);
      assert_int_equal(rep.nonfinite, kind == 2 || kind == 3 ? 1 : 0);
      assert_int_equal(res.nonfinite, rep.nonfinite);
      assert_true(rep.dq_rel_l2 == res.dq_rel_l2 && rep.dk_rel_l2 == res.dk_rel_l2);
      /* With the magnitudes: exactly the same answer (||ref|| >= the fraction of ||mag||). */
      rda_check_grad_result with;
      rda_check_grad(&c, 1, n, g[0], sq, g[1], sk, g[2], sk, ref[0], ref[1], ref[2], full.dq_mag,
                     full.dk_mag, full.dv_mag, &with);
      assert_int_equal(with.pass, res.pass);
      assert_true(with.dq_rel_l2 == res.dq_rel_l2 && with.dk_rel_l2 == res.dk_rel_l2 &&
                  with.dv_rel_l2 == res.dv_rel_l2);
      assert_string_equal(with.first_failure, res.first_failure);
      assert_int_equal(rt_check_bwd_ref(what, &c, 1, n, g[0], sq, g[1], sk, g[2], sk, &full, NULL),
                       good);
    }
    for (int i = 0; i < 3; i++) free(g[i]);
    rt_bwd_ref_free(&full);
    free(q), free(k), free(v), free(dout);
  }
}

/* A gradient that is exactly zero: N = 1 with three branches that all pair the row with itself
 * (P = 1 each, so dS = dO·V - dO·O = 0 and dQ = dK = 0). A kernel gives exact zeros; the float64
 * reference leaves rounding noise (O is V times weights that sum to 1 only to rounding). The
 * check must pass it (a relative error against the noise would be 1), and still catch a real
 * error there. */
static void test_check_grad_passes_an_exactly_zero_gradient(void **state) {
  (void)state;
  const long long w[] = {4, 8, 16}, r[] = {1, 2, 3};
  rda_config c;
  rt_config_make(&c, 4, 2, 32, RDA_DTYPE_BF16, 1, RDA_OFFSETS_BLOCK, 3, w, r);
  const long long H = 4, Hk = 2, D = 32, n = 1;
  double *q = NULL, *k = NULL, *v = NULL, *dout = NULL, *ref[3] = {NULL, NULL, NULL};
  /* The premise: dQ's reference is noise, not exactly zero, and far below the floor. Some draws
   * round to exact zeros (then any check passes): draw again until one does not. */
  double noise = 0.0;
  for (int draw = 0; draw < 64 && noise == 0.0; draw++) {
    free(q), free(k), free(v), free(dout);
    for (int i = 0; i < 3; i++) free(ref[i]);
    q = rt_normal((size_t)(n * H * D), RDA_DTYPE_BF16);
    k = rt_normal((size_t)(n * Hk * D), RDA_DTYPE_BF16);
    v = rt_normal((size_t)(n * Hk * D), RDA_DTYPE_BF16);
    dout = rt_normal((size_t)(n * H * D), RDA_DTYPE_BF16);
    rt_reference_bwd(&c, 1, n, q, k, v, dout, NULL, &ref[0], &ref[1], &ref[2]);
    for (long long i = 0; i < n * H * D; i++) noise = fmax(noise, fabs(ref[0][i]));
  }
  assert_true(noise > 0.0 && noise < 1e-13);
  const long long sq[3] = {n * H * D, H * D, D}, sk[3] = {n * Hk * D, Hk * D, D};
  float *dq = calloc((size_t)(n * H * D), sizeof *dq);
  float *dk = calloc((size_t)(n * Hk * D), sizeof *dk);
  float *dv = malloc((size_t)(n * Hk * D) * sizeof *dv);
  assert_non_null(dq), assert_non_null(dk), assert_non_null(dv);
  for (long long i = 0; i < n * Hk * D; i++) dv[i] = (float)ref[2][i];
  double dv_rms = 0.0;
  for (long long i = 0; i < n * Hk * D; i++) dv_rms += ref[2][i] * ref[2][i];
  assert_true(sqrt(dv_rms / (double)(n * Hk * D)) > 1e-3); /* dV = P dO is not zero */
  rda_check_grad_result res;
  rda_check_grad(&c, 1, n, dq, sq, dk, sk, dv, sk, ref[0], ref[1], ref[2], NULL, NULL, NULL, &res);
  if (!res.pass) fprintf(stderr, "an exact zero gradient failed: %s\n", res.first_failure);
  assert_true(res.pass);
  assert_true(res.dq_rel_l2 < 1e-3 && res.dk_rel_l2 < 1e-3);
  /* A wrong value where the gradient is zero is still an error: 1e-6 on one element is 1e-6
   * absolute against a floor of 1e-9 * sqrt(128). */
  dq[5] = 1e-6f;
  rda_check_grad(&c, 1, n, dq, sq, dk, sk, dv, sk, ref[0], ref[1], ref[2], NULL, NULL, NULL, &res);
  assert_false(res.pass);
  assert_non_null(strstr(res.first_failure, "dQ"));
  free(dq), free(dk), free(dv), free(q), free(k), free(v), free(dout);
  for (int i = 0; i < 3; i++) free(ref[i]);
}

/* The floor is no blanket pass for small gradients: one of RMS 1e-6 (a thousand times the
 * floor) is judged by its relative error, so 0 or 3 tolerances off fails and half a tolerance
 * passes. */
static void test_check_grad_catches_errors_in_a_small_gradient(void **state) {
  (void)state;
  const long long n = 6, H = 2, D = 32, count = n * H * D;
  const long long s[3] = {count, H * D, D};
  double *ref = rt_normal((size_t)count, RT_DTYPE_F64);
  for (long long i = 0; i < count; i++) ref[i] *= 1e-6;
  float *got = malloc((size_t)count * sizeof *got);
  assert_non_null(got);
  const double tol = rda_tolerance_for(RDA_DTYPE_FP16).grad_rel_l2;
  const double factors[] = {0.0, 1.0 + 3.0 * tol, 1.0 - 3.0 * tol, 1.0 + 0.5 * tol, 1.0};
  for (size_t f = 0; f < sizeof factors / sizeof factors[0]; f++) {
    for (long long i = 0; i < count; i++) got[i] = (float)(ref[i] * factors[f]);
    long long bad = -1;
    const double rel = rda_check_grad_rel_l2(got, s, ref, NULL, 1, n, (int)H, (int)D, &bad);
    assert_int_equal(bad, 0);
    const double want = fabs(1.0 - factors[f]);
    if (fabs(rel - want) > 1e-3 * tol + 1e-7) {
      fprintf(stderr, "factor %.6g: relative error %.6g, want %.6g\n", factors[f], rel, want);
      fail();
    }
    assert_int_equal(rel <= tol, f >= 3);
  }
  free(ref), free(got);
}

/* --- rounding --------------------------------------------------------------------------------- */

static void test_rounding_bf16_ties_to_even(void **state) {
  (void)state;
  const int t = RDA_DTYPE_BF16;
  assert_true(rda_round_to_dtype(1.0 + 0x1p-8, t) == 1.0);              /* tie, 1.0 is even */
  assert_true(rda_round_to_dtype(1.0 + 3 * 0x1p-8, t) == 1.0 + 0x1p-6); /* tie, up to even */
  assert_true(rda_round_to_dtype(1.0 + 0x1p-8 + 0x1p-30, t) == 1.0 + 0x1p-7);
  assert_true(rda_round_to_dtype(-(1.0 + 0x1p-8), t) == -1.0);
  assert_int_equal(rda_to_dtype_bits(1.0, t), 0x3f80);
  assert_int_equal(rda_to_dtype_bits(-2.0, t), 0xc000);
  assert_int_equal(rda_to_dtype_bits(1.0 + 3 * 0x1p-8, t), 0x3f82);
  assert_int_equal(rda_to_dtype_bits(3.140625, t), 0x4049);
  /* subnormals: 2^-133 is the smallest; half of it ties to 0 */
  assert_int_equal(rda_to_dtype_bits(0x1p-133, t), 0x0001);
  assert_int_equal(rda_to_dtype_bits(0x1p-134, t), 0x0000);
  assert_int_equal(rda_to_dtype_bits(3 * 0x1p-134, t), 0x0002);
  assert_int_equal(rda_to_dtype_bits(0x1p-126, t), 0x0080);
  /* overflow: the largest finite is 0x1.fep127; the tie above it goes to inf */
  assert_int_equal(rda_to_dtype_bits(0x1.fep127, t), 0x7f7f);
  assert_int_equal(rda_to_dtype_bits(0x1.ffp127, t), 0x7f80);
  assert_int_equal(rda_to_dtype_bits(-0x1.ffp127, t), 0xff80);
  assert_int_equal(rda_to_dtype_bits(0x1.feffffp127, t), 0x7f7f);
  assert_int_equal(rda_to_dtype_bits(1e300, t), 0x7f80);
  assert_int_equal(rda_to_dtype_bits(INFINITY, t), 0x7f80);
  assert_int_equal(rda_to_dtype_bits(-0.0, t), 0x8000);
  assert_true(isnan(rda_from_dtype_bits(rda_to_dtype_bits(NAN, t), t)));
  assert_true(isnan(rda_round_to_dtype(NAN, t)));
}

static void test_rounding_fp16_ties_subnormals_overflow(void **state) {
  (void)state;
  const int t = RDA_DTYPE_FP16;
  assert_true(rda_round_to_dtype(1.0 + 0x1p-11, t) == 1.0);
  assert_true(rda_round_to_dtype(1.0 + 3 * 0x1p-11, t) == 1.0 + 0x1p-9);
  assert_int_equal(rda_to_dtype_bits(1.0, t), 0x3c00);
  assert_int_equal(rda_to_dtype_bits(-2.5, t), 0xc100);
  assert_int_equal(rda_to_dtype_bits(0.1, t), 0x2e66);
  /* subnormals: quantum 2^-24 */
  assert_int_equal(rda_to_dtype_bits(0x1p-24, t), 0x0001);
  assert_int_equal(rda_to_dtype_bits(0x1p-25, t), 0x0000);           /* tie to even 0 */
  assert_int_equal(rda_to_dtype_bits(0x1p-25 + 0x1p-40, t), 0x0001); /* above the tie */
  assert_int_equal(rda_to_dtype_bits(3 * 0x1p-25, t), 0x0002);       /* tie to even 2 */
  assert_int_equal(rda_to_dtype_bits(1023 * 0x1p-24, t), 0x03ff);    /* largest subnormal */
  assert_int_equal(rda_to_dtype_bits(0x1p-14, t), 0x0400);           /* smallest normal */
  assert_int_equal(rda_to_dtype_bits(1023.5 * 0x1p-24, t), 0x0400);  /* rounds up into normals */
  assert_int_equal(rda_to_dtype_bits(-0x1p-24, t), 0x8001);
  assert_true(rda_from_dtype_bits(0x0001, t) == 0x1p-24);
  assert_true(rda_from_dtype_bits(0x03ff, t) == 1023 * 0x1p-24);
  /* overflow: 65504 is the largest; 65520 (the tie) goes to inf */
  assert_int_equal(rda_to_dtype_bits(65504.0, t), 0x7bff);
  assert_int_equal(rda_to_dtype_bits(65519.99, t), 0x7bff);
  assert_int_equal(rda_to_dtype_bits(65520.0, t), 0x7c00);
  assert_int_equal(rda_to_dtype_bits(-1e6, t), 0xfc00);
  assert_true(isinf(rda_round_to_dtype(70000.0, t)));
  assert_true(isinf(rda_from_dtype_bits(0x7c00, t)) && rda_from_dtype_bits(0xfc00, t) < 0);
  assert_true(isnan(rda_from_dtype_bits(0x7e00, t)));
  assert_true(isnan(rda_from_dtype_bits(0x7c01, t)));
  assert_true(isnan(rda_from_dtype_bits(rda_to_dtype_bits(-NAN, t), t)));
}

/* Every bit pattern decodes and re-encodes to itself (NaNs stay NaN). */
static void test_rounding_bits_round_trip_exhaustively(void **state) {
  (void)state;
  for (int t = RDA_DTYPE_BF16; t <= RDA_DTYPE_FP16; t++)
    for (unsigned u = 0; u < 65536; u++) {
      const double x = rda_from_dtype_bits((unsigned short)u, t);
      if (isnan(x)) {
        assert_true(isnan(rda_from_dtype_bits(rda_to_dtype_bits(x, t), t)));
        continue;
      }
      if (rda_to_dtype_bits(x, t) != u) {
        fprintf(stderr, "%s bits 0x%04x -> %.17g -> 0x%04x\n", rda_dtype_name(t), u, x,
                rda_to_dtype_bits(x, t));
        fail();
      }
      assert_true(rda_round_to_dtype(x, t) == x);
    }
}

/* Random values round to the nearest representable neighbour (checked against the bit
 * neighbours, independent of how rounding is computed). */
static void test_rounding_is_nearest(void **state) {
  (void)state;
  rt_rng *g = rt_global_rng();
  for (int t = RDA_DTYPE_BF16; t <= RDA_DTYPE_FP16; t++)
    for (int i = 0; i < 20000; i++) {
      const double x = rt_rng_normal(g) * ldexp(1.0, (int)rt_rng_range(g, -30, 14));
      const unsigned short b = rda_to_dtype_bits(x, t);
      const double y = rda_from_dtype_bits(b, t);
      assert_true(y == rda_round_to_dtype(x, t));
      const double e = fabs(y - x);
      const unsigned short mag = b & 0x7fff;
      if (mag > 0) assert_true(e <= fabs(rda_from_dtype_bits((unsigned short)(b - 1), t) - x));
      if (mag < (t == RDA_DTYPE_FP16 ? 0x7bff : 0x7f7f))
        assert_true(e <= fabs(rda_from_dtype_bits((unsigned short)(b + 1), t) - x));
    }
}

/* --- the support's SPEC §5 comparison judges what it must ------------------------------------- */

/* The reference rounded to fp32 passes; each kind of wrong output fails. */
static void test_check_fwd_rejects_each_kind_of_wrong_output(void **state) {
  (void)state;
  const long long w[] = {8}, r[] = {2};
  for (int dt = RDA_DTYPE_BF16; dt <= RDA_DTYPE_FP16; dt++) {
    rda_config c;
    rt_config_make(&c, 2, 1, 32, dt, 1, RDA_OFFSETS_MOD, 1, w, r);
    problem p;
    problem_make(&p, &c, 1, 12);
    const long long n = 12, H = 2, D = 32;
    /* o with padded strides (head stride 40), lse with batch/head strides */
    const long long o_s[3] = {n * H * 40, H * 40, 40}, l_s[2] = {H * n, n};
    float *o = malloc((size_t)(n * H * 40) * sizeof *o);
    float *lse = malloc((size_t)(H * n) * sizeof *lse);
    assert_non_null(o), assert_non_null(lse);
    const rt_tol tol = rt_tolerance(dt);
    double norm = 0.0;
    for (long long i = 0; i < n * H * D; i++) norm += p.o[i] * p.o[i];
    norm = sqrt(norm);
    for (int kind = 0; kind <= 6; kind++) {
      rt_poison_f32(o, (size_t)(n * H * 40));
      for (long long t = 0; t < n; t++)
        for (long long h = 0; h < H; h++) {
          lse[h * n + t] = (float)p.lse[h * n + t];
          for (long long x = 0; x < D; x++)
            o[t * o_s[1] + h * o_s[2] + x] = (float)p.o[(t * H + h) * D + x];
        }
      /* row 0 of head 0 is covered (offset 0); row 0 of head 1 is not (offset 1) */
      switch (kind) {
        case 1: o[4 * o_s[1] + 3] += (float)(3.0 * tol.o_rel_l2 * norm); break; /* O off */
        case 2: lse[4] += (float)(2.0 * tol.lse_abs); break;                    /* LSE off */
        case 3: o[o_s[2] + 7] = 1e-30f; break;  /* uncovered o not exactly 0 */
        case 4: lse[n] = -1e30f; break;         /* uncovered lse a sentinel */
        case 5: o[2 * o_s[1] + 1] = NAN; break; /* NaN in a covered row */
        case 6: lse[2] = INFINITY; break;       /* Inf in a covered lse */
        default: break;
      }
      rt_report rep;
      char what[64];
      snprintf(what, sizeof what, "deliberately wrong output, kind %d (expected)", kind);
      const bool ok = rt_check_fwd(what, &c, 1, n, o, o_s, lse, l_s, p.o, p.lse, &rep);
      assert_int_equal(ok, kind == 0);
      assert_int_equal(rep.covered_rows + rep.uncovered_rows, H * n);
      assert_int_equal(rep.uncovered_rows, n); /* r = 2, w = 8, n = 12: half the rows each */
    }
    free(o), free(lse);
    problem_free(&p);
  }
}

/* Strided storage tensors hold the rounded bits at the right places; gaps stay NaN. */
static void test_pack_bits_respects_strides(void **state) {
  (void)state;
  const long long B = 2, N = 3, H = 2, D = 4, HT = 5; /* a fused buffer of 5 heads */
  const long long s[3] = {N * HT * D, HT * D, D};
  double *x = rt_normal((size_t)(B * N * H * D), RT_DTYPE_F64);
  size_t count = 0;
  uint16_t *bits = rt_make_bits(x, B, N, H, D, s, RDA_DTYPE_BF16, &count);
  assert_int_equal(count, (size_t)((B - 1) * s[0] + (N - 1) * s[1] + (H - 1) * s[2] + D));
  size_t written = 0;
  for (size_t i = 0; i < count; i++)
    if (!isnan(rda_from_dtype_bits(bits[i], RDA_DTYPE_BF16))) written++;
  assert_int_equal(written, (size_t)(B * N * H * D));
  for (long long b = 0; b < B; b++)
    for (long long t = 0; t < N; t++)
      for (long long h = 0; h < H; h++)
        for (long long d = 0; d < D; d++)
          assert_true(
              rda_from_dtype_bits(bits[b * s[0] + t * s[1] + h * s[2] + d], RDA_DTYPE_BF16) ==
              rda_round_to_dtype(x[((b * N + t) * H + h) * D + d], RDA_DTYPE_BF16));
  free(bits), free(x);
}

/* Normal draws look normal (mean ~0, variance ~1) and are already rounded to the dtype. */
static void test_fill_normal_is_standard_and_rounded(void **state) {
  (void)state;
  const size_t n = 200000;
  double *x = rt_normal(n, RDA_DTYPE_FP16);
  double m = 0, v = 0;
  for (size_t i = 0; i < n; i++) m += x[i];
  m /= (double)n;
  for (size_t i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
  v /= (double)n;
  assert_true(fabs(m) < 0.01);
  assert_true(fabs(v - 1.0) < 0.02);
  for (size_t i = 0; i < n; i++) assert_true(rda_round_to_dtype(x[i], RDA_DTYPE_FP16) == x[i]);
  free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_full_window_equals_dense),
      cmocka_unit_test(test_reference_causal_full_window_equals_masked_dense),
      cmocka_unit_test(test_reference_dilated_equals_dense_on_gathered_rows),
      cmocka_unit_test(test_reference_branches_equal_softmax_over_multiset_union),
      cmocka_unit_test(test_reference_duplicate_key_counts_twice),
      cmocka_unit_test(test_reference_offset_rules_match_hand_tables),
      cmocka_unit_test(test_reference_uncovered_rows_are_exact),
      cmocka_unit_test(test_reference_gqa_maps_head_to_kv_head),
      cmocka_unit_test(test_reference_batches_are_independent_and_scale_applies),
      cmocka_unit_test(test_reference_bwd_matches_finite_differences_multibranch),
      cmocka_unit_test(test_reference_bwd_matches_finite_differences_gqa),
      cmocka_unit_test(test_reference_bwd_matches_finite_differences_uncovered_and_scale),
      cmocka_unit_test(test_reference_negative_scale_equals_union_softmax),
      cmocka_unit_test(test_reference_huge_segments_and_dilations_do_not_overflow),
      cmocka_unit_test(test_reference_bwd_uncovered_rows_are_exactly_zero),
      cmocka_unit_test(test_reference_bwd_duplicate_branches_equal_one_branch),
      cmocka_unit_test(test_reference_bwd_single_dense_branch_equals_textbook),
      cmocka_unit_test(test_check_bwd_rejects_each_kind_of_wrong_gradient),
      cmocka_unit_test(test_check_grad_passes_an_exactly_zero_gradient),
      cmocka_unit_test(test_check_grad_catches_errors_in_a_small_gradient),
      cmocka_unit_test(test_reference_bwd_magnitudes_bound_the_gradient),
      cmocka_unit_test(test_check_grad_magnitude_judges_a_cancelled_gradient),
      cmocka_unit_test(test_check_grad_magnitude_floor_acts_only_below_the_fraction),
      cmocka_unit_test(test_rounding_bf16_ties_to_even),
      cmocka_unit_test(test_rounding_fp16_ties_subnormals_overflow),
      cmocka_unit_test(test_rounding_bits_round_trip_exhaustively),
      cmocka_unit_test(test_rounding_is_nearest),
      cmocka_unit_test(test_check_fwd_rejects_each_kind_of_wrong_output),
      cmocka_unit_test(test_pack_bits_respects_strides),
      cmocka_unit_test(test_fill_normal_is_standard_and_rounded),
  };
  const char *filter = getenv("RDA_TEST_FILTER"); /* e.g. "*check_grad*" while developing */
  if (filter != NULL) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
