/* fake_cuda.c — a fake libcuda.so.1 for tests on machines without a GPU: the driver entry points
 * the NCCL transport (runtime/transport_nccl.c) and the cuda backend (runtime/cuda.c: one sm_90
 * device; modules load but no kernel runs) load, over host memory and in-order stream queues
 * shared by the threads of one process (fake_cuda.h says the model), plus helpers a test reads
 * with dlsym. Built only for tests, into a folder of its own that LD_LIBRARY_PATH names. */
#include "fake_cuda.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FK_DEVICES = 8 };

struct CUctx_st {
  int device;
};

enum { FK_COPY_IN, FK_COPY_OUT, FK_WAIT, FK_WORK };

typedef struct fk_item {
  struct fk_item *next;
  int kind;
  CUdeviceptr dev; /* copies */
  void *host;      /* FK_COPY_IN: a snapshot the item owns, as pageable memory is staged */
  size_t bytes;
  CUstream on; /* FK_WAIT: until on has completed `ticket` items (NULL: gone, so done) */
  unsigned long long ticket;
  int (*run)(void *); /* FK_WORK */
  void (*release)(void *);
  void *arg;
} fk_item;

struct CUstream_st {
  struct CUstream_st *next; /* every live stream */
  fk_item *head, *tail;
  unsigned long long enqueued, completed; /* items ever queued, items completed (in order) */
  int held;
};

struct CUevent_st {
  struct CUevent_st *next; /* every live event */
  CUstream stream;         /* NULL: never recorded, or its stream is gone: complete */
  unsigned long long ticket;
};

typedef struct fk_alloc {
  struct fk_alloc *next;
  uintptr_t p;
  size_t bytes;
} fk_alloc;

typedef struct fk_waits {
  struct fk_waits *next;
  CUstream waiter, on;
  long n;
} fk_waits;

static pthread_mutex_t fk_mu_ = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fk_cv_ = PTHREAD_COND_INITIALIZER;
static struct CUctx_st fk_ctx_[FK_DEVICES] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
static _Thread_local CUcontext fk_current_;
static struct CUstream_st fk_null_; /* the NULL (legacy) stream: a stream like the others */
static CUstream fk_streams_ = &fk_null_;
static CUevent fk_events_;
static fk_alloc *fk_allocs_;
static fk_waits *fk_waits_;
static long fk_bad_, fk_no_ctx_;

/* NULL and the special handles CU_STREAM_LEGACY / CU_STREAM_PER_THREAD: the NULL stream. */
static CUstream fk_stream(CUstream s) {
  return (uintptr_t)s <= 2 ? &fk_null_ : s;
}

static int fk_has_context(void) {
  if (fk_current_ != NULL) return 1;
  fk_no_ctx_++;
  return 0;
}

void fake_cu_lock(void) {
  pthread_mutex_lock(&fk_mu_);
}

void fake_cu_unlock(void) {
  pthread_mutex_unlock(&fk_mu_);
}

void fake_cu_wait(void) {
  pthread_cond_wait(&fk_cv_, &fk_mu_);
}

int fake_cu_live(CUdeviceptr p, size_t bytes) {
  if (bytes == 0) return 1;
  for (const fk_alloc *a = fk_allocs_; a != NULL; a = a->next) {
    const uintptr_t off = (uintptr_t)p - a->p;
    if ((uintptr_t)p >= a->p && off <= a->bytes && bytes <= a->bytes - off) return 1;
  }
  fk_bad_++;
  return 0;
}

int fake_cu_current_device(void) {
  return fk_current_ != NULL ? fk_current_->device : -1;
}

static void fk_push(CUstream s, fk_item *it) {
  s = fk_stream(s);
  if (s->tail != NULL)
    s->tail->next = it;
  else
    s->head = it;
  s->tail = it;
  s->enqueued++;
}

void fake_cu_enqueue(CUstream s, int (*run)(void *arg), void (*release)(void *arg), void *arg) {
  fk_item *it = calloc(1, sizeof *it);
  if (it == NULL) abort(); /* a test double: no out-of-memory path */
  it->kind = FK_WORK, it->run = run, it->release = release, it->arg = arg;
  fk_push(s, it);
}

