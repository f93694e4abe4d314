/* The rendezvous: rank 0 listens and admits the other ranks; they connect with retries until the deadline
 * and introduce themselves (rank, world size, protocol, host and pid). A connection that does not belong
 * (another job on the same port, a wrong world size, a rank taken twice) is told why and turned away; the
 * rendezvous then keeps waiting for the right one. */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dist_impl.h"

#define LISTEN_BACKLOG 128
#define MAX_PENDING 64 /* connections admitted but not yet introduced */
#define RETRY_FIRST_S 0.05
#define RETRY_MAX_S 1.0

int ptl_dist_listen(int port, int *fd_out, int *bound_port)
{
    *fd_out = -1;
    if (port < 0 || port > 65535)
        return ptl_set_error(PTL_ERR_VALUE, "ptl.distributed: port must be in [0, 65535], got %d", port);
    int one = 1, zero = 0;
    /* IPv6 with IPv4-mapped addresses takes both families; a host without IPv6 gets IPv4 */
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int bound = 0;
    if (fd >= 0) {
        struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = in6addr_any};
        bound = setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) == 0 &&
                setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
                bind(fd, (struct sockaddr *)&a6, sizeof a6) == 0;
        if (!bound && errno == EADDRINUSE)
            goto in_use;
        if (!bound)
            close(fd);
    }
    if (!bound) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = INADDR_ANY};
        if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
            bind(fd, (struct sockaddr *)&a4, sizeof a4) != 0) {
            if (errno == EADDRINUSE)
                goto in_use;
            int e = errno;
            if (fd >= 0)
                close(fd);
            return ptl_set_error(PTL_ERR_OS, "ptl.distributed: cannot listen on port %d: %s", port, strerror(e));
        }
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (listen(fd, LISTEN_BACKLOG) != 0 || getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
        int e = errno;
        close(fd);
        return ptl_set_error(PTL_ERR_OS, "ptl.distributed: cannot listen on port %d: %s", port, strerror(e));
    }
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                  : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return 0;
in_use:
    close(fd);
    return ptl_set_error(PTL_ERR_OS, "ptl.distributed: cannot listen on port %d: it is in use (another job, or a "
                         "previous run that has not exited); choose another MASTER_PORT", port);
}

static void describe_self(char *who)
{
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    snprintf(who, PTL_DIST_WHO, "%s pid %d", host, (int)getpid());
}

static ptl_dist_group *group_new(int rank, int world, double timeout_s)
{
    ptl_dist_group *g = calloc(1, sizeof *g);
    int nfd = rank == 0 ? world : 1;
    if (!g || !(g->fd = malloc(sizeof *g->fd * (size_t)nfd)) || !(g->mid_frame = calloc((size_t)nfd, sizeof(int))) ||
        !(g->who = calloc((size_t)world, sizeof *g->who))) {
        if (g) {
            free(g->fd);
            free(g->mid_frame);
        }
        free(g);
        ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
        return NULL;
    }
    for (int i = 0; i < nfd; i++)
        g->fd[i] = -1;
    g->rank = rank, g->world = world, g->timeout_s = timeout_s;
    describe_self(g->who[rank]);
    return g;
}

/* Sleeps `seconds` in slices, calling watch. 0, or -1 when stopped (the reason in why). */
static int pause_for(double seconds, const ptl_dist_poll *watch, char *why, size_t cap)
{
    double until = ptl_dist_now() + seconds;
    while (1) {
        if (ptl_dist_stopped(watch, why, cap))
            return -1;
        double left = until - ptl_dist_now();
        if (left <= 0)
            return 0;
        poll(NULL, 0, left * 1e3 < PTL_DIST_POLL_MS ? (int)(left * 1e3) + 1 : PTL_DIST_POLL_MS);
    }
}

/* One connection attempt to every address of host:port. The connected socket, or -1 with `err` set. */
static int connect_once(const char *host, int port, double deadline, const ptl_dist_poll *watch, int *interrupted,
                        char *err, size_t cap, char *why, size_t why_cap)
{
    char service[16];
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        snprintf(err, cap, "cannot resolve %s: %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            snprintf(err, cap, "socket(): %s", strerror(errno));
            continue;
        }
        int e = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
        while (e == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            if (poll(&p, 1, PTL_DIST_POLL_MS) > 0) {
                socklen_t len = sizeof e;
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
                    e = errno;
            } else if (ptl_dist_now() >= deadline) {
                e = ETIMEDOUT;
            } else if (ptl_dist_stopped(watch, why, why_cap)) {
                *interrupted = 1;
                e = EINTR;
            }
        }
        if (e != 0) {
            snprintf(err, cap, "%s", strerror(e));
            close(fd);
            fd = -1;
            if (*interrupted)
                break;
        }
    }
    freeaddrinfo(res);
    return fd;
}

