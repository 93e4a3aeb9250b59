/* nvrtc.h — compile a generated kernel with NVRTC to a cubin (or PTX) for one sm_XX, with the
 * ptxas report captured. Works on machines with no GPU and no driver. */
#ifndef RDA_NVRTC_H
#define RDA_NVRTC_H

#include "err.h"

#include <stddef.h>

typedef struct rda_nvrtc_out {
  unsigned char *image; /* cubin (or PTX text, NUL-terminated, when want_ptx) — malloc'd */
  size_t image_bytes;
  char *log;            /* the full compile log including the ptxas report — malloc'd */
  int registers;        /* per thread, from ptxas */
  int spill_bytes;      /* spill stores + spill loads, from ptxas */
  int smem_bytes;       /* static shared memory, from ptxas */
  int wgmma_notices;    /* ptxas advisories (C75xx) of wgmma serialized or fences injected */
  double compile_s;     /* wall time of the compile */
} rda_nvrtc_out;

/* The target NVRTC compiles arch for: "sm_90a" for 90 (wgmma is sm_90a-only), else "sm_<arch>".
 * Part of the kernel cache key (runtime/cache.c). Returns out. */
const char *rda_nvrtc_target(int arch, char out[16]);

/* Compile `source` (named `name` in messages) for sm_`arch`; `entry` must be an extern "C"
 * kernel in it. The templates are passed as named headers (runtime/sources.h). */
rda_status rda_nvrtc_compile(const char *source, const char *name, const char *entry, int arch,
                             int want_ptx, rda_nvrtc_out *out, rda_err *err);
void rda_nvrtc_out_free(rda_nvrtc_out *o); /* accepts NULL */

/* Read registers, spill bytes (stores + loads, the entry's plus those of non-entry functions
 * it may call) and static shared memory of `entry` from a ptxas -v log into out; 1 when the
 * log reports the entry, else 0 (added by nvrtc, so tests can feed other CUDA versions' logs). */
int rda_nvrtc_parse_report(const char *log, const char *entry, rda_nvrtc_out *out);

/* 1 when this NVRTC can compile for sm_`arch`, else 0 (added by nvrtc for `rdagen emit`). */
int rda_nvrtc_arch_supported(int arch);

/* The compile options besides the target, as one string (part of the kernel cache key). */
const char *rda_nvrtc_options(void);

/* Can a driver that supports CUDA `driver_version` (cuDriverGetVersion, e.g. 12020) load the
 * cubins NVRTC `nvrtc_version` (rda_nvrtc_version) builds? Cubins need a driver of at least the
 * same major version (CUDA's minor version compatibility covers the rest); otherwise
 * RDA_ERR_CUDA with a message naming both versions and what to do. Pure: no driver needed. */
rda_status rda_nvrtc_driver_check(int driver_version, int nvrtc_version, rda_err *err);

/* NVRTC's version as major * 1000 + minor * 10 (like CUDA_VERSION). */
int rda_nvrtc_version(void);

#endif
