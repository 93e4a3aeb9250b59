/* ring_plan.c — the ring's per-branch communication plan and its cost model: segment groups
 * found from rank boundaries (never a loop over rows), per (branch, offset) class grids, direct
 * shift ring or all-gather per group, causal trimming, per-rank bytes, peak memory and work. */
#include "ring_plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rp_member {
  int rank;
  int nr;               /* 1 or 2 index ranges */
  int64_t t0[2], t1[2]; /* grid indices [t0, t1) the rank owns, ascending */
} rp_member;

typedef struct rp_group {
  int branch, cls;
  int64_t segment, a, b, ngrid;
  int kind;
  int why; /* RP_WHY_*: index into rp_why */
  int64_t m0;
  int nm;
  int64_t bundle; /* rda_ring_step.bundle */
} rp_group;

typedef struct rp_class {
  int branch;
  int64_t offset;
  int nq, nkv;
  int kv0; /* first kv head in plan->kv */
} rp_class;

struct rda_ring_plan {
  rda_config cfg;
  int64_t n;
  int nranks, layout;
  int64_t chunk; /* zigzag chunk rows */
  int nclasses;
  rp_class *classes;
  int class0[RDA_MAX_BRANCHES]; /* branch i's classes: [class0[i], class0[i] + nclasses) */
  double *nq_before;            /* nq_before[c]: the query heads of classes 0 .. c-1 */
  int *kv;
  int64_t ngroups, gcap;
  rp_group *groups;
  int64_t nbundles;
  int64_t *memb_off; /* rank rho's memberships: memb_g / memb_x [memb_off[rho], memb_off[rho+1]) */
  int64_t *memb_g;   /* the group, ascending */
  int *memb_x;       /* the rank's member index in it */
  uint64_t bundle_bytes; /* RDA_RING_BUNDLE_BYTES unless a test asks otherwise */
  /* While planning with all-gathers: per rank, the receive block the all-ring plan needs
   * (rda_ring_rank.recv_block); NULL while planning rings only. */
  const uint64_t *ag_room;
  int64_t nmembers, mcap;
  rp_member *members;
  rda_ring_rank *ranks;
  rda_ring_branch branches[RDA_MAX_BRANCHES];
};

/* Why a group is a ring or an all-gather (rda_ring_group.why). */
enum { RP_WHY_TWO, RP_WHY_CAUSAL, RP_WHY_NO_ROOM, RP_WHY_GATHER, RP_WHY_MANY };
static const char *const rp_why[] = {
    "ring: 2 members; an all-gather would be the same single exchange",
    "ring: causal; the ring skips and trims blocks in the future that an all-gather would move",
    "ring: an all-gather would raise a rank's ring memory (it receives both other blocks in "
    "one step, and the receive block is double-buffered) or save no step",
    "all-gather: both other blocks fit the receive block the ring needs anyway; 1 step "
    "instead of 2",
    "ring: 4 or more members; a step moves at most two blocks each way",
};

int rda_ring_layout_parse(const char *name) {
  if (name == NULL) return -1;
  if (strcmp(name, "contiguous") == 0) return RDA_RING_CONTIGUOUS;
  if (strcmp(name, "zigzag") == 0) return RDA_RING_ZIGZAG;
  return -1;
}

const char *rda_ring_layout_name(int layout) {
  return layout == RDA_RING_ZIGZAG ? "zigzag" : "contiguous";
}

/* --- byte counts ----------------------------------------------------------------------------- */

/* Row counts and indices need no checks: N, segments and dilations are at most RDA_RING_MAX_N =
 * 2^40, so every row index, segment bound (m + 1) * w <= N + w, grid product a + j + t * r <=
 * b + r and rank start rho * (N / P) stays below 2^42. Bytes are products with heads and
 * head_dim and sums over steps: each is checked against RDA_RING_MAX_BYTES here. */

/* *acc += v; 0 when the sum would exceed RDA_RING_MAX_BYTES (then *acc is unchanged). */
static int rp_add_bytes(uint64_t *acc, uint64_t v) {
  uint64_t s;
  if (__builtin_add_overflow(*acc, v, &s) || s > RDA_RING_MAX_BYTES) return 0;
  *acc = s;
  return 1;
}

/* A workspace block's bytes: b rounded up to RDA_RING_BLOCK_ALIGN (b <= RDA_RING_MAX_BYTES, so
 * no wrap; rp_add_bytes checks the result). */
static uint64_t rp_aligned(uint64_t b) {
  return (b + RDA_RING_BLOCK_ALIGN - 1) / RDA_RING_BLOCK_ALIGN * RDA_RING_BLOCK_ALIGN;
}

/* The bytes of `rows` rows of nkv kv heads, times `times`; 0 when above RDA_RING_MAX_BYTES. */
static int rp_row_bytes(const rda_ring_plan *p, int64_t rows, int nkv, uint64_t times,
                        uint64_t *out) {
  uint64_t b;
  if (rows < 0 || nkv < 0 || p->cfg.head_dim < 0 ||
      __builtin_mul_overflow((uint64_t)rows, (uint64_t)nkv, &b) ||
      __builtin_mul_overflow(b, (uint64_t)p->cfg.head_dim, &b) ||
      __builtin_mul_overflow(b, (uint64_t)RDA_RING_KV_ELEM_BYTES, &b) ||
      __builtin_mul_overflow(b, times, &b) || b > RDA_RING_MAX_BYTES)
    return 0;
  *out = b;
  return 1;
}

/* The one error line of a plan whose bytes would not fit: what overflowed and the sizes. */
static rda_status rp_too_large(const rda_ring_plan *p, const char *what, rda_err *err) {
  return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                     "ring plan: N = %lld over P = %d ranks is too large for the ring: %s would "
                     "exceed 2^63 - 1 bytes (%d kv heads x head_dim %d x %d bytes a row); use "
                     "fewer rows, heads or ranks",
                     (long long)p->n, p->nranks, what, p->cfg.kv_heads, p->cfg.head_dim,
                     RDA_RING_KV_ELEM_BYTES);
}

/* --- ownership ------------------------------------------------------------------------------ */

static int64_t rp_cdiv(int64_t x, int64_t y) {
  return (x + y - 1) / y;
}

/* First row of rank rho in the contiguous layout. */
static int64_t rp_start(const rda_ring_plan *p, int64_t rho) {
  const int64_t base = p->n / p->nranks, extra = p->n % p->nranks;
  return rho * base + (rho < extra ? rho : extra);
}

