/* api_ring.c — the public ring API (include/rda.h, "the ring"): worlds of virtual ranks, one
 * rda_ring per rank over a host, device or NCCL transport, and rda_ring_forward / _backward
 * with exactly rda_forward's and rda_backward's boundary checks, on the rank's rows. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_internal.h"
#include "bwd.h"
#include "emu.h"
#include "ring.h"
#include "ring_plan.h"
#include "transport.h"
#include "transport_world.h"

_Static_assert((int)RDA_LAYOUT_CONTIGUOUS == RDA_RING_CONTIGUOUS &&
                   (int)RDA_LAYOUT_ZIGZAG == RDA_RING_ZIGZAG,
               "rda.h and ring_plan.h disagree on layouts");

enum {
  kWorldMagic = 0x52445257, /* "RDRW" */
  kRingMagic = 0x52445247,  /* "RDRG" */
  kDeadRing = 0x44454144,   /* "DEAD" */
};

static const double kDefaultTimeout = 60.0; /* seconds, for a timeout of 0 */
static const double kMaxTimeout = 1e6;

struct rda_ring_world {
  uint32_t magic;
  rda_ctx *ctx; /* holds a reference */
  int ranks;
  double timeout_s;
  rda_host_world *host;  /* the emulator context's transport world */
  rda_device_world *dev; /* a cuda context's */
  atomic_int rings;      /* rda_ring handles on it (joined or joining) */
};

struct rda_ring {
  uint32_t magic;
  rda_plan *plan;        /* the ring's own handle on the caller's plan's kernels */
  rda_ctx *ctx;          /* plan->ctx */
  rda_ring_world *world; /* NULL with NCCL */
  rda_ring_plan *rp;
  rda_transport *t;
  void *own_stream; /* the NCCL communication stream the ring made, or NULL */
  int rank, ranks;
  long long rows;
  uint64_t block_max;   /* the largest ring block of this rank per batch element (send, all
                           sends or receives of one round): bounds the workspace for a batch */
  atomic_int aborted;   /* rda_ring_abort or a failed call: every later call fails */
  atomic_int busy;      /* a forward or backward call runs: calls on one ring never overlap */
  pthread_mutex_t lock; /* stats and reason */
  char reason[RDA_API_MSG_LEN];
  rda_ring_stats stats;
};

/* ---- helpers ----------------------------------------------------------------------------- */

static int ring_ok(const rda_ring *r) {
  return r != NULL && r->magic == kRingMagic;
}

static rda_status ring_bad(const rda_ring *r, const char *fn) {
  if (r == NULL) return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT, "%s: ring is NULL", fn);
  return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT,
                       "%s: ring is not a live rda_ring (wrong magic, or destroyed)", fn);
}

/* A timeout argument: finite, 0 (the default) or positive up to kMaxTimeout. */
static rda_status ring_timeout(const char *fn, const char *name, double in, double *out,
                               rda_err *err) {
  if (!isfinite(in) || in < 0.0 || in > kMaxTimeout)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: %s = %g: must be 0 (for %g s) or positive seconds up to %g", fn, name,
                       in, kDefaultTimeout, kMaxTimeout);
  *out = in == 0.0 ? kDefaultTimeout : in;
  return RDA_OK;
}

/* Remember why the ring failed and make every rank's pending and later calls fail. */
static void ring_kill(rda_ring *r, const char *why) {
  pthread_mutex_lock(&r->lock);
  if (!atomic_load(&r->aborted)) snprintf(r->reason, sizeof r->reason, "%s", why);
  atomic_store(&r->aborted, 1);
  pthread_mutex_unlock(&r->lock);
  rda_transport_abort(r->t, why); /* the first abort of the world wins */
}

/* A ring call failed: tell the other ranks if no agreement of the call has (their pass's
 * agreement waits for this rank's word: see rda_ring_settle), abort the ring with the message,
 * record "fn: message" on the context. */
static rda_status ring_fail(rda_ring *r, const char *fn, int told, const rda_err *err) {
  const char *msg = err->msg[0] != '\0' ? err->msg : "(no detail recorded)";
  if (!told && !atomic_load(&r->aborted)) {
    rda_err ignored = {0};
    (void)rda_ring_settle(r->t, err->status != RDA_OK ? err->status : RDA_ERR_INTERNAL, NULL,
                          &ignored);
  }
  ring_kill(r, msg);
  const int named = strncmp(msg, fn, strlen(fn)) == 0; /* the boundary checks name fn already */
  return rda_api_failf(r->ctx, err->status != RDA_OK ? err->status : RDA_ERR_INTERNAL, "%s%s%s",
                       named ? "" : fn, named ? "" : ": ", msg);
}

