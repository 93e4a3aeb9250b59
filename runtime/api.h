/* api.h — internal hooks of the public API (runtime/api.c) for benchmarks and tests only:
 * a context whose launches do nothing, so the host-side cost of a call can be measured apart
 * from the kernels it enqueues. Not installed; not part of rda.h. */
#ifndef RDA_API_INTERNAL_H
#define RDA_API_INTERNAL_H

#include "rda.h"

/* An emulator context that loads kernels as usual but whose launches return at once without
 * running anything (outputs are left untouched). For measuring host overhead. */
rda_status rda_api_ctx_create_dry(rda_ctx **out);

/* Live plans on a context (for leak checks in tests); -1 for a bad handle. */
int rda_api_ctx_plans(const rda_ctx *ctx);

/* Plan cores (a config's loaded kernels, shared by its plans) a context holds, in use or idle;
 * -1 for a bad handle. */
int rda_api_ctx_cores(rda_ctx *ctx);

#endif
