/* test_cli.c — `rdagen` as a subprocess (RDAGEN_PATH) against SPEC §4: --help and --version,
 * bad usage (exit 2), every kind of bad input (exit 1, one "rdagen: error:" line naming the
 * file, no output left behind), and real forward and backward runs on the emu backend checked
 * against the float64 reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "gen.h"
#include "npy.h"
#include "rda_test.h"
#include "reference.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_ARGS = 48 };

/* A temp folder with a small valid problem: config (H 4, Hkv 2, D 32, bf16), Q, K, V and dO
 * files; output paths o, lse, dq, dk, dv in the same folder. */
typedef struct fixture {
  char *dir;
  char *config, *q, *k, *v, *o, *lse;
  char *d_o, *dq, *dk, *dv;
} fixture;

/* The first entry of the folder that is not an input (an output, a temporary, anything a
 * failed run must not leave), or NULL; allow_o: the outputs o, lse, dq, dk, dv.npy may exist.
 * Returns a static buffer. */
static const char *stray_entry(const fixture *f, int allow_o) {
  static char name[256];
  static const char *const inputs[] = {"small.lua", "q.npy",  "k.npy",
                                       "v.npy",     "do.npy", "saved.tmp"};
  static const char *const outputs[] = {"o.npy", "lse.npy", "dq.npy", "dk.npy", "dv.npy"};
  DIR *d = opendir(f->dir);
  assert_non_null(d);
  const char *found = NULL;
  struct dirent *e;
  while (found == NULL && (e = readdir(d)) != NULL) {
    int ok = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
      if (strcmp(e->d_name, inputs[i]) == 0) ok = 1;
    for (size_t i = 0; allow_o && i < sizeof outputs / sizeof outputs[0]; i++)
      if (strcmp(e->d_name, outputs[i]) == 0) ok = 1;
    if (!ok) {
      snprintf(name, sizeof name, "%s", e->d_name);
      found = name;
    }
  }
  closedir(d);
  return found;
}

static const char small_config[] =
    "return { heads = 4, kv_heads = 2, head_dim = 32, dtype = 'bf16',\n"
    "  segments = { 16, 32 }, dilations = { 1, 2 }, causal = true }\n";

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (f == NULL || (f->dir = rt_mkdtemp()) == NULL) return -1;
  f->config = rt_path(f->dir, "small.lua");
  f->q = rt_path(f->dir, "q.npy");
  f->k = rt_path(f->dir, "k.npy");
  f->v = rt_path(f->dir, "v.npy");
  f->o = rt_path(f->dir, "o.npy");
  f->lse = rt_path(f->dir, "lse.npy");
  f->d_o = rt_path(f->dir, "do.npy");
  f->dq = rt_path(f->dir, "dq.npy");
  f->dk = rt_path(f->dir, "dk.npy");
  f->dv = rt_path(f->dir, "dv.npy");
  const long long qs[4] = {1, 40, 4, 32}, ks[4] = {1, 40, 2, 32};
  double *q = rt_normal(40 * 4 * 32, RDA_DTYPE_BF16);
  double *k = rt_normal(40 * 2 * 32, RDA_DTYPE_BF16);
  double *v = rt_normal(40 * 2 * 32, RDA_DTYPE_BF16);
  double *d_o = rt_normal(40 * 4 * 32, RDA_DTYPE_BF16);
  const bool ok =
      rt_write_file(f->config, small_config, strlen(small_config)) &&
      rt_write_npy(f->q, "<f4", 0, 4, qs, q) && rt_write_npy(f->k, "<f4", 0, 4, ks, k) &&
      rt_write_npy(f->v, "<f4", 0, 4, ks, v) && rt_write_npy(f->d_o, "<f4", 0, 4, qs, d_o);
  free(q), free(k), free(v), free(d_o);
  if (!ok) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  rt_rmtree(f->dir);
  free(f->dir), free(f->config), free(f->q), free(f->k), free(f->v), free(f->o), free(f->lse);
  free(f->d_o), free(f->dq), free(f->dk), free(f->dv);
  free(f);
  return 0;
}

/* A string literal as an exec argument (argv is char *const[], never written). */
static char *arg(const char *s) { return (char *)(uintptr_t)s; }

/* Run rdagen with the given arguments (NULL-terminated list after argv[0]). */
static rt_proc run_rdagen(int timeout_s, const char *const *args) {
  char *argv[MAX_ARGS];
  int n = 0;
  argv[n++] = (char *)(uintptr_t)RDAGEN_PATH;
  for (int i = 0; args[i] != NULL && n < MAX_ARGS - 1; i++) argv[n++] = (char *)(uintptr_t)args[i];
  argv[n] = NULL;
  rt_proc p;
  assert_true(rt_run(argv, timeout_s, &p));
  return p;
}

static void show(const char *what, const rt_proc *p) {
  fprintf(stderr, "--- %s: exit %d\nstdout: %s\nstderr: %s\n", what, p->exit_code, p->out, p->err);
}

/* --- help, version, usage --------------------------------------------------------------------- */

static void test_cli_help_and_version_exit_0(void **state) {
  (void)state;
  static const char *const help[] = {"--help", NULL};
  rt_proc p = run_rdagen(60, help);
  assert_int_equal(p.exit_code, 0);
  assert_non_null(strstr(p.out, "usage: rdagen"));
  assert_non_null(strstr(p.out, "run CONFIG"));
  rt_proc_free(&p);
  static const char *const run_help[] = {"run", "--help", NULL};
  p = run_rdagen(60, run_help);
  assert_int_equal(p.exit_code, 0);
  assert_non_null(strstr(p.out, "--backend"));
  rt_proc_free(&p);
  static const char *const demo_help[] = {"demo", "--help", NULL};
  p = run_rdagen(60, demo_help);
  assert_int_equal(p.exit_code, 0);
  assert_non_null(strstr(p.out, "usage: rdagen demo"));
  rt_proc_free(&p);
  static const char *const version[] = {"--version", NULL};
  p = run_rdagen(60, version);
  assert_int_equal(p.exit_code, 0);
  assert_non_null(strstr(p.out, "rdagen 0."));
  rt_proc_free(&p);
}

/* A `sh -c` command that runs "$0" "$@" with standard output a pipe nobody reads (every write
 * fails, EPIPE or SIGPIPE); the pipe's write end, for the caller to close afterwards. */
static int closed_pipe_command(char *cmd, size_t cap) {
  int pp[2];
  assert_int_equal(pipe(pp), 0);
  close(pp[0]);
  snprintf(cmd, cap, "exec \"$0\" \"$@\" >&%d", pp[1]);
  return pp[1];
}

/* Standard output a pipe whose reader has gone: one error line and exit 1, as on a full disk,
 * not a silent death by SIGPIPE (exit 141). */
static void test_cli_closed_pipe_on_standard_output_is_one_error_line(void **state) {
  fixture *f = *state;
  char redirect[64];
  const int pipe_fd = closed_pipe_command(redirect, sizeof redirect);
  const char *const cases[][8] = {
      {"--help"}, {"--version"}, {"ring-sim", f->config, "--n", "64", "--ranks", "2"}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char *argv[12] = {arg("/bin/sh"), arg("-c"), redirect, arg(RDAGEN_PATH)};
    for (int i = 0; cases[c][i] != NULL; i++) argv[4 + i] = arg(cases[c][i]);
    rt_proc p;
    assert_true(rt_run(argv, 120, &p));
    if (p.exit_code != 1 || rt_count_lines(p.err) != 1 ||
        strstr(p.err, "rdagen: error: cannot write to standard output") == NULL) {
      show(cases[c][0], &p);
      fail();
    }
    rt_proc_free(&p);
  }
  close(pipe_fd);
}

/* Bad usage exits 2 and writes nothing. */
static void test_cli_bad_usage_exits_2(void **state) {
  fixture *f = *state;
  const char *C = f->config, *Q = f->q, *K = f->k, *V = f->v, *O = f->o, *L = f->lse;
  const char *DO = f->d_o, *DQ = f->dq, *DK = f->dk, *DV = f->dv;
  char *alias = rt_path(f->dir, "./o.npy");     /* O spelled differently */
  char *dk_alias = rt_path(f->dir, "./dk.npy"); /* dK spelled differently */
  const char *const cases[][MAX_ARGS] = {
      {NULL},
      {"frobnicate", NULL},
      {"--version", "extra", NULL},
      {"cache", NULL},
      {"run", NULL},
      {"run", "--q", Q, "--k", K, "--v", V, "--o", O, NULL},                /* no config */
      {"run", C, "--k", K, "--v", V, "--o", O, NULL},                       /* no --q */
      {"run", C, "--q", Q, "--v", V, "--o", O, NULL},                       /* no --k */
      {"run", C, "--q", Q, "--k", K, "--o", O, NULL},                       /* no --v */
      {"run", C, "--q", Q, "--k", K, "--v", V, NULL},                       /* no --o */
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--x", "1", NULL}, /* unknown flag */
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "-x", NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", NULL}, /* no value */
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--lse=", NULL},
      {"run", C, "--q", "--k", K, "--v", V, "--o", O, NULL},
      {"run", C, "--q", Q, "--q", Q, "--k", K, "--v", V, "--o", O, NULL}, /* twice */
      {"run", C, C, "--q", Q, "--k", K, "--v", V, "--o", O, NULL},        /* two configs */
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--backend", "gpu", NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--ranks", "0", NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--ranks", "-1", NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--ranks", "two", NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--ranks=1.5", NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--ranks", "\t2", NULL}, /* white space */
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--ranks", "\n2", NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--ranks", "+2", NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--ranks", "0x2", NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--ranks", "4097", NULL}, /* as ring-sim */
      /* each option once, flags without a value too */
      {"emit", C, "--arch", "sm_90", "--out", O, "--ptx", "--ptx", NULL},
      {"ring-sim", C, "--n", "64", "--ranks", "2", "--json", "--json", NULL},
      {"tune", C, "--dry-run", "--dry-run", NULL},
      {"tune", C, "--wgmma", "--wgmma", NULL},
      {"tune", C, "--backward", "--backward", NULL},
      /* emit: a value is never the next option (--out --ptx is no folder named "--ptx") */
      {"emit", C, "--arch", "sm_90", "--out", "--ptx", NULL},
      {"emit", C, "--arch", "--out", O, NULL},
      {"emit", C, "--arch", "sm_+90", "--out", O, NULL}, /* architectures: sm_ and 2-3 digits */
      {"emit", C, "--arch", "sm_0090", "--out", O, NULL},
      {"cache", "list", "--arch", "sm_ 90", NULL},
      {"cache", "warm", C, "--arch", "--arch", "sm_90", NULL},
      /* demo: strict numbers, known backends, each option once */
      {"demo", C, "--n", "\t64", NULL},
      {"demo", C, "--n", "64x", NULL},
      {"demo", C, "--n", "99999999999999999999", NULL},
      {"demo", C, "--n", "2199023255552", NULL}, /* 2^41 */
      {"demo", C, "--batch", "65536", NULL},
      {"demo", C, "--n", "64", "--n", "32", NULL},
      {"demo", C, "--seed", "-1", NULL},
      {"demo", C, "--backend", "gpu", NULL},
      {"demo", C, "--n", NULL},
      {"demo", C, "--n", "--batch", "2", NULL},
      {"demo", C, "--bogus", NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--do", Q, NULL}, /* partial backward */
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--dq", O, "--dk", L, NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--lse", O, NULL}, /* one file twice */
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--lse", alias, NULL},
      /* the backward flags: all four or none, five distinct output files */
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--dq", DQ, "--dk", DK, "--dv", DV, NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--do", DO, "--dk", DK, "--dv", DV, NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--do", DO, "--dq", DQ, "--dv", DV, NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--do", DO, "--dq", DQ, "--dk", DK, NULL},
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--dv", DV, NULL},
      {"run", C,      "--q", Q,      "--k", K,      "--v", V,      "--o", O,   "--do",
       DO,    "--dq", DQ,    "--dk", DK,    "--dv", DV,    "--do", DO,    NULL}, /* --do twice */
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--do", DO, "--dq", DQ, "--dk", DK, "--dv",
       NULL}, /* no value */
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--do", DO, "--dq", O, "--dk", DK, "--dv",
       DV, NULL}, /* dQ onto O */
      {"run", C,      "--q", Q,      "--k", K,      "--v", V,      "--o", O,   "--lse",
       L,     "--do", DO,    "--dq", DQ,    "--dk", DK,    "--dv", L,     NULL}, /* dV onto LSE */
      {"run", C, "--q", Q, "--k", K, "--v", V, "--o", O, "--do", DO, "--dq", DQ, "--dk", DK, "--dv",
       dk_alias, NULL}, /* dV onto dK, spelled differently */
      {"run", C,      "--q", Q,      "--k", K,      "--v", V,           "--o", alias, "--do",
       DO,    "--dq", DQ,    "--dk", O,     "--dv", DV,    "--backend", "emu", NULL}, /* dK onto O,
                                                                                         spelled
                                                                                         differently
                                                                                       */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    rt_proc p = run_rdagen(60, cases[i]);
    if (p.exit_code != 2 || p.err[0] == '\0' || stray_entry(f, 0) != NULL) {
      char what[32];
      snprintf(what, sizeof what, "usage case %zu", i);
      show(what, &p);
      fail();
    }
    assert_true(strncmp(p.err, "rdagen", 6) == 0 || strstr(p.err, "usage") != NULL);
    /* one line, as an error is; only a bare `rdagen` prints its usage */
    if (i > 0 && rt_count_lines(p.err) != 1) {
      show("usage error of more than one line", &p);
      fail();
    }
    rt_proc_free(&p);
  }
  free(alias), free(dk_alias);
}

/* `rdagen demo` without CONFIG runs the default config built into rdagen, from any folder (the
 * test runs it in an empty one). */
static void test_cli_demo_without_config_runs_the_built_in_default(void **state) {
  fixture *f = *state;
  char *empty = rt_path(f->dir, "elsewhere");
  assert_int_equal(mkdir(empty, 0700), 0);
  char here[4096];
  assert_non_null(getcwd(here, sizeof here));
  assert_int_equal(chdir(empty), 0);
  const char *const demo[] = {"demo", "--n", "64", "--backend", "emu", NULL};
  rt_proc p = run_rdagen(600, demo);
  assert_int_equal(chdir(here), 0);
  if (p.exit_code != 0 || strstr(p.out, "config   configs/default.lua (built in): heads 8") == NULL ||
      strstr(p.out, "result   PASS") == NULL) {
    show("demo without CONFIG", &p);
    fail();
  }
  rt_proc_free(&p);
  rmdir(empty);
  free(empty);
}

/* --- bad input: exit 1, one line naming the file, nothing written ----------------------------- */

