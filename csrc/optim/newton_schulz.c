/* Newton-Schulz quintic orthogonalisation (8.4.190's zeropower_via_newtonschulz5), CPU reference.
 * Works in the wide orientation (rows <= cols); callers transpose tall matrices. Precision follows the
 * buffers: float64 or float32 arithmetic, or (bf16 = 1) float32 products rounded to bfloat16 after every
 * stage, which is what the CUDA path (cuBLAS bf16 GEMMs with float32 accumulation) computes. */
#include <stdlib.h>
#include <string.h>

#include "optim.h"

/* A = X X^T (r x r) with X r x c. */
#define NS_GRAM(T, NAME)                                                                    \
    static void NAME(const T *x, T *a, int64_t r, int64_t c)                                \
    {                                                                                        \
        _Pragma("omp parallel for schedule(static) if (r * r * c > 65536)")                  \
        for (int64_t i = 0; i < r; i++)                                                     \
            for (int64_t j = 0; j < r; j++) {                                               \
                const T *xi = x + i * c, *xj = x + j * c;                                   \
                T s = 0;                                                                    \
                for (int64_t k = 0; k < c; k++)                                             \
                    s += xi[k] * xj[k];                                                     \
                a[i * r + j] = s;                                                           \
            }                                                                               \
    }

/* Y = L R with L r x r and R r x c (row-major). */
#define NS_MM(T, NAME)                                                                      \
    static void NAME(const T *l, const T *rt, T *y, int64_t r, int64_t c)                   \
    {                                                                                        \
        _Pragma("omp parallel for schedule(static) if (r * r * c > 65536)")                  \
        for (int64_t i = 0; i < r; i++) {                                                   \
            T *yi = y + i * c;                                                              \
            for (int64_t j = 0; j < c; j++)                                                 \
                yi[j] = 0;                                                                  \
            for (int64_t k = 0; k < r; k++) {                                               \
                T lik = l[i * r + k];                                                       \
                const T *rk = rt + k * c;                                                   \
                for (int64_t j = 0; j < c; j++)                                             \
                    yi[j] += lik * rk[j];                                                   \
            }                                                                               \
        }                                                                                   \
    }

NS_GRAM(float, gram_f32)
NS_GRAM(double, gram_f64)
NS_MM(float, mm_f32)
NS_MM(double, mm_f64)

static void round_bf16_all(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = ptl_round_bf16(x[i]);
}

void ptl_ns5_normalise_f32(float *x, int64_t n, int bf16)
{
    double ss = 0;
    if (bf16)
        round_bf16_all(x, n);
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float norm = (float)sqrt(ss);
    float den = norm + (float)PTL_NS_EPS;
    if (bf16) {
        norm = ptl_round_bf16(norm);
        den = ptl_round_bf16(norm + (float)PTL_NS_EPS);
    }
    for (int64_t i = 0; i < n; i++)
        x[i] = bf16 ? ptl_round_bf16(x[i] / den) : x[i] / den;
}

void ptl_ns5_normalise_f64(double *x, int64_t n)
{
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double den = sqrt(ss) + PTL_NS_EPS;
    for (int64_t i = 0; i < n; i++)
        x[i] /= den;
}

/* One quintic step as 8.4.190's zeropower_via_newtonschulz5: A = X X^T; Bm = baddbmm(A, A, A, beta=b,
 * alpha=c) = b A + c (A A); X = baddbmm(X, Bm, X, beta=a) = a X + Bm X. In bfloat16 every product and
 * each fused baddbmm is rounded once, from float32 (as torch's bf16 matmuls on CPU and CUDA). */
void ptl_ns5_iterate_f32(float *x, int64_t r, int64_t c, int bf16, float *work)
{
    float *a = work, *aa = a + r * r, *bm = aa + r * r, *p = bm + r * r;
    const float ka = (float)PTL_NS_A, kb = (float)PTL_NS_B, kc = (float)PTL_NS_C;
    for (int it = 0; it < PTL_NS_STEPS; it++) {
        gram_f32(x, a, r, c);
        if (bf16)
            round_bf16_all(a, r * r);
        mm_f32(a, a, aa, r, r);
        for (int64_t i = 0; i < r * r; i++) {
            float v = PTL_FADD(PTL_FMUL(kc, aa[i]), PTL_FMUL(kb, a[i]));
            bm[i] = bf16 ? ptl_round_bf16(v) : v;
        }
        mm_f32(bm, x, p, r, c);
        for (int64_t i = 0; i < r * c; i++) {
            float v = PTL_FADD(p[i], PTL_FMUL(ka, x[i]));
            x[i] = bf16 ? ptl_round_bf16(v) : v;
        }
    }
}

void ptl_ns5_iterate_f64(double *x, int64_t r, int64_t c, double *work)
{
    double *a = work, *aa = a + r * r, *p = aa + r * r;
    const double ka = PTL_NS_A, kb = PTL_NS_B, kc = PTL_NS_C;
    for (int it = 0; it < PTL_NS_STEPS; it++) {
        gram_f64(x, a, r, c);
        mm_f64(a, a, aa, r, r);
        for (int64_t i = 0; i < r * r; i++)
            aa[i] = kc * aa[i] + kb * a[i];
        mm_f64(aa, x, p, r, c);
        for (int64_t i = 0; i < r * c; i++)
            x[i] = p[i] + ka * x[i];
    }
}

int ptl_newton_schulz_cpu(const float *x, float *out, int64_t batch, int64_t rows, int64_t cols, int bf16)
{
    int64_t r = rows <= cols ? rows : cols, c = rows <= cols ? cols : rows;
    float *m = NULL, *work = NULL;
    if (batch < 0 || rows <= 0 || cols <= 0) {
        ptl_set_error(PTL_ERR_VALUE, "newton_schulz: bad shape (%lld, %lld, %lld)", (long long)batch,
                      (long long)rows, (long long)cols);
        goto fail;
    }
    m = (float *)malloc(sizeof(float) * (size_t)(r * c));
    work = (float *)malloc(sizeof(float) * (size_t)(3 * r * r + r * c));
    if (!m || !work) {
        ptl_set_error(PTL_ERR_MEMORY, "newton_schulz: out of memory");
        goto fail;
    }
    for (int64_t b = 0; b < batch; b++) {
        const float *xb = x + b * rows * cols;
        float *ob = out + b * rows * cols;
        int tall = rows > cols;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                m[tall ? j * rows + i : i * cols + j] = xb[i * cols + j];
        ptl_ns5_normalise_f32(m, r * c, bf16);
        ptl_ns5_iterate_f32(m, r, c, bf16, work);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                ob[i * cols + j] = m[tall ? j * rows + i : i * cols + j];
    }
    free(m);
    free(work);
    return 0;
fail:
    free(m);
    free(work);
    return -1;
}
