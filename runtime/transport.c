/* transport.c — the implementation-independent half of the transport interface: dispatch
 * through the vtable, argument checks, and collectives built from grouped send/recv (the
 * all-gather), so every transport gets them the same way. */
#include "transport.h"

#include <string.h>

static rda_status tr_check(const rda_transport *t, rda_err *err) {
  if (t == NULL || t->vt == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "transport: NULL endpoint");
  return RDA_OK;
}

static rda_status tr_check_peer(const rda_transport *t, int peer, const void *buf, size_t bytes,
                                rda_err *err) {
  RDA_TRY(tr_check(t, err));
  if (peer < 0 || peer >= t->size)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: peer %d is not a rank of %d",
                       t->rank, peer, t->size);
  if (buf == NULL && bytes > 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: NULL buffer of %zu bytes", t->rank,
                       bytes);
  return RDA_OK;
}

rda_status rda_transport_group_start(rda_transport *t, rda_err *err) {
  RDA_TRY(tr_check(t, err));
  return t->vt->group_start(t, err);
}

rda_status rda_transport_send(rda_transport *t, int peer, const void *buf, size_t bytes,
                              rda_err *err) {
  RDA_TRY(tr_check_peer(t, peer, buf, bytes, err));
  return t->vt->send(t, peer, buf, bytes, err);
}

rda_status rda_transport_recv(rda_transport *t, int peer, void *buf, size_t bytes, rda_err *err) {
  RDA_TRY(tr_check_peer(t, peer, buf, bytes, err));
  return t->vt->recv(t, peer, buf, bytes, err);
}

rda_status rda_transport_group_end(rda_transport *t, rda_err *err) {
  RDA_TRY(tr_check(t, err));
  return t->vt->group_end(t, err);
}

rda_status rda_transport_wait(rda_transport *t, rda_err *err) {
  RDA_TRY(tr_check(t, err));
  return t->vt->wait(t, err);
}

rda_status rda_transport_allgather(rda_transport *t, const void *send, void *recv, size_t bytes,
                                   rda_err *err) {
  RDA_TRY(tr_check(t, err));
  if (bytes > 0 && (send == NULL || recv == NULL))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: all-gather with a NULL buffer",
                       t->rank);
  char *out = recv;
  /* The own block goes through the transport too (a send to self), so it is a device copy
   * ordered like the others on device transports, where the buffers are device memory. */
  RDA_TRY(t->vt->group_start(t, err));
  for (int q = 0; q < t->size; q++) {
    RDA_TRY(t->vt->send(t, q, send, bytes, err));
    RDA_TRY(t->vt->recv(t, q, out + (size_t)q * bytes, bytes, err));
  }
  RDA_TRY(t->vt->group_end(t, err));
  RDA_TRY(t->vt->wait(t, err));
  /* The byte counters count what moved between ranks, not the local copy. */
  t->bytes_sent -= bytes;
  t->bytes_received -= bytes;
  return RDA_OK;
}

rda_status rda_transport_gather8(rda_transport *t, uint64_t mine, uint64_t *all, rda_err *err) {
  RDA_TRY(tr_check(t, err));
  if (all == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: gather8 needs an output", t->rank);
  return t->vt->gather8(t, mine, all, err);
}

rda_status rda_transport_connect(rda_transport *t, const int *peers, int npeers, rda_err *err) {
  RDA_TRY(tr_check(t, err));
  for (int i = 0; i < npeers; i++)
    if (peers == NULL || peers[i] < 0 || peers[i] >= t->size || peers[i] == t->rank)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rank %d: cannot connect to rank %d of %d",
                         t->rank, peers == NULL ? -1 : peers[i], t->size);
  if (t->vt->connect == NULL || npeers == 0) return RDA_OK;
  const uint64_t sent = t->bytes_sent, received = t->bytes_received;
  const rda_status s = t->vt->connect(t, peers, npeers, err);
  t->bytes_sent = sent, t->bytes_received = received; /* no ring bytes */
  return s;
}

rda_status rda_transport_give8(rda_transport *t, uint64_t mine, rda_err *err) {
  RDA_TRY(tr_check(t, err));
  return t->vt->gather8(t, mine, NULL, err);
}

rda_status rda_transport_barrier(rda_transport *t, rda_err *err) {
  return rda_transport_give8(t, 0, err);
}

int rda_transport_first_differing(const uint64_t *all, int n) {
  for (int q = 1; q < n; q++)
    if (all[q] != all[0]) return q;
  return 0;
}

uint64_t rda_transport_join_failed(rda_status why) {
  return RDA_TRANSPORT_JOIN_FAILED | ((uint64_t)(unsigned)why & 0xff);
}

rda_status rda_transport_check_fingerprints(const uint64_t *fp, int n, int rank, rda_err *err) {
  for (int q = 0; q < n; q++)
    if (fp[q] & RDA_TRANSPORT_JOIN_FAILED)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "rank %d: rank %d failed in rda_ring_create before it joined (%s; its "
                         "own error says why)",
                         rank, q, rda_status_string((rda_status)(fp[q] & 0xff)));
  const int q = rda_transport_first_differing(fp, n);
  if (q == 0) return RDA_OK;
  return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                     "rank %d: fingerprint mismatch: rank 0 has 0x%016llx, rank %d has 0x%016llx "
                     "(config, N, P, layout, dtype or rda version differ)",
                     rank, (unsigned long long)fp[0], q, (unsigned long long)fp[q]);
}

void rda_transport_abort(rda_transport *t, const char *reason) {
  if (t != NULL && t->vt != NULL) t->vt->abort(t, reason != NULL ? reason : "aborted");
}

void rda_transport_destroy(rda_transport *t) {
  if (t != NULL && t->vt != NULL) t->vt->destroy(t);
}

void rda_transport_bytes(const rda_transport *t, uint64_t *sent, uint64_t *received) {
  if (sent != NULL) *sent = t != NULL ? t->bytes_sent : 0;
  if (received != NULL) *received = t != NULL ? t->bytes_received : 0;
}
