/* Fast CPU nearest x2 upsampling (see upsample.h): one task per input row. */
#include "upsample.h"

#include <string.h>

#include "../nn/cpu_check.h"
#include "vector.h"

int ptl_cpu_upsample2x_forward(int n, int h, int w, int c, const float *x, int ldx, float *y, int ldy)
{
    if (ptl_nn_check_pixels("cpu_upsample2x_forward", n, h, w, c, ldx, ldy))
        return -1;
    const int64_t rows = (int64_t)n * h, in_row = (int64_t)w * ldx, out_row = (int64_t)2 * w * ldy;
#pragma omp parallel for schedule(dynamic, 8) if (rows * w * c > PTL_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * in_row;
        float *y0 = y + 2 * r * out_row;
        for (int ix = 0; ix < w; ix++) {
            memcpy(y0 + (int64_t)(2 * ix) * ldy, xr + (int64_t)ix * ldx, sizeof(float) * (size_t)c);
            memcpy(y0 + (int64_t)(2 * ix + 1) * ldy, xr + (int64_t)ix * ldx, sizeof(float) * (size_t)c);
        }
        if (ldy == c) /* the second output row is the first */
            memcpy(y0 + out_row, y0, sizeof(float) * (size_t)out_row);
        else
            for (int X = 0; X < 2 * w; X++)
                memcpy(y0 + out_row + (int64_t)X * ldy, y0 + (int64_t)X * ldy, sizeof(float) * (size_t)c);
    }
    return 0;
}

PTL_CPU_CLONES
static void row_backward(int w, int c, const float *d0, const float *d1, int ldy, float *dxr, int ldx,
                         int accumulate)
{
    for (int ix = 0; ix < w; ix++) {
        const float *a0 = d0 + (int64_t)(2 * ix) * ldy, *a1 = d1 + (int64_t)(2 * ix) * ldy;
        const float *b0 = a0 + ldy, *b1 = a1 + ldy;
        float *o = dxr + (int64_t)ix * ldx;
        if (accumulate) {
#pragma omp simd
            for (int j = 0; j < c; j++)
                o[j] = o[j] + (((a0[j] + b0[j]) + a1[j]) + b1[j]);
        } else {
#pragma omp simd
            for (int j = 0; j < c; j++)
                o[j] = ((a0[j] + b0[j]) + a1[j]) + b1[j];
        }
    }
}

int ptl_cpu_upsample2x_backward(int n, int h, int w, int c, const float *dy, int ldy, float *dx, int ldx,
                                int accumulate)
{
    if (ptl_nn_check_pixels("cpu_upsample2x_backward", n, h, w, c, ldx, ldy))
        return -1;
    const int64_t rows = (int64_t)n * h, out_row = (int64_t)2 * w * ldy;
#pragma omp parallel for schedule(dynamic, 8) if (rows * w * c > PTL_CPU_PAR_MIN / 4)
    for (int64_t r = 0; r < rows; r++)
        row_backward(w, c, dy + 2 * r * out_row, dy + (2 * r + 1) * out_row, ldy, dx + r * w * ldx, ldx, accumulate);
    return 0;
}
