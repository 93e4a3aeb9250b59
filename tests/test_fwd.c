/* test_fwd.c — the generated forward kernels (templates/rda_fwd.cuh, rda_util.cuh) against the
 * float64 reference (SPEC §1, §5): a covering set of configs over dtype, head dim, causal,
 * offset rule, GQA, segment edge cases, batch, scale and strided layouts, on every backend here. */
#include "backend.h"
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

#include <cmocka.h>

/* ------------------------------------------------------------------ fixture */

static rt_backends g_rt; /* the generator and the backends every case runs on */

static int group_setup(void **state) {
  (void)state;
  return rt_backends_open(&g_rt, "test_fwd");
}

static int group_teardown(void **state) {
  (void)state;
  rt_backends_close(&g_rt);
  return 0;
}

/* ------------------------------------------------------------------ one case */

enum {
  LAYOUT_CONTIG = 0,    /* [B, N, H, D] everywhere */
  LAYOUT_FUSED_QKV = 1, /* Q, K, V are slices of one [B, N, 3, H, D] tensor */
  LAYOUT_SEQ_FIRST = 2  /* [N, B, H, D] with padded heads for Q, K, V and O; padded LSE rows */
};

typedef struct fwd_case {
  int heads, kv_heads, head_dim, dtype, causal, offsets;
  int nbranch;
  long long w[4], r[4];
  long long batch, n;
  double scale; /* 0: the default 1/sqrt(head_dim) */
  int layout;
  int check_cast; /* also round O with the cast kernel and compare bit for bit */
  int wgmma;      /* plan with RDA_PLAN_WGMMA: every forward variant must be a wgmma one */
  const char *tile; /* NULL, or the tile branch 0's forward kernel is planned with */
} fwd_case;

/* Element strides (batch, n, head) of a [B, N, heads, d] tensor in a layout; pad is extra
 * elements per head row (keeps rows 16-byte aligned). */
static void layout_strides(int layout, long long b, long long n, long long heads, long long d,
                           long long pad, long long s[3]) {
  if (layout == LAYOUT_SEQ_FIRST) {
    rt_strides_seq_first(b, heads, d, pad, s);
  } else {
    rt_strides_contig(n, heads, d, s);
  }
}

/* The cast kernel on o (fp32, strides o_s) into a fresh contiguous storage tensor; every
 * element must equal the round-to-nearest-even of its fp32 value. */
static void check_cast(rt_backend *be, const rda_plan_k *plan, const rda_fwd_kernels *k,
                       const fwd_case *fc, const float *o_dev, const float *o_host,
                       const long long o_s[3]) {
  rda_backend *b = be->b;
  const long long B = fc->batch, N = fc->n, H = fc->heads, D = fc->head_dim;
  long long out_s[3];
  rt_strides_contig(N, H, D, out_s);
  const size_t count = rt_span(B, N, H, D, out_s);
  uint16_t *host = rt_alloc_bits(count, fc->dtype); /* NaN bits: unwritten elements show */
  uint16_t *dev = rt_dev_alloc(b, count * sizeof *dev);
  rt_dev_upload(b, dev, host, count * sizeof *dev);

  rda_cast_params cp;
  memset(&cp, 0, sizeof cp);
  cp.o = o_dev;
  cp.out = dev;
  cp.o_sb = o_s[0], cp.o_sn = o_s[1], cp.o_sh = o_s[2];
  cp.out_sb = out_s[0], cp.out_sn = out_s[1], cp.out_sh = out_s[2];
  cp.batch = B;
  cp.n = N;
  cp.heads = (int)H;
  cp.head_dim = (int)D;
  const rda_variant *v = &plan->variants[plan->cast_kernel];
  long long blocks = (B * N * H * D / 8 + v->threads - 1) / v->threads;
  if (blocks > 7) blocks = 7; /* fewer blocks than elements: the grid-stride loop must cover */
  const unsigned grid[3] = {(unsigned)blocks, 1, 1};
  rda_err err = {0};
  if (b->launch(b, k->modules[plan->cast_kernel], grid, (unsigned)v->threads, 0, &cp, sizeof cp,
                &err) != RDA_OK ||
      b->synchronize(b, &err) != RDA_OK)
    fail_msg("%s cast: %s", b->name, err.msg);
  rt_dev_download(b, host, dev, count * sizeof *dev);

  long long bad = 0;
  for (long long ib = 0; ib < B; ++ib)
    for (long long in = 0; in < N; ++in)
      for (long long ih = 0; ih < H; ++ih)
        for (long long id = 0; id < D; ++id) {
          const float x = o_host[ib * o_s[0] + in * o_s[1] + ih * o_s[2] + id];
          const uint16_t want = rda_to_dtype_bits((double)x, fc->dtype);
          const uint16_t got = host[ib * out_s[0] + in * out_s[1] + ih * out_s[2] + id];
          if (got != want && bad++ < 5)
            fprintf(stderr,
                    "  cast[b=%lld n=%lld h=%lld d=%lld] of %.8g = 0x%04x, expected 0x%04x\n", ib,
                    in, ih, id, (double)x, got, want);
        }
  b->free(b, dev);
  free(host);
  if (bad > 0) fail_msg("%s cast: %lld elements differ", b->name, bad);
}

