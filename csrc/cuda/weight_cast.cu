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

/* I: uint32_t where the map and the output have fewer than 2^32 elements (head_narrow), else int64_t. */
template <typename I>
__device__ __forceinline__ I head_index(I i, I hw, int C, I A, I a0);
template <>
__device__ __forceinline__ uint32_t head_index(uint32_t i, uint32_t hw, int C, uint32_t A, uint32_t a0)
{
    return ptl_net_head_index32(i, hw, C, A, a0);
}
template <>
__device__ __forceinline__ int64_t head_index(int64_t i, int64_t hw, int C, int64_t A, int64_t a0)
{
    return ptl_net_head_index(i, hw, C, A, a0);
}

template <typename T, typename I>
__global__ void head_out_kernel(I total, I hw, int C, I A, I a0, const T *map, float *out)
{
    ptl_wait_prior();
    const I stride = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride)
        out[head_index<I>(i, hw, C, A, a0)] = ptl_ld(map + i);
}

template <typename T, typename I>
__global__ void head_grad_kernel(I total, I hw, int C, I A, I a0, const float *d_out, T *gmap, int accumulate)
{
    ptl_wait_prior();
    const I stride = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const float d = d_out[head_index<I>(i, hw, C, A, a0)];
        ptl_st(gmap + i, accumulate ? ptl_ld(gmap + i) + d : d);
    }
}

/* 32-bit indices (ptl_net_head_fits32) with the grid's largest stride on top. */
static int head_narrow(int B, int64_t hw, int C, int64_t A)
{
    return ptl_net_head_fits32(B, hw, C, A, (int64_t)ptl_grid_for(INT64_MAX, NET_THREADS) * NET_THREADS);
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
    if (head_narrow(B, hw, C, A))
        PTL_LAYER_DISPATCH("network head output", dt,
                           ptl_launch(head_out_kernel<T, uint32_t>, ptl_grid_for(total, NET_THREADS), NET_THREADS, 0,
                                      stream, (uint32_t)total, (uint32_t)hw, C, (uint32_t)A, (uint32_t)a0,
                                      (const T *)map, (float *)out));
    else
        PTL_LAYER_DISPATCH("network head output", dt,
                           ptl_launch(head_out_kernel<T, int64_t>, ptl_grid_for(total, NET_THREADS), NET_THREADS, 0,
                                      stream, total, hw, C, A, a0, (const T *)map, (float *)out));
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
    if (head_narrow(B, hw, C, A))
        PTL_LAYER_DISPATCH("network head gradient", dt,
                           ptl_launch(head_grad_kernel<T, uint32_t>, ptl_grid_for(total, NET_THREADS), NET_THREADS, 0,
                                      stream, (uint32_t)total, (uint32_t)hw, C, (uint32_t)A, (uint32_t)a0,
                                      (const float *)d_out, (T *)gmap, accumulate));
    else
        PTL_LAYER_DISPATCH("network head gradient", dt,
                           ptl_launch(head_grad_kernel<T, int64_t>, ptl_grid_for(total, NET_THREADS), NET_THREADS, 0,
                                      stream, total, hw, C, A, a0, (const float *)d_out, (T *)gmap, accumulate));
    PTL_LAUNCH_CHECK("head_grad_kernel");
    return 0;
fail:
    return -1;
}
