/* cmd_run.c — `rdagen run` (SPEC §4): dilated attention on .npy files. Parse and validate
 * everything (flags, config, input files and shapes, output folders) before any kernel runs;
 * then plan, load, upload, run the forward (and backward) pass and write every output or none. */
#include "backend.h"
#include "bwd.h"
#include "commands.h"
#include "fwd.h"
#include "gen.h"
#include "npy.h"
#include "reference.h"
#include "json.h"
#include "ring.h"
#include "ring_plan.h"
#include "ring_virtual.h"

#include <errno.h>
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
    "  --ranks    ring ranks (default 1): P virtual ranks, threads each given only its own\n"
    "             rows (the emulator over host memory, or one GPU over device memory); the\n"
    "             result (and with --do, the gradients) is gathered\n"
    "  --layout   how rows are split over the ranks: contiguous (default) or zigzag (2P equal\n"
    "             chunks, rank p holds chunks p and 2P-1-p; N must be a multiple of 2P)\n"
    "  --stats    write {\"ranks\": [{\"rank\", \"rows\", \"bytes_sent\", \"bytes_received\",\n"
    "             \"peak_bytes\"}, ...]} of the ring as JSON (with --do, both passes: bytes\n"
    "             summed, the larger peak)\n"
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
    const char *val;
    if (eq != NULL) {
      val = eq + 1;
    } else {
      if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)
        return rdagen_usage("run: --%s needs a value", f->name);
      val = argv[++i];
    }
    if (*val == '\0') return rdagen_usage("run: --%s needs a value", f->name);
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
    char *end = NULL;
    errno = 0;
    const long long r = strtoll(o->ranks_text, &end, 10);
    if (errno != 0 || end == o->ranks_text || *end != '\0' || r < 1 || o->ranks_text[0] == '+' ||
        o->ranks_text[0] == ' ')
      return rdagen_usage("run: --ranks '%s': expected a positive integer", o->ranks_text);
    o->ranks = r;
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

/* The folder part of a path, malloc'd ("." when there is none); NULL when out of memory. */
static char *run_dirname(const char *path) {
  const char *slash = strrchr(path, '/');
  if (slash == NULL) return strdup(".");
  const size_t n = slash == path ? 1 : (size_t)(slash - path);
  char *dir = malloc(n + 1);
  if (dir != NULL) {
    memcpy(dir, path, n);
    dir[n] = '\0';
  }
  return dir;
}

/* 1 when two output paths name the same file through different spellings (same folder, same
 * name), e.g. "o.npy" and "./o.npy". */
static int run_same_file(const char *a, const char *b) {
  const char *na = strrchr(a, '/'), *nb = strrchr(b, '/');
  if (strcmp(na ? na + 1 : a, nb ? nb + 1 : b) != 0) return 0;
  char *da = run_dirname(a), *db = run_dirname(b);
  struct stat sa, sb;
  const int same = da != NULL && db != NULL && stat(da, &sa) == 0 && stat(db, &sb) == 0 &&
                   sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  free(da);
  free(db);
  return same;
}

/* The output path must be creatable: its folder exists and is writable, and the path is not a
 * folder itself. */
static int run_check_output(const char *path) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
    return rdagen_fail("%s: cannot write the output: it is a folder", path);
  char *dir = run_dirname(path);
  if (dir == NULL) return rdagen_fail("out of memory");
  int rc = 0;
  if (stat(dir, &st) != 0)
    rc = rdagen_fail("%s: cannot write the output: folder '%s' does not exist", path, dir);
  else if (!S_ISDIR(st.st_mode))
    rc = rdagen_fail("%s: cannot write the output: '%s' is not a folder", path, dir);
  else if (access(dir, W_OK | X_OK) != 0)
    rc = rdagen_fail("%s: cannot write the output: folder '%s' is not writable", path, dir);
  free(dir);
  return rc;
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
  return rdagen_fail("%s: %s has shape %s; expected %s %s = %s", path, flag, got, dims,
                     b > 0 ? "(the B and N of --q)" : "from the config", exp);
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

/* One output file: where it goes and what it holds. */
typedef struct run_output {
  const char *path; /* NULL: not requested */
  int ndim;
  long long shape[4];
  const float *data;
} run_output;

enum { RUN_MAX_OUTPUTS = 5 };

/* Write every requested output so that a failure leaves no new output behind and existing
 * files as they were: each goes to a complete temporary beside its target first, and only when
 * all temporaries are written are they renamed over their targets. */
static int run_write_outputs(const run_output *outs, int count) {
  rda_err err = {0};
  char tmp[RUN_MAX_OUTPUTS][4096];
  int written = 0;
  for (; written < count; written++) {
    const run_output *w = &outs[written];
    if (w->path == NULL) continue;
    snprintf(tmp[written], sizeof tmp[written], "%s.partial-%ld", w->path, (long)getpid());
    if (rda_npy_write_f32(tmp[written], w->ndim, w->shape, w->data, &err) != RDA_OK) break;
  }
  if (written < count) {
    for (int i = 0; i < written; i++)
      if (outs[i].path != NULL) unlink(tmp[i]);
    return rdagen_fail("%s", err.msg);
  }
  for (int i = 0; i < count; i++) {
    if (outs[i].path == NULL) continue;
    if (rename(tmp[i], outs[i].path) == 0) continue;
    const int e = errno;
    for (int j = i; j < count; j++) /* this one and the rest: not yet in place */
      if (outs[j].path != NULL) unlink(tmp[j]);
    for (int j = 0; j < i; j++) /* never part of a result */
      if (outs[j].path != NULL) unlink(outs[j].path);
    return rdagen_fail("%s: cannot write: %s", outs[i].path, strerror(e));
  }
  return 0;
}

