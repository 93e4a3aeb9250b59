/* api_internal.h — what the public API's files share (runtime/api.c, runtime/api_ring.c): the
 * context and plan structs behind the opaque handles, error recording, and the boundary checks
 * of tensors and workspaces, so the ring calls apply exactly the rules of rda_forward and
 * rda_backward. Not installed; not part of rda.h. */
#ifndef RDA_API_SHARED_H
#define RDA_API_SHARED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "bwd.h"
#include "err.h"
#include "fwd.h"
#include "gen.h"
#include "rda.h"

enum {
  RDA_API_CTX_MAGIC = 0x52444143,  /* "RDAC" */
  RDA_API_PLAN_MAGIC = 0x5244504c, /* "RDPL" */
  RDA_API_DEAD_MAGIC = 0x44454144, /* "DEAD": a destroyed handle */
  RDA_API_MSG_LEN = 1024,
  RDA_API_WS_ALIGN = 256 /* each workspace part starts at a 256-byte boundary */
};

/* What plans of one config share on a context: the validated config, the kernel plan and the
 * loaded kernels. Found again by the config text it was made from or by the validated config,
 * so creating a plan that a context has seen costs no Lua and no loading. */
typedef struct rda_api_core {
  struct rda_api_core *next;
  int refs;       /* plans using it (under the context's lock) */
  unsigned flags; /* RDA_PLAN_* passes its kernels serve */
  char *text;     /* the config chunk it was made from, or NULL (from a file) */
  rda_plan_k pk;
  rda_fwd_kernels kernels;
} rda_api_core;

struct rda_ctx {
  uint32_t magic;
  atomic_int refs; /* the caller's reference + one per live plan or ring world */
  atomic_int plans;
  atomic_int closed; /* rda_ctx_destroy was called: no new plans */
  int is_cuda;
  int dry; /* launches do nothing (rda_api_ctx_create_dry) */
  rda_backend *b;
  rda_gen *gen; /* used under lock */
  rda_hw hw;
  pthread_mutex_t lock; /* gen and cores (held through a whole plan build) */
  rda_api_core *cores;  /* newest first */
  /* last_error has a lock of its own, held only to copy it: reading or recording a message
   * never waits for a plan build on another thread. */
  pthread_mutex_t err_lock;
  char last_error[RDA_API_MSG_LEN];
};

struct rda_plan {
  uint32_t magic;
  rda_ctx *ctx;
  rda_api_core *core; /* shared by the plans of one config: it may hold more than they asked */
  unsigned flags;     /* what this plan was created with (RDA_PLAN_*) */
};

/* The plan was created with RDA_PLAN_WITH_BACKWARD (its core may have backward kernels for
 * another plan of the config; this one does not offer them). */
static inline int rda_api_plan_has_bwd(const rda_plan *p) {
  return (p->flags & RDA_PLAN_WITH_BACKWARD) != 0;
}

/* A context's memory (it may be closed: destroyed by the caller, alive for its plans). */
static inline int rda_api_ctx_ok(const rda_ctx *ctx) {
  return ctx != NULL && ctx->magic == RDA_API_CTX_MAGIC;
}
/* A context the caller still owns. */
static inline int rda_api_ctx_open(const rda_ctx *ctx) {
  return rda_api_ctx_ok(ctx) && !atomic_load(&((rda_ctx *)(uintptr_t)ctx)->closed);
}
static inline int rda_api_plan_ok(const rda_plan *p) {
  return p != NULL && p->magic == RDA_API_PLAN_MAGIC && rda_api_ctx_ok(p->ctx);
}

/* Record err (status and message) on ctx (when usable) and on the calling thread; returns the
 * status (RDA_ERR_INTERNAL when err holds none). */
