/* cmd_emit.c — `rdagen emit`: plan a config for offline targets (built-in hardware profiles),
 * compile every variant with NVRTC (in parallel), and write DIR/<name>.cu, <name>.<sm_XX>.cubin
 * (and .ptx) and DIR/manifest.json. Nothing is written unless every variant compiled, and the
 * writing is all or nothing: on any failure DIR is as it was (runtime/out_files.h). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "cache.h"
#include "commands.h"
#include "gen.h"
#include "json.h"
#include "log.h"
#include "nvrtc.h"
#include "out_files.h"

#define EMIT_MAX_ARCHS 8
#define EMIT_MAX_THREADS 8

static const char emit_usage_text[] =
    "usage: rdagen emit CONFIG --arch sm_XX [--arch sm_YY ...] --out DIR [--ptx]\n"
    "\n"
    "Plans the kernels of CONFIG for each target (built-in profiles: sm_80, sm_86, sm_87,\n"
    "sm_89, sm_90, sm_100, sm_103, sm_120, sm_121), compiles every one with NVRTC and\n"
    "writes, into DIR (created if missing):\n"
    "  <name>.cu               the generated source (rewritten only when it changed)\n"
    "  <name>.<sm_XX>.cubin    the cubin for each target\n"
    "  <name>.<sm_XX>.ptx      its PTX, with --ptx\n"
    "  manifest.json           {\"kernels\": [{name, arch, entry, cubin, source_sha256,\n"
    "                          cubin_sha256, ptx (with --ptx), registers, spill_bytes,\n"
    "                          smem_bytes, compile_s, tile, tuned}, ...]}  (tile: \"\" for the\n"
    "                          small kernels; tuned: taken from a tuning database, see\n"
    "                          rdagen tune)\n"
    "DIR can then be named in RDA_KERNEL_PATH (colon-separated folders): librda loads a\n"
    "cubin from it instead of compiling when name, arch and source_sha256 all match and the\n"
    "cubin's SHA-256 is its cubin_sha256. On any failure DIR is left as it was.\n"
    "Flags may come in any order, as '--flag value' or '--flag=value'.\n";

typedef struct emit_opts {
  const char *config;
  const char *out;
  int archs[EMIT_MAX_ARCHS];
  int narchs;
  int ptx;
} emit_opts;

/* One (variant, arch) to compile. */
typedef struct emit_job {
  const rda_variant *v;
  int arch;
  int want_ptx;
  rda_nvrtc_out cubin;
  rda_nvrtc_out ptx;
  rda_status status;
  rda_err err;
} emit_job;

typedef struct emit_queue {
  emit_job *jobs;
  int njobs;
  int next;
  pthread_mutex_t lock;
} emit_queue;

