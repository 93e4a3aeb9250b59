/* ring_compute.c — the launches of one ring rank on a block (see ring_compute.h). One
 * enumeration of (branch step, heads, segments, query rows, key rows) serves both passes: the
 * forward launches its kernel on each, the backward its dK/dV and dQ kernels. */
#include "ring_compute.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

/* One launch over a sub-range of the global problem. */
typedef struct ring_launch {
  int step; /* index into pk->steps and pk->bwd_steps (both one per branch, in order) */
  int head0, nheads;
  int64_t seg0, nseg;
  int64_t q_lo, q_hi, row_lo;
  int64_t kv_lo, kv_hi, kv_row_lo;
  /* Keys from a compact block (else the rank's own k, v, dk, dv): grid rows one after another,
   * kv_pitch elements apart, kv_sb elements per batch entry; dk, dv the fp32 block alike. */
  int compact;
  const void *k, *v;
  float *dk, *dv;
  long long kv_sb, kv_pitch, kv_head_stride;
  /* Several classes' blocks at k (and their gradient blocks at dk): the heads' class table
   * (rda_kv_table, head head0 + y at entry y), or NULL. */
  const rda_kv_table *kvt;
} ring_launch;

typedef rda_status (*ring_launch_fn)(const ring_ctx *c, const ring_launch *l, rda_err *err);

static int64_t ring_ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

static int64_t ring_w(const ring_ctx *c, int branch) {
  return c->pk->cfg.segments[branch] < c->n ? c->pk->cfg.segments[branch] : c->n;
}

rda_status ring_ctx_init(ring_ctx *c, const rda_ring_plan *rp, int rank, rda_err *err) {
  const rda_ring_rank *rk = rda_ring_plan_rank(rp, rank);
  if (rk == NULL) return rda_err_set(err, RDA_ERR_INTERNAL, "ring: no rank %d in the plan", rank);
  c->rp = rp;
  c->n = rda_ring_plan_n(rp);
  c->me.npieces = rk->npieces;
  int64_t base = 0;
  for (int i = 0; i < rk->npieces; ++i) {
    c->me.lo[i] = rk->lo[i];
    c->me.hi[i] = rk->hi[i];
    c->me.base[i] = base;
    base += rk->hi[i] - rk->lo[i];
  }
  if (c->pk->has_bwd)
    for (int i = 0; i < c->pk->nsteps; ++i)
      if (c->pk->bwd_steps[i].branch != c->pk->steps[i].branch ||
          c->pk->bwd_steps[i].head0 != c->pk->steps[i].head0 ||
          c->pk->bwd_steps[i].nheads != c->pk->steps[i].nheads)
        return rda_err_set(err, RDA_ERR_INTERNAL, "ring: backward step %d differs from forward",
                           i);
  return RDA_OK;
}

/* --- the rows of a transfer ---------------------------------------------------------------- */

/* The piece holding global row pos, or -1. */
static int ring_piece(const ring_rank *me, int64_t pos) {
  for (int i = 0; i < me->npieces; ++i)
    if (pos >= me->lo[i] && pos < me->hi[i]) return i;
  return -1;
}

rda_status ring_rows_for(const ring_ctx *c, const rda_ring_xfer *x, int64_t stride,
                         const rda_ring_class *cls, rda_ring_rows_params *rows, rda_err *err) {
  memset(rows, 0, sizeof *rows);
  rows->batch = c->batch;
  rows->rows = x->rows;
  rows->stride = stride;
  rows->nranges = x->nranges;
  rows->head_dim = c->pk->cfg.head_dim;
  rows->nkv_total = cls->nkv;
  for (int i = 0; i < x->nranges; ++i) {
    rows->count[i] = x->count[i];
    if (x->count[i] < 1) continue;
    const int64_t last = x->first[i] + (x->count[i] - 1) * stride;
    const int p = ring_piece(&c->me, x->first[i]);
    if (p < 0 || ring_piece(&c->me, last) != p)
      return rda_err_set(err, RDA_ERR_INTERNAL,
                         "ring: rows %lld..%lld of a transfer are not in one owned piece",
                         (long long)x->first[i], (long long)last);
    rows->first[i] = c->me.base[p] + (x->first[i] - c->me.lo[p]);
  }
  return RDA_OK;
}

