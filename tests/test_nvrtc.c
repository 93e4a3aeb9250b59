/* test_nvrtc.c — NVRTC compilation and the ptxas report (registers, spills, shared memory) on
 * real compiler output, compile errors, and the matrix: every variant the planner produces for
 * sm_80, sm_86, sm_90 (with and without wgmma) and sm_100 over head dims x dtypes x causal x
 * dilated compiles with zero spill bytes, and for sm_103 and sm_120 within 8 bytes (in an ASan
 * build, a sample of them: see SAMPLE). */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
// clang-format on

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gen.h"
#include "nvrtc.h"
#include "rda_test.h"

/* NVRTC keeps process-lifetime allocations of its own; they are not rda's leaks. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
  return "leak:libnvrtc\nleak:libnvrtc-builtins\n";
}

static const char tiny_src[] =
    "extern \"C\" __global__ void tiny(float *o) {\n"
    "  __shared__ float s[256];\n"
    "  s[threadIdx.x] = o[threadIdx.x];\n"
    "  __syncthreads();\n"
    "  o[threadIdx.x] = 2.0f * s[255 - threadIdx.x];\n"
    "}\n";

/* 64 values live across a loop, in at most 32 registers (1024 threads x 2 blocks per SM). */
static const char spill_src[] =
    "extern \"C\" __global__ void __launch_bounds__(1024, 2) spilly(float *o, int n) {\n"
    "  float a[64];\n"
    "#pragma unroll\n"
    "  for (int i = 0; i < 64; ++i) a[i] = o[i * 1024 + threadIdx.x];\n"
    "  for (int k = 0; k < n; ++k) {\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 64; ++i) a[i] = a[i] * a[(i + 1) & 63] + 1.0f;\n"
    "  }\n"
    "  float s = 0.0f;\n"
    "#pragma unroll\n"
    "  for (int i = 0; i < 64; ++i) s += a[i];\n"
    "  o[threadIdx.x] = s;\n"
    "}\n";

/* The sum of "N bytes spill stores" and "M bytes spill loads" over the whole log, read
 * independently of nvrtc.c's parser. */
static int log_spill_total(const char *log) {
  int total = 0;
  for (const char *p = strstr(log, "bytes stack frame,"); p;
       p = strstr(p + 1, "bytes stack frame,")) {
    int frame = 0, stores = 0, loads = 0;
    const char *line = p;
    while (line > log && line[-1] != '\n' && line[-1] != '.') --line;
    if (sscanf(line, " %d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &frame,
               &stores, &loads) == 3)
      total += stores + loads;
  }
  return total;
}

/* ptxas -v layouts of other CUDA versions, and what must be read from them. */
static void test_nvrtc_parses_ptxas_reports_of_other_layouts(void **state) {
  (void)state;
  /* CUDA 11/12: no barriers field, smem before cmem. */
  static const char cuda12[] =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'k' for 'sm_80'\n"
      "ptxas info    : Function properties for k\n"
      "    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 96 registers, 33792 bytes smem, 400 bytes cmem[0]\n";
  rda_nvrtc_out out;
  memset(&out, 0, sizeof out);
  assert_int_equal(rda_nvrtc_parse_report(cuda12, "k", &out), 1);
  assert_int_equal(out.registers, 96);
  assert_int_equal(out.spill_bytes, 20);
  assert_int_equal(out.smem_bytes, 33792);
  assert_int_equal(out.wgmma_notices, 0);

  /* CUDA 12.3+ on sm_90a: advisories when wgmma is serialized or a fence is injected. */
  static const char serialized[] =
      "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
      "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are "
      "serialized due to the presence of Extern calls in the function 'k'.\n"
      "ptxas info    : (C7519) Potential Performance Loss: warpgroup.arrive is injected\n"
      "ptxas info    : Function properties for k\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers\n";
  memset(&out, 0, sizeof out);
  assert_int_equal(rda_nvrtc_parse_report(serialized, "k", &out), 1);
  assert_int_equal(out.wgmma_notices, 2);

  /* Items split over lines; a non-inlined callee that spills (counted); a second entry that
   * spills (not counted); the entry reported after the others. */
  static const char split[] =
      "ptxas info    : Function properties for _Z6helperPf\n"
      "ptxas         .     24 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Compiling entry function 'other' for 'sm_90'\n"
      "ptxas info    : Function properties for other\n"
      "ptxas         .     0 bytes stack frame, 100 bytes spill stores, 100 bytes spill loads\n"
      "ptxas info    : Used 255 registers, used 0 barriers, 4096 bytes smem\n"
      "ptxas info    : Compiling entry function 'main_entry' for 'sm_90'\n"
      "ptxas info    : Function properties for main_entry\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers\n"
      "ptxas info    : 1024 bytes smem, 368 bytes cmem[0]\n"
      "ptxas info    : Compile time = 12.5 ms\n";
  memset(&out, 0, sizeof out);
  assert_int_equal(rda_nvrtc_parse_report(split, "main_entry", &out), 1);
  assert_int_equal(out.registers, 168);
  assert_int_equal(out.spill_bytes, 8);
  assert_int_equal(out.smem_bytes, 1024);
  memset(&out, 0, sizeof out);
  assert_int_equal(rda_nvrtc_parse_report(split, "other", &out), 1);
  assert_int_equal(out.registers, 255);
  assert_int_equal(out.spill_bytes, 208);
  assert_int_equal(out.smem_bytes, 4096);

  /* An entry that is not there, a prefix of one that is, an empty log. */
  assert_int_equal(rda_nvrtc_parse_report(split, "main", &out), 0);
  assert_int_equal(rda_nvrtc_parse_report(split, "absent", &out), 0);
  assert_int_equal(rda_nvrtc_parse_report("", "k", &out), 0);
}

