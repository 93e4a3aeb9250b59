/* ring_trace.h — timelines of ring passes, for finding where a ring's time goes
 * (bench/bench_ring.c --trace, --timeline): marks the ring driver (runtime/ring.c) sets at fixed
 * points of a pass. Off unless the calling thread attached a trace (rda_ring_trace_thread in
 * ring.h); a mark then costs one clock read, and with a device part (rda_ring_trace_dev) one
 * event record on the pass's stream for every mark but WAIT0, so the device timeline shows
 * when the stream reached each point (what the differences mean: ring.h). The public trace
 * types are in ring.h. */
#ifndef RDA_RING_TRACE_H
#define RDA_RING_TRACE_H

#include <stdint.h>

#include "backend.h"

/* The points of a pass, in the order the driver reaches them. Step marks take the virtual
 * step index; the others ignore it. */
typedef enum ring_mark {
  RING_MARK_BEGIN,    /* the schedule begins (after the checks, the init or prep enqueued) */
  RING_MARK_OWN,      /* the own rows' launches were enqueued */
  RING_MARK_WAIT0,    /* step i: its transport wait begins */
  RING_MARK_WAIT1,    /* step i: its transport wait returned (the stream waits for the data) */
  RING_MARK_POSTED,   /* step i: returned gradients added, step i + 1 packed and posted */
  RING_MARK_COMPUTED, /* step i: its launches were enqueued */
  RING_MARK_END       /* the last step's launches were enqueued */
} ring_mark;

/* Record mark m of virtual step i for the calling thread's trace, if any; b is the backend
 * whose current stream runs the pass. */
void ring_trace_mark(rda_backend *b, ring_mark m, int64_t i);

#endif
