/* test_tune.c — the autotuner (runtime/tune.c) on the CPU emulator: a real forward and backward
 * tune ranks every candidate and the plans made with the written database take the ranked-first
 * tile; a ranking written by hand steers the plan; branches sharing a key share a task; merging
 * keeps unrelated entries; a corrupt database fails cleanly; and candidates that fail (to load,
 * to compute, or only at the timed size) are reported and left out, through a wrapped backend. */
#include "backend.h"
#include "gen.h"
#include "rda_test.h"
#include "tune.h"
#include "tuning_db.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* ------------------------------------------------------------------ fixture */

/* The generator, the emulator backend with its profile (emulated = 1), and a private tuning
 * database path in RDA_TUNING_DB, so no other test ever sees what these write. */
typedef struct tune_fixture {
  rda_gen *g;
  rda_backend *b;
  rda_hw hw;
  char *dir, *db;
} tune_fixture;

static tune_fixture F;

static char *saved_tuning_db; /* RDA_TUNING_DB as CTest set it, put back at the end */

static int group_setup(void **state) {
  (void)state;
  rda_err err = {0};
  if (rda_gen_open(&F.g, &err) != RDA_OK || rda_backend_emu_open(&F.b, 90, &err) != RDA_OK ||
      rda_backend_hw(F.b, F.g, &F.hw, &err) != RDA_OK) {
    fprintf(stderr, "test_tune: %s\n", err.msg);
    return -1;
  }
  if ((F.dir = rt_mkdtemp()) == NULL) return -1;
  F.db = rt_path(F.dir, "tuning.lua");
  saved_tuning_db = rt_env_save("RDA_TUNING_DB");
  return setenv("RDA_TUNING_DB", F.db, 1) == 0 ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  rt_env_restore("RDA_TUNING_DB", saved_tuning_db);
  if (F.b != NULL) F.b->destroy(F.b);
  rda_gen_close(F.g);
  rt_rmtree(F.dir);
  free(F.dir), free(F.db);
  return 0;
}

/* Every test starts with no database. */
static int no_db(void **state) {
  (void)state;
  unlink(F.db);
  return 0;
}

static rda_config config_of(const char *chunk) {
  rda_config c;
  rda_err err = {0};
  const rda_status s = rda_gen_config_string(F.g, chunk, "test_tune config", &c, &err);
  if (s != RDA_OK) fprintf(stderr, "config: %s\n", err.msg);
  assert_int_equal(s, RDA_OK);
  return c;
}

/* Small problems: head_dim 32 (two candidates per kernel), short segments. */
static const char kFwdConfig[] =
    "return { heads = 2, kv_heads = 1, head_dim = 32, dtype = 'bf16',"
    " segments = { 64 }, dilations = { 1 }, causal = true }";
/* Three forward candidates (head_dim 64 without wgmma), for the majority rule. */
static const char kFwd3Config[] =
    "return { heads = 2, kv_heads = 1, head_dim = 64, dtype = 'bf16',"
    " segments = { 256 }, dilations = { 2 }, causal = false }";
static const char kBwdConfig[] =
    "return { heads = 2, head_dim = 32, dtype = 'fp16',"
    " segments = { 48 }, dilations = { 2 } }";

static rda_tune_opts small_opts(unsigned flags) {
  rda_tune_opts o;
  memset(&o, 0, sizeof o);
  o.n = 160; /* not a multiple of the tiles: ragged last blocks */
  o.batch = 2;
  o.verify_n = 96;
  o.iters = 2;
  o.flags = flags;
  o.seed = 7;
  o.device = "CPU emulator (test)";
  return o;
}

static void write_db(const char *text) {
  rda_err err = {0};
  const rda_status s = rda_tuning_db_write(F.db, text, &err);
  if (s != RDA_OK) fprintf(stderr, "write %s: %s\n", F.db, err.msg);
  assert_int_equal(s, RDA_OK);
}