static void test_nvrtc_version_is_cuda_11_2_or_newer(void **state) {
  (void)state;
  assert_true(rda_nvrtc_version() >= 11020);
  assert_true(rda_nvrtc_arch_supported(80));
  assert_true(rda_nvrtc_arch_supported(90));
  assert_false(rda_nvrtc_arch_supported(95));
  assert_false(rda_nvrtc_arch_supported(0));
}

static void test_nvrtc_tiny_kernel_reports_registers_and_smem(void **state) {
  (void)state;
  const int archs[] = {80, 90};
  for (size_t i = 0; i < sizeof archs / sizeof archs[0]; ++i) {
    rda_nvrtc_out out;
    rda_err err = {0};
    assert_int_equal(rda_nvrtc_compile(tiny_src, "tiny", "tiny", archs[i], 0, &out, &err), RDA_OK);
    assert_non_null(out.image);
    assert_true(out.image_bytes > 4);
    assert_memory_equal(out.image,
                        "\x7f"
                        "ELF",
                        4); /* a cubin is an ELF image */
    assert_true(out.registers > 0);
    assert_int_equal(out.spill_bytes, 0);
    assert_int_equal(out.smem_bytes, 256 * 4);
    assert_true(out.compile_s > 0.0);
    assert_non_null(strstr(out.log, "Used"));
    rda_nvrtc_out_free(&out);
    assert_null(out.image);
  }
}

static void test_nvrtc_ptx_is_text_for_the_target(void **state) {
  (void)state;
  rda_nvrtc_out out;
  rda_err err = {0};
  assert_int_equal(rda_nvrtc_compile(tiny_src, "tiny", "tiny", 90, 1, &out, &err), RDA_OK);
  assert_int_equal(strlen((const char *)out.image), out.image_bytes);
  assert_non_null(strstr((const char *)out.image, ".target sm_90"));
  assert_non_null(strstr((const char *)out.image, ".entry tiny"));
  assert_true(out.registers > 0); /* the report comes with PTX too */
  rda_nvrtc_out_free(&out);
}

static void test_nvrtc_syntax_error_names_program_and_error(void **state) {
  (void)state;
  static const char bad[] =
      "extern \"C\" __global__ void broken(float *o) {\n"
      "  o[threadIdx.x] = 1.0f +;\n"
      "}\n";
  rda_nvrtc_out out;
  rda_err err = {0};
  assert_int_equal(rda_nvrtc_compile(bad, "broken_kernel", "broken", 90, 0, &out, &err),
                   RDA_ERR_NVRTC);
  assert_int_equal(err.status, RDA_ERR_NVRTC);
  assert_non_null(strstr(err.msg, "broken_kernel.cu"));
  assert_non_null(strstr(err.msg, "error"));
  assert_non_null(strstr(err.msg, "expected an expression"));
  assert_null(strchr(err.msg, '\n'));
  assert_null(out.image);
  assert_null(out.log);
  rda_nvrtc_out_free(&out); /* harmless after a failure */
}

