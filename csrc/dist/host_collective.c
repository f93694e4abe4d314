/* The host collectives (dist.h): every one goes through rank 0, which gathers, combines in rank order and
 * sends the one result back, so all ranks end with the same bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_impl.h"

/* Checks that the group works; sets the collective's deadline. */
static int begin(ptl_dist_group *g, const char *what, double *deadline)
{
    if (ptl_dist_check_usable(g, what) != 0)
        return -1;
    *deadline = ptl_dist_now() + g->timeout_s;
    return 0;
}

/* xfers for every peer of rank 0, zeroed. */
static ptl_xfer *peers_new(ptl_dist_group *g)
{
    ptl_xfer *x = calloc((size_t)g->world, sizeof *x);
    if (!x) {
        ptl_dist_fail(g, "out of host memory");
        return NULL;
    }
    for (int r = 1; r < g->world; r++)
        x[r - 1].peer = r;
    return x;
}

/* x (zeroed but for its peer) will receive a frame of op, of nbytes into dst. */
static void expect(ptl_xfer *x, uint32_t op, void *dst, size_t nbytes)
{
    x->recv = 1, x->recv_op = op, x->recv_data = dst, x->recv_want = nbytes;
}

/* x will send a frame of op with nbytes of data. */
static void offer(ptl_xfer *x, const ptl_dist_group *g, uint32_t op, const void *data, size_t nbytes, uint32_t arg)
{
    x->send = 1;
    x->send_hdr = (ptl_frame){PTL_FRAME_MAGIC, op, g->seq, nbytes, arg, 0};
    x->send_data = data;
    x->sent = 0;
}

/* Rank 0 sends the same frame to every peer. */
static int send_all(ptl_dist_group *g, ptl_xfer *x, uint32_t op, const void *data, size_t nbytes, uint32_t arg,
                    const char *what, double deadline, const ptl_dist_poll *watch)
{
    for (int r = 1; r < g->world; r++) {
        int peer = x[r - 1].peer;
        memset(&x[r - 1], 0, sizeof x[r - 1]);
        x[r - 1].peer = peer;
        offer(&x[r - 1], g, op, data, nbytes, arg);
    }
    return ptl_dist_exchange(g, x, g->world - 1, what, deadline, watch);
}

int ptl_dist_barrier(ptl_dist_group *g, const ptl_dist_poll *watch)
{
    double deadline;
    if (begin(g, "barrier", &deadline) != 0)
        return -1;
    int rc = 0;
    if (g->world > 1 && g->rank == 0) {
        ptl_xfer *x = peers_new(g);
        if (!x)
            return -1;
        for (int r = 1; r < g->world; r++)
            expect(&x[r - 1], OP_BARRIER, NULL, 0);
        rc = ptl_dist_exchange(g, x, g->world - 1, "barrier", deadline, watch);
        if (rc == 0)
            rc = send_all(g, x, OP_BARRIER, NULL, 0, 0, "barrier", deadline, watch);
        free(x);
    } else if (g->world > 1) {
        ptl_xfer x = {0};
        expect(&x, OP_BARRIER, NULL, 0);
        offer(&x, g, OP_BARRIER, NULL, 0, 0);
        rc = ptl_dist_exchange(g, &x, 1, "barrier", deadline, watch);
    }
    if (rc == 0)
        g->seq++;
    return rc;
}

static void add_in_rank_order(void *acc, const void *in, int64_t count, ptl_dtype dt)
{
    if (dt == PTL_FLOAT32) {
        float *a = acc;
        const float *b = in;
        for (int64_t i = 0; i < count; i++)
            a[i] += b[i];
    } else {
        double *a = acc;
        const double *b = in;
        for (int64_t i = 0; i < count; i++)
            a[i] += b[i];
    }
}

