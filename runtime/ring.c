/* ring.c — the ring forward pass of one rank (see ring.h): init, the own-block compute, then each
 * plan step: pack the send ranges, post the grouped sends/receives, compute the previous block
 * while they are in flight, wait. Every launch merges into the rank's fp32 o / lse by LSE. */
#include "ring.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The rank's owned pieces: global rows [lo[i], hi[i]) at local rows from base[i]. */
typedef struct ring_rank {
  int npieces;
  int64_t lo[2], hi[2], base[2];
} ring_rank;

typedef struct ring_ctx {
  rda_backend *b;
  const rda_plan_k *pk;
  const rda_fwd_kernels *k;
  const rda_fwd_args *a;
  int64_t n; /* global N */
  ring_rank me;
} ring_ctx;

static int64_t ring_ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

/* Local row of an owned global row. */
static int64_t ring_local_row(const ring_rank *me, int64_t pos) {
  for (int i = 0; i < me->npieces; ++i)
    if (pos >= me->lo[i] && pos < me->hi[i]) return me->base[i] + (pos - me->lo[i]);
  return -1;
}

/* The plan_k step that runs branch `branch` for head h (its kernel variant), or NULL. */
static const rda_step *ring_step_for(const rda_plan_k *pk, int branch, int h) {
  for (int i = 0; i < pk->nsteps; ++i) {
    const rda_step *s = &pk->steps[i];
    if (s->branch == branch && h >= s->head0 && h < s->head0 + s->nheads) return s;
  }
  return NULL;
}

typedef struct ring_launch {
  const rda_step *step;
  int head0, nheads;
  int64_t seg0, nseg;
  int64_t q_lo, q_hi, row_lo;
  int64_t kv_lo, kv_hi, kv_row_lo;
  int kv_compact;
  const void *k, *v;
  long long k_s[3], v_s[3];
} ring_launch;

static rda_status ring_launch_fwd(const ring_ctx *c, const ring_launch *l, rda_err *err) {
  const rda_plan_k *p = c->pk;
  const rda_fwd_args *a = c->a;
  const rda_step *s = l->step;
  const rda_variant *var = &p->variants[s->kernel];
  const int64_t r = p->cfg.dilations[s->branch];
  const int64_t w = p->cfg.segments[s->branch] < c->n ? p->cfg.segments[s->branch] : c->n;
  /* The single-device parameters over the global sequence, with this launch's K/V. */
  rda_fwd_args ga = *a;
  ga.n = c->n;
  ga.k = l->k;
  ga.v = l->v;
  memcpy(ga.k_s, l->k_s, sizeof ga.k_s);
  memcpy(ga.v_s, l->v_s, sizeof ga.v_s);
  rda_fwd_params fp;
  rda_fwd_params_for_step(p, s, &ga, &fp);
  /* At most ceil(L / r) grid rows fall in L consecutive positions. */
  int64_t rows = ring_ceil_div(w, r);
  const int64_t span = ring_ceil_div(l->q_hi - l->q_lo, r);
  if (span < rows) rows = span;
  fp.tiles_per_seg = (int)ring_ceil_div(rows, var->block_m);
  fp.head0 = l->head0;
  fp.merge = 1;
  if (l->kv_compact) {
    /* Grid rows one after another in the received block. */
    fp.k_rs = fp.k_sn;
    fp.v_rs = fp.v_sn;
    fp.k_sn = fp.v_sn = 0;
  }
  fp.seg0 = l->seg0;
  fp.q_lo = l->q_lo, fp.q_hi = l->q_hi;
  fp.kv_lo = l->kv_lo, fp.kv_hi = l->kv_hi;
  fp.row_lo = l->row_lo;
  fp.kv_row_lo = l->kv_row_lo;
  const long long gx = l->nseg * fp.tiles_per_seg;
  if (gx < 1 || fp.tiles_per_seg < 1) return RDA_OK;
  if (gx > 0x7fffffffLL)
    return rda_err_set(err, RDA_ERR_UNSUPPORTED, "branch %d: grid of %lld blocks is too large",
                       s->branch, gx);
  const unsigned grid[3] = {(unsigned)gx, (unsigned)l->nheads, (unsigned)a->batch};
  return c->b->launch(c->b, c->k->modules[s->kernel], grid, (unsigned)var->threads,
                      (unsigned)var->smem_bytes, &fp, sizeof fp, err);
}

