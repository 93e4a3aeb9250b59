/* sources.h — the generator scripts (gen/), the tile space (tuning/) and the kernel templates
 * (templates/, templates/emu/) as librda carries them: embedded at build time by cmake/embed.cmake,
 * or read from the tree $RDA_HOME names (a development override). */
#ifndef RDA_SOURCES_H
#define RDA_SOURCES_H

#include <stddef.h>

#include "err.h"

/* The embedded table (generated: rda_sources_data.c in the build folder). data[len] == 0. */
typedef struct rda_sources_entry {
  const char *name; /* relative to the source tree, e.g. "templates/ptx.cuh" */
  const unsigned char *data;
  size_t len;
} rda_sources_entry;
extern const rda_sources_entry rda_sources_table[];
extern const size_t rda_sources_table_count;

/* $RDA_HOME when set and not empty, else NULL (the embedded copies serve). */
const char *rda_sources_home(void);

/* The known files, sorted by name: i in [0, rda_sources_count()). */
size_t rda_sources_count(void);
const char *rda_sources_name(size_t i);

/* The content of `name` (e.g. "gen/plan.lua"): $RDA_HOME/name when RDA_HOME is set, else the
 * embedded copy. *text is malloc'd and NUL-terminated (the caller frees it); *len excludes the
 * NUL. RDA_ERR_IO naming the path when the file cannot be read; with RDA_HOME unset, a name
 * that was not embedded is RDA_ERR_IO too. */
rda_status rda_sources_read(const char *name, char **text, size_t *len, rda_err *err);

/* 1 when `name` is known (embedded, or a readable file under $RDA_HOME). */
int rda_sources_exists(const char *name);

/* SHA-256 (hex, 64 chars + NUL) of every known file under `prefix` (e.g. "templates/"): names,
 * lengths and contents, in name order, as rda_sources_read returns them. Part of every kernel
 * cache key. Memoized when RDA_HOME is unset. */
rda_status rda_sources_digest(const char *prefix, char out[65], rda_err *err);

#endif
