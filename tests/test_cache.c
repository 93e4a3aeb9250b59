/* test_cache.c — the kernel cache (runtime/cache.c), the embedded sources (runtime/sources.c) and
 * RDA_LOG (runtime/log.c): SHA-256 vectors, key sensitivity, hit/miss, corruption, concurrent
 * processes, refused folders, LRU eviction, bundles, and a cold run with RDA_HOME unset; clears
 * that never follow links or break running builds, unusable folders, RDA_CACHE_MAX_BYTES,
 * symlinked target folders, FIFOs. RDA_TEST_FILTER picks tests by name. */
/* cmocka.h needs these four first. */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "cache.h"
#include "cache_dir.h"
#include "gen.h"
#include "nvrtc.h"
#include "rda_test.h"
#include "sources.h"

/* A string literal as the char * that argv wants. */
static char *S(const char *s) {
  return (char *)(uintptr_t)s;
}

/* ---- fixtures: every test runs in a private, empty cache folder ---------------------------- */

typedef struct cache_fixture {
  char *root;
  char *saved_dir;  /* $RDA_CACHE_DIR before the test */
  char *saved_home; /* $RDA_HOME before the test */
  char *saved_max;  /* $RDA_CACHE_MAX_BYTES before the test */
  char *saved_log;  /* $RDA_LOG before the test */
} cache_fixture;

static int cache_setup(void **state) {
  cache_fixture *f = calloc(1, sizeof *f);
  if (f == NULL) return -1;
  f->root = rt_mkdtemp();
  if (f->root == NULL) return -1;
  chmod(f->root, 0700);
  f->saved_dir = rt_env_save("RDA_CACHE_DIR");
  f->saved_home = rt_env_save("RDA_HOME");
  f->saved_max = rt_env_save("RDA_CACHE_MAX_BYTES");
  f->saved_log = rt_env_save("RDA_LOG");
  setenv("RDA_CACHE_DIR", f->root, 1);
  unsetenv("RDA_CACHE_MAX_BYTES");
  rda_cache_memory_clear();
  *state = f;
  return 0;
}

static int cache_teardown(void **state) {
  cache_fixture *f = *state;
  chmod(f->root, 0700);
  rt_rmtree(f->root);
  free(f->root);
  rt_env_restore("RDA_CACHE_DIR", f->saved_dir);
  rt_env_restore("RDA_HOME", f->saved_home);
  rt_env_restore("RDA_CACHE_MAX_BYTES", f->saved_max);
  rt_env_restore("RDA_LOG", f->saved_log);
  rda_cache_memory_clear();
  free(f);
  return 0;
}

/* Random bytes (normal draws, so never a constant pattern). */
static unsigned char *random_bytes(size_t n) {
  unsigned char *p = malloc(n);
  assert_non_null(p);
  for (size_t i = 0; i < n; ++i) p[i] = (unsigned char)(int)(rt_rng_normal(rt_global_rng()) * 64.0);
  return p;
}

static rda_cache_key key_for(const char *source) {
  const rda_cache_inputs in = {"sm_90", source, "hdr", "0.1.0", "nvrtc 12.8", "-O3"};
  rda_cache_key k;
  rda_cache_key_of(&in, &k);
  return k;
}

static char *entry_path(const char *root, const char *target, const rda_cache_key *k) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s/%s/%s.rda", root, target, k->hex);
  return strdup(buf);
}

/* Files in a folder whose names contain `part`. */
static int count_named(const char *dir, const char *part) {
  DIR *d = opendir(dir);
  if (d == NULL) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) n += strstr(e->d_name, part) != NULL;
  closedir(d);
  return n;
}

/* Wait for every child; each must have exited with status 0. */
static void wait_all_exit_zero(const pid_t *pids, int n) {
  for (int i = 0; i < n; ++i) {
    int status = 0;
    assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
}

/* The cache's folder for target holds exactly one entry and no temporary file. */
static void assert_one_entry_no_temp(const cache_fixture *f, const char *target) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/%s", f->root, target);
  assert_int_equal(count_named(dir, ".rda"), 1);
  assert_int_equal(count_named(dir, ".tmp."), 0);
}

/* ---- SHA-256 and keys ---------------------------------------------------------------------- */

static void test_cache_sha256_matches_fips_vectors(void **state) {
  (void)state;
  char hex[65];
  rda_cache_sha256_hex("", 0, hex);
  assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  rda_cache_sha256_hex("abc", 3, hex);
  assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  rda_cache_sha256_hex(two, strlen(two), hex);
  assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  /* One million 'a', fed in uneven pieces: the block boundary handling is exercised. */
  rda_cache_sha256 s;
  unsigned char d[32];
  char chunk[997];
  memset(chunk, 'a', sizeof chunk);
  rda_cache_sha256_init(&s);
  size_t left = 1000000;
  for (size_t step = 1; left > 0; step = step % 997 + 13) {
    size_t take = step < left ? step : left;
    if (take > sizeof chunk) take = sizeof chunk;
    rda_cache_sha256_update(&s, chunk, take);
    left -= take;
  }
  rda_cache_sha256_final(&s, d);
  static const char want[] = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  for (int i = 0; i < 32; ++i) {
    char byte[3];
    snprintf(byte, sizeof byte, "%02x", d[i]);
    assert_memory_equal(byte, want + 2 * i, 2);
  }
}

static void test_cache_key_changes_when_any_one_input_changes(void **state) {
  (void)state;
  const rda_cache_inputs base = {"sm_90", "src", "hdr", "0.1.0", "nvrtc 12.8", "-O3"};
  rda_cache_key k0, again;
  rda_cache_key_of(&base, &k0);
  rda_cache_key_of(&base, &again);
  assert_string_equal(k0.hex, again.hex); /* deterministic: no timestamps, no addresses */
  assert_int_equal(strlen(k0.hex), 64);
  rda_cache_key keys[7];
  keys[0] = k0;
  for (int field = 0; field < 6; ++field) {
    rda_cache_inputs in = base;
    const char **slot[6] = {&in.target,      &in.source,   &in.headers,
                            &in.rda_version, &in.compiler, &in.options};
    char changed[64];
    snprintf(changed, sizeof changed, "%s ", *slot[field]); /* one byte more */
    *slot[field] = changed;
    rda_cache_key_of(&in, &keys[field + 1]);
  }
  for (int i = 0; i < 7; ++i)
    for (int j = i + 1; j < 7; ++j) assert_string_not_equal(keys[i].hex, keys[j].hex);
  /* Field boundaries count: moving a byte from one field to the next changes the key. */
  const rda_cache_inputs a = {"sm_90", "ab", "c", "0.1.0", "x", "y"};
  const rda_cache_inputs b = {"sm_90", "a", "bc", "0.1.0", "x", "y"};
  rda_cache_key ka, kb;
  rda_cache_key_of(&a, &ka);
  rda_cache_key_of(&b, &kb);
  assert_string_not_equal(ka.hex, kb.hex);
}

/* ---- entries ------------------------------------------------------------------------------- */

static void test_cache_miss_then_put_then_hit_from_memory_and_disk(void **state) {
  (void)state;
  const rda_cache_key k = key_for("kernel one");
  unsigned char *data = NULL;
  size_t n = 0;
  int hit = 1;
  char why[160];
  rda_err err = {0};
  assert_int_equal(rda_cache_get("sm_90", &k, "kernel one", &data, &n, &hit, why, sizeof why, &err),
                   RDA_OK);
  assert_int_equal(hit, 0);
  assert_null(data);
  assert_string_equal(why, "not on disk");

  unsigned char *payload = random_bytes(5000);
  assert_int_equal(rda_cache_put("sm_90", &k, "rda_one", "kernel one", payload, 5000, &err),
                   RDA_OK);
  assert_int_equal(rda_cache_get("sm_90", &k, "kernel one", &data, &n, &hit, why, sizeof why, &err),
                   RDA_OK);
  assert_int_equal(hit, 1);
  assert_int_equal(n, 5000);
  assert_memory_equal(data, payload, 5000);
  free(data);

  rda_cache_memory_clear(); /* from disk this time */
  assert_int_equal(rda_cache_get("sm_90", &k, "kernel one", &data, &n, &hit, why, sizeof why, &err),
                   RDA_OK);
  assert_int_equal(hit, 1);
  assert_int_equal(n, 5000);
  assert_memory_equal(data, payload, 5000);
  free(data);
  free(payload);
}

/* Damage the entry with `damage`, then a lookup must miss, say why, and delete the entry. */
static void expect_damage_detected(cache_fixture *f, void (*damage)(const char *path),
                                   const char *reason) {
  const rda_cache_key k = key_for("damaged kernel");
  unsigned char *payload = random_bytes(3000);
  rda_err err = {0};
  assert_int_equal(rda_cache_put("sm_90", &k, "rda_dmg", "damaged kernel", payload, 3000, &err),
                   RDA_OK);
  char *path = entry_path(f->root, "sm_90", &k);
  damage(path);
  rda_cache_memory_clear();
  unsigned char *data = (unsigned char *)path; /* must be reset */
  size_t n = 1;
  int hit = 1;
  char why[160];
  assert_int_equal(rda_cache_get("sm_90", &k, NULL, &data, &n, &hit, why, sizeof why, &err),
                   RDA_OK);
  assert_int_equal(hit, 0);
  assert_null(data);
  assert_non_null(strstr(why, "corrupted entry"));
  assert_non_null(strstr(why, reason));
  assert_false(rt_exists(path));
  /* Rebuilt: stored again, it loads. */
  assert_int_equal(rda_cache_put("sm_90", &k, "rda_dmg", "damaged kernel", payload, 3000, &err),
                   RDA_OK);
  rda_cache_memory_clear();
  assert_int_equal(rda_cache_get("sm_90", &k, NULL, &data, &n, &hit, why, sizeof why, &err),
                   RDA_OK);
  assert_int_equal(hit, 1);
  assert_memory_equal(data, payload, 3000);
  free(data);
  free(path);
  free(payload);
}

static void truncate_entry(const char *path) {
  assert_int_equal(truncate(path, 1500), 0);
}

static void flip_payload_byte(const char *path) {
  size_t n = 0;
  char *text = rt_read_file(path, &n);
  assert_non_null(text);
  text[n - 1] ^= 0x20; /* the last payload byte */
  assert_true(rt_write_file(path, text, n));
  free(text);
}

static void flip_magic(const char *path) {
  size_t n = 0;
  char *text = rt_read_file(path, &n);
  assert_non_null(text);
  text[0] = 'X';
  assert_true(rt_write_file(path, text, n));
  free(text);
}

static void test_cache_truncated_entry_is_detected_and_rebuilt(void **state) {
  expect_damage_detected(*state, truncate_entry, "truncated");
}

static void test_cache_flipped_byte_is_detected_and_rebuilt(void **state) {
  expect_damage_detected(*state, flip_payload_byte, "checksum mismatch");
}

static void test_cache_bad_magic_is_detected_and_rebuilt(void **state) {
  expect_damage_detected(*state, flip_magic, "bad magic");
}

static void test_cache_different_source_under_same_key_is_a_miss(void **state) {
  (void)state;
  const rda_cache_key k = key_for("the real source");
  unsigned char *payload = random_bytes(100);
  rda_err err = {0};
  assert_int_equal(rda_cache_put("sm_90", &k, "rda_c", "the real source", payload, 100, &err),
                   RDA_OK);
  rda_cache_memory_clear();
  unsigned char *data = NULL;
  size_t n = 0;
  int hit = 1;
  char why[160];
  assert_int_equal(
      rda_cache_get("sm_90", &k, "another source", &data, &n, &hit, why, sizeof why, &err), RDA_OK);
  assert_int_equal(hit, 0);
  assert_null(data);
  assert_non_null(strstr(why, "different source"));
  free(payload);
}

/* N processes released at once store the same kernel: all succeed, one entry, no temp file. */
static void test_cache_concurrent_processes_leave_one_entry(void **state) {
  cache_fixture *f = *state;
  enum { kProcs = 8, kBytes = 1 << 20 };
  const rda_cache_key k = key_for("shared kernel");
  unsigned char *payload = random_bytes(kBytes);
  int gate[2];
  assert_int_equal(pipe(gate), 0);
  pid_t pids[kProcs];
  for (int i = 0; i < kProcs; ++i) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0) {
      close(gate[1]);
      char c;
      (void)!read(gate[0], &c, 1); /* returns when the parent closes the gate */
      rda_err err = {0};
      if (rda_cache_put("sm_90", &k, "rda_shared", "shared kernel", payload, kBytes, &err) !=
          RDA_OK)
        _exit(1);
      rda_cache_memory_clear();
      unsigned char *data = NULL;
      size_t n = 0;
      int hit = 0;
      if (rda_cache_get("sm_90", &k, "shared kernel", &data, &n, &hit, NULL, 0, &err) != RDA_OK ||
          !hit || n != kBytes || memcmp(data, payload, kBytes) != 0)
        _exit(2);
      _exit(0);
    }
  }
  close(gate[0]);
  close(gate[1]);
  wait_all_exit_zero(pids, kProcs);
  assert_one_entry_no_temp(f, "sm_90");
  free(payload);
}

