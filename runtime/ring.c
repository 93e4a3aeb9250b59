/* ring.c — the ring passes of one rank (see ring.h): the schedule of grouped transfers, the
 * workspace blocks and the loop that overlaps each transfer with the previous block's compute.
 * What is computed on a block lives in ring_compute.c.
 *
 * Schedule. The plan gives each rank its steps, ordered by a key every rank shares; a step is
 * one (segment group, shift) of the ring. The backward pass also returns fp32 dK/dV of every
 * received block to the block's owner. To keep every pair of ranks posting matching operations
 * in the same order (the transports match sends and receives FIFO per pair), the gradients of
 * the block of shift s travel in the same segment group at "virtual" shift s + 2, after the
 * K/V blocks of that shift: both ends of a transfer have the step of shift s, so both add the
 * virtual shifts s + 1 and s + 2 (s + 1 keeps the compute of s before the post of s + 2).
 *
 * Loop. Virtual step i: wait for its transfers; add the gradients it returned; post step i+1
 * (pack, then sends and receives); compute on step i's received block. Receive blocks and
 * gradient blocks alternate between two buffers by the parity of i, so step i+1 lands while
 * step i is computed. Nothing waits for the device: ordering is the stream's and the
 * transport's (transport.h). */
#include "ring.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ring_compute.h"
#include "ring_rows.h"
#include "ring_trace.h"

/* One virtual step: the real step whose K/V moves (or NULL), the real step whose gradients
 * return (or NULL). */
typedef struct ring_vstep {
  const rda_ring_step *kv;
  const rda_ring_step *grad;
} ring_vstep;

/* The ring's workspace blocks (backend memory) and their sizes for the batch. */
typedef struct ring_blocks {
  size_t send, recv; /* largest packed send block / sum of one step's receives (16-bit) */
  size_t send_all;   /* largest sum of one step's sends: gradients come back per send */
  unsigned char *sblk, *rblk[2];
  unsigned char *gblk[2];  /* fp32 gradients of a received block, going back */
  unsigned char *grblk[2]; /* fp32 gradients of a sent block, coming back */
} ring_blocks;

static const size_t kAlign = 256;

