/* A device's upload stream: a step's copy of its batch from pinned host memory runs there, beside the work
 * ctx's stream still has queued (the previous step's, while the host runs ahead), instead of alone on the GPU
 * at the step's start (0.36 ms of a 13 ms step at batch 16, 640, on an H200). The copy waits only until what
 * read its destination's previous contents has run (ptl_cuda_upload_read), and ctx's stream waits for the
 * copy, so the step reads what it would read after a copy on its own stream. Kept in ctx's ext slot
 * PTL_CTX_UPLOAD; one host thread records and waits its events in order. */
#ifndef PTL_CUDA_UPLOAD_QUEUE_H
#define PTL_CUDA_UPLOAD_QUEUE_H

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes ctx's upload stream (not on a hot path: a step plan makes it). */
int ptl_cuda_upload_open(ptl_cuda_ctx *ctx);
/* Queues the copy of `bytes` from src (host) to dst (device) on the upload stream, after the last
 * ptl_cuda_upload_read, and has ctx's stream wait for it; *copy: the upload stream (for a fence on src). */
int ptl_cuda_upload(ptl_cuda_ctx *ctx, void *dst, const void *src, size_t bytes, cudaStream_t *copy);
/* What ctx's stream has queued so far has read the uploaded memory: the next upload may overwrite it. */
int ptl_cuda_upload_read(ptl_cuda_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif
