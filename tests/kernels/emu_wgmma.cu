// emu_wgmma.cu — one kernel that drives rda::wgmma_ss / wgmma_rs with descriptors built by
// rda::smem_desc, for tests/test_emu.c (the emulator's model) and tests/test_cuda.c (the same
// source on an sm_90a GPU). emu_test_params must match the struct in those tests.
#include "ptx.cuh"

struct emu_test_params {
  const void *in0, *in1, *in2;
  void *out0, *out1;
  long long n;
  int op;
  int pad;
};

// in1 (ints): the configuration, then for RS the A fragments.
enum {
  kCfgRs,      // 0: A and B from descriptors (wgmma_ss), 1: A from registers (wgmma_rs)
  kCfgN,       // 64 or 128
  kCfgF16,     // 0 bf16, 1 f16
  kCfgTransB,  // B MN-major
  kCfgAcc,     // scale-d of the first k step (later steps always accumulate)
  kCfgSteps,   // k steps of 16 (at most 8), all in one commit group
  kCfgALbo,    // A: leading dimension byte offset
  kCfgASbo,    //    stride dimension byte offset
  kCfgASwz,    //    swizzle mode (0 none, 1 128B, 2 64B, 3 32B)
  kCfgBLbo,    // B: the same
  kCfgBSbo,
  kCfgBSwz,
  kCfgPeek,         // copy d to out1 after commit, before the wait (emulator only)
  kCfgClobber,      // zero the whole image between commit and wait (emulator only)
  kCfgNoFence,      // skip wgmma_fence (the emulator traps)
  kCfgNoWait,       // exit without wgmma_wait (the emulator traps)
  kCfgRepeat = 31,  // run the fence / k steps / commit / wait sequence this many times (0: 1)
  kCfgAStart = 16,  // [8]: A's start address of k step s (bytes from the 1024-aligned base)
  kCfgBStart = 24,  // [8]: B's
  kCfgInts = 32     // the A fragments start here: [step][thread % 128][4] uint32
};

template <int N, int Dtype, bool TransB>
__device__ void wgmma_body(const emu_test_params &p, unsigned char *base) {
  const int *cfg = static_cast<const int *>(p.in1);
  const uint32_t *afrag = reinterpret_cast<const uint32_t *>(cfg + kCfgInts);
  const int t = threadIdx.x;
  const float *din = static_cast<const float *>(p.in2) + static_cast<long long>(t) * (N / 2);
  float d[N / 8][4];
  for (int i = 0; i < N / 8; ++i)
    for (int e = 0; e < 4; ++e) d[i][e] = din[4 * i + e];
  const uint32_t at = rda::smem_addr(base);
  const int reps = cfg[kCfgRepeat] > 0 ? cfg[kCfgRepeat] : 1;
  for (int r = 0; r < reps; ++r) {
    if (!cfg[kCfgNoFence]) rda::wgmma_fence();
    for (int s = 0; s < cfg[kCfgSteps]; ++s) {
      const bool acc = r > 0 || s > 0 || cfg[kCfgAcc] != 0;
      const uint64_t bdesc =
          rda::smem_desc(at + cfg[kCfgBStart + s], cfg[kCfgBLbo], cfg[kCfgBSbo], cfg[kCfgBSwz]);
      if (cfg[kCfgRs]) {
        const uint32_t *src = afrag + (static_cast<long long>(s) * 128 + t % 128) * 4;
        const uint32_t a[4] = {src[0], src[1], src[2], src[3]};
        rda::wgmma_rs<N, Dtype, TransB>(d, a, bdesc, acc);
      } else {
        const uint64_t adesc =
            rda::smem_desc(at + cfg[kCfgAStart + s], cfg[kCfgALbo], cfg[kCfgASbo], cfg[kCfgASwz]);
        rda::wgmma_ss<N, Dtype, TransB>(d, adesc, bdesc, acc);
      }
    }
    rda::wgmma_commit();
    if (r == reps - 1) {
      if (cfg[kCfgPeek]) {
        float *peek = static_cast<float *>(p.out1) + static_cast<long long>(t) * (N / 2);
        for (int i = 0; i < N / 8; ++i)
          for (int e = 0; e < 4; ++e) peek[4 * i + e] = d[i][e];
      }
      if (cfg[kCfgClobber]) {
        rda::sync_threads();
        for (long long i = t; i < p.n; i += blockDim.x) base[i] = 0;
        rda::sync_threads();
      }
      if (cfg[kCfgNoWait]) return;
    }
    rda::wgmma_wait<0>();
  }
  rda::wgmma_fence_operands(d);
  float *out = static_cast<float *>(p.out0) + static_cast<long long>(t) * (N / 2);
  for (int i = 0; i < N / 8; ++i)
    for (int e = 0; e < 4; ++e) out[4 * i + e] = d[i][e];
}

// Warpgroups of 128 threads (blockDim.x a multiple of 128), one block. in0: the shared-memory
// image (p.n bytes), copied to the first 1024-aligned offset of dynamic shared memory (the
// launch gives p.n + 1024 bytes); in2: thread t's initial d, [t][N / 2] floats; out0: its final
// d; out1: d read before the wait (kCfgPeek). Every warpgroup computes the same product.
extern "C" __global__ void __launch_bounds__(256) emu_wgmma(const emu_test_params p) {
  const int *cfg = static_cast<const int *>(p.in1);
  unsigned char *smem = rda::dynamic_smem();
  unsigned char *base = smem + ((1024u - (rda::smem_addr(smem) & 1023u)) & 1023u);
  const unsigned char *img = static_cast<const unsigned char *>(p.in0);
  for (long long i = threadIdx.x; i < p.n; i += blockDim.x) base[i] = img[i];
  rda::fence_proxy_async_smem();
  rda::sync_threads();
  const int sel = (cfg[kCfgN] == 128 ? 4 : 0) + (cfg[kCfgF16] ? 2 : 0) + (cfg[kCfgTransB] ? 1 : 0);
  switch (sel) {
    case 0: wgmma_body<64, RDA_DTYPE_BF16, false>(p, base); break;
    case 1: wgmma_body<64, RDA_DTYPE_BF16, true>(p, base); break;
    case 2: wgmma_body<64, RDA_DTYPE_FP16, false>(p, base); break;
    case 3: wgmma_body<64, RDA_DTYPE_FP16, true>(p, base); break;
    case 4: wgmma_body<128, RDA_DTYPE_BF16, false>(p, base); break;
    case 5: wgmma_body<128, RDA_DTYPE_BF16, true>(p, base); break;
    case 6: wgmma_body<128, RDA_DTYPE_FP16, false>(p, base); break;
    default: wgmma_body<128, RDA_DTYPE_FP16, true>(p, base); break;
  }
}

RDA_EMU_EXPORT(emu_wgmma, emu_test_params)
