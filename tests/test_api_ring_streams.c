/* test_api_ring_streams.c — the public ring API with virtual ranks (rda_ring_world) on both kinds
 * of context through one small memory and stream layer: the emulator context (host memory,
 * streams NULL, synchronizing a no-op) and, when rda_ctx_create_cuda succeeds, a cuda context
 * (device memory, one non-blocking CUstream per rank, all ranks on one shared context), so the
 * logic that only a GPU can run for real also runs on the CPU on every machine.
 * On cuda, rank 1's stream is held back by large memsets queued before each of its calls: a
 * cross-rank transfer or a result that is not ordered on the right stream then reads or returns
 * data too early, and the results come out wrong. Checked: every rank's rows of rda_ring_forward
 * (fp32 O, LSE) and rda_ring_backward against the single-device rda_forward / rda_backward on
 * the same context and against the float64 reference; and rda_ring_abort from another thread
 * while the ranks are in rda_ring_forward: all ranks finish or all fail with one line, the ring
 * stays failed, and nothing lands in a rank's workspace or outputs after its error. */
#include "backend.h"
#include "rda.h"
#include "rda_test.h"
#include "reference.h"

/* clang-format off */
#include <dlfcn.h>
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

#include <cmocka.h> /* after the standard headers it needs */

#include "rda_test_tensor.h" /* needs cmocka.h */
/* clang-format on */

/* P ranks over an uneven N (rows 51, 51, 51, 50), batch 2, the config below. */
enum { kP = 4, kB = 2, kN = 203, kH = 4, kHkv = 2, kD = 32 };
static const double kTimeout = 60.0; /* the world's: a hang fails, no bound here is tighter */
static const char kReason[] = "the test pulls the plug mid-pass";
/* Rank 1's hold-up on cuda: 128 memsets of 512 MiB (64 GiB written, tens of ms on any GPU). */
static const size_t kScratchBytes = (size_t)512 << 20;
enum { kDelayMemsets = 128 };

/* Causal, GQA, bf16, three branches with dilation, the longer two across ranks. */
static rda_attn_config test_config(void) {
  rda_attn_config c = RDA_CONFIG_INIT;
  c.heads = kH, c.kv_heads = kHkv, c.head_dim = kD, c.dtype = RDA_BF16, c.causal = 1;
  c.nbranch = 3;
  c.segments[0] = 16, c.dilations[0] = 1;
  c.segments[1] = 64, c.dilations[1] = 2;
  c.segments[2] = 128, c.dilations[2] = 4;
  return c;
}

/* ------------------------------------------------------------------ memory and streams */

/* One context with what the test needs around it. b == NULL: the emulator (host memory). */
typedef struct env {
  const char *name; /* "emulator" or "cuda" */
  rda_ctx *ctx;
  rda_plan *plan; /* test_config(), with the backward pass */
  rda_backend *b; /* cuda: the test's own handle on device memory of the same primary context */
  void *lib;      /* libcuda, for the streams and synchronization the API leaves to callers */
  void *cu_ctx;   /* that context, made current on every thread that calls the driver */
  int (*ctx_sync)(void);
  int (*ctx_get)(void **);
  int (*ctx_set)(void *);
  int (*stream_create)(void **, unsigned);
  int (*stream_destroy)(void *);
  int (*stream_sync)(void *);
  int (*memset8)(unsigned long long, unsigned char, size_t, void *);
  void *stream[kP];  /* NULL on the emulator */
  void *scratch;     /* the target of rank 1's memsets */
  double fwd_wall_s; /* the slowest rank's rda_ring_forward in the run: paces the abort */
} env;

static env g_emu, g_cuda;
static int g_emu_ready, g_cuda_tried, g_cuda_ready;
static char g_cuda_skip[600]; /* why there is no cuda half, "" when there is one */

static size_t round256(size_t n) {
  return (n + 255) / 256 * 256;
}

/* Each of these returns 0, or -1 with why[cap] filled: rank threads must not call cmocka. */
static int m_upload(env *e, void *dst, const void *src, size_t bytes, char *why, size_t cap) {
  if (bytes == 0) return 0;
  if (e->b == NULL) return memcpy(dst, src, bytes), 0;
  rda_err err = {0};
  if (e->b->upload(e->b, dst, src, bytes, &err) == RDA_OK) return 0;
  snprintf(why, cap, "upload of %zu bytes: %s", bytes, err.msg);
  return -1;
}

/* b->download runs on the backend's own stream: the caller synchronizes the rank's first. */
static int m_download(env *e, void *dst, const void *src, size_t bytes, char *why, size_t cap) {
  if (bytes == 0) return 0;
  if (e->b == NULL) return memcpy(dst, src, bytes), 0;
  rda_err err = {0};
  if (e->b->download(e->b, dst, src, bytes, &err) == RDA_OK) return 0;
  snprintf(why, cap, "download of %zu bytes: %s", bytes, err.msg);
  return -1;
}

/* NaN in every float of bytes (a multiple of 4): what no result may leave behind. */
static int m_poison(env *e, void *dst, size_t bytes, char *why, size_t cap) {
  if (bytes == 0) return 0;
  float *h = malloc(bytes);
  if (h == NULL) return snprintf(why, cap, "out of host memory"), -1;
  rt_poison_f32(h, bytes / 4);
  const int rc = m_upload(e, dst, h, bytes, why, cap);
  free(h);
  return rc;
}

static int cu_check(int rc, const char *call, char *why, size_t cap) {
  if (rc == 0) return 0;
  snprintf(why, cap, "%s: CUresult %d", call, rc);
  return -1;
}

/* The calling thread's driver calls go to the shared context. */
static int m_enter(env *e, char *why, size_t cap) {
  return e->b == NULL ? 0 : cu_check(e->ctx_set(e->cu_ctx), "cuCtxSetCurrent", why, cap);
}

