/* test_gen.c — the generator through its C API: the Lua unit tests under gen/tests/ run in the
 * embedded interpreter, built-in hardware profiles, plans copied into rda_plan_k (steps,
 * variants, sources), the tuning-file switch, and failures reported as one line. */
/* cmocka.h needs these four first. */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gen.h"
#include "rda_test.h"
#include "rda_test_backend.h"

/* Every Lua test file; test_gen_every_lua_test_is_registered keeps this list complete. */
static const char *const lua_tests[] = {"test_config.lua", "test_emit.lua", "test_hw.lua",
                                        "test_plan.lua", "test_tuning.lua"};
enum { n_lua_tests = sizeof lua_tests / sizeof lua_tests[0] };

static void run_lua_test(void **state, const char *file) {
  rda_gen *g = *state;
  char path[4096];
  snprintf(path, sizeof path, "%s/gen/tests/%s", rda_gen_home(), file);
  rda_err err = {0};
  const rda_status s = rda_gen_run_script(g, path, &err);
  if (s != RDA_OK) fail_msg("%s: %s\n%s", file, err.msg, rda_gen_traceback(g));
}

static void test_gen_lua_config(void **state) {
  run_lua_test(state, "test_config.lua");
}
static void test_gen_lua_emit(void **state) {
  run_lua_test(state, "test_emit.lua");
}
static void test_gen_lua_hw(void **state) {
  run_lua_test(state, "test_hw.lua");
}
static void test_gen_lua_plan(void **state) {
  run_lua_test(state, "test_plan.lua");
}
static void test_gen_lua_tuning(void **state) {
  run_lua_test(state, "test_tuning.lua");
}

static void test_gen_every_lua_test_is_registered(void **state) {
  (void)state;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/gen/tests", rda_gen_home());
  DIR *d = opendir(dir);
  assert_non_null(d);
  int found = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    const size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 4, ".lua") != 0) continue;
    int listed = 0;
    for (int i = 0; i < n_lua_tests; i++) listed |= strcmp(lua_tests[i], e->d_name) == 0;
    if (!listed) fail_msg("gen/tests/%s is not run by tests/test_gen.c", e->d_name);
    found++;
  }
  closedir(d);
  assert_int_equal(found, n_lua_tests);
}

static void test_gen_run_script_reports_failure_with_location(void **state) {
  rda_gen *g = *state;
  char path[] = "/tmp/rda_gen_failXXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char text[] = "local x = 1\nassert(x == 2, 'x is not two')\n";
  assert_int_equal(write(fd, text, sizeof text - 1), (long)(sizeof text - 1));
  close(fd);
  rda_err err = {0};
  assert_int_equal(rda_gen_run_script(g, path, &err), RDA_ERR_INTERNAL);
  unlink(path);
  assert_non_null(strstr(err.msg, ":2: x is not two"));
  assert_null(strchr(err.msg, '\n'));
  assert_non_null(strstr(rda_gen_traceback(g), "stack traceback"));
}

static void test_gen_run_script_rejects_missing_file(void **state) {
  rda_err err = {0};
  assert_int_equal(rda_gen_run_script(*state, "/nonexistent/rda.lua", &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, "/nonexistent/rda.lua"));
}

static void test_gen_hw_builtin_profiles(void **state) {
  rda_gen *g = *state;
  rda_err err = {0};
  rda_hw hw;
  assert_int_equal(rda_gen_hw_builtin(g, 80, &hw, &err), RDA_OK);
  assert_int_equal(hw.arch, 80);
  assert_int_equal(hw.sm_count, 108);
  assert_int_equal(hw.smem_per_block, 166912);
  assert_int_equal(hw.smem_per_sm, 167936);
  assert_int_equal(hw.regs_per_sm, 65536);
  assert_int_equal(hw.regs_per_block, 65536);
  assert_int_equal(hw.max_threads_per_sm, 2048);
  assert_int_equal(hw.live, 0);
  assert_string_equal(hw.name, "sm_80 (built-in)");
  assert_int_equal(rda_gen_hw_builtin(g, 86, &hw, &err), RDA_OK);
  assert_int_equal(hw.smem_per_block, 101376);
  assert_int_equal(hw.max_threads_per_sm, 1536);
  assert_int_equal(rda_gen_hw_builtin(g, 89, &hw, &err), RDA_OK);
  assert_int_equal(hw.sm_count, 128);
  assert_int_equal(rda_gen_hw_builtin(g, 90, &hw, &err), RDA_OK);
  assert_int_equal(hw.sm_count, 132);
  assert_int_equal(hw.smem_per_block, 232448);
  assert_int_equal(hw.smem_per_sm, 233472);
}

static void test_gen_hw_unknown_arch_lists_known(void **state) {
  rda_err err = {0};
  rda_hw hw;
  assert_int_equal(rda_gen_hw_builtin(*state, 75, &hw, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "sm_75"));
  assert_non_null(
      strstr(err.msg, "sm_80, sm_86, sm_87, sm_89, sm_90, sm_100, sm_103, sm_120, sm_121"));
}

static void load_config(rda_gen *g, const char *text, rda_config *c) {
  rda_err err = {0};
  if (rda_gen_config_string(g, text, "t.lua", c, &err) != RDA_OK) fail_msg("%s", err.msg);
}

static void plan_for(rda_gen *g, const char *text, int arch, rda_plan_k *p) {
  rda_config c;
  rda_hw hw;
  rda_err err = {0};
  load_config(g, text, &c);
  assert_int_equal(rda_gen_hw_builtin(g, arch, &hw, &err), RDA_OK);
  if (rda_gen_plan(g, &c, &hw, p, &err) != RDA_OK) fail_msg("%s", err.msg);
}

static void test_gen_plan_default_config(void **state) {
  rda_gen *g = *state;
  char path[4096];
  snprintf(path, sizeof path, "%s/configs/default.lua", rda_gen_home());
  rda_config c;
  rda_hw hw;
  rda_plan_k p;
  rda_err err = {0};
  assert_int_equal(rda_gen_config_file(g, path, &c, &err), RDA_OK);
  assert_int_equal(rda_gen_hw_builtin(g, 90, &hw, &err), RDA_OK);
  assert_int_equal(rda_gen_plan(g, &c, &hw, &p, &err), RDA_OK);
  assert_int_equal(p.nsteps, c.nbranch);
  assert_int_equal(p.cfg.heads, c.heads);
  assert_int_equal(p.hw.arch, 90);
  for (int i = 0; i < p.nsteps; i++) {
    const rda_step *s = &p.steps[i];
    assert_int_equal(s->branch, i);
    assert_int_equal(s->head0, 0);
    assert_int_equal(s->nheads, c.heads);
    assert_in_range(s->kernel, 0, p.nvariants - 1);
    const rda_variant *v = &p.variants[s->kernel];
    assert_string_equal(v->kind, "fwd");
    assert_true(strncmp(v->name, "rda_fwd_d64_bf16_causal_", 24) == 0);
    assert_non_null(strstr(v->name, c.dilations[i] > 1 ? "_dil_" : "_dense_"));
    assert_true(v->smem_bytes > 0 && v->smem_bytes <= hw.smem_per_block);
    assert_true(v->smem_bytes >= 2 * 64 * (v->block_m + 2 * v->block_n)); /* stages >= 1 */
    assert_int_equal(v->threads, 2 * v->block_m); /* 32 * warps, block_m = 16 * warps */
    assert_non_null(strstr(v->source, v->name));
    assert_non_null(strstr(v->source, "static constexpr int head_dim = 64;"));
  }
  assert_string_equal(p.variants[p.init_kernel].name, "rda_init");
  assert_string_equal(p.variants[p.init_kernel].kind, "init");
  assert_int_equal(p.variants[p.init_kernel].threads, 256);
  assert_int_equal(p.variants[p.init_kernel].smem_bytes, 0);
  assert_string_equal(p.variants[p.cast_kernel].name, "rda_cast_bf16");
  assert_string_equal(p.variants[p.cast_kernel].kind, "cast");
  assert_non_null(strstr(p.variants[p.cast_kernel].source, "rda::cast_kernel<"));
  for (int i = 0; i < p.nvariants; i++)
    for (int j = i + 1; j < p.nvariants; j++)
      assert_string_not_equal(p.variants[i].name, p.variants[j].name);
  rda_plan_k_free(&p);
  assert_int_equal(p.nvariants, 0);
  rda_plan_k_free(&p); /* twice is harmless */
  rda_plan_k_free(NULL);
}

