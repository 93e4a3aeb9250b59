/* transport_nccl.c — the NCCL transport: ncclSend/ncclRecv between ncclGroupStart/End on a
 * communication stream, completion polled through a CUDA event with a timeout that aborts the
 * communicator. NCCL and the driver are loaded with dlopen; built only where nccl.h exists. */
#include "transport.h"

#if defined(__has_include)
#if __has_include(<nccl.h>) && __has_include(<cuda.h>)
#define RDA_TRANSPORT_HAVE_NCCL 1
#endif
#endif

#ifndef RDA_TRANSPORT_HAVE_NCCL

rda_status rda_transport_nccl_create(void *comm, const void *unique_id, int rank, int size,
                                     void *stream, rda_backend *b, uint64_t fingerprint,
                                     double timeout_s, rda_transport **out, rda_err *err) {
  (void)comm, (void)unique_id, (void)rank, (void)size, (void)stream, (void)b, (void)fingerprint;
  (void)timeout_s;
  *out = NULL;
  if ((comm == NULL) == (unique_id == NULL))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "nccl transport: pass either a communicator or a unique id");
  return rda_err_set(err, RDA_ERR_UNSUPPORTED, "nccl transport: rda was built without nccl.h");
}

rda_status rda_transport_nccl_tell(void *comm, const void *unique_id, int rank, int size,
                                   void *stream, rda_backend *b, rda_status why, double timeout_s,
                                   rda_err *err) {
  (void)comm, (void)unique_id, (void)rank, (void)size, (void)stream, (void)b, (void)why;
  (void)timeout_s;
  return rda_err_set(err, RDA_ERR_UNSUPPORTED, "nccl transport: rda was built without nccl.h");
}

rda_status rda_transport_nccl_unique_id(void *id, rda_err *err) {
  (void)id;
  return rda_err_set(err, RDA_ERR_UNSUPPORTED, "nccl transport: rda was built without nccl.h");
}

#else

#include <cuda.h>
#include <dlfcn.h>
/* nccl.h (and the fp16/bf16 headers it pulls in) test undefined macros and declare f(). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --- the libraries ------------------------------------------------------------------------ */

#define TN_NCCL_ENTRY_POINTS(X)                                                               \
  X(ncclGetUniqueId, (ncclUniqueId * id))                                                     \
  X(ncclCommInitRankConfig,                                                                   \
    (ncclComm_t * comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config))         \
  X(ncclCommFinalize, (ncclComm_t comm))                                                      \
  X(ncclCommDestroy, (ncclComm_t comm))                                                       \
  X(ncclCommAbort, (ncclComm_t comm))                                                         \
  X(ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t * result))                          \
  X(ncclCommCount, (const ncclComm_t comm, int *count))                                       \
  X(ncclCommUserRank, (const ncclComm_t comm, int *rank))                                     \
  X(ncclCommCuDevice, (const ncclComm_t comm, int *device))                                   \
  X(ncclGroupStart, (void))                                                                   \
  X(ncclGroupEnd, (void))                                                                     \
  X(ncclSend, (const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, \
               cudaStream_t stream))                                                          \
  X(ncclRecv, (void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,       \
               cudaStream_t stream))                                                          \
  X(ncclAllGather, (const void *send, void *recv, size_t count, ncclDataType_t type,          \
                    ncclComm_t comm, cudaStream_t stream))

#define TN_CUDA_ENTRY_POINTS(X)                                        \
  X(cuEventCreate, (CUevent * ev, unsigned int flags))                 \
  X(cuEventRecord, (CUevent ev, CUstream stream))                      \
  X(cuEventQuery, (CUevent ev))                                        \
  X(cuStreamWaitEvent, (CUstream stream, CUevent ev, unsigned int f))  \
  X(cuEventDestroy_v2, (CUevent ev))                                   \
  X(cuMemAlloc_v2, (CUdeviceptr * p, size_t bytes))                    \
  X(cuMemFree_v2, (CUdeviceptr p))                                     \
  X(cuMemcpyHtoDAsync_v2, (CUdeviceptr dst, const void *src, size_t bytes, CUstream s)) \
  X(cuMemcpyDtoHAsync_v2, (void *dst, CUdeviceptr src, size_t bytes, CUstream s)) \
  X(cuCtxGetDevice, (CUdevice * device))                               \
  X(cuCtxGetCurrent, (CUcontext * ctx))                                \
  X(cuCtxSetCurrent, (CUcontext ctx))                                  \
  X(cuGetErrorString, (CUresult e, const char **s))