/* Runs the item at a stream's head: 1 when it completed. */
static int fk_step(fk_item *it) {
  switch (it->kind) {
    case FK_COPY_IN:
      if (fake_cu_live(it->dev, it->bytes)) memcpy((void *)(uintptr_t)it->dev, it->host, it->bytes);
      return 1;
    case FK_COPY_OUT:
      if (fake_cu_live(it->dev, it->bytes)) memcpy(it->host, (void *)(uintptr_t)it->dev, it->bytes);
      return 1;
    case FK_WAIT: return it->on == NULL || it->on->completed >= it->ticket;
    default: return it->run(it->arg);
  }
}

static void fk_free_item(fk_item *it) {
  if (it->kind == FK_WORK && it->release != NULL) it->release(it->arg);
  if (it->kind == FK_COPY_IN) free(it->host);
  free(it);
}

void fake_cu_progress(void) {
  for (int changed = 1; changed;) {
    changed = 0;
    for (CUstream s = fk_streams_; s != NULL; s = s->next)
      while (!s->held && s->head != NULL && fk_step(s->head)) {
        fk_item *it = s->head;
        s->head = it->next;
        if (s->head == NULL) s->tail = NULL;
        s->completed++;
        fk_free_item(it);
        changed = 1;
      }
  }
  pthread_cond_broadcast(&fk_cv_);
}

/* --- the driver API -------------------------------------------------------------------------- */

