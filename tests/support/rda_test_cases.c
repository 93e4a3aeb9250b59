/* rda_test_cases.c — the guarded pieces the forward and backward range cases are cut into.
 * Test-only code: out of memory fails the test. */
// clang-format off
#include "rda_test_cases.h"

#include "config.h"
#include "rda_test_backend.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */
// clang-format on

/* The rows from host or, with host NULL, every byte of them `fill`. */
static void guarded_make(rda_backend *b, rt_guarded *g, const void *host, unsigned char fill,
                         size_t esize, long long B, long long N, long long X, long long lo,
                         long long len) {
  const long long rows = len + 2 * RT_GUARD_ROWS;
  const size_t row_bytes = (size_t)X * esize;
  g->esize = esize;
  g->batch = B;
  g->len = len;
  g->x = X;
  g->sb = rows * X;
  g->bytes = (size_t)(B * rows) * row_bytes;
  unsigned char *h = malloc(g->bytes);
  assert_non_null(h);
  memset(h, 0xff, g->bytes);
  for (long long ib = 0; ib < B; ++ib) {
    unsigned char *dst = h + (size_t)(ib * rows + RT_GUARD_ROWS) * row_bytes;
    if (host != NULL)
      memcpy(dst, (const unsigned char *)host + (size_t)(ib * N + lo) * row_bytes,
             (size_t)len * row_bytes);
    else
      memset(dst, fill, (size_t)len * row_bytes);
  }
  g->base = rt_dev_alloc(b, g->bytes);
  rt_dev_upload(b, g->base, h, g->bytes);
  free(h);
  g->view = g->base + (size_t)RT_GUARD_ROWS * row_bytes;
}

void rt_guarded_copy(rda_backend *b, rt_guarded *g, const void *host, size_t esize, long long B,
                     long long N, long long X, long long lo, long long len) {
  assert_non_null(host);
  guarded_make(b, g, host, 0, esize, B, N, X, lo, len);
}

void rt_guarded_fill(rda_backend *b, rt_guarded *g, unsigned char fill, size_t esize, long long B,
                     long long N, long long X, long long lo, long long len) {
  guarded_make(b, g, NULL, fill, esize, B, N, X, lo, len);
}

void rt_guarded_take(rda_backend *b, rt_guarded *g, float *full, long long N, long long lo,
                     long long *bad) {
  unsigned char *h = malloc(g->bytes);
  assert_non_null(h);
  rt_dev_download(b, h, g->base, g->bytes);
  const long long rows = g->len + 2 * RT_GUARD_ROWS;
  const size_t row_bytes = (size_t)g->x * g->esize;
  for (long long ib = 0; ib < g->batch; ++ib)
    for (long long t = 0; t < rows; ++t) {
      const unsigned char *src = h + (size_t)(ib * rows + t) * row_bytes;
      if (t < RT_GUARD_ROWS || t >= RT_GUARD_ROWS + g->len) {
        for (size_t i = 0; i < row_bytes; ++i) *bad += src[i] != 0xff;
      } else if (full != NULL) {
        memcpy(full + (ib * N + lo + t - RT_GUARD_ROWS) * g->x, src, row_bytes);
      }
    }
  free(h);
  b->free(b, g->base);
  g->base = g->view = NULL;
}

static long long ceil_div(long long a, long long b) {
  return (a + b - 1) / b;
}

int rt_segment_launches(long long qlo, long long qhi, long long klo, long long khi, long long w,
                        long long seg0[2], long long nseg[2]) {
  const long long ma = qlo / w > klo / w ? qlo / w : klo / w;
  const long long mb = (qhi - 1) / w < (khi - 1) / w ? (qhi - 1) / w : (khi - 1) / w;
  int n = 0;
  for (long long m0 = ma; m0 <= mb; m0 = m0 == ma ? ma + 1 : mb + 1) {
    seg0[n] = m0;
    nseg[n++] = m0 == ma ? 1 : mb - ma;
  }
  return n;
}

int rt_kv_spans(const rda_config *cfg, int branch, int head0, int nheads, long long N, int nk,
                const long long *kcut, rt_kv_span **out) {
  const long long w = cfg->segments[branch] < N ? cfg->segments[branch] : N;
  const long long r = cfg->dilations[branch], group = cfg->heads / cfg->kv_heads;
  const long long nseg = ceil_div(N, w);
  rt_kv_span *sp = malloc((size_t)(nheads * nseg * nk + 1) * sizeof *sp); /* + 1: never 0 */
  assert_non_null(sp);
  int n = 0;
  for (int h = head0; h < head0 + nheads; ++h) {
    const long long j = rda_config_offset(cfg, branch, h);
    for (long long m = 0; m < nseg; ++m) {
      const long long a = m * w, e = a + w < N ? a + w : N;
      for (int ik = 0; ik < nk; ++ik) {
        const long long lo = kcut[ik] > a ? kcut[ik] : a;
        const long long hi = kcut[ik + 1] < e ? kcut[ik + 1] : e;
        /* Grid rows t with a + j + t r in [lo, hi). */
        const long long t0 = lo - a - j <= 0 ? 0 : ceil_div(lo - a - j, r);
        const long long t1 = hi - a - j <= 0 ? 0 : ceil_div(hi - a - j, r);
        if (t1 <= t0) continue;
        sp[n++] = (rt_kv_span){.head = h,
                               .kv_head = h / group,
                               .seg = m,
                               .a = a,
                               .e = e,
                               .lo = lo,
                               .hi = hi,
                               .pos0 = a + j + t0 * r,
                               .r = r,
                               .rows = t1 - t0};
      }
    }
  }
  *out = sp;
  return n;
}

uint16_t *rt_kv_block(rda_backend *b, const uint16_t *bits, long long B, long long N, long long Hkv,
                      long long D, const rt_kv_span *sp, long long guard) {
  const long long pitch = RT_KV_SLOTS * D, brows = sp->rows + 2 * guard;
  const size_t count = (size_t)(B * brows * pitch);
  uint16_t *h = malloc(count * sizeof *h);
  assert_non_null(h);
  memset(h, 0xff, count * sizeof *h);
  for (long long ib = 0; ib < B; ++ib)
    for (long long t = 0; t < sp->rows; ++t) {
      const size_t src = (size_t)(((ib * N + sp->pos0 + t * sp->r) * Hkv + sp->kv_head) * D);
      const size_t dst = (size_t)((ib * brows + guard + t) * pitch + RT_KV_SLOT * D);
      memcpy(h + dst, bits + src, (size_t)D * sizeof *h);
    }
  uint16_t *dev = rt_dev_alloc(b, count * sizeof *dev);
  rt_dev_upload(b, dev, h, count * sizeof *h);
  free(h);
  return dev;
}
