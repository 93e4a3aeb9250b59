/* test_tuning_db.c — the user's tuning database file (runtime/tuning_db.h): where it is, what
 * reading refuses (never hanging on a FIFO, never cutting text at a NUL), the default place
 * being optional, atomic replacement that keeps links and permissions, and the writers' lock
 * (with another user's file in a sticky folder refused up front). */
#include "rda_test.h"
#include "tuning_db.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

typedef struct fixture {
  char *dir;
  char *saved_db, *saved_cache; /* the environment as the test found it */
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (f == NULL || (f->dir = rt_mkdtemp()) == NULL) return -1;
  f->saved_db = rt_env_save("RDA_TUNING_DB");
  f->saved_cache = rt_env_save("RDA_CACHE_DIR");
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  rt_env_restore("RDA_TUNING_DB", f->saved_db);
  rt_env_restore("RDA_CACHE_DIR", f->saved_cache);
  rt_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

/* Reading: a missing file is no database; a FIFO, a folder, a NUL byte or more than 16 MiB are
 * one RDA_ERR_IO line naming the path, and the FIFO fails at once instead of blocking. */
static void test_tuning_db_read_file_refuses_what_is_not_a_database(void **state) {
  fixture *f = *state;
  rda_err err = {0};
  char sentinel[] = "sentinel";
  char *text = sentinel;
  char *missing = rt_path(f->dir, "missing.lua");
  assert_int_equal(rda_tuning_db_read_file(missing, &text, &err), RDA_OK);
  assert_null(text);

  char *good = rt_path(f->dir, "good.lua");
  assert_true(rt_write_file(good, "return {}\n", 10));
  assert_int_equal(rda_tuning_db_read_file(good, &text, &err), RDA_OK);
  assert_string_equal(text, "return {}\n");
  free(text);

  char *fifo = rt_path(f->dir, "fifo.lua");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  const double t0 = rt_now_s();
  err = (rda_err){0};
  assert_int_equal(rda_tuning_db_read_file(fifo, &text, &err), RDA_ERR_IO);
  assert_true(rt_now_s() - t0 < 5.0);
  assert_non_null(strstr(err.msg, "not a regular file"));
  assert_non_null(strstr(err.msg, fifo));
  assert_null(text);

  err = (rda_err){0};
  assert_int_equal(rda_tuning_db_read_file(f->dir, &text, &err), RDA_ERR_IO);
  assert_null(text);

  char *nul = rt_path(f->dir, "nul.lua");
  assert_true(rt_write_file(nul, "return {}\0junk", 14));
  err = (rda_err){0};
  assert_int_equal(rda_tuning_db_read_file(nul, &text, &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, "NUL"));
  assert_null(text);

  char *big = rt_path(f->dir, "big.lua");
  const int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (16 << 20) + 1), 0);
  close(fd);
  err = (rda_err){0};
  assert_int_equal(rda_tuning_db_read_file(big, &text, &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, "allowed"));
  assert_null(text);
  free(missing), free(good), free(fifo), free(nul), free(big);
}

/* RDA_TUNING_DB names the database, and its troubles are errors; the default place (the cache
 * root) is optional: a cache root that is a regular file means no database, not an error. */
