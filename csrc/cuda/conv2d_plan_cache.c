/* The per-device cache of convolution plans (see ptl_conv2d_plans_acquire in conv2d.h). Making a plan asks
 * cuDNN's heuristics for three directions, about 2 ms per convolution on cuDNN 9 (yolo26n has 57 cuDNN
 * convolutions). Validation's rectangular batches and a fit's partial last batch revisit the same few
 * shapes every epoch, and every network of a process needs the same plans, so a plan is made once per key
 * per process. Keyed by the whole descriptor, dtype and options: the heuristics are a function of these, so
 * a cached plan is the plan a fresh query would make, whichever thread and handle made it. A shape's
 * missing plans are made concurrently (the queries are host work): a new validation shape at batch 8 took
 * 127-137 ms on one thread and takes 22-29 ms on an H200 host's 16 (benchmarks/RESULTS.md). Each thread
 * queries through a cuDNN handle of its own, which the cache keeps for later shapes, and warms the plans it
 * makes (ptl_conv2d_plan_warm) on a stream of its own, so that a step's first launches load no kernel. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cpu/threads.h"
#include "conv2d.h"
#include "device.h"

/* unreferenced plans kept for later (about 15 yolo26n shapes' worth); beyond it the oldest go */
#define KEEP_UNUSED 1024
/* plan-making threads at most */
#define MAX_MAKERS 16

/* A plan-making thread's own handles and stream (a handle serves one thread at a time); the cuBLAS handle
 * lives for one batch only, as it holds a workspace on the device. */
typedef struct {
    cudnnHandle_t cudnn;
    cublasHandle_t cublas;
    cudaStream_t stream;
} maker_handles;

typedef struct {
    ptl_conv2d_plan *plan;
    ptl_conv2d_desc d;
    ptl_dtype dt;
    ptl_conv2d_plan_opts o;
    uint64_t last_use;
} plan_entry;

typedef struct {
    plan_entry *e;
    int n, cap;
    uint64_t clock;
    int64_t made;
    maker_handles makers[MAX_MAKERS];
} plan_cache;

static void cache_destroy(void *p)
{
    plan_cache *c = p;
    for (int i = 0; i < c->n; i++)
        ptl_conv2d_plan_destroy(c->e[i].plan); /* plans a network still holds live on until it drops them */
    for (int t = 0; t < MAX_MAKERS; t++) {
        maker_handles *m = &c->makers[t];
        if (m->cudnn)
            cudnnDestroy(m->cudnn);
        if (m->cublas)
            cublasDestroy(m->cublas);
        if (m->stream)
            cudaStreamDestroy(m->stream);
    }
    free(c->e);
    free(c);
}

static int same_key(const plan_entry *e, const ptl_conv2d_desc *d, ptl_dtype dt, const ptl_conv2d_plan_opts *o)
{
    return !memcmp(&e->d, d, sizeof *d) && e->dt == dt && e->o.deterministic == o->deterministic &&
           e->o.allow_tf32 == o->allow_tf32 && e->o.find == o->find && e->o.workspace_limit == o->workspace_limit &&
           e->o.legacy_api == o->legacy_api && e->o.forward_only == o->forward_only;
}

/* Drops the least recently used plans nobody else holds while more than KEEP_UNUSED are unheld. */
static void trim(plan_cache *c)
{
    for (;;) {
        int unused = 0, oldest = -1;
        for (int i = 0; i < c->n; i++)
            if (ptl_conv2d_plan_refs(c->e[i].plan) == 1) {
                unused++;
                if (oldest < 0 || c->e[i].last_use < c->e[oldest].last_use)
                    oldest = i;
            }
        if (unused <= KEEP_UNUSED)
            return;
        ptl_conv2d_plan_destroy(c->e[oldest].plan);
        c->e[oldest] = c->e[--c->n];
    }
}

/* The plans one batch makes: job j makes plan[j] for key (d[j], dt, o); threads take jobs in turn. With
 * several threads each warms the plans it makes on its own stream, over data buffers they share (what the
 * warm-up computes is never read, so their races do not matter). */
typedef struct {
    ptl_cuda_ctx *ctx;
    plan_cache *c;
    const ptl_conv2d_desc *const *d;
    ptl_dtype dt;
    const ptl_conv2d_plan_opts *o;
    ptl_conv2d_plan **plan;
    ptl_error_kind *kind; /* a failed job's error, taken from its thread */
    char (*msg)[512];
    int njobs;
    atomic_int next;
    void *data[3]; /* x / dx, w / dw / dbias, y / dy; NULL: no warm-up */
} make_batch;

typedef struct {
    make_batch *b;
    int t;
} maker_arg;

/* Runs plan p's directions once on w's stream (best effort: a plan not warmed loads its kernels at its first
 * step instead). The workspace is the plan's own, never shared with another maker's: an engine may keep
 * counters there that its kernels wait on, and another engine resetting them would hang both. */
