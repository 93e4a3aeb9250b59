/* ring_virtual.c — P virtual ranks in one process (see ring_virtual.h). The calling thread gives
 * each rank its rows (upload), the rank threads run the ring forward (and backward) over one
 * transport endpoint each, the calling thread gathers their rows back. */
#include "ring_virtual.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "bwd.h"
#include "emu.h"
#include "fwd.h"
#include "ring_plan.h"
#include "transport.h"

enum { R_Q, R_K, R_V, R_O, R_LSE, R_DO, R_DQ, R_DK, R_DV, R_DP, R_WS, R_COUNT };

/* Holds the rank threads until all exist: state 0 wait, 1 go, 2 give up. */
typedef struct ring_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int state;
} ring_gate;

typedef struct ring_rank_run {
  ring_gate *gate;
  rda_backend *b;
  rda_fwd_kernels kernels;
  const rda_plan_k *plan;
  const rda_ring_plan *rp;
  rda_host_world *host_world;
  rda_device_world *device_world;
  uint64_t fingerprint;
  int rank, backward;
  void *mem[R_COUNT];
  size_t ws_bytes;
  rda_fwd_args a;
  rda_bwd_args g;
  rda_ring_run_stats stats, bstats;
  int iters;
  double fwd_s, bwd_s;
  rda_ring_trace *trace; /* or NULL */
  /* Device timelines: the events, rank 0's reference event (every rank's copy of the handle)
   * and where the times go (or NULL). */
  rda_ring_trace_dev dev;
  void *ref;
  rda_ring_timeline *tl_fwd, *tl_bwd;
  rda_status status;
  rda_err err;
} ring_rank_run;

static double ring_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One timed pass: barrier, the pass, device synchronization, barrier; seconds on *dt. With
 * trace, the pass is recorded there (rda_ring_trace). */
static rda_status ring_rank_pass(ring_rank_run *r, rda_transport *t, int backward,
                                 rda_ring_trace *trace, double *dt) {
  RDA_TRY(rda_transport_barrier(t, &r->err));
  rda_ring_trace_thread(trace);
  const double t0 = ring_now();
  const rda_status s =
      backward ? rda_ring_bwd_run(r->b, r->plan, &r->kernels, r->rp, r->rank, t, &r->g,
                                  r->mem[R_WS], r->ws_bytes, &r->bstats, &r->err)
               : rda_ring_fwd_run(r->b, r->plan, &r->kernels, r->rp, r->rank, t, &r->a,
                                  r->mem[R_WS], r->ws_bytes, &r->stats, &r->err);
  rda_ring_trace_thread(NULL);
  RDA_TRY(s);
  RDA_TRY(r->b->synchronize(r->b, &r->err));
  if (trace != NULL) trace->synced = ring_now();
  RDA_TRY(rda_transport_barrier(t, &r->err));
  *dt = ring_now() - t0;
  return RDA_OK;
}

/* One pass with a device timeline into out: every rank's device idle, rank 0 records the
 * reference (and waits for it, so it precedes every rank's pass), then the traced pass. */
static rda_status ring_rank_timeline(ring_rank_run *r, rda_transport *t, int backward,
                                     rda_ring_timeline *out) {
  double dt = 0;
  RDA_TRY(rda_transport_barrier(t, &r->err));
  RDA_TRY(r->b->synchronize(r->b, &r->err));
  RDA_TRY(rda_transport_barrier(t, &r->err));
  if (r->rank == 0) {
    RDA_TRY(r->b->event_record(r->b, r->ref, &r->err));
    RDA_TRY(r->b->synchronize(r->b, &r->err));
  }
  rda_ring_trace trace;
  memset(&trace, 0, sizeof trace);
  trace.dev = &r->dev;
  RDA_TRY(ring_rank_pass(r, t, backward, &trace, &dt));
  return rda_ring_trace_dev_times(&r->dev, r->ref, out, &r->err);
}