/* Keys and queries both from the rank's own rows: one launch per (branch step, query piece,
 * key piece) over the segments both pieces meet. */
static rda_status ring_own_blocks(const ring_ctx *c, rda_err *err) {
  const rda_plan_k *p = c->pk;
  for (int i = 0; i < p->nsteps; ++i) {
    const rda_step *s = &p->steps[i];
    const int64_t w = p->cfg.segments[s->branch] < c->n ? p->cfg.segments[s->branch] : c->n;
    for (int qp = 0; qp < c->me.npieces; ++qp) {
      for (int kp = 0; kp < c->me.npieces; ++kp) {
        const int64_t qlo = c->me.lo[qp], qhi = c->me.hi[qp];
        const int64_t klo = c->me.lo[kp], khi = c->me.hi[kp];
        if (p->cfg.causal && klo >= qhi) continue; /* keys all in the future */
        const int64_t ma = (qlo / w > klo / w ? qlo / w : klo / w);
        const int64_t mb = ((qhi - 1) / w < (khi - 1) / w ? (qhi - 1) / w : (khi - 1) / w);
        if (ma > mb) continue;
        ring_launch l;
        memset(&l, 0, sizeof l);
        l.step = s;
        l.head0 = s->head0;
        l.nheads = s->nheads;
        l.seg0 = ma;
        l.nseg = mb - ma + 1;
        l.q_lo = qlo, l.q_hi = qhi, l.row_lo = c->me.lo[qp] - c->me.base[qp];
        l.kv_lo = klo, l.kv_hi = khi, l.kv_row_lo = c->me.lo[kp] - c->me.base[kp];
        l.kv_compact = 0;
        l.k = c->a->k;
        l.v = c->a->v;
        memcpy(l.k_s, c->a->k_s, sizeof l.k_s);
        memcpy(l.v_s, c->a->v_s, sizeof l.v_s);
        RDA_TRY(ring_launch_fwd(c, &l, err));
      }
    }
  }
  return RDA_OK;
}

/* Bytes of one transfer for the whole batch: K then V, each [B][rows][nkv][D] 16-bit. */
static size_t ring_xfer_bytes(const rda_ring_xfer *x, long long batch) {
  return (size_t)x->bytes * (size_t)batch;
}

/* Pack a send transfer's rows from the rank's own K/V into dst (host memory). */
static rda_status ring_pack(const ring_ctx *c, const rda_ring_class *cls, const rda_ring_xfer *x,
                            int64_t stride, unsigned char *dst, rda_err *err) {
  const rda_fwd_args *a = c->a;
  const int d = c->pk->cfg.head_dim;
  const size_t row_bytes = (size_t)d * 2;
  for (int kv = 0; kv < 2; ++kv) {
    const uint16_t *src = kv == 0 ? a->k : a->v;
    const long long *st = kv == 0 ? a->k_s : a->v_s;
    for (long long bb = 0; bb < a->batch; ++bb)
      for (int i = 0; i < x->nranges; ++i)
        for (int64_t t = 0; t < x->count[i]; ++t) {
          const int64_t lr = ring_local_row(&c->me, x->first[i] + t * stride);
          if (lr < 0)
            return rda_err_set(err, RDA_ERR_INTERNAL, "ring: row %lld to send is not owned",
                               (long long)(x->first[i] + t * stride));
          for (int h = 0; h < cls->nkv; ++h) {
            const uint16_t *p = src + bb * st[0] + lr * st[1] + (long long)cls->kv_heads[h] * st[2];
            RDA_TRY(c->b->download(c->b, dst, p, row_bytes, err));
            dst += row_bytes;
          }
        }
  }
  return RDA_OK;
}

