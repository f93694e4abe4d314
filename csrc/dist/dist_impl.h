/* The group's state and the interfaces between the files of csrc/dist (internal):
 *   transport.c        framed messages over non-blocking sockets: one exchange moves frames to and from
 *                      several peers at once, under a deadline, and fails the group on any error
 *   rendezvous.c       listening, connecting with retries, the hello handshake, closing
 *   host_collective.c  barrier, broadcast, all-reduce, all-gather, abort on top of the exchange
 *
 * A frame is a fixed header and `nbytes` of payload. Ranks are assumed to share a byte order (they run
 * the same build; the magic number would not match otherwise). */
#ifndef PTL_DIST_IMPL_H
#define PTL_DIST_IMPL_H

#include <stdint.h>

#include "dist.h"

enum { OP_HELLO = 1, OP_WELCOME, OP_BARRIER, OP_BCAST, OP_REDUCE, OP_GATHER, OP_ABORT, OP_END };

#define PTL_FRAME_MAGIC 0x444c5450u /* "PTLD" */
#define PTL_DIST_WHO 96             /* "host pid N" of a rank, for messages */
#define PTL_DIST_MSG 768

typedef struct {
    uint32_t magic, op;
    uint64_t seq;    /* the collective's number; HELLO: the protocol version */
    uint64_t nbytes; /* payload bytes after the header */
    uint32_t arg;    /* REDUCE: the dtype; HELLO: the rank */
    uint32_t world;  /* HELLO: the world size */
} ptl_frame;

struct ptl_dist_group {
    int rank, world;
    int *fd;           /* rank 0: fd[r] is rank r's socket (fd[0] = -1); rank r > 0: fd[0] is rank 0's */
    char (*who)[PTL_DIST_WHO]; /* per rank (rank 0 knows all; the others know themselves and rank 0) */
    int *mid_frame;    /* per fd: a frame is partly sent, so no abort frame may follow it */
    uint64_t seq;      /* collectives completed */
    double timeout_s;
    char broken[PTL_DIST_MSG];
    void *scratch;     /* rank 0: the other ranks' buffers during an all-reduce */
    size_t scratch_cap;
};

/* One peer's part of an exchange: optionally a frame to send, optionally a frame to receive. */
typedef struct {
    int peer;            /* the rank at the other end */
    int fd;
    /* send: send_hdr, then send_hdr.nbytes bytes of send_data */
    int send;
    ptl_frame send_hdr;
    const void *send_data;
    size_t sent;
    /* receive a frame of op recv_op and the current sequence number */
    int recv;
    uint32_t recv_op;
    int recv_alloc;      /* any size: the payload goes to a malloc'd buffer left in recv_data */
    void *recv_data;     /* else the payload must be exactly recv_want bytes, written here */
    size_t recv_want;
    int check_arg;       /* also require recv_hdr.arg == recv_arg */
    uint32_t recv_arg;
    ptl_frame recv_hdr;
    size_t hdr_got, recv_got;
    char *abort_text;    /* an abort frame's payload while it arrives */
} ptl_xfer;

double ptl_dist_now(void);
const char *ptl_dist_op_name(uint32_t op);
/* Sets fd non-blocking with no Nagle delay and kernel keepalive probes (a silent dead host is found in
 * about a minute even while this process computes). */
int ptl_dist_socket_setup(int fd);

/* Moves every xfer's frames until all are done. On failure (a peer's error, end of file, abort frame,
 * mismatch, the deadline, watch->check) it fails the group (ptl_dist_fail) and returns -1; receive buffers
 * it allocated are freed then. `what`: the collective, for messages. */
int ptl_dist_exchange(ptl_dist_group *g, ptl_xfer *x, int n, const char *what, double deadline,
                      const ptl_dist_poll *watch);
/* Breaks the group with `msg` (PTL_ERR_RUNTIME, the message prefixed "ptl.distributed: "), tells every peer
 * with an abort frame where the stream allows (the one at fault too: a peer that disagreed is alive and
 * waiting), and half-closes the sockets so waiting peers see the end at once. Returns -1. */
int ptl_dist_fail(ptl_dist_group *g, const char *msg);
/* -1 with the group's first error when it is broken, else 0. */
int ptl_dist_check_usable(const ptl_dist_group *g, const char *what);

#endif
