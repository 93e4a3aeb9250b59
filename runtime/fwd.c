/* fwd.c — the forward pass of a plan: o = 0 / lse = -inf where needed, then one launch per
 * branch, each merging its partial result into the fp32 o / lse by log-sum-exp in its epilogue.
 * Grid shapes and per-launch parameters are computed here; the math lives in the templates. */
#include "fwd.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const unsigned kInitThreads = 256;

rda_status rda_fwd_load(rda_backend *b, const rda_plan_k *p, rda_fwd_kernels *out, rda_err *err) {
  out->n = 0;
  out->modules = calloc((size_t)p->nvariants, sizeof *out->modules);
  if (out->modules == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "out of memory");
  for (int i = 0; i < p->nvariants; ++i) {
    rda_status s = b->load(b, &p->variants[i], &out->modules[i], err);
    if (s != RDA_OK) {
      rda_fwd_unload(b, out);
      return s;
    }
    out->n = i + 1;
  }
  return RDA_OK;
}

void rda_fwd_unload(rda_backend *b, rda_fwd_kernels *k) {
  if (k == NULL || k->modules == NULL) return;
  for (int i = 0; i < k->n; ++i)
    if (k->modules[i] != NULL) b->unload(b, k->modules[i]);
  free(k->modules);
  k->modules = NULL;
  k->n = 0;
}

static long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

/* With r = 1 every offset rule gives j = 0, so a branch covers every row of its heads. */
static int step_covers_all_rows(const rda_plan_k *p, const rda_step *s) {
  return p->cfg.dilations[s->branch] == 1;
}

static int heads_overlap(const rda_step *a, const rda_step *b) {
  return a->head0 < b->head0 + b->nheads && b->head0 < a->head0 + a->nheads;
}

/* Init is needed unless, for every head, the first step touching it covers all its rows. */
static int needs_init(const rda_plan_k *p) {
  for (int h = 0; h < p->cfg.heads; ++h) {
    int covered = 0;
    for (int i = 0; i < p->nsteps; ++i) {
      const rda_step *s = &p->steps[i];
      if (h < s->head0 || h >= s->head0 + s->nheads) continue;
      covered = step_covers_all_rows(p, s);
      break;
    }
    if (!covered) return 1;
  }
  return 0;
}

rda_status rda_fwd_check_grid_rows(const rda_config *cfg, long long n, rda_err *err) {
  for (int i = 0; i < cfg->nbranch; ++i) {
    const int64_t w = cfg->segments[i] < n ? cfg->segments[i] : n;
    const int64_t rows = (w + cfg->dilations[i] - 1) / cfg->dilations[i];
    if (rows > 0x7fffffffLL)
      return rda_err_set(err, RDA_ERR_UNSUPPORTED,
                         "branch %d: %lld grid rows per segment (N = %lld): at most 2^31 - 1", i,
                         (long long)rows, n);
  }
  return RDA_OK;
}

static rda_status check_args(const rda_plan_k *p, const rda_fwd_args *a, rda_err *err) {
  if (a->batch < 1 || a->n < 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "batch = %lld, n = %lld: both must be >= 1",
                       a->batch, a->n);
  RDA_TRY(rda_fwd_check_grid_rows(&p->cfg, a->n, err));
  if (a->q == NULL || a->k == NULL || a->v == NULL || a->o == NULL || a->lse == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "a tensor pointer is NULL");
  /* The kernels move 16-byte vectors: 8 storage elements of Q/K/V rows, 4 floats of O. */
  const struct { const char *name; const void *ptr; const long long *s; int nstride, elems; } t[4] = {
      {"q", a->q, a->q_s, 3, 8}, {"k", a->k, a->k_s, 3, 8}, {"v", a->v, a->v_s, 3, 8},
      {"o", a->o, a->o_s, 3, 4}};
  for (int i = 0; i < 4; ++i) {
    if ((uintptr_t)t[i].ptr % 16 != 0)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: pointer %p is not 16-byte aligned",
                         t[i].name, t[i].ptr);
    for (int d = 0; d < t[i].nstride; ++d)
      if (t[i].s[d] % t[i].elems != 0)
        return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                           "%s: stride %d = %lld elements is not a multiple of %d (16 bytes)",
                           t[i].name, d, t[i].s[d], t[i].elems);
  }
  if ((uintptr_t)a->lse % 4 != 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "lse: pointer %p is not 4-byte aligned",
                       (const void *)a->lse);
  if (p->init_kernel < 0 || p->init_kernel >= p->nvariants)
    return rda_err_set(err, RDA_ERR_INTERNAL, "plan has no init kernel");
  return RDA_OK;
}

