/* Per-device CUDA context: one stream, cuBLAS/cuBLASLt/cuDNN handles bound to it, the caching
 * allocator and a pinned staging buffer. Created lazily on first use of a device. */
#ifndef PTL_CUDA_DEVICE_H
#define PTL_CUDA_DEVICE_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <pthread.h>

#include "../runtime.h"
#include "allocator.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-device state that other areas create on first use (freed with the context). */
enum { PTL_CTX_OBJECTIVE = 0, PTL_CTX_LAYER_SCRATCH, PTL_CTX_CONV_PLANS, PTL_CTX_CALL_GRAPHS, PTL_CTX_UPLOAD,
       PTL_CTX_SIDE_STREAM, /* five slots, one per side stream (side_stream.h) */
       PTL_CTX_NUM_EXT = PTL_CTX_SIDE_STREAM + 5 };
typedef struct {
    void *ptr;
    void (*destroy)(void *ptr);
} ptl_ctx_ext;

/* The one execution context of a device, passed to every CUDA library function. */
typedef struct ptl_cuda_ctx {
    ptl_runtime *rt; /* the runtime that owns it */
    int device;
    cudaStream_t stream;
    cublasHandle_t cublas;
    cublasLtHandle_t cublaslt;
    cudnnHandle_t cudnn;
    ptl_allocator *alloc;
    void *pinned; /* staging buffer for host<->device copies, grown on demand */
    size_t pinned_bytes;
    pthread_mutex_t staging_lock; /* one host<->device copy through `pinned` at a time */
    ptl_ctx_ext ext[PTL_CTX_NUM_EXT];
    pthread_mutex_t ext_lock; /* held by the user of an ext slot while it creates or runs it */
} ptl_cuda_ctx;

/* The context of `device`, created on first call. */
int ptl_cuda_ctx_get(ptl_runtime *rt, int device, ptl_cuda_ctx **out);
/* A context's stream and the cuBLAS / cuDNN handles bound to it (ctx->device set, its locks initialised);
 * close_queue releases them, what its ext slots hold and its locks (also after a failed open). first: the
 * stream's work goes ahead of other streams' where both are ready (the device's main stream, unless
 * PTL_STREAM_PRIORITY=0: the side streams' work waits for SMs the main stream's critical path leaves). */
int ptl_cuda_ctx_open_queue(ptl_cuda_ctx *ctx, int first);
void ptl_cuda_ctx_close_queue(ptl_cuda_ctx *ctx);

/* Error reporting: each returns -1 after setting a PTL_ERR_CUDA error naming `call` and the status. */
int ptl_cuda_fail(const char *call, cudaError_t status);
int ptl_cublas_fail(const char *call, cublasStatus_t status);
int ptl_cudnn_fail(const char *call, cudnnStatus_t status);
/* cuDNN's data type for an activation dtype (float32, bfloat16; anything else float16). */
cudnnDataType_t ptl_cudnn_data_type(ptl_dtype dt);
/* Programmatic dependent launch (launch.cuh): 1 when kernel launches may start early, 0 when not, -1
 * before the first context; ptl_cuda_pdl_setup decides it for the current device (every context's device
 * must allow it). */
extern int ptl_cuda_pdl;
int ptl_cuda_pdl_setup(void);
/* Checks the last launch; names the kernel on failure. */
int ptl_cuda_launch_check(const char *kernel);

#define PTL_CUDA_TRY(call)                              \
    do {                                                \
        cudaError_t st_ = (call);                       \
        if (st_ != cudaSuccess) {                       \
            ptl_cuda_fail(#call, st_);                  \
            goto fail;                                  \
        }                                               \
    } while (0)
#define PTL_CUBLAS_TRY(call)                            \
    do {                                                \
        cublasStatus_t st_ = (call);                    \
        if (st_ != CUBLAS_STATUS_SUCCESS) {             \
            ptl_cublas_fail(#call, st_);                \
            goto fail;                                  \
        }                                               \
    } while (0)
#define PTL_CUDNN_TRY(call)                             \
    do {                                                \
        cudnnStatus_t st_ = (call);                     \
        if (st_ != CUDNN_STATUS_SUCCESS) {              \
            ptl_cudnn_fail(#call, st_);                 \
            goto fail;                                  \
        }                                               \
    } while (0)
#define PTL_LAUNCH_CHECK(name)                          \
    do {                                                \
        if (ptl_cuda_launch_check(name) != 0)           \
            goto fail;                                  \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
