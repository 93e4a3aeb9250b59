/* cmd_run.c — `rdagen run` (SPEC §4): dilated attention on .npy files. Parse and validate
 * everything (flags, config, input files and shapes, output folders) before any kernel runs;
 * then plan, load, upload, run the forward (and backward) pass and write every output or none. */
#include "args.h"
#include "backend.h"
#include "bwd.h"
#include "commands.h"
#include "config.h"
#include "fwd.h"
#include "gen.h"
#include "npy.h"
#include "reference.h"
#include "json.h"
#include "out_files.h"
#include "ring.h"
#include "ring_plan.h"
#include "ring_virtual.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char run_usage_text[] =
    "usage: rdagen run CONFIG --q Q.npy --k K.npy --v V.npy --o O.npy [--lse LSE.npy]\n"
    "                  [--do DO.npy --dq DQ.npy --dk DK.npy --dv DV.npy]\n"
    "                  [--backend auto|cuda|emu] [--ranks P] [--layout contiguous|zigzag]\n"
    "                  [--stats FILE]\n"
    "\n"
    "Dilated attention (SPEC section 1) of the config on NumPy .npy inputs:\n"
    "  Q [B, N, H, D], K and V [B, N, Hkv, D]: little-endian float16/32/64, C order,\n"
    "  rounded to the config's dtype. Writes O [B, N, H, D] and LSE [B, H, N] as float32.\n"
    "  --do/--dq/--dk/--dv  also the backward pass (all four or none): dO shaped like Q; writes\n"
    "             dQ [B, N, H, D], dK and dV [B, N, Hkv, D] as float32 (dLSE = 0)\n"
    "  --backend  auto (default: cuda when a GPU is usable, else emu), cuda, or emu (the CPU\n"
    "             emulator running the generated kernels)\n"
    "  --ranks    ring ranks (default 1; at most 4096, also more than N: ranks past the\n"
    "             rows hold none): P virtual ranks, threads each given only its own rows\n"
    "             (the emulator over host memory, or one GPU over device memory); the\n"
    "             result (and with --do, the gradients) is gathered\n"
    "  --layout   how rows are split over the ranks: contiguous (default) or zigzag (2P equal\n"
    "             chunks, rank p holds chunks p and 2P-1-p; N must be a multiple of 2P)\n"
    "  --stats    write {\"ranks\": [{\"rank\", \"rows\", \"bytes_sent\", \"bytes_received\",\n"
    "             \"peak_bytes\"}, ...]} of the ring as JSON (with --do, both passes: bytes\n"
    "             summed, the larger peak)\n"
    "Outputs are written all or none, through symbolic links (the file a link leads to is\n"
    "replaced, the link kept); an output must be a regular file or a new name, and no input.\n"
    "Flags may come in any order, as '--flag value' or '--flag=value'.\n";

typedef struct run_opts {
  const char *config;
  const char *q, *k, *v, *o, *lse;
  const char *d_o, *dq, *dk, *dv;
  const char *backend;
  const char *ranks_text;
  long long ranks;
  const char *layout, *stats;
} run_opts;

typedef struct run_flag {
  const char *name;
  size_t offset; /* of the const char * in run_opts */
} run_flag;

static const run_flag run_flags[] = {
    {"q", offsetof(run_opts, q)},
    {"k", offsetof(run_opts, k)},
    {"v", offsetof(run_opts, v)},
    {"o", offsetof(run_opts, o)},
    {"lse", offsetof(run_opts, lse)},
    {"do", offsetof(run_opts, d_o)},
    {"dq", offsetof(run_opts, dq)},
    {"dk", offsetof(run_opts, dk)},
    {"dv", offsetof(run_opts, dv)},
    {"backend", offsetof(run_opts, backend)},
    {"ranks", offsetof(run_opts, ranks_text)},
    {"layout", offsetof(run_opts, layout)},
    {"stats", offsetof(run_opts, stats)},
};

