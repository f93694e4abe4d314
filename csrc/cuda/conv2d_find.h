/* The timed search of a convolution plan's `find` option (conv2d.h), shared by the legacy-API and the
 * graph-API paths: scratch tensors of the problem's sizes, and the fastest of n candidates by CUDA events.
 * Plan time only: it allocates and synchronises. */
#ifndef PTL_CUDA_CONV2D_FIND_H
#define PTL_CUDA_CONV2D_FIND_H

#include <stddef.h>

#include "conv2d.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ptl_cuda_ctx;

/* x (or dx), w (or dw), y (or dy) and the workspace, filled with a small constant, in a private pool of the
 * allocator that the free gives back to the driver: cached, the candidates' largest workspaces would stay
 * reserved beside the network's memory. */
typedef struct {
    void *buf[4];
    void *blk[4];
    size_t workspace;
    int pool; /* 0: none made */
} ptl_conv_find_buffers;

int ptl_conv_find_buffers_alloc(struct ptl_cuda_ctx *ctx, const ptl_conv2d_desc *d, ptl_dtype dt, size_t workspace,
                                ptl_conv_find_buffers *b);
void ptl_conv_find_buffers_free(struct ptl_cuda_ctx *ctx, ptl_conv_find_buffers *b);

/* Runs candidate i once on the buffers; 0 on success (errors are the candidate's, not reported). */
typedef int (*ptl_conv_find_run)(void *arg, int i, const ptl_conv_find_buffers *b);

/* The index of the fastest of n candidates (mean of 5 runs after a warm-up, over two rounds keeping each
 * candidate's better time, so that none is judged while the clocks ramp up), or -1 when none runs. */
int ptl_conv_find_fastest(struct ptl_cuda_ctx *ctx, int n, ptl_conv_find_run run, void *arg,
                          const ptl_conv_find_buffers *b);

#ifdef __cplusplus
}
#endif

#endif