/* Processes compiling the same kernel with NVRTC at once: all succeed, one entry. */
static void test_cache_concurrent_compiles_of_one_kernel_all_succeed(void **state) {
  cache_fixture *f = *state;
  enum { kProcs = 4 };
  static const char src[] =
      "extern \"C\" __global__ void rda_cache_tiny(float *x) { x[threadIdx.x] *= 2.0f; }\n";
  pid_t pids[kProcs];
  for (int i = 0; i < kProcs; ++i) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0) {
      unsigned char *image = NULL;
      size_t n = 0;
      rda_err err = {0};
      const rda_status s = rda_cache_cubin(80, "rda_cache_tiny", src, &image, &n, NULL, &err);
      _exit(s == RDA_OK && n > 0 ? 0 : 1);
    }
  }
  wait_all_exit_zero(pids, kProcs);
  assert_one_entry_no_temp(f, "sm_80");
  int compiled = 1;
  unsigned char *image = NULL;
  size_t n = 0;
  rda_err err = {0};
  assert_int_equal(rda_cache_cubin(80, "rda_cache_tiny", src, &image, &n, &compiled, &err), RDA_OK);
  assert_int_equal(compiled, 0);
  assert_true(n > 0);
  free(image);
}

/* Processes building the same emulator module at once in an empty cache (headers folder and
 * entry both raced for): all load and run it; one entry and one headers folder remain. */
static void test_cache_concurrent_emulator_builds_all_succeed(void **state) {
  cache_fixture *f = *state;
  enum { kProcs = 3 };
  static const char src[] =
      "#include \"rda_device.cuh\"\n"
      "struct race_params { float *out; float v; };\n"
      "extern \"C\" __global__ void race_tiny(const race_params p) {\n"
      "  p.out[threadIdx.x] = p.v + (float)threadIdx.x; }\n"
      "RDA_EMU_EXPORT(race_tiny, race_params)\n";
  const float val = (float)rt_rng_normal(rt_global_rng());
  pid_t pids[kProcs];
  for (int i = 0; i < kProcs; ++i) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0) {
      rda_backend *b = NULL;
      rda_err err = {0};
      if (rda_backend_emu_open(&b, 90, &err) != RDA_OK) _exit(1);
      rda_variant v;
      memset(&v, 0, sizeof v);
      snprintf(v.name, sizeof v.name, "race_tiny");
      v.source = (char *)(uintptr_t)src;
      rda_module *m = NULL;
      if (b->load(b, &v, &m, &err) != RDA_OK) {
        fprintf(stderr, "child: %s\n", err.msg);
        _exit(2);
      }
      float out[32];
      for (int t = 0; t < 32; ++t) out[t] = -1e30f;
      struct {
        float *out;
        float v;
      } params = {out, val};
      const unsigned grid[3] = {1, 1, 1};
      if (b->launch(b, m, grid, 32, 0, &params, sizeof params, &err) != RDA_OK) _exit(3);
      for (int t = 0; t < 32; ++t)
        if (out[t] != val + (float)t) _exit(4);
      _exit(0);
    }
  }
  wait_all_exit_zero(pids, kProcs);
  rda_cache_entry_info *e = NULL;
  size_t count = 0;
  rda_err err = {0};
  assert_int_equal(rda_cache_list(NULL, &e, &count, &err), RDA_OK);
  assert_true(count >= 1);
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/%s", f->root, e[0].target);
  int modules = 0;
  for (size_t i = 0; i < count; ++i) modules += strcmp(e[i].name, "race_tiny") == 0;
  assert_int_equal(modules, 1);
  free(e);
  assert_int_equal(count_named(dir, "inc-"), 1);
  assert_int_equal(count_named(dir, ".tmp."), 0);
}

/* ---- folders ------------------------------------------------------------------------------- */

static void expect_refused(const char *folder, const char *what) {
  const rda_cache_key k = key_for("x");
  unsigned char *data = NULL;
  size_t n = 0;
  int hit = 0;
  rda_err err = {0};
  assert_int_equal(rda_cache_get("sm_90", &k, NULL, &data, &n, &hit, NULL, 0, &err), RDA_ERR_CACHE);
  assert_non_null(strstr(err.msg, folder));
  assert_non_null(strstr(err.msg, what));
  rda_err_clear(&err);
  const unsigned char one = 1;
  assert_int_equal(rda_cache_put("sm_90", &k, "x", "x", &one, 1, &err), RDA_ERR_CACHE);
  assert_non_null(strstr(err.msg, folder));
}

static void test_cache_refuses_folder_writable_by_others(void **state) {
  cache_fixture *f = *state;
  assert_int_equal(chmod(f->root, 0777), 0);
  expect_refused(f->root, "writable by group or others");
  assert_int_equal(chmod(f->root, 0770), 0);
  expect_refused(f->root, "writable by group or others");
  assert_int_equal(chmod(f->root, 0700), 0);
  /* The target folder is checked too. */
  char sub[4096];
  snprintf(sub, sizeof sub, "%s/sm_90", f->root);
  assert_int_equal(mkdir(sub, 0700), 0);
  assert_int_equal(chmod(sub, 0777), 0);
  expect_refused(sub, "writable by group or others");
  assert_int_equal(chmod(sub, 0700), 0);
}

static void test_cache_refuses_folder_of_another_user(void **state) {
  cache_fixture *f = *state;
  if (geteuid() != 0) {
    skip(); /* only root can hand a folder to another user */
    return;
  }
  assert_int_equal(chown(f->root, 65534, 65534), 0); /* nobody */
  expect_refused(f->root, "belongs to uid 65534");
  assert_int_equal(chown(f->root, 0, 0), 0);
}

/* ---- eviction, list, clear ----------------------------------------------------------------- */

static void put_entry(const char *source, size_t bytes) {
  const rda_cache_key k = key_for(source);
  unsigned char *payload = random_bytes(bytes);
  rda_err err = {0};
  assert_int_equal(rda_cache_put("sm_90", &k, source, source, payload, bytes, &err), RDA_OK);
  free(payload);
}

static int has_entry(const char *source) {
  rda_cache_memory_clear();
  const rda_cache_key k = key_for(source);
  unsigned char *data = NULL;
  size_t n = 0;
  int hit = 0;
  rda_err err = {0};
  assert_int_equal(rda_cache_get("sm_90", &k, source, &data, &n, &hit, NULL, 0, &err), RDA_OK);
  free(data);
  return hit;
}

static void test_cache_evicts_least_recently_used_first(void **state) {
  (void)state;
  put_entry("kernel_a", 10000);
  put_entry("kernel_b", 10000);
  put_entry("kernel_c", 10000);
  /* Use a (from disk, as a new process would): b is now the least recently used, although a
   * was stored first. */
  rda_cache_memory_clear();
  const rda_cache_key ka = key_for("kernel_a");
  unsigned char *data = NULL;
  size_t n = 0;
  int hit = 0;
  rda_err err = {0};
  assert_int_equal(rda_cache_get("sm_90", &ka, NULL, &data, &n, &hit, NULL, 0, &err), RDA_OK);
  assert_int_equal(hit, 1);
  free(data);

  rda_cache_entry_info *v = NULL;
  size_t count = 0;
  assert_int_equal(rda_cache_list("sm_90", &v, &count, &err), RDA_OK);
  assert_int_equal(count, 3);
  assert_string_equal(v[0].name, "kernel_b"); /* least recent first */
  assert_string_equal(v[2].name, "kernel_a");
  const unsigned long long two = v[1].bytes + v[2].bytes;
  free(v);

  size_t removed = 0;
  assert_int_equal(rda_cache_evict(two, NULL, &removed, &err), RDA_OK);
  assert_int_equal(removed, 1);
  assert_false(has_entry("kernel_b"));
  assert_true(has_entry("kernel_a"));
  assert_true(has_entry("kernel_c"));
}

/* A temporary file left by a process that died mid-write goes once it is an hour old; a
 * fresh one (a write in progress) stays. */
