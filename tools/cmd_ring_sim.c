/* cmd_ring_sim.c — `rdagen ring-sim`: plan the ring for a config, N and P (runtime/ring_plan.c)
 * and print what each rank moves, holds and computes, with a pipelined time model; no kernel
 * runs. Rows and pairs come in closed form (never a loop over rows or over classes per rank);
 * its time grows with the ring steps it walks, rank by rank: well under a second for
 * bench/target_ring.lua at N = 1e9 over P = 4096, some 15 s where 128 heads each run a ring
 * of a global dilated branch over P = 1024 ranks (130 million steps in all). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "gen.h"
#include "json.h"
#include "ring_plan.h"

/* Default link: NVLink 4 (H100 SXM), 450 GB/s per direction = 3600 Gb/s. */
#define SIM_DEFAULT_LINK_GBPS 3600.0
/* What every output says it is. */
#define SIM_SOURCE                                                                             \
  "by rdagen ring-sim: the ring's communication plan under a cost model (link rate, compute "  \
  "rate); nothing was run or measured"
#define SIM_DEFAULT_TFLOPS 400.0
/* Accepted rates: wide, and narrow enough that every modelled time (bytes < 2^63, flops < 2^111)
 * is a finite, normal double. */
#define SIM_MIN_LINK_GBPS 1e-3
#define SIM_MAX_LINK_GBPS 1e9
#define SIM_MIN_TFLOPS 1e-6
#define SIM_MAX_TFLOPS 1e9

static const char sim_usage_text[] =
    "usage: rdagen ring-sim CONFIG --n N --ranks P [--layout contiguous|zigzag]\n"
    "                       [--link-gbps B] [--tflops F] [--json]\n"
    "\n"
    "Predict the forward pass of the ring for one batch entry of N rows over P ranks\n"
    "(N <= 2^40 = 1099511627776, P <= 4096; with P > N the last P - N ranks own no rows; N may\n"
    "be written 1e9). Every further batch entry moves, holds and computes as much again; a\n"
    "backward sends the K/V rows once more and returns fp32 dK/dV for every row received\n"
    "(`rdagen run --ranks P --stats` counts both):\n"
    "  per rank: rows, bytes sent and received, peak bytes the ring holds (packed send block +\n"
    "  receive buffers), steps, compute time (4*D*pairs / F), communication time (per round of\n"
    "  steps max(sent, received) / B), the total with each round's transfer overlapping the\n"
    "  previous round's compute (per stage max(compute, comm)) and the overlap: the share of the\n"
    "  communication time hidden behind compute (a rank that only sends has just its local\n"
    "  block to hide its sends behind); per branch: segment groups and bytes. A plan whose byte\n"
    "  counts would exceed 2^63 - 1 is refused.\n"
    "  --layout     contiguous (default) or zigzag (2P chunks; N must be a multiple of 2P)\n"
    "  --link-gbps  link rate per direction in gigabits per second, 0.001 to 1e9 (default\n"
    "               3600 = 450 GB/s, one NVLink 4 GPU; 400 is one NDR InfiniBand port)\n"
    "  --tflops     effective compute rate in TFLOP/s, 1e-6 to 1e9 (default 400)\n"
    "  --json       print one JSON document with every rank instead of the table\n";

typedef struct sim_opts {
  const char *config;
  long long n;
  int ranks;
  int layout;
  double link_gbps, tflops;
  int json;
} sim_opts;

/* A rate in [lo, hi] whose value in base units (times unit) is finite, normal and positive. */
static int sim_parse_rate(const char *s, double lo, double hi, double unit, double *out) {
  double d;
  if (!rdagen_parse_decimal(s, &d) || !(d >= lo && d <= hi)) return 0;
  const double base = d * unit;
  if (!isnormal(base) || !(base > 0.0)) return 0;
  *out = d;
  return 1;
}

