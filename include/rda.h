/* rda.h — the public C API of librda: ring dilated attention (LongNet) kernels generated and
 * compiled at run time, launched on the caller's device pointers and CUDA stream.
 * Every enum value and struct layout below is pinned: it never changes within a major version. */
#ifndef RDA_H
#define RDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RDA_VERSION_MAJOR 0
#define RDA_VERSION_MINOR 1
#define RDA_VERSION_PATCH 0
#define RDA_VERSION_NUMBER (RDA_VERSION_MAJOR * 10000 + RDA_VERSION_MINOR * 100 + RDA_VERSION_PATCH)
#define RDA_VERSION_STRING "0.1.0"

#if defined(_WIN32)
#define RDA_API
#else
#define RDA_API __attribute__((visibility("default")))
#endif

/* ---- status ------------------------------------------------------------------------------- */

typedef enum {
  RDA_OK = 0,
  RDA_ERR_INVALID_ARGUMENT = 1, /* a NULL, a bad shape, a bad stride, a bad flag */
  RDA_ERR_CONFIG = 2,           /* the attention config failed validation */
  RDA_ERR_NVRTC = 3,            /* run-time compilation failed */
  RDA_ERR_CUDA = 4,             /* a CUDA driver call failed, or no driver */
  RDA_ERR_NCCL = 5,             /* a collective failed */
  RDA_ERR_CACHE = 6,            /* the kernel cache could not be read or written */
  RDA_ERR_IO = 7,               /* a file could not be read or written */
  RDA_ERR_OUT_OF_MEMORY = 8,    /* host or device allocation failed */
  RDA_ERR_UNSUPPORTED = 9,      /* valid, but not supported by this build or device */
  RDA_ERR_INTERNAL = 10,        /* a bug in rda: please report it */
  RDA_ERR_EMULATOR = 11         /* the CPU emulator could not build or run a kernel */
} rda_status;

/* A static, never-NULL name for a status ("RDA_ERR_CONFIG"; "RDA_ERR_UNKNOWN" for other values). */
RDA_API const char *rda_status_string(rda_status s);

/* RDA_VERSION_NUMBER of the library actually linked (compare with the macro to detect a header
 * and library mismatch). */
RDA_API unsigned rda_version(void);

/* ---- thread-safety ------------------------------------------------------------------------
 * - Every function may be called from any thread.
 * - rda_plan_create_* on one context may run concurrently from several threads: the context's
 *   generator is used under its own lock (compilation of different plans is serialized).
 * - rda_forward / rda_backward on one plan may run concurrently from several threads (a plan is
 *   read-only once created), each with its own workspace and outputs.
 * - rda_*_destroy must not run concurrently with any other call on the same handle. A context
 *   may be destroyed before its plans: it lives until its last plan is destroyed.
 * - Calls on one rda_ring (rda_ring_forward, rda_ring_backward) must not overlap: one that
 *   starts while another runs fails with RDA_ERR_INVALID_ARGUMENT and leaves the ring as it was
 *   (rda_ring_abort and rda_ring_get_stats may run beside a call).
 * - A handle must not be used once destroyed (that is undefined behaviour, as for freed memory):
 *   a check of each handle's tag refuses a wrong kind of handle, and often a destroyed one, but
 *   cannot always (its memory may hold a new handle by then).
 * - rda_last_error(ctx) is the context's most recent failure from any thread; with several
 *   threads failing at once on one context, it may describe another thread's call. */

/* ---- handles ------------------------------------------------------------------------------ */

typedef struct rda_ctx rda_ctx;   /* one per device (a GPU, or the CPU emulator) */
typedef struct rda_plan rda_plan; /* one per attention config on a context; holds its kernels */

/* The detail of the last failure on ctx: one line naming the argument or the call that failed,
 * "" when none. A copy owned by the calling thread, valid until its next rda_last_error call
 * (for any context) or its exit, so another thread failing meanwhile cannot change or tear it;
 * never waits for another thread's plan creation.
 * With ctx NULL (or not a context): the last failure of any call on the calling thread, with a
 * context or without one (a failed rda_ctx_create_*, a NULL or foreign handle). Never NULL. */
RDA_API const char *rda_last_error(const rda_ctx *ctx);