static void test_gen_plan_group_steps_match_config_heads(void **state) {
  rda_plan_k p;
  plan_for(*state,
           "return { heads = 7, head_dim = 32, dtype = 'fp16', offsets = 'group',"
           " segments = { 16, 32, 64 }, dilations = { 1, 2, 4 } }",
           80, &p);
  assert_int_equal(p.nsteps, 3);
  int covered[7] = {0};
  for (int i = 0; i < p.nsteps; i++) {
    int h0, n;
    rda_config_branch_heads(&p.cfg, i, &h0, &n);
    assert_int_equal(p.steps[i].head0, h0);
    assert_int_equal(p.steps[i].nheads, n);
    for (int h = h0; h < h0 + n; h++) covered[h]++;
  }
  for (int h = 0; h < 7; h++) assert_int_equal(covered[h], 1);
  assert_string_equal(p.variants[p.cast_kernel].name, "rda_cast_fp16");
  rda_plan_k_free(&p);
}

static void test_gen_plan_dedups_equal_specializations(void **state) {
  rda_plan_k p;
  plan_for(*state,
           "return { heads = 4, head_dim = 128, dtype = 'bf16',"
           " segments = { 4096, 8192, 16384 }, dilations = { 2, 4, 8 } }",
           90, &p);
  /* one fwd, its ring-round twin, init, cast, ring pack, ring add */
  assert_int_equal(p.nvariants, 6);
  assert_int_equal(p.steps[0].kernel, p.steps[1].kernel);
  assert_int_equal(p.steps[1].kernel, p.steps[2].kernel);
  assert_int_equal(p.steps[0].ring_kernel, p.steps[1].ring_kernel);
  assert_int_equal(p.steps[1].ring_kernel, p.steps[2].ring_kernel);
  const rda_variant *fv = &p.variants[p.steps[0].kernel], *kt = &p.variants[p.steps[0].ring_kernel];
  const size_t fl = strlen(fv->name);
  assert_int_equal(strncmp(kt->name, fv->name, fl), 0);
  assert_string_equal(kt->name + fl, "_kt");
  assert_int_equal(kt->smem_bytes, fv->smem_bytes);
  assert_int_equal(kt->block_m, fv->block_m);
  rda_plan_k_free(&p);
}

/* The backward steps carry their kv-table twins (read from the plan's Lua table) where the
 * forward has one, -1 elsewhere: same tiles and smem, the base name plus "_kt". */
static void test_gen_plan_backward_ring_twins(void **state) {
  rda_config c;
  rda_hw hw;
  rda_err err = {0};
  rda_plan_k p;
  load_config(*state,
              "return { heads = 8, kv_heads = 4, head_dim = 64, dtype = 'bf16',"
              " segments = { 2048, 4096, 8192 }, dilations = { 1, 2, 4 } }",
              &c);
  assert_int_equal(rda_gen_hw_builtin(*state, 90, &hw, &err), RDA_OK);
  if (rda_gen_plan_ex(*state, &c, &hw, RDA_PLAN_BACKWARD, &p, &err) != RDA_OK)
    fail_msg("%s", err.msg);
  assert_int_equal(p.has_bwd, 1);
  for (int i = 0; i < p.nsteps; ++i) {
    const rda_bwd_step *s = &p.bwd_steps[i];
    if (p.steps[i].ring_kernel < 0) {
      assert_int_equal(s->dkdv_ring_kernel, -1);
      assert_int_equal(s->dq_ring_kernel, -1);
      continue;
    }
    const int base[2] = {s->dkdv_kernel, s->dq_kernel},
              twin[2] = {s->dkdv_ring_kernel, s->dq_ring_kernel};
    for (int k = 0; k < 2; ++k) {
      assert_true(twin[k] >= 0 && twin[k] < p.nvariants && twin[k] != base[k]);
      const rda_variant *bv = &p.variants[base[k]], *tv = &p.variants[twin[k]];
      const size_t bl = strlen(bv->name);
      assert_int_equal(strncmp(tv->name, bv->name, bl), 0);
      assert_string_equal(tv->name + bl, "_kt");
      assert_int_equal(tv->smem_bytes, bv->smem_bytes);
      assert_int_equal(tv->threads, bv->threads);
      assert_int_equal(tv->block_m, bv->block_m);
      assert_int_equal(tv->block_n, bv->block_n);
    }
  }
  /* r = 1 (branch 0): one class, no twin; r = 2 and 4: twins. */
  assert_int_equal(p.bwd_steps[0].dkdv_ring_kernel, -1);
  assert_true(p.bwd_steps[1].dkdv_ring_kernel >= 0 && p.bwd_steps[2].dq_ring_kernel >= 0);
  rda_plan_k_free(&p);
}

static void test_gen_plan_small_grid_gets_small_tile(void **state) {
  rda_plan_k p;
  plan_for(*state,
           "return { heads = 2, head_dim = 64, dtype = 'bf16',"
           " segments = { 64, 65536 }, dilations = { 1, 1 } }",
           90, &p);
  assert_true(p.variants[p.steps[0].kernel].block_m <= 64);
  assert_true(p.variants[p.steps[1].kernel].block_m >= p.variants[p.steps[0].kernel].block_m);
  rda_plan_k_free(&p);
}

/* How many forward variants of p are wgmma ones ("_wg"). */
static int wgmma_variants(const rda_plan_k *p) {
  int n = 0;
  for (int i = 0; i < p->nvariants; ++i)
    n += strcmp(p->variants[i].kind, "fwd") == 0 && strstr(p->variants[i].name, "_wg") != NULL;
  return n;
}

/* The sm_90a wgmma path is off by default; RDA_PLAN_WGMMA or RDA_WGMMA=1 switch it on for sm_90
 * only; any other RDA_WGMMA value is one clear error. */
static void test_gen_plan_wgmma_is_switched_on_for_sm90_only(void **state) {
  rda_gen *g = *state;
  rda_config c;
  rda_hw h90, h80;
  rda_plan_k p;
  rda_err err = {0};
  char *saved = getenv("RDA_WGMMA") ? strdup(getenv("RDA_WGMMA")) : NULL;
  unsetenv("RDA_WGMMA");
  load_config(g,
              "return { heads = 4, head_dim = 128, dtype = 'bf16', segments = { 256, 4096 },"
              " dilations = { 1, 4 }, causal = true }",
              &c);
  assert_int_equal(rda_gen_hw_builtin(g, 90, &h90, &err), RDA_OK);
  assert_int_equal(rda_gen_hw_builtin(g, 80, &h80, &err), RDA_OK);

  assert_int_equal(rda_gen_plan(g, &c, &h90, &p, &err), RDA_OK);
  assert_int_equal(wgmma_variants(&p), 0);
  rda_plan_k_free(&p);
  assert_int_equal(rda_gen_plan_ex(g, &c, &h90, RDA_PLAN_WGMMA, &p, &err), RDA_OK);
  assert_true(wgmma_variants(&p) >= 2); /* a base variant per branch shape, and a twin */
  rda_plan_k_free(&p);
  assert_int_equal(rda_gen_plan_ex(g, &c, &h80, RDA_PLAN_WGMMA, &p, &err), RDA_OK);
  assert_int_equal(wgmma_variants(&p), 0);
  rda_plan_k_free(&p);

  setenv("RDA_WGMMA", "1", 1);
  assert_int_equal(rda_gen_plan(g, &c, &h90, &p, &err), RDA_OK);
  assert_true(wgmma_variants(&p) >= 2);
  rda_plan_k_free(&p);
  setenv("RDA_WGMMA", "0", 1);
  assert_int_equal(rda_gen_plan(g, &c, &h90, &p, &err), RDA_OK);
  assert_int_equal(wgmma_variants(&p), 0);
  rda_plan_k_free(&p);
  setenv("RDA_WGMMA", "yes", 1);
  assert_int_equal(rda_gen_plan(g, &c, &h90, &p, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "RDA_WGMMA='yes'"));
  assert_int_equal(p.nvariants, 0);

  if (saved != NULL) {
    setenv("RDA_WGMMA", saved, 1);
    free(saved);
  } else {
    unsetenv("RDA_WGMMA");
  }
}

static void test_gen_plan_that_cannot_fit_names_why(void **state) {
  rda_gen *g = *state;
  rda_config c;
  rda_hw hw;
  rda_plan_k p;
  rda_err err = {0};
  load_config(g,
              "return { heads = 1, head_dim = 256, dtype = 'bf16', segments = { 8 },"
              " dilations = { 1 } }",
              &c);
  assert_int_equal(rda_gen_hw_builtin(g, 90, &hw, &err), RDA_OK);
  hw.smem_per_block = 8192;
  assert_int_equal(rda_gen_plan(g, &c, &hw, &p, &err), RDA_ERR_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "head_dim = 256"));
  assert_non_null(strstr(err.msg, "shared memory"));
  assert_null(strchr(err.msg, '\n'));
  assert_int_equal(p.nvariants, 0);
  assert_null(p.variants);
}

