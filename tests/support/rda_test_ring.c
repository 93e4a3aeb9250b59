/* rda_test_ring.c — the ring tests' virtual ranks: a rank's rows of the global tensors to and
 * from its device, one job per rank (inputs, poisoned outputs and workspaces), all ranks run at
 * once on threads. Test-only code: out of memory and backend errors fail the test. */
// clang-format off
#include "rda_test_ring.h"

#include "emu.h"

#include "rda_test.h"
#include "rda_test_backend.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */
// clang-format on

int rt_ring_backends_open(rda_backend **b, int ranks, const char *who) {
  rda_err err = {0};
  for (int p = 0; p < ranks; ++p)
    if (rda_backend_emu_open(&b[p], 90, &err) != RDA_OK) {
      fprintf(stderr, "%s: emu backend for rank %d: %s\n", who, p, err.msg);
      return -1;
    }
  return 0;
}

void rt_ring_backends_close(rda_backend **b, int ranks) {
  for (int p = 0; p < ranks; ++p)
    if (b[p] != NULL) {
      b[p]->destroy(b[p]);
      b[p] = NULL;
    }
}

/* ------------------------------------------------------------------ rows */

void rt_ring_move_rows(const rda_ring_rank *rk, long long batch, long long n, long long x,
                       size_t elem, void *global, void *local, int to_local) {
  const long long R = rk->rows;
  long long row = 0;
  for (int pc = 0; pc < rk->npieces; ++pc)
    for (long long g = rk->lo[pc]; g < rk->hi[pc]; ++g, ++row)
      for (long long ib = 0; ib < batch; ++ib) {
        char *gp = (char *)global + (size_t)((ib * n + g) * x) * elem;
        char *lp = (char *)local + (size_t)((ib * R + row) * x) * elem;
        memcpy(to_local ? lp : gp, to_local ? gp : lp, (size_t)x * elem);
      }
  assert_int_equal(row, R);
}

/* malloc'd; a zero-byte request still gets a buffer. */
static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  assert_non_null(p);
  return p;
}

void *rt_ring_upload_rows(rda_backend *b, const rda_ring_rank *rk, long long batch, long long n,
                          long long x, int dtype, const double *global) {
  const long long R = rk->rows;
  double *l = xmalloc((size_t)(batch * R * x) * sizeof *l);
  /* global is only read (to_local) */
  rt_ring_move_rows(rk, batch, n, x, sizeof *l, (void *)(uintptr_t)global, l, 1);
  const long long s[3] = {R * x, x, x}; /* [B, R, 1 head, X] */
  size_t count = 0;
  uint16_t *bits = rt_make_bits(l, batch, R, 1, x, s, dtype, &count);
  void *dev = rt_dev_alloc(b, count * sizeof *bits);
  rt_dev_upload(b, dev, bits, count * sizeof *bits);
  free(bits);
  free(l);
  return dev;
}

float *rt_ring_upload_lse(rda_backend *b, const rda_ring_rank *rk, long long batch, long long heads,
                          long long n, const double *global) {
  const long long R = rk->rows;
  double *l = xmalloc((size_t)(batch * heads * R) * sizeof *l);
  rt_ring_move_rows(rk, batch * heads, n, 1, sizeof *l, (void *)(uintptr_t)global, l, 1);
  const long long s[2] = {heads * R, R};
  float *dev = rt_dev_lse_f32(b, l, batch, heads, R, s);
  free(l);
  return dev;
}

void rt_ring_gather_rows(rda_backend *b, const rda_ring_rank *rk, long long batch, long long n,
                         long long x, const float *dev, float *global) {
  float *l = rt_download_f32(b, dev, (size_t)(batch * rk->rows * x));
  rt_ring_move_rows(rk, batch, n, x, sizeof *l, global, l, 0);
  free(l);
}

void rt_ring_gather_lse(rda_backend *b, const rda_ring_rank *rk, long long batch, long long heads,
                        long long n, const float *dev, float *global) {
  float *l = rt_download_f32(b, dev, (size_t)(batch * heads * rk->rows));
  rt_ring_move_rows(rk, batch * heads, n, 1, sizeof *l, global, l, 0);
  free(l);
}

/* ------------------------------------------------------------------ jobs */

static void *job_keep(rt_ring_job *j, void *p) {
  assert_true(j->nmem < RT_RING_JOB_MEM);
  j->mem[j->nmem++] = p;
  return p;
}

