/* ring_trace.c — the marks of ring_trace.h into the calling thread's rda_ring_trace: host clock
 * times, and with a device part, timed events recorded on the pass's stream. */
#include "ring_trace.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
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

/* Record the device event of mark m on b's current stream. A failure is kept for
 * rda_ring_trace_dev_times (the mark cannot fail the pass); later marks are then skipped. */
static void ring_trace_dev_mark(rda_ring_trace_dev *d, rda_backend *b, ring_mark m, int64_t i) {
  if (m == RING_MARK_BEGIN) {
    d->count = 0;
    d->marked = 0;
    d->status = RDA_OK;
    rda_err_clear(&d->err);
  }
  if (d->status != RDA_OK) return;
  void *ev = NULL;
  unsigned bit = 0;
  switch (m) {
    case RING_MARK_BEGIN:
      ev = d->begin, bit = 1u;
      break;
    case RING_MARK_OWN:
      ev = d->own, bit = 2u;
      break;
    case RING_MARK_END:
      ev = d->end, bit = 4u;
      break;
    case RING_MARK_WAIT0:
      return; /* the host's wait: nothing on the stream */
    default:
      if (i + 1 > d->count) d->count = (int)(i + 1);
      if (i >= d->cap) return;
      ev = m == RING_MARK_WAIT1    ? d->steps[i].arrived
           : m == RING_MARK_POSTED ? d->steps[i].posted
                                   : d->steps[i].computed;
      break;
  }
  if (b != d->b) {
    d->status = rda_err_set(&d->err, RDA_ERR_INVALID_ARGUMENT,
                            "ring trace: the pass runs on another backend than its events'");
    return;
  }
  d->status = b->event_record(b, ev, &d->err);
  if (d->status == RDA_OK) d->marked |= bit;
}

void ring_trace_mark(rda_backend *b, ring_mark m, int64_t i) {
  rda_ring_trace *t = ring_trace_;
  if (t == NULL) return;
  const double now = ring_now();
  if (t->dev != NULL) ring_trace_dev_mark(t->dev, b, m, i);
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

rda_status rda_ring_trace_dev_create(rda_backend *b, int cap, rda_ring_trace_dev *d,
                                     rda_err *err) {
  if (d == NULL || b == NULL || cap < 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "ring trace: a NULL argument or cap < 0");
  memset(d, 0, sizeof *d);
  if (b->event_create_timed == NULL || b->event_elapsed_ms == NULL || b->event_record == NULL)
    return rda_err_set(err, RDA_ERR_UNSUPPORTED, "ring trace: the %s backend has no timed events",
                       b->name);
  d->b = b;
  if (cap > 0 && (d->steps = calloc((size_t)cap, sizeof *d->steps)) == NULL)
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring trace: out of memory for %d steps", cap);
  d->cap = cap;
  rda_status s = RDA_OK;
  void **fixed[3] = {&d->begin, &d->own, &d->end};
  for (int k = 0; k < 3 && s == RDA_OK; ++k) s = b->event_create_timed(b, fixed[k], err);
  for (int i = 0; i < cap && s == RDA_OK; ++i) {
    rda_ring_trace_dev_step *st = &d->steps[i];
    s = b->event_create_timed(b, &st->arrived, err);
    if (s == RDA_OK) s = b->event_create_timed(b, &st->posted, err);
    if (s == RDA_OK) s = b->event_create_timed(b, &st->computed, err);
  }
  if (s != RDA_OK) rda_ring_trace_dev_destroy(d);
  return s;
}

void rda_ring_trace_dev_destroy(rda_ring_trace_dev *d) {
  if (d == NULL || d->b == NULL) return;
  rda_backend *b = d->b;
  b->event_destroy(b, d->begin);
  b->event_destroy(b, d->own);
  b->event_destroy(b, d->end);
  for (int i = 0; d->steps != NULL && i < d->cap; ++i) {
    b->event_destroy(b, d->steps[i].arrived);
    b->event_destroy(b, d->steps[i].posted);
    b->event_destroy(b, d->steps[i].computed);
  }
  free(d->steps);
  memset(d, 0, sizeof *d);
}

static rda_status ring_trace_ms(const rda_ring_trace_dev *d, void *ref, void *ev, double *ms,
                                rda_err *err) {
  float f = 0.0f;
  RDA_TRY(d->b->event_elapsed_ms(d->b, ref, ev, &f, err));
  *ms = (double)f;
  return RDA_OK;
}

rda_status rda_ring_trace_dev_times(const rda_ring_trace_dev *d, void *ref, rda_ring_timeline *out,
                                    rda_err *err) {
  if (d == NULL || d->b == NULL || ref == NULL || out == NULL || (out->cap > 0 && !out->steps))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "ring timeline: a NULL argument");
  if (d->status != RDA_OK)
    return rda_err_set(err, d->status, "ring timeline: a mark failed: %s", d->err.msg);
  if (d->marked != 7u)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "ring timeline: the pass did not record its begin, own and end marks "
                       "(no traced pass, or it failed)");
  out->count = d->count;
  RDA_TRY(ring_trace_ms(d, ref, d->begin, &out->begin, err));
  RDA_TRY(ring_trace_ms(d, ref, d->own, &out->own, err));
  RDA_TRY(ring_trace_ms(d, ref, d->end, &out->end, err));
  for (int i = 0; i < d->count && i < d->cap && i < out->cap; ++i) {
    const rda_ring_trace_dev_step *e = &d->steps[i];
    rda_ring_timeline_step *o = &out->steps[i];
    RDA_TRY(ring_trace_ms(d, ref, e->arrived, &o->arrived, err));
    RDA_TRY(ring_trace_ms(d, ref, e->posted, &o->posted, err));
    RDA_TRY(ring_trace_ms(d, ref, e->computed, &o->computed, err));
  }
  return RDA_OK;
}