static rda_status launch_init(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                              const rda_fwd_args *a, rda_err *err) {
  rda_init_params ip;
  memset(&ip, 0, sizeof ip);
  ip.o = a->o;
  ip.lse = a->lse;
  ip.o_sb = a->o_s[0];
  ip.o_sn = a->o_s[1];
  ip.o_sh = a->o_s[2];
  ip.lse_sb = a->lse_s[0];
  ip.lse_sh = a->lse_s[1];
  ip.batch = a->batch;
  ip.n = a->n;
  ip.heads = p->cfg.heads;
  ip.head_dim = p->cfg.head_dim;
  /* Grid-stride kernel: enough blocks to fill the machine, never more than the rows. */
  long long rows = a->batch * a->n * p->cfg.heads;
  long long blocks = ceil_div(rows, kInitThreads / 8);
  if (blocks > 65535) blocks = 65535;
  const unsigned grid[3] = {(unsigned)blocks, 1, 1};
  return b->launch(b, k->modules[p->init_kernel], grid, kInitThreads, 0, &ip, sizeof ip, err);
}

rda_status rda_fwd_init(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                        const rda_fwd_args *a, rda_err *err) {
  RDA_TRY(check_args(p, a, err));
  return launch_init(b, p, k, a, err);
}

void rda_fwd_args_contiguous(rda_fwd_args *a, const rda_config *cfg, long long batch, long long n,
                             const void *q, const void *k, const void *v, float *o, float *lse) {
  const long long H = cfg->heads, Hkv = cfg->kv_heads, D = cfg->head_dim;
  const long long q_s[3] = {n * H * D, H * D, D}, k_s[3] = {n * Hkv * D, Hkv * D, D};
  memset(a, 0, sizeof *a);
  a->batch = batch;
  a->n = n;
  a->q = q, a->k = k, a->v = v;
  a->o = o;
  a->lse = lse;
  memcpy(a->q_s, q_s, sizeof q_s);
  memcpy(a->o_s, q_s, sizeof q_s);
  memcpy(a->k_s, k_s, sizeof k_s);
  memcpy(a->v_s, k_s, sizeof k_s);
  a->lse_s[0] = H * n, a->lse_s[1] = n;
}

void rda_fwd_params_for_step(const rda_plan_k *p, const rda_step *s, const rda_fwd_args *a,
                             rda_fwd_params *fp) {
  const int64_t r = p->cfg.dilations[s->branch];
  const int64_t w = p->cfg.segments[s->branch] < a->n ? p->cfg.segments[s->branch] : a->n;
  memset(fp, 0, sizeof *fp);
  fp->q = a->q;
  fp->k = a->k;
  fp->v = a->v;
  fp->o = a->o;
  fp->lse = a->lse;
  fp->q_sb = a->q_s[0], fp->q_sn = a->q_s[1], fp->q_sh = a->q_s[2];
  fp->k_sb = a->k_s[0], fp->k_sn = a->k_s[1], fp->k_sh = a->k_s[2];
  fp->v_sb = a->v_s[0], fp->v_sn = a->v_s[1], fp->v_sh = a->v_s[2];
  fp->o_sb = a->o_s[0], fp->o_sn = a->o_s[1], fp->o_sh = a->o_s[2];
  fp->lse_sb = a->lse_s[0], fp->lse_sh = a->lse_s[1];
  fp->n = a->n;
  fp->w = w;
  fp->r = r;
  fp->nseg = ceil_div(a->n, w);
  fp->tiles_per_seg = (int)ceil_div(ceil_div(w, r), p->variants[s->kernel].block_m);
  fp->heads = p->cfg.heads;
  fp->kv_group = p->cfg.heads / p->cfg.kv_heads;
  fp->head0 = s->head0;
  fp->offset_mode = p->cfg.offsets;
  fp->offset_arg = p->cfg.offsets == RDA_OFFSETS_BLOCK   ? (int)ceil_div(p->cfg.heads, r)
                   : p->cfg.offsets == RDA_OFFSETS_GROUP ? s->branch
                                                         : 0;
  fp->scale_log2 = (float)(p->cfg.scale * 1.4426950408889634); /* log2(e) */
  /* Every query and key of every segment (rda_params.h). */
  fp->q_hi = fp->kv_hi = a->n;
  /* Grid rows r positions apart; min(r, w): with r >= w only row 0 exists, so the step is
   * never taken, and r * stride could leave int64. */
  const int64_t rstep = r < w ? r : w;
  fp->k_rs = rstep * fp->k_sn;
  fp->v_rs = rstep * fp->v_sn;
}

