/* bwd.c — the backward pass of a plan: one prep launch (Dp = <dO, O> - dLSE into the workspace,
 * dq = dk = dv = 0), then per branch the dK/dV launches (one per query head of a kv group) and
 * the dQ launch, all accumulating in fp32. Grid shapes and per-launch parameters live here. */
#include "bwd.h"

#include <stdint.h>
#include <string.h>

static const unsigned kPrepThreads = 256;

static long long ceil_div(long long a, long long b) {
  return (a + b - 1) / b;
}

void rda_bwd_args_like_fwd(rda_bwd_args *g, const rda_fwd_args *a, const void *dout,
                           const float *dlse, float *dq, float *dk, float *dv, void *workspace) {
  memset(g, 0, sizeof *g);
  g->batch = a->batch;
  g->n = a->n;
  g->q = a->q, g->k = a->k, g->v = a->v;
  memcpy(g->q_s, a->q_s, sizeof g->q_s);
  memcpy(g->k_s, a->k_s, sizeof g->k_s);
  memcpy(g->v_s, a->v_s, sizeof g->v_s);
  g->o = a->o;
  memcpy(g->o_s, a->o_s, sizeof g->o_s);
  g->lse = a->lse;
  memcpy(g->lse_s, a->lse_s, sizeof g->lse_s);
  g->dout = dout;
  memcpy(g->do_s, a->q_s, sizeof g->do_s);
  g->dlse = dlse;
  memcpy(g->dlse_s, a->lse_s, sizeof g->dlse_s);
  g->dq = dq;
  memcpy(g->dq_s, a->q_s, sizeof g->dq_s);
  g->dk = dk;
  memcpy(g->dk_s, a->k_s, sizeof g->dk_s);
  g->dv = dv;
  memcpy(g->dv_s, a->k_s, sizeof g->dv_s);
  g->workspace = workspace;
  g->deterministic = 1;
}

size_t rda_bwd_workspace_bytes(const rda_plan_k *p, long long batch, long long n) {
  if (p == NULL || batch < 1 || n < 1) return 0;
  return (size_t)batch * (size_t)p->cfg.heads * (size_t)n * sizeof(float);
}

/* 16-bit inputs are read by 16-byte cp.async per row chunk. */
static int aligned16(const void *ptr, const long long s[3]) {
  return ((uintptr_t)ptr % 16) == 0 && s[0] % 8 == 0 && s[1] % 8 == 0 && s[2] % 8 == 0;
}

static int kernel_ok(const rda_plan_k *p, const rda_fwd_kernels *k, int index) {
  return index >= 0 && index < p->nvariants && index < k->n && k->modules[index] != NULL;
}

static rda_status check_args(const rda_plan_k *p, const rda_fwd_kernels *k, const rda_bwd_args *a,
                             rda_err *err) {
  if (!p->has_bwd)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "the plan has no backward kernels: plan it with rda_gen_plan_ex("
                       "..., RDA_PLAN_BACKWARD, ...)");
  if (a->batch < 1 || a->n < 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "batch = %lld, n = %lld: both must be >= 1",
                       a->batch, a->n);
  if (a->n > RDA_BWD_MAX_N)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "n = %lld: at most 2^31 - 1", a->n);
  if (a->q == NULL || a->k == NULL || a->v == NULL || a->o == NULL || a->lse == NULL ||
      a->dout == NULL || a->dq == NULL || a->dk == NULL || a->dv == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "a tensor pointer is NULL");
  if (a->workspace == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "workspace is NULL: rda_bwd_workspace_bytes() bytes are needed");
  if (!aligned16(a->q, a->q_s) || !aligned16(a->k, a->k_s) || !aligned16(a->v, a->v_s) ||
      !aligned16(a->dout, a->do_s))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "q, k, v and dout must be 16-byte aligned with strides that are multiples "
                       "of 8 elements");
  if (!kernel_ok(p, k, p->bwd_prep_kernel))
    return rda_err_set(err, RDA_ERR_INTERNAL, "the backward prep kernel is not loaded");
  for (int i = 0; i < p->nsteps; ++i)
    if (!kernel_ok(p, k, p->bwd_steps[i].dkdv_kernel) ||
        !kernel_ok(p, k, p->bwd_steps[i].dq_kernel) || p->bwd_steps[i].dsplit < 1 ||
        (p->bwd_steps[i].dkdv_atomic_kernel >= 0 &&
         !kernel_ok(p, k, p->bwd_steps[i].dkdv_atomic_kernel)))
      return rda_err_set(err, RDA_ERR_INTERNAL, "backward kernels of branch %d are not loaded",
                         p->bwd_steps[i].branch);
  return RDA_OK;
}

