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

/* Move transfers rows[0..n), transfer t's block slot e holding kv head kv_heads[t][e]
 * (rows[t].nkv_total of them), in as few launches as the kernel's parameter block holds
 * (RDA_RING_ROWS_ENTRIES entries, RDA_RING_ROWS_LAUNCH_KV kv heads): transfers of one launch
 * share k, v, their strides, batch, stride and head_dim, and their blocks lie in one allocation
 * (a round's block). The adder puts transfers that could write one element (a shared kv head and
 * a shared row) in successive launches, in order, so every element gets its additions in the
 * order of rows[]. Nothing is launched for zero rows. RDA_ERR_INVALID_ARGUMENT for a malformed
 * transfer (all are checked before anything is launched); the adder also refuses repeated kv
 * heads and ranges sharing a row within one transfer. */
rda_status rda_ring_rows_pack_many(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                                   const rda_ring_rows_params *rows, const int *const *kv_heads,
                                   int n, rda_err *err);
rda_status rda_ring_rows_add_many(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                                  const rda_ring_rows_params *rows, const int *const *kv_heads,
                                  int n, rda_err *err);
/* One transfer (n = 1). */
rda_status rda_ring_rows_pack(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                              const rda_ring_rows_params *rows, const int *kv_heads,
                              rda_err *err);
rda_status rda_ring_rows_add(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                             const rda_ring_rows_params *rows, const int *kv_heads,
                             rda_err *err);

#endif
