/* api.c — the public C API (include/rda.h): contexts, plans, the forward and backward calls,
 * with every argument checked at the boundary (handles by magic number, shapes, dtypes,
 * alignment, strides, workspace) and failures recorded per context and per thread. The checks
 * are shared with the ring calls (runtime/api_ring.c) through api_internal.h. */
#include "api.h"
#include "api_internal.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bwd.h"
#include "config.h"
#include "err.h"
#include "fwd.h"
#include "gen.h"
#include "tune.h"
#include "tuning_db.h"

_Static_assert(RDA_CONFIG_MAX_BRANCHES == RDA_MAX_BRANCHES, "rda.h and config.h disagree");
_Static_assert((int)RDA_BF16 == RDA_DTYPE_BF16 && (int)RDA_FP16 == RDA_DTYPE_FP16,
               "rda.h and rda_params.h disagree on dtypes");
_Static_assert((int)RDA_OFFSET_MOD == RDA_OFFSETS_MOD &&
                   (int)RDA_OFFSET_BLOCK == RDA_OFFSETS_BLOCK &&
                   (int)RDA_OFFSET_GROUP == RDA_OFFSETS_GROUP,
               "rda.h and rda_params.h disagree on offset rules");

static const int kIdleCores = 8; /* unused plan cores a context keeps for reuse */

/* The last failure of any call on this thread (rda_last_error(NULL)). */
static _Thread_local char rda_api_thread_error[RDA_API_MSG_LEN];

/* ---- errors ------------------------------------------------------------------------------ */

/* Record err (status and message) on ctx (when usable) and on the thread; returns the status.
 * The message is made one line: control characters (a caller's abort reason, a path) become
 * spaces. */
rda_status rda_api_fail(rda_ctx *ctx, const rda_err *err) {
  const rda_status s = err->status != RDA_OK ? err->status : RDA_ERR_INTERNAL;
  char msg[RDA_API_MSG_LEN];
  snprintf(msg, sizeof msg, "%s", err->msg[0] != '\0' ? err->msg : "(no detail recorded)");
  for (char *c = msg; *c != '\0'; ++c)
    if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
  snprintf(rda_api_thread_error, sizeof rda_api_thread_error, "%s", msg);
  if (rda_api_ctx_ok(ctx)) {
    pthread_mutex_lock(&ctx->err_lock);
    snprintf(ctx->last_error, sizeof ctx->last_error, "%s", msg);
    pthread_mutex_unlock(&ctx->err_lock);
  }
  return s;
}

rda_status rda_api_failf(rda_ctx *ctx, rda_status s, const char *fmt, ...) {
  rda_err err;
  err.status = s;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err.msg, sizeof err.msg, fmt, ap);
  va_end(ap);
  return rda_api_fail(ctx, &err);
}

/* The context's message as this thread read it: copied under the lock, since another thread's
 * failure may be rewriting ctx->last_error at the same time. */
static _Thread_local char rda_api_thread_copy[RDA_API_MSG_LEN];

const char *rda_last_error(const rda_ctx *ctx) {
  if (!rda_api_ctx_ok(ctx)) { /* a copy too: the thread's next failure must not change it */
    snprintf(rda_api_thread_copy, sizeof rda_api_thread_copy, "%s", rda_api_thread_error);
    return rda_api_thread_copy;
  }
  rda_ctx *c = (rda_ctx *)(uintptr_t)ctx; /* the lock, not the context, changes */
  pthread_mutex_lock(&c->err_lock);
  snprintf(rda_api_thread_copy, sizeof rda_api_thread_copy, "%s", c->last_error);
  pthread_mutex_unlock(&c->err_lock);
  return rda_api_thread_copy;
}

/* ---- contexts ---------------------------------------------------------------------------- */

void rda_api_ctx_release(rda_ctx *ctx) {
  if (atomic_fetch_sub(&ctx->refs, 1) != 1) return;
  ctx->magic = RDA_API_DEAD_MAGIC;
  while (ctx->cores != NULL) { /* all idle: every plan held a reference */
    rda_api_core *c = ctx->cores;
    ctx->cores = c->next;
    rda_fwd_unload(ctx->b, &c->kernels);
    rda_plan_k_free(&c->pk);
    free(c->text);
    free(c);
  }
  rda_gen_close(ctx->gen);
  if (ctx->b != NULL) ctx->b->destroy(ctx->b);
  pthread_mutex_destroy(&ctx->lock);
  pthread_mutex_destroy(&ctx->err_lock);
  free(ctx);
}

static rda_status rda_api_dry_launch(rda_backend *b, rda_module *m, const unsigned grid[3],
                                     unsigned threads, unsigned smem_bytes, const void *params,
                                     size_t params_bytes, rda_err *err) {
  (void)b, (void)m, (void)grid, (void)threads, (void)smem_bytes, (void)params;
  (void)params_bytes, (void)err;
  return RDA_OK;
}

/* which: "cuda" or "emu"; dry: replace launches by no-ops. */
static rda_status rda_api_ctx_create(rda_ctx **out, const char *which, int ordinal, int dry) {
  if (out == NULL)
    return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT, "rda_ctx_create_%s: out is NULL",
                         strcmp(which, "cuda") == 0 ? "cuda" : "emulator");
  *out = NULL;
  rda_ctx *ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL)
    return rda_api_failf(NULL, RDA_ERR_OUT_OF_MEMORY, "rda_ctx_create: out of memory");
  atomic_init(&ctx->refs, 1);
  atomic_init(&ctx->plans, 0);
  atomic_init(&ctx->closed, 0);
  pthread_mutex_init(&ctx->lock, NULL);
  pthread_mutex_init(&ctx->err_lock, NULL);
  ctx->magic = RDA_API_CTX_MAGIC;
  ctx->is_cuda = strcmp(which, "cuda") == 0;
  ctx->dry = dry;
  rda_err err = {0};
  rda_status s = ctx->is_cuda ? rda_backend_cuda_open(&ctx->b, ordinal, &err)
                              : rda_backend_emu_open(&ctx->b, 90, &err);
  if (s == RDA_OK) s = rda_gen_open(&ctx->gen, &err);
  if (s == RDA_OK) s = rda_backend_hw(ctx->b, ctx->gen, &ctx->hw, &err);
  if (s != RDA_OK) {
    rda_api_ctx_release(ctx);
    return rda_api_fail(NULL, &err);
  }
  if (dry) ctx->b->launch = rda_api_dry_launch;
  *out = ctx;
  return RDA_OK;
}

rda_status rda_ctx_create_cuda(rda_ctx **out, int ordinal) {
  if (ordinal < 0) {
    if (out != NULL) *out = NULL;
    return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT,
                         "rda_ctx_create_cuda: ordinal = %d: must be >= 0", ordinal);
  }
  return rda_api_ctx_create(out, "cuda", ordinal, 0);
}

rda_status rda_ctx_create_emulator(rda_ctx **out) {
  return rda_api_ctx_create(out, "emu", 0, 0);
}

rda_status rda_api_ctx_create_dry(rda_ctx **out) {
  return rda_api_ctx_create(out, "emu", 0, 1);
}

int rda_api_ctx_plans(const rda_ctx *ctx) {
  return rda_api_ctx_ok(ctx) ? atomic_load(&((rda_ctx *)(uintptr_t)ctx)->plans) : -1;
}