int rda_ring_plan_owner(const rda_ring_plan *p, int64_t row) {
  if (p->layout == RDA_RING_ZIGZAG) {
    const int64_t c = row / p->chunk;
    return (int)(c < p->nranks ? c : 2 * (int64_t)p->nranks - 1 - c);
  }
  const int64_t base = p->n / p->nranks, extra = p->n % p->nranks;
  const int64_t big = extra * (base + 1);
  if (row < big) return (int)(row / (base + 1));
  return (int)(extra + (row - big) / base);
}

/* The pieces [lo, hi) rank rho owns, ascending; returns their number. */
static int rp_pieces(const rda_ring_plan *p, int rho, int64_t lo[2], int64_t hi[2]) {
  if (p->layout == RDA_RING_ZIGZAG) {
    const int64_t c0 = rho, c1 = 2 * (int64_t)p->nranks - 1 - rho;
    if (c0 + 1 == c1) { /* the middle rank: adjacent chunks, one piece */
      lo[0] = c0 * p->chunk, hi[0] = (c1 + 1) * p->chunk;
      return 1;
    }
    lo[0] = c0 * p->chunk, hi[0] = (c0 + 1) * p->chunk;
    lo[1] = c1 * p->chunk, hi[1] = (c1 + 1) * p->chunk;
    return 2;
  }
  lo[0] = rp_start(p, rho), hi[0] = rp_start(p, rho + 1);
  return hi[0] > lo[0]; /* none for a rank past the rows (P > N) */
}

/* --- counting pairs ------------------------------------------------------------------------- */

static double rp_tri(int64_t k) {
  return 0.5 * (double)k * (double)(k + 1);
} /* 1 + ... + k */

/* #{(t, u) : p0 <= t < p1, k0 <= u < k1, u <= t (causal) }. */
static double rp_pairs(int64_t p0, int64_t p1, int64_t k0, int64_t k1, int causal) {
  if (p1 <= p0 || k1 <= k0) return 0.0;
  if (!causal) return (double)(p1 - p0) * (double)(k1 - k0);
  double s = 0.0;
  const int64_t lo = p0 > k0 ? p0 : k0, hi = p1 < k1 ? p1 : k1;
  if (hi > lo) s += rp_tri(hi - k0) - rp_tri(lo - k0);
  const int64_t b0 = p0 > k1 ? p0 : k1;
  if (p1 > b0) s += (double)(p1 - b0) * (double)(k1 - k0);
  return s;
}

/* Grid rows of offset j, stride r in a segment of len rows. */
static int64_t rp_grid_rows(int64_t len, int64_t j, int64_t r) {
  return len > j ? rp_cdiv(len - j, r) : 0;
}

/* Grid indices [*t0, *t1) of rows [lo, hi) in the grid (a, j, r, ng). */
static void rp_tspan(int64_t lo, int64_t hi, int64_t a, int64_t j, int64_t r, int64_t ng,
                     int64_t *t0, int64_t *t1) {
  int64_t x0 = lo - a - j, x1 = hi - a - j;
  x0 = x0 > 0 ? rp_cdiv(x0, r) : 0;
  x1 = x1 > 0 ? rp_cdiv(x1, r) : 0;
  *t0 = x0 < ng ? x0 : ng;
  *t1 = x1 < ng ? x1 : ng;
}

/* Query heads of branch i's classes with offset below u (classes ascend by offset). */
static double rp_nq_below(const rda_ring_plan *p, int i, int64_t u) {
  int lo = p->class0[i], hi = lo + p->branches[i].nclasses;
  const int first = lo;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (p->classes[mid].offset < u)
      lo = mid + 1;
    else
      hi = mid;
  }
  return p->nq_before[lo] - p->nq_before[first];
}

/* Pairs of queries in rows [a + x, a + y) of a segment of L rows with their keys in it, summed
 * over branch i's classes, each times its query heads. O(log classes), whatever their number:
 * an offset j lies in [0, r), so a grid has L div r rows plus one when j < L mod r, and the
 * grid indices below row x are x div r plus one when j < x mod r; each sum over the classes is
 * then one of W(u), the query heads of the classes with offset below u. */
static double rp_seg_pairs(const rda_ring_plan *p, int i, int64_t len, int64_t x, int64_t y) {
  if (y <= x) return 0.0;
  const int64_t r = p->branches[i].r;
  const int64_t Q = len / r, R = len % r, X = x / r, xr = x % r, Y = y / r, yr = y % r;
  const double all = rp_nq_below(p, i, r);
  if (p->cfg.causal) /* sum of tri(t1) - tri(t0), t = X + [j < xr] and Y + [j < yr] */
    return (rp_tri(Y) - rp_tri(X)) * all + (double)(Y + 1) * rp_nq_below(p, i, yr) -
           (double)(X + 1) * rp_nq_below(p, i, xr);
  /* sum of (t1 - t0) * ng, with t1 - t0 = (Y - X) + [j < yr] - [j < xr], ng = Q + [j < R] */
  const double D = (double)(Y - X);
  return D * (double)Q * all + D * rp_nq_below(p, i, R) +
         (double)Q * (rp_nq_below(p, i, yr) - rp_nq_below(p, i, xr)) +
         rp_nq_below(p, i, yr < R ? yr : R) - rp_nq_below(p, i, xr < R ? xr : R);
}

/* Pairs of queries in rows [lo, hi), branch i, all its query heads: O(log classes). */
static double rp_piece_pairs(const rda_ring_plan *p, int i, int64_t lo, int64_t hi) {
  if (hi <= lo) return 0.0;
  const int64_t w = p->branches[i].w;
  const int64_t m0 = lo / w, m1 = (hi - 1) / w;
  const int64_t b0 = (m0 + 1) * w < p->n ? (m0 + 1) * w : p->n;
  if (m1 == m0) return rp_seg_pairs(p, i, b0 - m0 * w, lo - m0 * w, hi - m0 * w);
  const int64_t b1 = (m1 + 1) * w < p->n ? (m1 + 1) * w : p->n;
  double s = rp_seg_pairs(p, i, b0 - m0 * w, lo - m0 * w, b0 - m0 * w);
  s += rp_seg_pairs(p, i, b1 - m1 * w, 0, hi - m1 * w);
  const int64_t full = m1 - m0 - 1; /* segments m0+1 .. m1-1 lie wholly inside, each w long */
  if (full > 0) s += (double)full * rp_seg_pairs(p, i, w, 0, w);
  return s;
}

/* --- classes and groups --------------------------------------------------------------------- */

/* A branch's head with its offset, ordered by (offset, head). */
typedef struct rp_head {
  int64_t offset;
  int head;
} rp_head;

static int rp_head_cmp(const void *a, const void *b) {
  const rp_head *x = a, *y = b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  return (x->head > y->head) - (x->head < y->head);
}

