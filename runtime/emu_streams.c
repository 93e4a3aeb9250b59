/* emu_streams.c — the emulator's asynchronous streams (emu_streams.h): one device thread per
 * process runs the queued operations of every stream, picking at random among the streams
 * whose next operation may run. Everything shared is guarded by one lock; operations run
 * outside it. */
#include "emu_streams.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ES_LAUNCH, ES_MEMSET, ES_COPY, ES_RECORD, ES_WAIT };
enum { ES_TLS = 64 };                /* backends one thread can use at once */
static const double kStuckS = 300.0; /* a wait with no progress anywhere for this long fails */

typedef struct es_event {
  int timed, dead;
  uint64_t nrec;       /* records queued so far; record k (1-based) is the k-th */
  unsigned char *done; /* done[k]: record k ran */
  size_t cap;
  long refs;       /* queued operations that name it */
  double at;       /* CLOCK_MONOTONIC seconds when record at_seq ran */
  uint64_t at_seq; /* the latest record that ran */
} es_event;

typedef struct es_op {
  int kind, value;
  struct es_op *next;
  void *dst;
  const void *src;
  size_t bytes;
  es_event *ev;
  uint64_t seq; /* record: its number; wait: the record it waits for (0: none) */
  rda_module *m;
  unsigned grid[3], block[3], smem;
  /* A launch's, `bytes` of them, aligned for the kernel's parameter struct. */
  _Alignas(max_align_t) unsigned char params[];
} es_op;

typedef struct es_stream {
  rda_es *owner;
  es_op *head, *tail;
  int running;            /* one of its operations runs now */
  struct es_stream *next; /* the device's list */
} es_stream;

struct rda_es {
  rda_backend *b;
  rda_es_run_fn run;
  uint64_t gen; /* tells this backend's thread-local entries from a freed one's at its address */
};

static struct {
  pthread_mutex_t mu;
  pthread_cond_t work, progress;
  es_stream *streams;
  int started;
  uint64_t gen, executed, rng;
  rda_status failed; /* sticky, with its message */
  char why[sizeof(((rda_err *)0)->msg)];
} g = {PTHREAD_MUTEX_INITIALIZER,
       PTHREAD_COND_INITIALIZER,
       PTHREAD_COND_INITIALIZER,
       NULL,
       0,
       0,
       0,
       0x9e3779b97f4a7c15ull,
       RDA_OK,
       ""};

/* This thread's streams of each backend: set_stream's choice and its default stream. */
typedef struct es_tls {
  const rda_es *s;
  uint64_t gen;
  es_stream *st;
} es_tls;
static _Thread_local es_tls es_cur[ES_TLS], es_def[ES_TLS];
static _Thread_local unsigned es_def_next; /* the slot to reuse when none is free */

static double es_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t es_rand(void) { /* lock held */
  g.rng ^= g.rng << 13, g.rng ^= g.rng >> 7, g.rng ^= g.rng << 17;
  return g.rng;
}

static es_tls *es_find(es_tls *t, const rda_es *s) {
  for (int i = 0; i < ES_TLS; ++i)
    if (t[i].s == s && t[i].gen == s->gen) return &t[i];
  return NULL;
}

static rda_status es_sticky(rda_err *err) { /* lock held */
  return rda_err_set(err, g.failed, "emu: an earlier operation failed: %s", g.why);
}

static es_stream *es_stream_new(rda_es *s) { /* lock held */
  es_stream *st = calloc(1, sizeof *st);
  if (st == NULL) return NULL;
  st->owner = s;
  st->next = g.streams;
  g.streams = st;
  return st;
}

/* The calling thread's default stream of s, made at its first use. Lock held. */
static es_stream *es_default(rda_es *s) {
  es_tls *e = es_find(es_def, s);
  if (e != NULL) return e->st;
  es_stream *st = es_stream_new(s);
  if (st == NULL) return NULL;
  int slot = -1;
  for (int i = 0; i < ES_TLS && slot < 0; ++i)
    if (es_def[i].s == NULL) slot = i;
  /* Full: an entry of a backend this thread used before (if it is still alive, its default
   * stream stays in its list and drains at its close; this thread gets a new one). */
  if (slot < 0) slot = (int)(es_def_next++ % ES_TLS);
  es_def[slot] = (es_tls){s, s->gen, st};
  return st;
}

