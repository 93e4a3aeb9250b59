/* transport_world.c — the virtual-rank world the host and device transports share: P ranks as
 * threads of one process, one lock and condition, per-receiver queues of unmatched operations,
 * FIFO matching per (sender, receiver); the transport's hooks move the bytes. */
#include "transport_world.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --- helpers (world lock held where noted) --------------------------------------------------- */

static struct timespec tw_deadline(double s) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const double whole = (double)(long long)s;
  ts.tv_sec += (time_t)whole;
  ts.tv_nsec += (long)((s - whole) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec += 1, ts.tv_nsec -= 1000000000L;
  return ts;
}

/* Lock held. Returns 1 when the deadline passed. */
static int tw_wait_until(tw_world *w, const struct timespec *dl) {
  return pthread_cond_timedwait(&w->cv, &w->mu, dl) == ETIMEDOUT;
}

/* 1 when a message starts with "rank r:" (it already says whose it is). */
static int tw_names_rank(const char *msg, int rank) {
  char mine[24];
  const int n = snprintf(mine, sizeof mine, "rank %d:", rank);
  return strncmp(msg, mine, (size_t)n) == 0;
}

/* Lock held: abort the world with "rank r: why" (first wins; a why that names rank r first
 * already keeps its own words) and wake everyone. */
static void tw_abort_locked(tw_world *w, int rank, const char *why) {
  if (!w->aborted) {
    w->aborted = 1;
    if (tw_names_rank(why, rank))
      snprintf(w->reason, sizeof w->reason, "%.500s", why);
    else
      snprintf(w->reason, sizeof w->reason, "rank %d: %.480s", rank, why);
  }
  pthread_cond_broadcast(&w->cv);
}

static rda_status tw_aborted_error(const tw_world *w, int rank, rda_err *err) {
  if (tw_names_rank(w->reason, rank)) /* this rank's own failure */
    return rda_err_set(err, RDA_ERR_NCCL, "%s", w->reason);
  return rda_err_set(err, RDA_ERR_NCCL, "rank %d: the ring was aborted: %s", rank, w->reason);
}

/* Lock held: abort the world in the name of a rank that left (destroyed its endpoint) while
 * still needed; 1 when it did. */
static int tw_departed(tw_world *w, int rank) {
  if (rank < 0 || !w->left[rank]) return 0;
  tw_abort_locked(w, rank, "left the ring (its endpoint was destroyed) while still needed");
  return 1;
}

/* Without the lock: abort the world with a hook's failure and return it as this rank's error. */
static rda_status tw_hook_failed(tw_world *w, int rank, const rda_err *why, rda_err *err) {
  pthread_mutex_lock(&w->mu);
  tw_abort_locked(w, rank, why->msg);
  const rda_status s = tw_aborted_error(w, rank, err);
  pthread_mutex_unlock(&w->mu);
  return s;
}

/* Lock held: complete a matched pair (s from its owner to r's owner). */
static void tw_complete(tw_world *w, tw_op *s, tw_op *r) {
  if (s->bytes != r->bytes) {
    char why[160];
    snprintf(why, sizeof why, "received %zu bytes from rank %d but expected %zu", s->bytes,
             s->owner, r->bytes);
    tw_abort_locked(w, r->owner, why);
    return;
  }
  rda_err e = {0};
  if (w->hooks->complete(s, r, &e) != RDA_OK) {
    tw_abort_locked(w, r->owner, e.msg);
    return;
  }
  s->done = r->done = 1;
  w->ep[s->owner]->pending--;
  w->ep[r->owner]->pending--;
  pthread_cond_broadcast(&w->cv);
}

