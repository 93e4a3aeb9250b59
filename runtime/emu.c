/* emu.c — the CPU emulator backend: compiles a variant's generated CUDA source with the host C++
 * compiler into a content-hashed, atomically cached shared object that links at load time against
 * the emulator runtime (templates/emu/emu_runtime.cc, cached alike); launches run synchronously. */
#include "emu.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../templates/emu/emu_launch.h"
#include "cache_dir.h"
#include "gen.h"

extern char **environ;

#ifndef RDA_HOST_CXX
#define RDA_HOST_CXX "c++"
#endif
#ifndef RDA_EMU_EXTRA_FLAGS
#define RDA_EMU_EXTRA_FLAGS ""
#endif

enum { kEmuPath = 4096, kEmuMaxArgs = 64, kEmuOutputCap = 1 << 16 };

/* The fixed compiler flags; RDA_EMU_EXTRA_FLAGS and $RDA_EMU_CXXFLAGS follow them. */
static const char *const rda_emu_base_flags[] = {"-x",
                                                 "c++",
                                                 "-std=c++17",
                                                 "-O2",
                                                 "-g0",
                                                 "-fPIC",
                                                 "-shared",
                                                 "-fvisibility=hidden",
                                                 "-fno-strict-aliasing",
                                                 "-DRDA_EMU"};

typedef int (*rda_emu_entry_fn)(rda_emu_launch *l, const void *params);

typedef struct rda_emu_impl {
  pthread_mutex_t mu;  /* guards version */
  char cxx[kEmuPath];  /* the compiler */
  char version[256];   /* first line of `cxx --version`, "" until known */
  char extra[1024];    /* RDA_EMU_EXTRA_FLAGS + $RDA_EMU_CXXFLAGS */
  unsigned os_threads; /* $RDA_EMU_THREADS, 0: all hardware threads */
} rda_emu_impl;

struct rda_module {
  void *dl;
  rda_emu_entry_fn entry;
  char name[128];
};

/* snprintf into a path buffer; RDA_ERR_CACHE when it does not fit. */
static rda_status rda_emu_path(char *out, size_t cap, rda_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static rda_status rda_emu_path(char *out, size_t cap, rda_err *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(out, cap, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= cap)
    return rda_err_set(err, RDA_ERR_CACHE, "emu: path too long: '%.200s...'", out);
  return RDA_OK;
}

/* ------------------------------------------------------------------ hashing (64-bit FNV-1a) */

typedef struct rda_emu_hash {
  uint64_t h;
} rda_emu_hash;

static void rda_emu_hash_init(rda_emu_hash *s) {
  s->h = 0xcbf29ce484222325ull;
}

static void rda_emu_hash_bytes(rda_emu_hash *s, const void *data, size_t n) {
  const unsigned char *p = data;
  uint64_t h = s->h;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  s->h = h;
}

/* A string with its length, so that ("ab","c") and ("a","bc") differ. */
static void rda_emu_hash_str(rda_emu_hash *s, const char *str) {
  const uint64_t n = strlen(str);
  rda_emu_hash_bytes(s, &n, sizeof n);
  rda_emu_hash_bytes(s, str, (size_t)n);
}

/* ------------------------------------------------------------------ files */

/* malloc'd contents of path (NUL-terminated), NULL if unreadable. */
static char *rda_emu_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf != NULL) {
    n += fread(buf + n, 1, cap - n - 1, f);
    if (n < cap - 1) break;
    char *grown = realloc(buf, cap * 2);
    if (grown == NULL) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = grown;
    cap *= 2;
  }
  const int bad = ferror(f);
  fclose(f);
  if (buf == NULL || bad) {
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  if (len != NULL) *len = n;
  return buf;
}

static rda_status rda_emu_write_file(const char *path, const char *data, size_t n, rda_err *err) {
  FILE *f = fopen(path, "wb");
  if (f == NULL)
    return rda_err_set(err, RDA_ERR_CACHE, "emu: cannot write '%s': %s", path, strerror(errno));
  const size_t put = fwrite(data, 1, n, f);
  const int closed = fclose(f);
  if (put != n || closed != 0) {
    unlink(path);
    return rda_err_set(err, RDA_ERR_CACHE, "emu: cannot write '%s': %s", path, strerror(errno));
  }
  return RDA_OK;
}

