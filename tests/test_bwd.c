/* test_bwd.c — the generated backward kernels (templates/rda_bwd.cuh through runtime/bwd.c)
 * against the float64 reference gradient (SPEC §1 "Backward, exact", §5): dtypes, head dims,
 * causal, offset rules, GQA, segment edge cases, batch, scale, strides, dLSE; determinism; the
 * ring's launch pieces (rda_bwd_launch_dkdv/dq) on query/key row ranges and compact key blocks. */
// clang-format off
#include "backend.h"
#include "bwd.h"
#include "fwd.h"
#include "gen.h"
#include "reference.h"
#include "rda_test.h"
#include "rda_test_backend.h"
#include "rda_test_cases.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */
// clang-format on

/* ------------------------------------------------------------------ fixture */

static rt_backends g_rt; /* the generator and the backends every case runs on */

static int group_setup(void **state) {
  (void)state;
  return rt_backends_open(&g_rt, "test_bwd");
}

static int group_teardown(void **state) {
  (void)state;
  rt_backends_close(&g_rt);
  return 0;
}

/* ------------------------------------------------------------------ one case */

typedef struct bwd_case {
  int heads, kv_heads, head_dim, dtype, causal, offsets;
  int nbranch;
  long long w[4], r[4];
  long long batch, n;
  double scale;  /* 0: the default 1/sqrt(head_dim) */
  int strided;   /* [N, B, H, D] with padded heads everywhere, padded LSE rows */
  int with_dlse; /* a non-zero dLSE */
  int twice;     /* run the backward twice and require bit-identical gradients */
  int atomic;    /* plan the atomic-dQ variants; run non-deterministic unless `twice` */
  int wgmma;     /* plan with RDA_PLAN_WGMMA: every dK/dV and dQ variant must be a wgmma one */
  const char *dq_tile; /* NULL, or the tile branch 0's dQ kernel is planned with */
} bwd_case;

/* Element strides (batch, n, head) of a [B, N, heads, d] tensor; strided: [N, B, heads, d + pad].
 */
static void strides_of(const bwd_case *bc, long long heads, long long pad, long long s[3]) {
  const long long d = bc->head_dim;
  if (bc->strided) {
    rt_strides_seq_first(bc->batch, heads, d, pad, s);
  } else {
    rt_strides_contig(bc->n, heads, d, s);
  }
}

/* One case set up on one backend for backward passes: the plan (forward + backward) and its
 * kernels, float64 inputs rounded to the storage dtype, their storage bits in the case's layout
 * on the host and the device, O and LSE from the forward pass, and rda_bwd_run's arguments over
 * the whole problem (gradients and workspace poisoned; deterministic left to the caller). */
typedef struct bwd_setup {
  rda_config cfg;
  rda_plan_k plan;
  rda_fwd_kernels kern;
  double load_s;
  double *q, *k, *v, *dout, *dlse; /* dlse NULL unless with_dlse */
  uint16_t *q_bits, *k_bits, *v_bits, *do_bits;
  uint16_t *q_dev, *k_dev, *v_dev, *do_dev;
  float *o_dev, *lse_dev, *dlse_dev, *dq_dev, *dk_dev, *dv_dev, *ws_dev;
  size_t dq_count, dk_count, dv_count; /* elements the gradients span */
  rda_bwd_args ba;
} bwd_setup;

/* The storage bits of x in the layout s on the host (*host) and a device copy of them. */
static uint16_t *dev_bits(rda_backend *b, const double *x, const bwd_case *bc, long long heads,
                          const long long s[3], uint16_t **host) {
  size_t count = 0;
  *host = rt_make_bits(x, bc->batch, bc->n, heads, bc->head_dim, s, bc->dtype, &count);
  uint16_t *dev = rt_dev_alloc(b, count * sizeof *dev);
  rt_dev_upload(b, dev, *host, count * sizeof *dev);
  return dev;
}

static void setup_open(rt_backend *be, const char *what, const bwd_case *bc, bwd_setup *p) {
  rda_backend *b = be->b;
  const long long B = bc->batch, N = bc->n, H = bc->heads, Hkv = bc->kv_heads, D = bc->head_dim;
  memset(p, 0, sizeof *p);
  rt_config_make(&p->cfg, bc->heads, bc->kv_heads, bc->head_dim, bc->dtype, bc->causal, bc->offsets,
                 bc->nbranch, bc->w, bc->r);
  if (bc->scale != 0.0) p->cfg.scale = bc->scale;

  rda_err err = {0};
  const unsigned flags = RDA_PLAN_BACKWARD | (bc->atomic ? RDA_PLAN_BACKWARD_ATOMIC : 0u) |
                         (bc->wgmma ? RDA_PLAN_WGMMA : 0u);
  rt_plan_with_tile(g_rt.gen, &p->cfg, &be->hw, flags, "bwd_dq", bc->dq_tile, &p->plan, what);
  assert_true(p->plan.has_bwd);
  /* With the flag, every dK/dV and dQ variant (and its ring twin) is a wgmma one, the atomic
   * dK/dV aside; without, none. */
  rt_check_wgmma_plan(&p->plan, "bwd_dkdv", bc->wgmma, what);
  rt_check_wgmma_plan(&p->plan, "bwd_dq", bc->wgmma, what);
  for (int i = 0; i < p->plan.nsteps; ++i) /* d = 256 splits dK/dV: no atomic variant there */
    assert_int_equal(p->plan.bwd_steps[i].dkdv_atomic_kernel >= 0, bc->atomic && D != 256);
  const double t_load = rt_now_s();
  if (rda_fwd_load(b, &p->plan, &p->kern, &err) != RDA_OK) fail_msg("%s: load: %s", what, err.msg);
  p->load_s = rt_now_s() - t_load;

  p->q = rt_normal((size_t)(B * N * H * D), bc->dtype);
  p->k = rt_normal((size_t)(B * N * Hkv * D), bc->dtype);
  p->v = rt_normal((size_t)(B * N * Hkv * D), bc->dtype);
  p->dout = rt_normal((size_t)(B * N * H * D), bc->dtype);
  if (bc->with_dlse) p->dlse = rt_normal((size_t)(B * H * N), RDA_DTYPE_BF16); /* exact in fp32 */

  rda_bwd_args *ba = &p->ba;
  ba->batch = B;
  ba->n = N;
  strides_of(bc, H, 8, ba->q_s);
  strides_of(bc, Hkv, 16, ba->k_s);
  strides_of(bc, Hkv, 24, ba->v_s);
  strides_of(bc, H, 8, ba->do_s);
  strides_of(bc, H, 4, ba->o_s);
  strides_of(bc, H, 3, ba->dq_s);
  strides_of(bc, Hkv, 1, ba->dk_s);
  strides_of(bc, Hkv, 5, ba->dv_s);
  ba->lse_s[1] = bc->strided ? N + 3 : N;
  ba->lse_s[0] = H * ba->lse_s[1] + (bc->strided ? 1 : 0);
  memcpy(ba->dlse_s, ba->lse_s, sizeof ba->lse_s);
  const long long *lse_s = ba->lse_s;
  const size_t lse_count = rt_lse_span(B, H, N, lse_s);
  p->dq_count = rt_span(B, N, H, D, ba->dq_s);
  p->dk_count = rt_span(B, N, Hkv, D, ba->dk_s);
  p->dv_count = rt_span(B, N, Hkv, D, ba->dv_s);

  ba->q = p->q_dev = dev_bits(b, p->q, bc, H, ba->q_s, &p->q_bits);
  ba->k = p->k_dev = dev_bits(b, p->k, bc, Hkv, ba->k_s, &p->k_bits);
  ba->v = p->v_dev = dev_bits(b, p->v, bc, Hkv, ba->v_s, &p->v_bits);
  ba->dout = p->do_dev = dev_bits(b, p->dout, bc, H, ba->do_s, &p->do_bits);
  p->o_dev = rt_dev_poisoned(b, rt_span(B, N, H, D, ba->o_s));
  p->lse_dev = rt_dev_poisoned(b, lse_count);
  if (p->dlse != NULL) p->dlse_dev = rt_dev_lse_f32(b, p->dlse, B, H, N, lse_s);
  ba->o = p->o_dev;
  ba->lse = p->lse_dev;
  ba->dlse = p->dlse_dev;
  ba->dq = p->dq_dev = rt_dev_poisoned(b, p->dq_count);
  ba->dk = p->dk_dev = rt_dev_poisoned(b, p->dk_count);
  ba->dv = p->dv_dev = rt_dev_poisoned(b, p->dv_count);
  const size_t ws_bytes = rda_bwd_workspace_bytes(&p->plan, B, N);
  assert_int_equal(ws_bytes, (size_t)(B * H * N) * sizeof(float));
  ba->workspace = p->ws_dev = rt_dev_poisoned(b, ws_bytes / sizeof(float));

  /* The forward pass on the same tensors writes O and LSE. */
  rda_fwd_args fa;
  memset(&fa, 0, sizeof fa);
  fa.batch = B;
  fa.n = N;
  fa.q = ba->q, fa.k = ba->k, fa.v = ba->v, fa.o = p->o_dev, fa.lse = p->lse_dev;
  memcpy(fa.q_s, ba->q_s, sizeof fa.q_s);
  memcpy(fa.k_s, ba->k_s, sizeof fa.k_s);
  memcpy(fa.v_s, ba->v_s, sizeof fa.v_s);
  memcpy(fa.o_s, ba->o_s, sizeof fa.o_s);
  memcpy(fa.lse_s, ba->lse_s, sizeof fa.lse_s);
  if (rda_fwd_run(b, &p->plan, &p->kern, &fa, &err) != RDA_OK || b->synchronize(b, &err) != RDA_OK)
    fail_msg("%s: forward: %s", what, err.msg);
}