void ring_rows_set_kv(const ring_ctx *c, rda_ring_rows_params *rows) {
  const rda_fwd_args *f = c->fa;
  const rda_bwd_args *b = c->ba;
  /* The pack only reads k, v; the parameter block is shared with the adder, which writes. */
  rows->k = (void *)(uintptr_t)(f != NULL ? f->k : b->k);
  rows->v = (void *)(uintptr_t)(f != NULL ? f->v : b->v);
  const long long *ks = f != NULL ? f->k_s : b->k_s;
  const long long *vs = f != NULL ? f->v_s : b->v_s;
  rows->k_sb = ks[0], rows->k_sn = ks[1], rows->k_sh = ks[2];
  rows->v_sb = vs[0], rows->v_sn = vs[1], rows->v_sh = vs[2];
}

void ring_rows_set_grads(const ring_ctx *c, rda_ring_rows_params *rows) {
  const rda_bwd_args *b = c->ba;
  rows->k = b->dk;
  rows->v = b->dv;
  rows->k_sb = b->dk_s[0], rows->k_sn = b->dk_s[1], rows->k_sh = b->dk_s[2];
  rows->v_sb = b->dv_s[0], rows->v_sn = b->dv_s[1], rows->v_sh = b->dv_s[2];
}

/* --- the launches -------------------------------------------------------------------------- */

static rda_status ring_launch_fwd(const ring_ctx *c, const ring_launch *l, rda_err *err) {
  const rda_plan_k *p = c->pk;
  const rda_step *s = &p->steps[l->step];
  const int kernel = l->kvt != NULL ? s->ring_kernel : s->kernel;
  if (kernel < 0)
    return rda_err_set(err, RDA_ERR_INTERNAL, "ring: branch %d has no kv-table kernel", s->branch);
  const rda_variant *var = &p->variants[kernel];
  const int64_t w = ring_w(c, s->branch), r = p->cfg.dilations[s->branch];
  /* The single-device parameters over the global sequence, then this launch's ranges. */
  rda_fwd_args ga = *c->fa;
  ga.n = c->n;
  rda_fwd_params fp;
  rda_fwd_params_for_step(p, s, &ga, &fp);
  if (l->compact) {
    fp.k = l->k;
    fp.v = l->v;
    fp.k_sb = fp.v_sb = l->kv_sb;
    fp.k_sn = fp.v_sn = 0;
    fp.k_sh = fp.v_sh = l->kv_head_stride;
    fp.k_rs = fp.v_rs = l->kv_pitch;
  }
  if (l->kvt != NULL) fp.kvt = *l->kvt;
  /* At most ceil(L / r) grid rows fall in L consecutive positions. */
  int64_t rows = ring_ceil_div(w, r);
  const int64_t span = ring_ceil_div(l->q_hi - l->q_lo, r);
  if (span < rows) rows = span;
  fp.tiles_per_seg = (int)ring_ceil_div(rows, var->block_m);
  fp.head0 = l->head0;
  fp.merge = 1;
  fp.seg0 = l->seg0;
  fp.q_lo = l->q_lo, fp.q_hi = l->q_hi, fp.row_lo = l->row_lo;
  fp.kv_lo = l->kv_lo, fp.kv_hi = l->kv_hi, fp.kv_row_lo = l->kv_row_lo;
  const long long gx = l->nseg * fp.tiles_per_seg;
  if (gx < 1 || fp.tiles_per_seg < 1) return RDA_OK;
  if (gx > 0x7fffffffLL)
    return rda_err_set(err, RDA_ERR_UNSUPPORTED, "branch %d: grid of %lld blocks is too large",
                       s->branch, gx);
  const unsigned grid[3] = {(unsigned)gx, (unsigned)l->nheads, (unsigned)c->batch};
  return c->b->launch(c->b, c->k->modules[kernel], grid, (unsigned)var->threads,
                      (unsigned)var->smem_bytes, &fp, sizeof fp, err);
}

