/* Augmentations of spec §7.4-7.7: mosaic layout, RandomPerspective (matrix, bilinear warp, box rule),
 * HSV jitter, flips. Boxes are (cls, x1, y1, x2, y2) in pixels. In the training pipeline the warp writes
 * the batch image a row at a time and HSV and the flips are applied to each row while it is in L1
 * (augment_rows.h); ptl_warp, ptl_hsv and the flips are the same code on whole images. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "augment_rows.h"

static inline int imax(int a, int b) { return a > b ? a : b; }
static inline int imin(int a, int b) { return a < b ? a : b; }

void ptl_mosaic_rects(int k, int w, int h, int xc, int yc, int sw, int sh, int a[4], int b[4])
{
    int W2 = 2 * sw, H2 = 2 * sh;
    switch (k) {
    case 0:
        a[0] = imax(xc - w, 0), a[1] = imax(yc - h, 0), a[2] = xc, a[3] = yc;
        b[0] = w - (a[2] - a[0]), b[1] = h - (a[3] - a[1]), b[2] = w, b[3] = h;
        break;
    case 1:
        a[0] = xc, a[1] = imax(yc - h, 0), a[2] = imin(xc + w, W2), a[3] = yc;
        b[0] = 0, b[1] = h - (a[3] - a[1]), b[2] = imin(w, a[2] - a[0]), b[3] = h;
        break;
    case 2:
        a[0] = imax(xc - w, 0), a[1] = yc, a[2] = xc, a[3] = imin(H2, yc + h);
        b[0] = w - (a[2] - a[0]), b[1] = 0, b[2] = w, b[3] = imin(a[3] - a[1], h);
        break;
    default:
        a[0] = xc, a[1] = yc, a[2] = imin(xc + w, W2), a[3] = imin(H2, yc + h);
        b[0] = 0, b[1] = 0, b[2] = imin(w, a[2] - a[0]), b[3] = imin(a[3] - a[1], h);
        break;
    }
}

static void matmul3(const double A[9], const double B[9], double C[9])
{
    double t[9];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            t[3 * i + j] = A[3 * i] * B[j] + A[3 * i + 1] * B[3 + j] + A[3 * i + 2] * B[6 + j];
    memcpy(C, t, sizeof t);
}

void ptl_affine_matrix(const ptl_affine_cfg *c, int w_in, int h_in, int w_out, int h_out, const double u[8],
                       double M[9], double *sigma)
{
    const double pi = 3.14159265358979323846;
    double C[9] = {1, 0, -w_in / 2.0, 0, 1, -h_in / 2.0, 0, 0, 1};
    double P[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    P[6] = -c->perspective + 2.0 * c->perspective * u[0];
    P[7] = -c->perspective + 2.0 * c->perspective * u[1];
    double a = (-c->degrees + 2.0 * c->degrees * u[2]) * pi / 180.0;
    double s = (1.0 - c->scale) + 2.0 * c->scale * u[3];
    double R[9] = {s * cos(a), s * sin(a), 0, -s * sin(a), s * cos(a), 0, 0, 0, 1};
    double S[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    S[1] = tan((-c->shear + 2.0 * c->shear * u[4]) * pi / 180.0);
    S[3] = tan((-c->shear + 2.0 * c->shear * u[5]) * pi / 180.0);
    double T[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    T[2] = (0.5 - c->translate + 2.0 * c->translate * u[6]) * w_out;
    T[5] = (0.5 - c->translate + 2.0 * c->translate * u[7]) * h_out;
    double m[9];
    matmul3(P, C, m);
    matmul3(R, m, m);
    matmul3(S, m, m);
    matmul3(T, m, M);
    *sigma = s;
}

static int invert3(const double m[9], double r[9])
{
    double c0 = m[4] * m[8] - m[5] * m[7], c1 = m[5] * m[6] - m[3] * m[8], c2 = m[3] * m[7] - m[4] * m[6];
    double det = m[0] * c0 + m[1] * c1 + m[2] * c2;
    if (det == 0 || !isfinite(det))
        return -1;
    double id = 1.0 / det;
    r[0] = c0 * id;
    r[1] = (m[2] * m[7] - m[1] * m[8]) * id;
    r[2] = (m[1] * m[5] - m[2] * m[4]) * id;
    r[3] = c1 * id;
    r[4] = (m[0] * m[8] - m[2] * m[6]) * id;
    r[5] = (m[2] * m[3] - m[0] * m[5]) * id;
    r[6] = c2 * id;
    r[7] = (m[1] * m[6] - m[0] * m[7]) * id;
    r[8] = (m[0] * m[4] - m[1] * m[3]) * id;
    return 0;
}

/* Bilinear weights of the 32 x 32 sub-pixel positions in 1/32768 units, summing to exactly 32768 (the
 * fixed-point scheme of OpenCV's warpAffine: coordinates to 1/32 pixel, weights to 15 bits). */
