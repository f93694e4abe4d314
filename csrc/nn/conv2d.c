/* Direct NHWC convolution (CPU reference). The element-type-generic body below is compiled twice, for
 * float and double, by including this file into itself; the public entry points dispatch on dtype.
 *
 * Loop order keeps the channel dimension innermost and contiguous: the forward and the weight gradient
 * for one output row/column walk a contiguous run of (kx, ci) in both x and the OHWI weight, and the
 * input gradient is a gather over the output pixels that read each input pixel (with a workspace, for
 * groups == 1, a sum of dot products over a transposed weight). Every output element
 * is owned by one thread and summed in a fixed order, so results do not depend on the thread count. */
#ifndef PTL_BODY
#include "conv2d.h"

#include <string.h>

/* The taps that reach input pixel (iy, ix): for each, its index ky * k + kx and the output pixel
 * oy * wo + ox it feeds, in row-major tap order (the order the input gradient sums in). tap and opix
 * hold k * k entries; returns the count. */
static int conv_input_taps(const ptl_conv2d_desc *d, int iy, int ix, int *tap, int64_t *opix)
{
    int n = 0;
    for (int ky = 0; ky < d->k; ky++) {
        const int ty = iy + d->pad - ky;
        if (ty < 0 || ty % d->stride || ty / d->stride >= d->ho)
            continue;
        for (int kx = 0; kx < d->k; kx++) {
            const int tx = ix + d->pad - kx;
            if (tx < 0 || tx % d->stride || tx / d->stride >= d->wo)
                continue;
            tap[n] = ky * d->k + kx;
            opix[n++] = (int64_t)(ty / d->stride) * d->wo + tx / d->stride;
        }
    }
    return n;
}

#define PTL_BODY_FILE "conv2d.c"
#include "float_double.h"

int ptl_conv2d_init(ptl_conv2d_desc *d, int n, int h, int w, int cin, int cout, int k, int stride, int groups)
{
    if (n <= 0 || h <= 0 || w <= 0 || cin <= 0 || cout <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "conv2d: sizes must be positive (n=%d h=%d w=%d cin=%d cout=%d)", n,
                             h, w, cin, cout);
    if (k <= 0 || stride <= 0 || groups <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "conv2d: k, stride and groups must be positive (k=%d stride=%d groups=%d)",
                             k, stride, groups);
    if (cin % groups || cout % groups)
        return ptl_set_error(PTL_ERR_VALUE, "conv2d: groups=%d must divide cin=%d and cout=%d", groups, cin, cout);
    d->n = n;
    d->h = h;
    d->w = w;
    d->cin = cin;
    d->cout = cout;
    d->k = k;
    d->stride = stride;
    d->groups = groups;
    d->pad = k / 2;
    d->ho = (h + 2 * d->pad - k) / stride + 1;
    d->wo = (w + 2 * d->pad - k) / stride + 1;
    if (d->ho <= 0 || d->wo <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "conv2d: input %dx%d is too small for k=%d", h, w, k);
    return 0;
}

static int bad_dtype(const char *fn, ptl_dtype dt)
{
    return ptl_set_error(PTL_ERR_TYPE, "%s: dtype %s is not supported on the CPU (float32 or float64)", fn,
                         ptl_dtype_name(dt));
}

