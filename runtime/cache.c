/* cache.c — the kernel cache: SHA-256 content keys, a per-process memory map, checksummed disk
 * entries in one folder per target (atomic writes, refused unsafe folders, LRU eviction through
 * access records) and the lookup of ahead-of-time bundles written by `rdagen emit`. */
#include "cache.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache_dir.h"
#include "log.h"
#include "nvrtc.h"
#include "sources.h"

enum { kCachePath = 4096, kCacheHeader = 64, kCacheFormat = 1 };
/* The longest name built under a target folder: an entry's temporary (64 + ".tmp.<pid>.<n>",
 * 110) or an emulator header (inc-<32>.tmp.<pid>.<n>/emu/<file>, about 140), with room. A root
 * longer than kCacheRootMax leaves no room for a target folder (at most 64) and that name: an
 * unusable cache, said at once, never a path cut off later. */
enum { kCacheNameMax = 192, kCacheRootMax = kCachePath - 1 - (1 + 64) - (1 + kCacheNameMax) };
static const char rda_cache_magic[8] = {'R', 'D', 'A', 'C', 'A', 'C', 'H', 'E'};

/* ================================================================== SHA-256 (FIPS 180-4) */

static const uint32_t rda_cache_k256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rda_cache_ror(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

static void rda_cache_sha256_block(uint32_t h[8], const unsigned char p[64]) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
           (uint32_t)p[4 * i + 3];
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 =
        rda_cache_ror(w[i - 15], 7) ^ rda_cache_ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 =
        rda_cache_ror(w[i - 2], 17) ^ rda_cache_ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t s1 = rda_cache_ror(e, 6) ^ rda_cache_ror(e, 11) ^ rda_cache_ror(e, 25);
    const uint32_t ch = (e & f) ^ (~e & g);
    const uint32_t t1 = k + s1 + ch + rda_cache_k256[i] + w[i];
    const uint32_t s0 = rda_cache_ror(a, 2) ^ rda_cache_ror(a, 13) ^ rda_cache_ror(a, 22);
    const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = s0 + maj;
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += k;
}

void rda_cache_sha256_init(rda_cache_sha256 *s) {
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, iv, sizeof iv);
  s->bytes = 0;
  s->fill = 0;
}

void rda_cache_sha256_update(rda_cache_sha256 *s, const void *data, size_t n) {
  const unsigned char *p = data;
  s->bytes += n;
  if (s->fill > 0) {
    const size_t take = n < 64 - s->fill ? n : 64 - s->fill;
    memcpy(s->buf + s->fill, p, take);
    s->fill += take;
    p += take;
    n -= take;
    if (s->fill < 64) return;
    rda_cache_sha256_block(s->h, s->buf);
    s->fill = 0;
  }
  for (; n >= 64; n -= 64, p += 64) rda_cache_sha256_block(s->h, p);
  if (n > 0) memcpy(s->buf, p, n);
  s->fill = n;
}