/* Returns -1 to go on, else the exit status. */
static int sim_parse(int argc, char **argv, sim_opts *o) {
  memset(o, 0, sizeof *o);
  o->layout = RDA_RING_CONTIGUOUS;
  o->link_gbps = SIM_DEFAULT_LINK_GBPS;
  o->tflops = SIM_DEFAULT_TFLOPS;
  enum { SIM_N, SIM_RANKS, SIM_LAYOUT, SIM_LINK, SIM_TFLOPS, SIM_NVALUED };
  static const char *const valued[SIM_NVALUED] = {"n", "ranks", "layout", "link-gbps", "tflops"};
  int seen[SIM_NVALUED] = {0};
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(sim_usage_text, stdout);
      return 0;
    }
    if (strcmp(a, "--json") == 0) {
      if (o->json) return rdagen_usage("ring-sim: --json given twice");
      o->json = 1;
      continue;
    }
    if (strncmp(a, "--", 2) != 0) {
      if (a[0] == '-' && a[1] != '\0') return rdagen_usage("ring-sim: unknown option '%s'", a);
      if (o->config != NULL)
        return rdagen_usage("ring-sim: more than one config given ('%s' and '%s')", o->config, a);
      o->config = a;
      continue;
    }
    const char *eq;
    const int f = rdagen_option_index(a, valued, SIM_NVALUED, &eq);
    if (f < 0) return rdagen_usage("ring-sim: unknown option '%s'", a);
    const char *val = rdagen_option_value(argc, argv, &i, eq);
    if (val == NULL) return rdagen_usage("ring-sim: --%s needs a value", valued[f]);
    if (seen[f]++) return rdagen_usage("ring-sim: --%s given twice", valued[f]);
    long long x;
    if (f == SIM_N) {
      if (!rdagen_parse_count_sci(val, 1, RDA_RING_MAX_N, &x))
        return rdagen_usage("ring-sim: --n '%s': expected an integer 1..2^40 (1e9 is fine)", val);
      o->n = x;
    } else if (f == SIM_RANKS) {
      if (!rdagen_parse_count(val, 1, RDA_RING_MAX_RANKS, &x))
        return rdagen_usage("ring-sim: --ranks '%s': expected an integer 1..%d", val,
                            RDA_RING_MAX_RANKS);
      o->ranks = (int)x;
    } else if (f == SIM_LAYOUT) {
      o->layout = rda_ring_layout_parse(val);
      if (o->layout < 0)
        return rdagen_usage("ring-sim: --layout '%s': expected contiguous or zigzag", val);
    } else if (f == SIM_LINK) {
      if (!sim_parse_rate(val, SIM_MIN_LINK_GBPS, SIM_MAX_LINK_GBPS, 1e9 / 8.0, &o->link_gbps))
        return rdagen_usage("ring-sim: --link-gbps '%s': expected a number from %g to %g (Gbit/s)",
                            val, SIM_MIN_LINK_GBPS, SIM_MAX_LINK_GBPS);
    } else {
      if (!sim_parse_rate(val, SIM_MIN_TFLOPS, SIM_MAX_TFLOPS, 1e12, &o->tflops))
        return rdagen_usage("ring-sim: --tflops '%s': expected a number from %g to %g (TFLOP/s)",
                            val, SIM_MIN_TFLOPS, SIM_MAX_TFLOPS);
    }
  }
  if (o->config == NULL) return rdagen_usage("ring-sim: no config given");
  if (!seen[SIM_N]) return rdagen_usage("ring-sim: --n N is required");
  if (!seen[SIM_RANKS]) return rdagen_usage("ring-sim: --ranks P is required");
  return -1;
}

static const char *sim_bytes(double b, char *buf, size_t n) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024.0 && u < 5) b /= 1024.0, u++;
  if (u == 0)
    snprintf(buf, n, "%.0f B", b);
  else
    snprintf(buf, n, "%.2f %s", b, unit[u]);
  return buf;
}

static void sim_rank_line(const rda_ring_rank *rk, const rda_ring_sim *s) {
  char a[32], b[32], c[32];
  printf("%5d %12lld %11s %11s %11s %7lld %11.4g %11.4g %11.4g %7.1f%%\n", rk->rank,
         (long long)rk->rows, sim_bytes((double)rk->bytes_sent, a, sizeof a),
         sim_bytes((double)rk->bytes_received, b, sizeof b),
         sim_bytes((double)rk->peak_bytes, c, sizeof c), (long long)rk->steps, s->compute_s,
         s->comm_s, s->total_s, 100.0 * s->overlap);
}

/* The distinct reasons each branch's groups give for their kind (the plan's own words), with
 * how many groups give each: one pass over the groups. */
#define SIM_MAX_REASONS 8
typedef struct sim_reasons {
  int n;
  const char *why[SIM_MAX_REASONS];
  long long count[SIM_MAX_REASONS];
} sim_reasons;

static void sim_tally_reasons(const rda_ring_plan *p, sim_reasons out[RDA_MAX_BRANCHES]) {
  memset(out, 0, RDA_MAX_BRANCHES * sizeof *out);
  for (int64_t gi = 0; gi < rda_ring_plan_ngroups(p); gi++) {
    rda_ring_group g;
    rda_ring_plan_group(p, gi, &g);
    sim_reasons *r = &out[g.branch];
    int k = 0;
    while (k < r->n && strcmp(r->why[k], g.why) != 0) k++;
    if (k == r->n) {
      if (r->n == SIM_MAX_REASONS) continue; /* the plan has fewer */
      r->why[r->n] = g.why, r->count[r->n++] = 0;
    }
    r->count[k]++;
  }
}

