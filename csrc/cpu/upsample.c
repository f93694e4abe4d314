/* Fast CPU nearest x2 upsampling (see upsample.h): one task per input row. */
#include "upsample.h"

#include <string.h>

#include "vector.h"

static int check(const char *fn, int n, int h, int w, int c)
{
    if (n <= 0 || h <= 0 || w <= 0 || c <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "%s: sizes must be positive (n=%d h=%d w=%d c=%d)", fn, n, h, w, c);
    return 0;
}

int ptl_cpu_upsample2x_forward(int n, int h, int w, int c, const float *x, float *y)
{
    if (check("cpu_upsample2x_forward", n, h, w, c))
        return -1;
    const int64_t rows = (int64_t)n * h, in_row = (int64_t)w * c;
#pragma omp parallel for schedule(dynamic, 8) if (rows * in_row > PTL_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * in_row;
        float *y0 = y + 2 * r * 2 * in_row;
        for (int ix = 0; ix < w; ix++) {
            memcpy(y0 + (int64_t)(2 * ix) * c, xr + (int64_t)ix * c, sizeof(float) * (size_t)c);
            memcpy(y0 + (int64_t)(2 * ix + 1) * c, xr + (int64_t)ix * c, sizeof(float) * (size_t)c);
        }
        memcpy(y0 + 2 * in_row, y0, sizeof(float) * 2 * (size_t)in_row);
    }
    return 0;
}

PTL_CPU_CLONES
static void row_backward(int w, int c, const float *d0, const float *d1, float *dxr, int accumulate)
{
    for (int ix = 0; ix < w; ix++) {
        const float *a0 = d0 + (int64_t)(2 * ix) * c, *a1 = d1 + (int64_t)(2 * ix) * c;
        float *o = dxr + (int64_t)ix * c;
        if (accumulate) {
#pragma omp simd
            for (int j = 0; j < c; j++)
                o[j] = o[j] + (((a0[j] + a0[j + c]) + a1[j]) + a1[j + c]);
        } else {
#pragma omp simd
            for (int j = 0; j < c; j++)
                o[j] = ((a0[j] + a0[j + c]) + a1[j]) + a1[j + c];
        }
    }
}

int ptl_cpu_upsample2x_backward(int n, int h, int w, int c, const float *dy, float *dx, int accumulate)
{
    if (check("cpu_upsample2x_backward", n, h, w, c))
        return -1;
    const int64_t rows = (int64_t)n * h, out_row = (int64_t)2 * w * c;
#pragma omp parallel for schedule(dynamic, 8) if (rows * w * c > PTL_CPU_PAR_MIN / 4)
    for (int64_t r = 0; r < rows; r++)
        row_backward(w, c, dy + 2 * r * out_row, dy + (2 * r + 1) * out_row, dx + r * w * c, accumulate);
    return 0;
}