static int32_t wtab[32 * 32][4];
static pthread_once_t wtab_once = PTHREAD_ONCE_INIT;

static void wtab_init(void)
{
    for (int fy = 0; fy < 32; fy++)
        for (int fx = 0; fx < 32; fx++) {
            float ax[2] = {1.f - fx / 32.f, fx / 32.f}, ay[2] = {1.f - fy / 32.f, fy / 32.f};
            int w[4], sum = 0, big = 0;
            for (int k = 0; k < 4; k++) {
                w[k] = (int)lrintf(ay[k >> 1] * ax[k & 1] * 32768.f);
                sum += w[k];
                if (w[k] > w[big])
                    big = k;
            }
            w[big] += 32768 - sum;
            for (int k = 0; k < 4; k++)
                wtab[fy * 32 + fx][k] = w[k];
        }
}

static inline int round_sat(double v)
{
    if (v > 2147483647.0)
        return 2147483647;
    if (v < -2147483648.0)
        return -2147483647 - 1;
    return (int)lrint(v);
}

static void hsv_row(uint8_t *p, int n, const ptl_post *post);

static inline uint8_t *out_row(uint8_t *dst, int y, int w, int h, const ptl_post *p)
{
    return dst + (size_t)(p->flip_ud ? h - 1 - y : y) * w * 3;
}

static void reverse_row(uint8_t *row, int w)
{
    for (int a = 0, b = w - 1; a < b; a++, b--)
        for (int c = 0; c < 3; c++) {
            uint8_t t = row[3 * a + c];
            row[3 * a + c] = row[3 * b + c];
            row[3 * b + c] = t;
        }
}

static void fill_row(uint8_t *row, int w, const uint8_t px[3])
{
    if (px[0] == px[1] && px[1] == px[2]) {
        memset(row, px[0], (size_t)w * 3);
        return;
    }
    for (int x = 0; x < w; x++, row += 3)
        row[0] = px[0], row[1] = px[1], row[2] = px[2];
}

/* A row written by the general warps: HSV and the horizontal flip. */
static void post_row(uint8_t *row, int w, const ptl_post *p)
{
    if (p->hsv)
        hsv_row(row, w, p);
    if (p->flip_lr)
        reverse_row(row, w);
}

/* One output pixel from source taps (sx, sy), (sx + 1, sy + 1) with weights w; taps outside read PTL_FILL. */
static inline void warp_px(const uint8_t *src, int w_in, int h_in, size_t ss, int sx, int sy, const int32_t *w,
                           uint8_t *d)
{
    if ((unsigned)sx < (unsigned)(w_in - 1) && (unsigned)sy < (unsigned)(h_in - 1)) {
        const uint8_t *p = src + (size_t)sy * ss + (size_t)sx * 3, *q = p + ss;
        int w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
        d[0] = (uint8_t)((p[0] * w0 + p[3] * w1 + q[0] * w2 + q[3] * w3 + (1 << 14)) >> 15);
        d[1] = (uint8_t)((p[1] * w0 + p[4] * w1 + q[1] * w2 + q[4] * w3 + (1 << 14)) >> 15);
        d[2] = (uint8_t)((p[2] * w0 + p[5] * w1 + q[2] * w2 + q[5] * w3 + (1 << 14)) >> 15);
    } else if (sx < -1 || sy < -1 || sx >= w_in || sy >= h_in) {
        d[0] = d[1] = d[2] = PTL_FILL;
    } else {
        static const uint8_t fill[3] = {PTL_FILL, PTL_FILL, PTL_FILL};
        int ix0 = sx >= 0 && sx < w_in, ix1 = sx + 1 >= 0 && sx + 1 < w_in;
        int iy0 = sy >= 0 && sy < h_in, iy1 = sy + 1 >= 0 && sy + 1 < h_in;
        const uint8_t *p00 = iy0 && ix0 ? src + (size_t)sy * ss + (size_t)sx * 3 : fill;
        const uint8_t *p01 = iy0 && ix1 ? src + (size_t)sy * ss + (size_t)(sx + 1) * 3 : fill;
        const uint8_t *p10 = iy1 && ix0 ? src + (size_t)(sy + 1) * ss + (size_t)sx * 3 : fill;
        const uint8_t *p11 = iy1 && ix1 ? src + (size_t)(sy + 1) * ss + (size_t)(sx + 1) * 3 : fill;
        for (int c = 0; c < 3; c++)
            d[c] = (uint8_t)((p00[c] * w[0] + p01[c] * w[1] + p10[c] * w[2] + p11[c] * w[3] + (1 << 14)) >> 15);
    }
}

/* Column tap of the separable warp: offset of the left tap in the blended row, and the weights
 * (32 - f) | f << 16 of the left and right taps. */
typedef struct {
    int off;
    uint32_t w;
} col_tap;