/* A context on CUDA GPU `ordinal` (driver API, loaded at run time; no CUDA library is needed to
 * link). Pointers given to this context are CUDA device pointers on that GPU; streams are
 * CUstreams of the device's primary context (the one the CUDA runtime uses), which calls on
 * this context make current on the calling thread. *out is NULL on failure (RDA_ERR_CUDA with
 * no driver or no such GPU). Free with rda_ctx_destroy. */
RDA_API rda_status rda_ctx_create_cuda(rda_ctx **out, int ordinal);

/* A context on the CPU emulator: the same generated kernels, compiled by the host C++ compiler
 * and run on the CPU. "Device" pointers are HOST pointers; launches run to completion before
 * the call returns and the stream argument is ignored. It plans for sm_90. For tests and
 * machines without a GPU; it is slow. *out is NULL on failure. Free with rda_ctx_destroy. */
RDA_API rda_status rda_ctx_create_emulator(rda_ctx **out);

/* Release the caller's reference to ctx; the context is freed when its last plan is gone.
 * Accepts NULL. */
RDA_API void rda_ctx_destroy(rda_ctx *ctx);

/* ---- attention config (SPEC §3) ----------------------------------------------------------- */

typedef enum { RDA_BF16 = 0, RDA_FP16 = 1, RDA_FP32 = 2 } rda_dtype;

/* How a branch's grid offset depends on the head (SPEC §1). */
typedef enum { RDA_OFFSET_MOD = 0, RDA_OFFSET_BLOCK = 1, RDA_OFFSET_GROUP = 2 } rda_offset_rule;

#define RDA_CONFIG_MAX_BRANCHES 16
/* The largest segment length or dilation rate, 2^40: far beyond any sequence, and small enough
 * that positions, grid sizes and ceiling divisions on it cannot overflow int64. */
#define RDA_CONFIG_MAX_SIZE (1LL << 40)

typedef struct rda_attn_config {
  size_t struct_size; /* sizeof(rda_attn_config): set by RDA_CONFIG_INIT, checked */
  unsigned version;   /* RDA_VERSION_NUMBER compiled against: set by RDA_CONFIG_INIT */
  int heads;          /* H: 1 .. 65535 */
  int kv_heads;       /* Hkv dividing H; 0 means H */
  int head_dim;       /* D: 32, 64, 96, 128 or 256 */
  rda_dtype dtype;    /* storage type of Q, K, V: RDA_BF16 or RDA_FP16 */
  int nbranch;        /* k: 1 .. RDA_CONFIG_MAX_BRANCHES */
  long long segments[RDA_CONFIG_MAX_BRANCHES];  /* w_i: 1 .. RDA_CONFIG_MAX_SIZE (first nbranch) */
  long long dilations[RDA_CONFIG_MAX_BRANCHES]; /* r_i, 1 .. RDA_CONFIG_MAX_SIZE */
  rda_offset_rule offsets;                      /* RDA_OFFSET_MOD by default */
  int causal;                                   /* 0 or 1 */
  /* Softmax scale τ; 0 means 1/sqrt(head_dim). Any other finite value of either sign (a
   * negative τ is computed as written) with |scale| * log2(e) <= FLT_MAX (|scale| up to
   * 2.3586574e38): the kernels keep scale * log2(e) as an fp32 constant. The scores scale * <q, k> * log2(e)
   * are formed in fp32 too: where one exceeds FLT_MAX (a huge scale with large inputs), O and
   * LSE are not finite (rdagen run reports such a result as an error and writes nothing). */
  double scale;
} rda_attn_config;

/* Every field zero except the size, the version, dtype RDA_BF16 and offsets RDA_OFFSET_MOD. */
#define RDA_CONFIG_INIT                                                                          \
  {                                                                                              \
    sizeof(rda_attn_config), RDA_VERSION_NUMBER, 0, 0, 0, RDA_BF16, 0, {0}, {0}, RDA_OFFSET_MOD, \
        0, 0.0                                                                                   \
  }

/* ---- plans -------------------------------------------------------------------------------- */