typedef struct tn_api {
#define TN_FIELD_N(sym, args) ncclResult_t(*sym) args;
  TN_NCCL_ENTRY_POINTS(TN_FIELD_N)
#undef TN_FIELD_N
  const char *(*ncclGetErrorString)(ncclResult_t r);
#define TN_FIELD_C(sym, args) CUresult(CUDAAPI *sym) args;
  TN_CUDA_ENTRY_POINTS(TN_FIELD_C)
#undef TN_FIELD_C
} tn_api;

static tn_api tn_;
static int tn_loaded_;
static char tn_load_msg_[512];
static pthread_once_t tn_once_ = PTHREAD_ONCE_INIT;

/* The pointer types must be exactly the headers' (unevaluated: nothing gets linked). */
static void tn_check_signatures(void) {
#define TN_SIG(sym, args) (void)sizeof(tn_.sym = sym);
  TN_NCCL_ENTRY_POINTS(TN_SIG)
  TN_CUDA_ENTRY_POINTS(TN_SIG)
#undef TN_SIG
  (void)sizeof(tn_.ncclGetErrorString = ncclGetErrorString);
}

static void tn_load_once(void) {
  tn_check_signatures();
  void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (nccl == NULL) {
    const char *why = dlerror();
    snprintf(tn_load_msg_, sizeof tn_load_msg_, "no NCCL: %s",
             why ? why : "libnccl.so.2 cannot be loaded");
    return;
  }
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (cuda == NULL) {
    const char *why = dlerror();
    snprintf(tn_load_msg_, sizeof tn_load_msg_, "no CUDA driver: %s", why ? why : "libcuda.so.1");
    return;
  }
  void *sym;
#define TN_RESOLVE(lib, name, field)                                      \
  sym = dlsym(lib, name);                                                 \
  if (sym == NULL) {                                                      \
    snprintf(tn_load_msg_, sizeof tn_load_msg_, "%s lacks %s (too old?)", \
             lib == nccl ? "libnccl.so.2" : "libcuda.so.1", name);        \
    return;                                                               \
  }                                                                       \
  memcpy(&tn_.field, &sym, sizeof sym);
#define TN_RES_N(s, args) TN_RESOLVE(nccl, #s, s)
#define TN_RES_C(s, args) TN_RESOLVE(cuda, #s, s)
  TN_NCCL_ENTRY_POINTS(TN_RES_N)
  TN_CUDA_ENTRY_POINTS(TN_RES_C)
  TN_RESOLVE(nccl, "ncclGetErrorString", ncclGetErrorString)
#undef TN_RES_N
#undef TN_RES_C
#undef TN_RESOLVE
  tn_loaded_ = 1;
}

static rda_status tn_load(rda_err *err) {
  pthread_once(&tn_once_, tn_load_once);
  if (!tn_loaded_) return rda_err_set(err, RDA_ERR_NCCL, "nccl transport: %s", tn_load_msg_);
  return RDA_OK;
}

/* --- the endpoint ------------------------------------------------------------------------- */

typedef struct tn_op {
  int send, peer;
  void *buf; /* device pointer */
  size_t bytes;
} tn_op;

typedef struct tn_endpoint {
  rda_transport base;
  ncclComm_t comm;
  int owns_comm;
  int aborted; /* the owning thread aborted the communicator (comm is NULL then) */
  char reason[256];
  /* Held for the whole of every call that uses comm (the vtable's entry points; creation and
   * destroy have the endpoint to themselves). rda_transport_abort may come from any thread: it
   * files a request (under mu), then aborts the communicator at once if it can take `call`;
   * else the running call carries the request out at its next poll iteration, or as it returns
   * (tn_unlock_call), so comm is never freed under a running call and an idle ring's abort is
   * not left pending. */
  pthread_mutex_t call;
  pthread_mutex_t mu;
  int abort_requested; /* read without the lock by the holder of call: __atomic */
  int handoff;         /* tn_carry_out_if_free's meeting point: only atomic RMW touch it */
  char requested[256];
  CUcontext ctx;       /* current at creation: made current again to destroy */
  CUstream stream;     /* communication */
  rda_backend *b;      /* whose current stream is the caller's (NULL: see transport.h) */
  CUstream caller;     /* the caller's stream at group_end (b NULL) */
  CUevent ready;       /* recorded there: the communication stream waits for it */
  CUevent done;        /* recorded on the communication stream after a group */
  CUdeviceptr scratch; /* 8 * size bytes: fingerprints, barriers */
  tn_op *ops;
  int nops, cap, state; /* 0 idle, 1 in a group, 2 posted */
} tn_endpoint;