static void setup_close(rda_backend *b, bwd_setup *p) {
  free(p->q_bits);
  free(p->k_bits);
  free(p->v_bits);
  free(p->do_bits);
  b->free(b, p->q_dev);
  b->free(b, p->k_dev);
  b->free(b, p->v_dev);
  b->free(b, p->do_dev);
  b->free(b, p->o_dev);
  b->free(b, p->lse_dev);
  if (p->dlse_dev != NULL) b->free(b, p->dlse_dev);
  b->free(b, p->dq_dev);
  b->free(b, p->dk_dev);
  b->free(b, p->dv_dev);
  b->free(b, p->ws_dev);
  free(p->q);
  free(p->k);
  free(p->v);
  free(p->dout);
  free(p->dlse);
  rda_fwd_unload(b, &p->kern);
  rda_plan_k_free(&p->plan);
}

/* Compare gradients (fp32, the given strides) with the float64 reference gradient of p's
 * problem and its magnitude (a gradient that cancels is judged against the latter):
 * rt_check_bwd_ref's verdict, its report in *rep. */
static bool check_grads(const char *what, const bwd_setup *p, const float *dq,
                        const long long dq_s[3], const float *dk, const long long dk_s[3],
                        const float *dv, const long long dv_s[3], rt_grad_report *rep) {
  const long long B = p->ba.batch, N = p->ba.n;
  rt_bwd_ref ref;
  rt_reference_bwd_mag(&p->cfg, B, N, p->q, p->k, p->v, p->dout, p->dlse, &ref);
  const bool ok = rt_check_bwd_ref(what, &p->cfg, B, N, dq, dq_s, dk, dk_s, dv, dv_s, &ref, rep);
  rt_bwd_ref_free(&ref);
  return ok;
}

/* The backward pass on the case's tensors; compare with the float64 reference gradient. */
static void run_case_on(rt_backend *be, const char *what, const bwd_case *bc) {
  rda_backend *b = be->b;
  if (bc->wgmma && !rt_wgmma_runs_on(be, what)) return;
  const long long B = bc->batch, N = bc->n, H = bc->heads, Hkv = bc->kv_heads, D = bc->head_dim;
  bwd_setup p;
  setup_open(be, what, bc, &p);
  rda_bwd_args ba = p.ba;
  const long long *dq_s = ba.dq_s, *dk_s = ba.dk_s, *dv_s = ba.dv_s;
  const size_t dq_count = p.dq_count, dk_count = p.dk_count, dv_count = p.dv_count;
  rda_err err = {0};
  ba.deterministic = !bc->atomic || bc->twice;
  const double t_run = rt_now_s();
  if (rda_bwd_run(b, &p.plan, &p.kern, &ba, &err) != RDA_OK || b->synchronize(b, &err) != RDA_OK)
    fail_msg("%s: backward: %s", what, err.msg);
  const double run_s = rt_now_s() - t_run;
  float *dq_host = rt_download_f32(b, p.dq_dev, dq_count);
  float *dk_host = rt_download_f32(b, p.dk_dev, dk_count);
  float *dv_host = rt_download_f32(b, p.dv_dev, dv_count);

  rt_grad_report rep;
  bool ok = check_grads(what, &p, dq_host, dq_s, dk_host, dk_s, dv_host, dv_s, &rep);
  fprintf(stderr, "  %-4s %-58s dQ %.2e dK %.2e dV %.2e  load %.1fs run %.2fs\n", b->name, what,
          rep.dq_rel_l2, rep.dk_rel_l2, rep.dv_rel_l2, p.load_s, run_s);

  if (ok && bc->twice) {
    /* Poison again and rerun: every gradient element must come back bit for bit. */
    float *p1 = rt_dev_poisoned(b, dq_count), *p2 = rt_dev_poisoned(b, dk_count),
          *p3 = rt_dev_poisoned(b, dv_count);
    ba.dq = p1;
    ba.dk = p2;
    ba.dv = p3;
    if (rda_bwd_run(b, &p.plan, &p.kern, &ba, &err) != RDA_OK || b->synchronize(b, &err) != RDA_OK)
      fail_msg("%s: second backward: %s", what, err.msg);
    float *dq2 = rt_download_f32(b, p1, dq_count);
    float *dk2 = rt_download_f32(b, p2, dk_count);
    float *dv2 = rt_download_f32(b, p3, dv_count);
    /* Only the tensors' own elements: the padding stays NaN in both. */
    long long diff = 0;
    for (long long ib = 0; ib < B; ++ib)
      for (long long in = 0; in < N; ++in) {
        for (long long ih = 0; ih < H; ++ih) {
          const long long o1 = ib * dq_s[0] + in * dq_s[1] + ih * dq_s[2];
          diff += memcmp(dq_host + o1, dq2 + o1, (size_t)D * sizeof(float)) != 0;
        }
        for (long long ih = 0; ih < Hkv; ++ih) {
          const long long ok1 = ib * dk_s[0] + in * dk_s[1] + ih * dk_s[2];
          const long long ov1 = ib * dv_s[0] + in * dv_s[1] + ih * dv_s[2];
          diff += memcmp(dk_host + ok1, dk2 + ok1, (size_t)D * sizeof(float)) != 0;
          diff += memcmp(dv_host + ov1, dv2 + ov1, (size_t)D * sizeof(float)) != 0;
        }
      }
    if (diff != 0)
      fprintf(stderr, "  %s: %lld gradient rows differ between two runs\n", what, diff);
    ok = ok && diff == 0;
    free(dq2);
    free(dk2);
    free(dv2);
    b->free(b, p1);
    b->free(b, p2);
    b->free(b, p3);
  }

  free(dq_host);
  free(dk_host);
  free(dv_host);
  setup_close(b, &p);
  assert_true(ok);
}

