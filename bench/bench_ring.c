/* bench_ring.c — the ring on P virtual ranks of one device against the single-device passes
 * (issue 5: at most 1.15x the single-device time at N = 262144 with P = 8). Both run the same
 * config on the same inputs; the ring's time per pass is the slowest rank's, from a barrier of
 * all ranks to a barrier after each rank's device synchronization. Prints one JSON line for
 * bench/results/. --backend emu runs it on the CPU emulator (a smoke test, not a timing). */
#include "backend.h"
#include "bwd.h"
#include "fwd.h"
#include "gen.h"
#include "kernel_times.h"
#include "reference.h"
#include "ring_plan.h"
#include "ring_virtual.h"
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

static int usage(void) {
  fprintf(stderr,
          "usage: rda_bench_ring CONFIG [--n N] [--ranks P] [--batch B] [--iters K]\n"
          "                      [--backward 0|1] [--layout contiguous|zigzag]\n"
          "                      [--backend cuda|emu] [--trace FILE] [--timeline FILE]\n"
          "                      [--kernel-times FILE]\n"
          "  --trace     write each rank's host timeline of the last timed forward pass as JSON:\n"
          "              per virtual step [wait began, wait ended, next posted, launched], and\n"
          "              the own rows' launch, the last launch and the device sync, in ms from\n"
          "              the earliest rank's start\n"
          "  --timeline  after the timed passes, one more forward (and backward) pass timed on\n"
          "              the device: when each rank's stream reached each point, in ms after one\n"
          "              reference event; JSON to FILE, a summary per rank on stdout\n"
          "  --kernel-times  after the single-device timed passes (before the ring's), one more\n"
          "              single-device forward (and backward) pass with a timed event pair\n"
          "              around every kernel launch: per kernel variant its launches and summed\n"
          "              device ms on stdout, and one JSON line appended to FILE (so several\n"
          "              runs can share one file)\n");
  return 2;
}

/* --kernel-times: where the profiled pass's numbers go. */
typedef struct kt_job {
  const char *path, *config, *backend;
  double fwd_ms, bwd_ms; /* sums over the kernels (out) */
} kt_job;

/* One pass through kb (a kernel-times wrapper over b) with a timed event pair of b's around
 * it: the pass's device time and its per-kernel totals (*t malloc'd). */
static rda_status profile_pass(rda_backend *b, rda_backend *kb, const rda_plan_k *plan,
                               const rda_fwd_kernels *kk, const rda_fwd_args *a,
                               const rda_bwd_args *ga, void *const ev[2], rda_kernel_time **t,
                               int *nt, double *kernels_ms, double *pass_ms, rda_err *err) {
  rda_kernel_times_reset(kb);
  rda_status s = b->event_record(b, ev[0], err);
  if (s == RDA_OK)
    s = ga == NULL ? rda_fwd_run(kb, plan, kk, a, err) : rda_bwd_run(kb, plan, kk, ga, err);
  if (s == RDA_OK) s = b->event_record(b, ev[1], err);
  if (s == RDA_OK) s = b->synchronize(b, err);
  float ms = 0.0f;
  if (s == RDA_OK) s = b->event_elapsed_ms(b, ev[0], ev[1], &ms, err);
  *pass_ms = ms;
  if (s == RDA_OK) s = rda_kernel_times_collect(kb, t, nt, kernels_ms, err);
  return s;
}

static void write_kernels_json(FILE *f, const rda_kernel_time *t, int n) {
  fprintf(f, "[");
  for (int i = 0; i < n; ++i)
    fprintf(f, "%s{\"name\": \"%s\", \"kind\": \"%s\", \"launches\": %lld, \"ms\": %.4f}",
            i ? ", " : "", t[i].name, t[i].kind, t[i].launches, t[i].ms);
  fprintf(f, "]");
}

/* After the timed passes: one forward (and, with ga, backward) pass on b through a
 * kernel-times wrapper, with the plan's kernels loaded through it; the summary on stdout and
 * one JSON line appended to job->path. Not one of the timed passes. */
