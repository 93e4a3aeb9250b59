/* gen.h — the C side of the generator: a Lua state running the gen/ Lua scripts in a sandbox, turning a
 * config file into a validated rda_config, a hardware profile into a kernel plan, and each
 * planned variant into CUDA source. */
#ifndef RDA_GEN_H
#define RDA_GEN_H

#include "config.h"
#include "err.h"
#include "hw.h"

typedef struct rda_gen rda_gen;

/* A kernel the plan needs: its generated source and what launching it takes. */
typedef struct rda_variant {
  char name[128];   /* deterministic; also the extern "C" entry point */
  char kind[16];    /* "fwd", "init" or "cast" */
  char *source;     /* generated CUDA source (malloc'd, owned by the plan) */
  int threads;      /* block size */
  int block_m;      /* query rows per block (fwd), 0 otherwise */
  int block_n;      /* key rows per inner step (fwd), 0 otherwise */
  int smem_bytes;   /* dynamic shared memory per block */
} rda_variant;

/* One forward launch: branch `branch` over heads [head0, head0 + nheads) with kernel `kernel`. */
typedef struct rda_step {
  int kernel;
  int branch;
  int head0, nheads;
} rda_step;

typedef struct rda_plan_k {
  rda_config cfg;
  rda_hw hw;
  int nvariants;
  rda_variant *variants;
  int nsteps;
  rda_step steps[RDA_MAX_BRANCHES];
  int init_kernel; /* variant index of the o = 0, lse = -inf kernel */
  int cast_kernel; /* variant index of the fp32 -> storage dtype kernel */
} rda_plan_k;

/* Where gen/ and templates/ live: $RDA_HOME if set, else the source tree rda was built from. */
const char *rda_gen_home(void);

rda_status rda_gen_open(rda_gen **out, rda_err *err);
void rda_gen_close(rda_gen *g); /* accepts NULL */

/* Run a config chunk in the sandbox and validate it (SPEC §3). On failure err holds one line
 * naming the key, the value and what is allowed. */
rda_status rda_gen_config_file(rda_gen *g, const char *path, rda_config *out, rda_err *err);
rda_status rda_gen_config_string(rda_gen *g, const char *chunk, const char *chunkname,
                                 rda_config *out, rda_err *err);

/* The built-in profile of an offline target (80, 86, 89, 90). */
rda_status rda_gen_hw_builtin(rda_gen *g, int arch, rda_hw *out, rda_err *err);

/* Plan and emit every kernel a config needs on this hardware. */
rda_status rda_gen_plan(rda_gen *g, const rda_config *cfg, const rda_hw *hw, rda_plan_k *out,
                        rda_err *err);
void rda_plan_k_free(rda_plan_k *p); /* frees what rda_gen_plan allocated; accepts NULL */

#endif
