/* The side streams of a device context (the CUDA backend's side_open, side_fork, side_mark and side_await
 * of ../nn/executor.h; k < PTL_NET_SIDE_STREAMS): each a second context on the same
 * device, with its own stream, cuBLAS / cuDNN handles bound to it and layer scratch, and the device's
 * allocator, kept in the main context's ext slots. */
#ifndef PTL_CUDA_SIDE_STREAM_H
#define PTL_CUDA_SIDE_STREAM_H

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Side context k of ctx, made on first call (not on a hot path: the executor asks when it is made). */
int ptl_cuda_side_open(ptl_cuda_ctx *ctx, int k, ptl_cuda_ctx **side);
/* Side stream k waits for everything queued so far on side stream `from` (-1: on ctx's stream). */
int ptl_cuda_side_fork(ptl_cuda_ctx *ctx, int k, int from);
/* Mark m (< PTL_NET_SIDE_MARKS) of side stream k: what it has queued so far. */
int ptl_cuda_side_mark(ptl_cuda_ctx *ctx, int k, int m);
/* Side stream `to` (-1: ctx's stream) waits for mark m of side stream k. */
int ptl_cuda_side_await(ptl_cuda_ctx *ctx, int k, int m, int to);

#ifdef __cplusplus
}
#endif

#endif
