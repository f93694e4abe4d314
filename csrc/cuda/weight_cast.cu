/* The executor's own copies on CUDA (../nn/weight_cast.h): the per-forward cast of every conv weight
 * and bias (float32 OIHW -> compute-dtype OHWI) in one launch, its reverse for the gradients (added in
 * float32), and the head output copies. Every element is written by exactly one thread, with no
 * atomics, so results are bitwise reproducible. */
#include "../nn/weight_cast.h"
#include "layers_common.cuh"

#define NET_THREADS 256

template <typename T>
__global__ void weight_cast_kernel(const ptl_wcast_entry *tab, int n, int64_t total, const float *src, T *dst)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const ptl_wcast_entry *e = tab + ptl_wcast_find(tab, n, i);
        const int64_t s = ptl_wcast_src(e, i - e->dst);
        if (s >= 0)
            ptl_st(dst + i, src[s]);
    }
}

template <typename T>
__global__ void weight_grad_kernel(const ptl_wcast_entry *tab, int n, int64_t total, const T *g, float *grad)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const ptl_wcast_entry *e = tab + ptl_wcast_find(tab, n, i);
        const int64_t s = ptl_wcast_src(e, i - e->dst);
        if (s >= 0)
            grad[s] += ptl_ld(g + i);
    }
}

template <typename T>
__global__ void head_out_kernel(int64_t total, int64_t hw, int C, int64_t A, int64_t a0, const T *map, float *out)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        out[ptl_net_head_index(i, hw, C, A, a0)] = ptl_ld(map + i);
    }
}

template <typename T>
__global__ void head_grad_kernel(int64_t total, int64_t hw, int C, int64_t A, int64_t a0, const float *d_out, T *gmap,
                                 int accumulate)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const float d = d_out[ptl_net_head_index(i, hw, C, A, a0)];
        ptl_st(gmap + i, accumulate ? ptl_ld(gmap + i) + d : d);
    }
}

extern "C" int ptl_net_weight_cast_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, const ptl_wcast_entry *tab, int n,
                                        int64_t total, const void *params, void *wc)
{
    cudaStream_t stream = ctx->stream;
    if (total <= 0 || n <= 0)
        return 0;
    PTL_LAYER_DISPATCH("network weight cast", dt,
                       ptl_launch(weight_cast_kernel<T>, ptl_grid_for(total, NET_THREADS), NET_THREADS, 0, stream, tab,
                                  n, total, (const float *)params, (T *)wc));
    PTL_LAUNCH_CHECK("weight_cast_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_net_weight_grad_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, const ptl_wcast_entry *tab, int n,
                                        int64_t total, const void *g, void *grads)
{
    cudaStream_t stream = ctx->stream;
    if (total <= 0 || n <= 0)
        return 0;
    PTL_LAYER_DISPATCH("network weight gradient", dt,
                       ptl_launch(weight_grad_kernel<T>, ptl_grid_for(total, NET_THREADS), NET_THREADS, 0, stream, tab,
                                  n, total, (const T *)g, (float *)grads));
    PTL_LAUNCH_CHECK("weight_grad_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_net_head_out_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int B, int64_t hw, int C, int64_t A,
                                     int64_t a0, const void *map, void *out)
{
    cudaStream_t stream = ctx->stream;
    const int64_t total = (int64_t)B * hw * C;
    if (total <= 0)
        return 0;
    PTL_LAYER_DISPATCH("network head output", dt,
                       ptl_launch(head_out_kernel<T>, ptl_grid_for(total, NET_THREADS), NET_THREADS, 0, stream, total,
                                  hw, C, A, a0, (const T *)map, (float *)out));
    PTL_LAUNCH_CHECK("head_out_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_net_head_grad_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int B, int64_t hw, int C, int64_t A,
                                      int64_t a0, const void *d_out, void *gmap, int accumulate)
{
    cudaStream_t stream = ctx->stream;
    const int64_t total = (int64_t)B * hw * C;
    if (total <= 0)
        return 0;
    PTL_LAYER_DISPATCH("network head gradient", dt,
                       ptl_launch(head_grad_kernel<T>, ptl_grid_for(total, NET_THREADS), NET_THREADS, 0, stream, total,
                                  hw, C, A, a0, (const float *)d_out, (T *)gmap, accumulate));
    PTL_LAUNCH_CHECK("head_grad_kernel");
    return 0;
fail:
    return -1;
}
