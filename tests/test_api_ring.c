/* test_api_ring.c — the public ring API (include/rda.h, "the ring") on the emulator context with
 * P threads: every rank's rows against its rows of the single-device rda_forward / rda_backward
 * and the float64 reference (SPEC §5), the layouts' row ownership, bytes moved against the ring
 * plan, and the failure paths: bad descs, fingerprint mismatches, bad calls and rda_ring_abort
 * make every rank fail (one line each) within the timeout, never hang. */
#include "api.h"
#include "rda.h"
#include "rda_test.h"
#include "reference.h"
#include "ring.h"
#include "ring_plan.h"

/* clang-format off */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h> /* after the standard headers it needs */

#include "rda_test_tensor.h" /* needs cmocka.h */
/* clang-format on */

#define MAXP 5
static const double kTimeout = 5.0; /* seconds: short, so a hang shows up as a failure */

static rda_ctx *g_ctx;
static rda_plan *g_plan_a; /* causal, mod offsets, GQA, bf16; with the backward pass */
static rda_plan *g_plan_b; /* non-causal, block offsets, MQA, fp16, dilation 3 */
static rda_plan *g_plan_c; /* causal, group offsets, three branches, head_dim 64 */
static rda_plan *g_plan_d; /* the smallest: 2 heads, MQA, fp16, one segment of 2; backward */

static rda_attn_config config_a(void) {
  rda_attn_config c = RDA_CONFIG_INIT;
  c.heads = 4, c.kv_heads = 2, c.head_dim = 32, c.dtype = RDA_BF16, c.causal = 1;
  c.nbranch = 2;
  c.segments[0] = 8, c.dilations[0] = 1;
  c.segments[1] = 16, c.dilations[1] = 2;
  return c;
}

static rda_attn_config config_b(void) {
  rda_attn_config c = RDA_CONFIG_INIT;
  c.heads = 4, c.kv_heads = 1, c.head_dim = 32, c.dtype = RDA_FP16, c.causal = 0;
  c.offsets = RDA_OFFSET_BLOCK;
  c.nbranch = 2;
  c.segments[0] = 12, c.dilations[0] = 1;
  c.segments[1] = 30, c.dilations[1] = 3;
  return c;
}

static rda_attn_config config_c(void) {
  rda_attn_config c = RDA_CONFIG_INIT;
  c.heads = 4, c.kv_heads = 4, c.head_dim = 64, c.dtype = RDA_BF16, c.causal = 1;
  c.offsets = RDA_OFFSET_GROUP;
  c.nbranch = 3;
  c.segments[0] = 6, c.dilations[0] = 1;
  c.segments[1] = 12, c.dilations[1] = 2;
  c.segments[2] = 24, c.dilations[2] = 4;
  c.scale = 0.3;
  return c;
}

static rda_attn_config config_d(void) {
  rda_attn_config c = RDA_CONFIG_INIT;
  c.heads = 2, c.kv_heads = 1, c.head_dim = 32, c.dtype = RDA_FP16, c.causal = 1;
  c.nbranch = 1;
  c.segments[0] = 2, c.dilations[0] = 1;
  return c;
}

