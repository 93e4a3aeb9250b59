/* ring_plan.h — the ring's communication plan: which dilated K/V rows each rank of P needs for
 * each branch (SPEC §1 "Distributed", grids on global positions), from whom, in which step, and
 * what that costs in bytes, memory and work. Also the cost model behind `rdagen ring-sim`. */
#ifndef RDA_RING_PLAN_H
#define RDA_RING_PLAN_H

#include <stdint.h>

#include "config.h"
#include "err.h"

/* How the N rows are split over the P ranks. */
enum {
  RDA_RING_CONTIGUOUS = 0, /* rank ρ: one contiguous slice; the first N mod P ranks one row more */
  RDA_RING_ZIGZAG = 1      /* 2P equal chunks; rank ρ holds chunks ρ and 2P-1-ρ (N % 2P == 0) */
};

/* How a segment group moves its blocks. */
enum {
  RDA_RING_KIND_RING = 0,     /* step s = 1..k-1: member x sends its own block to member x+s and
                                 receives member x-s's block (mod k); no forwarding */
  RDA_RING_KIND_ALLGATHER = 1 /* one step: every member sends its block to every other member */
};

#define RDA_RING_MAX_RANKS 4096
/* The most rows a ring plans, 2^40 (~1.1e12; the config's own cap on segments and dilations):
 * every row index, segment bound and grid product of the plan then stays below 2^42, far
 * inside int64, whatever the config. */
#define RDA_RING_MAX_N (1LL << 40)
/* The most bytes any count of the plan may reach (one transfer, a rank's or a branch's total, a
 * round's block, a rank's peak): 2^63 - 1, so that each also fits a signed 64-bit integer (JSON,
 * rda_ring_stats). Larger plans are refused at creation, never wrapped. */
#define RDA_RING_MAX_BYTES ((uint64_t)INT64_MAX)
/* Each block of the ring's workspace (the send block, each receive buffer) starts at a
 * multiple of this many bytes (runtime/ring.c lays it out so): a block takes its bytes rounded
 * up to it, which the plan's peak_bytes counts too. */
#define RDA_RING_BLOCK_ALIGN 256u
/* K and V, 2 bytes per element (bf16 and fp16 alike). */
#define RDA_RING_KV_ELEM_BYTES 4
/* The classes of one segment move in bundles of at most this many bytes per member and step
 * (per batch element; a single class may exceed it): the larger a bundle, the fewer and larger
 * the launches on received blocks, and the more ring memory. */
#define RDA_RING_BUNDLE_BYTES (16ull << 20)
/* The version of the ring's message order (steps, rounds, virtual steps), in the fingerprint;
 * bump it with any change to that order. 2: rounds of bundles. */
#define RDA_RING_PROTOCOL 2

typedef struct rda_ring_plan rda_ring_plan;

/* One direction of a block transfer: global rows first[i] + t * stride, t < count[i], i < nranges,
 * of the kv heads of the step's class (rda_ring_class), K then V. */
typedef struct rda_ring_xfer {
  int peer;         /* the other rank */
  int nranges;      /* 1 or 2 (a zigzag rank may hold two pieces of one segment) */
  int64_t first[2]; /* first global row of each range; first[i] - offset - segment start is a
                       multiple of stride */
  int64_t count[2]; /* rows in each range */
  int64_t rows;     /* count[0] + count[1] when nranges is 2 */
  uint64_t bytes;   /* rows * nkv * head_dim * RDA_RING_KV_ELEM_BYTES */
} rda_ring_xfer;

/* One step of one rank: the transfers of one segment group at one shift. Steps of a rank are
 * ordered by (branch, segment, bundle, shift, class); the steps of one (bundle, shift) are a
 * ROUND: posted as one group (like ncclGroupStart/End) and then waited for, their blocks
 * computed together. Two ranks that exchange blocks do so in steps with the same key, and
 * every rank walks the keys in the same order, which is why the ring cannot deadlock. */
typedef struct rda_ring_step {
  int branch;       /* branch i */
  int cls;          /* (branch, offset) class: which kv heads travel (rda_ring_plan_class) */
  int group;        /* segment group (rda_ring_plan_group) */
  int64_t bundle;   /* consecutive groups of one segment (class order) that move together;
                       numbered over the plan, ascending along a rank's steps */
  int64_t segment;  /* segment index m */
  int64_t stride;   /* r_i: grid rows are stride apart */
  int kind;         /* RDA_RING_KIND_* of the group */
  int shift;        /* ring: 1..k-1; all-gather: 0 */
  int nsend, nrecv; /* 0..2 each (two only in an all-gather of 3 members) */
  rda_ring_xfer send[2], recv[2];
  double recv_pairs; /* (query, key) pairs, all query heads, that the received rows add */
} rda_ring_step;

