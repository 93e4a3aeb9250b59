/* cache_dir.c — the run-time cache root ($RDA_CACHE_DIR, $XDG_CACHE_HOME/rda, $HOME/.cache/rda)
 * and mkdir -p for its subfolders. Safe against other processes creating the same folders at
 * the same time (EEXIST is success). */
#include "cache_dir.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

rda_status rda_cache_dir_mkdirs(const char *path, rda_err *err) {
  char buf[4096];
  const size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf)
    return rda_err_set(err, RDA_ERR_CACHE, "cache folder '%s': empty or too long", path);
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; ++i) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    const char saved = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0700) != 0 && errno != EEXIST)
      return rda_err_set(err, RDA_ERR_CACHE, "cache folder '%s': mkdir: %s", buf, strerror(errno));
    buf[i] = saved;
  }
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
    return rda_err_set(err, RDA_ERR_CACHE, "cache folder '%s': not a folder", path);
  return RDA_OK;
}

rda_status rda_cache_dir_path(const char *sub, char *out, size_t cap, rda_err *err) {
  const char *root = getenv("RDA_CACHE_DIR");
  const char *suffix = "";
  if (root == NULL || root[0] == '\0') {
    root = getenv("XDG_CACHE_HOME");
    suffix = "/rda";
  }
  if (root == NULL || root[0] == '\0') {
    root = getenv("HOME");
    suffix = "/.cache/rda";
  }
  if (root == NULL || root[0] == '\0')
    return rda_err_set(
        err, RDA_ERR_CACHE,
        "no cache folder: set RDA_CACHE_DIR (neither XDG_CACHE_HOME nor HOME is set)");
  const int len =
      snprintf(out, cap, "%s%s%s%s", root, suffix, (sub && sub[0]) ? "/" : "", sub ? sub : "");
  if (len < 0 || (size_t)len >= cap)
    return rda_err_set(err, RDA_ERR_CACHE, "cache folder under '%s': path too long", root);
  return RDA_OK;
}

rda_status rda_cache_dir_get(const char *sub, char *out, size_t cap, rda_err *err) {
  RDA_TRY(rda_cache_dir_path(sub, out, cap, err));
  return rda_cache_dir_mkdirs(out, err);
}