/* Returns -1 to go on, else the exit status (0 for --help). */
static int run_parse(int argc, char **argv, run_opts *o) {
  memset(o, 0, sizeof *o);
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(run_usage_text, stdout);
      return 0;
    }
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
      if (a[0] == '-' && a[1] != '\0') return rdagen_usage("run: unknown option '%s'", a);
      if (o->config != NULL)
        return rdagen_usage("run: more than one config given ('%s' and '%s')", o->config, a);
      o->config = a;
      continue;
    }
    const char *name = a + 2;
    const char *eq = strchr(name, '=');
    const size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
    const run_flag *f = NULL;
    for (size_t j = 0; j < sizeof run_flags / sizeof run_flags[0]; j++)
      if (strlen(run_flags[j].name) == nlen && strncmp(run_flags[j].name, name, nlen) == 0)
        f = &run_flags[j];
    if (f == NULL) return rdagen_usage("run: unknown option '%.*s'", (int)(nlen + 2), a);
    const char *val = rdagen_option_value(argc, argv, &i, eq);
    if (val == NULL) return rdagen_usage("run: --%s needs a value", f->name);
    const char **slot = (const char **)(void *)((char *)o + f->offset);
    if (*slot != NULL) return rdagen_usage("run: --%s given twice", f->name);
    *slot = val;
  }
  if (o->config == NULL) return rdagen_usage("run: no CONFIG given");
  static const char *const required[] = {"q", "k", "v", "o"};
  const char *have[] = {o->q, o->k, o->v, o->o};
  for (int j = 0; j < 4; j++)
    if (have[j] == NULL) return rdagen_usage("run: --%s is required", required[j]);
  const int nback = (o->d_o != NULL) + (o->dq != NULL) + (o->dk != NULL) + (o->dv != NULL);
  if (nback != 0 && nback != 4)
    return rdagen_usage("run: --do, --dq, --dk and --dv go together (the backward pass)");
  if (o->backend == NULL) o->backend = "auto";
  if (strcmp(o->backend, "auto") != 0 && strcmp(o->backend, "cuda") != 0 &&
      strcmp(o->backend, "emu") != 0)
    return rdagen_usage("run: --backend '%s': expected auto, cuda or emu", o->backend);
  o->ranks = 1;
  if (o->ranks_text != NULL) {
    if (!rdagen_parse_count(o->ranks_text, 1, RDA_RING_MAX_RANKS, &o->ranks))
      return rdagen_usage("run: --ranks '%s': expected an integer 1..%d", o->ranks_text,
                          RDA_RING_MAX_RANKS);
  }
  if (o->layout != NULL && rda_ring_layout_parse(o->layout) < 0)
    return rdagen_usage("run: --layout '%s': expected contiguous or zigzag", o->layout);
  const char *outs[] = {o->o, o->lse, o->dq, o->dk, o->dv, o->stats};
  for (int x = 0; x < 6; x++)
    for (int y = x + 1; y < 6; y++)
      if (outs[x] != NULL && outs[y] != NULL && strcmp(outs[x], outs[y]) == 0)
        return rdagen_usage("run: '%s' is named as two outputs", outs[x]);
  return -1;
}

enum { RUN_OUT_O, RUN_OUT_LSE, RUN_OUT_DQ, RUN_OUT_DK, RUN_OUT_DV, RUN_OUT_STATS, RUN_NOUT };
static const char *const run_out_flags[RUN_NOUT] = {"--o",  "--lse", "--dq",
                                                    "--dk", "--dv",  "--stats"};

static void run_out_paths(const run_opts *o, const char *paths[RUN_NOUT]) {
  paths[RUN_OUT_O] = o->o;
  paths[RUN_OUT_LSE] = o->lse;
  paths[RUN_OUT_DQ] = o->dq;
  paths[RUN_OUT_DK] = o->dk;
  paths[RUN_OUT_DV] = o->dv;
  paths[RUN_OUT_STATS] = o->stats;
}

/* Every output, before anything runs: links followed, only a regular file or a new name in a
 * writable folder (exit 1); no two outputs one file, and no output the config or an input, by
 * identity however spelled or linked (exit 2). Returns -1 to go on, else the exit status. */