/* What a plan is for (bits, OR-ed): the forward pass always; the backward pass too with
 * RDA_PLAN_WITH_BACKWARD (its kernels are compiled at creation as well). RDA_PLAN_AUTOTUNE:
 * when a kernel of the plan has no usable entry in the tuning databases for the context's
 * target (sm_XX, so an entry made on one sm_90 GPU serves another; emu-sm_90 on the emulator),
 * tune it first, as `rdagen tune` does (every candidate tile checked against the float64
 * reference, then timed at N = twice the longest segment within [1024, 65536], 1024 on the
 * emulator, batch 1), and record the rankings in the user's tuning database, which later plans
 * and other processes read. Plan creation then takes seconds to minutes and host and device
 * memory for that problem, once per target and config shape (entries stay in use across rda
 * versions: `rdagen tune` measures them again); other calls on the context wait for it, and
 * so do other tuners of the same database (they then find the entries). It fails when a kernel has no candidate that passes, when memory runs out, and
 * (RDA_ERR_CACHE or RDA_ERR_IO, naming the path) when the database cannot be written. */
typedef enum {
  RDA_PLAN_FORWARD = 0,
  RDA_PLAN_WITH_BACKWARD = 1,
  RDA_PLAN_AUTOTUNE = 2
} rda_plan_flags;

/* A plan for one attention config on ctx. Validates the config (SPEC §3), generates every kernel
 * the passes in `flags` need and compiles it, or loads it from the kernel cache, so that running
 * never compiles. Each kernel's tile is the one the tuning databases rank first for this GPU
 * (`rdagen tune`; the user's database, $RDA_TUNING_DB or tuning.lua in the cache folder, then
 * the one shipped with rda), else the tile space's first that fits. Plans of one config on one
 * context share their kernels: the database is read when a context first plans a config, and
 * a later change to it reaches that config on a new context; a plan offers only the passes it
 * was created with, whatever another plan of the config asked for. Takes a reference on ctx.
 * *out is NULL on failure: RDA_ERR_CONFIG with the key, the value and what is allowed in
 * rda_last_error(ctx) (or naming the user's tuning database when it does not load or check);
 * RDA_ERR_IO when that database cannot be read; RDA_ERR_NVRTC / RDA_ERR_EMULATOR when a kernel
 * does not compile; RDA_ERR_INVALID_ARGUMENT for a NULL argument, unknown flags, or a cfg whose
 * struct_size is not RDA_CONFIG_INIT's or whose version is not a release of the library's major
 * version up to its own (0, say: a zeroed struct). cfg is only read during the call. Free with
 * rda_plan_destroy. */
RDA_API rda_status rda_plan_create(rda_plan **out, rda_ctx *ctx, const rda_attn_config *cfg,
                                   unsigned flags);

/* The same from a Lua config chunk (SPEC §3: `return { heads = 16, ... }`), run in a sandbox.
 * chunk is NUL-terminated and only read during the call. */
RDA_API rda_status rda_plan_create_from_string(rda_plan **out, rda_ctx *ctx, const char *chunk,
                                               unsigned flags);

/* The same from a Lua config file (RDA_ERR_IO when it cannot be read). */
RDA_API rda_status rda_plan_create_from_file(rda_plan **out, rda_ctx *ctx, const char *path,
                                             unsigned flags);

/* The validated config of a plan, with defaults resolved (kv_heads, scale). */
RDA_API rda_status rda_plan_get_config(const rda_plan *plan, rda_attn_config *out);

/* Free a plan and its kernels, and drop its reference on the context. Work already enqueued
 * with the plan must have completed (synchronize the stream first). Accepts NULL. */
RDA_API void rda_plan_destroy(rda_plan *plan);

/* ---- tensors (SPEC §2) -------------------------------------------------------------------- */

/* A strided view of device memory (host memory on the emulator context). Q, O, dQ, dO are
 * [B, N, H, D]; K, V, dK, dV are [B, N, Hkv, D]; LSE and dLSE are [B, H, N]. Strides are in
 * elements; the last dimension must be contiguous (stride 1). Rows of the 4-dimensional tensors
 * must start at 16-byte boundaries (data 16-byte aligned, strides multiples of 8 elements for
 * 16-bit dtypes, 4 for fp32); LSE and dLSE (fp32, 3 dimensions) need only 4-byte alignment. */
typedef struct rda_tensor {
  void *data;
  rda_dtype dtype;
  int ndim; /* 4, or 3 for LSE */
  long long shape[4];
  long long stride[4];
} rda_tensor;