static void test_gen_plan_rejects_unvalidated_config(void **state) {
  rda_gen *g = *state;
  rda_config c;
  rda_hw hw;
  rda_plan_k p;
  rda_err err = {0};
  load_config(g,
              "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
              " dilations = { 1 } }",
              &c);
  assert_int_equal(rda_gen_hw_builtin(g, 90, &hw, &err), RDA_OK);
  c.head_dim = 80;
  assert_int_equal(rda_gen_plan(g, &c, &hw, &p, &err), RDA_ERR_INVALID_ARGUMENT);
  rda_err_clear(&err);
  c.head_dim = 64;
  c.nbranch = RDA_MAX_BRANCHES + 1;
  assert_int_equal(rda_gen_plan(g, &c, &hw, &p, &err), RDA_ERR_INVALID_ARGUMENT);
  rda_err_clear(&err);
  c.nbranch = 1;
  c.dilations[0] = 0;
  assert_int_equal(rda_gen_plan(g, &c, &hw, &p, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(rda_gen_plan(NULL, &c, &hw, &p, &err), RDA_ERR_INVALID_ARGUMENT);
}

static void test_gen_names_are_deterministic_across_states(void **state) {
  rda_gen *other = NULL;
  rda_err err = {0};
  assert_int_equal(rda_gen_open(&other, &err), RDA_OK);
  const char *text =
      "return { heads = 8, kv_heads = 2, head_dim = 96, dtype = 'fp16',"
      " causal = true, segments = { 100, 1000 }, dilations = { 1, 3 } }";
  rda_plan_k a, b;
  plan_for(*state, text, 86, &a);
  plan_for(other, text, 86, &b);
  assert_int_equal(a.nvariants, b.nvariants);
  for (int i = 0; i < a.nvariants; i++) {
    assert_string_equal(a.variants[i].name, b.variants[i].name);
    assert_string_equal(a.variants[i].source, b.variants[i].source);
  }
  rda_plan_k_free(&a);
  rda_plan_k_free(&b);
  rda_gen_close(other);
}

/* A home whose gen/ is the real one and whose tuning/fwd_space.lua holds one odd tile: the
 * planner must pick it up without being told. */
static void test_gen_plan_uses_tuning_file_when_present(void **state) {
  (void)state;
  const char *real = rda_gen_home();
  char saved[4096], home[] = "/tmp/rda_gen_homeXXXXXX", p[4200];
  snprintf(saved, sizeof saved, "%s", real);
  assert_non_null(mkdtemp(home));
  snprintf(p, sizeof p, "%s/gen", saved);
  char link_path[4200];
  snprintf(link_path, sizeof link_path, "%s/gen", home);
  assert_int_equal(symlink(p, link_path), 0);
  snprintf(p, sizeof p, "%s/tuning", home);
  assert_int_equal(mkdir(p, 0700), 0);
  snprintf(p, sizeof p, "%s/tuning/fwd_space.lua", home);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs("return { [64] = { { block_m = 32, block_n = 48, warps = 2, stages = 3 } } }\n", f);
  fclose(f);

  assert_int_equal(setenv("RDA_HOME", home, 1), 0);
  rda_gen *g = NULL;
  rda_err err = {0};
  const rda_status s = rda_gen_open(&g, &err);
  rda_plan_k plan = {0};
  if (s == RDA_OK)
    plan_for(g,
             "return { heads = 1, head_dim = 64, dtype = 'bf16', segments = { 4096 },"
             " dilations = { 1 } }",
             90, &plan);
  setenv("RDA_HOME", saved, 1);
  unlink(p);
  snprintf(p, sizeof p, "%s/tuning", home);
  rmdir(p);
  unlink(link_path);
  rmdir(home);
  assert_int_equal(s, RDA_OK);
  assert_string_equal(plan.variants[plan.steps[0].kernel].name,
                      "rda_fwd_d64_bf16_full_dense_bm32_bn48_w2_s3");
  rda_plan_k_free(&plan);
  rda_gen_close(g);
}

/* A user tuning database runs under the sandbox's time limit at every plan: comparing two 1 MiB
 * strings is one instruction, so only the clock stops a loop of them (about a minute of work
 * here, hours with longer strings). The limit is lowered so the test runs fast. */
static void test_gen_user_database_is_under_the_time_limit(void **state) {
  rda_gen *g = *state;
  char *dir = rt_mkdtemp();
  assert_non_null(dir);
  char *db = rt_path(dir, "a_folder_name_long_enough_that_lua_would_cut_the_path_short.lua");
  const size_t big = 1u << 20;
  char *text = malloc(big + 256);
  assert_non_null(text);
  size_t n = (size_t)sprintf(text, "local a = '");
  memset(text + n, 'x', big);
  n += big;
  n += (size_t)sprintf(text + n,
                       "'\nlocal b, c = a .. 'y', a .. 'y'\nlocal n = 0\n"
                       "for i = 1, 1000000 do if b == c then n = n + 1 end end return {}\n");
  assert_true(rt_write_file(db, text, n));
  free(text);
  char *saved = rt_env_save("RDA_TUNING_DB");
  assert_int_equal(setenv("RDA_TUNING_DB", db, 1), 0);
  rda_gen_set_time_limit(g, 0.5);
  rda_config c;
  load_config(g,
              "return { heads = 1, head_dim = 64, dtype = 'bf16', segments = { 4096 },"
              " dilations = { 1 } }",
              &c);
  rda_hw hw;
  rda_plan_k plan;
  rda_err err = {0};
  assert_int_equal(rda_gen_hw_builtin(g, 90, &hw, &err), RDA_OK);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  const rda_status s = rda_gen_plan(g, &c, &hw, &plan, &err);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  rda_gen_set_time_limit(g, 0);
  rt_env_restore("RDA_TUNING_DB", saved);
  assert_int_equal(s, RDA_ERR_CONFIG);
  char want[4300];
  snprintf(want, sizeof want, "%s:4: the tuning database exceeds the time limit (0.5 s)", db);
  assert_string_equal(err.msg, want);
  assert_true((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) < 8.0);
  free(db);
  rt_rmtree(dir);
  free(dir);
}

/* `rdagen tune --dry-run` writes nothing and creates nothing: not the database, not its lock,
 * not a missing folder on its path, even when the tune fails after the database was read (a
 * bad RDA_WGMMA stops it before any kernel is compiled). */
static void test_gen_tune_dry_run_creates_nothing(void **state) {
  (void)state;
  char *dir = rt_mkdtemp();
  assert_non_null(dir);
  char *fresh = rt_path(dir, "new");
  char db[4200], config[4200];
  snprintf(db, sizeof db, "%s/dir/tuning.lua", fresh);
  snprintf(config, sizeof config, "%s/configs/default.lua", rda_gen_home());
  char *saved = rt_env_save("RDA_WGMMA");
  assert_int_equal(setenv("RDA_WGMMA", "bogus", 1), 0);
  const char *const args[] = {RDAGEN_PATH, "tune", config, "--backend", "emu",       "--n", "64",
                              "--iters",   "1",    "--db", db,          "--dry-run", NULL};
  char *argv[sizeof args / sizeof args[0]];
  for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) argv[i] = (char *)(uintptr_t)args[i];
  rt_proc p;
  const bool ran = rt_run(argv, 120, &p);
  rt_env_restore("RDA_WGMMA", saved);
  assert_true(ran);
  if (p.exit_code != 1 || strstr(p.err, "RDA_WGMMA") == NULL || rt_exists(fresh))
    fail_msg("tune --dry-run: exit %d, %s created: %s\nstderr: %s", p.exit_code, fresh,
             rt_exists(fresh) ? "yes" : "no", p.err);
  rt_proc_free(&p);
  free(fresh);
  rt_rmtree(dir);
  free(dir);
}

static double wall_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Runs rdagen with argv[1..] (NULL-terminated) and RDA_CONFIG_TIME_LIMIT=limit, at most
 * timeout_s seconds; *took: its wall time. */
static rt_proc run_rdagen(const char *limit, int timeout_s, double *took, const char *arg, ...) {
  char *argv[16] = {(char *)(uintptr_t)RDAGEN_PATH};
  va_list ap;
  va_start(ap, arg);
  int n = 1;
  for (const char *a = arg; a != NULL && n < 15; a = va_arg(ap, const char *))
    argv[n++] = (char *)(uintptr_t)a;
  va_end(ap);
  argv[n] = NULL;
  char *saved = rt_env_save("RDA_CONFIG_TIME_LIMIT");
  assert_int_equal(setenv("RDA_CONFIG_TIME_LIMIT", limit, 1), 0);
  rt_proc p;
  const double t0 = wall_s();
  const bool ran = rt_run(argv, timeout_s, &p);
  *took = wall_s() - t0;
  rt_env_restore("RDA_CONFIG_TIME_LIMIT", saved);
  assert_true(ran);
  return p;
}

/* 1 when err is the one line "rdagen: error: <name>: <what> exceeds the time limit (1 s)", or
 * the same with ":<line>" after the name (the hooks caught it before the long instruction: a
 * slow build may get that far within the limit). */
static int is_time_limit_line(const char *err, const char *name, const char *what) {
  char head[4300], tail[128];
  snprintf(head, sizeof head, "rdagen: error: %s", name);
  snprintf(tail, sizeof tail, ": %s exceeds the time limit (1 s)\n", what);
  const size_t hn = strlen(head), tn = strlen(tail), n = strlen(err);
  if (n < hn + tn || strncmp(err, head, hn) != 0 || strcmp(err + n - tn, tail) != 0) return 0;
  const char *mid = err + hn, *end = err + n - tn;
  if (mid == end) return 1;
  if (*mid++ != ':' || mid == end) return 0;
  for (; mid < end; mid++)
    if (*mid < '0' || *mid > '9') return 0;
  return 1;
}

/* SPEC §3: a config cannot hang the tool. Inserting 2^19 + 1 keys that all collide in Lua's
 * hash (i * (2^20 - 1): the node part of 2^20 slots hashes them mod 2^20 - 1) makes the last
 * rehash one VM instruction of half a minute to minutes, where no hook runs; rdagen's watchdog
 * ends it one second past the limit, with one error line, for a config and for a user tuning
 * database alike. */
static void test_gen_rdagen_stops_a_config_stuck_in_one_instruction(void **state) {
  (void)state;
  char *dir = rt_mkdtemp();
  assert_non_null(dir);
  char *config = rt_path(dir, "collide.lua"), *db = rt_path(dir, "collide_db.lua");
  char *ok = rt_path(dir, "ok.lua"), *out = rt_path(dir, "out");
  static const char collide[] =
      "local P = (1 << 20) - 1\nlocal t = {}\nfor i = 1, (1 << 19) + 1 do t[i * P] = true end\n";
  static const char body[] =
      "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 64 }, dilations = { 1 } }\n";
  char text[512];
  snprintf(text, sizeof text, "%s%s", collide, body);
  assert_true(rt_write_file(config, text, strlen(text)));
  snprintf(text, sizeof text, "%sreturn {}\n", collide);
  assert_true(rt_write_file(db, text, strlen(text)));
  assert_true(rt_write_file(ok, body, strlen(body)));
  double took;
  rt_proc p = run_rdagen("1", 40, &took, "ring-sim", config, "--n", "256", "--ranks", "2", NULL);
  if (p.exit_code != 1 || !is_time_limit_line(p.err, config, "config") || took > 15)
    fail_msg("config: exit %d after %.1f s, stderr: %s", p.exit_code, took, p.err);
  rt_proc_free(&p);
  char *saved = rt_env_save("RDA_TUNING_DB");
  assert_int_equal(setenv("RDA_TUNING_DB", db, 1), 0);
  p = run_rdagen("1", 40, &took, "emit", ok, "--arch", "sm_90", "--out", out, NULL);
  rt_env_restore("RDA_TUNING_DB", saved);
  if (p.exit_code != 1 || !is_time_limit_line(p.err, db, "the tuning database") || took > 15)
    fail_msg("database: exit %d after %.1f s, stderr: %s", p.exit_code, took, p.err);
  rt_proc_free(&p);
  assert_false(rt_exists(out));
  /* A tune holds the database's lock while plans load it: ended there, it leaves no lock file
   * beside the database (its unlock never runs). */
  char *lock = rt_path(dir, "collide_db.lua.lock");
  p = run_rdagen("1", 40, &took, "tune", ok, "--backend", "emu", "--n", "256", "--db", db, NULL);
  if (p.exit_code != 1 || !is_time_limit_line(p.err, db, "the tuning database") || took > 15)
    fail_msg("tune: exit %d after %.1f s, stderr: %s", p.exit_code, took, p.err);
  rt_proc_free(&p);
  if (rt_exists(lock)) fail_msg("tune left %s behind", lock);
  free(lock);
  free(config);
  free(db);
  free(ok);
  free(out);
  rt_rmtree(dir);
  free(dir);
}

/* A config read from a pipe (`cat c.lua | rdagen ... /dev/stdin`) works, as before f0b3483. */
static void test_gen_rdagen_reads_a_piped_config(void **state) {
  (void)state;
  char *dir = rt_mkdtemp();
  assert_non_null(dir);
  char *config = rt_path(dir, "c.lua");
  static const char body[] =
      "return { heads = 6, head_dim = 64, dtype = 'bf16', segments = { 64 }, dilations = { 1 } }\n";
  assert_true(rt_write_file(config, body, strlen(body)));
  char cmd[9000];
  snprintf(cmd, sizeof cmd, "cat '%s' | '%s' ring-sim /dev/stdin --n 256 --ranks 2", config,
           RDAGEN_PATH);
  char *argv[] = {(char *)(uintptr_t) "/bin/sh", (char *)(uintptr_t) "-c", cmd, NULL};
  rt_proc p;
  assert_true(rt_run(argv, 60, &p));
  if (p.exit_code != 0 || strstr(p.out, "config   /dev/stdin: heads 6 (kv 6)") == NULL)
    fail_msg("exit %d\nstdout: %s\nstderr: %s", p.exit_code, p.out, p.err);
  rt_proc_free(&p);
  free(config);
  rt_rmtree(dir);
  free(dir);
}

/* ---- several threads: the time limit and the watchdog ----------------------------------------
 * Each thread runs a generator of its own (one is not thread-safe); every sandboxed run, from
 * any thread, is put on the watchdog's process-wide list under its mutex while it runs. The
 * watchdog cannot be switched off again and its thread does not survive a fork, so each case
 * that switches it on runs in a forked child of its own (th_child) that reports through its exit
 * status and stderr; this process never switches it on. */

/* The process's CPU time, all threads: a forked child's starts at 0. */
static double th_process_cpu_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Records the first failure of a thread (or scenario) in why[cap]; later ones are dropped. */
static void th_fail(char *why, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void th_fail(char *why, size_t cap, const char *fmt, ...) {
  if (why[0] != '\0') return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, cap, fmt, ap);
  va_end(ap);
}

/* A config chunk and what it must load as. */
typedef struct th_config {
  char name[96];
  char text[1024];
  rda_config want;
} th_config;

/* The lines of th_config_make's chunk where the hooks may stop a runaway: the compare loop,
 * and before it the line that builds the two 256 KiB strings (a millisecond alone, but a
 * thread's CPU clock can pass a short limit there on a loaded machine, under ASan). */
#define TH_STRINGS_LINE 2
#define TH_BURN_LINE 3

/* A random valid config whose chunk first compares two distinct strings of 256 KiB `burn` times:
 * one VM instruction per compare but microseconds of CPU, so the sandbox's clock, not its
 * instruction count, bounds a long loop of them. 256 KiB, not more: the two strings stay in a
 * core's cache, so a slow config costs about the CPU time calibrated on one quiet thread even
 * with other threads and processes competing for memory bandwidth. heads comes out right only when every
 * compare ran. */
static void th_config_make(th_config *c, rt_rng *r, long long burn, const char *name) {
  static const int dims[] = {32, 64, 96, 128};
  rda_config *w = &c->want;
  memset(w, 0, sizeof *w);
  w->heads = (int)rt_rng_range(r, 1, 48);
  w->kv_heads = (int)rt_rng_range(r, 1, w->heads);
  while (w->heads % w->kv_heads != 0) w->kv_heads--; /* down to a divisor (1 at worst) */
  w->head_dim = dims[rt_rng_range(r, 0, 3)];
  w->dtype = rt_rng_range(r, 0, 1) ? RDA_DTYPE_FP16 : RDA_DTYPE_BF16;
  w->causal = (int)rt_rng_range(r, 0, 1);
  w->offsets = RDA_OFFSETS_MOD;
  w->nbranch = (int)rt_rng_range(r, 1, 3);
  char seg[96] = "", dil[96] = "";
  for (int i = 0; i < w->nbranch; i++) {
    w->segments[i] = rt_rng_range(r, 1, 1 << 14);
    w->dilations[i] = rt_rng_range(r, 1, 8);
    snprintf(seg + strlen(seg), sizeof seg - strlen(seg), "%s%lld", i > 0 ? ", " : "",
             (long long)w->segments[i]);
    snprintf(dil + strlen(dil), sizeof dil - strlen(dil), "%s%lld", i > 0 ? ", " : "",
             (long long)w->dilations[i]);
  }
  w->scale = 1.0 / sqrt((double)w->head_dim);
  snprintf(c->name, sizeof c->name, "%s", name);
  snprintf(c->text, sizeof c->text,
           "local n = 0\n"
           "local a, b = string.rep('x', %d) .. 'y', string.rep('x', %d) .. 'y'\n"
           "for i = 1, %lld do if a == b then n = n + 1 end end\n"
           "return { heads = %d + n - %lld, kv_heads = %d, head_dim = %d, dtype = '%s',"
           " causal = %s, segments = { %s }, dilations = { %s } }\n",
           burn > 0 ? 1 << 18 : 1, burn > 0 ? 1 << 18 : 1, burn, w->heads, burn, w->kv_heads,
           w->head_dim, w->dtype == RDA_DTYPE_FP16 ? "fp16" : "bf16", w->causal ? "true" : "false",
           seg, dil);
}

/* 1 when got is c->want; else 0 with what differs in why. */
static int th_config_check(const th_config *c, const rda_config *got, char *why, size_t cap) {
  const rda_config *w = &c->want;
  int same = got->heads == w->heads && got->kv_heads == w->kv_heads &&
             got->head_dim == w->head_dim && got->dtype == w->dtype && got->causal == w->causal &&
             got->offsets == w->offsets && got->nbranch == w->nbranch &&
             fabs(got->scale - w->scale) <= 1e-12;
  for (int i = 0; same && i < w->nbranch; i++)
    same = got->segments[i] == w->segments[i] && got->dilations[i] == w->dilations[i];
  if (!same)
    th_fail(why, cap, "%s: loaded heads %d kv %d d %d dtype %d causal %d nbranch %d, want heads %d",
            c->name, got->heads, got->kv_heads, got->head_dim, got->dtype, got->causal,
            got->nbranch, w->heads);
  return same;
}

/* "<name>:<line>: config exceeds the time limit (<limit> s)": the hooks' message. */
static void th_time_message(char *out, size_t cap, const char *name, int line, double limit) {
  snprintf(out, cap, "%s:%d: config exceeds the time limit (%g s)", name, line, limit);
}

/* 1 when msg is the hooks' message for a runaway of th_config_make's chunk named name; else 0
 * with the message it should be (of the compare loop's line) in want[cap]. */
static int th_is_time_message(const char *msg, const char *name, double limit, char *want,
                              size_t cap) {
  th_time_message(want, cap, name, TH_STRINGS_LINE, limit);
  if (strcmp(msg, want) == 0) return 1;
  th_time_message(want, cap, name, TH_BURN_LINE, limit);
  return strcmp(msg, want) == 0;
}

/* CPU seconds one compare of th_config_make's chunk takes in this build, on this machine (-1
 * when the chunk fails: no cmocka assertion here, a forked child calls this too). */
static double th_compare_cost(rda_gen *g, rt_rng *r) {
  enum { N = 1000 };
  double best[2] = {1e9, 1e9};
  for (int rep = 0; rep < 2; rep++) {
    for (int k = 0; k < 2; k++) {
      th_config c;
      th_config_make(&c, r, k == 0 ? 1 : N + 1, "calibrate.lua");
      rda_config got;
      rda_err err = {0};
      const double t0 = rt_thread_cpu_s();
      const rda_status s = rda_gen_config_string(g, c.text, c.name, &got, &err);
      const double t = rt_thread_cpu_s() - t0;
      if (s != RDA_OK) return -1;
      if (t < best[k]) best[k] = t;
    }
  }
  const double per = (best[1] - best[0]) / N;
  return per > 1e-6 ? per : 1e-6;
}

/* ---- several threads at once, one runaway ---- */

/* A run calibrated to a twentieth of its limit on one quiet thread can still use the whole
 * limit when threads outnumber cores (and, under ASan, spin on the allocator's locks): 1 when a
 * valid run (status s, message msg) was stopped with the limit's message after at least the
 * limit of its own thread's CPU (cpu), rightly, so that it is not counted. Stopped any earlier,
 * the limit read another clock, and the caller fails it. */
static int th_rightly_stopped(rda_status s, const char *msg, const char *name, double limit,
                              double cpu) {
  char want[256];
  return s != RDA_OK && cpu >= limit && th_is_time_message(msg, name, limit, want, sizeof want);
}

enum { TH_MIXED_THREADS = 4, TH_SLOW_RUNS = 3 };

typedef struct th_mixed_job {
  rt_rng rng;
  int id, runaway;
  double limit;
  long long burn; /* compares per slow config */
  pthread_barrier_t *go;
  th_config cases[TH_SLOW_RUNS];
  rda_plan_k plans[TH_SLOW_RUNS]; /* each case's plan on sm_90 */
  int nplans;  /* cases[0 .. nplans) loaded and planned */
  int overran; /* slow runs that used their whole limit under contention */
  double cpu;  /* the runaway: thread CPU seconds its run took */
  char why[1200];
} th_mixed_job;

static void *th_mixed_main(void *arg) {
  th_mixed_job *j = arg;
  rda_gen *g = NULL;
  rda_err err = {0};
  rda_hw hw;
  if (rda_gen_open(&g, &err) != RDA_OK || rda_gen_hw_builtin(g, 90, &hw, &err) != RDA_OK)
    th_fail(j->why, sizeof j->why, "thread %d: %s", j->id, err.msg);
  else
    rda_gen_set_time_limit(g, j->limit);
  pthread_barrier_wait(j->go); /* all threads run their configs at the same time */
  if (g == NULL || j->why[0] != '\0') {
    rda_gen_close(g);
    return NULL;
  }
  char name[64];
  if (j->runaway) {
    th_config c;
    snprintf(name, sizeof name, "runaway_%d.lua", j->id);
    th_config_make(&c, &j->rng, 10 * 1000 * 1000, name); /* minutes of compares */
    rda_config got;
    const double t0 = rt_thread_cpu_s();
    const rda_status s = rda_gen_config_string(g, c.text, c.name, &got, &err);
    j->cpu = rt_thread_cpu_s() - t0;
    char want[256];
    if (s != RDA_ERR_CONFIG || !th_is_time_message(err.msg, c.name, j->limit, want, sizeof want))
      th_fail(j->why, sizeof j->why, "the runaway: status %d, message '%s', want '%s'", (int)s,
              err.msg, want);
  } else {
    for (int k = 0; k < TH_SLOW_RUNS && j->why[0] == '\0'; k++) {
      th_config *c = &j->cases[j->nplans];
      snprintf(name, sizeof name, "slow_%d_%d.lua", j->id, k);
      th_config_make(c, &j->rng, j->burn, name);
      rda_config got;
      rda_err_clear(&err);
      const double t0 = rt_thread_cpu_s();
      const rda_status s = rda_gen_config_string(g, c->text, c->name, &got, &err);
      const double cpu = rt_thread_cpu_s() - t0;
      if (th_rightly_stopped(s, err.msg, c->name, j->limit, cpu)) {
        j->overran++;
      } else if (s != RDA_OK) {
        th_fail(j->why, sizeof j->why, "thread %d, within the limit: %s (after %.3f s of its CPU)",
                j->id, err.msg, cpu);
      } else if (th_config_check(c, &got, j->why, sizeof j->why)) {
        if (rda_gen_plan(g, &got, &hw, &j->plans[j->nplans], &err) != RDA_OK)
          th_fail(j->why, sizeof j->why, "thread %d: plan of %s: %s", j->id, c->name, err.msg);
        else
          j->nplans++;
      }
    }
  }
  rda_gen_close(g);
  return NULL;
}

/* 1 when plans a and b hold the same kernels and steps. */
static int th_same_plan(const rda_plan_k *a, const rda_plan_k *b) {
  if (a->nvariants != b->nvariants || a->nsteps != b->nsteps) return 0;
  for (int i = 0; i < a->nvariants; i++)
    if (strcmp(a->variants[i].name, b->variants[i].name) != 0 ||
        strcmp(a->variants[i].source, b->variants[i].source) != 0)
      return 0;
  for (int i = 0; i < a->nsteps; i++)
    if (a->steps[i].kernel != b->steps[i].kernel || a->steps[i].head0 != b->steps[i].head0 ||
        a->steps[i].nheads != b->steps[i].nheads)
      return 0;
  return 1;
}

/* TH_MIXED_THREADS threads load and plan configs at once under a time limit of `limit` CPU
 * seconds each: the slow ones take a twentieth of it per config, as calibrated on one quiet
 * thread (four at once on a loaded machine, under ASan, have cost seven times that; thread 0
 * runs away). Only
 * the runaway fails, with the hooks' message, after a full `limit` of its own thread's CPU time
 * whatever the others spend; every other config loads and plans as it does alone (on ref).
 * 1 when all of that holds, else 0 with why. */
static int th_mixed(rda_gen *ref, double limit, char *why, size_t cap) {
  rt_rng r;
  rt_rng_seed(&r, rt_rng_next(rt_global_rng()));
  const double cost = th_compare_cost(ref, &r);
  if (cost < 0) {
    th_fail(why, cap, "the calibration config failed");
    return 0;
  }
  const long long burn = (long long)(0.05 * limit / cost) + 1;
  th_mixed_job jobs[TH_MIXED_THREADS];
  pthread_t threads[TH_MIXED_THREADS];
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, TH_MIXED_THREADS);
  memset(jobs, 0, sizeof jobs);
  for (int i = 0; i < TH_MIXED_THREADS; i++) {
    th_mixed_job *j = &jobs[i];
    rt_rng_seed(&j->rng, rt_rng_next(&r));
    j->id = i;
    j->runaway = i == 0;
    j->limit = limit;
    j->burn = burn;
    j->go = &go;
    if (pthread_create(&threads[i], NULL, th_mixed_main, j) != 0) abort();
  }
  for (int i = 0; i < TH_MIXED_THREADS; i++) pthread_join(threads[i], NULL);
  pthread_barrier_destroy(&go);
  rda_hw hw;
  rda_err err = {0};
  if (rda_gen_hw_builtin(ref, 90, &hw, &err) != RDA_OK) th_fail(why, cap, "%s", err.msg);
  for (int i = 0; i < TH_MIXED_THREADS; i++) {
    th_mixed_job *j = &jobs[i];
    if (j->why[0] != '\0') th_fail(why, cap, "%s", j->why);
    if (j->runaway && (j->cpu < limit || j->cpu > limit + 1.0))
      th_fail(why, cap, "the runaway stopped after %.3f s of its thread's CPU time, limit %g s",
              j->cpu, limit);
    if (!j->runaway && j->why[0] == '\0' && j->nplans + j->overran != TH_SLOW_RUNS)
      th_fail(why, cap, "thread %d planned %d configs", i, j->nplans);
    for (int k = 0; k < j->nplans; k++) {
      rda_plan_k alone;
      if (rda_gen_plan(ref, &j->cases[k].want, &hw, &alone, &err) != RDA_OK)
        th_fail(why, cap, "%s alone: %s", j->cases[k].name, err.msg);
      else if (!th_same_plan(&alone, &j->plans[k]))
        th_fail(why, cap, "%s: its plan in a thread differs from its plan alone", j->cases[k].name);
      rda_plan_k_free(&alone);
      rda_plan_k_free(&j->plans[k]);
    }
  }
  return why[0] == '\0';
}