static const rda_transport_vtbl tn_vtbl;

static double tn_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void tn_sleep_us(long us) {
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

/* The holder of ep->call (or the creating / destroying thread) only. */
static void tn_abort_comm(tn_endpoint *ep, const char *why) {
  if (!ep->aborted) {
    ep->aborted = 1;
    snprintf(ep->reason, sizeof ep->reason, "%s", why);
    if (ep->comm != NULL) tn_.ncclCommAbort(ep->comm);
    ep->comm = NULL;
  }
}

/* The holder of ep->call: carry out an abort another thread requested. */
static void tn_take_request(tn_endpoint *ep) {
  if (!__atomic_load_n(&ep->abort_requested, __ATOMIC_ACQUIRE) || ep->aborted) return;
  char why[256];
  pthread_mutex_lock(&ep->mu);
  snprintf(why, sizeof why, "%s", ep->requested);
  pthread_mutex_unlock(&ep->mu);
  tn_abort_comm(ep, why);
}

static rda_status tn_fail(tn_endpoint *ep, rda_err *err, const char *what, ncclResult_t r) {
  char why[256];
  snprintf(why, sizeof why, "%s: %s", what, tn_.ncclGetErrorString(r));
  tn_abort_comm(ep, why);
  return rda_err_set(err, RDA_ERR_NCCL, "rank %d: %s", ep->base.rank, why);
}

static rda_status tn_cu(tn_endpoint *ep, rda_err *err, const char *what, CUresult r) {
  if (r == CUDA_SUCCESS) return RDA_OK;
  const char *s = NULL;
  tn_.cuGetErrorString(r, &s);
  return rda_err_set(err, RDA_ERR_CUDA, "rank %d: %s: %s", ep->base.rank, what, s ? s : "unknown");
}

/* Poll until the communicator's pending work (non-blocking mode) and, when ev is set, the event
 * completed; an NCCL error or the timeout aborts the communicator. */
static rda_status tn_poll(tn_endpoint *ep, int with_event, const char *what, rda_err *err) {
  const double deadline = tn_now() + ep->base.timeout_s;
  long nap = 20;
  for (;;) {
    tn_take_request(ep);
    if (ep->aborted)
      return rda_err_set(err, RDA_ERR_NCCL, "rank %d: the communicator was aborted: %s",
                         ep->base.rank, ep->reason);
    ncclResult_t ar = ncclSuccess;
    ncclResult_t r = tn_.ncclCommGetAsyncError(ep->comm, &ar);
    if (r != ncclSuccess) return tn_fail(ep, err, "ncclCommGetAsyncError", r);
    if (ar != ncclSuccess && ar != ncclInProgress) return tn_fail(ep, err, what, ar);
    if (ar == ncclSuccess) {
      if (!with_event) return RDA_OK;
      const CUresult q = tn_.cuEventQuery(ep->done);
      if (q == CUDA_SUCCESS) return RDA_OK;
      if (q != CUDA_ERROR_NOT_READY) {
        tn_abort_comm(ep, "the communication stream failed");
        return tn_cu(ep, err, "cuEventQuery", q);
      }
    }
    if (tn_now() > deadline) {
      char why[160];
      snprintf(why, sizeof why, "timed out after %.1f s in %s", ep->base.timeout_s, what);
      tn_abort_comm(ep, why);
      return rda_err_set(err, RDA_ERR_NCCL, "rank %d: %s", ep->base.rank, why);
    }
    tn_sleep_us(nap);
    if (nap < 1000) nap *= 2;
  }
}

/* ep's context made current on this thread, which may have another current, or none: *prev,
 * to restore with tn_ctx_leave when the result is 1. */
static int tn_ctx_enter(const tn_endpoint *ep, CUcontext *prev) {
  *prev = NULL;
  const int restore = ep->ctx != NULL && tn_.cuCtxGetCurrent(prev) == CUDA_SUCCESS;
  if (ep->ctx != NULL) tn_.cuCtxSetCurrent(ep->ctx);
  return restore;
}

static void tn_ctx_leave(int restore, CUcontext prev) {
  if (restore) tn_.cuCtxSetCurrent(prev);
}

static rda_status tn_check_live(tn_endpoint *ep, rda_err *err) {
  tn_take_request(ep);
  if (ep->aborted)
    return rda_err_set(err, RDA_ERR_NCCL, "rank %d: the communicator was aborted: %s",
                       ep->base.rank, ep->reason);
  /* The ring may be called from another thread than the one that made it (a framework's
   * worker): the driver calls below act on the calling thread's current context. */
  if (ep->ctx != NULL) RDA_TRY(tn_cu(ep, err, "cuCtxSetCurrent", tn_.cuCtxSetCurrent(ep->ctx)));
  return RDA_OK;
}

static rda_status tn_group_start(rda_transport *t, rda_err *err) {
  tn_endpoint *ep = (tn_endpoint *)t;
  RDA_TRY(tn_check_live(ep, err));
  if (ep->state != 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: group_start inside a group",
                       t->rank);
  ep->nops = 0, ep->state = 1;
  return RDA_OK;
}

static rda_status tn_add(tn_endpoint *ep, int send, int peer, void *buf, size_t bytes,
                         rda_err *err) {
  if (ep->state != 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: %s outside a group", ep->base.rank,
                       send ? "send" : "recv");
  if (ep->nops == ep->cap) {
    const int cap = ep->cap ? 2 * ep->cap : 8;
    tn_op *n = realloc(ep->ops, (size_t)cap * sizeof *n);
    if (n == NULL)
      return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "rank %d: out of memory", ep->base.rank);
    ep->ops = n, ep->cap = cap;
  }
  ep->ops[ep->nops++] = (tn_op){.send = send, .peer = peer, .buf = buf, .bytes = bytes};
  return RDA_OK;
}

