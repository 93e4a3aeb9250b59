/* test_config.c — config loading per SPEC §3: every validation rule (one line naming the key,
 * the value and what is allowed), sandbox escapes, runaway loops, memory bombs, syntax errors,
 * binary chunks, and valid configs loaded with their defaults resolved. */
/* cmocka.h needs these four first. */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <dirent.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gen.h"
#include "rda_test.h"
#include "rda_test_backend.h"

/* Loads text as "configs/x.lua"; on failure the error must be one line, start with the chunk
 * name, carry the expected status, and contain every part (a NULL-terminated list). */
static void expect_error_v(void **state, const char *text, rda_status want, va_list ap) {
  rda_config c;
  rda_err err = {0};
  const rda_status s = rda_gen_config_string(*state, text, "configs/x.lua", &c, &err);
  if (s != want)
    fail_msg("status %s, want %s, for:\n%s\nmessage: %s", rda_status_string(s),
             rda_status_string(want), text, err.msg);
  if (strncmp(err.msg, "configs/x.lua", 13) != 0) fail_msg("message lacks the chunk: %s", err.msg);
  if (strchr(err.msg, '\n') != NULL) fail_msg("message is not one line: %s", err.msg);
  for (const char *m = err.msg; *m != '\0'; m++)
    if ((unsigned char)*m < 0x20 || *m == 0x7f)
      fail_msg("message holds control character 0x%02x: %s", (unsigned char)*m, err.msg);
  for (const char *part; (part = va_arg(ap, const char *)) != NULL;)
    if (strstr(err.msg, part) == NULL) fail_msg("message \"%s\" lacks \"%s\"", err.msg, part);
}

static void expect_error(void **state, const char *text, ...) {
  va_list ap;
  va_start(ap, text);
  expect_error_v(state, text, RDA_ERR_CONFIG, ap);
  va_end(ap);
}

static void load_ok(void **state, const char *text, rda_config *c) {
  rda_err err = {0};
  if (rda_gen_config_string(*state, text, "configs/x.lua", c, &err) != RDA_OK)
    fail_msg("rejected a valid config: %s", err.msg);
}

/* A valid config with `extra` inserted as more keys. */
static void with(char *buf, size_t n, const char *extra) {
  snprintf(buf, n,
           "return { heads = 16, kv_heads = 4, head_dim = 128, dtype = 'bf16',"
           " segments = { 2048, 4096, 8192 }, dilations = { 1, 2, 4 }, %s }",
           extra);
}

/* Every piece of SPEC §3's example config, exactly as printed there. */
static const char spec_example[] =
    "return {\n"
    "  heads = 16, kv_heads = 4, head_dim = 128, dtype = \"bf16\",   -- kv_heads defaults to "
    "heads\n"
    "  segments  = { 2048, 4096, 8192 },\n"
    "  dilations = { 1,    2,    4    },\n"
    "  offsets = \"mod\",          -- \"mod\" | \"block\" | \"group\"; default \"mod\"\n"
    "  causal = true,            -- default false\n"
    "  scale = nil,              -- default 1/sqrt(head_dim)\n"
    "}\n";

/* ---- valid configs ----------------------------------------------------------------------- */

static void test_config_loads_spec_example(void **state) {
  rda_config c;
  load_ok(state, spec_example, &c);
  assert_int_equal(c.heads, 16);
  assert_int_equal(c.kv_heads, 4);
  assert_int_equal(c.head_dim, 128);
  assert_int_equal(c.dtype, RDA_DTYPE_BF16);
  assert_int_equal(c.nbranch, 3);
  assert_int_equal(c.segments[0], 2048);
  assert_int_equal(c.segments[1], 4096);
  assert_int_equal(c.segments[2], 8192);
  assert_int_equal(c.dilations[0], 1);
  assert_int_equal(c.dilations[1], 2);
  assert_int_equal(c.dilations[2], 4);
  assert_int_equal(c.offsets, RDA_OFFSETS_MOD);
  assert_int_equal(c.causal, 1);
  assert_true(fabs(c.scale - 1.0 / sqrt(128.0)) < 1e-15);
}

static void test_config_resolves_defaults(void **state) {
  rda_config c;
  load_ok(state,
          "return { heads = 6, head_dim = 64, dtype = 'fp16', segments = { 100 },"
          " dilations = { 3 } }",
          &c);
  assert_int_equal(c.kv_heads, 6);
  assert_int_equal(c.dtype, RDA_DTYPE_FP16);
  assert_int_equal(c.offsets, RDA_OFFSETS_MOD);
  assert_int_equal(c.causal, 0);
  assert_true(fabs(c.scale - 0.125) < 1e-15);
}

static void test_config_keeps_explicit_values(void **state) {
  rda_config c;
  load_ok(state,
          "return { heads = 4, kv_heads = 1, head_dim = 32, dtype = 'bf16',"
          " segments = { 8, 16, 32, 64 }, dilations = { 1, 1, 2, 5 }, offsets = 'group',"
          " causal = false, scale = 0.3 }",
          &c);
  assert_int_equal(c.kv_heads, 1);
  assert_int_equal(c.nbranch, 4);
  assert_int_equal(c.dilations[3], 5);
  assert_int_equal(c.offsets, RDA_OFFSETS_GROUP);
  assert_int_equal(c.causal, 0);
  assert_true(c.scale == 0.3);
  load_ok(state,
          "return { heads = 4, head_dim = 256, dtype = 'bf16', segments = { 8 },"
          " dilations = { 1 }, offsets = 'block', scale = 2 }",
          &c);
  assert_int_equal(c.offsets, RDA_OFFSETS_BLOCK);
  assert_true(c.scale == 2.0);
}

static void test_config_accepts_integral_floats(void **state) {
  rda_config c;
  load_ok(state,
          "return { heads = 16.0, head_dim = 128.0, dtype = 'bf16',"
          " segments = { 2048.0, 2^40 }, dilations = { 1.0, 4 } }",
          &c);
  assert_int_equal(c.heads, 16);
  assert_int_equal(c.head_dim, 128);
  assert_int_equal(c.segments[0], 2048);
  assert_true(c.segments[1] == (int64_t)1 << 40);
}

static void test_config_accepts_sixteen_branches(void **state) {
  rda_config c;
  load_ok(state,
          "local s, r = {}, {} for i = 1, 16 do s[i], r[i] = 64 * i, i end"
          " return { heads = 16, head_dim = 64, dtype = 'bf16', segments = s,"
          " dilations = r, offsets = 'group' }",
          &c);
  assert_int_equal(c.nbranch, 16);
  assert_int_equal(c.segments[15], 1024);
  assert_int_equal(c.dilations[15], 16);
}

static void test_config_can_compute_with_safe_helpers(void **state) {
  rda_config c;
  load_ok(state,
          "local segs = {}\n"
          "for i = 0, 2 do table.insert(segs, math.floor(2048 * 2 ^ i)) end\n"
          "local name = string.format('%s%d', 'bf', 16)\n"
          "assert(('x'):rep(3) == 'xxx' and #segs == 3)\n"
          "local d = tonumber('64') * 2\n"
          "return { heads = select('#', 1, 2, 3, 4), head_dim = d, dtype = name:lower(),\n"
          "         segments = segs, dilations = { 1, 2, 4 }, causal = type(d) == 'number' }\n",
          &c);
  assert_int_equal(c.heads, 4);
  assert_int_equal(c.head_dim, 128);
  assert_int_equal(c.segments[2], 8192);
  assert_int_equal(c.causal, 1);
}