/* A poisoned fp32 buffer of `bytes` rounded up to whole elements (at least one). */
static float *job_poisoned(rt_ring_job *j, size_t bytes) {
  const size_t count = (bytes + sizeof(float) - 1) / sizeof(float);
  return job_keep(j, rt_dev_poisoned(j->b, count > 0 ? count : 1));
}

void rt_ring_job_setup(rt_ring_job *j, long long batch, long long n, const double *q,
                       const double *k, const double *v, const double *dout, const double *dlse,
                       const char *what) {
  const rda_config *cfg = &j->pk->cfg;
  const long long B = batch, N = n, H = cfg->heads, Hkv = cfg->kv_heads, D = cfg->head_dim;
  rda_err err = {0};
  j->rk = rda_ring_plan_rank(j->rp, j->rank);
  assert_non_null(j->rk);
  const long long R = j->rk->rows;
  j->batch = B;
  j->n = N;
  j->nmem = 0;
  if (rda_fwd_load(j->b, j->pk, &j->kern, &err) != RDA_OK)
    fail_msg("%s: rank %d: load: %s", what, j->rank, err.msg);
  void *qd = job_keep(j, rt_ring_upload_rows(j->b, j->rk, B, N, H * D, cfg->dtype, q));
  void *kd = job_keep(j, rt_ring_upload_rows(j->b, j->rk, B, N, Hkv * D, cfg->dtype, k));
  void *vd = job_keep(j, rt_ring_upload_rows(j->b, j->rk, B, N, Hkv * D, cfg->dtype, v));
  float *o = job_poisoned(j, (size_t)(B * R * H * D) * sizeof(float));
  float *lse = job_poisoned(j, (size_t)(B * H * R) * sizeof(float));
  rda_fwd_args_contiguous(&j->a, cfg, B, R, qd, kd, vd, o, lse);
  j->ws_bytes = rda_ring_workspace_bytes(j->pk, j->rp, j->rank, B, j->backward);
  if (j->ws_bytes == SIZE_MAX) fail_msg("%s: rank %d: no workspace size", what, j->rank);
  /* poisoned: the ring must write every workspace byte it reads */
  j->ws = j->ws_bytes > 0 ? job_poisoned(j, j->ws_bytes) : NULL;
  if (!j->backward) return;
  assert_non_null(dout);
  void *dod = job_keep(j, rt_ring_upload_rows(j->b, j->rk, B, N, H * D, cfg->dtype, dout));
  float *dlsed = dlse != NULL ? job_keep(j, rt_ring_upload_lse(j->b, j->rk, B, H, N, dlse)) : NULL;
  float *gq = job_poisoned(j, (size_t)(B * R * H * D) * sizeof(float));
  float *gk = job_poisoned(j, (size_t)(B * R * Hkv * D) * sizeof(float));
  float *gv = job_poisoned(j, (size_t)(B * R * Hkv * D) * sizeof(float));
  float *dp = job_poisoned(j, rda_bwd_workspace_bytes(j->pk, B, R));
  rda_bwd_args_like_fwd(&j->ba, &j->a, dod, dlsed, gq, gk, gv, dp);
}

void rt_ring_job_free(rt_ring_job *j) {
  for (int m = 0; m < j->nmem; ++m) j->b->free(j->b, j->mem[m]);
  j->nmem = 0;
  rda_fwd_unload(j->b, &j->kern);
}

rda_status rt_ring_world_create(rt_ring_world *w, const rda_backend *b, int ranks, double timeout_s,
                                rda_err *err) {
  memset(w, 0, sizeof *w);
  if (rda_backend_emu_async(b)) return rda_device_world_create(ranks, timeout_s, &w->dev, err);
  return rda_host_world_create(ranks, timeout_s, &w->host, err);
}

void rt_ring_world_destroy(rt_ring_world *w) {
  rda_host_world_destroy(w->host);
  if (w->dev != NULL) rda_device_world_destroy(w->dev);
  memset(w, 0, sizeof *w);
}

rda_status rt_ring_world_join(rt_ring_world *w, int rank, uint64_t fingerprint, rda_backend *b,
                              rda_transport **t, rda_err *err) {
  if (w->dev != NULL) return rda_device_world_join(w->dev, rank, fingerprint, b, t, err);
  return rda_host_world_join(w->host, rank, fingerprint, t, err);
}

