/* rda_test.c — shared test support: RNG, strided storage tensors, the SPEC §5 comparison with
 * the float64 reference (llm.c-style mismatch printing), temp folders and subprocesses.
 * Test-only code: out of memory aborts rather than propagating. */
#include "rda_test.h"

#include "check.h"
#include "reference.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void *rt_xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (p == NULL) {
    fprintf(stderr, "rda_test: out of memory (%zu bytes)\n", bytes);
    abort();
  }
  return p;
}

/* --- random numbers --------------------------------------------------------------------------- */

static uint64_t rt_splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void rt_rng_seed(rt_rng *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) r->s[i] = rt_splitmix64(&x);
  r->has_spare = 0;
  r->spare = 0.0;
}

static uint64_t rt_rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

uint64_t rt_rng_next(rt_rng *r) {
  uint64_t *s = r->s;
  const uint64_t result = rt_rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rt_rotl(s[3], 45);
  return result;
}

double rt_rng_uniform(rt_rng *r) {
  return (double)(rt_rng_next(r) >> 11) * 0x1.0p-53;
}

double rt_rng_normal(rt_rng *r) {
  if (r->has_spare) {
    r->has_spare = 0;
    return r->spare;
  }
  double u1;
  do u1 = rt_rng_uniform(r);
  while (u1 <= 0.0);
  const double u2 = rt_rng_uniform(r);
  const double rad = sqrt(-2.0 * log(u1));
  const double th = 2.0 * 3.14159265358979323846 * u2;
  r->spare = rad * sin(th);
  r->has_spare = 1;
  return rad * cos(th);
}

long long rt_rng_range(rt_rng *r, long long lo, long long hi) {
  if (hi <= lo) return lo;
  const uint64_t span = (uint64_t)(hi - lo) + 1u;
  return lo + (long long)(rt_rng_next(r) % span);
}

static rt_rng rt_global;
static uint64_t rt_global_seed;
static int rt_global_ready;

void rt_seed(uint64_t seed) {
  rt_global_seed = seed;
  rt_rng_seed(&rt_global, seed);
  rt_global_ready = 1;
}

rt_rng *rt_global_rng(void) {
  if (!rt_global_ready) {
    uint64_t seed = 0x5eed2026ull;
    const char *env = getenv("RDA_TEST_SEED");
    if (env != NULL && *env != '\0') seed = strtoull(env, NULL, 0);
    rt_seed(seed);
  }
  return &rt_global;
}

uint64_t rt_seed_value(void) {
  (void)rt_global_rng();
  return rt_global_seed;
}

void rt_fill_normal_from(rt_rng *r, double *x, size_t n, int dtype) {
  for (size_t i = 0; i < n; i++) {
    const double z = rt_rng_normal(r);
    x[i] = dtype == RT_DTYPE_F64 ? z : rda_round_to_dtype(z, dtype);
  }
}

double *rt_normal_from(rt_rng *r, size_t n, int dtype) {
  double *x = rt_xmalloc(n * sizeof *x);
  rt_fill_normal_from(r, x, n, dtype);
  return x;
}

void rt_fill_normal(double *x, size_t n, int dtype) {
  rt_fill_normal_from(rt_global_rng(), x, n, dtype);
}

double *rt_normal(size_t n, int dtype) {
  return rt_normal_from(rt_global_rng(), n, dtype);
}

/* --- configs ---------------------------------------------------------------------------------- */

void rt_config_make(rda_config *c, int heads, int kv_heads, int head_dim, int dtype, int causal,
                    int offsets, int nbranch, const long long *w, const long long *r) {
  memset(c, 0, sizeof *c);
  c->heads = heads;
  c->kv_heads = kv_heads;
  c->head_dim = head_dim;
  c->dtype = dtype;
  c->causal = causal;
  c->offsets = offsets;
  c->nbranch = nbranch;
  for (int i = 0; i < nbranch && i < RDA_MAX_BRANCHES; i++) {
    c->segments[i] = w[i];
    c->dilations[i] = r[i];
  }
  c->scale = 1.0 / sqrt((double)head_dim);
}

