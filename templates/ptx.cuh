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

/* 1024-byte aligned: wgmma's 128-byte swizzle atoms are addressed by their shared address. */
__device__ __forceinline__ unsigned char *dynamic_smem() {
  extern __shared__ __align__(1024) unsigned char rda_dynamic_smem_[];
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

/* *p += v in global memory, atomically, result unused (compiles to red.global.add.f32). */
__device__ __forceinline__ void atomic_add_f32(float *p, float v) { atomicAdd(p, v); }

/* ------------------------------------------------------------------ wgmma (sm_90a only) */
/* The bodies exist only where NVRTC compiles for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere
 * they trap. The planner gives wgmma variants to sm_90 alone, compiled as sm_90a. */

#define RDA_WG_REGS32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define RDA_WG_REGS64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define RDA_WG_ACC4(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* Makes this thread's generic-proxy writes to shared memory (cp.async, plain stores) visible
 * to the async proxy that wgmma reads its shared operands through; a barrier must follow. */
__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

/* Orders this warpgroup's accesses to the accumulator and A-fragment registers before the
 * wgmma that follow (PTX ISA: wgmma.fence). Shared memory that wgmma reads is ordered by
 * fence.proxy.async after the writes, not by this. */
__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

/* Closes the group of wgmma issued since the last commit. */
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

/* Waits until at most N committed groups are pending; their accumulators are then final. */
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
  __trap();
#endif
}

/* Keeps the compiler from moving accesses of an accumulator, or of register A fragments, across
 * a wgmma fence or wait. */
template <int NT>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
    asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3]));
}

template <int NT>
__device__ __forceinline__ void wgmma_fence_operands(uint32_t (&a)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
    asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3]));
}

/* x, hidden from the optimizer: a check of a value it believes it knows (the alignment of
 * dynamic shared memory, from its declaration) is then really made. */
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  asm volatile("" : "+r"(x));
  return x;
}

/* D (64 x N, fp32) = A (64 x 16) B (16 x N) + (accumulate ? D : 0) over one warpgroup, A and B
 * from shared memory through descriptors. A is K-major; B is K-major, or MN-major when TransB.
 * d[i][e]: warp w of the group holds rows 16w + g (e = 0, 1) and 16w + g + 8 (e = 2, 3),
 * columns 8i + 2c + (e & 1) (g = lane / 4, c = lane % 4), the mma.m16n8 C layout per 8 columns.
 * Asynchronous: issue after wgmma_fence, then wgmma_commit and wgmma_wait before reading d. */
template <int N, int Dtype, bool TransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t adesc, uint64_t bdesc,
                                         bool accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_ss: N is 64 or 128");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const uint32_t scale_d = accumulate ? 1u : 0u;
  if constexpr (N == 64) {
    if constexpr (Dtype == RDA_DTYPE_BF16) {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
          RDA_WG_REGS32 ", %32, %33, p, 1, 1, 0, %35;\n}\n"
          : RDA_WG_ACC4(0), RDA_WG_ACC4(1), RDA_WG_ACC4(2), RDA_WG_ACC4(3), RDA_WG_ACC4(4), RDA_WG_ACC4(5), RDA_WG_ACC4(6), RDA_WG_ACC4(7)
          : "l"(adesc), "l"(bdesc), "r"(scale_d), "n"(TransB ? 1 : 0));
    } else {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
          RDA_WG_REGS32 ", %32, %33, p, 1, 1, 0, %35;\n}\n"
          : RDA_WG_ACC4(0), RDA_WG_ACC4(1), RDA_WG_ACC4(2), RDA_WG_ACC4(3), RDA_WG_ACC4(4), RDA_WG_ACC4(5), RDA_WG_ACC4(6), RDA_WG_ACC4(7)
          : "l"(adesc), "l"(bdesc), "r"(scale_d), "n"(TransB ? 1 : 0));
    }
  } else {
    if constexpr (Dtype == RDA_DTYPE_BF16) {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
          RDA_WG_REGS64 ", %64, %65, p, 1, 1, 0, %67;\n}\n"
          : RDA_WG_ACC4(0), RDA_WG_ACC4(1), RDA_WG_ACC4(2), RDA_WG_ACC4(3), RDA_WG_ACC4(4), RDA_WG_ACC4(5), RDA_WG_ACC4(6), RDA_WG_ACC4(7), RDA_WG_ACC4(8), RDA_WG_ACC4(9), RDA_WG_ACC4(10), RDA_WG_ACC4(11), RDA_WG_ACC4(12), RDA_WG_ACC4(13), RDA_WG_ACC4(14), RDA_WG_ACC4(15)
          : "l"(adesc), "l"(bdesc), "r"(scale_d), "n"(TransB ? 1 : 0));
    } else {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
          RDA_WG_REGS64 ", %64, %65, p, 1, 1, 0, %67;\n}\n"
          : RDA_WG_ACC4(0), RDA_WG_ACC4(1), RDA_WG_ACC4(2), RDA_WG_ACC4(3), RDA_WG_ACC4(4), RDA_WG_ACC4(5), RDA_WG_ACC4(6), RDA_WG_ACC4(7), RDA_WG_ACC4(8), RDA_WG_ACC4(9), RDA_WG_ACC4(10), RDA_WG_ACC4(11), RDA_WG_ACC4(12), RDA_WG_ACC4(13), RDA_WG_ACC4(14), RDA_WG_ACC4(15)
          : "l"(adesc), "l"(bdesc), "r"(scale_d), "n"(TransB ? 1 : 0));
    }
  }
