/* kernel_times.c — the profiling backend decorator of kernel_times.h: forwards every call to
 * the inner backend, wraps loaded modules with their variant's name and kind, and brackets
 * each launch with two timed events whose elapsed times are summed per variant on collect. */
#include "kernel_times.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* A variant seen by load: names outlive their modules, so records stay valid after unload. */
typedef struct kt_name {
  char name[128];
  char kind[16];
} kt_name;

/* A module loaded through the wrapper (what callers hold as an rda_module *). */
typedef struct kt_module {
  rda_module *inner;
  int name; /* index into kt_backend.names */
} kt_module;

/* Slot i of the pool: two timed events of inner's; the first `nrecs` slots hold launches. */
typedef struct kt_record {
  void *start, *end;
  int name;
} kt_record;

typedef struct kt_backend {
  rda_backend pub; /* first: callers see this table; the rest is found from its address */
  rda_backend *inner;
  pthread_mutex_t mu; /* guards names and recs */
  kt_name *names;
  int nnames, names_cap;
  kt_record *recs;
  int nrecs, recs_cap;
} kt_backend;

static kt_backend *kt_of(rda_backend *b) {
  return (kt_backend *)(void *)b;
}
static rda_backend *kt_in(rda_backend *b) {
  return kt_of(b)->inner;
}

/* --- plain forwarding ----------------------------------------------------------------------- */

static rda_status kt_alloc(rda_backend *b, size_t bytes, void **dptr, rda_err *err) {
  return kt_in(b)->alloc(kt_in(b), bytes, dptr, err);
}
static void kt_free(rda_backend *b, void *dptr) {
  kt_in(b)->free(kt_in(b), dptr);
}
static rda_status kt_upload(rda_backend *b, void *dst, const void *src, size_t bytes,
                            rda_err *err) {
  return kt_in(b)->upload(kt_in(b), dst, src, bytes, err);
}
static rda_status kt_download(rda_backend *b, void *dst, const void *src, size_t bytes,
                              rda_err *err) {
  return kt_in(b)->download(kt_in(b), dst, src, bytes, err);
}
static rda_status kt_synchronize(rda_backend *b, rda_err *err) {
  return kt_in(b)->synchronize(kt_in(b), err);
}
static rda_status kt_memset_async(rda_backend *b, void *dptr, int value, size_t bytes,
                                  rda_err *err) {
  return kt_in(b)->memset_async(kt_in(b), dptr, value, bytes, err);
}
static rda_status kt_copy_async(rda_backend *b, void *dst, const void *src, size_t bytes,
                                rda_err *err) {
  return kt_in(b)->copy_async(kt_in(b), dst, src, bytes, err);
}
static rda_status kt_event_create(rda_backend *b, void **ev, rda_err *err) {
  return kt_in(b)->event_create(kt_in(b), ev, err);
}
static void kt_event_destroy(rda_backend *b, void *ev) {
  kt_in(b)->event_destroy(kt_in(b), ev);
}
static rda_status kt_event_record(rda_backend *b, void *ev, rda_err *err) {
  return kt_in(b)->event_record(kt_in(b), ev, err);
}
static rda_status kt_stream_wait_event(rda_backend *b, void *ev, rda_err *err) {
  return kt_in(b)->stream_wait_event(kt_in(b), ev, err);
}
static rda_status kt_event_query(rda_backend *b, void *ev, int *done, rda_err *err) {
  return kt_in(b)->event_query(kt_in(b), ev, done, err);
}
static rda_status kt_event_create_timed(rda_backend *b, void **ev, rda_err *err) {
  return kt_in(b)->event_create_timed(kt_in(b), ev, err);
}
static rda_status kt_event_elapsed_ms(rda_backend *b, void *start, void *end, float *ms,
                                      rda_err *err) {
  return kt_in(b)->event_elapsed_ms(kt_in(b), start, end, ms, err);
}
static rda_status kt_stream_create(rda_backend *b, void **s, rda_err *err) {
  return kt_in(b)->stream_create(kt_in(b), s, err);
}
static void kt_stream_destroy(rda_backend *b, void *s) {
  kt_in(b)->stream_destroy(kt_in(b), s);
}
static void *kt_set_stream(rda_backend *b, void *s) {
  return kt_in(b)->set_stream(kt_in(b), s);
}