static rda_status launch_prep(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                              const rda_bwd_args *a, float *dp, rda_err *err) {
  rda_bwd_prep_params pp;
  memset(&pp, 0, sizeof pp);
  pp.o = a->o;
  pp.dout = a->dout;
  pp.lse = a->lse;
  pp.dlse = a->dlse;
  pp.dp = dp;
  pp.dq = a->dq;
  pp.dk = a->dk;
  pp.dv = a->dv;
  pp.o_sb = a->o_s[0], pp.o_sn = a->o_s[1], pp.o_sh = a->o_s[2];
  pp.do_sb = a->do_s[0], pp.do_sn = a->do_s[1], pp.do_sh = a->do_s[2];
  pp.lse_sb = a->lse_s[0], pp.lse_sh = a->lse_s[1];
  pp.dlse_sb = a->dlse_s[0], pp.dlse_sh = a->dlse_s[1];
  pp.dp_sb = (long long)p->cfg.heads * a->n, pp.dp_sh = a->n;
  pp.dq_sb = a->dq_s[0], pp.dq_sn = a->dq_s[1], pp.dq_sh = a->dq_s[2];
  pp.dk_sb = a->dk_s[0], pp.dk_sn = a->dk_s[1], pp.dk_sh = a->dk_s[2];
  pp.dv_sb = a->dv_s[0], pp.dv_sn = a->dv_s[1], pp.dv_sh = a->dv_s[2];
  pp.batch = a->batch;
  pp.n = a->n;
  pp.heads = p->cfg.heads;
  pp.kv_heads = p->cfg.kv_heads;
  pp.head_dim = p->cfg.head_dim;
  /* One thread per row, grid-stride beyond 65535 blocks. */
  long long blocks = ceil_div(a->batch * a->n * p->cfg.heads, kPrepThreads);
  if (blocks > 65535) blocks = 65535;
  const unsigned grid[3] = {(unsigned)blocks, 1, 1};
  return b->launch(b, k->modules[p->bwd_prep_kernel], grid, kPrepThreads, 0, &pp, sizeof pp, err);
}