/* dK/dV then dQ of one launch; deterministic (plain read-modify-writes in stream order). */
static rda_status ring_launch_bwd(const ring_ctx *c, const ring_launch *l, rda_err *err) {
  const rda_plan_k *p = c->pk;
  const rda_bwd_step *s = &p->bwd_steps[l->step];
  rda_bwd_args ga = *c->ba;
  ga.n = c->n;
  rda_bwd_params bp;
  rda_bwd_params_for_step(p, s, &ga, &bp);
  /* Dp (the workspace) holds the rank's rows only, like lse. */
  bp.dp_sb = (long long)p->cfg.heads * c->ba->n;
  bp.dp_sh = c->ba->n;
  if (l->compact) {
    bp.k = l->k;
    bp.v = l->v;
    bp.dk = l->dk;
    bp.dv = l->dv;
    bp.k_sb = bp.v_sb = bp.dk_sb = bp.dv_sb = l->kv_sb;
    bp.k_sn = bp.v_sn = bp.dk_sn = bp.dv_sn = 0;
    bp.k_sh = bp.v_sh = bp.dk_sh = bp.dv_sh = l->kv_head_stride;
    bp.k_rs = bp.v_rs = bp.dk_rs = bp.dv_rs = l->kv_pitch;
  }
  bp.head0 = l->head0;
  bp.nheads = l->nheads;
  bp.seg0 = l->seg0;
  bp.q_lo = l->q_lo, bp.q_hi = l->q_hi, bp.row_lo = l->row_lo;
  bp.kv_lo = l->kv_lo, bp.kv_hi = l->kv_hi, bp.kv_row_lo = l->kv_row_lo;
  if (l->kvt == NULL) {
    RDA_TRY(rda_bwd_launch_dkdv(c->b, p, c->k, s, &bp, l->nseg, c->batch, 0, err));
    return rda_bwd_launch_dq(c->b, p, c->k, s, &bp, l->nseg, c->batch, err);
  }
  /* The kv-table twins. dK/dV blocks read-modify-write their (class, slot)'s rows, so heads
   * sharing one (GQA) go in successive launches: launch `layer` takes each pair's layer-th head,
   * in head order, as the per-class launches (one per group member, ascending) would. */
  const rda_kv_table *t = l->kvt;
  int layer[RDA_KV_TABLE_HEADS], nlayers = 0;
  for (int y = 0; y < l->nheads; ++y) {
    layer[y] = 0;
    if (t->cls[y] < 0) continue;
    for (int x = 0; x < y; ++x)
      if (t->cls[x] == t->cls[y] && t->slot[x] == t->slot[y]) ++layer[y];
    if (layer[y] + 1 > nlayers) nlayers = layer[y] + 1;
  }
  bp.kvt.kv = *t;
  for (int ly = 0; ly < nlayers; ++ly) {
    int ne = 0;
    for (int y = 0; y < l->nheads; ++y) {
      if (t->cls[y] < 0 || layer[y] != ly) continue;
      bp.kvt.kv.cls[ne] = t->cls[y];
      bp.kvt.kv.slot[ne] = t->slot[y];
      bp.kvt.head[ne] = (unsigned char)y;
      ++ne;
    }
    RDA_TRY(rda_bwd_launch_dkdv_table(c->b, p, c->k, s, &bp, l->nseg, c->batch, ne, err));
  }
  bp.kvt.kv = *t;
  return rda_bwd_launch_dq_table(c->b, p, c->k, s, &bp, l->nseg, c->batch, err);
}

/* --- what runs on a block ------------------------------------------------------------------ */