/* Plan, load and run the forward pass of one case on one backend; compare with the reference. */
static void run_case_on(rt_backend *be, const char *what, const fwd_case *fc) {
  rda_backend *b = be->b;
  const long long B = fc->batch, N = fc->n, H = fc->heads, Hkv = fc->kv_heads, D = fc->head_dim;
  rda_config cfg;
  rt_config_make(&cfg, fc->heads, fc->kv_heads, fc->head_dim, fc->dtype, fc->causal, fc->offsets,
                 fc->nbranch, fc->w, fc->r);
  if (fc->scale != 0.0) cfg.scale = fc->scale;

  rda_err err = {0};
  rda_plan_k plan;
  memset(&plan, 0, sizeof plan);
  if (fc->wgmma && !rt_wgmma_runs_on(be, what)) return;
  rt_plan_with_tile(g_rt.gen, &cfg, &be->hw, fc->wgmma ? RDA_PLAN_WGMMA : 0u, "fwd", fc->tile,
                    &plan, what);
  rt_check_wgmma_plan(&plan, "fwd", fc->wgmma, what);
  rda_fwd_kernels kern = {0, NULL};
  const double t_load = rt_now_s();
  if (rda_fwd_load(b, &plan, &kern, &err) != RDA_OK) fail_msg("%s: load: %s", what, err.msg);
  const double load_s = rt_now_s() - t_load;

  /* Inputs: normal(0, 1) rounded to the storage dtype. */
  double *q = rt_normal((size_t)(B * N * H * D), fc->dtype);
  double *k = rt_normal((size_t)(B * N * Hkv * D), fc->dtype);
  double *v = rt_normal((size_t)(B * N * Hkv * D), fc->dtype);

  long long q_s[3], k_s[3], v_s[3], o_s[3], lse_s[2];
  size_t q_off = 0, k_off = 0, v_off = 0, in_count;
  if (fc->layout == LAYOUT_FUSED_QKV) {
    assert_int_equal(H, Hkv);
    long long s[3] = {N * 3 * H * D, 3 * H * D, D};
    memcpy(q_s, s, sizeof s);
    memcpy(k_s, s, sizeof s);
    memcpy(v_s, s, sizeof s);
    q_off = 0;
    k_off = (size_t)(H * D);
    v_off = (size_t)(2 * H * D);
    in_count = (size_t)(B * N * 3 * H * D);
  } else {
    layout_strides(fc->layout, B, N, H, D, fc->layout == LAYOUT_SEQ_FIRST ? 8 : 0, q_s);
    layout_strides(fc->layout, B, N, Hkv, D, fc->layout == LAYOUT_SEQ_FIRST ? 16 : 0, k_s);
    layout_strides(fc->layout, B, N, Hkv, D, fc->layout == LAYOUT_SEQ_FIRST ? 24 : 0, v_s);
    const size_t qn = rt_span(B, N, H, D, q_s), kn = rt_span(B, N, Hkv, D, k_s);
    q_off = 0;
    k_off = qn;
    v_off = qn + kn;
    in_count = qn + kn + rt_span(B, N, Hkv, D, v_s);
  }
  uint16_t *in_host = rt_alloc_bits(in_count, fc->dtype); /* gaps stay NaN */
  rt_pack_bits(in_host + q_off, q, B, N, H, D, q_s, fc->dtype);
  rt_pack_bits(in_host + k_off, k, B, N, Hkv, D, k_s, fc->dtype);
  rt_pack_bits(in_host + v_off, v, B, N, Hkv, D, v_s, fc->dtype);
  uint16_t *in_dev = rt_dev_alloc(b, in_count * sizeof *in_dev);
  rt_dev_upload(b, in_dev, in_host, in_count * sizeof *in_dev);

  if (fc->layout == LAYOUT_SEQ_FIRST) {
    layout_strides(fc->layout, B, N, H, D, 4, o_s);
    lse_s[1] = N + 3;
    lse_s[0] = H * lse_s[1] + 1;
  } else {
    rt_strides_contig(N, H, D, o_s);
    lse_s[1] = N;
    lse_s[0] = H * N;
  }
  const size_t o_count = rt_span(B, N, H, D, o_s);
  const size_t lse_count = (size_t)((B - 1) * lse_s[0] + (H - 1) * lse_s[1] + N);
  float *o_host = malloc(o_count * sizeof *o_host);
  float *lse_host = malloc(lse_count * sizeof *lse_host);
  assert_non_null(o_host);
  assert_non_null(lse_host);
  rt_poison_f32(o_host, o_count);
  rt_poison_f32(lse_host, lse_count);
  float *o_dev = rt_dev_alloc(b, o_count * sizeof *o_dev);
  float *lse_dev = rt_dev_alloc(b, lse_count * sizeof *lse_dev);
  rt_dev_upload(b, o_dev, o_host, o_count * sizeof *o_dev);
  rt_dev_upload(b, lse_dev, lse_host, lse_count * sizeof *lse_dev);

  rda_fwd_args a;
  memset(&a, 0, sizeof a);
  a.batch = B;
  a.n = N;
  a.q = in_dev + q_off;
  a.k = in_dev + k_off;
  a.v = in_dev + v_off;
  memcpy(a.q_s, q_s, sizeof q_s);
  memcpy(a.k_s, k_s, sizeof k_s);
  memcpy(a.v_s, v_s, sizeof v_s);
  a.o = o_dev;
  memcpy(a.o_s, o_s, sizeof o_s);
  a.lse = lse_dev;
  memcpy(a.lse_s, lse_s, sizeof lse_s);
  const double t_run = rt_now_s();
  if (rda_fwd_run(b, &plan, &kern, &a, &err) != RDA_OK || b->synchronize(b, &err) != RDA_OK)
    fail_msg("%s: run: %s", what, err.msg);
  const double run_s = rt_now_s() - t_run;
  rt_dev_download(b, o_host, o_dev, o_count * sizeof *o_dev);
  rt_dev_download(b, lse_host, lse_dev, lse_count * sizeof *lse_dev);

  double *o_ref, *lse_ref;
  rt_reference(&cfg, B, N, q, k, v, &o_ref, &lse_ref);
  rt_report rep;
  const bool ok =
      rt_check_fwd(what, &cfg, B, N, o_host, o_s, lse_host, lse_s, o_ref, lse_ref, &rep);
  fprintf(stderr, "  %-4s %-52s O %.2e  LSE %.2e  rows %lld+%lld  load %.1fs run %.2fs\n", b->name,
          what, rep.o_rel_l2, rep.lse_max_abs, rep.covered_rows, rep.uncovered_rows, load_s, run_s);
  if (ok && fc->check_cast) check_cast(be, &plan, &kern, fc, o_dev, o_host, o_s);

  free(o_ref);
  free(lse_ref);
  b->free(b, o_dev);
  b->free(b, lse_dev);
  b->free(b, in_dev);
  free(o_host);
  free(lse_host);
  free(in_host);
  free(q);
  free(k);
  free(v);
  rda_fwd_unload(b, &kern);
  rda_plan_k_free(&plan);
  assert_true(ok);
}

static void run_case(const char *what, const fwd_case *fc) {
  for (int i = 0; i < g_rt.n; ++i) run_case_on(&g_rt.be[i], what, fc);
}

/* ------------------------------------------------------------------ the cases */
/* Each case names what it adds to the cover; pairwise causal x dilated x GQA x dtype holds over
 * the set, every head dim runs in both dtypes and both causal modes. */

/* Three branches merged by LSE; a dense branch with several query tiles per segment and a
 * partial last segment; w > N clamped; block_m 128 and 64 variants both planned. */
static void test_fwd_matches_reference_causal_gqa_bf16_d64_three_branches(void **state) {
  (void)state;
  const fwd_case c = {.heads = 4,
                      .kv_heads = 2,
                      .head_dim = 64,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR3(200, 1, 128, 2, 512, 4),
                      .batch = 1,
                      .n = 300};
  run_case(__func__, &c);
}

/* Dilation 3 not dividing w = 100, block offsets, rows no branch covers, batch 2. */
static void test_fwd_matches_reference_fp16_d64_block_offsets_uncovered_rows(void **state) {
  (void)state;
  const fwd_case c = {.heads = 4,
                      .kv_heads = 4,
                      .head_dim = 64,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_BLOCK,
                      BR1(100, 3),
                      .batch = 2,
                      .n = 200};
  run_case(__func__, &c);
}

