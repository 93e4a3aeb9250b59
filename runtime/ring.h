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

/* The device side of a trace: timed backend events (event_create_timed), made before the pass
 * (nothing is allocated inside it) and recorded by the pass on its stream at each mark, so each
 * one's time is when the DEVICE got there. The marks follow the driver's enqueue order
 * (runtime/ring_trace.h), so on the device:
 *   begin            the init (forward) or prep (backward) finished;
 *   own              step 0 packed and the own rows computed (own is marked after the own
 *                    launches were enqueued, so it is when they finished): own - begin;
 *   arrived(i)       marked after the stream-wait on step i's copies was enqueued (WAIT1): the
 *                    stream had finished everything before and step i's data had landed, so
 *                    arrived(i) - computed(i - 1) (own for i = 0) is the time the stream
 *                    stalled waiting for the data of step i (0 when it was there already);
 *   posted(i)        returned gradients added, step i + 1 packed: posted(i) - arrived(i);
 *   computed(i)      step i's compute done: computed(i) - posted(i);
 *   end              = computed of the last step (nothing is enqueued between them).
 * Times need every event complete (after a synchronization) and a reference event recorded
 * before the pass (rda_ring_trace_dev_times). */
typedef struct rda_ring_trace_dev_step {
  void *arrived, *posted, *computed; /* timed events */
} rda_ring_trace_dev_step;

typedef struct rda_ring_trace_dev {
  rda_backend *b;                 /* whose events; the pass runs on it */
  int cap;                        /* entries of steps (steps past it are counted, not timed) */
  rda_ring_trace_dev_step *steps; /* owned: rda_ring_trace_dev_create */
  void *begin, *own, *end;        /* timed events */
  int count;                      /* virtual steps the last pass marked */
  unsigned marked;                /* of the last pass: bit 0 begin, 1 own, 2 end recorded */
  rda_status status;              /* the last pass's first failed record, or RDA_OK */
  rda_err err;                    /* its message */
} rda_ring_trace_dev;

/* A device timeline in milliseconds after a reference event: plain data, which outlives the
 * backend (rda_ring_trace_dev_times). */
typedef struct rda_ring_timeline_step {
  double arrived, posted, computed;
} rda_ring_timeline_step;

typedef struct rda_ring_timeline {
  int cap;                       /* entries of steps */
  int count;                     /* virtual steps of the pass (the first min(count, cap) kept) */
  rda_ring_timeline_step *steps; /* owned by the caller */
  double begin, own, end;
} rda_ring_timeline;

typedef struct rda_ring_trace {
  int cap;                    /* entries of steps (0: no host steps) */
  int count;                  /* virtual steps of the pass (only the first cap are kept) */
  rda_ring_trace_step *steps; /* owned by the caller */
  double begin;               /* the pass's schedule began (after its checks) */
  double own;                 /* the own rows' launches were enqueued */
  double end;                 /* the last step's launches were enqueued */
  double synced;              /* not set by the pass: for the caller (device synchronized) */
  rda_ring_trace_dev *dev;    /* or NULL: host times only */
} rda_ring_trace;

/* Record the passes the calling thread runs into t (NULL: stop recording). */
void rda_ring_trace_thread(rda_ring_trace *t);

/* The timed events of a device trace of up to cap virtual steps on b (which must have
 * event_create_timed and event_elapsed_ms): 3 + 3 * cap events. On failure nothing is left
 * to destroy. */
rda_status rda_ring_trace_dev_create(rda_backend *b, int cap, rda_ring_trace_dev *d,
                                     rda_err *err);
/* Destroys the events (before d->b is destroyed); accepts a zeroed or destroyed d. */
void rda_ring_trace_dev_destroy(rda_ring_trace_dev *d);
/* The times of d's last pass in ms after `ref`, a timed event recorded before the pass on the
 * same device (cuda: any backend of the same GPU, whose backends share one context), into out
 * (out->cap and out->steps the caller's). Every event must be complete (call after a
 * synchronization). Fails with the pass's first failed record, when a mark was never recorded,
 * or with the timing call's error. */
rda_status rda_ring_trace_dev_times(const rda_ring_trace_dev *d, void *ref, rda_ring_timeline *out,
                                    rda_err *err);

/* Backend memory the ring itself needs on `rank` for `batch`: the packed send block, two
 * receive blocks and, for the backward pass, two fp32 gradient blocks and two fp32 returned-
 * gradient blocks (each piece 256-byte aligned), each sized for the largest round
 * (rda_ring_steps_blocks). O(N/P): a round is at most RDA_RING_BUNDLE_BYTES per batch element
 * (or one class's block), never the sequence. This is stats->peak_bytes. */
size_t rda_ring_workspace_bytes(const rda_plan_k *pk, const rda_ring_plan *rp, int rank,
                                long long batch, int backward);

/* A pass holds at most rda_ring_batch_slice() batch entries (a launch per received block takes
 * the slice whole: the grid's z dimension, RDA_MAX_BATCH_PER_LAUNCH); a larger batch runs one
 * pass per slice, reusing the ring's workspace (rda_ring_workspace_bytes sizes it for one
 * slice), its counters summed and its peak one slice's. rda_ring_set_batch_slice lowers the
 * slice (1 .. RDA_MAX_BATCH_PER_LAUNCH; anything else restores that), process-wide: tests use
 * it to run several slices with a small batch, which the launch limit's 65536 entries would
 * make too slow on the emulator. Set it only while no ring runs. */
void rda_ring_set_batch_slice(long long most);
long long rda_ring_batch_slice(void);

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

/* The last agreement of a ring call, or the only one of a call that failed before its pass
 * began: every rank gathers one word saying whether it failed (mine). A rank that failed gets
 * mine back, err untouched; the others, if any rank failed, RDA_ERR_NCCL naming the first such
 * rank and its status ("the ring was aborted: rank 3 failed <where> (...)"), at once, where an
 * abort would reach them over NCCL only by their timeout. Then the caller aborts the transport
 * on failure, as ever. A rank that fails before its pass calls this in place of the pass (its
 * word meets the pass's agreement on the other ranks, which says "failed before the ring
 * forward pass"); where is then unused. NULL t returns mine. */
rda_status rda_ring_settle(rda_transport *t, rda_status mine, const char *where, rda_err *err);

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
