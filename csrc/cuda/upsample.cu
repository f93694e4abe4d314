/* Nearest x2 upsampling, NHWC (CUDA), the semantics of ../nn/upsample.h. The backward sums each 2x2
 * block in the CPU's order, ((a + b) + c) + d, so float32 results match it bit for bit. Each thread moves
 * V channels of a pixel (ptl_pack) when every width, stride and pointer allows, else one. */
#include "../nn/upsample.h"
#include "../nn/cpu_check.h"
#include "layers_common.cuh"

/* groups: output pixels times cg = c / V; pixels of x are ldx / V packs apart, of y ldy / V */
template <typename T, int V>
__global__ void up_fwd_kernel(int64_t groups, int h, int w, int cg, const T *x, int ldx, T *y, int ldy)
{
    ptl_wait_prior();
    typedef ptl_pack<T, V> P;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int W = 2 * w, H = 2 * h;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const int j = (int)(i % cg);
        const int64_t pix = i / cg;
        const int X = (int)(pix % W), Y = (int)((pix / W) % H);
        const int64_t b = pix / ((int64_t)W * H);
        const int64_t src = ((b * h + Y / 2) * w + X / 2) * ldx + j;
        reinterpret_cast<P *>(y)[pix * ldy + j] = reinterpret_cast<const P *>(x)[src];
    }
}

/* groups: input pixels times cg */
template <typename T, int V>
__global__ void up_bwd_kernel(int64_t groups, int h, int w, int cg, const T *dy, int ldy, T *dx, int ldx,
                              int accumulate)
{
    ptl_wait_prior();
    typedef ptl_pack<T, V> P;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t row = (int64_t)2 * w * ldy;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const int j = (int)(i % cg);
        const int64_t pix = i / cg;
        const int ix = (int)(pix % w);
        const int64_t r = pix / w; /* b * h + iy */
        const P *d0 = reinterpret_cast<const P *>(dy) + 2 * r * row + (int64_t)(2 * ix) * ldy + j, *d1 = d0 + row;
        const P a = d0[0], bb = d0[ldy], c = d1[0], d = d1[ldy];
        P *o = reinterpret_cast<P *>(dx) + pix * ldx + j;
        P out;
        if (accumulate)
            out = *o;
#pragma unroll
        for (int k = 0; k < V; k++) {
            const float s = ((ptl_ld(&a.v[k]) + ptl_ld(&bb.v[k])) + ptl_ld(&c.v[k])) + ptl_ld(&d.v[k]);
            ptl_st(&out.v[k], accumulate ? ptl_ld(&out.v[k]) + s : s);
        }
        *o = out;
    }
}

template <typename T, int V>
static void up_fwd_launch(cudaStream_t st, int n, int h, int w, int c, const T *x, int ldx, T *y, int ldy)
{
    const int64_t groups = (int64_t)n * 4 * h * w * (c / V);
    ptl_launch(up_fwd_kernel<T, V>, ptl_grid_for(groups, 256), 256, 0, st, groups, h, w, c / V, x, ldx / V, y,
               ldy / V);
}

template <typename T, int V>
static void up_bwd_launch(cudaStream_t st, int n, int h, int w, int c, const T *dy, int ldy, T *dx, int ldx,
                          int accumulate)
{
    const int64_t groups = (int64_t)n * h * w * (c / V);
    ptl_launch(up_bwd_kernel<T, V>, ptl_grid_for(groups, 256), 256, 0, st, groups, h, w, c / V, dy, ldy / V, dx,
               ldx / V, accumulate);
}

extern "C" int ptl_upsample2x_forward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c,
                                           const void *x, int ldx, void *y, int ldy)
{
    if (ptl_nn_check_pixels("upsample2x_forward_cuda", n, h, w, c, ldx, ldy))
        return -1;
    PTL_LAYER_DISPATCH("upsample2x_forward_cuda", dt, {
        constexpr int V = 16 / sizeof(T);
        if (ptl_vec_ok(c | ldx | ldy, V, x, y, y))
            up_fwd_launch<T, V>(ctx->stream, n, h, w, c, (const T *)x, ldx, (T *)y, ldy);
        else
            up_fwd_launch<T, 1>(ctx->stream, n, h, w, c, (const T *)x, ldx, (T *)y, ldy);
    });
    PTL_LAUNCH_CHECK("up_fwd_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_upsample2x_backward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c,
                                            const void *dy, int ldy, void *dx, int ldx, int accumulate)
{
    if (ptl_nn_check_pixels("upsample2x_backward_cuda", n, h, w, c, ldx, ldy))
        return -1;
    PTL_LAYER_DISPATCH("upsample2x_backward_cuda", dt, {
        constexpr int V = 16 / sizeof(T);
        if (ptl_vec_ok(c | ldx | ldy, V, dy, dx, dx))
            up_bwd_launch<T, V>(ctx->stream, n, h, w, c, (const T *)dy, ldy, (T *)dx, ldx, accumulate);
        else
            up_bwd_launch<T, 1>(ctx->stream, n, h, w, c, (const T *)dy, ldy, (T *)dx, ldx, accumulate);
    });
    PTL_LAUNCH_CHECK("up_bwd_kernel");
    return 0;
fail:
    return -1;
}