/* The tile the plan of cfg (with flags) takes for kind on branch br, and whether it is tuned. */
static void plan_tile(const rda_config *cfg, unsigned flags, const char *kind, int br, char *tile,
                      size_t cap, int *tuned) {
  rda_plan_k p;
  rda_err err = {0};
  const rda_status s = rda_gen_plan_ex(F.g, cfg, &F.hw, flags, &p, &err);
  if (s != RDA_OK) fprintf(stderr, "plan: %s\n", err.msg);
  assert_int_equal(s, RDA_OK);
  int v = -1;
  if (strcmp(kind, "fwd") == 0) v = p.steps[br].kernel;
  if (strcmp(kind, "bwd_dkdv") == 0) v = p.bwd_steps[br].dkdv_kernel;
  if (strcmp(kind, "bwd_dq") == 0) v = p.bwd_steps[br].dq_kernel;
  assert_true(v >= 0 && v < p.nvariants);
  assert_string_equal(p.variants[v].kind, kind);
  snprintf(tile, cap, "%s", p.variants[v].tile);
  *tuned = p.variants[v].tuned;
  rda_plan_k_free(&p);
}

static void tasks_of(const rda_config *cfg, unsigned flags, rda_tune_task **t, int *n) {
  rda_err err = {0};
  const rda_status s = rda_gen_tune_tasks(F.g, cfg, &F.hw, flags, t, n, &err);
  if (s != RDA_OK) fprintf(stderr, "tasks: %s\n", err.msg);
  assert_int_equal(s, RDA_OK);
}

/* The tile a hand ranking puts first: the first candidate that plans do not take now. */
static const char *hand_first(const rda_tune_task *t) {
  for (int c = 0; c < t->ncandidates; c++)
    if (strcmp(t->candidates[c], t->chosen) != 0) return t->candidates[c];
  fail_msg("%s: one candidate only", t->key);
  return NULL;
}

/* A database text ranking, for every task of cfg, hand_first's tile first and then the rest in
 * space order, merged into old (may be NULL). */
static char *hand_ranked_db(const rda_config *cfg, unsigned flags, const char *old) {
  rda_tune_task *t = NULL;
  int n = 0;
  tasks_of(cfg, flags, &t, &n);
  rda_tune_outcome *oc = calloc((size_t)n, sizeof *oc);
  assert_non_null(oc);
  for (int i = 0; i < n; i++) {
    const char *first = hand_first(&t[i]);
    oc[i].task = i;
    snprintf(oc[i].ranked[0].tile, RDA_TUNE_NAME, "%s", first);
    oc[i].ranked[0].us = 100.0;
    oc[i].nranked = 1;
    for (int c = 0; c < t[i].ncandidates; c++) {
      if (strcmp(t[i].candidates[c], first) == 0) continue;
      const int r = oc[i].nranked++;
      snprintf(oc[i].ranked[r].tile, RDA_TUNE_NAME, "%s", t[i].candidates[c]);
      oc[i].ranked[r].us = 100.0 + 10.0 * r;
    }
  }
  const rda_tune_meta meta = {"hand", "2026-11-23", 4096, 1};
  char *text = NULL;
  rda_err err = {0};
  const rda_status s =
      rda_gen_tune_merge(F.g, cfg, &F.hw, flags, old, "old.lua", oc, n, &meta, &text, &err);
  if (s != RDA_OK) fprintf(stderr, "merge: %s\n", err.msg);
  assert_int_equal(s, RDA_OK);
  assert_non_null(text);
  free(oc);
  free(t);
  return text;
}

