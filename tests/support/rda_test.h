/* rda_test.h — what every rda test shares: a seeded RNG with normal draws, strided storage-dtype
 * tensors, the SPEC §5 comparison of kernel outputs with the float64 reference (printing the
 * first mismatches, llm.c style), output poisoning, temp folders and running a subprocess. */
#ifndef RDA_TEST_H
#define RDA_TEST_H

#include "config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --- random numbers --------------------------------------------------------------------------- */

/* No rounding: rt_fill_normal keeps the float64 draws. */
#define RT_DTYPE_F64 (-1)

typedef struct rt_rng {
  uint64_t s[4]; /* xoshiro256** state */
  int has_spare;
  double spare; /* the second Box-Muller value */
} rt_rng;

void rt_rng_seed(rt_rng *r, uint64_t seed); /* splitmix64 expands the seed */
uint64_t rt_rng_next(rt_rng *r);
double rt_rng_uniform(rt_rng *r);                              /* [0, 1) with 53 bits */
double rt_rng_normal(rt_rng *r);                               /* normal(0, 1), Box-Muller */
long long rt_rng_range(rt_rng *r, long long lo, long long hi); /* uniform in [lo, hi] */

/* The process-wide generator the helpers below draw from: seeded from $RDA_TEST_SEED when set,
 * else a fixed default; rt_seed() reseeds it. rt_seed_value() is printed with every failure.
 * It is the main thread's: a thread of a test (a ring's rank) draws from a generator of its
 * own, seeded from rt_seed_value() and the rank, so its inputs neither race nor depend on
 * which thread drew first. */
void rt_seed(uint64_t seed);
uint64_t rt_seed_value(void);
rt_rng *rt_global_rng(void);

/* x[0..n) = normal(0, 1) draws rounded to dtype (RDA_DTYPE_BF16, RDA_DTYPE_FP16, RT_DTYPE_F64). */
void rt_fill_normal(double *x, size_t n, int dtype);
/* malloc'd, n normal draws rounded to dtype; aborts on out of memory. */
double *rt_normal(size_t n, int dtype);
/* The same two drawing from r instead of the global generator (a test whose cases must each
 * run alone exactly as they ran among the others gives every case its own stream). */
void rt_fill_normal_from(rt_rng *r, double *x, size_t n, int dtype);
double *rt_normal_from(rt_rng *r, size_t n, int dtype);

/* --- configs ---------------------------------------------------------------------------------- */

/* A config filled by hand (tests only): branches from w[], r[]; scale 1/sqrt(head_dim). */
void rt_config_make(rda_config *c, int heads, int kv_heads, int head_dim, int dtype, int causal,
                    int offsets, int nbranch, const long long *w, const long long *r);

/* --- strided storage tensors ------------------------------------------------------------------ */

/* Contiguous element strides over (batch, n, head) of a [B, N, H, D] tensor. */
void rt_strides_contig(long long n, long long h, long long d, long long strides[3]);
/* Number of elements a strided [B, N, H, D] view spans (largest offset + 1). */
size_t rt_span(long long b, long long n, long long h, long long d, const long long strides[3]);
/* The same for an LSE-shaped [B, H, N] view (strides over batch, head; n contiguous). */
size_t rt_lse_span(long long b, long long h, long long n, const long long strides[2]);
/* malloc'd uint16 buffer of `count` elements, every one NaN bits of dtype (so a read outside
 * the tensor shows up). */
uint16_t *rt_alloc_bits(size_t count, int dtype);
/* Write contiguous doubles x [B, N, H, D] into dst (storage bits of dtype) with strides. */
void rt_pack_bits(uint16_t *dst, const double *x, long long b, long long n, long long h,
                  long long d, const long long strides[3], int dtype);
/* rt_alloc_bits(rt_span(...)) + rt_pack_bits; *count receives the element count (may be NULL). */
uint16_t *rt_make_bits(const double *x, long long b, long long n, long long h, long long d,
                       const long long strides[3], int dtype, size_t *count);
