/* transport_host.c — the host virtual-rank transport: P ranks as threads of one process
 * exchanging blocks through host memory. One world (a lock, a condition, per-rank queues of
 * unmatched sends and receives); matching is FIFO per (sender, receiver) and copies directly. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transport.h"

enum { TH_SEND = 0, TH_RECV = 1 };

typedef struct th_op {
  int kind;
  int owner, peer; /* ranks */
  void *buf;       /* the sender's is const in spirit: only read */
  size_t bytes;
  int done;
  struct th_op *next; /* in a world queue while unmatched */
} th_op;

typedef struct th_endpoint {
  rda_transport base;
  struct rda_host_world *world;
  th_op **ops; /* this group's operations (each malloc'd: queue links stay valid) */
  int nops, cap;
  int state;   /* 0 idle, 1 in a group, 2 posted */
  int pending; /* posted and not done */
} th_endpoint;

struct rda_host_world {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int size;
  double timeout_s;
  int aborted;
  char reason[512];
  int joined;
  int *present;
  uint64_t *fingerprint;
  th_endpoint **ep;
  th_op **sendq; /* per receiver: unmatched sends addressed to it, in posting order */
  th_op **recvq; /* per receiver: its unmatched receives, in posting order */
  int bar_count;
  uint64_t bar_gen;
};

static const rda_transport_vtbl th_vtbl;

/* --- helpers (world lock held where noted) --------------------------------------------------- */

static struct timespec th_deadline(double s) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const double whole = (double)(long long)s;
  ts.tv_sec += (time_t)whole;
  ts.tv_nsec += (long)((s - whole) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec += 1, ts.tv_nsec -= 1000000000L;
  return ts;
}

/* Lock held. Returns 1 when the deadline passed. */
static int th_wait_until(rda_host_world *w, const struct timespec *dl) {
  return pthread_cond_timedwait(&w->cv, &w->mu, dl) == ETIMEDOUT;
}

/* Lock held: abort the world with "rank r: why" (first wins) and wake everyone. */
static void th_abort_locked(rda_host_world *w, int rank, const char *why) {
  if (!w->aborted) {
    w->aborted = 1;
    snprintf(w->reason, sizeof w->reason, "rank %d: %s", rank, why);
  }
  pthread_cond_broadcast(&w->cv);
}

static rda_status th_aborted_error(const rda_host_world *w, int rank, rda_err *err) {
  char mine[24];
  snprintf(mine, sizeof mine, "rank %d:", rank);
  if (strncmp(w->reason, mine, strlen(mine)) == 0) /* this rank's own failure */
    return rda_err_set(err, RDA_ERR_NCCL, "%s", w->reason);
  return rda_err_set(err, RDA_ERR_NCCL, "rank %d: the ring was aborted: %s", rank, w->reason);
}

/* Lock held: complete a matched pair (s from its owner to r's owner). */
static void th_complete(rda_host_world *w, th_op *s, th_op *r) {
  if (s->bytes != r->bytes) {
    char why[160];
    snprintf(why, sizeof why, "received %zu bytes from rank %d but expected %zu", s->bytes,
             s->owner, r->bytes);
    th_abort_locked(w, r->owner, why);
    return;
  }
  if (s->bytes > 0 && r->buf != s->buf) memmove(r->buf, s->buf, s->bytes);
  s->done = r->done = 1;
  w->ep[s->owner]->pending--;
  w->ep[r->owner]->pending--;
  pthread_cond_broadcast(&w->cv);
}

/* Lock held: match op against the other queue of the receiver, or queue it. */
static void th_post(rda_host_world *w, th_op *op) {
  const int recver = op->kind == TH_SEND ? op->peer : op->owner;
  const int sender = op->kind == TH_SEND ? op->owner : op->peer;
  th_op **other = op->kind == TH_SEND ? &w->recvq[recver] : &w->sendq[recver];
  for (th_op **pp = other; *pp != NULL; pp = &(*pp)->next) {
    th_op *c = *pp;
    const int c_sender = c->kind == TH_SEND ? c->owner : c->peer;
    if (c_sender != sender) continue;
    *pp = c->next; /* unlink the first match: FIFO per (sender, receiver) */
    c->next = NULL;
    if (op->kind == TH_SEND)
      th_complete(w, op, c);
    else
      th_complete(w, c, op);
    return;
  }
  th_op **mine = op->kind == TH_SEND ? &w->sendq[recver] : &w->recvq[recver];
  while (*mine != NULL) mine = &(*mine)->next;
  op->next = NULL;
  *mine = op;
}