static int m_sync(env *e, int rank, char *why, size_t cap) {
  if (e->b == NULL) return 0;
  return cu_check(e->stream_sync(e->stream[rank]), "cuStreamSynchronize", why, cap);
}

/* Every stream of the context, the ring's own communication streams included. */
static int m_sync_all(env *e, char *why, size_t cap) {
  if (e->b == NULL) return 0;
  if (m_enter(e, why, cap) != 0) return -1;
  return cu_check(e->ctx_sync(), "cuCtxSynchronize", why, cap);
}

/* Queue the hold-up on the rank's stream (nothing to hold up on the emulator). */
static int m_delay(env *e, int rank, char *why, size_t cap) {
  if (e->b == NULL) return 0;
  for (int i = 0; i < kDelayMemsets; ++i)
    if (cu_check(e->memset8((unsigned long long)(uintptr_t)e->scratch, (unsigned char)i,
                            kScratchBytes, e->stream[rank]),
                 "cuMemsetD8Async", why, cap) != 0)
      return -1;
  return 0;
}

/* 256-byte aligned host memory on the emulator (the API wants 16). */
static int m_alloc(env *e, size_t bytes, void **p, char *why, size_t cap) {
  *p = NULL;
  if (bytes == 0) return 0;
  if (e->b == NULL) {
    *p = aligned_alloc(256, round256(bytes));
    if (*p == NULL) return snprintf(why, cap, "out of host memory (%zu bytes)", bytes), -1;
    return 0;
  }
  rda_err err = {0};
  if (e->b->alloc(e->b, bytes, p, &err) == RDA_OK) return 0;
  snprintf(why, cap, "alloc of %zu bytes: %s", bytes, err.msg);
  return -1;
}

/* Main-thread forms that fail the test. */
static void *mm_alloc(env *e, size_t bytes) {
  char why[1100];
  void *p = NULL;
  if (m_alloc(e, bytes, &p, why, sizeof why) != 0) fail_msg("%s: %s", e->name, why);
  return p;
}

static void mm_free(env *e, void *p) {
  if (p == NULL) return;
  if (e->b == NULL)
    free(p);
  else
    e->b->free(e->b, p);
}

static void mm_upload(env *e, void *dst, const void *src, size_t bytes) {
  char why[1100];
  if (m_upload(e, dst, src, bytes, why, sizeof why) != 0) fail_msg("%s: %s", e->name, why);
}

static void mm_download(env *e, void *dst, const void *src, size_t bytes) {
  char why[1100];
  if (m_download(e, dst, src, bytes, why, sizeof why) != 0) fail_msg("%s: %s", e->name, why);
}

static void mm_poison(env *e, void *dst, size_t bytes) {
  char why[1100];
  if (m_poison(e, dst, bytes, why, sizeof why) != 0) fail_msg("%s: %s", e->name, why);
}

static void mm_sync(env *e, int rank) {
  char why[256];
  if (m_enter(e, why, sizeof why) != 0 || m_sync(e, rank, why, sizeof why) != 0)
    fail_msg("%s: %s", e->name, why);
}

static void env_plan(env *e) {
  const rda_attn_config cfg = test_config();
  if (rda_plan_create(&e->plan, e->ctx, &cfg, RDA_PLAN_WITH_BACKWARD) != RDA_OK)
    fail_msg("%s: rda_plan_create: %s", e->name, rda_last_error(e->ctx));
}

static env *emu_env(void) {
  if (g_emu_ready) return &g_emu;
  if (g_emu.name != NULL) fail_msg("emulator: the setup failed in an earlier test");
  g_emu.name = "emulator";
  if (rda_ctx_create_emulator(&g_emu.ctx) != RDA_OK)
    fail_msg("rda_ctx_create_emulator: %s", rda_last_error(NULL));
  env_plan(&g_emu);
  g_emu_ready = 1;
  return &g_emu;
}

static void *cu_sym(env *e, const char *name) {
  void *p = e->lib != NULL ? dlsym(e->lib, name) : NULL;
  if (p == NULL) fail_msg("cuda: libcuda.so.1 has no %s", name);
  return p;
}

/* The cuda half, or a skip saying why there is none (no GPU, no driver). Once a context opens,
 * anything else missing is a failure: this machine was meant to run it. */
