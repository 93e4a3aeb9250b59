/* cmd_cache.c — `rdagen cache list|clear|warm`: show the kernel cache (target, kernel, size, last
 * use), empty it (all targets or one), or fill it ahead of time with every kernel a config plans
 * for the given sm_XX targets, compiled by NVRTC (no GPU needed). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "cache.h"
#include "commands.h"
#include "gen.h"

#define CACHE_MAX_ARCHS 8

static const char cache_usage_text[] =
    "usage: rdagen cache list [--arch TARGET]\n"
    "       rdagen cache clear [--arch TARGET]\n"
    "       rdagen cache warm CONFIG --arch sm_XX [--arch sm_YY ...]\n"
    "\n"
    "The kernel cache lives in $RDA_CACHE_DIR, else $XDG_CACHE_HOME/rda, else ~/.cache/rda,\n"
    "one folder per target (sm_90, emu-x86_64, ...); RDA_CACHE_MAX_BYTES bounds its size.\n"
    "TARGET is sm_XX or emu-<machine> (the emulator's, e.g. emu-x86_64).\n"
    "  list    one line per entry: target, kernel, bytes, last use (least recent first)\n"
    "  clear   delete the entries (of one target with --arch); temporary files and emulator\n"
    "          header folders younger than an hour are left (they may belong to running\n"
    "          builds)\n"
    "  warm    compile every kernel CONFIG plans for each sm_XX into the cache (no GPU needed)\n";

/* "--arch X" or "--arch=X" at argv[*i]: 1 with *value set (advancing *i), 0 when argv[*i] is
 * another argument, -1 when the value is missing (the flag last, "--arch=", or followed by
 * another option). */
static int cache_flag(int argc, char **argv, int *i, const char *flag, const char **value) {
  const size_t n = strlen(flag);
  *value = NULL;
  if (strncmp(argv[*i], flag, n) != 0 || (argv[*i][n] != '=' && argv[*i][n] != '\0')) return 0;
  *value = rdagen_option_value(argc, argv, i, argv[*i][n] == '=' ? argv[*i] + n : NULL);
  return *value != NULL ? 1 : -1;
}

static int cache_list(const char *target) {
  rda_cache_entry_info *v = NULL;
  size_t n = 0;
  rda_err err = {0};
  unsigned long long limit = 0;
  if (rda_cache_max_bytes_get(&limit, &err) != RDA_OK) return rdagen_fail("%s", err.msg);
  if (rda_cache_list(target, &v, &n, &err) != RDA_OK) return rdagen_fail("%s", err.msg);
  unsigned long long total = 0;
  printf("%-14s %-62s %10s  %s\n", "target", "kernel", "bytes", "last use (UTC)");
  for (size_t i = 0; i < n; ++i) {
    char when[32] = "?";
    const time_t t = (time_t)(v[i].last_use_ns / 1000000000ll);
    struct tm tm;
    if (gmtime_r(&t, &tm) != NULL) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    printf("%-14s %-62s %10llu  %s%s\n", v[i].target, v[i].valid ? v[i].name : "(corrupted)",
           v[i].bytes, when, v[i].valid ? "" : "  (will be rebuilt)");
    total += v[i].bytes;
  }
  printf("%zu entries, %llu bytes (limit %llu)\n", n, total, limit);
  free(v);
  return 0;
}

static int cache_clear(const char *target) {
  size_t removed = 0, left = 0;
  rda_err err = {0};
  if (rda_cache_clear(target, &removed, &left, &err) != RDA_OK) return rdagen_fail("%s", err.msg);
  if (left > 0)
    printf(
        "removed %zu entries; left %zu recent temporary files or emulator header folders "
        "(younger than an hour; they may belong to running builds)\n",
        removed, left);
  else
    printf("removed %zu entries\n", removed);
  return 0;
}

/* How many variants of plans[0..n) (plans[a] for archs[a]) the cache holds now: *kept. 0, or
 * -1 with err set. */
