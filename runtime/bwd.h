/* bwd.h — the backward pass of a plan on a backend (SPEC §1, "Backward, exact"): the
 * preprocessing Dp = <dO, O> - dLSE, then per branch dK/dV (walking query tiles for each key
 * tile, recomputing P from the saved LSE) and dQ, all accumulated in fp32. */
#ifndef RDA_BWD_H
#define RDA_BWD_H

#include "backend.h"
#include "fwd.h"
#include "gen.h"

/* Tensors in backend memory, strides in elements over (batch, n, head) or (batch, head). */
typedef struct rda_bwd_args {
  long long batch, n;
  const void *q, *k, *v;              /* storage dtype, as given to the forward pass */
  long long q_s[3], k_s[3], v_s[3];
  const float *o;                     /* fp32 [B, N, H, D]: the forward output */
  long long o_s[3];
  const float *lse;                   /* fp32 [B, H, N]: the forward LSE */
  long long lse_s[2];
  const void *dout;                   /* storage dtype [B, N, H, D]: dO */
  long long do_s[3];
  const float *dlse;                  /* fp32 [B, H, N] or NULL (= 0) */
  long long dlse_s[2];
  float *dq;                          /* fp32 [B, N, H, D], overwritten */
  long long dq_s[3];
  float *dk, *dv;                     /* fp32 [B, N, Hkv, D], overwritten */
  long long dk_s[3], dv_s[3];
  void *workspace;                    /* rda_bwd_workspace_bytes() bytes of backend memory */
  int deterministic;                  /* 1: bit-identical gradients run to run; 0: dQ by fp32
                                         atomics where the plan has atomic variants
                                         (RDA_PLAN_BACKWARD_ATOMIC), else the same as 1 */
} rda_bwd_args;

/* g for the backward of a forward pass over a's tensors (q, k, v, o, lse and their strides),
 * with dout and dq strided like q, dk and dv like k, dlse (or NULL) like lse; deterministic. */
void rda_bwd_args_like_fwd(rda_bwd_args *g, const rda_fwd_args *a, const void *dout,
                           const float *dlse, float *dq, float *dk, float *dv, void *workspace);

/* The slice of a that starts b0 batch entries in, at most `most` long (a launch takes at most
 * RDA_MAX_BATCH_PER_LAUNCH, the grid's z dimension): every pointer moved by b0 batch strides
 * (in elements; K/V may broadcast, stride 0), the workspace's Dp rows [B, heads, n] included. */
void rda_bwd_args_slice(const rda_plan_k *p, const rda_bwd_args *a, long long b0, long long most,
                        rda_bwd_args *sl);

/* The most rows a backward pass takes (its kernels index rows in 32 bits). */
#define RDA_BWD_MAX_N 0x7fffffffLL

/* Backend memory the backward pass needs beside its arguments (at most an fp32 dQ
 * accumulator and the Dp vector). */
size_t rda_bwd_workspace_bytes(const rda_plan_k *p, long long batch, long long n);

/* Enqueue the backward pass (asynchronous on cuda). p must be planned with RDA_PLAN_BACKWARD
 * (rda_gen_plan_ex; else RDA_ERR_INVALID_ARGUMENT saying so); k holds the plan's loaded
 * variants, forward and backward (rda_fwd_load loads every variant of the plan). o and lse are
 * the forward pass's outputs for the same q, k, v; dq, dk, dv are overwritten (rows that no
 * branch covers get 0). q, k, v, dout: 16-byte aligned, strides multiples of 8 elements. */
rda_status rda_bwd_run(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                       const rda_bwd_args *a, rda_err *err);

/* --- pieces for the ring (runtime/ring.c) ---------------------------------------------------
 * rda_bwd_run = rda_bwd_prep, then per branch step rda_bwd_launch_dkdv and rda_bwd_launch_dq on
 * rda_bwd_params_for_step's parameters. The ring narrows the parameters' row ranges
 * (rda_bwd_params: seg0, q_lo..dv_rs) and points k, v, dk, dv at compact blocks. */

/* Dp = <dO, O> - dLSE into a->workspace and dq = dk = dv = 0, over all of a's rows. */
rda_status rda_bwd_prep(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                        const rda_bwd_args *a, rda_err *err);

/* The parameters of branch step s over all of a's rows and keys (single-device ranges), with
 * dp = a->workspace. tiles_per_seg is left 0: the launchers set it from the ranges. */
void rda_bwd_params_for_step(const rda_plan_k *p, const rda_bwd_step *s, const rda_bwd_args *a,
                             rda_bwd_params *bp);

/* dK/dV of bp's ranges over segments [bp->seg0, bp->seg0 + nseg) for batch `batch`: one launch
 * per group member that has a query head in [bp->head0, bp->head0 + bp->nheads), kv heads
 * bp->head0 / kv_group .. (head0 + nheads - 1) / kv_group. atomic: the step's dkdv_atomic_kernel
 * (which also adds dQ; then rda_bwd_launch_dq must not run); it must exist. tiles_per_seg is
 * set from min(ceil(w / r), ceil((kv_hi - kv_lo) / r)) key grid rows. Nothing is launched
 * when the ranges hold no grid row. */
rda_status rda_bwd_launch_dkdv(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                               const rda_bwd_step *s, rda_bwd_params *bp, long long nseg,
                               long long batch, int atomic, rda_err *err);

/* dQ of bp's ranges over segments [bp->seg0, bp->seg0 + nseg), query heads
 * [bp->head0, bp->head0 + bp->nheads); tiles_per_seg from the query range. */
rda_status rda_bwd_launch_dq(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                             const rda_bwd_step *s, rda_bwd_params *bp, long long nseg,
                             long long batch, rda_err *err);

/* The kv-table twins (s->dkdv_ring_kernel, s->dq_ring_kernel; RDA_ERR_INTERNAL when not
 * planned or loaded) on a ring round's class blocks, bp->kvt (rda_bwd_kv_table) filled by the
 * caller with k = v the 16-bit blocks and dk = dv the fp32 ones. dK/dV: ONE launch over entries
 * [0, nentries) of bp->kvt (blockIdx.y = entry; at most RDA_KV_TABLE_HEADS, no two naming the
 * same class and slot). dQ: as rda_bwd_launch_dq over heads [head0, head0 + nheads) (at most
 * RDA_KV_TABLE_HEADS), K/V of head head0 + y through table slot y. */
rda_status rda_bwd_launch_dkdv_table(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                                     const rda_bwd_step *s, rda_bwd_params *bp, long long nseg,
                                     long long batch, int nentries, rda_err *err);
rda_status rda_bwd_launch_dq_table(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                                   const rda_bwd_step *s, rda_bwd_params *bp, long long nseg,
                                   long long batch, rda_err *err);

#endif
