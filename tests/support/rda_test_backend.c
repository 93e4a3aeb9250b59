/* rda_test_backend.c — the backends kernel-running tests share (emu + optional cuda with
 * hardware profiles), device buffers that fail the test on error, timing, and the padded
 * sequence-first layout. Test-only code: out of memory fails the test. */
// clang-format off
#include "rda_test_backend.h"

#include "rda_test.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */
// clang-format on

int rt_backends_open(rt_backends *s, const char *who) {
  memset(s, 0, sizeof *s);
  rda_err err = {0};
  if (rda_gen_open(&s->gen, &err) != RDA_OK) {
    fprintf(stderr, "%s: rda_gen_open: %s\n", who, err.msg);
    return -1;
  }
  rt_backend *e = &s->be[s->n];
  if (rda_backend_emu_open(&e->b, 90, &err) != RDA_OK ||
      rda_gen_hw_builtin(s->gen, e->b->arch, &e->hw, &err) != RDA_OK) {
    fprintf(stderr, "%s: emu backend: %s\n", who, err.msg);
    return -1;
  }
  s->n++;
  rda_err cerr = {0};
  rt_backend *c = &s->be[s->n];
  if (rda_backend_cuda_open(&c->b, 0, &cerr) == RDA_OK) {
    if (rda_backend_cuda_hw(c->b, &c->hw, &cerr) == RDA_OK) {
      s->n++;
    } else {
      c->b->destroy(c->b);
      c->b = NULL;
    }
  }
  if (s->n == 1)
    fprintf(stderr, "%s: no usable GPU (%s); the cuda backend is skipped, emu only\n", who,
            cerr.msg);
  return 0;
}

void rt_backends_close(rt_backends *s) {
  for (int i = 0; i < s->n; ++i) s->be[i].b->destroy(s->be[i].b);
  s->n = 0;
  rda_gen_close(s->gen);
  s->gen = NULL;
}

int rt_gen_setup(void **state) {
  rda_err err = {0};
  rda_gen *g = NULL;
  if (rda_gen_open(&g, &err) != RDA_OK) {
    fprintf(stderr, "rda_gen_open: %s\n", err.msg);
    return -1;
  }
  *state = g;
  return 0;
}

int rt_gen_teardown(void **state) {
  rda_gen_close(*state);
  return 0;
}

int rt_wgmma_runs_on(const rt_backend *be, const char *what) {
  if (be->hw.arch == 90) return 1;
  fprintf(stderr, "  %-4s %s skipped: the wgmma path needs sm_90 (this is sm_%d)\n", be->b->name,
          what, be->hw.arch);
  return 0;
}

void rt_plan_with_tile(rda_gen *g, const rda_config *cfg, const rda_hw *hw, unsigned flags,
                       const char *kind, const char *tile, rda_plan_k *out, const char *what) {
  rda_err err = {0};
  const rda_gen_force force = {.kind = kind, .branch = 0, .tile = tile};
  if (rda_gen_plan_forced(g, cfg, hw, flags, tile != NULL ? &force : NULL, out, &err) != RDA_OK)
    fail_msg("%s: plan: %s", what, err.msg);
  if (tile == NULL) return;
  const int k = strcmp(kind, "fwd") == 0 ? out->steps[0].kernel : out->bwd_steps[0].dq_kernel;
  if (strcmp(out->variants[k].tile, tile) != 0)
    fail_msg("%s: branch 0's %s runs %s, not tile %s", what, kind, out->variants[k].name, tile);
}

static int g_wgmma_plans; /* plans rt_check_wgmma_plan saw with wgmma variants */

void rt_check_wgmma_plan(const rda_plan_k *plan, const char *kind, int wgmma, const char *what) {
  rda_err err = {0};
  const int env = rda_gen_wgmma_env(&err);
  if (env < 0) fail_msg("%s: %s", what, err.msg);
  int any = 0;
  for (int i = 0; i < plan->nvariants; ++i)
    any |= strcmp(plan->variants[i].kind, kind) == 0 && strstr(plan->variants[i].name, "_wg");
  /* RDA_WGMMA=1 (CTest's test_fwd_wgmma and test_bwd_wgmma, gpu_session.sh): a case that did
   * not ask gets wgmma variants wherever the tile space has them, then all of the kind's. */
  const int want_all = wgmma || (env == 1 && any);
  for (int i = 0; i < plan->nvariants; ++i) {
    const char *name = plan->variants[i].name;
    const int want = want_all && strstr(name, "_qa") == NULL;
    if (strcmp(plan->variants[i].kind, kind) == 0 && (strstr(name, "_wg") != NULL) != want)
      fail_msg("%s: planned %s", what, name);
  }
  g_wgmma_plans += any;
}

int rt_wgmma_env_reached(const char *suite) {
  rda_err err = {0};
  if (rda_gen_wgmma_env(&err) != 1 || g_wgmma_plans > 0) return 0;
  fprintf(stderr, "%s: RDA_WGMMA=1, yet no case planned a wgmma variant\n", suite);
  return 1;
}

void *rt_dev_alloc(rda_backend *b, size_t bytes) {
  rda_err err = {0};
  void *p = NULL;
  if (b->alloc(b, bytes, &p, &err) != RDA_OK) fail_msg("%s alloc: %s", b->name, err.msg);
  return p;
}

void rt_dev_upload(rda_backend *b, void *dst, const void *src, size_t bytes) {
  rda_err err = {0};
  if (b->upload(b, dst, src, bytes, &err) != RDA_OK) fail_msg("%s upload: %s", b->name, err.msg);
}

void rt_dev_download(rda_backend *b, void *dst, const void *src, size_t bytes) {
  rda_err err = {0};
  if (b->download(b, dst, src, bytes, &err) != RDA_OK)
    fail_msg("%s download: %s", b->name, err.msg);
}

float *rt_dev_poisoned(rda_backend *b, size_t count) {
  float *host = malloc(count * sizeof *host);
  assert_non_null(host);
  rt_poison_f32(host, count);
  float *dev = rt_dev_alloc(b, count * sizeof *dev);
  rt_dev_upload(b, dev, host, count * sizeof *dev);
  free(host);
  return dev;
}

float *rt_download_f32(rda_backend *b, const float *dev, size_t count) {
  float *host = malloc(count * sizeof *host);
  assert_non_null(host);
  rt_dev_download(b, host, dev, count * sizeof *host);
  return host;
}

float *rt_dev_lse_f32(rda_backend *b, const double *x, long long batch, long long heads,
                      long long n, const long long s[2]) {
  const size_t count = rt_lse_span(batch, heads, n, s);
  float *host = malloc((count ? count : 1) * sizeof *host);
  assert_non_null(host);
  rt_poison_f32(host, count);
  for (long long ib = 0; ib < batch; ++ib)
    for (long long ih = 0; ih < heads; ++ih)
      for (long long in = 0; in < n; ++in)
        host[ib * s[0] + ih * s[1] + in] = (float)x[(ib * heads + ih) * n + in];
  float *dev = rt_dev_alloc(b, count * sizeof *dev);
  rt_dev_upload(b, dev, host, count * sizeof *host);
  free(host);
  return dev;
}

void rt_strides_seq_first(long long b, long long heads, long long d, long long pad,
                          long long s[3]) {
  s[2] = d + pad;
  s[0] = heads * s[2];
  s[1] = b * s[0];
}