static env *cuda_env(void) {
  if (g_cuda_ready) return &g_cuda;
  if (g_cuda_tried) {
    if (g_cuda_skip[0] != '\0') skip();
    fail_msg("cuda: the setup failed in an earlier test");
  }
  g_cuda_tried = 1;
  env *e = &g_cuda;
  e->name = "cuda";
  if (rda_ctx_create_cuda(&e->ctx, 0) != RDA_OK) {
    snprintf(g_cuda_skip, sizeof g_cuda_skip, "%s", rda_last_error(NULL));
    fprintf(stderr, "test_api_ring_streams: no usable GPU (%s): the cuda half is skipped\n",
            g_cuda_skip);
    skip();
  }
  e->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (e->lib == NULL) fail_msg("cuda: dlopen libcuda.so.1: %s", dlerror());
  void *s;
  s = cu_sym(e, "cuCtxSynchronize"), memcpy(&e->ctx_sync, &s, sizeof s);
  s = cu_sym(e, "cuCtxGetCurrent"), memcpy(&e->ctx_get, &s, sizeof s);
  s = cu_sym(e, "cuCtxSetCurrent"), memcpy(&e->ctx_set, &s, sizeof s);
  s = cu_sym(e, "cuStreamCreate"), memcpy(&e->stream_create, &s, sizeof s);
  s = cu_sym(e, "cuStreamDestroy_v2"), memcpy(&e->stream_destroy, &s, sizeof s);
  s = cu_sym(e, "cuStreamSynchronize"), memcpy(&e->stream_sync, &s, sizeof s);
  s = cu_sym(e, "cuMemsetD8Async"), memcpy(&e->memset8, &s, sizeof s);
  rda_err err = {0};
  if (rda_backend_cuda_open(&e->b, 0, &err) != RDA_OK)
    fail_msg("cuda: rda_backend_cuda_open: %s", err.msg);
  /* The backend makes its (the primary) context current on this thread: keep it for the rest. */
  e->scratch = mm_alloc(e, kScratchBytes);
  char why[256];
  if (cu_check(e->ctx_get(&e->cu_ctx), "cuCtxGetCurrent", why, sizeof why) != 0)
    fail_msg("cuda: %s", why);
  if (e->cu_ctx == NULL) fail_msg("cuda: no current context after a backend allocation");
  for (int p = 0; p < kP; ++p)
    if (cu_check(e->stream_create(&e->stream[p], 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate",
                 why, sizeof why) != 0)
      fail_msg("cuda: %s", why);
  env_plan(e);
  g_cuda_ready = 1;
  return e;
}

static void env_free(env *e) {
  char why[256];
  if (e->b != NULL && e->cu_ctx != NULL && m_sync_all(e, why, sizeof why) != 0)
    fprintf(stderr, "%s: teardown: %s\n", e->name, why);
  for (int p = 0; p < kP; ++p)
    if (e->stream[p] != NULL && e->stream_destroy(e->stream[p]) != 0)
      fprintf(stderr, "%s: teardown: cuStreamDestroy failed\n", e->name);
  if (e->b != NULL) {
    mm_free(e, e->scratch);
    e->b->destroy(e->b);
  }
  rda_plan_destroy(e->plan);
  rda_ctx_destroy(e->ctx);
  if (e->lib != NULL) dlclose(e->lib);
  memset(e, 0, sizeof *e);
}

static int group_teardown(void **state) {
  (void)state;
  if (g_emu.name != NULL) env_free(&g_emu);
  if (g_cuda_tried) env_free(&g_cuda); /* what a failed setup got so far too */
  return 0;
}

/* ------------------------------------------------------------------ the problem */

/* The global inputs, what the single device made of them on the context, and float64. */
typedef struct problem {
  rda_config c;
  size_t nq, nk, nl;
  double *q, *k, *v, *dout, *dlse;
  uint16_t *qb, *kb, *vb, *dob;
  float *dlsef;
  float *o1, *l1, *dq1, *dk1, *dv1; /* single device, fp32 */
  double *o_ref, *lse_ref, *dq_ref, *dk_ref, *dv_ref;
  long long qs[3], ks[3], ls[2];
} problem;

static float *host_f32(size_t n) {
  float *p = malloc(n * sizeof *p);
  assert_non_null(p);
  rt_poison_f32(p, n);
  return p;
}

/* Inputs, then rda_forward (fp32 O, LSE) and rda_backward (with dLSE) on e's context: device
 * memory, rank 0's stream, poisoned outputs and workspaces. */
static void problem_make(problem *pr, env *e) {
  memset(pr, 0, sizeof *pr);
  rda_attn_config pc;
  assert_int_equal(rda_plan_get_config(e->plan, &pc), RDA_OK);
  rt_config_make(&pr->c, pc.heads, pc.kv_heads, pc.head_dim, (int)pc.dtype, pc.causal,
                 (int)pc.offsets, pc.nbranch, pc.segments, pc.dilations);
  pr->c.scale = pc.scale;
  const int dt = (int)pc.dtype;
  pr->nq = (size_t)kB * kN * kH * kD, pr->nk = (size_t)kB * kN * kHkv * kD;
  pr->nl = (size_t)kB * kH * kN;
  pr->q = rt_normal(pr->nq, dt), pr->k = rt_normal(pr->nk, dt), pr->v = rt_normal(pr->nk, dt);
  pr->dout = rt_normal(pr->nq, dt), pr->dlse = rt_normal(pr->nl, RT_DTYPE_F64);
  pr->dlsef = host_f32(pr->nl);
  for (size_t i = 0; i < pr->nl; ++i) pr->dlse[i] = pr->dlsef[i] = (float)pr->dlse[i];
  rt_strides_contig(kN, kH, kD, pr->qs);
  rt_strides_contig(kN, kHkv, kD, pr->ks);
  pr->ls[0] = (long long)kH * kN, pr->ls[1] = kN;
  pr->qb = rt_make_bits(pr->q, kB, kN, kH, kD, pr->qs, dt, NULL);
  pr->kb = rt_make_bits(pr->k, kB, kN, kHkv, kD, pr->ks, dt, NULL);
  pr->vb = rt_make_bits(pr->v, kB, kN, kHkv, kD, pr->ks, dt, NULL);
  pr->dob = rt_make_bits(pr->dout, kB, kN, kH, kD, pr->qs, dt, NULL);

  const size_t nq = pr->nq, nk = pr->nk, nl = pr->nl;
  void *q = mm_alloc(e, nq * 2), *k = mm_alloc(e, nk * 2), *v = mm_alloc(e, nk * 2);
  void *dout = mm_alloc(e, nq * 2), *dlse = mm_alloc(e, nl * 4);
  void *o = mm_alloc(e, nq * 4), *lse = mm_alloc(e, nl * 4);
  void *dq = mm_alloc(e, nq * 4), *dk = mm_alloc(e, nk * 4), *dv = mm_alloc(e, nk * 4);
  size_t wf = 0, wb = 0;
  assert_int_equal(rda_plan_workspace_size(e->plan, kB, kN, &wf), RDA_OK);
  assert_int_equal(rda_plan_backward_workspace_size(e->plan, kB, kN, &wb), RDA_OK);
  void *wsf = mm_alloc(e, wf), *wsb = mm_alloc(e, wb);
  mm_upload(e, q, pr->qb, nq * 2), mm_upload(e, k, pr->kb, nk * 2);
  mm_upload(e, v, pr->vb, nk * 2), mm_upload(e, dout, pr->dob, nq * 2);
  mm_upload(e, dlse, pr->dlsef, nl * 4);
  mm_poison(e, o, nq * 4), mm_poison(e, lse, nl * 4), mm_poison(e, dq, nq * 4);
  mm_poison(e, dk, nk * 4), mm_poison(e, dv, nk * 4);
  mm_poison(e, wsf, wf / 4 * 4), mm_poison(e, wsb, wb / 4 * 4);
  const rt_attn_bufs one = {q, k, v, o, lse, dout, dlse, dq, dk, dv};
  rt_attn_tensors t;
  assert_int_equal(rt_attn(&t, &one, pc.dtype, RDA_FP32, kB, kN, kH, kHkv, kD), RDA_OK);
  if (rda_forward(e->plan, &t.q, &t.k, &t.v, &t.o, &t.lse, wsf, wf, e->stream[0]) != RDA_OK)
    fail_msg("%s: rda_forward: %s", e->name, rda_last_error(e->ctx));
  if (rda_backward(e->plan, &t.q, &t.k, &t.v, &t.o, &t.lse, &t.dout, &t.dlse, &t.dq, &t.dk, &t.dv,
                   wsb, wb, e->stream[0]) != RDA_OK)
    fail_msg("%s: rda_backward: %s", e->name, rda_last_error(e->ctx));
  mm_sync(e, 0);
  pr->o1 = host_f32(nq), pr->l1 = host_f32(nl);
  pr->dq1 = host_f32(nq), pr->dk1 = host_f32(nk), pr->dv1 = host_f32(nk);
  mm_download(e, pr->o1, o, nq * 4), mm_download(e, pr->l1, lse, nl * 4);
  mm_download(e, pr->dq1, dq, nq * 4), mm_download(e, pr->dk1, dk, nk * 4);
  mm_download(e, pr->dv1, dv, nk * 4);
  void *const bufs[] = {q, k, v, dout, dlse, o, lse, dq, dk, dv, wsf, wsb};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) mm_free(e, bufs[i]);
  rt_reference(&pr->c, kB, kN, pr->q, pr->k, pr->v, &pr->o_ref, &pr->lse_ref);
  rt_reference_bwd(&pr->c, kB, kN, pr->q, pr->k, pr->v, pr->dout, pr->dlse, &pr->dq_ref,
                   &pr->dk_ref, &pr->dv_ref);
  /* The single device first, against float64: a ring that matches a wrong one proves little. */
  char what[128];
  snprintf(what, sizeof what, "%s: single-device forward vs reference", e->name);
  assert_true(rt_check_fwd(what, &pr->c, kB, kN, pr->o1, pr->qs, pr->l1, pr->ls, pr->o_ref,
                           pr->lse_ref, NULL));
  snprintf(what, sizeof what, "%s: single-device backward vs reference", e->name);
  assert_true(rt_check_bwd(what, &pr->c, kB, kN, pr->dq1, pr->qs, pr->dk1, pr->ks, pr->dv1, pr->ks,
                           pr->dq_ref, pr->dk_ref, pr->dv_ref, NULL));
}