/* Compute this rank's queries against one received transfer at dev (device memory). */
static rda_status ring_compute_recv(const ring_ctx *c, const rda_ring_step *st,
                                    const rda_ring_class *cls, const rda_ring_xfer *x,
                                    const unsigned char *dev, rda_err *err) {
  const rda_plan_k *p = c->pk;
  const int d = p->cfg.head_dim;
  const long long row_el = (long long)cls->nkv * d; /* elements per received row */
  const long long batch_el = x->rows * row_el;
  const uint16_t *kbase = (const uint16_t *)dev;
  const uint16_t *vbase = kbase + batch_el * c->a->batch;
  const int64_t w = p->cfg.segments[st->branch] < c->n ? p->cfg.segments[st->branch] : c->n;
  const int64_t seg_lo = st->segment * w;
  const int64_t seg_hi = seg_lo + w < c->n ? seg_lo + w : c->n;
  int h0 = 0, hn = 0;
  rda_config_branch_heads(&p->cfg, st->branch, &h0, &hn);
  const int group = p->cfg.heads / p->cfg.kv_heads;
  for (int h = h0; h < h0 + hn; ++h) {
    if (rda_config_offset(&p->cfg, st->branch, h) != cls->offset) continue;
    int slot = -1;
    for (int e = 0; e < cls->nkv; ++e)
      if (cls->kv_heads[e] == h / group) slot = e;
    const rda_step *ks = ring_step_for(p, st->branch, h);
    if (slot < 0 || ks == NULL)
      return rda_err_set(err, RDA_ERR_INTERNAL, "ring: head %d of branch %d has no kv slot", h,
                         st->branch);
    int64_t row0 = 0;
    for (int i = 0; i < x->nranges; row0 += x->count[i], ++i) {
      if (x->count[i] < 1) continue;
      const int64_t kv_lo = x->first[i];
      const int64_t kv_hi = x->first[i] + (x->count[i] - 1) * st->stride + 1;
      for (int qp = 0; qp < c->me.npieces; ++qp) {
        const int64_t qlo = c->me.lo[qp] > seg_lo ? c->me.lo[qp] : seg_lo;
        const int64_t qhi = c->me.hi[qp] < seg_hi ? c->me.hi[qp] : seg_hi;
        if (qlo >= qhi) continue;
        if (p->cfg.causal && kv_lo >= qhi) continue;
        ring_launch l;
        memset(&l, 0, sizeof l);
        l.step = ks;
        l.head0 = h;
        l.nheads = 1;
        l.seg0 = st->segment;
        l.nseg = 1;
        l.q_lo = qlo, l.q_hi = qhi, l.row_lo = c->me.lo[qp] - c->me.base[qp];
        l.kv_lo = kv_lo, l.kv_hi = kv_hi;
        l.kv_compact = 1;
        l.k = kbase + row0 * row_el + (long long)slot * d;
        l.v = vbase + row0 * row_el + (long long)slot * d;
        l.k_s[0] = l.v_s[0] = batch_el;
        l.k_s[1] = l.v_s[1] = row_el;
        l.k_s[2] = l.v_s[2] = 0;
        RDA_TRY(ring_launch_fwd(c, &l, err));
      }
    }
  }
  return RDA_OK;
}

