/* rda_fwd.cuh — the fused dilated-attention forward kernel (SPEC §1), FlashAttention-2 style:
 * one block per (query tile of one segment's grid, head, batch), one warp per 16 query rows,
 * a cp.async pipeline over K/V tiles, online softmax in fp32 with exp2, and an fp32 epilogue
 * that merges branches by log-sum-exp. Two instruction paths for the two matrix products:
 * mma.sync m16n8k16 through ldmatrix (sm_80+), or (Cfg::wgmma, sm_90a) warpgroup wgmma, one
 * warpgroup per 64 query rows, reading Q, K and V from shared memory through descriptors. */
#ifndef RDA_FWD_CUH
#define RDA_FWD_CUH

#include "rda_tile.cuh"

namespace rda {
namespace fwd_detail {

/* Tile helpers shared with the backward kernels (rda_tile.cuh). */
using tile::f32x4;
using tile::fmax2;
using tile::LaneOfs;
using tile::mma;
using tile::neg_inf;
using tile::pack_a;
using tile::swz;
using tile::tile_off;

/* Everything the kernel derives from the generated config struct. */
template <class Cfg>
struct Traits {
  static constexpr int D = Cfg::head_dim;
  static constexpr int BM = Cfg::block_m;
  static constexpr int BN = Cfg::block_n;
  static constexpr int WARPS = Cfg::warps;
  static constexpr int STAGES = Cfg::stages;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int CHUNKS = D / 8;    /* 16-byte chunks per row of a Q/K/V tile */
  static constexpr int ROW_BYTES = 2 * D; /* one row of a 16-bit tile */
  static constexpr int Q_BYTES = BM * ROW_BYTES;
  static constexpr int KV_BYTES = BN * ROW_BYTES; /* one K (or V) stage */
  static constexpr int SMEM_BYTES = Q_BYTES + 2 * STAGES * KV_BYTES;
  static constexpr int NT = BN / 8; /* 8-key column tiles of S = Q K^T */
  static constexpr int KS = D / 16; /* 16-wide k-steps over the head dim */
  static constexpr int DT = D / 8;  /* 8-wide column tiles of O */
  /* wgmma path: a warpgroup (4 warps) per 64 query rows; tiles in 128-byte swizzle atoms. */
  static constexpr bool WG = Cfg::wgmma;
  static constexpr int GROUP_ROWS = WG ? 64 : 16; /* query rows skipped or masked together */
  /* Cfg::overlap (wgmma only): a warpgroup issues O += P V of tile j-1 behind S = Q K^T of
   * tile j and computes tile j's softmax while the tensor cores run it. Tile j-1's V stage is
   * then read until tile j's step ends, so only stages - 2 tiles load ahead, not stages - 1. */
  static constexpr bool OVL = Cfg::overlap;
  static constexpr int AHEAD = OVL ? STAGES - 2 : STAGES - 1; /* K/V tiles loaded ahead */
  /* mma.sync path: Q fragments stay in registers up to d = 128 (reloaded per k-step at 256). */
  static constexpr bool Q_IN_REGS = !WG && D <= 128;
  /* The epilogue stages the fp32 O tile plus two floats per row over the whole buffer. */
  static constexpr int EPI_BYTES = BM * D * 4 + BM * 8;

  static_assert(D == 32 || D == 64 || D == 96 || D == 128 || D == 256, "unsupported head_dim");
  static_assert(BM == 16 * WARPS, "each warp owns 16 query rows");
  static_assert(BN % 16 == 0 && BN >= 16, "block_n must be a multiple of 16");
  static_assert(STAGES >= 2, "the K/V pipeline needs at least 2 stages");
  static_assert(EPI_BYTES <= SMEM_BYTES, "epilogue staging does not fit: raise stages or block_n");
  static_assert(!WG || ((D == 64 || D == 128) && (BN == 64 || BN == 128) && WARPS % 4 == 0),
                "wgmma: head_dim and block_n in {64, 128}, whole warpgroups");
  static_assert(!OVL || (WG && STAGES >= 3), "overlap: a wgmma tile with at least 3 stages");