static int group_setup(void **state) {
  (void)state;
  if (rda_ctx_create_emulator(&g_ctx) != RDA_OK) {
    fprintf(stderr, "test_api_ring: rda_ctx_create_emulator: %s\n", rda_last_error(NULL));
    return -1;
  }
  const rda_attn_config a = config_a(), b = config_b(), c = config_c(), d = config_d();
  if (rda_plan_create(&g_plan_a, g_ctx, &a, RDA_PLAN_WITH_BACKWARD) != RDA_OK ||
      rda_plan_create(&g_plan_b, g_ctx, &b, RDA_PLAN_FORWARD) != RDA_OK ||
      rda_plan_create(&g_plan_c, g_ctx, &c, RDA_PLAN_FORWARD) != RDA_OK ||
      rda_plan_create(&g_plan_d, g_ctx, &d, RDA_PLAN_WITH_BACKWARD) != RDA_OK) {
    fprintf(stderr, "test_api_ring: rda_plan_create: %s\n", rda_last_error(g_ctx));
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  rda_plan_destroy(g_plan_a);
  rda_plan_destroy(g_plan_b);
  rda_plan_destroy(g_plan_c);
  rda_plan_destroy(g_plan_d);
  rda_ctx_destroy(g_ctx);
  return 0;
}

static void *aalloc(size_t bytes) {
  void *p = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  assert_non_null(p);
  return p;
}

/* One line, naming what it must. */
static void assert_one_line_naming(const char *msg, const char *what) {
  if (strstr(msg, what) == NULL || strchr(msg, '\n') != NULL || msg[0] == '\0') {
    fprintf(stderr, "expected one line naming '%s'; got: %s\n", what, msg);
    fail();
  }
}

/* The internal config of a plan (for the reference and the ring plan). */
static rda_config internal_config(const rda_plan *plan) {
  rda_attn_config pc;
  assert_int_equal(rda_plan_get_config(plan, &pc), RDA_OK);
  rda_config c;
  rt_config_make(&c, pc.heads, pc.kv_heads, pc.head_dim, (int)pc.dtype, pc.causal, (int)pc.offsets,
                 pc.nbranch, pc.segments, pc.dilations);
  c.scale = pc.scale;
  return c;
}

/* The row ownership SPEC §1 and rda.h describe, written out independently of the library. */
static int model_rows(long long n, int P, int layout, int rank, long long lo[2], long long hi[2]) {
  if (layout == RDA_LAYOUT_ZIGZAG) {
    const long long c = n / (2LL * P);
    lo[0] = rank * c, hi[0] = lo[0] + c;
    lo[1] = (2LL * P - 1 - rank) * c, hi[1] = lo[1] + c;
    if (hi[0] != lo[1]) return 2;
    hi[0] = hi[1], lo[1] = hi[1] = 0; /* the middle rank's chunks touch: one piece */
    return 1;
  }
  const long long base = n / P, extra = n % P;
  lo[0] = rank * base + (rank < extra ? rank : extra);
  hi[0] = lo[0] + base + (rank < extra ? 1 : 0);
  lo[1] = hi[1] = 0;
  if (hi[0] > lo[0]) return 1;
  lo[0] = hi[0] = 0; /* P > N: no rows, no piece */
  return 0;
}

/* Copy rows [lo, hi) of a global [B, N, W] array (elem bytes each) to local rows from `at` of a
 * [B, R, pitch] array (W of each row used), or back (to_global). */
static void copy_rows_p(void *global, void *local, long long B, long long N, long long R,
                        long long W, long long pitch, size_t elem, long long lo, long long hi,
                        long long at, int to_global) {
  for (long long b = 0; b < B; ++b)
    for (long long g = lo; g < hi; ++g) {
      char *gp = (char *)global + ((size_t)(b * N + g) * (size_t)W) * elem;
      char *lp = (char *)local + ((size_t)(b * R + at + g - lo) * (size_t)pitch) * elem;
      if (to_global)
        memcpy(gp, lp, (size_t)W * elem);
      else
        memcpy(lp, gp, (size_t)W * elem);
    }
}

/* Local rows contiguous (pitch W). */
static void copy_rows(void *global, void *local, long long B, long long N, long long R, long long W,
                      size_t elem, long long lo, long long hi, long long at, int to_global) {
  copy_rows_p(global, local, B, N, R, W, W, elem, lo, hi, at, to_global);
}

/* The same for [B, H, N] (LSE-shaped) arrays of floats. */
static void copy_lse_rows(float *global, float *local, long long B, long long H, long long N,
                          long long R, long long lo, long long hi, long long at, int to_global) {
  for (long long bh = 0; bh < B * H; ++bh)
    for (long long g = lo; g < hi; ++g) {
      if (to_global)
        global[bh * N + g] = local[bh * R + at + g - lo];
      else
        local[bh * R + at + g - lo] = global[bh * N + g];
    }
}

/* ------------------------------------------------------------------ the harness */

/* What a run does. */
typedef struct rcase {
  const char *what;
  rda_plan *plan;
  int P, layout;
  long long B, N;
  rda_dtype o_dtype; /* forward's o: the plan's dtype or RDA_FP32 */
  int with_lse;
  int backward; /* 1: forward (fp32 o, lse), then backward */
  int with_dlse;
  int fused; /* q, k, v: slices of one [B, rows, H + 2 Hkv, D] buffer per rank */
} rcase;

/* One rank's buffers (its rows only) and what it saw. */
typedef struct rjob {
  const rcase *rc;
  rda_ring_world *world;
  int rank;
  long long R;
  int npieces;
  long long lo[2], hi[2];
  rt_attn_bufs b; /* q, k, v, o, lse, dout, dlse, dq, dk, dv */
  void *qkv; /* the fused buffer, or NULL */
  rda_status create_s, fwd_s, bwd_s;
  char msg[1024];
  long long got_rows, got_lo[2], got_hi[2];
  int got_npieces;
  size_t ws_fwd, ws_bwd;
  rda_ring_stats fwd_stats, bwd_stats;
} rjob;

static void *rank_main(void *arg) {
  rjob *j = arg;
  const rcase *rc = j->rc;
  rda_attn_config pc;
  rda_plan_get_config(rc->plan, &pc);
  const long long B = rc->B, R = j->R, H = pc.heads, Hkv = pc.kv_heads, D = pc.head_dim;
  rda_ring_desc d = RDA_RING_DESC_INIT;
  d.n = rc->N, d.ranks = rc->P, d.rank = j->rank, d.layout = (rda_ring_layout)rc->layout;
  d.world = j->world;
  rda_ring *ring = NULL;
  j->create_s = rda_ring_create(&ring, rc->plan, &d);
  j->fwd_s = j->bwd_s = RDA_ERR_INTERNAL;
  if (j->create_s != RDA_OK) {
    snprintf(j->msg, sizeof j->msg, "%s", rda_last_error(NULL));
    return NULL;
  }
  rda_ring_rows(ring, &j->got_rows, &j->got_npieces, j->got_lo, j->got_hi);
  rda_ring_workspace_size(ring, B, 0, &j->ws_fwd);
  rt_attn_tensors t;
  if (rt_attn(&t, &j->b, pc.dtype, rc->backward ? RDA_FP32 : rc->o_dtype, B, R, H, Hkv, D) !=
      RDA_OK) { /* fwd_s stays RDA_ERR_INTERNAL: the main thread fails the test */
    snprintf(j->msg, sizeof j->msg, "rda_tensor_contiguous: %s", rda_last_error(NULL));
    rda_ring_destroy(ring);
    return NULL;
  }
  if (j->qkv != NULL) { /* views of one fused buffer: rows of H + 2 Hkv heads */
    const long long row = (H + 2 * Hkv) * D;
    rda_tensor *const t3[3] = {&t.q, &t.k, &t.v};
    for (int i = 0; i < 3; ++i) t3[i]->stride[0] = R * row, t3[i]->stride[1] = row;
  }
  /* Exactly the parts this call uses: no accumulator for an fp32 o, no LSE when lse is given. */
  const int o32 = rc->backward || rc->o_dtype == RDA_FP32, lse_given = rc->with_lse || rc->backward;
  const size_t o_part = ((size_t)(B * R * H * D) * 4 + 255) / 256 * 256;
  const size_t l_part = ((size_t)(B * H * R) * 4 + 255) / 256 * 256;
  const size_t need = j->ws_fwd - (o32 ? o_part : 0) - (lse_given ? l_part : 0);
  void *ws = need > 0 ? aalloc(need) : NULL;
  if (ws != NULL) rt_poison_f32(ws, need / 4);
  j->fwd_s =
      rda_ring_forward(ring, &t.q, &t.k, &t.v, &t.o, lse_given ? &t.lse : NULL, ws, need, NULL);
  if (j->fwd_s != RDA_OK) snprintf(j->msg, sizeof j->msg, "%s", rda_last_error(NULL));
  rda_ring_get_stats(ring, &j->fwd_stats);
  free(ws);
  if (j->fwd_s == RDA_OK && rc->backward) {
    rda_ring_workspace_size(ring, B, 1, &j->ws_bwd);
    ws = j->ws_bwd > 0 ? aalloc(j->ws_bwd) : NULL;
    if (ws != NULL) rt_poison_f32(ws, j->ws_bwd / 4);
    j->bwd_s =
        rda_ring_backward(ring, &t.q, &t.k, &t.v, &t.o, &t.lse, &t.dout,
                          rc->with_dlse ? &t.dlse : NULL, &t.dq, &t.dk, &t.dv, ws, j->ws_bwd, NULL);
    if (j->bwd_s != RDA_OK) snprintf(j->msg, sizeof j->msg, "%s", rda_last_error(NULL));
    rda_ring_get_stats(ring, &j->bwd_stats);
    free(ws);
  }
  rda_ring_destroy(ring);
  return NULL;
}

/* Bits of storage dtype (or fp32) o as doubles. */
static void o_to_double(const void *o, rda_dtype dt, size_t n, double *out) {
  for (size_t i = 0; i < n; ++i)
    out[i] = dt == RDA_FP32 ? (double)((const float *)o)[i]
                            : rda_from_dtype_bits(((const uint16_t *)o)[i], (int)dt);
}

/* Run one case on P threads and check every rank against the single device and the reference. */
static void run_case(const rcase *rc) {
  rda_attn_config pc;
  assert_int_equal(rda_plan_get_config(rc->plan, &pc), RDA_OK);
  const rda_config c = internal_config(rc->plan);
  const int dt = (int)pc.dtype;
  const long long B = rc->B, N = rc->N, H = pc.heads, Hkv = pc.kv_heads, D = pc.head_dim;
  const int P = rc->P;
  const size_t nq = (size_t)(B * N * H * D), nk = (size_t)(B * N * Hkv * D),
               nl = (size_t)(B * H * N);
  const rt_tol tol = rt_tolerance(dt);

  /* Global inputs, rounded to the dtype, and their storage bits. */
  double *q = rt_normal(nq, dt), *k = rt_normal(nk, dt), *v = rt_normal(nk, dt);
  double *dout = rt_normal(nq, dt), *dlse = rt_normal(nl, RT_DTYPE_F64);
  float *dlsef = aalloc(nl * 4);
  for (size_t i = 0; i < nl; ++i) dlse[i] = dlsef[i] = (float)dlse[i];
  long long qs[3], ks[3];
  rt_strides_contig(N, H, D, qs);
  rt_strides_contig(N, Hkv, D, ks);
  uint16_t *qb = rt_make_bits(q, B, N, H, D, qs, dt, NULL);
  uint16_t *kb = rt_make_bits(k, B, N, Hkv, D, ks, dt, NULL);
  uint16_t *vb = rt_make_bits(v, B, N, Hkv, D, ks, dt, NULL);
  uint16_t *dob = rt_make_bits(dout, B, N, H, D, qs, dt, NULL);

  /* The single device, with the same o dtype and lse choice. */
  const rda_dtype odt = rc->backward ? RDA_FP32 : rc->o_dtype;
  const size_t oel = odt == RDA_FP32 ? 4 : 2;
  void *o1 = aalloc(nq * 4);
  float *l1 = aalloc(nl * 4);
  rt_poison_f32(o1, nq), rt_poison_f32(l1, nl);
  {
    rt_attn_tensors t;
    const rt_attn_bufs one = {.q = qb, .k = kb, .v = vb, .o = o1, .lse = l1};
    assert_int_equal(rt_attn(&t, &one, pc.dtype, odt, B, N, H, Hkv, D), RDA_OK);
    size_t wsb = 0;
    assert_int_equal(rda_plan_workspace_size(rc->plan, B, N, &wsb), RDA_OK);
    void *ws = aalloc(wsb);
    const int lse_out = rc->with_lse || rc->backward;
    if (rda_forward(rc->plan, &t.q, &t.k, &t.v, &t.o, lse_out ? &t.lse : NULL, ws, wsb, NULL) !=
        RDA_OK)
      fail_msg("%s: rda_forward: %s", rc->what, rda_last_error(g_ctx));
    /* Without lse, rda_forward leaves it in its workspace, after the O accumulator's part
     * (none when O is fp32). */
    const size_t o_part = odt == RDA_FP32 ? 0 : (nq * 4 + 255) / 256 * 256;
    if (!lse_out) memcpy(l1, (char *)ws + o_part, nl * 4);
    free(ws);
  }

  /* Each rank's rows, poisoned outputs. */
  rda_ring_world *world = NULL;
  if (rda_ring_world_create(&world, g_ctx, P, kTimeout) != RDA_OK)
    fail_msg("%s: rda_ring_world_create: %s", rc->what, rda_last_error(g_ctx));
  rjob jobs[MAXP];
  pthread_t th[MAXP];
  memset(jobs, 0, sizeof jobs);
  for (int p = 0; p < P; ++p) {
    rjob *j = &jobs[p];
    j->rc = rc, j->world = world, j->rank = p;
    j->npieces = model_rows(N, P, rc->layout, p, j->lo, j->hi);
    for (int i = 0; i < j->npieces; ++i) j->R += j->hi[i] - j->lo[i];
    const long long R = j->R;
    const size_t lq = (size_t)(B * R * H * D), lk = (size_t)(B * R * Hkv * D),
                 ll = (size_t)(B * H * R);
    if (R == 0) continue; /* no rows: every tensor empty, its data NULL */
    if (rc->fused) {
      const long long row = (H + 2 * Hkv) * D;
      j->qkv = aalloc((size_t)(B * R * row) * 2);
      j->b.q = j->qkv;
      j->b.k = (uint16_t *)j->qkv + H * D;
      j->b.v = (uint16_t *)j->qkv + (H + Hkv) * D;
    } else {
      j->b.q = aalloc(lq * 2), j->b.k = aalloc(lk * 2), j->b.v = aalloc(lk * 2);
    }
    j->b.dout = aalloc(lq * 2);
    j->b.o = aalloc(lq * 4), j->b.lse = aalloc(ll * 4), j->b.dlse = aalloc(ll * 4);
    j->b.dq = aalloc(lq * 4), j->b.dk = aalloc(lk * 4), j->b.dv = aalloc(lk * 4);
    rt_poison_f32(j->b.o, lq), rt_poison_f32(j->b.lse, ll);
    rt_poison_f32(j->b.dq, lq), rt_poison_f32(j->b.dk, lk), rt_poison_f32(j->b.dv, lk);
    long long at = 0;
    for (int i = 0; i < j->npieces; at += j->hi[i] - j->lo[i], ++i) {
      const long long pq = rc->fused ? (H + 2 * Hkv) * D : H * D;
      const long long pk = rc->fused ? (H + 2 * Hkv) * D : Hkv * D;
      copy_rows_p(qb, j->b.q, B, N, R, H * D, pq, 2, j->lo[i], j->hi[i], at, 0);
      copy_rows_p(kb, j->b.k, B, N, R, Hkv * D, pk, 2, j->lo[i], j->hi[i], at, 0);
      copy_rows_p(vb, j->b.v, B, N, R, Hkv * D, pk, 2, j->lo[i], j->hi[i], at, 0);
      copy_rows(dob, j->b.dout, B, N, R, H * D, 2, j->lo[i], j->hi[i], at, 0);
      copy_lse_rows(dlsef, j->b.dlse, B, H, N, R, j->lo[i], j->hi[i], at, 0);
    }
  }
  for (int p = 0; p < P; ++p)
    assert_int_equal(pthread_create(&th[p], NULL, rank_main, &jobs[p]), 0);
  for (int p = 0; p < P; ++p) pthread_join(th[p], NULL);
  rda_ring_world_destroy(world);

  /* The ring plan, for the bytes every rank must have moved. */
  rda_err err = {0};
  rda_ring_plan *rp = NULL;
  assert_int_equal(rda_ring_plan_create(&c, N, P, rc->layout, &rp, &err), RDA_OK);

  /* Gather. */
  void *og = aalloc(nq * 4);
  float *lg = aalloc(nl * 4), *dqg = aalloc(nq * 4), *dkg = aalloc(nk * 4), *dvg = aalloc(nk * 4);
  rt_poison_f32(og, nq), rt_poison_f32(lg, nl);
  for (int p = 0; p < P; ++p) {
    rjob *j = &jobs[p];
    if (j->create_s != RDA_OK || j->fwd_s != RDA_OK || (rc->backward && j->bwd_s != RDA_OK))
      fail_msg("%s: rank %d: create %d, forward %d, backward %d: %s", rc->what, p, j->create_s,
               j->fwd_s, j->bwd_s, j->msg);
    /* rda_ring_rows agrees with the layout. */
    assert_int_equal(j->got_rows, j->R);
    assert_int_equal(j->got_npieces, j->npieces);
    for (int i = 0; i < j->npieces; ++i) {
      assert_int_equal(j->got_lo[i], j->lo[i]);
      assert_int_equal(j->got_hi[i], j->hi[i]);
    }
    /* Stats: the plan's bytes times the batch, held memory within the workspace. */
    const rda_ring_rank *rk = rda_ring_plan_rank(rp, p);
    const rda_ring_stats *st = rc->backward ? &j->bwd_stats : &j->fwd_stats;
    assert_int_equal(j->fwd_stats.rows, j->R);
    assert_int_equal(j->fwd_stats.bytes_sent, rk->bytes_sent * (uint64_t)B);
    assert_int_equal(j->fwd_stats.bytes_received, rk->bytes_received * (uint64_t)B);
    /* The workspace is the single device's for the rank's rows plus what the ring holds. */
    size_t single = 0;
    if (j->R > 0) assert_int_equal(rda_plan_workspace_size(rc->plan, B, j->R, &single), RDA_OK);
    assert_int_equal(j->ws_fwd, single + j->fwd_stats.peak_bytes);
    if (j->R == 0) /* a rank without rows moves and holds nothing */
      assert_int_equal(j->fwd_stats.bytes_sent + j->fwd_stats.bytes_received + j->ws_fwd, 0);
    assert_true(j->fwd_stats.bytes_received == 0 || j->fwd_stats.peak_bytes > 0);
    if (rc->backward) {
      if (j->R > 0)
        assert_int_equal(rda_plan_backward_workspace_size(rc->plan, B, j->R, &single), RDA_OK);
      assert_int_equal(j->ws_bwd, single + st->peak_bytes);
      if (j->R == 0) assert_int_equal(st->bytes_sent + st->bytes_received + j->ws_bwd, 0);
      assert_true(st->peak_bytes >= j->fwd_stats.peak_bytes); /* + the gradient blocks */
      assert_true(st->bytes_sent >= j->fwd_stats.bytes_sent); /* K/V out, and gradients back */
    }
    if (P == 1) assert_int_equal(j->fwd_stats.bytes_sent + j->fwd_stats.bytes_received, 0);
    const long long R = j->R;
    long long at = 0;
    for (int i = 0; i < j->npieces; at += j->hi[i] - j->lo[i], ++i) {
      copy_rows(og, j->b.o, B, N, R, H * D, oel, j->lo[i], j->hi[i], at, 1);
      if (rc->with_lse || rc->backward)
        copy_lse_rows(lg, j->b.lse, B, H, N, R, j->lo[i], j->hi[i], at, 1);
      if (rc->backward) {
        copy_rows(dqg, j->b.dq, B, N, R, H * D, 4, j->lo[i], j->hi[i], at, 1);
        copy_rows(dkg, j->b.dk, B, N, R, Hkv * D, 4, j->lo[i], j->hi[i], at, 1);
        copy_rows(dvg, j->b.dv, B, N, R, Hkv * D, 4, j->lo[i], j->hi[i], at, 1);
      }
    }
  }
  uint64_t sent = 0, received = 0;
  for (int p = 0; p < P; ++p)
    sent += jobs[p].fwd_stats.bytes_sent, received += jobs[p].fwd_stats.bytes_received;
  assert_true(sent == received);
  assert_true(P == 1 || sent > 0); /* every case here has segments across ranks */

  /* Ring vs single device, and vs the float64 reference. */
  double *od = malloc(nq * sizeof *od), *o1d = malloc(nq * sizeof *o1d);
  assert_true(od != NULL && o1d != NULL);
  o_to_double(og, odt, nq, od);
  o_to_double(o1, odt, nq, o1d);
  char what[256];
  snprintf(what, sizeof what, "%s: ring O vs single-device O", rc->what);
  assert_true(rt_check_rel_l2(what, od, o1d, nq, tol.o_rel_l2));
  double *o_ref, *lse_ref;
  rt_reference(&c, B, N, q, k, v, &o_ref, &lse_ref);
  float *of = aalloc(nq * 4);
  for (size_t i = 0; i < nq; ++i) of[i] = (float)od[i];
  long long os[3], ls[2] = {H * N, N};
  rt_strides_contig(N, H, D, os);
  snprintf(what, sizeof what, "%s: ring vs reference", rc->what);
  if (rc->with_lse || rc->backward) {
    snprintf(what, sizeof what, "%s: ring LSE vs single-device LSE", rc->what);
    assert_true(rt_check_lse_close(what, lg, l1, nl, tol.lse_abs));
    snprintf(what, sizeof what, "%s: ring vs reference", rc->what);
    assert_true(rt_check_fwd(what, &c, B, N, of, os, lg, ls, o_ref, lse_ref, NULL));
  } else {
    /* The single device's LSE (from its workspace) stands in: O is what is checked here. */
    assert_true(rt_check_fwd(what, &c, B, N, of, os, l1, ls, o_ref, lse_ref, NULL));
  }

  if (rc->backward) {
    /* The single-device backward on the same inputs. */
    float *dq1 = aalloc(nq * 4), *dk1 = aalloc(nk * 4), *dv1 = aalloc(nk * 4);
    rt_poison_f32(dq1, nq), rt_poison_f32(dk1, nk), rt_poison_f32(dv1, nk);
    const rt_attn_bufs one = {qb, kb, vb, o1, l1, dob, dlsef, dq1, dk1, dv1};
    rt_attn_tensors t;
    assert_int_equal(rt_attn(&t, &one, pc.dtype, RDA_FP32, B, N, H, Hkv, D), RDA_OK);
    size_t wsb = 0;
    assert_int_equal(rda_plan_backward_workspace_size(rc->plan, B, N, &wsb), RDA_OK);
    void *ws = aalloc(wsb);
    if (rda_backward(rc->plan, &t.q, &t.k, &t.v, &t.o, &t.lse, &t.dout,
                     rc->with_dlse ? &t.dlse : NULL, &t.dq, &t.dk, &t.dv, ws, wsb, NULL) != RDA_OK)
      fail_msg("%s: rda_backward: %s", rc->what, rda_last_error(g_ctx));
    free(ws);
    double *a = malloc(nq * sizeof *a), *e = malloc(nq * sizeof *e);
    assert_true(a != NULL && e != NULL);
    const float *ring_g[3] = {dqg, dkg, dvg}, *one_g[3] = {dq1, dk1, dv1};
    static const char *const gname[3] = {"dQ", "dK", "dV"};
    for (int g = 0; g < 3; ++g) {
      const size_t cnt = g == 0 ? nq : nk;
      for (size_t i = 0; i < cnt; ++i) a[i] = ring_g[g][i], e[i] = one_g[g][i];
      snprintf(what, sizeof what, "%s: ring %s vs single-device", rc->what, gname[g]);
      assert_true(rt_check_rel_l2(what, a, e, cnt, tol.grad_rel_l2));
    }
    double *dq_ref, *dk_ref, *dv_ref;
    rt_reference_bwd(&c, B, N, q, k, v, dout, rc->with_dlse ? dlse : NULL, &dq_ref, &dk_ref,
                     &dv_ref);
    long long gs[3];
    rt_strides_contig(N, Hkv, D, gs);
    snprintf(what, sizeof what, "%s: ring gradients vs reference", rc->what);
    assert_true(
        rt_check_bwd(what, &c, B, N, dqg, qs, dkg, gs, dvg, gs, dq_ref, dk_ref, dv_ref, NULL));
    free(dq_ref), free(dk_ref), free(dv_ref), free(a), free(e), free(dq1), free(dk1), free(dv1);
  }

  for (int p = 0; p < P; ++p) {
    rjob *j = &jobs[p];
    if (j->qkv != NULL)
      free(j->qkv);
    else
      free(j->b.q), free(j->b.k), free(j->b.v);
    free(j->b.o), free(j->b.lse), free(j->b.dout), free(j->b.dlse);
    free(j->b.dq), free(j->b.dk), free(j->b.dv);
  }
  rda_ring_plan_destroy(rp);
  free(od), free(o1d), free(o_ref), free(lse_ref), free(of), free(og), free(lg);
  free(dqg), free(dkg), free(dvg), free(o1), free(l1);
  free(q), free(k), free(v), free(dout), free(dlse), free(dlsef);
  free(qb), free(kb), free(vb), free(dob);
}

/* ------------------------------------------------------------------ forward and backward */

static void test_ring_forward_matches_single_device_contiguous(void **state) {
  (void)state;
  const rcase cases[] = {
      {"P=1 bf16 O, lse", g_plan_a, 1, RDA_LAYOUT_CONTIGUOUS, 2, 37, RDA_BF16, 1, 0, 0, 0},
      {"P=2 fp32 O, no lse", g_plan_a, 2, RDA_LAYOUT_CONTIGUOUS, 2, 37, RDA_FP32, 0, 0, 0, 0},
      {"P=3 bf16 O, no lse", g_plan_a, 3, RDA_LAYOUT_CONTIGUOUS, 2, 37, RDA_BF16, 0, 0, 0, 0},
      {"P=5 fp32 O, lse", g_plan_a, 5, RDA_LAYOUT_CONTIGUOUS, 1, 37, RDA_FP32, 1, 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i]);
}

static void test_ring_forward_noncausal_dilated_block_mqa_fp16(void **state) {
  (void)state;
  const rcase cases[] = {
      {"fp16 block P=3 fp16 O, lse", g_plan_b, 3, RDA_LAYOUT_CONTIGUOUS, 2, 31, RDA_FP16, 1, 0, 0,
       0},
      {"fp16 block P=2 fp32 O, no lse", g_plan_b, 2, RDA_LAYOUT_CONTIGUOUS, 1, 31, RDA_FP32, 0, 0,
       0, 0},
      {"fp16 block P=5 fp16 O, lse", g_plan_b, 5, RDA_LAYOUT_CONTIGUOUS, 1, 33, RDA_FP16, 1, 0, 0,
       0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i]);
}

static void test_ring_forward_group_offsets_fused_qkv(void **state) {
  (void)state;
  const rcase cases[] = {
      {"group P=4 bf16 O, lse, fused", g_plan_c, 4, RDA_LAYOUT_CONTIGUOUS, 2, 27, RDA_BF16, 1, 0, 0,
       1},
      {"group zigzag P=2 fp32 O, no lse", g_plan_c, 2, RDA_LAYOUT_ZIGZAG, 1, 28, RDA_FP32, 0, 0, 0,
       0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i]);
}

static void test_ring_forward_zigzag(void **state) {
  (void)state;
  const rcase cases[] = {
      {"zigzag P=2 bf16 O, lse", g_plan_a, 2, RDA_LAYOUT_ZIGZAG, 2, 40, RDA_BF16, 1, 0, 0, 0},
      {"zigzag P=3 fp32 O, lse", g_plan_a, 3, RDA_LAYOUT_ZIGZAG, 1, 36, RDA_FP32, 1, 0, 0, 0},
      {"zigzag fp16 P=2 fp16 O, no lse", g_plan_b, 2, RDA_LAYOUT_ZIGZAG, 1, 32, RDA_FP16, 0, 0, 0,
       0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i]);
}

static void test_ring_backward_matches_single_device(void **state) {
  (void)state;
  const rcase cases[] = {
      {"backward P=2 with dlse", g_plan_a, 2, RDA_LAYOUT_CONTIGUOUS, 1, 24, RDA_FP32, 1, 1, 1, 0},
      {"backward P=3 without dlse, fused qkv", g_plan_a, 3, RDA_LAYOUT_CONTIGUOUS, 1, 29, RDA_FP32,
       1, 1, 0, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i]);
}

/* SPEC §1: any P, also more ranks than rows. The ranks past the rows hold empty tensors with
 * NULL data and no workspace; they make every call (agreement, barrier) and move nothing. */
static void test_ring_more_ranks_than_rows(void **state) {
  (void)state;
  const rcase cases[] = {
      {"P=5 over N=3, bf16 O, no lse", g_plan_a, 5, RDA_LAYOUT_CONTIGUOUS, 2, 3, RDA_BF16, 0, 0, 0,
       0},
      {"P=5 over N=2, backward with dlse", g_plan_a, 5, RDA_LAYOUT_CONTIGUOUS, 2, 2, RDA_FP32, 1, 1,
       1, 0},
      {"P=4 over N=2, backward, fused qkv", g_plan_d, 4, RDA_LAYOUT_CONTIGUOUS, 1, 2, RDA_FP32, 1, 1,
       0, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i]);
}

/* SPEC §2 allows any batch: past the grid's z limit (65535) the ring runs one pass per slice,
 * its buffers sized for one slice. The slice is lowered to 2 here (65536 entries would take
 * minutes on the emulator), so batches of 3 and 5 run 2 and 3 passes: every entry (the short
 * last slice too) is checked against the single device and float64, the bytes are the plan's
 * times the whole batch, the workspace one slice's ring buffers. */
static void test_ring_batch_past_the_slice_runs_pass_by_pass(void **state) {
  (void)state;
  const rcase cases[] = {
      {"batch 5 in slices of 2, P=2 fp16 O, no lse", g_plan_d, 2, RDA_LAYOUT_CONTIGUOUS, 5, 2,
       RDA_FP16, 0, 0, 0, 0},
      {"batch 5 in slices of 2, P=2 backward with dlse", g_plan_d, 2, RDA_LAYOUT_CONTIGUOUS, 5, 2,
       RDA_FP32, 1, 1, 1, 0},
      {"batch 3 in slices of 2, P=3 backward, fused qkv", g_plan_a, 3, RDA_LAYOUT_CONTIGUOUS, 3, 29,
       RDA_FP32, 1, 1, 0, 1},
      {"batch 3 in slices of 2, zigzag P=2 bf16 O, lse", g_plan_a, 2, RDA_LAYOUT_ZIGZAG, 3, 40,
       RDA_BF16, 1, 0, 0, 0},
  };
  rda_ring_set_batch_slice(2);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i]);
  rda_ring_set_batch_slice(0); /* the launch limit again */
  assert_int_equal(rda_ring_batch_slice(), 65535);
}