static void expect_input_error(const fixture *f, const char *what, const char *const *args,
                               const char *names) {
  rt_proc p = run_rdagen(300, args);
  const int lines = rt_count_lines(p.err);
  if (p.exit_code != 1 || lines != 1 || strncmp(p.err, "rdagen: error: ", 15) != 0 ||
      (names != NULL && strstr(p.err, names) == NULL) || stray_entry(f, 0) != NULL) {
    const char *stray = stray_entry(f, 0);
    show(what, &p);
    fprintf(stderr,
            "wanted exit 1, one 'rdagen: error:' line naming '%s', no new files "
            "(found '%s')\n",
            names ? names : "-", stray ? stray : "none");
    fail();
  }
  rt_proc_free(&p);
}

/* Replace one input with a broken file, check the error names it, restore. */
static void with_broken_input(fixture *f, const char *what, const char *path, const char *descr,
                              int fortran, int ndim, const long long *shape, int raw_bytes) {
  char *saved = rt_path(f->dir, "saved.tmp");
  assert_int_equal(rename(path, saved), 0);
  if (raw_bytes > 0) {
    size_t len = 0;
    char *b = rt_read_file(saved, &len);
    assert_non_null(b);
    assert_true(rt_write_file(path, b, (size_t)raw_bytes < len ? (size_t)raw_bytes : len));
    free(b);
  } else if (raw_bytes == 0) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    double *x = rt_normal(n, RDA_DTYPE_BF16);
    assert_true(rt_write_npy(path, descr, fortran, ndim, shape, x));
    free(x);
  } /* raw_bytes < 0: the file is missing */
  const char *const args[] = {"run", f->config, "--q",   f->q,   "--k",       f->k,  "--v", f->v,
                              "--o", f->o,      "--lse", f->lse, "--backend", "emu", NULL};
  expect_input_error(f, what, args, path);
  unlink(path);
  assert_int_equal(rename(saved, path), 0);
  free(saved);
}

static void test_cli_bad_input_files_exit_1_naming_the_file(void **state) {
  fixture *f = *state;
  const long long q_ok[4] = {1, 40, 4, 32}, kv_ok[4] = {1, 40, 2, 32};
  with_broken_input(f, "missing q", f->q, NULL, 0, 0, NULL, -1);
  with_broken_input(f, "truncated q", f->q, NULL, 0, 0, NULL, 200);
  with_broken_input(f, "truncated k header", f->k, NULL, 0, 0, NULL, 40);
  with_broken_input(f, "empty v", f->v, NULL, 0, 0, NULL, 1);
  with_broken_input(f, "integer q", f->q, "<i4", 0, 4, q_ok, 0);
  with_broken_input(f, "big-endian k", f->k, ">f4", 0, 4, kv_ok, 0);
  with_broken_input(f, "fortran v", f->v, "<f4", 1, 4, kv_ok, 0);
  with_broken_input(f, "q head_dim", f->q, "<f4", 0, 4, (const long long[]){1, 40, 4, 64}, 0);
  with_broken_input(f, "q heads", f->q, "<f4", 0, 4, (const long long[]){1, 40, 2, 32}, 0);
  with_broken_input(f, "q 3-d", f->q, "<f4", 0, 3, (const long long[]){40, 4, 32}, 0);
  with_broken_input(f, "q empty", f->q, "<f4", 0, 4, (const long long[]){1, 0, 4, 32}, 0);
  with_broken_input(f, "k kv_heads", f->k, "<f4", 0, 4, (const long long[]){1, 40, 4, 32}, 0);
  with_broken_input(f, "k n", f->k, "<f4", 0, 4, (const long long[]){1, 39, 2, 32}, 0);
  with_broken_input(f, "v batch", f->v, "<f8", 0, 4, (const long long[]){2, 40, 2, 32}, 0);
  with_broken_input(f, "config missing", f->config, NULL, 0, 0, NULL, -1);
}

static void test_cli_bad_config_exits_1_naming_it(void **state) {
  fixture *f = *state;
  static const char *const bodies[] = {
      "return { heads = 4, head_dim = 32, segments = {16}, dilations = {1}, dtype = 'bf16', x = 1 "
      "}",
      "return { heads = 4, head_dim = 33, segments = {16}, dilations = {1} }",
      "return { heads = 4",
      "os.execute('touch pwned') return {}",
      "while true do end",
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    assert_true(rt_write_file(f->config, bodies[i], strlen(bodies[i])));
    const char *const args[] = {"run", f->config, "--q", f->q,        "--k", f->k, "--v",
                                f->v,  "--o",     f->o,  "--backend", "emu", NULL};
    expect_input_error(f, bodies[i], args, "small.lua");
  }
}

/* RDA_WGMMA other than 0 or 1: one clear line naming it, exit 1, no output written (run and
 * emit; emit's --out folder is not created). */
static void test_cli_bad_rda_wgmma_exits_1_and_writes_nothing(void **state) {
  fixture *f = *state;
  char *out = rt_path(f->dir, "emitted");
  assert_int_equal(setenv("RDA_WGMMA", "yes", 1), 0);
  const char *const run[] = {"run", f->config, "--q", f->q,        "--k", f->k, "--v",
                             f->v,  "--o",     f->o,  "--backend", "emu", NULL};
  expect_input_error(f, "RDA_WGMMA=yes run", run, "RDA_WGMMA='yes'");
  const char *const emit[] = {"emit", f->config, "--arch", "sm_90", "--out", out, NULL};
  expect_input_error(f, "RDA_WGMMA=yes emit", emit, "RDA_WGMMA='yes'");
  assert_int_equal(unsetenv("RDA_WGMMA"), 0);
  assert_false(rt_exists(out));
  free(out);
}

/* A control character in a name the error line repeats (here an escape sequence in a file
 * name) is shown as \xNN, never sent to the terminal. */
static void test_cli_error_line_escapes_control_characters(void **state) {
  fixture *f = *state;
  char *q = rt_path(f->dir, "q\x1b[31m.npy"); /* no such file */
  const char *const cmd[] = {"run", f->config, "--q", q,    "--k", f->k,
                             "--v", f->v,      "--o", f->o, NULL};
  rt_proc p = run_rdagen(120, cmd);
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 || strchr(p.err, '\x1b') != NULL ||
      strstr(p.err, "q\\x1b[31m.npy") == NULL || rt_exists(f->o)) {
    show("run with an escape sequence in --q", &p);
    fail();
  }
  rt_proc_free(&p);
  free(q);
  /* A name longer than the line holds (2048) loses its middle, never the reason after it. */
  char *long_q = calloc(1, 3001);
  assert_non_null(long_q);
  memcpy(long_q, f->dir, strlen(f->dir));
  for (size_t i = strlen(f->dir); i < 3000; i++) long_q[i] = i % 200 == 0 ? '/' : 'x';
  const char *const cmd2[] = {"run", f->config, "--q", long_q, "--k", f->k,
                              "--v", f->v,      "--o", f->o,   NULL};
  p = run_rdagen(120, cmd2);
  const size_t len = strlen(p.err);
  static const char reason[] = "No such file or directory\n";
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 || len < sizeof reason ||
      strcmp(p.err + len - (sizeof reason - 1), reason) != 0 || strstr(p.err, "...") == NULL) {
    show("run with a 3000-character --q", &p);
    fail();
  }
  rt_proc_free(&p);
  free(long_q);
}

/* A misspelt RDA_LOG is one warning, and the command runs on with warnings only: a log
 * setting never fails the work. */
static void test_cli_misspelt_rda_log_is_one_warning(void **state) {
  fixture *f = *state;
  char *saved = rt_env_save("RDA_LOG");
  assert_int_equal(setenv("RDA_LOG", "loud", 1), 0);
  const char *const sim[] = {"ring-sim", f->config, "--n", "64", "--ranks", "2", NULL};
  rt_proc p = run_rdagen(120, sim);
  rt_env_restore("RDA_LOG", saved);
  if (p.exit_code != 0 || rt_count_lines(p.err) != 1 ||
      strstr(p.err, "rda: warning: RDA_LOG='loud' is not off, warn, info or debug") == NULL ||
      p.out[0] == '\0') {
    show("ring-sim with RDA_LOG=loud", &p);
    fail();
  }
  rt_proc_free(&p);
}

/* The emulator's schedule settings (RDA_EMU_ORDER, RDA_EMU_STREAMS) with a bad value: one line
 * naming the variable, exit 1, no output written, on one device and on the ring's ranks. */
static void test_cli_bad_emulator_settings_exit_1_and_write_nothing(void **state) {
  fixture *f = *state;
  static const char *const settings[][3] = {
      {"RDA_EMU_ORDER", "backwards", "RDA_EMU_ORDER='backwards'"},
      {"RDA_EMU_STREAMS", "Async", "RDA_EMU_STREAMS='Async'"},
  };
  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
    char *saved = rt_env_save(settings[i][0]); /* a rerun of the suite may set it */
    assert_int_equal(setenv(settings[i][0], settings[i][1], 1), 0);
    const char *const run[] = {"run", f->config, "--q", f->q,        "--k", f->k, "--v",
                               f->v,  "--o",     f->o,  "--backend", "emu", NULL};
    expect_input_error(f, settings[i][0], run, settings[i][2]);
    const char *const ring[] = {"run", f->config, "--q",       f->q,  "--k",     f->k, "--v", f->v,
                                "--o", f->o,      "--backend", "emu", "--ranks", "3",  NULL};
    expect_input_error(f, settings[i][0], ring, settings[i][2]);
    rt_env_restore(settings[i][0], saved);
  }
}

static void test_cli_unwritable_outputs_exit_1_and_write_nothing(void **state) {
  fixture *f = *state;
  char *missing = rt_path(f->dir, "no/such/o.npy");
  char *missing_lse = rt_path(f->dir, "none/lse.npy");
  const char *const a1[] = {"run", f->config, "--q",   f->q,   "--k",       f->k,  "--v", f->v,
                            "--o", missing,   "--lse", f->lse, "--backend", "emu", NULL};
  expect_input_error(f, "--o in a missing folder", a1, missing);
  const char *const a2[] = {"run", f->config, "--q",   f->q,        "--k",       f->k,  "--v", f->v,
                            "--o", f->o,      "--lse", missing_lse, "--backend", "emu", NULL};
  expect_input_error(f, "--lse in a missing folder", a2, missing_lse);
  const char *const a3[] = {"run", f->config, "--q",  f->q,        "--k", f->k, "--v",
                            f->v,  "--o",     f->dir, "--backend", "emu", NULL};
  expect_input_error(f, "--o is a folder", a3, f->dir);
  free(missing), free(missing_lse);
}

/* Zigzag with N % 2P != 0 (N = 40), an unwritable --stats: one clear line, exit 1. */
static void test_cli_ranks_bad_split_exit_1(void **state) {
  fixture *f = *state;
  const char *const zz[] = {"run", f->config, "--q",     f->q, "--k",      f->k,     "--v",
                            f->v,  "--o",     f->o,      "--ranks", "3", "--layout", "zigzag",
                            NULL};
  expect_input_error(f, "zigzag N % 2P", zz, "zigzag");
  /* --stats in a folder that does not exist: refused before anything runs, nothing written. */
  char *missing = rt_path(f->dir, "none/stats.json");
  const char *const st[] = {"run", f->config, "--q", f->q,      "--k", f->k,      "--v",
                            f->v,  "--o",     f->o,  "--ranks", "2",   "--stats", missing,
                            "--backend", "emu", NULL};
  expect_input_error(f, "--stats in a missing folder", st, missing);
  free(missing);
}

static float *read_output(const char *path, int ndim, const long long *shape);

/* --ranks 3 --stats: the gathered O and LSE match the reference; stats name every rank. */
static void test_cli_ranks_3_matches_reference_and_writes_stats(void **state) {
  fixture *f = *state;
  char *stats = rt_path(f->dir, "stats.json");
  const char *const args[] = {"run", f->config, "--q",     f->q, "--k",   f->k,
                              "--v", f->v,      "--o",     f->o, "--lse", f->lse,
                              "--ranks", "3",   "--stats", stats, "--backend", "emu", NULL};
  rt_proc p = run_rdagen(600, args);
  if (p.exit_code != 0) {
    show("--ranks 3", &p);
    fail();
  }
  rt_proc_free(&p);
  const long long N = 40, H = 4, D = 32;
  const long long qs[4] = {1, N, H, D}, ks[4] = {1, N, 2, D};
  double *in[3];
  const char *paths[3] = {f->q, f->k, f->v};
  rda_err err = {0};
  for (int a = 0; a < 3; a++) {
    rda_npy x;
    assert_int_equal(rda_npy_read(paths[a], &x, &err), RDA_OK);
    in[a] = malloc(x.count * sizeof *in[a]);
    assert_non_null(in[a]);
    for (size_t i = 0; i < x.count; i++) in[a][i] = rda_round_to_dtype(x.data[i], RDA_DTYPE_BF16);
    rda_npy_free(&x);
  }
  float *of = read_output(f->o, 4, qs);
  const long long ls[3] = {1, H, N};
  float *lf = read_output(f->lse, 3, ls);
  rda_gen *g = NULL;
  rda_config c;
  assert_int_equal(rda_gen_open(&g, &err), RDA_OK);
  assert_int_equal(rda_gen_config_string(g, small_config, "small.lua", &c, &err), RDA_OK);
  rda_gen_close(g);
  double *o_ref, *lse_ref;
  rt_reference(&c, 1, N, in[0], in[1], in[2], &o_ref, &lse_ref);
  const long long o_s[3] = {N * H * D, H * D, D}, l_s[2] = {H * N, N};
  assert_true(rt_check_fwd("--ranks 3", &c, 1, N, of, o_s, lf, l_s, o_ref, lse_ref, NULL));
  (void)ks;
  size_t len = 0;
  char *text = rt_read_file(stats, &len);
  assert_non_null(text);
  /* 40 rows over 3 ranks: 14, 13, 13; segments of 16 and 32 span ranks, so bytes move. */
  assert_non_null(strstr(text, "\"rank\": 0, \"rows\": 14"));
  assert_non_null(strstr(text, "\"rank\": 1, \"rows\": 13"));
  assert_non_null(strstr(text, "\"rank\": 2, \"rows\": 13"));
  assert_null(strstr(text, "\"rank\": 3"));
  assert_non_null(strstr(text, "\"bytes_received\": "));
  assert_non_null(strstr(text, "\"peak_bytes\": "));
  assert_null(
      strstr(text, "\"rank\": 2, \"rows\": 13, \"bytes_sent\": 0, \"bytes_received\": 0"));
  /* ring-sim predicts each rank's rows, bytes and peak memory exactly as the run counted them. */
  const char *const sim[] = {"ring-sim", f->config, "--n", "40", "--ranks", "3", "--json", NULL};
  p = run_rdagen(60, sim);
  assert_int_equal(p.exit_code, 0);
  for (int r = 0; r < 3; r++) {
    long long got[5], want[5];
    char key[32];
    snprintf(key, sizeof key, "{\"rank\": %d, ", r);
    const char *in_run = strstr(text, key), *in_sim = strstr(p.out, key);
    assert_non_null(in_run), assert_non_null(in_sim);
    static const char fmt[] = "{\"rank\": %lld, \"rows\": %lld, \"bytes_sent\": %lld, "
                              "\"bytes_received\": %lld, \"peak_bytes\": %lld";
    assert_int_equal(sscanf(in_run, fmt, &got[0], &got[1], &got[2], &got[3], &got[4]), 5);
    assert_int_equal(sscanf(in_sim, fmt, &want[0], &want[1], &want[2], &want[3], &want[4]), 5);
    for (int i = 0; i < 5; i++) assert_int_equal(got[i], want[i]);
  }
  rt_proc_free(&p);
  free(text);
  free(of), free(lf), free(o_ref), free(lse_ref);
  for (int a = 0; a < 3; a++) free(in[a]);
  free(stats);
}