/* Group offsets (each head one branch), MQA, segment > N, batch 2. */
static void test_fwd_matches_reference_mqa_bf16_d128_group_offsets(void **state) {
  (void)state;
  const fwd_case c = {.heads = 3,
                      .kv_heads = 1,
                      .head_dim = 128,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_GROUP,
                      BR3(64, 1, 96, 2, 300, 3),
                      .batch = 2,
                      .n = 257};
  run_case(__func__, &c);
}

/* Causal dilated only, w > N, a custom scale, GQA. */
static void test_fwd_matches_reference_causal_gqa_fp16_d128_custom_scale(void **state) {
  (void)state;
  const fwd_case c = {.heads = 2,
                      .kv_heads = 1,
                      .head_dim = 128,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR1(1000, 2),
                      .batch = 1,
                      .n = 200,
                      .scale = 0.3};
  run_case(__func__, &c);
}

/* Q, K, V as slices of a fused [B, N, 3, H, D] tensor; causal; batch 2. */
static void test_fwd_matches_reference_causal_bf16_d32_fused_qkv(void **state) {
  (void)state;
  const fwd_case c = {.heads = 4,
                      .kv_heads = 4,
                      .head_dim = 32,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(128, 1, 512, 2),
                      .batch = 2,
                      .n = 333,
                      .layout = LAYOUT_FUSED_QKV};
  run_case(__func__, &c);
}

/* Sequence-first [N, B, H, D] with padded rows for every tensor, r = 5, GQA, the cast kernel
 * on a strided accumulator. */
static void test_fwd_matches_reference_gqa_fp16_d96_seq_first_strides(void **state) {
  (void)state;
  const fwd_case c = {.heads = 4,
                      .kv_heads = 2,
                      .head_dim = 96,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(50, 1, 150, 5),
                      .batch = 2,
                      .n = 222,
                      .layout = LAYOUT_SEQ_FIRST,
                      .check_cast = 1};
  run_case(__func__, &c);
}

/* The d = 256 kernel (Q reloaded from shared memory), causal, group offsets. */
static void test_fwd_matches_reference_causal_bf16_d256_group_offsets(void **state) {
  (void)state;
  /* 3 heads over 2 branches: the first branch takes the extra head (SPEC §1). */
  const fwd_case c = {.heads = 3,
                      .kv_heads = 3,
                      .head_dim = 256,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_GROUP,
                      BR2(100, 1, 200, 3),
                      .batch = 1,
                      .n = 150};
  run_case(__func__, &c);
}

/* d = 256, dilated only, block offsets, MQA, batch 2. */
static void test_fwd_matches_reference_mqa_fp16_d256_block_offsets(void **state) {
  (void)state;
  const fwd_case c = {.heads = 3,
                      .kv_heads = 1,
                      .head_dim = 256,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_BLOCK,
                      BR2(64, 2, 256, 2),
                      .batch = 2,
                      .n = 130};
  run_case(__func__, &c);
}

/* d = 256 with a negative scale: the kernel that reloads Q from shared memory per k-step
 * folds the sign into every reloaded fragment (the register path does it once); causal GQA,
 * dilated and dense branches. */
static void test_fwd_matches_reference_negative_scale_causal_gqa_fp16_d256(void **state) {
  (void)state;
  const fwd_case c = {.heads = 4,
                      .kv_heads = 2,
                      .head_dim = 256,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(64, 1, 128, 2),
                      .batch = 1,
                      .n = 130,
                      .scale = -0.2};
  run_case(__func__, &c);
}

/* Dense only, one segment of 300 rows: three query tiles, ragged last key tile; cast checked. */
static void test_fwd_matches_reference_bf16_d32_dense_ragged_tiles(void **state) {
  (void)state;
  const fwd_case c = {.heads = 2,
                      .kv_heads = 2,
                      .head_dim = 32,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 0,
                      .offsets = RDA_OFFSETS_MOD,
                      BR1(300, 1),
                      .batch = 1,
                      .n = 300,
                      .check_cast = 1};
  run_case(__func__, &c);
}

/* Causal, dilated branches only: rows first covered by the second branch (merge into -inf),
 * rows covered by none; GQA 4:1. */
static void test_fwd_matches_reference_causal_gqa_fp16_d32_dilated_merge(void **state) {
  (void)state;
  const fwd_case c = {.heads = 4,
                      .kv_heads = 1,
                      .head_dim = 32,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(96, 2, 160, 4),
                      .batch = 1,
                      .n = 250};
  run_case(__func__, &c);
}

/* d = 96 causal with block offsets and a dense branch, GQA. */
static void test_fwd_matches_reference_causal_gqa_bf16_d96_block_offsets(void **state) {
  (void)state;
  const fwd_case c = {.heads = 2,
                      .kv_heads = 1,
                      .head_dim = 96,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_BLOCK,
                      BR2(64, 1, 192, 2),
                      .batch = 1,
                      .n = 190};
  run_case(__func__, &c);
}

/* Causal dense, one segment of 256 rows: diagonal tiles of both query tiles, GQA, batch 2. */
static void test_fwd_matches_reference_causal_gqa_fp16_d64_dense_diagonal(void **state) {
  (void)state;
  const fwd_case c = {.heads = 2,
                      .kv_heads = 1,
                      .head_dim = 64,
                      .dtype = RDA_DTYPE_FP16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR1(256, 1),
                      .batch = 2,
                      .n = 256};
  run_case(__func__, &c);
}

/* N = 1: segments clamp to one row; head 1's dilated grid (offset 1) is empty. */
static void test_fwd_matches_reference_single_row_sequence(void **state) {
  (void)state;
  const fwd_case c = {.heads = 2,
                      .kv_heads = 2,
                      .head_dim = 64,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR2(4, 1, 8, 2),
                      .batch = 1,
                      .n = 1};
  run_case(__func__, &c);
}

/* The d = 128 bf16 block_m = 128 variants (the performance target's): several query tiles of a
 * dense and of a dilated grid, ragged last tiles, a partial second segment, GQA. Then the same
 * on the wgmma path (sm_90a; RDA_PLAN_WGMMA): two warpgroups per block. */
static void test_fwd_matches_reference_gqa_bf16_d128_multi_tile_grids(void **state) {
  (void)state;
  fwd_case c = {.heads = 2,
                .kv_heads = 1,
                .head_dim = 128,
                .dtype = RDA_DTYPE_BF16,
                .causal = 0,
                .offsets = RDA_OFFSETS_MOD,
                BR2(384, 1, 400, 2),
                .batch = 1,
                .n = 400};
  run_case(__func__, &c);
  c.wgmma = 1;
  run_case("wgmma_gqa_bf16_d128_multi_tile_grids", &c);
}

/* Causal with three query tiles of one segment (heaviest tile first) and two diagonal key tiles
 * per query tile. */
