/* backend.c — choosing where kernels run: by name, or "auto" (the GPU when one is usable,
 * else the CPU emulator), and the hardware profile that goes with the choice. */
#include "backend.h"

#include <stdio.h>
#include <string.h>

static const int kEmuArch = 90;

rda_status rda_backend_open(const char *which, rda_backend **out, char *why, size_t why_len,
                            rda_err *err) {
  *out = NULL;
  if (why_len > 0) why[0] = '\0';
  if (strcmp(which, "emu") == 0) {
    RDA_TRY(rda_backend_emu_open(out, kEmuArch, err));
    snprintf(why, why_len, "emu (requested)");
    return RDA_OK;
  }
  if (strcmp(which, "cuda") == 0) {
    RDA_TRY(rda_backend_cuda_open(out, 0, err));
    snprintf(why, why_len, "cuda (requested)");
    return RDA_OK;
  }
  if (strcmp(which, "auto") != 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "backend '%s': must be one of auto, cuda, emu", which);
  rda_err cuda_err = {0};
  if (rda_backend_cuda_open(out, 0, &cuda_err) == RDA_OK) {
    snprintf(why, why_len, "cuda (a GPU is usable)");
    return RDA_OK;
  }
  RDA_TRY(rda_backend_emu_open(out, kEmuArch, err));
  snprintf(why, why_len, "emu (no usable GPU: %s)", cuda_err.msg);
  return RDA_OK;
}

rda_status rda_backend_hw(rda_backend *b, rda_gen *g, rda_hw *out, rda_err *err) {
  if (strcmp(b->name, "cuda") == 0) return rda_backend_cuda_hw(b, out, err);
  RDA_TRY(rda_gen_hw_builtin(g, b->arch, out, err));
  out->emulated = 1;
  return RDA_OK;
}
