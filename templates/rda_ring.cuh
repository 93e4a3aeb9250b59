/* rda_ring.cuh — the ring's two data-movement kernels (runtime/ring_rows.c launches them):
 * ring_pack copies a transfer's dilated K/V rows into a compact block before it is sent, and
 * ring_add adds a returned compact fp32 dK/dV block into the owner's accumulators, each for every
 * transfer (entry) of a launch at once (rda_ring_rows_launch, rda_params.h; blockIdx.y is the
 * entry). Grid-stride loops, 16-byte vectors, 64-bit index math, no shared memory; neither kernel
 * depends on the storage dtype. */
#ifndef RDA_RING_CUH
#define RDA_RING_CUH

#include "rda_tile.cuh"

namespace rda {
namespace ring_detail {

using tile::f32x4;
using tile::first_index;
using tile::grid_stride;
using tile::u32x4;

/* Where vector i (of batch * rows * nkv * head_dim / 8, head_dim / 8 fastest) of entry e
 * lives: its element offset in the K block (the V block is the same offset one K block on),
 * and the element offsets of its source/destination row in K and in V. */
struct row_at {
  long long blk, k, v;
};

__device__ __forceinline__ row_at locate(const rda_ring_rows_launch &p,
                                         const rda_ring_rows_entry &x, long long i) {
  const long long c8 = p.head_dim / 8;
  long long unit = i / c8;
  const long long c = i - unit * c8;
  const long long e = unit % x.nkv; /* kv slot within this entry */
  unit /= x.nkv;
  const long long t = unit % x.rows; /* block row */
  const long long b = unit / x.rows;
  /* Block row t of range 1 starts after the count[0] rows of range 0. */
  const bool second = x.nranges > 1 && t >= x.count[0];
  const long long lr =
      second ? x.first[1] + (t - x.count[0]) * p.stride : x.first[0] + t * p.stride;
  const long long h = p.kv[x.kv0 + e];
  row_at at;
  at.blk = x.blk + ((b * x.rows + t) * x.nkv_total + x.slot0 + e) * p.head_dim + 8 * c;
  at.k = b * p.k_sb + lr * p.k_sn + h * p.k_sh + 8 * c;
  at.v = b * p.v_sb + lr * p.v_sn + h * p.v_sh + 8 * c;
  return at;
}

/* Elements of one half (K or V) of entry x's block, and the vectors entry x moves. */
__device__ __forceinline__ long long half_block(const rda_ring_rows_launch &p,
                                                const rda_ring_rows_entry &x) {
  return p.batch * x.rows * x.nkv_total * p.head_dim;
}
__device__ __forceinline__ long long vectors(const rda_ring_rows_launch &p,
                                             const rda_ring_rows_entry &x) {
  return p.batch * x.rows * x.nkv * (p.head_dim / 8);
}

__device__ __forceinline__ f32x4 add4(f32x4 a, f32x4 b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
  return a;
}

}  // namespace ring_detail

/* Each entry's block [2][batch][rows][nkv_total][head_dim] (16-bit) at slots [slot0, slot0 +
 * nkv) = its transfer's rows of k and v (16-bit, strides k_s*, v_s*; rows 16-byte aligned).
 * Bits are copied, so bf16 and fp16 alike. Cfg: threads (block size). */
template <class Cfg>
__device__ __forceinline__ void ring_pack_kernel(const rda_ring_rows_launch &p) {
  using ring_detail::u32x4;
  const rda_ring_rows_entry &x = p.e[blockIdx.y];
  const long long total = ring_detail::vectors(p, x);
  const long long vblock = ring_detail::half_block(p, x);
  const long long step = ring_detail::grid_stride<Cfg::threads>();
  const uint16_t *k = static_cast<const uint16_t *>(p.k);
  const uint16_t *v = static_cast<const uint16_t *>(p.v);
  uint16_t *blk = static_cast<uint16_t *>(p.block);
  for (long long i = ring_detail::first_index<Cfg::threads>(); i < total; i += step) {
    const ring_detail::row_at at = ring_detail::locate(p, x, i);
    const u32x4 kx = *reinterpret_cast<const u32x4 *>(k + at.k);
    const u32x4 vx = *reinterpret_cast<const u32x4 *>(v + at.v);
    *reinterpret_cast<u32x4 *>(blk + at.blk) = kx;
    *reinterpret_cast<u32x4 *>(blk + vblock + at.blk) = vx;
  }
}

/* Each entry's transfer rows of k and v (fp32 dK/dV accumulators, strides k_s*, v_s*; rows
 * 16-byte aligned) += its block [2][batch][rows][nkv_total][head_dim] (fp32) at slots [slot0,
 * slot0 + nkv). Each destination element is read and written by one thread only, so no two
 * entries (and no two rows of one) may share an element. Cfg: threads (block size). */
template <class Cfg>
__device__ __forceinline__ void ring_add_kernel(const rda_ring_rows_launch &p) {
  using ring_detail::add4;
  using ring_detail::f32x4;
  const rda_ring_rows_entry &x = p.e[blockIdx.y];
  const long long total = ring_detail::vectors(p, x);
  const long long vblock = ring_detail::half_block(p, x);
  const long long step = ring_detail::grid_stride<Cfg::threads>();
  float *k = static_cast<float *>(p.k);
  float *v = static_cast<float *>(p.v);
  const float *blk = static_cast<const float *>(p.block);
  for (long long i = ring_detail::first_index<Cfg::threads>(); i < total; i += step) {
    const ring_detail::row_at at = ring_detail::locate(p, x, i);
    const f32x4 *bk = reinterpret_cast<const f32x4 *>(blk + at.blk);
    const f32x4 *bv = reinterpret_cast<const f32x4 *>(blk + vblock + at.blk);
    f32x4 *dk = reinterpret_cast<f32x4 *>(k + at.k);
    f32x4 *dv = reinterpret_cast<f32x4 *>(v + at.v);
    /* All loads first, so the eight 16-byte transfers are in flight together. */
    const f32x4 bk0 = bk[0], bk1 = bk[1], bv0 = bv[0], bv1 = bv[1];
    const f32x4 k0 = dk[0], k1 = dk[1], v0 = dv[0], v1 = dv[1];
    dk[0] = add4(k0, bk0);
    dk[1] = add4(k1, bk1);
    dv[0] = add4(v0, bv0);
    dv[1] = add4(v1, bv1);
  }
}

}  // namespace rda

#endif
