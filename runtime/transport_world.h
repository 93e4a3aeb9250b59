/* transport_world.h — what the host and device virtual-rank transports share (internal): a world
 * of P ranks as threads of one process (a lock, a condition, per-receiver queues of unmatched
 * sends and receives), FIFO matching per (sender, receiver), the fingerprint check at join,
 * timeouts, abort and the barrier. A transport supplies the vtable name and hooks: how a
 * matched pair moves its bytes (host: memmove; device: a copy on the receiver's communication
 * stream) and what happens around posting and waiting (device: events). */
#ifndef RDA_TRANSPORT_WORLD_H
#define RDA_TRANSPORT_WORLD_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"

enum { TW_SEND = 0, TW_RECV = 1 };

typedef struct tw_endpoint tw_endpoint;
typedef struct tw_world tw_world;

typedef struct tw_op {
  int kind;
  int owner, peer; /* ranks */
  void *buf;       /* the sender's is const in spirit: only read */
  size_t bytes;
  int done;
  tw_endpoint *ep;    /* the owner's endpoint */
  void *ev_ready;     /* device: recorded on the owner's stream at group_end */
  void *ev_copied;    /* device: recorded after the pair's copy; the owner's wait waits on it */
  struct tw_op *next; /* in a world queue while unmatched */
} tw_op;

struct tw_endpoint {
  rda_transport base;
  tw_world *world;
  tw_op **ops; /* this group's operations (each malloc'd: queue links stay valid) */
  int nops, cap;
  int state;   /* 0 idle, 1 in a group, 2 posted */
  int pending; /* posted and not done */
};

typedef struct tw_hooks {
  /* World lock held, sizes already equal: move s's bytes into r's buffer (or enqueue that).
   * A failure aborts the world in the name of r's owner with err's message. */
  rda_status (*complete)(tw_op *s, tw_op *r, rda_err *err);
  /* Optional, by the owner's thread without the lock: at group_end before any op is posted,
   * and when wait saw every op complete. A failure aborts the world in the owner's name. */
  rda_status (*before_post)(tw_endpoint *ep, rda_err *err);
  rda_status (*after_wait)(tw_endpoint *ep, rda_err *err);
  /* Optional, by the owner's thread without the lock, when wait failed on a posted group (the
   * world aborted, or timed out): its ops with done set were matched, their bytes moved or
   * being moved (device: copies enqueued), the others never will be; order the caller's later
   * work after the moves, so none lands in a buffer the caller reuses after the error. */
  void (*abandoned)(tw_endpoint *ep);
  /* Optional: release what the transport added to an endpoint (also after a failed join). */
  void (*fini)(tw_endpoint *ep);
} tw_hooks;

struct tw_world {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  const char *what;      /* "host transport", "device transport": for argument errors */
  rda_transport_vtbl vt; /* the tw_* entries below under the transport's name */
  const tw_hooks *hooks;
  int size;
  double timeout_s;
  int aborted;
  char reason[512];
  int joined;
  int *present;
  uint64_t *fingerprint;
  tw_endpoint **ep;
  tw_op **sendq; /* per receiver: unmatched sends addressed to it, in posting order */
  tw_op **recvq; /* per receiver: its unmatched receives, in posting order */
  int bar_count;
  uint64_t bar_gen;
  uint64_t *bar_vals; /* 2 * size: the values of gather8 generation g at (g & 1) * size */
  uint64_t *bar_at;   /* per rank: 1 + the generation it last arrived at (to name who did not) */
  int *left;          /* per rank: 1 once its endpoint was destroyed (it never comes back) */
};

/* A new world of `bytes` (>= sizeof(tw_world): the transport's own struct begins with a
 * tw_world) for size ranks (1..4096), 0 < timeout_s <= 1e6; its endpoints' vtable is the tw_*
 * functions below under `name`. what names the transport in errors. */
rda_status tw_world_create(size_t bytes, const char *what, const char *name, const tw_hooks *hooks,
                           int size, double timeout_s, tw_world **out, rda_err *err);
/* Frees a world from tw_world_create (NULL: nothing); every endpoint is destroyed first. */
void tw_world_destroy(tw_world *w);

/* Abort w for `rank`, which has no endpoint (it failed before joining): the first abort's
 * reason ("rank R: why") stays, and every waiting rank wakes up and fails with it. */
void tw_world_abort(tw_world *w, int rank, const char *why);

/* Join as `rank` with an endpoint of ep_bytes (>= sizeof(tw_endpoint); the transport's own
 * struct begins with a tw_endpoint); init, when given, sets up the transport's part before the
 * rank counts as joined (its failure aborts the world). Then as rda_host_world_join. */
rda_status tw_join(tw_world *w, int rank, uint64_t fingerprint, size_t ep_bytes,
                   rda_status (*init)(tw_endpoint *ep, void *arg, rda_err *err), void *arg,
                   tw_endpoint **out, rda_err *err);

/* The vtable entries. */
rda_status tw_group_start(rda_transport *t, rda_err *err);
rda_status tw_send(rda_transport *t, int peer, const void *buf, size_t bytes, rda_err *err);
rda_status tw_recv(rda_transport *t, int peer, void *buf, size_t bytes, rda_err *err);
rda_status tw_group_end(rda_transport *t, rda_err *err);
rda_status tw_wait(rda_transport *t, rda_err *err);
rda_status tw_gather8(rda_transport *t, uint64_t mine, uint64_t *all, rda_err *err);
void tw_abort(rda_transport *t, const char *reason);
void tw_destroy(rda_transport *t);

#endif