  /* Byte offset of (row, chunk) in a tile of ROWS rows, in this path's layout (rda_tile.cuh). */
  template <int ROWS>
  static __device__ __forceinline__ int smem_off(int row, int chunk) {
    return tile::smem_off<CHUNKS, ROWS, WG>(row, chunk);
  }
};

/* Swizzle of the epilogue's fp32 staging tile (rows of D/4 >= 8 chunks). A float2 store phase
 * covers 4 rows x 2 adjacent chunks; XOR with 2 * (row % 4) spreads them over 8 bank groups,
 * and a float4 read phase (8 chunks of one row) stays a permutation. */
__device__ __forceinline__ int swz_o(int row, int chunk) { return chunk ^ ((row & 3) << 1); }

/* Copy rows [row0, row0 + ROWS) of a tile whose grid rows start at `base` with `row_stride`
 * elements between them; grid rows >= ng are zero-filled. Every thread issues its share. */
template <class T, int ROWS>
__device__ __forceinline__ void load_tile(unsigned char *dst, const uint16_t *base,
                                          long long row_stride, int t_first, int ng, int tid) {
  constexpr int TOTAL = ROWS * T::CHUNKS;
  if constexpr (T::THREADS % T::CHUNKS == 0 && ROWS % (T::THREADS / T::CHUNKS) == 0) {
    /* Each thread owns one chunk column and walks rows RSTEP apart: one pointer, bumped. */
    constexpr int RSTEP = T::THREADS / T::CHUNKS;
    const int ch = tid % T::CHUNKS;
    const int row0 = tid / T::CHUNKS;
    const uint16_t *src = base + static_cast<long long>(t_first + row0) * row_stride + ch * 8;
    const long long step = RSTEP * row_stride;
#pragma unroll
    for (int i = 0; i < ROWS / RSTEP; ++i) {
      const int row = row0 + i * RSTEP;
      const bool ok = t_first + row < ng;
      cp_async_16(dst + T::template smem_off<ROWS>(row, ch), ok ? src : base, ok);
      src += step;
    }
  } else {
#pragma unroll
    for (int i = 0; i < (TOTAL + T::THREADS - 1) / T::THREADS; ++i) {
      const int idx = tid + i * T::THREADS;
      if (TOTAL % T::THREADS == 0 || idx < TOTAL) {
        const int row = idx / T::CHUNKS;
        const int ch = idx % T::CHUNKS;
        const int t = t_first + row;
        const bool ok = t < ng;
        const uint16_t *src = base + (ok ? static_cast<long long>(t) * row_stride : 0) + ch * 8;
        cp_async_16(dst + T::template smem_off<ROWS>(row, ch), src, ok);
      }
    }
  }
}

/* The first grid row t >= 0 with x <= t * r (x: position relative to the grid's start),
 * clamped to [0, ng]. */
__device__ __forceinline__ int grid_at(long long x, long long r, int ng) {
  if (x <= 0) return 0;
  const long long t = (x + r - 1) / r;
  return t < ng ? static_cast<int>(t) : ng;
}

/* Where the block's work lies: segment, head, grid and strides. */
struct Block {
  long long pos; /* local row in q, o, lse of the tile's first row (grid row t0) */
  long long r;   /* dilation rate (1 when not dilated) */
  int nrows;     /* rows of the tile that are queries of the launch (grid rows < q_hi's) */
};

/* Masks S (keys past the grid end, and, causal, keys after the query row), then the online
 * softmax in the log2 domain: S becomes P and the row maxima m and sums l advance; corr gets
 * the factor the accumulator of each of the thread's two rows must be scaled by (rescale).
 * Each thread holds rows wrow0 + g and wrow0 + g + 8 (g = lane / 4) of the accumulator layout;
 * a row is spread over the 4 lanes of a quad. */
template <class Cfg, bool Mask, int NT>
__device__ __forceinline__ void softmax_scores(float (&s)[NT][4], float sl2, int n0, int ng,
                                               int wrow0, float m[2], float l[2],
                                               float corr[2]) {
  const int lane = lane_id();
  const int g = lane >> 2;
  const int c2 = 2 * (lane & 3);
  if constexpr (Mask) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + nt * 8 + c2 + (e & 1);
        const int row = wrow0 + g + 8 * (e >> 1);
        if (key >= ng || (Cfg::causal && key > row)) s[nt][e] = neg_inf();
      }
    }
  }

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mx = neg_inf();
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mx = fmax2(mx, fmax2(s[nt][2 * hf], s[nt][2 * hf + 1]));
    mx = fmax2(mx, shfl_xor(mx, 1));
    mx = fmax2(mx, shfl_xor(mx, 2));
    const float mnew = fmax2(m[hf], mx == neg_inf() ? neg_inf() : mx * sl2);
    const float muse = mnew == neg_inf() ? 0.f : mnew;
    corr[hf] = ex2(m[hf] - muse);
    m[hf] = mnew;
    l[hf] *= corr[hf];
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
        float pv = ex2(s[nt][e] * sl2 - muse);
        if constexpr (Mask) {
          if (s[nt][e] == neg_inf()) pv = 0.f;
        }
        s[nt][e] = pv;
        sum += pv;
      }
    }
    l[hf] += sum;
  }
}