/* Read a strided fp32 [B, N, H, D] into contiguous doubles. */
void rt_unpack_f32(double *dst, const float *x, long long b, long long n, long long h, long long d,
                   const long long strides[3]);

/* Fill with NaN: outputs are poisoned before every run so an unwritten element fails. */
void rt_poison_f32(float *x, size_t n);

/* --- comparison with the reference (SPEC §5) -------------------------------------------------- */

typedef struct rt_tol {
  double o_rel_l2;    /* ||O - O_ref|| / ||O_ref|| */
  double lse_abs;     /* max |LSE - LSE_ref| over covered rows */
  double grad_rel_l2; /* ||dX - dX_ref|| / ||dX_ref|| */
} rt_tol;

/* The SPEC §5 tolerances of a storage dtype (one table). */
rt_tol rt_tolerance(int dtype);

/* What a comparison measured (filled even when it fails). */
typedef struct rt_report {
  double o_rel_l2;
  double lse_max_abs;
  long long covered_rows, uncovered_rows;
  long long bad; /* elements that broke a rule */
} rt_report;

/* Compare a kernel's fp32 o [B, N, H, D] (strides o_s over batch, n, head; d contiguous) and
 * lse [B, H, N] (strides lse_s over batch, head; n contiguous) with the reference o_ref
 * [B, N, H, D] and lse_ref [B, H, N] (contiguous doubles) per SPEC §5: relative L2 of O, max
 * |LSE - LSE_ref| over covered rows, uncovered rows (lse_ref = -inf) exactly o = 0 and
 * lse = -inf, no NaN/Inf elsewhere. On failure prints `what`, the seed and the first mismatches
 * (index, got, expected, scaled tolerance) to stderr and returns false. rep may be NULL. */
bool rt_check_fwd(const char *what, const rda_config *c, long long batch, long long n,
                  const float *o, const long long o_s[3], const float *lse,
                  const long long lse_s[2], const double *o_ref, const double *lse_ref,
                  rt_report *rep);

/* An LSE against another run's (ring vs single device): the same rows uncovered (-inf), the
 * rest finite and within tol absolute; prints the first difference and returns false. */
bool rt_check_lse_close(const char *what, const float *got, const float *want, size_t n,
                        double tol);
/* Relative L2 of got vs expected (n values) within tol, no NaN/Inf; prints on failure. */
bool rt_check_rel_l2(const char *what, const double *got, const double *expected, size_t n,
                     double tol);

/* The reference forward pass into malloc'd *o [B, N, H, D] and *lse [B, H, N]. */
void rt_reference(const rda_config *c, long long batch, long long n, const double *q,
                  const double *k, const double *v, double **o, double **lse);

/* What a backward comparison measured (filled even when it fails). */
typedef struct rt_grad_report {
  double dq_rel_l2, dk_rel_l2, dv_rel_l2;
  long long nonfinite; /* NaN/Inf elements in dQ, dK, dV together */
} rt_grad_report;

/* The float64 reference gradients of a problem and their magnitudes (rda_ref_backward:
 * every term of the sums made positive), all malloc'd: dq, dq_mag [B, N, H, D]; dk, dv,
 * dk_mag, dv_mag [B, N, Hkv, D]. */
typedef struct rt_bwd_ref {
  double *dq, *dk, *dv;
  double *dq_mag, *dk_mag, *dv_mag;
} rt_bwd_ref;

/* The reference backward pass (dlse may be NULL = 0) with the magnitudes into *ref. */
void rt_reference_bwd_mag(const rda_config *c, long long batch, long long n, const double *q,
                          const double *k, const double *v, const double *dout, const double *dlse,
                          rt_bwd_ref *ref);
/* Free what rt_reference_bwd_mag allocated and zero *ref (accepts a zeroed one). */
void rt_bwd_ref_free(rt_bwd_ref *ref);

/* Compare a kernel's fp32 dq [B, N, H, D] and dk, dv [B, N, Hkv, D] (strides over batch, n,
 * head; d contiguous) with the reference gradients per SPEC §5 as rda_check_grad judges them:
 * each relative L2 within the dtype's grad tolerance, no NaN/Inf; where ref's magnitudes are
 * given, a gradient that cancels (N = 1, a saturated softmax) is judged against a fraction of
 * its magnitude (check.h, RDA_CHECK_GRAD_MAG_FRACTION). On failure prints `what`, the seed and
 * the first mismatches (index, got, expected, scaled tolerance) to stderr and returns false.
 * rep may be NULL. */
