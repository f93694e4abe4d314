/* The runtime's fields, shared by runtime.c and the CUDA device code only. */
#ifndef PTL_RUNTIME_IMPL_H
#define PTL_RUNTIME_IMPL_H

#include <pthread.h>

#include "runtime.h"

#define PTL_MAX_DEVICES 64

struct ptl_cuda_ctx;

struct ptl_runtime {
    pthread_mutex_t lock;
    long refs;         /* the module's reference plus one per live storage (atomic) */
    int device_count;  /* -1 until first asked */
    struct ptl_cuda_ctx *ctx[PTL_MAX_DEVICES];
};

#ifdef PTL_WITH_CUDA
void ptl_cuda_ctx_destroy(struct ptl_cuda_ctx *ctx);
int ptl_cuda_storage_alloc(ptl_runtime *rt, ptl_storage *s);
void ptl_cuda_storage_free(ptl_storage *s);
int ptl_cuda_copy_bytes(ptl_runtime *rt, void *dst, ptl_device dst_dev, const void *src, ptl_device src_dev,
                        size_t nbytes);
int ptl_cuda_convert(ptl_runtime *rt, int device, void *dst, ptl_dtype ddt, const void *src, ptl_dtype sdt,
                     int64_t n);
int ptl_cuda_memset(ptl_runtime *rt, int device, void *ptr, int value, size_t nbytes);
int ptl_cuda_count(void);
#endif

#endif