/* Post one step's grouped sends and receives (the sends packed into sbuf first). */
static rda_status ring_post(const ring_ctx *c, const rda_ring_plan *rp, rda_transport *t,
                            const rda_ring_step *st, unsigned char *sbuf, unsigned char *rbuf,
                            rda_err *err) {
  rda_ring_class cls;
  rda_ring_plan_class(rp, st->cls, &cls);
  size_t off = 0;
  for (int q = 0; q < st->nsend; ++q) {
    RDA_TRY(ring_pack(c, &cls, &st->send[q], st->stride, sbuf + off, err));
    off += ring_xfer_bytes(&st->send[q], c->a->batch);
  }
  RDA_TRY(rda_transport_group_start(t, err));
  off = 0;
  for (int q = 0; q < st->nsend; ++q) {
    const size_t n = ring_xfer_bytes(&st->send[q], c->a->batch);
    RDA_TRY(rda_transport_send(t, st->send[q].peer, sbuf + off, n, err));
    off += n;
  }
  off = 0;
  for (int q = 0; q < st->nrecv; ++q) {
    const size_t n = ring_xfer_bytes(&st->recv[q], c->a->batch);
    RDA_TRY(rda_transport_recv(t, st->recv[q].peer, rbuf + off, n, err));
    off += n;
  }
  return rda_transport_group_end(t, err);
}

static size_t ring_sum(const rda_ring_xfer *x, int n, long long batch) {
  size_t s = 0;
  for (int i = 0; i < n; ++i) s += ring_xfer_bytes(&x[i], batch);
  return s;
}

static rda_status ring_run(ring_ctx *c, const rda_ring_plan *rp, int rank, rda_transport *t,
                           rda_ring_run_stats *stats, rda_err *err) {
  rda_ring_step *steps = NULL;
  int64_t nsteps = 0;
  unsigned char *sbuf = NULL, *rbuf = NULL;
  void *dbuf = NULL;
  rda_status s = rda_ring_plan_steps(rp, rank, &steps, &nsteps, err);
  if (s != RDA_OK) return s;
  size_t smax = 0, rmax = 0;
  for (int64_t i = 0; i < nsteps; ++i) {
    const size_t sn = ring_sum(steps[i].send, steps[i].nsend, c->a->batch);
    const size_t rn = ring_sum(steps[i].recv, steps[i].nrecv, c->a->batch);
    if (sn > smax) smax = sn;
    if (rn > rmax) rmax = rn;
  }
  if (smax > 0) sbuf = malloc(smax);
  if (rmax > 0) rbuf = malloc(rmax);
  if ((smax > 0 && sbuf == NULL) || (rmax > 0 && rbuf == NULL)) {
    s = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "rank %d: out of memory for ring buffers", rank);
    goto done;
  }
  if (rmax > 0 && (s = c->b->alloc(c->b, rmax, &dbuf, err)) != RDA_OK) goto done;
  if (stats != NULL) stats->peak_bytes = smax + 2 * rmax;

  /* Step 0's transfer runs while the own blocks are computed; then step i's block is computed
   * while step i+1's transfer is in flight. The received host block is copied to the device
   * block right after its wait, which frees the host block for the next step. */
  if (nsteps > 0 && (s = ring_post(c, rp, t, &steps[0], sbuf, rbuf, err)) != RDA_OK) goto done;
  if ((s = ring_own_blocks(c, err)) != RDA_OK) goto done;
  for (int64_t i = 0; i < nsteps; ++i) {
    if ((s = rda_transport_wait(t, err)) != RDA_OK) goto done;
    const rda_ring_step *st = &steps[i];
    const size_t rn = ring_sum(st->recv, st->nrecv, c->a->batch);
    /* The device block is still read by step i-1's launches on an asynchronous backend. */
    if (rn > 0 && (s = c->b->synchronize(c->b, err)) != RDA_OK) goto done;
    if (rn > 0 && (s = c->b->upload(c->b, dbuf, rbuf, rn, err)) != RDA_OK) goto done;
    if (i + 1 < nsteps && (s = ring_post(c, rp, t, &steps[i + 1], sbuf, rbuf, err)) != RDA_OK)
      goto done;
    rda_ring_class cls;
    rda_ring_plan_class(rp, st->cls, &cls);
    size_t off = 0;
    for (int q = 0; q < st->nrecv; ++q) {
      if ((s = ring_compute_recv(c, st, &cls, &st->recv[q], (const unsigned char *)dbuf + off,
                                 err)) != RDA_OK)
        goto done;
      off += ring_xfer_bytes(&st->recv[q], c->a->batch);
    }
  }
  s = c->b->synchronize(c->b, err);
