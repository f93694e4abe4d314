/* The runtime: host and device storage, and (with CUDA) the per-device contexts.
 * One runtime per ptl._C module instance; every storage keeps a pointer to the runtime that made it. */
#ifndef PTL_RUNTIME_H
#define PTL_RUNTIME_H

#include "ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ptl_runtime ptl_runtime;

/* Refcounted, contiguous memory on one device. */
typedef struct ptl_storage {
    long refcount; /* atomic */
    void *data;
    size_t nbytes;
    ptl_device device;
    void *block; /* allocator block (CUDA) */
    ptl_runtime *rt;
    int borrowed; /* data belongs to someone else (ptl_storage_borrow): never freed here */
} ptl_storage;

ptl_runtime *ptl_runtime_create(void);
/* Frees the runtime once the module is gone and no storage refers to it any more. */
void ptl_runtime_release(ptl_runtime *rt);

int ptl_storage_new(ptl_runtime *rt, ptl_device dev, size_t nbytes, ptl_storage **out);
/* Storage over memory owned elsewhere (e.g. a NumPy array); the caller keeps the owner alive. */
int ptl_storage_borrow(ptl_runtime *rt, ptl_device dev, void *data, size_t nbytes, ptl_storage **out);
void ptl_storage_incref(ptl_storage *s);
void ptl_storage_decref(ptl_storage *s);

/* Copies nbytes between any two devices. Waits for the copy to finish when either side is the host. */
int ptl_copy_bytes(ptl_runtime *rt, void *dst, ptl_device dst_dev, const void *src, ptl_device src_dev,
                   size_t nbytes);
/* Sets nbytes of device (or host) memory to `value` (asynchronously on the device's stream). */
int ptl_memset_device(ptl_runtime *rt, ptl_device dev, void *ptr, int value, size_t nbytes);
/* Converts n elements from (src, sdt) to (dst, ddt), both on `dev`. */
int ptl_convert(ptl_runtime *rt, ptl_device dev, void *dst, ptl_dtype ddt, const void *src, ptl_dtype sdt,
                int64_t n);

/* Number of usable CUDA devices; 0 when built without CUDA, with no driver or no GPU. */
int ptl_cuda_device_count(ptl_runtime *rt);

#ifdef __cplusplus
}
#endif

#endif