static void test_fwd_matches_reference_causal_bf16_d128_multi_tile_diagonal(void **state) {
  (void)state;
  const fwd_case c = {.heads = 2,
                      .kv_heads = 2,
                      .head_dim = 128,
                      .dtype = RDA_DTYPE_BF16,
                      .causal = 1,
                      .offsets = RDA_OFFSETS_MOD,
                      BR1(320, 1),
                      .batch = 2,
                      .n = 320};
  run_case(__func__, &c);
}

/* RT_CASE_WGMMA_CAUSAL_FP16_D64_BLOCK (rda_test_cases.h): the 64-row wgmma tile for its 64-row
 * grids, the 128-row one for the dense grid. */
static void test_fwd_wgmma_matches_reference_causal_fp16_d64_block_offsets(void **state) {
  (void)state;
  const fwd_case c = {RT_CASE_WGMMA_CAUSAL_FP16_D64_BLOCK};
  run_case(__func__, &c);
}

/* The wgmma path with overlap (each key tile's softmax beside the previous tile's P V product,
 * three K/V stages), both of its tiles at d = 128: four key tiles per segment with a ragged
 * last one, a last query tile whose second warpgroup has no rows, GQA, a dilated second
 * branch on the plain path beside it (merged by LSE). */
static void test_fwd_wgmma_overlap_matches_reference_gqa_bf16_d128(void **state) {
  (void)state;
  fwd_case c = {.heads = 2,
                .kv_heads = 1,
                .head_dim = 128,
                .dtype = RDA_DTYPE_BF16,
                .causal = 0,
                .offsets = RDA_OFFSETS_MOD,
                BR2(400, 1, 400, 2),
                .batch = 1,
                .n = 400,
                .wgmma = 1,
                .tile = "bm128_bn128_w8_s3_wgo"};
  run_case(__func__, &c);
  c.tile = "bm64_bn128_w4_s3_wgo";
  c.causal = 1;
  run_case("wgmma_overlap_causal_bm64_gqa_bf16_d128", &c);
}

/* The same at d = 64, fp16, causal, with a negative scale (the softmax runs on -S), block
 * offsets and batch 2: the diagonal key tiles masked per row while the previous P V is in
 * flight. */
static void test_fwd_wgmma_overlap_matches_reference_causal_fp16_d64(void **state) {
  (void)state;
  fwd_case c = {RT_CASE_WGMMA_CAUSAL_FP16_D64_BLOCK};
  c.scale = -0.3;
  c.tile = "bm128_bn128_w8_s3_wgo";
  run_case(__func__, &c);
}

/* The kernels move 16-byte vectors; a misaligned pointer or stride is refused before launch
 * (a GPU would fault on it), naming the tensor. */
static void test_fwd_rejects_misaligned_tensors(void **state) {
  (void)state;
  rt_backend *be = &g_rt.be[0];
  rda_config cfg;
  const long long w[1] = {64}, r[1] = {1};
  rt_config_make(&cfg, 2, 2, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, w, r);
  rda_err err = {0};
  rda_plan_k plan;
  memset(&plan, 0, sizeof plan);
  assert_int_equal(rda_gen_plan(g_rt.gen, &cfg, &be->hw, &plan, &err), RDA_OK);
  rda_fwd_kernels kern = {0, NULL};
  assert_int_equal(rda_fwd_load(be->b, &plan, &kern, &err), RDA_OK);
  const long long N = 64, H = 2, D = 32;
  uint16_t *in = rt_dev_alloc(be->b, (size_t)(3 * N * H * D + 8) * sizeof *in);
  float *o = rt_dev_alloc(be->b, (size_t)(N * H * D + 4) * sizeof *o);
  float *lse = rt_dev_alloc(be->b, (size_t)(H * N) * sizeof *lse);
  rda_fwd_args a;
  memset(&a, 0, sizeof a);
  a.batch = 1, a.n = N;
  a.q = in, a.k = in + N * H * D, a.v = in + 2 * N * H * D;
  rt_strides_contig(N, H, D, a.q_s);
  rt_strides_contig(N, H, D, a.k_s);
  rt_strides_contig(N, H, D, a.v_s);
  rt_strides_contig(N, H, D, a.o_s);
  a.o = o, a.lse = lse, a.lse_s[0] = H * N, a.lse_s[1] = N;

  a.q = in + 1; /* 2 bytes off */
  assert_int_equal(rda_fwd_run(be->b, &plan, &kern, &a, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "q: pointer"));
  a.q = in;
  rda_err_clear(&err);
  a.k_s[2] = 36; /* head stride of 72 bytes */
  assert_int_equal(rda_fwd_run(be->b, &plan, &kern, &a, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "k: stride 2"));
  a.k_s[2] = D;
  rda_err_clear(&err);
  a.o = o + 2; /* 8 bytes off */
  assert_int_equal(rda_fwd_run(be->b, &plan, &kern, &a, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "o: pointer"));
  a.o = o;

  /* A segment of 2^31 grid rows: the kernels count them in 32-bit ints, so it is refused
   * before any launch (the pointers above would not hold such a sequence). */
  rda_config big;
  const long long wb[1] = {1LL << 32}, rb[1] = {1};
  rt_config_make(&big, 2, 2, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, wb, rb);
  rda_plan_k bplan;
  memset(&bplan, 0, sizeof bplan);
  assert_int_equal(rda_gen_plan(g_rt.gen, &big, &be->hw, &bplan, &err), RDA_OK);
  rda_fwd_kernels bkern = {0, NULL};
  assert_int_equal(rda_fwd_load(be->b, &bplan, &bkern, &err), RDA_OK);
  rda_err_clear(&err);
  a.n = 1LL << 31;
  assert_int_equal(rda_fwd_run(be->b, &bplan, &bkern, &a, &err), RDA_ERR_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "grid rows per segment"));
  rda_fwd_unload(be->b, &bkern);
  rda_plan_k_free(&bplan);

  be->b->free(be->b, in);
  be->b->free(be->b, o);
  be->b->free(be->b, lse);
  rda_fwd_unload(be->b, &kern);
  rda_plan_k_free(&plan);
}

/* ------------------------------------------------------------------ row ranges (the ring) */
/* The ring (runtime/ring_compute.c) runs the forward kernel on sub-ranges: a rank's query rows
 * with q, o and lse as its local tensors (row_lo) against its own or received key rows
 * (kv_row_lo), per range of segments; rda_fwd_init sets o = 0 and lse = -inf first and every
 * launch then merges by log-sum-exp (merge = 1). These cases split one problem that way (cuts
 * given per case, no causal skip in the harness: the kernel must find nothing to do for keys
 * wholly in the future) and compare the merged O and LSE with rda_fwd_run on the whole problem
 * and with the float64 reference. Every piece is guarded (rt_guarded; o and lse start all NaN,
 * so init must write them). */

enum { kMaxPieces = 17 };