/* Rank r > 0: connect (retrying), introduce this rank, wait to be welcomed. */
static int join_rank0(ptl_dist_group *g, const char *host, int port, double deadline, const ptl_dist_poll *watch)
{
    char err[256] = "no attempt made", why[PTL_DIST_MSG / 2] = "";
    double retry = RETRY_FIRST_S;
    int interrupted = 0;
    while ((g->fd[0] = connect_once(host, port, deadline, watch, &interrupted, err, sizeof err, why, sizeof why)) < 0) {
        double left = deadline - ptl_dist_now();
        if (!interrupted && left <= 0)
            return ptl_set_error(PTL_ERR_RUNTIME, "ptl.distributed: rank %d could not reach rank 0 at %s:%d within "
                                 "%g s (last error: %s); check MASTER_ADDR and MASTER_PORT, and that rank 0 started",
                                 g->rank, host, port, g->timeout_s, err);
        if (interrupted || pause_for(retry < left ? retry : left, watch, why, sizeof why) != 0)
            return ptl_set_error(PTL_ERR_RUNTIME, "ptl.distributed: rank %d stopped connecting to rank 0 at %s:%d: %s",
                                 g->rank, host, port, why);
        retry = retry * 2 < RETRY_MAX_S ? retry * 2 : RETRY_MAX_S;
    }
    if (ptl_dist_socket_setup(g->fd[0]) != 0)
        return -1;
    snprintf(g->who[0], PTL_DIST_WHO, "%s:%d", host, port);
    ptl_xfer x = {0};
    x.peer = 0;
    x.send = 1;
    x.send_hdr = (ptl_frame){PTL_FRAME_MAGIC, OP_HELLO, PTL_DIST_PROTOCOL, strlen(g->who[g->rank]),
                             (uint32_t)g->rank, (uint32_t)g->world};
    x.send_data = g->who[g->rank];
    x.recv = 1;
    x.recv_op = OP_WELCOME;
    x.recv_alloc = 1;
    if (ptl_dist_exchange(g, &x, 1, "rendezvous", deadline, watch) != 0)
        return -1;
    size_t n = x.recv_hdr.nbytes < PTL_DIST_WHO - 1 ? (size_t)x.recv_hdr.nbytes : PTL_DIST_WHO - 1;
    memcpy(g->who[0], x.recv_data, n);
    g->who[0][n] = 0;
    free(x.recv_data);
    return 0;
}

typedef struct {
    int fd;
    ptl_frame h;
    size_t got; /* header, then the introduction */
    char who[PTL_DIST_WHO];
} pending_t;

/* Turns a connection away with the reason (it fails with it). */
static void refuse(pending_t *p, const char *fmt, uint32_t a, uint32_t b)
{
    char msg[PTL_DIST_MSG];
    snprintf(msg, sizeof msg, fmt, a, b);
    ptl_frame h = {PTL_FRAME_MAGIC, OP_ABORT, 0, strlen(msg), 0, 0};
    (void)!send(p->fd, &h, sizeof h, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)!send(p->fd, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT);
    close(p->fd);
    p->fd = -1;
}