static void run_case(const char *what, const bwd_case *bc) {
  for (int i = 0; i < g_rt.n; ++i) run_case_on(&g_rt.be[i], what, bc);
}

/* ------------------------------------------------------------------ the cases */
/* Each head dim runs once; over the set: both dtypes with and without causal, every offset rule,
 * GQA and MQA, partial segments, w > N, r not dividing w, uncovered rows, batch > 1, a custom
 * scale, strided layouts and dLSE. */

/* Three branches (dense, dilated, w > N clamped), several key and query tiles per segment, a
 * partial last segment, GQA with the "mod" offsets (the heads of a kv group on different grids),
 * batch 2 and a non-zero dLSE. */
static void test_bwd_matches_reference_causal_gqa_bf16_d64_three_branches_dlse(void **state) {
  (void)state;
  const bwd_case c = {.heads = 4,
                      .kv_heads = 2,
                      .head_dim = 64,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR3(96, 1, 160, 2, 512, 4),
                      .batch = 2,
                      .n = 200,
                      .with_dlse = 1};
  run_case(__func__, &c);
}

/* "block" offsets, MQA (one kv head for four query heads), r not dividing w, only dilated
 * branches so some rows are uncovered (they must get exact zeros, not NaN). */
static void test_bwd_matches_reference_block_mqa_fp16_d128_uncovered_rows(void **state) {
  (void)state;
  const bwd_case c = {.heads = 4,
                      .kv_heads = 1,
                      .head_dim = 128,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_BLOCK,
                      BR2(100, 3, 150, 4),
                      .batch = 1,
                      .n = 150};
  run_case(__func__, &c);
}

/* "group" offsets (each head uses one branch), a custom scale, batch 2, [N, B, H, D] layouts
 * with padded heads for every tensor, padded LSE rows, dLSE. */
static void test_bwd_matches_reference_group_causal_bf16_d32_strided_scale(void **state) {
  (void)state;
  const bwd_case c = {.heads = 3,
                      .kv_heads = 3,
                      .head_dim = 32,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_GROUP,
                      BR2(40, 1, 90, 2),
                      .batch = 2,
                      .n = 130,
                      .scale = 0.3,
                      .strided = 1,
                      .with_dlse = 1};
  run_case(__func__, &c);
}

/* d = 96 (rows of 12 chunks), causal dilated branch with a short last segment, GQA 2:1. */
static void test_bwd_matches_reference_causal_gqa_fp16_d96_dilated(void **state) {
  (void)state;
  const bwd_case c = {.heads = 4,
                      .kv_heads = 2,
                      .head_dim = 96,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(48, 3, 100, 1),
                      .batch = 1,
                      .n = 130};
  run_case(__func__, &c);
}

/* d = 256 (dK/dV split over two blocks per key tile), dense + dilated, strided. */
static void test_bwd_matches_reference_bf16_d256_split_head_dim_strided(void **state) {
  (void)state;
  const bwd_case c = {.heads = 2,
                      .kv_heads = 2,
                      .head_dim = 256,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(64, 1, 100, 2),
                      .batch = 1,
                      .n = 100,
                      .strided = 1,
                      .with_dlse = 1};
  run_case(__func__, &c);
}

/* d = 256 causal fp16: the diagonal masking with the smallest query steps. */
static void test_bwd_matches_reference_causal_fp16_d256(void **state) {
  (void)state;
  const bwd_case c = {.heads = 2,
                      .kv_heads = 1,
                      .head_dim = 256,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_BLOCK,
                      BR1(90, 2),
                      .batch = 1,
                      .n = 90};
  run_case(__func__, &c);
}

/* One dense segment of the whole sequence (odd N), batch 3, non-causal fp16 d64. */
static void test_bwd_matches_reference_fp16_d64_dense_batch3(void **state) {
  (void)state;
  const bwd_case c = {.heads = 2,
                      .kv_heads = 2,
                      .head_dim = 64,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_MOD,
                      BR1(77, 1),
                      .batch = 3,
                      .n = 77,
                      .with_dlse = 1};
  run_case(__func__, &c);
}

/* The smallest problems: N = 3 (one partial tile), and segments of one row (a row whose only
 * key is itself has dS = 0 in that branch). N = 1 is test_bwd_matches_reference_one_key_per_row
 * below. */
static void test_bwd_matches_reference_bf16_d32_tiny(void **state) {
  (void)state;
  const bwd_case a = {.heads = 2,
                      .kv_heads = 1,
                      .head_dim = 32,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(4, 1, 8, 2),
                      .batch = 1,
                      .n = 3};
  run_case("tiny_n3", &a);
  const bwd_case b = {.heads = 2,
                      .kv_heads = 2,
                      .head_dim = 32,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(1, 1, 5, 2),
                      .batch = 2,
                      .n = 21};
  run_case("tiny_segments", &b);
}

/* Every row's only key is itself: N = 1, or segments of one row in every branch. Then P = 1
 * per branch, dS = P (<dO, V> - Dp) = 0 and dQ = dK = 0 exactly (dS = P dLSE with a dLSE),
 * while the kernels leave fp32 rounding noise (~1e-7 of the terms dS is made of), which SPEC
 * §5's plain ratio against a zero gradient fails. The check judges a gradient that cancels
 * against its magnitude instead (check.h, RDA_CHECK_GRAD_MAG_FRACTION); a wrong sign of dS, a
 * lost dLSE or a Dp from a rounded O still fail here. Both dtypes, causal and not, one to
 * three branches, GQA and MQA, batch 2, strided, dLSE. */
static void test_bwd_matches_reference_one_key_per_row(void **state) {
  (void)state;
  const bwd_case a = {.heads = 4,
                      .kv_heads = 2,
                      .head_dim = 32,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR3(4, 1, 8, 2, 16, 3),
                      .batch = 1,
                      .n = 1};
  run_case("n1_causal_gqa_bf16_three_branches", &a);
  const bwd_case b = {.heads = 2,
                      .kv_heads = 2,
                      .head_dim = 64,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_BLOCK,
                      BR2(1, 1, 5, 2),
                      .batch = 2,
                      .n = 1,
                      .strided = 1};
  run_case("n1_fp16_d64_two_branches_strided", &b);
  const bwd_case b2 = {.heads = 3,
                       .kv_heads = 1,
                       .head_dim = 32,
                       .dtype = RDA_DTYPE_BF16,
                       .causal = 0,
                       .offsets = RDA_OFFSETS_GROUP,
                       BR2(2, 1, 7, 3),
                       .batch = 1,
                       .n = 1,
                       .with_dlse = 1};
  run_case("n1_group_mqa_bf16_dlse", &b2);
  const bwd_case c = {.heads = 4,
                      .kv_heads = 1,
                      .head_dim = 32,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(1, 1, 1, 1),
                      .batch = 1,
                      .n = 70};
  run_case("one_row_segments_causal_mqa_fp16_n70", &c);
  const bwd_case d = {.heads = 2,
                      .kv_heads = 1,
                      .head_dim = 32,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_MOD,
                      BR1(1, 1),
                      .batch = 2,
                      .n = 33,
                      .with_dlse = 1};
  run_case("one_row_segments_bf16_dlse_n33", &d);
}

/* A negative scale (SPEC §1 puts no sign on τ): P = exp(τ <q, k> - LSE) and the τ of dQ and dK
 * keep their sign. GQA, causal, a dense and a dilated branch, dLSE, fp16 (the tighter bound). */