static rda_status kernel_times(kt_job *job, rda_backend *b, const rda_plan_k *plan,
                               const rda_fwd_args *a, const rda_bwd_args *ga, const char *device,
                               rda_err *err) {
  rda_backend *kb = NULL;
  rda_fwd_kernels kk = {0};
  void *ev[2] = {NULL, NULL};
  rda_kernel_time *tf = NULL, *tb = NULL;
  int nf = 0, nb = 0;
  double fwd_pass = 0, bwd_pass = 0;
  rda_status s = rda_kernel_times_wrap(b, &kb, err);
  if (s == RDA_OK) s = rda_fwd_load(kb, plan, &kk, err);
  for (int i = 0; i < 2 && s == RDA_OK; ++i) s = b->event_create_timed(b, &ev[i], err);
  /* A warm-up pass through the wrapper first (profile_pass drops its records): modules just
   * loaded may load lazily at their first launch (CUDA's lazy loading), on the host between
   * that launch's events. */
  if (s == RDA_OK) s = rda_fwd_run(kb, plan, &kk, a, err);
  if (s == RDA_OK && ga != NULL) s = rda_bwd_run(kb, plan, &kk, ga, err);
  if (s == RDA_OK) s = b->synchronize(b, err);
  if (s == RDA_OK)
    s = profile_pass(b, kb, plan, &kk, a, NULL, ev, &tf, &nf, &job->fwd_ms, &fwd_pass, err);
  if (s == RDA_OK && ga != NULL)
    s = profile_pass(b, kb, plan, &kk, a, ga, ev, &tb, &nb, &job->bwd_ms, &bwd_pass, err);
  if (s == RDA_OK) {
    rda_kernel_times_print(stdout, "kernel times fwd", tf, nf, job->fwd_ms, fwd_pass);
    if (ga != NULL)
      rda_kernel_times_print(stdout, "kernel times bwd", tb, nb, job->bwd_ms, bwd_pass);
    rda_err wg_err = {0};
    FILE *f = fopen(job->path, "a");
    if (f == NULL) {
      s = rda_err_set(err, RDA_ERR_IO, "--kernel-times %s: cannot write", job->path);
    } else {
      fprintf(f, "{\"bench\": \"kernel_times\", \"config\": \"%s\", \"device\": \"%s\", "
                 "\"backend\": \"%s\", \"n\": %lld, \"batch\": %lld, \"wgmma_env\": %d, "
                 "\"fwd_pass_ms\": %.4f, \"fwd_kernels_ms\": %.4f, \"forward\": ",
              job->config, device, job->backend, a->n, a->batch,
              rda_gen_wgmma_env(&wg_err) == 1, fwd_pass, job->fwd_ms);
      write_kernels_json(f, tf, nf);
      if (ga != NULL)
        fprintf(f, ", \"bwd_pass_ms\": %.4f, \"bwd_kernels_ms\": %.4f", bwd_pass, job->bwd_ms);
      fprintf(f, ", \"backward\": ");
      write_kernels_json(f, tb, nb);
      fprintf(f, "}\n");
      if (fclose(f) != 0)
        s = rda_err_set(err, RDA_ERR_IO, "--kernel-times %s: cannot write", job->path);
    }
  }
  free(tf);
  free(tb);
  for (int i = 0; i < 2; ++i)
    if (ev[i] != NULL) b->event_destroy(b, ev[i]);
  if (kb != NULL) {
    rda_fwd_unload(kb, &kk);
    kb->destroy(kb);
  }
  return s;
}