void rda_cache_sha256_final(rda_cache_sha256 *s, unsigned char out[32]) {
  const uint64_t bits = s->bytes * 8;
  unsigned char pad[72] = {0x80};
  const size_t padlen = (s->fill < 56 ? 56 : 120) - s->fill;
  for (int i = 0; i < 8; ++i) pad[padlen + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
  rda_cache_sha256_update(s, pad, padlen + 8);
  for (int i = 0; i < 8; ++i) {
    out[4 * i] = (unsigned char)(s->h[i] >> 24);
    out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
    out[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
    out[4 * i + 3] = (unsigned char)s->h[i];
  }
}

static void rda_cache_hex(const unsigned char d[32], char out[65]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) {
    out[2 * i] = digits[d[i] >> 4];
    out[2 * i + 1] = digits[d[i] & 15];
  }
  out[64] = '\0';
}

void rda_cache_sha256_hex(const void *data, size_t n, char out[65]) {
  rda_cache_sha256 s;
  unsigned char d[32];
  rda_cache_sha256_init(&s);
  rda_cache_sha256_update(&s, data, n);
  rda_cache_sha256_final(&s, d);
  rda_cache_hex(d, out);
}

/* ================================================================== keys */

static void rda_cache_field(rda_cache_sha256 *s, const char *tag, const char *value) {
  const char *v = value ? value : "";
  const uint64_t lens[2] = {strlen(tag), strlen(v)};
  rda_cache_sha256_update(s, &lens[0], sizeof lens[0]);
  rda_cache_sha256_update(s, tag, (size_t)lens[0]);
  rda_cache_sha256_update(s, &lens[1], sizeof lens[1]);
  rda_cache_sha256_update(s, v, (size_t)lens[1]);
}

void rda_cache_key_of(const rda_cache_inputs *in, rda_cache_key *out) {
  rda_cache_sha256 s;
  unsigned char d[32];
  rda_cache_sha256_init(&s);
  rda_cache_field(&s, "rda-cache-key", "1");
  rda_cache_field(&s, "target", in->target);
  rda_cache_field(&s, "source", in->source);
  rda_cache_field(&s, "headers", in->headers);
  rda_cache_field(&s, "rda_version", in->rda_version);
  rda_cache_field(&s, "compiler", in->compiler);
  rda_cache_field(&s, "options", in->options);
  rda_cache_sha256_final(&s, d);
  rda_cache_hex(d, out->hex);
}

rda_status rda_cache_source_sha(const char *source, char out[65], rda_err *err) {
  char headers[65];
  RDA_TRY(rda_sources_digest("templates/", headers, err));
  rda_cache_sha256 s;
  unsigned char d[32];
  rda_cache_sha256_init(&s);
  rda_cache_field(&s, "rda-bundle-source", "1");
  rda_cache_field(&s, "source", source);
  rda_cache_field(&s, "headers", headers);
  rda_cache_field(&s, "rda_version", RDA_VERSION_STRING);
  rda_cache_sha256_final(&s, d);
  rda_cache_hex(d, out);
  return RDA_OK;
}

/* ================================================================== folders */

/* The ownership and permission checks of an existing folder (st from stat or lstat). */
static rda_status rda_cache_check_stat(const char *path, const struct stat *st, rda_err *err) {
  if (st->st_uid != geteuid())
    return rda_err_set(err, RDA_ERR_CACHE,
                       "cache folder '%s' belongs to uid %ld, not to this user (uid %ld): "
                       "refusing to load kernels from it (set RDA_CACHE_DIR to a folder of yours)",
                       path, (long)st->st_uid, (long)geteuid());
  if ((st->st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return rda_err_set(err, RDA_ERR_CACHE,
                       "cache folder '%s' is writable by group or others (mode %03o): refusing to "
                       "load kernels from it (chmod go-w it)",
                       path, (unsigned)(st->st_mode & 0777));
  return RDA_OK;
}

/* The refusal of a per-target folder that is a symbolic link, by get, put, list and clear (a
 * link could lead the cache's deletes and loads anywhere); eviction, run by every put of any
 * target, passes over it instead, never following it. */
static rda_status rda_cache_refuse_link(const char *path, rda_err *err) {
  return rda_err_set(err, RDA_ERR_CACHE,
                     "cache folder '%s' is a symbolic link: refusing it (remove the link; only "
                     "the cache root itself may be one)",
                     path);
}

/* Logged once per process: the first reason the cache could not be used. */
static atomic_int rda_cache_unusable_told;

static void rda_cache_tell_unusable(const char *why) {
  if (atomic_exchange(&rda_cache_unusable_told, 1) == 0)
    rda_log(RDA_LOG_INFO, "kernel cache unusable, compiling without caching: %s", why);
}

/* Resolve (and with `create`, make) the cache root and, when target is not NULL, its folder.
 * Returns an error for a refusal (another user's folder, writable by others, a symlinked target
 * folder, a bad target name). A folder that merely cannot be used (no root, cannot be created,
 * not a folder, with need_write not writable) is RDA_OK with *usable 0 and why (cap why_cap)
 * saying what is wrong. */
static rda_status rda_cache_folder_at(const char *target, int create, int need_write, char *out,
                                      size_t cap, int *usable, char *why, size_t why_cap,
                                      rda_err *err) {
  *usable = 0;
  why[0] = '\0';
  if (cap > 0) out[0] = '\0'; /* "no root" (rda_cache_dir_path failing) leaves it empty */
  if (target != NULL && (target[0] == '\0' || target[0] == '.' || strchr(target, '/') != NULL))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "cache target '%s': not a folder name",
                       target);
  rda_err e = {0};
  if (rda_cache_dir_path(NULL, out, cap, &e) != RDA_OK) {
    if (cap > 0) out[0] = '\0'; /* no root, or one cut off: never taken for a missing root */
    snprintf(why, why_cap, "%s", e.msg);
    return RDA_OK;
  }
  const size_t root_len = strlen(out);
  if (root_len > kCacheRootMax) {
    snprintf(why, why_cap,
             "cache folder '%.96s...': path too long (%zu characters; at most %d, to leave room "
             "for the names of its entries)",
             out, root_len, (int)kCacheRootMax);
    out[0] = '\0';
    return RDA_OK;
  }
  if (create && rda_cache_dir_mkdirs(out, &e) != RDA_OK) {
    snprintf(why, why_cap, "%s", e.msg);
    return RDA_OK;
  }
  struct stat st;
  if (stat(out, &st) != 0) {
    snprintf(why, why_cap, "cache folder '%s': %s", out, strerror(errno));
    return RDA_OK;
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(why, why_cap, "cache folder '%s' is not a folder", out);
    return RDA_OK;
  }
  RDA_TRY(rda_cache_check_stat(out, &st, err));
  if (target != NULL) {
    const size_t n = strlen(out);
    if (n + 1 + strlen(target) >= cap)
      return rda_err_set(err, RDA_ERR_CACHE, "cache folder under '%s': path too long", out);
    snprintf(out + n, cap - n, "/%s", target);
    if (create && mkdir(out, 0700) != 0 && errno != EEXIST) {
      snprintf(why, why_cap, "cache folder '%s': mkdir: %s", out, strerror(errno));
      return RDA_OK;
    }
    if (lstat(out, &st) != 0) {
      snprintf(why, why_cap, "cache folder '%s': %s", out, strerror(errno));
      return RDA_OK;
    }
    if (S_ISLNK(st.st_mode)) return rda_cache_refuse_link(out, err);
    if (!S_ISDIR(st.st_mode)) {
      snprintf(why, why_cap, "cache folder '%s' is not a folder", out);
      return RDA_OK;
    }
    RDA_TRY(rda_cache_check_stat(out, &st, err));
  }
  if (need_write && access(out, W_OK | X_OK) != 0) {
    snprintf(why, why_cap, "cache folder '%s' is not writable: %s", out, strerror(errno));
    return RDA_OK;
  }
  *usable = 1;
  return RDA_OK;
}

rda_status rda_cache_folder_try(const char *target, char *out, size_t cap, int *usable, char *why,
                                size_t why_cap, rda_err *err) {
  char reason[1024];
  RDA_TRY(rda_cache_folder_at(target, 1, 1, out, cap, usable, reason, sizeof reason, err));
  if (!*usable) rda_cache_tell_unusable(reason);
  if (why != NULL && why_cap > 0) snprintf(why, why_cap, "%s", *usable ? "" : reason);
  return RDA_OK;
}

rda_status rda_cache_folder(const char *target, char *out, size_t cap, rda_err *err) {
  char why[1024];
  int usable = 0;
  RDA_TRY(rda_cache_folder_at(target, 1, 0, out, cap, &usable, why, sizeof why, err));
  if (!usable) return rda_err_set(err, RDA_ERR_CACHE, "%s", why);
  return RDA_OK;
}

rda_status rda_cache_max_bytes_get(unsigned long long *out, rda_err *err) {
  *out = 1ull << 30;
  const char *v = getenv("RDA_CACHE_MAX_BYTES");
  if (v == NULL || v[0] == '\0') return RDA_OK;
  unsigned long long n = 0;
  const char *p = v;
  int overflow = 0;
  for (; *p >= '0' && *p <= '9'; ++p) {
    const unsigned d = (unsigned)(*p - '0');
    if (n > (ULLONG_MAX - d) / 10) overflow = 1;
    n = n * 10 + d;
  }
  int shift = 0;
  if (p > v && *p != '\0' && p[1] == '\0') {
    const char s = (char)toupper((unsigned char)*p);
    shift = s == 'K' ? 10 : s == 'M' ? 20 : s == 'G' ? 30 : -1;
    if (shift > 0) ++p;
  }
  if (p == v || *p != '\0' || shift < 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "RDA_CACHE_MAX_BYTES='%.64s': expected a byte count, e.g. 500M (digits, "
                       "then K, M or G)",
                       v);
  if (overflow || n > (ULLONG_MAX >> shift))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "RDA_CACHE_MAX_BYTES='%.64s': too large (at most %llu bytes)", v,
                       ULLONG_MAX);
  *out = n << shift;
  return RDA_OK;
}

/* ================================================================== memory */

typedef struct rda_cache_mem {
  struct rda_cache_mem *next;
  char target[64];
  char key[65];
  unsigned char *data;
  size_t bytes;
} rda_cache_mem;

enum { kCacheBuckets = 256 };
static const size_t rda_cache_mem_cap = (size_t)256 << 20;
static pthread_mutex_t rda_cache_mem_mu = PTHREAD_MUTEX_INITIALIZER;
static rda_cache_mem *rda_cache_mem_table[kCacheBuckets];
static size_t rda_cache_mem_total;

static unsigned rda_cache_bucket(const char *key) {
  return (unsigned)strtoul((char[3]){key[0], key[1], '\0'}, NULL, 16) % kCacheBuckets;
}

static void rda_cache_mem_clear_locked(void) {
  for (int b = 0; b < kCacheBuckets; ++b) {
    for (rda_cache_mem *e = rda_cache_mem_table[b], *next; e != NULL; e = next) {
      next = e->next;
      free(e->data);
      free(e);
    }
    rda_cache_mem_table[b] = NULL;
  }
  rda_cache_mem_total = 0;
}

void rda_cache_memory_clear(void) {
  pthread_mutex_lock(&rda_cache_mem_mu);
  rda_cache_mem_clear_locked();
  pthread_mutex_unlock(&rda_cache_mem_mu);
}

/* A malloc'd copy of the payload, or NULL. */
static unsigned char *rda_cache_mem_get(const char *target, const char *key, size_t *bytes) {
  unsigned char *copy = NULL;
  pthread_mutex_lock(&rda_cache_mem_mu);
  for (rda_cache_mem *e = rda_cache_mem_table[rda_cache_bucket(key)]; e != NULL; e = e->next) {
    if (strcmp(e->key, key) != 0 || strcmp(e->target, target) != 0) continue;
    copy = malloc(e->bytes + 1);
    if (copy != NULL) {
      memcpy(copy, e->data, e->bytes);
      copy[e->bytes] = 0;
      *bytes = e->bytes;
    }
    break;
  }
  pthread_mutex_unlock(&rda_cache_mem_mu);
  return copy;
}

/* Best effort: out of memory just leaves the entry out. */
static void rda_cache_mem_put(const char *target, const char *key, const void *data, size_t n) {
  if (n > rda_cache_mem_cap / 4 || strlen(target) >= 64) return;
  rda_cache_mem *e = calloc(1, sizeof *e);
  unsigned char *copy = malloc(n ? n : 1);
  if (e == NULL || copy == NULL) {
    free(e);
    free(copy);
    return;
  }
  memcpy(copy, data, n);
  snprintf(e->target, sizeof e->target, "%s", target);
  memcpy(e->key, key, sizeof e->key);
  e->data = copy;
  e->bytes = n;
  pthread_mutex_lock(&rda_cache_mem_mu);
  const unsigned b = rda_cache_bucket(key);
  for (rda_cache_mem **p = &rda_cache_mem_table[b]; *p != NULL; p = &(*p)->next) {
    if (strcmp((*p)->key, key) == 0 && strcmp((*p)->target, target) == 0) {
      rda_cache_mem *old = *p;
      *p = old->next;
      rda_cache_mem_total -= old->bytes;
      free(old->data);
      free(old);
      break;
    }
  }
  if (rda_cache_mem_total + n > rda_cache_mem_cap) rda_cache_mem_clear_locked();
  e->next = rda_cache_mem_table[b];
  rda_cache_mem_table[b] = e;
  rda_cache_mem_total += n;
  pthread_mutex_unlock(&rda_cache_mem_mu);
}

/* ================================================================== files */

/* Read a whole regular file, `path` relative to the folder dfd (AT_FDCWD: as given); `flags`
 * adds open flags (O_NOFOLLOW for cache entries). Opened
 * O_NONBLOCK so that a FIFO put in its place never blocks: it is refused by the fstat. On a
 * failure errno tells why (the open's, EIO for a short read), for rda_cache_get's `why`. */
static rda_status rda_cache_read_at(int dfd, const char *path, int flags, unsigned char **data,
                                    size_t *bytes, rda_err *err) {
  *data = NULL;
  *bytes = 0;
  const int fd = openat(dfd, path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | flags);
  if (fd < 0) {
    const int e = errno;
    rda_err_set(err, RDA_ERR_IO, "cannot open '%s': %s", path, strerror(e));
    errno = e;
    return RDA_ERR_IO;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    rda_err_set(err, RDA_ERR_IO, "'%s' is not a regular file", path);
    errno = EINVAL;
    return RDA_ERR_IO;
  }
  const int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK); /* a regular file: plain reads */
  const size_t n = (size_t)st.st_size;
  unsigned char *buf = malloc(n + 1);
  if (buf == NULL) {
    close(fd);
    rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "no memory to read '%s' (%zu bytes)", path, n);
    errno = ENOMEM;
    return RDA_ERR_OUT_OF_MEMORY;
  }
  size_t got = 0;
  while (got < n) {
    const ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (got != n) {
    free(buf);
    rda_err_set(err, RDA_ERR_IO, "cannot read '%s': short read", path);
    errno = EIO;
    return RDA_ERR_IO;
  }
  buf[n] = 0;
  *data = buf;
  *bytes = n;
  return RDA_OK;
}

