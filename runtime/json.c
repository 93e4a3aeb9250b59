/* json.c — the tiny JSON writer of json.h: escaping, separators and indentation, with
 * allocation failure and unbalanced containers turned into one error at the end. */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rda_json_init(rda_json *j) {
  memset(j, 0, sizeof *j);
}

void rda_json_free(rda_json *j) {
  if (j == NULL) return;
  free(j->buf);
  memset(j, 0, sizeof *j);
}

static void rda_json_put(rda_json *j, const char *s, size_t n) {
  if (j->failed) return;
  if (j->len + n + 1 > j->cap) {
    size_t cap = j->cap ? j->cap : 256;
    while (j->len + n + 1 > cap) cap *= 2;
    char *p = realloc(j->buf, cap);
    if (p == NULL) {
      j->failed = 2;
      return;
    }
    j->buf = p;
    j->cap = cap;
  }
  memcpy(j->buf + j->len, s, n);
  j->len += n;
  j->buf[j->len] = '\0';
}

static void rda_json_puts(rda_json *j, const char *s) {
  rda_json_put(j, s, strlen(s));
}

/* Separator and indentation before a value (or a key) at the current level. */
static void rda_json_before_value(rda_json *j) {
  if (j->after_key) {
    j->after_key = 0;
    return;
  }
  if (j->depth == 0) {
    if (j->len > 0) j->failed = 1; /* a second top-level value */
    return;
  }
  const int level = j->depth - 1;
  if (!j->is_array[level]) {
    j->failed = 1; /* an object member without a key */
    return;
  }
  if (j->count[level]++ > 0) rda_json_puts(j, ",");
  rda_json_puts(j, "\n");
  for (int i = 0; i < j->depth; ++i) rda_json_puts(j, "  ");
}

static void rda_json_open(rda_json *j, int is_array) {
  rda_json_before_value(j);
  if (j->depth >= RDA_JSON_MAX_DEPTH) {
    j->failed = 1;
    return;
  }
  j->is_array[j->depth] = is_array;
  j->count[j->depth] = 0;
  ++j->depth;
  rda_json_puts(j, is_array ? "[" : "{");
}

static void rda_json_close(rda_json *j, int is_array) {
  if (j->depth == 0 || j->is_array[j->depth - 1] != is_array || j->after_key) {
    j->failed = 1;
    return;
  }
  --j->depth;
  if (is_array && j->count[j->depth] > 0) {
    rda_json_puts(j, "\n");
    for (int i = 0; i < j->depth; ++i) rda_json_puts(j, "  ");
  }
  rda_json_puts(j, is_array ? "]" : "}");
}

void rda_json_object_begin(rda_json *j) {
  rda_json_open(j, 0);
}
void rda_json_object_end(rda_json *j) {
  rda_json_close(j, 0);
}
void rda_json_array_begin(rda_json *j) {
  rda_json_open(j, 1);
}
void rda_json_array_end(rda_json *j) {
  rda_json_close(j, 1);
}

static void rda_json_quoted(rda_json *j, const char *s) {
  rda_json_puts(j, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; ++p) {
    char esc[8];
    switch (*p) {
      case '"': rda_json_puts(j, "\\\""); break;
      case '\\': rda_json_puts(j, "\\\\"); break;
      case '\n': rda_json_puts(j, "\\n"); break;
      case '\r': rda_json_puts(j, "\\r"); break;
      case '\t': rda_json_puts(j, "\\t"); break;
      default:
        if (*p < 0x20) {
          snprintf(esc, sizeof esc, "\\u%04x", (unsigned)*p);
          rda_json_puts(j, esc);
        } else {
          rda_json_put(j, (const char *)p, 1);
        }
    }
  }
  rda_json_puts(j, "\"");
}

void rda_json_key(rda_json *j, const char *key) {
  if (j->depth == 0 || j->is_array[j->depth - 1] || j->after_key) {
    j->failed = 1;
    return;
  }
  if (j->count[j->depth - 1]++ > 0) rda_json_puts(j, ", ");
  rda_json_quoted(j, key);
  rda_json_puts(j, ": ");
  j->after_key = 1;
}

void rda_json_string(rda_json *j, const char *s) {
  rda_json_before_value(j);
  rda_json_quoted(j, s ? s : "");
}

void rda_json_int(rda_json *j, long long v) {
  char b[32];
  rda_json_before_value(j);
  snprintf(b, sizeof b, "%lld", v);
  rda_json_puts(j, b);
}

void rda_json_double(rda_json *j, double v) {
  char b[40];
  rda_json_before_value(j);
  if (!isfinite(v)) {
    rda_json_puts(j, "null");
    return;
  }
  snprintf(b, sizeof b, "%.6g", v);
  rda_json_puts(j, b);
}

void rda_json_bool(rda_json *j, int v) {
  rda_json_before_value(j);
  rda_json_puts(j, v ? "true" : "false");
}

rda_status rda_json_finish(rda_json *j, rda_err *err) {
  if (!j->failed && (j->depth != 0 || j->after_key || j->len == 0)) j->failed = 1;
  if (!j->failed) rda_json_puts(j, "\n");
  if (j->failed == 2) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "json: out of memory");
  if (j->failed)
    return rda_err_set(err, RDA_ERR_INTERNAL, "json: unbalanced or misused writer (a bug)");
  return RDA_OK;
}
