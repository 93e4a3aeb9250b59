/* rda_test_wgmma.c — see rda_test_wgmma.h. */
#include "rda_test_wgmma.h"

#include <stdlib.h>

int rt_wg_width(int swz) {
  static const int w[4] = {0, 128, 64, 32};
  return w[swz & 3];
}

int rt_wg_logical(const rt_wg_layout *L, int mn, int k) {
  const int W = rt_wg_width(L->swz), E = W / 2;
  if (L->k_major) {
    if (W == 0) return L->base + (mn / 8) * L->sbo + (k / 8) * L->lbo + (mn % 8) * 16 + (k % 8) * 2;
    return L->base + (k / E) * L->katom + (mn / 8) * L->sbo + (mn % 8) * W + (k % E) * 2;
  }
  if (W == 0) return L->base + (mn / 8) * L->sbo + (k / 8) * L->lbo + (k % 8) * 16 + (mn % 8) * 2;
  return L->base + (mn / E) * L->lbo + (k / 8) * L->sbo + (k % 8) * W + (mn % E) * 2;
}

int rt_wg_phys(const rt_wg_layout *L, int mn, int k) {
  const int off = rt_wg_logical(L, mn, k), W = rt_wg_width(L->swz);
  if (W == 0) return off;
  const int row = (off / W) % 8, chunk = (off % W) / 16;
  return off - off % W + (chunk ^ (row / (128 / W))) * 16 + off % 16;
}

int rt_wg_extent(const rt_wg_layout *L, int mn, int kk) {
  int end = 0;
  for (int m = 0; m < mn; ++m)
    for (int k = 0; k < kk; ++k) {
      const int e = rt_wg_phys(L, m, k) + 2;
      if (e > end) end = e;
    }
  return end;
}

rt_wg_layout rt_wg_k_sw(int swz, int mn, int sbo_gap) {
  const int W = rt_wg_width(swz);
  const rt_wg_layout L = {1, swz, 16, 8 * W * sbo_gap, (mn / 8) * 8 * W * sbo_gap, 0};
  return L;
}

rt_wg_layout rt_wg_mn_sw(int swz, int K) {
  /* atoms of W/2 columns x 8 k rows; k groups dense, column atoms after all of K */
  const int W = rt_wg_width(swz);
  const rt_wg_layout L = {0, swz, (K / 8) * 8 * W, 8 * W, 0, 0};
  return L;
}

int rt_wg_layout_cases(int f16, int n, rt_wg_case out[RT_WG_NCASES]) {
  const int K = 64;
  /* No swizzle: 8 x 16-byte core matrices, LBO and SBO explicit and unequal. */
  const rt_wg_layout a_none = {1, 0, 128, (K / 8) * 128, 0, 0};
  const rt_wg_layout b_none_k = {1, 0, (n / 8) * 128, 128, 0, 0};
  const rt_wg_layout b_none_mn = {0, 0, (n / 8) * 128, 128, 0, 0};
  const rt_wg_case cases[RT_WG_NCASES] = {
      /* SS, both K-major 128B; A's 8-row groups 2048 bytes apart (gaps of random data). */
      {"ss k-major sw128", 0, n, f16, 1, 4, 1, rt_wg_k_sw(1, 64, 2), rt_wg_k_sw(1, n, 1), 0, 0},
      /* SS, B MN-major 128B: LBO steps N (64-column atoms), SBO steps K (8 rows). */
      {"ss b mn-major sw128", 0, n, f16, 0, 4, 1, rt_wg_k_sw(1, 64, 1), rt_wg_mn_sw(1, K), 0, 0},
      /* RS, two warpgroups (warp index % 4 picks the rows). */
      {"rs b k-major sw128", 1, n, f16, 0, 4, 2, rt_wg_k_sw(1, 64, 1), rt_wg_k_sw(1, n, 1), 0, 0},
      {"rs b mn-major sw128", 1, n, f16, 1, 4, 1, rt_wg_k_sw(1, 64, 1), rt_wg_mn_sw(1, K), 0, 0},
      {"ss k-major none", 0, n, f16, 1, 4, 1, a_none, b_none_k, 0, 0},
      {"ss b mn-major none", 0, n, f16, 0, 4, 1, a_none, b_none_mn, 0, 0},
      {"rs b mn-major none", 1, n, f16, 1, 4, 1, a_none, b_none_mn, 0, 0},
      /* 64- and 32-byte swizzles. */
      {"ss k-major sw64 / sw32", 0, n, f16, 1, 4, 1, rt_wg_k_sw(2, 64, 1), rt_wg_k_sw(3, n, 1), 0,
       0},
      {"ss a sw32, b mn-major sw64", 0, n, f16, 1, 4, 1, rt_wg_k_sw(3, 64, 1), rt_wg_mn_sw(2, K), 0,
       0},
      {"rs b mn-major sw32", 1, n, f16, 1, 4, 1, rt_wg_k_sw(1, 64, 1), rt_wg_mn_sw(3, K), 0, 0},
  };
  for (int i = 0; i < RT_WG_NCASES; ++i) out[i] = cases[i];
  return RT_WG_NCASES;
}