static void test_bwd_matches_reference_negative_scale_fp16_d64(void **state) {
  (void)state;
  const bwd_case c = {.heads = 4,
                      .kv_heads = 2,
                      .head_dim = 64,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(40, 1, 64, 2),
                      .batch = 1,
                      .n = 70,
                      .scale = -0.35,
                      .with_dlse = 1};
  run_case(__func__, &c);
  const bwd_case b = {.heads = 2,
                      .kv_heads = 1,
                      .head_dim = 32,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_BLOCK,
                      BR2(16, 1, 40, 3),
                      .batch = 2,
                      .n = 45,
                      .scale = -1.3,
                      .strided = 1};
  run_case("negative_scale_bf16_block_strided", &b);
}

/* The dK/dV and dQ wgmma paths (sm_90a; RDA_PLAN_WGMMA), d = 128: two warpgroups per block,
 * several query and key tiles of a dense and of a dilated grid with ragged last tiles (a
 * warpgroup with no rows), a partial second segment, GQA with the "mod" offsets, strided
 * layouts and dLSE. */
static void test_bwd_wgmma_matches_reference_gqa_bf16_d128_multi_tile_dilated(void **state) {
  (void)state;
  const bwd_case c = {.heads = 4,
                      .kv_heads = 2,
                      .head_dim = 128,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(384, 1, 400, 2),
                      .batch = 1,
                      .n = 400,
                      .strided = 1,
                      .with_dlse = 1,
                      .wgmma = 1};
  run_case(__func__, &c);
}

/* RT_CASE_WGMMA_CAUSAL_FP16_D64_BLOCK (rda_test_cases.h) on the dQ wgmma path. */
static void test_bwd_wgmma_matches_reference_causal_fp16_d64_block_offsets(void **state) {
  (void)state;
  const bwd_case c = {RT_CASE_WGMMA_CAUSAL_FP16_D64_BLOCK};
  run_case(__func__, &c);
}

/* The overlapped dQ wgmma tiles (a key tile's dS computed while the previous tile's
 * dQ += dS K runs; three K/V stages): d = 128 with both tiles (several key tiles of 64, ragged
 * last ones, an idle warpgroup), and d = 64 causal fp16 with block offsets and dLSE. */
static void test_bwd_wgmma_overlap_dq_matches_reference(void **state) {
  (void)state;
  bwd_case c = {.heads = 4,
                .kv_heads = 2,
                .head_dim = 128,
                .dtype = RDA_DTYPE_BF16,
                .causal = 0,
                .offsets = RDA_OFFSETS_MOD,
                BR2(400, 1, 400, 2),
                .batch = 1,
                .n = 400,
                .with_dlse = 1,
                .wgmma = 1,
                .dq_tile = "bm128_bn64_w8_s3_wgo"};
  run_case("wgmma_overlap_dq_bm128_gqa_bf16_d128", &c);
  c.causal = 1;
  c.dq_tile = "bm64_bn64_w4_s3_wgo";
  run_case("wgmma_overlap_dq_bm64_causal_gqa_bf16_d128", &c);
  bwd_case d = {RT_CASE_WGMMA_CAUSAL_FP16_D64_BLOCK};
  d.with_dlse = 1;
  d.dq_tile = "bm128_bn128_w8_s3_wgo";
  run_case("wgmma_overlap_dq_causal_fp16_d64_block", &d);
}

/* The dK/dV and dQ wgmma paths at d = 128, causal: key tiles of 128 whose second warpgroup is
 * partly or wholly past the grid's end (ragged 8-key groups, idle groups), warpgroups whose keys
 * are all after a query tile (skipped) or straddle it (masked per element), MQA with group
 * offsets, fp16 and dLSE. */
static void test_bwd_wgmma_matches_reference_causal_mqa_fp16_d128_group(void **state) {
  (void)state;
  const bwd_case c = {.heads = 3,
                      .kv_heads = 1,
                      .head_dim = 128,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_GROUP,
                      BR2(264, 1, 400, 2),
                      .batch = 1,
                      .n = 400,
                      .with_dlse = 1,
                      .wgmma = 1};
  run_case(__func__, &c);
}

/* wgmma with the atomic mode: the planned atomic dK/dV stays on mma.sync (its dS^T staging has
 * no wgmma path) and matches the reference; run twice, the deterministic mode takes the wgmma
 * dK/dV and dQ variants and is bit-identical. */
static void test_bwd_wgmma_with_atomic_mode_matches_reference(void **state) {
  (void)state;
  bwd_case c = {.heads = 4,
                .kv_heads = 2,
                .head_dim = 64,
                .dtype = RDA_DTYPE_BF16,
                .causal = 1,
                .offsets = RDA_OFFSETS_MOD,
                BR2(192, 1, 260, 2),
                .batch = 1,
                .n = 260,
                .atomic = 1,
                .wgmma = 1};
  run_case("wgmma_atomic_nondeterministic", &c);
  c.twice = 1;
  run_case("wgmma_atomic_plan_deterministic", &c);
}

/* Two runs on the same inputs give bit-identical dQ, dK, dV (GQA, several branches, causal: the
 * case where accumulation order could vary). */
static void test_bwd_deterministic_gradients_are_bit_identical(void **state) {
  (void)state;
  const bwd_case c = {.heads = 4,
                      .kv_heads = 2,
                      .head_dim = 64,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_BLOCK,
                      BR2(70, 1, 140, 2),
                      .batch = 2,
                      .n = 140,
                      .twice = 1};
  run_case(__func__, &c);
}

/* The non-deterministic mode (dQ added by fp32 atomics inside the dK/dV kernel, one launch per
 * branch): the same matrix corners — causal GQA with three branches and dLSE, block_m = 64 with
 * one column group (d = 32, strided), two column groups of 48 (d = 96), fp16 d = 128 MQA. */
static void test_bwd_atomic_mode_matches_reference(void **state) {
  (void)state;
  const bwd_case a = {.heads = 4,
                      .kv_heads = 2,
                      .head_dim = 64,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR3(96, 1, 160, 2, 512, 4),
                      .batch = 2,
                      .n = 200,
                      .with_dlse = 1,
                      .atomic = 1};
  run_case("atomic_causal_gqa_bf16_d64", &a);
  const bwd_case b = {.heads = 3,
                      .kv_heads = 3,
                      .head_dim = 32,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_GROUP,
                      BR2(40, 1, 90, 2),
                      .batch = 2,
                      .n = 130,
                      .scale = 0.3,
                      .strided = 1,
                      .atomic = 1};
  run_case("atomic_group_bf16_d32_strided", &b);
  const bwd_case c = {.heads = 4,
                      .kv_heads = 2,
                      .head_dim = 96,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(48, 3, 100, 1),
                      .batch = 1,
                      .n = 130,
                      .atomic = 1};
  run_case("atomic_causal_fp16_d96", &c);
  const bwd_case d = {.heads = 4,
                      .kv_heads = 1,
                      .head_dim = 128,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_BLOCK,
                      BR2(100, 3, 150, 1),
                      .batch = 1,
                      .n = 150,
                      .atomic = 1};
  run_case("atomic_block_mqa_fp16_d128", &d);
  const bwd_case e = {.heads = 2,
                      .kv_heads = 2,
                      .head_dim = 256,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR1(64, 1),
                      .batch = 1,
                      .n = 64,
                      .atomic = 1};
  run_case("atomic_planned_d256_falls_back", &e);
}

/* With the atomic variants planned, deterministic = 1 still takes the two-kernel path: bit
 * identical run to run. */
static void test_bwd_deterministic_mode_ignores_atomic_variants(void **state) {
  (void)state;
  const bwd_case c = {.heads = 2,
                      .kv_heads = 1,
                      .head_dim = 64,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(50, 1, 100, 2),
                      .batch = 1,
                      .n = 100,
                      .twice = 1,
                      .atomic = 1};
  run_case(__func__, &c);
}

/* rda::atomic_add_f32 (templates/ptx.cuh), the atomic mode's one new wrapper: blocks on many
 * OS threads (emu) or SMs (cuda) hammer the same floats; sums of halves and integers are exact
 * in fp32 whatever the order, so every contribution must be there. */
