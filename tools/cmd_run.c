/* cmd_run.c — `rdagen run` (SPEC §4): dilated attention on .npy files. Parse and validate
 * everything (flags, config, input files and shapes, output folders) before any kernel runs;
 * then plan, load, upload, run the forward pass and write O (and LSE) with no partial output. */
#include "backend.h"
#include "commands.h"
#include "fwd.h"
#include "gen.h"
#include "npy.h"
#include "reference.h"

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
    "                  [--backend auto|cuda|emu] [--ranks P]\n"
    "\n"
    "Dilated attention (SPEC section 1) of the config on NumPy .npy inputs:\n"
    "  Q [B, N, H, D], K and V [B, N, Hkv, D]: little-endian float16/32/64, C order,\n"
    "  rounded to the config's dtype. Writes O [B, N, H, D] and LSE [B, H, N] as float32.\n"
    "  --backend  auto (default: cuda when a GPU is usable, else emu), cuda, or emu (the CPU\n"
    "             emulator running the generated kernels)\n"
    "  --ranks    ring ranks (1 for now)\n"
    "  --do/--dq/--dk/--dv  the backward pass (not yet supported)\n"
    "Flags may come in any order, as '--flag value' or '--flag=value'.\n";

typedef struct run_opts {
  const char *config;
  const char *q, *k, *v, *o, *lse;
  const char *d_o, *dq, *dk, *dv;
  const char *backend;
  const char *ranks_text;
  long long ranks;
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
  const char *outs[] = {o->o, o->lse, o->dq, o->dk, o->dv};
  for (int x = 0; x < 5; x++)
    for (int y = x + 1; y < 5; y++)
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
  rda_npy q, k, v;
  uint16_t *qb, *kb, *vb;
  float *o, *lse;
  void *dq, *dk, *dv, *d_o, *dlse;
} run_state;

static void run_free(run_state *s) {
  if (s->b != NULL) {
    void *bufs[] = {s->dq, s->dk, s->dv, s->d_o, s->dlse};
    for (int i = 0; i < 5; i++)
      if (bufs[i] != NULL) s->b->free(s->b, bufs[i]);
    rda_fwd_unload(s->b, &s->kernels);
  }
  rda_plan_k_free(&s->plan);
  if (s->b != NULL) s->b->destroy(s->b);
  rda_gen_close(s->g);
  rda_npy_free(&s->q);
  rda_npy_free(&s->k);
  rda_npy_free(&s->v);
  free(s->qb);
  free(s->kb);
  free(s->vb);
  free(s->o);
  free(s->lse);
}

static uint16_t *run_to_bits(const rda_npy *a, int dtype) {
  uint16_t *bits = malloc((a->count ? a->count : 1) * sizeof *bits);
  if (bits == NULL) return NULL;
  for (size_t i = 0; i < a->count; i++) bits[i] = rda_to_dtype_bits(a->data[i], dtype);
  return bits;
}

/* Write O (and LSE) so that a failure leaves no new output behind and existing files as they
 * were: each goes to a complete temporary beside its target first, then both are renamed. */
static int run_write_outputs(const run_opts *opt, const long long o_shape[4], const float *o,
                             const long long l_shape[3], const float *lse) {
  rda_err err = {0};
  char tmp_o[4096], tmp_l[4096];
  snprintf(tmp_o, sizeof tmp_o, "%s.partial-%ld", opt->o, (long)getpid());
  snprintf(tmp_l, sizeof tmp_l, "%s.partial-%ld", opt->lse ? opt->lse : "", (long)getpid());
  if (rda_npy_write_f32(tmp_o, 4, o_shape, o, &err) != RDA_OK) return rdagen_fail("%s", err.msg);
  if (opt->lse != NULL && rda_npy_write_f32(tmp_l, 3, l_shape, lse, &err) != RDA_OK) {
    unlink(tmp_o);
    return rdagen_fail("%s", err.msg);
  }
  if (rename(tmp_o, opt->o) != 0) {
    const int e = errno;
    unlink(tmp_o);
    if (opt->lse != NULL) unlink(tmp_l);
    return rdagen_fail("%s: cannot write: %s", opt->o, strerror(e));
  }
  if (opt->lse != NULL && rename(tmp_l, opt->lse) != 0) {
    const int e = errno;
    unlink(tmp_l);
    unlink(opt->o); /* never half a result */
    return rdagen_fail("%s: cannot write: %s", opt->lse, strerror(e));
  }
  return 0;
}

