/* rda_params.h — the kernel parameter blocks, shared by host C (runtime/) and device code
 * (templates/). Each kernel takes exactly one of these by value, so the host launch, the
 * driver API and the CPU emulator agree on one layout. Plain C: no C++ in this file. */
#ifndef RDA_PARAMS_H
#define RDA_PARAMS_H

enum { RDA_DTYPE_BF16 = 0, RDA_DTYPE_FP16 = 1 };
enum { RDA_OFFSETS_MOD = 0, RDA_OFFSETS_BLOCK = 1, RDA_OFFSETS_GROUP = 2 };

/* The received blocks of one forward launch over a ring round (runtime/ring_compute.c): every
 * class of the round in its own compact block, so one launch of a kv_table kernel (the "_kt"
 * twin of a dilated forward variant) covers the heads of several classes. Head head0 + y reads kv slot slot[y] of class cls[y] (cls[y] < 0: the head has no
 * keys in this launch; its blocks return at once). Class c's block starts at element at[c] of
 * rda_fwd_params.k: K as [batch][rows[c]][nkv][head_dim], then V alike (the ring's transfer
 * layout, rda_ring_rows_params), its first row the launch's first key grid row of the class.
 * Every class of a launch has the same nkv: k_rs = v_rs = nkv * head_dim is the row pitch (a
 * launch-wide stride keeps the kernel's register count that of the plain path). */
#define RDA_KV_TABLE_HEADS 64
typedef struct rda_kv_table {
  signed char cls[RDA_KV_TABLE_HEADS];
  unsigned char slot[RDA_KV_TABLE_HEADS];
  long long at[RDA_KV_TABLE_HEADS];
  int rows[RDA_KV_TABLE_HEADS];
} rda_kv_table;

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
  /* Which queries and keys (the ring, runtime/ring.c, launches sub-ranges; grids stay on
   * GLOBAL positions, so causal masking compares global grid rows). The segment of a block is
   * blockIdx.x / tiles_per_seg + seg0; its queries are the grid rows at global positions in
   * [q_lo, q_hi) (query tiles counted from the first of them), its keys those in
   * [kv_lo, kv_hi). q, o, lse hold position p at local row p - row_lo. The first key grid row
   * kt0 (at position x) is at k + (x - kv_row_lo) * k_sn, grid row t at that + (t - kt0) * k_rs
   * (k_sn = 0 with k_rs = the row pitch: a compact received block); v alike. The single-device
   * pass: seg0 = 0, q_lo = kv_lo = 0, q_hi = kv_hi = n, row_lo = kv_row_lo = 0,
   * k_rs = r * k_sn, v_rs = r * v_sn. */
  long long seg0;
  long long q_lo, q_hi;
  long long kv_lo, kv_hi;
  long long row_lo;
  long long kv_row_lo;
  long long k_rs, v_rs;
  rda_kv_table kvt; /* received blocks of several classes: read by the kv_table twins only */
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

/* One dilation branch (w, r) of the backward pass (SPEC §1, "Backward, exact"), accumulating
 * into fp32 dq, dk, dv. P = exp(scale <q, k> - LSE) is recomputed from the COMBINED forward LSE
 * of all branches; dS = P * (<dO, v> - Dp). Two kernels take it:
 *   dkdv: blockIdx.x = (m * tiles_per_seg + key tile) * dsplit + part of the head dim,
 *         blockIdx.y = kv head - kv_head0, blockIdx.z = batch; the block handles query head
 *         kvh * kv_group + group_member (skipped outside [head0, head0 + nheads)), so within one
 *         launch no two blocks touch the same dk/dv rows (plain read-modify-write, deterministic).
 *   dq:   blockIdx.x = m * tiles_per_seg + query tile, blockIdx.y = head - head0,
 *         blockIdx.z = batch; each dq row is owned by one block. */