rda_status rda_cache_read_file(const char *path, unsigned char **data, size_t *bytes,
                               rda_err *err) {
  return rda_cache_read_at(AT_FDCWD, path, 0, data, bytes, err);
}

static rda_status rda_cache_path(char *out, size_t cap, rda_err *err, const char *dir,
                                 const char *key, const char *ext) {
  const int n = snprintf(out, cap, "%s/%s%s", dir, key, ext);
  if (n < 0 || (size_t)n >= cap)
    return rda_err_set(err, RDA_ERR_CACHE, "cache: path under '%s' too long", dir);
  return RDA_OK;
}

static long long rda_cache_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* The access record `<key>.use`: its mtime is the entry's last use, set explicitly (to the ns)
 * so that LRU order never depends on the file system's coarse clock. Best effort. */
static void rda_cache_touch(const char *dir, const char *key) {
  char path[kCachePath];
  if (rda_cache_path(path, sizeof path, NULL, dir, key, ".use") != RDA_OK) return;
  const long long now = rda_cache_now_ns();
  const struct timespec ts[2] = {{now / 1000000000ll, now % 1000000000ll},
                                 {now / 1000000000ll, now % 1000000000ll}};
  if (utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW) == 0) return;
  const int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd >= 0) close(fd);
  (void)utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW);
}

/* Entry layout (host byte order; a cache belongs to one machine):
 *   [0,8) "RDACACHE"  [8,12) format  [12,16) name length  [16,24) source length
 *   [24,32) payload length  [32,64) SHA-256 of name || source || payload
 * then name, source, payload. */
typedef struct rda_cache_header {
  uint32_t format, name_len;
  uint64_t source_len, payload_len;
  unsigned char sum[32];
} rda_cache_header;

static void rda_cache_sum(const void *name, size_t nl, const void *src, size_t sl,
                          const void *payload, size_t pl, unsigned char out[32]) {
  rda_cache_sha256 s;
  rda_cache_sha256_init(&s);
  rda_cache_sha256_update(&s, name, nl);
  rda_cache_sha256_update(&s, src, sl);
  rda_cache_sha256_update(&s, payload, pl);
  rda_cache_sha256_final(&s, out);
}

/* Verify a whole entry file in memory; NULL when sound, else why not. */
static const char *rda_cache_verify(const unsigned char *buf, size_t n, rda_cache_header *h) {
  if (n < kCacheHeader) return "shorter than its header";
  if (memcmp(buf, rda_cache_magic, sizeof rda_cache_magic) != 0) return "bad magic";
  memcpy(&h->format, buf + 8, 4);
  memcpy(&h->name_len, buf + 12, 4);
  memcpy(&h->source_len, buf + 16, 8);
  memcpy(&h->payload_len, buf + 24, 8);
  memcpy(h->sum, buf + 32, 32);
  if (h->format != kCacheFormat) return "unknown format version";
  const uint64_t body = (uint64_t)h->name_len + h->source_len + h->payload_len;
  if (h->source_len > n || h->payload_len > n || body != n - kCacheHeader)
    return "length does not match its header (truncated?)";
  unsigned char sum[32];
  const unsigned char *p = buf + kCacheHeader;
  rda_cache_sum(p, h->name_len, p + h->name_len, (size_t)h->source_len,
                p + h->name_len + h->source_len, (size_t)h->payload_len, sum);
  if (memcmp(sum, h->sum, 32) != 0) return "checksum mismatch";
  return NULL;
}

/* rm -r of `name` in the folder parent (AT_FDCWD: name is a path), never through a symbolic
 * link: each folder is opened O_NOFOLLOW | O_DIRECTORY and its names removed relative to it, so
 * a link (even one swapped in meanwhile) is unlinked itself and what it points to is kept.
 * 0 when `name` went, ENOENT when it was not there, else the errno of the first failure. */
static int rda_cache_rmtree_at(int parent, const char *name, int depth) {
  const int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOTDIR && errno != ELOOP) return errno;
    return unlinkat(parent, name, 0) == 0 ? 0 : errno; /* not a folder: a file or a link */
  }
  DIR *d = depth < 32 ? fdopendir(fd) : NULL;
  if (d == NULL) {
    const int e = depth < 32 ? errno : ELOOP; /* deeper than any folder the cache makes */
    close(fd);
    return e;
  }
  int first = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    const int r = rda_cache_rmtree_at(dirfd(d), e->d_name, depth + 1);
    if (first == 0 && r != ENOENT) first = r;
  }
  closedir(d);
  if (unlinkat(parent, name, AT_REMOVEDIR) == 0) return 0;
  return first != 0 ? first : errno;
}

void rda_cache_remove_tree(const char *path) {
  (void)rda_cache_rmtree_at(AT_FDCWD, path, 0);
}

/* What a name in a target folder is to the cache: an entry (its key, 64 lowercase hex digits,
 * then ".rda"), the entry's access record (the key, then ".use"), or neither: list, eviction
 * and clear leave anything else alone (a user's mine.rda is no entry). */
enum { kCacheNotOurs = 0, kCacheEntryName = 1, kCacheUseName = 2 };

static int rda_cache_name_kind(const char *name) {
  for (int i = 0; i < 64; ++i)
    if (!isdigit((unsigned char)name[i]) && (name[i] < 'a' || name[i] > 'f')) return kCacheNotOurs;
  if (strcmp(name + 64, ".rda") == 0) return kCacheEntryName;
  if (strcmp(name + 64, ".use") == 0) return kCacheUseName;
  return kCacheNotOurs;
}

/* Why the entry `path` could not be read (errno e), as rda_cache_get's `why`: not there (a
 * plain miss); something else than a regular file in its place (a folder, a FIFO, a link: never
 * an entry, and the rename of the rebuilt one could not replace a folder), removed without
 * following a link; or a file this process may not read (left: the rebuilt entry replaces it). */
static void rda_cache_unreadable(const char *path, int e, char *why, size_t why_cap) {
  char text[160];
  struct stat st;
  if (e == ENOENT || lstat(path, &st) != 0) {
    snprintf(text, sizeof text, "not on disk");
  } else if (S_ISREG(st.st_mode)) {
    snprintf(text, sizeof text, "entry not readable: %s", strerror(e));
    rda_log(RDA_LOG_INFO, "cache entry %s cannot be read (%s): rebuilding", path, strerror(e));
  } else {
    const char *kind = S_ISDIR(st.st_mode)    ? "a folder"
                       : S_ISLNK(st.st_mode)  ? "a symbolic link"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                                              : "a special file";
    const int r = rda_cache_rmtree_at(AT_FDCWD, path, 0);
    snprintf(text, sizeof text, "corrupted entry: %s in its place, %s", kind,
             r == 0 || r == ENOENT ? "removed" : "cannot be removed");
    rda_log(RDA_LOG_INFO, "corrupted cache entry %s (%s in its place): %s, rebuilding", path, kind,
            r == 0 || r == ENOENT ? "removed" : strerror(r));
  }
  if (why != NULL && why_cap > 0) snprintf(why, why_cap, "%s", text);
}