/* A bad dO (wrong shape, unreadable, malformed) or an unwritable gradient output: exit 1 with
 * one line naming the file, and none of the five outputs written. */
static void test_cli_backward_bad_inputs_exit_1_and_write_nothing(void **state) {
  fixture *f = *state;
  static const struct {
    const char *what, *descr;
    int fortran, ndim;
    long long shape[4];
    int raw_bytes; /* as with_broken_input */
  } bad_do[] = {
      {"dO heads of K", "<f4", 0, 4, {1, 40, 2, 32}, 0},
      {"dO n", "<f4", 0, 4, {1, 41, 4, 32}, 0},
      {"dO batch", "<f8", 0, 4, {2, 40, 4, 32}, 0},
      {"dO head_dim", "<f4", 0, 4, {1, 40, 4, 64}, 0},
      {"dO 3-d", "<f4", 0, 3, {40, 4, 32, 0}, 0},
      {"dO big-endian", ">f4", 0, 4, {1, 40, 4, 32}, 0},
      {"dO integers", "<i4", 0, 4, {1, 40, 4, 32}, 0},
      {"dO fortran", "<f4", 1, 4, {1, 40, 4, 32}, 0},
      {"dO truncated", NULL, 0, 0, {0}, 300},
      {"dO missing", NULL, 0, 0, {0}, -1},
  };
  for (size_t i = 0; i < sizeof bad_do / sizeof bad_do[0]; i++) {
    char *saved = rt_path(f->dir, "saved.tmp");
    assert_int_equal(rename(f->d_o, saved), 0);
    if (bad_do[i].raw_bytes > 0) {
      size_t len = 0;
      char *b = rt_read_file(saved, &len);
      assert_non_null(b);
      assert_true(rt_write_file(f->d_o, b, (size_t)bad_do[i].raw_bytes));
      free(b);
    } else if (bad_do[i].raw_bytes == 0) {
      size_t n = 1;
      for (int d = 0; d < bad_do[i].ndim; d++) n *= (size_t)bad_do[i].shape[d];
      double *x = rt_normal(n, RDA_DTYPE_BF16);
      assert_true(rt_write_npy(f->d_o, bad_do[i].descr, bad_do[i].fortran, bad_do[i].ndim,
                               bad_do[i].shape, x));
      free(x);
    }
    const char *const args[] = {"run",  f->config, "--q",       f->q,  "--k",   f->k,
                                "--v",  f->v,      "--o",       f->o,  "--lse", f->lse,
                                "--do", f->d_o,    "--dq",      f->dq, "--dk",  f->dk,
                                "--dv", f->dv,     "--backend", "emu", NULL};
    expect_input_error(f, bad_do[i].what, args, f->d_o);
    unlink(f->d_o);
    assert_int_equal(rename(saved, f->d_o), 0);
    free(saved);
  }
  /* A gradient output that cannot be written is found before anything runs. */
  char *missing = rt_path(f->dir, "no/such/dv.npy");
  const char *const a1[] = {"run",  f->config, "--q",  f->q,    "--k",       f->k,   "--v",
                            f->v,   "--o",     f->o,   "--do",  f->d_o,      "--dq", f->dq,
                            "--dk", f->dk,     "--dv", missing, "--backend", "emu",  NULL};
  expect_input_error(f, "--dv in a missing folder", a1, missing);
  const char *const a2[] = {"run",  f->config, "--q",  f->q,   "--k",       f->k,   "--v",
                            f->v,   "--o",     f->o,   "--do", f->d_o,      "--dq", f->dir,
                            "--dk", f->dk,     "--dv", f->dv,  "--backend", "emu",  NULL};
  expect_input_error(f, "--dq is a folder", a2, f->dir);
  free(missing);
}

/* A failed backward run leaves every existing output exactly as it was. */
static void test_cli_backward_failure_keeps_existing_outputs_untouched(void **state) {
  fixture *f = *state;
  const char *outs[5] = {f->o, f->lse, f->dq, f->dk, f->dv};
  for (int i = 0; i < 5; i++) assert_true(rt_write_file(outs[i], "precious", 8));
  const long long bad_shape[4] = {1, 40, 2, 32}; /* dO shaped like K */
  double *x = rt_normal(40 * 2 * 32, RDA_DTYPE_BF16);
  assert_true(rt_write_npy(f->d_o, "<f4", 0, 4, bad_shape, x));
  free(x);
  const char *const args[] = {"run",  f->config, "--q",       f->q,  "--k",   f->k,
                              "--v",  f->v,      "--o",       f->o,  "--lse", f->lse,
                              "--do", f->d_o,    "--dq",      f->dq, "--dk",  f->dk,
                              "--dv", f->dv,     "--backend", "emu", NULL};
  rt_proc p = run_rdagen(300, args);
  if (p.exit_code != 1) show("backward with a bad dO", &p);
  assert_int_equal(p.exit_code, 1);
  for (int i = 0; i < 5; i++) {
    size_t len = 0;
    char *b = rt_read_file(outs[i], &len);
    assert_non_null(b);
    assert_int_equal(len, 8);
    assert_memory_equal(b, "precious", 8);
    free(b);
  }
  assert_null(stray_entry(f, 1));
  rt_proc_free(&p);
}

/* A failed run leaves an existing output file exactly as it was. */
static void test_cli_failure_keeps_existing_output_untouched(void **state) {
  fixture *f = *state;
  assert_true(rt_write_file(f->o, "precious", 8));
  char *missing = rt_path(f->dir, "missing.npy");
  const char *const args[] = {"run", f->config, "--q", missing,     "--k", f->k, "--v",
                              f->v,  "--o",     f->o,  "--backend", "emu", NULL};
  rt_proc p = run_rdagen(300, args);
  assert_int_equal(p.exit_code, 1);
  size_t len = 0;
  char *b = rt_read_file(f->o, &len);
  assert_non_null(b);
  assert_int_equal(len, 8);
  assert_memory_equal(b, "precious", 8);
  assert_null(stray_entry(f, 1));
  free(b), free(missing);
  rt_proc_free(&p);
}

/* --- outputs: identity, links, special files, all or nothing (SPEC §4) ------------------------- */

/* Exit `code` with one first line starting "rdagen: " holding every string of `needles`
 * (NULL-terminated), and no "partial" temporary named. */
static void expect_refusal(const char *what, const char *const *args, int code,
                           const char *const *needles) {
  rt_proc p = run_rdagen(300, args);
  const char *nl = strchr(p.err, '\n');
  const size_t first = nl != NULL ? (size_t)(nl - p.err) : strlen(p.err);
  int ok = p.exit_code == code && strncmp(p.err, "rdagen: ", 8) == 0 &&
           strstr(p.err, "partial") == NULL;
  if (code == 1) ok = ok && rt_count_lines(p.err) == 1 && strncmp(p.err, "rdagen: error: ", 15) == 0;
  for (int i = 0; ok && needles[i] != NULL; i++) {
    const char *at = strstr(p.err, needles[i]);
    ok = at != NULL && (size_t)(at - p.err) < first;
  }
  if (!ok) {
    show(what, &p);
    fprintf(stderr, "wanted exit %d, the first line naming:", code);
    for (int i = 0; needles[i] != NULL; i++) fprintf(stderr, " '%s'", needles[i]);
    fputc('\n', stderr);
    fail();
  }
  rt_proc_free(&p);
}

static bool file_is(const char *path, const char *text) {
  size_t len = 0;
  char *b = rt_read_file(path, &len);
  const bool same = b != NULL && len == strlen(text) && memcmp(b, text, len) == 0;
  free(b);
  return same;
}

/* --stats naming the file of another output (another spelling, a link, a hard link) is bad
 * usage found before anything runs: exit 2, one line naming both flags, nothing written. */
static void test_cli_stats_same_file_as_an_output_exits_2(void **state) {
  fixture *f = *state;
  char *alias = rt_path(f->dir, "./o.npy"), *link_o = rt_path(f->dir, "link-o");
  char *hard = rt_path(f->dir, "hard-lse");
  assert_int_equal(symlink("o.npy", link_o), 0); /* dangling until o.npy exists */
  const char *const spelled[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                 "--o", f->o, "--ranks", "2", "--stats", alias, "--backend",
                                 "emu", NULL};
  static const char *const o_stats[] = {"--o", "--stats", NULL};
  expect_refusal("--stats ./o.npy", spelled, 2, o_stats);
  const char *const linked[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                "--o", f->o, "--stats", link_o, "--backend", "emu", NULL};
  expect_refusal("--stats a dangling link to --o", linked, 2, o_stats);
  assert_true(rt_write_file(f->lse, "precious", 8));
  assert_int_equal(link(f->lse, hard), 0);
  const char *const hard_linked[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                     "--o", f->o, "--lse", f->lse, "--stats", hard,
                                     "--backend", "emu", NULL};
  static const char *const lse_stats[] = {"--lse", "--stats", NULL};
  expect_refusal("--stats a hard link of --lse", hard_linked, 2, lse_stats);
  assert_true(file_is(f->lse, "precious"));
  assert_false(rt_exists(f->o));
  unlink(link_o), unlink(hard), unlink(f->lse);
  assert_null(stray_entry(f, 0));
  free(alias), free(link_o), free(hard);
}

/* An output naming the config or an input (directly, through a link, or as a hard link) would
 * replace it: exit 2 naming both flags, the input untouched. */
static void test_cli_output_onto_an_input_exits_2(void **state) {
  fixture *f = *state;
  size_t qlen = 0, clen = 0;
  char *q_before = rt_read_file(f->q, &qlen), *c_before = rt_read_file(f->config, &clen);
  assert_non_null(q_before), assert_non_null(c_before);
  char *link_k = rt_path(f->dir, "link-k"), *hard_c = rt_path(f->dir, "hard-config");
  char *alias_v = rt_path(f->dir, "./v.npy");
  assert_int_equal(symlink("k.npy", link_k), 0);
  assert_int_equal(link(f->config, hard_c), 0);
  const char *const onto_q[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                "--o", f->q, "--backend", "emu", NULL};
  expect_refusal("--o onto --q", onto_q, 2, (const char *const[]){"--q", "--o", NULL});
  const char *const onto_k[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                "--o", f->o, "--lse", link_k, "--backend", "emu", NULL};
  expect_refusal("--lse a link to --k", onto_k, 2, (const char *const[]){"--k", "--lse", NULL});
  const char *const onto_v[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                "--o", alias_v, "--backend", "emu", NULL};
  expect_refusal("--o ./v.npy", onto_v, 2, (const char *const[]){"--v", "--o", NULL});
  const char *const onto_c[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                "--o", f->o, "--ranks", "2", "--stats", hard_c, "--backend",
                                "emu", NULL};
  expect_refusal("--stats a hard link of the config", onto_c, 2,
                 (const char *const[]){"CONFIG", "--stats", NULL});
  const char *const onto_do[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                 "--o", f->o, "--do", f->d_o, "--dq", f->dq, "--dk", f->dk,
                                 "--dv", f->d_o, "--backend", "emu", NULL};
  expect_refusal("--dv onto --do", onto_do, 2, (const char *const[]){"--do", "--dv", NULL});
  size_t len = 0;
  char *q_after = rt_read_file(f->q, &len);
  assert_non_null(q_after);
  assert_int_equal(len, qlen);
  assert_memory_equal(q_after, q_before, qlen);
  char *c_after = rt_read_file(f->config, &len);
  assert_non_null(c_after);
  assert_int_equal(len, clen);
  assert_memory_equal(c_after, c_before, clen);
  unlink(link_k), unlink(hard_c);
  assert_null(stray_entry(f, 0));
  free(q_before), free(c_before), free(q_after), free(c_after);
  free(link_k), free(hard_c), free(alias_v);
}

/* Outputs reached through symbolic links are written where the links lead (an existing target
 * replaced, a dangling link's target created), the links kept; a FIFO, a folder, or a link to
 * one, is refused before anything runs with one line naming it. */