/* The received blocks of one backward launch over a ring round: the forward's table (kv) of
 * class blocks, with the gradients of class c's block at element at[c] of the fp32 dk (dK as
 * [batch][rows[c]][nkv][head_dim], then dV alike: the K/V block's layout, element for element).
 * The dq twin reads it as the forward does (entry y = query head head0 + y). The dkdv twin's
 * blockIdx.y is an entry y: query head head0 + head[y], reading and writing kv slot
 * kv.slot[y] of class kv.cls[y]; no two entries of one launch name the same class and slot
 * (their dK/dV rows are read-modify-written). */
typedef struct rda_bwd_kv_table {
  rda_kv_table kv;
  unsigned char head[RDA_KV_TABLE_HEADS];
} rda_bwd_kv_table;

typedef struct rda_bwd_params {
  const void *q;    /* [B, N, H, D] storage dtype */
  const void *k;    /* [B, N, Hkv, D] */
  const void *v;    /* [B, N, Hkv, D] */
  const void *dout; /* [B, N, H, D] storage dtype: dO */
  const float *lse; /* [B, H, N] fp32: the combined forward LSE, natural log; n contiguous */
  const float *dp;  /* [B, H, N] fp32: Dp = <dO, O> - dLSE (the prep kernel); n contiguous */
  float *dq;        /* [B, N, H, D] fp32, += scale * dS K */
  float *dk;        /* [B, N, Hkv, D] fp32, += scale * dS^T Q */
  float *dv;        /* [B, N, Hkv, D] fp32, += P^T dO */
  long long q_sb, q_sn, q_sh;
  long long k_sb, k_sn, k_sh;
  long long v_sb, v_sn, v_sh;
  long long do_sb, do_sn, do_sh;
  long long dq_sb, dq_sn, dq_sh;
  long long dk_sb, dk_sn, dk_sh;
  long long dv_sb, dv_sn, dv_sh;
  long long lse_sb, lse_sh;
  long long dp_sb, dp_sh;
  long long n;       /* sequence length N */
  long long w;       /* segment length, already clamped to N */
  long long r;       /* dilation rate */
  long long nseg;    /* ceil(N / w) */
  int tiles_per_seg; /* dkdv: ceil(min(ceil(w / r), ceil((kv_hi - kv_lo) / r)) / block_n);
                        dq: the same over the query range with block_m */
  int heads;         /* H */
  int kv_group;      /* H / Hkv */
  int head0, nheads; /* query heads [head0, head0 + nheads) use this branch */
  int kv_head0;      /* dkdv: the kv head of blockIdx.y = 0 */
  int group_member;  /* dkdv: which query head of each kv head's group this launch handles */
  int offset_mode;   /* RDA_OFFSETS_* */
  int offset_arg;    /* block: ceil(H / r); group: the branch index; mod: unused */
  float scale_log2;  /* softmax scale times log2(e) */
  float scale;       /* softmax scale (the factor of dq and dk) */
  /* Which queries and keys, exactly as in rda_fwd_params (the ring launches sub-ranges; grids
   * stay on GLOBAL positions): segment = blockIdx.x / tiles_per_seg + seg0; queries are the grid
   * rows at positions in [q_lo, q_hi), keys those in [kv_lo, kv_hi); q, dout, dq, lse, dp hold
   * position p at local row p - row_lo. The first key grid row kt0 (position x) of a launch is
   * at k + (x - kv_row_lo) * k_sn, grid row t at that + (t - kt0) * k_rs; v, dk, dv alike with
   * v_rs, dk_rs, dv_rs (k_sn = 0 and k_rs = the row pitch: a compact received block, whose
   * gradients go to a compact fp32 block). tiles_per_seg counts the tiles of these ranges.
   * The single-device pass: seg0 = 0, q_lo = kv_lo = row_lo = kv_row_lo = 0, q_hi = kv_hi = n,
   * k_rs = r * k_sn, v_rs = r * v_sn, dk_rs = r * dk_sn, dv_rs = r * dv_sn. */
  long long seg0;
  long long q_lo, q_hi;
  long long kv_lo, kv_hi;
  long long row_lo;
  long long kv_row_lo;
  long long k_rs, v_rs;
  long long dk_rs, dv_rs;
  rda_bwd_kv_table kvt; /* received blocks of several classes: read by the kv_table twins only */
} rda_bwd_params;

