/* Image files to 8-bit RGB: the format from the first bytes, the decoder of that format (codec.h), the
 * pixel limit, EXIF orientation, and the cheap validity probe of the dataset scan. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

void ptl_image_free(ptl_image *im)
{
    free(im->data);
    im->data = NULL;
    im->w = im->h = 0;
}

static const char *const format_names[PTL_FMT_COUNT] = {"unknown", "JPEG", "PNG", "BMP", "WebP", "TIFF"};

const char *ptl_image_format_name(int f) { return f > 0 && f < PTL_FMT_COUNT ? format_names[f] : "unknown"; }

int ptl_image_format_built(int f)
{
    switch (f) {
    case PTL_FMT_JPEG:
    case PTL_FMT_PNG:
    case PTL_FMT_BMP:
        return 1;
#ifdef PTL_WITH_WEBP
    case PTL_FMT_WEBP:
        return 1;
#endif
#ifdef PTL_WITH_TIFF
    case PTL_FMT_TIFF:
        return 1;
#endif
    default:
        return 0;
    }
}

static int read_file(const char *path, unsigned char **buf, size_t *len, char *why, size_t whylen)
{
    FILE *f = fopen(path, "rb");
    unsigned char *b = NULL;
    long n;
    *buf = NULL;
    *len = 0;
    if (!f) {
        snprintf(why, whylen, "cannot open the file");
        return -1;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        snprintf(why, whylen, "cannot read the file");
        goto fail;
    }
    b = malloc(n > 0 ? (size_t)n : 1);
    if (!b) {
        snprintf(why, whylen, "out of memory reading %ld bytes", n);
        goto fail;
    }
    if (n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) {
        snprintf(why, whylen, "cannot read the file");
        goto fail;
    }
    fclose(f);
    *buf = b;
    *len = (size_t)n;
    return 0;
fail:
    free(b);
    fclose(f);
    return -1;
}

static int detect(const unsigned char *b, size_t n)
{
    if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF)
        return PTL_FMT_JPEG;
    if (n >= 8 && memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0)
        return PTL_FMT_PNG;
    if (n >= 2 && b[0] == 'B' && b[1] == 'M')
        return PTL_FMT_BMP;
    if (n >= 12 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "WEBP", 4) == 0)
        return PTL_FMT_WEBP;
    if (n >= 4 && (memcmp(b, "II*\0", 4) == 0 || memcmp(b, "MM\0*", 4) == 0 || memcmp(b, "II+\0", 4) == 0 ||
                   memcmp(b, "MM\0+", 4) == 0))
        return PTL_FMT_TIFF;
    return PTL_FMT_UNKNOWN;
}

int ptl_codec_check_size(const ptl_codec_req *rq, ptl_codec_out *o, const char *fmt)
{
    if (o->w0 <= 0 || o->h0 <= 0) {
        snprintf(o->why, sizeof o->why, "corrupt %s: size %dx%d", fmt, o->w0, o->h0);
        return -1;
    }
    int64_t n = (int64_t)o->w0 * o->h0;
    if (rq->max_pixels > 0 && n > rq->max_pixels) {
        snprintf(o->why, sizeof o->why, "%s declares %dx%d = %lld pixels, over the limit of %lld (max_pixels)", fmt,
                 o->w0, o->h0, (long long)n, (long long)rq->max_pixels);
        return -1;
    }
    int sw = o->orient >= 5, W = sw ? o->h0 : o->w0, H = sw ? o->w0 : o->h0;
    if (rq->expect_w0 > 0 && (W != rq->expect_w0 || H != rq->expect_h0)) {
        snprintf(o->why, sizeof o->why, "its size changed since the dataset scan (%dx%d, now %dx%d)", rq->expect_w0,
                 rq->expect_h0, W, H);
        return -1;
    }
    return 0;
}

uint8_t *ptl_codec_alloc(ptl_codec_out *o, int w, int h, const char *fmt)
{
    uint8_t *p = malloc((size_t)w * h * 3);
    if (!p) {
        o->oom = 1;
        snprintf(o->why, sizeof o->why, "out of memory decoding a %dx%d %s", w, h, fmt);
    }
    return p;
}

static int run_codec(int fmt, const unsigned char *buf, size_t len, const ptl_codec_req *rq, ptl_codec_out *o)
{
    switch (fmt) {
    case PTL_FMT_JPEG:
        return ptl_decode_jpeg(buf, len, rq, o);
    case PTL_FMT_PNG:
        return ptl_decode_png(buf, len, rq, o);
    case PTL_FMT_BMP:
        return ptl_decode_bmp(buf, len, rq, o);
#ifdef PTL_WITH_WEBP
    case PTL_FMT_WEBP:
        return ptl_decode_webp(buf, len, rq, o);
#endif
#ifdef PTL_WITH_TIFF
    case PTL_FMT_TIFF:
        return ptl_decode_tiff(buf, len, rq, o);
#endif
    case PTL_FMT_UNKNOWN:
        snprintf(o->why, sizeof o->why, "not a JPEG, PNG, BMP, WebP or TIFF file");
        return -1;
    default:
        snprintf(o->why, sizeof o->why, "%s decoding was not built into ptl", ptl_image_format_name(fmt));
        return -1;
    }
}

/* A complete JPEG ends with the EOI marker (some writers pad with zeros after it); without it the file is
 * truncated or carries trailing data, and only a decode of its data can tell. */
