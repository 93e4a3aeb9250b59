/* emu_launch.h — the one struct the host (runtime/emu.c, C11) and an emulated kernel module
 * (host C++, built from generated CUDA source under RDA_EMU) exchange at launch time.
 * Plain C; bump RDA_EMU_ABI whenever the layout changes. */
#ifndef RDA_EMU_LAUNCH_H
#define RDA_EMU_LAUNCH_H

#include <stddef.h>

#define RDA_EMU_ABI 2

/* Filled by the host, passed to `<entry>__emu(rda_emu_launch *l, const void *params)`, which
 * returns 0 on success; on failure it returns nonzero with a one-line message in err. */
typedef struct rda_emu_launch {
  unsigned abi;        /* RDA_EMU_ABI of the caller */
  unsigned grid[3];    /* gridDim.x, .y, .z (each >= 1) */
  unsigned block[3];   /* blockDim.x, .y, .z (product 1..1024) */
  unsigned smem_bytes; /* dynamic shared memory per block */
  unsigned os_threads; /* OS threads to spread blocks over; 0: one per hardware thread */
  unsigned order;      /* blocks, and a block's threads, in index order (0) or reverse (1) */
  size_t params_bytes; /* sizeof the kernel's parameter struct (checked by the entry) */
  char err[512];       /* the failure, NUL-terminated */
} rda_emu_launch;

#endif
