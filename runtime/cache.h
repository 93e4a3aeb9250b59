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
 * writable by group or others (a kernel loaded from there could be anyone's code), or when the
 * target folder is a symbolic link (get, put, list and clear refuse it, eviction passes over
 * it; the root itself may be a link). RDA_ERR_CACHE too when it cannot be used (no root, cannot
 * be created, not a folder, too long). `out` is always a string ("" when there is no root). */
rda_status rda_cache_folder(const char *target, char *out, size_t cap, rda_err *err);

/* rda_cache_folder for writing, telling a refusal (an error, as above) from a folder that
 * merely cannot be used: cannot be created (read-only file system, a file in the way, no
 * root), not a folder, not writable, a root path too long to hold the names of its entries
 * (over 3837 characters). Then *usable is 0, RDA_OK is returned, why (may be NULL;
 * why_cap bytes) holds the reason as one line and it is logged once per process
 * (RDA_LOG=info): the caller compiles without caching, as it does when the disk is full. */
rda_status rda_cache_folder_try(const char *target, char *out, size_t cap, int *usable,
                                char *why, size_t why_cap, rda_err *err);

/* RDA_CACHE_MAX_BYTES: digits with an optional K, M or G suffix (binary), default 1 GiB when
 * unset or empty. Anything else (a sign, blanks, another suffix, a value past 2^64 - 1) is
 * RDA_ERR_INVALID_ARGUMENT with one line naming the value; rda_cache_get and rda_cache_put
 * fail with it, so a command that compiles or lists the cache stops there. */
rda_status rda_cache_max_bytes_get(unsigned long long *out, rda_err *err);

/* rm -r that never follows a symbolic link: every folder is opened O_NOFOLLOW and its names
 * removed relative to it, so a link is unlinked itself and what it points to is kept. Best
 * effort (errors ignored). */
void rda_cache_remove_tree(const char *path);

/* ---- entries ----------------------------------------------------------------------------- */

/* Look `key` up for `target`: the process's memory first, then disk. On a hit *data (malloc'd,
 * the caller frees) and *bytes hold the payload and *hit is 1; a disk hit touches the entry's
 * access record (a memory hit touches nothing: it is pure memory).
 * A miss is RDA_OK with *hit 0 and `why` (may be NULL) telling why ("not on disk", "corrupted
 * entry: ...", "entry not readable: ...", "a different source under the same key", "kernel
 * cache unusable": the folder cannot be created, see rda_cache_folder_try); a damaged entry is
 * deleted, never returned, and so is anything else than a regular file under its name (a
 * folder, a FIFO, a link: removed without following a link, "corrupted entry: a folder in its
 * place, removed"); a regular file that cannot be read is left for the rebuilt entry to
 * replace. `source` (may be NULL) is compared with the source stored in the entry. A memory
 * hit is logged at RDA_LOG=debug like a disk hit. */
rda_status rda_cache_get(const char *target, const rda_cache_key *key, const char *source,
                         unsigned char **data, size_t *bytes, int *hit, char *why, size_t why_cap,
                         rda_err *err);

/* Store an entry (name is for `rdagen cache list`; source is kept for the collision check):
 * temporary file in the target folder (a name left by a dead process of the same pid is passed
 * over), fsync, rename (over a folder in the entry's place too: removed first) — concurrent
 * writers of the same key all succeed and leave one whole entry. Also kept in memory. Then
 * evicts least recently used entries when the cache grows past rda_cache_max_bytes_get()'s
 * limit; an eviction that fails (a target folder that cannot be read) is one warning per
 * process, not a failure: the entry is stored. A folder that cannot be used
 * (rda_cache_folder_try) stores it in memory only and returns RDA_OK. */
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

/* 1 when `name` is a target folder's name: sm_ and 2 or 3 digits (sm_80, sm_100), or emu- and a
 * machine name of letters, digits and '_' (emu-x86_64), as the emulator names its folder.
 * Anything else in the cache root (tuning.lua, a link to a folder of the user's) is no target
 * and list, clear and evict leave it alone. */
int rda_cache_target_name_ok(const char *name);

/* Every entry (of `target`, or all when NULL), least recently used first. *out malloc'd. A
 * missing cache root is an empty cache (nothing is created); no root at all (RDA_CACHE_DIR,
 * XDG_CACHE_HOME and HOME unset) or one too long is RDA_ERR_CACHE; a symbolic link named like a
 * target folder (rda_cache_target_name_ok) is refused (rda_cache_folder), and so is a target
 * folder that cannot be read or that loading refuses (another user's, writable by group or
 * others): RDA_ERR_CACHE naming it. Anything else in the root is no target folder: skipped, as
 * by evict and clear. Entries are the names of 64 lowercase hex digits and ".rda". */
rda_status rda_cache_list(const char *target, rda_cache_entry_info **out, size_t *count,
                          rda_err *err);

/* Delete every entry (of `target`, or all when NULL); *removed (may be NULL) counts entries.
 * Only the cache's own names go: an entry's (64 lowercase hex digits, ".rda") and its access
 * record's (".use"), whatever is under them (a folder too); a user's mine.rda stays.
 * Temporaries and emulator header folders younger than an hour may belong to a process
 * running now: they are left, and *left (may be NULL) counts them; older ones go. Never
 * deletes through a symbolic link (rda_cache_remove_tree); a symlinked target folder refuses
 * the whole clear before anything is deleted. A missing cache root is not created. An entry
 * or access record that cannot be removed (a read-only folder; not ENOENT), or a target folder
 * that cannot be read or that loading refuses: every other target is still cleared, then
 * RDA_ERR_CACHE with one line giving the count and naming the first such folder. */
rda_status rda_cache_clear(const char *target, size_t *removed, size_t *left, rda_err *err);

/* Delete least recently used entries until the cache holds at most max_bytes; `keep` (a key
 * hex, may be NULL) is never deleted. *removed (may be NULL) counts them. A target folder
 * that is a symbolic link is passed over (never followed); one that cannot be read or that
 * loading refuses too, the others still evicted, then RDA_ERR_CACHE naming the first. */
rda_status rda_cache_evict(unsigned long long max_bytes, const char *keep, size_t *removed,
                           rda_err *err);

/* The cubin of kernel `name` (generated `source`, entry `name`) for sm_`arch`: from the cache
 * (memory, then disk), else compiled by NVRTC and stored. *image malloc'd; *compiled (may be
 * NULL) says whether NVRTC ran. Needs no GPU: `rdagen cache warm` and the cuda backend use it. */
rda_status rda_cache_cubin(int arch, const char *name, const char *source, unsigned char **image,
                           size_t *bytes, int *compiled, rda_err *err);

/* rda_cache_cubin for filling the cache (`rdagen cache warm`): the cubin is not kept, and one
 * that was compiled but could not be stored on disk (disk full, folder unusable) is
 * RDA_ERR_CACHE naming the kernel and why, where rda_cache_cubin only logs it. */
rda_status rda_cache_cubin_store(int arch, const char *name, const char *source, int *compiled,
                                 rda_err *err);

/* Whether the cubin of `source` for sm_`arch` is on disk in the cache now: *stored 1 when its
 * entry is a regular file (*bytes, may be NULL: its size), else 0 (a missing or unusable
 * cache too). Never compiles, never touches the memory copies: `rdagen cache warm` checks with
 * it that RDA_CACHE_MAX_BYTES kept what it stored. */
rda_status rda_cache_cubin_stored(int arch, const char *source, int *stored,
                                  unsigned long long *bytes, rda_err *err);

/* ---- ahead-of-time bundles (folders written by `rdagen emit`) ---------------------------- */

/* Find a cubin for (name, arch, source) in the bundles listed in `path_list` (colon-separated
 * folders, e.g. $RDA_KERNEL_PATH; NULL or "" means none): the manifest.json of each folder is
 * read and an entry matches when its name, arch and "source_sha256" all match (a stale bundle
 * is never used) and its cubin file is a regular file whose SHA-256 is the entry's
 * "cubin_sha256" (a cubin changed since is logged at RDA_LOG=info and passed over; an entry
 * without one comes from an emit before this version: passed over too, with one
 * "rda: warning:" line on stderr per bundle folder and process, whatever RDA_LOG says). On a
 * match *found is 1, file (cap bytes) holds the cubin's path and *image (malloc'd) its verified
 * bytes. A folder without a readable manifest is skipped; a malformed manifest is RDA_ERR_CACHE
 * naming it. */
rda_status rda_cache_bundle_load(const char *path_list, const char *name, int arch,
                                 const char *source, unsigned char **image, size_t *bytes,
                                 char *file, size_t cap, int *found, rda_err *err);

/* rda_cache_bundle_load without keeping the bytes (the cubin is still verified). */
rda_status rda_cache_bundle_find(const char *path_list, const char *name, int arch,
                                 const char *source, char *file, size_t cap, int *found,
                                 rda_err *err);

/* The "source_sha256" of a bundle entry: SHA-256 (hex) of the generated source, the templates
 * digest and the rda version — what a cubin is built from, NVRTC aside. */
rda_status rda_cache_source_sha(const char *source, char out[65], rda_err *err);

/* Read a whole regular file (malloc'd, NUL-terminated beyond *bytes). Opened non-blocking and
 * checked with fstat, so a FIFO or device in its place is refused, never waited on.
 * RDA_ERR_IO naming it. */
rda_status rda_cache_read_file(const char *path, unsigned char **data, size_t *bytes, rda_err *err);

#endif