/* Mean seconds of the single-device forward (and backward) over iters, after a warm-up. */
static rda_status single_device(const char *backend, rda_gen *g, const rda_config *cfg,
                                long long B, long long N, const uint16_t *q, const uint16_t *k,
                                const uint16_t *v, const uint16_t *dout, int iters,
                                double *fwd_s, double *bwd_s, char *device, size_t device_len,
                                kt_job *kt, rda_err *err) {
  rda_backend *b = NULL;
  rda_plan_k plan;
  memset(&plan, 0, sizeof plan);
  rda_fwd_kernels kern = {0};
  void *m[10] = {0};
  rda_hw hw;
  char why[512];
  const long long H = cfg->heads, Hkv = cfg->kv_heads, D = cfg->head_dim;
  const size_t nq = (size_t)(B * N * H * D), nk = (size_t)(B * N * Hkv * D);
  const size_t nl = (size_t)(B * H * N);
  rda_status s = rda_backend_open(backend, &b, why, sizeof why, err);
  if (s == RDA_OK) s = rda_backend_hw(b, g, &hw, err);
  if (s == RDA_OK) snprintf(device, device_len, "%s", hw.name);
  if (s == RDA_OK)
    s = rda_gen_plan_ex(g, cfg, &hw, dout != NULL ? RDA_PLAN_BACKWARD : 0u, &plan, err);
  if (s == RDA_OK) s = rda_fwd_load(b, &plan, &kern, err);
  const size_t sizes[10] = {nq * 2, nk * 2, nk * 2, nq * 4, nl * 4,
                            nq * 2, nq * 4, nk * 4, nk * 4, rda_bwd_workspace_bytes(&plan, B, N)};
  const int nbuf = dout != NULL ? 10 : 5;
  for (int i = 0; i < nbuf && s == RDA_OK; ++i) s = b->alloc(b, sizes[i], &m[i], err);
  const uint16_t *in[4] = {q, k, v, dout};
  const int slot[4] = {0, 1, 2, 5};
  for (int i = 0; i < (dout != NULL ? 4 : 3) && s == RDA_OK; ++i)
    s = b->upload(b, m[slot[i]], in[i], sizes[slot[i]], err);
  rda_fwd_args a;
  rda_fwd_args_contiguous(&a, cfg, B, N, m[0], m[1], m[2], m[3], m[4]);
  rda_bwd_args ga;
  rda_bwd_args_like_fwd(&ga, &a, m[5], NULL, m[6], m[7], m[8], m[9]);
  for (int pass = 0; pass < (dout != NULL ? 2 : 1) && s == RDA_OK; ++pass) {
    /* One warm-up call, then the timed ones. */
    for (int it = 0; it <= iters && s == RDA_OK; ++it) {
      const double t0 = now_s();
      s = pass == 0 ? rda_fwd_run(b, &plan, &kern, &a, err) : rda_bwd_run(b, &plan, &kern, &ga, err);
      if (s == RDA_OK) s = b->synchronize(b, err);
      if (it > 0) *(pass == 0 ? fwd_s : bwd_s) += (now_s() - t0) / iters;
    }
  }
  if (s == RDA_OK && kt->path != NULL)
    s = kernel_times(kt, b, &plan, &a, dout != NULL ? &ga : NULL, device, err);
  for (int i = 0; i < 10; ++i)
    if (m[i] != NULL) b->free(b, m[i]);
  if (b != NULL) rda_fwd_unload(b, &kern);
  rda_plan_k_free(&plan);
  if (b != NULL) b->destroy(b);
  return s;
}

/* Normal draws rounded to the dtype. Drawing billions of values would take minutes of the
 * device session: a block of 2^20 fresh draws is repeated at a drifting offset, so no two rows
 * of a tile repeat and the kernels see realistic magnitudes. */
static uint16_t *random_bits(size_t n, int dtype, rda_rng *rng) {
  enum { BLOCK = 1 << 20 };
  uint16_t *x = malloc(n * 2);
  if (x == NULL) return NULL;
  const size_t fresh = n < BLOCK ? n : BLOCK;
  for (size_t i = 0; i < fresh; ++i) x[i] = rda_to_dtype_bits(rda_rng_normal(rng), dtype);
  for (size_t at = fresh, shift = 1; at < n; at += fresh, shift = shift * 7 % fresh + 1) {
    const size_t len = n - at < fresh ? n - at : fresh;
    for (size_t i = 0; i < len; ++i) x[at + i] = x[(i + shift) % fresh];
  }
  return x;
}

/* The ranks' traces as JSON, ms from the earliest rank's start. */
static rda_status write_trace(const char *path, const rda_ring_trace *t, int ranks, rda_err *err) {
  double t0 = t[0].begin;
  for (int p = 1; p < ranks; ++p)
    if (t[p].begin < t0) t0 = t[p].begin;
  FILE *f = fopen(path, "w");
  if (f == NULL) return rda_err_set(err, RDA_ERR_IO, "--trace %s: cannot write", path);
  fprintf(f, "{\"ranks\": [\n");
  for (int p = 0; p < ranks; ++p) {
    const rda_ring_trace *r = &t[p];
    fprintf(f, "  {\"rank\": %d, \"begin\": %.3f, \"own\": %.3f, \"end\": %.3f, \"synced\": %.3f, "
               "\"steps\": %d, \"step_ms\": [",
            p, (r->begin - t0) * 1e3, (r->own - t0) * 1e3, (r->end - t0) * 1e3,
            (r->synced - t0) * 1e3, r->count);
    const int n = r->count < r->cap ? r->count : r->cap;
    for (int i = 0; i < n; ++i) {
      const rda_ring_trace_step *s = &r->steps[i];
      fprintf(f, "%s[%.3f, %.3f, %.3f, %.3f]", i ? ", " : "", (s->wait0 - t0) * 1e3,
              (s->wait1 - t0) * 1e3, (s->posted - t0) * 1e3, (s->computed - t0) * 1e3);
    }
    fprintf(f, "]}%s\n", p + 1 < ranks ? "," : "");
  }
  fprintf(f, "]}\n");
  if (fclose(f) != 0) return rda_err_set(err, RDA_ERR_IO, "--trace %s: cannot write", path);
  return RDA_OK;
}

