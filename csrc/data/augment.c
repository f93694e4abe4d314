/* Augmentations of spec §7.4-7.7: mosaic layout, RandomPerspective (matrix, bilinear warp, box rule),
 * HSV jitter, flips. Boxes are (cls, x1, y1, x2, y2) in pixels. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"

static inline int imax(int a, int b) { return a > b ? a : b; }
static inline int imin(int a, int b) { return a < b ? a : b; }

void ptl_mosaic_rects(int k, int w, int h, int xc, int yc, int s, int a[4], int b[4])
{
    int s2 = 2 * s;
    switch (k) {
    case 0:
        a[0] = imax(xc - w, 0), a[1] = imax(yc - h, 0), a[2] = xc, a[3] = yc;
        b[0] = w - (a[2] - a[0]), b[1] = h - (a[3] - a[1]), b[2] = w, b[3] = h;
        break;
    case 1:
        a[0] = xc, a[1] = imax(yc - h, 0), a[2] = imin(xc + w, s2), a[3] = yc;
        b[0] = 0, b[1] = h - (a[3] - a[1]), b[2] = imin(w, a[2] - a[0]), b[3] = h;
        break;
    case 2:
        a[0] = imax(xc - w, 0), a[1] = yc, a[2] = xc, a[3] = imin(s2, yc + h);
        b[0] = w - (a[2] - a[0]), b[1] = 0, b[2] = w, b[3] = imin(a[3] - a[1], h);
        break;
    default:
        a[0] = xc, a[1] = yc, a[2] = imin(xc + w, s2), a[3] = imin(s2, yc + h);
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

/* Affine warp in fixed point: source coordinates in 1/1024 pixel accumulated per row, taps and weights
 * in 1/32 pixel. Without rotation or shear (the default) x and y separate: the column taps are computed
 * once per call and the row taps once per row, with the same arithmetic, so both paths agree bit for bit. */
static int warp_affine(const uint8_t *src, int w_in, int h_in, uint8_t *dst, int w_out, int h_out, const double im[9])
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
    if (im[1] == 0 && im[3] == 0) {
        int X0 = round_sat(im[2] * 1024) + 16;
        for (int x = 0; x < w_out; x++)
            adelta[x] = (X0 + adelta[x]) >> 5; /* X in 1/32 pixel */
        for (int y = 0; y < h_out; y++) {
            int Y = (round_sat((im[4] * y + im[5]) * 1024) + 16) >> 5, sy = Y >> 5;
            const int32_t(*wr)[4] = wtab + ((Y & 31) << 5);
            uint8_t *d = dst + (size_t)y * w_out * 3;
            if ((unsigned)sy >= (unsigned)(h_in - 1)) {
                for (int x = 0; x < w_out; x++)
                    warp_px(src, w_in, h_in, ss, adelta[x] >> 5, sy, wr[adelta[x] & 31], d + 3 * x);
                continue;
            }
            const uint8_t *row = src + (size_t)sy * ss;
            for (int x = 0; x < w_out; x++, d += 3) {
                int X = adelta[x], sx = X >> 5;
                if ((unsigned)sx < (unsigned)(w_in - 1)) {
                    const int32_t *w = wr[X & 31];
                    const uint8_t *p = row + (size_t)sx * 3, *q = p + ss;
                    int w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
                    d[0] = (uint8_t)((p[0] * w0 + p[3] * w1 + q[0] * w2 + q[3] * w3 + (1 << 14)) >> 15);
                    d[1] = (uint8_t)((p[1] * w0 + p[4] * w1 + q[1] * w2 + q[4] * w3 + (1 << 14)) >> 15);
                    d[2] = (uint8_t)((p[2] * w0 + p[5] * w1 + q[2] * w2 + q[5] * w3 + (1 << 14)) >> 15);
                } else {
                    warp_px(src, w_in, h_in, ss, sx, sy, wr[X & 31], d);
                }
            }
        }
        free(adelta);
        return 0;
    }
    for (int y = 0; y < h_out; y++) {
        int X0 = round_sat((im[1] * y + im[2]) * 1024) + 16, Y0 = round_sat((im[4] * y + im[5]) * 1024) + 16;
        uint8_t *d = dst + (size_t)y * w_out * 3;
        for (int x = 0; x < w_out; x++, d += 3) {
            int X = (X0 + adelta[x]) >> 5, Y = (Y0 + bdelta[x]) >> 5;
            warp_px(src, w_in, h_in, ss, X >> 5, Y >> 5, wtab[((Y & 31) << 5) | (X & 31)], d);
        }
    }
    free(adelta);
    return 0;
}