/* Own rows: one launch per (branch step, query piece, key piece) over the segments both pieces
 * meet; causal skips key pieces wholly in the future. */
static rda_status ring_own(const ring_ctx *c, ring_launch_fn fn, rda_err *err) {
  const rda_plan_k *p = c->pk;
  for (int i = 0; i < p->nsteps; ++i) {
    const int64_t w = ring_w(c, p->steps[i].branch);
    for (int qp = 0; qp < c->me.npieces; ++qp) {
      for (int kp = 0; kp < c->me.npieces; ++kp) {
        const int64_t qlo = c->me.lo[qp], qhi = c->me.hi[qp];
        const int64_t klo = c->me.lo[kp], khi = c->me.hi[kp];
        if (p->cfg.causal && klo >= qhi) continue;
        const int64_t ma = qlo / w > klo / w ? qlo / w : klo / w;
        const int64_t mb = (qhi - 1) / w < (khi - 1) / w ? (qhi - 1) / w : (khi - 1) / w;
        if (ma > mb) continue;
        ring_launch l;
        memset(&l, 0, sizeof l);
        l.step = i;
        l.head0 = p->steps[i].head0;
        l.nheads = p->steps[i].nheads;
        l.seg0 = ma;
        l.nseg = mb - ma + 1;
        l.q_lo = qlo, l.q_hi = qhi, l.row_lo = qlo - c->me.base[qp];
        l.kv_lo = klo, l.kv_hi = khi, l.kv_row_lo = klo - c->me.base[kp];
        RDA_TRY(fn(c, &l, err));
      }
    }
  }
  return RDA_OK;
}

/* The step index of branch `branch` holding head h, or -1. */
static int ring_step_of(const rda_plan_k *p, int branch, int h) {
  for (int i = 0; i < p->nsteps; ++i) {
    const rda_step *s = &p->steps[i];
    if (s->branch == branch && h >= s->head0 && h < s->head0 + s->nheads) return i;
  }
  return -1;
}

/* Point at kv head `kvh`'s slot of a compact block through a base that the kernels offset by
 * kvh * head_stride again (kvh absolute, as the kernels compute it). Integer arithmetic: the
 * base itself may lie before the block. */
static const void *ring_slot_base(const void *slot_ptr, int kvh, long long head_stride,
                                  size_t elem) {
  return (const void *)((uintptr_t)slot_ptr - (uintptr_t)kvh * (uintptr_t)head_stride * elem);
}

/* A launch on a received block (compact = 1) of step st's segment: the queries of the rank's
 * piece qp inside the segment against the keys at positions [kv_lo, kv_hi). Returns 0 (nothing
 * to launch) when the piece has no rows in the segment or, causal, all those keys lie in its
 * future; the caller fills the heads, the kernel step and the block pointers. */
static int ring_block_launch(const ring_ctx *c, const rda_ring_step *st, int qp, int64_t kv_lo,
                             int64_t kv_hi, ring_launch *l) {
  const int64_t w = ring_w(c, st->branch);
  const int64_t seg_lo = st->segment * w, seg_hi = seg_lo + w < c->n ? seg_lo + w : c->n;
  const int64_t qlo = c->me.lo[qp] > seg_lo ? c->me.lo[qp] : seg_lo;
  const int64_t qhi = c->me.hi[qp] < seg_hi ? c->me.hi[qp] : seg_hi;
  if (qlo >= qhi || (c->pk->cfg.causal && kv_lo >= qhi)) return 0;
  memset(l, 0, sizeof *l);
  l->seg0 = st->segment;
  l->nseg = 1;
  l->q_lo = qlo, l->q_hi = qhi, l->row_lo = c->me.lo[qp] - c->me.base[qp];
  l->kv_lo = kv_lo, l->kv_hi = kv_hi;
  l->compact = 1;
  return 1;
}

