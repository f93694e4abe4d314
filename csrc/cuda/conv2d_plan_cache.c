/* The per-device cache of convolution plans (see ptl_conv2d_plan_acquire in conv2d.h). Making a plan asks
 * cuDNN's heuristics for three directions, about 2 ms per convolution on cuDNN 9 (yolo26n has 57 cuDNN
 * convolutions). Validation's rectangular batches and a fit's partial last batch revisit the same few
 * shapes every epoch, and every network of a process needs the same plans, so a plan is made once per key
 * per process. Keyed by the whole descriptor, dtype and options: the heuristics are a function of these, so
 * a cached plan is the plan a fresh query would make, whichever thread and handle made it. A shape's
 * missing plans are made concurrently (the queries are host work): a new validation shape at batch 8 took
 * 127-137 ms on one thread and takes 22-29 ms on an H200 host's 16 (benchmarks/RESULTS.md). Each thread
 * but the caller queries through a cuDNN handle of its own, which the cache keeps for later shapes. */
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
/* plan-making threads at most (the calling thread with ctx's handle, the others with the cache's) */
#define MAX_MAKERS 16

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
    cudnnHandle_t makers[MAX_MAKERS]; /* [0] unused: the calling thread queries through ctx's handle */
} plan_cache;

static void cache_destroy(void *p)
{
    plan_cache *c = p;
    for (int i = 0; i < c->n; i++)
        ptl_conv2d_plan_destroy(c->e[i].plan); /* plans a network still holds live on until it drops them */
    for (int t = 1; t < MAX_MAKERS; t++)
        if (c->makers[t])
            cudnnDestroy(c->makers[t]);
    free(c->e);
    free(c);
}

static int same_key(const plan_entry *e, const ptl_conv2d_desc *d, ptl_dtype dt, const ptl_conv2d_plan_opts *o)
{
    return !memcmp(&e->d, d, sizeof *d) && e->dt == dt && e->o.deterministic == o->deterministic &&
           e->o.allow_tf32 == o->allow_tf32 && e->o.find == o->find && e->o.workspace_limit == o->workspace_limit &&
           e->o.legacy_api == o->legacy_api;
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

/* The plans one batch makes: job j makes plan[j] for key (d[j], dt, o); threads take jobs in turn. */
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
} make_batch;

typedef struct {
    make_batch *b;
    int t;
} maker_arg;

static void make_jobs(make_batch *b, cudnnHandle_t h, const char *setup_error)
{
    for (int j; (j = atomic_fetch_add(&b->next, 1)) < b->njobs;) {
        if (!setup_error && !ptl_conv2d_plan_create(b->ctx, h, b->d[j], b->dt, b->o, &b->plan[j]))
            continue;
        b->plan[j] = NULL;
        b->kind[j] = setup_error ? PTL_ERR_RUNTIME : ptl_error_kind_get();
        snprintf(b->msg[j], sizeof b->msg[j], "%s", setup_error ? setup_error : ptl_error_message());
    }
}

static void *maker(void *arg)
{
    const maker_arg *a = arg;
    make_batch *b = a->b;
    cudnnHandle_t *h = &b->c->makers[a->t];
    const char *err = NULL;
    if (cudaSetDevice(b->ctx->device) != cudaSuccess)
        err = "conv2d plans: cudaSetDevice failed in a plan-making thread";
    else if (!*h && cudnnCreate(h) != CUDNN_STATUS_SUCCESS) {
        *h = NULL;
        err = "conv2d plans: cudnnCreate failed in a plan-making thread";
    }
    make_jobs(b, *h, err);
    return NULL;
}

/* Makes b's jobs on up to `threads` threads (the caller is one); 0 or -1 with the first failed job's error. */
static int make_all(make_batch *b, int threads)
{
    pthread_t th[MAX_MAKERS];
    maker_arg args[MAX_MAKERS];
    int started = 0;
    for (int t = 1; t < threads; t++) {
        args[t] = (maker_arg){b, t};
        if (pthread_create(&th[t], NULL, maker, &args[t]) != 0)
            break; /* fewer threads: the jobs still all run */
        started = t;
    }
    make_jobs(b, b->ctx->cudnn, NULL);
    for (int t = 1; t <= started; t++)
        pthread_join(th[t], NULL);
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

int ptl_conv2d_plan_acquire(ptl_cuda_ctx *ctx, const ptl_conv2d_desc *d, ptl_dtype dt,
                            const ptl_conv2d_plan_opts *opts, ptl_conv2d_plan **out)
{
    return ptl_conv2d_plans_acquire(ctx, 1, d, dt, opts, out);
}

void ptl_conv2d_plan_cache_stats(ptl_cuda_ctx *ctx, int64_t *held, int64_t *made)
{
    pthread_mutex_lock(&ctx->ext_lock);
    const plan_cache *c = ctx->ext[PTL_CTX_CONV_PLANS].ptr;
    *held = c ? c->n : 0;
    *made = c ? c->made : 0;
    pthread_mutex_unlock(&ctx->ext_lock);
}