static void test_nvrtc_spilling_kernel_reports_spill_bytes(void **state) {
  (void)state;
  rda_nvrtc_out out;
  rda_err err = {0};
  assert_int_equal(rda_nvrtc_compile(spill_src, "spilly", "spilly", 90, 0, &out, &err), RDA_OK);
  const int expected = log_spill_total(out.log);
  print_message("spilly: %d registers, %d spill bytes (log says %d)\n", out.registers,
                out.spill_bytes, expected);
  assert_true(out.registers <= 32);
  assert_true(out.spill_bytes > 0);
  assert_int_equal(out.spill_bytes, expected);
  assert_int_equal(out.smem_bytes, 0);
  rda_nvrtc_out_free(&out);
}

static void test_nvrtc_report_is_for_the_requested_entry(void **state) {
  (void)state;
  char both[sizeof tiny_src + sizeof spill_src];
  snprintf(both, sizeof both, "%s%s", tiny_src, spill_src);
  rda_nvrtc_out out;
  rda_err err = {0};
  assert_int_equal(rda_nvrtc_compile(both, "both", "tiny", 80, 0, &out, &err), RDA_OK);
  assert_int_equal(out.spill_bytes, 0); /* spilly's spills are not tiny's */
  assert_int_equal(out.smem_bytes, 1024);
  rda_nvrtc_out_free(&out);
  assert_int_equal(rda_nvrtc_compile(both, "both", "spilly", 80, 0, &out, &err), RDA_OK);
  assert_true(out.spill_bytes > 0);
  assert_int_equal(out.smem_bytes, 0);
  rda_nvrtc_out_free(&out);
}

static void test_nvrtc_rejects_an_entry_not_in_the_source(void **state) {
  (void)state;
  rda_nvrtc_out out;
  rda_err err = {0};
  assert_int_equal(rda_nvrtc_compile(tiny_src, "tiny", "missing_entry", 90, 0, &out, &err),
                   RDA_ERR_NVRTC);
  assert_non_null(strstr(err.msg, "missing_entry"));
  assert_null(out.image);
}

static void test_nvrtc_rejects_an_arch_it_cannot_target(void **state) {
  (void)state;
  rda_nvrtc_out out;
  rda_err err = {0};
  assert_int_equal(rda_nvrtc_compile(tiny_src, "tiny", "tiny", 95, 0, &out, &err),
                   RDA_ERR_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "sm_95"));
  assert_non_null(strstr(err.msg, "sm_90")); /* lists what is supported */
  assert_null(out.image);
}

static void test_nvrtc_finds_the_templates(void **state) {
  (void)state;
  static const char src[] =
      "#include \"rda_device.cuh\"\n"
      "extern \"C\" __global__ void uses_params(const rda_init_params p) {\n"
      "  if (threadIdx.x == 0) p.o[0] = (float)p.heads;\n"
      "}\n";
  rda_nvrtc_out out;
  rda_err err = {0};
  const rda_status s = rda_nvrtc_compile(src, "uses_params", "uses_params", 80, 0, &out, &err);
  if (s != RDA_OK) print_error("%s\n", err.msg);
  assert_int_equal(s, RDA_OK);
  rda_nvrtc_out_free(&out);
}

/* --- the matrix ------------------------------------------------------------------------------ */

typedef struct matrix_job {
  const rda_variant *v;
  int arch;
  int spill_limit; /* bytes per thread ptxas may spill on this target */
  rda_status status;
  rda_err err;
  int registers, spill_bytes, smem_bytes, wgmma_notices;
  double compile_s;
} matrix_job;

typedef struct matrix_queue {
  matrix_job *jobs;
  int njobs, next;
  pthread_mutex_t lock;
} matrix_queue;

static void *matrix_worker(void *arg) {
  matrix_queue *q = arg;
  for (;;) {
    pthread_mutex_lock(&q->lock);
    const int i = q->next < q->njobs ? q->next++ : -1;
    pthread_mutex_unlock(&q->lock);
    if (i < 0) return NULL;
    matrix_job *j = &q->jobs[i];
    rda_nvrtc_out out;
    j->status = rda_nvrtc_compile(j->v->source, j->v->name, j->v->name, j->arch, 0, &out, &j->err);
    j->compile_s = out.compile_s;
    if (j->status == RDA_OK) {
      j->registers = out.registers;
      j->spill_bytes = out.spill_bytes;
      j->smem_bytes = out.smem_bytes + j->v->smem_bytes;
      j->wgmma_notices = out.wgmma_notices;
    }
    rda_nvrtc_out_free(&out);
  }
}