static rda_status tn_send(rda_transport *t, int peer, const void *buf, size_t bytes, rda_err *err) {
  void *b;
  memcpy(&b, &buf, sizeof b);
  return tn_add((tn_endpoint *)t, 1, peer, b, bytes, err);
}

static rda_status tn_recv(rda_transport *t, int peer, void *buf, size_t bytes, rda_err *err) {
  return tn_add((tn_endpoint *)t, 0, peer, buf, bytes, err);
}

/* Work the caller enqueues from now on runs after the communication stream's `done`. */
static rda_status tn_order_caller(tn_endpoint *ep, rda_err *err) {
  if (ep->b != NULL) return ep->b->stream_wait_event(ep->b, ep->done, err);
  return tn_cu(ep, err, "cuStreamWaitEvent", tn_.cuStreamWaitEvent(ep->caller, ep->done, 0));
}

/* A group that may have been posted failed (while posting, or in its wait): the communicator
 * is aborted, which stops the group's kernels, and the caller's stream still waits for the
 * communication stream, so that nothing the group began lands in a buffer the caller reuses
 * after the error (transport.h). Best effort: the error in hand is the one reported. */
static void tn_fence_failed(tn_endpoint *ep) {
  tn_abort_comm(ep, "a posted send/recv group failed");
  ep->state = 0;
  if (tn_.cuEventRecord(ep->done, ep->stream) != CUDA_SUCCESS) return;
  rda_err ignored = {0};
  (void)tn_order_caller(ep, &ignored);
}

/* From ncclGroupStart on, a failure fences the group (tn_fence_failed). */
static rda_status tn_post(tn_endpoint *ep, rda_err *err) {
  ncclResult_t r = tn_.ncclGroupStart();
  if (r != ncclSuccess) return tn_fail(ep, err, "ncclGroupStart", r);
  for (int q = 0; q < ep->nops; q++) {
    const tn_op *o = &ep->ops[q];
    r = o->send
            ? tn_.ncclSend(o->buf, o->bytes, ncclUint8, o->peer, ep->comm, (cudaStream_t)ep->stream)
            : tn_.ncclRecv(o->buf, o->bytes, ncclUint8, o->peer, ep->comm,
                           (cudaStream_t)ep->stream);
    if (r != ncclSuccess && r != ncclInProgress) {
      tn_.ncclGroupEnd();
      return tn_fail(ep, err, o->send ? "ncclSend" : "ncclRecv", r);
    }
  }
  r = tn_.ncclGroupEnd();
  if (r != ncclSuccess && r != ncclInProgress) return tn_fail(ep, err, "ncclGroupEnd", r);
  /* Non-blocking communicators may still be enqueueing: finish that before recording. */
  RDA_TRY(tn_poll(ep, 0, "ncclGroupEnd", err));
  return tn_cu(ep, err, "cuEventRecord", tn_.cuEventRecord(ep->done, ep->stream));
}