static void test_config_loads_default_file(void **state) {
  char path[4096];
  snprintf(path, sizeof path, "%s/configs/default.lua", rda_gen_home());
  rda_config c;
  rda_err err = {0};
  if (rda_gen_config_file(*state, path, &c, &err) != RDA_OK) fail_msg("%s", err.msg);
  assert_true(c.nbranch >= 1);
  assert_true(c.heads % c.kv_heads == 0);
}

static void test_config_every_example_in_configs_is_valid(void **state) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/configs", rda_gen_home());
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    const size_t len = strlen(e->d_name);
    if (len < 5 || strcmp(e->d_name + len - 4, ".lua") != 0) continue;
    char path[8300];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    rda_config c;
    rda_err err = {0};
    if (rda_gen_config_file(*state, path, &c, &err) != RDA_OK) fail_msg("%s", err.msg);
    n++;
  }
  closedir(d);
  assert_true(n >= 1);
}

static void test_config_spec_example_file_matches_spec(void **state) {
  char path[4096];
  snprintf(path, sizeof path, "%s/configs/spec_example.lua", rda_gen_home());
  rda_config a, b;
  rda_err err = {0};
  assert_int_equal(rda_gen_config_file(*state, path, &a, &err), RDA_OK);
  load_ok(state, spec_example, &b);
  assert_memory_equal(&a, &b, sizeof a);
}

static void test_config_file_errors_name_the_file(void **state) {
  char path[] = "/tmp/rda_config_XXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char text[] =
      "return { heads = 16, head_dim = 80, dtype = 'bf16', segments = { 8 },"
      " dilations = { 1 } }\n";
  assert_int_equal(write(fd, text, sizeof text - 1), (long)(sizeof text - 1));
  close(fd);
  rda_config c;
  rda_err err = {0};
  const rda_status s = rda_gen_config_file(*state, path, &c, &err);
  unlink(path);
  assert_int_equal(s, RDA_ERR_CONFIG);
  char want[256];
  snprintf(want, sizeof want, "%s: head_dim = 80: must be one of 32, 64, 96, 128, 256", path);
  assert_string_equal(err.msg, want);
}

static void test_config_missing_file_is_io_error(void **state) {
  rda_config c;
  rda_err err = {0};
  assert_int_equal(rda_gen_config_file(*state, "/nonexistent/x.lua", &c, &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, "/nonexistent/x.lua"));
  rda_err_clear(&err);
  assert_int_equal(rda_gen_config_file(*state, "/tmp", &c, &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, "/tmp: cannot read: not a regular file (a folder)"));
}

/* A FIFO or pipe named as the config (`<(cat c.lua)`, /dev/stdin of a pipeline) is read to its
 * end. With no writer it fails after the time limit, one line, instead of hanging (a blocking
 * open or read would wait forever); a device is refused at once. */
static void test_config_file_reads_fifos_and_refuses_devices(void **state) {
  char *dir = rt_mkdtemp();
  assert_non_null(dir);
  char *fifo = rt_path(dir, "config.lua");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  rda_config c;
  rda_err err = {0};
  rda_gen_set_time_limit(*state, 0.3);
  alarm(20); /* a hang fails the test (SIGALRM) instead of stalling the suite */
  const double t0 = rt_now_s();
  rda_status s = rda_gen_config_file(*state, fifo, &c, &err);
  const double took = rt_now_s() - t0;
  alarm(0);
  assert_int_equal(s, RDA_ERR_IO);
  char want[4200];
  snprintf(want, sizeof want,
           "%s: cannot read: the pipe was not written and closed within the time limit (0.3 s)",
           fifo);
  assert_string_equal(err.msg, want);
  assert_true(took >= 0.25 && took < 5);
  /* A writer that takes its time (in pieces, 50 ms apart) is waited for. */
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    const int fd = open(fifo, O_WRONLY);
    static const char *const parts[] = {"return { heads = 8, head_dim = 64,", " dtype = 'fp16',",
                                        " segments = { 512 }, dilations = { 2 } }"};
    for (size_t i = 0; fd >= 0 && i < 3; i++) {
      const struct timespec nap = {0, 50 * 1000 * 1000};
      nanosleep(&nap, NULL);
      if (write(fd, parts[i], strlen(parts[i])) < 0) _exit(1);
    }
    _exit(fd >= 0 ? 0 : 1);
  }
  rda_err_clear(&err);
  alarm(20);
  s = rda_gen_config_file(*state, fifo, &c, &err);
  alarm(0);
  int wst = 0;
  assert_int_equal(waitpid(pid, &wst, 0), pid);
  rda_gen_set_time_limit(*state, 0);
  if (s != RDA_OK) fail_msg("a FIFO with a writer: %s", err.msg);
  assert_true(c.heads == 8 && c.head_dim == 64 && c.dtype == RDA_DTYPE_FP16 &&
              c.segments[0] == 512 && c.dilations[0] == 2);
  rda_err_clear(&err);
  assert_int_equal(rda_gen_config_file(*state, "/dev/zero", &c, &err), RDA_ERR_IO);
  assert_string_equal(err.msg, "/dev/zero: cannot read: not a regular file (a device)");
  unlink(fifo);
  free(fifo);
  rt_rmtree(dir);
  free(dir);
}

/* Lua cuts chunk names to about 60 characters; a config in a deep folder is still named in
 * full, with the line, by every kind of error. */
