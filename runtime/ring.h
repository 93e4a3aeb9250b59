/* ring.h — the ring forward pass of one rank: its own rows of Q/K/V, the rda_ring_plan's steps
 * over a transport endpoint (packed dilated K/V blocks out, received blocks in), compute on each
 * block with the forward kernel on sub-ranges, partial results merged by log-sum-exp in fp32. */
#ifndef RDA_RING_H
#define RDA_RING_H

#include <stdint.h>

#include "backend.h"
#include "bwd.h"
#include "fwd.h"
#include "gen.h"
#include "ring_plan.h"
#include "transport.h"

/* What one rank's ring did. */
typedef struct rda_ring_run_stats {
  int64_t rows;            /* rows this rank owns */
  uint64_t bytes_sent;     /* bytes its sends delivered (plan bytes times the batch) */
  uint64_t bytes_received; /* bytes its receives got */
  uint64_t peak_bytes;     /* most the ring itself held at once: send, receive and device blocks */
} rda_ring_run_stats;

/* A host-side timeline of one pass of one rank, for finding where a ring's time goes
 * (bench/bench_ring.c --trace). Times are CLOCK_MONOTONIC seconds, so the ranks' timelines
 * line up. */
typedef struct rda_ring_trace_step {
  double wait0, wait1; /* the step's transport wait began, ended (equal when nothing to wait) */
  double posted;       /* the next step was posted (packed, sends and receives enqueued) */
  double computed;     /* this step's launches were enqueued */
} rda_ring_trace_step;

typedef struct rda_ring_trace {
  int cap;                    /* entries of steps */
  int count;                  /* virtual steps of the pass (only the first cap are kept) */
  rda_ring_trace_step *steps; /* owned by the caller */
  double begin;               /* the pass's schedule began (after its checks) */
  double own;                 /* the own rows' launches were enqueued */
  double end;                 /* the last step's launches were enqueued */
  double synced;              /* not set by the pass: for the caller (device synchronized) */
} rda_ring_trace;

/* Record the passes the calling thread runs into t (NULL: stop recording). */
void rda_ring_trace_thread(rda_ring_trace *t);

/* Backend memory the ring itself needs on `rank` for `batch`: the packed send block, two
 * receive blocks and, for the backward pass, two fp32 gradient blocks and two fp32 returned-
 * gradient blocks (each piece 256-byte aligned). O(N/P): the largest single transfer, never the
 * sequence. This is stats->peak_bytes. */
size_t rda_ring_workspace_bytes(const rda_plan_k *pk, const rda_ring_plan *rp, int rank,
                                long long batch, int backward);

/* The forward pass of `rank` over the transport endpoint t (t->rank == rank). a holds only this
 * rank's rows: a->n must equal the rank's row count; local row i is the i-th owned global row
 * in ascending order (zigzag: chunk rank, then chunk 2P-1-rank). o and lse (fp32) receive the
 * rank's rows of the single-device result. workspace: rda_ring_workspace_bytes(..., 0) bytes of
 * backend memory (or more). The host transport needs host memory (the emulator backend). k
 * holds pk's loaded kernels. stats may be NULL. Launches go to the backend's current stream;
 * the host is never synchronized with the device inside the loop (only the transport's own
 * matching). On a failure the transport is aborted, so the other ranks fail instead of
 * waiting. */
rda_status rda_ring_fwd_run(rda_backend *b, const rda_plan_k *pk, const rda_fwd_kernels *k,
                            const rda_ring_plan *rp, int rank, rda_transport *t,
                            const rda_fwd_args *a, void *workspace, size_t workspace_bytes,
                            rda_ring_run_stats *stats, rda_err *err);

/* The backward pass of `rank`: a as for rda_bwd_run over the rank's rows (a->n = its rows,
 * a->workspace = rda_bwd_workspace_bytes(pk, batch, rows) for Dp; o and lse the ring
 * forward's). dq (local, fp32) gets the rank's rows of the single-device dQ; dk, dv (fp32) the
 * rank's rows of dK, dV, including the contributions other ranks computed for these rows and
 * returned (fp32) over the transport. Deterministic for a fixed P and layout.
 * workspace: rda_ring_workspace_bytes(..., 1) bytes. pk must be planned with the backward. */
rda_status rda_ring_bwd_run(rda_backend *b, const rda_plan_k *pk, const rda_fwd_kernels *k,
                             const rda_ring_plan *rp, int rank, rda_transport *t,
                             const rda_bwd_args *a, void *workspace, size_t workspace_bytes,
                             rda_ring_run_stats *stats, rda_err *err);

#endif