void rda_bwd_params_for_step(const rda_plan_k *p, const rda_bwd_step *s, const rda_bwd_args *a,
                             rda_bwd_params *bp) {
  const double log2e = 1.4426950408889634;
  const int64_t r = p->cfg.dilations[s->branch];
  const int64_t w = p->cfg.segments[s->branch] < a->n ? p->cfg.segments[s->branch] : a->n;
  memset(bp, 0, sizeof *bp);
  bp->q = a->q;
  bp->k = a->k;
  bp->v = a->v;
  bp->dout = a->dout;
  bp->lse = a->lse;
  bp->dp = (const float *)a->workspace;
  bp->dq = a->dq;
  bp->dk = a->dk;
  bp->dv = a->dv;
  bp->q_sb = a->q_s[0], bp->q_sn = a->q_s[1], bp->q_sh = a->q_s[2];
  bp->k_sb = a->k_s[0], bp->k_sn = a->k_s[1], bp->k_sh = a->k_s[2];
  bp->v_sb = a->v_s[0], bp->v_sn = a->v_s[1], bp->v_sh = a->v_s[2];
  bp->do_sb = a->do_s[0], bp->do_sn = a->do_s[1], bp->do_sh = a->do_s[2];
  bp->dq_sb = a->dq_s[0], bp->dq_sn = a->dq_s[1], bp->dq_sh = a->dq_s[2];
  bp->dk_sb = a->dk_s[0], bp->dk_sn = a->dk_s[1], bp->dk_sh = a->dk_s[2];
  bp->dv_sb = a->dv_s[0], bp->dv_sn = a->dv_s[1], bp->dv_sh = a->dv_s[2];
  bp->lse_sb = a->lse_s[0], bp->lse_sh = a->lse_s[1];
  bp->dp_sb = (long long)p->cfg.heads * a->n, bp->dp_sh = a->n;
  bp->n = a->n;
  bp->w = w;
  bp->r = r;
  bp->nseg = ceil_div(a->n, w);
  bp->heads = p->cfg.heads;
  bp->kv_group = p->cfg.heads / p->cfg.kv_heads;
  bp->head0 = s->head0;
  bp->nheads = s->nheads;
  bp->offset_mode = p->cfg.offsets;
  bp->offset_arg = p->cfg.offsets == RDA_OFFSETS_BLOCK   ? (int)ceil_div(p->cfg.heads, r)
                   : p->cfg.offsets == RDA_OFFSETS_GROUP ? s->branch
                                                         : 0;
  bp->scale_log2 = (float)(p->cfg.scale * log2e);
  bp->scale = (float)p->cfg.scale;
  /* Every query and key of every segment (rda_params.h). */
  bp->q_hi = bp->kv_hi = a->n;
  /* Grid rows r positions apart; min(r, w): with r >= w only row 0 exists, so the step is
   * never taken, and r * stride could leave int64. */
  const int64_t rstep = r < w ? r : w;
  bp->k_rs = rstep * bp->k_sn;
  bp->v_rs = rstep * bp->v_sn;
  bp->dk_rs = rstep * bp->dk_sn;
  bp->dv_rs = rstep * bp->dv_sn;
}

/* Tiles of `block` grid rows per segment that hold the grid rows of positions [lo, hi): at most
 * ceil(w / r) in a segment, at most ceil((hi - lo) / r) in hi - lo consecutive positions. */
static long long range_tiles(const rda_bwd_params *bp, long long lo, long long hi, int block) {
  long long rows = ceil_div(bp->w, bp->r);
  const long long span = ceil_div(hi - lo, bp->r);
  if (span < rows) rows = span;
  return ceil_div(rows, block);
}

/* Nothing to compute: no segment, or an empty query or key range. */
static int ranges_empty(const rda_bwd_params *bp, long long nseg) {
  return nseg < 1 || bp->q_hi <= bp->q_lo || bp->kv_hi <= bp->kv_lo || bp->nheads < 1;
}

/* The dK/dV grid of variant v over nseg segments: key tiles x dsplit parts, ny blocks in y
 * (kv heads, or kv-table entries), the batch; sets bp->tiles_per_seg. RDA_ERR_UNSUPPORTED past
 * the launch limits. */
static rda_status dkdv_grid(const rda_bwd_step *s, const rda_variant *v, rda_bwd_params *bp,
                            long long nseg, long long batch, int dsplit, long long ny,
                            unsigned grid[3], rda_err *err) {
  const long long tiles = range_tiles(bp, bp->kv_lo, bp->kv_hi, v->block_n);
  const long long gx = nseg * tiles * dsplit;
  if (tiles > 0x7fffffffLL || gx > 0x7fffffffLL || ny > 65535 || batch > 65535)
    return rda_err_set(err, RDA_ERR_UNSUPPORTED,
                       "branch %d: dK/dV grid of %lld x %lld x %lld blocks exceeds the launch limits",
                       s->branch, gx, ny, batch);
  bp->tiles_per_seg = (int)tiles;
  grid[0] = (unsigned)gx, grid[1] = (unsigned)ny, grid[2] = (unsigned)batch;
  return RDA_OK;
}

/* dK/dV: one launch per member g of the kv groups, so that within a launch each kv head is
 * written by one query head's blocks (the offset rules give the heads of a group different
 * grids); launches run in order on the stream, each accumulating. */
