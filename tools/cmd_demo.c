/* cmd_demo.c — `rdagen demo`: the main job end to end. Generate the kernels for a config,
 * compile each with NVRTC for the local GPU (sm_90 when there is none) and show the ptxas
 * report, run the forward pass on the GPU or the CPU emulator, check it against the float64
 * reference, and print a short table. */
#include "args.h"
#include "backend.h"
#include "check.h"
#include "commands.h"
#include "fwd.h"
#include "gen.h"
#include "log.h"
#include "nvrtc.h"
#include "reference.h"
#include "rng.h"
#include "sources.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct demo_opts {
  const char *config;
  long long n, batch;
  const char *backend;
  unsigned long long seed;
} demo_opts;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bounds of the demo's problem: N as the ring's, the batch as one launch grid's z. */
#define DEMO_MAX_N (1LL << 40)
#define DEMO_MAX_BATCH 65535LL

/* The config a demo without CONFIG runs: configs/default.lua, built into librda. */
static const char kDefaultConfig[] = "configs/default.lua";

/* Returns -1 to go on, else the exit status (0 for --help). */
static int parse_opts(int argc, char **argv, demo_opts *o) {
  o->config = NULL; /* the built-in copy of configs/default.lua */
  o->n = 2048;
  o->batch = 1;
  o->backend = "auto";
  o->seed = 1;
  int have_config = 0, seen[4] = {0};
  static const char *const valued[] = {"n", "batch", "seed", "backend"};
  static const long long lo[] = {1, 1, 0}, hi[] = {DEMO_MAX_N, DEMO_MAX_BATCH, LLONG_MAX};
  for (int i = 0; i < argc; ++i) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      printf("usage: rdagen demo [CONFIG] [--n N] [--batch B] [--backend auto|cuda|emu] [--seed S]\n"
             "Without CONFIG: configs/default.lua, built into rdagen.\n");
      return 0;
    }
    const char *eq;
    const int f = rdagen_option_index(a, valued, 4, &eq);
    if (f < 0) {
      if (a[0] == '-' && a[1] != '\0') return rdagen_usage("demo: unknown option '%s'", a);
      if (have_config) return rdagen_usage("demo: more than one config given ('%s')", a);
      o->config = a;
      have_config = 1;
      continue;
    }
    const char *val = rdagen_option_value(argc, argv, &i, eq);
    if (val == NULL) return rdagen_usage("demo: --%s needs a value", valued[f]);
    if (seen[f]++) return rdagen_usage("demo: --%s given twice", valued[f]);
    if (f == 3) {
      if (strcmp(val, "auto") != 0 && strcmp(val, "cuda") != 0 && strcmp(val, "emu") != 0)
        return rdagen_usage("demo: --backend '%s': expected auto, cuda or emu", val);
      o->backend = val;
      continue;
    }
    long long x;
    if (!rdagen_parse_count(val, lo[f], hi[f], &x))
      return rdagen_usage("demo: --%s '%s': expected an integer in %lld..%lld", valued[f], val,
                          lo[f], hi[f]);
    if (f == 0) o->n = x;
    else if (f == 1) o->batch = x;
    else o->seed = (unsigned long long)x;
  }
  return -1;
}

static void print_config(const rda_config *c, const demo_opts *o) {
  printf("config   %s%s: heads %d (kv %d), head_dim %d, %s, %s, offsets %s, branches",
         o->config != NULL ? o->config : kDefaultConfig, o->config != NULL ? "" : " (built in)",
         c->heads, c->kv_heads, c->head_dim, rda_dtype_name(c->dtype),
         c->causal ? "causal" : "non-causal", rda_offsets_name(c->offsets));
  for (int i = 0; i < c->nbranch; ++i)
    printf(" (%lld,%lld)", (long long)c->segments[i], (long long)c->dilations[i]);
  printf("\nproblem  batch %lld, N %lld\n", o->batch, o->n);
}

/* Compile every variant with NVRTC for the target and print the ptxas report. */
static int report_nvrtc(const rda_plan_k *p, int arch, int *spills) {
  printf("\n%-62s %-6s %5s %6s %7s %9s\n", "kernel (NVRTC)", "arch", "regs", "spill", "smem",
         "compile");
  *spills = 0;
  for (int i = 0; i < p->nvariants; ++i) {
    const rda_variant *v = &p->variants[i];
    rda_nvrtc_out out;
    rda_err err = {0};
    if (rda_nvrtc_compile(v->source, v->name, v->name, arch, 0, &out, &err) != RDA_OK)
      return rdagen_fail("%s", err.msg);
    rda_log(RDA_LOG_INFO, "compiled %s for sm_%d in %.2f s (demo: ptxas report, not cached)",
            v->name, arch, out.compile_s);
    printf("%-62s sm_%-3d %5d %6d %7d %7.2f s%s\n", v->name, arch, out.registers,
           out.spill_bytes, out.smem_bytes + v->smem_bytes, out.compile_s,
           v->tuned ? "  (tile from tuning)" : "");
    *spills += out.spill_bytes;
    rda_nvrtc_out_free(&out);
  }
  return 0;
}

