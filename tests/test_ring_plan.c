/* test_ring_plan.c — the ring's communication plan against a brute-force enumeration of SPEC §1
 * on global positions: every key row a rank's queries need is local or received exactly once,
 * nothing is received that no local query needs, sends match receives, and the totals add up. */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rda_test.h"
#include "ring_plan.h"

/* Owner of a row, computed independently of the plan. */
static int owner_of(long long n, int P, int layout, long long row) {
  if (layout == RDA_RING_ZIGZAG) {
    const long long c = row / (n / (2 * P));
    return (int)(c < P ? c : 2 * P - 1 - c);
  }
  long long start = 0;
  for (int q = 0; q < P; q++) {
    const long long len = n / P + (q < n % P ? 1 : 0);
    if (row < start + len) return q;
    start += len;
  }
  return -1;
}

/* The brute-force truth for one (config, N, P, layout). need[((x * nb + i) * Hkv + kv) * N + q]
 * is 1 when a query of rank x in branch i with kv head kv pairs with key row q owned by another
 * rank; pairs[x] and remote_pairs[x] count (query head, query row, key row) triples. */
typedef struct truth {
  unsigned char *need;
  double *pairs, *remote_pairs;
} truth;

static size_t need_index(const rda_config *c, long long n, int x, int i, int kv, long long q) {
  return ((((size_t)x * (size_t)c->nbranch + (size_t)i) * (size_t)c->kv_heads + (size_t)kv) *
          (size_t)n) +
         (size_t)q;
}

static truth brute_force(const rda_config *c, long long n, int P, int layout) {
  truth t;
  t.need = calloc((size_t)P * (size_t)c->nbranch * (size_t)c->kv_heads * (size_t)n, 1);
  t.pairs = calloc((size_t)P, sizeof(double));
  t.remote_pairs = calloc((size_t)P, sizeof(double));
  assert_non_null(t.need);
  const int group = c->heads / c->kv_heads;
  for (int i = 0; i < c->nbranch; i++) {
    const long long w = c->segments[i] < n ? c->segments[i] : n, r = c->dilations[i];
    for (int h = 0; h < c->heads; h++) {
      const long long j = rda_config_offset(c, i, h);
      if (j < 0) continue;
      for (long long a = 0; a < n; a += w) {
        const long long b = a + w < n ? a + w : n;
        for (long long p = a + j; p < b; p += r) {
          const int x = owner_of(n, P, layout, p);
          for (long long q = a + j; q < b; q += r) {
            if (c->causal && q > p) break;
            t.pairs[x] += 1.0;
            if (owner_of(n, P, layout, q) != x) {
              t.remote_pairs[x] += 1.0;
              t.need[need_index(c, n, x, i, h / group, q)] = 1;
            }
          }
        }
      }
    }
  }
  return t;
}

static void truth_free(truth *t) {
  free(t->need), free(t->pairs), free(t->remote_pairs);
}

/* Every invariant of one plan against the brute force. The invariant on rows, per branch and
 * kv head: the rows a rank receives are exactly the remote rows its queries pair with — each
 * once, none it owns, none no local query needs (causal blocks are trimmed to the receiver's
 * last query row, so the ring's block granularity adds nothing). */