static rda_status tn_group_end(rda_transport *t, rda_err *err) {
  tn_endpoint *ep = (tn_endpoint *)t;
  RDA_TRY(tn_check_live(ep, err));
  if (ep->state != 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: group_end without group_start",
                       t->rank);
  ep->state = 0; /* closed, whatever follows; 2 once posted */
  /* Device-side order (transport.h): the group starts after the caller's work so far, on the
   * stream where the thread's kernels on b go. */
  if (ep->b != NULL) {
    RDA_TRY(ep->b->event_record(ep->b, ep->ready, err));
  } else {
    void *cs = NULL;
    int cs_set = 0;
    rda_backend_cuda_thread_stream(&cs, &cs_set);
    ep->caller = (CUstream)cs;
    RDA_TRY(tn_cu(ep, err, "cuEventRecord", tn_.cuEventRecord(ep->ready, ep->caller)));
  }
  RDA_TRY(tn_cu(ep, err, "cuStreamWaitEvent", tn_.cuStreamWaitEvent(ep->stream, ep->ready, 0)));
  ep->state = 2;
  const rda_status s = tn_post(ep, err);
  if (s != RDA_OK) tn_fence_failed(ep);
  return s;
}

static rda_status tn_wait(rda_transport *t, rda_err *err) {
  tn_endpoint *ep = (tn_endpoint *)t;
  const int posted = ep->state == 2;
  rda_status s = tn_check_live(ep, err);
  if (s == RDA_OK && !posted)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: wait without a posted group",
                       t->rank);
  if (s == RDA_OK) s = tn_poll(ep, 1, "a send/recv group", err);
  if (s != RDA_OK) {
    if (posted) tn_fence_failed(ep); /* as transport.h promises of a failed wait */
    return s;
  }
  ep->state = 0;
  /* Work the caller enqueues from now on runs after the transfers (already complete here, as
   * the poll above is what detects a timeout, but ordered all the same). */
  RDA_TRY(tn_order_caller(ep, err));
  for (int q = 0; q < ep->nops; q++) {
    if (ep->ops[q].send)
      t->bytes_sent += ep->ops[q].bytes;
    else
      t->bytes_received += ep->ops[q].bytes;
  }
  ep->nops = 0;
  return RDA_OK;
}

/* All ranks' 8-byte values through the scratch buffer (also the barrier). */
static rda_status tn_gather8(rda_transport *t, uint64_t mine, uint64_t *all, rda_err *err) {
  tn_endpoint *ep = (tn_endpoint *)t;
  RDA_TRY(tn_check_live(ep, err));
  const size_t slot = (size_t)ep->base.rank * 8u;
  /* On the communication stream, so the all-gather below reads it (a synchronous copy goes to
   * the legacy stream, which a non-blocking stream does not wait for). */
  RDA_TRY(tn_cu(ep, err, "cuMemcpyHtoDAsync",
                tn_.cuMemcpyHtoDAsync_v2(ep->scratch + slot, &mine, 8, ep->stream)));
  /* In place: the send buffer is this rank's slot of the receive buffer. */
  char *base = (char *)(uintptr_t)ep->scratch;
  ncclResult_t r =
      tn_.ncclAllGather(base + slot, base, 8, ncclUint8, ep->comm, (cudaStream_t)ep->stream);
  if (r != ncclSuccess && r != ncclInProgress) return tn_fail(ep, err, "ncclAllGather", r);
  RDA_TRY(tn_poll(ep, 0, "ncclAllGather", err));
  RDA_TRY(tn_cu(ep, err, "cuEventRecord", tn_.cuEventRecord(ep->done, ep->stream)));
  RDA_TRY(tn_poll(ep, 1, "an all-gather", err));
  if (all == NULL) return RDA_OK;
  /* On the communication stream too: a synchronous copy would go to the legacy stream and
   * wait for every blocking stream of the context, the caller's queued work included. */
  RDA_TRY(tn_cu(ep, err, "cuMemcpyDtoHAsync",
                tn_.cuMemcpyDtoHAsync_v2(all, ep->scratch, 8u * (size_t)ep->base.size,
                                         ep->stream)));
  RDA_TRY(tn_cu(ep, err, "cuEventRecord", tn_.cuEventRecord(ep->done, ep->stream)));
  return tn_poll(ep, 1, "an all-gather's read-back", err);
}

/* NCCL sets up a pair's point-to-point connection on its first transfer: one grouped exchange
 * of a byte each way with every peer does that now, through the scratch buffer (this rank's
 * slot sent, peer q's slot received). */
static rda_status tn_connect(rda_transport *t, const int *peers, int npeers, rda_err *err) {
  tn_endpoint *ep = (tn_endpoint *)t;
  char *base = (char *)(uintptr_t)ep->scratch;
  RDA_TRY(tn_group_start(t, err));
  for (int i = 0; i < npeers; i++) {
    RDA_TRY(tn_send(t, peers[i], base + 8u * (size_t)t->rank, 1, err));
    RDA_TRY(tn_recv(t, peers[i], base + 8u * (size_t)peers[i], 1, err));
  }
  RDA_TRY(tn_group_end(t, err));
  return tn_wait(t, err);
}