static rda_status rp_build_classes(rda_ring_plan *p, rda_err *err) {
  const rda_config *c = &p->cfg;
  const int group = c->heads / c->kv_heads;
  int total = 0;
  for (int i = 0; i < c->nbranch; i++) {
    int h0, cnt;
    rda_config_branch_heads(c, i, &h0, &cnt);
    total += cnt;
  }
  p->classes = calloc((size_t)(total > 0 ? total : 1), sizeof *p->classes);
  p->kv = calloc((size_t)(total > 0 ? total : 1), sizeof *p->kv);
  p->nq_before = calloc((size_t)total + 1, sizeof *p->nq_before);
  rp_head *hs = calloc((size_t)(c->heads > 0 ? c->heads : 1), sizeof *hs);
  if (p->classes == NULL || p->kv == NULL || p->nq_before == NULL || hs == NULL) {
    free(hs);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring plan: out of memory for head classes");
  }
  int nkv_total = 0;
  for (int i = 0; i < c->nbranch; i++) {
    int h0, cnt;
    rda_config_branch_heads(c, i, &h0, &cnt);
    /* One class per distinct offset (offsets lie in [0, r)), ascending; sorting once keeps
     * this O(H log H) where every head may be a class of its own (r >= H). */
    for (int x = 0; x < cnt; x++) hs[x].head = h0 + x, hs[x].offset = rda_config_offset(c, i, h0 + x);
    qsort(hs, (size_t)cnt, sizeof *hs, rp_head_cmp);
    p->class0[i] = p->nclasses;
    /* The pair counts (rp_seg_pairs) rest on every offset lying in [0, r) (SPEC 1's rules). */
    if (cnt > 0 && (hs[0].offset < 0 || hs[cnt - 1].offset >= c->dilations[i])) {
      free(hs);
      return rda_err_set(err, RDA_ERR_INTERNAL, "ring plan: branch %d: an offset outside [0, %lld)",
                         i, (long long)c->dilations[i]);
    }
    for (int x = 0; x < cnt;) {
      rp_class *k = &p->classes[p->nclasses++];
      k->branch = i, k->offset = hs[x].offset, k->nq = 0, k->nkv = 0, k->kv0 = nkv_total;
      for (; x < cnt && hs[x].offset == k->offset; x++) {
        k->nq++;
        const int kvh = hs[x].head / group; /* ascending with the head */
        if (k->nkv == 0 || p->kv[k->kv0 + k->nkv - 1] != kvh) p->kv[k->kv0 + k->nkv++] = kvh;
      }
      nkv_total += k->nkv;
      p->branches[i].nclasses++;
      p->nq_before[p->nclasses] = p->nq_before[p->nclasses - 1] + k->nq;
    }
  }
  free(hs);
  return RDA_OK;
}

