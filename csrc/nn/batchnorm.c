/* BatchNorm (+ optional SiLU) over (m, c) rows, CPU reference. The body is compiled for float and
 * double by including this file into itself.
 *
 * Per-channel reductions run over blocks of CH_BLOCK adjacent channels (one block per task, rows in
 * order, double accumulators), so every statistic is summed in the same order for any thread count.
 * The element-wise passes run over rows. */
#ifndef PTL_BODY
#include "batchnorm.h"

#include <math.h>

#define CH_BLOCK 8

#define PTL_BODY_FILE "batchnorm.c"
#include "float_double.h"

static int check(const char *fn, ptl_dtype dt, int64_t m, int c, int ld, ptl_act act)
{
    if (dt != PTL_FLOAT32 && dt != PTL_FLOAT64) {
        ptl_set_error(PTL_ERR_TYPE, "%s: dtype %s is not supported on the CPU (float32 or float64)", fn,
                      ptl_dtype_name(dt));
        return -1;
    }
    return ptl_batchnorm_check(fn, m, c, ld, act);
}

int ptl_batchnorm_check(const char *fn, int64_t m, int c, int ld, ptl_act act)
{
    if (m <= 0 || c <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "%s: empty input (m=%lld rows, c=%d channels)", fn, (long long)m, c);
    if (act != PTL_ACT_NONE && act != PTL_ACT_SILU)
        return ptl_set_error(PTL_ERR_VALUE, "%s: unknown activation %d", fn, (int)act);
    if (ld < c)
        return ptl_set_error(PTL_ERR_VALUE, "%s: rows of %d elements hold no %d channels", fn, ld, c);
    return 0;
}

int ptl_batchnorm_forward(ptl_dtype dt, int64_t m, int c, const void *x, const void *gamma, const void *beta,
                          void *running_mean, void *running_var, int training, ptl_act act, void *save_mean,
                          void *save_invstd, void *y, int ld)
{
    if (check("batchnorm_forward", dt, m, c, ld, act))
        return -1;
    if (dt == PTL_FLOAT32)
        bn_fwd_f32(m, c, x, gamma, beta, running_mean, running_var, training, act, save_mean, save_invstd, y, ld);
    else
        bn_fwd_f64(m, c, x, gamma, beta, running_mean, running_var, training, act, save_mean, save_invstd, y, ld);
    return 0;
}

int ptl_batchnorm_backward(ptl_dtype dt, int64_t m, int c, const void *x, const void *dy, int ld, const void *gamma,
                           const void *beta, const void *save_mean, const void *save_invstd, int training,
                           ptl_act act, void *dx, void *dgamma, void *dbeta)
{
    if (check("batchnorm_backward", dt, m, c, ld, act))
        return -1;
    if (dt == PTL_FLOAT32)
        bn_bwd_f32(m, c, x, dy, ld, gamma, beta, save_mean, save_invstd, training, act, dx, dgamma, dbeta);
    else
        bn_bwd_f64(m, c, x, dy, ld, gamma, beta, save_mean, save_invstd, training, act, dx, dgamma, dbeta);
    return 0;
}

#else

static void F(bn_fwd)(int64_t m, int c, const void *xv, const void *gv, const void *bv, void *rmv, void *rvv,
                      int training, ptl_act act, void *smv, void *siv, void *yv, int ld)
{
    const T *x = xv, *gamma = gv, *beta = bv;
    T *rm = rmv, *rv = rvv, *smean = smv, *sinv = siv, *y = yv;
    if (training) {
        const int nblocks = (c + CH_BLOCK - 1) / CH_BLOCK;
#pragma omp parallel for schedule(static) if (m * c > 32768)
        for (int blk = 0; blk < nblocks; blk++) {
            const int c0 = blk * CH_BLOCK, nc = c0 + CH_BLOCK < c ? CH_BLOCK : c - c0;
            double sum[CH_BLOCK] = {0}, sq[CH_BLOCK] = {0}, mean[CH_BLOCK];
            for (int64_t r = 0; r < m; r++)
                for (int j = 0; j < nc; j++)
                    sum[j] += x[r * c + c0 + j];
            for (int j = 0; j < nc; j++)
                mean[j] = sum[j] / (double)m;
            for (int64_t r = 0; r < m; r++)
                for (int j = 0; j < nc; j++) {
                    const double t = x[r * c + c0 + j] - mean[j];
                    sq[j] += t * t;
                }
            for (int j = 0; j < nc; j++) {
                const double var = sq[j] / (double)m;
                const double unbiased = m > 1 ? sq[j] / (double)(m - 1) : var;
                smean[c0 + j] = (T)mean[j];
                sinv[c0 + j] = (T)(1.0 / sqrt(var + PTL_BN_EPS));
                rm[c0 + j] = (T)((1.0 - PTL_BN_MOMENTUM) * rm[c0 + j] + PTL_BN_MOMENTUM * mean[j]);
                rv[c0 + j] = (T)((1.0 - PTL_BN_MOMENTUM) * rv[c0 + j] + PTL_BN_MOMENTUM * unbiased);
            }
        }
    } else {
        for (int j = 0; j < c; j++) {
            smean[j] = rm[j];
            sinv[j] = (T)(1.0 / sqrt((double)rv[j] + PTL_BN_EPS));
        }
    }
#pragma omp parallel for schedule(static) if (m * c > 32768)
    for (int64_t r = 0; r < m; r++) {
        const T *xr = x + r * c;
        T *yr = y + r * ld;
        if (act == PTL_ACT_SILU)
            for (int j = 0; j < c; j++) {
                const T z = (xr[j] - smean[j]) * sinv[j] * gamma[j] + beta[j];
                yr[j] = z * SIGMOID(z);
            }
        else
            for (int j = 0; j < c; j++)
                yr[j] = (xr[j] - smean[j]) * sinv[j] * gamma[j] + beta[j];
    }
}

