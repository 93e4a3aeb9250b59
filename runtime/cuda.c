/* cuda.c — the GPU backend: the CUDA driver API loaded with dlopen("libcuda.so.1") at run time
 * (never linked, so rda runs and reports clearly where there is no driver), kernels from a
 * bundle, the kernel cache or NVRTC for the device's sm_XX, loaded as cubins and launched. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cache.h"
#include "log.h"
#include "nvrtc.h"

/* Every driver entry point rda uses, by its exact (versioned) exported name. */
#define RDA_CUDA_ENTRY_POINTS(X)                                                             \
  X(cuInit, (unsigned int flags))                                                            \
  X(cuDriverGetVersion, (int *version))                                                      \
  X(cuDeviceGetCount, (int *count))                                                          \
  X(cuDeviceGet, (CUdevice * dev, int ordinal))                                              \
  X(cuDeviceGetAttribute, (int *value, CUdevice_attribute attrib, CUdevice dev))             \
  X(cuDeviceGetName, (char *name, int len, CUdevice dev))                                    \
  X(cuDevicePrimaryCtxRetain, (CUcontext * ctx, CUdevice dev))                               \
  X(cuDevicePrimaryCtxRelease_v2, (CUdevice dev))                                            \
  X(cuCtxSetCurrent, (CUcontext ctx))                                                        \
  X(cuStreamCreate, (CUstream * stream, unsigned int flags))                                 \
  X(cuStreamSynchronize, (CUstream stream))                                                  \
  X(cuStreamDestroy_v2, (CUstream stream))                                                   \
  X(cuStreamWaitEvent, (CUstream stream, CUevent ev, unsigned int flags))                    \
  X(cuEventCreate, (CUevent * ev, unsigned int flags))                                       \
  X(cuEventDestroy_v2, (CUevent ev))                                                         \
  X(cuEventRecord, (CUevent ev, CUstream stream))                                            \
  X(cuEventQuery, (CUevent ev))                                                              \
  X(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytes))                                       \
  X(cuMemFree_v2, (CUdeviceptr dptr))                                                        \
  X(cuMemcpyHtoDAsync_v2, (CUdeviceptr dst, const void *src, size_t bytes, CUstream stream)) \
  X(cuMemcpyDtoHAsync_v2, (void *dst, CUdeviceptr src, size_t bytes, CUstream stream))       \
  X(cuMemcpyDtoDAsync_v2, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream)) \
  X(cuMemsetD8Async, (CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream))  \
  X(cuModuleLoadData, (CUmodule * module, const void *image))                                \
  X(cuModuleUnload, (CUmodule module))                                                       \
  X(cuModuleGetFunction, (CUfunction * fn, CUmodule module, const char *name))               \
  X(cuFuncSetAttribute, (CUfunction fn, CUfunction_attribute attrib, int value))             \
  X(cuFuncGetAttribute, (int *value, CUfunction_attribute attrib, CUfunction fn))            \
  X(cuLaunchKernel, (CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz,       \
                     unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,   \
                     CUstream stream, void **params, void **extra))                          \
  X(cuGetErrorString, (CUresult error, const char **str))                                    \
  X(cuGetErrorName, (CUresult error, const char **str))

typedef struct rda_cuda_api {
#define RDA_CUDA_FIELD(sym, args) CUresult(CUDAAPI *sym) args;
  RDA_CUDA_ENTRY_POINTS(RDA_CUDA_FIELD)
#undef RDA_CUDA_FIELD
} rda_cuda_api;

static rda_cuda_api rda_cuda_api_;
/* Optional entry points: a driver without them still opens; only what needs them fails. The
 * event timer is cuEventElapsedTime_v2 in CUDA 13 (cuda.h #defines the plain name to it), the
 * plain export before: the newest the driver has. */
typedef CUresult(CUDAAPI *rda_cuda_elapsed_fn)(float *ms, CUevent start, CUevent end);
static rda_cuda_elapsed_fn rda_cuda_elapsed_;
static const char *rda_cuda_elapsed_name_ = "cuEventElapsedTime";
static int rda_cuda_loaded_;         /* 1 when every entry point resolved */
static char rda_cuda_load_msg_[512]; /* why loading failed */
static pthread_once_t rda_cuda_once_ = PTHREAD_ONCE_INIT;

