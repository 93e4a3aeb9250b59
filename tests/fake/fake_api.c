/* fake_api.c — fake_load (fake_api.h). */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
// clang-format on

#include "fake_api.h" /* cuda.h, nccl.h */

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"
#include "fake_nccl.h"

fake_api fk;

/* The pointer types must be exactly the headers' (unevaluated: nothing gets linked). */
static void fake_check_signatures(void) {
#define FAKE_SIG(field, sym) (void)sizeof(fk.field = sym);
  FAKE_NCCL_SYMBOLS(FAKE_SIG)
  FAKE_CUDA_SYMBOLS(FAKE_SIG)
#undef FAKE_SIG
}

void fake_load(void) {
  static int loaded;
  if (loaded) return;
  fake_check_signatures();
  void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nccl == NULL || cuda == NULL || dlsym(nccl, "fake_nccl_count") == NULL ||
      dlsym(cuda, "fake_cu_stream_create") == NULL) {
    const char *why = dlerror(), *path = getenv("LD_LIBRARY_PATH");
    fail_msg("libnccl.so.2 and libcuda.so.1 are not the fakes of %s (LD_LIBRARY_PATH=%s): %s",
             RDA_TEST_FAKE_LIBS, path ? path : "", why ? why : "a real library came first");
  }
  void *sym;
#define FAKE_RESOLVE(lib, field, name)                   \
  sym = dlsym(lib, #name);                               \
  if (sym == NULL) fail_msg("the fake lacks %s", #name); \
  memcpy(&fk.field, &sym, sizeof sym);
#define FAKE_RES_N(field, name) FAKE_RESOLVE(nccl, field, name)
#define FAKE_RES_C(field, name) FAKE_RESOLVE(cuda, field, name)
  FAKE_NCCL_SYMBOLS(FAKE_RES_N)
  FAKE_CUDA_SYMBOLS(FAKE_RES_C)
#undef FAKE_RES_N
#undef FAKE_RES_C
#undef FAKE_RESOLVE
  loaded = 1;
}