static void test_bwd_atomic_add_f32_wrapper_adds_every_contribution(void **state) {
  (void)state;
  static char src[] =
      "#include \"ptx.cuh\"\n"
      "struct rda_test_atomic_params { float *x; };\n"
      "extern \"C\" __global__ void rda_test_atomic_add(const rda_test_atomic_params p) {\n"
      "  rda::atomic_add_f32(p.x + (threadIdx.x & 3), 0.5f);\n"
      "  rda::atomic_add_f32(p.x + 4 + blockIdx.x, 1.0f + threadIdx.x);\n"
      "}\n"
      "RDA_EMU_EXPORT(rda_test_atomic_add, rda_test_atomic_params)\n";
  enum { BLOCKS = 16, THREADS = 128 };
  for (int i = 0; i < g_rt.n; ++i) {
    rda_backend *b = g_rt.be[i].b;
    rda_variant v;
    memset(&v, 0, sizeof v);
    snprintf(v.name, sizeof v.name, "rda_test_atomic_add");
    snprintf(v.kind, sizeof v.kind, "test");
    v.source = src;
    v.threads = THREADS;
    rda_err err = {0};
    rda_module *m = NULL;
    if (b->load(b, &v, &m, &err) != RDA_OK) fail_msg("%s load: %s", b->name, err.msg);
    float host[4 + BLOCKS];
    for (int j = 0; j < 4 + BLOCKS; ++j) host[j] = 1.0f;
    float *dev = rt_dev_alloc(b, sizeof host);
    rt_dev_upload(b, dev, host, sizeof host);
    struct {
      float *x;
    } params = {dev};
    const unsigned grid[3] = {BLOCKS, 1, 1};
    if (b->launch(b, m, grid, THREADS, 0, &params, sizeof params, &err) != RDA_OK ||
        b->synchronize(b, &err) != RDA_OK)
      fail_msg("%s launch: %s", b->name, err.msg);
    rt_dev_download(b, host, dev, sizeof host);
    for (int j = 0; j < 4; ++j) assert_true(host[j] == 1.0f + BLOCKS * THREADS / 4 * 0.5f);
    for (int j = 0; j < BLOCKS; ++j)
      assert_true(host[4 + j] == 1.0f + THREADS + THREADS * (THREADS - 1) / 2);
    b->free(b, dev);
    b->unload(b, m);
  }
}

/* A forward-only plan has no backward kernels: rda_bwd_run refuses it with a clear line, and a
 * missing workspace or misaligned input is refused before any launch. */
static void test_bwd_rejects_forward_only_plan_and_bad_arguments(void **state) {
  (void)state;
  rt_backend *be = &g_rt.be[0];
  rda_config cfg;
  const long long w[1] = {32}, r[1] = {1};
  rt_config_make(&cfg, 2, 2, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, w, r);
  rda_err err = {0};
  rda_plan_k plan;
  memset(&plan, 0, sizeof plan);
  assert_int_equal(rda_gen_plan(g_rt.gen, &cfg, &be->hw, &plan, &err), RDA_OK);
  assert_false(plan.has_bwd);
  for (int i = 0; i < plan.nvariants; ++i)
    assert_null(strstr(plan.variants[i].kind, "bwd")); /* forward users compile nothing more */
  rda_fwd_kernels kern = {0, NULL};
  rda_bwd_args a;
  memset(&a, 0, sizeof a);
  assert_int_equal(rda_bwd_run(be->b, &plan, &kern, &a, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "RDA_PLAN_BACKWARD"));
  rda_plan_k_free(&plan);

  memset(&plan, 0, sizeof plan);
  rda_err_clear(&err);
  assert_int_equal(rda_gen_plan_ex(g_rt.gen, &cfg, &be->hw, RDA_PLAN_BACKWARD, &plan, &err),
                   RDA_OK);
  assert_true(plan.has_bwd);
  assert_int_equal(rda_fwd_load(be->b, &plan, &kern, &err), RDA_OK);
  const long long N = 32, H = 2, D = 32;
  uint16_t *in = rt_dev_alloc(be->b, (size_t)(4 * N * H * D + 8) * sizeof *in);
  float *f = rt_dev_alloc(be->b, (size_t)(5 * N * H * D + 2 * H * N) * sizeof *f);
  memset(&a, 0, sizeof a);
  a.batch = 1;
  a.n = N;
  a.q = in;
  a.k = in + N * H * D;
  a.v = in + 2 * N * H * D;
  a.dout = in + 3 * N * H * D;
  long long s[3];
  rt_strides_contig(N, H, D, s);
  memcpy(a.q_s, s, sizeof s);
  memcpy(a.k_s, s, sizeof s);
  memcpy(a.v_s, s, sizeof s);
  memcpy(a.do_s, s, sizeof s);
  memcpy(a.o_s, s, sizeof s);
  memcpy(a.dq_s, s, sizeof s);
  memcpy(a.dk_s, s, sizeof s);
  memcpy(a.dv_s, s, sizeof s);
  a.o = f;
  a.dq = f + N * H * D;
  a.dk = f + 2 * N * H * D;
  a.dv = f + 3 * N * H * D;
  a.lse = f + 4 * N * H * D;
  a.lse_s[0] = H * N;
  a.lse_s[1] = N;
  rda_err_clear(&err);
  assert_int_equal(rda_bwd_run(be->b, &plan, &kern, &a, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "workspace"));
  a.workspace = f + 4 * N * H * D + H * N;
  a.k = in + N * H * D + 4; /* 8 bytes off */
  rda_err_clear(&err);
  assert_int_equal(rda_bwd_run(be->b, &plan, &kern, &a, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "aligned"));
  be->b->free(be->b, in);
  be->b->free(be->b, f);
  rda_fwd_unload(be->b, &kern);
  rda_plan_k_free(&plan);
}

/* ------------------------------------------------------------------ row ranges (the ring) */
/* The ring (runtime/ring_compute.c) runs the backward kernels on sub-ranges: a rank's query
 * rows against its own or received key rows, per range of segments, with q/dout/dq/lse/dp as
 * the rank's local tensors (row_lo) and K/V either local (kv_row_lo) or a compact received
 * block (k_sn = 0, k_rs = the block's row pitch) whose gradients go to a compact fp32 block.
 * These cases split one problem that way, sum the pieces' gradients and compare them with
 * rda_bwd_run on the whole problem and with the float64 reference. Every piece is guarded
 * (rt_guarded; gradients start at zero, the launches add to them), and a compact block has NaN
 * in its other kv slot: a read there turns a gradient into NaN, a write shows. */

typedef struct split_case {
  bwd_case c;                 /* the problem; contiguous layouts */
  int nq, nk;                 /* query and key pieces */
  long long qcut[4], kcut[4]; /* piece boundaries: cut[0] = 0 < ... < cut[n] = N */
  int compact;                /* keys from compact blocks: one per (query head, segment, piece) */
} split_case;

/* The query-side tensors of one query piece. */
typedef struct qpiece {
  long long lo, hi;
  rt_guarded q, dout, dq;
  rt_guarded lse, dp; /* [B * H] rows of N */
} qpiece;

/* The key-side tensors of one key piece (or one compact block). */
typedef struct kpiece {
  long long lo, hi;
  rt_guarded k, v, dk, dv;
} kpiece;

