/* tuning_db.c — the user's tuning database file: its path ($RDA_TUNING_DB, else tuning.lua in
 * the cache root), reading it whole, and replacing it by write-to-temporary, fsync, rename. */
#include "tuning_db.h"

#include "out_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_dir.h"

#define RDA_TUNING_DB_MAX_BYTES (16 << 20)

static const char *rda_tuning_db_env(void) {
  const char *p = getenv("RDA_TUNING_DB");
  return p != NULL && p[0] != '\0' ? p : NULL;
}

rda_status rda_tuning_db_path(char *out, size_t cap, rda_err *err) {
  const char *env = rda_tuning_db_env();
  if (env == NULL) return rda_cache_dir_path("tuning.lua", out, cap, err);
  const int len = snprintf(out, cap, "%s", env);
  if (len < 0 || (size_t)len >= cap)
    return rda_err_set(err, RDA_ERR_IO, "RDA_TUNING_DB: path too long");
  return RDA_OK;
}

rda_status rda_tuning_db_read_file(const char *path, char **text, rda_err *err) {
  *text = NULL;
  /* O_NONBLOCK: a FIFO or device named here must fail the regular-file check below, not hang
   * the open (the flag does nothing to a regular file's reads). */
  const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return RDA_OK;
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': %s", path, strerror(errno));
  }
  struct stat st;
  rda_status s = RDA_OK;
  char *buf = NULL;
  if (fstat(fd, &st) != 0) {
    s = rda_err_set(err, RDA_ERR_IO, "tuning database '%s': %s", path, strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    s = rda_err_set(err, RDA_ERR_IO, "tuning database '%s': not a regular file", path);
  } else if (st.st_size > RDA_TUNING_DB_MAX_BYTES) {
    s = rda_err_set(err, RDA_ERR_IO, "tuning database '%s': %lld bytes, more than the %d allowed",
                    path, (long long)st.st_size, RDA_TUNING_DB_MAX_BYTES);
  } else if ((buf = malloc((size_t)st.st_size + 1)) == NULL) {
    s = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "tuning database '%s': out of memory", path);
  } else {
    size_t got = 0;
    while (got < (size_t)st.st_size) {
      const ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        s = rda_err_set(err, RDA_ERR_IO, "tuning database '%s': read: %s", path, strerror(errno));
        break;
      }
      if (r == 0) break; /* shrank while reading: take what is there */
      got += (size_t)r;
    }
    buf[got] = '\0';
    /* The text goes to Lua as a C string: a NUL would silently cut it short. */
    if (s == RDA_OK && memchr(buf, '\0', got) != NULL)
      s = rda_err_set(err, RDA_ERR_IO, "tuning database '%s': contains a NUL byte: not a text file",
                      path);
  }
  close(fd);
  if (s != RDA_OK) {
    free(buf);
    return s;
  }
  *text = buf;
  return RDA_OK;
}

rda_status rda_tuning_db_read(char **text, char *name, size_t name_cap, rda_err *err) {
  *text = NULL;
  if (name_cap > 0) name[0] = '\0';
  char path[4096];
  if (rda_tuning_db_env() != NULL) {
    RDA_TRY(rda_tuning_db_path(path, sizeof path, err));
    if (name_cap > 0) snprintf(name, name_cap, "%s", path);
    return rda_tuning_db_read_file(path, text, err);
  }
  /* The default place is a convenience: when it cannot be reached (no cache root, a cache
   * root that is a file, nothing there), there is no user database. A file that is there but
   * cannot be read, or does not load or check, is an error as anywhere else. */
  rda_err ignored = {0};
  if (rda_tuning_db_path(path, sizeof path, &ignored) != RDA_OK) return RDA_OK;
  struct stat st;
  if (stat(path, &st) != 0 && (errno == ENOENT || errno == ENOTDIR)) return RDA_OK;
  if (name_cap > 0) snprintf(name, name_cap, "%s", path);
  return rda_tuning_db_read_file(path, text, err);
}