/* Returns -1 to go on, else the exit status (0 for --help). */
static int emit_parse(int argc, char **argv, emit_opts *o) {
  memset(o, 0, sizeof *o);
  for (int i = 0; i < argc; ++i) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(emit_usage_text, stdout);
      return 0;
    }
    if (strcmp(a, "--ptx") == 0) {
      if (o->ptx) return rdagen_usage("emit: --ptx given twice");
      o->ptx = 1;
      continue;
    }
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
      if (a[0] == '-' && a[1] != '\0') return rdagen_usage("emit: unknown option '%s'", a);
      if (o->config != NULL)
        return rdagen_usage("emit: one CONFIG only ('%s' and '%s')", o->config, a);
      o->config = a;
      continue;
    }
    const char *name = a + 2, *value;
    size_t name_len = strlen(name);
    const char *eq = strchr(name, '=');
    if (eq != NULL) name_len = (size_t)(eq - name);
    const int is_arch = name_len == 4 && strncmp(name, "arch", 4) == 0;
    const int is_out = name_len == 3 && strncmp(name, "out", 3) == 0;
    if (!is_arch && !is_out) return rdagen_usage("emit: unknown option '%s'", a);
    value = rdagen_option_value(argc, argv, &i, eq);
    if (value == NULL) return rdagen_usage("emit: --%.*s needs a value", (int)name_len, name);
    if (is_out) {
      if (o->out != NULL) return rdagen_usage("emit: --out given twice");
      o->out = value;
      continue;
    }
    const int arch = rdagen_parse_arch(value);
    if (arch < 0) return rdagen_usage("emit: --arch '%s': expected sm_XX, e.g. sm_90", value);
    if (!rda_nvrtc_arch_supported(arch)) {
      const int v = rda_nvrtc_version();
      return rdagen_usage("emit: --arch %s: NVRTC %d.%d cannot compile for it", value, v / 1000,
                          v % 1000 / 10);
    }
    int dup = 0;
    for (int k = 0; k < o->narchs; ++k) dup |= o->archs[k] == arch;
    if (dup) continue;
    if (o->narchs == EMIT_MAX_ARCHS)
      return rdagen_usage("emit: at most %d different --arch", EMIT_MAX_ARCHS);
    o->archs[o->narchs++] = arch;
  }
  if (o->config == NULL) return rdagen_usage("emit: missing CONFIG");
  if (o->narchs == 0) return rdagen_usage("emit: missing --arch sm_XX");
  if (o->out == NULL) return rdagen_usage("emit: missing --out DIR");
  return -1;
}

static void *emit_worker(void *arg) {
  emit_queue *q = arg;
  for (;;) {
    pthread_mutex_lock(&q->lock);
    const int i = q->next < q->njobs ? q->next++ : -1;
    pthread_mutex_unlock(&q->lock);
    if (i < 0) return NULL;
    emit_job *j = &q->jobs[i];
    /* Always NVRTC, never the kernel cache: the manifest's ptxas report comes from compiling. */
    j->status =
        rda_nvrtc_compile(j->v->source, j->v->name, j->v->name, j->arch, 0, &j->cubin, &j->err);
    if (j->status == RDA_OK)
      rda_log(RDA_LOG_INFO, "compiled %s for sm_%d in %.2f s (emit: always compiled, not cached)",
              j->v->name, j->arch, j->cubin.compile_s);
    if (j->status == RDA_OK && j->want_ptx)
      j->status =
          rda_nvrtc_compile(j->v->source, j->v->name, j->v->name, j->arch, 1, &j->ptx, &j->err);
  }
}

/* Compiles every job, on up to one thread per core. */
static void emit_compile_all(emit_job *jobs, int njobs) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int nthreads = cores < 1 ? 1 : cores > EMIT_MAX_THREADS ? EMIT_MAX_THREADS : (int)cores;
  if (nthreads > njobs) nthreads = njobs;
  emit_queue q = {.jobs = jobs, .njobs = njobs, .next = 0};
  pthread_mutex_init(&q.lock, NULL);
  pthread_t threads[EMIT_MAX_THREADS];
  int started = 0;
  for (int t = 1; t < nthreads; ++t) {
    if (pthread_create(&threads[started], NULL, emit_worker, &q) != 0) break;
    ++started;
  }
  emit_worker(&q); /* this thread works too, so one thread is enough if creation fails */
  for (int t = 0; t < started; ++t) pthread_join(threads[t], NULL);
  pthread_mutex_destroy(&q.lock);
}

/* The folders an emit created for --out (mkdir -p), so that a failure removes them all again:
 * the length of each created prefix of the path, outermost first. */
typedef struct emit_made {
  char path[4096];
  size_t len[128];
  int n;
} emit_made;

/* rmdir every folder this run created, innermost first (each is empty again after a failure;
 * one that is not, say filled by someone else meanwhile, stays). */
static void emit_unmake(emit_made *m) {
  for (int i = m->n - 1; i >= 0; --i) {
    const char saved = m->path[m->len[i]];
    m->path[m->len[i]] = '\0';
    (void)rmdir(m->path);
    m->path[m->len[i]] = saved;
  }
  m->n = 0;
}