static rda_status ring_rank_body(ring_rank_run *r, rda_transport *t) {
  double dt = 0;
  /* The first passes produce the results (and warm up); timed repeats recompute them. */
  RDA_TRY(ring_rank_pass(r, t, 0, NULL, &dt));
  if (r->backward) RDA_TRY(ring_rank_pass(r, t, 1, NULL, &dt));
  for (int i = 0; i < r->iters; ++i) {
    /* The last timed forward pass is the one traced. */
    RDA_TRY(ring_rank_pass(r, t, 0, i + 1 == r->iters ? r->trace : NULL, &dt));
    r->fwd_s += dt / r->iters;
    if (!r->backward) continue;
    RDA_TRY(ring_rank_pass(r, t, 1, NULL, &dt));
    r->bwd_s += dt / r->iters;
  }
  if (r->tl_fwd != NULL) RDA_TRY(ring_rank_timeline(r, t, 0, r->tl_fwd));
  if (r->tl_bwd != NULL) RDA_TRY(ring_rank_timeline(r, t, 1, r->tl_bwd));
  return RDA_OK;
}

/* Rank r's timeline events: enough for its virtual steps (at most 3 per plan step, the
 * backward's gradient shifts included), at most the caller's cap. */
static rda_status ring_rank_timeline_setup(ring_rank_run *r, int cap, rda_err *err) {
  rda_ring_step *steps = NULL;
  int64_t nsteps = 0;
  RDA_TRY(rda_ring_plan_steps(r->rp, r->rank, &steps, &nsteps, err));
  free(steps);
  const int64_t need = (r->backward ? 3 : 1) * nsteps;
  return rda_ring_trace_dev_create(r->b, need < cap ? (int)need : cap, &r->dev, err);
}

static void *ring_rank_main(void *arg) {
  ring_rank_run *r = arg;
  rda_transport *t = NULL;
  pthread_mutex_lock(&r->gate->mu);
  while (r->gate->state == 0) pthread_cond_wait(&r->gate->cv, &r->gate->mu);
  const int go = r->gate->state == 1;
  pthread_mutex_unlock(&r->gate->mu);
  if (!go) {
    r->status = rda_err_set(&r->err, RDA_ERR_INTERNAL, "rank %d: not started", r->rank);
    return NULL;
  }
  r->status = r->device_world != NULL
                  ? rda_device_world_join(r->device_world, r->rank, r->fingerprint, r->b, &t,
                                          &r->err)
                  : rda_host_world_join(r->host_world, r->rank, r->fingerprint, &t, &r->err);
  if (r->status == RDA_OK) {
    r->status = ring_rank_body(r, t);
    if (r->status != RDA_OK) rda_transport_abort(t, r->err.msg);
  }
  rda_transport_destroy(t);
  return NULL;
}

/* Copy the rows a rank owns between a global [B, N, X] array and a local [B, R, X] one. */
static void ring_rows_copy(const rda_ring_rank *rk, long long B, long long N, long long X,
                           size_t elem, void *global, void *local, int to_global) {
  const size_t rb = (size_t)X * elem;
  long long i = 0;
  for (int pc = 0; pc < rk->npieces; ++pc)
    for (long long gr = rk->lo[pc]; gr < rk->hi[pc]; ++gr, ++i)
      for (long long b = 0; b < B; ++b) {
        char *gp = (char *)global + (size_t)((b * N + gr) * X) * elem;
        char *lp = (char *)local + (size_t)((b * rk->rows + i) * X) * elem;
        memcpy(to_global ? gp : lp, to_global ? lp : gp, rb);
      }
}

/* Upload the rank's rows of a global 16-bit tensor [B, N, X] into mem. */
static rda_status ring_upload_rows(ring_rank_run *r, const rda_ring_rank *rk, long long B,
                                   long long N, long long X, const uint16_t *global, void *mem,
                                   rda_err *err) {
  const size_t bytes = (size_t)(B * rk->rows * X) * 2;
  if (bytes == 0) return RDA_OK; /* a rank without rows (P > N) has no memory there */
  void *host = malloc(bytes);
  if (host == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "out of host memory");
  ring_rows_copy(rk, B, N, X, 2, (void *)(uintptr_t)global, host, 0);
  const rda_status s = r->b->upload(r->b, mem, host, bytes, err);
  free(host);
  return s;
}

/* Fill fp32 device memory with NaN: an element no kernel writes comes out NaN. */
static rda_status ring_poison(ring_rank_run *r, void *mem, size_t count, rda_err *err) {
  if (count == 0) return RDA_OK;
  float *host = malloc(count * sizeof(float));
  if (host == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "out of host memory");
  for (size_t i = 0; i < count; ++i) host[i] = NAN;
  const rda_status s = r->b->upload(r->b, mem, host, count * sizeof(float), err);
  free(host);
  return s;
}