/* --- strided storage tensors ------------------------------------------------------------------ */

void rt_strides_contig(long long n, long long h, long long d, long long strides[3]) {
  strides[2] = d;
  strides[1] = h * d;
  strides[0] = n * h * d;
}

size_t rt_span(long long b, long long n, long long h, long long d, const long long s[3]) {
  if (b <= 0 || n <= 0 || h <= 0 || d <= 0) return 0;
  return (size_t)((b - 1) * s[0] + (n - 1) * s[1] + (h - 1) * s[2] + d);
}

size_t rt_lse_span(long long b, long long h, long long n, const long long s[2]) {
  if (b <= 0 || h <= 0 || n <= 0) return 0;
  return (size_t)((b - 1) * s[0] + (h - 1) * s[1] + n);
}

uint16_t *rt_alloc_bits(size_t count, int dtype) {
  uint16_t *p = rt_xmalloc(count * sizeof *p);
  const uint16_t nan = dtype == RDA_DTYPE_FP16 ? 0x7e00u : 0x7fc0u;
  for (size_t i = 0; i < count; i++) p[i] = nan;
  return p;
}

void rt_pack_bits(uint16_t *dst, const double *x, long long b, long long n, long long h,
                  long long d, const long long s[3], int dtype) {
  for (long long ib = 0; ib < b; ib++)
    for (long long in = 0; in < n; in++)
      for (long long ih = 0; ih < h; ih++)
        for (long long id = 0; id < d; id++)
          dst[ib * s[0] + in * s[1] + ih * s[2] + id] =
              rda_to_dtype_bits(x[((ib * n + in) * h + ih) * d + id], dtype);
}

uint16_t *rt_make_bits(const double *x, long long b, long long n, long long h, long long d,
                       const long long s[3], int dtype, size_t *count) {
  const size_t c = rt_span(b, n, h, d, s);
  uint16_t *p = rt_alloc_bits(c, dtype);
  rt_pack_bits(p, x, b, n, h, d, s, dtype);
  if (count != NULL) *count = c;
  return p;
}

void rt_unpack_f32(double *dst, const float *x, long long b, long long n, long long h, long long d,
                   const long long s[3]) {
  for (long long ib = 0; ib < b; ib++)
    for (long long in = 0; in < n; in++)
      for (long long ih = 0; ih < h; ih++)
        for (long long id = 0; id < d; id++)
          dst[((ib * n + in) * h + ih) * d + id] = x[ib * s[0] + in * s[1] + ih * s[2] + id];
}

void rt_poison_f32(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = NAN;
}

/* --- comparison with the reference ------------------------------------------------------------ */

rt_tol rt_tolerance(int dtype) {
  /* The one table lives in runtime/check.c (SPEC §5). */
  const rda_tolerance t = rda_tolerance_for(dtype);
  return (rt_tol){t.o_rel_l2, t.lse_abs, t.grad_rel_l2};
}

enum { RT_SHOW = 8 }; /* mismatches printed per failure */

static void rt_header(bool *printed, const char *what) {
  if (*printed) return;
  *printed = true;
  fprintf(stderr, "FAIL %s (RDA_TEST_SEED=%" PRIu64 ")\n", what, rt_seed_value());
}

