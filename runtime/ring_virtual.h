/* ring_virtual.h — a whole ring of P virtual ranks in one process, each a thread with its own
 * backend and only its own rows: the emulator over the host transport, or one GPU over the
 * device transport. Used by `rdagen run --ranks P` and by bench/bench_ring.c: it uploads each
 * rank's rows of global inputs, runs the ring passes and gathers the results back. */
#ifndef RDA_RING_VIRTUAL_H
#define RDA_RING_VIRTUAL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "gen.h"
#include "ring.h"

typedef struct rda_ring_virtual {
  const char *backend; /* "auto", "cuda" or "emu" */
  int ranks, layout;
  const rda_config *cfg;
  rda_gen *g;
  long long batch, n;
  const uint16_t *q, *k, *v; /* global inputs, storage dtype */
  const uint16_t *dout;      /* dO, or NULL for the forward pass only */
  float *o, *lse;            /* global results [B, N, H, D], [B, H, N] */
  float *dq, *dk, *dv;       /* with dout: [B, N, H, D], [B, N, Hkv, D] x 2 */
  rda_ring_run_stats *stats; /* `ranks` entries (both passes: bytes summed, the larger peak;
                                the stats of the last run when iters > 0), or NULL */
  char *why;                 /* receives which backend ran and why (why_len bytes), or NULL */
  size_t why_len;
  /* Timing (bench): iters > 0 runs the passes `iters` more times after the first, each
   * between two barriers of all ranks and ended by a device synchronization, and stores the
   * mean wall seconds per pass in fwd_s and bwd_s. */
  int iters;
  double fwd_s, bwd_s;
  /* With iters > 0: `ranks` traces (their steps arrays the caller's) of the last timed forward
   * pass, with synced set when the rank's device synchronization returned; or NULL. */
  rda_ring_trace *traces;
  /* Device timelines (bench --timeline), or NULL: after the other passes, one more forward
   * pass (and with dout one more backward pass, when timeline_bwd is set) with every rank's
   * marks recorded as timed events on its stream (rda_ring_trace_dev in ring.h). Entry p gets
   * rank p's times in ms after one reference event, which rank 0 records on its stream after
   * every rank's device synchronized and before any rank starts the pass, so the ranks line up.
   * `ranks` entries each, their cap and steps the caller's (steps past a cap are counted, not
   * kept). The emulator gives host times of its synchronous work. */
  rda_ring_timeline *timeline_fwd, *timeline_bwd;
} rda_ring_virtual;

/* Run it. Errors: one line in err (the first failing rank's cause, not the others' aborts). */
rda_status rda_ring_virtual_run(rda_ring_virtual *job, rda_err *err);

#endif
