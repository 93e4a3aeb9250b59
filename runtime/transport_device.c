/* transport_device.c — the device virtual-rank transport: P ranks as threads of one process on
 * one device, blocks moved device to device. The world (matching, timeouts, abort,
 * fingerprints) is runtime/transport_world.c; this file orders the copies with events:
 *  - group_end records the endpoint's "ready" event on the caller's current stream (sends: the
 *    data is written; receives: the buffer is free);
 *  - whoever matches a pair enqueues, on the receiver's communication stream, waits on both
 *    ready events, the copy, then each side's "copied" event;
 *  - wait blocks the host until every op of the group is matched and enqueued, then makes the
 *    caller's current stream wait on each op's copied event; a wait that fails (an abort, a
 *    timeout) does the same for the ops that were matched. It never synchronizes the device.
 * Every backend call goes through the rank's backend, which makes its CUDA context current on
 * the calling thread (runtime/cuda.c enters the context in every operation). Events of one
 * rank's backend are used on another rank's streams: all backends must be on one device (one
 * CUDA context), as rda_device_world_join requires. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "transport.h"
#include "transport_world.h"

struct rda_device_world {
  tw_world w;
};

typedef struct td_endpoint {
  tw_endpoint tw;
  rda_backend *b;
  void *stream;     /* communication: receives' copies run here */
  void *ev_ready;   /* recorded at group_end on the caller's stream */
  void **ev_copied; /* one per op slot of a group, created as groups grow */
  int ncopied;
} td_endpoint;

/* Lock held, on any rank's thread: enqueue the pair's copy on the receiver's stream. set_stream
 * is thread-local, and the thread's own choice is put back, so this never disturbs the rank
 * whose thread runs it (ranks may share one backend). */
static rda_status td_complete(tw_op *s, tw_op *r, rda_err *err) {
  td_endpoint *re = (td_endpoint *)r->ep;
  rda_backend *b = re->b;
  void *was = b->set_stream(b, re->stream);
  rda_status st = b->stream_wait_event(b, s->ev_ready, err);
  if (st == RDA_OK && r->ev_ready != s->ev_ready) st = b->stream_wait_event(b, r->ev_ready, err);
  if (st == RDA_OK && s->bytes > 0 && r->buf != s->buf)
    st = b->copy_async(b, r->buf, s->buf, s->bytes, err);
  if (st == RDA_OK) st = b->event_record(b, r->ev_copied, err);
  if (st == RDA_OK) st = b->event_record(b, s->ev_copied, err);
  (void)b->set_stream(b, was);
  return st;
}

/* The owner's thread at group_end: events for every op, the ready event recorded. The events
 * are reused group after group: the previous group's were consumed (waits enqueued) before
 * its wait returned, and a later record does not change what an enqueued wait waits for. */
static rda_status td_before_post(tw_endpoint *t, rda_err *err) {
  td_endpoint *ep = (td_endpoint *)t;
  rda_backend *b = ep->b;
  if (t->nops > ep->ncopied) {
    void **n = realloc(ep->ev_copied, (size_t)t->nops * sizeof *n);
    if (n == NULL)
      return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "device transport: out of memory");
    ep->ev_copied = n;
    for (; ep->ncopied < t->nops; ep->ncopied++)
      RDA_TRY(b->event_create(b, &ep->ev_copied[ep->ncopied], err));
  }
  for (int q = 0; q < t->nops; q++) {
    t->ops[q]->ev_ready = ep->ev_ready;
    t->ops[q]->ev_copied = ep->ev_copied[q];
  }
  return b->event_record(b, ep->ev_ready, err);
}

/* The owner's thread once every op is matched: its stream waits for the copies, for every one
 * even after a wait failed to enqueue (the first failure is the result): a copy left unordered
 * could land after the caller, told of the error, reuses the buffer (transport.h). */
static rda_status td_after_wait(tw_endpoint *t, rda_err *err) {
  td_endpoint *ep = (td_endpoint *)t;
  rda_status first = RDA_OK;
  for (int q = 0; q < t->nops; q++) {
    rda_err e = {0};
    const rda_status s = ep->b->stream_wait_event(ep->b, t->ops[q]->ev_copied, &e);
    if (s != RDA_OK && first == RDA_OK) first = s, *err = e;
  }
  return first;
}

