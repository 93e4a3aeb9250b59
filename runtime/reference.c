/* reference.c — SPEC §1 in float64, written from the definition and not optimized: the ground
 * truth of every kernel test. Also the storage-dtype rounding (bf16, fp16; round to nearest
 * even, fp16 subnormals, overflow to inf) in plain C, without _Float16. */
#include "reference.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* --- storage dtype rounding ------------------------------------------------------------------- */

/* A binary16-like format: `mbits` stored mantissa bits, exponent `bias`; the smallest normal is
 * 2^(1 - bias), the largest finite (2 - 2^-mbits) * 2^(max_exp). */
typedef struct rda_reference_fmt {
  int mbits;
  int bias;
  int max_exp;
  unsigned short qnan;
} rda_reference_fmt;

static rda_reference_fmt rda_reference_format(int dtype) {
  if (dtype == RDA_DTYPE_FP16) return (rda_reference_fmt){10, 15, 15, 0x7e00u};
  return (rda_reference_fmt){7, 127, 127, 0x7fc0u};
}

double rda_round_to_dtype(double x, int dtype) {
  if (isnan(x) || isinf(x) || x == 0.0) return x;
  const rda_reference_fmt f = rda_reference_format(dtype);
  int e;
  (void)frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
  int lead = e - 1;   /* exponent of the leading bit */
  const int emin = 1 - f.bias;
  if (lead < emin) lead = emin; /* subnormal range: fixed quantum */
  const int qexp = lead - f.mbits;
  /* x / 2^qexp is exact (power-of-two scaling of a double far from the double limits);
   * rint rounds to nearest, ties to even, in the default rounding mode. */
  const double y = ldexp(rint(ldexp(x, -qexp)), qexp);
  const double maxv = ldexp(2.0 - ldexp(1.0, -f.mbits), f.max_exp);
  if (fabs(y) > maxv) return x < 0 ? -INFINITY : INFINITY;
  return y;
}

unsigned short rda_to_dtype_bits(double x, int dtype) {
  const rda_reference_fmt f = rda_reference_format(dtype);
  const unsigned short sign = (unsigned short)(signbit(x) ? 1u << 15 : 0u);
  const unsigned short expmask = (unsigned short)(((1u << (15 - f.mbits)) - 1u) << f.mbits);
  if (isnan(x)) return (unsigned short)(sign | f.qnan);
  const double y = fabs(rda_round_to_dtype(x, dtype));
  if (isinf(y)) return (unsigned short)(sign | expmask);
  if (y == 0.0) return sign;
  int e;
  (void)frexp(y, &e);
  const int biased = e - 1 + f.bias;
  unsigned mant;
  unsigned expo;
  if (biased <= 0) { /* subnormal: y = mant * 2^(1 - bias - mbits) */
    expo = 0;
    mant = (unsigned)ldexp(y, f.bias - 1 + f.mbits);
  } else {
    expo = (unsigned)biased;
    mant = (unsigned)(ldexp(y, -(e - 1)) * (double)(1u << f.mbits)) - (1u << f.mbits);
  }
  return (unsigned short)(sign | (expo << f.mbits) | mant);
}

double rda_from_dtype_bits(unsigned short bits, int dtype) {
  const rda_reference_fmt f = rda_reference_format(dtype);
  const unsigned emax = (1u << (15 - f.mbits)) - 1u;
  const unsigned expo = (bits >> f.mbits) & emax;
  const unsigned mant = bits & ((1u << f.mbits) - 1u);
  const double s = (bits & 0x8000u) ? -1.0 : 1.0;
  if (expo == emax) return mant ? s * NAN : s * INFINITY;
  if (expo == 0) return s * ldexp((double)mant, 1 - f.bias - f.mbits);
  return s * ldexp((double)(mant | (1u << f.mbits)), (int)expo - f.bias - f.mbits);
}

/* --- the forward pass ------------------------------------------------------------------------- */

/* The positions of segment m (window w <= n, dilation r, head offset j >= 0) of a length-n
 * sequence into grid, increasing; returns how many. Written so that no step can pass INT64_MAX
 * whatever w, r and j are (m * w < n, as m < ceil(n / w)). */
static long long rda_reference_segment(long long n, long long w, long long r, long long j,
                                       long long m, long long *grid) {
  const long long a = m * w, e = a + (w < n - a ? w : n - a);
  long long g = 0;
  if (j >= e - a) return 0;
  for (long long p = a + j;; p += r) {
    grid[g++] = p;
    if (e - p <= r) break; /* p + r >= e */
  }
  return g;
}

