/* json.h — a tiny JSON writer into a growing buffer (manifests, reports). Strings are escaped
 * per RFC 8259; non-finite numbers are written as null. Out of memory is sticky and reported
 * once, by rda_json_finish. */
#ifndef RDA_JSON_H
#define RDA_JSON_H

#include <stddef.h>

#include "err.h"

#define RDA_JSON_MAX_DEPTH 32

typedef struct rda_json {
  char *buf; /* NUL-terminated text, malloc'd */
  size_t len, cap;
  int depth;
  int count[RDA_JSON_MAX_DEPTH];    /* values written at each level */
  int is_array[RDA_JSON_MAX_DEPTH]; /* 1: array, 0: object */
  int after_key;                    /* a key was written; its value comes next */
  int failed;                       /* 1: misuse, 2: out of memory */
} rda_json;

void rda_json_init(rda_json *j);
void rda_json_free(rda_json *j); /* accepts NULL */

/* Containers. Elements of an array are written one per line; object members on one line. */
void rda_json_object_begin(rda_json *j);
void rda_json_object_end(rda_json *j);
void rda_json_array_begin(rda_json *j);
void rda_json_array_end(rda_json *j);

/* A member name inside an object; the next value call writes its value. */
void rda_json_key(rda_json *j, const char *key);

void rda_json_string(rda_json *j, const char *s);
void rda_json_int(rda_json *j, long long v);
void rda_json_double(rda_json *j, double v);
void rda_json_bool(rda_json *j, int v);

/* Checks that every container is closed and nothing failed; then j->buf is the document
 * (with a final newline). */
rda_status rda_json_finish(rda_json *j, rda_err *err);

#endif
