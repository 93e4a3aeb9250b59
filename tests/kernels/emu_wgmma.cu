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
  kCfgRepeat = 32,  // run the fence / k steps / commit / wait sequence this many times (0: 1)
  kCfgAStart = 16,  // [8]: A's start address of k step s (bytes from the 1024-aligned base)
  kCfgBStart = 24,  // [8]: B's
  kCfgInts = 33     // the A fragments start here: [step][thread % 128][4] uint32
};

// p.op (emulator only; 0 on hardware): a register access around the last repetition's
// wait, by thread `who` = (op >> 4) & 4095 only, on register `idx` = op >> 16 (A: a[idx % 4]
// of a step's fragment; d: d[idx / 4][idx % 4], idx < N / 2). The kind is op & 15.
enum {
  kOpNone,
  kOpWriteA,        // step 0's A written between commit and wait (the emulator traps)
  kOpWriteD,        // d written between commit and wait (traps)
  kOpWriteDAfter,   // d written after the wait (allowed: out0 has 2.5 there)
  kOpSplit,         // step 0 in a group of its own, the other steps in a second; wait<1>, then
                    // (out1: d, still held by the second group) wait<0>
  kOpSplitWriteA0,  // kOpSplit, step 0's A written after wait<1> (allowed: its group is done)
  kOpSplitWriteA1,  // kOpSplit, step 1's A written after wait<1> (traps)
  kOpSplitWriteD,   // kOpSplit, d written after wait<1> (traps: the second group holds it)
  // The image loaded by cp.async instead of stores (the emulator marks what cp.async writes;
  // templates/emu/wgmma_emu.h, "Proxies"). Thread t copies chunks t, t + T, ... unless `who`
  // copies them all; some copies zero-fill in the trap kinds (which then read no result).
  kOpCpAsync = 8,     // every thread: cp.async, wait, fence.proxy.async, barrier (no trap)
  kOpCpAsyncNoFence,  // the same without the fences (traps)
  kOpCpEarlyFence,    // every thread fences before its wait, not after (traps)
  kOpCpOneWriter,     // `who` copies everything, waits and fences (no trap)
  kOpCpOtherFence,    // `who` copies everything and does not fence; thread idx fences after
                      // the barrier (traps: the fence orders only its own thread's writes)
  kOpCpZeroNoFence    // every thread zero-fills its chunks (src-size 0), no fences (traps)
};