/* Workspace parts of a pass on this rank for batch: the pass's own parts (forward: the fp32 O
 * accumulator and LSE; backward: the Dp/dQ workspace) and the ring's buffers, each rounded. */
typedef struct ring_ws {
  size_t o_bytes, lse_bytes, bwd_bytes, ring_bytes;
} ring_ws;

static rda_status ring_ws_parts(const rda_ring *r, long long batch, int backward, ring_ws *ws,
                                const char *fn, rda_err *err) {
  const rda_plan_k *pk = &r->plan->core->pk;
  memset(ws, 0, sizeof *ws);
  if (!rda_api_ws_parts(pk, batch, r->rows, &ws->o_bytes, &ws->lse_bytes))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: batch = %lld, rows = %lld: the workspace size overflows", fn, batch,
                       r->rows);
  if (backward) {
    ws->bwd_bytes = rda_api_round_up(rda_bwd_workspace_bytes(pk, batch, r->rows));
    ws->o_bytes = ws->lse_bytes = 0;
  }
  /* The ring's workspace is at most 11 blocks of block_max bytes times one batch slice (ring.c's
   * layout: send, 2 receive, 2 x 2 gradient, 2 x 2 returned gradient blocks, rounded; a larger
   * batch reuses it slice by slice): refuse a slice that could overflow before ring.c
   * multiplies. */
  const long long most = rda_ring_batch_slice(), slice = batch < most ? batch : most;
  if (r->block_max > 0 && (uint64_t)slice > (uint64_t)(SIZE_MAX / 16) / r->block_max)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: batch = %lld, rows = %lld: the ring's workspace size overflows", fn,
                       batch, r->rows);
  const size_t ring = rda_ring_workspace_bytes(pk, r->rp, r->rank, batch, backward);
  if (ring > SIZE_MAX / 4 || ws->bwd_bytes > SIZE_MAX / 4)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: batch = %lld, rows = %lld: the ring's workspace size overflows", fn,
                       batch, r->rows);
  ws->ring_bytes = rda_api_round_up(ring);
  return RDA_OK;
}

static void ring_save_stats(rda_ring *r, const rda_ring_run_stats *st) {
  pthread_mutex_lock(&r->lock);
  r->stats.rows = r->rows;
  r->stats.bytes_sent = st->bytes_sent;
  r->stats.bytes_received = st->bytes_received;
  r->stats.peak_bytes = st->peak_bytes;
  pthread_mutex_unlock(&r->lock);
}

/* Claim the ring for one forward or backward call; 0 (the error recorded, the ring untouched)
 * when another thread's call on it runs: the transport keeps one group in flight per rank, so
 * overlapping calls would interleave their messages. */
static int ring_enter_call(rda_ring *r, const char *fn) {
  if (!atomic_exchange(&r->busy, 1)) return 1;
  (void)rda_api_failf(r->ctx, RDA_ERR_INVALID_ARGUMENT,
                      "%s: rank %d: another call on this ring is running (calls on one ring must "
                      "not overlap; the ring is left as it was)",
                      fn, r->rank);
  return 0;
}

/* A call on a ring that was aborted (here, or a failed call) fails at once. The reason is the
 * failed call's own error when that already said so: it is not said twice. */
static rda_status ring_check_alive(rda_ring *r, rda_err *err) {
  if (!atomic_load(&r->aborted)) return RDA_OK;
  char said[64];
  const int n = snprintf(said, sizeof said, "rank %d: the ring was aborted: ", r->rank);
  pthread_mutex_lock(&r->lock);
  rda_err_set(err, RDA_ERR_NCCL, "%s%s", strncmp(r->reason, said, (size_t)n) == 0 ? "" : said,
              r->reason);
  pthread_mutex_unlock(&r->lock);
  return RDA_ERR_NCCL;
}

/* ---- worlds ------------------------------------------------------------------------------ */

