/* cache.c — the kernel cache: SHA-256 content keys, a per-process memory map, checksummed disk
 * entries in one folder per target (atomic writes, refused unsafe folders, LRU eviction through
 * access records) and the lookup of ahead-of-time bundles written by `rdagen emit`. */
#include "cache.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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

rda_status rda_cache_check_folder(const char *path, rda_err *err) {
  struct stat st;
  if (stat(path, &st) != 0)
    return rda_err_set(err, RDA_ERR_CACHE, "cache folder '%s': %s", path, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return rda_err_set(err, RDA_ERR_CACHE, "cache folder '%s' is not a folder", path);
  if (st.st_uid != geteuid())
    return rda_err_set(err, RDA_ERR_CACHE,
                       "cache folder '%s' belongs to uid %ld, not to this user (uid %ld): "
                       "refusing to load kernels from it (set RDA_CACHE_DIR to a folder of yours)",
                       path, (long)st.st_uid, (long)geteuid());
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return rda_err_set(err, RDA_ERR_CACHE,
                       "cache folder '%s' is writable by group or others (mode %03o): refusing to "
                       "load kernels from it (chmod go-w it)",
                       path, (unsigned)(st.st_mode & 0777));
  return RDA_OK;
}

rda_status rda_cache_folder(const char *target, char *out, size_t cap, rda_err *err) {
  RDA_TRY(rda_cache_dir_get(NULL, out, cap, err));
  RDA_TRY(rda_cache_check_folder(out, err));
  if (target == NULL) return RDA_OK;
  if (target[0] == '\0' || target[0] == '.' || strchr(target, '/') != NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "cache target '%s': not a folder name",
                       target);
  RDA_TRY(rda_cache_dir_get(target, out, cap, err));
  return rda_cache_check_folder(out, err);
}

unsigned long long rda_cache_max_bytes(void) {
  const unsigned long long def = 1ull << 30;
  const char *v = getenv("RDA_CACHE_MAX_BYTES");
  if (v == NULL || v[0] == '\0') return def;
  char *end = NULL;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno != 0 || end == v) return def;
  switch (toupper((unsigned char)*end)) {
    case 'K':
      n <<= 10;
      ++end;
      break;
    case 'M':
      n <<= 20;
      ++end;
      break;
    case 'G':
      n <<= 30;
      ++end;
      break;
    default: break;
  }
  return *end == '\0' ? n : def;
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

rda_status rda_cache_read_file(const char *path, unsigned char **data, size_t *bytes,
                               rda_err *err) {
  *data = NULL;
  *bytes = 0;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return rda_err_set(err, RDA_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return rda_err_set(err, RDA_ERR_IO, "'%s' is not a readable file", path);
  }
  const size_t n = (size_t)st.st_size;
  unsigned char *buf = malloc(n + 1);
  if (buf == NULL) {
    close(fd);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "no memory to read '%s' (%zu bytes)", path, n);
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
    return rda_err_set(err, RDA_ERR_IO, "cannot read '%s': short read", path);
  }
  buf[n] = 0;
  *data = buf;
  *bytes = n;
  return RDA_OK;
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
  if (utimensat(AT_FDCWD, path, ts, 0) == 0) return;
  const int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) close(fd);
  (void)utimensat(AT_FDCWD, path, ts, 0);
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

