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
 * of a kv head; uncovered rows contribute nothing (their dLSE is ignored). */
void rda_ref_backward(const rda_config *c, long long batch, long long n, const double *q,
                      const double *k, const double *v, const double *dout, const double *dlse,
                      double *dq, double *dk, double *dv);

/* Round a float64 to the storage dtype and back (round to nearest even). */
double rda_round_to_dtype(double x, int dtype);
/* The 16-bit storage bits of x (round to nearest even) and back to double. */
unsigned short rda_to_dtype_bits(double x, int dtype);
double rda_from_dtype_bits(unsigned short bits, int dtype);

#endif
