/* tune.c — the autotuner behind `rdagen tune`: every candidate tile of every tuning task is
 * planned on a one-branch copy of the config, checked against the float64 reference at a small
 * size, timed at the requested size and cross-checked there against the first passing
 * candidate; the rankings are merged into the tuning database text (runtime/gen.h, "tuning"). */
#include "tune.h"

#include "bwd.h"
#include "check.h"
#include "fwd.h"
#include "reference.h"
#include "rng.h"
#include "tuning_db.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { TUNE_MAX_ITERS = 100000 };

/* One problem size's tensors: host copies of the inputs (storage bits, plus float64 for the
 * reference at the verify size) and backend buffers of inputs and outputs. */
typedef struct tune_size {
  long long batch, n;
  size_t nq, nk, nl; /* elements of q/o/dq, k/v/dk/dv, lse/dlse */
  uint16_t *q, *k, *v, *dout;
  float *dlse;
  void *dev_q, *dev_k, *dev_v, *dev_do, *dev_dlse;
  float *dev_o, *dev_lse, *dev_dq, *dev_dk, *dev_dv;
  float *o, *lse, *dq, *dk, *dv; /* host copies of the outputs, downloaded */
} tune_size;

/* The float64 reference of one branch at the verify size (batch 1), made when first needed;
 * with the gradients their magnitudes, so that a gradient which cancels (segments of one row,
 * a verify size of 1) is judged against the scale of the kernel's rounding (check.h). */
typedef struct tune_ref {
  int have_fwd, have_bwd;
  double *o, *lse, *dq, *dk, *dv;
  double *dq_mag, *dk_mag, *dv_mag;
} tune_ref;

/* The first passing candidate's outputs at the timed size (what later ones must agree with). */
typedef struct tune_first {
  int have;
  char tile[RDA_TUNE_NAME]; /* which candidate it was */
  float *o, *lse, *dq, *dk, *dv;
} tune_first;

typedef struct tune_run {
  rda_backend *b;
  rda_gen *g;
  const rda_hw *hw;
  const rda_config *cfg;
  const rda_tune_opts *o;
  tune_size ver, big;
  double *qd, *kd, *vd, *dod, *dlsed; /* the verify inputs as the reference reads them */
  tune_ref refs[RDA_MAX_BRANCHES];
  void **evs;   /* iters + 1 timed events: pass i runs between evs[i] and evs[i + 1] */
  float *times; /* iters */
  rda_err fatal; /* a failure no tile is to blame for (the kernel cache refused): ends the run */
} tune_run;

