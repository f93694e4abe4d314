/* Lazily created per-device contexts, host<->device copies, and CUDA/cuBLAS/cuDNN error reporting. */
#include <stdlib.h>
#include <string.h>

#include "../ops/cast.h"
#include "../runtime_impl.h"
#include "device.h"
#include "dynload.h"

/* The call's name: the text of the call expression up to its opening parenthesis. */
static void call_name(const char *call, char *out, size_t cap)
{
    size_t n = strcspn(call, "(");
    if (n >= cap)
        n = cap - 1;
    memcpy(out, call, n);
    out[n] = 0;
}

int ptl_cuda_fail(const char *call, cudaError_t status)
{
    char name[128];
    call_name(call, name, sizeof name);
    cudaGetLastError(); /* clear the sticky-free error so later calls are not blamed */
    return ptl_set_error(PTL_ERR_CUDA, "%s failed: %s (%s)", name, cudaGetErrorString(status), cudaGetErrorName(status));
}

int ptl_cublas_fail(const char *call, cublasStatus_t status)
{
    char name[128];
    call_name(call, name, sizeof name);
    return ptl_set_error(PTL_ERR_CUDA, "%s failed: %s (%s)", name, cublasGetStatusString(status),
                         cublasGetStatusName(status));
}

cudnnDataType_t ptl_cudnn_data_type(ptl_dtype dt)
{
    return dt == PTL_FLOAT32 ? CUDNN_DATA_FLOAT : dt == PTL_BFLOAT16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

int ptl_cudnn_fail(const char *call, cudnnStatus_t status)
{
    char name[128];
    call_name(call, name, sizeof name);
    return ptl_set_error(PTL_ERR_CUDA, "%s failed: %s", name, cudnnGetErrorString(status));
}

int ptl_cuda_launch_check(const char *kernel)
{
    cudaError_t st = cudaGetLastError();
    if (st == cudaSuccess)
        return 0;
    return ptl_set_error(PTL_ERR_CUDA, "launch of %s failed: %s (%s)", kernel, cudaGetErrorString(st),
                         cudaGetErrorName(st));
}

int ptl_cuda_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > PTL_MAX_DEVICES ? PTL_MAX_DEVICES : n;
}

void ptl_cuda_ctx_destroy(ptl_cuda_ctx *ctx)
{
    if (!ctx)
        return;
    ptl_cuda_ctx_close_queue(ctx);
    if (ctx->pinned)
        cudaFreeHost(ctx->pinned);
    if (ctx->alloc)
        ptl_alloc_destroy(ctx->alloc);
    free(ctx);
}

int ptl_cuda_ctx_open_queue(ptl_cuda_ctx *ctx, int first)
{
    int least = 0, greatest = 0;
    PTL_CUDA_TRY(cudaSetDevice(ctx->device));
    PTL_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    PTL_CUDA_TRY(cudaStreamCreateWithPriority(&ctx->stream, cudaStreamNonBlocking, first ? greatest : least));
    PTL_CUBLAS_TRY(cublasCreate(&ctx->cublas));
    PTL_CUBLAS_TRY(cublasSetStream(ctx->cublas, ctx->stream));
    PTL_CUBLAS_TRY(cublasLtCreate(&ctx->cublaslt));
    PTL_CUDNN_TRY(cudnnCreate(&ctx->cudnn));
    PTL_CUDNN_TRY(cudnnSetStream(ctx->cudnn, ctx->stream));
    return 0;
fail:
    return -1;
}

void ptl_cuda_ctx_close_queue(ptl_cuda_ctx *ctx)
{
    cudaSetDevice(ctx->device);
    if (ctx->stream)
        cudaStreamSynchronize(ctx->stream);
    for (int i = 0; i < PTL_CTX_NUM_EXT; i++)
        if (ctx->ext[i].ptr && ctx->ext[i].destroy)
            ctx->ext[i].destroy(ctx->ext[i].ptr);
    if (ctx->cudnn)
        cudnnDestroy(ctx->cudnn);
    if (ctx->cublaslt)
        cublasLtDestroy(ctx->cublaslt);
    if (ctx->cublas)
        cublasDestroy(ctx->cublas);
    if (ctx->stream)
        cudaStreamDestroy(ctx->stream);
    pthread_mutex_destroy(&ctx->staging_lock);
    pthread_mutex_destroy(&ctx->ext_lock);
}

static int ctx_create(ptl_runtime *rt, int device, ptl_cuda_ctx **out)
{
    ptl_cuda_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
    ctx->rt = rt;
    ctx->device = device;
    pthread_mutex_init(&ctx->staging_lock, NULL);
    pthread_mutex_init(&ctx->ext_lock, NULL);
    PTL_CHECK(ptl_cuda_libraries_load()); /* cuBLAS and cuDNN are opened here, on first CUDA use */
    PTL_CUDA_TRY(cudaSetDevice(device));
    PTL_CHECK(ptl_cuda_pdl_setup());
    const char *prio = getenv("PTL_STREAM_PRIORITY");
    PTL_CHECK(ptl_cuda_ctx_open_queue(ctx, !prio || strcmp(prio, "0") != 0));
    PTL_CHECK(ptl_alloc_create(device, &ctx->alloc));
    *out = ctx;
    return 0;
fail:
    ptl_cuda_ctx_destroy(ctx);
    return -1;
}

