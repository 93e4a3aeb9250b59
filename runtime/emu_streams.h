/* emu_streams.h — asynchronous streams for the CPU emulator (RDA_EMU_STREAMS=async).
 *
 * By default the emulator runs every launch, copy and memset to completion inside the call, so
 * work queued on two streams can never overtake each other and a missing event wait goes
 * unnoticed. With asynchronous streams the emulated device is one thread per process that runs
 * the queued operations of every stream of every emulator backend, choosing at random among
 * the streams whose next operation may run (an event wait holds its stream until the record it
 * names has run: CUDA's rule, the last record when the wait is queued), now and then pausing so
 * that the host queues more. Each thread has a default stream of its own per backend (CUDA's
 * per-thread default stream), which launches, memsets, copies and event records use unless
 * set_stream named another; it retires when its thread exits, its queued work still running.
 * A launch of a shape no GPU takes is refused at once; a failure while it runs is sticky, as a
 * faulted CUDA context's is: the first one is the result of every later call, on every
 * backend.
 *
 * Events are not tied to a backend: one backend's events may be recorded and waited for on any
 * backend's streams (the device transport does that across ranks). */
#ifndef RDA_EMU_STREAMS_H
#define RDA_EMU_STREAMS_H

#include <stddef.h>

#include "backend.h"

/* Runs one launch (runtime/emu.c), on the device thread. */
typedef rda_status (*rda_es_run_fn)(rda_backend *b, rda_module *m, const unsigned grid[3],
                                    const unsigned block[3], unsigned smem_bytes,
                                    const void *params, size_t params_bytes, rda_err *err);

/* One emulator backend's streams. */
typedef struct rda_es rda_es;

rda_status rda_es_open(rda_es **out, rda_backend *b, rda_es_run_fn run, rda_err *err);
/* Waits for every stream of the backend to drain, then frees them. Accepts NULL. */
void rda_es_close(rda_es *s);
/* Until every stream of the backend has drained, destroyed ones and those of exited threads
 * included (the sticky error, if any): before memory or a module that queued work may use
 * goes (free synchronizes, as cuMemFree does). */
rda_status rda_es_idle(rda_es *s, rda_err *err);

/* Queue on the calling thread's current stream; params are copied. */
rda_status rda_es_launch(rda_es *s, rda_module *m, const unsigned grid[3], const unsigned block[3],
                         unsigned smem_bytes, const void *params, size_t params_bytes,
                         rda_err *err);
rda_status rda_es_memset(rda_es *s, void *dst, int value, size_t bytes, rda_err *err);
rda_status rda_es_copy(rda_es *s, void *dst, const void *src, size_t bytes, rda_err *err);
/* Until the calling thread's default stream of the backend has drained (the sticky error, if
 * any). upload, download and free call it first: they order against that stream alone. */
rda_status rda_es_sync(rda_es *s, rda_err *err);

rda_status rda_es_event_create(void **ev, int timed, rda_err *err);
void rda_es_event_destroy(void *ev); /* accepts NULL; queued operations keep it alive */
rda_status rda_es_event_record(rda_es *s, void *ev, rda_err *err);
rda_status rda_es_stream_wait_event(rda_es *s, void *ev, rda_err *err);
rda_status rda_es_event_query(void *ev, int *done, rda_err *err);
rda_status rda_es_event_elapsed_ms(void *start, void *end, float *ms, rda_err *err);

rda_status rda_es_stream_create(rda_es *s, void **stream, rda_err *err);
/* Accepts NULL; returns at once, as cuStreamDestroy does: the queued work still runs. */
void rda_es_stream_destroy(rda_es *s, void *stream);
void *rda_es_set_stream(rda_es *s, void *stream); /* this thread's (NULL: its default); was */

#endif
