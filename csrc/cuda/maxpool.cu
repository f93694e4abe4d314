/* 5x5 stride-1 max-pool, padding 2, NHWC (CUDA), the semantics of ../nn/maxpool.h.
 *
 * Forward: a thread per output and 16 bytes of its channels (one channel where the widths do not allow),
 * the window scanned rows first and a value taking over only when strictly greater (or NaN), as on the
 * CPU. Backward: a gather instead of the CPU's scatter, with the same result bit for bit: each input sums,
 * in output scan order, the gradients of the outputs (of the up to 25 whose windows contain it) whose
 * first maximum it is, so no atomics are needed. The argmaxes are those a training forward kept (the executor's
 * kept bytes), or else are found first, into the layer scratch. */
#include <math.h>

#include "../nn/maxpool.h"
#include "../nn/cpu_check.h"
#include "layer_scratch.h"
#include "layers_common.cuh"

#define R (PTL_MAXPOOL_K / 2)

__device__ __forceinline__ int clampi(int i, int n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }

/* The grid-stride loop over one output's V channels and its 25-cell window, shared by the forward and the
 * argmax: pixels of x are ldx elements apart; a thread takes V channels of one output (16-byte loads where the
 * widths allow). Cells outside the image are read at a clamped position and passed with inside false, so the
 * window's 25 loads are issued at once instead of one by one. start() begins an output, cell(v, index, inside)
 * sees its cells' V channels in scan order (rows first), finish(pix, ch) ends it. */
template <typename T, int V, typename Start, typename Cell, typename Finish>
__device__ __forceinline__ void maxpool_windows(int64_t groups, int h, int w, int c, const T *x, int ldx, Start start,
                                                Cell cell, Finish finish)
{
    typedef ptl_pack<T, V> P;
    const int cg = c / V;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const int ch = (int)(i % cg) * V;
        const int64_t pix = i / cg;
        const int ox = (int)(pix % w), oy = (int)((pix / w) % h);
        const T *xb = x + pix / ((int64_t)w * h) * h * w * ldx + ch;
        start();
#pragma unroll
        for (int a = 0; a < PTL_MAXPOOL_K; a++) {
            const int iy = oy - R + a;
#pragma unroll
            for (int q = 0; q < PTL_MAXPOOL_K; q++) {
                const int ix = ox - R + q;
                const P v = *reinterpret_cast<const P *>(xb + ((int64_t)clampi(iy, h) * w + clampi(ix, w)) * ldx);
                cell(v, a * PTL_MAXPOOL_K + q, iy >= 0 && iy < h && ix >= 0 && ix < w);
            }
        }
        finish(pix, ch);
    }
}

/* The argmax rule of the CPU backward, one candidate at a time in scan order from best = -inf, at = -1: the first
 * strictly greater value, a NaN replacing a number. The rule's last case, the first cell inside the image where
 * nothing else wins (all of them -inf), is maxpool_argmax_or_first once the window is done, which keeps a test
 * out of the 25 cells' chain. */
__device__ __forceinline__ void maxpool_take_argmax(float f, int index, float &best, int &at)
{
    if (f > best || (f != f && best == best)) {
        best = f;
        at = index;
    }
}

__device__ __forceinline__ int maxpool_argmax_or_first(int at, int64_t pix, int h, int w)
{
    const int ox = (int)(pix % w), oy = (int)((pix / w) % h);
    return at >= 0 ? at : (oy < R ? R - oy : 0) * PTL_MAXPOOL_K + (ox < R ? R - ox : 0);
}

/* The forward; with ARG it also writes each output's argmax cell (as maxpool_argmax_kernel below) into arg, what
 * a training forward keeps for its backward, so that the backward is the gather alone. The argmax's value is then
 * the output, but for the NaN kept: the first of the window, where the forward keeps the last. A 2-byte store
 * rounds every NaN to the canonical one, so there the two are the same bits and only float keeps both. */