typedef struct range_case {
  fwd_case c;                                           /* the problem; contiguous layouts */
  int nq, nk;                                           /* query and key pieces */
  long long qcut[kMaxPieces + 1], kcut[kMaxPieces + 1]; /* cut[0] = 0 < ... < cut[n] = N */
  int compact; /* keys from compact blocks: one per (query head, segment, key piece) */
} range_case;

/* One query piece's tensors, all guarded: q (storage) and o (fp32) [B, rows, H, D], lse fp32
 * [B * H][rows] (the guards between heads too). */
typedef struct range_qpiece {
  long long lo, hi;
  rt_guarded q, o, lse;
} range_qpiece;

typedef struct range_kpiece {
  long long lo, hi;
  rt_guarded k, v;
} range_kpiece;

static long long ceil_div_ll(long long a, long long b) {
  return (a + b - 1) / b;
}

/* O and LSE of the pieces against those of the whole problem in one call. LSE sums the
 * unrounded fp32 P, so the two differ by fp32 rounding of the merges only: allowed 1e-5
 * relative (about 100 fp32 ulps; measured < 2e-6 absolute). O may differ more: P is rounded to
 * the storage dtype (unit roundoff u: 2^-8 bf16, 2^-11 fp16) after subtracting the running row
 * maximum, and where the keys are cut changes that maximum and so how each P rounds. With P_i
 * the row's normalized weights, |O - O'| <= 2u sum_i P_i |V_i| = 2u M; M per row (mv, from
 * the reference run on V rows replaced by their norms), allowed (2u + 1e-5) M. A key missing or
 * counted twice moves LSE by about its weight P_i. */
static long long compare_with_run(const char *what, const fwd_case *fc, const float *o_got,
                                  const float *lse_got, const float *o_run, const float *lse_run,
                                  const double *mv, double *lse_max, double *o_ratio) {
  const long long B = fc->batch, N = fc->n, H = fc->heads, D = fc->head_dim;
  const double u = fc->dtype == RDA_DTYPE_BF16 ? 1.0 / 256.0 : 1.0 / 2048.0;
  long long bad = 0;
  *lse_max = 0.0;
  *o_ratio = 0.0; /* the largest |O - O'| / M */
  for (long long ib = 0; ib < B; ++ib)
    for (long long ih = 0; ih < H; ++ih)
      for (long long in = 0; in < N; ++in) {
        const float lg = lse_got[(ib * H + ih) * N + in], lr = lse_run[(ib * H + ih) * N + in];
        const size_t row = (size_t)(((ib * N + in) * H + ih) * D);
        double num = 0.0;
        for (long long id = 0; id < D; ++id) {
          const double d = (double)o_got[row + id] - (double)o_run[row + id];
          num += d * d;
        }
        const double odiff = sqrt(num), m = mv[row];
        const double ldiff = lg == lr ? 0.0 : fabs((double)lg - (double)lr); /* -inf == -inf */
        /* Written so that NaN in either fails. */
        const bool ok = ldiff <= 1e-5 * fmax(1.0, fabs((double)lr)) && odiff <= (2 * u + 1e-5) * m;
        if (!(ldiff <= *lse_max)) *lse_max = ldiff;
        if (m > 0.0 && !(odiff / m <= *o_ratio)) *o_ratio = odiff / m;
        if (!ok && bad++ < 5)
          fprintf(stderr,
                  "  %s: b=%lld h=%lld row %lld: LSE %.7g, one call %.7g; |O - O'| %.3g, "
                  "allowed %.3g\n",
                  what, ib, ih, in, (double)lg, (double)lr, odiff, (2 * u + 1e-5) * m);
      }
  return bad;
}

/* Point fp's queries, o and lse at query piece x (row_lo = its first row). */
static void bind_query_piece(rda_fwd_params *fp, const range_qpiece *x, long long H, long long D) {
  fp->q = x->q.view;
  fp->q_sb = x->q.sb, fp->q_sn = H * D, fp->q_sh = D;
  fp->o = (float *)(void *)x->o.view;
  fp->o_sb = x->o.sb, fp->o_sn = H * D, fp->o_sh = D;
  fp->lse = (float *)(void *)x->lse.view;
  fp->lse_sb = H * x->lse.sb, fp->lse_sh = x->lse.sb;
  fp->q_lo = x->lo, fp->q_hi = x->hi, fp->row_lo = x->lo;
  fp->merge = 1;
}

/* Launch fp's kernel of step s over nseg segments from fp->seg0 for the queries [q_lo, q_hi):
 * at most ceil(L / r) grid rows lie in L consecutive positions (as the ring sizes its grids). */
static void launch_range(rt_backend *be, const rda_plan_k *plan, const rda_fwd_kernels *kern,
                         const rda_step *s, rda_fwd_params *fp, long long nseg, long long batch,
                         int nheads, const char *what) {
  const rda_variant *var = &plan->variants[s->kernel];
  const long long rows_w = ceil_div_ll(fp->w, fp->r),
                  rows_q = ceil_div_ll(fp->q_hi - fp->q_lo, fp->r);
  fp->tiles_per_seg = (int)ceil_div_ll(rows_w < rows_q ? rows_w : rows_q, var->block_m);
  const unsigned grid[3] = {(unsigned)(nseg * fp->tiles_per_seg), (unsigned)nheads,
                            (unsigned)batch};
  rda_err err = {0};
  if (be->b->launch(be->b, kern->modules[s->kernel], grid, (unsigned)var->threads,
                    (unsigned)var->smem_bytes, fp, sizeof *fp, &err) != RDA_OK)
    fail_msg("%s: launch: %s", what, err.msg);
}

/* Compact received keys (rt_kv_span): one launch per block, for its query head, with the
 * queries of each piece inside its segment; every block has RT_GUARD_ROWS NaN rows before and
 * after each batch entry's rows besides the NaN neighbour slot. */
