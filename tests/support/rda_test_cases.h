/* rda_test_cases.h — the cases test_fwd.c and test_bwd.c both run, each described once: a case
 * added or changed here runs in both passes. Each is a list of designated initializers, so it
 * fills the forward's and the backward's own case structs by field name and a pass adds its own
 * fields after it (the backward's dLSE), in sight at the call. Also how both passes cut their
 * range cases: guarded pieces, launches over segments, compact key blocks (rda_test_cases.c). */
#ifndef RDA_TEST_CASES_H
#define RDA_TEST_CASES_H

#include <stddef.h>
#include <stdint.h>

#include "rda_test_backend.h" /* BR1, BR2, BR3 */

/* ------------------------------------------------------------------ whole problems */
/* For fwd_case and bwd_case (their fields heads ... scale, wgmma): `{RT_CASE_...}`. */

/* The wgmma path, causal: warpgroups whose rows need every, some and none of a key tile (the
 * skip and the mask are decided per warpgroup of 64 rows, the mask applied per row), fp16 with
 * a custom scale, d = 64, dilated block offsets beside a dense branch, batch 2. */
#define RT_CASE_WGMMA_CAUSAL_FP16_D64_BLOCK                                              \
  .heads = 4, .kv_heads = 2, .head_dim = 64, .dtype = RDA_DTYPE_FP16, .causal = 1,       \
  .offsets = RDA_OFFSETS_BLOCK, BR2(320, 1, 128, 2), .batch = 2, .n = 320, .scale = 0.3, \
  .wgmma = 1

/* ------------------------------------------------------------------ row ranges (the ring) */
/* For the range cases (range_case, split_case: the problem in .c, contiguous; nq query and nk
 * key pieces cut at qcut and kcut; compact: keys from compact blocks): `{RT_RANGES_...}`. */

/* Queries in three uneven pieces, keys in two: causal GQA with "mod" offsets (the heads of a kv
 * group on different grids), a dense, a dilated and a clamped (w > N) branch, batch 2; pieces
 * that cut segments and grids mid-tile, keys wholly in the future of a piece. */
#define RT_RANGES_SPLIT_CAUSAL_GQA_BF16_D64                                                   \
  .c.heads = 4, .c.kv_heads = 2, .c.head_dim = 64, .c.dtype = RDA_DTYPE_BF16, .c.causal = 1,  \
  .c.offsets = RDA_OFFSETS_MOD, BR3(64, 1, 96, 2, 512, 3), .c.batch = 2, .c.n = 150, .nq = 3, \
  .qcut = {0, 37, 101, 150}, .nk = 2, .kcut = {0, 70, 150}

/* Non-causal MQA with "block" offsets and r not dividing w. */
#define RT_RANGES_BLOCK_MQA_FP16_D32                                                         \
  .c.heads = 4, .c.kv_heads = 1, .c.head_dim = 32, .c.dtype = RDA_DTYPE_FP16, .c.causal = 0, \
  .c.offsets = RDA_OFFSETS_BLOCK, BR2(48, 3, 130, 2), .c.batch = 1, .c.n = 130, .nq = 2,     \
  .qcut = {0, 50, 130}, .nk = 3, .kcut = {0, 23, 89, 130}

/* Causal "group" offsets (each head one branch) with three key pieces, batch 2. */
#define RT_RANGES_GROUP_CAUSAL_BF16_D32                                                      \
  .c.heads = 3, .c.kv_heads = 3, .c.head_dim = 32, .c.dtype = RDA_DTYPE_BF16, .c.causal = 1, \
  .c.offsets = RDA_OFFSETS_GROUP, BR2(40, 1, 90, 2), .c.batch = 2, .c.n = 128, .nq = 2,      \
  .qcut = {0, 81, 128}, .nk = 3, .kcut = {0, 19, 64, 128}

/* Compact received keys (k_sn = 0, the block's row pitch k_rs): every (query head, segment, key
 * piece) from its own gathered block; causal GQA with dilated "mod" branches. */
#define RT_RANGES_COMPACT_CAUSAL_GQA_BF16_D64                                                \
  .c.heads = 4, .c.kv_heads = 2, .c.head_dim = 64, .c.dtype = RDA_DTYPE_BF16, .c.causal = 1, \
  .c.offsets = RDA_OFFSETS_MOD, BR2(64, 2, 150, 3), .c.batch = 2, .c.n = 150, .nq = 2,       \
  .qcut = {0, 61, 150}, .nk = 2, .kcut = {0, 97, 150}, .compact = 1