static void tune_log(const rda_tune_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void tune_log(const rda_tune_opts *o, const char *fmt, ...) {
  if (o->log == NULL) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  o->log(o->log_ud, line);
}

/* The one-branch config of task branch `br`: cfg with only that branch. */
static rda_config tune_branch_config(const rda_config *cfg, int br) {
  rda_config c = *cfg;
  c.nbranch = 1;
  c.segments[0] = cfg->segments[br];
  c.dilations[0] = cfg->dilations[br];
  for (int i = 1; i < RDA_MAX_BRANCHES; i++) c.segments[i] = 0, c.dilations[i] = 0;
  return c;
}

static int tune_is_bwd(const rda_tune_task *t) {
  return strncmp(t->kind, "bwd_", 4) == 0;
}

/* ---- buffers ------------------------------------------------------------------------------ */

static void tune_size_free(rda_backend *b, tune_size *s) {
  void *dev[] = {s->dev_q, s->dev_k,   s->dev_v,  s->dev_do, s->dev_dlse,
                 s->dev_o, s->dev_lse, s->dev_dq, s->dev_dk, s->dev_dv};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
    if (dev[i] != NULL) b->free(b, dev[i]);
  void *host[] = {s->q, s->k, s->v, s->dout, s->dlse, s->o, s->lse, s->dq, s->dk, s->dv};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
  memset(s, 0, sizeof *s);
}

/* Draw the inputs of one size (normal(0, 1), rounded to the dtype; dLSE in fp32) into host
 * memory; with d64 (verify size) also their float64 values. Then allocate and upload. */
static rda_status tune_size_make(tune_run *r, tune_size *s, long long batch, long long n,
                                 int backward, rda_rng *rng, int with_f64, rda_err *err) {
  const rda_config *c = r->cfg;
  rda_backend *b = r->b;
  s->batch = batch, s->n = n;
  s->nq = (size_t)(batch * n * c->heads * c->head_dim);
  s->nk = (size_t)(batch * n * c->kv_heads * c->head_dim);
  s->nl = (size_t)(batch * c->heads * n);
  s->q = malloc(s->nq * sizeof *s->q), s->k = malloc(s->nk * sizeof *s->k);
  s->v = malloc(s->nk * sizeof *s->v), s->o = malloc(s->nq * sizeof *s->o);
  s->lse = malloc(s->nl * sizeof *s->lse);
  if (!s->q || !s->k || !s->v || !s->o || !s->lse) goto oom;
  if (backward) {
    s->dout = malloc(s->nq * sizeof *s->dout), s->dlse = malloc(s->nl * sizeof *s->dlse);
    s->dq = malloc(s->nq * sizeof *s->dq), s->dk = malloc(s->nk * sizeof *s->dk);
    s->dv = malloc(s->nk * sizeof *s->dv);
    if (!s->dout || !s->dlse || !s->dq || !s->dk || !s->dv) goto oom;
  }
  if (with_f64) {
    r->qd = malloc(s->nq * sizeof *r->qd), r->kd = malloc(s->nk * sizeof *r->kd);
    r->vd = malloc(s->nk * sizeof *r->vd);
    if (!r->qd || !r->kd || !r->vd) goto oom;
    if (backward) {
      r->dod = malloc(s->nq * sizeof *r->dod), r->dlsed = malloc(s->nl * sizeof *r->dlsed);
      if (!r->dod || !r->dlsed) goto oom;
    }
  }
  struct {
    uint16_t *bits;
    double *x;
    size_t count;
  } in[4] = {
      {s->q, r->qd, s->nq}, {s->k, r->kd, s->nk}, {s->v, r->vd, s->nk}, {s->dout, r->dod, s->nq}};
  for (int a = 0; a < (backward ? 4 : 3); a++)
    for (size_t i = 0; i < in[a].count; i++) {
      in[a].bits[i] = rda_to_dtype_bits(rda_rng_normal(rng), c->dtype);
      if (with_f64) in[a].x[i] = rda_from_dtype_bits(in[a].bits[i], c->dtype);
    }
  if (backward)
    for (size_t i = 0; i < s->nl; i++) {
      s->dlse[i] = (float)rda_rng_normal(rng);
      if (with_f64) r->dlsed[i] = s->dlse[i];
    }

  void **dev[] = {
      &s->dev_q,  &s->dev_k,    &s->dev_v,           (void **)&s->dev_o,  (void **)&s->dev_lse,
      &s->dev_do, &s->dev_dlse, (void **)&s->dev_dq, (void **)&s->dev_dk, (void **)&s->dev_dv};
  const size_t bytes[] = {s->nq * 2, s->nk * 2, s->nk * 2, s->nq * 4, s->nl * 4,
                          s->nq * 2, s->nl * 4, s->nq * 4, s->nk * 4, s->nk * 4};
  for (int i = 0; i < (backward ? 10 : 5); i++) RDA_TRY(b->alloc(b, bytes[i], dev[i], err));
  RDA_TRY(b->upload(b, s->dev_q, s->q, bytes[0], err));
  RDA_TRY(b->upload(b, s->dev_k, s->k, bytes[1], err));
  RDA_TRY(b->upload(b, s->dev_v, s->v, bytes[2], err));
  if (backward) {
    RDA_TRY(b->upload(b, s->dev_do, s->dout, bytes[5], err));
    RDA_TRY(b->upload(b, s->dev_dlse, s->dlse, bytes[6], err));
  }
  return RDA_OK;
oom:
  return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "tuning: out of memory for B = %lld, N = %lld", batch,
                     n);
}

/* The reference of branch br at the verify size: forward, and with bwd the gradients. */
static rda_status tune_ref_get(tune_run *r, int br, int bwd, const rda_config *c1, tune_ref **out,
                               rda_err *err) {
  tune_ref *f = &r->refs[br];
  const tune_size *s = &r->ver;
  if (!f->have_fwd) {
    free(f->o), free(f->lse); /* what an earlier attempt left when it ran out of memory */
    f->o = malloc(s->nq * sizeof *f->o), f->lse = malloc(s->nl * sizeof *f->lse);
    if (!f->o || !f->lse) goto oom;
    rda_ref_forward(c1, 1, s->n, r->qd, r->kd, r->vd, f->o, f->lse);
    f->have_fwd = 1;
  }
  if (bwd && !f->have_bwd) {
    free(f->dq), free(f->dk), free(f->dv), free(f->dq_mag), free(f->dk_mag), free(f->dv_mag);
    f->dq = malloc(s->nq * sizeof *f->dq), f->dk = malloc(s->nk * sizeof *f->dk);
    f->dv = malloc(s->nk * sizeof *f->dv);
    f->dq_mag = malloc(s->nq * sizeof *f->dq_mag), f->dk_mag = malloc(s->nk * sizeof *f->dk_mag);
    f->dv_mag = malloc(s->nk * sizeof *f->dv_mag);
    if (!f->dq || !f->dk || !f->dv || !f->dq_mag || !f->dk_mag || !f->dv_mag) goto oom;
    rda_ref_backward(c1, 1, s->n, r->qd, r->kd, r->vd, r->dod, r->dlsed, f->dq, f->dk, f->dv,
                     f->dq_mag, f->dk_mag, f->dv_mag);
    f->have_bwd = 1;
  }
  *out = f;
  return RDA_OK;
oom:
  return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "tuning: out of memory for the reference");
}

