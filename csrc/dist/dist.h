/* Data parallelism between processes: a TCP rendezvous at MASTER_ADDR:MASTER_PORT and the host collectives
 * over it (docs/training.md, "Several GPUs and nodes").
 *
 * Rank 0 listens; every other rank connects to it (retrying until its deadline) and says who it is; the
 * group exists once all `world` ranks have joined. The group is a star: each collective goes through rank 0,
 * which makes every result identical on all ranks and independent of timing:
 *   - all-reduce (sum) of float32/float64: rank 0 adds the ranks' buffers in rank order, x0 + x1 + ... (each
 *     element in the buffer's own precision, left to right), and sends the sum back; so it equals, bit for
 *     bit, the single-process sum of the same buffers in rank order;
 *   - broadcast of bytes from rank 0 (the ncclUniqueId, the run folder, BatchNorm statistics);
 *   - all-gather of byte blobs of any size (validation statistics);
 *   - barrier.
 * This is the CPU path (CPU ranks and tests) and the control plane of GPU runs; GPU gradients go through
 * NCCL (cuda/nccl_comm.h).
 *
 * Failure is never a hang. Every wait has a deadline (the group's timeout from the start of the collective);
 * a peer that exits or is killed closes its socket, which its peers see at once (end of file, a reset); a
 * peer whose host stops answering is found by TCP keepalive probes within about a minute; a rank that fails
 * by itself can say why (ptl_dist_abort). Rank 0 relays any failure to the other ranks as an abort frame
 * naming the rank and the reason, so every rank fails with the same message. After a failure the group is
 * broken: every later call fails with the first error. Errors are PTL_ERR_RUNTIME (peers, timeouts) or
 * PTL_ERR_VALUE (arguments). Waits call `watch->check` every PTL_DIST_POLL_MS so the caller can stop them
 * (Ctrl-C, a launched rank that exited); a nonzero return breaks the group and tells the peers why. */
#ifndef PTL_DIST_DIST_H
#define PTL_DIST_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Default seconds any one wait may take (PyTorch's default process-group timeout). */
#define PTL_DIST_TIMEOUT_DEFAULT_S 1800.0
/* How often a wait calls watch->check. */
#define PTL_DIST_POLL_MS 100
/* Protocol version: ranks of different ptl builds refuse each other. */
#define PTL_DIST_PROTOCOL 1

typedef struct {
    /* 0: keep waiting; nonzero: stop, with the reason in why (cap bytes), which the peers are told */
    int (*check)(void *ctx, char *why, size_t cap);
    void *ctx;
} ptl_dist_poll;

/* 1 when watch (may be NULL) asks to stop waiting, with its reason in why; else 0. */
int ptl_dist_stopped(const ptl_dist_poll *watch, char *why, size_t cap);

typedef struct ptl_dist_group ptl_dist_group;

/* Rank 0's listening socket, made before the other ranks start so that port 0 (any free port) can be told
 * to them. *port: the port it listens on. */
int ptl_dist_listen(int port, int *fd, int *bound_port);

/* Joins the group: rank 0 accepts the other world - 1 ranks on `listen_fd` (from ptl_dist_listen; or -1 to
 * listen on `port` now) and closes it once all have joined; rank r > 0 connects to host:port, retrying until
 * the deadline. host: a name or address (IPv4 or IPv6). timeout_s > 0 bounds the rendezvous and, later,
 * every collective. */
int ptl_dist_join(const char *host, int port, int rank, int world, double timeout_s, int listen_fd,
                  const ptl_dist_poll *poll, ptl_dist_group **out);
/* Closes the sockets (peers see the connection end) and frees the group. NULL is fine. */
void ptl_dist_close(ptl_dist_group *g);

int ptl_dist_rank(const ptl_dist_group *g);
int ptl_dist_world(const ptl_dist_group *g);
double ptl_dist_timeout(const ptl_dist_group *g);
int ptl_dist_set_timeout(ptl_dist_group *g, double timeout_s);
/* How many collectives this group has completed (each rank counts the same). */
uint64_t ptl_dist_sequence(const ptl_dist_group *g);
/* The first failure, or NULL while the group works. */
const char *ptl_dist_broken(const ptl_dist_group *g);

int ptl_dist_barrier(ptl_dist_group *g, const ptl_dist_poll *poll);
/* In place: buf (count elements of float32 or float64) becomes the sum over ranks, added in rank order.
 * Every rank must pass the same count and dtype. */
int ptl_dist_all_reduce_sum(ptl_dist_group *g, void *buf, int64_t count, ptl_dtype dt, const ptl_dist_poll *poll);
/* In place: rank 0's nbytes of buf are copied into every rank's buf (every rank passes the same nbytes). */
int ptl_dist_broadcast(ptl_dist_group *g, void *buf, size_t nbytes, const ptl_dist_poll *poll);
/* Rank 0's bytes to every rank when the others do not know the size: rank 0 passes (data, nbytes); every rank
 * gets a malloc'd copy in *out (free it) of *out_n bytes. */
int ptl_dist_broadcast_bytes(ptl_dist_group *g, const void *data, size_t nbytes, void **out, size_t *out_n,
                             const ptl_dist_poll *poll);
/* Every rank's blob to every rank: *out (malloc'd, free it) holds the blobs in rank order, sizes[r] (world
 * entries, caller-provided) their sizes. */
int ptl_dist_all_gather(ptl_dist_group *g, const void *data, size_t nbytes, void **out, size_t *sizes,
                        const ptl_dist_poll *poll);
/* Fails the job on purpose: tells the peers why (rank 0 tells every rank; another rank tells rank 0, which
 * tells the rest at its next wait) and breaks the group. Never waits: a peer whose socket is full is told by
 * the end of the connection instead. */
void ptl_dist_abort(ptl_dist_group *g, const char *reason);

#ifdef __cplusplus
}
#endif

#endif