CUresult CUDAAPI cuGetErrorString(CUresult e, const char **s) {
  static const struct {
    CUresult e;
    const char *s;
  } names[] = {
      {CUDA_SUCCESS, "no error"},
      {CUDA_ERROR_INVALID_VALUE, "invalid argument"},
      {CUDA_ERROR_OUT_OF_MEMORY, "out of memory"},
      {CUDA_ERROR_INVALID_CONTEXT, "invalid device context"},
      {CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"},
      {CUDA_ERROR_NOT_READY, "device not ready"},
      {CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"},
      {CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"},
      {CUDA_ERROR_NOT_SUPPORTED, "operation not supported"},
  };
  if (s == NULL) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].e == e) {
      *s = names[i].s;
      return CUDA_SUCCESS;
    }
  *s = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *ctx) {
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  *ctx = fk_current_;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  fk_current_ = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device) {
  if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_cu_lock();
  const int ok = fk_has_context();
  fake_cu_unlock();
  if (!ok) return CUDA_ERROR_INVALID_CONTEXT;
  *device = fk_current_->device;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventCreate(CUevent *ev, unsigned int flags) {
  (void)flags;
  if (ev == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_cu_lock();
  CUresult r = CUDA_ERROR_INVALID_CONTEXT;
  if (fk_has_context()) {
    *ev = calloc(1, sizeof **ev);
    r = *ev != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) (*ev)->next = fk_events_, fk_events_ = *ev;
  }
  fake_cu_unlock();
  return r;
}

CUresult CUDAAPI cuEventRecord(CUevent ev, CUstream stream) {
  if (ev == NULL) return CUDA_ERROR_INVALID_HANDLE;
  fake_cu_lock();
  CUresult r = CUDA_ERROR_INVALID_CONTEXT;
  if (fk_has_context()) {
    ev->stream = fk_stream(stream);
    ev->ticket = ev->stream->enqueued; /* complete once everything queued so far is */
    r = CUDA_SUCCESS;
  }
  fake_cu_unlock();
  return r;
}

CUresult CUDAAPI cuEventQuery(CUevent ev) {
  if (ev == NULL) return CUDA_ERROR_INVALID_HANDLE;
  fake_cu_lock();
  const int done = ev->stream == NULL || ev->stream->completed >= ev->ticket;
  fake_cu_unlock();
  return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent ev) {
  if (ev == NULL) return CUDA_ERROR_INVALID_HANDLE;
  fake_cu_lock();
  CUevent *p = &fk_events_;
  while (*p != NULL && *p != ev) p = &(*p)->next;
  const int found = *p != NULL;
  if (found) *p = ev->next;
  fake_cu_unlock();
  if (!found) return CUDA_ERROR_INVALID_HANDLE;
  free(ev);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream stream, CUevent ev, unsigned int flags) {
  (void)flags;
  if (ev == NULL) return CUDA_ERROR_INVALID_HANDLE;
  fake_cu_lock();
  if (!fk_has_context()) {
    fake_cu_unlock();
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  CUstream waiter = fk_stream(stream);
  fk_waits *w = fk_waits_;
  while (w != NULL && !(w->waiter == waiter && w->on == ev->stream)) w = w->next;
  if (w == NULL && (w = calloc(1, sizeof *w)) != NULL) {
    w->waiter = waiter, w->on = ev->stream;
    w->next = fk_waits_, fk_waits_ = w;
  }
  /* A wait for work already done, or for an event never recorded, waits for nothing. */
  fk_item *it = NULL;
  const int pending = ev->stream != NULL && ev->stream->completed < ev->ticket;
  if (pending && (it = calloc(1, sizeof *it)) != NULL) {
    it->kind = FK_WAIT, it->on = ev->stream, it->ticket = ev->ticket;
    fk_push(waiter, it);
  }
  const CUresult r = w == NULL || (pending && it == NULL) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS) w->n++;
  fake_cu_progress();
  fake_cu_unlock();
  return r;
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
  if (p == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  fake_cu_lock();
  CUresult r = CUDA_ERROR_INVALID_CONTEXT;
  if (fk_has_context()) {
    fk_alloc *a = malloc(sizeof *a);
    void *mem = malloc(bytes);
    r = a != NULL && mem != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
      a->p = (uintptr_t)mem, a->bytes = bytes, a->next = fk_allocs_, fk_allocs_ = a;
      *p = (CUdeviceptr)a->p;
    } else {
      free(a), free(mem);
    }
  }
  fake_cu_unlock();
  return r;
}

/* Frees at once, without waiting for work queued on it: that work then counts as a bad access
 * (a real driver would not hang a test on it either way; the count says what went wrong). */
CUresult CUDAAPI cuMemFree_v2(CUdeviceptr p) {
  fake_cu_lock();
  CUresult r = CUDA_ERROR_INVALID_CONTEXT;
  fk_alloc *gone = NULL;
  if (fk_has_context()) {
    fk_alloc **a = &fk_allocs_;
    while (*a != NULL && (*a)->p != (uintptr_t)p) a = &(*a)->next;
    if (*a != NULL) {
      gone = *a;
      *a = gone->next;
      r = CUDA_SUCCESS;
    } else {
      fk_bad_++;
      r = CUDA_ERROR_INVALID_VALUE;
    }
  }
  fake_cu_unlock();
  if (gone != NULL) free((void *)gone->p);
  free(gone);
  return r;
}

static CUresult fk_copy(int kind, CUdeviceptr dev, void *host, size_t bytes, CUstream s) {
  fake_cu_lock();
  CUresult r = CUDA_ERROR_INVALID_CONTEXT;
  if (fk_has_context()) {
    fk_item *it = calloc(1, sizeof *it);
    r = it != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
      it->kind = kind, it->dev = dev, it->host = host, it->bytes = bytes;
      fk_push(s, it);
      fake_cu_progress();
    }
  }
  fake_cu_unlock();
  return r;
}

/* Host to device: the source is read now (staged, as from pageable memory), the device written
 * in stream order. */
CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream s) {
  void *copy = malloc(bytes > 0 ? bytes : 1);
  if (copy == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  if (bytes > 0) memcpy(copy, src, bytes);
  const CUresult r = fk_copy(FK_COPY_IN, dst, copy, bytes, s);
  if (r != CUDA_SUCCESS) free(copy);
  return r;
}

/* Device to host, in stream order. */
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream s) {
  return fk_copy(FK_COPY_OUT, src, dst, bytes, s);
}

/* --- one device, its primary context, streams, modules (what rda_ctx_create_cuda and
 * rda_plan_create need): device 0 reports an sm_90 GPU with H100-like limits; modules are
 * accepted and never run, so a launch fails. ---------------------------------------------- */

enum { FK_SMEM_OPTIN = 227 * 1024, FK_FN_REGS = 128 };

static int fk_retains_; /* cuDevicePrimaryCtxRetain minus releases */

