/* cmd_tune.c — `rdagen tune`: time every candidate tile of a config's attention kernels on
 * this machine's backend (runtime/tune.h), print a table per kernel, and merge the rankings
 * into the user's tuning database, which every later plan reads (runtime/gen.h, "tuning"). */
#include "args.h"
#include "backend.h"
#include "commands.h"
#include "gen.h"
#include "tune.h"
#include "tuning_db.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char tune_usage_text[] =
    "usage: rdagen tune CONFIG [--n N] [--batch B] [--backward] [--iters K] [--verify-n N]\n"
    "                   [--backend auto|cuda|emu] [--seed S] [--db FILE] [--dry-run] [--wgmma]\n"
    "\n"
    "Times every candidate tile of each attention kernel the config plans (forward; with\n"
    "--backward also dK/dV and dQ), one task per distinct key (target, kernel, head_dim, dtype,\n"
    "causal, dilated, grid rows). Each candidate is first checked against the float64\n"
    "reference (batch 1, --verify-n rows), then timed at [B, N] (median of K passes after one\n"
    "untimed) and its outputs there compared with the first passing candidate's. The ranking is\n"
    "merged into the tuning database; every later plan takes its first usable tile.\n"
    "  --n         rows of the timed problem, 1..16777216 (default: twice the largest segment,\n"
    "              at least 1024 and at most 65536; 1024 on the emulator)\n"
    "  --batch     batch of the timed problem, 1..4096 (default 1)\n"
    "  --iters     timed passes per candidate, 1..1000 (default 10; 3 on the emulator)\n"
    "  --verify-n  rows of the reference check, 1..8192, cut to N (default min(N, 1024))\n"
    "  --backward  also tune the backward kernels\n"
    "  --wgmma     admit the sm_90a wgmma tiles (as RDA_WGMMA=1)\n"
    "  --backend   auto (default: cuda when a GPU is usable, else emu), cuda or emu; entries\n"
    "              timed on the emulator are for target emu-sm_90 and steer only its plans\n"
    "  --seed      of the random inputs (default 1)\n"
    "  --db        the database to update (default $RDA_TUNING_DB, else tuning.lua in the\n"
    "              cache folder; its folder must exist, but for the cache folder); the\n"
    "              plans made while tuning read it too\n"
    "  --dry-run   tune and print, but write (or create, or lock) no database; the kernels\n"
    "              compiled still go to the kernel cache, as for any command\n"
    "Runs that write one database take turns (a lock beside it): a second one waits for the\n"
    "first.\n"
    "Flags may come in any order, as '--flag value' or '--flag=value'.\n";

enum {
  TUNE_MAX_N = 1 << 24,
  TUNE_MAX_BATCH = 4096,
  TUNE_MAX_ITERS = 1000,
  TUNE_MAX_VERIFY_N = 8192
};

typedef struct tune_cli {
  const char *config, *backend, *db;
  long long n, batch, iters, verify_n;
  unsigned long long seed;
  int have_n, have_iters, backward, dry_run, wgmma;
} tune_cli;

/* Returns -1 to go on, else the exit status (0 for --help). */
static int tune_parse(int argc, char **argv, tune_cli *o) {
  memset(o, 0, sizeof *o);
  o->batch = 1;
  o->seed = 1;
  static const char *const valued[] = {"n", "batch", "iters", "verify-n", "backend", "seed", "db"};
  static const long long int_max[4] = {TUNE_MAX_N, TUNE_MAX_BATCH, TUNE_MAX_ITERS,
                                       TUNE_MAX_VERIFY_N};
  long long *const ints[4] = {&o->n, &o->batch, &o->iters, &o->verify_n};
  int seen[7] = {0};
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(tune_usage_text, stdout);
      return 0;
    }
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
      if (a[0] == '-' && a[1] != '\0') return rdagen_usage("tune: unknown option '%s'", a);
      if (o->config != NULL)
        return rdagen_usage("tune: more than one config given ('%s' and '%s')", o->config, a);
      o->config = a;
      continue;
    }
    const char *name = a + 2;
    const char *eq = strchr(name, '=');
    const size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
    int *flag = NULL;
    if (nlen == 8 && strncmp(name, "backward", 8) == 0) flag = &o->backward;
    if (nlen == 7 && strncmp(name, "dry-run", 7) == 0) flag = &o->dry_run;
    if (nlen == 5 && strncmp(name, "wgmma", 5) == 0) flag = &o->wgmma;
    if (flag != NULL) {
      if (eq != NULL) return rdagen_usage("tune: --%.*s takes no value", (int)nlen, name);
      if (*flag) return rdagen_usage("tune: --%.*s given twice", (int)nlen, name);
      *flag = 1;
      continue;
    }
    const int f = rdagen_option_index(a, valued, 7, &eq);
    if (f < 0) return rdagen_usage("tune: unknown option '%.*s'", (int)(nlen + 2), a);
    const char *val = rdagen_option_value(argc, argv, &i, eq);
    if (val == NULL) return rdagen_usage("tune: --%s needs a value", valued[f]);
    if (seen[f]++) return rdagen_usage("tune: --%s given twice", valued[f]);
    if (f < 4) { /* the bounded counts */
      if (!rdagen_parse_count(val, 1, int_max[f], ints[f]))
        return rdagen_usage("tune: --%s '%s': expected an integer in 1..%lld", valued[f], val,
                            int_max[f]);
      continue;
    }
    long long x = 0;
    switch (f) {
      case 4:
        if (strcmp(val, "auto") != 0 && strcmp(val, "cuda") != 0 && strcmp(val, "emu") != 0)
          return rdagen_usage("tune: --backend '%s': expected auto, cuda or emu", val);
        o->backend = val;
        break;
      case 5:
        if (!rdagen_parse_count(val, 0, LLONG_MAX, &x))
          return rdagen_usage("tune: --seed '%s': expected an integer in 0..%lld", val, LLONG_MAX);
        o->seed = (unsigned long long)x;
        break;
      default: o->db = val; break;
    }
  }
  o->have_n = seen[0], o->have_iters = seen[2];
  if (o->config == NULL) return rdagen_usage("tune: no CONFIG given");
  if (o->backend == NULL) o->backend = "auto";
  return -1;
}