#define DISPATCH(fn, ...)                                                                                    \
    do {                                                                                                     \
        if (dt == PTL_FLOAT32)                                                                               \
            fn##_f32(__VA_ARGS__);                                                                           \
        else if (dt == PTL_FLOAT64)                                                                          \
            fn##_f64(__VA_ARGS__);                                                                           \
        else                                                                                                 \
            return bad_dtype(#fn, dt);                                                                       \
        return 0;                                                                                            \
    } while (0)

int ptl_conv2d_forward(const ptl_conv2d_desc *d, ptl_dtype dt, const void *x, const void *wt, const void *bias,
                       void *y)
{
    DISPATCH(conv_fwd, d, x, wt, bias, y);
}

int ptl_conv2d_backward_input(const ptl_conv2d_desc *d, ptl_dtype dt, const void *dy, const void *wt, void *dx)
{
    DISPATCH(conv_bwd_input, d, dy, wt, dx);
}

int64_t ptl_conv2d_backward_input_workspace(const ptl_conv2d_desc *d)
{
    return d->groups == 1 ? (int64_t)d->cout * d->k * d->k * d->cin : 0;
}

int ptl_conv2d_backward_input_ws(const ptl_conv2d_desc *d, ptl_dtype dt, const void *dy, const void *wt,
                                 void *workspace, void *dx)
{
    if (!workspace || d->groups != 1)
        return ptl_conv2d_backward_input(d, dt, dy, wt, dx);
    DISPATCH(conv_bwd_input_t, d, dy, wt, workspace, dx);
}

int ptl_conv2d_backward_weight(const ptl_conv2d_desc *d, ptl_dtype dt, const void *x, const void *dy, void *dwt)
{
    DISPATCH(conv_bwd_weight, d, x, dy, dwt);
}

int ptl_conv2d_backward_bias(const ptl_conv2d_desc *d, ptl_dtype dt, const void *dy, void *dbias)
{
    DISPATCH(conv_bwd_bias, d, dy, dbias);
}

int ptl_conv2d_weight_from_oihw(ptl_dtype dt, int cout, int cin_g, int k, const void *src, void *dst)
{
    DISPATCH(conv_w_from_oihw, cout, cin_g, k, src, dst);
}

int ptl_conv2d_weight_to_oihw(ptl_dtype dt, int cout, int cin_g, int k, const void *src, void *dst)
{
    DISPATCH(conv_w_to_oihw, cout, cin_g, k, src, dst);
}

#else /* the body, once per element type T */

/* Below this many multiply-adds a call runs on one thread: waking the team costs more. */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK 262144
#endif

/* Eight independent partial sums combined pairwise: a fixed order the compiler can vectorise. */
static inline T F(dot)(const T *a, const T *b, int n)
{
    T s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
        s4 += a[i + 4] * b[i + 4];
        s5 += a[i + 5] * b[i + 5];
        s6 += a[i + 6] * b[i + 6];
        s7 += a[i + 7] * b[i + 7];
    }
    T s = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static inline void F(axpy)(T *restrict y, T a, const T *restrict x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* y += a[0]*x[0] + a[1]*x[1] + a[2]*x[2] + a[3]*x[3], the four rows of x `ld` apart: one load and
 * store of y per four products. */
static inline void F(axpy4)(T *restrict y, const T *a, const T *restrict x, int64_t ld, int n)
{
    const T a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
    const T *x0 = x, *x1 = x + ld, *x2 = x + 2 * ld, *x3 = x + 3 * ld;
    for (int i = 0; i < n; i++)
        y[i] += (a0 * x0[i] + a1 * x1[i]) + (a2 * x2[i] + a3 * x3[i]);
}

/* The same with eight rows. */
static inline void F(axpy8)(T *restrict y, const T *a, const T *restrict x, int64_t ld, int n)
{
    const T a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7];
    const T *x0 = x, *x1 = x + ld, *x2 = x + 2 * ld, *x3 = x + 3 * ld;
    const T *x4 = x + 4 * ld, *x5 = x + 5 * ld, *x6 = x + 6 * ld, *x7 = x + 7 * ld;
    for (int i = 0; i < n; i++)
        y[i] += ((a0 * x0[i] + a1 * x1[i]) + (a2 * x2[i] + a3 * x3[i])) +
                ((a4 * x4[i] + a5 * x5[i]) + (a6 * x6[i] + a7 * x7[i]));
}

static void F(conv_fwd)(const ptl_conv2d_desc *d, const void *xv, const void *wv, const void *bv, void *yv)
{
    const T *x = xv, *wt = wv, *bias = bv;
    T *y = yv;
    const int h = d->h, w = d->w, cin = d->cin, cout = d->cout, k = d->k, s = d->stride, pad = d->pad;
    const int ho = d->ho, wo = d->wo, cig = cin / d->groups, cog = cout / d->groups;
    const int depthwise = cig == 1 && cog == 1;
    const int64_t rows = (int64_t)d->n * ho;
    const int64_t work = rows * wo * cout * cig * k * k;
#pragma omp parallel for schedule(static) if (work > PAR_MIN_WORK)
    for (int64_t r = 0; r < rows; r++) {
        const int b = (int)(r / ho), oy = (int)(r % ho);
        for (int ox = 0; ox < wo; ox++) {
            T *yp = y + (r * wo + ox) * cout;
            for (int co = 0; co < cout; co++)
                yp[co] = bias ? bias[co] : 0;
            const int ix0 = ox * s - pad;
            const int kx0 = ix0 < 0 ? -ix0 : 0, kx1 = ix0 + k > w ? w - ix0 : k;
            for (int ky = 0; ky < k; ky++) {
                const int iy = oy * s - pad + ky;
                if (iy < 0 || iy >= h)
                    continue;
                const T *xp = x + (((int64_t)b * h + iy) * w + ix0) * cin;
                if (d->groups == 1) {
                    const int len = (kx1 - kx0) * cin;
                    for (int co = 0; co < cout; co++)
                        yp[co] += F(dot)(xp + kx0 * cin, wt + (((int64_t)co * k + ky) * k + kx0) * cin, len);
                } else if (depthwise) {
                    for (int kx = kx0; kx < kx1; kx++) {
                        const T *xq = xp + kx * cin;
                        const T *wq = wt + ky * k + kx;
                        for (int c = 0; c < cout; c++)
                            yp[c] += xq[c] * wq[(int64_t)c * k * k];
                    }
                } else {
                    for (int co = 0; co < cout; co++) {
                        const int g = co / cog;
                        T acc = 0;
                        for (int kx = kx0; kx < kx1; kx++)
                            acc += F(dot)(xp + kx * cin + g * cig, wt + (((int64_t)co * k + ky) * k + kx) * cig, cig);
                        yp[co] += acc;
                    }
                }
            }
        }
    }
}

static void F(conv_bwd_input)(const ptl_conv2d_desc *d, const void *dyv, const void *wv, void *dxv)
{
    const T *dy = dyv, *wt = wv;
    T *dx = dxv;
    const int h = d->h, w = d->w, cin = d->cin, cout = d->cout, k = d->k;
    const int cig = cin / d->groups, cog = cout / d->groups;
    const int64_t kk = (int64_t)k * k, opix_per_image = (int64_t)d->ho * d->wo;
    const int depthwise = cig == 1 && cog == 1;
    const int64_t rows = (int64_t)d->n * h;
    const int64_t work = (int64_t)d->n * d->ho * d->wo * cout * cig * kk;
#pragma omp parallel for schedule(static) if (work > PAR_MIN_WORK)
    for (int64_t r = 0; r < rows; r++) {
        const int b = (int)(r / h), iy = (int)(r % h);
        int tap[kk];
        int64_t opix[kk];
        for (int ix = 0; ix < w; ix++) {
            T *dxp = dx + (r * w + ix) * cin;
            memset(dxp, 0, sizeof(T) * cin);
            const int nt = conv_input_taps(d, iy, ix, tap, opix);
            for (int j = 0; j < nt; j++) {
                const T *dyp = dy + (b * opix_per_image + opix[j]) * cout;
                if (depthwise) {
                    const T *wq = wt + tap[j];
                    for (int c = 0; c < cin; c++)
                        dxp[c] += dyp[c] * wq[(int64_t)c * kk];
                } else if (d->groups == 1) {
                    const int64_t wstride = kk * cin;
                    const T *w0 = wt + (int64_t)tap[j] * cin;
                    int co = 0;
                    for (; co + 8 <= cout; co += 8)
                        F(axpy8)(dxp, dyp + co, w0 + co * wstride, wstride, cin);
                    for (; co + 4 <= cout; co += 4)
                        F(axpy4)(dxp, dyp + co, w0 + co * wstride, wstride, cin);
                    for (; co < cout; co++)
                        F(axpy)(dxp, dyp[co], w0 + co * wstride, cin);
                } else {
                    for (int co = 0; co < cout; co++)
                        F(axpy)(dxp + (co / cog) * cig, dyp[co], wt + ((int64_t)co * kk + tap[j]) * cig, cig);
                }
            }
        }
    }
}

/* groups == 1 with a workspace: the weight is first transposed to (k, k, cin, cout) so that each
 * input-gradient element is a sum of contiguous dot products over cout, like the forward. */
static void F(conv_bwd_input_t)(const ptl_conv2d_desc *d, const void *dyv, const void *wv, void *wsv, void *dxv)
{
    const T *dy = dyv, *wt = wv;
    T *wtt = wsv, *dx = dxv;
    const int h = d->h, w = d->w, cin = d->cin, cout = d->cout, k = d->k;
    const int64_t kk = (int64_t)k * k, opix_per_image = (int64_t)d->ho * d->wo;
    const int64_t rows = (int64_t)d->n * h;
    const int64_t work = (int64_t)d->n * d->ho * d->wo * cout * cin * kk;
    for (int co = 0; co < cout; co++)
        for (int t = 0; t < kk; t++)
            for (int ci = 0; ci < cin; ci++)
                wtt[((int64_t)t * cin + ci) * cout + co] = wt[((int64_t)co * kk + t) * cin + ci];
#pragma omp parallel for schedule(static) if (work > PAR_MIN_WORK)
    for (int64_t r = 0; r < rows; r++) {
        const int b = (int)(r / h), iy = (int)(r % h);
        int tap[kk];
        int64_t opix[kk];
        for (int ix = 0; ix < w; ix++) {
            T *dxp = dx + (r * w + ix) * cin;
            memset(dxp, 0, sizeof(T) * cin);
            const int nt = conv_input_taps(d, iy, ix, tap, opix);
            for (int j = 0; j < nt; j++) {
                const T *dyp = dy + (b * opix_per_image + opix[j]) * cout;
                const T *wq = wtt + (int64_t)tap[j] * cin * cout;
                for (int ci = 0; ci < cin; ci++)
                    dxp[ci] += F(dot)(dyp, wq + (int64_t)ci * cout, cout);
            }
        }
    }
}

/* Output channels are handled in blocks of CO_BLOCK per task so each pass over x serves several
 * weight rows; each weight element is summed over the pixels in scan order by one thread. */
#ifndef CO_BLOCK
#define CO_BLOCK 8
#endif

static void F(conv_bwd_weight)(const ptl_conv2d_desc *d, const void *xv, const void *dyv, void *dwv)
{
    const T *x = xv, *dy = dyv;
    T *dwt = dwv;
    const int n = d->n, h = d->h, w = d->w, cin = d->cin, cout = d->cout, k = d->k, s = d->stride, pad = d->pad;
    const int ho = d->ho, wo = d->wo, cig = cin / d->groups, cog = cout / d->groups;
    const int depthwise = cig == 1 && cog == 1;
    const int nblocks = (cout + CO_BLOCK - 1) / CO_BLOCK;
    const int64_t work = (int64_t)n * ho * wo * cout * cig * k * k;
#pragma omp parallel for schedule(static) if (work > PAR_MIN_WORK)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * CO_BLOCK, c1 = c0 + CO_BLOCK < cout ? c0 + CO_BLOCK : cout;
        for (int b = 0; b < n; b++)
            for (int oy = 0; oy < ho; oy++)
                for (int ky = 0; ky < k; ky++) {
                    const int iy = oy * s - pad + ky;
                    if (iy < 0 || iy >= h)
                        continue;
                    const T *xrow = x + ((int64_t)b * h + iy) * w * cin;
                    const T *dyrow = dy + ((int64_t)b * ho + oy) * wo * cout;
                    int ox = 0;
                    while (ox < wo) {
                        const int ix0 = ox * s - pad;
                        if (d->groups == 1 && ox + 4 <= wo && ix0 >= 0 && ix0 + 3 * s + k <= w) {
                            /* four output pixels whose windows lie inside the row: one dw pass for four */
                            const int len = k * cin;
                            const T *x0 = xrow + (int64_t)ix0 * cin;
                            const int64_t xs = (int64_t)s * cin;
                            for (int co = c0; co < c1; co++) {
                                const T g[4] = {dyrow[(int64_t)ox * cout + co], dyrow[(int64_t)(ox + 1) * cout + co],
                                                dyrow[(int64_t)(ox + 2) * cout + co],
                                                dyrow[(int64_t)(ox + 3) * cout + co]};
                                F(axpy4)(dwt + ((int64_t)co * k + ky) * len, g, x0, xs, len);
                            }
                            ox += 4;
                            continue;
                        }
                        const int kx0 = ix0 < 0 ? -ix0 : 0, kx1 = ix0 + k > w ? w - ix0 : k;
                        const T *xp = xrow + (int64_t)ix0 * cin;
                        const T *dyp = dyrow + (int64_t)ox * cout;
                        for (int co = c0; co < c1; co++) {
                            const T gv = dyp[co];
                            T *dwp = dwt + (((int64_t)co * k + ky) * k) * cig;
                            if (d->groups == 1)
                                F(axpy)(dwp + kx0 * cin, gv, xp + kx0 * cin, (kx1 - kx0) * cin);
                            else if (depthwise)
                                for (int kx = kx0; kx < kx1; kx++)
                                    dwp[kx] += gv * xp[(int64_t)kx * cin + co];
                            else
                                for (int kx = kx0; kx < kx1; kx++)
                                    F(axpy)(dwp + kx * cig, gv, xp + kx * cin + (co / cog) * cig, cig);
                        }
                        ox++;
                    }
                }
    }
}