/* Lock held: take every op of ep out of the world queues (after an abort nothing is matched
 * again, but the queues must not point into freed memory). */
static void th_unlink_all(rda_host_world *w, th_endpoint *ep) {
  for (int q = 0; q < w->size; q++) {
    th_op **lists[2] = {&w->sendq[q], &w->recvq[q]};
    for (int l = 0; l < 2; l++)
      for (th_op **pp = lists[l]; *pp != NULL;) {
        if ((*pp)->owner == ep->base.rank)
          *pp = (*pp)->next;
        else
          pp = &(*pp)->next;
      }
  }
}

static void th_free_ops(th_endpoint *ep) {
  for (int q = 0; q < ep->nops; q++) free(ep->ops[q]);
  ep->nops = 0;
}

/* --- the vtable ------------------------------------------------------------------------------ */

static rda_status th_group_start(rda_transport *t, rda_err *err) {
  th_endpoint *ep = (th_endpoint *)t;
  if (ep->state != 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: group_start while a group is %s",
                       t->rank, ep->state == 1 ? "open" : "posted and not waited for");
  pthread_mutex_lock(&ep->world->mu);
  const int aborted = ep->world->aborted;
  rda_status s = aborted ? th_aborted_error(ep->world, t->rank, err) : RDA_OK;
  pthread_mutex_unlock(&ep->world->mu);
  if (s != RDA_OK) return s;
  th_free_ops(ep);
  ep->state = 1;
  return RDA_OK;
}

static rda_status th_add(th_endpoint *ep, int kind, int peer, void *buf, size_t bytes,
                         rda_err *err) {
  if (ep->state != 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: %s outside a group", ep->base.rank,
                       kind == TH_SEND ? "send" : "recv");
  if (ep->nops == ep->cap) {
    const int cap = ep->cap ? 2 * ep->cap : 8;
    th_op **n = realloc(ep->ops, (size_t)cap * sizeof *n);
    if (n == NULL)
      return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "rank %d: out of memory", ep->base.rank);
    ep->ops = n, ep->cap = cap;
  }
  th_op *op = calloc(1, sizeof *op);
  if (op == NULL)
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "rank %d: out of memory", ep->base.rank);
  op->kind = kind, op->owner = ep->base.rank, op->peer = peer, op->buf = buf, op->bytes = bytes;
  ep->ops[ep->nops++] = op;
  return RDA_OK;
}

static rda_status th_send(rda_transport *t, int peer, const void *buf, size_t bytes, rda_err *err) {
  void *b;
  memcpy(&b, &buf, sizeof b); /* only ever read through */
  return th_add((th_endpoint *)t, TH_SEND, peer, b, bytes, err);
}

static rda_status th_recv(rda_transport *t, int peer, void *buf, size_t bytes, rda_err *err) {
  return th_add((th_endpoint *)t, TH_RECV, peer, buf, bytes, err);
}

static rda_status th_group_end(rda_transport *t, rda_err *err) {
  th_endpoint *ep = (th_endpoint *)t;
  rda_host_world *w = ep->world;
  if (ep->state != 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: group_end without group_start",
                       t->rank);
  pthread_mutex_lock(&w->mu);
  rda_status s = RDA_OK;
  if (w->aborted) {
    s = th_aborted_error(w, t->rank, err);
    ep->state = 0;
  } else {
    ep->pending = ep->nops;
    ep->state = 2;
    /* Receives first, then sends: either order is correct (matching is symmetric). */
    for (int q = 0; q < ep->nops && !w->aborted; q++)
      if (ep->ops[q]->kind == TH_RECV) th_post(w, ep->ops[q]);
    for (int q = 0; q < ep->nops && !w->aborted; q++)
      if (ep->ops[q]->kind == TH_SEND) th_post(w, ep->ops[q]);
  }
  pthread_mutex_unlock(&w->mu);
  return s;
}

