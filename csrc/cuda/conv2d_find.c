/* The timed search of conv plans (conv2d_find.h). */
#include "conv2d_find.h"
#include "device.h"

#define MAX_CANDIDATES 64

int ptl_conv_find_buffers_alloc(ptl_cuda_ctx *ctx, const ptl_conv2d_desc *d, ptl_dtype dt, size_t workspace,
                                ptl_conv_find_buffers *b)
{
    const size_t es = ptl_dtype_size(dt);
    const size_t bytes[4] = {(size_t)d->n * d->h * d->w * d->cin * es,
                             (size_t)d->cout * d->k * d->k * (d->cin / d->groups) * es,
                             (size_t)d->n * d->ho * d->wo * d->cout * es, workspace};
    *b = (ptl_conv_find_buffers){{NULL}, {NULL}, workspace, 0};
    const int pool = ptl_alloc_pool_create(ctx->alloc);
    if (pool < 0)
        return -1;
    b->pool = pool;
    for (int i = 0; i < 4; i++) {
        PTL_CHECK(ptl_alloc_malloc(ctx->alloc, b->pool, bytes[i], &b->buf[i], &b->blk[i]));
        if (bytes[i])
            PTL_CUDA_TRY(cudaMemsetAsync(b->buf[i], 0x3c, bytes[i], ctx->stream)); /* ~0.01 (bf16/f32), ~1 (f16) */
    }
    return 0;
fail:
    ptl_conv_find_buffers_free(ctx, b);
    return -1;
}

void ptl_conv_find_buffers_free(ptl_cuda_ctx *ctx, ptl_conv_find_buffers *b)
{
    for (int i = 0; i < 4; i++)
        if (b->blk[i])
            ptl_alloc_free(ctx->alloc, b->blk[i]);
    if (b->pool)
        (void)ptl_alloc_pool_release(ctx->alloc, b->pool); /* its segments go back now: every block is free */
    *b = (ptl_conv_find_buffers){{NULL}, {NULL}, 0, 0};
}

/* Milliseconds per run of candidate i, or a negative value if it fails. */
static float time_one(ptl_cuda_ctx *ctx, ptl_conv_find_run run, void *arg, int i, const ptl_conv_find_buffers *b)
{
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = -1.0f;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess || run(arg, i, b))
        goto done;
    cudaEventRecord(e0, ctx->stream);
    for (int r = 0; r < 5; r++)
        if (run(arg, i, b))
            goto done;
    cudaEventRecord(e1, ctx->stream);
    if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess)
        ms /= 5.0f;
    else
        ms = -1.0f;
done:
    ptl_error_clear(); /* a candidate that fails is passed over, not reported */
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    cudaGetLastError();
    return ms;
}

int ptl_conv_find_fastest(ptl_cuda_ctx *ctx, int n, ptl_conv_find_run run, void *arg, const ptl_conv_find_buffers *b)
{
    float t[MAX_CANDIDATES];
    int best = -1;
    if (n > MAX_CANDIDATES)
        n = MAX_CANDIDATES;
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < n; i++) {
            const float ti = time_one(ctx, run, arg, i, b);
            if (round == 0 || t[i] < 0.0f || (ti >= 0.0f && ti < t[i]))
                t[i] = ti;
        }
    for (int i = 0; i < n; i++)
        if (t[i] >= 0.0f && (best < 0 || t[i] < t[best]))
            best = i;
    return best;
}
