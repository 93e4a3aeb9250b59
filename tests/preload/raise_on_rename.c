/* raise_on_rename.c — an LD_PRELOAD library for tests only (test_cli): a signal that arrives
 * while `rdagen emit` renames its bundle into place, at a known moment instead of a lucky one.
 * The first rename(3) of a temporary (`.rdagen-*.partial`) into the folder $RDA_TEST_RAISE_DIR
 * raises signal $RDA_TEST_RAISE_SIGNAL (a number), says so on standard error, and then
 * renames; every other rename passes straight through. Without both variables it does nothing.
 * rda_out_files_replace (runtime/out_files.c) calls rename through a pointer to libc's, which
 * resolves to this one when preloaded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int rename(const char *from, const char *to);

/* 1 when `to` is a name directly inside dir and `from` one of out_files.c's temporaries. */
static int rename_is_a_placing(const char *from, const char *to, const char *dir) {
  const size_t n = strlen(dir);
  if (n == 0 || strncmp(to, dir, n) != 0 || to[n] != '/' || strchr(to + n + 1, '/') != NULL)
    return 0;
  const char *base = strrchr(from, '/');
  base = base != NULL ? base + 1 : from;
  const size_t len = strlen(base), tail = sizeof ".partial" - 1;
  return len > tail && strncmp(base, ".rdagen-", 8) == 0 &&
         strcmp(base + len - tail, ".partial") == 0;
}

int rename(const char *from, const char *to) {
  static int (*real)(const char *, const char *);
  static int raised; /* emit renames on one thread, after its compile threads ended */
  if (real == NULL) {
    void *sym = dlsym(RTLD_NEXT, "rename");
    if (sym == NULL) abort();
    memcpy(&real, &sym, sizeof real); /* a function pointer from a void * (POSIX) */
  }
  const char *dir = getenv("RDA_TEST_RAISE_DIR"), *sig = getenv("RDA_TEST_RAISE_SIGNAL");
  if (!raised && dir != NULL && sig != NULL && rename_is_a_placing(from, to, dir)) {
    raised = 1;
    char line[4400];
    const int len = snprintf(line, sizeof line, "raise_on_rename: signal %d before renaming %s\n",
                             atoi(sig), to);
    if (len > 0) (void)!write(2, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
    raise(atoi(sig));
  }
  return real(from, to);
}