static rda_status th_wait(rda_transport *t, rda_err *err) {
  th_endpoint *ep = (th_endpoint *)t;
  rda_host_world *w = ep->world;
  if (ep->state != 2)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: wait without a posted group",
                       t->rank);
  const struct timespec dl = th_deadline(t->timeout_s);
  rda_status s = RDA_OK;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    if (w->aborted) {
      s = th_aborted_error(w, t->rank, err);
      break;
    }
    if (ep->pending == 0) break;
    if (th_wait_until(w, &dl) && ep->pending > 0 && !w->aborted) {
      int peer = -1;
      for (int q = 0; q < ep->nops && peer < 0; q++)
        if (!ep->ops[q]->done) peer = ep->ops[q]->peer;
      char why[160];
      snprintf(why, sizeof why, "timed out after %.1f s waiting for rank %d", t->timeout_s, peer);
      th_abort_locked(w, t->rank, why);
    }
  }
  if (s != RDA_OK) th_unlink_all(w, ep);
  pthread_mutex_unlock(&w->mu);
  if (s == RDA_OK)
    for (int q = 0; q < ep->nops; q++) {
      if (ep->ops[q]->kind == TH_SEND)
        t->bytes_sent += ep->ops[q]->bytes;
      else
        t->bytes_received += ep->ops[q]->bytes;
    }
  th_free_ops(ep);
  ep->state = 0;
  return s;
}

static rda_status th_barrier(rda_transport *t, rda_err *err) {
  th_endpoint *ep = (th_endpoint *)t;
  rda_host_world *w = ep->world;
  const struct timespec dl = th_deadline(t->timeout_s);
  rda_status s = RDA_OK;
  pthread_mutex_lock(&w->mu);
  const uint64_t gen = w->bar_gen;
  if (!w->aborted && ++w->bar_count == w->size) {
    w->bar_count = 0;
    w->bar_gen++;
    pthread_cond_broadcast(&w->cv);
  }
  for (;;) {
    if (w->aborted) {
      s = th_aborted_error(w, t->rank, err);
      break;
    }
    if (w->bar_gen != gen) break;
    if (th_wait_until(w, &dl) && w->bar_gen == gen && !w->aborted) {
      char why[160];
      snprintf(why, sizeof why, "timed out after %.1f s in a barrier (%d of %d ranks arrived)",
               t->timeout_s, w->bar_count, w->size);
      th_abort_locked(w, t->rank, why);
    }
  }
  pthread_mutex_unlock(&w->mu);
  return s;
}

static void th_abort(rda_transport *t, const char *reason) {
  th_endpoint *ep = (th_endpoint *)t;
  pthread_mutex_lock(&ep->world->mu);
  th_abort_locked(ep->world, t->rank, reason);
  pthread_mutex_unlock(&ep->world->mu);
}

static void th_destroy(rda_transport *t) {
  th_endpoint *ep = (th_endpoint *)t;
  rda_host_world *w = ep->world;
  pthread_mutex_lock(&w->mu);
  if (ep->state == 2 && ep->pending > 0)
    th_abort_locked(w, t->rank, "left the ring with operations pending");
  th_unlink_all(w, ep);
  w->ep[t->rank] = NULL;
  pthread_mutex_unlock(&w->mu);
  th_free_ops(ep);
  free(ep->ops);
  free(ep);
}

static const rda_transport_vtbl th_vtbl = {
    .name = "host",
    .group_start = th_group_start,
    .send = th_send,
    .recv = th_recv,
    .group_end = th_group_end,
    .wait = th_wait,
    .barrier = th_barrier,
    .abort = th_abort,
    .destroy = th_destroy,
};

/* --- the world ------------------------------------------------------------------------------- */