/* Point bp's query side at qp (row_lo = its first row). */
static void bind_queries(rda_bwd_params *bp, const qpiece *qp, long long H, long long D) {
  bp->q = qp->q.view;
  bp->dout = qp->dout.view;
  bp->dq = (float *)(void *)qp->dq.view;
  bp->lse = (float *)(void *)qp->lse.view;
  bp->dp = (float *)(void *)qp->dp.view;
  bp->q_sb = qp->q.sb, bp->q_sn = qp->q.x, bp->q_sh = D;
  bp->do_sb = qp->dout.sb, bp->do_sn = qp->dout.x, bp->do_sh = D;
  bp->dq_sb = qp->dq.sb, bp->dq_sn = qp->dq.x, bp->dq_sh = D;
  bp->lse_sb = bp->dp_sb = H * qp->lse.sb;
  bp->lse_sh = bp->dp_sh = qp->lse.sb;
  bp->q_lo = qp->lo, bp->q_hi = qp->hi, bp->row_lo = qp->lo;
}

/* Run one step's launches on bp (dQ too unless atomic), failing the test on error. */
static void launch_pair(rt_backend *be, const rda_plan_k *plan, const rda_fwd_kernels *kern,
                        const rda_bwd_step *s, const rda_bwd_params *bp, long long nseg,
                        long long batch, int atomic, const char *what) {
  rda_err err = {0};
  rda_bwd_params p1 = *bp, p2 = *bp;
  if (rda_bwd_launch_dkdv(be->b, plan, kern, s, &p1, nseg, batch, atomic, &err) != RDA_OK)
    fail_msg("%s: dkdv launch: %s", what, err.msg);
  if (!atomic && rda_bwd_launch_dq(be->b, plan, kern, s, &p2, nseg, batch, &err) != RDA_OK)
    fail_msg("%s: dq launch: %s", what, err.msg);
}