int rda_api_ctx_cores(rda_ctx *ctx) {
  if (!rda_api_ctx_ok(ctx)) return -1;
  int n = 0;
  pthread_mutex_lock(&ctx->lock);
  for (const rda_api_core *c = ctx->cores; c != NULL; c = c->next) n++;
  pthread_mutex_unlock(&ctx->lock);
  return n;
}

void rda_ctx_destroy(rda_ctx *ctx) {
  if (ctx == NULL) return;
  if (!rda_api_ctx_ok(ctx) || atomic_exchange(&ctx->closed, 1) != 0) {
    (void)rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT,
                        "rda_ctx_destroy: ctx is not a live rda_ctx (wrong magic, or destroyed "
                        "before); ignored");
    return;
  }
  rda_api_ctx_release(ctx);
}

/* ---- plans ------------------------------------------------------------------------------- */

/* Checks the handle arguments shared by the rda_plan_create_* functions. */
static rda_status rda_api_plan_args(rda_plan **out, rda_ctx *ctx, const void *src, unsigned flags,
                                    const char *fn, const char *src_name) {
  if (out == NULL) {
    const rda_status s = rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (rda_api_ctx_ok(ctx)) (void)rda_api_failf(ctx, s, "%s: out is NULL", fn);
    return s;
  }
  *out = NULL;
  if (ctx == NULL) return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
  if (!rda_api_ctx_open(ctx))
    return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT,
                         "%s: ctx is not a live rda_ctx (wrong magic, or destroyed)", fn);
  if (src == NULL)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, src_name);
  const unsigned known = (unsigned)RDA_PLAN_WITH_BACKWARD | (unsigned)RDA_PLAN_AUTOTUNE;
  if ((flags & ~known) != 0)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "%s: flags = 0x%x: only RDA_PLAN_WITH_BACKWARD (0x%x) and "
                         "RDA_PLAN_AUTOTUNE (0x%x) are defined",
                         fn, flags, (unsigned)RDA_PLAN_WITH_BACKWARD, (unsigned)RDA_PLAN_AUTOTUNE);
  return RDA_OK;
}

static int rda_api_cfg_equal(const rda_config *a, const rda_config *b) {
  if (a->heads != b->heads || a->kv_heads != b->kv_heads || a->head_dim != b->head_dim ||
      a->dtype != b->dtype || a->nbranch != b->nbranch || a->offsets != b->offsets ||
      a->causal != b->causal || a->scale != b->scale)
    return 0;
  for (int i = 0; i < a->nbranch; ++i)
    if (a->segments[i] != b->segments[i] || a->dilations[i] != b->dilations[i]) return 0;
  return 1;
}

/* A new plan handle on core (which gains a reference). Called with ctx->lock held. */
rda_status rda_api_plan_wrap(rda_ctx *ctx, rda_api_core *core, unsigned flags, rda_plan **out,
                             rda_err *err) {
  rda_plan *p = malloc(sizeof *p);
  if (p == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "rda_plan_create: out of memory");
  p->magic = RDA_API_PLAN_MAGIC;
  p->ctx = ctx;
  p->core = core;
  p->flags = flags;
  core->refs++;
  atomic_fetch_add(&ctx->refs, 1);
  atomic_fetch_add(&ctx->plans, 1);
  *out = p;
  return RDA_OK;
}

/* Free idle cores beyond the newest kIdleCores. Called with ctx->lock held. */
static void rda_api_trim_cores(rda_ctx *ctx) {
  int idle = 0;
  for (rda_api_core **pp = &ctx->cores; *pp != NULL;) {
    rda_api_core *c = *pp;
    if (c->refs == 0 && ++idle > kIdleCores) {
      *pp = c->next;
      rda_fwd_unload(ctx->b, &c->kernels);
      rda_plan_k_free(&c->pk);
      free(c->text);
      free(c);
    } else {
      pp = &c->next;
    }
  }
}

/* RDA_PLAN_AUTOTUNE: tune the config's kernels that no database entry gives a tile for yet,
 * and save the rankings in the user's database, so the plan that follows takes them. */
static rda_status rda_api_autotune(rda_ctx *ctx, const rda_config *cfg, unsigned gen_flags,
                                   rda_err *err) {
  char path[4096];
  RDA_TRY(rda_tuning_db_path(path, sizeof path, err));
  const rda_tune_opts o = {.n = rda_tune_default_n(cfg, &ctx->hw),
                           .batch = 1,
                           .iters = rda_tune_default_iters(&ctx->hw),
                           .flags = gen_flags,
                           .seed = 1,
                           .untuned_only = 1};
  char *text = NULL;
  rda_tune_report *reps = NULL;
  int n = 0;
  /* Held from before the tasks are listed (which reads the database) until the rankings are
   * saved: another plan or process tuning with this database waits, then finds the entries. */
  rda_tuning_lock lock = RDA_TUNING_LOCK_INIT;
  rda_status s = rda_tuning_db_lock(path, &lock, err);
  if (s == RDA_OK)
    s = rda_tune_run(ctx->b, ctx->gen, &ctx->hw, cfg, &o, NULL, NULL, &text, &reps, &n, err);
  if (s == RDA_OK && n > 0)
    s = rda_tune_save_locked(ctx->gen, &ctx->hw, cfg, &o, reps, n, path, err);
  rda_tuning_db_unlock(&lock);
  free(text);
  free(reps);
  return s;
}

/* The plan of a validated config: a core the context has for it, else plan and load the
 * kernels into a new one (text, when not NULL, is remembered as a key). Called with ctx->lock
 * held; *out is set only on success. */
static rda_status rda_api_plan_build(rda_ctx *ctx, const rda_config *cfg, const char *text,
                                     unsigned flags, rda_plan **out, rda_err *err) {
  for (rda_api_core *c = ctx->cores; c != NULL; c = c->next)
    if ((c->flags & flags) == flags && rda_api_cfg_equal(&c->pk.cfg, cfg))
      return rda_api_plan_wrap(ctx, c, flags, out, err);
  rda_api_core *c = calloc(1, sizeof *c);
  char *key = text != NULL ? strdup(text) : NULL;
  if (c == NULL || (text != NULL && key == NULL)) {
    free(c);
    free(key);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "rda_plan_create: out of memory");
  }
  const unsigned gen_flags = (flags & RDA_PLAN_WITH_BACKWARD) ? RDA_PLAN_BACKWARD : 0u;
  rda_status s = (flags & RDA_PLAN_AUTOTUNE) ? rda_api_autotune(ctx, cfg, gen_flags, err) : RDA_OK;
  if (s == RDA_OK) s = rda_gen_plan_ex(ctx->gen, cfg, &ctx->hw, gen_flags, &c->pk, err);
  if (s == RDA_OK) {
    s = rda_fwd_load(ctx->b, &c->pk, &c->kernels, err);
    if (s != RDA_OK) rda_plan_k_free(&c->pk);
  }
  if (s == RDA_OK) s = rda_api_plan_wrap(ctx, c, flags, out, err);
  if (s != RDA_OK) {
    if (c->kernels.modules != NULL) {
      rda_fwd_unload(ctx->b, &c->kernels);
      rda_plan_k_free(&c->pk);
    }
    free(c);
    free(key);
    return s;
  }
  c->text = key;
  c->flags = flags;
  c->next = ctx->cores;
  ctx->cores = c;
  rda_api_trim_cores(ctx);
  return RDA_OK;
}