bool rt_check_fwd(const char *what, const rda_config *c, long long batch, long long n,
                  const float *o, const long long o_s[3], const float *lse,
                  const long long lse_s[2], const double *o_ref, const double *lse_ref,
                  rt_report *rep) {
  const long long H = c->heads, D = c->head_dim;
  const rt_tol tol = rt_tolerance(c->dtype);
  rt_report r = {0};
  bool printed = false;
  int shown = 0;
  double num = 0.0, den = 0.0, sumsq_ref = 0.0;
  long long count_o = 0;

  /* Pass 1: rules that hold element by element; norms. */
  for (long long b = 0; b < batch; b++) {
    for (long long h = 0; h < H; h++) {
      for (long long p = 0; p < n; p++) {
        const double lr = lse_ref[(b * H + h) * n + p];
        const float lg = lse[b * lse_s[0] + h * lse_s[1] + p];
        const bool covered = lr != -INFINITY;
        if (covered) {
          r.covered_rows++;
          if (!isfinite(lg)) {
            r.bad++;
            if (shown++ < RT_SHOW) {
              rt_header(&printed, what);
              fprintf(stderr, "  lse[b=%lld h=%lld n=%lld] = %.8g, expected %.8g (not finite)\n", b,
                      h, p, (double)lg, lr);
            }
          } else {
            const double e = fabs((double)lg - lr);
            if (e > r.lse_max_abs) r.lse_max_abs = e;
            if (e > tol.lse_abs && shown++ < RT_SHOW) {
              rt_header(&printed, what);
              fprintf(stderr,
                      "  lse[b=%lld h=%lld n=%lld] = %.8g, expected %.8g (|diff| %.3g > %.3g)\n", b,
                      h, p, (double)lg, lr, e, tol.lse_abs);
            }
          }
        } else {
          r.uncovered_rows++;
          if (!(isinf(lg) && lg < 0)) {
            r.bad++;
            if (shown++ < RT_SHOW) {
              rt_header(&printed, what);
              fprintf(stderr,
                      "  lse[b=%lld h=%lld n=%lld] = %.8g on an uncovered row, expected -inf\n", b,
                      h, p, (double)lg);
            }
          }
        }
        for (long long d = 0; d < D; d++) {
          const double orf = o_ref[((b * n + p) * H + h) * D + d];
          const float og = o[b * o_s[0] + p * o_s[1] + h * o_s[2] + d];
          if (!covered) {
            if (og != 0.0f) {
              r.bad++;
              if (shown++ < RT_SHOW) {
                rt_header(&printed, what);
                fprintf(stderr,
                        "  o[b=%lld n=%lld h=%lld d=%lld] = %.8g on an uncovered row, expected 0\n",
                        b, p, h, d, (double)og);
              }
            }
            continue;
          }
          if (!isfinite(og)) {
            r.bad++;
            if (shown++ < RT_SHOW) {
              rt_header(&printed, what);
              fprintf(stderr,
                      "  o[b=%lld n=%lld h=%lld d=%lld] = %.8g, expected %.8g (not finite)\n", b, p,
                      h, d, (double)og, orf);
            }
            continue;
          }
          const double diff = (double)og - orf;
          num += diff * diff;
          den += orf * orf;
          sumsq_ref += orf * orf;
          count_o++;
        }
      }
    }
  }
  r.o_rel_l2 = den > 0.0 ? sqrt(num / den) : sqrt(num);
  const bool o_ok = r.o_rel_l2 <= tol.o_rel_l2;
  const bool lse_ok = r.lse_max_abs <= tol.lse_abs;

  if (!o_ok) {
    /* Pass 2 (diagnostics only): the first elements off by more than the tolerance scaled to
     * an element, tol * max(|expected|, rms(O_ref)). */
    rt_header(&printed, what);
    const double rms = count_o > 0 ? sqrt(sumsq_ref / (double)count_o) : 0.0;
    int shown_o = 0;
    for (long long b = 0; b < batch && shown_o < RT_SHOW; b++)
      for (long long p = 0; p < n && shown_o < RT_SHOW; p++)
        for (long long h = 0; h < H && shown_o < RT_SHOW; h++) {
          if (lse_ref[(b * H + h) * n + p] == -INFINITY) continue;
          for (long long d = 0; d < D && shown_o < RT_SHOW; d++) {
            const double orf = o_ref[((b * n + p) * H + h) * D + d];
            const float og = o[b * o_s[0] + p * o_s[1] + h * o_s[2] + d];
            const double t = 4.0 * tol.o_rel_l2 * fmax(fabs(orf), rms);
            if (isfinite(og) && fabs((double)og - orf) > t) {
              shown_o++;
              fprintf(
                  stderr,
                  "  o[b=%lld n=%lld h=%lld d=%lld] = %.8g, expected %.8g (|diff| %.3g > %.3g)\n",
                  b, p, h, d, (double)og, orf, fabs((double)og - orf), t);
            }
          }
        }
  }
  const bool ok = o_ok && lse_ok && r.bad == 0;
  if (!ok) {
    rt_header(&printed, what);
    fprintf(stderr,
            "  %s: B=%lld N=%lld H=%d Hkv=%d D=%d %s causal=%d offsets=%s branches=%d: "
            "O rel L2 %.3g (tol %.3g), max |dLSE| %.3g (tol %.3g), %lld broken rule(s), "
            "%lld covered / %lld uncovered rows\n",
            what, batch, n, c->heads, c->kv_heads, c->head_dim, rda_dtype_name(c->dtype), c->causal,
            rda_offsets_name(c->offsets), c->nbranch, r.o_rel_l2, tol.o_rel_l2, r.lse_max_abs,
            tol.lse_abs, r.bad, r.covered_rows, r.uncovered_rows);
  }
  if (rep != NULL) *rep = r;
  return ok;
}