static void check_plan(const rda_config *c, long long n, int P, int layout) {
  char what[160];
  snprintf(what, sizeof what, "H %d Hkv %d %s %s N %lld P %d %s", c->heads, c->kv_heads,
           rda_offsets_name(c->offsets), c->causal ? "causal" : "non-causal", n, P,
           rda_ring_layout_name(layout));
  rda_ring_plan *p = NULL;
  rda_err err = {0};
  if (rda_ring_plan_create(c, n, P, layout, &p, &err) != RDA_OK) fail_msg("%s: %s", what, err.msg);
  truth t = brute_force(c, n, P, layout);
  const size_t cells = (size_t)P * (size_t)c->nbranch * (size_t)c->kv_heads * (size_t)n;
  unsigned char *got = calloc(cells, 1);
  assert_non_null(got);
  rda_ring_step **steps = calloc((size_t)P, sizeof *steps);
  int64_t *nsteps = calloc((size_t)P, sizeof *nsteps);
  long long max_rows = 0;
  for (int x = 0; x < P; x++) {
    const rda_ring_rank *rk = rda_ring_plan_rank(p, x);
    long long rows = 0;
    for (int q = 0; q < rk->npieces; q++)
      for (long long row = rk->lo[q]; row < rk->hi[q]; row++) {
        if (owner_of(n, P, layout, row) != x)
          fail_msg("%s: rank %d piece holds row %lld", what, x, row);
        if (rda_ring_plan_owner(p, row) != x) fail_msg("%s: owner(%lld) != %d", what, row, x);
        rows++;
      }
    if (rows != rk->rows)
      fail_msg("%s: rank %d rows %lld != %lld", what, x, (long long)rk->rows, rows);
    if (rows > max_rows) max_rows = rows;
    if (fabs(rk->pairs - t.pairs[x]) > 0.5 || fabs(rk->recv_pairs - t.remote_pairs[x]) > 0.5)
      fail_msg("%s: rank %d pairs %.0f (remote %.0f), brute force %.0f (remote %.0f)", what, x,
               rk->pairs, rk->recv_pairs, t.pairs[x], t.remote_pairs[x]);
    if (fabs(rk->flops - 4.0 * c->head_dim * t.pairs[x]) > 0.5)
      fail_msg("%s: rank %d flops", what, x);
    if (rda_ring_plan_steps(p, x, &steps[x], &nsteps[x], &err) != RDA_OK)
      fail_msg("%s: %s", what, err.msg);
  }
  for (int x = 0; x < P; x++) {
    uint64_t sent = 0, recvd = 0;
    for (int64_t s = 0; s < nsteps[x]; s++) {
      const rda_ring_step *st = &steps[x][s];
      if (s > 0) { /* keys (bundle, shift, group) strictly increase: the order all agree on */
        const rda_ring_step *pr = &steps[x][s - 1];
        if (!(st->bundle > pr->bundle ||
              (st->bundle == pr->bundle &&
               (st->shift > pr->shift || (st->shift == pr->shift && st->group > pr->group)))))
          fail_msg("%s: rank %d steps out of order at %lld", what, x, (long long)s);
        /* A bundle is groups of one (branch, segment), in class order. */
        if (st->bundle == pr->bundle && (st->branch != pr->branch || st->segment != pr->segment))
          fail_msg("%s: rank %d bundle %lld spans two segments", what, x, (long long)st->bundle);
      }
      rda_ring_group gr;
      rda_ring_plan_group(p, st->group, &gr);
      if (gr.bundle != st->bundle) fail_msg("%s: step and group bundles differ", what);
      rda_ring_class cl;
      rda_ring_plan_class(p, st->cls, &cl);
      assert_int_equal(cl.branch, st->branch);
      for (int k = 0; k < st->nrecv; k++) {
        const rda_ring_xfer *xf = &st->recv[k];
        if (xf->bytes != (uint64_t)xf->rows * (uint64_t)cl.nkv * (uint64_t)c->head_dim * 4u)
          fail_msg("%s: rank %d recv bytes", what, x);
        recvd += xf->bytes;
        /* The matching send: same (group, shift) on the peer, same rows. */
        int matched = 0;
        for (int64_t u = 0; u < nsteps[xf->peer] && !matched; u++) {
          const rda_ring_step *ps = &steps[xf->peer][u];
          if (ps->group != st->group || ps->shift != st->shift) continue;
          for (int m = 0; m < ps->nsend; m++)
            if (ps->send[m].peer == x && ps->send[m].nranges == xf->nranges &&
                ps->send[m].rows == xf->rows && ps->send[m].first[0] == xf->first[0] &&
                ps->send[m].count[0] == xf->count[0])
              matched = 1;
        }
        if (!matched)
          fail_msg("%s: rank %d receive from %d has no matching send", what, x, xf->peer);
        long long total = 0;
        for (int g = 0; g < xf->nranges; g++)
          for (long long u = 0; u < xf->count[g]; u++) {
            const long long row = xf->first[g] + u * st->stride;
            if (row < 0 || row >= n) fail_msg("%s: row %lld out of range", what, row);
            if (owner_of(n, P, layout, row) != xf->peer)
              fail_msg("%s: rank %d gets row %lld from %d, which does not own it", what, x, row,
                       xf->peer);
            for (int v = 0; v < cl.nkv; v++) {
              const size_t idx = need_index(c, n, x, st->branch, cl.kv_heads[v], row);
              if (got[idx]++)
                fail_msg("%s: rank %d receives row %lld kv %d twice", what, x, row, cl.kv_heads[v]);
              if (!t.need[idx])
                fail_msg(
                    "%s: rank %d receives row %lld (branch %d, kv %d) that no local query needs",
                    what, x, row, st->branch, cl.kv_heads[v]);
            }
            total++;
          }
        if (total != xf->rows) fail_msg("%s: xfer rows", what);
      }
      rda_ring_xfer own;
      if (!rda_ring_plan_own_block(p, st->group, x, &own))
        fail_msg("%s: rank %d has a step in group %d but no block", what, x, st->group);
      for (int k = 0; k < st->nsend; k++) {
        /* Every send is a prefix of the rank's own block in that group. */
        const rda_ring_xfer *sx = &st->send[k];
        if (sx->first[0] != own.first[0] || sx->rows > own.rows ||
            (sx->nranges == 2 && (sx->first[1] != own.first[1] || sx->count[0] != own.count[0])) ||
            (sx->nranges == 1 && sx->count[0] > own.count[0]))
          fail_msg("%s: rank %d sends rows that are not a prefix of its block", what, x);
        sent += st->send[k].bytes;
        for (int g = 0; g < st->send[k].nranges; g++)
          if (owner_of(n, P, layout, st->send[k].first[g]) != x)
            fail_msg("%s: rank %d sends a row it does not own", what, x);
      }
    }
    const rda_ring_rank *rk = rda_ring_plan_rank(p, x);
    if (sent != rk->bytes_sent || recvd != rk->bytes_received)
      fail_msg("%s: rank %d totals %llu/%llu, steps say %llu/%llu", what, x,
               (unsigned long long)rk->bytes_sent, (unsigned long long)rk->bytes_received,
               (unsigned long long)sent, (unsigned long long)recvd);
    /* O(N/P): the packed send block and two buffers of one step's receives, each block at most
     * the largest rank (an all-gather only fits inside what the ring needs), plus each block's
     * alignment. */
    const uint64_t bound =
        3u * (uint64_t)max_rows * (uint64_t)c->kv_heads * (uint64_t)c->head_dim * 4u +
        3u * (RDA_RING_BLOCK_ALIGN - 1);
    if (rk->peak_bytes > bound)
      fail_msg("%s: rank %d peak %llu > 3 blocks %llu", what, x, (unsigned long long)rk->peak_bytes,
               (unsigned long long)bound);
    if (rk->bytes_received > 0 && rk->peak_bytes == 0) fail_msg("%s: peak 0", what);
  }
  for (size_t q = 0; q < cells; q++)
    if (t.need[q] && !got[q]) {
      const long long row = (long long)(q % (size_t)n);
      fail_msg("%s: a needed remote row %lld (cell %zu) is never received", what, row, q);
    }
  /* The peers a rank connects to at ring creation: ascending, exactly the ranks its steps send
   * to or receive from, and mirrored (a connect whose lists differ would hang over NCCL). */
  int *peers = malloc((size_t)P * P * sizeof *peers), *npeers = calloc((size_t)P, sizeof *npeers);
  assert_non_null(peers), assert_non_null(npeers);
  for (int x = 0; x < P; x++) {
    rda_ring_steps_peers(steps[x], nsteps[x], x, peers + (size_t)x * P, &npeers[x]);
    unsigned char *talks = calloc((size_t)P, 1);
    assert_non_null(talks);
    for (int64_t s = 0; s < nsteps[x]; s++) {
      for (int k = 0; k < steps[x][s].nsend; k++) talks[steps[x][s].send[k].peer] = 1;
      for (int k = 0; k < steps[x][s].nrecv; k++) talks[steps[x][s].recv[k].peer] = 1;
    }
    int want = 0;
    for (int q = 0; q < P; q++) want += talks[q] && q != x;
    if (npeers[x] != want) fail_msg("%s: rank %d has %d peers, its steps %d", what, x, npeers[x], want);
    for (int i = 0; i < npeers[x]; i++) {
      const int q = peers[(size_t)x * P + i];
      if (q == x || !talks[q] || (i > 0 && q <= peers[(size_t)x * P + i - 1]))
        fail_msg("%s: rank %d peer list wrong at %d", what, x, i);
    }
    free(talks);
  }
  for (int x = 0; x < P; x++)
    for (int i = 0; i < npeers[x]; i++) {
      const int q = peers[(size_t)x * P + i];
      int back = 0;
      for (int j = 0; j < npeers[q]; j++) back |= peers[(size_t)q * P + j] == x;
      if (!back) fail_msg("%s: rank %d connects to %d, which does not connect back", what, x, q);
    }
  free(peers), free(npeers);
  for (int x = 0; x < P; x++) free(steps[x]);
  free(steps), free(nsteps), free(got);
  truth_free(&t);
  rda_ring_plan_destroy(p);
}