static void warm(ptl_cuda_ctx *w, const ptl_conv2d_plan *p, void *const data[3])
{
    const size_t bytes = ptl_conv2d_plan_workspace(p);
    void *ws = NULL;
    if (bytes && cudaMallocAsync(&ws, bytes, w->stream) != cudaSuccess)
        return;
    (void)ptl_conv2d_plan_warm(w, p, data[0], data[1], data[2], ws, bytes);
    if (ws)
        cudaFreeAsync(ws, w->stream);
}

/* Runs jobs until none is left. w: a maker's context (its handles and stream; the plans are warmed), or
 * NULL for the calling thread on ctx's handle. */
static void make_jobs(make_batch *b, ptl_cuda_ctx *w)
{
    for (int j; (j = atomic_fetch_add(&b->next, 1)) < b->njobs;) {
        cudnnHandle_t h = w ? w->cudnn : b->ctx->cudnn;
        if (!ptl_conv2d_plan_create(b->ctx, h, b->d[j], b->dt, b->o, &b->plan[j])) {
            if (w && b->data[0])
                warm(w, b->plan[j], b->data);
            continue;
        }
        b->plan[j] = NULL;
        b->kind[j] = ptl_error_kind_get();
        snprintf(b->msg[j], sizeof b->msg[j], "%s", ptl_error_message());
    }
}

/* Creates what a maker lacks on `device`; 0, or -1 when something could not be made. */
static int maker_ready(maker_handles *m, int device)
{
    if (cudaSetDevice(device) != cudaSuccess)
        return -1;
    if (!m->stream && cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking) != cudaSuccess)
        m->stream = NULL;
    if (m->stream && !m->cudnn &&
        (cudnnCreate(&m->cudnn) != CUDNN_STATUS_SUCCESS || cudnnSetStream(m->cudnn, m->stream) != CUDNN_STATUS_SUCCESS)) {
        if (m->cudnn)
            cudnnDestroy(m->cudnn);
        m->cudnn = NULL;
    }
    if (m->stream && !m->cublas &&
        (cublasCreate(&m->cublas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(m->cublas, m->stream) != CUBLAS_STATUS_SUCCESS)) {
        if (m->cublas)
            cublasDestroy(m->cublas);
        m->cublas = NULL;
    }
    return m->stream && m->cudnn && m->cublas ? 0 : -1;
}

/* A maker whose handles cannot be made takes no job: the caller makes those left after the join. */
static void *maker(void *arg)
{
    const maker_arg *a = arg;
    make_batch *b = a->b;
    maker_handles *m = &b->c->makers[a->t];
    if (maker_ready(m, b->ctx->device)) {
        cudaGetLastError();
        return NULL;
    }
    ptl_cuda_ctx w = *b->ctx; /* ctx with this thread's handles and stream */
    w.stream = m->stream;
    w.cudnn = m->cudnn;
    w.cublas = m->cublas;
    make_jobs(b, &w);
    cudaStreamSynchronize(m->stream); /* the warm-ups are done with the buffers */
    cudaGetLastError();               /* a failed warm-up is no error of the batch */
    cublasDestroy(m->cublas);         /* and its GEMM workspace: cuBLAS's algorithm choices stay cached */
    m->cublas = NULL;
    return NULL;
}

/* Data buffers for the warm-ups of b's jobs (NULL when the device has no room: no warm-up). */
static void data_alloc(make_batch *b)
{
    const size_t esz = ptl_dtype_size(b->dt);
    size_t sz[3] = {0, 0, 0};
    for (int j = 0; j < b->njobs; j++) {
        const ptl_conv2d_desc *d = b->d[j];
        const size_t x = (size_t)d->n * d->h * d->w * d->cin, y = (size_t)d->n * d->ho * d->wo * d->cout;
        size_t w = (size_t)d->cout * d->k * d->k * (d->cin / d->groups);
        w = w > (size_t)d->cout ? w : (size_t)d->cout;
        sz[0] = x * esz > sz[0] ? x * esz : sz[0];
        sz[1] = w * esz > sz[1] ? w * esz : sz[1];
        sz[2] = y * esz > sz[2] ? y * esz : sz[2];
    }
    for (int i = 0; i < 3; i++)
        if (cudaMalloc(&b->data[i], sz[i]) != cudaSuccess) {
            cudaGetLastError();
            b->data[i] = NULL;
        }
    if (!b->data[0] || !b->data[1] || !b->data[2])
        for (int i = 0; i < 3; i++) {
            cudaFree(b->data[i]);
            b->data[i] = NULL;
        }
}

/* Makes b's jobs: on the calling thread alone (threads 1), else on `threads` makers while the caller waits
 * (and then makes what they left). 0, or -1 with the first failed job's error. */
