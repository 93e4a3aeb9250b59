/* check.h — SPEC §5: how forward and backward results are judged against the float64
 * reference. One table of tolerances and one comparison each, shared by the demo, the CLI
 * tests and the kernel tests. */
#ifndef RDA_CHECK_H
#define RDA_CHECK_H

#include "config.h"

#include <stddef.h>

typedef struct rda_tolerance {
  double o_rel_l2; /* ||O - O_ref||_2 / ||O_ref||_2 */
  double lse_abs;  /* max |LSE - LSE_ref| over covered rows */
  double grad_rel_l2;
} rda_tolerance;

rda_tolerance rda_tolerance_for(int dtype);

typedef struct rda_check_result {
  double o_rel_l2;
  double lse_max_abs;
  long long covered_rows, uncovered_rows;
  long long bad_uncovered; /* uncovered rows whose o is not exactly 0 or lse not exactly -inf */
  long long nonfinite;     /* NaN/Inf in o, or NaN/+Inf/-Inf in a covered row's lse */
  long long lse_coverage_mismatch; /* lse finite where the reference is -inf, or the reverse */
  int pass;
  char first_failure[256]; /* the first mismatch, human readable; "" when pass */
} rda_check_result;

/* o: fp32 [B, N, H, D] with element strides o_s (batch, n, head); lse: fp32 [B, H, N] with
 * strides lse_s (batch, head). References contiguous float64. */
void rda_check_forward(const rda_config *c, long long batch, long long n, const float *o,
                       const long long o_s[3], const float *lse, const long long lse_s[2],
                       const double *o_ref, const double *lse_ref, rda_check_result *out);

/* The RMS below which a reference gradient counts as zero: far below any gradient of σ = 1
 * inputs (SPEC §5), far above the float64 rounding (~1e-17) of an exactly zero one. It does not
 * absorb fp32 rounding noise that a kernel may leave on an exactly zero gradient (~1e-7 with
 * N = 1 and several branches): such a result still fails. */
#define RDA_CHECK_GRAD_RMS_FLOOR 1e-9

/* ||got - ref||_2 / max(||ref||_2, RDA_CHECK_GRAD_RMS_FLOOR * sqrt(count)), count the number of
 * elements, of one gradient: got fp32 [B, N, heads, head_dim] with element strides got_s (batch,
 * n, head), ref contiguous float64. The floor keeps a gradient that is exactly zero (ref then
 * holds only rounding noise) from failing on a relative error of 1; a gradient whose RMS is
 * above it is judged by the plain relative error. The plain norm ||got - ref||_2 when there are
 * no elements. NaN/Inf elements of got are left out of the norm and counted in *nonfinite (may
 * be NULL). */
double rda_check_grad_rel_l2(const float *got, const long long got_s[3], const double *ref,
                             long long batch, long long n, int heads, int head_dim,
                             long long *nonfinite);

typedef struct rda_check_grad_result {
  double dq_rel_l2, dk_rel_l2, dv_rel_l2;
  long long nonfinite; /* NaN/Inf in dQ, dK or dV */
  int pass;
  char first_failure[256]; /* the first failing gradient, human readable; "" when pass */
} rda_check_grad_result;

/* Judge dQ (fp32 [B, N, H, D], strides dq_s), dK and dV (fp32 [B, N, Hkv, D], strides dk_s,
 * dv_s) against contiguous float64 references by SPEC §5: each relative L2 within
 * rda_tolerance_for(c->dtype).grad_rel_l2 and no NaN/Inf anywhere. */
void rda_check_grad(const rda_config *c, long long batch, long long n, const float *dq,
                    const long long dq_s[3], const float *dk, const long long dk_s[3],
                    const float *dv, const long long dv_s[3], const double *dq_ref,
                    const double *dk_ref, const double *dv_ref, rda_check_grad_result *out);

#endif