static void *rank_thread(void *arg) {
  rt_ring_job *j = arg;
  rda_transport *t = NULL;
  j->status = rt_ring_world_join(j->world, j->rank, j->fp, j->b, &t, &j->err);
  if (j->hook != NULL) j->hook(j, RT_RING_JOINED, &t);
  if (j->status == RDA_OK)
    j->status = rda_ring_fwd_run(j->b, j->pk, &j->kern, j->rp, j->rank, t, &j->a, j->ws,
                                 j->ws_bytes, &j->stats, &j->err);
  if (j->hook != NULL) j->hook(j, RT_RING_FWD_DONE, &t);
  if (j->status == RDA_OK && j->backward)
    j->status = rda_ring_bwd_run(j->b, j->pk, &j->kern, j->rp, j->rank, t, &j->ba, j->ws,
                                 j->ws_bytes, &j->bstats, &j->err);
  /* The passes' work is queued on this thread's stream (asynchronous streams): done before the
   * caller reads or frees the buffers, after a failure too. */
  rda_err e = {0};
  const rda_status s = j->b->synchronize(j->b, j->status == RDA_OK ? &j->err : &e);
  if (j->status == RDA_OK) j->status = s;
  if (j->hook != NULL) j->hook(j, RT_RING_BWD_DONE, &t);
  rda_transport_destroy(t);
  return NULL;
}

void rt_ring_run(rt_ring_job *jobs, int ranks) {
  pthread_t th[RDA_RING_MAX_RANKS];
  assert_true(ranks >= 1 && ranks <= RDA_RING_MAX_RANKS);
  for (int p = 0; p < ranks; ++p)
    assert_int_equal(pthread_create(&th[p], NULL, rank_thread, &jobs[p]), 0);
  for (int p = 0; p < ranks; ++p) pthread_join(th[p], NULL);
}

/* ------------------------------------------------------------------ gathered results */

static float *poisoned_host(size_t count) {
  float *x = xmalloc(count * sizeof *x);
  rt_poison_f32(x, count);
  return x;
}

void rt_ring_out_alloc(rt_ring_out *out, const rda_config *cfg, long long batch, long long n,
                       int grads) {
  memset(out, 0, sizeof *out);
  out->no = (size_t)(batch * n * cfg->heads * cfg->head_dim);
  out->nlse = (size_t)(batch * cfg->heads * n);
  out->nkv = (size_t)(batch * n * cfg->kv_heads * cfg->head_dim);
  out->o = poisoned_host(out->no);
  out->lse = poisoned_host(out->nlse);
  if (!grads) return;
  out->dq = poisoned_host(out->no);
  out->dk = poisoned_host(out->nkv);
  out->dv = poisoned_host(out->nkv);
}

void rt_ring_out_gather(rt_ring_out *out, const rt_ring_job *j) {
  const rda_config *cfg = &j->pk->cfg;
  const long long B = j->batch, N = j->n, H = cfg->heads, Hkv = cfg->kv_heads, D = cfg->head_dim;
  rt_ring_gather_rows(j->b, j->rk, B, N, H * D, j->a.o, out->o);
  rt_ring_gather_lse(j->b, j->rk, B, H, N, j->a.lse, out->lse);
  if (out->dq == NULL) return;
  rt_ring_gather_rows(j->b, j->rk, B, N, H * D, j->ba.dq, out->dq);
  rt_ring_gather_rows(j->b, j->rk, B, N, Hkv * D, j->ba.dk, out->dk);
  rt_ring_gather_rows(j->b, j->rk, B, N, Hkv * D, j->ba.dv, out->dv);
}

void rt_ring_out_free(rt_ring_out *out) {
  free(out->o);
  free(out->lse);
  free(out->dq);
  free(out->dk);
  free(out->dv);
  out->o = out->lse = out->dq = out->dk = out->dv = NULL;
}

uint64_t rt_ring_planned_peak(const rda_ring_rank *rk, long long batch) {
  const long long most = rda_ring_batch_slice();
  const uint64_t b = (uint64_t)(batch < most ? batch : most), a = RDA_RING_BLOCK_ALIGN;
  return (rk->send_block * b + a - 1) / a * a + 2 * ((rk->recv_block * b + a - 1) / a * a);
}