rda_status rda_ring_world_create(rda_ring_world **out, rda_ctx *ctx, int ranks, double timeout_s) {
  static const char fn[] = "rda_ring_world_create";
  if (out == NULL)
    return rda_api_failf(rda_api_ctx_ok(ctx) ? ctx : NULL, RDA_ERR_INVALID_ARGUMENT,
                         "%s: out is NULL", fn);
  *out = NULL;
  if (ctx == NULL) return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
  if (!rda_api_ctx_open(ctx))
    return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT,
                         "%s: ctx is not a live rda_ctx (wrong magic, or destroyed)", fn);
  if (ranks < 1 || ranks > RDA_RING_MAX_RANKS)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT, "%s: ranks = %d: must be 1 to %d", fn,
                         ranks, RDA_RING_MAX_RANKS);
  rda_err err = {0};
  double to = 0.0;
  if (ring_timeout(fn, "timeout_s", timeout_s, &to, &err) != RDA_OK) return rda_api_fail(ctx, &err);
  rda_ring_world *w = calloc(1, sizeof *w);
  if (w == NULL) return rda_api_failf(ctx, RDA_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  const rda_status s = ctx->is_cuda || rda_backend_emu_async(ctx->b)
                           ? rda_device_world_create(ranks, to, &w->dev, &err)
                           : rda_host_world_create(ranks, to, &w->host, &err);
  if (s != RDA_OK) {
    free(w);
    return rda_api_failf(ctx, s, "%s: %s", fn, err.msg);
  }
  w->magic = kWorldMagic;
  w->ctx = ctx;
  w->ranks = ranks;
  w->timeout_s = to;
  atomic_init(&w->rings, 0);
  atomic_fetch_add(&ctx->refs, 1);
  *out = w;
  return RDA_OK;
}

void rda_ring_world_destroy(rda_ring_world *world) {
  if (world == NULL) return;
  if (world->magic != kWorldMagic) {
    (void)rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT,
                        "rda_ring_world_destroy: world is not a live rda_ring_world (wrong "
                        "magic, or destroyed before); ignored");
    return;
  }
  const int live = atomic_load(&world->rings);
  if (live > 0) {
    /* Its rings' endpoints point into the transport world: leak rather than free under them. */
    (void)rda_api_failf(world->ctx, RDA_ERR_INVALID_ARGUMENT,
                        "rda_ring_world_destroy: %d rda_ring of the world %s still live; "
                        "destroy them first (the world was not destroyed)",
                        live, live == 1 ? "is" : "are");
    return;
  }
  world->magic = kDeadRing;
  rda_host_world_destroy(world->host);
  if (world->dev != NULL) rda_device_world_destroy(world->dev);
  rda_api_ctx_release(world->ctx);
  free(world);
}

rda_status rda_ring_nccl_unique_id(void *id) {
  if (id == NULL)
    return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT, "rda_ring_nccl_unique_id: id is NULL");
  rda_err err = {0};
  const rda_status s = rda_transport_nccl_unique_id(id, &err);
  if (s != RDA_OK)
    return rda_api_failf(NULL, s, "rda_ring_nccl_unique_id: %s",
                         err.msg[0] != '\0' ? err.msg : "(no detail recorded)");
  return RDA_OK;
}

/* ---- rings ------------------------------------------------------------------------------- */

/* The desc's checks of what joining the transport needs (one line each): with these passed, a
 * rank that fails later can still tell the others (ring_tell_failure). */
static rda_status ring_check_join(const rda_ctx *ctx, const rda_ring_desc *d, double *timeout_s,
                                  rda_err *err) {
  static const char fn[] = "rda_ring_create";
  if (d->struct_size != sizeof(rda_ring_desc))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: desc->struct_size = %zu: expected sizeof(rda_ring_desc) = %zu "
                       "(initialize with RDA_RING_DESC_INIT)",
                       fn, d->struct_size, sizeof(rda_ring_desc));
  const int nsrc = (d->world != NULL) + (d->nccl_comm != NULL) + (d->nccl_unique_id != NULL);
  if (nsrc != 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: desc sets %s of world, nccl_comm and nccl_unique_id: exactly one "
                       "must be set",
                       fn,
                       nsrc == 0   ? "none"
                       : nsrc == 2 ? "two"
                                   : "all three");
  if (d->ranks < 1 || d->ranks > RDA_RING_MAX_RANKS)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: desc->ranks = %d: must be 1 to %d", fn,
                       d->ranks, RDA_RING_MAX_RANKS);
  if (d->rank < 0 || d->rank >= d->ranks)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: desc->rank = %d: must be 0 to %d (desc->ranks - 1)", fn, d->rank,
                       d->ranks - 1);
  RDA_TRY(ring_timeout(fn, "desc->timeout_s", d->timeout_s, timeout_s, err));
  if (d->world != NULL) {
    const rda_ring_world *w = d->world;
    if (w->magic != kWorldMagic)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "%s: desc->world is not a live rda_ring_world (wrong magic, or "
                         "destroyed)",
                         fn);
    if (w->ctx != ctx)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "%s: desc->world belongs to another context than the plan", fn);
    if (w->ranks != d->ranks)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "%s: desc->ranks = %d: the world has %d ranks", fn, d->ranks, w->ranks);
    *timeout_s = w->timeout_s;
  } else if (!ctx->is_cuda) {
    return rda_err_set(err, RDA_ERR_UNSUPPORTED,
                       "%s: NCCL needs a cuda context; on the emulator use desc->world (an "
                       "rda_ring_world)",
                       fn);
  }
  return RDA_OK;
}

