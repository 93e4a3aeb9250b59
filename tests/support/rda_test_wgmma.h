/* rda_test_wgmma.h — what the wgmma tests share (test_emu on the emulator, test_cuda on an
 * sm_90 GPU, both running tests/kernels/emu_wgmma.cu): the kernel's configuration ints, the PTX
 * ISA's canonical shared-memory layouts of an operand, the cases both check, and the
 * configuration block one case launches with. */
#ifndef RDA_TEST_WGMMA_H
#define RDA_TEST_WGMMA_H

#include <stddef.h>
#include <stdint.h>

/* tests/kernels/emu_wgmma.cu's configuration ints (its kCfg*; in1), then from RT_WG_INTS the
 * register A fragments, [step][thread % 128][4] uint32. */
enum {
  RT_WG_RS,
  RT_WG_N,
  RT_WG_F16,
  RT_WG_TRANSB,
  RT_WG_ACC,
  RT_WG_STEPS,
  RT_WG_ALBO,
  RT_WG_ASBO,
  RT_WG_ASWZ,
  RT_WG_BLBO,
  RT_WG_BSBO,
  RT_WG_BSWZ,
  RT_WG_PEEK,
  RT_WG_CLOBBER,
  RT_WG_NOFENCE,
  RT_WG_NOWAIT,
  RT_WG_ASTART = 16,
  RT_WG_BSTART = 24,
  RT_WG_REPEAT = 32, /* after BSTART's 8 slots (24..31) */
  RT_WG_INTS = 33
};

/* One operand (MN x K, 16-bit) as a test lays it out in shared memory, by the canonical layouts
 * of the PTX ISA ("Shared Memory Matrix Layout": the CuTe table of "Canonical Layouts", T = 8):
 *   K-major,  none:  ((8,m),(T,2k)):((1T,SBO),(1,LBO))
 *   K-major,  W-byte swizzle: ((8,m),(T,2k)):((W/2,SBO),(1,T)), atoms of W/2 k; katom apart
 *   MN-major, none:  ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))
 *   MN-major, W-byte swizzle: ((T,W/16,m),(8,k)):((1,T,LBO),(W/2,SBO))
 * then the swizzle, as the docs' swizzle-atom figures draw it: within each 8-row x W-byte atom,
 * 16-byte chunk j of row r is stored at chunk j ^ (r / (128 / W)). */
typedef struct rt_wg_layout {
  int k_major;
  int swz; /* descriptor mode: 0 none, 1 128B, 2 64B, 3 32B */
  int lbo, sbo, katom;
  int base; /* 1024-aligned byte offset of the operand in the image */
} rt_wg_layout;

int rt_wg_width(int swz);                                /* W: 0, 128, 64 or 32 bytes */
int rt_wg_logical(const rt_wg_layout *L, int mn, int k); /* byte offset before the swizzle */
int rt_wg_phys(const rt_wg_layout *L, int mn, int k);    /* byte offset of element (mn, k) */
int rt_wg_extent(const rt_wg_layout *L, int mn, int kk); /* bytes the mn x kk operand spans */

/* The swizzled layouts the cases use: K-major with 8-row groups sbo_gap atoms apart (mn rows),
 * and MN-major with dense k groups and the column atoms after all of K. */
rt_wg_layout rt_wg_k_sw(int swz, int mn, int sbo_gap);
rt_wg_layout rt_wg_mn_sw(int swz, int K);

typedef struct rt_wg_case {
  const char *what;
  int rs, n, f16, acc, steps, warpgroups;
  rt_wg_layout a, b; /* b.k_major = 0: trans-b */
  int clobber;       /* zero the image between commit and wait (emulator only) */
  int reps;          /* the whole sequence (fence, k steps, commit, wait) repeated; 0: once */
} rt_wg_case;

/* The layout cases both tests check for one dtype and N (K = 64): SS and RS, B K- and MN-major,
 * the 128-, 64- and 32-byte swizzles and none (LBO and SBO explicit and unequal), one of two
 * warpgroups. Fills out; returns how many (RT_WG_NCASES). */
enum { RT_WG_NCASES = 10 };
int rt_wg_layout_cases(int f16, int n, rt_wg_case out[RT_WG_NCASES]);

/* Places the case's operands: A at 0 and B after it, 1024-aligned (SS); B at 0 (RS). */
void rt_wg_place(rt_wg_case *c);

/* The mma.m16n8k16 A fragment (16 x 16, PTX ISA): element i = 0..7 (register i / 2, half i % 2)
 * of lane `lane` is A[*row][*col]. */
void rt_mma_a_pos(int lane, int i, int *row, int *col);
/* Sets half `hi` (0 low, 1 high) of *reg to v. */
void rt_set_half(uint32_t *reg, int hi, uint16_t v);

/* The configuration block of case c (placed), calloc'ed: every int the kernel reads from the
 * case, each step's start addresses and (RS) each thread's A fragments from Abits (64 x K,
 * row-major). *bytes receives its size. PEEK, NOFENCE and NOWAIT are left 0. */
int *rt_wg_config(const rt_wg_case *c, const uint16_t *Abits, size_t *bytes);

#endif