/* Fill t as a contiguous (row-major) tensor of the given shape over data. Returns
 * RDA_ERR_INVALID_ARGUMENT (t zeroed) for t or shape NULL, an unknown dtype, ndim not 3 or 4, a
 * shape entry < 0, or a shape whose element count overflows 64 bits. A shape entry of 0 makes
 * an empty tensor (a ring rank without rows): its data is never read and may be NULL. */
RDA_API rda_status rda_tensor_contiguous(rda_tensor *t, void *data, rda_dtype dtype, int ndim,
                                         const long long *shape);

/* ---- forward ------------------------------------------------------------------------------ */

/* Bytes of workspace rda_forward needs for batch B and sequence length N (the fp32 O
 * accumulator and the fp32 LSE when the caller asks for neither). Host-only; for a valid plan
 * and B, N >= 1 it fails only when the size overflows size_t. */
RDA_API rda_status rda_plan_workspace_size(const rda_plan *plan, long long batch, long long n,
                                           size_t *bytes);

/* Dilated attention (SPEC §1) of q [B, N, H, D], k and v [B, N, Hkv, D] (the plan's dtype) into
 * o [B, N, H, D] (the plan's dtype, or RDA_FP32) and, when lse is not NULL, lse [B, H, N]
 * (RDA_FP32; -inf for rows no branch covers).
 * - Asynchronous on `stream` (a CUstream given as void *; NULL is the default stream): no host
 *   synchronization and no allocation; outputs are ready when the stream reaches this point.
 *   The emulator context runs to completion before returning and ignores stream.
 * - workspace: rda_plan_workspace_size() bytes of device memory, 16-byte aligned, owned by the
 *   caller; it must not be used by other work until this call's kernels complete. Less is
 *   enough when o is RDA_FP32 (no accumulator) or lse is given; with both, it may be NULL.
 *   Exactly: the fp32 O accumulator's part (unless o is RDA_FP32), then the fp32 LSE's part
 *   (unless lse is given), each 256-byte rounded; rda_plan_workspace_size is both parts.
 * - o, lse and workspace must not overlap each other or q, k, v; q, k, v may alias each other
 *   (e.g. views of one fused QKV tensor). Overlap means sharing a byte: views interleaved in
 *   one buffer that share none are fine (checked exactly where strides nest, as an output's
 *   do). Nothing is freed or retained after the call.
 * RDA_ERR_INVALID_ARGUMENT with the argument named in rda_last_error for a NULL, a shape or
 * dtype that does not match the plan, a misaligned pointer or stride, a tensor whose bytes
 * would run past the end of the address space, an overlap, or a small workspace.
 * RDA_ERR_UNSUPPORTED when a segment holds 2^31 grid rows or more (ceil(min(w_i, N) / r_i);
 * the kernels count them in 32-bit ints). Any batch B >= 1. */
RDA_API rda_status rda_forward(const rda_plan *plan, const rda_tensor *q, const rda_tensor *k,
                               const rda_tensor *v, const rda_tensor *o, const rda_tensor *lse,
                               void *workspace, size_t workspace_bytes, void *stream);

/* ---- backward (plans created with RDA_PLAN_WITH_BACKWARD) ---------------------------------- */

/* Bytes of workspace rda_backward needs for batch B and sequence length N. Host-only. */
RDA_API rda_status rda_plan_backward_workspace_size(const rda_plan *plan, long long batch,
                                                    long long n, size_t *bytes);

/* Gradients of dilated attention (SPEC §1, "Backward, exact"): given the forward's inputs q, k,
 * v (the plan's dtype), its output o [B, N, H, D] in RDA_FP32 (run rda_forward with an RDA_FP32
 * o to train) and lse [B, H, N] (RDA_FP32), and the incoming dout [B, N, H, D] (the plan's dtype)
 * and dlse [B, H, N] (RDA_FP32, or NULL for zero), writes dq [B, N, H, D] and dk, dv
 * [B, N, Hkv, D], all RDA_FP32 and overwritten (not accumulated into). Results are
 * bit-identical run to run. Same stream, workspace, aliasing and checking rules as rda_forward:
 * workspace of rda_plan_backward_workspace_size() bytes; dq, dk, dv and workspace must not
 * overlap each other or any input (views of one fused dQKV gradient buffer, say [B, N, 3, H, D],
 * are fine). N is at most 2^31 - 1 (RDA_ERR_INVALID_ARGUMENT beyond, from the workspace size
 * too). */