/* mkdir -p, recording in *m what it created; on failure those are removed again. */
static int emit_mkdirs(const char *path, emit_made *m, char *why, size_t why_len) {
  char *buf = m->path;
  m->n = 0;
  if (snprintf(buf, sizeof m->path, "%s", path) >= (int)sizeof m->path) {
    snprintf(why, why_len, "%s: path too long", path);
    return -1;
  }
  for (char *p = buf + 1;; ++p) {
    const char c = *p;
    if (c != '/' && c != '\0') continue;
    *p = '\0';
    if (mkdir(buf, 0777) == 0) {
      if (m->n < (int)(sizeof m->len / sizeof *m->len)) m->len[m->n++] = (size_t)(p - buf);
    } else if (errno != EEXIST) {
      snprintf(why, why_len, "cannot create folder %s: %s", buf, strerror(errno));
      *p = c;
      emit_unmake(m);
      return -1;
    }
    *p = c;
    if (c == '\0') break;
  }
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(why, why_len, "--out %s is not a folder", path);
    emit_unmake(m);
    return -1;
  }
  return 0;
}

/* Before any compiling: --out is a folder this process can write, or can be made in the
 * nearest folder above it that exists (minutes of NVRTC are not spent on a DIR that cannot
 * take the bundle). 0, or -1 with why. */
static int emit_check_out(const char *path, char *why, size_t why_len) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
    snprintf(why, why_len, "%s: path too long", path);
    return -1;
  }
  for (;;) {
    struct stat st;
    if (stat(buf, &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        snprintf(why, why_len, "--out %s: %s is not a folder", path, buf);
        return -1;
      }
      /* A folder made and removed again, rather than access(2): that says yes to root on a
       * read-only file system or in /proc, where nothing can be made. */
      char probe[4200];
      snprintf(probe, sizeof probe, "%s/.rdagen-probe-XXXXXX", buf);
      if (mkdtemp(probe) == NULL) { /* a fresh name: a probe a killed run left never blocks */
        snprintf(why, why_len, "--out %s: cannot make anything in folder %s: %s", path, buf,
                 strerror(errno));
        return -1;
      }
      rmdir(probe);
      return 0;
    }
    if (errno != ENOENT) {
      snprintf(why, why_len, "--out %s: %s: %s", path, buf, strerror(errno));
      return -1;
    }
    char *slash = strrchr(buf, '/');
    while (slash != NULL && slash > buf && slash[1] == '\0') { /* trailing slashes */
      *slash = '\0';
      slash = strrchr(buf, '/');
    }
    if (slash == NULL) {
      snprintf(buf, sizeof buf, ".");
    } else if (slash == buf) {
      buf[1] = '\0';
    } else {
      *slash = '\0';
    }
  }
}

/* 1 when the file at path (a regular file: rda_out_file_check said so) holds exactly data.
 * Read without blocking (a FIFO swapped in meanwhile is refused by rda_cache_read_file). */
static int emit_same_content(const char *path, const void *data, size_t len) {
  unsigned char *have = NULL;
  size_t n = 0;
  if (rda_cache_read_file(path, &have, &n, NULL) != RDA_OK) return 0;
  const int same = n == len && (len == 0 || memcmp(have, data, len) == 0);
  free(have);
  return same;
}

/* The manifest: one entry per job, in --arch order then plan order. smem_bytes is the total a
 * block needs: ptxas' static shared memory plus the variant's dynamic shared memory. */