static void problem_free(problem *pr) {
  free(pr->q), free(pr->k), free(pr->v), free(pr->dout), free(pr->dlse);
  free(pr->qb), free(pr->kb), free(pr->vb), free(pr->dob), free(pr->dlsef);
  free(pr->o1), free(pr->l1), free(pr->dq1), free(pr->dk1), free(pr->dv1);
  free(pr->o_ref), free(pr->lse_ref), free(pr->dq_ref), free(pr->dk_ref), free(pr->dv_ref);
}

/* Copy rows [lo, hi) of a global [batch, N, W] array (elem bytes each) to or from a rank's
 * [batch, R, W] one; LSE-shaped [B, H, N] arrays are batch B * H, W 1. */
static void copy_rows(void *global, void *local, long long batch, long long R, long long W,
                      size_t elem, long long lo, long long hi, int to_global) {
  const size_t row = (size_t)W * elem;
  for (long long b = 0; b < batch; ++b)
    for (long long g = lo; g < hi; ++g) {
      char *gp = (char *)global + (size_t)(b * kN + g) * row;
      char *lp = (char *)local + (size_t)(b * R + g - lo) * row;
      memcpy(to_global ? gp : lp, to_global ? lp : gp, row);
    }
}

/* ------------------------------------------------------------------ the ranks */

enum { kRun = 0, kAbort = 1 };

/* What the rank threads and the main thread share: the world and the steps they meet at. */
typedef struct shared {
  rda_ring_world *world;
  pthread_barrier_t joined;  /* every rank tried to join: main sets up their buffers */
  pthread_barrier_t go;      /* buffers ready (or stop): the calls start */
  pthread_barrier_t aborted; /* kAbort: main has called rda_ring_abort */
  int stop;                  /* a rank could not join or be set up: every thread leaves */
} shared;

/* One rank: its ring, its buffers on the context (its rows only), what it saw. */
typedef struct rjob {
  env *e;
  shared *sh;
  int rank, mode;
  rda_ring *ring;
  long long R, lo[2], hi[2];
  int npieces;
  /* On the context: inputs, outputs, workspaces (forward: only the ring's buffers part). */
  rt_attn_bufs b; /* q, k, v, o, lse, dout, dlse, dq, dk, dv */
  void *wsf, *wsb;
  size_t lq, lk, ll, wsf_bytes, wsb_bytes;
  rt_attn_tensors t;
  /* Host copies of its results. */
  float *h_o, *h_lse, *h_dq, *h_dk, *h_dv;
  rda_status create_s, fwd_s, bwd_s, after_s;
  int io_failed; /* setup, a stream sync, a download, poison or the hold-up failed: io says */
  char msg[1024], after_msg[1024], io[1100];
  double fwd_wall_s;
  rda_ring_stats stats;
} rjob;