static int sim_print_json(const sim_opts *o, const rda_ring_plan *p, const rda_ring_sim *sim) {
  const rda_config *c = rda_ring_plan_config(p);
  rda_json j;
  rda_err err = {0};
  rda_json_init(&j);
  rda_json_object_begin(&j);
  /* Times here come from the cost model, never from a run: say so in the document itself, so
   * no copy of it (results files, reports) can pass for a measurement. */
  rda_json_key(&j, "predicted"), rda_json_bool(&j, 1);
  rda_json_key(&j, "source"), rda_json_string(&j, SIM_SOURCE);
  rda_json_key(&j, "config"), rda_json_string(&j, o->config);
  rda_json_key(&j, "n"), rda_json_int(&j, o->n);
  rda_json_key(&j, "world_size"), rda_json_int(&j, o->ranks);
  rda_json_key(&j, "layout"), rda_json_string(&j, rda_ring_layout_name(o->layout));
  /* What the numbers cover: `rdagen run --stats` also counts the backward and every entry. */
  rda_json_key(&j, "pass"), rda_json_string(&j, "forward");
  rda_json_key(&j, "batch"), rda_json_int(&j, 1);
  rda_json_key(&j, "link_gbps"), rda_json_double(&j, o->link_gbps);
  rda_json_key(&j, "tflops"), rda_json_double(&j, o->tflops);
  double worst = 0.0;
  for (int q = 0; q < o->ranks; q++) worst = sim[q].total_s > worst ? sim[q].total_s : worst;
  rda_json_key(&j, "total_s"), rda_json_double(&j, worst);
  sim_reasons reasons[RDA_MAX_BRANCHES];
  sim_tally_reasons(p, reasons);
  rda_json_key(&j, "branches");
  rda_json_array_begin(&j);
  for (int i = 0; i < c->nbranch; i++) {
    const rda_ring_branch *b = rda_ring_plan_branch(p, i);
    rda_json_object_begin(&j);
    rda_json_key(&j, "branch"), rda_json_int(&j, i);
    rda_json_key(&j, "w"), rda_json_int(&j, (long long)b->w);
    rda_json_key(&j, "r"), rda_json_int(&j, (long long)b->r);
    rda_json_key(&j, "groups"), rda_json_int(&j, (long long)b->ngroups);
    rda_json_key(&j, "allgather_groups"), rda_json_int(&j, (long long)b->nallgather);
    rda_json_key(&j, "reasons");
    rda_json_array_begin(&j);
    for (int k = 0; k < reasons[i].n; k++) {
      rda_json_object_begin(&j);
      rda_json_key(&j, "groups"), rda_json_int(&j, reasons[i].count[k]);
      rda_json_key(&j, "why"), rda_json_string(&j, reasons[i].why[k]);
      rda_json_object_end(&j);
    }
    rda_json_array_end(&j);
    /* Every byte count of a plan is at most RDA_RING_MAX_BYTES = INT64_MAX: the casts are exact. */
    rda_json_key(&j, "bytes"), rda_json_int(&j, (long long)b->bytes);
    rda_json_object_end(&j);
  }
  rda_json_array_end(&j);
  rda_json_key(&j, "ranks");
  rda_json_array_begin(&j);
  for (int q = 0; q < o->ranks; q++) {
    const rda_ring_rank *rk = rda_ring_plan_rank(p, q);
    rda_json_object_begin(&j);
    rda_json_key(&j, "rank"), rda_json_int(&j, q);
    rda_json_key(&j, "rows"), rda_json_int(&j, (long long)rk->rows);
    rda_json_key(&j, "bytes_sent"), rda_json_int(&j, (long long)rk->bytes_sent);
    rda_json_key(&j, "bytes_received"), rda_json_int(&j, (long long)rk->bytes_received);
    rda_json_key(&j, "peak_bytes"), rda_json_int(&j, (long long)rk->peak_bytes);
    rda_json_key(&j, "steps"), rda_json_int(&j, (long long)rk->steps);
    rda_json_key(&j, "flops"), rda_json_double(&j, rk->flops);
    rda_json_key(&j, "compute_s"), rda_json_double(&j, sim[q].compute_s);
    rda_json_key(&j, "comm_s"), rda_json_double(&j, sim[q].comm_s);
    rda_json_key(&j, "total_s"), rda_json_double(&j, sim[q].total_s);
    rda_json_key(&j, "exposed_comm_s"), rda_json_double(&j, sim[q].exposed_s);
    rda_json_key(&j, "overlap"), rda_json_double(&j, sim[q].overlap);
    rda_json_object_end(&j);
  }
  rda_json_array_end(&j);
  rda_json_object_end(&j);
  if (rda_json_finish(&j, &err) != RDA_OK) {
    rda_json_free(&j);
    return rdagen_fail("%s", err.msg);
  }
  fputs(j.buf, stdout);
  rda_json_free(&j);
  return 0;
}

