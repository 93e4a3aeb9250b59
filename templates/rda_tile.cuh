/* rda_tile.cuh — the device helpers rda's kernels share (namespace rda::tile): float constants,
 * the XOR swizzle of 16-byte chunks in shared-memory tiles, per-lane ldmatrix offsets, cp.async
 * tile loads, mma/pack dispatch by storage dtype, a branch's grid (SPEC §1), grid-stride loops. */
#ifndef RDA_TILE_CUH
#define RDA_TILE_CUH

#include "ptx.cuh"

namespace rda {
namespace tile {

/* ------------------------------------------------------------------ numbers */

__device__ __forceinline__ float neg_inf() {
  return __uint_as_float(0xff800000u);
}
__device__ __forceinline__ float pos_inf() {
  return __uint_as_float(0x7f800000u);
}
__device__ __forceinline__ float fmax2(float a, float b) {
  return a > b ? a : b;
}

constexpr float kLog2e = 1.4426950408889634f;

struct alignas(16) f32x4 {
  float x, y, z, w;
};

struct alignas(16) u32x4 {
  uint32_t x, y, z, w;
};

/* ------------------------------------------------------------------ storage dtype */

/* d += a b, one m16n8k16 mma in the storage dtype (bf16 or fp16), fp32 accumulate. */
template <int Dtype>
__device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  if constexpr (Dtype == RDA_DTYPE_BF16) {
    mma_bf16_16816(d, a, b, d);
  } else {
    mma_f16_16816(d, a, b, d);
  }
}

/* Two floats rounded to the storage dtype in one register, lo in the low half. */
template <int Dtype>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  if constexpr (Dtype == RDA_DTYPE_BF16) {
    return pack_bf16x2(lo, hi);
  } else {
    return pack_f16x2(lo, hi);
  }
}

/* The A fragment (16 x 16) of two adjacent fp32 accumulator column tiles x0, x1 (16 x 8 each):
 * the accumulator layout of one mma is the A layout of the next. */
template <int Dtype>
__device__ __forceinline__ void pack_a(uint32_t a[4], const float x0[4], const float x1[4]) {
  a[0] = pack<Dtype>(x0[0], x0[1]);
  a[1] = pack<Dtype>(x0[2], x0[3]);
  a[2] = pack<Dtype>(x1[0], x1[1]);
  a[3] = pack<Dtype>(x1[2], x1[3]);
}

/* One storage-dtype value as a float. */
template <int Dtype>
__device__ __forceinline__ float widen(uint16_t h) {
  if constexpr (Dtype == RDA_DTYPE_BF16) {
    return bf16_to_float(h);
  } else {
    return f16_to_float(h);
  }
}

/* ------------------------------------------------------------------ swizzled tiles */

/* XOR swizzle of 16-byte chunks within a row of a 16-bit tile, so that the 8 rows an ldmatrix
 * matrix reads (same logical chunk) fall into 8 distinct 16-byte bank groups. Rows of 8k
 * chunks (>= 128 bytes) XOR with row % 8; rows of 4 or 12 chunks (64 or 192 bytes; two rows
 * share a 128-byte line) XOR the low two bits with (row / 2) % 4, which stays inside the row. */
template <int CHUNKS>
__device__ __forceinline__ int swz(int row, int chunk) {
  if constexpr (CHUNKS % 8 == 0) {
    return chunk ^ (row & 7);
  } else {
    static_assert(CHUNKS % 4 == 0, "rows must hold a multiple of 4 chunks");
    return chunk ^ ((row >> 1) & 3);
  }
}

/* Byte offset of (row, chunk) in a swizzled tile of CHUNKS chunks per row. */
template <int CHUNKS>
__device__ __forceinline__ int tile_off(int row, int chunk) {
  return row * (CHUNKS * 16) + swz<CHUNKS>(row, chunk) * 16;
}

/* Byte offset of (row, chunk) in a tile of ROWS rows of CHUNKS chunks, in one of the two
 * layouts of the kernels' 16-bit tiles. mma.sync (WG false): rows of CHUNKS XOR-swizzled chunks
 * (tile_off). wgmma (WG true): the tile is cut into column blocks of 64 elements (128 bytes),
 * each ROWS rows of 128 bytes with chunk c of row r at c ^ (r % 8): the 128-byte swizzle atoms
 * (8 rows, 1024 bytes) that wgmma's descriptors address; the tile must start 1024-byte
 * aligned. */