/* Everything after validation: backend, plan, kernels, the forward pass, the outputs. */
static int run_forward(const run_opts *opt, const rda_config *cfg, run_state *s) {
  rda_err err = {0};
  const long long B = s->q.shape[0], N = s->q.shape[1];
  const long long H = cfg->heads, Hkv = cfg->kv_heads, D = cfg->head_dim;
  const size_t nq = s->q.count, nk = s->k.count, nl = (size_t)(B * H * N);

  s->qb = run_to_bits(&s->q, cfg->dtype);
  s->kb = run_to_bits(&s->k, cfg->dtype);
  s->vb = run_to_bits(&s->v, cfg->dtype);
  s->o = malloc(nq * sizeof *s->o);
  s->lse = malloc(nl * sizeof *s->lse);
  if (!s->qb || !s->kb || !s->vb || !s->o || !s->lse)
    return rdagen_fail("out of memory for B = %lld, N = %lld", B, N);
  /* The inputs are rounded; their float64 copies are no longer needed. */
  rda_npy_free(&s->q);
  rda_npy_free(&s->k);
  rda_npy_free(&s->v);

  char why[1024];
  if (rda_backend_open(opt->backend, &s->b, why, sizeof why, &err) != RDA_OK)
    return rdagen_fail("%s", err.msg);
  if (strcmp(opt->backend, "auto") == 0) fprintf(stderr, "rdagen: backend: %s\n", why);
  rda_hw hw;
  if (rda_backend_hw(s->b, s->g, &hw, &err) != RDA_OK ||
      rda_gen_plan(s->g, cfg, &hw, &s->plan, &err) != RDA_OK ||
      rda_fwd_load(s->b, &s->plan, &s->kernels, &err) != RDA_OK)
    return rdagen_fail("%s", err.msg);

  rda_backend *b = s->b;
  if (b->alloc(b, nq * 2, &s->dq, &err) != RDA_OK || b->alloc(b, nk * 2, &s->dk, &err) != RDA_OK ||
      b->alloc(b, nk * 2, &s->dv, &err) != RDA_OK || b->alloc(b, nq * 4, &s->d_o, &err) != RDA_OK ||
      b->alloc(b, nl * 4, &s->dlse, &err) != RDA_OK)
    return rdagen_fail("%s", err.msg);
  /* Poison the outputs: an element no kernel writes comes out NaN, never stale memory. */
  for (size_t i = 0; i < nq; i++) s->o[i] = NAN;
  for (size_t i = 0; i < nl; i++) s->lse[i] = NAN;
  if (b->upload(b, s->dq, s->qb, nq * 2, &err) != RDA_OK ||
      b->upload(b, s->dk, s->kb, nk * 2, &err) != RDA_OK ||
      b->upload(b, s->dv, s->vb, nk * 2, &err) != RDA_OK ||
      b->upload(b, s->d_o, s->o, nq * 4, &err) != RDA_OK ||
      b->upload(b, s->dlse, s->lse, nl * 4, &err) != RDA_OK)
    return rdagen_fail("%s", err.msg);

  rda_fwd_args a;
  memset(&a, 0, sizeof a);
  a.batch = B;
  a.n = N;
  a.q = s->dq;
  a.k = s->dk;
  a.v = s->dv;
  a.q_s[0] = N * H * D, a.q_s[1] = H * D, a.q_s[2] = D;
  a.k_s[0] = N * Hkv * D, a.k_s[1] = Hkv * D, a.k_s[2] = D;
  a.v_s[0] = a.k_s[0], a.v_s[1] = a.k_s[1], a.v_s[2] = a.k_s[2];
  a.o = s->d_o;
  a.o_s[0] = a.q_s[0], a.o_s[1] = a.q_s[1], a.o_s[2] = a.q_s[2];
  a.lse = s->dlse;
  a.lse_s[0] = H * N, a.lse_s[1] = N;
  if (rda_fwd_run(b, &s->plan, &s->kernels, &a, &err) != RDA_OK ||
      b->synchronize(b, &err) != RDA_OK || b->download(b, s->o, s->d_o, nq * 4, &err) != RDA_OK ||
      b->download(b, s->lse, s->dlse, nl * 4, &err) != RDA_OK)
    return rdagen_fail("%s", err.msg);

  const long long o_shape[4] = {B, N, H, D}, l_shape[3] = {B, H, N};
  return run_write_outputs(opt, o_shape, s->o, l_shape, s->lse);
}

int rdagen_cmd_run(int argc, char **argv) {
  run_opts opt;
  int rc = run_parse(argc, argv, &opt);
  if (rc >= 0) return rc;

  if (opt.d_o != NULL)
    return rdagen_fail("the backward pass (--do/--dq/--dk/--dv) is not yet supported");
  if (opt.ranks != 1)
    return rdagen_fail("--ranks %lld: the ring over more than one rank is not yet supported",
                       opt.ranks);
  if (run_check_output(opt.o) != 0) return 1;
  if (opt.lse != NULL && run_check_output(opt.lse) != 0) return 1;
  if (opt.lse != NULL && run_same_file(opt.o, opt.lse))
    return rdagen_usage("run: --o '%s' and --lse '%s' are the same file", opt.o, opt.lse);

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
      rda_npy_read(opt.v, &s.v, &err) != RDA_OK) {
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
  rc = run_forward(&opt, &cfg, &s);
done:
  run_free(&s);
  return rc;
}
