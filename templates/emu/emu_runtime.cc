/* emu_runtime.cc — the CPU emulator's execution model, built once per cache key into its own
 * shared object that emulated kernel modules link against at load time: every CUDA thread of a
 * block is a fiber (own stack, hand-written context switch), blocks spread over OS threads. */
#include "emu_runtime.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define RDA_EMU_ASAN 1
#else
#define RDA_EMU_ASAN 0
#endif

/* The fast path is a hand-written switch (callee-saved registers + stack pointer) for x86-64
 * and AArch64; anything else falls back to ucontext (correct, but swapcontext makes a syscall
 * per switch). RDA_EMU_UCONTEXT forces the fallback. */
#if defined(__x86_64__) && !defined(RDA_EMU_UCONTEXT)
#define RDA_EMU_ASM_SWITCH 1
#elif defined(__aarch64__) && !defined(RDA_EMU_UCONTEXT)
#define RDA_EMU_ASM_SWITCH 2
#else
#define RDA_EMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

#if RDA_EMU_ASM_SWITCH
/* rda_emu_switch_ctx(save, load): saves the callee-saved registers on the current stack,
 * stores the stack pointer to *save, loads the stack pointer from load, restores the registers
 * saved there and returns into that context. A fresh context's stack holds the fiber and its
 * entry function in two callee-saved registers and the trampoline as return address; the
 * trampoline calls entry(fiber), which never returns. */
extern "C" void rda_emu_switch_ctx(void **save_sp, void *load_sp);
extern "C" void rda_emu_fiber_trampoline();
#endif

#if RDA_EMU_ASM_SWITCH == 1
/* x86-64 SysV: rbp, rbx, r12-r15 (6 pushes); fresh: r12 = fiber, r13 = entry. */
__asm__(
    ".text\n"
    ".hidden rda_emu_switch_ctx\n"
    ".globl rda_emu_switch_ctx\n"
    ".type rda_emu_switch_ctx,@function\n"
    "rda_emu_switch_ctx:\n"
    "  .cfi_startproc\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size rda_emu_switch_ctx, .-rda_emu_switch_ctx\n"
    ".hidden rda_emu_fiber_trampoline\n"
    ".globl rda_emu_fiber_trampoline\n"
    ".type rda_emu_fiber_trampoline,@function\n"
    "rda_emu_fiber_trampoline:\n"
    "  .cfi_startproc\n"
    "  .cfi_undefined rip\n"
    "  xorl %ebp, %ebp\n"
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n"
    "  .cfi_endproc\n"
    ".size rda_emu_fiber_trampoline, .-rda_emu_fiber_trampoline\n");
#elif RDA_EMU_ASM_SWITCH == 2
/* AAPCS64: x19-x28, x29 (fp), x30 (lr), d8-d15 in a 176-byte frame; fresh: x19 = fiber,
 * x20 = entry, x30 = the trampoline. */
__asm__(
    ".text\n"
    ".p2align 2\n"
    ".hidden rda_emu_switch_ctx\n"
    ".globl rda_emu_switch_ctx\n"
    ".type rda_emu_switch_ctx,%function\n"
    "rda_emu_switch_ctx:\n"
    "  sub sp, sp, #176\n"
    "  stp x19, x20, [sp, #0]\n"
    "  stp x21, x22, [sp, #16]\n"
    "  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n"
    "  stp x27, x28, [sp, #64]\n"
    "  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n"
    "  stp d10, d11, [sp, #112]\n"
    "  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x9, sp\n"
    "  str x9, [x0]\n"
    "  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n"
    "  ldp x21, x22, [sp, #16]\n"
    "  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n"
    "  ldp x27, x28, [sp, #64]\n"
    "  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n"
    "  ldp d10, d11, [sp, #112]\n"
    "  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #176\n"
    "  ret\n"
    ".size rda_emu_switch_ctx, .-rda_emu_switch_ctx\n"
    ".p2align 2\n"
    ".hidden rda_emu_fiber_trampoline\n"
    ".globl rda_emu_fiber_trampoline\n"
    ".type rda_emu_fiber_trampoline,%function\n"
    "rda_emu_fiber_trampoline:\n"
    "  .cfi_startproc\n"
    "  .cfi_undefined x30\n"
    "  mov x29, #0\n"
    "  mov x0, x19\n"
    "  blr x20\n"
    "  brk #0\n"
    "  .cfi_endproc\n"
    ".size rda_emu_fiber_trampoline, .-rda_emu_fiber_trampoline\n");
#endif