static int cache_warm_kept(const int *archs, const rda_plan_k *plans, int n, int *kept,
                           rda_err *err) {
  *kept = 0;
  for (int a = 0; a < n; ++a)
    for (int i = 0; i < plans[a].nvariants; ++i) {
      int stored = 0;
      if (rda_cache_cubin_stored(archs[a], plans[a].variants[i].source, &stored, NULL, err) !=
          RDA_OK)
        return -1;
      *kept += stored;
    }
  return 0;
}

static int cache_warm(const char *config, const int *archs, int narchs) {
  rda_err err = {0};
  /* Everything that can be refused is, before a folder is made or a kernel compiled: the
   * config, then every --arch (a target without a built-in profile is bad usage). */
  rda_gen *g = NULL;
  if (rda_gen_open(&g, &err) != RDA_OK) return rdagen_fail("%s", err.msg);
  rda_config cfg;
  if (rda_gen_config_file(g, config, &cfg, &err) != RDA_OK) {
    rda_gen_close(g);
    return rdagen_fail("%s", err.msg);
  }
  rda_hw hws[CACHE_MAX_ARCHS];
  for (int a = 0; a < narchs; ++a) {
    const rda_status s = rda_gen_hw_builtin(g, archs[a], &hws[a], &err);
    if (s != RDA_OK) {
      rda_gen_close(g);
      return s == RDA_ERR_INVALID_ARGUMENT
                 ? rdagen_usage("cache warm: --arch sm_%d: %s", archs[a], err.msg)
                 : rdagen_fail("%s", err.msg);
    }
  }
  /* Elsewhere a cache that cannot be written only costs recompiles; here it is the point. */
  for (int a = 0; a < narchs; ++a) {
    char target[16], dir[4096], why[1024];
    int usable = 0;
    snprintf(target, sizeof target, "sm_%d", archs[a]);
    int rc = 0;
    if (rda_cache_folder_try(target, dir, sizeof dir, &usable, why, sizeof why, &err) != RDA_OK)
      rc = rdagen_fail("%s", err.msg);
    else if (!usable)
      rc = rdagen_fail("cache warm: the kernel cache cannot be written: %s", why);
    if (rc != 0) {
      rda_gen_close(g);
      return rc;
    }
  }
  rda_plan_k plans[CACHE_MAX_ARCHS];
  unsigned long long total = 0; /* bytes of the entries, each as it was just stored or found */
  int rc = 0, nplans = 0, compiled = 0, present = 0;
  for (int a = 0; a < narchs && rc == 0; ++a) {
    if (rda_gen_plan_ex(g, &cfg, &hws[a], RDA_PLAN_BACKWARD | RDA_PLAN_BACKWARD_ATOMIC, &plans[a],
                        &err) != RDA_OK) {
      rc = rdagen_fail("%s", err.msg);
      break;
    }
    ++nplans;
    for (int i = 0; i < plans[a].nvariants && rc == 0; ++i) {
      const rda_variant *v = &plans[a].variants[i];
      int built = 0, stored = 0; /* a cubin compiled but not stored (disk full) fails */
      unsigned long long bytes = 0;
      if (rda_cache_cubin_store(archs[a], v->name, v->source, &built, &err) != RDA_OK ||
          rda_cache_cubin_stored(archs[a], v->source, &stored, &bytes, &err) != RDA_OK) {
        rc = rdagen_fail("%s", err.msg);
        break;
      }
      printf("sm_%-3d %-62s %s\n", archs[a], v->name, built ? "compiled" : "already cached");
      compiled += built;
      present += !built;
      total += bytes;
    }
  }
  /* Each store evicts least recently used entries past RDA_CACHE_MAX_BYTES, the ones just
   * stored too when the limit is below what the config needs: filling is the job, so what
   * did not stay fails it. */
  int kept = 0;
  unsigned long long max_bytes = 0;
  if (rc == 0 && (cache_warm_kept(archs, plans, nplans, &kept, &err) != 0 ||
                  rda_cache_max_bytes_get(&max_bytes, &err) != RDA_OK))
    rc = rdagen_fail("%s", err.msg);
  /* Kernels found already cached were not stored, so nothing evicted them: a limit below their
   * size fails too, as the next store would evict some. */
  const char *limit = getenv("RDA_CACHE_MAX_BYTES");
  if (limit == NULL || limit[0] == '\0') limit = "(unset: 1G)";
  if (rc == 0 && kept < compiled + present)
    rc = rdagen_fail(
        "cache warm: RDA_CACHE_MAX_BYTES=%s holds only %d of the %d kernels (%llu "
        "bytes) this config needs for these targets: raise it",
        limit, kept, compiled + present, total);
  else if (rc == 0 && total > max_bytes)
    rc = rdagen_fail(
        "cache warm: RDA_CACHE_MAX_BYTES=%s is below the %llu bytes of the %d "
        "kernels this config needs for these targets (all in the cache now; the "
        "next store evicts some): raise it",
        limit, total, compiled + present);
  for (int a = 0; a < nplans; ++a) rda_plan_k_free(&plans[a]);
  rda_gen_close(g);
  if (rc == 0) printf("%d compiled, %d already cached\n", compiled, present);
  return rc;
}

