/* ring.c — the ring passes of one rank (see ring.h): the workspace blocks and the loop that
 * overlaps each transfer with the previous block's compute. The order of the work and of the
 * messages (rounds, virtual steps, each one's sends and receives) is ring_schedule.c's; what is
 * computed on a block is ring_compute.c's.
 *
 * Loop. Virtual step i: wait for its transfers; add the gradients it returned; post step i+1
 * (pack, then sends and receives); compute on step i's received blocks. Receive blocks and
 * gradient blocks alternate between two buffers by the parity of i, so step i+1 lands while
 * step i is computed. Nothing waits for the device: ordering is the stream's and the
 * transport's (transport.h). */
#include "ring.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"
#include "ring_compute.h"
#include "ring_rows.h"
#include "ring_schedule.h"
#include "ring_trace.h"

/* The ring's workspace blocks (backend memory) and their sizes for the batch. */
typedef struct ring_blocks {
  size_t send, recv; /* largest packed send block / sum of one round's receives (16-bit) */
  size_t send_all;   /* largest sum of one round's sends: gradients come back per send */
  unsigned char *sblk, *rblk[2];
  unsigned char *gblk[2];  /* fp32 gradients of a received block, going back */
  unsigned char *grblk[2]; /* fp32 gradients of a sent block, coming back */
} ring_blocks;

static const size_t kAlign = RDA_RING_BLOCK_ALIGN; /* the plan's peak_bytes counts it too */

/* The most batch entries of one pass: the launch limit, or less for tests. */
static _Atomic long long rda_ring_slice = RDA_MAX_BATCH_PER_LAUNCH;

void rda_ring_set_batch_slice(long long most) {
  atomic_store(&rda_ring_slice,
               most >= 1 && most <= RDA_MAX_BATCH_PER_LAUNCH ? most : RDA_MAX_BATCH_PER_LAUNCH);
}

long long rda_ring_batch_slice(void) { return atomic_load(&rda_ring_slice); }

