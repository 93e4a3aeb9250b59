/* test_emu.c — the CPU emulator: each emulated intrinsic of templates/ptx.cuh against a scalar
 * model of its PTX ISA semantics written here (fragment layouts, rounding), the execution model
 * (grids, barriers, shared-memory poison, deadlocks, traps) and the backend (cache, errors). */
/* cmocka.h needs these four first. */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <dirent.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>

#include "backend.h"
#include "emu.h"
#include "rda_test.h"
#include "rda_test_wgmma.h"

/* Must match struct emu_test_params in tests/kernels/emu_*.cu. */
typedef struct emu_test_params {
  const void *in0, *in1, *in2;
  void *out0, *out1;
  long long n;
  int op;
  int pad;
} emu_test_params;

/* ------------------------------------------------------------------ fixture */

typedef struct emu_loaded {
  char name[64];
  rda_module *m;
} emu_loaded;

static rda_backend *g_backend;
static char *g_src_intrinsics;
static char *g_src_model;
static char *g_src_wgmma;
static emu_loaded g_loaded[16];
static int g_nloaded;

static char *read_kernel(const char *file) {
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/kernels/%s", RDA_SOURCE_DIR, file);
  char *text = rt_read_file(path, NULL);
  if (text == NULL) fprintf(stderr, "test_emu: cannot read %s\n", path);
  return text;
}

static int group_setup(void **state) {
  (void)state;
  rda_err err = {0};
  if (rda_backend_emu_open(&g_backend, 90, &err) != RDA_OK) {
    fprintf(stderr, "test_emu: %s\n", err.msg);
    return -1;
  }
  g_src_intrinsics = read_kernel("emu_intrinsics.cu");
  g_src_model = read_kernel("emu_model.cu");
  g_src_wgmma = read_kernel("emu_wgmma.cu");
  return g_src_intrinsics != NULL && g_src_model != NULL && g_src_wgmma != NULL ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  for (int i = 0; i < g_nloaded; ++i) g_backend->unload(g_backend, g_loaded[i].m);
  g_nloaded = 0;
  if (g_backend != NULL) g_backend->destroy(g_backend);
  g_backend = NULL;
  free(g_src_intrinsics);
  free(g_src_model);
  free(g_src_wgmma);
  return 0;
}

/* Loads entry `name` of the test kernel `source` on b. */
static rda_status load_test_kernel(rda_backend *b, const char *name, char *source, rda_module **m,
                                   rda_err *err) {
  rda_variant v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "%s", name);
  snprintf(v.kind, sizeof v.kind, "test");
  v.source = source;
  *m = NULL;
  return b->load(b, &v, m, err);
}

/* The same, failing the test when it does not load. */
static rda_module *must_load(rda_backend *b, const char *name, char *source) {
  rda_err err = {0};
  rda_module *m = NULL;
  if (load_test_kernel(b, name, source, &m, &err) != RDA_OK) fail_msg("load %s: %s", name, err.msg);
  return m;
}

/* The module of entry `name` from `source` (loaded once per name). */
static rda_module *module(const char *name, char *source) {
  for (int i = 0; i < g_nloaded; ++i)
    if (strcmp(g_loaded[i].name, name) == 0) return g_loaded[i].m;
  rda_module *m = must_load(g_backend, name, source);
  assert_true(g_nloaded < (int)(sizeof g_loaded / sizeof *g_loaded));
  snprintf(g_loaded[g_nloaded].name, sizeof g_loaded[g_nloaded].name, "%s", name);
  g_loaded[g_nloaded++].m = m;
  return m;
}

static rda_status run3(const char *name, char *source, unsigned gx, unsigned gy, unsigned gz,
                       unsigned bx, unsigned by, unsigned bz, unsigned smem,
                       const emu_test_params *p, rda_err *err) {
  rda_module *m = module(name, source);
  const unsigned grid[3] = {gx, gy, gz};
  const unsigned block[3] = {bx, by, bz};
  return rda_emu_launch3(g_backend, m, grid, block, smem, p, sizeof *p, err);
}

/* A launch that must succeed. */
static void run_ok(const char *name, char *source, unsigned gx, unsigned threads, unsigned smem,
                   const emu_test_params *p) {
  rda_err err = {0};
  rda_module *m = module(name, source);
  const unsigned grid[3] = {gx, 1, 1};
  if (g_backend->launch(g_backend, m, grid, threads, smem, p, sizeof *p, &err) != RDA_OK) {
    fprintf(stderr, "test_emu: %s: %s\n", name, err.msg);
    fail();
  }
}

static void *xmalloc(size_t n) {
  void *p = malloc(n);
  assert_non_null(p);
  return p;
}

/* ------------------------------------------------------------------ scalar models */

/* The exact value of finite bf16 bits as a double: sign, 8-bit exponent (bias 127), 7-bit
 * mantissa; exponent 0 is subnormal (m * 2^-133). Exponent 255 is treated as the next binade
 * (2^128) so that it can serve as the rounding neighbour of the largest finite value. */
static double model_bf16_value(uint32_t bits) {
  const int s = (bits >> 15) & 1, e = (bits >> 7) & 0xff, m = bits & 0x7f;
  const double mag = e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
  return s ? -mag : mag;
}

/* IEEE half: 5-bit exponent (bias 15), 10-bit mantissa. */
static double model_f16_value(uint32_t bits) {
  const int s = (bits >> 15) & 1, e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
  double mag;
  if (e == 0)
    mag = ldexp(m, -24);
  else if (e == 31)
    mag = m == 0 ? INFINITY : NAN;
  else
    mag = ldexp(1024 + m, e - 25);
  return s ? -mag : mag;
}

/* f32 -> 16-bit by round to nearest, ties to even, written as a search: the two neighbours
 * of x on the 16-bit grid (magnitude bits lo and lo + 1), whichever is nearer, the even one on a
 * tie. value() gives the exact value of a magnitude code; max_code is the infinity code. NaN in
 * gives any NaN (checked separately). */
static uint16_t model_round16(float x, double (*value)(uint32_t), uint32_t inf_code) {
  const uint32_t sign = signbit(x) ? 0x8000u : 0;
  const double a = fabs((double)x);
  if (isinf(x)) return (uint16_t)(sign | inf_code);
  uint32_t lo = 0, hi = inf_code; /* largest code with value <= a, by bisection */
  while (lo + 1 < hi) {
    const uint32_t mid = (lo + hi) / 2;
    if (value(mid) <= a)
      lo = mid;
    else
      hi = mid;
  }
  if (value(lo) == a) return (uint16_t)(sign | lo);
  const double below = a - value(lo), above = value(lo + 1) - a;
  uint32_t pick;
  if (below < above)
    pick = lo;
  else if (above < below)
    pick = lo + 1;
  else
    pick = (lo & 1) ? lo + 1 : lo;
  return (uint16_t)(sign | pick);
}

static double model_f16_value_ext(uint32_t bits) {
  /* As model_f16_value, but the infinity code is the next binade (2^16) for rounding. */
  if ((bits & 0x7fffu) == 0x7c00u) return ldexp(1.0, 16);
  return model_f16_value(bits);
}

static uint16_t model_bf16(float x) {
  return model_round16(x, model_bf16_value, 0x7f80u);
}
static uint16_t model_f16(float x) {
  return model_round16(x, model_f16_value_ext, 0x7c00u);
}

static int bits_is_nan_bf16(uint32_t b) {
  return ((b >> 7) & 0xff) == 0xff && (b & 0x7f) != 0;
}
static int bits_is_nan_f16(uint32_t b) {
  return ((b >> 10) & 0x1f) == 0x1f && (b & 0x3ff) != 0;
}

/* ------------------------------------------------------------------ mma m16n8k16 */

/* The PTX ISA fragment layout of mma.m16n8k16 for .bf16/.f16 A (16x16, row), B (16x8, col) and
 * f32 C/D (16x8), per element: groupID = lane >> 2, threadID_in_group = lane % 4.
 *   A: a_i, i = 0..7 (register i/2, half i%2): row = groupID for i in {0,1,4,5}, else
 *      groupID + 8; col = 2 * tig + (i & 1), + 8 for i >= 4.
 *   B: b_i, i = 0..3: row = 2 * tig + (i & 1), + 8 for i >= 2; col = groupID.
 *   C/D: c_i, i = 0..3: row = groupID for i < 2, else groupID + 8; col = 2 * tig + (i & 1). */
static void mma_b_pos(int lane, int i, int *row, int *col) {
  const int g = lane >> 2, tig = lane % 4;
  *row = 2 * tig + (i & 1) + (i >= 2 ? 8 : 0);
  *col = g;
}
static void mma_c_pos(int lane, int i, int *row, int *col) {
  const int g = lane >> 2, tig = lane % 4;
  *row = i < 2 ? g : g + 8;
  *col = 2 * tig + (i & 1);
}

static void check_mma(int f16) {
  rt_rng *rng = rt_global_rng();
  for (int trial = 0; trial < 4; ++trial) {
    uint16_t A[16][16], B[16][8];
    double Av[16][16], Bv[16][8];
    float C[16][8];
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) {
        const float x = (float)rt_rng_normal(rng);
        A[r][c] = f16 ? model_f16(x) : model_bf16(x);
        Av[r][c] = f16 ? model_f16_value(A[r][c]) : model_bf16_value(A[r][c]);
      }
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 8; ++c) {
        const float x = (float)rt_rng_normal(rng);
        B[r][c] = f16 ? model_f16(x) : model_bf16(x);
        Bv[r][c] = f16 ? model_f16_value(B[r][c]) : model_bf16_value(B[r][c]);
        C[r][c] = (float)rt_rng_normal(rng);
      }
    uint32_t a[32][4], b[32][2];
    float cf[32][4], d[32][4];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < 8; ++i) {
        int row, col;
        rt_mma_a_pos(lane, i, &row, &col);
        rt_set_half(&a[lane][i / 2], i % 2, A[row][col]);
      }
      for (int i = 0; i < 4; ++i) {
        int row, col;
        mma_b_pos(lane, i, &row, &col);
        rt_set_half(&b[lane][i / 2], i % 2, B[row][col]);
        mma_c_pos(lane, i, &row, &col);
        cf[lane][i] = C[row][col];
      }
    }
    emu_test_params p = {.in0 = a, .in1 = b, .in2 = cf, .out0 = d, .op = f16};
    run_ok("emu_mma", g_src_intrinsics, 1, 32, 0, &p);
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        int row, col;
        mma_c_pos(lane, i, &row, &col);
        double ref = C[row][col], mag = fabs(C[row][col]);
        for (int k = 0; k < 16; ++k) {
          ref += Av[row][k] * Bv[k][col];
          mag += fabs(Av[row][k] * Bv[k][col]);
        }
        const double tol = 17 * FLT_EPSILON * mag;
        if (!(fabs(d[lane][i] - ref) <= tol)) {
          fprintf(stderr, "mma %s: D[%d][%d] (lane %d, d%d) = %.9g, expected %.9g (tol %.3g)\n",
                  f16 ? "f16" : "bf16", row, col, lane, i, d[lane][i], ref, tol);
          fail();
        }
      }
  }
}

static void test_emu_mma_bf16_matches_ptx_fragment_model(void **state) {
  (void)state;
  check_mma(0);
}

static void test_emu_mma_f16_matches_ptx_fragment_model(void **state) {
  (void)state;
  check_mma(1);
}

/* The emulation rate of an mma-heavy kernel (reported, not asserted), and its exact result. */
static void test_emu_mma_loop_rate_and_result(void **state) {
  (void)state;
  const int warps = 4;
  const long long iters = 2000;
  float *d = xmalloc(sizeof(float) * 4 * 32 * (size_t)warps);
  for (int op = 0; op < 2; ++op) {
    emu_test_params p = {.out0 = d, .n = iters, .op = op};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_ok("emu_mma_loop", g_src_intrinsics, 1, 32 * (unsigned)warps, 0, &p);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("emu: %lld warp-level mma.m16n8k16 (%s) in %.3f s on one OS thread: %.0f mma/s\n",
           iters * warps, op ? "f16" : "bf16", s, (double)(iters * warps) / s);
    for (int i = 0; i < 4 * 32 * warps; ++i) assert_true(d[i] == 16.0f * (float)iters);
  }
  free(d);
}

/* ------------------------------------------------------------------ wgmma (sm_90a) */

static float wg_value(int f16, uint16_t bits) {
  return (float)(f16 ? model_f16_value(bits) : model_bf16_value(bits));
}

/* What an accumulator in flight holds on the emulator: templates/emu/wgmma_emu.h's kPoison. */
#define WG_POISON 0x7f8badd0u

/* emu_wgmma.cu's register hazards (p.op = kind | thread << 4 | register << 16; its kOp*). */
enum {
  WG_OP_WRITE_A = 1,
  WG_OP_WRITE_D,
  WG_OP_WRITE_D_AFTER,
  WG_OP_SPLIT,
  WG_OP_SPLIT_WRITE_A0,
  WG_OP_SPLIT_WRITE_A1,
  WG_OP_SPLIT_WRITE_D,
  WG_OP_CP_ASYNC = 8, /* emu_wgmma.cu's kOpCp*: the image loaded by cp.async */
  WG_OP_CP_NO_FENCE,
  WG_OP_CP_EARLY_FENCE,
  WG_OP_CP_ONE_WRITER,
  WG_OP_CP_OTHER_FENCE,
  WG_OP_CP_ZERO_NO_FENCE
};

static int wg_op(int kind, int thread, int reg) {
  return kind | thread << 4 | reg << 16;
}

/* Runs one case on the emulator with p.op = op (0, or a hazard the emulator allows) and checks
 * every element of every thread's d against the fp32 k-order model (exactly) and a float64
 * reference (tolerance); also that d read while in flight is the emulator's poison. */