static void F(conv_bwd_bias)(const ptl_conv2d_desc *d, const void *dyv, void *dbv)
{
    const T *dy = dyv;
    T *db = dbv;
    const int cout = d->cout;
    const int64_t pixels = (int64_t)d->n * d->ho * d->wo;
    const int nblocks = (cout + CO_BLOCK - 1) / CO_BLOCK;
    const int64_t work = pixels * cout;
#pragma omp parallel for schedule(static) if (work > PAR_MIN_WORK)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * CO_BLOCK, c1 = c0 + CO_BLOCK < cout ? c0 + CO_BLOCK : cout;
        double acc[CO_BLOCK] = {0};
        for (int64_t p = 0; p < pixels; p++)
            for (int co = c0; co < c1; co++)
                acc[co - c0] += dy[p * cout + co];
        for (int co = c0; co < c1; co++)
            db[co] = (T)(db[co] + acc[co - c0]);
    }
}

static void F(conv_w_from_oihw)(int cout, int cig, int k, const void *srcv, void *dstv)
{
    const T *src = srcv;
    T *dst = dstv;
    for (int co = 0; co < cout; co++)
        for (int ci = 0; ci < cig; ci++)
            for (int t = 0; t < k * k; t++)
                dst[((int64_t)co * k * k + t) * cig + ci] = src[((int64_t)co * cig + ci) * k * k + t];
}

static void F(conv_w_to_oihw)(int cout, int cig, int k, const void *srcv, void *dstv)
{
    const T *src = srcv;
    T *dst = dstv;
    for (int co = 0; co < cout; co++)
        for (int ci = 0; ci < cig; ci++)
            for (int t = 0; t < k * k; t++)
                dst[((int64_t)co * cig + ci) * k * k + t] = src[((int64_t)co * k * k + t) * cig + ci];
}

#endif
