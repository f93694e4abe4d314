/* Fast CPU attention core (see attention.h). Task t = image * heads + head owns workspace floats
 * [t * per_task, (t + 1) * per_task): the transposed keys (kd x n), the transposed values (hd x n) and one
 * row of n scores. */
#include "attention.h"

#include <math.h>
#include <string.h>

#include "vector.h"

static size_t per_task(int n, int kd, int hd) { return (size_t)(kd + hd + 1) * (size_t)n; }

size_t ptl_cpu_attention_workspace(int b, int n, int heads, int kd, int hd)
{
    return b > 0 && n > 0 && heads > 0 && kd > 0 && hd > 0
               ? (size_t)b * (size_t)heads * per_task(n, kd, hd) * sizeof(float)
               : 0;
}

static int check(const char *fn, int b, int n, int heads, int kd, int hd, const void *workspace, size_t bytes)
{
    if (b <= 0 || n <= 0 || heads <= 0 || kd <= 0 || hd <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "%s: sizes must be positive (b=%d n=%d heads=%d kd=%d hd=%d)", fn, b, n,
                             heads, kd, hd);
    const size_t need = ptl_cpu_attention_workspace(b, n, heads, kd, hd);
    if (!workspace || bytes < need)
        return ptl_set_error(PTL_ERR_VALUE, "%s: workspace of %zu bytes given, %zu needed", fn,
                             workspace ? bytes : 0, need);
    return 0;
}

/* rows (n, len) at stride `stride` -> (len, n) */
static void transpose(const float *src, int64_t stride, int n, int len, float *dst)
{
    for (int j = 0; j < n; j++)
        for (int d = 0; d < len; d++)
            dst[(int64_t)d * n + j] = src[(int64_t)j * stride + d];
}

/* The helpers are inlined into the per-task functions, which are compiled per ISA (PTL_CPU_CLONES). */

/* s[j] = sum over d (in order) of a[d] * bt[d][j] */
static inline void dots(const float *a, const float *bt, int len, int n, float *s)
{
    for (int j = 0; j < n; j++)
        s[j] = 0;
    for (int d = 0; d < len; d++) {
        const float ad = a[d];
        const float *row = bt + (int64_t)d * n;
#pragma omp simd
        for (int j = 0; j < n; j++)
            s[j] += ad * row[j];
    }
}

/* y += a * x */
static inline void axpy(float *restrict y, float a, const float *restrict x, int len)
{
#pragma omp simd
    for (int d = 0; d < len; d++)
        y[d] += a * x[d];
}

/* p = softmax(scale * s) */
static inline void softmax_row(const float *s, float scale, int n, float *p)
{
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        p[j] = s[j] * scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
        p[j] = ptl_cpu_expf(p[j] - mx);
        sum += p[j];
    }
    const double inv = 1.0 / sum;
#pragma omp simd
    for (int j = 0; j < n; j++)
        p[j] = (float)(p[j] * inv);
}

PTL_CPU_CLONES
static void task_forward(int64_t t, int n, int heads, int kd, int hd, const float *qkv, float *attn, float *o,
                         float *v, float *ws)
{
    const int per = 2 * kd + hd, cq = heads * per, dim = heads * hd;
    const float scale = (float)(1.0 / sqrt((double)kd));
    const int64_t bi = t / heads;
    const int h = (int)(t % heads);
    const float *base = qkv + bi * n * cq + (int64_t)h * per;
    float *kt = ws + (size_t)t * per_task(n, kd, hd), *s = kt + (int64_t)(kd + hd) * n;
    transpose(base + kd, cq, n, kd, kt);
    for (int i = 0; i < n; i++) {
        const float *qi = base + (int64_t)i * cq;
        float *p = attn + (t * n + i) * n;
        dots(qi, kt, kd, n, s);
        softmax_row(s, scale, n, p);
        float *oi = o + (bi * n + i) * dim + (int64_t)h * hd;
        memset(oi, 0, sizeof(float) * (size_t)hd);
        for (int j = 0; j < n; j++)
            axpy(oi, p[j], base + (int64_t)j * cq + 2 * kd, hd);
        if (v)
            memcpy(v + (bi * n + i) * dim + (int64_t)h * hd, qi + 2 * kd, sizeof(float) * (size_t)hd);
    }
}