/* Validate a config (chunk text or file) and build the plan, under the context's lock. A
 * chunk the context has seen skips Lua: configs run sandboxed with no io, os or randomness,
 * so the same text always gives the same config. */
static rda_status rda_api_plan_from(rda_plan **out, rda_ctx *ctx, const char *chunk,
                                    const char *chunkname, const char *path, unsigned flags) {
  rda_err err = {0};
  rda_config cfg;
  pthread_mutex_lock(&ctx->lock);
  if (chunk != NULL)
    for (rda_api_core *c = ctx->cores; c != NULL; c = c->next)
      if ((c->flags & flags) == flags && c->text != NULL && strcmp(c->text, chunk) == 0) {
        const rda_status s = rda_api_plan_wrap(ctx, c, flags, out, &err);
        pthread_mutex_unlock(&ctx->lock);
        return s == RDA_OK ? RDA_OK : rda_api_fail(ctx, &err);
      }
  rda_status s = path != NULL ? rda_gen_config_file(ctx->gen, path, &cfg, &err)
                              : rda_gen_config_string(ctx->gen, chunk, chunkname, &cfg, &err);
  if (s == RDA_OK) s = rda_api_plan_build(ctx, &cfg, chunk, flags, out, &err);
  pthread_mutex_unlock(&ctx->lock);
  return s == RDA_OK ? RDA_OK : rda_api_fail(ctx, &err);
}

/* Append printf output to buf at *len; returns 0 when it did not fit. */
static int rda_api_append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int rda_api_append(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= cap - *len) return 0;
  *len += (size_t)n;
  return 1;
}

/* The config struct as a Lua chunk, so that it goes through the one validation (SPEC §3) and
 * its messages name the same keys as a config file's. Checks here only what cannot be
 * written as a chunk. */
static rda_status rda_api_config_chunk(const rda_attn_config *c, char *buf, size_t cap,
                                       rda_err *err) {
  if (c->struct_size != sizeof(rda_attn_config))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "cfg->struct_size = %zu: expected sizeof(rda_attn_config) = %zu "
                       "(initialize with RDA_CONFIG_INIT)",
                       c->struct_size, sizeof(rda_attn_config));
  /* A program built against an older release of this major version runs; 0 (a zeroed struct)
   * and a newer release than the library do not. */
  if (c->version / 10000 != RDA_VERSION_MAJOR || c->version == 0 ||
      c->version > RDA_VERSION_NUMBER)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "cfg->version = %u: not a release of this library's major version up to "
                       "its own %u (initialize with RDA_CONFIG_INIT)",
                       c->version, (unsigned)RDA_VERSION_NUMBER);
  if (c->nbranch < 1 || c->nbranch > RDA_CONFIG_MAX_BRANCHES)
    return rda_err_set(err, RDA_ERR_CONFIG, "cfg->nbranch = %d: must be 1 to %d", c->nbranch,
                       RDA_CONFIG_MAX_BRANCHES);
  if (c->dtype != RDA_BF16 && c->dtype != RDA_FP16)
    return rda_err_set(err, RDA_ERR_CONFIG,
                       "cfg->dtype = %d: the storage type must be RDA_BF16 or RDA_FP16",
                       (int)c->dtype);
  static const char *const offsets[] = {"mod", "block", "group"};
  if ((int)c->offsets < 0 || (int)c->offsets > 2)
    return rda_err_set(err, RDA_ERR_CONFIG,
                       "cfg->offsets = %d: must be RDA_OFFSET_MOD, RDA_OFFSET_BLOCK or "
                       "RDA_OFFSET_GROUP",
                       (int)c->offsets);
  if (c->causal != 0 && c->causal != 1)
    return rda_err_set(err, RDA_ERR_CONFIG, "cfg->causal = %d: must be 0 or 1", c->causal);
  /* Any sign; |scale| * log2(e) is an fp32 constant of the kernels, so it must fit a float. */
  if (!rda_config_scale_fits(c->scale))
    return rda_err_set(err, RDA_ERR_CONFIG,
                       "cfg->scale = %g: must be a finite number with |scale| <= %.8g "
                       "(scale * log2(e) must fit in fp32), or 0 for 1/sqrt(head_dim)",
                       c->scale, rda_config_scale_max());
  /* Checked here as well as by the config's validation: these name the struct's fields. */
  for (int i = 0; i < c->nbranch; ++i) {
    const char *key = NULL;
    long long v = 0;
    if (!rda_config_size_ok(c->segments[i]))
      key = "segments", v = c->segments[i];
    else if (!rda_config_size_ok(c->dilations[i]))
      key = "dilations", v = c->dilations[i];
    if (key != NULL)
      return rda_err_set(err, RDA_ERR_CONFIG,
                         "cfg->%s[%d] = %lld: must be an integer from 1 to 2^40 = %lld "
                         "(RDA_CONFIG_MAX_SIZE)",
                         key, i, v, RDA_CONFIG_MAX_SIZE);
  }
  size_t len = 0;
  int ok = rda_api_append(buf, cap, &len, "return { heads = %d, head_dim = %d, dtype = \"%s\"",
                          c->heads, c->head_dim, c->dtype == RDA_BF16 ? "bf16" : "fp16");
  if (c->kv_heads != 0) ok = ok && rda_api_append(buf, cap, &len, ", kv_heads = %d", c->kv_heads);
  ok = ok && rda_api_append(buf, cap, &len, ", segments = {");
  for (int i = 0; i < c->nbranch; ++i)
    ok = ok && rda_api_append(buf, cap, &len, "%s%lld", i ? ", " : "", c->segments[i]);
  ok = ok && rda_api_append(buf, cap, &len, "}, dilations = {");
  for (int i = 0; i < c->nbranch; ++i)
    ok = ok && rda_api_append(buf, cap, &len, "%s%lld", i ? ", " : "", c->dilations[i]);
  ok = ok && rda_api_append(buf, cap, &len, "}, offsets = \"%s\", causal = %s", offsets[c->offsets],
                            c->causal ? "true" : "false");
  if (c->scale != 0.0) ok = ok && rda_api_append(buf, cap, &len, ", scale = %.17g", c->scale);
  ok = ok && rda_api_append(buf, cap, &len, " }");
  if (!ok) return rda_err_set(err, RDA_ERR_INTERNAL, "rda_plan_create: config text too long");
  return RDA_OK;
}

rda_status rda_plan_create(rda_plan **out, rda_ctx *ctx, const rda_attn_config *cfg,
                           unsigned flags) {
  RDA_TRY(rda_api_plan_args(out, ctx, cfg, flags, "rda_plan_create", "cfg"));
  char chunk[2048];
  rda_err err = {0};
  if (rda_api_config_chunk(cfg, chunk, sizeof chunk, &err) != RDA_OK)
    return rda_api_fail(ctx, &err);
  return rda_api_plan_from(out, ctx, chunk, "rda_attn_config", NULL, flags);
}