#else
  static_assert(N < 0, "wgmma_ss needs sm_90a: a wgmma variant must be compiled for sm_90a");
#endif
}

/* The same with A from registers: a[] is warp w's 16 x 16 slice (rows 16w..16w+15) in the
 * mma.m16n8k16 A fragment layout (the layout of an accumulator pair packed by pack_a). */
template <int N, int Dtype, bool TransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t a[4], uint64_t bdesc,
                                         bool accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_rs: N is 64 or 128");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const uint32_t scale_d = accumulate ? 1u : 0u;
  if constexpr (N == 64) {
    if constexpr (Dtype == RDA_DTYPE_BF16) {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
          RDA_WG_REGS32 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
          : RDA_WG_ACC4(0), RDA_WG_ACC4(1), RDA_WG_ACC4(2), RDA_WG_ACC4(3), RDA_WG_ACC4(4), RDA_WG_ACC4(5), RDA_WG_ACC4(6), RDA_WG_ACC4(7)
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(scale_d),
            "n"(TransB ? 1 : 0));
    } else {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
          RDA_WG_REGS32 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
          : RDA_WG_ACC4(0), RDA_WG_ACC4(1), RDA_WG_ACC4(2), RDA_WG_ACC4(3), RDA_WG_ACC4(4), RDA_WG_ACC4(5), RDA_WG_ACC4(6), RDA_WG_ACC4(7)
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(scale_d),
            "n"(TransB ? 1 : 0));
    }
  } else {
    if constexpr (Dtype == RDA_DTYPE_BF16) {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
          RDA_WG_REGS64 ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
          : RDA_WG_ACC4(0), RDA_WG_ACC4(1), RDA_WG_ACC4(2), RDA_WG_ACC4(3), RDA_WG_ACC4(4), RDA_WG_ACC4(5), RDA_WG_ACC4(6), RDA_WG_ACC4(7), RDA_WG_ACC4(8), RDA_WG_ACC4(9), RDA_WG_ACC4(10), RDA_WG_ACC4(11), RDA_WG_ACC4(12), RDA_WG_ACC4(13), RDA_WG_ACC4(14), RDA_WG_ACC4(15)
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(scale_d),
            "n"(TransB ? 1 : 0));
    } else {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
          RDA_WG_REGS64 ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
          : RDA_WG_ACC4(0), RDA_WG_ACC4(1), RDA_WG_ACC4(2), RDA_WG_ACC4(3), RDA_WG_ACC4(4), RDA_WG_ACC4(5), RDA_WG_ACC4(6), RDA_WG_ACC4(7), RDA_WG_ACC4(8), RDA_WG_ACC4(9), RDA_WG_ACC4(10), RDA_WG_ACC4(11), RDA_WG_ACC4(12), RDA_WG_ACC4(13), RDA_WG_ACC4(14), RDA_WG_ACC4(15)
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(scale_d),
            "n"(TransB ? 1 : 0));
    }
  }
#else
  static_assert(N < 0, "wgmma_rs needs sm_90a: a wgmma variant must be compiled for sm_90a");
#endif
}

#undef RDA_WG_ACC4
#undef RDA_WG_REGS32
#undef RDA_WG_REGS64

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