static void test_cache_eviction_removes_stale_temporary_files_only(void **state) {
  cache_fixture *f = *state;
  put_entry("kernel_t", 100);
  char *old_tmp = NULL, *new_tmp = NULL;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/sm_90", f->root);
  old_tmp = rt_path(dir, "0123.tmp.99.1");
  new_tmp = rt_path(dir, "4567.tmp.99.2");
  assert_true(rt_write_file(old_tmp, "partial", 7));
  assert_true(rt_write_file(new_tmp, "partial", 7));
  const struct timespec two_hours_ago[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
  assert_int_equal(utimensat(AT_FDCWD, old_tmp, two_hours_ago, 0), 0);
  rda_err err = {0};
  assert_int_equal(rda_cache_evict(1ull << 40, NULL, NULL, &err), RDA_OK);
  assert_false(rt_exists(old_tmp));
  assert_true(rt_exists(new_tmp));
  assert_true(has_entry("kernel_t"));
  free(old_tmp);
  free(new_tmp);
}

/* RDA_CACHE_MAX_BYTES as the cache reads it (it must be valid). */
static unsigned long long max_bytes_now(void) {
  unsigned long long n = 0;
  rda_err err = {0};
  assert_int_equal(rda_cache_max_bytes_get(&n, &err), RDA_OK);
  return n;
}

static void test_cache_put_keeps_size_under_rda_cache_max_bytes(void **state) {
  (void)state;
  setenv("RDA_CACHE_MAX_BYTES", "25000", 1);
  put_entry("kernel_1", 10000);
  put_entry("kernel_2", 10000);
  put_entry("kernel_3", 10000); /* over: kernel_1 goes */
  assert_false(has_entry("kernel_1"));
  assert_true(has_entry("kernel_2"));
  assert_true(has_entry("kernel_3"));
  /* An entry larger than the limit alone is still kept (it was just stored). */
  setenv("RDA_CACHE_MAX_BYTES", "1K", 1);
  put_entry("kernel_big", 5000);
  assert_true(has_entry("kernel_big"));
  assert_false(has_entry("kernel_3"));
  assert_int_equal(max_bytes_now(), 1024);
  unsetenv("RDA_CACHE_MAX_BYTES");
  assert_int_equal(max_bytes_now(), 1ull << 30);
}

static void test_cache_list_marks_corrupted_and_clear_empties_one_target(void **state) {
  cache_fixture *f = *state;
  put_entry("kernel_x", 2000);
  const rda_cache_key k = key_for("kernel_y");
  unsigned char one[16] = {1, 2, 3};
  rda_err err = {0};
  assert_int_equal(rda_cache_put("emu-test", &k, "kernel_y", "kernel_y", one, 16, &err), RDA_OK);
  char *path = entry_path(f->root, "emu-test", &k);
  flip_payload_byte(path);
  free(path);
  rda_cache_entry_info *v = NULL;
  size_t count = 0;
  assert_int_equal(rda_cache_list(NULL, &v, &count, &err), RDA_OK);
  assert_int_equal(count, 2);
  int valid = 0;
  for (size_t i = 0; i < count; ++i) valid += v[i].valid;
  assert_int_equal(valid, 1);
  free(v);
  size_t removed = 0;
  assert_int_equal(rda_cache_clear("emu-test", &removed, NULL, &err), RDA_OK);
  assert_int_equal(removed, 1);
  assert_true(has_entry("kernel_x"));
  assert_int_equal(rda_cache_clear(NULL, &removed, NULL, &err), RDA_OK);
  assert_int_equal(removed, 1);
  assert_false(has_entry("kernel_x"));
}

/* ---- bundles ------------------------------------------------------------------------------- */

static void write_manifest(const char *dir, const char *body) {
  char *p = rt_path(dir, "manifest.json");
  assert_true(rt_write_file(p, body, strlen(body)));
  free(p);
}

static void test_cache_bundle_matches_name_arch_and_source_only(void **state) {
  cache_fixture *f = *state;
  const char *src = "extern \"C\" __global__ void rda_b() {}\n";
  char sha[65], stale[65], csum[65];
  rda_err err = {0};
  assert_int_equal(rda_cache_source_sha(src, sha, &err), RDA_OK);
  assert_int_equal(rda_cache_source_sha("an older source", stale, &err), RDA_OK);
  rda_cache_sha256_hex("cubin", 5, csum); /* every cubin file below holds "cubin" */
  char *b1 = rt_path(f->root, "b1"), *b2 = rt_path(f->root, "b2");
  assert_int_equal(mkdir(b1, 0700), 0);
  assert_int_equal(mkdir(b2, 0700), 0);
  char body[2048];
  snprintf(body, sizeof body,
           "{\"kernels\": [\n"
           "{\"name\": \"rda_b\", \"arch\": \"sm_90\", \"cubin\": \"stale.cubin\", "
           "\"source_sha256\": \"%s\", \"cubin_sha256\": \"%s\", \"registers\": 10, "
           "\"compile_s\": 0.5},\n"
           "{\"name\": \"rda_b\", \"arch\": \"sm_80\", \"cubin\": \"b80.cubin\", "
           "\"source_sha256\": \"%s\", \"cubin_sha256\": \"%s\"}\n"
           "]}\n",
           stale, csum, sha, csum);
  write_manifest(b1, body);
  snprintf(body, sizeof body,
           "{\"kernels\": [{\"name\": \"rda_b\", \"arch\": \"sm_90\", \"cubin\": \"b90.cubin\", "
           "\"entry\": \"rda_b\", \"source_sha256\": \"%s\", \"smem_bytes\": -1e3, "
           "\"cubin_sha256\": \"%s\"}]}",
           sha, csum);
  write_manifest(b2, body);
  const char *names[] = {"stale.cubin", "b80.cubin"};
  for (int i = 0; i < 2; ++i) {
    char *p = rt_path(b1, names[i]);
    assert_true(rt_write_file(p, "cubin", 5));
    free(p);
  }
  char *p = rt_path(b2, "b90.cubin");
  assert_true(rt_write_file(p, "cubin", 5));

  char list[8192], file[4096];
  snprintf(list, sizeof list, "/nonexistent-bundle:%s:%s", b1, b2);
  int found = 0;
  assert_int_equal(rda_cache_bundle_find(list, "rda_b", 90, src, file, sizeof file, &found, &err),
                   RDA_OK);
  assert_int_equal(found, 1); /* b1's sm_90 entry is stale: b2's is used */
  assert_string_equal(file, p);
  assert_int_equal(rda_cache_bundle_find(list, "rda_b", 80, src, file, sizeof file, &found, &err),
                   RDA_OK);
  assert_int_equal(found, 1);
  assert_non_null(strstr(file, "b1/b80.cubin"));
  assert_int_equal(rda_cache_bundle_find(list, "rda_b", 86, src, file, sizeof file, &found, &err),
                   RDA_OK);
  assert_int_equal(found, 0);
  assert_int_equal(
      rda_cache_bundle_find(list, "rda_b", 90, "changed", file, sizeof file, &found, &err), RDA_OK);
  assert_int_equal(found, 0);
  assert_int_equal(rda_cache_bundle_find(NULL, "rda_b", 90, src, file, sizeof file, &found, &err),
                   RDA_OK);
  assert_int_equal(found, 0);
  /* The bytes come verified with the match. */
  unsigned char *image = NULL;
  size_t bytes = 0;
  assert_int_equal(rda_cache_bundle_load(list, "rda_b", 90, src, &image, &bytes, file, sizeof file,
                                         &found, &err),
                   RDA_OK);
  assert_int_equal(found, 1);
  assert_int_equal(bytes, 5);
  assert_memory_equal(image, "cubin", 5);
  free(image);
  /* A cubin changed after the manifest was written is never used (b80 is b1's only copy). */
  char *b80 = rt_path(b1, "b80.cubin");
  assert_true(rt_write_file(b80, "cubiN", 5));
  assert_int_equal(rda_cache_bundle_find(list, "rda_b", 80, src, file, sizeof file, &found, &err),
                   RDA_OK);
  assert_int_equal(found, 0);
  /* Nor a FIFO in its place: refused at once, never waited on (alarm: a hang fails). */
  assert_int_equal(unlink(b80), 0);
  assert_int_equal(mkfifo(b80, 0600), 0);
  alarm(20);
  assert_int_equal(rda_cache_bundle_find(list, "rda_b", 80, src, file, sizeof file, &found, &err),
                   RDA_OK);
  alarm(0);
  assert_int_equal(found, 0);
  free(b80);
  /* An entry without cubin_sha256 (an older emit) is not used either. */
  snprintf(body, sizeof body,
           "{\"kernels\": [{\"name\": \"rda_b\", \"arch\": \"sm_90\", \"cubin\": \"b90.cubin\", "
           "\"source_sha256\": \"%s\"}]}",
           sha);
  write_manifest(b2, body);
  assert_int_equal(rda_cache_bundle_find(list, "rda_b", 90, src, file, sizeof file, &found, &err),
                   RDA_OK);
  assert_int_equal(found, 0);

  /* A malformed manifest is passed over (a warning) for the bundles after it: b2 again. */
  snprintf(body, sizeof body,
           "{\"kernels\": [{\"name\": \"rda_b\", \"arch\": \"sm_90\", \"cubin\": \"b90.cubin\", "
           "\"source_sha256\": \"%s\", \"cubin_sha256\": \"%s\"}]}",
           sha, csum);
  write_manifest(b2, body);
  write_manifest(b1, "{\"kernels\": [{\"name\": \"rda_b\", ");
  assert_int_equal(rda_cache_bundle_find(list, "rda_b", 90, src, file, sizeof file, &found, &err),
                   RDA_OK);
  assert_int_equal(found, 1);
  assert_string_equal(file, p);
  /* An entry whose cubin lies outside its folder is never read. */
  snprintf(body, sizeof body,
           "{\"kernels\": [{\"name\": \"rda_b\", \"arch\": \"sm_90\", "
           "\"cubin\": \"../b2/b90.cubin\", \"source_sha256\": \"%s\", \"cubin_sha256\": \"%s\"}]}",
           sha, csum);
  write_manifest(b2, body);
  assert_int_equal(rda_cache_bundle_find(list, "rda_b", 90, src, file, sizeof file, &found, &err),
                   RDA_OK);
  assert_int_equal(found, 0);
  free(p);
  free(b1);
  free(b2);
}

/* Plans cfg for sm_`arch` into *plan and checks that the bundle in dir has every variant's
 * cubin for that arch (a file that exists), and none for sm_`other` (0: not checked). */
static void assert_bundle_has_plan(rda_gen *g, const rda_config *cfg, const char *dir, int arch,
                                   int other, rda_plan_k *plan) {
  rda_err err = {0};
  rda_hw hw;
  assert_int_equal(rda_gen_hw_builtin(g, arch, &hw, &err), RDA_OK);
  assert_int_equal(rda_gen_plan(g, cfg, &hw, plan, &err), RDA_OK);
  assert_true(plan->nvariants > 0);
  for (int i = 0; i < plan->nvariants; ++i) {
    const rda_variant *v = &plan->variants[i];
    char file[4096];
    int found = 0;
    assert_int_equal(
        rda_cache_bundle_find(dir, v->name, arch, v->source, file, sizeof file, &found, &err),
        RDA_OK);
    assert_int_equal(found, 1);
    assert_true(rt_exists(file));
    if (other == 0) continue;
    assert_int_equal(
        rda_cache_bundle_find(dir, v->name, other, v->source, file, sizeof file, &found, &err),
        RDA_OK);
    assert_int_equal(found, 0);
  }
}

/* `rdagen emit` writes bundles that the lookup finds for every planned kernel, on Ampere and
 * (from its built-in profile) on Blackwell. */
static void test_cache_bundle_from_rdagen_emit_is_found(void **state) {
  cache_fixture *f = *state;
  char *out = rt_path(f->root, "bundle");
  char config[4096];
  snprintf(config, sizeof config, "%s/configs/default.lua", RDA_SOURCE_DIR);
  char *argv[] = {S(RDAGEN_PATH), S("emit"),   config,     S("--arch"), S("sm_80"),
                  S("--arch"),    S("sm_100"), S("--out"), out,         NULL};
  rt_proc p;
  assert_true(rt_run(argv, 300, &p));
  if (p.exit_code != 0) fprintf(stderr, "%s", p.err);
  assert_int_equal(p.exit_code, 0);
  rt_proc_free(&p);

  rda_gen *g = NULL;
  rda_err err = {0};
  assert_int_equal(rda_gen_open(&g, &err), RDA_OK);
  rda_config cfg;
  rda_plan_k plan;
  assert_int_equal(rda_gen_config_file(g, config, &cfg, &err), RDA_OK);
  assert_bundle_has_plan(g, &cfg, out, 100, 0, &plan);
  rda_plan_k_free(&plan);
  assert_bundle_has_plan(g, &cfg, out, 80, 90, &plan);
  /* The manifest records each cubin's SHA-256: a cubin changed afterwards is passed over. */
  char file[4096];
  int found = 0;
  assert_int_equal(rda_cache_bundle_find(out, plan.variants[0].name, 80, plan.variants[0].source,
                                         file, sizeof file, &found, &err),
                   RDA_OK);
  assert_int_equal(found, 1);
  size_t n = 0;
  char *cubin = rt_read_file(file, &n);
  assert_non_null(cubin);
  assert_true(n > 16);
  cubin[n / 2] ^= 0x20;
  assert_true(rt_write_file(file, cubin, n));
  free(cubin);
  assert_int_equal(rda_cache_bundle_find(out, plan.variants[0].name, 80, plan.variants[0].source,
                                         file, sizeof file, &found, &err),
                   RDA_OK);
  assert_int_equal(found, 0);
  rda_plan_k_free(&plan);
  rda_gen_close(g);
  free(out);
}

/* ---- drivers ------------------------------------------------------------------------------- */

static void test_cache_driver_older_than_nvrtc_is_a_clear_error(void **state) {
  (void)state;
  rda_err err = {0};
  assert_int_equal(rda_nvrtc_driver_check(12020, 12080, &err), RDA_OK); /* minor compat */
  assert_int_equal(rda_nvrtc_driver_check(13000, 12080, &err), RDA_OK);
  assert_int_equal(rda_nvrtc_driver_check(11080, 12060, &err), RDA_ERR_CUDA);
  assert_non_null(strstr(err.msg, "CUDA 11.8"));
  assert_non_null(strstr(err.msg, "NVRTC 12.6"));
  rda_err_clear(&err);
  assert_int_equal(rda_nvrtc_driver_check(0, 12060, &err), RDA_ERR_CUDA);
}

/* ---- embedded sources ---------------------------------------------------------------------- */

static void test_cache_embedded_sources_match_the_tree(void **state) {
  (void)state;
  assert_true(rda_sources_count() >= 10);
  unsetenv("RDA_HOME");
  assert_null(rda_sources_home());
  const char *names[] = {"gen/bridge.lua", "gen/plan.lua", "templates/ptx.cuh",
                         "templates/emu/emu_runtime.cc", "tuning/fwd_space.lua"};
  for (size_t i = 0; i < sizeof names / sizeof *names; ++i) {
    char *text = NULL;
    size_t n = 0;
    rda_err err = {0};
    assert_int_equal(rda_sources_read(names[i], &text, &n, &err), RDA_OK);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", RDA_SOURCE_DIR, names[i]);
    size_t m = 0;
    char *disk = rt_read_file(path, &m);
    assert_non_null(disk);
    assert_int_equal(n, m);
    assert_memory_equal(text, disk, n);
    free(disk);
    free(text);
  }
  char *text = NULL;
  rda_err err = {0};
  assert_int_equal(rda_sources_read("gen/nope.lua", &text, NULL, &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, "gen/nope.lua"));
  assert_int_equal(rda_sources_read("../etc/passwd", &text, NULL, &err), RDA_ERR_INVALID_ARGUMENT);
  /* The digest is the same whether the files come embedded or from the tree. */
  char embedded[65], tree[65];
  assert_int_equal(rda_sources_digest("templates/", embedded, &err), RDA_OK);
  setenv("RDA_HOME", RDA_SOURCE_DIR, 1);
  assert_int_equal(rda_sources_digest("templates/", tree, &err), RDA_OK);
  assert_string_equal(embedded, tree);
}

/* The templates digest (part of every key) follows the content of each template: a tree equal
 * to the embedded one has the same digest; one byte more in any one file changes it. */
static void test_cache_templates_digest_changes_with_any_template(void **state) {
  cache_fixture *f = *state;
  unsetenv("RDA_HOME");
  char embedded[65], got[65];
  rda_err err = {0};
  assert_int_equal(rda_sources_digest("templates/", embedded, &err), RDA_OK);
  char *home = rt_path(f->root, "home");
  char path[8192];
  snprintf(path, sizeof path, "%s/templates/emu", home);
  assert_int_equal(rda_cache_dir_mkdirs(path, &err), RDA_OK);
  int files = 0;
  for (size_t i = 0; i < rda_sources_count(); ++i) {
    const char *name = rda_sources_name(i);
    if (strncmp(name, "templates/", 10) != 0) continue;
    char *text = NULL;
    size_t n = 0;
    assert_int_equal(rda_sources_read(name, &text, &n, &err), RDA_OK);
    snprintf(path, sizeof path, "%s/%s", home, name);
    assert_true(rt_write_file(path, text, n));
    free(text);
    ++files;
  }
  assert_true(files >= 5);
  setenv("RDA_HOME", home, 1);
  assert_int_equal(rda_sources_digest("templates/", got, &err), RDA_OK);
  assert_string_equal(got, embedded);
  char seen[16][65];
  int nseen = 0;
  for (size_t i = 0; i < rda_sources_count() && nseen < 16; ++i) {
    const char *name = rda_sources_name(i);
    if (strncmp(name, "templates/", 10) != 0) continue;
    snprintf(path, sizeof path, "%s/%s", home, name);
    size_t n = 0;
    char *text = rt_read_file(path, &n);
    assert_non_null(text);
    char *longer = malloc(n + 1);
    assert_non_null(longer);
    memcpy(longer, text, n);
    longer[n] = '\n';
    assert_true(rt_write_file(path, longer, n + 1));
    assert_int_equal(rda_sources_digest("templates/", seen[nseen], &err), RDA_OK);
    assert_string_not_equal(seen[nseen], embedded);
    for (int j = 0; j < nseen; ++j) assert_string_not_equal(seen[nseen], seen[j]);
    ++nseen;
    assert_true(rt_write_file(path, text, n)); /* back as it was */
    free(longer);
    free(text);
  }
  free(home);
}

/* With RDA_HOME unset and an empty cache, rdagen still plans, compiles (the emulator writes the
 * embedded headers into the cache) and runs a config, from a folder with no source tree. */
static void test_cache_cold_run_without_rda_home_on_emulator(void **state) {
  cache_fixture *f = *state;
  char config[4096];
  snprintf(config, sizeof config, "%s/configs/default.lua", RDA_SOURCE_DIR);
  unsetenv("RDA_HOME");
  setenv("RDA_LOG", "info", 1);
  char *argv[] = {S(RDAGEN_PATH), S("demo"), config,   S("--backend"),
                  S("emu"),       S("--n"),  S("256"), NULL};
  rt_proc p;
  assert_true(rt_run(argv, 900, &p));
  unsetenv("RDA_LOG");
  if (p.exit_code != 0) fprintf(stderr, "%s\n%s", p.out, p.err);
  assert_int_equal(p.exit_code, 0);
  assert_non_null(strstr(p.out, "PASS"));
  assert_non_null(strstr(p.err, "rda: info: compiled rda_init for emu-"));
  rt_proc_free(&p);
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", f->root);
  rda_cache_entry_info *v = NULL;
  size_t count = 0;
  rda_err err = {0};
  assert_int_equal(rda_cache_list(NULL, &v, &count, &err), RDA_OK);
  assert_true(count >= 2); /* the emulator runtime and the kernels */
  free(v);
}

/* ---- RDA_LOG ------------------------------------------------------------------------------- */

static void test_cache_rda_log_tells_compiles_and_hits_and_is_silent_by_default(void **state) {
  (void)state;
  char config[4096];
  snprintf(config, sizeof config, "%s/configs/default.lua", RDA_SOURCE_DIR);
  char *argv[] = {S(RDAGEN_PATH), S("cache"), S("warm"), config, S("--arch"), S("sm_86"), NULL};
  rt_proc p;
  setenv("RDA_LOG", "info", 1);
  assert_true(rt_run(argv, 300, &p));
  assert_int_equal(p.exit_code, 0);
  assert_non_null(strstr(p.err, "rda: info: compiled rda_init for sm_86 in "));
  assert_non_null(strstr(p.err, " s (cache miss: not on disk)\n"));
  for (const char *line = p.err; *line; line = strchr(line, '\n') + 1) {
    assert_memory_equal(line, "rda: info: ", 11); /* every line is an event */
    if (strchr(line, '\n') == NULL) break;
  }
  rt_proc_free(&p);

  setenv("RDA_LOG", "debug", 1);
  assert_true(rt_run(argv, 300, &p));
  assert_int_equal(p.exit_code, 0);
  assert_non_null(strstr(p.err, "rda: debug: loaded rda_init from "));
  assert_non_null(strstr(p.err, "(disk cache hit)"));
  assert_null(strstr(p.err, "compiled"));
  rt_proc_free(&p);

  unsetenv("RDA_LOG");
  assert_true(rt_run(argv, 300, &p));
  assert_int_equal(p.exit_code, 0);
  assert_string_equal(p.err, "");
  assert_non_null(strstr(p.out, "already cached"));
  rt_proc_free(&p);

  char *list[] = {S(RDAGEN_PATH), S("cache"), S("list"), NULL};
  assert_true(rt_run(list, 60, &p));
  assert_int_equal(p.exit_code, 0);
  assert_non_null(strstr(p.out, "sm_86"));
  assert_non_null(strstr(p.out, "rda_init"));
  rt_proc_free(&p);
  char *clear[] = {S(RDAGEN_PATH), S("cache"), S("clear"), S("--arch"), S("sm_86"), NULL};
  assert_true(rt_run(clear, 60, &p));
  assert_int_equal(p.exit_code, 0);
  assert_non_null(strstr(p.out, "removed"));
  rt_proc_free(&p);
  char *bad[] = {S(RDAGEN_PATH), S("cache"), S("warm"), config, S("--arch"), S("gfx90"), NULL};
  assert_true(rt_run(bad, 60, &p));
  assert_int_equal(p.exit_code, 2);
  rt_proc_free(&p);
}

/* ---- the emulator on the cache ------------------------------------------------------------- */

static void test_cache_emulator_rebuilds_a_corrupted_module(void **state) {
  cache_fixture *f = *state;
  rda_backend *b = NULL;
  rda_err err = {0};
  assert_int_equal(rda_backend_emu_open(&b, 90, &err), RDA_OK);
  char src[] =
      "#include \"rda_device.cuh\"\n"
      "struct cache_tiny_params { float *out; float v; };\n"
      "extern \"C\" __global__ void cache_tiny(const cache_tiny_params p) {\n"
      "  p.out[threadIdx.x] = p.v * (float)threadIdx.x; }\n"
      "RDA_EMU_EXPORT(cache_tiny, cache_tiny_params)\n";
  rda_variant v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "cache_tiny");
  v.source = src;
  const float val = (float)rt_rng_normal(rt_global_rng());
  for (int round = 0; round < 2; ++round) {
    rda_module *m = NULL;
    assert_int_equal(b->load(b, &v, &m, &err), RDA_OK);
    float out[32];
    for (int i = 0; i < 32; ++i) out[i] = -12345.0f; /* poison */
    struct {
      float *out;
      float v;
    } params = {out, val};
    const unsigned grid[3] = {1, 1, 1};
    assert_int_equal(b->launch(b, m, grid, 32, 0, &params, sizeof params, &err), RDA_OK);
    for (int i = 0; i < 32; ++i) assert_true(out[i] == val * (float)i);
    b->unload(b, m);
    if (round == 0) { /* damage every entry of the target, then load again */
      rda_cache_entry_info *e = NULL;
      size_t count = 0;
      assert_int_equal(rda_cache_list(NULL, &e, &count, &err), RDA_OK);
      assert_true(count >= 1);
      for (size_t i = 0; i < count; ++i) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s/%s.rda", f->root, e[i].target, e[i].key);
        flip_payload_byte(path);
      }
      /* And spoil a header the compiler includes: it must be rewritten, not used. */
      char emu_dir[4096];
      snprintf(emu_dir, sizeof emu_dir, "%s/%s", f->root, e[0].target);
      free(e);
      DIR *d = opendir(emu_dir);
      assert_non_null(d);
      int spoiled = 0;
      for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (strncmp(de->d_name, "inc-", 4) != 0) continue;
        char hdr[8192];
        snprintf(hdr, sizeof hdr, "%s/%s/rda_device.cuh", emu_dir, de->d_name);
        assert_true(rt_write_file(hdr, "#error spoiled\n", 15));
        ++spoiled;
      }
      closedir(d);
      assert_int_equal(spoiled, 1);
      rda_cache_memory_clear();
    }
  }
  b->destroy(b);
}

