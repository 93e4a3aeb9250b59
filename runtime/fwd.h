/* fwd.h — the forward pass of a plan on a backend: init, one launch per branch merging by
 * log-sum-exp in fp32, and (optionally) the cast to the storage dtype. */
#ifndef RDA_FWD_H
#define RDA_FWD_H

#include "backend.h"
#include "gen.h"

/* Tensors in backend memory, strides in elements (SPEC §2). */
typedef struct rda_fwd_args {
  long long batch, n;
  const void *q, *k, *v;             /* storage dtype */
  long long q_s[3], k_s[3], v_s[3];  /* strides over batch, n, head */
  float *o;                          /* fp32 [B, N, H, D] */
  long long o_s[3];
  float *lse;                        /* fp32 [B, H, N] */
  long long lse_s[2];                /* strides over batch, head */
} rda_fwd_args;

/* a over contiguous tensors of batch B and n rows: q and o [B, n, heads, D], k and v
 * [B, n, kv_heads, D], lse [B, heads, n] (the config's heads, kv_heads, head_dim). */
void rda_fwd_args_contiguous(rda_fwd_args *a, const rda_config *cfg, long long batch, long long n,
                             const void *q, const void *k, const void *v, float *o, float *lse);

/* The slice of a that starts b0 batch entries in, at most `most` long (a launch takes at most
 * RDA_MAX_BATCH_PER_LAUNCH, the grid's z dimension): pointers moved by b0 batch strides (in
 * elements; K/V may broadcast, stride 0). A larger batch runs slice by slice. */
void rda_fwd_args_slice(const rda_fwd_args *a, long long b0, long long most, rda_fwd_args *sl);

/* Loaded modules of a plan's variants on one backend. */
typedef struct rda_fwd_kernels {
  int n;
  rda_module **modules;
} rda_fwd_kernels;

rda_status rda_fwd_load(rda_backend *b, const rda_plan_k *p, rda_fwd_kernels *out, rda_err *err);
void rda_fwd_unload(rda_backend *b, rda_fwd_kernels *k);

/* The kernel parameters of step s over all of a's rows and keys, as a single-device launch
 * uses them; the ring narrows the row ranges and points k/v at received blocks. merge = 0. */
void rda_fwd_params_for_step(const rda_plan_k *p, const rda_step *s, const rda_fwd_args *a,
                             rda_fwd_params *fp);

/* RDA_ERR_UNSUPPORTED naming the branch when a segment of cfg over n rows has 2^31 grid rows or
 * more: the kernels count them in 32-bit ints. rda_fwd_run checks it; the ring, whose ranks
 * hold fewer rows than the segments span, checks it for the whole sequence. */
rda_status rda_fwd_check_grid_rows(const rda_config *cfg, long long n, rda_err *err);

/* Enqueue the forward pass (asynchronous on cuda). */
rda_status rda_fwd_run(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                       const rda_fwd_args *a, rda_err *err);

/* Enqueue only the init: o = 0 and lse = -inf over all of a's rows (the ring's first step). */
rda_status rda_fwd_init(rda_backend *b, const rda_plan_k *p, const rda_fwd_kernels *k,
                        const rda_fwd_args *a, rda_err *err);

#endif