static void test_tuning_db_path_and_the_optional_default(void **state) {
  fixture *f = *state;
  rda_err err = {0};
  char path[4096], name[4096];
  char *text = NULL;
  char *mine = rt_path(f->dir, "mine.lua");
  setenv("RDA_TUNING_DB", mine, 1);
  assert_int_equal(rda_tuning_db_path(path, sizeof path, &err), RDA_OK);
  assert_string_equal(path, mine);
  assert_int_equal(rda_tuning_db_read(&text, name, sizeof name, &err), RDA_OK);
  assert_null(text);
  assert_string_equal(name, mine);
  assert_true(rt_write_file(mine, "return {}\n", 10));
  assert_int_equal(rda_tuning_db_read(&text, name, sizeof name, &err), RDA_OK);
  assert_string_equal(text, "return {}\n");
  free(text);
  text = NULL;
  setenv("RDA_TUNING_DB", f->dir, 1); /* a folder */
  err = (rda_err){0};
  assert_int_equal(rda_tuning_db_read(&text, name, sizeof name, &err), RDA_ERR_IO);
  assert_null(text);

  unsetenv("RDA_TUNING_DB");
  char *root = rt_path(f->dir, "cache");
  setenv("RDA_CACHE_DIR", root, 1);
  assert_int_equal(rda_tuning_db_path(path, sizeof path, &err), RDA_OK);
  char *want = rt_path(root, "tuning.lua");
  assert_string_equal(path, want);
  assert_false(rt_exists(root)); /* resolving creates nothing */
  assert_int_equal(rda_tuning_db_read(&text, name, sizeof name, &err), RDA_OK);
  assert_null(text);
  /* A database there that cannot be read is an error as anywhere else. */
  assert_int_equal(mkdir(root, 0700), 0);
  assert_true(rt_write_file(want, "return {}\0", 10));
  err = (rda_err){0};
  assert_int_equal(rda_tuning_db_read(&text, name, sizeof name, &err), RDA_ERR_IO);
  assert_null(text);
  assert_non_null(strstr(err.msg, want));
  rt_rmtree(root);
  assert_true(rt_write_file(root, "a file", 6)); /* the cache root is a file */
  err = (rda_err){0};
  assert_int_equal(rda_tuning_db_read(&text, name, sizeof name, &err), RDA_OK);
  assert_null(text);
  assert_string_equal(name, "");
  free(mine), free(root), free(want);
}

/* Writing creates a missing cache root but no folder the user named (a typo would build a
 * tree), replaces the content whole, leaves no temporary file, keeps the old file's
 * permissions, and through a symbolic link replaces the file it names while the link stays a
 * link. */
