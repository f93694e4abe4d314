/* Element-wise add/accumulate/copy/zero (CPU reference). */
#include "elementwise.h"

#include <string.h>

static int check_dtype(const char *fn, ptl_dtype dt, int64_t n)
{
    if (dt != PTL_FLOAT32 && dt != PTL_FLOAT64) {
        ptl_set_error(PTL_ERR_TYPE, "%s: dtype %s is not supported on the CPU (float32 or float64)", fn,
                      ptl_dtype_name(dt));
        return -1;
    }
    if (n < 0) {
        ptl_set_error(PTL_ERR_VALUE, "%s: negative length %lld", fn, (long long)n);
        return -1;
    }
    return 0;
}

#define PAR _Pragma("omp parallel for schedule(static) if (n > 65536)")

int ptl_add(ptl_dtype dt, int64_t n, const void *a, const void *b, void *y)
{
    if (check_dtype("add", dt, n))
        return -1;
    if (dt == PTL_FLOAT32) {
        const float *pa = a, *pb = b;
        float *py = y;
        PAR for (int64_t i = 0; i < n; i++) py[i] = pa[i] + pb[i];
    } else {
        const double *pa = a, *pb = b;
        double *py = y;
        PAR for (int64_t i = 0; i < n; i++) py[i] = pa[i] + pb[i];
    }
    return 0;
}

int ptl_accumulate(ptl_dtype dt, int64_t n, const void *x, void *y)
{
    if (check_dtype("accumulate", dt, n))
        return -1;
    if (dt == PTL_FLOAT32) {
        const float *px = x;
        float *py = y;
        PAR for (int64_t i = 0; i < n; i++) py[i] += px[i];
    } else {
        const double *px = x;
        double *py = y;
        PAR for (int64_t i = 0; i < n; i++) py[i] += px[i];
    }
    return 0;
}

int ptl_copy(ptl_dtype dt, int64_t n, const void *x, void *y)
{
    if (check_dtype("copy", dt, n))
        return -1;
    memcpy(y, x, (size_t)n * (dt == PTL_FLOAT32 ? 4 : 8));
    return 0;
}

int ptl_zero(ptl_dtype dt, int64_t n, void *y)
{
    if (check_dtype("zero", dt, n))
        return -1;
    memset(y, 0, (size_t)n * (dt == PTL_FLOAT32 ? 4 : 8));
    return 0;
}