static rda_status rp_push_group(rda_ring_plan *p, const rp_group *g, const rp_member *m,
                                rda_err *err) {
  if (p->ngroups == p->gcap) {
    const int64_t cap = p->gcap ? 2 * p->gcap : 64;
    rp_group *ng = realloc(p->groups, (size_t)cap * sizeof *ng);
    if (ng == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring plan: out of memory");
    p->groups = ng, p->gcap = cap;
  }
  if (p->nmembers + g->nm > p->mcap) {
    int64_t cap = p->mcap ? 2 * p->mcap : 256;
    while (cap < p->nmembers + g->nm) cap *= 2;
    rp_member *nm = realloc(p->members, (size_t)cap * sizeof *nm);
    if (nm == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring plan: out of memory");
    p->members = nm, p->mcap = cap;
  }
  rp_group *dst = &p->groups[p->ngroups++];
  *dst = *g;
  dst->m0 = p->nmembers;
  memcpy(&p->members[p->nmembers], m, (size_t)g->nm * sizeof *m);
  p->nmembers += g->nm;
  return RDA_OK;
}

/* Member y's rows that member x needs: all of them, or under causal only those at or before
 * x's last query row. Returns the rows. */
static int64_t rp_xfer(const rda_ring_plan *p, const rp_group *g, const rp_member *y,
                       const rp_member *x, rda_ring_xfer *out) {
  const int64_t j = p->classes[g->cls].offset, r = p->cfg.dilations[g->branch];
  const int64_t last = x->t1[x->nr - 1] - 1;
  out->peer = y->rank, out->nranges = 0, out->rows = 0, out->bytes = 0;
  for (int q = 0; q < y->nr; q++) {
    int64_t t0 = y->t0[q], t1 = y->t1[q];
    if (p->cfg.causal && t1 > last + 1) t1 = last + 1;
    if (t1 <= t0) continue;
    out->first[out->nranges] = g->a + j + t0 * r;
    out->count[out->nranges] = t1 - t0;
    out->nranges++;
    out->rows += t1 - t0;
  }
  /* At most the member's own block, whose bytes rp_build_groups checked. */
  out->bytes = (uint64_t)out->rows * (uint64_t)p->classes[g->cls].nkv * (uint64_t)p->cfg.head_dim *
               RDA_RING_KV_ELEM_BYTES;
  return out->rows;
}

/* Pairs (all query heads of the class) between x's queries and the rows of xf. */
static double rp_xfer_pairs(const rda_ring_plan *p, const rp_group *g, const rp_member *x,
                            const rda_ring_xfer *xf) {
  const int64_t j = p->classes[g->cls].offset, r = p->cfg.dilations[g->branch];
  double s = 0.0;
  for (int q = 0; q < x->nr; q++)
    for (int k = 0; k < xf->nranges; k++) {
      const int64_t u0 = (xf->first[k] - g->a - j) / r;
      s += rp_pairs(x->t0[q], x->t1[q], u0, u0 + xf->count[k], p->cfg.causal);
    }
  return s * (double)p->classes[g->cls].nq;
}

/* Step `s` of member xi of group g into st; returns 1 when it moves anything. */
static int rp_step(const rda_ring_plan *p, int64_t gi, int xi, int s, rda_ring_step *st) {
  const rp_group *g = &p->groups[gi];
  const rp_member *m = &p->members[g->m0];
  const int k = g->nm;
  memset(st, 0, sizeof *st);
  st->branch = g->branch, st->cls = g->cls, st->group = (int)gi, st->segment = g->segment;
  st->bundle = g->bundle;
  st->stride = p->cfg.dilations[g->branch], st->kind = g->kind, st->shift = s;
  rda_ring_xfer xf;
  if (g->kind == RDA_RING_KIND_ALLGATHER) {
    for (int y = 0; y < k; y++) {
      if (y == xi) continue;
      if (rp_xfer(p, g, &m[xi], &m[y], &xf) > 0) xf.peer = m[y].rank, st->send[st->nsend++] = xf;
      if (rp_xfer(p, g, &m[y], &m[xi], &xf) > 0) {
        st->recv_pairs += rp_xfer_pairs(p, g, &m[xi], &xf);
        st->recv[st->nrecv++] = xf;
      }
    }
  } else {
    const int to = (xi + s) % k, from = (xi - s + k) % k;
    if (rp_xfer(p, g, &m[xi], &m[to], &xf) > 0) xf.peer = m[to].rank, st->send[st->nsend++] = xf;
    if (rp_xfer(p, g, &m[from], &m[xi], &xf) > 0) {
      st->recv_pairs = rp_xfer_pairs(p, g, &m[xi], &xf);
      st->recv[st->nrecv++] = xf;
    }
  }
  return st->nsend + st->nrecv > 0;
}

static int rp_nsteps(const rp_group *g) {
  return g->kind == RDA_RING_KIND_ALLGATHER ? 1 : g->nm;
}
static int rp_first_step(const rp_group *g) {
  return g->kind == RDA_RING_KIND_ALLGATHER ? 0 : 1;
}

/* Whether every member of g can receive both other members' blocks at once within room[its
 * rank] bytes (per batch element). */
static int rp_gather_fits(const rda_ring_plan *p, const rp_group *g, const rp_member *m,
                          const uint64_t *room) {
  for (int x = 0; x < g->nm; x++) {
    int64_t others = 0;
    for (int y = 0; y < g->nm; y++)
      for (int q = 0; y != x && q < m[y].nr; q++) others += m[y].t1[q] - m[y].t0[q];
    uint64_t bytes;
    if (!rp_row_bytes(p, others, p->classes[g->cls].nkv, 1, &bytes) || bytes > room[m[x].rank])
      return 0;
  }
  return 1;
}

/* Decide ring or all-gather for a new group (members m, nm). */
static void rp_choose(const rda_ring_plan *p, rp_group *g, const rp_member *m) {
  g->kind = RDA_RING_KIND_RING;
  if (g->nm == 2) {
    g->why = RP_WHY_TWO;
    return;
  }
  if (p->cfg.causal) {
    g->why = RP_WHY_CAUSAL;
    return;
  }
  /* A step holds at most two transfers each way (rda_ring_step.send[2], recv[2]). */
  if (g->nm > 3) {
    g->why = RP_WHY_MANY;
    return;
  }
  /* An all-gather makes each member receive both other blocks in one step. The driver
   * double-buffers a round's receive block, so it is taken only where that fits the block the
   * all-ring plan needs anyway on every member's rank (rda_ring_plan_create checks the
   * result); otherwise it would hold more memory to save one step. */
  g->why = RP_WHY_NO_ROOM;
  if (p->ag_room == NULL || !rp_gather_fits(p, g, m, p->ag_room)) return;
  g->kind = RDA_RING_KIND_ALLGATHER;
  g->why = RP_WHY_GATHER;
}

/* The most one member of group g moves one way in one step, per batch element: a ring step
 * receives one block, an all-gather two; sends are prefixes of the member's own block. */
static uint64_t rp_group_step_bytes(const rda_ring_plan *p, const rp_group *g) {
  int64_t rows = 0;
  for (int x = 0; x < g->nm; x++) {
    const rp_member *m = &p->members[g->m0 + x];
    int64_t own = 0;
    for (int q = 0; q < m->nr; q++) own += m->t1[q] - m->t0[q];
    if (own > rows) rows = own;
  }
  /* Twice the block fits RDA_RING_MAX_BYTES: rp_build_groups checked it. */
  const uint64_t block = (uint64_t)rows * (uint64_t)p->classes[g->cls].nkv *
                         (uint64_t)p->cfg.head_dim * RDA_RING_KV_ELEM_BYTES;
  return g->kind == RDA_RING_KIND_ALLGATHER ? 2 * block : block;
}

/* The bundles of one segment's groups [g0, ngroups) (class order): consecutive groups while
 * one member's step of all of them stays within RDA_RING_BUNDLE_BYTES (a group alone may
 * exceed it). The same on every rank, which keeps the pairs' orders matching. */
static void rp_bundle(rda_ring_plan *p, int64_t g0) {
  uint64_t sum = 0;
  for (int64_t gi = g0; gi < p->ngroups; gi++) {
    const uint64_t sz = rp_group_step_bytes(p, &p->groups[gi]);
    uint64_t grown;
    if (gi == g0 || __builtin_add_overflow(sum, sz, &grown) || grown > p->bundle_bytes) {
      p->nbundles++;
      sum = 0;
    }
    p->groups[gi].bundle = p->nbundles - 1;
    sum += sz;
  }
}

/* Segment groups of one branch: only segments that contain a rank (or chunk) boundary can span
 * two ranks. */
static rda_status rp_build_groups(rda_ring_plan *p, int i, int64_t *slot, int64_t *pr_lo,
                                  int64_t *pr_hi, int *pr_rank, rp_member *tmp, rda_err *err) {
  const int64_t w = p->branches[i].w, r = p->branches[i].r;
  const int zig = p->layout == RDA_RING_ZIGZAG;
  const int64_t nb = zig ? 2 * (int64_t)p->nranks - 1 : p->nranks - 1;
  int64_t last_m = -1;
  for (int64_t bi = 1; bi <= nb; bi++) {
    const int64_t bound = zig ? bi * p->chunk : rp_start(p, bi);
    if (bound % w == 0) continue;
    const int64_t m = bound / w;
    if (m == last_m) continue;
    last_m = m;
    const int64_t a = m * w, b = a + w < p->n ? a + w : p->n;
    /* Pieces of [a, b) per rank, in row order; a rank's pieces gathered in its slot. */
    int np = 0;
    if (zig) {
      for (int64_t c = a / p->chunk; c <= (b - 1) / p->chunk; c++) {
        const int rho = (int)(c < p->nranks ? c : 2 * (int64_t)p->nranks - 1 - c);
        const int64_t lo = c * p->chunk > a ? c * p->chunk : a;
        const int64_t hi = (c + 1) * p->chunk < b ? (c + 1) * p->chunk : b;
        if (np > 0 && pr_rank[np - 1] == rho && pr_hi[np - 1] == lo) {
          pr_hi[np - 1] = hi; /* adjacent chunks of the middle rank */
          continue;
        }
        pr_rank[np] = rho, pr_lo[np] = lo, pr_hi[np] = hi, np++;
      }
    } else {
      for (int rho = rda_ring_plan_owner(p, a); rho <= rda_ring_plan_owner(p, b - 1); rho++) {
        const int64_t s0 = rp_start(p, rho), s1 = rp_start(p, rho + 1);
        pr_rank[np] = rho, pr_lo[np] = s0 > a ? s0 : a, pr_hi[np] = s1 < b ? s1 : b, np++;
      }
    }
    const int64_t g0 = p->ngroups;
    for (int cls = p->class0[i]; cls < p->class0[i] + p->branches[i].nclasses; cls++) {
      const int64_t j = p->classes[cls].offset, ng = rp_grid_rows(b - a, j, r);
      int nm = 0;
      /* The pieces that hold grid rows: each one's, or with fewer rows than pieces (a sparse
       * grid over many ranks), the piece of each row, found by bisection (pieces ascend). */
      int64_t t = 0; /* the first grid row not yet placed */
      for (int q = 0; q < np && t < ng;) {
        if (ng < np) {
          const int64_t row = a + j + t * r;
          int lo = q, hi = np - 1;
          while (lo < hi) {
            const int mid = lo + (hi - lo + 1) / 2;
            if (pr_lo[mid] <= row)
              lo = mid;
            else
              hi = mid - 1;
          }
          q = lo;
        }
        int64_t t0, t1;
        rp_tspan(pr_lo[q], pr_hi[q], a, j, r, ng, &t0, &t1);
        q++;
        if (t1 <= t0) continue;
        t = t1;
        const int rho = pr_rank[q - 1];
        if (slot[rho] < 0) {
          slot[rho] = nm;
          tmp[nm].rank = rho, tmp[nm].nr = 0;
          nm++;
        }
        rp_member *mm = &tmp[slot[rho]];
        mm->t0[mm->nr] = t0, mm->t1[mm->nr] = t1, mm->nr++;
      }
      for (int q = 0; q < nm; q++) slot[tmp[q].rank] = -1;
      if (nm < 2) continue;
      /* Every transfer of the group is part of one member's own block and a step moves at most
       * two of them one way: twice the largest block must fit. */
      int64_t most = 0;
      for (int q = 0; q < nm; q++) {
        int64_t own = 0;
        for (int k = 0; k < tmp[q].nr; k++) own += tmp[q].t1[k] - tmp[q].t0[k];
        most = own > most ? own : most;
      }
      uint64_t two;
      if (!rp_row_bytes(p, most, p->classes[cls].nkv, 2, &two))
        return rp_too_large(p, "a block of one segment group", err);
      rp_group g = {.branch = i, .cls = cls, .segment = m, .a = a, .b = b, .ngrid = ng, .nm = nm};
      rp_choose(p, &g, tmp);
      RDA_TRY(rp_push_group(p, &g, tmp, err));
      p->branches[i].ngroups++;
      if (g.kind == RDA_RING_KIND_ALLGATHER) p->branches[i].nallgather++;
    }
    rp_bundle(p, g0);
  }
  return RDA_OK;
}

/* The steps of rank into *buf (capacity *cap steps, grown with realloc as needed; the caller
 * frees it): the walks over every rank (totals, simulation) reuse one buffer, where a fresh
 * one per rank cost more in page faults than the steps themselves (tens of MiB a rank). */
static rda_status rp_steps_into(const rda_ring_plan *p, int rank, rda_ring_step **buf,
                                int64_t *cap_io, int64_t *count, rda_err *err) {
  *count = 0;
  /* Groups come in (branch, segment, class) order and bundles number them in that order: per
   * bundle of the rank's memberships, shift by shift, group by group is the key of
   * rda_ring_step, (bundle, shift, group). */
  rda_ring_step *v = *buf;
  int64_t c = 0, cap = *cap_io;
  const int64_t m1 = p->memb_off[rank + 1];
  for (int64_t m0 = p->memb_off[rank]; m0 < m1;) {
    const int64_t bundle = p->groups[p->memb_g[m0]].bundle;
    int64_t me = m0;
    int smax = 0;
    for (; me < m1 && p->groups[p->memb_g[me]].bundle == bundle; me++)
      if (rp_nsteps(&p->groups[p->memb_g[me]]) > smax) smax = rp_nsteps(&p->groups[p->memb_g[me]]);
    for (int s = 0; s < smax; s++)
      for (int64_t m = m0; m < me; m++) {
        const rp_group *g = &p->groups[p->memb_g[m]];
        if (s < rp_first_step(g) || s >= rp_nsteps(g)) continue;
        if (c == cap) {
          const int64_t grown = cap ? 2 * cap : 64;
          rda_ring_step *nv = realloc(v, (size_t)grown * sizeof *v);
          if (nv == NULL)
            return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY,
                               "ring plan: out of memory for %lld steps", (long long)grown);
          *buf = v = nv, *cap_io = cap = grown;
        }
        if (rp_step(p, p->memb_g[m], p->memb_x[m], s, &v[c])) c++;
      }
    m0 = me;
  }
  *count = c;
  return RDA_OK;
}

/* Per-rank totals from every group's steps. */
static rda_status rp_totals(rda_ring_plan *p, rda_err *err) {
  for (int rho = 0; rho < p->nranks; rho++) {
    rda_ring_rank *rk = &p->ranks[rho];
    rk->rank = rho;
    rk->npieces = rp_pieces(p, rho, rk->lo, rk->hi);
    rk->rows = 0;
    for (int q = 0; q < rk->npieces; q++) {
      rk->rows += rk->hi[q] - rk->lo[q];
      for (int i = 0; i < p->cfg.nbranch; i++)
        rk->pairs += rp_piece_pairs(p, i, rk->lo[q], rk->hi[q]);
    }
    rk->flops = 4.0 * p->cfg.head_dim * rk->pairs;
  }
  /* Each rank's memberships, in group order (CSR), so that a rank's steps never scan groups it
   * is not in. */
  p->memb_off = calloc((size_t)p->nranks + 1, sizeof *p->memb_off);
  p->memb_g = malloc((size_t)(p->nmembers > 0 ? p->nmembers : 1) * sizeof *p->memb_g);
  p->memb_x = malloc((size_t)(p->nmembers > 0 ? p->nmembers : 1) * sizeof *p->memb_x);
  if (p->memb_off == NULL || p->memb_g == NULL || p->memb_x == NULL)
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring plan: out of memory");
  for (int64_t k = 0; k < p->nmembers; k++) p->memb_off[p->members[k].rank + 1]++;
  for (int rho = 0; rho < p->nranks; rho++) p->memb_off[rho + 1] += p->memb_off[rho];
  int64_t *fill = calloc((size_t)p->nranks, sizeof *fill);
  if (fill == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring plan: out of memory");
  for (int64_t gi = 0; gi < p->ngroups; gi++)
    for (int xi = 0; xi < p->groups[gi].nm; xi++) {
      const int rho = p->members[p->groups[gi].m0 + xi].rank;
      const int64_t at = p->memb_off[rho] + fill[rho]++;
      p->memb_g[at] = gi, p->memb_x[at] = xi;
    }
  free(fill);
  /* Totals from each rank's steps; memory as the ring driver holds it: the send block of a
   * round and two receive blocks, double-buffered. */
  rda_ring_step *steps = NULL;
  int64_t cap = 0;
  for (int rho = 0; rho < p->nranks; rho++) {
    rda_ring_rank *rk = &p->ranks[rho];
    int64_t n = 0;
    const rda_status s = rp_steps_into(p, rho, &steps, &cap, &n, err);
    if (s != RDA_OK) {
      free(steps);
      return s;
    }
    rk->steps = n;
    char what[64] = "";
    for (int64_t i = 0; i < n && what[0] == '\0'; i++) {
      const rda_ring_step *st = &steps[i];
      rk->recv_pairs += st->recv_pairs;
      for (int q = 0; q < st->nsend; q++) {
        if (!rp_add_bytes(&rk->bytes_sent, st->send[q].bytes))
          snprintf(what, sizeof what, "the bytes rank %d sends", rho);
        else if (!rp_add_bytes(&p->branches[st->branch].bytes, st->send[q].bytes))
          snprintf(what, sizeof what, "the bytes branch %d moves", st->branch);
      }
      for (int q = 0; q < st->nrecv; q++)
        if (!rp_add_bytes(&rk->bytes_received, st->recv[q].bytes))
          snprintf(what, sizeof what, "the bytes rank %d receives", rho);
    }
    /* A round's blocks are sums of some of the rank's sends or receives: at most the checked
     * totals, so rda_ring_steps_blocks cannot wrap. */
    uint64_t send_all = 0, peak = 0;
    if (what[0] == '\0') {
      rda_ring_steps_blocks(steps, n, &rk->send_block, &send_all, &rk->recv_block);
      if (!rp_add_bytes(&peak, rp_aligned(rk->send_block)) ||
          !rp_add_bytes(&peak, rp_aligned(rk->recv_block)) ||
          !rp_add_bytes(&peak, rp_aligned(rk->recv_block)))
        snprintf(what, sizeof what, "the ring memory of rank %d", rho);
    }
    if (what[0] != '\0') {
      free(steps);
      return rp_too_large(p, what, err);
    }
    rk->peak_bytes = peak;
  }
  free(steps);
  return RDA_OK;
}

static rda_status rp_create(const rda_config *cfg, int64_t n, int ranks, int layout,
                            uint64_t bundle_bytes, const uint64_t *ag_room, rda_ring_plan **out,
                            rda_err *err);

rda_status rda_ring_plan_create(const rda_config *cfg, int64_t n, int ranks, int layout,
                                rda_ring_plan **out, rda_err *err) {
  return rda_ring_plan_create_bundled(cfg, n, ranks, layout, RDA_RING_BUNDLE_BYTES, out, err);
}

rda_status rda_ring_plan_create_bundled(const rda_config *cfg, int64_t n, int ranks, int layout,
                                        uint64_t bundle_bytes, rda_ring_plan **out, rda_err *err) {
  if (out == NULL || cfg == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "ring plan: NULL config or output");
  *out = NULL;
  if (n < 1 || n > RDA_RING_MAX_N)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "ring plan: N = %lld: need 1 <= N <= 2^40 = %lld", (long long)n,
                       (long long)RDA_RING_MAX_N);
  if (ranks < 1 || ranks > RDA_RING_MAX_RANKS)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "ring plan: ranks P = %d: need 1 <= P <= %d",
                       ranks, RDA_RING_MAX_RANKS);
  if (layout != RDA_RING_CONTIGUOUS && layout != RDA_RING_ZIGZAG)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "ring plan: layout %d: expected contiguous or zigzag", layout);
  if (layout == RDA_RING_ZIGZAG && n % (2 * (int64_t)ranks) != 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "ring plan: the zigzag layout needs N to be a multiple of 2P = %lld, but N "
                       "= %lld (use --layout contiguous, or pad N)",
                       2 * (long long)ranks, (long long)n);
  if (cfg->nbranch < 1 || cfg->nbranch > RDA_MAX_BRANCHES || cfg->heads < 1 || cfg->kv_heads < 1 ||
      cfg->heads % cfg->kv_heads != 0 || cfg->head_dim < 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "ring plan: the config was not validated");
  for (int i = 0; i < cfg->nbranch; i++)
    if (cfg->segments[i] < 1 || cfg->dilations[i] < 1 || cfg->segments[i] > RDA_RING_MAX_N ||
        cfg->dilations[i] > RDA_RING_MAX_N)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "ring plan: the config was not validated");

  /* Rings only first; then, where some group could be an all-gather, again with all-gathers
   * that fit the receive blocks the rings need. That plan is taken only when no rank's ring
   * memory grows and no rank takes more steps: an all-gather saves steps, never memory. */
  rda_ring_plan *rings = NULL, *gathers = NULL;
  RDA_TRY(rp_create(cfg, n, ranks, layout, bundle_bytes, NULL, &rings, err));
  uint64_t *room = malloc((size_t)ranks * sizeof *room);
  if (room == NULL) {
    rda_ring_plan_destroy(rings);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring plan: out of memory for %d ranks", ranks);
  }
  for (int q = 0; q < ranks; q++) room[q] = rings->ranks[q].recv_block;
  int fits = 0; /* no second plan when no group could gather */
  for (int64_t gi = 0; gi < rings->ngroups && !fits; gi++) {
    const rp_group *g = &rings->groups[gi];
    fits = g->why == RP_WHY_NO_ROOM && rp_gather_fits(rings, g, &rings->members[g->m0], room);
  }
  if (!fits) {
    free(room);
    *out = rings;
    return RDA_OK;
  }
  const rda_status s = rp_create(cfg, n, ranks, layout, bundle_bytes, room, &gathers, err);
  free(room);
  if (s != RDA_OK) {
    rda_ring_plan_destroy(rings);
    return s;
  }
  int better = 0, worse = 0;
  for (int q = 0; q < ranks; q++) {
    const rda_ring_rank *a = &gathers->ranks[q], *b = &rings->ranks[q];
    worse |= a->peak_bytes > b->peak_bytes || a->steps > b->steps;
    better |= a->steps < b->steps;
  }
  if (better && !worse) {
    rda_ring_plan_destroy(rings);
    *out = gathers;
  } else {
    rda_ring_plan_destroy(gathers);
    *out = rings;
  }
  return RDA_OK;
}