/* Download the rank's fp32 rows [B, R, X] into the global [B, N, X] result. */
static rda_status ring_gather_rows(ring_rank_run *r, const rda_ring_rank *rk, long long B,
                                   long long N, long long X, const void *mem, float *global,
                                   rda_err *err) {
  const size_t bytes = (size_t)(B * rk->rows * X) * sizeof(float);
  void *host = malloc(bytes);
  if (host == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "out of host memory");
  rda_status s = r->b->download(r->b, host, mem, bytes, err);
  if (s == RDA_OK) ring_rows_copy(rk, B, N, X, sizeof(float), global, host, 1);
  free(host);
  return s;
}

static rda_status ring_alloc(ring_rank_run *r, int slot, size_t bytes, rda_err *err) {
  return bytes == 0 ? RDA_OK : r->b->alloc(r->b, bytes, &r->mem[slot], err);
}

/* Rank r's memory, inputs and arguments. */
static rda_status ring_rank_setup(ring_rank_run *r, const rda_ring_virtual *j,
                                  const rda_ring_rank *rk, rda_err *err) {
  const long long B = j->batch, N = j->n, R = rk->rows;
  const long long H = j->cfg->heads, Hkv = j->cfg->kv_heads, D = j->cfg->head_dim;
  const size_t nq = (size_t)(B * R * H * D), nk = (size_t)(B * R * Hkv * D);
  r->ws_bytes = rda_ring_workspace_bytes(r->plan, r->rp, r->rank, B, r->backward);
  if (r->ws_bytes == SIZE_MAX)
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "rank %d: out of host memory", r->rank);
  RDA_TRY(rda_fwd_load(r->b, r->plan, &r->kernels, err));
  RDA_TRY(ring_alloc(r, R_Q, nq * 2, err));
  RDA_TRY(ring_alloc(r, R_K, nk * 2, err));
  RDA_TRY(ring_alloc(r, R_V, nk * 2, err));
  RDA_TRY(ring_alloc(r, R_O, nq * 4, err));
  RDA_TRY(ring_alloc(r, R_LSE, (size_t)(B * H * R) * 4, err));
  RDA_TRY(ring_alloc(r, R_WS, r->ws_bytes, err));
  RDA_TRY(ring_upload_rows(r, rk, B, N, H * D, j->q, r->mem[R_Q], err));
  RDA_TRY(ring_upload_rows(r, rk, B, N, Hkv * D, j->k, r->mem[R_K], err));
  RDA_TRY(ring_upload_rows(r, rk, B, N, Hkv * D, j->v, r->mem[R_V], err));
  RDA_TRY(ring_poison(r, r->mem[R_O], nq, err));
  RDA_TRY(ring_poison(r, r->mem[R_LSE], (size_t)(B * H * R), err));
  rda_fwd_args_contiguous(&r->a, j->cfg, B, R, r->mem[R_Q], r->mem[R_K], r->mem[R_V],
                          r->mem[R_O], r->mem[R_LSE]);
  if (!r->backward) return RDA_OK;
  RDA_TRY(ring_alloc(r, R_DO, nq * 2, err));
  RDA_TRY(ring_alloc(r, R_DQ, nq * 4, err));
  RDA_TRY(ring_alloc(r, R_DK, nk * 4, err));
  RDA_TRY(ring_alloc(r, R_DV, nk * 4, err));
  RDA_TRY(ring_alloc(r, R_DP, rda_bwd_workspace_bytes(r->plan, B, R), err));
  RDA_TRY(ring_upload_rows(r, rk, B, N, H * D, j->dout, r->mem[R_DO], err));
  RDA_TRY(ring_poison(r, r->mem[R_DQ], nq, err));
  RDA_TRY(ring_poison(r, r->mem[R_DK], nk, err));
  RDA_TRY(ring_poison(r, r->mem[R_DV], nk, err));
  /* SPEC §4 has no --dlse: dLSE = 0. */
  rda_bwd_args_like_fwd(&r->g, &r->a, r->mem[R_DO], NULL, r->mem[R_DQ], r->mem[R_DK],
                        r->mem[R_DV], r->mem[R_DP]);
  return RDA_OK;
}

