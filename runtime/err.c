/* err.c — status names and the first-error-wins message slot. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>

const char *rda_status_string(rda_status s) {
  switch (s) {
    case RDA_OK: return "RDA_OK";
    case RDA_ERR_INVALID_ARGUMENT: return "RDA_ERR_INVALID_ARGUMENT";
    case RDA_ERR_CONFIG: return "RDA_ERR_CONFIG";
    case RDA_ERR_NVRTC: return "RDA_ERR_NVRTC";
    case RDA_ERR_CUDA: return "RDA_ERR_CUDA";
    case RDA_ERR_NCCL: return "RDA_ERR_NCCL";
    case RDA_ERR_CACHE: return "RDA_ERR_CACHE";
    case RDA_ERR_IO: return "RDA_ERR_IO";
    case RDA_ERR_OUT_OF_MEMORY: return "RDA_ERR_OUT_OF_MEMORY";
    case RDA_ERR_UNSUPPORTED: return "RDA_ERR_UNSUPPORTED";
    case RDA_ERR_INTERNAL: return "RDA_ERR_INTERNAL";
    case RDA_ERR_EMULATOR: return "RDA_ERR_EMULATOR";
  }
  return "RDA_ERR_UNKNOWN";
}

unsigned rda_version(void) { return RDA_VERSION_NUMBER; }

rda_status rda_err_set(rda_err *e, rda_status s, const char *fmt, ...) {
  if (e == NULL || e->status != RDA_OK) return s;
  e->status = s;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  return s;
}

void rda_err_clear(rda_err *e) {
  if (e == NULL) return;
  e->status = RDA_OK;
  e->msg[0] = '\0';
}