static void check_wgmma_op(rt_wg_case c, int op) {
  rt_rng *rng = rt_global_rng();
  const int reps = c.reps > 0 ? c.reps : 1;
  const int K = 16 * c.steps, N = c.n, T = 128 * c.warpgroups;
  rt_wg_place(&c);
  const int bytes = (rt_wg_extent(&c.b, N, K) + 15) / 16 * 16;
  uint16_t *img = xmalloc((size_t)bytes);
  for (int i = 0; i < bytes / 2; ++i) {
    const float x = (float)rt_rng_normal(rng);
    img[i] = c.f16 ? model_f16(x) : model_bf16(x);
  }
  /* A (64 x K) and B (K x N) as the kernel sees them. */
  float *A = xmalloc(sizeof(float) * 64 * (size_t)K), *B = xmalloc(sizeof(float) * (size_t)(K * N));
  uint16_t *Abits = xmalloc(sizeof(uint16_t) * 64 * (size_t)K);
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < K; ++k) {
      Abits[m * K + k] = c.rs ? (c.f16 ? model_f16((float)rt_rng_normal(rng))
                                       : model_bf16((float)rt_rng_normal(rng)))
                              : img[rt_wg_phys(&c.a, m, k) / 2];
      A[m * K + k] = c.clobber && !c.rs ? 0.0f : wg_value(c.f16, Abits[m * K + k]);
    }
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < N; ++n)
      B[k * N + n] = c.clobber ? 0.0f : wg_value(c.f16, img[rt_wg_phys(&c.b, n, k) / 2]);
  size_t cfg_bytes;
  int *cfg = rt_wg_config(&c, Abits, &cfg_bytes);
  assert_non_null(cfg);
  cfg[RT_WG_PEEK] = 1;
  const size_t dn = (size_t)T * (size_t)(N / 2);
  float *d0 = xmalloc(sizeof(float) * dn), *d = xmalloc(sizeof(float) * dn);
  float *peek = xmalloc(sizeof(float) * dn);
  for (size_t i = 0; i < dn; ++i) {
    d0[i] = c.acc ? (float)rt_rng_normal(rng) : NAN; /* scale-d 0 must ignore it */
    d[i] = peek[i] = -12345.0f;
  }
  emu_test_params p = {
      .in0 = img, .in1 = cfg, .in2 = d0, .out0 = d, .out1 = peek, .n = bytes, .op = op};
  const int kind = op & 15, who = (op >> 4) & 4095, reg = op >> 16;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  run_ok("emu_wgmma", g_src_wgmma, 1, (unsigned)T, (unsigned)bytes + 1024, &p);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (reps > 1) {
    const double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    const double n_mma = (double)reps * c.steps * c.warpgroups;
    printf(
        "emu: %.0f wgmma m64n%dk16 (%s, %s) in %.3f s on one OS thread: %.0f wgmma/s, "
        "%.0f mma.m16n8k16-equivalents/s\n",
        n_mma, N, c.what, c.f16 ? "f16" : "bf16", sec, n_mma / sec, n_mma * (N / 2) / sec);
  }
  int bad = 0;
  for (int t = 0; t < T && bad < 8; ++t)
    for (int e = 0; e < N / 2 && bad < 8; ++e) {
      const int w = (t / 32) % 4, g = (t % 32) / 4, q = t % 4;
      const int row = 16 * w + g + 8 * ((e % 4) >> 1), col = 8 * (e / 4) + 2 * q + (e & 1);
      const size_t at = (size_t)t * (size_t)(N / 2) + (size_t)e;
      float acc = c.acc ? d0[at] : 0.0f;
      double ref = c.acc ? d0[at] : 0.0, mag = fabs(ref);
      for (int r = 0; r < reps; ++r)
        for (int k = 0; k < K; ++k) {
          acc += A[row * K + k] * B[k * N + col];
          ref += (double)A[row * K + k] * B[k * N + col];
          mag += fabs((double)A[row * K + k] * B[k * N + col]);
        }
      if (kind == WG_OP_WRITE_D_AFTER && t == who && e == reg) acc = 2.5f, ref = 2.5, mag = 0;
      uint32_t seen;
      memcpy(&seen, &peek[at], sizeof seen);
      const int early = seen != WG_POISON;
      if (d[at] != acc || !(fabs(d[at] - ref) <= 4 * reps * K * FLT_EPSILON * mag) || early) {
        fprintf(stderr,
                "wgmma %s (%s, N=%d, op %#x): thread %d d[%d] = D[%d][%d] = %.9g, expected "
                "%.9g (float64 %.9g)",
                c.what, c.f16 ? "f16" : "bf16", N, (unsigned)op, t, e, row, col, d[at], acc, ref);
        if (early)
          fprintf(stderr, "; while in flight it read %#010x, not the poison %#010x", seen,
                  WG_POISON);
        fputc('\n', stderr);
        ++bad;
      }
    }
  free(img);
  free(A);
  free(B);
  free(Abits);
  free(cfg);
  free(d0);
  free(d);
  free(peek);
  if (bad) fail();
}

static void check_wgmma(rt_wg_case c) {
  check_wgmma_op(c, 0);
}

static void run_wgmma_layouts(int f16, int n) {
  rt_wg_case cases[RT_WG_NCASES];
  const int nc = rt_wg_layout_cases(f16, n, cases);
  for (int i = 0; i < nc; ++i) check_wgmma(cases[i]);
}

static void test_emu_wgmma_bf16_n64_matches_ptx_layouts(void **state) {
  (void)state;
  run_wgmma_layouts(0, 64);
}
static void test_emu_wgmma_bf16_n128_matches_ptx_layouts(void **state) {
  (void)state;
  run_wgmma_layouts(0, 128);
}
static void test_emu_wgmma_f16_n64_matches_ptx_layouts(void **state) {
  (void)state;
  run_wgmma_layouts(1, 64);
}
static void test_emu_wgmma_f16_n128_matches_ptx_layouts(void **state) {
  (void)state;
  run_wgmma_layouts(1, 128);
}

/* The operands are read at the wait: tiles zeroed between commit and wait give D = old D (SS)
 * or old D + A * 0 (RS); d read before the wait is the poison (checked in every case). */
static void test_emu_wgmma_runs_at_the_wait(void **state) {
  (void)state;
  check_wgmma((rt_wg_case){"ss clobbered before wait", 0, 64, 0, 1, 2, 1, rt_wg_k_sw(1, 64, 1),
                           rt_wg_k_sw(1, 64, 1), 1, 0});
  check_wgmma((rt_wg_case){"rs clobbered before wait", 1, 128, 1, 1, 2, 1, rt_wg_k_sw(1, 64, 1),
                           rt_wg_mn_sw(1, 32), 1, 0});
}

/* The emulation rate of wgmma (reported, not asserted; one m64n128k16 is the work of 64
 * warp-level mma.m16n8k16, compare with test_emu_mma_loop_rate_and_result), result checked. */
static void test_emu_wgmma_rate_and_result(void **state) {
  (void)state;
  check_wgmma((rt_wg_case){"ss rate", 0, 128, 0, 1, 4, 1, rt_wg_k_sw(1, 64, 1),
                           rt_wg_k_sw(1, 128, 1), 0, 100});
  check_wgmma((rt_wg_case){"rs rate", 1, 128, 1, 1, 4, 1, rt_wg_k_sw(1, 64, 1), rt_wg_mn_sw(1, 64),
                           0, 100});
}

/* The PTX ISA (wgmma.wait_group): the A and accumulator registers of an mma_async are not to
 * be accessed until a wait covers it. emu_wgmma.cu's p.op makes one random thread write one
 * random register of c (A: a[reg % 4]; d: d[reg / 4][reg % 4]) while an mma on it is in
 * flight; the launch must fail with a message naming the thread, the register and the mma
 * (instruction #instr of the thread). */
static void wgmma_expect_hazard_trap(rt_wg_case c, int kind, int instr) {
  rt_rng *rng = rt_global_rng();
  rt_wg_place(&c);
  const int K = 16 * c.steps, N = c.n, T = 128 * c.warpgroups;
  const int bytes = (rt_wg_extent(&c.b, N, K) + 15) / 16 * 16;
  uint16_t *img = xmalloc((size_t)bytes), *Abits = xmalloc(sizeof(uint16_t) * 64 * (size_t)K);
  for (int i = 0; i < bytes / 2; ++i) img[i] = model_bf16((float)rt_rng_normal(rng));
  for (int i = 0; i < 64 * K; ++i) Abits[i] = model_bf16((float)rt_rng_normal(rng));
  size_t cfg_bytes;
  int *cfg = rt_wg_config(&c, Abits, &cfg_bytes);
  assert_non_null(cfg);
  const size_t dn = (size_t)T * (size_t)(N / 2);
  float *d0 = xmalloc(sizeof(float) * dn), *d = xmalloc(sizeof(float) * dn);
  for (size_t i = 0; i < dn; ++i) d0[i] = (float)rt_rng_normal(rng);
  const int who = (int)rt_rng_range(rng, 0, T - 1), reg = (int)rt_rng_range(rng, 0, N / 2 - 1);
  emu_test_params p = {.in0 = img,
                       .in1 = cfg,
                       .in2 = d0,
                       .out0 = d,
                       .out1 = d,
                       .n = bytes,
                       .op = wg_op(kind, who, reg)};
  rda_err err = {0};
  const rda_status st =
      run3("emu_wgmma", g_src_wgmma, 1, 1, 1, (unsigned)T, 1, 1, (unsigned)bytes + 1024, &p, &err);
  char thread[64], reg_text[64], instr_text[64];
  snprintf(thread, sizeof thread, "thread (%d,0,0): wgmma: ", who);
  const int on_a = kind == WG_OP_WRITE_A || kind == WG_OP_SPLIT_WRITE_A1;
  if (on_a)
    snprintf(reg_text, sizeof reg_text, "A register a[%d] of an mma_async", reg % 4);
  else
    snprintf(reg_text, sizeof reg_text, "accumulator d[%d][%d] (n%d)", reg / 4, reg % 4, N);
  snprintf(instr_text, sizeof instr_text, "in flight (instruction #%d", instr);
  if (st == RDA_OK || strstr(err.msg, thread) == NULL || strstr(err.msg, reg_text) == NULL ||
      strstr(err.msg, instr_text) == NULL || strstr(err.msg, "before the wait") == NULL) {
    fprintf(stderr,
            "%s, hazard %d by thread %d on register %d: got status %d \"%s\", want \"%s\", "
            "\"%s\" and \"%s\"\n",
            c.what, kind, who, reg, (int)st, st == RDA_OK ? "" : err.msg, thread, reg_text,
            instr_text);
    fail();
  }
  free(img);
  free(Abits);
  free(cfg);
  free(d0);
  free(d);
}

static void test_emu_wgmma_registers_written_in_flight_trap(void **state) {
  (void)state;
  const rt_wg_case rs = {.what = "rs",
                         .rs = 1,
                         .n = 64,
                         .acc = 1,
                         .steps = 2,
                         .warpgroups = 2,
                         .a = rt_wg_k_sw(1, 64, 1),
                         .b = rt_wg_mn_sw(1, 32)};
  const rt_wg_case rs128 = {.what = "rs n128",
                            .rs = 1,
                            .n = 128,
                            .acc = 1,
                            .steps = 3,
                            .warpgroups = 1,
                            .a = rt_wg_k_sw(1, 64, 1),
                            .b = rt_wg_mn_sw(1, 48)};
  const rt_wg_case ss = {.what = "ss",
                         .n = 128,
                         .acc = 1,
                         .steps = 2,
                         .warpgroups = 2,
                         .a = rt_wg_k_sw(1, 64, 1),
                         .b = rt_wg_k_sw(1, 128, 1)};
  /* instruction #1 is step 0's mma (after the fence), #3 step 1's (after a commit) */
  for (int rep = 0; rep < 2; ++rep) {
    wgmma_expect_hazard_trap(rs, WG_OP_WRITE_A, 1);
    wgmma_expect_hazard_trap(rs128, WG_OP_SPLIT_WRITE_A1, 3);
    wgmma_expect_hazard_trap(rs, WG_OP_WRITE_D, 1);
    wgmma_expect_hazard_trap(ss, WG_OP_WRITE_D, 1);
    wgmma_expect_hazard_trap(ss, WG_OP_SPLIT_WRITE_D, 3);
    wgmma_expect_hazard_trap(rs128, WG_OP_SPLIT_WRITE_D, 3);
  }
}

/* The same registers written once their group has completed are no hazard: no trap, and the
 * results are the model's (with the write after the last wait in d). Two groups in flight on
 * one accumulator (wait<1> between) exercise the poison handed from the first to the second. */
static void test_emu_wgmma_registers_written_after_wait_pass(void **state) {
  (void)state;
  rt_rng *rng = rt_global_rng();
  const rt_wg_case rs = {.what = "rs f16",
                         .rs = 1,
                         .n = 64,
                         .f16 = 1,
                         .acc = 1,
                         .steps = 3,
                         .warpgroups = 2,
                         .a = rt_wg_k_sw(1, 64, 1),
                         .b = rt_wg_mn_sw(1, 48)};
  const rt_wg_case ss = {.what = "ss",
                         .n = 128,
                         .steps = 2,
                         .warpgroups = 1,
                         .a = rt_wg_k_sw(1, 64, 1),
                         .b = rt_wg_k_sw(1, 128, 1)};
  for (int rep = 0; rep < 2; ++rep) {
    const int who = (int)rt_rng_range(rng, 0, 127);
    check_wgmma_op(rs, wg_op(WG_OP_WRITE_D_AFTER, who, (int)rt_rng_range(rng, 0, 31)));
    check_wgmma_op(ss, wg_op(WG_OP_WRITE_D_AFTER, who, (int)rt_rng_range(rng, 0, 63)));
    check_wgmma_op(rs, wg_op(WG_OP_SPLIT, who, 0));
    check_wgmma_op(ss, wg_op(WG_OP_SPLIT, who, 0));
    check_wgmma_op(rs, wg_op(WG_OP_SPLIT_WRITE_A0, who, (int)rt_rng_range(rng, 0, 3)));
  }
}