/* One plan: all rings (ag_room NULL), or all-gathers where each member's receive of the two
 * other blocks fits ag_room[rank]. */
static rda_status rp_create(const rda_config *cfg, int64_t n, int ranks, int layout,
                            uint64_t bundle_bytes, const uint64_t *ag_room, rda_ring_plan **out,
                            rda_err *err) {
  rda_ring_plan *p = calloc(1, sizeof *p);
  int64_t *slot = NULL, *pr_lo = NULL, *pr_hi = NULL;
  int *pr_rank = NULL;
  rp_member *tmp = NULL;
  rda_status s = RDA_OK;
  if (p == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring plan: out of memory");
  p->cfg = *cfg, p->n = n, p->nranks = ranks, p->layout = layout;
  p->bundle_bytes = bundle_bytes;
  p->ag_room = ag_room;
  p->chunk = layout == RDA_RING_ZIGZAG ? n / (2 * (int64_t)ranks) : 0;
  for (int i = 0; i < cfg->nbranch; i++) {
    p->branches[i].w = cfg->segments[i] < n ? cfg->segments[i] : n;
    p->branches[i].r = cfg->dilations[i];
  }
  const size_t np = 2 * (size_t)ranks + 2;
  p->ranks = calloc((size_t)ranks, sizeof *p->ranks);
  slot = malloc((size_t)ranks * sizeof *slot);
  pr_lo = malloc(np * sizeof *pr_lo), pr_hi = malloc(np * sizeof *pr_hi);
  pr_rank = malloc(np * sizeof *pr_rank);
  tmp = malloc((size_t)ranks * sizeof *tmp);
  if (p->ranks == NULL || slot == NULL || pr_lo == NULL || pr_hi == NULL || pr_rank == NULL ||
      tmp == NULL) {
    s = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring plan: out of memory for %d ranks", ranks);
    goto done;
  }
  for (int q = 0; q < ranks; q++) slot[q] = -1;
  if ((s = rp_build_classes(p, err)) != RDA_OK) goto done;
  for (int i = 0; i < cfg->nbranch; i++)
    if ((s = rp_build_groups(p, i, slot, pr_lo, pr_hi, pr_rank, tmp, err)) != RDA_OK) goto done;
  s = rp_totals(p, err);
done:
  p->ag_room = NULL; /* the caller's */
  free(slot), free(pr_lo), free(pr_hi), free(pr_rank), free(tmp);
  if (s != RDA_OK) {
    rda_ring_plan_destroy(p);
    return s;
  }
  *out = p;
  return RDA_OK;
}

void rda_ring_plan_destroy(rda_ring_plan *p) {
  if (p == NULL) return;
  free(p->classes), free(p->nq_before), free(p->kv), free(p->groups), free(p->members);
  free(p->ranks);
  free(p->memb_off), free(p->memb_g), free(p->memb_x);
  free(p);
}

int rda_ring_plan_ranks(const rda_ring_plan *p) {
  return p->nranks;
}
int64_t rda_ring_plan_n(const rda_ring_plan *p) {
  return p->n;
}
int rda_ring_plan_layout(const rda_ring_plan *p) {
  return p->layout;
}
const rda_config *rda_ring_plan_config(const rda_ring_plan *p) {
  return &p->cfg;
}

const rda_ring_rank *rda_ring_plan_rank(const rda_ring_plan *p, int rank) {
  return rank >= 0 && rank < p->nranks ? &p->ranks[rank] : NULL;
}

const rda_ring_branch *rda_ring_plan_branch(const rda_ring_plan *p, int branch) {
  return branch >= 0 && branch < p->cfg.nbranch ? &p->branches[branch] : NULL;
}

int rda_ring_plan_nclasses(const rda_ring_plan *p) {
  return p->nclasses;
}

void rda_ring_plan_class(const rda_ring_plan *p, int cls, rda_ring_class *out) {
  const rp_class *k = &p->classes[cls];
  out->branch = k->branch, out->offset = k->offset, out->nq = k->nq, out->nkv = k->nkv;
  out->kv_heads = &p->kv[k->kv0];
}

int64_t rda_ring_plan_ngroups(const rda_ring_plan *p) {
  return p->ngroups;
}

void rda_ring_plan_group(const rda_ring_plan *p, int64_t group, rda_ring_group *out) {
  const rp_group *g = &p->groups[group];
  out->branch = g->branch, out->cls = g->cls, out->segment = g->segment;
  out->seg_start = g->a, out->seg_end = g->b, out->grid_rows = g->ngrid;
  out->nmembers = g->nm, out->kind = g->kind, out->why = rp_why[g->why];
  out->bundle = g->bundle;
}

int rda_ring_plan_own_block(const rda_ring_plan *p, int64_t group, int rank, rda_ring_xfer *out) {
  const rp_group *g = &p->groups[group];
  for (int q = 0; q < g->nm; q++) {
    const rp_member *m = &p->members[g->m0 + q];
    if (m->rank != rank) continue;
    const int64_t j = p->classes[g->cls].offset, r = p->cfg.dilations[g->branch];
    memset(out, 0, sizeof *out);
    out->peer = rank, out->nranges = m->nr;
    for (int k = 0; k < m->nr; k++) {
      out->first[k] = g->a + j + m->t0[k] * r;
      out->count[k] = m->t1[k] - m->t0[k];
      out->rows += out->count[k];
    }
    out->bytes = (uint64_t)out->rows * (uint64_t)p->classes[g->cls].nkv *
                 (uint64_t)p->cfg.head_dim * RDA_RING_KV_ELEM_BYTES; /* checked at creation */
    return 1;
  }
  return 0;
}

rda_status rda_ring_plan_steps(const rda_ring_plan *p, int rank, rda_ring_step **steps,
                               int64_t *count, rda_err *err) {
  *steps = NULL, *count = 0;
  if (rank < 0 || rank >= p->nranks)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "ring plan: rank %d of %d", rank, p->nranks);
  rda_ring_step *v = NULL;
  int64_t cap = 0, c = 0;
  const rda_status s = rp_steps_into(p, rank, &v, &cap, &c, err);
  if (s != RDA_OK || c == 0) {
    free(v);
    return s;
  }
  *steps = v, *count = c;
  return RDA_OK;
}