rda_status rda_api_fail(rda_ctx *ctx, const rda_err *err);
rda_status rda_api_failf(rda_ctx *ctx, rda_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Reports a NULL or foreign plan handle given to fn; returns its status. */
rda_status rda_api_bad_plan(const rda_plan *plan, const char *fn);

/* Drop one reference on ctx (a plan's, a ring world's, or the caller's); frees it at zero. */
void rda_api_ctx_release(rda_ctx *ctx);
/* One more plan handle on core (which gains a reference, as does ctx) offering flags (those
 * the core was built with, or fewer). ctx->lock held. */
rda_status rda_api_plan_wrap(rda_ctx *ctx, rda_api_core *core, unsigned flags, rda_plan **out,
                             rda_err *err);

/* What a call needs of one tensor argument. */
typedef struct rda_api_want {
  const char *fn;   /* "rda_forward", "rda_ring_backward", ... */
  const char *name; /* "q", "k", ... as the caller knows them */
  const char *dims; /* "[B, N, H, D]" */
  int ndim;
  long long shape[4];
  int output; /* 1: written by the call: its elements must not overlap */
} rda_api_want;

/* 1 when t has no elements (a dimension of extent 0: a ring rank without rows). */
int rda_api_tensor_empty(const rda_tensor *t);
/* Checks one tensor against w: dtype (dt_a, or dt_b unless it is -1), shape, contiguity of the
 * last dimension, 16-byte row alignment (4 bytes for LSE), non-negative strides, offsets
 * within 64 bits, and for outputs that no two elements share an address; of an empty tensor
 * only dtype and shape (its data may be NULL). */
rda_status rda_api_check_tensor(const rda_plan *plan, const rda_tensor *t, const rda_api_want *w,
                                int dt_a, int dt_b, rda_err *err);
/* The tensors of a pass for fn over batch x n rows, which the messages call N (ring 0: the
 * whole sequence) or rows (ring 1: a rank's rows). Forward: t = {q, k, v, o, lse}, lse may be
 * NULL; q, k, v in the plan's dtype, o in it or fp32, lse fp32. Backward: t = {q, k, v, o, lse,
 * dout, dlse, dq, dk, dv}, dlse may be NULL; o, lse, dlse and the gradients fp32; and no
 * gradient is the same memory as another argument. */
rda_status rda_api_check_fwd_tensors(const rda_plan *plan, const char *fn, int ring,
                                     const rda_tensor *const t[5], long long batch, long long n,
                                     rda_err *err);
rda_status rda_api_check_bwd_tensors(const rda_plan *plan, const char *fn, int ring,
                                     const rda_tensor *const t[10], long long batch, long long n,
                                     rda_err *err);
/* The forward's outputs (t as above) are not the memory of an earlier argument, and when need
 * > 0 none of t meets the workspace's first need bytes. */
rda_status rda_api_check_fwd_apart(const char *fn, const rda_tensor *const t[5],
                                   const void *workspace, size_t need, rda_err *err);
/* None of the backward's tensors t (as above) meets the workspace's first need bytes. */
rda_status rda_api_check_bwd_apart(const char *fn, const rda_tensor *const t[10],
                                   const void *workspace, size_t need, rda_err *err);
/* 1 when the bytes t spans (already checked not to overflow) meet [p, p + bytes); an empty
 * tensor spans none. */
int rda_api_ranges_meet(const rda_tensor *t, const void *p, size_t bytes);
/* 1 when tensors a and b (each checked by rda_api_check_tensor) share a byte: exact for
 * strides that nest, interleaved views of one buffer included; "meet" where it cannot tell
 * quickly (strides that do not nest). */
int rda_api_tensors_meet(const rda_tensor *a, const rda_tensor *b);
/* The caller's workspace for fn: there, at least need bytes, 16-byte aligned; sizer names the
 * function that reports the size. */
rda_status rda_api_check_workspace(const char *fn, const char *sizer, const void *workspace,
                                   size_t workspace_bytes, size_t need, rda_err *err);
/* x rounded up to RDA_API_WS_ALIGN. */
size_t rda_api_round_up(size_t x);
/* The forward's workspace parts for batch x n rows: the fp32 O accumulator and the fp32 LSE,
 * both contiguous and rounded up; 0 when the sizes overflow. */
int rda_api_ws_parts(const rda_plan_k *pk, long long batch, long long n, size_t *o_bytes,
                     size_t *lse_bytes);
/* rda_fwd_run's arguments for t = {q, k, v, o, lse} (already checked) over batch x n rows: O
 * into o when it is fp32, else into the contiguous fp32 accumulator at o_acc; LSE into lse, or
 * when it is NULL into the contiguous fp32 rows at lse_acc. c: the plan's config. */
void rda_api_fwd_args(const rda_config *c, long long batch, long long n,
                      const rda_tensor *const t[5], void *o_acc, void *lse_acc, rda_fwd_args *a);
/* rda_bwd_run's arguments for t = {q, k, v, o, lse, dout, dlse, dq, dk, dv} (already checked;
 * dlse may be NULL) over batch x n rows; workspace NULL, deterministic = 1. */
void rda_api_bwd_args(const rda_tensor *const t[10], long long batch, long long n, rda_bwd_args *a);
/* Enqueue the fp32 -> storage dtype cast of acc (strides acc_s) into o, batch x n rows. */
rda_status rda_api_cast(const rda_plan *plan, const float *acc, const long long acc_s[3],
                        const rda_tensor *o, long long batch, long long n, rda_err *err);
/* Around a pass's launches: on a cuda context they go to the caller's stream (enter) until
 * leave; on the emulator context leave waits for them, as the call must return with its work
 * done (rda.h; it matters with asynchronous emulator streams, runtime/emu_streams.h), after a
 * failure too. leave returns s, or the wait's failure when s is RDA_OK. */
void rda_api_stream_enter(const rda_ctx *ctx, void *stream);
rda_status rda_api_stream_leave(const rda_ctx *ctx, rda_status s, rda_err *err);

#endif