/* A missing wgmma_fence and a missing wgmma_wait are launch errors naming the thread. */
static void test_emu_wgmma_missing_fence_or_wait_traps(void **state) {
  (void)state;
  const rt_wg_layout a = rt_wg_k_sw(1, 64, 1), b = rt_wg_k_sw(1, 64, 1);
  static uint16_t img[8192];
  memset(img, 0x3c, sizeof img);
  for (int which = 0; which < 2; ++which) {
    int cfg[RT_WG_INTS] = {0};
    cfg[RT_WG_N] = 64;
    cfg[RT_WG_ACC] = 1;
    cfg[RT_WG_STEPS] = 1;
    cfg[RT_WG_ASBO] = a.sbo;
    cfg[RT_WG_ASWZ] = 1;
    cfg[RT_WG_BSBO] = b.sbo;
    cfg[RT_WG_BSWZ] = 1;
    cfg[RT_WG_BSTART] = 8192;
    cfg[which == 0 ? RT_WG_NOFENCE : RT_WG_NOWAIT] = 1;
    float d0[128 * 32] = {0}, d[128 * 32];
    emu_test_params p = {
        .in0 = img, .in1 = cfg, .in2 = d0, .out0 = d, .out1 = d, .n = (long long)sizeof img};
    rda_err err = {0};
    assert_int_not_equal(
        run3("emu_wgmma", g_src_wgmma, 1, 1, 1, 128, 1, 1, sizeof img + 1024, &p, &err), RDA_OK);
    const char *want = which == 0 ? "without wgmma_fence" : "mma_async pending";
    if (strstr(err.msg, want) == NULL || strstr(err.msg, "thread (") == NULL) {
      fprintf(stderr, "wgmma trap: got \"%s\", want \"%s\"\n", err.msg, want);
      fail();
    }
  }
}

/* Proxies (templates/emu/wgmma_emu.h): cp.async writes shared memory through the generic
 * proxy, wgmma reads it through the async proxy, so each writing thread must execute
 * fence.proxy.async after its cp.async wait and before the barrier. emu_wgmma.cu's kOpCp*
 * load the operand image by cp.async; the trap kinds must fail at the first mma (instruction
 * #1) with a message naming the chunk and the thread whose copy wrote it: `who` when one
 * thread copies everything, else the chunk's owner (chunk c is thread c % T's). */
static void wgmma_expect_proxy_trap(rt_wg_case c, int kind) {
  rt_rng *rng = rt_global_rng();
  rt_wg_place(&c);
  const int K = 16 * c.steps, N = c.n, T = 128 * c.warpgroups;
  const int bytes = (rt_wg_extent(&c.b, N, K) + 15) / 16 * 16;
  uint16_t *img = xmalloc((size_t)bytes), *Abits = xmalloc(sizeof(uint16_t) * 64 * (size_t)K);
  for (int i = 0; i < bytes / 2; ++i) img[i] = model_bf16((float)rt_rng_normal(rng));
  for (int i = 0; i < 64 * K; ++i) Abits[i] = model_bf16((float)rt_rng_normal(rng));
  size_t cfg_bytes;
  int *cfg = rt_wg_config(&c, Abits, &cfg_bytes);
  assert_non_null(cfg);
  const size_t dn = (size_t)T * (size_t)(N / 2);
  float *d0 = xmalloc(sizeof(float) * dn), *d = xmalloc(sizeof(float) * dn);
  for (size_t i = 0; i < dn; ++i) d0[i] = (float)rt_rng_normal(rng);
  const int who = (int)rt_rng_range(rng, 0, T - 1);
  const int other = (who + 1 + (int)rt_rng_range(rng, 0, T - 2)) % T; /* a thread but who */
  emu_test_params p = {.in0 = img,
                       .in1 = cfg,
                       .in2 = d0,
                       .out0 = d,
                       .out1 = d,
                       .n = bytes,
                       .op = wg_op(kind, who, other)};
  rda_err err = {0};
  const rda_status st =
      run3("emu_wgmma", g_src_wgmma, 1, 1, 1, (unsigned)T, 1, 1, (unsigned)bytes + 1024, &p, &err);
  /* The image starts at shared offset 0 on the emulator (its shared memory is 4096-aligned). */
  const char *at = st == RDA_OK ? NULL : strstr(err.msg, "at shared offset ");
  unsigned off = 0;
  const int parsed = at != NULL && sscanf(at, "at shared offset %u", &off) == 1;
  const int writer = kind == WG_OP_CP_OTHER_FENCE ? who : (int)(off / 16) % T;
  char want[96];
  snprintf(want, sizeof want, "written by cp.async of thread %d (warp %d lane %d) with no", writer,
           writer / 32, writer % 32);
  if (!parsed || off % 16 != 0 || (int)off >= bytes || strstr(err.msg, want) == NULL ||
      strstr(err.msg, "mma_async (instruction #1") == NULL ||
      strstr(err.msg, ": wgmma: ") == NULL || strstr(err.msg, "fence.proxy.async") == NULL) {
    fprintf(stderr, "%s, cp.async kind %d (who %d, other %d): got status %d \"%s\", want \"%s\"\n",
            c.what, kind, who, other, (int)st, st == RDA_OK ? "" : err.msg, want);
    fail();
  }
  free(img);
  free(Abits);
  free(cfg);
  free(d0);
  free(d);
}

static void test_emu_wgmma_cp_async_without_proxy_fence_traps(void **state) {
  (void)state;
  const rt_wg_case ss = {.what = "ss",
                         .n = 128,
                         .acc = 1,
                         .steps = 2,
                         .warpgroups = 2,
                         .a = rt_wg_k_sw(1, 64, 1),
                         .b = rt_wg_k_sw(1, 128, 1)};
  const rt_wg_case rs = {.what = "rs trans-b",
                         .rs = 1,
                         .n = 64,
                         .acc = 1,
                         .steps = 3,
                         .warpgroups = 1,
                         .a = rt_wg_k_sw(1, 64, 1),
                         .b = rt_wg_mn_sw(1, 48)};
  const rt_wg_case ss_t = {.what = "ss trans-b, no swizzle",
                           .n = 64,
                           .steps = 2,
                           .warpgroups = 1,
                           .a = {1, 0, 128, 4 * 128, 0, 0},  /* core matrices, K = 32 */
                           .b = {0, 0, 8 * 128, 128, 0, 0}}; /* MN-major, N = 64 */
  const rt_wg_case *cases[] = {&ss, &rs, &ss_t};
  for (int i = 0; i < 3; ++i) {
    wgmma_expect_proxy_trap(*cases[i], WG_OP_CP_NO_FENCE);
    wgmma_expect_proxy_trap(*cases[i], WG_OP_CP_EARLY_FENCE);
    wgmma_expect_proxy_trap(*cases[i], WG_OP_CP_OTHER_FENCE);
    wgmma_expect_proxy_trap(*cases[i], WG_OP_CP_ZERO_NO_FENCE);
  }
}

/* The same loads fenced by their writers: no trap, and the products are exact (cp.async lands
 * the image at the wait), whether every thread copies a share or one thread copies it all. */
static void test_emu_wgmma_cp_async_with_proxy_fence_passes(void **state) {
  (void)state;
  rt_rng *rng = rt_global_rng();
  const rt_wg_case ss = {.what = "ss cp.async",
                         .n = 128,
                         .acc = 1,
                         .steps = 2,
                         .warpgroups = 2,
                         .a = rt_wg_k_sw(1, 64, 1),
                         .b = rt_wg_k_sw(1, 128, 1)};
  const rt_wg_case rs = {.what = "rs cp.async",
                         .rs = 1,
                         .n = 64,
                         .f16 = 1,
                         .steps = 3,
                         .warpgroups = 1,
                         .a = rt_wg_k_sw(1, 64, 1),
                         .b = rt_wg_mn_sw(1, 48)};
  for (int rep = 0; rep < 2; ++rep) {
    check_wgmma_op(ss, wg_op(WG_OP_CP_ASYNC, 0, 0));
    check_wgmma_op(rs, wg_op(WG_OP_CP_ASYNC, 0, 0));
    check_wgmma_op(ss, wg_op(WG_OP_CP_ONE_WRITER, (int)rt_rng_range(rng, 0, 255), 0));
    check_wgmma_op(rs, wg_op(WG_OP_CP_ONE_WRITER, (int)rt_rng_range(rng, 0, 127), 0));
  }
}

/* wgmma's .sync.aligned rule: every warp of a warpgroup issues the same sequence. A kernel of
 * three steps (fence, one m64n64k16 from A and B of bf16 1.0, commit, wait; step s's B 2048
 * bytes further, so each step's descriptor differs), in which warp p.n deviates by p.op:
 * 0 none, 1 skips step 1, 2 runs the steps from the other instantiation of step (a second
 * call site, same descriptors), 3 issues a fourth step, 4 lanes 16..31 add a wgmma_fence.
 * out0: thread t's d (32 floats at 32 t), each 48 when all three steps ran. */
static char g_src_wgmma_div[] =
    "#include \"ptx.cuh\"\n"
    "struct emu_test_params {\n"
    "  const void *in0, *in1, *in2;\n"
    "  void *out0, *out1;\n"
    "  long long n;\n"
    "  int op;\n"
    "  int pad;\n"
    "};\n"
    "template <bool Alt>\n"
    "__device__ __noinline__ void step(float (&d)[8][4], uint32_t base, int s, float *note) {\n"
    "  const uint64_t adesc = rda::smem_desc(base, 128, 256, 0);\n"
    "  const uint64_t bdesc = rda::smem_desc(base + 2048u * (1u + s), 128, 256, 0);\n"
    "  rda::wgmma_fence();\n"
    "  rda::wgmma_ss<64, RDA_DTYPE_BF16, false>(d, adesc, bdesc, true);\n"
    "  rda::wgmma_commit();\n"
    "  rda::wgmma_wait<0>();\n"
    "  if (Alt) *note += 1.0f;\n"
    "}\n"
    "extern \"C\" __global__ void emu_wgmma_div(const emu_test_params p) {\n"
    "  unsigned char *smem = rda::dynamic_smem();\n"
    "  for (int i = threadIdx.x; i < 5 * 1024; i += blockDim.x)\n"
    "    reinterpret_cast<uint16_t *>(smem)[i] = 0x3f80;\n"
    "  rda::fence_proxy_async_smem();\n"
    "  rda::sync_threads();\n"
    "  const bool odd = static_cast<long long>(threadIdx.x / 32) == p.n;\n"
    "  const uint32_t base = rda::smem_addr(smem);\n"
    "  float d[8][4] = {};\n"
    "  float note = 0.0f;\n"
    "  for (int s = 0; s < 3; ++s) {\n"
    "    if (p.op == 1 && odd && s == 1) continue;\n"
    "    if (p.op == 2 && odd)\n"
    "      step<true>(d, base, s, &note);\n"
    "    else\n"
    "      step<false>(d, base, s, &note);\n"
    "  }\n"
    "  if (p.op == 3 && odd) step<false>(d, base, 3, &note);\n"
    "  if (p.op == 4 && odd && threadIdx.x % 32 >= 16) rda::wgmma_fence();\n"
    "  float *out = static_cast<float *>(p.out0) + 32 * threadIdx.x;\n"
    "  for (int i = 0; i < 8; ++i)\n"
    "    for (int e = 0; e < 4; ++e) out[4 * i + e] = d[i][e] + note;\n"
    "}\n"
    "RDA_EMU_EXPORT(emu_wgmma_div, emu_test_params)\n";

/* Runs the divergence kernel (blocks x threads); returns the launch status, err filled. */
static rda_status run_wgmma_div(int op, int odd_warp, unsigned blocks, unsigned threads, float *out,
                                rda_err *err) {
  emu_test_params p = {.out0 = out, .n = odd_warp, .op = op};
  memset(err, 0, sizeof *err);
  return run3("emu_wgmma_div", g_src_wgmma_div, blocks, 1, 1, threads, 1, 1, 5 * 2048, &p, err);
}

/* Whether the emulated kernels tell wgmma call sites apart: not when built with
 * RDA_EMU_CXXFLAGS holding -O0 (the ptx.cuh wrappers stay calls) or RDA_EMU_WGMMA_SITES=0 (the
 * documented way out of a false report); templates/emu/wgmma_emu.h. */
static int wgmma_sites_on(void) {
  const char *f = getenv("RDA_EMU_CXXFLAGS");
  return f == NULL || (strstr(f, "-O0") == NULL && strstr(f, "RDA_EMU_WGMMA_SITES=0") == NULL);
}

/* Runs op on one block and requires a failed launch whose message holds every want[i]; without
 * call sites, a want[i] ending in " at" (the site follows) is matched without that ending. */
static void expect_divergence(int op, int odd_warp, unsigned threads, const char *const *want) {
  static float out[256 * 32];
  rda_err err;
  const rda_status st = run_wgmma_div(op, odd_warp, 1, threads, out, &err);
  int ok = st != RDA_OK;
  for (int i = 0; want[i] != NULL && ok; ++i) {
    char w[256];
    snprintf(w, sizeof w, "%s", want[i]);
    const size_t n = strlen(w);
    if (!wgmma_sites_on() && n > 3 && strcmp(w + n - 3, " at") == 0) w[n - 3] = '\0';
    ok = strstr(err.msg, w) != NULL;
  }
  if (!ok) {
    fprintf(stderr, "wgmma divergence op %d (warp %d): got status %d \"%s\", want", op, odd_warp,
            (int)st, err.msg);
    for (int i = 0; want[i] != NULL; ++i) fprintf(stderr, " \"%s\"", want[i]);
    fputc('\n', stderr);
    fail();
  }
}

/* Convergent warpgroups pass (several blocks, two warpgroups, result exact); each way of
 * diverging traps with the warpgroup, the instruction and both warps; and a later convergent
 * launch on the same workers passes again (the per-block state starts fresh). */