int64_t rda_ring_round_end(const rda_ring_step *steps, int64_t n, int64_t i) {
  int64_t e = i + 1;
  while (e < n && steps[e].bundle == steps[i].bundle && steps[e].shift == steps[i].shift) ++e;
  return e;
}

static int rp_same_rows(const rda_ring_xfer *a, const rda_ring_xfer *b) {
  if (a->nranges != b->nranges) return 0;
  for (int i = 0; i < a->nranges; ++i)
    if (a->first[i] != b->first[i] || a->count[i] != b->count[i]) return 0;
  return 1;
}

void rda_ring_round_layout(const rda_ring_step *steps, int64_t n, uint64_t (*send_at)[2],
                           uint64_t (*recv_at)[2], uint64_t *send, uint64_t *send_all,
                           uint64_t *recv) {
  uint64_t s = 0, sa = 0, r = 0;
  for (int64_t k = 0; k < n; ++k) {
    const rda_ring_step *st = &steps[k];
    for (int q = 0; q < st->nsend; ++q) {
      sa += st->send[q].bytes;
      if (q == 1 && rp_same_rows(&st->send[0], &st->send[1])) {
        if (send_at != NULL) send_at[k][1] = send_at[k][0];
        continue;
      }
      if (send_at != NULL) send_at[k][q] = s;
      s += st->send[q].bytes;
    }
    for (int q = 0; q < st->nrecv; ++q) {
      if (recv_at != NULL) recv_at[k][q] = r;
      r += st->recv[q].bytes;
    }
  }
  if (send != NULL) *send = s;
  if (send_all != NULL) *send_all = sa;
  if (recv != NULL) *recv = r;
}