/* The owner's thread, a posted group failed: its caller's stream waits for the copies that
 * were enqueued (matched ops), in both directions: a copy into its receive buffers, and a
 * peer's copy reading its send buffers, which the caller may reuse once it has the error. */
static void td_abandoned(tw_endpoint *t) {
  td_endpoint *ep = (td_endpoint *)t;
  rda_err ignored = {0};
  for (int q = 0; q < t->nops; q++)
    if (t->ops[q]->done && t->ops[q]->ev_copied != NULL)
      ep->b->stream_wait_event(ep->b, t->ops[q]->ev_copied, &ignored);
}

/* Wait (up to the timeout) until the copies already queued into this rank's buffers have
 * landed: a failed pass can leave some behind, and once the endpoint is destroyed its caller
 * may reuse those buffers. */
static void td_quiesce(td_endpoint *ep) {
  rda_backend *b = ep->b;
  if (b->event_query == NULL) return;
  rda_err ignored = {0};
  void *was = b->set_stream(b, ep->stream);
  const rda_status s = b->event_record(b, ep->ev_ready, &ignored);
  (void)b->set_stream(b, was);
  if (s != RDA_OK) return;
  struct timespec t0, now, nap = {0, 100000};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int done = 0;
    if (b->event_query(b, ep->ev_ready, &done, &ignored) != RDA_OK || done) return;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const double waited =
        (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
    if (waited > ep->tw.base.timeout_s) {
      rda_log(RDA_LOG_WARN,
              "device transport: rank %d left with copies into its buffers still queued after "
              "%.1f s; they may land after its caller reuses those buffers",
              ep->tw.base.rank, ep->tw.base.timeout_s);
      return;
    }
    nanosleep(&nap, NULL);
  }
}

static void td_fini(tw_endpoint *t) {
  td_endpoint *ep = (td_endpoint *)t;
  rda_backend *b = ep->b;
  if (b == NULL) return;
  if (ep->stream != NULL && ep->ev_ready != NULL) td_quiesce(ep);
  for (int q = 0; q < ep->ncopied; q++) b->event_destroy(b, ep->ev_copied[q]);
  free(ep->ev_copied);
  ep->ev_copied = NULL, ep->ncopied = 0;
  b->event_destroy(b, ep->ev_ready);
  b->stream_destroy(b, ep->stream);
  ep->ev_ready = ep->stream = NULL;
}

static rda_status td_init(tw_endpoint *t, void *arg, rda_err *err) {
  td_endpoint *ep = (td_endpoint *)t;
  rda_backend *b = arg;
  /* Checked here rather than before joining: the failure aborts the world, so the other
   * ranks fail at once instead of waiting for this one to time out. */
  if (b == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "device transport: no backend");
  if (b->copy_async == NULL || b->event_create == NULL || b->event_record == NULL ||
      b->stream_wait_event == NULL || b->stream_create == NULL || b->set_stream == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "device transport: the %s backend has no stream-ordered copies and events",
                       b->name);
  ep->b = b;
  RDA_TRY(b->stream_create(b, &ep->stream, err));
  return b->event_create(b, &ep->ev_ready, err);
}

static const tw_hooks td_hooks = {
    .complete = td_complete,
    .before_post = td_before_post,
    .after_wait = td_after_wait,
    .abandoned = td_abandoned,
    .fini = td_fini,
};

rda_status rda_device_world_create(int size, double timeout_s, rda_device_world **out,
                                   rda_err *err) {
  tw_world *w = NULL;
  const rda_status s = tw_world_create(sizeof **out, "device transport", "device", &td_hooks, size,
                                       timeout_s, &w, err);
  *out = (rda_device_world *)(void *)w; /* its first member */
  return s;
}

void rda_device_world_destroy(rda_device_world *w) {
  tw_world_destroy(w != NULL ? &w->w : NULL);
}

rda_status rda_device_world_join(rda_device_world *w, int rank, uint64_t fingerprint,
                                 rda_backend *b, rda_transport **out, rda_err *err) {
  *out = NULL;
  if (w == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "device transport: rank %d of no world",
                       rank);
  tw_endpoint *ep = NULL;
  RDA_TRY(tw_join(&w->w, rank, fingerprint, sizeof(td_endpoint), td_init, b, &ep, err));
  *out = &ep->base;
  return RDA_OK;
}