/* Lock held: match op against the other queue of the receiver, or queue it. */
static void tw_post(tw_world *w, tw_op *op) {
  const int recver = op->kind == TW_SEND ? op->peer : op->owner;
  const int sender = op->kind == TW_SEND ? op->owner : op->peer;
  tw_op **other = op->kind == TW_SEND ? &w->recvq[recver] : &w->sendq[recver];
  for (tw_op **pp = other; *pp != NULL; pp = &(*pp)->next) {
    tw_op *c = *pp;
    const int c_sender = c->kind == TW_SEND ? c->owner : c->peer;
    if (c_sender != sender) continue;
    *pp = c->next; /* unlink the first match: FIFO per (sender, receiver) */
    c->next = NULL;
    if (op->kind == TW_SEND)
      tw_complete(w, op, c);
    else
      tw_complete(w, c, op);
    return;
  }
  tw_op **mine = op->kind == TW_SEND ? &w->sendq[recver] : &w->recvq[recver];
  while (*mine != NULL) mine = &(*mine)->next;
  op->next = NULL;
  *mine = op;
}

/* Lock held: take every op of ep out of the world queues (after an abort nothing is matched
 * again, but the queues must not point into freed memory). */
static void tw_unlink_all(tw_world *w, tw_endpoint *ep) {
  for (int q = 0; q < w->size; q++) {
    tw_op **lists[2] = {&w->sendq[q], &w->recvq[q]};
    for (int l = 0; l < 2; l++)
      for (tw_op **pp = lists[l]; *pp != NULL;) {
        if ((*pp)->owner == ep->base.rank)
          *pp = (*pp)->next;
        else
          pp = &(*pp)->next;
      }
  }
}

static void tw_free_ops(tw_endpoint *ep) {
  for (int q = 0; q < ep->nops; q++) free(ep->ops[q]);
  ep->nops = 0;
}

/* --- the vtable ------------------------------------------------------------------------------ */

rda_status tw_group_start(rda_transport *t, rda_err *err) {
  tw_endpoint *ep = (tw_endpoint *)t;
  if (ep->state != 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: group_start while a group is %s",
                       t->rank, ep->state == 1 ? "open" : "posted and not waited for");
  pthread_mutex_lock(&ep->world->mu);
  const int aborted = ep->world->aborted;
  rda_status s = aborted ? tw_aborted_error(ep->world, t->rank, err) : RDA_OK;
  pthread_mutex_unlock(&ep->world->mu);
  if (s != RDA_OK) return s;
  tw_free_ops(ep);
  ep->state = 1;
  return RDA_OK;
}

static rda_status tw_add(tw_endpoint *ep, int kind, int peer, void *buf, size_t bytes,
                         rda_err *err) {
  if (ep->state != 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: %s outside a group", ep->base.rank,
                       kind == TW_SEND ? "send" : "recv");
  if (ep->nops == ep->cap) {
    const int cap = ep->cap ? 2 * ep->cap : 8;
    tw_op **n = realloc(ep->ops, (size_t)cap * sizeof *n);
    if (n == NULL)
      return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "rank %d: out of memory", ep->base.rank);
    ep->ops = n, ep->cap = cap;
  }
  tw_op *op = calloc(1, sizeof *op);
  if (op == NULL)
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "rank %d: out of memory", ep->base.rank);
  op->kind = kind, op->owner = ep->base.rank, op->peer = peer, op->buf = buf, op->bytes = bytes;
  op->ep = ep;
  ep->ops[ep->nops++] = op;
  return RDA_OK;
}

rda_status tw_send(rda_transport *t, int peer, const void *buf, size_t bytes, rda_err *err) {
  void *b;
  memcpy(&b, &buf, sizeof b); /* only ever read through */
  return tw_add((tw_endpoint *)t, TW_SEND, peer, b, bytes, err);
}

rda_status tw_recv(rda_transport *t, int peer, void *buf, size_t bytes, rda_err *err) {
  return tw_add((tw_endpoint *)t, TW_RECV, peer, buf, bytes, err);
}

