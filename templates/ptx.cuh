/* ptx.cuh — every inline-PTX instruction rda's kernels use, as small wrappers with two
 * implementations: native (NVRTC, sm_80+) and emulated (RDA_EMU, host C++, built on
 * emu/emu_api.h). No other template contains asm. Fragment layouts are those of the PTX ISA:
 *   ldmatrix .m8n8 .b16: lanes 8i..8i+7 give the row addresses of matrix i; lane L receives
 *     row L/4, columns 2(L%4), 2(L%4)+1 (with .trans: column L/4, rows 2(L%4), 2(L%4)+1).
 *   mma .m16n8k16 (g = L/4, c = L%4):
 *     A (row-major 16x16): a[0] = A[g][2c..], a[1] = A[g+8][2c..], a[2] = A[g][2c+8..],
 *                          a[3] = A[g+8][2c+8..]
 *     B (col-major 16x8):  b[0] = B[2c..][g], b[1] = B[2c+8..][g]
 *     C, D (16x8 fp32):    d[0..1] = D[g][2c, 2c+1], d[2..3] = D[g+8][2c, 2c+1]
 *   Each 32-bit register holds two 16-bit values, the lower column (or row) in the low half. */
#ifndef RDA_PTX_CUH
#define RDA_PTX_CUH

#include "rda_device.cuh"

namespace rda {

#if !defined(RDA_EMU)
/* ------------------------------------------------------------------ native (NVRTC) */

__device__ __forceinline__ unsigned char *dynamic_smem() {
  extern __shared__ __align__(128) unsigned char rda_dynamic_smem_[];
  return rda_dynamic_smem_;
}

__device__ __forceinline__ void sync_threads() { __syncthreads(); }

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }

__device__ __forceinline__ void cp_async_16(void *smem_dst, const void *gmem_src, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem_row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *smem_row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

/* d = a * b + c, bf16 inputs, fp32 accumulate (d may alias c). */
__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2],
                                               const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ void mma_f16_16816(float d[4], const uint32_t a[4], const uint32_t b[2],
                                              const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ float shfl_xor(float v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}

/* 2^x, approximate (ex2.approx.ftz: ~2 ulp, subnormals flushed). */
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* Two floats to a bf16x2 / f16x2 register, round to nearest even; lo in the low half. */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float f16_to_float(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
  return f;
}

#else
/* ------------------------------------------------------------------ emulated (host C++) */

inline unsigned char *dynamic_smem() { return rda_emu::dynamic_smem(); }

inline void sync_threads() { rda_emu::block_barrier(); }

inline int lane_id() { return rda_emu::lane(); }

inline void cp_async_16(void *smem_dst, const void *gmem_src, bool valid) {
  rda_emu::cp_async_16(smem_dst, gmem_src, valid);
}

inline void cp_async_commit() { rda_emu::cp_async_commit(); }

template <int N>
inline void cp_async_wait() {
  rda_emu::cp_async_wait(N);
}

namespace emu_detail {

inline uint16_t load_u16(const void *p) {
  uint16_t v;
  memcpy(&v, p, sizeof v);
  return v;
}

template <bool Trans>
inline void ldmatrix_x4(uint32_t r[4], const void *smem_row) {
  const unsigned char *slots = rda_emu::warp_gather(&smem_row, sizeof smem_row);
  const int l = rda_emu::lane();
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    const void *row_a, *row_b;
    if (!Trans) {
      memcpy(&row_a, slots + (8 * i + l / 4) * rda_emu::kGatherSlot, sizeof row_a);
      lo = load_u16(static_cast<const unsigned char *>(row_a) + 2 * (2 * (l % 4)));
      hi = load_u16(static_cast<const unsigned char *>(row_a) + 2 * (2 * (l % 4) + 1));
    } else {
      memcpy(&row_a, slots + (8 * i + 2 * (l % 4)) * rda_emu::kGatherSlot, sizeof row_a);
      memcpy(&row_b, slots + (8 * i + 2 * (l % 4) + 1) * rda_emu::kGatherSlot, sizeof row_b);
      lo = load_u16(static_cast<const unsigned char *>(row_a) + 2 * (l / 4));
      hi = load_u16(static_cast<const unsigned char *>(row_b) + 2 * (l / 4));
    }
    r[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
}

inline float bf16_bits_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

inline float f16_bits_to_float(uint16_t h) {
  _Float16 x;
  memcpy(&x, &h, sizeof x);
  return static_cast<float>(x);
}

/* The 16-bit element of a 16x16 A fragment (row-major) or 16x8 B fragment (col-major)
 * held by the warp, read from the gathered registers of all 32 lanes. */
struct MmaIn {
  uint32_t a[4];
  uint32_t b[2];
};

inline uint16_t half_of(uint32_t reg, int hi) {
  return static_cast<uint16_t>(hi ? reg >> 16 : reg & 0xffffu);
}

template <bool Bf16>
inline void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  MmaIn mine;
  memcpy(mine.a, a, sizeof mine.a);
  memcpy(mine.b, b, sizeof mine.b);
  const unsigned char *slots = rda_emu::warp_gather(&mine, sizeof mine);
  MmaIn all[32];
  for (int i = 0; i < 32; ++i) memcpy(&all[i], slots + i * rda_emu::kGatherSlot, sizeof all[i]);
  const auto to_float = [](uint16_t h) { return Bf16 ? bf16_bits_to_float(h) : f16_bits_to_float(h); };
  const int l = rda_emu::lane();
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = l / 4 + 8 * (e / 2);
    const int col = 2 * (l % 4) + (e % 2);
    float acc = c[e];
    for (int k = 0; k < 16; ++k) {
      /* A[row][k]: lane (row%8)*4 + (k%8)/2, register (row/8) + 2*(k/8), half k%2. */
      const uint16_t av = half_of(all[(row % 8) * 4 + (k % 8) / 2].a[row / 8 + 2 * (k / 8)], k % 2);
      /* B[k][col]: lane col*4 + (k%8)/2, register k/8, half k%2. */
      const uint16_t bv = half_of(all[col * 4 + (k % 8) / 2].b[k / 8], k % 2);
      acc += to_float(av) * to_float(bv);
    }
    out[e] = acc;
  }
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u); /* NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline uint16_t float_to_f16_bits(float f) {
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  memcpy(&h, &x, sizeof h);
  return h;
}

}  // namespace emu_detail

inline void ldmatrix_x4(uint32_t r[4], const void *smem_row) {
  emu_detail::ldmatrix_x4<false>(r, smem_row);
}

inline void ldmatrix_x4_trans(uint32_t r[4], const void *smem_row) {
  emu_detail::ldmatrix_x4<true>(r, smem_row);
}

inline void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  emu_detail::mma_16816<true>(d, a, b, c);
}

inline void mma_f16_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  emu_detail::mma_16816<false>(d, a, b, c);
}

inline float shfl_xor(float v, int lane_mask) {
  const unsigned char *slots = rda_emu::warp_gather(&v, sizeof v);
  float r;
  memcpy(&r, slots + (rda_emu::lane() ^ lane_mask) * rda_emu::kGatherSlot, sizeof r);
  return r;
}

inline float ex2(float x) { return exp2f(x); }

inline uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(emu_detail::float_to_bf16_bits(lo)) |
         (static_cast<uint32_t>(emu_detail::float_to_bf16_bits(hi)) << 16);
}

inline uint32_t pack_f16x2(float lo, float hi) {
  return static_cast<uint32_t>(emu_detail::float_to_f16_bits(lo)) |
         (static_cast<uint32_t>(emu_detail::float_to_f16_bits(hi)) << 16);
}

inline float f16_to_float(uint16_t h) { return emu_detail::f16_bits_to_float(h); }

#endif

/* bf16 widens to fp32 exactly by a shift; plain C on both sides. */
__device__ __forceinline__ float bf16_to_float(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

}  // namespace rda

#endif
