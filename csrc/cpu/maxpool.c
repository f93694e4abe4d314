/* Fast CPU 5x5 max-pool (see maxpool.h): per output pixel the 25 window cells are scanned in the
 * reference's order with one vector of running maxima (and, backward, their positions) per channel block. */
#include "maxpool.h"

#include <math.h>
#include <string.h>

#include "../nn/cpu_check.h"
#include "vector.h"

#define R 2
#define CB 16 /* channels per block */

PTL_CPU_CLONES
static void image_forward(int h, int w, int c, const float *x, int ldx, float *y, int ldy)
{
    for (int oy = 0; oy < h; oy++) {
        const int y0 = oy - R < 0 ? 0 : oy - R, y1 = oy + R >= h ? h - 1 : oy + R;
        for (int ox = 0; ox < w; ox++) {
            const int x0 = ox - R < 0 ? 0 : ox - R, x1 = ox + R >= w ? w - 1 : ox + R;
            float *yp = y + ((int64_t)oy * w + ox) * ldy;
            for (int j = 0; j < c; j++)
                yp[j] = -INFINITY;
            for (int iy = y0; iy <= y1; iy++)
                for (int ix = x0; ix <= x1; ix++) {
                    const float *xp = x + ((int64_t)iy * w + ix) * ldx;
#pragma omp simd
                    for (int j = 0; j < c; j++) {
                        const float v = xp[j];
                        yp[j] = v > yp[j] || v != v ? v : yp[j];
                    }
                }
        }
    }
}

int ptl_cpu_maxpool5_forward(int n, int h, int w, int c, const float *x, int ldx, float *y, int ldy)
{
    if (ptl_nn_check_pixels("cpu_maxpool5_forward", n, h, w, c, ldx, ldy))
        return -1;
    const int64_t pixels = (int64_t)h * w;
#pragma omp parallel for schedule(dynamic, 1) if (n > 1 && n * pixels * c > PTL_CPU_PAR_MIN)
    for (int b = 0; b < n; b++)
        image_forward(h, w, c, x + b * pixels * ldx, ldx, y + b * pixels * ldy, ldy);
    return 0;
}

PTL_CPU_CLONES
static void image_backward(int h, int w, int c, const float *x, int ldx, const float *dy, int ldy, float *dx,
                           int accumulate)
{
    for (int64_t p = 0; !accumulate && p < (int64_t)h * w; p++)
        memset(dx + p * ldx, 0, sizeof(float) * (size_t)c);
    for (int oy = 0; oy < h; oy++) {
        const int y0 = oy - R < 0 ? 0 : oy - R, y1 = oy + R >= h ? h - 1 : oy + R;
        for (int ox = 0; ox < w; ox++) {
            const int x0 = ox - R < 0 ? 0 : ox - R, x1 = ox + R >= w ? w - 1 : ox + R;
            const float *dyp = dy + ((int64_t)oy * w + ox) * ldy;
            for (int c0 = 0; c0 < c; c0 += CB) {
                const int nc = c0 + CB < c ? CB : c - c0;
                float best[CB];
                int32_t arg[CB];
                for (int j = 0; j < CB; j++) {
                    best[j] = -INFINITY;
                    arg[j] = -1;
                }
                for (int iy = y0; iy <= y1; iy++)
                    for (int ix = x0; ix <= x1; ix++) {
                        const int32_t p = iy * w + ix;
                        const float *xp = x + (int64_t)p * ldx + c0;
#pragma omp simd
                        for (int j = 0; j < nc; j++) {
                            const float v = xp[j];
                            const int take = v > best[j] || (v != v && best[j] == best[j]) || arg[j] < 0;
                            best[j] = take ? v : best[j];
                            arg[j] = take ? p : arg[j];
                        }
                    }
                for (int j = 0; j < nc; j++)
                    dx[(int64_t)arg[j] * ldx + c0 + j] += dyp[c0 + j];
            }
        }
    }
}

int ptl_cpu_maxpool5_backward(int n, int h, int w, int c, const float *x, int ldx, const float *dy, int ldy, float *dx,
                              int accumulate)
{
    if (ptl_nn_check_pixels("cpu_maxpool5_backward", n, h, w, c, ldx, ldy))
        return -1;
    const int64_t pixels = (int64_t)h * w;
#pragma omp parallel for schedule(dynamic, 1) if (n > 1 && n * pixels * c > PTL_CPU_PAR_MIN / 4)
    for (int b = 0; b < n; b++)
        image_backward(h, w, c, x + b * pixels * ldx, ldx, dy + b * pixels * ldy, ldy, dx + b * pixels * ldx,
                       accumulate);
    return 0;
}