/* The rows rda.h gives a rank of the contiguous layout (the first N mod P one more). */
static void model_rows(int rank, long long *lo, long long *hi) {
  const long long base = kN / kP, extra = kN % kP;
  *lo = rank * base + (rank < extra ? rank : extra);
  *hi = *lo + base + (rank < extra ? 1 : 0);
}

/* Record the first failure of the rank (j->io holds the detail), prefixed with where. */
static void io_fail(rjob *j, const char *where) {
  if (!j->io_failed) {
    char tmp[sizeof j->io];
    snprintf(tmp, sizeof tmp, "%s", j->io);
    snprintf(j->io, sizeof j->io, "%.60s: %.1000s", where, tmp); /* fits */
  }
  j->io_failed = 1;
}

static void *rank_main(void *arg) {
  rjob *j = arg;
  env *e = j->e;
  shared *sh = j->sh;
  char *io = j->io;
  const size_t cap = sizeof j->io;
  j->create_s = j->fwd_s = j->bwd_s = j->after_s = RDA_ERR_INTERNAL;
  if (m_enter(e, io, cap) != 0) io_fail(j, "enter");
  rda_ring_desc d = RDA_RING_DESC_INIT;
  d.n = kN, d.ranks = kP, d.rank = j->rank, d.world = sh->world;
  j->create_s = rda_ring_create(&j->ring, e->plan, &d);
  if (j->create_s != RDA_OK) snprintf(j->msg, sizeof j->msg, "%s", rda_last_error(NULL));
  pthread_barrier_wait(&sh->joined); /* main sizes and fills this rank's buffers */
  pthread_barrier_wait(&sh->go);
  if (sh->stop) return NULL;
  void *const stream = e->stream[j->rank];

  if (j->rank == 1 && m_delay(e, 1, io, cap) != 0) io_fail(j, "hold-up before the forward");
  const double t0 = rt_now_s();
  j->fwd_s = rda_ring_forward(j->ring, &j->t.q, &j->t.k, &j->t.v, &j->t.o, &j->t.lse, j->wsf,
                              j->wsf_bytes, stream);
  j->fwd_wall_s = rt_now_s() - t0;
  if (j->fwd_s != RDA_OK) snprintf(j->msg, sizeof j->msg, "%s", rda_last_error(NULL));
  rda_ring_get_stats(j->ring, &j->stats);
  if (j->mode == kRun && j->fwd_s == RDA_OK) {
    /* Held up again: the backward reads the forward's O and LSE in stream order. */
    if (j->rank == 1 && m_delay(e, 1, io, cap) != 0) io_fail(j, "hold-up before the backward");
    j->bwd_s =
        rda_ring_backward(j->ring, &j->t.q, &j->t.k, &j->t.v, &j->t.o, &j->t.lse, &j->t.dout,
                          &j->t.dlse, &j->t.dq, &j->t.dk, &j->t.dv, j->wsb, j->wsb_bytes, stream);
    if (j->bwd_s != RDA_OK) snprintf(j->msg, sizeof j->msg, "%s", rda_last_error(NULL));
  }
  if (j->mode == kAbort) {
    /* Once the abort was made (the first call may have finished before it), the ring stays
     * failed: a second call fails at once. */
    pthread_barrier_wait(&sh->aborted);
    j->after_s = rda_ring_forward(j->ring, &j->t.q, &j->t.k, &j->t.v, &j->t.o, &j->t.lse, j->wsf,
                                  j->wsf_bytes, stream);
    snprintf(j->after_msg, sizeof j->after_msg, "%s",
             j->after_s == RDA_OK ? "" : rda_last_error(NULL));
  }
  /* This rank's stream alone, then its rows at once, while the others may still be running. */
  if (m_sync(e, j->rank, io, cap) != 0) return io_fail(j, "after the calls"), NULL;
  const int fwd_ok = j->fwd_s == RDA_OK, bwd_ok = j->mode == kRun && j->bwd_s == RDA_OK;
  if ((fwd_ok && (m_download(e, j->h_o, j->b.o, j->lq * 4, io, cap) != 0 ||
                  m_download(e, j->h_lse, j->b.lse, j->ll * 4, io, cap) != 0)) ||
      (bwd_ok && (m_download(e, j->h_dq, j->b.dq, j->lq * 4, io, cap) != 0 ||
                  m_download(e, j->h_dk, j->b.dk, j->lk * 4, io, cap) != 0 ||
                  m_download(e, j->h_dv, j->b.dv, j->lk * 4, io, cap) != 0)))
    return io_fail(j, "results"), NULL;
  /* After an abort: the workspace (the ring's receive buffers) and outputs poisoned again, for
   * the main thread to find untouched once every stream has drained. */
  if (j->mode == kAbort && (m_poison(e, j->wsf, j->wsf_bytes, io, cap) != 0 ||
                            m_poison(e, j->b.o, j->lq * 4, io, cap) != 0 ||
                            m_poison(e, j->b.lse, j->ll * 4, io, cap) != 0))
    io_fail(j, "poison after the call");
  return NULL;
}

/* Main thread, between the barriers (so no cmocka failure here, which would leave the threads
 * waiting): check the rank's rows, size and fill its buffers. 0, or -1 with j->io saying why. */
