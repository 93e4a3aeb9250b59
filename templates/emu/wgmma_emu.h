/* wgmma_emu.h — the emulator's model of the sm_90a warpgroup MMA (wgmma) and its shared-memory
 * matrix descriptors, for templates/ptx.cuh under RDA_EMU. Host C++ only.
 *
 * INTERFACE (fixed; ptx.cuh calls exactly these):
 *   uint32_t smem_addr(const void *p): p's address as a descriptor sees it, the byte offset of p
 *     in the block's shared window (here: from rda_emu::dynamic_smem(), which is 4096-aligned,
 *     so swizzle patterns line up with offsets as they do with 1024-aligned hardware addresses).
 *   void fence_proxy_async(): fence.proxy.async.shared::cta.
 *   void fence(): wgmma.fence.sync.aligned.
 *   void commit(): wgmma.commit_group.sync.aligned.
 *   void wait(int n): wgmma.wait_group.sync.aligned n.
 *   void mma_ss(float *d, int n, uint64_t adesc, uint64_t bdesc, bool accumulate, bool bf16,
 *               bool trans_b): wgmma.mma_async m64n<n>k16 .f32 with A and B from descriptors,
 *     A K-major, B K-major (trans_b false) or MN-major (trans_b true). d: this thread's
 *     n / 2 accumulator floats, d[4 i + e] as documented at rda::wgmma_ss.
 *   void mma_rs(float *d, int n, const uint32_t a[4], uint64_t bdesc, bool accumulate, bool bf16,
 *               bool trans_b): the same with A from registers (warp w's rows 16w..16w+15 in the
 *     mma.m16n8k16 A fragment layout).
 *
 * THE MODEL (PTX ISA, "Asynchronous Warpgroup Level Matrix Operations", sections "Register
 * Fragments", "Shared Memory Matrix Layout", "Matrix Descriptor Format", wgmma.fence,
 * wgmma.commit_group, wgmma.wait_group; docs.nvidia.com/cuda/parallel-thread-execution/).
 *
 * Descriptor: start address bits 0-13, LBO bits 16-29, SBO bits 32-45 (each the byte value
 * >> 4), base offset bits 49-51, swizzle bits 62-63 (0 none, 1 128B, 2 64B, 3 32B). A nonzero
 * base offset with a swizzle traps (rda aligns its tiles; the docs make it 0 when the pattern
 * starts on a 1024/512/256-byte boundary). Other bits are ignored.
 *
 * Canonical layouts, 16-bit elements (T = 8 elements = 16 bytes), as the docs' CuTe table
 * ("Canonical Layouts") gives them, written as byte offsets of element (mn, k) from the start
 * address; W = swizzle width in bytes (128, 64, 32):
 *   K-major,  none:     (mn%8)*16 + (mn/8)*SBO + (k%8)*2 + (k/8)*LBO
 *                       ((8,m),(T,2k)):((1T,SBO),(1,LBO)): 8x16-byte core matrices, LBO steps K.
 *   K-major,  swizzled: (mn%8)*W + (mn/8)*SBO + k*2        ((8,m),(T,2k)):((W/2,SBO),(1,T)):
 *                       LBO unused ("not used, assumed to be 1"); the 16 k of one mma are 32
 *                       contiguous bytes of a W-byte row, so a K step is start address + 32.
 *   MN-major, none:     (mn%8)*2 + (mn/8)*SBO + (k%8)*16 + (k/8)*LBO
 *                       ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)): SBO steps MN, LBO steps K.
 *   MN-major, swizzled: (mn%(W/2))*2 + (mn/(W/2))*LBO + (k%8)*W + (k/8)*SBO
 *                       ((T,W/16,m),(8,k)):((1,T,LBO),(W/2,SBO)): here LBO steps MN (from one
 *                       W-byte-wide atom to the next) and SBO steps K (8 rows of k) — the roles
 *                       swap relative to the no-swizzle MN-major layout, as in the docs' tables
 *                       ("Leading/Stride Dimension Byte Offset") and their bf16 examples.
 * The swizzle (CuTe Swizzle<3,4,3>, <2,4,3>, <1,4,3>) then acts on the address start + offset:
 * bits [4,7) ^= bits [7,10) (128B), bits [4,6) ^= [7,9) (64B), bit 4 ^= bit 7 (32B). It is a
 * function of the address, so a start address moved by 32 bytes inside an atom reads the
 * right chunks. Every 16-byte chunk touched must lie inside the dynamic shared memory (trap).
 *
 * Fragments (docs' figures for wgmma .m64nNk16 A and D): warp w = (warp index % 4) of the
 * warpgroup owns rows 16w..16w+15; lane l = 4g + c holds D[16w+g+8(e>>1)][8i+2c+(e&1)] in
 * d[4i+e], and A in registers as the mma.m16n8k16 A fragment of those 16 rows.
 *
 * Arithmetic: products of 16-bit values are exact in fp32; each D element is summed in k order
 * starting from the old D (or from +0 when accumulate is false), like emu mma_16816. Hardware
 * sums in another order: tests compare hardware with tolerances.
 *
 * Asynchrony (per CUDA thread, in thread_state): mma_ss/mma_rs only queue the operation (d's
 * address, the descriptors, and for RS the A values, gathered from the warp at issue);
 * commit closes a group; wait(n) executes the oldest committed groups until at most n remain,
 * reading shared memory and d at that moment. So overwriting an operand tile before the wait
 * shows up as it could on hardware (d and A in registers are checked: see below). Traps: an
 * mma with no wgmma_fence since the thread started or last waited (the docs require the fence
 * before the first mma and after register accesses to d/A; every wait is treated as such an
 * access — stricter than hardware only for a kernel that issues after a wait without touching
 * any accumulator); a thread that exits with operations pending; more than kMaxOps pending or
 * kMaxGroups open groups (emulator limits). Uncommitted operations are not executed by a wait
 * (the docs: wait_group waits for committed groups only).
 *
 * Proxies. The PTX ISA: "The wgmma.mma_async operations are performed in the asynchronous
 * proxy"; "cp.async is treated as a weak memory operation performed in the generic proxy"
 * (the non-bulk cp.async, zero-fill included; plain st.shared too); "An async proxy fence must
 * be used to establish an ordering between prior writes to shared memory matrices and
 * subsequent reads of the same matrices in a wgmma.mma_async instruction" (wgmma.fence); and
 * of fence.proxy: "bi-directional proxy fences ... take effect within a single thread", their
 * effect composing with other synchronization (here the barrier). The reading implemented:
 * a generic write is visible to a wgmma only when the thread that wrote it executed
 * fence.proxy.async after the write completed (after its cp.async.wait_group) and before the
 * synchronization that orders it before the mma. A fence in another thread, even the issuing
 * thread after the barrier, does not count. A more cumulative reading of the memory model
 * (any proxy fence on the causality path from the write to the read) might accept that last
 * case; the strict one is what NVIDIA's own code does (the writers fence, then the barrier)
 * and what the kernels do, and a kernel that passes it is correct under either reading. So:
 * the runtime marks each 16-byte chunk a cp.async writes with its thread when the copy lands
 * (emu_api.h: cp_async_wait), fence_proxy_async clears the calling thread's marks, and an
 * mma_ss (A and B) or mma_rs (B) whose shared operands hold a mark at issue traps ("wgmma:
 * mma_async (instruction #i at SITE) reads B operand bytes at shared offset X..X+15 written
 * by cp.async of thread T (warp W lane L) with no fence.proxy.async in that thread since its
 * cp.async wait ..."; the issuing thread in the launch error's prefix). Each thread of the
 * warpgroup checks its 1/128 share of the operand chunks (proxy_check), so the check costs
 * one to three lookups per thread per mma; marking costs one store per landed copy. Not
 * seen: plain C++ stores to shared memory (st.shared), which the emulator cannot observe, so a
 * tile written by stores needs the fence without the emulator checking it; and the reverse
 * direction (async-proxy reads before generic writes), which the PTX ISA orders implicitly at
 * wgmma completion (the wait).
 *
 * Register operands in flight. The PTX ISA (wgmma.wait_group) makes it undefined behavior to
 * access the accumulator registers, or the registers holding the A fragments, of an
 * mma_async before a wgmma.wait_group that waits on a group including it; the one exception
 * (wgmma.fence) is a chain of mma_async of the same shape on the same accumulator, ordered
 * without a wait. On an H100 the tensor cores read A and read and write d while the thread
 * runs on; ptxas, where it sees such an access, serializes the kernel's wgmma or injects a
 * wait (advisories C7514, C7515, C7517: correct, but the overlap is lost), and where it does
 * not, the result is undefined. What the emulator checks, for each issued mma until the wait
 * that executes it:
 *   A (mma_rs): the address of the thread's four registers and their values are kept at
 *     issue; at the wait, before the mma runs, a value that differs traps ("A register a[r] of
 *     an mma_async in flight (instruction #i at SITE) was written before the wait ...": r
 *     indexes the a[4] passed to wgmma_rs; i and SITE as in the divergence reports). A
 *     register whose storage went out of scope before the wait reads as changed too (on
 *     hardware its registers may be reused; a sanitized build may report the read as a
 *     stack use after scope instead). Reads of A in flight are not detected (nothing
 *     in the emulator can see them; on hardware a read-read overlap is harmless in practice).
 *   d (both kinds): at the first issue on an accumulator its values are kept (if that mma
 *     accumulates) and every float of d is set to kPoison, a signaling NaN, until the last
 *     mma in flight on it runs. At the wait, before an mma runs, a float of d that is not
 *     kPoison traps ("accumulator d[i][e] (nN) of an mma_async in flight ... was written
 *     ..."; d[i][e] as the kernels' float d[N / 8][4]): a store, or arithmetic on a read
 *     (d *= c turns the signaling NaN quiet). A read that is only copied or compared is not a
 *     trap: it yields the NaN, so the kernel's output goes wrong (a NaN with bits 0x7f8badd0
 *     or 0x7fcbadd0 in an output is the sign of it). Then d gets its kept values back, the
 *     mma runs, and, when a later group still holds d, the result is kept and d poisoned
 *     again at the end of the wait. A chain (same d, same N: k steps, or groups of products
 *     into one accumulator) is one accumulator; another mma_async whose d overlaps it partly
 *     or with another N traps; at most kMaxAccs accumulators in flight per thread (emulator
 *     limit, trap).
 * Not checked: accesses between a wgmma_fence and the mma it orders (the docs want the fence
 * after them), and accesses that restore the value they overwrote.
 *
 * Convergence (PTX ISA: wgmma.fence, mma_async, commit_group and wait_group are .sync.aligned:
 * all 128 threads of the warpgroup execute the same instruction, in conditional code only if
 * the condition is uniform over the warpgroup; otherwise undefined, a hang on an H100). Every
 * thread numbers its .aligned wgmma instructions (fence, mma_ss, mma_rs, commit, wait; not
 * fence_proxy_async) and describes each by an Insn: the kind, N and flags (accumulate, bf16,
 * trans-b), mma_ss's A and B descriptors, mma_rs's B descriptor (A is per warp), the wait
 * count, and the call site: __builtin_return_address(0) of the non-inlined entry point, an
 * address in the kernel's code (ptx.cuh's wrappers are inlined or tail-call it), so two call
 * sites of one op (e.g. a step's Mask = true and Mask = false instantiations) differ. Per
 * warpgroup, in block_state, a ring of kRing slots {index, thread, Insn}: the first thread to
 * reach instruction #i writes slot i % kRing, every later thread of the warpgroup (each lane,
 * so lanes of one warp are checked too) compares and traps on a mismatch ("wgmma: warps of
 * warpgroup G diverge at instruction #i: ..."); a slot holding a larger index means this
 * thread is more than kRing instructions behind (unchecked; the scheduler runs a warp up to
 * its next barrier or warp collective before the next warp, so warps are normally far fewer
 * than kRing instructions apart). At block end every thread's total count must equal its
 * warpgroup's (threads that never issued count 0): a warp that skipped all its steps, or
 * added steps at the end, traps there ("wgmma: warps of warpgroup G diverge: warp A lane a
 * issued n wgmma instructions, warp B lane b issued m; #k is ..."). Threads that never issue
 * wgmma cost nothing; a block that does pays one zero-fill of its rings (about 41 KB per
 * warpgroup). The site comparison assumes
 * the compiler does not duplicate a call site into two paths that warps of one warpgroup take
 * differently (a per-warp branch around it): for such a false report, build kernels with
 * RDA_EMU_CXXFLAGS=-DRDA_EMU_WGMMA_SITES=0 (sites not compared; the rest still is). Without
 * inlining (-O0) every site is the wrapper's: call sites are then not told apart. */