RDA_API rda_status rda_backward(const rda_plan *plan, const rda_tensor *q, const rda_tensor *k,
                                const rda_tensor *v, const rda_tensor *o, const rda_tensor *lse,
                                const rda_tensor *dout, const rda_tensor *dlse,
                                const rda_tensor *dq, const rda_tensor *dk, const rda_tensor *dv,
                                void *workspace, size_t workspace_bytes, void *stream);

/* ---- the ring: one attention over P ranks, each holding N/P rows ---------------------------
 * Rank ρ holds only its rows of q, k, v (and of every output): with the contiguous layout rows
 * [lo, hi) of an even split (the first N mod P ranks one row more; with P > N the last P - N
 * ranks own none: rda_ring_rows gives 0 rows and no piece, their tensors are empty, shape
 * [B, 0, H, D], data may be NULL, and they move, hold and compute nothing); with zigzag, the
 * sequence cut into 2P equal chunks, chunks ρ and 2P-1-ρ, in that order. Its tensors are
 * [B, rows, H, D] (k, v, dk, dv: Hkv heads) and [B, H, rows] (lse); its results equal its
 * rows of the single-device rda_forward / rda_backward within SPEC §5. The ring moves only the
 * dilated K/V rows each rank's queries use (and their fp32 gradients back to their owners);
 * memory per rank is O(N/P). Every rank of a ring calls the same functions in the same order,
 * with the same batch B: each call checks that first, and calls that differ between ranks
 * (forward on one, backward on another, or another B) are RDA_ERR_INVALID_ARGUMENT on every
 * rank, naming the first two that differ, before anything is transferred.
 * Failures: a ring call (rda_ring_forward / rda_ring_backward) that fails on one rank, for any
 * reason including a bad argument, aborts the ring: that rank returns its own status, every
 * other rank's pending or next call returns RDA_ERR_NCCL, never a hang. A rank that fails
 * before its pass starts (a bad argument, say), or after its pass ends, says so in the call's
 * agreement (one 8-byte all-gather that every rank makes anyway; it waits there for the
 * others, up to the timeout), so the others fail at once, naming that rank and its status, on
 * NCCL too. A failure inside the pass reaches the others
 * at once with virtual ranks, naming the cause (a rank still returning from rda_ring_create
 * may get it there); over NCCL, which does not carry an abort to the peers, within their
 * timeout (desc.timeout_s), saying what they waited for. An aborted ring stays aborted
 * (every later call fails): destroy it, and its world, and make new ones. A ring call returns
 * RDA_OK only once every rank has reached the end of the same call (a barrier), so all ranks
 * succeed or all fail. Errors are one line in rda_last_error(ctx) of the plan's context (with
 * several ranks failing at once, any one of them; each thread's own failure is in
 * rda_last_error(NULL) too). */

typedef struct rda_ring rda_ring;
/* P virtual ranks in one process (threads, one rda_ring per thread): over host memory on the
 * emulator context, over device memory on a cuda context (all ranks on its GPU). A world serves
 * one ring: each rank joins it once (a second rda_ring_create for the same rank fails). */
typedef struct rda_ring_world rda_ring_world;

typedef enum { RDA_LAYOUT_CONTIGUOUS = 0, RDA_LAYOUT_ZIGZAG = 1 } rda_ring_layout;