/* acc's two rows of this thread scaled by corr (softmax_scores). */
template <int DT>
__device__ __forceinline__ void rescale(float (*acc)[4], const float corr[2]) {
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    acc[dt][0] *= corr[0];
    acc[dt][1] *= corr[0];
    acc[dt][2] *= corr[1];
    acc[dt][3] *= corr[1];
  }
}

/* softmax_scores, then acc rescaled: the whole online-softmax step of a tile. */
template <class Cfg, bool Mask, int NT>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float sl2, int n0, int ng,
                                               int wrow0, float (*acc)[4], float m[2],
                                               float l[2]) {
  float corr[2];
  softmax_scores<Cfg, Mask>(s, sl2, n0, ng, wrow0, m, l, corr);
  rescale<Traits<Cfg>::DT>(acc, corr);
}

/* One K/V tile: S = Q K^T for this warp's 16 rows, online softmax, O += P V. */
template <class Cfg, bool Mask>
__device__ __forceinline__ void tile_step(const unsigned char *sq, const unsigned char *sk,
                                          const unsigned char *sv, const uint32_t (*qf)[4],
                                          const LaneOfs<Cfg::head_dim / 8> &qo,
                                          const LaneOfs<Cfg::head_dim / 8> &ko,
                                          const LaneOfs<Cfg::head_dim / 8> &vo, uint32_t qflip,
                                          float sl2, int n0, int ng, int wrow0, float (*acc)[4],
                                          float m[2], float l[2]) {
  using T = Traits<Cfg>;

  float s[T::NT][4];
#pragma unroll
  for (int nt = 0; nt < T::NT; ++nt) {
    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
  }

  /* S = Q K^T: A from Q (rows), B from K rows (ldmatrix non-trans gives the col-major B). */
#pragma unroll
  for (int ks = 0; ks < T::KS; ++ks) {
    uint32_t qa[4];
    if constexpr (T::Q_IN_REGS) {
      qa[0] = qf[ks][0];
      qa[1] = qf[ks][1];
      qa[2] = qf[ks][2];
      qa[3] = qf[ks][3];
    } else {
      ldmatrix_x4(qa, sq + qo.at(ks, 0));
      qa[0] ^= qflip;
      qa[1] ^= qflip;
      qa[2] ^= qflip;
      qa[3] ^= qflip;
    }
#pragma unroll
    for (int np = 0; np < T::NT / 2; ++np) {
      uint32_t kb[4];
      ldmatrix_x4(kb, sk + ko.at(ks, 16 * np));
      mma<Cfg::dtype>(s[2 * np], qa, kb);
      mma<Cfg::dtype>(s[2 * np + 1], qa, kb + 2);
    }
  }

  online_softmax<Cfg, Mask>(s, sl2, n0, ng, wrow0, acc, m, l);

  /* O += P V: P's accumulator layout is exactly the A fragment; V through ldmatrix.trans. */
#pragma unroll
  for (int kk = 0; kk < T::BN / 16; ++kk) {
    uint32_t pa[4];
    pack_a<Cfg::dtype>(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
    for (int dp = 0; dp < T::D / 16; ++dp) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, sv + vo.at(dp, 16 * kk));
      mma<Cfg::dtype>(acc[2 * dp], pa, vb);
      mma<Cfg::dtype>(acc[2 * dp + 1], pa, vb + 2);
    }
  }
}

/* S negated in place: a negative scale runs the softmax on -S with |scale|. */
template <int NT>
__device__ __forceinline__ void negate(float (&s)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    s[nt][0] = -s[nt][0];
    s[nt][1] = -s[nt][1];
    s[nt][2] = -s[nt][2];
    s[nt][3] = -s[nt][3];
  }
}

