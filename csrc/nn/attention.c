/* Attention core (CPU reference), compiled for float and double by including this file into itself.
 * One task per (image, head); inside it every sum runs over its index in ascending order.
 *
 * Backward, per head with P the saved softmax, dO the output gradient (i: query, j: key):
 *   dv_j = dv_extra_j + sum_i P_ij dO_i
 *   dP_ij = dO_i . v_j,  r_i = sum_j P_ij dP_ij,  dZ_ij = P_ij (dP_ij - r_i)   (softmax backward)
 *   dq_i = scale sum_j dZ_ij k_j,  dk_j = scale sum_i dZ_ij q_i
 * dP_ij is recomputed (twice) instead of stored, so no workspace is needed. */
#ifndef PTL_BODY
#include "attention.h"

#include <math.h>
#include <string.h>

#define PTL_BODY_FILE "attention.c"
#include "float_double.h"

static int check(const char *fn, ptl_dtype dt, int b, int n, int heads, int kd, int hd)
{
    if (dt != PTL_FLOAT32 && dt != PTL_FLOAT64) {
        ptl_set_error(PTL_ERR_TYPE, "%s: dtype %s is not supported on the CPU (float32 or float64)", fn,
                      ptl_dtype_name(dt));
        return -1;
    }
    if (b <= 0 || n <= 0 || heads <= 0 || kd <= 0 || hd <= 0) {
        ptl_set_error(PTL_ERR_VALUE, "%s: sizes must be positive (b=%d n=%d heads=%d kd=%d hd=%d)", fn, b, n,
                      heads, kd, hd);
        return -1;
    }
    return 0;
}

int ptl_attention_forward(ptl_dtype dt, int b, int n, int heads, int kd, int hd, const void *qkv, void *attn,
                          void *o, void *v)
{
    if (check("attention_forward", dt, b, n, heads, kd, hd))
        return -1;
    if (dt == PTL_FLOAT32)
        attn_fwd_f32(b, n, heads, kd, hd, qkv, attn, o, v);
    else
        attn_fwd_f64(b, n, heads, kd, hd, qkv, attn, o, v);
    return 0;
}

int ptl_attention_backward(ptl_dtype dt, int b, int n, int heads, int kd, int hd, const void *qkv,
                           const void *attn, const void *d_o, const void *dv, void *dqkv)
{
    if (check("attention_backward", dt, b, n, heads, kd, hd))
        return -1;
    if (dt == PTL_FLOAT32)
        attn_bwd_f32(b, n, heads, kd, hd, qkv, attn, d_o, dv, dqkv);
    else
        attn_bwd_f64(b, n, heads, kd, hd, qkv, attn, d_o, dv, dqkv);
    return 0;
}

#else

static inline T F(adot)(const T *a, const T *b, int n)
{
    T s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void F(attn_fwd)(int b, int n, int heads, int kd, int hd, const void *qkvv, void *attnv, void *ov, void *vv)
{
    const T *qkv = qkvv;
    T *attn = attnv, *o = ov, *vout = vv;
    const int per = 2 * kd + hd, cq = heads * per, dim = heads * hd;
    const T scale = (T)(1.0 / sqrt((double)kd));
    const int64_t tasks = (int64_t)b * heads;
#pragma omp parallel for schedule(static) if (tasks * n * n * (kd + hd) > 65536)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t bi = t / heads;
        const int h = (int)(t % heads);
        const T *base = qkv + bi * n * cq + (int64_t)h * per;
        for (int i = 0; i < n; i++) {
            const T *qi = base + (int64_t)i * cq;
            T *p = attn + (t * n + i) * n;
            T mx = -INFINITY;
            for (int j = 0; j < n; j++) {
                p[j] = F(adot)(qi, base + (int64_t)j * cq + kd, kd) * scale;
                if (p[j] > mx)
                    mx = p[j];
            }
            double sum = 0;
            for (int j = 0; j < n; j++) {
                p[j] = (T)exp((double)(p[j] - mx));
                sum += p[j];
            }
            for (int j = 0; j < n; j++)
                p[j] = (T)(p[j] / sum);
            T *oi = o + (bi * n + i) * dim + (int64_t)h * hd;
            memset(oi, 0, sizeof(T) * hd);
            for (int j = 0; j < n; j++) {
                const T *vj = base + (int64_t)j * cq + 2 * kd;
                for (int d = 0; d < hd; d++)
                    oi[d] += vj[d] * p[j];
            }
            if (vout)
                memcpy(vout + (bi * n + i) * dim + (int64_t)h * hd, qi + 2 * kd, sizeof(T) * hd);
        }
    }
}

static void F(attn_bwd)(int b, int n, int heads, int kd, int hd, const void *qkvv, const void *attnv, const void *dov,
                        const void *dvv, void *dqkvv)
{
    const T *qkv = qkvv, *attn = attnv, *dO = dov, *dvx = dvv;
    T *dqkv = dqkvv;
    const int per = 2 * kd + hd, cq = heads * per, dim = heads * hd;
    const T scale = (T)(1.0 / sqrt((double)kd));
    const int64_t tasks = (int64_t)b * heads;
#pragma omp parallel for schedule(static) if (tasks * n * n * (kd + hd) > 65536)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t bi = t / heads;
        const int h = (int)(t % heads);
        const T *base = qkv + bi * n * cq + (int64_t)h * per;
        T *dbase = dqkv + bi * n * cq + (int64_t)h * per;
        const T *dob = dO + bi * n * dim + (int64_t)h * hd;
        const T *P = attn + t * n * n;
        for (int i = 0; i < n; i++) {
            T *di = dbase + (int64_t)i * cq;
            memset(di, 0, sizeof(T) * 2 * kd);
            if (dvx)
                memcpy(di + 2 * kd, dvx + (bi * n + i) * dim + (int64_t)h * hd, sizeof(T) * hd);
            else
                memset(di + 2 * kd, 0, sizeof(T) * hd);
        }
        for (int i = 0; i < n; i++) {
            const T *doi = dob + (int64_t)i * dim;
            for (int j = 0; j < n; j++) {
                T *dvj = dbase + (int64_t)j * cq + 2 * kd;
                const T pij = P[(int64_t)i * n + j];
                for (int d = 0; d < hd; d++)
                    dvj[d] += pij * doi[d];
            }
        }
        for (int i = 0; i < n; i++) {
            const T *doi = dob + (int64_t)i * dim, *qi = base + (int64_t)i * cq, *Pi = P + (int64_t)i * n;
            T *dqi = dbase + (int64_t)i * cq;
            T r = 0;
            for (int j = 0; j < n; j++)
                r += Pi[j] * F(adot)(doi, base + (int64_t)j * cq + 2 * kd, hd);
            for (int j = 0; j < n; j++) {
                const T *kj = base + (int64_t)j * cq + kd;
                T *dkj = dbase + (int64_t)j * cq + kd;
                const T dz = Pi[j] * (F(adot)(doi, base + (int64_t)j * cq + 2 * kd, hd) - r) * scale;
                for (int d = 0; d < kd; d++) {
                    dqi[d] += dz * kj[d];
                    dkj[d] += dz * qi[d];
                }
            }
        }
    }
}

#endif