static es_stream *es_current(rda_es *s) { /* lock held */
  const es_tls *e = es_find(es_cur, s);
  return e != NULL ? e->st : es_default(s);
}

static int es_may_run(const es_op *op) { /* lock held */
  if (op->kind != ES_WAIT || op->seq == 0 || g.failed != RDA_OK) return 1;
  return op->seq < op->ev->cap && op->ev->done[op->seq];
}

static void es_event_unref(es_event *ev) { /* lock held */
  if (ev == NULL || --ev->refs > 0 || !ev->dead) return;
  free(ev->done);
  free(ev);
}

static void *es_device(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g.mu);
  for (;;) {
    es_stream *pick = NULL;
    uint64_t n = 0;
    for (es_stream *st = g.streams; st != NULL; st = st->next)
      if (!st->running && st->head != NULL && es_may_run(st->head) && es_rand() % ++n == 0)
        pick = st;
    if (pick == NULL) {
      pthread_cond_wait(&g.work, &g.mu);
      continue;
    }
    es_op *op = pick->head;
    pick->head = op->next;
    if (pick->head == NULL) pick->tail = NULL;
    pick->running = 1;
    const int pause = es_rand() % 8 == 0, skip = g.failed != RDA_OK;
    pthread_mutex_unlock(&g.mu);
    /* Now and then the device falls behind: the host queues more meanwhile. */
    if (pause) nanosleep(&(struct timespec){0, 50000}, NULL);
    rda_err e = {0};
    rda_status s = RDA_OK;
    if (!skip) switch (op->kind) {
        case ES_LAUNCH:
          s = pick->owner->run(pick->owner->b, op->m, op->grid, op->block, op->smem, op->params,
                               op->bytes, &e);
          break;
        case ES_MEMSET: memset(op->dst, op->value, op->bytes); break;
        case ES_COPY: memcpy(op->dst, op->src, op->bytes); break;
        default: break;
      }
    const double t = es_now();
    pthread_mutex_lock(&g.mu);
    if (s != RDA_OK && g.failed == RDA_OK) {
      g.failed = s;
      snprintf(g.why, sizeof g.why, "%s", e.msg);
    }
    if (op->kind == ES_RECORD) {
      op->ev->done[op->seq] = 1;
      if (op->seq > op->ev->at_seq) op->ev->at = t, op->ev->at_seq = op->seq;
    }
    es_event_unref(op->ev);
    pick->running = 0;
    g.executed++;
    pthread_cond_broadcast(&g.progress);
    free(op);
  }
  return NULL;
}

/* Queue op on s's current stream of the calling thread (lock held; op->ev, when set, is
 * referenced by the caller already). On failure op is freed and the reference dropped. */
static rda_status es_queue_locked(rda_es *s, es_op *op, rda_err *err) {
  rda_status st = RDA_OK;
  es_stream *q = NULL;
  if (g.failed != RDA_OK) {
    st = es_sticky(err);
  } else if ((q = es_current(s)) == NULL) {
    st = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: no memory for a stream");
  } else if (!g.started) {
    pthread_t th;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &a, es_device, NULL) != 0)
      st = rda_err_set(err, RDA_ERR_INTERNAL, "emu: cannot start the device thread");
    else
      g.started = 1;
    pthread_attr_destroy(&a);
  }
  if (st != RDA_OK) {
    es_event_unref(op->ev);
    free(op);
    return st;
  }
  if (q->tail != NULL)
    q->tail->next = op;
  else
    q->head = op;
  q->tail = op;
  pthread_cond_signal(&g.work);
  return RDA_OK;
}

static rda_status es_queue(rda_es *s, es_op *op, rda_err *err) {
  pthread_mutex_lock(&g.mu);
  const rda_status st = es_queue_locked(s, op, err);
  pthread_mutex_unlock(&g.mu);
  return st;
}

static es_op *es_op_new(int kind, size_t extra, rda_err *err) {
  es_op *op = calloc(1, sizeof *op + extra);
  if (op == NULL) rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: no memory to queue an operation");
  if (op != NULL) op->kind = kind;
  return op;
}