static int rda_emu_cmp_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int rda_emu_is_header(const char *name) {
  const size_t n = strlen(name);
  return (n > 2 && strcmp(name + n - 2, ".h") == 0) ||
         (n > 3 && strcmp(name + n - 3, ".cc") == 0) ||
         (n > 4 && strcmp(name + n - 4, ".cuh") == 0) ||
         (n > 4 && strcmp(name + n - 4, ".hpp") == 0);
}

/* Hash every header (and .cc) of one folder, by sorted name: name, length, contents. */
static rda_status rda_emu_hash_headers(rda_emu_hash *s, const char *dir, rda_err *err) {
  DIR *d = opendir(dir);
  if (d == NULL)
    return rda_err_set(err, RDA_ERR_EMULATOR, "emu: templates folder '%s': %s (set RDA_HOME)", dir,
                       strerror(errno));
  char **names = NULL;
  size_t count = 0, cap = 0;
  rda_status st = RDA_OK;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (!rda_emu_is_header(e->d_name)) continue;
    if (count == cap) {
      cap = cap ? 2 * cap : 16;
      char **grown = realloc(names, cap * sizeof *names);
      if (grown == NULL) {
        st = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: out of memory listing '%s'", dir);
        break;
      }
      names = grown;
    }
    names[count] = strdup(e->d_name);
    if (names[count] == NULL) {
      st = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: out of memory listing '%s'", dir);
      break;
    }
    ++count;
  }
  closedir(d);
  if (st == RDA_OK && count > 1) qsort(names, count, sizeof *names, rda_emu_cmp_names);
  for (size_t i = 0; st == RDA_OK && i < count; ++i) {
    char path[kEmuPath];
    st = rda_emu_path(path, sizeof path, err, "%s/%s", dir, names[i]);
    if (st != RDA_OK) break;
    size_t len = 0;
    char *text = rda_emu_read_file(path, &len);
    if (text == NULL) {
      st = rda_err_set(err, RDA_ERR_EMULATOR, "emu: cannot read template '%s'", path);
      break;
    }
    rda_emu_hash_str(s, names[i]);
    const uint64_t n = len;
    rda_emu_hash_bytes(s, &n, sizeof n);
    rda_emu_hash_bytes(s, text, len);
    free(text);
  }
  for (size_t i = 0; i < count; ++i) free(names[i]);
  free(names);
  return st;
}

/* ------------------------------------------------------------------ running the compiler */

/* Run argv (no shell) with stdout and stderr captured into out (cap bytes, NUL-terminated,
 * the rest dropped). *code: exit status, or 128 + signal. */
static rda_status rda_emu_spawn(char *const argv[], char *out, size_t cap, int *code,
                                rda_err *err) {
  int fds[2];
  out[0] = '\0';
  if (pipe(fds) != 0) return rda_err_set(err, RDA_ERR_EMULATOR, "emu: pipe: %s", strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  pid_t pid;
  const int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return rda_err_set(err, RDA_ERR_EMULATOR, "emu: cannot run the C++ compiler '%s': %s", argv[0],
                       strerror(rc));
  }
  size_t n = 0;
  for (;;) {
    char chunk[4096];
    const ssize_t got = read(fds[0], chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    const size_t room = cap - 1 - n;
    const size_t take = (size_t)got < room ? (size_t)got : room;
    memcpy(out + n, chunk, take);
    n += take;
  }
  out[n] = '\0';
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR)
      return rda_err_set(err, RDA_ERR_EMULATOR, "emu: waitpid: %s", strerror(errno));
  }
  *code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return RDA_OK;
}