static long long launch_compact(rt_backend *be, const rda_plan_k *plan, const rda_fwd_kernels *kern,
                                const rda_fwd_args *whole, const range_case *rc,
                                const range_qpiece *qp, const uint16_t *k_bits,
                                const uint16_t *v_bits, const char *what) {
  rda_backend *b = be->b;
  const long long B = rc->c.batch, N = rc->c.n, Hkv = rc->c.kv_heads, D = rc->c.head_dim;
  const long long H = rc->c.heads, pitch = RT_KV_SLOTS * D;
  const long long row0 = RT_GUARD_ROWS * pitch + RT_KV_SLOT * D; /* the first row's slot */
  long long launches = 0;
  rda_err err = {0};
  for (int st = 0; st < plan->nsteps; ++st) {
    const rda_step *s = &plan->steps[st];
    rt_kv_span *spans;
    const int nspans =
        rt_kv_spans(&plan->cfg, s->branch, s->head0, s->nheads, N, rc->nk, rc->kcut, &spans);
    for (int i = 0; i < nspans; ++i) {
      const rt_kv_span *y = &spans[i];
      const long long brows = y->rows + 2 * RT_GUARD_ROWS;
      uint16_t *kd = rt_kv_block(b, k_bits, B, N, Hkv, D, y, RT_GUARD_ROWS);
      uint16_t *vd = rt_kv_block(b, v_bits, B, N, Hkv, D, y, RT_GUARD_ROWS);
      for (int iq = 0; iq < rc->nq; ++iq) {
        const long long qlo = qp[iq].lo > y->a ? qp[iq].lo : y->a;
        const long long qhi = qp[iq].hi < y->e ? qp[iq].hi : y->e;
        if (qlo >= qhi) continue;
        rda_fwd_params fp;
        rda_fwd_params_for_step(plan, s, whole, &fp);
        bind_query_piece(&fp, &qp[iq], H, D);
        fp.q_lo = qlo, fp.q_hi = qhi;
        fp.head0 = y->head;
        fp.k = kd + row0, fp.v = vd + row0;
        fp.k_sb = fp.v_sb = brows * pitch;
        fp.k_sn = fp.v_sn = fp.k_sh = fp.v_sh = 0;
        fp.k_rs = fp.v_rs = pitch;
        fp.kv_lo = y->lo, fp.kv_hi = y->hi, fp.kv_row_lo = 0; /* unused with k_sn = 0 */
        fp.seg0 = y->seg;
        launch_range(be, plan, kern, s, &fp, 1, B, 1, what);
        ++launches;
      }
      /* The kernels read the blocks asynchronously (cuda): wait before freeing them. */
      if (b->synchronize(b, &err) != RDA_OK) fail_msg("%s: synchronize: %s", what, err.msg);
      b->free(b, kd);
      b->free(b, vd);
    }
    free(spans);
  }
  return launches;
}