/* The desc's checks of the ring's shape: N and the layout (one line each). */
static rda_status ring_check_shape(const rda_ring_desc *d, rda_err *err) {
  static const char fn[] = "rda_ring_create";
  if (d->n > RDA_RING_MAX_N)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: desc->n = %lld: must be at most 2^40 = %lld", fn, d->n,
                       (long long)RDA_RING_MAX_N);
  if (d->n < 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: desc->n = %lld: must be >= 1", fn, d->n);
  if (d->layout != RDA_LAYOUT_CONTIGUOUS && d->layout != RDA_LAYOUT_ZIGZAG)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: desc->layout = %d: must be RDA_LAYOUT_CONTIGUOUS or "
                       "RDA_LAYOUT_ZIGZAG",
                       fn, (int)d->layout);
  if (d->layout == RDA_LAYOUT_ZIGZAG && d->n % (2LL * d->ranks) != 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: desc->n = %lld: the zigzag layout needs N to be a multiple of "
                       "2 * desc->ranks = %lld",
                       fn, d->n, 2LL * d->ranks);
  return RDA_OK;
}

/* The NCCL transfers' stream: the caller's (with the context made current on this thread: any
 * backend call does that), or one the ring makes (*own_stream, the caller destroys it). */
static rda_status ring_comm_stream(rda_backend *b, const rda_ring_desc *d, void **stream,
                                   void **own_stream, rda_err *err) {
  *stream = d->comm_stream;
  if (*stream == NULL) {
    RDA_TRY(b->stream_create(b, own_stream, err));
    *stream = *own_stream;
    return RDA_OK;
  }
  void *ev = NULL;
  RDA_TRY(b->event_create(b, &ev, err));
  b->event_destroy(b, ev);
  return RDA_OK;
}

/* Join the transport: the world's, or an NCCL communicator. */
static rda_status ring_join(rda_backend *b, const rda_ring_desc *d, uint64_t fp, double timeout_s,
                            rda_transport **t, void **own_stream, rda_err *err) {
  if (d->world != NULL) {
    if (d->world->host != NULL) return rda_host_world_join(d->world->host, d->rank, fp, t, err);
    return rda_device_world_join(d->world->dev, d->rank, fp, b, t, err);
  }
  void *stream = NULL;
  RDA_TRY(ring_comm_stream(b, d, &stream, own_stream, err));
  return rda_transport_nccl_create(d->nccl_comm, d->nccl_unique_id, d->rank, d->ranks, stream, b,
                                   fp, timeout_s, t, err);
}

/* This rank's rda_ring_create failed before it joined (err: why; a bad desc, or the plan could
 * not be made): tell the other ranks, so that their joins fail at once with the reason instead
 * of waiting out the timeout for a rank that never comes ("a mismatch is an error on every
 * rank, not a hang"). A virtual-rank world is aborted in this rank's name: the host and device
 * worlds begin with their tw_world (transport_world.h), which tw_world_abort aborts for a rank
 * without an endpoint (first abort wins, "rank R: why", everyone woken). NCCL carries no abort
 * and no message: the rank joins with its failure word in place of its fingerprint
 * (rda_transport_nccl_tell), when ctx is known and the desc's join fields are sound
 * (ring_check_join), and the others' fingerprint check fails naming it and its status. That
 * waits for them to join, within the timeout. A desc whose struct_size or world is not valid,
 * or an NCCL desc that cannot join, tells no one: the others fail after their timeout.
 * Returns err's status, or, when telling failed and so aborted the caller's communicator, an
 * NCCL or CUDA status (rda.h: the handle is then gone), err's message saying both. */
