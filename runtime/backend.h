/* backend.h — where kernels run: the GPU through the CUDA driver API (runtime/cuda.c) or the
 * CPU emulator (runtime/emu.c). The forward launcher (runtime/fwd.c) sees only this table, so
 * both backends run the exact same plan. "Device" memory of the emulator is host memory. */
#ifndef RDA_BACKEND_H
#define RDA_BACKEND_H

#include "err.h"
#include "gen.h"

#include <stddef.h>

/* A launch's grid y and z dimensions hold at most this many blocks (CUDA's limit, which the
 * emulator enforces too); the batch is the z dimension, so larger ones run slice by slice. */
#define RDA_MAX_BATCH_PER_LAUNCH 65535LL

typedef struct rda_backend rda_backend;
typedef struct rda_module rda_module; /* one loaded kernel variant */

struct rda_backend {
  const char *name; /* "cuda" or "emu" */
  int arch;         /* target sm_XX as 80, 90, ...; the emulator reports the arch it plans for */
  void *impl;
  /* free, upload and download are synchronous, and order themselves only against the backend's
   * own stream, not a thread's current stream (set_stream, rda_backend_cuda_use_stream): work
   * queued there on these buffers must be synchronized first. */
  rda_status (*alloc)(rda_backend *b, size_t bytes, void **dptr, rda_err *err);
  void (*free)(rda_backend *b, void *dptr);
  rda_status (*upload)(rda_backend *b, void *dst, const void *src, size_t bytes, rda_err *err);
  rda_status (*download)(rda_backend *b, void *dst, const void *src, size_t bytes, rda_err *err);
  /* Build (or fetch from cache) and load one variant. */
  rda_status (*load)(rda_backend *b, const rda_variant *v, rda_module **out, rda_err *err);
  void (*unload)(rda_backend *b, rda_module *m);
  /* Launch asynchronously; params points to the kernel's parameter struct of params_bytes. */
  rda_status (*launch)(rda_backend *b, rda_module *m, const unsigned grid[3], unsigned threads,
                       unsigned smem_bytes, const void *params, size_t params_bytes,
                       rda_err *err);
  rda_status (*synchronize)(rda_backend *b, rda_err *err);
  /* Stream-ordered device work on the calling thread's current stream of b: the stream
   * set_stream gave for this thread, else the thread's stream of rda_backend_cuda_use_stream,
   * else the backend's own. The emulator runs everything at once, or with RDA_EMU_STREAMS=async
   * queues it on streams of its own, a default one per thread (runtime/emu_streams.h). */
  rda_status (*memset_async)(rda_backend *b, void *dptr, int value, size_t bytes, rda_err *err);
  rda_status (*copy_async)(rda_backend *b, void *dst, const void *src, size_t bytes,
                           rda_err *err); /* device to device; the ranges must not overlap */
  /* Events order work across streams without host synchronization (the synchronous emulator:
   * no-ops that still hand out distinct non-NULL handles). record: on the current stream; wait: the
   * current stream waits for the event's last record; query: 1 when done, 0 when not yet. */
  rda_status (*event_create)(rda_backend *b, void **ev, rda_err *err);
  void (*event_destroy)(rda_backend *b, void *ev); /* accepts NULL */
  rda_status (*event_record)(rda_backend *b, void *ev, rda_err *err);
  rda_status (*stream_wait_event)(rda_backend *b, void *ev, rda_err *err);
  rda_status (*event_query)(rda_backend *b, void *ev, int *done, rda_err *err);
  /* Timing (ring timelines, bench/bench_ring.c --timeline): an event that also takes the time
   * when the stream reaches its record (cuda: timing enabled, a little costlier to record than
   * event_create's; emulator: the host CLOCK_MONOTONIC when the record ran, which the
   * synchronous emulator does inside event_record). Destroy with event_destroy;
   * record, wait and query as any event. elapsed_ms: *ms = end's time minus start's (may be
   * negative), both recorded and completed; an error for a NULL, untimed or unrecorded event
   * (cuda: or a driver without cuEventElapsedTime). */
  rda_status (*event_create_timed)(rda_backend *b, void **ev, rda_err *err);
  rda_status (*event_elapsed_ms)(rda_backend *b, void *start, void *end, float *ms,
                                 rda_err *err);
  /* A stream of the backend's own for communication (cuda: non-blocking; the synchronous
   * emulator: a distinct handle), and running work on it: set_stream(b, s) makes s the calling
   * thread's current stream of b (over rda_backend_cuda_use_stream's) until set_stream(b, NULL),
   * and returns the thread's previous choice (NULL: none), so that code borrowing the thread
   * (the device transport, completing a match on its communication stream) restores it. The
   * synchronous emulator, where streams order nothing, keeps no choice and returns NULL. */
  rda_status (*stream_create)(rda_backend *b, void **s, rda_err *err);
  void (*stream_destroy)(rda_backend *b, void *s); /* accepts NULL; queued work completes */
  void *(*set_stream)(rda_backend *b, void *s);    /* NULL: back to the default choice */
  void (*destroy)(rda_backend *b);
};

/* The CPU emulator, planning for sm_`arch`. */
rda_status rda_backend_emu_open(rda_backend **out, int arch, rda_err *err);
/* GPU `ordinal` through the driver API (loaded with dlopen). Fails cleanly with no driver. */
rda_status rda_backend_cuda_open(rda_backend **out, int ordinal, rda_err *err);
/* Launches on cuda backends made by the calling thread go to `stream` (a CUstream; NULL is the
 * default stream) until rda_backend_cuda_own_stream(); by default, to the backend's own stream.
 * Thread-local, so threads sharing a backend may each target their own stream. */
void rda_backend_cuda_use_stream(void *stream);
void rda_backend_cuda_own_stream(void);
/* The calling thread's stream of rda_backend_cuda_use_stream: *set = 1 and *stream when one is
 * set, else *set = 0 (work goes to a backend's own stream). For the NCCL transport, which has
 * no backend, to order its communication after the caller's work. */
void rda_backend_cuda_thread_stream(void **stream, int *set);
/* The live profile of the GPU behind a cuda backend. */
rda_status rda_backend_cuda_hw(rda_backend *b, rda_hw *out, rda_err *err);

/* Open a backend by name: "cuda", "emu", or "auto" (cuda when a GPU is usable, else emu).
 * `why` receives a short human-readable note of what was picked and why, e.g.
 * "emu (no usable GPU: no CUDA driver: libcuda.so.1: ...)". The emulator plans for sm_90. */
rda_status rda_backend_open(const char *which, rda_backend **out, char *why, size_t why_len,
                            rda_err *err);

/* The hardware profile to plan for on this backend: the live device, or the built-in profile
 * of the emulator's target. */
rda_status rda_backend_hw(rda_backend *b, rda_gen *g, rda_hw *out, rda_err *err);

#endif
