/* fake_nccl.c — a fake libnccl.so.2 for tests on machines without a GPU: the entry points the
 * NCCL transport (runtime/transport_nccl.c) loads, as a model of the semantics it relies on,
 * among the threads of one process (each thread one rank):
 *  - ncclCommInitRankConfig: the ranks of one unique id form a communicator; non-blocking
 *    (config->blocking == 0), its state is ncclInProgress until all nranks arrived;
 *  - ncclSend/ncclRecv (grouped or not) and ncclAllGather queue one item per group on the
 *    stream; the k-th send a->b matches the k-th recv at b from a (collectives count apart);
 *    a matched pair moves its bytes once both groups reached their streams' heads; sizes that
 *    differ are an asynchronous ncclInvalidUsage on both communicators; a missing peer leaves
 *    the group pending for ever;
 *  - ncclCommFinalize: ncclInProgress until every rank finalized and this rank's operations
 *    completed (so a peer that aborted instead leaves it in progress);
 *  - ncclCommAbort drops the rank's pending operations (its stream moves on; the peers' stay
 *    pending); ncclCommAbort and ncclCommDestroy end the handle. Handles are kept, marked dead,
 *    so a later call on one is counted ("misuse") instead of reading freed memory.
 * The stream machinery and the lock are the fake driver's (fake_cuda.h). fake_nccl_count gives
 * the test what each rank did (fake_nccl.h). */
#include "fake_nccl.h"

#include "fake_cuda.h"

/* nccl.h (and the fp16/bf16 headers it pulls in) test undefined macros and declare f(). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { FN_INIT, FN_ABORT, FN_DESTROY, FN_FINALIZE, FN_POLL, FN_MISUSE, FN_NCOUNTS };
static const char *const fn_count_names_[FN_NCOUNTS] = {"init",     "abort", "destroy",
                                                        "finalize", "poll",  "misuse"};

typedef struct fn_op fn_op;

typedef struct fn_clique {
  struct fn_clique *next; /* every clique: kept for the process, as are its communicators */
  ncclUniqueId id;
  int nranks, arrived;
  struct ncclComm **comm;    /* per rank, once it initialized */
  struct ncclComm *all;      /* every communicator made, dead ones too */
  int *finalized;            /* per rank */
  long (*count)[FN_NCOUNTS]; /* per rank */
  fn_op *ops;                /* posted, not completed */
} fn_clique;

struct ncclComm {
  struct ncclComm *next; /* in its clique's `all` */
  fn_clique *cl;
  int rank, device;
  int dead; /* aborted or destroyed */
  int init_done, finalizing;
  ncclResult_t error;      /* an asynchronous error */
  unsigned long long *seq; /* [collective][send][peer]: operations posted so far */
};

struct fn_op {
  fn_op *prev, *next; /* in the clique's ops while linked */
  struct ncclComm *comm;
  CUstream stream;
  int coll, send, rank, peer;
  int linked, started, done, failed;
  unsigned long long seq;
  char *buf;
  size_t bytes;
};

typedef struct fn_group {
  int nops;
  fn_op op[];
} fn_group;

static fn_clique *fn_cliques_;
static unsigned long long fn_ids_;
static void (*fn_on_poll_)(void *);
static void *fn_on_poll_arg_;

/* The calling thread's group: operations collected until the outermost ncclGroupEnd. */
static _Thread_local struct {
  int depth, n, cap;
  fn_op *ops;
} fn_tls_;

static size_t fn_type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

static fn_clique *fn_find(const void *id) {
  for (fn_clique *c = fn_cliques_; c != NULL; c = c->next)
    if (memcmp(&c->id, id, sizeof c->id) == 0) return c;
  return NULL;
}

static void fn_count(const struct ncclComm *c, int what) {
  c->cl->count[c->rank][what]++;
}

