/* Fast CPU BatchNorm (+ SiLU): chunked double statistics and vectorised element-wise passes (see
 * batchnorm.h). */
#include "batchnorm.h"

#include <math.h>
#include <string.h>

#include "../nn/batchnorm.h"
#include "vector.h"

/* About this many elements per chunk (64 KiB of float: the chunk's rows stay in L2 between passes). */
#define CHUNK_ELEMS 16384

static int64_t chunk_rows(int c) { return c >= CHUNK_ELEMS ? 1 : CHUNK_ELEMS / c; }

static int64_t num_chunks(int64_t m, int c) { return (m + chunk_rows(c) - 1) / chunk_rows(c); }

size_t ptl_cpu_batchnorm_workspace(int64_t m, int c)
{
    return m > 0 && c > 0 ? (size_t)num_chunks(m, c) * (size_t)c * 2 * sizeof(double) : 0;
}

static int check(const char *fn, int64_t m, int c, int ld, ptl_act act, size_t workspace_bytes, const void *workspace)
{
    if (ptl_batchnorm_check(fn, m, c, ld, act))
        return -1;
    const size_t need = ptl_cpu_batchnorm_workspace(m, c);
    if (!workspace || workspace_bytes < need)
        return ptl_set_error(PTL_ERR_VALUE, "%s: workspace of %zu bytes given, %zu needed", fn,
                             workspace ? workspace_bytes : 0, need);
    return 0;
}

/* sum (x - shift) and sum (x - shift)^2 over rows [r0, r1), per channel, into s1/s2 (overwritten). */
PTL_CPU_CLONES
static void chunk_moments(int64_t r0, int64_t r1, int c, const float *x, const float *shift, double *s1, double *s2)
{
    for (int j = 0; j < c; j++)
        s1[j] = s2[j] = 0;
    for (int64_t r = r0; r < r1; r++) {
        const float *row = x + r * c;
#pragma omp simd
        for (int j = 0; j < c; j++) {
            const double d = (double)row[j] - shift[j];
            s1[j] += d;
            s2[j] += d * d;
        }
    }
}

/* y = act((x - mean) * a + beta), a = invstd * gamma, over rows [r0, r1). */
PTL_CPU_CLONES
static void chunk_apply(int64_t r0, int64_t r1, int c, const float *x, const float *mean, const float *a,
                        const float *beta, int silu, float *y, int ld)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * c;
        float *yr = y + r * ld;
        if (silu) {
#pragma omp simd
            for (int j = 0; j < c; j++) {
                const float z = (xr[j] - mean[j]) * a[j] + beta[j];
                yr[j] = z * ptl_cpu_sigmoidf(z);
            }
        } else {
#pragma omp simd
            for (int j = 0; j < c; j++)
                yr[j] = (xr[j] - mean[j]) * a[j] + beta[j];
        }
    }
}

int ptl_cpu_batchnorm_forward(int64_t m, int c, const float *x, const float *gamma, const float *beta,
                              float *running_mean, float *running_var, int training, ptl_act act, float *save_mean,
                              float *save_invstd, float *y, int ld, void *workspace, size_t workspace_bytes)
{
    if (check("cpu_batchnorm_forward", m, c, ld, act, workspace_bytes, workspace))
        return -1;
    const int64_t rows = chunk_rows(c), nchunks = num_chunks(m, c);
    if (training) {
        double *part = workspace; /* per chunk: c sums, then c sums of squares */
        const float *shift = x;   /* the first row */
#pragma omp parallel for schedule(dynamic, 1) if (nchunks > 1 && m * c > PTL_CPU_PAR_MIN)
        for (int64_t k = 0; k < nchunks; k++) {
            const int64_t r0 = k * rows, r1 = r0 + rows < m ? r0 + rows : m;
            chunk_moments(r0, r1, c, x, shift, part + k * 2 * c, part + k * 2 * c + c);
        }
        for (int j = 0; j < c; j++) {
            double s1 = 0, s2 = 0;
            for (int64_t k = 0; k < nchunks; k++) {
                s1 += part[k * 2 * c + j];
                s2 += part[k * 2 * c + c + j];
            }
            const double dmean = s1 / (double)m, mean = shift[j] + dmean;
            double var = s2 / (double)m - dmean * dmean;
            var = var > 0 ? var : 0;
            const double unbiased = m > 1 ? var * (double)m / (double)(m - 1) : var;
            save_mean[j] = (float)mean;
            save_invstd[j] = (float)(1.0 / sqrt(var + PTL_BN_EPS));
            running_mean[j] = (float)((1.0 - PTL_BN_MOMENTUM) * running_mean[j] + PTL_BN_MOMENTUM * mean);
            running_var[j] = (float)((1.0 - PTL_BN_MOMENTUM) * running_var[j] + PTL_BN_MOMENTUM * unbiased);
        }
    } else {
        for (int j = 0; j < c; j++) {
            save_mean[j] = running_mean[j];
            save_invstd[j] = (float)(1.0 / sqrt((double)running_var[j] + PTL_BN_EPS));
        }
    }
    float a[c];
    for (int j = 0; j < c; j++)
        a[j] = save_invstd[j] * gamma[j];
    const int silu = act == PTL_ACT_SILU;
#pragma omp parallel for schedule(dynamic, 1) if (nchunks > 1 && m * c > PTL_CPU_PAR_MIN)
    for (int64_t k = 0; k < nchunks; k++) {
        const int64_t r0 = k * rows, r1 = r0 + rows < m ? r0 + rows : m;
        chunk_apply(r0, r1, c, x, save_mean, a, beta, silu, y, ld);
    }
    return 0;
}

