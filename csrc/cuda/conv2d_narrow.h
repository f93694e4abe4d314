/* Direct kernels for 3x3 ungrouped convolutions with few input channels (YOLO26's stem: 3 -> 16, stride 2), on
 * conv2d.h's layouts. cuDNN has no tensor-core engine for a 3-channel input: its generic forward for the stem took
 * 61 us at batch 4, 640 on an H100, alone on the GPU at the step's start, the forward here 14; its weight gradient
 * pads the input to more channels and runs a split-K GEMM, about 80 us at the end of the backward (benchmarks/
 * RESULTS.md, issue 22), which the weight gradient here runs on tensor cores. The input gradient stays on cuDNN
 * (the stem needs none).
 *
 * In bfloat16 and float16 (stride 1 or 2) both directions run on tensor cores over per-warp tiles of 64 output
 * pixels, the input rows under a tile staged in shared memory: the forward's outputs each summed by one lane, the
 * weight gradient's float32 sums of fixed tiles added in a fixed order. In float32 the forward takes one thread per
 * 4 output pixels and pack of output channels, the 9 * cin taps summed in (ky, kx, ci) order, and the weight
 * gradient stays on cuDNN (no TF32). All bitwise reproducible. */
#ifndef PTL_CUDA_CONV2D_NARROW_H
#define PTL_CUDA_CONV2D_NARROW_H

#include <cuda_runtime.h>
#include <stddef.h>

#include "../nn/conv2d.h"
#include "../runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_NARROW_MAX_CIN 4
#define PTL_NARROW_MAX_COUT 64

/* Whether d's forward runs here: 3x3, ungrouped, 1 .. PTL_NARROW_MAX_CIN input channels, at most
 * PTL_NARROW_MAX_COUT output channels, a multiple of 8. */
int ptl_conv2d_narrow_takes(const ptl_conv2d_desc *d);

/* y = conv(x, w); dt: float32, bfloat16 or float16; fn names the caller in errors. */
int ptl_conv2d_narrow_forward(cudaStream_t stream, const char *fn, ptl_dtype dt, const ptl_conv2d_desc *d,
                              const void *x, const void *w, void *y);

/* Whether d's weight gradient in dtype dt runs here: a forward that does, bfloat16 or float16 (the tensor cores'
 * inputs; float32 stays on cuDNN, without TF32), stride 1 or 2. */
int ptl_conv2d_narrow_wgrad_takes(const ptl_conv2d_desc *d, ptl_dtype dt);
/* Its workspace in bytes (the blocks' partial sums). */
size_t ptl_conv2d_narrow_wgrad_workspace(const ptl_conv2d_desc *d);
/* dw += dL/dw given x and dy (OHWI, dtype dt), through `workspace` of at least that many bytes. */
int ptl_conv2d_narrow_backward_weight(cudaStream_t stream, const char *fn, ptl_dtype dt, const ptl_conv2d_desc *d,
                                      const void *x, const void *dy, void *dw, void *workspace,
                                      size_t workspace_bytes);

#ifdef __cplusplus
}
#endif

#endif