static size_t ring_round(size_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

static size_t ring_xfers_bytes(const rda_ring_xfer *x, int n, long long batch) {
  size_t s = 0;
  for (int i = 0; i < n; ++i) s += (size_t)x[i].bytes * (size_t)batch;
  return s;
}

static int ring_same_rows(const rda_ring_xfer *a, const rda_ring_xfer *b) {
  if (a->nranges != b->nranges) return 0;
  for (int i = 0; i < a->nranges; ++i)
    if (a->first[i] != b->first[i] || a->count[i] != b->count[i]) return 0;
  return 1;
}

/* Where each send transfer of a step sits in the send block (at[q]) and the block's size: a
 * transfer of the same rows as an earlier one (an all-gather sends one block to both peers)
 * shares its bytes, packed once. */
static size_t ring_send_layout(const rda_ring_step *st, long long batch, size_t at[2]) {
  size_t total = 0;
  for (int q = 0; q < st->nsend; ++q) {
    at[q] = total;
    int shared = 0;
    for (int e = 0; e < q && !shared; ++e)
      if (ring_same_rows(&st->send[e], &st->send[q])) at[q] = at[e], shared = 1;
    if (!shared) total += ring_xfers_bytes(&st->send[q], 1, batch);
  }
  return total;
}

/* The largest packed send block, the largest sum of one step's sends (every peer returns its
 * own gradients for what it got) and the largest sum of one step's receives. */
static void ring_max_blocks(const rda_ring_step *steps, int64_t nsteps, long long batch,
                            size_t *send, size_t *send_all, size_t *recv) {
  *send = *send_all = *recv = 0;
  for (int64_t i = 0; i < nsteps; ++i) {
    size_t at[2];
    const size_t sn = ring_send_layout(&steps[i], batch, at);
    const size_t sa = ring_xfers_bytes(steps[i].send, steps[i].nsend, batch);
    const size_t rn = ring_xfers_bytes(steps[i].recv, steps[i].nrecv, batch);
    if (sn > *send) *send = sn;
    if (sa > *send_all) *send_all = sa;
    if (rn > *recv) *recv = rn;
  }
}

/* Gradients are fp32: twice the bytes of the 16-bit K/V they belong to. */
static size_t ring_layout_bytes(size_t send, size_t send_all, size_t recv, int backward) {
  size_t total = ring_round(send) + 2 * ring_round(recv);
  if (backward) total += 2 * ring_round(2 * recv) + 2 * ring_round(2 * send_all);
  return total;
}

size_t rda_ring_workspace_bytes(const rda_plan_k *pk, const rda_ring_plan *rp, int rank,
                                long long batch, int backward) {
  (void)pk;
  rda_ring_step *steps = NULL;
  int64_t nsteps = 0;
  rda_err err = {0};
  if (rp == NULL || batch < 1 || rda_ring_plan_steps(rp, rank, &steps, &nsteps, &err) != RDA_OK)
    return SIZE_MAX;
  size_t send = 0, send_all = 0, recv = 0;
  ring_max_blocks(steps, nsteps, batch, &send, &send_all, &recv);
  free(steps);
  return ring_layout_bytes(send, send_all, recv, backward);
}

static void ring_carve(ring_blocks *bl, unsigned char *base, int backward) {
  size_t off = 0;
  bl->sblk = base;
  off += ring_round(bl->send);
  for (int i = 0; i < 2; ++i, off += ring_round(bl->recv)) bl->rblk[i] = base + off;
  if (!backward) return;
  for (int i = 0; i < 2; ++i, off += ring_round(2 * bl->recv)) bl->gblk[i] = base + off;
  for (int i = 0; i < 2; ++i, off += ring_round(2 * bl->send_all)) bl->grblk[i] = base + off;
}

/* The virtual steps of a rank (see the top comment); *out malloc'd. */
static rda_status ring_vsteps(const rda_ring_step *steps, int64_t nsteps, int backward,
                              ring_vstep **out, int64_t *count, rda_err *err) {
  *out = NULL;
  *count = 0;
  ring_vstep *v = NULL;
  if (nsteps > 0 && (v = calloc((size_t)nsteps * 3, sizeof *v)) == NULL)
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring: out of memory for the schedule");
  int64_t nv = 0;
  for (int64_t g0 = 0; g0 < nsteps;) {
    int64_t g1 = g0 + 1;
    while (g1 < nsteps && steps[g1].group == steps[g0].group) ++g1;
    /* Shifts grow within a group; walk the union of {s, s+1, s+2} in order. */
    int last = -1;
    for (int64_t i = g0; i < g1; ++i) {
      const int reach = backward ? 2 : 0;
      for (int sh = steps[i].shift; sh <= steps[i].shift + reach; ++sh) {
        if (sh <= last) continue;
        last = sh;
        ring_vstep *x = &v[nv++];
        x->kv = x->grad = NULL;
        for (int64_t j = g0; j < g1; ++j) {
          if (steps[j].shift == sh) x->kv = &steps[j];
          if (backward && steps[j].shift == sh - 2) x->grad = &steps[j];
        }
      }
    }
    g0 = g1;
  }
  *out = v;
  *count = nv;
  return RDA_OK;
}

typedef struct ring_run {
  ring_ctx c;
  const rda_ring_plan *rp;
  rda_transport *t;
  ring_blocks bl;
  int backward;
} ring_run;

/* Pack the K/V rows of a step's send transfers into the send block (ring_send_layout). */
static rda_status ring_pack_step(ring_run *r, const rda_ring_step *st, rda_err *err) {
  rda_ring_class cls;
  rda_ring_plan_class(r->rp, st->cls, &cls);
  size_t at[2];
  (void)ring_send_layout(st, r->c.batch, at);
  for (int q = 0; q < st->nsend; ++q) {
    if (q == 1 && at[1] == at[0]) continue; /* the same rows, packed already */
    rda_ring_rows_params rows;
    RDA_TRY(ring_rows_for(&r->c, &st->send[q], st->stride, &cls, &rows, err));
    ring_rows_set_kv(&r->c, &rows);
    rows.block = r->bl.sblk + at[q];
    RDA_TRY(rda_ring_rows_pack(r->c.b, r->c.pk, r->c.k, &rows, cls.kv_heads, err));
  }
  return RDA_OK;
}

/* Add the gradients returned for a step's sent rows (in grblk) into the rank's dK/dV. */
static rda_status ring_add_returned(ring_run *r, const rda_ring_step *st, unsigned char *blk,
                                    rda_err *err) {
  rda_ring_class cls;
  rda_ring_plan_class(r->rp, st->cls, &cls);
  size_t off = 0;
  for (int q = 0; q < st->nsend; ++q) {
    rda_ring_rows_params rows;
    RDA_TRY(ring_rows_for(&r->c, &st->send[q], st->stride, &cls, &rows, err));
    ring_rows_set_grads(&r->c, &rows);
    rows.block = blk + off;
    RDA_TRY(rda_ring_rows_add(r->c.b, r->c.pk, r->c.k, &rows, cls.kv_heads, err));
    off += 2 * ring_xfers_bytes(&st->send[q], 1, r->c.batch);
  }
  return RDA_OK;
}

static int ring_vstep_has_ops(const ring_vstep *v) {
  return (v->kv != NULL && (v->kv->nsend > 0 || v->kv->nrecv > 0)) ||
         (v->grad != NULL && (v->grad->nsend > 0 || v->grad->nrecv > 0));
}

/* Post virtual step i: K/V sends from the send block, then gradient sends (of the block received
 * two virtual steps earlier, from gblk[i % 2]); K/V receives into rblk[i % 2], then gradient
 * receives into grblk[i % 2]. The same order at both ends of every pair. */
static rda_status ring_post(ring_run *r, const ring_vstep *v, int64_t i, rda_err *err) {
  const long long B = r->c.batch;
  if (v->kv != NULL && v->kv->nsend > 0) RDA_TRY(ring_pack_step(r, v->kv, err));
  RDA_TRY(rda_transport_group_start(r->t, err));
  size_t at[2] = {0, 0};
  if (v->kv != NULL) (void)ring_send_layout(v->kv, B, at);
  for (int q = 0; v->kv != NULL && q < v->kv->nsend; ++q) {
    const size_t n = ring_xfers_bytes(&v->kv->send[q], 1, B);
    RDA_TRY(rda_transport_send(r->t, v->kv->send[q].peer, r->bl.sblk + at[q], n, err));
  }
  size_t off = 0;
  for (int q = 0; v->grad != NULL && q < v->grad->nrecv; ++q) {
    const size_t n = 2 * ring_xfers_bytes(&v->grad->recv[q], 1, B);
    RDA_TRY(rda_transport_send(r->t, v->grad->recv[q].peer, r->bl.gblk[i % 2] + off, n, err));
    off += n;
  }
  off = 0;
  for (int q = 0; v->kv != NULL && q < v->kv->nrecv; ++q) {
    const size_t n = ring_xfers_bytes(&v->kv->recv[q], 1, B);
    RDA_TRY(rda_transport_recv(r->t, v->kv->recv[q].peer, r->bl.rblk[i % 2] + off, n, err));
    off += n;
  }
  off = 0;
  for (int q = 0; v->grad != NULL && q < v->grad->nsend; ++q) {
    const size_t n = 2 * ring_xfers_bytes(&v->grad->send[q], 1, B);
    RDA_TRY(rda_transport_recv(r->t, v->grad->send[q].peer, r->bl.grblk[i % 2] + off, n, err));
    off += n;
  }
  return rda_transport_group_end(r->t, err);
}

/* Compute on the blocks received in virtual step i (gradients into gblk[i % 2]). */
static rda_status ring_compute_step(ring_run *r, const ring_vstep *v, int64_t i, rda_err *err) {
  const rda_ring_step *st = v->kv;
  if (st == NULL || st->nrecv == 0) return RDA_OK;
  rda_ring_class cls;
  rda_ring_plan_class(r->rp, st->cls, &cls);
  if (r->backward) {
    const size_t gbytes = 2 * ring_xfers_bytes(st->recv, st->nrecv, r->c.batch);
    RDA_TRY(r->c.b->memset_async(r->c.b, r->bl.gblk[i % 2], 0, gbytes, err));
  }
  size_t off = 0;
  for (int q = 0; q < st->nrecv; ++q) {
    const unsigned char *kv = r->bl.rblk[i % 2] + off;
    if (r->backward)
      RDA_TRY(ring_bwd_received(&r->c, st, &cls, &st->recv[q], kv, r->bl.gblk[i % 2] + 2 * off,
                                err));
    else
      RDA_TRY(ring_fwd_received(&r->c, st, &cls, &st->recv[q], kv, err));
    off += ring_xfers_bytes(&st->recv[q], 1, r->c.batch);
  }
  return RDA_OK;
}

static rda_status ring_loop(ring_run *r, const ring_vstep *v, int64_t nv, rda_err *err) {
  rda_backend *b = r->c.b;
  int posted = 0;
  ring_trace_mark(b, RING_MARK_BEGIN, 0);
  if (nv > 0 && ring_vstep_has_ops(&v[0])) {
    RDA_TRY(ring_post(r, &v[0], 0, err));
    posted = 1;
  }
  RDA_TRY(r->backward ? ring_bwd_own(&r->c, err) : ring_fwd_own(&r->c, err));
  ring_trace_mark(b, RING_MARK_OWN, 0);
  for (int64_t i = 0; i < nv; ++i) {
    ring_trace_mark(b, RING_MARK_WAIT0, i);
    if (posted) RDA_TRY(rda_transport_wait(r->t, err));
    ring_trace_mark(b, RING_MARK_WAIT1, i);
    if (v[i].grad != NULL && v[i].grad->nsend > 0)
      RDA_TRY(ring_add_returned(r, v[i].grad, r->bl.grblk[i % 2], err));
    posted = 0;
    if (i + 1 < nv && ring_vstep_has_ops(&v[i + 1])) {
      RDA_TRY(ring_post(r, &v[i + 1], i + 1, err));
      posted = 1;
    }
    ring_trace_mark(b, RING_MARK_POSTED, i);
    RDA_TRY(ring_compute_step(r, &v[i], i, err));
    ring_trace_mark(b, RING_MARK_COMPUTED, i);
  }
  ring_trace_mark(b, RING_MARK_END, 0);
  return RDA_OK;
}

static rda_status ring_check(const rda_backend *b, const rda_ring_plan *rp, int rank,
                             const rda_transport *t, long long n, const char *what, rda_err *err) {
  const rda_ring_rank *rk = rda_ring_plan_rank(rp, rank);
  if (rk == NULL || t->rank != rank || t->size != rda_ring_plan_ranks(rp))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "ring %s: rank %d does not match the plan (%d ranks) or the transport "
                       "(rank %d of %d)",
                       what, rank, rda_ring_plan_ranks(rp), t->rank, t->size);
  if (n != rk->rows)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "ring %s: rank %d owns %lld rows, but the tensors have n = %lld", what,
                       rank, (long long)rk->rows, n);
  if (strcmp(t->vt->name, "host") == 0 && strcmp(b->name, "emu") != 0)
    return rda_err_set(err, RDA_ERR_UNSUPPORTED,
                       "ring %s: the host transport runs only with the emulator backend", what);
  return RDA_OK;
}