rda_status rda_cache_get(const char *target, const rda_cache_key *key, const char *source,
                         unsigned char **data, size_t *bytes, int *hit, char *why, size_t why_cap,
                         rda_err *err) {
  *data = NULL;
  *bytes = 0;
  *hit = 0;
  if (why != NULL && why_cap > 0) why[0] = '\0';
  if (target == NULL || key == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_cache_get: target and key required");
  unsigned long long max_bytes = 0; /* a malformed limit fails every command that compiles */
  RDA_TRY(rda_cache_max_bytes_get(&max_bytes, err));
  unsigned char *mem = rda_cache_mem_get(target, key->hex, bytes);
  if (mem != NULL) { /* no file system work at all (the disk entry was touched when loaded) */
    rda_log(RDA_LOG_DEBUG, "found %s/%s in memory (memory cache hit)", target, key->hex);
    *data = mem;
    *hit = 1;
    return RDA_OK;
  }
  char dir[kCachePath], path[kCachePath], unusable[1024];
  int usable = 0;
  RDA_TRY(
      rda_cache_folder_at(target, 1, 0, dir, sizeof dir, &usable, unusable, sizeof unusable, err));
  if (!usable) { /* compile without caching */
    rda_cache_tell_unusable(unusable);
    if (why != NULL) snprintf(why, why_cap, "kernel cache unusable");
    return RDA_OK;
  }
  RDA_TRY(rda_cache_path(path, sizeof path, err, dir, key->hex, ".rda"));
  unsigned char *buf = NULL;
  size_t n = 0;
  rda_err ignored = {0};
  if (rda_cache_read_at(AT_FDCWD, path, O_NOFOLLOW, &buf, &n, &ignored) != RDA_OK) {
    rda_cache_unreadable(path, errno, why, why_cap);
    return RDA_OK;
  }
  rda_cache_header h;
  const char *bad = rda_cache_verify(buf, n, &h);
  if (bad != NULL) {
    rda_log(RDA_LOG_INFO, "corrupted cache entry %s (%s): deleted, rebuilding", path, bad);
    if (why != NULL) snprintf(why, why_cap, "corrupted entry: %s", bad);
    unlink(path);
    free(buf);
    return RDA_OK;
  }
  const unsigned char *src = buf + kCacheHeader + h.name_len;
  if (source != NULL &&
      (h.source_len != strlen(source) || memcmp(src, source, (size_t)h.source_len) != 0)) {
    rda_log(RDA_LOG_INFO, "cache entry %s holds a different source under the same key", path);
    if (why != NULL) snprintf(why, why_cap, "a different source under the same key");
    free(buf);
    return RDA_OK;
  }
  rda_log(RDA_LOG_DEBUG, "loaded %.*s from %s (disk cache hit)", (int)h.name_len,
          (const char *)buf + kCacheHeader, path);
  const size_t off = kCacheHeader + h.name_len + (size_t)h.source_len;
  memmove(buf, buf + off, (size_t)h.payload_len);
  buf[h.payload_len] = 0;
  *data = buf;
  *bytes = (size_t)h.payload_len;
  *hit = 1;
  rda_cache_touch(dir, key->hex);
  rda_cache_mem_put(target, key->hex, buf, *bytes);
  return RDA_OK;
}

static rda_status rda_cache_write_all(int fd, const void *data, size_t n, const char *path,
                                      rda_err *err) {
  const unsigned char *p = data;
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return rda_err_set(err, RDA_ERR_CACHE, "cache: cannot write '%s': %s", path,
                         w < 0 ? strerror(errno) : "no progress");
    p += w;
    n -= (size_t)w;
  }
  return RDA_OK;
}

/* Set once an eviction failure was logged: one warning per process, not one per entry. */
static atomic_int rda_cache_evict_told;

rda_status rda_cache_put(const char *target, const rda_cache_key *key, const char *name,
                         const char *source, const void *data, size_t bytes, rda_err *err) {
  if (target == NULL || key == NULL || (data == NULL && bytes > 0))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_cache_put: target, key, data required");
  static atomic_ulong counter;
  unsigned long long max_bytes = 0;
  RDA_TRY(rda_cache_max_bytes_get(&max_bytes, err));
  char dir[kCachePath], path[kCachePath], tmp[kCachePath];
  int usable = 0;
  RDA_TRY(rda_cache_folder_try(target, dir, sizeof dir, &usable, NULL, 0, err));
  if (!usable) { /* said once (rda_cache_folder_try): this process keeps it in memory only */
    rda_cache_mem_put(target, key->hex, data, bytes);
    return RDA_OK;
  }
  RDA_TRY(rda_cache_path(path, sizeof path, err, dir, key->hex, ".rda"));

  const char *nm = name ? name : "";
  const char *src = source ? source : "";
  unsigned char head[kCacheHeader];
  rda_cache_header h = {kCacheFormat, (uint32_t)strlen(nm), strlen(src), bytes, {0}};
  rda_cache_sum(nm, h.name_len, src, (size_t)h.source_len, data, bytes, h.sum);
  memcpy(head, rda_cache_magic, 8);
  memcpy(head + 8, &h.format, 4);
  memcpy(head + 12, &h.name_len, 4);
  memcpy(head + 16, &h.source_len, 8);
  memcpy(head + 24, &h.payload_len, 8);
  memcpy(head + 32, h.sum, 32);

  /* A name taken already (left by a process killed mid-write whose pid this one has, as a
   * container's pid 1 after a kill -9, or another container's rdagen as pid 1 on the same
   * cache) is passed over for the next. */
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    char suffix[64];
    snprintf(suffix, sizeof suffix, ".tmp.%ld.%lu", (long)getpid(), atomic_fetch_add(&counter, 1));
    RDA_TRY(rda_cache_path(tmp, sizeof tmp, err, dir, key->hex, suffix));
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0)
    return rda_err_set(err, RDA_ERR_CACHE, "cache: cannot create '%s': %s", tmp, strerror(errno));
  rda_status st = rda_cache_write_all(fd, head, sizeof head, tmp, err);
  if (st == RDA_OK) st = rda_cache_write_all(fd, nm, h.name_len, tmp, err);
  if (st == RDA_OK) st = rda_cache_write_all(fd, src, (size_t)h.source_len, tmp, err);
  if (st == RDA_OK) st = rda_cache_write_all(fd, data, bytes, tmp, err);
  if (st == RDA_OK && fsync(fd) != 0)
    st = rda_err_set(err, RDA_ERR_CACHE, "cache: fsync '%s': %s", tmp, strerror(errno));
  if (close(fd) != 0 && st == RDA_OK)
    st = rda_err_set(err, RDA_ERR_CACHE, "cache: close '%s': %s", tmp, strerror(errno));
  int moved = st == RDA_OK ? rename(tmp, path) : 0;
  if (moved != 0 && errno == EISDIR) { /* a folder in the entry's place: never an entry */
    rda_log(RDA_LOG_INFO, "corrupted cache entry %s (a folder in its place): removing it", path);
    (void)rda_cache_rmtree_at(AT_FDCWD, path, 0);
    moved = rename(tmp, path);
  }
  if (moved != 0)
    st = rda_err_set(err, RDA_ERR_CACHE, "cache: cannot store '%s': %s", path, strerror(errno));
  if (st != RDA_OK) {
    unlink(tmp);
    return st;
  }
  const int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)fsync(dfd); /* the rename itself survives a crash */
    close(dfd);
  }
  rda_cache_touch(dir, key->hex);
  rda_cache_mem_put(target, key->hex, data, bytes);
  rda_log(RDA_LOG_DEBUG, "stored %s in %s (%zu bytes)", nm, path, bytes);
  /* Stored: an eviction that fails (a target folder that cannot be read) only lets the cache
   * grow, said once per process, never "not stored". */
  rda_err ev = {0};
  if (rda_cache_evict(max_bytes, key->hex, NULL, &ev) != RDA_OK &&
      atomic_exchange(&rda_cache_evict_told, 1) == 0)
    rda_log(RDA_LOG_WARN, "%s", ev.msg);
  return RDA_OK;
}

/* ================================================================== listing, eviction */

typedef struct rda_cache_list_acc {
  rda_cache_entry_info *v;
  size_t n, cap;
} rda_cache_list_acc;

static long long rda_cache_mtime_ns(const struct stat *st) {
  return (long long)st->st_mtim.tv_sec * 1000000000ll + st->st_mtim.tv_nsec;
}

/* Temporary files (and emulator header folders) younger than this may belong to a process
 * writing them now: eviction and `cache clear` leave them; older ones were left by a process
 * that died mid-write, and go. */
static const long long rda_cache_stale_ns = 3600ll * 1000000000ll;

/* A walk over the names of the open folder dfd (which stays open: the walk has its own
 * descriptor, rewound, since a dup shares the position of an earlier walk). NULL on failure. */
static DIR *rda_cache_walk(int dfd) {
  const int own = dup(dfd);
  DIR *d = own >= 0 ? fdopendir(own) : NULL;
  if (d == NULL) {
    if (own >= 0) close(own);
    return NULL;
  }
  rewinddir(d);
  return d;
}

