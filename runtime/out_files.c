/* out_files.c — output files a command replaces: links followed, only regular files written
 * over, identity by device and inode, and a set of files replaced all or nothing (temporaries,
 * hard-linked backups, renames undone on failure). */
#include "out_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

rda_status rda_out_write_all(int fd, const char *path, const void *data, size_t len, rda_err *err) {
  const unsigned char *p = data;
  while (len > 0) {
    const ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return rda_err_set(err, RDA_ERR_IO, "%s: write failed: %s", path,
                         w < 0 ? strerror(errno) : "nothing written");
    p += w;
    len -= (size_t)w;
  }
  return RDA_OK;
}

rda_status rda_out_write_bytes(int fd, const char *path, const void *ctx, rda_err *err) {
  const rda_out_bytes *b = ctx;
  return rda_out_write_all(fd, path, b->data, b->len, err);
}

rda_status rda_path_follow_links(const char *path, char *out, size_t cap, rda_err *err) {
  char cur[4096], text[4096], next[4096];
  if (snprintf(cur, sizeof cur, "%s", path) >= (int)sizeof cur)
    return rda_err_set(err, RDA_ERR_IO, "%s: path too long", path);
  for (int hops = 0; hops <= 40; hops++) { /* 40: the kernel's MAXSYMLINKS */
    struct stat st;
    if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) {
      if (snprintf(out, cap, "%s", cur) >= (int)cap)
        return rda_err_set(err, RDA_ERR_IO, "%s: path too long", path);
      return RDA_OK;
    }
    const ssize_t n = readlink(cur, text, sizeof text - 1);
    if (n < 0) return rda_err_set(err, RDA_ERR_IO, "%s: readlink: %s", path, strerror(errno));
    text[n] = '\0';
    /* Relative link text is relative to the folder holding the link. */
    const char *slash = strrchr(cur, '/');
    int len;
    if (text[0] == '/' || slash == NULL)
      len = snprintf(next, sizeof next, "%s", text);
    else
      len = snprintf(next, sizeof next, "%.*s/%s", (int)(slash - cur), cur, text);
    if (len < 0 || (size_t)len >= sizeof next)
      return rda_err_set(err, RDA_ERR_IO, "%s: path too long", path);
    memcpy(cur, next, (size_t)len + 1);
  }
  return rda_err_set(err, RDA_ERR_IO, "%s: too many levels of symbolic links", path);
}

