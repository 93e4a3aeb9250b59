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
  char kind[16];    /* "fwd", "init", "cast", "ring_pack", "ring_add", "bwd_prep", "bwd_dkdv"
                       or "bwd_dq" */
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
  int ring_kernel; /* the kernel's twin for a ring round's blocks (rda_kv_table), or -1 */
} rda_step;

/* One backward branch: dK/dV with kernel `dkdv_kernel` (`dsplit` blocks per key tile), then
 * dQ with `dq_kernel`, for heads [head0, head0 + nheads). */
typedef struct rda_bwd_step {
  int dkdv_kernel, dq_kernel;
  int dkdv_atomic_kernel; /* dK/dV + dQ by atomics (dsplit 1), or -1 when not planned */
  /* The twins of dkdv_kernel and dq_kernel for a ring round's blocks (rda_bwd_kv_table), or -1
   * (both or neither). */
  int dkdv_ring_kernel, dq_ring_kernel;
  int dsplit;
  int branch;
  int head0, nheads;
} rda_bwd_step;

typedef struct rda_plan_k {
  rda_config cfg;
  rda_hw hw;
  int nvariants;
  rda_variant *variants;
  int nsteps;
  rda_step steps[RDA_MAX_BRANCHES];
  int init_kernel; /* variant index of the o = 0, lse = -inf kernel */
  int cast_kernel; /* variant index of the fp32 -> storage dtype kernel */
  int ring_pack_kernel; /* variant index of the ring's K/V row packer (kind "ring_pack") */
  int ring_add_kernel;  /* variant index of the ring's fp32 dK/dV row adder (kind "ring_add") */
  /* Backward (only when planned with RDA_PLAN_BACKWARD; has_bwd = 0 otherwise). */
  int has_bwd;
  rda_bwd_step bwd_steps[RDA_MAX_BRANCHES]; /* nsteps of them, in branch order */
  int bwd_prep_kernel; /* variant index of the Dp / zero-gradients kernel */
} rda_plan_k;

/* $RDA_HOME if set, else the source tree rda was built from (for tests and tools that look for
 * configs/). The scripts and templates themselves come through runtime/sources.h: from
 * $RDA_HOME when it is set, else the copies embedded in librda. */
const char *rda_gen_home(void);

/* A generator: one Lua state with gen/ loaded (RDA_ERR_IO when $RDA_HOME is set and has no gen/).
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

/* rda_gen_plan with options. RDA_PLAN_BACKWARD also plans the backward kernels (kinds
 * "bwd_prep", "bwd_dkdv", "bwd_dq"; tiles from tuning/bwd_space.lua) and fills has_bwd,
 * bwd_steps and bwd_prep_kernel. They are appended to `variants`, so rda_fwd_load (which loads
 * every variant) loads them too; a forward-only plan (rda_gen_plan) does not compile them. */
/* RDA_PLAN_BACKWARD_ATOMIC (with RDA_PLAN_BACKWARD) adds, per branch where the tile allows, a
 * dK/dV variant that also adds dQ by fp32 atomics: rda_bwd_run uses it when deterministic = 0
 * (one launch instead of two, not bit-reproducible). */
/* RDA_PLAN_WGMMA lets the forward and the backward's dK/dV and dQ take the tile spaces' wgmma
 * candidates (sm_90a warpgroup MMA; not the atomic-dQ dK/dV) on an sm_90 target; so does the
 * environment variable RDA_WGMMA=1 (rda_gen_wgmma_env). Off by default until the path has been
 * checked and timed on an H100. */
enum { RDA_PLAN_BACKWARD = 1u, RDA_PLAN_BACKWARD_ATOMIC = 2u, RDA_PLAN_WGMMA = 4u };

/* 1 when RDA_WGMMA is "1", 0 when unset, empty or "0"; anything else is an error (-1, err). */
int rda_gen_wgmma_env(rda_err *err);
rda_status rda_gen_plan_ex(rda_gen *g, const rda_config *cfg, const rda_hw *hw, unsigned flags,
                           rda_plan_k *out, rda_err *err);
void rda_plan_k_free(rda_plan_k *p); /* frees what rda_gen_plan allocated; accepts NULL */

/* Run a trusted Lua script (text only) in the generator's state, with gen/ on the module path:
 * the Lua unit tests under gen/tests/ run this way. A raised error becomes RDA_ERR_INTERNAL
 * with its first line in err; rda_gen_traceback() then holds the whole traceback. */
rda_status rda_gen_run_script(rda_gen *g, const char *path, rda_err *err);

/* The full message and traceback of the last failed call into Lua ("" when none). */
const char *rda_gen_traceback(const rda_gen *g);

#endif