typedef struct cfg_case {
  int heads, kv, offsets, nb;
  long long w[3], r[3];
} cfg_case;

static const cfg_case cases[] = {
    {4, 2, RDA_OFFSETS_MOD, 3, {8, 16, 32}, {1, 2, 4}},      /* GQA, LongNet-style */
    {8, 8, RDA_OFFSETS_BLOCK, 2, {12, 40, 0}, {2, 3, 0}},    /* block offsets */
    {6, 2, RDA_OFFSETS_GROUP, 3, {16, 24, 1000}, {1, 2, 4}}, /* group, w > N clamps */
    {4, 1, RDA_OFFSETS_MOD, 2, {5, 64, 0}, {1, 8, 0}},       /* MQA, r > rows per rank */
    {3, 3, RDA_OFFSETS_MOD, 1, {100000, 0, 0}, {1, 0, 0}},   /* one segment spans all */
};

static void make_case(rda_config *c, const cfg_case *k, int causal) {
  rt_config_make(c, k->heads, k->kv, 32, RDA_DTYPE_BF16, causal, k->offsets, k->nb, k->w, k->r);
}

static void test_ring_plan_matches_brute_force_contiguous(void **state) {
  (void)state;
  static const long long ns[] = {1, 7, 37, 64, 101};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int causal = 0; causal < 2; causal++) {
      rda_config c;
      make_case(&c, &cases[k], causal);
      for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (int P = 1; P <= 8; P++) /* P > N too: the ranks past the rows own none */
          check_plan(&c, ns[a], P, RDA_RING_CONTIGUOUS);
    }
}

static void test_ring_plan_matches_brute_force_zigzag(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int causal = 0; causal < 2; causal++) {
      rda_config c;
      make_case(&c, &cases[k], causal);
      for (int P = 1; P <= 8; P++) {
        check_plan(&c, 2 * P * 5, P, RDA_RING_ZIGZAG);
        check_plan(&c, 2 * P * 1, P, RDA_RING_ZIGZAG);
      }
    }
}

static void test_ring_plan_random_configs_match_brute_force(void **state) {
  (void)state;
  rt_rng *g = rt_global_rng();
  for (int it = 0; it < 60; it++) {
    const int kv = (int)rt_rng_range(g, 1, 3), heads = kv * (int)rt_rng_range(g, 1, 3);
    const int offsets = (int)rt_rng_range(g, 0, 2);
    int nb = (int)rt_rng_range(g, 1, 3);
    if (offsets == RDA_OFFSETS_GROUP && nb > heads) nb = heads;
    long long w[3], r[3];
    for (int i = 0; i < nb; i++) w[i] = rt_rng_range(g, 1, 90), r[i] = rt_rng_range(g, 1, 6);
    rda_config c;
    rt_config_make(&c, heads, kv, 32, RDA_DTYPE_FP16, (int)rt_rng_range(g, 0, 1), offsets, nb, w,
                   r);
    const int P = (int)rt_rng_range(g, 1, 8);
    const int zig = (int)rt_rng_range(g, 0, 1);
    const long long n = zig ? 2 * P * rt_rng_range(g, 1, 8) : rt_rng_range(g, P, 120);
    check_plan(&c, n, P, zig ? RDA_RING_ZIGZAG : RDA_RING_CONTIGUOUS);
  }
}

