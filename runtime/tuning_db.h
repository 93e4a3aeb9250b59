/* tuning_db.h — the user's tuning database on disk: where it is, reading it, and replacing it
 * atomically. Its format and meaning are gen/tuning.lua's (runtime/gen.h, "tuning"); `rdagen
 * tune` writes it and every plan reads it. */
#ifndef RDA_TUNING_DB_H
#define RDA_TUNING_DB_H

#include <stddef.h>

#include "err.h"

/* The database's path: $RDA_TUNING_DB when set and not empty, else tuning.lua in the cache
 * root (runtime/cache_dir.h). RDA_ERR_CACHE when neither can be resolved. */
rda_status rda_tuning_db_path(char *out, size_t cap, rda_err *err);

/* The database's text: *text malloc'd and NUL-terminated (the caller frees it), NULL when the
 * file does not exist; name gets the path ("" when none). With RDA_TUNING_DB set: RDA_ERR_IO
 * naming the path when it exists but cannot be read, is not a regular file, holds a NUL byte
 * or is larger than 16 MiB. With it unset, a default place that cannot be reached (no cache
 * root, a cache root that is a file) means no user database; a file there is read as above. */
rda_status rda_tuning_db_read(char **text, char *name, size_t name_cap, rda_err *err);

/* The text of the database at `path`: *text NULL when it does not exist; RDA_ERR_IO when it
 * exists but cannot be read, is not a regular file (a FIFO fails, never blocks), holds a NUL
 * byte or is over 16 MiB. */
rda_status rda_tuning_db_read_file(const char *path, char **text, rda_err *err);

/* Replace the file at `path` with text: written to a temporary file in the same folder,
 * flushed, then renamed over it, so a reader sees the old or the new database, never a part.
 * Symbolic links are followed (the file they name is replaced, or created when a link
 * dangles; the links are kept); the old file's
 * permissions are kept (a new one: 0644 less the umask); a missing cache root is created
 * (0700), any other missing folder is an error. RDA_ERR_IO naming the path on failure (the
 * old file is then untouched), also for a text over 16 MiB, which no read would take. */
rda_status rda_tuning_db_write(const char *path, const char *text, rda_err *err);

/* Writers take this lock (flock on <the file path names>.lock, made beside it while held and
 * removed when let go, so a link and its target share one and nothing stays behind, unless the
 * holder is killed: a file left so is locked again as it is; waits for other holders) around
 * read, merge and write, so concurrent `rdagen tune` runs keep each other's entries. Readers
 * (plans) need none: writes are atomic renames. Taking it also checks that the file can be
 * replaced (RDA_ERR_IO, lock not held: another user's file in a sticky folder), so a writer
 * learns that before its work, not at the rename. */
typedef struct rda_tuning_lock {
  int fd;         /* -1: not held */
  char path[4200];
} rda_tuning_lock;
#define RDA_TUNING_LOCK_INIT {-1, ""}
rda_status rda_tuning_db_lock(const char *path, rda_tuning_lock *lk, rda_err *err);
/* The temporary file a write of this process makes beside the locked file, into out (cap
 * bytes): a signal handler that removes the lock removes it too. 0 when it does not fit. */
int rda_tuning_db_temp_name(const rda_tuning_lock *lk, char *out, size_t cap);
void rda_tuning_db_unlock(rda_tuning_lock *lk); /* accepts NULL and a lock not held */

#endif
