/* rda_test_cases.c — the guarded pieces the forward and backward range cases are cut into.
 * Test-only code: out of memory fails the test. */
// clang-format off
#include "rda_test_cases.h"

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
