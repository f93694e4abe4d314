/* Fast CPU element-wise kernels (see elementwise.h). */
#include "elementwise.h"

#include <string.h>

#include "vector.h"


PTL_CPU_CLONES
static void add_range(int64_t i0, int64_t i1, const float *a, const float *b, float *y)
{
#pragma omp simd
    for (int64_t i = i0; i < i1; i++)
        y[i] = a[i] + b[i];
}

PTL_CPU_CLONES
static void accumulate_range(int64_t i0, int64_t i1, const float *x, float *y)
{
#pragma omp simd
    for (int64_t i = i0; i < i1; i++)
        y[i] += x[i];
}

int ptl_cpu_add(int64_t n, const float *a, const float *b, float *y)
{
    if (n < 0)
        return ptl_set_error(PTL_ERR_VALUE, "cpu_add: negative length %lld", (long long)n);
    PTL_CPU_FOR_CHUNKS(n, i0, i1, add_range(i0, i1, a, b, y));
    return 0;
}

int ptl_cpu_accumulate(int64_t n, const float *x, float *y)
{
    if (n < 0)
        return ptl_set_error(PTL_ERR_VALUE, "cpu_accumulate: negative length %lld", (long long)n);
    PTL_CPU_FOR_CHUNKS(n, i0, i1, accumulate_range(i0, i1, x, y));
    return 0;
}

PTL_CPU_CLONES
static void copy_rows(int64_t r0, int64_t r1, int c, const float *src, int src_c, float *dst, int dst_c,
                      int accumulate)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *s = src + r * src_c;
        float *d = dst + r * dst_c;
        if (accumulate) {
#pragma omp simd
            for (int j = 0; j < c; j++)
                d[j] += s[j];
        } else {
            memcpy(d, s, sizeof(float) * (size_t)c);
        }
    }
}

int ptl_cpu_channel_copy(int64_t m, int c, const float *src, int src_c, int src_off, float *dst, int dst_c,
                         int dst_off, int accumulate)
{
    if (m < 0 || c < 0 || src_off < 0 || dst_off < 0 || src_off + c > src_c || dst_off + c > dst_c)
        return ptl_set_error(PTL_ERR_VALUE,
                             "cpu_channel_copy: slice out of range (c=%d, src %d+%d of %d, dst %d+%d of %d, m=%lld)",
                             c, src_off, c, src_c, dst_off, c, dst_c, (long long)m);
    if (!m || !c)
        return 0;
    const int64_t rows = c >= PTL_CPU_CHUNK ? 1 : PTL_CPU_CHUNK / c, nchunks = (m + rows - 1) / rows;
#pragma omp parallel for schedule(dynamic, 1) if (m * c > PTL_CPU_PAR_MIN)
    for (int64_t k = 0; k < nchunks; k++)
        copy_rows(k * rows, k + 1 < nchunks ? (k + 1) * rows : m, c, src + src_off, src_c, dst + dst_off, dst_c,
                  accumulate);
    return 0;
}