/* ceil(a / b) for a >= 0, b >= 1, without forming a + b - 1. */
static long long rda_reference_ceil_div(long long a, long long b) {
  return a / b + (a % b != 0);
}

/* Merge one branch's (lse_i, o_i) of a row into the running (LSE, O) by log-sum-exp. */
static void rda_reference_merge(double *lse, double *o, double lse_i, const double *o_i, int d) {
  if (lse_i == -INFINITY) return;
  if (*lse == -INFINITY) {
    *lse = lse_i;
    memcpy(o, o_i, (size_t)d * sizeof *o);
    return;
  }
  const double m = *lse > lse_i ? *lse : lse_i;
  const double total = m + log(exp(*lse - m) + exp(lse_i - m));
  const double a = exp(*lse - total), b = exp(lse_i - total);
  for (int x = 0; x < d; x++) o[x] = a * o[x] + b * o_i[x];
  *lse = total;
}

void rda_ref_forward(const rda_config *c, long long batch, long long n, const double *q,
                     const double *k, const double *v, double *o, double *lse) {
  const long long H = c->heads, Hkv = c->kv_heads, D = c->head_dim;
  const long long group = H / Hkv;
  const double tau = c->scale;

  for (long long i = 0; i < batch * n * H * D; i++) o[i] = 0.0;
  for (long long i = 0; i < batch * H * n; i++) lse[i] = -INFINITY;
  if (n <= 0) return;

  double *s = malloc((size_t)n * sizeof *s);
  double *oi = malloc((size_t)D * sizeof *oi);
  long long *grid = malloc((size_t)n * sizeof *grid);
  if (s == NULL || oi == NULL || grid == NULL) abort(); /* a test-only path: no recovery */

  for (long long b = 0; b < batch; b++) {
    for (int br = 0; br < c->nbranch; br++) {
      const long long w = c->segments[br] < n ? c->segments[br] : n;
      const long long r = c->dilations[br];
      const long long nseg = rda_reference_ceil_div(n, w);
      for (long long h = 0; h < H; h++) {
        const long long j = rda_config_offset(c, br, (int)h);
        if (j < 0) continue; /* this head does not use this branch */
        const long long hk = h / group;
        for (long long m = 0; m < nseg; m++) {
          const long long g = rda_reference_segment(n, w, r, j, m, grid);
          for (long long pi = 0; pi < g; pi++) {
            const long long p = grid[pi];
            const double *qp = q + ((b * n + p) * H + h) * D;
            double mx = -INFINITY;
            long long nk = 0;
            for (long long qi = 0; qi < g; qi++) {
              if (c->causal && grid[qi] > p) break; /* the grid is increasing */
              const double *kq = k + ((b * n + grid[qi]) * Hkv + hk) * D;
              double dot = 0.0;
              for (long long x = 0; x < D; x++) dot += qp[x] * kq[x];
              s[qi] = tau * dot;
              if (s[qi] > mx) mx = s[qi];
              nk++;
            }
            double sum = 0.0;
            for (long long qi = 0; qi < nk; qi++) sum += exp(s[qi] - mx);
            const double lse_i = mx + log(sum);
            for (long long x = 0; x < D; x++) oi[x] = 0.0;
            for (long long qi = 0; qi < nk; qi++) {
              const double pw = exp(s[qi] - lse_i);
              const double *vq = v + ((b * n + grid[qi]) * Hkv + hk) * D;
              for (long long x = 0; x < D; x++) oi[x] += pw * vq[x];
            }
            rda_reference_merge(&lse[(b * H + h) * n + p], &o[((b * n + p) * H + h) * D], lse_i, oi,
                                (int)D);
          }
        }
      }
    }
  }
  free(s);
  free(oi);
  free(grid);
}

/* --- the backward pass ------------------------------------------------------------------------ */

