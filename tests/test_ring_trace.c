/* test_ring_trace.c — device timelines of ring passes (runtime/ring_trace.c): the emulator's
 * timed events, the marks of a trace with a device part (cap, counting, a wrong backend), and
 * whole rings of virtual ranks (runtime/ring_virtual.c) with timelines on every rank: every
 * mark recorded, times non-decreasing in stream order, the step counts of the schedule. */
#include "backend.h"
#include "gen.h"
#include "rda_test.h"
#include "ring.h"
#include "ring_plan.h"
#include "ring_trace.h"
#include "ring_virtual.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* clang-format off: cmocka.h needs the headers above first */
#include <cmocka.h>
/* clang-format on */

static rda_gen *g_gen;

static int group_setup(void **state) {
  (void)state;
  rda_err err = {0};
  if (rda_gen_open(&g_gen, &err) != RDA_OK) {
    fprintf(stderr, "test_ring_trace: rda_gen_open: %s\n", err.msg);
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  rda_gen_close(g_gen);
  return 0;
}

static rda_backend *emu_open(void) {
  rda_backend *b = NULL;
  rda_err err = {0};
  if (rda_backend_emu_open(&b, 90, &err) != RDA_OK) fail_msg("emu backend: %s", err.msg);
  return b;
}

/* Busy for about us microseconds of the host clock (the emulator's stream time). */
static void spin_us(long us) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do clock_gettime(CLOCK_MONOTONIC, &t1);
  while ((t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000L < us);
}

static void test_emu_timed_events_measure_host_time(void **state) {
  (void)state;
  rda_backend *b = emu_open();
  rda_err err = {0};
  void *ev[4] = {0};
  for (int i = 0; i < 4; ++i) assert_int_equal(b->event_create_timed(b, &ev[i], &err), RDA_OK);
  for (int i = 0; i < 4; ++i) assert_non_null(ev[i]);
  assert_ptr_not_equal(ev[0], ev[1]);
  float ms = -1.0f;
  /* Sequential records with random gaps: every difference is >= 0, they add up, and a gap of
   * g microseconds measures at least g. */
  const long gap[3] = {rt_rng_range(rt_global_rng(), 200, 2000),
                       rt_rng_range(rt_global_rng(), 0, 300),
                       rt_rng_range(rt_global_rng(), 200, 2000)};
  assert_int_equal(b->event_record(b, ev[0], &err), RDA_OK);
  for (int i = 1; i < 4; ++i) {
    spin_us(gap[i - 1]);
    assert_int_equal(b->event_record(b, ev[i], &err), RDA_OK);
  }
  float d[3], total = 0;
  for (int i = 0; i < 3; ++i) {
    assert_int_equal(b->event_elapsed_ms(b, ev[i], ev[i + 1], &d[i], &err), RDA_OK);
    assert_true(d[i] >= 0.0f);
    assert_true(d[i] >= (float)gap[i] * 1e-3f * 0.999f);
    total += d[i];
  }
  assert_int_equal(b->event_elapsed_ms(b, ev[0], ev[3], &ms, &err), RDA_OK);
  assert_float_equal(ms, total, 1e-3);
  /* Backwards is negative; an event against itself is 0. */
  assert_int_equal(b->event_elapsed_ms(b, ev[3], ev[0], &ms, &err), RDA_OK);
  assert_true(ms <= -total * 0.999f);
  assert_int_equal(b->event_elapsed_ms(b, ev[2], ev[2], &ms, &err), RDA_OK);
  assert_float_equal(ms, 0.0f, 0.0);
  /* A record moves its time on. */
  spin_us(100);
  assert_int_equal(b->event_record(b, ev[0], &err), RDA_OK);
  assert_int_equal(b->event_elapsed_ms(b, ev[3], ev[0], &ms, &err), RDA_OK);
  assert_true(ms >= 0.1f * 0.999f);
  /* Still events: waits and queries take them. */
  int done = 0;
  assert_int_equal(b->stream_wait_event(b, ev[1], &err), RDA_OK);
  assert_int_equal(b->event_query(b, ev[1], &done, &err), RDA_OK);
  assert_int_equal(done, 1);
  for (int i = 0; i < 4; ++i) b->event_destroy(b, ev[i]);
  b->destroy(b);
}

static void test_emu_elapsed_rejects_bad_events(void **state) {
  (void)state;
  rda_backend *b = emu_open();
  rda_err err = {0};
  void *t0 = NULL, *t1 = NULL, *plain = NULL;
  assert_int_equal(b->event_create_timed(b, &t0, &err), RDA_OK);
  assert_int_equal(b->event_create_timed(b, &t1, &err), RDA_OK);
  assert_int_equal(b->event_create(b, &plain, &err), RDA_OK);
  float ms = 7.0f;
  /* Never recorded. */
  assert_int_equal(b->event_elapsed_ms(b, t0, t1, &ms, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "never recorded"));
  assert_int_equal(b->event_record(b, t0, &err), RDA_OK);
  assert_int_equal(b->event_record(b, plain, &err), RDA_OK);
  assert_int_equal(b->event_elapsed_ms(b, t0, t1, &ms, &err), RDA_ERR_INVALID_ARGUMENT);
  /* NULL events or result. */
  rda_err_clear(&err);
  assert_int_equal(b->event_elapsed_ms(b, NULL, t0, &ms, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "NULL"));
  assert_int_equal(b->event_elapsed_ms(b, t0, NULL, &ms, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(b->event_elapsed_ms(b, t0, t0, NULL, &err), RDA_ERR_INVALID_ARGUMENT);
  /* An event made without timing. */
  rda_err_clear(&err);
  assert_int_equal(b->event_elapsed_ms(b, t0, plain, &ms, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "without timing"));
  b->event_destroy(b, t0);
  b->event_destroy(b, t1);
  b->event_destroy(b, plain);
  b->destroy(b);
}

/* The marks of a trace with a device part of cap 2 over a pass of 4 steps: all counted, the
 * first 2 timed, every time after the reference and in mark order. */
static void test_trace_marks_record_device_events(void **state) {
  (void)state;
  rda_backend *b = emu_open();
  rda_err err = {0};
  rda_ring_trace_dev dev;
  assert_int_equal(rda_ring_trace_dev_create(b, 2, &dev, &err), RDA_OK);
  void *ref = NULL;
  assert_int_equal(b->event_create_timed(b, &ref, &err), RDA_OK);
  rda_ring_timeline_step steps[3];
  rda_ring_timeline tl = {.cap = 3, .steps = steps};
  /* Nothing marked yet: no times. */
  assert_int_equal(rda_ring_trace_dev_times(&dev, ref, &tl, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "did not record"));
  for (int i = 0; i < 3; ++i) steps[i].arrived = steps[i].posted = steps[i].computed = NAN;
  rda_ring_trace t;
  memset(&t, 0, sizeof t);
  t.dev = &dev;
  assert_int_equal(b->event_record(b, ref, &err), RDA_OK);
  rda_ring_trace_thread(&t);
  ring_trace_mark(b, RING_MARK_BEGIN, 0);
  spin_us(50);
  ring_trace_mark(b, RING_MARK_OWN, 0);
  for (int i = 0; i < 4; ++i) {
    ring_trace_mark(b, RING_MARK_WAIT0, i);
    ring_trace_mark(b, RING_MARK_WAIT1, i);
    spin_us(20);
    ring_trace_mark(b, RING_MARK_POSTED, i);
    spin_us(20);
    ring_trace_mark(b, RING_MARK_COMPUTED, i);
  }
  ring_trace_mark(b, RING_MARK_END, 0);
  rda_ring_trace_thread(NULL);
  ring_trace_mark(b, RING_MARK_BEGIN, 0); /* detached: changes nothing */
  assert_int_equal(t.count, 4);
  assert_int_equal(dev.count, 4);
  assert_int_equal(dev.status, RDA_OK);
  assert_int_equal(rda_ring_trace_dev_times(&dev, ref, &tl, &err), RDA_OK);
  assert_int_equal(tl.count, 4);
  double prev = 0.0;
  const double seq[] = {
      tl.begin,         tl.own,          steps[0].arrived,  steps[0].posted, steps[0].computed,
      steps[1].arrived, steps[1].posted, steps[1].computed, tl.end};
  for (size_t k = 0; k < sizeof seq / sizeof seq[0]; ++k) {
    assert_true(seq[k] >= prev);
    prev = seq[k];
  }
  assert_true(tl.own - tl.begin >= 0.05 * 0.999);
  assert_true(steps[0].computed - steps[0].arrived >= 0.04 * 0.999);
  assert_true(isnan(steps[2].arrived)); /* past the events' cap: untouched */
  /* A mark on another backend than the events' is an error of the times, not a crash. */
  rda_backend *other = emu_open();
  rda_ring_trace_thread(&t);
  ring_trace_mark(b, RING_MARK_BEGIN, 0);
  ring_trace_mark(other, RING_MARK_OWN, 0);
  ring_trace_mark(b, RING_MARK_END, 0);
  rda_ring_trace_thread(NULL);
  assert_int_not_equal(dev.status, RDA_OK);
  rda_err_clear(&err);
  assert_int_equal(rda_ring_trace_dev_times(&dev, ref, &tl, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err.msg, "another backend"));
  other->destroy(other);
  b->event_destroy(b, ref);
  rda_ring_trace_dev_destroy(&dev);
  rda_ring_trace_dev_destroy(&dev); /* destroyed: a no-op */
  b->destroy(b);
}

/* A backend without timed events: a clear error, nothing to destroy. */
static void test_trace_dev_needs_timed_events(void **state) {
  (void)state;
  rda_backend *b = emu_open();
  rda_backend copy = *b;
  copy.event_create_timed = NULL;
  rda_err err = {0};
  rda_ring_trace_dev dev;
  assert_int_equal(rda_ring_trace_dev_create(&copy, 4, &dev, &err), RDA_ERR_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "no timed events"));
  rda_err_clear(&err);
  assert_int_equal(rda_ring_trace_dev_create(b, -1, &dev, &err), RDA_ERR_INVALID_ARGUMENT);
  assert_int_equal(rda_ring_trace_dev_create(b, 0, &dev, &err), RDA_OK); /* no steps: valid */
  rda_ring_trace_dev_destroy(&dev);
  b->destroy(b);
}

/* The number of virtual steps the driver walks for a rank (ring.c's schedule): per bundle, the
 * distinct shifts s of its rounds (forward) or the union of {s, s + 1, s + 2} (backward). */
static int model_vsteps(const rda_ring_plan *rp, int rank, int backward) {
  rda_ring_step *st = NULL;
  int64_t n = 0;
  rda_err err = {0};
  if (rda_ring_plan_steps(rp, rank, &st, &n, &err) != RDA_OK) fail_msg("steps: %s", err.msg);
  int count = 0;
  for (int64_t g0 = 0; g0 < n;) {
    int64_t g1 = g0 + 1;
    while (g1 < n && st[g1].bundle == st[g0].bundle) ++g1;
    int last = -1;
    for (int64_t i = g0; i < g1; ++i)
      for (int s = st[i].shift; s <= st[i].shift + (backward ? 2 : 0); ++s)
        if (s > last) last = s, ++count;
    g0 = g1;
  }
  free(st);
  return count;
}

/* One pass's timelines: the schedule's step count, every time after the reference (>= 0) and
 * non-decreasing in stream order, end at the last compute. */
static void check_timelines(const char *what, const rda_ring_timeline *tl, const rda_ring_plan *rp,
                            int P, int backward) {
  int total = 0;
  for (int p = 0; p < P; ++p) {
    const rda_ring_timeline *t = &tl[p];
    const int want = model_vsteps(rp, p, backward);
    if (t->count != want)
      fail_msg("%s rank %d: %d steps, the schedule has %d", what, p, t->count, want);
    total += t->count;
    /* Stream order: begin, own, then arrived, posted, computed per step, then end. */
    const size_t nseq = 3 + 3 * (size_t)t->count;
    double *seq = malloc(nseq * sizeof *seq);
    assert_non_null(seq);
    seq[0] = t->begin, seq[1] = t->own, seq[nseq - 1] = t->end;
    for (int i = 0; i < t->count; ++i) {
      seq[2 + 3 * i] = t->steps[i].arrived;
      seq[3 + 3 * i] = t->steps[i].posted;
      seq[4 + 3 * i] = t->steps[i].computed;
    }
    double prev = 0.0; /* the reference */
    for (size_t x = 0; x < nseq; ++x) {
      if (!(isfinite(seq[x]) && seq[x] >= prev))
        fail_msg("%s rank %d: mark %zu of %zu at %.4f ms, before the previous one (%.4f ms)", what,
                 p, x, nseq, seq[x], prev);
      prev = seq[x];
    }
    free(seq);
    if (t->count > 0 && t->end - t->steps[t->count - 1].computed > 50.0)
      fail_msg("%s rank %d: end %.3f ms long after the last compute %.3f ms", what, p, t->end,
               t->steps[t->count - 1].computed);
  }
  assert_true(total > 0);
}

static rda_ring_timeline *timelines(int P, int cap) {
  rda_ring_timeline *t = calloc((size_t)P, sizeof *t);
  assert_non_null(t);
  for (int p = 0; p < P; ++p) {
    t[p].cap = cap;
    t[p].steps = malloc((size_t)cap * sizeof *t[p].steps);
    assert_non_null(t[p].steps);
    for (int i = 0; i < cap; ++i) t[p].steps[i].arrived = t[p].steps[i].posted = NAN;
    t[p].begin = t[p].own = t[p].end = NAN;
  }
  return t;
}

static void free_timelines(rda_ring_timeline *t, int P) {
  for (int p = 0; p < P; ++p) free(t[p].steps);
  free(t);
}

/* P virtual ranks on the emulator with both timelines; the forward results still match the
 * reference after the extra passes. */
static void run_virtual(int P, int layout, long long n, int backward) {
  rda_config cfg;
  const long long w[3] = {16, 64, 1 << 20}, r[3] = {1, 2, 4};
  rt_config_make(&cfg, 2, 2, 32, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, 3, w, r);
  const long long B = 1, H = cfg.heads, Hkv = cfg.kv_heads, D = cfg.head_dim;
  const size_t nq = (size_t)(B * n * H * D), nk = (size_t)(B * n * Hkv * D);
  double *q = rt_normal(nq, RDA_DTYPE_BF16), *k = rt_normal(nk, RDA_DTYPE_BF16);
  double *v = rt_normal(nk, RDA_DTYPE_BF16);
  double *dout = rt_normal(nq, RDA_DTYPE_BF16);
  long long sq[3], sk[3];
  rt_strides_contig(n, H, D, sq);
  rt_strides_contig(n, Hkv, D, sk);
  uint16_t *qb = rt_make_bits(q, B, n, H, D, sq, RDA_DTYPE_BF16, NULL);
  uint16_t *kb = rt_make_bits(k, B, n, Hkv, D, sk, RDA_DTYPE_BF16, NULL);
  uint16_t *vb = rt_make_bits(v, B, n, Hkv, D, sk, RDA_DTYPE_BF16, NULL);
  uint16_t *db = rt_make_bits(dout, B, n, H, D, sq, RDA_DTYPE_BF16, NULL);
  float *o = malloc(nq * sizeof *o), *lse = malloc((size_t)(B * H * n) * sizeof *lse);
  float *dq = malloc(nq * sizeof *dq), *dk = malloc(nk * sizeof *dk), *dv = malloc(nk * sizeof *dv);
  assert_true(o && lse && dq && dk && dv);
  rt_poison_f32(o, nq);
  rt_poison_f32(lse, (size_t)(B * H * n));
  rda_ring_timeline *tf = timelines(P, 4096), *tb = timelines(P, 4096);
  rda_ring_virtual job = {.backend = "emu",
                          .ranks = P,
                          .layout = layout,
                          .cfg = &cfg,
                          .g = g_gen,
                          .batch = B,
                          .n = n,
                          .q = qb,
                          .k = kb,
                          .v = vb,
                          .dout = backward ? db : NULL,
                          .o = o,
                          .lse = lse,
                          .dq = dq,
                          .dk = dk,
                          .dv = dv,
                          .iters = 0,
                          .timeline_fwd = tf,
                          .timeline_bwd = backward ? tb : NULL};
  rda_err err = {0};
  if (rda_ring_virtual_run(&job, &err) != RDA_OK) fail_msg("ring: %s", err.msg);
  rda_ring_plan *rp = NULL;
  assert_int_equal(rda_ring_plan_create(&cfg, n, P, layout, &rp, &err), RDA_OK);
  char what[64];
  snprintf(what, sizeof what, "P=%d %s fwd", P, rda_ring_layout_name(layout));
  check_timelines(what, tf, rp, P, 0);
  if (backward) {
    snprintf(what, sizeof what, "P=%d %s bwd", P, rda_ring_layout_name(layout));
    check_timelines(what, tb, rp, P, 1);
  } else {
    for (int p = 0; p < P; ++p) assert_true(isnan(tb[p].begin)); /* not asked for */
  }
  double *o_ref = NULL, *lse_ref = NULL;
  rt_reference(&cfg, B, n, q, k, v, &o_ref, &lse_ref);
  const long long ls[2] = {H * n, n};
  assert_true(rt_check_fwd(what, &cfg, B, n, o, sq, lse, ls, o_ref, lse_ref, NULL));
  free(o_ref);
  free(lse_ref);
  rda_ring_plan_destroy(rp);
  free_timelines(tf, P);
  free_timelines(tb, P);
  free(q), free(k), free(v), free(dout), free(qb), free(kb), free(vb), free(db);
  free(o), free(lse), free(dq), free(dk), free(dv);
}

static void test_ring_timeline_every_rank_fwd_bwd_contiguous(void **state) {
  (void)state;
  run_virtual(3, RDA_RING_CONTIGUOUS, 96, 1);
}

static void test_ring_timeline_fwd_only_zigzag(void **state) {
  (void)state;
  run_virtual(3, RDA_RING_ZIGZAG, 96, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_emu_timed_events_measure_host_time),
      cmocka_unit_test(test_emu_elapsed_rejects_bad_events),
      cmocka_unit_test(test_trace_marks_record_device_events),
      cmocka_unit_test(test_trace_dev_needs_timed_events),
      cmocka_unit_test(test_ring_timeline_every_rank_fwd_bwd_contiguous),
      cmocka_unit_test(test_ring_timeline_fwd_only_zigzag),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