/* ---- running one candidate ---------------------------------------------------------------- */

/* NaN in every fp32 output of s (all-ones bits), so an element no kernel writes fails. */
static rda_status tune_poison(rda_backend *b, const tune_size *s, int bwd, rda_err *err) {
  RDA_TRY(b->memset_async(b, s->dev_o, 0xff, s->nq * 4, err));
  RDA_TRY(b->memset_async(b, s->dev_lse, 0xff, s->nl * 4, err));
  if (bwd) {
    RDA_TRY(b->memset_async(b, s->dev_dq, 0xff, s->nq * 4, err));
    RDA_TRY(b->memset_async(b, s->dev_dk, 0xff, s->nk * 4, err));
    RDA_TRY(b->memset_async(b, s->dev_dv, 0xff, s->nk * 4, err));
  }
  return RDA_OK;
}

static rda_status tune_download(rda_backend *b, tune_size *s, int bwd, rda_err *err) {
  RDA_TRY(b->download(b, s->o, s->dev_o, s->nq * 4, err));
  RDA_TRY(b->download(b, s->lse, s->dev_lse, s->nl * 4, err));
  if (bwd) {
    RDA_TRY(b->download(b, s->dq, s->dev_dq, s->nq * 4, err));
    RDA_TRY(b->download(b, s->dk, s->dev_dk, s->nk * 4, err));
    RDA_TRY(b->download(b, s->dv, s->dev_dv, s->nk * 4, err));
  }
  return RDA_OK;
}

/* The argument blocks of one size; the backward's workspace (ws) is the caller's. */
static void tune_args(const rda_config *c1, const tune_size *s, void *ws, rda_fwd_args *a,
                      rda_bwd_args *g) {
  rda_fwd_args_contiguous(a, c1, s->batch, s->n, s->dev_q, s->dev_k, s->dev_v, s->dev_o,
                          s->dev_lse);
  rda_bwd_args_like_fwd(g, a, s->dev_do, s->dev_dlse, s->dev_dq, s->dev_dk, s->dev_dv, ws);
  g->deterministic = 1;
}

static int tune_cmp_float(const void *x, const void *y) {
  const float a = *(const float *)x, b = *(const float *)y;
  return (a > b) - (a < b);
}

/* ||got - ref|| / ||ref|| over n floats (the plain norm when ref is 0); NaN/Inf in got count
 * in *bad. */
static double tune_rel_l2(const float *got, const float *ref, size_t n, long long *bad) {
  double e2 = 0, r2 = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) {
      ++*bad;
      continue;
    }
    const double d = (double)got[i] - (double)ref[i];
    e2 += d * d;
    r2 += (double)ref[i] * ref[i];
  }
  return r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
}

/* The timed-size outputs of s against the first passing candidate's, with twice the SPEC §5
 * tolerances: O (rel L2) and LSE (max abs, the same rows -inf), or dQ, dK, dV (rel L2). */
static int tune_cross_check(const rda_config *c1, const tune_size *s, const tune_first *f, int bwd,
                            char *why, size_t cap) {
  const rda_tolerance t = rda_tolerance_for(c1->dtype);
  long long bad = 0;
  if (!bwd) {
    const double rel = tune_rel_l2(s->o, f->o, s->nq, &bad);
    double lse_max = 0;
    long long mismatch = 0;
    for (size_t i = 0; i < s->nl; i++) {
      const float x = s->lse[i], y = f->lse[i];
      if (isinf(y) && y < 0) {
        mismatch += !(isinf(x) && x < 0);
      } else if (!isfinite(x)) {
        mismatch++;
      } else if (fabs((double)x - y) > lse_max) {
        lse_max = fabs((double)x - y);
      }
    }
    if (bad == 0 && mismatch == 0 && rel <= 2 * t.o_rel_l2 && lse_max <= 2 * t.lse_abs) return 1;
    snprintf(why, cap,
             "at n=%lld batch %lld disagrees with the first passing tile: O rel L2 %.3g "
             "(tol %.1g), LSE max err %.3g (tol %.1g), %lld NaN/Inf, %lld coverage mismatches",
             s->n, s->batch, rel, 2 * t.o_rel_l2, lse_max, 2 * t.lse_abs, bad, mismatch);
    return 0;
  }
  const char *names[3] = {"dQ", "dK", "dV"};
  const float *got[3] = {s->dq, s->dk, s->dv}, *ref[3] = {f->dq, f->dk, f->dv};
  const size_t n[3] = {s->nq, s->nk, s->nk};
  for (int i = 0; i < 3; i++) {
    const double rel = tune_rel_l2(got[i], ref[i], n[i], &bad);
    if (bad == 0 && rel <= 2 * t.grad_rel_l2) continue;
    snprintf(why, cap,
             "at n=%lld batch %lld disagrees with the first passing tile: %s rel L2 %.3g "
             "(tol %.1g), %lld NaN/Inf",
             s->n, s->batch, names[i], rel, 2 * t.grad_rel_l2, bad);
    return 0;
  }
  return 1;
}