/* ---- links, concurrent clears, unusable folders, limits, FIFOs ----------------------------- */

/* Set a path's times (the link itself, not what it points to) `age_s` seconds back. */
static void age_path(const char *path, long age_s) {
  const struct timespec t[2] = {{time(NULL) - age_s, 0}, {time(NULL) - age_s, 0}};
  assert_int_equal(utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW), 0);
}

/* A folder outside the cache with two files of random text; returns it (malloc'd). */
static char *make_victim(const char *parent, const char *name) {
  char *dir = rt_path(parent, name);
  assert_int_equal(mkdir(dir, 0700), 0);
  for (int i = 0; i < 2; ++i) {
    char file[64];
    snprintf(file, sizeof file, "keep%d.txt", i);
    char *p = rt_path(dir, file);
    unsigned char *text = random_bytes(100);
    assert_true(rt_write_file(p, text, 100));
    free(text);
    free(p);
  }
  return dir;
}

/* `cache clear` and the emulator's rm -r never delete through a symbolic link: a stale
 * inc-* link to a folder, a link inside a stale header folder and a stale .tmp. link are
 * removed themselves, and what they point to stays whole. */
static void test_cache_clear_never_follows_links_out_of_the_cache(void **state) {
  cache_fixture *f = *state;
  put_entry("kernel_l", 100);
  char *outside = rt_mkdtemp();
  assert_non_null(outside);
  char *v1 = make_victim(outside, "v1"), *v2 = make_victim(outside, "v2");
  char *v3 = rt_path(outside, "v3.txt");
  assert_true(rt_write_file(v3, "precious", 8));
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/sm_90", f->root);
  char *inc_link = rt_path(dir, "inc-0123456789abcdef");
  assert_int_equal(symlink(v1, inc_link), 0);
  age_path(inc_link, 7200);
  char *inc_real = rt_path(dir, "inc-fedcba9876543210");
  assert_int_equal(mkdir(inc_real, 0700), 0);
  char *inner = rt_path(inc_real, "emu");
  assert_int_equal(symlink(v2, inner), 0);
  age_path(inc_real, 7200);
  char *tmp_link = rt_path(dir, "abcd.tmp.1.2");
  assert_int_equal(symlink(v3, tmp_link), 0);
  age_path(tmp_link, 7200);

  size_t removed = 0, left = 0;
  rda_err err = {0};
  assert_int_equal(rda_cache_clear(NULL, &removed, &left, &err), RDA_OK);
  assert_int_equal(removed, 1);
  assert_int_equal(left, 0);
  struct stat st;
  assert_int_not_equal(lstat(inc_link, &st), 0); /* the links went */
  assert_int_not_equal(lstat(inc_real, &st), 0);
  assert_int_not_equal(lstat(tmp_link, &st), 0);
  assert_int_equal(rt_count_entries(v1), 2); /* what they led to stayed */
  assert_int_equal(rt_count_entries(v2), 2);
  assert_true(rt_exists(v3));

  /* The shared rm -r itself, on a folder holding a link to a folder. */
  char *tree = rt_path(f->root, "tree");
  assert_int_equal(mkdir(tree, 0700), 0);
  char *link = rt_path(tree, "to-v1");
  assert_int_equal(symlink(v1, link), 0);
  rda_cache_remove_tree(tree);
  assert_false(rt_exists(tree));
  assert_int_equal(rt_count_entries(v1), 2);
  /* And on a link given as the folder: the link goes, not the folder it names. */
  assert_int_equal(symlink(v2, tree), 0);
  rda_cache_remove_tree(tree);
  assert_int_not_equal(lstat(tree, &st), 0);
  assert_int_equal(rt_count_entries(v2), 2);
  rt_rmtree(outside);
  free(outside), free(v1), free(v2), free(v3), free(inc_link), free(inc_real), free(inner);
  free(tmp_link), free(tree), free(link);
}

/* Files a running process may be writing (temporaries, emulator header folders) survive a
 * clear while young; once older than an hour they go. */
static void test_cache_clear_leaves_in_flight_files_of_running_processes(void **state) {
  cache_fixture *f = *state;
  put_entry("kernel_f", 100);
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/sm_90", f->root);
  char *young_tmp = rt_path(dir, "1111.tmp.42.1"), *old_tmp = rt_path(dir, "2222.tmp.42.2");
  char *young_inc = rt_path(dir, "inc-young"), *old_inc = rt_path(dir, "inc-old");
  assert_true(rt_write_file(young_tmp, "partial", 7));
  assert_true(rt_write_file(old_tmp, "partial", 7));
  assert_int_equal(mkdir(young_inc, 0700), 0);
  assert_int_equal(mkdir(old_inc, 0700), 0);
  char *hdr = rt_path(young_inc, "rda_device.cuh");
  assert_true(rt_write_file(hdr, "// header\n", 10));
  age_path(old_tmp, 7200);
  age_path(old_inc, 7200);
  size_t removed = 0, left = 0;
  rda_err err = {0};
  assert_int_equal(rda_cache_clear("sm_90", &removed, &left, &err), RDA_OK);
  assert_int_equal(removed, 1);
  assert_int_equal(left, 2);
  assert_true(rt_exists(young_tmp));
  assert_true(rt_exists(hdr));
  assert_false(rt_exists(old_tmp));
  assert_false(rt_exists(old_inc));
  assert_false(has_entry("kernel_f"));
  free(young_tmp), free(old_tmp), free(young_inc), free(old_inc), free(hdr);
}