static int jpeg_has_eoi(const unsigned char *buf, size_t len)
{
    size_t e = len;
    while (e > 2 && buf[e - 1] == 0)
        e--;
    return e >= 4 && buf[e - 2] == 0xFF && buf[e - 1] == 0xD9;
}

int ptl_image_probe(const char *path, int64_t max_pixels, int *w, int *h, int *format, char *why, size_t whylen)
{
    unsigned char *buf = NULL;
    size_t len;
    ptl_codec_out o;
    memset(&o, 0, sizeof o);
    *format = PTL_FMT_UNKNOWN;
    int rc = -1;
    if (read_file(path, &buf, &len, why, whylen) != 0)
        return -1;
    int fmt = detect(buf, len);
    *format = fmt;
    if (fmt != PTL_FMT_UNKNOWN && !ptl_image_format_built(fmt)) {
        snprintf(why, whylen, "%s decoding was not built into ptl", ptl_image_format_name(fmt));
        free(buf);
        return -2;
    }
    ptl_codec_req rq = {0, max_pixels, 0, 0, 0, 0, 0};
    if (fmt == PTL_FMT_JPEG && !jpeg_has_eoi(buf, len)) {
        /* A decode of the whole data at the smallest DCT scale (1/8) finds a truncation cheaply. */
        rq.pixels = 1, rq.target_w = rq.target_h = 1, rq.scale_pixels = 1;
    } else if (fmt == PTL_FMT_PNG && (len < 12 || memcmp(buf + len - 8, "IEND", 4) != 0)) {
        snprintf(why, whylen, "truncated PNG (no IEND chunk at the end)");
        goto done;
    }
    if (run_codec(fmt, buf, len, &rq, &o) != 0) {
        snprintf(why, whylen, "%s", o.why);
        goto done;
    }
    ptl_image_free(&o.img);
    int sw = o.orient >= 5, W = sw ? o.h0 : o.w0, H = sw ? o.w0 : o.h0;
    if (W < PTL_MIN_IMAGE_SIDE || H < PTL_MIN_IMAGE_SIDE) {
        snprintf(why, whylen, "image size %dx%d is under %d pixels", W, H, PTL_MIN_IMAGE_SIDE);
        goto done;
    }
    *w = W;
    *h = H;
    rc = 0;
done:
    free(buf);
    return rc;
}

int ptl_image_orient(ptl_image *im, int o)
{
    if (o <= 1 || o > 8)
        return 0;
    int w = im->w, h = im->h, sw = o >= 5;
    int W = sw ? h : w, H = sw ? w : h;
    uint8_t *d = malloc((size_t)w * h * 3);
    if (!d)
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory orienting a %dx%d image", w, h);
    /* (X, Y) in the output takes the stored pixel (x, y) given by the EXIF transform. */
    for (int Y = 0; Y < H; Y++)
        for (int X = 0; X < W; X++) {
            int x, y;
            switch (o) {
            case 2: x = w - 1 - X, y = Y; break;
            case 3: x = w - 1 - X, y = h - 1 - Y; break;
            case 4: x = X, y = h - 1 - Y; break;
            case 5: x = Y, y = X; break;
            case 6: x = Y, y = h - 1 - X; break;
            case 7: x = w - 1 - Y, y = h - 1 - X; break;
            default: x = w - 1 - Y, y = X; break; /* 8 */
            }
            memcpy(d + ((size_t)Y * W + X) * 3, im->data + ((size_t)y * w + x) * 3, 3);
        }
    free(im->data);
    im->data = d;
    im->w = W;
    im->h = H;
    return 0;
}

int ptl_image_decode(const char *path, const ptl_decode_req *req, ptl_image *out, int *w0, int *h0)
{
    unsigned char *buf = NULL;
    size_t len;
    ptl_codec_out o;
    memset(&o, 0, sizeof o);
    out->data = NULL;
    out->w = out->h = 0;
    if (read_file(path, &buf, &len, o.why, sizeof o.why) != 0)
        goto fail;
    ptl_codec_req rq = {1, req->max_pixels, req->target_w, req->target_h, req->scale_pixels, req->expect_w0,
                        req->expect_h0};
    if (run_codec(detect(buf, len), buf, len, &rq, &o) != 0)
        goto fail;
    free(buf);
    buf = NULL;
    int sw = o.orient >= 5;
    *w0 = sw ? o.h0 : o.w0;
    *h0 = sw ? o.w0 : o.h0;
    *out = o.img;
    if (ptl_image_orient(out, o.orient) != 0) {
        ptl_image_free(out);
        return -1;
    }
    return 0;
fail:
    free(buf);
    return ptl_set_error(o.oom ? PTL_ERR_MEMORY : PTL_ERR_OS, "cannot decode image %s: %s", path, o.why);
}
