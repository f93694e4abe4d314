/* 5x5 stride-1 max-pool, padding 2, NHWC (CUDA), the semantics of ../nn/maxpool.h.
 *
 * Forward: a thread per output and 16 bytes of its channels (one channel where the widths do not allow),
 * the window scanned rows first and a value taking over only when strictly greater (or NaN), as on the
 * CPU. Backward: a gather instead of the CPU's scatter, with the same result bit for bit: each input sums,
 * in output scan order, the gradients of the outputs (of the up to 25 whose windows contain it) whose
 * first maximum it is, so no atomics are needed; the argmaxes are found once per tile
 * (maxpool_bwd_kernel). */
#include <math.h>

#include "../nn/maxpool.h"
#include "../nn/cpu_check.h"
#include "layers_common.cuh"

#define R (PTL_MAXPOOL_K / 2)

__device__ __forceinline__ int clampi(int i, int n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }

/* pixels of x (and dx) are ldx elements apart, of y (and dy) ldy. A thread takes V channels of one output
 * (16-byte loads where the widths allow). Cells outside the image are read at a clamped position and not
 * taken, so the window's 25 loads are issued at once instead of one by one. */
template <typename T, int V>
__global__ void maxpool_fwd_kernel(int64_t groups, int h, int w, int c, const T *x, int ldx, T *y, int ldy)
{
    ptl_wait_prior();
    typedef ptl_pack<T, V> P;
    const int cg = c / V;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const int ch = (int)(i % cg) * V;
        const int64_t pix = i / cg;
        const int ox = (int)(pix % w), oy = (int)((pix / w) % h);
        const T *xb = x + pix / ((int64_t)w * h) * h * w * ldx + ch;
        float best[V];
#pragma unroll
        for (int k = 0; k < V; k++)
            best[k] = -INFINITY;
#pragma unroll
        for (int a = 0; a < PTL_MAXPOOL_K; a++) {
            const int iy = oy - R + a;
#pragma unroll
            for (int q = 0; q < PTL_MAXPOOL_K; q++) {
                const int ix = ox - R + q;
                const P v = *reinterpret_cast<const P *>(xb + ((int64_t)clampi(iy, h) * w + clampi(ix, w)) * ldx);
                const bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
#pragma unroll
                for (int k = 0; k < V; k++) {
                    const float f = ptl_ld(&v.v[k]);
                    if (inside && (f > best[k] || f != f))
                        best[k] = f;
                }
            }
        }
        P out;
#pragma unroll
        for (int k = 0; k < V; k++)
            ptl_st(&out.v[k], best[k]);
        *reinterpret_cast<P *>(y + pix * ldy + ch) = out;
    }
}

/* Backward tiles: a block takes TILE x TILE input pixels of one image and BWD_CW channels. It first finds
 * the argmax of every output whose window can reach the tile (the tile and an R-wide halo) once, into
 * shared memory, in two passes: each row's segment of 5, then the window's 5 rows' results, both by
 * argmax_step's rule, which picks the cell a row-major scan of the whole window picks. Then each input
 * sums, in output scan order, the gradients of the outputs that picked it. Scanning each of the 25 windows
 * for each of its 25 inputs would load every value 625 times. */
#define TILE 4
#define HALO (TILE + 2 * R)       /* outputs per side whose windows reach the tile */
#define ROWS (TILE + 4 * R)       /* input rows those windows cover */
#define BWD_CW 32
#define BWD_RY 16

/* The CPU backward's argmax rule, one candidate v at position pos at a time in scan order: the first
 * strictly greater value, a NaN replacing a number, the first candidate if nothing else wins. */
__device__ __forceinline__ void argmax_step(float v, int pos, float *best, int *arg)
{
    if (v > *best || (v != v && *best == *best) || *arg < 0) {
        *best = v;
        *arg = pos;
    }
}

