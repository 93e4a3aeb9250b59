/* tuning_db.c — the user's tuning database file: its path ($RDA_TUNING_DB, else tuning.lua in
 * the cache root), reading it whole, and replacing it by write-to-temporary, fsync, rename. */
#include "tuning_db.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
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
  rda_err ignored;
  if (rda_tuning_db_path(path, sizeof path, rda_tuning_db_env() != NULL ? err : &ignored) !=
      RDA_OK) {
    if (rda_tuning_db_env() != NULL) return err->status;
    return RDA_OK; /* no cache root: no user database */
  }
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

rda_status rda_tuning_db_write(const char *path, const char *text, rda_err *err) {
  char tmp[4200];
  const int len = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  if (len < 0 || (size_t)len >= sizeof tmp)
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': path too long", path);
  const char *slash = strrchr(path, '/');
  if (slash != NULL && slash != path) { /* a fresh cache root: its folder may not exist yet */
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    struct stat st;
    if (stat(dir, &st) != 0) RDA_TRY(rda_cache_dir_mkdirs(dir, err));
  }
  const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': cannot create '%s': %s", path, tmp,
                       strerror(errno));
  const int wrote = rda_tuning_db_write_all(fd, text, strlen(text)) == RDA_OK;
  const int saved = errno;
  const int synced = wrote && fsync(fd) == 0;
  const int closed = close(fd) == 0;
  if (!wrote || !synced || !closed) {
    unlink(tmp);
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': writing '%s': %s", path, tmp,
                       strerror(!wrote ? saved : errno));
  }
  if (rename(tmp, path) != 0) {
    const int e = errno;
    unlink(tmp);
    return rda_err_set(err, RDA_ERR_IO, "tuning database '%s': rename: %s", path, strerror(e));
  }
  return RDA_OK;
}