/* stats JSON to a temporary beside path; *tmp receives its name. */
static int run_write_stats(const char *path, const rda_ring_run_stats *stats, int P, char *tmp,
                           size_t tmp_len) {
  rda_json j;
  rda_err err = {0};
  rda_json_init(&j);
  rda_json_object_begin(&j);
  rda_json_key(&j, "ranks");
  rda_json_array_begin(&j);
  for (int p = 0; p < P; ++p) {
    rda_json_object_begin(&j);
    rda_json_key(&j, "rank");
    rda_json_int(&j, p);
    rda_json_key(&j, "rows");
    rda_json_int(&j, (long long)stats[p].rows);
    rda_json_key(&j, "bytes_sent");
    rda_json_int(&j, (long long)stats[p].bytes_sent);
    rda_json_key(&j, "bytes_received");
    rda_json_int(&j, (long long)stats[p].bytes_received);
    rda_json_key(&j, "peak_bytes");
    rda_json_int(&j, (long long)stats[p].peak_bytes);
    rda_json_object_end(&j);
  }
  rda_json_array_end(&j);
  rda_json_object_end(&j);
  if (rda_json_finish(&j, &err) != RDA_OK) {
    rda_json_free(&j);
    return rdagen_fail("--stats: %s", err.msg);
  }
  snprintf(tmp, tmp_len, "%s.partial-%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  int ok = f != NULL && fwrite(j.buf, 1, j.len, f) == j.len && fputc('\n', f) != EOF;
  if (f != NULL && fclose(f) != 0) ok = 0;
  rda_json_free(&j);
  if (!ok) {
    const int e = errno;
    unlink(tmp);
    return rdagen_fail("%s: cannot write: %s", path, strerror(e));
  }
  return 0;
}

/* Everything after validation: backend, plan, kernels, the forward (and backward) pass, the
 * outputs. */
/* All five outputs (the gradients only with --do), every one or none. */
static int run_write_results(const run_opts *opt, const rda_config *cfg, const run_state *s,
                             long long B, long long N, int backward) {
  const long long H = cfg->heads, Hkv = cfg->kv_heads, D = cfg->head_dim;
  const run_output outs[RUN_MAX_OUTPUTS] = {
      {opt->o, 4, {B, N, H, D}, s->o},
      {opt->lse, 3, {B, H, N, 0}, s->lse},
      {backward ? opt->dq : NULL, 4, {B, N, H, D}, s->gq},
      {backward ? opt->dk : NULL, 4, {B, N, Hkv, D}, s->gk},
      {backward ? opt->dv : NULL, 4, {B, N, Hkv, D}, s->gv},
  };
  return run_write_outputs(outs, RUN_MAX_OUTPUTS);
}

static int run_attention(const run_opts *opt, const rda_config *cfg, run_state *s) {
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
    char stats_tmp[4096] = "";
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
      fprintf(stderr, "rdagen: backend: %s (%lld virtual ranks)\n", why, opt->ranks);
    if (rc == 0 && opt->stats != NULL)
      rc = run_write_stats(opt->stats, stats, (int)opt->ranks, stats_tmp, sizeof stats_tmp);
    free(stats);
    if (rc != 0) return rc;
    if (run_write_results(opt, cfg, s, B, N, backward) != 0) {
      if (stats_tmp[0] != '\0') unlink(stats_tmp);
      return 1;
    }
    if (stats_tmp[0] != '\0' && rename(stats_tmp, opt->stats) != 0) {
      const int e = errno;
      unlink(stats_tmp);
      return rdagen_fail("%s: cannot write: %s", opt->stats, strerror(e));
    }
    return 0;
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

  return run_write_results(opt, cfg, s, B, N, backward);
}

int rdagen_cmd_run(int argc, char **argv) {
  run_opts opt;
  int rc = run_parse(argc, argv, &opt);
  if (rc >= 0) return rc;

  const int ring = opt.ranks > 1 || opt.stats != NULL || opt.layout != NULL;
  if (ring && opt.ranks > RDA_RING_MAX_RANKS)
    return rdagen_fail("--ranks %lld: at most %d ranks", opt.ranks, RDA_RING_MAX_RANKS);
  if (opt.stats != NULL && run_check_output(opt.stats) != 0) return 1;
  /* Every output: creatable, and no two of them the same file under different spellings. */
  const char *const out_flags[RUN_MAX_OUTPUTS] = {"--o", "--lse", "--dq", "--dk", "--dv"};
  const char *const outs[RUN_MAX_OUTPUTS] = {opt.o, opt.lse, opt.dq, opt.dk, opt.dv};
  for (int i = 0; i < RUN_MAX_OUTPUTS; i++)
    if (outs[i] != NULL && run_check_output(outs[i]) != 0) return 1;
  for (int i = 0; i < RUN_MAX_OUTPUTS; i++)
    for (int j = i + 1; j < RUN_MAX_OUTPUTS; j++)
      if (outs[i] != NULL && outs[j] != NULL && run_same_file(outs[i], outs[j]))
        return rdagen_usage("run: %s '%s' and %s '%s' are the same file", out_flags[i], outs[i],
                            out_flags[j], outs[j]);

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
  rc = run_attention(&opt, &cfg, &s);
done:
  run_free(&s);
  return rc;
}