/* The first passing candidate's timed-size outputs have no reference to agree with; they must
 * at least have SPEC §1's shape: every covered row a finite LSE and O, every uncovered row
 * LSE exactly -inf and O exactly 0 (a kernel that never ran leaves the init's zeros, or the
 * poison), and finite gradients. */
static int tune_sane(const rda_config *c1, const tune_size *s, int bwd, char *why, size_t cap) {
  const long long H = c1->heads, D = c1->head_dim, n = s->n;
  long long bad = 0, wrong_cover = 0;
  for (long long b = 0; b < s->batch; b++)
    for (long long h = 0; h < H; h++)
      for (long long p = 0; p < n; p++) {
        const float lse = s->lse[(b * H + h) * n + p];
        const float *o = s->o + ((b * n + p) * H + h) * D;
        const int covered = rda_config_covers(c1, n, (int)h, p);
        int row_bad = covered ? !isfinite(lse) : !(isinf(lse) && lse < 0);
        for (long long d = 0; d < D; d++) row_bad |= covered ? !isfinite(o[d]) : o[d] != 0.0f;
        wrong_cover += row_bad;
      }
  if (bwd) {
    for (size_t i = 0; i < s->nq; i++) bad += !isfinite(s->dq[i]);
    for (size_t i = 0; i < s->nk; i++) bad += !isfinite(s->dk[i]) + !isfinite(s->dv[i]);
  }
  if (bad == 0 && wrong_cover == 0) return 1;
  snprintf(why, cap,
           "at n=%lld batch %lld: %lld rows whose O and LSE do not match their coverage "
           "(covered: finite; uncovered: 0 and -inf), %lld NaN/Inf gradients",
           s->n, s->batch, wrong_cover, bad);
  return 0;
}

static void tune_first_free(tune_first *f) {
  free(f->o), free(f->lse), free(f->dq), free(f->dk), free(f->dv);
  memset(f, 0, sizeof *f);
}

/* Keep s's timed-size outputs as the ones later candidates must agree with. */
static rda_status tune_first_keep(tune_first *f, const tune_size *s, int bwd, rda_err *err) {
  float **dst[5] = {&f->o, &f->lse, &f->dq, &f->dk, &f->dv};
  const float *src[5] = {s->o, s->lse, s->dq, s->dk, s->dv};
  const size_t n[5] = {s->nq, s->nl, s->nq, s->nk, s->nk};
  for (int i = 0; i < (bwd ? 5 : 2); i++) {
    *dst[i] = malloc(n[i] * sizeof(float));
    if (*dst[i] == NULL) {
      tune_first_free(f); /* the next passing candidate tries again from nothing */
      return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "tuning: out of memory for the cross-check");
    }
    memcpy(*dst[i], src[i], n[i] * sizeof(float));
  }
  f->have = 1;
  return RDA_OK;
}


/* Plan, load, verify, time and cross-check one candidate tile of task t. On success *us is
 * its median in microseconds; a failure of any step is returned with its message in err (the
 * caller records it and goes on), *step naming the step. */