static size_t ring_round_up(size_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

/* Gradients are fp32: twice the bytes of the 16-bit K/V they belong to. */
static size_t ring_layout_bytes(size_t send, size_t send_all, size_t recv, int backward) {
  size_t total = ring_round_up(send) + 2 * ring_round_up(recv);
  if (backward) total += 2 * ring_round_up(2 * recv) + 2 * ring_round_up(2 * send_all);
  return total;
}

static void ring_sizes(const rda_ring_step *steps, int64_t nsteps, long long batch,
                       ring_blocks *bl) {
  uint64_t send = 0, send_all = 0, recv = 0;
  rda_ring_steps_blocks(steps, nsteps, &send, &send_all, &recv);
  bl->send = (size_t)(send * (uint64_t)batch);
  bl->send_all = (size_t)(send_all * (uint64_t)batch);
  bl->recv = (size_t)(recv * (uint64_t)batch);
}

size_t rda_ring_workspace_bytes(const rda_plan_k *pk, const rda_ring_plan *rp, int rank,
                                long long batch, int backward) {
  (void)pk;
  rda_ring_step *steps = NULL;
  int64_t nsteps = 0;
  rda_err err = {0};
  if (rp == NULL || batch < 1 || rda_ring_plan_steps(rp, rank, &steps, &nsteps, &err) != RDA_OK)
    return SIZE_MAX;
  ring_blocks bl; /* one batch slice's: a larger batch reuses it slice by slice */
  const long long most = rda_ring_batch_slice();
  ring_sizes(steps, nsteps, batch < most ? batch : most, &bl);
  free(steps);
  return ring_layout_bytes(bl.send, bl.send_all, bl.recv, backward);
}

static void ring_carve(ring_blocks *bl, unsigned char *base, int backward) {
  size_t off = 0;
  bl->sblk = base;
  off += ring_round_up(bl->send);
  for (int i = 0; i < 2; ++i, off += ring_round_up(bl->recv)) bl->rblk[i] = base + off;
  if (!backward) return;
  for (int i = 0; i < 2; ++i, off += ring_round_up(2 * bl->recv)) bl->gblk[i] = base + off;
  for (int i = 0; i < 2; ++i, off += ring_round_up(2 * bl->send_all)) bl->grblk[i] = base + off;
}

typedef struct ring_run {
  ring_ctx c;
  const rda_ring_plan *rp;
  rda_transport *t;
  ring_blocks bl;
  int backward;
  long long call_batch;       /* the call's whole batch (c.batch: this pass's slice of it) */
  ring_op *ops;               /* a virtual step's operations (ring_schedule's max_ops) */
  rda_ring_rows_params *rows; /* a round's transfers to pack or add (max_ops of them) */
  const int **heads;          /* their kv heads */
  ring_round_scratch scratch; /* for the forward's rounds */
  int posted;                 /* a transport group is posted and not yet waited for */
} ring_run;

static size_t ring_bytes(const rda_ring_xfer *x, long long batch) {
  return (size_t)x->bytes * (size_t)batch;
}

/* The round's send transfers as rows in r->rows / r->heads, *n of them. Packing (blk NULL):
 * the rank's K/V, each block at its place in the send block, an all-gather's repeated block
 * once. Returned gradients: the rank's fp32 dK/dV, one block per send, one after another in blk,
 * in the order of the sends. */
static rda_status ring_round_sends(ring_run *r, const ring_round *rd, unsigned char *blk, int *n,
                                   rda_err *err) {
  const size_t B = (size_t)r->c.batch;
  size_t off = 0;
  *n = 0;
  for (int k = 0; k < rd->n; ++k) {
    const rda_ring_step *st = &rd->steps[k];
    rda_ring_class cls;
    rda_ring_plan_class(r->rp, st->cls, &cls);
    for (int q = 0; q < st->nsend; ++q) {
      if (blk == NULL && q == 1 && rd->send_at[k][1] == rd->send_at[k][0]) continue;
      rda_ring_rows_params *rows = &r->rows[*n];
      RDA_TRY(ring_rows_for(&r->c, &st->send[q], st->stride, &cls, rows, err));
      if (blk == NULL) {
        ring_rows_set_kv(&r->c, rows);
        rows->block = r->bl.sblk + rd->send_at[k][q] * B;
      } else {
        ring_rows_set_grads(&r->c, rows);
        rows->block = blk + off;
        off += 2 * ring_bytes(&st->send[q], r->c.batch);
      }
      r->heads[(*n)++] = cls.kv_heads;
    }
  }
  return RDA_OK;
}

/* Pack the K/V rows of a round's send transfers into the send block: one launch for the round
 * (ring_rows.h). */
static rda_status ring_pack_round(ring_run *r, const ring_round *rd, rda_err *err) {
  int n = 0;
  RDA_TRY(ring_round_sends(r, rd, NULL, &n, err));
  return rda_ring_rows_pack_many(r->c.b, r->c.pk, r->c.k, r->rows, r->heads, n, err);
}

/* Add the gradients returned for a round's sent rows (in blk) into the rank's dK/dV: one launch
 * for the round unless two sends share rows (an all-gather's block comes back from two peers:
 * then in send order). */
static rda_status ring_add_returned(ring_run *r, const ring_round *rd, unsigned char *blk,
                                    rda_err *err) {
  int n = 0;
  RDA_TRY(ring_round_sends(r, rd, blk, &n, err));
  return rda_ring_rows_add_many(r->c.b, r->c.pk, r->c.k, r->rows, r->heads, n, err);
}

/* Post virtual step i (ring_vstep_ops: the same order at both ends of every pair): pack its
 * K/V sends into the send block, then one transport group. */
static rda_status ring_post(ring_run *r, const ring_vstep *v, int64_t i, int nops, rda_err *err) {
  RDA_TRY(ring_pack_round(r, &v->kv, err));
  unsigned char *const blk[4] = {r->bl.sblk, r->bl.rblk[i % 2], r->bl.gblk[i % 2],
                                 r->bl.grblk[i % 2]};
  RDA_TRY(rda_transport_group_start(r->t, err));
  for (int q = 0; q < nops; ++q) {
    const ring_op *o = &r->ops[q];
    unsigned char *p = blk[o->buf] + o->at;
    if (o->send)
      RDA_TRY(rda_transport_send(r->t, o->peer, p, (size_t)o->bytes, err));
    else
      RDA_TRY(rda_transport_recv(r->t, o->peer, p, (size_t)o->bytes, err));
  }
  return rda_transport_group_end(r->t, err);
}

/* Compute on the blocks received in virtual step i (gradients into gblk[i % 2]). */
static rda_status ring_compute_step(ring_run *r, const ring_vstep *v, int64_t i, rda_err *err) {
  const ring_round *kv = &v->kv;
  uint64_t recv = 0;
  rda_ring_round_layout(kv->steps, kv->n, NULL, NULL, NULL, NULL, &recv);
  if (recv == 0) return RDA_OK;
  if (!r->backward)
    return ring_fwd_received_round(&r->c, kv->steps, kv->n, (const uint64_t(*)[2])kv->recv_at,
                                   r->bl.rblk[i % 2], &r->scratch, err);
  const uint64_t B = (uint64_t)r->c.batch;
  RDA_TRY(r->c.b->memset_async(r->c.b, r->bl.gblk[i % 2], 0, (size_t)(2 * recv * B), err));
  return ring_bwd_received_round(&r->c, kv->steps, kv->n, (const uint64_t(*)[2])kv->recv_at,
                                 r->bl.rblk[i % 2], r->bl.gblk[i % 2], &r->scratch, err);
}

static rda_status ring_loop(ring_run *r, const ring_vstep *v, int64_t nv, rda_err *err) {
  rda_backend *b = r->c.b;
  int nops = 0;
  ring_trace_mark(b, RING_MARK_BEGIN, 0);
  if (nv > 0 && (nops = ring_vstep_ops(&v[0], r->c.batch, r->ops)) > 0) {
    RDA_TRY(ring_post(r, &v[0], 0, nops, err));
    r->posted = 1;
  }
  RDA_TRY(r->backward ? ring_bwd_own(&r->c, err) : ring_fwd_own(&r->c, err));
  ring_trace_mark(b, RING_MARK_OWN, 0);
  for (int64_t i = 0; i < nv; ++i) {
    ring_trace_mark(b, RING_MARK_WAIT0, i);
    if (r->posted) {
      r->posted = 0; /* waited for, even when the wait fails */
      RDA_TRY(rda_transport_wait(r->t, err));
    }
    ring_trace_mark(b, RING_MARK_WAIT1, i);
    if (v[i].grad.n > 0) RDA_TRY(ring_add_returned(r, &v[i].grad, r->bl.grblk[i % 2], err));
    if (i + 1 < nv && (nops = ring_vstep_ops(&v[i + 1], r->c.batch, r->ops)) > 0) {
      RDA_TRY(ring_post(r, &v[i + 1], i + 1, nops, err));
      r->posted = 1;
    }
    ring_trace_mark(b, RING_MARK_POSTED, i);
    RDA_TRY(ring_compute_step(r, &v[i], i, err));
    ring_trace_mark(b, RING_MARK_COMPUTED, i);
  }
  ring_trace_mark(b, RING_MARK_END, 0);
  return RDA_OK;
}

static rda_status ring_check(const rda_backend *b, const rda_ring_plan *rp, int rank,
                             const rda_transport *t, long long n, const char *what, rda_err *err) {
  const rda_ring_rank *rk = rda_ring_plan_rank(rp, rank);
  if (rk == NULL || t->rank != rank || t->size != rda_ring_plan_ranks(rp))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "ring %s: rank %d does not match the plan (%d ranks) or the transport "
                       "(rank %d of %d)",
                       what, rank, rda_ring_plan_ranks(rp), t->rank, t->size);
  if (n != rk->rows)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "ring %s: rank %d owns %lld rows, but the tensors have n = %lld", what,
                       rank, (long long)rk->rows, n);
  if (strcmp(t->vt->name, "host") == 0 && (strcmp(b->name, "emu") != 0 || rda_backend_emu_async(b)))
    return rda_err_set(err, RDA_ERR_UNSUPPORTED,
                       "ring %s: the host transport runs only with the emulator backend, and not "
                       "with its asynchronous streams",
                       what);
  return RDA_OK;
}