static rda_status emit_manifest(const emit_job *jobs, int njobs, rda_json *j, rda_err *err) {
  rda_json_init(j);
  rda_json_object_begin(j);
  rda_json_key(j, "kernels");
  rda_json_array_begin(j);
  for (int i = 0; i < njobs; ++i) {
    const emit_job *k = &jobs[i];
    char arch[16], cubin[192];
    snprintf(arch, sizeof arch, "sm_%d", k->arch);
    snprintf(cubin, sizeof cubin, "%s.%s.cubin", k->v->name, arch);
    rda_json_object_begin(j);
    rda_json_key(j, "name");
    rda_json_string(j, k->v->name);
    rda_json_key(j, "arch");
    rda_json_string(j, arch);
    rda_json_key(j, "entry");
    rda_json_string(j, k->v->name);
    rda_json_key(j, "cubin");
    rda_json_string(j, cubin);
    char sha[65]; /* what RDA_KERNEL_PATH matches on, so a stale bundle is never used */
    RDA_TRY(rda_cache_source_sha(k->v->source, sha, err));
    rda_json_key(j, "source_sha256");
    rda_json_string(j, sha);
    char cubin_sha[65]; /* checked when the cubin is loaded: a changed file is never used */
    rda_cache_sha256_hex(k->cubin.image, k->cubin.image_bytes, cubin_sha);
    rda_json_key(j, "cubin_sha256");
    rda_json_string(j, cubin_sha);
    if (k->want_ptx) { /* written beside the cubin with --ptx */
      char ptx[192];
      snprintf(ptx, sizeof ptx, "%s.%s.ptx", k->v->name, arch);
      rda_json_key(j, "ptx");
      rda_json_string(j, ptx);
    }
    rda_json_key(j, "registers");
    rda_json_int(j, k->cubin.registers);
    rda_json_key(j, "spill_bytes");
    rda_json_int(j, k->cubin.spill_bytes);
    rda_json_key(j, "smem_bytes");
    rda_json_int(j, (long long)k->cubin.smem_bytes + k->v->smem_bytes);
    rda_json_key(j, "compile_s");
    rda_json_double(j, k->cubin.compile_s);
    rda_json_key(j, "tile");
    rda_json_string(j, k->v->tile);
    rda_json_key(j, "tuned");
    rda_json_bool(j, k->v->tuned);
    rda_json_object_end(j);
  }
  rda_json_array_end(j);
  rda_json_object_end(j);
  return rda_json_finish(j, err);
}

/* One output of an emit: DIR/name and its bytes. */
typedef struct emit_file {
  char path[4200];
  rda_out_bytes blob;
  rda_out_file out;
} emit_file;

/* Adds DIR/name (once: a .cu shared by several targets is one file); 0, or -1 with why. */
static int emit_add(const char *dir, const char *name, const void *data, size_t len,
                    emit_file *files, int *n, char *why, size_t why_len) {
  char path[4200];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) {
    snprintf(why, why_len, "%s/%s: path too long", dir, name);
    return -1;
  }
  for (int i = 0; i < *n; ++i)
    if (strcmp(files[i].path, path) == 0) return 0;
  emit_file *f = &files[(*n)++];
  memcpy(f->path, path, strlen(path) + 1);
  f->blob.data = data;
  f->blob.len = len;
  return 0;
}

/* Writes every artifact all or nothing (runtime/out_files.h: temporaries beside them, the
 * old files kept as backups until every rename succeeded, put back on any failure), the
 * manifest renamed in last. Unchanged files are left untouched (their time stamps too).
 * Returns the exit status. */