static rda_status tune_candidate(tune_run *r, const rda_tune_task *t, const char *tile,
                                 tune_first *first, double *us, const char **step, int *disagree,
                                 rda_err *err) {
  rda_backend *b = r->b;
  const int bwd = tune_is_bwd(t);
  const rda_config c1 = tune_branch_config(r->cfg, t->branch);
  unsigned flags = r->o->flags & ~(unsigned)(RDA_PLAN_BACKWARD | RDA_PLAN_BACKWARD_ATOMIC);
  if (bwd) flags |= RDA_PLAN_BACKWARD;
  const rda_gen_force force = {t->kind, 0, tile};
  rda_plan_k plan;
  memset(&plan, 0, sizeof plan);
  rda_fwd_kernels k = {0};
  void *ws = NULL;
  rda_fwd_args a;
  rda_bwd_args g;
  rda_status s;
  tune_ref *ref = NULL;

  *step = "plan";
  s = rda_gen_plan_forced(r->g, &c1, r->hw, flags, &force, &plan, err);
  if (s != RDA_OK) goto done;
  if (bwd && !plan.has_bwd) {
    s = rda_err_set(err, RDA_ERR_INTERNAL, "the plan has no backward kernels");
    goto done;
  }
  *step = "load";
  if ((s = rda_fwd_load(b, &plan, &k, err)) != RDA_OK) goto done;

  /* Verify at the small size against the float64 reference. */
  *step = "verify";
  if ((s = tune_ref_get(r, t->branch, bwd, &c1, &ref, err)) != RDA_OK) goto done;
  const size_t ws_ver = bwd ? rda_bwd_workspace_bytes(&plan, 1, r->ver.n) : 0;
  const size_t ws_big = bwd ? rda_bwd_workspace_bytes(&plan, r->big.batch, r->big.n) : 0;
  const size_t ws_bytes = ws_ver > ws_big ? ws_ver : ws_big;
  if (ws_bytes > 0 && (s = b->alloc(b, ws_bytes, &ws, err)) != RDA_OK) goto done;
  tune_args(&c1, &r->ver, ws, &a, &g);
  if ((s = tune_poison(b, &r->ver, bwd, err)) != RDA_OK ||
      (s = rda_fwd_run(b, &plan, &k, &a, err)) != RDA_OK ||
      (bwd && (s = rda_bwd_run(b, &plan, &k, &g, err)) != RDA_OK) ||
      (s = b->synchronize(b, err)) != RDA_OK || (s = tune_download(b, &r->ver, bwd, err)) != RDA_OK)
    goto done;
  const long long n = r->ver.n, H = c1.heads, D = c1.head_dim, Hkv = c1.kv_heads;
  const long long o_s[3] = {n * H * D, H * D, D}, l_s[2] = {H * n, n};
  const long long k_s[3] = {n * Hkv * D, Hkv * D, D};
  if (!bwd) {
    rda_check_result res;
    rda_check_forward(&c1, 1, n, r->ver.o, o_s, r->ver.lse, l_s, ref->o, ref->lse, &res);
    if (!res.pass) {
      s = rda_err_set(err, RDA_ERR_INTERNAL, "wrong at n=%lld: %s", n, res.first_failure);
      goto done;
    }
  } else {
    rda_check_grad_result res;
    rda_check_grad(&c1, 1, n, r->ver.dq, o_s, r->ver.dk, k_s, r->ver.dv, k_s, ref->dq, ref->dk,
                   ref->dv, ref->dq_mag, ref->dk_mag, ref->dv_mag, &res);
    if (!res.pass) {
      s = rda_err_set(err, RDA_ERR_INTERNAL, "wrong at n=%lld: %s", n, res.first_failure);
      goto done;
    }
  }

  /* Time at the requested size: one untimed pass, then iters passes between timed events.
   * The backward's forward outputs are made once, untimed. */
  *step = "time";
  tune_args(&c1, &r->big, ws, &a, &g);
  if ((s = tune_poison(b, &r->big, bwd, err)) != RDA_OK ||
      (s = rda_fwd_run(b, &plan, &k, &a, err)) != RDA_OK ||
      (bwd && (s = rda_bwd_run(b, &plan, &k, &g, err)) != RDA_OK))
    goto done;
  /* The passes are queued back to back behind the untimed one, as a training step queues
   * them, so the host's launch latency hides behind the device's work instead of being timed
   * with every pass (the first one included: the device is still busy when it is queued). */
  for (int i = 0; i < r->o->iters; i++)
    if ((s = b->event_record(b, r->evs[i], err)) != RDA_OK ||
        (s = bwd ? rda_bwd_run(b, &plan, &k, &g, err) : rda_fwd_run(b, &plan, &k, &a, err)) !=
            RDA_OK)
      goto done;
  if ((s = b->event_record(b, r->evs[r->o->iters], err)) != RDA_OK ||
      (s = b->synchronize(b, err)) != RDA_OK)
    goto done;
  for (int i = 0; i < r->o->iters; i++) {
    float ms = 0;
    if ((s = b->event_elapsed_ms(b, r->evs[i], r->evs[i + 1], &ms, err)) != RDA_OK) goto done;
    r->times[i] = ms;
  }
  qsort(r->times, (size_t)r->o->iters, sizeof *r->times, tune_cmp_float);
  const int m = r->o->iters;
  const double med_ms =
      m % 2 ? r->times[m / 2] : 0.5 * ((double)r->times[m / 2 - 1] + r->times[m / 2]);
  *us = med_ms * 1000.0;
  if (!(*us > 0)) *us = 1e-3; /* a clock too coarse for the pass: rank it, never as 0 */

  /* The same outputs at the timed size as the first passing candidate's. */
  *step = "cross-check";
  if ((s = tune_download(b, &r->big, bwd, err)) != RDA_OK) goto done;
  char why[400];
  /* Outputs of the wrong shape (NaN, a covered row left empty) are plainly this tile's fault;
   * only a sane tile whose values differ is a disagreement the majority must settle. */
  if (!tune_sane(&c1, &r->big, bwd, why, sizeof why)) {
    s = rda_err_set(err, RDA_ERR_INTERNAL, "%s", why);
  } else if (!first->have) {
    s = tune_first_keep(first, &r->big, bwd, err);
    snprintf(first->tile, sizeof first->tile, "%s", tile);
  } else if (!tune_cross_check(&c1, &r->big, first, bwd, why, sizeof why)) {
    s = rda_err_set(err, RDA_ERR_INTERNAL, "%s", why);
    *disagree = 1;
  }
done:
  if (ws != NULL) b->free(b, ws);
  rda_fwd_unload(b, &k);
  rda_plan_k_free(&plan);
  return s;
}