/* One pass's device timelines as a JSON object, ms after the reference event. */
static void write_timeline_pass(FILE *f, const char *pass, const rda_ring_timeline *t,
                                int ranks) {
  fprintf(f, "  {\"pass\": \"%s\", \"ranks\": [\n", pass);
  for (int p = 0; p < ranks; ++p) {
    const rda_ring_timeline *r = &t[p];
    fprintf(f, "    {\"rank\": %d, \"begin\": %.4f, \"own\": %.4f, \"end\": %.4f, "
               "\"steps\": %d, \"step_ms\": [",
            p, r->begin, r->own, r->end, r->count);
    const int n = r->count < r->cap ? r->count : r->cap;
    for (int i = 0; i < n; ++i) {
      const rda_ring_timeline_step *s = &r->steps[i];
      fprintf(f, "%s{\"i\": %d, \"arrived\": %.4f, \"posted\": %.4f, \"computed\": %.4f}",
              i ? ", " : "", i, s->arrived, s->posted, s->computed);
    }
    fprintf(f, "]}%s\n", p + 1 < ranks ? "," : "");
  }
  fprintf(f, "  ]}");
}

static rda_status write_timeline(const char *path, const rda_ring_timeline *fwd,
                                 const rda_ring_timeline *bwd, int ranks, rda_err *err) {
  FILE *f = fopen(path, "w");
  if (f == NULL) return rda_err_set(err, RDA_ERR_IO, "--timeline %s: cannot write", path);
  fprintf(f, "{\"unit\": \"ms after the reference event\", \"passes\": [\n");
  write_timeline_pass(f, "fwd", fwd, ranks);
  if (bwd != NULL) {
    fprintf(f, ",\n");
    write_timeline_pass(f, "bwd", bwd, ranks);
  }
  fprintf(f, "\n]}\n");
  if (fclose(f) != 0) return rda_err_set(err, RDA_ERR_IO, "--timeline %s: cannot write", path);
  return RDA_OK;
}

/* Per rank: where its stream's time went (ring.h, rda_ring_trace_dev), then the last to end. */
static void print_timeline_summary(const char *pass, const rda_ring_timeline *t, int ranks) {
  int last = 0;
  for (int p = 0; p < ranks; ++p) {
    const rda_ring_timeline *r = &t[p];
    const int n = r->count < r->cap ? r->count : r->cap;
    double stalled = 0, post = 0, compute = 0, prev = r->own;
    for (int i = 0; i < n; ++i) {
      const rda_ring_timeline_step *s = &r->steps[i];
      stalled += s->arrived - prev;
      post += s->posted - s->arrived;
      compute += s->computed - s->posted;
      prev = s->computed;
    }
    printf("timeline %s: rank %d: %d steps%s, init done at %.3f ms, own rows done at %.3f ms, "
           "stalled %.3f ms, pack/post %.3f ms, compute %.3f ms, finished at %.3f ms\n",
           pass, p, r->count, n < r->count ? " (sums over the kept ones)" : "", r->begin, r->own,
           stalled, post, compute, r->end);
    if (r->end > t[last].end) last = p;
  }
  double first = t[0].end;
  for (int p = 1; p < ranks; ++p)
    if (t[p].end < first) first = t[p].end;
  printf("timeline %s: rank %d finished last, at %.3f ms (the first rank at %.3f ms)\n", pass,
         last, t[last].end, first);
}