/* Relative L2 distance of two fp32 arrays (NaN anywhere: +inf). */
static double rel_l2_f32(const float *got, const float *want, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (isnan(got[i]) || isnan(want[i])) return INFINITY;
    const double d = (double)got[i] - (double)want[i];
    num += d * d;
    den += (double)want[i] * want[i];
  }
  return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static void run_split_on(rt_backend *be, const char *what, const split_case *sc) {
  rda_backend *b = be->b;
  const bwd_case *bc = &sc->c;
  const long long B = bc->batch, N = bc->n, H = bc->heads, Hkv = bc->kv_heads, D = bc->head_dim;
  if (bc->wgmma && !rt_wgmma_runs_on(be, what)) return;
  assert_true(sc->qcut[0] == 0 && sc->qcut[sc->nq] == N && sc->kcut[0] == 0 &&
              sc->kcut[sc->nk] == N);
  assert_false(bc->strided); /* the pieces cut contiguous tensors */
  bwd_setup p;
  setup_open(be, what, bc, &p);
  const rda_config *cfg = &p.cfg;
  const rda_plan_k *plan = &p.plan;
  const long long *qs = p.ba.q_s, *ks = p.ba.k_s;
  const size_t nq_el = (size_t)(B * N * H * D), nk_el = (size_t)(B * N * Hkv * D);
  const size_t nstat = (size_t)(B * H * N);
  rda_err err = {0};

  /* The whole problem in one call (deterministic), for comparison and for Dp. */
  p.ba.deterministic = 1;
  if (rda_bwd_run(b, plan, &p.kern, &p.ba, &err) != RDA_OK || b->synchronize(b, &err) != RDA_OK)
    fail_msg("%s: backward: %s", what, err.msg);
  float *dq_run = rt_download_f32(b, p.dq_dev, nq_el);
  float *dk_run = rt_download_f32(b, p.dk_dev, nk_el);
  float *dv_run = rt_download_f32(b, p.dv_dev, nk_el);
  float *lse_host = rt_download_f32(b, p.lse_dev, nstat);
  float *dp_host = rt_download_f32(b, p.ws_dev, nstat);

  /* Query pieces: local tensors with row_lo = their first row. */
  qpiece qp[3];
  assert_true(sc->nq <= 3 && sc->nk <= 3);
  for (int i = 0; i < sc->nq; ++i) {
    qpiece *x = &qp[i];
    x->lo = sc->qcut[i];
    x->hi = sc->qcut[i + 1];
    const long long len = x->hi - x->lo;
    rt_guarded_copy(b, &x->q, p.q_bits, 2, B, N, H * D, x->lo, len);
    rt_guarded_copy(b, &x->dout, p.do_bits, 2, B, N, H * D, x->lo, len);
    rt_guarded_fill(b, &x->dq, 0, 4, B, N, H * D, x->lo, len);
    rt_guarded_copy(b, &x->lse, lse_host, 4, B * H, N, 1, x->lo, len);
    rt_guarded_copy(b, &x->dp, dp_host, 4, B * H, N, 1, x->lo, len);
  }

  float *dq_got = calloc(nq_el, sizeof *dq_got), *dk_got = calloc(nk_el, sizeof *dk_got);
  float *dv_got = calloc(nk_el, sizeof *dv_got);
  assert_true(dq_got != NULL && dk_got != NULL && dv_got != NULL);
  long long bad_guard = 0, launches = 0;
  const int atomic = bc->atomic;

  if (!sc->compact) {
    /* Key pieces: local tensors with kv_row_lo = their first row. */
    kpiece kp[3];
    for (int i = 0; i < sc->nk; ++i) {
      kpiece *x = &kp[i];
      x->lo = sc->kcut[i];
      x->hi = sc->kcut[i + 1];
      const long long len = x->hi - x->lo;
      rt_guarded_copy(b, &x->k, p.k_bits, 2, B, N, Hkv * D, x->lo, len);
      rt_guarded_copy(b, &x->v, p.v_bits, 2, B, N, Hkv * D, x->lo, len);
      rt_guarded_fill(b, &x->dk, 0, 4, B, N, Hkv * D, x->lo, len);
      rt_guarded_fill(b, &x->dv, 0, 4, B, N, Hkv * D, x->lo, len);
    }
    for (int st = 0; st < plan->nsteps; ++st) {
      const rda_bwd_step *s = &plan->bwd_steps[st];
      const long long w = cfg->segments[s->branch] < N ? cfg->segments[s->branch] : N;
      const long long r = cfg->dilations[s->branch];
      for (int iq = 0; iq < sc->nq; ++iq)
        for (int ik = 0; ik < sc->nk; ++ik) {
          const qpiece *x = &qp[iq];
          const kpiece *y = &kp[ik];
          /* The segments both pieces meet (no causal skip: the kernels must find nothing to
           * do for keys wholly in the future), as two launches when there are several. */
          long long seg0[2], nseg[2];
          const int nl = rt_segment_launches(x->lo, x->hi, y->lo, y->hi, w, seg0, nseg);
          for (int l = 0; l < nl; ++l) {
            rda_bwd_params bp;
            rda_bwd_params_for_step(plan, s, &p.ba, &bp);
            bind_queries(&bp, x, H, D);
            bp.k = y->k.view, bp.v = y->v.view;
            bp.dk = (float *)(void *)y->dk.view, bp.dv = (float *)(void *)y->dv.view;
            bp.k_sb = bp.v_sb = bp.dk_sb = bp.dv_sb = y->k.sb;
            bp.k_sn = bp.v_sn = bp.dk_sn = bp.dv_sn = y->k.x;
            bp.k_sh = bp.v_sh = bp.dk_sh = bp.dv_sh = D;
            bp.k_rs = bp.v_rs = bp.dk_rs = bp.dv_rs = r * y->k.x;
            bp.kv_lo = y->lo, bp.kv_hi = y->hi, bp.kv_row_lo = y->lo;
            bp.seg0 = seg0[l];
            launch_pair(be, plan, &p.kern, s, &bp, nseg[l], B, atomic, what);
            ++launches;
          }
        }
    }
    if (b->synchronize(b, &err) != RDA_OK) fail_msg("%s: synchronize: %s", what, err.msg);
    for (int i = 0; i < sc->nk; ++i) {
      rt_guarded_take(b, &kp[i].k, NULL, N, kp[i].lo, &bad_guard);
      rt_guarded_take(b, &kp[i].v, NULL, N, kp[i].lo, &bad_guard);
      rt_guarded_take(b, &kp[i].dk, dk_got, N, kp[i].lo, &bad_guard);
      rt_guarded_take(b, &kp[i].dv, dv_got, N, kp[i].lo, &bad_guard);
    }
  } else {
    /* Compact keys (rt_kv_span, the ring's launches for one offset class): the gradients of
     * each block go to a compact fp32 block, zero in its slot, and are scattered back here. */
    const long long pitch = RT_KV_SLOTS * D, slot = RT_KV_SLOT;
    for (int st = 0; st < plan->nsteps; ++st) {
      const rda_bwd_step *s = &plan->bwd_steps[st];
      rt_kv_span *spans;
      const int nspans =
          rt_kv_spans(cfg, s->branch, s->head0, s->nheads, N, sc->nk, sc->kcut, &spans);
      for (int i = 0; i < nspans; ++i) {
        const rt_kv_span *y = &spans[i];
        const long long rows = y->rows;
        const size_t kb_count = (size_t)(B * rows * pitch);
        uint16_t *kb_dev = rt_kv_block(b, p.k_bits, B, N, Hkv, D, y, 0);
        uint16_t *vb_dev = rt_kv_block(b, p.v_bits, B, N, Hkv, D, y, 0);
        float *gb = malloc(kb_count * sizeof *gb);
        assert_non_null(gb);
        rt_poison_f32(gb, kb_count);
        for (long long t = 0; t < B * rows; ++t)
          memset(gb + t * pitch + slot * D, 0, (size_t)D * 4);
        float *dkb_dev = rt_dev_alloc(b, kb_count * 4), *dvb_dev = rt_dev_alloc(b, kb_count * 4);
        rt_dev_upload(b, dkb_dev, gb, kb_count * 4);
        rt_dev_upload(b, dvb_dev, gb, kb_count * 4);
        for (int iq = 0; iq < sc->nq; ++iq) {
          rda_bwd_params bp;
          rda_bwd_params_for_step(plan, s, &p.ba, &bp);
          bind_queries(&bp, &qp[iq], H, D);
          bp.head0 = y->head;
          bp.nheads = 1;
          bp.k = kb_dev + slot * D, bp.v = vb_dev + slot * D;
          bp.dk = dkb_dev + slot * D, bp.dv = dvb_dev + slot * D;
          bp.k_sb = bp.v_sb = bp.dk_sb = bp.dv_sb = rows * pitch;
          bp.k_sn = bp.v_sn = bp.dk_sn = bp.dv_sn = 0;
          bp.k_sh = bp.v_sh = bp.dk_sh = bp.dv_sh = 0;
          bp.k_rs = bp.v_rs = bp.dk_rs = bp.dv_rs = pitch;
          bp.kv_lo = y->lo, bp.kv_hi = y->hi;
          bp.kv_row_lo = 0; /* unused with k_sn = 0 */
          bp.seg0 = y->seg;
          launch_pair(be, plan, &p.kern, s, &bp, 1, B, atomic, what);
          ++launches;
        }
        if (b->synchronize(b, &err) != RDA_OK) fail_msg("%s: synchronize: %s", what, err.msg);
        for (int g = 0; g < 2; ++g) {
          rt_dev_download(b, gb, g == 0 ? dkb_dev : dvb_dev, kb_count * 4);
          float *full = g == 0 ? dk_got : dv_got;
          for (long long ib = 0; ib < B; ++ib)
            for (long long t = 0; t < rows; ++t) {
              const long long pos = y->pos0 + t * y->r;
              const float *src = gb + (ib * rows + t) * pitch;
              for (long long c = 0; c < D; ++c) {
                bad_guard += !isnan(src[c]); /* the other slot */
                full[((ib * N + pos) * Hkv + y->kv_head) * D + c] += src[slot * D + c];
              }
            }
        }
        free(gb);
        b->free(b, kb_dev);
        b->free(b, vb_dev);
        b->free(b, dkb_dev);
        b->free(b, dvb_dev);
      }
      free(spans);
    }
  }
  if (b->synchronize(b, &err) != RDA_OK) fail_msg("%s: synchronize: %s", what, err.msg);
  for (int i = 0; i < sc->nq; ++i) {
    rt_guarded_take(b, &qp[i].q, NULL, N, qp[i].lo, &bad_guard);
    rt_guarded_take(b, &qp[i].dout, NULL, N, qp[i].lo, &bad_guard);
    rt_guarded_take(b, &qp[i].dq, dq_got, N, qp[i].lo, &bad_guard);
    rt_guarded_take(b, &qp[i].lse, NULL, N, qp[i].lo, &bad_guard);
    rt_guarded_take(b, &qp[i].dp, NULL, N, qp[i].lo, &bad_guard);
  }

  /* The pieces sum to the one-call result up to fp32 summation order, and to the reference. */
  const double dq_vs = rel_l2_f32(dq_got, dq_run, nq_el);
  const double dk_vs = rel_l2_f32(dk_got, dk_run, nk_el);
  const double dv_vs = rel_l2_f32(dv_got, dv_run, nk_el);
  rt_grad_report rep;
  bool ok = check_grads(what, &p, dq_got, qs, dk_got, ks, dv_got, ks, &rep);
  fprintf(stderr,
          "  %-4s %-40s %3lld launches; vs one call dQ %.1e dK %.1e dV %.1e; vs ref dQ %.2e "
          "dK %.2e dV %.2e\n",
          b->name, what, launches, dq_vs, dk_vs, dv_vs, rep.dq_rel_l2, rep.dk_rel_l2,
          rep.dv_rel_l2);
  if (bad_guard != 0) fprintf(stderr, "  %s: %lld guard elements changed\n", what, bad_guard);
  const double same = 1e-5; /* fp32 reassociation of the same products */
  if (!(dq_vs <= same && dk_vs <= same && dv_vs <= same))
    fprintf(stderr, "  %s: pieces differ from the one-call gradients by more than %.0e\n", what,
            same);
  ok = ok && bad_guard == 0 && dq_vs <= same && dk_vs <= same && dv_vs <= same;

  free(dq_got);
  free(dk_got);
  free(dv_got);
  free(dq_run);
  free(dk_run);
  free(dv_run);
  free(lse_host);
  free(dp_host);
  setup_close(b, &p);
  assert_true(ok);
}

static void run_split(const char *what, const split_case *sc) {
  for (int i = 0; i < g_rt.n; ++i) run_split_on(&g_rt.be[i], what, sc);
}

/* The range cases of rda_test_cases.h (test_fwd.c runs them too); the first with a dLSE. */
static void test_bwd_ranges_split_causal_gqa_bf16_d64(void **state) {
  (void)state;
  const split_case sc = {RT_RANGES_SPLIT_CAUSAL_GQA_BF16_D64, .c.with_dlse = 1};
  run_split(__func__, &sc);
}

static void test_bwd_ranges_split_block_mqa_and_group(void **state) {
  (void)state;
  const split_case a = {RT_RANGES_BLOCK_MQA_FP16_D32};
  run_split("ranges_block_mqa_fp16_d32", &a);
  const split_case b = {RT_RANGES_GROUP_CAUSAL_BF16_D32};
  run_split("ranges_group_causal_bf16_d32", &b);
}

/* A key piece that starts inside a query tile, at every offset from the tile's rows: the
 * kernels skip key tiles (dQ) and key groups (dK/dV) wholly in the future of a row group, and
 * an off-by-one there drops exactly one diagonal term, only when the key range starts 15 (mod 16)
 * rows, or BM - 1 - 16 w rows, into a tile. The ring never launches such ranges today; the
 * kernels' parameters allow them. 64 consecutive cuts cover every remainder mod 16 and mod 64;
 * then the wgmma kernels (d = 64) around 63 mod 64. */
