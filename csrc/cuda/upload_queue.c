/* The upload stream (upload_queue.h). */
#include "upload_queue.h"

#include <stdlib.h>

typedef struct {
    cudaStream_t stream;
    cudaEvent_t copied, read; /* the last copy; the last reader of its destination queued on ctx's stream */
} upload_queue;

static void upload_destroy(void *p)
{
    upload_queue *u = (upload_queue *)p;
    if (u->stream)
        cudaStreamDestroy(u->stream);
    if (u->copied)
        cudaEventDestroy(u->copied);
    if (u->read)
        cudaEventDestroy(u->read);
    free(u);
}

static int upload_create(ptl_cuda_ctx *ctx, upload_queue **out)
{
    upload_queue *u = (upload_queue *)calloc(1, sizeof *u);
    if (!u)
        return ptl_set_error(PTL_ERR_MEMORY, "upload stream: out of host memory");
    PTL_CUDA_TRY(cudaSetDevice(ctx->device));
    PTL_CUDA_TRY(cudaStreamCreateWithFlags(&u->stream, cudaStreamNonBlocking));
    PTL_CUDA_TRY(cudaEventCreateWithFlags(&u->copied, cudaEventDisableTiming));
    PTL_CUDA_TRY(cudaEventCreateWithFlags(&u->read, cudaEventDisableTiming));
    *out = u;
    return 0;
fail:
    upload_destroy(u);
    return -1;
}

int ptl_cuda_upload_open(ptl_cuda_ctx *ctx)
{
    int rc = 0;
    pthread_mutex_lock(&ctx->ext_lock);
    ptl_ctx_ext *ext = &ctx->ext[PTL_CTX_UPLOAD];
    upload_queue *u = NULL;
    if (!ext->ptr && (rc = upload_create(ctx, &u)) == 0) {
        ext->ptr = u;
        ext->destroy = upload_destroy;
    }
    pthread_mutex_unlock(&ctx->ext_lock);
    return rc;
}

int ptl_cuda_upload(ptl_cuda_ctx *ctx, void *dst, const void *src, size_t bytes, cudaStream_t *copy)
{
    upload_queue *u = (upload_queue *)__atomic_load_n(&ctx->ext[PTL_CTX_UPLOAD].ptr, __ATOMIC_ACQUIRE);
    if (!u)
        return ptl_set_error(PTL_ERR_RUNTIME, "upload: the device's upload stream was not made (ptl_cuda_upload_open)");
    /* an event never recorded is complete: the first copy waits for nothing */
    PTL_CUDA_TRY(cudaStreamWaitEvent(u->stream, u->read, 0));
    PTL_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, u->stream));
    PTL_CUDA_TRY(cudaEventRecord(u->copied, u->stream));
    PTL_CUDA_TRY(cudaStreamWaitEvent(ctx->stream, u->copied, 0));
    *copy = u->stream;
    return 0;
fail:
    return -1;
}

int ptl_cuda_upload_read(ptl_cuda_ctx *ctx)
{
    upload_queue *u = (upload_queue *)__atomic_load_n(&ctx->ext[PTL_CTX_UPLOAD].ptr, __ATOMIC_ACQUIRE);
    if (!u)
        return ptl_set_error(PTL_ERR_RUNTIME, "upload: the device's upload stream was not made (ptl_cuda_upload_open)");
    PTL_CUDA_TRY(cudaEventRecord(u->read, ctx->stream));
    return 0;
fail:
    return -1;
}