/* The words of the ranks' agreements (one 8-byte gather each). A pass's: bit 63 the pass
 * (backward), bits 0..61 the whole call's batch. A call's end: 0. Either, from a rank that
 * failed before it: kFailedWord with the status in the low byte, so that the other ranks fail
 * at once with the cause. Over NCCL an abort stays on its own rank, and the others would learn
 * of the failure only by their timeout. */
static const uint64_t kFailedWord = 1ull << 62;
static const uint64_t kBatchMask = (1ull << 62) - 1;

static uint64_t ring_word_failed(rda_status s) {
  return kFailedWord | ((uint64_t)(unsigned)s & 0xff);
}

/* The first rank whose word says it failed, its status in *why; -1 when none did. */
static int ring_first_failed(const uint64_t *all, int n, rda_status *why) {
  for (int q = 0; q < n; q++)
    if (all[q] & kFailedWord) {
      *why = (rda_status)(all[q] & 0xff);
      return q;
    }
  return -1;
}

/* where: "before the ring forward pass", "in rda_ring_forward", ... */
static rda_status ring_peer_failed(int rank, int q, rda_status why, const char *where,
                                   rda_err *err) {
  return rda_err_set(err, RDA_ERR_NCCL,
                     "rank %d: the ring was aborted: rank %d failed %s (%s; its own error says "
                     "why)",
                     rank, q, where, rda_status_string(why));
}