static int fn_pending_of(const struct ncclComm *c) {
  int n = 0;
  for (const fn_op *o = c->cl->ops; o != NULL; o = o->next) n += o->comm == c;
  return n;
}

/* The communicator's state as ncclCommGetAsyncError reports it. */
static ncclResult_t fn_state(struct ncclComm *c) {
  if (c->error != ncclSuccess) return c->error;
  if (!c->init_done) {
    if (c->cl->arrived < c->cl->nranks) return ncclInProgress;
    c->init_done = 1;
  }
  if (c->finalizing) {
    for (int q = 0; q < c->cl->nranks; q++)
      if (!c->cl->finalized[q]) return ncclInProgress;
    if (fn_pending_of(c) > 0) return ncclInProgress;
  }
  return ncclSuccess;
}

/* Whether c may be used now (operations: ready, not finalizing); a misuse is counted. */
static ncclResult_t fn_usable(struct ncclComm *c, int operation) {
  if (c == NULL) return ncclInvalidArgument;
  if (c->dead) {
    fn_count(c, FN_MISUSE);
    return ncclInvalidUsage;
  }
  const ncclResult_t s = fn_state(c);
  if (s == ncclInProgress && !c->init_done) {
    fn_count(c, FN_MISUSE);
    return ncclInvalidUsage;
  }
  if (s != ncclSuccess && s != ncclInProgress) return s;
  if (operation && c->finalizing) {
    fn_count(c, FN_MISUSE);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

static void fn_unlink(fn_op *o) {
  if (!o->linked) return;
  if (o->prev != NULL)
    o->prev->next = o->next;
  else
    o->comm->cl->ops = o->next;
  if (o->next != NULL) o->next->prev = o->prev;
  o->prev = o->next = NULL, o->linked = 0;
}

/* Move the bytes of o and its counterpart once both started. */
static void fn_match(fn_op *o) {
  fn_op *m = o->comm->cl->ops;
  while (m != NULL && !(m->coll == o->coll && m->send != o->send && m->rank == o->peer &&
                        m->peer == o->rank && m->seq == o->seq))
    m = m->next;
  if (m == NULL || !m->started || m->failed) return;
  fn_op *s = o->send ? o : m, *r = o->send ? m : o;
  if (s->bytes != r->bytes) {
    s->failed = r->failed = 1;
    if (!s->comm->dead) s->comm->error = ncclInvalidUsage;
    if (!r->comm->dead) r->comm->error = ncclInvalidUsage;
    return;
  }
  const int ok_s = fake_cu_live((CUdeviceptr)(uintptr_t)s->buf, s->bytes);
  const int ok_r = fake_cu_live((CUdeviceptr)(uintptr_t)r->buf, r->bytes);
  if (ok_s && ok_r && s->bytes > 0) memmove(r->buf, s->buf, s->bytes);
  s->done = r->done = 1;
  fn_unlink(s), fn_unlink(r);
}

/* A group item at its stream's head (fake_cu_enqueue): 1 once every operation completed. */
static int fn_run(void *arg) {
  fn_group *g = arg;
  for (int i = 0; i < g->nops; i++) g->op[i].started = 1;
  int done = 1;
  for (int i = 0; i < g->nops; i++) {
    if (!g->op[i].done && !g->op[i].failed) fn_match(&g->op[i]);
    done &= g->op[i].done;
  }
  return done;
}

static void fn_release(void *arg) {
  fn_group *g = arg;
  for (int i = 0; i < g->nops; i++) fn_unlink(&g->op[i]);
  free(g);
}

/* Abort and destroy: the rank's pending operations are dropped, their groups complete. */
static void fn_drop_ops(struct ncclComm *c) {
  for (fn_op *o = c->cl->ops, *next; o != NULL; o = next) {
    next = o->next;
    if (o->comm == c) {
      o->done = 1;
      fn_unlink(o);
    }
  }
}

/* The outermost group end: one item per (communicator, stream), operations in posting order. */
static ncclResult_t fn_flush(void) {
  ncclResult_t r = ncclSuccess;
  char *taken = calloc((size_t)fn_tls_.n + 1, 1);
  if (taken == NULL) abort(); /* a test double: no out-of-memory path */
  for (int i = 0; i < fn_tls_.n; i++) {
    if (taken[i]) continue;
    const fn_op *first = &fn_tls_.ops[i];
    int n = 0;
    for (int j = i; j < fn_tls_.n; j++)
      n += fn_tls_.ops[j].comm == first->comm && fn_tls_.ops[j].stream == first->stream;
    const ncclResult_t u = fn_usable(first->comm, 1);
    if (u != ncclSuccess) {
      r = u;
      for (int j = i; j < fn_tls_.n; j++)
        taken[j] |= fn_tls_.ops[j].comm == first->comm && fn_tls_.ops[j].stream == first->stream;
      continue;
    }
    fn_group *g = calloc(1, sizeof *g + (size_t)n * sizeof g->op[0]);
    if (g == NULL) abort();
    for (int j = i; j < fn_tls_.n; j++) {
      if (fn_tls_.ops[j].comm != first->comm || fn_tls_.ops[j].stream != first->stream) continue;
      taken[j] = 1;
      fn_op *o = &g->op[g->nops++];
      *o = fn_tls_.ops[j];
      struct ncclComm *c = o->comm;
      o->seq = c->seq[(o->coll * 2 + o->send) * c->cl->nranks + o->peer]++;
      o->next = c->cl->ops, o->prev = NULL, o->linked = 1;
      if (c->cl->ops != NULL) c->cl->ops->prev = o;
      c->cl->ops = o;
    }
    fake_cu_enqueue(first->stream, fn_run, fn_release, g);
  }
  free(taken);
  free(fn_tls_.ops);
  fn_tls_.ops = NULL, fn_tls_.n = fn_tls_.cap = 0;
  fake_cu_progress();
  return r;
}

static ncclResult_t fn_add(struct ncclComm *c, int coll, int send, int peer, const void *buf,
                           size_t bytes, cudaStream_t stream) {
  if (peer < 0 || peer >= c->cl->nranks) return ncclInvalidArgument;
  if (fn_tls_.n == fn_tls_.cap) {
    const int cap = fn_tls_.cap ? 2 * fn_tls_.cap : 16;
    fn_op *n = realloc(fn_tls_.ops, (size_t)cap * sizeof *n);
    if (n == NULL) return ncclSystemError;
    fn_tls_.ops = n, fn_tls_.cap = cap;
  }
  fn_op o = {.comm = c,
             .stream = stream,
             .coll = coll,
             .send = send,
             .rank = c->rank,
             .peer = peer,
             .bytes = bytes};
  memcpy(&o.buf, &buf, sizeof o.buf); /* a send's buffer is only read */
  fn_tls_.ops[fn_tls_.n++] = o;
  return ncclSuccess;
}

/* --- the NCCL API ---------------------------------------------------------------------------- */

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (fake)";
    case ncclSystemError: return "unhandled system error (fake)";
    case ncclInternalError: return "internal error (fake)";
    case ncclInvalidArgument: return "invalid argument (fake)";
    case ncclInvalidUsage: return "invalid usage (fake)";
    case ncclRemoteError: return "remote process exited or there was a network error (fake)";
    case ncclInProgress: return "NCCL operation in progress (fake)";
    default: return "unknown result code (fake)";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (id == NULL) return ncclInvalidArgument;
  fake_cu_lock();
  const unsigned long long n = ++fn_ids_;
  fake_cu_unlock();
  memset(id, 0, sizeof *id);
  const long pid = (long)getpid();
  memcpy(id->internal, "fakenccl", 8);
  memcpy(id->internal + 8, &n, sizeof n);
  memcpy(id->internal + 8 + sizeof n, &pid, sizeof pid);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
  if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  if (config != NULL && config->magic != 0xcafebeef) return ncclInvalidArgument;
  const int blocking = config == NULL || config->blocking != 0;
  *comm = NULL;
  fake_cu_lock();
  fn_clique *cl = fn_find(&id);
  if (cl == NULL) {
    cl = calloc(1, sizeof *cl);
    if (cl == NULL) abort();
    cl->id = id, cl->nranks = nranks;
    cl->comm = calloc((size_t)nranks, sizeof *cl->comm);
    cl->finalized = calloc((size_t)nranks, sizeof *cl->finalized);
    cl->count = calloc((size_t)nranks, sizeof *cl->count);
    if (cl->comm == NULL || cl->finalized == NULL || cl->count == NULL) abort();
    cl->next = fn_cliques_, fn_cliques_ = cl;
  }
  ncclResult_t r = ncclSuccess;
  if (cl->nranks != nranks)
    r = ncclInvalidArgument;
  else if (cl->comm[rank] != NULL)
    r = ncclInvalidUsage; /* this rank joined already */
  if (r != ncclSuccess) {
    fake_cu_unlock();
    return r;
  }
  struct ncclComm *c = calloc(1, sizeof *c);
  if (c == NULL) abort();
  c->cl = cl, c->rank = rank, c->error = ncclSuccess;
  c->device = fake_cu_current_device() < 0 ? 0 : fake_cu_current_device();
  c->seq = calloc(4u * (size_t)nranks, sizeof *c->seq);
  if (c->seq == NULL) abort();
  c->next = cl->all, cl->all = c;
  cl->comm[rank] = c;
  cl->arrived++;
  fn_count(c, FN_INIT);
  fake_cu_progress(); /* wakes blocking ranks */
  while (blocking && cl->arrived < cl->nranks) fake_cu_wait();
  r = fn_state(c);
  fake_cu_unlock();
  *comm = c;
  return r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *result) {
  if (comm == NULL || result == NULL) return ncclInvalidArgument;
  fake_cu_lock();
  void (*hook)(void *) = fn_on_poll_;
  void *hook_arg = fn_on_poll_arg_;
  fake_cu_unlock();
  if (hook != NULL) hook(hook_arg);
  fake_cu_lock();
  ncclResult_t r = ncclSuccess;
  if (comm->dead) {
    fn_count(comm, FN_MISUSE);
    r = ncclInvalidUsage;
  } else {
    fn_count(comm, FN_POLL);
    *result = fn_state(comm);
  }
  fake_cu_unlock();
  return r;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (count == NULL) return ncclInvalidArgument;
  fake_cu_lock();
  const ncclResult_t r = fn_usable(comm, 0);
  if (r == ncclSuccess) *count = comm->cl->nranks;
  fake_cu_unlock();
  return r;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (rank == NULL) return ncclInvalidArgument;
  fake_cu_lock();
  const ncclResult_t r = fn_usable(comm, 0);
  if (r == ncclSuccess) *rank = comm->rank;
  fake_cu_unlock();
  return r;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (device == NULL) return ncclInvalidArgument;
  fake_cu_lock();
  const ncclResult_t r = fn_usable(comm, 0);
  if (r == ncclSuccess) *device = comm->device;
  fake_cu_unlock();
  return r;
}

/* nccl.h declares these two without a prototype. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

ncclResult_t ncclGroupStart(void) {
  fn_tls_.depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (fn_tls_.depth == 0) return ncclInvalidUsage;
  if (--fn_tls_.depth > 0) return ncclSuccess;
  fake_cu_lock();
  const ncclResult_t r = fn_flush();
  fake_cu_unlock();
  return r;
}

static ncclResult_t fn_p2p(int send, const void *buf, size_t count, ncclDataType_t type, int peer,
                           ncclComm_t comm, cudaStream_t stream) {
  const size_t size = fn_type_size(type);
  if (size == 0) return ncclInvalidArgument;
  fake_cu_lock();
  ncclResult_t r = fn_usable(comm, 1);
  if (r == ncclSuccess) r = fn_add(comm, 0, send, peer, buf, count * size, stream);
  if (r == ncclSuccess && fn_tls_.depth == 0) r = fn_flush();
  fake_cu_unlock();
  return r;
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return fn_p2p(1, buf, count, type, peer, comm, stream);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return fn_p2p(0, buf, count, type, peer, comm, stream);
}

/* Every rank's block to every rank: a send of sendbuff and a receive into block q from rank q
 * (in place when sendbuff is this rank's block of recvbuff). */
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  const size_t size = fn_type_size(datatype);
  if (size == 0) return ncclInvalidArgument;
  fake_cu_lock();
  ncclResult_t r = fn_usable(comm, 1);
  const size_t bytes = sendcount * size;
  for (int q = 0; r == ncclSuccess && q < comm->cl->nranks; q++) {
    r = fn_add(comm, 1, 1, q, sendbuff, bytes, stream);
    if (r == ncclSuccess)
      r = fn_add(comm, 1, 0, q, (char *)recvbuff + (size_t)q * bytes, bytes, stream);
  }
  if (r == ncclSuccess && fn_tls_.depth == 0) r = fn_flush();
  fake_cu_unlock();
  return r;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  fake_cu_lock();
  ncclResult_t r = fn_usable(comm, 0);
  if (r == ncclSuccess && comm->finalizing) {
    fn_count(comm, FN_MISUSE);
    r = ncclInvalidUsage;
  }
  if (r == ncclSuccess) {
    comm->finalizing = 1;
    comm->cl->finalized[comm->rank] = 1;
    fn_count(comm, FN_FINALIZE);
    fake_cu_progress();
    r = fn_state(comm);
  }
  fake_cu_unlock();
  return r;
}