int ptl_dist_all_reduce_sum(ptl_dist_group *g, void *buf, int64_t count, ptl_dtype dt, const ptl_dist_poll *watch)
{
    if (dt != PTL_FLOAT32 && dt != PTL_FLOAT64)
        return ptl_set_error(PTL_ERR_VALUE, "all_reduce: float32 or float64 buffers only, got %s", ptl_dtype_name(dt));
    if (count < 0 || (count > 0 && !buf))
        return ptl_set_error(PTL_ERR_VALUE, "all_reduce: bad buffer (%lld elements)", (long long)count);
    double deadline;
    if (begin(g, "all_reduce", &deadline) != 0)
        return -1;
    size_t nbytes = (size_t)count * ptl_dtype_size(dt);
    int rc = 0;
    if (g->world > 1 && g->rank == 0) {
        size_t need = nbytes * (size_t)(g->world - 1);
        if (need > g->scratch_cap) {
            void *p = realloc(g->scratch, need);
            if (!p)
                return ptl_dist_fail(g, "out of host memory for the all_reduce buffers");
            g->scratch = p, g->scratch_cap = need;
        }
        ptl_xfer *x = peers_new(g);
        if (!x)
            return -1;
        for (int r = 1; r < g->world; r++) {
            expect(&x[r - 1], OP_REDUCE, (char *)g->scratch + nbytes * (size_t)(r - 1), nbytes);
            x[r - 1].check_arg = 1, x[r - 1].recv_arg = (uint32_t)dt;
        }
        rc = ptl_dist_exchange(g, x, g->world - 1, "all_reduce", deadline, watch);
        if (rc == 0) {
            for (int r = 1; r < g->world; r++)
                add_in_rank_order(buf, (char *)g->scratch + nbytes * (size_t)(r - 1), count, dt);
            rc = send_all(g, x, OP_REDUCE, buf, nbytes, (uint32_t)dt, "all_reduce", deadline, watch);
        }
        free(x);
    } else if (g->world > 1) {
        /* the sum arrives only after rank 0 has all of this buffer, so it may land in place */
        ptl_xfer x = {0};
        expect(&x, OP_REDUCE, buf, nbytes);
        x.check_arg = 1, x.recv_arg = (uint32_t)dt;
        offer(&x, g, OP_REDUCE, buf, nbytes, (uint32_t)dt);
        rc = ptl_dist_exchange(g, &x, 1, "all_reduce", deadline, watch);
    }
    if (rc == 0)
        g->seq++;
    return rc;
}

int ptl_dist_broadcast(ptl_dist_group *g, void *buf, size_t nbytes, const ptl_dist_poll *watch)
{
    if (nbytes > 0 && !buf)
        return ptl_set_error(PTL_ERR_VALUE, "broadcast: no buffer for %zu bytes", nbytes);
    double deadline;
    if (begin(g, "broadcast", &deadline) != 0)
        return -1;
    int rc = 0;
    if (g->world > 1 && g->rank == 0) {
        ptl_xfer *x = peers_new(g);
        if (!x)
            return -1;
        rc = send_all(g, x, OP_BCAST, buf, nbytes, 0, "broadcast", deadline, watch);
        free(x);
    } else if (g->world > 1) {
        ptl_xfer x = {0};
        expect(&x, OP_BCAST, buf, nbytes);
        rc = ptl_dist_exchange(g, &x, 1, "broadcast", deadline, watch);
    }
    if (rc == 0)
        g->seq++;
    return rc;
}

int ptl_dist_broadcast_bytes(ptl_dist_group *g, const void *data, size_t nbytes, void **out, size_t *out_n,
                             const ptl_dist_poll *watch)
{
    *out = NULL, *out_n = 0;
    if (g->rank == 0 && nbytes > 0 && !data)
        return ptl_set_error(PTL_ERR_VALUE, "broadcast: no data for %zu bytes", nbytes);
    double deadline;
    if (begin(g, "broadcast", &deadline) != 0)
        return -1;
    int rc = 0;
    if (g->rank == 0) {
        void *copy = malloc(nbytes ? nbytes : 1);
        if (!copy)
            return ptl_dist_fail(g, "out of host memory");
        if (nbytes)
            memcpy(copy, data, nbytes);
        ptl_xfer *x = g->world > 1 ? peers_new(g) : NULL;
        if (g->world > 1 && !x) {
            free(copy);
            return -1;
        }
        if (x)
            rc = send_all(g, x, OP_BCAST, copy, nbytes, 0, "broadcast", deadline, watch);
        free(x);
        if (rc != 0) {
            free(copy);
            return -1;
        }
        *out = copy, *out_n = nbytes;
    } else {
        ptl_xfer x = {0};
        expect(&x, OP_BCAST, NULL, 0);
        x.recv_alloc = 1;
        if ((rc = ptl_dist_exchange(g, &x, 1, "broadcast", deadline, watch)) != 0)
            return -1;
        *out = x.recv_data, *out_n = (size_t)x.recv_hdr.nbytes;
    }
    g->seq++;
    return 0;
}

/* Rank 0's half of a gather: receives a frame of op from every peer and lays the blobs out in rank order,
 * its own `data` first, after `head` free bytes of a new *blob of *total bytes; sizes[r]: rank r's bytes.
 * *px: the peers' transfers (NULL in a world of one), kept for an answer; the caller frees them. */