/* --- modules -------------------------------------------------------------------------------- */

/* The index of (name, kind) in w->names, added when new; -1 when out of memory. Under w->mu. */
static int kt_intern(kt_backend *w, const rda_variant *v) {
  for (int i = 0; i < w->nnames; ++i)
    if (strcmp(w->names[i].name, v->name) == 0 && strcmp(w->names[i].kind, v->kind) == 0) return i;
  if (w->nnames == w->names_cap) {
    const int cap = w->names_cap ? 2 * w->names_cap : 16;
    kt_name *grown = realloc(w->names, (size_t)cap * sizeof *grown);
    if (grown == NULL) return -1;
    w->names = grown;
    w->names_cap = cap;
  }
  kt_name *n = &w->names[w->nnames];
  snprintf(n->name, sizeof n->name, "%s", v->name);
  snprintf(n->kind, sizeof n->kind, "%s", v->kind);
  return w->nnames++;
}

static rda_status kt_load(rda_backend *b, const rda_variant *v, rda_module **out, rda_err *err) {
  *out = NULL;
  kt_backend *w = kt_of(b);
  if (v == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "kernel times: load of a NULL variant");
  kt_module *m = malloc(sizeof *m);
  if (m == NULL)
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "kernel times: no memory to load %s", v->name);
  pthread_mutex_lock(&w->mu);
  m->name = kt_intern(w, v);
  pthread_mutex_unlock(&w->mu);
  if (m->name < 0) {
    free(m);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "kernel times: no memory to load %s", v->name);
  }
  const rda_status s = w->inner->load(w->inner, v, &m->inner, err);
  if (s != RDA_OK) {
    free(m);
    return s;
  }
  *out = (rda_module *)(void *)m;
  return RDA_OK;
}

static void kt_unload(rda_backend *b, rda_module *m) {
  if (m == NULL) return;
  kt_module *km = (kt_module *)(void *)m;
  kt_in(b)->unload(kt_in(b), km->inner);
  free(km);
}

/* --- launches ------------------------------------------------------------------------------- */

/* Make room for one more record: double the pool, creating the new slots' events. Under w->mu. */
static rda_status kt_reserve(kt_backend *w, rda_err *err) {
  if (w->nrecs < w->recs_cap) return RDA_OK;
  const int cap = w->recs_cap ? 2 * w->recs_cap : 64;
  kt_record *grown = realloc(w->recs, (size_t)cap * sizeof *grown);
  if (grown == NULL)
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "kernel times: no memory for %d records", cap);
  w->recs = grown;
  for (int i = w->recs_cap; i < cap; ++i) {
    kt_record *r = &w->recs[i];
    r->start = r->end = NULL;
    rda_status s = w->inner->event_create_timed(w->inner, &r->start, err);
    if (s == RDA_OK) s = w->inner->event_create_timed(w->inner, &r->end, err);
    if (s != RDA_OK) {
      /* Keep the slots made so far (their events are whole); drop this one. */
      w->inner->event_destroy(w->inner, r->start);
      w->inner->event_destroy(w->inner, r->end);
      w->recs_cap = i;
      return s;
    }
  }
  w->recs_cap = cap;
  return RDA_OK;
}