int ptl_cuda_ctx_get(ptl_runtime *rt, int device, ptl_cuda_ctx **out)
{
    int count = ptl_cuda_device_count(rt);
    if (device < 0 || device >= count) {
        if (count == 0)
            return ptl_set_error(PTL_ERR_VALUE, "device 'cuda:%d' requested but no CUDA device is available", device);
        return ptl_set_error(PTL_ERR_VALUE, "device 'cuda:%d' does not exist (%d CUDA device%s)", device, count,
                             count == 1 ? "" : "s");
    }
    pthread_mutex_lock(&rt->lock);
    int rc = 0;
    if (!rt->ctx[device])
        rc = ctx_create(rt, device, &rt->ctx[device]);
    pthread_mutex_unlock(&rt->lock);
    if (rc != 0)
        return -1;
    if (cudaSetDevice(device) != cudaSuccess)
        return ptl_cuda_fail("cudaSetDevice", cudaGetLastError());
    *out = rt->ctx[device];
    return 0;
}

int ptl_cuda_storage_alloc(ptl_runtime *rt, ptl_storage *s)
{
    ptl_cuda_ctx *ctx;
    if (ptl_cuda_ctx_get(rt, s->device.index, &ctx) != 0)
        return -1;
    return ptl_alloc_malloc(ctx->alloc, ptl_alloc_current_pool(ctx->alloc), s->nbytes, &s->data, &s->block);
}

void ptl_cuda_storage_free(ptl_storage *s)
{
    ptl_cuda_ctx *ctx = s->rt->ctx[s->device.index];
    if (ctx && s->block)
        ptl_alloc_free(ctx->alloc, s->block);
}

/* The pinned staging buffer is reused across copies; copies through it wait for completion. */
#define STAGING_CHUNK ((size_t)64 << 20)

static int staging(ptl_cuda_ctx *ctx, size_t want)
{
    if (want > STAGING_CHUNK)
        want = STAGING_CHUNK;
    if (ctx->pinned_bytes >= want)
        return 0;
    if (ctx->pinned) {
        PTL_CUDA_TRY(cudaFreeHost(ctx->pinned));
        ctx->pinned = NULL;
        ctx->pinned_bytes = 0;
    }
    PTL_CUDA_TRY(cudaHostAlloc(&ctx->pinned, want, cudaHostAllocDefault));
    ctx->pinned_bytes = want;
    return 0;
fail:
    return -1;
}

static int staged_copy(ptl_cuda_ctx *ctx, void *dst, int to_device, const void *src, size_t nbytes)
{
    PTL_CHECK(staging(ctx, nbytes));
    for (size_t done = 0; done < nbytes;) {
        size_t n = nbytes - done < ctx->pinned_bytes ? nbytes - done : ctx->pinned_bytes;
        if (to_device) {
            memcpy(ctx->pinned, (const char *)src + done, n);
            PTL_CUDA_TRY(cudaMemcpyAsync((char *)dst + done, ctx->pinned, n, cudaMemcpyHostToDevice, ctx->stream));
            PTL_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
        } else {
            PTL_CUDA_TRY(cudaMemcpyAsync(ctx->pinned, (const char *)src + done, n, cudaMemcpyDeviceToHost, ctx->stream));
            PTL_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
            memcpy((char *)dst + done, ctx->pinned, n);
        }
        done += n;
    }
    return 0;
fail:
    return -1;
}

int ptl_cuda_copy_bytes(ptl_runtime *rt, void *dst, ptl_device dst_dev, const void *src, ptl_device src_dev,
                        size_t nbytes)
{
    ptl_cuda_ctx *ctx;
    if (dst_dev.type == PTL_CUDA && src_dev.type == PTL_CUDA) {
        PTL_CHECK(ptl_cuda_ctx_get(rt, src_dev.index, &ctx));
        if (dst_dev.index == src_dev.index)
            PTL_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, ctx->stream));
        else
            PTL_CUDA_TRY(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, nbytes, ctx->stream));
        PTL_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
        return 0;
    }
    int dev = dst_dev.type == PTL_CUDA ? dst_dev.index : src_dev.index;
    PTL_CHECK(ptl_cuda_ctx_get(rt, dev, &ctx));
    pthread_mutex_lock(&ctx->staging_lock);
    int rc = staged_copy(ctx, dst, dst_dev.type == PTL_CUDA, src, nbytes);
    pthread_mutex_unlock(&ctx->staging_lock);
    return rc;
fail:
    return -1;
}

int ptl_cuda_convert(ptl_runtime *rt, int device, void *dst, ptl_dtype ddt, const void *src, ptl_dtype sdt, int64_t n)
{
    ptl_cuda_ctx *ctx;
    if (ptl_cuda_ctx_get(rt, device, &ctx) != 0)
        return -1;
    return cast_cuda(ctx->stream, dst, ddt, src, sdt, n);
}

int ptl_cuda_memset(ptl_runtime *rt, int device, void *ptr, int value, size_t nbytes)
{
    ptl_cuda_ctx *ctx;
    PTL_CHECK(ptl_cuda_ctx_get(rt, device, &ctx));
    if (nbytes)
        PTL_CUDA_TRY(cudaMemsetAsync(ptr, value, nbytes, ctx->stream));
    return 0;
fail:
    return -1;
}