bool rt_check_lse_close(const char *what, const float *got, const float *want, size_t n,
                        double tol) {
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const int uncovered = isinf(want[i]) && want[i] < 0;
    if (uncovered != (isinf(got[i]) && got[i] < 0) || (!uncovered && !isfinite(got[i]))) {
      fprintf(stderr, "%s: lse[%zu] = %g, expected %g\n", what, i, got[i], want[i]);
      return false;
    }
    const double e = uncovered ? 0.0 : fabs((double)got[i] - (double)want[i]);
    if (e > worst) worst = e;
  }
  if (worst <= tol) return true;
  fprintf(stderr, "%s: max |lse - lse_single| = %g > %g\n", what, worst, tol);
  return false;
}

bool rt_check_rel_l2(const char *what, const double *got, const double *expected, size_t n,
                     double tol) {
  double num = 0.0, den = 0.0;
  size_t bad = 0;
  bool printed = false;
  int shown = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) {
      bad++;
      if (shown++ < RT_SHOW) {
        rt_header(&printed, what);
        fprintf(stderr, "  [%zu] = %.8g, expected %.8g (not finite)\n", i, got[i], expected[i]);
      }
      continue;
    }
    num += (got[i] - expected[i]) * (got[i] - expected[i]);
    den += expected[i] * expected[i];
  }
  const double rel = den > 0.0 ? sqrt(num / den) : sqrt(num);
  if (bad == 0 && rel <= tol) return true;
  rt_header(&printed, what);
  const double rms = n > 0 ? sqrt(den / (double)n) : 0.0;
  for (size_t i = 0; i < n && shown < RT_SHOW; i++) {
    const double t = 4.0 * tol * fmax(fabs(expected[i]), rms);
    if (isfinite(got[i]) && fabs(got[i] - expected[i]) > t) {
      shown++;
      fprintf(stderr, "  [%zu] = %.8g, expected %.8g (|diff| %.3g > %.3g)\n", i, got[i],
              expected[i], fabs(got[i] - expected[i]), t);
    }
  }
  fprintf(stderr, "  %s: rel L2 %.3g (tol %.3g), %zu not finite\n", what, rel, tol, bad);
  return false;
}

void rt_reference(const rda_config *c, long long batch, long long n, const double *q,
                  const double *k, const double *v, double **o, double **lse) {
  *o = rt_xmalloc((size_t)(batch * n * c->heads * c->head_dim) * sizeof **o);
  *lse = rt_xmalloc((size_t)(batch * c->heads * n) * sizeof **lse);
  rda_ref_forward(c, batch, n, q, k, v, *o, *lse);
}