static void test_config_errors_name_a_long_path_in_full(void **state) {
  char *dir = rt_mkdtemp();
  assert_non_null(dir);
  char *deep = rt_path(dir, "a_folder_name_long_enough_that_lua_would_cut_the_path_short");
  assert_int_equal(mkdir(deep, 0700), 0);
  char *path = rt_path(deep, "config.lua");
  static const struct {
    const char *text, *tail;
  } cases[] = {
      {"return {\n  heads = = 1 }", ":2: unexpected symbol near '='"},
      {"local t\nreturn t.x", ":2: attempt to index a nil value"},
      {"\nwhile true do end", ":2: config exceeds the instruction limit"},
      {"\nlocal s = string.rep('x', 1e9) return {}", ":2: config exceeds the memory limit"},
      {"error('', 0)", ": (empty message)"},
      {"return { heads = 0 }", ": heads = 0: must be an integer from 1 to 65535"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_true(rt_write_file(path, cases[i].text, strlen(cases[i].text)));
    rda_config c;
    rda_err err = {0};
    assert_int_equal(rda_gen_config_file(*state, path, &c, &err), RDA_ERR_CONFIG);
    char want[4300];
    snprintf(want, sizeof want, "%s%s", path, cases[i].tail);
    if (strncmp(err.msg, want, strlen(want)) != 0)
      fail_msg("message \"%s\" does not start with \"%s\"", err.msg, want);
  }
  unlink(path);
  free(path);
  free(deep);
  rt_rmtree(dir);
  free(dir);
}

/* ---- validation rules -------------------------------------------------------------------- */

static void test_config_rejects_head_dim_with_exact_message(void **state) {
  rda_config c;
  rda_err err = {0};
  assert_int_equal(rda_gen_config_string(*state,
                                         "return { heads = 16, head_dim = 80, dtype = 'bf16',"
                                         " segments = { 8 }, dilations = { 1 } }",
                                         "configs/x.lua", &c, &err),
                   RDA_ERR_CONFIG);
  assert_string_equal(err.msg, "configs/x.lua: head_dim = 80: must be one of 32, 64, 96, 128, 256");
}

static void test_config_rejects_unknown_key(void **state) {
  char buf[512];
  with(buf, sizeof buf, "segment_len = 4");
  expect_error(state, buf, "segment_len = 4", "unknown key", "allowed keys are heads", NULL);
}

/* A long key name is cut with "..." (like long string values), so the message keeps its
 * reason and list of allowed keys. */
static void test_config_rejects_a_long_unknown_key_shown_cut(void **state) {
  char key[3001], buf[3600];
  memset(key, 'x', sizeof key - 1);
  key[sizeof key - 1] = '\0';
  snprintf(buf, sizeof buf,
           "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
           " dilations = { 1 }, %s = 1 }",
           key);
  expect_error(state, buf, "[\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...\"] = 1",
               "unknown key: allowed keys are heads", NULL);
}

static void test_config_rejects_non_string_key(void **state) {
  char buf[512];
  with(buf, sizeof buf, "'extra'");
  expect_error(state, buf, "[1] = \"extra\"", "unknown key", NULL);
}

static void test_config_rejects_dropout_as_not_supported(void **state) {
  char buf[512];
  with(buf, sizeof buf, "dropout = 0.1");
  expect_error(state, buf, "dropout = 0.1", "not supported", "dropout is not defined", NULL);
}

static void test_config_rejects_mask_as_not_supported(void **state) {
  char buf[512];
  with(buf, sizeof buf, "attn_mask = 'sliding'");
  expect_error(state, buf, "attn_mask = \"sliding\"", "not supported", "masks", NULL);
  with(buf, sizeof buf, "mask = true");
  expect_error(state, buf, "mask = true", "not supported", NULL);
}

static void test_config_rejects_cross_attention_as_not_supported(void **state) {
  char buf[512];
  with(buf, sizeof buf, "cross_attention = true");
  expect_error(state, buf, "cross_attention = true", "not supported", "Lq", NULL);
  with(buf, sizeof buf, "kv_len = 4096");
  expect_error(state, buf, "kv_len = 4096", "not supported", NULL);
}

static void test_config_rejects_missing_heads(void **state) {
  expect_error(state,
               "return { head_dim = 64, dtype = 'bf16', segments = { 8 }, dilations = { 1 } }",
               "heads = nil", "required", "integer from 1", NULL);
}

static void test_config_rejects_heads_of_wrong_type(void **state) {
  expect_error(state,
               "return { heads = '16', head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 } }",
               "heads = \"16\"", "must be an integer", NULL);
}

static void test_config_rejects_zero_heads(void **state) {
  expect_error(state,
               "return { heads = 0, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 } }",
               "heads = 0", "integer from 1 to 65535", NULL);
}

static void test_config_rejects_fractional_heads(void **state) {
  expect_error(state,
               "return { heads = 2.5, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 } }",
               "heads = 2.5", "integer", NULL);
}

static void test_config_rejects_kv_heads_not_dividing(void **state) {
  expect_error(state,
               "return { heads = 16, kv_heads = 3, head_dim = 64, dtype = 'bf16',"
               " segments = { 8 }, dilations = { 1 } }",
               "kv_heads = 3", "must divide heads = 16", NULL);
}

static void test_config_rejects_kv_heads_above_heads(void **state) {
  expect_error(state,
               "return { heads = 4, kv_heads = 8, head_dim = 64, dtype = 'bf16',"
               " segments = { 8 }, dilations = { 1 } }",
               "kv_heads = 8", "at most heads = 4", NULL);
}

static void test_config_rejects_negative_kv_heads(void **state) {
  expect_error(state,
               "return { heads = 4, kv_heads = -2, head_dim = 64, dtype = 'bf16',"
               " segments = { 8 }, dilations = { 1 } }",
               "kv_heads = -2", "integer", NULL);
}

static void test_config_rejects_missing_head_dim(void **state) {
  expect_error(state, "return { heads = 4, dtype = 'bf16', segments = { 8 }, dilations = { 1 } }",
               "head_dim = nil", "required", "32, 64, 96, 128, 256", NULL);
}

static void test_config_rejects_unsupported_dtype(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'fp32', segments = { 8 },"
               " dilations = { 1 } }",
               "dtype = \"fp32\"", "\"bf16\", \"fp16\"", NULL);
}

static void test_config_rejects_missing_dtype(void **state) {
  expect_error(state, "return { heads = 4, head_dim = 64, segments = { 8 }, dilations = { 1 } }",
               "dtype = nil", "required", NULL);
}

static void test_config_rejects_missing_segments(void **state) {
  expect_error(state, "return { heads = 4, head_dim = 64, dtype = 'bf16', dilations = { 1 } }",
               "segments = nil", "required", "list of 1 to 16", NULL);
}

static void test_config_rejects_missing_dilations(void **state) {
  expect_error(state, "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 } }",
               "dilations = nil", "required", NULL);
}

static void test_config_rejects_empty_segments(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = {},"
               " dilations = {} }",
               "segments = {}", "0 entries", "list of 1 to 16", NULL);
}

static void test_config_rejects_segments_not_a_list(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = 2048,"
               " dilations = { 1 } }",
               "segments = 2048", "must be a list", NULL);
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16',"
               " segments = { 8, w = 16 }, dilations = { 1 } }",
               "segments = ", "key w is not a list index", NULL);
}

static void test_config_rejects_zero_segment(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8, 0 },"
               " dilations = { 1, 1 } }",
               "segments[2] = 0", "integer >= 1", NULL);
}

static void test_config_rejects_fractional_segment(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8.5 },"
               " dilations = { 1 } }",
               "segments[1] = 8.5", "integer >= 1", NULL);
}

static void test_config_rejects_huge_segment(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 1e30 },"
               " dilations = { 1 } }",
               "segments[1] = 1e+30", "integer >= 1", NULL);
}

/* Segment lengths and dilation rates stop at 2^40, so the index arithmetic on them (ceil(N/w),
 * p + r) cannot overflow int64; one line naming the key, the value and the bound. */
static void test_config_rejects_sizes_above_two_to_the_forty(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8, (1 << 40) + 1 },"
               " dilations = { 1, 1 } }",
               "segments[2] = 1099511627777: must be at most 2^40 = 1099511627776", NULL);
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { math.maxinteger } }",
               "dilations[1] = 9223372036854775807: must be at most 2^40 = 1099511627776", NULL);
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 1 << 62 },"
               " dilations = { 3 } }",
               "segments[1] = 4611686018427387904", "at most 2^40", NULL);
  rda_config c;
  load_ok(state,
          "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 1 << 40, 16 },"
          " dilations = { 2, 1 << 40 }, offsets = 'block' }",
          &c);
  assert_true(c.segments[0] == (int64_t)1 << 40 && c.dilations[1] == (int64_t)1 << 40);
  /* rda_config_offset on the largest rate: ceil(H / r) without overflow, offset h / 1 = h. */
  for (int h = 0; h < 4; h++) assert_int_equal(rda_config_offset(&c, 1, h), h);
}