static void test_emu_wgmma_divergent_warps_trap(void **state) {
  (void)state;
  static float out[256 * 32];
  rda_err err;
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < sizeof out / sizeof *out; ++i) out[i] = -1.0f;
    if (run_wgmma_div(0, -1, 3, 256, out, &err) != RDA_OK) {
      fprintf(stderr, "convergent wgmma kernel: %s\n", err.msg);
      fail();
    }
    for (size_t i = 0; i < sizeof out / sizeof *out; ++i)
      if (out[i] != 48.0f) {
        fprintf(stderr, "convergent wgmma kernel: out[%zu] = %g, want 48\n", i, out[i]);
        fail();
      }
    if (round == 1) break;
    /* warp 1 skips step 1: at #5 (step 2's mma) it issues step 3's B descriptor (B at 6144
     * bytes: 0x180) where the warp that came first (any: the scheduler's order) issued step
     * 2's (4096: 0x100) */
    const char *const skip[] = {
        "warps of warpgroup 0 diverge at instruction #5",
        "issued wgmma.mma_async n64 bf16 accumulate A desc 0x1000080000 B desc 0x1000080100 at",
        "warp 1 lane 0 wgmma.mma_async n64 bf16 accumulate A desc 0x1000080000 B desc "
        "0x1000080180 at",
        "thread (32,0,0)", NULL};
    expect_divergence(1, 1, 128, skip);
    /* the same in the second warpgroup */
    const char *const skip1[] = {"warps of warpgroup 1 diverge at instruction #5",
                                 "warp 6 lane 0 wgmma.mma_async", NULL};
    expect_divergence(1, 6, 256, skip1);
    /* the same op and descriptors from another call site: the first fence differs */
    const char *const site[] = {"warps of warpgroup 0 diverge at instruction #0",
                                "issued wgmma.fence at 0x", "warp 2 lane 0 wgmma.fence at 0x",
                                NULL};
    if (wgmma_sites_on()) expect_divergence(2, 2, 128, site);
    /* a fourth step in warp 3: 12 against 16 instructions, found at block end */
    const char *const extra[] = {"warps of warpgroup 0 diverge:", "issued 12 wgmma instructions",
                                 "warp 3 lane 0 issued 16", "#12 is wgmma.fence", NULL};
    expect_divergence(3, 3, 128, extra);
    /* lanes 16..31 of warp 1 add a fence: lanes of one warp diverging are caught too */
    const char *const lanes[] = {"warps of warpgroup 0 diverge:", "warp 1 lane 16 issued 13", NULL};
    expect_divergence(4, 1, 128, lanes);
  }
}

/* ------------------------------------------------------------------ ldmatrix */

static void test_emu_ldmatrix_x4_and_trans_match_ptx_fragment_model(void **state) {
  (void)state;
  rt_rng *rng = rt_global_rng();
  enum { kRows = 128 }; /* 16-byte rows of the shared area */
  uint16_t area[kRows * 8];
  for (int i = 0; i < kRows * 8; ++i) area[i] = (uint16_t)rt_rng_next(rng);
  /* 32 distinct rows in random order: lane L gives the address of row L % 8 of matrix L / 8. */
  int rows[kRows];
  for (int i = 0; i < kRows; ++i) rows[i] = i;
  for (int i = kRows - 1; i > 0; --i) {
    const int j = (int)rt_rng_range(rng, 0, i);
    const int t = rows[i];
    rows[i] = rows[j];
    rows[j] = t;
  }
  int offs[32];
  for (int l = 0; l < 32; ++l) offs[l] = 16 * rows[l];
  uint32_t plain[32][4], trans[32][4];
  emu_test_params p = {
      .in0 = area, .in1 = offs, .out0 = plain, .out1 = trans, .n = (long long)sizeof area};
  run_ok("emu_ldmatrix", g_src_intrinsics, 1, 32, sizeof area, &p);
  /* Matrix j, as stored: M[r][c] = element c of the row whose address lane 8j + r gave. Each
   * thread receives row lane / 4, columns 2 (lane % 4) and +1 of the delivered matrix (M, or
   * its transpose with .trans), the lower column in the low half of register j. */
  for (int j = 0; j < 4; ++j) {
    uint16_t M[8][8];
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 8; ++c) M[r][c] = area[offs[8 * j + r] / 2 + c];
    for (int lane = 0; lane < 32; ++lane) {
      const int r = lane / 4, c = 2 * (lane % 4);
      const uint32_t want = (uint32_t)M[r][c] | ((uint32_t)M[r][c + 1] << 16);
      const uint32_t want_t = (uint32_t)M[c][r] | ((uint32_t)M[c + 1][r] << 16);
      if (plain[lane][j] != want || trans[lane][j] != want_t) {
        fprintf(stderr, "ldmatrix matrix %d lane %d: got %08x / trans %08x, want %08x / %08x\n", j,
                lane, plain[lane][j], trans[lane][j], want, want_t);
        fail();
      }
    }
  }
}

/* ------------------------------------------------------------------ shuffles */

static void test_emu_shfl_xor_every_lane_mask(void **state) {
  (void)state;
  float in[32], out[32 * 32];
  for (int l = 0; l < 32; ++l) in[l] = (float)rt_rng_normal(rt_global_rng());
  emu_test_params p = {.in0 = in, .out0 = out};
  run_ok("emu_shfl_xor", g_src_intrinsics, 1, 32, 0, &p);
  for (int m = 0; m < 32; ++m)
    for (int l = 0; l < 32; ++l) assert_true(out[m * 32 + l] == in[l ^ m] * (float)(m + 1));
}

/* ------------------------------------------------------------------ conversions */

/* Floats that stress round to nearest even: exact ties both ways, just off ties, subnormals,
 * the overflow boundary, signed zeros, infinities, and normal draws. */
static float *conversion_inputs(int f16, size_t *count) {
  const size_t n = 8192;
  float *x = xmalloc(n * sizeof *x);
  rt_rng *rng = rt_global_rng();
  size_t k = 0;
  const float fixed[] = {
      0.0f,           -0.0f,         1.0f,          -1.0f,          INFINITY,       -INFINITY,
      FLT_MIN,        -FLT_MIN,      FLT_MAX,       -FLT_MAX,       1e-45f,         65504.0f,
      65519.99f,      65520.0f,      65536.0f,      6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f,
      2.9802326e-08f, 8.940697e-08f, 3.3895314e38f, 3.3961775e38f};
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; ++i) x[k++] = fixed[i];
  while (k < n) {
    uint32_t u;
    float v = (float)rt_rng_normal(rng);
    const int kind = (int)(k % 6);
    memcpy(&u, &v, sizeof u);
    if (f16) {
      /* f16 keeps 10 of the 23 mantissa bits: the 13 dropped bits decide the rounding. */
      if (kind == 0) u = (u & ~0x1fffu) | 0x1000u;                           /* exact tie */
      if (kind == 1) u = (u & ~0x1fffu) | 0x1000u | (rt_rng_next(rng) & 1u); /* tie or just off */
      if (kind == 2) u = (u & ~0x1fffu) | 0x0fffu;                           /* just below a tie */
      memcpy(&v, &u, sizeof v);
      if (kind == 3) v *= 1e-5f; /* f16 subnormals */
      if (kind == 4) v *= 3e4f;  /* near overflow */
    } else {
      if (kind == 0) u = (u & ~0xffffu) | 0x8000u;
      if (kind == 1) u = (u & ~0xffffu) | 0x8000u | (rt_rng_next(rng) & 1u);
      if (kind == 2) u = (u & ~0xffffu) | 0x7fffu;
      if (kind == 3)
        u = (u & 0x807fffffu) | (uint32_t)rt_rng_range(rng, 0, 3) << 23; /* subnormal */
      if (kind == 4) u = (u & 0x807fffffu) | 0x7f000000u;                /* ~2^127 */
      memcpy(&v, &u, sizeof v);
    }
    x[k++] = v;
  }
  *count = n;
  return x;
}

static void check_pack(int f16) {
  size_t n = 0;
  float *x = conversion_inputs(f16, &n);
  x[n - 1] = NAN;
  x[n - 4] = -NAN;
  uint32_t *out = xmalloc(n / 2 * sizeof *out);
  emu_test_params p = {.in0 = x, .out0 = out, .n = (long long)(n / 2), .op = f16};
  run_ok("emu_scalar", g_src_intrinsics, 3, 256, 0, &p);
  for (size_t i = 0; i < n / 2; ++i) {
    for (int h = 0; h < 2; ++h) {
      const float in = x[2 * i + (size_t)h];
      const uint32_t got = h ? out[i] >> 16 : out[i] & 0xffffu;
      if (isnan(in)) {
        assert_true(f16 ? bits_is_nan_f16(got) : bits_is_nan_bf16(got));
        continue;
      }
      const uint32_t want = f16 ? model_f16(in) : model_bf16(in);
      if (got != want) {
        fprintf(stderr, "pack_%s: %.9g (%a) -> %04x, want %04x (%s half)\n",
                f16 ? "f16x2" : "bf16x2", (double)in, (double)in, got, want, h ? "high" : "low");
        fail();
      }
    }
  }
  free(out);
  free(x);
}

static void test_emu_pack_bf16x2_rounds_to_nearest_even(void **state) {
  (void)state;
  check_pack(0);
}

static void test_emu_pack_f16x2_rounds_to_nearest_even(void **state) {
  (void)state;
  check_pack(1);
}

/* Every one of the 65536 bit patterns. */
static void check_widen(int f16) {
  uint16_t *h = xmalloc(65536 * sizeof *h);
  float *out = xmalloc(65536 * sizeof *out);
  for (uint32_t i = 0; i < 65536; ++i) h[i] = (uint16_t)i;
  emu_test_params p = {.in0 = h, .out0 = out, .n = 65536, .op = f16 ? 2 : 3};
  run_ok("emu_scalar", g_src_intrinsics, 16, 256, 0, &p);
  for (uint32_t i = 0; i < 65536; ++i) {
    const int nan = f16 ? bits_is_nan_f16(i) : bits_is_nan_bf16(i);
    if (nan) {
      assert_true(isnan(out[i]));
      continue;
    }
    double want;
    if (f16)
      want = model_f16_value(i);
    else if (((i >> 7) & 0xff) == 0xff)
      want = (i & 0x8000u) ? -INFINITY : INFINITY;
    else
      want = model_bf16_value(i);
    if (!((double)out[i] == want && !signbit(out[i]) == !signbit(want))) {
      fprintf(stderr, "%s_to_float(%04x) = %a, want %a\n", f16 ? "f16" : "bf16", i, (double)out[i],
              want);
      fail();
    }
  }
  free(out);
  free(h);
}

static void test_emu_f16_to_float_every_bit_pattern(void **state) {
  (void)state;
  check_widen(1);
}

static void test_emu_bf16_to_float_every_bit_pattern(void **state) {
  (void)state;
  check_widen(0);
}

/* ex2.approx.ftz.f32: 2^x with at most 2 ulp of error; subnormal inputs count as zero and
 * results below 2^-126 flush to +0; ex2(-inf) = +0, ex2(+inf) = +inf, NaN stays NaN. */
static void test_emu_ex2_matches_ptx_approx_ftz(void **state) {
  (void)state;
  const size_t n = 4096;
  float *x = xmalloc(n * sizeof *x), *y = xmalloc(n * sizeof *y);
  rt_rng *rng = rt_global_rng();
  for (size_t i = 0; i < n; ++i) x[i] = (float)(260.0 * rt_rng_uniform(rng) - 130.0);
  const float special[] = {0.0f, -0.0f,   1e-40f,  -1e-40f, INFINITY, -INFINITY, NAN,
                           1.0f, -126.0f, -127.0f, -149.5f, 127.0f,   128.0f,    0.5f};
  for (size_t i = 0; i < sizeof special / sizeof *special; ++i) x[i] = special[i];
  emu_test_params p = {.in0 = x, .out0 = y, .n = (long long)n, .op = 4};
  run_ok("emu_scalar", g_src_intrinsics, 2, 256, 0, &p);
  for (size_t i = 0; i < n; ++i) {
    const double in = fabs(x[i]) < FLT_MIN ? 0.0 : x[i];
    const double exact = exp2(in);
    const float got = y[i];
    if (isnan(x[i])) {
      assert_true(isnan(got));
      continue;
    }
    if (exact < FLT_MIN) {
      if (!(got == 0.0f && !signbit(got))) {
        fprintf(stderr, "ex2(%a) = %a, want +0 (flushed)\n", (double)x[i], (double)got);
        fail();
      }
      continue;
    }
    if (isinf(exact) || exact > FLT_MAX) {
      assert_true(isinf(got) && got > 0);
      continue;
    }
    const double ulp = ldexp(1.0, ilogb(exact) - 23);
    if (!(fabs((double)got - exact) <= 2 * ulp)) {
      fprintf(stderr, "ex2(%a) = %a, want %a within 2 ulp\n", (double)x[i], (double)got, exact);
      fail();
    }
  }
  free(x);
  free(y);
}

/* ------------------------------------------------------------------ cp.async and barriers */

static void test_emu_cp_async_groups_complete_only_at_wait(void **state) {
  (void)state;
  enum { T = 128, kChunks = 3 * T };
  unsigned char *src = xmalloc(16 * kChunks);
  for (int i = 0; i < 16 * kChunks; ++i)
    src[i] = (unsigned char)(rt_rng_next(rt_global_rng()) % 255);
  unsigned char *out = xmalloc(16 * kChunks);
  int *seen = xmalloc(sizeof(int) * T * 12);
  memset(out, 0xab, 16 * kChunks);
  emu_test_params p = {.in0 = src, .out0 = out, .out1 = seen};
  run_ok("emu_cp_async", g_src_intrinsics, 1, T, 16 * kChunks, &p);
  /* After wait_group N with 3 groups committed, the oldest 3 - N are complete, the others not. */
  for (int t = 0; t < T; ++t)
    for (int point = 0; point < 4; ++point)
      for (int g = 0; g < 3; ++g) {
        const int complete = point > 0 && g < point;
        const int got = seen[12 * t + 3 * point + g];
        if (got != (complete ? 1 : 0)) {
          fprintf(stderr, "cp.async thread %d group %d after %s: saw %s\n", t, g,
                  point == 0   ? "no wait"
                  : point == 1 ? "wait_group 2"
                  : point == 2 ? "wait_group 1"
                               : "wait_group 0",
                  got == 1   ? "the data"
                  : got == 0 ? "poison"
                             : "something else");
          fail();
        }
      }
  for (int c = 0; c < kChunks; ++c)
    for (int i = 0; i < 16; ++i) {
      const unsigned char want = c % 7 == 3 ? 0 : src[16 * c + i]; /* valid = false: zero-fill */
      assert_int_equal(out[16 * c + i], want);
    }
  free(seen);
  free(out);
  free(src);
}

