/* Nearest x2 upsampling, NHWC (CUDA), the semantics of ../nn/upsample.h. The backward sums each 2x2
 * block in the CPU's order, ((a + b) + c) + d, so float32 results match it bit for bit. */
#include "../nn/upsample.h"
#include "layers_common.cuh"

template <typename T>
__global__ void up_fwd_kernel(int64_t total, int h, int w, int c, const T *x, T *y)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int W = 2 * w, H = 2 * h;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int ch = (int)(i % c);
        const int64_t pix = i / c;
        const int X = (int)(pix % W), Y = (int)((pix / W) % H);
        const int64_t b = pix / ((int64_t)W * H);
        y[i] = x[((b * h + Y / 2) * w + X / 2) * c + ch];
    }
}

template <typename T>
__global__ void up_bwd_kernel(int64_t total, int h, int w, int c, const T *dy, T *dx, int accumulate)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t row = (int64_t)2 * w * c;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int ch = (int)(i % c);
        const int64_t pix = i / c;
        const int ix = (int)(pix % w);
        const int64_t r = pix / w; /* b * h + iy */
        const T *d0 = dy + 2 * r * row, *d1 = d0 + row;
        const int64_t a = (int64_t)(2 * ix) * c + ch, bb = a + c;
        const float s = ((ptl_ld(d0 + a) + ptl_ld(d0 + bb)) + ptl_ld(d1 + a)) + ptl_ld(d1 + bb);
        ptl_st(dx + i, accumulate ? ptl_ld(dx + i) + s : s);
    }
}

static int check(const char *fn, int n, int h, int w, int c)
{
    if (n <= 0 || h <= 0 || w <= 0 || c <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "%s: sizes must be positive (n=%d h=%d w=%d c=%d)", fn, n, h, w, c);
    return 0;
}

extern "C" int ptl_upsample2x_forward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c,
                                           const void *x, void *y)
{
    const int64_t total = (int64_t)n * 4 * h * w * c;
    if (check("upsample2x_forward_cuda", n, h, w, c))
        return -1;
    PTL_LAYER_DISPATCH("upsample2x_forward_cuda", dt,
                       ptl_launch(up_fwd_kernel<T>, ptl_grid_for(total, 256), 256, 0, ctx->stream, total, h, w, c,
                                  (const T *)x, (T *)y));
    PTL_LAUNCH_CHECK("up_fwd_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_upsample2x_backward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c,
                                            const void *dy, void *dx, int accumulate)
{
    const int64_t total = (int64_t)n * h * w * c;
    if (check("upsample2x_backward_cuda", n, h, w, c))
        return -1;
    PTL_LAYER_DISPATCH("upsample2x_backward_cuda", dt,
                       ptl_launch(up_bwd_kernel<T>, ptl_grid_for(total, 256), 256, 0, ctx->stream, total, h, w, c,
                                  (const T *)dy, (T *)dx, accumulate));
    PTL_LAUNCH_CHECK("up_bwd_kernel");
    return 0;
fail:
    return -1;
}