static rda_status ring_rank_gather(ring_rank_run *r, const rda_ring_virtual *j,
                                   const rda_ring_rank *rk, rda_err *err) {
  const long long B = j->batch, N = j->n, R = rk->rows;
  const long long H = j->cfg->heads, Hkv = j->cfg->kv_heads, D = j->cfg->head_dim;
  if (R == 0) return RDA_OK; /* P > N: nothing of the result is here */
  RDA_TRY(ring_gather_rows(r, rk, B, N, H * D, r->mem[R_O], j->o, err));
  /* LSE [B, H, R] -> [B, H, N]: its rows are the innermost dimension. */
  float *l = malloc(sizeof(float) * (size_t)(B * H * R));
  if (l == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "out of host memory");
  rda_status s = r->b->download(r->b, l, r->mem[R_LSE], sizeof(float) * (size_t)(B * H * R), err);
  long long i = 0;
  for (int pc = 0; s == RDA_OK && pc < rk->npieces; ++pc)
    for (long long gr = rk->lo[pc]; gr < rk->hi[pc]; ++gr, ++i)
      for (long long bh = 0; bh < B * H; ++bh) j->lse[bh * N + gr] = l[bh * R + i];
  free(l);
  if (s != RDA_OK || !r->backward) return s;
  RDA_TRY(ring_gather_rows(r, rk, B, N, H * D, r->mem[R_DQ], j->dq, err));
  RDA_TRY(ring_gather_rows(r, rk, B, N, Hkv * D, r->mem[R_DK], j->dk, err));
  return ring_gather_rows(r, rk, B, N, Hkv * D, r->mem[R_DV], j->dv, err);
}

