/* Nearest x2 upsampling (CPU reference), compiled for float and double by including this file into
 * itself. */
#ifndef PTL_BODY
#include "upsample.h"
#include "cpu_check.h"

#include <string.h>

#define PTL_BODY_FILE "upsample.c"
#include "float_double.h"

int ptl_upsample2x_forward(ptl_dtype dt, int n, int h, int w, int c, const void *x, int ldx, void *y, int ldy)
{
    if (ptl_nn_check_nhwc_strided("upsample2x_forward", dt, n, h, w, c, ldx, ldy))
        return -1;
    if (dt == PTL_FLOAT32)
        up_fwd_f32(n, h, w, c, x, ldx, y, ldy);
    else
        up_fwd_f64(n, h, w, c, x, ldx, y, ldy);
    return 0;
}

int ptl_upsample2x_backward(ptl_dtype dt, int n, int h, int w, int c, const void *dy, int ldy, void *dx, int ldx,
                            int accumulate)
{
    if (ptl_nn_check_nhwc_strided("upsample2x_backward", dt, n, h, w, c, ldx, ldy))
        return -1;
    if (dt == PTL_FLOAT32)
        up_bwd_f32(n, h, w, c, dy, ldy, dx, ldx, accumulate);
    else
        up_bwd_f64(n, h, w, c, dy, ldy, dx, ldx, accumulate);
    return 0;
}

#else

static void F(up_fwd)(int n, int h, int w, int c, const void *xv, int ldx, void *yv, int ldy)
{
    const T *x = xv;
    T *y = yv;
    const int64_t rows = (int64_t)n * 2 * h;
#pragma omp parallel for schedule(static) if (rows * w * c > 32768)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / (2 * h), iy = (r % (2 * h)) / 2;
        const T *xr = x + (b * h + iy) * w * ldx;
        T *yr = y + r * 2 * w * ldy;
        for (int ix = 0; ix < w; ix++) {
            memcpy(yr + (int64_t)(2 * ix) * ldy, xr + (int64_t)ix * ldx, sizeof(T) * c);
            memcpy(yr + (int64_t)(2 * ix + 1) * ldy, xr + (int64_t)ix * ldx, sizeof(T) * c);
        }
    }
}

static void F(up_bwd)(int n, int h, int w, int c, const void *dyv, int ldy, void *dxv, int ldx, int accumulate)
{
    const T *dy = dyv;
    T *dx = dxv;
    const int64_t rows = (int64_t)n * h, row = (int64_t)2 * w * ldy;
#pragma omp parallel for schedule(static) if (rows * w * c > 8192)
    for (int64_t r = 0; r < rows; r++) {
        const T *d0 = dy + 2 * r * row, *d1 = d0 + row;
        T *dxr = dx + r * w * ldx;
        for (int ix = 0; ix < w; ix++)
            for (int j = 0; j < c; j++) {
                const int64_t a = (int64_t)(2 * ix) * ldy + j, bb = a + ldy;
                const T s = ((d0[a] + d0[bb]) + d1[a]) + d1[bb];
                const int64_t o = (int64_t)ix * ldx + j;
                dxr[o] = accumulate ? dxr[o] + s : s;
            }
    }
}

#endif
