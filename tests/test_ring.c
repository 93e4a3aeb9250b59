/* test_ring.c — the ring forward (runtime/ring.c) with P virtual ranks (threads, host transport,
 * one emulator backend per rank): every rank's rows against the float64 single-device reference
 * (SPEC §5), bytes moved against the ring plan, zero bytes for local branches, peak ~ 1/P. */
#include "backend.h"
#include "fwd.h"
#include "gen.h"
#include "rda_test.h"
#include "reference.h"
#include "ring.h"
#include "ring_plan.h"
#include "transport.h"

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

#include <cmocka.h>

#define MAXP 8

static rda_gen *g_gen;
static rda_backend *g_b[MAXP];
static rda_hw g_hw;

static int group_setup(void **state) {
  (void)state;
  rda_err err = {0};
  if (rda_gen_open(&g_gen, &err) != RDA_OK) {
    fprintf(stderr, "test_ring: rda_gen_open: %s\n", err.msg);
    return -1;
  }
  for (int i = 0; i < MAXP; ++i)
    if (rda_backend_emu_open(&g_b[i], 90, &err) != RDA_OK) {
      fprintf(stderr, "test_ring: emu backend: %s\n", err.msg);
      return -1;
    }
  if (rda_gen_hw_builtin(g_gen, g_b[0]->arch, &g_hw, &err) != RDA_OK) {
    fprintf(stderr, "test_ring: hw: %s\n", err.msg);
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  for (int i = 0; i < MAXP; ++i)
    if (g_b[i] != NULL) g_b[i]->destroy(g_b[i]);
  rda_gen_close(g_gen);
  return 0;
}

/* One rank's inputs and outputs (backend memory) and what it reported. */
typedef struct rank_job {
  rda_backend *b;
  const rda_plan_k *pk;
  rda_fwd_kernels kern;
  const rda_ring_plan *rp;
  rda_host_world *world;
  uint64_t fp;
  int rank;
  rda_fwd_args a;
  void *mem[5]; /* q, k, v, o, lse in backend memory */
  rda_ring_run_stats stats;
  rda_status status;
  rda_err err;
} rank_job;

static void *rank_main(void *arg) {
  rank_job *j = arg;
  rda_transport *t = NULL;
  j->status = rda_host_world_join(j->world, j->rank, j->fp, &t, &j->err);
  if (j->status == RDA_OK)
    j->status =
        rda_ring_fwd_run(j->b, j->pk, &j->kern, j->rp, j->rank, t, &j->a, NULL, 0, &j->stats, &j->err);
  rda_transport_destroy(t);
  return NULL;
}

typedef struct ring_case {
  int heads, kv_heads, head_dim, causal, offsets, nbranch;
  long long w[4], r[4];
  long long n, batch;
  int ranks, layout;
  int fail_rank_plus1; /* > 0: that rank (minus one) is given a wrong row count and must fail */
} ring_case;

typedef struct ring_result {
  rda_ring_run_stats stats[MAXP];
  uint64_t plan_sent[MAXP], plan_received[MAXP];
} ring_result;

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
  if (rda_gen_plan(g_gen, &cfg, &g_hw, &plan, &err) != RDA_OK)
    fail_msg("%s: plan: %s", what, err.msg);
  rda_ring_plan *rp = NULL;
  if (rda_ring_plan_create(&cfg, N, P, rc->layout, &rp, &err) != RDA_OK)
    fail_msg("%s: ring plan: %s", what, err.msg);
  rda_host_world *world = NULL;
  assert_int_equal(rda_host_world_create(P, 60.0, &world, &err), RDA_OK);

  double *q = rt_normal((size_t)(B * N * H * D), RDA_DTYPE_BF16);
  double *k = rt_normal((size_t)(B * N * Hkv * D), RDA_DTYPE_BF16);
  double *v = rt_normal((size_t)(B * N * Hkv * D), RDA_DTYPE_BF16);
  double *o_ref = malloc(sizeof(double) * (size_t)(B * N * H * D));
  double *lse_ref = malloc(sizeof(double) * (size_t)(B * H * N));
  assert_non_null(o_ref);
  assert_non_null(lse_ref);
  rda_ref_forward(&cfg, B, N, q, k, v, o_ref, lse_ref);

  /* Gathered results, global layout [B, N, H, D] and [B, H, N]. */
  float *o_all = malloc(sizeof(float) * (size_t)(B * N * H * D));
  float *lse_all = malloc(sizeof(float) * (size_t)(B * H * N));
  assert_non_null(o_all);
  assert_non_null(lse_all);
  rt_poison_f32(o_all, (size_t)(B * N * H * D));
  rt_poison_f32(lse_all, (size_t)(B * H * N));

  rank_job jobs[MAXP];
  pthread_t th[MAXP];
  memset(jobs, 0, sizeof jobs);
  const uint64_t fp = rda_ring_fingerprint(&cfg, N, P, rc->layout);
  for (int p = 0; p < P; ++p) {
    rank_job *j = &jobs[p];
    const rda_ring_rank *rk = rda_ring_plan_rank(rp, p);
    const long long R = rk->rows;
    j->b = g_b[p];
    j->pk = &plan;
    j->rp = rp;
    j->world = world;
    j->fp = fp;
    j->rank = p;
    if (rda_fwd_load(j->b, &plan, &j->kern, &err) != RDA_OK)
      fail_msg("%s: load: %s", what, err.msg);
    /* The rank's own rows only, contiguous [B, R, H, D]. */
    double *lq = malloc(sizeof(double) * (size_t)(B * R * H * D));
    double *lk = malloc(sizeof(double) * (size_t)(B * R * Hkv * D));
    double *lv = malloc(sizeof(double) * (size_t)(B * R * Hkv * D));
    assert_true(lq != NULL && lk != NULL && lv != NULL);
    long long row = 0;
    for (int pc = 0; pc < rk->npieces; ++pc)
      for (long long g = rk->lo[pc]; g < rk->hi[pc]; ++g, ++row)
        for (long long bb = 0; bb < B; ++bb) {
          memcpy(lq + ((bb * R + row) * H) * D, q + ((bb * N + g) * H) * D,
                 sizeof(double) * (size_t)(H * D));
          memcpy(lk + ((bb * R + row) * Hkv) * D, k + ((bb * N + g) * Hkv) * D,
                 sizeof(double) * (size_t)(Hkv * D));
          memcpy(lv + ((bb * R + row) * Hkv) * D, v + ((bb * N + g) * Hkv) * D,
                 sizeof(double) * (size_t)(Hkv * D));
        }
    assert_int_equal(row, R);
    rt_strides_contig(R, H, D, j->a.q_s);
    rt_strides_contig(R, Hkv, D, j->a.k_s);
    rt_strides_contig(R, Hkv, D, j->a.v_s);
    rt_strides_contig(R, H, D, j->a.o_s);
    j->a.lse_s[1] = R;
    j->a.lse_s[0] = H * R;
    j->a.batch = B;
    j->a.n = R;
    const size_t nq = (size_t)(B * R * H * D), nkv = (size_t)(B * R * Hkv * D);
    void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dlse = NULL;
    assert_int_equal(j->b->alloc(j->b, nq * 2, &dq, &err), RDA_OK);
    assert_int_equal(j->b->alloc(j->b, nkv * 2, &dk, &err), RDA_OK);
    assert_int_equal(j->b->alloc(j->b, nkv * 2, &dv, &err), RDA_OK);
    assert_int_equal(j->b->alloc(j->b, nq * 4, &dout, &err), RDA_OK);
    assert_int_equal(j->b->alloc(j->b, (size_t)(B * H * R) * 4, &dlse, &err), RDA_OK);
    uint16_t *bits = rt_make_bits(lq, B, R, H, D, j->a.q_s, RDA_DTYPE_BF16, NULL);
    assert_int_equal(j->b->upload(j->b, dq, bits, nq * 2, &err), RDA_OK);
    free(bits);
    bits = rt_make_bits(lk, B, R, Hkv, D, j->a.k_s, RDA_DTYPE_BF16, NULL);
    assert_int_equal(j->b->upload(j->b, dk, bits, nkv * 2, &err), RDA_OK);
    free(bits);
    bits = rt_make_bits(lv, B, R, Hkv, D, j->a.v_s, RDA_DTYPE_BF16, NULL);
    assert_int_equal(j->b->upload(j->b, dv, bits, nkv * 2, &err), RDA_OK);
    free(bits);
    float *poison = malloc(nq * 4);
    assert_non_null(poison);
    rt_poison_f32(poison, nq);
    assert_int_equal(j->b->upload(j->b, dout, poison, nq * 4, &err), RDA_OK);
    assert_int_equal(j->b->upload(j->b, dlse, poison, (size_t)(B * H * R) * 4, &err), RDA_OK);
    free(poison);
    j->a.q = dq;
    j->a.k = dk;
    j->a.v = dv;
    j->a.o = dout;
    j->a.lse = dlse;
    j->mem[0] = dq, j->mem[1] = dk, j->mem[2] = dv, j->mem[3] = dout, j->mem[4] = dlse;
    free(lq);
    free(lk);
    free(lv);
  }
  if (rc->fail_rank_plus1 > 0) jobs[rc->fail_rank_plus1 - 1].a.n += 1;
  for (int p = 0; p < P; ++p)
    assert_int_equal(pthread_create(&th[p], NULL, rank_main, &jobs[p]), 0);
  for (int p = 0; p < P; ++p) pthread_join(th[p], NULL);
  int failed = 0;
  for (int p = 0; rc->fail_rank_plus1 > 0 && p < P; ++p) {
    rank_job *j = &jobs[p];
    if (j->status == RDA_OK) fail_msg("%s: rank %d succeeded beside a failing rank", what, p);
    if (p == rc->fail_rank_plus1 - 1 && strstr(j->err.msg, "owns") == NULL)
      fail_msg("%s: rank %d: unexpected error: %s", what, p, j->err.msg);
    if (p != rc->fail_rank_plus1 - 1 && strstr(j->err.msg, "abort") == NULL)
      fail_msg("%s: rank %d: expected an abort, got: %s", what, p, j->err.msg);
    j->status = RDA_OK; /* checked; skip the comparisons below */
    failed = 1;
  }

  for (int p = 0; p < P; ++p) {
    rank_job *j = &jobs[p];
    if (j->status != RDA_OK) fail_msg("%s: rank %d: %s", what, p, j->err.msg);
    const rda_ring_rank *rk = rda_ring_plan_rank(rp, p);
    const long long R = rk->rows;
    float *lo = malloc(sizeof(float) * (size_t)(B * R * H * D));
    float *ll = malloc(sizeof(float) * (size_t)(B * H * R));
    assert_true(lo != NULL && ll != NULL);
    assert_int_equal(
        j->b->download(j->b, lo, j->a.o, sizeof(float) * (size_t)(B * R * H * D), &err), RDA_OK);
    assert_int_equal(j->b->download(j->b, ll, j->a.lse, sizeof(float) * (size_t)(B * H * R), &err),
                     RDA_OK);
    long long row = 0;
    for (int pc = 0; pc < rk->npieces; ++pc)
      for (long long g = rk->lo[pc]; g < rk->hi[pc]; ++g, ++row)
        for (long long bb = 0; bb < B; ++bb) {
          memcpy(o_all + ((bb * N + g) * H) * D, lo + ((bb * R + row) * H) * D,
                 sizeof(float) * (size_t)(H * D));
          for (long long h = 0; h < H; ++h)
            lse_all[(bb * H + h) * N + g] = ll[(bb * H + h) * R + row];
        }
    free(lo);
    free(ll);
    if (res != NULL) {
      res->stats[p] = j->stats;
      res->plan_sent[p] = rk->bytes_sent;
      res->plan_received[p] = rk->bytes_received;
    }
    /* Bytes moved are the plan's (its counts are per batch element). */
    if (!failed) {
      assert_int_equal(j->stats.bytes_sent, rk->bytes_sent * (uint64_t)B);
      assert_int_equal(j->stats.bytes_received, rk->bytes_received * (uint64_t)B);
      assert_int_equal(j->stats.rows, R);
    }
    for (int m = 0; m < 5; ++m) j->b->free(j->b, j->mem[m]);
    rda_fwd_unload(j->b, &j->kern);
  }
  long long o_s[3], lse_s[2] = {H * N, N};
  rt_strides_contig(N, H, D, o_s);
  char label[256];
  snprintf(label, sizeof label, "%s (P = %d, N = %lld, %s)", what, P, N,
           rda_ring_layout_name(rc->layout));
  const bool ok =
      failed || rt_check_fwd(label, &cfg, B, N, o_all, o_s, lse_all, lse_s, o_ref, lse_ref, NULL);
  free(q);
  free(k);
  free(v);
  free(o_ref);
  free(lse_ref);
  free(o_all);
  free(lse_all);
  rda_host_world_destroy(world);
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

/* Mixed branches: segments inside one rank (w = 16), spanning some (w = 64) and all (w = N). */
static void test_ring_matches_reference_every_rank_count_causal_mod(void **state) {
  (void)state;
  ring_case rc = base_case();
  rc.causal = 1;
  rc.offsets = RDA_OFFSETS_MOD;
  rc.nbranch = 3;
  rc.w[0] = 16, rc.r[0] = 1;
  rc.w[1] = 64, rc.r[1] = 2;
  rc.w[2] = 1 << 20, rc.r[2] = 4;
  rc.n = 101;
  for (int p = 1; p <= MAXP; ++p) {
    rc.ranks = p;
    run_ring("causal mod 3 branches", &rc, NULL);
  }
}

static void test_ring_matches_reference_noncausal_block_offsets_gqa(void **state) {
  (void)state;
  ring_case rc = base_case();
  rc.heads = 4;
  rc.kv_heads = 2;
  rc.offsets = RDA_OFFSETS_BLOCK;
  rc.nbranch = 2;
  rc.w[0] = 32, rc.r[0] = 1;
  rc.w[1] = 1 << 20, rc.r[1] = 2;
  rc.n = 83;
  rc.batch = 2;
  const int ps[] = {2, 3, 5};
  for (int i = 0; i < 3; ++i) {
    rc.ranks = ps[i];
    run_ring("non-causal block GQA batch 2", &rc, NULL);
  }
}

static void test_ring_matches_reference_group_offsets_causal_gqa(void **state) {
  (void)state;
  ring_case rc = base_case();
  rc.heads = 4;
  rc.kv_heads = 1;
  rc.causal = 1;
  rc.offsets = RDA_OFFSETS_GROUP;
  rc.nbranch = 2;
  rc.w[0] = 24, rc.r[0] = 1;
  rc.w[1] = 96, rc.r[1] = 3;
  rc.n = 130;
  const int ps[] = {3, 4, 7};
  for (int i = 0; i < 3; ++i) {
    rc.ranks = ps[i];
    run_ring("causal group GQA", &rc, NULL);
  }
}

static void test_ring_matches_reference_zigzag(void **state) {
  (void)state;
  ring_case rc = base_case();
  rc.causal = 1;
  rc.offsets = RDA_OFFSETS_MOD;
  rc.nbranch = 2;
  rc.w[0] = 16, rc.r[0] = 1;
  rc.w[1] = 1 << 20, rc.r[1] = 2;
  rc.n = 96;
  rc.layout = RDA_RING_ZIGZAG;
  const int ps[] = {2, 3, 4};
  for (int i = 0; i < 3; ++i) {
    rc.ranks = ps[i];
    run_ring("causal zigzag", &rc, NULL);
  }
  rc.causal = 0;
  rc.ranks = 3;
  run_ring("non-causal zigzag", &rc, NULL);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_matches_reference_every_rank_count_causal_mod),
      cmocka_unit_test(test_ring_matches_reference_noncausal_block_offsets_gqa),
      cmocka_unit_test(test_ring_matches_reference_group_offsets_causal_gqa),
      cmocka_unit_test(test_ring_matches_reference_zigzag),
      cmocka_unit_test(test_ring_local_branches_send_zero_bytes),
      cmocka_unit_test(test_ring_peak_bytes_shrink_with_ranks),
      cmocka_unit_test(test_ring_failing_rank_errors_every_rank),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