static rda_status rda_tuning_db_write_all(int fd, const char *text, size_t len) {
  size_t done = 0;
  while (done < len) {
    const ssize_t w = write(fd, text + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return RDA_ERR_IO;
    done += (size_t)w;
  }
  return RDA_OK;
}

/* Creates path's folder when it is missing and is the cache root (a fresh cache). A folder
 * the user named (--db, RDA_TUNING_DB) must be there: a typo in it would quietly build a tree. */
static rda_status rda_tuning_db_parent(const char *path, rda_err *err) {
  const char *slash = strrchr(path, '/');
  if (slash == NULL || slash == path) return RDA_OK;
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path) >= (int)sizeof dir)
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': path too long", path);
  struct stat st;
  if (stat(dir, &st) == 0) return RDA_OK;
  const int e = errno;
  char root[4096]; /* the cache root: the folder of the default database */
  rda_err ignored = {0};
  char *cut = NULL;
  if (rda_cache_dir_path("tuning.lua", root, sizeof root, &ignored) == RDA_OK)
    cut = strrchr(root, '/');
  if (cut != NULL) *cut = '\0';
  if (cut == NULL || strcmp(root, dir) != 0)
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': folder '%s' %s", path, dir,
                       e == ENOENT ? "does not exist (only the cache folder is made when missing)"
                                   : strerror(e));
  rda_err why = {0};
  if (rda_cache_dir_mkdirs(dir, &why) != RDA_OK)
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': %s", path, why.msg);
  return RDA_OK;
}

/* The file `path` names, its symbolic links followed (relative ones against their own folder;
 * a dangling one to where it points, which writing creates): where a database is replaced and
 * locked, however it is reached. */
static rda_status rda_tuning_db_target(const char *path, char *out, size_t cap, rda_err *err) {
  rda_err why = {0};
  if (rda_path_follow_links(path, out, cap, &why) != RDA_OK) {
    /* why.msg is "<path>: <what>"; said here in this file's words. */
    const size_t n = strlen(path);
    const char *what = strncmp(why.msg, path, n) == 0 && strncmp(why.msg + n, ": ", 2) == 0
                           ? why.msg + n + 2
                           : why.msg;
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': %s", path, what);
  }
  struct stat st;
  if (lstat(out, &st) == 0 && S_ISDIR(st.st_mode))
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': a folder, not a file", path);
  return RDA_OK;
}

/* The temporary file beside target that a write of this process goes through. */
static int rda_tuning_db_tmp(const char *target, char *out, size_t cap) {
  const int len = snprintf(out, cap, "%s.tmp.%ld", target, (long)getpid());
  return len >= 0 && (size_t)len < cap;
}

int rda_tuning_db_temp_name(const rda_tuning_lock *lk, char *out, size_t cap) {
  const size_t n = strlen(lk->path);
  if (n < 5 || strcmp(lk->path + n - 5, ".lock") != 0 || n - 5 >= cap) return 0;
  char target[sizeof lk->path];
  memcpy(target, lk->path, n - 5);
  target[n - 5] = '\0';
  return rda_tuning_db_tmp(target, out, cap);
}

rda_status rda_tuning_db_write(const char *path, const char *text, rda_err *err) {
  /* Never a file that every later read refuses: the limit holds for what is written too. */
  const size_t bytes = strlen(text);
  if (bytes > RDA_TUNING_DB_MAX_BYTES)
    return rda_err_set(err, RDA_ERR_IO,
                       "tuning database '%s': the new text is %zu bytes, more than the %d a "
                       "database may hold: nothing written (use another file, or remove entries)",
                       path, bytes, RDA_TUNING_DB_MAX_BYTES);
  /* A database reached through a symbolic link is replaced where it lives, keeping the link. */
  char target[4096];
  RDA_TRY(rda_tuning_db_target(path, target, sizeof target, err));
  char tmp[4200];
  if (!rda_tuning_db_tmp(target, tmp, sizeof tmp))
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': path too long", path);
  RDA_TRY(rda_tuning_db_parent(target, err));
  /* The old file's permissions carry over; a new one gets 0644 less the umask. */
  struct stat old;
  const int existed = stat(target, &old) == 0;
  /* Created no wider than the file it replaces, so a private database is never readable by
   * others, not even for a moment. */
  const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                      existed ? (old.st_mode & 0777) : 0644);
  if (fd < 0)
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': cannot create '%s': %s", path, tmp,
                       strerror(errno));
  const int wrote = rda_tuning_db_write_all(fd, text, bytes) == RDA_OK;
  const int saved = errno;
  const int moded = !wrote || !existed || fchmod(fd, old.st_mode & 07777) == 0;
  const int synced = wrote && moded && fsync(fd) == 0;
  const int closed = close(fd) == 0;
  if (!wrote || !synced || !closed) {
    unlink(tmp);
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': writing '%s': %s", path, tmp,
                       strerror(!wrote ? saved : errno));
  }
  if (rename(tmp, target) != 0) {
    const int e = errno;
    unlink(tmp);
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': rename: %s", path, strerror(e));
  }
  rda_path_sync_folder(target); /* the rename survives a crash once its folder is flushed */
  return RDA_OK;
}