template <typename T, int V, bool ARG>
__global__ void maxpool_fwd_kernel(int64_t groups, int h, int w, int c, const T *x, int ldx, T *y, int ldy,
                                   uint8_t *arg)
{
    ptl_wait_prior();
    float best[V], first[V];
    int at[V];
    maxpool_windows<T, V>(
        groups, h, w, c, x, ldx,
        [&]() {
#pragma unroll
            for (int k = 0; k < V; k++) {
                best[k] = first[k] = -INFINITY;
                at[k] = -1;
            }
        },
        [&](const ptl_pack<T, V> &v, int index, bool inside) {
#pragma unroll
            for (int k = 0; k < V; k++) {
                const float f = ptl_ld(&v.v[k]);
                if (inside && (!ARG || sizeof(T) == 4) && (f > best[k] || f != f))
                    best[k] = f;
                if (ARG && inside)
                    maxpool_take_argmax(f, index, first[k], at[k]);
            }
        },
        [&](int64_t pix, int ch) {
            ptl_pack<T, V> out;
#pragma unroll
            for (int k = 0; k < V; k++)
                ptl_st(&out.v[k], ARG && sizeof(T) == 2 ? first[k] : best[k]);
            *reinterpret_cast<ptl_pack<T, V> *>(y + pix * ldy + ch) = out;
            if (ARG) {
                ptl_pack<uint8_t, V> a;
#pragma unroll
                for (int k = 0; k < V; k++)
                    a.v[k] = (uint8_t)maxpool_argmax_or_first(at[k], pix, h, w);
                *reinterpret_cast<ptl_pack<uint8_t, V> *>(arg + pix * c + ch) = a;
            }
        });
}

/* Backward, in two launches: the argmax of every output's window (its cell, 0..K*K-1 row-major, one byte a
 * channel, into the layer scratch; skipped where the forward kept them), then a gather: each input sums, in
 * output scan order, the gradients of the up to 25 outputs whose windows contain it and whose argmax is its
 * cell. The argmax follows maxpool_take_argmax's rule. Each launch is a thread per pixel and V
 * channels, as the forward: 9 + 5 us at yolo26n's SPPF (b4, 20x20x128, H100), where one kernel finding the
 * argmaxes of a tile and its halo in shared memory took 19 us, issue-bound on its index arithmetic. */
template <typename T, int V>
__global__ void maxpool_argmax_kernel(int64_t groups, int h, int w, int c, const T *x, int ldx, uint8_t *arg)
{
    ptl_wait_prior();
    float best[V];
    int at[V];
    maxpool_windows<T, V>(
        groups, h, w, c, x, ldx,
        [&]() {
#pragma unroll
            for (int k = 0; k < V; k++) {
                best[k] = -INFINITY;
                at[k] = -1;
            }
        },
        /* a cell outside is skipped whole: tested per channel instead, the kernel took 9.7 us, not 8.8 (H100) */
        [&](const ptl_pack<T, V> &v, int index, bool inside) {
            if (!inside)
                return;
#pragma unroll
            for (int k = 0; k < V; k++)
                maxpool_take_argmax(ptl_ld(&v.v[k]), index, best[k], at[k]);
        },
        [&](int64_t pix, int ch) {
            ptl_pack<uint8_t, V> out;
#pragma unroll
            for (int k = 0; k < V; k++)
                out.v[k] = (uint8_t)maxpool_argmax_or_first(at[k], pix, h, w);
            *reinterpret_cast<ptl_pack<uint8_t, V> *>(arg + pix * c + ch) = out;
        });
}

template <typename T, int V>
__global__ void maxpool_gather_kernel(int64_t groups, int h, int w, int c, const uint8_t *arg, const T *dy, int ldy,
                                      T *dx, int ldx, int accumulate)
{
    ptl_wait_prior();
    typedef ptl_pack<T, V> P;
    typedef ptl_pack<uint8_t, V> A;
    const int cg = c / V;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const int ch = (int)(i % cg) * V;
        const int64_t pix = i / cg, img = pix / ((int64_t)w * h) * h * w;
        const int ix = (int)(pix % w), iy = (int)((pix / w) % h);
        float s[V];
        if (accumulate) {
            const P d = *reinterpret_cast<const P *>(dx + pix * ldx + ch);
#pragma unroll
            for (int k = 0; k < V; k++)
                s[k] = ptl_ld(&d.v[k]);
        } else {
#pragma unroll
            for (int k = 0; k < V; k++)
                s[k] = 0.0f;
        }
        /* the outputs in scan order, loaded at a clamped position and taken only where inside and picking this
         * input, so the loads do not wait on the matches */
#pragma unroll
        for (int a = 0; a < PTL_MAXPOOL_K; a++) {
            const int oy = iy - R + a;
#pragma unroll
            for (int q = 0; q < PTL_MAXPOOL_K; q++) {
                const int ox = ix - R + q;
                const int64_t o = img + (int64_t)clampi(oy, h) * w + clampi(ox, w);
                const P g = *reinterpret_cast<const P *>(dy + o * ldy + ch);
                const A m = *reinterpret_cast<const A *>(arg + o * c + ch);
                const int cell = (PTL_MAXPOOL_K - 1 - a) * PTL_MAXPOOL_K + (PTL_MAXPOOL_K - 1 - q);
                const bool inside = oy >= 0 && oy < h && ox >= 0 && ox < w;
#pragma unroll
                for (int k = 0; k < V; k++)
                    if (inside && m.v[k] == cell)
                        s[k] += ptl_ld(&g.v[k]);
            }
        }
        P out;
#pragma unroll
        for (int k = 0; k < V; k++)
            ptl_st(&out.v[k], s[k]);
        *reinterpret_cast<P *>(dx + pix * ldx + ch) = out;
    }
}

