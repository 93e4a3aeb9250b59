/* transport.h — how ring ranks move byte blocks: grouped point-to-point send/recv (like
 * ncclGroupStart/End), an all-gather, a gather of one 8-byte value per rank (also the barrier),
 * abort and a per-operation timeout, behind one interface so one ring driver runs over NCCL,
 * host virtual ranks or device virtual ranks.
 *
 * Implementations (one vtable each; the matching, timeouts, abort and fingerprint check of the
 * two virtual-rank worlds are shared in runtime/transport_world.c):
 *  - host virtual ranks (runtime/transport_host.c): P threads of one process over host memory;
 *    a "world" shared by the threads, one endpoint per rank. Used with the emulator.
 *  - device virtual ranks (runtime/transport_device.c): the same world with device-to-device
 *    copies on each receiver's communication stream, ordered by events, so P virtual ranks run
 *    natively on one GPU (and, through the emulator backend, in CI).
 *  - NCCL (runtime/transport_nccl.c; run on a GPU with a one-rank communicator only, and on 3-4
 *    ranks over fake libraries in tests/test_nccl_fake.c): ncclSend/ncclRecv
 *    between ncclGroupStart/End on a communication stream ordered against the caller's stream
 *    by events; wait polls an event and ncclCommGetAsyncError until done or the timeout, then
 *    ncclCommAbort. Buffers are device pointers.
 *
 * Semantics every implementation keeps:
 *  - A group: group_start, any number of send/recv, group_end (posts them all), wait (blocks
 *    until every one completed). The k-th send from a to b matches the k-th recv at b from a;
 *    sizes must agree. Posting order inside a group, and between ranks, never deadlocks as long
 *    as every rank eventually posts its half (the ring plan orders steps by a shared key).
 *  - Buffers stay owned by the caller and must stay valid and untouched until wait returns.
 *  - Device-side order (device and NCCL transports): a send reads what the caller's current
 *    stream had written when group_end was called; a receive writes its buffer only after the
 *    work enqueued on that stream before group_end; once wait returns, work the caller enqueues
 *    on its stream sees the received data and may overwrite the send buffers. wait blocks the
 *    host only until every transfer is matched and enqueued (device transport), never for the
 *    device to finish. The host transport copies at once (its memory is host memory).
 *  - Errors are RDA_ERR_NCCL with one line naming the rank, e.g. "rank 3: timed out after
 *    2.0 s waiting for rank 5". A timeout or a failure aborts the world: every other rank's
 *    pending or later call fails within its own timeout, never hangs. A wait that fails still
 *    orders the caller's stream after the transfers that had begun (device transport: copies
 *    matched before the abort), so none lands in a buffer the caller reuses after the error:
 *    a caller that abandons a posted group calls wait all the same.
 *  - Virtual ranks: a rank that destroys its endpoint is gone for good; a wait or barrier of
 *    another rank that still needs it fails at once, naming it ("rank 2: left the ring ...").
 *  - Creation checks a fingerprint (rda_ring_fingerprint): a mismatch is an error on every rank
 *    (RDA_ERR_INVALID_ARGUMENT: the calls disagree; rda_transport_check_fingerprints). */
#ifndef RDA_TRANSPORT_H
#define RDA_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "err.h"

typedef struct rda_transport rda_transport;

typedef struct rda_transport_vtbl {
  const char *name; /* "host", "nccl", "device" */
  rda_status (*group_start)(rda_transport *t, rda_err *err);
  rda_status (*send)(rda_transport *t, int peer, const void *buf, size_t bytes, rda_err *err);
  rda_status (*recv)(rda_transport *t, int peer, void *buf, size_t bytes, rda_err *err);
  rda_status (*group_end)(rda_transport *t, rda_err *err);
  rda_status (*wait)(rda_transport *t, rda_err *err);
  /* all[q] = rank q's `mine` (all NULL: only give mine); returns once every rank arrived. */
  rda_status (*gather8)(rda_transport *t, uint64_t mine, uint64_t *all, rda_err *err);
  /* Set up the links to peers before the first transfer; NULL: there is nothing to set up. */
  rda_status (*connect)(rda_transport *t, const int *peers, int npeers, rda_err *err);
  void (*abort)(rda_transport *t, const char *reason);
  void (*destroy)(rda_transport *t);
} rda_transport_vtbl;

