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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
  assert_non_null(strstr(err.msg, "sm_80, sm_86, sm_89, sm_90"));
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
      cmocka_unit_test(test_gen_open_fails_clearly_without_home),
      cmocka_unit_test(test_gen_home_prefers_environment),
      cmocka_unit_test(test_gen_close_accepts_null),
  };
  return cmocka_run_group_tests(tests, rt_gen_setup, rt_gen_teardown);
}