int ptl_warp(const uint8_t *src, int w_in, int h_in, uint8_t *dst, int w_out, int h_out, const double M[9])
{
    double im[9];
    if (invert3(M, im) != 0)
        return ptl_set_error(PTL_ERR_VALUE, "augmentation matrix is singular");
    if (M[6] == 0 && M[7] == 0)
        return warp_affine(src, w_in, h_in, dst, w_out, h_out, im);
    /* Perspective: per-pixel projective divide, float bilinear. */
    size_t sstride = (size_t)w_in * 3;
    for (int y = 0; y < h_out; y++) {
        uint8_t *d = dst + (size_t)y * w_out * 3;
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
    }
    return 0;
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

void ptl_hsv(uint8_t *img, int w, int h, const double r[3])
{
    uint8_t lh[256], ls[256], lv[256];
    pthread_once(&hsv_once, hsv_tables);
    for (int x = 0; x < 256; x++) {
        double hv = fmod(x + r[0] * 180.0, 180.0);
        if (hv < 0)
            hv += 180.0;
        lh[x] = (uint8_t)hv;
        ls[x] = (uint8_t)fmin(fmax(x * (1 + r[1]), 0), 255);
        lv[x] = (uint8_t)fmin(fmax(x * (1 + r[2]), 0), 255);
    }
    size_t n = (size_t)w * h;
    for (size_t i = 0; i < n; i++) {
        uint8_t *p = img + 3 * i;
        int R = p[0], G = p[1], B = p[2];
        int V = R > G ? (R > B ? R : B) : (G > B ? G : B);
        int mn = R < G ? (R < B ? R : B) : (G < B ? G : B);
        int diff = V - mn;
        int S = (diff * sdiv[V] + (1 << 11)) >> 12;
        int vr = V == R ? -1 : 0, vg = V == G ? -1 : 0;
        int H = (vr & (G - B)) + (~vr & ((vg & (B - R + 2 * diff)) + (~vg & (R - G + 4 * diff))));
        H = (H * hdiv[diff] + (1 << 11)) >> 12;
        H += H < 0 ? 180 : 0;
        const uint16_t *f = hsv_rgb[lh[H] * 256 + ls[S]];
        unsigned v = lv[V];
        p[0] = (uint8_t)((v * f[0] + 16384) >> 15);
        p[1] = (uint8_t)((v * f[1] + 16384) >> 15);
        p[2] = (uint8_t)((v * f[2] + 16384) >> 15);
    }
}

void ptl_flip_lr(uint8_t *img, int w, int h, ptl_boxes *bx)
{
    for (int y = 0; y < h; y++) {
        uint8_t *row = img + (size_t)y * w * 3;
        for (int a = 0, b = w - 1; a < b; a++, b--)
            for (int c = 0; c < 3; c++) {
                uint8_t t = row[3 * a + c];
                row[3 * a + c] = row[3 * b + c];
                row[3 * b + c] = t;
            }
    }
    for (int i = 0; i < bx->n; i++) {
        float *b = bx->b + 5 * i, x1 = b[1];
        b[1] = w - b[3];
        b[3] = w - x1;
    }
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
    for (int i = 0; i < bx->n; i++) {
        float *b = bx->b + 5 * i, y1 = b[2];
        b[2] = h - b[4];
        b[4] = h - y1;
    }
}
