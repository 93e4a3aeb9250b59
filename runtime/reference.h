/* reference.h — SPEC §1 in float64, straight from the definition: the ground truth every
 * kernel test compares against. Inputs are contiguous [B, N, H, D] / [B, N, Hkv, D] doubles
 * (already rounded to the storage dtype); outputs o [B, N, H, D] and lse [B, H, N]. */
#ifndef RDA_REFERENCE_H
#define RDA_REFERENCE_H

#include "config.h"

void rda_ref_forward(const rda_config *c, long long batch, long long n, const double *q,
                     const double *k, const double *v, double *o, double *lse);

/* Round a float64 to the storage dtype and back (round to nearest even). */
double rda_round_to_dtype(double x, int dtype);
/* The 16-bit storage bits of x (round to nearest even) and back to double. */
unsigned short rda_to_dtype_bits(double x, int dtype);
double rda_from_dtype_bits(unsigned short bits, int dtype);

#endif
