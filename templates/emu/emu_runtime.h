/* emu_runtime.h — what the emulator's runtime (emu_runtime.cc, its own shared object, loaded
 * before any kernel module) exports beyond emu_api.h: the launch entry and the coordinates of
 * the calling CUDA thread. Kernel modules resolve these symbols at load time. */
#ifndef RDA_EMU_RUNTIME_H
#define RDA_EMU_RUNTIME_H

#include <cstddef>

#include "emu_launch.h"

#pragma GCC visibility push(default)
#include "emu_api.h"

namespace rda_emu {

/* Depend only on which fiber runs, which changes only inside calls that may switch fibers. */
int lane() __attribute__((pure));
int warp() __attribute__((pure));
unsigned char *dynamic_smem() __attribute__((pure));
size_t dynamic_smem_bytes() __attribute__((pure));

namespace detail {

/* The body of every `<entry>__emu`: checks the launch, runs every block of the grid on fibers
 * over OS threads, returns 0 or nonzero with l->err filled. body(params) runs one CUDA thread. */
int run_launch(rda_emu_launch *l, const void *params, size_t params_bytes,
               void (*body)(const void *)) noexcept;

/* threadIdx, blockIdx, blockDim, gridDim of the calling CUDA thread: x, y, z. */
const unsigned *thread_idx() __attribute__((pure));
const unsigned *block_idx() __attribute__((pure));
const unsigned *block_dim() __attribute__((pure));
const unsigned *grid_dim() __attribute__((pure));

}  // namespace detail
}  // namespace rda_emu
#pragma GCC visibility pop

#endif