static int run_check_files(const run_opts *o, rda_out_file files[RUN_NOUT]) {
  const char *paths[RUN_NOUT];
  run_out_paths(o, paths);
  rda_err err = {0};
  for (int i = 0; i < RUN_NOUT; i++)
    if (paths[i] != NULL && rda_out_file_check(paths[i], &files[i], &err) != RDA_OK)
      return rdagen_fail("%s", err.msg);
  for (int i = 0; i < RUN_NOUT; i++)
    for (int j = i + 1; j < RUN_NOUT; j++)
      if (paths[i] != NULL && paths[j] != NULL && rda_out_file_same(&files[i], &files[j]))
        return rdagen_usage("run: %s '%s' and %s '%s' are the same file", run_out_flags[i],
                            paths[i], run_out_flags[j], paths[j]);
  static const char *const in_flags[] = {"CONFIG", "--q", "--k", "--v", "--do"};
  const char *const ins[] = {o->config, o->q, o->k, o->v, o->d_o};
  for (size_t a = 0; a < sizeof ins / sizeof ins[0]; a++) {
    struct stat st;
    if (ins[a] == NULL || stat(ins[a], &st) != 0) continue; /* reading it says what is wrong */
    for (int i = 0; i < RUN_NOUT; i++)
      if (paths[i] != NULL && rda_out_file_is(&files[i], &st))
        return rdagen_usage("run: %s '%s' and %s '%s' are the same file: the output would "
                            "replace the input",
                            in_flags[a], ins[a], run_out_flags[i], paths[i]);
  }
  return -1;
}