static rda_status ring_tell_failure(rda_ctx *ctx, const rda_ring_desc *d, rda_err *err) {
  if (d == NULL || d->struct_size != sizeof(rda_ring_desc)) return err->status;
  if (d->world != NULL) {
    if (d->world->magic != kWorldMagic) return err->status;
    tw_world *w = d->world->host != NULL ? (tw_world *)(void *)d->world->host
                                         : (tw_world *)(void *)d->world->dev;
    if (w != NULL) tw_world_abort(w, d->rank, err->msg[0] != '\0' ? err->msg : "(no detail)");
    return err->status;
  }
  rda_err tell = {0};
  double timeout_s = 0.0;
  if (ctx == NULL || ring_check_join(ctx, d, &timeout_s, &tell) != RDA_OK) return err->status;
  void *stream = NULL, *own_stream = NULL;
  rda_status s = ring_comm_stream(ctx->b, d, &stream, &own_stream, &tell);
  if (s == RDA_OK)
    s = rda_transport_nccl_tell(d->nccl_comm, d->nccl_unique_id, d->rank, d->ranks, stream, ctx->b,
                                err->status, timeout_s, &tell);
  if (own_stream != NULL) ctx->b->stream_destroy(ctx->b, own_stream);
  if (d->nccl_comm != NULL && (s == RDA_ERR_NCCL || s == RDA_ERR_CUDA)) {
    char mine[sizeof err->msg];
    snprintf(mine, sizeof mine, "%s", err->msg);
    rda_err_set(err, s,
                "%s; then telling the other ranks failed, which aborted desc->nccl_comm: %s", mine,
                tell.msg);
  }
  return err->status;
}

static void ring_free(rda_ring *r) {
  rda_transport_destroy(r->t);
  if (r->own_stream != NULL) r->ctx->b->stream_destroy(r->ctx->b, r->own_stream);
  rda_ring_plan_destroy(r->rp);
  if (r->world != NULL) atomic_fetch_sub(&r->world->rings, 1);
  rda_plan_destroy(r->plan);
  pthread_mutex_destroy(&r->lock);
  free(r);
}

