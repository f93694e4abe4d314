/* The per-device cache of convolution plans (see ptl_conv2d_plan_acquire in conv2d.h). Making a plan asks
 * cuDNN's legacy heuristics for three directions, 6-9 ms per convolution on cuDNN 9 (0.1 s per yolo26n
 * shape at batch 8, 640, 5 s before the depthwise ones left cuDNN: benchmarks/validation.py). Validation's
 * rectangular batches and a fit's partial last batch revisit the same few shapes every epoch, and
 * every network of a process needs the same plans, so a plan is made once per key per process. Keyed by the whole descriptor, dtype and options: the heuristics are a function of these, so
 * a cached plan is the plan a fresh query would make. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "conv2d.h"
#include "device.h"

/* unreferenced plans kept for later (about 15 yolo26n shapes' worth); beyond it the oldest go */
#define KEEP_UNUSED 1024

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
} plan_cache;

static void cache_destroy(void *p)
{
    plan_cache *c = p;
    for (int i = 0; i < c->n; i++)
        ptl_conv2d_plan_destroy(c->e[i].plan); /* plans a network still holds live on until it drops them */
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

int ptl_conv2d_plan_acquire(ptl_cuda_ctx *ctx, const ptl_conv2d_desc *d, ptl_dtype dt,
                            const ptl_conv2d_plan_opts *opts, ptl_conv2d_plan **out)
{
    const ptl_conv2d_plan_opts defaults = ptl_conv2d_plan_opts_default();
    const ptl_conv2d_plan_opts *o = opts ? opts : &defaults;
    ptl_ctx_ext *ext = &ctx->ext[PTL_CTX_CONV_PLANS];
    ptl_conv2d_plan *p = NULL;
    int rc = -1;
    *out = NULL;
    pthread_mutex_lock(&ctx->ext_lock);
    if (!ext->ptr) {
        if (!(ext->ptr = calloc(1, sizeof(plan_cache)))) {
            ptl_set_error(PTL_ERR_MEMORY, "conv2d plan cache: out of host memory");
            goto done;
        }
        ext->destroy = cache_destroy;
    }
    plan_cache *c = ext->ptr;
    for (int i = 0; i < c->n; i++)
        if (same_key(&c->e[i], d, dt, o)) {
            c->e[i].last_use = ++c->clock;
            ptl_conv2d_plan_retain(c->e[i].plan);
            *out = c->e[i].plan;
            rc = 0;
            goto done;
        }
    if (c->n == c->cap) {
        const int cap = c->cap ? 2 * c->cap : 64;
        plan_entry *e = realloc(c->e, (size_t)cap * sizeof *e);
        if (!e) {
            ptl_set_error(PTL_ERR_MEMORY, "conv2d plan cache: out of host memory");
            goto done;
        }
        c->e = e;
        c->cap = cap;
    }
    if (ptl_conv2d_plan_create(ctx, d, dt, o, &p))
        goto done;
    c->made++;
    ptl_conv2d_plan_retain(p); /* one reference for the cache, one for the caller */
    c->e[c->n].plan = p;
    c->e[c->n].d = *d;
    c->e[c->n].dt = dt;
    c->e[c->n].o = *o;
    c->e[c->n].last_use = ++c->clock;
    c->n++;
    trim(c);
    *out = p;
    rc = 0;
done:
    pthread_mutex_unlock(&ctx->ext_lock);
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