/* The lock file of the database while held, and the temporary file a write goes through:
 * Ctrl-C, SIGTERM, SIGHUP or a closed standard output (SIGPIPE) remove both on the way out (the
 * database stays the old one, or is the new one if the rename came first; SIGKILL cannot: a
 * lock file left so is harmless, the next tune locks it as it is). */
static char tune_lock_path[4200], tune_tmp_path[4200];
static volatile sig_atomic_t tune_lock_held;

static void tune_on_signal(int sig) {
  if (tune_lock_held) {
    if (tune_tmp_path[0] != '\0') (void)unlink(tune_tmp_path);
    (void)unlink(tune_lock_path);
  }
  if (sig == SIGPIPE) rdagen_on_sigpipe(sig); /* one error line, exit 1 */
  signal(sig, SIG_DFL);
  raise(sig);
}

/* The signals that end a tune, and their actions from before tune_signals_catch. */
static const int tune_sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
static struct sigaction tune_sigs_were[sizeof tune_sigs / sizeof *tune_sigs];

static void tune_signals_catch(void) {
  for (size_t i = 0; i < sizeof tune_sigs / sizeof *tune_sigs; i++) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = tune_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(tune_sigs[i], &sa, &tune_sigs_were[i]);
  }
}

static void tune_signals_restore(void) {
  for (size_t i = 0; i < sizeof tune_sigs / sizeof *tune_sigs; i++)
    sigaction(tune_sigs[i], &tune_sigs_were[i], NULL);
}

static void tune_cli_log(void *ud, const char *line) {
  (void)ud;
  printf("%s\n", line);
  fflush(stdout);
}

/* The table of one task: every ranked tile with its median and its speed relative to the
 * tile plans take now (>1: faster), then the failures. */
static void tune_print_report(const rda_tune_report *r) {
  const rda_tune_outcome *oc = &r->outcome;
  double now_us = 0;
  for (int i = 0; i < oc->nranked; i++)
    if (strcmp(oc->ranked[i].tile, r->task.chosen) == 0) now_us = oc->ranked[i].us;
  printf("\n%s\n", r->task.key);
  printf("  %-30s %12s %10s\n", "tile", "median us", "vs now");
  for (int i = 0; i < oc->nranked; i++) {
    const int is_now = strcmp(oc->ranked[i].tile, r->task.chosen) == 0;
    char rel[32] = "-";
    if (now_us > 0) snprintf(rel, sizeof rel, "%.2fx", now_us / oc->ranked[i].us);
    printf("  %-30s %12.1f %10s%s\n", oc->ranked[i].tile, oc->ranked[i].us, rel,
           is_now ? "  (now)" : "");
  }
  for (int i = 0; i < r->nfailed; i++) printf("  FAILED %s\n", r->failed[i]);
}