void rda_ref_backward(const rda_config *c, long long batch, long long n, const double *q,
                      const double *k, const double *v, const double *dout, const double *dlse,
                      double *dq, double *dk, double *dv, double *dq_mag, double *dk_mag,
                      double *dv_mag) {
  const long long H = c->heads, Hkv = c->kv_heads, D = c->head_dim;
  const long long group = H / Hkv;
  const double tau = c->scale;
  const int want_mag = dq_mag != NULL || dk_mag != NULL || dv_mag != NULL;

  for (long long i = 0; i < batch * n * H * D; i++) dq[i] = 0.0;
  for (long long i = 0; i < batch * n * Hkv * D; i++) dk[i] = dv[i] = 0.0;
  double *mags[3] = {dq_mag, dk_mag, dv_mag};
  const long long mag_count[3] = {batch * n * H * D, batch * n * Hkv * D, batch * n * Hkv * D};
  for (int t = 0; t < 3; t++)
    for (long long i = 0; mags[t] != NULL && i < mag_count[t]; i++) mags[t][i] = 0.0;
  if (n <= 0 || batch <= 0) return;

  double *o = malloc((size_t)(batch * n * H * D) * sizeof *o);
  double *lse = malloc((size_t)(batch * H * n) * sizeof *lse);
  double *dp = malloc((size_t)(batch * H * n) * sizeof *dp);
  double *dp_mag = want_mag ? malloc((size_t)(batch * H * n) * sizeof *dp_mag) : NULL;
  long long *grid = malloc((size_t)n * sizeof *grid);
  if (o == NULL || lse == NULL || dp == NULL || grid == NULL || (want_mag && dp_mag == NULL))
    abort(); /* test-only: no recovery */
  rda_ref_forward(c, batch, n, q, k, v, o, lse);

  /* Dp = <dO(p), O(p)> - dLSE(p), and its magnitude; only read on covered rows. */
  for (long long b = 0; b < batch; b++)
    for (long long h = 0; h < H; h++)
      for (long long p = 0; p < n; p++) {
        const double *dop = dout + ((b * n + p) * H + h) * D;
        const double *op = o + ((b * n + p) * H + h) * D;
        double s = 0.0, sm = 0.0;
        for (long long x = 0; x < D; x++) {
          s += dop[x] * op[x];
          sm += fabs(dop[x] * op[x]);
        }
        const long long row = (b * H + h) * n + p;
        const double g = dlse != NULL ? dlse[row] : 0.0;
        dp[row] = s - g;
        if (want_mag) dp_mag[row] = sm + fabs(g);
      }

  for (long long b = 0; b < batch; b++) {
    for (int br = 0; br < c->nbranch; br++) {
      const long long w = c->segments[br] < n ? c->segments[br] : n;
      const long long r = c->dilations[br];
      const long long nseg = rda_reference_ceil_div(n, w);
      for (long long h = 0; h < H; h++) {
        const long long j = rda_config_offset(c, br, (int)h);
        if (j < 0) continue; /* this head does not use this branch */
        const long long hk = h / group;
        for (long long m = 0; m < nseg; m++) {
          const long long g = rda_reference_segment(n, w, r, j, m, grid);
          for (long long pi = 0; pi < g; pi++) {
            const long long p = grid[pi];
            const long long row = (b * H + h) * n + p;
            const long long qo = ((b * n + p) * H + h) * D;
            const double *qp = q + qo, *dop = dout + qo;
            for (long long qi = 0; qi < g; qi++) {
              if (c->causal && grid[qi] > p) break; /* the grid is increasing */
              const long long kvo = ((b * n + grid[qi]) * Hkv + hk) * D;
              const double *kq = k + kvo, *vq = v + kvo;
              double dot = 0.0, dpv = 0.0;
              for (long long x = 0; x < D; x++) {
                dot += qp[x] * kq[x];
                dpv += dop[x] * vq[x];
              }
              const double pw = exp(tau * dot - lse[row]);
              const double ds = pw * (dpv - dp[row]);
              for (long long x = 0; x < D; x++) {
                dq[qo + x] += tau * ds * kq[x];
                dk[kvo + x] += tau * ds * qp[x];
                dv[kvo + x] += pw * dop[x];
              }
              if (!want_mag) continue;
              /* |τ dS| with each of its terms made positive (P > 0 already) */
              const double dsm = fabs(tau) * pw * (fabs(dpv) + dp_mag[row]);
              for (long long x = 0; x < D; x++) {
                if (dq_mag != NULL) dq_mag[qo + x] += dsm * fabs(kq[x]);
                if (dk_mag != NULL) dk_mag[kvo + x] += dsm * fabs(qp[x]);
                if (dv_mag != NULL) dv_mag[kvo + x] += pw * fabs(dop[x]);
              }
            }
          }
        }
      }
    }
  }
  free(o);
  free(lse);
  free(dp);
  free(dp_mag);
  free(grid);
}
