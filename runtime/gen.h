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

/* A generator: one Lua state with gen/ loaded (RDA_ERR_IO when rda_gen_home() has no gen/).
 * Not thread-safe: use one per thread. *out is NULL on failure. */
rda_status rda_gen_open(rda_gen **out, rda_err *err);
void rda_gen_close(rda_gen *g); /* accepts NULL */

/* Run a config chunk in the sandbox and validate it (SPEC §3). On failure (RDA_ERR_CONFIG;
 * RDA_ERR_IO when the file cannot be read) err holds one line naming the key, the value and
 * what is allowed, and *out is zeroed. The sandbox: no io, os, require, load, dofile, debug,
 * metatables or pcall; at most 10^7 VM instructions and 64 MiB allocated. */
rda_status rda_gen_config_file(rda_gen *g, const char *path, rda_config *out, rda_err *err);
rda_status rda_gen_config_string(rda_gen *g, const char *chunk, const char *chunkname,
                                 rda_config *out, rda_err *err);

/* The built-in profile of an offline target (80, 86, 89, 90); any other arch is
 * RDA_ERR_INVALID_ARGUMENT with a message listing the known ones. */
rda_status rda_gen_hw_builtin(rda_gen *g, int arch, rda_hw *out, rda_err *err);

/* Plan and emit every kernel a config needs on this hardware: one step per branch, fwd
 * variants deduplicated by name, tiles from tuning/fwd_space.lua (the first that fits).
 * RDA_ERR_UNSUPPORTED with the reason when no tile fits; RDA_ERR_INVALID_ARGUMENT for a config
 * that did not pass validation. On failure *out holds nothing to free. */
rda_status rda_gen_plan(rda_gen *g, const rda_config *cfg, const rda_hw *hw, rda_plan_k *out,
                        rda_err *err);
void rda_plan_k_free(rda_plan_k *p); /* frees what rda_gen_plan allocated; accepts NULL */

/* Run a trusted Lua script (text only) in the generator's state, with gen/ on the module path:
 * the Lua unit tests under gen/tests/ run this way. A raised error becomes RDA_ERR_INTERNAL
 * with its first line in err; rda_gen_traceback() then holds the whole traceback. */
rda_status rda_gen_run_script(rda_gen *g, const char *path, rda_err *err);

/* The full message and traceback of the last failed call into Lua ("" when none). */
const char *rda_gen_traceback(const rda_gen *g);

#endif
