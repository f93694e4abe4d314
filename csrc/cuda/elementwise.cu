/* Element-wise add/accumulate (CUDA). */

#include "../nn/elementwise.h"
#include "layers_common.cuh"

/* ---------------------------------------------------------------- add / accumulate
 * V elements a thread: a 16-byte pack where the length and the pointers allow (ew_launch), else one. */

template <typename T, int V>
__global__ void add_kernel(int64_t groups, const T *a, const T *b, T *y)
{
    ptl_wait_prior();
    typedef ptl_pack<T, V> P;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const P pa = reinterpret_cast<const P *>(a)[i], pb = reinterpret_cast<const P *>(b)[i];
        P py;
#pragma unroll
        for (int k = 0; k < V; k++)
            ptl_st(&py.v[k], ptl_ld(&pa.v[k]) + ptl_ld(&pb.v[k]));
        reinterpret_cast<P *>(y)[i] = py;
    }
}

/* y += x; its own kernel so that profiles tell gradient accumulation from the forward's adds. */
template <typename T, int V>
__global__ void accumulate_kernel(int64_t groups, const T *x, T *y)
{
    ptl_wait_prior();
    typedef ptl_pack<T, V> P;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const P px = reinterpret_cast<const P *>(x)[i];
        P py = reinterpret_cast<const P *>(y)[i];
#pragma unroll
        for (int k = 0; k < V; k++)
            ptl_st(&py.v[k], ptl_ld(&py.v[k]) + ptl_ld(&px.v[k]));
        reinterpret_cast<P *>(y)[i] = py;
    }
}

/* kernel<T, V> over n elements on ctx's stream, in a PTL_LAYER_DISPATCH: V = a 16-byte pack's elements where n
 * and the pointers p0..p2 allow, else 1. */
#define EW_LAUNCH(kernel, n, p0, p1, p2, ...)                                                                    \
    do {                                                                                                         \
        constexpr int vv_ = 16 / sizeof(T);                                                                      \
        if (ptl_vec_ok(n, vv_, p0, p1, p2))                                                                     \
            ptl_launch(kernel<T, vv_>, ptl_grid_for((n) / vv_, 256), 256, 0, ctx->stream, (n) / vv_, __VA_ARGS__); \
        else                                                                                                     \
            ptl_launch(kernel<T, 1>, ptl_grid_for(n, 256), 256, 0, ctx->stream, n, __VA_ARGS__);                 \
    } while (0)

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
    PTL_LAYER_DISPATCH("add_cuda", dt, EW_LAUNCH(add_kernel, n, a, b, y, (const T *)a, (const T *)b, (T *)y));
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
    PTL_LAYER_DISPATCH("accumulate_cuda", dt, EW_LAUNCH(accumulate_kernel, n, x, y, y, (const T *)x, (T *)y));
    PTL_LAUNCH_CHECK("accumulate_kernel");
    return 0;
fail:
    return -1;
}