static void test_bwd_ranges_key_cut_sweep(void **state) {
  (void)state;
  split_case sc = {.c = {.heads = 2,
                         .kv_heads = 1,
                         .head_dim = 32,
                         .dtype = RDA_DTYPE_BF16,
                         .causal = 1,
                         .offsets = RDA_OFFSETS_MOD,
                         BR2(64, 1, 128, 2),
                         .batch = 1,
                         .n = 128},
                   .nq = 1,
                   .qcut = {0, 128},
                   .nk = 2,
                   .kcut = {0, 0, 128}};
  for (long long cut = 33; cut < 33 + 64; ++cut) {
    char what[64];
    snprintf(what, sizeof what, "ranges_key_cut_%lld", cut);
    sc.kcut[1] = cut;
    run_split(what, &sc);
  }
  /* The wgmma kernels decide per warpgroup of 64 rows: cuts around 63 (mod 64). */
  sc.c.head_dim = 64;
  sc.c.wgmma = 1;
  for (long long cut = 56; cut < 72; ++cut) {
    char what[64];
    snprintf(what, sizeof what, "ranges_key_cut_wgmma_%lld", cut);
    sc.kcut[1] = cut;
    run_split(what, &sc);
  }
}

/* The compact cases of rda_test_cases.h; here the gradients are scattered back from the
 * blocks. */
static void test_bwd_ranges_compact_key_blocks(void **state) {
  (void)state;
  const split_case a = {RT_RANGES_COMPACT_CAUSAL_GQA_BF16_D64};
  run_split("ranges_compact_causal_gqa_bf16_d64", &a);
  const split_case b = {RT_RANGES_COMPACT_BLOCK_MQA_FP16_D32};
  run_split("ranges_compact_block_mqa_fp16_d32", &b);
}

/* The dQ wgmma path on sub-ranges: query pieces that cut a 128-row tile mid-warpgroup, key
 * pieces from compact received blocks, causal GQA fp16 d64, a dense and a dilated branch. */
static void test_bwd_ranges_wgmma_compact_key_blocks(void **state) {
  (void)state;
  const split_case sc = {.c = {.heads = 4,
                               .kv_heads = 2,
                               .head_dim = 64,
                               .dtype = RDA_DTYPE_FP16,
                               .causal = 1,
                               .offsets = RDA_OFFSETS_MOD,
                               BR2(200, 1, 300, 2),
                               .batch = 1,
                               .n = 300,
                               .wgmma = 1},
                         .nq = 2,
                         .qcut = {0, 130, 300},
                         .nk = 2,
                         .kcut = {0, 170, 300},
                         .compact = 1};
  run_split(__func__, &sc);
}

/* The overlapped dQ (each key tile's dS beside the previous tile's dQ += dS K) on sub-ranges:
 * keys starting 64 grid rows before the queries (kq = -64), so a 128-row query tile's first
 * warpgroup has a pending product when its last key tile lies wholly in its future (skipped,
 * the product finished there) while the second warpgroup computes that tile; d = 64 fp16
 * causal GQA, a dense and a dilated branch. */
static void test_bwd_ranges_wgmma_overlap_dq_skip(void **state) {
  (void)state;
  const split_case sc = {.c = {.heads = 4,
                               .kv_heads = 2,
                               .head_dim = 64,
                               .dtype = RDA_DTYPE_FP16,
                               .causal = 1,
                               .offsets = RDA_OFFSETS_MOD,
                               BR2(300, 1, 300, 2),
                               .batch = 1,
                               .n = 300,
                               .wgmma = 1,
                               .dq_tile = "bm128_bn128_w8_s3_wgo"},
                         .nq = 2,
                         .qcut = {0, 100, 300},
                         .nk = 2,
                         .kcut = {0, 36, 300}};
  run_split(__func__, &sc);
}

/* The atomic-dQ dK/dV variant on the same ranges (no dq launches): split and compact. */
static void test_bwd_ranges_atomic_variant(void **state) {
  (void)state;
  const split_case a = {.c = {.heads = 4,
                              .kv_heads = 2,
                              .head_dim = 64,
                              .dtype = RDA_DTYPE_BF16,
                              .causal = 1,
                              .offsets = RDA_OFFSETS_MOD,
                              BR2(64, 1, 120, 2),
                              .batch = 1,
                              .n = 120,
                              .atomic = 1},
                        .nq = 3,
                        .qcut = {0, 29, 75, 120},
                        .nk = 2,
                        .kcut = {0, 58, 120}};
  run_split("ranges_atomic_split_causal_gqa_bf16_d64", &a);
  split_case b = a;
  b.c.causal = 0;
  b.c.dtype = RDA_DTYPE_FP16;
  b.compact = 1;
  run_split("ranges_atomic_compact_fp16_d64", &b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bwd_matches_reference_causal_gqa_bf16_d64_three_branches_dlse),
      cmocka_unit_test(test_bwd_matches_reference_block_mqa_fp16_d128_uncovered_rows),
      cmocka_unit_test(test_bwd_matches_reference_group_causal_bf16_d32_strided_scale),
      cmocka_unit_test(test_bwd_matches_reference_causal_gqa_fp16_d96_dilated),
      cmocka_unit_test(test_bwd_matches_reference_bf16_d256_split_head_dim_strided),
      cmocka_unit_test(test_bwd_matches_reference_causal_fp16_d256),
      cmocka_unit_test(test_bwd_matches_reference_fp16_d64_dense_batch3),
      cmocka_unit_test(test_bwd_matches_reference_bf16_d32_tiny),
      cmocka_unit_test(test_bwd_matches_reference_one_key_per_row),
      cmocka_unit_test(test_bwd_matches_reference_negative_scale_fp16_d64),
      cmocka_unit_test(test_bwd_wgmma_matches_reference_gqa_bf16_d128_multi_tile_dilated),
      cmocka_unit_test(test_bwd_wgmma_matches_reference_causal_fp16_d64_block_offsets),
      cmocka_unit_test(test_bwd_wgmma_overlap_dq_matches_reference),
      cmocka_unit_test(test_bwd_wgmma_matches_reference_causal_mqa_fp16_d128_group),
      cmocka_unit_test(test_bwd_wgmma_with_atomic_mode_matches_reference),
      cmocka_unit_test(test_bwd_deterministic_gradients_are_bit_identical),
      cmocka_unit_test(test_bwd_atomic_add_f32_wrapper_adds_every_contribution),
      cmocka_unit_test(test_bwd_atomic_mode_matches_reference),
      cmocka_unit_test(test_bwd_deterministic_mode_ignores_atomic_variants),
      cmocka_unit_test(test_bwd_rejects_forward_only_plan_and_bad_arguments),
      cmocka_unit_test(test_bwd_ranges_split_causal_gqa_bf16_d64),
      cmocka_unit_test(test_bwd_ranges_split_block_mqa_and_group),
      cmocka_unit_test(test_bwd_ranges_key_cut_sweep),
      cmocka_unit_test(test_bwd_ranges_compact_key_blocks),
      cmocka_unit_test(test_bwd_ranges_wgmma_compact_key_blocks),
      cmocka_unit_test(test_bwd_ranges_wgmma_overlap_dq_skip),
      cmocka_unit_test(test_bwd_ranges_atomic_variant),
  };
  const char *filter = getenv("RDA_TEST_FILTER"); /* e.g. "*negative_scale*" while developing */
  if (filter != NULL) cmocka_set_test_filter(filter);
  const int failed = cmocka_run_group_tests(tests, group_setup, group_teardown);
  return failed + rt_wgmma_env_reached("test_bwd");
}
