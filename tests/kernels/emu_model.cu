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
  const long long block =
      blockIdx.x + static_cast<long long>(gridDim.x) *
                       (blockIdx.y + static_cast<long long>(gridDim.y) * blockIdx.z);
  const long long nthreads = static_cast<long long>(blockDim.x) * blockDim.y * blockDim.z;
  const long long id =
      block * nthreads + threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  atomicAdd(static_cast<int *>(p.out0) + id, 1);
  unsigned *o = static_cast<unsigned *>(p.out1) + 12 * id;
  const unsigned v[12] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z,
                          blockDim.x,  blockDim.y,  blockDim.z,  gridDim.x,  gridDim.y,  gridDim.z};
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
// outside shared memory. op 5: half a warp at a barrier, half at a shuffle. op 6: half a warp
// shuffles a float, half a double (different collectives).
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
    case 6:
      if (t < 16)
        (void)rda::shfl_xor(1.0f, 1);
      else if (t < 32)
        (void)__shfl_xor_sync(0xffffffffu, 1.0, 1);
      break;
    default: break;
  }
  static_cast<int *>(p.out0)[blockIdx.x * blockDim.x + t] = 1;
}

// The CUDA built-ins of the shim, one warp per block: out0[block][k][lane] for k = 0
// __shfl_sync(v, 7 lane % 32), 1 __shfl_down_sync(v, 3), 2 __shfl_up_sync(v, 5),
// 3 __shfl_xor_sync(v, 9, width 16), 4 __shfl_sync(v, 3, width 8), 5 min(lane, 11) and
// max(lane, 11) as lo/hi 16 bits; v = in0[lane] (ints). out1[0] += 1.0f per thread (atomicAdd).
extern "C" __global__ void emu_builtins(const emu_test_params p) {
  const int l = threadIdx.x;
  const int v = static_cast<const int *>(p.in0)[l];
  int *o = static_cast<int *>(p.out0) + blockIdx.x * 6 * 32;
  o[0 * 32 + l] = __shfl_sync(0xffffffffu, v, (7 * l) % 32);
  o[1 * 32 + l] = __shfl_down_sync(0xffffffffu, v, 3);
  o[2 * 32 + l] = __shfl_up_sync(0xffffffffu, v, 5);
  o[3 * 32 + l] = __shfl_xor_sync(0xffffffffu, v, 9, 16);
  o[4 * 32 + l] = __shfl_sync(0xffffffffu, v, 3, 8);
  __syncwarp();
  o[5 * 32 + l] = min(l, 11) | (max(l, 11) << 16);
  atomicAdd(static_cast<float *>(p.out1), 1.0f);
}

// Thread t stores t + 1 in word t of shared memory, then reads word t - 1 into out0[t] (thread 0
// its own). With p.op = 1 a barrier separates the store and the read; without it the read races
// with the store of thread t - 1, which threads run in index order (the default) always win.
extern "C" __global__ void emu_neighbour_read(const emu_test_params p) {
  uint32_t *smem = reinterpret_cast<uint32_t *>(rda::dynamic_smem());
  const int t = threadIdx.x;
  smem[t] = static_cast<uint32_t>(t) + 1u;
  if (p.op == 1) rda::sync_threads();
  static_cast<uint32_t *>(p.out0)[t] = smem[t > 0 ? t - 1 : 0];
}

// Block b stores b + 1 in out0[b], then reads out0[b - 1] (the previous block's store) into
// out1[b]: no GPU orders blocks of one launch, so the read races with that store, which blocks
// taken in index order on one OS thread always win and taken last to first always lose.
extern "C" __global__ void emu_block_chain(const emu_test_params p) {
  const unsigned b = blockIdx.x;
  volatile uint32_t *mine = static_cast<uint32_t *>(p.out0);
  mine[b] = b + 1u;
  static_cast<uint32_t *>(p.out1)[b] = mine[b > 0 ? b - 1 : 0];
}

// Spins until the host sets the int at p.in0 (emulator only: the kernel is host code, so it can
// watch host memory): holds its stream for as long as a test wants.
extern "C" __global__ void emu_hold(const emu_test_params p) {
  const volatile int *flag = static_cast<const volatile int *>(p.in0);
  while (*flag == 0) {
  }
}

RDA_EMU_EXPORT(emu_grid_ids, emu_test_params)
RDA_EMU_EXPORT(emu_hold, emu_test_params)
RDA_EMU_EXPORT(emu_neighbour_read, emu_test_params)
RDA_EMU_EXPORT(emu_block_chain, emu_test_params)
RDA_EMU_EXPORT(emu_builtins, emu_test_params)
RDA_EMU_EXPORT(emu_smem_poison, emu_test_params)
RDA_EMU_EXPORT(emu_faults, emu_test_params)