/* Until st has drained (lock held): the sticky error, or one when nothing anywhere ran for
 * kStuckS while st waited (a wait for a record that no stream will reach). */
static rda_status es_drain(es_stream *st, rda_err *err) {
  uint64_t seen = g.executed;
  double since = es_now();
  while (st->head != NULL || st->running) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 1;
    pthread_cond_timedwait(&g.progress, &g.mu, &until);
    if (g.executed != seen) {
      seen = g.executed, since = es_now();
    } else if (es_now() - since > kStuckS) {
      return rda_err_set(err, RDA_ERR_EMULATOR,
                         "emu: the emulated device is stuck: a stream waits for an event "
                         "record that no stream reaches (%.0f s without progress)",
                         kStuckS);
    }
  }
  return g.failed != RDA_OK ? es_sticky(err) : RDA_OK;
}

rda_status rda_es_open(rda_es **out, rda_backend *b, rda_es_run_fn run, rda_err *err) {
  rda_es *s = calloc(1, sizeof *s);
  *out = s;
  if (s == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: out of memory");
  s->b = b, s->run = run;
  pthread_mutex_lock(&g.mu);
  s->gen = ++g.gen;
  pthread_mutex_unlock(&g.mu);
  return RDA_OK;
}

void rda_es_close(rda_es *s) {
  if (s == NULL) return;
  pthread_mutex_lock(&g.mu);
  for (;;) {
    es_stream *st = g.streams;
    while (st != NULL && st->owner != s) st = st->next;
    if (st == NULL) break;
    rda_err ignored = {0};
    (void)es_drain(st, &ignored); /* unlocks while it waits: the list may change */
    for (es_stream **p = &g.streams; *p != NULL; p = &(*p)->next)
      if (*p == st) {
        *p = st->next;
        break;
      }
    free(st);
  }
  pthread_mutex_unlock(&g.mu);
  free(s);
}

rda_status rda_es_launch(rda_es *s, rda_module *m, const unsigned grid[3], const unsigned block[3],
                         unsigned smem_bytes, const void *params, size_t params_bytes,
                         rda_err *err) {
  es_op *op = es_op_new(ES_LAUNCH, params_bytes, err);
  if (op == NULL) return err->status;
  op->m = m, op->smem = smem_bytes, op->bytes = params_bytes;
  memcpy(op->grid, grid, sizeof op->grid);
  memcpy(op->block, block, sizeof op->block);
  if (params_bytes > 0) memcpy(op->params, params, params_bytes);
  return es_queue(s, op, err);
}

rda_status rda_es_memset(rda_es *s, void *dst, int value, size_t bytes, rda_err *err) {
  es_op *op = es_op_new(ES_MEMSET, 0, err);
  if (op == NULL) return err->status;
  op->dst = dst, op->value = value, op->bytes = bytes;
  return es_queue(s, op, err);
}

rda_status rda_es_copy(rda_es *s, void *dst, const void *src, size_t bytes, rda_err *err) {
  es_op *op = es_op_new(ES_COPY, 0, err);
  if (op == NULL) return err->status;
  op->dst = dst, op->src = src, op->bytes = bytes;
  return es_queue(s, op, err);
}

rda_status rda_es_sync(rda_es *s, rda_err *err) {
  pthread_mutex_lock(&g.mu);
  es_stream *st = es_default(s);
  const rda_status r = st == NULL ? rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: out of memory")
                                  : es_drain(st, err);
  pthread_mutex_unlock(&g.mu);
  return r;
}

rda_status rda_es_event_create(void **ev, int timed, rda_err *err) {
  es_event *e = calloc(1, sizeof *e);
  *ev = e;
  if (e == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: no memory for an event");
  e->timed = timed;
  return RDA_OK;
}

void rda_es_event_destroy(void *ev) {
  if (ev == NULL) return;
  es_event *e = ev;
  pthread_mutex_lock(&g.mu);
  e->dead = 1;
  e->refs++;
  es_event_unref(e); /* frees it now unless queued operations name it */
  pthread_mutex_unlock(&g.mu);
}

rda_status rda_es_event_record(rda_es *s, void *ev, rda_err *err) {
  if (ev == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: NULL event");
  es_event *e = ev;
  es_op *op = es_op_new(ES_RECORD, 0, err);
  if (op == NULL) return err->status;
  pthread_mutex_lock(&g.mu);
  if (e->nrec + 2 > e->cap) {
    const size_t cap = e->cap ? 2 * e->cap : 16;
    unsigned char *d = realloc(e->done, cap);
    if (d == NULL) {
      pthread_mutex_unlock(&g.mu);
      free(op);
      return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: no memory for an event record");
    }
    memset(d + e->cap, 0, cap - e->cap);
    e->done = d, e->cap = cap;
  }
  op->ev = e, op->seq = e->nrec + 1;
  e->refs++;
  const rda_status st = es_queue_locked(s, op, err);
  if (st == RDA_OK) e->nrec++; /* counted once queued: a wait never names a record that is not */
  pthread_mutex_unlock(&g.mu);
  return st;
}

rda_status rda_es_stream_wait_event(rda_es *s, void *ev, rda_err *err) {
  if (ev == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: NULL event");
  es_event *e = ev;
  es_op *op = es_op_new(ES_WAIT, 0, err);
  if (op == NULL) return err->status;
  pthread_mutex_lock(&g.mu);
  op->ev = e, op->seq = e->nrec; /* the last record queued so far */
  e->refs++;
  const rda_status st = es_queue_locked(s, op, err);
  pthread_mutex_unlock(&g.mu);
  return st;
}

rda_status rda_es_event_query(void *ev, int *done, rda_err *err) {
  *done = 0;
  if (ev == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: NULL event");
  const es_event *e = ev;
  pthread_mutex_lock(&g.mu);
  rda_status s = RDA_OK;
  if (g.failed != RDA_OK)
    s = es_sticky(err);
  else
    *done = e->nrec == 0 || e->done[e->nrec];
  pthread_mutex_unlock(&g.mu);
  return s;
}

rda_status rda_es_event_elapsed_ms(void *start, void *end, float *ms, rda_err *err) {
  if (ms == NULL || start == NULL || end == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: elapsed time of a NULL event");
  *ms = 0.0f;
  const es_event *e[2] = {start, end};
  pthread_mutex_lock(&g.mu);
  rda_status s = RDA_OK;
  for (int i = 0; i < 2 && s == RDA_OK; ++i) {
    if (!e[i]->timed)
      s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                      "emu: elapsed time of an event created without timing");
    else if (e[i]->nrec == 0)
      s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                      "emu: elapsed time of an event never recorded");
    else if (e[i]->at_seq != e[i]->nrec)
      s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                      "emu: elapsed time of an event whose last record has not run yet");
  }
  if (s == RDA_OK) *ms = (float)((e[1]->at - e[0]->at) * 1e3);
  pthread_mutex_unlock(&g.mu);
  return s;
}

rda_status rda_es_stream_create(rda_es *s, void **stream, rda_err *err) {
  pthread_mutex_lock(&g.mu);
  *stream = es_stream_new(s);
  pthread_mutex_unlock(&g.mu);
  if (*stream == NULL)
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: no memory for a stream");
  return RDA_OK;
}

void rda_es_stream_destroy(rda_es *s, void *stream) {
  if (stream == NULL) return;
  es_stream *st = stream;
  pthread_mutex_lock(&g.mu);
  rda_err ignored = {0};
  (void)es_drain(st, &ignored);
  for (es_stream **p = &g.streams; *p != NULL; p = &(*p)->next)
    if (*p == st) {
      *p = st->next;
      break;
    }
  es_tls *e = es_find(es_cur, s);
  if (e != NULL && e->st == st) *e = (es_tls){0};
  pthread_mutex_unlock(&g.mu);
  free(st);
}

void rda_es_set_stream(rda_es *s, void *stream) {
  es_tls *e = es_find(es_cur, s);
  if (stream == NULL) {
    if (e != NULL) *e = (es_tls){0};
    return;
  }
  if (e == NULL)
    for (int i = 0; i < ES_TLS && e == NULL; ++i)
      if (es_cur[i].s == NULL) e = &es_cur[i];
  if (e == NULL) e = &es_cur[0]; /* full: the oldest slot */
  *e = (es_tls){s, s->gen, stream};
}