CUresult CUDAAPI cuGetErrorName(CUresult e, const char **s) {
  static const struct {
    CUresult e;
    const char *s;
  } names[] = {
      {CUDA_SUCCESS, "CUDA_SUCCESS"},
      {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
      {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
      {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
      {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
      {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY"},
      {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
      {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE"},
      {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"},
  };
  if (s == NULL) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].e == e) {
      *s = names[i].s;
      return CUDA_SUCCESS;
    }
  *s = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuInit(unsigned int flags) {
  return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The toolkit the fake was built with, so NVRTC's cubins are never newer than "the driver". */
CUresult CUDAAPI cuDriverGetVersion(int *version) {
  if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
  if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
  *count = 1;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *dev, int ordinal) {
  if (dev == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *dev = 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *value, CUdevice_attribute attrib, CUdevice dev) {
  if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = 48 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = FK_SMEM_OPTIN; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *value = 228 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *value = 64 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *value = 64 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *value = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
    default: return CUDA_ERROR_INVALID_VALUE; /* not modelled: say so rather than invent it */
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
  if (name == NULL || len < 1) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "%s", "fake sm_90 GPU (tests/fake/fake_cuda.c)");
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  fake_cu_lock();
  fk_retains_++;
  fake_cu_unlock();
  *ctx = &fk_ctx_[0];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  fake_cu_lock();
  const int ok = fk_retains_ > 0;
  if (ok) fk_retains_--;
  fake_cu_unlock();
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult CUDAAPI cuStreamCreate(CUstream *stream, unsigned int flags) {
  (void)flags;
  if (stream == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_cu_lock();
  const int ok = fk_has_context();
  fake_cu_unlock();
  if (!ok) return CUDA_ERROR_INVALID_CONTEXT;
  *stream = fake_cu_stream_create();
  return *stream != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Waits until everything queued on the stream so far has completed. */
CUresult CUDAAPI cuStreamSynchronize(CUstream stream) {
  fake_cu_lock();
  if (!fk_has_context()) {
    fake_cu_unlock();
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  CUstream s = fk_stream(stream);
  const unsigned long long want = s->enqueued;
  fake_cu_progress();
  while (s->completed < want) fake_cu_wait();
  fake_cu_unlock();
  return CUDA_SUCCESS;
}

/* Unlike a driver, which lets queued work finish first, work still queued is dropped
 * (fake_cu_stream_destroy): a test never leaves work behind on a stream it destroys. */
CUresult CUDAAPI cuStreamDestroy_v2(CUstream stream) {
  if ((uintptr_t)stream <= 2) return CUDA_ERROR_INVALID_HANDLE;
  fake_cu_lock();
  const int ok = fk_has_context();
  fake_cu_unlock();
  if (!ok) return CUDA_ERROR_INVALID_CONTEXT;
  fake_cu_stream_destroy(stream);
  return CUDA_SUCCESS;
}

typedef struct fk_devop {
  CUdeviceptr dst, src; /* src 0: a memset of `value` */
  unsigned char value;
  size_t bytes;
} fk_devop;

static int fk_devop_run(void *arg) {
  const fk_devop *op = arg;
  if (!fake_cu_live(op->dst, op->bytes)) return 1;
  if (op->src == 0)
    memset((void *)(uintptr_t)op->dst, op->value, op->bytes);
  else if (fake_cu_live(op->src, op->bytes))
    memmove((void *)(uintptr_t)op->dst, (const void *)(uintptr_t)op->src, op->bytes);
  return 1;
}

static CUresult fk_devop_push(CUdeviceptr dst, CUdeviceptr src, unsigned char value, size_t bytes,
                              CUstream s) {
  fake_cu_lock();
  CUresult r = CUDA_ERROR_INVALID_CONTEXT;
  if (fk_has_context()) {
    fk_devop *op = calloc(1, sizeof *op);
    r = op != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (op != NULL) {
      op->dst = dst, op->src = src, op->value = value, op->bytes = bytes;
      fake_cu_enqueue(s, fk_devop_run, free, op);
      fake_cu_progress();
    }
  }
  fake_cu_unlock();
  return r;
}

CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                      CUstream s) {
  if (src == 0) return CUDA_ERROR_INVALID_VALUE;
  return fk_devop_push(dst, src, 0, bytes, s);
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream s) {
  return fk_devop_push(dst, 0, value, bytes, s);
}

struct CUfunc_st {
  struct CUfunc_st *next;
  int max_dynamic_smem;
};

struct CUmod_st {
  struct CUfunc_st *fns; /* handed out by cuModuleGetFunction, freed with the module */
};

/* Any ELF image (a cubin) loads; nothing in it is looked at further. */
CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image) {
  if (module == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_cu_lock();
  const int ok = fk_has_context();
  fake_cu_unlock();
  if (!ok) return CUDA_ERROR_INVALID_CONTEXT;
  if (memcmp(image, "\177ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  *module = calloc(1, sizeof **module);
  return *module != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuModuleUnload(CUmodule module) {
  if (module == NULL) return CUDA_ERROR_INVALID_HANDLE;
  while (module->fns != NULL) {
    struct CUfunc_st *f = module->fns;
    module->fns = f->next;
    free(f);
  }
  free(module);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *fn, CUmodule module, const char *name) {
  if (fn == NULL || name == NULL || name[0] == '\0') return CUDA_ERROR_INVALID_VALUE;
  if (module == NULL) return CUDA_ERROR_INVALID_HANDLE;
  struct CUfunc_st *f = calloc(1, sizeof *f);
  if (f == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  f->max_dynamic_smem = 48 * 1024;
  f->next = module->fns, module->fns = f;
  *fn = f;
  return CUDA_SUCCESS;
}

/* Plausible ptxas results: FK_FN_REGS registers, no static shared memory, no spills. */
CUresult CUDAAPI cuFuncGetAttribute(int *value, CUfunction_attribute attrib, CUfunction fn) {
  if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (fn == NULL) return CUDA_ERROR_INVALID_HANDLE;
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = FK_FN_REGS; break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *value = 0; break;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *value = 0; break;
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 64 * 1024 / FK_FN_REGS; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = fn->max_dynamic_smem; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncSetAttribute(CUfunction fn, CUfunction_attribute attrib, int value) {
  if (fn == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (attrib != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES || value < 0 ||
      value > FK_SMEM_OPTIN)
    return CUDA_ERROR_INVALID_VALUE;
  fn->max_dynamic_smem = value;
  return CUDA_SUCCESS;
}

/* Nothing runs here: a launch fails, so a test that reached one cannot pass by accident. */
CUresult CUDAAPI cuLaunchKernel(CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz,
                                unsigned int bx, unsigned int by, unsigned int bz,
                                unsigned int smem, CUstream stream, void **params, void **extra) {
  (void)fn, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)stream;
  (void)params, (void)extra;
  return CUDA_ERROR_NOT_SUPPORTED;
}

/* --- test helpers ---------------------------------------------------------------------------- */

CUstream fake_cu_stream_create(void) {
  CUstream s = calloc(1, sizeof *s);
  if (s == NULL) return NULL;
  fake_cu_lock();
  s->next = fk_streams_, fk_streams_ = s;
  fake_cu_unlock();
  return s;
}

void fake_cu_stream_destroy(CUstream s) {
  if ((uintptr_t)s <= 2) return;
  fake_cu_lock();
  CUstream *p = &fk_streams_;
  while (*p != NULL && *p != s) p = &(*p)->next;
  if (*p == NULL) {
    fake_cu_unlock();
    return;
  }
  *p = s->next;
  while (s->head != NULL) {
    fk_item *it = s->head;
    s->head = it->next;
    fk_free_item(it);
  }
  /* Events recorded on it and waits for them no longer wait for anything. */
  for (CUevent e = fk_events_; e != NULL; e = e->next)
    if (e->stream == s) e->stream = NULL;
  for (CUstream o = fk_streams_; o != NULL; o = o->next)
    for (fk_item *it = o->head; it != NULL; it = it->next)
      if (it->kind == FK_WAIT && it->on == s) it->on = NULL;
  for (fk_waits **w = &fk_waits_; *w != NULL;) {
    if ((*w)->waiter == s || (*w)->on == s) {
      fk_waits *gone = *w;
      *w = gone->next;
      free(gone);
    } else {
      w = &(*w)->next;
    }
  }
  fake_cu_progress();
  fake_cu_unlock();
  free(s);
}

CUcontext fake_cu_context(int device) {
  return device >= 0 && device < FK_DEVICES ? &fk_ctx_[device] : NULL;
}

void fake_cu_stream_hold(CUstream s, int hold) {
  fake_cu_lock();
  fk_stream(s)->held = hold;
  fake_cu_progress();
  fake_cu_unlock();
}

long fake_cu_stream_waits(CUstream waiter, CUstream on) {
  fake_cu_lock();
  long n = 0;
  for (const fk_waits *w = fk_waits_; w != NULL; w = w->next)
    if (w->waiter == fk_stream(waiter) && w->on == fk_stream(on)) n = w->n;
  fake_cu_unlock();
  return n;
}

long fake_cu_bad_accesses(void) {
  fake_cu_lock();
  const long n = fk_bad_;
  fake_cu_unlock();
  return n;
}

long fake_cu_no_context_calls(void) {
  fake_cu_lock();
  const long n = fk_no_ctx_;
  fake_cu_unlock();
  return n;
}