/* How one rank joins a ring: exactly one of world, nccl_comm, nccl_unique_id. */
typedef struct rda_ring_desc {
  size_t struct_size;         /* sizeof(rda_ring_desc) */
  long long n;                /* global sequence length N >= 1; with N < P, ranks N .. P-1
                                 hold no rows (empty tensors) but make every call */
  int ranks;                  /* P >= 1 */
  int rank;                   /* 0 .. P-1 */
  rda_ring_layout layout;
  double timeout_s;           /* per ring operation, up to 1e6 s; 0 means 60 s. With a world,
                                 the world's timeout applies (this must still be 0 .. 1e6).
                                 Over NCCL a step waits for the device, so GPU work queued on
                                 the stream before the call counts toward its first step's
                                 timeout */
  rda_ring_world *world;      /* virtual ranks of rda_ring_world_create, or NULL */
  void *nccl_comm;            /* an ncclComm_t of P ranks the caller owns, or NULL. rda never
                                 destroys it; it aborts it when a ring call fails or times out
                                 or the ring is aborted, so that no transfer lands after the
                                 error. ncclCommAbort frees it: after such a failure (and after
                                 an RDA_ERR_NCCL or RDA_ERR_CUDA from rda_ring_create, which
                                 aborts it) the handle is gone: neither use nor destroy it.
                                 After any other status it is the caller's as before. It must
                                 be on the context's device; one still initializing (non-
                                 blocking) is waited for, within the timeout. Otherwise destroy
                                 it after rda_ring_destroy. Make it
                                 non-blocking (ncclConfig_t blocking = 0): in a blocking one
                                 NCCL may wait for a lost peer inside a call, where no timeout
                                 reaches */
  const void *nccl_unique_id; /* 128 bytes of rda_ring_nccl_unique_id from rank 0, or NULL */
  void *comm_stream;          /* CUstream for NCCL transfers; NULL: the ring makes its own */
} rda_ring_desc;

#define RDA_RING_DESC_INIT \
  { sizeof(rda_ring_desc), 0, 0, 0, RDA_LAYOUT_CONTIGUOUS, 0.0, NULL, NULL, NULL, NULL }

/* A world of `ranks` virtual ranks on ctx (1 .. 4096), per-operation timeout in seconds (0: 60 s;
 * at most 1e6). Takes a reference on ctx. *out is NULL on failure. */
RDA_API rda_status rda_ring_world_create(rda_ring_world **out, rda_ctx *ctx, int ranks,
                                         double timeout_s);
/* Every rda_ring of the world must have been destroyed (while one lives, the call records an
 * error and leaves the world alone). Accepts NULL. */
RDA_API void rda_ring_world_destroy(rda_ring_world *world);

/* 128 bytes for desc.nccl_unique_id (RDA_ERR_UNSUPPORTED when built without NCCL; RDA_ERR_NCCL
 * when the NCCL library cannot be loaded). */
RDA_API rda_status rda_ring_nccl_unique_id(void *id);

/* Join the ring as desc->rank: checks that every rank agrees on the config, N, P, the layout, the
 * dtype and the rda version (a mismatch is RDA_ERR_INVALID_ARGUMENT on every rank, never a hang,
 * and leaves a caller's communicator to the caller; a rank that never joins makes the others fail
 * after the timeout, RDA_ERR_NCCL). plan: the config for all ranks (with RDA_PLAN_WITH_BACKWARD for
 * rda_ring_backward); the ring keeps its own reference to the plan's kernels, so the caller may
 * destroy plan first. With a world, the world and the plan must be on the same context; NCCL
 * (nccl_comm or nccl_unique_id) needs a cuda context (RDA_ERR_UNSUPPORTED on the emulator or in a
 * build without NCCL). Blocks until every rank joined (or the timeout). RDA_ERR_INVALID_ARGUMENT,
 * before joining, for: desc NULL or its struct_size wrong, not exactly one of world / nccl_comm /
 * nccl_unique_id, ranks outside 1 .. 4096 or not the world's, rank outside 0 .. P-1, N < 1 or
 * N > 2^40, an unknown layout, zigzag with N % 2P != 0, a timeout negative, not finite or above 1e6
 * (checked with a world too, whose own timeout then applies), a ring whose byte counts would pass
 * 2^63 - 1; and out NULL or plan not a plan. With a world, any such failure of one rank aborts the
 * world, so the other ranks fail at once (RDA_ERR_NCCL naming that rank and why) instead of after
 * the timeout; the world cannot be used again (desc NULL or with a wrong struct_size names no
 * world: then the other ranks fail after their timeout). Over NCCL such a rank still joins, when
 * plan is a plan and desc's struct_size, communicator or unique id, ranks, rank and timeout are
 * sound, but only to tell the others: their rda_ring_create fails at once with
 * RDA_ERR_INVALID_ARGUMENT naming that rank and its status (its own error says why); it waits for
 * them to join (within the timeout), then returns its own status, a caller's communicator left to
 * the caller (should telling fail with an NCCL or CUDA error, which aborts that communicator, the
 * status is that error's instead). A world serves one ring: a second rda_ring_create for a rank
 * that joined it already (while its ring lives, or after) is RDA_ERR_INVALID_ARGUMENT and leaves
 * the world as it was. *out is NULL on failure. */
