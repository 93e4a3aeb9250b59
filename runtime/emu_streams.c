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

typedef struct es_event {
  int timed, dead;
  uint64_t nrec; /* records queued so far; record k (1-based) is the k-th */
  /* Which records ran: every one up to `low`, and those in ran[0..nran) above it (records of
   * one event on two streams may run out of order; this stays as small as that disorder). */
  uint64_t low, *ran;
  size_t nran, cap;
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
  int dead;               /* destroyed, or its thread exited: freed once drained */
  struct es_stream *next; /* the device's list */
} es_stream;

/* One thread's streams of one backend: its default stream (CUDA's per-thread default stream),
 * made at first use, and set_stream's choice (NULL: the default). */
typedef struct es_thread {
  uint64_t tid;
  es_stream *def, *cur;
} es_thread;

struct rda_es {
  rda_backend *b;
  rda_es_run_fn run;
  es_thread *threads; /* every thread that used the backend and has not exited */
  int nthreads, cap;
  struct rda_es *next; /* the open backends */
};

static struct {
  pthread_mutex_t mu;
  pthread_cond_t work, progress;
  es_stream *streams;
  rda_es *backends;
  int started;
  uint64_t tids, rng;
  rda_status failed; /* sticky, with its message */
  char why[sizeof(((rda_err *)0)->msg)];
} g = {PTHREAD_MUTEX_INITIALIZER,
       PTHREAD_COND_INITIALIZER,
       PTHREAD_COND_INITIALIZER,
       NULL,
       NULL,
       0,
       0,
       0x9e3779b97f4a7c15ull,
       RDA_OK,
       ""};

/* The calling thread's number (0: none yet), and the key whose destructor retires its default
 * streams when it exits. */
static _Thread_local uint64_t es_tid;
static pthread_key_t es_exit_key;
static pthread_once_t es_exit_once = PTHREAD_ONCE_INIT;

static double es_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t es_rand(void) { /* lock held */
  g.rng ^= g.rng << 13, g.rng ^= g.rng >> 7, g.rng ^= g.rng << 17;
  return g.rng;
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

/* A dead stream goes once it has drained; until then the device runs what it holds (lock
 * held). */
static void es_stream_reap(es_stream *st) {
  if (!st->dead || st->head != NULL || st->running) return;
  for (es_stream **p = &g.streams; *p != NULL; p = &(*p)->next)
    if (*p == st) {
      *p = st->next;
      break;
    }
  free(st);
}

/* A thread exits: its default stream of every backend retires (CUDA's per-thread default
 * stream ends with its thread; the work queued there still runs). */
static void es_thread_exit(void *arg) {
  const uint64_t tid = (uint64_t)(uintptr_t)arg;
  pthread_mutex_lock(&g.mu);
  for (rda_es *s = g.backends; s != NULL; s = s->next)
    for (int i = 0; i < s->nthreads; ++i) {
      if (s->threads[i].tid != tid) continue;
      es_stream *def = s->threads[i].def;
      s->threads[i] = s->threads[--s->nthreads];
      if (def != NULL) def->dead = 1, es_stream_reap(def);
      break;
    }
  pthread_mutex_unlock(&g.mu);
}

static void es_exit_key_make(void) {
  if (pthread_key_create(&es_exit_key, es_thread_exit) != 0) es_exit_key = (pthread_key_t)-1;
}

/* The calling thread's entry of s, made when `make` (NULL: none, or no memory). Lock held. */
static es_thread *es_thread_of(rda_es *s, int make) {
  if (es_tid == 0) {
    if (!make) return NULL;
    pthread_once(&es_exit_once, es_exit_key_make);
    es_tid = ++g.tids;
    /* tids start at 1, so the value is never NULL and the destructor runs */
    if (es_exit_key != (pthread_key_t)-1)
      pthread_setspecific(es_exit_key, (void *)(uintptr_t)es_tid);
  }
  for (int i = 0; i < s->nthreads; ++i)
    if (s->threads[i].tid == es_tid) return &s->threads[i];
  if (!make) return NULL;
  if (s->nthreads == s->cap) {
    const int cap = s->cap ? 2 * s->cap : 4;
    es_thread *t = realloc(s->threads, (size_t)cap * sizeof *t);
    if (t == NULL) return NULL;
    s->threads = t, s->cap = cap;
  }
  es_thread *t = &s->threads[s->nthreads++];
  *t = (es_thread){es_tid, NULL, NULL};
  return t;
}

/* The calling thread's default stream of s, made at its first use (NULL: no memory). */
static es_stream *es_default(rda_es *s) { /* lock held */
  es_thread *t = es_thread_of(s, 1);
  if (t == NULL) return NULL;
  if (t->def == NULL) t->def = es_stream_new(s);
  return t->def;
}

static es_stream *es_current(rda_es *s) { /* lock held */
  const es_thread *t = es_thread_of(s, 0);
  return t != NULL && t->cur != NULL ? t->cur : es_default(s);
}

static int es_event_ran(const es_event *e, uint64_t k) { /* lock held */
  if (k <= e->low) return 1;
  for (size_t i = 0; i < e->nran; ++i)
    if (e->ran[i] == k) return 1;
  return 0;
}

/* Record k of e ran (lock held). Room for it in ran was made when it was queued. */
static void es_event_mark(es_event *e, uint64_t k) {
  if (k != e->low + 1) {
    e->ran[e->nran++] = k;
    return;
  }
  e->low = k;
  for (size_t i = 0; i < e->nran;) /* records above that now continue the run */
    if (e->ran[i] == e->low + 1)
      e->low++, e->ran[i] = e->ran[--e->nran], i = 0;
    else
      ++i;
}

static int es_may_run(const es_op *op) { /* lock held */
  if (op->kind != ES_WAIT || op->seq == 0 || g.failed != RDA_OK) return 1;
  return es_event_ran(op->ev, op->seq);
}

static void es_event_unref(es_event *ev) { /* lock held */
  if (ev == NULL || --ev->refs > 0 || !ev->dead) return;
  free(ev->ran);
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
      es_event_mark(op->ev, op->seq);
      if (op->seq > op->ev->at_seq) op->ev->at = t, op->ev->at_seq = op->seq;
    }
    es_event_unref(op->ev);
    pick->running = 0;
    es_stream_reap(pick);
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
  } else if (q->dead) {
    st = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "emu: work queued on a destroyed stream");
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

