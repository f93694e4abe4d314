/* SiLU (CPU reference); the body is compiled for float and double by including this file into itself. */
#ifndef PTL_BODY
#include "activation.h"

#define PTL_BODY_FILE "activation.c"
#include "float_double.h"

static int bad_dtype(const char *fn, ptl_dtype dt)
{
    ptl_set_error(PTL_ERR_TYPE, "%s: dtype %s is not supported on the CPU (float32 or float64)", fn,
                  ptl_dtype_name(dt));
    return -1;
}

int ptl_silu_forward(ptl_dtype dt, int64_t n, const void *x, void *y)
{
    if (dt == PTL_FLOAT32)
        silu_fwd_f32(n, x, y);
    else if (dt == PTL_FLOAT64)
        silu_fwd_f64(n, x, y);
    else
        return bad_dtype("silu_forward", dt);
    return 0;
}

int ptl_silu_backward(ptl_dtype dt, int64_t n, const void *x, const void *dy, void *dx)
{
    if (dt == PTL_FLOAT32)
        silu_bwd_f32(n, x, dy, dx);
    else if (dt == PTL_FLOAT64)
        silu_bwd_f64(n, x, dy, dx);
    else
        return bad_dtype("silu_backward", dt);
    return 0;
}

#else

static void F(silu_fwd)(int64_t n, const void *xv, void *yv)
{
    const T *x = xv;
    T *y = yv;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * SIGMOID(x[i]);
}

static void F(silu_bwd)(int64_t n, const void *xv, const void *dyv, void *dxv)
{
    const T *x = xv, *dy = dyv;
    T *dx = dxv;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; i++) {
        const T sg = SIGMOID(x[i]);
        dx[i] = dy[i] * (sg * (1 + x[i] * (1 - sg)));
    }
}

#endif