/* A report is sound: every candidate either ranked (us > 0, ascending, each once) or failed. */
static void check_report(const rda_tune_report *r, int want_failed) {
  const rda_tune_outcome *oc = &r->outcome;
  if (oc->nranked + r->nfailed != r->task.ncandidates || r->nfailed != want_failed) {
    fprintf(stderr, "%s: %d ranked, %d failed of %d candidates (wanted %d failed)\n", r->task.key,
            oc->nranked, r->nfailed, r->task.ncandidates, want_failed);
    for (int i = 0; i < r->nfailed; i++) fprintf(stderr, "  failed %s\n", r->failed[i]);
    fail();
  }
  for (int i = 0; i < oc->nranked; i++) {
    assert_true(oc->ranked[i].us > 0);
    if (i > 0) assert_true(oc->ranked[i].us >= oc->ranked[i - 1].us);
    int in_space = 0;
    for (int c = 0; c < r->task.ncandidates; c++)
      in_space += strcmp(oc->ranked[i].tile, r->task.candidates[c]) == 0;
    assert_int_equal(in_space, 1);
    for (int j = 0; j < i; j++) assert_string_not_equal(oc->ranked[i].tile, oc->ranked[j].tile);
  }
}

static rda_status tune(rda_backend *b, const rda_config *cfg, const rda_tune_opts *o,
                       const char *old, char **text, rda_tune_report **reps, int *nreps,
                       rda_err *err) {
  return rda_tune_run(b, F.g, &F.hw, cfg, o, old, "old.lua", text, reps, nreps, err);
}

/* tune() that must succeed (its message printed when it does not). */
static void tune_ok(rda_backend *b, const rda_config *cfg, const rda_tune_opts *o, const char *old,
                    char **text, rda_tune_report **reps, int *nreps) {
  rda_err err = {0};
  const rda_status s = tune(b, cfg, o, old, text, reps, nreps, &err);
  if (s != RDA_OK) fprintf(stderr, "tune: %s\n", err.msg);
  assert_int_equal(s, RDA_OK);
}

/* ------------------------------------------------------------------ real tunes */

static void log_line(void *ud, const char *line) {
  ++*(int *)ud;
  fprintf(stderr, "%s\n", line);
}

/* A forward tune: the one task ranks every candidate; the database it writes (merged into one
 * that holds an entry of another config) names target emu-sm_90, steers the plan to the
 * ranked-first tile, and still steers the other config. */
static void test_tune_forward_ranks_every_candidate_and_steers_the_plan(void **state) {
  (void)state;
  const rda_config cfg = config_of(kFwdConfig);
  const rda_config other = config_of(
      "return { heads = 4, head_dim = 64, dtype = 'fp16',"
      " segments = { 512 }, dilations = { 4 } }");
  rda_tune_task *t = NULL;
  int nt = 0;
  tasks_of(&other, 0, &t, &nt);
  assert_int_equal(nt, 1);
  char other_first[RDA_TUNE_NAME];
  snprintf(other_first, sizeof other_first, "%s", hand_first(&t[0]));
  char *old = hand_ranked_db(&other, 0, NULL);
  rda_tune_opts o = small_opts(0);
  int lines = 0;
  o.log = log_line, o.log_ud = &lines;
  char *text = NULL;
  rda_tune_report *reps = NULL;
  int n = 0;
  tune_ok(F.b, &cfg, &o, old, &text, &reps, &n);
  assert_int_equal(n, 1);
  assert_string_equal(reps[0].task.kind, "fwd");
  assert_true(reps[0].task.ncandidates >= 2);
  check_report(&reps[0], 0);
  assert_int_equal(lines, 1 + reps[0].task.ncandidates); /* the task, then each candidate */
  assert_non_null(strstr(text, "emu-sm_90"));
  assert_non_null(strstr(text, "CPU emulator (test)"));

  write_db(text);
  char tile[64];
  int tuned = 0;
  plan_tile(&cfg, 0, "fwd", 0, tile, sizeof tile, &tuned);
  assert_string_equal(tile, reps[0].outcome.ranked[0].tile);
  assert_int_equal(tuned, 1);
  /* The other config's entry survived the merge: its plan takes its hand-ranked first tile
   * (tasks_of ran before any database was written, so chosen is the default). */
  plan_tile(&other, 0, "fwd", 0, tile, sizeof tile, &tuned);
  assert_string_equal(tile, other_first);
  assert_int_equal(tuned, 1);
  free(t), free(reps), free(text), free(old);
}

