/* A convolution followed by training-mode BatchNorm (CUDA): z = conv(x, w), then y = BatchNorm(z) (+ SiLU) with
 * the batch's statistics, the contract of ../nn/conv2d.h and ../nn/batchnorm.h one after the other.
 *
 * With the environment variable PTL_CONV_BN=1, where the plan allows it (ptl_conv2d_bn_fused: bfloat16 or float16,
 * groups 1, 1x1 or 3x3 kernels, channel counts multiples of 8), the convolution is our own implicit GEMM on tensor
 * cores (mma.sync), which writes BatchNorm's per-channel partial sums in its epilogue: the pass of three launches
 * (convolution, BatchNorm's finish, its apply) replaces four (convolution, partial sums, finish, apply), and z is
 * read once less. Each block sums the values it stored (rounded to the dtype, in double) relative to its first
 * row's value, in a fixed order, with no atomics; the finish moves every block's sums to the channel's first
 * value, so the statistics are bitwise reproducible run to run, like the unfused pass's.
 *
 * It is not the default: on an H100 at yolo26n's batch-4 shapes the kernel is slower than cuDNN's and cuBLAS's
 * convolutions (Hopper's wgmma engines) by more than the launch it saves, 28% summed over twelve layers, and the
 * replayed step is 0.25 ms slower (benchmarks/conv_bn.py; RESULTS.md, issue 22). It is the fused epilogue, finish
 * and executor path that a faster main loop (wgmma) would slot into. Otherwise the call is the plan's
 * convolution, then the BatchNorm forward. */
#ifndef PTL_CUDA_CONV2D_BN_H
#define PTL_CUDA_CONV2D_BN_H

#include "../nn/activation.h"
#include "conv2d.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether plan p's convolution with training-mode BatchNorm runs fused. */
int ptl_conv2d_bn_fused(const ptl_conv2d_plan *p);
/* Layer-scratch bytes the fused pass's partial sums take for m rows of c channels (the layer scratch holds the
 * larger of these and the unfused pass's: ptl_batchnorm_cuda_scratch_bytes). */
size_t ptl_conv2d_bn_part_bytes(int64_t m, int c);

/* z = conv(x, w) (overwrite), then y = BatchNorm(z) over the batch with act (PTL_ACT_NONE or PTL_ACT_SILU), the
 * running statistics updated and the batch's mean and 1/std saved; y's rows are ld apart. gamma, beta, the
 * running and saved statistics are float32; workspace as the plan's forward wants it. */
int ptl_conv2d_bn_forward_cuda(struct ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *x, const void *w,
                               void *z, void *workspace, size_t workspace_bytes, const void *gamma, const void *beta,
                               void *running_mean, void *running_var, ptl_act act, void *save_mean, void *save_invstd,
                               void *y, int ld);

/* BatchNorm's training forward from the fused convolution's partial sums (batchnorm.cu): the finish over
 * `nchunks` blocks' sums in `part`, then the apply of z to y. */
int ptl_batchnorm_forward_from_sums_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, int nchunks,
                                         const double *part, const void *z, const void *gamma, const void *beta,
                                         void *running_mean, void *running_var, int silu, void *save_mean,
                                         void *save_invstd, void *y, int ld);

#ifdef __cplusplus
}
#endif

#endif
