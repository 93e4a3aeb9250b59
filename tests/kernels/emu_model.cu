// emu_model.cu — kernels for the emulator's execution model: every block and thread of a
// multi-dimensional grid runs once, shared memory starts poisoned, and deadlocks, traps and bad
// cp.async addresses fail the launch with a message. Entries share this source (one compile).
#include "ptx.cuh"

struct emu_test_params {
  const void *in0, *in1, *in2;
  void *out0, *out1;
  long long n;
  int op;
  int pad;
};

// out0[global thread id] += 1 (int); out1[id][0..11] = threadIdx, blockIdx, blockDim, gridDim.
extern "C" __global__ void emu_grid_ids(const emu_test_params p) {
  const long long block = blockIdx.x + static_cast<long long>(gridDim.x) *
                                           (blockIdx.y + static_cast<long long>(gridDim.y) * blockIdx.z);
  const long long nthreads = static_cast<long long>(blockDim.x) * blockDim.y * blockDim.z;
  const long long id =
      block * nthreads + threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  atomicAdd(static_cast<int *>(p.out0) + id, 1);
  unsigned *o = static_cast<unsigned *>(p.out1) + 12 * id;
  const unsigned v[12] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y,
                          blockIdx.z,  blockDim.x,  blockDim.y,  blockDim.z, gridDim.x,
                          gridDim.y,   gridDim.z};
  for (int i = 0; i < 12; ++i) o[i] = v[i];
}

// Each thread reads its 4-byte word of shared memory (out0[block][t], before anyone wrote) and
// then overwrites it, so a block that inherited the previous block's memory would show it.
// out1[block] = the shared memory address modulo 128.
extern "C" __global__ void emu_smem_poison(const emu_test_params p) {
  unsigned char *smem = rda::dynamic_smem();
  const int t = threadIdx.x;
  uint32_t w;
  memcpy(&w, smem + 4 * t, 4);
  static_cast<uint32_t *>(p.out0)[blockIdx.x * blockDim.x + t] = w;
  rda::sync_threads();
  const uint32_t mine = 0x12345678u + t;
  memcpy(smem + 4 * t, &mine, 4);
  if (t == 0)
    static_cast<uint32_t *>(p.out1)[blockIdx.x] =
        static_cast<uint32_t>(reinterpret_cast<uintptr_t>(smem) % 128);
}

// op 0: thread p.n of the block skips the barrier (returns). op 1: lanes 16..31 of warp 0 skip a
// shuffle. op 2: thread 3 of block 2 traps. op 3: a misaligned cp.async. op 4: a cp.async
// outside shared memory. op 5: half a warp at a barrier, half at a shuffle.
// Otherwise (and in every block the fault is not in) out0[block * T + t] = 1.
extern "C" __global__ void emu_faults(const emu_test_params p) {
  const int t = threadIdx.x;
  const unsigned char *src = static_cast<const unsigned char *>(p.in0);
  unsigned char *smem = rda::dynamic_smem();
  switch (p.op) {
    case 0:
      if (t == p.n) return;
      rda::sync_threads();
      break;
    case 1:
      if (t < 32 && t >= 16) return;
      if (t < 32) (void)rda::shfl_xor(1.0f, 1);
      break;
    case 2:
#if defined(RDA_EMU)
      if (blockIdx.x == 2 && t == 3) rda_emu::trap("custom trap message 42");
#endif
      break;
    case 3:
      if (t == 5) rda::cp_async_16(smem + 8, src, true);
      break;
    case 4:
#if defined(RDA_EMU)
      if (t == 6) rda::cp_async_16(smem + rda_emu::dynamic_smem_bytes(), src, true);
#endif
      break;
    case 5:
      if (t < 16)
        rda::sync_threads();
      else if (t < 32)
        (void)rda::shfl_xor(1.0f, 1);
      else
        rda::sync_threads();
      break;
    default: break;
  }
  static_cast<int *>(p.out0)[blockIdx.x * blockDim.x + t] = 1;
}

RDA_EMU_EXPORT(emu_grid_ids, emu_test_params)
RDA_EMU_EXPORT(emu_smem_poison, emu_test_params)
RDA_EMU_EXPORT(emu_faults, emu_test_params)
