/* NCCL communicators with deadlines and a watchdog (nccl_comm.h). */
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "dynload.h"
#include "nccl_comm.h"

#define WATCHDOG_PERIOD_MS 100
#define SETTLE_SLEEP_NS 1000000L /* while a non-blocking call finishes on the host */

_Static_assert(sizeof(ncclUniqueId) == PTL_NCCL_ID_BYTES, "ncclUniqueId size");

struct ptl_nccl_comm {
    ncclComm_t comm;       /* NULL once aborted */
    ptl_cuda_ctx *ctx;
    int device, rank, world;
    double timeout_s;
    cudaEvent_t done;      /* recorded after the last watched collective */
    pthread_mutex_t mu;    /* comm, the event and the fields below, between the caller and the watchdog */
    pthread_cond_t wake;
    pthread_t watchdog;
    int has_watchdog, stop;
    int watching;          /* a collective is pending since `since` */
    double since;
    const ptl_dist_poll *watch; /* during creation: may stop the wait */
    int64_t counts[3];     /* collectives queued directly, collectives captured, replays watched */
    char why[512];         /* set once aborted */
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int nccl_fail(ncclComm_t comm, const char *call, ncclResult_t st)
{
    const char *last = comm ? ncclGetLastError(comm) : NULL;
    return ptl_set_error(PTL_ERR_CUDA, "%s failed: %s%s%s", call, ncclGetErrorString(st), last && last[0] ? ": " : "",
                         last ? last : "");
}

/* Aborts with c->mu held: NCCL's kernels end and the communicator is gone. */
static void abort_locked(ptl_nccl_comm *c, const char *why)
{
    if (!c->comm)
        return;
    snprintf(c->why, sizeof c->why, "%s", why);
    ncclCommAbort(c->comm);
    c->comm = NULL;
    c->watching = 0;
}

void ptl_nccl_abort(ptl_nccl_comm *c, const char *why)
{
    pthread_mutex_lock(&c->mu);
    abort_locked(c, why);
    pthread_mutex_unlock(&c->mu);
}

static int aborted_error(ptl_nccl_comm *c, const char *what)
{
    return ptl_set_error(PTL_ERR_CUDA, "%s on rank %d: the NCCL communicator was aborted: %s", what, c->rank, c->why);
}

/* A non-blocking call returned ncclInProgress: waits (mu not held) until NCCL has finished it on the host,
 * at most the timeout, else aborts. */
static ncclResult_t settle(ptl_nccl_comm *c, const char *call)
{
    double deadline = now_s() + c->timeout_s, next_check = now_s();
    ncclResult_t st = ncclInProgress;
    while (1) {
        char stop[256];
        if (c->watch && now_s() >= next_check) {
            next_check = now_s() + PTL_DIST_POLL_MS * 1e-3;
            if (ptl_dist_stopped(c->watch, stop, sizeof stop)) {
                char why[400];
                snprintf(why, sizeof why, "%s was stopped: %s", call, stop);
                ptl_nccl_abort(c, why);
            }
        }
        pthread_mutex_lock(&c->mu);
        if (!c->comm) {
            pthread_mutex_unlock(&c->mu);
            return ncclInvalidUsage;
        }
        ncclResult_t q = ncclCommGetAsyncError(c->comm, &st);
        if (q != ncclSuccess)
            st = q;
        if (st == ncclInProgress && now_s() >= deadline) {
            char why[256];
            snprintf(why, sizeof why, "%s did not complete within %g s: a rank did not join or is stuck", call,
                     c->timeout_s);
            abort_locked(c, why);
        }
        pthread_mutex_unlock(&c->mu);
        if (st != ncclInProgress || !c->comm)
            return st;
        nanosleep(&(struct timespec){0, SETTLE_SLEEP_NS}, NULL);
    }
}

/* Checks one NCCL call's status (settling ncclInProgress); jumps to fail with the error set. */
#define NCCL_CALL(c, name, expr)                                                      \
    do {                                                                              \
        ncclResult_t st_ = (expr);                                                    \
        if (st_ == ncclInProgress)                                                    \
            st_ = settle((c), name);                                                  \
        if (st_ != ncclSuccess) {                                                     \
            if (!(c)->comm)                                                           \
                aborted_error((c), name);                                             \
            else                                                                      \
                nccl_fail((c)->comm, name, st_);                                      \
            goto fail;                                                                \
        }                                                                             \
    } while (0)

static void *watchdog_main(void *arg)
{
    ptl_nccl_comm *c = arg;
    cudaSetDevice(c->device); /* the event belongs to this device's context */
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += WATCHDOG_PERIOD_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L)
            until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&c->wake, &c->mu, &until);
        if (c->stop || !c->comm)
            continue;
        ncclResult_t st = ncclSuccess;
        char why[512];
        if (ncclCommGetAsyncError(c->comm, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress) {
            const char *last = ncclGetLastError(c->comm);
            snprintf(why, sizeof why, "NCCL reported %s%s%s", ncclGetErrorString(st), last && last[0] ? ": " : "",
                     last ? last : "");
            abort_locked(c, why);
        } else if (c->watching) {
            cudaError_t e = cudaEventQuery(c->done);
            if (e == cudaSuccess) {
                c->watching = 0;
            } else if (e != cudaErrorNotReady) {
                snprintf(why, sizeof why, "waiting for a collective failed: %s", cudaGetErrorString(e));
                abort_locked(c, why);
            } else if (now_s() - c->since > c->timeout_s) {
                snprintf(why, sizeof why, "a collective has been pending for more than %g s on rank %d of %d: a rank "
                         "is stuck or gone", c->timeout_s, c->rank, c->world);
                abort_locked(c, why);
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int ptl_nccl_version(int *version)
{
    *version = 0;
    if (ptl_nccl_library_load() != 0)
        return -1;
    ncclResult_t st = ncclGetVersion(version);
    if (st != ncclSuccess)
        return nccl_fail(NULL, "ncclGetVersion", st);
    return 0;
}

static int check_version(void)
{
    int v;
    if (ptl_nccl_version(&v) != 0)
        return -1;
    if (v < PTL_NCCL_MIN_VERSION)
        return ptl_set_error(PTL_ERR_CUDA, "NCCL %d.%d at %s is too old: ptl needs %d.%d or newer (pip install -U "
                             "nvidia-nccl-cu13)", v / 10000, v / 100 % 100, ptl_nccl_library_path(),
                             PTL_NCCL_MIN_VERSION / 10000, PTL_NCCL_MIN_VERSION / 100 % 100);
    return 0;
}

int ptl_nccl_unique_id(uint8_t id[PTL_NCCL_ID_BYTES])
{
    ncclUniqueId uid;
    if (check_version() != 0)
        return -1;
    ncclResult_t st = ncclGetUniqueId(&uid);
    if (st != ncclSuccess)
        return nccl_fail(NULL, "ncclGetUniqueId", st);
    memcpy(id, &uid, sizeof uid);
    return 0;
}

int ptl_nccl_comm_create(ptl_runtime *rt, int device, const uint8_t id[PTL_NCCL_ID_BYTES], int world, int rank,
                         double timeout_s, const ptl_dist_poll *watch, ptl_nccl_comm **out)
{
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world || !(timeout_s > 0))
        return ptl_set_error(PTL_ERR_VALUE, "NCCL communicator: rank %d of world %d, timeout %g s: need 0 <= rank < "
                             "world and a timeout > 0", rank, world, timeout_s);
    if (check_version() != 0)
        return -1;
    ptl_nccl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->wake, NULL);
    c->device = device, c->rank = rank, c->world = world, c->timeout_s = timeout_s;
    PTL_CHECK(ptl_cuda_ctx_get(rt, device, &c->ctx)); /* also makes `device` current */
    PTL_CUDA_TRY(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming));
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0; /* init and collectives return ncclInProgress instead of blocking the host */
    ncclComm_t comm = NULL;
    ncclResult_t st = ncclCommInitRankConfig(&comm, world, uid, rank, &config);
    if (st != ncclSuccess && st != ncclInProgress) {
        nccl_fail(comm, "ncclCommInitRankConfig", st);
        if (comm)
            ncclCommAbort(comm);
        goto fail;
    }
    c->comm = comm;
    c->watch = watch;
    NCCL_CALL(c, "ncclCommInitRankConfig", st);
    c->watch = NULL;
    if (pthread_create(&c->watchdog, NULL, watchdog_main, c) != 0) {
        ptl_set_error(PTL_ERR_RUNTIME, "cannot start the NCCL watchdog thread");
        goto fail;
    }
    c->has_watchdog = 1;
    *out = c;
    return 0;
fail:
    ptl_nccl_comm_destroy(c);
    return -1;
}

