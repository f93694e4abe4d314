/* Stream-ordered caching allocator for one device (all work runs on the device's one stream, so a
 * freed block may be reused by the next allocation without waiting).
 *
 * Sizes are rounded up to 512 bytes. Requests up to 1 MiB come from 2 MiB segments ("small" pool),
 * larger ones from segments of the rounded size (at least 20 MiB for requests up to 10 MiB), as
 * PyTorch does. Free blocks are split to fit and merged with free neighbours of the same segment.
 * Segments are returned to the driver only by ptl_alloc_empty_cache. Each block belongs to one pool:
 * pool 0 is the default; private pools (e.g. for a CUDA-graph recording) own their own segments, so
 * memory a recording holds is never handed to eager code. */
#ifndef PTL_CUDA_ALLOCATOR_H
#define PTL_CUDA_ALLOCATOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ptl_allocator ptl_allocator;

typedef struct {
    int64_t allocated, max_allocated; /* bytes in blocks handed out (rounded sizes) */
    int64_t reserved, max_reserved;   /* bytes in segments obtained from cudaMalloc */
    int64_t num_segments, num_alloc_retries;
} ptl_alloc_stats;

int ptl_alloc_create(int device, ptl_allocator **out);
void ptl_alloc_destroy(ptl_allocator *a);
/* Returns the pointer and an opaque block handle for ptl_alloc_free. nbytes 0 gives a NULL pointer. */
int ptl_alloc_malloc(ptl_allocator *a, int pool, size_t nbytes, void **ptr, void **block);
void ptl_alloc_free(ptl_allocator *a, void *block);
/* Releases every unused segment of every pool (and the pool ids that are retired and empty). */
int ptl_alloc_empty_cache(ptl_allocator *a);
/* A new private pool id (> 0). */
int ptl_alloc_pool_create(ptl_allocator *a);
/* Marks a private pool retired: its segments go back to the driver once all its blocks are free. */
int ptl_alloc_pool_release(ptl_allocator *a, int pool);
void ptl_alloc_get_stats(ptl_allocator *a, ptl_alloc_stats *out);
void ptl_alloc_reset_peak(ptl_allocator *a);
/* Current pool for new allocations of this device (0 unless inside use_mem_pool). */
int ptl_alloc_current_pool(ptl_allocator *a);
void ptl_alloc_set_current_pool(ptl_allocator *a, int pool);

#ifdef __cplusplus
}
#endif

#endif
