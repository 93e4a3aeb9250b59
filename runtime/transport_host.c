/* transport_host.c — the host virtual-rank transport: P ranks as threads of one process
 * exchanging blocks through host memory. The world (matching, timeouts, abort, fingerprints) is
 * runtime/transport_world.c; a matched pair is copied at once, by whichever rank matched it. */
#include <stdlib.h>
#include <string.h>

#include "transport.h"
#include "transport_world.h"

struct rda_host_world {
  tw_world w;
};

static rda_status th_complete(tw_op *s, tw_op *r, rda_err *err) {
  (void)err;
  if (s->bytes > 0 && r->buf != s->buf) memmove(r->buf, s->buf, s->bytes);
  return RDA_OK;
}

static const tw_hooks th_hooks = {.complete = th_complete};

/* Host ranks have no links to set up, but connect exchanges what the NCCL endpoint does (a
 * byte each way with every peer, one group), so the ring's use of it runs in CI: peer lists
 * that do not mirror each other time out here as they would hang over NCCL. */
static rda_status th_connect(rda_transport *t, const int *peers, int npeers, rda_err *err) {
  unsigned char mine = 1, *got = malloc((size_t)npeers);
  if (got == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "rank %d: out of memory", t->rank);
  rda_status s = rda_transport_group_start(t, err);
  for (int i = 0; s == RDA_OK && i < npeers; i++) {
    s = rda_transport_send(t, peers[i], &mine, 1, err);
    if (s == RDA_OK) s = rda_transport_recv(t, peers[i], &got[i], 1, err);
  }
  if (s == RDA_OK) s = rda_transport_group_end(t, err);
  if (s == RDA_OK) s = rda_transport_wait(t, err);
  free(got);
  return s;
}

rda_status rda_host_world_create(int size, double timeout_s, rda_host_world **out, rda_err *err) {
  tw_world *w = NULL;
  const rda_status s =
      tw_world_create(sizeof **out, "host transport", "host", &th_hooks, size, timeout_s, &w, err);
  if (s == RDA_OK) w->vt.connect = th_connect;
  *out = (rda_host_world *)(void *)w; /* its first member */
  return s;
}

void rda_host_world_destroy(rda_host_world *w) {
  tw_world_destroy(w != NULL ? &w->w : NULL);
}

rda_status rda_host_world_join(rda_host_world *w, int rank, uint64_t fingerprint,
                               rda_transport **out, rda_err *err) {
  *out = NULL;
  if (w == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "host transport: rank %d of no world", rank);
  tw_endpoint *ep = NULL;
  RDA_TRY(tw_join(&w->w, rank, fingerprint, sizeof(tw_endpoint), NULL, NULL, &ep, err));
  *out = &ep->base;
  return RDA_OK;
}