/* One forward launch at V channels a thread, writing the argmaxes too where arg is given. */
template <typename T, int V>
static void maxpool_forward_launch(ptl_cuda_ctx *ctx, int64_t total, int h, int w, int c, const T *x, int ldx, T *y,
                                   int ldy, uint8_t *arg)
{
    if (arg)
        ptl_launch(maxpool_fwd_kernel<T, V, true>, ptl_grid_for(total / V, 256), 256, 0, ctx->stream, total / V, h, w,
                   c, x, ldx, y, ldy, arg);
    else
        ptl_launch(maxpool_fwd_kernel<T, V, false>, ptl_grid_for(total / V, 256), 256, 0, ctx->stream, total / V, h,
                   w, c, x, ldx, y, ldy, arg);
}

extern "C" int ptl_maxpool5_forward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c, const void *x,
                                         int ldx, void *y, int ldy, uint8_t *arg)
{
    const int64_t total = (int64_t)n * h * w * c;
    if (ptl_nn_check_pixels("maxpool5_forward_cuda", n, h, w, c, ldx, ldy))
        return -1;
    PTL_LAYER_DISPATCH("maxpool5_forward_cuda", dt, {
        constexpr int V = 16 / sizeof(T);
        if (ptl_vec_ok(c, V, x, y, y) && ldx % V == 0 && ldy % V == 0 && (uintptr_t)arg % V == 0)
            maxpool_forward_launch<T, V>(ctx, total, h, w, c, (const T *)x, ldx, (T *)y, ldy, arg);
        else
            maxpool_forward_launch<T, 1>(ctx, total, h, w, c, (const T *)x, ldx, (T *)y, ldy, arg);
    });
    PTL_LAUNCH_CHECK("maxpool_fwd_kernel");
    return 0;
fail:
    return -1;
}

extern "C" size_t ptl_maxpool5_cuda_scratch_bytes(int n, int h, int w, int c)
{
    return n > 0 && h > 0 && w > 0 && c > 0 ? (size_t)n * h * w * c : 0;
}

/* The backward at V channels a thread: the argmaxes into the scratch where arg is NULL, then the gather. */
template <typename T, int V>
static int maxpool_backward_launch(ptl_cuda_ctx *ctx, int64_t total, int h, int w, int c, const T *x, int ldx,
                                   const uint8_t *arg, uint8_t *scratch, const T *dy, int ldy, T *dx, int accumulate)
{
    if (!arg) {
        ptl_launch(maxpool_argmax_kernel<T, V>, ptl_grid_for(total / V, 256), 256, 0, ctx->stream, total / V, h, w, c,
                   x, ldx, scratch);
        PTL_LAUNCH_CHECK("maxpool_argmax_kernel");
        arg = scratch;
    }
    ptl_launch(maxpool_gather_kernel<T, V>, ptl_grid_for(total / V, 256), 256, 0, ctx->stream, total / V, h, w, c, arg,
               dy, ldy, dx, ldx, accumulate);
    PTL_LAUNCH_CHECK("maxpool_gather_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_maxpool5_backward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c,
                                          const void *x, int ldx, const uint8_t *arg, const void *dy, int ldy,
                                          void *dx, int accumulate)
{
    const int64_t total = (int64_t)n * h * w * c;
    void *scratch = NULL;
    if (ptl_nn_check_pixels("maxpool5_backward_cuda", n, h, w, c, ldx, ldy) ||
        (!arg && ptl_layers_cuda_scratch(ctx, ptl_maxpool5_cuda_scratch_bytes(n, h, w, c), &scratch)))
        return -1;
    PTL_LAYER_DISPATCH("maxpool5_backward_cuda", dt, {
        constexpr int V = 16 / sizeof(T);
        const int vec = ptl_vec_ok(c, V, x, dy, dx) && ldx % V == 0 && ldy % V == 0 && (uintptr_t)arg % V == 0;
        if (vec ? maxpool_backward_launch<T, V>(ctx, total, h, w, c, (const T *)x, ldx, arg, (uint8_t *)scratch,
                                                (const T *)dy, ldy, (T *)dx, accumulate)
                : maxpool_backward_launch<T, 1>(ctx, total, h, w, c, (const T *)x, ldx, arg, (uint8_t *)scratch,
                                                (const T *)dy, ldy, (T *)dx, accumulate))
            goto fail;
    });
    return 0;
fail:
    return -1;
}
