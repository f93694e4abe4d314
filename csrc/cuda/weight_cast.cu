/* The executor's own copies on CUDA (../nn/weight_cast.h): the per-forward cast of every conv weight
 * and bias (float32 OIHW -> compute-dtype OHWI) in one launch, its reverse for the gradients (added in
 * float32), and the head output copies. Every element is written by exactly one thread, with no
 * atomics, so results are bitwise reproducible. */
#include "../nn/weight_cast.h"
#include "layers_common.cuh"

#define NET_THREADS 256

/* Each thread of the weight kernels takes runs of V = 16 / sizeof(T) consecutive elements (ptl_wcast_walk: one
 * table search a run). wcast_run gives a run's master and copy offsets (-1: past the copy's end, or padding),
 * walked in the copy's order or (oihw) the master's. */
template <int V>
__device__ __forceinline__ void wcast_run(const ptl_wcast_entry *tab, int n, int64_t total, int64_t i0, int oihw,
                                          int64_t *s, int64_t *d)
{
    static_assert(V <= PTL_WCAST_RUN && V % 4 == 0, "ptl_net_wcast_check walks runs of this length");
    ptl_wcast_walk w;
    ptl_wcast_walk_at(&w, tab, n, i0, oihw);
#pragma unroll
    for (int u = 0; u < V; u++) {
        const bool in = i0 + u < total;
        s[u] = in ? ptl_wcast_walk_src(&w) : -1;
        d[u] = in ? ptl_wcast_walk_dst(&w) : -1;
        ptl_wcast_walk_next(&w);
    }
}

/* In the copy's order, a run stored as one 16-byte access where it lies in one record and `vec` (the copy
 * 16-byte aligned) allows. */
template <typename T>
__global__ void weight_cast_kernel(const ptl_wcast_entry *tab, int n, int64_t total, const float *src, T *dst, int vec)
{
    ptl_wait_prior();
    constexpr int V = 16 / sizeof(T);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x * V;
    for (int64_t i0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V; i0 < total; i0 += stride) {
        int64_t s[V], d[V];
        wcast_run<V>(tab, n, total, i0, 0, s, d);
        ptl_pack<T, V> out;
        unsigned ok = 0;
#pragma unroll
        for (int u = 0; u < V; u++)
            if (s[u] >= 0) {
                ptl_st(&out.v[u], src[s[u]]);
                ok |= 1u << u;
            }
        if (vec && ok == (1u << V) - 1)
            *reinterpret_cast<ptl_pack<T, V> *>(dst + i0) = out;
        else
#pragma unroll
            for (int u = 0; u < V; u++)
                if (ok >> u & 1)
                    dst[i0 + u] = out.v[u]; /* d[u], in the copy's order */
    }
}

/* The reverse, in the master's order (a run's read-add-writes consecutive, the copy's elements gathered): each
 * master element receives its one addition. */
template <typename T>
__global__ void weight_grad_kernel(const ptl_wcast_entry *tab, int n, int64_t total, const T *g, float *grad)
{
    ptl_wait_prior();
    constexpr int V = 16 / sizeof(T);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x * V;
    for (int64_t i0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V; i0 < total; i0 += stride) {
        int64_t s[V], d[V];
        float acc[V], add[V];
        wcast_run<V>(tab, n, total, i0, 1, s, d);
        /* every read before any write, so that they are in flight together (the run's elements are distinct) */
#pragma unroll
        for (int u = 0; u < V; u++)
            if (s[u] >= 0) {
                acc[u] = grad[s[u]];
                add[u] = ptl_ld(g + d[u]);
            }
#pragma unroll
        for (int u = 0; u < V; u++)
            if (s[u] >= 0)
                grad[s[u]] = acc[u] + add[u];
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

/* The kernels' runs over a copy of `total` elements: 16 bytes each. */
static int64_t runs(int64_t total, ptl_dtype dt)
{
    const int64_t v = 16 / (int64_t)ptl_dtype_size(dt);
    return (total + v - 1) / v;
}

extern "C" int ptl_net_weight_cast_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, const ptl_wcast_entry *tab, int n,
                                        int64_t total, const void *params, void *wc)
{
    cudaStream_t stream = ctx->stream;
    if (total <= 0 || n <= 0)
        return 0;
    PTL_LAYER_DISPATCH("network weight cast", dt,
                       ptl_launch(weight_cast_kernel<T>, ptl_grid_for(runs(total, dt), NET_THREADS), NET_THREADS, 0,
                                  stream, tab, n, total, (const float *)params, (T *)wc,
                                  ptl_aligned16(wc, NULL, NULL)));
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
                       ptl_launch(weight_grad_kernel<T>, ptl_grid_for(runs(total, dt), NET_THREADS), NET_THREADS, 0,
                                  stream, tab, n, total, (const T *)g, (float *)grads));
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