/* Pass 1 over rows [r0, r1): g = dy * act'(z) (stored in dx when act is SiLU) and, per channel, the
 * sums of g and g * xhat into sg/sgx (overwritten). */
PTL_CPU_CLONES
static void chunk_grad_sums(int64_t r0, int64_t r1, int c, const float *x, const float *dy, int ld,
                            const float *mean, const float *invstd, const float *gamma, const float *beta, int silu,
                            float *dx, double *sg, double *sgx)
{
    for (int j = 0; j < c; j++)
        sg[j] = sgx[j] = 0;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * c, *dyr = dy + r * ld;
        float *dxr = dx + r * c;
        if (silu) {
#pragma omp simd
            for (int j = 0; j < c; j++) {
                const float xhat = (xr[j] - mean[j]) * invstd[j];
                const float z = xhat * gamma[j] + beta[j];
                const float s = ptl_cpu_sigmoidf(z);
                const float g = dyr[j] * (s * (1 + z * (1 - s)));
                dxr[j] = g;
                sg[j] += g;
                sgx[j] += g * xhat;
            }
        } else {
#pragma omp simd
            for (int j = 0; j < c; j++) {
                const float xhat = (xr[j] - mean[j]) * invstd[j];
                sg[j] += dyr[j];
                sgx[j] += dyr[j] * xhat;
            }
        }
    }
}

/* Pass 2 over rows [r0, r1): dx = scale * (g - mean_g - xhat * mean_gx) in training, scale * g in eval. */
PTL_CPU_CLONES
static void chunk_grad_apply(int64_t r0, int64_t r1, int c, const float *x, const float *g, int ldg,
                             const float *mean, const float *invstd, const float *scale, const float *mean_g,
                             const float *mean_gx, int training, float *dx)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * c, *gr = g + r * ldg;
        float *dxr = dx + r * c;
        if (training) {
#pragma omp simd
            for (int j = 0; j < c; j++) {
                const float xhat = (xr[j] - mean[j]) * invstd[j];
                dxr[j] = scale[j] * (gr[j] - mean_g[j] - xhat * mean_gx[j]);
            }
        } else {
#pragma omp simd
            for (int j = 0; j < c; j++)
                dxr[j] = scale[j] * gr[j];
        }
    }
}

/* Eval without SiLU needs no pass 1 for dx; the sums run when dgamma/dbeta are wanted. */
int ptl_cpu_batchnorm_backward(int64_t m, int c, const float *x, const float *dy, int ld, const float *gamma,
                               const float *beta, const float *save_mean, const float *save_invstd, int training,
                               ptl_act act, float *dx, float *dgamma, float *dbeta, void *workspace,
                               size_t workspace_bytes)
{
    if (check("cpu_batchnorm_backward", m, c, ld, act, workspace_bytes, workspace))
        return -1;
    const int64_t rows = chunk_rows(c), nchunks = num_chunks(m, c);
    const int silu = act == PTL_ACT_SILU;
    double *part = workspace;
    float mean_g[c], mean_gx[c], scale[c];
    if (silu || training || dgamma || dbeta) {
#pragma omp parallel for schedule(dynamic, 1) if (nchunks > 1 && m * c > PTL_CPU_PAR_MIN)
        for (int64_t k = 0; k < nchunks; k++) {
            const int64_t r0 = k * rows, r1 = r0 + rows < m ? r0 + rows : m;
            chunk_grad_sums(r0, r1, c, x, dy, ld, save_mean, save_invstd, gamma, beta, silu, dx, part + k * 2 * c,
                            part + k * 2 * c + c);
        }
        for (int j = 0; j < c; j++) {
            double sg = 0, sgx = 0;
            for (int64_t k = 0; k < nchunks; k++) {
                sg += part[k * 2 * c + j];
                sgx += part[k * 2 * c + c + j];
            }
            mean_g[j] = (float)(sg / (double)m);
            mean_gx[j] = (float)(sgx / (double)m);
            if (dbeta)
                dbeta[j] = (float)(dbeta[j] + sg);
            if (dgamma)
                dgamma[j] = (float)(dgamma[j] + sgx);
        }
    }
    for (int j = 0; j < c; j++)
        scale[j] = gamma[j] * save_invstd[j];
    const float *g = silu ? dx : dy; /* rows c apart (dx) or ld apart (dy) */
#pragma omp parallel for schedule(dynamic, 1) if (nchunks > 1 && m * c > PTL_CPU_PAR_MIN)
    for (int64_t k = 0; k < nchunks; k++) {
        const int64_t r0 = k * rows, r1 = r0 + rows < m ? r0 + rows : m;
        chunk_grad_apply(r0, r1, c, x, g, silu ? c : ld, save_mean, save_invstd, scale, mean_g, mean_gx, training,
                         dx);
    }
    return 0;
}