/* RDA_ERR_IO when the rename of a new file onto target (which exists) would be refused: a
 * folder with the sticky bit lets only the file's owner, the folder's owner or root replace it. */
static rda_status rda_tuning_db_replaceable(const char *path, const char *target, rda_err *err) {
  char folder[4200];
  snprintf(folder, sizeof folder, "%s", target);
  char *slash = strrchr(folder, '/');
  if (slash == NULL)
    snprintf(folder, sizeof folder, ".");
  else if (slash == folder)
    folder[1] = '\0';
  else
    *slash = '\0';
  struct stat f, d;
  const uid_t me = geteuid();
  if (me == 0 || stat(target, &f) != 0 || stat(folder, &d) != 0 || !(d.st_mode & S_ISVTX) ||
      f.st_uid == me || d.st_uid == me)
    return RDA_OK;
  return rda_err_set(err, RDA_ERR_IO,
                     "tuning database '%s': it belongs to another user (uid %u) in a folder with "
                     "the sticky bit, so it cannot be replaced: use another file (--db or "
                     "RDA_TUNING_DB)",
                     path, (unsigned)f.st_uid);
}

rda_status rda_tuning_db_lock(const char *path, rda_tuning_lock *lk, rda_err *err) {
  lk->fd = -1;
  lk->path[0] = '\0';
  char target[4096];
  RDA_TRY(rda_tuning_db_target(path, target, sizeof target, err));
  char lock[sizeof lk->path];
  if (snprintf(lock, sizeof lock, "%s.lock", target) >= (int)sizeof lock)
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': path too long", path);
  RDA_TRY(rda_tuning_db_parent(target, err)); /* the lock lives beside it: one folder */
  for (;;) {
    /* Read-only is enough for flock, and opens a lock file another user left behind (a
     * killed tune cannot remove it) where read-write would be refused. */
    const int l = open(lock, O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
    if (l < 0)
      return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': lock '%s': %s", path, lock,
                         strerror(errno));
    int got;
    while ((got = flock(l, LOCK_EX)) != 0 && errno == EINTR) {
    }
    if (got != 0) {
      const int e = errno;
      close(l);
      return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': lock '%s': %s", path, lock,
                         strerror(e));
    }
    /* The holder before removed the file as it let go: a lock on that removed file excludes
     * no one who opens the name now, so take the lock again on whatever is there. */
    struct stat held, named;
    if (fstat(l, &held) == 0 && stat(lock, &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino) {
      lk->fd = l;
      memcpy(lk->path, lock, sizeof lock);
      /* A writer finds out now, not after a long tune, that the rename cannot replace the
       * file: another user's file in a sticky folder (/tmp) is theirs to replace. */
      const rda_status s = rda_tuning_db_replaceable(path, target, err);
      if (s != RDA_OK) rda_tuning_db_unlock(lk);
      return s;
    }
    close(l);
  }
}

void rda_tuning_db_unlock(rda_tuning_lock *lk) {
  if (lk == NULL || lk->fd < 0) return;
  /* Removed while still held, so the name never outlives the lock (nothing is left beside the
   * database); a waiter on the removed file sees that and locks afresh. */
  (void)unlink(lk->path);
  (void)flock(lk->fd, LOCK_UN);
  close(lk->fd);
  lk->fd = -1;
}
