/* Fast CPU SiLU (see activation.h): fixed chunks of PTL_CPU_CHUNK elements per task. */
#include "activation.h"

#include "vector.h"


PTL_CPU_CLONES
static void silu_range(int64_t i0, int64_t i1, const float *x, float *y)
{
#pragma omp simd
    for (int64_t i = i0; i < i1; i++)
        y[i] = x[i] * ptl_cpu_sigmoidf(x[i]);
}

PTL_CPU_CLONES
static void silu_grad_range(int64_t i0, int64_t i1, const float *x, const float *dy, float *dx)
{
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        const float s = ptl_cpu_sigmoidf(x[i]);
        dx[i] = dy[i] * (s * (1 + x[i] * (1 - s)));
    }
}

int ptl_cpu_silu_forward(int64_t n, const float *x, float *y)
{
    if (n < 0)
        return ptl_set_error(PTL_ERR_VALUE, "cpu_silu_forward: negative length %lld", (long long)n);
    PTL_CPU_FOR_CHUNKS(n, i0, i1, silu_range(i0, i1, x, y));
    return 0;
}

int ptl_cpu_silu_backward(int64_t n, const float *x, const float *dy, float *dx)
{
    if (n < 0)
        return ptl_set_error(PTL_ERR_VALUE, "cpu_silu_backward: negative length %lld", (long long)n);
    PTL_CPU_FOR_CHUNKS(n, i0, i1, silu_grad_range(i0, i1, x, dy, dx));
    return 0;
}