/* What the generator's C side checks for a config that did not come from validation (the ring,
 * the tests, the tuner build rda_config by hand): a negative scale plans, and what validation
 * rejects is refused with a line naming the field. */
static void test_config_plan_checks_hand_made_configs(void **state) {
  rda_config c;
  load_ok(state, spec_example, &c);
  rda_hw hw;
  rda_plan_k p;
  rda_err err = {0};
  assert_int_equal(rda_gen_hw_builtin(*state, 90, &hw, &err), RDA_OK);
  c.scale = -0.25;
  if (rda_gen_plan(*state, &c, &hw, &p, &err) != RDA_OK) fail_msg("negative scale: %s", err.msg);
  rda_plan_k_free(&p);
  static const double bad_scales[] = {0.0, 1e300, -1e39, INFINITY};
  for (size_t i = 0; i < sizeof bad_scales / sizeof bad_scales[0]; i++) {
    c.scale = bad_scales[i];
    rda_err_clear(&err);
    assert_int_equal(rda_gen_plan(*state, &c, &hw, &p, &err), RDA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "scale = "));
  }
  c.scale = 0.5;
  c.dilations[2] = INT64_MAX;
  rda_err_clear(&err);
  assert_int_equal(rda_gen_plan(*state, &c, &hw, &p, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "dilations[2] = 9223372036854775807: must be from 1 to 2^40"));
  c.dilations[2] = 4;
  c.segments[0] = ((int64_t)1 << 40) + 1;
  rda_err_clear(&err);
  assert_int_equal(rda_gen_plan(*state, &c, &hw, &p, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "segments[0] = 1099511627777"));
}

static void test_config_rejects_zero_dilation(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 0 } }",
               "dilations[1] = 0", "integer >= 1", NULL);
}

static void test_config_rejects_string_dilation(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { '2' } }",
               "dilations[1] = \"2\"", "integer >= 1", NULL);
}

static void test_config_rejects_mismatched_lengths(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8, 16 },"
               " dilations = { 1 } }",
               "dilations = {1}", "1 entries but segments has 2", NULL);
}

static void test_config_rejects_seventeen_branches(void **state) {
  expect_error(state,
               "local s = {} for i = 1, 17 do s[i] = i end"
               " return { heads = 4, head_dim = 64, dtype = 'bf16', segments = s,"
               " dilations = s }",
               "segments = {1, 2, 3", "17 entries", "1 to 16", NULL);
}

static void test_config_rejects_unknown_offsets(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 }, offsets = 'ring' }",
               "offsets = \"ring\"", "\"mod\", \"block\", \"group\"", NULL);
}

static void test_config_rejects_group_with_fewer_heads_than_branches(void **state) {
  expect_error(state,
               "return { heads = 2, head_dim = 64, dtype = 'bf16', segments = { 8, 16, 32 },"
               " dilations = { 1, 2, 4 }, offsets = 'group' }",
               "offsets = \"group\"", "heads = 2", "3 branches", NULL);
}

static void test_config_rejects_non_boolean_causal(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 }, causal = 1 }",
               "causal = 1", "true or false", NULL);
}

static void test_config_rejects_zero_scale(void **state) {
  /* In the C API 0 means the default; a file cannot ask for τ = 0 by it. */
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 }, scale = 0 }",
               "scale = 0: ", "finite nonzero number", "leave scale out", NULL);
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 }, scale = -0.0 }",
               "scale = -0.0: ", "nonzero", NULL);
}

static void test_config_accepts_negative_scale(void **state) {
  /* SPEC §1 puts no sign on τ; the kernels fold a negative one into the scores. */
  rda_config c;
  load_ok(state,
          "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
          " dilations = { 1 }, scale = -0.5 }",
          &c);
  assert_true(c.scale == -0.5);
  load_ok(state,
          "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
          " dilations = { 1 }, scale = -2e38 }",
          &c);
  assert_true(c.scale == -2e38);
}

static void test_config_rejects_scale_whose_fp32_constant_overflows(void **state) {
  /* |scale| * log2(e) must be a finite float: |scale| <= FLT_MAX / log2(e) ~ 2.3586574e38. */
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 }, scale = 1e300 }",
               "scale = 1e+300: ", "|scale| <= 2.3586574e+38", "fit in fp32", NULL);
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 }, scale = -1e39 }",
               "scale = -1e+39: ", "|scale| <= 2.3586574e+38", NULL);
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 }, scale = 2.36e38 }",
               "scale = 2.36e+38: ", "fit in fp32", NULL);
  rda_config c;
  load_ok(state,
          "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
          " dilations = { 1 }, scale = 2.358e38 }",
          &c);
  assert_true(c.scale == 2.358e38);
  /* The bound the message prints passes; one unit of its last digit more does not. */
  load_ok(state,
          "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
          " dilations = { 1 }, scale = -2.3586574e38 }",
          &c);
  assert_true(c.scale == -2.3586574e38);
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 }, scale = 2.3586575e38 }",
               "scale = 2.3586575e+38: ", "fit in fp32", NULL);
}

static void test_config_rejects_infinite_scale(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 }, scale = math.huge }",
               "scale = inf", "finite", NULL);
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 }, scale = -math.huge }",
               "scale = -inf", "finite", NULL);
}

static void test_config_rejects_nan_scale(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 }, scale = 0/0 }",
               "scale = nan:", "finite", NULL); /* "nan", never C's "-nan" */
}

static void test_config_rejects_string_scale(void **state) {
  expect_error(state,
               "return { heads = 4, head_dim = 64, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 }, scale = '0.1' }",
               "scale = \"0.1\"", "number", NULL);
}

static void test_config_leaves_output_zeroed_on_failure(void **state) {
  rda_config c;
  memset(&c, 0x5a, sizeof c);
  rda_err err = {0};
  assert_int_equal(rda_gen_config_string(*state, "return 1", "x", &c, &err), RDA_ERR_CONFIG);
  assert_int_equal(c.heads, 0);
  assert_int_equal(c.nbranch, 0);
}

/* ---- what a chunk may be ----------------------------------------------------------------- */

static void test_config_rejects_non_table_return(void **state) {
  expect_error(state, "return 5", "must return a table, not 5", NULL);
  expect_error(state, "local x = 1", "must return a table, not nothing", NULL);
  expect_error(state, "return 'heads'", "must return a table, not \"heads\"", NULL);
}

static void test_config_syntax_error_carries_chunk_and_line(void **state) {
  expect_error(state, "return {\n  heads = 16,\n  head_dim = = 64,\n}", "configs/x.lua:3:", NULL);
  expect_error(state, "return {", "configs/x.lua:1:", NULL);
}

static void test_config_runtime_error_carries_chunk_and_line(void **state) {
  expect_error(state, "local t = nil\nreturn t.x", "configs/x.lua:2:", "nil", NULL);
  expect_error(state, "error('my own\\nmessage')", "configs/x.lua:1: my own message", NULL);
  expect_error(state, "error({})", "error that is a table", NULL);
}

/* Whatever a config raises, the message is one line that starts with its name (checked by
 * expect_error), says something, and carries no control character. */