static void test_emu_block_barrier_orders_shared_memory(void **state) {
  (void)state;
  enum { T = 256, B = 3 };
  float *in = xmalloc(sizeof(float) * T * B), *sums = xmalloc(sizeof(float) * B);
  float *neigh = xmalloc(sizeof(float) * T * B);
  for (int i = 0; i < T * B; ++i) in[i] = (float)rt_rng_normal(rt_global_rng());
  emu_test_params p = {.in0 = in, .out0 = sums, .out1 = neigh};
  run_ok("emu_block_sum", g_src_intrinsics, B, T, sizeof(float) * T, &p);
  for (int b = 0; b < B; ++b) {
    float s[T];
    memcpy(s, in + b * T, sizeof s);
    for (int t = 0; t < T; ++t) assert_true(neigh[b * T + t] == s[(t + 37) % T]);
    for (int half = T / 2; half > 0; half /= 2)
      for (int t = 0; t < half; ++t) s[t] += s[t + half];
    assert_true(sums[b] == s[0]);
  }
  free(neigh);
  free(sums);
  free(in);
}

/* ------------------------------------------------------------------ execution model */

static void check_grid(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz) {
  const size_t nthreads = (size_t)gx * gy * gz * bx * by * bz;
  int *count = calloc(nthreads, sizeof *count);
  unsigned *ids = xmalloc(nthreads * 12 * sizeof *ids);
  assert_non_null(count);
  emu_test_params p = {.out0 = count, .out1 = ids};
  rda_err err = {0};
  if (run3("emu_grid_ids", g_src_model, gx, gy, gz, bx, by, bz, 0, &p, &err) != RDA_OK) {
    fprintf(stderr, "%s\n", err.msg);
    fail();
  }
  size_t id = 0;
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x)
        for (unsigned tz = 0; tz < bz; ++tz)
          for (unsigned ty = 0; ty < by; ++ty)
            for (unsigned tx = 0; tx < bx; ++tx, ++id) {
              assert_int_equal(count[id], 1);
              const unsigned want[12] = {tx, ty, tz, x, y, z, bx, by, bz, gx, gy, gz};
              assert_memory_equal(ids + 12 * id, want, sizeof want);
            }
  free(ids);
  free(count);
}

static void test_emu_every_block_and_thread_runs_once_3d(void **state) {
  (void)state;
  check_grid(3, 2, 2, 8, 4, 2); /* 64-thread blocks */
  check_grid(2, 3, 1, 5, 3, 3); /* 45 threads: a partial second warp */
  check_grid(7, 1, 1, 1, 1, 1);
}

/* An emulator backend opened with the environment variables env[i][0] set to env[i][1] (as
 * they were afterwards). */
static rda_status open_with_envs(int n, const char *const env[][2], rda_backend **b, rda_err *err) {
  char *saved[4] = {NULL};
  assert_true(n <= 4);
  for (int i = 0; i < n; ++i) {
    saved[i] = rt_env_save(env[i][0]);
    setenv(env[i][0], env[i][1], 1);
  }
  const rda_status st = rda_backend_emu_open(b, 90, err);
  for (int i = 0; i < n; ++i) rt_env_restore(env[i][0], saved[i]);
  return st;
}

static rda_status open_with_env(const char *name, const char *value, rda_backend **b,
                                rda_err *err) {
  const char *const env[1][2] = {{name, value}};
  return open_with_envs(1, env, b, err);
}

/* Blocks spread over more OS threads than there are cores (RDA_EMU_THREADS=4), each thread
 * with its own fibers: still every block and thread exactly once, and barriers still hold. */
static void test_emu_many_os_threads_run_every_block_once(void **state) {
  (void)state;
  rda_backend *b = NULL;
  rda_err err = {0};
  assert_int_equal(open_with_env("RDA_EMU_THREADS", "4", &b, &err), RDA_OK);

  rda_variant v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "emu_grid_ids");
  v.source = g_src_model;
  rda_module *ids = NULL, *sum = NULL;
  assert_int_equal(b->load(b, &v, &ids, &err), RDA_OK);
  snprintf(v.name, sizeof v.name, "emu_block_sum");
  v.source = g_src_intrinsics;
  assert_int_equal(b->load(b, &v, &sum, &err), RDA_OK);

  enum { B = 37, T = 64 };
  int *count = calloc(B * T, sizeof *count);
  unsigned *coords = xmalloc(sizeof(unsigned) * 12 * B * T);
  assert_non_null(count);
  emu_test_params p = {.out0 = count, .out1 = coords};
  const unsigned grid[3] = {B, 1, 1};
  assert_int_equal(b->launch(b, ids, grid, T, 0, &p, sizeof p, &err), RDA_OK);
  for (int i = 0; i < B * T; ++i) assert_int_equal(count[i], 1);

  float *in = xmalloc(sizeof(float) * B * T), *sums = xmalloc(sizeof(float) * B);
  float *neigh = xmalloc(sizeof(float) * B * T);
  for (int i = 0; i < B * T; ++i) in[i] = (float)rt_rng_normal(rt_global_rng());
  emu_test_params q = {.in0 = in, .out0 = sums, .out1 = neigh};
  assert_int_equal(b->launch(b, sum, grid, T, sizeof(float) * T, &q, sizeof q, &err), RDA_OK);
  for (int blk = 0; blk < B; ++blk) {
    float s[T];
    memcpy(s, in + blk * T, sizeof s);
    for (int half = T / 2; half > 0; half /= 2)
      for (int t = 0; t < half; ++t) s[t] += s[t + half];
    assert_true(sums[blk] == s[0]);
  }
  free(neigh);
  free(sums);
  free(in);
  free(coords);
  free(count);
  b->unload(b, ids);
  b->unload(b, sum);
  b->destroy(b);
}