int ptl_nccl_comm_rank(const ptl_nccl_comm *c) { return c->rank; }

int ptl_nccl_comm_world(const ptl_nccl_comm *c) { return c->world; }

struct ptl_cuda_ctx *ptl_nccl_comm_ctx(const ptl_nccl_comm *c) { return c->ctx; }

void ptl_nccl_comm_destroy(ptl_nccl_comm *c)
{
    if (!c)
        return;
    if (c->has_watchdog) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_signal(&c->wake);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->watchdog, NULL);
    }
    if (c->comm) {
        /* finalize flushes pending work; a failure there (a peer gone) ends in an abort */
        ncclResult_t st = ncclCommFinalize(c->comm);
        if (st == ncclInProgress)
            st = settle(c, "ncclCommFinalize");
        if (c->comm && st == ncclSuccess)
            ncclCommDestroy(c->comm);
        else if (c->comm)
            ncclCommAbort(c->comm);
        c->comm = NULL;
    }
    if (c->done) {
        cudaSetDevice(c->device);
        cudaEventDestroy(c->done);
    }
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int nccl_type(ptl_dtype dt, ncclDataType_t *out)
{
    switch (dt) {
    case PTL_FLOAT32: *out = ncclFloat32; return 0;
    case PTL_FLOAT64: *out = ncclFloat64; return 0;
    case PTL_FLOAT16: *out = ncclFloat16; return 0;
    case PTL_BFLOAT16: *out = ncclBfloat16; return 0;
    default: return ptl_set_error(PTL_ERR_VALUE, "NCCL: float buffers only, got %s", ptl_dtype_name(dt));
    }
}