int ptl_cpu_attention_forward(int b, int n, int heads, int kd, int hd, const float *qkv, float *attn, float *o,
                              float *v, void *workspace, size_t workspace_bytes)
{
    if (check("cpu_attention_forward", b, n, heads, kd, hd, workspace, workspace_bytes))
        return -1;
    const int64_t tasks = (int64_t)b * heads;
#pragma omp parallel for schedule(dynamic, 1) if (tasks * n * n * (kd + hd) > 65536)
    for (int64_t t = 0; t < tasks; t++)
        task_forward(t, n, heads, kd, hd, qkv, attn, o, v, workspace);
    return 0;
}

PTL_CPU_CLONES
static void task_backward(int64_t t, int n, int heads, int kd, int hd, const float *qkv, const float *attn,
                          const float *d_o, const float *dv, float *dqkv, float *ws)
{
    const int per = 2 * kd + hd, cq = heads * per, dim = heads * hd;
    const float scale = (float)(1.0 / sqrt((double)kd));
    const int64_t bi = t / heads;
    const int h = (int)(t % heads);
    const float *base = qkv + bi * n * cq + (int64_t)h * per;
    float *dbase = dqkv + bi * n * cq + (int64_t)h * per;
    const float *dob = d_o + bi * n * dim + (int64_t)h * hd;
    const float *P = attn + t * n * n;
    float *vt = ws + (size_t)t * per_task(n, kd, hd) + (int64_t)kd * n, *dp = vt + (int64_t)hd * n;
    transpose(base + 2 * kd, cq, n, hd, vt);
    for (int i = 0; i < n; i++) {
        float *di = dbase + (int64_t)i * cq;
        memset(di, 0, sizeof(float) * 2 * (size_t)kd);
        if (dv)
            memcpy(di + 2 * kd, dv + (bi * n + i) * dim + (int64_t)h * hd, sizeof(float) * (size_t)hd);
        else
            memset(di + 2 * kd, 0, sizeof(float) * (size_t)hd);
    }
    /* dv_j += sum over i of P_ij dO_i */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            axpy(dbase + (int64_t)j * cq + 2 * kd, P[(int64_t)i * n + j], dob + (int64_t)i * dim, hd);
    /* dP_ij = dO_i . v_j, r_i = sum_j P_ij dP_ij, dZ_ij = P_ij (dP_ij - r_i) scale; dq_i, dk_j from dZ */
    for (int i = 0; i < n; i++) {
        const float *doi = dob + (int64_t)i * dim, *qi = base + (int64_t)i * cq, *Pi = P + (int64_t)i * n;
        float *dqi = dbase + (int64_t)i * cq;
        dots(doi, vt, hd, n, dp);
        float r = 0;
        for (int j = 0; j < n; j++)
            r += Pi[j] * dp[j];
        for (int j = 0; j < n; j++) {
            const float dz = Pi[j] * (dp[j] - r) * scale;
            axpy(dqi, dz, base + (int64_t)j * cq + kd, kd);
            axpy(dbase + (int64_t)j * cq + kd, dz, qi, kd);
        }
    }
}

int ptl_cpu_attention_backward(int b, int n, int heads, int kd, int hd, const float *qkv, const float *attn,
                               const float *d_o, const float *dv, float *dqkv, void *workspace,
                               size_t workspace_bytes)
{
    if (check("cpu_attention_backward", b, n, heads, kd, hd, workspace, workspace_bytes))
        return -1;
    const int64_t tasks = (int64_t)b * heads;
#pragma omp parallel for schedule(dynamic, 1) if (tasks * n * n * (kd + hd) > 65536)
    for (int64_t t = 0; t < tasks; t++)
        task_backward(t, n, heads, kd, hd, qkv, attn, d_o, dv, dqkv, workspace);
    return 0;
}
