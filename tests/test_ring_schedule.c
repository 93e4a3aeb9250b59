/* test_ring_schedule.c — every rank's message sequence, exactly as the ring driver posts it
 * (ring_schedule.h), replayed against the transports' rules for many plans: the k-th send from
 * a to b meets the k-th receive at b from a with the same size, a rank posts its next group only
 * after its current one completed, and every rank finishes (no deadlock) with every message
 * matched. Offsets stay inside the workspace blocks the driver carves. No kernels run, so the
 * sweep covers far more plans than the end-to-end ring tests can. */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rda_test.h"
#include "ring_plan.h"
#include "ring_schedule.h"

#define MAXP 9

static long long g_messages; /* messages replayed (sends), to show the sweep moves data */

/* One rank's groups: the operations of each of its virtual steps that post anything. */
typedef struct rank_seq {
  int ngroups;
  int *start; /* group g is ops[start[g] .. start[g + 1]) */
  ring_op *ops;
} rank_seq;

/* Sizes posted so far per directed pair (a -> b), in posting order, sends and receives apart. */
typedef struct pair_log {
  int nsend, nrecv, cap;
  uint64_t *send, *recv;
} pair_log;

static void log_push(pair_log *l, int send, uint64_t bytes) {
  if (l->nsend == l->cap || l->nrecv == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 16;
    l->send = realloc(l->send, (size_t)l->cap * sizeof *l->send);
    l->recv = realloc(l->recv, (size_t)l->cap * sizeof *l->recv);
    assert_true(l->send != NULL && l->recv != NULL);
  }
  if (send)
    l->send[l->nsend++] = bytes;
  else
    l->recv[l->nrecv++] = bytes;
}

/* Build rank x's sequence; checks every op stays inside its block. */
static void build_seq(const char *what, const rda_ring_plan *p, int x, int backward, long long B,
                      rank_seq *seq) {
  rda_err err = {0};
  rda_ring_step *steps = NULL;
  int64_t n = 0;
  if (rda_ring_plan_steps(p, x, &steps, &n, &err) != RDA_OK) fail_msg("%s: %s", what, err.msg);
  ring_schedule sc;
  if (ring_schedule_build(steps, n, backward, &sc, &err) != RDA_OK)
    fail_msg("%s: %s", what, err.msg);
  uint64_t send = 0, send_all = 0, recv = 0;
  rda_ring_steps_blocks(steps, n, &send, &send_all, &recv);
  const uint64_t cap[4] = {send * (uint64_t)B, recv * (uint64_t)B, 2 * recv * (uint64_t)B,
                           2 * send_all * (uint64_t)B};
  memset(seq, 0, sizeof *seq);
  seq->start = calloc((size_t)sc.nv + 1, sizeof *seq->start);
  seq->ops = calloc((size_t)(sc.nv * (sc.max_ops > 0 ? sc.max_ops : 1)) + 1, sizeof *seq->ops);
  ring_op *tmp = calloc((size_t)sc.max_ops + 1, sizeof *tmp);
  assert_true(seq->start != NULL && seq->ops != NULL && tmp != NULL);
  int total = 0;
  for (int64_t i = 0; i < sc.nv; i++) {
    const int k = ring_vstep_ops(&sc.v[i], B, tmp);
    if (k > sc.max_ops) fail_msg("%s: rank %d step %lld posts %d > max_ops %d", what, x,
                                 (long long)i, k, sc.max_ops);
    if (k == 0) continue; /* the driver posts nothing and waits for nothing */
    for (int q = 0; q < k; q++) {
      const ring_op *o = &tmp[q];
      if (o->peer < 0 || o->peer == x || o->bytes == 0 || o->at + o->bytes > cap[o->buf])
        fail_msg("%s: rank %d step %lld op %d: peer %d, %llu bytes at %llu of block %d (%llu)",
                 what, x, (long long)i, q, o->peer, (unsigned long long)o->bytes,
                 (unsigned long long)o->at, (int)o->buf, (unsigned long long)cap[o->buf]);
      /* Receives land in disjoint bytes (sends may share theirs: an all-gather's one block). */
      for (int e = 0; e < q && !o->send; e++) {
        const ring_op *f = &tmp[e];
        if (!f->send && f->buf == o->buf && o->at < f->at + f->bytes && f->at < o->at + o->bytes)
          fail_msg("%s: rank %d step %lld: receives %d and %d overlap", what, x, (long long)i, e,
                   q);
      }
      seq->ops[total + q] = *o;
    }
    seq->start[seq->ngroups++] = total;
    total += k;
  }
  seq->start[seq->ngroups] = total;
  free(tmp);
  ring_schedule_free(&sc);
  free(steps);
}

/* Replay: each rank posts its current group (its ops join the pairs' logs) and moves on once
 * every op of it has its counterpart posted. Returns 0 when every rank finishes with every
 * message matched in size; else 1 and why. */