/* The pointer types above must be exactly cuda.h's: an unevaluated assignment checks each
 * (it references no symbol, so libcuda stays unlinked). */
static void rda_cuda_check_signatures(void) {
#define RDA_CUDA_SIGCHECK(sym, args) (void)sizeof(rda_cuda_api_.sym = sym);
  RDA_CUDA_ENTRY_POINTS(RDA_CUDA_SIGCHECK)
#undef RDA_CUDA_SIGCHECK
  (void)sizeof(rda_cuda_elapsed_ = cuEventElapsedTime);
}

/* Loads the driver once per process; it is never unloaded (libcuda does not support it). */
static void rda_cuda_load_once(void) {
  rda_cuda_check_signatures();
  dlerror();
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char *why = dlerror();
    if (why == NULL) why = "cannot be loaded";
    /* dlerror() usually starts with the library's name already. */
    const int named = strncmp(why, "libcuda.so.1", 12) == 0;
    snprintf(rda_cuda_load_msg_, sizeof rda_cuda_load_msg_, "no CUDA driver: %s%s",
             named ? "" : "libcuda.so.1: ", why);
    return;
  }
#define RDA_CUDA_RESOLVE(sym, args)                                                       \
  {                                                                                       \
    void *p = dlsym(lib, #sym);                                                           \
    if (p == NULL) {                                                                      \
      const char *why = dlerror();                                                        \
      snprintf(rda_cuda_load_msg_, sizeof rda_cuda_load_msg_,                             \
               "CUDA driver too old: libcuda.so.1 has no %s (%s)", #sym, why ? why : ""); \
      return;                                                                             \
    }                                                                                     \
    memcpy(&rda_cuda_api_.sym, &p, sizeof p);                                             \
  }
  RDA_CUDA_ENTRY_POINTS(RDA_CUDA_RESOLVE)
#undef RDA_CUDA_RESOLVE
  static const char *const elapsed_names[] = {"cuEventElapsedTime_v2", "cuEventElapsedTime"};
  for (size_t i = 0; i < 2 && rda_cuda_elapsed_ == NULL; ++i) {
    void *p = dlsym(lib, elapsed_names[i]);
    if (p == NULL) continue;
    memcpy(&rda_cuda_elapsed_, &p, sizeof p);
    rda_cuda_elapsed_name_ = elapsed_names[i];
  }
  dlerror(); /* a missing optional symbol is no error */
  rda_cuda_loaded_ = 1;
}

static rda_status rda_cuda_load(rda_err *err) {
  pthread_once(&rda_cuda_once_, rda_cuda_load_once);
  if (!rda_cuda_loaded_) return rda_err_set(err, RDA_ERR_CUDA, "%s", rda_cuda_load_msg_);
  return RDA_OK;
}

/* Records "file:line: cuXxx: CUDA_ERROR_NAME: description" for a failed call. */
static rda_status rda_cuda_check(CUresult r, const char *call, const char *file, int line,
                                 rda_err *err) {
  if (r == CUDA_SUCCESS) return RDA_OK;
  const char *slash = strrchr(file, '/');
  if (slash != NULL) file = slash + 1;
  const char *name = NULL, *desc = NULL;
  if (rda_cuda_api_.cuGetErrorName == NULL ||
      rda_cuda_api_.cuGetErrorName(r, &name) != CUDA_SUCCESS)
    name = NULL;
  if (rda_cuda_api_.cuGetErrorString == NULL ||
      rda_cuda_api_.cuGetErrorString(r, &desc) != CUDA_SUCCESS)
    desc = NULL;
  const rda_status s = r == CUDA_ERROR_OUT_OF_MEMORY ? RDA_ERR_OUT_OF_MEMORY : RDA_ERR_CUDA;
  if (name == NULL) return rda_err_set(err, s, "%s:%d: %s: CUresult %d", file, line, call, (int)r);
  return rda_err_set(err, s, "%s:%d: %s: %s: %s", file, line, call, name, desc ? desc : "");
}

/* Calls the driver entry point `sym` and records a failure; evaluates to an rda_status. */
#define RDA_CU(err, sym, ...) \
  rda_cuda_check(rda_cuda_api_.sym(__VA_ARGS__), #sym, __FILE__, __LINE__, (err))
#define RDA_CU_TRY(err, sym, ...) RDA_TRY(RDA_CU(err, sym, __VA_ARGS__))

typedef struct rda_cuda_impl {
  CUdevice dev;
  CUcontext ctx; /* the device's primary context, retained */
  CUstream stream;
  int ordinal;
  int smem_optin;     /* max dynamic shared memory per block, opt-in */
  int driver_version; /* CUDA version the driver supports, as 13000 */
} rda_cuda_impl;

struct rda_module {
  CUmodule module;
  CUfunction fn;
  int registers;
  int spill_bytes;
  int static_smem;  /* from ptxas */
  int dynamic_smem; /* what the variant asks for */
  char name[128];
};

static rda_cuda_impl *rda_cuda_impl_of(rda_backend *b) {
  return (rda_cuda_impl *)b->impl;
}

/* The context is current on whichever thread calls into the backend. */
static rda_status rda_cuda_enter(rda_backend *b, rda_err *err) {
  return RDA_CU(err, cuCtxSetCurrent, rda_cuda_impl_of(b)->ctx);
}

static CUdeviceptr rda_cuda_dptr(const void *p) {
  return (CUdeviceptr)(uintptr_t)p;
}

static rda_status rda_cuda_alloc(rda_backend *b, size_t bytes, void **dptr, rda_err *err) {
  *dptr = NULL;
  if (bytes == 0) return RDA_OK;
  RDA_TRY(rda_cuda_enter(b, err));
  CUdeviceptr p = 0;
  RDA_CU_TRY(err, cuMemAlloc_v2, &p, bytes);
  *dptr = (void *)(uintptr_t)p;
  return RDA_OK;
}

static void rda_cuda_free(rda_backend *b, void *dptr) {
  if (dptr == NULL) return;
  if (rda_cuda_enter(b, NULL) != RDA_OK) return;
  (void)RDA_CU(NULL, cuStreamSynchronize, rda_cuda_impl_of(b)->stream); /* kernels may use it */
  (void)RDA_CU(NULL, cuMemFree_v2, rda_cuda_dptr(dptr));
}

static rda_status rda_cuda_upload(rda_backend *b, void *dst, const void *src, size_t bytes,
                                  rda_err *err) {
  if (bytes == 0) return RDA_OK;
  RDA_TRY(rda_cuda_enter(b, err));
  /* On the backend's stream, so the copy is ordered after the kernels queued before it; then
   * wait, so src may be reused as soon as this returns. */
  CUstream s = rda_cuda_impl_of(b)->stream;
  RDA_CU_TRY(err, cuMemcpyHtoDAsync_v2, rda_cuda_dptr(dst), src, bytes, s);
  return RDA_CU(err, cuStreamSynchronize, s);
}

static rda_status rda_cuda_download(rda_backend *b, void *dst, const void *src, size_t bytes,
                                    rda_err *err) {
  if (bytes == 0) return RDA_OK;
  RDA_TRY(rda_cuda_enter(b, err));
  CUstream s = rda_cuda_impl_of(b)->stream;
  RDA_CU_TRY(err, cuMemcpyDtoHAsync_v2, dst, rda_cuda_dptr(src), bytes, s);
  return RDA_CU(err, cuStreamSynchronize, s);
}

static void rda_cuda_unload(rda_backend *b, rda_module *m) {
  if (m == NULL) return;
  if (m->module != NULL && rda_cuda_enter(b, NULL) == RDA_OK)
    (void)RDA_CU(NULL, cuModuleUnload, m->module);
  free(m);
}

/* The cubin of a variant for b->arch, from the first place that has it: an ahead-of-time
 * bundle in $RDA_KERNEL_PATH (read-only, matched by name, arch and source hash, the cubin
 * checked against the manifest's cubin_sha256), the kernel cache (memory, then disk), else
 * NVRTC (and the result is stored in the cache). With skip_bundles the bundles are not asked
 * (a bundle cubin the driver refused). *from_bundle (may be NULL) tells where it came from. */
static rda_status rda_cuda_image(rda_backend *b, const rda_variant *v, int skip_bundles,
                                 unsigned char **image, size_t *bytes, int *from_bundle,
                                 rda_err *err) {
  *image = NULL;
  *bytes = 0;
  if (from_bundle != NULL) *from_bundle = 0;
  char file[4096];
  int found = 0;
  if (!skip_bundles)
    RDA_TRY(rda_cache_bundle_load(getenv("RDA_KERNEL_PATH"), v->name, b->arch, v->source, image,
                                  bytes, file, sizeof file, &found, err));
  if (found) {
    rda_log(RDA_LOG_INFO, "loaded %s for sm_%d from %s (ahead-of-time bundle, RDA_KERNEL_PATH)",
            v->name, b->arch, file);
    if (from_bundle != NULL) *from_bundle = 1;
    return RDA_OK;
  }
  return rda_cache_cubin(b->arch, v->name, v->source, image, bytes, NULL, err);
}

static rda_status rda_cuda_load_variant(rda_backend *b, const rda_variant *v, rda_module **out,
                                        rda_err *err) {
  *out = NULL;
  if (v == NULL || v->source == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "cuda: load: variant without source");
  rda_cuda_impl *impl = rda_cuda_impl_of(b);
  unsigned char *image = NULL;
  size_t image_bytes = 0;
  int from_bundle = 0;
  RDA_TRY(rda_cuda_image(b, v, 0, &image, &image_bytes, &from_bundle, err));
  rda_module *m = calloc(1, sizeof *m);
  if (m == NULL) {
    free(image);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "cuda: no memory for a module");
  }
  snprintf(m->name, sizeof m->name, "%s", v->name);
  m->dynamic_smem = v->smem_bytes;
  rda_status st = rda_cuda_enter(b, err);
  if (st == RDA_OK && from_bundle) {
    /* A bundle cubin the driver refuses (built by another toolkit, say), or one without the
     * kernel (a manifest naming another kernel's cubin), is passed over: the cache or NVRTC
     * give one this driver takes. */
    rda_err why = {0};
    if (RDA_CU(&why, cuModuleLoadData, &m->module, image) != RDA_OK ||
        RDA_CU(&why, cuModuleGetFunction, &m->fn, m->module, v->name) != RDA_OK) {
      rda_log(RDA_LOG_INFO, "bundle cubin of %s for sm_%d not loadable (%s): compiling instead",
              v->name, b->arch, why.msg);
      if (m->module != NULL) (void)RDA_CU(NULL, cuModuleUnload, m->module);
      free(image);
      image = NULL;
      m->module = NULL;
      m->fn = NULL;
      st = rda_cuda_image(b, v, 1, &image, &image_bytes, NULL, err);
    }
  }
  if (st == RDA_OK && m->module == NULL) {
    rda_err why = {0};
    st = RDA_CU(&why, cuModuleLoadData, &m->module, image);
    const int nv = rda_nvrtc_version(), dv = impl->driver_version;
    if (st != RDA_OK && dv < nv) /* a cubin from a newer toolkit than the driver knows */
      rda_err_set(err, st, "%s (the driver supports CUDA %d.%d, NVRTC is %d.%d: update the driver)",
                  why.msg, dv / 1000, dv % 1000 / 10, nv / 1000, nv % 1000 / 10);
    else if (st != RDA_OK)
      rda_err_set(err, st, "%s", why.msg);
  }
  free(image);
  if (st == RDA_OK) st = RDA_CU(err, cuModuleGetFunction, &m->fn, m->module, v->name);
  /* What ptxas reported, asked of the loaded function (a cached cubin has no log). */
  if (st == RDA_OK)
    st = RDA_CU(err, cuFuncGetAttribute, &m->registers, CU_FUNC_ATTRIBUTE_NUM_REGS, m->fn);
  if (st == RDA_OK)
    st = RDA_CU(err, cuFuncGetAttribute, &m->static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                m->fn);
  if (st == RDA_OK)
    st = RDA_CU(err, cuFuncGetAttribute, &m->spill_bytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                m->fn);
  if (st == RDA_OK && (v->smem_bytes < 0 || m->static_smem + v->smem_bytes > impl->smem_optin))
    st = rda_err_set(err, RDA_ERR_UNSUPPORTED,
                     "cuda: %s needs %d + %d bytes of shared memory; sm_%d allows %d per block",
                     v->name, m->static_smem, v->smem_bytes, b->arch, impl->smem_optin);
  if (st == RDA_OK && v->smem_bytes > 48 * 1024)
    st = RDA_CU(err, cuFuncSetAttribute, m->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                v->smem_bytes);
  if (st != RDA_OK) {
    rda_cuda_unload(b, m);
    return st;
  }
  *out = m;
  return RDA_OK;
}

/* The caller's stream for launches made by this thread (librda's rda_forward), if any. */
static _Thread_local struct {
  int set;
  CUstream stream;
} rda_cuda_caller_stream_;

void rda_backend_cuda_use_stream(void *stream) {
  rda_cuda_caller_stream_.set = 1;
  rda_cuda_caller_stream_.stream = (CUstream)stream;
}

void rda_backend_cuda_own_stream(void) {
  rda_cuda_caller_stream_.set = 0;
  rda_cuda_caller_stream_.stream = NULL;
}

/* Streams set with set_stream, per backend, for the calling thread (a handful of backends per
 * thread at most; when all slots are taken, the oldest is reused). */
enum { RDA_CUDA_SET_STREAMS = 8 };
static _Thread_local struct {
  rda_backend *b;
  CUstream stream;
} rda_cuda_set_streams_[RDA_CUDA_SET_STREAMS];

static void *rda_cuda_set_stream(rda_backend *b, void *s) {
  int slot = -1, free_slot = -1;
  for (int q = 0; q < RDA_CUDA_SET_STREAMS; q++) {
    if (rda_cuda_set_streams_[q].b == b) slot = q;
    if (rda_cuda_set_streams_[q].b == NULL && free_slot < 0) free_slot = q;
  }
  void *was = slot >= 0 ? (void *)rda_cuda_set_streams_[slot].stream : NULL;
  if (s == NULL) {
    if (slot >= 0) rda_cuda_set_streams_[slot].b = NULL, rda_cuda_set_streams_[slot].stream = NULL;
    return was;
  }
  if (slot < 0) slot = free_slot;
  if (slot < 0) { /* full: drop the oldest entry */
    memmove(&rda_cuda_set_streams_[0], &rda_cuda_set_streams_[1],
            (RDA_CUDA_SET_STREAMS - 1) * sizeof rda_cuda_set_streams_[0]);
    slot = RDA_CUDA_SET_STREAMS - 1;
  }
  rda_cuda_set_streams_[slot].b = b;
  rda_cuda_set_streams_[slot].stream = (CUstream)s;
  return was;
}

/* The stream the calling thread's work on b goes to: set_stream's, else the caller's stream of
 * rda_backend_cuda_use_stream, else the backend's own. set_stream wins so that code holding a
 * backend (the device transport) can put work on its own stream whatever the caller chose. */
static CUstream rda_cuda_current(rda_backend *b) {
  for (int q = 0; q < RDA_CUDA_SET_STREAMS; q++)
    if (rda_cuda_set_streams_[q].b == b) return rda_cuda_set_streams_[q].stream;
  if (rda_cuda_caller_stream_.set) return rda_cuda_caller_stream_.stream;
  return rda_cuda_impl_of(b)->stream;
}

void rda_backend_cuda_thread_stream(void **stream, int *set) {
  *stream = rda_cuda_caller_stream_.set ? (void *)rda_cuda_caller_stream_.stream : NULL;
  *set = rda_cuda_caller_stream_.set;
}

static rda_status rda_cuda_memset_async(rda_backend *b, void *dptr, int value, size_t bytes,
                                        rda_err *err) {
  if (bytes == 0) return RDA_OK;
  RDA_TRY(rda_cuda_enter(b, err));
  return RDA_CU(err, cuMemsetD8Async, rda_cuda_dptr(dptr), (unsigned char)value, bytes,
                rda_cuda_current(b));
}

static rda_status rda_cuda_copy_async(rda_backend *b, void *dst, const void *src, size_t bytes,
                                      rda_err *err) {
  if (bytes == 0) return RDA_OK;
  RDA_TRY(rda_cuda_enter(b, err));
  return RDA_CU(err, cuMemcpyDtoDAsync_v2, rda_cuda_dptr(dst), rda_cuda_dptr(src), bytes,
                rda_cuda_current(b));
}

static rda_status rda_cuda_event_create(rda_backend *b, void **ev, rda_err *err) {
  *ev = NULL;
  RDA_TRY(rda_cuda_enter(b, err));
  CUevent e = NULL;
  RDA_CU_TRY(err, cuEventCreate, &e, CU_EVENT_DISABLE_TIMING);
  *ev = e;
  return RDA_OK;
}

static rda_status rda_cuda_event_create_timed(rda_backend *b, void **ev, rda_err *err) {
  *ev = NULL;
  RDA_TRY(rda_cuda_enter(b, err));
  CUevent e = NULL;
  RDA_CU_TRY(err, cuEventCreate, &e, CU_EVENT_DEFAULT);
  *ev = e;
  return RDA_OK;
}

/* Both events must be complete: an event still pending is CUDA_ERROR_NOT_READY, an untimed
 * one CUDA_ERROR_INVALID_HANDLE. */
static rda_status rda_cuda_event_elapsed_ms(rda_backend *b, void *start, void *end, float *ms,
                                            rda_err *err) {
  if (ms == NULL || start == NULL || end == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "cuda: elapsed time of a NULL event");
  *ms = 0.0f;
  if (rda_cuda_elapsed_ == NULL)
    return rda_err_set(err, RDA_ERR_UNSUPPORTED,
                       "cuda: this CUDA driver has neither cuEventElapsedTime_v2 nor "
                       "cuEventElapsedTime: no event timing");
  RDA_TRY(rda_cuda_enter(b, err));
  return rda_cuda_check(rda_cuda_elapsed_(ms, (CUevent)start, (CUevent)end),
                        rda_cuda_elapsed_name_, __FILE__, __LINE__, err);
}

static void rda_cuda_event_destroy(rda_backend *b, void *ev) {
  if (ev == NULL || rda_cuda_enter(b, NULL) != RDA_OK) return;
  (void)RDA_CU(NULL, cuEventDestroy_v2, (CUevent)ev);
}

static rda_status rda_cuda_event_record(rda_backend *b, void *ev, rda_err *err) {
  if (ev == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "cuda: record of a NULL event");
  RDA_TRY(rda_cuda_enter(b, err));
  return RDA_CU(err, cuEventRecord, (CUevent)ev, rda_cuda_current(b));
}

static rda_status rda_cuda_stream_wait_event(rda_backend *b, void *ev, rda_err *err) {
  if (ev == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "cuda: wait on a NULL event");
  RDA_TRY(rda_cuda_enter(b, err));
  return RDA_CU(err, cuStreamWaitEvent, rda_cuda_current(b), (CUevent)ev, 0);
}

static rda_status rda_cuda_event_query(rda_backend *b, void *ev, int *done, rda_err *err) {
  *done = 0;
  if (ev == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "cuda: query of a NULL event");
  RDA_TRY(rda_cuda_enter(b, err));
  const CUresult r = rda_cuda_api_.cuEventQuery((CUevent)ev);
  if (r == CUDA_ERROR_NOT_READY) return RDA_OK;
  RDA_TRY(rda_cuda_check(r, "cuEventQuery", __FILE__, __LINE__, err));
  *done = 1;
  return RDA_OK;
}

static rda_status rda_cuda_stream_create(rda_backend *b, void **s, rda_err *err) {
  *s = NULL;
  RDA_TRY(rda_cuda_enter(b, err));
  CUstream st = NULL;
  RDA_CU_TRY(err, cuStreamCreate, &st, CU_STREAM_NON_BLOCKING);
  *s = st;
  return RDA_OK;
}

/* Work still queued on s completes; the driver releases the stream afterwards. */
static void rda_cuda_stream_destroy(rda_backend *b, void *s) {
  if (s == NULL || rda_cuda_enter(b, NULL) != RDA_OK) return;
  (void)RDA_CU(NULL, cuStreamDestroy_v2, (CUstream)s);
}

static rda_status rda_cuda_launch(rda_backend *b, rda_module *m, const unsigned grid[3],
                                  unsigned threads, unsigned smem_bytes, const void *params,
                                  size_t params_bytes, rda_err *err) {
  if (m == NULL || params == NULL || params_bytes == 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "cuda: launch: no module or parameters");
  if (smem_bytes > 48u * 1024u && (int)smem_bytes > m->dynamic_smem)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "cuda: launch of %s with %u bytes of dynamic shared memory; it was loaded "
                       "for %d",
                       m->name, smem_bytes, m->dynamic_smem);
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return RDA_OK; /* nothing to do */
  RDA_TRY(rda_cuda_enter(b, err));
  /* The kernel takes one struct by value: one parameter, copied by the driver at launch. */
  void *args[1];
  memcpy(&args[0], &params, sizeof params);
  return RDA_CU(err, cuLaunchKernel, m->fn, grid[0], grid[1], grid[2], threads, 1, 1, smem_bytes,
                rda_cuda_current(b), args, NULL);
}