static void test_config_errors_are_one_clean_line(void **state) {
  rda_config c;
  rda_err err = {0};
  static const struct {
    const char *text, *want;
  } exact[] = {
      {"error('', 0)", "configs/x.lua: (empty message)"},
      {"error('  ', 0)", "configs/x.lua: (empty message)"},
      {"error('')", "configs/x.lua:1: (empty message)"},
      {"error('x', 0)", "configs/x.lua: x"},
      {"error('configs/x.lua:7: named already', 0)", "configs/x.lua:7: named already"},
      {"error('\\27[2J\\27[31mred\\0hidden', 0)", "configs/x.lua: ?[2J?[31mred"},
      {"error('a\\tb\\rc\\1d\\127e', 0)", "configs/x.lua: a b c?d?e"},
  };
  for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
    rda_err_clear(&err);
    assert_int_equal(rda_gen_config_string(*state, exact[i].text, "configs/x.lua", &c, &err),
                     RDA_ERR_CONFIG);
    assert_string_equal(err.msg, exact[i].want);
  }
  /* Lua's own messages without a place: the parser's and the sort's C stack overflows. */
  char deep[1024];
  size_t n = (size_t)sprintf(deep, "return ");
  for (int i = 0; i < 300; i++) deep[n++] = '(';
  deep[n++] = '1';
  for (int i = 0; i < 300; i++) deep[n++] = ')';
  deep[n] = '\0';
  expect_error(state, deep, "configs/x.lua: ", "overflow", NULL);
  expect_error(state,
               "local function f(a, b) table.sort({ 2, 1, 3 }, f) return a < b end"
               " table.sort({ 2, 1, 3 }, f) return {}",
               "configs/x.lua", "overflow", NULL);
}

typedef struct dump_buf {
  char data[65536];
  size_t len;
} dump_buf;

static int dump_writer(lua_State *L, const void *p, size_t sz, void *ud) {
  (void)L;
  dump_buf *b = ud;
  if (b->len + sz > sizeof b->data) return 1;
  memcpy(b->data + b->len, p, sz);
  b->len += sz;
  return 0;
}

/* 1 when s is valid UTF-8 holding no control character: C0, DEL or C1 (U+0080..U+009F). */
static int clean_utf8(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p != '\0';) {
    if (*p < 0x20 || *p == 0x7f) return 0;
    if (*p < 0x80) {
      p++;
      continue;
    }
    const int n = *p >= 0xf0 ? 4 : *p >= 0xe0 ? 3 : *p >= 0xc2 ? 2 : 0;
    if (n == 0) return 0;
    for (int i = 1; i < n; i++)
      if ((p[i] & 0xc0) != 0x80) return 0;
    if (p[0] == 0xc2 && p[1] <= 0x9f) return 0;
    p += n;
  }
  return 1;
}

/* Terminal controls encoded in UTF-8 (the C1 CSI \xC2\x9B, as ESC [ does) are replaced as the
 * C0 ones are, and a message cut at the message size never ends in part of a character: every
 * cut offset within 2-, 3- and 4-byte characters is tried. */