rda_status rda_bwd_launch_dkdv(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                               const rda_bwd_step *s, rda_bwd_params *bp, long long nseg,
                               long long batch, int atomic, rda_err *err) {
  const int kernel = atomic ? s->dkdv_atomic_kernel : s->dkdv_kernel;
  if (!kernel_ok(p, k, kernel))
    return rda_err_set(err, RDA_ERR_INTERNAL, "branch %d: the %sdK/dV kernel is not %s", s->branch,
                       atomic ? "atomic " : "", kernel < 0 ? "planned" : "loaded");
  const int dsplit = atomic ? 1 : s->dsplit;
  if (ranges_empty(bp, nseg)) return RDA_OK;
  const rda_variant *v = &p->variants[kernel];
  const int group = bp->kv_group;
  bp->kv_head0 = bp->head0 / group;
  const int kv_end = (bp->head0 + bp->nheads - 1) / group + 1;
  unsigned grid[3];
  RDA_TRY(dkdv_grid(s, v, bp, nseg, batch, dsplit, kv_end - bp->kv_head0, grid, err));
  for (int g = 0; g < group; ++g) {
    /* Skip a member none of whose heads uses this branch (the "group" rule). */
    int used = 0;
    for (int h = bp->head0; h < bp->head0 + bp->nheads && !used; ++h) used = h % group == g;
    if (!used) continue;
    bp->group_member = g;
    RDA_TRY(b->launch(b, k->modules[kernel], grid, (unsigned)v->threads, (unsigned)v->smem_bytes,
                      bp, sizeof *bp, err));
  }
  return RDA_OK;
}

/* The ring's dK/dV twin: one launch, blockIdx.y = entry of bp->kvt (its query head, class block
 * and kv slot); the caller keeps the entries' (class, slot) pairs distinct. */
rda_status rda_bwd_launch_dkdv_table(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                                     const rda_bwd_step *s, rda_bwd_params *bp, long long nseg,
                                     long long batch, int nentries, rda_err *err) {
  const int kernel = s->dkdv_ring_kernel;
  if (!kernel_ok(p, k, kernel))
    return rda_err_set(err, RDA_ERR_INTERNAL, "branch %d: the kv-table dK/dV kernel is not %s",
                       s->branch, kernel < 0 ? "planned" : "loaded");
  if (nentries < 1 || ranges_empty(bp, nseg)) return RDA_OK;
  if (nentries > RDA_KV_TABLE_HEADS)
    return rda_err_set(err, RDA_ERR_INTERNAL, "branch %d: %d kv-table entries, at most %d",
                       s->branch, nentries, RDA_KV_TABLE_HEADS);
  const rda_variant *v = &p->variants[kernel];
  unsigned grid[3];
  RDA_TRY(dkdv_grid(s, v, bp, nseg, batch, s->dsplit, nentries, grid, err));
  bp->kv_head0 = 0;
  bp->group_member = 0;
  return b->launch(b, k->modules[kernel], grid, (unsigned)v->threads, (unsigned)v->smem_bytes, bp,
                   sizeof *bp, err);
}

/* dQ with variant `kernel`: the step's dq_kernel, or its kv-table twin. */
static rda_status launch_dq(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                            const rda_bwd_step *s, int kernel, rda_bwd_params *bp, long long nseg,
                            long long batch, rda_err *err) {
  if (!kernel_ok(p, k, kernel))
    return rda_err_set(err, RDA_ERR_INTERNAL, "branch %d: the %sdQ kernel is not %s", s->branch,
                       kernel == s->dq_kernel ? "" : "kv-table ",
                       kernel < 0 ? "planned" : "loaded");
  if (ranges_empty(bp, nseg)) return RDA_OK;
  const rda_variant *v = &p->variants[kernel];
  const long long tiles = range_tiles(bp, bp->q_lo, bp->q_hi, v->block_m);
  const long long gx = nseg * tiles;
  if (tiles > 0x7fffffffLL || gx > 0x7fffffffLL || bp->nheads > 65535 || batch > 65535)
    return rda_err_set(err, RDA_ERR_UNSUPPORTED,
                       "branch %d: dQ grid of %lld x %d x %lld blocks exceeds the launch limits",
                       s->branch, gx, bp->nheads, batch);
  bp->tiles_per_seg = (int)tiles;
  bp->kv_head0 = 0;
  bp->group_member = 0;
  const unsigned grid[3] = {(unsigned)gx, (unsigned)bp->nheads, (unsigned)batch};
  return b->launch(b, k->modules[kernel], grid, (unsigned)v->threads, (unsigned)v->smem_bytes, bp,
                   sizeof *bp, err);
}

