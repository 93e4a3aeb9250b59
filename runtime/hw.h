/* hw.h — the hardware profile the planner sizes kernels for: read from the live device
 * through the driver API (runtime/cuda.c) or taken from the built-in table (gen/hw.lua) for
 * offline targets, so generation never needs a GPU. */
#ifndef RDA_HW_H
#define RDA_HW_H

typedef struct rda_hw {
  char name[64];          /* "sm_90 (built-in)" or the device name */
  int arch;               /* 80, 86, 89, 90, ... (major * 10 + minor) */
  int sm_count;
  int smem_per_block;     /* bytes, the opt-in maximum for dynamic shared memory */
  int smem_per_sm;        /* bytes */
  int regs_per_sm;
  int regs_per_block;
  int max_threads_per_sm;
  int live;               /* 1 when read from a device */
  int emulated;           /* 1 when the CPU emulator plans with it (rda_backend_hw): tuning
                             entries are then those of target "emu-sm_XX", never a GPU's */
} rda_hw;

#endif
