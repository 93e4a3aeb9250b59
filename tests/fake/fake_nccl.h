/* fake_nccl.h — the test-only helper of the fake libnccl.so.2 (tests/fake/fake_nccl.c), reached
 * with dlsym: what each rank did to the communicators made from one unique id. */
#ifndef RDA_FAKE_NCCL_H
#define RDA_FAKE_NCCL_H

/* For rank `rank` of the communicators made from the 128-byte unique id `id`, how many times:
 * "init" (ncclCommInitRankConfig), "abort" (ncclCommAbort), "destroy" (ncclCommDestroy),
 * "finalize" (ncclCommFinalize), "poll" (ncclCommGetAsyncError), "misuse" (a call on an aborted
 * or destroyed communicator, or one still initializing, or an operation after its finalize, a
 * destroy with operations in flight, a group end without a start). -1 for an unknown id, rank
 * or counter. */
long fake_nccl_count(const void *id, int rank, const char *what);
/* Operations rank `rank` posted on those communicators that have not completed. */
long fake_nccl_pending(const void *id, int rank);

/* fn(arg) runs at the start of every ncclCommGetAsyncError (outside the fake's lock, on the
 * polling thread) until replaced; NULL: none. Lets a test act while a transport call runs. */
void fake_nccl_on_poll(void (*fn)(void *arg), void *arg);

#endif