/* One gradient against its reference (and magnitude, may be NULL): relative L2 (computed by
 * runtime/check.c), and on failure the first non-finite or far-off elements. */
static bool rt_check_grad_one(const char *what, const char *name, const rda_config *c,
                              long long batch, long long n, int heads, const float *got,
                              const long long s[3], const double *ref, const double *mag,
                              double tol, double *rel, long long *nonfinite, bool *printed) {
  const long long D = c->head_dim;
  *rel = rda_check_grad_rel_l2(got, s, ref, mag, batch, n, heads, c->head_dim, nonfinite);
  if (*nonfinite == 0 && *rel <= tol) return true;
  rt_header(printed, what);
  double sumsq = 0.0, magsq = 0.0;
  const long long count = batch * n * heads * D;
  for (long long i = 0; i < count; i++) sumsq += ref[i] * ref[i];
  for (long long i = 0; mag != NULL && i < count; i++) magsq += mag[i] * mag[i];
  /* the scale an element is shown against: its own, the gradient's RMS, or the check's
   * magnitude floor where the gradient cancels */
  const double rms = count > 0 ? fmax(sqrt(sumsq / (double)count),
                                      RDA_CHECK_GRAD_MAG_FRACTION * sqrt(magsq / (double)count))
                               : 0.0;
  int shown = 0;
  for (long long b = 0; b < batch && shown < RT_SHOW; b++)
    for (long long p = 0; p < n && shown < RT_SHOW; p++)
      for (long long h = 0; h < heads && shown < RT_SHOW; h++)
        for (long long d = 0; d < D && shown < RT_SHOW; d++) {
          const double want = ref[((b * n + p) * heads + h) * D + d];
          const float g = got[b * s[0] + p * s[1] + h * s[2] + d];
          const double t = 4.0 * tol * fmax(fabs(want), rms);
          if (!isfinite(g)) {
            shown++;
            fprintf(stderr,
                    "  %s[b=%lld n=%lld h=%lld d=%lld] = %.8g, expected %.8g (not finite)\n", name,
                    b, p, h, d, (double)g, want);
          } else if (fabs((double)g - want) > t) {
            shown++;
            fprintf(
                stderr,
                "  %s[b=%lld n=%lld h=%lld d=%lld] = %.8g, expected %.8g (|diff| %.3g > %.3g)\n",
                name, b, p, h, d, (double)g, want, fabs((double)g - want), t);
          }
        }
  fprintf(stderr, "  %s: rel L2 %.3g (tol %.3g), %lld not finite\n", name, *rel, tol, *nonfinite);
  if (sumsq < RDA_CHECK_GRAD_MAG_FRACTION * RDA_CHECK_GRAD_MAG_FRACTION * magsq)
    fprintf(stderr,
            "  %s cancels (||ref|| %.3g < %g ||mag||, ||mag|| %.3g): the error is taken "
            "relative to %g ||mag||\n",
            name, sqrt(sumsq), RDA_CHECK_GRAD_MAG_FRACTION, sqrt(magsq),
            RDA_CHECK_GRAD_MAG_FRACTION);
  return false;
}