/* The one error of a target folder whose names cannot be read (errno e): list, clear and
 * eviction say it, never "no entries". */
static rda_status rda_cache_unreadable_folder(const char *dir, int e, rda_err *err) {
  return rda_err_set(err, RDA_ERR_CACHE, "cache folder '%s' cannot be read: %s", dir, strerror(e));
}

/* A temporary (".tmp." in its name) or an emulator header folder ("inc-"): what a running
 * process may be using. */
static int rda_cache_in_flight_name(const char *name) {
  return strstr(name, ".tmp.") != NULL || strncmp(name, "inc-", 4) == 0;
}

/* Remove the in-flight name `name` of folder dfd when it is older than the staleness window;
 * 1 when it was left (young: a running process may be using it). */
static int rda_cache_remove_if_stale(int dfd, const char *name, long long now) {
  struct stat tb;
  if (fstatat(dfd, name, &tb, AT_SYMLINK_NOFOLLOW) != 0) return 0;
  if (now - rda_cache_mtime_ns(&tb) <= rda_cache_stale_ns) return 1;
  (void)rda_cache_rmtree_at(dfd, name, 0);
  return 0;
}

/* Add the entries of one target folder (open as dfd; `dir` names it). `verify`: read each
 * whole entry and check it. Stale temporaries go on the way. */
static rda_status rda_cache_scan(int dfd, const char *dir, const char *target, int verify,
                                 rda_cache_list_acc *acc, rda_err *err) {
  DIR *d = rda_cache_walk(dfd);
  if (d == NULL) return rda_cache_unreadable_folder(dir, errno, err);
  rda_status st = RDA_OK;
  const long long now = rda_cache_now_ns();
  for (struct dirent *e; st == RDA_OK && (e = readdir(d)) != NULL;) {
    if (strstr(e->d_name, ".tmp.") != NULL) {
      (void)rda_cache_remove_if_stale(dfd, e->d_name, now);
      continue;
    }
    if (rda_cache_name_kind(e->d_name) != kCacheEntryName) continue;
    struct stat sb;
    if (fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue; /* evicted meanwhile */
    if (!S_ISREG(sb.st_mode)) continue; /* never an entry: a link, a FIFO, a folder */
    if (acc->n == acc->cap) {
      const size_t cap = acc->cap ? 2 * acc->cap : 64;
      rda_cache_entry_info *grown = realloc(acc->v, cap * sizeof *grown);
      if (grown == NULL) {
        st = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "cache: out of memory listing '%s'", dir);
        break;
      }
      acc->v = grown;
      acc->cap = cap;
    }
    rda_cache_entry_info *info = &acc->v[acc->n++];
    memset(info, 0, sizeof *info);
    snprintf(info->target, sizeof info->target, "%.63s", target);
    memcpy(info->key, e->d_name, 64);
    info->key[64] = '\0';
    info->bytes = (unsigned long long)sb.st_size;
    info->last_use_ns = rda_cache_mtime_ns(&sb);
    char use[80];
    struct stat ub;
    snprintf(use, sizeof use, "%s.use", info->key);
    if (fstatat(dfd, use, &ub, AT_SYMLINK_NOFOLLOW) == 0)
      info->last_use_ns = rda_cache_mtime_ns(&ub);
    if (!verify) continue;
    unsigned char *buf = NULL;
    size_t n = 0;
    rda_err ignored = {0};
    if (rda_cache_read_at(dfd, e->d_name, O_NOFOLLOW, &buf, &n, &ignored) != RDA_OK) continue;
    rda_cache_header h;
    info->valid = rda_cache_verify(buf, n, &h) == NULL;
    if (info->valid)
      snprintf(info->name, sizeof info->name, "%.*s", (int)h.name_len, (const char *)buf + 64);
    free(buf);
  }
  closedir(d);
  return st;
}

static int rda_cache_by_use(const void *a, const void *b) {
  const rda_cache_entry_info *x = a, *y = b;
  if (x->last_use_ns != y->last_use_ns) return x->last_use_ns < y->last_use_ns ? -1 : 1;
  return strcmp(x->key, y->key);
}

int rda_cache_target_name_ok(const char *name) {
  const size_t n = strlen(name);
  if (strncmp(name, "sm_", 3) == 0) {
    if (n < 5 || n > 6 || name[3] == '0') return 0; /* sm_10 .. sm_999 */
    for (size_t i = 3; i < n; ++i)
      if (!isdigit((unsigned char)name[i])) return 0;
    return 1;
  }
  if (strncmp(name, "emu-", 4) != 0 || n == 4 || n > 64) return 0;
  for (size_t i = 4; i < n; ++i)
    if (!isalnum((unsigned char)name[i]) && name[i] != '_') return 0;
  return 1;
}

/* The cache root for list, evict and clear, never created: *rootfd is the open folder, or -1
 * (RDA_OK) when there is no cache yet (the root does not exist; one too long or unset is an
 * error). With refuse_links (list, clear), every target folder (of `target`, or all) is
 * checked first: a symbolic link among them refuses the whole operation before it changes
 * anything (rda_cache_refuse_link); eviction passes over such links instead. */
static rda_status rda_cache_open_root(const char *target, int refuse_links, char *root, size_t cap,
                                      int *rootfd, rda_err *err) {
  *rootfd = -1;
  char why[1024];
  int usable = 0;
  RDA_TRY(rda_cache_folder_at(NULL, 0, 0, root, cap, &usable, why, sizeof why, err));
  if (!usable) {
    struct stat st;
    if (root[0] != '\0' && lstat(root, &st) != 0 && errno == ENOENT) return RDA_OK;
    return rda_err_set(err, RDA_ERR_CACHE, "%s", why);
  }
  const int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return rda_err_set(err, RDA_ERR_CACHE, "cache folder '%s': %s", root, strerror(errno));
  DIR *d = rda_cache_walk(fd);
  if (d == NULL) {
    close(fd);
    return rda_err_set(err, RDA_ERR_CACHE, "cache folder '%s': %s", root, strerror(errno));
  }
  rda_status st = RDA_OK;
  for (struct dirent *e; refuse_links && st == RDA_OK && (e = readdir(d)) != NULL;) {
    if (!rda_cache_target_name_ok(e->d_name)) continue; /* tuning.lua, the user's own links */
    if (target != NULL && strcmp(target, e->d_name) != 0) continue;
    struct stat sb;
    if (fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISLNK(sb.st_mode)) continue;
    /* Only a link that leads to a folder poses as a target folder; a dangling one or one to a
     * file is none of ours. */
    if (fstatat(fd, e->d_name, &sb, 0) != 0 || !S_ISDIR(sb.st_mode)) continue;
    char path[kCachePath];
    snprintf(path, sizeof path, "%s/%s", root, e->d_name);
    st = rda_cache_refuse_link(path, err);
  }
  closedir(d);
  if (st != RDA_OK) {
    close(fd);
    return st;
  }
  *rootfd = fd;
  return RDA_OK;
}

/* Each target folder of rootfd (of `target`, or all): fn(folder fd, its path, its name, NULL,
 * ctx). A name that is no folder or a link (even one swapped in after rda_cache_open_root) is
 * no target folder: skipped, never followed. A folder that cannot be opened (mode 000, or 300:
 * no read) or that loading would refuse (rda_cache_check_stat: another user's, writable by
 * group or others) is handed to fn as `problem` (dfd -1; the message names it): each caller
 * says it in its own way, never as an empty folder. */
typedef rda_status (*rda_cache_target_fn)(int dfd, const char *dir, const char *name,
                                          const rda_err *problem, void *ctx, rda_err *err);

