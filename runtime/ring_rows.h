/* ring_rows.h — the ring's two data-movement kernels (templates/rda_ring.cuh): pack a transfer's
 * dilated K/V rows into a compact block before sending it, and add a returned compact fp32
 * dK/dV block into the owner's accumulators. Both are in every plan (ring_pack_kernel,
 * ring_add_kernel) and launch on the backend's current stream, so no host copy or
 * synchronization sits between the compute and the transport. */
#ifndef RDA_RING_ROWS_H
#define RDA_RING_ROWS_H

#include "backend.h"
#include "fwd.h"
#include "gen.h"

/* rows: every field of rda_ring_rows_params except slot0, nkv and kv_heads, which are filled
 * per launch from kv_heads[0..nkv_total) (rows->nkv_total of them), RDA_RING_ROWS_MAX_HEADS at a
 * time. Nothing is launched for zero rows. RDA_ERR_INVALID_ARGUMENT for a malformed rows; the
 * adder also refuses repeated kv heads and ranges sharing a row (two threads would then update
 * one element at once). */
rda_status rda_ring_rows_pack(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                              const rda_ring_rows_params *rows, const int *kv_heads,
                              rda_err *err);
rda_status rda_ring_rows_add(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                             const rda_ring_rows_params *rows, const int *kv_heads,
                             rda_err *err);

#endif