rda_status rda_cache_get(const char *target, const rda_cache_key *key, const char *source,
                         unsigned char **data, size_t *bytes, int *hit, char *why, size_t why_cap,
                         rda_err *err) {
  *data = NULL;
  *bytes = 0;
  *hit = 0;
  if (why != NULL && why_cap > 0) why[0] = '\0';
  if (target == NULL || key == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_cache_get: target and key required");
  unsigned char *mem = rda_cache_mem_get(target, key->hex, bytes);
  if (mem != NULL) { /* no file system work at all (the disk entry was touched when loaded) */
    *data = mem;
    *hit = 1;
    return RDA_OK;
  }
  char dir[kCachePath], path[kCachePath];
  RDA_TRY(rda_cache_folder(target, dir, sizeof dir, err));
  RDA_TRY(rda_cache_path(path, sizeof path, err, dir, key->hex, ".rda"));
  unsigned char *buf = NULL;
  size_t n = 0;
  rda_err ignored = {0};
  if (rda_cache_read_file(path, &buf, &n, &ignored) != RDA_OK) {
    if (why != NULL) snprintf(why, why_cap, "not on disk");
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

rda_status rda_cache_put(const char *target, const rda_cache_key *key, const char *name,
                         const char *source, const void *data, size_t bytes, rda_err *err) {
  if (target == NULL || key == NULL || (data == NULL && bytes > 0))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_cache_put: target, key, data required");
  static atomic_ulong counter;
  char dir[kCachePath], path[kCachePath], tmp[kCachePath];
  RDA_TRY(rda_cache_folder(target, dir, sizeof dir, err));
  RDA_TRY(rda_cache_path(path, sizeof path, err, dir, key->hex, ".rda"));
  char suffix[64];
  snprintf(suffix, sizeof suffix, ".tmp.%ld.%lu", (long)getpid(), atomic_fetch_add(&counter, 1));
  RDA_TRY(rda_cache_path(tmp, sizeof tmp, err, dir, key->hex, suffix));

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

  const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
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
  if (st == RDA_OK && rename(tmp, path) != 0)
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
  return rda_cache_evict(rda_cache_max_bytes(), key->hex, NULL, err);
}

/* ================================================================== listing, eviction */

typedef struct rda_cache_list_acc {
  rda_cache_entry_info *v;
  size_t n, cap;
} rda_cache_list_acc;

static int rda_cache_ends_with(const char *s, const char *suffix) {
  const size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static long long rda_cache_mtime_ns(const struct stat *st) {
  return (long long)st->st_mtim.tv_sec * 1000000000ll + st->st_mtim.tv_nsec;
}

static void rda_cache_rmtree(const char *path);

/* Temporary files older than this were left by a process that died mid-write: removed. */
static const long long rda_cache_stale_ns = 3600ll * 1000000000ll;

/* Add the entries of one target folder. `verify`: read each whole entry and check it. */
static rda_status rda_cache_scan(const char *dir, const char *target, int verify,
                                 rda_cache_list_acc *acc, rda_err *err) {
  DIR *d = opendir(dir);
  if (d == NULL) return RDA_OK; /* no folder, no entries */
  rda_status st = RDA_OK;
  const long long now = rda_cache_now_ns();
  for (struct dirent *e; st == RDA_OK && (e = readdir(d)) != NULL;) {
    if (strstr(e->d_name, ".tmp.") != NULL) {
      char tmp[kCachePath];
      struct stat tb;
      if (snprintf(tmp, sizeof tmp, "%s/%s", dir, e->d_name) < (int)sizeof tmp &&
          lstat(tmp, &tb) == 0 && now - rda_cache_mtime_ns(&tb) > rda_cache_stale_ns) {
        if (S_ISDIR(tb.st_mode))
          rda_cache_rmtree(tmp);
        else
          unlink(tmp);
      }
      continue;
    }
    if (!rda_cache_ends_with(e->d_name, ".rda") || strlen(e->d_name) != 64 + 4) continue;
    char path[kCachePath];
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    struct stat sb;
    if (stat(path, &sb) != 0) continue; /* evicted meanwhile */
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
    char use[kCachePath];
    struct stat ub;
    if (rda_cache_path(use, sizeof use, NULL, dir, info->key, ".use") == RDA_OK &&
        stat(use, &ub) == 0)
      info->last_use_ns = rda_cache_mtime_ns(&ub);
    if (!verify) continue;
    unsigned char *buf = NULL;
    size_t n = 0;
    rda_err ignored = {0};
    if (rda_cache_read_file(path, &buf, &n, &ignored) != RDA_OK) continue;
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

static rda_status rda_cache_list_any(const char *target, int verify, rda_cache_entry_info **out,
                                     size_t *count, rda_err *err) {
  *out = NULL;
  *count = 0;
  char root[kCachePath];
  RDA_TRY(rda_cache_folder(NULL, root, sizeof root, err));
  rda_cache_list_acc acc = {0};
  rda_status st = RDA_OK;
  DIR *d = opendir(root);
  if (d == NULL)
    return rda_err_set(err, RDA_ERR_CACHE, "cache folder '%s': %s", root, strerror(errno));
  for (struct dirent *e; st == RDA_OK && (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    if (target != NULL && strcmp(target, e->d_name) != 0) continue;
    char dir[kCachePath];
    struct stat sb;
    if (snprintf(dir, sizeof dir, "%s/%s", root, e->d_name) >= (int)sizeof dir) continue;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
    st = rda_cache_scan(dir, e->d_name, verify, &acc, err);
  }
  closedir(d);
  if (st != RDA_OK) {
    free(acc.v);
    return st;
  }
  if (acc.n > 1) qsort(acc.v, acc.n, sizeof *acc.v, rda_cache_by_use);
  *out = acc.v;
  *count = acc.n;
  return RDA_OK;
}

rda_status rda_cache_list(const char *target, rda_cache_entry_info **out, size_t *count,
                          rda_err *err) {
  return rda_cache_list_any(target, 1, out, count, err);
}

/* Remove one entry and its access record. */
static void rda_cache_remove(const char *root, const rda_cache_entry_info *e) {
  char path[kCachePath];
  if (snprintf(path, sizeof path, "%s/%s/%s.rda", root, e->target, e->key) < (int)sizeof path)
    unlink(path);
  if (snprintf(path, sizeof path, "%s/%s/%s.use", root, e->target, e->key) < (int)sizeof path)
    unlink(path);
}

rda_status rda_cache_evict(unsigned long long max_bytes, const char *keep, size_t *removed,
                           rda_err *err) {
  if (removed != NULL) *removed = 0;
  rda_cache_entry_info *v = NULL;
  size_t n = 0;
  RDA_TRY(rda_cache_list_any(NULL, 0, &v, &n, err));
  unsigned long long total = 0;
  for (size_t i = 0; i < n; ++i) total += v[i].bytes;
  char root[kCachePath];
  rda_status st = total > max_bytes ? rda_cache_folder(NULL, root, sizeof root, err) : RDA_OK;
  for (size_t i = 0; st == RDA_OK && i < n && total > max_bytes; ++i) {
    if (keep != NULL && strcmp(v[i].key, keep) == 0) continue;
    rda_cache_remove(root, &v[i]);
    total -= v[i].bytes;
    if (removed != NULL) ++*removed;
    rda_log(RDA_LOG_DEBUG, "evicted %s/%s.rda (least recently used; cache over %llu bytes)",
            v[i].target, v[i].key, max_bytes);
  }
  free(v);
  return st;
}

/* rm -r of a folder the cache made (headers for the emulator). */
static void rda_cache_rmtree(const char *path) {
  DIR *d = opendir(path);
  if (d != NULL) {
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      char sub[kCachePath];
      if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) continue;
      struct stat sb;
      if (lstat(sub, &sb) == 0 && S_ISDIR(sb.st_mode))
        rda_cache_rmtree(sub);
      else
        unlink(sub);
    }
    closedir(d);
  }
  rmdir(path);
}

rda_status rda_cache_clear(const char *target, size_t *removed, rda_err *err) {
  if (removed != NULL) *removed = 0;
  char root[kCachePath];
  RDA_TRY(rda_cache_folder(NULL, root, sizeof root, err));
  DIR *d = opendir(root);
  if (d == NULL)
    return rda_err_set(err, RDA_ERR_CACHE, "cache folder '%s': %s", root, strerror(errno));
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    if (target != NULL && strcmp(target, e->d_name) != 0) continue;
    char dir[kCachePath];
    struct stat sb;
    if (snprintf(dir, sizeof dir, "%s/%s", root, e->d_name) >= (int)sizeof dir) continue;
    if (lstat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
    DIR *t = opendir(dir);
    if (t == NULL) continue;
    for (struct dirent *f; (f = readdir(t)) != NULL;) {
      if (f->d_name[0] == '.') continue;
      char path[kCachePath];
      if (snprintf(path, sizeof path, "%s/%s", dir, f->d_name) >= (int)sizeof path) continue;
      if (rda_cache_ends_with(f->d_name, ".rda")) {
        if (unlink(path) == 0 && removed != NULL) ++*removed;
      } else if (rda_cache_ends_with(f->d_name, ".use") || strstr(f->d_name, ".tmp.") != NULL) {
        unlink(path);
      } else if (strncmp(f->d_name, "inc-", 4) == 0) {
        rda_cache_rmtree(path);
      }
    }
    closedir(t);
  }
  closedir(d);
  rda_cache_memory_clear();
  return RDA_OK;
}

/* ================================================================== cubins */

rda_status rda_cache_cubin(int arch, const char *name, const char *source, unsigned char **image,
                           size_t *bytes, int *compiled, rda_err *err) {
  *image = NULL;
  *bytes = 0;
  if (compiled != NULL) *compiled = 0;
  if (name == NULL || source == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_cache_cubin: name and source required");
  char target[32], headers[65], compiler[64];
  snprintf(target, sizeof target, "sm_%d", arch);
  RDA_TRY(rda_sources_digest("templates/", headers, err));
  const int nv = rda_nvrtc_version();
  /* The compiler's real target too: arch 90 compiles as sm_90a, and cubins made for plain
   * sm_90 (before that) must not be taken for it. */
  char real[16];
  snprintf(compiler, sizeof compiler, "nvrtc %d.%d %s", nv / 1000, nv % 1000 / 10,
           rda_nvrtc_target(arch, real));
  const rda_cache_inputs in = {
      target, source, headers, RDA_VERSION_STRING, compiler, rda_nvrtc_options()};
  rda_cache_key key;
  rda_cache_key_of(&in, &key);
  int hit = 0;
  char why[160];
  RDA_TRY(rda_cache_get(target, &key, source, image, bytes, &hit, why, sizeof why, err));
  if (hit) return RDA_OK;
  rda_nvrtc_out img;
  RDA_TRY(rda_nvrtc_compile(source, name, name, arch, 0, &img, err));
  rda_log(RDA_LOG_INFO, "compiled %s for %s in %.2f s (cache miss: %s)", name, target,
          img.compile_s, why);
  rda_err put = {0}; /* a cache that cannot take the entry (disk full) costs a recompile later */
  if (rda_cache_put(target, &key, name, source, img.image, img.image_bytes, &put) != RDA_OK)
    rda_log(RDA_LOG_INFO, "%s not cached: %s", name, put.msg);
  *image = img.image; /* hand the buffer over */
  *bytes = img.image_bytes;
  img.image = NULL;
  if (compiled != NULL) *compiled = 1;
  rda_nvrtc_out_free(&img);
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
  char name[160], arch[32], cubin[512], sha[80];
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
                                                    : NULL;
    const size_t cap = dst == e->name    ? sizeof e->name
                       : dst == e->arch  ? sizeof e->arch
                       : dst == e->cubin ? sizeof e->cubin
                                         : sizeof e->sha;
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

/* Search one manifest; RDA_ERR_CACHE when it is malformed. */
static rda_status rda_cache_bundle_one(const char *folder, const char *text, size_t n,
                                       const char *name, const char *arch, const char *sha,
                                       char *file, size_t cap, int *found, rda_err *err) {
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
          if (!*found && strcmp(e.name, name) == 0 && strcmp(e.arch, arch) == 0 &&
              strcmp(e.sha, sha) == 0 && e.cubin[0] != '\0' && strstr(e.cubin, "..") == NULL &&
              e.cubin[0] != '/') {
            const int w = snprintf(file, cap, "%s/%s", folder, e.cubin);
            if (w > 0 && (size_t)w < cap && access(file, R_OK) == 0) *found = 1;
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
    return rda_err_set(err, RDA_ERR_CACHE, "kernel bundle '%s/manifest.json': malformed JSON",
                       folder);
  }
  return RDA_OK;
}

rda_status rda_cache_bundle_find(const char *path_list, const char *name, int arch,
                                 const char *source, char *file, size_t cap, int *found,
                                 rda_err *err) {
  *found = 0;
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
        const rda_status st = rda_cache_bundle_one(folder, (const char *)text, n, name, archs, sha,
                                                   file, cap, found, err);
        free(text);
        RDA_TRY(st);
      } else {
        rda_log(RDA_LOG_DEBUG, "RDA_KERNEL_PATH: no readable %s: skipped", manifest);
      }
    }
    p += len + (colon != NULL);
  }
  if (!*found && cap > 0) file[0] = '\0';
  return RDA_OK;
}