/* ------------------------------------------------------------------ creation failures */

/* One rank's rda_ring_create in a thread (with its own n and plan). */
typedef struct cjob {
  rda_plan *plan;
  rda_ring_world *world;
  long long n;
  int P, rank, layout;
  rda_status s;
  char msg[1024];
  double t_start, t_end; /* rt_now_s() around its rda_ring_create */
  rda_ring **keep;       /* NULL: the ring is destroyed at once; else it is left here */
} cjob;

static void *create_main(void *arg) {
  cjob *j = arg;
  rda_ring_desc d = RDA_RING_DESC_INIT;
  d.n = j->n, d.ranks = j->P, d.rank = j->rank, d.layout = (rda_ring_layout)j->layout;
  d.world = j->world;
  rda_ring *ring = NULL;
  j->t_start = rt_now_s();
  j->s = rda_ring_create(&ring, j->plan, &d);
  j->t_end = rt_now_s();
  snprintf(j->msg, sizeof j->msg, "%s", j->s == RDA_OK ? "" : rda_last_error(NULL));
  if (j->s != RDA_OK && ring != NULL) j->s = RDA_ERR_INTERNAL; /* *out must be NULL */
  if (j->keep != NULL && j->s == RDA_OK)
    *j->keep = ring;
  else
    rda_ring_destroy(ring);
  return NULL;
}

