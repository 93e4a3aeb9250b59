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

static const rda_transport_vtbl th_vtbl = {
    .name = "host",
    .group_start = tw_group_start,
    .send = tw_send,
    .recv = tw_recv,
    .group_end = tw_group_end,
    .wait = tw_wait,
    .barrier = tw_barrier,
    .abort = tw_abort,
    .destroy = tw_destroy,
};

rda_status rda_host_world_create(int size, double timeout_s, rda_host_world **out, rda_err *err) {
  *out = NULL;
  rda_host_world *hw = calloc(1, sizeof *hw);
  if (hw == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "host transport: out of memory");
  const rda_status s =
      tw_world_init(&hw->w, "host transport", &th_vtbl, &th_hooks, size, timeout_s, err);
  if (s != RDA_OK) {
    free(hw);
    return s;
  }
  *out = hw;
  return RDA_OK;
}

void rda_host_world_destroy(rda_host_world *w) {
  if (w == NULL) return;
  tw_world_fini(&w->w);
  free(w);
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