static void test_tuning_db_write_replaces_atomically_and_keeps_links_and_modes(void **state) {
  fixture *f = *state;
  rda_err err = {0};
  char *sub = rt_path(f->dir, "a/b");
  char *db = rt_path(sub, "tuning.lua");
  assert_int_equal(rda_tuning_db_write(db, "return {}\n", &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, "does not exist"));
  assert_non_null(strstr(err.msg, sub));
  rda_tuning_lock lk = RDA_TUNING_LOCK_INIT;
  err = (rda_err){0};
  assert_int_equal(rda_tuning_db_lock(db, &lk, &err), RDA_ERR_IO);
  assert_false(rt_exists(sub));
  char *root = rt_path(f->dir, "fresh/cache");
  char *in_root = rt_path(root, "tuning.lua");
  setenv("RDA_CACHE_DIR", root, 1);
  assert_int_equal(rda_tuning_db_lock(in_root, &lk, &err), RDA_OK);
  assert_int_equal(rda_tuning_db_write(in_root, "return {}\n", &err), RDA_OK);
  rda_tuning_db_unlock(&lk);
  assert_true(rt_exists(in_root));
  unsetenv("RDA_CACHE_DIR");
  free(root), free(in_root);
  char *a = rt_path(f->dir, "a");
  assert_int_equal(mkdir(a, 0700), 0);
  assert_int_equal(mkdir(sub, 0700), 0);
  free(a);
  assert_int_equal(rda_tuning_db_write(db, "return { -- one\n}\n", &err), RDA_OK);
  size_t len = 0;
  char *got = rt_read_file(db, &len);
  assert_string_equal(got, "return { -- one\n}\n");
  free(got);
  assert_int_equal(chmod(db, 0640), 0);
  assert_int_equal(rda_tuning_db_write(db, "return {}\n", &err), RDA_OK);
  got = rt_read_file(db, &len);
  assert_string_equal(got, "return {}\n");
  free(got);
  struct stat st;
  assert_int_equal(stat(db, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0640);
  assert_int_equal(rt_count_entries(sub), 1); /* no temporary file left beside it */

  char *link = rt_path(f->dir, "link.lua");
  assert_int_equal(symlink(db, link), 0);
  assert_int_equal(rda_tuning_db_write(link, "return { }\n", &err), RDA_OK);
  assert_int_equal(lstat(link, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  got = rt_read_file(db, &len);
  assert_string_equal(got, "return { }\n");
  free(got);

  /* Dangling links, absolute and relative: the file they point to is created, links kept. */
  char *abs_target = rt_path(f->dir, "a/new-abs.lua"), *abs_link = rt_path(f->dir, "abs.lua");
  char *rel_link = rt_path(f->dir, "a/rel.lua"), *rel_target = rt_path(f->dir, "a/new-rel.lua");
  assert_int_equal(symlink(abs_target, abs_link), 0);
  assert_int_equal(symlink("new-rel.lua", rel_link), 0); /* relative to its own folder */
  assert_int_equal(rda_tuning_db_write(abs_link, "return {}\n", &err), RDA_OK);
  assert_int_equal(rda_tuning_db_write(rel_link, "return {}\n", &err), RDA_OK);
  assert_true(rt_exists(abs_target) && rt_exists(rel_target));
  assert_int_equal(lstat(abs_link, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  assert_int_equal(lstat(rel_link, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  free(abs_target), free(abs_link), free(rel_link), free(rel_target);

  /* A chain of 20 links (the kernel follows up to 40) is followed to its end. */
  char prev[4096];
  snprintf(prev, sizeof prev, "%s", db);
  for (int i = 0; i < 20; i++) {
    char name[32];
    snprintf(name, sizeof name, "chain%02d.lua", i);
    char *next = rt_path(f->dir, name);
    assert_int_equal(symlink(prev, next), 0);
    snprintf(prev, sizeof prev, "%s", next);
    free(next);
  }
  assert_int_equal(rda_tuning_db_write(prev, "return {  }\n", &err), RDA_OK);
  got = rt_read_file(db, &len);
  assert_string_equal(got, "return {  }\n");
  free(got);

  /* A link to a folder: refused before anything is created beside the folder. */
  char *dirlink = rt_path(f->dir, "dirlink.lua"), *stray = rt_path(f->dir, "a/b.lock");
  assert_int_equal(symlink(sub, dirlink), 0);
  rda_tuning_lock refused = RDA_TUNING_LOCK_INIT;
  err = (rda_err){0};
  assert_int_equal(rda_tuning_db_lock(dirlink, &refused, &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, "a folder"));
  assert_int_equal(refused.fd, -1);
  assert_false(rt_exists(stray));
  free(dirlink), free(stray);

  /* A folder where the file should go: an error naming the path, the folder untouched. */
  err = (rda_err){0};
  assert_int_equal(rda_tuning_db_write(sub, "return {}\n", &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, sub));
  assert_int_equal(stat(db, &st), 0);
  free(sub), free(db), free(link);
}

/* 1 once /proc/locks lists process pid as blocked on a flock ("->"), within limit_s seconds. */
static int blocked_on_flock(pid_t pid, double limit_s) {
  for (const double t0 = rt_now_s(); rt_now_s() - t0 < limit_s; usleep(5 * 1000)) {
    FILE *f = fopen("/proc/locks", "r");
    if (f == NULL) return 0;
    char line[256];
    int seen = 0;
    while (!seen && fgets(line, sizeof line, f) != NULL) {
      const char *arrow = strstr(line, "-> FLOCK");
      int who = 0;
      seen = arrow != NULL && sscanf(arrow, "-> FLOCK %*s %*s %d", &who) == 1 && who == pid;
    }
    fclose(f);
    if (seen) return 1;
  }
  return 0;
}

/* The writers' lock excludes another process until it is released, and its file is gone once
 * the last holder lets go. The holder lets go only once the other process is seen blocked on
 * the lock: a nap instead would let a process the machine starts late find it free. */
static void test_tuning_db_lock_excludes_another_writer(void **state) {
  fixture *f = *state;
  if (access("/proc/locks", R_OK) != 0) {
    print_message("no readable /proc/locks here: cannot see a process blocked on a lock\n");
    skip();
  }
  rda_err err = {0};
  char *db = rt_path(f->dir, "locked/tuning.lua");
  char *lock = rt_path(f->dir, "locked/tuning.lua.lock");
  char *folder = rt_path(f->dir, "locked");
  assert_int_equal(mkdir(folder, 0700), 0);
  free(folder);
  rda_tuning_lock lk = RDA_TUNING_LOCK_INIT;
  assert_int_equal(rda_tuning_db_lock(db, &lk, &err), RDA_OK);
  assert_true(lk.fd >= 0);
  assert_true(rt_exists(lock));
  int pipefd[2];
  assert_int_equal(pipe(pipefd), 0);
  const pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    close(pipefd[0]);
    rda_tuning_lock clk = RDA_TUNING_LOCK_INIT;
    rda_err cerr = {0};
    const int ok = rda_tuning_db_lock(db, &clk, &cerr) == RDA_OK;
    /* Its lock is on the file that is there now, not the one the parent removed. */
    struct stat held, named;
    const int same = ok && fstat(clk.fd, &held) == 0 && stat(clk.path, &named) == 0 &&
                     held.st_ino == named.st_ino;
    rda_tuning_db_unlock(&clk);
    const char c = ok && same ? 'y' : 'n';
    if (write(pipefd[1], &c, 1) != 1) _exit(2);
    _exit(0);
  }
  close(pipefd[1]);
  const int excluded = blocked_on_flock(child, 30.0);
  rda_tuning_db_unlock(&lk);
  assert_int_equal(lk.fd, -1);
  char c = 0;
  assert_int_equal(read(pipefd[0], &c, 1), 1);
  close(pipefd[0]);
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_true(excluded);    /* it waited for the release, */
  assert_int_equal(c, 'y'); /* then got the lock */
  assert_false(rt_exists(lock)); /* nothing left beside the database */
  rda_tuning_db_unlock(&lk);    /* a lock not held: accepted */
  rda_tuning_db_unlock(NULL);

  /* A link and its target share one lock: it is taken beside the file the link names. */
  char *link = rt_path(f->dir, "link.lua"), *link_lock = rt_path(f->dir, "link.lua.lock");
  assert_int_equal(symlink(db, link), 0);
  assert_int_equal(rda_tuning_db_lock(link, &lk, &err), RDA_OK);
  assert_true(rt_exists(lock));
  assert_false(rt_exists(link_lock));
  rda_tuning_db_unlock(&lk);
  assert_false(rt_exists(lock));
  free(db), free(link), free(lock), free(link_lock);
}

/* A folder with the sticky bit (/tmp) lets only the file's owner, the folder's owner or root
 * replace a file in it: the writers' lock refuses another user's database there at once (not
 * after a long tune, when the rename would fail), and takes one's own. Run as another user in
 * a child, so it needs root to set up; skipped otherwise. */
static void test_tuning_db_lock_refuses_another_users_file_in_a_sticky_folder(void **state) {
  fixture *f = *state;
  if (geteuid() != 0) {
    print_message("skipped: needs root to act as two users\n");
    skip();
  }
  const uid_t other = 65534, owner = 65533; /* nobody, and one more unprivileged uid */
  assert_int_equal(chmod(f->dir, 0755), 0);
  char *folder = rt_path(f->dir, "sticky");
  char *theirs = rt_path(f->dir, "sticky/theirs.lua"), *mine = rt_path(f->dir, "sticky/mine.lua");
  char *tmp = rt_path(f->dir, "sticky/new.lua");
  assert_int_equal(mkdir(folder, 0700), 0);
  assert_int_equal(chmod(folder, 01777), 0);
  static const char body[] = "return { version = 1, entries = {} }\n";
  assert_true(rt_write_file(theirs, body, sizeof body - 1));
  assert_true(rt_write_file(mine, body, sizeof body - 1));
  assert_int_equal(chown(theirs, other, other), 0);
  assert_int_equal(chown(mine, owner, owner), 0);
  const pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    if (setgid(owner) != 0 || setuid(owner) != 0) _exit(10);
    int bad = 0;
    rda_tuning_lock lk = RDA_TUNING_LOCK_INIT;
    rda_err err = {0};
    /* The premise: the rename onto their file is refused by the kernel. */
    if (!rt_write_file(tmp, body, sizeof body - 1)) _exit(11);
    if (rename(tmp, theirs) == 0 || errno != EPERM) bad |= 1;
    unlink(tmp);
    if (rda_tuning_db_lock(theirs, &lk, &err) != RDA_ERR_IO ||
        strstr(err.msg, "belongs to another user (uid 65534)") == NULL || lk.fd != -1)
      bad |= 2;
    rda_err ok = {0};
    if (rda_tuning_db_lock(mine, &lk, &ok) != RDA_OK) bad |= 4;
    rda_tuning_db_unlock(&lk);
    _exit(bad);
  }
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) != 0)
    fail_msg("child as uid %u: failures 0x%x", (unsigned)owner, WEXITSTATUS(status));
  /* Root may replace anything, so the same call here takes the lock. */
  rda_tuning_lock lk = RDA_TUNING_LOCK_INIT;
  rda_err err = {0};
  assert_int_equal(rda_tuning_db_lock(theirs, &lk, &err), RDA_OK);
  rda_tuning_db_unlock(&lk);
  free(folder), free(theirs), free(mine), free(tmp);
}

/* A text no read would take (over 16 MiB) is never written: the old file stays. The temporary
 * name a signal handler removes is the one a write of this process uses. */
static void test_tuning_db_write_refuses_what_no_read_takes(void **state) {
  fixture *f = *state;
  char *db = rt_path(f->dir, "big.lua");
  static const char old[] = "return {}\n";
  assert_true(rt_write_file(db, old, sizeof old - 1));
  const size_t n = (16u << 20) + 1;
  char *text = malloc(n + 1);
  assert_non_null(text);
  memset(text, ' ', n);
  memcpy(text, "return {}", 9);
  text[n] = '\0';
  rda_err err = {0};
  assert_int_equal(rda_tuning_db_write(db, text, &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, "more than the 16777216"));
  size_t len = 0;
  char *now = rt_read_file(db, &len);
  assert_int_equal(len, sizeof old - 1);
  assert_memory_equal(now, old, len);
  free(now);
  text[n - 1] = '\0'; /* 16 MiB exactly: written */
  assert_int_equal(rda_tuning_db_write(db, text, &err), RDA_OK);
  free(text);

  rda_tuning_lock lk = RDA_TUNING_LOCK_INIT;
  assert_int_equal(rda_tuning_db_lock(db, &lk, &err), RDA_OK);
  char tmp[4200], want[4200];
  assert_true(rda_tuning_db_temp_name(&lk, tmp, sizeof tmp));
  snprintf(want, sizeof want, "%s.tmp.%ld", db, (long)getpid());
  assert_string_equal(tmp, want);
  rda_tuning_db_unlock(&lk);
  free(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_tuning_db_read_file_refuses_what_is_not_a_database,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_tuning_db_path_and_the_optional_default, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_tuning_db_write_replaces_atomically_and_keeps_links_and_modes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_tuning_db_lock_excludes_another_writer, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_tuning_db_lock_refuses_another_users_file_in_a_sticky_folder, setup, teardown),
      cmocka_unit_test_setup_teardown(test_tuning_db_write_refuses_what_no_read_takes, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