static void run_ranges_on(rt_backend *be, const char *what, const range_case *rc) {
  rda_backend *b = be->b;
  const fwd_case *fc = &rc->c;
  const long long B = fc->batch, N = fc->n, H = fc->heads, Hkv = fc->kv_heads, D = fc->head_dim;
  if (fc->wgmma && !rt_wgmma_runs_on(be, what)) return;
  assert_true(rc->nq >= 1 && rc->nq <= kMaxPieces && rc->nk >= 1 && rc->nk <= kMaxPieces);
  assert_true(rc->qcut[0] == 0 && rc->qcut[rc->nq] == N && rc->kcut[0] == 0 &&
              rc->kcut[rc->nk] == N);
  assert_int_equal(fc->layout, LAYOUT_CONTIG);
  rda_config cfg;
  rt_config_make(&cfg, fc->heads, fc->kv_heads, fc->head_dim, fc->dtype, fc->causal, fc->offsets,
                 fc->nbranch, fc->w, fc->r);
  if (fc->scale != 0.0) cfg.scale = fc->scale;
  rda_err err = {0};
  rda_plan_k plan;
  memset(&plan, 0, sizeof plan);
  rt_plan_with_tile(g_rt.gen, &cfg, &be->hw, fc->wgmma ? RDA_PLAN_WGMMA : 0u, "fwd", fc->tile,
                    &plan, what);
  rt_check_wgmma_plan(&plan, "fwd", fc->wgmma, what);
  rda_fwd_kernels kern = {0, NULL};
  if (rda_fwd_load(b, &plan, &kern, &err) != RDA_OK) fail_msg("%s: load: %s", what, err.msg);

  /* Inputs: normal(0, 1) rounded to the storage dtype, contiguous. */
  const size_t nq_el = (size_t)(B * N * H * D), nk_el = (size_t)(B * N * Hkv * D);
  const size_t nstat = (size_t)(B * H * N);
  double *q = rt_normal(nq_el, fc->dtype);
  double *k = rt_normal(nk_el, fc->dtype);
  double *v = rt_normal(nk_el, fc->dtype);
  long long q_s[3], k_s[3];
  rt_strides_contig(N, H, D, q_s);
  rt_strides_contig(N, Hkv, D, k_s);
  uint16_t *q_bits = rt_make_bits(q, B, N, H, D, q_s, fc->dtype, NULL);
  uint16_t *k_bits = rt_make_bits(k, B, N, Hkv, D, k_s, fc->dtype, NULL);
  uint16_t *v_bits = rt_make_bits(v, B, N, Hkv, D, k_s, fc->dtype, NULL);

  /* The whole problem in one call. */
  uint16_t *q_dev = rt_dev_alloc(b, nq_el * 2), *k_dev = rt_dev_alloc(b, nk_el * 2),
           *v_dev = rt_dev_alloc(b, nk_el * 2);
  rt_dev_upload(b, q_dev, q_bits, nq_el * 2);
  rt_dev_upload(b, k_dev, k_bits, nk_el * 2);
  rt_dev_upload(b, v_dev, v_bits, nk_el * 2);
  float *o_dev = rt_dev_poisoned(b, nq_el), *lse_dev = rt_dev_poisoned(b, nstat);
  rda_fwd_args whole;
  rda_fwd_args_contiguous(&whole, &cfg, B, N, q_dev, k_dev, v_dev, o_dev, lse_dev);
  if (rda_fwd_run(b, &plan, &kern, &whole, &err) != RDA_OK || b->synchronize(b, &err) != RDA_OK)
    fail_msg("%s: run: %s", what, err.msg);
  float *o_run = rt_download_f32(b, o_dev, nq_el);
  float *lse_run = rt_download_f32(b, lse_dev, nstat);

  /* Query pieces, each initialized as a ring rank's rows are (rda_fwd_init over its n rows). */
  range_qpiece qp[kMaxPieces];
  for (int i = 0; i < rc->nq; ++i) {
    range_qpiece *x = &qp[i];
    x->lo = rc->qcut[i];
    x->hi = rc->qcut[i + 1];
    const long long len = x->hi - x->lo;
    assert_true(len >= 1);
    rt_guarded_copy(b, &x->q, q_bits, 2, B, N, H * D, x->lo, len);
    rt_guarded_fill(b, &x->o, 0xff, 4, B, N, H * D, x->lo, len);
    rt_guarded_fill(b, &x->lse, 0xff, 4, B * H, N, 1, x->lo, len); /* [B * H] rows of N */
    rda_fwd_args ia;
    memset(&ia, 0, sizeof ia);
    ia.batch = B;
    ia.n = len;
    ia.q = ia.k = ia.v = x->q.view; /* the init reads none of them */
    ia.q_s[0] = ia.k_s[0] = ia.v_s[0] = x->q.sb;
    ia.q_s[1] = ia.k_s[1] = ia.v_s[1] = H * D;
    ia.q_s[2] = ia.k_s[2] = ia.v_s[2] = D;
    ia.o = (float *)(void *)x->o.view;
    ia.o_s[0] = x->o.sb, ia.o_s[1] = H * D, ia.o_s[2] = D;
    ia.lse = (float *)(void *)x->lse.view;
    ia.lse_s[0] = H * x->lse.sb, ia.lse_s[1] = x->lse.sb;
    if (rda_fwd_init(b, &plan, &kern, &ia, &err) != RDA_OK) fail_msg("%s: init: %s", what, err.msg);
  }
  range_kpiece kp[kMaxPieces];
  const int nkp = rc->compact ? 0 : rc->nk;
  for (int i = 0; i < nkp; ++i) {
    range_kpiece *y = &kp[i];
    y->lo = rc->kcut[i];
    y->hi = rc->kcut[i + 1];
    assert_true(y->hi > y->lo);
    rt_guarded_copy(b, &y->k, k_bits, 2, B, N, Hkv * D, y->lo, y->hi - y->lo);
    rt_guarded_copy(b, &y->v, v_bits, 2, B, N, Hkv * D, y->lo, y->hi - y->lo);
  }

  /* Local keys: one launch per (branch step, query piece, key piece, segment range), the ranges
   * of rt_segment_launches. */
  long long launches = 0;
  if (rc->compact)
    launches = launch_compact(be, &plan, &kern, &whole, rc, qp, k_bits, v_bits, what);
  for (int st = 0; st < plan.nsteps && !rc->compact; ++st) {
    const rda_step *s = &plan.steps[st];
    const long long w = cfg.segments[s->branch] < N ? cfg.segments[s->branch] : N;
    const long long r = cfg.dilations[s->branch];
    for (int iq = 0; iq < rc->nq; ++iq)
      for (int ik = 0; ik < rc->nk; ++ik) {
        const range_qpiece *x = &qp[iq];
        const range_kpiece *y = &kp[ik];
        long long seg0[2], nseg[2];
        const int nl = rt_segment_launches(x->lo, x->hi, y->lo, y->hi, w, seg0, nseg);
        for (int l = 0; l < nl; ++l) {
          rda_fwd_params fp;
          rda_fwd_params_for_step(&plan, s, &whole, &fp);
          bind_query_piece(&fp, x, H, D);
          fp.k = y->k.view, fp.v = y->v.view;
          fp.k_sb = fp.v_sb = y->k.sb;
          fp.k_sn = fp.v_sn = Hkv * D;
          fp.k_sh = fp.v_sh = D;
          fp.k_rs = fp.v_rs = (r < w ? r : w) * Hkv * D;
          fp.kv_lo = y->lo, fp.kv_hi = y->hi, fp.kv_row_lo = y->lo;
          fp.seg0 = seg0[l];
          launch_range(be, &plan, &kern, s, &fp, nseg[l], B, s->nheads, what);
          ++launches;
        }
      }
  }
  if (b->synchronize(b, &err) != RDA_OK) fail_msg("%s: synchronize: %s", what, err.msg);

  float *o_got = malloc(nq_el * sizeof *o_got), *lse_got = malloc(nstat * sizeof *lse_got);
  assert_true(o_got != NULL && lse_got != NULL);
  rt_poison_f32(o_got, nq_el);
  rt_poison_f32(lse_got, nstat);
  long long bad_guard = 0;
  for (int i = 0; i < rc->nq; ++i) {
    rt_guarded_take(b, &qp[i].o, o_got, N, qp[i].lo, &bad_guard);
    rt_guarded_take(b, &qp[i].lse, lse_got, N, qp[i].lo, &bad_guard); /* [B * H] rows of N */
    rt_guarded_take(b, &qp[i].q, NULL, N, qp[i].lo, &bad_guard);
  }
  for (int i = 0; i < nkp; ++i) {
    rt_guarded_take(b, &kp[i].k, NULL, N, kp[i].lo, &bad_guard);
    rt_guarded_take(b, &kp[i].v, NULL, N, kp[i].lo, &bad_guard);
  }

  /* The reference on V rows replaced by (|V row|, 0, ...): column 0 of O is then M per row. */
  double *vn = calloc(nk_el, sizeof *vn);
  assert_non_null(vn);
  for (size_t row = 0; row < nk_el; row += (size_t)D) {
    double ss = 0.0;
    for (long long id = 0; id < D; ++id) ss += v[row + id] * v[row + id];
    vn[row] = sqrt(ss);
  }
  double *mv, *mv_lse;
  rt_reference(&cfg, B, N, q, k, vn, &mv, &mv_lse);
  double lse_vs, o_vs;
  const long long bad_run =
      compare_with_run(what, fc, o_got, lse_got, o_run, lse_run, mv, &lse_vs, &o_vs);
  free(vn);
  free(mv);
  free(mv_lse);
  double *o_ref, *lse_ref;
  rt_reference(&cfg, B, N, q, k, v, &o_ref, &lse_ref);
  long long o_s[3], lse_s[2] = {H * N, N};
  rt_strides_contig(N, H, D, o_s);
  rt_report rep;
  bool ok = rt_check_fwd(what, &cfg, B, N, o_got, o_s, lse_got, lse_s, o_ref, lse_ref, &rep);
  fprintf(stderr,
          "  %-4s %-44s %4lld launches; vs one call LSE %.1e O %.1e u M; vs ref O %.2e "
          "LSE %.2e\n",
          b->name, what, launches, lse_vs, o_vs * (fc->dtype == RDA_DTYPE_BF16 ? 256.0 : 2048.0),
          rep.o_rel_l2, rep.lse_max_abs);
  if (bad_guard != 0) fprintf(stderr, "  %s: %lld guard bytes changed\n", what, bad_guard);
  if (bad_run != 0) fprintf(stderr, "  %s: %lld rows differ from the one call\n", what, bad_run);
  ok = ok && bad_guard == 0 && bad_run == 0;

  free(o_ref);
  free(lse_ref);
  free(o_got);
  free(lse_got);
  free(o_run);
  free(lse_run);
  b->free(b, q_dev);
  b->free(b, k_dev);
  b->free(b, v_dev);
  b->free(b, o_dev);
  b->free(b, lse_dev);
  free(q_bits);
  free(k_bits);
  free(v_bits);
  free(q);
  free(k);
  free(v);
  rda_fwd_unload(b, &kern);
  rda_plan_k_free(&plan);
  assert_true(ok);
}

static void run_ranges(const char *what, const range_case *rc) {
  for (int i = 0; i < g_rt.n; ++i) run_ranges_on(&g_rt.be[i], what, rc);
}

/* The range cases of rda_test_cases.h (test_bwd.c runs them too). */
static void test_fwd_ranges_split_causal_gqa_bf16_d64(void **state) {
  (void)state;
  const range_case rc = {RT_RANGES_SPLIT_CAUSAL_GQA_BF16_D64};
  run_ranges(__func__, &rc);
}