/* Everything both passes share: checks, the rank's pieces, the schedule, the workspace, the
 * loop, the counters. On any failure the transport is aborted first, so that no posted
 * transfer lands in memory the caller reuses and no other rank waits for this one. */
static rda_status ring_pass(ring_run *r, int rank, long long n, void *workspace,
                            size_t workspace_bytes, rda_ring_run_stats *stats, rda_err *err) {
  const char *what = r->backward ? "backward" : "forward";
  rda_ring_step *steps = NULL;
  ring_vstep *v = NULL;
  int64_t nsteps = 0, nv = 0;
  uint64_t sent0 = 0, recv0 = 0;
  rda_transport_bytes(r->t, &sent0, &recv0);
  rda_status s = ring_check(r->c.b, r->rp, rank, r->t, n, what, err);
  if (s == RDA_OK) s = rda_ring_plan_steps(r->rp, rank, &steps, &nsteps, err);
  if (s == RDA_OK) s = ring_vsteps(steps, nsteps, r->backward, &v, &nv, err);
  size_t need = 0;
  if (s == RDA_OK) {
    ring_max_blocks(steps, nsteps, r->c.batch, &r->bl.send, &r->bl.send_all, &r->bl.recv);
    need = ring_layout_bytes(r->bl.send, r->bl.send_all, r->bl.recv, r->backward);
    if (workspace_bytes < need || (need > 0 && workspace == NULL))
      s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                      "ring %s: rank %d needs %zu bytes of ring workspace, got %zu", what, rank,
                      need, workspace == NULL ? (size_t)0 : workspace_bytes);
    else if (((uintptr_t)workspace % 16) != 0)
      s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                      "ring %s: the ring workspace must be 16-byte aligned", what);
  }
  if (s == RDA_OK) {
    ring_carve(&r->bl, workspace, r->backward);
    s = ring_ctx_init(&r->c, r->rp, rank, err);
  }
  if (s == RDA_OK)
    s = r->backward ? rda_bwd_prep(r->c.b, r->c.pk, r->c.k, r->c.ba, err)
                    : rda_fwd_init(r->c.b, r->c.pk, r->c.k, r->c.fa, err);
  if (s == RDA_OK) s = ring_loop(r, v, nv, err);
  free(v);
  free(steps);
  if (s != RDA_OK) {
    rda_transport_abort(r->t, err != NULL && err->msg[0] != '\0' ? err->msg : "a rank failed");
    return s;
  }
  if (stats != NULL) {
    uint64_t sent1 = 0, recv1 = 0;
    rda_transport_bytes(r->t, &sent1, &recv1);
    stats->rows = rda_ring_plan_rank(r->rp, rank)->rows;
    stats->bytes_sent = sent1 - sent0;
    stats->bytes_received = recv1 - recv0;
    stats->peak_bytes = need;
  }
  return RDA_OK;
}

