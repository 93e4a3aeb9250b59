/* emu_api.h — what the CPU emulator's runtime offers to device code compiled for the host
 * (RDA_EMU). templates/ptx.cuh builds every emulated intrinsic from these few primitives;
 * emu_runtime.h implements them with one fiber per CUDA thread. Host C++ only. */
#ifndef RDA_EMU_API_H
#define RDA_EMU_API_H

#include <cstddef>
#include <cstdint>

namespace rda_emu {

/* The calling CUDA thread's lane (linear thread index mod 32) and warp within its block. */
int lane();
int warp();

/* __syncthreads: returns once every thread of the block has called it. */
void block_barrier();

/* A warp-collective exchange. Every one of the 32 lanes of the calling warp passes `bytes`
 * (<= 64) bytes; the call returns once all 32 have arrived, with a pointer to the 32 deposits,
 * lane i's at offset i * 64. The pointer stays valid until this lane's next collective. */
const unsigned char *warp_gather(const void *mine, size_t bytes);
constexpr size_t kGatherSlot = 64;

/* The block's dynamic shared memory (filled with a poison pattern at block start). */
unsigned char *dynamic_smem();
size_t dynamic_smem_bytes();

/* cp.async: copies are queued per thread and performed only when a cp_async_wait makes them
 * complete; at issue the destination is filled with a NaN pattern (0xff bytes). So a read of
 * shared memory before the wait, and a load issued over data still being read (a stage some
 * wgmma in flight reads), both give wrong results, as they may on hardware.
 * valid = false zero-fills the 16 bytes (src-size 0). */
void cp_async_16(void *smem_dst, const void *gmem_src, bool valid);
void cp_async_commit();
void cp_async_wait(int pending_groups_allowed);

/* Proxies (PTX ISA: cp.async "is treated as a weak memory operation performed in the generic
 * proxy"; wgmma.mma_async reads shared memory through the async proxy). Each 16-byte chunk a
 * thread's cp.async writes is marked with that thread when the copy lands (at its
 * cp_async_wait, copy and zero-fill alike); fence_proxy_async_shared
 * (fence.proxy.async.shared::cta) clears the calling thread's marks, at a cost proportional to
 * the chunks it wrote since its last fence. unfenced_writer: the linear thread index (in the
 * block) of the mark on the chunk holding shared offset smem_offset, -1 when unmarked or past
 * the dynamic shared memory. Plain C++ stores to shared memory are invisible to the emulator
 * and never marked. */
void fence_proxy_async_shared();
int unfenced_writer(size_t smem_offset);

/* Per-CUDA-thread storage for models of asynchronous units (wgmma_emu.h's pending groups):
 * `bytes` (at most kThreadStateMax) bytes private to the calling thread, zero-filled at the
 * thread's first call in a block; later calls return the same storage and must pass the same
 * size. on_exit (of the first call; may be null) runs with the storage when the thread's body
 * returns, and may trap (work never waited for). Fibers share an OS thread, so thread_local
 * cannot hold such state. */
void *thread_state(size_t bytes, void (*on_exit)(void *state));
constexpr size_t kThreadStateMax = 16384;

/* Per-block storage for models of warpgroup-wide instructions (wgmma_emu.h's divergence
 * check): `bytes` (at most kBlockStateMax) bytes shared by every thread of the calling block,
 * zero-filled at the block's first call; later calls in the block return the same storage and
 * must pass the same size. on_exit (of the first call; may be null) runs with the storage once,
 * after the block's last thread has returned (thread_state's on_exit hooks first), in that
 * thread's context, so it may trap. The storage is dropped at block end (an abandoned block's
 * too). The fibers of a block run on one OS thread and switch only inside block_barrier and
 * warp_gather, so no locking is needed between the calls that do not block. */
void *block_state(size_t bytes, void (*on_exit)(void *state));
constexpr size_t kBlockStateMax = size_t(1) << 20;

/* Report a device-side failure (like a trap): the launch fails with this message. */
[[noreturn]] void trap(const char *what);

}  // namespace rda_emu

#endif