static int emit_write_all_now(const emit_opts *o, const emit_job *jobs, int njobs, char *why,
                              size_t why_len) {
  static emit_made made; /* one emit per process; 4 KiB kept off the stack */
  if (emit_mkdirs(o->out, &made, why, why_len) != 0) return rdagen_fail("emit: %s", why);
  rda_json j;
  rda_err err = {0};
  if (emit_manifest(jobs, njobs, &j, &err) != RDA_OK) {
    rda_json_free(&j);
    emit_unmake(&made);
    return rdagen_fail("emit: %s", err.msg);
  }
  const int cap = 3 * njobs + 1;
  emit_file *files = calloc((size_t)cap, sizeof *files);
  rda_out_job *out_jobs = calloc((size_t)cap, sizeof *out_jobs);
  int nfiles = 0, rc = 0;
  if (files == NULL || out_jobs == NULL) {
    snprintf(why, why_len, "out of memory");
    rc = -1;
  }
  for (int i = 0; rc == 0 && i < njobs; ++i) {
    const emit_job *k = &jobs[i];
    char fname[192];
    snprintf(fname, sizeof fname, "%s.cu", k->v->name);
    rc = emit_add(o->out, fname, k->v->source, strlen(k->v->source), files, &nfiles, why,
                  why_len);
    snprintf(fname, sizeof fname, "%s.sm_%d.cubin", k->v->name, k->arch);
    if (rc == 0)
      rc = emit_add(o->out, fname, k->cubin.image, k->cubin.image_bytes, files, &nfiles, why,
                    why_len);
    snprintf(fname, sizeof fname, "%s.sm_%d.ptx", k->v->name, k->arch);
    if (rc == 0 && k->want_ptx)
      rc = emit_add(o->out, fname, k->ptx.image, k->ptx.image_bytes, files, &nfiles, why,
                    why_len);
  }
  if (rc == 0)
    rc = emit_add(o->out, "manifest.json", j.buf, j.len, files, &nfiles, why, why_len);
  /* Check every output before anything changes; keep only those whose content changes. */
  int njobs_out = 0;
  for (int i = 0; rc == 0 && i < nfiles; ++i) {
    emit_file *f = &files[i];
    if (rda_out_file_check(f->path, &f->out, &err) != RDA_OK) {
      snprintf(why, why_len, "%s", err.msg);
      rc = -1;
      break;
    }
    if (f->out.exists && emit_same_content(f->out.target, f->blob.data, f->blob.len)) continue;
    for (int k = 0; k < njobs_out; ++k) {
      if (!rda_out_file_same(out_jobs[k].file, &f->out)) continue;
      snprintf(why, why_len, "%s and %s are one file (a link?): cannot write both",
               out_jobs[k].file->path, f->path);
      rc = -1;
      break;
    }
    if (rc != 0) break;
    out_jobs[njobs_out].file = &f->out;
    out_jobs[njobs_out].write = rda_out_write_bytes;
    out_jobs[njobs_out].ctx = &f->blob;
    ++njobs_out;
  }
  if (rc == 0 && rda_out_files_replace(out_jobs, njobs_out, NULL, &err) != RDA_OK) {
    snprintf(why, why_len, "%s", err.msg);
    rc = -1;
  }
  free(files);
  free(out_jobs);
  rda_json_free(&j);
  if (rc != 0) {
    emit_unmake(&made); /* --out and its parents made by this run, and empty again */
    return rdagen_fail("emit: %s", why);
  }
  return 0;
}

static int emit_write_all(const emit_opts *o, const emit_job *jobs, int njobs) {
  char why[4400];
  /* Ctrl-C, SIGTERM or SIGHUP wait until the bundle is written or put back: all or nothing
   * holds for an interrupted emit too (the writing takes a moment; compiling, before it, is
   * interrupted at once and writes nothing). */
  sigset_t block, saved;
  sigemptyset(&block);
  sigaddset(&block, SIGINT), sigaddset(&block, SIGTERM), sigaddset(&block, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &block, &saved);
  const int rc = emit_write_all_now(o, jobs, njobs, why, sizeof why);
  pthread_sigmask(SIG_SETMASK, &saved, NULL);
  return rc;
}