/* Before the branches of a backward pass: dp[b, h, n] = <dO, O> - dLSE (0 where lse = -inf),
 * and dq, dk, dv = 0. Grid-stride over rows; dlse may be NULL (= 0). */
typedef struct rda_bwd_prep_params {
  const float *o;    /* [B, N, H, D] fp32 forward output */
  const void *dout;  /* [B, N, H, D] storage dtype */
  const float *lse;  /* [B, H, N] fp32 */
  const float *dlse; /* [B, H, N] fp32 or NULL */
  float *dp;         /* [B, H, N] fp32 */
  float *dq;         /* [B, N, H, D] fp32 */
  float *dk, *dv;    /* [B, N, Hkv, D] fp32 */
  long long o_sb, o_sn, o_sh;
  long long do_sb, do_sn, do_sh;
  long long lse_sb, lse_sh;
  long long dlse_sb, dlse_sh;
  long long dp_sb, dp_sh;
  long long dq_sb, dq_sn, dq_sh;
  long long dk_sb, dk_sn, dk_sh;
  long long dv_sb, dv_sn, dv_sh;
  long long batch, n;
  int heads, kv_heads, head_dim;
} rda_bwd_prep_params;

/* The rows of one ring transfer, between a rank's strided K/V (or fp32 dK/dV) and a compact
 * block (runtime/ring.c; host side only: runtime/ring_rows.c turns transfers into launches of
 * rda_ring_rows_launch). Block layout [2][batch][rows][nkv_total][head_dim]: K then V (dK then
 * dV), slot e of a row holding the transfer's kv head e. Block row t of range i is the rank's
 * LOCAL row first[i] + (t - t_i) * stride, where t_i is the number of rows of the ranges before
 * i.
 *   ring_pack (16-bit): block[...] = k/v rows (bf16 and fp16 alike: bits are copied).
 *   ring_add (fp32):    k/v rows (the rank's dK/dV accumulators) += block[...]. */
typedef struct rda_ring_rows_params {
  void *k, *v; /* pack: 16-bit sources; add: fp32 destinations */
  long long k_sb, k_sn, k_sh;
  long long v_sb, v_sn, v_sh;
  void *block; /* pack: 16-bit destination; add: fp32 source */
  long long batch, rows;        /* rows = count[0] + ... + count[nranges - 1] */
  long long first[2], count[2]; /* local rows */
  long long stride;
  int nranges;
  int head_dim;
  int nkv_total;
} rda_ring_rows_params;

/* One launch of ring_pack or ring_add: entries that share k, v, their strides, block's base,
 * batch, stride and head_dim (a round's transfers), blockIdx.y = entry. Entry y moves kv slots
 * [slot0, slot0 + nkv) of its transfer's block (at element blk of `block`; nkv_total slots per
 * row), slot slot0 + e holding kv head kv[kv0 + e]. Grid-stride over each entry's elements;
 * 16-byte vectors (head_dim is a multiple of 8). An adder launch never has two entries that
 * write one element (the launcher splits them). */
#define RDA_RING_ROWS_MAX_HEADS 64   /* kv slots of one entry */
#define RDA_RING_ROWS_ENTRIES 24     /* entries of one launch */
#define RDA_RING_ROWS_LAUNCH_KV 256  /* kv head indices of one launch, all entries */
typedef struct rda_ring_rows_entry {
  long long blk;                /* element offset of the transfer's block in `block` */
  long long rows;               /* the transfer's block rows */
  long long first[2], count[2]; /* local rows, as in rda_ring_rows_params */
  int nranges, nkv_total, slot0, nkv, kv0;
} rda_ring_rows_entry;

typedef struct rda_ring_rows_launch {
  void *k, *v;
  long long k_sb, k_sn, k_sh;
  long long v_sb, v_sn, v_sh;
  void *block;
  long long batch, stride;
  int head_dim, nentries;
  rda_ring_rows_entry e[RDA_RING_ROWS_ENTRIES];
  unsigned short kv[RDA_RING_ROWS_LAUNCH_KV];
} rda_ring_rows_launch;

#endif