/* The hooks alone (the watchdog is off in this process). */
static void test_gen_threads_only_the_runaway_fails(void **state) {
  char why[2048] = "";
  if (!th_mixed(*state, 0.2, why, sizeof why)) fail_msg("%s", why);
  assert_int_equal(rda_gen_watchdog_watching(), 0);
}

/* ---- forked children ---- */

typedef struct th_child_result {
  int status; /* exit code, 128 + signal when killed by one, -1 when it ran past the timeout */
  char err[8192];
  double took; /* wall seconds */
} th_child_result;

/* Runs fn(arg) in a forked child, its stderr into res->err, and exit(fn's value) there (exit,
 * not _exit: the leak checker of a sanitized build runs then). Killed past timeout_s. */
static void th_child(int (*fn)(void *), void *arg, double timeout_s, th_child_result *res) {
  memset(res, 0, sizeof *res);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  fflush(stdout); /* else the child flushes our buffered output once more */
  fflush(stderr);
  const double t0 = wall_s();
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* cmocka's handlers would longjmp into its runner from any thread: a crash ends the child. */
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
    close(fds[0]);
    if (dup2(fds[1], STDERR_FILENO) < 0) _exit(120);
    close(fds[1]);
    exit(fn(arg));
  }
  close(fds[1]);
  size_t len = 0;
  int timed_out = 0;
  for (;;) {
    const double left = t0 + timeout_s - wall_s();
    if (left <= 0) {
      timed_out = 1;
      break;
    }
    struct pollfd pfd = {fds[0], POLLIN, 0};
    const int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue; /* the time is checked above */
    char buf[4096];
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break; /* EOF: the child (and every thread of it) is gone */
    const size_t take =
        (size_t)n < sizeof res->err - 1 - len ? (size_t)n : sizeof res->err - 1 - len;
    memcpy(res->err + len, buf, take);
    len += take;
  }
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  res->took = wall_s() - t0;
  res->status = timed_out ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int th_mixed_child(void *arg) {
  (void)arg;
  rda_gen_enable_watchdog("test_gen");
  rda_gen *g = NULL;
  rda_err err = {0};
  if (rda_gen_open(&g, &err) != RDA_OK) {
    fprintf(stderr, "rda_gen_open: %s\n", err.msg);
    return 2;
  }
  char why[2048] = "";
  th_mixed(g, 0.2, why, sizeof why);
  if (rda_gen_watchdog_watching() != 0)
    th_fail(why, sizeof why, "%d runs still watched", rda_gen_watchdog_watching());
  rda_gen_close(g);
  if (why[0] != '\0') fprintf(stderr, "%s\n", why);
  return why[0] != '\0' ? 2 : 0;
}

