/* One direction of a CUDA 2-D convolution as a cuDNN backend ("graph") API execution plan, built once per
 * (shape, dtype, options) and executed with a variant pack of three pointers and the workspace.
 *
 * Why: cuDNN 9's legacy entry points (cudnnConvolutionForward & co.) look up or build such a plan on
 * every call, 33-83 us of host time each (benchmarks/RESULTS.md), which bounds an eager step. A
 * finalized plan skips that. The layouts are conv2d.h's: NHWC activations, KRSC (OHWI) filters,
 * padding pad on both sides. Engines are taken from cuDNN's heuristics (mode A) in their order, keeping
 * only those that meet the options: no NONDETERMINISTIC note when deterministic, no tensor cores or
 * down-converted inputs for strict float32, no reduced-precision reduction, no runtime compilation
 * (seconds of planning and NVRTC at run time). With find, up to PTL_CUDNN_GRAPH_FIND of them are timed
 * and the fastest kept. */
#ifndef PTL_CUDA_CONV2D_CUDNN_GRAPH_H
#define PTL_CUDA_CONV2D_CUDNN_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "conv2d.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_CUDNN_GRAPH_FIND 8

/* The operations; their tensors, in variant-pack order: forward (x, w, y), backward data (dx, w, dy),
 * backward filter (x, dw, dy). The backward filter adds to dw (beta 1), and backward data adding adds to
 * dx (for an input with several consumers); the other two overwrite. */
typedef enum {
    PTL_CONV_FORWARD = 0,
    PTL_CONV_BACKWARD_DATA = 1,
    PTL_CONV_BACKWARD_FILTER = 2,
    PTL_CONV_BACKWARD_DATA_ADD = 3,
} ptl_conv_direction;
#define PTL_CONV_DIRECTIONS 4

typedef struct ptl_cudnn_conv_exec ptl_cudnn_conv_exec;

/* Builds the plan of direction `dir`, querying cuDNN through handle `cudnn` (ctx's, or a plan-making
 * thread's own: a handle serves one thread at a time; a plan runs through any handle of its device). 0 with
 * *out NULL: no engine meets the options (the caller uses another path); -1: a cuDNN or CUDA error (set).
 * strict: float32 without TF32. With opts->find the candidates run on ctx's stream, on scratch buffers
 * from ctx's allocator (cudnn must then be ctx's handle), and this synchronises. */
int ptl_cudnn_conv_exec_create(struct ptl_cuda_ctx *ctx, struct cudnnContext *cudnn, const ptl_conv2d_desc *d,
                               ptl_dtype dt, ptl_conv_direction dir, int strict, const ptl_conv2d_plan_opts *opts,
                               ptl_cudnn_conv_exec **out);
void ptl_cudnn_conv_exec_destroy(ptl_cudnn_conv_exec *e);

size_t ptl_cudnn_conv_exec_workspace(const ptl_cudnn_conv_exec *e);
/* The engine's global index (for logs and tests) and whether it runs on tensor cores. */
int ptl_cudnn_conv_exec_engine(const ptl_cudnn_conv_exec *e);
int ptl_cudnn_conv_exec_tensor_op(const ptl_cudnn_conv_exec *e);

/* Runs the plan on ctx's stream (enqueues only). a, b, c are the direction's three tensors in the
 * order above; every pointer 16-byte aligned; workspace of at least ptl_cudnn_conv_exec_workspace. */
int ptl_cudnn_conv_exec_run(struct ptl_cuda_ctx *ctx, const ptl_cudnn_conv_exec *e, const void *a, const void *b,
                            const void *c, void *workspace);

#ifdef __cplusplus
}
#endif

#endif