void rda_ring_steps_blocks(const rda_ring_step *steps, int64_t n, uint64_t *send,
                           uint64_t *send_all, uint64_t *recv) {
  *send = *send_all = *recv = 0;
  for (int64_t i = 0; i < n;) {
    const int64_t e = rda_ring_round_end(steps, n, i);
    uint64_t s, sa, r;
    rda_ring_round_layout(steps + i, e - i, NULL, NULL, &s, &sa, &r);
    if (s > *send) *send = s;
    if (sa > *send_all) *send_all = sa;
    if (r > *recv) *recv = r;
    i = e;
  }
}

void rda_ring_steps_peers(const rda_ring_step *steps, int64_t n, int self, int *peers,
                          int *npeers) {
  unsigned char seen[RDA_RING_MAX_RANKS] = {0};
  for (int64_t i = 0; i < n; i++) {
    for (int q = 0; q < steps[i].nsend; q++) seen[steps[i].send[q].peer] = 1;
    for (int q = 0; q < steps[i].nrecv; q++) seen[steps[i].recv[q].peer] = 1;
  }
  *npeers = 0;
  for (int q = 0; q < RDA_RING_MAX_RANKS; q++)
    if (seen[q] && q != self) peers[(*npeers)++] = q;
}

rda_status rda_ring_plan_simulate(const rda_ring_plan *p, double link_bytes_per_s,
                                  double flops_per_s, rda_ring_sim *out, rda_err *err) {
  if (!(link_bytes_per_s > 0.0) || !isnormal(link_bytes_per_s))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "ring-sim: link rate %g bytes/s: must be finite, normal and positive",
                       link_bytes_per_s);
  if (!(flops_per_s > 0.0) || !isnormal(flops_per_s))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "ring-sim: compute rate %g FLOP/s: must be finite, normal and positive",
                       flops_per_s);
  /* Per rank, round by round: the first round's transfer overlaps the local block, each later
   * stage is max(this round's transfer, the previous round's compute), and the last round's
   * compute comes after. */
  const double fpp = 4.0 * p->cfg.head_dim / flops_per_s; /* seconds per pair */
  rda_ring_step *steps = NULL;
  int64_t cap = 0;
  for (int rho = 0; rho < p->nranks; rho++) {
    const rda_ring_rank *rk = &p->ranks[rho];
    int64_t n = 0;
    const rda_status s = rp_steps_into(p, rho, &steps, &cap, &n, err);
    if (s != RDA_OK) {
      free(steps);
      return s;
    }
    double first_comm = 0.0, rest = 0.0, prev = 0.0, comm_s = 0.0, exposed = 0.0;
    for (int64_t i = 0; i < n;) {
      const int64_t e = rda_ring_round_end(steps, n, i);
      double sent = 0.0, recv = 0.0, pairs = 0.0;
      for (int64_t k = i; k < e; k++) {
        for (int q = 0; q < steps[k].nsend; q++) sent += (double)steps[k].send[q].bytes;
        for (int q = 0; q < steps[k].nrecv; q++) recv += (double)steps[k].recv[q].bytes;
        pairs += steps[k].recv_pairs;
      }
      const double comm = (sent > recv ? sent : recv) / link_bytes_per_s;
      comm_s += comm;
      if (i == 0) {
        first_comm = comm;
      } else {
        rest += prev > comm ? prev : comm;
        exposed += comm > prev ? comm - prev : 0.0; /* the part of the stage compute misses */
      }
      prev = pairs * fpp;
      i = e;
    }
    const double local = (rk->pairs - rk->recv_pairs) * fpp;
    out[rho].compute_s = rk->pairs * fpp;
    out[rho].comm_s = comm_s;
    out[rho].total_s = n > 0 ? (local > first_comm ? local : first_comm) + rest + prev : local;
    if (first_comm > local) exposed += first_comm - local;
    if (exposed > comm_s) exposed = comm_s; /* rounding only */
    out[rho].exposed_s = exposed;
    out[rho].overlap = comm_s > 0.0 ? (comm_s - exposed) / comm_s : 1.0;
  }
  free(steps);
  return RDA_OK;
}