rda_status rda_ring_create(rda_ring **out, rda_plan *plan, const rda_ring_desc *desc) {
  static const char fn[] = "rda_ring_create";
  rda_err err = {0};
  if (out == NULL) {
    rda_ctx *ctx = rda_api_plan_ok(plan) ? plan->ctx : NULL;
    rda_err_set(&err, RDA_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    (void)ring_tell_failure(ctx, desc, &err);
    return rda_api_fail(ctx, &err);
  }
  *out = NULL;
  if (!rda_api_plan_ok(plan)) {
    const rda_status s = rda_api_bad_plan(plan, fn);
    rda_err_set(&err, s, "%s", rda_last_error(NULL));
    (void)ring_tell_failure(NULL, desc, &err); /* no context: over NCCL, no one to tell */
    return s;
  }
  rda_ctx *ctx = plan->ctx;
  if (desc == NULL) return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
  double timeout_s = 0.0;
  if (ring_check_join(ctx, desc, &timeout_s, &err) != RDA_OK ||
      ring_check_shape(desc, &err) != RDA_OK) {
    (void)ring_tell_failure(ctx, desc, &err);
    return rda_api_fail(ctx, &err);
  }
  const rda_config *cfg = &plan->core->pk.cfg;

  rda_ring *r = calloc(1, sizeof *r);
  if (r == NULL) {
    rda_err_set(&err, RDA_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    (void)ring_tell_failure(ctx, desc, &err);
    return rda_api_fail(ctx, &err);
  }
  pthread_mutex_init(&r->lock, NULL);
  atomic_init(&r->aborted, 0);
  atomic_init(&r->busy, 0);
  r->ctx = ctx;
  r->rank = desc->rank;
  r->ranks = desc->ranks;
  pthread_mutex_lock(&ctx->lock);
  rda_status s = rda_api_plan_wrap(ctx, plan->core, plan->flags, &r->plan, &err);
  pthread_mutex_unlock(&ctx->lock);
  if (s == RDA_OK)
    s = rda_ring_plan_create(cfg, desc->n, desc->ranks, (int)desc->layout, &r->rp, &err);
  int *peers = NULL, npeers = 0;
  if (s == RDA_OK) {
    rda_ring_step *steps = NULL;
    int64_t nsteps = 0;
    s = rda_ring_plan_steps(r->rp, r->rank, &steps, &nsteps, &err);
    uint64_t b[3] = {0, 0, 0};
    if (s == RDA_OK) rda_ring_steps_blocks(steps, nsteps, &b[0], &b[1], &b[2]);
    if (s == RDA_OK && (peers = malloc((size_t)desc->ranks * sizeof *peers)) == NULL)
      s = rda_err_set(&err, RDA_ERR_OUT_OF_MEMORY, "out of memory");
    if (s == RDA_OK) rda_ring_steps_peers(steps, nsteps, r->rank, peers, &npeers);
    free(steps);
    r->block_max = b[0] > b[1] ? b[0] : b[1];
    r->block_max = b[2] > r->block_max ? b[2] : r->block_max;
  }
  if (s != RDA_OK) s = ring_tell_failure(ctx, desc, &err);
  if (s == RDA_OK) {
    r->rows = (long long)rda_ring_plan_rank(r->rp, r->rank)->rows;
    r->stats.rows = r->rows;
    if (desc->world != NULL) {
      r->world = desc->world;
      atomic_fetch_add(&r->world->rings, 1);
    }
    const uint64_t fp = rda_ring_fingerprint(cfg, desc->n, desc->ranks, (int)desc->layout);
    s = ring_join(ctx->b, desc, fp, timeout_s, &r->t, &r->own_stream, &err);
  }
  /* Links set up now (NCCL's point-to-point ones), not during the first pass's steps. */
  if (s == RDA_OK) s = rda_transport_connect(r->t, peers, npeers, &err);
  free(peers);
  if (s != RDA_OK) {
    ring_free(r);
    return rda_api_failf(ctx, s, "%s: %s", fn, err.msg[0] != '\0' ? err.msg : "(no detail)");
  }
  r->magic = kRingMagic;
  *out = r;
  return RDA_OK;
}

rda_status rda_ring_rows(const rda_ring *ring, long long *rows, int *npieces, long long lo[2],
                         long long hi[2]) {
  if (!ring_ok(ring)) return ring_bad(ring, "rda_ring_rows");
  const rda_ring_rank *rk = rda_ring_plan_rank(ring->rp, ring->rank);
  if (rows != NULL) *rows = ring->rows;
  if (npieces != NULL) *npieces = rk->npieces;
  for (int i = 0; i < 2; ++i) {
    if (lo != NULL) lo[i] = i < rk->npieces ? (long long)rk->lo[i] : 0;
    if (hi != NULL) hi[i] = i < rk->npieces ? (long long)rk->hi[i] : 0;
  }
  return RDA_OK;
}

rda_status rda_ring_workspace_size(const rda_ring *ring, long long batch, int backward,
                                   size_t *bytes) {
  static const char fn[] = "rda_ring_workspace_size";
  if (bytes != NULL) *bytes = 0;
  if (!ring_ok(ring)) return ring_bad(ring, fn);
  rda_ctx *ctx = ring->ctx;
  if (bytes == NULL) return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
  if (batch < 1)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT, "%s: batch = %lld: must be >= 1", fn,
                         batch);
  if (backward != 0 && backward != 1)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "%s: backward = %d: must be 0 (forward) or 1 (backward)", fn, backward);
  if (backward && !rda_api_plan_has_bwd(ring->plan))
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "%s: the plan was created without RDA_PLAN_WITH_BACKWARD", fn);
  rda_err err = {0};
  ring_ws ws;
  if (ring_ws_parts(ring, batch, backward, &ws, fn, &err) != RDA_OK) return rda_api_fail(ctx, &err);
  *bytes = ws.o_bytes + ws.lse_bytes + ws.bwd_bytes + ws.ring_bytes;
  return RDA_OK;
}

/* ---- forward ----------------------------------------------------------------------------- */

/* q's place in fn's arguments, as both passes check it first: [B, rows, H, D] with B >= 1 and
 * the rank's rows (its other dimensions are checked with the other tensors). */
static rda_status ring_check_q(const rda_ring *r, const char *fn, const rda_tensor *q,
                               rda_err *err) {
  if (q == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: q is NULL", fn);
  if (q->ndim != 4)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: q->ndim = %d: expected 4 (q [B, rows, H, D])", fn, q->ndim);
  if (q->shape[0] < 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: q->shape[0] = %lld: B must be >= 1",
                       fn, q->shape[0]);
  if (q->shape[1] != r->rows)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: q->shape[1] = %lld: rank %d of %d owns %lld rows (rda_ring_rows)", fn,
                       q->shape[1], r->rank, r->ranks, r->rows);
  return RDA_OK;
}