/* Both entry points: check the handles (aborting the transport, so that no other rank waits
 * for this one), then one pass. fa or ba is NULL. */
static rda_status ring_enter(rda_backend *b, const rda_plan_k *pk, const rda_fwd_kernels *k,
                             const rda_ring_plan *rp, int rank, rda_transport *t,
                             const rda_fwd_args *fa, const rda_bwd_args *ba, void *workspace,
                             size_t workspace_bytes, rda_ring_run_stats *stats, rda_err *err) {
  const char *what = ba != NULL ? "ring backward" : "ring forward";
  rda_status s = RDA_OK;
  if (b == NULL || pk == NULL || k == NULL || rp == NULL || t == NULL ||
      (fa == NULL && ba == NULL))
    s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: a NULL argument", what);
  else if (ba != NULL && !pk->has_bwd)
    s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                    "%s: the plan has no backward kernels (plan it with RDA_PLAN_BACKWARD)", what);
  if (s != RDA_OK) {
    if (t != NULL) rda_transport_abort(t, err != NULL ? err->msg : what);
    return s;
  }
  ring_run r;
  memset(&r, 0, sizeof r);
  r.c.b = b;
  r.c.pk = pk;
  r.c.k = k;
  r.c.fa = fa;
  r.c.ba = ba;
  r.c.batch = ba != NULL ? ba->batch : fa->batch;
  r.rp = rp;
  r.t = t;
  r.backward = ba != NULL;
  return ring_pass(&r, rank, ba != NULL ? ba->n : fa->n, workspace, workspace_bytes, stats, err);
}

rda_status rda_ring_fwd_run(rda_backend *b, const rda_plan_k *pk, const rda_fwd_kernels *k,
                            const rda_ring_plan *rp, int rank, rda_transport *t,
                            const rda_fwd_args *a, void *workspace, size_t workspace_bytes,
                            rda_ring_run_stats *stats, rda_err *err) {
  if (a == NULL) {
    if (t != NULL) rda_transport_abort(t, "ring forward: a NULL argument");
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "ring forward: a NULL argument");
  }
  return ring_enter(b, pk, k, rp, rank, t, a, NULL, workspace, workspace_bytes, stats, err);
}

rda_status rda_ring_bwd_run(rda_backend *b, const rda_plan_k *pk, const rda_fwd_kernels *k,
                            const rda_ring_plan *rp, int rank, rda_transport *t,
                            const rda_bwd_args *a, void *workspace, size_t workspace_bytes,
                            rda_ring_run_stats *stats, rda_err *err) {
  if (a == NULL) {
    if (t != NULL) rda_transport_abort(t, "ring backward: a NULL argument");
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "ring backward: a NULL argument");
  }
  return ring_enter(b, pk, k, rp, rank, t, NULL, a, workspace, workspace_bytes, stats, err);
}
