/* log.h — what rda tells about its work: warnings (something the user should act on, e.g. a
 * kernel bundle that can no longer be used) unless RDA_LOG=off; RDA_LOG=info also what was
 * compiled or loaded, from where, why, how long; RDA_LOG=debug also every cache hit. One line
 * per event on stderr, "rda: warning: ...", "rda: info: ...". The only place runtime/ writes
 * anything. */
#ifndef RDA_LOG_H
#define RDA_LOG_H

typedef enum {
  RDA_LOG_OFF = 0,
  RDA_LOG_WARN = 1,
  RDA_LOG_INFO = 2,
  RDA_LOG_DEBUG = 3
} rda_log_level;

/* The level $RDA_LOG asks for (read at each call: "off", "warn" (or unset, empty, "warning"),
 * "info", "debug"; anything else: warnings only, and the first time one warning saying so). */
rda_log_level rda_log_level_now(void);

/* 1 when events of `level` are printed now. */
int rda_log_enabled(rda_log_level level);

/* Print "rda: <level>: <message>\n" on stderr (one write, newlines in the message become
 * blanks) when `level` is enabled. */
void rda_log(rda_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Seconds on a monotonic clock, for the "in 0.52 s" of the events. */
double rda_log_now(void);

#endif