/* A backward tune ranks the forward, dK/dV and dQ kernels, every candidate of each. */
static void test_tune_backward_ranks_dkdv_and_dq(void **state) {
  (void)state;
  const rda_config cfg = config_of(kBwdConfig);
  const rda_tune_opts o = small_opts(RDA_PLAN_BACKWARD);
  char *text = NULL;
  rda_tune_report *reps = NULL;
  int n = 0;
  tune_ok(F.b, &cfg, &o, NULL, &text, &reps, &n);
  assert_int_equal(n, 3);
  assert_string_equal(reps[0].task.kind, "fwd");
  assert_string_equal(reps[1].task.kind, "bwd_dkdv");
  assert_string_equal(reps[2].task.kind, "bwd_dq");
  for (int i = 0; i < n; i++) check_report(&reps[i], 0);
  write_db(text);
  const char *kinds[3] = {"fwd", "bwd_dkdv", "bwd_dq"};
  for (int i = 0; i < 3; i++) {
    char tile[64];
    int tuned = 0;
    plan_tile(&cfg, RDA_PLAN_BACKWARD, kinds[i], 0, tile, sizeof tile, &tuned);
    assert_string_equal(tile, reps[i].outcome.ranked[0].tile);
    assert_int_equal(tuned, 1);
  }
  free(reps), free(text);
}

/* ------------------------------------------------------------------ rankings by hand */

/* A ranking that puts another candidate than the default first steers the plan to it; before
 * the database is written the plan takes the default, untuned. */
static void test_tune_hand_ranking_steers_the_plan(void **state) {
  (void)state;
  const rda_config cfg = config_of(kBwdConfig);
  rda_tune_task *t = NULL;
  int n = 0;
  tasks_of(&cfg, RDA_PLAN_BACKWARD, &t, &n);
  assert_int_equal(n, 3);
  char *text = hand_ranked_db(&cfg, RDA_PLAN_BACKWARD, NULL);
  for (int i = 0; i < n; i++) {
    char tile[64];
    int tuned = 1;
    plan_tile(&cfg, RDA_PLAN_BACKWARD, t[i].kind, 0, tile, sizeof tile, &tuned);
    assert_string_equal(tile, t[i].chosen); /* no database yet: the default */
    assert_int_equal(tuned, 0);
  }
  write_db(text);
  rda_tune_task *t2 = NULL;
  int n2 = 0;
  tasks_of(&cfg, RDA_PLAN_BACKWARD, &t2, &n2);
  assert_int_equal(n2, n);
  for (int i = 0; i < n; i++) {
    const char *first = hand_first(&t[i]);
    char tile[64];
    int tuned = 0;
    plan_tile(&cfg, RDA_PLAN_BACKWARD, t[i].kind, 0, tile, sizeof tile, &tuned);
    assert_string_equal(tile, first);
    assert_int_equal(tuned, 1);
    assert_string_equal(t2[i].chosen, first); /* the tasks say what plans take now */
  }
  free(t), free(t2), free(text);
}

/* Two branches with the same key (rows ceil(w / r) = 32, both dilated) are one task; a third
 * with another key is its own. The ranking steers both branches of the shared key. */
static void test_tune_branches_sharing_a_key_are_one_task(void **state) {
  (void)state;
  const rda_config cfg = config_of(
      "return { heads = 2, head_dim = 32, dtype = 'bf16',"
      " segments = { 64, 128, 64 }, dilations = { 2, 4, 1 } }");
  rda_tune_task *t = NULL;
  int n = 0;
  tasks_of(&cfg, 0, &t, &n);
  assert_int_equal(n, 2);
  assert_int_equal(t[0].branch, 0);
  assert_int_equal(t[1].branch, 2);
  assert_string_not_equal(t[0].key, t[1].key);
  char *text = hand_ranked_db(&cfg, 0, NULL);
  write_db(text);
  const int task_of_branch[3] = {0, 0, 1};
  for (int br = 0; br < 3; br++) {
    const rda_tune_task *k = &t[task_of_branch[br]];
    char tile[64];
    int tuned = 0;
    plan_tile(&cfg, 0, "fwd", br, tile, sizeof tile, &tuned);
    assert_string_equal(tile, hand_first(k));
    assert_int_equal(tuned, 1);
  }
  free(t), free(text);
}