/* rt_check_bwd_ref and rt_check_bwd: refs and mags (entries may be NULL) of dQ, dK, dV. */
static bool rt_check_bwd_with(const char *what, const rda_config *c, long long batch, long long n,
                              const float *dq, const long long dq_s[3], const float *dk,
                              const long long dk_s[3], const float *dv, const long long dv_s[3],
                              const double *const refs[3], const double *const mags[3],
                              rt_grad_report *rep) {
  const double tol = rt_tolerance(c->dtype).grad_rel_l2;
  rt_grad_report r = {0};
  bool printed = false;
  long long bq = 0, bk = 0, bv = 0;
  bool ok = rt_check_grad_one(what, "dq", c, batch, n, c->heads, dq, dq_s, refs[0], mags[0], tol,
                              &r.dq_rel_l2, &bq, &printed);
  ok &= rt_check_grad_one(what, "dk", c, batch, n, c->kv_heads, dk, dk_s, refs[1], mags[1], tol,
                          &r.dk_rel_l2, &bk, &printed);
  ok &= rt_check_grad_one(what, "dv", c, batch, n, c->kv_heads, dv, dv_s, refs[2], mags[2], tol,
                          &r.dv_rel_l2, &bv, &printed);
  r.nonfinite = bq + bk + bv;
  if (!ok)
    fprintf(stderr,
            "  %s: B=%lld N=%lld H=%d Hkv=%d D=%d %s causal=%d offsets=%s branches=%d: "
            "rel L2 dQ %.3g dK %.3g dV %.3g (tol %.3g), %lld not finite\n",
            what, batch, n, c->heads, c->kv_heads, c->head_dim, rda_dtype_name(c->dtype), c->causal,
            rda_offsets_name(c->offsets), c->nbranch, r.dq_rel_l2, r.dk_rel_l2, r.dv_rel_l2, tol,
            r.nonfinite);
  if (rep != NULL) *rep = r;
  return ok;
}

bool rt_check_bwd_ref(const char *what, const rda_config *c, long long batch, long long n,
                      const float *dq, const long long dq_s[3], const float *dk,
                      const long long dk_s[3], const float *dv, const long long dv_s[3],
                      const rt_bwd_ref *ref, rt_grad_report *rep) {
  const double *const refs[3] = {ref->dq, ref->dk, ref->dv};
  const double *const mags[3] = {ref->dq_mag, ref->dk_mag, ref->dv_mag};
  return rt_check_bwd_with(what, c, batch, n, dq, dq_s, dk, dk_s, dv, dv_s, refs, mags, rep);
}

bool rt_check_bwd(const char *what, const rda_config *c, long long batch, long long n,
                  const float *dq, const long long dq_s[3], const float *dk,
                  const long long dk_s[3], const float *dv, const long long dv_s[3],
                  const double *dq_ref, const double *dk_ref, const double *dv_ref,
                  rt_grad_report *rep) {
  const double *const refs[3] = {dq_ref, dk_ref, dv_ref};
  const double *const mags[3] = {NULL, NULL, NULL};
  return rt_check_bwd_with(what, c, batch, n, dq, dq_s, dk, dk_s, dv, dv_s, refs, mags, rep);
}

void rt_reference_bwd(const rda_config *c, long long batch, long long n, const double *q,
                      const double *k, const double *v, const double *dout, const double *dlse,
                      double **dq, double **dk, double **dv) {
  *dq = rt_xmalloc((size_t)(batch * n * c->heads * c->head_dim) * sizeof **dq);
  *dk = rt_xmalloc((size_t)(batch * n * c->kv_heads * c->head_dim) * sizeof **dk);
  *dv = rt_xmalloc((size_t)(batch * n * c->kv_heads * c->head_dim) * sizeof **dv);
  rda_ref_backward(c, batch, n, q, k, v, dout, dlse, *dq, *dk, *dv, NULL, NULL, NULL);
}

void rt_reference_bwd_mag(const rda_config *c, long long batch, long long n, const double *q,
                          const double *k, const double *v, const double *dout, const double *dlse,
                          rt_bwd_ref *ref) {
  const size_t nq = (size_t)(batch * n * c->heads * c->head_dim);
  const size_t nkv = (size_t)(batch * n * c->kv_heads * c->head_dim);
  ref->dq = rt_xmalloc(nq * sizeof *ref->dq);
  ref->dk = rt_xmalloc(nkv * sizeof *ref->dk);
  ref->dv = rt_xmalloc(nkv * sizeof *ref->dv);
  ref->dq_mag = rt_xmalloc(nq * sizeof *ref->dq_mag);
  ref->dk_mag = rt_xmalloc(nkv * sizeof *ref->dk_mag);
  ref->dv_mag = rt_xmalloc(nkv * sizeof *ref->dv_mag);
  rda_ref_backward(c, batch, n, q, k, v, dout, dlse, ref->dq, ref->dk, ref->dv, ref->dq_mag,
                   ref->dk_mag, ref->dv_mag);
}

