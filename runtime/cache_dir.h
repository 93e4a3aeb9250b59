/* cache_dir.h — where rda keeps what it builds at run time (the kernel cache, runtime/cache.h):
 * $RDA_CACHE_DIR, else $XDG_CACHE_HOME/rda, else $HOME/.cache/rda, each target in its own
 * subfolder, created on demand (rda_cache_folder adds the ownership and permission checks). */
#ifndef RDA_CACHE_DIR_H
#define RDA_CACHE_DIR_H

#include <stddef.h>

#include "err.h"

/* Resolve the cache root, append "/sub" (sub may be NULL or ""), create the folders that do
 * not exist (mode 0700) and write the path to out (cap bytes). RDA_ERR_CACHE when no root can
 * be found or a folder cannot be created. */
rda_status rda_cache_dir_get(const char *sub, char *out, size_t cap, rda_err *err);

/* rda_cache_dir_get without creating anything: the path alone. */
rda_status rda_cache_dir_path(const char *sub, char *out, size_t cap, rda_err *err);

/* mkdir -p: create path and its missing parents. RDA_ERR_CACHE on failure. */
rda_status rda_cache_dir_mkdirs(const char *path, rda_err *err);

#endif