/* The part every implementation shares (its first member). */
struct rda_transport {
  const rda_transport_vtbl *vt;
  int rank, size;
  double timeout_s;        /* per operation (one wait, one gather8) */
  uint64_t bytes_sent;     /* bytes this rank's sends delivered */
  uint64_t bytes_received; /* bytes this rank's receives got */
};

/* Dispatch (runtime/transport.c). Every call accepts only a live endpoint. */
rda_status rda_transport_group_start(rda_transport *t, rda_err *err);
rda_status rda_transport_send(rda_transport *t, int peer, const void *buf, size_t bytes,
                              rda_err *err);
rda_status rda_transport_recv(rda_transport *t, int peer, void *buf, size_t bytes, rda_err *err);
rda_status rda_transport_group_end(rda_transport *t, rda_err *err);
rda_status rda_transport_wait(rda_transport *t, rda_err *err);
/* All ranks: recv[q * bytes .. (q+1) * bytes) = rank q's send block (own block copied locally).
 * send and recv must not overlap. */
rda_status rda_transport_allgather(rda_transport *t, const void *send, void *recv, size_t bytes,
                                   rda_err *err);
/* Every rank's 8-byte value: all[q] (size values) = rank q's mine, on every rank. */
rda_status rda_transport_gather8(rda_transport *t, uint64_t mine, uint64_t *all, rda_err *err);
/* A gather8 in which this rank gives mine and reads nothing (so it needs no room for the
 * others' words): a rank that failed still tells the others why. */
rda_status rda_transport_give8(rda_transport *t, uint64_t mine, rda_err *err);
rda_status rda_transport_barrier(rda_transport *t, rda_err *err); /* give8 of 0 */
/* Set up the links to `peers` (npeers distinct ranks, not this one; each lists this one in its
 * own call: rda_ring_steps_peers), so that the ring's first steps do not pay for them. NCCL
 * connects point-to-point lazily, on a pair's first transfer: its endpoint makes one grouped
 * exchange of one byte each way with every peer. The virtual-rank worlds have no links: a
 * no-op. Collective among the ranks concerned; the byte counters do not change. */
rda_status rda_transport_connect(rda_transport *t, const int *peers, int npeers, rda_err *err);
/* The first rank q > 0 whose all[q] differs from all[0], or 0 when all n agree. */
int rda_transport_first_differing(const uint64_t *all, int n);
/* A fingerprint never has bit 63 set (rda_ring_fingerprint). A rank whose rda_ring_create failed
 * before it could join joins with rda_transport_join_failed(its status) in place of its
 * fingerprint: over NCCL that is the only way the others learn of it before their timeout. */
#define RDA_TRANSPORT_JOIN_FAILED (1ull << 63)
uint64_t rda_transport_join_failed(rda_status why);
/* The creation check of every transport: RDA_ERR_INVALID_ARGUMENT on `rank` naming the first
 * rank that failed before it joined, else the first rank whose fingerprint (of n, all ranks')
 * differs from rank 0's, else RDA_OK. Not an NCCL status: the ranks' calls disagree, and the
 * transport itself is sound (over NCCL, a caller's communicator stays the caller's). */
rda_status rda_transport_check_fingerprints(const uint64_t *fp, int n, int rank, rda_err *err);
/* Make every rank's pending and later operations fail with reason (first abort wins). */
void rda_transport_abort(rda_transport *t, const char *reason);
void rda_transport_destroy(rda_transport *t); /* accepts NULL */
void rda_transport_bytes(const rda_transport *t, uint64_t *sent, uint64_t *received);

/* --- host virtual ranks (runtime/transport_host.c) ---------------------------------------- */

typedef struct rda_host_world rda_host_world;