static rda_status kt_launch(rda_backend *b, rda_module *m, const unsigned grid[3], unsigned threads,
                            unsigned smem_bytes, const void *params, size_t params_bytes,
                            rda_err *err) {
  kt_backend *w = kt_of(b);
  rda_backend *in = w->inner;
  if (m == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "kernel times: launch of a NULL module");
  const kt_module *km = (const kt_module *)(const void *)m;
  pthread_mutex_lock(&w->mu);
  rda_status s = kt_reserve(w, err);
  kt_record *r = s == RDA_OK ? &w->recs[w->nrecs] : NULL;
  if (s == RDA_OK) s = in->event_record(in, r->start, err);
  if (s == RDA_OK)
    s = in->launch(in, km->inner, grid, threads, smem_bytes, params, params_bytes, err);
  if (s == RDA_OK) s = in->event_record(in, r->end, err);
  if (s == RDA_OK) {
    r->name = km->name;
    w->nrecs++;
  }
  pthread_mutex_unlock(&w->mu);
  return s;
}

/* --- lifetime and results ------------------------------------------------------------------- */

static void kt_destroy(rda_backend *b) {
  if (b == NULL) return;
  kt_backend *w = kt_of(b);
  for (int i = 0; i < w->recs_cap; ++i) {
    w->inner->event_destroy(w->inner, w->recs[i].start);
    w->inner->event_destroy(w->inner, w->recs[i].end);
  }
  free(w->recs);
  free(w->names);
  pthread_mutex_destroy(&w->mu);
  free(w);
}