/* When the last of n ranks called rda_ring_create. The bounds below time each rank from there:
 * they time the library, not a thread the machine started late (which delays every rank's
 * join, as a late process would delay a real ring's). */
static double cjobs_last_start(const cjob *jobs, int n) {
  double last = 0.0;
  for (int p = 0; p < n; ++p) last = jobs[p].t_start > last ? jobs[p].t_start : last;
  return last;
}

/* P ranks create a ring; rank `odd` uses plan2 / n2. Every rank must fail with a fingerprint
 * mismatch, well before the timeout (once every rank has called: cjobs_last_start). */
static void expect_mismatch(const char *what, int P, int odd, rda_plan *plan2, long long n2) {
  rda_ring_world *world = NULL;
  assert_int_equal(rda_ring_world_create(&world, g_ctx, P, kTimeout), RDA_OK);
  cjob jobs[MAXP];
  pthread_t th[MAXP];
  memset(jobs, 0, sizeof jobs);
  for (int p = 0; p < P; ++p) {
    jobs[p] = (cjob){g_plan_a, world, 30, P, p, RDA_LAYOUT_CONTIGUOUS, RDA_OK, "", 0, 0, NULL};
    if (p == odd) jobs[p].plan = plan2, jobs[p].n = n2;
    assert_int_equal(pthread_create(&th[p], NULL, create_main, &jobs[p]), 0);
  }
  for (int p = 0; p < P; ++p) pthread_join(th[p], NULL);
  for (int p = 0; p < P; ++p) {
    /* The calls disagree: not a transport failure (over NCCL, the status that says a
     * caller's communicator was aborted). */
    if (jobs[p].s != RDA_ERR_INVALID_ARGUMENT)
      fail_msg("%s: rank %d: status %d (%s), expected RDA_ERR_INVALID_ARGUMENT", what, p, jobs[p].s,
               jobs[p].msg);
    assert_one_line_naming(jobs[p].msg, "fingerprint mismatch");
    assert_one_line_naming(jobs[p].msg, "rda_ring_create");
    const double took = jobs[p].t_end - cjobs_last_start(jobs, P);
    if (took > kTimeout / 2) fail_msg("%s: rank %d took %.1f s", what, p, took);
  }
  rda_ring_world_destroy(world);
}

