/* check.h — SPEC §5: how a forward result is judged against the float64 reference. One table
 * of tolerances and one comparison, shared by the demo, the CLI tests and the kernel tests. */
#ifndef RDA_CHECK_H
#define RDA_CHECK_H

#include "config.h"

#include <stddef.h>

typedef struct rda_tolerance {
  double o_rel_l2;   /* ||O - O_ref||_2 / ||O_ref||_2 */
  double lse_abs;    /* max |LSE - LSE_ref| over covered rows */
  double grad_rel_l2;
} rda_tolerance;

rda_tolerance rda_tolerance_for(int dtype);

typedef struct rda_check_result {
  double o_rel_l2;
  double lse_max_abs;
  long long covered_rows, uncovered_rows;
  long long bad_uncovered;  /* uncovered rows whose o is not exactly 0 or lse not exactly -inf */
  long long nonfinite;      /* NaN/Inf in o, or NaN/+Inf/-Inf in a covered row's lse */
  long long lse_coverage_mismatch; /* lse finite where the reference is -inf, or the reverse */
  int pass;
  char first_failure[256];  /* the first mismatch, human readable; "" when pass */
} rda_check_result;

/* o: fp32 [B, N, H, D] with element strides o_s (batch, n, head); lse: fp32 [B, H, N] with
 * strides lse_s (batch, head). References contiguous float64. */
void rda_check_forward(const rda_config *c, long long batch, long long n, const float *o,
                       const long long o_s[3], const float *lse, const long long lse_s[2],
                       const double *o_ref, const double *lse_ref, rda_check_result *out);

#endif
