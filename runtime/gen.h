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
  char tile[48];    /* the tile's name (gen/plan.lua), e.g. "bm128_bn64_w8_s2"; "" for the
                       small kernels */
  int tuned;        /* 1 when the tile came from a tuning database entry or a forced tile */
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
 * RDA_ERR_IO when the file cannot be opened or read, or is a folder, socket or device) err holds
 * one line that starts with the config's full name (path or chunkname), then what is wrong: the
 * key, the value and what is allowed, or the chunk's own error (its control characters, C1
 * included, replaced); *out is zeroed. A FIFO or pipe (`<(cat c.lua)`, /dev/stdin) is read
 * until its writer closes it, waiting at most the time limit (RDA_ERR_IO after that). The
 * sandbox: no io, os, require, load, dofile, debug, metatables or pcall; at most 10^7 VM
 * instructions, 64 MiB allocated (parse included) and the time limit (rda_gen_set_time_limit;
 * RDA_CONFIG_TIME_LIMIT, default RDA_GEN_SANDBOX_SECONDS) of the running thread's CPU time
 * (parse included; "<name>: config exceeds the time limit (N s)"), checked at every call and
 * every 10 instructions, and once more after the chunk returns, so no loop of C calls
 * (table.sort, string.upper of a 16 MiB string) can hang the tool and no overrun is accepted.
 * One VM instruction can still run long unseen (a table rehash of 2^19 keys that collide in
 * Lua's hash: minutes): a host program that loads untrusted configs should run them in a
 * process of its own it can kill, or, as rdagen does, call rda_gen_enable_watchdog. A user's
 * tuning database runs under the same three limits. */
rda_status rda_gen_config_file(rda_gen *g, const char *path, rda_config *out, rda_err *err);
rda_status rda_gen_config_string(rda_gen *g, const char *chunk, const char *chunkname,
                                 rda_config *out, rda_err *err);

/* The sandbox's default time limit, in CPU seconds. Real configs take well under a millisecond
 * and a user tuning database of a few thousand entries tens of milliseconds: only a runaway
 * chunk comes near it. The environment variable RDA_CONFIG_TIME_LIMIT (seconds, a number from
 * 0.01 to 3600), read by rda_gen_open, replaces it; any other value fails rda_gen_open
 * (RDA_ERR_INVALID_ARGUMENT, naming it). */
#define RDA_GEN_SANDBOX_SECONDS 5.0

/* The time limit of this generator's sandboxed runs (configs and user tuning databases), for
 * tests; seconds <= 0 restores the default (RDA_CONFIG_TIME_LIMIT, else
 * RDA_GEN_SANDBOX_SECONDS). */
void rda_gen_set_time_limit(rda_gen *g, double seconds);

/* For a program (rdagen) that runs untrusted configs in its own process: from now on, in
 * every generator of the process, a sandboxed run still inside one VM instruction 1 s past its
 * time limit (in CPU time; the hooks cannot stop it there) ends the process: the line
 * "<program>: error: <name>: config exceeds the time limit (N s)" goes to stderr (write(2)) and
 * the process exits with status 1 (_exit: no atexit handlers, no buffers flushed). A thread
 * starts at the first sandboxed run after this call and watches every run in progress, from
 * any thread. A library must not call this on its host's behalf. */
void rda_gen_enable_watchdog(const char *program);

/* remove = 1: when the watchdog ends the process, it first removes the file at path (e.g. a
 * lock file whose holder's cleanup would otherwise never run); at most 4 such files, each
 * path under 4200 bytes (else 0). remove = 0: forget path again (1 when it was there). */
int rda_gen_watchdog_remove_on_kill(const char *path, int remove);

/* For tests only: how many sandboxed runs the watchdog watches at this moment, from every
 * thread (0 while it is off, and whenever no run is in progress). */
int rda_gen_watchdog_watching(void);

/* The built-in profile of an offline target (gen/hw.lua: 80 to 121); any other arch is
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

/* ---- tuning (gen/tuning.lua; runtime/tune.c, `rdagen tune`) ---------------------------------
 * Every plan takes the tile of each attention kernel (fwd, bwd_dkdv, bwd_dq, per branch) from
 * the tuning databases when one ranks it: the first tile of the entry's ranking that is a
 * fitting, allowed candidate of the tile space now. The user's database (runtime/tuning_db.h,
 * read at every plan) comes before the one shipped in tuning/db.lua; without an entry, the
 * space's first fitting tile (as before). Entries are keyed by target ("sm_90"; "emu-sm_90"
 * for plans of the CPU emulator, rda_hw.emulated, so emulator timings never steer a GPU),
 * kind, head_dim, dtype, causal, dilated, rows (the branch's grid rows ceil(w / r) rounded up
 * to a power of two, at least 16) and wgmma (whether wgmma tiles were admitted: a plan reads
 * only entries of its own state). An entry lists every tile it tried; a plan skips it when the
 * space now has a fitting, allowed tile it never measured. A user database that does not load or check is an
 * RDA_ERR_CONFIG naming the file, for every plan, until it is fixed or removed. */

/* One tile forced on one (kind, branch) of a plan, over whatever the databases say: what the
 * tuner times. kind: "fwd", "bwd_dkdv" or "bwd_dq"; tile: a name from rda_gen_tune_tasks'
 * candidates. A tile that is not a fitting, allowed candidate there fails the plan
 * (RDA_ERR_UNSUPPORTED, naming it). */
typedef struct rda_gen_force {
  const char *kind;
  int branch; /* 0-based */
  const char *tile;
} rda_gen_force;

/* rda_gen_plan_ex with `force` (NULL: none). The forced variants have tuned = 1. */
rda_status rda_gen_plan_forced(rda_gen *g, const rda_config *cfg, const rda_hw *hw,
                               unsigned flags, const rda_gen_force *force, rda_plan_k *out,
                               rda_err *err);

enum { RDA_TUNE_MAX_CANDIDATES = 16, RDA_TUNE_NAME = 48 };

/* What there is to tune for a config on hw: one task per distinct key (several branches may
 * share one; `branch` is the first), forward kernels, then with RDA_PLAN_BACKWARD in flags
 * the dK/dV and dQ kernels; RDA_PLAN_WGMMA (or RDA_WGMMA=1) admits the wgmma tiles. */
typedef struct rda_tune_task {
  char kind[16];   /* "fwd", "bwd_dkdv" or "bwd_dq" */
  int branch;      /* 0-based */
  char key[160];   /* one line naming the key, e.g.
                      "sm_90 fwd d128 bf16 causal dense rows2048 mma" */
  int ncandidates; /* >= 1: every fitting, allowed tile of the space, in the space's order */
  char candidates[RDA_TUNE_MAX_CANDIDATES][RDA_TUNE_NAME];
  char chosen[RDA_TUNE_NAME]; /* the tile a plan takes now (databases, else first fitting) */
  int tuned;                  /* 1 when chosen came from a database entry */
} rda_tune_task;

/* *out: malloc'd array of *n tasks (free()). RDA_ERR_UNSUPPORTED when no tile fits (as a plan). */
rda_status rda_gen_tune_tasks(rda_gen *g, const rda_config *cfg, const rda_hw *hw, unsigned flags,
                              rda_tune_task **out, int *n, rda_err *err);

/* A task's measured candidates, fastest first (those that failed their check are left out). */
typedef struct rda_tune_outcome {
  int task; /* index into rda_gen_tune_tasks' array */
  int nranked;
  struct {
    char tile[RDA_TUNE_NAME];
    double us; /* median microseconds of one pass at the measured size */
  } ranked[RDA_TUNE_MAX_CANDIDATES];
} rda_tune_outcome;

/* Where and how the outcomes were measured, written beside each entry. */
typedef struct rda_tune_meta {
  const char *device; /* e.g. "NVIDIA H100 80GB HBM3" or "CPU emulator" */
  const char *date;   /* UTC, "YYYY-MM-DD" */
  long long n, batch;
} rda_tune_meta;

/* The text of a tuning database: the one in old_text (NULL: empty; old_name names it in
 * messages) with the outcomes' entries replacing those of the same key, entries sorted by key
 * (deterministic), as gen/tuning.lua writes and reads it. cfg, hw and flags must be those the
 * tasks were made with. *text: malloc'd (free()). An old_text that does not load or check is
 * RDA_ERR_CONFIG naming old_name; an outcome naming an unknown task or tile, or ranking
 * nothing, RDA_ERR_INVALID_ARGUMENT. */
rda_status rda_gen_tune_merge(rda_gen *g, const rda_config *cfg, const rda_hw *hw, unsigned flags,
                              const char *old_text, const char *old_name,
                              const rda_tune_outcome *outcomes, int noutcomes,
                              const rda_tune_meta *meta, char **text, rda_err *err);

/* Run a trusted Lua script (text only) in the generator's state, with gen/ on the module path:
 * the Lua unit tests under gen/tests/ run this way. A raised error becomes RDA_ERR_INTERNAL
 * with its first line in err; rda_gen_traceback() then holds the whole traceback. */
rda_status rda_gen_run_script(rda_gen *g, const char *path, rda_err *err);

/* The full message and traceback of the last failed call into Lua ("" when none). */
const char *rda_gen_traceback(const rda_gen *g);

#endif