static double emit_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int rdagen_cmd_emit(int argc, char **argv) {
  emit_opts o;
  const int rc_parse = emit_parse(argc, argv, &o);
  if (rc_parse >= 0) return rc_parse;

  const double t0 = emit_now();
  int rc = 1;
  rda_err err = {0};
  rda_gen *g = NULL;
  rda_plan_k plans[EMIT_MAX_ARCHS];
  int nplans = 0;
  emit_job *jobs = NULL;
  int njobs = 0;
  rda_hw hws[EMIT_MAX_ARCHS];
  rda_config cfg;

  char why[4400];
  if (emit_check_out(o.out, why, sizeof why) != 0) {
    rc = rdagen_fail("emit: %s", why);
    goto done;
  }
  if (rda_gen_open(&g, &err) != RDA_OK) {
    rc = rdagen_fail("%s", err.msg);
    goto done;
  }
  for (int a = 0; a < o.narchs; ++a) {
    const rda_status s = rda_gen_hw_builtin(g, o.archs[a], &hws[a], &err);
    if (s != RDA_OK) { /* an unknown target is bad usage; anything else is a failure */
      rc = s == RDA_ERR_INVALID_ARGUMENT
               ? rdagen_usage("emit: --arch sm_%d: %s", o.archs[a], err.msg)
               : rdagen_fail("%s", err.msg);
      goto done;
    }
  }
  if (rda_gen_config_file(g, o.config, &cfg, &err) != RDA_OK) {
    rc = rdagen_fail("%s", err.msg);
    goto done;
  }
  int total = 0;
  for (int a = 0; a < o.narchs; ++a) {
    if (rda_gen_plan_ex(g, &cfg, &hws[a], RDA_PLAN_BACKWARD | RDA_PLAN_BACKWARD_ATOMIC, &plans[a],
                        &err) != RDA_OK) {
      rc = rdagen_fail("%s", err.msg);
      goto done;
    }
    ++nplans;
    total += plans[a].nvariants;
  }
  jobs = calloc(total > 0 ? (size_t)total : 1, sizeof *jobs);
  if (jobs == NULL) {
    rc = rdagen_fail("emit: out of memory");
    goto done;
  }
  for (int a = 0; a < nplans; ++a) {
    for (int i = 0; i < plans[a].nvariants; ++i) {
      const rda_variant *v = &plans[a].variants[i];
      int dup = 0;
      for (int k = 0; k < njobs; ++k) {
        if (strcmp(jobs[k].v->name, v->name) != 0) continue;
        if (strcmp(jobs[k].v->source, v->source) != 0) {
          rc = rdagen_fail("emit: two different sources named %s (a generator bug)", v->name);
          goto done;
        }
        dup |= jobs[k].arch == o.archs[a];
      }
      if (dup) continue;
      jobs[njobs].v = v;
      jobs[njobs].arch = o.archs[a];
      jobs[njobs].want_ptx = o.ptx;
      ++njobs;
    }
  }

  emit_compile_all(jobs, njobs);
  for (int k = 0; k < njobs; ++k) {
    if (jobs[k].status != RDA_OK) {
      rc = rdagen_fail("%s", jobs[k].err.msg);
      goto done;
    }
  }
  /* The report goes out before the bundle is written: standard output that cannot take it (a
   * full disk) fails the emit with DIR as it was, not after the bundle landed. */
  printf("%-62s %-6s %5s %6s %7s %8s\n", "kernel", "arch", "regs", "spill", "smem", "compile");
  double sum = 0;
  for (int k = 0; k < njobs; ++k) {
    const emit_job *j = &jobs[k];
    printf("%-62s sm_%-3d %5d %6d %7d %6.2f s\n", j->v->name, j->arch, j->cubin.registers,
           j->cubin.spill_bytes, j->cubin.smem_bytes + j->v->smem_bytes, j->cubin.compile_s);
    sum += j->cubin.compile_s;
  }
  printf("%d kernels compiled (compile %.2f s, wall %.2f s); writing %s\n", njobs, sum,
         emit_now() - t0, o.out);
  errno = 0;
  if (fflush(stdout) != 0 || ferror(stdout)) {
    rc = rdagen_fail("emit: cannot write to standard output (%s): %s left as it was",
                     errno != 0 ? strerror(errno) : "a write failed", o.out);
    goto done;
  }
  rc = emit_write_all(&o, jobs, njobs);

done:
  for (int k = 0; k < njobs; ++k) {
    rda_nvrtc_out_free(&jobs[k].cubin);
    rda_nvrtc_out_free(&jobs[k].ptx);
  }
  free(jobs);
  for (int a = 0; a < nplans; ++a) rda_plan_k_free(&plans[a]);
  rda_gen_close(g);
  return rc;
}
