/* test_ring_rows.c — the ring's row kernels (templates/rda_ring.cuh) through their launchers
 * (runtime/ring_rows.c), on every backend here: pack must equal a scalar model bit for bit with
 * the bytes around the block untouched, add must equal the scalar fp32 model exactly with every
 * other element untouched; strided, padded K/V, one and two ranges, dilation stride, more kv
 * heads than one launch takes, heads in random order, batch 2; one-line errors for bad rows;
 * and both kernels compile for sm_80 and sm_90 with no spills and no stack. */
// clang-format off
#include "backend.h"
#include "fwd.h"
#include "gen.h"
#include "nvrtc.h"
#include "rda_test.h"
#include "rda_test_backend.h"
#include "ring_rows.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */
// clang-format on

/* ------------------------------------------------------------------ fixture */

enum { KV = 80 }; /* kv heads of the plan's config: more than RDA_RING_ROWS_MAX_HEADS */

static rt_backends g_rt;
static rda_plan_k g_plan[2];
static rda_fwd_kernels g_kern[2]; /* only the two ring modules are loaded */

static int group_setup(void **state) {
  (void)state;
  if (rt_backends_open(&g_rt, "test_ring_rows") != 0) return -1;
  const long long w[1] = {64}, r[1] = {1};
  rda_config cfg;
  rt_config_make(&cfg, KV, KV, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, w, r);
  for (int i = 0; i < g_rt.n; ++i) {
    rda_backend *b = g_rt.be[i].b;
    rda_err err = {0};
    if (rda_gen_plan(g_rt.gen, &cfg, &g_rt.be[i].hw, &g_plan[i], &err) != RDA_OK) {
      fprintf(stderr, "test_ring_rows: plan on %s: %s\n", b->name, err.msg);
      return -1;
    }
    g_kern[i].n = g_plan[i].nvariants;
    g_kern[i].modules = calloc((size_t)g_plan[i].nvariants, sizeof *g_kern[i].modules);
    if (g_kern[i].modules == NULL) return -1;
    const int which[2] = {g_plan[i].ring_pack_kernel, g_plan[i].ring_add_kernel};
    for (int j = 0; j < 2; ++j)
      if (b->load(b, &g_plan[i].variants[which[j]], &g_kern[i].modules[which[j]], &err) != RDA_OK) {
        fprintf(stderr, "test_ring_rows: load %s on %s: %s\n", g_plan[i].variants[which[j]].name,
                b->name, err.msg);
        return -1;
      }
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  for (int i = 0; i < g_rt.n; ++i) {
    rda_fwd_unload(g_rt.be[i].b, &g_kern[i]);
    rda_plan_k_free(&g_plan[i]);
  }
  rt_backends_close(&g_rt);
  return 0;
}

/* ------------------------------------------------------------------ cases */

typedef struct rows_case {
  const char *name;
  long long batch, n; /* the rank's local K/V: [batch, n, KV, head_dim] */
  int nranges;
  long long first[2], count[2], stride;
  int nkv; /* kv heads moved: distinct, in random order */
  int head_dim;
} rows_case;

static const rows_case kCases[] = {
    {"one range, stride 1", 2, 24, 1, {3, 0}, {9, 0}, 1, 5, 32},
    {"two ranges, stride 3, 70 heads (two launches)", 2, 40, 2, {1, 20}, {5, 4}, 3, 70, 32},
    {"empty first range", 2, 24, 2, {0, 2}, {0, 6}, 2, 7, 32},
    {"every head, head_dim 40, stride 5", 1, 30, 2, {4, 6}, {3, 5}, 5, KV, 40},
    {"exactly 64 heads, head_dim 64", 2, 12, 2, {11, 0}, {1, 3}, 4, 64, 64},
};
enum { NCASES = sizeof kCases / sizeof kCases[0] };

/* K in [B, N, KV, D] order and V sequence-first [N, B, KV, D], both padded at every level
 * (all strides multiples of 8 elements, so rows stay 16-byte aligned). */
typedef struct layout {
  long long k_s[3], v_s[3]; /* over batch, n, head */
  size_t k_span, v_span;
} layout;

static layout make_layout(const rows_case *c) {
  layout l;
  const long long d = c->head_dim;
  l.k_s[2] = d + 8;
  l.k_s[1] = KV * l.k_s[2] + 16;
  l.k_s[0] = c->n * l.k_s[1] + 24;
  l.v_s[2] = d + 16;
  l.v_s[0] = KV * l.v_s[2] + 8;
  l.v_s[1] = c->batch * l.v_s[0] + 32;
  l.k_span = rt_span(c->batch, c->n, KV, d, l.k_s) + 8;
  l.v_span = rt_span(c->batch, c->n, KV, d, l.v_s) + 8;
  return l;
}

/* The first nkv of a random permutation of the kv heads. */
static void random_heads(int *heads, int nkv) {
  int all[KV];
  for (int i = 0; i < KV; ++i) all[i] = i;
  for (int i = KV - 1; i > 0; --i) {
    const int j = (int)rt_rng_range(rt_global_rng(), 0, i);
    const int t = all[i];
    all[i] = all[j];
    all[j] = t;
  }
  memcpy(heads, all, (size_t)nkv * sizeof *heads);
}

static long long block_rows(const rows_case *c) {
  return c->count[0] + c->count[1];
}

/* Local row of block row t. */
static long long local_row(const rows_case *c, long long t) {
  if (c->nranges > 1 && t >= c->count[0]) return c->first[1] + (t - c->count[0]) * c->stride;
  return c->first[0] + t * c->stride;
}

static rda_ring_rows_params make_rows(const rows_case *c, const layout *l, void *k, void *v,
                                      void *block) {
  rda_ring_rows_params r;
  memset(&r, 0, sizeof r);
  r.k = k;
  r.v = v;
  r.k_sb = l->k_s[0], r.k_sn = l->k_s[1], r.k_sh = l->k_s[2];
  r.v_sb = l->v_s[0], r.v_sn = l->v_s[1], r.v_sh = l->v_s[2];
  r.block = block;
  r.batch = c->batch;
  r.rows = block_rows(c);
  r.nranges = c->nranges;
  for (int i = 0; i < c->nranges; ++i) r.first[i] = c->first[i], r.count[i] = c->count[i];
  r.stride = c->stride;
  r.head_dim = c->head_dim;
  r.nkv_total = c->nkv;
  return r;
}

/* Runs BODY for every element moved, with kv (0: K, 1: V), blk (its index in the block) and off
 * (its offset in K or V). */
#define FOR_EACH_ELEMENT(c, l, heads, BODY)                                                     \
  do {                                                                                          \
    const long long rows_ = block_rows(c);                                                      \
    for (int kv = 0; kv < 2; ++kv)                                                              \
      for (long long b_ = 0; b_ < (c)->batch; ++b_)                                             \
        for (long long t_ = 0; t_ < rows_; ++t_)                                                \
          for (int e_ = 0; e_ < (c)->nkv; ++e_)                                                 \
            for (int x_ = 0; x_ < (c)->head_dim; ++x_) {                                        \
              const long long *s_ = kv == 0 ? (l)->k_s : (l)->v_s;                              \
              const long long blk =                                                             \
                  (((kv * (c)->batch + b_) * rows_ + t_) * (c)->nkv + e_) * (c)->head_dim + x_; \
              const long long off =                                                             \
                  b_ * s_[0] + local_row(c, t_) * s_[1] + (long long)(heads)[e_] * s_[2] + x_;  \
              BODY;                                                                             \
            }                                                                                   \
  } while (0)

enum { GUARD = 64 }; /* elements before and after the block (a multiple of 8: stays aligned) */

static uint16_t *random_bits(size_t n) {
  uint16_t *x = malloc(n * sizeof *x);
  assert_non_null(x);
  for (size_t i = 0; i < n; ++i) x[i] = (uint16_t)rt_rng_next(rt_global_rng());
  return x;
}

static float *random_f32(size_t n) {
  float *x = malloc(n * sizeof *x);
  assert_non_null(x);
  for (size_t i = 0; i < n; ++i) x[i] = (float)rt_rng_normal(rt_global_rng());
  return x;
}

/* Index of the first differing element of two n-element arrays of `size` bytes, or -1. */
static long long first_diff(const void *a, const void *b, size_t n, size_t size) {
  for (size_t i = 0; i < n; ++i)
    if (memcmp((const char *)a + i * size, (const char *)b + i * size, size) != 0)
      return (long long)i;
  return -1;
}

/* One case on backend be, run: random K and V in the case's layout and a block buffer with
 * GUARD elements either side (random values, block and guards alike), on the host and the
 * device, then the kernel. pack: 2-byte elements (random bits), the block written from K and
 * V; add: fp32 elements (normal values), the block added into K and V. */
typedef struct rows_run {
  layout l;
  int heads[KV];
  size_t nblk, nbuf;
  void *k, *v, *buf;    /* host: as uploaded */
  void *dk, *dv, *dbuf; /* device */
} rows_run;

static void run_rows(int be, const rows_case *c, int add, rows_run *x) {
  rda_backend *b = g_rt.be[be].b;
  const size_t es = add ? 4 : 2;
  x->l = make_layout(c);
  random_heads(x->heads, c->nkv);
  x->nblk = 2 * (size_t)(c->batch * block_rows(c) * c->nkv * c->head_dim);
  x->nbuf = x->nblk + 2 * GUARD;
  const size_t n[3] = {x->l.k_span, x->l.v_span, x->nbuf};
  void **host[3] = {&x->k, &x->v, &x->buf}, **dev[3] = {&x->dk, &x->dv, &x->dbuf};
  for (int i = 0; i < 3; ++i) *host[i] = add ? (void *)random_f32(n[i]) : (void *)random_bits(n[i]);
  for (int i = 0; i < 3; ++i) *dev[i] = rt_dev_alloc(b, n[i] * es);
  for (int i = 0; i < 3; ++i) rt_dev_upload(b, *dev[i], *host[i], n[i] * es);

  rda_ring_rows_params r = make_rows(c, &x->l, x->dk, x->dv, (unsigned char *)x->dbuf + GUARD * es);
  rda_err err = {0};
  const rda_status s = add ? rda_ring_rows_add(b, &g_plan[be], &g_kern[be], &r, x->heads, &err)
                           : rda_ring_rows_pack(b, &g_plan[be], &g_kern[be], &r, x->heads, &err);
  if (s != RDA_OK || b->synchronize(b, &err) != RDA_OK)
    fail_msg("%s %s %s: %s", b->name, add ? "add" : "pack", c->name, err.msg);
}

static void rows_free(int be, rows_run *x) {
  rda_backend *b = g_rt.be[be].b;
  free(x->k), free(x->v), free(x->buf);
  b->free(b, x->dk), b->free(b, x->dv), b->free(b, x->dbuf);
}

static void run_pack(int be, const rows_case *c) {
  rda_backend *b = g_rt.be[be].b;
  rows_run x;
  run_rows(be, c, 0, &x);
  const layout l = x.l;
  const int *heads = x.heads;
  const size_t nblk = x.nblk, nbuf = x.nbuf;
  const uint16_t *k = x.k, *v = x.v, *buf = x.buf;

  uint16_t *want = malloc(nbuf * 2);
  assert_non_null(want);
  memcpy(want, buf, nbuf * 2);
  FOR_EACH_ELEMENT(c, &l, heads, want[GUARD + blk] = (kv == 0 ? k : v)[off]);
  uint16_t *got = malloc(nbuf * 2);
  assert_non_null(got);
  rt_dev_download(b, got, x.dbuf, nbuf * 2);
  const long long bad = first_diff(got, want, nbuf, 2);
  if (bad >= 0)
    fail_msg(
        "%s pack %s (seed %llu): element %lld of the buffer (block starts at %d, %zu "
        "elements) is 0x%04x, want 0x%04x",
        b->name, c->name, (unsigned long long)rt_seed_value(), bad, GUARD, nblk, got[bad],
        want[bad]);
  /* The sources are only read. */
  uint16_t *kk = malloc(l.k_span * 2), *vv = malloc(l.v_span * 2);
  assert_non_null(kk);
  assert_non_null(vv);
  rt_dev_download(b, kk, x.dk, l.k_span * 2);
  rt_dev_download(b, vv, x.dv, l.v_span * 2);
  assert_memory_equal(kk, k, l.k_span * 2);
  assert_memory_equal(vv, v, l.v_span * 2);

  free(kk), free(vv), free(got), free(want);
  rows_free(be, &x);
}

static void run_add(int be, const rows_case *c) {
  rda_backend *b = g_rt.be[be].b;
  rows_run x;
  run_rows(be, c, 1, &x); /* padding random too: what the kernel must not touch stays as is */
  const layout l = x.l;
  const int *heads = x.heads;
  const size_t nbuf = x.nbuf;
  const float *k = x.k, *v = x.v, *buf = x.buf;

  float *wk = malloc(l.k_span * 4), *wv = malloc(l.v_span * 4);
  assert_non_null(wk);
  assert_non_null(wv);
  memcpy(wk, k, l.k_span * 4);
  memcpy(wv, v, l.v_span * 4);
  /* One fp32 add per element, as the kernel does: the results must match bit for bit. */
  FOR_EACH_ELEMENT(c, &l, heads, (kv == 0 ? wk : wv)[off] += buf[GUARD + blk]);
  float *gk = rt_download_f32(b, x.dk, l.k_span), *gv = rt_download_f32(b, x.dv, l.v_span);
  for (int kv = 0; kv < 2; ++kv) {
    const float *got = kv == 0 ? gk : gv, *want = kv == 0 ? wk : wv;
    const long long bad = first_diff(got, want, kv == 0 ? l.k_span : l.v_span, 4);
    if (bad >= 0)
      fail_msg("%s add %s (seed %llu): %s element %lld is %.9g, want %.9g (was %.9g)", b->name,
               c->name, (unsigned long long)rt_seed_value(), kv == 0 ? "dK" : "dV", bad,
               (double)got[bad], (double)want[bad], (double)(kv == 0 ? k : v)[bad]);
  }
  float *gb = rt_download_f32(b, x.dbuf, nbuf);
  assert_memory_equal(gb, buf, nbuf * 4); /* the block is only read */

  free(gb), free(gk), free(gv), free(wk), free(wv);
  rows_free(be, &x);
}

/* ------------------------------------------------------------------ many transfers at once */

/* Launches through backend be since counting began. */
static rda_status (*g_launch)(rda_backend *, rda_module *, const unsigned[3], unsigned, unsigned,
                              const void *, size_t, rda_err *);
static int g_launches;

static rda_status counting_launch(rda_backend *b, rda_module *m, const unsigned grid[3],
                                  unsigned threads, unsigned smem, const void *params,
                                  size_t bytes, rda_err *err) {
  g_launches++;
  return g_launch(b, m, grid, threads, smem, params, bytes, err);
}

/* Three transfers of one round over the same K/V, blocks one after another in one buffer: the
 * third has the first's rows and some of its kv heads (an all-gather's block returning from two
 * peers). pack: one launch (four entries: the second has 70 heads); add: two launches, the
 * third after the first, so every element gets its additions in transfer order, bit for bit. */
static void run_many(int be, int add) {
  rda_backend *b = g_rt.be[be].b;
  const size_t es = add ? 4 : 2;
  const rows_case base = {"many", 2, 30, 1, {0, 0}, {0, 0}, 3, 1, 32};
  const rows_case t[3] = {
      {"t0", 2, 30, 1, {1, 0}, {5, 0}, 3, 3, 32},
      {"t1", 2, 30, 2, {0, 14}, {2, 3}, 3, 70, 32},
      {"t1", 2, 30, 1, {1, 0}, {5, 0}, 3, 4, 32},
  };
  const layout l = make_layout(&base);
  int heads[3][KV];
  for (int i = 0; i < 3; ++i) random_heads(heads[i], t[i].nkv);
  heads[2][1] = heads[0][2]; /* a shared kv head on shared rows */
  heads[2][3] = heads[0][0];
  for (int e = 0; e < 4; ++e) /* keep t2's heads distinct */
    for (int f = 0; f < e; ++f)
      if (heads[2][f] == heads[2][e]) heads[2][e] = (heads[2][e] + 40) % KV;
  size_t at[3], nbuf = GUARD;
  for (int i = 0; i < 3; ++i) {
    at[i] = nbuf;
    nbuf += 2 * (size_t)(t[i].batch * block_rows(&t[i]) * t[i].nkv * t[i].head_dim);
  }
  nbuf += GUARD;
  void *k = add ? (void *)random_f32(l.k_span) : (void *)random_bits(l.k_span);
  void *v = add ? (void *)random_f32(l.v_span) : (void *)random_bits(l.v_span);
  void *buf = add ? (void *)random_f32(nbuf) : (void *)random_bits(nbuf);
  void *dk = rt_dev_alloc(b, l.k_span * es), *dv = rt_dev_alloc(b, l.v_span * es);
  void *dbuf = rt_dev_alloc(b, nbuf * es);
  rt_dev_upload(b, dk, k, l.k_span * es);
  rt_dev_upload(b, dv, v, l.v_span * es);
  rt_dev_upload(b, dbuf, buf, nbuf * es);
  rda_ring_rows_params r[3];
  const int *hp[3];
  for (int i = 0; i < 3; ++i) {
    r[i] = make_rows(&t[i], &l, dk, dv, (unsigned char *)dbuf + at[i] * es);
    hp[i] = heads[i];
  }
  rda_err err = {0};
  g_launch = b->launch;
  b->launch = counting_launch;
  g_launches = 0;
  const rda_status s = add ? rda_ring_rows_add_many(b, &g_plan[be], &g_kern[be], r, hp, 3, &err)
                           : rda_ring_rows_pack_many(b, &g_plan[be], &g_kern[be], r, hp, 3, &err);
  b->launch = g_launch;
  if (s != RDA_OK || b->synchronize(b, &err) != RDA_OK)
    fail_msg("%s %s many: %s", b->name, add ? "add" : "pack", err.msg);
  if (g_launches != (add ? 2 : 1))
    fail_msg("%s %s many: %d launches, want %d", b->name, add ? "add" : "pack", g_launches,
             add ? 2 : 1);
  if (add) {
    float *wk = malloc(l.k_span * 4), *wv = malloc(l.v_span * 4);
    const float *fb = buf;
    assert_true(wk != NULL && wv != NULL);
    memcpy(wk, k, l.k_span * 4);
    memcpy(wv, v, l.v_span * 4);
    for (int i = 0; i < 3; ++i)
      FOR_EACH_ELEMENT(&t[i], &l, heads[i], (kv == 0 ? wk : wv)[off] += fb[at[i] + blk]);
    float *gk = rt_download_f32(b, dk, l.k_span), *gv = rt_download_f32(b, dv, l.v_span);
    assert_memory_equal(gk, wk, l.k_span * 4);
    assert_memory_equal(gv, wv, l.v_span * 4);
    free(gk), free(gv), free(wk), free(wv);
  } else {
    uint16_t *want = malloc(nbuf * 2), *got = malloc(nbuf * 2);
    const uint16_t *hk = k, *hv = v;
    assert_true(want != NULL && got != NULL);
    memcpy(want, buf, nbuf * 2);
    for (int i = 0; i < 3; ++i)
      FOR_EACH_ELEMENT(&t[i], &l, heads[i], want[at[i] + blk] = (kv == 0 ? hk : hv)[off]);
    rt_dev_download(b, got, dbuf, nbuf * 2);
    const long long bad = first_diff(got, want, nbuf, 2);
    if (bad >= 0) fail_msg("%s pack many: element %lld of the buffer differs", b->name, bad);
    free(want), free(got);
  }
  free(k), free(v), free(buf);
  b->free(b, dk), b->free(b, dv), b->free(b, dbuf);
}

static void test_ring_rows_many_transfers_in_few_launches(void **state) {
  (void)state;
  for (int be = 0; be < g_rt.n; ++be) {
    run_many(be, 0);
    run_many(be, 1);
  }
}

static void test_ring_rows_pack_matches_scalar_model(void **state) {
  (void)state;
  for (int be = 0; be < g_rt.n; ++be)
    for (int i = 0; i < NCASES; ++i) run_pack(be, &kCases[i]);
}

static void test_ring_rows_add_matches_scalar_model(void **state) {
  (void)state;
  for (int be = 0; be < g_rt.n; ++be)
    for (int i = 0; i < NCASES; ++i) run_add(be, &kCases[i]);
}

/* Zero rows launch nothing: pointers may be NULL, and a real block stays as it was. */
static void test_ring_rows_zero_rows_touch_nothing(void **state) {
  (void)state;
  for (int be = 0; be < g_rt.n; ++be) {
    rda_backend *b = g_rt.be[be].b;
    const rows_case c = {"zero rows", 2, 8, 2, {0, 3}, {0, 0}, 2, 3, 32};
    const layout l = make_layout(&c);
    rda_ring_rows_params r = make_rows(&c, &l, NULL, NULL, NULL);
    rda_err err = {0};
    assert_int_equal(rda_ring_rows_pack(b, &g_plan[be], &g_kern[be], &r, NULL, &err), RDA_OK);
    assert_int_equal(rda_ring_rows_add(b, &g_plan[be], &g_kern[be], &r, NULL, &err), RDA_OK);
    uint16_t *buf = random_bits(2 * GUARD);
    uint16_t *dbuf = rt_dev_alloc(b, 4 * GUARD);
    rt_dev_upload(b, dbuf, buf, 4 * GUARD);
    const int heads[3] = {1, 2, 3};
    r = make_rows(&c, &l, dbuf, dbuf, dbuf + GUARD);
    assert_int_equal(rda_ring_rows_pack(b, &g_plan[be], &g_kern[be], &r, heads, &err), RDA_OK);
    assert_int_equal(b->synchronize(b, &err), RDA_OK);
    uint16_t got[2 * GUARD];
    rt_dev_download(b, got, dbuf, sizeof got);
    assert_memory_equal(got, buf, sizeof got);
    free(buf);
    b->free(b, dbuf);
  }
}

/* ------------------------------------------------------------------ bad rows */

/* One mistake each; `says` is a part of the message that must name it. */
enum bad_kind {
  NRANGES_0,
  NRANGES_3,
  NEGATIVE_COUNT,
  ROWS_NOT_SUM,
  STRIDE_0,
  BATCH_0,
  NKV_0,
  HEAD_DIM_12,
  HEAD_DIM_0,
  NULL_K,
  NULL_BLOCK,
  NULL_HEADS,
  MISALIGNED_V,
  K_ROW_STRIDE_6,
  HEAD_OUT_OF_RANGE,
  NEGATIVE_FIRST,
  REPEATED_HEAD,
  RANGES_MEET
};

typedef struct bad_case {
  enum bad_kind kind;
  const char *what, *says;
  int add_only; /* a mistake only for add (pack must accept it) */
} bad_case;

static const bad_case kBad[] = {
    {NRANGES_0, "nranges 0", "nranges = 0", 0},
    {NRANGES_3, "nranges 3", "nranges = 3", 0},
    {NEGATIVE_COUNT, "negative count", "count[1] = -1", 0},
    {ROWS_NOT_SUM, "rows not the sum", "rows = 7", 0},
    {STRIDE_0, "stride 0", "stride = 0", 0},
    {BATCH_0, "batch 0", "batch = 0", 0},
    {NKV_0, "nkv_total 0", "nkv_total = 0", 0},
    {HEAD_DIM_12, "head_dim 12", "head_dim = 12", 0},
    {HEAD_DIM_0, "head_dim 0", "head_dim = 0", 0},
    {NULL_K, "NULL k", "must not be NULL", 0},
    {NULL_BLOCK, "NULL block", "must not be NULL", 0},
    {NULL_HEADS, "NULL kv_heads", "must not be NULL", 0},
    {MISALIGNED_V, "misaligned v", "v: pointer", 0},
    {K_ROW_STRIDE_6, "k row stride 6", "k: stride 1 = 6", 0},
    {HEAD_OUT_OF_RANGE, "kv head out of range", "kv_heads[1] = 80", 0},
    {NEGATIVE_FIRST, "negative first row", "first[0] = -1", 0},
    {REPEATED_HEAD, "repeated kv head", "both 2", 1},
    {RANGES_MEET, "ranges that meet", "share rows", 1},
};
enum { NBAD = sizeof kBad / sizeof kBad[0] };

static void test_ring_rows_rejects_bad_rows_with_one_line(void **state) {
  (void)state;
  rda_backend *b = g_rt.be[0].b;
  /* Real, aligned buffers large enough for the fp32 case (the pack of an add-only mistake
   * runs). */
  const rows_case c = {"bad", 1, 8, 2, {0, 1}, {2, 2}, 2, 2, 32};
  const layout l = make_layout(&c);
  const size_t vof = (l.k_span + 7) / 8 * 8, bof = vof + (l.v_span + 7) / 8 * 8;
  float *mem = rt_dev_alloc(b, (bof + 2 * 4 * 2 * 32) * sizeof(float));
  for (int op = 0; op < 2; ++op)
    for (int i = 0; i < NBAD; ++i) {
      const bad_case *bc = &kBad[i];
      rda_ring_rows_params r = make_rows(&c, &l, mem, mem + vof, mem + bof);
      int heads[2] = {2, 5};
      const int *hp = heads;
      switch (bc->kind) {
        case NRANGES_0: r.nranges = 0; break;
        case NRANGES_3: r.nranges = 3; break;
        case NEGATIVE_COUNT: r.count[1] = -1, r.rows = 1; break;
        case ROWS_NOT_SUM: r.rows = 7; break;
        case STRIDE_0: r.stride = 0; break;
        case BATCH_0: r.batch = 0; break;
        case NKV_0: r.nkv_total = 0; break;
        case HEAD_DIM_12: r.head_dim = 12; break;
        case HEAD_DIM_0: r.head_dim = 0; break;
        case NULL_K: r.k = NULL; break;
        case NULL_BLOCK: r.block = NULL; break;
        case NULL_HEADS: hp = NULL; break;
        case MISALIGNED_V: r.v = (char *)r.v + 4; break;
        case K_ROW_STRIDE_6: r.k_sn = 6; break;
        case HEAD_OUT_OF_RANGE: heads[1] = KV; break;
        case NEGATIVE_FIRST: r.first[0] = -1; break;
        case REPEATED_HEAD: heads[1] = 2; break;
        case RANGES_MEET: r.first[1] = 2; break; /* rows 0, 2 and 2, 4 */
      }
      rda_err err = {0};
      const char *fn = op == 0 ? "rda_ring_rows_pack: " : "rda_ring_rows_add: ";
      const rda_status s = op == 0 ? rda_ring_rows_pack(b, &g_plan[0], &g_kern[0], &r, hp, &err)
                                   : rda_ring_rows_add(b, &g_plan[0], &g_kern[0], &r, hp, &err);
      if (bc->add_only && op == 0) {
        if (s != RDA_OK) fail_msg("pack with %s: %s", bc->what, err.msg);
        assert_int_equal(b->synchronize(b, &err), RDA_OK);
        continue;
      }
      if (s != RDA_ERR_INVALID_ARGUMENT)
        fail_msg("%s with %s: status %d, want RDA_ERR_INVALID_ARGUMENT", fn, bc->what, (int)s);
      if (strncmp(err.msg, fn, strlen(fn)) != 0 || strstr(err.msg, bc->says) == NULL ||
          strchr(err.msg, '\n') != NULL)
        fail_msg("%s with %s: message \"%s\" should be one line naming \"%s\"", fn, bc->what,
                 err.msg, bc->says);
    }
  rda_err err = {0};
  assert_int_equal(rda_ring_rows_pack(b, NULL, &g_kern[0], NULL, NULL, &err),
                   RDA_ERR_INVALID_ARGUMENT);
  b->free(b, mem);
}

/* ------------------------------------------------------------------ NVRTC */

/* Whether the log holds ptxas's "N bytes stack frame" and every one says 0. */
static int no_stack(const char *log) {
  int seen = 0;
  for (const char *p = strstr(log, " bytes stack frame"); p != NULL;
       p = strstr(p + 1, " bytes stack frame")) {
    const char *q = p;
    while (q > log && q[-1] >= '0' && q[-1] <= '9') --q;
    if (q == p || strtol(q, NULL, 10) != 0) return 0;
    seen = 1;
  }
  return seen;
}

static void test_ring_rows_kernels_compile_without_spills(void **state) {
  (void)state;
  const rda_plan_k *p = &g_plan[0];
  static const int archs[] = {80, 90};
  for (int a = 0; a < 2; ++a)
    for (int j = 0; j < 2; ++j) {
      const rda_variant *v = &p->variants[j == 0 ? p->ring_pack_kernel : p->ring_add_kernel];
      rda_nvrtc_out out;
      rda_err err = {0};
      if (rda_nvrtc_compile(v->source, v->name, v->name, archs[a], 0, &out, &err) != RDA_OK)
        fail_msg("nvrtc %s sm_%d: %s", v->name, archs[a], err.msg);
      print_message("%s sm_%d: %d registers, %d spill bytes, %.2f s\n", v->name, archs[a],
                    out.registers, out.spill_bytes, out.compile_s);
      const int spills = out.spill_bytes, stack = !no_stack(out.log);
      if (spills != 0 || stack) fprintf(stderr, "%s\n", out.log);
      rda_nvrtc_out_free(&out);
      assert_int_equal(spills, 0);
      assert_false(stack);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_rows_pack_matches_scalar_model),
      cmocka_unit_test(test_ring_rows_add_matches_scalar_model),
      cmocka_unit_test(test_ring_rows_zero_rows_touch_nothing),
      cmocka_unit_test(test_ring_rows_many_transfers_in_few_launches),
      cmocka_unit_test(test_ring_rows_rejects_bad_rows_with_one_line),
      cmocka_unit_test(test_ring_rows_kernels_compile_without_spills),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