/* Compact keys, non-causal "block" MQA with one key piece (whole segments, as a ring transfer
 * of a segment) and a one-row query piece. */
#define RT_RANGES_COMPACT_BLOCK_MQA_FP16_D32                                                 \
  .c.heads = 4, .c.kv_heads = 1, .c.head_dim = 32, .c.dtype = RDA_DTYPE_FP16, .c.causal = 0, \
  .c.offsets = RDA_OFFSETS_BLOCK, BR2(40, 1, 100, 3), .c.batch = 1, .c.n = 100, .nq = 3,     \
  .qcut = {0, 33, 34, 100}, .nk = 1, .kcut = {0, 100}, .compact = 1

/* Each piece of a range case is its own allocation with RT_GUARD_ROWS rows of 0xff bytes (NaN
 * in bf16, fp16 and fp32) before and after each batch entry's rows: a read outside the ranges
 * turns an output into NaN, a write outside them shows in the guards. */
enum { RT_GUARD_ROWS = 4 };

/* Rows [lo, lo + len) of a contiguous [B, N, X] tensor of esize-byte elements as a device tensor
 * [B, RT_GUARD_ROWS + len + RT_GUARD_ROWS, X]. view points at row lo of batch 0; the row stride
 * is x elements, sb the elements per batch entry. */
typedef struct rt_guarded {
  unsigned char *base, *view;
  size_t bytes, esize;
  long long batch, len, x, sb;
} rt_guarded;

/* The rows copied from host, a [B, N, X] tensor. */
void rt_guarded_copy(rda_backend *b, rt_guarded *g, const void *host, size_t esize, long long B,
                     long long N, long long X, long long lo, long long len);
/* Every byte of the rows `fill`: 0xff (NaN) for an output the kernels must write, 0 for one they
 * add to. */
void rt_guarded_fill(rda_backend *b, rt_guarded *g, unsigned char fill, size_t esize, long long B,
                     long long N, long long X, long long lo, long long len);
/* Download and free g: guard bytes that are not 0xff count into *bad; the rows (fp32) go to
 * full [B, N, X] at row lo (full NULL: only the guards are checked). */
void rt_guarded_take(rda_backend *b, rt_guarded *g, float *full, long long N, long long lo,
                     long long *bad);

/* The segments of w rows that query rows [qlo, qhi) and key rows [klo, khi) both meet, in at
 * most two launches: the first segment alone, then the rest in one (seg0 > 0, several segments).
 * Writes each launch's first segment and count; returns how many launches (0 when none). */
int rt_segment_launches(long long qlo, long long qhi, long long klo, long long khi, long long w,
                        long long seg0[2], long long nseg[2]);

/* Compact received keys, as the ring's transfers hold them: per query head h, segment and key
 * piece, the grid rows of h's kv head that lie in the piece, gathered into slot RT_KV_SLOT of a
 * block of RT_KV_SLOTS kv heads (row pitch RT_KV_SLOTS D; k_sn = k_sh = 0), the other slot NaN
 * so that a read of it shows. */
enum { RT_KV_SLOTS = 2, RT_KV_SLOT = 1 };

/* One such block: rows grid rows at positions pos0, pos0 + r, ... of query head `head`'s grid
 * in segment seg (positions [a, e)), those in the key piece [lo, hi). */
typedef struct rt_kv_span {
  int head;
  long long kv_head, seg, a, e, lo, hi, pos0, r, rows;
} rt_kv_span;

/* The blocks of heads [head0, head0 + nheads) on cfg's branch `branch` over N rows, keys cut at
 * kcut[0] < ... < kcut[nk]: head by head, segment by segment, piece by piece, none without grid
 * rows. *out is malloc'd; returns how many. */
int rt_kv_spans(const rda_config *cfg, int branch, int head0, int nheads, long long N, int nk,
                const long long *kcut, rt_kv_span **out);

/* A device block [B][guard + rows + guard][RT_KV_SLOTS][D] of sp's rows of a contiguous
 * [B, N, Hkv, D] storage tensor (bits), every byte but theirs 0xff (NaN in bf16 and fp16). */
uint16_t *rt_kv_block(rda_backend *b, const uint16_t *bits, long long B, long long N, long long Hkv,
                      long long D, const rt_kv_span *sp, long long guard);

#endif
