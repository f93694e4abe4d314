/* Page-locked host memory for the data loader's batch ring, and the fences that keep a slot from being
 * overwritten while an asynchronous upload still reads it. Falls back to ordinary aligned memory when
 * no CUDA device is usable (the loader then works, uploads are just synchronous-speed). */
#include <cuda_runtime.h>
#include <stdlib.h>

#include "../data/dataset.h"
#include "device.h"

void *ptl_host_alloc(size_t nbytes, int want_pinned, int *is_pinned)
{
    void *p = NULL;
    *is_pinned = 0;
    if (want_pinned) {
        if (cudaHostAlloc(&p, nbytes ? nbytes : 1, cudaHostAllocPortable) == cudaSuccess) {
            *is_pinned = 1;
            return p;
        }
        (void)cudaGetLastError();
        p = NULL;
    }
    p = aligned_alloc(64, (nbytes + 63) / 64 * 64 + 64);
    if (!p)
        ptl_set_error(PTL_ERR_MEMORY, "out of host memory allocating %zu bytes", nbytes);
    return p;
}

void ptl_host_free(void *p, int is_pinned)
{
    if (!p)
        return;
    if (is_pinned)
        cudaFreeHost(p);
    else
        free(p);
}

int ptl_host_fence_record(void **fence, void *stream)
{
    if (!*fence) {
        cudaEvent_t ev;
        PTL_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        *fence = (void *)ev;
    }
    PTL_CUDA_TRY(cudaEventRecord((cudaEvent_t)*fence, (cudaStream_t)stream));
    return 0;
fail:
    return -1;
}

void ptl_host_fence_wait(void *fence)
{
    /* Called from loader threads: an error here can only mean the device is gone, which the training
     * thread reports on its next CUDA call. */
    if (fence)
        (void)cudaEventSynchronize((cudaEvent_t)fence);
}

void ptl_host_fence_destroy(void *fence)
{
    if (fence)
        cudaEventDestroy((cudaEvent_t)fence);
}