/* Reads a pending connection's introduction. 1 once complete, 0 to wait, -1 when it went away. */
static int read_hello(pending_t *p)
{
    while (1) {
        size_t hdr = sizeof p->h;
        size_t total = hdr + (p->got >= hdr ? (size_t)p->h.nbytes : 0);
        if (p->got >= hdr && total == p->got)
            return 1;
        char *dst = p->got < hdr ? (char *)&p->h + p->got : p->who + (p->got - hdr);
        size_t want = p->got < hdr ? hdr - p->got : total - p->got;
        ssize_t r = recv(p->fd, dst, want, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return 0;
        if (r <= 0)
            return -1;
        p->got += (size_t)r;
        if (p->got == hdr && (p->h.magic != PTL_FRAME_MAGIC || p->h.op != OP_HELLO || p->h.nbytes >= PTL_DIST_WHO))
            return -1;
    }
}

/* Takes a complete introduction into the group, or turns it away. */
static void admit(ptl_dist_group *g, pending_t *p, int *joined)
{
    const ptl_frame *h = &p->h;
    uint32_t world = (uint32_t)g->world;
    if (h->seq != PTL_DIST_PROTOCOL)
        refuse(p, "rank 0 speaks ptl.distributed protocol %u, this rank %u: run one ptl version everywhere",
               PTL_DIST_PROTOCOL, (uint32_t)h->seq);
    else if (h->world != world)
        refuse(p, "the job's world size is %u (rank 0), but this rank was started with %u", world, h->world);
    else if (h->arg == 0 || h->arg >= world)
        refuse(p, "rank %u is outside 1..%u", h->arg, world - 1);
    else if (g->fd[h->arg] >= 0)
        refuse(p, "rank %u has already joined from another process (world size %u): each rank needs its own RANK",
               h->arg, world);
    if (p->fd < 0)
        return;
    p->who[p->h.nbytes] = 0;
    snprintf(g->who[h->arg], PTL_DIST_WHO, "%s", p->who);
    g->fd[h->arg] = p->fd;
    p->fd = -1;
    (*joined)++;
}

static void missing_ranks(const ptl_dist_group *g, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (int r = 1; r < g->world && len + 16 < cap; r++)
        if (g->fd[r] < 0)
            len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? ", " : "", r);
}