static void test_config_errors_hold_no_c1_controls_nor_split_characters(void **state) {
  rda_config c;
  rda_err err = {0};
  assert_int_equal(rda_gen_config_string(*state,
                                         "error('a\xC2\x9B"
                                         "31mred\xC2\x85"
                                         "b\xC2\xA0\xC3\xA9', 0)",
                                         "configs/x.lua", &c, &err),
                   RDA_ERR_CONFIG);
  assert_string_equal(err.msg, "configs/x.lua: a?31mred?b\xC2\xA0\xC3\xA9");
  /* Ill-formed UTF-8 that lenient decoders read as controls: an overlong CSI (C0 9B, E0 82 9B),
   * a surrogate (ED A0 80), a lead past F4 (F8): every byte of them is '?'. */
  rda_err_clear(&err);
  assert_int_equal(rda_gen_config_string(*state,
                                         "error('A\xC0\x9B"
                                         "B\xE0\x82\x9B"
                                         "C\xED\xA0\x80"
                                         "D\xF8\x80\x80\x9B"
                                         "E', 0)",
                                         "configs/x.lua", &c, &err),
                   RDA_ERR_CONFIG);
  assert_string_equal(err.msg, "configs/x.lua: A??B???C???D????E");
  static const char *const chars[] = {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"};
  for (size_t k = 0; k < sizeof chars / sizeof chars[0]; k++) {
    for (int pad = 0; pad < 4; pad++) {
      char text[256];
      snprintf(text, sizeof text, "error(('a'):rep(%d) .. ('%s'):rep(600) .. ('z'):rep(%d), 0)",
               pad, chars[k], 10 + pad);
      rda_err_clear(&err);
      assert_int_equal(rda_gen_config_string(*state, text, "configs/x.lua", &c, &err),
                       RDA_ERR_CONFIG);
      if (!clean_utf8(err.msg)) fail_msg("pad %d, char %zu: not clean UTF-8: %s", pad, k, err.msg);
      assert_true(strlen(err.msg) > sizeof err.msg - 8); /* it was cut, near the end */
    }
  }
}

/* RDA_CONFIG_TIME_LIMIT sets the sandbox's time limit of every generator opened after it;
 * anything but a number of seconds from 0.01 to 3600 fails the open, naming it. */
static void test_config_time_limit_from_the_environment(void **state) {
  (void)state;
  char *saved = rt_env_save("RDA_CONFIG_TIME_LIMIT");
  static const char *const bad[] = {"0", "-1", "abc", "1e9", "nan", "inf", " 1", "1s", "0.001", "0x10", "0x1p2"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(setenv("RDA_CONFIG_TIME_LIMIT", bad[i], 1), 0);
    rda_gen *g = NULL;
    rda_err err = {0};
    assert_int_equal(rda_gen_open(&g, &err), RDA_ERR_INVALID_ARGUMENT);
    assert_null(g);
    char want[256];
    snprintf(want, sizeof want,
             "RDA_CONFIG_TIME_LIMIT='%s': expected seconds, a number from 0.01 to 3600", bad[i]);
    assert_string_equal(err.msg, want);
  }
  assert_int_equal(setenv("RDA_CONFIG_TIME_LIMIT", "0.25", 1), 0);
  rda_gen *g = NULL;
  rda_err err = {0};
  assert_int_equal(rda_gen_open(&g, &err), RDA_OK);
  rda_config c;
  assert_int_equal(rda_gen_config_string(g,
                                         "local s = ('x'):rep(1 << 20)\n"
                                         "for i = 1, 100000 do local u = s:upper() end",
                                         "t.lua", &c, &err),
                   RDA_ERR_CONFIG);
  assert_string_equal(err.msg, "t.lua:2: config exceeds the time limit (0.25 s)");
  rda_gen_set_time_limit(g, 1.5);
  rda_gen_set_time_limit(g, 0); /* back to the environment's, not the built-in 5 s */
  rda_err_clear(&err);
  assert_int_equal(rda_gen_config_string(g,
                                         "local s = ('x'):rep(1 << 20)\n"
                                         "for i = 1, 100000 do local u = s:upper() end",
                                         "t.lua", &c, &err),
                   RDA_ERR_CONFIG);
  assert_string_equal(err.msg, "t.lua:2: config exceeds the time limit (0.25 s)");
  rda_gen_close(g);
  rt_env_restore("RDA_CONFIG_TIME_LIMIT", saved);
}

static void test_config_rejects_binary_chunk(void **state) {
  lua_State *L = luaL_newstate();
  assert_non_null(L);
  assert_int_equal(luaL_loadstring(L,
                                   "return { heads = 4, head_dim = 64, dtype = 'bf16',"
                                   " segments = { 8 }, dilations = { 1 } }"),
                   LUA_OK);
  static dump_buf b;
  b.len = 0;
  assert_int_equal(lua_dump(L, dump_writer, &b, 0), 0);
  lua_close(L);
  const char *bin = b.data;
  const size_t len = b.len;
  char path[] = "/tmp/rda_config_binXXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, bin, len), (long)len);
  close(fd);
  rda_config c;
  rda_err err = {0};
  const rda_status s = rda_gen_config_file(*state, path, &c, &err);
  unlink(path);
  assert_int_equal(s, RDA_ERR_CONFIG);
  assert_non_null(strstr(err.msg, "binary chunks are not accepted"));
  assert_non_null(strstr(err.msg, path));
}

/* ---- sandbox ----------------------------------------------------------------------------- */

static void test_config_sandbox_has_no_os(void **state) {
  char marker[] = "/tmp/rda_sandbox_markerXXXXXX";
  const int fd = mkstemp(marker);
  assert_true(fd >= 0);
  close(fd);
  unlink(marker);
  char text[512];
  snprintf(text, sizeof text, "os.execute('touch %s') return {}", marker);
  expect_error(state, text, "configs/x.lua:1:", "os", NULL);
  struct stat st;
  assert_int_not_equal(stat(marker, &st), 0);
  expect_error(state, "return { heads = os.getenv('HOME') }", "os", NULL);
}

static void test_config_sandbox_has_no_io(void **state) {
  expect_error(state, "local f = io.open('/etc/passwd') return {}", "configs/x.lua:1:", "io", NULL);
  expect_error(state, "io.write('x') return {}", "io", NULL);
}

static void test_config_sandbox_has_no_loaders(void **state) {
  expect_error(state, "require('os') return {}", "require", NULL);
  expect_error(state, "load('return 1')() return {}", "load", NULL);
  expect_error(state, "loadstring('return 1')() return {}", "loadstring", NULL);
  expect_error(state, "dofile('/etc/passwd') return {}", "dofile", NULL);
  expect_error(state, "loadfile('/etc/passwd') return {}", "loadfile", NULL);
  expect_error(state, "package.loaded.os.execute('true') return {}", "package", NULL);
}

static void test_config_sandbox_has_no_debug(void **state) {
  expect_error(state, "debug.sethook() return {}", "debug", NULL);
  expect_error(state, "collectgarbage('stop') return {}", "collectgarbage", NULL);
  expect_error(state, "print('hello') return {}", "print", NULL);
}

static void test_config_sandbox_has_no_metatables(void **state) {
  expect_error(state, "local mt = getmetatable('') return {}", "getmetatable", NULL);
  expect_error(state, "setmetatable({}, { __gc = function() end }) return {}", "setmetatable",
               NULL);
  expect_error(state, "rawset(_ENV, 'x', 1) return {}", "rawset", NULL);
  expect_error(state, "local s = 'x' s.dump = 1 return {}", "configs/x.lua:1:", NULL);
}

static void test_config_sandbox_has_no_string_dump(void **state) {
  expect_error(state, "local b = string.dump(function() end) return {}", "dump", NULL);
  expect_error(state, "local b = ('').dump(function() end) return {}", "dump", NULL);
}

static void test_config_sandbox_string_methods_see_only_safe_functions(void **state) {
  /* Pattern functions run in C, where the instruction count cannot see a pathological
   * pattern; they are not in the sandbox, through the library or through string methods. */
  expect_error(state, "local i = ('abc'):find('b') return {}", "find", NULL);
  expect_error(state, "local i = ('abc'):gsub('b', 'c') return {}", "gsub", NULL);
  expect_error(state, "return _G", "_G is not available", NULL);
}

static void test_config_sandbox_has_no_pcall(void **state) {
  /* pcall would let a config catch its own limit errors and keep going. */
  expect_error(state, "pcall(function() end) return {}", "pcall", NULL);
  expect_error(state, "xpcall(function() end, error) return {}", "xpcall", NULL);
  expect_error(state, "coroutine.wrap(function() end)() return {}", "coroutine", NULL);
}

static void test_config_sandbox_cannot_break_the_generator(void **state) {
  /* A config that changes its copies of the libraries leaves the generator's intact: the
   * next config (whose error message is built with string methods) still works. */
  expect_error(state,
               "string.format = nil table.concat = nil math.floor = nil"
               " string.rep = error return 7",
               "must return a table, not 7", NULL);
  expect_error(state,
               "return { heads = 4, head_dim = 80, dtype = 'bf16', segments = { 8 },"
               " dilations = { 1 } }",
               "head_dim = 80: must be one of 32, 64, 96", NULL);
  rda_config c;
  load_ok(state, spec_example, &c);
  assert_int_equal(c.heads, 16);
}

/* ---- limits ------------------------------------------------------------------------------ */

static void test_config_stops_runaway_loop(void **state) {
  const double t0 = rt_now_s();
  expect_error(state, "local x = 0\nwhile true do x = x + 1 end",
               "configs/x.lua:2: config exceeds the instruction limit", NULL);
  assert_true(rt_now_s() - t0 < 20.0);
}

static void test_config_stops_runaway_recursion(void **state) {
  expect_error(state, "local function f(n) return f(n + 1) end return f(1)",
               "config exceeds the instruction limit", NULL);
  expect_error(state, "local function f(n) return 1 + f(n + 1) end return f(1)",
               "configs/x.lua:1:", NULL); /* stack overflow, or a limit: never a crash */
}

static void test_config_stops_string_bomb(void **state) {
  expect_error(state, "local s = string.rep('x', 1e9) return {}",
               "configs/x.lua:1: config exceeds the memory limit (64 MiB)", NULL);
  expect_error(state, "local s = ('x'):rep(1 << 28, 'yy') return {}",
               "config exceeds the memory limit", NULL);
  /* Past 2 GiB the string library refuses before allocating: one clean line too. */
  expect_error(state, "local s = string.rep('x', 1e10) return {}",
               "configs/x.lua:1:", "string too large", NULL);
  expect_error(state, "local s = 'xxxxxxxx'\nfor i = 1, 40 do s = s .. s end\nreturn {}",
               "configs/x.lua:2: config exceeds the memory limit", NULL);
}

static void test_config_stops_table_bomb(void **state) {
  /* Whichever bound comes first, the message names it. */
  expect_error(state, "local t = {} for i = 1, 1e9 do t[i] = i end return {}", "config exceeds the",
               "limit", NULL);
  expect_error(state,
               "local t = {} for i = 1, 1e9 do t[i] = { i, i, i, i, i, i, i, i } end"
               " return {}",
               "config exceeds the memory limit", NULL);
}

static void test_config_stops_c_loops_that_allocate_nothing(void **state) {
  /* Loops inside C functions escape the instruction count; these would spin for years. */
  const double t0 = rt_now_s();
  rda_config c;
  load_ok(state,
          "local e = ('').rep('', 1 << 60) .. string.rep('', 1e18, '')"
          " assert(e == '') return { heads = 1, head_dim = 32, dtype = 'bf16',"
          " segments = { 8 }, dilations = { 1 } }",
          &c);
  expect_error(state, "table.move({}, 1, 1 << 60, 2) return {}", "move", NULL);
  assert_true(rt_now_s() - t0 < 20.0);
}

/* One instruction can start a long C call (a sort of a large table, a 16 MiB string upper-
 * cased or reversed): the instruction count alone would let a loop of them run for hours. The
 * clock, read at every call, stops them; the limit is lowered here so the test runs fast. Each
 * loop would run about a minute (hours: the sort of long strings) without it. The strings are
 * small enough that the memory limit, which garbage not yet collected counts against, does
 * not trip first. */
static void test_config_time_limit_stops_loops_of_c_calls(void **state) {
  rda_gen_set_time_limit(*state, 0.5);
  const double t0 = rt_thread_cpu_s();
  expect_error(state,
               "local t = {} for i = 1, 100000 do t[i] = i end\n"
               "for i = 1, 2000 do table.sort(t) end return {}",
               "configs/x.lua:2: config exceeds the time limit (0.5 s)", NULL);
  expect_error(state,
               "local s = ('x'):rep(1 << 20)\n"
               "for i = 1, 100000 do local u = s:upper() end return {}",
               "configs/x.lua:2: config exceeds the time limit (0.5 s)", NULL);
  expect_error(state,
               "local s = ('x'):rep(1 << 20) local n = 0\n"
               "for i = 1, 100000 do n = n + #s:reverse() end return {}",
               "configs/x.lua:2: config exceeds the time limit (0.5 s)", NULL);
  /* One call: the sort of 20000 equal 4 MiB strings compares inside C for minutes. */
  expect_error(state,
               "local s = ('x'):rep(4 << 20) local t = {}\n"
               "for i = 1, 20000 do t[i] = s end\ntable.sort(t) return {}",
               "configs/x.lua:3: config exceeds the time limit (0.5 s)", NULL);
  /* No calls at all: equal 2 MiB strings compared, one instruction each. */
  expect_error(state,
               "local a = ('x'):rep(1 << 21) local b, c = a .. 'y', a .. 'y' local n = 0\n"
               "for i = 1, 1000000 do if b == c then n = n + 1 end end return {}",
               "configs/x.lua:2: config exceeds the time limit (0.5 s)", NULL);
  const double took = rt_thread_cpu_s() - t0; /* five runs of 0.5 s each */
  rda_gen_set_time_limit(*state, 0);          /* the default again */
  assert_true(took < 8.0);
  /* Real configs never come near the default limit. */
  rda_config c;
  load_ok(state, spec_example, &c);
  char path[4096];
  snprintf(path, sizeof path, "%s/configs/default.lua", rda_gen_home());
  rda_err err = {0};
  const double t1 = rt_now_s();
  for (int i = 0; i < 100; i++)
    assert_int_equal(rda_gen_config_file(*state, path, &c, &err), RDA_OK);
  assert_true((rt_now_s() - t1) / 100 < RDA_GEN_SANDBOX_SECONDS / 100);
}

/* The time limit counts the sandbox thread's CPU time: a process stopped or starved while a
 * config runs (here: the thread paused in a signal handler for longer than the limit, as
 * SIGSTOP or a throttled container would) does not fail a config that needs well under the
 * limit of CPU. The pause is set off by a timer on the thread's own CPU clock, 20 ms of CPU
 * into the config: a signal sent by another thread after a nap would come after the config
 * had ended whenever that thread was late to wake, and pause nothing. The config needs 0.1 to
 * 0.4 s of CPU in a plain build and more under a sanitizer, so the limit is four times what it
 * took unpaused (at least 0.6 s), and the pause half a second longer than the limit. */
typedef struct paused_run {
  rda_gen *g;
  int pause; /* 0: run unpaused, only to take the CPU time */
  rda_status status;
  rda_err err;
  rda_config c;
  int armed;
  double cpu_s; /* the run's CPU time */
} paused_run;

static volatile sig_atomic_t g_paused;
static struct timespec g_pause_for;

static void pause_handler(int sig) {
  (void)sig;
  g_paused = 1;
  nanosleep(&g_pause_for, NULL);
}

static void *paused_run_main(void *arg) {
  paused_run *r = arg;
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_UNBLOCK, &usr1, NULL); /* this thread alone: the main thread blocks it */
  struct sigevent ev;
  memset(&ev, 0, sizeof ev);
  ev.sigev_notify = SIGEV_SIGNAL;
  ev.sigev_signo = SIGUSR1;
  timer_t timer;
  const struct itimerspec at = {{0, 0}, {0, 20 * 1000 * 1000}};
  r->armed = r->pause && timer_create(CLOCK_THREAD_CPUTIME_ID, &ev, &timer) == 0;
  if (r->armed && timer_settime(timer, 0, &at, NULL) != 0) r->armed = 0;
  const double cpu0 = rt_thread_cpu_s();
  r->status = rda_gen_config_string(r->g,
                                    "local s = ('x'):rep(4 << 20)\n"
                                    "for i = 1, 40 do local u = s:upper() end\n"
                                    "return { heads = 2, head_dim = 32, dtype = 'bf16',"
                                    " segments = { 16 }, dilations = { 1 } }",
                                    "paused.lua", &r->c, &r->err);
  r->cpu_s = rt_thread_cpu_s() - cpu0;
  if (r->armed) timer_delete(timer);
  return NULL;
}