/* Plans of cfg on hw, each with one wgmma candidate tile of the forward or the dQ kernel
 * forced, for the candidates plans do not take now (the chosen one is in the unforced plan):
 * at most cap into out. Returns how many. */
static int force_wgmma_candidates(rda_gen *g, const rda_config *cfg, const rda_hw *hw,
                                  rda_plan_k *out, int cap) {
  rda_err err = {0};
  rda_tune_task *tasks = NULL;
  int ntasks = 0, n = 0;
  const unsigned flags = RDA_PLAN_WGMMA | RDA_PLAN_BACKWARD;
  if (rda_gen_tune_tasks(g, cfg, hw, flags, &tasks, &ntasks, &err) != RDA_OK)
    fail_msg("tune tasks sm_%d: %s", hw->arch, err.msg);
  for (int t = 0; t < ntasks; ++t) {
    if (strcmp(tasks[t].kind, "fwd") != 0 && strcmp(tasks[t].kind, "bwd_dq") != 0) continue;
    for (int c = 0; c < tasks[t].ncandidates; ++c) {
      const char *tile = tasks[t].candidates[c];
      if (strstr(tile, "_wg") == NULL || strcmp(tile, tasks[t].chosen) == 0) continue;
      if (n == cap) fail_msg("more than %d forced wgmma plans: raise NFORCED", cap);
      const rda_gen_force force = {.kind = tasks[t].kind, .branch = tasks[t].branch, .tile = tile};
      if (rda_gen_plan_forced(g, cfg, hw, flags, &force, &out[n], &err) != RDA_OK)
        fail_msg("plan sm_%d with %s branch %d forced to %s: %s", hw->arch, tasks[t].kind,
                 tasks[t].branch, tile, err.msg);
      ++n;
    }
  }
  free(tasks);
  return n;
}

#define MATRIX_THREADS 2 /* CI has two cores; NVRTC is thread-safe per program */

/* The targets of the matrix. sm_90 twice: with the mma.sync tiles and with the wgmma path
 * switched on. sm_86 stands for the 99 KiB-per-block GPUs of Ampere and Ada (sm_89 compiles
 * alike). Blackwell (bf16 only: fp16 differs in the mma type alone) runs the mma.sync kernels;
 * sm_100 and sm_103 differ in what ptxas spills, sm_121 compiles as sm_120. Where ptxas 13.0
 * spills a tile on a target (sm_86: the dense causal d = 128 forward of 64-row tiles, 28 bytes;
 * Blackwell: dilated forwards of 64 keys at d = 128 and 256 and of 128 at d = 64, mostly their
 * kv-table twins, up to 248 bytes, some in the key loop; sm_103: the dense d = 32 dK/dV), the
 * plans take another tile there (gen/hw.lua, spills), so each target is held to 0 but two dQ
 * variants that keep ptxas's register cap and store one word before the key loop, loaded after
 * it (8 bytes; a dQ tile of half the rows would cost more): sm_120's d = 64 dilated causal twin
 * and sm_103's d = 32 dilated causal kernel. */
static const struct matrix_target {
  int arch;
  unsigned flags;
  int spill_limit;
  int fp16;
} matrix_targets[] = {
    {80, 0u, 0, 1},  {86, 0u, 0, 1},  {90, 0u, 0, 1},  {90, RDA_PLAN_WGMMA, 0, 1},
    {100, 0u, 0, 0}, {103, 0u, 8, 0}, {120, 0u, 8, 0},
};