static void test_cli_outputs_follow_links_and_refuse_special_files(void **state) {
  fixture *f = *state;
  char *real = rt_path(f->dir, "real"), *o_target = rt_path(f->dir, "real/o-target.npy");
  char *lse_target = rt_path(f->dir, "real/lse-new.npy");
  assert_int_equal(mkdir(real, 0755), 0);
  assert_true(rt_write_file(o_target, "stale", 5));
  assert_int_equal(symlink("real/o-target.npy", f->o), 0);      /* relative, existing */
  assert_int_equal(symlink(lse_target, f->lse), 0);             /* absolute, dangling */
  const char *const args[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                              "--o", f->o, "--lse", f->lse, "--backend", "emu", NULL};
  rt_proc p = run_rdagen(600, args);
  if (p.exit_code != 0) {
    show("outputs through links", &p);
    fail();
  }
  rt_proc_free(&p);
  struct stat st;
  assert_int_equal(lstat(f->o, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  assert_int_equal(lstat(f->lse, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  const long long os[4] = {1, 40, 4, 32}, ls[3] = {1, 4, 40};
  free(read_output(o_target, 4, os));
  free(read_output(lse_target, 3, ls));
  assert_int_equal(rt_count_entries(real), 2); /* no temporaries or backups left */
  unlink(f->o), unlink(f->lse);

  /* A name of 250 bytes (NAME_MAX is 255): the temporaries beside it must not be longer. */
  char longname[251];
  memset(longname, 'o', 246);
  memcpy(longname + 246, ".npy", 5);
  char *o_long = rt_path(real, longname);
  assert_true(rt_write_file(o_long, "stale", 5));
  const char *const to_long[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                 "--o", o_long, "--backend", "emu", NULL};
  p = run_rdagen(600, to_long);
  if (p.exit_code != 0) {
    show("an output name of 250 bytes", &p);
    fail();
  }
  rt_proc_free(&p);
  free(read_output(o_long, 4, os));
  assert_int_equal(rt_count_entries(real), 3);
  unlink(o_long);
  free(o_long);

  /* A FIFO (would block, or be replaced), a folder behind a link, a link to a FIFO. */
  char *fifo = rt_path(f->dir, "fifo"), *link_fifo = rt_path(f->dir, "link-fifo");
  char *link_dir = rt_path(f->dir, "link-dir");
  assert_int_equal(mkfifo(fifo, 0644), 0);
  assert_int_equal(symlink("fifo", link_fifo), 0);
  assert_int_equal(symlink("real", link_dir), 0);
  const char *const to_fifo[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                 "--o", fifo, "--backend", "emu", NULL};
  expect_refusal("--o a FIFO", to_fifo, 1, (const char *const[]){fifo, "FIFO", NULL});
  const char *const to_link_fifo[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                      "--o", f->o, "--lse", link_fifo, "--backend", "emu", NULL};
  expect_refusal("--lse a link to a FIFO", to_link_fifo, 1,
                 (const char *const[]){link_fifo, "FIFO", NULL});
  const char *const to_dir[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                "--o", f->o, "--ranks", "2", "--stats", link_dir, "--backend",
                                "emu", NULL};
  expect_refusal("--stats a link to a folder", to_dir, 1,
                 (const char *const[]){link_dir, "folder", NULL});
  assert_int_equal(lstat(fifo, &st), 0);
  assert_true(S_ISFIFO(st.st_mode));
  assert_false(rt_exists(f->o));
  assert_int_equal(rt_count_entries(real), 2);
  unlink(fifo), unlink(link_fifo), unlink(link_dir);
  rt_rmtree(real);
  assert_null(stray_entry(f, 0));
  free(real), free(o_target), free(lse_target), free(fifo), free(link_fifo), free(link_dir);
}

/* An output that cannot be created is named as the user gave it, never as the temporary; the
 * other outputs are not left behind. */
static void test_cli_uncreatable_output_names_the_users_path(void **state) {
  fixture *f = *state;
  const char *const args[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                              "--o", f->o, "--lse", "/proc/l.npy", "--backend", "emu", NULL};
  expect_refusal("--lse /proc/l.npy", args, 1, (const char *const[]){"/proc/l.npy: ", NULL});
  assert_false(rt_exists("/proc/l.npy"));
  assert_null(stray_entry(f, 0));
}

/* An input element that is NaN, infinite, or overflows the config's dtype once rounded: exit 1,
 * one line naming the file, the element [b, n, h, d], its value and what is allowed. */
static void test_cli_non_finite_inputs_exit_1_naming_the_element(void **state) {
  fixture *f = *state;
  static const char fp16_config[] =
      "return { heads = 4, kv_heads = 2, head_dim = 32, dtype = 'fp16',\n"
      "  segments = { 16, 32 }, dilations = { 1, 2 }, causal = true }\n";
  const struct {
    const char *config; /* NULL: the fixture's bf16 one */
    int which;          /* 0 q, 1 k, 2 v */
    long long at[4];
    double value;
    const char *shows[3];
  } cases[] = {
      {NULL, 0, {0, 3, 1, 7}, NAN, {"[0, 3, 1, 7]", "is NaN", "finite"}},
      {NULL, 1, {0, 39, 1, 31}, -INFINITY, {"[0, 39, 1, 31]", "-inf", "bf16"}},
      {fp16_config, 2, {0, 5, 0, 2}, 1e5, {"[0, 5, 0, 2]", "100000", "65504"}},
      {fp16_config, 0, {0, 0, 3, 0}, -65520.0, {"[0, 0, 3, 0]", "-65520", "fp16"}},
  };
  const char *paths[3] = {f->q, f->k, f->v};
  const long long shapes[3][4] = {{1, 40, 4, 32}, {1, 40, 2, 32}, {1, 40, 2, 32}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const char *config = cases[c].config != NULL ? cases[c].config : small_config;
    assert_true(rt_write_file(f->config, config, strlen(config)));
    const long long *s = shapes[cases[c].which];
    const size_t n = (size_t)(s[0] * s[1] * s[2] * s[3]);
    double *x = rt_normal(n, RDA_DTYPE_BF16);
    const long long *a = cases[c].at;
    x[((a[0] * s[1] + a[1]) * s[2] + a[2]) * s[3] + a[3]] = cases[c].value;
    char *saved = rt_path(f->dir, "saved.tmp");
    const char *path = paths[cases[c].which];
    assert_int_equal(rename(path, saved), 0);
    assert_true(rt_write_npy(path, "<f4", 0, 4, s, x));
    free(x);
    const char *const args[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                "--o", f->o, "--lse", f->lse, "--backend", "emu", NULL};
    const char *const needles[] = {path, cases[c].shows[0], cases[c].shows[1], cases[c].shows[2],
                                   NULL};
    expect_refusal(cases[c].shows[0], args, 1, needles);
    assert_null(stray_entry(f, 0));
    unlink(path);
    assert_int_equal(rename(saved, path), 0);
    free(saved);
  }
}

/* Keys and values of another length than the queries (cross-attention, SPEC section 1: not
 * defined): exit 1, one line naming the file, the shapes and why; nothing written. */
static void test_cli_cross_attention_is_refused_as_such(void **state) {
  fixture *f = *state;
  assert_true(rt_write_file(f->config, small_config, strlen(small_config)));
  const long long s[4] = {1, 48, 2, 32}; /* N = 48 keys for 40 queries */
  const char *paths[2] = {f->k, f->v};
  for (int i = 0; i < 2; i++) {
    char *saved = rt_path(f->dir, "saved.tmp");
    assert_int_equal(rename(paths[i], saved), 0);
    double *x = rt_normal((size_t)(s[0] * s[1] * s[2] * s[3]), RDA_DTYPE_BF16);
    assert_true(rt_write_npy(paths[i], "<f4", 0, 4, s, x));
    free(x);
    const char *const args[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                                "--o", f->o, "--lse", f->lse, "--backend", "emu", NULL};
    const char *const needles[] = {paths[i], "(1, 48, 2, 32)", "(1, 40, 2, 32)",
                                   "cross-attention", NULL};
    expect_refusal(paths[i], args, 1, needles);
    assert_null(stray_entry(f, 0));
    unlink(paths[i]);
    assert_int_equal(rename(saved, paths[i]), 0);
    free(saved);
  }
}

/* Finite inputs with a legal but huge scale: the true scores leave float32. Exit 1 with one
 * line naming the output element that is not finite; no output written (the existing one kept,
 * no stats file), on one device and on the ring. */
static void test_cli_non_finite_result_exits_1_and_writes_nothing(void **state) {
  fixture *f = *state;
  static const char huge[] =
      "return { heads = 4, kv_heads = 2, head_dim = 32, dtype = 'bf16',\n"
      "  segments = { 16, 32 }, dilations = { 1, 2 }, causal = true, scale = 1e38 }\n";
  assert_true(rt_write_file(f->config, huge, strlen(huge)));
  assert_true(rt_write_file(f->o, "precious", 8));
  char *stats = rt_path(f->dir, "stats.json");
  const char *const one[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                             "--o", f->o, "--lse", f->lse, "--backend", "emu", NULL};
  static const char *const says[] = {"O (--o '", "element [", "overflows float32", "scale",
                                     NULL};
  expect_refusal("scale 1e38", one, 1, says);
  const char *const ring[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                              "--o", f->o, "--ranks", "2", "--stats", stats, "--backend", "emu",
                              NULL};
  expect_refusal("scale 1e38 on the ring", ring, 1, says);
  assert_true(file_is(f->o, "precious"));
  assert_false(rt_exists(stats));
  assert_null(stray_entry(f, 1));

  /* The other way to overflow: every score of a covered row so negative in fp32 that the row
   * looks uncovered (O = 0, LSE = -inf). Segments of one row, so each row's only key is its
   * own, with q = 1 and k = -3 everywhere: the scores are -96 scale. */
  static const char under[] =
      "return { heads = 4, kv_heads = 2, head_dim = 32, dtype = 'bf16',\n"
      "  segments = { 1 }, dilations = { 1 }, scale = 1e38 }\n";
  assert_true(rt_write_file(f->config, under, strlen(under)));
  const long long qs[4] = {1, 40, 4, 32}, ks[4] = {1, 40, 2, 32};
  double *q = malloc(40 * 4 * 32 * sizeof *q), *k = malloc(40 * 2 * 32 * sizeof *k);
  assert_true(q != NULL && k != NULL);
  for (int i = 0; i < 40 * 4 * 32; i++) q[i] = 1.0;
  for (int i = 0; i < 40 * 2 * 32; i++) k[i] = -3.0;
  assert_true(rt_write_npy(f->q, "<f4", 0, 4, qs, q) && rt_write_npy(f->k, "<f4", 0, 4, ks, k));
  free(q);
  free(k);
  static const char *const under_says[] = {"LSE (--lse '", "is -inf on a row with keys",
                                           "overflows float32", NULL};
  expect_refusal("scores below fp32", one, 1, under_says);
  assert_true(file_is(f->o, "precious"));
  assert_false(rt_exists(f->lse));
  assert_null(stray_entry(f, 1));
  free(stats);
}

/* --- real runs on the emulator ---------------------------------------------------------------- */

typedef struct run_case {
  const char *name;
  const char *config;
  int heads, kv_heads, head_dim, dtype;
  long long batch, n;
  const char *descr; /* input file dtype */
  int with_lse;
  const char *backend_arg; /* how --backend is spelled */
  int no_gpu_ok;           /* cuda: with no usable GPU, a clean exit 1 is the right answer */
  int backward;            /* also --do/--dq/--dk/--dv, the gradients checked too */
  const char *ranks;       /* --ranks value; NULL means "1" */
} run_case;

/* Read an fp32 .npy output of the given shape into malloc'd floats. */
static float *read_output(const char *path, int ndim, const long long *shape) {
  rda_npy a;
  rda_err err = {0};
  const rda_status st = rda_npy_read(path, &a, &err);
  if (st != RDA_OK) fprintf(stderr, "%s\n", err.msg);
  assert_int_equal(st, RDA_OK);
  assert_int_equal(a.ndim, ndim);
  for (int i = 0; i < ndim; i++) assert_int_equal(a.shape[i], shape[i]);
  float *x = malloc((a.count ? a.count : 1) * sizeof *x);
  assert_non_null(x);
  for (size_t i = 0; i < a.count; i++) x[i] = (float)a.data[i];
  rda_npy_free(&a);
  return x;
}

static void run_and_compare(fixture *f, const run_case *rc) {
  assert_true(rt_write_file(f->config, rc->config, strlen(rc->config)));
  const long long B = rc->batch, N = rc->n, H = rc->heads, Hkv = rc->kv_heads, D = rc->head_dim;
  const long long qs[4] = {B, N, H, D}, ks[4] = {B, N, Hkv, D};
  /* Inputs drawn in float64 and written in descr; the CLI rounds to the config's dtype, so the
   * reference runs on the same rounding of what the file holds. */
  double *q = rt_normal((size_t)(B * N * H * D), RT_DTYPE_F64);
  double *k = rt_normal((size_t)(B * N * Hkv * D), RT_DTYPE_F64);
  double *v = rt_normal((size_t)(B * N * Hkv * D), RT_DTYPE_F64);
  double *d_o = rt_normal((size_t)(B * N * H * D), RT_DTYPE_F64);
  assert_true(rt_write_npy(f->q, rc->descr, 0, 4, qs, q));
  assert_true(rt_write_npy(f->k, rc->descr, 0, 4, ks, k));
  assert_true(rt_write_npy(f->v, rc->descr, 0, 4, ks, v));
  if (rc->backward) assert_true(rt_write_npy(f->d_o, rc->descr, 0, 4, qs, d_o));
  double *arrays[4] = {q, k, v, d_o};
  const char *paths[4] = {f->q, f->k, f->v, f->d_o};
  for (int a = 0; a < 3 + rc->backward; a++) { /* what the file holds, rounded to the dtype */
    rda_npy in;
    rda_err err = {0};
    assert_int_equal(rda_npy_read(paths[a], &in, &err), RDA_OK);
    for (size_t i = 0; i < in.count; i++) arrays[a][i] = rda_round_to_dtype(in.data[i], rc->dtype);
    rda_npy_free(&in);
  }

  const char *args[MAX_ARGS];
  int n = 0;
  /* flags in a scrambled order, both spellings */
  args[n++] = "run";
  args[n++] = "--o";
  args[n++] = f->o;
  args[n++] = f->config;
  if (rc->with_lse) args[n++] = "--lse", args[n++] = f->lse;
  char qarg[600];
  snprintf(qarg, sizeof qarg, "--q=%s", f->q);
  args[n++] = "--v", args[n++] = f->v, args[n++] = qarg, args[n++] = "--k", args[n++] = f->k;
  if (strchr(rc->backend_arg, '=') != NULL)
    args[n++] = rc->backend_arg;
  else
    args[n++] = "--backend", args[n++] = rc->backend_arg;
  args[n++] = "--ranks", args[n++] = rc->ranks != NULL ? rc->ranks : "1";
  if (rc->backward) {
    args[n++] = "--dv", args[n++] = f->dv, args[n++] = "--do", args[n++] = f->d_o;
    args[n++] = "--dk", args[n++] = f->dk, args[n++] = "--dq", args[n++] = f->dq;
  }
  args[n] = NULL;
  const char *const outs[4] = {f->o, f->dq, f->dk, f->dv};
  for (int i = 0; i < (rc->backward ? 4 : 1); i++) /* a run replaces an existing output */
    assert_true(rt_write_file(outs[i], "stale", 5));
  rt_proc p = run_rdagen(900, args);
  if (rc->no_gpu_ok && p.exit_code == 1) {
    /* No GPU here: the failure must follow SPEC §4 (one line, nothing written). */
    int untouched = 1;
    for (int i = 0; i < (rc->backward ? 4 : 1); i++) {
      size_t len = 0;
      char *kept = rt_read_file(outs[i], &len);
      untouched &= kept != NULL && len == 5 && memcmp(kept, "stale", 5) == 0;
      free(kept);
    }
    if (rt_count_lines(p.err) != 1 || strncmp(p.err, "rdagen: error: ", 15) != 0 ||
        stray_entry(f, 1) != NULL || !untouched || rt_exists(f->lse)) {
      show(rc->name, &p);
      fail();
    }
    fprintf(stderr, "note: %s: no usable GPU, checked the clean failure only: %s", rc->name, p.err);
    rt_proc_free(&p);
    free(q), free(k), free(v), free(d_o);
    return;
  }
  if (p.exit_code != 0) {
    show(rc->name, &p);
    fail();
  }
  if (strstr(rc->backend_arg, "auto") != NULL) assert_non_null(strstr(p.err, "rdagen: backend: "));
  assert_null(stray_entry(f, 1)); /* no temporaries left */
  rt_proc_free(&p);

  rda_npy o, lse;
  rda_err err = {0};
  assert_int_equal(rda_npy_read(f->o, &o, &err), RDA_OK);
  assert_int_equal(o.ndim, 4);
  for (int i = 0; i < 4; i++) assert_int_equal(o.shape[i], qs[i]);
  float *of = malloc(o.count * sizeof *of);
  float *lf = malloc((size_t)(B * H * N) * sizeof *lf);
  assert_non_null(of), assert_non_null(lf);
  for (size_t i = 0; i < o.count; i++) of[i] = (float)o.data[i];
  if (rc->with_lse) {
    assert_int_equal(rda_npy_read(f->lse, &lse, &err), RDA_OK);
    assert_int_equal(lse.ndim, 3);
    assert_int_equal(lse.shape[0], B);
    assert_int_equal(lse.shape[1], H);
    assert_int_equal(lse.shape[2], N);
    for (size_t i = 0; i < lse.count; i++) lf[i] = (float)lse.data[i];
    rda_npy_free(&lse);
  } else {
    assert_false(rt_exists(f->lse));
  }
  rda_npy_free(&o);

  /* The config as the generator reads it, for the reference. */
  rda_gen *g = NULL;
  rda_config c;
  assert_int_equal(rda_gen_open(&g, &err), RDA_OK);
  assert_int_equal(rda_gen_config_string(g, rc->config, rc->name, &c, &err), RDA_OK);
  rda_gen_close(g);
  double *o_ref, *lse_ref;
  rt_reference(&c, B, N, q, k, v, &o_ref, &lse_ref);
  if (!rc->with_lse) /* O alone: judge LSE as matching so only O is compared */
    for (long long i = 0; i < B * H * N; i++) lf[i] = (float)lse_ref[i];
  const long long o_s[3] = {N * H * D, H * D, D}, l_s[2] = {H * N, N};
  rt_report rep;
  assert_true(rt_check_fwd(rc->name, &c, B, N, of, o_s, lf, l_s, o_ref, lse_ref, &rep));
  assert_true(rep.covered_rows > 0);
  free(of), free(lf), free(o_ref), free(lse_ref);

  if (rc->backward) { /* dQ, dK, dV against the reference gradient (dLSE = 0) */
    float *dq = read_output(f->dq, 4, qs), *dk = read_output(f->dk, 4, ks);
    float *dv = read_output(f->dv, 4, ks);
    double *dq_ref, *dk_ref, *dv_ref;
    rt_reference_bwd(&c, B, N, q, k, v, d_o, NULL, &dq_ref, &dk_ref, &dv_ref);
    const long long k_s[3] = {N * Hkv * D, Hkv * D, D};
    rt_grad_report grep;
    assert_true(
        rt_check_bwd(rc->name, &c, B, N, dq, o_s, dk, k_s, dv, k_s, dq_ref, dk_ref, dv_ref, &grep));
    free(dq), free(dk), free(dv), free(dq_ref), free(dk_ref), free(dv_ref);
  } else {
    assert_false(rt_exists(f->dq) || rt_exists(f->dk) || rt_exists(f->dv));
  }
  free(q), free(k), free(v), free(d_o);
}

/* The cases' fields are grouped: problem, inputs, how the CLI runs. */
// clang-format off
static void test_cli_run_emu_matches_reference_bf16_causal_gqa(void **state) {
  const run_case rc = {
      .name = "bf16 causal gqa",
      .config = "return { heads = 4, kv_heads = 2, head_dim = 32, dtype = 'bf16',\n"
                "  segments = { 32, 64, 256 }, dilations = { 1, 2, 4 }, causal = true }\n",
      .heads = 4, .kv_heads = 2, .head_dim = 32, .dtype = RDA_DTYPE_BF16,
      .batch = 2, .n = 96, .descr = "<f4", .with_lse = 1,
      .backend_arg = "emu"};
  run_and_compare(*state, &rc);
}

static void test_cli_run_emu_matches_reference_fp16_group_offsets_f8_inputs(void **state) {
  const run_case rc = {
      .name = "fp16 group offsets",
      .config = "return { heads = 3, head_dim = 64, dtype = 'fp16', offsets = 'group',\n"
                "  segments = { 24, 40 }, dilations = { 3, 2 }, scale = 0.2 }\n",
      .heads = 3, .kv_heads = 3, .head_dim = 64, .dtype = RDA_DTYPE_FP16,
      .batch = 1, .n = 70, .descr = "<f8",
      .backend_arg = "--backend=emu"};
  run_and_compare(*state, &rc);
}

static void test_cli_run_auto_reads_f2_and_says_which_backend(void **state) {
  const run_case rc = {
      .name = "auto backend f2 inputs",
      .config = "return { heads = 2, head_dim = 32, dtype = 'fp16', segments = { 64 }, "
                "dilations = { 1 } }\n",
      .heads = 2, .kv_heads = 2, .head_dim = 32, .dtype = RDA_DTYPE_FP16,
      .batch = 1, .n = 64, .descr = "<f2", .with_lse = 1,
      .backend_arg = "auto"};
  run_and_compare(*state, &rc);
}

/* --backend cuda runs on the GPU when there is one (checked against the reference), and
 * otherwise fails with one clear line and no output. */
static void test_cli_run_cuda_matches_reference_or_fails_cleanly(void **state) {
  const run_case rc = {
      .name = "cuda backend",
      .config = "return { heads = 4, kv_heads = 1, head_dim = 64, dtype = 'bf16',\n"
                "  segments = { 32, 128 }, dilations = { 1, 4 }, causal = true }\n",
      .heads = 4, .kv_heads = 1, .head_dim = 64, .dtype = RDA_DTYPE_BF16,
      .batch = 2, .n = 100, .descr = "<f4", .with_lse = 1,
      .backend_arg = "cuda", .no_gpu_ok = 1};
  run_and_compare(*state, &rc);
}

/* Multi-branch, causal, GQA, bf16, two batch elements: the backward pass on one device, and on
 * the ring's virtual ranks. */
static const run_case kBackwardBf16CausalGqa = {
    .name = "backward bf16 causal gqa",
    .config = "return { heads = 4, kv_heads = 2, head_dim = 32, dtype = 'bf16',\n"
              "  segments = { 16, 32, 256 }, dilations = { 1, 2, 4 }, causal = true }\n",
    .heads = 4, .kv_heads = 2, .head_dim = 32, .dtype = RDA_DTYPE_BF16,
    .batch = 2, .n = 72, .descr = "<f4", .with_lse = 1,
    .backend_arg = "emu", .backward = 1};

/* fp16 causal GQA on --backend cuda: checked against the reference on a GPU, else a clean
 * failure that leaves every output as it was; on one device and on the ring. */
static const run_case kBackwardCuda = {
    .name = "backward cuda backend",
    .config = "return { heads = 4, kv_heads = 2, head_dim = 64, dtype = 'fp16',\n"
              "  segments = { 32, 128 }, dilations = { 1, 4 }, causal = true }\n",
    .heads = 4, .kv_heads = 2, .head_dim = 64, .dtype = RDA_DTYPE_FP16,
    .batch = 2, .n = 100, .descr = "<f4", .with_lse = 1,
    .backend_arg = "cuda", .no_gpu_ok = 1, .backward = 1};

/* The backward pass through the CLI. */
static void test_cli_backward_emu_matches_reference_bf16_causal_gqa(void **state) {
  run_and_compare(*state, &kBackwardBf16CausalGqa);
}

/* fp16, the "group" offset rule (uncovered rows), a custom scale, MQA, <f8 inputs, no --lse. */
static void test_cli_backward_emu_matches_reference_fp16_group_mqa(void **state) {
  const run_case rc = {
      .name = "backward fp16 group mqa",
      .config = "return { heads = 3, kv_heads = 1, head_dim = 64, dtype = 'fp16',\n"
                "  offsets = 'group', segments = { 24, 40 }, dilations = { 3, 2 },\n"
                "  scale = 0.2 }\n",
      .heads = 3, .kv_heads = 1, .head_dim = 64, .dtype = RDA_DTYPE_FP16,
      .batch = 1, .n = 50, .descr = "<f8",
      .backend_arg = "--backend=emu", .backward = 1};
  run_and_compare(*state, &rc);
}

/* The backward pass on --backend cuda (see kBackwardCuda). */
static void test_cli_backward_cuda_matches_reference_or_fails_cleanly(void **state) {
  run_and_compare(*state, &kBackwardCuda);
}

/* base on the ring with `ranks` virtual ranks over n rows (more ranks than rows here). */
static void run_more_ranks(void **state, run_case rc, const char *name, long long n,
                           const char *ranks) {
  rc.name = name, rc.n = n, rc.ranks = ranks;
  run_and_compare(*state, &rc);
}

/* More ranks than rows (SPEC §1: any P): 9 rows over 12 virtual ranks, the last three owning
 * none, forward and backward against the reference. */
static void test_cli_ring_more_ranks_than_rows(void **state) {
  run_more_ranks(state, kBackwardBf16CausalGqa, "ring backward, 9 rows over 12 ranks", 9, "12");
}

/* The same on device virtual ranks: 5 rows over 8 (a GPU, else a clean failure). */
static void test_cli_ring_cuda_more_ranks_than_rows(void **state) {
  run_more_ranks(state, kBackwardCuda, "ring cuda backward, 5 rows over 8 ranks", 5, "8");
}

/* The ring backward through the CLI: 3 virtual ranks of the emulator, gradients gathered and
 * checked against the reference (dK/dV rows include what other ranks returned). */
static void test_cli_ring_backward_emu_matches_reference(void **state) {
  run_case rc = kBackwardBf16CausalGqa;
  rc.name = "ring backward bf16 causal gqa";
  rc.ranks = "3";
  run_and_compare(*state, &rc);
}

/* --ranks 2 --backend cuda: the ring over device virtual ranks of one GPU, forward and
 * backward, checked against the reference on a GPU, else a clean failure. */
static void test_cli_ring_cuda_matches_reference_or_fails_cleanly(void **state) {
  run_case rc = kBackwardCuda;
  rc.name = "ring cuda backend";
  rc.ranks = "2";
  run_and_compare(*state, &rc);
}
// clang-format on

/* --- rdagen tune ----------------------------------------------------------------------------- */

/* `rdagen tune` on the emulator with a private database (RDA_TUNING_DB and --db): it writes the
 * database, which loads (a plan made with it takes tuned tiles; `rdagen run` works with it);
 * --dry-run writes no database. */
static void test_cli_tune_writes_a_database_that_plans_read(void **state) {
  fixture *f = *state;
  char *db = rt_path(f->dir, "tuning.lua"), *dry = rt_path(f->dir, "dry.lua");
  char *saved = rt_env_save("RDA_TUNING_DB"); /* put back after: CTest's never-existing file */
  assert_int_equal(setenv("RDA_TUNING_DB", db, 1), 0);
  const char *const tune[] = {"tune", f->config, "--n", "96", "--iters=1", "--verify-n", "64",
                              "--seed", "3", "--backend", "emu", "--db", db, NULL};
  char *lock = rt_path(f->dir, "tuning.lua.lock");
  rt_proc p = run_rdagen(900, tune);
  if (p.exit_code != 0 || !rt_exists(db) || strstr(p.out, "emu-sm_90") == NULL ||
      strstr(p.out, "wrote 2 entries") == NULL || p.err[0] != '\0' || rt_exists(lock)) {
    show("tune", &p);
    fail();
  }
  rt_proc_free(&p);
  char *text = rt_read_file(db, NULL);
  assert_non_null(text);
  assert_non_null(strstr(text, "emu-sm_90"));
  free(text);

  /* The database loads: every forward kernel of the config's plan on the emulator is tuned. */
  rda_gen *g = NULL;
  rda_err err = {0};
  rda_config c;
  rda_hw hw;
  rda_plan_k plan;
  assert_int_equal(rda_gen_open(&g, &err), RDA_OK);
  assert_int_equal(rda_gen_config_string(g, small_config, "small", &c, &err), RDA_OK);
  assert_int_equal(rda_gen_hw_builtin(g, 90, &hw, &err), RDA_OK);
  hw.emulated = 1;
  const rda_status st = rda_gen_plan(g, &c, &hw, &plan, &err);
  if (st != RDA_OK) fprintf(stderr, "plan with the tuned database: %s\n", err.msg);
  assert_int_equal(st, RDA_OK);
  for (int i = 0; i < plan.nsteps; i++)
    assert_int_equal(plan.variants[plan.steps[i].kernel].tuned, 1);
  rda_plan_k_free(&plan);
  rda_gen_close(g);
  const char *const run[] = {"run", f->config, "--q", f->q,        "--k", f->k, "--v",
                             f->v,  "--o",     f->o,  "--backend", "emu", NULL};
  p = run_rdagen(900, run);
  if (p.exit_code != 0 || !rt_exists(f->o)) {
    show("run with the tuned database", &p);
    fail();
  }
  rt_proc_free(&p);

  const char *const dry_run[] = {"tune", f->config, "--n", "96", "--iters", "1", "--backend",
                                 "emu", "--db", dry, "--dry-run", NULL};
  p = run_rdagen(900, dry_run);
  if (p.exit_code != 0 || rt_exists(dry) || strstr(p.out, "dry run") == NULL) {
    show("tune --dry-run", &p);
    fail();
  }
  rt_proc_free(&p);
  rt_env_restore("RDA_TUNING_DB", saved);
  free(db), free(dry), free(lock);
}

/* --help names tune; bad usage exits 2; a missing config or a corrupt database exits 1 with
 * one error line and leaves the database as it was. */
static void test_cli_tune_bad_input_exits_and_keeps_the_database(void **state) {
  fixture *f = *state;
  char *db = rt_path(f->dir, "tuning.lua"), *missing = rt_path(f->dir, "missing.lua");
  char *saved = rt_env_save("RDA_TUNING_DB"); /* put back after: CTest's never-existing file */
  assert_int_equal(setenv("RDA_TUNING_DB", db, 1), 0);
  const char *C = f->config;
  static const char *const help[] = {"--help", NULL}, *const tune_help[] = {"tune", "--help", NULL};
  rt_proc h = run_rdagen(60, help);
  assert_int_equal(h.exit_code, 0);
  assert_non_null(strstr(h.out, "tune CONFIG"));
  rt_proc_free(&h);
  h = run_rdagen(60, tune_help);
  assert_int_equal(h.exit_code, 0);
  assert_non_null(strstr(h.out, "--dry-run"));
  rt_proc_free(&h);
  const char *const usage[][MAX_ARGS] = {
      {"tune", NULL},
      {"tune", C, "--n", "0", NULL},
      {"tune", C, "--n", "-5", NULL},
      {"tune", C, "--n", "12x", NULL},
      {"tune", C, "--n=", NULL},
      {"tune", C, "--n", NULL},
      {"tune", C, "--n", "99999999999999999999", NULL},
      {"tune", C, "--batch", "0", NULL},
      {"tune", C, "--iters", "1.5", NULL},
      {"tune", C, "--verify-n", " 64", NULL},
      {"tune", C, "--seed", "-1", NULL},
      {"tune", C, "--backend", "gpu", NULL},
      {"tune", C, "--dry-run=1", NULL},
      {"tune", C, "--n", "64", "--n", "64", NULL},
      {"tune", C, "--frobnicate", NULL},
      {"tune", C, "-x", NULL},
      {"tune", C, C, NULL},
  };
  for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
    rt_proc p = run_rdagen(60, usage[i]);
    if (p.exit_code != 2 || strncmp(p.err, "rdagen: ", 8) != 0 || rt_exists(db)) {
      char what[32];
      snprintf(what, sizeof what, "tune usage case %zu", i);
      show(what, &p);
      fail();
    }
    rt_proc_free(&p);
  }
  const char *const no_config[] = {"tune", missing, "--backend", "emu", NULL};
  expect_input_error(f, "tune: missing config", no_config, "missing.lua");

  static const char corrupt[] = "return { { target = 'sm_90', kind = 'fwd' } }\n";
  assert_true(rt_write_file(db, corrupt, strlen(corrupt)));
  const char *const tune[] = {"tune", C, "--n", "64", "--iters", "1", "--backend", "emu", NULL};
  const int entries = rt_count_entries(f->dir);
  rt_proc p = run_rdagen(900, tune);
  char *kept = rt_read_file(db, NULL);
  /* Nothing left behind either: the writers' lock beside the database is gone. */
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 ||
      strncmp(p.err, "rdagen: error: ", 15) != 0 || strstr(p.err, "tuning.lua") == NULL ||
      kept == NULL || strcmp(kept, corrupt) != 0 || rt_count_entries(f->dir) != entries) {
    show("tune with a corrupt database", &p);
    fail();
  }
  rt_proc_free(&p);
  free(kept);
  unlink(db);

  /* Standard output on a full disk, or a pipe nobody reads (the tune stops at its first line,
   * SIGPIPE): one error line, exit 1, no database and no lock file left. */
  const int before = rt_count_entries(f->dir);
  char closed_pipe[64];
  const int pipe_fd = closed_pipe_command(closed_pipe, sizeof closed_pipe);
  char *const redirects[2] = {arg("exec \"$0\" \"$@\" > /dev/full"), closed_pipe};
  for (int r = 0; r < 2; r++) {
    char *argv[] = {arg("/bin/sh"),   arg("-c"),  redirects[r], arg(RDAGEN_PATH), arg("tune"),
                    f->config,        arg("--n"), arg("64"),    arg("--iters"),   arg("1"),
                    arg("--backend"), arg("emu"), NULL};
    assert_true(rt_run(argv, 900, &p));
    if (p.exit_code != 1 || rt_count_lines(p.err) != 1 ||
        strstr(p.err, "cannot write to standard output") == NULL || rt_exists(db) ||
        rt_count_entries(f->dir) != before) {
      show(r ? "tune with standard output a closed pipe" : "tune with standard output full", &p);
      fail();
    }
    rt_proc_free(&p);
  }
  close(pipe_fd);

  /* A kernel cache it must refuse (writable by others) is one line naming the folder, not a
   * failure of every tile. */
  char *saved_cache = rt_env_save("RDA_CACHE_DIR");
  char *open_cache = rt_path(f->dir, "open_cache");
  assert_int_equal(mkdir(open_cache, 0700), 0);
  assert_int_equal(chmod(open_cache, 0777), 0);
  assert_int_equal(setenv("RDA_CACHE_DIR", open_cache, 1), 0);
  p = run_rdagen(900, tune);
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 || strstr(p.err, open_cache) == NULL ||
      strstr(p.err, "writable by group or others") == NULL || rt_exists(db)) {
    show("tune with a refused kernel cache", &p);
    fail();
  }
  rt_proc_free(&p);
  rt_env_restore("RDA_CACHE_DIR", saved_cache);
  rmdir(open_cache);
  free(open_cache);

  /* No cache folder at all (and no RDA_TUNING_DB): a dry run needs no database. */
  char *saved_home = rt_env_save("HOME"), *saved_xdg = rt_env_save("XDG_CACHE_HOME");
  saved_cache = rt_env_save("RDA_CACHE_DIR");
  unsetenv("HOME"), unsetenv("XDG_CACHE_HOME"), unsetenv("RDA_CACHE_DIR"),
      unsetenv("RDA_TUNING_DB");
  const char *const dry[] = {"tune",      C,     "--n",       "64",        "--iters",
                             "1",         "--backend", "emu", "--dry-run", NULL};
  p = run_rdagen(900, dry);
  if (p.exit_code != 0 || strstr(p.out, "dry run: no tuning database") == NULL) {
    show("tune --dry-run without a cache folder", &p);
    fail();
  }
  rt_proc_free(&p);
  rt_env_restore("HOME", saved_home);
  rt_env_restore("XDG_CACHE_HOME", saved_xdg);
  rt_env_restore("RDA_CACHE_DIR", saved_cache);
  rt_env_restore("RDA_TUNING_DB", saved);
  free(db), free(missing);
}

/* === the kernel cache and emit bundles (fix-cache) ========================================== */
/* `rdagen cache list|clear` usage and limits, and `rdagen emit --out` all or nothing. Each test
 * points RDA_CACHE_DIR at a private folder (never CTest's shared cache) and puts it back. */

#include <signal.h> /* here, to keep this section in one piece: SIGXFSZ, RLIMIT_FSIZE */
#include <sys/resource.h>

#include "cache.h" /* SHA-256 of the bundle files */

/* run_rdagen with file writes capped at max_file bytes (RLIMIT_FSIZE, SIGXFSZ ignored so a
 * write past it fails with EFBIG instead of killing rdagen): a disk that fills up mid-write. */
static rt_proc run_rdagen_fsize(int timeout_s, const char *const *args, rlim_t max_file) {
  struct rlimit old, lim;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  lim = old;
  lim.rlim_cur = max_file;
  void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN); /* inherited across exec */
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  rt_proc p = run_rdagen(timeout_s, args);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, old_handler);
  return p;
}