static void test_config_time_limit_is_cpu_time(void **state) {
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = pause_handler;
  sigemptyset(&sa.sa_mask);
  assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
  sigset_t usr1, old_mask; /* the timer's signal is the process's: only the run may take it */
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  assert_int_equal(pthread_sigmask(SIG_BLOCK, &usr1, &old_mask), 0);
  paused_run unpaused = {.g = *state, .status = RDA_ERR_INTERNAL};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, paused_run_main, &unpaused), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  if (unpaused.status != RDA_OK) fail_msg("the config failed unpaused: %s", unpaused.err.msg);
  const double limit = 4 * unpaused.cpu_s > 0.6 ? 4 * unpaused.cpu_s : 0.6;
  const double pause_s = limit + 0.5;
  g_pause_for.tv_sec = (time_t)pause_s;
  g_pause_for.tv_nsec = (long)(1e9 * (pause_s - (double)g_pause_for.tv_sec));
  rda_gen_set_time_limit(*state, limit);
  paused_run r = {.g = *state, .pause = 1, .status = RDA_ERR_INTERNAL};
  g_paused = 0;
  const double t0 = rt_now_s();
  assert_int_equal(pthread_create(&t, NULL, paused_run_main, &r), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  const double took = rt_now_s() - t0;
  rda_gen_set_time_limit(*state, 0);
  pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
  sigaction(SIGUSR1, &old, NULL);
  assert_true(r.armed);
  if (r.status != RDA_OK) fail_msg("a paused config failed after %.2f s: %s", took, r.err.msg);
  assert_int_equal(r.c.heads, 2);
  assert_true(g_paused);
  assert_true(took > limit); /* it was paused while it ran: the test tested something */
}

/* The parse is under the memory limit too: a chunk of a million distinct constants needs far
 * more than 64 MiB to compile, though running it would fit. */