rda_status rda_plan_create_from_string(rda_plan **out, rda_ctx *ctx, const char *chunk,
                                       unsigned flags) {
  RDA_TRY(rda_api_plan_args(out, ctx, chunk, flags, "rda_plan_create_from_string", "chunk"));
  return rda_api_plan_from(out, ctx, chunk, "config", NULL, flags);
}

rda_status rda_plan_create_from_file(rda_plan **out, rda_ctx *ctx, const char *path,
                                     unsigned flags) {
  RDA_TRY(rda_api_plan_args(out, ctx, path, flags, "rda_plan_create_from_file", "path"));
  return rda_api_plan_from(out, ctx, NULL, NULL, path, flags);
}

/* Reports a bad plan handle; returns its status. */
rda_status rda_api_bad_plan(const rda_plan *plan, const char *fn) {
  if (plan == NULL) return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT, "%s: plan is NULL", fn);
  return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT,
                       "%s: plan is not a live rda_plan (wrong magic)", fn);
}

rda_status rda_plan_get_config(const rda_plan *plan, rda_attn_config *out) {
  if (!rda_api_plan_ok(plan)) return rda_api_bad_plan(plan, "rda_plan_get_config");
  if (out == NULL)
    return rda_api_failf(plan->ctx, RDA_ERR_INVALID_ARGUMENT, "rda_plan_get_config: out is NULL");
  const rda_config *c = &plan->core->pk.cfg;
  const rda_attn_config init = RDA_CONFIG_INIT;
  *out = init;
  out->heads = c->heads;
  out->kv_heads = c->kv_heads;
  out->head_dim = c->head_dim;
  out->dtype = c->dtype == RDA_DTYPE_FP16 ? RDA_FP16 : RDA_BF16;
  out->nbranch = c->nbranch;
  for (int i = 0; i < c->nbranch; ++i) {
    out->segments[i] = c->segments[i];
    out->dilations[i] = c->dilations[i];
  }
  out->offsets = (rda_offset_rule)c->offsets;
  out->causal = c->causal;
  out->scale = c->scale;
  return RDA_OK;
}

void rda_plan_destroy(rda_plan *plan) {
  if (plan == NULL) return;
  if (plan->magic != RDA_API_PLAN_MAGIC) {
    (void)rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT,
                        "rda_plan_destroy: plan is not a live rda_plan (wrong magic); ignored");
    return;
  }
  rda_ctx *ctx = plan->ctx;
  plan->magic = RDA_API_DEAD_MAGIC;
  pthread_mutex_lock(&ctx->lock);
  plan->core->refs--;
  rda_api_trim_cores(ctx);
  pthread_mutex_unlock(&ctx->lock);
  free(plan);
  atomic_fetch_sub(&ctx->plans, 1);
  rda_api_ctx_release(ctx);
}

/* ---- tensors ----------------------------------------------------------------------------- */

rda_status rda_tensor_contiguous(rda_tensor *t, void *data, rda_dtype dtype, int ndim,
                                 const long long *shape) {
  if (t == NULL)
    return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT, "rda_tensor_contiguous: t is NULL");
  memset(t, 0, sizeof *t);
  if (dtype != RDA_BF16 && dtype != RDA_FP16 && dtype != RDA_FP32)
    return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT,
                         "rda_tensor_contiguous: dtype = %d: must be RDA_BF16, RDA_FP16 or "
                         "RDA_FP32",
                         (int)dtype);
  if (ndim != 3 && ndim != 4)
    return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT,
                         "rda_tensor_contiguous: ndim = %d: must be 3 or 4", ndim);
  if (shape == NULL)
    return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT, "rda_tensor_contiguous: shape is NULL");
  for (int i = 0; i < ndim; ++i)
    if (shape[i] < 0)
      return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT,
                           "rda_tensor_contiguous: shape[%d] = %lld: must be >= 0", i, shape[i]);
  long long s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    t->shape[i] = shape[i];
    t->stride[i] = s;
    if (__builtin_mul_overflow(s, shape[i], &s)) {
      memset(t, 0, sizeof *t);
      return rda_api_failf(NULL, RDA_ERR_INVALID_ARGUMENT,
                           "rda_tensor_contiguous: the shape overflows 64-bit element counts");
    }
  }
  t->data = data;
  t->dtype = dtype;
  t->ndim = ndim;
  return RDA_OK;
}

static const char *rda_api_dtype_name(rda_dtype d) {
  switch (d) {
    case RDA_BF16: return "RDA_BF16";
    case RDA_FP16: return "RDA_FP16";
    case RDA_FP32: return "RDA_FP32";
  }
  return "an unknown dtype";
}

static size_t rda_api_dtype_bytes(rda_dtype d) {
  return d == RDA_FP32 ? 4 : 2;
}

int rda_api_tensor_empty(const rda_tensor *t) {
  for (int i = 0; i < t->ndim && i < 4; ++i)
    if (t->shape[i] == 0) return 1;
  return 0;
}

/* Whether two strided tensors share a byte. Tensors interleaved in one buffer (dq, dk and dv
 * as views of a fused [B, N, 3, H, D] gradient, say) meet in their byte extents but share no
 * element, so the extents alone would refuse a layout frameworks use; the exact question is
 * whether b0 - a0 = sum over strides s of x_s * s for integers x_s in the range the two index
 * boxes allow (a's indices minus b's, the bytes within an element a stride of 1). Strides from
 * dimensions that each step over all smaller ones leave at most two choices per stride, so a
 * short search settles it; past kMeetSearch steps (strides that do not nest) it answers "meet",
 * the safe side. Offsets fit 64 bits (rda_api_check_tensor); 128-bit sums stay exact. */
enum { kMeetDims = 9, kMeetSearch = 4096 };
__extension__ typedef __int128 rda_wide; /* GCC and Clang */

typedef struct rda_api_lattice {
  int n;
  rda_wide s[kMeetDims], lo[kMeetDims], hi[kMeetDims]; /* strides descending, x_s in [lo, hi] */
  rda_wide below_lo[kMeetDims], below_hi[kMeetDims];   /* what the smaller strides reach */
  int steps;
} rda_api_lattice;

static void rda_api_lattice_add(rda_api_lattice *l, rda_wide stride, rda_wide lo, rda_wide hi) {
  if (stride == 0 || (lo == 0 && hi == 0)) return;
  for (int i = 0; i < l->n; ++i)
    if (l->s[i] == stride) { /* two dimensions of one stride: their ranges add */
      l->lo[i] += lo, l->hi[i] += hi;
      return;
    }
  if (l->n == kMeetDims) { /* more strides than two tensors have: cannot tell, so "meet" */
    l->steps = kMeetSearch + 1;
    return;
  }
  int i = l->n++;
  for (; i > 0 && l->s[i - 1] < stride; --i)
    l->s[i] = l->s[i - 1], l->lo[i] = l->lo[i - 1], l->hi[i] = l->hi[i - 1];
  l->s[i] = stride, l->lo[i] = lo, l->hi[i] = hi;
}