/* Pass 1 (per channel block): g = dy * act'(z) (stored in dx when act is SiLU), and the sums of g and
 * g*xhat. Pass 2 (per row): dx = gamma*invstd*(g - mean(g) - xhat*mean(g*xhat)) in training, or
 * gamma*invstd*g in eval. */
static void F(bn_bwd)(int64_t m, int c, const void *xv, const void *dyv, int ld, const void *gv, const void *bv,
                      const void *smv, const void *siv, int training, ptl_act act, void *dxv, void *dgv, void *dbv)
{
    const T *x = xv, *dy = dyv, *gamma = gv, *beta = bv, *smean = smv, *sinv = siv;
    T *dx = dxv, *dgamma = dgv, *dbeta = dbv;
    const int need_sums = training || dgamma || dbeta;
    const int nblocks = (c + CH_BLOCK - 1) / CH_BLOCK;
    /* g's rows: dx's (c apart) with SiLU, else dy's (ld apart) */
    const T *g = act == PTL_ACT_SILU ? dx : dy;
    const int ldg = act == PTL_ACT_SILU ? c : ld;
    /* Per-channel means of g and g*xhat for pass 2 (c is at most a few thousand). */
    T mean_g[c], mean_gx[c];
    if (act == PTL_ACT_SILU || need_sums) {
#pragma omp parallel for schedule(static) if (m * c > 32768)
        for (int blk = 0; blk < nblocks; blk++) {
            const int c0 = blk * CH_BLOCK, nc = c0 + CH_BLOCK < c ? CH_BLOCK : c - c0;
            double sg[CH_BLOCK] = {0}, sgx[CH_BLOCK] = {0};
            for (int64_t r = 0; r < m; r++)
                for (int j = 0; j < nc; j++) {
                    const int64_t i = r * c + c0 + j;
                    const T xhat = (x[i] - smean[c0 + j]) * sinv[c0 + j];
                    T gi = dy[r * ld + c0 + j];
                    if (act == PTL_ACT_SILU) {
                        const T z = xhat * gamma[c0 + j] + beta[c0 + j];
                        const T s = SIGMOID(z);
                        gi = gi * (s * (1 + z * (1 - s)));
                        dx[i] = gi;
                    }
                    sg[j] += gi;
                    sgx[j] += gi * xhat;
                }
            for (int j = 0; j < nc; j++) {
                mean_g[c0 + j] = (T)(sg[j] / (double)m);
                mean_gx[c0 + j] = (T)(sgx[j] / (double)m);
                if (dbeta)
                    dbeta[c0 + j] = (T)(dbeta[c0 + j] + sg[j]);
                if (dgamma)
                    dgamma[c0 + j] = (T)(dgamma[c0 + j] + sgx[j]);
            }
        }
    }
#pragma omp parallel for schedule(static) if (m * c > 32768)
    for (int64_t r = 0; r < m; r++)
        for (int j = 0; j < c; j++) {
            const int64_t i = r * c + j;
            const T scale = gamma[j] * sinv[j];
            const T gi = g[r * ldg + j];
            if (training) {
                const T xhat = (x[i] - smean[j]) * sinv[j];
                dx[i] = scale * (gi - mean_g[j] - xhat * mean_gx[j]);
            } else {
                dx[i] = scale * gi;
            }
        }
}

#endif