/* Destroy and abort: the handle is gone, its work dropped (counted as `what`); a second end,
 * or a destroy with work still pending, is misuse. */
static ncclResult_t fn_end(ncclComm_t comm, int what) {
  fake_cu_lock();
  ncclResult_t r = ncclSuccess;
  if (comm->dead) {
    fn_count(comm, FN_MISUSE);
    r = ncclInvalidUsage;
  } else {
    fn_count(comm, what);
    if (what == FN_DESTROY && fn_pending_of(comm) > 0) fn_count(comm, FN_MISUSE);
    fn_drop_ops(comm);
    comm->dead = 1;
    fake_cu_progress();
  }
  fake_cu_unlock();
  return r;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return comm == NULL ? ncclInvalidArgument : fn_end(comm, FN_DESTROY);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return comm == NULL ? ncclSuccess : fn_end(comm, FN_ABORT);
}

/* --- test helpers ---------------------------------------------------------------------------- */

long fake_nccl_count(const void *id, int rank, const char *what) {
  long n = -1;
  fake_cu_lock();
  const fn_clique *cl = fn_find(id);
  for (int k = 0; k < FN_NCOUNTS; k++)
    if (cl != NULL && rank >= 0 && rank < cl->nranks && strcmp(what, fn_count_names_[k]) == 0)
      n = cl->count[rank][k];
  fake_cu_unlock();
  return n;
}

long fake_nccl_pending(const void *id, int rank) {
  long n = -1;
  fake_cu_lock();
  const fn_clique *cl = fn_find(id);
  if (cl != NULL && rank >= 0 && rank < cl->nranks) {
    n = 0;
    for (const fn_op *o = cl->ops; o != NULL; o = o->next) n += o->rank == rank;
  }
  fake_cu_unlock();
  return n;
}

void fake_nccl_on_poll(void (*fn)(void *arg), void *arg) {
  fake_cu_lock();
  fn_on_poll_ = fn, fn_on_poll_arg_ = arg;
  fake_cu_unlock();
}