template <int CHUNKS, int ROWS, bool WG>
__device__ __forceinline__ int smem_off(int row, int chunk) {
  if constexpr (WG) {
    static_assert(CHUNKS % 8 == 0, "wgmma tiles hold whole 64-element column blocks");
    return (chunk >> 3) * (ROWS * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
  } else {
    return tile_off<CHUNKS>(row, chunk);
  }
}

/* The shared-memory descriptors of wgmma operands in a tile of ROWS rows laid out by
 * smem_off<., ROWS, true> (128-byte swizzle). K-major (the head dim is K: Q as A and K as B of
 * S = Q K^T): k-step ks (16 elements) is 32 bytes into a 64-element column block, whose 8-row
 * atoms are 1024 bytes apart (stride byte offset; the leading offset is unused for a swizzled
 * K-major operand). MN-major (the rows are K, the head dim is N: V of O = P V, K of dQ = dS K):
 * k-step kk is 16 rows of 128 bytes on, the 8-row atoms 1024 bytes apart, the 64-column blocks
 * ROWS * 128 bytes apart (leading byte offset). tile: from smem_addr. */
template <int ROWS>
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t tile, int ks) {
  return smem_desc(tile + (ks >> 2) * (ROWS * 128) + (ks & 3) * 32, 16, 1024, 1);
}

template <int ROWS>
__device__ __forceinline__ uint64_t mnmajor_desc(uint32_t tile, int kk) {
  return smem_desc(tile + kk * 2048, ROWS * 128, 1024, 1);
}

/* Byte offset of the first row of warp `warp`'s warpgroup (64 rows each) in a tile laid out by
 * smem_off<., ., true>: smem_off(64 * (warp / 4), 0), where that group's A operand starts. */
__device__ __forceinline__ uint32_t wgmma_group_offset(int warp) {
  return static_cast<uint32_t>(warp / 4) * 64 * 128;
}

/* The wgmma path's two kinds of product, for one warpgroup (64 rows of A and of the result). */

/* acc (64 x N) = A B^T over KS k-steps of 16, A and B K-major at shared addresses a and b of
 * tiles of ROWS_A and ROWS_B rows. Issue only: the caller fences before and commits and waits
 * after, so that several products can share one group. */
template <int Dtype, int N, int KS, int ROWS_A, int ROWS_B>
__device__ __forceinline__ void wgmma_kmajor_product(float (&acc)[N / 8][4], uint32_t a,
                                                     uint32_t b) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
    wgmma_ss<N, Dtype, false>(acc, kmajor_desc<ROWS_A>(a, ks), kmajor_desc<ROWS_B>(b, ks), ks > 0);
}

/* X (64 x BN, fp32 in the accumulator layout, which per warp is the A fragment layout) rounded
 * to the storage dtype: the register A operand of wgmma_rs_issue. */
template <int Dtype, int BN>
__device__ __forceinline__ void pack_a_rows(uint32_t (&xa)[BN / 16][4],
                                            const float (&x)[BN / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) pack_a<Dtype>(xa[kk], x[2 * kk], x[2 * kk + 1]);
}

/* acc (64 x N) += X B with X packed by pack_a_rows, B (BN x N) MN-major at shared address b of
 * a tile of BN rows. Issue only, as wgmma_kmajor_product: the caller fences X and acc, and
 * commits and waits. */
template <int Dtype, int N, int BN>
__device__ __forceinline__ void wgmma_rs_issue(float (&acc)[N / 8][4],
                                               const uint32_t (&xa)[BN / 16][4], uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
    wgmma_rs<N, Dtype, true>(acc, xa[kk], mnmajor_desc<BN>(b, kk), true);
}

/* A product acc += X B not issued yet: X packed by pack_a_rows (the register A operand), the
 * shared address of B (BN rows, as wgmma_rs_issue), and whether there is one (uniform over
 * the warpgroup). The overlapped kernels keep one from a key tile to the next. */
template <int BN>
struct PendingRs {
  uint32_t a[BN / 16][4];
  uint32_t b;
  bool live;
};

/* Completes pd's product, if any, in one fence-issue-commit-wait sequence (so no wgmma is in
 * flight across the caller's branches): acc is final and pd empty on return. */
template <int Dtype, int N, int BN>
__device__ __forceinline__ void wgmma_rs_flush(float (&acc)[N / 8][4], PendingRs<BN> &pd) {
  if (!pd.live) return;
  wgmma_fence_operands(pd.a);
  wgmma_fence_operands(acc);
  wgmma_fence();
  wgmma_rs_issue<Dtype, N, BN>(acc, pd.a, pd.b);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(acc);
  wgmma_fence_operands(pd.a);
  pd.live = false;
}

/* acc (64 x N) += X B, one product (pack_a_rows, wgmma_rs_issue), fenced, committed and waited
 * for: acc is final on return. */
template <int Dtype, int N, int BN>
__device__ __forceinline__ void wgmma_rs_product(float (&acc)[N / 8][4],
                                                 const float (&x)[BN / 8][4], uint32_t b) {
  PendingRs<BN> pd;
  pack_a_rows<Dtype, BN>(pd.a, x);
  pd.b = b;
  pd.live = true;
  wgmma_rs_flush<Dtype, N, BN>(acc, pd);
}