/* A filed abort request carried out now, on this thread, unless a call holds `call` (that call
 * carries it out, at its next poll or as it returns: tn_unlock_call). Both sides (the thread
 * that filed the request, the call that just unlocked) pass through one read-modify-write of
 * `handoff` before they look: those are totally ordered, and the later one acquires what the
 * earlier one did before it, so either the caller ending its call sees the request, or the
 * requester's trylock sees the call ended. (A standalone fence would order it as well, but
 * ThreadSanitizer cannot follow fences; it follows this.) */
static void tn_carry_out_if_free(tn_endpoint *ep) {
  __atomic_fetch_add(&ep->handoff, 1, __ATOMIC_SEQ_CST);
  if (!__atomic_load_n(&ep->abort_requested, __ATOMIC_SEQ_CST) ||
      pthread_mutex_trylock(&ep->call) != 0)
    return;
  CUcontext prev;
  const int restore = tn_ctx_enter(ep, &prev);
  tn_take_request(ep);
  tn_ctx_leave(restore, prev);
  pthread_mutex_unlock(&ep->call);
}

/* Any thread (see tn_endpoint): files the request, the first reason winning, and carries it
 * out at once unless a call is running (which then does): so transfers a failed ring call left
 * posted stop before that call returns its error and the caller reuses the buffers, and an
 * idle ring's communicator is aborted now, not at its destroy. */
static void tn_abort(rda_transport *t, const char *reason) {
  tn_endpoint *ep = (tn_endpoint *)t;
  pthread_mutex_lock(&ep->mu);
  if (!ep->abort_requested) {
    snprintf(ep->requested, sizeof ep->requested, "%s", reason);
    __atomic_store_n(&ep->abort_requested, 1, __ATOMIC_SEQ_CST);
  }
  pthread_mutex_unlock(&ep->mu);
  tn_carry_out_if_free(ep);
}

/* A communicator rda made, at the end: ncclCommFinalize flushes its operations while every
 * rank is still there, then ncclCommDestroy frees it without blocking; destroyed without a
 * finalize it would wait in a barrier of every rank, for ever when a peer aborted. With work
 * in flight (tn_destroy aborted it first), a failure, or no finalize within the timeout:
 * ncclCommAbort (current NCCL returns from it at once; the 2.18 - 2.20 manuals call it an
 * intra-node collective, so there an aborting rank may wait until its peers on the node abort
 * too). */
static void tn_release_comm(tn_endpoint *ep) {
  const ncclResult_t r = tn_.ncclCommFinalize(ep->comm);
  if (r != ncclSuccess && r != ncclInProgress) {
    tn_abort_comm(ep, "ncclCommFinalize failed");
    return;
  }
  rda_err ignored = {0};
  if (tn_poll(ep, 0, "ncclCommFinalize", &ignored) != RDA_OK) return; /* aborted it */
  tn_.ncclCommDestroy(ep->comm);
  ep->comm = NULL;
}

static void tn_destroy(rda_transport *t) {
  tn_endpoint *ep = (tn_endpoint *)t;
  CUcontext prev;
  const int restore = tn_ctx_enter(ep, &prev);
  tn_take_request(ep); /* a requested abort: the communicator is aborted, not destroyed */
  /* Transfers still posted (a group whose wait never came) would land in the scratch freed
   * below, or in the caller's buffers: abort the communicator, the caller's too (rda.h). */
  if (ep->state == 2) tn_abort_comm(ep, "destroyed with operations in flight");
  if (ep->comm != NULL && ep->owns_comm) tn_release_comm(ep);
  if (ep->done != NULL) tn_.cuEventDestroy_v2(ep->done);
  if (ep->ready != NULL) tn_.cuEventDestroy_v2(ep->ready);
  if (ep->scratch != 0) tn_.cuMemFree_v2(ep->scratch);
  tn_ctx_leave(restore, prev);
  free(ep->ops);
  pthread_mutex_destroy(&ep->mu);
  pthread_mutex_destroy(&ep->call);
  free(ep);
}

/* The end of a call: an abort requested after the call's last look (tn_take_request) found
 * `call` taken and left the request to it; carried out now, else it would wait for the next
 * call or the destroy. Checked after the unlock, so that a request filed just before it is
 * seen here or its own trylock succeeds. */