rda_status rda_kernel_times_wrap(rda_backend *inner, rda_backend **out, rda_err *err) {
  if (out == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_kernel_times_wrap: NULL out");
  *out = NULL;
  if (inner == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_kernel_times_wrap: NULL backend");
  kt_backend *w = calloc(1, sizeof *w);
  if (w == NULL)
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "kernel times: no memory for the wrapper");
  if (pthread_mutex_init(&w->mu, NULL) != 0) {
    free(w);
    return rda_err_set(err, RDA_ERR_INTERNAL, "kernel times: cannot make a mutex");
  }
  w->inner = inner;
  rda_backend *b = &w->pub;
  b->name = inner->name;
  b->arch = inner->arch;
  b->impl = inner->impl;
  b->alloc = kt_alloc;
  b->free = kt_free;
  b->upload = kt_upload;
  b->download = kt_download;
  b->load = kt_load;
  b->unload = kt_unload;
  b->launch = kt_launch;
  b->synchronize = kt_synchronize;
  b->memset_async = kt_memset_async;
  b->copy_async = kt_copy_async;
  b->event_create = kt_event_create;
  b->event_destroy = kt_event_destroy;
  b->event_record = kt_event_record;
  b->stream_wait_event = kt_stream_wait_event;
  b->event_query = kt_event_query;
  b->event_create_timed = kt_event_create_timed;
  b->event_elapsed_ms = kt_event_elapsed_ms;
  b->stream_create = kt_stream_create;
  b->stream_destroy = kt_stream_destroy;
  b->set_stream = kt_set_stream;
  b->destroy = kt_destroy;
  *out = b;
  return RDA_OK;
}

static int kt_is_wrapper(const rda_backend *b) {
  return b != NULL && b->destroy == kt_destroy;
}

void rda_kernel_times_reset(rda_backend *wrapped) {
  if (!kt_is_wrapper(wrapped)) return;
  kt_backend *w = kt_of(wrapped);
  pthread_mutex_lock(&w->mu);
  w->nrecs = 0;
  pthread_mutex_unlock(&w->mu);
}

static int kt_by_time(const void *a, const void *b) {
  const rda_kernel_time *x = a, *y = b;
  if (x->ms != y->ms) return x->ms < y->ms ? 1 : -1;
  return strcmp(x->name, y->name);
}

rda_status rda_kernel_times_collect(rda_backend *wrapped, rda_kernel_time **out, int *count,
                                    double *total_ms, rda_err *err) {
  if (out == NULL || count == NULL || total_ms == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_kernel_times_collect: NULL output");
  *out = NULL;
  *count = 0;
  *total_ms = 0;
  if (!kt_is_wrapper(wrapped))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "rda_kernel_times_collect: not a backend of rda_kernel_times_wrap");
  kt_backend *w = kt_of(wrapped);
  pthread_mutex_lock(&w->mu);
  /* One slot per interned name (at most nnames); the names used are compacted after. */
  rda_kernel_time *t = calloc((size_t)(w->nnames > 0 ? w->nnames : 1), sizeof *t);
  rda_status s = t == NULL ? rda_err_set(err, RDA_ERR_OUT_OF_MEMORY,
                                         "kernel times: no memory for %d kernels", w->nnames)
                           : RDA_OK;
  for (int i = 0; i < w->nrecs && s == RDA_OK; ++i) {
    const kt_record *r = &w->recs[i];
    float ms = 0.0f;
    s = w->inner->event_elapsed_ms(w->inner, r->start, r->end, &ms, err);
    if (s != RDA_OK) break;
    rda_kernel_time *k = &t[r->name];
    k->launches++;
    k->ms += ms;
  }
  int n = 0;
  for (int i = 0; i < w->nnames && s == RDA_OK; ++i) {
    if (t[i].launches == 0) continue;
    memcpy(t[n].name, w->names[i].name, sizeof t[n].name);
    memcpy(t[n].kind, w->names[i].kind, sizeof t[n].kind);
    t[n].launches = t[i].launches;
    t[n].ms = t[i].ms;
    *total_ms += t[n].ms;
    ++n;
  }
  pthread_mutex_unlock(&w->mu);
  if (s != RDA_OK || n == 0) {
    free(t);
    if (s != RDA_OK) *total_ms = 0;
    return s;
  }
  qsort(t, (size_t)n, sizeof *t, kt_by_time);
  *out = t;
  *count = n;
  return RDA_OK;
}

void rda_kernel_times_print(FILE *f, const char *title, const rda_kernel_time *t, int count,
                            double total_ms, double pass_ms) {
  const double whole = pass_ms > 0 ? pass_ms : total_ms;
  long long launches = 0;
  for (int i = 0; i < count; ++i) {
    fprintf(f, "%s: %-56s %-9s %6lld launches %10.4f ms %6.2f%%\n", title, t[i].name, t[i].kind,
            t[i].launches, t[i].ms, whole > 0 ? 100.0 * t[i].ms / whole : 0.0);
    launches += t[i].launches;
  }
  fprintf(f, "%s: %d kernels, %lld launches, %.4f ms in kernels", title, count, launches, total_ms);
  if (pass_ms > 0)
    fprintf(f, " of a %.4f ms pass (%.2f%%; the rest is gaps between launches and other work)",
            pass_ms, 100.0 * total_ms / pass_ms);
  fprintf(f, "\n%s by kind:", title);
  /* The known kinds in pipeline order (a fixed order, for scripts), then any others. */
  static const char *const kinds[] = {"init",     "fwd",      "cast",     "ring_pack",
                                      "ring_add", "bwd_prep", "bwd_dkdv", "bwd_dq"};
  const int nkinds = (int)(sizeof kinds / sizeof kinds[0]);
  int listed = 0;
  for (int k = 0; k <= nkinds; ++k)
    for (int i = 0; i < count; ++i) {
      int known = 0;
      for (int j = 0; j < nkinds; ++j) known |= strcmp(t[i].kind, kinds[j]) == 0;
      if (k < nkinds ? strcmp(t[i].kind, kinds[k]) != 0 : known) continue;
      /* The first variant of its kind (in t's order) prints the kind's sums. */
      int first = 1;
      for (int j = 0; j < i; ++j) first &= strcmp(t[j].kind, t[i].kind) != 0;
      if (!first) continue;
      long long n = 0;
      double ms = 0;
      for (int j = i; j < count; ++j)
        if (strcmp(t[j].kind, t[i].kind) == 0) n += t[j].launches, ms += t[j].ms;
      fprintf(f, "%s %s %lld launches %.4f ms", listed++ ? "," : "", t[i].kind, n, ms);
    }
  fprintf(f, "\n");
}