int rdagen_cmd_cache(int argc, char **argv) {
  if (argc < 1) return rdagen_usage("cache: a subcommand is required (list, clear or warm)");
  const char *sub = argv[0];
  if (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0) {
    fputs(cache_usage_text, stdout);
    return 0;
  }
  const char *config = NULL, *target = NULL;
  int archs[CACHE_MAX_ARCHS], narchs = 0;
  const int known =
      strcmp(sub, "list") == 0 || strcmp(sub, "clear") == 0 || strcmp(sub, "warm") == 0;
  if (!known)
    return rdagen_usage("cache: unknown subcommand '%s' (expected list, clear or warm)", sub);
  for (int i = 1; i < argc; ++i) {
    const char *value = NULL;
    const int flag = cache_flag(argc, argv, &i, "--arch", &value);
    if (flag < 0)
      return rdagen_usage("cache %s: --arch needs a value (a target such as sm_90)", sub);
    if (flag > 0) {
      if (strcmp(sub, "warm") == 0) {
        const int arch = rdagen_parse_arch(value);
        if (arch < 0) return rdagen_usage("cache warm: --arch '%s': expected sm_XX", value);
        int dup = 0; /* as emit: a repeated --arch counts once */
        for (int k = 0; k < narchs; ++k) dup |= archs[k] == arch;
        if (dup) continue;
        if (narchs == CACHE_MAX_ARCHS)
          return rdagen_usage("cache warm: at most %d different --arch", CACHE_MAX_ARCHS);
        archs[narchs++] = arch;
      } else {
        if (target != NULL) return rdagen_usage("cache %s: one --arch at most", sub);
        if (!rda_cache_target_name_ok(value))
          return rdagen_usage(
              "cache %s: --arch '%s': expected sm_XX or emu-<machine> (e.g. "
              "sm_90, emu-x86_64)",
              sub, value);
        target = value;
      }
    } else if (argv[i][0] == '-') {
      return rdagen_usage("cache %s: unknown flag '%s'", sub, argv[i]);
    } else if (strcmp(sub, "warm") == 0 && config == NULL) {
      config = argv[i];
    } else {
      return rdagen_usage("cache %s: unexpected argument '%s'", sub, argv[i]);
    }
  }
  if (strcmp(sub, "list") == 0) return cache_list(target);
  if (strcmp(sub, "clear") == 0) return cache_clear(target);
  if (strcmp(sub, "warm") == 0) {
    if (config == NULL) return rdagen_usage("cache warm: a CONFIG file is required");
    if (narchs == 0) return rdagen_usage("cache warm: at least one --arch sm_XX is required");
    return cache_warm(config, archs, narchs);
  }
  return rdagen_usage("cache: unknown subcommand '%s' (expected list, clear or warm)", sub);
}
