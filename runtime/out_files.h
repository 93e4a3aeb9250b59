/* out_files.h — output files a command replaces: where a path really leads (symbolic links
 * followed), what may be written over (regular files only), whether two paths are one file, and
 * replacing a whole set of them all or nothing. `rdagen run` uses it (tools/cmd_run.c). */
#ifndef RDA_OUT_FILES_H
#define RDA_OUT_FILES_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "err.h"

/* The file `path` names with its symbolic links followed (relative link text against the link's
 * own folder; a dangling link to where it points, which writing then creates), so a write
 * through a link replaces its target and keeps the link. The result is not checked further: it
 * may be a folder, a FIFO or not exist. RDA_ERR_IO naming `path`: longer than cap, readlink
 * failing, more than 40 links (a loop). */
rda_status rda_path_follow_links(const char *path, char *out, size_t cap, rda_err *err);

/* Flush the folder holding `target` (best effort: errors ignored), so that a rename into it
 * survives a crash. */
void rda_path_sync_folder(const char *target);

/* One output, checked before any work is done. */
typedef struct rda_out_file {
  const char *path;  /* as the user named it (every message names it); not owned */
  char target[4096]; /* path with its links followed: the file that is written */
  size_t base;       /* offset of target's last component */
  int exists;        /* target exists (then it is a regular file) */
  dev_t dev;         /* exists: the file's identity; else its folder's */
  ino_t ino;
} rda_out_file;

/* Fill f for path: follow its links; RDA_ERR_IO with one line naming path when the target
 * exists and is not a regular file (a folder, FIFO, device or socket: writing over one would
 * replace the node, or block), or its folder does not exist, is not a folder or is not
 * writable. */
rda_status rda_out_file_check(const char *path, rda_out_file *f, rda_err *err);

/* 1 when a and b (both checked) are one file however spelled or linked: the same existing file
 * (device and inode, so hard links count too), or the same new name in the same folder. */
int rda_out_file_same(const rda_out_file *a, const rda_out_file *b);

/* 1 when f (checked) is the existing file st describes (from stat, links followed). */
int rda_out_file_is(const rda_out_file *f, const struct stat *st);

/* Writes one file's content to fd (a new temporary); errors name `path`. */
typedef rda_status (*rda_out_write_fn)(int fd, const char *path, const void *ctx, rda_err *err);

/* Writes all len bytes of data to fd, through interrupted and short writes; RDA_ERR_IO
 * "<path>: write failed: <why>" when write(2) fails or writes nothing. */
rda_status rda_out_write_all(int fd, const char *path, const void *data, size_t len, rda_err *err);

/* A file's content as bytes in memory, and the rda_out_write_fn that writes it (ctx: an
 * rda_out_bytes). */
typedef struct rda_out_bytes {
  const void *data;
  size_t len;
} rda_out_bytes;
rda_status rda_out_write_bytes(int fd, const char *path, const void *ctx, rda_err *err);

typedef struct rda_out_job {
  const rda_out_file *file; /* checked, distinct from every other job's (rda_out_file_same) */
  rda_out_write_fn write;
  const void *ctx;
} rda_out_job;

/* Replace every job's target, all or nothing as far as POSIX allows:
 * 1. each content goes to a new temporary beside its target (`.rdagen-<pid>-<k>.partial`,
 *    the replaced file's permission bits), written and fsync'ed; any failure removes them all;
 * 2. each existing target gets a hard-linked backup (`.rdagen-<pid>-<k>.old`): a failure
 *    there removes every temporary and backup, and no target has changed;
 * 3. the temporaries are renamed over their targets in order; when rename k fails, targets
 *    0..k-1 are put back (a backup renamed over its target again, a new file unlinked);
 * 4. the backups are removed and the folders fsync'ed.
 * What holds: on any failure this process sees, every target is as before (same inode,
 * same content) and nothing new is left, unless a restoring rename itself fails, which the
 * message then says, naming the backup that holds the old file. What does not: a concurrent
 * reader can see some targets new and others old during step 3, and a crash during steps 3-4
 * can leave a mix plus `.rdagen-*.partial`/`.old` files. On a file system without hard links a
 * target gets no backup, so a failure after it was replaced cannot restore it (the message
 * says so).
 * rename_fn: the rename used in step 3 (NULL: rename(2)); tests inject failures there.
 * RDA_ERR_IO with one line naming the user's path (never a temporary's) on failure. */
rda_status rda_out_files_replace(const rda_out_job *jobs, int n,
                                 int (*rename_fn)(const char *from, const char *to),
                                 rda_err *err);

#endif
