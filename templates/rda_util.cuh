/* rda_util.cuh — the small kernels around the forward pass: init (o = 0, lse = -inf before the
 * first branch, so rows that no branch covers keep exactly these values) and cast (the fp32
 * accumulator to the storage dtype). Grid-stride loops over 1-D blocks, no shared memory. */
#ifndef RDA_UTIL_CUH
#define RDA_UTIL_CUH

#include "rda_tile.cuh"

namespace rda {
namespace util_detail {

using tile::f32x4;
using tile::first_index;
using tile::grid_stride;
using tile::pack;
using tile::u32x4;

}  // namespace util_detail

/* o [B, N, H, D] fp32 (strides o_sb, o_sn, o_sh; D contiguous, rows 16-byte aligned) = 0;
 * lse [B, H, N] fp32 (strides lse_sb, lse_sh; N contiguous) = -inf. Cfg: threads (block size). */
template <class Cfg>
__device__ __forceinline__ void init_kernel(const rda_init_params &p) {
  using util_detail::f32x4;
  const long long c4 = p.head_dim / 4;
  const long long total_o = p.batch * p.n * p.heads * c4;
  const long long step = util_detail::grid_stride<Cfg::threads>();
  const f32x4 zero = {0.f, 0.f, 0.f, 0.f};
  for (long long i = util_detail::first_index<Cfg::threads>(); i < total_o; i += step) {
    const long long c = i % c4;
    long long rest = i / c4;
    const long long h = rest % p.heads;
    rest /= p.heads;
    const long long n = rest % p.n;
    const long long b = rest / p.n;
    *reinterpret_cast<f32x4 *>(p.o + b * p.o_sb + n * p.o_sn + h * p.o_sh + 4 * c) = zero;
  }
  const long long total_l = p.batch * p.heads * p.n;
  const float ninf = tile::neg_inf();
  for (long long i = util_detail::first_index<Cfg::threads>(); i < total_l; i += step) {
    const long long n = i % p.n;
    const long long rest = i / p.n;
    const long long h = rest % p.heads;
    const long long b = rest / p.heads;
    p.lse[b * p.lse_sb + h * p.lse_sh + n] = ninf;
  }
}

/* out [B, N, H, D] in Cfg::dtype (raw 16-bit storage, strides out_sb, out_sn, out_sh; rows
 * 16-byte aligned) = o rounded to nearest even. Eight elements per thread and step.
 * Cfg: dtype, threads (block size). */
template <class Cfg>
__device__ __forceinline__ void cast_kernel(const rda_cast_params &p) {
  using util_detail::f32x4;
  using util_detail::u32x4;
  const long long c8 = p.head_dim / 8;
  const long long total = p.batch * p.n * p.heads * c8;
  const long long step = util_detail::grid_stride<Cfg::threads>();
  for (long long i = util_detail::first_index<Cfg::threads>(); i < total; i += step) {
    const long long c = i % c8;
    long long rest = i / c8;
    const long long h = rest % p.heads;
    rest /= p.heads;
    const long long n = rest % p.n;
    const long long b = rest / p.n;
    const f32x4 *src =
        reinterpret_cast<const f32x4 *>(p.o + b * p.o_sb + n * p.o_sn + h * p.o_sh + 8 * c);
    const f32x4 lo = src[0];
    const f32x4 hi = src[1];
    u32x4 out;
    out.x = util_detail::pack<Cfg::dtype>(lo.x, lo.y);
    out.y = util_detail::pack<Cfg::dtype>(lo.z, lo.w);
    out.z = util_detail::pack<Cfg::dtype>(hi.x, hi.y);
    out.w = util_detail::pack<Cfg::dtype>(hi.z, hi.w);
    uint16_t *dst = static_cast<uint16_t *>(p.out) + b * p.out_sb + n * p.out_sn + h * p.out_sh;
    *reinterpret_cast<u32x4 *>(dst + 8 * c) = out;
  }
}

}  // namespace rda

#endif