/* One K/V tile on the wgmma path: S = Q K^T for this warpgroup's 64 rows (A = Q and B = K from
 * shared memory), online softmax, O += P V (A = P from registers, B = V from shared memory).
 * sq: the shared address of the group's first Q row (column block 0); sk, sv: the stage's
 * K and V tiles. Each product is waited for before its accumulator is touched. */
template <class Cfg, bool Mask>
__device__ __forceinline__ void tile_step_wg(uint32_t sq, uint32_t sk, uint32_t sv, bool qneg,
                                             float sl2, int n0, int ng, int wrow0,
                                             float (&o)[Traits<Cfg>::DT][4], float m[2],
                                             float l[2]) {
  using T = Traits<Cfg>;
  float s[T::NT][4];

  wgmma_fence();
  tile::wgmma_kmajor_product<Cfg::dtype, T::BN, T::KS, T::BM, T::BN>(s, sq, sk);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(s);
  if (qneg) negate(s); /* a negative scale: softmax below runs on -S with |scale| */

  online_softmax<Cfg, Mask>(s, sl2, n0, ng, wrow0, o, m, l);

  tile::wgmma_rs_product<Cfg::dtype, T::D, T::BN>(o, s, sv); /* O += P V */
}

/* The P V product of a warpgroup's previous tile (wgmma path with overlap): P packed to the
 * storage dtype, and the shared address of that tile's V stage. */
template <class Cfg>
using PendingPV = tile::PendingRs<Cfg::block_n>;

/* Completes the pending P V product, if any: on return o is final and pv is empty. Every tile
 * of a warpgroup ends in a step or in this, before its V stage is loaded over. */
template <class Cfg>
__device__ __forceinline__ void flush_pending_pv(float (&o)[Traits<Cfg>::DT][4],
                                                 PendingPV<Cfg> &pv) {
  tile::wgmma_rs_flush<Cfg::dtype, Traits<Cfg>::D, Cfg::block_n>(o, pv);
}

/* One K/V tile on the wgmma path with overlap (FlashAttention-3's intra-warpgroup pipelining).
 * With a pending product (Pending): S = Q K^T of this tile and then O += P V of the previous
 * one are issued as two groups; the softmax of this tile runs once S has landed, while the
 * P V product is still on the tensor cores; then O, final, is rescaled. Without (the
 * warpgroup's first tile): S alone. Either way this tile's P becomes the pending product, and
 * nothing is in flight on return. The registers of the in-flight P are not written until it
 * is waited for (the hardware reads them asynchronously), so this tile's P is packed only
 * after that wait. Pending is a template parameter, not a branch inside: ptxas serializes
 * every wgmma of a kernel whose products are in flight across a branch it cannot prove
 * uniform (advisory C7520). */
template <class Cfg, bool Mask, bool Pending>
__device__ __forceinline__ void tile_step_wg_overlap(uint32_t sq, uint32_t sk, uint32_t sv,
                                                     bool qneg, float sl2, int n0, int ng,
                                                     int wrow0, float (&o)[Traits<Cfg>::DT][4],
                                                     float m[2], float l[2],
                                                     PendingPV<Cfg> &pv) {
  using T = Traits<Cfg>;
  float s[T::NT][4];

  wgmma_fence_operands(o);
  wgmma_fence_operands(pv.a);
  wgmma_fence();
  tile::wgmma_kmajor_product<Cfg::dtype, T::BN, T::KS, T::BM, T::BN>(s, sq, sk);
  wgmma_commit();
  if constexpr (Pending) {
    tile::wgmma_rs_issue<Cfg::dtype, T::D, T::BN>(o, pv.a, pv.b); /* O += P V, previous tile */
    wgmma_commit();
    wgmma_wait<1>(); /* S has landed; P V may still run */
  } else {
    wgmma_wait<0>();
  }
  wgmma_fence_operands(s);
  if (qneg) negate(s);
  float corr[2];
  softmax_scores<Cfg, Mask>(s, sl2, n0, ng, wrow0, m, l, corr);

  if constexpr (Pending) {
    wgmma_wait<0>();
    wgmma_fence_operands(o);
    wgmma_fence_operands(pv.a);
  }
  rescale<T::DT>(o, corr);
  tile::pack_a_rows<Cfg::dtype, T::BN>(pv.a, s);
  pv.b = sv;
  pv.live = true;
}