static int make_all(make_batch *b, int threads)
{
    pthread_t th[MAX_MAKERS];
    maker_arg args[MAX_MAKERS];
    int started = 0;
    if (threads > 1 && cudaSetDevice(b->ctx->device) == cudaSuccess) {
        data_alloc(b);
        for (; started < threads; started++) {
            args[started] = (maker_arg){b, started};
            if (pthread_create(&th[started], NULL, maker, &args[started]) != 0)
                break; /* fewer threads: the jobs still all run */
        }
    }
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    for (int i = 0; i < 3; i++)
        cudaFree(b->data[i]);
    make_jobs(b, NULL); /* what no maker took: all of it with one thread or no maker */
    for (int j = 0; j < b->njobs; j++)
        if (!b->plan[j]) {
            ptl_set_error(b->kind[j], "%s", b->msg[j]);
            return -1;
        }
    return 0;
}

static int find_key(const plan_cache *c, const ptl_conv2d_desc *d, ptl_dtype dt, const ptl_conv2d_plan_opts *o)
{
    for (int i = 0; i < c->n; i++)
        if (same_key(&c->e[i], d, dt, o))
            return i;
    return -1;
}

int ptl_conv2d_plans_acquire(ptl_cuda_ctx *ctx, int n, const ptl_conv2d_desc *d, ptl_dtype dt,
                             const ptl_conv2d_plan_opts *opts, ptl_conv2d_plan **out)
{
    const ptl_conv2d_plan_opts defaults = ptl_conv2d_plan_opts_default();
    const ptl_conv2d_plan_opts *o = opts ? opts : &defaults;
    ptl_ctx_ext *ext = &ctx->ext[PTL_CTX_CONV_PLANS];
    make_batch b;
    memset(&b, 0, sizeof b);
    int rc = -1;
    for (int i = 0; i < n; i++)
        out[i] = NULL;
    if (n <= 0)
        return 0;
    /* the cache's lock is held throughout: one batch at a time uses the makers' handles */
    pthread_mutex_lock(&ctx->ext_lock);
    if (!ext->ptr) {
        if (!(ext->ptr = calloc(1, sizeof(plan_cache)))) {
            ptl_set_error(PTL_ERR_MEMORY, "conv2d plan cache: out of host memory");
            goto done;
        }
        ext->destroy = cache_destroy;
    }
    plan_cache *c = ext->ptr;
    if (c->cap - c->n < n) {
        const int cap = c->n + n > 2 * c->cap ? c->n + n : 2 * c->cap;
        plan_entry *e = realloc(c->e, (size_t)cap * sizeof *e);
        if (!e) {
            ptl_set_error(PTL_ERR_MEMORY, "conv2d plan cache: out of host memory");
            goto done;
        }
        c->e = e;
        c->cap = cap;
    }
    /* the keys the cache lacks, each once (a network repeats shapes) */
    const ptl_conv2d_desc **jobs = malloc((size_t)n * sizeof *jobs);
    b.plan = calloc((size_t)n, sizeof *b.plan);
    b.kind = calloc((size_t)n, sizeof *b.kind);
    b.msg = calloc((size_t)n, sizeof *b.msg);
    if (!jobs || !b.plan || !b.kind || !b.msg) {
        ptl_set_error(PTL_ERR_MEMORY, "conv2d plan cache: out of host memory");
        free(jobs);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        int dup = find_key(c, &d[i], dt, o) >= 0;
        for (int j = 0; j < b.njobs && !dup; j++)
            dup = !memcmp(jobs[j], &d[i], sizeof d[i]);
        if (!dup)
            jobs[b.njobs++] = &d[i];
    }
    b.ctx = ctx;
    b.c = c;
    b.d = jobs;
    b.dt = dt;
    b.o = o;
    atomic_init(&b.next, 0);
    int threads = o->find ? 1 : ptl_cpu_threads();
    threads = threads < b.njobs ? threads : b.njobs;
    threads = threads < MAX_MAKERS ? threads : MAX_MAKERS;
    if (make_all(&b, threads)) {
        for (int j = 0; j < b.njobs; j++)
            ptl_conv2d_plan_destroy(b.plan[j]);
        free(jobs);
        goto done;
    }
    for (int j = 0; j < b.njobs; j++) { /* into the cache in the callers' order */
        plan_entry *e = &c->e[c->n++];
        e->plan = b.plan[j];
        e->d = *jobs[j];
        e->dt = dt;
        e->o = *o;
        c->made++;
    }
    free(jobs);
    for (int i = 0; i < n; i++) {
        plan_entry *e = &c->e[find_key(c, &d[i], dt, o)];
        e->last_use = ++c->clock;
        ptl_conv2d_plan_retain(e->plan);
        out[i] = e->plan;
    }
    trim(c);
    rc = 0;
done:
    pthread_mutex_unlock(&ctx->ext_lock);
    free(b.plan);
    free(b.kind);
    free(b.msg);
    return rc;
}

void ptl_conv2d_plan_cache_stats(ptl_cuda_ctx *ctx, int64_t *held, int64_t *made)
{
    pthread_mutex_lock(&ctx->ext_lock);
    const plan_cache *c = ctx->ext[PTL_CTX_CONV_PLANS].ptr;
    *held = c ? c->n : 0;
    *made = c ? c->made : 0;
    pthread_mutex_unlock(&ctx->ext_lock);
}