/* The same with the watchdog on: it ends no run within its limit, the slow ones included, and
 * leaves the runaway (in the compare loop, where the hooks see it) to the hooks. */
static void test_gen_threads_watchdog_leaves_runs_within_the_limit(void **state) {
  (void)state;
  th_child_result r;
  th_child(th_mixed_child, NULL, 60, &r);
  if (r.status != 0 || r.err[0] != '\0')
    fail_msg("child: status %d after %.1f s, stderr: %s", r.status, r.took, r.err);
}

/* ---- registration under concurrency ---- */

enum { TH_STRESS_THREADS = 6, TH_STRESS_KINDS = 5 };

typedef struct th_stress_job {
  rt_rng rng;
  int id;
  double until;   /* wall seconds (wall_s) past which no run starts, whatever the CPU time */
  long long burn; /* the last thread: compares per slow config */
  int runs[TH_STRESS_KINDS];
  char why[1200];
} th_stress_job;

/* Short runs of kinds drawn at random: 0 a valid config, 1 a syntax error (its parse is
 * watched too), 2 a raised error; in threads 0 and 1, at their 200th run (or after their last,
 * should the budget end first), 3: a runaway the
 * hooks stop at the limit (0.2 s of CPU: not more, the others must keep going). The last thread
 * runs only 4: valid configs that take a twentieth of the limit of its own CPU time (calibrated
 * on one quiet thread: six busy threads on two cores, under ASan, can make the same work cost
 * several times the CPU time), watched most of the time, while the process's CPU time (all threads)
 * runs far past limit + 1 s. The generator is replaced every 32 runs. */