static rda_wide rda_api_floor_div(rda_wide a, rda_wide b) { /* b > 0 */
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* 1 when d is reached from level k down (or when the search gives up). */
static int rda_api_lattice_reach(rda_api_lattice *l, int k, rda_wide d) {
  if (k == l->n) return d == 0;
  const rda_wide s = l->s[k];
  rda_wide x0 = -rda_api_floor_div(l->below_hi[k] - d, s); /* ceil((d - below_hi) / s) */
  rda_wide x1 = rda_api_floor_div(d - l->below_lo[k], s);
  if (x0 < l->lo[k]) x0 = l->lo[k];
  if (x1 > l->hi[k]) x1 = l->hi[k];
  for (rda_wide x = x0; x <= x1; ++x) {
    if (++l->steps > kMeetSearch) return 1;
    if (rda_api_lattice_reach(l, k + 1, d - x * s)) return 1;
  }
  return 0;
}

int rda_api_tensors_meet(const rda_tensor *a, const rda_tensor *b) {
  if (rda_api_tensor_empty(a) || rda_api_tensor_empty(b)) return 0;
  const size_t ea = rda_api_dtype_bytes(a->dtype), eb = rda_api_dtype_bytes(b->dtype);
  unsigned long long span_a = 0, span_b = 0;
  for (int i = 0; i < a->ndim; ++i)
    span_a += (unsigned long long)(a->shape[i] - 1) * (unsigned long long)a->stride[i];
  for (int i = 0; i < b->ndim; ++i)
    span_b += (unsigned long long)(b->shape[i] - 1) * (unsigned long long)b->stride[i];
  const rda_wide a0 = (rda_wide)(uintptr_t)a->data, b0 = (rda_wide)(uintptr_t)b->data;
  if (a0 + (rda_wide)((span_a + 1) * ea) <= b0 || b0 + (rda_wide)((span_b + 1) * eb) <= a0)
    return 0; /* extents apart */
  rda_api_lattice l;
  memset(&l, 0, sizeof l);
  for (int i = 0; i < a->ndim; ++i)
    rda_api_lattice_add(&l, (rda_wide)a->stride[i] * (rda_wide)ea, 0, a->shape[i] - 1);
  for (int i = 0; i < b->ndim; ++i)
    rda_api_lattice_add(&l, (rda_wide)b->stride[i] * (rda_wide)eb, -(b->shape[i] - 1), 0);
  rda_api_lattice_add(&l, 1, 0, (rda_wide)ea - 1); /* the bytes of an element */
  rda_api_lattice_add(&l, 1, -((rda_wide)eb - 1), 0);
  for (int k = l.n - 1; k >= 0; --k) {
    const rda_wide lo = k + 1 < l.n ? l.below_lo[k + 1] + l.lo[k + 1] * l.s[k + 1] : 0;
    const rda_wide hi = k + 1 < l.n ? l.below_hi[k + 1] + l.hi[k + 1] * l.s[k + 1] : 0;
    l.below_lo[k] = lo, l.below_hi[k] = hi;
  }
  if (l.steps > kMeetSearch) return 1;
  return rda_api_lattice_reach(&l, 0, b0 - a0);
}


/* Checks one tensor against what the plan needs: dtype (one of two, dt_b may be -1), shape,
 * contiguity of the last dimension, 16-byte row alignment (4 bytes for LSE), non-negative
 * strides, offsets within 64 bits, and for outputs that no two elements share an address. */
rda_status rda_api_check_tensor(const rda_plan *plan, const rda_tensor *t, const rda_api_want *w,
                                int dt_a, int dt_b, rda_err *err) {
  const char *nm = w->name;
  if (t == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", w->fn, nm);
  if ((int)t->dtype != dt_a && (int)t->dtype != dt_b) {
    if (dt_b < 0)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: %s->dtype = %s: the plan needs %s",
                         w->fn, nm, rda_api_dtype_name(t->dtype),
                         rda_api_dtype_name((rda_dtype)dt_a));
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: %s->dtype = %s: the plan needs %s or %s",
                       w->fn, nm, rda_api_dtype_name(t->dtype), rda_api_dtype_name((rda_dtype)dt_a),
                       rda_api_dtype_name((rda_dtype)dt_b));
  }
  if (t->ndim != w->ndim)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: %s->ndim = %d: expected %d (%s %s)",
                       w->fn, nm, t->ndim, w->ndim, nm, w->dims);
  for (int i = 0; i < w->ndim; ++i)
    if (t->shape[i] != w->shape[i]) {
      char want[96];
      if (w->ndim == 4)
        snprintf(want, sizeof want, "[%lld, %lld, %lld, %lld]", w->shape[0], w->shape[1],
                 w->shape[2], w->shape[3]);
      else
        snprintf(want, sizeof want, "[%lld, %lld, %lld]", w->shape[0], w->shape[1], w->shape[2]);
      const int cross = i == 1 && (strcmp(nm, "k") == 0 || strcmp(nm, "v") == 0);
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "%s: %s->shape[%d] = %lld: expected %s %s = %s for this plan "
                         "and q%s",
                         w->fn, nm, i, t->shape[i], nm, w->dims, want,
                         cross ? RDA_CROSS_ATTENTION_NOTE : "");
    }
  /* No elements (a ring rank without rows): nothing is read or written, so neither data nor
   * strides matter (frameworks give empty tensors a NULL pointer). */
  if (rda_api_tensor_empty(t)) return RDA_OK;
  if (t->data == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: %s->data is NULL", w->fn, nm);
  const int last = w->ndim - 1;
  if (t->stride[last] != 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: %s->stride[%d] = %lld: the last dimension must be "
                       "contiguous (stride 1)",
                       w->fn, nm, last, t->stride[last]);
  const size_t esize = rda_api_dtype_bytes(t->dtype);
  const int rows16 = w->ndim == 4; /* rows read or written 16 bytes at a time */
  const long long step = rows16 ? (long long)(16 / esize) : 1;
  if (rows16 ? ((uintptr_t)t->data % 16 != 0) : ((uintptr_t)t->data % esize != 0))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: %s->data = %p: must be %d-byte aligned",
                       w->fn, nm, t->data, rows16 ? 16 : (int)esize);
  long long span = 0;
  for (int i = 0; i < last; ++i) {
    if (t->stride[i] < 0)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: %s->stride[%d] = %lld: must be >= 0",
                         w->fn, nm, i, t->stride[i]);
    if (t->stride[i] % step != 0)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "%s: %s->stride[%d] = %lld: must be a multiple of %lld "
                         "elements (16-byte aligned rows of %s)",
                         w->fn, nm, i, t->stride[i], step, rda_api_dtype_name(t->dtype));
    long long e;
    if (__builtin_mul_overflow(t->shape[i] - 1, t->stride[i], &e) ||
        __builtin_add_overflow(span, e, &span))
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "%s: %s->stride = [%lld, %lld, %lld, ...]: the largest offset "
                         "overflows 64 bits",
                         w->fn, nm, t->stride[0], t->stride[1], t->stride[2]);
  }
  /* And in bytes, from data on: the overlap checks add the byte span to the address. */
  unsigned long long bytes;
  if (__builtin_add_overflow((unsigned long long)span, (unsigned long long)t->shape[last],
                             &bytes) ||
      __builtin_mul_overflow(bytes, (unsigned long long)esize, &bytes) ||
      bytes > (unsigned long long)(UINTPTR_MAX - (uintptr_t)t->data))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: %s->stride = [%lld, %lld, %lld, ...]: the tensor's bytes run past the "
                       "end of the address space",
                       w->fn, nm, t->stride[0], t->stride[1], t->stride[2]);
  if (w->output) {
    /* Dimensions of extent > 1 sorted by stride: each must step over everything below it. */
    int ord[4], n = 0;
    for (int i = 0; i <= last; ++i)
      if (t->shape[i] > 1) ord[n++] = i;
    for (int a = 1; a < n; ++a)
      for (int b = a; b > 0 && t->stride[ord[b]] < t->stride[ord[b - 1]]; --b) {
        const int tmp = ord[b];
        ord[b] = ord[b - 1];
        ord[b - 1] = tmp;
      }
    long long covered = 1; /* elements spanned by the dimensions so far */
    for (int a = 0; a < n; ++a) {
      const int i = ord[a];
      if (t->stride[i] < covered)
        return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                           "%s: %s->stride[%d] = %lld: output elements overlap (an "
                           "output must not alias itself)",
                           w->fn, nm, i, t->stride[i]);
      covered = t->stride[i] * (t->shape[i] - 1) + covered;
    }
  }
  (void)plan;
  return RDA_OK;
}

