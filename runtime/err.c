/* err.c — status names and the first-error-wins message slot. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *rda_status_string(rda_status s) {
  switch (s) {
    case RDA_OK: return "RDA_OK";
    case RDA_ERR_INVALID_ARGUMENT: return "RDA_ERR_INVALID_ARGUMENT";
    case RDA_ERR_CONFIG: return "RDA_ERR_CONFIG";
    case RDA_ERR_NVRTC: return "RDA_ERR_NVRTC";
    case RDA_ERR_CUDA: return "RDA_ERR_CUDA";
    case RDA_ERR_NCCL: return "RDA_ERR_NCCL";
    case RDA_ERR_CACHE: return "RDA_ERR_CACHE";
    case RDA_ERR_IO: return "RDA_ERR_IO";
    case RDA_ERR_OUT_OF_MEMORY: return "RDA_ERR_OUT_OF_MEMORY";
    case RDA_ERR_UNSUPPORTED: return "RDA_ERR_UNSUPPORTED";
    case RDA_ERR_INTERNAL: return "RDA_ERR_INTERNAL";
    case RDA_ERR_EMULATOR: return "RDA_ERR_EMULATOR";
  }
  return "RDA_ERR_UNKNOWN";
}

unsigned rda_version(void) { return RDA_VERSION_NUMBER; }

/* The longest run of text[0..len) without a space: [*at, *at + return). */
static size_t rda_longest_word(const char *text, size_t len, size_t *at) {
  size_t best = 0, i = 0;
  *at = 0;
  while (i < len) {
    while (i < len && text[i] == ' ') i++;
    const size_t a = i;
    while (i < len && text[i] != ' ') i++;
    if (i - a > best) best = i - a, *at = a;
  }
  return best;
}

/* A UTF-8 continuation byte: never the first byte of a character. */
static int rda_text_continues(char c) {
  return ((unsigned char)c & 0xC0) == 0x80;
}

void rda_text_fit(char *out, size_t cap, char *text) {
  if (cap == 0) return;
  size_t len = strlen(text);
  /* A word keeps a third of what is left of it before the "..." and the rest after: a path's
   * end names the file. Words of 16 bytes or fewer are left whole; no character is split. */
  while (len >= cap) {
    size_t at = 0;
    const size_t n = rda_longest_word(text, len, &at);
    if (n <= 16) break;
    const size_t excess = len - (cap - 1);
    const size_t cut = excess + 3 < n - 13 ? excess + 3 : n - 13; /* keep 13 + "..." */
    const size_t keep = n - cut;
    size_t h = at + keep / 3, t = at + n - (keep - keep / 3); /* [h, t) goes */
    while (h > at && rda_text_continues(text[h])) h--;
    while (t < at + n && rda_text_continues(text[t])) t++;
    memcpy(text + h, "...", 3); /* t - h >= cut >= 4: the tail is not written over */
    memmove(text + h + 3, text + t, len - t + 1);
    len -= t - h - 3;
  }
  size_t n = len < cap ? len : cap - 1;
  while (n > 0 && n < len && rda_text_continues(text[n])) n--;
  memcpy(out, text, n);
  out[n] = '\0';
}

void rda_text_vformat(char *out, size_t cap, const char *fmt, va_list ap) {
  va_list again;
  va_copy(again, ap);
  const int n = vsnprintf(out, cap, fmt, ap);
  if (n >= 0 && (size_t)n >= cap) {
    char *whole = malloc((size_t)n + 1);
    if (whole != NULL) { /* else the cut-off text already in out */
      vsnprintf(whole, (size_t)n + 1, fmt, again);
      rda_text_fit(out, cap, whole);
      free(whole);
    }
  }
  va_end(again);
}

rda_status rda_err_set(rda_err *e, rda_status s, const char *fmt, ...) {
  if (e == NULL || e->status != RDA_OK) return s;
  e->status = s;
  va_list ap;
  va_start(ap, fmt);
  rda_text_vformat(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  return s;
}

void rda_err_clear(rda_err *e) {
  if (e == NULL) return;
  e->status = RDA_OK;
  e->msg[0] = '\0';
}