void rt_bwd_ref_free(rt_bwd_ref *ref) {
  free(ref->dq);
  free(ref->dk);
  free(ref->dv);
  free(ref->dq_mag);
  free(ref->dk_mag);
  free(ref->dv_mag);
  memset(ref, 0, sizeof *ref);
}

/* --- files and subprocesses ------------------------------------------------------------------- */

char *rt_mkdtemp(void) {
  const char *base = getenv("TMPDIR");
  if (base == NULL || *base == '\0') base = "/tmp";
  const size_t len = strlen(base) + 32;
  char *path = rt_xmalloc(len);
  snprintf(path, len, "%s/rda_test_XXXXXX", base);
  if (mkdtemp(path) == NULL) {
    free(path);
    return NULL;
  }
  return path;
}

void rt_rmtree(const char *path) {
  if (path == NULL) return;
  struct stat st;
  if (lstat(path, &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (d != NULL) {
      struct dirent *e;
      while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char *child = rt_path(path, e->d_name);
        rt_rmtree(child);
        free(child);
      }
      closedir(d);
    }
    rmdir(path);
  } else {
    unlink(path);
  }
}

char *rt_path(const char *dir, const char *name) {
  const size_t len = strlen(dir) + strlen(name) + 2;
  char *p = rt_xmalloc(len);
  snprintf(p, len, "%s/%s", dir, name);
  return p;
}

bool rt_write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (f == NULL) return false;
  const bool ok = fwrite(data, 1, len, f) == len;
  return fclose(f) == 0 && ok;
}

char *rt_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  size_t cap = 4096, used = 0;
  char *buf = rt_xmalloc(cap);
  for (;;) {
    if (used + 1 >= cap) {
      cap *= 2;
      char *nb = realloc(buf, cap);
      if (nb == NULL) abort();
      buf = nb;
    }
    const size_t got = fread(buf + used, 1, cap - used - 1, f);
    used += got;
    if (got == 0) break;
  }
  fclose(f);
  buf[used] = '\0';
  if (len != NULL) *len = used;
  return buf;
}

bool rt_exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

int rt_count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

char *rt_env_save(const char *name) {
  const char *v = getenv(name);
  return v != NULL ? strdup(v) : NULL;
}

void rt_env_restore(const char *name, char *saved) {
  if (saved != NULL)
    setenv(name, saved, 1);
  else
    unsetenv(name);
  free(saved);
}

bool rt_write_npy(const char *path, const char *descr, int fortran, int ndim,
                  const long long *shape, const double *x) {
  int size, big = 0, isint = 0, half = 0;
  if (strcmp(descr, "<f2") == 0)
    size = 2, half = 1;
  else if (strcmp(descr, "<f4") == 0)
    size = 4;
  else if (strcmp(descr, "<f8") == 0)
    size = 8;
  else if (strcmp(descr, ">f4") == 0)
    size = 4, big = 1;
  else if (strcmp(descr, "<i4") == 0)
    size = 4, isint = 1;
  else
    return false;
  char dict[512];
  int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': (", descr,
                     fortran ? "True" : "False");
  size_t count = 1;
  for (int i = 0; i < ndim; i++) {
    len += snprintf(dict + len, sizeof dict - (size_t)len, "%lld%s", shape[i],
                    ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
    count *= (size_t)shape[i];
  }
  len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
  const size_t total_head = ((size_t)len + 11 + 63) / 64 * 64;
  const size_t hlen = total_head - 10;
  const size_t bytes = total_head + count * (size_t)size;
  unsigned char *buf = rt_xmalloc(bytes);
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  buf[8] = (unsigned char)(hlen & 0xff);
  buf[9] = (unsigned char)(hlen >> 8);
  memcpy(buf + 10, dict, (size_t)len);
  memset(buf + 10 + len, ' ', hlen - (size_t)len - 1);
  buf[total_head - 1] = '\n';
  for (size_t i = 0; i < count; i++) {
    uint64_t u;
    if (half) {
      u = rda_to_dtype_bits(x[i], RDA_DTYPE_FP16);
    } else if (isint) {
      u = (uint32_t)(int32_t)x[i];
    } else if (size == 4) {
      const float f = (float)x[i];
      uint32_t u32;
      memcpy(&u32, &f, 4);
      u = u32;
    } else {
      memcpy(&u, &x[i], 8);
    }
    unsigned char *dst = buf + total_head + i * (size_t)size;
    for (int b = 0; b < size; b++)
      dst[big ? size - 1 - b : b] = (unsigned char)((u >> (8 * b)) & 0xff);
  }
  const bool ok = rt_write_file(path, buf, bytes);
  free(buf);
  return ok;
}

