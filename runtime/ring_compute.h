/* ring_compute.h — what one ring rank computes on a block (runtime/ring.c runs the schedule):
 * the forward or backward kernels on the rank's own rows, or on a received compact K/V block,
 * with the kernels' row ranges (rda_params.h) so that grids stay on global positions. */
#ifndef RDA_RING_COMPUTE_H
#define RDA_RING_COMPUTE_H

#include <stdint.h>

#include "backend.h"
#include "bwd.h"
#include "fwd.h"
#include "gen.h"
#include "ring_plan.h"

/* The rank's owned pieces: global rows [lo[i], hi[i]) at local rows from base[i]. */
typedef struct ring_rank {
  int npieces;
  int64_t lo[2], hi[2], base[2];
} ring_rank;

typedef struct ring_ctx {
  rda_backend *b;
  const rda_plan_k *pk;
  const rda_fwd_kernels *k;
  const rda_fwd_args *fa; /* the forward pass's tensors, or NULL */
  const rda_bwd_args *ba; /* the backward pass's tensors, or NULL */
  long long batch;
  const rda_ring_plan *rp;
  int64_t n; /* global N */
  ring_rank me;
} ring_ctx;

/* Fill c->rp, c->n and c->me from the plan's rank. */
rda_status ring_ctx_init(ring_ctx *c, const rda_ring_plan *rp, int rank, rda_err *err);

/* The rows of transfer x (global rows first + t * stride) as local rows in rows (block, k, v
 * left for the caller). RDA_ERR_INTERNAL when a range is not inside one owned piece. */
rda_status ring_rows_for(const ring_ctx *c, const rda_ring_xfer *x, int64_t stride,
                         const rda_ring_class *cls, rda_ring_rows_params *rows, rda_err *err);
/* Point rows at the rank's K/V (pack) or at its fp32 dK/dV accumulators (returned gradients). */
void ring_rows_set_kv(const ring_ctx *c, rda_ring_rows_params *rows);
void ring_rows_set_grads(const ring_ctx *c, rda_ring_rows_params *rows);

/* Queries and keys both from the rank's own rows. */
rda_status ring_fwd_own(const ring_ctx *c, rda_err *err);
rda_status ring_bwd_own(const ring_ctx *c, rda_err *err);

/* The rank's queries against the received blocks: K/V in the layout of rda_ring_rows_params.
 * The backward pass adds dQ locally and the keys' fp32 dK/dV into a gradient block (the same
 * layout, fp32, zeroed by the caller), which goes back to the blocks' owners.
 *
 * The forward on every receive of a round: steps[0..n), step k's receive q at byte
 * recv_at[k][q] * batch of blk. Receives from one peer over the same ranges share launches (a
 * table of their blocks per launch, rda_kv_table), so a round of many classes costs a few
 * launches rather than one per class and head run. */
typedef struct ring_recv ring_recv;
/* Host scratch of ring_fwd_received_round and ring_bwd_received_round for rounds of up to cap
 * receives (made before a pass, so that nothing is allocated inside it). */
typedef struct ring_round_scratch {
  int cap;
  ring_recv *recv;
  ring_recv **members;
  unsigned char *done;
} ring_round_scratch;
rda_status ring_round_scratch_init(ring_round_scratch *s, int cap, rda_err *err);
void ring_round_scratch_free(ring_round_scratch *s); /* accepts a zeroed one */
rda_status ring_fwd_received_round(const ring_ctx *c, const rda_ring_step *steps, int n,
                                   const uint64_t (*recv_at)[2], const unsigned char *blk,
                                   ring_round_scratch *scratch, rda_err *err);
/* The backward on every receive of a round, grouped as ring_fwd_received_round (the dK/dV and
 * dQ kv-table twins, rda_bwd_kv_table): receive q of step k's K/V block at byte
 * recv_at[k][q] * batch of blk, its fp32 dK/dV block at byte 2 * recv_at[k][q] * batch of grads
 * (the round's gradient block, zeroed by the caller). Deterministic: every dK/dV row and every
 * dQ row sees the same additions in the same order as with one receive at a time. */
rda_status ring_bwd_received_round(const ring_ctx *c, const rda_ring_step *steps, int n,
                                   const uint64_t (*recv_at)[2], const unsigned char *blk,
                                   unsigned char *grads, ring_round_scratch *scratch, rda_err *err);

#endif
