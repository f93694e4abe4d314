/* Element-wise add/accumulate (CUDA). */

#include "../nn/elementwise.h"
#include "layers_common.cuh"

/* ---------------------------------------------------------------- add / accumulate */

template <typename T>
__global__ void add_kernel(int64_t n, const T *a, const T *b, T *y)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        ptl_st(y + i, ptl_ld(a + i) + ptl_ld(b + i));
}

template <typename T>
__global__ void accumulate_kernel(int64_t n, const T *x, T *y)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        ptl_st(y + i, ptl_ld(y + i) + ptl_ld(x + i));
}

static int check_n(const char *fn, int64_t n)
{
    if (n < 0)
        return ptl_set_error(PTL_ERR_VALUE, "%s: negative length %lld", fn, (long long)n);
    return 0;
}

extern "C" int ptl_add_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t n, const void *a, const void *b, void *y)
{
    if (check_n("add_cuda", n))
        return -1;
    if (n == 0)
        return 0;
    PTL_LAYER_DISPATCH(
        "add_cuda", dt,
        ptl_launch(add_kernel<T>, ptl_grid_for(n, 256), 256, 0, ctx->stream, n, (const T *)a, (const T *)b, (T *)y));
    PTL_LAUNCH_CHECK("add_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_accumulate_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t n, const void *x, void *y)
{
    if (check_n("accumulate_cuda", n))
        return -1;
    if (n == 0)
        return 0;
    PTL_LAYER_DISPATCH(
        "accumulate_cuda", dt,
        ptl_launch(accumulate_kernel<T>, ptl_grid_for(n, 256), 256, 0, ctx->stream, n, (const T *)x, (T *)y));
    PTL_LAUNCH_CHECK("accumulate_kernel");
    return 0;
fail:
    return -1;
}