/* t = a * wa + b * wb over n bytes (the vertical half of the bilinear tap; wa + wb = 32). */
static void blend_rows(const uint8_t *__restrict a, const uint8_t *__restrict b, uint16_t *__restrict t, int n,
                       int wa, int wb)
{
    int i = 0;
#ifdef __SSE2__
    const __m128i z = _mm_setzero_si128(), va = _mm_set1_epi16((short)wa), vb = _mm_set1_epi16((short)wb);
    for (; i + 16 <= n; i += 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(a + i)), y = _mm_loadu_si128((const __m128i *)(b + i));
        __m128i lo = _mm_add_epi16(_mm_mullo_epi16(_mm_unpacklo_epi8(x, z), va),
                                   _mm_mullo_epi16(_mm_unpacklo_epi8(y, z), vb));
        __m128i hi = _mm_add_epi16(_mm_mullo_epi16(_mm_unpackhi_epi8(x, z), va),
                                   _mm_mullo_epi16(_mm_unpackhi_epi8(y, z), vb));
        _mm_storeu_si128((__m128i *)(t + i), lo);
        _mm_storeu_si128((__m128i *)(t + i + 8), hi);
    }
#endif
    for (; i < n; i++)
        t[i] = (uint16_t)(a[i] * wa + b[i] * wb);
}

static inline void interp_px(const uint16_t *t, uint32_t w, uint8_t *d)
{
    int g = (int)(w & 0xffff), f = (int)(w >> 16);
    d[0] = (uint8_t)((t[0] * g + t[3] * f + 512) >> 10);
    d[1] = (uint8_t)((t[1] * g + t[4] * f + 512) >> 10);
    d[2] = (uint8_t)((t[2] * g + t[5] * f + 512) >> 10);
}

/* The horizontal half: d = (t[left] (32 - f) + t[right] f + 512) >> 10, written backwards for a flip.
 * With SSE2 (every x86-64) a pixel is one multiply-add of the interleaved taps and a 4-byte store whose
 * extra byte belongs to the pixel written next; the last pixel is stored bytewise. */
static void interp_row(const uint16_t *__restrict tmp, const col_tap *__restrict ct, uint8_t *__restrict d, int w,
                       int reverse)
{
    ptrdiff_t step = 3;
    if (reverse) {
        d += (size_t)3 * (w - 1);
        step = -3;
    }
    int x = 0;
#ifdef __SSE2__
    const __m128i half = _mm_set1_epi32(512);
    for (; x < w - 1; x++, d += step) {
        const uint16_t *t = tmp + ct[x].off;
        __m128i a = _mm_loadl_epi64((const __m128i *)t), b = _mm_loadl_epi64((const __m128i *)(t + 3));
        __m128i s = _mm_madd_epi16(_mm_unpacklo_epi16(a, b), _mm_set1_epi32((int)ct[x].w));
        s = _mm_srli_epi32(_mm_add_epi32(s, half), 10);
        s = _mm_packs_epi32(s, s);
        uint32_t v = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(s, s));
        if (reverse) {
            v <<= 8;
            memcpy(d - 1, &v, 4);
        } else {
            memcpy(d, &v, 4);
        }
    }
#endif
    for (; x < w; x++, d += step)
        interp_px(tmp + ct[x].off, ct[x].w, d);
}

/* Affine warp without rotation or shear (the default): x and y separate. Coordinates are those of the
 * fixed-point scheme of OpenCV's warpAffine (1/1024 pixel, taps and weights to 1/32 pixel); its 15-bit
 * bilinear weights are exact products of the 1/32 factors, so blending two source rows with the 5-bit
 * y weights and then the blended columns with the 5-bit x weights, rounding once, gives the same bytes.
 * Taps outside the input read PTL_FILL: the blended row has PTL_FILL columns at -1, w_in and w_in + 1, and
 * rows -1 and h_in are a PTL_FILL row. */
