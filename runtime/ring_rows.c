/* ring_rows.c — launchers of the ring's row kernels (templates/rda_ring.cuh): check each
 * transfer's rows once, then launch the plan's ring_pack or ring_add variant over entries (a
 * transfer's chunks of at most RDA_RING_ROWS_MAX_HEADS kv heads), as many per launch as fit,
 * grid-stride with the grid capped to what fills the device. */
#include "ring_rows.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

/* Resident blocks per SM we size the grid for; the kernels loop over whatever remains. */
enum { kBlocksPerSm = 8, kFallbackBlocks = 1024 };

static long long ring_rows_min(long long a, long long b) {
  return a < b ? a : b;
}

/* Everything the kernels assume about `r` (rda_params.h), for either direction: `what` names
 * the call in messages, `elem` is the byte size of a k/v element (2: pack, 4: add), and `add`
 * also asks for distinct kv heads (each destination row is read-modify-written by one thread). */
static rda_status ring_rows_check(const char *what, const rda_plan_k *p,
                                  const rda_ring_rows_params *r, const int *kv_heads, int elem,
                                  int add, rda_err *err) {
  if (r->nranges < 1 || r->nranges > 2)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: nranges = %d: must be 1 or 2", what,
                       r->nranges);
  if (r->stride < 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: stride = %lld: must be >= 1", what,
                       r->stride);
  long long sum = 0;
  for (int i = 0; i < r->nranges; ++i) {
    if (r->count[i] < 0)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: count[%d] = %lld: must be >= 0", what,
                         i, r->count[i]);
    if (r->count[i] > 0 && r->first[i] < 0)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "%s: first[%d] = %lld: a local row must be >= 0", what, i, r->first[i]);
    if (r->count[i] > 0 && (r->count[i] - 1) > (LLONG_MAX / 4 - r->first[i]) / r->stride)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "%s: range %d: row %lld + (%lld - 1) x %lld overflows", what, i,
                         r->first[i], r->count[i], r->stride);
    if (r->count[i] > LLONG_MAX / 4 - sum)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: count[%d] = %lld is too large", what,
                         i, r->count[i]);
    sum += r->count[i];
  }
  if (r->rows != sum)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: rows = %lld: must equal the sum of the %d range counts (%lld)", what,
                       r->rows, r->nranges, sum);
  if (r->batch < 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: batch = %lld: must be >= 1", what,
                       r->batch);
  if (r->nkv_total < 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: nkv_total = %d: must be >= 1", what,
                       r->nkv_total);
  if (r->head_dim < 8 || r->head_dim % 8 != 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: head_dim = %d: must be a positive multiple of 8", what, r->head_dim);
  /* The block's element count (both halves) must fit the kernels' 64-bit index math. */
  const long long row_el = (long long)r->nkv_total * r->head_dim;
  if (r->rows > 0 && r->batch > LLONG_MAX / 2 / row_el / r->rows)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: batch %lld x rows %lld x %d kv heads x %d: the block is too large",
                       what, r->batch, r->rows, r->nkv_total, r->head_dim);
  if (r->rows == 0) return RDA_OK; /* nothing is read or written */

  if (r->k == NULL || r->v == NULL || r->block == NULL || kv_heads == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: k, v, block and kv_heads must not be NULL (rows = %lld)", what,
                       r->rows);
  /* 16-byte vectors: 8 16-bit or 4 fp32 elements. */
  const int vec = 16 / elem;
  const struct {
    const char *name;
    const void *ptr;
    long long s[3];
  } t[3] = {{"k", r->k, {r->k_sb, r->k_sn, r->k_sh}},
            {"v", r->v, {r->v_sb, r->v_sn, r->v_sh}},
            {"block", r->block, {0, 0, 0}}};
  for (int i = 0; i < 3; ++i) {
    if ((uintptr_t)t[i].ptr % 16 != 0)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: %s: pointer %p is not 16-byte aligned",
                         what, t[i].name, t[i].ptr);
    for (int d = 0; d < 3; ++d)
      if (t[i].s[d] % vec != 0)
        return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                           "%s: %s: stride %d = %lld elements is not a multiple of %d (16 bytes)",
                           what, t[i].name, d, t[i].s[d], vec);
  }
  /* Two ranges of one stride meet when their rows are congruent and their spans overlap. */
  if (add && r->nranges == 2 && r->count[0] > 0 && r->count[1] > 0 &&
      (r->first[1] - r->first[0]) % r->stride == 0 &&
      r->first[0] <= r->first[1] + (r->count[1] - 1) * r->stride &&
      r->first[1] <= r->first[0] + (r->count[0] - 1) * r->stride)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: ranges [%lld, +%lld) and [%lld, +%lld) with stride %lld share rows",
                       what, r->first[0], r->count[0], r->first[1], r->count[1], r->stride);
  for (int e = 0; e < r->nkv_total; ++e) {
    if (kv_heads[e] < 0 || kv_heads[e] >= p->cfg.kv_heads)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "%s: kv_heads[%d] = %d: the config has kv heads 0..%d", what, e,
                         kv_heads[e], p->cfg.kv_heads - 1);
    for (int f = 0; add && f < e; ++f)
      if (kv_heads[f] == kv_heads[e])
        return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                           "%s: kv_heads[%d] and kv_heads[%d] are both %d: the heads must differ",
                           what, f, e, kv_heads[e]);
  }
  return RDA_OK;
}