/* The compiler's version line, asked once per backend. */
static rda_status rda_emu_version(rda_emu_impl *im, rda_err *err) {
  pthread_mutex_lock(&im->mu);
  rda_status st = RDA_OK;
  if (im->version[0] == '\0') {
    char *argv[] = {im->cxx, (char *)(uintptr_t) "--version", NULL};
    char out[4096];
    int code = 0;
    st = rda_emu_spawn(argv, out, sizeof out, &code, err);
    if (st == RDA_OK && code != 0)
      st =
          rda_err_set(err, RDA_ERR_EMULATOR, "emu: '%s --version' failed (exit %d)", im->cxx, code);
    if (st == RDA_OK) {
      size_t n = strcspn(out, "\n");
      if (n >= sizeof im->version) n = sizeof im->version - 1;
      memcpy(im->version, out, n);
      im->version[n] = '\0';
      if (n == 0) snprintf(im->version, sizeof im->version, "unknown");
    }
  }
  pthread_mutex_unlock(&im->mu);
  return st;
}

/* "first lines of the compiler output" as one line: newlines become " | ", and the temporary
 * source path `tmp` reads as `shown` (the kernel's name). */
static void rda_emu_one_line(const char *in, const char *tmp, const char *shown, char *out,
                             size_t cap) {
  const size_t tmp_len = strlen(tmp), shown_len = strlen(shown);
  size_t n = 0;
  for (const char *p = in; *p != '\0' && n + 4 < cap;) {
    if (tmp_len > 0 && strncmp(p, tmp, tmp_len) == 0 && n + shown_len + 4 < cap) {
      memcpy(out + n, shown, shown_len);
      n += shown_len;
      p += tmp_len;
    } else if (*p == '\n') {
      if (p[1] == '\0') break;
      memcpy(out + n, " | ", 3);
      n += 3;
      ++p;
    } else {
      if (*p != '\r') out[n++] = *p;
      ++p;
    }
  }
  out[n] = '\0';
}

static void rda_emu_flag_argv(rda_emu_impl *im, const char *include_flag, const char *out_path,
                              const char *src_path, char *extra_copy, char **argv) {
  int n = 0;
  argv[n++] = im->cxx;
  for (size_t i = 0; i < sizeof rda_emu_base_flags / sizeof *rda_emu_base_flags; ++i)
    argv[n++] = (char *)(uintptr_t)rda_emu_base_flags[i];
  argv[n++] = (char *)(uintptr_t)include_flag;
  for (char *save = NULL, *tok = strtok_r(extra_copy, " \t", &save);
       tok != NULL && n < kEmuMaxArgs - 4; tok = strtok_r(NULL, " \t", &save))
    argv[n++] = tok;
  argv[n++] = (char *)(uintptr_t) "-o";
  argv[n++] = (char *)(uintptr_t)out_path;
  argv[n++] = (char *)(uintptr_t)src_path;
  argv[n] = NULL;
}

/* ------------------------------------------------------------------ the backend */

static rda_status rda_emu_alloc(rda_backend *b, size_t bytes, void **dptr, rda_err *err) {
  (void)b;
  *dptr = NULL;
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: cannot allocate %zu bytes", bytes);
  memset(p, 0xff, bytes); /* like fresh device memory, garbage (here NaN) until written */
  *dptr = p;
  return RDA_OK;
}

static void rda_emu_free(rda_backend *b, void *dptr) {
  (void)b;
  free(dptr);
}

static rda_status rda_emu_copy(rda_backend *b, void *dst, const void *src, size_t bytes,
                               rda_err *err) {
  (void)b;
  if (bytes == 0) return RDA_OK;
  if (dst == NULL || src == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: copy of %zu bytes with a NULL pointer",
                       bytes);
  memcpy(dst, src, bytes);
  return RDA_OK;
}

static rda_status rda_emu_open_module(const char *so_path, const char *name, rda_module **out,
                                      rda_err *err) {
  void *dl = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
  if (dl == NULL)
    return rda_err_set(err, RDA_ERR_EMULATOR, "emu: dlopen '%s': %s", so_path, dlerror());
  char sym[160];
  snprintf(sym, sizeof sym, "%s__emu", name);
  void *p = dlsym(dl, sym);
  if (p == NULL) {
    dlclose(dl);
    return rda_err_set(
        err, RDA_ERR_EMULATOR,
        "emu: kernel module '%s' has no entry '%s' (RDA_EMU_EXPORT(%s, ...) missing?)", so_path,
        sym, name);
  }
  rda_module *m = calloc(1, sizeof *m);
  if (m == NULL) {
    dlclose(dl);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: out of memory");
  }
  m->dl = dl;
  memcpy(&m->entry, &p, sizeof p); /* object pointer to function pointer, as dlsym intends */
  snprintf(m->name, sizeof m->name, "%s", name);
  *out = m;
  return RDA_OK;
}

