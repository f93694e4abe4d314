/* The executor's own copies on CUDA (../nn/weight_cast.h): the per-forward cast of every conv weight
 * and bias (float32 OIHW -> compute-dtype OHWI) in one launch, its reverse for the gradients (added in
 * float32), and the head output copies. Every element is written by exactly one thread, with no
 * atomics, so results are bitwise reproducible. */
#include "../nn/weight_cast.h"
#include "layers_common.cuh"

#define NET_THREADS 256
#define WCAST_BATCH 4

/* A block's loop over its tile's elements in the master's order (copy 0) or the copy's, WCAST_BATCH a thread
 * at once, every load of a batch issued before any is used (a load's latency bounds these small kernels); each
 * thread walks its elements' coordinates (ptl_wcast_pos_add). load(i, p) reads the value of element i at p,
 * store(i, p, v) writes it. */
template <typename Load, typename Store>
__device__ __forceinline__ void wcast_tile_loop(const ptl_wcast_tile *t, int copy, Load load, Store store)
{
    constexpr int B = WCAST_BATCH;
    const int size = ptl_wcast_tile_size(t);
    const ptl_wcast_pos stride = ptl_wcast_tile_at(t, PTL_WCAST_THREADS, copy);
    ptl_wcast_pos p = ptl_wcast_tile_at(t, threadIdx.x, copy);
    for (int i0 = threadIdx.x; i0 < size; i0 += B * PTL_WCAST_THREADS) {
        float v[B];
        ptl_wcast_pos at[B];
#pragma unroll
        for (int u = 0; u < B; u++) {
            at[u] = p;
            if (i0 + u * PTL_WCAST_THREADS < size)
                v[u] = load(i0 + u * PTL_WCAST_THREADS, p);
            ptl_wcast_pos_add(t, copy, &p, &stride);
        }
#pragma unroll
        for (int u = 0; u < B; u++)
            if (i0 + u * PTL_WCAST_THREADS < size)
                store(i0 + u * PTL_WCAST_THREADS, at[u], v[u]);
    }
}

__device__ __forceinline__ int wcast_slot(const ptl_wcast_tile *t, ptl_wcast_pos p)
{
    return ptl_wcast_tile_slot(t, p.r, p.c, p.tap);
}

/* One block a tile (weight_cast.h). A tile whose layouts agree is a straight copy; any other is read into
 * shared memory in the master's order and written out in the copy's, so both are consecutive across a warp. In
 * the master's order element i lies at t.src + i (ptl_net_wcast_check checks it). */
template <typename T>
__global__ void __launch_bounds__(PTL_WCAST_THREADS)
    weight_cast_kernel(const ptl_wcast_tile *__restrict__ tiles, const float *__restrict__ src, T *__restrict__ dst)
{
    ptl_wait_prior();
    __shared__ float stage[PTL_WCAST_STAGE];
    const ptl_wcast_tile t = tiles[blockIdx.x];
    if (t.kk == 1) {
        for (int i = threadIdx.x; i < t.nc; i += PTL_WCAST_THREADS)
            ptl_st(dst + t.dst + i, src[t.src + i]);
        return;
    }
    wcast_tile_loop(
        &t, 0, [&](int i, ptl_wcast_pos) { return src[t.src + i]; },
        [&](int, ptl_wcast_pos p, float v) { stage[wcast_slot(&t, p)] = v; });
    __syncthreads();
    wcast_tile_loop(
        &t, 1, [&](int, ptl_wcast_pos p) { return stage[wcast_slot(&t, p)]; },
        [&](int, ptl_wcast_pos p, float v) { ptl_st(dst + ptl_wcast_tile_dst(&t, p.r, p.c, p.tap), v); });
}

/* The reverse: the copy's gradient staged in its own order (each element cleared once read), then each master
 * element's one addition in the master's order (the master's value and the addend both read before the batch's
 * writes). */
template <typename T>
__global__ void __launch_bounds__(PTL_WCAST_THREADS)
    weight_grad_kernel(const ptl_wcast_tile *__restrict__ tiles, T *__restrict__ g, float *__restrict__ grad)
{
    ptl_wait_prior();
    __shared__ float stage[PTL_WCAST_STAGE];
    const ptl_wcast_tile t = tiles[blockIdx.x];
    if (t.kk == 1) {
        for (int i = threadIdx.x; i < t.nc; i += PTL_WCAST_THREADS) {
            grad[t.src + i] += ptl_ld(g + t.dst + i);
            ptl_st(g + t.dst + i, 0.0f);
        }
        return;
    }
    wcast_tile_loop(
        &t, 1, [&](int, ptl_wcast_pos p) { return ptl_ld(g + ptl_wcast_tile_dst(&t, p.r, p.c, p.tap)); },
        [&](int, ptl_wcast_pos p, float v) {
            stage[wcast_slot(&t, p)] = v;
            ptl_st(g + ptl_wcast_tile_dst(&t, p.r, p.c, p.tap), 0.0f);
        });
    __syncthreads();
    wcast_tile_loop(
        &t, 0, [&](int i, ptl_wcast_pos p) { return grad[t.src + i] + stage[wcast_slot(&t, p)]; },
        [&](int i, ptl_wcast_pos, float v) { grad[t.src + i] = v; });
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
                       ptl_launch(weight_cast_kernel<T>, t->ntiles, PTL_WCAST_THREADS, 0, ctx->stream, t->tiles,
                                  (const float *)params, (T *)wc));
    PTL_LAUNCH_CHECK("weight_cast_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_net_weight_grad_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, const ptl_wcast_table *t, void *g,
                                        void *grads)
{
    if (t->ntiles <= 0)
        return 0;
    PTL_LAYER_DISPATCH("network weight gradient", dt,
                       ptl_launch(weight_grad_kernel<T>, t->ntiles, PTL_WCAST_THREADS, 0, ctx->stream, t->tiles,
                                  (T *)g, (float *)grads));
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