/* 1 when the bytes t spans (already checked not to overflow) meet [p, p + bytes); an empty
 * tensor spans none. */
int rda_api_ranges_meet(const rda_tensor *t, const void *p, size_t bytes) {
  if (rda_api_tensor_empty(t)) return 0;
  unsigned long long last = 0;
  for (int i = 0; i < t->ndim; ++i)
    last += (unsigned long long)(t->shape[i] - 1) * (unsigned long long)t->stride[i];
  const uintptr_t t0 = (uintptr_t)t->data;
  const uintptr_t t1 = t0 + (uintptr_t)((last + 1) * rda_api_dtype_bytes(t->dtype));
  const uintptr_t p0 = (uintptr_t)p, p1 = p0 + bytes;
  return t0 < p1 && p0 < t1;
}

/* The caller's workspace for fn: there (need > 0), at least need bytes, 16-byte aligned; sizer
 * names the function that reports the size. */
rda_status rda_api_check_workspace(const char *fn, const char *sizer, const void *workspace,
                                   size_t workspace_bytes, size_t need, rda_err *err) {
  if (workspace == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: workspace is NULL: %zu bytes needed (%s)", fn, need, sizer);
  if (workspace_bytes < need)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "%s: workspace_bytes = %zu: too small, %zu needed (%s)", fn, workspace_bytes,
                       need, sizer);
  if ((uintptr_t)workspace % 16 != 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: workspace = %p: must be 16-byte aligned",
                       fn, workspace);
  return RDA_OK;
}

/* The pass tensors' names and shapes: q, k, v, o, lse, dout, dlse, dq, dk, dv. */
static const char *const kTensorNames[10] = {"q",    "k",    "v",  "o",  "lse",
                                             "dout", "dlse", "dq", "dk", "dv"};
/* The message for an output t[i] that meets t[j]. */
static rda_status rda_api_overlap_error(const char *fn, int i, int j, rda_err *err) {
  return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                     "%s: %s and %s share memory: an output must not overlap another argument",
                     fn, kTensorNames[i], kTensorNames[j]);
}

enum { kShapeH, kShapeHkv, kShapeLse }; /* [B, n, H, D], [B, n, Hkv, D], [B, H, n] */
static const int kTensorShape[10] = {kShapeH, kShapeHkv, kShapeHkv, kShapeH,   kShapeLse,
                                     kShapeH, kShapeLse, kShapeH,   kShapeHkv, kShapeHkv};
static const char *const kShapeDims[2][3] = {
    {"[B, N, H, D]", "[B, N, Hkv, D]", "[B, H, N]"},
    {"[B, rows, H, D]", "[B, rows, Hkv, D]", "[B, H, rows]"},
};

/* w[i] for the first count tensors; outputs from index first_out on. */
static void rda_api_wants(const char *fn, int ring, const rda_config *c, long long batch,
                          long long n, int count, int first_out, rda_api_want *w) {
  for (int i = 0; i < count; ++i) {
    const int shape = kTensorShape[i];
    const long long heads = shape == kShapeHkv ? c->kv_heads : c->heads;
    memset(&w[i], 0, sizeof w[i]);
    w[i].fn = fn;
    w[i].name = kTensorNames[i];
    w[i].dims = kShapeDims[ring][shape];
    w[i].ndim = shape == kShapeLse ? 3 : 4;
    w[i].shape[0] = batch;
    w[i].shape[1] = shape == kShapeLse ? c->heads : n;
    w[i].shape[2] = shape == kShapeLse ? n : heads;
    w[i].shape[3] = shape == kShapeLse ? 0 : c->head_dim;
    w[i].output = i >= first_out;
  }
}

rda_status rda_api_check_fwd_tensors(const rda_plan *plan, const char *fn, int ring,
                                     const rda_tensor *const t[5], long long batch, long long n,
                                     rda_err *err) {
  const rda_config *c = &plan->core->pk.cfg;
  const int dt = c->dtype;
  rda_api_want w[5];
  rda_api_wants(fn, ring, c, batch, n, 5, 3, w);
  for (int i = 0; i < 3; ++i) RDA_TRY(rda_api_check_tensor(plan, t[i], &w[i], dt, -1, err));
  RDA_TRY(rda_api_check_tensor(plan, t[3], &w[3], dt, RDA_FP32, err));
  if (t[4] != NULL) RDA_TRY(rda_api_check_tensor(plan, t[4], &w[4], RDA_FP32, -1, err));
  return RDA_OK;
}

rda_status rda_api_check_bwd_tensors(const rda_plan *plan, const char *fn, int ring,
                                     const rda_tensor *const t[10], long long batch, long long n,
                                     rda_err *err) {
  const rda_config *c = &plan->core->pk.cfg;
  static const int dtypes[10] = {-1, -1,       -1,       RDA_FP32, RDA_FP32,
                                 -1, RDA_FP32, RDA_FP32, RDA_FP32, RDA_FP32};
  rda_api_want w[10];
  rda_api_wants(fn, ring, c, batch, n, 10, 7, w);
  for (int i = 0; i < 10; ++i) {
    if (i == 6 && t[6] == NULL) continue; /* dlse is optional */
    RDA_TRY(rda_api_check_tensor(plan, t[i], &w[i], dtypes[i] < 0 ? c->dtype : dtypes[i], -1, err));
  }
  for (int i = 7; i < 10; ++i)
    for (int j = 0; j < 10; ++j)
      if (j != i && t[j] != NULL && rda_api_tensors_meet(t[i], t[j]))
        return rda_api_overlap_error(fn, i, j, err);
  return RDA_OK;
}

/* No tensor of t[count] (NULL: absent) meets [workspace, workspace + need). */
static rda_status rda_api_check_ws_apart(const char *fn, const rda_tensor *const *t, int count,
                                         const void *workspace, size_t need, rda_err *err) {
  for (int i = 0; i < count; ++i)
    if (t[i] != NULL && rda_api_ranges_meet(t[i], workspace, need))
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "%s: workspace overlaps %s: it must be memory of its own", fn,
                         kTensorNames[i]);
  return RDA_OK;
}