static void test_ring_fingerprint_mismatch_fails_every_rank(void **state) {
  (void)state;
  expect_mismatch("different N on rank 1", 3, 1, g_plan_a, 31);
  expect_mismatch("different config on rank 2", 3, 2, g_plan_b, 30);
}

/* P ranks create a ring; rank `bad` alone has n = n_bad (0: no plan instead), which its own
 * checks (or its plan) refuse. It must fail naming `names`, and abort the world: every other
 * rank fails well before the timeout (once every rank has called: cjobs_last_start), naming the
 * bad rank and its reason, instead of waiting for it to join. */
static void expect_bad_rank(const char *what, int P, int bad, long long n_bad, const char *names) {
  rda_ring_world *world = NULL;
  assert_int_equal(rda_ring_world_create(&world, g_ctx, P, kTimeout), RDA_OK);
  cjob jobs[MAXP];
  pthread_t th[MAXP];
  memset(jobs, 0, sizeof jobs);
  for (int p = 0; p < P; ++p) {
    jobs[p] = (cjob){g_plan_a, world, 30, P, p, RDA_LAYOUT_CONTIGUOUS, RDA_OK, "", 0, 0, NULL};
    if (p == bad && n_bad == 0) jobs[p].plan = NULL;
    if (p == bad && n_bad != 0) jobs[p].n = n_bad;
    assert_int_equal(pthread_create(&th[p], NULL, create_main, &jobs[p]), 0);
  }
  for (int p = 0; p < P; ++p) pthread_join(th[p], NULL);
  char culprit[32];
  snprintf(culprit, sizeof culprit, "rank %d: ", bad);
  for (int p = 0; p < P; ++p) {
    const rda_status want = p == bad ? RDA_ERR_INVALID_ARGUMENT : RDA_ERR_NCCL;
    if (jobs[p].s != want)
      fail_msg("%s: rank %d: status %d (%s), expected %d", what, p, jobs[p].s, jobs[p].msg, want);
    assert_one_line_naming(jobs[p].msg, "rda_ring_create");
    assert_one_line_naming(jobs[p].msg, names);
    if (p != bad) {
      assert_one_line_naming(jobs[p].msg, "the ring was aborted");
      assert_one_line_naming(jobs[p].msg, culprit);
    }
    const double took = jobs[p].t_end - cjobs_last_start(jobs, P);
    if (took > kTimeout / 4)
      fail_msg("%s: rank %d took %.1f s (timeout %.1f s)", what, p, took, kTimeout);
  }
  rda_ring_world_destroy(world);
}

static void test_ring_bad_desc_on_one_rank_fails_every_rank(void **state) {
  (void)state;
  expect_bad_rank("N < 1 on rank 1", 3, 1, -1, "desc->n = -1: must be >= 1");
  expect_bad_rank("N beyond the ring plan's cap on rank 2", 3, 2, RDA_RING_MAX_N + 1,
                  "desc->n = 1099511627777: must be at most 2^40");
  expect_bad_rank("N < 1 on rank 0 of 2", 2, 0, -5, "desc->n = -5");
  expect_bad_rank("no plan on rank 1", 3, 1, 0, "plan is NULL");
}