/* ---- one task ------------------------------------------------------------------------------ */

/* Every candidate of task ti: rep->outcome ranks those that passed, rep->failed says why the
 * others did not (none passing is the caller's to report). */
static void tune_task(tune_run *r, int ti, const rda_tune_task *t, rda_tune_report *rep) {
  memset(rep, 0, sizeof *rep);
  rep->task = *t;
  rep->outcome.task = ti;
  tune_first first = {0};
  tune_log(r->o, "%s: %d candidates (now %s)", t->key, t->ncandidates, t->chosen);
  /* The tile plans take now runs first, so it is the one the others must agree with at the
   * timed size: the tile users already run, not a tile the space merely lists first. */
  int order[RDA_TUNE_MAX_CANDIDATES], norder = 0;
  const int nc = t->ncandidates < RDA_TUNE_MAX_CANDIDATES ? t->ncandidates : RDA_TUNE_MAX_CANDIDATES;
  for (int c = 0; c < nc; c++)
    if (strcmp(t->candidates[c], t->chosen) == 0) order[norder++] = c;
  for (int c = 0; c < nc; c++)
    if (strcmp(t->candidates[c], t->chosen) != 0) order[norder++] = c;
  int ndisagree = 0;
  for (int oi = 0; oi < norder; oi++) {
    const char *tile = t->candidates[order[oi]];
    rda_err cerr = {0};
    const char *step = "plan";
    double us = 0;
    int disagree = 0;
    if (tune_candidate(r, t, tile, &first, &us, &step, &disagree, &cerr) == RDA_OK) {
      const int i = rep->outcome.nranked++;
      snprintf(rep->outcome.ranked[i].tile, sizeof rep->outcome.ranked[i].tile, "%s", tile);
      rep->outcome.ranked[i].us = us;
      tune_log(r->o, "  %s  %-24s %10.1f us", t->key, tile, us);
    } else if (cerr.status == RDA_ERR_CACHE) {
      /* The kernel cache refused (a folder writable by others, say): every tile would fail
       * alike, and the message is the folder's, not the tile's. */
      rda_err_set(&r->fatal, cerr.status, "%s", cerr.msg);
      break;
    } else {
      ndisagree += disagree;
      char *f = rep->failed[rep->nfailed++];
      const int len = snprintf(f, sizeof rep->failed[0], "%s: %s: %s", tile, step, cerr.msg);
      if (len >= (int)sizeof rep->failed[0]) memcpy(f + sizeof rep->failed[0] - 4, "...", 4);
      tune_log(r->o, "  %s  %-24s FAILED: %s: %s", t->key, tile, step, cerr.msg);
    }
  }
  /* Outputs at the timed size have no float64 reference: a disagreement is settled by the
   * majority, the first tile among them. When as many tiles disagree with it as agree, any of
   * them may be the wrong one: rank none, so the task fails. */
  if (ndisagree > 0 && ndisagree >= rep->outcome.nranked) {
    snprintf(rep->failed[rep->nfailed++], sizeof rep->failed[0],
             "at n=%lld, %d other tile(s) agree with %s and %d disagree: cannot tell which are "
             "right",
             r->big.n, rep->outcome.nranked - 1, first.tile, ndisagree);
    tune_log(r->o, "  %s  FAILED: at the timed size %d other tile(s) agree with %s, %d disagree",
             t->key, rep->outcome.nranked - 1, first.tile, ndisagree);
    rep->outcome.nranked = 0;
  }
  tune_first_free(&first);
  /* Fastest first; an insertion sort (at most 16 entries) keeps ties in the space's order. */
  rda_tune_outcome *oc = &rep->outcome;
  for (int i = 1; i < oc->nranked; i++)
    for (int j = i; j > 0 && oc->ranked[j].us < oc->ranked[j - 1].us; j--) {
      char tile[RDA_TUNE_NAME];
      const double us = oc->ranked[j].us;
      memcpy(tile, oc->ranked[j].tile, sizeof tile);
      oc->ranked[j] = oc->ranked[j - 1];
      memcpy(oc->ranked[j - 1].tile, tile, sizeof tile);
      oc->ranked[j - 1].us = us;
    }
}

