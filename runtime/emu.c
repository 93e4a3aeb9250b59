/* emu.c — the CPU emulator backend: compiles a variant's generated CUDA source with the host C++
 * compiler into a shared object kept in the kernel cache (runtime/cache.h, target emu-<machine>)
 * that links at load time against the emulator runtime (cached alike); launches run inside the
 * call, or with RDA_EMU_STREAMS=async on streams an emulated device runs (runtime/emu_streams.h).
 */
#include "emu.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../templates/emu/emu_launch.h"
#include "cache.h"
#include "emu_streams.h"
#include "log.h"
#include "sources.h"

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
  unsigned order;      /* $RDA_EMU_ORDER: 0 forward, 1 reverse */
  rda_es *async;       /* $RDA_EMU_STREAMS=async: the backend's streams; NULL: synchronous */
} rda_emu_impl;

/* A kernel module's dlopen handle, shared process-wide by every load of the same cache key
 * (rda_emu_shared_get). Each dlopen maps a private copy of the object (its own temporary
 * file, four or more mappings), so a copy per backend, one per virtual rank of the ring, hit
 * vm.max_map_count at a few thousand ranks. Sharing is safe: a kernel module keeps no mutable
 * state of its own (its only writable data is the C/C++ start-up files' bookkeeping); launch
 * state lives in the emulator runtime (per launch, per worker, per OS thread); a static
 * __shared__ variable is thread_local and a block runs from start to end on one OS thread, so
 * two launches at once (two backends on two threads) never meet there. */
typedef struct rda_emu_shared {
  char key[65]; /* rda_cache_key hex */
  void *dl;
  long refs; /* rda_modules holding dl; guarded by rda_emu_shared_mu */
  struct rda_emu_shared *next;
} rda_emu_shared;