/* Gather mine, or give a failure word when this rank failed (local, its error kept in err):
 * that error is its result whatever the others say, so it reads nothing. A rank without room
 * for the words fails too, and still says so. */
static rda_status ring_gather_word(rda_transport *t, uint64_t mine, rda_status local,
                                   uint64_t **all, rda_err *err) {
  *all = NULL;
  if (local == RDA_OK && (*all = calloc((size_t)t->size, sizeof **all)) == NULL)
    local = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "rank %d: out of memory for %d ranks' words",
                        t->rank, t->size);
  if (local != RDA_OK) {
    rda_err ignored = {0};
    (void)rda_transport_give8(t, ring_word_failed(local), &ignored);
    return local;
  }
  return rda_transport_gather8(t, mine, *all, err);
}

rda_status rda_ring_settle(rda_transport *t, rda_status mine, const char *where, rda_err *err) {
  if (t == NULL) return mine;
  uint64_t *all = NULL;
  rda_status s = ring_gather_word(t, 0, mine, &all, err);
  rda_status why = RDA_OK;
  const int q = s == RDA_OK ? ring_first_failed(all, t->size, &why) : -1;
  if (q >= 0) s = ring_peer_failed(t->rank, q, why, where, err);
  free(all);
  return s;
}

/* Every rank must run the same pass with the same batch: each transfer is the plan's bytes
 * times the caller's batch, and NCCL gives no rule for a send matched with a receive of another
 * size (the virtual ranks catch that, NCCL may hang or misplace data). One 8-byte gather per
 * pass settles it before the first transfer, and every rank reports the same difference; a
 * rank that failed to prepare its pass (local) says so in it. */
static rda_status ring_agree(const ring_run *r, int rank, rda_status local, rda_err *err) {
  const char *what = r->backward ? "backward" : "forward";
  const int P = r->t->size;
  /* The whole batch, not the slice: calls that differ fail before the first slice moves. */
  if (local == RDA_OK && (uint64_t)r->call_batch > kBatchMask)
    local = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "ring %s: rank %d: batch %lld is too large",
                        what, rank, r->call_batch);
  const uint64_t mine = (uint64_t)r->backward << 63 | (uint64_t)r->call_batch;
  uint64_t *all = NULL;
  rda_status s = ring_gather_word(r->t, mine, local, &all, err);
  rda_status why = RDA_OK;
  const int failed = s == RDA_OK ? ring_first_failed(all, P, &why) : -1;
  const int q = s == RDA_OK && failed < 0 ? rda_transport_first_differing(all, P) : 0;
  if (failed >= 0) {
    char where[40];
    snprintf(where, sizeof where, "before the ring %s pass", what);
    s = ring_peer_failed(rank, failed, why, where, err);
  } else if (q > 0) {
    s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                    "ring %s: rank %d: the ranks' calls differ: rank 0 runs the %s pass with "
                    "batch %llu, rank %d the %s pass with batch %llu (every rank must make the "
                    "same ring calls with the same batch)",
                    what, rank, all[0] >> 63 ? "backward" : "forward",
                    (unsigned long long)(all[0] & kBatchMask), q,
                    all[q] >> 63 ? "backward" : "forward",
                    (unsigned long long)(all[q] & kBatchMask));
  }
  free(all);
  return s;
}

/* Everything both passes share: checks, the rank's pieces, the schedule, the workspace, the
 * agreement of the ranks, the loop, the counters. On any failure the transport is aborted
 * first, so that no posted transfer lands in memory the caller reuses and no other rank waits
 * for this one. */
