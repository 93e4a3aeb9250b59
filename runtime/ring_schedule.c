/* ring_schedule.c — rounds, virtual steps and each virtual step's operations (ring_schedule.h). */
#include "ring_schedule.h"

#include <stdlib.h>
#include <string.h>

void ring_schedule_free(ring_schedule *sc) {
  free(sc->v);
  free(sc->send_at);
  free(sc->recv_at);
  memset(sc, 0, sizeof *sc);
}

static ring_round ring_round_at(const ring_schedule *sc, const rda_ring_step *steps, int64_t i,
                                int64_t e) {
  ring_round r = {steps + i, (int)(e - i), sc->send_at + i, sc->recv_at + i};
  return r;
}

static int ring_round_ops(const ring_round *rd, int *recvs) {
  int n = 0, r = 0;
  for (int k = 0; k < rd->n; ++k) {
    n += rd->steps[k].nsend + rd->steps[k].nrecv;
    r += rd->steps[k].nrecv;
  }
  if (recvs != NULL) *recvs = r;
  return n;
}

rda_status ring_schedule_build(const rda_ring_step *steps, int64_t nsteps, int backward,
                               ring_schedule *sc, rda_err *err) {
  memset(sc, 0, sizeof *sc);
  if (nsteps == 0) return RDA_OK;
  sc->v = calloc((size_t)nsteps * 3, sizeof *sc->v);
  sc->send_at = calloc((size_t)nsteps, sizeof *sc->send_at);
  sc->recv_at = calloc((size_t)nsteps, sizeof *sc->recv_at);
  if (sc->v == NULL || sc->send_at == NULL || sc->recv_at == NULL) {
    ring_schedule_free(sc);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "ring: out of memory for the schedule");
  }
  for (int64_t i = 0; i < nsteps;) {
    const int64_t e = rda_ring_round_end(steps, nsteps, i);
    rda_ring_round_layout(steps + i, e - i, sc->send_at + i, sc->recv_at + i, NULL, NULL, NULL);
    i = e;
  }
  const int reach = backward ? 2 : 0;
  for (int64_t b0 = 0; b0 < nsteps;) {
    int64_t b1 = b0 + 1;
    while (b1 < nsteps && steps[b1].bundle == steps[b0].bundle) ++b1;
    /* Rounds of the bundle ascend by shift; walk the union of {s, .., s + reach} in order. */
    int last = -1;
    for (int64_t i = b0; i < b1; i = rda_ring_round_end(steps, b1, i)) {
      for (int sh = steps[i].shift; sh <= steps[i].shift + reach; ++sh) {
        if (sh <= last) continue;
        last = sh;
        ring_vstep *x = &sc->v[sc->nv++];
        memset(x, 0, sizeof *x);
        for (int64_t j = b0; j < b1; j = rda_ring_round_end(steps, b1, j)) {
          const int64_t e = rda_ring_round_end(steps, b1, j);
          if (steps[j].shift == sh) x->kv = ring_round_at(sc, steps, j, e);
          if (backward && steps[j].shift == sh - 2) x->grad = ring_round_at(sc, steps, j, e);
        }
        int recvs = 0;
        const int ops = ring_round_ops(&x->kv, &recvs) + ring_round_ops(&x->grad, NULL);
        if (ops > sc->max_ops) sc->max_ops = ops;
        if (recvs > sc->max_recvs) sc->max_recvs = recvs;
      }
    }
    b0 = b1;
  }
  return RDA_OK;
}

static ring_op ring_op_make(int send, int peer, ring_buf buf, uint64_t at, uint64_t bytes) {
  ring_op o = {send, peer, buf, at, bytes};
  return o;
}

int ring_vstep_ops(const ring_vstep *v, long long batch, ring_op *ops) {
  const uint64_t B = (uint64_t)batch;
  const ring_round *kv = &v->kv, *gr = &v->grad;
  int n = 0;
  for (int k = 0; k < kv->n; ++k)
    for (int q = 0; q < kv->steps[k].nsend; ++q)
      ops[n++] = ring_op_make(1, kv->steps[k].send[q].peer, RING_BUF_SEND, kv->send_at[k][q] * B,
                              kv->steps[k].send[q].bytes * B);
  /* The gradients of what this rank received, back to each block's sender; fp32: twice the
   * bytes, at twice the offset. */
  for (int k = 0; k < gr->n; ++k)
    for (int q = 0; q < gr->steps[k].nrecv; ++q)
      ops[n++] = ring_op_make(1, gr->steps[k].recv[q].peer, RING_BUF_GRAD_OUT,
                              2 * gr->recv_at[k][q] * B, 2 * gr->steps[k].recv[q].bytes * B);
  for (int k = 0; k < kv->n; ++k)
    for (int q = 0; q < kv->steps[k].nrecv; ++q)
      ops[n++] = ring_op_make(0, kv->steps[k].recv[q].peer, RING_BUF_RECV, kv->recv_at[k][q] * B,
                              kv->steps[k].recv[q].bytes * B);
  /* The gradients of what this rank sent, one after another in the order of the sends. */
  uint64_t off = 0;
  for (int k = 0; k < gr->n; ++k)
    for (int q = 0; q < gr->steps[k].nsend; ++q) {
      const uint64_t bytes = 2 * gr->steps[k].send[q].bytes * B;
      ops[n++] = ring_op_make(0, gr->steps[k].send[q].peer, RING_BUF_GRAD_IN, off, bytes);
      off += bytes;
    }
  return n;
}