typedef struct demo_tensors {
  double *q, *k, *v, *o_ref, *lse_ref;
  uint16_t *qb, *kb, *vb;
  float *o, *lse;
} demo_tensors;

static void free_tensors(demo_tensors *t) {
  free(t->q), free(t->k), free(t->v), free(t->o_ref), free(t->lse_ref);
  free(t->qb), free(t->kb), free(t->vb), free(t->o), free(t->lse);
}

static int make_inputs(const rda_config *c, const demo_opts *o, demo_tensors *t) {
  /* B N H D doubles, and more, for each tensor: a product past what memory can address is
   * refused here rather than wrapped. */
  size_t bn, nq, nk, nl;
  if (__builtin_mul_overflow((size_t)o->batch, (size_t)o->n, &bn) ||
      __builtin_mul_overflow(bn, (size_t)c->heads * (size_t)c->head_dim, &nq) ||
      __builtin_mul_overflow(bn, (size_t)c->kv_heads * (size_t)c->head_dim, &nk) ||
      __builtin_mul_overflow(bn, (size_t)c->heads, &nl) || nq > SIZE_MAX / sizeof(double))
    return rdagen_fail("out of memory: batch %lld x N %lld is too large", o->batch, o->n);
  t->q = malloc(nq * sizeof *t->q), t->k = malloc(nk * sizeof *t->k);
  t->v = malloc(nk * sizeof *t->v), t->o_ref = malloc(nq * sizeof *t->o_ref);
  t->lse_ref = malloc(nl * sizeof *t->lse_ref);
  t->qb = malloc(nq * sizeof *t->qb), t->kb = malloc(nk * sizeof *t->kb);
  t->vb = malloc(nk * sizeof *t->vb), t->o = malloc(nq * sizeof *t->o);
  t->lse = malloc(nl * sizeof *t->lse);
  if (!t->q || !t->k || !t->v || !t->o_ref || !t->lse_ref || !t->qb || !t->kb || !t->vb || !t->o ||
      !t->lse)
    return rdagen_fail("out of memory for N = %lld", o->n);
  rda_rng g;
  rda_rng_seed(&g, o->seed);
  struct { double *x; uint16_t *bits; size_t n; } in[3] = {{t->q, t->qb, nq}, {t->k, t->kb, nk},
                                                           {t->v, t->vb, nk}};
  for (int a = 0; a < 3; ++a)
    for (size_t i = 0; i < in[a].n; ++i) {
      in[a].bits[i] = rda_to_dtype_bits(rda_rng_normal(&g), c->dtype);
      in[a].x[i] = rda_from_dtype_bits(in[a].bits[i], c->dtype);
    }
  return 0;
}

/* Upload, run, download: the forward pass on the chosen backend. */
static int run_forward(rda_backend *b, const rda_plan_k *p, const demo_opts *o, demo_tensors *t,
                       double *run_s) {
  const rda_config *c = &p->cfg;
  const long long H = c->heads, Hkv = c->kv_heads, D = c->head_dim, N = o->n, B = o->batch;
  const size_t nq = (size_t)(B * N * H * D), nk = (size_t)(B * N * Hkv * D), nl = (size_t)(B * H * N);
  rda_err err = {0};
  rda_fwd_kernels k = {0};
  void *dq = NULL, *dk = NULL, *dv = NULL, *dO = NULL, *dl = NULL;
  int rc = 1;
  double t0 = now_s();
  if (rda_fwd_load(b, p, &k, &err) != RDA_OK) goto done;
  printf("\nloaded   %d kernels on %s in %.2f s\n", p->nvariants, b->name, now_s() - t0);
  if (b->alloc(b, nq * 2, &dq, &err) || b->alloc(b, nk * 2, &dk, &err) ||
      b->alloc(b, nk * 2, &dv, &err) || b->alloc(b, nq * 4, &dO, &err) ||
      b->alloc(b, nl * 4, &dl, &err))
    goto done;
  if (b->upload(b, dq, t->qb, nq * 2, &err) || b->upload(b, dk, t->kb, nk * 2, &err) ||
      b->upload(b, dv, t->vb, nk * 2, &err))
    goto done;
  /* Poison the outputs so an element no kernel wrote cannot pass as a result. */
  for (size_t i = 0; i < nq; ++i) t->o[i] = __builtin_nanf("");
  for (size_t i = 0; i < nl; ++i) t->lse[i] = __builtin_nanf("");
  if (b->upload(b, dO, t->o, nq * 4, &err) || b->upload(b, dl, t->lse, nl * 4, &err)) goto done;
  rda_fwd_args a = {.batch = B, .n = N, .q = dq, .k = dk, .v = dv,
                    .q_s = {N * H * D, H * D, D}, .k_s = {N * Hkv * D, Hkv * D, D},
                    .v_s = {N * Hkv * D, Hkv * D, D}, .o = dO, .o_s = {N * H * D, H * D, D},
                    .lse = dl, .lse_s = {H * N, N}};
  t0 = now_s();
  if (rda_fwd_run(b, p, &k, &a, &err) != RDA_OK || b->synchronize(b, &err) != RDA_OK) goto done;
  *run_s = now_s() - t0;
  if (b->download(b, t->o, dO, nq * 4, &err) || b->download(b, t->lse, dl, nl * 4, &err)) goto done;
  rc = 0;
done:
  if (rc != 0) rdagen_fail("%s", err.msg);
  b->free(b, dq), b->free(b, dk), b->free(b, dv), b->free(b, dO), b->free(b, dl);
  rda_fwd_unload(b, &k);
  return rc;
}