static int job_setup(rjob *j, const problem *pr) {
  env *e = j->e;
  char *io = j->io;
  const size_t cap = sizeof j->io;
  long long lo = 0, hi = 0;
  model_rows(j->rank, &lo, &hi);
  if (rda_ring_rows(j->ring, &j->R, &j->npieces, j->lo, j->hi) != RDA_OK || j->R != hi - lo ||
      j->npieces != 1 || j->lo[0] != lo || j->hi[0] != hi) {
    snprintf(io, cap, "rda_ring_rows gives %lld rows in %d pieces from %lld, expected [%lld, %lld)",
             j->R, j->npieces, j->lo[0], lo, hi);
    return -1;
  }
  const long long R = j->R;
  j->lq = (size_t)(kB * R * kH * kD), j->lk = (size_t)(kB * R * kHkv * kD);
  j->ll = (size_t)(kB * kH * R);
  /* With an fp32 O and an LSE given, the forward uses only the ring's buffers: exactly those,
   * so a write past them is out of bounds (ASan sees it on the emulator). */
  size_t full = 0;
  const size_t o_part = round256(j->lq * 4), l_part = round256(j->ll * 4);
  if (rda_ring_workspace_size(j->ring, kB, 0, &full) != RDA_OK ||
      rda_ring_workspace_size(j->ring, kB, 1, &j->wsb_bytes) != RDA_OK ||
      full <= o_part + l_part) { /* every rank here moves K/V rows: the ring needs buffers */
    snprintf(io, cap, "rda_ring_workspace_size: %zu bytes for the forward: %s", full,
             rda_last_error(e->ctx));
    return -1;
  }
  j->wsf_bytes = full - o_part - l_part;
  struct {
    void **p;
    size_t bytes;
  } const mem[12] = {
      {&j->b.q, j->lq * 2},    {&j->b.k, j->lk * 2},    {&j->b.v, j->lk * 2},
      {&j->b.dout, j->lq * 2}, {&j->b.dlse, j->ll * 4}, {&j->b.o, j->lq * 4},
      {&j->b.lse, j->ll * 4},  {&j->b.dq, j->lq * 4},   {&j->b.dk, j->lk * 4},
      {&j->b.dv, j->lk * 4},   {&j->wsf, j->wsf_bytes}, {&j->wsb, j->wsb_bytes},
  };
  for (int i = 0; i < 12; ++i)
    if (m_alloc(e, mem[i].bytes, mem[i].p, io, cap) != 0) return -1;
  /* The rank's rows through host staging; outputs and workspaces poisoned. */
  struct {
    const void *global;
    void *dev;
    long long batch, W;
    size_t elem;
  } const in[5] = {
      {pr->qb, j->b.q, kB, kH * kD, 2},      {pr->kb, j->b.k, kB, kHkv * kD, 2},
      {pr->vb, j->b.v, kB, kHkv * kD, 2},    {pr->dob, j->b.dout, kB, kH * kD, 2},
      {pr->dlsef, j->b.dlse, kB * kH, 1, 4},
  };
  void *stage = malloc(j->lq * 2 > j->ll * 4 ? j->lq * 2 : j->ll * 4);
  if (stage == NULL) return snprintf(io, cap, "out of host memory"), -1;
  int rc = 0;
  for (int i = 0; i < 5 && rc == 0; ++i) {
    copy_rows((void *)(uintptr_t)in[i].global, stage, in[i].batch, R, in[i].W, in[i].elem, j->lo[0],
              j->hi[0], 0);
    rc = m_upload(e, in[i].dev, stage, (size_t)(in[i].batch * R * in[i].W) * in[i].elem, io, cap);
  }
  free(stage);
  for (int i = 5; i < 12 && rc == 0; ++i) rc = m_poison(e, *mem[i].p, mem[i].bytes, io, cap);
  if (rc != 0) return -1;
  if (rt_attn(&j->t, &j->b, RDA_BF16, RDA_FP32, kB, R, kH, kHkv, kD) != RDA_OK)
    return snprintf(io, cap, "rda_tensor_contiguous: %s", rda_last_error(NULL)), -1;
  float **const host[5] = {&j->h_o, &j->h_lse, &j->h_dq, &j->h_dk, &j->h_dv};
  const size_t count[5] = {j->lq, j->ll, j->lq, j->lk, j->lk};
  for (int i = 0; i < 5; ++i) {
    if ((*host[i] = malloc(count[i] * sizeof(float))) == NULL)
      return snprintf(io, cap, "out of host memory"), -1;
    rt_poison_f32(*host[i], count[i]);
  }
  return 0;
}

static void job_free(rjob *j) {
  env *e = j->e;
  void *const bufs[] = {j->b.q,   j->b.k,  j->b.v,  j->b.dout, j->b.dlse, j->b.o,
                        j->b.lse, j->b.dq, j->b.dk, j->b.dv,   j->wsf,    j->wsb};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) mm_free(e, bufs[i]);
  free(j->h_o), free(j->h_lse), free(j->h_dq), free(j->h_dk), free(j->h_dv);
}

static void rings_end(rjob *jobs, shared *sh) {
  for (int p = 0; p < kP; ++p) rda_ring_destroy(jobs[p].ring);
  rda_ring_world_destroy(sh->world);
  for (int p = 0; p < kP; ++p) job_free(&jobs[p]);
}

/* The P ranks of one world: start them, let each join, set up its buffers, release them (and,
 * for kAbort, abort rank 2's ring abort_after_s later), wait for them. The rings stay for the
 * caller's checks, which end with rings_end. */