static int warp_separable(ptl_row_fn row, void *ctx, int w_in, int h_in, uint8_t *dst, int w_out, int h_out,
                          const double im[9], const ptl_post *post)
{
    size_t ss = (size_t)w_in * 3;
    col_tap *ct = malloc(sizeof(col_tap) * (size_t)w_out);
    /* Columns -1 .. w_in + 1, and one element more for the 4-element loads of interp_row. */
    uint16_t *tmp = calloc(3 * ((size_t)w_in + 3) + 1, sizeof(uint16_t));
    uint8_t *fillrow = malloc(ss);
    if (!ct || !tmp || !fillrow) {
        free(ct);
        free(tmp);
        free(fillrow);
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory warping a %dx%d image", w_out, h_out);
    }
    memset(fillrow, PTL_FILL, ss);
    int X0 = round_sat(im[2] * 1024) + 16, lo = w_in, hi = -1;
    for (int x = 0; x < w_out; x++) {
        int X = (int)(((long long)X0 + round_sat(im[0] * x * 1024)) >> 5), sx = X >> 5, f = X & 31;
        if (sx < -1)
            sx = -1, f = 0;
        else if (sx >= w_in)
            sx = w_in, f = 0;
        ct[x].off = 3 * (sx + 1);
        ct[x].w = (uint32_t)(32 - f) | (uint32_t)f << 16;
        lo = sx < lo ? sx : lo;
        hi = sx + 1 > hi ? sx + 1 : hi;
    }
    int c0 = lo < 0 ? 0 : lo, c1 = hi + 1 < w_in ? hi + 1 : w_in; /* input columns the taps read */
    for (int c = 0; c < 3; c++)
        tmp[c] = tmp[3 * (w_in + 1) + c] = tmp[3 * (w_in + 2) + c] = PTL_FILL * 32;
    uint16_t *t = tmp + 3;
    int prev = INT_MIN; /* the last blended Y */
    for (int y = 0; y < h_out; y++) {
        uint8_t *d = out_row(dst, y, w_out, h_out, post);
        int Y = (round_sat((im[4] * y + im[5]) * 1024) + 16) >> 5, sy = Y >> 5, fy = Y & 31;
        if (sy < -1 || sy >= h_in) {
            fill_row(d, w_out, post->fill);
            continue;
        }
        if (Y != prev && c1 > c0) {
            const uint8_t *r0 = sy >= 0 ? row(ctx, sy, c0, c1, sy + 1) : fillrow + 3 * (size_t)c0;
            const uint8_t *r1 = sy + 1 < h_in ? row(ctx, sy + 1, c0, c1, sy) : fillrow + 3 * (size_t)c0;
            blend_rows(r0, r1, t + 3 * (size_t)c0, 3 * (c1 - c0), 32 - fy, fy);
        }
        prev = Y;
        interp_row(tmp, ct, d, w_out, post->flip_lr);
        if (post->hsv)
            hsv_row(d, w_out, post);
    }
    free(ct);
    free(tmp);
    free(fillrow);
    return 0;
}

/* The rows of an image in memory (a ptl_row_fn). */
typedef struct {
    const uint8_t *src;
    size_t stride;
} image_rows;

static const uint8_t *image_row(void *ctx, int y, int x0, int x1, int keep)
{
    const image_rows *r = ctx;
    (void)x1, (void)keep;
    return r->src + (size_t)y * r->stride + (size_t)x0 * 3;
}

int ptl_warp_is_separable(const double M[9])
{
    double im[9];
    return M[6] == 0 && M[7] == 0 && invert3(M, im) == 0 && im[1] == 0 && im[3] == 0;
}

int ptl_warp_rows(ptl_row_fn row, void *ctx, int w_in, int h_in, uint8_t *dst, int w_out, int h_out,
                  const double M[9], const ptl_post *post)
{
    double im[9];
    if (!ptl_warp_is_separable(M) || invert3(M, im) != 0)
        return ptl_set_error(PTL_ERR_VALUE, "ptl_warp_rows needs an invertible matrix without rotation, shear or "
                                            "perspective");
    return warp_separable(row, ctx, w_in, h_in, dst, w_out, h_out, im, post);
}

/* Affine warp with rotation or shear: source coordinates in 1/1024 pixel accumulated per row (two adds a
 * pixel), taps and weights in 1/32 pixel. */
static int warp_affine(const uint8_t *src, int w_in, int h_in, uint8_t *dst, int w_out, int h_out, const double im[9],
                       const ptl_post *post)
{
    int *adelta = malloc(sizeof(int) * 2 * (size_t)w_out);
    if (!adelta)
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory warping a %dx%d image", w_out, h_out);
    int *bdelta = adelta + w_out;
    pthread_once(&wtab_once, wtab_init);
    for (int x = 0; x < w_out; x++) {
        adelta[x] = round_sat(im[0] * x * 1024);
        bdelta[x] = round_sat(im[3] * x * 1024);
    }
    size_t ss = (size_t)w_in * 3;
    for (int y = 0; y < h_out; y++) {
        int X0 = round_sat((im[1] * y + im[2]) * 1024) + 16, Y0 = round_sat((im[4] * y + im[5]) * 1024) + 16;
        uint8_t *d = out_row(dst, y, w_out, h_out, post), *row = d;
        for (int x = 0; x < w_out; x++, d += 3) {
            int X = (X0 + adelta[x]) >> 5, Y = (Y0 + bdelta[x]) >> 5;
            warp_px(src, w_in, h_in, ss, X >> 5, Y >> 5, wtab[((Y & 31) << 5) | (X & 31)], d);
        }
        post_row(row, w_out, post);
    }
    free(adelta);
    return 0;
}