/* A corrupt database: the tuner fails with RDA_ERR_CONFIG naming it and returns nothing, both
 * when it is the text to merge into and when it is the one plans read. */
static void test_tune_corrupt_database_is_a_config_error(void **state) {
  (void)state;
  const rda_config cfg = config_of(kFwdConfig);
  const rda_tune_opts o = small_opts(0);
  char *text = (char *)1;
  rda_tune_report *reps = (rda_tune_report *)1;
  int n = 5;
  rda_err err = {0};
  assert_int_equal(tune(F.b, &cfg, &o, "return { { target = 1 } }", &text, &reps, &n, &err),
                   RDA_ERR_CONFIG);
  assert_non_null(strstr(err.msg, "old.lua"));
  assert_null(text), assert_null(reps), assert_int_equal(n, 0);

  write_db("return {");
  rda_err err2 = {0};
  assert_int_equal(tune(F.b, &cfg, &o, NULL, &text, &reps, &n, &err2), RDA_ERR_CONFIG);
  assert_non_null(strstr(err2.msg, "tuning.lua"));
  assert_null(text), assert_null(reps);
}

/* ------------------------------------------------------------------ failing candidates */

/* The emulator backend with a saboteur: the module of the `victim` tile either fails to load
 * (SAB_LOAD), or is never launched (SAB_SKIP, its outputs stay as poisoned/initialized), or is
 * launched only for its first `keep` launches (SAB_LATER: right at the verify size, NaN at the
 * timed one), or after its first `keep` launches runs with its softmax scale off by half
 * (SAB_SCALE, forward only: right at the verify size, finite but wrong at the timed one).
 * victim "*" sabotages every tile of `kind`. */
enum { SAB_LOAD, SAB_SKIP, SAB_LATER, SAB_SCALE };
typedef struct saboteur {
  rda_backend b; /* the emulator's table with load and launch replaced; first member */
  rda_backend *inner;
  const char *kind, *victim;
  int mode, keep, launches;
  int nmods;
  rda_module *mods[16];
} saboteur;

static int sab_is_victim(const saboteur *s, const rda_variant *v) {
  return strcmp(v->kind, s->kind) == 0 &&
         (strcmp(s->victim, "*") == 0 || strcmp(v->tile, s->victim) == 0);
}

static rda_status sab_load(rda_backend *b, const rda_variant *v, rda_module **out, rda_err *err) {
  saboteur *s = (saboteur *)(void *)b;
  if (s->mode == SAB_LOAD && sab_is_victim(s, v))
    return rda_err_set(err, RDA_ERR_CUDA, "injected load failure of %s", v->name);
  const rda_status st = s->inner->load(s->inner, v, out, err);
  if (st == RDA_OK && sab_is_victim(s, v) && s->nmods < 16) s->mods[s->nmods++] = *out;
  return st;
}

static rda_status sab_launch(rda_backend *b, rda_module *m, const unsigned grid[3],
                             unsigned threads, unsigned smem, const void *params, size_t bytes,
                             rda_err *err) {
  saboteur *s = (saboteur *)(void *)b;
  for (int i = 0; i < s->nmods; i++) {
    if (s->mods[i] != m) continue;
    if (s->mode == SAB_SKIP) return RDA_OK;
    if (s->launches++ < s->keep) break;
    if (s->mode == SAB_LATER) return RDA_OK;
    if (s->mode == SAB_SCALE && bytes == sizeof(rda_fwd_params)) {
      rda_fwd_params wrong;
      memcpy(&wrong, params, sizeof wrong);
      wrong.scale_log2 *= 1.5f;
      return s->inner->launch(s->inner, m, grid, threads, smem, &wrong, sizeof wrong, err);
    }
  }
  return s->inner->launch(s->inner, m, grid, threads, smem, params, bytes, err);
}

/* A module the backend frees may come back at the same address for the next candidate: forget
 * it, so only the victim's own modules are ever sabotaged. */