static rda_status rda_cache_each_target(int rootfd, const char *root, const char *target,
                                        rda_cache_target_fn fn, void *ctx, rda_err *err) {
  DIR *d = rda_cache_walk(rootfd);
  if (d == NULL) {
    return rda_err_set(err, RDA_ERR_CACHE, "cache folder '%s': %s", root, strerror(errno));
  }
  rda_status st = RDA_OK;
  for (struct dirent *e; st == RDA_OK && (e = readdir(d)) != NULL;) {
    if (!rda_cache_target_name_ok(e->d_name)) continue;
    if (target != NULL && strcmp(target, e->d_name) != 0) continue;
    char dir[kCachePath];
    snprintf(dir, sizeof dir, "%s/%s", root, e->d_name); /* fits: rda_cache_folder_at */
    const int dfd =
        openat(rootfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (dfd < 0 && (errno == ENOTDIR || errno == ELOOP || errno == ENOENT)) continue;
    rda_err problem = {0};
    struct stat sb;
    if (dfd < 0)
      rda_cache_unreadable_folder(dir, errno, &problem);
    else if (fstat(dfd, &sb) != 0)
      rda_cache_unreadable_folder(dir, errno, &problem);
    else
      (void)rda_cache_check_stat(dir, &sb, &problem);
    st = fn(problem.status == RDA_OK ? dfd : -1, dir, e->d_name,
            problem.status == RDA_OK ? NULL : &problem, ctx, err);
    if (dfd >= 0) close(dfd);
  }
  closedir(d);
  return st;
}

typedef struct rda_cache_scan_ctx {
  rda_cache_list_acc acc;
  int verify;
  size_t *skipped; /* NULL: a target folder with a problem fails the listing */
  rda_err *first;  /* else: counted, and the first one's message kept */
} rda_cache_scan_ctx;

static rda_status rda_cache_scan_target(int dfd, const char *dir, const char *name,
                                        const rda_err *problem, void *ctx, rda_err *err) {
  rda_cache_scan_ctx *c = ctx;
  rda_err e = {0};
  if (problem != NULL)
    rda_err_set(&e, problem->status, "%s", problem->msg);
  else
    (void)rda_cache_scan(dfd, dir, name, c->verify, &c->acc, &e);
  if (e.status == RDA_OK) return RDA_OK;
  if (c->skipped == NULL) return rda_err_set(err, e.status, "%s", e.msg);
  ++*c->skipped;
  rda_err_set(c->first, e.status, "%s", e.msg);
  return RDA_OK;
}

/* The entries of `target` (or all), least recently used first. With skipped NULL (list): links
 * posing as target folders are refused and a target folder that cannot be read fails it. Else
 * (eviction): both are passed over, those that cannot be read counted in *skipped, the first
 * one's message in *first. */
static rda_status rda_cache_list_any(const char *target, int verify, size_t *skipped,
                                     rda_err *first, rda_cache_entry_info **out, size_t *count,
                                     rda_err *err) {
  *out = NULL;
  *count = 0;
  char root[kCachePath];
  int rootfd = -1;
  RDA_TRY(rda_cache_open_root(target, skipped == NULL, root, sizeof root, &rootfd, err));
  if (rootfd < 0) return RDA_OK; /* no cache yet */
  rda_cache_scan_ctx c = {{0}, verify, skipped, first};
  const rda_status st = rda_cache_each_target(rootfd, root, target, rda_cache_scan_target, &c, err);
  close(rootfd);
  if (st != RDA_OK) {
    free(c.acc.v);
    return st;
  }
  if (c.acc.n > 1) qsort(c.acc.v, c.acc.n, sizeof *c.acc.v, rda_cache_by_use);
  *out = c.acc.v;
  *count = c.acc.n;
  return RDA_OK;
}

rda_status rda_cache_list(const char *target, rda_cache_entry_info **out, size_t *count,
                          rda_err *err) {
  return rda_cache_list_any(target, 1, NULL, NULL, out, count, err);
}

/* Remove one entry and its access record: unlinked in its target folder, opened without
 * following a link. */
static void rda_cache_remove(const char *root, const rda_cache_entry_info *e) {
  char dir[kCachePath], name[80];
  if (snprintf(dir, sizeof dir, "%s/%s", root, e->target) >= (int)sizeof dir) return;
  const int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return;
  snprintf(name, sizeof name, "%s.rda", e->key);
  (void)unlinkat(dfd, name, 0);
  snprintf(name, sizeof name, "%s.use", e->key);
  (void)unlinkat(dfd, name, 0);
  close(dfd);
}

rda_status rda_cache_evict(unsigned long long max_bytes, const char *keep, size_t *removed,
                           rda_err *err) {
  if (removed != NULL) *removed = 0;
  rda_cache_entry_info *v = NULL;
  size_t n = 0, skipped = 0;
  rda_err first = {0};
  RDA_TRY(rda_cache_list_any(NULL, 0, &skipped, &first, &v, &n, err));
  unsigned long long total = 0;
  for (size_t i = 0; i < n; ++i) total += v[i].bytes;
  char root[kCachePath];
  rda_status st = total > max_bytes ? rda_cache_dir_path(NULL, root, sizeof root, err) : RDA_OK;
  for (size_t i = 0; st == RDA_OK && i < n && total > max_bytes; ++i) {
    if (keep != NULL && strcmp(v[i].key, keep) == 0) continue;
    rda_cache_remove(root, &v[i]);
    total -= v[i].bytes;
    if (removed != NULL) ++*removed;
    rda_log(RDA_LOG_DEBUG, "evicted %s/%s.rda (least recently used; cache over %llu bytes)",
            v[i].target, v[i].key, max_bytes);
  }
  free(v);
  if (st == RDA_OK && skipped > 0)
    st = rda_err_set(err, RDA_ERR_CACHE,
                     "kernel cache eviction passed over %zu target folder%s (their entries stay, "
                     "whatever RDA_CACHE_MAX_BYTES says): %s",
                     skipped, skipped == 1 ? "" : "s", first.msg);
  return st;
}

typedef struct rda_cache_clear_ctx {
  size_t removed, left;
  long long now;
  size_t failed; /* names that stayed (not ENOENT) and folders not read, over every target */
  rda_err first; /* the first one's message, naming its folder */
} rda_cache_clear_ctx;

static rda_status rda_cache_clear_target(int dfd, const char *dir, const char *name,
                                         const rda_err *problem, void *ctx, rda_err *err) {
  (void)name, (void)err;
  rda_cache_clear_ctx *c = ctx;
  DIR *t = problem == NULL ? rda_cache_walk(dfd) : NULL;
  if (t == NULL) {
    ++c->failed;
    if (problem != NULL)
      rda_err_set(&c->first, problem->status, "%s", problem->msg);
    else
      rda_cache_unreadable_folder(dir, errno, &c->first);
    return RDA_OK;
  }
  /* A file that stays (a read-only folder, an immutable file) is a failed clear, not a quiet
   * "removed 0": counted, the other targets still cleared, and told as one line by
   * rda_cache_clear. ENOENT: removed by someone else meanwhile. Only the cache's own names go
   * (rda_cache_name_kind), whatever their type: a folder or FIFO in an entry's place too. */
  for (struct dirent *f; (f = readdir(t)) != NULL;) {
    if (f->d_name[0] == '.') continue;
    if (rda_cache_in_flight_name(f->d_name)) {
      c->left += (size_t)rda_cache_remove_if_stale(dfd, f->d_name, c->now);
      continue;
    }
    const int kind = rda_cache_name_kind(f->d_name);
    if (kind == kCacheNotOurs) continue;
    const int rc = rda_cache_rmtree_at(dfd, f->d_name, 0);
    if (rc == 0 && kind == kCacheEntryName) ++c->removed;
    if (rc != 0 && rc != ENOENT && c->failed++ == 0)
      rda_err_set(&c->first, RDA_ERR_CACHE, "cache folder '%s': %s", dir, strerror(rc));
  }
  closedir(t);
  return RDA_OK;
}

rda_status rda_cache_clear(const char *target, size_t *removed, size_t *left, rda_err *err) {
  if (removed != NULL) *removed = 0;
  if (left != NULL) *left = 0;
  char root[kCachePath];
  int rootfd = -1;
  RDA_TRY(rda_cache_open_root(target, 1, root, sizeof root, &rootfd, err));
  rda_cache_memory_clear();
  if (rootfd < 0) return RDA_OK; /* no cache yet */
  /* On the heap: first holds a whole message. */
  rda_cache_clear_ctx *c = calloc(1, sizeof *c);
  if (c == NULL) {
    close(rootfd);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "cache clear: out of memory");
  }
  c->now = rda_cache_now_ns();
  rda_status st = rda_cache_each_target(rootfd, root, target, rda_cache_clear_target, c, err);
  close(rootfd);
  if (removed != NULL) *removed = c->removed;
  if (left != NULL) *left = c->left;
  if (st == RDA_OK && c->failed > 0)
    st = rda_err_set(err, RDA_ERR_CACHE,
                     "cache clear: %zu file%s or folder%s could not be removed or read, the "
                     "first: %s",
                     c->failed, c->failed == 1 ? "" : "s", c->failed == 1 ? "" : "s", c->first.msg);
  free(c);
  return st;
}

/* ================================================================== cubins */