static int replay_seqs(int P, const rank_seq *seq, char *why, size_t len) {
  pair_log logs[MAXP][MAXP]; /* [from][to] */
  memset(logs, 0, sizeof logs);
  int at[MAXP] = {0}, posted[MAXP] = {0}, bad = 0;
  int maxops = 1;
  for (int x = 0; x < P; x++)
    for (int g = 0; g < seq[x].ngroups; g++)
      if (seq[x].start[g + 1] - seq[x].start[g] > maxops)
        maxops = seq[x].start[g + 1] - seq[x].start[g];
  int(*slot)[MAXP] = calloc((size_t)maxops, sizeof *slot); /* slot[q][x]: op q's place in its log */
  assert_non_null(slot);
  while (!bad) {
    int progress = 0, done = 1;
    for (int x = 0; x < P && !bad; x++) {
      if (at[x] == seq[x].ngroups) continue;
      done = 0;
      const ring_op *ops = seq[x].ops + seq[x].start[at[x]];
      const int k = seq[x].start[at[x] + 1] - seq[x].start[at[x]];
      if (!posted[x]) {
        for (int q = 0; q < k; q++) {
          g_messages += ops[q].send;
          pair_log *l = ops[q].send ? &logs[x][ops[q].peer] : &logs[ops[q].peer][x];
          slot[q][x] = ops[q].send ? l->nsend : l->nrecv;
          log_push(l, ops[q].send, ops[q].bytes);
        }
        posted[x] = 1;
        progress = 1;
      }
      int complete = 1;
      for (int q = 0; q < k && complete; q++) {
        const pair_log *l = ops[q].send ? &logs[x][ops[q].peer] : &logs[ops[q].peer][x];
        const int s = slot[q][x];
        if ((ops[q].send ? l->nrecv : l->nsend) <= s) {
          complete = 0;
        } else if (l->send[s] != l->recv[s]) {
          snprintf(why, len, "message %d from %d to %d: %llu bytes sent, %llu expected", s,
                   ops[q].send ? x : ops[q].peer, ops[q].send ? ops[q].peer : x,
                   (unsigned long long)l->send[s], (unsigned long long)l->recv[s]);
          bad = 1;
        }
      }
      if (complete && !bad) {
        at[x]++;
        posted[x] = 0;
        progress = 1;
      }
    }
    if (done || bad) break;
    if (!progress) {
      int n = snprintf(why, len, "deadlock:");
      for (int x = 0; x < P && n > 0 && (size_t)n < len; x++)
        if (at[x] < seq[x].ngroups)
          n += snprintf(why + n, len - (size_t)n, " rank %d in group %d of %d;", x, at[x],
                        seq[x].ngroups);
      bad = 1;
    }
  }
  for (int a = 0; a < P; a++)
    for (int b = 0; b < P; b++) {
      if (!bad && logs[a][b].nsend != logs[a][b].nrecv) {
        snprintf(why, len, "%d messages from %d to %d, %d receives", logs[a][b].nsend, a, b,
                 logs[a][b].nrecv);
        bad = 1;
      }
      free(logs[a][b].send);
      free(logs[a][b].recv);
    }
  free(slot);
  return bad;
}

static void seqs_free(int P, rank_seq *seq) {
  for (int x = 0; x < P; x++) {
    free(seq[x].start);
    free(seq[x].ops);
  }
}

static void replay(const char *what, const rda_ring_plan *p, int backward, long long B) {
  const int P = rda_ring_plan_ranks(p);
  rank_seq seq[MAXP];
  for (int x = 0; x < P; x++) build_seq(what, p, x, backward, B, &seq[x]);
  char why[512] = "";
  const int bad = replay_seqs(P, seq, why, sizeof why);
  seqs_free(P, seq);
  if (bad) fail_msg("%s (%s, batch %lld): %s", what, backward ? "backward" : "forward", B, why);
}

static void replay_config(const char *what, const rda_config *c, long long n, int P, int layout,
                          uint64_t bundle) {
  rda_err err = {0};
  rda_ring_plan *p = NULL;
  if (rda_ring_plan_create_bundled(c, n, P, layout, bundle, &p, &err) != RDA_OK)
    fail_msg("%s: %s", what, err.msg);
  for (int backward = 0; backward < 2; backward++)
    for (long long B = 1; B <= 2; B++) replay(what, p, backward, B);
  rda_ring_plan_destroy(p);
}

/* Random configs: branches inside one rank, spanning some, spanning all; every offset rule,
 * GQA, causal or not, both layouts, bundles of every class, of a few and of one. */
