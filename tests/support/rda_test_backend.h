/* rda_test_backend.h — what the kernel-running tests share: the backends they run on (the
 * emulator always, the cuda backend when a usable GPU is here) with their hardware profiles,
 * device buffers that fail the test on error, timing, and the padded sequence-first layout. */
#ifndef RDA_TEST_BACKEND_H
#define RDA_TEST_BACKEND_H

#include <stddef.h>

#include "backend.h"
#include "gen.h"

/* A backend the kernels run on, with the hardware profile its plans target. */
typedef struct rt_backend {
  rda_backend *b;
  rda_hw hw;
} rt_backend;

/* The generator and every backend a test runs its cases on (emu first). */
typedef struct rt_backends {
  rda_gen *gen;
  rt_backend be[2];
  int n;
} rt_backends;

/* Open the generator, the emulator (sm_90, its builtin profile) and, when it opens and reports
 * its profile, the cuda backend (else one line on stderr saying why it is skipped). On failure
 * prints "<who>: ..." to stderr and returns -1 (a cmocka group setup's failure); else 0. */
int rt_backends_open(rt_backends *s, const char *who);
void rt_backends_close(rt_backends *s);

/* A cmocka group setup/teardown pair for tests that need only the generator: *state is an
 * open rda_gen (setup prints "rda_gen_open: <error>" and returns -1 if it cannot open). */
int rt_gen_setup(void **state);
int rt_gen_teardown(void **state);

/* Whether be can run a case on the wgmma path (RDA_PLAN_WGMMA), which sm_90 alone has; when it
 * cannot, one line on stderr says the case `what` is skipped on it. */
int rt_wgmma_runs_on(const rt_backend *be, const char *what);

/* Fails the test `what` unless every variant of `plan` of kind `kind` ("fwd", "bwd_dkdv",
 * "bwd_dq") is a wgmma one ("_wg") exactly when `wgmma`: a wgmma case planned on mma.sync tests
 * nothing. The atomic-dQ dK/dV variants ("_qa"), which have no wgmma path, must never be. With
 * RDA_WGMMA=1 in the environment a case that did not ask (wgmma 0) gets wgmma variants wherever
 * the tile space has them: then all of the kind's must be (the "_qa" ones still never). */
void rt_check_wgmma_plan(const rda_plan_k *plan, const char *kind, int wgmma, const char *what);

/* Plan cfg on hw with flags (rda_gen_plan_forced), branch 0's kernel of `kind` ("fwd" or
 * "bwd_dq") forced to `tile` (NULL: nothing forced). Fails the test `what` when planning fails,
 * or when branch 0 does not run that tile (a case that tests nothing). */
void rt_plan_with_tile(rda_gen *g, const rda_config *cfg, const rda_hw *hw, unsigned flags,
                       const char *kind, const char *tile, rda_plan_k *out, const char *what);

/* After a suite whose cases went through rt_check_wgmma_plan: with RDA_WGMMA=1, 1 (and a line
 * on stderr naming `suite`) when none of them planned a wgmma variant, so a rerun meant to take
 * the wgmma path cannot pass without it; else 0. */
int rt_wgmma_env_reached(const char *suite);

/* Device memory calls that fail the running test with "<backend> alloc: <error>" etc. */
void *rt_dev_alloc(rda_backend *b, size_t bytes);
void rt_dev_upload(rda_backend *b, void *dst, const void *src, size_t bytes);
void rt_dev_download(rda_backend *b, void *dst, const void *src, size_t bytes);
/* A device fp32 buffer of `count` NaNs (outputs are poisoned before every run). */
float *rt_dev_poisoned(rda_backend *b, size_t count);
/* malloc'd host copy of `count` fp32 values on the device. */
float *rt_download_f32(rda_backend *b, const float *dev, size_t count);
/* A device fp32 copy of a float64 LSE-shaped x [B, H, N] (a dLSE) laid out with strides s over
 * (batch, head), n contiguous: rt_lse_span elements, NaN between the rows. */
float *rt_dev_lse_f32(rda_backend *b, const double *x, long long batch, long long heads,
                      long long n, const long long s[2]);

/* Element strides (batch, n, head) of a [B, N, heads, d] tensor stored sequence-first,
 * [N, B, heads, d + pad] (pad extra elements per head row keep rows 16-byte aligned). */
void rt_strides_seq_first(long long b, long long heads, long long d, long long pad, long long s[3]);

/* Branch lists for the kernel-test case tables: `.nbranch, .w[], .r[]` in designated order,
 * e.g. BR2(256, 1, 512, 2). */
#define BR1(w0, r0) \
  1, {w0}, {        \
    r0              \
  }
#define BR2(w0, r0, w1, r1) \
  2, {w0, w1}, {            \
    r0, r1                  \
  }
#define BR3(w0, r0, w1, r1, w2, r2) \
  3, {w0, w1, w2}, {                \
    r0, r1, r2                      \
  }

#endif