/* Run n of job j, of the given kind, on g; a wrong outcome goes to j->why. */
static void th_stress_one(th_stress_job *j, rda_gen *g, int n, int kind) {
  char name[64], want[256];
  snprintf(name, sizeof name, "t%d_run%d.lua", j->id, n);
  th_config c;
  th_config_make(&c, &j->rng, kind == 3 ? 10 * 1000 * 1000 : kind == 4 ? j->burn : 0, name);
  if (kind == 1) c.text[strlen(c.text) - 3] = '\0'; /* cut before the return's last '}' */
  if (kind == 2) snprintf(c.text, sizeof c.text, "local x = %d\nerror('boom ' .. x)\n", n);
  rda_config got;
  rda_err err = {0};
  const double cpu0 = rt_thread_cpu_s();
  const rda_status s = rda_gen_config_string(g, c.text, c.name, &got, &err);
  const double cpu = rt_thread_cpu_s() - cpu0;
  if (kind == 0 || kind == 4) {
    if (th_rightly_stopped(s, err.msg, name, 0.2, cpu)) return;
    j->runs[kind]++;
    if (s != RDA_OK)
      th_fail(j->why, sizeof j->why, "%s, a valid config: %s (after %.3f s of its CPU)", name,
              err.msg, cpu);
    else
      th_config_check(&c, &got, j->why, sizeof j->why);
    return;
  }
  j->runs[kind]++;
  int same;
  if (kind == 1) {
    snprintf(want, sizeof want, "%s:4: ", name);
    same = strncmp(err.msg, want, strlen(want)) == 0;
  } else if (kind == 2) {
    snprintf(want, sizeof want, "%s:2: boom %d", name, n);
    same = strcmp(err.msg, want) == 0;
  } else {
    same = th_is_time_message(err.msg, name, 0.2, want, sizeof want);
  }
  if (s != RDA_ERR_CONFIG || !same)
    th_fail(j->why, sizeof j->why, "%s: status %d, message '%s', want '%s'", name, (int)s, err.msg,
            want);
}