/* tile_step_wg_overlap with Mask and Pending as runtime flags (each combination a complete
 * step, so no wgmma is in flight across these branches). */
template <class Cfg>
__device__ __forceinline__ void tile_step_wg_overlap_any(bool mask, uint32_t sq, uint32_t sk,
                                                         uint32_t sv, bool qneg, float sl2, int n0,
                                                         int ng, int wrow0,
                                                         float (&o)[Traits<Cfg>::DT][4],
                                                         float m[2], float l[2],
                                                         PendingPV<Cfg> &pv) {
  if (pv.live) {
    if (mask)
      tile_step_wg_overlap<Cfg, true, true>(sq, sk, sv, qneg, sl2, n0, ng, wrow0, o, m, l, pv);
    else
      tile_step_wg_overlap<Cfg, false, true>(sq, sk, sv, qneg, sl2, n0, ng, wrow0, o, m, l, pv);
  } else {
    if (mask)
      tile_step_wg_overlap<Cfg, true, false>(sq, sk, sv, qneg, sl2, n0, ng, wrow0, o, m, l, pv);
    else
      tile_step_wg_overlap<Cfg, false, false>(sq, sk, sv, qneg, sl2, n0, ng, wrow0, o, m, l, pv);
  }
}

/* Write the block's rows: o = acc / l and lse, or their log-sum-exp merge with what o and lse
 * already hold (p.merge). Staged through shared memory so global stores are 16-byte vectors. */
template <class Cfg>
__device__ __forceinline__ void epilogue(const rda_fwd_params &p, const Block &bk,
                                         unsigned char *smem, float (*acc)[4], const float m[2],
                                         const float l[2]) {
  using T = Traits<Cfg>;
  constexpr int C4 = T::D / 4; /* 16-byte chunks per fp32 row */
  const int tid = threadIdx.x;
  const int lane = lane_id();
  const int warp = tid >> 5;
  float *so = reinterpret_cast<float *>(smem);
  float *srow = so + T::BM * T::D;

  cp_async_wait<0>();
  sync_threads(); /* every warp is done with Q/K/V in shared memory */

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float lt = l[hf];
    lt += shfl_xor(lt, 1);
    lt += shfl_xor(lt, 2);
    const int row = 16 * warp + (lane >> 2) + 8 * hf;
#pragma unroll
    for (int dt = 0; dt < T::DT; ++dt) {
      const int chunk = 2 * dt + ((lane & 3) >> 1);
      float *dst = so + row * T::D + swz_o(row, chunk) * 4 + 2 * (lane & 1);
      dst[0] = acc[dt][2 * hf];
      dst[1] = acc[dt][2 * hf + 1];
    }
    if ((lane & 3) == 0) {
      srow[2 * row] = m[hf];
      srow[2 * row + 1] = lt;
    }
  }
  sync_threads();

  /* Per row: the natural-log lse, and the weights of the old and the new output. */
  constexpr float kLn2 = 0.693147180559945309f;
  /* Recomputed from the block index here rather than kept live through the main loop. */
  const int h = p.head0 + static_cast<int>(blockIdx.y);
  const long long b = blockIdx.z;
  float *lse_row = p.lse + b * p.lse_sb + h * p.lse_sh + bk.pos;
  for (int row = tid; row < T::BM; row += T::THREADS) {
    if (row < bk.nrows) {
      const float mm = srow[2 * row];
      const float ll = srow[2 * row + 1];
      /* ll == 0: every key of this launch was masked (only with sub-range keys, the ring). */
      float lse = ll > 0.f ? (mm + log2f(ll)) * kLn2 : neg_inf();
      float w_new = ll > 0.f ? 1.f / ll : 0.f;
      float w_old = 0.f;
      float *lp = lse_row + row * bk.r;
      if (p.merge) {
        const float old = *lp;
        if (old != neg_inf() && lse == neg_inf()) {
          w_old = 1.f;
          lse = old;
        } else if (old != neg_inf()) {
          const float mx = fmax2(old, lse);
          const float merged = mx + logf(expf(old - mx) + expf(lse - mx));
          w_old = expf(old - merged);
          w_new = expf(lse - merged) / ll;
          lse = merged;
        }
      }
      *lp = lse;
      srow[2 * row] = w_old;
      srow[2 * row + 1] = w_new;
    }
  }
  sync_threads();

  const long long o_rs = bk.r * p.o_sn;
  float *o_row = p.o + b * p.o_sb + h * p.o_sh + bk.pos * p.o_sn;