rda_status rda_host_world_create(int size, double timeout_s, rda_host_world **out, rda_err *err) {
  *out = NULL;
  if (size < 1 || size > 4096)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "host transport: %d ranks: need 1..4096",
                       size);
  if (!(timeout_s > 0.0) || timeout_s > 1e6)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "host transport: timeout %g s: need 0 < timeout <= 1e6", timeout_s);
  rda_host_world *w = calloc(1, sizeof *w);
  if (w == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "host transport: out of memory");
  w->size = size, w->timeout_s = timeout_s;
  w->present = calloc((size_t)size, sizeof *w->present);
  w->fingerprint = calloc((size_t)size, sizeof *w->fingerprint);
  w->ep = calloc((size_t)size, sizeof *w->ep);
  w->sendq = calloc((size_t)size, sizeof *w->sendq);
  w->recvq = calloc((size_t)size, sizeof *w->recvq);
  pthread_condattr_t ca;
  int ok = w->present && w->fingerprint && w->ep && w->sendq && w->recvq;
  if (ok && pthread_mutex_init(&w->mu, NULL) != 0) ok = 0;
  if (ok) {
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_cond_init(&w->cv, &ca) != 0) {
      pthread_mutex_destroy(&w->mu);
      ok = 0;
    }
    pthread_condattr_destroy(&ca);
  }
  if (!ok) {
    free(w->present), free(w->fingerprint), free(w->ep), free(w->sendq), free(w->recvq);
    free(w);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "host transport: out of memory");
  }
  *out = w;
  return RDA_OK;
}

void rda_host_world_destroy(rda_host_world *w) {
  if (w == NULL) return;
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w->present), free(w->fingerprint), free(w->ep), free(w->sendq), free(w->recvq);
  free(w);
}

rda_status rda_host_world_join(rda_host_world *w, int rank, uint64_t fingerprint,
                               rda_transport **out, rda_err *err) {
  *out = NULL;
  if (w == NULL || rank < 0 || rank >= w->size)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "host transport: rank %d of %d", rank,
                       w != NULL ? w->size : 0);
  th_endpoint *ep = calloc(1, sizeof *ep);
  const int oom = ep == NULL;
  pthread_mutex_lock(&w->mu);
  if (oom || w->present[rank]) {
    const char *why = oom ? "out of memory joining the ring" : "joined the ring twice";
    th_abort_locked(w, rank, why);
    pthread_mutex_unlock(&w->mu);
    free(ep);
    return rda_err_set(err, oom ? RDA_ERR_OUT_OF_MEMORY : RDA_ERR_INVALID_ARGUMENT, "rank %d: %s",
                       rank, why);
  }
  ep->base.vt = &th_vtbl, ep->base.rank = rank, ep->base.size = w->size;
  ep->base.timeout_s = w->timeout_s;
  ep->world = w;
  w->present[rank] = 1;
  w->fingerprint[rank] = fingerprint;
  w->ep[rank] = ep;
  w->joined++;
  pthread_cond_broadcast(&w->cv);
  const struct timespec dl = th_deadline(w->timeout_s);
  rda_status s = RDA_OK;
  while (w->joined < w->size && !w->aborted) {
    if (th_wait_until(w, &dl) && w->joined < w->size && !w->aborted) {
      int missing = 0;
      while (missing < w->size && w->present[missing]) missing++;
      char why[160];
      snprintf(why, sizeof why, "timed out after %.1f s waiting for rank %d to join", w->timeout_s,
               missing);
      th_abort_locked(w, rank, why);
    }
  }
  if (w->aborted) {
    s = th_aborted_error(w, rank, err);
  } else {
    /* Every rank compares the same table, so every rank reports the same mismatch. */
    for (int q = 1; q < w->size; q++)
      if (w->fingerprint[q] != w->fingerprint[0]) {
        s = rda_err_set(err, RDA_ERR_NCCL,
                        "rank %d: fingerprint mismatch: rank 0 has 0x%016llx, rank %d has "
                        "0x%016llx (config, N, P, layout, dtype or rda version differ)",
                        rank, (unsigned long long)w->fingerprint[0], q,
                        (unsigned long long)w->fingerprint[q]);
        break;
      }
  }
  if (s != RDA_OK) w->ep[rank] = NULL;
  pthread_mutex_unlock(&w->mu);
  if (s != RDA_OK) {
    free(ep);
    return s;
  }
  *out = &ep->base;
  return RDA_OK;
}
