/* cuda_shim.h — what CUDA C++ device code needs to compile as host C++17 (RDA_EMU): the
 * execution-space keywords, threadIdx/blockIdx/blockDim/gridDim, __syncthreads, a few device
 * built-ins, and RDA_EMU_EXPORT, which wraps a __global__ entry into `<entry>__emu`. */
#ifndef RDA_CUDA_SHIM_H
#define RDA_CUDA_SHIM_H

#if !defined(RDA_EMU) || !defined(__cplusplus)
#error "cuda_shim.h is for kernels compiled by the host C++ compiler with -DRDA_EMU"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "emu_runtime.h" /* first: it declares emu_api.h with default visibility */

/* ------------------------------------------------------------------ keywords */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__
/* A block runs on one OS thread from start to end, so static shared variables can be
 * per-OS-thread statics (they are not poisoned; dynamic shared memory is). */
#define __shared__ static thread_local

/* ------------------------------------------------------------------ the thread's coordinates */

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
};

#define threadIdx (*reinterpret_cast<const uint3 *>(::rda_emu::detail::thread_idx()))
#define blockIdx (*reinterpret_cast<const uint3 *>(::rda_emu::detail::block_idx()))
#define blockDim (*reinterpret_cast<const dim3 *>(::rda_emu::detail::block_dim()))
#define gridDim (*reinterpret_cast<const dim3 *>(::rda_emu::detail::grid_dim()))
constexpr int warpSize = 32;

/* ------------------------------------------------------------------ device built-ins */

inline void __syncthreads() {
  ::rda_emu::block_barrier();
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  ::rda_emu::warp_gather(nullptr, 0);
}
inline void __threadfence() {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
inline void __threadfence_block() {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
[[noreturn]] inline void __trap() {
  ::rda_emu::trap("__trap()");
}

inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}
inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}

inline float __expf(float x) {
  return std::exp(x);
}
inline float __logf(float x) {
  return std::log(x);
}
inline float __fdividef(float a, float b) {
  return a / b;
}
inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
template <typename T>
inline T __ldg(const T *p) {
  return *p;
}

inline int min(int a, int b) {
  return a < b ? a : b;
}
inline int max(int a, int b) {
  return a > b ? a : b;
}
inline unsigned min(unsigned a, unsigned b) {
  return a < b ? a : b;
}
inline unsigned max(unsigned a, unsigned b) {
  return a > b ? a : b;
}
inline long long min(long long a, long long b) {
  return a < b ? a : b;
}
inline long long max(long long a, long long b) {
  return a > b ? a : b;
}
inline float min(float a, float b) {
  return std::fmin(a, b);
}
inline float max(float a, float b) {
  return std::fmax(a, b);
}

/* Warp shuffles over the full warp (the emulator requires all 32 lanes, like mask 0xffffffff). */
namespace rda_emu {
namespace detail {
template <typename T>
inline T shfl_from(T v, int src_lane) {
  static_assert(sizeof(T) <= kGatherSlot, "shuffle of a value wider than a gather slot");
  const unsigned char *slots = warp_gather(&v, sizeof v);
  T r;
  std::memcpy(&r, slots + static_cast<size_t>(src_lane & 31) * kGatherSlot, sizeof r);
  return r;
}
}  // namespace detail
}  // namespace rda_emu

template <typename T>
inline T __shfl_sync(unsigned, T v, int src_lane, int width = 32) {
  const int l = ::rda_emu::lane();
  return ::rda_emu::detail::shfl_from(v, (l & ~(width - 1)) + (src_lane & (width - 1)));
}
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
  const int l = ::rda_emu::lane();
  int src = l ^ lane_mask;
  if ((src & ~(width - 1)) > (l & ~(width - 1))) src = l; /* later groups: own value (CUDA) */
  return ::rda_emu::detail::shfl_from(v, src);
}
template <typename T>
inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int l = ::rda_emu::lane();
  int src = l + static_cast<int>(delta);
  if ((src & ~(width - 1)) != (l & ~(width - 1))) src = l;
  return ::rda_emu::detail::shfl_from(v, src);
}
template <typename T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int l = ::rda_emu::lane();
  int src = l - static_cast<int>(delta);
  if (src < (l & ~(width - 1))) src = l;
  return ::rda_emu::detail::shfl_from(v, src);
}

/* Atomics: blocks run concurrently on several OS threads, so these are real atomics. */
inline int atomicAdd(int *p, int v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned atomicAdd(unsigned *p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline float atomicAdd(float *p, float v) {
  unsigned *u = reinterpret_cast<unsigned *>(p);
  unsigned old = __atomic_load_n(u, __ATOMIC_RELAXED);
  for (;;) {
    const unsigned nu = __float_as_uint(__uint_as_float(old) + v);
    if (__atomic_compare_exchange_n(u, &old, nu, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return __uint_as_float(old);
  }
}
inline int atomicMax(int *p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v &&
         !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}

/* ------------------------------------------------------------------ the exported entry */

/* Defines `extern "C" int <entry>__emu(rda_emu_launch *l, const void *params)`: runs the whole
 * grid of `entry(params_type)` on the CPU; 0 on success, else nonzero with l->err set. */
#define RDA_EMU_EXPORT(entry, params_type)                                                   \
  extern "C" __attribute__((visibility("default"))) int entry##__emu(rda_emu_launch *l,      \
                                                                     const void *params) {   \
    return ::rda_emu::detail::run_launch(l, params, sizeof(params_type), [](const void *p) { \
      entry(*static_cast<const params_type *>(p));                                           \
    });                                                                                      \
  }

#endif