static void test_config_parse_is_under_the_memory_limit(void **state) {
  enum { n = 1500000 };
  char *text = malloc((size_t)n * 9 + 64);
  assert_non_null(text);
  size_t len = (size_t)sprintf(text, "local t = {");
  for (int i = 0; i < n; i++) len += (size_t)sprintf(text + len, "%d,", 1000000 + i);
  sprintf(text + len, "} return {}");
  rda_config c;
  rda_err err = {0};
  const rda_status s = rda_gen_config_string(*state, text, "configs/x.lua", &c, &err);
  free(text);
  assert_int_equal(s, RDA_ERR_CONFIG);
  assert_string_equal(err.msg, "configs/x.lua: config exceeds the memory limit (64 MiB)");
  load_ok(state, spec_example, &c); /* and the generator goes on */
}

static void test_config_generator_recovers_after_limits(void **state) {
  expect_error(state, "while true do end", "instruction limit", NULL);
  expect_error(state, "local s = string.rep('x', 1e9) return {}", "memory limit", NULL);
  rda_config c;
  load_ok(state, spec_example, &c);
  assert_int_equal(c.nbranch, 3);
  /* The generator itself is not limited after a config ran: a large plan still works. */
  rda_hw hw;
  rda_plan_k p;
  rda_err err = {0};
  assert_int_equal(rda_gen_hw_builtin(*state, 90, &hw, &err), RDA_OK);
  assert_int_equal(rda_gen_plan(*state, &c, &hw, &p, &err), RDA_OK);
  rda_plan_k_free(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_loads_spec_example),
      cmocka_unit_test(test_config_resolves_defaults),
      cmocka_unit_test(test_config_keeps_explicit_values),
      cmocka_unit_test(test_config_accepts_integral_floats),
      cmocka_unit_test(test_config_accepts_sixteen_branches),
      cmocka_unit_test(test_config_can_compute_with_safe_helpers),
      cmocka_unit_test(test_config_loads_default_file),
      cmocka_unit_test(test_config_every_example_in_configs_is_valid),
      cmocka_unit_test(test_config_spec_example_file_matches_spec),
      cmocka_unit_test(test_config_file_errors_name_the_file),
      cmocka_unit_test(test_config_missing_file_is_io_error),
      cmocka_unit_test(test_config_file_reads_fifos_and_refuses_devices),
      cmocka_unit_test(test_config_errors_name_a_long_path_in_full),
      cmocka_unit_test(test_config_rejects_head_dim_with_exact_message),
      cmocka_unit_test(test_config_rejects_unknown_key),
      cmocka_unit_test(test_config_rejects_a_long_unknown_key_shown_cut),
      cmocka_unit_test(test_config_rejects_non_string_key),
      cmocka_unit_test(test_config_rejects_dropout_as_not_supported),
      cmocka_unit_test(test_config_rejects_mask_as_not_supported),
      cmocka_unit_test(test_config_rejects_cross_attention_as_not_supported),
      cmocka_unit_test(test_config_rejects_missing_heads),
      cmocka_unit_test(test_config_rejects_heads_of_wrong_type),
      cmocka_unit_test(test_config_rejects_zero_heads),
      cmocka_unit_test(test_config_rejects_fractional_heads),
      cmocka_unit_test(test_config_rejects_kv_heads_not_dividing),
      cmocka_unit_test(test_config_rejects_kv_heads_above_heads),
      cmocka_unit_test(test_config_rejects_negative_kv_heads),
      cmocka_unit_test(test_config_rejects_missing_head_dim),
      cmocka_unit_test(test_config_rejects_unsupported_dtype),
      cmocka_unit_test(test_config_rejects_missing_dtype),
      cmocka_unit_test(test_config_rejects_missing_segments),
      cmocka_unit_test(test_config_rejects_missing_dilations),
      cmocka_unit_test(test_config_rejects_empty_segments),
      cmocka_unit_test(test_config_rejects_segments_not_a_list),
      cmocka_unit_test(test_config_rejects_zero_segment),
      cmocka_unit_test(test_config_rejects_fractional_segment),
      cmocka_unit_test(test_config_rejects_huge_segment),
      cmocka_unit_test(test_config_rejects_sizes_above_two_to_the_forty),
      cmocka_unit_test(test_config_plan_checks_hand_made_configs),
      cmocka_unit_test(test_config_rejects_zero_dilation),
      cmocka_unit_test(test_config_rejects_string_dilation),
      cmocka_unit_test(test_config_rejects_mismatched_lengths),
      cmocka_unit_test(test_config_rejects_seventeen_branches),
      cmocka_unit_test(test_config_rejects_unknown_offsets),
      cmocka_unit_test(test_config_rejects_group_with_fewer_heads_than_branches),
      cmocka_unit_test(test_config_rejects_non_boolean_causal),
      cmocka_unit_test(test_config_rejects_zero_scale),
      cmocka_unit_test(test_config_accepts_negative_scale),
      cmocka_unit_test(test_config_rejects_scale_whose_fp32_constant_overflows),
      cmocka_unit_test(test_config_rejects_infinite_scale),
      cmocka_unit_test(test_config_rejects_nan_scale),
      cmocka_unit_test(test_config_rejects_string_scale),
      cmocka_unit_test(test_config_leaves_output_zeroed_on_failure),
      cmocka_unit_test(test_config_rejects_non_table_return),
      cmocka_unit_test(test_config_syntax_error_carries_chunk_and_line),
      cmocka_unit_test(test_config_runtime_error_carries_chunk_and_line),
      cmocka_unit_test(test_config_errors_are_one_clean_line),
      cmocka_unit_test(test_config_errors_hold_no_c1_controls_nor_split_characters),
      cmocka_unit_test(test_config_time_limit_from_the_environment),
      cmocka_unit_test(test_config_rejects_binary_chunk),
      cmocka_unit_test(test_config_sandbox_has_no_os),
      cmocka_unit_test(test_config_sandbox_has_no_io),
      cmocka_unit_test(test_config_sandbox_has_no_loaders),
      cmocka_unit_test(test_config_sandbox_has_no_debug),
      cmocka_unit_test(test_config_sandbox_has_no_metatables),
      cmocka_unit_test(test_config_sandbox_has_no_string_dump),
      cmocka_unit_test(test_config_sandbox_string_methods_see_only_safe_functions),
      cmocka_unit_test(test_config_sandbox_has_no_pcall),
      cmocka_unit_test(test_config_sandbox_cannot_break_the_generator),
      cmocka_unit_test(test_config_stops_runaway_loop),
      cmocka_unit_test(test_config_stops_runaway_recursion),
      cmocka_unit_test(test_config_stops_string_bomb),
      cmocka_unit_test(test_config_stops_table_bomb),
      cmocka_unit_test(test_config_stops_c_loops_that_allocate_nothing),
      cmocka_unit_test(test_config_time_limit_stops_loops_of_c_calls),
      cmocka_unit_test(test_config_time_limit_is_cpu_time),
      cmocka_unit_test(test_config_parse_is_under_the_memory_limit),
      cmocka_unit_test(test_config_generator_recovers_after_limits),
  };
  const char *filter = getenv("RDA_TEST_FILTER"); /* e.g. "*scale*" while developing */
  if (filter != NULL) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, rt_gen_setup, rt_gen_teardown);
}