static rda_status rda_cuda_synchronize(rda_backend *b, rda_err *err) {
  RDA_TRY(rda_cuda_enter(b, err));
  return RDA_CU(err, cuStreamSynchronize, rda_cuda_impl_of(b)->stream);
}

static void rda_cuda_destroy(rda_backend *b) {
  if (b == NULL) return;
  (void)rda_cuda_set_stream(b, NULL); /* no stale entry if the address is reused */
  rda_cuda_impl *impl = rda_cuda_impl_of(b);
  if (impl != NULL) {
    if (impl->ctx != NULL) {
      if (impl->stream != NULL && rda_cuda_enter(b, NULL) == RDA_OK) {
        (void)RDA_CU(NULL, cuStreamSynchronize, impl->stream);
        (void)RDA_CU(NULL, cuStreamDestroy_v2, impl->stream);
      }
      (void)RDA_CU(NULL, cuDevicePrimaryCtxRelease_v2, impl->dev);
    }
    free(impl);
  }
  free(b);
}

static rda_status rda_cuda_attr(CUdevice dev, CUdevice_attribute a, int *v, rda_err *err) {
  return RDA_CU(err, cuDeviceGetAttribute, v, a, dev);
}

rda_status rda_backend_cuda_open(rda_backend **out, int ordinal, rda_err *err) {
  if (out == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_backend_cuda_open: out is NULL");
  *out = NULL;
  if (ordinal < 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "cuda: GPU ordinal %d is negative", ordinal);
  RDA_TRY(rda_cuda_load(err));
  RDA_CU_TRY(err, cuInit, 0);
  int count = 0;
  RDA_CU_TRY(err, cuDeviceGetCount, &count);
  if (ordinal >= count)
    return rda_err_set(err, RDA_ERR_CUDA, "cuda: no GPU %d (the driver sees %d)", ordinal, count);

  rda_backend *b = calloc(1, sizeof *b);
  rda_cuda_impl *impl = calloc(1, sizeof *impl);
  if (b == NULL || impl == NULL) {
    free(b);
    free(impl);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "cuda: no memory for a backend");
  }
  b->name = "cuda";
  b->impl = impl;
  b->alloc = rda_cuda_alloc;
  b->free = rda_cuda_free;
  b->upload = rda_cuda_upload;
  b->download = rda_cuda_download;
  b->load = rda_cuda_load_variant;
  b->unload = rda_cuda_unload;
  b->launch = rda_cuda_launch;
  b->synchronize = rda_cuda_synchronize;
  b->memset_async = rda_cuda_memset_async;
  b->copy_async = rda_cuda_copy_async;
  b->event_create = rda_cuda_event_create;
  b->event_destroy = rda_cuda_event_destroy;
  b->event_record = rda_cuda_event_record;
  b->stream_wait_event = rda_cuda_stream_wait_event;
  b->event_query = rda_cuda_event_query;
  b->event_create_timed = rda_cuda_event_create_timed;
  b->event_elapsed_ms = rda_cuda_event_elapsed_ms;
  b->stream_create = rda_cuda_stream_create;
  b->stream_destroy = rda_cuda_stream_destroy;
  b->set_stream = rda_cuda_set_stream;
  b->destroy = rda_cuda_destroy;
  impl->ordinal = ordinal;

  rda_status st = RDA_CU(err, cuDriverGetVersion, &impl->driver_version);
  if (st == RDA_OK) st = rda_nvrtc_driver_check(impl->driver_version, rda_nvrtc_version(), err);
  if (st == RDA_OK) st = RDA_CU(err, cuDeviceGet, &impl->dev, ordinal);
  int major = 0, minor = 0;
  if (st == RDA_OK)
    st = rda_cuda_attr(impl->dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &major, err);
  if (st == RDA_OK)
    st = rda_cuda_attr(impl->dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &minor, err);
  if (st == RDA_OK)
    st = rda_cuda_attr(impl->dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                       &impl->smem_optin, err);
  b->arch = major * 10 + minor;
  if (st == RDA_OK && b->arch < 80)
    st = rda_err_set(err, RDA_ERR_UNSUPPORTED,
                     "cuda: GPU %d is sm_%d; rda's kernels need sm_80 or newer", ordinal, b->arch);
  if (st == RDA_OK && !rda_nvrtc_arch_supported(b->arch)) {
    const int v = rda_nvrtc_version();
    st = rda_err_set(err, RDA_ERR_UNSUPPORTED,
                     "cuda: GPU %d is sm_%d, which NVRTC %d.%d cannot compile for (a newer CUDA "
                     "toolkit is needed)",
                     ordinal, b->arch, v / 1000, v % 1000 / 10);
  }
  if (st == RDA_OK) st = RDA_CU(err, cuDevicePrimaryCtxRetain, &impl->ctx, impl->dev);
  if (st == RDA_OK) st = rda_cuda_enter(b, err);
  if (st == RDA_OK) st = RDA_CU(err, cuStreamCreate, &impl->stream, CU_STREAM_NON_BLOCKING);
  if (st != RDA_OK) {
    rda_cuda_destroy(b);
    return st;
  }
  *out = b;
  return RDA_OK;
}

rda_status rda_backend_cuda_hw(rda_backend *b, rda_hw *out, rda_err *err) {
  if (b == NULL || out == NULL || b->name == NULL || strcmp(b->name, "cuda") != 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_backend_cuda_hw: not a cuda backend");
  const rda_cuda_impl *impl = rda_cuda_impl_of(b);
  rda_hw hw;
  memset(&hw, 0, sizeof hw);
  char name[256] = "";
  RDA_CU_TRY(err, cuDeviceGetName, name, (int)sizeof name, impl->dev);
  snprintf(hw.name, sizeof hw.name, "%.63s", name);
  hw.arch = b->arch;
  const struct {
    CUdevice_attribute attr;
    int *dst;
  } attrs[] = {
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &hw.sm_count},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &hw.smem_per_block},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, &hw.smem_per_sm},
      {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, &hw.regs_per_sm},
      {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, &hw.regs_per_block},
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, &hw.max_threads_per_sm},
  };
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; ++i)
    RDA_TRY(rda_cuda_attr(impl->dev, attrs[i].attr, attrs[i].dst, err));
  hw.live = 1;
  *out = hw;
  return RDA_OK;
}
