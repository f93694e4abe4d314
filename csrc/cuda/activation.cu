/* SiLU forward/backward (CUDA), float32 arithmetic for every activation dtype, one formula with the CPU
 * (ptl_sigmoidf in ../nn/activation.h). */
#include "../nn/activation.h"
#include "layers_common.cuh"

template <typename T>
__global__ void silu_fwd_kernel(int64_t n, const T *x, T *y)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = ptl_ld(x + i);
        ptl_st(y + i, v * ptl_sigmoidf(v));
    }
}

template <typename T>
__global__ void silu_bwd_kernel(int64_t n, const T *x, const T *dy, T *dx)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = ptl_ld(x + i), s = ptl_sigmoidf(v);
        ptl_st(dx + i, ptl_ld(dy + i) * (s * (1.0f + v * (1.0f - s))));
    }
}

extern "C" int ptl_silu_forward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t n, const void *x, void *y)
{
    if (n < 0)
        return ptl_set_error(PTL_ERR_VALUE, "silu_forward_cuda: negative length %lld", (long long)n);
    if (n == 0)
        return 0;
    PTL_LAYER_DISPATCH(
        "silu_forward_cuda", dt,
        ptl_launch(silu_fwd_kernel<T>, ptl_grid_for(n, 256), 256, 0, ctx->stream, n, (const T *)x, (T *)y));
    PTL_LAUNCH_CHECK("silu_fwd_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_silu_backward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t n, const void *x, const void *dy,
                                      void *dx)
{
    if (n < 0)
        return ptl_set_error(PTL_ERR_VALUE, "silu_backward_cuda: negative length %lld", (long long)n);
    if (n == 0)
        return 0;
    PTL_LAYER_DISPATCH("silu_backward_cuda", dt,
                       ptl_launch(silu_bwd_kernel<T>, ptl_grid_for(n, 256), 256, 0, ctx->stream, n, (const T *)x,
                                  (const T *)dy, (T *)dx));
    PTL_LAUNCH_CHECK("silu_bwd_kernel");
    return 0;
fail:
    return -1;
}