rda_status rda_api_check_fwd_apart(const char *fn, const rda_tensor *const t[5],
                                   const void *workspace, size_t need, rda_err *err) {
  /* No output shares a byte with another argument (interleaved layouts in one buffer that
   * share none are fine); the workspace holds no tensor. */
  for (int i = 3; i < 5; ++i)
    for (int j = 0; j < i; ++j)
      if (t[i] != NULL && t[j] != NULL && rda_api_tensors_meet(t[i], t[j]))
        return rda_api_overlap_error(fn, i, j, err);
  return need > 0 ? rda_api_check_ws_apart(fn, t, 5, workspace, need, err) : RDA_OK;
}

rda_status rda_api_check_bwd_apart(const char *fn, const rda_tensor *const t[10],
                                   const void *workspace, size_t need, rda_err *err) {
  return rda_api_check_ws_apart(fn, t, 10, workspace, need, err);
}

size_t rda_api_round_up(size_t x) {
  return (x + RDA_API_WS_ALIGN - 1) / RDA_API_WS_ALIGN * RDA_API_WS_ALIGN;
}

/* Workspace parts: the fp32 O accumulator (contiguous) and the fp32 LSE (contiguous). */
int rda_api_ws_parts(const rda_plan_k *pk, long long batch, long long n, size_t *o_bytes,
                     size_t *lse_bytes) {
  unsigned long long rows, o, l;
  if (__builtin_mul_overflow((unsigned long long)batch, (unsigned long long)n, &rows) ||
      __builtin_mul_overflow(rows, (unsigned long long)pk->cfg.heads, &rows) ||
      __builtin_mul_overflow(rows, (unsigned long long)pk->cfg.head_dim * 4ull, &o) ||
      __builtin_mul_overflow(rows, 4ull, &l) || o > SIZE_MAX / 2 || l > SIZE_MAX / 2)
    return 0;
  *o_bytes = rda_api_round_up((size_t)o);
  *lse_bytes = rda_api_round_up((size_t)l);
  return 1;
}

rda_status rda_plan_workspace_size(const rda_plan *plan, long long batch, long long n,
                                   size_t *bytes) {
  if (bytes != NULL) *bytes = 0;
  if (!rda_api_plan_ok(plan)) return rda_api_bad_plan(plan, "rda_plan_workspace_size");
  rda_ctx *ctx = plan->ctx;
  if (bytes == NULL)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT, "rda_plan_workspace_size: bytes is NULL");
  if (batch < 1 || n < 1)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_plan_workspace_size: batch = %lld, n = %lld: both must be >= 1",
                         batch, n);
  size_t o, l;
  if (!rda_api_ws_parts(&plan->core->pk, batch, n, &o, &l))
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_plan_workspace_size: batch = %lld, n = %lld: the size overflows",
                         batch, n);
  *bytes = o + l;
  return RDA_OK;
}

/* ---- forward ----------------------------------------------------------------------------- */

/* Enqueue the fp32 -> storage dtype cast of the accumulator into the caller's o. */
void rda_api_stream_enter(const rda_ctx *ctx, void *stream) {
  if (ctx->is_cuda) rda_backend_cuda_use_stream(stream);
}

rda_status rda_api_stream_leave(const rda_ctx *ctx, rda_status s, rda_err *err) {
  if (ctx->is_cuda) {
    rda_backend_cuda_own_stream();
    return s;
  }
  rda_err ignored = {0}; /* after a failure too: the caller may reuse the buffers at once */
  const rda_status w = ctx->b->synchronize(ctx->b, s == RDA_OK ? err : &ignored);
  return s != RDA_OK ? s : w;
}

rda_status rda_api_cast(const rda_plan *plan, const float *acc, const long long acc_s[3],
                        const rda_tensor *o, long long batch, long long n, rda_err *err) {
  const rda_plan_k *pk = &plan->core->pk;
  if (pk->cast_kernel < 0 || pk->cast_kernel >= pk->nvariants)
    return rda_err_set(err, RDA_ERR_INTERNAL, "the plan has no cast kernel");
  const rda_variant *v = &pk->variants[pk->cast_kernel];
  rda_cast_params cp;
  memset(&cp, 0, sizeof cp);
  cp.o = acc;
  cp.out = o->data;
  cp.o_sb = acc_s[0], cp.o_sn = acc_s[1], cp.o_sh = acc_s[2];
  cp.out_sb = o->stride[0], cp.out_sn = o->stride[1], cp.out_sh = o->stride[2];
  cp.batch = batch;
  cp.n = n;
  cp.heads = pk->cfg.heads;
  cp.head_dim = pk->cfg.head_dim;
  const long long threads = v->threads > 0 ? v->threads : 256;
  const long long items = batch * n * pk->cfg.heads * (pk->cfg.head_dim / 8);
  long long blocks = (items + threads - 1) / threads;
  if (blocks > 65535) blocks = 65535;
  const unsigned grid[3] = {(unsigned)blocks, 1, 1};
  rda_backend *b = plan->ctx->b;
  return b->launch(b, plan->core->kernels.modules[pk->cast_kernel], grid, (unsigned)threads,
                   (unsigned)v->smem_bytes, &cp, sizeof cp, err);
}

void rda_api_fwd_args(const rda_config *c, long long batch, long long n,
                      const rda_tensor *const t[5], void *o_acc, void *lse_acc, rda_fwd_args *a) {
  const rda_tensor *q = t[0], *k = t[1], *v = t[2], *o = t[3], *lse = t[4];
  memset(a, 0, sizeof *a);
  a->batch = batch;
  a->n = n;
  a->q = q->data, a->k = k->data, a->v = v->data;
  for (int i = 0; i < 3; ++i) {
    a->q_s[i] = q->stride[i];
    a->k_s[i] = k->stride[i];
    a->v_s[i] = v->stride[i];
  }
  if (o->dtype == RDA_FP32) {
    a->o = o->data;
    for (int i = 0; i < 3; ++i) a->o_s[i] = o->stride[i];
  } else {
    a->o = o_acc;
    a->o_s[2] = c->head_dim;
    a->o_s[1] = (long long)c->heads * c->head_dim;
    a->o_s[0] = n * a->o_s[1];
  }
  if (lse != NULL) {
    a->lse = lse->data;
    a->lse_s[0] = lse->stride[0];
    a->lse_s[1] = lse->stride[1];
  } else {
    a->lse = lse_acc;
    a->lse_s[1] = n;
    a->lse_s[0] = (long long)c->heads * n;
  }
}

void rda_api_bwd_args(const rda_tensor *const t[10], long long batch, long long n,
                      rda_bwd_args *a) {
  const rda_tensor *q = t[0], *k = t[1], *v = t[2], *o = t[3], *lse = t[4], *dout = t[5];
  const rda_tensor *dlse = t[6], *dq = t[7], *dk = t[8], *dv = t[9];
  memset(a, 0, sizeof *a);
  a->batch = batch;
  a->n = n;
  a->q = q->data, a->k = k->data, a->v = v->data;
  a->o = o->data;
  a->lse = lse->data;
  a->dout = dout->data;
  a->dlse = dlse != NULL ? dlse->data : NULL;
  a->dq = dq->data, a->dk = dk->data, a->dv = dv->data;
  for (int i = 0; i < 3; ++i) {
    a->q_s[i] = q->stride[i], a->k_s[i] = k->stride[i], a->v_s[i] = v->stride[i];
    a->o_s[i] = o->stride[i], a->do_s[i] = dout->stride[i];
    a->dq_s[i] = dq->stride[i], a->dk_s[i] = dk->stride[i], a->dv_s[i] = dv->stride[i];
  }
  for (int i = 0; i < 2; ++i) {
    a->lse_s[i] = lse->stride[i];
    a->dlse_s[i] = dlse != NULL ? dlse->stride[i] : 0;
  }
  a->deterministic = 1;
}

