/* 5x5 stride-1 max-pool, padding 2 (CPU reference), compiled for float and double by including this
 * file into itself. The window is scanned rows first, then columns; a value replaces the running
 * maximum only when strictly greater (or NaN), so the backward's "first maximum" is the one the
 * forward kept. */
#ifndef PTL_BODY
#include "maxpool.h"
#include "cpu_check.h"

#include <math.h>
#include <string.h>

#define CH_BLOCK 16
#define R (PTL_MAXPOOL_K / 2)

#define PTL_BODY_FILE "maxpool.c"
#include "float_double.h"

int ptl_maxpool5_forward(ptl_dtype dt, int n, int h, int w, int c, const void *x, int ldx, void *y, int ldy)
{
    if (ptl_nn_check_nhwc_strided("maxpool5_forward", dt, n, h, w, c, ldx, ldy))
        return -1;
    if (dt == PTL_FLOAT32)
        maxpool_fwd_f32(n, h, w, c, x, ldx, y, ldy);
    else
        maxpool_fwd_f64(n, h, w, c, x, ldx, y, ldy);
    return 0;
}

int ptl_maxpool5_backward(ptl_dtype dt, int n, int h, int w, int c, const void *x, int ldx, const void *dy, int ldy,
                          void *dx, int accumulate)
{
    if (ptl_nn_check_nhwc_strided("maxpool5_backward", dt, n, h, w, c, ldx, ldy))
        return -1;
    if (dt == PTL_FLOAT32)
        maxpool_bwd_f32(n, h, w, c, x, ldx, dy, ldy, dx, accumulate);
    else
        maxpool_bwd_f64(n, h, w, c, x, ldx, dy, ldy, dx, accumulate);
    return 0;
}

#else

static void F(maxpool_fwd)(int n, int h, int w, int c, const void *xv, int ldx, void *yv, int ldy)
{
    const T *x = xv;
    T *y = yv;
    const int64_t rows = (int64_t)n * h;
#pragma omp parallel for schedule(static) if ((int64_t)n * h * w * c > 8192)
    for (int64_t r = 0; r < rows; r++) {
        const int b = (int)(r / h), oy = (int)(r % h);
        const int y0 = oy - R < 0 ? 0 : oy - R, y1 = oy + R >= h ? h - 1 : oy + R;
        for (int ox = 0; ox < w; ox++) {
            const int x0 = ox - R < 0 ? 0 : ox - R, x1 = ox + R >= w ? w - 1 : ox + R;
            T *yp = y + (r * w + ox) * ldy;
            for (int j = 0; j < c; j++)
                yp[j] = (T)-INFINITY;
            for (int iy = y0; iy <= y1; iy++)
                for (int ix = x0; ix <= x1; ix++) {
                    const T *xp = x + (((int64_t)b * h + iy) * w + ix) * ldx;
                    for (int j = 0; j < c; j++) {
                        const T v = xp[j];
                        if (v > yp[j] || v != v)
                            yp[j] = v;
                    }
                }
        }
    }
}

/* One task per (image, channel block): outputs in scan order scatter into their argmax, so each dx
 * element receives its contributions in a fixed order. */
static void F(maxpool_bwd)(int n, int h, int w, int c, const void *xv, int ldx, const void *dyv, int ldy, void *dxv,
                           int accumulate)
{
    const T *x = xv, *dy = dyv;
    T *dx = dxv;
    const int nblk = (c + CH_BLOCK - 1) / CH_BLOCK;
    const int64_t tasks = (int64_t)n * nblk;
#pragma omp parallel for schedule(static) if ((int64_t)n * h * w * c > 8192)
    for (int64_t t = 0; t < tasks; t++) {
        const int b = (int)(t / nblk), c0 = (int)(t % nblk) * CH_BLOCK;
        const int nc = c0 + CH_BLOCK < c ? CH_BLOCK : c - c0;
        const int64_t base = (int64_t)b * h * w;
        if (!accumulate)
            for (int64_t p = 0; p < (int64_t)h * w; p++)
                memset(dx + (base + p) * ldx + c0, 0, sizeof(T) * nc);
        for (int oy = 0; oy < h; oy++) {
            const int y0 = oy - R < 0 ? 0 : oy - R, y1 = oy + R >= h ? h - 1 : oy + R;
            for (int ox = 0; ox < w; ox++) {
                const int x0 = ox - R < 0 ? 0 : ox - R, x1 = ox + R >= w ? w - 1 : ox + R;
                T best[CH_BLOCK];
                int64_t arg[CH_BLOCK];
                for (int j = 0; j < nc; j++) {
                    best[j] = (T)-INFINITY;
                    arg[j] = -1;
                }
                for (int iy = y0; iy <= y1; iy++)
                    for (int ix = x0; ix <= x1; ix++) {
                        const int64_t p = base + (int64_t)iy * w + ix;
                        const T *xp = x + p * ldx + c0;
                        for (int j = 0; j < nc; j++)
                            if (xp[j] > best[j] || (xp[j] != xp[j] && best[j] == best[j]) || arg[j] < 0) {
                                best[j] = xp[j];
                                arg[j] = p;
                            }
                    }
                const T *dyp = dy + (base + (int64_t)oy * w + ox) * ldy + c0;
                for (int j = 0; j < nc; j++)
                    dx[arg[j] * ldx + c0 + j] += dyp[j];
            }
        }
    }
}

#endif