static void test_fwd_ranges_split_block_mqa_and_group(void **state) {
  (void)state;
  const range_case a = {RT_RANGES_BLOCK_MQA_FP16_D32};
  run_ranges("ranges_block_mqa_fp16_d32", &a);
  const range_case b = {RT_RANGES_GROUP_CAUSAL_BF16_D32};
  run_ranges("ranges_group_causal_bf16_d32", &b);
}

/* Causal, one segment: key pieces starting 17 i rows after the second query piece's start
 * (i = 1..15), so the key start minus the query start takes every remainder mod 16 (from the
 * first query piece too: 100 + 17 i), and 63 mod 64 (i = 15, the wgmma warpgroup when run with
 * RDA_WGMMA=1). A warp whose last row is the first key (kt0 - qt0 = 15 mod 16) must not skip
 * that key's tile; rows before kt0 of a computed tile have every key masked (-inf maximum).
 * A dense branch (grid rows = positions) and a dilated one (r = 2, offsets 0 and 1), GQA. */
static void test_fwd_ranges_causal_key_starts_every_remainder_fp16_d64(void **state) {
  (void)state;
  range_case rc = {.c = {.heads = 2,
                         .kv_heads = 1,
                         .head_dim = 64,
                         .dtype = RDA_DTYPE_FP16,
                         .causal = 1,
                         .offsets = RDA_OFFSETS_MOD,
                         BR2(400, 1, 400, 2),
                         .batch = 1,
                         .n = 400},
                   .nq = 2,
                   .qcut = {0, 100, 400},
                   .nk = 17};
  rc.kcut[0] = 0;
  for (int i = 1; i <= 15; ++i) rc.kcut[i] = 100 + 17 * i;
  rc.kcut[16] = 380; /* a short last piece inside the last query tile */
  rc.kcut[17] = 400;
  run_ranges(__func__, &rc);
}

/* The wgmma path (skips decided per warpgroup of 64 rows): query pieces cutting a 128-row tile
 * mid-warpgroup, key starts 1, 40, 63, 127 and 191 rows after the second query piece's start
 * (63 mod 64 twice), causal GQA fp16 d64, a dense and a dilated branch, batch 2; then the
 * overlap tile (the pending P V product finished at a skip) with a negative scale, then the
 * same keys from compact blocks. */
static void test_fwd_wgmma_ranges_causal_fp16_d64_key_starts_mod64(void **state) {
  (void)state;
  range_case rc = {.c = {.heads = 4,
                         .kv_heads = 2,
                         .head_dim = 64,
                         .dtype = RDA_DTYPE_FP16,
                         .causal = 1,
                         .offsets = RDA_OFFSETS_MOD,
                         BR2(320, 1, 128, 2),
                         .batch = 2,
                         .n = 320,
                         .wgmma = 1},
                   .nq = 2,
                   .qcut = {0, 70, 320},
                   .nk = 6,
                   .kcut = {0, 71, 110, 133, 197, 261, 320}};
  run_ranges(__func__, &rc);
  rc.c.tile = "bm128_bn128_w8_s3_wgo";
  rc.c.scale = -0.3;
  rc.c.batch = 1;
  run_ranges("wgmma_overlap_ranges_causal_fp16_d64_negative_scale", &rc);
  rc.c.tile = NULL;
  rc.compact = 1;
  run_ranges("wgmma_ranges_compact_causal_fp16_d64_negative_scale", &rc);
}

/* The compact cases of rda_test_cases.h; here every block has NaN guard rows besides the NaN
 * neighbour slot. */
static void test_fwd_ranges_compact_key_blocks(void **state) {
  (void)state;
  const range_case a = {RT_RANGES_COMPACT_CAUSAL_GQA_BF16_D64};
  run_ranges("ranges_compact_causal_gqa_bf16_d64", &a);
  const range_case b = {RT_RANGES_COMPACT_BLOCK_MQA_FP16_D32};
  run_ranges("ranges_compact_block_mqa_fp16_d32", &b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fwd_matches_reference_causal_gqa_bf16_d64_three_branches),
      cmocka_unit_test(test_fwd_matches_reference_fp16_d64_block_offsets_uncovered_rows),
      cmocka_unit_test(test_fwd_matches_reference_mqa_bf16_d128_group_offsets),
      cmocka_unit_test(test_fwd_matches_reference_causal_gqa_fp16_d128_custom_scale),
      cmocka_unit_test(test_fwd_matches_reference_causal_bf16_d32_fused_qkv),
      cmocka_unit_test(test_fwd_matches_reference_gqa_fp16_d96_seq_first_strides),
      cmocka_unit_test(test_fwd_matches_reference_causal_bf16_d256_group_offsets),
      cmocka_unit_test(test_fwd_matches_reference_mqa_fp16_d256_block_offsets),
      cmocka_unit_test(test_fwd_matches_reference_negative_scale_causal_gqa_fp16_d256),
      cmocka_unit_test(test_fwd_matches_reference_bf16_d32_dense_ragged_tiles),
      cmocka_unit_test(test_fwd_matches_reference_causal_gqa_fp16_d32_dilated_merge),
      cmocka_unit_test(test_fwd_matches_reference_causal_gqa_bf16_d96_block_offsets),
      cmocka_unit_test(test_fwd_matches_reference_causal_gqa_fp16_d64_dense_diagonal),
      cmocka_unit_test(test_fwd_matches_reference_single_row_sequence),
      cmocka_unit_test(test_fwd_matches_reference_gqa_bf16_d128_multi_tile_grids),
      cmocka_unit_test(test_fwd_matches_reference_causal_bf16_d128_multi_tile_diagonal),
      cmocka_unit_test(test_fwd_wgmma_matches_reference_causal_fp16_d64_block_offsets),
      cmocka_unit_test(test_fwd_wgmma_overlap_matches_reference_gqa_bf16_d128),
      cmocka_unit_test(test_fwd_wgmma_overlap_matches_reference_causal_fp16_d64),
      cmocka_unit_test(test_fwd_rejects_misaligned_tensors),
      cmocka_unit_test(test_fwd_ranges_split_causal_gqa_bf16_d64),
      cmocka_unit_test(test_fwd_ranges_split_block_mqa_and_group),
      cmocka_unit_test(test_fwd_ranges_causal_key_starts_every_remainder_fp16_d64),
      cmocka_unit_test(test_fwd_ranges_compact_key_blocks),
      cmocka_unit_test(test_fwd_wgmma_ranges_causal_fp16_d64_key_starts_mod64),
  };
  const char *filter = getenv("RDA_TEST_FILTER"); /* e.g. "*ranges*" while developing */
  if (filter != NULL) cmocka_set_test_filter(filter);
  const int failed = cmocka_run_group_tests(tests, group_setup, group_teardown);
  return failed + rt_wgmma_env_reached("test_fwd");
}
