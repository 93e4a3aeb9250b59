/* err.h — how internal functions report failure: a status plus a one-line message.
 * Every fallible internal function takes an rda_err * (may be NULL) and returns rda_status;
 * the first error set wins, so the innermost, most specific message survives. */
#ifndef RDA_ERR_H
#define RDA_ERR_H

#include "rda.h"

#include <stdarg.h>
#include <stddef.h>

typedef struct rda_err {
  rda_status status;
  char msg[1024];
} rda_err;

/* Copies text into out[cap]; text too long to fit is shortened first (and text changed): its
 * longest words (runs without a space: paths, mostly) lose their middles to "...", so a long
 * path cannot push the reason after it out of a message. */
void rda_text_fit(char *out, size_t cap, char *text);

/* vsnprintf into out[cap], shortened by rda_text_fit when the whole does not fit. */
void rda_text_vformat(char *out, size_t cap, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Records the message (printf format; rda_text_vformat) unless one is already recorded;
 * returns s. */
rda_status rda_err_set(rda_err *e, rda_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Forget a recorded error (to retry, or to report a different one). */
void rda_err_clear(rda_err *e);

/* Propagate a failure: evaluates expr once; returns its status when it is not RDA_OK. */
#define RDA_TRY(expr)                      \
  do {                                     \
    rda_status rda_try_s_ = (expr);        \
    if (rda_try_s_ != RDA_OK) return rda_try_s_; \
  } while (0)

#endif