static void rings_run(env *e, const problem *pr, int mode, double abort_after_s, rjob *jobs,
                      shared *sh) {
  memset(sh, 0, sizeof *sh);
  if (rda_ring_world_create(&sh->world, e->ctx, kP, kTimeout) != RDA_OK)
    fail_msg("%s: rda_ring_world_create: %s", e->name, rda_last_error(e->ctx));
  assert_int_equal(pthread_barrier_init(&sh->joined, NULL, kP + 1), 0);
  assert_int_equal(pthread_barrier_init(&sh->go, NULL, kP + 1), 0);
  assert_int_equal(pthread_barrier_init(&sh->aborted, NULL, kP + 1), 0);
  pthread_t th[kP];
  memset(jobs, 0, kP * sizeof *jobs);
  for (int p = 0; p < kP; ++p) {
    jobs[p].e = e, jobs[p].sh = sh, jobs[p].rank = p, jobs[p].mode = mode;
    assert_int_equal(pthread_create(&th[p], NULL, rank_main, &jobs[p]), 0);
  }
  pthread_barrier_wait(&sh->joined);
  for (int p = 0; p < kP; ++p)
    if (jobs[p].create_s != RDA_OK) sh->stop = 1;
  for (int p = 0; p < kP && !sh->stop; ++p)
    if (job_setup(&jobs[p], pr) != 0) jobs[p].io_failed = 1, sh->stop = 1;
  pthread_barrier_wait(&sh->go);
  if (mode == kAbort && !sh->stop) {
    const struct timespec nap = {(time_t)abort_after_s,
                                 (long)((abort_after_s - (double)(time_t)abort_after_s) * 1e9)};
    nanosleep(&nap, NULL);
    rda_ring_abort(jobs[2].ring, kReason);
    pthread_barrier_wait(&sh->aborted);
  }
  for (int p = 0; p < kP; ++p) pthread_join(th[p], NULL);
  pthread_barrier_destroy(&sh->joined);
  pthread_barrier_destroy(&sh->go);
  pthread_barrier_destroy(&sh->aborted);
  char why[1200] = "";
  for (int p = 0; p < kP && why[0] == '\0'; ++p) {
    const rjob *j = &jobs[p];
    if (j->create_s != RDA_OK)
      snprintf(why, sizeof why, "rank %d: rda_ring_create: %s", p, j->msg);
    else if (j->io_failed)
      snprintf(why, sizeof why, "rank %d: %s", p, j->io);
  }
  if (why[0] != '\0') {
    rings_end(jobs, sh);
    fail_msg("%s: %s", e->name, why);
  }
}

static void check_rel_l2_f32(const char *what, const float *got, const float *want, size_t n,
                             double tol) {
  double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  assert_true(a != NULL && b != NULL);
  for (size_t i = 0; i < n; ++i) a[i] = got[i], b[i] = want[i];
  const bool ok = rt_check_rel_l2(what, a, b, n, tol);
  free(a), free(b);
  assert_true(ok);
}

/* Every rank's forward rows gathered (and its gradients with grads), against the single device
 * and float64. */
static void check_gathered(env *e, const problem *pr, const rjob *jobs, int grads) {
  const rt_tol tol = rt_tolerance(RDA_DTYPE_BF16);
  float *og = host_f32(pr->nq), *lg = host_f32(pr->nl);
  float *dqg = host_f32(pr->nq), *dkg = host_f32(pr->nk), *dvg = host_f32(pr->nk);
  for (int p = 0; p < kP; ++p) {
    const rjob *j = &jobs[p];
    const long long lo = j->lo[0], hi = j->hi[0], R = j->R;
    copy_rows(og, j->h_o, kB, R, kH * kD, 4, lo, hi, 1);
    copy_rows(lg, j->h_lse, kB * kH, R, 1, 4, lo, hi, 1);
    if (grads) {
      copy_rows(dqg, j->h_dq, kB, R, kH * kD, 4, lo, hi, 1);
      copy_rows(dkg, j->h_dk, kB, R, kHkv * kD, 4, lo, hi, 1);
      copy_rows(dvg, j->h_dv, kB, R, kHkv * kD, 4, lo, hi, 1);
    }
  }
  char what[160];
  snprintf(what, sizeof what, "%s: ring O vs single-device O", e->name);
  check_rel_l2_f32(what, og, pr->o1, pr->nq, tol.o_rel_l2);
  snprintf(what, sizeof what, "%s: ring LSE vs single-device LSE", e->name);
  assert_true(rt_check_lse_close(what, lg, pr->l1, pr->nl, tol.lse_abs));
  snprintf(what, sizeof what, "%s: ring forward vs reference", e->name);
  assert_true(
      rt_check_fwd(what, &pr->c, kB, kN, og, pr->qs, lg, pr->ls, pr->o_ref, pr->lse_ref, NULL));
  if (grads) {
    const float *ring_g[3] = {dqg, dkg, dvg}, *one_g[3] = {pr->dq1, pr->dk1, pr->dv1};
    static const char *const gname[3] = {"dQ", "dK", "dV"};
    for (int g = 0; g < 3; ++g) {
      snprintf(what, sizeof what, "%s: ring %s vs single-device %s", e->name, gname[g], gname[g]);
      check_rel_l2_f32(what, ring_g[g], one_g[g], g == 0 ? pr->nq : pr->nk, tol.grad_rel_l2);
    }
    snprintf(what, sizeof what, "%s: ring gradients vs reference", e->name);
    assert_true(rt_check_bwd(what, &pr->c, kB, kN, dqg, pr->qs, dkg, pr->ks, dvg, pr->ks,
                             pr->dq_ref, pr->dk_ref, pr->dv_ref, NULL));
  }
  free(og), free(lg), free(dqg), free(dkg), free(dvg);
}

/* One line, naming what it must. */
static void assert_one_line_naming(const char *who, const char *msg, const char *what) {
  if (msg[0] == '\0' || strchr(msg, '\n') != NULL || strstr(msg, what) == NULL)
    fail_msg("%s: expected one line naming '%s'; got: %s", who, what, msg);
}

/* ------------------------------------------------------------------ the cases */

/* P ranks, each on its own stream, forward then backward: every rank's rows match the single
 * device and float64. */