/* Loads and runs a small kernel on an emulator whose compiler is a wrapper that, on the first
 * compile matching `when` (a shell test over $inc, the -I header folder, and $cu, set for a .cu
 * file), runs `damage` once: the emulator must see its headers damaged, write them again and
 * retry, and the kernel must compute the right values. */
static void emu_survives_header_damage(cache_fixture *f, const char *when, const char *damage) {
  char *wrapper = rt_path(f->root, "cxx-wrapper.sh"), *mark = rt_path(f->root, "damaged-once");
  char script[8192];
  snprintf(script, sizeof script,
           "#!/bin/sh\n"
           "inc=; cu=\n"
           "for a in \"$@\"; do case \"$a\" in -I*) inc=\"${a#-I}\";; *.cu) cu=1;; esac; done\n"
           "if %s && [ ! -e '%s' ]; then : > '%s'; %s; fi\n"
           "exec c++ \"$@\"\n",
           when, mark, mark, damage);
  assert_true(rt_write_file(wrapper, script, strlen(script)));
  assert_int_equal(chmod(wrapper, 0700), 0);
  char *saved = rt_env_save("RDA_EMU_CXX");
  setenv("RDA_EMU_CXX", wrapper, 1);
  rda_backend *b = NULL;
  rda_err err = {0};
  assert_int_equal(rda_backend_emu_open(&b, 90, &err), RDA_OK);
  char src[] =
      "#include \"rda_device.cuh\"\n"
      "struct damage_params { float *out; float v; };\n"
      "extern \"C\" __global__ void damage_k(const damage_params p) {\n"
      "  p.out[threadIdx.x] = p.v * (float)(threadIdx.x + 1); }\n"
      "RDA_EMU_EXPORT(damage_k, damage_params)\n";
  rda_variant v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "damage_k");
  v.source = src;
  rda_module *m = NULL;
  const rda_status st = b->load(b, &v, &m, &err);
  if (st != RDA_OK) fprintf(stderr, "%s\n", err.msg);
  assert_int_equal(st, RDA_OK);
  assert_true(rt_exists(mark)); /* the headers really were damaged once */
  const float val = (float)rt_rng_normal(rt_global_rng());
  float out[16];
  for (int i = 0; i < 16; ++i) out[i] = -12345.0f;
  struct {
    float *out;
    float v;
  } params = {out, val};
  const unsigned grid[3] = {1, 1, 1};
  assert_int_equal(b->launch(b, m, grid, 16, 0, &params, sizeof params, &err), RDA_OK);
  for (int i = 0; i < 16; ++i) assert_true(out[i] == val * (float)(i + 1));
  b->unload(b, m);
  b->destroy(b);
  rt_env_restore("RDA_EMU_CXX", saved);
  free(wrapper), free(mark);
}

/* The whole header folder deleted on the first compile, as a concurrent `cache clear` of an
 * old folder would. */
static void test_cache_emulator_survives_its_header_folder_vanishing(void **state) {
  emu_survives_header_damage(*state, "[ -n \"$inc\" ]", "rm -rf \"$inc\"");
}

/* A cache folder that cannot be created (a file in the way) is "compile, do not cache": gets
 * miss, puts keep the entry in memory only, the emulator builds in a private temporary folder
 * it removes. A refusal (writable by others) stays an error (test above). */
static void test_cache_unusable_folder_compiles_without_caching(void **state) {
  cache_fixture *f = *state;
  char *file = rt_path(f->root, "a-file");
  assert_true(rt_write_file(file, "x", 1));
  char *cache = rt_path(file, "cache"); /* under a regular file: mkdir fails (ENOTDIR) */
  setenv("RDA_CACHE_DIR", cache, 1);
  const rda_cache_key k = key_for("kernel_u");
  unsigned char *data = NULL;
  size_t n = 0;
  int hit = 1;
  char why[160];
  rda_err err = {0};
  assert_int_equal(rda_cache_get("sm_90", &k, "kernel_u", &data, &n, &hit, why, sizeof why, &err),
                   RDA_OK);
  assert_int_equal(hit, 0);
  assert_string_equal(why, "kernel cache unusable");
  unsigned char *payload = random_bytes(64);
  assert_int_equal(rda_cache_put("sm_90", &k, "kernel_u", "kernel_u", payload, 64, &err), RDA_OK);
  assert_int_equal(rda_cache_get("sm_90", &k, "kernel_u", &data, &n, &hit, why, sizeof why, &err),
                   RDA_OK);
  assert_int_equal(hit, 1); /* from memory */
  assert_int_equal(n, 64);
  assert_memory_equal(data, payload, 64);
  free(data);
  free(payload);
  int usable = 1;
  char dir[4096];
  char why2[1024];
  assert_int_equal(rda_cache_folder_try("sm_90", dir, sizeof dir, &usable, why2, sizeof why2, &err),
                   RDA_OK);
  assert_int_equal(usable, 0);
  assert_non_null(strstr(why2, cache)); /* names the folder */
  assert_int_equal(rda_cache_folder("sm_90", dir, sizeof dir, &err), RDA_ERR_CACHE);

  /* The emulator: builds and runs, leaves nothing in $TMPDIR. */
  char *tmpdir = rt_path(f->root, "tmp");
  assert_int_equal(mkdir(tmpdir, 0700), 0);
  char *saved_tmp = rt_env_save("TMPDIR");
  setenv("TMPDIR", tmpdir, 1);
  rda_backend *b = NULL;
  rda_err e2 = {0};
  assert_int_equal(rda_backend_emu_open(&b, 90, &e2), RDA_OK);
  char src[] =
      "#include \"rda_device.cuh\"\n"
      "struct nocache_params { float *out; float v; };\n"
      "extern \"C\" __global__ void nocache_k(const nocache_params p) {\n"
      "  p.out[threadIdx.x] = p.v * (float)(threadIdx.x + 1); }\n"
      "RDA_EMU_EXPORT(nocache_k, nocache_params)\n";
  rda_variant v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "nocache_k");
  v.source = src;
  rda_module *m = NULL;
  const rda_status st = b->load(b, &v, &m, &e2);
  if (st != RDA_OK) fprintf(stderr, "%s\n", e2.msg);
  assert_int_equal(st, RDA_OK);
  const float val = (float)rt_rng_normal(rt_global_rng());
  float out[8];
  for (int i = 0; i < 8; ++i) out[i] = -12345.0f;
  struct {
    float *out;
    float v;
  } params = {out, val};
  const unsigned grid[3] = {1, 1, 1};
  assert_int_equal(b->launch(b, m, grid, 8, 0, &params, sizeof params, &e2), RDA_OK);
  for (int i = 0; i < 8; ++i) assert_true(out[i] == val * (float)(i + 1));
  b->unload(b, m);
  b->destroy(b);
  assert_int_equal(rt_count_entries(tmpdir), 0);
  rt_env_restore("TMPDIR", saved_tmp);
  setenv("RDA_CACHE_DIR", f->root, 1);
  free(file), free(cache), free(tmpdir);
}

/* `cache list` and `clear` of a cache that does not exist yet create nothing. */
static void test_cache_list_and_clear_do_not_create_the_root(void **state) {
  cache_fixture *f = *state;
  char *missing = rt_path(f->root, "not-yet");
  setenv("RDA_CACHE_DIR", missing, 1);
  rda_cache_entry_info *v = NULL;
  size_t count = 1, removed = 1, left = 1;
  rda_err err = {0};
  assert_int_equal(rda_cache_list(NULL, &v, &count, &err), RDA_OK);
  assert_int_equal(count, 0);
  free(v);
  assert_int_equal(rda_cache_clear("sm_90", &removed, &left, &err), RDA_OK);
  assert_int_equal(removed, 0);
  assert_int_equal(left, 0);
  assert_int_equal(rda_cache_evict(0, NULL, &removed, &err), RDA_OK);
  assert_false(rt_exists(missing));
  setenv("RDA_CACHE_DIR", f->root, 1);
  free(missing);
}

/* RDA_CACHE_MAX_BYTES: digits and an optional K/M/G; anything else is one clear error, and
 * the cache refuses to work with it (a command that compiles fails). */
static void test_cache_max_bytes_rejects_malformed_negative_and_overflowing(void **state) {
  (void)state;
  static const struct {
    const char *text;
    unsigned long long want;
  } good[] = {{"0", 0},
              {"25000", 25000},
              {"1k", 1024},
              {"3M", 3ull << 20},
              {"2G", 2ull << 30},
              {"18446744073709551615", 18446744073709551615ull},
              {"17179869183G", 17179869183ull << 30}};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; ++i) {
    setenv("RDA_CACHE_MAX_BYTES", good[i].text, 1);
    unsigned long long n = 1;
    rda_err err = {0};
    assert_int_equal(rda_cache_max_bytes_get(&n, &err), RDA_OK);
    assert_true(n == good[i].want);
  }
  static const char *const bad[] = {"abc",
                                    "-1",
                                    " 5",
                                    "5 ",
                                    "12Q",
                                    "1KB",
                                    "1.5G",
                                    "0x10",
                                    "+7",
                                    "K",
                                    "18446744073709551616",
                                    "17179869184G",
                                    "99999999999999999999999"};
  const rda_cache_key k = key_for("kernel_m");
  const unsigned char one = 1;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    setenv("RDA_CACHE_MAX_BYTES", bad[i], 1);
    unsigned long long n = 0;
    rda_err err = {0};
    assert_int_equal(rda_cache_max_bytes_get(&n, &err), RDA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "RDA_CACHE_MAX_BYTES"));
    assert_non_null(strstr(err.msg, bad[i]));
    assert_null(strchr(err.msg, '\n'));
    rda_err_clear(&err);
    assert_int_equal(rda_cache_put("sm_90", &k, "m", "m", &one, 1, &err), RDA_ERR_INVALID_ARGUMENT);
    rda_err_clear(&err);
    unsigned char *data = NULL;
    size_t bytes = 0;
    int hit = 0;
    assert_int_equal(rda_cache_get("sm_90", &k, "m", &data, &bytes, &hit, NULL, 0, &err),
                     RDA_ERR_INVALID_ARGUMENT);
  }
  unsetenv("RDA_CACHE_MAX_BYTES");
}

/* A folder outside the cache (*outside) holding a file named like an entry (*keep), linked
 * as the target folder sm_80 (returned): what the cache must never delete through. */
static char *link_sm80_elsewhere(const cache_fixture *f, char **outside, char **keep) {
  *outside = rt_mkdtemp();
  assert_non_null(*outside);
  assert_int_equal(chmod(*outside, 0700), 0);
  *keep = rt_path(*outside, "0000000000000000000000000000000000000000000000000000000000000000.rda");
  assert_true(rt_write_file(*keep, "not an entry", 12));
  char *link = rt_path(f->root, "sm_80");
  assert_int_equal(symlink(*outside, link), 0);
  return link;
}

/* A symlinked target folder is refused, the same way by get, put, list and clear; a clear
 * deletes nothing (not even through another target). Eviction passes over it, never through
 * it. */
static void test_cache_symlinked_target_folder_is_refused_everywhere(void **state) {
  cache_fixture *f = *state;
  put_entry("kernel_s", 100);
  char *outside = NULL, *keep = NULL;
  char *link = link_sm80_elsewhere(f, &outside, &keep);
  const rda_cache_key k = key_for("kernel_s");
  unsigned char *data = NULL;
  size_t n = 0, removed = 0;
  int hit = 0;
  rda_err err = {0};
  const unsigned char one = 1;
  assert_int_equal(rda_cache_get("sm_80", &k, NULL, &data, &n, &hit, NULL, 0, &err), RDA_ERR_CACHE);
  assert_non_null(strstr(err.msg, "symbolic link"));
  assert_non_null(strstr(err.msg, link));
  rda_err_clear(&err);
  assert_int_equal(rda_cache_put("sm_80", &k, "s", "s", &one, 1, &err), RDA_ERR_CACHE);
  assert_non_null(strstr(err.msg, "symbolic link"));
  rda_err_clear(&err);
  rda_cache_entry_info *v = NULL;
  assert_int_equal(rda_cache_list(NULL, &v, &n, &err), RDA_ERR_CACHE);
  assert_non_null(strstr(err.msg, "symbolic link"));
  rda_err_clear(&err);
  assert_int_equal(rda_cache_evict(0, k.hex, &removed, &err), RDA_OK);
  assert_int_equal(removed, 0);
  assert_int_equal(rda_cache_clear(NULL, &removed, NULL, &err), RDA_ERR_CACHE);
  assert_non_null(strstr(err.msg, "symbolic link"));
  assert_true(rt_exists(keep));
  assert_true(has_entry("kernel_s")); /* sm_90 untouched: refused before deleting anything */
  rda_err_clear(&err);
  /* Another target alone still works. */
  assert_int_equal(rda_cache_list("sm_90", &v, &n, &err), RDA_OK);
  assert_int_equal(n, 1);
  free(v);
  unlink(link);
  rt_rmtree(outside);
  free(outside), free(keep), free(link);
}