/* Does the cache hold a module built from exactly this source? */
static int rda_emu_cached(const char *so_path, const char *cu_path, const char *source) {
  if (access(so_path, R_OK) != 0) return 0;
  size_t len = 0;
  char *text = rda_emu_read_file(cu_path, &len);
  const int same = text != NULL && len == strlen(source) && memcmp(text, source, len) == 0;
  free(text);
  return same;
}

/* Build `<dir>/<base>.so` from `source` (text, also kept as `<dir>/<base>.cu`) or, when source
 * is NULL, from the file src_path. Temp names + rename: concurrent builders never expose a
 * half-written module. `what` names the build in errors. */
static rda_status rda_emu_compile(rda_emu_impl *im, const char *home, const char *dir,
                                  const char *base, const char *source, const char *src_path,
                                  const char *what, rda_err *err) {
  static atomic_ulong counter;
  const unsigned long k = atomic_fetch_add(&counter, 1);
  char tmp_cu[kEmuPath], tmp_so[kEmuPath], cu[kEmuPath], so[kEmuPath], inc[kEmuPath];
  RDA_TRY(rda_emu_path(tmp_cu, sizeof tmp_cu, err, "%s/%s.tmp%ld-%lu.cu", dir, base, (long)getpid(),
                       k));
  RDA_TRY(rda_emu_path(tmp_so, sizeof tmp_so, err, "%s/%s.tmp%ld-%lu.so", dir, base, (long)getpid(),
                       k));
  RDA_TRY(rda_emu_path(cu, sizeof cu, err, "%s/%s.cu", dir, base));
  RDA_TRY(rda_emu_path(so, sizeof so, err, "%s/%s.so", dir, base));
  RDA_TRY(rda_emu_path(inc, sizeof inc, err, "-I%s/templates", home));
  if (source != NULL) {
    RDA_TRY(rda_emu_write_file(tmp_cu, source, strlen(source), err));
    src_path = tmp_cu;
  }

  char extra[sizeof im->extra];
  memcpy(extra, im->extra, sizeof extra);
  char *argv[kEmuMaxArgs];
  rda_emu_flag_argv(im, inc, tmp_so, src_path, extra, argv);
  char *out = malloc(kEmuOutputCap);
  rda_status st = RDA_OK;
  int code = 0;
  if (out == NULL)
    st = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: out of memory");
  else
    st = rda_emu_spawn(argv, out, kEmuOutputCap, &code, err);
  if (st == RDA_OK && code != 0) {
    char line[900], shown[160];
    snprintf(shown, sizeof shown, "%s.cu", what);
    rda_emu_one_line(out, source != NULL ? src_path : "", shown, line, sizeof line);
    st = rda_err_set(err, RDA_ERR_EMULATOR, "emu: compiling %s failed (exit %d): %s", what, code,
                     line);
  }
  free(out);
  /* The source first, then the module: a reader that sees the module sees its source. */
  if (st == RDA_OK && source != NULL && rename(tmp_cu, cu) != 0)
    st = rda_err_set(err, RDA_ERR_CACHE, "emu: cannot store '%s': %s", cu, strerror(errno));
  if (st == RDA_OK && rename(tmp_so, so) != 0)
    st = rda_err_set(err, RDA_ERR_CACHE, "emu: cannot store '%s': %s", so, strerror(errno));
  if (st != RDA_OK) {
    if (source != NULL) unlink(tmp_cu);
    unlink(tmp_so);
  }
  return st;
}

/* The runtime every kernel module links against at load time (templates/emu/emu_runtime.cc),
 * built once per key and loaded RTLD_GLOBAL, never unloaded: kernel modules leave its symbols
 * undefined and resolve them when they are loaded. */
static pthread_mutex_t rda_emu_runtime_mu = PTHREAD_MUTEX_INITIALIZER;