/* `ranks` timelines of cap steps each, or NULL. */
static rda_ring_timeline *timelines_new(long long ranks, int cap) {
  rda_ring_timeline *t = calloc((size_t)ranks, sizeof *t);
  for (long long p = 0; t != NULL && p < ranks; ++p) {
    t[p].cap = cap;
    if ((t[p].steps = calloc((size_t)cap, sizeof *t[p].steps)) != NULL) continue;
    for (long long q = 0; q < p; ++q) free(t[q].steps);
    free(t);
    t = NULL;
  }
  return t;
}

static void timelines_free(rda_ring_timeline *t, long long ranks) {
  for (long long p = 0; t != NULL && p < ranks; ++p) free(t[p].steps);
  free(t);
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  const char *config = argv[1], *backend = "cuda", *layout_name = "contiguous", *trace = NULL;
  const char *timeline = NULL, *kernel_times_path = NULL;
  long long n = 262144, ranks = 8, batch = 1, iters = 10, backward = 1;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--backend") == 0) {
      backend = argv[i + 1];
      continue;
    }
    if (strcmp(argv[i], "--layout") == 0) {
      layout_name = argv[i + 1];
      continue;
    }
    if (strcmp(argv[i], "--trace") == 0) {
      trace = argv[i + 1];
      continue;
    }
    if (strcmp(argv[i], "--timeline") == 0) {
      timeline = argv[i + 1];
      continue;
    }
    if (strcmp(argv[i], "--kernel-times") == 0) {
      kernel_times_path = argv[i + 1];
      continue;
    }
    long long *dst = strcmp(argv[i], "--n") == 0          ? &n
                     : strcmp(argv[i], "--ranks") == 0    ? &ranks
                     : strcmp(argv[i], "--batch") == 0    ? &batch
                     : strcmp(argv[i], "--iters") == 0    ? &iters
                     : strcmp(argv[i], "--backward") == 0 ? &backward
                                                          : NULL;
    if (dst == NULL) return usage();
    *dst = atoll(argv[i + 1]);
  }
  const int layout = rda_ring_layout_parse(layout_name);
  if (n < 1 || ranks < 1 || batch < 1 || iters < 1 || backward < 0 || backward > 1 ||
      layout < 0 || (strcmp(backend, "cuda") != 0 && strcmp(backend, "emu") != 0))
    return usage();
  rda_err err = {0};
  rda_gen *g = NULL;
  rda_config cfg;
  int rc = 1;
  uint16_t *in[4] = {0};
  float *out[5] = {0};
  rda_ring_trace *traces = NULL;
  rda_ring_timeline *tl_fwd = NULL, *tl_bwd = NULL;
  rda_ring_run_stats *stats = calloc((size_t)ranks, sizeof *stats);
  if (stats == NULL || rda_gen_open(&g, &err) != RDA_OK ||
      rda_gen_config_file(g, config, &cfg, &err) != RDA_OK)
    goto done;
  const long long H = cfg.heads, Hkv = cfg.kv_heads, D = cfg.head_dim;
  const size_t nq = (size_t)(batch * n * H * D), nk = (size_t)(batch * n * Hkv * D);
  rda_rng rng;
  rda_rng_seed(&rng, 11);
  in[0] = random_bits(nq, cfg.dtype, &rng);
  in[1] = random_bits(nk, cfg.dtype, &rng);
  in[2] = random_bits(nk, cfg.dtype, &rng);
  in[3] = backward ? random_bits(nq, cfg.dtype, &rng) : NULL;
  const size_t out_n[5] = {nq, (size_t)(batch * H * n), nq, nk, nk};
  for (int i = 0; i < (backward ? 5 : 2); ++i) out[i] = malloc(out_n[i] * sizeof(float));
  if (!in[0] || !in[1] || !in[2] || (backward && !in[3]) || !out[0] || !out[1] ||
      (backward && (!out[2] || !out[3] || !out[4]))) {
    rda_err_set(&err, RDA_ERR_OUT_OF_MEMORY, "out of host memory for n = %lld", n);
    goto done;
  }
  double single_fwd = 0, single_bwd = 0;
  char device[128] = "";
  kt_job kt = {.path = kernel_times_path, .config = config, .backend = backend};
  if (single_device(backend, g, &cfg, batch, n, in[0], in[1], in[2], in[3], (int)iters,
                    &single_fwd, &single_bwd, device, sizeof device, &kt, &err) != RDA_OK)
    goto done;
  enum { TRACE_STEPS = 4096 };
  if (trace != NULL) traces = calloc((size_t)ranks, sizeof *traces);
  for (long long p = 0; traces != NULL && p < ranks; ++p) {
    traces[p].cap = TRACE_STEPS;
    traces[p].steps = calloc(TRACE_STEPS, sizeof *traces[p].steps);
    if (traces[p].steps == NULL) {
      rda_err_set(&err, RDA_ERR_OUT_OF_MEMORY, "out of host memory for the trace");
      goto done;
    }
  }
  if (trace != NULL && traces == NULL) {
    rda_err_set(&err, RDA_ERR_OUT_OF_MEMORY, "out of host memory for the trace");
    goto done;
  }
  if (timeline != NULL && ((tl_fwd = timelines_new(ranks, TRACE_STEPS)) == NULL ||
                           (backward && (tl_bwd = timelines_new(ranks, TRACE_STEPS)) == NULL))) {
    rda_err_set(&err, RDA_ERR_OUT_OF_MEMORY, "out of host memory for the timeline");
    goto done;
  }
  rda_ring_virtual job = {.backend = backend, .ranks = (int)ranks, .layout = layout, .cfg = &cfg,
                          .g = g, .batch = batch, .n = n, .q = in[0], .k = in[1], .v = in[2],
                          .dout = in[3], .o = out[0], .lse = out[1], .dq = out[2],
                          .dk = out[3], .dv = out[4], .stats = stats, .iters = (int)iters,
                          .traces = traces, .timeline_fwd = tl_fwd, .timeline_bwd = tl_bwd};
  if (rda_ring_virtual_run(&job, &err) != RDA_OK) goto done;
  if (trace != NULL && write_trace(trace, traces, (int)ranks, &err) != RDA_OK) goto done;
  if (timeline != NULL) {
    if (write_timeline(timeline, tl_fwd, tl_bwd, (int)ranks, &err) != RDA_OK) goto done;
    print_timeline_summary("fwd", tl_fwd, (int)ranks);
    if (tl_bwd != NULL) print_timeline_summary("bwd", tl_bwd, (int)ranks);
  }
  unsigned long long peak = 0, sent = 0;
  for (long long p = 0; p < ranks; ++p) {
    if (stats[p].peak_bytes > peak) peak = stats[p].peak_bytes;
    sent += stats[p].bytes_sent;
  }
  printf("{\"bench\": \"ring\", \"config\": \"%s\", \"device\": \"%s\", \"backend\": \"%s\", "
         "\"n\": %lld, \"batch\": %lld, \"ranks\": %lld, \"layout\": \"%s\", \"iters\": %lld, "
         "\"fwd_single_ms\": %.4f, \"fwd_ring_ms\": %.4f, \"fwd_ratio\": %.3f, "
         "\"bwd_single_ms\": %.4f, \"bwd_ring_ms\": %.4f, \"bwd_ratio\": %.3f, "
         "\"passes\": \"%s\", \"bytes_sent_all_ranks\": %llu, \"peak_ring_bytes\": %llu",
         config, device, backend, n, batch, ranks, layout_name, iters, single_fwd * 1e3,
         job.fwd_s * 1e3, job.fwd_s / single_fwd, single_bwd * 1e3, job.bwd_s * 1e3,
         backward ? job.bwd_s / single_bwd : 0.0, backward ? "fwd+bwd" : "fwd", sent, peak);
  /* With --kernel-times: the profiled pass's sums over its kernels (not the timed passes'). */
  if (kernel_times_path != NULL) {
    printf(", \"fwd_kernels_ms\": %.4f", kt.fwd_ms);
    if (backward) printf(", \"bwd_kernels_ms\": %.4f", kt.bwd_ms);
  }
  printf("}\n");
  rc = 0;
done:
  if (rc != 0) fprintf(stderr, "rda_bench_ring: error: %s\n", err.msg);
  for (long long p = 0; traces != NULL && p < ranks; ++p) free(traces[p].steps);
  free(traces);
  timelines_free(tl_fwd, ranks);
  timelines_free(tl_bwd, ranks);
  for (int i = 0; i < 4; ++i) free(in[i]);
  for (int i = 0; i < 5; ++i) free(out[i]);
  free(stats);
  rda_gen_close(g);
  return rc;
}