/* A private cache folder inside the fixture (not created: `cache_dir` names it). */
static char *private_cache(const fixture *f, char **saved) {
  *saved = rt_env_save("RDA_CACHE_DIR");
  char *dir = rt_path(f->dir, "cache");
  assert_int_equal(setenv("RDA_CACHE_DIR", dir, 1), 0);
  return dir;
}

static void test_cli_cache_arch_is_validated_and_needs_a_value(void **state) {
  fixture *f = *state;
  char *saved = NULL;
  char *cache = private_cache(f, &saved);
  const char *const usage[][6] = {
      {"cache", "clear", "--arch", "bogus", NULL},   {"cache", "list", "--arch", "sm_9x", NULL},
      {"cache", "list", "--arch", "../sm_90", NULL}, {"cache", "clear", "--arch", "sm_9", NULL},
      {"cache", "clear", "--arch", "emu-", NULL},    {"cache", "list", "--arch", "emu-x/y", NULL},
      {"cache", "clear", "--arch", ".", NULL},       {"cache", "list", "--arch=sm_1234", NULL},
  };
  for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
    rt_proc p = run_rdagen(60, usage[i]);
    const char *eol = strchr(p.err, '\n'), *at = strstr(p.err, "--arch '");
    if (p.exit_code != 2 || strncmp(p.err, "rdagen: cache ", 14) != 0 || at == NULL || at > eol) {
      char what[48];
      snprintf(what, sizeof what, "cache --arch case %zu", i);
      show(what, &p);
      fail();
    }
    rt_proc_free(&p);
  }
  const char *const missing[][5] = {{"cache", "clear", "--arch", NULL},
                                    {"cache", "list", "--arch=", NULL}};
  for (size_t i = 0; i < 2; i++) {
    rt_proc p = run_rdagen(60, missing[i]);
    const char *eol = strchr(p.err, '\n'), *at = strstr(p.err, "--arch needs a value");
    if (p.exit_code != 2 || strncmp(p.err, "rdagen: cache ", 14) != 0 || at == NULL || at > eol) {
      show("cache --arch without a value", &p);
      fail();
    }
    rt_proc_free(&p);
  }
  assert_false(rt_exists(cache)); /* bad usage touched nothing */
  const char *const good[][5] = {{"cache", "list", "--arch", "emu-x86_64", NULL},
                                 {"cache", "clear", "--arch=sm_90", NULL},
                                 {"cache", "list", "--arch", "sm_100", NULL}};
  for (size_t i = 0; i < 3; i++) {
    rt_proc p = run_rdagen(60, good[i]);
    if (p.exit_code != 0) {
      show("cache with a good --arch", &p);
      fail();
    }
    rt_proc_free(&p);
  }
  assert_false(rt_exists(cache)); /* list and clear never create the cache */
  rt_env_restore("RDA_CACHE_DIR", saved);
  free(cache);
}