rda_status rda_bwd_launch_dq(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                             const rda_bwd_step *s, rda_bwd_params *bp, long long nseg,
                             long long batch, rda_err *err) {
  return launch_dq(b, p, k, s, s->dq_kernel, bp, nseg, batch, err);
}

rda_status rda_bwd_launch_dq_table(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                                   const rda_bwd_step *s, rda_bwd_params *bp, long long nseg,
                                   long long batch, rda_err *err) {
  if (bp->nheads > RDA_KV_TABLE_HEADS)
    return rda_err_set(err, RDA_ERR_INTERNAL, "branch %d: %d heads in a kv-table dQ, at most %d",
                       s->branch, bp->nheads, RDA_KV_TABLE_HEADS);
  return launch_dq(b, p, k, s, s->dq_ring_kernel, bp, nseg, batch, err);
}

rda_status rda_bwd_prep(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                        const rda_bwd_args *a, rda_err *err) {
  if (b == NULL || p == NULL || k == NULL || a == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_bwd_prep: NULL argument");
  RDA_TRY(check_args(p, k, a, err));
  return launch_prep(b, p, k, a, (float *)a->workspace, err);
}

void rda_bwd_args_slice(const rda_plan_k *p, const rda_bwd_args *a, long long b0, long long most,
                        rda_bwd_args *sl) {
  *sl = *a;
  const long long left = a->batch - b0;
  sl->batch = left < most ? left : most;
  sl->q = (const uint16_t *)a->q + b0 * a->q_s[0];
  sl->k = (const uint16_t *)a->k + b0 * a->k_s[0];
  sl->v = (const uint16_t *)a->v + b0 * a->v_s[0];
  sl->o = a->o + b0 * a->o_s[0];
  sl->lse = a->lse + b0 * a->lse_s[0];
  sl->dout = (const uint16_t *)a->dout + b0 * a->do_s[0];
  if (a->dlse != NULL) sl->dlse = a->dlse + b0 * a->dlse_s[0];
  sl->dq = a->dq + b0 * a->dq_s[0];
  sl->dk = a->dk + b0 * a->dk_s[0];
  sl->dv = a->dv + b0 * a->dv_s[0];
  sl->workspace = (float *)a->workspace + b0 * (long long)p->cfg.heads * a->n;
}

/* Deterministic: every launch writes its rows with plain read-modify-writes and no two blocks
 * of one launch share a row, so the result is bit-identical run to run. With deterministic = 0
 * and an atomic dK/dV variant planned (RDA_PLAN_BACKWARD_ATOMIC), a branch is one launch that
 * also adds dQ by fp32 atomics, whose order varies. */
rda_status rda_bwd_run(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                       const rda_bwd_args *a, rda_err *err) {
  if (b == NULL || p == NULL || k == NULL || a == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_bwd_run: NULL argument");
  RDA_TRY(check_args(p, k, a, err));
  for (long long b0 = 0; b0 < a->batch; b0 += RDA_MAX_BATCH_PER_LAUNCH) {
    rda_bwd_args sl;
    rda_bwd_args_slice(p, a, b0, RDA_MAX_BATCH_PER_LAUNCH, &sl);
    RDA_TRY(launch_prep(b, p, k, &sl, (float *)sl.workspace, err));
    for (int i = 0; i < p->nsteps; ++i) {
      const rda_bwd_step *s = &p->bwd_steps[i];
      rda_bwd_params bp;
      rda_bwd_params_for_step(p, s, &sl, &bp);
      if (!sl.deterministic && s->dkdv_atomic_kernel >= 0) {
        RDA_TRY(rda_bwd_launch_dkdv(b, p, k, s, &bp, bp.nseg, sl.batch, 1, err));
      } else {
        RDA_TRY(rda_bwd_launch_dkdv(b, p, k, s, &bp, bp.nseg, sl.batch, 0, err));
        RDA_TRY(rda_bwd_launch_dq(b, p, k, s, &bp, bp.nseg, sl.batch, err));
      }
    }
  }
  return RDA_OK;
}
