/* Framed messages between ranks over non-blocking TCP sockets (dist_impl.h). */
#define _GNU_SOURCE /* TCP_KEEPIDLE, TCP_USER_TIMEOUT */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "dist_impl.h"

/* Keepalive: probe after 10 s of silence, every 5 s, give up after 6 unanswered probes; data unacknowledged
 * for 60 s fails the connection too. */
#define KEEPALIVE_IDLE_S 10
#define KEEPALIVE_INTERVAL_S 5
#define KEEPALIVE_PROBES 6
#define USER_TIMEOUT_MS 60000
#define MAX_ABORT_TEXT (PTL_DIST_MSG - 1)

double ptl_dist_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int ptl_dist_stopped(const ptl_dist_poll *watch, char *why, size_t cap)
{
    if (!watch || !watch->check)
        return 0;
    snprintf(why, cap, "interrupted");
    return watch->check(watch->ctx, why, cap) != 0;
}

const char *ptl_dist_op_name(uint32_t op)
{
    static const char *const names[] = {"?", "hello", "welcome", "barrier", "broadcast", "all_reduce",
                                        "all_gather", "abort"};
    return op < OP_END ? names[op] : "?";
}

int ptl_dist_socket_setup(int fd)
{
    int one = 1, idle = KEEPALIVE_IDLE_S, intvl = KEEPALIVE_INTERVAL_S, cnt = KEEPALIVE_PROBES;
    unsigned int user_timeout = USER_TIMEOUT_MS;
    int flags = fcntl(fd, F_GETFL, 0);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) < 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) < 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) < 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) < 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout) < 0)
        return ptl_set_error(PTL_ERR_OS, "ptl.distributed: cannot configure a socket: %s", strerror(errno));
    return 0;
}

int ptl_dist_check_usable(const ptl_dist_group *g, const char *what)
{
    if (g->broken[0])
        return ptl_set_error(PTL_ERR_RUNTIME, "ptl.distributed: %s on a failed group: %s", what, g->broken);
    return 0;
}

/* The index into g->fd of a peer. */
static int slot_of(const ptl_dist_group *g, int peer) { return g->rank == 0 ? peer : 0; }