static void ring_matches_single_device(env *e) {
  problem pr;
  problem_make(&pr, e);
  rjob jobs[kP];
  shared sh;
  rings_run(e, &pr, kRun, 0.0, jobs, &sh);
  unsigned long long sent = 0, received = 0;
  e->fwd_wall_s = 0.0;
  for (int p = 0; p < kP; ++p) {
    const rjob *j = &jobs[p];
    if (j->fwd_s != RDA_OK || j->bwd_s != RDA_OK)
      fail_msg("%s: rank %d: forward %d, backward %d: %s", e->name, p, j->fwd_s, j->bwd_s, j->msg);
    sent += j->stats.bytes_sent, received += j->stats.bytes_received;
    if (j->fwd_wall_s > e->fwd_wall_s) e->fwd_wall_s = j->fwd_wall_s;
  }
  /* The ranks did exchange rows: what the hold-up on rank 1 is there to test. */
  assert_true(sent == received && sent > 0);
  check_gathered(e, &pr, jobs, 1);
  rings_end(jobs, &sh);
  problem_free(&pr);
}

/* rda_ring_abort from this thread while the ranks are in rda_ring_forward, as soon as they are
 * released and then later: the calls may still race to completion (then every rank finished,
 * with the right rows), or every rank fails with one line naming the reason. Either way the ring
 * stays failed, and once every stream has drained after a 100 ms pause, nothing has landed in a
 * rank's workspace (its receive buffers) or outputs since it saw its error and poisoned them. */
static void ring_abort_mid_forward(env *e) {
  problem pr;
  problem_make(&pr, e);
  /* From a third of the forward's time (as the run case measured it) down to none at all. */
  const double fwd = e->fwd_wall_s > 0.0 ? e->fwd_wall_s : 0.02;
  const double after[3] = {fwd / 3.0, fwd / 10.0, 0.0};
  int failed_once = 0;
  for (int attempt = 0; attempt < 3 && !failed_once; ++attempt) {
    rjob jobs[kP];
    shared sh;
    rings_run(e, &pr, kAbort, after[attempt], jobs, &sh);
    int nok = 0;
    for (int p = 0; p < kP; ++p) nok += jobs[p].fwd_s == RDA_OK;
    if (nok != 0 && nok != kP)
      fail_msg(
          "%s: %d of %d ranks finished the aborted forward (all or none must): rank 0: "
          "%d %s; rank 1: %d %s; rank 2: %d %s; rank 3: %d %s",
          e->name, nok, kP, jobs[0].fwd_s, jobs[0].msg, jobs[1].fwd_s, jobs[1].msg, jobs[2].fwd_s,
          jobs[2].msg, jobs[3].fwd_s, jobs[3].msg);
    failed_once = nok == 0;
    printf("%s: abort %.2f ms after the release: %s\n", e->name, after[attempt] * 1e3,
           failed_once ? "every rank failed" : "every rank had finished");
    char who[64];
    for (int p = 0; p < kP; ++p) {
      const rjob *j = &jobs[p];
      snprintf(who, sizeof who, "%s: rank %d", e->name, p);
      if (failed_once) {
        if (j->fwd_s != RDA_ERR_NCCL)
          fail_msg("%s: status %d, expected RDA_ERR_NCCL: %s", who, j->fwd_s, j->msg);
        assert_one_line_naming(who, j->msg, kReason);
        assert_one_line_naming(who, j->msg, "rda_ring_forward");
      }
      if (j->after_s != RDA_ERR_NCCL)
        fail_msg("%s: a call after the abort: status %d, expected RDA_ERR_NCCL: %s", who,
                 j->after_s, j->after_msg);
      assert_one_line_naming(who, j->after_msg, "aborted");
    }
    if (!failed_once) check_gathered(e, &pr, jobs, 0);
    /* Nothing lands after the error: the poison the ranks wrote is still there. */
    const struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
    char why[256];
    if (m_sync_all(e, why, sizeof why) != 0) fail_msg("%s: %s", e->name, why);
    for (int p = 0; p < kP; ++p) {
      const rjob *j = &jobs[p];
      void *const dev[3] = {j->wsf, j->b.o, j->b.lse};
      const size_t bytes[3] = {j->wsf_bytes, j->lq * 4, j->ll * 4};
      static const char *const name[3] = {"workspace", "O", "LSE"};
      for (int i = 0; i < 3; ++i) {
        float *got = host_f32(bytes[i] / 4), *want = host_f32(bytes[i] / 4);
        mm_download(e, got, dev[i], bytes[i]);
        if (memcmp(got, want, bytes[i]) != 0)
          fail_msg(
              "%s: rank %d: its %s changed after it returned from the aborted call and "
              "poisoned it",
              e->name, p, name[i]);
        free(got), free(want);
      }
    }
    rings_end(jobs, &sh);
  }
  if (!failed_once)
    printf(
        "%s: every abort came after the calls had finished: the abort mid-pass was not "
        "reached this time\n",
        e->name);
  problem_free(&pr);
}

static void test_emulator_ring_on_streams_matches_single_device(void **state) {
  (void)state;
  ring_matches_single_device(emu_env());
}

static void test_emulator_ring_abort_mid_forward(void **state) {
  (void)state;
  ring_abort_mid_forward(emu_env());
}

static void test_cuda_ring_on_streams_matches_single_device(void **state) {
  (void)state;
  ring_matches_single_device(cuda_env());
}

static void test_cuda_ring_abort_mid_forward(void **state) {
  (void)state;
  ring_abort_mid_forward(cuda_env());
}

int main(int argc, char **argv) {
  (void)argc, (void)argv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_emulator_ring_on_streams_matches_single_device),
      cmocka_unit_test(test_emulator_ring_abort_mid_forward),
      cmocka_unit_test(test_cuda_ring_on_streams_matches_single_device),
      cmocka_unit_test(test_cuda_ring_abort_mid_forward),
  };
  return cmocka_run_group_tests(tests, NULL, group_teardown);
}
