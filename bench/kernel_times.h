/* kernel_times.h — a profiling backend for the benchmarks: a decorator over any rda_backend
 * that puts a timed event before and after every kernel launch and sums the device time per
 * kernel variant (bench/bench_ring.c --kernel-times). Compiled into the bench executables and
 * their test only, not into librda. */
#ifndef RDA_KERNEL_TIMES_H
#define RDA_KERNEL_TIMES_H

#include <stdio.h>

#include "backend.h"
#include "err.h"

/* One kernel variant's share of the launches recorded since the last reset. */
typedef struct rda_kernel_time {
  char name[128];     /* the variant's name (rda_variant.name) */
  char kind[16];      /* its kind: "fwd", "init", "bwd_prep", "bwd_dkdv", "bwd_dq", ... */
  long long launches; /* launch calls that returned RDA_OK */
  double ms;          /* sum over them of end event minus start event (event_elapsed_ms) */
} rda_kernel_time;

/* A backend that forwards every call to `inner` (always with `inner` as the backend, so
 * thread-local stream choices made on either reach the same streams), except:
 * - load wraps the inner module in one that remembers the variant's name and kind; unload
 *   unwraps it (modules loaded through the wrapper must be launched and unloaded through it);
 * - launch records a timed event of inner's before and after forwarding the launch, on the
 *   calling thread's current stream, and keeps (variant, start, end). Events come from a pool
 *   that grows by doubling and is reused after rda_kernel_times_reset, so steady-state launches
 *   allocate nothing. A launch that fails records nothing. Launches through one wrapper are
 *   serialized by a mutex (on the emulator, which runs a launch at once, this serializes the
 *   kernels themselves: the wrapper is for profiling runs, not timed ones);
 * - destroy frees the wrapper and its events, NOT inner: the caller owns inner and destroys it
 *   after the wrapper.
 * The wrapper's name, arch and impl are inner's, so rda_backend_hw() and code that asks
 * b->name work on it as on inner. *out is NULL on failure. */
rda_status rda_kernel_times_wrap(rda_backend *inner, rda_backend **out, rda_err *err);

/* Per-variant totals of the launches recorded since the last reset, sorted by ms descending
 * (ties by name): *out is malloc'd (free() it; NULL when *count is 0), *total_ms their sum.
 * The caller must have synchronized every stream the launches went to: an event not yet
 * reached is an error (cuda: CUDA_ERROR_NOT_READY). RDA_ERR_INVALID_ARGUMENT when `wrapped`
 * was not made by rda_kernel_times_wrap. On failure *out is NULL and *count 0. */
rda_status rda_kernel_times_collect(rda_backend *wrapped, rda_kernel_time **out, int *count,
                                    double *total_ms, rda_err *err);

/* Forget the recorded launches (the events stay in the pool for the next ones). Does nothing
 * to a backend not made by rda_kernel_times_wrap. */
void rda_kernel_times_reset(rda_backend *wrapped);

/* One line per kernel on f, in t's order: "<title>: <name> <kind> <launches> launches <ms> ms
 * <share>%" where share is of pass_ms when pass_ms > 0 (the pass's device time, launch gaps and
 * non-kernel work included), else of total_ms; then a line with the sums; then
 * "<title> by kind: <kind> <launches> launches <ms> ms, ..." over the kinds present, the known
 * ones in a fixed order (init, fwd, cast, ring_pack, ring_add, bwd_prep, bwd_dkdv, bwd_dq),
 * others after them (CTest's bench_ring_smoke matches that line). */
void rda_kernel_times_print(FILE *f, const char *title, const rda_kernel_time *t, int count,
                            double total_ms, double pass_ms);

#endif