int ptl_warp_post(const uint8_t *src, int w_in, int h_in, uint8_t *dst, int w_out, int h_out, const double M[9],
                  const ptl_post *post)
{
    double im[9];
    if (invert3(M, im) != 0)
        return ptl_set_error(PTL_ERR_VALUE, "augmentation matrix is singular");
    if (M[6] == 0 && M[7] == 0) {
        if (im[1] == 0 && im[3] == 0) {
            image_rows r = {src, (size_t)w_in * 3};
            return warp_separable(image_row, &r, w_in, h_in, dst, w_out, h_out, im, post);
        }
        return warp_affine(src, w_in, h_in, dst, w_out, h_out, im, post);
    }
    /* Perspective: per-pixel projective divide, float bilinear. */
    size_t sstride = (size_t)w_in * 3;
    for (int y = 0; y < h_out; y++) {
        uint8_t *d = out_row(dst, y, w_out, h_out, post), *row = d;
        for (int x = 0; x < w_out; x++, d += 3) {
            double z = im[6] * x + im[7] * y + im[8];
            z = z != 0 ? 1.0 / z : 0.0;
            double sx = (im[0] * x + im[1] * y + im[2]) * z, sy = (im[3] * x + im[4] * y + im[5]) * z;
            if (!(sx > -1.0 && sy > -1.0 && sx < w_in && sy < h_in)) {
                d[0] = d[1] = d[2] = PTL_FILL;
                continue;
            }
            int x0 = (int)floor(sx), y0 = (int)floor(sy);
            float fx = (float)(sx - x0), fy = (float)(sy - y0);
            float w00 = (1 - fx) * (1 - fy), w01 = fx * (1 - fy), w10 = (1 - fx) * fy, w11 = fx * fy;
            const uint8_t fill[3] = {PTL_FILL, PTL_FILL, PTL_FILL};
            int in_x0 = x0 >= 0 && x0 < w_in, in_x1 = x0 + 1 >= 0 && x0 + 1 < w_in;
            int in_y0 = y0 >= 0 && y0 < h_in, in_y1 = y0 + 1 >= 0 && y0 + 1 < h_in;
            const uint8_t *p00 = in_y0 && in_x0 ? src + (size_t)y0 * sstride + (size_t)x0 * 3 : fill;
            const uint8_t *p01 = in_y0 && in_x1 ? src + (size_t)y0 * sstride + (size_t)(x0 + 1) * 3 : fill;
            const uint8_t *p10 = in_y1 && in_x0 ? src + (size_t)(y0 + 1) * sstride + (size_t)x0 * 3 : fill;
            const uint8_t *p11 = in_y1 && in_x1 ? src + (size_t)(y0 + 1) * sstride + (size_t)(x0 + 1) * 3 : fill;
            for (int c = 0; c < 3; c++) {
                float v = p00[c] * w00 + p01[c] * w01 + p10[c] * w10 + p11[c] * w11;
                d[c] = (uint8_t)(v + 0.5f);
            }
        }
        post_row(row, w_out, post);
    }
    return 0;
}

int ptl_warp(const uint8_t *src, int w_in, int h_in, uint8_t *dst, int w_out, int h_out, const double M[9])
{
    ptl_post none;
    ptl_post_init(&none, NULL, 0, 0);
    return ptl_warp_post(src, w_in, h_in, dst, w_out, h_out, M, &none);
}

void ptl_copy_post(const uint8_t *src, int w, int h, uint8_t *dst, const ptl_post *post)
{
    size_t stride = (size_t)w * 3;
    for (int y = 0; y < h; y++) {
        uint8_t *d = out_row(dst, y, w, h, post);
        const uint8_t *s = src + (size_t)y * stride;
        if (post->flip_lr) {
            for (int x = 0, r = w - 1; x < w; x++, r--)
                d[3 * r] = s[3 * x], d[3 * r + 1] = s[3 * x + 1], d[3 * r + 2] = s[3 * x + 2];
        } else {
            memcpy(d, s, stride);
        }
        if (post->hsv)
            hsv_row(d, w, post);
    }
}

void ptl_warp_source_rect(const double M[9], int w_in, int h_in, int w_out, int h_out, int r[4])
{
    double im[9];
    r[0] = r[1] = 0, r[2] = w_in, r[3] = h_in;
    if (M[6] != 0 || M[7] != 0 || invert3(M, im) != 0)
        return;
    double x0 = INFINITY, y0 = INFINITY, x1 = -INFINITY, y1 = -INFINITY;
    for (int k = 0; k < 4; k++) {
        double x = k & 1 ? w_out : 0, y = k & 2 ? h_out : 0;
        double X = im[0] * x + im[1] * y + im[2], Y = im[3] * x + im[4] * y + im[5];
        x0 = fmin(x0, X), x1 = fmax(x1, X), y0 = fmin(y0, Y), y1 = fmax(y1, Y);
    }
    /* Taps reach one pixel right/down of the mapped point; two of margin cover the fixed-point rounding. */
    if (!(x0 >= -4 && x1 <= w_in + 4.0 && y0 >= -4 && y1 <= h_in + 4.0)) {
        x0 = fmax(x0, -4), x1 = fmin(x1, w_in + 4.0), y0 = fmax(y0, -4), y1 = fmin(y1, h_in + 4.0);
        if (!(x0 <= x1 && y0 <= y1)) {
            r[2] = r[0], r[3] = r[1];
            return;
        }
    }
    r[0] = imax((int)floor(x0) - 2, 0), r[1] = imax((int)floor(y0) - 2, 0);
    r[2] = imin((int)ceil(x1) + 3, w_in), r[3] = imin((int)ceil(y1) + 3, h_in);
    if (r[2] < r[0])
        r[2] = r[0];
    if (r[3] < r[1])
        r[3] = r[1];
}