/* The end of the run of heads that starts at head h of class cls in step `step`: consecutive
 * heads of that class and step whose kv heads sit in consecutive slots of the block (all heads
 * when the offset rule gives the class consecutive heads: r = 1, the block and group rules), so
 * one launch covers them. *slot gets h's slot. */
static int ring_run_end(const rda_plan_k *p, const rda_ring_step *st, const rda_ring_class *cls,
                        int h, int h_end, int step, int *slot) {
  const int group = p->cfg.heads / p->cfg.kv_heads;
  *slot = -1;
  for (int e = 0; e < cls->nkv; ++e)
    if (cls->kv_heads[e] == h / group) *slot = e;
  int end = h + 1;
  while (end < h_end && rda_config_offset(&p->cfg, st->branch, end) == cls->offset &&
         ring_step_of(p, st->branch, end) == step) {
    const int kvh = end / group, e = *slot + (kvh - h / group);
    if (e >= cls->nkv || cls->kv_heads[e] != kvh) break;
    ++end;
  }
  return end;
}

/* A received transfer: per range of the transfer, per query piece inside the step's segment,
 * per run of query heads of the class (ring_run_end), in that order: every dK/dV row then gets
 * its heads' additions range by range, piece by piece, heads ascending, as a kv-table round
 * gives them (ring_table), so results do not depend on the bundles. */
static rda_status ring_received(const ring_ctx *c, const rda_ring_step *st,
                                const rda_ring_class *cls, const rda_ring_xfer *x,
                                const unsigned char *kv, unsigned char *grads, ring_launch_fn fn,
                                rda_err *err) {
  const rda_plan_k *p = c->pk;
  const int d = p->cfg.head_dim;
  const long long pitch = (long long)cls->nkv * d; /* elements per block row */
  const long long batch_el = x->rows * pitch;
  const uint16_t *kb = (const uint16_t *)kv, *vb = kb + batch_el * c->batch;
  float *gk = (float *)grads, *gv = grads != NULL ? gk + batch_el * c->batch : NULL;
  int h0 = 0, hn = 0;
  rda_config_branch_heads(&p->cfg, st->branch, &h0, &hn);
  const int group = p->cfg.heads / p->cfg.kv_heads;
  int64_t row0 = 0;
  for (int i = 0; i < x->nranges; row0 += x->count[i], ++i) {
    if (x->count[i] < 1) continue;
    const int64_t kv_lo = x->first[i];
    const int64_t kv_hi = x->first[i] + (x->count[i] - 1) * st->stride + 1;
    for (int qp = 0; qp < c->me.npieces; ++qp) {
      ring_launch l;
      if (!ring_block_launch(c, st, qp, kv_lo, kv_hi, &l)) continue;
      for (int h = h0; h < h0 + hn;) {
        if (rda_config_offset(&p->cfg, st->branch, h) != cls->offset) {
          ++h;
          continue;
        }
        const int step = ring_step_of(p, st->branch, h);
        int slot = -1;
        const int end = ring_run_end(p, st, cls, h, h0 + hn, step, &slot);
        if (slot < 0 || step < 0)
          return rda_err_set(err, RDA_ERR_INTERNAL, "ring: head %d of branch %d has no kv slot",
                             h, st->branch);
        const int kvh0 = h / group;
        const long long at = row0 * pitch + (long long)slot * d;
        l.step = step;
        l.head0 = h;
        l.nheads = end - h;
        l.k = ring_slot_base(kb + at, kvh0, d, sizeof *kb);
        l.v = ring_slot_base(vb + at, kvh0, d, sizeof *vb);
        l.dk = gk != NULL ? (float *)(uintptr_t)ring_slot_base(gk + at, kvh0, d, sizeof *gk) : NULL;
        l.dv = gv != NULL ? (float *)(uintptr_t)ring_slot_base(gv + at, kvh0, d, sizeof *gv) : NULL;
        l.kv_sb = batch_el;
        l.kv_pitch = pitch;
        l.kv_head_stride = d;
        RDA_TRY(fn(c, &l, err));
        h = end;
      }
    }
  }
  return RDA_OK;
}