static rda_status rda_emu_runtime(rda_emu_impl *im, const char *home, const char *dir,
                                  const rda_emu_hash *key, rda_err *err) {
  rda_emu_hash h = *key;
  rda_emu_hash_str(&h, "runtime");
  char base[40], so[kEmuPath], src[kEmuPath];
  snprintf(base, sizeof base, "rt-%016llx", (unsigned long long)h.h);
  RDA_TRY(rda_emu_path(so, sizeof so, err, "%s/%s.so", dir, base));
  RDA_TRY(rda_emu_path(src, sizeof src, err, "%s/templates/emu/emu_runtime.cc", home));
  pthread_mutex_lock(&rda_emu_runtime_mu);
  rda_status st = RDA_OK;
  void *dl = access(so, R_OK) == 0 ? dlopen(so, RTLD_NOW | RTLD_GLOBAL) : NULL;
  if (dl == NULL) {
    st = rda_emu_compile(im, home, dir, base, NULL, src, "the emulator runtime", err);
    if (st == RDA_OK) {
      dl = dlopen(so, RTLD_NOW | RTLD_GLOBAL);
      if (dl == NULL)
        st = rda_err_set(err, RDA_ERR_EMULATOR, "emu: dlopen '%s': %s", so, dlerror());
    }
  }
  pthread_mutex_unlock(&rda_emu_runtime_mu);
  return st; /* the handle stays open for the life of the process */
}

static rda_status rda_emu_load(rda_backend *b, const rda_variant *v, rda_module **out,
                               rda_err *err) {
  *out = NULL;
  rda_emu_impl *im = b->impl;
  if (v == NULL || v->source == NULL || v->name[0] == '\0')
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: variant without a name or source");
  const char *home = rda_gen_home();
  if (home == NULL || home[0] == '\0')
    return rda_err_set(err, RDA_ERR_EMULATOR, "emu: %s: no template folder (set RDA_HOME)",
                       v->name);
  struct utsname un;
  if (uname(&un) != 0) snprintf(un.machine, sizeof un.machine, "unknown");
  char sub[128], dir[kEmuPath];
  snprintf(sub, sizeof sub, "emu-%s", un.machine);
  RDA_TRY(rda_cache_dir_get(sub, dir, sizeof dir, err));
  RDA_TRY(rda_emu_version(im, err));

  /* The key: everything a module depends on besides its source (templates, compiler, flags). */
  rda_emu_hash key;
  rda_emu_hash_init(&key);
  rda_emu_hash_str(&key, "rda-emu-module-v2");
  const uint32_t abi = RDA_EMU_ABI;
  rda_emu_hash_bytes(&key, &abi, sizeof abi);
  char tdir[kEmuPath];
  RDA_TRY(rda_emu_path(tdir, sizeof tdir, err, "%s/templates", home));
  RDA_TRY(rda_emu_hash_headers(&key, tdir, err));
  RDA_TRY(rda_emu_path(tdir, sizeof tdir, err, "%s/templates/emu", home));
  RDA_TRY(rda_emu_hash_headers(&key, tdir, err));
  rda_emu_hash_str(&key, im->cxx);
  rda_emu_hash_str(&key, im->version);
  for (size_t i = 0; i < sizeof rda_emu_base_flags / sizeof *rda_emu_base_flags; ++i)
    rda_emu_hash_str(&key, rda_emu_base_flags[i]);
  rda_emu_hash_str(&key, im->extra);
  rda_emu_hash_str(&key, home);
  RDA_TRY(rda_emu_runtime(im, home, dir, &key, err));

  rda_emu_hash h = key;
  rda_emu_hash_str(&h, v->source);
  char base[32], so[kEmuPath], cu[kEmuPath];
  snprintf(base, sizeof base, "%016llx", (unsigned long long)h.h);
  RDA_TRY(rda_emu_path(so, sizeof so, err, "%s/%s.so", dir, base));
  RDA_TRY(rda_emu_path(cu, sizeof cu, err, "%s/%s.cu", dir, base));
  if (rda_emu_cached(so, cu, v->source)) {
    rda_err first = {0};
    if (rda_emu_open_module(so, v->name, out, &first) == RDA_OK) return RDA_OK;
    /* A damaged entry: build it again below. */
  }
  RDA_TRY(rda_emu_compile(im, home, dir, base, v->source, NULL, v->name, err));
  return rda_emu_open_module(so, v->name, out, err);
}

