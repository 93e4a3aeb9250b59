/* test_api.c — the public C API (include/rda.h) on the CPU emulator context: every status path
 * of the boundary checks (NULLs, wrong handles, bad configs, shapes, dtypes, strides, alignment,
 * workspace), forward results against the float64 reference, and clean create/destroy loops. */
#include "api.h"
#include "api_internal.h" /* the autotune test reads a plan's tiles */
#include "backend.h"
#include "rda.h"
#include "rda_test.h"
#include "reference.h"

/* clang-format off */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cmocka.h> /* after the standard headers it needs */
/* clang-format on */

/* ------------------------------------------------------------------ fixture */

/* 256-byte aligned memory (C11 aligned_alloc wants the size a multiple of the alignment). */
static void *aalloc(size_t bytes) {
  return aligned_alloc(256, (bytes + 255) / 256 * 256);
}

static rda_ctx *g_ctx;   /* the emulator context */
static rda_plan *g_plan; /* the misuse tests' plan: kCfg below */

enum { kH = 4, kHkv = 2, kD = 32, kB = 2, kN = 40 };

static rda_attn_config base_config(void) {
  rda_attn_config c = RDA_CONFIG_INIT;
  c.heads = kH;
  c.kv_heads = kHkv;
  c.head_dim = kD;
  c.dtype = RDA_BF16;
  c.causal = 1;
  c.nbranch = 2;
  c.segments[0] = 16, c.dilations[0] = 1;
  c.segments[1] = 32, c.dilations[1] = 2;
  return c;
}

