/* The side streams (side_stream.h). Its events are recorded and waited on in order from one
 * host thread, so each is reused: a wait takes the event's state at the time of the call (also inside a
 * graph capture, where the wait becomes an edge). */
#include "side_stream.h"

#include <stdlib.h>

#include "../nn/executor.h"

_Static_assert(PTL_CTX_NUM_EXT - PTL_CTX_SIDE_STREAM == PTL_NET_SIDE_STREAMS, "one context slot per side stream");

typedef struct {
    ptl_cuda_ctx ctx; /* first: the side context is the struct's address */
    cudaEvent_t fork, mark[PTL_NET_SIDE_MARKS];
} side_stream;

static void side_destroy(void *p)
{
    side_stream *s = (side_stream *)p;
    ptl_cuda_ctx_close_queue(&s->ctx);
    if (s->fork)
        cudaEventDestroy(s->fork);
    for (int k = 0; k < PTL_NET_SIDE_MARKS; k++)
        if (s->mark[k])
            cudaEventDestroy(s->mark[k]);
    free(s);
}

static int side_create(ptl_cuda_ctx *ctx, side_stream **out)
{
    side_stream *s = (side_stream *)calloc(1, sizeof *s);
    if (!s)
        return ptl_set_error(PTL_ERR_MEMORY, "side stream: out of host memory");
    ptl_cuda_ctx *c = &s->ctx;
    c->rt = ctx->rt;
    c->device = ctx->device;
    c->alloc = ctx->alloc; /* borrowed: it never allocates on a step */
    pthread_mutex_init(&c->staging_lock, NULL);
    pthread_mutex_init(&c->ext_lock, NULL);
    PTL_CHECK(ptl_cuda_ctx_open_queue(c, 0));
    PTL_CUDA_TRY(cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming));
    for (int k = 0; k < PTL_NET_SIDE_MARKS; k++)
        PTL_CUDA_TRY(cudaEventCreateWithFlags(&s->mark[k], cudaEventDisableTiming));
    *out = s;
    return 0;
fail:
    side_destroy(s);
    return -1;
}

int ptl_cuda_side_open(ptl_cuda_ctx *ctx, int k, ptl_cuda_ctx **side)
{
    int rc = 0;
    pthread_mutex_lock(&ctx->ext_lock);
    ptl_ctx_ext *ext = &ctx->ext[PTL_CTX_SIDE_STREAM + k];
    if (!ext->ptr) {
        side_stream *s = NULL;
        rc = side_create(ctx, &s);
        if (rc == 0) {
            ext->ptr = s;
            ext->destroy = side_destroy;
        }
    }
    if (rc == 0)
        *side = &((side_stream *)ext->ptr)->ctx;
    pthread_mutex_unlock(&ctx->ext_lock);
    return rc;
}

/* Side stream k of a context where it was opened (the executor forks only after opening it). */
static side_stream *side_of(ptl_cuda_ctx *ctx, int k) { return (side_stream *)ctx->ext[PTL_CTX_SIDE_STREAM + k].ptr; }

int ptl_cuda_side_fork(ptl_cuda_ctx *ctx, int k, int from)
{
    side_stream *s = side_of(ctx, k);
    PTL_CUDA_TRY(cudaEventRecord(s->fork, from < 0 ? ctx->stream : side_of(ctx, from)->ctx.stream));
    PTL_CUDA_TRY(cudaStreamWaitEvent(s->ctx.stream, s->fork, 0));
    return 0;
fail:
    return -1;
}

int ptl_cuda_side_mark(ptl_cuda_ctx *ctx, int k, int m)
{
    side_stream *s = side_of(ctx, k);
    PTL_CUDA_TRY(cudaEventRecord(s->mark[m], s->ctx.stream));
    return 0;
fail:
    return -1;
}

int ptl_cuda_side_await(ptl_cuda_ctx *ctx, int k, int m, int to)
{
    side_stream *s = side_of(ctx, k);
    PTL_CUDA_TRY(cudaStreamWaitEvent(to < 0 ? ctx->stream : side_of(ctx, to)->ctx.stream, s->mark[m], 0));
    return 0;
fail:
    return -1;
}