/* Whether entries x (kv heads hx) and y (hy) of an adder launch could write one element: a
 * shared kv head and a shared local row (ranges of one stride meet when congruent and their
 * spans overlap). Conservative: any shared head with meeting ranges. */
static int ring_rows_conflict(const rda_ring_rows_params *x, const int *hx, int nx,
                              const rda_ring_rows_params *y, const int *hy, int ny) {
  int shared = 0;
  for (int a = 0; a < nx && !shared; ++a)
    for (int c = 0; c < ny && !shared; ++c) shared = hx[a] == hy[c];
  if (!shared) return 0;
  const long long s = x->stride;
  for (int i = 0; i < x->nranges; ++i)
    for (int j = 0; j < y->nranges; ++j) {
      if (x->count[i] < 1 || y->count[j] < 1) continue;
      const long long xl = x->first[i], xh = xl + (x->count[i] - 1) * s;
      const long long yl = y->first[j], yh = yl + (y->count[j] - 1) * s;
      if ((yl - xl) % s == 0 && xl <= yh && yl <= xh) return 1;
    }
  return 0;
}

/* Whether transfer y may share a launch with transfer x: the same tensors and shape. */
static int ring_rows_same_launch(const rda_ring_rows_params *x, const rda_ring_rows_params *y) {
  return x->k == y->k && x->v == y->v && x->k_sb == y->k_sb && x->k_sn == y->k_sn &&
         x->k_sh == y->k_sh && x->v_sb == y->v_sb && x->v_sn == y->v_sn && x->v_sh == y->v_sh &&
         x->batch == y->batch && x->stride == y->stride && x->head_dim == y->head_dim;
}

/* The open launch of ring_rows_run: its parameter block, the kv heads it holds (lp.kv[0..kv))
 * and its largest entry, in vectors. */
typedef struct ring_rows_batch {
  rda_backend *b;
  rda_module *module;
  unsigned threads;
  long long cap; /* blocks that fill the device */
  int kv;
  long long most;
  rda_ring_rows_launch lp;
} ring_rows_batch;

/* Launch the open entries, if any, and start an empty launch. */
static rda_status ring_rows_flush(ring_rows_batch *lb, rda_err *err) {
  if (lb->lp.nentries == 0) return RDA_OK;
  const long long blocks = ring_rows_min((lb->most + lb->threads - 1) / lb->threads, lb->cap);
  const unsigned grid[3] = {(unsigned)blocks, (unsigned)lb->lp.nentries, 1};
  const rda_status s = lb->b->launch(lb->b, lb->module, grid, lb->threads, 0, &lb->lp,
                                     sizeof lb->lp, err);
  memset(&lb->lp, 0, sizeof lb->lp);
  lb->kv = 0;
  lb->most = 0;
  return s;
}

/* Add kv slots [slot0, slot0 + nkv) of transfer r to the open launch (which has room); the
 * launch's first entry sets the shared fields, the others lie at their offset from its block. */
static void ring_rows_entry_add(ring_rows_batch *lb, const rda_ring_rows_params *r,
                                const int *kv_heads, int slot0, int nkv, int elem) {
  rda_ring_rows_launch *lp = &lb->lp;
  if (lp->nentries == 0) {
    lp->k = r->k, lp->v = r->v;
    lp->k_sb = r->k_sb, lp->k_sn = r->k_sn, lp->k_sh = r->k_sh;
    lp->v_sb = r->v_sb, lp->v_sn = r->v_sn, lp->v_sh = r->v_sh;
    lp->block = r->block;
    lp->batch = r->batch, lp->stride = r->stride, lp->head_dim = r->head_dim;
  }
  rda_ring_rows_entry *e = &lp->e[lp->nentries++];
  e->blk = (long long)(((const char *)r->block - (const char *)lp->block) / elem);
  e->rows = r->rows;
  e->nranges = r->nranges;
  for (int i = 0; i < 2; ++i) e->first[i] = r->first[i], e->count[i] = r->count[i];
  e->nkv_total = r->nkv_total;
  e->slot0 = slot0;
  e->nkv = nkv;
  e->kv0 = lb->kv;
  for (int q = 0; q < nkv; ++q) lp->kv[lb->kv + q] = (unsigned short)kv_heads[slot0 + q];
  lb->kv += nkv;
  const long long vectors = r->batch * r->rows * nkv * (r->head_dim / 8);
  if (vectors > lb->most) lb->most = vectors;
}