static void test_ring_create_rejects_bad_desc(void **state) {
  (void)state;
  rda_ring_world *w3 = NULL, *w2 = NULL;
  assert_int_equal(rda_ring_world_create(&w3, g_ctx, 3, kTimeout), RDA_OK);
  assert_int_equal(rda_ring_world_create(&w2, g_ctx, 2, kTimeout), RDA_OK);
  rda_ring *ring = (rda_ring *)(uintptr_t)1;
  const rda_ring_desc good = {
      sizeof(rda_ring_desc), 30, 3, 0, RDA_LAYOUT_CONTIGUOUS, 0.0, w3, NULL, NULL, NULL};
  static const unsigned char id[128] = {1};
  int comm = 0;
  struct {
    const char *names;
    rda_status want;
    rda_ring_desc d;
  } bad[] = {
      {"desc->struct_size", RDA_ERR_INVALID_ARGUMENT, good},
      {"none of world, nccl_comm and nccl_unique_id", RDA_ERR_INVALID_ARGUMENT, good},
      {"two of world, nccl_comm and nccl_unique_id", RDA_ERR_INVALID_ARGUMENT, good},
      {"desc->rank = 3", RDA_ERR_INVALID_ARGUMENT, good},
      {"desc->rank = -1", RDA_ERR_INVALID_ARGUMENT, good},
      {"desc->ranks = 0", RDA_ERR_INVALID_ARGUMENT, good},
      {"desc->n = 0: must be >= 1", RDA_ERR_INVALID_ARGUMENT, good},
      {"desc->layout = 7", RDA_ERR_INVALID_ARGUMENT, good},
      {"desc->timeout_s = -1", RDA_ERR_INVALID_ARGUMENT, good},
      {"desc->ranks = 2: the world has 3 ranks", RDA_ERR_INVALID_ARGUMENT, good},
      {"NCCL needs a cuda context", RDA_ERR_UNSUPPORTED, good},
      {"NCCL needs a cuda context", RDA_ERR_UNSUPPORTED, good},
      {"desc->n = 31: the zigzag layout", RDA_ERR_INVALID_ARGUMENT, good},
  };
  bad[0].d.struct_size -= 8;
  bad[1].d.world = NULL;
  bad[2].d.nccl_unique_id = id;
  bad[3].d.rank = 3;
  bad[4].d.rank = -1;
  bad[5].d.ranks = 0;
  bad[6].d.n = 0; /* P > N is fine (empty ranks), N < 1 is not */
  bad[7].d.layout = (rda_ring_layout)7;
  bad[8].d.timeout_s = -1.0;
  bad[9].d.ranks = 2;
  bad[10].d.world = NULL, bad[10].d.nccl_unique_id = id;
  bad[11].d.world = NULL, bad[11].d.nccl_comm = &comm;
  bad[12].d.n = 31, bad[12].d.layout = RDA_LAYOUT_ZIGZAG;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    ring = (rda_ring *)(uintptr_t)1;
    const rda_status s = rda_ring_create(&ring, g_plan_a, &bad[i].d);
    if (s != bad[i].want)
      fail_msg("case %zu (%s): status %d, expected %d: %s", i, bad[i].names, s, bad[i].want,
               rda_last_error(g_ctx));
    assert_null(ring);
    assert_one_line_naming(rda_last_error(g_ctx), bad[i].names);
  }
  /* Handles and NULLs. */
  assert_int_equal(rda_ring_create(NULL, g_plan_a, &good), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(g_ctx), "out is NULL");
  assert_int_equal(rda_ring_create(&ring, NULL, &good), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(NULL), "plan is NULL");
  assert_int_equal(rda_ring_create(&ring, g_plan_a, NULL), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(g_ctx), "desc is NULL");
  /* A world of another context. */
  rda_ctx *other = NULL;
  rda_ring_world *wo = NULL;
  assert_int_equal(rda_ctx_create_emulator(&other), RDA_OK);
  assert_int_equal(rda_ring_world_create(&wo, other, 3, kTimeout), RDA_OK);
  rda_ctx_destroy(other); /* the world keeps it alive */
  rda_ring_desc d = good;
  d.world = wo;
  assert_int_equal(rda_ring_create(&ring, g_plan_a, &d), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(g_ctx), "another context");
  rda_ring_world_destroy(wo);
  /* World creation. */
  rda_ring_world *w = (rda_ring_world *)(uintptr_t)1;
  assert_int_equal(rda_ring_world_create(&w, g_ctx, 0, 1.0), RDA_ERR_INVALID_ARGUMENT);
  assert_null(w);
  assert_one_line_naming(rda_last_error(g_ctx), "ranks = 0");
  assert_int_equal(rda_ring_world_create(&w, g_ctx, 4097, 1.0), RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(rda_ring_world_create(&w, g_ctx, 2, NAN), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(g_ctx), "timeout_s");
  assert_int_equal(rda_ring_world_create(&w, NULL, 2, 1.0), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(NULL), "ctx is NULL");
  assert_int_equal(rda_ring_world_create(NULL, g_ctx, 2, 1.0), RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(rda_ring_nccl_unique_id(NULL), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(NULL), "id is NULL");
  rda_ring_world_destroy(w3);
  rda_ring_world_destroy(w2);
}

/* A ring of plan on a new one-rank world (*w), desc d otherwise. */
static rda_ring *one_rank_ring(rda_plan *plan, const rda_ring_desc *d, rda_ring_world **w) {
  assert_int_equal(rda_ring_world_create(w, g_ctx, 1, kTimeout), RDA_OK);
  rda_ring_desc d1 = *d;
  d1.world = *w;
  rda_ring *r = NULL;
  assert_int_equal(rda_ring_create(&r, plan, &d1), RDA_OK);
  return r;
}

static void test_ring_handles_and_world_lifetime(void **state) {
  (void)state;
  /* A one-rank ring joins at once; its world refuses to go while the ring lives. */
  rda_ring_world *w = NULL;
  assert_int_equal(rda_ring_world_create(&w, g_ctx, 1, kTimeout), RDA_OK);
  rda_ring_desc d = RDA_RING_DESC_INIT;
  d.n = 5, d.ranks = 1, d.rank = 0, d.world = w;
  rda_ring *ring = NULL;
  const int plans = rda_api_ctx_plans(g_ctx);
  assert_int_equal(rda_ring_create(&ring, g_plan_a, &d), RDA_OK);
  rda_ring_world_destroy(w);
  assert_one_line_naming(rda_last_error(g_ctx), "still live");
  long long rows = 0, lo[2] = {-1, -1}, hi[2] = {-1, -1};
  int np = 0;
  assert_int_equal(rda_ring_rows(ring, &rows, &np, lo, hi), RDA_OK);
  assert_int_equal(rows, 5);
  assert_int_equal(np, 1);
  assert_int_equal(lo[0], 0);
  assert_int_equal(hi[0], 5);
  size_t ws = 0;
  assert_int_equal(rda_ring_workspace_size(ring, 0, 0, &ws), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(g_ctx), "batch = 0");
  assert_int_equal(rda_ring_workspace_size(ring, 1, 2, &ws), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(g_ctx), "backward = 2");
  assert_int_equal(rda_ring_workspace_size(ring, 1, 0, NULL), RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(rda_ring_workspace_size(ring, 1, 0, &ws), RDA_OK);
  size_t single = 0;
  assert_int_equal(rda_plan_workspace_size(g_plan_a, 1, 5, &single), RDA_OK);
  assert_true(ws >= single); /* the accumulator and LSE of the rank's rows, plus the ring's */
  rda_ring_stats st;
  assert_int_equal(rda_ring_get_stats(ring, &st), RDA_OK);
  assert_int_equal(st.rows, 5);
  assert_int_equal(st.bytes_sent + st.bytes_received + st.peak_bytes, 0);
  assert_int_equal(rda_ring_get_stats(ring, NULL), RDA_ERR_INVALID_ARGUMENT);
  /* One rank moves nothing: with an fp32 o and lse given the call needs no workspace at all. */
  {
    const rda_config c = internal_config(g_plan_a);
    const long long N = 5, H = 4, Hkv = 2, D = 32;
    double *q = rt_normal((size_t)(N * H * D), RDA_DTYPE_BF16);
    double *k = rt_normal((size_t)(N * Hkv * D), RDA_DTYPE_BF16);
    double *v = rt_normal((size_t)(N * Hkv * D), RDA_DTYPE_BF16);
    long long qs[3], ks[3], ls[2] = {H * N, N};
    rt_strides_contig(N, H, D, qs);
    rt_strides_contig(N, Hkv, D, ks);
    uint16_t *qb = rt_make_bits(q, 1, N, H, D, qs, RDA_DTYPE_BF16, NULL);
    uint16_t *kb = rt_make_bits(k, 1, N, Hkv, D, ks, RDA_DTYPE_BF16, NULL);
    uint16_t *vb = rt_make_bits(v, 1, N, Hkv, D, ks, RDA_DTYPE_BF16, NULL);
    float *o = aalloc((size_t)(N * H * D) * 4), *l = aalloc((size_t)(H * N) * 4);
    rt_poison_f32(o, (size_t)(N * H * D)), rt_poison_f32(l, (size_t)(H * N));
    rt_attn_tensors t;
    const rt_attn_bufs one = {.q = qb, .k = kb, .v = vb, .o = o, .lse = l};
    assert_int_equal(rt_attn(&t, &one, RDA_BF16, RDA_FP32, 1, N, H, Hkv, D), RDA_OK);
    if (rda_ring_forward(ring, &t.q, &t.k, &t.v, &t.o, &t.lse, NULL, 0, NULL) != RDA_OK)
      fail_msg("P=1 forward: %s", rda_last_error(g_ctx));
    double *o_ref, *lse_ref;
    rt_reference(&c, 1, N, q, k, v, &o_ref, &lse_ref);
    assert_true(
        rt_check_fwd("P=1 ring, no workspace", &c, 1, N, o, qs, l, ls, o_ref, lse_ref, NULL));
    /* A storage-dtype o needs the accumulator. */
    t.o.dtype = RDA_BF16;
    assert_int_equal(rda_ring_forward(ring, &t.q, &t.k, &t.v, &t.o, &t.lse, NULL, 0, NULL),
                     RDA_ERR_INVALID_ARGUMENT);
    assert_one_line_naming(rda_last_error(g_ctx), "rda_ring_forward: workspace is NULL");
    free(q), free(k), free(v), free(qb), free(kb), free(vb), free(o), free(l);
    free(o_ref), free(lse_ref);
  }
  /* The caller's plan may go first: the ring holds its own reference. */
  rda_plan *p = NULL;
  const rda_attn_config cb = config_b(); /* forward only */
  assert_int_equal(rda_plan_create(&p, g_ctx, &cb, RDA_PLAN_FORWARD), RDA_OK);
  rda_ring_world *w1 = NULL;
  rda_ring *r2 = one_rank_ring(p, &d, &w1);
  rda_plan_destroy(p);
  assert_int_equal(rda_ring_workspace_size(r2, 1, 1, &ws), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(g_ctx), "RDA_PLAN_WITH_BACKWARD");
  assert_int_equal(rda_ring_backward(r2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                     NULL, 0, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(g_ctx), "rda_ring_backward: the plan was created without");
  /* That failure aborted the ring: every later call fails. */
  assert_int_equal(rda_ring_forward(r2, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL), RDA_ERR_NCCL);
  assert_one_line_naming(rda_last_error(g_ctx), "rda_ring_forward: rank 0: the ring was aborted");
  rda_ring_destroy(r2);
  rda_ring_world_destroy(w1);
  rda_ring_destroy(ring);
  rda_ring_world_destroy(w);
  assert_int_equal(rda_api_ctx_plans(g_ctx), plans);
  /* NULL and dead handles. */
  rda_ring_destroy(NULL);
  rda_ring_world_destroy(NULL);
  rda_ring_abort(NULL, "x");
  /* A reason of several lines is one line in every message it reaches. */
  rda_ring_world *w2 = NULL;
  rda_ring *r3 = one_rank_ring(g_plan_a, &d, &w2);
  rda_ring_abort(r3, "stop\nnow\r\tplease");
  assert_int_equal(rda_ring_forward(r3, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL), RDA_ERR_NCCL);
  assert_one_line_naming(rda_last_error(g_ctx), "stop now  please");
  rda_ring_destroy(r3);
  rda_ring_world_destroy(w2);
  assert_int_equal(rda_ring_rows(NULL, &rows, NULL, NULL, NULL), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(NULL), "rda_ring_rows: ring is NULL");
  assert_int_equal(rda_ring_forward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(rda_ring_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                     NULL, NULL, 0, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(rda_ring_get_stats(NULL, &st), RDA_ERR_INVALID_ARGUMENT);
  rda_ring *fake = (rda_ring *)(void *)&st; /* not a ring: refused by magic */
  assert_int_equal(rda_ring_rows(fake, &rows, NULL, NULL, NULL), RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(rda_last_error(NULL), "not a live rda_ring");
}

/* ------------------------------------------------------------------ call failures and abort */

/* A P-rank forward where rank `bad` misbehaves as `how` says; every rank must fail in time. */
enum {
  kSmallWorkspace = 1,
  kWrongRows = 2,
  kAbortInstead = 3,
  kOtherBatch = 4,
  kLeaveInstead = 5,
  kCastFails = 6 /* after a pass that succeeded on every rank */
};

/* Nothing on the CPU makes the cast of a rank's output after its pass fail, so the test binary
 * is linked with -Wl,--wrap=rda_api_cast: the cast fails on a thread that sets this. */
static _Thread_local int t_fail_cast;

rda_status __real_rda_api_cast(const rda_plan *plan, const float *acc, const long long acc_s[3],
                               const rda_tensor *o, long long batch, long long n, rda_err *err);
rda_status __wrap_rda_api_cast(const rda_plan *plan, const float *acc, const long long acc_s[3],
                               const rda_tensor *o, long long batch, long long n, rda_err *err);

rda_status __wrap_rda_api_cast(const rda_plan *plan, const float *acc, const long long acc_s[3],
                               const rda_tensor *o, long long batch, long long n, rda_err *err) {
  if (t_fail_cast) return rda_err_set(err, RDA_ERR_CUDA, "injected: the output cast failed");
  return __real_rda_api_cast(plan, acc, acc_s, o, batch, n, err);
}

typedef struct fjob {
  rda_ring_world *world;
  int P, rank, bad, how;
  long long N;
  rda_status create_s, s, s_after;
  char msg[1024], msg_after[1024];
  double t_start, t_end; /* rt_now_s() around its first call (0: it made none) */
  pthread_mutex_t *mu;
  pthread_cond_t *cv;
  rda_ring **rings; /* for the abort from the main thread */
  int *created;
} fjob;

/* One rank's forward call on a ring of config_a's shape: its rows (plus `extra`) of random
 * inputs, fp32 outputs (bf16 ones with o_bf16: cast from the pass's fp32), its workspace. */
typedef struct fcall {
  double *x;
  uint16_t *q, *kv;
  float *o, *lse;
  void *ws;
  size_t wsb;
  rda_tensor tq, tk, to, tl;
} fcall;

/* Inputs drawn from the calling rank's own generator: rank threads make them at once. */
static void fcall_make(fcall *c, rda_ring *ring, int rank, long long B, long long extra,
                       int o_bf16) {
  long long R = 0;
  rda_ring_rows(ring, &R, NULL, NULL, NULL);
  R += extra;
  const long long H = 4, Hkv = 2, D = 32;
  long long s3[3];
  rt_rng rng;
  rt_rng_seed(&rng, rt_seed_value() + 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1));
  c->x = rt_normal_from(&rng, (size_t)(B * R * H * D), RDA_DTYPE_BF16);
  rt_strides_contig(R, H, D, s3);
  c->q = rt_make_bits(c->x, B, R, H, D, s3, RDA_DTYPE_BF16, NULL);
  rt_strides_contig(R, Hkv, D, s3);
  c->kv = rt_make_bits(c->x, B, R, Hkv, D, s3, RDA_DTYPE_BF16, NULL);
  c->o = aalloc((size_t)(B * R * H * D) * 4), c->lse = aalloc((size_t)(B * H * R) * 4);
  rt_tensor4(&c->tq, c->q, RDA_BF16, B, R, H, D);
  rt_tensor4(&c->tk, c->kv, RDA_BF16, B, R, Hkv, D);
  rt_tensor4(&c->to, c->o, o_bf16 ? RDA_BF16 : RDA_FP32, B, R, H, D);
  rt_tensor3(&c->tl, c->lse, B, H, R);
  c->wsb = 0;
  rda_ring_workspace_size(ring, B, 0, &c->wsb);
  c->ws = aalloc(c->wsb + 256);
}

/* rda_ring_forward with c's tensors; msg gets the thread's error ("" on success). */
static rda_status fcall_run(fcall *c, rda_ring *ring, char *msg, size_t cap) {
  const rda_status s =
      rda_ring_forward(ring, &c->tq, &c->tk, &c->tk, &c->to, &c->tl, c->ws, c->wsb, NULL);
  snprintf(msg, cap, "%s", s == RDA_OK ? "" : rda_last_error(NULL));
  return s;
}

static void fcall_free(fcall *c) {
  free(c->x), free(c->q), free(c->kv), free(c->o), free(c->lse), free(c->ws);
}

static void *fail_main(void *arg) {
  fjob *j = arg;
  rda_ring_desc d = RDA_RING_DESC_INIT;
  d.n = j->N, d.ranks = j->P, d.rank = j->rank, d.world = j->world;
  rda_ring *ring = NULL;
  j->create_s = rda_ring_create(&ring, g_plan_a, &d);
  if (j->create_s != RDA_OK) snprintf(j->msg, sizeof j->msg, "%s", rda_last_error(NULL));
  pthread_mutex_lock(j->mu);
  j->rings[j->rank] = ring;
  (*j->created)++; /* attempts finished */
  pthread_cond_broadcast(j->cv);
  pthread_mutex_unlock(j->mu);
  if (j->create_s != RDA_OK) return NULL;
  if (j->how == kLeaveInstead && j->rank == j->bad) {
    /* Once every rank has its ring, this one leaves without a call. */
    pthread_mutex_lock(j->mu);
    while (*j->created < j->P) pthread_cond_wait(j->cv, j->mu);
    j->rings[j->rank] = NULL;
    pthread_mutex_unlock(j->mu);
    rda_ring_destroy(ring);
    return NULL;
  }
  /* kWrongRows: one row too many; kOtherBatch: a call that is right on its own rank, with a
   * batch the others do not use. */
  fcall c;
  fcall_make(&c, ring, j->rank, j->how == kOtherBatch && j->rank == j->bad ? 2 : 1,
             j->how == kWrongRows && j->rank == j->bad, j->how == kCastFails);
  if (j->how == kSmallWorkspace && j->rank == j->bad) c.wsb = 64; /* the ring needs more */
  j->t_start = rt_now_s();
  if (j->how == kAbortInstead && j->rank == j->bad) {
    /* This rank never calls: the main thread aborts the ring through its handle. */
    pthread_mutex_lock(j->mu);
    while (*j->created >= 0) pthread_cond_wait(j->cv, j->mu); /* -1: aborted */
    pthread_mutex_unlock(j->mu);
  }
  t_fail_cast = j->how == kCastFails && j->rank == j->bad;
  j->s = fcall_run(&c, ring, j->msg, sizeof j->msg);
  t_fail_cast = 0;
  j->t_end = rt_now_s();
  /* The ring stays failed. */
  c.wsb += 1;
  j->s_after = fcall_run(&c, ring, j->msg_after, sizeof j->msg_after);
  pthread_mutex_lock(j->mu);
  j->rings[j->rank] = NULL;
  pthread_mutex_unlock(j->mu);
  rda_ring_destroy(ring);
  fcall_free(&c);
  return NULL;
}

static void run_failure(const char *what, int P, long long N, int bad, int how,
                        rda_status bad_status, const char *bad_names, rda_status others_status,
                        const char *others_name) {
  rda_ring_world *world = NULL;
  assert_int_equal(rda_ring_world_create(&world, g_ctx, P, kTimeout), RDA_OK);
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  rda_ring *rings[MAXP] = {0};
  int created = 0;
  fjob jobs[MAXP];
  pthread_t th[MAXP];
  memset(jobs, 0, sizeof jobs);
  for (int p = 0; p < P; ++p) {
    fjob *j = &jobs[p];
    j->world = world, j->P = P, j->rank = p, j->bad = bad, j->how = how, j->N = N;
    j->mu = &mu, j->cv = &cv, j->rings = rings, j->created = &created;
    assert_int_equal(pthread_create(&th[p], NULL, fail_main, j), 0);
  }
  if (how == kAbortInstead) {
    /* From this thread, once every rank has its ring, while the others are in their calls. */
    pthread_mutex_lock(&mu);
    while (created < P) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    usleep(200 * 1000);
    assert_non_null(rings[bad]);
    rda_ring_abort(rings[bad], "the test pulls the plug");
    pthread_mutex_lock(&mu);
    created = -1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
  }
  for (int p = 0; p < P; ++p) pthread_join(th[p], NULL);
  rda_ring_world_destroy(world);
  double last = 0.0; /* when the last call began: each rank is timed from there (as above) */
  for (int p = 0; p < P; ++p) last = jobs[p].t_start > last ? jobs[p].t_start : last;
  for (int p = 0; p < P; ++p) {
    fjob *j = &jobs[p];
    if (j->create_s != RDA_OK) {
      /* A fast failing rank may abort the ring before a slow one has returned from joining:
       * that rank's create fails instead, the same way. */
      if (p == bad || how == kAbortInstead || j->create_s != RDA_ERR_NCCL)
        fail_msg("%s: rank %d: create: %s", what, p, j->msg);
      assert_one_line_naming(j->msg, others_name);
      continue;
    }
    if (p == bad && how == kLeaveInstead) continue; /* it made no call */
    const rda_status want = p == bad ? bad_status : others_status;
    if (j->s != want)
      fail_msg("%s: rank %d: status %d, expected %d: %s", what, p, j->s, want, j->msg);
    assert_one_line_naming(j->msg, p == bad ? bad_names : others_name);
    assert_one_line_naming(j->msg, "rda_ring_forward");
    if (j->t_end - last > kTimeout * 0.8)
      fail_msg("%s: rank %d failed only after %.1f s (timeout %.1f s)", what, p, j->t_end - last,
               kTimeout);
    assert_int_equal(j->s_after, RDA_ERR_NCCL);
    assert_one_line_naming(j->msg_after, "aborted");
    const char *once = strstr(j->msg_after, "the ring was aborted");
    if (once != NULL && strstr(once + 1, "the ring was aborted") != NULL)
      fail_msg("%s: rank %d: the later call says it twice: %s", what, p, j->msg_after);
  }
}

static void test_ring_call_errors_fail_every_rank(void **state) {
  (void)state;
  /* The others learn it from the pass's agreement (over NCCL, where the abort stays on its
   * rank, that is how they learn it at once), so their error names the rank and its status. */
  run_failure("small workspace on rank 0", 3, 29, 0, kSmallWorkspace, RDA_ERR_INVALID_ARGUMENT,
              "workspace_bytes", RDA_ERR_NCCL,
              "aborted: rank 0 failed before the ring forward pass (RDA_ERR_INVALID_ARGUMENT");
  run_failure("wrong row count on rank 1", 2, 20, 1, kWrongRows, RDA_ERR_INVALID_ARGUMENT,
              "q->shape[1] = 11", RDA_ERR_NCCL,
              "aborted: rank 1 failed before the ring forward pass (RDA_ERR_INVALID_ARGUMENT");
}

/* A rank that fails after its pass (the cast of its output) fails the call on every rank: the
 * closing agreement carries its failure word, so a rank whose part went well does not return
 * success beside it. */
static void test_ring_failure_after_the_pass_fails_every_rank(void **state) {
  (void)state;
  run_failure("cast fails on rank 1 of 3", 3, 29, 1, kCastFails, RDA_ERR_CUDA,
              "injected: the output cast failed", RDA_ERR_NCCL,
              "aborted: rank 1 failed in rda_ring_forward (RDA_ERR_CUDA");
}

/* Calls that are each right on their own rank but differ between ranks (here the batch) are
 * one clear error on every rank, found before any transfer: over NCCL, sends and receives of
 * different sizes would have no defined outcome. */
static void test_ring_calls_that_differ_fail_every_rank(void **state) {
  (void)state;
  run_failure("batch 2 on rank 1 of 3", 3, 29, 1, kOtherBatch, RDA_ERR_INVALID_ARGUMENT,
              "rank 0 runs the forward pass with batch 1, rank 1 the forward pass with batch 2",
              RDA_ERR_INVALID_ARGUMENT,
              "rank 0 runs the forward pass with batch 1, rank 1 the forward pass with batch 2");
}

/* A rank that leaves (destroys its ring) before calling: no call of the others can complete,
 * so they fail at once naming it, not by their timeout. */
static void test_ring_rank_that_leaves_fails_the_others_at_once(void **state) {
  (void)state;
  run_failure("rank 1 leaves", 3, 29, 1, kLeaveInstead, RDA_OK, "", RDA_ERR_NCCL,
              "rank 1: left the ring");
}

/* Misuse that must leave a working ring alone: two calls on rank 0's ring at once (the first
 * to claim it waits in the pass's agreement for rank 1, which calls only once the other has
 * returned, refused), and a second ring for rank 0 on the world meanwhile. Both are refused at
 * once; then rank 1 calls and the first call succeeds with it. No sleep decides the order. */
typedef struct ocall {
  rda_ring *ring;
  fcall c;
  rda_status s;
  char msg[1024];
  int done;
  pthread_mutex_t *mu;
  pthread_cond_t *cv;
} ocall;

static void *ocall_main(void *arg) {
  ocall *o = arg;
  const rda_status s = fcall_run(&o->c, o->ring, o->msg, sizeof o->msg);
  pthread_mutex_lock(o->mu);
  o->s = s, o->done = 1;
  pthread_cond_broadcast(o->cv);
  pthread_mutex_unlock(o->mu);
  return NULL;
}

static void test_ring_overlapping_call_and_second_ring_leave_it_alone(void **state) {
  (void)state;
  rda_ring_world *world = NULL;
  assert_int_equal(rda_ring_world_create(&world, g_ctx, 2, 60.0), RDA_OK);
  cjob cj[2];
  pthread_t th[3];
  rda_ring *rings[2] = {NULL, NULL};
  for (int p = 0; p < 2; ++p) {
    memset(&cj[p], 0, sizeof cj[p]);
    cj[p].plan = g_plan_a, cj[p].world = world, cj[p].n = 20, cj[p].P = 2, cj[p].rank = p;
    cj[p].keep = &rings[p];
    assert_int_equal(pthread_create(&th[p], NULL, create_main, &cj[p]), 0);
  }
  for (int p = 0; p < 2; ++p) pthread_join(th[p], NULL);
  for (int p = 0; p < 2; ++p)
    if (cj[p].s != RDA_OK) fail_msg("create rank %d: %s", p, cj[p].msg);
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  ocall oc[3]; /* two calls of rank 0, one of rank 1 */
  for (int i = 0; i < 3; ++i) {
    memset(&oc[i], 0, sizeof oc[i]);
    oc[i].ring = rings[i == 2], oc[i].mu = &mu, oc[i].cv = &cv;
    fcall_make(&oc[i].c, oc[i].ring, i, 1, 0, 0);
  }
  for (int i = 0; i < 2; ++i)
    assert_int_equal(pthread_create(&th[i], NULL, ocall_main, &oc[i]), 0);
  pthread_mutex_lock(&mu);
  while (!oc[0].done && !oc[1].done) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  const int refused = oc[0].done ? 0 : 1;
  assert_int_equal(oc[refused].s, RDA_ERR_INVALID_ARGUMENT);
  assert_one_line_naming(oc[refused].msg, "another call on this ring is running");
  rda_ring_desc d = RDA_RING_DESC_INIT;
  d.n = 20, d.ranks = 2, d.rank = 0, d.world = world;
  rda_ring *again = NULL;
  assert_int_equal(rda_ring_create(&again, g_plan_a, &d), RDA_ERR_INVALID_ARGUMENT);
  assert_null(again);
  assert_one_line_naming(rda_last_error(NULL), "joined the ring twice");
  assert_int_equal(pthread_create(&th[2], NULL, ocall_main, &oc[2]), 0);
  for (int i = 0; i < 3; ++i) pthread_join(th[i], NULL);
  for (int i = 0; i < 3; ++i)
    if (i != refused && oc[i].s != RDA_OK)
      fail_msg("call %d failed after the misuse: %s", i, oc[i].msg);
  for (int i = 0; i < 3; ++i) fcall_free(&oc[i].c);
  for (int p = 0; p < 2; ++p) rda_ring_destroy(rings[p]);
  rda_ring_world_destroy(world);
}

static void test_ring_abort_from_another_thread(void **state) {
  (void)state;
  run_failure("abort of rank 2", 3, 29, 2, kAbortInstead, RDA_ERR_NCCL, "the test pulls the plug",
              RDA_ERR_NCCL, "the test pulls the plug");
}

int main(int argc, char **argv) {
  (void)argc, (void)argv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_create_rejects_bad_desc),
      cmocka_unit_test(test_ring_handles_and_world_lifetime),
      cmocka_unit_test(test_ring_fingerprint_mismatch_fails_every_rank),
      cmocka_unit_test(test_ring_bad_desc_on_one_rank_fails_every_rank),
      cmocka_unit_test(test_ring_call_errors_fail_every_rank),
      cmocka_unit_test(test_ring_calls_that_differ_fail_every_rank),
      cmocka_unit_test(test_ring_failure_after_the_pass_fails_every_rank),
      cmocka_unit_test(test_ring_abort_from_another_thread),
      cmocka_unit_test(test_ring_rank_that_leaves_fails_the_others_at_once),
      cmocka_unit_test(test_ring_overlapping_call_and_second_ring_leave_it_alone),
      cmocka_unit_test(test_ring_forward_matches_single_device_contiguous),
      cmocka_unit_test(test_ring_forward_noncausal_dilated_block_mqa_fp16),
      cmocka_unit_test(test_ring_forward_group_offsets_fused_qkv),
      cmocka_unit_test(test_ring_forward_zigzag),
      cmocka_unit_test(test_ring_backward_matches_single_device),
      cmocka_unit_test(test_ring_batch_past_the_slice_runs_pass_by_pass),
      cmocka_unit_test(test_ring_more_ranks_than_rows),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
