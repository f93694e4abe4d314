/* Channel concat/split as strided row copies (CPU reference). */
#include "concat.h"

#include <string.h>

static int check_dtype(const char *fn, ptl_dtype dt)
{
    if (dt != PTL_FLOAT32 && dt != PTL_FLOAT64) {
        ptl_set_error(PTL_ERR_TYPE, "%s: dtype %s is not supported on the CPU (float32 or float64)", fn,
                      ptl_dtype_name(dt));
        return -1;
    }
    return 0;
}

int ptl_channel_copy(ptl_dtype dt, int64_t m, int c, const void *src, int src_c, int src_off, void *dst,
                     int dst_c, int dst_off, int accumulate)
{
    if (check_dtype("channel_copy", dt))
        return -1;
    if (m < 0 || c < 0 || src_off < 0 || dst_off < 0 || src_off + c > src_c || dst_off + c > dst_c) {
        ptl_set_error(PTL_ERR_VALUE,
                      "channel_copy: slice out of range (c=%d, src %d+%d of %d, dst %d+%d of %d, m=%lld)", c,
                      src_off, c, src_c, dst_off, c, dst_c, (long long)m);
        return -1;
    }
    const size_t es = dt == PTL_FLOAT32 ? 4 : 8;
    const char *s = (const char *)src + (size_t)src_off * es;
    char *d = (char *)dst + (size_t)dst_off * es;
#pragma omp parallel for schedule(static) if (m * c > 65536)
    for (int64_t r = 0; r < m; r++) {
        const char *sr = s + (size_t)r * src_c * es;
        char *dr = d + (size_t)r * dst_c * es;
        if (!accumulate)
            memcpy(dr, sr, (size_t)c * es);
        else if (dt == PTL_FLOAT32)
            for (int j = 0; j < c; j++)
                ((float *)dr)[j] += ((const float *)sr)[j];
        else
            for (int j = 0; j < c; j++)
                ((double *)dr)[j] += ((const double *)sr)[j];
    }
    return 0;
}

int ptl_concat_forward(ptl_dtype dt, int64_t m, int k, const void *const *xs, const int *cs, void *y)
{
    int total = 0;
    for (int i = 0; i < k; i++)
        total += cs[i];
    for (int i = 0, off = 0; i < k; off += cs[i], i++)
        if (ptl_channel_copy(dt, m, cs[i], xs[i], cs[i], 0, y, total, off, 0))
            return -1;
    return 0;
}

int ptl_concat_backward(ptl_dtype dt, int64_t m, int k, const void *dy, const int *cs, void *const *dxs,
                        const int *accumulate)
{
    int total = 0;
    for (int i = 0; i < k; i++)
        total += cs[i];
    for (int i = 0, off = 0; i < k; off += cs[i], i++)
        if (dxs[i] && ptl_channel_copy(dt, m, cs[i], dy, total, off, dxs[i], cs[i], 0, accumulate ? accumulate[i] : 0))
            return -1;
    return 0;
}