/* CONFIG, or without one the default config built into rdagen (works from any folder). */
static rda_status load_config(rda_gen *g, const char *path, rda_config *cfg, rda_err *err) {
  if (path != NULL) return rda_gen_config_file(g, path, cfg, err);
  char *text = NULL;
  RDA_TRY(rda_sources_read(kDefaultConfig, &text, NULL, err));
  const rda_status st = rda_gen_config_string(g, text, kDefaultConfig, cfg, err);
  free(text);
  return st;
}

int rdagen_cmd_demo(int argc, char **argv) {
  demo_opts o;
  int rc = parse_opts(argc, argv, &o);
  if (rc >= 0) return rc;

  rda_err err = {0};
  rda_gen *g = NULL;
  rda_backend *b = NULL;
  rda_plan_k plan;
  memset(&plan, 0, sizeof plan);
  demo_tensors t;
  memset(&t, 0, sizeof t);
  rda_config cfg;
  rda_hw hw;
  char why[512];
  rc = 1;

  if (rda_gen_open(&g, &err) != RDA_OK || load_config(g, o.config, &cfg, &err) != RDA_OK) {
    rdagen_fail("%s", err.msg);
    goto done;
  }
  print_config(&cfg, &o);
  if (rda_backend_open(o.backend, &b, why, sizeof why, &err) != RDA_OK ||
      rda_backend_hw(b, g, &hw, &err) != RDA_OK || rda_gen_plan(g, &cfg, &hw, &plan, &err) != RDA_OK) {
    rdagen_fail("%s", err.msg);
    goto done;
  }
  printf("backend  %s\ntarget   %s\n", why, hw.name);

  int spills = 0;
  if (report_nvrtc(&plan, hw.arch, &spills) != 0) goto done;
  if (make_inputs(&cfg, &o, &t) != 0) goto done;
  double run_s = 0;
  if (run_forward(b, &plan, &o, &t, &run_s) != 0) goto done;

  const double t0 = now_s();
  rda_ref_forward(&cfg, o.batch, o.n, t.q, t.k, t.v, t.o_ref, t.lse_ref);
  const double ref_s = now_s() - t0;
  rda_check_result res;
  const long long H = cfg.heads, D = cfg.head_dim, N = o.n;
  const long long o_s[3] = {N * H * D, H * D, D}, l_s[2] = {H * N, N};
  rda_check_forward(&cfg, o.batch, o.n, t.o, o_s, t.lse, l_s, t.o_ref, t.lse_ref, &res);
  const rda_tolerance tol = rda_tolerance_for(cfg.dtype);

  printf("\n%-28s %12s %12s\n", "check vs float64 reference", "measured", "tolerance");
  printf("%-28s %12.3e %12.1e\n", "O relative L2", res.o_rel_l2, tol.o_rel_l2);
  printf("%-28s %12.3e %12.1e\n", "LSE max abs error", res.lse_max_abs, tol.lse_abs);
  printf("%-28s %12lld %12s\n", "uncovered rows (exact)", res.uncovered_rows,
         res.bad_uncovered ? "WRONG" : "ok");
  printf("%-28s %12lld %12d\n", "NaN/Inf values", res.nonfinite, 0);
  printf("%-28s %12d %12d\n", "spill bytes (all kernels)", spills, 0);
  printf("%-28s %10.3f s %12s\n", "forward on backend", run_s, b->name);
  printf("%-28s %10.3f s\n", "float64 reference", ref_s);
  const int pass = res.pass && spills == 0;
  printf("\nresult   %s%s%s\n", pass ? "PASS" : "FAIL", res.pass ? "" : ": ",
         res.pass ? "" : res.first_failure);
  rc = pass ? 0 : 1;
done:
  free_tensors(&t);
  rda_plan_k_free(&plan);
  if (b != NULL) b->destroy(b);
  rda_gen_close(g);
  return rc;
}