void ptl_boxes_affine(ptl_boxes *bx, const double M[9], double sigma, int w_out, int h_out, float area_thr)
{
    int proj = M[6] != 0 || M[7] != 0, k = 0;
    for (int i = 0; i < bx->n; i++) {
        float *b = bx->b + 5 * i;
        double cx[4] = {b[1], b[3], b[1], b[3]}, cy[4] = {b[2], b[4], b[4], b[2]};
        double x1 = INFINITY, y1 = INFINITY, x2 = -INFINITY, y2 = -INFINITY;
        for (int j = 0; j < 4; j++) {
            double X = M[0] * cx[j] + M[1] * cy[j] + M[2];
            double Y = M[3] * cx[j] + M[4] * cy[j] + M[5];
            if (proj) {
                double Z = M[6] * cx[j] + M[7] * cy[j] + M[8];
                X /= Z;
                Y /= Z;
            }
            x1 = fmin(x1, X), x2 = fmax(x2, X), y1 = fmin(y1, Y), y2 = fmax(y2, Y);
        }
        x1 = fmin(fmax(x1, 0), w_out), x2 = fmin(fmax(x2, 0), w_out);
        y1 = fmin(fmax(y1, 0), h_out), y2 = fmin(fmax(y2, 0), h_out);
        double w1 = (double)b[3] - b[1], h1 = (double)b[4] - b[2];
        double w2 = x2 - x1, h2 = y2 - y1, eps = 1e-16;
        double ar = fmax(w2 / (h2 + eps), h2 / (w2 + eps));
        if (w2 > 2 && h2 > 2 && w2 * h2 / (sigma * sigma * w1 * h1 + eps) > area_thr && ar < 100) {
            float *o = bx->b + 5 * k++;
            o[0] = b[0];
            o[1] = (float)x1, o[2] = (float)y1, o[3] = (float)x2, o[4] = (float)y2;
        }
    }
    bx->n = k;
}

/* Integer division tables of OpenCV's 8-bit RGB->HSV (12-bit fixed point), and the HSV->RGB factors:
 * for each (H, S) the three channel values at V = 1 (OpenCV's float HSV2RGB) in 15-bit fixed point, so a
 * pixel needs three integer multiplies by its V. (Measured faster than exact rational arithmetic.) */
static int sdiv[256], hdiv[256];
static uint16_t hsv_rgb[180 * 256][4];
static pthread_once_t hsv_once = PTHREAD_ONCE_INIT;

static void hsv_tables(void)
{
    /* Channel order (r, g, b) of (1, 1 - s, 1 - s f, 1 - s (1 - f)) in each 60-degree sector. */
    static const int order[6][3] = {{0, 3, 1}, {2, 0, 1}, {1, 0, 3}, {1, 2, 0}, {3, 1, 0}, {0, 1, 2}};
    for (int i = 1; i < 256; i++) {
        sdiv[i] = (int)lrint((255 << 12) / (double)i);
        hdiv[i] = (int)lrint((180 << 12) / (6.0 * i));
    }
    for (int H = 0; H < 180; H++)
        for (int S = 0; S < 256; S++) {
            uint16_t *o = hsv_rgb[H * 256 + S];
            float s = S * (1.f / 255.f), f = H * (6.f / 180.f);
            int sec = (int)floorf(f);
            f -= sec;
            float t[4] = {1.f, 1.f - s, 1.f - s * f, 1.f - s * (1.f - f)};
            for (int c = 0; c < 3; c++)
                o[c] = (uint16_t)lrintf(t[order[sec][c]] * 32768.f);
            o[3] = 0;
        }
}

/* HSV jitter of n pixels: the arithmetic of OpenCV's 8-bit RGB->HSV (12-bit division tables) with the
 * saturation and the hue's 60-degree sector folded into the per-sample tables of ptl_post. */
static inline const uint16_t *hsv_factors(const ptl_post *__restrict post, int V, int d, int num)
{
    return post->hrow[((num * hdiv[d] + (1 << 11)) >> 12) + 32][post->sat[V << 8 | d]];
}

static inline void hsv_px(uint8_t *p, int V, int d, int num, const ptl_post *__restrict post)
{
    const uint16_t *f = hsv_factors(post, V, d, num);
    unsigned v = post->lv[V];
    p[0] = (uint8_t)((v * f[0] + 16384) >> 15);
    p[1] = (uint8_t)((v * f[1] + 16384) >> 15);
    p[2] = (uint8_t)((v * f[2] + 16384) >> 15);
}