/* rda_forward's checks on the rank's rows, then the ring; err says why on failure. */
static rda_status ring_forward(rda_ring *r, const rda_tensor *q, const rda_tensor *k,
                               const rda_tensor *v, const rda_tensor *o, const rda_tensor *lse,
                               void *workspace, size_t workspace_bytes, void *stream,
                               int *told, rda_err *err) {
  static const char fn[] = "rda_ring_forward";
  const rda_plan *plan = r->plan;
  rda_ctx *ctx = r->ctx;
  const rda_plan_k *pk = &plan->core->pk;
  const rda_config *c = &pk->cfg;
  RDA_TRY(ring_check_alive(r, err));
  RDA_TRY(ring_check_q(r, fn, q, err));
  const long long batch = q->shape[0], n = r->rows;
  const rda_tensor *const all[5] = {q, k, v, o, lse};
  RDA_TRY(rda_api_check_fwd_tensors(plan, fn, 1, all, batch, n, err));

  ring_ws ws;
  RDA_TRY(ring_ws_parts(r, batch, 0, &ws, fn, err));
  const int o_direct = o->dtype == RDA_FP32;
  /* Only the parts in use, packed in this order: [O accumulator | LSE | ring buffers]. */
  const size_t o_part = o_direct ? 0 : ws.o_bytes, l_part = lse != NULL ? 0 : ws.lse_bytes;
  const size_t need = o_part + l_part + ws.ring_bytes;
  if (need > 0)
    RDA_TRY(rda_api_check_workspace(fn, "rda_ring_workspace_size", workspace, workspace_bytes, need,
                                    err));
  RDA_TRY(rda_api_check_fwd_apart(fn, all, workspace, need, err));

  char *wp = workspace;
  rda_fwd_args a;
  rda_api_fwd_args(c, batch, n, all, wp, wp + o_part, &a);
  wp += o_part + l_part;
  void *ring_ws_ptr = ws.ring_bytes > 0 ? (void *)wp : NULL;

  rda_ring_run_stats st;
  memset(&st, 0, sizeof st);
  rda_api_stream_enter(ctx, stream);
  *told = 1; /* from here on, by the pass's agreements or by the one below */
  rda_status s = rda_ring_fwd_run(ctx->b, pk, &plan->core->kernels, r->rp, r->rank, r->t, &a,
                                  ring_ws_ptr, ws.ring_bytes, &st, err);
  const int ran = s == RDA_OK;
  if (s == RDA_OK && !o_direct && n > 0) s = rda_api_cast(plan, a.o, a.o_s, o, batch, n, err);
  s = rda_api_stream_leave(ctx, s, err);
  ring_save_stats(r, &st);
  /* Every rank returns success only if every rank got here: a rank whose plan has no steps
   * would otherwise never notice that another one failed (a failed pass aborted already). */
  if (ran) s = rda_ring_settle(r->t, s, "in rda_ring_forward", err);
  return s;
}

rda_status rda_ring_forward(rda_ring *ring, const rda_tensor *q, const rda_tensor *k,
                            const rda_tensor *v, const rda_tensor *o, const rda_tensor *lse,
                            void *workspace, size_t workspace_bytes, void *stream) {
  if (!ring_ok(ring)) return ring_bad(ring, "rda_ring_forward");
  if (!ring_enter_call(ring, "rda_ring_forward")) return RDA_ERR_INVALID_ARGUMENT;
  rda_err err = {0};
  int told = 0;
  rda_status s = RDA_OK;
  if (ring_forward(ring, q, k, v, o, lse, workspace, workspace_bytes, stream, &told, &err) !=
      RDA_OK)
    s = ring_fail(ring, "rda_ring_forward", told, &err);
  atomic_store(&ring->busy, 0);
  return s;
}

/* ---- backward ---------------------------------------------------------------------------- */