/* A generator with the stress runs' time limit, or NULL (the failure in j->why). */
static rda_gen *th_stress_gen(th_stress_job *j) {
  rda_gen *g = NULL;
  rda_err err = {0};
  if (rda_gen_open(&g, &err) != RDA_OK) {
    th_fail(j->why, sizeof j->why, "thread %d: rda_gen_open: %s", j->id, err.msg);
    return NULL;
  }
  rda_gen_set_time_limit(g, 0.2);
  return g;
}

static void *th_stress_main(void *arg) {
  th_stress_job *j = arg;
  rda_gen *g = NULL;
  int n = 0;
  for (; wall_s() < j->until && th_process_cpu_s() < 2.5 && j->why[0] == '\0'; n++) {
    if (n % 32 == 0) {
      rda_gen_close(g);
      if ((g = th_stress_gen(j)) == NULL) break;
    }
    int kind = (int)rt_rng_range(&j->rng, 0, 9);
    kind = kind < 7 ? 0 : kind < 9 ? 1 : 2;
    if (j->id < 2 && n == 200) kind = 3;
    if (j->id == TH_STRESS_THREADS - 1) kind = 4;
    th_stress_one(j, g, n, kind);
  }
  /* A thread the machine starved can reach the end of the budget before its 200th run: its
   * runaway comes now, while the other threads may still be finishing theirs. */
  if (j->id < 2 && j->runs[3] == 0 && j->why[0] == '\0') {
    if (g == NULL) g = th_stress_gen(j);
    if (g != NULL) th_stress_one(j, g, n, 3);
  }
  rda_gen_close(g);
  return NULL;
}

/* TH_STRESS_THREADS threads start and finish sandboxed runs with the watchdog on until the
 * process has spent 2.5 s of CPU time (thousands of registrations, with generators opened and
 * closed on the way): no run within its limit is ended, though the process's CPU time goes far
 * past every limit + 1 s (a watchdog that read it instead of each run's own thread's clock
 * would end one), each run gets its own result, and nothing stays on the list. */
static int th_stress_child(void *arg) {
  (void)arg;
  rda_gen_enable_watchdog("test_gen");
  rt_rng r;
  rt_rng_seed(&r, rt_rng_next(rt_global_rng()));
  rda_gen *g = NULL;
  rda_err err = {0};
  if (rda_gen_open(&g, &err) != RDA_OK) {
    fprintf(stderr, "rda_gen_open: %s\n", err.msg);
    return 2;
  }
  const double cost = th_compare_cost(g, &r);
  rda_gen_close(g);
  if (cost < 0) {
    fprintf(stderr, "the calibration config failed\n");
    return 2;
  }
  th_stress_job jobs[TH_STRESS_THREADS];
  pthread_t threads[TH_STRESS_THREADS];
  memset(jobs, 0, sizeof jobs);
  const double until = wall_s() + 20; /* on a machine too busy to give it 2.5 s of CPU */
  for (int i = 0; i < TH_STRESS_THREADS; i++) {
    rt_rng_seed(&jobs[i].rng, rt_rng_next(&r));
    jobs[i].id = i;
    jobs[i].until = until;
    jobs[i].burn = (long long)(0.05 * 0.2 / cost) + 1;
    if (pthread_create(&threads[i], NULL, th_stress_main, &jobs[i]) != 0) abort();
  }
  for (int i = 0; i < TH_STRESS_THREADS; i++) pthread_join(threads[i], NULL);
  char why[2048] = "";
  int runs[TH_STRESS_KINDS] = {0};
  for (int i = 0; i < TH_STRESS_THREADS; i++) {
    if (jobs[i].why[0] != '\0') th_fail(why, sizeof why, "%s", jobs[i].why);
    for (int k = 0; k < TH_STRESS_KINDS; k++) runs[k] += jobs[i].runs[k];
  }
  if (runs[0] < 500 || runs[1] < 50 || runs[2] < 20 || runs[3] != 2 || runs[4] < 1)
    th_fail(why, sizeof why,
            "too few runs: %d valid, %d syntax errors, %d raised errors, %d runaways, %d slow",
            runs[0], runs[1], runs[2], runs[3], runs[4]);
  if (rda_gen_watchdog_watching() != 0)
    th_fail(why, sizeof why, "%d runs still watched after every thread ended",
            rda_gen_watchdog_watching());
  if (why[0] != '\0') fprintf(stderr, "%s\n", why);
  return why[0] != '\0' ? 2 : 0;
}

static void test_gen_threads_watchdog_registers_and_unregisters(void **state) {
  (void)state;
  th_child_result r;
  th_child(th_stress_child, NULL, 60, &r);
  if (r.status != 0 || r.err[0] != '\0')
    fail_msg("child: status %d after %.1f s, stderr: %s", r.status, r.took, r.err);
}

/* ---- the kill path ---- */

enum { TH_KILL_NORMAL = 3 };

/* Shared with the parent (MAP_SHARED): what the child did before the watchdog ended it. */
typedef struct th_kill_shared {
  int runs[TH_KILL_NORMAL];     /* valid configs each normal thread loaded (atomic) */
  int at_start[TH_KILL_NORMAL]; /* ... when the runaway started */
  int started;
} th_kill_shared;

typedef struct th_kill_arg {
  th_kill_shared *shared;
  char gone[4200], kept[4200], runaway[4200];
  double limit;
} th_kill_arg;

typedef struct th_kill_job {
  th_kill_arg *a;
  int id;
  rt_rng rng;
  long long burn;
} th_kill_job;

/* Nothing here may print: the child's stderr must hold the watchdog's line alone. A failure
 * writes its own line and ends the child with another status. */