/* ---- the run -------------------------------------------------------------------------------- */

static void tune_run_free(tune_run *r) {
  if (r->b != NULL) {
    tune_size_free(r->b, &r->ver);
    tune_size_free(r->b, &r->big);
    for (int i = 0; r->evs != NULL && i <= r->o->iters; i++) r->b->event_destroy(r->b, r->evs[i]);
  }
  free(r->qd), free(r->kd), free(r->vd), free(r->dod), free(r->dlsed);
  for (int i = 0; i < RDA_MAX_BRANCHES; i++) {
    tune_ref *f = &r->refs[i];
    free(f->o), free(f->lse), free(f->dq), free(f->dk), free(f->dv);
    free(f->dq_mag), free(f->dk_mag), free(f->dv_mag);
  }
  free(r->times);
  free(r->evs);
}

/* Where the entries were measured: the caller's name, else the GPU's, or the emulator. */
static const char *tune_device(const rda_tune_opts *o, const rda_hw *hw) {
  if (o->device != NULL) return o->device;
  return hw->emulated ? "CPU emulator" : hw->name;
}

long long rda_tune_default_n(const rda_config *cfg, const rda_hw *hw) {
  if (hw->emulated) return 1024; /* kernels run on the CPU there: keep the problem small */
  long long wmax = 0;
  for (int i = 0; i < cfg->nbranch; i++)
    if (cfg->segments[i] > wmax) wmax = cfg->segments[i];
  const long long n = wmax < 32768 ? 2 * wmax : 65536;
  return n < 1024 ? 1024 : n;
}

int rda_tune_default_iters(const rda_hw *hw) {
  return hw->emulated ? 3 : 10;
}

static void tune_today(char out[16]) {
  const time_t now = time(NULL);
  struct tm tm;
  if (gmtime_r(&now, &tm) == NULL || strftime(out, 16, "%Y-%m-%d", &tm) == 0)
    snprintf(out, 16, "1970-01-01");
}