static void test_cli_cache_max_bytes_malformed_fails_with_one_line(void **state) {
  fixture *f = *state;
  char *saved = NULL;
  char *cache = private_cache(f, &saved);
  char *saved_max = rt_env_save("RDA_CACHE_MAX_BYTES");
  static const char *const bad[] = {"-5", "lots", "10X", "18446744073709551616", "1e9"};
  const char *const list[] = {"cache", "list", NULL};
  const char *const warm[] = {"cache", "warm", f->config, "--arch", "sm_80", NULL};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(setenv("RDA_CACHE_MAX_BYTES", bad[i], 1), 0);
    for (int w = 0; w < 2; w++) {
      rt_proc p = run_rdagen(120, w ? warm : list);
      if (p.exit_code != 1 || rt_count_lines(p.err) != 1 ||
          strncmp(p.err, "rdagen: error: RDA_CACHE_MAX_BYTES='", 36) != 0 ||
          strstr(p.err, bad[i]) == NULL) {
        show(w ? "cache warm with a bad RDA_CACHE_MAX_BYTES" : "cache list with a bad limit", &p);
        fail();
      }
      rt_proc_free(&p);
    }
  }
  assert_int_equal(setenv("RDA_CACHE_MAX_BYTES", "3M", 1), 0);
  rt_proc p = run_rdagen(60, list);
  if (p.exit_code != 0 || strstr(p.out, "(limit 3145728)") == NULL) {
    show("cache list with RDA_CACHE_MAX_BYTES=3M", &p);
    fail();
  }
  rt_proc_free(&p);
  rt_env_restore("RDA_CACHE_MAX_BYTES", saved_max);
  rt_env_restore("RDA_CACHE_DIR", saved);
  free(cache);
}

static void test_cli_cache_clear_says_it_left_in_flight_files(void **state) {
  fixture *f = *state;
  char *saved = NULL;
  char *cache = private_cache(f, &saved);
  assert_int_equal(mkdir(cache, 0700), 0);
  char *target = rt_path(cache, "sm_90");
  assert_int_equal(mkdir(target, 0700), 0);
  char *tmp = rt_path(target, "0123.tmp.77.1");
  assert_true(rt_write_file(tmp, "partial", 7));
  const char *const clear[] = {"cache", "clear", NULL};
  rt_proc p = run_rdagen(60, clear);
  if (p.exit_code != 0 || rt_count_lines(p.out) != 1 ||
      strstr(p.out,
             "removed 0 entries; left 1 recent temporary files or emulator header folders "
             "(younger than an hour; they may belong to running builds)") == NULL ||
      !rt_exists(tmp)) {
    show("cache clear with a write in progress", &p);
    fail();
  }
  rt_proc_free(&p);
  rt_env_restore("RDA_CACHE_DIR", saved);
  free(cache), free(target), free(tmp);
}

/* Only `cache warm` needs the cache (elsewhere an unusable one means compiling without it). */
static void test_cli_cache_warm_into_an_unusable_cache_fails(void **state) {
  fixture *f = *state;
  char *saved = rt_env_save("RDA_CACHE_DIR");
  char *under_a_file = rt_path(f->config, "cache"); /* a folder under small.lua: impossible */
  assert_int_equal(setenv("RDA_CACHE_DIR", under_a_file, 1), 0);
  const char *const warm[] = {"cache", "warm", f->config, "--arch", "sm_80", NULL};
  rt_proc p = run_rdagen(120, warm);
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 ||
      strstr(p.err, "cannot be written") == NULL || strstr(p.err, under_a_file) == NULL) {
    show("cache warm into an unusable cache", &p);
    fail();
  }
  rt_proc_free(&p);
  rt_env_restore("RDA_CACHE_DIR", saved);
  free(under_a_file);
}

/* "name sha256\n" of every entry of dir, sorted: the folder's exact state. */
static char *folder_state(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  char **lines = NULL;
  size_t n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char *path = rt_path(dir, e->d_name);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    char hex[65] = "folder";
    if (S_ISREG(st.st_mode)) {
      size_t len = 0;
      char *text = rt_read_file(path, &len);
      assert_non_null(text);
      rda_cache_sha256_hex(text, len, hex);
      free(text);
    }
    lines = realloc(lines, (n + 1) * sizeof *lines);
    assert_non_null(lines);
    lines[n] = malloc(strlen(e->d_name) + 80);
    assert_non_null(lines[n]);
    sprintf(lines[n], "%s %s\n", e->d_name, hex);
    n++;
    free(path);
  }
  closedir(d);
  for (size_t i = 1; i < n; i++) /* insertion sort: a few dozen names */
    for (size_t j = i; j > 0 && strcmp(lines[j - 1], lines[j]) > 0; j--) {
      char *t = lines[j];
      lines[j] = lines[j - 1];
      lines[j - 1] = t;
    }
  size_t total = 1;
  for (size_t i = 0; i < n; i++) total += strlen(lines[i]);
  char *all = calloc(total, 1);
  assert_non_null(all);
  for (size_t i = 0; i < n; i++) {
    strcat(all, lines[i]);
    free(lines[i]);
  }
  free(lines);
  return all;
}