/* A world of `size` virtual ranks (1..4096) with a per-operation timeout in seconds (> 0). */
rda_status rda_host_world_create(int size, double timeout_s, rda_host_world **out, rda_err *err);
/* Frees the world; every endpoint must have been destroyed (their threads joined). NULL ok. */
void rda_host_world_destroy(rda_host_world *w);

/* Called by the thread of rank `rank`: waits (up to the timeout) for all ranks to join, then
 * compares fingerprints. A mismatch is RDA_ERR_INVALID_ARGUMENT on every rank ("rank 2:
 * fingerprint mismatch: rank 0 has 0x..., rank 2 has 0x..."); a rank that never joins makes
 * the others time out (RDA_ERR_NCCL). *out is NULL on failure. */
rda_status rda_host_world_join(rda_host_world *w, int rank, uint64_t fingerprint,
                               rda_transport **out, rda_err *err);

/* --- device virtual ranks (runtime/transport_device.c) ------------------------------------ */

typedef struct rda_device_world rda_device_world;

/* A world of `size` virtual ranks (1..4096) of one process on one device, per-operation
 * timeout in seconds (> 0). Matching, timeouts, abort and the fingerprint check are the host
 * world's; the copies are device-to-device on each receiving endpoint's communication stream. */
rda_status rda_device_world_create(int size, double timeout_s, rda_device_world **out,
                                   rda_err *err);
void rda_device_world_destroy(rda_device_world *w); /* endpoints destroyed first; NULL ok */

/* Called by the thread of rank `rank`, whose backend is b (every rank's backend on the same
 * device: cuda, or the emulator, where copies run at once). The endpoint creates its
 * communication stream and events on b. Errors as rda_host_world_join. */
rda_status rda_device_world_join(rda_device_world *w, int rank, uint64_t fingerprint,
                                 rda_backend *b, rda_transport **out, rda_err *err);

/* --- NCCL (runtime/transport_nccl.c; RDA_ERR_UNSUPPORTED when built without nccl.h) ------- */

/* Fill id (NCCL_UNIQUE_ID_BYTES = 128 bytes) on one rank; the host program distributes it. */
rda_status rda_transport_nccl_unique_id(void *id, rda_err *err);

/* One rank's endpoint, with the calling thread's CUDA context current. Pass either comm (an
 * ncclComm_t the host program owns: never destroyed, but aborted on a failure or timeout) or
 * unique_id (a communicator is created non-blocking, so a missing peer times out; a caller's
 * communicator should be non-blocking too, else NCCL itself may block with no timeout). stream is
 * the CUstream for communication, ordered against the caller's stream with events: the calling
 * thread's current stream of b, where its kernels go (set_stream's, else the thread's
 * rda_backend_cuda_use_stream stream, else b's own); with b NULL, the use_stream stream, else
 * the legacy default stream. Buffers of send/recv are device pointers. Creation all-gathers
 * the fingerprints; a mismatch is an error on every rank. (That collective does not connect the
 * point-to-point channels: NCCL connects a pair at its first send/recv, inside the first ring
 * step's timeout.) */
rda_status rda_transport_nccl_create(void *comm, const void *unique_id, int rank, int size,
                                     void *stream, rda_backend *b, uint64_t fingerprint,
                                     double timeout_s, rda_transport **out, rda_err *err);
/* The same join, by a rank that failed before it could join a ring (rda_ring_create), to tell
 * the others: it gives rda_transport_join_failed(why) in place of its fingerprint, so that
 * their creation fails at once naming it and why instead of after their timeout, and leaves.
 * RDA_OK once told: a caller's communicator is the caller's as before, one it made is gone.
 * Else the failure to tell (an NCCL or CUDA failure aborts a caller's communicator, as
 * rda_transport_nccl_create's). */
rda_status rda_transport_nccl_tell(void *comm, const void *unique_id, int rank, int size,
                                   void *stream, rda_backend *b, rda_status why, double timeout_s,
                                   rda_err *err);

#endif