static int group_setup(void **state) {
  (void)state;
  if (rda_ctx_create_emulator(&g_ctx) != RDA_OK) {
    fprintf(stderr, "test_api: rda_ctx_create_emulator: %s\n", rda_last_error(NULL));
    return -1;
  }
  const rda_attn_config c = base_config();
  if (rda_plan_create(&g_plan, g_ctx, &c, RDA_PLAN_FORWARD) != RDA_OK) {
    fprintf(stderr, "test_api: rda_plan_create: %s\n", rda_last_error(g_ctx));
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  rda_plan_destroy(g_plan);
  rda_ctx_destroy(g_ctx);
  g_plan = NULL;
  g_ctx = NULL;
  return 0;
}

/* The last error of ctx mentions `what` (the argument or key it must name). */
static void assert_error_names(const rda_ctx *ctx, const char *what) {
  const char *msg = rda_last_error(ctx);
  if (strstr(msg, what) == NULL) {
    fprintf(stderr, "expected the error to name '%s'; it is: %s\n", what, msg);
    fail();
  }
}

/* ------------------------------------------------------------------ status, version, handles */

static void test_status_values_and_names_are_pinned(void **state) {
  (void)state;
  static const char *const names[] = {"RDA_OK",
                                      "RDA_ERR_INVALID_ARGUMENT",
                                      "RDA_ERR_CONFIG",
                                      "RDA_ERR_NVRTC",
                                      "RDA_ERR_CUDA",
                                      "RDA_ERR_NCCL",
                                      "RDA_ERR_CACHE",
                                      "RDA_ERR_IO",
                                      "RDA_ERR_OUT_OF_MEMORY",
                                      "RDA_ERR_UNSUPPORTED",
                                      "RDA_ERR_INTERNAL",
                                      "RDA_ERR_EMULATOR"};
  for (int s = 0; s <= 11; ++s) assert_string_equal(rda_status_string((rda_status)s), names[s]);
  assert_int_equal(RDA_ERR_EMULATOR, 11);
  assert_non_null(rda_status_string((rda_status)999));
  assert_string_equal(rda_status_string((rda_status)-1), "RDA_ERR_UNKNOWN");
  assert_int_equal(rda_version(), RDA_VERSION_NUMBER);
  char v[32];
  snprintf(v, sizeof v, "%d.%d.%d", RDA_VERSION_MAJOR, RDA_VERSION_MINOR, RDA_VERSION_PATCH);
  assert_string_equal(v, RDA_VERSION_STRING);
}

static void test_ctx_create_rejects_null_out_and_bad_ordinal(void **state) {
  (void)state;
  assert_int_equal(rda_ctx_create_emulator(NULL), RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(NULL, "out is NULL");
  assert_int_equal(rda_ctx_create_cuda(NULL, 0), RDA_ERR_INVALID_ARGUMENT);
  rda_ctx *ctx = (rda_ctx *)(uintptr_t)1;
  assert_int_equal(rda_ctx_create_cuda(&ctx, -1), RDA_ERR_INVALID_ARGUMENT);
  assert_null(ctx);
  assert_error_names(NULL, "ordinal = -1");
  /* A new context has no error yet. */
  assert_int_equal(rda_ctx_create_emulator(&ctx), RDA_OK);
  assert_non_null(ctx);
  assert_string_equal(rda_last_error(ctx), "");
  rda_ctx_destroy(ctx);
}

static void test_ctx_create_cuda_fails_cleanly_or_works(void **state) {
  (void)state;
  rda_ctx *ctx = (rda_ctx *)(uintptr_t)1;
  const rda_status s = rda_ctx_create_cuda(&ctx, 0);
  if (s == RDA_OK) {
    assert_non_null(ctx);
    assert_string_equal(rda_last_error(ctx), "");
    rda_ctx_destroy(ctx);
    return;
  }
  assert_int_equal(s, RDA_ERR_CUDA);
  assert_null(ctx);
  assert_true(strlen(rda_last_error(NULL)) > 0);
  /* A GPU ordinal that cannot exist is refused too. */
  ctx = (rda_ctx *)(uintptr_t)1;
  assert_int_not_equal(rda_ctx_create_cuda(&ctx, 4096), RDA_OK);
  assert_null(ctx);
}

static void test_destroy_accepts_null(void **state) {
  (void)state;
  rda_ctx_destroy(NULL);
  rda_plan_destroy(NULL);
}

static void test_wrong_handles_are_rejected_by_magic(void **state) {
  (void)state;
  /* Memory that is not a handle (zeroed, so no magic): every entry point refuses it. */
  long long fake[64];
  memset(fake, 0, sizeof fake);
  rda_ctx *fctx = (rda_ctx *)(void *)fake;
  rda_plan *fplan = (rda_plan *)(void *)fake;
  const rda_attn_config c = base_config();
  rda_plan *p = (rda_plan *)(uintptr_t)1;
  assert_int_equal(rda_plan_create(&p, fctx, &c, RDA_PLAN_FORWARD), RDA_ERR_INVALID_ARGUMENT);
  assert_null(p);
  assert_error_names(NULL, "wrong magic");
  assert_int_equal(rda_plan_create(&p, NULL, &c, RDA_PLAN_FORWARD), RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(NULL, "ctx is NULL");
  size_t bytes = 1;
  assert_int_equal(rda_plan_workspace_size(fplan, 1, 1, &bytes), RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(bytes, 0);
  assert_error_names(NULL, "plan is not a live rda_plan");
  assert_int_equal(rda_forward(fplan, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(rda_forward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(NULL, "plan is NULL");
  rda_attn_config out;
  assert_int_equal(rda_plan_get_config(fplan, &out), RDA_ERR_INVALID_ARGUMENT);
  /* A context passed as a plan (and the reverse) has the wrong magic too. */
  assert_int_equal(rda_plan_workspace_size((rda_plan *)(void *)g_ctx, 1, 1, &bytes),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(rda_plan_create(&p, (rda_ctx *)(void *)g_plan, &c, RDA_PLAN_FORWARD),
                   RDA_ERR_INVALID_ARGUMENT);
  /* Destroying a foreign pointer is ignored and reported, never freed. */
  rda_plan_destroy(fplan);
  rda_ctx_destroy(fctx);
  assert_error_names(NULL, "ignored");
  assert_string_equal(rda_last_error(fctx), rda_last_error(NULL));
}

/* ------------------------------------------------------------------ configs */

typedef struct bad_config {
  const char *what; /* the field or key the message must name */
  rda_status status;
  void (*edit)(rda_attn_config *c);
} bad_config;

static void e_size(rda_attn_config *c) {
  c->struct_size -= 8;
}
static void e_version(rda_attn_config *c) {
  c->version = 990000;
}
static void e_version0(rda_attn_config *c) { /* a zeroed struct's */
  c->version = 0;
}
static void e_version_newer(rda_attn_config *c) { /* built against a later release */
  c->version = RDA_VERSION_NUMBER + 1;
}
static void e_nbranch0(rda_attn_config *c) {
  c->nbranch = 0;
}
static void e_nbranch_big(rda_attn_config *c) {
  c->nbranch = RDA_CONFIG_MAX_BRANCHES + 1;
}
static void e_dtype(rda_attn_config *c) {
  c->dtype = RDA_FP32;
}
static void e_offsets(rda_attn_config *c) {
  c->offsets = (rda_offset_rule)7;
}
static void e_causal(rda_attn_config *c) {
  c->causal = 2;
}
static void e_scale(rda_attn_config *c) {
  c->scale = NAN;
}
static void e_scale_huge(rda_attn_config *c) {
  c->scale = -1e39; /* |scale| * log2(e) overflows fp32 */
}
static void e_segment_huge(rda_attn_config *c) {
  c->segments[0] = RDA_CONFIG_MAX_SIZE + 1;
}
static void e_dilation_huge(rda_attn_config *c) {
  c->dilations[1] = LLONG_MAX;
}
static void e_heads(rda_attn_config *c) {
  c->heads = 0;
}
static void e_kv_heads(rda_attn_config *c) {
  c->kv_heads = 3;
}
static void e_head_dim(rda_attn_config *c) {
  c->head_dim = 48;
}
static void e_segment(rda_attn_config *c) {
  c->segments[1] = -4;
}
static void e_dilation(rda_attn_config *c) {
  c->dilations[0] = 0;
}
static void e_group(rda_attn_config *c) {
  c->offsets = RDA_OFFSET_GROUP;
  c->heads = 1, c->kv_heads = 1;
}

static void test_plan_create_rejects_bad_config_struct(void **state) {
  (void)state;
  static const bad_config cases[] = {
      {"struct_size", RDA_ERR_INVALID_ARGUMENT, e_size},
      {"version", RDA_ERR_INVALID_ARGUMENT, e_version},
      {"version = 0", RDA_ERR_INVALID_ARGUMENT, e_version0},
      {"version", RDA_ERR_INVALID_ARGUMENT, e_version_newer},
      {"nbranch", RDA_ERR_CONFIG, e_nbranch0},
      {"nbranch", RDA_ERR_CONFIG, e_nbranch_big},
      {"dtype", RDA_ERR_CONFIG, e_dtype},
      {"offsets", RDA_ERR_CONFIG, e_offsets},
      {"causal", RDA_ERR_CONFIG, e_causal},
      {"scale", RDA_ERR_CONFIG, e_scale},
      {"cfg->scale = -1e+39: must be a finite number with |scale| <= 2.3586574e+38", RDA_ERR_CONFIG,
       e_scale_huge},
      {"cfg->segments[0] = 1099511627777: must be an integer from 1 to 2^40", RDA_ERR_CONFIG,
       e_segment_huge},
      {"cfg->dilations[1] = 9223372036854775807: must be an integer from 1 to 2^40", RDA_ERR_CONFIG,
       e_dilation_huge},
      {"heads", RDA_ERR_CONFIG, e_heads},
      {"kv_heads", RDA_ERR_CONFIG, e_kv_heads},
      {"head_dim", RDA_ERR_CONFIG, e_head_dim},
      {"segments", RDA_ERR_CONFIG, e_segment},
      {"dilations", RDA_ERR_CONFIG, e_dilation},
      {"group", RDA_ERR_CONFIG, e_group},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    rda_attn_config c = base_config();
    cases[i].edit(&c);
    rda_plan *p = (rda_plan *)(uintptr_t)1;
    const rda_status s = rda_plan_create(&p, g_ctx, &c, RDA_PLAN_FORWARD);
    if (s != cases[i].status)
      fprintf(stderr, "case '%s': %s\n", cases[i].what, rda_last_error(g_ctx));
    assert_int_equal(s, cases[i].status);
    assert_null(p);
    assert_error_names(g_ctx, cases[i].what);
  }
  rda_plan *p = (rda_plan *)(uintptr_t)1;
  assert_int_equal(rda_plan_create(&p, g_ctx, NULL, RDA_PLAN_FORWARD), RDA_ERR_INVALID_ARGUMENT);
  assert_null(p);
  assert_error_names(g_ctx, "cfg is NULL");
  assert_error_names(NULL, "cfg is NULL"); /* every failure is the thread's too */
  const rda_attn_config c = base_config();
  assert_int_equal(rda_plan_create(NULL, g_ctx, &c, RDA_PLAN_FORWARD), RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "out is NULL");
}

static void test_plan_create_rejects_bad_lua_config(void **state) {
  (void)state;
  static const struct {
    const char *chunk, *what;
  } cases[] = {
      {"return { heads = 4, head_dim = 32, dtype = 'bf16', segments = {8}, dilations = {1}",
       "'}' expected"},
      {"return { heads = 4, head_dim = 32, dtype = 'bf16', segments = {8}, dilations = {1}, "
       "colour = 1 }",
       "colour"},
      {"return { heads = 4, head_dim = 32, dtype = 'bf16', segments = {8, 16}, dilations = {1} }",
       "dilations"},
      {"return { heads = 4, head_dim = 32, dtype = \"fp8\", segments = {8}, dilations = {1} }",
       "dtype"},
      {"local f = io.open('/etc/passwd') return {}", "io"},
      {"while true do end", "instruction limit"},
      {"return 42", "table"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    rda_plan *p = (rda_plan *)(uintptr_t)1;
    const rda_status s = rda_plan_create_from_string(&p, g_ctx, cases[i].chunk, RDA_PLAN_FORWARD);
    if (s != RDA_ERR_CONFIG) fprintf(stderr, "chunk %zu: %s\n", i, rda_last_error(g_ctx));
    assert_int_equal(s, RDA_ERR_CONFIG);
    assert_null(p);
    assert_error_names(g_ctx, cases[i].what);
  }
  /* The message names the chunk as "config", as a file's would name the file. */
  rda_plan *p = (rda_plan *)(uintptr_t)1;
  assert_int_equal(rda_plan_create_from_string(
                       &p, g_ctx,
                       "return { heads = 0, head_dim = 32, dtype = 'bf16', segments = {8}, "
                       "dilations = {1} }",
                       RDA_PLAN_FORWARD),
                   RDA_ERR_CONFIG);
  if (strncmp(rda_last_error(g_ctx), "config: ", 8) != 0)
    fprintf(stderr, "message: %s\n", rda_last_error(g_ctx));
  assert_int_equal(strncmp(rda_last_error(g_ctx), "config: ", 8), 0);
  p = (rda_plan *)(uintptr_t)1;
  assert_int_equal(rda_plan_create_from_string(&p, g_ctx, NULL, RDA_PLAN_FORWARD),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_null(p);
  assert_error_names(g_ctx, "chunk is NULL");
  p = (rda_plan *)(uintptr_t)1;
  assert_int_equal(
      rda_plan_create_from_file(&p, g_ctx, "/nonexistent/rda/config.lua", RDA_PLAN_FORWARD),
      RDA_ERR_IO);
  assert_null(p);
  assert_error_names(g_ctx, "/nonexistent/rda/config.lua");
  assert_int_equal(rda_plan_create_from_file(&p, g_ctx, NULL, RDA_PLAN_FORWARD),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "path is NULL");
}

static void test_plan_get_config_resolves_defaults(void **state) {
  (void)state;
  rda_attn_config c = base_config();
  c.kv_heads = 0; /* defaults to heads */
  c.scale = 0;    /* defaults to 1/sqrt(D) */
  rda_plan *p = NULL;
  assert_int_equal(rda_plan_create(&p, g_ctx, &c, RDA_PLAN_FORWARD), RDA_OK);
  rda_attn_config got;
  memset(&got, 0xab, sizeof got);
  assert_int_equal(rda_plan_get_config(p, &got), RDA_OK);
  assert_int_equal(got.struct_size, sizeof got);
  assert_int_equal(got.heads, kH);
  assert_int_equal(got.kv_heads, kH);
  assert_int_equal(got.head_dim, kD);
  assert_int_equal(got.dtype, RDA_BF16);
  assert_int_equal(got.nbranch, 2);
  assert_int_equal(got.segments[1], 32);
  assert_int_equal(got.dilations[1], 2);
  assert_int_equal(got.causal, 1);
  assert_int_equal(got.offsets, RDA_OFFSET_MOD);
  assert_true(fabs(got.scale - 1.0 / sqrt((double)kD)) < 1e-15);
  assert_int_equal(rda_plan_get_config(p, NULL), RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "out is NULL");
  rda_plan_destroy(p);
}

/* ------------------------------------------------------------------ forward: argument checks */

/* Valid tensors for g_plan over caller-owned buffers (never run: every call below fails). */
typedef struct args {
  uint16_t *q, *k, *v, *o;
  float *lse, *of;
  void *ws;
  size_t ws_bytes;
  rda_tensor tq, tk, tv, to, tl;
} args;

static void args_make(args *a) {
  memset(a, 0, sizeof *a);
  const long long qs[4] = {kB, kN, kH, kD}, kvs[4] = {kB, kN, kHkv, kD}, ls[3] = {kB, kH, kN};
  a->q = aalloc(sizeof(uint16_t) * kB * kN * kH * kD);
  a->o = aalloc(sizeof(uint16_t) * kB * kN * kH * kD);
  a->k = aalloc(sizeof(uint16_t) * kB * kN * kHkv * kD);
  a->v = aalloc(sizeof(uint16_t) * kB * kN * kHkv * kD);
  a->lse = aalloc(sizeof(float) * kB * kH * kN);
  assert_int_equal(rda_plan_workspace_size(g_plan, kB, kN, &a->ws_bytes), RDA_OK);
  a->ws = aalloc(a->ws_bytes);
  assert_non_null(a->ws);
  assert_int_equal(rda_tensor_contiguous(&a->tq, a->q, RDA_BF16, 4, qs), RDA_OK);
  assert_int_equal(rda_tensor_contiguous(&a->tk, a->k, RDA_BF16, 4, kvs), RDA_OK);
  assert_int_equal(rda_tensor_contiguous(&a->tv, a->v, RDA_BF16, 4, kvs), RDA_OK);
  assert_int_equal(rda_tensor_contiguous(&a->to, a->o, RDA_BF16, 4, qs), RDA_OK);
  assert_int_equal(rda_tensor_contiguous(&a->tl, a->lse, RDA_FP32, 3, ls), RDA_OK);
}

static void args_free(args *a) {
  free(a->q), free(a->k), free(a->v), free(a->o), free(a->lse), free(a->ws);
}

static rda_status call(const args *a) {
  return rda_forward(g_plan, &a->tq, &a->tk, &a->tv, &a->to, &a->tl, a->ws, a->ws_bytes, NULL);
}

static void expect_bad(const args *a, const char *what) {
  const rda_status s = call(a);
  if (s != RDA_ERR_INVALID_ARGUMENT)
    fprintf(stderr, "expected RDA_ERR_INVALID_ARGUMENT naming '%s', got %s (%s)\n", what,
            rda_status_string(s), rda_last_error(g_ctx));
  assert_int_equal(s, RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, what);
}

static void test_forward_rejects_null_tensors(void **state) {
  (void)state;
  args a;
  args_make(&a);
  assert_int_equal(rda_forward(g_plan, NULL, &a.tk, &a.tv, &a.to, &a.tl, a.ws, a.ws_bytes, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "q is NULL");
  assert_int_equal(rda_forward(g_plan, &a.tq, NULL, &a.tv, &a.to, &a.tl, a.ws, a.ws_bytes, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "k is NULL");
  assert_int_equal(rda_forward(g_plan, &a.tq, &a.tk, NULL, &a.to, &a.tl, a.ws, a.ws_bytes, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "v is NULL");
  assert_int_equal(rda_forward(g_plan, &a.tq, &a.tk, &a.tv, NULL, &a.tl, a.ws, a.ws_bytes, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "o is NULL");
  args b = a;
  b.tv.data = NULL;
  expect_bad(&b, "v->data is NULL");
  b = a;
  b.tl.data = NULL;
  expect_bad(&b, "lse->data is NULL");
  args_free(&a);
}

static void test_forward_rejects_mismatched_dtypes_and_shapes(void **state) {
  (void)state;
  args a;
  args_make(&a);
  args b = a;
  b.tq.dtype = RDA_FP16;
  expect_bad(&b, "q->dtype = RDA_FP16");
  b = a;
  b.tk.dtype = RDA_FP32;
  expect_bad(&b, "k->dtype");
  b = a;
  b.to.dtype = RDA_FP16;
  expect_bad(&b, "o->dtype");
  b = a;
  b.tl.dtype = RDA_BF16;
  expect_bad(&b, "lse->dtype");
  b = a;
  b.tk.shape[2] = kH; /* K with H heads instead of Hkv */
  expect_bad(&b, "k->shape[2]");
  b = a;
  b.tv.shape[1] = kN - 1;
  expect_bad(&b, "v->shape[1]");
  assert_error_names(g_ctx, "cross-attention"); /* keys and queries of other lengths */
  b = a;
  b.to.shape[1] = kN - 1; /* an output of the wrong length is no cross-attention */
  expect_bad(&b, "o->shape[1]");
  assert_null(strstr(rda_last_error(g_ctx), "cross"));
  b = a;
  b.to.shape[3] = 64;
  expect_bad(&b, "o->shape[3]");
  b = a;
  b.tl.shape[1] = kN, b.tl.shape[2] = kH; /* [B, N, H] instead of [B, H, N] */
  expect_bad(&b, "lse->shape[1]");
  b = a;
  b.tq.shape[3] = 64; /* q decides B and N only; D must be the plan's */
  expect_bad(&b, "q->shape[3]");
  b = a;
  b.tq.ndim = 3;
  expect_bad(&b, "q->ndim");
  b = a;
  b.tk.ndim = 5;
  expect_bad(&b, "k->ndim");
  b = a;
  b.tq.shape[1] = 0;
  expect_bad(&b, "q->shape");
  b = a;
  b.tq.shape[0] = 70000; /* any batch is allowed, but k's must be the same */
  expect_bad(&b, "k->shape[0] = 2");
  args_free(&a);
}

static void test_forward_rejects_bad_strides_and_alignment(void **state) {
  (void)state;
  args a;
  args_make(&a);
  args b = a;
  b.tq.stride[3] = 2;
  expect_bad(&b, "q->stride[3] = 2");
  b = a;
  b.tl.stride[2] = 2;
  expect_bad(&b, "lse->stride[2]");
  b = a;
  b.tk.data = (char *)a.k + 2; /* 2-byte aligned: rows are read 16 bytes at a time */
  expect_bad(&b, "k->data");
  b = a;
  b.tq.stride[1] += 4; /* a row step of 4 bf16 = 8 bytes */
  expect_bad(&b, "q->stride[1]");
  b = a;
  b.tv.stride[0] = -b.tv.stride[0];
  expect_bad(&b, "v->stride[0]");
  b = a;
  b.to.stride[2] = 0; /* every head writes the same row */
  expect_bad(&b, "o->stride[2]");
  b = a;
  b.tl.stride[1] = kN / 2; /* head rows overlap */
  expect_bad(&b, "lse->stride[1]");
  b = a;
  b.tl.data = (char *)a.lse + 2;
  expect_bad(&b, "lse->data");
  b = a;
  b.tq.stride[0] = 0x7ffffffffffffff8LL; /* offsets overflow */
  expect_bad(&b, "q->stride = [");
  b = a;
  b.tl.stride[0] = 1LL << 62; /* fits 64 bits in elements, not in bytes (fp32): it would wrap */
  expect_bad(&b, "past the end of the address space");
  /* Inputs may broadcast (stride 0): K and V shared across the batch is valid. */
  b = a;
  b.tk.stride[0] = 0;
  b.tv.stride[0] = 0;
  b.tk.shape[0] = kB;
  assert_int_equal(call(&b), RDA_OK);
  args_free(&a);
}

static void test_forward_rejects_missing_or_small_workspace(void **state) {
  (void)state;
  args a;
  args_make(&a);
  args b = a;
  b.ws = NULL;
  expect_bad(&b, "workspace is NULL");
  b = a;
  b.ws_bytes = a.ws_bytes / 2;
  expect_bad(&b, "workspace_bytes");
  b = a;
  b.ws = (char *)a.ws + 8;
  b.ws_bytes = a.ws_bytes - 8;
  expect_bad(&b, "workspace =");
  b = a;
  b.ws = a.q; /* the workspace over an input */
  b.ws_bytes = a.ws_bytes;
  expect_bad(&b, "workspace overlaps q");
  b = a;
  b.to.data = a.q; /* an output over an input */
  expect_bad(&b, "o and q share memory");
  /* Partial overlaps too: o starting inside q, lse inside o's second half. */
  b = a;
  b.to.data = (char *)a.q + 64;
  expect_bad(&b, "o and q share memory");
  b = a;
  b.tl.data = (char *)a.to.data + 64;
  expect_bad(&b, "lse and o share memory");
  size_t bytes = 0;
  assert_int_equal(rda_plan_workspace_size(g_plan, 0, kN, &bytes), RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "batch = 0");
  assert_int_equal(rda_plan_workspace_size(g_plan, kB, kN, NULL), RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(rda_plan_workspace_size(g_plan, 1LL << 40, 1LL << 40, &bytes),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "overflows");
  /* fp32 O and a given LSE need no workspace at all. */
  float *of = aalloc(sizeof(float) * kB * kN * kH * kD);
  const long long qs[4] = {kB, kN, kH, kD};
  b = a;
  assert_int_equal(rda_tensor_contiguous(&b.to, of, RDA_FP32, 4, qs), RDA_OK);
  b.ws = NULL;
  b.ws_bytes = 0;
  assert_int_equal(call(&b), RDA_OK);
  /* fp32 O without lse: the LSE's part alone, as rda.h says (256-byte rounded). */
  const size_t lse_part = (sizeof(float) * kB * kH * kN + 255) / 256 * 256;
  b.ws = a.ws;
  b.ws_bytes = lse_part;
  rda_status s = rda_forward(g_plan, &b.tq, &b.tk, &b.tv, &b.to, NULL, b.ws, b.ws_bytes, NULL);
  if (s != RDA_OK) fprintf(stderr, "fp32 O, no lse: %s\n", rda_last_error(g_ctx));
  assert_int_equal(s, RDA_OK);
  b.ws_bytes = lse_part - 1;
  s = rda_forward(g_plan, &b.tq, &b.tk, &b.tv, &b.to, NULL, b.ws, b.ws_bytes, NULL);
  assert_int_equal(s, RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "workspace_bytes");
  free(of);
  args_free(&a);
}

/* rda_api_tensors_meet against the byte sets themselves. Random pairs: "apart" must be true
 * (it may say "meet" where strides do not nest, never the other way). Views of one fused
 * buffer, the layouts frameworks use: exact both ways, also at random offsets. */
static void meet_bytes(const rda_tensor *t, uintptr_t base, unsigned char *set, size_t cap) {
  const size_t es = t->dtype == RDA_FP32 ? 4 : 2;
  long long idx[4] = {0, 0, 0, 0};
  for (;;) {
    long long off = 0;
    for (int i = 0; i < t->ndim; ++i) off += idx[i] * t->stride[i];
    const size_t at = (size_t)((uintptr_t)t->data - base) + (size_t)off * es;
    for (size_t e = 0; e < es; ++e) {
      assert_true(at + e < cap);
      set[at + e] = 1;
    }
    int d = t->ndim - 1;
    while (d >= 0 && ++idx[d] == t->shape[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

static int meet_brute(const rda_tensor *a, const rda_tensor *b, uintptr_t base) {
  enum { kCap = 1 << 16 };
  static unsigned char sa[kCap], sb[kCap];
  memset(sa, 0, sizeof sa), memset(sb, 0, sizeof sb);
  meet_bytes(a, base, sa, kCap), meet_bytes(b, base, sb, kCap);
  for (size_t i = 0; i < kCap; ++i)
    if (sa[i] && sb[i]) return 1;
  return 0;
}

static void test_tensor_overlap_is_exact_for_views_of_one_buffer(void **state) {
  (void)state;
  const uintptr_t base = (uintptr_t)1 << 20; /* never dereferenced */
  rt_rng *rng = rt_global_rng();
  int apart_random = 0, apart_views = 0, met_views = 0;
  for (int it = 0; it < 4000; ++it) {
    rda_tensor t[2];
    for (int k = 0; k < 2; ++k) {
      memset(&t[k], 0, sizeof t[k]);
      t[k].ndim = 3 + (int)(rt_rng_next(rng) % 2);
      t[k].dtype = rt_rng_next(rng) % 2 ? RDA_FP32 : RDA_BF16;
      for (int i = 0; i < t[k].ndim; ++i) {
        t[k].shape[i] = 1 + (long long)(rt_rng_next(rng) % 3);
        t[k].stride[i] = (long long)(rt_rng_next(rng) % 40);
      }
      t[k].stride[t[k].ndim - 1] = 1;
      t[k].data = (void *)(base + (rt_rng_next(rng) % 256) * 2);
    }
    const int meet = rda_api_tensors_meet(&t[0], &t[1]), truth = meet_brute(&t[0], &t[1], base);
    if (!meet && truth) fail_msg("random pair %d: said apart, but they share a byte", it);
    apart_random += !truth;
  }
  for (int it = 0; it < 4000; ++it) {
    /* A fused [B, N, F, h, D] buffer; two views [B, N, h, D] at slots, or one at a random
     * element offset; fp32 or bf16 alike. */
    const long long B = 1 + (long long)(rt_rng_next(rng) % 2), N = 1 + (long long)(rt_rng_next(rng) % 4);
    const long long F = 1 + (long long)(rt_rng_next(rng) % 4), h = 1 + (long long)(rt_rng_next(rng) % 3);
    const long long D = 1 + (long long)(rt_rng_next(rng) % 4);
    const rda_dtype dt = rt_rng_next(rng) % 2 ? RDA_FP32 : RDA_BF16;
    const size_t es = dt == RDA_FP32 ? 4 : 2;
    rda_tensor t[2];
    for (int k = 0; k < 2; ++k) {
      memset(&t[k], 0, sizeof t[k]);
      t[k].ndim = 4, t[k].dtype = dt;
      const long long shape[4] = {B, N, h, D}, stride[4] = {N * F * h * D, F * h * D, D, 1};
      memcpy(t[k].shape, shape, sizeof shape), memcpy(t[k].stride, stride, sizeof stride);
      const long long at = rt_rng_next(rng) % 3 == 0 ? (long long)(rt_rng_next(rng) % (2 * F * h * D))
                                                  : (long long)(rt_rng_next(rng) % F) * h * D;
      t[k].data = (void *)(base + (size_t)at * es);
    }
    const int meet = rda_api_tensors_meet(&t[0], &t[1]), truth = meet_brute(&t[0], &t[1], base);
    if (meet != truth)
      fail_msg("views %d (B %lld N %lld F %lld h %lld D %lld): said %s", it, B, N, F, h, D,
               meet ? "meet" : "apart");
    apart_views += !truth, met_views += truth;
  }
  print_message("apart: %d random pairs; views: %d apart, %d meeting\n", apart_random,
                apart_views, met_views);
  assert_true(apart_views > 100 && met_views > 100);
}

static void test_tensor_contiguous_checks_its_arguments(void **state) {
  (void)state;
  rda_tensor t;
  const long long shape[4] = {2, 3, 4, 8}, bad[4] = {2, -1, 4, 8}, empty[4] = {2, 0, 4, 8};
  assert_int_equal(rda_tensor_contiguous(NULL, NULL, RDA_BF16, 4, shape), RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(rda_tensor_contiguous(&t, NULL, RDA_BF16, 2, shape), RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(NULL, "ndim = 2");
  assert_int_equal(rda_tensor_contiguous(&t, NULL, RDA_BF16, 4, bad), RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(NULL, "shape[1] = -1");
  /* An empty tensor (a ring rank without rows): no elements, so no data is needed. */
  assert_int_equal(rda_tensor_contiguous(&t, NULL, RDA_BF16, 4, empty), RDA_OK);
  assert_int_equal(t.shape[1], 0);
  assert_int_equal(rda_tensor_contiguous(&t, NULL, RDA_BF16, 4, NULL), RDA_ERR_INVALID_ARGUMENT);
  /* An unknown dtype, and a shape whose element count overflows: refused, t left zeroed. */
  assert_int_equal(rda_tensor_contiguous(&t, NULL, (rda_dtype)9, 4, shape),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(NULL, "dtype = 9");
  const long long huge[4] = {1LL << 62, 4, 1, 1};
  int dummy = 0;
  assert_int_equal(rda_tensor_contiguous(&t, &dummy, RDA_FP32, 4, huge), RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(NULL, "overflows");
  assert_null(t.data);
  assert_int_equal(t.ndim, 0);
  /* rda_last_error(NULL) is a copy: a later failure on the thread does not change it. */
  const char *kept = rda_last_error(NULL);
  char before[512];
  snprintf(before, sizeof before, "%s", kept);
  assert_int_equal(rda_tensor_contiguous(&t, NULL, RDA_BF16, 2, shape), RDA_ERR_INVALID_ARGUMENT);
  assert_string_equal(kept, before);
  assert_int_equal(rda_tensor_contiguous(&t, NULL, RDA_BF16, 4, shape), RDA_OK);
  assert_int_equal(t.stride[0], 96);
  assert_int_equal(t.stride[1], 32);
  assert_int_equal(t.stride[2], 8);
  assert_int_equal(t.stride[3], 1);
}

/* ------------------------------------------------------------------ forward: results */

/* Run plan on random inputs laid out as given (fused: q, k, v slices of one [B, N, H+2Hkv, D]
 * buffer) into o of o_dtype, lse given or not, and compare with the reference (SPEC §5). When
 * o_bits_out is not NULL, also hands back O's storage bits (contiguous) for a bitwise check. */
static void run_and_check(const char *what, rda_plan *plan, long long batch, long long n, int fused,
                          rda_dtype o_dtype, int with_lse, float **o32_out) {
  rda_attn_config pc;
  assert_int_equal(rda_plan_get_config(plan, &pc), RDA_OK);
  const int H = pc.heads, Hkv = pc.kv_heads, D = pc.head_dim, dt = (int)pc.dtype;
  rda_config c;
  rt_config_make(&c, H, Hkv, D, dt, pc.causal, (int)pc.offsets, pc.nbranch, pc.segments,
                 pc.dilations);
  c.scale = pc.scale;
  double *q = rt_normal((size_t)(batch * n * H * D), dt);
  double *k = rt_normal((size_t)(batch * n * Hkv * D), dt);
  double *v = rt_normal((size_t)(batch * n * Hkv * D), dt);

  long long qs[3], ks[3];
  uint16_t *qb, *kb, *vb, *fusedb = NULL;
  const void *qp, *kp, *vp;
  if (fused) {
    const long long row = (long long)(H + 2 * Hkv) * D;
    qs[0] = ks[0] = n * row, qs[1] = ks[1] = row, qs[2] = ks[2] = D;
    const size_t total = (size_t)(batch * n * row);
    fusedb = rt_alloc_bits(total, dt);
    rt_pack_bits(fusedb, q, batch, n, H, D, qs, dt);
    rt_pack_bits(fusedb + (size_t)H * D, k, batch, n, Hkv, D, ks, dt);
    rt_pack_bits(fusedb + (size_t)(H + Hkv) * D, v, batch, n, Hkv, D, ks, dt);
    qp = fusedb, kp = fusedb + (size_t)H * D, vp = fusedb + (size_t)(H + Hkv) * D;
    qb = kb = vb = NULL;
  } else {
    rt_strides_contig(n, H, D, qs);
    rt_strides_contig(n, Hkv, D, ks);
    qb = rt_make_bits(q, batch, n, H, D, qs, dt, NULL);
    kb = rt_make_bits(k, batch, n, Hkv, D, ks, dt, NULL);
    vb = rt_make_bits(v, batch, n, Hkv, D, ks, dt, NULL);
    qp = qb, kp = kb, vp = vb;
  }
  rda_tensor tq = {(void *)(uintptr_t)qp, pc.dtype, 4, {batch, n, H, D}, {qs[0], qs[1], qs[2], 1}};
  rda_tensor tk = {
      (void *)(uintptr_t)kp, pc.dtype, 4, {batch, n, Hkv, D}, {ks[0], ks[1], ks[2], 1}};
  rda_tensor tv = {
      (void *)(uintptr_t)vp, pc.dtype, 4, {batch, n, Hkv, D}, {ks[0], ks[1], ks[2], 1}};

  const size_t on = (size_t)(batch * n * H * D), ln = (size_t)(batch * H * n);
  const long long oshape[4] = {batch, n, H, D}, lshape[3] = {batch, H, n};
  void *obuf = aalloc(on * 4);
  float *lse = aalloc(ln * 4);
  assert_non_null(obuf);
  assert_non_null(lse);
  rt_poison_f32(obuf, on); /* NaN bits in either dtype */
  rt_poison_f32(lse, ln);
  rda_tensor to, tl;
  assert_int_equal(rda_tensor_contiguous(&to, obuf, o_dtype, 4, oshape), RDA_OK);
  assert_int_equal(rda_tensor_contiguous(&tl, lse, RDA_FP32, 3, lshape), RDA_OK);
  size_t ws_bytes = 0;
  assert_int_equal(rda_plan_workspace_size(plan, batch, n, &ws_bytes), RDA_OK);
  float *ws = aalloc(ws_bytes);
  assert_non_null(ws);
  rt_poison_f32(ws, ws_bytes / 4);
  const rda_status s =
      rda_forward(plan, &tq, &tk, &tv, &to, with_lse ? &tl : NULL, ws, ws_bytes, NULL);
  if (s != RDA_OK) fprintf(stderr, "%s: rda_forward: %s\n", what, rda_last_error(g_ctx));
  assert_int_equal(s, RDA_OK);

  float *o32 = malloc(on * 4);
  assert_non_null(o32);
  if (o_dtype == RDA_FP32) {
    memcpy(o32, obuf, on * 4);
  } else {
    const uint16_t *bits = obuf;
    for (size_t i = 0; i < on; ++i) o32[i] = (float)rda_from_dtype_bits(bits[i], dt);
  }
  if (!with_lse) { /* the LSE went to the workspace: after the O accumulator, if there is one */
    const size_t o_part = o_dtype == RDA_FP32 ? 0 : (on * 4 + 255) / 256 * 256;
    memcpy(lse, (char *)ws + o_part, ln * 4);
  }
  double *o_ref, *lse_ref;
  rt_reference(&c, batch, n, q, k, v, &o_ref, &lse_ref);
  long long os[3], ls[2] = {(long long)H * n, n};
  rt_strides_contig(n, H, D, os);
  rt_report rep;
  const bool fwd_ok = rt_check_fwd(what, &c, batch, n, o32, os, lse, ls, o_ref, lse_ref, &rep);
  fprintf(stderr, "  %-48s O rel L2 %.2e  LSE max err %.2e\n", what, rep.o_rel_l2, rep.lse_max_abs);
  assert_true(fwd_ok);

  if (o32_out != NULL)
    *o32_out = o32;
  else
    free(o32);
  free(o_ref), free(lse_ref), free(q), free(k), free(v), free(qb), free(kb), free(vb);
  free(fusedb), free(obuf), free(lse), free(ws);
}

static void test_forward_matches_reference_bf16_causal_gqa_storage_output(void **state) {
  (void)state;
  run_and_check("bf16 causal gqa, bf16 O", g_plan, kB, kN, 0, RDA_BF16, 1, NULL);
}

static void test_forward_matches_reference_fp16_block_fused_qkv_fp32_output(void **state) {
  (void)state;
  rda_plan *p = NULL;
  const char *chunk =
      "return { heads = 2, kv_heads = 1, head_dim = 64, dtype = 'fp16', offsets = 'block',\n"
      "         segments = {8, 24}, dilations = {2, 3}, causal = false, scale = 0.2 }";
  assert_int_equal(rda_plan_create_from_string(&p, g_ctx, chunk, RDA_PLAN_FORWARD), RDA_OK);
  run_and_check("fp16 block fused-qkv, fp32 O, lse in workspace", p, 1, 50, 1, RDA_FP32, 0, NULL);
  run_and_check("fp16 block fused-qkv, fp16 O", p, 2, 33, 1, RDA_FP16, 1, NULL);
  rda_plan_destroy(p);
}

/* A negative scale (SPEC §1 puts no sign on τ), through the struct and through a chunk: the
 * kernels fold it into the scores; O and LSE must match the float64 reference. The config keeps
 * the scale as given, and the largest magnitude allowed plans too. */
static void test_forward_matches_reference_with_negative_scale(void **state) {
  (void)state;
  rda_attn_config c = base_config();
  c.scale = -0.6;
  rda_plan *p = NULL;
  if (rda_plan_create(&p, g_ctx, &c, RDA_PLAN_FORWARD) != RDA_OK)
    fail_msg("rda_plan_create: %s", rda_last_error(g_ctx));
  rda_attn_config got;
  assert_int_equal(rda_plan_get_config(p, &got), RDA_OK);
  assert_true(got.scale == -0.6);
  run_and_check("bf16 causal gqa, scale -0.6", p, kB, kN, 0, RDA_FP32, 1, NULL);
  rda_plan_destroy(p);
  const char *chunk =
      "return { heads = 2, kv_heads = 1, head_dim = 64, dtype = 'fp16', offsets = 'block',\n"
      "         segments = {8, 24}, dilations = {2, 3}, causal = false, scale = -0.2 }";
  assert_int_equal(rda_plan_create_from_string(&p, g_ctx, chunk, RDA_PLAN_FORWARD), RDA_OK);
  run_and_check("fp16 block, scale -0.2", p, 2, 33, 0, RDA_FP16, 1, NULL);
  rda_plan_destroy(p);
  c.scale = -2.35e38; /* the fp32 constant scale * log2(e) is still finite */
  assert_int_equal(rda_plan_create(&p, g_ctx, &c, RDA_PLAN_FORWARD), RDA_OK);
  rda_plan_destroy(p);
}

/* Same inputs, O as fp32 and as the storage dtype: the storage O is the fp32 O rounded to
 * nearest even, bit for bit (the cast kernel), so the two paths cannot drift apart. */
static void test_forward_storage_output_is_fp32_output_rounded(void **state) {
  (void)state;
  rt_seed(1234);
  float *o32 = NULL, *o16 = NULL;
  run_and_check("fp32 O", g_plan, 1, 24, 0, RDA_FP32, 1, &o32);
  rt_seed(1234);
  run_and_check("bf16 O", g_plan, 1, 24, 0, RDA_BF16, 1, &o16);
  for (size_t i = 0; i < (size_t)(24 * kH * kD); ++i) {
    const double want = rda_round_to_dtype(o32[i], RDA_BF16);
    if ((double)o16[i] != want) {
      fprintf(stderr, "element %zu: bf16 O %g, fp32 O rounded %g\n", i, (double)o16[i], want);
      fail();
    }
  }
  free(o32);
  free(o16);
}

static void test_plan_from_file_string_and_struct_agree(void **state) {
  (void)state;
  const char *chunk =
      "return { heads = 4, kv_heads = 2, head_dim = 32, dtype = 'bf16', causal = true,\n"
      "         segments = {16, 32}, dilations = {1, 2} }";
  char *dir = rt_mkdtemp();
  assert_non_null(dir);
  char *path = rt_path(dir, "cfg.lua");
  assert_true(rt_write_file(path, chunk, strlen(chunk)));
  rda_plan *ps = NULL, *pf = NULL;
  assert_int_equal(rda_plan_create_from_string(&ps, g_ctx, chunk, RDA_PLAN_FORWARD), RDA_OK);
  assert_int_equal(rda_plan_create_from_file(&pf, g_ctx, path, RDA_PLAN_FORWARD), RDA_OK);
  rda_attn_config a, b, c;
  assert_int_equal(rda_plan_get_config(g_plan, &a), RDA_OK);
  assert_int_equal(rda_plan_get_config(ps, &b), RDA_OK);
  assert_int_equal(rda_plan_get_config(pf, &c), RDA_OK);
  assert_memory_equal(&a, &b, sizeof a);
  assert_memory_equal(&a, &c, sizeof a);
  rt_seed(77);
  float *o1 = NULL, *o2 = NULL;
  run_and_check("struct plan", g_plan, 1, 20, 0, RDA_FP32, 1, &o1);
  rt_seed(77);
  run_and_check("file plan", pf, 1, 20, 0, RDA_FP32, 1, &o2);
  assert_memory_equal(o1, o2, sizeof(float) * 20 * kH * kD);
  free(o1), free(o2);
  rda_plan_destroy(ps);
  rda_plan_destroy(pf);
  rt_rmtree(dir);
  free(dir), free(path);
}

/* ------------------------------------------------------------------ forward on a GPU */

/* A driver entry point by name (libcuda is loaded by the library too; this test needs a stream
 * and a context-wide synchronize that the public API leaves to the caller). */
static void *cu_sym(void *lib, const char *name) {
  return lib != NULL ? dlsym(lib, name) : NULL;
}

/* On a GPU: rda_forward on a caller's stream (and on the default stream) matches the reference;
 * skipped where no GPU is usable. Buffers go through the internal cuda backend. */
static void test_forward_on_cuda_streams_matches_reference(void **state) {
  (void)state;
  rda_ctx *cctx = NULL;
  if (rda_ctx_create_cuda(&cctx, 0) != RDA_OK) {
    fprintf(stderr, "test_api: no usable GPU (%s); the cuda forward test is skipped\n",
            rda_last_error(NULL));
    skip();
  }
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  int (*ctx_sync)(void) = NULL;
  int (*stream_create)(void **, unsigned) = NULL;
  int (*stream_destroy)(void *) = NULL;
  void *sym = cu_sym(lib, "cuCtxSynchronize");
  memcpy(&ctx_sync, &sym, sizeof sym);
  sym = cu_sym(lib, "cuStreamCreate");
  memcpy(&stream_create, &sym, sizeof sym);
  sym = cu_sym(lib, "cuStreamDestroy_v2");
  memcpy(&stream_destroy, &sym, sizeof sym);
  assert_non_null(ctx_sync);
  assert_non_null(stream_create);
  assert_non_null(stream_destroy);
  rda_backend *b = NULL;
  rda_err err = {0};
  assert_int_equal(rda_backend_cuda_open(&b, 0, &err), RDA_OK);
  const rda_attn_config cfg = base_config();
  rda_plan *p = NULL;
  assert_int_equal(rda_plan_create(&p, cctx, &cfg, RDA_PLAN_FORWARD), RDA_OK);
  rda_config c;
  rt_config_make(&c, kH, kHkv, kD, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, 2, cfg.segments,
                 cfg.dilations);
  const long long B = kB, N = 300;
  const size_t nq = (size_t)(B * N * kH * kD), nk = (size_t)(B * N * kHkv * kD);
  const size_t nl = (size_t)(B * kH * N);
  double *q = rt_normal(nq, RDA_DTYPE_BF16), *k = rt_normal(nk, RDA_DTYPE_BF16);
  double *v = rt_normal(nk, RDA_DTYPE_BF16);
  long long qs[3], ks[3], ls[2] = {kH * N, N};
  rt_strides_contig(N, kH, kD, qs);
  rt_strides_contig(N, kHkv, kD, ks);
  uint16_t *qb = rt_make_bits(q, B, N, kH, kD, qs, RDA_DTYPE_BF16, NULL);
  uint16_t *kb = rt_make_bits(k, B, N, kHkv, kD, ks, RDA_DTYPE_BF16, NULL);
  uint16_t *vb = rt_make_bits(v, B, N, kHkv, kD, ks, RDA_DTYPE_BF16, NULL);
  size_t ws_bytes = 0;
  assert_int_equal(rda_plan_workspace_size(p, B, N, &ws_bytes), RDA_OK);
  void *dq_ = NULL, *dk_ = NULL, *dv_ = NULL, *do_ = NULL, *dl_ = NULL, *dws = NULL;
  assert_int_equal(b->alloc(b, nq * 2, &dq_, &err), RDA_OK);
  assert_int_equal(b->alloc(b, nk * 2, &dk_, &err), RDA_OK);
  assert_int_equal(b->alloc(b, nk * 2, &dv_, &err), RDA_OK);
  assert_int_equal(b->alloc(b, nq * 2, &do_, &err), RDA_OK);
  assert_int_equal(b->alloc(b, nl * 4, &dl_, &err), RDA_OK);
  assert_int_equal(b->alloc(b, ws_bytes, &dws, &err), RDA_OK);
  assert_int_equal(b->upload(b, dq_, qb, nq * 2, &err), RDA_OK);
  assert_int_equal(b->upload(b, dk_, kb, nk * 2, &err), RDA_OK);
  assert_int_equal(b->upload(b, dv_, vb, nk * 2, &err), RDA_OK);
  const long long sq[4] = {B, N, kH, kD}, sk[4] = {B, N, kHkv, kD}, sl[3] = {B, kH, N};
  rda_tensor tq, tk, tv, to, tl;
  rda_tensor_contiguous(&tq, dq_, RDA_BF16, 4, sq);
  rda_tensor_contiguous(&tk, dk_, RDA_BF16, 4, sk);
  rda_tensor_contiguous(&tv, dv_, RDA_BF16, 4, sk);
  rda_tensor_contiguous(&to, do_, RDA_BF16, 4, sq);
  rda_tensor_contiguous(&tl, dl_, RDA_FP32, 3, sl);
  double *o_ref, *lse_ref;
  rt_reference(&c, B, N, q, k, v, &o_ref, &lse_ref);
  uint16_t *ob = malloc(nq * 2);
  float *o32 = malloc(nq * 4), *lse = malloc(nl * 4);
  assert_non_null(ob);
  assert_non_null(o32);
  assert_non_null(lse);
  void *stream = NULL;
  assert_int_equal(stream_create(&stream, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  void *const streams[2] = {stream, NULL};
  for (int i = 0; i < 2; ++i) {
    const rda_status s = rda_forward(p, &tq, &tk, &tv, &to, &tl, dws, ws_bytes, streams[i]);
    if (s != RDA_OK) fprintf(stderr, "rda_forward (cuda): %s\n", rda_last_error(cctx));
    assert_int_equal(s, RDA_OK);
    assert_int_equal(ctx_sync(), 0);
    assert_int_equal(b->download(b, ob, do_, nq * 2, &err), RDA_OK);
    assert_int_equal(b->download(b, lse, dl_, nl * 4, &err), RDA_OK);
    for (size_t e = 0; e < nq; ++e) o32[e] = (float)rda_from_dtype_bits(ob[e], RDA_DTYPE_BF16);
    assert_true(rt_check_fwd(i == 0 ? "cuda, caller's stream" : "cuda, default stream", &c, B, N,
                             o32, qs, lse, ls, o_ref, lse_ref, NULL));
  }
  stream_destroy(stream);
  b->free(b, dq_), b->free(b, dk_), b->free(b, dv_), b->free(b, do_), b->free(b, dl_);
  b->free(b, dws);
  b->destroy(b);
  rda_plan_destroy(p);
  rda_ctx_destroy(cctx);
  dlclose(lib);
  free(q), free(k), free(v), free(qb), free(kb), free(vb), free(ob), free(o32), free(lse);
  free(o_ref), free(lse_ref);
}

/* ------------------------------------------------------------------ backward */

static float *to_f32(const double *x, size_t n) {
  float *f = aalloc(n * sizeof *f);
  assert_non_null(f);
  for (size_t i = 0; i < n; ++i) f[i] = (float)x[i];
  return f;
}

/* A backward case: fresh random inputs, bit images of them in the plan's dtype, the forward's
 * O and LSE, and poisoned gradients, as tensors for rda_backward. */
typedef struct bwd_case {
  rda_config c;
  long long B, N;
  size_t nq, nk, nl, ws_bytes;
  double *q, *k, *v, *dout, *dlse;
  uint16_t *qb, *kb, *vb, *dob;
  float *o, *lse, *dlsef, *dq, *dk, *dv;
  void *ws;
  long long qs[3], gs[3];
  rda_tensor tq, tk, tv, to, tl, tdo, tdl, tdq, tdk, tdv;
} bwd_case;

static void bwd_case_make(bwd_case *b, rda_plan *p, long long B, long long N) {
  memset(b, 0, sizeof *b);
  rda_attn_config pc;
  assert_int_equal(rda_plan_get_config(p, &pc), RDA_OK);
  const int H = pc.heads, Hkv = pc.kv_heads, D = pc.head_dim, dt = (int)pc.dtype;
  rt_config_make(&b->c, H, Hkv, D, dt, pc.causal, (int)pc.offsets, pc.nbranch, pc.segments,
                 pc.dilations);
  b->c.scale = pc.scale;
  b->B = B, b->N = N;
  b->nq = (size_t)(B * N * H * D), b->nk = (size_t)(B * N * Hkv * D), b->nl = (size_t)(B * H * N);
  b->q = rt_normal(b->nq, dt), b->k = rt_normal(b->nk, dt), b->v = rt_normal(b->nk, dt);
  b->dout = rt_normal(b->nq, dt), b->dlse = rt_normal(b->nl, RT_DTYPE_F64);
  for (size_t i = 0; i < b->nl; ++i) b->dlse[i] = (float)b->dlse[i]; /* what the kernels see */
  long long ks[3];
  rt_strides_contig(N, H, D, b->qs);
  rt_strides_contig(N, Hkv, D, ks);
  memcpy(b->gs, ks, sizeof ks);
  b->qb = rt_make_bits(b->q, B, N, H, D, b->qs, dt, NULL);
  b->kb = rt_make_bits(b->k, B, N, Hkv, D, ks, dt, NULL);
  b->vb = rt_make_bits(b->v, B, N, Hkv, D, ks, dt, NULL);
  b->dob = rt_make_bits(b->dout, B, N, H, D, b->qs, dt, NULL);
  b->o = aalloc(b->nq * 4), b->lse = aalloc(b->nl * 4), b->dlsef = to_f32(b->dlse, b->nl);
  b->dq = aalloc(b->nq * 4), b->dk = aalloc(b->nk * 4), b->dv = aalloc(b->nk * 4);
  rt_poison_f32(b->o, b->nq), rt_poison_f32(b->lse, b->nl);
  const long long sq[4] = {B, N, H, D}, sk[4] = {B, N, Hkv, D}, sl[3] = {B, H, N};
  rda_tensor_contiguous(&b->tq, b->qb, pc.dtype, 4, sq);
  rda_tensor_contiguous(&b->tk, b->kb, pc.dtype, 4, sk);
  rda_tensor_contiguous(&b->tv, b->vb, pc.dtype, 4, sk);
  rda_tensor_contiguous(&b->to, b->o, RDA_FP32, 4, sq);
  rda_tensor_contiguous(&b->tl, b->lse, RDA_FP32, 3, sl);
  rda_tensor_contiguous(&b->tdo, b->dob, pc.dtype, 4, sq);
  rda_tensor_contiguous(&b->tdl, b->dlsef, RDA_FP32, 3, sl);
  rda_tensor_contiguous(&b->tdq, b->dq, RDA_FP32, 4, sq);
  rda_tensor_contiguous(&b->tdk, b->dk, RDA_FP32, 4, sk);
  rda_tensor_contiguous(&b->tdv, b->dv, RDA_FP32, 4, sk);
  assert_int_equal(rda_forward(p, &b->tq, &b->tk, &b->tv, &b->to, &b->tl, NULL, 0, NULL), RDA_OK);
  assert_int_equal(rda_plan_backward_workspace_size(p, B, N, &b->ws_bytes), RDA_OK);
  assert_true(b->ws_bytes > 0);
  b->ws = aalloc(b->ws_bytes);
}

/* rda_backward into poisoned gradients (and workspace), with the case's dLSE or none, checked
 * against the float64 reference. */
static void bwd_case_check(bwd_case *b, rda_plan *p, int with_dlse, const char *what) {
  rt_poison_f32(b->dq, b->nq), rt_poison_f32(b->dk, b->nk), rt_poison_f32(b->dv, b->nk);
  rt_poison_f32(b->ws, b->ws_bytes / 4);
  const rda_status s = rda_backward(p, &b->tq, &b->tk, &b->tv, &b->to, &b->tl, &b->tdo,
                                    with_dlse ? &b->tdl : NULL, &b->tdq, &b->tdk, &b->tdv, b->ws,
                                    b->ws_bytes, NULL);
  if (s != RDA_OK) fprintf(stderr, "%s: rda_backward: %s\n", what, rda_last_error(g_ctx));
  assert_int_equal(s, RDA_OK);
  double *dq_ref, *dk_ref, *dv_ref;
  rt_reference_bwd(&b->c, b->B, b->N, b->q, b->k, b->v, b->dout, with_dlse ? b->dlse : NULL,
                   &dq_ref, &dk_ref, &dv_ref);
  assert_true(rt_check_bwd(what, &b->c, b->B, b->N, b->dq, b->qs, b->dk, b->gs, b->dv, b->gs,
                           dq_ref, dk_ref, dv_ref, NULL));
  free(dq_ref), free(dk_ref), free(dv_ref);
}

static void bwd_case_free(bwd_case *b) {
  free(b->ws), free(b->q), free(b->k), free(b->v), free(b->dout), free(b->dlse);
  free(b->qb), free(b->kb), free(b->vb), free(b->dob);
  free(b->o), free(b->lse), free(b->dlsef), free(b->dq), free(b->dk), free(b->dv);
}

/* plan (forward-only) refuses the backward pass and its workspace size, naming the flag. */
static void assert_no_backward(const rda_plan *plan, const bwd_case *b) {
  assert_int_equal(rda_backward(plan, &b->tq, &b->tk, &b->tv, &b->to, &b->tl, &b->tdo, NULL,
                                &b->tdq, &b->tdk, &b->tdv, b->ws, b->ws_bytes, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "without RDA_PLAN_WITH_BACKWARD");
  size_t ws_bytes = 0;
  assert_int_equal(rda_plan_backward_workspace_size(plan, b->B, b->N, &ws_bytes),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "without RDA_PLAN_WITH_BACKWARD");
}

static void test_backward_matches_reference_bf16_causal_gqa(void **state) {
  (void)state;
  const rda_attn_config cfg = base_config();
  rda_plan *p = NULL;
  if (rda_plan_create(&p, g_ctx, &cfg, RDA_PLAN_WITH_BACKWARD) != RDA_OK)
    fprintf(stderr, "rda_plan_create: %s\n", rda_last_error(g_ctx));
  assert_non_null(p);
  bwd_case b;
  bwd_case_make(&b, p, 1, 40);
  bwd_case_check(&b, p, 1, "rda_backward bf16 causal gqa");
  bwd_case_check(&b, p, 0, "rda_backward without dlse"); /* dlse NULL means 0 */

  /* The boundary: a small workspace, a storage-dtype o, a dq aliasing q, a forward-only plan. */
  assert_int_equal(rda_backward(p, &b.tq, &b.tk, &b.tv, &b.to, &b.tl, &b.tdo, NULL, &b.tdq,
                                &b.tdk, &b.tdv, b.ws, b.ws_bytes - 256, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "workspace_bytes");
  rda_tensor bad = b.to;
  bad.dtype = RDA_BF16;
  assert_int_equal(rda_backward(p, &b.tq, &b.tk, &b.tv, &bad, &b.tl, &b.tdo, NULL, &b.tdq,
                                &b.tdk, &b.tdv, b.ws, b.ws_bytes, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "rda_backward: o->dtype");
  bad = b.tdq;
  bad.data = b.dob;
  assert_int_equal(rda_backward(p, &b.tq, &b.tk, &b.tv, &b.to, &b.tl, &b.tdo, NULL, &bad, &b.tdk,
                                &b.tdv, b.ws, b.ws_bytes, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  /* dq (fp32) over dout's (bf16) buffer runs on past it, maybe into o's: the first met. */
  assert_error_names(g_ctx, "rda_backward: dq and ");
  assert_error_names(g_ctx, "share memory");
  /* Partial overlaps: dk inside dv, dq inside the input o. */
  bad = b.tdk;
  bad.data = (char *)b.dv + 1024;
  assert_int_equal(rda_backward(p, &b.tq, &b.tk, &b.tv, &b.to, &b.tl, &b.tdo, NULL, &b.tdq, &bad,
                                &b.tdv, b.ws, b.ws_bytes, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "dk and dv share memory");
  bad = b.tdq;
  bad.data = (char *)b.o + 4096;
  assert_int_equal(rda_backward(p, &b.tq, &b.tk, &b.tv, &b.to, &b.tl, &b.tdo, NULL, &bad, &b.tdk,
                                &b.tdv, b.ws, b.ws_bytes, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "dq and o share memory");
  /* Interleaved in one buffer, sharing no element, is fine: dq, dk, dv as views of a fused
   * [B, N, H + 2 Hkv, D] gradient, checked against the reference like separate buffers. */
  {
    const long long B = b.B, N = b.N, H = b.c.heads, Hkv = b.c.kv_heads, D = b.c.head_dim;
    const long long F = H + 2 * Hkv, fs[3] = {N * F * D, F * D, D};
    float *fused = aalloc((size_t)(B * N * F * D) * 4);
    rt_poison_f32(fused, (size_t)(B * N * F * D));
    rda_tensor fq = b.tdq, fk = b.tdk, fv = b.tdv;
    fq.data = fused, fk.data = fused + H * D, fv.data = fused + (H + Hkv) * D;
    for (int i = 0; i < 3; ++i) fq.stride[i] = fk.stride[i] = fv.stride[i] = fs[i];
    const rda_status fst = rda_backward(p, &b.tq, &b.tk, &b.tv, &b.to, &b.tl, &b.tdo, &b.tdl,
                                        &fq, &fk, &fv, b.ws, b.ws_bytes, NULL);
    if (fst != RDA_OK) fprintf(stderr, "fused gradients: %s\n", rda_last_error(g_ctx));
    assert_int_equal(fst, RDA_OK);
    double *dq_ref, *dk_ref, *dv_ref;
    rt_reference_bwd(&b.c, B, N, b.q, b.k, b.v, b.dout, b.dlse, &dq_ref, &dk_ref, &dv_ref);
    assert_true(rt_check_bwd("fused dq/dk/dv", &b.c, B, N, fused, fs, fused + H * D, fs,
                             fused + (H + Hkv) * D, fs, dq_ref, dk_ref, dv_ref, NULL));
    free(dq_ref), free(dk_ref), free(dv_ref), free(fused);
  }
  /* Past 2^31 - 1 rows the backward refuses first, not after asking for a workspace. */
  size_t big = 0;
  assert_int_equal(rda_plan_backward_workspace_size(p, 1, 1LL << 31, &big),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "2^31 - 1 rows");
  bad = b.tq;
  bad.shape[1] = 1LL << 31;
  assert_int_equal(rda_backward(p, &bad, &b.tk, &b.tv, &b.to, &b.tl, &b.tdo, NULL, &b.tdq, &b.tdk,
                                &b.tdv, NULL, 0, NULL),
                   RDA_ERR_INVALID_ARGUMENT);
  assert_error_names(g_ctx, "q->shape[1] = 2147483648");
  assert_no_backward(g_plan, &b);
  /* A forward-only plan of the same config, made while p lives (they share compiled kernels),
   * offers no backward pass all the same: what a plan offers is what it was created with. */
  rda_plan *fwd_only = NULL;
  assert_int_equal(rda_plan_create(&fwd_only, g_ctx, &cfg, RDA_PLAN_FORWARD), RDA_OK);
  assert_no_backward(fwd_only, &b);
  rda_plan_destroy(fwd_only);
  bwd_case_free(&b);
  rda_plan_destroy(p);
}

/* A view of the last `count` batch entries of t. */
static rda_tensor tail_of(const rda_tensor *t, long long count) {
  rda_tensor v = *t;
  const size_t el = t->dtype == RDA_FP32 ? 4 : 2;
  v.data = (char *)t->data + (size_t)((t->shape[0] - count) * t->stride[0]) * el;
  v.shape[0] = count;
  return v;
}

/* SPEC §2 allows any batch: past the grid's z limit (65535) both passes run slice by slice.
 * The whole result is checked against float64, and the last slice's entries bit for bit
 * against a call on those entries alone (the kernels are deterministic): a slice that reads
 * or writes any tensor at a wrong offset fails, however few its entries. */
static void test_batch_past_the_grid_limit_matches_reference_and_a_tail_call(void **state) {
  (void)state;
  rda_plan *p = NULL;
  const char *chunk = "return { heads = 2, kv_heads = 1, head_dim = 32, dtype = 'fp16',\n"
                      "         segments = {2}, dilations = {1}, causal = true }";
  assert_int_equal(rda_plan_create_from_string(&p, g_ctx, chunk, RDA_PLAN_WITH_BACKWARD), RDA_OK);
  const long long B = 65537, N = 2, T = 2, H = 2, Hkv = 1, D = 32;
  bwd_case b;
  bwd_case_make(&b, p, B, N);
  double *o_ref, *lse_ref;
  rt_reference(&b.c, B, N, b.q, b.k, b.v, &o_ref, &lse_ref);
  const long long ls[2] = {H * N, N};
  assert_true(rt_check_fwd("rda_forward batch 65537", &b.c, B, N, b.o, b.qs, b.lse, ls, o_ref,
                           lse_ref, NULL));
  free(o_ref), free(lse_ref);
  bwd_case_check(&b, p, 1, "rda_backward batch 65537");

  const size_t nq = (size_t)(T * N * H * D), nk = (size_t)(T * N * Hkv * D), nl = (size_t)(T * H * N);
  float *o = aalloc(nq * 4), *lse = aalloc(nl * 4);
  float *dq = aalloc(nq * 4), *dk = aalloc(nk * 4), *dv = aalloc(nk * 4);
  rt_poison_f32(o, nq), rt_poison_f32(lse, nl);
  rt_poison_f32(dq, nq), rt_poison_f32(dk, nk), rt_poison_f32(dv, nk);
  const long long sq[4] = {T, N, H, D}, sk[4] = {T, N, Hkv, D}, sl[3] = {T, H, N};
  rda_tensor to, tl, tdq, tdk, tdv;
  rda_tensor_contiguous(&to, o, RDA_FP32, 4, sq);
  rda_tensor_contiguous(&tl, lse, RDA_FP32, 3, sl);
  rda_tensor_contiguous(&tdq, dq, RDA_FP32, 4, sq);
  rda_tensor_contiguous(&tdk, dk, RDA_FP32, 4, sk);
  rda_tensor_contiguous(&tdv, dv, RDA_FP32, 4, sk);
  const rda_tensor q = tail_of(&b.tq, T), k = tail_of(&b.tk, T), v = tail_of(&b.tv, T);
  assert_int_equal(rda_forward(p, &q, &k, &v, &to, &tl, NULL, 0, NULL), RDA_OK);
  assert_memory_equal(o, (const float *)b.o + (B - T) * b.qs[0], nq * 4);
  assert_memory_equal(lse, (const float *)b.lse + (B - T) * H * N, nl * 4);

  const rda_tensor bo = tail_of(&b.to, T), bl = tail_of(&b.tl, T), dout = tail_of(&b.tdo, T);
  const rda_tensor dlse = tail_of(&b.tdl, T);
  size_t ws_bytes = 0;
  assert_int_equal(rda_plan_backward_workspace_size(p, T, N, &ws_bytes), RDA_OK);
  void *ws = aalloc(ws_bytes);
  assert_int_equal(rda_backward(p, &q, &k, &v, &bo, &bl, &dout, &dlse, &tdq, &tdk, &tdv, ws,
                                ws_bytes, NULL),
                   RDA_OK);
  assert_memory_equal(dq, b.dq + (B - T) * b.qs[0], nq * 4);
  assert_memory_equal(dk, b.dk + (B - T) * b.gs[0], nk * 4);
  assert_memory_equal(dv, b.dv + (B - T) * b.gs[0], nk * 4);
  free(o), free(lse), free(dq), free(dk), free(dv), free(ws);
  bwd_case_free(&b);
  rda_plan_destroy(p);
}

static void test_plan_create_rejects_unknown_flags(void **state) {
  (void)state;
  const rda_attn_config c = base_config();
  rda_plan *p = (rda_plan *)(uintptr_t)1;
  assert_int_equal(rda_plan_create(&p, g_ctx, &c, 0x4), RDA_ERR_INVALID_ARGUMENT);
  assert_null(p);
  assert_error_names(g_ctx, "flags = 0x4");
}

/* RDA_PLAN_AUTOTUNE's private tuning database, and RDA_TUNING_DB as the test found it (put
 * back even when the test fails). */
static char *g_tune_dir, *g_tune_db, *g_tune_saved;

static int autotune_setup(void **state) {
  (void)state;
  g_tune_saved = rt_env_save("RDA_TUNING_DB");
  if ((g_tune_dir = rt_mkdtemp()) == NULL) return -1;
  g_tune_db = rt_path(g_tune_dir, "tuning.lua");
  return setenv("RDA_TUNING_DB", g_tune_db, 1);
}

static int autotune_teardown(void **state) {
  (void)state;
  rt_env_restore("RDA_TUNING_DB", g_tune_saved);
  rt_rmtree(g_tune_dir);
  free(g_tune_db), free(g_tune_dir);
  g_tune_saved = g_tune_db = g_tune_dir = NULL;
  return 0;
}

/* Every attention kernel of plan p of kind `kind` ("fwd", "bwd_dkdv", "bwd_dq") took its tile
 * from the tuning database; returns how many there are. */
static int tuned_kernels(const rda_plan *p, const char *kind) {
  int count = 0;
  for (int i = 0; i < p->core->pk.nvariants; i++) {
    const rda_variant *v = &p->core->pk.variants[i];
    if (strcmp(v->kind, kind) != 0) continue;
    if (!v->tuned) fail_msg("%s (tile %s) did not take its tile from tuning", v->name, v->tile);
    count++;
  }
  return count;
}

/* RDA_PLAN_AUTOTUNE on the emulator, with a private tuning database: the first plan tunes
 * the kernels no entry covers, records them and takes their tiles; the plan computes SPEC §1;
 * asking for the backward too tunes only its kernels; once everything has an entry, a plan on
 * a new context tunes nothing and leaves the database as it is. */
static void test_plan_autotune_tunes_once_and_records_it(void **state) {
  (void)state;
  const char *db = g_tune_db;
  rda_attn_config c = base_config();
  c.nbranch = 1; /* one task per kind: the emulator runs every candidate */

  rda_ctx *ctx = NULL;
  rda_plan *p = NULL;
  assert_int_equal(rda_ctx_create_emulator(&ctx), RDA_OK);
  if (rda_plan_create(&p, ctx, &c, RDA_PLAN_AUTOTUNE) != RDA_OK)
    fail_msg("autotune: %s", rda_last_error(ctx));
  assert_int_equal(tuned_kernels(p, "fwd"), 1);
  size_t len = 0;
  char *first = rt_read_file(db, &len);
  assert_non_null(first);
  assert_non_null(strstr(first, "target = \"emu-sm_90\", kind = \"fwd\""));
  assert_null(strstr(first, "kind = \"bwd_dkdv\""));
  run_and_check("autotuned forward", p, kB, kN, 0, RDA_BF16, 1, NULL);
  rda_plan_destroy(p);
  rda_ctx_destroy(ctx);

  assert_int_equal(rda_ctx_create_emulator(&ctx), RDA_OK);
  if (rda_plan_create(&p, ctx, &c, RDA_PLAN_AUTOTUNE | RDA_PLAN_WITH_BACKWARD) != RDA_OK)
    fail_msg("autotune with backward: %s", rda_last_error(ctx));
  assert_int_equal(tuned_kernels(p, "fwd"), 1);
  assert_int_equal(tuned_kernels(p, "bwd_dkdv"), 1);
  assert_int_equal(tuned_kernels(p, "bwd_dq"), 1);
  rda_plan_destroy(p);
  rda_ctx_destroy(ctx);
  char *second = rt_read_file(db, &len);
  assert_non_null(second);
  assert_non_null(strstr(second, "kind = \"bwd_dkdv\""));
  assert_non_null(strstr(second, "kind = \"bwd_dq\""));
  /* The forward's entry stayed as the first run wrote it (a second timing would differ). */
  const char *fwd = strstr(first, "  { target = \"emu-sm_90\", kind = \"fwd\"");
  assert_non_null(fwd);
  const char *fwd_end = strstr(fwd, "\n  },\n");
  assert_non_null(fwd_end);
  char *entry = strndup(fwd, (size_t)(fwd_end - fwd));
  assert_non_null(strstr(second, entry));
  free(entry);

  struct stat before, after;
  assert_int_equal(stat(db, &before), 0);
  assert_int_equal(rda_ctx_create_emulator(&ctx), RDA_OK);
  if (rda_plan_create(&p, ctx, &c, RDA_PLAN_AUTOTUNE | RDA_PLAN_WITH_BACKWARD) != RDA_OK)
    fail_msg("autotune, all tuned: %s", rda_last_error(ctx));
  rda_plan_destroy(p);
  rda_ctx_destroy(ctx);
  assert_int_equal(stat(db, &after), 0);
  assert_true(before.st_ino == after.st_ino && before.st_mtim.tv_sec == after.st_mtim.tv_sec &&
              before.st_mtim.tv_nsec == after.st_mtim.tv_nsec);
  free(first), free(second);
}

/* ------------------------------------------------------------------ lifetimes and threads */

/* ctx create, plans (kernels from the cache), destroy in both orders: nothing may leak (the
 * ASan build checks; `test_api --create-destroy-loop N` is the valgrind run). */
static int create_destroy_loop(int iterations) {
  const rda_attn_config c = base_config();
  for (int i = 0; i < iterations; ++i) {
    rda_ctx *ctx = NULL;
    rda_plan *p1 = NULL, *p2 = NULL;
    if (rda_ctx_create_emulator(&ctx) != RDA_OK) return 1;
    if (rda_plan_create(&p1, ctx, &c, RDA_PLAN_FORWARD) != RDA_OK ||
        rda_plan_create_from_string(&p2, ctx, "return { heads = 1 }", RDA_PLAN_FORWARD) !=
            RDA_ERR_CONFIG ||
        p2 != NULL || rda_plan_create(&p2, ctx, &c, RDA_PLAN_FORWARD) != RDA_OK) {
      fprintf(stderr, "create_destroy_loop: %s\n", rda_last_error(ctx));
      return 1;
    }
    if (rda_api_ctx_plans(ctx) != 2) return 1;
    if (i % 2 == 0) { /* the context first: it lives on until its last plan goes */
      rda_ctx_destroy(ctx);
      rda_plan_destroy(p1);
      rda_plan_destroy(p2);
    } else {
      rda_plan_destroy(p2);
      rda_plan_destroy(p1);
      rda_ctx_destroy(ctx);
    }
  }
  return 0;
}

static void test_create_destroy_loop_is_clean(void **state) {
  (void)state;
  assert_int_equal(create_destroy_loop(4), 0);
}

/* Plans of one config share one core (kernels loaded once); a context keeps at most 8 unused
 * cores and frees the older ones. */
static void test_plans_share_kernels_and_idle_ones_are_bounded(void **state) {
  (void)state;
  rda_ctx *ctx = NULL;
  assert_int_equal(rda_ctx_create_emulator(&ctx), RDA_OK);
  rda_plan *p[12];
  rda_attn_config c = base_config();
  assert_int_equal(rda_plan_create(&p[0], ctx, &c, RDA_PLAN_FORWARD), RDA_OK);
  /* The same config as a struct, as text with defaults spelled out: one core. */
  assert_int_equal(rda_plan_create(&p[1], ctx, &c, RDA_PLAN_FORWARD), RDA_OK);
  assert_int_equal(
      rda_plan_create_from_string(&p[2], ctx,
                                  "return { heads = 4, kv_heads = 2, head_dim = 32, dtype = "
                                  "'bf16', causal = true, offsets = 'mod', segments = {16, 32}, "
                                  "dilations = {1, 2} }",
                                  RDA_PLAN_FORWARD),
      RDA_OK);
  assert_int_equal(rda_api_ctx_cores(ctx), 1);
  for (int i = 3; i < 12; ++i) { /* 9 more configs: scales 1/(i+1) */
    c.scale = 1.0 / (i + 1);
    assert_int_equal(rda_plan_create(&p[i], ctx, &c, RDA_PLAN_FORWARD), RDA_OK);
  }
  assert_int_equal(rda_api_ctx_cores(ctx), 10);
  assert_int_equal(rda_api_ctx_plans(ctx), 12);
  for (int i = 0; i < 12; ++i) rda_plan_destroy(p[i]);
  assert_int_equal(rda_api_ctx_plans(ctx), 0);
  assert_int_equal(rda_api_ctx_cores(ctx), 8);
  rda_ctx_destroy(ctx);
}

static void test_plan_outlives_destroyed_context(void **state) {
  (void)state;
  rda_ctx *ctx = NULL;
  rda_plan *p = NULL;
  assert_int_equal(rda_ctx_create_emulator(&ctx), RDA_OK);
  const rda_attn_config c = base_config();
  assert_int_equal(rda_plan_create(&p, ctx, &c, RDA_PLAN_FORWARD), RDA_OK);
  assert_int_equal(rda_api_ctx_plans(ctx), 1);
  rda_ctx_destroy(ctx);
  run_and_check("plan after its context's destroy", p, 1, 16, 0, RDA_BF16, 1, NULL);
  /* The caller's handle is gone: no new plans on it, and a second destroy is refused. */
  rda_plan *p2 = (rda_plan *)(uintptr_t)1;
  assert_int_equal(rda_plan_create(&p2, ctx, &c, RDA_PLAN_FORWARD), RDA_ERR_INVALID_ARGUMENT);
  assert_null(p2);
  assert_error_names(NULL, "destroyed");
  rda_ctx_destroy(ctx);
  assert_error_names(NULL, "ignored");
  assert_int_equal(rda_api_ctx_plans(ctx), 1);
  rda_plan_destroy(p);
}

typedef struct worker {
  rda_plan *plan;
  rda_status create, run;
  uint16_t o[16 * kH * kD];
} worker;

static uint16_t g_q[16 * kH * kD] __attribute__((aligned(16)));
static uint16_t g_k[16 * kHkv * kD] __attribute__((aligned(16)));

static void *worker_main(void *arg) {
  worker *w = arg;
  const rda_attn_config c = base_config();
  w->create = rda_plan_create(&w->plan, g_ctx, &c, RDA_PLAN_FORWARD);
  if (w->create != RDA_OK) return NULL;
  const long long qs[4] = {1, 16, kH, kD}, ks[4] = {1, 16, kHkv, kD};
  rda_tensor tq, tk, to;
  rda_tensor_contiguous(&tq, g_q, RDA_BF16, 4, qs);
  rda_tensor_contiguous(&tk, g_k, RDA_BF16, 4, ks);
  rda_tensor_contiguous(&to, w->o, RDA_BF16, 4, qs);
  size_t bytes = 0;
  rda_plan_workspace_size(w->plan, 1, 16, &bytes);
  void *ws = aalloc(bytes);
  w->run =
      ws ? rda_forward(w->plan, &tq, &tk, &tk, &to, NULL, ws, bytes, NULL) : RDA_ERR_OUT_OF_MEMORY;
  free(ws);
  return NULL;
}

static void test_plans_created_and_run_from_threads_at_once(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof g_q / 2; ++i)
    g_q[i] = rda_to_dtype_bits(rt_rng_normal(rt_global_rng()), RDA_DTYPE_BF16);
  for (size_t i = 0; i < sizeof g_k / 2; ++i)
    g_k[i] = rda_to_dtype_bits(rt_rng_normal(rt_global_rng()), RDA_DTYPE_BF16);
  static worker w[3];
  pthread_t t[3];
  for (int i = 0; i < 3; ++i) {
    memset(w[i].o, 0xff, sizeof w[i].o);
    assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < 3; ++i) pthread_join(t[i], NULL);
  for (int i = 0; i < 3; ++i) {
    assert_int_equal(w[i].create, RDA_OK);
    assert_int_equal(w[i].run, RDA_OK);
    assert_memory_equal(w[i].o, w[0].o, sizeof w[0].o); /* deterministic */
    rda_plan_destroy(w[i].plan);
  }
  for (size_t i = 0; i < sizeof w[0].o / 2; ++i) assert_int_not_equal(w[0].o[i], 0xffff);
}

/* rda_last_error(ctx) while other threads fail on the same context: every read is one whole
 * message of some failing call, never empty or torn. Two threads fail with different messages
 * and read back, many times. */
typedef struct err_reader {
  int which;      /* 0: q NULL, 1: k NULL */
  const args *a;  /* shared, only read: every call fails before a kernel runs */
  pthread_barrier_t *start;
  long bad, reads;
  char seen[160]; /* the first bad read */
} err_reader;

static void *err_reader_main(void *arg) {
  err_reader *r = arg;
  static const char *const want[2] = {"rda_forward: q is NULL", "rda_forward: k is NULL"};
  const args *a = r->a;
  pthread_barrier_wait(r->start); /* both threads fail at once from here on */
  for (int i = 0; i < 200000; ++i) {
    const rda_tensor *q = r->which == 0 ? NULL : &a->tq, *k = r->which == 1 ? NULL : &a->tk;
    if (rda_forward(g_plan, q, k, &a->tv, &a->to, &a->tl, a->ws, a->ws_bytes, NULL) == RDA_OK)
      continue;
    char m[sizeof r->seen];
    snprintf(m, sizeof m, "%s", rda_last_error(g_ctx));
    ++r->reads;
    if (strcmp(m, want[0]) != 0 && strcmp(m, want[1]) != 0 && r->bad++ == 0)
      memcpy(r->seen, m, sizeof m);
  }
  return NULL;
}

static void test_last_error_is_whole_while_other_threads_fail(void **state) {
  (void)state;
  args a;
  args_make(&a);
  pthread_barrier_t start;
  assert_int_equal(pthread_barrier_init(&start, NULL, 2), 0);
  err_reader r[2] = {{.which = 0, .a = &a, .start = &start}, {.which = 1, .a = &a, .start = &start}};
  pthread_t t[2];
  for (int i = 0; i < 2; ++i) assert_int_equal(pthread_create(&t[i], NULL, err_reader_main, &r[i]), 0);
  for (int i = 0; i < 2; ++i) pthread_join(t[i], NULL);
  for (int i = 0; i < 2; ++i) {
    if (r[i].bad > 0)
      fprintf(stderr, "thread %d: %ld of %ld reads were not a whole message, e.g. \"%s\"\n", i,
              r[i].bad, r[i].reads, r[i].seen);
    assert_int_equal(r[i].reads, 200000);
    assert_int_equal(r[i].bad, 0);
  }
  pthread_barrier_destroy(&start);
  args_free(&a);
}

/* Reading or recording a message never waits for a plan build: with the context's plan lock
 * held (as during a build on another thread), a failing call and rda_last_error return. */
typedef struct err_prober {
  atomic_int done;
  char msg[160];
} err_prober;

static void *err_prober_main(void *arg) {
  err_prober *e = arg;
  rda_forward(g_plan, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL); /* fails: q is NULL */
  snprintf(e->msg, sizeof e->msg, "%s", rda_last_error(g_ctx));
  atomic_store(&e->done, 1);
  return NULL;
}

static void test_last_error_does_not_wait_for_a_plan_build(void **state) {
  (void)state;
  err_prober e;
  atomic_init(&e.done, 0);
  e.msg[0] = '\0';
  pthread_mutex_lock(&g_ctx->lock);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, err_prober_main, &e), 0);
  for (int i = 0; i < 1000 && !atomic_load(&e.done); ++i) { /* up to 10 s */
    const struct timespec ms10 = {0, 10 * 1000 * 1000};
    nanosleep(&ms10, NULL);
  }
  const int done = atomic_load(&e.done);
  pthread_mutex_unlock(&g_ctx->lock);
  pthread_join(t, NULL);
  if (!done) fprintf(stderr, "rda_last_error waited for the plan lock\n");
  assert_true(done);
  assert_string_equal(e.msg, "rda_forward: q is NULL");
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--create-destroy-loop") == 0) {
    const int rc = create_destroy_loop(atoi(argv[2]));
    printf("test_api: create/destroy loop: %s\n", rc == 0 ? "ok" : "FAILED");
    return rc;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_values_and_names_are_pinned),
      cmocka_unit_test(test_ctx_create_rejects_null_out_and_bad_ordinal),
      cmocka_unit_test(test_ctx_create_cuda_fails_cleanly_or_works),
      cmocka_unit_test(test_destroy_accepts_null),
      cmocka_unit_test(test_wrong_handles_are_rejected_by_magic),
      cmocka_unit_test(test_plan_create_rejects_bad_config_struct),
      cmocka_unit_test(test_plan_create_rejects_bad_lua_config),
      cmocka_unit_test(test_plan_get_config_resolves_defaults),
      cmocka_unit_test(test_forward_rejects_null_tensors),
      cmocka_unit_test(test_forward_rejects_mismatched_dtypes_and_shapes),
      cmocka_unit_test(test_forward_rejects_bad_strides_and_alignment),
      cmocka_unit_test(test_forward_rejects_missing_or_small_workspace),
      cmocka_unit_test(test_tensor_contiguous_checks_its_arguments),
      cmocka_unit_test(test_tensor_overlap_is_exact_for_views_of_one_buffer),
      cmocka_unit_test(test_forward_matches_reference_bf16_causal_gqa_storage_output),
      cmocka_unit_test(test_forward_matches_reference_fp16_block_fused_qkv_fp32_output),
      cmocka_unit_test(test_forward_matches_reference_with_negative_scale),
      cmocka_unit_test(test_forward_storage_output_is_fp32_output_rounded),
      cmocka_unit_test(test_plan_from_file_string_and_struct_agree),
      cmocka_unit_test(test_forward_on_cuda_streams_matches_reference),
      cmocka_unit_test(test_backward_matches_reference_bf16_causal_gqa),
      cmocka_unit_test(test_batch_past_the_grid_limit_matches_reference_and_a_tail_call),
      cmocka_unit_test(test_plan_create_rejects_unknown_flags),
      cmocka_unit_test_setup_teardown(test_plan_autotune_tunes_once_and_records_it,
                                      autotune_setup, autotune_teardown),
      cmocka_unit_test(test_create_destroy_loop_is_clean),
      cmocka_unit_test(test_plans_share_kernels_and_idle_ones_are_bounded),
      cmocka_unit_test(test_plan_outlives_destroyed_context),
      cmocka_unit_test(test_plans_created_and_run_from_threads_at_once),
      cmocka_unit_test(test_last_error_is_whole_while_other_threads_fail),
      cmocka_unit_test(test_last_error_does_not_wait_for_a_plan_build),
  };
  const char *filter = getenv("RDA_TEST_FILTER"); /* e.g. "*negative_scale*" while developing */
  if (filter != NULL) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
