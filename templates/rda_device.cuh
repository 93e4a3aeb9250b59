/* rda_device.cuh — the prelude of every template: fixed-width integer types and the CUDA
 * execution model. Under NVRTC nothing from the host is included; under RDA_EMU the host C++
 * compiler gets the emulator's CUDA shim instead (threadIdx, __syncthreads, fibers, ...). */
#ifndef RDA_DEVICE_CUH
#define RDA_DEVICE_CUH

#if defined(RDA_EMU)
#include "emu/cuda_shim.h"
#else
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;
#define RDA_EMU_EXPORT(entry, params_type) /* native build: nothing to export */
#endif

#include "rda_params.h"

#endif