static void test_ring_schedule_pairs_match_and_finish(void **state) {
  (void)state;
  rt_rng *g = rt_global_rng();
  const uint64_t caps[3] = {RDA_RING_BUNDLE_BYTES, 1, 3000};
  int runs = 0;
  for (int it = 0; it < 1500; it++) {
    const int P = (int)rt_rng_range(g, 2, 8);
    const int layout = rt_rng_range(g, 0, 2) == 0 ? RDA_RING_ZIGZAG : RDA_RING_CONTIGUOUS;
    long long n = rt_rng_range(g, P, 64 * P);
    if (layout == RDA_RING_ZIGZAG) n = (n / (2 * P) + 1) * 2 * P;
    const int kvh = (int)rt_rng_range(g, 1, 4), group = (int)rt_rng_range(g, 1, 3);
    const int offsets = (int)rt_rng_range(g, 0, 2), nb = (int)rt_rng_range(g, 1, 3);
    long long w[4], r[4];
    for (int i = 0; i < nb; i++) {
      w[i] = rt_rng_range(g, 2, n + 8);
      r[i] = rt_rng_range(g, 1, 5);
    }
    if (offsets == RDA_OFFSETS_GROUP && kvh * group < nb) continue;
    rda_config c;
    rt_config_make(&c, kvh * group, kvh, 32, RDA_DTYPE_BF16, (int)rt_rng_range(g, 0, 1),
                   offsets, nb, w, r);
    char what[160];
    snprintf(what, sizeof what, "H %d Hkv %d offsets %d causal %d N %lld P %d %s", c.heads,
             c.kv_heads, offsets, c.causal, n, P, layout == RDA_RING_ZIGZAG ? "zigzag" : "contig");
    for (int k = 0; k < 3; k++) replay_config(what, &c, n, P, layout, caps[k]);
    runs++;
  }
  print_message("%d configs, %lld messages replayed\n", runs, g_messages);
  assert_true(runs > 1000 && g_messages > 100000);
}

/* The issue-5 target's shape, smaller: 16 heads, three branches, the long ones spanning ranks;
 * several classes per bundle, and bundles split by the cap. */
static void test_ring_schedule_target_shape(void **state) {
  (void)state;
  const long long w[3] = {64, 512, 2048}, r[3] = {1, 8, 32};
  rda_config c;
  rt_config_make(&c, 16, 16, 32, RDA_DTYPE_BF16, 1, RDA_OFFSETS_MOD, 3, w, r);
  const uint64_t caps[3] = {RDA_RING_BUNDLE_BYTES, 1, 4096};
  for (int P = 2; P <= 8; P++)
    for (int k = 0; k < 3; k++) {
      replay_config("target shape contiguous", &c, 2048, P, RDA_RING_CONTIGUOUS, caps[k]);
      replay_config("target shape zigzag", &c, 256 * P, P, RDA_RING_ZIGZAG, caps[k]);
    }
}

/* The replay itself can fail: a wrong size, a send to the wrong peer and a group never posted
 * are each caught. */
static void test_ring_schedule_replay_catches_broken_sequences(void **state) {
  (void)state;
  const long long w[1] = {1 << 20}, r[1] = {2};
  rda_config c;
  rt_config_make(&c, 2, 2, 32, RDA_DTYPE_BF16, 0, RDA_OFFSETS_MOD, 1, w, r);
  rda_err err = {0};
  rda_ring_plan *p = NULL;
  assert_int_equal(rda_ring_plan_create(&c, 64, 4, RDA_RING_CONTIGUOUS, &p, &err), RDA_OK);
  char why[512];
  for (int broken = 0; broken < 4; broken++) {
    rank_seq seq[4];
    for (int x = 0; x < 4; x++) build_seq("broken", p, x, 1, 1, &seq[x]);
    rank_seq *s = &seq[1];
    assert_true(s->ngroups >= 2);
    int first_send = -1;
    for (int q = 0; q < s->start[s->ngroups] && first_send < 0; q++)
      if (s->ops[q].send) first_send = q;
    assert_true(first_send >= 0);
    if (broken == 1) s->ops[first_send].bytes += 2;
    if (broken == 2) s->ops[first_send].peer = (s->ops[first_send].peer + 1) % 4 == 1
                                                   ? (s->ops[first_send].peer + 2) % 4
                                                   : (s->ops[first_send].peer + 1) % 4;
    if (broken == 3) s->ngroups--; /* rank 1 never posts its last group */
    why[0] = '\0';
    const int bad = replay_seqs(4, seq, why, sizeof why);
    seqs_free(4, seq);
    if (broken == 0 && bad) fail_msg("the intact sequences fail: %s", why);
    if (broken > 0 && !bad) fail_msg("broken sequence %d passes the replay", broken);
    if (broken > 0) print_message("broken %d: %s\n", broken, why);
  }
  rda_ring_plan_destroy(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_schedule_pairs_match_and_finish),
      cmocka_unit_test(test_ring_schedule_target_shape),
      cmocka_unit_test(test_ring_schedule_replay_catches_broken_sequences),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