static void test_ring_plan_local_segments_send_nothing(void **state) {
  (void)state;
  const long long w[] = {8, 16}, r[] = {1, 2};
  for (int causal = 0; causal < 2; causal++) {
    rda_config c;
    rt_config_make(&c, 4, 2, 64, RDA_DTYPE_BF16, causal, RDA_OFFSETS_MOD, 2, w, r);
    rda_ring_plan *p = NULL;
    rda_err err = {0};
    assert_int_equal(rda_ring_plan_create(&c, 64, 4, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
    assert_int_equal(rda_ring_plan_ngroups(p), 0);
    for (int x = 0; x < 4; x++) {
      const rda_ring_rank *rk = rda_ring_plan_rank(p, x);
      assert_int_equal(rk->bytes_sent, 0);
      assert_int_equal(rk->bytes_received, 0);
      assert_int_equal(rk->peak_bytes, 0);
      assert_int_equal(rk->steps, 0);
      assert_true(rk->pairs > 0.0);
    }
    rda_ring_plan_destroy(p);
    /* Uneven N moves the boundaries into segments: now some branches communicate. */
    assert_int_equal(rda_ring_plan_create(&c, 65, 4, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
    assert_true(rda_ring_plan_ngroups(p) > 0);
    assert_true(rda_ring_plan_rank(p, 0)->bytes_sent > 0);
    rda_ring_plan_destroy(p);
  }
}

static void test_ring_plan_branch_that_fits_is_silent_beside_one_that_spans(void **state) {
  (void)state;
  const long long w[] = {16, 64}, r[] = {1, 4};
  rda_config c;
  rt_config_make(&c, 4, 4, 32, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, 2, w, r);
  rda_ring_plan *p = NULL;
  rda_err err = {0};
  assert_int_equal(rda_ring_plan_create(&c, 64, 4, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
  assert_int_equal(rda_ring_plan_branch(p, 0)->ngroups, 0);
  assert_int_equal(rda_ring_plan_branch(p, 0)->bytes, 0);
  assert_true(rda_ring_plan_branch(p, 1)->ngroups > 0);
  assert_true(rda_ring_plan_branch(p, 1)->bytes > 0);
  rda_ring_plan_destroy(p);
}

/* An all-gather of 3 members receives both other blocks in one step, and the driver
 * double-buffers a round's receive block: alone it would hold 5 blocks where the ring holds 3
 * (at P = 3 more than at P = 2). It is taken only inside the receive block the rings need
 * anyway, where it saves a step: here branch 1's small groups beside branch 0's large ones. */
static void test_ring_plan_allgather_only_when_it_costs_no_memory(void **state) {
  (void)state;
  const long long w[] = {60, 60}, r[] = {1, 4};
  rda_config c;
  rt_config_make(&c, 4, 4, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, w, r);
  uint64_t last_peak = UINT64_MAX;
  for (int P = 2; P <= 6; P++) {
    rda_ring_plan *p = NULL;
    rda_err err = {0};
    assert_int_equal(rda_ring_plan_create(&c, 60, P, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
    assert_int_equal(rda_ring_plan_ngroups(p), 1);
    rda_ring_group g;
    rda_ring_plan_group(p, 0, &g);
    assert_int_equal(g.nmembers, P);
    assert_int_equal(g.kind, RDA_RING_KIND_RING);
    if (P == 3) assert_non_null(strstr(g.why, "raise a rank's ring memory"));
    assert_int_equal(rda_ring_plan_rank(p, 0)->steps, P - 1);
    /* Ring memory per rank shrinks with P: send block + two receive blocks of 60/P rows. */
    const uint64_t peak = rda_ring_plan_rank(p, 0)->peak_bytes;
    assert_true(peak < last_peak);
    assert_int_equal(peak, 3u * (uint64_t)(60 / P) * 4u * 32u * 4u);
    last_peak = peak;
    rda_ring_plan_destroy(p);
  }
  /* Two branches over 3 ranks: branch 0 (one class of 4 kv heads, 20 rows a rank: 10240-byte
   * blocks) stays a ring; branch 1 (r = 4: 4 classes of 1 kv head, 5 rows a rank) gathers each
   * of its 4 groups in one step (one round of 4 x 1280 bytes), inside branch 0's receive block:
   * 6 steps instead of 10, and the memory of branch 0 alone. */
  rda_config two;
  rt_config_make(&two, 4, 4, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 2, w, r);
  rda_ring_plan *p = NULL, *p0 = NULL;
  rda_err err = {0};
  assert_int_equal(rda_ring_plan_create(&two, 60, 3, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
  assert_int_equal(rda_ring_plan_create(&c, 60, 3, RDA_RING_CONTIGUOUS, &p0, &err), RDA_OK);
  assert_int_equal(rda_ring_plan_ngroups(p), 5);
  for (int64_t gi = 0; gi < 5; gi++) {
    rda_ring_group g;
    rda_ring_plan_group(p, gi, &g);
    assert_int_equal(g.kind, g.branch == 0 ? RDA_RING_KIND_RING : RDA_RING_KIND_ALLGATHER);
    assert_non_null(strstr(g.why, g.branch == 0 ? "ring" : "all-gather"));
  }
  assert_int_equal(rda_ring_plan_branch(p, 1)->nallgather, 4);
  for (int q = 0; q < 3; q++) {
    assert_int_equal(rda_ring_plan_rank(p, q)->steps, 2 + 4); /* rings only: 2 + 4 x 2 */
    assert_int_equal(rda_ring_plan_rank(p, q)->peak_bytes, rda_ring_plan_rank(p0, q)->peak_bytes);
  }
  rda_ring_plan_destroy(p), rda_ring_plan_destroy(p0);
  c.causal = 1;
  p = NULL;
  assert_int_equal(rda_ring_plan_create(&c, 60, 3, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
  rda_ring_group g;
  rda_ring_plan_group(p, 0, &g);
  assert_int_equal(g.kind, RDA_RING_KIND_RING);
  assert_non_null(strstr(g.why, "causal"));
  /* Causal: rank 0 needs nothing from later ranks; the last rank sends nothing. */
  assert_int_equal(rda_ring_plan_rank(p, 0)->bytes_received, 0);
  assert_int_equal(rda_ring_plan_rank(p, 2)->bytes_sent, 0);
  rda_ring_plan_destroy(p);
}

/* Every small plan, contiguous and zigzag, causal or not: no step has more than the two
 * transfers each way a step holds, and all-gathers have 3 members (a 6-rank all-gather of
 * uneven blocks once overflowed them: heads 1, w = 14, r = 2, N = 29, P = 6). */
static void test_ring_plan_steps_never_exceed_two_transfers(void **state) {
  (void)state;
  for (long long w = 1; w <= 24; w++)
    for (long long r = 1; r <= 3; r++)
      for (int causal = 0; causal < 2; causal++) {
        rda_config c;
        const long long ws[] = {w}, rs[] = {r};
        rt_config_make(&c, 1, 1, 32, RDA_DTYPE_BF16, causal, RDA_OFFSETS_MOD, 1, ws, rs);
        for (int P = 2; P <= 8; P++)
          for (long long n = 1; n <= 32; n++)
            for (int layout = 0; layout < 2; layout++) {
              if (layout == RDA_RING_ZIGZAG && n % (2 * P) != 0) continue;
              rda_ring_plan *p = NULL;
              rda_err err = {0};
              if (rda_ring_plan_create(&c, n, P, layout, &p, &err) != RDA_OK)
                fail_msg("w %lld r %lld N %lld P %d: %s", w, r, n, P, err.msg);
              for (int64_t g = 0; g < rda_ring_plan_ngroups(p); g++) {
                rda_ring_group grp;
                rda_ring_plan_group(p, g, &grp);
                if (grp.kind == RDA_RING_KIND_ALLGATHER && grp.nmembers != 3)
                  fail_msg("w %lld r %lld N %lld P %d: an all-gather of %d members", w, r, n, P,
                           grp.nmembers);
              }
              for (int q = 0; q < P; q++) {
                rda_ring_step *st = NULL;
                int64_t ns = 0;
                assert_int_equal(rda_ring_plan_steps(p, q, &st, &ns, &err), RDA_OK);
                for (int64_t i = 0; i < ns; i++)
                  if (st[i].nsend > 2 || st[i].nrecv > 2 || st[i].nsend < 0 || st[i].nrecv < 0)
                    fail_msg("w %lld r %lld N %lld P %d rank %d: %d sends, %d receives", w, r, n, P,
                             q, st[i].nsend, st[i].nrecv);
                free(st);
              }
              rda_ring_plan_destroy(p);
            }
      }
}

static void test_ring_plan_peak_bytes_shrink_as_one_over_p(void **state) {
  (void)state;
  const long long w[] = {1 << 22, 4096}, r[] = {4, 1};
  for (int causal = 0; causal < 2; causal++) {
    rda_config c;
    rt_config_make(&c, 8, 2, 128, RDA_DTYPE_BF16, causal, RDA_OFFSETS_MOD, 2, w, r);
    uint64_t prev = 0;
    /* From P = 4 on every rank holds its block and two receive buffers (at P = 2 one). */
    for (int P = 4; P <= 64; P *= 2) {
      rda_ring_plan *p = NULL;
      rda_err err = {0};
      assert_int_equal(rda_ring_plan_create(&c, 1 << 22, P, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
      uint64_t peak = 0;
      for (int x = 0; x < P; x++)
        if (rda_ring_plan_rank(p, x)->peak_bytes > peak)
          peak = rda_ring_plan_rank(p, x)->peak_bytes;
      /* Never the whole sequence: at most 3 blocks of N/P rows of every kv head. */
      assert_true(peak <= 3ull * ((1ull << 22) / (unsigned)P + 1) * 2u * 128u * 4u);
      if (prev > 0) {
        const double ratio = (double)peak / (double)prev;
        if (ratio < 0.45 || ratio > 0.55)
          fail_msg("peak %llu at P %d vs %llu at P %d: ratio %.3f, expected ~1/2",
                   (unsigned long long)peak, P, (unsigned long long)prev, P / 2, ratio);
      }
      prev = peak;
      rda_ring_plan_destroy(p);
    }
  }
}

static void expect_create_error(const rda_config *c, long long n, int P, int layout,
                                const char *part) {
  rda_ring_plan *p = (rda_ring_plan *)1;
  rda_err err = {0};
  assert_int_equal(rda_ring_plan_create(c, n, P, layout, &p, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_null(p);
  if (strstr(err.msg, part) == NULL) fail_msg("message \"%s\" lacks \"%s\"", err.msg, part);
  assert_null(strchr(err.msg, '\n'));
}

static void test_ring_plan_rejects_bad_shapes(void **state) {
  (void)state;
  const long long w[] = {16}, r[] = {2};
  rda_config c;
  rt_config_make(&c, 4, 2, 32, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, 1, w, r);
  expect_create_error(&c, 100, 8, RDA_RING_ZIGZAG, "multiple of 2P = 16");
  expect_create_error(&c, 0, 1, RDA_RING_CONTIGUOUS, "1 <= N <= 2^40");
  expect_create_error(&c, RDA_RING_MAX_N + 1, 2, RDA_RING_CONTIGUOUS, "1 <= N <= 2^40");
  rda_config big = c;
  big.segments[0] = RDA_RING_MAX_N + 1;
  expect_create_error(&big, 100, 2, RDA_RING_CONTIGUOUS, "not validated");
  big = c, big.dilations[0] = RDA_RING_MAX_N + 1;
  expect_create_error(&big, 100, 2, RDA_RING_CONTIGUOUS, "not validated");
  expect_create_error(&c, 100, 0, RDA_RING_CONTIGUOUS, "1 <= P");
  expect_create_error(&c, 100000, RDA_RING_MAX_RANKS + 1, RDA_RING_CONTIGUOUS, "P <=");
  expect_create_error(&c, 100, 2, 7, "layout");
  assert_int_equal(rda_ring_layout_parse("zigzag"), RDA_RING_ZIGZAG);
  assert_int_equal(rda_ring_layout_parse("contiguous"), RDA_RING_CONTIGUOUS);
  assert_int_equal(rda_ring_layout_parse("ring"), -1);
}

/* Byte counts at the largest N: exact where they fit (2^55 bytes a rank), one error line where
 * a block, a rank's total or the world's would pass 2^63 - 1 (they used to wrap). */
static void test_ring_plan_bytes_never_wrap(void **state) {
  (void)state;
  const long long N = RDA_RING_MAX_N, w[] = {RDA_RING_MAX_N}, r[] = {1};
  rda_config c;
  rt_config_make(&c, 64, 64, 256, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, w, r);
  rda_ring_plan *p = NULL;
  rda_err err = {0};
  assert_int_equal(rda_ring_plan_create(&c, N, 2, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
  const uint64_t block = (uint64_t)(N / 2) * 64u * 256u * RDA_RING_KV_ELEM_BYTES; /* 2^55 */
  for (int x = 0; x < 2; x++) {
    const rda_ring_rank *rk = rda_ring_plan_rank(p, x);
    assert_true(rk->bytes_sent == block && rk->bytes_received == block);
    assert_true(rk->peak_bytes == 3 * block); /* own block + two receive blocks */
  }
  assert_true(rda_ring_plan_branch(p, 0)->bytes == 2 * block);
  rda_ring_plan_destroy(p);
  /* The review's case: 64 heads of 256 over 1024 ranks move ~2^66 bytes in all. */
  expect_create_error(&c, N, 1024, RDA_RING_CONTIGUOUS, "too large for the ring");
  expect_create_error(&c, N, 1024, RDA_RING_CONTIGUOUS, "branch 0");
  rt_config_make(&c, 65535, 65535, 256, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, w, r);
  expect_create_error(&c, N, 2, RDA_RING_CONTIGUOUS, "a block of one segment group");
  expect_create_error(&c, N, 1024, RDA_RING_CONTIGUOUS, "rank 0");
  c.causal = 1;
  expect_create_error(&c, N, 4096, RDA_RING_ZIGZAG, "too large for the ring");
}

/* The pipeline model on a case worked by hand: P = 2, non-causal, one segment of all N = 64
 * rows, 4 heads (2 kv) of 32: each rank sends and receives one block of 32 rows x 2 x 32 x 4 =
 * 8192 bytes in one round and computes 32 x 32 x 4 pairs x 128 flops = 2^19 flops on its own
 * block, then as much on the received one. */
static void test_ring_sim_overlap_matches_hand_model(void **state) {
  (void)state;
  const long long w[] = {64}, r[] = {1};
  rda_config c;
  rt_config_make(&c, 4, 2, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, w, r);
  rda_ring_plan *p = NULL;
  rda_err err = {0};
  assert_int_equal(rda_ring_plan_create(&c, 64, 2, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
  rda_ring_sim sim[2];
  /* link 8192 B/s: comm 1 s. Compute 0.25 s a block: total 1.25, 0.75 s exposed, 25% hidden. */
  const double f_fast = 524288.0 / 0.25, f_slow = 524288.0 / 2.0;
  assert_int_equal(rda_ring_plan_simulate(p, 8192.0, f_fast, sim, &err), RDA_OK);
  for (int x = 0; x < 2; x++) {
    assert_float_equal(sim[x].comm_s, 1.0, 1e-12);
    assert_float_equal(sim[x].compute_s, 0.5, 1e-12);
    assert_float_equal(sim[x].total_s, 1.25, 1e-12);
    assert_float_equal(sim[x].exposed_s, 0.75, 1e-12);
    assert_float_equal(sim[x].overlap, 0.25, 1e-12);
  }
  /* Compute 2 s a block: the transfer hides wholly behind the local block. */
  assert_int_equal(rda_ring_plan_simulate(p, 8192.0, f_slow, sim, &err), RDA_OK);
  for (int x = 0; x < 2; x++) {
    assert_float_equal(sim[x].total_s, 4.0, 1e-12);
    assert_float_equal(sim[x].exposed_s, 0.0, 1e-12);
    assert_float_equal(sim[x].overlap, 1.0, 1e-12);
  }
  /* Rates must be finite, normal and positive; the message names which. */
  const double bad[] = {0.0, -1.0, 1e-320, INFINITY, NAN};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memset(&err, 0, sizeof err);
    assert_int_equal(rda_ring_plan_simulate(p, bad[i], f_fast, sim, &err),
                     RDA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "link rate"));
    memset(&err, 0, sizeof err);
    assert_int_equal(rda_ring_plan_simulate(p, 8192.0, bad[i], sim, &err),
                     RDA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "compute rate"));
  }
  rda_ring_plan_destroy(p);
  /* A rank that moves nothing (P = 1) has nothing to hide. */
  assert_int_equal(rda_ring_plan_create(&c, 64, 1, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
  assert_int_equal(rda_ring_plan_simulate(p, 8192.0, f_fast, sim, &err), RDA_OK);
  assert_float_equal(sim[0].comm_s, 0.0, 0.0);
  assert_float_equal(sim[0].overlap, 1.0, 0.0);
  assert_float_equal(sim[0].total_s, sim[0].compute_s, 1e-15);
  rda_ring_plan_destroy(p);
}

static void test_ring_plan_fingerprint_covers_every_input(void **state) {
  (void)state;
  const long long w[] = {16, 32}, r[] = {1, 2};
  rda_config c;
  rt_config_make(&c, 4, 2, 32, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, 2, w, r);
  const uint64_t base = rda_ring_fingerprint(&c, 100, 4, RDA_RING_CONTIGUOUS);
  assert_true(base == rda_ring_fingerprint(&c, 100, 4, RDA_RING_CONTIGUOUS));
  assert_true(base != rda_ring_fingerprint(&c, 101, 4, RDA_RING_CONTIGUOUS));
  assert_true(base != rda_ring_fingerprint(&c, 100, 5, RDA_RING_CONTIGUOUS));
  assert_true(base != rda_ring_fingerprint(&c, 100, 4, RDA_RING_ZIGZAG));
  rda_config d = c;
  d.dtype = RDA_DTYPE_FP16;
  assert_true(base != rda_ring_fingerprint(&d, 100, 4, RDA_RING_CONTIGUOUS));
  d = c, d.dilations[1] = 3;
  assert_true(base != rda_ring_fingerprint(&d, 100, 4, RDA_RING_CONTIGUOUS));
  d = c, d.causal = 0;
  assert_true(base != rda_ring_fingerprint(&d, 100, 4, RDA_RING_CONTIGUOUS));
  d = c, d.offsets = RDA_OFFSETS_BLOCK;
  assert_true(base != rda_ring_fingerprint(&d, 100, 4, RDA_RING_CONTIGUOUS));
  /* Bit 63 is a failed rank's word (RDA_TRANSPORT_JOIN_FAILED): never a fingerprint's. */
  for (long long n = 1; n <= 4096; n++)
    if (rda_ring_fingerprint(&c, n, 4, RDA_RING_CONTIGUOUS) >> 63)
      fail_msg("N %lld: the fingerprint has bit 63 set", n);
}

/* Planning time is judged by this thread's CPU time against a bound far above the work and
 * far below the blow-ups these tests guard against (hours; minutes for one class per head),
 * so a loaded machine or a sanitizer build does not fail them. */
#define PLAN_CPU_LIMIT_S 120.0

/* N = 1e9 over P = 1024: per segment group arithmetic, seconds not hours; the numbers add up. */
static void test_ring_sim_billion_rows_1024_ranks_is_fast_and_consistent(void **state) {
  (void)state;
  const long long w[] = {2048, 1 << 20, 1000000000}, r[] = {1, 4, 16};
  for (int causal = 0; causal < 2; causal++) {
    rda_config c;
    rt_config_make(&c, 8, 2, 128, RDA_DTYPE_BF16, causal, RDA_OFFSETS_MOD, 3, w, r);
    const double t0 = rt_thread_cpu_s();
    rda_ring_plan *p = NULL;
    rda_err err = {0};
    assert_int_equal(rda_ring_plan_create(&c, 1000000000, 1024, RDA_RING_CONTIGUOUS, &p, &err),
                     RDA_OK);
    rda_ring_sim *sim = calloc(1024, sizeof *sim);
    assert_int_equal(rda_ring_plan_simulate(p, 450e9, 400e12, sim, &err), RDA_OK);
    const double took = rt_thread_cpu_s() - t0;
    if (took > PLAN_CPU_LIMIT_S) fail_msg("plan + simulation took %.1f s of CPU", took);
    double sent = 0, recvd = 0;
    for (int x = 0; x < 1024; x++) {
      const rda_ring_rank *rk = rda_ring_plan_rank(p, x);
      sent += (double)rk->bytes_sent, recvd += (double)rk->bytes_received;
      assert_true(rk->rows == 976562 || rk->rows == 976563);
      assert_true(isfinite(sim[x].total_s) && sim[x].total_s > 0.0);
      assert_true(fabs(sim[x].compute_s - rk->flops / 400e12) <= 1e-9 * sim[x].compute_s + 1e-15);
      assert_true(sim[x].total_s + 1e-12 >= sim[x].compute_s);
      assert_true(sim[x].total_s <= sim[x].compute_s + sim[x].comm_s + 1e-9);
      assert_true(sim[x].exposed_s >= 0.0 && sim[x].exposed_s <= sim[x].comm_s);
      assert_true(fabs(sim[x].total_s - sim[x].compute_s - sim[x].exposed_s) <=
                  1e-9 * sim[x].total_s);
      assert_true(sim[x].overlap >= 0.0 && sim[x].overlap <= 1.0);
      /* O(N/P) memory: 3 blocks of at most 976563 rows of both kv heads. */
      assert_true(rk->peak_bytes <= 3ull * 976563ull * 2ull * 128ull * 4ull);
      assert_true(rk->bytes_received > 0 || (causal && x == 0));
    }
    assert_true(sent == recvd);
    /* The 2048 branch: every segment group spans at most 2 ranks (976562 rows each). */
    assert_true(rda_ring_plan_branch(p, 0)->ngroups <= 1023);
    /* The 1e9 branch spans all ranks: 4 classes (r = 16, 8 heads: offsets 0..7 -> 8). */
    assert_int_equal(rda_ring_plan_branch(p, 2)->nclasses, 8);
    free(sim);
    rda_ring_plan_destroy(p);
  }
}

/* r > H in every branch makes every head a class of its own: 16 branches of 65535 classes.
 * Finding them must not cost H^2 per branch (310 s once, two such plans here; now well under a
 * second); the classes are each head, its offset ascending. */
static void test_ring_plan_one_class_per_head_is_fast(void **state) {
  (void)state;
  long long w[16], r[16];
  for (int i = 0; i < 16; i++) w[i] = 4096LL * (i + 1), r[i] = 65536 + i;
  for (int block = 0; block < 2; block++) {
    rda_config c;
    rt_config_make(&c, 65535, 1, 32, RDA_DTYPE_BF16, 0,
                   block ? RDA_OFFSETS_BLOCK : RDA_OFFSETS_MOD, 16, w, r);
    const double t0 = rt_thread_cpu_s();
    rda_ring_plan *p = NULL;
    rda_err err = {0};
    assert_int_equal(rda_ring_plan_create(&c, 100000, 2, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
    const double took = rt_thread_cpu_s() - t0;
    if (took > PLAN_CPU_LIMIT_S) fail_msg("the plan took %.1f s of CPU", took);
    for (int i = 0; i < 16; i++) assert_int_equal(rda_ring_plan_branch(p, i)->nclasses, 65535);
    rda_ring_plan_destroy(p);
  }
  /* The same over 4096 ranks: each class's one row per segment is placed by bisection and the
   * pairs of a rank summed over the classes in closed form, not class by class per rank and
   * segment (4e9 steps, 96 s once; now a tenth of a second), with a bound of its own. Each
   * head's row a + h of a segment is its only key: 8191 pairs per branch. */
  rda_config c;
  rt_config_make(&c, 65535, 1, 256, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 16, w, r);
  const double t0 = rt_thread_cpu_s();
  rda_ring_plan *p = NULL;
  rda_err err = {0};
  assert_int_equal(rda_ring_plan_create(&c, 8191, 4096, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
  const double took = rt_thread_cpu_s() - t0;
  if (took > 20.0) fail_msg("the plan over 4096 ranks took %.1f s of CPU", took);
  double pairs = 0.0;
  for (int x = 0; x < 4096; x++) pairs += rda_ring_plan_rank(p, x)->pairs;
  assert_true(pairs == 16.0 * 8191.0);
  rda_ring_plan_destroy(p);
}

/* --- the command line ----------------------------------------------------------------------- */

static char *write_config(char *dir) {
  char *path = rt_path(dir, "ring.lua");
  const char text[] =
      "return { heads = 4, kv_heads = 2, head_dim = 64, dtype = 'bf16',\n"
      "  segments = { 64, 1000000 }, dilations = { 1, 4 }, causal = true }\n";
  assert_true(rt_write_file(path, text, strlen(text)));
  return path;
}

/* Run rdagen with args (NULL-terminated, without argv[0]). */
static void run_cli(const char *const args[], int want_exit, const char *want_part) {
  char *argv[24];
  int n = 0;
  argv[n++] = (char *)(uintptr_t)RDAGEN_PATH;
  for (int i = 0; args[i] != NULL && n < 23; i++) argv[n++] = (char *)(uintptr_t)args[i];
  argv[n] = NULL;
  rt_proc pr;
  assert_true(rt_run(argv, 120, &pr));
  if (pr.exit_code != want_exit)
    fail_msg("%s %s: exit %d, want %d; stderr: %s", args[0], args[1], pr.exit_code, want_exit,
             pr.err);
  if (want_part != NULL) {
    const char *hay = want_exit == 0 ? pr.out : pr.err;
    if (strstr(hay, want_part) == NULL) fail_msg("output lacks \"%s\": %s", want_part, hay);
  }
  if (want_exit == 1) {
    assert_int_equal(rt_count_lines(pr.err), 1);
    assert_non_null(strstr(pr.err, "rdagen: error: "));
  }
  rt_proc_free(&pr);
}

static void test_ring_sim_cli_prints_ranks_and_rejects_bad_input(void **state) {
  (void)state;
  char *dir = rt_mkdtemp();
  char *cfg = write_config(dir);
  {
    /* A billion rows is a prediction, and says so (nothing may pass for a measurement). */
    const char *argv[] = {"ring-sim", cfg, "--n", "1e9", "--ranks", "1024", NULL};
    run_cli(argv, 0, "predicted slowest rank");
    run_cli(argv, 0, "PREDICTED by rdagen ring-sim");
    run_cli(argv, 0, "nothing was run or measured");
  }
  {
    const char *argv[] = {"ring-sim", cfg,        "--n",    "4096",   "--ranks",
                          "8",        "--layout", "zigzag", "--json", NULL};
    run_cli(argv, 0, "\"peak_bytes\"");
    run_cli(argv, 0, "{\"groups\": 4, \"why\": \"ring: causal; ");
    run_cli(argv, 0, "\"overlap\"");
    run_cli(argv, 0, "\"predicted\": true");
    run_cli(argv, 0, "nothing was run or measured");
    run_cli(argv, 0, "\"pass\": \"forward\", \"batch\": 1,"); /* what the numbers cover */
  }
  {
    const char *argv[] = {"ring-sim", cfg, "--n", "4096", "--ranks", "8", NULL};
    run_cli(argv, 0, "overlap");
    run_cli(argv, 0, "; forward pass, one batch entry\n");
    run_cli(argv, 0, "why      branch 1, "); /* the plan's reasons for ring or all-gather */
  }
  {
    /* 2^40 + 1 rows; rates that were accepted before and gave inf or a misleading error. */
    const char *argv[] = {"ring-sim", cfg, "--n", "1099511627777", "--ranks", "2", NULL};
    run_cli(argv, 2, "--n");
    const char *a2[] = {"ring-sim", cfg,           "--n",    "100", "--ranks",
                        "2",        "--link-gbps", "1e-320", NULL};
    run_cli(a2, 2, "--link-gbps");
    const char *a3[] = {"ring-sim", cfg, "--n", "100", "--ranks", "2", "--tflops", "1e308", NULL};
    run_cli(a3, 2, "--tflops");
    const char *a4[] = {"ring-sim", cfg, "--n", "100", "--ranks", "2", "--tflops=inf", NULL};
    run_cli(a4, 2, "--tflops");
  }
  {
    /* Bytes past 2^63 - 1: one error line, never negative numbers. */
    char *huge = rt_path(dir, "huge.lua");
    const char text[] =
        "return { heads = 65535, head_dim = 256, dtype = 'bf16',\n"
        "  segments = { 1099511627776 }, dilations = { 1 } }\n";
    assert_true(rt_write_file(huge, text, strlen(text)));
    const char *argv[] = {"ring-sim", huge, "--n", "1099511627776", "--ranks", "2", "--json", NULL};
    run_cli(argv, 1, "too large for the ring");
    free(huge);
  }
  {
    const char *argv[] = {"ring-sim", cfg,        "--n",    "100", "--ranks",
                          "8",        "--layout", "zigzag", NULL};
    run_cli(argv, 1, "multiple of 2P = 16");
  }
  {
    /* More ranks than rows: the last four own none and move nothing. */
    const char *argv[] = {"ring-sim", cfg, "--n", "4", "--ranks", "8", "--json", NULL};
    run_cli(argv, 0, "{\"rank\": 7, \"rows\": 0, \"bytes_sent\": 0, \"bytes_received\": 0, "
                     "\"peak_bytes\": 0, \"steps\": 0,");
  }
  {
    char *missing = rt_path(dir, "missing.lua");
    const char *argv[] = {"ring-sim", missing, "--n", "100", "--ranks", "2", NULL};
    run_cli(argv, 1, "missing.lua");
    free(missing);
  }
  {
    const char *argv[] = {"ring-sim", cfg, "--n", "100", NULL};
    run_cli(argv, 2, "--ranks");
  }
  {
    const char *argv[] = {"ring-sim", cfg, "--n", "1.5", "--ranks", "2", NULL};
    run_cli(argv, 2, "--n");
  }
  {
    const char *argv[] = {"ring-sim", cfg, "--n", "100", "--ranks", "2", "--link-gbps", "0", NULL};
    run_cli(argv, 2, "--link-gbps");
  }
  {
    const char *argv[] = {"ring-sim", cfg,        "--n",    "100", "--ranks",
                          "2",        "--layout", "spiral", NULL};
    run_cli(argv, 2, "--layout");
  }
  {
    const char *argv[] = {"ring-sim", cfg, "--n", "100", "--ranks", "2", "--bogus", NULL};
    run_cli(argv, 2, "unknown option");
  }
  {
    /* One spelling per number: plain digits, or decimal scientific for N. No space, sign, hex,
     * fraction or special value slips through strtod; no option twice. */
    static const char *const good[] = {"4096", "4.096e3", "1e+3", "1E3"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
      const char *argv[] = {"ring-sim", cfg, "--n", good[i], "--ranks", "2", NULL};
      run_cli(argv, 0, "overlap");
    }
    static const char *const bad[] = {"0x10", "0x1p5", " 16", "\t16", "+16", "16 ", "1e-3",
                                      "inf",  "nan",   "1e",  "e3",   ".",   "",    "--ranks"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      const char *argv[] = {"ring-sim", cfg, "--ranks", "2", "--n", bad[i], NULL};
      run_cli(argv, 2, "--n");
    }
    const char *a1[] = {"ring-sim", cfg, "--n", "100", "--ranks", "1e1", NULL};
    run_cli(a1, 2, "--ranks");
    const char *a2[] = {"ring-sim", cfg, "--n", "100", "--ranks", "2", "--link-gbps", "0x64", NULL};
    run_cli(a2, 2, "--link-gbps");
    const char *a3[] = {"ring-sim", cfg, "--n", "100", "--ranks", "2", "--tflops", " 400", NULL};
    run_cli(a3, 2, "--tflops");
    const char *a4[] = {"ring-sim", cfg, "--n", "100", "--ranks", "2", "--ranks", "4", NULL};
    run_cli(a4, 2, "--ranks given twice");
    const char *a5[] = {"ring-sim", cfg,        "--n",    "100",        "--ranks", "2",
                        "--layout", "zigzag", "--layout", "contiguous", NULL};
    run_cli(a5, 2, "--layout given twice");
  }
  {
    /* A table or JSON that cannot be written is an error, not a silent success. */
    for (int json = 0; json < 2; json++) {
      char cmd[4200];
      snprintf(cmd, sizeof cmd, "exec '%s' ring-sim '%s' --n 100 --ranks 2%s >/dev/full",
               RDAGEN_PATH, cfg, json ? " --json" : "");
      char sh[] = "/bin/sh", c_opt[] = "-c";
      char *argv[] = {sh, c_opt, cmd, NULL};
      rt_proc pr;
      assert_true(rt_run(argv, 120, &pr));
      assert_int_equal(pr.exit_code, 1);
      assert_int_equal(rt_count_lines(pr.err), 1);
      assert_non_null(strstr(pr.err, "rdagen: error: cannot write to standard output"));
      rt_proc_free(&pr);
    }
  }
  free(cfg);
  rt_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_plan_matches_brute_force_contiguous),
      cmocka_unit_test(test_ring_plan_matches_brute_force_zigzag),
      cmocka_unit_test(test_ring_plan_random_configs_match_brute_force),
      cmocka_unit_test(test_ring_plan_local_segments_send_nothing),
      cmocka_unit_test(test_ring_plan_branch_that_fits_is_silent_beside_one_that_spans),
      cmocka_unit_test(test_ring_plan_allgather_only_when_it_costs_no_memory),
      cmocka_unit_test(test_ring_plan_steps_never_exceed_two_transfers),
      cmocka_unit_test(test_ring_plan_peak_bytes_shrink_as_one_over_p),
      cmocka_unit_test(test_ring_plan_rejects_bad_shapes),
      cmocka_unit_test(test_ring_plan_bytes_never_wrap),
      cmocka_unit_test(test_ring_sim_overlap_matches_hand_model),
      cmocka_unit_test(test_ring_plan_fingerprint_covers_every_input),
      cmocka_unit_test(test_ring_sim_billion_rows_1024_ranks_is_fast_and_consistent),
      cmocka_unit_test(test_ring_plan_one_class_per_head_is_fast),
      cmocka_unit_test(test_ring_sim_cli_prints_ranks_and_rejects_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