/* --- fingerprint ---------------------------------------------------------------------------- */

static uint64_t rp_fnv(uint64_t h, uint64_t v) {
  for (int q = 0; q < 8; q++) {
    h ^= (v >> (8 * q)) & 0xffu;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t rda_ring_fingerprint(const rda_config *cfg, int64_t n, int ranks, int layout) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = rp_fnv(h, RDA_VERSION_NUMBER);
  /* The order of every pair's messages: ranks that group or order steps differently must fail
   * the check, not post mismatched transfers (NCCL does not check sizes). */
  h = rp_fnv(h, RDA_RING_PROTOCOL);
  h = rp_fnv(h, RDA_RING_BUNDLE_BYTES);
  h = rp_fnv(h, (uint64_t)cfg->heads);
  h = rp_fnv(h, (uint64_t)cfg->kv_heads);
  h = rp_fnv(h, (uint64_t)cfg->head_dim);
  h = rp_fnv(h, (uint64_t)cfg->dtype);
  h = rp_fnv(h, (uint64_t)cfg->nbranch);
  for (int i = 0; i < cfg->nbranch && i < RDA_MAX_BRANCHES; i++) {
    h = rp_fnv(h, (uint64_t)cfg->segments[i]);
    h = rp_fnv(h, (uint64_t)cfg->dilations[i]);
  }
  h = rp_fnv(h, (uint64_t)cfg->offsets);
  h = rp_fnv(h, (uint64_t)cfg->causal);
  uint64_t bits;
  memcpy(&bits, &cfg->scale, sizeof bits);
  h = rp_fnv(h, bits);
  h = rp_fnv(h, (uint64_t)n);
  h = rp_fnv(h, (uint64_t)ranks);
  h = rp_fnv(h, (uint64_t)layout);
  /* Bit 63 clear: set, it says a rank failed before it joined (RDA_TRANSPORT_JOIN_FAILED). */
  return h & ~(1ull << 63);
}