#ifdef __SSE2__
enum { HSV_CHUNK = 256 };

/* V, V - min and the hue numerator of 16 pixels (as the scalar hsv_row below, in 16 and 8 lanes). */
static inline void hsv_fwd16(__m128i r, __m128i g, __m128i b, uint8_t *Vo, uint8_t *Do, int16_t *No)
{
    const __m128i z = _mm_setzero_si128();
    __m128i v = _mm_max_epu8(r, _mm_max_epu8(g, b)), d = _mm_sub_epi8(v, _mm_min_epu8(r, _mm_min_epu8(g, b)));
    __m128i eqr = _mm_cmpeq_epi8(v, r), eqg = _mm_cmpeq_epi8(v, g);
    _mm_store_si128((__m128i *)Vo, v);
    _mm_store_si128((__m128i *)Do, d);
    for (int half = 0; half < 2; half++) {
        __m128i r16 = half ? _mm_unpackhi_epi8(r, z) : _mm_unpacklo_epi8(r, z);
        __m128i g16 = half ? _mm_unpackhi_epi8(g, z) : _mm_unpacklo_epi8(g, z);
        __m128i b16 = half ? _mm_unpackhi_epi8(b, z) : _mm_unpacklo_epi8(b, z);
        __m128i d16 = half ? _mm_unpackhi_epi8(d, z) : _mm_unpacklo_epi8(d, z);
        __m128i mr = half ? _mm_unpackhi_epi8(eqr, eqr) : _mm_unpacklo_epi8(eqr, eqr);
        __m128i mg = half ? _mm_unpackhi_epi8(eqg, eqg) : _mm_unpacklo_epi8(eqg, eqg);
        __m128i n1 = _mm_sub_epi16(g16, b16);
        __m128i n2 = _mm_add_epi16(_mm_sub_epi16(b16, r16), _mm_slli_epi16(d16, 1));
        __m128i n3 = _mm_add_epi16(_mm_sub_epi16(r16, g16), _mm_slli_epi16(d16, 2));
        __m128i num = _mm_xor_si128(n3, _mm_and_si128(_mm_xor_si128(n3, n2), mg));
        num = _mm_xor_si128(num, _mm_and_si128(_mm_xor_si128(num, n1), mr));
        _mm_store_si128((__m128i *)(No + 8 * half), num);
    }
}

/* One step of the SSE2 3-channel deinterleave: byte-interleaves each register's low half with the next
 * one's high half; four steps turn r g b r g b ... (48 bytes) into 16 r, 16 g, 16 b. */
static inline void deinterleave_step(__m128i *a, __m128i *b, __m128i *c)
{
    __m128i x = _mm_unpacklo_epi8(*a, _mm_unpackhi_epi64(*b, *b));
    __m128i y = _mm_unpacklo_epi8(_mm_unpackhi_epi64(*a, *a), *c);
    __m128i z = _mm_unpacklo_epi8(*b, _mm_unpackhi_epi64(*c, *c));
    *a = x, *b = y, *c = z;
}