rda_status tw_group_end(rda_transport *t, rda_err *err) {
  tw_endpoint *ep = (tw_endpoint *)t;
  tw_world *w = ep->world;
  if (ep->state != 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: group_end without group_start",
                       t->rank);
  if (w->hooks->before_post != NULL) {
    rda_err why = {0};
    if (w->hooks->before_post(ep, &why) != RDA_OK) {
      ep->state = 0;
      return tw_hook_failed(w, t->rank, &why, err);
    }
  }
  pthread_mutex_lock(&w->mu);
  rda_status s = RDA_OK;
  if (w->aborted) {
    s = tw_aborted_error(w, t->rank, err);
    ep->state = 0;
  } else {
    ep->pending = ep->nops;
    ep->state = 2;
    /* Receives first, then sends: either order is correct (matching is symmetric). */
    for (int q = 0; q < ep->nops && !w->aborted; q++)
      if (ep->ops[q]->kind == TW_RECV) tw_post(w, ep->ops[q]);
    for (int q = 0; q < ep->nops && !w->aborted; q++)
      if (ep->ops[q]->kind == TW_SEND) tw_post(w, ep->ops[q]);
  }
  pthread_mutex_unlock(&w->mu);
  return s;
}

rda_status tw_wait(rda_transport *t, rda_err *err) {
  tw_endpoint *ep = (tw_endpoint *)t;
  tw_world *w = ep->world;
  if (ep->state != 2)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: wait without a posted group",
                       t->rank);
  const struct timespec dl = tw_deadline(t->timeout_s);
  rda_status s = RDA_OK;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    if (w->aborted) {
      s = tw_aborted_error(w, t->rank, err);
      break;
    }
    if (ep->pending == 0) break;
    int gone = 0;
    for (int q = 0; q < ep->nops && !gone; q++)
      if (!ep->ops[q]->done) gone = tw_departed(w, ep->ops[q]->peer);
    if (gone) continue; /* aborted: said above */
    if (tw_wait_until(w, &dl) && ep->pending > 0 && !w->aborted) {
      int peer = -1;
      for (int q = 0; q < ep->nops && peer < 0; q++)
        if (!ep->ops[q]->done) peer = ep->ops[q]->peer;
      char why[160];
      snprintf(why, sizeof why, "timed out after %.1f s waiting for rank %d", t->timeout_s, peer);
      tw_abort_locked(w, t->rank, why);
    }
  }
  if (s != RDA_OK) tw_unlink_all(w, ep); /* what is not matched now never will be */
  pthread_mutex_unlock(&w->mu);
  if (s != RDA_OK && w->hooks->abandoned != NULL) w->hooks->abandoned(ep);
  if (s == RDA_OK && w->hooks->after_wait != NULL) {
    rda_err why = {0};
    if (w->hooks->after_wait(ep, &why) != RDA_OK) s = tw_hook_failed(w, t->rank, &why, err);
  }
  if (s == RDA_OK)
    for (int q = 0; q < ep->nops; q++) {
      if (ep->ops[q]->kind == TW_SEND)
        t->bytes_sent += ep->ops[q]->bytes;
      else
        t->bytes_received += ep->ops[q]->bytes;
    }
  tw_free_ops(ep);
  ep->state = 0;
  return s;
}

/* A barrier that carries one value per rank (all NULL: this rank only gives its own).
 * Generation g's values live in half g & 1 of bar_vals: a rank can write generation g + 2's
 * only after g + 1 completed, and every rank copied g's values (under the lock, as it saw g
 * complete) before it arrived at g + 1. */