static void run_shape_text(char *buf, size_t cap, int ndim, const long long *shape) {
  size_t len = (size_t)snprintf(buf, cap, "(");
  for (int i = 0; i < ndim && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%lld%s", shape[i],
                            ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
  if (len < cap) snprintf(buf + len, cap - len, ")");
}

/* Q: [B, N, H, D] with any B, N >= 1 (they are taken from Q); K, V: [B, N, Hkv, D]. */
static int run_check_shape(const char *flag, const char *path, const rda_npy *a, const char *dims,
                           long long b, long long n, long long h, long long d) {
  const long long want[4] = {b, n, h, d};
  int ok = a->ndim == 4;
  for (int i = 0; ok && i < 4; i++)
    if (want[i] > 0 && a->shape[i] != want[i]) ok = 0;
  if (ok && (a->shape[0] < 1 || a->shape[1] < 1)) ok = 0;
  if (ok) return 0;
  char got[160], exp[160];
  run_shape_text(got, sizeof got, a->ndim, a->shape);
  if (b > 0)
    snprintf(exp, sizeof exp, "(%lld, %lld, %lld, %lld)", b, n, h, d);
  else
    snprintf(exp, sizeof exp, "(B, N, %lld, %lld) with B, N >= 1", h, d);
  /* Keys of another length than the queries: say what that would be. */
  const int cross = b > 0 && a->ndim == 4 && a->shape[1] != n && strcmp(flag, "--do") != 0;
  return rdagen_fail("%s: %s has shape %s; expected %s %s = %s%s", path, flag, got, dims,
                     b > 0 ? "(the B and N of --q)" : "from the config", exp,
                     cross ? RDA_CROSS_ATTENTION_NOTE : "");
}

/* x as an error message shows it: NaN without a sign (printf may say "-nan"), else %g. */
static const char *run_value_text(double x, char *buf, size_t cap) {
  if (isnan(x))
    snprintf(buf, cap, "NaN");
  else
    snprintf(buf, cap, "%g", x);
  return buf;
}

/* "[i0, i1, ...]": the index of flat element i of a C-order array of ndim (<= 4) dims. */
static const char *run_index_text(size_t i, int ndim, const long long *shape, char *buf,
                                  size_t cap) {
  long long idx[4] = {0, 0, 0, 0};
  for (int d = ndim - 1; d >= 0; d--) {
    idx[d] = (long long)(i % (size_t)shape[d]);
    i /= (size_t)shape[d];
  }
  size_t len = (size_t)snprintf(buf, cap, "[%lld", idx[0]);
  for (int d = 1; d < ndim && len < cap; d++)
    len += (size_t)snprintf(buf + len, cap - len, ", %lld", idx[d]);
  if (len < cap) snprintf(buf + len, cap - len, "]");
  return buf;
}

/* Every element of an input finite, and finite once rounded to the config's dtype (fp16 holds
 * |x| <= 65504): anything else makes the whole result NaN. */
static int run_check_values(const char *flag, const char *path, const rda_npy *a, int dtype) {
  const double maxv = dtype == RDA_DTYPE_FP16 ? 65504.0 : 3.3895313892515355e38;
  for (size_t i = 0; i < a->count; i++) {
    const double x = a->data[i];
    if (isfinite(x) && isfinite(rda_round_to_dtype(x, dtype))) continue;
    char at[128], val[64];
    return rdagen_fail("%s: %s element %s is %s; inputs must be finite and within %s's range "
                       "once rounded (|x| <= %g)",
                       path, flag, run_index_text(i, 4, a->shape, at, sizeof at),
                       run_value_text(x, val, sizeof val), rda_dtype_name(dtype), maxv);
  }
  return 0;
}

typedef struct run_state {
  rda_gen *g;
  rda_backend *b;
  rda_plan_k plan;
  rda_fwd_kernels kernels;
  rda_npy q, k, v, d_o;                 /* inputs as read (float64) */
  uint16_t *qb, *kb, *vb, *dob;         /* inputs rounded to the storage dtype */
  float *o, *lse, *gq, *gk, *gv;        /* host results: O, LSE, dQ, dK, dV */
  void *dev_q, *dev_k, *dev_v, *dev_do; /* backend memory: storage dtype */
  void *dev_o, *dev_lse, *dev_dq, *dev_dk, *dev_dv, *dev_ws; /* fp32, workspace */
} run_state;

static void run_free(run_state *s) {
  if (s->b != NULL) {
    void *bufs[] = {s->dev_q,   s->dev_k,  s->dev_v,  s->dev_do, s->dev_o,
                    s->dev_lse, s->dev_dq, s->dev_dk, s->dev_dv, s->dev_ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
      if (bufs[i] != NULL) s->b->free(s->b, bufs[i]);
    rda_fwd_unload(s->b, &s->kernels);
  }
  rda_plan_k_free(&s->plan);
  if (s->b != NULL) s->b->destroy(s->b);
  rda_gen_close(s->g);
  rda_npy_free(&s->q);
  rda_npy_free(&s->k);
  rda_npy_free(&s->v);
  rda_npy_free(&s->d_o);
  void *host[] = {s->qb, s->kb, s->vb, s->dob, s->o, s->lse, s->gq, s->gk, s->gv};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}

static uint16_t *run_to_bits(const rda_npy *a, int dtype) {
  uint16_t *bits = malloc((a->count ? a->count : 1) * sizeof *bits);
  if (bits == NULL) return NULL;
  for (size_t i = 0; i < a->count; i++) bits[i] = rda_to_dtype_bits(a->data[i], dtype);
  return bits;
}

/* One .npy output's content. */
typedef struct run_npy_out {
  int ndim;
  long long shape[4];
  const float *data;
} run_npy_out;

static rda_status run_write_npy(int fd, const char *path, const void *ctx, rda_err *err) {
  const run_npy_out *w = ctx;
  return rda_npy_write_f32_fd(fd, path, w->ndim, w->shape, w->data, err);
}

/* The ring's statistics as JSON text ending in a newline, into j (the caller frees it). */
static int run_stats_json(rda_json *j, const rda_ring_run_stats *stats, int P) {
  rda_err err = {0};
  rda_json_object_begin(j);
  rda_json_key(j, "ranks");
  rda_json_array_begin(j);
  for (int p = 0; p < P; ++p) {
    rda_json_object_begin(j);
    rda_json_key(j, "rank");
    rda_json_int(j, p);
    rda_json_key(j, "rows");
    rda_json_int(j, (long long)stats[p].rows);
    rda_json_key(j, "bytes_sent");
    rda_json_int(j, (long long)stats[p].bytes_sent);
    rda_json_key(j, "bytes_received");
    rda_json_int(j, (long long)stats[p].bytes_received);
    rda_json_key(j, "peak_bytes");
    rda_json_int(j, (long long)stats[p].peak_bytes);
    rda_json_object_end(j);
  }
  rda_json_array_end(j);
  rda_json_object_end(j);
  if (rda_json_finish(j, &err) != RDA_OK) return rdagen_fail("--stats: %s", err.msg);
  return 0;
}

/* A result element that is NaN or infinite (LSE: +inf; -inf is a row no branch covers) means
 * the true value left float32 (a huge scale, or huge inputs): say which, write nothing. */
/* " (--o 'o.npy')", or " (not requested)" for an output computed but not asked for. */
static const char *run_output_text(const char *flag, const char *path, char *buf, size_t cap) {
  if (path != NULL)
    snprintf(buf, cap, " (%s '%s')", flag, path);
  else
    snprintf(buf, cap, " (not requested)");
  return buf;
}

static int run_check_result(const char *what, const char *flag, const char *path, const float *x,
                            int ndim, const long long *shape, int lse) {
  size_t count = 1;
  for (int d = 0; d < ndim; d++) count *= (size_t)shape[d];
  for (size_t i = 0; i < count; i++) {
    if (isfinite(x[i]) || (lse && isinf(x[i]) && x[i] < 0)) continue;
    char named[4200], at[128], val[64];
    return rdagen_fail("%s%s element %s is %s: the result overflows float32 (inputs or scale too "
                       "large); no output written",
                       what, run_output_text(flag, path, named, sizeof named),
                       run_index_text(i, ndim, shape, at, sizeof at),
                       run_value_text(x[i], val, sizeof val));
  }
  return 0;
}

/* LSE is -inf only on rows no branch covers (SPEC §1); -inf on a covered row is an underflow
 * of its scores. */
static int run_check_uncovered(const char *path, const rda_config *cfg, const float *lse,
                               long long B, long long N) {
  const long long H = cfg->heads;
  for (long long h = 0; h < H; h++)
    for (long long n = 0; n < N; n++) {
      /* Coverage is the config's (SPEC §1), not read off O: a covered row whose scores all
       * underflowed in fp32 looks uncovered there (O = 0, LSE = -inf). */
      if (!rda_config_covers(cfg, N, (int)h, n)) continue;
      for (long long b = 0; b < B; b++)
        if (isinf(lse[(b * H + h) * N + n])) {
          char named[4200];
          return rdagen_fail("LSE%s element [%lld, %lld, %lld] is -inf on a row with keys: the "
                             "result overflows float32 (inputs or scale too large); no output "
                             "written",
                             run_output_text("--lse", path, named, sizeof named), b, h, n);
        }
    }
  return 0;
}

/* Every output (the gradients only with --do, the stats only when given), every one or none:
 * the results are checked first, then rda_out_files_replace writes them (runtime/out_files.h
 * says exactly what holds on a failure: each target as before, nothing new left). */
static int run_write_results(const run_opts *opt, const rda_out_file files[RUN_NOUT],
                             const rda_config *cfg, const run_state *s, long long B, long long N,
                             int backward, const rda_out_bytes *stats) {
  const long long H = cfg->heads, Hkv = cfg->kv_heads, D = cfg->head_dim;
  const run_npy_out npy[5] = {
      {4, {B, N, H, D}, s->o},     {3, {B, H, N, 0}, s->lse},    {4, {B, N, H, D}, s->gq},
      {4, {B, N, Hkv, D}, s->gk}, {4, {B, N, Hkv, D}, s->gv},
  };
  static const char *const what[5] = {"O", "LSE", "dQ", "dK", "dV"};
  const char *paths[RUN_NOUT];
  run_out_paths(opt, paths);
  for (int i = 0; i < (backward ? 5 : 2); i++)
    if (run_check_result(what[i], run_out_flags[i], paths[i], npy[i].data, npy[i].ndim,
                         npy[i].shape, i == RUN_OUT_LSE) != 0)
      return 1;
  if (run_check_uncovered(paths[RUN_OUT_LSE], cfg, s->lse, B, N) != 0) return 1;
  rda_out_job jobs[RUN_NOUT];
  int n = 0;
  for (int i = 0; i < 5; i++)
    if (paths[i] != NULL && (i < RUN_OUT_DQ || backward))
      jobs[n++] = (rda_out_job){&files[i], run_write_npy, &npy[i]};
  if (stats != NULL && paths[RUN_OUT_STATS] != NULL)
    jobs[n++] = (rda_out_job){&files[RUN_OUT_STATS], rda_out_write_bytes, stats};
  rda_err err = {0};
  if (rda_out_files_replace(jobs, n, NULL, &err) != RDA_OK) return rdagen_fail("%s", err.msg);
  return 0;
}

static int run_attention(const run_opts *opt, const rda_out_file files[RUN_NOUT],
                         const rda_config *cfg, run_state *s) {
  rda_err err = {0};
  const int backward = opt->d_o != NULL;
  const long long B = s->q.shape[0], N = s->q.shape[1];
  const long long H = cfg->heads;
  const size_t nq = s->q.count, nk = s->k.count, nl = (size_t)(B * H * N);

  s->qb = run_to_bits(&s->q, cfg->dtype);
  s->kb = run_to_bits(&s->k, cfg->dtype);
  s->vb = run_to_bits(&s->v, cfg->dtype);
  s->o = malloc(nq * sizeof *s->o);
  s->lse = malloc(nl * sizeof *s->lse);
  if (!s->qb || !s->kb || !s->vb || !s->o || !s->lse)
    return rdagen_fail("out of memory for B = %lld, N = %lld", B, N);
  if (backward) {
    s->dob = run_to_bits(&s->d_o, cfg->dtype);
    s->gq = malloc(nq * sizeof *s->gq);
    s->gk = malloc(nk * sizeof *s->gk);
    s->gv = malloc(nk * sizeof *s->gv);
    if (!s->dob || !s->gq || !s->gk || !s->gv)
      return rdagen_fail("out of memory for B = %lld, N = %lld", B, N);
  }
  /* The inputs are rounded; their float64 copies are no longer needed. */
  rda_npy_free(&s->q);
  rda_npy_free(&s->k);
  rda_npy_free(&s->v);
  rda_npy_free(&s->d_o);

  if (opt->ranks > 1 || opt->stats != NULL || opt->layout != NULL) {
    rda_ring_run_stats *stats = calloc((size_t)opt->ranks, sizeof *stats);
    if (stats == NULL) return rdagen_fail("out of memory for %lld ranks", opt->ranks);
    char why[1024] = "";
    rda_ring_virtual job = {
        .backend = opt->backend,
        .ranks = (int)opt->ranks,
        .layout = opt->layout != NULL ? rda_ring_layout_parse(opt->layout) : RDA_RING_CONTIGUOUS,
        .cfg = cfg,
        .g = s->g,
        .batch = B,
        .n = N,
        .q = s->qb, .k = s->kb, .v = s->vb,
        .dout = backward ? s->dob : NULL,
        .o = s->o, .lse = s->lse,
        .dq = s->gq, .dk = s->gk, .dv = s->gv,
        .stats = stats,
        .why = why,
        .why_len = sizeof why,
    };
    int rc = 0;
    if (rda_ring_virtual_run(&job, &err) != RDA_OK)
      rc = rdagen_fail("%s", err.msg);
    else if (strcmp(opt->backend, "auto") == 0)
      fprintf(stderr, "rdagen: backend: %s (%lld virtual rank%s)\n", why, opt->ranks,
              opt->ranks == 1 ? "" : "s");
    /* The stats file is one more output of the same all-or-nothing write. */
    rda_json j;
    rda_json_init(&j);
    if (rc == 0 && opt->stats != NULL) rc = run_stats_json(&j, stats, (int)opt->ranks);
    free(stats);
    if (rc == 0) {
      const rda_out_bytes text = {opt->stats != NULL ? j.buf : NULL, opt->stats != NULL ? j.len : 0};
      rc = run_write_results(opt, files, cfg, s, B, N, backward, &text);
    }
    rda_json_free(&j);
    return rc;
  }

  char why[1024];
  if (rda_backend_open(opt->backend, &s->b, why, sizeof why, &err) != RDA_OK)
    return rdagen_fail("%s", err.msg);
  if (strcmp(opt->backend, "auto") == 0) fprintf(stderr, "rdagen: backend: %s\n", why);
  rda_hw hw;
  if (rda_backend_hw(s->b, s->g, &hw, &err) != RDA_OK ||
      rda_gen_plan_ex(s->g, cfg, &hw, backward ? RDA_PLAN_BACKWARD : 0u, &s->plan, &err) != RDA_OK)
    return rdagen_fail("%s", err.msg);
  if (backward && !s->plan.has_bwd)
    return rdagen_fail(
        "the backward pass (--do/--dq/--dk/--dv) is not yet supported: the plan "
        "for this config on %s has no backward kernels",
        s->b->name);
  if (rda_fwd_load(s->b, &s->plan, &s->kernels, &err) != RDA_OK) return rdagen_fail("%s", err.msg);

  rda_backend *b = s->b;
  if (b->alloc(b, nq * 2, &s->dev_q, &err) != RDA_OK ||
      b->alloc(b, nk * 2, &s->dev_k, &err) != RDA_OK ||
      b->alloc(b, nk * 2, &s->dev_v, &err) != RDA_OK ||
      b->alloc(b, nq * 4, &s->dev_o, &err) != RDA_OK ||
      b->alloc(b, nl * 4, &s->dev_lse, &err) != RDA_OK)
    return rdagen_fail("%s", err.msg);
  /* Poison the outputs: an element no kernel writes comes out NaN, never stale memory. */
  for (size_t i = 0; i < nq; i++) s->o[i] = NAN;
  for (size_t i = 0; i < nl; i++) s->lse[i] = NAN;
  if (b->upload(b, s->dev_q, s->qb, nq * 2, &err) != RDA_OK ||
      b->upload(b, s->dev_k, s->kb, nk * 2, &err) != RDA_OK ||
      b->upload(b, s->dev_v, s->vb, nk * 2, &err) != RDA_OK ||
      b->upload(b, s->dev_o, s->o, nq * 4, &err) != RDA_OK ||
      b->upload(b, s->dev_lse, s->lse, nl * 4, &err) != RDA_OK)
    return rdagen_fail("%s", err.msg);

  rda_fwd_args a;
  rda_fwd_args_contiguous(&a, cfg, B, N, s->dev_q, s->dev_k, s->dev_v, s->dev_o, s->dev_lse);
  if (rda_fwd_run(b, &s->plan, &s->kernels, &a, &err) != RDA_OK ||
      b->synchronize(b, &err) != RDA_OK || b->download(b, s->o, s->dev_o, nq * 4, &err) != RDA_OK ||
      b->download(b, s->lse, s->dev_lse, nl * 4, &err) != RDA_OK)
    return rdagen_fail("%s", err.msg);

  if (backward) {
    const size_t ws = rda_bwd_workspace_bytes(&s->plan, B, N);
    if (b->alloc(b, nq * 2, &s->dev_do, &err) != RDA_OK ||
        b->alloc(b, nq * 4, &s->dev_dq, &err) != RDA_OK ||
        b->alloc(b, nk * 4, &s->dev_dk, &err) != RDA_OK ||
        b->alloc(b, nk * 4, &s->dev_dv, &err) != RDA_OK ||
        (ws > 0 && b->alloc(b, ws, &s->dev_ws, &err) != RDA_OK))
      return rdagen_fail("%s", err.msg);
    for (size_t i = 0; i < nq; i++) s->gq[i] = NAN;
    for (size_t i = 0; i < nk; i++) s->gk[i] = s->gv[i] = NAN;
    if (b->upload(b, s->dev_do, s->dob, nq * 2, &err) != RDA_OK ||
        b->upload(b, s->dev_dq, s->gq, nq * 4, &err) != RDA_OK ||
        b->upload(b, s->dev_dk, s->gk, nk * 4, &err) != RDA_OK ||
        b->upload(b, s->dev_dv, s->gv, nk * 4, &err) != RDA_OK)
      return rdagen_fail("%s", err.msg);
    rda_bwd_args g;
    /* SPEC §4 has no --dlse: dLSE = 0. */
    rda_bwd_args_like_fwd(&g, &a, s->dev_do, NULL, s->dev_dq, s->dev_dk, s->dev_dv, s->dev_ws);
    g.deterministic = 0;
    if (rda_bwd_run(b, &s->plan, &s->kernels, &g, &err) != RDA_OK ||
        b->synchronize(b, &err) != RDA_OK ||
        b->download(b, s->gq, s->dev_dq, nq * 4, &err) != RDA_OK ||
        b->download(b, s->gk, s->dev_dk, nk * 4, &err) != RDA_OK ||
        b->download(b, s->gv, s->dev_dv, nk * 4, &err) != RDA_OK)
      return rdagen_fail("%s", err.msg);
  }

  return run_write_results(opt, files, cfg, s, B, N, backward, NULL);
}

int rdagen_cmd_run(int argc, char **argv) {
  run_opts opt;
  int rc = run_parse(argc, argv, &opt);
  if (rc >= 0) return rc;

  static rda_out_file files[RUN_NOUT]; /* 4 KiB paths each: off the stack */
  rc = run_check_files(&opt, files);
  if (rc >= 0) return rc;

  run_state s;
  memset(&s, 0, sizeof s);
  rda_err err = {0};
  rda_config cfg;
  rc = 1;
  if (rda_gen_open(&s.g, &err) != RDA_OK ||
      rda_gen_config_file(s.g, opt.config, &cfg, &err) != RDA_OK) {
    rdagen_fail("%s", err.msg);
    goto done;
  }
  if (rda_npy_read(opt.q, &s.q, &err) != RDA_OK || rda_npy_read(opt.k, &s.k, &err) != RDA_OK ||
      rda_npy_read(opt.v, &s.v, &err) != RDA_OK ||
      (opt.d_o != NULL && rda_npy_read(opt.d_o, &s.d_o, &err) != RDA_OK)) {
    rdagen_fail("%s", err.msg);
    goto done;
  }
  if (run_check_shape("--q", opt.q, &s.q, "[B, N, heads, head_dim]", 0, 0, cfg.heads,
                      cfg.head_dim) != 0)
    goto done;
  const long long B = s.q.shape[0], N = s.q.shape[1];
  if (run_check_shape("--k", opt.k, &s.k, "[B, N, kv_heads, head_dim]", B, N, cfg.kv_heads,
                      cfg.head_dim) != 0 ||
      run_check_shape("--v", opt.v, &s.v, "[B, N, kv_heads, head_dim]", B, N, cfg.kv_heads,
                      cfg.head_dim) != 0)
    goto done;
  if (opt.d_o != NULL && run_check_shape("--do", opt.d_o, &s.d_o, "[B, N, heads, head_dim]", B, N,
                                         cfg.heads, cfg.head_dim) != 0)
    goto done;
  if (run_check_values("--q", opt.q, &s.q, cfg.dtype) != 0 ||
      run_check_values("--k", opt.k, &s.k, cfg.dtype) != 0 ||
      run_check_values("--v", opt.v, &s.v, cfg.dtype) != 0 ||
      (opt.d_o != NULL && run_check_values("--do", opt.d_o, &s.d_o, cfg.dtype) != 0))
    goto done;
  rc = run_attention(&opt, files, &cfg, &s);
done:
  run_free(&s);
  return rc;
}
