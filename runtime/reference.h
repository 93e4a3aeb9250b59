/* reference.h — SPEC §1 in float64, straight from the definition: the ground truth every
 * kernel test compares against. Inputs are contiguous [B, N, H, D] / [B, N, Hkv, D] doubles
 * (already rounded to the storage dtype); outputs o [B, N, H, D] and lse [B, H, N]. */
#ifndef RDA_REFERENCE_H
#define RDA_REFERENCE_H

#include "config.h"

void rda_ref_forward(const rda_config *c, long long batch, long long n, const double *q,
                     const double *k, const double *v, double *o, double *lse);

/* SPEC §1 "Backward, exact": the gradients of the forward pass above. dout is dO [B, N, H, D],
 * dlse is dLSE [B, H, N] or NULL (= 0); dq [B, N, H, D], dk and dv [B, N, Hkv, D] are
 * overwritten. Computes the forward O and LSE itself, then Dp = <dO(p), O(p)> - dLSE(p) and,
 * for every branch and every (p, q) pair it selects, P = exp(τ<Q[p], K[q]> - LSE(p)) with the
 * combined LSE and dS = P (<dO(p), V[q]> - Dp): dQ[p] += τ dS K[q], dK[q] += τ dS Q[p],
 * dV[q] += P dO(p). A key selected by two branches counts twice; GQA sums over the query heads
 * of a kv head; uncovered rows contribute nothing (their dLSE is ignored).
 *
 * dq_mag [B, N, H, D], dk_mag and dv_mag [B, N, Hkv, D] (each may be NULL: not computed, at no
 * cost) receive the magnitude of each gradient: the same sums with every term replaced by its
 * absolute value, |τ| P (|<dO(p), V[q]>| + |Dp|) |K[q]| for dQ[p] and likewise with |Q[p]| for
 * dK[q], P |dO(p)| for dV[q], where |Dp| = sum_d |dO(p)_d O(p)_d| + |dLSE(p)|. It bounds the
 * gradient elementwise (triangle inequality) and is the scale that fp32 rounding in a kernel
 * follows, also where the gradient itself cancels to (near) zero: rda_check_grad judges such a
 * gradient against it (check.h). */
void rda_ref_backward(const rda_config *c, long long batch, long long n, const double *q,
                      const double *k, const double *v, const double *dout, const double *dlse,
                      double *dq, double *dk, double *dv, double *dq_mag, double *dk_mag,
                      double *dv_mag);

/* Round a float64 to the storage dtype and back (round to nearest even). */
double rda_round_to_dtype(double x, int dtype);
/* The 16-bit storage bits of x (round to nearest even) and back to double. */
unsigned short rda_to_dtype_bits(double x, int dtype);
double rda_from_dtype_bits(unsigned short bits, int dtype);

#endif