template <typename T>
__global__ void maxpool_bwd_kernel(int h, int w, int c, const T *x, int ldx, const T *dy, int ldy, T *dx,
                                   int accumulate)
{
    ptl_wait_prior();
    __shared__ float rowv[ROWS * HALO][BWD_CW];
    __shared__ unsigned char rowx[ROWS * HALO][BWD_CW]; /* column in the window, 0..K-1 */
    __shared__ unsigned char arg[HALO * HALO][BWD_CW];  /* cell in the window, row-major 0..K*K-1 */
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int cblocks = (c + BWD_CW - 1) / BWD_CW;
    const int ch = blockIdx.z % cblocks * BWD_CW + tx;
    const int64_t b = blockIdx.z / cblocks;
    const int ty0 = blockIdx.y * TILE, tx0 = blockIdx.x * TILE;
    const T *xb = x + b * h * w * ldx;
    const T *dyb = dy + b * h * w * ldy;
    T *dxb = dx + b * h * w * ldx;
    if (ch < c)
        for (int e = ty; e < ROWS * HALO; e += BWD_RY) {
            const int iy = ty0 - 2 * R + e / HALO, ox = tx0 - R + e % HALO;
            if (iy < 0 || iy >= h || ox < 0 || ox >= w)
                continue;
            float v[PTL_MAXPOOL_K];
#pragma unroll
            for (int q = 0; q < PTL_MAXPOOL_K; q++)
                v[q] = ptl_ld(xb + ((int64_t)iy * w + clampi(ox - R + q, w)) * ldx + ch);
            float best = -INFINITY;
            int at = -1;
#pragma unroll
            for (int q = 0; q < PTL_MAXPOOL_K; q++)
                if (ox - R + q >= 0 && ox - R + q < w)
                    argmax_step(v[q], ox - R + q, &best, &at);
            rowv[e][tx] = best;
            rowx[e][tx] = (unsigned char)(at - (ox - R));
        }
    __syncthreads();
    if (ch < c)
        for (int p = ty; p < HALO * HALO; p += BWD_RY) {
            const int oy = ty0 - R + p / HALO, ox = tx0 - R + p % HALO;
            if (oy < 0 || oy >= h || ox < 0 || ox >= w)
                continue;
            const int y0 = oy - R < 0 ? 0 : oy - R, y1 = oy + R >= h ? h - 1 : oy + R;
            float best = -INFINITY;
            int at = -1;
            for (int iy = y0; iy <= y1; iy++) {
                const int e = (iy - (ty0 - 2 * R)) * HALO + p % HALO;
                argmax_step(rowv[e][tx], (iy - oy + R) * PTL_MAXPOOL_K + rowx[e][tx], &best, &at);
            }
            arg[p][tx] = (unsigned char)at;
        }
    __syncthreads();
    if (ch >= c)
        return;
    for (int p = ty; p < TILE * TILE; p += BWD_RY) {
        const int iy = ty0 + p / TILE, ix = tx0 + p % TILE;
        if (iy >= h || ix >= w)
            continue;
        const int64_t i = ((int64_t)iy * w + ix) * ldx + ch;
        float s = accumulate ? ptl_ld(dxb + i) : 0.0f;
        /* the 25 outputs in scan order; each is loaded (at a clamped position) and taken only if it picked
         * this input, so the loads do not wait on the matches */
#pragma unroll
        for (int a = 0; a < PTL_MAXPOOL_K; a++) {
            const int oy = iy - R + a;
#pragma unroll
            for (int q = 0; q < PTL_MAXPOOL_K; q++) {
                const int ox = ix - R + q;
                const float g = ptl_ld(dyb + ((int64_t)clampi(oy, h) * w + clampi(ox, w)) * ldy + ch);
                const int cell = (PTL_MAXPOOL_K - 1 - a) * PTL_MAXPOOL_K + (PTL_MAXPOOL_K - 1 - q);
                if (oy >= 0 && oy < h && ox >= 0 && ox < w && arg[(oy - ty0 + R) * HALO + (ox - tx0 + R)][tx] == cell)
                    s += g;
            }
        }
        ptl_st(dxb + i, s);
    }
}

extern "C" int ptl_maxpool5_forward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c, const void *x,
                                         int ldx, void *y, int ldy)
{
    const int64_t total = (int64_t)n * h * w * c;
    if (ptl_nn_check_pixels("maxpool5_forward_cuda", n, h, w, c, ldx, ldy))
        return -1;
    PTL_LAYER_DISPATCH("maxpool5_forward_cuda", dt, {
        constexpr int V = 16 / sizeof(T);
        if (ptl_vec_ok(c, V, x, y, y) && ldx % V == 0 && ldy % V == 0)
            ptl_launch(maxpool_fwd_kernel<T, V>, ptl_grid_for(total / V, 256), 256, 0, ctx->stream, total / V, h, w,
                       c, (const T *)x, ldx, (T *)y, ldy);
        else
            ptl_launch(maxpool_fwd_kernel<T, 1>, ptl_grid_for(total, 256), 256, 0, ctx->stream, total, h, w, c,
                       (const T *)x, ldx, (T *)y, ldy);
    });
    PTL_LAUNCH_CHECK("maxpool_fwd_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_maxpool5_backward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c,
                                          const void *x, int ldx, const void *dy, int ldy, void *dx, int accumulate)
{
    if (ptl_nn_check_pixels("maxpool5_backward_cuda", n, h, w, c, ldx, ldy))
        return -1;
    const int64_t zblocks = (int64_t)n * ((c + BWD_CW - 1) / BWD_CW);
    if (zblocks > 65535 || (h + TILE - 1) / TILE > 65535)
        return ptl_set_error(PTL_ERR_VALUE, "maxpool5_backward_cuda: n=%d h=%d c=%d exceed the launch grid (at most "
                             "65535 image-channel blocks and 65535 tile rows)", n, h, c);
    const dim3 grid((unsigned)((w + TILE - 1) / TILE), (unsigned)((h + TILE - 1) / TILE), (unsigned)zblocks),
        block(BWD_CW, BWD_RY);
    PTL_LAYER_DISPATCH("maxpool5_backward_cuda", dt,
                       ptl_launch(maxpool_bwd_kernel<T>, grid, block, 0, ctx->stream, h, w, c, (const T *)x, ldx,
                                  (const T *)dy, ldy, (T *)dx, accumulate));
    PTL_LAUNCH_CHECK("maxpool_bwd_kernel");
    return 0;
fail:
    return -1;
}