static void sab_unload(rda_backend *b, rda_module *m) {
  saboteur *s = (saboteur *)(void *)b;
  for (int i = 0; i < s->nmods; i++)
    if (s->mods[i] == m) s->mods[i--] = s->mods[--s->nmods];
  s->inner->unload(s->inner, m);
}

static void sab_init(saboteur *s, const char *kind, const char *victim, int mode) {
  memset(s, 0, sizeof *s);
  s->b = *F.b;
  s->inner = F.b;
  s->b.load = sab_load;
  s->b.launch = sab_launch;
  s->b.unload = sab_unload;
  s->kind = kind, s->victim = victim, s->mode = mode;
}

/* The victim of a task: its current tile (which the tuner runs first) or the first other. */
static const char *victim_of(const rda_tune_task *t, int chosen) {
  for (int c = 0; c < t->ncandidates; c++)
    if ((strcmp(t->candidates[c], t->chosen) == 0) == (chosen != 0)) return t->candidates[c];
  fail_msg("task %s has no %s candidate", t->key, chosen ? "chosen" : "other");
  return NULL;
}

/* Tune `chunk` (backward kinds: with the backward) on a saboteur; the victim (the task's chosen
 * tile, or another) fails and is left out, with a "tile: step: why" line naming `why`; the
 * others are ranked. */
static void expect_victim_fails(const char *chunk, const char *kind, int mode, int chosen,
                                int keep, const char *why) {
  const int bwd = strcmp(kind, "fwd") != 0;
  const rda_config cfg = config_of(chunk);
  const unsigned flags = bwd ? RDA_PLAN_BACKWARD : 0u;
  rda_tune_task *t = NULL;
  int nt = 0;
  tasks_of(&cfg, flags, &t, &nt);
  int ti = 0;
  while (ti < nt && strcmp(t[ti].kind, kind) != 0) ti++;
  assert_true(ti < nt && t[ti].ncandidates > 1);
  saboteur s;
  sab_init(&s, kind, victim_of(&t[ti], chosen), mode);
  s.keep = keep;
  const rda_tune_opts o = small_opts(flags);
  char *text = NULL;
  rda_tune_report *reps = NULL;
  int n = 0;
  tune_ok(&s.b, &cfg, &o, NULL, &text, &reps, &n);
  assert_int_equal(n, nt);
  for (int i = 0; i < n; i++) check_report(&reps[i], i == ti ? 1 : 0);
  const rda_tune_report *r = &reps[ti];
  const size_t vlen = strlen(s.victim);
  if (strncmp(r->failed[0], s.victim, vlen) != 0 || r->failed[0][vlen] != ':' ||
      strstr(r->failed[0], why) == NULL) {
    fprintf(stderr, "failure line '%s': wanted '%s: ...%s...'\n", r->failed[0], s.victim, why);
    fail();
  }
  for (int i = 0; i < r->outcome.nranked; i++)
    assert_string_not_equal(r->outcome.ranked[i].tile, s.victim);
  /* The database ranks only what passed: the plan never takes the victim. */
  write_db(text);
  char tile[64];
  int tuned = 0;
  plan_tile(&cfg, flags, kind, 0, tile, sizeof tile, &tuned);
  assert_string_equal(tile, r->outcome.ranked[0].tile);
  free(t), free(reps), free(text);
}

/* The victim (chosen or not) is right at the verify size and wrong at the timed one in a way
 * the tiles' majority cannot settle: the tune fails, saying so, and ranks nothing. */
static void expect_disagreement_fails(const char *chunk, int mode, int chosen) {
  const rda_config cfg = config_of(chunk);
  rda_tune_task *t = NULL;
  int nt = 0;
  tasks_of(&cfg, 0, &t, &nt);
  saboteur s;
  sab_init(&s, "fwd", victim_of(&t[0], chosen), mode);
  s.keep = 1;
  const rda_tune_opts o = small_opts(0);
  char *text = NULL;
  rda_tune_report *reps = NULL;
  int n = 0;
  rda_err err = {0};
  assert_int_equal(tune(&s.b, &cfg, &o, NULL, &text, &reps, &n, &err), RDA_ERR_INTERNAL);
  if (strstr(err.msg, "cannot tell which are right") == NULL || strstr(err.msg, t[0].key) == NULL) {
    fprintf(stderr, "message: %s\n", err.msg);
    fail();
  }
  assert_null(text), assert_null(reps), assert_int_equal(n, 0);
  free(t);
}

