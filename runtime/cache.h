/* cache.h — the kernel cache: compiled kernels (cubins, emulator modules) keyed by a SHA-256 of
 * everything they are built from, kept in memory per process and on disk, one folder per target
 * (sm_90/, emu-x86_64/, ...), with checksummed entries, atomic writes and LRU eviction. */
#ifndef RDA_CACHE_H
#define RDA_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* ---- SHA-256 (FIPS 180-4) ---------------------------------------------------------------- */

typedef struct rda_cache_sha256 {
  uint32_t h[8];
  uint64_t bytes;
  unsigned char buf[64];
  size_t fill;
} rda_cache_sha256;

void rda_cache_sha256_init(rda_cache_sha256 *s);
void rda_cache_sha256_update(rda_cache_sha256 *s, const void *data, size_t n);
void rda_cache_sha256_final(rda_cache_sha256 *s, unsigned char out[32]);
/* One-shot SHA-256 as lowercase hex (64 chars + NUL). */
void rda_cache_sha256_hex(const void *data, size_t n, char out[65]);

/* ---- keys -------------------------------------------------------------------------------- */

/* Everything a compiled kernel depends on. Never a timestamp. NULL fields count as "". */
typedef struct rda_cache_inputs {
  const char *target;      /* "sm_90", "emu-x86_64": also the on-disk folder */
  const char *source;      /* the generated source */
  const char *headers;     /* digest of the templates (rda_sources_digest) */
  const char *rda_version; /* RDA_VERSION_STRING */
  const char *compiler;    /* "nvrtc 12.8", or the host compiler and its version line */
  const char *options;     /* compile options, one string */
} rda_cache_inputs;

typedef struct rda_cache_key {
  char hex[65]; /* SHA-256 of the inputs, lowercase hex */
} rda_cache_key;

/* Hash each field as (tag, length, bytes), so no two different inputs meet. */
void rda_cache_key_of(const rda_cache_inputs *in, rda_cache_key *out);

/* ---- folders ----------------------------------------------------------------------------- */

/* The cache root ($RDA_CACHE_DIR, else $XDG_CACHE_HOME/rda, else $HOME/.cache/rda) and, when
 * target is not NULL, its folder for target, created (0700) when missing. Refused
 * (RDA_ERR_CACHE, the message names the folder) when either belongs to another user or is
 * writable by group or others: a kernel loaded from there could be anyone's code. */
rda_status rda_cache_folder(const char *target, char *out, size_t cap, rda_err *err);

/* The folder check alone: owned by this user, not writable by group or others, a folder. */
rda_status rda_cache_check_folder(const char *path, rda_err *err);

/* RDA_CACHE_MAX_BYTES (a byte count; suffixes K, M, G allowed), default 1 GiB. */
unsigned long long rda_cache_max_bytes(void);

/* ---- entries ----------------------------------------------------------------------------- */

/* Look `key` up for `target`: the process's memory first, then disk. On a hit *data (malloc'd,
 * the caller frees) and *bytes hold the payload and *hit is 1; a disk hit touches the entry's
 * access record (a memory hit touches nothing: it is pure memory).
 * A miss is RDA_OK with *hit 0 and `why` (may be NULL) telling why ("not on disk", "corrupted
 * entry: ..., rebuilt", "a different source under the same key"); a damaged entry is deleted,
 * never returned. `source` (may be NULL) is compared with the source stored in the entry. */
rda_status rda_cache_get(const char *target, const rda_cache_key *key, const char *source,
                         unsigned char **data, size_t *bytes, int *hit, char *why, size_t why_cap,
                         rda_err *err);

/* Store an entry (name is for `rdagen cache list`; source is kept for the collision check):
 * temporary file in the target folder, fsync, rename — concurrent writers of the same key all
 * succeed and leave one whole entry. Also kept in memory. Evicts least recently used entries
 * when the cache grows past rda_cache_max_bytes(). */
rda_status rda_cache_put(const char *target, const rda_cache_key *key, const char *name,
                         const char *source, const void *data, size_t bytes, rda_err *err);

/* Forget the in-memory copies (tests; a process that wants its memory back). */
void rda_cache_memory_clear(void);

/* One disk entry, as `rdagen cache list` shows it. */
typedef struct rda_cache_entry_info {
  char target[64];
  char key[65];
  char name[160];
  unsigned long long bytes; /* file size */
  long long last_use_ns;    /* the access record, else the entry's mtime; UNIX epoch */
  int valid;                /* header and checksum verified */
} rda_cache_entry_info;

/* Every entry (of `target`, or all when NULL), least recently used first. *out malloc'd. */
rda_status rda_cache_list(const char *target, rda_cache_entry_info **out, size_t *count,
                          rda_err *err);

/* Delete every entry (of `target`, or all when NULL); *removed counts entries. */
rda_status rda_cache_clear(const char *target, size_t *removed, rda_err *err);

/* Delete least recently used entries until the cache holds at most max_bytes; `keep` (a key
 * hex, may be NULL) is never deleted. *removed (may be NULL) counts them. */
rda_status rda_cache_evict(unsigned long long max_bytes, const char *keep, size_t *removed,
                           rda_err *err);

/* The cubin of kernel `name` (generated `source`, entry `name`) for sm_`arch`: from the cache
 * (memory, then disk), else compiled by NVRTC and stored. *image malloc'd; *compiled (may be
 * NULL) says whether NVRTC ran. Needs no GPU: `rdagen cache warm` and the cuda backend use it. */
rda_status rda_cache_cubin(int arch, const char *name, const char *source, unsigned char **image,
                           size_t *bytes, int *compiled, rda_err *err);

/* ---- ahead-of-time bundles (folders written by `rdagen emit`) ---------------------------- */

/* Find a cubin for (name, arch, source) in the bundles listed in `path_list` (colon-separated
 * folders, e.g. $RDA_KERNEL_PATH; NULL or "" means none): the manifest.json of each folder is
 * read and an entry matches when its name, arch and "source_sha256" all match (a stale bundle
 * is never used). On a match *found is 1 and file (cap bytes) holds the cubin's path. A folder
 * without a readable manifest is skipped; a malformed manifest is RDA_ERR_CACHE naming it. */
rda_status rda_cache_bundle_find(const char *path_list, const char *name, int arch,
                                 const char *source, char *file, size_t cap, int *found,
                                 rda_err *err);

/* The "source_sha256" of a bundle entry: SHA-256 (hex) of the generated source, the templates
 * digest and the rda version — what a cubin is built from, NVRTC aside. */
rda_status rda_cache_source_sha(const char *source, char out[65], rda_err *err);

/* Read a whole file (malloc'd, NUL-terminated beyond *bytes). RDA_ERR_IO naming it. */
rda_status rda_cache_read_file(const char *path, unsigned char **data, size_t *bytes, rda_err *err);

#endif