rda_status rda_ring_virtual_run(rda_ring_virtual *j, rda_err *err) {
  const int P = j->ranks;
  rda_ring_plan *rp = NULL;
  RDA_TRY(rda_ring_plan_create(j->cfg, j->n, P, j->layout, &rp, err));
  rda_status s = RDA_OK;
  int started = 0;
  rda_host_world *hw_world = NULL;
  rda_device_world *dev_world = NULL;
  rda_plan_k plan;
  memset(&plan, 0, sizeof plan);
  int have_plan = 0;
  void *ref_ev = NULL; /* the timelines' reference, on rank 0's backend */
  ring_rank_run *ranks = calloc((size_t)P, sizeof *ranks);
  pthread_t *th = calloc((size_t)P, sizeof *th);
  char why[1024] = "";
  if (ranks == NULL || th == NULL) {
    s = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "out of memory for %d ranks", P);
    goto done;
  }
  /* One backend per rank; rank 0's ("auto": the GPU when one is usable) decides the kind and
   * the hardware the plan is for. */
  if ((s = rda_backend_open(j->backend, &ranks[0].b, why, sizeof why, err)) != RDA_OK) goto done;
  const char *kind = ranks[0].b->name;
  if (j->why != NULL && j->why_len > 0) snprintf(j->why, j->why_len, "%s", why);
  rda_hw hw;
  const unsigned flags = j->dout != NULL ? RDA_PLAN_BACKWARD : 0u;
  if ((s = rda_backend_hw(ranks[0].b, j->g, &hw, err)) != RDA_OK ||
      (s = rda_gen_plan_ex(j->g, j->cfg, &hw, flags, &plan, err)) != RDA_OK)
    goto done;
  have_plan = 1;
  s = strcmp(kind, "emu") != 0 || rda_backend_emu_async(ranks[0].b)
          ? rda_device_world_create(P, 3600.0, &dev_world, err)
          : rda_host_world_create(P, 3600.0, &hw_world, err);
  if (s != RDA_OK) goto done;
  const uint64_t fp = rda_ring_fingerprint(j->cfg, j->n, P, j->layout);
  for (int p = 0; p < P; ++p) {
    ring_rank_run *r = &ranks[p];
    r->plan = &plan;
    r->rp = rp;
    r->host_world = hw_world;
    r->device_world = dev_world;
    r->fingerprint = fp;
    r->rank = p;
    r->backward = j->dout != NULL;
    r->iters = j->iters;
    r->trace = j->traces != NULL ? &j->traces[p] : NULL;
    if (r->b == NULL && (s = rda_backend_open(kind, &r->b, why, sizeof why, err)) != RDA_OK)
      goto done;
    rda_err e = {0};
    if ((s = ring_rank_setup(r, j, rda_ring_plan_rank(rp, p), &e)) != RDA_OK) {
      rda_err_set(err, s, "rank %d: %s", p, e.msg);
      goto done;
    }
    if (j->timeline_fwd == NULL) continue;
    r->tl_fwd = &j->timeline_fwd[p];
    r->tl_bwd = r->backward && j->timeline_bwd != NULL ? &j->timeline_bwd[p] : NULL;
    if (p == 0 && (s = r->b->event_create_timed == NULL
                           ? rda_err_set(&e, RDA_ERR_UNSUPPORTED, "no timed events")
                           : r->b->event_create_timed(r->b, &ref_ev, &e)) != RDA_OK) {
      rda_err_set(err, s, "timeline: %s", e.msg);
      goto done;
    }
    r->ref = ref_ev;
    const int cap = r->tl_bwd != NULL && r->tl_bwd->cap > r->tl_fwd->cap ? r->tl_bwd->cap
                                                                          : r->tl_fwd->cap;
    if ((s = ring_rank_timeline_setup(r, cap, &e)) != RDA_OK) {
      rda_err_set(err, s, "rank %d: %s", p, e.msg);
      goto done;
    }
  }
  /* The ranks join the world only once every thread exists: a rank whose thread could not
   * start would leave the others waiting for it until the timeout. */
  ring_gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  for (int p = 0; p < P; ++p) ranks[p].gate = &gate;
  for (; started < P; ++started)
    if (pthread_create(&th[started], NULL, ring_rank_main, &ranks[started]) != 0) {
      s = rda_err_set(err, RDA_ERR_INTERNAL, "cannot start the thread of rank %d", started);
      break;
    }
  pthread_mutex_lock(&gate.mu);
  gate.state = s == RDA_OK ? 1 : 2;
  pthread_cond_broadcast(&gate.cv);
  pthread_mutex_unlock(&gate.mu);
  for (int p = 0; p < started; ++p) pthread_join(th[p], NULL);
  if (s != RDA_OK) goto done;
  /* The first failure is the cause; the other ranks report its abort. */
  for (int pass = 0; pass < 2 && s == RDA_OK; ++pass)
    for (int p = 0; p < P && s == RDA_OK; ++p)
      if (ranks[p].status != RDA_OK && (pass == 1 || strstr(ranks[p].err.msg, "abort") == NULL))
        s = rda_err_set(err, ranks[p].status, "%s", ranks[p].err.msg);
  if (s != RDA_OK) goto done;
  j->fwd_s = j->bwd_s = 0;
  for (int p = 0; p < P; ++p) {
    rda_err e = {0};
    if ((s = ring_rank_gather(&ranks[p], j, rda_ring_plan_rank(rp, p), &e)) != RDA_OK) {
      rda_err_set(err, s, "rank %d: %s", p, e.msg);
      goto done;
    }
    if (j->stats != NULL) {
      /* Both passes: bytes add up, the peak is the larger one's. */
      rda_ring_run_stats st = ranks[p].stats;
      if (ranks[p].backward) {
        st.bytes_sent += ranks[p].bstats.bytes_sent;
        st.bytes_received += ranks[p].bstats.bytes_received;
        if (ranks[p].bstats.peak_bytes > st.peak_bytes) st.peak_bytes = ranks[p].bstats.peak_bytes;
      }
      j->stats[p] = st;
    }
    /* Every rank's pass ends at the same barrier: the slowest rank's time is the ring's. */
    if (ranks[p].fwd_s > j->fwd_s) j->fwd_s = ranks[p].fwd_s;
    if (ranks[p].bwd_s > j->bwd_s) j->bwd_s = ranks[p].bwd_s;
  }
done:
  for (int p = 0; ranks != NULL && p < P; ++p) {
    ring_rank_run *r = &ranks[p];
    if (r->b == NULL) continue;
    for (int m = 0; m < R_COUNT; ++m)
      if (r->mem[m] != NULL) r->b->free(r->b, r->mem[m]);
    rda_fwd_unload(r->b, &r->kernels);
    rda_ring_trace_dev_destroy(&r->dev);
    if (p == 0) r->b->event_destroy(r->b, ref_ev);
    r->b->destroy(r->b);
  }
  free(ranks);
  free(th);
  rda_host_world_destroy(hw_world);
  rda_device_world_destroy(dev_world);
  if (have_plan) rda_plan_k_free(&plan);
  rda_ring_plan_destroy(rp);
  return s;
}