rda_status rda_tune_run(rda_backend *b, rda_gen *g, const rda_hw *hw, const rda_config *cfg,
                        const rda_tune_opts *o, const char *old_text, const char *old_name,
                        char **db_text, rda_tune_report **reports, int *nreports, rda_err *err) {
  if (db_text != NULL) *db_text = NULL;
  if (reports != NULL) *reports = NULL;
  if (nreports != NULL) *nreports = 0;
  if (b == NULL || g == NULL || hw == NULL || cfg == NULL || o == NULL || db_text == NULL ||
      reports == NULL || nreports == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_tune_run: NULL argument");
  if (o->n < 1 || o->batch < 1 || o->verify_n < 0 || o->iters < 1 || o->iters > TUNE_MAX_ITERS)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "rda_tune_run: n %lld, batch %lld, verify_n %lld, iters %d: expected n, "
                       "batch >= 1, verify_n >= 0, 1 <= iters <= %d",
                       o->n, o->batch, o->verify_n, o->iters, TUNE_MAX_ITERS);

  /* A database to merge into that does not load fails now, not after the timing. */
  if (old_text != NULL) {
    RDA_TRY(rda_tune_merge(g, hw, cfg, o, NULL, 0, old_text, old_name, db_text, err));
    free(*db_text);
    *db_text = NULL;
  }
  rda_tune_task *tasks = NULL;
  int ntasks = 0;
  RDA_TRY(rda_gen_tune_tasks(g, cfg, hw, o->flags, &tasks, &ntasks, err));

  tune_run r;
  memset(&r, 0, sizeof r);
  r.b = b, r.g = g, r.hw = hw, r.cfg = cfg, r.o = o;
  rda_tune_report *reps = calloc((size_t)(ntasks > 0 ? ntasks : 1), sizeof *reps);
  r.times = malloc((size_t)o->iters * sizeof *r.times);
  r.evs = calloc((size_t)o->iters + 1, sizeof *r.evs);
  rda_status s = RDA_OK;
  int nreps = 0;
  if (reps == NULL || r.times == NULL || r.evs == NULL) {
    s = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "tuning: out of memory");
    goto done;
  }
  int backward = 0, nrun = 0;
  for (int i = 0; i < ntasks; i++)
    if (!(o->untuned_only && tasks[i].tuned)) backward |= tune_is_bwd(&tasks[i]), nrun++;
  if (nrun == 0) goto merge; /* nothing left to tune: no inputs, no reference */
  rda_rng rng;
  rda_rng_seed(&rng, o->seed);
  const long long verify_n = o->verify_n > 0 ? o->verify_n : (o->n < 1024 ? o->n : 1024);
  if ((s = tune_size_make(&r, &r.ver, 1, verify_n, backward, &rng, 1, err)) != RDA_OK ||
      (s = tune_size_make(&r, &r.big, o->batch, o->n, backward, &rng, 0, err)) != RDA_OK)
    goto done;
  for (int i = 0; i <= o->iters; i++)
    if ((s = b->event_create_timed(b, &r.evs[i], err)) != RDA_OK) goto done;

  for (int i = 0; i < ntasks; i++) {
    if (o->untuned_only && tasks[i].tuned) continue;
    rda_tune_report *rep = &reps[nreps++];
    tune_task(&r, i, &tasks[i], rep);
    if (r.fatal.status != RDA_OK) {
      s = rda_err_set(err, r.fatal.status, "%s", r.fatal.msg);
      goto done;
    }
    if (rep->outcome.nranked == 0) {
      char all[800] = "";
      size_t len = 0;
      for (int f = 0; f < rep->nfailed && len < sizeof all; f++)
        len += (size_t)snprintf(all + len, sizeof all - len, "%s%s", f ? "; " : "", rep->failed[f]);
      s = rda_err_set(err, RDA_ERR_INTERNAL, "tuning %s: no candidate passed (%s)", tasks[i].key,
                      all);
      goto done;
    }
  }

merge:
  s = rda_tune_merge(g, hw, cfg, o, reps, nreps, old_text, old_name, db_text, err);
done:
  tune_run_free(&r);
  free(tasks);
  if (s == RDA_OK) {
    *reports = reps;
    *nreports = nreps;
  } else {
    free(reps);
    *db_text = NULL;
  }
  return s;
}

rda_status rda_tune_merge(rda_gen *g, const rda_hw *hw, const rda_config *cfg,
                          const rda_tune_opts *o, const rda_tune_report *reports, int nreports,
                          const char *old_text, const char *old_name, char **db_text,
                          rda_err *err) {
  if (db_text != NULL) *db_text = NULL;
  if (g == NULL || hw == NULL || cfg == NULL || o == NULL || db_text == NULL || nreports < 0 ||
      (reports == NULL && nreports > 0))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_tune_merge: NULL argument");
  char date[16];
  tune_today(date);
  const rda_tune_meta meta = {tune_device(o, hw), date, o->n, o->batch};
  rda_tune_outcome *outs = calloc((size_t)(nreports > 0 ? nreports : 1), sizeof *outs);
  if (outs == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "tuning: out of memory");
  for (int i = 0; i < nreports; i++) outs[i] = reports[i].outcome;
  const rda_status s = rda_gen_tune_merge(g, cfg, hw, o->flags, old_text, old_name, outs, nreports,
                                          &meta, db_text, err);
  free(outs);
  return s;
}

rda_status rda_tune_save_locked(rda_gen *g, const rda_hw *hw, const rda_config *cfg,
                                const rda_tune_opts *o, const rda_tune_report *reports,
                                int nreports, const char *path, rda_err *err) {
  char *now_text = NULL, *merged = NULL;
  rda_status s = rda_tuning_db_read_file(path, &now_text, err);
  if (s == RDA_OK)
    s = rda_tune_merge(g, hw, cfg, o, reports, nreports, now_text, path, &merged, err);
  if (s == RDA_OK) s = rda_tuning_db_write(path, merged, err);
  free(now_text);
  free(merged);
  return s;
}

rda_status rda_tune_save(rda_gen *g, const rda_hw *hw, const rda_config *cfg,
                         const rda_tune_opts *o, const rda_tune_report *reports, int nreports,
                         const char *path, rda_err *err) {
  rda_tuning_lock lock = RDA_TUNING_LOCK_INIT;
  rda_status s = rda_tuning_db_lock(path, &lock, err);
  if (s == RDA_OK) s = rda_tune_save_locked(g, hw, cfg, o, reports, nreports, path, err);
  rda_tuning_db_unlock(&lock);
  return s;
}
