#include "cpu_check.h"

int ptl_nn_check_nhwc(const char *fn, ptl_dtype dt, int n, int h, int w, int c)
{
    if (dt != PTL_FLOAT32 && dt != PTL_FLOAT64)
        return ptl_set_error(PTL_ERR_TYPE, "%s: dtype %s is not supported on the CPU (float32 or float64)", fn,
                             ptl_dtype_name(dt));
    if (n <= 0 || h <= 0 || w <= 0 || c <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "%s: sizes must be positive (n=%d h=%d w=%d c=%d)", fn, n, h, w, c);
    return 0;
}

int ptl_nn_check_pixels(const char *fn, int n, int h, int w, int c, int ldx, int ldy)
{
    if (n <= 0 || h <= 0 || w <= 0 || c <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "%s: sizes must be positive (n=%d h=%d w=%d c=%d)", fn, n, h, w, c);
    if (ldx < c || ldy < c)
        return ptl_set_error(PTL_ERR_VALUE, "%s: pixels of %d (x) and %d (y) elements hold no %d channels", fn, ldx,
                             ldy, c);
    return 0;
}

int ptl_nn_check_nhwc_strided(const char *fn, ptl_dtype dt, int n, int h, int w, int c, int ldx, int ldy)
{
    return ptl_nn_check_nhwc(fn, dt, n, h, w, c) || ptl_nn_check_pixels(fn, n, h, w, c, ldx, ldy) ? -1 : 0;
}