static int collect_at_root(ptl_dist_group *g, uint32_t op, const char *what, const void *data, size_t nbytes,
                           size_t head, double deadline, const ptl_dist_poll *watch, ptl_xfer **px, char **blob,
                           size_t *total, size_t *sizes)
{
    *blob = NULL;
    ptl_xfer *x = *px = g->world > 1 ? peers_new(g) : NULL;
    if (g->world > 1 && !x)
        return -1;
    for (int r = 1; r < g->world; r++) {
        expect(&x[r - 1], op, NULL, 0);
        x[r - 1].recv_alloc = 1;
    }
    if (x && ptl_dist_exchange(g, x, g->world - 1, what, deadline, watch) != 0)
        return -1;
    *total = head;
    for (int r = 0; r < g->world; r++)
        *total += sizes[r] = r == 0 ? nbytes : (size_t)x[r - 1].recv_hdr.nbytes;
    char *b = *blob = malloc(*total ? *total : 1);
    for (size_t r = 0, off = head; b && r < (size_t)g->world; off += sizes[r++])
        if (sizes[r])
            memcpy(b + off, r == 0 ? data : x[r - 1].recv_data, sizes[r]);
    for (int r = 1; r < g->world; r++)
        free(x[r - 1].recv_data);
    if (b)
        return 0;
    char msg[64];
    snprintf(msg, sizeof msg, "out of host memory for the %s result", what);
    return ptl_dist_fail(g, msg);
}

/* The all-gather result travels as a table of world sizes (uint64) followed by the blobs in rank order. */
static int unpack_gather(ptl_dist_group *g, void *blob, size_t n, size_t *sizes)
{
    size_t table = sizeof(uint64_t) * (size_t)g->world, total = table;
    if (n < table)
        return ptl_dist_fail(g, "rank 0 sent a malformed all_gather result");
    for (int r = 0; r < g->world; r++) {
        uint64_t s;
        memcpy(&s, (char *)blob + sizeof s * (size_t)r, sizeof s);
        sizes[r] = (size_t)s;
        total += (size_t)s;
    }
    if (total != n)
        return ptl_dist_fail(g, "rank 0 sent a malformed all_gather result");
    memmove(blob, (char *)blob + table, n - table);
    return 0;
}

int ptl_dist_all_gather(ptl_dist_group *g, const void *data, size_t nbytes, void **out, size_t *sizes,
                        const ptl_dist_poll *watch)
{
    *out = NULL;
    if (nbytes > 0 && !data)
        return ptl_set_error(PTL_ERR_VALUE, "all_gather: no data for %zu bytes", nbytes);
    double deadline;
    if (begin(g, "all_gather", &deadline) != 0)
        return -1;
    if (g->rank == 0) {
        const size_t table = sizeof(uint64_t) * (size_t)g->world;
        ptl_xfer *x;
        char *blob;
        size_t total;
        int rc = collect_at_root(g, OP_GATHER, "all_gather", data, nbytes, table, deadline, watch, &x, &blob, &total,
                                 sizes);
        for (int r = 0; rc == 0 && r < g->world; r++) {
            const uint64_t s = sizes[r];
            memcpy(blob + sizeof s * (size_t)r, &s, sizeof s);
        }
        if (rc == 0 && x)
            rc = send_all(g, x, OP_GATHER, blob, total, 0, "all_gather", deadline, watch);
        free(x);
        if (rc != 0 || unpack_gather(g, blob, total, sizes) != 0) {
            free(blob);
            return -1;
        }
        *out = blob;
    } else {
        ptl_xfer x = {0};
        expect(&x, OP_GATHER, NULL, 0);
        x.recv_alloc = 1;
        offer(&x, g, OP_GATHER, data, nbytes, 0);
        if (ptl_dist_exchange(g, &x, 1, "all_gather", deadline, watch) != 0)
            return -1;
        if (unpack_gather(g, x.recv_data, (size_t)x.recv_hdr.nbytes, sizes) != 0) {
            free(x.recv_data);
            return -1;
        }
        *out = x.recv_data;
    }
    g->seq++;
    return 0;
}

int ptl_dist_gather(ptl_dist_group *g, const void *data, size_t nbytes, void **out, size_t *sizes,
                    const ptl_dist_poll *watch)
{
    *out = NULL;
    if (nbytes > 0 && !data)
        return ptl_set_error(PTL_ERR_VALUE, "gather: no data for %zu bytes", nbytes);
    double deadline;
    if (begin(g, "gather", &deadline) != 0)
        return -1;
    if (g->rank == 0) {
        ptl_xfer *x;
        char *blob;
        size_t total;
        const int rc = collect_at_root(g, OP_GATHER_ROOT, "gather", data, nbytes, 0, deadline, watch, &x, &blob,
                                       &total, sizes);
        free(x);
        if (rc != 0)
            return -1;
        *out = blob;
    } else {
        ptl_xfer x = {0};
        offer(&x, g, OP_GATHER_ROOT, data, nbytes, 0);
        if (ptl_dist_exchange(g, &x, 1, "gather", deadline, watch) != 0)
            return -1;
    }
    g->seq++;
    return 0;
}

void ptl_dist_abort(ptl_dist_group *g, const char *reason)
{
    char msg[PTL_DIST_MSG];
    snprintf(msg, sizeof msg, "rank %d (%s) failed: %s", g->rank, g->who[g->rank], reason ? reason : "(no reason)");
    ptl_dist_fail(g, msg);
}