static void test_emu_open_rejects_bad_thread_count(void **state) {
  (void)state;
  rda_backend *b = NULL;
  rda_err err = {0};
  assert_int_equal(open_with_env("RDA_EMU_THREADS", "lots", &b, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_null(b);
  assert_non_null(strstr(err.msg, "RDA_EMU_THREADS='lots'"));
}

/* A compiler or flags too long for the backend's buffers, or more flags than its compiler
 * command holds, are refused, never cut short (the kernels would build with other options
 * than asked). */
static void test_emu_open_rejects_overlong_compiler_settings(void **state) {
  (void)state;
  char lots[5000];
  memset(lots, 'O', sizeof lots - 1);
  lots[sizeof lots - 1] = '\0';
  const char *const vars[2] = {"RDA_EMU_CXXFLAGS", "RDA_EMU_CXX"};
  for (int i = 0; i < 2; ++i) {
    rda_backend *b = NULL;
    rda_err err = {0};
    assert_int_equal(open_with_env(vars[i], lots, &b, &err), RDA_ERR_INVALID_ARGUMENT);
    assert_null(b);
    char want[64];
    snprintf(want, sizeof want, "%s: longer than", vars[i]);
    if (strstr(err.msg, want) == NULL) fail_msg("%s: %s", vars[i], err.msg);
  }
  char many[4 * 100 + 1] = ""; /* 100 short flags: short enough, but more than argv holds */
  for (int i = 0; i < 100; ++i) strcat(many, "-O2 ");
  rda_backend *b = NULL;
  rda_err err = {0};
  assert_int_equal(open_with_env("RDA_EMU_CXXFLAGS", many, &b, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_null(b);
  if (strstr(err.msg, "RDA_EMU_CXXFLAGS: more than") == NULL) fail_msg("%s", err.msg);
}

/* RDA_EMU_ORDER=reverse runs a block's threads last to first: a read of shared memory that no
 * barrier separates from the store it needs sees that store in index order and misses it (the
 * poison) in reverse; with the barrier both orders agree. Any other value is refused. */
static void test_emu_reverse_order_exposes_a_missing_barrier(void **state) {
  (void)state;
  enum { T = 96 }; /* three warps: the race crosses lanes and warps */
  rda_backend *order[2] = {NULL, NULL}, *bad = NULL;
  rda_err err = {0};
  for (int rev = 0; rev < 2; ++rev)
    assert_int_equal(open_with_env("RDA_EMU_ORDER", rev ? "reverse" : "forward", &order[rev], &err),
                     RDA_OK);
  assert_int_equal(open_with_env("RDA_EMU_ORDER", "backwards", &bad, &err),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_null(bad);
  assert_non_null(strstr(err.msg, "RDA_EMU_ORDER='backwards'"));
  rda_module *m[2] = {NULL, NULL};
  for (int rev = 0; rev < 2; ++rev)
    m[rev] = must_load(order[rev], "emu_neighbour_read", g_src_model);
  uint32_t out[T];
  for (int barrier = 0; barrier < 2; ++barrier)
    for (int rev = 0; rev < 2; ++rev) {
      memset(out, 0xa5, sizeof out);
      emu_test_params p = {.out0 = out, .op = barrier};
      const unsigned grid[3] = {1, 1, 1};
      if (order[rev]->launch(order[rev], m[rev], grid, T, 4 * T, &p, sizeof p, &err) != RDA_OK)
        fail_msg("emu_neighbour_read: %s", err.msg);
      for (int t = 1; t < T; ++t) {
        const uint32_t want = barrier || !rev ? (uint32_t)t : 0xffffffffu;
        if (out[t] != want)
          fail_msg("%s order, %s barrier: thread %d read 0x%x, expected 0x%x",
                   rev ? "reverse" : "index", barrier ? "with a" : "without a", t, out[t], want);
      }
    }
  for (int rev = 0; rev < 2; ++rev) {
    order[rev]->unload(order[rev], m[rev]);
    order[rev]->destroy(order[rev]);
  }
}

/* Blocks of one launch, which no GPU orders: with RDA_EMU_ORDER=reverse they are taken last to
 * first, so a block reading another block's store of the same launch misses it. One OS thread
 * (RDA_EMU_THREADS=1) makes each order exact. */
static void test_emu_reverse_order_runs_blocks_last_to_first(void **state) {
  (void)state;
  enum { NB = 40 };
  rda_backend *order[2] = {NULL, NULL};
  rda_err err = {0};
  for (int rev = 0; rev < 2; ++rev) {
    const char *const env[2][2] = {{"RDA_EMU_THREADS", "1"},
                                   {"RDA_EMU_ORDER", rev ? "reverse" : "forward"}};
    assert_int_equal(open_with_envs(2, env, &order[rev], &err), RDA_OK);
  }
  for (int rev = 0; rev < 2; ++rev) {
    rda_module *m = must_load(order[rev], "emu_block_chain", g_src_model);
    uint32_t stored[NB], seen[NB];
    memset(stored, 0xa5, sizeof stored);
    memset(seen, 0xa5, sizeof seen);
    emu_test_params p = {.out0 = stored, .out1 = seen};
    const unsigned grid[3] = {NB, 1, 1};
    if (order[rev]->launch(order[rev], m, grid, 1, 0, &p, sizeof p, &err) != RDA_OK)
      fail_msg("emu_block_chain: %s", err.msg);
    for (uint32_t b = 1; b < NB; ++b) {
      const uint32_t want = rev ? 0xa5a5a5a5u : b; /* block b - 1 stored b, or had not yet */
      if (stored[b] != b + 1 || seen[b] != want)
        fail_msg("%s order: block %u stored %u (want %u) and read 0x%x (want 0x%x)",
                 rev ? "reverse" : "index", b, stored[b], b + 1, seen[b], want);
    }
    order[rev]->unload(order[rev], m);
    order[rev]->destroy(order[rev]);
  }
}

/* ---- asynchronous streams (RDA_EMU_STREAMS=async, runtime/emu_streams.h) ---------------- */

/* An async backend and its emu_hold kernel: a launch of it holds its stream until *flag != 0. */
typedef struct async_env {
  rda_backend *b;
  rda_module *hold;
  int flag; /* read by the kernel as it spins, written with __atomic_store_n */
} async_env;

static void async_open(async_env *a) {
  memset(a, 0, sizeof *a);
  rda_err err = {0};
  if (open_with_env("RDA_EMU_STREAMS", "async", &a->b, &err) != RDA_OK)
    fail_msg("RDA_EMU_STREAMS=async: %s", err.msg);
  a->hold = must_load(a->b, "emu_hold", g_src_model);
}

/* async_open, and the emu_faults kernel loaded on it. */
static rda_module *async_open_faults(async_env *a) {
  async_open(a);
  return must_load(a->b, "emu_faults", g_src_model);
}

static void async_close(async_env *a) {
  a->b->unload(a->b, a->hold);
  a->b->destroy(a->b);
}

/* Queue emu_hold on the calling thread's current stream of a->b (released by a->flag = 1). */
static void async_hold(async_env *a) {
  __atomic_store_n(&a->flag, 0, __ATOMIC_SEQ_CST);
  emu_test_params p = {.in0 = &a->flag};
  const unsigned grid[3] = {1, 1, 1};
  rda_err err = {0};
  if (a->b->launch(a->b, a->hold, grid, 1, 0, &p, sizeof p, &err) != RDA_OK)
    fail_msg("emu_hold: %s", err.msg);
}

/* Streams run in an order of the device's choosing: two streams released together by one event
 * run their work either way round, so work on one that reads what the other writes needs an
 * event between them, and with it always sees the write. */
static void test_emu_async_streams_overtake_unless_an_event_orders_them(void **state) {
  (void)state;
  enum { kTrials = 48, kBytes = 4096 };
  async_env a;
  async_open(&a);
  rda_backend *b = a.b;
  rda_err err = {0};
  void *s[3], *gate = NULL, *written = NULL, *x = NULL, *y = NULL;
  for (int i = 0; i < 3; ++i) assert_int_equal(b->stream_create(b, &s[i], &err), RDA_OK);
  assert_int_equal(b->event_create(b, &gate, &err), RDA_OK);
  assert_int_equal(b->event_create(b, &written, &err), RDA_OK);
  assert_int_equal(b->alloc(b, kBytes, &x, &err), RDA_OK);
  assert_int_equal(b->alloc(b, kBytes, &y, &err), RDA_OK);
  unsigned char host[kBytes];
  for (int ordered = 0; ordered < 2; ++ordered) {
    int saw_old = 0, saw_new = 0;
    for (int trial = 0; trial < kTrials; ++trial) {
      memset(host, 0, sizeof host);
      assert_int_equal(b->upload(b, x, host, kBytes, &err), RDA_OK);
      /* s0 holds until released, then records the gate; s1 and s2 wait for it. */
      b->set_stream(b, s[0]);
      async_hold(&a);
      assert_int_equal(b->event_record(b, gate, &err), RDA_OK);
      b->set_stream(b, s[1]);
      assert_int_equal(b->stream_wait_event(b, gate, &err), RDA_OK);
      assert_int_equal(b->memset_async(b, x, 7, kBytes, &err), RDA_OK);
      assert_int_equal(b->event_record(b, written, &err), RDA_OK);
      b->set_stream(b, s[2]);
      assert_int_equal(b->stream_wait_event(b, gate, &err), RDA_OK);
      if (ordered) assert_int_equal(b->stream_wait_event(b, written, &err), RDA_OK);
      assert_int_equal(b->copy_async(b, y, x, kBytes, &err), RDA_OK);
      /* Queued behind the hold: nothing has run, and the gate's record has not. */
      int done = 1;
      assert_int_equal(b->event_query(b, gate, &done, &err), RDA_OK);
      assert_int_equal(done, 0);
      __atomic_store_n(&a.flag, 1, __ATOMIC_SEQ_CST);
      b->set_stream(b, NULL);
      /* s2's work is its own: the default stream's synchronize does not wait for it. */
      for (int i = 0; i < 3; ++i) {
        void *e = NULL;
        assert_int_equal(b->event_create(b, &e, &err), RDA_OK);
        b->set_stream(b, s[i]);
        assert_int_equal(b->event_record(b, e, &err), RDA_OK);
        b->set_stream(b, NULL);
        for (done = 0; !done;) assert_int_equal(b->event_query(b, e, &done, &err), RDA_OK);
        b->event_destroy(b, e);
      }
      assert_int_equal(b->download(b, host, y, kBytes, &err), RDA_OK);
      const int all7 = host[0] == 7 && memcmp(host, host + 1, kBytes - 1) == 0;
      const int all0 = host[0] == 0 && memcmp(host, host + 1, kBytes - 1) == 0;
      if (!all7 && !all0) fail_msg("trial %d: the copy saw part of the memset", trial);
      saw_new += all7, saw_old += all0;
    }
    print_message("%s: the copy saw the memset in %d of %d trials\n",
                  ordered ? "with the event" : "without it", saw_new, kTrials);
    if (ordered && saw_old > 0) fail_msg("the event did not order the copy after the memset");
    if (!ordered && (saw_old == 0 || saw_new == 0))
      fail_msg("without an event, the streams ran in one order only (%d new, %d old)", saw_new,
               saw_old);
  }
  b->free(b, x), b->free(b, y);
  b->event_destroy(b, gate), b->event_destroy(b, written);
  for (int i = 0; i < 3; ++i) b->stream_destroy(b, s[i]);
  async_close(&a);
}

/* Events: a wait names the last record queued before it (a record queued later does not hold
 * it); query and elapsed time see a record only once it ran; an event destroyed with work
 * still naming it lives until that work ran; a stream destroyed with work queued returns at
 * once, as cuStreamDestroy does, and its work still runs; synchronize waits for the calling
 * thread's own stream. Any other RDA_EMU_STREAMS is refused. */
typedef struct release_later {
  int *flag;
  int ms;
} release_later;

static void *release_after(void *arg) {
  const release_later *r = arg;
  nanosleep(&(struct timespec){0, r->ms * 1000000L}, NULL);
  __atomic_store_n(r->flag, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

static void test_emu_async_events_and_stream_lifetimes(void **state) {
  (void)state;
  async_env a;
  async_open(&a);
  rda_backend *b = a.b, *bad = NULL;
  rda_err err = {0};
  assert_int_equal(open_with_env("RDA_EMU_STREAMS", "later", &bad, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_null(bad);
  assert_non_null(strstr(err.msg, "RDA_EMU_STREAMS='later'"));
  void *s = NULL, *t0 = NULL, *t1 = NULL, *ev = NULL, *last = NULL;
  assert_int_equal(b->stream_create(b, &s, &err), RDA_OK);
  assert_int_equal(b->event_create_timed(b, &t0, &err), RDA_OK);
  assert_int_equal(b->event_create_timed(b, &t1, &err), RDA_OK);
  assert_int_equal(b->event_create(b, &ev, &err), RDA_OK);
  assert_int_equal(b->event_create(b, &last, &err), RDA_OK);
  /* A wait for an event never recorded waits for nothing. set_stream returns the thread's
   * previous choice, to restore it with. */
  assert_null(b->set_stream(b, s));
  assert_int_equal(b->stream_wait_event(b, ev, &err), RDA_OK);
  assert_ptr_equal(b->set_stream(b, NULL), s);
  assert_null(b->set_stream(b, NULL));
  /* The default stream: t0, hold, t1. Until released, t1 is not done and has no time. */
  assert_int_equal(b->event_record(b, t0, &err), RDA_OK);
  async_hold(&a);
  assert_int_equal(b->event_record(b, t1, &err), RDA_OK);
  int done = 1;
  assert_int_equal(b->event_query(b, t1, &done, &err), RDA_OK);
  assert_int_equal(done, 0);
  float ms = -1.0f;
  rda_err_clear(&err);
  assert_int_equal(b->event_elapsed_ms(b, t0, t1, &ms, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "has not run yet"));
  /* s waits for t1's record queued so far; a record of t1 queued after the wait (on s itself,
   * behind it) is not what it waits for, or s would never run. */
  b->set_stream(b, s);
  assert_int_equal(b->stream_wait_event(b, t1, &err), RDA_OK);
  assert_int_equal(b->event_record(b, ev, &err), RDA_OK);
  assert_int_equal(b->event_record(b, last, &err), RDA_OK);
  b->set_stream(b, NULL);
  b->event_destroy(b, ev); /* still named by s's queued record: lives until it ran */
  /* stream_destroy(s) returns with s's work still held up behind the hold; that work runs
   * once the hold is released (from another thread after 50 ms). */
  b->stream_destroy(b, s);
  assert_int_equal(b->event_query(b, last, &done, &err), RDA_OK);
  assert_int_equal(done, 0);
  release_later r = {&a.flag, 50};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, release_after, &r), 0);
  const double t = rt_now_s();
  while (!done && rt_now_s() - t < 30.0)
    assert_int_equal(b->event_query(b, last, &done, &err), RDA_OK);
  assert_int_equal(pthread_join(th, NULL), 0);
  if (!done) fail_msg("the work of a destroyed stream never ran");
  b->event_destroy(b, last);
  assert_int_equal(b->synchronize(b, &err), RDA_OK);
  assert_int_equal(b->event_query(b, t1, &done, &err), RDA_OK);
  assert_int_equal(done, 1);
  assert_int_equal(b->event_elapsed_ms(b, t0, t1, &ms, &err), RDA_OK);
  if (ms < 30.0f) fail_msg("t0 to t1 took %.3f ms around a 50 ms hold", (double)ms);
  b->event_destroy(b, t0), b->event_destroy(b, t1);
  async_close(&a);
}

static void test_emu_shared_memory_poisoned_at_every_block_start(void **state) {
  (void)state;
  enum { T = 64, B = 8 };
  uint32_t *words = xmalloc(sizeof(uint32_t) * T * B), align[B];
  emu_test_params p = {.out0 = words, .out1 = align};
  run_ok("emu_smem_poison", g_src_model, B, T, 4 * T, &p);
  for (int i = 0; i < T * B; ++i) assert_int_equal(words[i], 0xffffffffu);
  for (int b = 0; b < B; ++b) assert_int_equal(align[b], 0);
  free(words);
}

/* Launch emu_faults with `op` (grid B blocks of T threads); expect a failure whose message
 * contains every string of `want` (NULL-terminated), then a clean run of the same module. */
static void check_fault(int op, long long n, const char *const *want) {
  enum { T = 64, B = 4 };
  int *out = xmalloc(sizeof(int) * T * B);
  _Alignas(16) unsigned char src[64] = {0};
  emu_test_params p = {.in0 = src, .out0 = out, .n = n, .op = op};
  rda_err err = {0};
  const rda_status st = run3("emu_faults", g_src_model, B, 1, 1, T, 1, 1, 256, &p, &err);
  assert_int_equal(st, RDA_ERR_EMULATOR);
  for (const char *const *w = want; *w != NULL; ++w) {
    if (strstr(err.msg, *w) == NULL) {
      fprintf(stderr, "fault %d: message lacks '%s': %s\n", op, *w, err.msg);
      fail();
    }
  }
  memset(out, 0, sizeof(int) * T * B);
  p.op = 99;
  rda_err err2 = {0};
  assert_int_equal(run3("emu_faults", g_src_model, B, 1, 1, T, 1, 1, 256, &p, &err2), RDA_OK);
  for (int i = 0; i < T * B; ++i) assert_int_equal(out[i], 1);
  free(out);
}

static void test_emu_skipped_barrier_is_a_deadlock_error(void **state) {
  (void)state;
  const char *want[] = {"deadlock", "63 wait at __syncthreads", "1 exited", NULL};
  check_fault(0, 5, want);
}

static void test_emu_partial_warp_collective_is_a_deadlock_error(void **state) {
  (void)state;
  const char *want[] = {"deadlock", "16 at a warp collective", NULL};
  check_fault(1, 0, want);
}

static void test_emu_barrier_and_shuffle_mixed_is_a_deadlock_error(void **state) {
  (void)state;
  const char *want[] = {"deadlock", "48 wait at __syncthreads", "16 at a warp collective", NULL};
  check_fault(5, 0, want);
}

static void test_emu_lanes_at_different_collectives_trap(void **state) {
  (void)state;
  const char *want[] = {"warp collective mismatch", "lane 16 passes 8 bytes", NULL};
  check_fault(6, 0, want);
}

static void test_emu_trap_reports_block_thread_and_message(void **state) {
  (void)state;
  const char *want[] = {"emu_faults", "block (2,0,0) thread (3,0,0): custom trap message 42", NULL};
  check_fault(2, 0, want);
}

static void test_emu_cp_async_misaligned_traps(void **state) {
  (void)state;
  const char *want[] = {"thread (5,0,0)", "16-byte aligned", NULL};
  check_fault(3, 0, want);
}

static void test_emu_cp_async_outside_shared_memory_traps(void **state) {
  (void)state;
  const char *want[] = {"thread (6,0,0)", "outside dynamic shared memory", NULL};
  check_fault(4, 0, want);
}

static void test_emu_launch_rejects_wrong_params_size(void **state) {
  (void)state;
  rda_module *m = module("emu_faults", g_src_model);
  emu_test_params p = {.op = 99};
  const unsigned grid[3] = {1, 1, 1};
  rda_err err = {0};
  assert_int_equal(g_backend->launch(g_backend, m, grid, 32, 0, &p, sizeof p - 8, &err),
                   RDA_ERR_EMULATOR);
  assert_non_null(strstr(err.msg, "kernel parameters"));
  rda_err err2 = {0};
  assert_int_equal(g_backend->launch(g_backend, m, grid, 2048, 0, &p, sizeof p, &err2),
                   RDA_ERR_EMULATOR);
  assert_non_null(strstr(err2.msg, "at most 1024 threads"));
}

/* The shim's CUDA built-ins, per the CUDA programming guide: __shfl_sync reads lane
 * srcLane % width of the caller's width-group; down/up read lane +- delta and keep their own
 * value past the group's edge; xor reads lane ^ mask unless that lies in a later group. Many
 * blocks on several OS threads add to one float with atomicAdd. */
static void test_emu_cuda_builtins_follow_the_programming_guide(void **state) {
  (void)state;
  enum { B = 24 };
  int in[32], out[B][6][32];
  float total = 0.0f;
  for (int l = 0; l < 32; ++l) in[l] = (int)rt_rng_range(rt_global_rng(), -1000000, 1000000);
  emu_test_params p = {.in0 = in, .out0 = out, .out1 = &total};
  run_ok("emu_builtins", g_src_model, B, 32, 0, &p);
  assert_true(total == 32.0f * B);
  for (int b = 0; b < B; ++b)
    for (int l = 0; l < 32; ++l) {
      const int down = l + 3 < 32 ? l + 3 : l, up = l - 5 >= 0 ? l - 5 : l;
      const int x = l ^ 9, xor16 = (x / 16) > (l / 16) ? l : x;
      assert_int_equal(out[b][0][l], in[(7 * l) % 32]);
      assert_int_equal(out[b][1][l], in[down]);
      assert_int_equal(out[b][2][l], in[up]);
      assert_int_equal(out[b][3][l], in[xor16]);
      assert_int_equal(out[b][4][l], in[(l / 8) * 8 + 3]);
      assert_int_equal(out[b][5][l], (l < 11 ? l : 11) | ((l > 11 ? l : 11) << 16));
    }
}

/* ------------------------------------------------------------------ the backend */

static void test_emu_compile_error_is_reported_with_compiler_output(void **state) {
  (void)state;
  char src[] =
      "#include \"rda_device.cuh\"\n"
      "struct emu_test_params { int x; };\n"
      "extern \"C\" __global__ void emu_broken(const emu_test_params p) {\n"
      "  (void)p; int y = undefined_thing_in_emu_test;\n"
      "}\n"
      "RDA_EMU_EXPORT(emu_broken, emu_test_params)\n";
  rda_variant v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "emu_broken");
  v.source = src;
  rda_module *m = NULL;
  rda_err err = {0};
  assert_int_equal(g_backend->load(g_backend, &v, &m, &err), RDA_ERR_EMULATOR);
  assert_null(m);
  assert_non_null(strstr(err.msg, "emu_broken"));
  assert_non_null(strstr(err.msg, "undefined_thing_in_emu_test"));
  assert_non_null(strstr(err.msg, "emu_broken.cu:4:")); /* the line, under the kernel's name */
  assert_null(strstr(err.msg, ".tmp"));
  assert_null(strchr(err.msg, '\n'));
}

static void test_emu_load_of_missing_entry_fails(void **state) {
  (void)state;
  (void)module("emu_grid_ids", g_src_model); /* built */
  rda_variant v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "emu_no_such_entry");
  v.source = g_src_model;
  rda_module *m = NULL;
  rda_err err = {0};
  assert_int_equal(g_backend->load(g_backend, &v, &m, &err), RDA_ERR_EMULATOR);
  assert_null(m);
  assert_non_null(strstr(err.msg, "emu_no_such_entry__emu"));
}

/* The emulator's folder under cache root `root`. */
static void emu_cache_folder(const char *root, char *dir, size_t cap) {
  struct utsname un;
  assert_int_equal(uname(&un), 0);
  snprintf(dir, cap, "%s/emu-%s", root, un.machine);
}

/* One kernel cache entry (.rda + its .use access record) per distinct source, beside the
 * headers folder (the runtime was loaded by earlier tests); a second load compiles nothing; a
 * failed compile leaves nothing behind. Runs in a private cache folder. */
static void test_emu_cache_reuses_module_and_leaves_no_temp_files(void **state) {
  (void)state;
  char *root = rt_mkdtemp();
  assert_non_null(root);
  char *saved = rt_env_save("RDA_CACHE_DIR");
  setenv("RDA_CACHE_DIR", root, 1);
  char dir[2048];
  emu_cache_folder(root, dir, sizeof dir);

  char src[] =
      "#include \"rda_device.cuh\"\n"
      "struct emu_tiny_params { int *out; };\n"
      "extern \"C\" __global__ void emu_tiny(const emu_tiny_params p) { p.out[threadIdx.x] = 7; }\n"
      "RDA_EMU_EXPORT(emu_tiny, emu_tiny_params)\n";
  rda_variant v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "emu_tiny");
  v.source = src;
  rda_module *m1 = NULL, *m2 = NULL, *m3 = NULL;
  rda_err err = {0};
  assert_int_equal(g_backend->load(g_backend, &v, &m1, &err), RDA_OK);
  assert_int_equal(rt_count_entries(dir), 3);
  char *so = NULL;
  {
    /* The module's entry: the one file ending in .rda. */
    char cmd_dir[2100];
    snprintf(cmd_dir, sizeof cmd_dir, "%s", dir);
    DIR *d = opendir(cmd_dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
      const size_t n = strlen(e->d_name);
      if (n > 4 && strcmp(e->d_name + n - 4, ".rda") == 0) so = rt_path(dir, e->d_name);
    }
    closedir(d);
  }
  assert_non_null(so);
  struct stat st1, st2;
  assert_int_equal(stat(so, &st1), 0);
  assert_int_equal(g_backend->load(g_backend, &v, &m2, &err), RDA_OK);
  assert_int_equal(stat(so, &st2), 0);
  assert_true(st1.st_ino == st2.st_ino && st1.st_mtime == st2.st_mtime);
  assert_int_equal(rt_count_entries(dir), 3);

  int out[32];
  struct {
    int *out;
  } tp = {out};
  const unsigned grid[3] = {1, 1, 1};
  assert_int_equal(g_backend->launch(g_backend, m2, grid, 32, 0, &tp, sizeof tp, &err), RDA_OK);
  for (int i = 0; i < 32; ++i) assert_int_equal(out[i], 7);

  char broken[] = "#include \"rda_device.cuh\"\nint emu_tiny_broken = ;\n";
  v.source = broken;
  assert_int_equal(g_backend->load(g_backend, &v, &m3, &err), RDA_ERR_EMULATOR);
  assert_int_equal(rt_count_entries(dir), 3);

  g_backend->unload(g_backend, m1);
  g_backend->unload(g_backend, m2);
  rt_env_restore("RDA_CACHE_DIR", saved);
  free(so);
  rt_rmtree(root);
  free(root);
}

/* ------------------------------------------------------------------ sharing loaded modules */

/* Two small kernels with a static __shared__ tile (a thread_local of the module, per OS thread)
 * and an exact model each. Names of their own: no other test loads these sources. */
typedef struct emu_share_params {
  const unsigned *in;
  unsigned *out;
  unsigned salt;
  int pad;
} emu_share_params;

enum { kShareBlock = 64, kShareBlocks = 24, kShareN = kShareBlock * kShareBlocks };

static char g_src_share_a[] =
    "#include \"rda_device.cuh\"\n"
    "struct emu_share_params { const unsigned *in; unsigned *out; unsigned salt; int pad; };\n"
    "extern \"C\" __global__ void emu_share_a(const emu_share_params p) {\n"
    "  __shared__ unsigned tile[64];\n"
    "  const unsigned t = threadIdx.x, i = blockIdx.x * 64u + t;\n"
    "  tile[t] = p.in[i] * 2654435761u + p.salt;\n"
    "  __syncthreads();\n"
    "  p.out[i] = tile[63u - t] ^ (blockIdx.x * 7u);\n"
    "}\n"
    "RDA_EMU_EXPORT(emu_share_a, emu_share_params)\n";

static char g_src_share_b[] =
    "#include \"rda_device.cuh\"\n"
    "struct emu_share_params { const unsigned *in; unsigned *out; unsigned salt; int pad; };\n"
    "extern \"C\" __global__ void emu_share_b(const emu_share_params p) {\n"
    "  __shared__ unsigned tile[64];\n"
    "  const unsigned t = threadIdx.x, i = blockIdx.x * 64u + t;\n"
    "  tile[t] = (p.in[i] ^ p.salt) + 40503u * t;\n"
    "  __syncthreads();\n"
    "  p.out[i] = tile[(t + 1u) % 64u] + blockIdx.x;\n"
    "}\n"
    "RDA_EMU_EXPORT(emu_share_b, emu_share_params)\n";

static unsigned share_model(int which, const unsigned *in, unsigned salt, unsigned i) {
  const unsigned b = i / kShareBlock, t = i % kShareBlock, base = b * kShareBlock;
  if (which == 0) return (in[base + 63u - t] * 2654435761u + salt) ^ (b * 7u);
  const unsigned u = (t + 1u) % kShareBlock;
  return ((in[base + u] ^ salt) + 40503u * u) + b;
}

/* Launch module m (kernel `which`) on backend b with fresh random inputs; 1 when the output
 * matches the model exactly (the output starts poisoned). */
static int share_run_ok(rda_backend *b, rda_module *m, int which, rt_rng *rng) {
  unsigned *in = malloc(kShareN * sizeof *in), *out = malloc(kShareN * sizeof *out);
  if (in == NULL || out == NULL) {
    free(in);
    free(out);
    return 0;
  }
  for (int i = 0; i < kShareN; ++i) in[i] = (unsigned)rt_rng_next(rng);
  memset(out, 0xa5, kShareN * sizeof *out);
  const emu_share_params p = {in, out, (unsigned)rt_rng_next(rng), 0};
  const unsigned grid[3] = {kShareBlocks, 1, 1};
  rda_err err = {0};
  int ok = b->launch(b, m, grid, kShareBlock, 0, &p, sizeof p, &err) == RDA_OK;
  if (!ok) fprintf(stderr, "test_emu: share launch: %s\n", err.msg);
  for (int i = 0; ok && i < kShareN; ++i) {
    if (out[i] != share_model(which, in, p.salt, (unsigned)i)) {
      fprintf(stderr, "test_emu: kernel %d out[%d] = %u, model %u\n", which, i, out[i],
              share_model(which, in, p.salt, (unsigned)i));
      ok = 0;
    }
  }
  free(in);
  free(out);
  return ok;
}

static rda_module *share_load(rda_backend *b, int which) {
  rda_module *m = NULL;
  rda_err err = {0};
  if (load_test_kernel(b, which == 0 ? "emu_share_a" : "emu_share_b",
                       which == 0 ? g_src_share_a : g_src_share_b, &m, &err) != RDA_OK)
    fprintf(stderr, "test_emu: share load: %s\n", err.msg);
  return m;
}

/* Lines of /proc/self/maps, and (into *copies) how many distinct loaded temporary module files
 * (".../load.tmp.<pid>.<n>.so") they map: one per dlopen'ed copy of a module. */
static int maps_count(int *copies) {
  FILE *f = fopen("/proc/self/maps", "r");
  assert_non_null(f);
  char line[4096], last[4096] = "";
  int lines = 0, files = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    ++lines;
    const char *at = strstr(line, "/load.tmp.");
    if (at == NULL) continue;
    const char *path = strchr(line, '/');
    if (strcmp(path, last) != 0) ++files; /* a file's mappings are adjacent */
    snprintf(last, sizeof last, "%s", path);
  }
  fclose(f);
  if (copies != NULL) *copies = files;
  return lines;
}

enum { kShareBackends = 64 };

typedef struct share_worker {
  rda_backend *b;
  rda_module *m;
  int which;
  uint64_t seed;
  int ok;
  pthread_barrier_t *start; /* when it loads */
} share_worker;

/* Load w->which on w->b unless w->m is given, then launch it a dozen times. */
static void *share_worker_main(void *arg) {
  share_worker *w = arg;
  rt_rng rng;
  rt_rng_seed(&rng, w->seed);
  if (w->m == NULL) {
    pthread_barrier_wait(w->start); /* all load at once: some miss the table together */
    w->m = share_load(w->b, w->which);
  }
  w->ok = w->m != NULL;
  for (int k = 0; k < 12 && w->ok; ++k) w->ok = share_run_ok(w->b, w->m, w->which, &rng);
  return NULL;
}

/* 64 emulator backends (the ring's virtual ranks) loading the same two kernels share one
 * mapped copy of each: the process's mappings stay flat. Every module runs correctly, also
 * from eight threads launching at once; unloading in a random order keeps the others working;
 * the last unload of a kernel unmaps it, and a load after that works again, also eight at once
 * from eight threads (one copy stays mapped). */
static void test_emu_backends_share_loaded_modules(void **state) {
  (void)state;
  (void)module("emu_grid_ids", g_src_model); /* the runtime is loaded (mapped once, for good) */
  rt_rng *rng = rt_global_rng();
  rda_backend *bs[kShareBackends];
  rda_module *ms[kShareBackends];
  rda_err err = {0};
  for (int i = 0; i < kShareBackends; ++i)
    assert_int_equal(rda_backend_emu_open(&bs[i], 90, &err), RDA_OK);
  int copies0 = 0, copies1 = 0, copies2 = 0;
  (void)maps_count(&copies0);
  /* The first of each kernel maps one copy; 62 more loads map nothing more. */
  ms[0] = share_load(bs[0], 0);
  ms[1] = share_load(bs[1], 1);
  assert_non_null(ms[0]);
  assert_non_null(ms[1]);
  const int lines1 = maps_count(&copies1);
  assert_int_equal(copies1, copies0 + 2);
  for (int i = 2; i < kShareBackends; ++i) {
    ms[i] = share_load(bs[i], i % 2);
    assert_non_null(ms[i]);
  }
  const int lines2 = maps_count(&copies2);
  assert_int_equal(copies2, copies1);
  /* A private copy per load costs each at least 4 mappings (text, rodata, relro, data). */
  if (lines2 - lines1 > 16)
    fail_msg("62 loads of loaded kernels grew the mappings from %d to %d", lines1, lines2);

  /* 500 more loads and unloads on one backend: still nothing mapped. */
  {
    rda_module *extra[500];
    for (int i = 0; i < 500; ++i) assert_non_null(extra[i] = share_load(bs[7], i % 2));
    int c = 0;
    const int lines3 = maps_count(&c);
    assert_int_equal(c, copies1);
    if (lines3 - lines2 > 16) fail_msg("500 loads grew the mappings from %d to %d", lines2, lines3);
    for (int i = 499; i >= 0; --i) bs[7]->unload(bs[7], extra[i]);
    (void)maps_count(&c);
    assert_int_equal(c, copies1);
  }

  for (int i = 0; i < kShareBackends; ++i) assert_true(share_run_ok(bs[i], ms[i], i % 2, rng));
  /* Eight backends (eight OS threads, each launch spread over more) at once on both kernels. */
  share_worker w[8];
  pthread_t th[8];
  for (int t = 0; t < 8; ++t) {
    const int i = (int)rt_rng_range(rng, 0, kShareBackends - 1);
    w[t] = (share_worker){bs[i], ms[i], i % 2, rt_rng_next(rng), 0, NULL};
    assert_int_equal(pthread_create(&th[t], NULL, share_worker_main, &w[t]), 0);
  }
  for (int t = 0; t < 8; ++t) {
    assert_int_equal(pthread_join(th[t], NULL), 0);
    assert_true(w[t].ok);
  }

  /* Unload in a random order; after each, a random module still loaded runs. */
  int order[kShareBackends];
  for (int i = 0; i < kShareBackends; ++i) order[i] = i;
  for (int i = kShareBackends - 1; i > 0; --i) {
    const int j = (int)rt_rng_range(rng, 0, i);
    const int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  int left[2] = {kShareBackends / 2, kShareBackends / 2};
  for (int k = 0; k < kShareBackends; ++k) {
    const int i = order[k];
    bs[i]->unload(bs[i], ms[i]);
    ms[i] = NULL;
    --left[i % 2];
    int c = 0;
    (void)maps_count(&c);
    assert_int_equal(c, copies0 + (left[0] > 0) + (left[1] > 0)); /* the last one unmapped */
    if (k + 1 == kShareBackends) break;
    const int r = order[k + 1 + (int)rt_rng_range(rng, 0, kShareBackends - k - 2)];
    assert_true(share_run_ok(bs[r], ms[r], r % 2, rng));
  }
  /* Loaded again after all were unloaded: a fresh copy that runs. */
  for (int which = 0; which < 2; ++which) {
    rda_module *m = share_load(bs[which], which);
    assert_non_null(m);
    assert_true(share_run_ok(bs[which], m, which, rng));
    int c = 0;
    (void)maps_count(&c);
    assert_int_equal(c, copies0 + 1);
    bs[which]->unload(bs[which], m);
  }
  pthread_barrier_t start;
  assert_int_equal(pthread_barrier_init(&start, NULL, 8), 0);
  for (int t = 0; t < 8; ++t) {
    w[t] = (share_worker){bs[10 + t], NULL, t % 2, rt_rng_next(rng), 0, &start};
    assert_int_equal(pthread_create(&th[t], NULL, share_worker_main, &w[t]), 0);
  }
  for (int t = 0; t < 8; ++t) assert_int_equal(pthread_join(th[t], NULL), 0);
  pthread_barrier_destroy(&start);
  {
    int c = 0;
    (void)maps_count(&c);
    assert_int_equal(c, copies0 + 2);
  }
  for (int t = 0; t < 8; ++t) {
    assert_true(w[t].ok);
    w[t].b->unload(w[t].b, w[t].m);
  }
  {
    int c = 0;
    (void)maps_count(&c);
    assert_int_equal(c, copies0);
  }
  for (int i = 0; i < kShareBackends; ++i) bs[i]->destroy(bs[i]);
}

static void test_emu_alloc_is_aligned_and_copies_round_trip(void **state) {
  (void)state;
  void *d = NULL;
  rda_err err = {0};
  assert_int_equal(g_backend->alloc(g_backend, 1000, &d, &err), RDA_OK);
  assert_int_equal((uintptr_t)d % 64, 0);
  double x[125], y[125];
  for (int i = 0; i < 125; ++i) x[i] = rt_rng_normal(rt_global_rng());
  assert_int_equal(g_backend->upload(g_backend, d, x, sizeof x, &err), RDA_OK);
  assert_int_equal(g_backend->download(g_backend, y, d, sizeof y, &err), RDA_OK);
  assert_memory_equal(x, y, sizeof x);
  assert_int_equal(g_backend->synchronize(g_backend, &err), RDA_OK);
  g_backend->free(g_backend, d);
}

/* A thread's default stream of a backend stays its own however many other backends the
 * thread uses meanwhile: synchronize still waits for all the work queued there before. (The
 * device runs one operation at a time, so the hold holds up the others' work too, until it
 * is released.) */
static void test_emu_async_default_stream_outlives_many_other_backends(void **state) {
  (void)state;
  enum { kOthers = 80, kBytes = 1 << 20, kFills = 32 };
  async_env a;
  async_open(&a);
  rda_backend *b = a.b;
  rda_err err = {0};
  void *x = NULL, *big = NULL;
  assert_int_equal(b->alloc(b, kBytes, &x, &err), RDA_OK);
  assert_int_equal(b->alloc(b, kBytes, &big, &err), RDA_OK);
  async_hold(&a);
  for (int i = 0; i < kFills; ++i) /* work enough to still be queued when synchronize starts */
    assert_int_equal(b->memset_async(b, big, i, kBytes, &err), RDA_OK);
  assert_int_equal(b->memset_async(b, x, 7, kBytes, &err), RDA_OK);
  rda_backend *others[kOthers] = {NULL};
  void *y[kOthers] = {NULL};
  for (int i = 0; i < kOthers; ++i) {
    assert_int_equal(open_with_env("RDA_EMU_STREAMS", "async", &others[i], &err), RDA_OK);
    assert_int_equal(others[i]->alloc(others[i], 64, &y[i], &err), RDA_OK);
    assert_int_equal(others[i]->memset_async(others[i], y[i], 1, 64, &err), RDA_OK);
  }
  __atomic_store_n(&a.flag, 1, __ATOMIC_SEQ_CST);
  assert_int_equal(b->synchronize(b, &err), RDA_OK);
  const unsigned char *h = x; /* synchronized: the memset ran */
  for (int i = 0; i < kBytes; ++i)
    if (h[i] != 7) fail_msg("synchronize returned before the memset queued on its stream");
  for (int i = 0; i < kOthers; ++i) {
    others[i]->free(others[i], y[i]);
    others[i]->destroy(others[i]);
  }
  b->free(b, x), b->free(b, big);
  async_close(&a);
}

/* A thread that exits leaves its queued work to run; free and unload wait for the work of
 * every stream of the backend (cuMemFree synchronizes), so neither frees what it still uses. */
typedef struct exit_job {
  async_env *a;
  void *x;
} exit_job;

static void *queue_and_exit(void *arg) {
  exit_job *j = arg;
  rda_err err = {0};
  async_hold(j->a);
  if (j->a->b->memset_async(j->a->b, j->x, 9, 64, &err) != RDA_OK) return (void *)1;
  return NULL; /* no synchronize: the thread's default stream retires with work queued */
}

static void test_emu_async_free_and_unload_wait_for_every_stream(void **state) {
  (void)state;
  async_env a;
  async_open(&a);
  rda_backend *b = a.b;
  rda_err err = {0};
  void *x = NULL, *s = NULL, *done_ev = NULL;
  unsigned char *y = NULL;
  assert_int_equal(b->alloc(b, 64, &x, &err), RDA_OK);
  exit_job j = {&a, x};
  pthread_t th;
  void *ret = NULL;
  assert_int_equal(pthread_create(&th, NULL, queue_and_exit, &j), 0);
  assert_int_equal(pthread_join(th, &ret), 0);
  assert_null(ret);
  /* The exited thread's memset waits behind its hold: release it later; free waits. */
  release_later r = {&a.flag, 50};
  assert_int_equal(pthread_create(&th, NULL, release_after, &r), 0);
  assert_int_equal(b->alloc(b, 64, (void **)&y, &err), RDA_OK);
  b->free(b, y); /* returns once every stream drained: the exited thread's memset ran */
  assert_int_equal(pthread_join(th, NULL), 0);
  for (int i = 0; i < 64; ++i)
    if (((unsigned char *)x)[i] != 9) fail_msg("free returned before another stream's work ran");
  /* A launch queued on a stream of its own, behind a hold: unload of its module waits. */
  rda_module *m = must_load(b, "emu_faults", g_src_model);
  assert_int_equal(b->stream_create(b, &s, &err), RDA_OK);
  assert_int_equal(b->event_create(b, &done_ev, &err), RDA_OK);
  b->set_stream(b, s);
  async_hold(&a);
  int out[64];
  emu_test_params p = {.out0 = out, .n = -1, .op = 0}; /* every thread at the barrier: clean */
  const unsigned grid[3] = {1, 1, 1};
  assert_int_equal(b->launch(b, m, grid, 64, 256, &p, sizeof p, &err), RDA_OK);
  assert_int_equal(b->event_record(b, done_ev, &err), RDA_OK);
  b->set_stream(b, NULL);
  assert_int_equal(pthread_create(&th, NULL, release_after, &r), 0);
  b->unload(b, m); /* must not free the module under the queued launch */
  int done = 0;
  assert_int_equal(b->event_query(b, done_ev, &done, &err), RDA_OK);
  assert_int_equal(done, 1);
  assert_int_equal(pthread_join(th, NULL), 0);
  b->event_destroy(b, done_ev);
  b->stream_destroy(b, s);
  b->free(b, x);
  async_close(&a);
}

/* A launch of a shape no GPU takes is refused when it is queued, and leaves the device usable,
 * as cuLaunchKernel's INVALID_VALUE does: only a failure while a kernel runs is sticky. */
static void test_emu_async_bad_launch_shape_is_refused_at_once(void **state) {
  (void)state;
  async_env a;
  rda_module *m = async_open_faults(&a);
  rda_backend *b = a.b;
  rda_err err = {0};
  int out[64 * 4];
  emu_test_params p = {.out0 = out, .n = -1, .op = 0}; /* a clean launch when it runs */
  const unsigned grid[3] = {1, 1, 1}, tall[3] = {1, 70000, 1};
  assert_int_equal(b->launch(b, m, grid, 2048, 0, &p, sizeof p, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "at most 1024 threads"));
  rda_err_clear(&err);
  assert_int_equal(b->launch(b, m, tall, 64, 256, &p, sizeof p, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "y and z <= 65535"));
  rda_err_clear(&err);
  assert_int_equal(b->launch(b, m, grid, 64, 256, &p, sizeof p, &err), RDA_OK);
  assert_int_equal(b->synchronize(b, &err), RDA_OK);
  b->unload(b, m);
  async_close(&a);
}

/* A launch that fails on the device is reported by the next call that waits (synchronize
 * here), and every later call of every asynchronous backend fails with it, as a faulted CUDA
 * context's calls do. It poisons the process's emulated device: this test runs last. */
static void test_emu_async_failure_is_sticky(void **state) {
  (void)state;
  async_env a;
  rda_module *m = async_open_faults(&a);
  rda_backend *b = a.b;
  rda_err err = {0};
  int out[64 * 4];
  emu_test_params p = {.out0 = out, .n = 0, .op = 2}; /* thread 3 of block 2 traps */
  const unsigned grid[3] = {4, 1, 1};
  assert_int_equal(b->launch(b, m, grid, 64, 256, &p, sizeof p, &err), RDA_OK); /* queued */
  assert_int_equal(b->synchronize(b, &err), RDA_ERR_EMULATOR);
  assert_non_null(strstr(err.msg, "custom trap message 42"));
  void *x = NULL;
  assert_int_equal(b->alloc(b, 64, &x, &err), RDA_OK);
  rda_err_clear(&err);
  assert_int_equal(b->memset_async(b, x, 0, 64, &err), RDA_ERR_EMULATOR);
  assert_non_null(strstr(err.msg, "an earlier operation failed"));
  b->free(b, x);
  b->unload(b, m);
  async_close(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_emu_mma_bf16_matches_ptx_fragment_model),
      cmocka_unit_test(test_emu_mma_f16_matches_ptx_fragment_model),
      cmocka_unit_test(test_emu_mma_loop_rate_and_result),
      cmocka_unit_test(test_emu_wgmma_bf16_n64_matches_ptx_layouts),
      cmocka_unit_test(test_emu_wgmma_bf16_n128_matches_ptx_layouts),
      cmocka_unit_test(test_emu_wgmma_f16_n64_matches_ptx_layouts),
      cmocka_unit_test(test_emu_wgmma_f16_n128_matches_ptx_layouts),
      cmocka_unit_test(test_emu_wgmma_runs_at_the_wait),
      cmocka_unit_test(test_emu_wgmma_rate_and_result),
      cmocka_unit_test(test_emu_wgmma_missing_fence_or_wait_traps),
      cmocka_unit_test(test_emu_wgmma_registers_written_in_flight_trap),
      cmocka_unit_test(test_emu_wgmma_registers_written_after_wait_pass),
      cmocka_unit_test(test_emu_wgmma_divergent_warps_trap),
      cmocka_unit_test(test_emu_wgmma_cp_async_without_proxy_fence_traps),
      cmocka_unit_test(test_emu_wgmma_cp_async_with_proxy_fence_passes),
      cmocka_unit_test(test_emu_ldmatrix_x4_and_trans_match_ptx_fragment_model),
      cmocka_unit_test(test_emu_shfl_xor_every_lane_mask),
      cmocka_unit_test(test_emu_pack_bf16x2_rounds_to_nearest_even),
      cmocka_unit_test(test_emu_pack_f16x2_rounds_to_nearest_even),
      cmocka_unit_test(test_emu_f16_to_float_every_bit_pattern),
      cmocka_unit_test(test_emu_bf16_to_float_every_bit_pattern),
      cmocka_unit_test(test_emu_ex2_matches_ptx_approx_ftz),
      cmocka_unit_test(test_emu_cp_async_groups_complete_only_at_wait),
      cmocka_unit_test(test_emu_block_barrier_orders_shared_memory),
      cmocka_unit_test(test_emu_every_block_and_thread_runs_once_3d),
      cmocka_unit_test(test_emu_many_os_threads_run_every_block_once),
      cmocka_unit_test(test_emu_open_rejects_bad_thread_count),
      cmocka_unit_test(test_emu_open_rejects_overlong_compiler_settings),
      cmocka_unit_test(test_emu_reverse_order_exposes_a_missing_barrier),
      cmocka_unit_test(test_emu_reverse_order_runs_blocks_last_to_first),
      cmocka_unit_test(test_emu_async_streams_overtake_unless_an_event_orders_them),
      cmocka_unit_test(test_emu_async_events_and_stream_lifetimes),
      cmocka_unit_test(test_emu_async_default_stream_outlives_many_other_backends),
      cmocka_unit_test(test_emu_async_free_and_unload_wait_for_every_stream),
      cmocka_unit_test(test_emu_async_bad_launch_shape_is_refused_at_once),
      cmocka_unit_test(test_emu_shared_memory_poisoned_at_every_block_start),
      cmocka_unit_test(test_emu_skipped_barrier_is_a_deadlock_error),
      cmocka_unit_test(test_emu_partial_warp_collective_is_a_deadlock_error),
      cmocka_unit_test(test_emu_barrier_and_shuffle_mixed_is_a_deadlock_error),
      cmocka_unit_test(test_emu_lanes_at_different_collectives_trap),
      cmocka_unit_test(test_emu_trap_reports_block_thread_and_message),
      cmocka_unit_test(test_emu_cp_async_misaligned_traps),
      cmocka_unit_test(test_emu_cp_async_outside_shared_memory_traps),
      cmocka_unit_test(test_emu_launch_rejects_wrong_params_size),
      cmocka_unit_test(test_emu_cuda_builtins_follow_the_programming_guide),
      cmocka_unit_test(test_emu_compile_error_is_reported_with_compiler_output),
      cmocka_unit_test(test_emu_load_of_missing_entry_fails),
      cmocka_unit_test(test_emu_cache_reuses_module_and_leaves_no_temp_files),
      cmocka_unit_test(test_emu_backends_share_loaded_modules),
      cmocka_unit_test(test_emu_alloc_is_aligned_and_copies_round_trip),
      /* Last: it leaves the emulated device of asynchronous streams failed. */
      cmocka_unit_test(test_emu_async_failure_is_sticky),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
