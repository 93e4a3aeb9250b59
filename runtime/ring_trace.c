/* ring_trace.c — the marks of ring_trace.h into the calling thread's rda_ring_trace. */
#include "ring_trace.h"

#include <stddef.h>
#include <time.h>

#include "ring.h"

static _Thread_local rda_ring_trace *ring_trace_;

void rda_ring_trace_thread(rda_ring_trace *t) {
  ring_trace_ = t;
}

static double ring_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The trace entry of virtual step i, or NULL past the trace's capacity. */
static rda_ring_trace_step *ring_trace_at(rda_ring_trace *t, int64_t i) {
  if (i + 1 > t->count) t->count = (int)(i + 1);
  return i < t->cap ? &t->steps[i] : NULL;
}

void ring_trace_mark(rda_backend *b, ring_mark m, int64_t i) {
  (void)b;
  rda_ring_trace *t = ring_trace_;
  if (t == NULL) return;
  const double now = ring_now();
  rda_ring_trace_step *s = NULL;
  switch (m) {
    case RING_MARK_BEGIN:
      t->count = 0;
      t->begin = now;
      return;
    case RING_MARK_OWN:
      t->own = now;
      return;
    case RING_MARK_END:
      t->end = now;
      return;
    default:
      break;
  }
  if ((s = ring_trace_at(t, i)) == NULL) return;
  if (m == RING_MARK_WAIT0) s->wait0 = now;
  if (m == RING_MARK_WAIT1) s->wait1 = now;
  if (m == RING_MARK_POSTED) s->posted = now;
  if (m == RING_MARK_COMPUTED) s->computed = now;
}
