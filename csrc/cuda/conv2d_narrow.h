/* A direct forward kernel for 3x3 ungrouped convolutions with few input channels (YOLO26's stem: 3 -> 16,
 * stride 2), on conv2d.h's layouts. cuDNN has no tensor-core engine for a 3-channel input: its generic forward
 * for the stem took 61 us at batch 4, 640 on an H100, alone on the GPU at the step's start, this kernel 25
 * (benchmarks/RESULTS.md, issue 22). Its backward directions stay on cuDNN: direct weight gradients were no
 * faster (by the column reduction 195 us, with register sums 78, cuDNN's padding and split-K GEMM about 82).
 *
 * One thread per 4 output pixels and pack of output channels, the 9 * cin taps summed in float32 in
 * (ky, kx, ci) order: bitwise reproducible. */
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

#ifdef __cplusplus
}
#endif

#endif
