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
 * reading shared memory and d at that moment. So reading d, or overwriting an operand tile,
 * before the wait shows up as it could on hardware. Traps: an mma with no wgmma_fence since the
 * thread started or last waited (the docs require the fence before the first mma and after
 * register accesses to d/A; every wait is treated as such an access — stricter than hardware
 * only for a kernel that issues after a wait without touching any accumulator); a thread that
 * exits with operations pending; more than kMaxOps pending or kMaxGroups open groups
 * (emulator limits). Uncommitted operations are not executed by a wait (the docs: wait_group
 * waits for committed groups only). fence_proxy_async is a no-op (the emulator has one proxy). */
#ifndef RDA_WGMMA_EMU_H
#define RDA_WGMMA_EMU_H

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "emu_api.h"

namespace rda_emu {
namespace wgmma {

constexpr int kMaxOps = 64;    /* issued, not yet executed, per thread */
constexpr int kMaxGroups = 32; /* committed, not yet executed, per thread */

struct Op {
  float *d;
  uint64_t adesc, bdesc;
  uint16_t a[2][16]; /* RS: this thread's rows g and g + 8 of A, k = 0..15 (16-bit bits) */
  uint8_t n8;        /* N / 8 */
  bool accumulate, bf16, trans_b, rs;
};

struct State {
  uint32_t head, tail;   /* ops[head % kMaxOps .. tail % kMaxOps): issued, pending */
  uint32_t ghead, gtail; /* group_end[ghead .. gtail): committed groups, by end index */
  uint32_t group_end[kMaxGroups];
  bool fenced;
  Op ops[kMaxOps];
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
}

inline State *state() {
  return static_cast<State *>(thread_state(sizeof(State), on_thread_exit));
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

inline void fence_proxy_async() {}

inline void fence() {
  state()->fenced = true;
}

inline void commit() {
  State *s = state();
  if (s->gtail - s->ghead >= static_cast<uint32_t>(kMaxGroups))
    trap("wgmma: more than 32 committed groups pending (emulator limit; wait sooner)");
  s->group_end[s->gtail++ % kMaxGroups] = s->tail;
}

inline void wait(int n) {
  if (n < 0) trap("wgmma.wait_group with a negative count");
  State *s = state();
  while (s->gtail - s->ghead > static_cast<uint32_t>(n)) {
    const uint32_t end = s->group_end[s->ghead++ % kMaxGroups];
    for (; s->head != end; ++s->head) execute_op(s->ops[s->head % kMaxOps]);
  }
  s->fenced = false;
}

inline Op *issue(State *s, float *d, int n, uint64_t adesc, uint64_t bdesc, bool accumulate,
                 bool bf16, bool trans_b, bool rs) {
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
  return op;
}

inline void mma_ss(float *d, int n, uint64_t adesc, uint64_t bdesc, bool accumulate, bool bf16,
                   bool trans_b) {
  issue(state(), d, n, adesc, bdesc, accumulate, bf16, trans_b, false);
}

/* The warp's A fragments are gathered once at issue (the registers may change before the op
 * runs); lanes must agree on the operation, as the .aligned instruction requires. */
inline void mma_rs(float *d, int n, const uint32_t *a, uint64_t bdesc, bool accumulate, bool bf16,
                   bool trans_b) {
  State *s = state();
  struct Deposit {
    uint32_t a[4];
    uint64_t bdesc;
    uint32_t shape; /* n | accumulate << 16 | bf16 << 17 | trans_b << 18 */
  } mine;
  memcpy(mine.a, a, sizeof mine.a);
  mine.bdesc = bdesc;
  mine.shape = static_cast<uint32_t>(n) | (accumulate ? 1u << 16 : 0u) | (bf16 ? 1u << 17 : 0u) |
               (trans_b ? 1u << 18 : 0u);
  const unsigned char *slots = warp_gather(&mine, sizeof mine);
  const int l = lane(), g = l / 4;
  Op *op = issue(s, d, n, 0, bdesc, accumulate, bf16, trans_b, true);
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
