/* emu.h — extras of the CPU emulator backend (runtime/emu.c) beyond the backend table: a launch
 * with a three-dimensional block (tests of the execution model), and the environment variables
 * the backend reads. The generated kernels use one-dimensional blocks through b->launch. */
#ifndef RDA_EMU_H
#define RDA_EMU_H

#include "backend.h"

/* Read by rda_backend_emu_open:
 *   RDA_EMU_THREADS   OS threads a launch spreads its blocks over (default 0: every hardware
 *                     thread)
 *   RDA_EMU_CXX       the C++ compiler (default: the one rda was built with)
 *   RDA_EMU_CXXFLAGS  extra compiler flags, e.g. "-O0 -g" to debug a kernel (part of the key;
 *                     split at blanks; a compiler or flags too long, or too many flags, to
 *                     pass whole are refused)
 *   RDA_EMU_ORDER     forward (default): a launch's blocks are taken, and a block's threads
 *                     run (each until it waits), in index order; reverse: both last to first
 *                     (a read that no barrier separates from another thread's store, or that
 *                     reads another block's store of the same launch, sees it in one order
 *                     and misses it in the other)
 *   RDA_EMU_STREAMS   sync (default): stream-ordered work runs inside the call; async: on
 *                     streams that an emulated device runs in a random interleaving, so that
 *                     a missing event wait shows (runtime/emu_streams.h)
 * Modules live in the kernel cache (runtime/cache.h) under the target emu-<machine>, keyed by
 * their source, the templates, rda's version, the compiler and its flags; the templates the
 * compiler includes are written to emu-<machine>/inc-<digest>/. A module loaded by several
 * backends (the virtual ranks of a ring) is loaded once per process and shared, reference
 * counted: the generated kernels keep no mutable global state. */

/* 1 when b is an emulator backend with asynchronous streams (RDA_EMU_STREAMS=async): it then
 * orders its work the way a GPU's streams must be ordered, so the ring runs it over device
 * memory (the device transport's stream-ordered copies), not the host transport. */
int rda_backend_emu_async(const rda_backend *b);

/* Like b->launch, with blockDim = (block[0], block[1], block[2]). b must be an emu backend. */
rda_status rda_emu_launch3(rda_backend *b, rda_module *m, const unsigned grid[3],
                           const unsigned block[3], unsigned smem_bytes, const void *params,
                           size_t params_bytes, rda_err *err);

#endif