/* --- a round's received blocks, the forward pass ------------------------------------------- */

/* One receive of a round: step st's transfer x, its block at byte `at` of the round's block. */
struct ring_recv {
  const rda_ring_step *st;
  const rda_ring_xfer *x;
  rda_ring_class cls;
  size_t at;
};

rda_status ring_round_scratch_init(ring_round_scratch *s, int cap, rda_err *err) {
  memset(s, 0, sizeof *s);
  if (cap < 1) return RDA_OK;
  s->recv = calloc((size_t)cap, sizeof *s->recv);
  s->members = calloc((size_t)cap, sizeof *s->members);
  s->done = calloc((size_t)cap, 1);
  if (s->recv == NULL || s->members == NULL || s->done == NULL) {
    ring_round_scratch_free(s);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring: out of memory for a round");
  }
  s->cap = cap;
  return RDA_OK;
}

void ring_round_scratch_free(ring_round_scratch *s) {
  free(s->recv);
  free(s->members);
  free(s->done);
  memset(s, 0, sizeof *s);
}

/* Whether the grid rows of class offset j in [lo, hi) of segment a are exactly range i of x:
 * then a launch over key positions [lo, hi) reads this class's block from its first row. */
static int ring_rows_exact(int64_t a, int64_t j, int64_t r, int64_t lo, int64_t hi,
                           const rda_ring_xfer *x, int i) {
  const int64_t g = a + j;
  const int64_t t0 = lo <= g ? 0 : ring_ceil_div(lo - g, r);
  const int64_t t1 = hi <= g ? 0 : ring_ceil_div(hi - g, r);
  return g + t0 * r == x->first[i] && t1 - t0 == x->count[i];
}

/* Whether branch `branch` has kv-table twins for the pass in every kernel step. */
static int ring_has_twins(const ring_ctx *c, int branch, int backward) {
  const rda_plan_k *p = c->pk;
  for (int si = 0; si < p->nsteps; ++si) {
    if (p->steps[si].branch != branch) continue;
    if (backward ? p->bwd_steps[si].dkdv_ring_kernel < 0 || p->bwd_steps[si].dq_ring_kernel < 0
                 : p->steps[si].ring_kernel < 0)
      return 0;
  }
  return 1;
}

/* The table of the heads [hc, he) of kernel step ks that read one of the receives m[0..nm)
 * (one peer, same ranges, same nkv), for range i: *first and *last the first and last such
 * head (*first = -1: none). */
static rda_status ring_chunk_table(const ring_ctx *c, ring_recv *const *m, int nm, int hc,
                                   int he, int i, rda_kv_table *t, int *first, int *last,
                                   rda_err *err) {
  const rda_plan_k *p = c->pk;
  const rda_ring_step *st = m[0]->st;
  const int d = p->cfg.head_dim, group = p->cfg.heads / p->cfg.kv_heads;
  int mof[RDA_KV_TABLE_HEADS], slot[RDA_KV_TABLE_HEADS];
  *first = *last = -1;
  for (int h = hc; h < he; ++h) {
    mof[h - hc] = -1;
    const int64_t j = rda_config_offset(&p->cfg, st->branch, h);
    for (int u = 0; u < nm && mof[h - hc] < 0; ++u) {
      if (m[u]->cls.offset != j) continue;
      for (int e = 0; e < m[u]->cls.nkv; ++e)
        if (m[u]->cls.kv_heads[e] == h / group) mof[h - hc] = u, slot[h - hc] = e;
      if (mof[h - hc] < 0)
        return rda_err_set(err, RDA_ERR_INTERNAL, "ring: head %d of branch %d has no kv slot", h,
                           st->branch);
    }
    if (mof[h - hc] < 0) continue;
    if (*first < 0) *first = h;
    *last = h;
  }
  if (*first < 0) return RDA_OK;
  /* Table classes: the receives these heads use, numbered in order of first use. */
  memset(t, 0, sizeof *t);
  int tcls[RDA_KV_TABLE_HEADS], ncls = 0; /* table class -> receive */
  for (int h = *first; h <= *last; ++h) {
    const int u = mof[h - hc], y = h - *first;
    if (u < 0) {
      t->cls[y] = -1;
      continue;
    }
    int k = 0;
    while (k < ncls && tcls[k] != u) ++k;
    if (k == ncls) tcls[ncls++] = u;
    t->cls[y] = (signed char)k;
    t->slot[y] = (unsigned char)slot[h - hc];
  }
  for (int k = 0; k < ncls; ++k) {
    const ring_recv *rv = m[tcls[k]];
    int64_t row0 = 0; /* rows of the ranges before range i */
    for (int q = 0; q < i; ++q) row0 += rv->x->count[q];
    t->rows[k] = (int)rv->x->rows;
    t->at[k] = (long long)(rv->at * (size_t)c->batch / sizeof(uint16_t)) + row0 * rv->cls.nkv * d;
  }
  return RDA_OK;
}