void rt_wg_place(rt_wg_case *c) {
  c->b.base = 0;
  if (!c->rs) {
    c->a.base = 0;
    c->b.base = (rt_wg_extent(&c->a, 64, 16 * c->steps) + 1023) / 1024 * 1024;
  }
}

void rt_mma_a_pos(int lane, int i, int *row, int *col) {
  const int g = lane >> 2, tig = lane % 4;
  *row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
  *col = 2 * tig + (i & 1) + (i >= 4 ? 8 : 0);
}

void rt_set_half(uint32_t *reg, int hi, uint16_t v) {
  if (hi)
    *reg = (*reg & 0x0000ffffu) | ((uint32_t)v << 16);
  else
    *reg = (*reg & 0xffff0000u) | v;
}

int *rt_wg_config(const rt_wg_case *c, const uint16_t *Abits, size_t *bytes) {
  const int K = 16 * c->steps;
  const size_t ints = RT_WG_INTS + (size_t)c->steps * 128 * 4;
  int *cfg = calloc(ints, sizeof(int));
  if (cfg == NULL) return NULL;
  *bytes = ints * sizeof(int);
  cfg[RT_WG_RS] = c->rs;
  cfg[RT_WG_N] = c->n;
  cfg[RT_WG_F16] = c->f16;
  cfg[RT_WG_TRANSB] = !c->b.k_major;
  cfg[RT_WG_ACC] = c->acc;
  cfg[RT_WG_STEPS] = c->steps;
  cfg[RT_WG_ALBO] = c->a.lbo;
  cfg[RT_WG_ASBO] = c->a.sbo;
  cfg[RT_WG_ASWZ] = c->a.swz;
  cfg[RT_WG_BLBO] = c->b.lbo;
  cfg[RT_WG_BSBO] = c->b.sbo;
  cfg[RT_WG_BSWZ] = c->b.swz;
  cfg[RT_WG_CLOBBER] = c->clobber;
  cfg[RT_WG_REPEAT] = c->reps > 0 ? c->reps : 1;
  for (int s = 0; s < c->steps; ++s) {
    cfg[RT_WG_ASTART + s] = c->rs ? 0 : rt_wg_logical(&c->a, 0, 16 * s);
    cfg[RT_WG_BSTART + s] = rt_wg_logical(&c->b, 0, 16 * s);
  }
  /* RS: thread t's A fragment of step s, the mma.m16n8k16 A layout of its warp's 16 rows. */
  uint32_t *frag = (uint32_t *)(cfg + RT_WG_INTS);
  for (int s = 0; s < c->steps && c->rs; ++s)
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < 8; ++i) {
        int row, col;
        rt_mma_a_pos(t % 32, i, &row, &col);
        rt_set_half(&frag[((size_t)s * 128 + (size_t)t) * 4 + (size_t)i / 2], i % 2,
                    Abits[(16 * (t / 32) + row) * K + 16 * s + col]);
      }
  return cfg;
}
