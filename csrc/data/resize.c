/* Bilinear resize (pixel-centre aligned, as OpenCV INTER_LINEAR), the load-time resize rule and LetterBox. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"

/* Source taps of destination coordinate d: i0, i1 and the weight of i1. */
static inline void taps(int d, double scale, int n, int *i0, int *i1, float *f)
{
    double s = (d + 0.5) * scale - 0.5;
    if (s < 0)
        s = 0;
    int i = (int)s;
    if (i >= n - 1) {
        *i0 = *i1 = n - 1;
        *f = 0.f;
        return;
    }
    *i0 = i;
    *i1 = i + 1;
    *f = (float)(s - i);
}

void ptl_resize_bilinear(const uint8_t *src, int sw, int sh, size_t sstride, uint8_t *dst, int dw, int dh,
                         size_t dstride)
{
    if (sw == dw && sh == dh) {
        for (int y = 0; y < dh; y++)
            memcpy(dst + (size_t)y * dstride, src + (size_t)y * sstride, (size_t)dw * 3);
        return;
    }
    double sx = (double)sw / dw, sy = (double)sh / dh;
    /* Horizontal taps once per call; rows are interpolated on the fly (two source rows per output row). */
    int xs[2 * 4096];
    float xf[4096];
    int *xi = dw <= 4096 ? xs : malloc(sizeof(int) * 2 * (size_t)dw);
    float *xw = dw <= 4096 ? xf : malloc(sizeof(float) * (size_t)dw);
    if (!xi || !xw) {
        /* Extreme widths only; fall back to computing taps per pixel. */
        if (xi != xs)
            free(xi);
        if (xw != xf)
            free(xw);
        for (int y = 0; y < dh; y++) {
            int y0, y1;
            float fy;
            taps(y, sy, sh, &y0, &y1, &fy);
            for (int x = 0; x < dw; x++) {
                int x0, x1;
                float fx;
                taps(x, sx, sw, &x0, &x1, &fx);
                for (int c = 0; c < 3; c++) {
                    float a = src[y0 * sstride + 3 * x0 + c] * (1 - fx) + src[y0 * sstride + 3 * x1 + c] * fx;
                    float b = src[y1 * sstride + 3 * x0 + c] * (1 - fx) + src[y1 * sstride + 3 * x1 + c] * fx;
                    float v = a * (1 - fy) + b * fy;
                    dst[y * dstride + 3 * x + c] = (uint8_t)(v + 0.5f);
                }
            }
        }
        return;
    }
    for (int x = 0; x < dw; x++) {
        int x0, x1;
        taps(x, sx, sw, &x0, &x1, &xw[x]);
        xi[2 * x] = 3 * x0;
        xi[2 * x + 1] = 3 * x1;
    }
    for (int y = 0; y < dh; y++) {
        int y0, y1;
        float fy;
        taps(y, sy, sh, &y0, &y1, &fy);
        const uint8_t *r0 = src + (size_t)y0 * sstride, *r1 = src + (size_t)y1 * sstride;
        uint8_t *d = dst + (size_t)y * dstride;
        float gy = 1.f - fy;
        for (int x = 0; x < dw; x++) {
            int a0 = xi[2 * x], a1 = xi[2 * x + 1];
            float fx = xw[x], gx = 1.f - fx;
            for (int c = 0; c < 3; c++) {
                float a = r0[a0 + c] * gx + r0[a1 + c] * fx;
                float b = r1[a0 + c] * gx + r1[a1 + c] * fx;
                d[3 * x + c] = (uint8_t)(a * gy + b * fy + 0.5f);
            }
        }
    }
    if (xi != xs)
        free(xi);
    if (xw != xf)
        free(xw);
}

void ptl_load_size(int w0, int h0, int W, int H, int *w, int *h)
{
    /* For W == H both ratios are divisions of the same imgsz, and the min is imgsz / max(w0, h0) exactly. */
    double r = fmin((double)W / w0, (double)H / h0);
    if (r == 1.0) {
        *w = w0;
        *h = h0;
        return;
    }
    int nw = (int)ceil(w0 * r), nh = (int)ceil(h0 * r);
    *w = nw < W ? nw : W;
    *h = nh < H ? nh : H;
}

void ptl_letterbox_params_get(int w, int h, int W, int H, int scaleup, ptl_letterbox_params *p)
{
    double r = fmin((double)H / h, (double)W / w);
    if (!scaleup && r > 1.0)
        r = 1.0;
    p->r = r;
    /* Python round() is half-to-even; nearbyint in the default rounding mode is the same. */
    p->new_w = (int)nearbyint(w * r);
    p->new_h = (int)nearbyint(h * r);
    double dw = (W - p->new_w) / 2.0, dh = (H - p->new_h) / 2.0;
    p->left = (int)nearbyint(dw - 0.1);
    p->top = (int)nearbyint(dh - 0.1);
}

void ptl_letterbox(const uint8_t *src, int w, int h, uint8_t *dst, int W, int H, const ptl_letterbox_params *p)
{
    size_t stride = (size_t)W * 3;
    int l = p->left, t = p->top, nw = p->new_w, nh = p->new_h;
    for (int y = 0; y < H; y++) {
        uint8_t *row = dst + (size_t)y * stride;
        if (y < t || y >= t + nh) {
            memset(row, PTL_FILL, stride);
        } else {
            memset(row, PTL_FILL, (size_t)l * 3);
            memset(row + (size_t)(l + nw) * 3, PTL_FILL, (size_t)(W - l - nw) * 3);
        }
    }
    ptl_resize_bilinear(src, w, h, (size_t)w * 3, dst + (size_t)t * stride + (size_t)l * 3, nw, nh, stride);
}