/* The receives m[0..nm) (one peer, same ranges, same nkv) in kv-table launches: per kernel step,
 * range, query piece and chunk of RDA_KV_TABLE_HEADS heads, in that order (ring_received's, so
 * every dK/dV row gets its heads' additions in the same order whatever the bundles). Class
 * blocks in blk (16-bit) and, backward, their fp32 gradient blocks in grads (each class's at the
 * same element offset as its K/V block: twice the byte offset). */
static rda_status ring_table(const ring_ctx *c, ring_recv *const *m, int nm, const int64_t lo[2],
                             const int64_t hi[2], const unsigned char *blk, unsigned char *grads,
                             ring_launch_fn fn, rda_err *err) {
  const rda_plan_k *p = c->pk;
  const rda_ring_step *st = m[0]->st;
  const int d = p->cfg.head_dim;
  for (int si = 0; si < p->nsteps; ++si) {
    const rda_step *ks = &p->steps[si];
    if (ks->branch != st->branch) continue;
    for (int i = 0; i < m[0]->x->nranges; ++i)
      for (int qp = 0; qp < c->me.npieces; ++qp) {
        ring_launch l;
        if (!ring_block_launch(c, st, qp, lo[i], hi[i], &l)) continue;
        for (int hc = ks->head0; hc < ks->head0 + ks->nheads; hc += RDA_KV_TABLE_HEADS) {
          const int he = hc + RDA_KV_TABLE_HEADS < ks->head0 + ks->nheads
                             ? hc + RDA_KV_TABLE_HEADS
                             : ks->head0 + ks->nheads;
          rda_kv_table t;
          int first = -1, last = -1;
          RDA_TRY(ring_chunk_table(c, m, nm, hc, he, i, &t, &first, &last, err));
          if (first < 0) continue;
          l.step = si;
          l.head0 = first;
          l.nheads = last - first + 1;
          l.k = l.v = blk;
          l.dk = l.dv = (float *)grads;
          l.kv_pitch = (long long)m[0]->cls.nkv * d; /* the same for every class (nkv) */
          l.kvt = &t;
          RDA_TRY(fn(c, &l, err));
        }
      }
  }
  return RDA_OK;
}

/* Both passes' rounds (grads NULL: the forward): receives grouped by peer, ranges and nkv into
 * table launches where every class's rows are exact, else one class at a time. */