static void test_tune_candidate_failing_to_load_is_reported_and_left_out(void **state) {
  (void)state;
  expect_victim_fails(kFwdConfig, "fwd", SAB_LOAD, 0, 0, "load: injected load failure");
}

/* A kernel that never runs leaves the poisoned NaN outputs: the reference check fails it. */
static void test_tune_candidate_with_wrong_results_is_reported_and_left_out(void **state) {
  (void)state;
  expect_victim_fails(kFwdConfig, "fwd", SAB_SKIP, 0, 0, "verify: wrong at n=96");
  /* Not dQ's default tile: the dK/dV candidates are checked with it. */
  expect_victim_fails(kBwdConfig, "bwd_dq", SAB_SKIP, 0, 0, "verify: wrong at n=96: dQ");
}

/* Right at the verify size (its first launch runs), wrong at the timed one. Among three tiles,
 * one with broken outputs (its skipped launches leave the init's zeros on covered rows) or one
 * that disagrees with the other two is left out. The tile plans take now runs first and
 * has nothing to agree with, but its timed-size outputs must match SPEC §1's coverage: with its
 * launches skipped, the dilated branch's covered rows keep the init's 0 and -inf. The next tile
 * then is the one the others must agree with, and they are ranked. */
static void test_tune_candidate_wrong_only_at_the_timed_size_fails_the_cross_check(void **state) {
  (void)state;
  expect_victim_fails(kFwd3Config, "fwd", SAB_LATER, 0, 1, "cross-check: at n=160 batch 2: ");
  expect_victim_fails(kFwd3Config, "fwd", SAB_SCALE, 0, 1,
                      "cross-check: at n=160 batch 2 disagrees");
  expect_victim_fails(kFwd3Config, "fwd", SAB_LATER, 1, 1, "cross-check: at n=160 batch 2: ");
}

/* A tile whose timed-size outputs are plainly broken (NaN) is its own fault, not a
 * disagreement to settle: with two candidates it is left out and the other ranked. */
static void test_tune_broken_tile_is_no_disagreement(void **state) {
  (void)state;
  expect_victim_fails(kFwdConfig, "fwd", SAB_LATER, 0, 1, "cross-check: at n=160 batch 2: ");
}

/* The tile that runs first (the one plans take now) finite but wrong at the timed size: both
 * others disagree with it, and no majority says which side is right, so nothing is ranked
 * (before, the two right tiles were thrown out and the wrong one ranked alone). With two
 * candidates, any disagreement is such a tie. */
static void test_tune_disagreement_without_a_majority_fails_the_task(void **state) {
  (void)state;
  expect_disagreement_fails(kFwd3Config, SAB_SCALE, 1);
  expect_disagreement_fails(kFwdConfig, SAB_SCALE, 0);
  expect_disagreement_fails(kFwdConfig, SAB_SCALE, 1);
}

/* rda_tune_save merges into the file as it is when it saves: an entry another run wrote
 * while this one timed is kept beside this run's. */