/* A lookup of k for sm_90 misses with `want` as its why, and `path` (in the entry's place) is
 * gone. */
static void expect_miss_removing(const rda_cache_key *k, const char *path, const char *want) {
  unsigned char *data = NULL;
  size_t n = 0;
  int hit = 1;
  char why[160];
  rda_err err = {0};
  assert_int_equal(rda_cache_get("sm_90", k, NULL, &data, &n, &hit, why, sizeof why, &err), RDA_OK);
  assert_int_equal(hit, 0);
  assert_null(data);
  assert_string_equal(why, want);
  assert_false(rt_exists(path));
}

/* A FIFO where an entry, an access record or a bundle cubin should be is refused at once,
 * never waited on (alarm: a hang kills the test). */
static void test_cache_fifo_in_the_cache_never_blocks(void **state) {
  cache_fixture *f = *state;
  put_entry("kernel_q", 100); /* makes sm_90/ */
  rda_cache_memory_clear();
  const rda_cache_key k = key_for("kernel_fifo");
  char *path = entry_path(f->root, "sm_90", &k);
  assert_int_equal(mkfifo(path, 0600), 0);
  char use[4096];
  snprintf(use, sizeof use, "%s/sm_90/%s.use", f->root, key_for("kernel_q").hex);
  unlink(use);
  assert_int_equal(mkfifo(use, 0600), 0);
  alarm(20);
  expect_miss_removing(&k, path, "corrupted entry: a FIFO in its place, removed"); /* no entry */
  size_t n = 0;
  rda_err err = {0};
  assert_true(has_entry("kernel_q")); /* touches the FIFO access record */
  rda_cache_entry_info *v = NULL;
  assert_int_equal(rda_cache_list(NULL, &v, &n, &err), RDA_OK);
  assert_int_equal(n, 1); /* the FIFO is no entry */
  free(v);
  unsigned char *image = NULL;
  assert_int_equal(mkfifo(path, 0600), 0);
  assert_int_equal(rda_cache_read_file(path, &image, &n, &err), RDA_ERR_IO);
  assert_non_null(strstr(err.msg, "not a regular file"));
  alarm(0);
  free(path);
}

/* RDA_LOG=debug tells memory hits too (README: "every cache hit"). */
static void test_cache_memory_hits_are_logged_at_debug(void **state) {
  cache_fixture *f = *state;
  char *log = rt_path(f->root, "stderr.txt");
  fflush(stderr);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    const int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, 2) < 0) _exit(3);
    setenv("RDA_LOG", "debug", 1);
    const rda_cache_key k = key_for("kernel_mem");
    const unsigned char payload[3] = {7, 8, 9};
    if (rda_cache_put("sm_90", &k, "kernel_mem", "kernel_mem", payload, 3, NULL) != RDA_OK)
      _exit(4);
    unsigned char *data = NULL;
    size_t n = 0;
    int hit = 0;
    if (rda_cache_get("sm_90", &k, NULL, &data, &n, &hit, NULL, 0, NULL) != RDA_OK || !hit)
      _exit(5);
    free(data);
    _exit(0);
  }
  wait_all_exit_zero(&pid, 1);
  char *text = rt_read_file(log, NULL);
  assert_non_null(text);
  assert_non_null(strstr(text, "rda: debug: "));
  assert_non_null(strstr(text, "(memory cache hit)"));
  free(text);
  free(log);
}

/* ---- review fixes (fix-cache2) ------------------------------------------------------------- */

/* A link in the cache root that leads to a file (tuning.lua, the user's tuning database, lives
 * there by default) or nowhere, and a folder or a link to one whose name is no target's (sm_XX,
 * emu-<machine>), are no target folders: list, clear and eviction work around them and leave
 * them and what they hold alone. */
static void test_cache_link_to_a_file_in_the_root_is_no_target(void **state) {
  cache_fixture *f = *state;
  char *real = rt_path(f->root, "tuning-real.lua"), *link = rt_path(f->root, "tuning.lua");
  char *dangling = rt_path(f->root, "gone");
  const char db[] = "return { entries = {} }\n";
  assert_true(rt_write_file(real, db, sizeof db - 1));
  assert_int_equal(symlink(real, link), 0);
  assert_int_equal(symlink("/nonexistent/rda-cache-target", dangling), 0);
  /* A link to a folder of the user's and a folder of the user's, each holding a file named
   * like an entry; and names that only look like targets (sm_8, sm_080, emu-x/y). */
  char *outside = rt_mkdtemp();
  assert_non_null(outside);
  static const char entry_like[] =
      "0000000000000000000000000000000000000000000000000000000000000000.rda";
  char *outside_file = rt_path(outside, entry_like);
  assert_true(rt_write_file(outside_file, "mine", 4));
  char *folder_link = rt_path(f->root, "models"), *own = rt_path(f->root, "sm_080");
  assert_int_equal(symlink(outside, folder_link), 0);
  assert_int_equal(mkdir(own, 0700), 0);
  char *own_file = rt_path(own, entry_like);
  assert_true(rt_write_file(own_file, "mine", 4));
  char *short_link = rt_path(f->root, "sm_8");
  assert_int_equal(symlink(outside, short_link), 0);
  put_entry("kernel_l1", 3000);
  put_entry("kernel_l2", 3000);
  rda_cache_entry_info *v = NULL;
  size_t n = 0;
  rda_err err = {0};
  const rda_status st = rda_cache_list(NULL, &v, &n, &err);
  if (st != RDA_OK) fprintf(stderr, "list: %s\n", err.msg);
  assert_int_equal(st, RDA_OK);
  assert_int_equal(n, 2);
  free(v);
  /* Eviction (run by every put) still works: a 7000-byte limit holds two entries, not three. */
  setenv("RDA_CACHE_MAX_BYTES", "7000", 1);
  put_entry("kernel_l3", 3000);
  assert_false(has_entry("kernel_l1"));
  assert_true(has_entry("kernel_l2"));
  assert_true(has_entry("kernel_l3"));
  unsetenv("RDA_CACHE_MAX_BYTES");
  size_t removed = 0;
  assert_int_equal(rda_cache_clear(NULL, &removed, NULL, &err), RDA_OK);
  assert_int_equal(removed, 2);
  size_t len = 0;
  char *kept = rt_read_file(link, &len); /* through the link: both kept */
  assert_non_null(kept);
  assert_int_equal(len, sizeof db - 1);
  assert_memory_equal(kept, db, len);
  struct stat sb;
  assert_int_equal(lstat(dangling, &sb), 0);
  /* The command line too: list and clear exit 0. */
  char *list[] = {S(RDAGEN_PATH), S("cache"), S("list"), NULL};
  char *clear[] = {S(RDAGEN_PATH), S("cache"), S("clear"), NULL};
  rt_proc p;
  assert_true(rt_run(list, 60, &p));
  if (p.exit_code != 0 || strstr(p.out, "0 entries") == NULL)
    fprintf(stderr, "cache list: exit %d: %s%s", p.exit_code, p.out, p.err);
  assert_int_equal(p.exit_code, 0);
  rt_proc_free(&p);
  assert_true(rt_run(clear, 60, &p));
  assert_int_equal(p.exit_code, 0);
  rt_proc_free(&p);
  assert_true(rt_exists(outside_file));
  assert_true(rt_exists(own_file));
  assert_int_equal(lstat(folder_link, &sb), 0);
  assert_true(S_ISLNK(sb.st_mode));
  assert_int_equal(lstat(short_link, &sb), 0);
  rt_rmtree(outside);
  free(kept), free(real), free(link), free(dangling);
  free(outside), free(outside_file), free(folder_link), free(own), free(own_file), free(short_link);
}

/* No cache root at all (RDA_CACHE_DIR, XDG_CACHE_HOME and HOME unset): list and clear fail
 * with the one line that says so, never "0 entries" from an unset path. */
static void test_cache_no_cache_root_at_all_is_one_error(void **state) {
  (void)state;
  char *saved_xdg = rt_env_save("XDG_CACHE_HOME"), *saved_home = rt_env_save("HOME");
  unsetenv("RDA_CACHE_DIR");
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HOME");
  rda_cache_entry_info *v = NULL;
  size_t n = 7;
  rda_err err = {0};
  assert_int_equal(rda_cache_list(NULL, &v, &n, &err), RDA_ERR_CACHE);
  assert_non_null(strstr(err.msg, "RDA_CACHE_DIR"));
  assert_int_equal(n, 0);
  memset(&err, 0, sizeof err);
  assert_int_equal(rda_cache_clear(NULL, NULL, NULL, &err), RDA_ERR_CACHE);
  assert_non_null(strstr(err.msg, "RDA_CACHE_DIR"));
  char dir[256];
  memset(dir, 'x', sizeof dir);
  assert_int_equal(rda_cache_folder("sm_90", dir, sizeof dir, &err), RDA_ERR_CACHE);
  assert_string_equal(dir, ""); /* written even then */
  char *list[] = {S(RDAGEN_PATH), S("cache"), S("list"), NULL};
  rt_proc p;
  assert_true(rt_run(list, 60, &p));
  if (p.exit_code != 1 || rt_count_lines(p.err) != 1 || strstr(p.err, "RDA_CACHE_DIR") == NULL)
    fprintf(stderr, "cache list: exit %d: %s%s", p.exit_code, p.out, p.err);
  assert_int_equal(p.exit_code, 1);
  assert_int_equal(rt_count_lines(p.err), 1);
  assert_non_null(strstr(p.err, "RDA_CACHE_DIR"));
  rt_proc_free(&p);
  rt_env_restore("XDG_CACHE_HOME", saved_xdg);
  rt_env_restore("HOME", saved_home);
}

/* Make `dir` refuse unlinks: chmod a-w for a user; root ignores modes, so the immutable flag
 * (chattr +i) then. 0 when neither works here (the test is skipped). */
static int make_undeletable(const char *dir, int on) {
  char cmd[4200];
  if (geteuid() != 0) return chmod(dir, on ? 0500 : 0700) == 0;
  snprintf(cmd, sizeof cmd, "chattr %ci '%s' 2>/dev/null", on ? '+' : '-', dir);
  return system(cmd) == 0;
}

/* Entries that cannot be removed fail `cache clear` with one line naming their folder (after
 * the other targets are cleared), never a quiet "removed 0 entries". */
static void test_cache_clear_that_cannot_remove_fails_naming_the_folder(void **state) {
  cache_fixture *f = *state;
  put_entry("kernel_ro1", 500);
  put_entry("kernel_ro2", 500);
  const rda_cache_key k = key_for("kernel_ro80");
  unsigned char *payload = random_bytes(300);
  rda_err err = {0};
  assert_int_equal(rda_cache_put("sm_80", &k, "kernel_ro80", "kernel_ro80", payload, 300, &err),
                   RDA_OK);
  free(payload);
  char *dir = rt_path(f->root, "sm_90"), *dir80 = rt_path(f->root, "sm_80");
  if (!make_undeletable(dir, 1)) {
    free(dir), free(dir80);
    skip();
  }
  size_t removed = 0;
  const rda_status st = rda_cache_clear(NULL, &removed, NULL, &err);
  char *clear[] = {S(RDAGEN_PATH), S("cache"), S("clear"), NULL};
  rt_proc p;
  assert_true(rt_run(clear, 60, &p));
  const int sm90_left = count_named(dir, ".rda"), sm80_left = count_named(dir80, ".rda");
  assert_true(make_undeletable(dir, 0));
  if (st != RDA_ERR_CACHE || p.exit_code != 1)
    fprintf(stderr, "clear: %d %s / exit %d: %s%s", (int)st, err.msg, p.exit_code, p.out, p.err);
  assert_int_equal(st, RDA_ERR_CACHE);
  assert_non_null(strstr(err.msg, dir));
  assert_non_null(strstr(err.msg, "could not be removed"));
  assert_int_equal(removed, 1); /* sm_80's entry */
  assert_int_equal(sm80_left, 0);
  assert_int_equal(sm90_left, 2);
  assert_int_equal(p.exit_code, 1);
  assert_int_equal(rt_count_lines(p.err), 1);
  assert_non_null(strstr(p.err, dir));
  assert_string_equal(p.out, "");
  rt_proc_free(&p);
  assert_true(has_entry("kernel_ro1"));
  free(dir), free(dir80);
}

/* One header deleted on the first compile of a kernel (a .cu file; the emulator runtime is
 * built first and left alone): a concurrent clear caught halfway. */
static void test_cache_emulator_survives_a_partly_deleted_header_folder(void **state) {
  emu_survives_header_damage(*state, "[ -n \"$inc\" ] && [ -n \"$cu\" ]",
                             "rm -f \"$inc/rda_device.cuh\"");
}