template <int N, int Dtype, bool TransB>
__device__ void wgmma_body(const emu_test_params &p, unsigned char *base) {
  const int *cfg = static_cast<const int *>(p.in1);
  const uint32_t *afrag = reinterpret_cast<const uint32_t *>(cfg + kCfgInts);
  const int t = threadIdx.x;
  const int kind = p.op & 15, idx = p.op >> 16;
  const bool me = t == ((p.op >> 4) & 4095);
  const bool split = kind >= kOpSplit && kind <= kOpSplitWriteD && cfg[kCfgSteps] >= 2;
  const float *din = static_cast<const float *>(p.in2) + static_cast<long long>(t) * (N / 2);
  float d[N / 8][4];
  for (int i = 0; i < N / 8; ++i)
    for (int e = 0; e < 4; ++e) d[i][e] = din[4 * i + e];
  // Every step's A fragment in registers of its own, written before the fence: an mma_async
  // reads its A until the wait, so the next step must not reuse them.
  uint32_t a[8][4];
  if (cfg[kCfgRs])
    for (int s = 0; s < cfg[kCfgSteps]; ++s)
      for (int q = 0; q < 4; ++q)
        a[s][q] = afrag[(static_cast<long long>(s) * 128 + t % 128) * 4 + q];
  const uint32_t at = rda::smem_addr(base);
  const int reps = cfg[kCfgRepeat] > 0 ? cfg[kCfgRepeat] : 1;
  for (int r = 0; r < reps; ++r) {
    const bool last = r == reps - 1;
    if (!cfg[kCfgNoFence]) rda::wgmma_fence();
    for (int s = 0; s < cfg[kCfgSteps]; ++s) {
      const bool acc = r > 0 || s > 0 || cfg[kCfgAcc] != 0;
      const uint64_t bdesc =
          rda::smem_desc(at + cfg[kCfgBStart + s], cfg[kCfgBLbo], cfg[kCfgBSbo], cfg[kCfgBSwz]);
      if (cfg[kCfgRs]) {
        rda::wgmma_rs<N, Dtype, TransB>(d, a[s], bdesc, acc);
      } else {
        const uint64_t adesc =
            rda::smem_desc(at + cfg[kCfgAStart + s], cfg[kCfgALbo], cfg[kCfgASbo], cfg[kCfgASwz]);
        rda::wgmma_ss<N, Dtype, TransB>(d, adesc, bdesc, acc);
      }
      if (last && split && s == 0) rda::wgmma_commit();
    }
    rda::wgmma_commit();
    if (last) {
      if (cfg[kCfgPeek] && !split) {
        float *peek = static_cast<float *>(p.out1) + static_cast<long long>(t) * (N / 2);
        for (int i = 0; i < N / 8; ++i)
          for (int e = 0; e < 4; ++e) peek[4 * i + e] = d[i][e];
      }
      if (me && kind == kOpWriteA) a[0][idx % 4] ^= 0x00010001u;
      if (me && kind == kOpWriteD) d[idx / 4 % (N / 8)][idx % 4] = 2.5f;
      if (cfg[kCfgClobber]) {
        rda::sync_threads();
        for (long long i = t; i < p.n; i += blockDim.x) base[i] = 0;
        rda::sync_threads();
      }
      if (cfg[kCfgNoWait]) return;
      if (split) {
        rda::wgmma_wait<1>();
        if (cfg[kCfgPeek]) {
          float *peek = static_cast<float *>(p.out1) + static_cast<long long>(t) * (N / 2);
          for (int i = 0; i < N / 8; ++i)
            for (int e = 0; e < 4; ++e) peek[4 * i + e] = d[i][e];
        }
        if (me && kind == kOpSplitWriteA0) a[0][idx % 4] ^= 0x00010001u;
        if (me && kind == kOpSplitWriteA1) a[1][idx % 4] ^= 0x00010001u;
        if (me && kind == kOpSplitWriteD) d[idx / 4 % (N / 8)][idx % 4] = 2.5f;
      }
    }
    rda::wgmma_wait<0>();
  }
  if (me && kind == kOpWriteDAfter) d[idx / 4 % (N / 8)][idx % 4] = 2.5f;
  rda::wgmma_fence_operands(d);
  float *out = static_cast<float *>(p.out0) + static_cast<long long>(t) * (N / 2);
  for (int i = 0; i < N / 8; ++i)
    for (int e = 0; e < 4; ++e) out[4 * i + e] = d[i][e];
}

// Warpgroups of 128 threads (blockDim.x a multiple of 128), one block. in0: the shared-memory
// image (p.n bytes), copied to the first 1024-aligned offset of dynamic shared memory (the
// launch gives p.n + 1024 bytes); in2: thread t's initial d, [t][N / 2] floats; out0: its final
// d; out1: d read before the wait (kCfgPeek; after wait<1> with kOpSplit). Every warpgroup
// computes the same product. p.op: a register hazard (kOpNone), or a cp.async load (kOpCp*).
extern "C" __global__ void __launch_bounds__(256) emu_wgmma(const emu_test_params p) {
  const int *cfg = static_cast<const int *>(p.in1);
  unsigned char *smem = rda::dynamic_smem();
  unsigned char *base = smem + ((1024u - (rda::smem_addr(smem) & 1023u)) & 1023u);
  const unsigned char *img = static_cast<const unsigned char *>(p.in0);
  const int kind = p.op & 15, who = (p.op >> 4) & 4095, other = p.op >> 16;
  const int t = threadIdx.x;
  if (kind >= kOpCpAsync) {
    // p.n is a multiple of 16, in0 16-byte aligned.
    const bool one = kind == kOpCpOneWriter || kind == kOpCpOtherFence;
    const bool trap_kind = kind != kOpCpAsync && kind != kOpCpOneWriter;
    if (!one || t == who)
      for (long long c = one ? 0 : t; 16 * c < p.n; c += one ? 1 : static_cast<int>(blockDim.x))
        rda::cp_async_16(base + 16 * c, img + 16 * c,
                         kind != kOpCpZeroNoFence && !(trap_kind && c % 3 == 1));
    rda::cp_async_commit();
    if (kind == kOpCpEarlyFence) rda::fence_proxy_async_smem();
    rda::cp_async_wait<0>();
    if (kind == kOpCpAsync || (kind == kOpCpOneWriter && t == who)) rda::fence_proxy_async_smem();
    rda::sync_threads();
    if (kind == kOpCpOtherFence && t == other) rda::fence_proxy_async_smem();
  } else {
    for (long long i = t; i < p.n; i += blockDim.x) base[i] = img[i];
    rda::fence_proxy_async_smem();
    rda::sync_threads();
  }
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
