/* sources.c — serves gen/, tuning/ and templates/ files: from the copies embedded at build time
 * (rda_sources_data.c, made by cmake/embed.cmake), or from the tree $RDA_HOME names when set,
 * so a developer's edits take effect without a rebuild. */
#include "sources.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

const char *rda_sources_home(void) {
  const char *h = getenv("RDA_HOME");
  return h != NULL && h[0] != '\0' ? h : NULL;
}

size_t rda_sources_count(void) {
  return rda_sources_table_count;
}

const char *rda_sources_name(size_t i) {
  return i < rda_sources_table_count ? rda_sources_table[i].name : NULL;
}

static const rda_sources_entry *rda_sources_find(const char *name) {
  for (size_t i = 0; i < rda_sources_table_count; ++i)
    if (strcmp(rda_sources_table[i].name, name) == 0) return &rda_sources_table[i];
  return NULL;
}

rda_status rda_sources_read(const char *name, char **text, size_t *len, rda_err *err) {
  *text = NULL;
  if (len != NULL) *len = 0;
  if (name == NULL || name[0] == '\0' || name[0] == '/' || strstr(name, "..") != NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda source '%s': not a relative name",
                       name ? name : "(null)");
  const char *home = rda_sources_home();
  if (home != NULL) {
    char path[4096];
    const int n = snprintf(path, sizeof path, "%s/%s", home, name);
    if (n < 0 || (size_t)n >= sizeof path)
      return rda_err_set(err, RDA_ERR_IO, "RDA_HOME/%s: path too long", name);
    unsigned char *data = NULL;
    size_t bytes = 0;
    rda_err why = {0};
    if (rda_cache_read_file(path, &data, &bytes, &why) != RDA_OK)
      return rda_err_set(err, RDA_ERR_IO, "%s (RDA_HOME must name an rda source tree)", why.msg);
    *text = (char *)data;
    if (len != NULL) *len = bytes;
    return RDA_OK;
  }
  const rda_sources_entry *e = rda_sources_find(name);
  if (e == NULL)
    return rda_err_set(err, RDA_ERR_IO, "'%s' is not among the sources embedded in librda", name);
  char *copy = malloc(e->len + 1);
  if (copy == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "no memory for '%s'", name);
  memcpy(copy, e->data, e->len + 1);
  *text = copy;
  if (len != NULL) *len = e->len;
  return RDA_OK;
}

int rda_sources_exists(const char *name) {
  char *text = NULL;
  if (rda_sources_read(name, &text, NULL, NULL) != RDA_OK) return 0;
  free(text);
  return 1;
}

static rda_status rda_sources_digest_now(const char *prefix, char out[65], rda_err *err) {
  rda_cache_sha256 s;
  rda_cache_sha256_init(&s);
  const size_t plen = strlen(prefix);
  for (size_t i = 0; i < rda_sources_table_count; ++i) {
    const char *name = rda_sources_table[i].name;
    if (strncmp(name, prefix, plen) != 0) continue;
    char *text = NULL;
    size_t n = 0;
    RDA_TRY(rda_sources_read(name, &text, &n, err));
    const uint64_t lens[2] = {strlen(name), n};
    rda_cache_sha256_update(&s, &lens[0], sizeof lens[0]);
    rda_cache_sha256_update(&s, name, (size_t)lens[0]);
    rda_cache_sha256_update(&s, &lens[1], sizeof lens[1]);
    rda_cache_sha256_update(&s, text, n);
    free(text);
  }
  unsigned char d[32];
  rda_cache_sha256_final(&s, d);
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) {
    out[2 * i] = digits[d[i] >> 4];
    out[2 * i + 1] = digits[d[i] & 15];
  }
  out[64] = '\0';
  return RDA_OK;
}

/* Embedded contents never change: one digest per prefix, computed once. */
enum { kSourcesMemo = 8 };
static pthread_mutex_t rda_sources_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  char prefix[32];
  char hex[65];
} rda_sources_memo[kSourcesMemo];
static int rda_sources_nmemo;

rda_status rda_sources_digest(const char *prefix, char out[65], rda_err *err) {
  if (prefix == NULL) prefix = "";
  if (rda_sources_home() != NULL || strlen(prefix) >= sizeof rda_sources_memo[0].prefix)
    return rda_sources_digest_now(prefix, out, err);
  pthread_mutex_lock(&rda_sources_mu);
  for (int i = 0; i < rda_sources_nmemo; ++i) {
    if (strcmp(rda_sources_memo[i].prefix, prefix) == 0) {
      memcpy(out, rda_sources_memo[i].hex, 65);
      pthread_mutex_unlock(&rda_sources_mu);
      return RDA_OK;
    }
  }
  const rda_status st = rda_sources_digest_now(prefix, out, err);
  if (st == RDA_OK && rda_sources_nmemo < kSourcesMemo) {
    snprintf(rda_sources_memo[rda_sources_nmemo].prefix, sizeof rda_sources_memo[0].prefix, "%s",
             prefix);
    memcpy(rda_sources_memo[rda_sources_nmemo].hex, out, 65);
    ++rda_sources_nmemo;
  }
  pthread_mutex_unlock(&rda_sources_mu);
  return st;
}
