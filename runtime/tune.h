/* tune.h — the autotuner (`rdagen tune`): for each tuning task of a config (runtime/gen.h), it
 * plans every candidate tile (rda_gen_plan_forced) on a one-branch copy of the config, checks
 * the candidate against the float64 reference at a small size, times it at the requested size
 * on the backend, and merges the ranking into the user's tuning database. */
#ifndef RDA_TUNE_H
#define RDA_TUNE_H

#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "err.h"
#include "gen.h"
#include "hw.h"

typedef struct rda_tune_opts {
  long long n, batch; /* the timed problem: [batch, n, heads, head_dim] */
  long long verify_n; /* rows of the reference check (batch 1); 0: min(n, 1024) */
  int iters;          /* timed passes per candidate, queued back to back after one untimed
                         (median of their times); 1..100000 */
  unsigned flags;     /* RDA_PLAN_BACKWARD: tune the dK/dV and dQ kernels too;
                         RDA_PLAN_WGMMA: admit the wgmma tiles */
  uint64_t seed;      /* of the random inputs */
  const char *device; /* written with each entry (NULL: the GPU's name, or "CPU emulator") */
  int untuned_only;   /* tune only the tasks whose tile no database entry gives now */
  /* One line per finished candidate and per task (may be NULL). */
  void (*log)(void *ud, const char *line);
  void *log_ud;
} rda_tune_opts;

/* One task's results, for the caller's report. */
typedef struct rda_tune_report {
  rda_tune_task task;
  rda_tune_outcome outcome; /* ranked candidates, fastest first */
  int nfailed;
  char failed[RDA_TUNE_MAX_CANDIDATES + 1][RDA_TUNE_NAME + 160]; /* "tile: why", and
                                    why the task ranks none when its tiles disagree */
} rda_tune_report;

/* Tune cfg on backend b (hw its profile) and merge the outcomes into the database text
 * old_text (NULL: none; old_name for messages): *db_text (malloc'd) is the new text, *reports
 * (malloc'd, *nreports) what happened per task. Writes nothing to disk. A task none of whose
 * candidates passes is RDA_ERR_INTERNAL naming it (and every candidate's failure).
 * Per task, on a one-branch copy of cfg (the task's branch): the inputs are normal(0, 1) draws
 * of o->seed rounded to the dtype (with the backward, a random dLSE too), the same for every
 * task; each candidate is planned with its tile forced, loaded (compiled or from the kernel
 * cache), checked at verify_n rows against the float64 reference (outputs NaN-poisoned first),
 * timed at (n, batch) (a backward candidate: rda_bwd_run alone, deterministic), and its outputs
 * there compared with the first passing candidate's under twice the SPEC §5 tolerances. The
 * tile plans take now (task.chosen) runs first, so it is that first one. Any failure of a
 * candidate lands in its report's `failed` and leaves it out of the ranking; when at least as
 * many tiles disagree with the first at the timed size as agree with it, the task ranks none
 * (which one is right is unknown there) and fails.
 * With offsets = "group" the copy runs all heads on the task's branch (offset 0): the same
 * kernels on more heads than the full config gives that branch.
 * A bad old_text (RDA_ERR_CONFIG) or bad options (RDA_ERR_INVALID_ARGUMENT) fail before any
 * kernel runs. On failure *db_text and *reports are NULL and *nreports 0. */
rda_status rda_tune_run(rda_backend *b, rda_gen *g, const rda_hw *hw, const rda_config *cfg,
                        const rda_tune_opts *o, const char *old_text, const char *old_name,
                        char **db_text, rda_tune_report **reports, int *nreports, rda_err *err);

/* The reports of rda_tune_run (same g, hw, cfg and o) merged into old_text instead: what a
 * writer does under rda_tuning_db_lock with the database as it is by then, so entries another
 * run wrote meanwhile are kept. *db_text malloc'd; errors as rda_gen_tune_merge's. */
rda_status rda_tune_merge(rda_gen *g, const rda_hw *hw, const rda_config *cfg,
                          const rda_tune_opts *o, const rda_tune_report *reports, int nreports,
                          const char *old_text, const char *old_name, char **db_text,
                          rda_err *err);

/* The timed size and passes rdagen tune and RDA_PLAN_AUTOTUNE use unless told: N twice the
 * longest segment within [1024, 65536] (1024 on the emulator), 10 passes (3 on the emulator). */
long long rda_tune_default_n(const rda_config *cfg, const rda_hw *hw);
int rda_tune_default_iters(const rda_hw *hw);

/* Merge reports into the database file at `path` and replace it (rda_tuning_db_write), under
 * the writers' lock and with the file as it is by then, so entries another run wrote while
 * this one timed are kept. Errors as rda_tuning_db_* and rda_tune_merge's; the file is left as
 * it was on any failure. */
rda_status rda_tune_save(rda_gen *g, const rda_hw *hw, const rda_config *cfg,
                         const rda_tune_opts *o, const rda_tune_report *reports, int nreports,
                         const char *path, rda_err *err);
/* rda_tune_save for a caller that holds rda_tuning_db_lock(path) already: tuners that hold it
 * from before they list their tasks until they have saved run one at a time, so a second one
 * finds the first one's entries (and tunes nothing twice) and neither skews the other's
 * timings. */
rda_status rda_tune_save_locked(rda_gen *g, const rda_hw *hw, const rda_config *cfg,
                                const rda_tune_opts *o, const rda_tune_report *reports,
                                int nreports, const char *path, rda_err *err);

#endif