static void tn_unlock_call(tn_endpoint *ep) {
  pthread_mutex_unlock(&ep->call);
  tn_carry_out_if_free(ep);
}

/* The vtable's entry points hold ep->call throughout (see tn_endpoint). */
#define TN_LOCKED(name, params, args)      \
  static rda_status name##_locked params { \
    tn_endpoint *ep = (tn_endpoint *)t;    \
    pthread_mutex_lock(&ep->call);         \
    const rda_status s = name args;        \
    tn_unlock_call(ep);                    \
    return s;                              \
  }
TN_LOCKED(tn_group_start, (rda_transport * t, rda_err *err), (t, err))
TN_LOCKED(tn_send, (rda_transport * t, int peer, const void *buf, size_t bytes, rda_err *err),
          (t, peer, buf, bytes, err))
TN_LOCKED(tn_recv, (rda_transport * t, int peer, void *buf, size_t bytes, rda_err *err),
          (t, peer, buf, bytes, err))
TN_LOCKED(tn_group_end, (rda_transport * t, rda_err *err), (t, err))
TN_LOCKED(tn_wait, (rda_transport * t, rda_err *err), (t, err))
TN_LOCKED(tn_gather8, (rda_transport * t, uint64_t mine, uint64_t *all, rda_err *err),
          (t, mine, all, err))
TN_LOCKED(tn_connect, (rda_transport * t, const int *peers, int npeers, rda_err *err),
          (t, peers, npeers, err))
#undef TN_LOCKED

static const rda_transport_vtbl tn_vtbl = {
    .name = "nccl",
    .group_start = tn_group_start_locked,
    .send = tn_send_locked,
    .recv = tn_recv_locked,
    .group_end = tn_group_end_locked,
    .wait = tn_wait_locked,
    .gather8 = tn_gather8_locked,
    .connect = tn_connect_locked,
    .abort = tn_abort,
    .destroy = tn_destroy,
};

rda_status rda_transport_nccl_unique_id(void *id, rda_err *err) {
  RDA_TRY(tn_load(err));
  ncclUniqueId u;
  const ncclResult_t r = tn_.ncclGetUniqueId(&u);
  if (r != ncclSuccess)
    return rda_err_set(err, RDA_ERR_NCCL, "ncclGetUniqueId: %s", tn_.ncclGetErrorString(r));
  memcpy(id, &u, sizeof u);
  return RDA_OK;
}

/* Both entry points: open the endpoint, then the creation's all-gather of `word`. Joining
 * (telling 0), word is the fingerprint, checked against every rank's. Telling (1), it is this
 * rank's failure word, only given; once it is, nothing is pending: a caller's communicator is
 * left to the caller, ours aborted (the others' checks fail and abort theirs; a finalize would
 * wait for them), and the result is RDA_OK with *out NULL. */