static void th_kill_die(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void th_kill_die(int status, const char *fmt, ...) {
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  const size_t n = strlen(line);
  line[n] = '\n';
  ssize_t w = write(STDERR_FILENO, line, n + 1);
  (void)w;
  _exit(status);
}

/* A normal thread: valid configs (a twentieth of the limit each), one after the other. */
static void *th_kill_normal(void *arg) {
  th_kill_job *j = arg;
  rda_gen *g = NULL;
  rda_err err = {0};
  if (rda_gen_open(&g, &err) != RDA_OK) th_kill_die(3, "rda_gen_open: %s", err.msg);
  for (int n = 0;; n++) {
    char name[64];
    snprintf(name, sizeof name, "normal_%d_%d.lua", j->id, n);
    th_config c;
    th_config_make(&c, &j->rng, j->burn, name);
    rda_config got;
    char why[1200] = "";
    if (rda_gen_config_string(g, c.text, c.name, &got, &err) != RDA_OK)
      th_kill_die(3, "%s, within the limit: %s", name, err.msg);
    if (!th_config_check(&c, &got, why, sizeof why)) th_kill_die(3, "%s", why);
    __atomic_fetch_add(&j->a->shared->runs[j->id], 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

/* The runaway: once every normal thread has loaded a config, a config stuck in one VM
 * instruction (test_gen_rdagen_stops_a_config_stuck_in_one_instruction's rehash) that only the
 * watchdog can end. */
static void *th_kill_runaway(void *arg) {
  th_kill_job *j = arg;
  th_kill_shared *sh = j->a->shared;
  rda_gen *g = NULL;
  rda_err err = {0};
  if (rda_gen_open(&g, &err) != RDA_OK) th_kill_die(3, "rda_gen_open: %s", err.msg);
  for (int ready = 0; !ready;) {
    ready = 1;
    for (int i = 0; i < TH_KILL_NORMAL; i++)
      ready &= __atomic_load_n(&sh->runs[i], __ATOMIC_RELAXED) > 0;
    const struct timespec nap = {0, 5 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
  for (int i = 0; i < TH_KILL_NORMAL; i++)
    sh->at_start[i] = __atomic_load_n(&sh->runs[i], __ATOMIC_RELAXED);
  sh->started = 1;
  static const char text[] =
      "local P = (1 << 20) - 1\nlocal t = {}\nfor i = 1, (1 << 19) + 1 do t[i * P] = true end\n"
      "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 64 }, dilations = { 1 } }\n";
  rda_config got;
  const rda_status s = rda_gen_config_string(g, text, j->a->runaway, &got, &err);
  th_kill_die(4, "the runaway returned: status %d, %s", (int)s, err.msg);
  return NULL;
}

static int th_kill_child(void *arg) {
  th_kill_arg *a = arg;
  char limit[32];
  snprintf(limit, sizeof limit, "%g", a->limit);
  if (setenv("RDA_CONFIG_TIME_LIMIT", limit, 1) != 0) th_kill_die(3, "setenv");
  rda_gen *g = NULL;
  rda_err err = {0};
  if (rda_gen_open(&g, &err) != RDA_OK) th_kill_die(3, "rda_gen_open: %s", err.msg);
  rt_rng r;
  rt_rng_seed(&r, rt_rng_next(rt_global_rng()));
  const double cost = th_compare_cost(g, &r);
  rda_gen_close(g);
  if (cost < 0) th_kill_die(3, "calibration failed");
  /* Registered, then forgotten: the watchdog must leave `kept` alone. */
  if (rda_gen_watchdog_remove_on_kill(a->gone, 1) != 1 ||
      rda_gen_watchdog_remove_on_kill(a->kept, 1) != 1 ||
      rda_gen_watchdog_remove_on_kill(a->kept, 0) != 1)
    th_kill_die(3, "rda_gen_watchdog_remove_on_kill refused a path");
  rda_gen_enable_watchdog("wdtest");
  th_kill_job jobs[TH_KILL_NORMAL + 1];
  for (int i = 0; i <= TH_KILL_NORMAL; i++) {
    jobs[i].a = a;
    jobs[i].id = i;
    rt_rng_seed(&jobs[i].rng, rt_rng_next(&r));
    /* A twentieth of the limit: the runaway's rehash sweeps hundreds of MiB, evicting the
     * compared strings from the cache (and contending for ASan's allocator), which once made
     * a third of the limit, as calibrated alone, take more than all of it. */
    jobs[i].burn = (long long)(0.05 * a->limit / cost) + 1;
    pthread_t t;
    if (pthread_create(&t, NULL, i < TH_KILL_NORMAL ? th_kill_normal : th_kill_runaway, &jobs[i]) !=
        0)
      th_kill_die(3, "pthread_create");
  }
  const struct timespec nap = {45, 0}; /* the watchdog ends the process long before */
  nanosleep(&nap, NULL);
  th_kill_die(5, "the watchdog did not end the process within 45 s");
  return 5;
}

/* A runaway inside one long instruction while three other threads load configs: the watchdog
 * ends the process with status 1 and exactly its one line, naming the runaway (not a run of
 * another thread), after removing the file registered for it; the other threads ran on while
 * the runaway was stuck. */
static void test_gen_threads_watchdog_ends_the_process_for_the_runaway(void **state) {
  (void)state;
  char *dir = rt_mkdtemp();
  assert_non_null(dir);
  th_kill_shared *sh =
      mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(sh != MAP_FAILED);
  memset(sh, 0, sizeof *sh);
  th_kill_arg a = {.shared = sh, .limit = 1.0};
  snprintf(a.gone, sizeof a.gone, "%s/db.lua.lock", dir);
  snprintf(a.kept, sizeof a.kept, "%s/other.lock", dir);
  snprintf(a.runaway, sizeof a.runaway, "%s/runaway.lua", dir);
  assert_true(rt_write_file(a.gone, "x", 1));
  assert_true(rt_write_file(a.kept, "x", 1));
  th_child_result r;
  th_child(th_kill_child, &a, 60, &r);
  char want[4400];
  snprintf(want, sizeof want, "wdtest: error: %s: config exceeds the time limit (1 s)\n",
           a.runaway);
  /* Every check into why first, then clean up, then fail: nothing left behind either way. */
  char why[10000] = "";
  if (r.status != 1 || strcmp(r.err, want) != 0)
    th_fail(why, sizeof why, "child: status %d after %.1f s, stderr: '%s', want status 1 and '%s'",
            r.status, r.took, r.err, want);
  if (rt_exists(a.gone)) th_fail(why, sizeof why, "the watchdog left %s behind", a.gone);
  if (!rt_exists(a.kept))
    th_fail(why, sizeof why, "the watchdog removed %s, which was forgotten", a.kept);
  if (sh->started != 1) th_fail(why, sizeof why, "the runaway never started");
  for (int i = 0; i < TH_KILL_NORMAL; i++)
    if (sh->runs[i] <= sh->at_start[i])
      th_fail(why, sizeof why,
              "normal thread %d loaded nothing while the runaway was stuck (%d, then %d)", i,
              sh->at_start[i], sh->runs[i]);
  munmap(sh, sizeof *sh);
  rt_rmtree(dir);
  free(dir);
  if (why[0] != '\0') fail_msg("%s", why);
}

static void test_gen_open_fails_clearly_without_home(void **state) {
  (void)state;
  char saved[4096];
  snprintf(saved, sizeof saved, "%s", rda_gen_home());
  assert_int_equal(setenv("RDA_HOME", "/nonexistent-rda-home", 1), 0);
  rda_gen *g = (rda_gen *)&saved; /* must be reset to NULL */
  rda_err err = {0};
  const rda_status s = rda_gen_open(&g, &err);
  setenv("RDA_HOME", saved, 1);
  assert_int_equal(s, RDA_ERR_IO);
  assert_null(g);
  assert_non_null(strstr(err.msg, "/nonexistent-rda-home/gen/bridge.lua"));
  assert_non_null(strstr(err.msg, "RDA_HOME"));
}

static void test_gen_home_prefers_environment(void **state) {
  (void)state;
  char saved[4096];
  snprintf(saved, sizeof saved, "%s", rda_gen_home());
  setenv("RDA_HOME", "/some/where", 1);
  assert_string_equal(rda_gen_home(), "/some/where");
  setenv("RDA_HOME", "", 1);
  assert_string_equal(rda_gen_home(), RDA_SOURCE_DIR);
  setenv("RDA_HOME", saved, 1);
}

static void test_gen_close_accepts_null(void **state) {
  (void)state;
  rda_gen_close(NULL);
  assert_string_equal(rda_gen_traceback(NULL), "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gen_lua_config),
      cmocka_unit_test(test_gen_lua_emit),
      cmocka_unit_test(test_gen_lua_hw),
      cmocka_unit_test(test_gen_lua_plan),
      cmocka_unit_test(test_gen_lua_tuning),
      cmocka_unit_test(test_gen_every_lua_test_is_registered),
      cmocka_unit_test(test_gen_run_script_reports_failure_with_location),
      cmocka_unit_test(test_gen_run_script_rejects_missing_file),
      cmocka_unit_test(test_gen_hw_builtin_profiles),
      cmocka_unit_test(test_gen_hw_unknown_arch_lists_known),
      cmocka_unit_test(test_gen_plan_default_config),
      cmocka_unit_test(test_gen_plan_wgmma_is_switched_on_for_sm90_only),
      cmocka_unit_test(test_gen_plan_group_steps_match_config_heads),
      cmocka_unit_test(test_gen_plan_dedups_equal_specializations),
      cmocka_unit_test(test_gen_plan_backward_ring_twins),
      cmocka_unit_test(test_gen_plan_small_grid_gets_small_tile),
      cmocka_unit_test(test_gen_plan_that_cannot_fit_names_why),
      cmocka_unit_test(test_gen_plan_rejects_unvalidated_config),
      cmocka_unit_test(test_gen_names_are_deterministic_across_states),
      cmocka_unit_test(test_gen_plan_uses_tuning_file_when_present),
      cmocka_unit_test(test_gen_user_database_is_under_the_time_limit),
      cmocka_unit_test(test_gen_tune_dry_run_creates_nothing),
      cmocka_unit_test(test_gen_rdagen_stops_a_config_stuck_in_one_instruction),
      cmocka_unit_test(test_gen_rdagen_reads_a_piped_config),
      cmocka_unit_test(test_gen_threads_only_the_runaway_fails),
      cmocka_unit_test(test_gen_threads_watchdog_leaves_runs_within_the_limit),
      cmocka_unit_test(test_gen_threads_watchdog_registers_and_unregisters),
      cmocka_unit_test(test_gen_threads_watchdog_ends_the_process_for_the_runaway),
      cmocka_unit_test(test_gen_open_fails_clearly_without_home),
      cmocka_unit_test(test_gen_home_prefers_environment),
      cmocka_unit_test(test_gen_close_accepts_null),
  };
  const char *filter = getenv("RDA_TEST_FILTER"); /* e.g. "*threads*" while developing */
  if (filter != NULL) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, rt_gen_setup, rt_gen_teardown);
}