static const char *rda_out_files_kind(mode_t m) {
  if (S_ISDIR(m)) return "a folder";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

rda_status rda_out_file_check(const char *path, rda_out_file *f, rda_err *err) {
  memset(f, 0, sizeof *f);
  f->path = path;
  RDA_TRY(rda_path_follow_links(path, f->target, sizeof f->target, err));
  const char *slash = strrchr(f->target, '/');
  f->base = slash != NULL ? (size_t)(slash - f->target) + 1 : 0;
  struct stat st;
  if (lstat(f->target, &st) == 0) {
    if (!S_ISREG(st.st_mode))
      return rda_err_set(err, RDA_ERR_IO,
                         "%s: cannot write the output: it is %s; only a regular file (or a new "
                         "name) can be written",
                         path, rda_out_files_kind(st.st_mode));
    f->exists = 1;
    f->dev = st.st_dev;
    f->ino = st.st_ino;
  }
  char dir[4096];
  if (slash == NULL)
    snprintf(dir, sizeof dir, ".");
  else
    snprintf(dir, sizeof dir, "%.*s", slash == f->target ? 1 : (int)(slash - f->target),
             f->target);
  if (stat(dir, &st) != 0)
    return rda_err_set(err, RDA_ERR_IO, "%s: cannot write the output: folder '%s' does not exist",
                       path, dir);
  if (!S_ISDIR(st.st_mode))
    return rda_err_set(err, RDA_ERR_IO, "%s: cannot write the output: '%s' is not a folder", path,
                       dir);
  if (access(dir, W_OK | X_OK) != 0)
    return rda_err_set(err, RDA_ERR_IO, "%s: cannot write the output: folder '%s' is not writable",
                       path, dir);
  if (!f->exists) { /* a new file: known by its folder and name */
    f->dev = st.st_dev;
    f->ino = st.st_ino;
  }
  return RDA_OK;
}

int rda_out_file_same(const rda_out_file *a, const rda_out_file *b) {
  if (a->exists != b->exists || a->dev != b->dev || a->ino != b->ino) return 0;
  return a->exists || strcmp(a->target + a->base, b->target + b->base) == 0;
}

int rda_out_file_is(const rda_out_file *f, const struct stat *st) {
  return f->exists && f->dev == st->st_dev && f->ino == st->st_ino;
}

/* --- replacing a set ------------------------------------------------------------------------ */

typedef struct rda_out_slot {
  char tmp[4200], backup[4200];
  int have_tmp, have_backup, placed, no_link;
} rda_out_slot;

/* `.rdagen-<pid>-<k><tag>` in f's folder (k counting up each call): short, whatever the
 * target's name, so a name near the file system's limit can still be replaced. */
static void rda_out_files_side_name(const rda_out_file *f, const char *tag, char *name,
                                    size_t cap) {
  static atomic_uint counter;
  snprintf(name, cap, "%.*s.rdagen-%ld-%u%s", (int)f->base, f->target, (long)getpid(),
           atomic_fetch_add(&counter, 1u), tag);
}

/* Create a new file beside f's target (rda_out_files_side_name, tag ".partial"); returns the
 * fd, or -1 with errno set. */
static int rda_out_files_create(const rda_out_file *f, char *name, size_t cap, mode_t mode) {
  for (int attempt = 0; attempt < 100; attempt++) {
    rda_out_files_side_name(f, ".partial", name, cap);
    const int fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

/* A hard link to f's target beside it (tag ".old"); 0, or -1 with errno set. */
static int rda_out_files_backup(const rda_out_file *f, char *name, size_t cap) {
  for (int attempt = 0; attempt < 100; attempt++) {
    rda_out_files_side_name(f, ".old", name, cap);
    if (link(f->target, name) == 0) return 0;
    if (errno != EEXIST) return -1;
  }
  errno = EEXIST;
  return -1;
}

void rda_path_sync_folder(const char *target) {
  char dir[4096] = ".";
  const char *slash = strrchr(target, '/');
  if (slash == target)
    snprintf(dir, sizeof dir, "/");
  else if (slash != NULL)
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - target), target);
  const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
}

/* Add to the recorded message (a failure while undoing one). */
static void rda_out_files_append(rda_err *err, const char *text) {
  if (err == NULL) return;
  const size_t len = strlen(err->msg);
  if (len + 1 >= sizeof err->msg) return;
  size_t add = strlen(text);
  if (add > sizeof err->msg - len - 1) add = sizeof err->msg - len - 1; /* cut short */
  memcpy(err->msg + len, text, add);
  err->msg[len + add] = '\0';
}

/* Step 1 for one job: its content in a complete, flushed temporary. */
static rda_status rda_out_files_stage(const rda_out_job *job, rda_out_slot *s, rda_err *err) {
  const rda_out_file *f = job->file;
  struct stat old;
  const int keep_mode = f->exists && stat(f->target, &old) == 0;
  /* Created no wider than the file it replaces: a private output never readable by others. */
  const int fd = rda_out_files_create(f, s->tmp, sizeof s->tmp,
                                      keep_mode ? (old.st_mode & 0777) : 0666);
  if (fd < 0)
    return rda_err_set(err, RDA_ERR_IO, "%s: cannot create the output: %s", f->path,
                       strerror(errno));
  s->have_tmp = 1;
  rda_status st = job->write(fd, f->path, job->ctx, err);
  if (st == RDA_OK && keep_mode && fchmod(fd, old.st_mode & 07777) != 0)
    st = rda_err_set(err, RDA_ERR_IO, "%s: cannot set the permissions: %s", f->path,
                     strerror(errno));
  if (st == RDA_OK && fsync(fd) != 0)
    st = rda_err_set(err, RDA_ERR_IO, "%s: fsync failed: %s", f->path, strerror(errno));
  if (close(fd) != 0 && st == RDA_OK)
    st = rda_err_set(err, RDA_ERR_IO, "%s: close failed: %s", f->path, strerror(errno));
  return st;
}

rda_status rda_out_files_replace(const rda_out_job *jobs, int n,
                                 int (*rename_fn)(const char *from, const char *to),
                                 rda_err *err) {
  if (n <= 0) return RDA_OK;
  if (rename_fn == NULL) rename_fn = rename;
  rda_out_slot *slots = calloc((size_t)n, sizeof *slots);
  if (slots == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "out of memory");
  rda_status st = RDA_OK;
  for (int i = 0; i < n && st == RDA_OK; i++) st = rda_out_files_stage(&jobs[i], &slots[i], err);
  for (int i = 0; i < n && st == RDA_OK; i++) {
    const rda_out_file *f = jobs[i].file;
    if (!f->exists) continue;
    if (rda_out_files_backup(f, slots[i].backup, sizeof slots[i].backup) == 0) {
      slots[i].have_backup = 1;
    } else if (errno == EPERM || errno == ENOTSUP || errno == EOPNOTSUPP || errno == EMLINK) {
      slots[i].no_link = 1; /* no hard links here: replaced without a way back */
    } else {
      st = rda_err_set(err, RDA_ERR_IO, "%s: cannot keep the old file while replacing it: %s",
                       f->path, strerror(errno));
    }
  }
  int failed_at = -1;
  for (int i = 0; i < n && st == RDA_OK; i++) {
    if (rename_fn(slots[i].tmp, jobs[i].file->target) == 0) {
      slots[i].have_tmp = 0;
      slots[i].placed = 1;
      continue;
    }
    st = rda_err_set(err, RDA_ERR_IO, "%s: cannot write: %s", jobs[i].file->path,
                     strerror(errno));
    failed_at = i;
  }
  if (st != RDA_OK && failed_at >= 0) {
    /* Put back what was already renamed into place. */
    for (int i = 0; i < failed_at; i++) {
      const rda_out_file *f = jobs[i].file;
      if (!slots[i].placed) continue;
      if (slots[i].have_backup) {
        if (rename(slots[i].backup, f->target) == 0) {
          slots[i].have_backup = 0;
        } else {
          char why[8600];
          snprintf(why, sizeof why, "; could not restore '%s': its old content is in '%s'",
                   f->path, slots[i].backup);
          rda_out_files_append(err, why);
          slots[i].have_backup = 0; /* kept: it is the only copy */
        }
      } else if (slots[i].no_link) {
        char why[4400];
        snprintf(why, sizeof why,
                 "; '%s' was already replaced (no hard links here to keep its old content)",
                 f->path);
        rda_out_files_append(err, why);
      } else {
        unlink(f->target); /* new: was not there before */
      }
    }
  }
  for (int i = 0; i < n; i++) {
    if (slots[i].have_tmp) unlink(slots[i].tmp);
    if (slots[i].have_backup) unlink(slots[i].backup); /* success, or the target is the old one */
  }
  if (st == RDA_OK)
    for (int i = 0; i < n; i++) rda_path_sync_folder(jobs[i].file->target);
  free(slots);
  return st;
}
