/* An NCCL communicator per process for data parallelism over GPUs (docs/training.md, "Several GPUs and
 * nodes"). Rank 0 makes the ncclUniqueId, the host rendezvous (../dist/dist.h) carries it to the others,
 * and every rank makes its communicator on its GPU (ncclCommInitRankConfig, non-blocking, so that no NCCL
 * call can block the host past the deadline). Collectives run on the device's one stream, in the caller's
 * order; every NCCL status is checked (PTL_ERR_CUDA, raised as ptl.CudaError, naming the call, NCCL's
 * status and its last error text).
 *
 * A watchdog thread per communicator turns a hang into an error: every 100 ms it reads NCCL's
 * asynchronous error and, once a collective it was told about (ptl_nccl_watch) has been pending longer
 * than the timeout, it aborts the communicator (ncclCommAbort), which ends NCCL's kernels so that the
 * stream, and whoever waits on it, moves on. After an abort every call fails with the reason. */
#ifndef PTL_CUDA_NCCL_COMM_H
#define PTL_CUDA_NCCL_COMM_H

#include <stdint.h>

#include "../dist/dist.h"
#include "../runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_NCCL_ID_BYTES 128      /* NCCL_UNIQUE_ID_BYTES */
#define PTL_NCCL_MIN_VERSION 21800 /* non-blocking communicators with abort (NCCL 2.18) */

typedef struct ptl_nccl_comm ptl_nccl_comm;

/* Opens NCCL (cuda/dynload.h) and gives its version code (e.g. 22807 for 2.28.7); no GPU needed. */
int ptl_nccl_version(int *version);
/* Rank 0's id of a new job (no GPU needed). */
int ptl_nccl_unique_id(uint8_t id[PTL_NCCL_ID_BYTES]);

/* This rank's communicator on CUDA device `device` (its stream is the device context's). Waits at most
 * timeout_s for all world ranks to join, else aborts and fails naming the timeout; `watch` (may be NULL) can
 * stop the wait (Ctrl-C). timeout_s is also the watchdog's limit for one collective. */
int ptl_nccl_comm_create(ptl_runtime *rt, int device, const uint8_t id[PTL_NCCL_ID_BYTES], int world, int rank,
                         double timeout_s, const ptl_dist_poll *watch, ptl_nccl_comm **out);
/* The communicator's rank and world size, and the execution context whose stream its collectives use. */
int ptl_nccl_comm_rank(const ptl_nccl_comm *c);
int ptl_nccl_comm_world(const ptl_nccl_comm *c);
struct ptl_cuda_ctx *ptl_nccl_comm_ctx(const ptl_nccl_comm *c);
/* Frees the communicator (finalized, or aborted after an error); NULL is fine. */
void ptl_nccl_comm_destroy(ptl_nccl_comm *c);

/* In place on the device's stream: the sum over ranks of count float32/float64/float16/bfloat16 elements
 * (the flat gradient). Enqueues without waiting; the watchdog watches it unless the stream is capturing. */
int ptl_nccl_all_reduce_sum(ptl_nccl_comm *c, void *buf, int64_t count, ptl_dtype dt);
/* In place on the device's stream: rank `root`'s count elements to every rank (BatchNorm statistics). */
int ptl_nccl_broadcast(ptl_nccl_comm *c, void *buf, int64_t count, ptl_dtype dt, int root);
/* Tells the watchdog that NCCL work was launched on the stream by other means (a replayed CUDA graph that
 * holds the all-reduce): it times it like the direct calls. */
int ptl_nccl_watch(ptl_nccl_comm *c);
/* What went through the communicator: [0] collectives queued on the stream, [1] collectives captured
 * into a graph, [2] replays of such graphs watched (ptl_nccl_watch). */
void ptl_nccl_counts(ptl_nccl_comm *c, int64_t counts[3]);
/* 0 while the communicator works; -1 with NCCL's asynchronous error or the watchdog's reason. */
int ptl_nccl_check(ptl_nccl_comm *c);
/* Aborts from any thread (the host group saw a peer fail): NCCL's kernels end, later calls fail with why. */
void ptl_nccl_abort(ptl_nccl_comm *c, const char *why);

#ifdef __cplusplus
}
#endif

#endif
