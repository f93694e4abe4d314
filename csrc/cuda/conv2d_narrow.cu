/* Direct kernels for 3x3 ungrouped convolutions with few input channels (conv2d_narrow.h). Weights are OHWI:
 * w[co * TAPS + (ky * 3 + kx) * CIN + ci], TAPS = 9 * CIN. */
#include "conv2d_narrow.h"
#include "layers_common.cuh"

#define NARROW_K 3

/* One thread per (R consecutive output pixels, V output channels): per tap and input channel it loads R inputs
 * and V weights and does R * V products, so that loads do not bound it. The weights wait in shared memory as
 * floats, tap-major ([tap][co]), read 16 bytes at a time. An input outside the image adds 0 * w. PACK: y's
 * rows take V-element stores (16-byte aligned), else element by element. */
template <typename T, typename I, int CIN, int V, int R, bool PACK>
__global__ void narrow_forward_kernel(I items, I pixels, ptl_conv2d_desc d, const T *x, const T *w, T *y)
{
    ptl_wait_prior();
    static_assert(V % 4 == 0, "V output channels: whole float4 loads of the weights");
    constexpr int TAPS = NARROW_K * NARROW_K * CIN;
    __shared__ __align__(16) float ws[NARROW_K * NARROW_K * PTL_NARROW_MAX_CIN * PTL_NARROW_MAX_COUT];
    for (int i = threadIdx.x; i < TAPS * d.cout; i += blockDim.x)
        ws[(i % TAPS) * d.cout + i / TAPS] = ptl_ld(w + i);
    __syncthreads();
    typedef ptl_pack<T, V> P;
    const I stride = (I)gridDim.x * blockDim.x;
    const int cg = d.cout / V;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += stride) {
        const int co0 = (int)(i % cg) * V;
        const I p0 = i / cg * R;
        int iy0[R], ix0[R];
        I base[R]; /* the image's first element */
#pragma unroll
        for (int r = 0; r < R; r++) {
            I pix = p0 + r < pixels ? p0 + r : p0;
            const int ox = (int)(pix % d.wo);
            pix /= d.wo;
            iy0[r] = (int)(pix % d.ho) * d.stride - d.pad;
            ix0[r] = ox * d.stride - d.pad;
            base[r] = pix / d.ho * d.h * d.w;
        }
        float acc[R][V];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int k = 0; k < V; k++)
                acc[r][k] = 0.0f;
#pragma unroll
        for (int ky = 0; ky < NARROW_K; ky++)
#pragma unroll
            for (int kx = 0; kx < NARROW_K; kx++)
#pragma unroll
                for (int ci = 0; ci < CIN; ci++) {
                    float xv[R];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const int iy = iy0[r] + ky, ix = ix0[r] + kx;
                        xv[r] = iy >= 0 && iy < d.h && ix >= 0 && ix < d.w
                                    ? ptl_ld(x + (base[r] + (I)iy * d.w + ix) * CIN + ci)
                                    : 0.0f;
                    }
                    const float *wr = ws + ((ky * NARROW_K + kx) * CIN + ci) * d.cout + co0;
                    float wv[V];
#pragma unroll
                    for (int k = 0; k < V; k += 4) { /* 16-byte aligned: cout and co0 are multiples of V */
                        const float4 q = reinterpret_cast<const float4 *>(wr + k)[0];
                        wv[k] = q.x, wv[k + 1] = q.y, wv[k + 2] = q.z, wv[k + 3] = q.w;
                    }
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int k = 0; k < V; k++)
                            acc[r][k] += xv[r] * wv[k];
                }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (p0 + r >= pixels)
                break;
            T *out = y + (p0 + r) * d.cout + co0;
            if (PACK) {
                P yv;
#pragma unroll
                for (int k = 0; k < V; k++)
                    ptl_st(&yv.v[k], acc[r][k]);
                reinterpret_cast<P *>(out)[0] = yv;
            } else {
#pragma unroll
                for (int k = 0; k < V; k++)
                    ptl_st(out + k, acc[r][k]);
            }
        }
    }
}

/* Runs `body` with the compile-time input channel count CIN of d (1 .. PTL_NARROW_MAX_CIN). */
#define NARROW_CIN_DISPATCH(d, ...)                                                                               \
    do {                                                                                                          \
        switch ((d)->cin) {                                                                                       \
        case 1: {                                                                                                 \
            constexpr int CIN = 1;                                                                                \
            __VA_ARGS__;                                                                                          \
        } break;                                                                                                  \
        case 2: {                                                                                                 \
            constexpr int CIN = 2;                                                                                \
            __VA_ARGS__;                                                                                          \
        } break;                                                                                                  \
        case 3: {                                                                                                 \
            constexpr int CIN = 3;                                                                                \
            __VA_ARGS__;                                                                                          \
        } break;                                                                                                  \
        default: {                                                                                                \
            constexpr int CIN = 4;                                                                                \
            __VA_ARGS__;                                                                                          \
        } break;                                                                                                  \
        }                                                                                                         \
    } while (0)

extern "C" int ptl_conv2d_narrow_takes(const ptl_conv2d_desc *d)
{
    return d->k == NARROW_K && d->groups == 1 && d->cin >= 1 && d->cin <= PTL_NARROW_MAX_CIN &&
           d->cout <= PTL_NARROW_MAX_COUT && d->cout % 8 == 0;
}

/* Output pixels a forward thread computes. */
#define NARROW_R 4

extern "C" int ptl_conv2d_narrow_forward(cudaStream_t stream, const char *fn, ptl_dtype dt, const ptl_conv2d_desc *d,
                                         const void *x, const void *w, void *y)
{
    const int64_t pixels = (int64_t)d->n * d->ho * d->wo;
    const int i32 = ptl_conv2d_int32_ok(d);
    PTL_LAYER_DISPATCH(fn, dt, NARROW_CIN_DISPATCH(d, {
        constexpr int V = 16 / sizeof(T); /* divides cout (ptl_conv2d_narrow_takes) */
        const int64_t n = (pixels + NARROW_R - 1) / NARROW_R * (d->cout / V);
        const T *xt = (const T *)x, *wt = (const T *)w;
        T *yt = (T *)y;
        if (i32 && ptl_aligned16(y, y, y))
            ptl_launch(narrow_forward_kernel<T, int, CIN, V, NARROW_R, true>, ptl_grid_for(n, 256), 256, 0, stream,
                       (int)n, (int)pixels, *d, xt, wt, yt);
        else if (i32)
            ptl_launch(narrow_forward_kernel<T, int, CIN, V, NARROW_R, false>, ptl_grid_for(n, 256), 256, 0, stream,
                       (int)n, (int)pixels, *d, xt, wt, yt);
        else
            ptl_launch(narrow_forward_kernel<T, int64_t, CIN, V, NARROW_R, false>, ptl_grid_for(n, 256), 256, 0,
                       stream, n, pixels, *d, xt, wt, yt);
    }));
    PTL_LAUNCH_CHECK("narrow_forward_kernel");
    return 0;
fail:
    return -1;
}