/* A (branch, offset) class: the query heads of a branch that share grid offset j, and the kv
 * heads they read. Grids of different offsets are disjoint (0 <= j < r_i). */
typedef struct rda_ring_class {
  int branch;
  int64_t offset;      /* j */
  int nq;              /* query heads of the branch with this offset */
  int nkv;             /* distinct kv heads they read */
  const int *kv_heads; /* nkv kv head indices, ascending; owned by the plan */
} rda_ring_class;

/* A segment group: the ranks holding rows of one class's grid in one segment (2 or more). */
typedef struct rda_ring_group {
  int branch, cls;
  int64_t segment;
  int64_t seg_start, seg_end; /* [a, b) */
  int64_t bundle;             /* rda_ring_step.bundle */
  int64_t grid_rows;          /* rows of the grid in the segment */
  int nmembers;
  int kind;        /* RDA_RING_KIND_* */
  const char *why; /* why that kind; owned by the plan */
} rda_ring_group;

/* Per-rank totals. */
typedef struct rda_ring_rank {
  int rank;
  int npieces;          /* 1 (contiguous) or 2 (zigzag) */
  int64_t lo[2], hi[2]; /* owned global rows [lo, hi) of each piece */
  int64_t rows;         /* rows owned */
  uint64_t bytes_sent, bytes_received;
  uint64_t send_block; /* the largest packed send block of a round (rda_ring_steps_blocks) */
  uint64_t recv_block; /* the largest sum of one round's receives */
  uint64_t peak_bytes; /* most the forward ring holds at once for batch 1, as the driver lays
                          it out: the send block plus two receive blocks (double-buffered),
                          each rounded up to RDA_RING_BLOCK_ALIGN */
  int64_t steps;
  double pairs;      /* (query, key) pairs of this rank's queries, all heads, branches */
  double recv_pairs; /* of those, pairs whose key arrives from another rank */
  double flops;      /* 4 * head_dim * pairs */
} rda_ring_rank;

/* Per-branch summary. */
typedef struct rda_ring_branch {
  int64_t w; /* min(w_i, N) */
  int64_t r;
  int nclasses;
  int64_t ngroups, nallgather;
  uint64_t bytes; /* sent over all ranks */
} rda_ring_branch;

/* "contiguous" / "zigzag" -> RDA_RING_*; -1 for anything else. */
int rda_ring_layout_parse(const char *name);
const char *rda_ring_layout_name(int layout);

/* Plan the ring for a validated config, N rows, P ranks and a layout. Errors
 * (RDA_ERR_INVALID_ARGUMENT, one line): n < 1 or > RDA_RING_MAX_N, P < 1 or > RDA_RING_MAX_RANKS,
 * zigzag with N % 2P != 0 (P > N is fine contiguous: ranks N .. P-1 get no rows, no piece
 * and no steps), an unknown layout, a segment or dilation above RDA_RING_MAX_N,
 * and a plan whose byte counts would exceed RDA_RING_MAX_BYTES ("too large for the ring": every
 * byte product and sum is overflow-checked here, so the bytes of rda_ring_plan_steps,
 * rda_ring_plan_own_block, rda_ring_round_layout and rda_ring_steps_blocks on a created plan
 * never wrap either: each is at most a checked total). Cost: O(P + sum over segment groups of
 * members^2); never a loop over rows. *out is NULL on failure. */
rda_status rda_ring_plan_create(const rda_config *cfg, int64_t n, int ranks, int layout,
                                rda_ring_plan **out, rda_err *err);
/* The same with bundles of at most bundle_bytes (RDA_RING_BUNDLE_BYTES; 0: one group per
 * bundle), for tests of the round machinery on small problems. */
rda_status rda_ring_plan_create_bundled(const rda_config *cfg, int64_t n, int ranks, int layout,
                                        uint64_t bundle_bytes, rda_ring_plan **out, rda_err *err);
void rda_ring_plan_destroy(rda_ring_plan *p); /* accepts NULL */

int rda_ring_plan_ranks(const rda_ring_plan *p);
int64_t rda_ring_plan_n(const rda_ring_plan *p);
int rda_ring_plan_layout(const rda_ring_plan *p);
const rda_config *rda_ring_plan_config(const rda_ring_plan *p);

const rda_ring_rank *rda_ring_plan_rank(const rda_ring_plan *p,
                                        int rank); /* NULL if out of range */
