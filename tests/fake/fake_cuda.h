/* fake_cuda.h — what the fake libcuda.so.1 (tests/fake/fake_cuda.c) offers besides the driver
 * API of cuda.h: test-only helpers a test reaches with dlsym, and the stream machinery the fake
 * libnccl.so.2 (tests/fake/fake_nccl.c) queues its operations on. Both fakes share one lock.
 *
 * The model: device memory is host memory (a CUdeviceptr is its address), a stream is a queue
 * run in order as far as it can go after every call that changes anything (there is no device,
 * so nothing happens between calls): a copy runs when it reaches the head, a cuStreamWaitEvent
 * waits for the event's stream to get past the event, and an NCCL group waits for its peers.
 * Device 0 is the one device the device queries see (sm_90, H100-like limits); contexts 0..7
 * exist for tests that give each rank its own. Modules are accepted, never run: a launch fails
 * with CUDA_ERROR_NOT_SUPPORTED. */
#ifndef RDA_FAKE_CUDA_H
#define RDA_FAKE_CUDA_H

#include <cuda.h>
#include <stddef.h>

/* --- test helpers (dlsym) ------------------------------------------------------------------ */

CUstream fake_cu_stream_create(void);
/* Work still queued on s is dropped (an NCCL group's operations never complete). */
void fake_cu_stream_destroy(CUstream s);
/* The context of device 0..7: what the rank threads make current, as cuCtxSetCurrent would. */
CUcontext fake_cu_context(int device);
/* A held stream runs nothing until released: work queued behind it waits, as behind a kernel. */
void fake_cu_stream_hold(CUstream s, int hold);
/* How many cuStreamWaitEvent calls made `waiter` wait for an event recorded on `on` (NULL: the
 * NULL stream, as everywhere here). */
long fake_cu_stream_waits(CUstream waiter, CUstream on);
/* Device-side reads or writes (copies, NCCL transfers) of memory that is no live cuMemAlloc
 * block (freed, or never allocated), and cuMemFree of no such block: skipped, and counted. */
long fake_cu_bad_accesses(void);
/* Driver calls that need a current context and had none. */
long fake_cu_no_context_calls(void);

/* --- for fake_nccl.c: everything below with the lock held ------------------------------------ */

void fake_cu_lock(void);
void fake_cu_unlock(void);
/* Sleep until fake_cu_progress next ran (any call that changes state runs it). */
void fake_cu_wait(void);
/* Queue work on s: run(arg) is called when it reaches the head, and again after each change,
 * until it returns 1; then release(arg). release(arg) also when s is destroyed first. */
void fake_cu_enqueue(CUstream s, int (*run)(void *arg), void (*release)(void *arg), void *arg);
/* Run every stream as far as it can go. */
void fake_cu_progress(void);
/* Whether [p, p + bytes) lies in one live allocation; if not, counted as a bad access. */
int fake_cu_live(CUdeviceptr p, size_t bytes);
/* The calling thread's current context's device, or -1. */
int fake_cu_current_device(void);

#endif