/* IEEE half to float by bits, branch-free (no libgcc call): normals and inf/NaN by moving the
 * exponent (rebias 15 -> 127, twice as far for exponent 31), subnormals as m * 2^-24 (exact). */
inline float f16_bits_to_float(uint16_t h) {
  const uint32_t mag = h & 0x7fffu;
  const uint32_t moved = (mag << 13) + 0x38000000u;
  const float sub = static_cast<float>(mag) * 0x1p-24f;
  uint32_t sub_bits;
  memcpy(&sub_bits, &sub, sizeof sub_bits);
  uint32_t u = mag < 0x400u ? sub_bits : mag >= 0x7c00u ? moved + 0x38000000u : moved;
  u |= static_cast<uint32_t>(h & 0x8000u) << 16;
  float r;
  memcpy(&r, &u, sizeof r);
  return r;
}

template <bool Bf16>
inline float half_bits_to_float(uint32_t h) {
  return Bf16 ? bf16_bits_to_float(static_cast<uint16_t>(h))
              : f16_bits_to_float(static_cast<uint16_t>(h));
}

/* What each lane deposits for an mma: its A and B fragments, already widened to fp32 (each
 * value converted once per warp): a[2r + h] is half h (0 low, 1 high) of register r. */
struct MmaIn {
  float a[8];
  float b[4];
};

/* Lane l = 4g + t computes D[g][2t..2t+1] and D[g+8][2t..2t+1]. Rows g and g+8 of A are held by
 * lanes 4g..4g+3 (lane 4g+q: a[0]/a[1] = columns 2q, 2q+1 of row g / g+8, a[2]/a[3] the same
 * columns + 8); column n of B by lanes 4n..4n+3 (lane 4n+q: b[0] = rows 2q, 2q+1, b[1] = rows
 * 2q+8, 2q+9). Products are exact in fp32; the sum runs in k order starting from c. */
template <bool Bf16>
inline void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  typedef float v4 __attribute__((vector_size(16)));
  MmaIn mine;
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < 4; ++r)
      mine.a[2 * r + h] = half_bits_to_float<Bf16>((a[r] >> (16 * h)) & 0xffffu);
    for (int r = 0; r < 2; ++r)
      mine.b[2 * r + h] = half_bits_to_float<Bf16>((b[r] >> (16 * h)) & 0xffffu);
  }
  const unsigned char *slots = rda_emu::warp_gather(&mine, sizeof mine);
  const int l = rda_emu::lane();
  const int g = l / 4, t = l % 4;
  /* ak[k] = (A[g][k], A[g][k], A[g+8][k], A[g+8][k]), bk[k] = (B[k][2t], B[k][2t+1], B[k][2t],
   * B[k][2t+1]): the four outputs advance together, each summed in k order like a scalar loop. */
  v4 ak[16], bk[16];
  for (int q = 0; q < 4; ++q) {
    MmaIn ra, rb0, rb1;
    memcpy(&ra, slots + (4 * g + q) * rda_emu::kGatherSlot, sizeof ra);
    memcpy(&rb0, slots + (4 * (2 * t) + q) * rda_emu::kGatherSlot, sizeof rb0);
    memcpy(&rb1, slots + (4 * (2 * t + 1) + q) * rda_emu::kGatherSlot, sizeof rb1);
    for (int h = 0; h < 2; ++h) {
      const int k = 2 * q + h;
      ak[k] = v4{ra.a[0 + h], ra.a[0 + h], ra.a[2 + h], ra.a[2 + h]};
      ak[k + 8] = v4{ra.a[4 + h], ra.a[4 + h], ra.a[6 + h], ra.a[6 + h]};
      bk[k] = v4{rb0.b[0 + h], rb1.b[0 + h], rb0.b[0 + h], rb1.b[0 + h]};
      bk[k + 8] = v4{rb0.b[2 + h], rb1.b[2 + h], rb0.b[2 + h], rb1.b[2 + h]};
    }
  }
  v4 acc = v4{c[0], c[1], c[2], c[3]};
  for (int k = 0; k < 16; ++k) acc += ak[k] * bk[k];
  for (int e = 0; e < 4; ++e) d[e] = acc[e];
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u); /* NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

/* Float to IEEE half, round to nearest even, by integer arithmetic (portable: g++ has no
 * _Float16 in C++ on every target): overflow to inf, subnormals, NaN stays NaN. */