done:
  /* Abort before the buffers go: a posted transfer must not land in freed memory, and the
   * other ranks must fail instead of waiting for this one. */
  if (s != RDA_OK) rda_transport_abort(t, err != NULL ? err->msg : "a rank failed");
  if (dbuf != NULL) c->b->free(c->b, dbuf);
  free(sbuf);
  free(rbuf);
  free(steps);
  return s;
}

static rda_status ring_check(const rda_backend *b, const rda_ring_plan *rp, int rank,
                             const rda_transport *t, const rda_fwd_args *a, rda_err *err) {
  const rda_ring_rank *rk = rda_ring_plan_rank(rp, rank);
  if (rk == NULL || t->rank != rank || t->size != rda_ring_plan_ranks(rp))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "ring forward: rank %d does not match the plan (%d ranks) or the "
                       "transport (rank %d of %d)",
                       rank, rda_ring_plan_ranks(rp), t->rank, t->size);
  if (a->n != rk->rows)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "ring forward: rank %d owns %lld rows, but the tensors have n = %lld", rank,
                       (long long)rk->rows, a->n);
  if (strcmp(t->vt->name, "host") == 0 && strcmp(b->name, "emu") != 0)
    return rda_err_set(err, RDA_ERR_UNSUPPORTED,
                       "ring forward: the host transport runs only with the emulator backend");
  return RDA_OK;
}

rda_status rda_ring_fwd_run(rda_backend *b, const rda_plan_k *pk, const rda_fwd_kernels *k,
                            const rda_ring_plan *rp, int rank, rda_transport *t,
                            const rda_fwd_args *a, void *workspace, size_t workspace_bytes,
                            rda_ring_run_stats *stats, rda_err *err) {
  (void)workspace;
  (void)workspace_bytes;
  if (b == NULL || pk == NULL || k == NULL || rp == NULL || t == NULL || a == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "ring forward: a NULL argument");
  rda_status s = ring_check(b, rp, rank, t, a, err);
  if (s != RDA_OK) {
    /* The other ranks must not wait for this one. */
    rda_transport_abort(t, err != NULL ? err->msg : "a rank failed");
    return s;
  }
  const rda_ring_rank *rk = rda_ring_plan_rank(rp, rank);
  ring_ctx c;
  memset(&c, 0, sizeof c);
  c.b = b;
  c.pk = pk;
  c.k = k;
  c.a = a;
  c.n = rda_ring_plan_n(rp);
  c.me.npieces = rk->npieces;
  int64_t base = 0;
  for (int i = 0; i < rk->npieces; ++i) {
    c.me.lo[i] = rk->lo[i];
    c.me.hi[i] = rk->hi[i];
    c.me.base[i] = base;
    base += rk->hi[i] - rk->lo[i];
  }
  uint64_t sent0 = 0, recv0 = 0;
  rda_transport_bytes(t, &sent0, &recv0);
  s = rda_fwd_init(b, pk, k, a, err);
  if (s == RDA_OK) s = ring_run(&c, rp, rank, t, stats, err);
  if (s != RDA_OK) {
    rda_transport_abort(t, err != NULL ? err->msg : "a rank failed");
    return s;
  }
  if (stats != NULL) {
    uint64_t sent1 = 0, recv1 = 0;
    rda_transport_bytes(t, &sent1, &recv1);
    stats->rows = rk->rows;
    stats->bytes_sent = sent1 - sent0;
    stats->bytes_received = recv1 - recv0;
  }
  return RDA_OK;
}