/* A bundle from an emit before cubin_sha256 was recorded is passed over with one warning per
 * bundle, whatever RDA_LOG says (the user must re-emit it), not one per kernel looked up. */
static void test_cache_bundle_without_cubin_sha_warns_once_per_bundle(void **state) {
  cache_fixture *f = *state;
  const char *src = "extern \"C\" __global__ void rda_old() {}\n";
  char sha[65];
  rda_err err = {0};
  assert_int_equal(rda_cache_source_sha(src, sha, &err), RDA_OK);
  char *b1 = rt_path(f->root, "old1"), *b2 = rt_path(f->root, "old2");
  char body[2048];
  snprintf(body, sizeof body,
           "{\"kernels\": [\n"
           "{\"name\": \"rda_old\", \"arch\": \"sm_90\", \"cubin\": \"o90.cubin\", "
           "\"source_sha256\": \"%s\"},\n"
           "{\"name\": \"rda_old\", \"arch\": \"sm_80\", \"cubin\": \"o80.cubin\", "
           "\"source_sha256\": \"%s\"}\n"
           "]}\n",
           sha, sha);
  const char *bundles[] = {b1, b2};
  for (int i = 0; i < 2; ++i) {
    assert_int_equal(mkdir(bundles[i], 0700), 0);
    write_manifest(bundles[i], body);
    const char *names[] = {"o90.cubin", "o80.cubin"};
    for (int c = 0; c < 2; ++c) {
      char *p = rt_path(bundles[i], names[c]);
      assert_true(rt_write_file(p, "cubin", 5));
      free(p);
    }
  }
  char list[8192];
  snprintf(list, sizeof list, "%s:%s", b1, b2);
  char *log = rt_path(f->root, "stderr.txt");
  /* RDA_LOG=off silences even warnings (checked first, in a process of its own). */
  for (int quiet = 1; quiet >= 0; --quiet) {
    fflush(stderr);
    const pid_t pid = fork(); /* a fresh process: the once-per-bundle memory starts empty */
    assert_true(pid >= 0);
    if (pid == 0) {
      const int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd < 0 || dup2(fd, 2) < 0) _exit(3);
      if (quiet)
        setenv("RDA_LOG", "off", 1);
      else
        unsetenv("RDA_LOG");
      char file[4096];
      for (int rep = 0; rep < 3; ++rep) {
        for (int arch = 80; arch <= 90; arch += 10) {
          int found = 1;
          if (rda_cache_bundle_find(list, "rda_old", arch, src, file, sizeof file, &found, NULL) !=
                  RDA_OK ||
              found)
            _exit(4);
        }
      }
      _exit(0);
    }
    wait_all_exit_zero(&pid, 1);
    char *text = rt_read_file(log, NULL);
    assert_non_null(text);
    if (quiet) {
      assert_string_equal(text, "");
      free(text);
      continue;
    }
    if (rt_count_lines(text) != 2) fprintf(stderr, "log:\n%s", text);
    assert_int_equal(rt_count_lines(text), 2);
    const char *w1 = strstr(text, "rda: warning: bundle ");
    assert_non_null(w1);
    assert_non_null(strstr(w1, b1));
    assert_non_null(strstr(text, b2));
    assert_non_null(strstr(text, "re-run rdagen emit"));
    free(text);
  }
  free(log), free(b1), free(b2);
}

/* ---- review fixes (fix-cache3) ------------------------------------------------------------- */

/* In a forked child (no cmocka there: a failed assert would run the other tests in it): the
 * line of the first failed check, said on stderr. */
#define CHILD_CHECK(cond)                                                       \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "child: check failed at line %d: %s\n", __LINE__, #cond); \
      return __LINE__;                                                          \
    }                                                                           \
  } while (0)

/* 1 when the cache holds `source`'s entry of key_for(source) for target, loaded from disk. */
static int child_has(const char *target, const char *source) {
  rda_cache_memory_clear();
  const rda_cache_key k = key_for(source);
  unsigned char *data = NULL;
  size_t n = 0;
  int hit = 0;
  if (rda_cache_get(target, &k, source, &data, &n, &hit, NULL, 0, NULL) != RDA_OK) return 0;
  free(data);
  return hit;
}

/* Store `bytes` random bytes under key_for(source) for target. */
static rda_status child_put(const char *target, const char *source, size_t bytes, rda_err *err) {
  const rda_cache_key k = key_for(source);
  unsigned char *payload = random_bytes(bytes);
  const rda_status st = rda_cache_put(target, &k, source, source, payload, bytes, err);
  free(payload);
  return st;
}

/* Run fn(its own fresh cache root) in a child as uid and gid 65534 (nobody), where modes count
 * (root ignores them); the test passes when it returns 0. Skipped unless run as root. */
static void run_as_nobody(int (*fn)(const char *root)) {
  if (geteuid() != 0) {
    skip(); /* only root can become another user */
    return;
  }
  fflush(stderr);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
    char root[] = "/tmp/rda_nobody_XXXXXX";
    if (mkdtemp(root) == NULL) _exit(78);
    setenv("RDA_CACHE_DIR", root, 1);
    rda_cache_memory_clear();
    const int line = fn(root);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "chmod -R u+rwx '%s' && rm -rf '%s'", root, root);
    if (system(cmd) != 0) fprintf(stderr, "child: could not remove %s\n", root);
    _exit(line == 0 ? 0 : 1);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* The counter of the next temporary name rda_cache_put takes in this process (one is spent
 * finding it): a put with no descriptor left fails naming its temporary. -1 when that fails. */
static long next_put_counter(const char *target) {
  struct rlimit old, low;
  if (getrlimit(RLIMIT_NOFILE, &old) != 0) return -1;
  low = old;
  low.rlim_cur = 64;
  if (setrlimit(RLIMIT_NOFILE, &low) != 0) return -1;
  int fds[64], nfds = 0;
  while (nfds < 64 && (fds[nfds] = dup(0)) >= 0) ++nfds;
  rda_err err = {0};
  const rda_cache_key k = key_for("counter probe");
  const unsigned char one = 1;
  const rda_status st = rda_cache_put(target, &k, "probe", "probe", &one, 1, &err);
  while (nfds > 0) close(fds[--nfds]);
  (void)setrlimit(RLIMIT_NOFILE, &old);
  char mark[64];
  snprintf(mark, sizeof mark, ".tmp.%ld.", (long)getpid());
  const char *at = strstr(err.msg, mark);
  if (st == RDA_OK || at == NULL) return -1;
  return strtol(at + strlen(mark), NULL, 10);
}

/* A process killed mid-write left `<key>.tmp.<pid>.<n>`; a later process with its pid (a
 * container's pid 1) stores the entry all the same, passing over the names taken. */
static void test_cache_put_passes_over_temporaries_of_a_dead_process_with_its_pid(void **state) {
  cache_fixture *f = *state;
  put_entry("kernel_pid0", 100); /* makes sm_90/ */
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/sm_90", f->root);
  fflush(stderr);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    const long next = next_put_counter("sm_90");
    if (next < 0) _exit(2);
    const rda_cache_key k = key_for("kernel_pid");
    for (long i = next + 1; i <= next + 8; ++i) {
      char name[8192];
      snprintf(name, sizeof name, "%s/%s.tmp.%ld.%ld", dir, k.hex, (long)getpid(), i);
      if (!rt_write_file(name, "partial", 7)) _exit(3);
    }
    rda_err err = {0};
    if (child_put("sm_90", "kernel_pid", 500, &err) != RDA_OK) {
      fprintf(stderr, "child: put: %s\n", err.msg);
      _exit(4);
    }
    _exit(child_has("sm_90", "kernel_pid") ? 0 : 5);
  }
  wait_all_exit_zero(&pid, 1);
  assert_int_equal(count_named(dir, ".tmp."), 8); /* young: they may be a running build's */
  assert_true(has_entry("kernel_pid"));
}

/* The emulator's temporaries too (header folder, source, module, load copy): a fresh rdagen
 * whose pid a killed one had builds and runs all the same. */
static void test_cache_emulator_passes_over_temporaries_of_a_dead_process_with_its_pid(
    void **state) {
  cache_fixture *f = *state;
  char *config = rt_path(f->root, "small.lua"), *log = rt_path(f->root, "demo.txt");
  static const char small[] =
      "return { heads = 2, kv_heads = 1, head_dim = 32, dtype = 'bf16',\n"
      "  segments = { 16 }, dilations = { 1 }, causal = true }\n";
  assert_true(rt_write_file(config, small, sizeof small - 1));
  char digest[65];
  rda_err err = {0};
  assert_int_equal(rda_sources_digest("templates/", digest, &err), RDA_OK);
  struct utsname un;
  assert_int_equal(uname(&un), 0);
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/emu-%s", f->root, un.machine);
  assert_int_equal(mkdir(dir, 0700), 0);
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) { /* leftovers of this pid, then rdagen in this very process */
    for (int i = 0; i < 8; ++i) {
      char name[8192];
      const long me = (long)getpid();
      snprintf(name, sizeof name, "%s/inc-%.32s.tmp.%ld.%d", dir, digest, me, i);
      if (mkdir(name, 0700) != 0) _exit(2);
      static const char *const stems[] = {"build", "build", "load"};
      static const char *const exts[] = {".cu", ".so", ".so"};
      for (int j = 0; j < 3; ++j) {
        snprintf(name, sizeof name, "%s/%s.tmp.%ld.%d%s", dir, stems[j], me, i, exts[j]);
        if (!rt_write_file(name, "partial", 7)) _exit(3);
      }
    }
    const int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(4);
    char *argv[] = {S(RDAGEN_PATH), S("demo"), config,  S("--backend"),
                    S("emu"),       S("--n"),  S("32"), NULL};
    execv(RDAGEN_PATH, argv);
    _exit(5);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  char *text = rt_read_file(log, NULL);
  assert_non_null(text);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fprintf(stderr, "demo:\n%s", text);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_non_null(strstr(text, "PASS"));
  assert_int_equal(count_named(dir, ".tmp."), 8 * 4); /* the leftovers, young: kept */
  free(text), free(config), free(log);
}

/* A folder in the sm_90 entry's place of `source` (returned), holding a file and a link to
 * `victim`, which must never be deleted through it. */
static char *folder_in_entry_place(const cache_fixture *f, const char *source, const char *victim) {
  const rda_cache_key k = key_for(source);
  char *path = entry_path(f->root, "sm_90", &k);
  assert_int_equal(mkdir(path, 0700), 0);
  char *inner = rt_path(path, "to-victim"), *file = rt_path(path, "x");
  assert_int_equal(symlink(victim, inner), 0);
  assert_true(rt_write_file(file, "x", 1));
  free(inner), free(file);
  return path;
}

/* A folder where an entry should be (never an entry) is removed by the lookup, which says so,
 * never through a link inside it; and put replaces one by itself. */
static void test_cache_folder_in_an_entrys_place_is_removed_and_rebuilt(void **state) {
  cache_fixture *f = *state;
  put_entry("kernel_d0", 100); /* makes sm_90/ */
  char *outside = rt_mkdtemp();
  assert_non_null(outside);
  char *victim = make_victim(outside, "v");
  const rda_cache_key k = key_for("kernel_dir");
  char *path = folder_in_entry_place(f, "kernel_dir", victim);
  expect_miss_removing(&k, path, "corrupted entry: a folder in its place, removed");
  assert_int_equal(rt_count_entries(victim), 2);
  put_entry("kernel_dir", 300);
  assert_true(has_entry("kernel_dir"));
  /* put alone, the folder there again (a lookup never ran) */
  char *path2 = folder_in_entry_place(f, "kernel_dir2", victim);
  put_entry("kernel_dir2", 300);
  assert_true(has_entry("kernel_dir2"));
  assert_int_equal(rt_count_entries(victim), 2);
  rt_rmtree(outside);
  free(outside), free(victim), free(path), free(path2);
}

/* `cache clear` removes a folder in an entry's or an access record's place (never through a
 * link in it), and only the cache's own names: a user's mine.rda, notes.use, an upper-case
 * key, a key with a further suffix stay. */