/* Check every transfer, then launch variant `kernel` over entries (a transfer's chunk of at
 * most RDA_RING_ROWS_MAX_HEADS kv heads), as many per launch as fit; with `add`, never two
 * entries that could write one element (they go to successive launches, in order). */
static rda_status ring_rows_run(const char *what, rda_backend *b, const rda_plan_k *p,
                                const rda_fwd_kernels *k, int kernel, const char *kind,
                                const rda_ring_rows_params *rows, const int *const *kv_heads,
                                int n, int elem, int add, rda_err *err) {
  if (b == NULL || p == NULL || k == NULL || (rows == NULL && n > 0) || n < 0 ||
      (kv_heads == NULL && n > 0))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: the backend, plan, kernels and rows must not be NULL", what);
  int any = 0;
  for (int t = 0; t < n; ++t) {
    RDA_TRY(ring_rows_check(what, p, &rows[t], kv_heads[t], elem, add, err));
    any |= rows[t].rows > 0;
  }
  if (!any) return RDA_OK;
  if (kernel < 0 || kernel >= p->nvariants || kernel >= k->n || k->modules[kernel] == NULL ||
      strcmp(p->variants[kernel].kind, kind) != 0)
    return rda_err_set(err, RDA_ERR_INTERNAL, "%s: the plan has no loaded %s kernel", what, kind);

  const unsigned threads = (unsigned)p->variants[kernel].threads;
  long long cap = kFallbackBlocks;
  if (p->hw.sm_count > 0 && p->hw.max_threads_per_sm >= (int)threads)
    cap =
        (long long)p->hw.sm_count * ring_rows_min(kBlocksPerSm, p->hw.max_threads_per_sm / threads);
  ring_rows_batch lb = {b, k->modules[kernel], threads, cap, 0, 0, {0}};
  int first_t = 0; /* transfers [first_t, t) have entries in the open launch */
  for (int t = 0; t < n; ++t) {
    if (rows[t].rows == 0) continue;
    int flush = lb.lp.nentries > 0 && !ring_rows_same_launch(&rows[first_t], &rows[t]);
    for (int u = first_t; add && !flush && u < t; ++u)
      flush = rows[u].rows > 0 && ring_rows_conflict(&rows[u], kv_heads[u], rows[u].nkv_total,
                                                     &rows[t], kv_heads[t], rows[t].nkv_total);
    if (flush) RDA_TRY(ring_rows_flush(&lb, err));
    if (lb.lp.nentries == 0) first_t = t;
    for (int slot0 = 0; slot0 < rows[t].nkv_total; slot0 += RDA_RING_ROWS_MAX_HEADS) {
      const int nkv = (int)ring_rows_min(RDA_RING_ROWS_MAX_HEADS, rows[t].nkv_total - slot0);
      if (lb.lp.nentries == RDA_RING_ROWS_ENTRIES || lb.kv + nkv > RDA_RING_ROWS_LAUNCH_KV) {
        RDA_TRY(ring_rows_flush(&lb, err));
        first_t = t;
      }
      ring_rows_entry_add(&lb, &rows[t], kv_heads[t], slot0, nkv, elem);
    }
  }
  return ring_rows_flush(&lb, err);
}

rda_status rda_ring_rows_pack_many(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                                   const rda_ring_rows_params *rows, const int *const *kv_heads,
                                   int n, rda_err *err) {
  return ring_rows_run("rda_ring_rows_pack", b, p, k, p ? p->ring_pack_kernel : -1, "ring_pack",
                       rows, kv_heads, n, 2, 0, err);
}

rda_status rda_ring_rows_add_many(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                                  const rda_ring_rows_params *rows, const int *const *kv_heads,
                                  int n, rda_err *err) {
  return ring_rows_run("rda_ring_rows_add", b, p, k, p ? p->ring_add_kernel : -1, "ring_add",
                       rows, kv_heads, n, 4, 1, err);
}

rda_status rda_ring_rows_pack(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                              const rda_ring_rows_params *rows, const int *kv_heads, rda_err *err) {
  return rda_ring_rows_pack_many(b, p, k, rows, &kv_heads, 1, err);
}

rda_status rda_ring_rows_add(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                             const rda_ring_rows_params *rows, const int *kv_heads, rda_err *err) {
  return rda_ring_rows_add_many(b, p, k, rows, &kv_heads, 1, err);
}
