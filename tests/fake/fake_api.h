/* fake_api.h — the test programs' handle on the fake libcuda.so.1 and libnccl.so.2
 * (tests/fake/): loaded with dlopen by the names rda loads, as rda will find them, so that the
 * tests drive the very instances rda uses. Brings in the real cuda.h and nccl.h, whose
 * declarations the fakes implement. */
#ifndef RDA_FAKE_API_H
#define RDA_FAKE_API_H

#include <cuda.h>
#include <stddef.h>
/* nccl.h (and the fp16/bf16 headers it pulls in) test undefined macros and declare f(). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

/* What the tests call, by field name and the library's symbol. */
#define FAKE_NCCL_SYMBOLS(X)       \
  X(init, ncclCommInitRankConfig)  \
  X(comm_destroy, ncclCommDestroy) \
  X(count, fake_nccl_count)        \
  X(pending, fake_nccl_pending)    \
  X(on_poll, fake_nccl_on_poll)
#define FAKE_CUDA_SYMBOLS(X)                \
  X(ctx_set, cuCtxSetCurrent)               \
  X(mem_alloc, cuMemAlloc_v2)               \
  X(mem_free, cuMemFree_v2)                 \
  X(htod, cuMemcpyHtoDAsync_v2)             \
  X(dtoh, cuMemcpyDtoHAsync_v2)             \
  X(ev_create, cuEventCreate)               \
  X(ev_record, cuEventRecord)               \
  X(ev_query, cuEventQuery)                 \
  X(ev_destroy, cuEventDestroy_v2)          \
  X(stream_create, fake_cu_stream_create)   \
  X(stream_destroy, fake_cu_stream_destroy) \
  X(context, fake_cu_context)               \
  X(hold, fake_cu_stream_hold)              \
  X(waits, fake_cu_stream_waits)            \
  X(bad_accesses, fake_cu_bad_accesses)     \
  X(no_context_calls, fake_cu_no_context_calls)

typedef struct fake_api {
  ncclResult_t (*init)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  long (*count)(const void *, int, const char *);
  long (*pending)(const void *, int);
  void (*on_poll)(void (*)(void *), void *);
  CUresult (*ctx_set)(CUcontext);
  CUresult (*mem_alloc)(CUdeviceptr *, size_t);
  CUresult (*mem_free)(CUdeviceptr);
  CUresult (*htod)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*dtoh)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*ev_create)(CUevent *, unsigned int);
  CUresult (*ev_record)(CUevent, CUstream);
  CUresult (*ev_query)(CUevent);
  CUresult (*ev_destroy)(CUevent);
  CUstream (*stream_create)(void);
  void (*stream_destroy)(CUstream);
  CUcontext (*context)(int);
  void (*hold)(CUstream, int);
  long (*waits)(CUstream, CUstream);
  long (*bad_accesses)(void);
  long (*no_context_calls)(void);
} fake_api;

extern fake_api fk;

/* Fills fk once (later calls return at once); fails the test, saying why, when the libraries
 * found are not the fakes (run through ctest, which sets LD_LIBRARY_PATH). */
void fake_load(void);

#endif