/* Rank 0: admits world - 1 ranks, then welcomes each. */
static int accept_all(ptl_dist_group *g, int lfd, int port, double deadline, const ptl_dist_poll *watch)
{
    pending_t pend[MAX_PENDING];
    struct pollfd fds[MAX_PENDING + 1];
    int npend = 0, joined = 0, rc = -1, flags = fcntl(lfd, F_GETFL, 0);
    if (flags < 0 || fcntl(lfd, F_SETFL, flags | O_NONBLOCK) < 0)
        return ptl_set_error(PTL_ERR_OS, "ptl.distributed: cannot configure the listening socket: %s", strerror(errno));
    while (joined < g->world - 1) {
        double now = ptl_dist_now();
        if (now >= deadline) {
            char miss[256];
            missing_ranks(g, miss, sizeof miss);
            ptl_set_error(PTL_ERR_RUNTIME, "ptl.distributed: rendezvous on port %d timed out after %g s: %d of %d ranks "
                          "joined, rank(s) %s did not; check that every rank started with WORLD_SIZE=%d and this "
                          "MASTER_ADDR/MASTER_PORT", port, g->timeout_s, joined + 1, g->world, miss, g->world);
            goto done;
        }
        char why[PTL_DIST_MSG / 2];
        if (ptl_dist_stopped(watch, why, sizeof why)) {
            ptl_set_error(PTL_ERR_RUNTIME, "ptl.distributed: rank 0 stopped the rendezvous: %s", why);
            goto done;
        }
        fds[0] = (struct pollfd){lfd, POLLIN, 0};
        for (int i = 0; i < npend; i++)
            fds[i + 1] = (struct pollfd){pend[i].fd, POLLIN, 0};
        double left_ms = (deadline - now) * 1e3;
        if (poll(fds, (nfds_t)npend + 1, left_ms < PTL_DIST_POLL_MS ? (int)left_ms + 1 : PTL_DIST_POLL_MS) <= 0)
            continue;
        for (int i = 0; i < npend; i++) {
            if (!(fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            int r = read_hello(&pend[i]);
            if (r < 0) {
                close(pend[i].fd);
                pend[i].fd = -1;
            } else if (r == 1) {
                admit(g, &pend[i], &joined);
            }
        }
        int k = 0;
        for (int i = 0; i < npend; i++)
            if (pend[i].fd >= 0)
                pend[k++] = pend[i];
        npend = k;
        if (fds[0].revents & POLLIN) {
            int fd;
            while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                if (npend == MAX_PENDING || ptl_dist_socket_setup(fd) != 0) {
                    close(fd);
                    continue;
                }
                pend[npend++] = (pending_t){.fd = fd};
            }
        }
    }
    ptl_xfer *x = calloc((size_t)g->world, sizeof *x);
    if (!x) {
        ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
        goto done;
    }
    for (int r = 1; r < g->world; r++) {
        ptl_xfer *xr = &x[r - 1];
        xr->peer = r;
        xr->send = 1;
        xr->send_hdr = (ptl_frame){PTL_FRAME_MAGIC, OP_WELCOME, 0, strlen(g->who[0]), 0, (uint32_t)g->world};
        xr->send_data = g->who[0];
    }
    rc = ptl_dist_exchange(g, x, g->world - 1, "rendezvous", deadline, watch);
    free(x);
done:
    for (int i = 0; i < npend; i++)
        close(pend[i].fd);
    return rc;
}

int ptl_dist_join(const char *host, int port, int rank, int world, double timeout_s, int listen_fd,
                  const ptl_dist_poll *watch, ptl_dist_group **out)
{
    *out = NULL;
    if (world < 1 || world > 65536 || rank < 0 || rank >= world)
        return ptl_set_error(PTL_ERR_VALUE, "ptl.distributed: rank %d and world size %d: need 0 <= rank < world <= "
                             "65536", rank, world);
    if (!(timeout_s > 0))
        return ptl_set_error(PTL_ERR_VALUE, "ptl.distributed: timeout must be > 0 seconds, got %g", timeout_s);
    if (port < 0 || port > 65535 || (port == 0 && listen_fd < 0))
        return ptl_set_error(PTL_ERR_VALUE, "ptl.distributed: MASTER_PORT must be in [1, 65535], got %d", port);
    if (rank > 0 && (!host || !host[0]))
        return ptl_set_error(PTL_ERR_VALUE, "ptl.distributed: rank %d needs MASTER_ADDR (rank 0's host)", rank);
    ptl_dist_group *g = group_new(rank, world, timeout_s);
    if (!g) {
        if (listen_fd >= 0)
            close(listen_fd);
        return -1;
    }
    double deadline = ptl_dist_now() + timeout_s;
    int rc = 0;
    if (rank == 0 && world > 1) {
        int bound;
        if (listen_fd < 0 && ptl_dist_listen(port, &listen_fd, &bound) != 0)
            rc = -1;
        else
            rc = accept_all(g, listen_fd, port, deadline, watch);
    } else if (rank > 0) {
        rc = join_rank0(g, host, port, deadline, watch);
    }
    if (listen_fd >= 0)
        close(listen_fd); /* late or stray connections are refused from now on */
    if (rc != 0) {
        ptl_dist_close(g);
        return -1;
    }
    *out = g;
    return 0;
}

/* After a failure the peers must read the abort frame before the connection goes: closing a socket that
 * still holds unread data resets it, and a reset discards what the peer had not yet read. So the failed
 * group reads and drops what arrives until each peer hangs up (it fails once it reads the abort), for at most
 * LINGER_S. */
#define LINGER_S 2.0
static void linger(ptl_dist_group *g, int nfd)
{
    struct pollfd fds[64];
    char sink[65536];
    double until = ptl_dist_now() + LINGER_S;
    for (int first = 0; first < nfd; first += 64) {
        int n = 0;
        for (int i = first; i < nfd && i < first + 64; i++)
            if (g->fd[i] >= 0)
                fds[n++] = (struct pollfd){g->fd[i], POLLIN, 0};
        while (n > 0 && ptl_dist_now() < until) {
            if (poll(fds, (nfds_t)n, PTL_DIST_POLL_MS) <= 0)
                continue;
            for (int k = 0; k < n; k++) {
                if (!fds[k].revents)
                    continue;
                ssize_t r;
                while ((r = recv(fds[k].fd, sink, sizeof sink, MSG_DONTWAIT)) > 0)
                    ;
                if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                    fds[k--] = fds[--n]; /* that peer hung up: done with it */
            }
        }
    }
}

void ptl_dist_close(ptl_dist_group *g)
{
    if (!g)
        return;
    int nfd = g->rank == 0 ? g->world : 1;
    if (g->broken[0])
        linger(g, nfd);
    for (int i = 0; i < nfd; i++)
        if (g->fd[i] >= 0)
            close(g->fd[i]);
    free(g->fd);
    free(g->mid_frame);
    free(g->who);
    free(g->scratch);
    free(g);
}

int ptl_dist_rank(const ptl_dist_group *g) { return g->rank; }
int ptl_dist_world(const ptl_dist_group *g) { return g->world; }
double ptl_dist_timeout(const ptl_dist_group *g) { return g->timeout_s; }
uint64_t ptl_dist_sequence(const ptl_dist_group *g) { return g->seq; }
const char *ptl_dist_broken(const ptl_dist_group *g) { return g->broken[0] ? g->broken : NULL; }

int ptl_dist_set_timeout(ptl_dist_group *g, double timeout_s)
{
    if (!(timeout_s > 0))
        return ptl_set_error(PTL_ERR_VALUE, "ptl.distributed: timeout must be > 0 seconds, got %g", timeout_s);
    g->timeout_s = timeout_s;
    return 0;
}
