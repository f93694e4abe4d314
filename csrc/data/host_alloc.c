/* Host memory of the batch ring in CPU-only builds (the CUDA build's version, page-locked, is
 * csrc/cuda/pinned_host.c). */
#ifndef PTL_WITH_CUDA
#include <stdlib.h>

#include "dataset.h"

void *ptl_host_alloc(size_t nbytes, int want_pinned, int *is_pinned)
{
    (void)want_pinned;
    *is_pinned = 0;
    void *p = aligned_alloc(64, (nbytes + 63) / 64 * 64 + 64);
    if (!p)
        ptl_set_error(PTL_ERR_MEMORY, "out of host memory allocating %zu bytes", nbytes);
    return p;
}

void ptl_host_free(void *p, int is_pinned)
{
    (void)is_pinned;
    free(p);
}

int ptl_host_fence_record(void **fence, void *stream)
{
    (void)fence;
    (void)stream;
    return 0;
}

void ptl_host_fence_wait(void *fence) { (void)fence; }

void ptl_host_fence_destroy(void *fence) { (void)fence; }
#else
typedef int ptl_host_alloc_unused; /* ISO C forbids an empty translation unit */
#endif