typedef struct rt_buf {
  char *data;
  size_t len, cap;
} rt_buf;

static void rt_buf_add(rt_buf *b, const char *src, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (b->len + n + 1 > cap) cap *= 2;
    char *nd = realloc(b->data, cap);
    if (nd == NULL) abort();
    b->data = nd;
    b->cap = cap;
  }
  memcpy(b->data + b->len, src, n);
  b->len += n;
  b->data[b->len] = '\0';
}

double rt_thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double rt_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool rt_run(char *const argv[], int timeout_s, rt_proc *p) {
  memset(p, 0, sizeof *p);
  p->exit_code = -1;
  int po[2], pe[2];
  if (pipe(po) != 0) return false;
  if (pipe(pe) != 0) {
    close(po[0]);
    close(po[1]);
    return false;
  }
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(po[0]);
    close(po[1]);
    close(pe[0]);
    close(pe[1]);
    return false;
  }
  if (pid == 0) {
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(po[0]);
    close(po[1]);
    close(pe[0]);
    close(pe[1]);
    execv(argv[0], argv);
    fprintf(stderr, "rt_run: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(po[1]);
  close(pe[1]);
  rt_buf out = {0}, err = {0};
  rt_buf_add(&out, "", 0);
  rt_buf_add(&err, "", 0);
  struct pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
  int open_fds = 2;
  const double deadline = rt_now_s() + (timeout_s > 0 ? timeout_s : 600);
  bool killed = false;
  while (open_fds > 0) {
    const double left = deadline - rt_now_s();
    if (left <= 0) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    const int rc = poll(fds, 2, (int)(left * 1000.0) + 1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char chunk[4096];
      const ssize_t got = read(fds[i].fd, chunk, sizeof chunk);
      if (got > 0) {
        rt_buf_add(i == 0 ? &out : &err, chunk, (size_t)got);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        close(fds[i].fd);
        fds[i].fd = -1;
        open_fds--;
      }
    }
  }
  for (int i = 0; i < 2; i++)
    if (fds[i].fd >= 0) close(fds[i].fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (killed) {
    fprintf(stderr, "rt_run: %s timed out after %d s\n", argv[0], timeout_s);
    p->exit_code = 128 + SIGKILL;
  } else if (WIFEXITED(status)) {
    p->exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    p->exit_code = 128 + WTERMSIG(status);
  }
  p->out = out.data;
  p->err = err.data;
  return true;
}

void rt_proc_free(rt_proc *p) {
  if (p == NULL) return;
  free(p->out);
  free(p->err);
  p->out = p->err = NULL;
}

int rt_count_lines(const char *s) {
  if (s == NULL) return 0;
  int n = 0;
  const char *last = s;
  for (const char *c = s; *c; c++)
    if (*c == '\n') {
      n++;
      last = c + 1;
    }
  if (*last != '\0') n++;
  return n;
}