/* Chunks of pixels: the forward part in SSE2, then the table lookups (two pixels at a time). */
static void hsv_row(uint8_t *__restrict p, int n, const ptl_post *__restrict post)
{
    _Alignas(16) uint8_t V[HSV_CHUNK], D[HSV_CHUNK], R[16], G[16], B[16];
    _Alignas(16) int16_t N[HSV_CHUNK];
    for (int i0 = 0; i0 < n; i0 += HSV_CHUNK, p += 3 * HSV_CHUNK) {
        int m = n - i0 < HSV_CHUNK ? n - i0 : HSV_CHUNK, i = 0;
        for (; i + 16 <= m; i += 16) {
            __m128i a = _mm_loadu_si128((const __m128i *)(p + 3 * i));
            __m128i b = _mm_loadu_si128((const __m128i *)(p + 3 * i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(p + 3 * i + 32));
            for (int k = 0; k < 4; k++)
                deinterleave_step(&a, &b, &c);
            hsv_fwd16(a, b, c, V + i, D + i, N + i);
        }
        if (i < m) {
            memset(R, 0, 16), memset(G, 0, 16), memset(B, 0, 16);
            for (int k = 0; k < m - i; k++)
                R[k] = p[3 * (i + k)], G[k] = p[3 * (i + k) + 1], B[k] = p[3 * (i + k) + 2];
            hsv_fwd16(_mm_load_si128((const __m128i *)R), _mm_load_si128((const __m128i *)G),
                      _mm_load_si128((const __m128i *)B), V + i, D + i, N + i);
        }
        /* Two pixels at a time: factors times V in 16-bit halves, (P + 2^14) >> 15 = 2 hi + (lo >> 15) +
         * bit 14 of lo; 4-byte stores whose extra byte belongs to the next pixel (the chunk's last pixel
         * is stored bytewise, as the next chunk is still to be read). */
        const __m128i one = _mm_set1_epi16(1);
        for (i = 0; i + 2 < m; i += 2) {
            const uint16_t *f0 = hsv_factors(post, V[i], D[i], N[i]), *f1 = hsv_factors(post, V[i + 1], D[i + 1], N[i + 1]);
            __m128i f = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)f0), _mm_loadl_epi64((const __m128i *)f1));
            __m128i v = _mm_cvtsi32_si128((int)(post->lv[V[i]] | (unsigned)post->lv[V[i + 1]] << 16));
            v = _mm_unpacklo_epi16(v, v);
            v = _mm_unpacklo_epi32(v, v);
            __m128i lo = _mm_mullo_epi16(f, v), hi = _mm_mulhi_epu16(f, v);
            __m128i r = _mm_add_epi16(_mm_add_epi16(_mm_slli_epi16(hi, 1), _mm_srli_epi16(lo, 15)),
                                      _mm_and_si128(_mm_srli_epi16(lo, 14), one));
            r = _mm_packus_epi16(r, r);
            uint32_t a = (uint32_t)_mm_cvtsi128_si32(r), b = (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(r, 4));
            memcpy(p + 3 * i, &a, 4);
            memcpy(p + 3 * i + 3, &b, 4);
        }
        for (; i < m; i++)
            hsv_px(p + 3 * i, V[i], D[i], N[i], post);
    }
}
#else
static void hsv_row(uint8_t *__restrict p, int n, const ptl_post *__restrict post)
{
    for (int i = 0; i < n; i++, p += 3) {
        int R = p[0], G = p[1], B = p[2];
        int V = imax(R, imax(G, B)), d = V - imin(R, imin(G, B));
        /* Selected with masks, not branches: the sector of natural pixels is unpredictable. */
        int n3 = R - G + 4 * d, n2 = B - R + 2 * d;
        int num = n3 + ((n2 - n3) & -(V == G));
        num += (G - B - num) & -(V == R);
        hsv_px(p, V, d, num, post);
    }
}
#endif

void ptl_post_init(ptl_post *p, const double *r, int flip_lr, int flip_ud)
{
    p->hsv = r != NULL;
    p->flip_lr = flip_lr;
    p->flip_ud = flip_ud;
    p->fill[0] = p->fill[1] = p->fill[2] = PTL_FILL;
    if (!r)
        return;
    pthread_once(&hsv_once, hsv_tables);
    for (int x = 0; x < 256; x++) {
        double hv = fmod(x + r[0] * 180.0, 180.0);
        if (hv < 0)
            hv += 180.0;
        p->lh[x] = (uint8_t)hv;
        p->ls[x] = (uint8_t)fmin(fmax(x * (1 + r[1]), 0), 255);
        p->lv[x] = (uint8_t)fmin(fmax(x * (1 + r[2]), 0), 255);
    }
    /* Before the mod 180, H = round(30 num / d) with num in [-d, 5d]: [-30, 150] for every RGB value. */
    for (int H = -32; H <= 152; H++)
        p->hrow[H + 32] = hsv_rgb + p->lh[H < 0 ? H + 180 : H] * 256;
    for (int V = 0; V < 256; V++)
        for (int d = 0; d <= V; d++)
            p->sat[V << 8 | d] = p->ls[(d * sdiv[V] + (1 << 11)) >> 12];
    hsv_row(p->fill, 1, p);
}

void ptl_hsv(uint8_t *img, int w, int h, const double r[3])
{
    ptl_post post;
    ptl_post_init(&post, r, 0, 0);
    for (int y = 0; y < h; y++)
        hsv_row(img + (size_t)y * w * 3, w, &post);
}

void ptl_boxes_flip(ptl_boxes *bx, int w, int h, int lr)
{
    int j = lr ? 1 : 2, size = lr ? w : h;
    for (int i = 0; i < bx->n; i++) {
        float *b = bx->b + 5 * i, lo = b[j];
        b[j] = size - b[j + 2];
        b[j + 2] = size - lo;
    }
}

void ptl_flip_lr(uint8_t *img, int w, int h, ptl_boxes *bx)
{
    for (int y = 0; y < h; y++)
        reverse_row(img + (size_t)y * w * 3, w);
    ptl_boxes_flip(bx, w, h, 1);
}

void ptl_flip_ud(uint8_t *img, int w, int h, ptl_boxes *bx)
{
    size_t stride = (size_t)w * 3;
    for (int a = 0, b = h - 1; a < b; a++, b--) {
        uint8_t *ra = img + a * stride, *rb = img + b * stride;
        for (size_t j = 0; j < stride; j++) {
            uint8_t t = ra[j];
            ra[j] = rb[j];
            rb[j] = t;
        }
    }
    ptl_boxes_flip(bx, w, h, 0);
}