/* DIR holds one whole bundle: manifest.json; each kernel it lists with its .cu and its cubin,
 * whose SHA-256 is the one recorded; and nothing else (no temporary, backup or stray file: any
 * other entry must be a file the manifest names, a PTX for instance). Returns the number of
 * cubins. */
static int check_bundle(const char *dir) {
  char *manifest = rt_path(dir, "manifest.json");
  char *text = rt_read_file(manifest, NULL);
  if (text == NULL) {
    fprintf(stderr, "%s holds:\n%s", dir, folder_state(dir));
    fail_msg("%s: no manifest.json", dir);
  }
  int cubins = 0;
  for (const char *at = strstr(text, "\"cubin\": \""); at != NULL;
       at = strstr(at + 1, "\"cubin\": \"")) {
    char name[256], want[65], got[65];
    assert_int_equal(sscanf(at, "\"cubin\": \"%255[^\"]\"", name), 1);
    const char *sha = strstr(at, "\"cubin_sha256\": \"");
    assert_non_null(sha);
    assert_int_equal(sscanf(sha, "\"cubin_sha256\": \"%64[0-9a-f]\"", want), 1);
    char *cubin = rt_path(dir, name);
    size_t len = 0;
    char *bytes = rt_read_file(cubin, &len);
    if (bytes == NULL) fail_msg("%s: the manifest lists %s, which is not there", dir, name);
    rda_cache_sha256_hex(bytes, len, got);
    assert_string_equal(got, want);
    free(bytes), free(cubin);
    cubins++;
  }
  if (cubins == 0) fail_msg("%s: manifest.json lists no cubin (an old one?)", dir);
  for (const char *at = strstr(text, "\"name\": \""); at != NULL;
       at = strstr(at + 1, "\"name\": \"")) {
    char name[256], cu[300];
    assert_int_equal(sscanf(at, "\"name\": \"%255[^\"]\"", name), 1);
    snprintf(cu, sizeof cu, "%s.cu", name);
    char *path = rt_path(dir, cu);
    if (!rt_exists(path)) fail_msg("%s: the manifest lists %s, which is not there", dir, cu);
    free(path);
  }
  DIR *d = opendir(dir);
  assert_non_null(d);
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    const char *n = e->d_name;
    if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0 || strcmp(n, "manifest.json") == 0) continue;
    char key[320];
    const size_t len = strlen(n);
    if (len > 3 && strcmp(n + len - 3, ".cu") == 0)
      snprintf(key, sizeof key, "\"name\": \"%.*s\"", (int)(len - 3), n);
    else
      snprintf(key, sizeof key, "\": \"%s\"", n); /* "cubin" or "ptx" */
    if (n[0] == '.' || strstr(text, key) == NULL)
      fail_msg("%s: %s is not part of the bundle (a leftover?)", dir, n);
  }
  closedir(d);
  free(text), free(manifest);
  return cubins;
}

/* A failing `emit --out DIR` leaves DIR exactly as it was (the old manifest and kernels, no
 * partial file); a successful one records each cubin's SHA-256 in the manifest. */
static void test_cli_emit_is_all_or_nothing_and_records_cubin_sha(void **state) {
  fixture *f = *state;
  char *saved = NULL;
  char *cache = private_cache(f, &saved);
  char *out = rt_path(f->dir, "bundle");
  const char *const emit[] = {"emit", f->config, "--arch", "sm_80", "--out", out, NULL};
  assert_int_equal(setenv("RDA_LOG", "info", 1), 0);
  rt_proc p = run_rdagen(600, emit);
  unsetenv("RDA_LOG");
  if (p.exit_code != 0) show("emit", &p);
  assert_int_equal(p.exit_code, 0);
  char *manifest = rt_path(out, "manifest.json");
  char *text = rt_read_file(manifest, NULL);
  assert_non_null(text);
  /* RDA_LOG=info: one compile line per kernel of the manifest (emit always compiles). */
  int kernels = 0, logged = 0;
  for (const char *at = strstr(text, "\"cubin\": \""); at != NULL; at = strstr(at + 1, "\"cubin\": \""))
    kernels++;
  for (const char *at = strstr(p.err, "rda: info: compiled "); at != NULL;
       at = strstr(at + 1, "rda: info: compiled "))
    logged++;
  assert_true(kernels > 0);
  assert_int_equal(logged, kernels);
  rt_proc_free(&p);
  const int checked = check_bundle(out); /* every cubin's recorded SHA-256 is its file's */
  /* Block one of the files a second emit (--ptx) writes: it fails, and DIR is as before. */
  char kernel[256];
  assert_int_equal(sscanf(strstr(text, "\"name\": \""), "\"name\": \"%255[^\"]\"", kernel), 1);
  char ptx[512];
  snprintf(ptx, sizeof ptx, "%s.sm_80.ptx", kernel);
  char *blocker = rt_path(out, ptx);
  assert_int_equal(mkdir(blocker, 0700), 0);
  char *before = folder_state(out);
  const char *const emit_ptx[] = {"emit",  f->config, "--arch", "sm_80",
                                  "--out", out,       "--ptx",  NULL};
  p = run_rdagen(600, emit_ptx);
  char *after = folder_state(out);
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 || strstr(p.err, ptx) == NULL ||
      strcmp(before, after) != 0) {
    show("emit onto a blocked file", &p);
    fprintf(stderr, "before:\n%safter:\n%s", before, after);
    fail();
  }
  rt_proc_free(&p);
  assert_int_equal(rmdir(blocker), 0);
  free(before), free(after);
  /* A failure mid-write, past every check: the disk fills up (RLIMIT_FSIZE) after some of the
   * new files were written. The files --ptx changes are written in manifest order (each PTX,
   * then the manifest); a probe emit elsewhere gives their sizes, and the cap lets the first
   * ones through and stops a later, bigger one. */
  char *probe = rt_path(f->dir, "probe");
  const char *const emit_probe[] = {"emit",  f->config, "--arch", "sm_80",
                                    "--out", probe,     "--ptx",  NULL};
  p = run_rdagen(600, emit_probe);
  if (p.exit_code != 0) show("emit --ptx (probe)", &p);
  assert_int_equal(p.exit_code, 0);
  rt_proc_free(&p);
  size_t sizes[64];
  int nsizes = 0;
  for (const char *at = strstr(text, "\"name\": \""); at != NULL && nsizes < 63;
       at = strstr(at + 1, "\"name\": \"")) {
    char name[256], file[300];
    assert_int_equal(sscanf(at, "\"name\": \"%255[^\"]\"", name), 1);
    snprintf(file, sizeof file, "%s.sm_80.ptx", name);
    char *path = rt_path(probe, file);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    sizes[nsizes++] = (size_t)sb.st_size;
    free(path);
  }
  char *probe_manifest = rt_path(probe, "manifest.json");
  struct stat mb;
  assert_int_equal(stat(probe_manifest, &mb), 0);
  sizes[nsizes++] = (size_t)mb.st_size; /* the new manifest: about as long (compile_s differs) */
  size_t cap = 0, first_max = 0;
  for (int i = 0; i + 1 < nsizes && cap == 0; ++i) {
    first_max = sizes[i] > first_max ? sizes[i] : first_max;
    for (int k = i + 1; k < nsizes; ++k)
      if (sizes[k] > first_max + 512) cap = first_max; /* files 0..i fit, file k does not */
  }
  assert_true(cap > 0); /* else no order of sizes to fail mid-write with */
  before = folder_state(out);
  p = run_rdagen_fsize(600, emit_ptx, (rlim_t)cap);
  after = folder_state(out);
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 || strstr(p.err, "emit: ") == NULL ||
      strcmp(before, after) != 0) {
    show("emit filling the disk mid-write", &p);
    fprintf(stderr, "cap %zu bytes\nbefore:\n%safter:\n%s", cap, before, after);
    fail();
  }
  rt_proc_free(&p);
  /* Unblocked, it succeeds and the manifest lists each PTX, which holds what the probe's does. */
  p = run_rdagen(600, emit_ptx);
  if (p.exit_code != 0) show("emit --ptx", &p);
  assert_int_equal(p.exit_code, 0);
  rt_proc_free(&p);
  assert_true(rt_exists(blocker));
  char *with_ptx = rt_read_file(manifest, NULL);
  assert_non_null(with_ptx);
  int listed = 0;
  for (const char *at = strstr(with_ptx, "\"name\": \""); at != NULL;
       at = strstr(at + 1, "\"name\": \"")) {
    char name[256], want[300], got[300];
    assert_int_equal(sscanf(at, "\"name\": \"%255[^\"]\"", name), 1);
    snprintf(want, sizeof want, "%s.sm_80.ptx", name);
    const char *end = strchr(at, '}');
    const char *ptx_key = strstr(at, "\"ptx\": \"");
    assert_true(end != NULL && ptx_key != NULL && ptx_key < end); /* in this entry */
    assert_int_equal(sscanf(ptx_key, "\"ptx\": \"%299[^\"]\"", got), 1);
    assert_string_equal(got, want);
    char *mine = rt_path(out, want), *theirs = rt_path(probe, want);
    size_t n1 = 0, n2 = 0;
    char *a = rt_read_file(mine, &n1), *b = rt_read_file(theirs, &n2);
    assert_true(a != NULL && b != NULL && n1 == n2 && n1 > 0 && memcmp(a, b, n1) == 0);
    free(a), free(b), free(mine), free(theirs);
    listed++;
  }
  assert_int_equal(listed, checked); /* one per cubin */
  free(before), free(after), free(text), free(blocker), free(manifest), free(out);
  free(with_ptx), free(probe_manifest), free(probe);
  rt_env_restore("RDA_CACHE_DIR", saved);
  free(cache);
}

/* run_rdagen with the raise_on_rename preload (tests/preload/): signal sig is raised just
 * before the first rename of a temporary into out, in emit's write phase. */
static rt_proc run_rdagen_raising(int timeout_s, const char *const *args, const char *out,
                                  int sig) {
  char preload[8192], num[16];
  /* ASan refuses to start unless its runtime is the first library loaded: name it first. */
  snprintf(preload, sizeof preload, "%s%s%s", RDA_TEST_ASAN_RUNTIME,
           RDA_TEST_ASAN_RUNTIME[0] != '\0' ? " " : "", RDA_TEST_RAISE_ON_RENAME);
  snprintf(num, sizeof num, "%d", sig);
  char *saved = rt_env_save("LD_PRELOAD");
  assert_int_equal(setenv("LD_PRELOAD", preload, 1), 0);
  assert_int_equal(setenv("RDA_TEST_RAISE_DIR", out, 1), 0);
  assert_int_equal(setenv("RDA_TEST_RAISE_SIGNAL", num, 1), 0);
  rt_proc p = run_rdagen(timeout_s, args);
  rt_env_restore("LD_PRELOAD", saved);
  unsetenv("RDA_TEST_RAISE_DIR");
  unsetenv("RDA_TEST_RAISE_SIGNAL");
  return p;
}

/* A signal that arrives while emit renames the bundle into place waits until the bundle is
 * whole (tools/cmd_emit.c blocks it): rdagen then ends by that signal, and DIR holds the new
 * manifest, every file it lists, and no temporary or backup. SIGINT into a new DIR; SIGTERM
 * over an older bundle with a stale manifest and a damaged cubin (renames over existing
 * files, each with a backup). Unblocked, the signal would stop rdagen at the first rename. */
static void test_cli_emit_signal_while_writing_leaves_the_bundle_whole(void **state) {
#if defined(__SANITIZE_ADDRESS__)
  if (RDA_TEST_ASAN_RUNTIME[0] == '\0') {
    /* The shim must be preloaded after ASan's runtime, and this compiler names none. */
    fprintf(stderr, "skipped: no shared ASan runtime to preload before the signal shim\n");
    skip();
  }
#endif
  fixture *f = *state;
  char *saved = NULL;
  char *cache = private_cache(f, &saved);
  char *out = rt_path(f->dir, "bundle"), *manifest = rt_path(out, "manifest.json");
  const char *const emit[] = {"emit", f->config, "--arch", "sm_80", "--out", out, NULL};
  static const int sigs[2] = {SIGINT, SIGTERM};
  for (int i = 0; i < 2; ++i) {
    if (i == 1) { /* the bundle of the first emit, made old */
      char *text = rt_read_file(manifest, NULL), name[256];
      assert_non_null(text);
      assert_int_equal(sscanf(strstr(text, "\"cubin\": \""), "\"cubin\": \"%255[^\"]\"", name),
                       1);
      char *cubin = rt_path(out, name);
      assert_true(rt_write_file(cubin, "old", 3));
      const char stale[] = "{\"kernels\": []}\n";
      assert_true(rt_write_file(manifest, stale, strlen(stale)));
      free(text), free(cubin);
    }
    rt_proc p = run_rdagen_raising(600, emit, out, sigs[i]);
    char said[4400];
    snprintf(said, sizeof said, "raise_on_rename: signal %d before renaming %s/", sigs[i], out);
    if (p.exit_code != 128 + sigs[i] || strstr(p.err, said) == NULL ||
        strstr(p.out, "kernels compiled") == NULL) {
      show(sigs[i] == SIGINT ? "emit, SIGINT while writing" : "emit, SIGTERM while writing", &p);
      fail();
    }
    rt_proc_free(&p);
    check_bundle(out);
  }
  free(out), free(manifest);
  rt_env_restore("RDA_CACHE_DIR", saved);
  free(cache);
}

/* An --out that cannot take the bundle (a file, under one, in /proc) fails before compiling:
 * one error line, nothing on standard output, nothing made; --help lists every profile. */
static void test_cli_emit_refuses_a_bad_out_before_compiling(void **state) {
  fixture *f = *state;
  char *file = rt_path(f->dir, "afile"), *under = rt_path(f->dir, "afile/sub");
  assert_true(rt_write_file(file, "hi", 2));
  /* and a folder where nothing can be made, though access(2) says root may write there */
  const char *const outs[3] = {file, under, "/proc/rdagen-emit-test"};
  for (int i = 0; i < 3; ++i) {
    const char *const argv[] = {"emit", f->config, "--arch", "sm_90", "--out", outs[i], NULL};
    rt_proc p = run_rdagen(60, argv);
    if (p.exit_code != 1 || rt_count_lines(p.err) != 1 || strstr(p.err, "emit: --out") == NULL ||
        p.out[0] != '\0')
      show("emit onto a file", &p);
    assert_int_equal(p.exit_code, 1);
    assert_string_equal(p.out, "");
    rt_proc_free(&p);
  }
  size_t n = 0;
  char *kept = rt_read_file(file, &n);
  assert_true(kept != NULL && n == 2 && memcmp(kept, "hi", 2) == 0);
  free(kept);
  const char *const help[] = {"emit", "--help", NULL};
  rt_proc p = run_rdagen(60, help);
  assert_int_equal(p.exit_code, 0);
  assert_non_null(strstr(p.out, "sm_100, sm_103, sm_120, sm_121"));
  rt_proc_free(&p);
  free(file), free(under);
}

