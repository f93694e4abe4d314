/* Channel-slice copy / accumulate between (m, *) row tensors (CUDA): concat, split and their backwards
 * (../nn/concat.h). */
#include "../nn/concat.h"
#include "layers_common.cuh"

/* V elements per thread (ptl_pack), indexing with I = int when the element count fits. */
template <typename T, typename I, int V>
__global__ void channel_copy_kernel(I groups, int cg, const T *src, int src_cg, T *dst, int dst_cg, int accumulate)
{
    ptl_wait_prior();
    typedef ptl_pack<T, V> P;
    const I stride = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const I r = i / cg;
        const int j = (int)(i - r * cg);
        const P *s = reinterpret_cast<const P *>(src) + r * src_cg + j;
        P *d = reinterpret_cast<P *>(dst) + r * dst_cg + j;
        if (accumulate) {
            const P a = *s;
            P b = *d;
#pragma unroll
            for (int k = 0; k < V; k++)
                ptl_st(&b.v[k], ptl_ld(&b.v[k]) + ptl_ld(&a.v[k]));
            *d = b;
        } else {
            *d = *s;
        }
    }
}

template <typename T, int V>
static void channel_copy_launch(cudaStream_t st, int64_t m, int c, const T *src, int src_c, T *dst, int dst_c,
                                int accumulate)
{
    const int64_t groups = m * (c / V);
    const unsigned grid = ptl_grid_for(groups, 256);
    if (m * (int64_t)(src_c > dst_c ? src_c : dst_c) < INT32_MAX)
        ptl_launch(channel_copy_kernel<T, int, V>, grid, 256, 0, st, (int)groups, c / V, src, src_c / V, dst, dst_c / V,
                   accumulate);
    else
        ptl_launch(channel_copy_kernel<T, int64_t, V>, grid, 256, 0, st, groups, c / V, src, src_c / V, dst, dst_c / V,
                   accumulate);
}

extern "C" int ptl_channel_copy_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *src, int src_c,
                                     int src_off, void *dst, int dst_c, int dst_off, int accumulate)
{
    const int64_t total = m * c;
    const size_t es = ptl_dtype_size(dt);
    if (m < 0 || c < 0 || src_off < 0 || dst_off < 0 || src_off + c > src_c || dst_off + c > dst_c)
        return ptl_set_error(PTL_ERR_VALUE,
                             "channel_copy_cuda: slice out of range (c=%d, src %d+%d of %d, dst %d+%d of %d, m=%lld)",
                             c, src_off, c, src_c, dst_off, c, dst_c, (long long)m);
    if (total == 0)
        return 0;
    if (!accumulate && c == src_c && c == dst_c) {
        PTL_CUDA_TRY(cudaMemcpyAsync(dst, src, (size_t)total * es, cudaMemcpyDeviceToDevice, ctx->stream));
        return 0;
    }
    PTL_LAYER_DISPATCH("channel_copy_cuda", dt, {
        constexpr int V = 16 / sizeof(T);
        const T *s = (const T *)src + src_off;
        T *d = (T *)dst + dst_off;
        if (ptl_vec_ok(c | src_c | dst_c, V, s, d, d))
            channel_copy_launch<T, V>(ctx->stream, m, c, s, src_c, d, dst_c, accumulate);
        else
            channel_copy_launch<T, 1>(ctx->stream, m, c, s, src_c, d, dst_c, accumulate);
    });
    PTL_LAUNCH_CHECK("channel_copy_kernel");
    return 0;
fail:
    return -1;
}