/* The target folder ("sm_XX", cap 32) and the key of the cubin of `source` for sm_`arch`. */
static rda_status rda_cache_cubin_key(int arch, const char *source, char *target,
                                      rda_cache_key *key, rda_err *err) {
  char headers[65], compiler[64];
  snprintf(target, 32, "sm_%d", arch);
  RDA_TRY(rda_sources_digest("templates/", headers, err));
  const int nv = rda_nvrtc_version();
  /* The compiler's real target too: arch 90 compiles as sm_90a, and cubins made for plain
   * sm_90 (before that) must not be taken for it. */
  char real[16];
  snprintf(compiler, sizeof compiler, "nvrtc %d.%d %s", nv / 1000, nv % 1000 / 10,
           rda_nvrtc_target(arch, real));
  const rda_cache_inputs in = {
      target, source, headers, RDA_VERSION_STRING, compiler, rda_nvrtc_options()};
  rda_cache_key_of(&in, key);
  return RDA_OK;
}

/* rda_cache_cubin; with must_store, a compiled cubin that did not reach the disk is an error. */
static rda_status rda_cache_cubin_at(int arch, const char *name, const char *source,
                                     unsigned char **image, size_t *bytes, int *compiled,
                                     int must_store, rda_err *err) {
  *image = NULL;
  *bytes = 0;
  if (compiled != NULL) *compiled = 0;
  if (name == NULL || source == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_cache_cubin: name and source required");
  char target[32];
  rda_cache_key key;
  RDA_TRY(rda_cache_cubin_key(arch, source, target, &key, err));
  int hit = 0;
  char why[160];
  RDA_TRY(rda_cache_get(target, &key, source, image, bytes, &hit, why, sizeof why, err));
  if (hit) return RDA_OK;
  rda_nvrtc_out img;
  RDA_TRY(rda_nvrtc_compile(source, name, name, arch, 0, &img, err));
  rda_log(RDA_LOG_INFO, "compiled %s for %s in %.2f s (cache miss: %s)", name, target,
          img.compile_s, why);
  rda_err put = {0}; /* a cache that cannot take the entry (disk full) costs a recompile later */
  rda_status stored = RDA_OK;
  if (must_store) { /* rda_cache_put keeps an entry in memory only when the folder is unusable */
    char dir[kCachePath], unusable[1024];
    int usable = 0;
    stored =
        rda_cache_folder_try(target, dir, sizeof dir, &usable, unusable, sizeof unusable, &put);
    if (stored == RDA_OK && !usable) stored = rda_err_set(&put, RDA_ERR_CACHE, "%s", unusable);
  }
  if (stored == RDA_OK)
    stored = rda_cache_put(target, &key, name, source, img.image, img.image_bytes, &put);
  if (stored != RDA_OK) {
    if (must_store) {
      rda_nvrtc_out_free(&img);
      return rda_err_set(err, RDA_ERR_CACHE, "%s compiled for %s but not stored in the cache: %s",
                         name, target, put.msg);
    }
    rda_log(RDA_LOG_INFO, "%s not cached: %s", name, put.msg);
  }
  *image = img.image; /* hand the buffer over */
  *bytes = img.image_bytes;
  img.image = NULL;
  if (compiled != NULL) *compiled = 1;
  rda_nvrtc_out_free(&img);
  return RDA_OK;
}

rda_status rda_cache_cubin(int arch, const char *name, const char *source, unsigned char **image,
                           size_t *bytes, int *compiled, rda_err *err) {
  return rda_cache_cubin_at(arch, name, source, image, bytes, compiled, 0, err);
}

rda_status rda_cache_cubin_store(int arch, const char *name, const char *source, int *compiled,
                                 rda_err *err) {
  unsigned char *image = NULL;
  size_t bytes = 0;
  const rda_status st = rda_cache_cubin_at(arch, name, source, &image, &bytes, compiled, 1, err);
  free(image);
  return st;
}

rda_status rda_cache_cubin_stored(int arch, const char *source, int *stored,
                                  unsigned long long *bytes, rda_err *err) {
  *stored = 0;
  if (bytes != NULL) *bytes = 0;
  if (source == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_cache_cubin_stored: source required");
  char target[32], dir[kCachePath], path[kCachePath], why[1024];
  rda_cache_key key;
  RDA_TRY(rda_cache_cubin_key(arch, source, target, &key, err));
  int usable = 0;
  RDA_TRY(rda_cache_folder_at(target, 0, 0, dir, sizeof dir, &usable, why, sizeof why, err));
  if (!usable) return RDA_OK;
  RDA_TRY(rda_cache_path(path, sizeof path, err, dir, key.hex, ".rda"));
  struct stat st;
  if (lstat(path, &st) == 0 && S_ISREG(st.st_mode)) {
    *stored = 1;
    if (bytes != NULL) *bytes = (unsigned long long)st.st_size;
  }
  return RDA_OK;
}

/* ================================================================== bundles */

/* A minimal reader for the manifests `rdagen emit` writes: {"kernels": [{...}, ...]} whose
 * entries hold string and number members. */
typedef struct rda_cache_json {
  const char *p, *end;
} rda_cache_json;

static void rda_cache_ws(rda_cache_json *j) {
  while (j->p < j->end && isspace((unsigned char)*j->p)) ++j->p;
}

/* Parse a string into out (cap bytes; longer strings are cut); 0 on a syntax error. */
static int rda_cache_jstring(rda_cache_json *j, char *out, size_t cap) {
  rda_cache_ws(j);
  if (j->p >= j->end || *j->p != '"') return 0;
  ++j->p;
  size_t n = 0;
  while (j->p < j->end && *j->p != '"') {
    char c = *j->p++;
    if (c == '\\') {
      if (j->p >= j->end) return 0;
      c = *j->p++;
      if (c == 'u') { /* not in our names: keep a placeholder */
        if (j->end - j->p < 4) return 0;
        j->p += 4;
        c = '?';
      } else if (c == 'n') {
        c = '\n';
      } else if (c == 't') {
        c = '\t';
      } else if (c == 'r') {
        c = '\r';
      } else if (c == 'b') {
        c = '\b';
      } else if (c == 'f') {
        c = '\f';
      }
    }
    if (n + 1 < cap) out[n++] = c;
  }
  if (j->p >= j->end) return 0;
  ++j->p;
  if (cap > 0) out[n] = '\0';
  return 1;
}

/* Skip any value; 0 on a syntax error. */
static int rda_cache_jskip(rda_cache_json *j, int depth) {
  rda_cache_ws(j);
  if (j->p >= j->end || depth > 32) return 0;
  const char c = *j->p;
  if (c == '"') {
    char sink[1];
    return rda_cache_jstring(j, sink, 0);
  }
  if (c == '{' || c == '[') {
    const char close = c == '{' ? '}' : ']';
    ++j->p;
    rda_cache_ws(j);
    if (j->p < j->end && *j->p == close) {
      ++j->p;
      return 1;
    }
    for (;;) {
      if (c == '{') {
        char sink[1];
        if (!rda_cache_jstring(j, sink, 0)) return 0;
        rda_cache_ws(j);
        if (j->p >= j->end || *j->p++ != ':') return 0;
      }
      if (!rda_cache_jskip(j, depth + 1)) return 0;
      rda_cache_ws(j);
      if (j->p >= j->end) return 0;
      if (*j->p == ',') {
        ++j->p;
        continue;
      }
      if (*j->p++ != close) return 0;
      return 1;
    }
  }
  const char *start = j->p;
  while (j->p < j->end && (isalnum((unsigned char)*j->p) || strchr("+-.", *j->p) != NULL)) ++j->p;
  return j->p > start;
}

typedef struct rda_cache_bundle_entry {
  char name[160], arch[32], cubin[512], sha[80], cubin_sha[80];
} rda_cache_bundle_entry;

/* Parse one kernel object into e; 0 on a syntax error. */
static int rda_cache_jentry(rda_cache_json *j, rda_cache_bundle_entry *e) {
  memset(e, 0, sizeof *e);
  rda_cache_ws(j);
  if (j->p >= j->end || *j->p++ != '{') return 0;
  rda_cache_ws(j);
  if (j->p < j->end && *j->p == '}') {
    ++j->p;
    return 1;
  }
  for (;;) {
    char key[64];
    if (!rda_cache_jstring(j, key, sizeof key)) return 0;
    rda_cache_ws(j);
    if (j->p >= j->end || *j->p++ != ':') return 0;
    rda_cache_ws(j);
    char *dst = strcmp(key, "name") == 0            ? e->name
                : strcmp(key, "arch") == 0          ? e->arch
                : strcmp(key, "cubin") == 0         ? e->cubin
                : strcmp(key, "source_sha256") == 0 ? e->sha
                : strcmp(key, "cubin_sha256") == 0  ? e->cubin_sha
                                                    : NULL;
    const size_t cap = dst == e->name    ? sizeof e->name
                       : dst == e->arch  ? sizeof e->arch
                       : dst == e->cubin ? sizeof e->cubin
                                         : sizeof e->sha; /* == sizeof e->cubin_sha */
    if (dst != NULL && j->p < j->end && *j->p == '"') {
      if (!rda_cache_jstring(j, dst, cap)) return 0;
    } else if (!rda_cache_jskip(j, 1)) {
      return 0;
    }
    rda_cache_ws(j);
    if (j->p >= j->end) return 0;
    if (*j->p == ',') {
      ++j->p;
      continue;
    }
    return *j->p++ == '}';
  }
}

/* The bundles already warned about (no cubin_sha256, a malformed manifest): one warning per
 * bundle and kind per process, not one per kernel load. A fixed table: past it, further
 * bundles are warned about again. */
static pthread_mutex_t rda_cache_old_bundle_mu = PTHREAD_MUTEX_INITIALIZER;
static char rda_cache_old_bundles[16][65]; /* SHA-256 of the kind and the folder's path */
static int rda_cache_old_bundle_count;

/* 1 the first time `folder` is seen here for `kind`. */
static int rda_cache_bundle_warn_first(const char *kind, const char *folder) {
  char id[65], both[kCachePath + 32];
  snprintf(both, sizeof both, "%s:%s", kind, folder);
  rda_cache_sha256_hex(both, strlen(both), id);
  int first = 1;
  pthread_mutex_lock(&rda_cache_old_bundle_mu);
  for (int i = 0; i < rda_cache_old_bundle_count && first; ++i)
    first = strcmp(rda_cache_old_bundles[i], id) != 0;
  if (first && rda_cache_old_bundle_count < 16)
    memcpy(rda_cache_old_bundles[rda_cache_old_bundle_count++], id, sizeof id);
  pthread_mutex_unlock(&rda_cache_old_bundle_mu);
  return first;
}

/* The cubin of a matching bundle entry, read (never blocking: rda_cache_read_file) and checked
 * against the entry's "cubin_sha256"; 1 when it is sound (*image malloc'd), else 0 and logged:
 * the cache or NVRTC serve instead. */
static int rda_cache_bundle_cubin(const char *folder, const rda_cache_bundle_entry *e,
                                  const char *file, unsigned char **image, size_t *bytes) {
  if (strlen(e->cubin_sha) != 64) {
    /* A bundle from before cubin_sha256 was recorded: its cubins cannot be verified, so none is
     * used; said at warning level (the default), since the user has to re-emit it. */
    if (rda_cache_bundle_warn_first("old", folder))
      rda_log(RDA_LOG_WARN,
              "bundle %s was written by an older rdagen emit (no cubin_sha256 in its "
              "manifest.json): its kernels are not used; re-run rdagen emit for it",
              folder);
    return 0;
  }
  unsigned char *buf = NULL;
  size_t n = 0;
  rda_err why = {0};
  if (rda_cache_read_file(file, &buf, &n, &why) != RDA_OK) {
    rda_log(RDA_LOG_INFO, "bundle cubin not used: %s", why.msg);
    return 0;
  }
  char hex[65];
  rda_cache_sha256_hex(buf, n, hex);
  if (strcmp(hex, e->cubin_sha) != 0) {
    rda_log(RDA_LOG_INFO,
            "bundle cubin %s does not match the cubin_sha256 of %s/manifest.json (changed or "
            "damaged): not used",
            file, folder);
    free(buf);
    return 0;
  }
  *image = buf;
  *bytes = n;
  return 1;
}

/* Search one manifest; RDA_ERR_CACHE when it is malformed (the caller passes it over). */
static rda_status rda_cache_bundle_one(const char *folder, const char *text, size_t n,
                                       const char *name, const char *arch, const char *sha,
                                       char *file, size_t cap, unsigned char **image, size_t *bytes,
                                       int *found, rda_err *err) {
  rda_cache_json j = {text, text + n};
  rda_cache_ws(&j);
  int ok = j.p < j.end && *j.p++ == '{';
  while (ok) {
    char key[64];
    ok = rda_cache_jstring(&j, key, sizeof key);
    rda_cache_ws(&j);
    ok = ok && j.p < j.end && *j.p++ == ':';
    if (!ok) break;
    rda_cache_ws(&j);
    if (strcmp(key, "kernels") == 0 && j.p < j.end && *j.p == '[') {
      ++j.p;
      rda_cache_ws(&j);
      if (j.p < j.end && *j.p == ']') {
        ++j.p;
      } else {
        for (;;) {
          rda_cache_bundle_entry e;
          if (!(ok = rda_cache_jentry(&j, &e))) break;
          const int match = !*found && strcmp(e.name, name) == 0 &&
                            strcmp(e.arch, arch) == 0 && strcmp(e.sha, sha) == 0;
          if (match && (e.cubin[0] == '\0' || strstr(e.cubin, "..") != NULL || e.cubin[0] == '/')) {
            /* Only a file inside the bundle's folder is one of its cubins. */
            rda_log(RDA_LOG_INFO, "bundle %s: the entry of %s names the cubin '%s' outside its "
                    "folder: not used", folder, name, e.cubin);
          } else if (match) {
            const int w = snprintf(file, cap, "%s/%s", folder, e.cubin);
            if (w > 0 && (size_t)w < cap)
              *found = rda_cache_bundle_cubin(folder, &e, file, image, bytes);
          }
          rda_cache_ws(&j);
          if (j.p < j.end && *j.p == ',') {
            ++j.p;
            continue;
          }
          ok = j.p < j.end && *j.p++ == ']';
          break;
        }
      }
    } else {
      ok = rda_cache_jskip(&j, 1);
    }
    if (!ok) break;
    rda_cache_ws(&j);
    if (j.p < j.end && *j.p == ',') {
      ++j.p;
      continue;
    }
    ok = j.p < j.end && *j.p == '}';
    break;
  }
  if (!ok) {
    *found = 0;
    free(*image);
    *image = NULL;
    *bytes = 0;
    return rda_err_set(err, RDA_ERR_CACHE, "kernel bundle '%s/manifest.json': malformed JSON",
                       folder);
  }
  return RDA_OK;
}

rda_status rda_cache_bundle_load(const char *path_list, const char *name, int arch,
                                 const char *source, unsigned char **image, size_t *bytes,
                                 char *file, size_t cap, int *found, rda_err *err) {
  *found = 0;
  *image = NULL;
  *bytes = 0;
  if (cap > 0) file[0] = '\0';
  if (path_list == NULL || path_list[0] == '\0') return RDA_OK;
  if (name == NULL || source == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_cache_bundle_find: name, source");
  char sha[65], archs[32];
  RDA_TRY(rda_cache_source_sha(source, sha, err));
  snprintf(archs, sizeof archs, "sm_%d", arch);
  for (const char *p = path_list; *p != '\0' && !*found;) {
    const char *colon = strchr(p, ':');
    const size_t len = colon ? (size_t)(colon - p) : strlen(p);
    if (len > 0 && len < kCachePath - 32) {
      char folder[kCachePath], manifest[kCachePath];
      memcpy(folder, p, len);
      folder[len] = '\0';
      memcpy(manifest, folder, len);
      memcpy(manifest + len, "/manifest.json", sizeof "/manifest.json");
      unsigned char *text = NULL;
      size_t n = 0;
      rda_err ignored = {0};
      if (rda_cache_read_file(manifest, &text, &n, &ignored) == RDA_OK) {
        rda_err bad = {0};
        const rda_status st = rda_cache_bundle_one(folder, (const char *)text, n, name, archs, sha,
                                                   file, cap, image, bytes, found, &bad);
        free(text);
        /* A damaged manifest is passed over like a damaged cubin: the other bundles, the
         * cache or NVRTC serve; said once per bundle, at warning level (someone must fix it). */
        if (st != RDA_OK && rda_cache_bundle_warn_first("malformed", folder))
          rda_log(RDA_LOG_WARN, "%s: skipped (RDA_KERNEL_PATH)", bad.msg);
      } else {
        rda_log(RDA_LOG_DEBUG, "RDA_KERNEL_PATH: no readable %s: skipped", manifest);
      }
    }
    p += len + (colon != NULL);
  }
  if (!*found && cap > 0) file[0] = '\0';
  return RDA_OK;
}

rda_status rda_cache_bundle_find(const char *path_list, const char *name, int arch,
                                 const char *source, char *file, size_t cap, int *found,
                                 rda_err *err) {
  unsigned char *image = NULL;
  size_t bytes = 0;
  const rda_status st =
      rda_cache_bundle_load(path_list, name, arch, source, &image, &bytes, file, cap, found, err);
  free(image);
  return st;
}
