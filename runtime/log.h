/* log.h — what rda tells about its work when asked: RDA_LOG=info (what was compiled or loaded,
 * from where, why, how long) or RDA_LOG=debug (also every cache hit); one line per event on
 * stderr, "rda: info: ...". Silent by default. The only place runtime/ writes anything. */
#ifndef RDA_LOG_H
#define RDA_LOG_H

typedef enum { RDA_LOG_OFF = 0, RDA_LOG_INFO = 1, RDA_LOG_DEBUG = 2 } rda_log_level;

/* The level $RDA_LOG asks for (read at each call: "info", "debug"; anything else is off). */
rda_log_level rda_log_level_now(void);

/* 1 when events of `level` are printed now. */
int rda_log_enabled(rda_log_level level);

/* Print "rda: <level>: <message>\n" on stderr (one write, newlines in the message become
 * blanks) when `level` is enabled. */
void rda_log(rda_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Seconds on a monotonic clock, for the "in 0.52 s" of the events. */
double rda_log_now(void);

#endif