/* A failed emit into a new nested --out (keep/n1/n2/n3 with only keep there) removes every
 * folder it created, and only those. The failure: the disk is full at the first write. */
static void test_cli_emit_failure_removes_the_folders_it_created(void **state) {
  fixture *f = *state;
  char *saved = NULL;
  char *cache = private_cache(f, &saved);
  char *keep = rt_path(f->dir, "keep");
  assert_int_equal(mkdir(keep, 0700), 0);
  char *out = rt_path(keep, "n1/n2/n3"), *n1 = rt_path(keep, "n1");
  const char *const emit[] = {"emit", f->config, "--arch", "sm_80", "--out", out, NULL};
  rt_proc p = run_rdagen_fsize(600, emit, 16);
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 || rt_exists(n1) || !rt_exists(keep) ||
      rt_count_entries(keep) != 0) {
    show("emit into a new nested folder, disk full", &p);
    fail();
  }
  rt_proc_free(&p);
  /* The same, --out given with a trailing slash. */
  char *out_slash = rt_path(keep, "n1/n2/");
  const char *const emit2[] = {"emit", f->config, "--arch", "sm_80", "--out", out_slash, NULL};
  p = run_rdagen_fsize(600, emit2, 16);
  if (p.exit_code != 1 || rt_exists(n1) || rt_count_entries(keep) != 0) {
    show("emit into a new nested folder/, disk full", &p);
    fail();
  }
  rt_proc_free(&p);
  /* Standard output on a full disk: the report cannot be written, so nothing is. */
  char *argv[] = {arg("/bin/sh"), arg("-c"), arg("exec \"$0\" \"$@\" > /dev/full"),
                  arg(RDAGEN_PATH), arg("emit"), f->config, arg("--arch"), arg("sm_80"),
                  arg("--out"), out, NULL};
  assert_true(rt_run(argv, 600, &p));
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 ||
      strstr(p.err, "cannot write to standard output") == NULL || rt_exists(n1) ||
      rt_count_entries(keep) != 0) {
    show("emit with standard output on a full disk", &p);
    fail();
  }
  rt_proc_free(&p);
  free(keep), free(out), free(n1), free(out_slash);
  rt_env_restore("RDA_CACHE_DIR", saved);
  free(cache);
}

/* `cache warm` exists to fill the cache: when what it compiled cannot be stored (the disk is
 * full) it fails with one line, where a run only costs a recompile later. */
static void test_cli_cache_warm_fails_when_the_disk_is_full(void **state) {
  fixture *f = *state;
  char *saved = NULL;
  char *cache = private_cache(f, &saved);
  const char *const warm[] = {"cache", "warm", f->config, "--arch", "sm_80", NULL};
  rt_proc p = run_rdagen_fsize(600, warm, 4096); /* smaller than any cubin entry */
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 ||
      strstr(p.err, "not stored in the cache") == NULL || strstr(p.err, cache) == NULL) {
    show("cache warm onto a full disk", &p);
    fail();
  }
  rt_proc_free(&p);
  /* With room, it fills the cache, and a second warm finds everything there. */
  p = run_rdagen(600, warm);
  if (p.exit_code != 0) show("cache warm", &p);
  assert_int_equal(p.exit_code, 0);
  rt_proc_free(&p);
  p = run_rdagen(600, warm);
  if (p.exit_code != 0 || strstr(p.out, "\n0 compiled, ") == NULL) show("cache warm again", &p);
  assert_int_equal(p.exit_code, 0);
  assert_non_null(strstr(p.out, "\n0 compiled, "));
  rt_proc_free(&p);
  rt_env_restore("RDA_CACHE_DIR", saved);
  free(cache);
}

/* A full disk under the cache is no error for a run: the emulator builds in a private folder
 * under $TMPDIR (removed after) and the result is the one a run with room computes. The full
 * disk is a 16 KiB tmpfs mounted in a user namespace (`unshare -rm`); where those are not
 * allowed the test is skipped, saying so. */
static void test_cli_run_emu_with_the_cache_on_a_full_disk_still_computes(void **state) {
  const char *unshare = access("/usr/bin/unshare", X_OK) == 0 ? "/usr/bin/unshare" : "/bin/unshare";
  char *probe[] = {arg(unshare), arg("-rm"), arg("true"), NULL};
  rt_proc p = {0};
  if (!rt_run(probe, 60, &p) || p.exit_code != 0) {
    fprintf(stderr, "note: no user namespaces here (unshare -rm fails): skipped\n");
    rt_proc_free(&p);
    skip();
  }
  rt_proc_free(&p);
  fixture *f = *state;
  char *saved_cache = NULL, *saved_tmp = rt_env_save("TMPDIR");
  char *cache = private_cache(f, &saved_cache);
  char *tmp = rt_path(f->dir, "tmp");
  char *o_full = rt_path(f->dir, "o_full.npy");
  assert_int_equal(mkdir(cache, 0700), 0);
  assert_int_equal(mkdir(tmp, 0700), 0);
  /* sh -c SCRIPT sh CACHE RDAGEN ARGS...: mount the tiny tmpfs on CACHE, then run rdagen. */
  char *argv[] = {arg(unshare), arg("-rm"), arg("/bin/sh"), arg("-c"),
                  arg("mount -t tmpfs -o size=16k,mode=0700 tmpfs \"$0\" && exec \"$@\""), cache,
                  arg(RDAGEN_PATH), arg("run"), f->config, arg("--q"), f->q, arg("--k"), f->k,
                  arg("--v"), f->v, arg("--o"), o_full, arg("--backend"), arg("emu"), NULL};
  assert_int_equal(setenv("TMPDIR", tmp, 1), 0);
  assert_int_equal(setenv("RDA_LOG", "info", 1), 0);
  assert_true(rt_run(argv, 600, &p));
  unsetenv("RDA_LOG");
  if (p.exit_code != 0 || strstr(p.err, "building in private folders") == NULL) {
    show("run with the cache on a full disk", &p);
    fail();
  }
  rt_proc_free(&p);
  DIR *d = opendir(tmp); /* the private build folders are gone */
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) assert_true(e->d_name[0] == '.');
  closedir(d);
  const char *const run[] = {"run", f->config, "--q", f->q, "--k", f->k, "--v", f->v,
                             "--o", f->o, "--backend", "emu", NULL};
  p = run_rdagen(600, run);
  if (p.exit_code != 0) show("run with room", &p);
  assert_int_equal(p.exit_code, 0);
  rt_proc_free(&p);
  size_t n_full = 0, n_room = 0;
  char *full = rt_read_file(o_full, &n_full), *room = rt_read_file(f->o, &n_room);
  assert_non_null(full), assert_non_null(room);
  assert_int_equal(n_full, n_room);
  assert_memory_equal(full, room, n_room);
  free(full), free(room);
  unlink(o_full);
  rt_env_restore("TMPDIR", saved_tmp);
  rt_env_restore("RDA_CACHE_DIR", saved_cache);
  free(cache), free(tmp), free(o_full);
}

/* `cache warm` refuses a bad --arch (no built-in profile: sm_75, sm_999) or a missing config
 * before it makes a folder or compiles anything, whichever --arch comes first. */
static void test_cli_cache_warm_checks_every_arch_before_anything(void **state) {
  fixture *f = *state;
  char *saved = NULL;
  char *cache = private_cache(f, &saved);
  char *missing = rt_path(f->dir, "missing.lua");
  const char *const bad[][8] = {
      {"cache", "warm", f->config, "--arch", "sm_75", NULL},
      {"cache", "warm", f->config, "--arch", "sm_999", NULL},
      {"cache", "warm", f->config, "--arch", "sm_90", "--arch", "sm_75", NULL},
      {"cache", "warm", missing, "--arch", "sm_90", NULL},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rt_proc p = run_rdagen(120, bad[i]);
    const int want = i < 3 ? 2 : 1;
    const char *name = i < 3 ? (i == 1 ? "sm_999" : "sm_75") : missing;
    if (p.exit_code != want || strstr(p.err, name) == NULL || p.out[0] != '\0' ||
        rt_exists(cache)) {
      char what[48];
      snprintf(what, sizeof what, "cache warm refused, case %zu", i);
      show(what, &p);
      fail();
    }
    rt_proc_free(&p);
  }
  rt_env_restore("RDA_CACHE_DIR", saved);
  free(cache), free(missing);
}

/* `cache warm` fails when RDA_CACHE_MAX_BYTES cannot hold what it stored (each store evicts
 * the ones before), saying how many stayed; a repeated --arch counts once, as with emit. */
static void test_cli_cache_warm_fails_when_the_limit_cannot_hold_the_config(void **state) {
  fixture *f = *state;
  char *saved = NULL;
  char *cache = private_cache(f, &saved);
  char *saved_max = rt_env_save("RDA_CACHE_MAX_BYTES");
  assert_int_equal(setenv("RDA_CACHE_MAX_BYTES", "200K", 1), 0);
  const char *const warm[] = {"cache", "warm",   f->config, "--arch",
                              "sm_80", "--arch", "sm_80",   NULL};
  rt_proc p = run_rdagen(600, warm);
  rt_env_restore("RDA_CACHE_MAX_BYTES", saved_max);
  rt_env_restore("RDA_CACHE_DIR", saved);
  const int kernels = rt_count_lines(p.out);
  char want[96];
  snprintf(want, sizeof want, " of the %d kernels (", kernels);
  const char *first_eol = strchr(p.out, '\n');
  const size_t first_len = first_eol != NULL ? (size_t)(first_eol - p.out) + 1 : 0;
  char *first = strndup(p.out, first_len);
  assert_non_null(first);
  static const char head[] = "rdagen: error: cache warm: RDA_CACHE_MAX_BYTES=200K holds only ";
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 || kernels < 2 ||
      strncmp(p.err, head, sizeof head - 1) != 0 || strstr(p.err, want) == NULL ||
      strstr(p.err, "raise it") == NULL ||
      strstr(p.out + first_len, first) != NULL) { /* each kernel once */
    show("cache warm under a limit too small", &p);
    fail();
  }
  free(first);
  rt_proc_free(&p);
  /* The same limit once every kernel is in the cache: none is stored, so none is evicted, but
   * the next store would evict some, so it fails the same way. */
  saved = rt_env_save("RDA_CACHE_DIR");
  saved_max = rt_env_save("RDA_CACHE_MAX_BYTES");
  assert_int_equal(setenv("RDA_CACHE_DIR", cache, 1), 0);
  unsetenv("RDA_CACHE_MAX_BYTES");
  p = run_rdagen(600, warm);
  const int filled = p.exit_code;
  if (filled != 0) show("cache warm without a limit", &p);
  rt_proc_free(&p);
  if (filled == 0) {
    assert_int_equal(setenv("RDA_CACHE_MAX_BYTES", "200K", 1), 0);
    p = run_rdagen(600, warm);
  }
  rt_env_restore("RDA_CACHE_MAX_BYTES", saved_max);
  rt_env_restore("RDA_CACHE_DIR", saved);
  assert_int_equal(filled, 0);
  static const char below[] = "rdagen: error: cache warm: RDA_CACHE_MAX_BYTES=200K is below the ";
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 ||
      strncmp(p.err, below, sizeof below - 1) != 0 || strstr(p.err, "raise it") == NULL) {
    show("cache warm under a limit too small, everything cached", &p);
    fail();
  }
  rt_proc_free(&p);
  free(cache);
}

/* === end of the kernel cache section (fix-cache) ============================================ */

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cli_help_and_version_exit_0),
      cmocka_unit_test_setup_teardown(test_cli_closed_pipe_on_standard_output_is_one_error_line,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_bad_usage_exits_2, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_demo_without_config_runs_the_built_in_default, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_tune_bad_input_exits_and_keeps_the_database, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_tune_writes_a_database_that_plans_read, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_bad_input_files_exit_1_naming_the_file, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_bad_config_exits_1_naming_it, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_bad_rda_wgmma_exits_1_and_writes_nothing, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_misspelt_rda_log_is_one_warning, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_error_line_escapes_control_characters, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_bad_emulator_settings_exit_1_and_write_nothing,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_unwritable_outputs_exit_1_and_write_nothing, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_ranks_bad_split_exit_1, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_stats_same_file_as_an_output_exits_2, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_output_onto_an_input_exits_2, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_outputs_follow_links_and_refuse_special_files, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_uncreatable_output_names_the_users_path, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_non_finite_inputs_exit_1_naming_the_element, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_cross_attention_is_refused_as_such, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_non_finite_result_exits_1_and_writes_nothing, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_ring_more_ranks_than_rows, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_ring_cuda_more_ranks_than_rows, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_ring_backward_emu_matches_reference, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_ring_cuda_matches_reference_or_fails_cleanly, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_ranks_3_matches_reference_and_writes_stats, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_failure_keeps_existing_output_untouched, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_backward_bad_inputs_exit_1_and_write_nothing, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_backward_failure_keeps_existing_outputs_untouched,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_backward_emu_matches_reference_bf16_causal_gqa,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_backward_emu_matches_reference_fp16_group_mqa, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_run_emu_matches_reference_bf16_causal_gqa, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_cli_run_emu_matches_reference_fp16_group_offsets_f8_inputs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_run_auto_reads_f2_and_says_which_backend, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_run_cuda_matches_reference_or_fails_cleanly, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_backward_cuda_matches_reference_or_fails_cleanly,
                                      setup, teardown),
      /* the kernel cache and emit bundles (fix-cache) */
      cmocka_unit_test_setup_teardown(test_cli_cache_arch_is_validated_and_needs_a_value, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_cache_max_bytes_malformed_fails_with_one_line, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_cache_clear_says_it_left_in_flight_files, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_emit_is_all_or_nothing_and_records_cubin_sha, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_emit_signal_while_writing_leaves_the_bundle_whole,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_cache_warm_into_an_unusable_cache_fails, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_emit_refuses_a_bad_out_before_compiling, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_emit_failure_removes_the_folders_it_created, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cli_run_emu_with_the_cache_on_a_full_disk_still_computes,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_cache_warm_checks_every_arch_before_anything, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_cli_cache_warm_fails_when_the_limit_cannot_hold_the_config, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_cache_warm_fails_when_the_disk_is_full, setup,
                                      teardown),
  };
  const char *filter = getenv("RDA_TEST_FILTER"); /* e.g. "*links*" while developing */
  if (filter != NULL) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