rda_status rda_forward(const rda_plan *plan, const rda_tensor *q, const rda_tensor *k,
                       const rda_tensor *v, const rda_tensor *o, const rda_tensor *lse,
                       void *workspace, size_t workspace_bytes, void *stream) {
  if (!rda_api_plan_ok(plan)) return rda_api_bad_plan(plan, "rda_forward");
  rda_ctx *ctx = plan->ctx;
  const rda_config *c = &plan->core->pk.cfg;
  rda_err err;
  err.status = RDA_OK;
  err.msg[0] = '\0';
  if (q == NULL) return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT, "rda_forward: q is NULL");
  if (q->ndim != 4)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_forward: q->ndim = %d: expected 4 (q [B, N, H, D])", q->ndim);
  const long long batch = q->shape[0], n = q->shape[1];
  if (batch < 1 || n < 1)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_forward: q->shape = [%lld, %lld, ...]: B and N must be >= 1", batch,
                         n);
  const rda_tensor *const all[5] = {q, k, v, o, lse};
  if (rda_api_check_fwd_tensors(plan, "rda_forward", 0, all, batch, n, &err) != RDA_OK)
    return rda_api_fail(ctx, &err);

  size_t o_bytes, l_bytes;
  if (!rda_api_ws_parts(&plan->core->pk, batch, n, &o_bytes, &l_bytes))
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_forward: q->shape = [%lld, %lld, ...]: the workspace size overflows",
                         batch, n);
  const int o_direct = o->dtype == RDA_FP32;
  /* Layout: [fp32 O accumulator, unless O goes straight to o | fp32 LSE, unless lse is given],
   * as the ring's (api_ring.c): only the parts in use are there. */
  const size_t o_part = o_direct ? 0 : o_bytes;
  const size_t need = o_part + (lse == NULL ? l_bytes : 0);
  if (need > 0) {
    if (rda_api_check_workspace("rda_forward", "rda_plan_workspace_size", workspace,
                                workspace_bytes, need, &err) != RDA_OK)
      return rda_api_fail(ctx, &err);
  }
  if (rda_api_check_fwd_apart("rda_forward", all, workspace, need, &err) != RDA_OK)
    return rda_api_fail(ctx, &err);

  rda_fwd_args a;
  rda_api_fwd_args(c, batch, n, all, workspace, lse == NULL ? (char *)workspace + o_part : NULL,
                   &a);

  rda_api_stream_enter(ctx, stream);
  rda_status s = rda_fwd_run(ctx->b, &plan->core->pk, &plan->core->kernels, &a, &err);
  if (s == RDA_OK && !o_direct) s = rda_api_cast(plan, a.o, a.o_s, o, batch, n, &err);
  s = rda_api_stream_leave(ctx, s, &err);
  return s == RDA_OK ? RDA_OK : rda_api_failf(ctx, err.status, "%s: %s", "rda_forward", err.msg);
}

/* ---- backward ---------------------------------------------------------------------------- */

rda_status rda_plan_backward_workspace_size(const rda_plan *plan, long long batch, long long n,
                                            size_t *bytes) {
  if (bytes != NULL) *bytes = 0;
  if (!rda_api_plan_ok(plan)) return rda_api_bad_plan(plan, "rda_plan_backward_workspace_size");
  rda_ctx *ctx = plan->ctx;
  if (bytes == NULL)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_plan_backward_workspace_size: bytes is NULL");
  if (!rda_api_plan_has_bwd(plan))
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_plan_backward_workspace_size: the plan was created without "
                         "RDA_PLAN_WITH_BACKWARD");
  size_t o, l;
  if (batch < 1 || n < 1 || !rda_api_ws_parts(&plan->core->pk, batch, n, &o, &l))
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_plan_backward_workspace_size: batch = %lld, n = %lld: both must be "
                         ">= 1 and the size must not overflow",
                         batch, n);
  if (n > RDA_BWD_MAX_N)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_plan_backward_workspace_size: n = %lld: the backward takes at most "
                         "2^31 - 1 rows",
                         n);
  *bytes = rda_api_round_up(rda_bwd_workspace_bytes(&plan->core->pk, batch, n));
  return RDA_OK;
}

rda_status rda_backward(const rda_plan *plan, const rda_tensor *q, const rda_tensor *k,
                        const rda_tensor *v, const rda_tensor *o, const rda_tensor *lse,
                        const rda_tensor *dout, const rda_tensor *dlse, const rda_tensor *dq,
                        const rda_tensor *dk, const rda_tensor *dv, void *workspace,
                        size_t workspace_bytes, void *stream) {
  static const char fn[] = "rda_backward";
  if (!rda_api_plan_ok(plan)) return rda_api_bad_plan(plan, fn);
  rda_ctx *ctx = plan->ctx;
  const rda_plan_k *pk = &plan->core->pk;
  if (!rda_api_plan_has_bwd(plan))
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_backward: the plan was created without RDA_PLAN_WITH_BACKWARD");
  rda_err err;
  err.status = RDA_OK;
  err.msg[0] = '\0';
  if (q == NULL) return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT, "rda_backward: q is NULL");
  if (q->ndim != 4)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_backward: q->ndim = %d: expected 4 (q [B, N, H, D])", q->ndim);
  const long long batch = q->shape[0], n = q->shape[1];
  if (batch < 1 || n < 1)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_backward: q->shape = [%lld, %lld, ...]: B and N must be >= 1", batch,
                         n);
  if (n > RDA_BWD_MAX_N)
    return rda_api_failf(ctx, RDA_ERR_INVALID_ARGUMENT,
                         "rda_backward: q->shape[1] = %lld: the backward takes at most 2^31 - 1 "
                         "rows",
                         n);
  const rda_tensor *const t[10] = {q, k, v, o, lse, dout, dlse, dq, dk, dv};
  if (rda_api_check_bwd_tensors(plan, fn, 0, t, batch, n, &err) != RDA_OK)
    return rda_api_fail(ctx, &err);
  const size_t need = rda_api_round_up(rda_bwd_workspace_bytes(pk, batch, n));
  if (rda_api_check_workspace("rda_backward", "rda_plan_backward_workspace_size", workspace,
                              workspace_bytes, need, &err) != RDA_OK)
    return rda_api_fail(ctx, &err);
  if (rda_api_check_bwd_apart(fn, t, workspace, need, &err) != RDA_OK)
    return rda_api_fail(ctx, &err);

  rda_bwd_args a;
  rda_api_bwd_args(t, batch, n, &a);
  a.workspace = workspace;
  rda_api_stream_enter(ctx, stream);
  rda_status s = rda_bwd_run(ctx->b, pk, &plan->core->kernels, &a, &err);
  s = rda_api_stream_leave(ctx, s, &err);
  return s == RDA_OK ? RDA_OK : rda_api_failf(ctx, err.status, "%s: %s", "rda_backward", err.msg);
}