/* One launch series over a slice of at most RDA_MAX_BATCH_PER_LAUNCH batch entries. */
static rda_status fwd_run_slice(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                                const rda_fwd_args *a, rda_err *err) {
  /* Every step's grid first: a step past the launch limits fails the call before anything
   * is written to o or lse. */
  for (int i = 0; i < p->nsteps; ++i) {
    const rda_step *s = &p->steps[i];
    rda_fwd_params fp;
    rda_fwd_params_for_step(p, s, a, &fp);
    const long long gx = fp.nseg * fp.tiles_per_seg;
    if (gx > 0x7fffffffLL || s->nheads > 65535)
      return rda_err_set(err, RDA_ERR_UNSUPPORTED,
                         "branch %d: grid of %lld x %d blocks exceeds the launch limits", s->branch,
                         gx, s->nheads);
  }
  if (needs_init(p)) RDA_TRY(launch_init(b, p, k, a, err));

  for (int i = 0; i < p->nsteps; ++i) {
    const rda_step *s = &p->steps[i];
    const rda_variant *v = &p->variants[s->kernel];

    rda_fwd_params fp;
    rda_fwd_params_for_step(p, s, a, &fp);
    /* The first step to touch these heads overwrites; later ones merge. */
    fp.merge = 0;
    for (int e = 0; e < i; ++e)
      if (heads_overlap(&p->steps[e], s)) fp.merge = 1;

    const long long gx = fp.nseg * fp.tiles_per_seg;
    const unsigned grid[3] = {(unsigned)gx, (unsigned)s->nheads, (unsigned)a->batch};
    RDA_TRY(b->launch(b, k->modules[s->kernel], grid, (unsigned)v->threads,
                      (unsigned)v->smem_bytes, &fp, sizeof fp, err));
  }
  return RDA_OK;
}

void rda_fwd_args_slice(const rda_fwd_args *a, long long b0, long long most, rda_fwd_args *sl) {
  *sl = *a;
  sl->batch = a->batch - b0 < most ? a->batch - b0 : most;
  sl->q = (const uint16_t *)a->q + b0 * a->q_s[0];
  sl->k = (const uint16_t *)a->k + b0 * a->k_s[0];
  sl->v = (const uint16_t *)a->v + b0 * a->v_s[0];
  sl->o = a->o + b0 * a->o_s[0];
  sl->lse = a->lse + b0 * a->lse_s[0];
}

rda_status rda_fwd_run(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                       const rda_fwd_args *a, rda_err *err) {
  RDA_TRY(check_args(p, a, err));
  /* The batch is the grid's z dimension: a larger one runs slice by slice. */
  for (long long b0 = 0; b0 < a->batch; b0 += RDA_MAX_BATCH_PER_LAUNCH) {
    rda_fwd_args sl;
    rda_fwd_args_slice(a, b0, RDA_MAX_BATCH_PER_LAUNCH, &sl);
    RDA_TRY(fwd_run_slice(b, p, k, &sl, err));
  }
  return RDA_OK;
}