static rda_status tn_join(void *comm, const void *unique_id, int rank, int size, void *stream,
                          rda_backend *b, uint64_t word, int telling, double timeout_s,
                          rda_transport **out, rda_err *err) {
  *out = NULL;
  if ((comm == NULL) == (unique_id == NULL))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "nccl transport: pass either a communicator or a unique id");
  if (size < 1 || rank < 0 || rank >= size || !(timeout_s > 0.0))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "nccl transport: rank %d of %d, timeout %g s",
                       rank, size, timeout_s);
  RDA_TRY(tn_load(err));
  tn_endpoint *ep = calloc(1, sizeof *ep);
  if (ep == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "nccl transport: out of memory");
  ep->base.vt = &tn_vtbl, ep->base.rank = rank, ep->base.size = size;
  ep->base.timeout_s = timeout_s;
  ep->stream = (CUstream)stream;
  ep->b = b != NULL && strcmp(b->name, "cuda") == 0 ? b : NULL;
  pthread_mutex_init(&ep->mu, NULL);
  pthread_mutex_init(&ep->call, NULL);
  if (tn_.cuCtxGetCurrent(&ep->ctx) != CUDA_SUCCESS) ep->ctx = NULL;
  rda_status s = RDA_OK;
  if (comm != NULL) {
    ep->comm = (ncclComm_t)comm;
    /* A non-blocking communicator may still be initializing: NCCL refuses every other call on
     * it until its state is ncclSuccess. */
    s = tn_poll(ep, 0, "the communicator's initialization", err);
    int n = 0, me = -1, dev = -1;
    CUdevice mine = -1;
    if (s == RDA_OK && (tn_.ncclCommCount(ep->comm, &n) != ncclSuccess ||
                        tn_.ncclCommUserRank(ep->comm, &me) != ncclSuccess || n != size ||
                        me != rank))
      s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                      "nccl transport: the communicator is rank %d of %d, expected %d of %d", me, n,
                      rank, size);
    /* Its kernels run on its device: on another than the context's they would read the ring's
     * buffers through peer access, or fault. */
    if (s == RDA_OK && tn_.ncclCommCuDevice(ep->comm, &dev) == ncclSuccess &&
        tn_.cuCtxGetDevice(&mine) == CUDA_SUCCESS && dev != (int)mine)
      s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                      "nccl transport: the communicator is on device %d, the context on device "
                      "%d",
                      dev, (int)mine);
  } else {
    /* Non-blocking init so a peer that never arrives is a timeout, not a hang. */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclUniqueId id;
    memcpy(&id, unique_id, sizeof id);
    ep->owns_comm = 1;
    const ncclResult_t r = tn_.ncclCommInitRankConfig(&ep->comm, size, id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
      /* A non-blocking init may hand out the communicator even when it fails. */
      if (ep->comm != NULL) tn_.ncclCommAbort(ep->comm);
      ep->comm = NULL;
      s = rda_err_set(err, RDA_ERR_NCCL, "rank %d: ncclCommInitRankConfig: %s", rank,
                      tn_.ncclGetErrorString(r));
    } else {
      s = tn_poll(ep, 0, "ncclCommInitRankConfig", err);
    }
  }
  if (s == RDA_OK)
    s = tn_cu(ep, err, "cuEventCreate", tn_.cuEventCreate(&ep->done, CU_EVENT_DISABLE_TIMING));
  if (s == RDA_OK)
    s = tn_cu(ep, err, "cuEventCreate", tn_.cuEventCreate(&ep->ready, CU_EVENT_DISABLE_TIMING));
  if (s == RDA_OK)
    s = tn_cu(ep, err, "cuMemAlloc", tn_.cuMemAlloc_v2(&ep->scratch, 8u * (size_t)size));
  if (s == RDA_OK && telling) s = tn_gather8(&ep->base, word, NULL, err);
  if (s == RDA_OK && telling) {
    if (!ep->owns_comm) ep->comm = NULL;
    tn_abort_comm(ep, "this rank told the others that it failed");
    tn_destroy(&ep->base);
    return RDA_OK;
  }
  /* The fingerprint check: every rank compares every rank's. A rank without room for them
   * still gives its word, saying it failed, so that the others fail at once. */
  uint64_t *all = s == RDA_OK ? calloc((size_t)size, sizeof *all) : NULL;
  if (s == RDA_OK && all == NULL) {
    s = tn_gather8(&ep->base, rda_transport_join_failed(RDA_ERR_OUT_OF_MEMORY), NULL, err);
    if (s == RDA_OK) s = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "nccl transport: out of memory");
  } else if (s == RDA_OK) {
    s = tn_gather8(&ep->base, word, all, err);
  }
  if (s == RDA_OK) s = rda_transport_check_fingerprints(all, size, rank, err);
  free(all);
  if (s != RDA_OK) {
    /* The caller's communicator is aborted after an NCCL or CUDA failure (its peers may have
     * transfers posted to it; rda.h: the handle is then gone), and left to the caller after
     * any other: a failed check (RDA_ERR_INVALID_ARGUMENT) comes after a completed gather,
     * on every rank alike, so no rank aborts a communicator its peers keep (ncclCommAbort
     * wants every rank). Ours: aborted, not finalized (its peers may never get as far as
     * that). */
    if (!ep->owns_comm && s != RDA_ERR_NCCL && s != RDA_ERR_CUDA) ep->comm = NULL;
    if (ep->comm != NULL) tn_abort_comm(ep, "the ring's creation failed");
    tn_destroy(&ep->base);
    return s;
  }
  *out = &ep->base;
  return RDA_OK;
}

rda_status rda_transport_nccl_create(void *comm, const void *unique_id, int rank, int size,
                                     void *stream, rda_backend *b, uint64_t fingerprint,
                                     double timeout_s, rda_transport **out, rda_err *err) {
  return tn_join(comm, unique_id, rank, size, stream, b, fingerprint, 0, timeout_s, out, err);
}

rda_status rda_transport_nccl_tell(void *comm, const void *unique_id, int rank, int size,
                                   void *stream, rda_backend *b, rda_status why, double timeout_s,
                                   rda_err *err) {
  rda_transport *t = NULL;
  return tn_join(comm, unique_id, rank, size, stream, b, rda_transport_join_failed(why), 1,
                 timeout_s, &t, err);
}

#endif