/* Sends a whole small frame if the socket takes it at once (never blocks). */
static void send_abort_frame(int fd, uint64_t seq, const char *msg)
{
    size_t n = strlen(msg);
    ptl_frame h = {PTL_FRAME_MAGIC, OP_ABORT, seq, n, 0, 0};
    struct iovec iov[2] = {{&h, sizeof h}, {(void *)msg, n}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
    (void)sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

int ptl_dist_fail(ptl_dist_group *g, const char *msg)
{
    if (!g->broken[0]) {
        snprintf(g->broken, sizeof g->broken, "%s", msg);
        int first = g->rank == 0 ? 1 : 0, last = g->rank == 0 ? g->world - 1 : 0;
        for (int s = first; s <= last; s++) {
            if (g->fd[s] < 0)
                continue;
            if (!g->mid_frame[s])
                send_abort_frame(g->fd[s], g->seq, msg);
            shutdown(g->fd[s], SHUT_WR);
        }
    }
    return ptl_set_error(PTL_ERR_RUNTIME, "ptl.distributed: %s", g->broken);
}

static int fail_peer(ptl_dist_group *g, int peer, const char *fmt, const char *what, const char *detail)
{
    char msg[PTL_DIST_MSG];
    snprintf(msg, sizeof msg, fmt, peer, g->who[peer][0] ? g->who[peer] : "?", what, (unsigned long long)g->seq,
             detail);
    return ptl_dist_fail(g, msg);
}

/* Sends what the socket takes. 1 when the frame is out, 0 to wait, -1 on failure. */
static int pump_send(ptl_dist_group *g, ptl_xfer *x, const char *what)
{
    size_t total = sizeof x->send_hdr + (size_t)x->send_hdr.nbytes;
    while (x->sent < total) {
        struct iovec iov[2];
        int k = 0;
        if (x->sent < sizeof x->send_hdr)
            iov[k++] = (struct iovec){(char *)&x->send_hdr + x->sent, sizeof x->send_hdr - x->sent};
        size_t data_off = x->sent > sizeof x->send_hdr ? x->sent - sizeof x->send_hdr : 0;
        if (x->send_hdr.nbytes > data_off)
            iov[k++] = (struct iovec){(char *)x->send_data + data_off, (size_t)x->send_hdr.nbytes - data_off};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
        ssize_t r = sendmsg(x->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return 0;
        if (r < 0)
            return fail_peer(g, x->peer, "lost the connection to rank %d (%s) during %s #%llu: %s", what,
                             strerror(errno));
        x->sent += (size_t)r;
        g->mid_frame[slot_of(g, x->peer)] = x->sent < total;
    }
    return 1;
}

/* Checks a complete header; sets where its payload goes. 0, or -1 (group failed). */
static int accept_header(ptl_dist_group *g, ptl_xfer *x, const char *what)
{
    const ptl_frame *h = &x->recv_hdr;
    char detail[256];
    if (h->magic != PTL_FRAME_MAGIC)
        return fail_peer(g, x->peer, "rank %d (%s) sent data that is not a ptl frame during %s #%llu%s", what, "");
    if (h->op == OP_ABORT) {
        size_t n = h->nbytes < MAX_ABORT_TEXT ? (size_t)h->nbytes : MAX_ABORT_TEXT;
        x->abort_text = calloc(1, MAX_ABORT_TEXT + 1);
        if (!x->abort_text)
            return ptl_dist_fail(g, "out of host memory reading an abort message");
        x->recv_hdr.nbytes = n;
        return 0;
    }
    if (x->send && x->sent < sizeof x->send_hdr + (size_t)x->send_hdr.nbytes)
        return fail_peer(g, x->peer, "rank %d (%s) answered before receiving this rank's data in %s #%llu%s", what,
                         "");
    if (h->op != x->recv_op || h->seq != g->seq) {
        snprintf(detail, sizeof detail, ", but it is in %s #%llu: every rank must call the same collectives in the "
                 "same order", ptl_dist_op_name(h->op), (unsigned long long)h->seq);
        return fail_peer(g, x->peer, "collective mismatch: rank %d (%s) was expected in %s #%llu%s", what, detail);
    }
    if (x->check_arg && h->arg != x->recv_arg) {
        snprintf(detail, sizeof detail, ": it passed dtype %s, this rank %s",
                 h->arg < PTL_NUM_DTYPES ? ptl_dtype_name((ptl_dtype)h->arg) : "?",
                 ptl_dtype_name((ptl_dtype)x->recv_arg));
        return fail_peer(g, x->peer, "rank %d (%s) disagrees in %s #%llu%s", what, detail);
    }
    if (x->recv_alloc) {
        x->recv_data = malloc(h->nbytes ? (size_t)h->nbytes : 1);
        if (!x->recv_data)
            return ptl_dist_fail(g, "out of host memory receiving a frame");
    } else if (h->nbytes != x->recv_want) {
        snprintf(detail, sizeof detail, ": it passed %llu bytes, this rank %llu", (unsigned long long)h->nbytes,
                 (unsigned long long)x->recv_want);
        return fail_peer(g, x->peer, "rank %d (%s) disagrees in %s #%llu%s", what, detail);
    }
    return 0;
}

/* Reads what has arrived. 1 when the frame is complete, 0 to wait, -1 on failure. */
static int pump_recv(ptl_dist_group *g, ptl_xfer *x, const char *what)
{
    while (1) {
        char *dst;
        size_t want;
        if (x->hdr_got < sizeof x->recv_hdr) {
            dst = (char *)&x->recv_hdr + x->hdr_got;
            want = sizeof x->recv_hdr - x->hdr_got;
        } else {
            if (x->recv_got == x->recv_hdr.nbytes)
                break;
            dst = (x->abort_text ? x->abort_text : (char *)x->recv_data) + x->recv_got;
            want = (size_t)x->recv_hdr.nbytes - x->recv_got;
        }
        ssize_t r = recv(x->fd, dst, want, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return 0;
        if (r < 0)
            return fail_peer(g, x->peer, "lost the connection to rank %d (%s) during %s #%llu: %s", what,
                             strerror(errno));
        if (r == 0)
            return fail_peer(g, x->peer,
                             "rank %d (%s) closed its connection during %s #%llu%s: its process exited or was killed",
                             what, "");
        if (x->hdr_got < sizeof x->recv_hdr) {
            x->hdr_got += (size_t)r;
            if (x->hdr_got == sizeof x->recv_hdr && accept_header(g, x, what) != 0)
                return -1;
        } else {
            x->recv_got += (size_t)r;
        }
    }
    if (x->abort_text) {
        /* the peer failed and says why; rank 0 passes its words on to the others unchanged */
        char msg[PTL_DIST_MSG];
        snprintf(msg, sizeof msg, "%s", x->abort_text);
        free(x->abort_text);
        x->abort_text = NULL;
        return ptl_dist_fail(g, msg);
    }
    return 1;
}

static void timeout_message(ptl_dist_group *g, ptl_xfer *x, int n, const char *what, char *msg, size_t cap)
{
    size_t len = (size_t)snprintf(msg, cap, "%s #%llu timed out after %g s waiting for rank", what,
                                  (unsigned long long)g->seq, g->timeout_s);
    int shown = 0;
    for (int i = 0; i < n && len < cap; i++) {
        int pending = (x[i].send && x[i].sent < sizeof x[i].send_hdr + (size_t)x[i].send_hdr.nbytes) ||
                      (x[i].recv && (x[i].hdr_got < sizeof x[i].recv_hdr || x[i].recv_got < x[i].recv_hdr.nbytes));
        if (pending)
            len += (size_t)snprintf(msg + len, cap - len, "%s %d (%s)", shown++ ? "," : "", x[i].peer,
                                    g->who[x[i].peer][0] ? g->who[x[i].peer] : "?");
    }
    if (len < cap)
        snprintf(msg + len, cap - len, ": it is stuck, much slower, or not part of this job (the timeout is set with "
                 "Trainer(timeout=) or PTL_DIST_TIMEOUT)");
}

static void release_allocations(ptl_xfer *x, int n)
{
    for (int i = 0; i < n; i++) {
        free(x[i].abort_text);
        x[i].abort_text = NULL;
        if (x[i].recv_alloc) {
            free(x[i].recv_data);
            x[i].recv_data = NULL;
        }
    }
}

int ptl_dist_exchange(ptl_dist_group *g, ptl_xfer *x, int n, const char *what, double deadline,
                      const ptl_dist_poll *watch)
{
    struct pollfd stack_fds[16], *fds = n <= 16 ? stack_fds : malloc(sizeof *fds * (size_t)n);
    int *idx = NULL, rc = -1;
    double last_check = ptl_dist_now();
    if (!fds || !(idx = malloc(sizeof *idx * (size_t)(n ? n : 1)))) {
        ptl_dist_fail(g, "out of host memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        x[i].fd = g->fd[slot_of(g, x[i].peer)];
        if (x[i].send)
            x[i].send_hdr.magic = PTL_FRAME_MAGIC;
    }
    while (1) {
        int active = 0;
        for (int i = 0; i < n; i++) {
            int r;
            if (x[i].send && (r = pump_send(g, &x[i], what)) != 1) {
                if (r < 0)
                    goto done;
            }
            int sending = x[i].send && x[i].sent < sizeof x[i].send_hdr + (size_t)x[i].send_hdr.nbytes;
            int receiving = x[i].recv && (x[i].hdr_got < sizeof x[i].recv_hdr || x[i].recv_got < x[i].recv_hdr.nbytes);
            if (sending || receiving) {
                fds[active] = (struct pollfd){x[i].fd, (short)((sending ? POLLOUT : 0) | (receiving ? POLLIN : 0)), 0};
                idx[active++] = i;
            }
        }
        if (!active)
            break;
        double now = ptl_dist_now();
        if (now >= deadline) {
            char msg[PTL_DIST_MSG];
            timeout_message(g, x, n, what, msg, sizeof msg);
            ptl_dist_fail(g, msg);
            goto done;
        }
        if (now - last_check >= PTL_DIST_POLL_MS * 1e-3) {
            char why[PTL_DIST_MSG / 2], msg[PTL_DIST_MSG];
            last_check = now;
            if (ptl_dist_stopped(watch, why, sizeof why)) {
                snprintf(msg, sizeof msg, "rank %d (%s) stopped waiting in %s #%llu: %s", g->rank, g->who[g->rank],
                         what, (unsigned long long)g->seq, why);
                ptl_dist_fail(g, msg);
                goto done;
            }
        }
        double wait_ms = (deadline - now) * 1e3;
        int timeout = wait_ms < PTL_DIST_POLL_MS ? (int)wait_ms + 1 : PTL_DIST_POLL_MS;
        int ready = poll(fds, (nfds_t)active, timeout);
        if (ready < 0 && errno != EINTR) {
            char msg[PTL_DIST_MSG];
            snprintf(msg, sizeof msg, "poll() failed during %s: %s", what, strerror(errno));
            ptl_dist_fail(g, msg);
            goto done;
        }
        for (int k = 0; ready > 0 && k < active; k++) {
            ptl_xfer *xi = &x[idx[k]];
            if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) {
                if (xi->recv && pump_recv(g, xi, what) < 0)
                    goto done;
                if (!xi->recv && pump_send(g, xi, what) < 0) /* the error is the send's */
                    goto done;
            }
        }
    }
    rc = 0;
done:
    if (rc != 0)
        release_allocations(x, n);
    if (fds != stack_fds)
        free(fds);
    free(idx);
    return rc;
}
