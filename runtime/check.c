/* check.c — compare forward and backward results with the float64 reference under SPEC §5's
 * tolerances: relative L2 of O, dQ, dK, dV; max LSE error on covered rows; exact 0 / -inf on
 * uncovered rows; no NaN or Inf anywhere else. */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

rda_tolerance rda_tolerance_for(int dtype) {
  rda_tolerance t;
  if (dtype == RDA_DTYPE_FP16) {
    t.o_rel_l2 = 3e-3;
    t.lse_abs = 5e-3;
    t.grad_rel_l2 = 5e-3;
  } else {
    t.o_rel_l2 = 1e-2;
    t.lse_abs = 2e-2;
    t.grad_rel_l2 = 2e-2;
  }
  return t;
}

static void note(rda_check_result *r, const char *what, long long b, long long h, long long p,
                 double got, double want) {
  if (r->first_failure[0] != '\0') return;
  snprintf(r->first_failure, sizeof r->first_failure, "%s at b=%lld h=%lld n=%lld: got %g, want %g",
           what, b, h, p, got, want);
}

void rda_check_forward(const rda_config *c, long long batch, long long n, const float *o,
                       const long long o_s[3], const float *lse, const long long lse_s[2],
                       const double *o_ref, const double *lse_ref, rda_check_result *out) {
  memset(out, 0, sizeof *out);
  const int H = c->heads, D = c->head_dim;
  double err2 = 0, ref2 = 0;
  for (long long b = 0; b < batch; ++b)
    for (long long h = 0; h < H; ++h)
      for (long long p = 0; p < n; ++p) {
        const double want_lse = lse_ref[(b * H + h) * n + p];
        const double got_lse = lse[b * lse_s[0] + h * lse_s[1] + p];
        const float *orow = o + b * o_s[0] + p * o_s[1] + h * o_s[2];
        const double *rrow = o_ref + ((b * n + p) * H + h) * D;
        if (isinf(want_lse) && want_lse < 0) {
          ++out->uncovered_rows;
          int bad = !(isinf(got_lse) && got_lse < 0);
          for (int d = 0; d < D; ++d) bad |= orow[d] != 0.0f;
          if (bad) {
            ++out->bad_uncovered;
            note(out, "uncovered row: lse (and o must be 0)", b, h, p, got_lse, -INFINITY);
          }
          continue;
        }
        ++out->covered_rows;
        if (!isfinite(got_lse)) {
          if (isinf(got_lse) && got_lse < 0) {
            ++out->lse_coverage_mismatch;
          } else {
            ++out->nonfinite;
          }
          note(out, "covered row: lse", b, h, p, got_lse, want_lse);
        } else {
          const double e = fabs(got_lse - want_lse);
          if (e > out->lse_max_abs) out->lse_max_abs = e;
        }
        for (int d = 0; d < D; ++d) {
          if (!isfinite(orow[d])) {
            ++out->nonfinite;
            note(out, "o", b, h, p, orow[d], rrow[d]);
            continue;
          }
          const double diff = (double)orow[d] - rrow[d];
          err2 += diff * diff;
          ref2 += rrow[d] * rrow[d];
        }
      }
  out->o_rel_l2 = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
  const rda_tolerance t = rda_tolerance_for(c->dtype);
  out->pass = out->bad_uncovered == 0 && out->nonfinite == 0 && out->lse_coverage_mismatch == 0 &&
              out->o_rel_l2 <= t.o_rel_l2 && out->lse_max_abs <= t.lse_abs;
  if (!out->pass && out->first_failure[0] == '\0')
    snprintf(out->first_failure, sizeof out->first_failure,
             "O rel L2 %.3g (tol %.1g), LSE max err %.3g (tol %.1g)", out->o_rel_l2, t.o_rel_l2,
             out->lse_max_abs, t.lse_abs);
}

double rda_check_grad_rel_l2(const float *got, const long long got_s[3], const double *ref,
                             const double *mag, long long batch, long long n, int heads,
                             int head_dim, long long *nonfinite) {
  double err2 = 0, ref2 = 0, mag2 = 0;
  long long bad = 0;
  for (long long b = 0; b < batch; ++b)
    for (long long p = 0; p < n; ++p)
      for (long long h = 0; h < heads; ++h) {
        const float *g = got + b * got_s[0] + p * got_s[1] + h * got_s[2];
        const long long at = ((b * n + p) * heads + h) * head_dim;
        const double *r = ref + at, *m = mag != NULL ? mag + at : NULL;
        for (int d = 0; d < head_dim; ++d) {
          if (!isfinite(g[d])) {
            ++bad;
            continue;
          }
          const double diff = (double)g[d] - r[d];
          err2 += diff * diff;
          ref2 += r[d] * r[d];
          if (m != NULL) mag2 += m[d] * m[d];
        }
      }
  if (nonfinite != NULL) *nonfinite = bad;
  /* An exactly zero gradient comes out of the float64 reference as rounding noise (~1e-17),
   * which no relative error can be taken against: below an RMS of RDA_CHECK_GRAD_RMS_FLOOR the
   * error is measured against that floor instead. */
  const double count = (double)batch * (double)n * (double)heads * (double)head_dim;
  const double floor2 = RDA_CHECK_GRAD_RMS_FLOOR * RDA_CHECK_GRAD_RMS_FLOOR * count;
  double den2 = ref2 > floor2 ? ref2 : floor2;
  /* Where the gradient cancels, the kernels' fp32 noise follows the magnitude (check.h). */
  const double mag_floor2 = RDA_CHECK_GRAD_MAG_FRACTION * RDA_CHECK_GRAD_MAG_FRACTION * mag2;
  if (mag_floor2 > den2) den2 = mag_floor2;
  return den2 > 0 ? sqrt(err2 / den2) : sqrt(err2);
}

void rda_check_grad(const rda_config *c, long long batch, long long n, const float *dq,
                    const long long dq_s[3], const float *dk, const long long dk_s[3],
                    const float *dv, const long long dv_s[3], const double *dq_ref,
                    const double *dk_ref, const double *dv_ref, const double *dq_mag,
                    const double *dk_mag, const double *dv_mag, rda_check_grad_result *out) {
  memset(out, 0, sizeof *out);
  const rda_tolerance t = rda_tolerance_for(c->dtype);
  const char *names[3] = {"dQ", "dK", "dV"};
  const float *got[3] = {dq, dk, dv};
  const long long *strides[3] = {dq_s, dk_s, dv_s};
  const double *refs[3] = {dq_ref, dk_ref, dv_ref}, *mags[3] = {dq_mag, dk_mag, dv_mag};
  const int heads[3] = {c->heads, c->kv_heads, c->kv_heads};
  double *rel[3] = {&out->dq_rel_l2, &out->dk_rel_l2, &out->dv_rel_l2};
  out->pass = 1;
  for (int i = 0; i < 3; ++i) {
    long long bad = 0;
    *rel[i] = rda_check_grad_rel_l2(got[i], strides[i], refs[i], mags[i], batch, n, heads[i],
                                    c->head_dim, &bad);
    out->nonfinite += bad;
    if (bad == 0 && *rel[i] <= t.grad_rel_l2) continue;
    out->pass = 0;
    if (out->first_failure[0] != '\0') continue;
    if (bad != 0)
      snprintf(out->first_failure, sizeof out->first_failure, "%s: %lld NaN/Inf elements", names[i],
               bad);
    else
      snprintf(out->first_failure, sizeof out->first_failure, "%s rel L2 %.3g (tol %.1g)", names[i],
               *rel[i], t.grad_rel_l2);
  }
}