namespace rda_emu {
namespace detail {

constexpr int kMaxThreads = 1024;
constexpr size_t kStackBytes = 256 * 1024;  /* per fiber: room for -O0 / ASan frames */
constexpr size_t kGuardBytes = 4096;        /* PROT_NONE below each stack */
constexpr unsigned char kSmemPoison = 0xff; /* NaN in bf16, fp16 and fp32 */

struct ThreadIdx {
  unsigned x, y, z;
};

/* What a fiber is doing: set when it blocks or exits, reset by itself when it resumes (for the
 * deadlock report; readiness itself is the warps' runnable masks). */
enum class State : unsigned char { Runnable, WaitBarrier, WaitWarp, Done };

/* A saved execution context. */
struct Ctx {
#if RDA_EMU_ASM_SWITCH
  void *sp = nullptr;
#else
  ucontext_t uc;
#endif
#if RDA_EMU_ASAN
  void *fake_stack = nullptr;
  const void *stack_bottom = nullptr;
  size_t stack_size = 0;
#endif
};

struct CpCopy {
  void *dst;
  const void *src;
  bool valid;
};

/* The storage of thread_state (one per fiber) and block_state (one per worker's block):
 * zero-filled and live from the first request in a block, the same size on every later one,
 * its exit hook run once by finish(). */
struct ModelStore {
  std::vector<unsigned char> data;
  size_t bytes = 0;
  bool live = false;
  void (*exit)(void *) = nullptr;

  void *get(size_t n, size_t max, void (*on_exit)(void *), const char *who);
  void finish() {
    if (live && exit != nullptr) exit(data.data());
    reset();
  }
  void reset() {
    live = false;
    exit = nullptr;
  }
};

struct Fiber {
  Ctx ctx;
  unsigned char *stack_lo = nullptr; /* lowest usable byte; the stack grows down from +size */
  ThreadIdx tid{0, 0, 0};
  int lane = 0, warp = 0;
  State state = State::Runnable;
  /* cp.async: queued copies; committed groups end at cp_groups[i] (indices into cp). */
  std::vector<CpCopy> cp;
  size_t cp_head = 0;
  std::vector<size_t> cp_groups;
  size_t group_head = 0;
  ModelStore model; /* thread_state's */
  /* Shared-memory chunks (index = offset / 16) this thread's cp.async wrote since its last
   * fence_proxy_async_shared: a superset of the Worker::proxy_mark entries holding its mark. */
  std::vector<uint32_t> unfenced;
};

/* A warp's collective slots, double-buffered by generation parity: collective n + 1 cannot be
 * completed (and collective n + 2, which reuses n's buffer, cannot begin) before every lane has
 * come back from collective n, so a deposit is never overwritten while still being read. */
struct Warp {
  int size = 32;
  int arrived = 0;
  unsigned gen = 0;
  unsigned runnable = 0; /* lanes ready to run (not the one running) */
  size_t bytes[2] = {0, 0};
  alignas(64) unsigned char slots[2][32 * kGatherSlot];
};

/* One launch, shared by the OS threads working on it. */
struct Launch {
  rda_emu_launch *l = nullptr;
  const void *params = nullptr;
  void (*body)(const void *) = nullptr;
  long long nblocks = 0;
  std::atomic<long long> next_block{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
};

/* One OS thread's emulation state. The resources (stacks, fibers, shared memory) are pooled and
 * reused by later launches (of any kernel module: they all share this runtime). */
struct Worker {
  /* resources */
  unsigned char *region = nullptr; /* fiber stacks with guard pages */
  size_t region_bytes = 0;
  int fiber_capacity = 0;
  std::vector<Fiber> fibers;
  Warp warps[kMaxThreads / 32];
  unsigned char *smem = nullptr;
  size_t smem_capacity = 0;
  /* Per 16-byte chunk of smem: 1 + the linear index of the thread whose cp.async last wrote it
   * through the generic proxy and has not executed fence.proxy.async since; 0: none. Every
   * nonzero entry is in its writer's Fiber::unfenced (cleared from there at block start). */
  std::vector<uint16_t> proxy_mark;
  bool stacks_dirty = false; /* a block was abandoned mid-flight (ASan shadow to reset) */
  /* the launch and block being run */
  Launch *launch = nullptr;
  ThreadIdx block_idx{0, 0, 0}, block_dim{1, 1, 1}, grid_dim{1, 1, 1};
  int nthreads = 0, nwarps = 0;
  int barrier_arrived = 0;
  int live = 0;
  size_t smem_bytes = 0;
  ModelStore block_model; /* block_state's */
  Fiber *cur = nullptr;
  Ctx main;

