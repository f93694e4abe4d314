/* Nearest x2 upsampling (CPU reference), compiled for float and double by including this file into
 * itself. */
#ifndef PTL_BODY
#include "upsample.h"
#include "cpu_check.h"

#include <string.h>

#define PTL_BODY_FILE "upsample.c"
#include "float_double.h"

int ptl_upsample2x_forward(ptl_dtype dt, int n, int h, int w, int c, const void *x, void *y)
{
    if (ptl_nn_check_nhwc("upsample2x_forward", dt, n, h, w, c))
        return -1;
    if (dt == PTL_FLOAT32)
        up_fwd_f32(n, h, w, c, x, y);
    else
        up_fwd_f64(n, h, w, c, x, y);
    return 0;
}

int ptl_upsample2x_backward(ptl_dtype dt, int n, int h, int w, int c, const void *dy, void *dx, int accumulate)
{
    if (ptl_nn_check_nhwc("upsample2x_backward", dt, n, h, w, c))
        return -1;
    if (dt == PTL_FLOAT32)
        up_bwd_f32(n, h, w, c, dy, dx, accumulate);
    else
        up_bwd_f64(n, h, w, c, dy, dx, accumulate);
    return 0;
}

#else

static void F(up_fwd)(int n, int h, int w, int c, const void *xv, void *yv)
{
    const T *x = xv;
    T *y = yv;
    const int64_t rows = (int64_t)n * 2 * h;
#pragma omp parallel for schedule(static) if (rows * w * c > 32768)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / (2 * h), iy = (r % (2 * h)) / 2;
        const T *xr = x + (b * h + iy) * w * c;
        T *yr = y + r * 2 * w * c;
        for (int ix = 0; ix < w; ix++) {
            memcpy(yr + (int64_t)(2 * ix) * c, xr + (int64_t)ix * c, sizeof(T) * c);
            memcpy(yr + (int64_t)(2 * ix + 1) * c, xr + (int64_t)ix * c, sizeof(T) * c);
        }
    }
}

static void F(up_bwd)(int n, int h, int w, int c, const void *dyv, void *dxv, int accumulate)
{
    const T *dy = dyv;
    T *dx = dxv;
    const int64_t rows = (int64_t)n * h, row = (int64_t)2 * w * c;
#pragma omp parallel for schedule(static) if (rows * w * c > 8192)
    for (int64_t r = 0; r < rows; r++) {
        const T *d0 = dy + 2 * r * row, *d1 = d0 + row;
        T *dxr = dx + r * w * c;
        for (int ix = 0; ix < w; ix++)
            for (int j = 0; j < c; j++) {
                const int64_t a = (int64_t)(2 * ix) * c + j, bb = a + c;
                const T s = ((d0[a] + d0[bb]) + d1[a]) + d1[bb];
                const int64_t o = (int64_t)ix * c + j;
                dxr[o] = accumulate ? dxr[o] + s : s;
            }
    }
}

#endif