rda_status tw_gather8(rda_transport *t, uint64_t mine, uint64_t *all, rda_err *err) {
  tw_endpoint *ep = (tw_endpoint *)t;
  tw_world *w = ep->world;
  const struct timespec dl = tw_deadline(t->timeout_s);
  rda_status s = RDA_OK;
  pthread_mutex_lock(&w->mu);
  const uint64_t gen = w->bar_gen;
  uint64_t *vals = w->bar_vals + (size_t)(gen & 1u) * (size_t)w->size;
  vals[t->rank] = mine;
  w->bar_at[t->rank] = gen + 1;
  if (!w->aborted && ++w->bar_count == w->size) {
    w->bar_count = 0;
    w->bar_gen++;
    pthread_cond_broadcast(&w->cv);
  }
  for (;;) {
    /* Complete first: every rank arrived, so this rank's gather succeeded even if one of the
     * others, faster to wake, has aborted the world since (over what it gathered, say). */
    if (w->bar_gen != gen) {
      if (all != NULL) memcpy(all, vals, (size_t)w->size * sizeof *all);
      break;
    }
    if (w->aborted) {
      s = tw_aborted_error(w, t->rank, err);
      break;
    }
    int gone = 0;
    for (int q = 0; q < w->size && !gone; q++)
      if (w->bar_at[q] != gen + 1) gone = tw_departed(w, q);
    if (gone) continue;
    if (tw_wait_until(w, &dl) && w->bar_gen == gen && !w->aborted) {
      int missing = 0;
      while (missing < w->size && w->bar_at[missing] == gen + 1) missing++;
      char why[192];
      snprintf(why, sizeof why,
               "timed out after %.1f s in a barrier (%d of %d ranks arrived; rank %d did not)",
               t->timeout_s, w->bar_count, w->size, missing);
      tw_abort_locked(w, t->rank, why);
    }
  }
  pthread_mutex_unlock(&w->mu);
  return s;
}

void tw_world_abort(tw_world *w, int rank, const char *why) {
  pthread_mutex_lock(&w->mu);
  tw_abort_locked(w, rank, why);
  pthread_mutex_unlock(&w->mu);
}

void tw_abort(rda_transport *t, const char *reason) {
  tw_world_abort(((tw_endpoint *)t)->world, t->rank, reason);
}

void tw_destroy(rda_transport *t) {
  tw_endpoint *ep = (tw_endpoint *)t;
  tw_world *w = ep->world;
  pthread_mutex_lock(&w->mu);
  if (ep->state == 2 && ep->pending > 0)
    tw_abort_locked(w, t->rank, "left the ring with operations pending");
  /* Gone for good: a wait or barrier that still needs this rank fails now, naming it, instead
   * of by its timeout (tw_departed). */
  w->left[t->rank] = 1;
  pthread_cond_broadcast(&w->cv);
  tw_unlink_all(w, ep);
  w->ep[t->rank] = NULL;
  pthread_mutex_unlock(&w->mu);
  if (w->hooks->fini != NULL) w->hooks->fini(ep);
  tw_free_ops(ep);
  free(ep->ops);
  free(ep);
}

/* --- the world ------------------------------------------------------------------------------- */

static void tw_world_free_arrays(tw_world *w) {
  free(w->present), free(w->fingerprint), free(w->bar_vals), free(w->bar_at), free(w->left);
  free(w->ep), free(w->sendq), free(w->recvq);
}

/* Set up the zeroed w; on failure nothing is left to release. */
static rda_status tw_world_init(tw_world *w, const char *what, const char *name,
                                const tw_hooks *hooks, int size, double timeout_s, rda_err *err) {
  if (size < 1 || size > 4096)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: %d ranks: need 1..4096", what, size);
  if (!(timeout_s > 0.0) || timeout_s > 1e6)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: timeout %g s: need 0 < timeout <= 1e6",
                       what, timeout_s);
  w->what = what, w->hooks = hooks;
  w->vt = (rda_transport_vtbl){
      .name = name,
      .group_start = tw_group_start,
      .send = tw_send,
      .recv = tw_recv,
      .group_end = tw_group_end,
      .wait = tw_wait,
      .gather8 = tw_gather8,
      .abort = tw_abort,
      .destroy = tw_destroy,
  };
  w->size = size, w->timeout_s = timeout_s;
  w->present = calloc((size_t)size, sizeof *w->present);
  w->fingerprint = calloc((size_t)size, sizeof *w->fingerprint);
  w->bar_vals = calloc(2 * (size_t)size, sizeof *w->bar_vals);
  w->bar_at = calloc((size_t)size, sizeof *w->bar_at);
  w->left = calloc((size_t)size, sizeof *w->left);
  w->ep = calloc((size_t)size, sizeof *w->ep);
  w->sendq = calloc((size_t)size, sizeof *w->sendq);
  w->recvq = calloc((size_t)size, sizeof *w->recvq);
  pthread_condattr_t ca;
  int ok = w->present && w->fingerprint && w->bar_vals && w->bar_at && w->left && w->ep &&
           w->sendq && w->recvq;
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
    tw_world_free_arrays(w);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  }
  return RDA_OK;
}