  ~Worker() {
    if (region != nullptr) munmap(region, region_bytes);
    std::free(smem);
  }
};

/* The OS thread's worker while it runs a launch. initial-exec: one pointer, no __tls_get_addr. */
static thread_local Worker *tls_worker __attribute__((tls_model("initial-exec"))) = nullptr;

/* ------------------------------------------------------------------ errors */

static void fail(Launch *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(Launch *L, const char *fmt, ...) {
  char buf[sizeof L->l->err];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> g(L->mu);
  if (L->failed.load(std::memory_order_relaxed)) return;
  std::memcpy(L->l->err, buf, sizeof buf);
  L->failed.store(true, std::memory_order_release);
}

/* ------------------------------------------------------------------ context switching */

/* Switch from `from` (the running context) to `to`. from_dies: `from` is never resumed. */
static void jump(Ctx *from, Ctx *to, bool from_dies) {
#if RDA_EMU_ASAN
  __sanitizer_start_switch_fiber(from_dies ? nullptr : &from->fake_stack, to->stack_bottom,
                                 to->stack_size);
#else
  (void)from_dies;
#endif
#if RDA_EMU_ASM_SWITCH
  rda_emu_switch_ctx(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
#if RDA_EMU_ASAN
  __sanitizer_finish_switch_fiber(from->fake_stack, nullptr, nullptr);
#endif
}

[[noreturn]] static void fiber_main(Fiber *f);

#if RDA_EMU_ASM_SWITCH
static void fiber_entry_c(void *arg) {
  fiber_main(static_cast<Fiber *>(arg));
}
#else
static void fiber_entry_uc(unsigned lo, unsigned hi) {
  const uintptr_t p = (static_cast<uintptr_t>(hi) << 32) | lo;
  fiber_main(reinterpret_cast<Fiber *>(p));
}
#endif

/* Prepare f to start at fiber_main on its own stack. */
static void fiber_init(Fiber *f) {
#if RDA_EMU_ASAN
  f->ctx.fake_stack = nullptr;
  f->ctx.stack_bottom = f->stack_lo;
  f->ctx.stack_size = kStackBytes;
#endif
#if RDA_EMU_ASM_SWITCH
  const uintptr_t top = reinterpret_cast<uintptr_t>(f->stack_lo + kStackBytes) & ~uintptr_t(15);
  void (*entry)(void *) = fiber_entry_c;
#endif
#if RDA_EMU_ASM_SWITCH == 1
  /* From the top: padding, the trampoline (ret target), rbp, rbx, r12, r13, r14, r15. After
   * the ret, rsp is 16-byte aligned, as the trampoline's call expects. */
  void **sp = reinterpret_cast<void **>(top - 72);
  std::memset(sp, 0, 72);
  sp[2] = reinterpret_cast<void *>(entry);                     /* r13 */
  sp[3] = f;                                                   /* r12 */
  sp[6] = reinterpret_cast<void *>(&rda_emu_fiber_trampoline); /* return address */
  f->ctx.sp = sp;
#elif RDA_EMU_ASM_SWITCH == 2
  /* The 176-byte frame rda_emu_switch_ctx restores: x19, x20, ..., x29, x30, d8..d15. */
  void **sp = reinterpret_cast<void **>(top - 176);
  std::memset(sp, 0, 176);
  sp[0] = f;                                                    /* x19 */
  sp[1] = reinterpret_cast<void *>(entry);                      /* x20 */
  sp[11] = reinterpret_cast<void *>(&rda_emu_fiber_trampoline); /* x30 */
  f->ctx.sp = sp;
#else
  getcontext(&f->ctx.uc);
  f->ctx.uc.uc_stack.ss_sp = f->stack_lo;
  f->ctx.uc.uc_stack.ss_size = kStackBytes;
  f->ctx.uc.uc_link = nullptr;
  const uintptr_t p = reinterpret_cast<uintptr_t>(f);
  makecontext(&f->ctx.uc, reinterpret_cast<void (*)()>(fiber_entry_uc), 2,
              static_cast<unsigned>(p & 0xffffffffu), static_cast<unsigned>(p >> 32));
#endif
}

/* ------------------------------------------------------------------ scheduling */

static unsigned lane_mask(int size) {
  return size >= 32 ? 0xffffffffu : (1u << size) - 1u;
}

/* The next fiber to run after f blocks or exits. In index order (the default): a ready lane of
 * f's own warp first (in lane order after f), else the first ready lane of the following warps.
 * In reverse (RDA_EMU_ORDER=reverse) the mirror image: the lanes before f, downwards, else the
 * last ready lane of the preceding warps. Either is a schedule a GPU may take. A fiber runs
 * alone between two blocking points, so threads that share data without a barrier between
 * the write and the read see it in one order and miss it in the other: a kernel that gives
 * the same result both ways has no such race between two of its threads. nullptr: none is
 * ready. */
static Fiber *pick_next(Worker *w, const Fiber *f) {
  const bool reverse = w->launch->l->order != 0;
  Warp *wp = &w->warps[f->warp];
  unsigned m = wp->runnable;
  if (m != 0) {
    int lane;
    if (!reverse) {
      const int s = (f->lane + 1) & 31;
      const unsigned rot = s != 0 ? (m >> s) | (m << (32 - s)) : m;
      lane = (s + __builtin_ctz(rot)) & 31;
    } else { /* from lane s = f->lane - 1 downwards: s rotated to bit 31, the highest set bit */
      const int s = (f->lane + 31) & 31, k = 31 - s;
      const unsigned rot = k != 0 ? (m << k) | (m >> (32 - k)) : m;
      lane = ((31 - __builtin_clz(rot)) + s + 1) & 31;
    }
    wp->runnable &= ~(1u << lane);
    return &w->fibers[static_cast<size_t>(f->warp) * 32 + static_cast<size_t>(lane)];
  }
  for (int i = 1; i < w->nwarps; ++i) {
    int j = reverse ? f->warp - i : f->warp + i;
    if (j >= w->nwarps) j -= w->nwarps;
    if (j < 0) j += w->nwarps;
    m = w->warps[j].runnable;
    if (m != 0) {
      const int lane = reverse ? 31 - __builtin_clz(m) : __builtin_ctz(m);
      w->warps[j].runnable &= ~(1u << lane);
      return &w->fibers[static_cast<size_t>(j) * 32 + static_cast<size_t>(lane)];
    }
  }
  return nullptr;
}

static void report_deadlock(Worker *w) {
  int at_barrier = 0, at_warp = 0, exited = 0;
  for (int i = 0; i < w->nthreads; ++i) {
    switch (w->fibers[static_cast<size_t>(i)].state) {
      case State::WaitBarrier: ++at_barrier; break;
      case State::WaitWarp: ++at_warp; break;
      case State::Done: ++exited; break;
      case State::Runnable: break;
    }
  }
  fail(w->launch,
       "deadlock in block (%u,%u,%u): of %d threads, %d wait at __syncthreads, %d at a warp "
       "collective, %d exited (every thread must reach each barrier, every lane of a warp each "
       "collective)",
       w->block_idx.x, w->block_idx.y, w->block_idx.z, w->nthreads, at_barrier, at_warp, exited);
}

/* Leave the running fiber f for good and return to the OS thread's scheduler loop. */
[[noreturn]] static void abandon_block(Worker *w, Fiber *f) {
  w->stacks_dirty = true;
  w->cur = nullptr;
  jump(&f->ctx, &w->main, true);
  __builtin_unreachable();
}

/* f has just blocked (its state says on what): run someone else until f is made ready again. */
static void wait_here(Worker *w, Fiber *f) {
  Fiber *n = pick_next(w, f);
  if (n == nullptr) {
    report_deadlock(w);
    abandon_block(w, f);
  }
  w->cur = n;
  jump(&f->ctx, &n->ctx, false);
}

[[noreturn]] static void fiber_main(Fiber *f) {
#if RDA_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  Worker *w = tls_worker;
  try {
    w->launch->body(w->launch->params);
    f->model.finish();
  } catch (const std::exception &e) {
    fail(w->launch, "block (%u,%u,%u) thread (%u,%u,%u): C++ exception: %s", w->block_idx.x,
         w->block_idx.y, w->block_idx.z, f->tid.x, f->tid.y, f->tid.z, e.what());
    abandon_block(w, f);
  } catch (...) {
    fail(w->launch, "block (%u,%u,%u) thread (%u,%u,%u): C++ exception", w->block_idx.x,
         w->block_idx.y, w->block_idx.z, f->tid.x, f->tid.y, f->tid.z);
    abandon_block(w, f);
  }
  f->state = State::Done;
  f->cp.clear(); /* copies never waited for are dropped */
  f->cp_groups.clear();
  f->cp_head = f->group_head = 0;
  if (--w->live == 0) {
    /* The block's last thread: block_state's hook may still trap in this thread's context. */
    w->block_model.finish();
    w->cur = nullptr;
    jump(&f->ctx, &w->main, true);
    __builtin_unreachable();
  }
  Fiber *n = pick_next(w, f);
  if (n == nullptr) {
    report_deadlock(w);
    abandon_block(w, f);
  }
  w->cur = n;
  jump(&f->ctx, &n->ctx, true);
  __builtin_unreachable();
}

/* ------------------------------------------------------------------ workers */

struct Pool {
  std::mutex mu;
  std::vector<Worker *> idle;
  ~Pool() {
    for (Worker *w : idle) delete w;
  }
};

static Pool &pool() {
  static Pool p;
  return p;
}

static Worker *worker_acquire() {
  Pool &p = pool();
  {
    std::lock_guard<std::mutex> g(p.mu);
    if (!p.idle.empty()) {
      Worker *w = p.idle.back();
      p.idle.pop_back();
      return w;
    }
  }
  return new (std::nothrow) Worker();
}

static void worker_release(Worker *w) {
  Pool &p = pool();
  std::lock_guard<std::mutex> g(p.mu);
  p.idle.push_back(w);
}

/* Make room for nthreads fibers and smem_bytes of shared memory. Returns an error or nullptr. */
static const char *worker_reserve(Worker *w, int nthreads, size_t smem_bytes) {
  if (w->fiber_capacity < nthreads) {
    if (w->region != nullptr) munmap(w->region, w->region_bytes);
    w->region = nullptr;
    w->fiber_capacity = 0;
    const size_t per = kStackBytes + kGuardBytes;
    const size_t bytes = per * static_cast<size_t>(nthreads);
    void *r = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return "mmap of fiber stacks failed";
    w->region = static_cast<unsigned char *>(r);
    w->region_bytes = bytes;
    w->fibers.resize(static_cast<size_t>(nthreads));
    for (int i = 0; i < nthreads; ++i) {
      unsigned char *base = w->region + per * static_cast<size_t>(i);
      mprotect(base, kGuardBytes, PROT_NONE); /* best effort: a stack overflow faults */
      Fiber &f = w->fibers[static_cast<size_t>(i)];
      f.stack_lo = base + kGuardBytes;
      if (f.cp.capacity() == 0) f.cp.reserve(256);
      if (f.cp_groups.capacity() == 0) f.cp_groups.reserve(16);
    }
    w->fiber_capacity = nthreads;
    w->stacks_dirty = true; /* ASan: the mapping may reuse addresses with stale shadow */
  }
  if (w->smem_capacity < smem_bytes || w->smem == nullptr) {
    std::free(w->smem);
    const size_t cap = (smem_bytes + 4095) & ~size_t(4095);
    w->smem = static_cast<unsigned char *>(std::aligned_alloc(4096, cap == 0 ? 4096 : cap));
    w->smem_capacity = w->smem != nullptr ? (cap == 0 ? 4096 : cap) : 0;
    if (w->smem == nullptr) return "allocation of shared memory failed";
    w->proxy_mark.assign(w->smem_capacity / 16, 0);
    for (Fiber &f : w->fibers) f.unfenced.clear();
  }
  return nullptr;
}

static void run_block(Worker *w, long long b) {
  Launch *L = w->launch;
  const long long gx = L->l->grid[0], gy = L->l->grid[1];
  w->block_idx.x = static_cast<unsigned>(b % gx);
  w->block_idx.y = static_cast<unsigned>((b / gx) % gy);
  w->block_idx.z = static_cast<unsigned>(b / (gx * gy));
  std::memset(w->smem, kSmemPoison, w->smem_bytes);
#if RDA_EMU_ASAN
  if (w->stacks_dirty) {
    for (int i = 0; i < w->fiber_capacity; ++i)
      ASAN_UNPOISON_MEMORY_REGION(w->fibers[static_cast<size_t>(i)].stack_lo, kStackBytes);
  }
#endif
  w->stacks_dirty = false;
  w->barrier_arrived = 0;
  w->live = w->nthreads;
  w->block_model.reset(); /* also after an abandoned block */
  /* No generic-proxy write is pending at block start: clear the marks of the last block (every
   * fiber of the worker, not only this launch's: a larger earlier launch may have left some). */
  for (Fiber &f : w->fibers) {
    for (const uint32_t c : f.unfenced) w->proxy_mark[c] = 0;
    f.unfenced.clear();
  }
  for (int j = 0; j < w->nwarps; ++j) {
    Warp &wp = w->warps[j];
    wp.size = w->nthreads - 32 * j < 32 ? w->nthreads - 32 * j : 32;
    wp.arrived = 0;
    wp.gen = 0;
    wp.runnable = lane_mask(wp.size);
  }
  const unsigned bx = w->block_dim.x, by = w->block_dim.y;
  for (int i = 0; i < w->nthreads; ++i) {
    Fiber &f = w->fibers[static_cast<size_t>(i)];
    const unsigned u = static_cast<unsigned>(i);
    f.tid.x = u % bx;
    f.tid.y = (u / bx) % by;
    f.tid.z = u / (bx * by);
    f.lane = i & 31;
    f.warp = i >> 5;
    f.state = State::Runnable;
    f.cp.clear();
    f.cp_groups.clear();
    f.cp_head = f.group_head = 0;
    f.model.reset();
    fiber_init(&f);
  }
  const int i0 = w->launch->l->order != 0 ? w->nthreads - 1 : 0; /* pick_next's first */
  Fiber *first = &w->fibers[static_cast<size_t>(i0)];
  w->warps[i0 >> 5].runnable &= ~(1u << (i0 & 31));
  w->cur = first;
  jump(&w->main, &first->ctx, false);
  w->cur = nullptr;
}

static void worker_run(Launch *L) noexcept {
  Worker *w = worker_acquire();
  if (w == nullptr) {
    fail(L, "emulator: out of memory for a worker");
    return;
  }
  const rda_emu_launch *l = L->l;
  const int nthreads = static_cast<int>(l->block[0] * l->block[1] * l->block[2]);
  if (const char *why = worker_reserve(w, nthreads, l->smem_bytes)) {
    fail(L, "emulator: %s", why);
    delete w;
    return;
  }
  w->launch = L;
  w->block_dim = {l->block[0], l->block[1], l->block[2]};
  w->grid_dim = {l->grid[0], l->grid[1], l->grid[2]};
  w->nthreads = nthreads;
  w->nwarps = (nthreads + 31) / 32;
  w->smem_bytes = l->smem_bytes;
#if RDA_EMU_ASAN
  /* Shared memory past the launch's dynamic size is out of bounds: ASan reports a kernel that
   * touches it. */
  ASAN_UNPOISON_MEMORY_REGION(w->smem, w->smem_capacity);
  ASAN_POISON_MEMORY_REGION(w->smem + w->smem_bytes, w->smem_capacity - w->smem_bytes);
#endif
#if RDA_EMU_ASAN
  {
    pthread_attr_t a;
    void *addr = nullptr;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &a) == 0) {
      pthread_attr_getstack(&a, &addr, &size);
      pthread_attr_destroy(&a);
    }
    w->main.stack_bottom = addr;
    w->main.stack_size = size;
  }
#endif
  tls_worker = w;
  /* Blocks are taken in index order, or last to first with RDA_EMU_ORDER=reverse: a kernel
   * whose block reads what another block of the same launch writes (no order a GPU keeps)
   * sees the write in one order and misses it in the other, as threads do in pick_next. */
  const bool reverse = L->l->order != 0;
  while (!L->failed.load(std::memory_order_acquire)) {
    const long long b = L->next_block.fetch_add(1, std::memory_order_relaxed);
    if (b >= L->nblocks) break;
    run_block(w, reverse ? L->nblocks - 1 - b : b);
  }
  tls_worker = nullptr;
  w->launch = nullptr;
#if RDA_EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(w->smem, w->smem_capacity);
#endif
  worker_release(w);
}

static unsigned os_threads_for(const rda_emu_launch *l, long long nblocks) {
  unsigned n = l->os_threads;
  if (n == 0) n = std::thread::hardware_concurrency();
  if (n == 0) n = 1;
  if (static_cast<long long>(n) > nblocks) n = static_cast<unsigned>(nblocks);
  return n;
}

/* The body of every `<entry>__emu`: validate the launch, run all blocks, report. */
int run_launch(rda_emu_launch *l, const void *params, size_t params_bytes,
               void (*body)(const void *)) noexcept {
  l->err[0] = '\0';
  if (l->abi != RDA_EMU_ABI) {
    snprintf(l->err, sizeof l->err, "emulator ABI mismatch: host %u, kernel module %u", l->abi,
             static_cast<unsigned>(RDA_EMU_ABI));
    return 1;
  }
  if (l->params_bytes != params_bytes) {
    snprintf(l->err, sizeof l->err,
             "kernel parameters: host passed %zu bytes, the kernel takes %zu", l->params_bytes,
             params_bytes);
    return 1;
  }
  const unsigned long long threads =
      static_cast<unsigned long long>(l->block[0]) * l->block[1] * l->block[2];
  if (l->block[0] == 0 || l->block[1] == 0 || l->block[2] == 0 || threads > kMaxThreads) {
    snprintf(l->err, sizeof l->err, "block (%u,%u,%u): every dimension >= 1, at most %d threads",
             l->block[0], l->block[1], l->block[2], kMaxThreads);
    return 1;
  }
  if (l->grid[0] == 0 || l->grid[1] == 0 || l->grid[2] == 0 || l->grid[1] > 65535 ||
      l->grid[2] > 65535) {
    snprintf(l->err, sizeof l->err, "grid (%u,%u,%u): every dimension >= 1, y and z <= 65535",
             l->grid[0], l->grid[1], l->grid[2]);
    return 1;
  }
  if (params == nullptr || body == nullptr) {
    snprintf(l->err, sizeof l->err, "kernel parameters: NULL");
    return 1;
  }
  Launch L;
  L.l = l;
  L.params = params;
  L.body = body;
  L.nblocks = static_cast<long long>(l->grid[0]) * l->grid[1] * l->grid[2];
  const unsigned n = os_threads_for(l, L.nblocks);
  std::vector<std::thread> helpers;
  try {
    helpers.reserve(n - 1);
    for (unsigned i = 1; i < n; ++i) helpers.emplace_back(worker_run, &L);
  } catch (...) {
    /* fewer helpers: the blocks still all run */
  }
  worker_run(&L);
  for (std::thread &t : helpers) t.join();
  return L.failed.load(std::memory_order_acquire) ? 1 : 0;
}

static Fiber *current_fiber() {
  Worker *w = tls_worker;
  if (w == nullptr || w->cur == nullptr) {
    std::fputs("rda emulator: device code called outside a kernel launch\n", stderr);
    std::abort();
  }
  return w->cur;
}

}  // namespace detail

/* ------------------------------------------------------------------ emu_api.h */

int lane() {
  return detail::current_fiber()->lane;
}

int warp() {
  return detail::current_fiber()->warp;
}

void block_barrier() {
  detail::Worker *w = detail::tls_worker;
  detail::Fiber *f = detail::current_fiber();
  if (++w->barrier_arrived == w->nthreads) {
    w->barrier_arrived = 0;
    for (int j = 0; j < w->nwarps; ++j) w->warps[j].runnable = detail::lane_mask(w->warps[j].size);
    w->warps[f->warp].runnable &= ~(1u << f->lane);
    return;
  }
  f->state = detail::State::WaitBarrier;
  detail::wait_here(w, f);
  f->state = detail::State::Runnable;
}

const unsigned char *warp_gather(const void *mine, size_t bytes) {
  detail::Worker *w = detail::tls_worker;
  detail::Fiber *f = detail::current_fiber();
  detail::Warp &wp = w->warps[f->warp];
  if (bytes > kGatherSlot) trap("warp collective of more than 64 bytes per lane");
  const unsigned par = wp.gen & 1u;
  unsigned char *buf = wp.slots[par];
  if (wp.arrived == 0) {
    wp.bytes[par] = bytes;
  } else if (wp.bytes[par] != bytes) {
    char msg[160];
    snprintf(msg, sizeof msg,
             "warp collective mismatch: lane %d passes %zu bytes where other lanes passed %zu "
             "(lanes of a warp at different collectives)",
             f->lane, bytes, wp.bytes[par]);
    trap(msg);
  }
  if (bytes != 0) std::memcpy(buf + static_cast<size_t>(f->lane) * kGatherSlot, mine, bytes);
  if (++wp.arrived == wp.size) {
    wp.arrived = 0;
    ++wp.gen;
    wp.runnable |= detail::lane_mask(wp.size) & ~(1u << f->lane);
    return buf;
  }
  f->state = detail::State::WaitWarp;
  detail::wait_here(w, f);
  f->state = detail::State::Runnable;
  return buf;
}

unsigned char *dynamic_smem() {
  return detail::tls_worker->smem;
}

size_t dynamic_smem_bytes() {
  return detail::tls_worker->smem_bytes;
}

void cp_async_16(void *smem_dst, const void *gmem_src, bool valid) {
  detail::Worker *w = detail::tls_worker;
  detail::Fiber *f = detail::current_fiber();
  const uintptr_t d = reinterpret_cast<uintptr_t>(smem_dst);
  const uintptr_t s = reinterpret_cast<uintptr_t>(gmem_src);
  if (((d | s) & 15u) != 0) {
    char msg[160];
    snprintf(msg, sizeof msg, "cp.async: addresses must be 16-byte aligned (dst %p, src %p)",
             smem_dst, gmem_src);
    trap(msg);
  }
  const uintptr_t lo = reinterpret_cast<uintptr_t>(w->smem);
  if (d < lo || d + 16 > lo + w->smem_bytes) {
    char msg[200];
    snprintf(msg, sizeof msg,
             "cp.async: destination %p is outside dynamic shared memory (%zu bytes at %p)",
             smem_dst, w->smem_bytes, static_cast<void *>(w->smem));
    trap(msg);
  }
  /* Until the wait, the destination's contents are undefined on hardware (the copy may land at
   * any time): a poison pattern (0xffff: NaN in bf16 and fp16) makes a read of it, or an
   * in-flight wgmma operand there, show up as a wrong result. */
  std::memset(smem_dst, 0xff, 16);
  f->cp.push_back(detail::CpCopy{smem_dst, gmem_src, valid});
}

void cp_async_commit() {
  detail::Fiber *f = detail::current_fiber();
  f->cp_groups.push_back(f->cp.size());
}

namespace detail {

/* A landed cp.async wrote chunk c through the generic proxy: f's until f fences. A chunk f
 * already holds is not listed again, so the list stays within the chunks f writes between
 * fences (kernels that never fence, mma.sync ones, reuse their stages). */
static inline void proxy_mark(Worker *w, Fiber *f, uint32_t c) {
  const uint16_t me = static_cast<uint16_t>(32 * f->warp + f->lane + 1);
  if (w->proxy_mark[c] == me) return;
  w->proxy_mark[c] = me;
  if (f->unfenced.size() >= w->proxy_mark.size()) {
    /* Writers alternating on chunks: keep those still ours, once each. */
    std::vector<uint32_t> &u = f->unfenced;
    size_t n = 0;
    for (const uint32_t x : u)
      if (w->proxy_mark[x] == me) u[n++] = x;
    u.resize(n);
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
  }
  f->unfenced.push_back(c);
}

}  // namespace detail

void cp_async_wait(int pending_groups_allowed) {
  detail::Worker *w = detail::tls_worker;
  detail::Fiber *f = detail::current_fiber();
  if (pending_groups_allowed < 0) trap("cp.async.wait_group with a negative count");
  size_t pending = f->cp_groups.size() - f->group_head;
  while (pending > static_cast<size_t>(pending_groups_allowed)) {
    const size_t end = f->cp_groups[f->group_head++];
    for (size_t i = f->cp_head; i < end; ++i) {
      const detail::CpCopy &c = f->cp[i];
      if (c.valid)
        std::memcpy(c.dst, c.src, 16);
      else
        std::memset(c.dst, 0, 16);
      detail::proxy_mark(
          w, f, static_cast<uint32_t>((static_cast<unsigned char *>(c.dst) - w->smem) >> 4));
    }
    f->cp_head = end;
    --pending;
  }
  if (pending == 0) {
    /* No committed group left: keep only the copies not yet committed, at the front. */
    f->cp.erase(f->cp.begin(), f->cp.begin() + static_cast<std::ptrdiff_t>(f->cp_head));
    f->cp_head = 0;
    f->cp_groups.clear();
    f->group_head = 0;
  }
}

void fence_proxy_async_shared() {
  detail::Worker *w = detail::tls_worker;
  detail::Fiber *f = detail::current_fiber();
  const uint16_t me = static_cast<uint16_t>(32 * f->warp + f->lane + 1);
  for (const uint32_t c : f->unfenced)
    if (w->proxy_mark[c] == me) w->proxy_mark[c] = 0; /* else a later writer's, not ours */
  f->unfenced.clear();
}

int unfenced_writer(size_t smem_offset) {
  detail::Worker *w = detail::tls_worker;
  (void)detail::current_fiber(); /* aborts outside a launch */
  if (smem_offset >= w->smem_bytes) return -1;
  return static_cast<int>(w->proxy_mark[smem_offset >> 4]) - 1;
}

void *detail::ModelStore::get(size_t n, size_t max, void (*on_exit)(void *), const char *who) {
  char msg[96];
  if (!live) {
    if (n == 0 || n > max) {
      snprintf(msg, sizeof msg, "%s: size out of range", who);
      trap(msg);
    }
    if (data.size() < n) data.resize(n);
    std::memset(data.data(), 0, n);
    bytes = n;
    exit = on_exit;
    live = true;
  } else if (n != bytes) {
    snprintf(msg, sizeof msg, "%s: asked for a different size than before in this block", who);
    trap(msg);
  }
  return data.data();
}

void *thread_state(size_t bytes, void (*on_exit)(void *state)) {
  return detail::current_fiber()->model.get(bytes, kThreadStateMax, on_exit, "thread_state");
}

void *block_state(size_t bytes, void (*on_exit)(void *state)) {
  (void)detail::current_fiber(); /* aborts outside a launch */
  return detail::tls_worker->block_model.get(bytes, kBlockStateMax, on_exit, "block_state");
}

[[noreturn]] void trap(const char *what) {
  detail::Worker *w = detail::tls_worker;
  detail::Fiber *f = detail::current_fiber();
  detail::fail(w->launch, "block (%u,%u,%u) thread (%u,%u,%u): %s", w->block_idx.x, w->block_idx.y,
               w->block_idx.z, f->tid.x, f->tid.y, f->tid.z, what);
  detail::abandon_block(w, f);
}

}  // namespace rda_emu

namespace rda_emu {
namespace detail {

const unsigned *thread_idx() {
  return &current_fiber()->tid.x;
}
const unsigned *block_idx() {
  return &tls_worker->block_idx.x;
}
const unsigned *block_dim() {
  return &tls_worker->block_dim.x;
}
const unsigned *grid_dim() {
  return &tls_worker->grid_dim.x;
}

}  // namespace detail
}  // namespace rda_emu