static rda_status ring_round(const ring_ctx *c, const rda_ring_step *steps, int n,
                             const uint64_t (*recv_at)[2], const unsigned char *blk,
                             unsigned char *grads, ring_round_scratch *scratch, rda_err *err) {
  const ring_launch_fn fn = grads != NULL ? ring_launch_bwd : ring_launch_fwd;
  int nr = 0;
  for (int k = 0; k < n; ++k) nr += steps[k].nrecv;
  if (nr == 0) return RDA_OK;
  if (nr > scratch->cap)
    return rda_err_set(err, RDA_ERR_INTERNAL, "ring: a round of %d receives, scratch for %d", nr,
                       scratch->cap);
  ring_recv *rv = scratch->recv;
  ring_recv **m = scratch->members;
  unsigned char *done = scratch->done;
  memset(done, 0, (size_t)nr);
  rda_status s = RDA_OK;
  nr = 0;
  for (int k = 0; k < n; ++k)
    for (int q = 0; q < steps[k].nrecv; ++q, ++nr) {
      rv[nr].st = &steps[k];
      rv[nr].x = &steps[k].recv[q];
      rda_ring_plan_class(c->rp, steps[k].cls, &rv[nr].cls);
      rv[nr].at = (size_t)recv_at[k][q];
    }
  const rda_config *cfg = &c->pk->cfg;
  for (int u = 0; u < nr && s == RDA_OK; ++u) {
    if (done[u]) continue;
    /* The receives from u's peer over the same ranges with as many kv heads: one launch covers
     * them when each class's grid rows in the union of the ranges are exactly its own rows. */
    const rda_ring_step *st = rv[u].st;
    const int64_t a = st->segment * ring_w(c, st->branch), r = st->stride;
    int nm = 0, exact = cfg->kv_heads <= 256 && ring_has_twins(c, st->branch, grads != NULL);
    int64_t lo[2] = {0, 0}, hi[2] = {0, 0};
    for (int v = u; v < nr; ++v) {
      if (done[v] || rv[v].x->peer != rv[u].x->peer || rv[v].x->nranges != rv[u].x->nranges ||
          rv[v].cls.nkv != rv[u].cls.nkv)
        continue;
      m[nm++] = &rv[v];
      for (int i = 0; i < rv[v].x->nranges; ++i) {
        const int64_t f = rv[v].x->first[i], e = f + (rv[v].x->count[i] - 1) * r + 1;
        if (nm == 1 || f < lo[i]) lo[i] = f;
        if (nm == 1 || e > hi[i]) hi[i] = e;
      }
      if (rv[v].x->rows > INT_MAX) exact = 0;
    }
    for (int x = 0; x < nm && exact; ++x)
      for (int i = 0; i < m[x]->x->nranges; ++i)
        if (!ring_rows_exact(a, m[x]->cls.offset, r, lo[i], hi[i], m[x]->x, i)) exact = 0;
    if (nm > 1 && exact) {
      s = ring_table(c, m, nm, lo, hi, blk, grads, fn, err);
      for (int x = 0; x < nm; ++x) done[m[x] - rv] = 1;
      continue;
    }
    const size_t at = rv[u].at * (size_t)c->batch;
    s = ring_received(c, st, &rv[u].cls, rv[u].x, blk + at, grads != NULL ? grads + 2 * at : NULL,
                      fn, err);
    done[u] = 1;
  }
  return s;
}

rda_status ring_fwd_received_round(const ring_ctx *c, const rda_ring_step *steps, int n,
                                   const uint64_t (*recv_at)[2], const unsigned char *blk,
                                   ring_round_scratch *scratch, rda_err *err) {
  return ring_round(c, steps, n, recv_at, blk, NULL, scratch, err);
}

rda_status ring_bwd_received_round(const ring_ctx *c, const rda_ring_step *steps, int n,
                                   const uint64_t (*recv_at)[2], const unsigned char *blk,
                                   unsigned char *grads, ring_round_scratch *scratch, rda_err *err) {
  if (grads == NULL)
    return rda_err_set(err, RDA_ERR_INTERNAL, "ring backward: a round without gradient blocks");
  return ring_round(c, steps, n, recv_at, blk, grads, scratch, err);
}

rda_status ring_fwd_own(const ring_ctx *c, rda_err *err) {
  return ring_own(c, ring_launch_fwd, err);
}

rda_status ring_bwd_own(const ring_ctx *c, rda_err *err) {
  return ring_own(c, ring_launch_bwd, err);
}