static rda_status ring_pass(ring_run *r, int rank, long long n, void *workspace,
                            size_t workspace_bytes, rda_ring_run_stats *stats, rda_err *err) {
  const char *what = r->backward ? "backward" : "forward";
  rda_ring_step *steps = NULL;
  ring_schedule sc = {0};
  int64_t nsteps = 0;
  uint64_t sent0 = 0, recv0 = 0;
  rda_transport_bytes(r->t, &sent0, &recv0);
  rda_status s = ring_check(r->c.b, r->rp, rank, r->t, n, what, err);
  if (s == RDA_OK) s = rda_ring_plan_steps(r->rp, rank, &steps, &nsteps, err);
  if (s == RDA_OK) s = ring_schedule_build(steps, nsteps, r->backward, &sc, err);
  size_t need = 0;
  if (s == RDA_OK) {
    ring_sizes(steps, nsteps, r->c.batch, &r->bl);
    need = ring_layout_bytes(r->bl.send, r->bl.send_all, r->bl.recv, r->backward);
    if (workspace_bytes < need || (need > 0 && workspace == NULL))
      s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                      "ring %s: rank %d needs %zu bytes of ring workspace, got %zu", what, rank,
                      need, workspace == NULL ? (size_t)0 : workspace_bytes);
    else if (((uintptr_t)workspace % 16) != 0)
      s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                      "ring %s: the ring workspace must be 16-byte aligned", what);
  }
  /* A rank without rows (P > N) has no steps and nothing to compute, but still agrees. */
  const int idle = n == 0;
  if (s == RDA_OK && !idle) {
    ring_carve(&r->bl, workspace, r->backward);
    s = ring_ctx_init(&r->c, r->rp, rank, err);
  }
  /* Host scratch for the loop, so that nothing is allocated inside it. */
  if (s == RDA_OK && sc.max_ops > 0) {
    r->ops = calloc((size_t)sc.max_ops, sizeof *r->ops);
    r->rows = calloc((size_t)sc.max_ops, sizeof *r->rows);
    r->heads = calloc((size_t)sc.max_ops, sizeof *r->heads);
    if (r->ops == NULL || r->rows == NULL || r->heads == NULL)
      s = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring: out of memory for the schedule");
  }
  if (s == RDA_OK) s = ring_round_scratch_init(&r->scratch, sc.max_recvs, err);
  s = ring_agree(r, rank, s, err); /* also when this rank failed: the others learn it now */
  if (s == RDA_OK && !idle)
    s = r->backward ? rda_bwd_prep(r->c.b, r->c.pk, r->c.k, r->c.ba, err)
                    : rda_fwd_init(r->c.b, r->c.pk, r->c.k, r->c.fa, err);
  if (s == RDA_OK && !idle) s = ring_loop(r, sc.v, sc.nv, err);
  if (s == RDA_OK && idle) { /* an empty timeline, so that a trace of every rank has one */
    ring_trace_mark(r->c.b, RING_MARK_BEGIN, 0);
    ring_trace_mark(r->c.b, RING_MARK_OWN, 0);
    ring_trace_mark(r->c.b, RING_MARK_END, 0);
  }
  ring_schedule_free(&sc);
  free(steps);
  free(r->ops);
  free(r->rows);
  free(r->heads);
  r->ops = NULL, r->rows = NULL, r->heads = NULL;
  ring_round_scratch_free(&r->scratch);
  if (s != RDA_OK) {
    rda_transport_abort(r->t, err != NULL && err->msg[0] != '\0' ? err->msg : "a rank failed");
    /* A group posted and not waited for (a launch failed meanwhile): its wait, failing now,
     * orders the caller's stream after the copies it had started (transport.h). */
    if (r->posted) {
      rda_err ignored = {0};
      rda_transport_wait(r->t, &ignored);
      r->posted = 0;
    }
    return s;
  }
  if (stats != NULL) {
    uint64_t sent1 = 0, recv1 = 0;
    rda_transport_bytes(r->t, &sent1, &recv1);
    stats->rows = rda_ring_plan_rank(r->rp, rank)->rows;
    stats->bytes_sent = sent1 - sent0;
    stats->bytes_received = recv1 - recv0;
    stats->peak_bytes = need;
  }
  return RDA_OK;
}

