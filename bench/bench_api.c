/* bench_api.c — host-side costs of the public API (issue 3 §5): plan creation with the kernels
 * in memory and with a warm disk cache (fresh processes), a cold compile of one forward variant
 * (emulator C++ build and NVRTC), and the host overhead of one rda_forward call. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "backend.h"
#include "gen.h"
#include "nvrtc.h"
#include "rda.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The config every measurement uses: a typical 3-branch LongNet layer, bf16, d128, causal. */
static const char kChunk[] =
    "return { heads = 16, kv_heads = 4, head_dim = 128, dtype = 'bf16', causal = true,\n"
    "         segments = {2048, 4096, 8192}, dilations = {1, 2, 4} }";
/* One branch: its plan has one forward variant (plus init and cast). */
static const char kOneVariant[] =
    "return { heads = 8, head_dim = 64, dtype = 'fp16', segments = {512}, dilations = {2} }";

static int die(const char *what, const rda_ctx *ctx) {
  fprintf(stderr, "rda_bench_api: %s: %s\n", what, rda_last_error(ctx));
  return 1;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Child mode: ctx create + one plan creation in this fresh process; prints both times (s). */
static int child_create(void) {
  const double t0 = now_s();
  rda_ctx *ctx = NULL;
  if (rda_ctx_create_emulator(&ctx) != RDA_OK) return die("rda_ctx_create_emulator", NULL);
  const double t1 = now_s();
  rda_plan *p = NULL;
  if (rda_plan_create_from_string(&p, ctx, kChunk, RDA_PLAN_FORWARD) != RDA_OK)
    return die("rda_plan_create", ctx);
  const double t2 = now_s();
  printf("%.9f %.9f\n", t1 - t0, t2 - t1);
  rda_plan_destroy(p);
  rda_ctx_destroy(ctx);
  return 0;
}

/* Run `self --child-create` (with RDA_CACHE_DIR as set); reads the two times. */
static int run_child(const char *self, double *ctx_s, double *plan_s) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' --child-create", self);
  FILE *f = popen(cmd, "r");
  if (f == NULL) return 1;
  const int got = fscanf(f, "%lf %lf", ctx_s, plan_s);
  const int rc = pclose(f);
  return got == 2 && rc == 0 ? 0 : 1;
}

/* Cold builds of one forward variant: the emulator's C++ compile (into an empty cache, after
 * the emulator runtime and the init kernel are built) and NVRTC to a cubin for sm_90. */
static int cold_compile(double *emu_s, double *nvrtc_s) {
  char dir[] = "/tmp/rda-bench-cold.XXXXXX";
  if (mkdtemp(dir) == NULL) return 1;
  setenv("RDA_CACHE_DIR", dir, 1);
  rda_err err = {0};
  rda_gen *g = NULL;
  rda_backend *b = NULL;
  rda_plan_k pk;
  memset(&pk, 0, sizeof pk);
  rda_config cfg;
  rda_hw hw;
  int rc = 1;
  if (rda_gen_open(&g, &err) != RDA_OK ||
      rda_gen_config_string(g, kOneVariant, "=bench", &cfg, &err) != RDA_OK ||
      rda_backend_emu_open(&b, 90, &err) != RDA_OK ||
      rda_gen_hw_builtin(g, 90, &hw, &err) != RDA_OK ||
      rda_gen_plan(g, &cfg, &hw, &pk, &err) != RDA_OK) {
    fprintf(stderr, "rda_bench_api: cold compile setup: %s\n", err.msg);
    goto done;
  }
  rda_module *m = NULL;
  if (b->load(b, &pk.variants[pk.init_kernel], &m, &err) != RDA_OK) goto fail;
  b->unload(b, m);
  for (int i = 0; i < pk.nvariants; ++i) {
    if (strcmp(pk.variants[i].kind, "fwd") != 0) continue;
    double t = now_s();
    if (b->load(b, &pk.variants[i], &m, &err) != RDA_OK) goto fail;
    *emu_s = now_s() - t;
    b->unload(b, m);
    rda_nvrtc_out out;
    memset(&out, 0, sizeof out);
    t = now_s();
    if (rda_nvrtc_compile(pk.variants[i].source, pk.variants[i].name, pk.variants[i].name, 90, 0,
                          &out, &err) != RDA_OK)
      goto fail;
    *nvrtc_s = now_s() - t;
    rda_nvrtc_out_free(&out);
    rc = 0;
    break;
  }
  goto done;
fail:
  fprintf(stderr, "rda_bench_api: cold compile: %s\n", err.msg);
done:
  rda_plan_k_free(&pk);
  if (b != NULL) b->destroy(b);
  rda_gen_close(g);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "rda_bench_api: could not remove %s\n", dir);
  return rc;
}