static void sim_print_table(const sim_opts *o, const rda_ring_plan *p, const rda_ring_sim *sim) {
  const rda_config *c = rda_ring_plan_config(p);
  char a[32], b[32];
  printf("PREDICTED %s\n", SIM_SOURCE);
  printf("config   %s: heads %d (kv %d), head_dim %d, %s, %s, offsets %s\n", o->config, c->heads,
         c->kv_heads, c->head_dim, rda_dtype_name(c->dtype), c->causal ? "causal" : "non-causal",
         rda_offsets_name(c->offsets));
  printf("ring     N %lld over P %d ranks, layout %s; forward pass, one batch entry\n", o->n,
         o->ranks, rda_ring_layout_name(o->layout));
  printf("model    link %g Gb/s = %g GB/s per direction%s; compute %g TFLOP/s effective\n",
         o->link_gbps, o->link_gbps / 8.0,
         o->link_gbps == SIM_DEFAULT_LINK_GBPS ? " (default: NVLink 4)" : "", o->tflops);
  printf("\n%6s %12s %4s %7s %8s %10s %14s\n", "branch", "w", "r", "classes", "groups",
         "all-gather", "bytes (all)");
  for (int i = 0; i < c->nbranch; i++) {
    const rda_ring_branch *br = rda_ring_plan_branch(p, i);
    printf("%6d %12lld %4lld %7d %8lld %10lld %14s%s\n", i, (long long)br->w, (long long)br->r,
           br->nclasses, (long long)br->ngroups, (long long)br->nallgather,
           sim_bytes((double)br->bytes, a, sizeof a),
           br->ngroups == 0 ? "  (segments fit inside ranks)" : "");
  }
  sim_reasons reasons[RDA_MAX_BRANCHES];
  sim_tally_reasons(p, reasons);
  for (int i = 0; i < c->nbranch; i++)
    for (int k = 0; k < reasons[i].n; k++)
      printf("why      branch %d, %lld group%s: %s\n", i, reasons[i].count[k],
             reasons[i].count[k] == 1 ? "" : "s", reasons[i].why[k]);
  printf("\n%5s %12s %11s %11s %11s %7s %11s %11s %11s %8s\n", "rank", "rows", "sent", "received",
         "peak", "steps", "compute_s", "comm_s", "total_s", "overlap");
  const int all = o->ranks <= 32;
  for (int q = 0; q < o->ranks; q++) {
    if (!all && q == 8) printf("%5s  ... (--json for every rank)\n", "");
    if (all || q < 8 || q >= o->ranks - 8) sim_rank_line(rda_ring_plan_rank(p, q), &sim[q]);
  }
  int slow = 0;
  double moved = 0.0;
  uint64_t peak = 0;
  for (int q = 0; q < o->ranks; q++) {
    const rda_ring_rank *rk = rda_ring_plan_rank(p, q);
    if (sim[q].total_s > sim[slow].total_s) slow = q;
    moved += (double)rk->bytes_sent;
    if (rk->peak_bytes > peak) peak = rk->peak_bytes;
  }
  printf(
      "\nworld    predicted slowest rank %d: %.4g s (compute %.4g s, comm %.4g s, %.1f%% of it "
      "hidden); moved %s in all; largest peak %s\n",
      slow, sim[slow].total_s, sim[slow].compute_s, sim[slow].comm_s, 100.0 * sim[slow].overlap,
      sim_bytes(moved, a, sizeof a), sim_bytes((double)peak, b, sizeof b));
}

int rdagen_cmd_ring_sim(int argc, char **argv) {
  sim_opts o;
  const int st = sim_parse(argc, argv, &o);
  if (st >= 0) return st;
  rda_err err = {0};
  rda_gen *g = NULL;
  rda_config cfg;
  if (rda_gen_open(&g, &err) != RDA_OK || rda_gen_config_file(g, o.config, &cfg, &err) != RDA_OK) {
    rda_gen_close(g);
    return rdagen_fail("%s", err.msg);
  }
  rda_gen_close(g);
  rda_ring_plan *p = NULL;
  if (rda_ring_plan_create(&cfg, o.n, o.ranks, o.layout, &p, &err) != RDA_OK)
    return rdagen_fail("%s", err.msg);
  rda_ring_sim *sim = calloc((size_t)o.ranks, sizeof *sim);
  if (sim == NULL) {
    rda_ring_plan_destroy(p);
    return rdagen_fail("ring-sim: out of memory");
  }
  int rc = 0;
  if (rda_ring_plan_simulate(p, o.link_gbps * 1e9 / 8.0, o.tflops * 1e12, sim, &err) != RDA_OK)
    rc = rdagen_fail("%s", err.msg);
  else if (o.json)
    rc = sim_print_json(&o, p, sim);
  else
    sim_print_table(&o, p, sim);
  free(sim);
  rda_ring_plan_destroy(p);
  return rc;
}