static void test_tune_save_keeps_what_another_run_wrote_meanwhile(void **state) {
  (void)state;
  const rda_config cfg = config_of(kFwdConfig), other = config_of(kFwd3Config);
  const rda_tune_opts o = small_opts(0);
  char *text = NULL;
  rda_tune_report *reps = NULL;
  int n = 0;
  rda_err err = {0};
  assert_int_equal(tune(F.b, &cfg, &o, NULL, &text, &reps, &n, &err), RDA_OK);
  /* Meanwhile, another run: a hand ranking of another config lands in the file. */
  char *hand = hand_ranked_db(&other, 0, NULL);
  write_db(hand);
  assert_int_equal(rda_tune_save(F.g, &F.hw, &cfg, &o, reps, n, F.db, &err), RDA_OK);
  size_t len = 0;
  char *saved = rt_read_file(F.db, &len);
  assert_non_null(saved);
  assert_non_null(strstr(saved, "head_dim = 64")); /* the other run's entry */
  assert_non_null(strstr(saved, "head_dim = 32")); /* this run's */
  char tile[64];
  int tuned = 0;
  plan_tile(&cfg, 0, "fwd", 0, tile, sizeof tile, &tuned);
  assert_string_equal(tile, reps[0].outcome.ranked[0].tile);
  assert_int_equal(tuned, 1);
  free(text), free(reps), free(hand), free(saved);
}

/* No candidate passes: RDA_ERR_INTERNAL naming the task's key and every failure. */
static void test_tune_no_candidate_passing_is_an_error(void **state) {
  (void)state;
  const rda_config cfg = config_of(kFwdConfig);
  rda_tune_task *t = NULL;
  int nt = 0;
  tasks_of(&cfg, 0, &t, &nt);
  saboteur s;
  sab_init(&s, "fwd", "*", SAB_LOAD);
  const rda_tune_opts o = small_opts(0);
  char *text = NULL;
  rda_tune_report *reps = NULL;
  int n = 0;
  rda_err err = {0};
  assert_int_equal(tune(&s.b, &cfg, &o, NULL, &text, &reps, &n, &err), RDA_ERR_INTERNAL);
  assert_non_null(strstr(err.msg, t[0].key));
  assert_non_null(strstr(err.msg, "no candidate passed"));
  for (int c = 0; c < t[0].ncandidates; c++) assert_non_null(strstr(err.msg, t[0].candidates[c]));
  assert_null(text), assert_null(reps), assert_int_equal(n, 0);
  free(t);
}

/* Bad options are refused before anything runs. */
static void test_tune_rejects_bad_options(void **state) {
  (void)state;
  const rda_config cfg = config_of(kFwdConfig);
  const rda_tune_opts good = small_opts(0);
  rda_tune_opts bad[4] = {good, good, good, good};
  bad[0].n = 0, bad[1].batch = -1, bad[2].iters = 0, bad[3].verify_n = -5;
  for (int i = 0; i < 4; i++) {
    char *text = NULL;
    rda_tune_report *reps = NULL;
    int n = 0;
    rda_err err = {0};
    assert_int_equal(tune(F.b, &cfg, &bad[i], NULL, &text, &reps, &n, &err),
                     RDA_ERR_INVALID_ARGUMENT);
    assert_null(text);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_tune_forward_ranks_every_candidate_and_steers_the_plan, no_db),
      cmocka_unit_test_setup(test_tune_backward_ranks_dkdv_and_dq, no_db),
      cmocka_unit_test_setup(test_tune_hand_ranking_steers_the_plan, no_db),
      cmocka_unit_test_setup(test_tune_branches_sharing_a_key_are_one_task, no_db),
      cmocka_unit_test_setup(test_tune_corrupt_database_is_a_config_error, no_db),
      cmocka_unit_test_setup(test_tune_candidate_failing_to_load_is_reported_and_left_out, no_db),
      cmocka_unit_test_setup(test_tune_candidate_with_wrong_results_is_reported_and_left_out,
                             no_db),
      cmocka_unit_test_setup(test_tune_candidate_wrong_only_at_the_timed_size_fails_the_cross_check,
                             no_db),
      cmocka_unit_test_setup(test_tune_broken_tile_is_no_disagreement, no_db),
      cmocka_unit_test_setup(test_tune_disagreement_without_a_majority_fails_the_task, no_db),
      cmocka_unit_test_setup(test_tune_save_keeps_what_another_run_wrote_meanwhile, no_db),
      cmocka_unit_test_setup(test_tune_no_candidate_passing_is_an_error, no_db),
      cmocka_unit_test_setup(test_tune_rejects_bad_options, no_db),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
