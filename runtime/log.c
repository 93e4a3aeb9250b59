/* log.c — warnings, and with RDA_LOG=info|debug one line per compile, load or cache event on
 * stderr, so that a cold compile never looks like a hang. Each line is written with one write(2),
 * so lines of concurrent threads and processes do not interleave. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

rda_log_level rda_log_level_now(void) {
  const char *v = getenv("RDA_LOG");
  if (v == NULL || v[0] == '\0' || strcmp(v, "warn") == 0 || strcmp(v, "warning") == 0)
    return RDA_LOG_WARN;
  if (strcmp(v, "debug") == 0) return RDA_LOG_DEBUG;
  if (strcmp(v, "info") == 0) return RDA_LOG_INFO;
  if (strcmp(v, "off") == 0) return RDA_LOG_OFF;
  /* A misspelt level is said once per process, not taken silently for the default (a log
   * setting never fails the work itself). */
  static atomic_int warned;
  if (!atomic_exchange(&warned, 1)) {
    char shown[65]; /* the value as given, control characters as '?' */
    size_t n = 0;
    for (; v[n] != '\0' && n + 1 < sizeof shown; n++)
      shown[n] = (unsigned char)v[n] < 0x20 || v[n] == 0x7f ? '?' : v[n];
    shown[n] = '\0';
    rda_log(RDA_LOG_WARN, "RDA_LOG='%s' is not off, warn, info or debug: warnings only", shown);
  }
  return RDA_LOG_WARN;
}

int rda_log_enabled(rda_log_level level) {
  return level != RDA_LOG_OFF && rda_log_level_now() >= level;
}

void rda_log(rda_log_level level, const char *fmt, ...) {
  if (!rda_log_enabled(level)) return;
  char line[1200];
  static const char *const names[] = {"off", "warning", "info", "debug"};
  int n = snprintf(line, sizeof line, "rda: %s: ", names[level]);
  if (n < 0) return;
  va_list ap;
  va_start(ap, fmt);
  const int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (m < 0) return;
  size_t len = strlen(line);
  for (size_t i = (size_t)n; i < len; ++i)
    if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
  line[len++] = '\n';
  for (size_t off = 0; off < len;) {
    const ssize_t w = write(2, line + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += (size_t)w;
  }
}

double rda_log_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
