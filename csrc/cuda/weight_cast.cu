/* The executor's own copies on CUDA (../nn/weight_cast.h): the per-forward cast of every conv weight
 * and bias (float32 OIHW -> compute-dtype OHWI) in one launch, its reverse for the gradients (added in
 * float32), and the head output copies. Every element is written by exactly one thread, with no
 * atomics, so results are bitwise reproducible. */
#include "../nn/weight_cast.h"
#include "layers_common.cuh"

#define NET_THREADS 256
#define WCAST_THREADS 256
#define WCAST_BATCH 4

/* A block's loop over its tile's `size` elements, WCAST_BATCH a thread at once, every load of a batch issued
 * before any is used (a load's latency, not bandwidth, bounds these small kernels). load(i) reads element i's
 * value, store(i, v) writes it. */
template <typename Load, typename Store>
__device__ __forceinline__ void wcast_tile_loop(int size, Load load, Store store)
{
    constexpr int B = WCAST_BATCH;
    for (int i0 = threadIdx.x; i0 < size; i0 += B * blockDim.x) {
        float v[B];
#pragma unroll
        for (int u = 0; u < B; u++)
            if (i0 + u * (int)blockDim.x < size)
                v[u] = load(i0 + u * (int)blockDim.x);
#pragma unroll
        for (int u = 0; u < B; u++)
            if (i0 + u * (int)blockDim.x < size)
                store(i0 + u * (int)blockDim.x, v[u]);
    }
}

/* The tile's element (r, c, tap), its i-th in the given order. In the master's order element i lies at
 * t->src + i (ptl_net_wcast_check checks it); only its staging slot needs the coordinates. */
__device__ __forceinline__ int wcast_slot(const ptl_wcast_tile *t, int i, int copy)
{
    int r, c, tap;
    ptl_wcast_tile_at(t, i, copy, &r, &c, &tap);
    return ptl_wcast_tile_slot(t, r, c, tap);
}

__device__ __forceinline__ int64_t wcast_dst(const ptl_wcast_tile *t, int i)
{
    int r, c, tap;
    ptl_wcast_tile_at(t, i, 1, &r, &c, &tap);
    return ptl_wcast_tile_dst(t, r, c, tap);
}

/* One block a tile (weight_cast.h). A tile whose layouts agree is a straight copy; any other is read into
 * shared memory in the master's order and written out in the copy's, so both are consecutive across a warp. */
template <typename T>
__global__ void __launch_bounds__(WCAST_THREADS)
    weight_cast_kernel(const ptl_wcast_tile *__restrict__ tiles, const float *__restrict__ src, T *__restrict__ dst)
{
    ptl_wait_prior();
    __shared__ float stage[PTL_WCAST_STAGE];
    const ptl_wcast_tile t = tiles[blockIdx.x];
    const int size = ptl_wcast_tile_size(&t);
    if (t.kk == 1) {
        wcast_tile_loop(
            size, [&](int i) { return src[t.src + i]; }, [&](int i, float v) { ptl_st(dst + t.dst + i, v); });
        return;
    }
    wcast_tile_loop(
        size, [&](int i) { return src[t.src + i]; }, [&](int i, float v) { stage[wcast_slot(&t, i, 0)] = v; });
    __syncthreads();
    wcast_tile_loop(
        size, [&](int i) { return stage[wcast_slot(&t, i, 1)]; },
        [&](int i, float v) { ptl_st(dst + wcast_dst(&t, i), v); });
}

/* The reverse: the copy's gradient staged in its own order, then each master element's one addition in the
 * master's order (the master's value and the addend both read before the batch's writes). */
template <typename T>
__global__ void __launch_bounds__(WCAST_THREADS)
    weight_grad_kernel(const ptl_wcast_tile *__restrict__ tiles, const T *__restrict__ g, float *__restrict__ grad)
{
    ptl_wait_prior();
    __shared__ float stage[PTL_WCAST_STAGE];
    const ptl_wcast_tile t = tiles[blockIdx.x];
    const int size = ptl_wcast_tile_size(&t);
    if (t.kk == 1) {
        wcast_tile_loop(
            size, [&](int i) { return grad[t.src + i] + ptl_ld(g + t.dst + i); },
            [&](int i, float v) { grad[t.src + i] = v; });
        return;
    }
    wcast_tile_loop(
        size, [&](int i) { return ptl_ld(g + wcast_dst(&t, i)); },
        [&](int i, float v) { stage[wcast_slot(&t, i, 1)] = v; });
    __syncthreads();
    wcast_tile_loop(
        size, [&](int i) { return grad[t.src + i] + stage[wcast_slot(&t, i, 0)]; },
        [&](int i, float v) { grad[t.src + i] = v; });
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

extern "C" int ptl_net_weight_cast_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, const ptl_wcast_table *t,
                                        const void *params, void *wc)
{
    if (t->ntiles <= 0)
        return 0;
    PTL_LAYER_DISPATCH("network weight cast", dt,
                       ptl_launch(weight_cast_kernel<T>, t->ntiles, WCAST_THREADS, 0, ctx->stream, t->tiles,
                                  (const float *)params, (T *)wc));
    PTL_LAUNCH_CHECK("weight_cast_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_net_weight_grad_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, const ptl_wcast_table *t, const void *g,
                                        void *grads)
{
    if (t->ntiles <= 0)
        return 0;
    PTL_LAYER_DISPATCH("network weight gradient", dt,
                       ptl_launch(weight_grad_kernel<T>, t->ntiles, WCAST_THREADS, 0, ctx->stream, t->tiles,
                                  (const T *)g, (float *)grads));
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