int rdagen_cmd_tune(int argc, char **argv) {
  tune_cli opt;
  int rc = tune_parse(argc, argv, &opt);
  if (rc >= 0) return rc;

  rda_err err = {0};
  char db_path[4096];
  if (opt.db != NULL) {
    if (snprintf(db_path, sizeof db_path, "%s", opt.db) >= (int)sizeof db_path)
      return rdagen_fail("--db: path too long");
    /* The plans made while tuning (the tile each takes now) read the same database. */
    if (setenv("RDA_TUNING_DB", opt.db, 1) != 0) return rdagen_fail("--db: cannot set it");
  } else if (rda_tuning_db_path(db_path, sizeof db_path, &err) != RDA_OK) {
    /* No cache folder to hold one: a dry run writes none, and plans then read none. */
    if (!opt.dry_run) return rdagen_fail("%s", err.msg);
    db_path[0] = '\0';
  }

  rda_gen *g = NULL;
  rda_backend *b = NULL;
  char *old_text = NULL, *db_text = NULL;
  rda_tune_report *reports = NULL;
  int nreports = 0;
  rda_tuning_lock lock = RDA_TUNING_LOCK_INIT;
  rda_config cfg;
  rda_hw hw;
  char why[1024];
  rc = 1;
  /* One tune at a time per database, from before the tasks are listed to the write: a second
   * run waits, so neither skews the other's timings and each merges into the other's result.
   * A dry run writes no database, so it takes no lock: the lock's file (and a missing folder
   * of the database, which taking it creates) would be left behind for nothing. */
  if (rda_gen_open(&g, &err) != RDA_OK ||
      rda_gen_config_file(g, opt.config, &cfg, &err) != RDA_OK ||
      (!opt.dry_run && rda_tuning_db_lock(db_path, &lock, &err) != RDA_OK) ||
      (db_path[0] != '\0' && rda_tuning_db_read_file(db_path, &old_text, &err) != RDA_OK)) {
    rdagen_fail("%s", err.msg);
    goto done;
  }
  /* The database, loaded at every plan below, runs sandboxed: should rdagen's watchdog end the
   * process inside it, the lock's file must not outlive the lock (the unlock below never
   * runs then). */
  if (lock.fd >= 0) {
    (void)rda_gen_watchdog_remove_on_kill(lock.path, 1);
    snprintf(tune_lock_path, sizeof tune_lock_path, "%s", lock.path);
    if (!rda_tuning_db_temp_name(&lock, tune_tmp_path, sizeof tune_tmp_path))
      tune_tmp_path[0] = '\0';
    tune_lock_held = 1;
    tune_signals_catch();
  }
  if (rda_backend_open(opt.backend, &b, why, sizeof why, &err) != RDA_OK) {
    rdagen_fail("%s", err.msg);
    goto done;
  }
  if (strcmp(opt.backend, "auto") == 0) fprintf(stderr, "rdagen: backend: %s\n", why);
  if (rda_backend_hw(b, g, &hw, &err) != RDA_OK) {
    rdagen_fail("%s", err.msg);
    goto done;
  }
  const int emu = hw.emulated;
  const long long n = opt.have_n ? opt.n : rda_tune_default_n(&cfg, &hw);
  const rda_tune_opts to = {
      .n = n,
      .batch = opt.batch,
      .verify_n = opt.verify_n > n ? n : opt.verify_n,
      .iters = opt.have_iters ? (int)opt.iters : rda_tune_default_iters(&hw),
      .flags = (opt.backward ? RDA_PLAN_BACKWARD : 0u) | (opt.wgmma ? RDA_PLAN_WGMMA : 0u),
      .seed = opt.seed,
      .device = NULL,
      .log = tune_cli_log,
      .log_ud = NULL,
  };
  /* The database's own text is checked before the first line goes out (rda_tune_run would
   * refuse it too, but after that line, which reads as a start). */
  char *checked = NULL;
  if (rda_tune_merge(g, &hw, &cfg, &to, NULL, 0, old_text, db_path, &checked, &err) != RDA_OK) {
    rdagen_fail("%s", err.msg);
    goto done;
  }
  free(checked);
  printf("tuning %s on %s (%s): N %lld, batch %lld, %d timed passes per tile, checked at N %lld\n",
         opt.config, hw.name, b->name, to.n, to.batch, to.iters,
         to.verify_n > 0 ? to.verify_n : (n < 1024 ? n : 1024));
  fflush(stdout);
  if (rda_tune_run(b, g, &hw, &cfg, &to, old_text, db_path, &db_text, &reports, &nreports, &err) !=
      RDA_OK) {
    rdagen_fail("%s", err.msg);
    goto done;
  }
  for (int i = 0; i < nreports; i++) tune_print_report(&reports[i]);
  if (emu)
    printf(
        "\nnote: timed on the CPU emulator: these entries are for target emu-sm_%d and steer "
        "only emulator plans, never a GPU's\n",
        hw.arch);
  /* What was printed must reach standard output before the database changes: a failed write
   * (a full disk) fails the tune with the database as it was. */
  errno = 0;
  if (!opt.dry_run && (fflush(stdout) != 0 || ferror(stdout))) {
    rdagen_fail("cannot write to standard output (%s): %s not written",
                errno != 0 ? strerror(errno) : "a write failed", db_path);
    goto done;
  }
  if (opt.dry_run) {
    if (db_path[0] != '\0')
      printf("\ndry run: %s not written\n", db_path);
    else
      printf("\ndry run: no tuning database (no cache folder to hold one)\n");
  } else {
    if (rda_tune_save_locked(g, &hw, &cfg, &to, reports, nreports, db_path, &err) != RDA_OK) {
      rdagen_fail("%s", err.msg);
      goto done;
    }
    printf("\nwrote %d %s to %s\n", nreports, nreports == 1 ? "entry" : "entries", db_path);
  }
  rc = 0;
done:
  if (lock.fd >= 0) (void)rda_gen_watchdog_remove_on_kill(lock.path, 0);
  const int had_lock = tune_lock_held;
  tune_lock_held = 0; /* before the unlock: the name may be another run's lock after it */
  rda_tuning_db_unlock(&lock);
  if (had_lock) tune_signals_restore();
  free(reports);
  free(db_text);
  free(old_text);
  if (b != NULL) b->destroy(b);
  rda_gen_close(g);
  return rc;
}
