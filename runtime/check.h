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
 * inputs (SPEC §5), far above the float64 rounding (~1e-17) of an exactly zero one. On its own
 * it does not absorb the fp32 rounding noise that a kernel leaves on a gradient that cancels
 * (~1e-7 of the problem's scale with N = 1 and several branches): the magnitude floor below
 * does. */
#define RDA_CHECK_GRAD_RMS_FLOOR 1e-9

/* Where a gradient cancels, ||ref||_2 says nothing about the error a correct kernel makes: with
 * N = 1 (every row's only key is itself: P = 1, dS = 0, dQ = dK = 0 exactly) or a saturated
 * softmax, dS = P (<dO, V> - Dp) is a difference of two nearly equal fp32 dot products, and
 * the kernel's result is rounding noise of ~eps_fp32 times the terms it was summed from, which
 * a relative L2 against the (near) zero ref judges as an error near 1. The terms' scale is the
 * gradient's magnitude (rda_ref_backward's dq_mag etc.: every term of the sums made positive,
 * so ||ref|| <= ||mag||), and the relative error is then taken against at least this fraction
 * of ||mag||_2: the allowed absolute error stays >= 2e-5 ||mag|| for bf16 and 5e-6 for fp16,
 * ~50x above fp32 noise, and a real error of 1e-2 of one row's magnitude still fails. This is
 * a floor beyond SPEC §5's plain ratio and acts only when ||ref|| < this * ||mag||: a gradient
 * that does not cancel (||ref|| comparable to ||mag||) is judged by the plain ratio. */
#define RDA_CHECK_GRAD_MAG_FRACTION 1e-3

/* ||got - ref||_2 / max(||ref||_2, RDA_CHECK_GRAD_MAG_FRACTION * ||mag||_2,
 * RDA_CHECK_GRAD_RMS_FLOOR * sqrt(count)), count the number of elements, of one gradient: got
 * fp32 [B, N, heads, head_dim] with element strides got_s (batch, n, head), ref and mag
 * contiguous float64; mag is the gradient's magnitude from rda_ref_backward, or NULL (no
 * magnitude floor: only the RMS floor, which keeps a gradient that is exactly zero, ref then
 * holding only float64 rounding noise, from failing on a relative error of 1). A gradient
 * above both floors is judged by the plain relative error. The plain norm ||got - ref||_2 when
 * there are no elements. NaN/Inf elements of got are left out of the norm and counted in
 * *nonfinite (may be NULL). */
double rda_check_grad_rel_l2(const float *got, const long long got_s[3], const double *ref,
                             const double *mag, long long batch, long long n, int heads,
                             int head_dim, long long *nonfinite);

typedef struct rda_check_grad_result {
  double dq_rel_l2, dk_rel_l2, dv_rel_l2;
  long long nonfinite; /* NaN/Inf in dQ, dK or dV */
  int pass;
  char first_failure[256]; /* the first failing gradient, human readable; "" when pass */
} rda_check_grad_result;

/* Judge dQ (fp32 [B, N, H, D], strides dq_s), dK and dV (fp32 [B, N, Hkv, D], strides dk_s,
 * dv_s) against contiguous float64 references by SPEC §5: each relative L2 (as
 * rda_check_grad_rel_l2, with the magnitudes dq_mag, dk_mag, dv_mag of rda_ref_backward, each
 * may be NULL) within rda_tolerance_for(c->dtype).grad_rel_l2 and no NaN/Inf anywhere. */
void rda_check_grad(const rda_config *c, long long batch, long long n, const float *dq,
                    const long long dq_s[3], const float *dk, const long long dk_s[3],
                    const float *dv, const long long dv_s[3], const double *dq_ref,
                    const double *dk_ref, const double *dv_ref, const double *dq_mag,
                    const double *dk_mag, const double *dv_mag, rda_check_grad_result *out);

#endif