bool rt_check_bwd_ref(const char *what, const rda_config *c, long long batch, long long n,
                      const float *dq, const long long dq_s[3], const float *dk,
                      const long long dk_s[3], const float *dv, const long long dv_s[3],
                      const rt_bwd_ref *ref, rt_grad_report *rep);

/* The same without magnitudes: the plain SPEC §5 ratio (with check.h's RMS floor), which a
 * correct kernel fails where a gradient cancels. For callers that have only dq_ref, dk_ref,
 * dv_ref (contiguous doubles). */
bool rt_check_bwd(const char *what, const rda_config *c, long long batch, long long n,
                  const float *dq, const long long dq_s[3], const float *dk,
                  const long long dk_s[3], const float *dv, const long long dv_s[3],
                  const double *dq_ref, const double *dk_ref, const double *dv_ref,
                  rt_grad_report *rep);

/* The reference backward pass (dlse may be NULL = 0) into malloc'd *dq [B, N, H, D] and *dk,
 * *dv [B, N, Hkv, D], without magnitudes. */
void rt_reference_bwd(const rda_config *c, long long batch, long long n, const double *q,
                      const double *k, const double *v, const double *dout, const double *dlse,
                      double **dq, double **dk, double **dv);

/* --- clocks ---------------------------------------------------------------------------------- */

/* The calling thread's CPU seconds: what the config sandbox's time limit counts, so a test that
 * bounds a run by it is not failed by a loaded machine stretching the wall time. */
double rt_thread_cpu_s(void);
/* Monotonic wall-clock seconds (an arbitrary origin): for bounds on how long a call took. */
double rt_now_s(void);

/* --- files and subprocesses ------------------------------------------------------------------- */

/* A fresh folder under $TMPDIR (or /tmp), malloc'd path; NULL on failure. */
char *rt_mkdtemp(void);
/* Remove a folder and everything in it (best effort); accepts NULL. */
void rt_rmtree(const char *path);
/* malloc'd "dir/name". */
char *rt_path(const char *dir, const char *name);
bool rt_write_file(const char *path, const void *data, size_t len);
/* malloc'd contents (NUL-terminated; *len may be NULL); NULL if unreadable. */
char *rt_read_file(const char *path, size_t *len);
bool rt_exists(const char *path);
/* Entries in a folder other than . and .. (-1 if unreadable). */
int rt_count_entries(const char *dir);

/* --- the environment ------------------------------------------------------------------------ */

/* A malloc'd copy of environment variable `name`, or NULL when unset: for rt_env_restore. */
char *rt_env_save(const char *name);
/* Put `name` back as rt_env_save found it (unset when saved is NULL) and free saved. */
void rt_env_restore(const char *name, char *saved);

/* Write x (count = product of shape) as a version-1 .npy with dtype descr: "<f2", "<f4", "<f8"
 * (values rounded to it), or for negative tests ">f4" (big-endian), "<i4" (truncated to int),
 * with fortran_order as given. */
bool rt_write_npy(const char *path, const char *descr, int fortran, int ndim,
                  const long long *shape, const double *x);

typedef struct rt_proc {
  int exit_code; /* exit status, or 128 + signal when killed by one, -1 if it could not run */
  char *out;     /* captured stdout, malloc'd, NUL-terminated */
  char *err;     /* captured stderr */
} rt_proc;

/* Run argv (argv[0] a path, NULL-terminated) with the current environment, capturing stdout
 * and stderr; gives up (kills it) after timeout_s seconds. Returns false if it could not be
 * started. Free with rt_proc_free. */
bool rt_run(char *const argv[], int timeout_s, rt_proc *p);
void rt_proc_free(rt_proc *p);
/* Lines in s (a final line without '\n' counts). */
int rt_count_lines(const char *s);

#endif
