/* ring.h — the ring forward pass of one rank: its own rows of Q/K/V, the rda_ring_plan's steps
 * over a transport endpoint (packed dilated K/V blocks out, received blocks in), compute on each
 * block with the forward kernel on sub-ranges, partial results merged by log-sum-exp in fp32. */
#ifndef RDA_RING_H
#define RDA_RING_H

#include <stdint.h>

#include "backend.h"
#include "fwd.h"
#include "gen.h"
#include "ring_plan.h"
#include "transport.h"

/* What one rank's ring did. */
typedef struct rda_ring_stats {
  int64_t rows;            /* rows this rank owns */
  uint64_t bytes_sent;     /* bytes its sends delivered (plan bytes times the batch) */
  uint64_t bytes_received; /* bytes its receives got */
  uint64_t peak_bytes;     /* most the ring itself held at once: send, receive and device blocks */
} rda_ring_stats;

/* The forward pass of `rank` over the transport endpoint t (t->rank == rank). a holds only this
 * rank's rows: a->n must equal the rank's row count; local row i is the i-th owned global row
 * in ascending order (zigzag: chunk rank, then chunk 2P-1-rank). o and lse (fp32) receive the
 * rank's rows of the single-device result. The backend's memory must be host memory (the
 * emulator) when t is a host transport. k holds pk's loaded kernels. stats may be NULL. On a
 * failure the transport is aborted, so the other ranks fail instead of waiting. */
rda_status rda_ring_forward(rda_backend *b, const rda_plan_k *pk, const rda_fwd_kernels *k,
                            const rda_ring_plan *rp, int rank, rda_transport *t,
                            const rda_fwd_args *a, rda_ring_stats *stats, rda_err *err);

#endif