RDA_API rda_status rda_ring_create(rda_ring **out, rda_plan *plan, const rda_ring_desc *desc);

/* The rank's rows: count, and its pieces [lo[i], hi[i]) of global rows (npieces 1 or 2, or 0
 * for a rank without rows; with zigzag, rank P-1's chunks P-1 and P touch and make one piece;
 * unused entries are 0). Any output may be NULL. */
RDA_API rda_status rda_ring_rows(const rda_ring *ring, long long *rows, int *npieces,
                                 long long lo[2], long long hi[2]);

/* Workspace bytes of rda_ring_forward (backward = 0) or rda_ring_backward (1) for batch B
 * (>= 1; past 65535, the grid's limit, the ring runs one pass per slice of 65535 and its own
 * buffers serve one slice). Forward: rda_plan_workspace_size's parts for the rank's rows (the fp32 O
 * accumulator, the fp32 LSE) and the ring's buffers, each 256-byte aligned, laid out in that
 * order; the parts a call does not use are left out (no accumulator when o is RDA_FP32, no LSE
 * when lse is given), so such calls need less. Backward: rda_backward's workspace for the rows,
 * then the ring's buffers. Host-only. */
RDA_API rda_status rda_ring_workspace_size(const rda_ring *ring, long long batch, int backward,
                                           size_t *bytes);

/* rda_forward over the ring: the same tensors, dtypes, stream, aliasing and checking rules, on
 * this rank's rows (q [B, rows, H, D], ...; lse [B, H, rows]), with rda_ring_workspace_size(
 * ring, B, 0) bytes of workspace (see there for when less is enough, and then NULL is allowed
 * when nothing is needed). A failure on any rank (or the timeout) makes every rank return an
 * error. */
RDA_API rda_status rda_ring_forward(rda_ring *ring, const rda_tensor *q, const rda_tensor *k,
                                    const rda_tensor *v, const rda_tensor *o,
                                    const rda_tensor *lse, void *workspace,
                                    size_t workspace_bytes, void *stream);

/* rda_backward over the ring, on this rank's rows: dq from local work, dk and dv including the
 * contributions of the other ranks' queries (returned to this rank in fp32). o and lse are this
 * rank's rda_ring_forward outputs (RDA_FP32 o). Workspace: rda_ring_workspace_size(ring, B, 1)
 * bytes; the other rules are rda_backward's. */
RDA_API rda_status rda_ring_backward(rda_ring *ring, const rda_tensor *q, const rda_tensor *k,
                                     const rda_tensor *v, const rda_tensor *o,
                                     const rda_tensor *lse, const rda_tensor *dout,
                                     const rda_tensor *dlse, const rda_tensor *dq,
                                     const rda_tensor *dk, const rda_tensor *dv, void *workspace,
                                     size_t workspace_bytes, void *stream);

/* What the ring moved and held on this rank in its last forward or backward call (zeros but
 * rows before the first). */
typedef struct rda_ring_stats {
  long long rows;
  unsigned long long bytes_sent, bytes_received;
  unsigned long long peak_bytes; /* the most memory the ring itself held at once */
} rda_ring_stats;
RDA_API rda_status rda_ring_get_stats(const rda_ring *ring, rda_ring_stats *out);

/* Make every rank's pending and later ring calls fail with `reason` (any thread, also while
 * this rank's call runs; not concurrently with rda_ring_destroy of the same ring). */
RDA_API void rda_ring_abort(rda_ring *ring, const char *reason);

/* Leave the ring and drop its plan reference; the ring's work must have completed (on a cuda
 * context: synchronize the stream first). With a world, the others' pending and later ring
 * calls (each needs every rank) then fail at once, naming this rank, not by their timeout. A
 * rank that leaves with transfers pending aborts the ring. Over a communicator rda made (nccl_unique_id), leaving finalizes it, which NCCL makes a
 * collective of the ranks on one node: destroy the ranks' rings together (a rank that leaves
 * alone waits for the others up to the timeout, then aborts). Accepts NULL. */
RDA_API void rda_ring_destroy(rda_ring *ring);

#ifdef __cplusplus
}
#endif
#endif /* RDA_H */