static rda_status ring_backward(rda_ring *r, const rda_tensor *const t[10], void *workspace,
                                size_t workspace_bytes, void *stream, int *told, rda_err *err) {
  static const char fn[] = "rda_ring_backward";
  const rda_plan *plan = r->plan;
  rda_ctx *ctx = r->ctx;
  const rda_plan_k *pk = &plan->core->pk;
  RDA_TRY(ring_check_alive(r, err));
  if (!rda_api_plan_has_bwd(plan))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: the plan was created without RDA_PLAN_WITH_BACKWARD", fn);
  const rda_tensor *q = t[0];
  RDA_TRY(ring_check_q(r, fn, q, err));
  const long long batch = q->shape[0], n = r->rows;
  RDA_TRY(rda_api_check_bwd_tensors(plan, fn, 1, t, batch, n, err));
  ring_ws ws;
  RDA_TRY(ring_ws_parts(r, batch, 1, &ws, fn, err));
  const size_t need = ws.bwd_bytes + ws.ring_bytes;
  if (need > 0) /* 0 only on a rank without rows */
    RDA_TRY(rda_api_check_workspace(fn, "rda_ring_workspace_size", workspace, workspace_bytes,
                                    need, err));
  RDA_TRY(rda_api_check_bwd_apart(fn, t, workspace, need, err));

  rda_bwd_args a;
  rda_api_bwd_args(t, batch, n, &a);
  /* [Dp / dQ workspace of rda_backward for the rows | ring buffers] */
  a.workspace = ws.bwd_bytes > 0 ? workspace : NULL;
  void *ring_ws_ptr = ws.ring_bytes > 0 ? (void *)((char *)workspace + ws.bwd_bytes) : NULL;

  rda_ring_run_stats st;
  memset(&st, 0, sizeof st);
  rda_api_stream_enter(ctx, stream);
  *told = 1;
  rda_status s = rda_ring_bwd_run(ctx->b, pk, &plan->core->kernels, r->rp, r->rank, r->t, &a,
                                  ring_ws_ptr, ws.ring_bytes, &st, err);
  s = rda_api_stream_leave(ctx, s, err);
  ring_save_stats(r, &st);
  if (s == RDA_OK) s = rda_ring_settle(r->t, s, "in rda_ring_backward", err);
  return s;
}

rda_status rda_ring_backward(rda_ring *ring, const rda_tensor *q, const rda_tensor *k,
                             const rda_tensor *v, const rda_tensor *o, const rda_tensor *lse,
                             const rda_tensor *dout, const rda_tensor *dlse, const rda_tensor *dq,
                             const rda_tensor *dk, const rda_tensor *dv, void *workspace,
                             size_t workspace_bytes, void *stream) {
  if (!ring_ok(ring)) return ring_bad(ring, "rda_ring_backward");
  const rda_tensor *const t[10] = {q, k, v, o, lse, dout, dlse, dq, dk, dv};
  if (!ring_enter_call(ring, "rda_ring_backward")) return RDA_ERR_INVALID_ARGUMENT;
  rda_err err = {0};
  int told = 0;
  rda_status s = RDA_OK;
  if (ring_backward(ring, t, workspace, workspace_bytes, stream, &told, &err) != RDA_OK)
    s = ring_fail(ring, "rda_ring_backward", told, &err);
  atomic_store(&ring->busy, 0);
  return s;
}

/* ---- stats, abort, destroy --------------------------------------------------------------- */

rda_status rda_ring_get_stats(const rda_ring *ring, rda_ring_stats *out) {
  if (!ring_ok(ring)) return ring_bad(ring, "rda_ring_get_stats");
  if (out == NULL)
    return rda_api_failf(ring->ctx, RDA_ERR_INVALID_ARGUMENT, "rda_ring_get_stats: out is NULL");
  rda_ring *r = (rda_ring *)(uintptr_t)ring; /* the lock only */
  pthread_mutex_lock(&r->lock);
  *out = r->stats;
  pthread_mutex_unlock(&r->lock);
  return RDA_OK;
}

void rda_ring_abort(rda_ring *ring, const char *reason) {
  if (!ring_ok(ring)) {
    (void)ring_bad(ring, "rda_ring_abort");
    return;
  }
  char why[512];
  snprintf(why, sizeof why, "rda_ring_abort: %s",
           reason != NULL && reason[0] != '\0' ? reason : "(no reason given)");
  ring_kill(ring, why);
}

void rda_ring_destroy(rda_ring *ring) {
  if (ring == NULL) return;
  if (ring->magic != kRingMagic) {
    (void)ring_bad(ring, "rda_ring_destroy");
    return;
  }
  ring->magic = kDeadRing;
  ring_free(ring);
}