/* Both entry points: check the handles (on failure, telling the other ranks and aborting the
 * transport, so that none waits for this one), then one pass per batch slice. The pass's
 * arguments are fa (forward) or ba (backward), the other NULL. */
static rda_status ring_enter(rda_backend *b, const rda_plan_k *pk, const rda_fwd_kernels *k,
                             const rda_ring_plan *rp, int rank, rda_transport *t, int backward,
                             const rda_fwd_args *fa, const rda_bwd_args *ba, void *workspace,
                             size_t workspace_bytes, rda_ring_run_stats *stats, rda_err *err) {
  const char *what = backward ? "ring backward" : "ring forward";
  rda_status s = RDA_OK;
  if (b == NULL || pk == NULL || k == NULL || rp == NULL || t == NULL ||
      (backward ? ba == NULL : fa == NULL))
    s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: a NULL argument", what);
  else if (ba != NULL && !pk->has_bwd)
    s = rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                    "%s: the plan has no backward kernels (plan it with RDA_PLAN_BACKWARD)", what);
  /* Segments span ranks: their grid rows count over the whole sequence. */
  rda_err rows = {0};
  if (s == RDA_OK && rda_fwd_check_grid_rows(rda_ring_plan_config(rp),
                                             (long long)rda_ring_plan_n(rp), &rows) != RDA_OK)
    s = rda_err_set(err, rows.status, "%s: %s", what, rows.msg);
  if (s != RDA_OK) {
    (void)rda_ring_settle(t, s, NULL, err); /* in place of the pass's agreement */
    if (t != NULL) rda_transport_abort(t, err != NULL ? err->msg : what);
    return s;
  }
  /* A launch per received block holds a whole batch slice (the grid's z dimension): a batch
   * past RDA_MAX_BATCH_PER_LAUNCH runs as one pass per slice, reusing the ring's workspace
   * (sized for one slice); the counters add up, the peak is a slice's. */
  const long long batch = ba != NULL ? ba->batch : fa->batch, most = rda_ring_batch_slice();
  rda_ring_run_stats total;
  memset(&total, 0, sizeof total);
  for (long long b0 = 0; s == RDA_OK && b0 < batch; b0 += most) {
    rda_fwd_args fs;
    rda_bwd_args bs;
    if (fa != NULL) rda_fwd_args_slice(fa, b0, most, &fs);
    if (ba != NULL) rda_bwd_args_slice(pk, ba, b0, most, &bs);
    ring_run r;
    memset(&r, 0, sizeof r);
    r.c.b = b;
    r.c.pk = pk;
    r.c.k = k;
    r.c.fa = fa != NULL ? &fs : NULL;
    r.c.ba = ba != NULL ? &bs : NULL;
    r.c.batch = ba != NULL ? bs.batch : fs.batch;
    r.call_batch = batch;
    r.rp = rp;
    r.t = t;
    r.backward = ba != NULL;
    rda_ring_run_stats one;
    memset(&one, 0, sizeof one);
    s = ring_pass(&r, rank, ba != NULL ? ba->n : fa->n, workspace, workspace_bytes, &one, err);
    total.rows = one.rows;
    total.bytes_sent += one.bytes_sent;
    total.bytes_received += one.bytes_received;
    if (one.peak_bytes > total.peak_bytes) total.peak_bytes = one.peak_bytes;
  }
  if (s == RDA_OK && stats != NULL) *stats = total;
  return s;
}

rda_status rda_ring_fwd_run(rda_backend *b, const rda_plan_k *pk, const rda_fwd_kernels *k,
                            const rda_ring_plan *rp, int rank, rda_transport *t,
                            const rda_fwd_args *a, void *workspace, size_t workspace_bytes,
                            rda_ring_run_stats *stats, rda_err *err) {
  return ring_enter(b, pk, k, rp, rank, t, 0, a, NULL, workspace, workspace_bytes, stats, err);
}

rda_status rda_ring_bwd_run(rda_backend *b, const rda_plan_k *pk, const rda_fwd_kernels *k,
                            const rda_ring_plan *rp, int rank, rda_transport *t,
                            const rda_bwd_args *a, void *workspace, size_t workspace_bytes,
                            rda_ring_run_stats *stats, rda_err *err) {
  return ring_enter(b, pk, k, rp, rank, t, 1, NULL, a, workspace, workspace_bytes, stats, err);
}