/* Wakes at least once a second: a missed broadcast costs a second, never a hang. */
static void es_wait_progress(void) { /* lock held */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 1;
  pthread_cond_timedwait(&g.progress, &g.mu, &until);
}

/* Until st has drained (lock held; the sticky error, if any). No stream can wait for ever:
 * a wait names a record queued before it, so the earliest operation not yet run can always
 * run. A kernel that never ends (one spinning on host memory) holds this up, as on a GPU. */
static rda_status es_drain(es_stream *st, rda_err *err) {
  while (st->head != NULL || st->running) es_wait_progress();
  return g.failed != RDA_OK ? es_sticky(err) : RDA_OK;
}

/* Until every stream of s, dead ones included, has drained (lock held). */
static rda_status es_idle(const rda_es *s, rda_err *err) {
  for (;;) {
    const es_stream *st = g.streams;
    while (st != NULL && (st->owner != s || (st->head == NULL && !st->running))) st = st->next;
    if (st == NULL) break;
    es_wait_progress();
  }
  return g.failed != RDA_OK ? es_sticky(err) : RDA_OK;
}

rda_status rda_es_open(rda_es **out, rda_backend *b, rda_es_run_fn run, rda_err *err) {
  rda_es *s = calloc(1, sizeof *s);
  *out = s;
  if (s == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: out of memory");
  s->b = b, s->run = run;
  pthread_mutex_lock(&g.mu);
  s->next = g.backends;
  g.backends = s;
  pthread_mutex_unlock(&g.mu);
  return RDA_OK;
}

rda_status rda_es_idle(rda_es *s, rda_err *err) {
  pthread_mutex_lock(&g.mu);
  const rda_status r = es_idle(s, err);
  pthread_mutex_unlock(&g.mu);
  return r;
}

void rda_es_close(rda_es *s) {
  if (s == NULL) return;
  pthread_mutex_lock(&g.mu);
  rda_err ignored = {0};
  (void)es_idle(s, &ignored);
  for (es_stream **p = &g.streams; *p != NULL;) {
    es_stream *st = *p;
    if (st->owner == s)
      *p = st->next, free(st);
    else
      p = &st->next;
  }
  for (rda_es **p = &g.backends; *p != NULL; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      break;
    }
  pthread_mutex_unlock(&g.mu);
  free(s->threads);
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
  /* Room in ran for every record not yet run, this one included, so marking never fails. */
  const size_t pending = (size_t)(e->nrec + 1 - e->low);
  if (pending > e->cap) {
    const size_t cap = 2 * pending > 16 ? 2 * pending : 16;
    uint64_t *r = realloc(e->ran, cap * sizeof *r);
    if (r == NULL) {
      pthread_mutex_unlock(&g.mu);
      free(op);
      return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "emu: no memory for an event record");
    }
    e->ran = r, e->cap = cap;
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
    *done = es_event_ran(e, e->nrec);
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

/* As cuStreamDestroy: returns at once; the work queued on it still runs, and the device frees
 * it once drained. */
void rda_es_stream_destroy(rda_es *s, void *stream) {
  if (stream == NULL) return;
  es_stream *st = stream;
  pthread_mutex_lock(&g.mu);
  for (int i = 0; i < s->nthreads; ++i)
    if (s->threads[i].cur == st) s->threads[i].cur = NULL;
  st->dead = 1;
  es_stream_reap(st);
  pthread_mutex_unlock(&g.mu);
}

void *rda_es_set_stream(rda_es *s, void *stream) {
  pthread_mutex_lock(&g.mu);
  es_thread *t = es_thread_of(s, stream != NULL);
  void *was = t != NULL ? t->cur : NULL;
  if (t != NULL) t->cur = stream; /* no entry (no memory): its default stream, as before */
  pthread_mutex_unlock(&g.mu);
  return was;
}