/* cuCtxSynchronize from the driver (the public API leaves synchronization to the caller). */
static int cu_ctx_sync(void) {
  static int (*fn)(void);
  if (fn == NULL) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *sym = lib != NULL ? dlsym(lib, "cuCtxSynchronize") : NULL;
    if (sym == NULL) return -1;
    memcpy(&fn, &sym, sizeof sym);
  }
  return fn();
}

/* Median seconds per rda_forward over `iters` calls on ctx's plan for B=1, N=n. With dev (a
 * cuda backend on ctx's GPU), the tensors live in its memory and the calls only enqueue. */
static int forward_time(rda_ctx *ctx, rda_backend *dev, long long n, int iters, double *per_call) {
  rda_plan *p = NULL;
  if (rda_plan_create_from_string(&p, ctx, kChunk, RDA_PLAN_FORWARD) != RDA_OK)
    return die("rda_plan_create", ctx);
  const long long qs[4] = {1, n, 16, 128}, ks[4] = {1, n, 4, 128}, ls[3] = {1, 16, n};
  uint16_t *q = aligned_alloc(64, (size_t)(n * 16 * 128 * 2));
  uint16_t *k = aligned_alloc(64, (size_t)(n * 4 * 128 * 2));
  uint16_t *o = aligned_alloc(64, (size_t)(n * 16 * 128 * 2));
  float *lse = aligned_alloc(64, (size_t)(n * 16 * 4));
  size_t ws_bytes = 0;
  rda_plan_workspace_size(p, 1, n, &ws_bytes);
  void *ws = aligned_alloc(256, (ws_bytes + 255) / 256 * 256);
  int rc = 1;
  void *dq = NULL, *dk = NULL, *dout = NULL, *dl = NULL, *dws = NULL;
  if (q && k && o && lse && ws) {
    for (long long i = 0; i < n * 16 * 128; ++i) q[i] = (uint16_t)(0x3f80 ^ (i & 0x7f));
    for (long long i = 0; i < n * 4 * 128; ++i) k[i] = (uint16_t)(0x3f00 ^ (i & 0x7f));
    void *tq_p = q, *tk_p = k, *to_p = o, *tl_p = lse, *ws_p = ws;
    if (dev != NULL) {
      rda_err err = {0};
      if (dev->alloc(dev, (size_t)(n * 16 * 128 * 2), &dq, &err) != RDA_OK ||
          dev->alloc(dev, (size_t)(n * 4 * 128 * 2), &dk, &err) != RDA_OK ||
          dev->alloc(dev, (size_t)(n * 16 * 128 * 2), &dout, &err) != RDA_OK ||
          dev->alloc(dev, (size_t)(n * 16 * 4), &dl, &err) != RDA_OK ||
          dev->alloc(dev, ws_bytes, &dws, &err) != RDA_OK ||
          dev->upload(dev, dq, q, (size_t)(n * 16 * 128 * 2), &err) != RDA_OK ||
          dev->upload(dev, dk, k, (size_t)(n * 4 * 128 * 2), &err) != RDA_OK) {
        fprintf(stderr, "rda_bench_api: GPU buffers: %s\n", err.msg);
        iters = 0;
      }
      tq_p = dq, tk_p = dk, to_p = dout, tl_p = dl, ws_p = dws;
    }
    rda_tensor tq, tk, to, tl;
    rda_tensor_contiguous(&tq, tq_p, RDA_BF16, 4, qs);
    rda_tensor_contiguous(&tk, tk_p, RDA_BF16, 4, ks);
    rda_tensor_contiguous(&to, to_p, RDA_BF16, 4, qs);
    rda_tensor_contiguous(&tl, tl_p, RDA_FP32, 3, ls);
    double *t = malloc(sizeof *t * (size_t)iters);
    rc = t == NULL;
    for (int i = 0; i < iters && rc == 0; ++i) {
      const double t0 = now_s();
      if (rda_forward(p, &tq, &tk, &tk, &to, &tl, ws_p, ws_bytes, NULL) != RDA_OK)
        rc = die("rda_forward", ctx);
      t[i] = now_s() - t0;
    }
    if (dev != NULL && cu_ctx_sync() != 0) rc = die("cuCtxSynchronize failed", ctx);
    if (iters == 0) rc = 1;
    if (rc == 0) *per_call = median(t, iters);
    free(t);
  }
  if (dev != NULL) {
    dev->free(dev, dq), dev->free(dev, dk), dev->free(dev, dout), dev->free(dev, dl);
    dev->free(dev, dws);
  }
  free(q), free(k), free(o), free(lse), free(ws);
  rda_plan_destroy(p);
  return rc;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--child-create") == 0) return child_create();
  const char *out_path = NULL;
  for (int i = 1; i + 1 < argc; i += 2)
    if (strcmp(argv[i], "--out") == 0) out_path = argv[i + 1];

  /* 1. Plan creation with the kernels loaded in this process (another plan holds them). */
  rda_ctx *ctx = NULL;
  if (rda_ctx_create_emulator(&ctx) != RDA_OK) return die("rda_ctx_create_emulator", NULL);
  rda_plan *keep = NULL;
  double t0 = now_s();
  if (rda_plan_create_from_string(&keep, ctx, kChunk, RDA_PLAN_FORWARD) != RDA_OK)
    return die("rda_plan_create", ctx);
  const double first_s = now_s() - t0;
  enum { kMemIters = 200 };
  double mem[kMemIters];
  for (int i = 0; i < kMemIters; ++i) {
    rda_plan *p = NULL;
    t0 = now_s();
    if (rda_plan_create_from_string(&p, ctx, kChunk, RDA_PLAN_FORWARD) != RDA_OK)
      return die("rda_plan_create", ctx);
    mem[i] = now_s() - t0;
    rda_plan_destroy(p);
  }
  const double mem_s = median(mem, kMemIters);

  /* 1b. The first plan of a fresh context in this process: the config runs through Lua and the
   * kernels come from the process's in-memory kernel cache. */
  enum { kCtxIters = 20 };
  double fresh[kCtxIters];
  for (int i = 0; i < kCtxIters; ++i) {
    rda_ctx *c2 = NULL;
    rda_plan *p = NULL;
    if (rda_ctx_create_emulator(&c2) != RDA_OK) return die("rda_ctx_create_emulator", NULL);
    t0 = now_s();
    if (rda_plan_create_from_string(&p, c2, kChunk, RDA_PLAN_FORWARD) != RDA_OK)
      return die("rda_plan_create", c2);
    fresh[i] = now_s() - t0;
    rda_plan_destroy(p);
    rda_ctx_destroy(c2);
  }
  const double fresh_s = median(fresh, kCtxIters);

  /* 2. Fresh processes with a warm disk cache (the first plan above warmed it). */
  enum { kProcs = 5 };
  double pctx[kProcs], pplan[kProcs];
  for (int i = 0; i < kProcs; ++i)
    if (run_child(argv[0], &pctx[i], &pplan[i]) != 0) {
      fprintf(stderr, "rda_bench_api: the --child-create run failed\n");
      return 1;
    }
  const double disk_ctx_s = median(pctx, kProcs), disk_plan_s = median(pplan, kProcs);

  /* 3. Host overhead of one forward call: a dry context (launches do nothing), then the
   * emulator running the kernels for a small N (for scale). */
  rda_ctx *dry = NULL;
  if (rda_api_ctx_create_dry(&dry) != RDA_OK) return die("rda_api_ctx_create_dry", NULL);
  double dry_s = 0, emu_s = 0;
  if (forward_time(dry, NULL, 4096, 20001, &dry_s) != 0) return 1;
  if (forward_time(ctx, NULL, 256, 5, &emu_s) != 0) return 1;
  /* And on a GPU when there is one: the time to enqueue (kernels run meanwhile). */
  char gpu_row[160] = "no GPU here";
  rda_ctx *cctx = NULL;
  if (rda_ctx_create_cuda(&cctx, 0) == RDA_OK) {
    rda_backend *dev = NULL;
    rda_err err = {0};
    double cuda_s = 0;
    if (rda_backend_cuda_open(&dev, 0, &err) == RDA_OK &&
        forward_time(cctx, dev, 4096, 2001, &cuda_s) == 0)
      snprintf(gpu_row, sizeof gpu_row, "%.2f us", cuda_s * 1e6);
    if (dev != NULL) dev->destroy(dev);
    rda_ctx_destroy(cctx);
  }
  rda_ctx_destroy(dry);
  rda_plan_destroy(keep);
  rda_ctx_destroy(ctx);

  /* 4. Cold compile of one forward variant (last: it changes RDA_CACHE_DIR). */
  double cold_emu_s = 0, cold_nvrtc_s = 0;
  if (cold_compile(&cold_emu_s, &cold_nvrtc_s) != 0) return 1;

  char text[4096];
  snprintf(
      text, sizeof text,
      "| measurement | value | target |\n"
      "| --- | --- | --- |\n"
      "| plan creation, kernels already loaded in the process (median of %d) | %.2f us | <= 50 us "
      "|\n"
      "| first plan of a fresh context, in-memory kernel cache (median of %d) | %.1f us | - |\n"
      "| plan creation in a fresh process, warm disk cache (median of %d) | %.2f ms | <= 20 ms |\n"
      "| context creation in a fresh process (emulator; median of %d) | %.2f ms | - |\n"
      "| first plan creation in this run (cache as found) | %.2f ms | - |\n"
      "| cold compile of one forward variant, NVRTC to sm_90 cubin | %.2f s | <= 3 s |\n"
      "| cold compile of one forward variant, emulator C++ build | %.2f s | - |\n"
      "| host overhead of one rda_forward (launches stubbed; median of 20001) | %.2f us | <= 10 us "
      "|\n"
      "| rda_forward on the emulator, B=1 N=256 (kernels run on the CPU) | %.1f ms | - |\n"
      "| host overhead of one rda_forward on GPU 0, N=4096 (enqueue; median of 2001) | %s | <= 10 "
      "us "
      "|\n",
      kMemIters, mem_s * 1e6, kCtxIters, fresh_s * 1e6, kProcs, disk_plan_s * 1e3, kProcs,
      disk_ctx_s * 1e3, first_s * 1e3, cold_nvrtc_s, cold_emu_s, dry_s * 1e6, emu_s * 1e3, gpu_row);
  fputs(text, stdout);
  if (out_path != NULL) {
    FILE *f = fopen(out_path, "w");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
      fprintf(stderr, "rda_bench_api: cannot write %s\n", out_path);
      return 1;
    }
  }
  return 0;
}