const rda_ring_branch *rda_ring_plan_branch(const rda_ring_plan *p, int branch);
int rda_ring_plan_nclasses(const rda_ring_plan *p);
void rda_ring_plan_class(const rda_ring_plan *p, int cls, rda_ring_class *out);
int64_t rda_ring_plan_ngroups(const rda_ring_plan *p);
void rda_ring_plan_group(const rda_ring_plan *p, int64_t group, rda_ring_group *out);

/* The rows of a group's grid that `rank` owns (its whole block, which every send of that group
 * is a prefix of): fills *out (peer = rank) and returns 1, or returns 0 when the rank is not a
 * member. The ring driver packs this block once per group. */
int rda_ring_plan_own_block(const rda_ring_plan *p, int64_t group, int rank, rda_ring_xfer *out);

/* The rank owning global row `row` (0 <= row < N). */
int rda_ring_plan_owner(const rda_ring_plan *p, int64_t row);

/* Every step of one rank, in execution order: *steps is malloc'd (free() it; NULL when there are
 * none), *count its length. */
rda_status rda_ring_plan_steps(const rda_ring_plan *p, int rank, rda_ring_step **steps,
                               int64_t *count, rda_err *err);

/* The end of the round that begins at steps[i]: the first index after i with another (bundle,
 * shift), or n. */
int64_t rda_ring_round_end(const rda_ring_step *steps, int64_t n, int64_t i);

/* Where the transfers of one round sit in the ring's blocks, per batch element (the driver
 * multiplies by the batch): send_at[k][q] is the offset of steps[k].send[q] in the packed send
 * block (a transfer of the same rows as an earlier one of its step, as an all-gather sends one
 * block to two peers, shares its bytes), *send its size; recv_at[k][q] the offset of
 * steps[k].recv[q] in the receive block, *recv its size; *send_all the sum of all sends (the
 * fp32 gradients of every send come back separately). Arrays hold n entries or are NULL. */
void rda_ring_round_layout(const rda_ring_step *steps, int64_t n, uint64_t (*send_at)[2],
                           uint64_t (*recv_at)[2], uint64_t *send, uint64_t *send_all,
                           uint64_t *recv);

/* The largest *send, *send_all and *recv of rda_ring_round_layout over the rounds of a rank's
 * steps (per batch element): what the ring's workspace holds at once. */
void rda_ring_steps_blocks(const rda_ring_step *steps, int64_t n, uint64_t *send,
                           uint64_t *send_all, uint64_t *recv);

/* The ranks a rank's steps exchange blocks with (sends to or receives from; the backward
 * returns gradients along the same pairs), ascending and each once, into peers (room for the
 * plan's ranks - 1 entries); *npeers their count. Symmetric over the plan: q lists p when p
 * lists q. What rda_transport_connect sets up at ring creation. */
void rda_ring_steps_peers(const rda_ring_step *steps, int64_t n, int self, int *peers,
                          int *npeers);

/* The cost model of `rdagen ring-sim` for one rank. */
typedef struct rda_ring_sim {
  double compute_s; /* flops / flops_per_s */
  double comm_s;    /* sum over rounds of max(bytes sent, bytes received) / link bytes per s */
  double total_s;   /* pipelined: the local block's compute overlaps round 1's transfer, the
                       blocks of round s's compute overlaps round s+1's; each stage costs
                       max(compute, comm). Peers are assumed ready (no waiting modelled). */
  double exposed_s; /* of comm_s, the time no compute hides: the sum over stages of
                       max(compute, comm) - compute, so total_s = compute_s + exposed_s
                       (up to rounding) */
  double overlap;   /* (comm_s - exposed_s) / comm_s in [0, 1]: the share of communication
                       hidden behind compute; 1 when the rank moves nothing */
} rda_ring_sim;

/* Fill out[0..P) with the model for link_bytes_per_s (per direction, full duplex) and
 * flops_per_s (effective). RDA_ERR_INVALID_ARGUMENT unless both rates are finite, normal and
 * positive. */
rda_status rda_ring_plan_simulate(const rda_ring_plan *p, double link_bytes_per_s,
                                  double flops_per_s, rda_ring_sim *out, rda_err *err);

/* A 63-bit FNV-1a hash (bit 63 clear) of everything the ranks of one ring must agree on: the config
 * (every field), N, P, the layout, the dtype, the rda version, RDA_RING_PROTOCOL and the bundle cap
 * (rda_ring_plan_create's; rda_ring_plan_create_bundled is for tests whose ranks share one
 * plan). */
uint64_t rda_ring_fingerprint(const rda_config *cfg, int64_t n, int ranks, int layout);

#endif
