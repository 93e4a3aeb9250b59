/* rda_params.h — the kernel parameter blocks, shared by host C (runtime/) and device code
 * (templates/). Each kernel takes exactly one of these by value, so the host launch, the
 * driver API and the CPU emulator agree on one layout. Plain C: no C++ in this file. */
#ifndef RDA_PARAMS_H
#define RDA_PARAMS_H

enum { RDA_DTYPE_BF16 = 0, RDA_DTYPE_FP16 = 1 };
enum { RDA_OFFSETS_MOD = 0, RDA_OFFSETS_BLOCK = 1, RDA_OFFSETS_GROUP = 2 };

/* One dilation branch (w, r) of the forward pass, for heads [head0, head0 + gridDim.y).
 * Rows of segment m are [m*w, min((m+1)*w, n)); the branch's grid in that segment is
 * a + j + t*r for t >= 0, with j = offset(branch, h) (SPEC §1). blockIdx.x = m * tiles_per_seg
 * + (query tile within the grid), blockIdx.y = head - head0, blockIdx.z = batch. */
typedef struct rda_fwd_params {
  const void *q; /* [B, N, H, D] storage dtype; strides q_sb, q_sn, q_sh in elements */
  const void *k; /* [B, N, Hkv, D] */
  const void *v; /* [B, N, Hkv, D] */
  float *o;      /* [B, N, H, D] fp32 accumulator of the branches merged so far */
  float *lse;    /* [B, H, N] fp32, natural log; -inf where no branch so far has keys */
  long long q_sb, q_sn, q_sh;
  long long k_sb, k_sn, k_sh;
  long long v_sb, v_sn, v_sh;
  long long o_sb, o_sn, o_sh;
  long long lse_sb, lse_sh; /* lse stride over n is 1 */
  long long n;              /* sequence length N */
  long long w;              /* segment length, already clamped to N */
  long long r;              /* dilation rate */
  long long nseg;           /* ceil(N / w) */
  int tiles_per_seg;        /* ceil(ceil(w / r) / block_m) */
  int heads;                /* H */
  int kv_group;             /* H / Hkv: query heads per kv head */
  int head0;                /* first query head of this launch */
  int offset_mode;          /* RDA_OFFSETS_* */
  int offset_arg;           /* block: ceil(H / r); group: the branch index; mod: unused */
  int merge;                /* 0: first writer of every row it covers (o, lse are overwritten);
                               1: merge by log-sum-exp into o, lse */
  float scale_log2;         /* softmax scale times log2(e) */
} rda_fwd_params;

/* Fill o with 0 and lse with -inf (rows that no branch covers keep these values). */
typedef struct rda_init_params {
  float *o;
  float *lse;
  long long o_sb, o_sn, o_sh;
  long long lse_sb, lse_sh;
  long long batch, n;
  int heads, head_dim;
} rda_init_params;

/* Round the fp32 accumulator to the storage dtype: out[B, N, H, D] = o. */
typedef struct rda_cast_params {
  const float *o;
  void *out;
  long long o_sb, o_sn, o_sh;
  long long out_sb, out_sn, out_sh;
  long long batch, n;
  int heads, head_dim;
} rda_cast_params;

#endif
