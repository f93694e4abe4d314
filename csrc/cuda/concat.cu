/* Channel-slice copy / accumulate between (m, *) row tensors (CUDA): concat, split and their backwards
 * (../nn/concat.h). */
#include "../nn/concat.h"
#include "layers_common.cuh"

template <typename T>
__global__ void channel_copy_kernel(int64_t total, int c, const T *src, int src_c, T *dst, int dst_c,
                                    int accumulate)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int64_t r = i / c;
        const int j = (int)(i % c);
        const T *s = src + r * src_c + j;
        T *d = dst + r * dst_c + j;
        if (accumulate)
            ptl_st(d, ptl_ld(d) + ptl_ld(s));
        else
            *d = *s;
    }
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
    PTL_LAYER_DISPATCH("channel_copy_cuda", dt,
                       channel_copy_kernel<T><<<ptl_grid_for(total, 256), 256, 0, ctx->stream>>>(
                           total, c, (const T *)src + src_off, src_c, (T *)dst + dst_off, dst_c, accumulate));
    PTL_LAUNCH_CHECK("channel_copy_kernel");
    return 0;
fail:
    return -1;
}