/* Starts the watchdog's clock on what the stream has been given so far (not while it is being captured:
 * the replay is watched, by ptl_nccl_watch), and counts a collective just queued (collective 1) or a
 * replay (0). Called with mu held. */
static int watch_locked(ptl_nccl_comm *c, int collective)
{
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    PTL_CUDA_TRY(cudaStreamIsCapturing(c->ctx->stream, &cap));
    const int capturing = cap != cudaStreamCaptureStatusNone;
    c->counts[collective ? capturing : 2]++;
    if (capturing)
        return 0;
    PTL_CUDA_TRY(cudaEventRecord(c->done, c->ctx->stream));
    if (!c->watching)
        c->since = now_s();
    c->watching = 1;
    return 0;
fail:
    return -1;
}

int ptl_nccl_watch(ptl_nccl_comm *c)
{
    pthread_mutex_lock(&c->mu);
    int rc = c->comm ? watch_locked(c, 0) : aborted_error(c, "ptl_nccl_watch");
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Enqueues one collective (mu held only while NCCL is called), then watches it. */
#define ENQUEUE(c, name, expr)                                                        \
    do {                                                                              \
        pthread_mutex_lock(&(c)->mu);                                                 \
        if (!(c)->comm) {                                                             \
            pthread_mutex_unlock(&(c)->mu);                                           \
            return aborted_error((c), name);                                          \
        }                                                                             \
        ncclResult_t enq_ = (expr);                                                   \
        pthread_mutex_unlock(&(c)->mu);                                               \
        NCCL_CALL((c), name, enq_);                                                   \
        pthread_mutex_lock(&(c)->mu);                                                 \
        int w_ = (c)->comm ? watch_locked(c, 1) : aborted_error((c), name);           \
        pthread_mutex_unlock(&(c)->mu);                                               \
        return w_;                                                                    \
    } while (0)

int ptl_nccl_all_reduce_sum(ptl_nccl_comm *c, void *buf, int64_t count, ptl_dtype dt)
{
    ncclDataType_t t;
    if (count < 0 || (count > 0 && !buf))
        return ptl_set_error(PTL_ERR_VALUE, "ncclAllReduce: bad buffer (%lld elements)", (long long)count);
    if (nccl_type(dt, &t) != 0)
        return -1;
    ENQUEUE(c, "ncclAllReduce", ncclAllReduce(buf, buf, (size_t)count, t, ncclSum, c->comm, c->ctx->stream));
fail:
    return -1;
}

int ptl_nccl_broadcast(ptl_nccl_comm *c, void *buf, int64_t count, ptl_dtype dt, int root)
{
    ncclDataType_t t;
    if (root < 0 || root >= c->world)
        return ptl_set_error(PTL_ERR_VALUE, "ncclBroadcast: root %d outside 0..%d", root, c->world - 1);
    if (count < 0 || (count > 0 && !buf))
        return ptl_set_error(PTL_ERR_VALUE, "ncclBroadcast: bad buffer (%lld elements)", (long long)count);
    if (nccl_type(dt, &t) != 0)
        return -1;
    ENQUEUE(c, "ncclBroadcast", ncclBroadcast(buf, buf, (size_t)count, t, root, c->comm, c->ctx->stream));
fail:
    return -1;
}

void ptl_nccl_counts(ptl_nccl_comm *c, int64_t counts[3])
{
    pthread_mutex_lock(&c->mu);
    memcpy(counts, c->counts, sizeof c->counts);
    pthread_mutex_unlock(&c->mu);
}

int ptl_nccl_check(ptl_nccl_comm *c)
{
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (!c->comm) {
        rc = aborted_error(c, "NCCL");
    } else {
        ncclResult_t st = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(c->comm, &st);
        if (q != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
            rc = nccl_fail(c->comm, "ncclCommGetAsyncError", q != ncclSuccess ? q : st);
            abort_locked(c, ptl_error_message());
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}