inline uint16_t float_to_f16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u); /* >= 65520: inf */
  if (a >= 0x38800000u) {                                               /* normal: >= 2^-14 */
    uint32_t r = a - 0x38000000u;                                       /* exponent 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (a < 0x33000000u) return static_cast<uint16_t>(sign); /* <= 2^-25 (a tie) rounds to 0 */
  const uint32_t shift = 126u - (a >> 23);                  /* units of 2^-24: 14..24 */
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u) != 0)) ++r;
  return static_cast<uint16_t>(sign | r);
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

/* ex2.approx.ftz: subnormal inputs act as zero (exp2f gives 1 for them anyway) and results
 * below 2^-126 flush to +0, as on the GPU. */
inline float ex2(float x) {
  const float y = exp2f(x);
  return y < 0x1p-126f ? 0.0f : y;
}

inline uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(emu_detail::float_to_bf16_bits(lo)) |
         (static_cast<uint32_t>(emu_detail::float_to_bf16_bits(hi)) << 16);
}

inline uint32_t pack_f16x2(float lo, float hi) {
  return static_cast<uint32_t>(emu_detail::float_to_f16_bits(lo)) |
         (static_cast<uint32_t>(emu_detail::float_to_f16_bits(hi)) << 16);
}

inline float f16_to_float(uint16_t h) { return emu_detail::f16_bits_to_float(h); }

/* Blocks run on several OS threads: a compare-and-swap loop, one fp32 add (round to nearest). */
inline void atomic_add_f32(float *p, float v) {
  uint32_t *u = reinterpret_cast<uint32_t *>(p);
  uint32_t old = __atomic_load_n(u, __ATOMIC_RELAXED);
  for (;;) {
    float f;
    memcpy(&f, &old, sizeof f);
    f += v;
    uint32_t nu;
    memcpy(&nu, &f, sizeof nu);
    if (__atomic_compare_exchange_n(u, &old, nu, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
  }
}

/* ------------------------------------------------------------------ wgmma, emulated */
/* emu/wgmma_emu.h models the instructions from the PTX ISA: descriptors decoded into addresses
 * of the block's shared memory, swizzles, and asynchrony (an mma runs at the wait that
 * completes its group, reading shared memory then). */

}  // namespace rda
#include "emu/wgmma_emu.h"
namespace rda {

inline uint32_t smem_addr(const void *p) { return rda_emu::wgmma::smem_addr(p); }

inline void fence_proxy_async_smem() { rda_emu::wgmma::fence_proxy_async(); }

inline void wgmma_fence() { rda_emu::wgmma::fence(); }

inline void wgmma_commit() { rda_emu::wgmma::commit(); }

template <int N>
inline void wgmma_wait() {
  rda_emu::wgmma::wait(N);
}

template <int NT>
inline void wgmma_fence_operands(float (&d)[NT][4]) {
  (void)d;
}

template <int NT>
inline void wgmma_fence_operands(uint32_t (&a)[NT][4]) {
  (void)a;
}

inline uint32_t opaque(uint32_t x) { return x; }

template <int N, int Dtype, bool TransB>
inline void wgmma_ss(float (&d)[N / 8][4], uint64_t adesc, uint64_t bdesc, bool accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_ss: N is 64 or 128");
  rda_emu::wgmma::mma_ss(&d[0][0], N, adesc, bdesc, accumulate, Dtype == RDA_DTYPE_BF16, TransB);
}

template <int N, int Dtype, bool TransB>
inline void wgmma_rs(float (&d)[N / 8][4], const uint32_t a[4], uint64_t bdesc, bool accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_rs: N is 64 or 128");
  rda_emu::wgmma::mma_rs(&d[0][0], N, a, bdesc, accumulate, Dtype == RDA_DTYPE_BF16, TransB);
}

#endif

/* A shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): the start address,
 * the leading and the stride dimension byte offsets, each >> 4 in 14 bits (bits 0-13, 16-29,
 * 32-45), base offset 0 (bits 49-51: tiles are 1024-byte aligned), the swizzle mode in bits
 * 62-63 (0 none, 1 128-byte, 2 64-byte, 3 32-byte). addr: from smem_addr. */
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                              int swizzle) {
  return static_cast<uint64_t>((addr >> 4) & 0x3fffu) |
         (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3fffu) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3fffu) << 32) |
         (static_cast<uint64_t>(swizzle & 3) << 62);
}

/* bf16 widens to fp32 exactly by a shift; plain C on both sides. */
__device__ __forceinline__ float bf16_to_float(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

}  // namespace rda

#endif