rda_status tw_world_create(size_t bytes, const char *what, const char *name, const tw_hooks *hooks,
                           int size, double timeout_s, tw_world **out, rda_err *err) {
  *out = NULL;
  tw_world *w = calloc(1, bytes);
  if (w == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  const rda_status s = tw_world_init(w, what, name, hooks, size, timeout_s, err);
  if (s != RDA_OK) {
    free(w);
    return s;
  }
  *out = w;
  return RDA_OK;
}

void tw_world_destroy(tw_world *w) {
  if (w == NULL) return;
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  tw_world_free_arrays(w);
  free(w);
}

rda_status tw_join(tw_world *w, int rank, uint64_t fingerprint, size_t ep_bytes,
                   rda_status (*init)(tw_endpoint *ep, void *arg, rda_err *err), void *arg,
                   tw_endpoint **out, rda_err *err) {
  *out = NULL;
  if (rank < 0 || rank >= w->size)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: rank %d of %d", w->what, rank, w->size);
  tw_endpoint *ep = calloc(1, ep_bytes);
  rda_err why = {0};
  rda_status init_st = RDA_OK;
  if (ep != NULL) {
    ep->base.vt = &w->vt, ep->base.rank = rank, ep->base.size = w->size;
    ep->base.timeout_s = w->timeout_s;
    ep->world = w;
    if (init != NULL) init_st = init(ep, arg, &why);
  }
  pthread_mutex_lock(&w->mu);
  if (w->present[rank]) {
    /* A second ring for a rank is the caller's mistake alone: refused without aborting the
     * ring the first one makes (or made: a world serves one ring), also when its own setup
     * failed. */
    pthread_mutex_unlock(&w->mu);
    rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                "rank %d: joined the ring twice (a world serves one ring, one endpoint per rank: "
                "make a new world for a new ring)",
                rank);
    if (ep != NULL && w->hooks->fini != NULL) w->hooks->fini(ep);
    free(ep);
    return RDA_ERR_INVALID_ARGUMENT;
  }
  if (ep == NULL || init_st != RDA_OK) {
    const char *msg = ep == NULL ? "out of memory joining the ring" : why.msg;
    const rda_status s = ep == NULL ? RDA_ERR_OUT_OF_MEMORY : init_st;
    tw_abort_locked(w, rank, msg);
    pthread_mutex_unlock(&w->mu);
    rda_err_set(err, s, "rank %d: %s", rank, msg);
    if (ep != NULL && w->hooks->fini != NULL) w->hooks->fini(ep);
    free(ep);
    return s;
  }
  w->present[rank] = 1;
  w->fingerprint[rank] = fingerprint;
  w->ep[rank] = ep;
  w->joined++;
  pthread_cond_broadcast(&w->cv);
  const struct timespec dl = tw_deadline(w->timeout_s);
  rda_status s = RDA_OK;
  while (w->joined < w->size && !w->aborted) {
    if (tw_wait_until(w, &dl) && w->joined < w->size && !w->aborted) {
      int missing = 0;
      while (missing < w->size && w->present[missing]) missing++;
      char msg[160];
      snprintf(msg, sizeof msg, "timed out after %.1f s waiting for rank %d to join", w->timeout_s,
               missing);
      tw_abort_locked(w, rank, msg);
    }
  }
  if (w->aborted) {
    s = tw_aborted_error(w, rank, err);
  } else {
    /* Every rank compares the same table, so every rank reports the same mismatch. */
    s = rda_transport_check_fingerprints(w->fingerprint, w->size, rank, err);
  }
  if (s != RDA_OK) w->ep[rank] = NULL;
  pthread_mutex_unlock(&w->mu);
  if (s != RDA_OK) {
    if (w->hooks->fini != NULL) w->hooks->fini(ep);
    free(ep);
    return s;
  }
  *out = ep;
  return RDA_OK;
}