static void rda_emu_unload(rda_backend *b, rda_module *m) {
  (void)b;
  if (m == NULL) return;
  dlclose(m->dl);
  free(m);
}

static rda_status rda_emu_run(rda_backend *b, rda_module *m, const unsigned grid[3],
                              const unsigned block[3], unsigned smem_bytes, const void *params,
                              size_t params_bytes, rda_err *err) {
  rda_emu_impl *im = b->impl;
  if (m == NULL || params == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: launch without a module or params");
  rda_emu_launch *l = calloc(1, sizeof *l);
  if (l == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: out of memory");
  l->abi = RDA_EMU_ABI;
  for (int i = 0; i < 3; ++i) {
    l->grid[i] = grid[i];
    l->block[i] = block[i];
  }
  l->smem_bytes = smem_bytes;
  l->os_threads = im->os_threads;
  l->params_bytes = params_bytes;
  const int rc = m->entry(l, params);
  rda_status st = RDA_OK;
  if (rc != 0) {
    l->err[sizeof l->err - 1] = '\0';
    st = rda_err_set(err, RDA_ERR_EMULATOR, "emu: %s: %s", m->name, l->err);
  }
  free(l);
  return st;
}

static rda_status rda_emu_launch1(rda_backend *b, rda_module *m, const unsigned grid[3],
                                  unsigned threads, unsigned smem_bytes, const void *params,
                                  size_t params_bytes, rda_err *err) {
  const unsigned block[3] = {threads, 1, 1};
  return rda_emu_run(b, m, grid, block, smem_bytes, params, params_bytes, err);
}

rda_status rda_emu_launch3(rda_backend *b, rda_module *m, const unsigned grid[3],
                           const unsigned block[3], unsigned smem_bytes, const void *params,
                           size_t params_bytes, rda_err *err) {
  if (b == NULL || strcmp(b->name, "emu") != 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_emu_launch3: not an emu backend");
  return rda_emu_run(b, m, grid, block, smem_bytes, params, params_bytes, err);
}

static rda_status rda_emu_synchronize(rda_backend *b, rda_err *err) {
  (void)b;
  (void)err;
  return RDA_OK; /* launches run to completion */
}

static void rda_emu_destroy(rda_backend *b) {
  if (b == NULL) return;
  rda_emu_impl *im = b->impl;
  if (im != NULL) pthread_mutex_destroy(&im->mu);
  free(im);
  free(b);
}

rda_status rda_backend_emu_open(rda_backend **out, int arch, rda_err *err) {
  *out = NULL;
  rda_backend *b = calloc(1, sizeof *b);
  rda_emu_impl *im = calloc(1, sizeof *im);
  if (b == NULL || im == NULL) {
    free(b);
    free(im);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: out of memory");
  }
  pthread_mutex_init(&im->mu, NULL);
  const char *cxx = getenv("RDA_EMU_CXX");
  snprintf(im->cxx, sizeof im->cxx, "%s", (cxx && cxx[0]) ? cxx : RDA_HOST_CXX);
  const char *user = getenv("RDA_EMU_CXXFLAGS");
  snprintf(im->extra, sizeof im->extra, "%s %s", RDA_EMU_EXTRA_FLAGS, user ? user : "");
  const char *threads = getenv("RDA_EMU_THREADS");
  if (threads != NULL && threads[0] != '\0') {
    char *end = NULL;
    const long n = strtol(threads, &end, 10);
    if (*end != '\0' || n < 0 || n > 4096) {
      b->impl = im;
      rda_emu_destroy(b);
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "RDA_EMU_THREADS='%s': must be a count from 0 (all cores) to 4096",
                         threads);
    }
    im->os_threads = (unsigned)n;
  }
  b->name = "emu";
  b->arch = arch;
  b->impl = im;
  b->alloc = rda_emu_alloc;
  b->free = rda_emu_free;
  b->upload = rda_emu_copy;
  b->download = rda_emu_copy;
  b->load = rda_emu_load;
  b->unload = rda_emu_unload;
  b->launch = rda_emu_launch1;
  b->synchronize = rda_emu_synchronize;
  b->destroy = rda_emu_destroy;
  *out = b;
  return RDA_OK;
}