static void test_cache_clear_removes_only_entry_names_whatever_their_type(void **state) {
  cache_fixture *f = *state;
  put_entry("kernel_c1", 100);
  char *outside = rt_mkdtemp();
  assert_non_null(outside);
  char *victim = make_victim(outside, "v");
  const rda_cache_key k = key_for("kernel_cdir");
  char *entry_dir = folder_in_entry_place(f, "kernel_cdir", victim);
  char use_dir[4200];
  snprintf(use_dir, sizeof use_dir, "%s/sm_90/%s.use", f->root, key_for("kernel_c1").hex);
  assert_int_equal(unlink(use_dir), 0);
  assert_int_equal(mkdir(use_dir, 0700), 0);
  char upper[65];
  for (int i = 0; i < 64; ++i) upper[i] = (char)toupper((unsigned char)k.hex[i]);
  upper[64] = '\0';
  char names[4][128];
  snprintf(names[0], sizeof names[0], "mine.rda");
  snprintf(names[1], sizeof names[1], "notes.use");
  snprintf(names[2], sizeof names[2], "%s.rda", upper);
  snprintf(names[3], sizeof names[3], "%s.rda.bak", k.hex);
  char *kept[4];
  for (int i = 0; i < 4; ++i) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/sm_90", f->root);
    kept[i] = rt_path(dir, names[i]);
    assert_true(rt_write_file(kept[i], "mine", 4));
  }
  size_t removed = 0;
  rda_err err = {0};
  const rda_status st = rda_cache_clear(NULL, &removed, NULL, &err);
  if (st != RDA_OK) fprintf(stderr, "clear: %s\n", err.msg);
  assert_int_equal(st, RDA_OK);
  assert_int_equal(removed, 2); /* kernel_c1 and the folder in kernel_cdir's place */
  assert_false(rt_exists(entry_dir));
  assert_false(rt_exists(use_dir));
  assert_int_equal(rt_count_entries(victim), 2);
  for (int i = 0; i < 4; ++i) {
    assert_true(rt_exists(kept[i]));
    free(kept[i]);
  }
  rt_rmtree(outside);
  free(outside), free(victim), free(entry_dir);
}

/* A target folder that is a link (to a folder elsewhere) neither fails a put of another target
 * ("not stored") nor stops its eviction; nothing is deleted through it. */
static void test_cache_put_and_eviction_work_beside_a_linked_target_folder(void **state) {
  cache_fixture *f = *state;
  char *outside = NULL, *keep = NULL;
  char *link = link_sm80_elsewhere(f, &outside, &keep);
  setenv("RDA_CACHE_MAX_BYTES", "7000", 1);
  put_entry("kernel_k1", 3000); /* put_entry asserts RDA_OK: stored, not "not stored" */
  put_entry("kernel_k2", 3000);
  put_entry("kernel_k3", 3000);
  unsetenv("RDA_CACHE_MAX_BYTES");
  assert_false(has_entry("kernel_k1")); /* evicted all the same */
  assert_true(has_entry("kernel_k2"));
  assert_true(has_entry("kernel_k3"));
  assert_true(rt_exists(keep));
  unlink(link);
  rt_rmtree(outside);
  free(outside), free(keep), free(link);
}

/* As nobody: a target folder that cannot be read (mode 300: write and search, no read; mode
 * 000) fails list and clear naming it (never "0 entries", "removed 0"); a put elsewhere still
 * stores and evicts the folders it can read; an entry file that cannot be read is told apart
 * from a missing one. */
static int unreadable_target_as_nobody(const char *root) {
  rda_err err = {0};
  CHILD_CHECK(child_put("sm_80", "kernel_u80", 3000, &err) == RDA_OK);
  CHILD_CHECK(child_put("sm_90", "kernel_u1", 3000, &err) == RDA_OK);
  char sm80[4096];
  snprintf(sm80, sizeof sm80, "%s/sm_80", root);
  static const mode_t modes[] = {0300, 0000};
  for (int m = 0; m < 2; ++m) {
    CHILD_CHECK(chmod(sm80, modes[m]) == 0);
    rda_cache_entry_info *v = NULL;
    size_t n = 0;
    rda_err_clear(&err);
    CHILD_CHECK(rda_cache_list(NULL, &v, &n, &err) == RDA_ERR_CACHE);
    CHILD_CHECK(strstr(err.msg, sm80) != NULL && strstr(err.msg, "cannot be read") != NULL);
    rda_err_clear(&err);
    CHILD_CHECK(rda_cache_list("sm_90", &v, &n, &err) == RDA_OK && n == 1);
    free(v);
  }
  /* Eviction from a put: the put stores, eviction still works where it can read. */
  setenv("RDA_CACHE_MAX_BYTES", "7000", 1);
  rda_err_clear(&err);
  CHILD_CHECK(child_put("sm_90", "kernel_u2", 3000, &err) == RDA_OK);
  CHILD_CHECK(child_put("sm_90", "kernel_u3", 3000, &err) == RDA_OK);
  unsetenv("RDA_CACHE_MAX_BYTES");
  CHILD_CHECK(!child_has("sm_90", "kernel_u1"));
  CHILD_CHECK(child_has("sm_90", "kernel_u2") && child_has("sm_90", "kernel_u3"));
  size_t removed = 0;
  CHILD_CHECK(rda_cache_evict(1ull << 40, NULL, &removed, &err) == RDA_ERR_CACHE);
  CHILD_CHECK(strstr(err.msg, sm80) != NULL && removed == 0);
  /* clear: the rest goes, then one error naming the folder; its entry is still there. */
  rda_err_clear(&err);
  CHILD_CHECK(rda_cache_clear(NULL, &removed, NULL, &err) == RDA_ERR_CACHE);
  CHILD_CHECK(strstr(err.msg, sm80) != NULL && strstr(err.msg, "cannot be read") != NULL);
  CHILD_CHECK(removed == 2);
  CHILD_CHECK(chmod(sm80, 0700) == 0);
  CHILD_CHECK(child_has("sm_80", "kernel_u80"));
  /* An entry file this user may not read: not "not on disk". */
  const rda_cache_key k = key_for("kernel_u80");
  char path[4200];
  snprintf(path, sizeof path, "%s/%s.rda", sm80, k.hex);
  CHILD_CHECK(chmod(path, 0) == 0);
  rda_cache_memory_clear();
  unsigned char *data = NULL;
  size_t n = 0;
  int hit = 1;
  char why[160];
  CHILD_CHECK(rda_cache_get("sm_80", &k, NULL, &data, &n, &hit, why, sizeof why, &err) == RDA_OK);
  CHILD_CHECK(hit == 0 && strcmp(why, "entry not readable: Permission denied") == 0);
  CHILD_CHECK(rt_exists(path));
  return 0;
}

static void test_cache_unreadable_target_folder_fails_list_and_clear(void **state) {
  (void)state;
  run_as_nobody(unreadable_target_as_nobody);
}

/* A root too long for the paths under it (over 4096 characters, or one that fits but leaves no
 * room for an entry's name) is an unusable cache: list and clear fail saying so (never "no
 * cache yet"), get misses, put keeps the entry in memory only, nothing is created. */
static void test_cache_root_too_long_is_unusable_and_said(void **state) {
  cache_fixture *f = *state;
  static const size_t lengths[] = {4000, 4095, 5000};
  for (size_t t = 0; t < sizeof lengths / sizeof lengths[0]; ++t) {
    char *root = malloc(lengths[t] + 1);
    assert_non_null(root);
    size_t n = (size_t)snprintf(root, lengths[t] + 1, "%s", f->root);
    while (n < lengths[t]) { /* components of up to 200 characters */
      root[n++] = '/';
      for (int i = 0; i < 200 && n < lengths[t]; ++i) root[n++] = 'd';
    }
    root[n] = '\0';
    setenv("RDA_CACHE_DIR", root, 1);
    rda_cache_entry_info *v = NULL;
    size_t count = 0, removed = 0;
    rda_err err = {0};
    assert_int_equal(rda_cache_list(NULL, &v, &count, &err), RDA_ERR_CACHE);
    assert_non_null(strstr(err.msg, "too long"));
    rda_err_clear(&err);
    assert_int_equal(rda_cache_clear(NULL, &removed, NULL, &err), RDA_ERR_CACHE);
    assert_non_null(strstr(err.msg, "too long"));
    rda_err_clear(&err);
    const rda_cache_key k = key_for("kernel_long");
    unsigned char *data = NULL;
    int hit = 1;
    char why[160];
    assert_int_equal(rda_cache_get("sm_90", &k, NULL, &data, &count, &hit, why, sizeof why, &err),
                     RDA_OK);
    assert_string_equal(why, "kernel cache unusable");
    const unsigned char one = 1;
    assert_int_equal(rda_cache_put("sm_90", &k, "l", "l", &one, 1, &err), RDA_OK);
    assert_int_equal(rt_count_entries(f->root), 0); /* nothing created */
    rda_cache_memory_clear();
    free(root);
  }
  setenv("RDA_CACHE_DIR", f->root, 1);
}

/* A target folder that loading refuses (writable by group or others) is refused by list too,
 * naming it; clear and eviction leave it and say so. */
static void test_cache_list_refuses_a_target_folder_that_loading_refuses(void **state) {
  cache_fixture *f = *state;
  put_entry("kernel_w", 100);
  char *dir = rt_path(f->root, "sm_90");
  assert_int_equal(chmod(dir, 0770), 0);
  rda_cache_entry_info *v = NULL;
  size_t n = 0, removed = 0;
  rda_err err = {0};
  assert_int_equal(rda_cache_list(NULL, &v, &n, &err), RDA_ERR_CACHE);
  assert_non_null(strstr(err.msg, dir));
  assert_non_null(strstr(err.msg, "writable by group or others"));
  rda_err_clear(&err);
  assert_int_equal(rda_cache_evict(0, NULL, &removed, &err), RDA_ERR_CACHE);
  assert_non_null(strstr(err.msg, dir));
  rda_err_clear(&err);
  assert_int_equal(rda_cache_clear(NULL, &removed, NULL, &err), RDA_ERR_CACHE);
  assert_non_null(strstr(err.msg, dir));
  assert_int_equal(removed, 0);
  assert_int_equal(chmod(dir, 0700), 0);
  assert_true(has_entry("kernel_w"));
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cache_sha256_matches_fips_vectors),
      cmocka_unit_test(test_cache_key_changes_when_any_one_input_changes),
#define T(fn) cmocka_unit_test_setup_teardown(fn, cache_setup, cache_teardown)
      T(test_cache_miss_then_put_then_hit_from_memory_and_disk),
      T(test_cache_truncated_entry_is_detected_and_rebuilt),
      T(test_cache_flipped_byte_is_detected_and_rebuilt),
      T(test_cache_bad_magic_is_detected_and_rebuilt),
      T(test_cache_different_source_under_same_key_is_a_miss),
      T(test_cache_concurrent_processes_leave_one_entry),
      T(test_cache_concurrent_compiles_of_one_kernel_all_succeed),
      T(test_cache_concurrent_emulator_builds_all_succeed),
      T(test_cache_refuses_folder_writable_by_others),
      T(test_cache_refuses_folder_of_another_user),
      T(test_cache_evicts_least_recently_used_first),
      T(test_cache_eviction_removes_stale_temporary_files_only),
      T(test_cache_put_keeps_size_under_rda_cache_max_bytes),
      T(test_cache_list_marks_corrupted_and_clear_empties_one_target),
      T(test_cache_bundle_matches_name_arch_and_source_only),
      T(test_cache_bundle_from_rdagen_emit_is_found),
      cmocka_unit_test(test_cache_driver_older_than_nvrtc_is_a_clear_error),
      T(test_cache_embedded_sources_match_the_tree),
      T(test_cache_templates_digest_changes_with_any_template),
      T(test_cache_cold_run_without_rda_home_on_emulator),
      T(test_cache_rda_log_tells_compiles_and_hits_and_is_silent_by_default),
      T(test_cache_emulator_rebuilds_a_corrupted_module),
      T(test_cache_clear_never_follows_links_out_of_the_cache),
      T(test_cache_clear_leaves_in_flight_files_of_running_processes),
      T(test_cache_emulator_survives_its_header_folder_vanishing),
      T(test_cache_unusable_folder_compiles_without_caching),
      T(test_cache_list_and_clear_do_not_create_the_root),
      T(test_cache_max_bytes_rejects_malformed_negative_and_overflowing),
      T(test_cache_symlinked_target_folder_is_refused_everywhere),
      T(test_cache_fifo_in_the_cache_never_blocks),
      T(test_cache_memory_hits_are_logged_at_debug),
      T(test_cache_link_to_a_file_in_the_root_is_no_target),
      T(test_cache_no_cache_root_at_all_is_one_error),
      T(test_cache_clear_that_cannot_remove_fails_naming_the_folder),
      T(test_cache_emulator_survives_a_partly_deleted_header_folder),
      T(test_cache_bundle_without_cubin_sha_warns_once_per_bundle),
      T(test_cache_put_passes_over_temporaries_of_a_dead_process_with_its_pid),
      T(test_cache_emulator_passes_over_temporaries_of_a_dead_process_with_its_pid),
      T(test_cache_folder_in_an_entrys_place_is_removed_and_rebuilt),
      T(test_cache_clear_removes_only_entry_names_whatever_their_type),
      T(test_cache_put_and_eviction_work_beside_a_linked_target_folder),
      T(test_cache_unreadable_target_folder_fails_list_and_clear),
      T(test_cache_root_too_long_is_unusable_and_said),
      T(test_cache_list_refuses_a_target_folder_that_loading_refuses),
#undef T
  };
  const char *filter = getenv("RDA_TEST_FILTER"); /* e.g. "*link*" while developing */
  if (filter != NULL) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
