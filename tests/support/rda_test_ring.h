/* rda_test_ring.h — what the ring tests share: P virtual ranks in one process (a thread each over
 * the host transport, one emulator backend each), a rank's rows of global [B, N, X] and [B, H, N]
 * tensors moved to its device in the config's storage dtype and its fp32 results gathered back,
 * and the ring passes run on every rank at once. */
#ifndef RDA_TEST_RING_H
#define RDA_TEST_RING_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "bwd.h"
#include "fwd.h"
#include "gen.h"
#include "ring.h"
#include "ring_plan.h"
#include "transport.h"

/* Open `ranks` emulator backends (sm_90) into b[0..ranks). On failure prints "<who>: emu backend
 * for rank <p>: <error>" to stderr and returns -1 (a cmocka group setup's failure); else 0. */
int rt_ring_backends_open(rda_backend **b, int ranks, const char *who);
/* Destroy b[0..ranks) (NULL entries skipped) and set them NULL. */
void rt_ring_backends_close(rda_backend **b, int ranks);

/* Copy rank rk's rows between a global [B, N, X] array and its local [B, R, X] one (R = rk->rows,
 * its pieces one after another in ascending order; elements of `elem` bytes): to_local copies
 * global -> local, else local -> global. LSE-shaped arrays (global [B, H, N], local [B, H, R])
 * are the case batch = B * H, x = 1. */
void rt_ring_move_rows(const rda_ring_rank *rk, long long batch, long long n, long long x,
                       size_t elem, void *global, void *local, int to_local);

/* A new device buffer of rk's rows of the global float64 x [B, N, X] as storage bits of dtype,
 * [B, R, X]. */
void *rt_ring_upload_rows(rda_backend *b, const rda_ring_rank *rk, long long batch, long long n,
                          long long x, int dtype, const double *global);
/* A new device fp32 buffer of rk's rows of the global float64 LSE-shaped x [B, H, N] (a dLSE), as
 * [B, H, R]. */
float *rt_ring_upload_lse(rda_backend *b, const rda_ring_rank *rk, long long batch, long long heads,
                          long long n, const double *global);
/* A rank's fp32 device result [B, R, X] into its rows of the global [B, N, X]. */
void rt_ring_gather_rows(rda_backend *b, const rda_ring_rank *rk, long long batch, long long n,
                         long long x, const float *dev, float *global);
/* The same for LSE-shaped results: device [B, H, R] into global [B, H, N]. */
void rt_ring_gather_lse(rda_backend *b, const rda_ring_rank *rk, long long batch, long long heads,
                        long long n, const float *dev, float *global);

/* The memory rk's forward ring holds for a batch of B: its send block and two receive blocks of
 * one batch slice (rda_ring_batch_slice), each rounded up to RDA_RING_BLOCK_ALIGN; for B = 1
 * the plan's rk->peak_bytes. */
uint64_t rt_ring_planned_peak(const rda_ring_rank *rk, long long batch);

/* The world the jobs join: the host transport's, or, when the ranks' emulator backends have
 * asynchronous streams (RDA_EMU_STREAMS=async), the device transport's, whose copies are
 * stream-ordered as a GPU's ranks need them. */
typedef struct rt_ring_world {
  rda_host_world *host;
  rda_device_world *dev;
} rt_ring_world;

/* The world for `ranks` ranks whose backends are like b; one line in err on failure. */
rda_status rt_ring_world_create(rt_ring_world *w, const rda_backend *b, int ranks, double timeout_s,
                                rda_err *err);
void rt_ring_world_destroy(rt_ring_world *w);
/* Join w as rank on backend b (the transport's rules: runtime/transport.h). */
rda_status rt_ring_world_join(rt_ring_world *w, int rank, uint64_t fingerprint, rda_backend *b,
                              rda_transport **t, rda_err *err);

/* Where a rank's thread calls its job's hook. */
typedef enum rt_ring_stage {
  RT_RING_JOINED,   /* after joining the world (j->status says whether it could) */
  RT_RING_FWD_DONE, /* after the forward pass (run or, on an earlier error, not) */
  RT_RING_BWD_DONE  /* after the backward pass (run or not), before the endpoint is destroyed */
} rt_ring_stage;

enum { RT_RING_JOB_MEM = 12 }; /* device buffers one job holds at most */

/* One virtual rank: its rows of the inputs and outputs in its backend's memory, what it did. */
typedef struct rt_ring_job rt_ring_job;
struct rt_ring_job {
  /* The caller's, before rt_ring_job_setup. */
  rda_backend *b;
  const rda_plan_k *pk; /* planned with RDA_PLAN_BACKWARD when backward */
  const rda_ring_plan *rp;
  rt_ring_world *world;
  uint64_t fp; /* rda_ring_fingerprint of the run */
  int rank;
  int backward; /* run the backward pass after the forward, on the forward's O and LSE */
  /* Called on the rank's thread at each stage (NULL: never); at RT_RING_JOINED it may replace
   * *t (with a wrapper that then owns the endpoint: the job destroys *t at the end). */
  void (*hook)(rt_ring_job *j, rt_ring_stage stage, rda_transport **t);
  void *user; /* the hook's */

  /* rt_ring_job_setup's. */
  const rda_ring_rank *rk;
  long long batch, n; /* the global problem */
  rda_fwd_kernels kern;
  rda_fwd_args a;  /* the rank's rows, contiguous: o and lse poisoned */
  rda_bwd_args ba; /* with backward: gradients and the dP workspace poisoned */
  void *ws;        /* the ring's workspace (poisoned; NULL when it needs none) */
  size_t ws_bytes;
  void *mem[RT_RING_JOB_MEM]; /* every device buffer above, for rt_ring_job_free */
  int nmem;

  /* What the passes reported (rt_ring_run). */
  rda_ring_run_stats stats, bstats;
  rda_status status;
  rda_err err;
};

/* Set up job j (the caller's fields filled): load pk's kernels on j->b, upload the rank's rows
 * of the global float64 inputs q [B, N, H, D], k, v [B, N, Hkv, D] and, with backward, dout
 * [B, N, H, D] and dlse [B, H, N] (NULL: no dLSE) in pk's storage dtype, allocate the outputs and
 * workspaces poisoned, and fill j->a (and j->ba). Fails the test `what` ("<what>: rank <p>:
 * ...") when a kernel does not load or the workspace has no size. */
void rt_ring_job_setup(rt_ring_job *j, long long batch, long long n, const double *q,
                       const double *k, const double *v, const double *dout, const double *dlse,
                       const char *what);
/* Free the job's device buffers and unload its kernels (the caller's fields stay). */
void rt_ring_job_free(rt_ring_job *j);

/* Run jobs[0..ranks) at once, a thread each: join the world, the forward ring pass, with
 * backward the backward one; each job's status, err and stats say how it went. */
void rt_ring_run(rt_ring_job *jobs, int ranks);

/* Results gathered in the global layout (fp32, poisoned where no rank wrote). */
typedef struct rt_ring_out {
  float *o, *lse;      /* [B, N, H, D], [B, H, N] */
  float *dq, *dk, *dv; /* [B, N, H, D], [B, N, Hkv, D]; NULL unless allocated with grads */
  size_t no, nlse, nkv;
} rt_ring_out;

void rt_ring_out_alloc(rt_ring_out *out, const rda_config *cfg, long long batch, long long n,
                       int grads);
/* Job j's rows of O and LSE (and of dQ, dK, dV when out has them) into out. */
void rt_ring_out_gather(rt_ring_out *out, const rt_ring_job *j);
void rt_ring_out_free(rt_ring_out *out); /* and sets the pointers NULL */

#endif
