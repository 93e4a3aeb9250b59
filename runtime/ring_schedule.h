/* ring_schedule.h — the order of one ring rank's work and messages: the rounds of its plan
 * steps (ring_plan.h), the virtual steps that carry K/V out and, in the backward pass,
 * gradients back, and the exact sequence of sends and receives each virtual step posts. The
 * driver (runtime/ring.c) posts exactly these; tests replay every rank's sequence to show that
 * pairs always match and nothing can wait forever.
 *
 * Virtual steps. The transports match sends and receives FIFO per pair, so both ends of every
 * pair must post matching operations in the same order. Rounds are ordered by (bundle, shift)
 * on every rank. The backward pass returns the fp32 gradients of the round of shift s in the
 * same bundle at "virtual" shift s + 2, after the K/V of that shift: both ends of a transfer
 * have a round of shift s, so both add the virtual shifts s + 1 and s + 2 (s + 1 keeps the
 * compute of s before the post of s + 2). A rank's virtual steps are, bundle by bundle, the
 * union of {s, s + 1, s + 2} (forward: {s}) over its rounds' shifts, ascending. */
#ifndef RDA_RING_SCHEDULE_H
#define RDA_RING_SCHEDULE_H

#include <stdint.h>

#include "err.h"
#include "ring_plan.h"

/* A round: steps[0..n), their transfers' offsets per batch element (rda_ring_round_layout). */
typedef struct ring_round {
  const rda_ring_step *steps;
  int n;
  uint64_t (*send_at)[2], (*recv_at)[2];
} ring_round;

/* One virtual step: the round whose K/V moves, the round whose gradients return (n = 0: none). */
typedef struct ring_vstep {
  ring_round kv, grad;
} ring_vstep;

typedef struct ring_schedule {
  ring_vstep *v;
  int64_t nv;
  uint64_t (*send_at)[2], (*recv_at)[2]; /* one entry per step */
  int max_ops;   /* the most operations one virtual step posts */
  int max_recvs; /* the most K/V receives of one round */
} ring_schedule;

/* The schedule of a rank's steps (rda_ring_plan_steps order); backward: with gradient returns.
 * The rounds point into steps, which must outlive the schedule. */
rda_status ring_schedule_build(const rda_ring_step *steps, int64_t nsteps, int backward,
                               ring_schedule *sc, rda_err *err);
void ring_schedule_free(ring_schedule *sc); /* accepts a zeroed schedule */

/* Where an operation's bytes are: the send block, the receive block of the step's parity
 * (rblk[i % 2]), the outgoing fp32 gradients of the blocks received two virtual steps earlier
 * (gblk[i % 2]), or the returning fp32 gradients of this rank's sent blocks (grblk[i % 2]). */
typedef enum { RING_BUF_SEND, RING_BUF_RECV, RING_BUF_GRAD_OUT, RING_BUF_GRAD_IN } ring_buf;

typedef struct ring_op {
  int send; /* 1: send to peer; 0: receive from peer */
  int peer;
  ring_buf buf;
  uint64_t at, bytes; /* within buf, for the batch */
} ring_op;

/* The operations of virtual step v in posting order, for `batch`: K/V sends, gradient sends,
 * K/V receives, gradient receives, each in the rounds' step order. ops must hold max_ops
 * entries; returns how many were written (0: nothing to post). */
int ring_vstep_ops(const ring_vstep *v, long long batch, ring_op *ops);

#endif