static void test_nvrtc_matrix_every_planned_variant_compiles_without_spills(void **state) {
  (void)state;
  static const int head_dims[] = {32, 64, 96, 128, 256};
  static const char *const dtypes[] = {"bf16", "fp16"};
  enum { NARCH = sizeof matrix_targets / sizeof matrix_targets[0] };
  enum { NCFG = 5 * 2 * 2, NFORCED = 192 };
  rda_gen *g = NULL;
  rda_err err = {0};
  if (rda_gen_open(&g, &err) != RDA_OK) fail_msg("rda_gen_open: %s", err.msg);
  rda_hw hw[NARCH];
  for (int a = 0; a < NARCH; ++a)
    if (rda_gen_hw_builtin(g, matrix_targets[a].arch, &hw[a], &err) != RDA_OK)
      fail_msg("rda_gen_hw_builtin(%d): %s", matrix_targets[a].arch, err.msg);

  /* Each config has dense and dilated branches, with grids both large (> 64 rows per segment)
   * and small, so the planner picks both its wide and its narrow tiles. */
  static rda_plan_k plans[NCFG * NARCH + NFORCED];
  int plan_target[NCFG * NARCH + NFORCED]; /* index into matrix_targets */
  int nplans = 0;
  for (int d = 0; d < 5; ++d)
    for (int t = 0; t < 2; ++t)
      for (int c = 0; c < 2; ++c) {
        char chunk[512];
        snprintf(chunk, sizeof chunk,
                 "return { heads = 4, kv_heads = 2, head_dim = %d, dtype = \"%s\",\n"
                 "  segments = { 4096, 4096, 64, 128 }, dilations = { 1, 2, 1, 2 },\n"
                 "  causal = %s }\n",
                 head_dims[d], dtypes[t], c ? "true" : "false");
        rda_config cfg;
        if (rda_gen_config_string(g, chunk, "matrix", &cfg, &err) != RDA_OK)
          fail_msg("config: %s", err.msg);
        for (int a = 0; a < NARCH; ++a) {
          const unsigned extra = matrix_targets[a].flags;
          if (t == 1 && !matrix_targets[a].fp16) continue;
          /* Backward kernels too, with their atomic-dQ variants: none may spill either. */
          if (rda_gen_plan_ex(g, &cfg, &hw[a],
                              RDA_PLAN_BACKWARD | RDA_PLAN_BACKWARD_ATOMIC | extra,
                              &plans[nplans], &err) != RDA_OK)
            fail_msg("plan d%d %s causal=%d sm_%d: %s", head_dims[d], dtypes[t], c,
                     matrix_targets[a].arch, err.msg);
          /* The wgmma plans of d = 64 and 128 must take wgmma tiles (else they test nothing),
           * for the forward and for every dK/dV (but the atomic one) and dQ variant alike. */
          int wg = 0, bwd = 0, bwd_wg = 0;
          for (int i = 0; i < plans[nplans].nvariants; ++i) {
            const rda_variant *v = &plans[nplans].variants[i];
            const int is_wg = strstr(v->name, "_wg") != NULL;
            const int is_bwd =
                (strcmp(v->kind, "bwd_dq") == 0 || strcmp(v->kind, "bwd_dkdv") == 0) &&
                strstr(v->name, "_qa") == NULL;
            wg += is_wg;
            bwd += is_bwd;
            bwd_wg += is_bwd && is_wg;
          }
          const int want_wg = extra != 0u && (head_dims[d] == 64 || head_dims[d] == 128);
          if (want_wg != (wg > 0) || bwd == 0 || bwd_wg != (want_wg ? bwd : 0))
            fail_msg("plan d%d sm_%d flags 0x%x: %d wgmma variants, %d of %d dK/dV and dQ "
                     "variants", head_dims[d], matrix_targets[a].arch, extra, wg, bwd_wg, bwd);
          plan_target[nplans++] = a;
          /* Plans take one tile per kernel, but the tuner may rank any: every wgmma forward
           * and dQ candidate (bf16; fp16 differs only in the mma type) is planned with its
           * tile forced, so it is held to the same bar. */
          if (want_wg && t == 0) {
            const int n = force_wgmma_candidates(g, &cfg, &hw[a], &plans[nplans],
                                                 NCFG * NARCH + NFORCED - nplans);
            for (int k = 0; k < n; ++k) plan_target[nplans++] = a;
          }
        }
      }

  /* Unique (variant, arch) pairs. */
  int cap = 0;
  for (int p = 0; p < nplans; ++p) cap += plans[p].nvariants;
  matrix_job *jobs = calloc((size_t)cap, sizeof *jobs);
  assert_non_null(jobs);
  int njobs = 0;
  for (int p = 0; p < nplans; ++p) {
    for (int i = 0; i < plans[p].nvariants; ++i) {
      const rda_variant *v = &plans[p].variants[i];
      int dup = 0;
      for (int k = 0; k < njobs && !dup; ++k)
        dup = jobs[k].arch == plans[p].hw.arch && strcmp(jobs[k].v->name, v->name) == 0;
      if (dup) continue;
      jobs[njobs].v = v;
      jobs[njobs].arch = plans[p].hw.arch;
      jobs[njobs].spill_limit = matrix_targets[plan_target[p]].spill_limit;
      ++njobs;
    }
  }

#if defined(__SANITIZE_ADDRESS__)
  /* Under ASan the compiler itself (NVRTC and ptxas, not rda's code) runs several times slower:
   * this matrix took 15 to 23 of CI's 90 minutes, while the release run compiles all of it.
   * Here a sample checks rda's side of the calls: each target's first variant and every 6th. */
  enum { SAMPLE = 6 };
#else
  enum { SAMPLE = 1 };
#endif
  int kept = 0;
  for (int k = 0; k < njobs; ++k) {
    int first = 1;
    for (int m = 0; m < k && first; ++m) first = jobs[m].arch != jobs[k].arch;
    if (first || k % SAMPLE == 0) jobs[kept++] = jobs[k];
  }
  if (kept < njobs) print_message("sanitized build: %d of %d variants compiled\n", kept, njobs);
  njobs = kept;

  const double t0 = rt_now_s();
  matrix_queue q = {.jobs = jobs, .njobs = njobs, .next = 0};
  pthread_mutex_init(&q.lock, NULL);
  pthread_t threads[MATRIX_THREADS];
  int started = 0;
  for (int t = 1; t < MATRIX_THREADS; ++t)
    if (pthread_create(&threads[started], NULL, matrix_worker, &q) == 0) ++started;
  matrix_worker(&q);
  for (int t = 0; t < started; ++t) pthread_join(threads[t], NULL);
  pthread_mutex_destroy(&q.lock);
  const double wall = rt_now_s() - t0;

  int failures = 0;
  double sum = 0, worst = 0;
  print_message("%-52s %-6s %5s %6s %7s %8s\n", "variant", "arch", "regs", "spill", "smem",
                "compile");
  for (int k = 0; k < njobs; ++k) {
    const matrix_job *j = &jobs[k];
    sum += j->compile_s;
    if (j->compile_s > worst) worst = j->compile_s;
    if (j->status != RDA_OK) {
      print_error("FAIL %s sm_%d: %s\n", j->v->name, j->arch, j->err.msg);
      ++failures;
      continue;
    }
    print_message("%-52s sm_%-3d %5d %6d %7d %6.2f s%s\n", j->v->name, j->arch, j->registers,
                  j->spill_bytes, j->smem_bytes, j->compile_s,
                  j->spill_bytes > j->spill_limit ? "  <-- SPILLS"
                  : j->spill_bytes                ? "  (spills, within this target's bound)"
                                                  : "");
    if (j->spill_bytes > j->spill_limit) ++failures;
    if (j->wgmma_notices != 0) {
      print_error("FAIL %s sm_%d: %d ptxas wgmma advisories (C75xx: serialized wgmma)\n",
                  j->v->name, j->arch, j->wgmma_notices);
      ++failures;
    }
  }
  print_message(
      "%d variants: compile %.1f s in all, %.2f s mean, %.2f s worst; wall %.1f s on %d "
      "threads\n",
      njobs, sum, njobs ? sum / njobs : 0.0, worst, wall, MATRIX_THREADS);

  free(jobs);
  for (int p = 0; p < nplans; ++p) rda_plan_k_free(&plans[p]);
  rda_gen_close(g);
  if (failures) fail_msg("%d of %d variants failed to compile or spilled", failures, njobs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nvrtc_parses_ptxas_reports_of_other_layouts),
      cmocka_unit_test(test_nvrtc_version_is_cuda_11_2_or_newer),
      cmocka_unit_test(test_nvrtc_tiny_kernel_reports_registers_and_smem),
      cmocka_unit_test(test_nvrtc_ptx_is_text_for_the_target),
      cmocka_unit_test(test_nvrtc_syntax_error_names_program_and_error),
      cmocka_unit_test(test_nvrtc_spilling_kernel_reports_spill_bytes),
      cmocka_unit_test(test_nvrtc_report_is_for_the_requested_entry),
      cmocka_unit_test(test_nvrtc_rejects_an_entry_not_in_the_source),
      cmocka_unit_test(test_nvrtc_rejects_an_arch_it_cannot_target),
      cmocka_unit_test(test_nvrtc_finds_the_templates),
      cmocka_unit_test(test_nvrtc_matrix_every_planned_variant_compiles_without_spills),
  };
  const char *filter = getenv("RDA_TEST_FILTER"); /* e.g. "*parses*" while developing */
  if (filter != NULL) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