#ifndef RDA_WGMMA_EMU_H
#define RDA_WGMMA_EMU_H

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "emu_runtime.h" /* emu_api.h, and blockDim for block_state's size */

namespace rda_emu {
namespace wgmma {

constexpr int kMaxOps = 64;    /* issued, not yet executed, per thread */
constexpr int kMaxGroups = 32; /* committed, not yet executed, per thread */

struct Op {
  float *d;
  const uint32_t *asrc; /* RS: this thread's four A registers, checked unchanged at execution */
  const void *site;     /* the call site (for reports; null when RDA_EMU_WGMMA_SITES is 0) */
  uint64_t adesc, bdesc;
  uint32_t amine[4]; /* RS: asrc's values at issue */
  uint32_t index;    /* the thread's .aligned instruction number of this mma (for reports) */
  uint16_t a[2][16]; /* RS: this thread's rows g and g + 8 of A, k = 0..15 (16-bit bits) */
  uint8_t n8;        /* N / 8 */
  uint8_t acc;       /* its accumulator's slot in State::accs */
  bool accumulate, bf16, trans_b, rs;
};

/* An accumulator (one mma's d: N / 2 floats) while some mma_async on it is in flight. d then
 * holds kPoison in every float; State::acc_value[slot] holds what d would hold were the mma
 * that runs next on it about to run (d at the first issue, then each executed mma's result).
 * The slots are small and apart from the values: every issue and wait scans them. */
constexpr int kMaxAccs = 8;               /* accumulators in flight, per thread */
constexpr uint32_t kPoison = 0x7f8badd0u; /* a signaling NaN */

struct Acc {
  float *d;        /* null: a free slot */
  uint16_t nf;     /* floats: N / 2 */
  uint8_t pending; /* issued mma on d not executed yet (at most kMaxOps) */
  bool raw;        /* inside a wait: d holds the value's bits, not the poison */
};

#ifndef RDA_EMU_WGMMA_SITES
#define RDA_EMU_WGMMA_SITES 1
#endif

/* ------------------------------------------------------------------ convergence check */

enum Kind : uint8_t { kFence = 1, kMmaSS, kMmaRS, kCommit, kWait };

/* One .aligned wgmma instruction as the whole warpgroup must issue it. */
struct Insn {
  uint64_t adesc, bdesc; /* mma_ss: both; mma_rs: bdesc; else 0 */
  const void *site;      /* the call site (null when RDA_EMU_WGMMA_SITES is 0) */
  uint32_t arg;          /* mma: N | accumulate << 16 | bf16 << 17 | trans_b << 18; wait: n */
  uint8_t kind;
};

constexpr int kRing = 1024; /* instructions a thread may lag its warpgroup's first and be checked */

struct Slot {
  uint32_t index1; /* instruction index + 1; 0: empty */
  uint32_t thread; /* linear thread index in the block of the thread that wrote it */
  Insn insn;
};

struct Group {
  Slot ring[kRing];
  uint32_t count[128]; /* each thread's total, written when it exits */
};

/* block_state: this header, then one Group per warpgroup. */
struct Block {
  uint32_t nthreads, ngroups;
};

constexpr size_t kGroupsAt = (sizeof(Block) + alignof(Group) - 1) / alignof(Group) * alignof(Group);

inline Group *group_at(Block *b, uint32_t g) {
  return reinterpret_cast<Group *>(reinterpret_cast<unsigned char *>(b) + kGroupsAt +
                                   sizeof(Group) * g);
}

inline bool same(const Insn &a, const Insn &b) {
  return a.kind == b.kind && a.arg == b.arg && a.adesc == b.adesc && a.bdesc == b.bdesc &&
         a.site == b.site;
}

inline void describe(const Insn &in, char *out, size_t cap) {
  const char *dt = (in.arg >> 17) & 1u ? "bf16" : "f16";
  const char *acc = (in.arg >> 16) & 1u ? " accumulate" : "";
  const char *tb = (in.arg >> 18) & 1u ? " trans-b" : "";
  const unsigned n = in.arg & 0xffffu;
  switch (in.kind) {
    case kFence: snprintf(out, cap, "wgmma.fence"); break;
    case kCommit: snprintf(out, cap, "wgmma.commit_group"); break;
    case kWait: snprintf(out, cap, "wgmma.wait_group %u", in.arg); break;
    case kMmaSS:
      snprintf(out, cap, "wgmma.mma_async n%u %s%s%s A desc %#llx B desc %#llx", n, dt, acc, tb,
               static_cast<unsigned long long>(in.adesc),
               static_cast<unsigned long long>(in.bdesc));
      break;
    case kMmaRS:
      snprintf(out, cap, "wgmma.mma_async n%u %s%s%s A regs B desc %#llx", n, dt, acc, tb,
               static_cast<unsigned long long>(in.bdesc));
      break;
    default: snprintf(out, cap, "nothing (exited)"); break;
  }
  if (in.site != nullptr && in.kind != 0) {
    const size_t len = strlen(out);
    snprintf(out + len, cap - len, " at %p", in.site);
  }
}

/* Block end: every thread of a warpgroup issued as many wgmma instructions. */
inline void on_block_exit(void *p) {
  Block *b = static_cast<Block *>(p);
  for (uint32_t g = 0; g < b->ngroups; ++g) {
    const Group *gr = group_at(b, g);
    const uint32_t n = b->nthreads - 128 * g < 128 ? b->nthreads - 128 * g : 128;
    for (uint32_t t = 1; t < n; ++t) {
      if (gr->count[t] == gr->count[0]) continue;
      /* the first instruction the shorter one lacks, if the ring still holds it */
      const uint32_t lo = gr->count[t] < gr->count[0] ? gr->count[t] : gr->count[0];
      const Slot &sl = gr->ring[lo % kRing];
      char what[200] = "";
      if (sl.index1 == lo + 1) {
        char d[160];
        describe(sl.insn, d, sizeof d);
        snprintf(what, sizeof what, "; #%u is %s", lo, d);
      }
      char msg[400];
      snprintf(msg, sizeof msg,
               "wgmma: warps of warpgroup %u diverge: warp %u lane %u issued %u wgmma "
               "instructions, warp %u lane %u issued %u%s (.sync.aligned: every thread of a "
               "warpgroup issues the same sequence)",
               g, 4 * g, 0u, gr->count[0], 4 * g + t / 32, t % 32, gr->count[t], what);
      trap(msg);
    }
  }
}

inline Block *block() {
  const unsigned *bd = detail::block_dim();
  const uint32_t nthreads = bd[0] * bd[1] * bd[2], ngroups = (nthreads + 127) / 128;
  Block *b = static_cast<Block *>(block_state(kGroupsAt + sizeof(Group) * ngroups, on_block_exit));
  b->nthreads = nthreads;
  b->ngroups = ngroups;
  return b;
}

struct State {
  uint32_t head, tail;   /* ops[head % kMaxOps .. tail % kMaxOps): issued, pending */
  uint32_t ghead, gtail; /* group_end[ghead .. gtail): committed groups, by end index */
  uint32_t group_end[kMaxGroups];
  bool fenced;
  uint32_t issued; /* .aligned wgmma instructions so far */
  uint32_t thread; /* linear index in the block */
  Group *group;    /* this thread's warpgroup's, null until the first instruction */
  Op ops[kMaxOps];
  Acc accs[kMaxAccs];
  float acc_value[kMaxAccs][64];
};

static_assert(sizeof(State) <= kThreadStateMax, "wgmma state exceeds thread_state's limit");

inline void on_thread_exit(void *p) {
  const State *s = static_cast<const State *>(p);
  if (s->head != s->tail) {
    char msg[160];
    snprintf(msg, sizeof msg,
             "wgmma: thread exits with %u mma_async pending (%u committed groups not waited "
             "for; every mma needs commit and wgmma_wait before the end)",
             s->tail - s->head, s->gtail - s->ghead);
    trap(msg);
  }
  if (s->group != nullptr) s->group->count[s->thread % 128] = s->issued;
}

inline State *state() {
  return static_cast<State *>(thread_state(sizeof(State), on_thread_exit));
}

/* Numbers the calling thread's next .aligned instruction and checks it against its
 * warpgroup's ring (see the top comment). */
inline void note(State *s, const Insn &in) {
  if (s->group == nullptr) {
    s->thread = static_cast<uint32_t>(32 * warp() + lane());
    s->group = group_at(block(), s->thread / 128);
  }
  const uint32_t i = s->issued++;
  Slot &sl = s->group->ring[i % kRing];
  if (sl.index1 < i + 1) {
    sl.index1 = i + 1;
    sl.thread = s->thread;
    sl.insn = in;
  } else if (sl.index1 == i + 1 && !same(sl.insn, in)) {
    char first[160], mine[160], msg[480];
    describe(sl.insn, first, sizeof first);
    describe(in, mine, sizeof mine);
    snprintf(msg, sizeof msg,
             "wgmma: warps of warpgroup %u diverge at instruction #%u: warp %u lane %u issued "
             "%s, warp %u lane %u %s",
             s->thread / 128, i, sl.thread / 32, sl.thread % 32, first, s->thread / 32,
             s->thread % 32, mine);
    trap(msg);
  }
}

inline Insn insn(uint8_t kind, const void *site) {
  Insn in;
  memset(&in, 0, sizeof in);
  in.kind = kind;
  in.site = RDA_EMU_WGMMA_SITES ? site : nullptr;
  return in;
}

inline uint32_t mma_arg(int n, bool accumulate, bool bf16, bool trans_b) {
  return static_cast<uint32_t>(n) | (accumulate ? 1u << 16 : 0u) | (bf16 ? 1u << 17 : 0u) |
         (trans_b ? 1u << 18 : 0u);
}

inline uint32_t smem_addr(const void *p) {
  return static_cast<uint32_t>(static_cast<const unsigned char *>(p) - dynamic_smem());
}

/* A decoded descriptor: byte values. */
struct Desc {
  uint32_t start, lbo, sbo;
  uint32_t width; /* swizzle width in bytes, 0: none */
  uint32_t mask;  /* address bits [7, ...) XORed into bits [4, ...) */
};

inline Desc decode(uint64_t desc, const char *which) {
  Desc r;
  r.start = static_cast<uint32_t>(desc & 0x3fffu) << 4;
  r.lbo = static_cast<uint32_t>((desc >> 16) & 0x3fffu) << 4;
  r.sbo = static_cast<uint32_t>((desc >> 32) & 0x3fffu) << 4;
  const unsigned mode = static_cast<unsigned>(desc >> 62);
  static const uint32_t widths[4] = {0, 128, 64, 32};
  r.width = widths[mode];
  r.mask = r.width / 16 - (r.width != 0 ? 1 : 0); /* 7, 3, 1; 0 for none */
  const unsigned base = static_cast<unsigned>((desc >> 49) & 7u);
  if (mode != 0 && base != 0) {
    char msg[160];
    snprintf(msg, sizeof msg,
             "wgmma: %s descriptor %#llx has base offset %u (the emulator supports 0: swizzled "
             "tiles aligned to the pattern)",
             which, static_cast<unsigned long long>(desc), base);
    trap(msg);
  }
  return r;
}

/* The shared-memory byte offset of element (mn, k) of a canonical 16-bit layout, swizzled.
 * For (mn, k) at the start of an aligned run of 8 along the major dimension, the run is the
 * 16 contiguous bytes from there (swizzles move whole 16-byte chunks). */
inline uint32_t element_offset(const Desc &d, bool k_major, uint32_t mn, uint32_t k) {
  uint32_t off;
  if (k_major) {
    off = d.width == 0 ? (mn % 8) * 16 + (mn / 8) * d.sbo + (k % 8) * 2 + (k / 8) * d.lbo
                       : (mn % 8) * d.width + (mn / 8) * d.sbo + k * 2;
  } else {
    const uint32_t run = d.width == 0 ? 8 : d.width / 2; /* MN elements per row of an atom */
    off = d.width == 0 ? (mn % 8) * 2 + (mn / 8) * d.sbo + (k % 8) * 16 + (k / 8) * d.lbo
                       : (mn % run) * 2 + (mn / run) * d.lbo + (k % 8) * d.width + (k / 8) * d.sbo;
  }
  const uint32_t addr = d.start + off;
  return addr ^ (((addr >> 7) & d.mask) << 4);
}

/* 16-bit bits to float, exactly, 8 at a time (GCC vector extensions: SSE2 / NEON, no libgcc).
 * f16: the bits moved into a float's exponent and mantissa give the value times 2^-112 for
 * normals and subnormals alike (a float subnormal then), so one multiply rebiases; exponent 31
 * (inf, NaN) goes to 255 instead. Each B value is widened by the 32 threads that use it, so
 * this is the model's hot loop. */
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef float f32x8 __attribute__((vector_size(32)));

template <bool Bf16>
inline void widen8(const uint16_t *h, float *out) {
  u16x8 hv;
  memcpy(&hv, h, sizeof hv);
  const u32x8 x = __builtin_convertvector(hv, u32x8);
  u32x8 v;
  if (Bf16) {
    v = x << 16;
  } else {
    const u32x8 mag = (x & 0x7fffu) << 13;
    f32x8 f;
    memcpy(&f, &mag, sizeof f);
    f *= 0x1p112f;
    memcpy(&v, &f, sizeof v);
    const u32x8 special = (u32x8)(mag >= (0x7c00u << 13)); /* all ones where inf / NaN */
    v = (v & ~special) | ((mag | 0x7f800000u) & special);
    v |= (x & 0x8000u) << 16;
  }
  memcpy(out, &v, sizeof v);
}

/* Copies the 16-byte chunk at shared offset `off` to out (8 values), bounds-checked. */
inline void load_chunk(const unsigned char *smem, size_t smem_bytes, uint32_t off, uint16_t *out,
                       const char *which) {
  if (static_cast<size_t>(off) + 16 > smem_bytes) {
    char msg[200];
    snprintf(msg, sizeof msg,
             "wgmma: %s operand reads shared offset %u..%u, outside the %zu bytes of dynamic "
             "shared memory (check the descriptor's start address, LBO and SBO)",
             which, off, off + 15, smem_bytes);
    trap(msg);
  }
  memcpy(out, smem + off, 16);
}

/* Executes one queued op for the calling thread (warp w of the warpgroup, lane 4g + c). The
 * operand bits are gathered first, then widened in one pass, then summed. */
template <bool Bf16, int N8>
inline void execute(const Op &op, int w, int g, int c) {
  constexpr int NC = 2 * N8; /* this thread's columns: 8i + 2c + b, j = 2i + b */
  const unsigned char *smem = dynamic_smem();
  const size_t smem_bytes = dynamic_smem_bytes();
  uint16_t abits[2][16];
  if (op.rs) {
    memcpy(abits, op.a, sizeof abits);
  } else {
    const Desc da = decode(op.adesc, "A");
    for (int r = 0; r < 2; ++r) {
      const uint32_t m = static_cast<uint32_t>(16 * w + g + 8 * r);
      load_chunk(smem, smem_bytes, element_offset(da, true, m, 0), abits[r], "A");
      load_chunk(smem, smem_bytes, element_offset(da, true, m, 8), abits[r] + 8, "A");
    }
  }
  const Desc db = decode(op.bdesc, "B");
  uint16_t bbits[16][NC]; /* bbits[k][j]: B[k][column j] */
  if (!op.trans_b) {
    for (int j = 0; j < NC; ++j) {
      const uint32_t n = static_cast<uint32_t>(8 * (j / 2) + 2 * c + (j & 1));
      uint16_t run[16];
      load_chunk(smem, smem_bytes, element_offset(db, true, n, 0), run, "B");
      load_chunk(smem, smem_bytes, element_offset(db, true, n, 8), run + 8, "B");
      for (int k = 0; k < 16; ++k) bbits[k][j] = run[k];
    }
  } else {
    /* MN-major: columns 8i..8i+7 of one k are a 16-byte chunk; ours are 2c and 2c + 1. */
    for (int k = 0; k < 16; ++k)
      for (int i = 0; i < N8; ++i) {
        uint16_t run[8];
        load_chunk(
            smem, smem_bytes,
            element_offset(db, false, static_cast<uint32_t>(8 * i), static_cast<uint32_t>(k)), run,
            "B");
        bbits[k][2 * i] = run[2 * c];
        bbits[k][2 * i + 1] = run[2 * c + 1];
      }
  }
  float a[2][16], b[16][NC];
  for (int r = 0; r < 2; ++r)
    for (int q = 0; q < 16; q += 8) widen8<Bf16>(&abits[r][q], &a[r][q]);
  for (int k = 0; k < 16; ++k)
    for (int q = 0; q < NC; q += 8) widen8<Bf16>(&bbits[k][q], &b[k][q]);
  float acc[2][NC];
  for (int i = 0; i < N8; ++i)
    for (int e = 0; e < 4; ++e)
      acc[e >> 1][2 * i + (e & 1)] = op.accumulate ? op.d[4 * i + e] : 0.0f;
  for (int k = 0; k < 16; ++k)
    for (int r = 0; r < 2; ++r)
      for (int j = 0; j < NC; ++j) acc[r][j] += a[r][k] * b[k][j];
  for (int i = 0; i < N8; ++i)
    for (int e = 0; e < 4; ++e) op.d[4 * i + e] = acc[e >> 1][2 * i + (e & 1)];
}

inline void execute_op(const Op &op) {
  const int w = warp() % 4, l = lane();
  const int g = l / 4, c = l % 4;
  if (op.n8 == 8) {
    if (op.bf16)
      execute<true, 8>(op, w, g, c);
    else
      execute<false, 8>(op, w, g, c);
  } else {
    if (op.bf16)
      execute<true, 16>(op, w, g, c);
    else
      execute<false, 16>(op, w, g, c);
  }
}

/* ------------------------------------------------------------------ register operands in flight */

inline void poison(float *d, uint32_t nf) {
  for (uint32_t j = 0; j < nf; ++j) memcpy(&d[j], &kPoison, sizeof kPoison);
}

inline void site_text(const void *site, char *out, size_t cap) {
  if (site != nullptr)
    snprintf(out, cap, " at %p", site);
  else
    out[0] = '\0';
}

/* Issue: the accumulator slot of op's d (a new one, or the one of an earlier mma on the same
 * registers that is still in flight: the same-shape chain the docs order by default). */
inline void hold_accumulator(State *s, Op *op) {
  const uint32_t nf = 4u * op->n8;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(op->d), hi = lo + sizeof(float) * nf;
  int free_slot = -1;
  for (int i = 0; i < kMaxAccs; ++i) {
    Acc &e = s->accs[i];
    if (e.d == nullptr) {
      if (free_slot < 0) free_slot = i;
      continue;
    }
    const uintptr_t elo = reinterpret_cast<uintptr_t>(e.d), ehi = elo + sizeof(float) * e.nf;
    if (e.d == op->d && e.nf == nf) {
      ++e.pending;
      op->acc = static_cast<uint8_t>(i);
      return;
    }
    if (lo < ehi && elo < hi) {
      char msg[300];
      snprintf(msg, sizeof msg,
               "wgmma: mma_async n%u on accumulator registers that overlap those of an "
               "mma_async n%u still in flight (d at %p and %p): only a chain on the same "
               "registers with the same shape is ordered without a wait (PTX ISA wgmma.fence)",
               8u * op->n8, 2u * e.nf, static_cast<void *>(op->d), static_cast<void *>(e.d));
      trap(msg);
    }
  }
  if (free_slot < 0)
    trap("wgmma: more than 8 accumulators in flight in a thread (emulator limit; wait sooner)");
  Acc &e = s->accs[free_slot];
  e.d = op->d;
  e.nf = static_cast<uint16_t>(nf);
  e.pending = 1;
  e.raw = false;
  if (op->accumulate) memcpy(s->acc_value[free_slot], op->d, sizeof(float) * nf); /* else unused */
  poison(op->d, nf);
  op->acc = static_cast<uint8_t>(free_slot);
}

/* Wait: op's registers are checked, then op runs. The A registers must hold their values at
 * issue; d must still hold the poison (anything else was stored by the kernel, directly or as
 * arithmetic on a read, which turns the signaling NaN quiet). Inside one wait the kernel does
 * not run, so d keeps real values from one mma of a chain to the next (raw). */
inline void run_op(State *s, const Op &op) {
  char where[32];
  if (op.rs) {
    for (int r = 0; r < 4; ++r) {
      if (op.asrc[r] == op.amine[r]) continue;
      site_text(op.site, where, sizeof where);
      char msg[400];
      snprintf(msg, sizeof msg,
               "wgmma: A register a[%d] of an mma_async in flight (instruction #%u%s) was "
               "written before the wait that completes it: %#010x at issue, %#010x at the wait "
               "(PTX ISA wgmma.wait_group: the A registers of an mma_async are not to be "
               "accessed until a wait covers it)",
               r, op.index, where, op.amine[r], op.asrc[r]);
      trap(msg);
    }
  }
  Acc &e = s->accs[op.acc];
  if (!e.raw) {
    uint32_t diff = 0; /* one pass without branches first: the usual case is no write */
    for (uint32_t j = 0; j < e.nf; ++j) {
      uint32_t bits;
      memcpy(&bits, &e.d[j], sizeof bits);
      diff |= bits ^ kPoison;
    }
    for (uint32_t j = 0; diff != 0 && j < e.nf; ++j) {
      uint32_t bits;
      memcpy(&bits, &e.d[j], sizeof bits);
      if (bits == kPoison) continue;
      site_text(op.site, where, sizeof where);
      char msg[400];
      snprintf(msg, sizeof msg,
               "wgmma: accumulator d[%u][%u] (n%u) of an mma_async in flight (instruction "
               "#%u%s) was written before the wait that completes it: it holds %#010x, not the "
               "emulator's in-flight pattern %#010x (PTX ISA wgmma.wait_group: the accumulator "
               "is not to be accessed until a wait covers the mma)",
               j / 4, j % 4, 2u * e.nf, op.index, where, bits, kPoison);
      trap(msg);
    }
    if (op.accumulate) memcpy(e.d, s->acc_value[op.acc], sizeof(float) * e.nf); /* else unread */
    e.raw = true;
  }
  execute_op(op);
  if (--e.pending == 0) e.d = nullptr; /* d holds the result; the kernel may use it */
}

/* fence.proxy.async.shared::cta: the calling thread's landed cp.async writes become visible
 * to the async proxy (the runtime clears its marks). */
inline void fence_proxy_async() { fence_proxy_async_shared(); }

/* At issue, the shared operand chunks of op must hold no generic-proxy write whose writer has
 * not fenced since (see the top comment, "Proxies"). The warpgroup's 128 threads split the
 * chunks: thread r of the warpgroup checks A's chunk r (row r / 2, k half r % 2) and B's chunks
 * r, r + 128, ... of 2N (K-major: column j / 2, k half j % 2; MN-major: k = j % 16, columns
 * 8 (j / 16)..+7); the convergence check makes every thread issue the same operands, so
 * together they cover each operand once. Chunks outside shared memory are left to the bounds
 * check at the wait. */
inline void proxy_check_chunk(const Op &op, uint32_t off, const char *which) {
  const int writer = unfenced_writer(off);
  if (writer < 0) return;
  char where[32], msg[400];
  site_text(op.site, where, sizeof where);
  snprintf(msg, sizeof msg,
           "wgmma: mma_async (instruction #%u%s) reads %s operand bytes at shared offset %u..%u "
           "written by cp.async of thread %d (warp %d lane %d) with no fence.proxy.async in that "
           "thread since its cp.async wait (PTX ISA: cp.async writes through the generic proxy, "
           "wgmma reads through the async proxy; the writer fences, then the barrier)",
           op.index, where, which, off & ~15u, (off & ~15u) + 15, writer, writer / 32, writer % 32);
  trap(msg);
}

inline void proxy_check(const State *s, const Op &op) {
  const uint32_t r = s->thread % 128;
  if (!op.rs) {
    const Desc da = decode(op.adesc, "A");
    proxy_check_chunk(op, element_offset(da, true, r >> 1, 8 * (r & 1)), "A");
  }
  const Desc db = decode(op.bdesc, "B");
  const uint32_t nchunks = 16u * op.n8; /* 2N */
  for (uint32_t j = r; j < nchunks; j += 128) {
    const uint32_t off = op.trans_b ? element_offset(db, false, 8 * (j / 16), j % 16)
                                    : element_offset(db, true, j >> 1, 8 * (j & 1));
    proxy_check_chunk(op, off, "B");
  }
}

/* The .aligned instructions' entry points are not inlined: their return address is the call
 * site in the kernel (see the top comment). */
__attribute__((noinline)) inline void fence() {
  State *s = state();
  note(s, insn(kFence, __builtin_return_address(0)));
  s->fenced = true;
}

__attribute__((noinline)) inline void commit() {
  State *s = state();
  note(s, insn(kCommit, __builtin_return_address(0)));
  if (s->gtail - s->ghead >= static_cast<uint32_t>(kMaxGroups))
    trap("wgmma: more than 32 committed groups pending (emulator limit; wait sooner)");
  s->group_end[s->gtail++ % kMaxGroups] = s->tail;
}

__attribute__((noinline)) inline void wait(int n) {
  if (n < 0) trap("wgmma.wait_group with a negative count");
  State *s = state();
  Insn in = insn(kWait, __builtin_return_address(0));
  in.arg = static_cast<uint32_t>(n);
  note(s, in);
  while (s->gtail - s->ghead > static_cast<uint32_t>(n)) {
    const uint32_t end = s->group_end[s->ghead++ % kMaxGroups];
    for (; s->head != end; ++s->head) run_op(s, s->ops[s->head % kMaxOps]);
  }
  /* Accumulators that later groups still hold go back to the poison until those run. */
  for (int i = 0; i < kMaxAccs; ++i) {
    Acc &e = s->accs[i];
    if (e.d == nullptr || !e.raw) continue;
    memcpy(s->acc_value[i], e.d, sizeof(float) * e.nf);
    poison(e.d, e.nf);
    e.raw = false;
  }
  s->fenced = false;
}

inline Op *issue(State *s, const Insn &in, float *d, int n, uint64_t adesc, uint64_t bdesc,
                 bool accumulate, bool bf16, bool trans_b, bool rs) {
  if (!s->fenced)
    trap("wgmma: mma_async issued without wgmma_fence since the thread started or last waited");
  if (n != 64 && n != 128) trap("wgmma: N must be 64 or 128");
  if (s->tail - s->head >= static_cast<uint32_t>(kMaxOps))
    trap("wgmma: more than 64 mma_async pending in a thread (emulator limit; wait sooner)");
  Op *op = &s->ops[s->tail++ % kMaxOps];
  op->d = d;
  op->adesc = adesc;
  op->bdesc = bdesc;
  op->n8 = static_cast<uint8_t>(n / 8);
  op->accumulate = accumulate;
  op->bf16 = bf16;
  op->trans_b = trans_b;
  op->rs = rs;
  op->asrc = nullptr;
  op->site = in.site;
  op->index = s->issued - 1; /* note() numbered it */
  hold_accumulator(s, op);
  return op;
}

__attribute__((noinline)) inline void mma_ss(float *d, int n, uint64_t adesc, uint64_t bdesc,
                                             bool accumulate, bool bf16, bool trans_b) {
  State *s = state();
  Insn in = insn(kMmaSS, __builtin_return_address(0));
  in.adesc = adesc;
  in.bdesc = bdesc;
  in.arg = mma_arg(n, accumulate, bf16, trans_b);
  note(s, in);
  proxy_check(s, *issue(s, in, d, n, adesc, bdesc, accumulate, bf16, trans_b, false));
}

/* The warp's A fragments are gathered once at issue; the thread's own registers must not
 * change until the wait executes the op (checked there, run_op). Lanes must agree on the
 * operation, as the .aligned instruction requires. */
__attribute__((noinline)) inline void mma_rs(float *d, int n, const uint32_t *a, uint64_t bdesc,
                                             bool accumulate, bool bf16, bool trans_b) {
  State *s = state();
  Insn in = insn(kMmaRS, __builtin_return_address(0));
  in.bdesc = bdesc;
  in.arg = mma_arg(n, accumulate, bf16, trans_b);
  note(s, in);
  struct Deposit {
    uint32_t a[4];
    uint64_t bdesc;
    uint32_t shape; /* n | accumulate << 16 | bf16 << 17 | trans_b << 18 */
  } mine;
  memcpy(mine.a, a, sizeof mine.a);
  mine.bdesc = bdesc;
  mine.shape = in.arg;
  const unsigned char *slots = warp_gather(&mine, sizeof mine);
  const int l = lane(), g = l / 4;
  Op *op = issue(s, in, d, n, 0, bdesc, accumulate, bf16, trans_b, true);
  proxy_check(s, *op);
  op->asrc = a;
  memcpy(op->amine, mine.a, sizeof op->amine);
  for (int q = 0; q < 4; ++q) {
    Deposit from;
    memcpy(&from, slots + static_cast<size_t>(4 * g + q) * kGatherSlot, sizeof from);
    if (from.bdesc != mine.bdesc || from.shape != mine.shape)
      trap("wgmma: lanes of a warp issue different mma_async (descriptor, N or flags differ)");
    /* lane 4g + q: a[0] = row g, k 2q..2q+1; a[1] = row g + 8; a[2], a[3]: the same, k + 8 */
    for (int h = 0; h < 2; ++h) {
      op->a[0][2 * q + h] = static_cast<uint16_t>(from.a[0] >> (16 * h));
      op->a[1][2 * q + h] = static_cast<uint16_t>(from.a[1] >> (16 * h));
      op->a[0][2 * q + 8 + h] = static_cast<uint16_t>(from.a[2] >> (16 * h));
      op->a[1][2 * q + 8 + h] = static_cast<uint16_t>(from.a[3] >> (16 * h));
    }
  }
}

}  // namespace wgmma
}  // namespace rda_emu

#endif