#pragma unroll 4
  for (int idx = tid; idx < T::BM * C4; idx += T::THREADS) {
    const int row = idx / C4;
    const int ch = idx % C4;
    if (row < bk.nrows) {
      const f32x4 v = *reinterpret_cast<const f32x4 *>(so + row * T::D + swz_o(row, ch) * 4);
      const float w_old = srow[2 * row];
      const float w_new = srow[2 * row + 1];
      f32x4 *dst = reinterpret_cast<f32x4 *>(o_row + row * o_rs + ch * 4);
      f32x4 out;
      out.x = v.x * w_new;
      out.y = v.y * w_new;
      out.z = v.z * w_new;
      out.w = v.w * w_new;
      if (w_old != 0.f) {
        const f32x4 old = *dst;
        out.x += old.x * w_old;
        out.y += old.y * w_old;
        out.z += old.z * w_old;
        out.w += old.w * w_old;
      }
      *dst = out;
    }
  }
}

}  // namespace fwd_detail

/* The forward kernel for one branch (w, r) of the params; see rda_params.h for the grid.
 * Cfg: head_dim, dtype, causal, dilated, block_m (= 16 * warps), block_n, warps, stages,
 * kv_table (keys and values from a ring round's blocks through p.kvt, rda_params.h), wgmma,
 * overlap (wgmma: each tile's softmax beside the previous tile's P V product).
 * Dynamic shared memory: Traits<Cfg>::SMEM_BYTES = 2 * head_dim * (block_m + 2 * stages *
 * block_n): the Q tile, then `stages` K tiles, then `stages` V tiles, all XOR-swizzled.
 * Alignment (the launcher must check; the GPU faults otherwise): q, k, v 16-byte aligned with
 * strides that are multiples of 8 elements (16-byte cp.async per row chunk); o 16-byte aligned
 * with strides that are multiples of 4 (float4 stores). lse has no alignment requirement. */