/* Copy grid rows [t_first, t_first + ROWS) of a tile (rows `row_stride` elements apart from
 * `base`) into swizzled shared memory (layout smem_off<CHUNKS, ROWS, WG>); rows >= ng are
 * zero-filled. Every one of the THREADS threads issues its share. */
template <int CHUNKS, int ROWS, int THREADS, bool WG = false>
__device__ __forceinline__ void load_tile(unsigned char *dst, const uint16_t *base,
                                          long long row_stride, int t_first, int ng, int tid) {
  constexpr int TOTAL = ROWS * CHUNKS;
#pragma unroll
  for (int i = 0; i < (TOTAL + THREADS - 1) / THREADS; ++i) {
    const int idx = tid + i * THREADS;
    if (TOTAL % THREADS == 0 || idx < TOTAL) {
      const int row = idx / CHUNKS;
      const int ch = idx % CHUNKS;
      const int t = t_first + row;
      const bool ok = t < ng;
      const uint16_t *src = base + (ok ? static_cast<long long>(t) * row_stride : 0) + ch * 8;
      cp_async_16(dst + smem_off<CHUNKS, ROWS, WG>(row, ch), src, ok);
    }
  }
}

/* Per-lane byte offsets of ldmatrix rows in a swizzled tile. An x4 ldmatrix reads chunk pair
 * cp (chunks 2cp, 2cp+1) of 16 rows; lane L addresses row `row` (fixed per lane up to multiples
 * of 16, which keep the swizzle) and chunk 2cp + odd. The swizzle repeats every PERIOD chunks,
 * so PAIRS offsets per lane cover every cp: off(cp) = ofs[cp % PAIRS] + (cp / PAIRS) * PERIOD * 16.
 * Keeping only these few offsets live (instead of one per chunk) saves registers. */
template <int CHUNKS>
struct LaneOfs {
  static constexpr int PERIOD = CHUNKS % 8 == 0 ? 8 : 4;
  static constexpr int PAIRS = PERIOD / 2;
  int ofs[PAIRS];

  __device__ __forceinline__ void init(int row, int odd) {
#pragma unroll
    for (int k = 0; k < PAIRS; ++k) ofs[k] = tile_off<CHUNKS>(row, 2 * k + odd);
  }
  /* Offset of chunk pair cp for this lane's row plus `row16` rows (a multiple of 16). */
  __device__ __forceinline__ int at(int cp, int row16) const {
    return ofs[cp % PAIRS] + (cp / PAIRS) * PERIOD * 16 + row16 * CHUNKS * 16;
  }
};

/* The wgmma path's tiles must start 1024-byte aligned: its 128-byte swizzle atoms are addressed
 * by shared address. dynamic_smem() declares that alignment, and the compiler takes it as given,
 * so a plain check folds away; through opaque() a misaligned base (a static __shared__ added to
 * a kernel, which can push the dynamic part off) traps instead of computing garbage. */
__device__ __forceinline__ void require_atom_alignment(const void *smem) {
  if ((opaque(smem_addr(smem)) & 1023u) != 0) __trap();
}

/* ------------------------------------------------------------------ a branch's grid (SPEC §1) */

/* Offset j of the grid of query head h within a segment, for dilation r under offset rule
 * offset_mode (offset_arg: block: ceil(H / r); group: the branch index). 0 when not dilated. */
template <bool Dilated>
__device__ __forceinline__ long long grid_offset(int offset_mode, int offset_arg, int h,
                                                 long long r) {
  long long j = 0;
  if constexpr (Dilated) {
    if (offset_mode == RDA_OFFSETS_MOD) {
      j = h % r;
    } else if (offset_mode == RDA_OFFSETS_BLOCK) {
      j = h / offset_arg;
    } else {
      j = offset_arg % r;
    }
  }
  return j;
}

/* Rows of the grid at offset j, dilation r, in a segment of len positions (0 when j >= len). */
__device__ __forceinline__ int grid_rows(long long len, long long j, long long r) {
  return j < len ? static_cast<int>((len - j + r - 1) / r) : 0;
}

/* ------------------------------------------------------------------ 1-D grid-stride loops */

/* Grid-stride loop bounds for a 1-D launch of THREADS threads per block. */
template <int THREADS>
__device__ __forceinline__ long long first_index() {
  return static_cast<long long>(blockIdx.x) * THREADS + threadIdx.x;
}

template <int THREADS>
__device__ __forceinline__ long long grid_stride() {
  return static_cast<long long>(gridDim.x) * THREADS;
}

}  // namespace tile
}  // namespace rda

#endif
