/* bench_fwd.c — forward throughput on a GPU: one config, one N, timed over repeats after a
 * warm-up, reported as effective TFLOP/s (SPEC issue 2 §3: 4·D·Σ|grid|² over branch, head and
 * segment, halved when causal). Prints one JSON line for bench/results/. Needs a GPU. */
#include "backend.h"
#include "fwd.h"
#include "gen.h"
#include "reference.h"
#include "rng.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 4·D·Σ over (branch, head, segment) of |grid|², halved when causal. */
static double effective_flops(const rda_config *c, long long batch, long long n) {
  double total = 0;
  for (int i = 0; i < c->nbranch; ++i) {
    const long long r = c->dilations[i], w = c->segments[i] < n ? c->segments[i] : n;
    for (int h = 0; h < c->heads; ++h) {
      const long long j = rda_config_offset(c, i, h);
      if (j < 0) continue;
      for (long long a = 0; a < n; a += w) {
        const long long len = (a + w < n ? a + w : n) - a;
        const double g = j < len ? (double)((len - j + r - 1) / r) : 0.0;
        total += 4.0 * c->head_dim * g * g * (c->causal ? 0.5 : 1.0);
      }
    }
  }
  return total * (double)batch;
}

static int usage(void) {
  fprintf(stderr, "usage: rda_bench_fwd CONFIG [--n N] [--batch B] [--iters K]\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  const char *config = argv[1];
  long long n = 65536, batch = 1, iters = 20;
  for (int i = 2; i + 1 < argc; i += 2) {
    long long *dst = strcmp(argv[i], "--n") == 0       ? &n
                     : strcmp(argv[i], "--batch") == 0 ? &batch
                     : strcmp(argv[i], "--iters") == 0 ? &iters
                                                       : NULL;
    if (dst == NULL || (*dst = atoll(argv[i + 1])) < 1) return usage();
  }
  rda_err err = {0};
  rda_gen *g = NULL;
  rda_backend *b = NULL;
  rda_plan_k plan;
  memset(&plan, 0, sizeof plan);
  rda_fwd_kernels k = {0};
  rda_config cfg;
  rda_hw hw;
  void *buf[5] = {0};
  int rc = 1;
  if (rda_gen_open(&g, &err) || rda_gen_config_file(g, config, &cfg, &err) ||
      rda_backend_cuda_open(&b, 0, &err) || rda_backend_hw(b, g, &hw, &err) ||
      rda_gen_plan(g, &cfg, &hw, &plan, &err) || rda_fwd_load(b, &plan, &k, &err))
    goto done;

  const long long H = cfg.heads, Hkv = cfg.kv_heads, D = cfg.head_dim;
  const size_t nq = (size_t)(batch * n * H * D), nk = (size_t)(batch * n * Hkv * D);
  const size_t sizes[5] = {nq * 2, nk * 2, nk * 2, nq * 4, (size_t)(batch * H * n) * 4};
  for (int i = 0; i < 5; ++i)
    if (b->alloc(b, sizes[i], &buf[i], &err)) goto done;
  /* Normal draws rounded to the storage dtype: constant rows are no benchmark. */
  uint16_t *host = malloc(nq * 2);
  if (host == NULL) goto done;
  rda_rng rng;
  rda_rng_seed(&rng, 7);
  for (size_t i = 0; i < nq; ++i) host[i] = rda_to_dtype_bits(rda_rng_normal(&rng), cfg.dtype);
  for (int i = 0; i < 3; ++i)
    if (b->upload(b, buf[i], host, sizes[i], &err)) {
      free(host);
      goto done;
    }
  free(host);

  rda_fwd_args a = {.batch = batch, .n = n, .q = buf[0], .k = buf[1], .v = buf[2],
                    .q_s = {n * H * D, H * D, D}, .k_s = {n * Hkv * D, Hkv * D, D},
                    .v_s = {n * Hkv * D, Hkv * D, D}, .o = buf[3], .o_s = {n * H * D, H * D, D},
                    .lse = buf[4], .lse_s = {H * n, n}};
  for (int w = 0; w < 3; ++w)
    if (rda_fwd_run(b, &plan, &k, &a, &err) || b->synchronize(b, &err)) goto done;
  const double t0 = now_s();
  for (long long it = 0; it < iters; ++it)
    if (rda_fwd_run(b, &plan, &k, &a, &err)) goto done;
  if (b->synchronize(b, &err)) goto done;
  const double per = (now_s() - t0) / (double)iters;
  const double flops = effective_flops(&cfg, batch, n);
  /* The first branch's kernel names the path timed (a "_wg" suffix: wgmma, RDA_WGMMA=1). */
  printf("{\"bench\": \"fwd\", \"config\": \"%s\", \"device\": \"%s\", \"kernel\": \"%s\", "
         "\"n\": %lld, \"batch\": %lld, \"ms\": %.4f, \"effective_tflops\": %.2f}\n",
         config, hw.name, plan.variants[plan.steps[0].kernel].name, n, batch, per * 1e3,
         flops / per * 1e-12);
  rc = 0;
done:
  if (rc != 0) fprintf(stderr, "rda_bench_fwd: error: %s\n", err.msg);
  for (int i = 0; i < 5; ++i)
    if (buf[i] != NULL) b->free(b, buf[i]);
  if (b != NULL) rda_fwd_unload(b, &k);
  rda_plan_k_free(&plan);
  if (b != NULL) b->destroy(b);
  rda_gen_close(g);
  return rc;
}