struct rda_module {
  rda_emu_shared *shared;
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

/* ------------------------------------------------------------------ files */

/* Write a new file (O_EXCL: never over anything); *taken (may be NULL) is 1 when the name was
 * taken already. */
static rda_status rda_emu_write_file(const char *path, const void *data, size_t n, int *taken,
                                     rda_err *err) {
  const int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (taken != NULL) *taken = fd < 0 && errno == EEXIST;
  if (fd < 0)
    return rda_err_set(err, RDA_ERR_CACHE, "emu: cannot write '%s': %s", path, strerror(errno));
  const unsigned char *p = data;
  size_t left = n;
  while (left > 0) {
    const ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    p += w;
    left -= (size_t)w;
  }
  const int closed = close(fd);
  if (left != 0 || closed != 0) {
    unlink(path);
    return rda_err_set(err, RDA_ERR_CACHE, "emu: cannot write '%s': %s", path, strerror(errno));
  }
  return RDA_OK;
}

/* Temporary names hold the pid and a count (`<stem>.tmp.<pid>.<k>`); a name taken already (left
 * by a process of the same pid killed mid-build: a container's pid 1 after a kill -9; or used
 * by another container's pid 1 on the same cache) is passed over for the next k. */
enum { kEmuTmpTries = 100 };
static atomic_ulong rda_emu_tmp_counter;

/* Write data to the new file `<stem>.tmp.<pid>.<k><ext>` (path, cap bytes). */
static rda_status rda_emu_write_tmp(char *path, size_t cap, const char *stem, const char *ext,
                                    const void *data, size_t n, rda_err *err) {
  for (int attempt = 0;; ++attempt) {
    RDA_TRY(rda_emu_path(path, cap, err, "%s.tmp.%ld.%lu%s", stem, (long)getpid(),
                         atomic_fetch_add(&rda_emu_tmp_counter, 1), ext));
    int taken = 0;
    rda_err e = {0};
    if (rda_emu_write_file(path, data, n, &taken, &e) == RDA_OK) return RDA_OK;
    if (!taken || attempt + 1 == kEmuTmpTries) return rda_err_set(err, e.status, "%s", e.msg);
  }
}

/* Make the new folder `<stem>.tmp.<pid>.<k>` (path, cap bytes). */
static rda_status rda_emu_mkdir_tmp(char *path, size_t cap, const char *stem, rda_err *err) {
  for (int attempt = 0; attempt < kEmuTmpTries; ++attempt) {
    RDA_TRY(rda_emu_path(path, cap, err, "%s.tmp.%ld.%lu", stem, (long)getpid(),
                         atomic_fetch_add(&rda_emu_tmp_counter, 1)));
    if (mkdir(path, 0700) == 0) return RDA_OK;
    if (errno != EEXIST) break;
  }
  return rda_err_set(err, RDA_ERR_CACHE, "emu: mkdir '%s': %s", path, strerror(errno));
}

/* 1 when every template under `inc` holds exactly what rda_sources_read serves. */
static int rda_emu_headers_intact(const char *inc) {
  static const char prefix[] = "templates/";
  for (size_t i = 0; i < rda_sources_count(); ++i) {
    const char *name = rda_sources_name(i);
    if (strncmp(name, prefix, sizeof prefix - 1) != 0) continue;
    char path[kEmuPath];
    if (rda_emu_path(path, sizeof path, NULL, "%s/%s", inc, name + sizeof prefix - 1) != RDA_OK)
      return 0;
    char *want = NULL;
    unsigned char *have = NULL;
    size_t nw = 0, nh = 0;
    int same = rda_sources_read(name, &want, &nw, NULL) == RDA_OK &&
               rda_cache_read_file(path, &have, &nh, NULL) == RDA_OK && nw == nh &&
               memcmp(want, have, nw) == 0;
    free(want);
    free(have);
    if (!same) return 0;
  }
  return 1;
}

/* The templates the compiler #includes, written once per content into `dir`/inc-<digest>/
 * (content-addressed: a folder that exists is complete, it appeared by one rename). */
static rda_status rda_emu_headers(const char *dir, const char *digest, char *inc, size_t cap,
                                  rda_err *err) {
  RDA_TRY(rda_emu_path(inc, cap, err, "%s/inc-%.32s", dir, digest));
  char tmp[kEmuPath], sub[kEmuPath];
  struct stat st;
  const int present = lstat(inc, &st) == 0;
  if (present && S_ISDIR(st.st_mode)) {
    if (rda_emu_headers_intact(inc)) {
      /* In use: a fresh mtime keeps `rdagen cache clear` from taking it now (it leaves
       * header folders younger than an hour). */
      (void)utimensat(AT_FDCWD, inc, NULL, AT_SYMLINK_NOFOLLOW);
      return RDA_OK;
    }
    /* Damaged (a file edited or removed by hand): moved aside onto an empty folder of ours
     * (a rename replaces one), then written anew. */
    rda_log(RDA_LOG_INFO, "emulator headers in %s damaged: rewriting them", inc);
    if (rda_emu_mkdir_tmp(tmp, sizeof tmp, inc, NULL) == RDA_OK) {
      (void)rename(inc, tmp);
      rda_cache_remove_tree(tmp);
    }
  } else if (present) { /* a file or a link in its place: never followed */
    rda_log(RDA_LOG_INFO, "emulator headers %s: not a folder, replacing it", inc);
    (void)unlink(inc);
  }
  RDA_TRY(rda_emu_mkdir_tmp(tmp, sizeof tmp, inc, err));
  static const char prefix[] = "templates/";
  rda_status s = RDA_OK;
  for (size_t i = 0; s == RDA_OK && i < rda_sources_count(); ++i) {
    const char *name = rda_sources_name(i);
    if (strncmp(name, prefix, sizeof prefix - 1) != 0) continue;
    const char *rel = name + sizeof prefix - 1;
    const char *slash = strrchr(rel, '/');
    if (slash != NULL) { /* one level: emu/ */
      s = rda_emu_path(sub, sizeof sub, err, "%s/%.*s", tmp, (int)(slash - rel), rel);
      if (s == RDA_OK && mkdir(sub, 0700) != 0 && errno != EEXIST)
        s = rda_err_set(err, RDA_ERR_CACHE, "emu: mkdir '%s': %s", sub, strerror(errno));
    }
    char *text = NULL;
    size_t len = 0;
    if (s == RDA_OK) s = rda_sources_read(name, &text, &len, err);
    if (s == RDA_OK) s = rda_emu_path(sub, sizeof sub, err, "%s/%s", tmp, rel);
    if (s == RDA_OK) s = rda_emu_write_file(sub, text, len, NULL, err);
    free(text);
  }
  if (s == RDA_OK && rename(tmp, inc) != 0 && errno != EEXIST && errno != ENOTEMPTY)
    s = rda_err_set(err, RDA_ERR_CACHE, "emu: cannot store '%s': %s", inc, strerror(errno));
  rda_cache_remove_tree(tmp); /* gone already after a rename; another builder won otherwise */
  return s;
}

/* ------------------------------------------------------------------ running the compiler */

/* Run argv (no shell) with stdout and stderr captured into out (cap bytes, NUL-terminated,
 * the rest dropped). *code: exit status, or 128 + signal. */
static rda_status rda_emu_spawn(char *const argv[], char *out, size_t cap, int *code,
                                rda_err *err) {
  /* No compiler another thread spawns may inherit this pipe's write end (this read would then
   * wait for that compile too): both ends close on exec, and one lock spans making the pipe,
   * setting that, the spawn and closing the write end, for all of rda's spawns. */
  static pthread_mutex_t spawn_lock = PTHREAD_MUTEX_INITIALIZER;
  int fds[2];
  out[0] = '\0';
  pthread_mutex_lock(&spawn_lock);
  if (pipe(fds) != 0) {
    pthread_mutex_unlock(&spawn_lock);
    return rda_err_set(err, RDA_ERR_EMULATOR, "emu: pipe: %s", strerror(errno));
  }
  (void)fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  (void)fcntl(fds[1], F_SETFD, FD_CLOEXEC);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1); /* dup2 clears close-on-exec on 1 and 2 */
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  /* The compiler gets SIGPIPE's default action whatever this process chose: an ignored signal
   * would stay ignored across exec (a host program may ignore it). */
  posix_spawnattr_t sa;
  posix_spawnattr_init(&sa);
  sigset_t def;
  sigemptyset(&def);
  sigaddset(&def, SIGPIPE);
  posix_spawnattr_setsigdefault(&sa, &def);
  posix_spawnattr_setflags(&sa, POSIX_SPAWN_SETSIGDEF);
  pid_t pid;
  const int rc = posix_spawnp(&pid, argv[0], &fa, &sa, argv, environ);
  posix_spawnattr_destroy(&sa);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  pthread_mutex_unlock(&spawn_lock);
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

/* How many of the extra flags fit argv beside the compiler, the base flags, the include flag,
 * "-o", the output, the source and the NULL. */
static int rda_emu_extra_room(void) {
  return kEmuMaxArgs - 4 - 2 - (int)(sizeof rda_emu_base_flags / sizeof *rda_emu_base_flags);
}

static int rda_emu_count_words(const char *s) {
  int n = 0;
  for (const char *p = s; *p != '\0'; ++p)
    n += (*p != ' ' && *p != '\t') && (p == s || p[-1] == ' ' || p[-1] == '\t');
  return n;
}

static void rda_emu_flag_argv(rda_emu_impl *im, const char *include_flag, const char *out_path,
                              const char *src_path, char *extra_copy, char **argv) {
  int n = 0;
  argv[n++] = im->cxx;
  for (size_t i = 0; i < sizeof rda_emu_base_flags / sizeof *rda_emu_base_flags; ++i)
    argv[n++] = (char *)(uintptr_t)rda_emu_base_flags[i];
  argv[n++] = (char *)(uintptr_t)include_flag;
  for (char *save = NULL, *tok = strtok_r(extra_copy, " \t", &save); tok != NULL;
       tok = strtok_r(NULL, " \t", &save)) /* they fit: rda_emu_extra_room */
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

/* Asynchronous streams: upload and download wait for the calling thread's default stream
 * first (backend.h: they order against the backend's own stream alone). */
static rda_status rda_emu_settle(rda_backend *b, rda_err *err) {
  rda_emu_impl *im = b->impl;
  return im->async != NULL ? rda_es_sync(im->async, err) : RDA_OK;
}

/* Waits for every stream of the backend: work queued on any stream may still use memory or a
 * module about to go (cuMemFree and cuModuleUnload synchronize likewise). A failure there is
 * sticky and the next synchronize reports it. */
static void rda_emu_idle(rda_backend *b) {
  rda_emu_impl *im = b->impl;
  rda_err ignored = {0};
  if (im->async != NULL) (void)rda_es_idle(im->async, &ignored);
}

static void rda_emu_free(rda_backend *b, void *dptr) {
  rda_emu_idle(b);
  free(dptr);
}

static rda_status rda_emu_copy_now(void *dst, const void *src, size_t bytes, rda_err *err) {
  if (bytes == 0) return RDA_OK;
  if (dst == NULL || src == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: copy of %zu bytes with a NULL pointer",
                       bytes);
  memcpy(dst, src, bytes);
  return RDA_OK;
}

/* upload and download. */
static rda_status rda_emu_copy(rda_backend *b, void *dst, const void *src, size_t bytes,
                               rda_err *err) {
  RDA_TRY(rda_emu_settle(b, err));
  return rda_emu_copy_now(dst, src, bytes, err);
}

static rda_status rda_emu_copy_async(rda_backend *b, void *dst, const void *src, size_t bytes,
                                     rda_err *err) {
  rda_emu_impl *im = b->impl;
  if (im->async == NULL || bytes == 0 || dst == NULL || src == NULL)
    return rda_emu_copy_now(dst, src, bytes, err);
  return rda_es_copy(im->async, dst, src, bytes, err);
}

/* dlopen a module given as bytes: written to a temporary file in `dir`, opened, unlinked. */
static rda_status rda_emu_dlopen_bytes(const char *dir, const unsigned char *data, size_t n,
                                       int flags, void **dl, rda_err *err) {
  char path[kEmuPath], stem[kEmuPath];
  *dl = NULL;
  RDA_TRY(rda_emu_path(stem, sizeof stem, err, "%s/load", dir));
  RDA_TRY(rda_emu_write_tmp(path, sizeof path, stem, ".so", data, n, err));
  *dl = dlopen(path, flags);
  rda_status st = RDA_OK;
  if (*dl == NULL) st = rda_err_set(err, RDA_ERR_EMULATOR, "emu: dlopen '%s': %s", path, dlerror());
  unlink(path);
  return st;
}

static pthread_mutex_t rda_emu_shared_mu = PTHREAD_MUTEX_INITIALIZER;
static rda_emu_shared *rda_emu_shared_list; /* the loaded kernel modules, guarded by the mutex */

/* The entry of `key`, or NULL; the mutex held. */
static rda_emu_shared *rda_emu_shared_find_locked(const char *key) {
  rda_emu_shared *e = rda_emu_shared_list;
  while (e != NULL && strcmp(e->key, key) != 0) e = e->next;
  return e;
}

/* The loaded module of `key` with one more reference, or NULL when none is loaded. */
static rda_emu_shared *rda_emu_shared_get(const char *key) {
  pthread_mutex_lock(&rda_emu_shared_mu);
  rda_emu_shared *e = rda_emu_shared_find_locked(key);
  if (e != NULL) ++e->refs;
  pthread_mutex_unlock(&rda_emu_shared_mu);
  return e;
}

/* Enter the fresh handle `dl` of `key` with one reference. Should another thread have entered
 * the key meanwhile (both missed rda_emu_shared_get), dl is closed and that one is shared.
 * NULL when out of memory (dl closed). */
static rda_emu_shared *rda_emu_shared_put(const char *key, void *dl) {
  rda_emu_shared *fresh = calloc(1, sizeof *fresh);
  pthread_mutex_lock(&rda_emu_shared_mu);
  rda_emu_shared *e = rda_emu_shared_find_locked(key);
  if (e != NULL) {
    ++e->refs;
  } else if (fresh != NULL) {
    snprintf(fresh->key, sizeof fresh->key, "%s", key);
    fresh->dl = dl;
    fresh->refs = 1;
    fresh->next = rda_emu_shared_list;
    rda_emu_shared_list = e = fresh;
  }
  pthread_mutex_unlock(&rda_emu_shared_mu);
  if (e == NULL || e != fresh) { /* dl not entered */
    free(fresh);
    dlclose(dl);
  }
  return e;
}

/* Drop one reference; the last closes the handle. */
static void rda_emu_shared_drop(rda_emu_shared *e) {
  pthread_mutex_lock(&rda_emu_shared_mu);
  const int last = --e->refs == 0;
  if (last) {
    rda_emu_shared **at = &rda_emu_shared_list;
    while (*at != e) at = &(*at)->next;
    *at = e->next;
  }
  pthread_mutex_unlock(&rda_emu_shared_mu);
  if (last) {
    dlclose(e->dl);
    free(e);
  }
}

/* A module of entry `name` in the shared handle sh, taking over the caller's reference (dropped
 * on failure). */
static rda_status rda_emu_open_module(rda_emu_shared *sh, const char *name, rda_module **out,
                                      rda_err *err) {
  char sym[160];
  snprintf(sym, sizeof sym, "%s__emu", name);
  void *p = dlsym(sh->dl, sym);
  rda_module *m = p != NULL ? calloc(1, sizeof *m) : NULL;
  if (m == NULL) {
    rda_emu_shared_drop(sh);
    if (p != NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: out of memory");
    return rda_err_set(err, RDA_ERR_EMULATOR,
                       "emu: kernel module of '%s' has no entry '%s' (RDA_EMU_EXPORT(%s, ...) "
                       "missing?)",
                       name, sym, name);
  }
  m->shared = sh;
  memcpy(&m->entry, &p, sizeof p); /* object pointer to function pointer, as dlsym intends */
  snprintf(m->name, sizeof m->name, "%s", name);
  *out = m;
  return RDA_OK;
}

/* What a module's key holds besides its source: the target, the templates, rda's version, the
 * compiler and every flag. */
typedef struct rda_emu_keyparts {
  char target[96];
  char headers[65];
  char compiler[kEmuPath + 300];
  char options[1600];
} rda_emu_keyparts;

static rda_status rda_emu_keyparts_of(rda_emu_impl *im, rda_emu_keyparts *kp, rda_err *err) {
  struct utsname un;
  if (uname(&un) != 0) snprintf(un.machine, sizeof un.machine, "unknown");
  snprintf(kp->target, sizeof kp->target, "emu-%.80s", un.machine);
  RDA_TRY(rda_emu_version(im, err));
  RDA_TRY(rda_sources_digest("templates/", kp->headers, err));
  snprintf(kp->compiler, sizeof kp->compiler, "%s | %s", im->cxx, im->version);
  size_t n = (size_t)snprintf(kp->options, sizeof kp->options, "abi=%u", (unsigned)RDA_EMU_ABI);
  for (size_t i = 0; i < sizeof rda_emu_base_flags / sizeof *rda_emu_base_flags; ++i)
    if (n < sizeof kp->options)
      n += (size_t)snprintf(kp->options + n, sizeof kp->options - n, " %s", rda_emu_base_flags[i]);
  if (n < sizeof kp->options) snprintf(kp->options + n, sizeof kp->options - n, " | %s", im->extra);
  return RDA_OK;
}

/* Compile `source` (text; or, when NULL, the file src_path) into a module and return its bytes
 * (malloc'd). Temporary files live in `dir` and are removed. `what` names it in errors. */
static rda_status rda_emu_compile(rda_emu_impl *im, const char *dir, const char *inc_dir,
                                  const char *source, const char *src_path, const char *what,
                                  unsigned char **image, size_t *image_bytes, rda_err *err) {
  char tmp_cu[kEmuPath], tmp_so[kEmuPath], inc[kEmuPath], stem[kEmuPath];
  *image = NULL;
  *image_bytes = 0;
  RDA_TRY(rda_emu_path(inc, sizeof inc, err, "-I%s", inc_dir));
  RDA_TRY(rda_emu_path(stem, sizeof stem, err, "%s/build", dir));
  /* The output's name is taken first (an empty file the compiler replaces), then the source's
   * of the same k: no other build writes either. */
  for (int attempt = 0;; ++attempt) {
    RDA_TRY(rda_emu_write_tmp(tmp_so, sizeof tmp_so, stem, ".so", "", 0, err));
    snprintf(tmp_cu, sizeof tmp_cu, "%.*s.cu", (int)(strlen(tmp_so) - 3), tmp_so); /* fits */
    if (source == NULL) break;
    int taken = 0;
    rda_err e = {0};
    if (rda_emu_write_file(tmp_cu, source, strlen(source), &taken, &e) == RDA_OK) {
      src_path = tmp_cu;
      break;
    }
    unlink(tmp_so);
    if (!taken || attempt + 1 == kEmuTmpTries) return rda_err_set(err, e.status, "%s", e.msg);
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
  if (st == RDA_OK) st = rda_cache_read_file(tmp_so, image, image_bytes, err);
  if (source != NULL) unlink(tmp_cu);
  unlink(tmp_so);
  return st;
}

/* Fetch the module of `key` from the cache, or build and store it. *image malloc'd. */
static rda_status rda_emu_fetch(rda_emu_impl *im, const char *dir, const rda_emu_keyparts *kp,
                                const rda_cache_key *key, const char *name, const char *source,
                                const char *src_rel, unsigned char **image, size_t *bytes,
                                rda_err *err) {
  int hit = 0;
  char why[160];
  RDA_TRY(rda_cache_get(kp->target, key, source, image, bytes, &hit, why, sizeof why, err));
  if (hit) return RDA_OK;
  const double t0 = rda_log_now();
  char inc[kEmuPath], src_path[kEmuPath];
  rda_status st = RDA_OK;
  /* Another process's `rdagen cache clear` may take the header folder (an old one), wholly or
   * in part, while the compiler reads it: a failed compile whose headers are not intact any
   * more writes them again and is tried once more. */
  for (int attempt = 0; attempt < 2; ++attempt) {
    rda_err first = {0};
    st = rda_emu_headers(dir, kp->headers, inc, sizeof inc, &first);
    if (st == RDA_OK && src_rel != NULL)
      st = rda_emu_path(src_path, sizeof src_path, &first, "%s/%s", inc, src_rel);
    if (st == RDA_OK)
      st = rda_emu_compile(im, dir, inc, src_rel != NULL ? NULL : source,
                           src_rel != NULL ? src_path : NULL, name, image, bytes, &first);
    if (st == RDA_OK || attempt == 1 || rda_emu_headers_intact(inc)) {
      if (st != RDA_OK) return rda_err_set(err, st, "%s", first.msg);
      break;
    }
    rda_log(RDA_LOG_INFO,
            "emulator headers %s changed or vanished while compiling %s: writing them again", inc,
            name);
  }
  rda_log(RDA_LOG_INFO, "compiled %s for %s in %.2f s (cache miss: %s)", name, kp->target,
          rda_log_now() - t0, why);
  rda_err put = {0}; /* a cache that cannot take the entry (disk full) costs a recompile later */
  if (rda_cache_put(kp->target, key, name, source, *image, *bytes, &put) != RDA_OK)
    rda_log(RDA_LOG_INFO, "%s not cached: %s", name, put.msg);
  return RDA_OK;
}

/* The runtime every kernel module links against at load time (templates/emu/emu_runtime.cc),
 * built once per key and loaded RTLD_GLOBAL, never unloaded: kernel modules leave its symbols
 * undefined and resolve them when they are loaded. */
static pthread_mutex_t rda_emu_runtime_mu = PTHREAD_MUTEX_INITIALIZER;
static char rda_emu_runtime_loaded[8][65];
static int rda_emu_runtime_count;

static rda_status rda_emu_runtime(rda_emu_impl *im, const char *dir, const rda_emu_keyparts *kp,
                                  rda_err *err) {
  char *text = NULL;
  RDA_TRY(rda_sources_read("templates/emu/emu_runtime.cc", &text, NULL, err));
  const rda_cache_inputs in = {kp->target, text,        kp->headers,
                               RDA_VERSION_STRING, kp->compiler, kp->options};
  rda_cache_key key;
  rda_cache_key_of(&in, &key);
  pthread_mutex_lock(&rda_emu_runtime_mu);
  rda_status st = RDA_OK;
  int loaded = 0;
  for (int i = 0; i < rda_emu_runtime_count && !loaded; ++i)
    loaded = strcmp(rda_emu_runtime_loaded[i], key.hex) == 0;
  if (!loaded) {
    unsigned char *image = NULL;
    size_t bytes = 0;
    void *dl = NULL;
    st = rda_emu_fetch(im, dir, kp, &key, "emu_runtime", text, "emu/emu_runtime.cc", &image,
                       &bytes, err);
    if (st == RDA_OK) st = rda_emu_dlopen_bytes(dir, image, bytes, RTLD_NOW | RTLD_GLOBAL, &dl, err);
    free(image);
    if (st == RDA_OK && rda_emu_runtime_count < 8)
      memcpy(rda_emu_runtime_loaded[rda_emu_runtime_count++], key.hex, 65);
  }
  pthread_mutex_unlock(&rda_emu_runtime_mu);
  free(text);
  return st; /* the handle stays open for the life of the process */
}

/* The cache folder a build ran out of space in: this process then builds every module of that
 * folder in a private one (rda_emu_private_dir) and keeps it in memory, as for an unusable
 * cache. Another folder (RDA_CACHE_DIR changed) is tried afresh. */
static pthread_mutex_t rda_emu_full_mu = PTHREAD_MUTEX_INITIALIZER;
static char rda_emu_full_dir[kEmuPath];

static int rda_emu_is_full(const char *dir) {
  pthread_mutex_lock(&rda_emu_full_mu);
  const int full = strcmp(rda_emu_full_dir, dir) == 0;
  pthread_mutex_unlock(&rda_emu_full_mu);
  return full;
}

/* Records dir as full; 1 when it was not recorded yet (then the caller says so, once). */
static int rda_emu_mark_full(const char *dir) {
  pthread_mutex_lock(&rda_emu_full_mu);
  const int fresh = strcmp(rda_emu_full_dir, dir) != 0;
  if (fresh) snprintf(rda_emu_full_dir, sizeof rda_emu_full_dir, "%s", dir);
  pthread_mutex_unlock(&rda_emu_full_mu);
  return fresh;
}

/* 1 when a failed build in `dir` failed for want of space: the error (ours, the compiler's or
 * the linker's) names ENOSPC or EDQUOT, or the file system under dir is all but full. */
static int rda_emu_out_of_space(const char *dir, const char *msg) {
  if (strstr(msg, strerror(ENOSPC)) != NULL || strstr(msg, strerror(EDQUOT)) != NULL) return 1;
  struct statvfs fs;
  return statvfs(dir, &fs) == 0 && (unsigned long long)fs.f_bavail * fs.f_frsize < (1ull << 20);
}

/* A fresh private build folder under $TMPDIR (else /tmp); the caller removes it. */
static rda_status rda_emu_private_dir(char *dir, size_t cap, rda_err *err) {
  const char *base = getenv("TMPDIR");
  if (base == NULL || base[0] == '\0') base = "/tmp";
  RDA_TRY(rda_emu_path(dir, cap, err, "%s/rda-emu-XXXXXX", base));
  if (mkdtemp(dir) == NULL)
    return rda_err_set(err, RDA_ERR_EMULATOR,
                       "emu: the kernel cache cannot be used and no private build folder can be "
                       "made in '%s': %s",
                       base, strerror(errno));
  return RDA_OK;
}

/* Fetch or build the module of v (key) with `dir` as the build folder and load it: *dl. */
static rda_status rda_emu_build(rda_emu_impl *im, const char *dir, const rda_emu_keyparts *kp,
                                const rda_cache_key *key, const rda_variant *v, void **dl,
                                rda_err *err) {
  unsigned char *image = NULL;
  size_t bytes = 0;
  RDA_TRY(rda_emu_runtime(im, dir, kp, err));
  rda_status st = rda_emu_fetch(im, dir, kp, key, v->name, v->source, NULL, &image, &bytes, err);
  if (st == RDA_OK) st = rda_emu_dlopen_bytes(dir, image, bytes, RTLD_NOW | RTLD_LOCAL, dl, err);
  free(image);
  return st;
}

/* A module already loaded in this process (by any backend) is shared, not loaded again. */
static rda_status rda_emu_load(rda_backend *b, const rda_variant *v, rda_module **out,
                               rda_err *err) {
  *out = NULL;
  rda_emu_impl *im = b->impl;
  if (v == NULL || v->source == NULL || v->name[0] == '\0')
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: variant without a name or source");
  rda_emu_keyparts *kp = malloc(sizeof *kp);
  if (kp == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: out of memory");
  rda_cache_key key;
  memset(&key, 0, sizeof key);
  rda_emu_shared *sh = NULL;
  rda_status st = rda_emu_keyparts_of(im, kp, err);
  if (st == RDA_OK) {
    const rda_cache_inputs in = {kp->target, v->source,   kp->headers,
                                 RDA_VERSION_STRING, kp->compiler, kp->options};
    rda_cache_key_of(&in, &key);
    sh = rda_emu_shared_get(key.hex);
  }
  if (st == RDA_OK && sh == NULL) {
    void *dl = NULL;
    char dir[kEmuPath];
    int in_cache = 0;
    st = rda_cache_folder_try(kp->target, dir, sizeof dir, &in_cache, NULL, 0, err);
    in_cache = st == RDA_OK && in_cache && !rda_emu_is_full(dir);
    if (st == RDA_OK && in_cache) {
      rda_err first = {0};
      st = rda_emu_build(im, dir, kp, &key, v, &dl, &first);
      if (st != RDA_OK && rda_emu_out_of_space(dir, first.msg)) {
        if (rda_emu_mark_full(dir))
          rda_log(RDA_LOG_INFO,
                  "no space left for emulator builds in %s (%s): building in private folders "
                  "under $TMPDIR from now on",
                  dir, first.msg);
        in_cache = 0;
        st = RDA_OK;
      } else if (st != RDA_OK) {
        st = rda_err_set(err, st, "%s", first.msg);
      }
    }
    /* The cache cannot be written (said once) or is full: build in a private folder. */
    if (st == RDA_OK && !in_cache && (st = rda_emu_private_dir(dir, sizeof dir, err)) == RDA_OK) {
      st = rda_emu_build(im, dir, kp, &key, v, &dl, err);
      rda_cache_remove_tree(dir);
    }
    if (st == RDA_OK && (sh = rda_emu_shared_put(key.hex, dl)) == NULL)
      st = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: out of memory");
  }
  free(kp);
  if (st == RDA_OK) st = rda_emu_open_module(sh, v->name, out, err);
  return st;
}

static void rda_emu_unload(rda_backend *b, rda_module *m) {
  if (m == NULL) return;
  rda_emu_idle(b); /* launches queued name m */
  rda_emu_shared_drop(m->shared);
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
  l->order = im->order;
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

/* A launch: run now, or queued on the calling thread's current stream. A launch the kernel
 * runtime would refuse for its shape is refused here, before it is queued, as cuLaunchKernel
 * refuses it without failing the context (the runtime's own check stays: it also guards the
 * synchronous path's callers of rda_emu_run). */
static rda_status rda_emu_start(rda_backend *b, rda_module *m, const unsigned grid[3],
                                const unsigned block[3], unsigned smem_bytes, const void *params,
                                size_t params_bytes, rda_err *err) {
  rda_emu_impl *im = b->impl;
  if (im->async == NULL || m == NULL || params == NULL)
    return rda_emu_run(b, m, grid, block, smem_bytes, params, params_bytes, err);
  const unsigned long long threads = (unsigned long long)block[0] * block[1] * block[2];
  if (block[0] == 0 || block[1] == 0 || block[2] == 0 || threads > 1024)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "emu: %s: block (%u,%u,%u): every dimension >= 1, at most 1024 threads",
                       m->name, block[0], block[1], block[2]);
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || grid[1] > 65535 || grid[2] > 65535)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "emu: %s: grid (%u,%u,%u): every dimension >= 1, y and z <= 65535", m->name,
                       grid[0], grid[1], grid[2]);
  return rda_es_launch(im->async, m, grid, block, smem_bytes, params, params_bytes, err);
}

static rda_status rda_emu_launch1(rda_backend *b, rda_module *m, const unsigned grid[3],
                                  unsigned threads, unsigned smem_bytes, const void *params,
                                  size_t params_bytes, rda_err *err) {
  const unsigned block[3] = {threads, 1, 1};
  return rda_emu_start(b, m, grid, block, smem_bytes, params, params_bytes, err);
}

int rda_backend_emu_async(const rda_backend *b) {
  return b != NULL && strcmp(b->name, "emu") == 0 && ((const rda_emu_impl *)b->impl)->async != NULL;
}

rda_status rda_emu_launch3(rda_backend *b, rda_module *m, const unsigned grid[3],
                           const unsigned block[3], unsigned smem_bytes, const void *params,
                           size_t params_bytes, rda_err *err) {
  if (b == NULL || strcmp(b->name, "emu") != 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_emu_launch3: not an emu backend");
  return rda_emu_start(b, m, grid, block, smem_bytes, params, params_bytes, err);
}

static rda_status rda_emu_synchronize(rda_backend *b, rda_err *err) {
  return rda_emu_settle(b, err); /* synchronous: launches ran to completion */
}

/* Synchronous streams: stream-ordered work runs at once; events and streams are distinct
 * tokens that order nothing (every operation has completed by the time its call returns).
 * Asynchronous ones: runtime/emu_streams.h. */
static rda_status rda_emu_memset_async(rda_backend *b, void *dptr, int value, size_t bytes,
                                       rda_err *err) {
  rda_emu_impl *im = b->impl;
  if (bytes == 0) return RDA_OK;
  if (dptr == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: memset of %zu bytes at NULL", bytes);
  if (im->async != NULL) return rda_es_memset(im->async, dptr, value, bytes, err);
  memset(dptr, value, bytes);
  return RDA_OK;
}

static rda_status rda_emu_token(void **out, const char *what, rda_err *err) {
  *out = malloc(1);
  if (*out == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: no memory for %s", what);
  return RDA_OK;
}

/* An event: distinct memory; a timed one also keeps the host time of its last record. */
typedef struct rda_emu_event {
  int timed;
  int recorded;
  double at; /* CLOCK_MONOTONIC seconds of the last record */
} rda_emu_event;

static rda_status rda_emu_event_new(void **ev, int timed, rda_err *err) {
  rda_emu_event *e = calloc(1, sizeof *e);
  *ev = e;
  if (e == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: no memory for an event");
  e->timed = timed;
  return RDA_OK;
}

static rda_status rda_emu_event_create(rda_backend *b, void **ev, rda_err *err) {
  rda_emu_impl *im = b->impl;
  if (im->async != NULL) return rda_es_event_create(ev, 0, err);
  return rda_emu_event_new(ev, 0, err);
}

static rda_status rda_emu_event_create_timed(rda_backend *b, void **ev, rda_err *err) {
  rda_emu_impl *im = b->impl;
  if (im->async != NULL) return rda_es_event_create(ev, 1, err);
  return rda_emu_event_new(ev, 1, err);
}

static void rda_emu_event_destroy(rda_backend *b, void *ev) {
  rda_emu_impl *im = b->impl;
  if (im->async != NULL)
    rda_es_event_destroy(ev);
  else
    free(ev);
}

static rda_status rda_emu_stream_create(rda_backend *b, void **s, rda_err *err) {
  rda_emu_impl *im = b->impl;
  if (im->async != NULL) return rda_es_stream_create(im->async, s, err);
  return rda_emu_token(s, "a stream", err);
}

static void rda_emu_stream_destroy(rda_backend *b, void *s) {
  rda_emu_impl *im = b->impl;
  if (im->async != NULL)
    rda_es_stream_destroy(im->async, s);
  else
    free(s);
}

static rda_status rda_emu_stream_wait_event(rda_backend *b, void *ev, rda_err *err) {
  rda_emu_impl *im = b->impl;
  if (ev == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: NULL event");
  if (im->async != NULL) return rda_es_stream_wait_event(im->async, ev, err);
  return RDA_OK;
}

static rda_status rda_emu_event_query(rda_backend *b, void *ev, int *done, rda_err *err) {
  rda_emu_impl *im = b->impl;
  *done = 1;
  if (ev == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: NULL event");
  if (im->async != NULL) return rda_es_event_query(ev, done, err);
  return RDA_OK;
}

/* Synchronous: everything enqueued before the record has run by now, so the host clock is the
 * stream's. */
static rda_status rda_emu_event_record(rda_backend *b, void *ev, rda_err *err) {
  rda_emu_impl *im = b->impl;
  if (ev == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: NULL event");
  if (im->async != NULL) return rda_es_event_record(im->async, ev, err);
  rda_emu_event *e = ev;
  if (e->timed) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e->at = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  }
  e->recorded = 1;
  return RDA_OK;
}

static rda_status rda_emu_event_elapsed_ms(rda_backend *b, void *start, void *end, float *ms,
                                           rda_err *err) {
  rda_emu_impl *im = b->impl;
  if (im->async != NULL) return rda_es_event_elapsed_ms(start, end, ms, err);
  if (ms == NULL || start == NULL || end == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: elapsed time of a NULL event");
  *ms = 0.0f;
  const rda_emu_event *e0 = start, *e1 = end;
  if (!e0->timed || !e1->timed)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "emu: elapsed time of an event created without timing");
  if (!e0->recorded || !e1->recorded)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "emu: elapsed time of an event never recorded");
  *ms = (float)((e1->at - e0->at) * 1e3);
  return RDA_OK;
}

static void *rda_emu_set_stream(rda_backend *b, void *s) {
  rda_emu_impl *im = b->impl;
  return im->async != NULL ? rda_es_set_stream(im->async, s) : NULL;
}

static void rda_emu_destroy(rda_backend *b) {
  if (b == NULL) return;
  rda_emu_impl *im = b->impl;
  if (im != NULL) rda_es_close(im->async); /* its streams drain first */
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
  b->impl = im; /* from here a refusal is rda_emu_destroy(b) */
  rda_status st = RDA_OK;
  const char *cxx = getenv("RDA_EMU_CXX");
  const char *user = getenv("RDA_EMU_CXXFLAGS");
  const size_t ncxx =
      (size_t)snprintf(im->cxx, sizeof im->cxx, "%s", (cxx && cxx[0]) ? cxx : RDA_HOST_CXX);
  const size_t nextra =
      (size_t)snprintf(im->extra, sizeof im->extra, "%s %s", RDA_EMU_EXTRA_FLAGS, user ? user : "");
  if (ncxx >= sizeof im->cxx || nextra >= sizeof im->extra) { /* never cut a flag silently */
    const int flags = nextra >= sizeof im->extra;
    st = rda_err_set(
        err, RDA_ERR_INVALID_ARGUMENT, "%s: longer than %zu characters",
        flags ? "RDA_EMU_CXXFLAGS" : "RDA_EMU_CXX",
        flags ? sizeof im->extra - 2 - strlen(RDA_EMU_EXTRA_FLAGS) : sizeof im->cxx - 1);
    goto refused;
  }
  if (rda_emu_count_words(im->extra) > rda_emu_extra_room()) {
    st = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "RDA_EMU_CXXFLAGS: more than %d flags",
                     rda_emu_extra_room() - rda_emu_count_words(RDA_EMU_EXTRA_FLAGS));
    goto refused;
  }
  const char *threads = getenv("RDA_EMU_THREADS");
  if (threads != NULL && threads[0] != '\0') {
    char *end = NULL;
    const long n = strtol(threads, &end, 10);
    if (*end != '\0' || n < 0 || n > 4096) {
      st = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "RDA_EMU_THREADS='%s': must be a count from 0 (all cores) to 4096", threads);
      goto refused;
    }
    im->os_threads = (unsigned)n;
  }
  const char *order = getenv("RDA_EMU_ORDER");
  if (order != NULL && order[0] != '\0' && strcmp(order, "forward") != 0) {
    if (strcmp(order, "reverse") != 0) {
      st = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "RDA_EMU_ORDER='%s': must be forward (the default) or reverse", order);
      goto refused;
    }
    im->order = 1;
  }
  const char *streams = getenv("RDA_EMU_STREAMS");
  if (streams != NULL && streams[0] != '\0' && strcmp(streams, "sync") != 0) {
    st = strcmp(streams, "async") == 0
             ? rda_es_open(&im->async, b, rda_emu_run, err)
             : rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                           "RDA_EMU_STREAMS='%s': must be sync (the default) or async", streams);
    if (st != RDA_OK) goto refused;
  }
  b->name = "emu";
  b->arch = arch;
  b->alloc = rda_emu_alloc;
  b->free = rda_emu_free;
  b->upload = rda_emu_copy;
  b->download = rda_emu_copy;
  b->load = rda_emu_load;
  b->unload = rda_emu_unload;
  b->launch = rda_emu_launch1;
  b->synchronize = rda_emu_synchronize;
  b->memset_async = rda_emu_memset_async;
  b->copy_async = rda_emu_copy_async;
  b->event_create = rda_emu_event_create;
  b->event_destroy = rda_emu_event_destroy;
  b->event_record = rda_emu_event_record;
  b->stream_wait_event = rda_emu_stream_wait_event;
  b->event_query = rda_emu_event_query;
  b->event_create_timed = rda_emu_event_create_timed;
  b->event_elapsed_ms = rda_emu_event_elapsed_ms;
  b->stream_create = rda_emu_stream_create;
  b->stream_destroy = rda_emu_stream_destroy;
  b->set_stream = rda_emu_set_stream;
  b->destroy = rda_emu_destroy;
  *out = b;
  return RDA_OK;
refused:
  rda_emu_destroy(b);
  return st;
}