template <class Cfg>
__device__ __forceinline__ void fwd_kernel(const rda_fwd_params &p) {
  using T = fwd_detail::Traits<Cfg>;
  static_assert(Cfg::smem_bytes == T::SMEM_BYTES, "the planner's smem_bytes is not the layout's");
  using fwd_detail::Block;
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = lane_id();

  Block bk;
  const long long seg = static_cast<int>(blockIdx.x) / p.tiles_per_seg + p.seg0;
  /* Causal: the last query tiles of a segment have the most keys; blocks launched first take
   * them so the short ones fill the tail of the grid. */
  const int tile_in = static_cast<int>(blockIdx.x) % p.tiles_per_seg;
  const int tile = Cfg::causal ? p.tiles_per_seg - 1 - tile_in : tile_in;
  const int h = p.head0 + static_cast<int>(blockIdx.y);
  const long long b = blockIdx.z;
  const long long a = seg * p.w; /* first position of the segment */
  const long long seg_end = a + p.w < p.n ? a + p.w : p.n;
  bk.r = Cfg::dilated ? p.r : 1;
  long long j = 0; /* grid offset within the segment */
  if constexpr (Cfg::dilated) {
    if (p.offset_mode == RDA_OFFSETS_MOD) {
      j = h % bk.r;
    } else if (p.offset_mode == RDA_OFFSETS_BLOCK) {
      j = h / p.offset_arg;
    } else {
      j = p.offset_arg % bk.r;
    }
  }
  const long long len = seg_end - a;
  const int ng = j < len ? static_cast<int>((len - j + bk.r - 1) / bk.r) : 0;
  /* Query grid rows [qt0, qt1) and key grid rows [kt0, kt1) of this launch. */
  const int qt0 = fwd_detail::grid_at(p.q_lo - (a + j), bk.r, ng);
  const int qt1 = fwd_detail::grid_at(p.q_hi - (a + j), bk.r, ng);
  const int kt0 = fwd_detail::grid_at(p.kv_lo - (a + j), bk.r, ng);
  const int kt1 = fwd_detail::grid_at(p.kv_hi - (a + j), bk.r, ng);
  const int t0 = qt0 + tile * T::BM; /* first grid row of this query tile */
  if (t0 >= qt1) return;
  const long long pos0 = a + j - p.row_lo; /* local row of grid row 0 in q, o, lse */
  bk.nrows = qt1 - t0;
  bk.pos = pos0 + t0 * bk.r;
  const int nk = kt1 > kt0 ? kt1 - kt0 : 0; /* keys, counted from kt0 */

  /* Grid row 0's address; rows before qt0 are never read (cp.async with src-size 0). */
  const uint16_t *qg = static_cast<const uint16_t *>(p.q) + b * p.q_sb + h * p.q_sh + pos0 * p.q_sn;
  const uint16_t *kg, *vg; /* key grid row kt0 */
  if constexpr (Cfg::kv_table) {
    const int kcls = p.kvt.cls[blockIdx.y];
    if (kcls < 0) return; /* a head without keys in this launch (the whole block returns) */
    const long long sb = p.k_rs * p.kvt.rows[kcls]; /* elements per batch entry */
    const long long off = p.kvt.at[kcls] + b * sb + p.kvt.slot[blockIdx.y] * Cfg::head_dim;
    kg = static_cast<const uint16_t *>(p.k) + off;
    vg = static_cast<const uint16_t *>(p.v) + off + static_cast<long long>(gridDim.z) * sb;
  } else {
    const int kvh = h / p.kv_group;
    const long long kpos = a + j + kt0 * bk.r - p.kv_row_lo;
    kg = static_cast<const uint16_t *>(p.k) + b * p.k_sb + kvh * p.k_sh + kpos * p.k_sn;
    vg = static_cast<const uint16_t *>(p.v) + b * p.v_sb + kvh * p.v_sh + kpos * p.v_sn;
  }
  const long long q_rs = bk.r * p.q_sn;
  const long long k_rs = p.k_rs;
  const long long v_rs = p.v_rs;

  unsigned char *smem = dynamic_smem();
  unsigned char *sq = smem;
  unsigned char *sk = smem + T::Q_BYTES;
  unsigned char *sv = sk + T::STAGES * T::KV_BYTES;

  /* Causal: keys t' <= t, so the last tile visited is the one holding the block's last row. */
  const int q_end = qt1 < t0 + T::BM ? qt1 : t0 + T::BM;
  const int n_end = Cfg::causal ? (nk < q_end - kt0 ? nk : q_end - kt0) : nk;
  const int ntiles = n_end > 0 ? (n_end + T::BN - 1) / T::BN : 0;

  /* Prologue: Q with K/V tile 0 in group 0, tiles 1 .. AHEAD-1 in their own groups. */
  fwd_detail::load_tile<T, T::BM>(sq, qg, q_rs, t0, qt1, tid);
#pragma unroll
  for (int s = 0; s < T::AHEAD; ++s) {
    if (s < ntiles) {
      fwd_detail::load_tile<T, T::BN>(sk + s * T::KV_BYTES, kg, k_rs, s * T::BN, nk, tid);
      fwd_detail::load_tile<T, T::BN>(sv + s * T::KV_BYTES, vg, v_rs, s * T::BN, nk, tid);
    }
    cp_async_commit();
  }

  /* A negative scale is folded into Q's sign (mma.sync) or S's (wgmma), so the softmax below
   * needs sl2 >= 0. */
  const bool qneg = p.scale_log2 < 0.f;
  const uint32_t qflip = qneg ? 0x80008000u : 0u;
  const float sl2 = p.scale_log2 < 0.f ? -p.scale_log2 : p.scale_log2;

  float acc[T::DT][4];
#pragma unroll
  for (int dt = 0; dt < T::DT; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;
  float m[2] = {fwd_detail::neg_inf(), fwd_detail::neg_inf()};
  float l[2] = {0.f, 0.f};
  uint32_t qf[T::Q_IN_REGS ? T::KS : 1][4];

  const int wrow0 = t0 + 16 * warp; /* this warp's first grid row */
  const int wrel = wrow0 - kt0;     /* the same, in key index space (causal masking) */
  /* Skips and masks are decided per group of rows that computes together: a warp (mma.sync)
   * or a warpgroup (wgmma). */
  const int grow0 = t0 + T::GROUP_ROWS * (16 * warp / T::GROUP_ROWS);
  const int grel = grow0 - kt0;
  const bool group_live = grow0 < qt1; /* the group has query rows */
  /* ldmatrix x4: lanes 8i..8i+7 address the rows of matrix i (see ptx.cuh). */
  const int mi = lane >> 3;
  const int mr = lane & 7;
  fwd_detail::LaneOfs<T::CHUNKS> qo, ko, vo;
  qo.init(16 * warp + (mi & 1) * 8 + mr, mi >> 1); /* A: rows 0-7/8-15, k 0-7/8-15 */
  ko.init((mi >> 1) * 8 + mr, mi & 1);             /* B of two n-tiles: keys, k halves */
  vo.init((mi & 1) * 8 + mr, mi >> 1);             /* B (trans): keys 0-7/8-15, d tiles */

  if constexpr (T::WG) {
    tile::require_atom_alignment(smem);
  }
  fwd_detail::PendingPV<Cfg> pv = {}; /* overlap: the warpgroup's P V product not yet issued */

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<T::AHEAD - 1>();
    if constexpr (T::WG) fence_proxy_async_smem(); /* wgmma reads through the async proxy */
    sync_threads(); /* tile `it` landed; every warp is done with tile it-1's stage */
    if constexpr (T::Q_IN_REGS) {
      if (it == 0) {
#pragma unroll
        for (int ks = 0; ks < T::KS; ++ks) {
          ldmatrix_x4(qf[ks], sq + qo.at(ks, 0));
          qf[ks][0] ^= qflip;
          qf[ks][1] ^= qflip;
          qf[ks][2] ^= qflip;
          qf[ks][3] ^= qflip;
        }
      }
    }
    const int nxt = it + T::AHEAD;
    if (nxt < ntiles) {
      const int st = nxt % T::STAGES;
      fwd_detail::load_tile<T, T::BN>(sk + st * T::KV_BYTES, kg, k_rs, nxt * T::BN, nk, tid);
      fwd_detail::load_tile<T, T::BN>(sv + st * T::KV_BYTES, vg, v_rs, nxt * T::BN, nk, tid);
    }
    cp_async_commit();

    const int n0 = it * T::BN;
    /* Group-uniform skips: rows all past the grid end, or (causal) keys all in the future. */
    if (!group_live) continue;
    if (Cfg::causal && n0 > grel + T::GROUP_ROWS - 1) {
      /* So are all later tiles: finish the last one's P V before its stage is loaded over. */
      if constexpr (T::OVL) fwd_detail::flush_pending_pv<Cfg>(acc, pv);
      continue;
    }
    const int st = it % T::STAGES;
    const unsigned char *skt = sk + st * T::KV_BYTES;
    const unsigned char *svt = sv + st * T::KV_BYTES;
    const bool need_mask = n0 + T::BN > nk || (Cfg::causal && n0 + T::BN - 1 > grel);
    if constexpr (T::OVL) {
      const uint32_t sqg = smem_addr(sq) + tile::wgmma_group_offset(warp);
      fwd_detail::tile_step_wg_overlap_any<Cfg>(need_mask, sqg, smem_addr(skt), smem_addr(svt),
                                                qneg, sl2, n0, nk, wrel, acc, m, l, pv);
    } else if constexpr (T::WG) {
      const uint32_t sqg = smem_addr(sq) + tile::wgmma_group_offset(warp);
      if (need_mask) {
        fwd_detail::tile_step_wg<Cfg, true>(sqg, smem_addr(skt), smem_addr(svt), qneg, sl2, n0,
                                            nk, wrel, acc, m, l);
      } else {
        fwd_detail::tile_step_wg<Cfg, false>(sqg, smem_addr(skt), smem_addr(svt), qneg, sl2, n0,
                                             nk, wrel, acc, m, l);
      }
    } else if (need_mask) {
      fwd_detail::tile_step<Cfg, true>(sq, skt, svt, qf, qo, ko, vo, qflip, sl2, n0, nk, wrel,
                                       acc, m, l);
    } else {
      fwd_detail::tile_step<Cfg, false>(sq, skt, svt, qf, qo, ko, vo, qflip, sl2, n0, nk, wrel,
                                        acc, m, l);
    }
  }
  if constexpr (T::OVL) fwd_detail::flush_pending_pv<Cfg>(acc, pv);

  fwd_detail::epilogue<Cfg>(p, bk, smem, acc, m, l);
}

}  // namespace rda

#endif
