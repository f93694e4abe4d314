/* JPEG (libjpeg-turbo) and PNG (libpng) decoding to 8-bit RGB, EXIF orientation, cheap validity probes. */
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#include "dataset.h"

void ptl_image_free(ptl_image *im)
{
    free(im->data);
    im->data = NULL;
    im->w = im->h = 0;
}

enum { FMT_UNKNOWN = 0, FMT_JPEG, FMT_PNG };

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
        return FMT_JPEG;
    if (n >= 8 && memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0)
        return FMT_PNG;
    return FMT_UNKNOWN;
}

/* The Orientation tag (1-8) of a TIFF-structured EXIF block; 1 when absent or unreadable. */
static int tiff_orientation(const unsigned char *p, size_t n)
{
    if (n < 8)
        return 1;
    int le;
    if (p[0] == 'I' && p[1] == 'I')
        le = 1;
    else if (p[0] == 'M' && p[1] == 'M')
        le = 0;
    else
        return 1;
#define RD16(q) (le ? (unsigned)((q)[0] | (q)[1] << 8) : (unsigned)((q)[0] << 8 | (q)[1]))
#define RD32(q)                                                                                         \
    (le ? ((uint32_t)(q)[0] | (uint32_t)(q)[1] << 8 | (uint32_t)(q)[2] << 16 | (uint32_t)(q)[3] << 24)  \
        : ((uint32_t)(q)[0] << 24 | (uint32_t)(q)[1] << 16 | (uint32_t)(q)[2] << 8 | (uint32_t)(q)[3]))
    uint32_t ifd = RD32(p + 4);
    if ((size_t)ifd + 2 > n)
        return 1;
    unsigned count = RD16(p + ifd);
    for (unsigned i = 0; i < count; i++) {
        size_t e = (size_t)ifd + 2 + 12 * (size_t)i;
        if (e + 12 > n)
            return 1;
        if (RD16(p + e) == 0x0112) {
            unsigned v = RD16(p + e + 8);
            return v >= 1 && v <= 8 ? (int)v : 1;
        }
    }
    return 1;
#undef RD16
#undef RD32
}

/* EXIF orientation from a JPEG APP1 payload ("Exif\0\0" + TIFF). */
static int exif_orientation(const unsigned char *p, size_t n)
{
    if (n < 14 || memcmp(p, "Exif\0\0", 6) != 0)
        return 1;
    return tiff_orientation(p + 6, n - 6);
}

/* ---- JPEG ---- */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    int eof; /* the data ended early (truncated file) */
    char msg[JMSG_LENGTH_MAX];
} jerr_t;

static void jerr_exit(j_common_ptr c)
{
    jerr_t *e = (jerr_t *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jb, 1);
}

static void jerr_emit(j_common_ptr c, int level)
{
    jerr_t *e = (jerr_t *)c->err;
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF)
        e->eof = 1;
}

static void jerr_output(j_common_ptr c) { (void)c; }

static int jpeg_orientation(struct jpeg_decompress_struct *ci)
{
    for (jpeg_saved_marker_ptr m = ci->marker_list; m; m = m->next)
        if (m->marker == JPEG_APP0 + 1) {
            int o = exif_orientation(m->data, m->data_length);
            if (o != 1)
                return o;
        }
    return 1;
}

/* Decodes (pixels != 0) or only reads the header. Returns 0, or -1 with a reason in why. */
static int jpeg_do(const unsigned char *buf, size_t len, int pixels, ptl_image *out, int *orient, char *why,
                   size_t whylen)
{
    struct jpeg_decompress_struct ci;
    jerr_t je;
    unsigned char *row = NULL;
    uint8_t *volatile img = NULL;
    memset(&je, 0, sizeof je);
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jerr_exit;
    je.pub.emit_message = jerr_emit;
    je.pub.output_message = jerr_output;
    if (setjmp(je.jb)) {
        snprintf(why, whylen, "corrupt JPEG: %s", je.msg);
        free(row);
        free(img);
        jpeg_destroy_decompress(&ci);
        return -1;
    }
    jpeg_create_decompress(&ci);
    jpeg_mem_src(&ci, buf, (unsigned long)len);
    jpeg_save_markers(&ci, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&ci, TRUE);
    *orient = jpeg_orientation(&ci);
    out->w = (int)ci.image_width;
    out->h = (int)ci.image_height;
    if (!pixels) {
        jpeg_destroy_decompress(&ci);
        return 0;
    }
    int cmyk = ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK;
    int gray = ci.jpeg_color_space == JCS_GRAYSCALE;
    ci.out_color_space = cmyk ? JCS_CMYK : gray ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&ci);
    int w = (int)ci.output_width, h = (int)ci.output_height, nc = ci.output_components;
    img = malloc((size_t)w * h * 3);
    row = malloc((size_t)w * nc);
    if (!img || !row) {
        snprintf(why, whylen, "out of memory decoding a %dx%d JPEG", w, h);
        free(row);
        free(img);
        jpeg_destroy_decompress(&ci);
        return -1;
    }
    /* Adobe CMYK JPEGs store inverted ink values. */
    int inverted = ci.saw_Adobe_marker;
    while (ci.output_scanline < ci.output_height) {
        uint8_t *d = img + (size_t)ci.output_scanline * w * 3;
        JSAMPROW rp = row;
        jpeg_read_scanlines(&ci, &rp, 1);
        if (nc == 3)
            memcpy(d, row, (size_t)w * 3);
        else if (nc == 1)
            for (int x = 0; x < w; x++)
                d[3 * x] = d[3 * x + 1] = d[3 * x + 2] = row[x];
        else
            for (int x = 0; x < w; x++) {
                unsigned k = row[4 * x + 3];
                for (int c = 0; c < 3; c++) {
                    unsigned v = row[4 * x + c];
                    d[3 * x + c] = inverted ? (uint8_t)((v * k + 127) / 255)
                                            : (uint8_t)(((255 - v) * (255 - k) + 127) / 255);
                }
            }
        if (je.eof)
            break;
    }
    if (je.eof) {
        snprintf(why, whylen, "truncated JPEG (premature end of data)");
        free(row);
        free(img);
        jpeg_destroy_decompress(&ci);
        return -1;
    }
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
    free(row);
    out->data = img;
    return 0;
}

/* ---- PNG ---- */

typedef struct {
    const unsigned char *p;
    size_t n, pos;
} png_mem;

static void png_read_mem(png_structp png, png_bytep dst, png_size_t len)
{
    png_mem *m = (png_mem *)png_get_io_ptr(png);
    if (len > m->n - m->pos)
        png_error(png, "truncated PNG (premature end of data)");
    memcpy(dst, m->p + m->pos, len);
    m->pos += len;
}

static void png_err(png_structp png, png_const_charp msg)
{
    char *why = (char *)png_get_error_ptr(png);
    snprintf(why, 200, "corrupt PNG: %s", msg);
    png_longjmp(png, 1);
}

static void png_warn(png_structp png, png_const_charp msg)
{
    (void)png;
    (void)msg;
}

/* PNG's eXIf chunk holds the TIFF block itself (libpng drops one that does not start with the byte-order
 * mark). Only a chunk before the image data counts, as the PNG specification requires, so the header
 * read alone (the probe) and a full decode agree. */
static int png_orientation(png_structp png, png_infop info)
{
#ifdef PNG_eXIf_SUPPORTED
    png_uint_32 n = 0;
    png_bytep p = NULL;
    if (png_get_eXIf_1(png, info, &n, &p) && p)
        return tiff_orientation(p, n);
#else
    (void)png;
    (void)info;
#endif
    return 1;
}

static int png_do(const unsigned char *buf, size_t len, int pixels, ptl_image *out, int *orient, char *why,
                  size_t whylen)
{
    char msg[200] = "";
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, msg, png_err, png_warn);
    png_infop info = NULL;
    uint8_t *volatile img = NULL;
    png_bytep *volatile rows = NULL;
    png_mem m = {buf, len, 0};
    if (!png) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    info = png_create_info_struct(png);
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    if (setjmp(png_jmpbuf(png))) {
        snprintf(why, whylen, "%s", msg[0] ? msg : "corrupt PNG");
        free(rows);
        free(img);
        png_destroy_read_struct(&png, &info, NULL);
        return -1;
    }
    png_set_read_fn(png, &m, png_read_mem);
    png_read_info(png, info);
    *orient = png_orientation(png, info);
    int w = (int)png_get_image_width(png, info), h = (int)png_get_image_height(png, info);
    out->w = w;
    out->h = h;
    if (!pixels) {
        png_destroy_read_struct(&png, &info, NULL);
        return 0;
    }
    int ct = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    if (ct == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(png);
    if (ct == PNG_COLOR_TYPE_GRAY && depth < 8)
        png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16)
        png_set_strip_16(png);
    if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA)
        png_set_gray_to_rgb(png);
    png_set_strip_alpha(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS))
        png_set_tRNS_to_alpha(png), png_set_strip_alpha(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 3)
        png_error(png, "unsupported PNG pixel layout");
    img = malloc((size_t)w * h * 3);
    rows = malloc(sizeof(png_bytep) * (size_t)h);
    if (!img || !rows)
        png_error(png, "out of memory");
    for (int y = 0; y < h; y++)
        rows[y] = img + (size_t)y * w * 3;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    out->data = img;
    return 0;
}

/* ---- public ---- */

int ptl_image_probe(const char *path, int *w, int *h, char *why, size_t whylen)
{
    unsigned char *buf = NULL;
    size_t len;
    ptl_image im = {0, 0, NULL};
    int orient = 1, rc = -1;
    if (read_file(path, &buf, &len, why, whylen) != 0)
        return -1;
    switch (detect(buf, len)) {
    case FMT_JPEG:
        /* A complete JPEG ends with the EOI marker (some writers pad with zeros after it). Without it the
         * file is either truncated or carries trailing data: only a full decode can tell. */
        {
            size_t e = len;
            while (e > 2 && buf[e - 1] == 0)
                e--;
            int full = e < 4 || buf[e - 2] != 0xFF || buf[e - 1] != 0xD9;
            if (jpeg_do(buf, len, full, &im, &orient, why, whylen) != 0)
                goto done;
            free(im.data);
            im.data = NULL;
        }
        break;
    case FMT_PNG:
        if (len < 12 || memcmp(buf + len - 8, "IEND", 4) != 0) {
            snprintf(why, whylen, "truncated PNG (no IEND chunk at the end)");
            goto done;
        }
        if (png_do(buf, len, 0, &im, &orient, why, whylen) != 0)
            goto done;
        break;
    default:
        snprintf(why, whylen, "not a JPEG or PNG file");
        goto done;
    }
    if (orient >= 5) {
        int t = im.w;
        im.w = im.h;
        im.h = t;
    }
    if (im.w < PTL_MIN_IMAGE_SIDE || im.h < PTL_MIN_IMAGE_SIDE) {
        snprintf(why, whylen, "image size %dx%d is under %d pixels", im.w, im.h, PTL_MIN_IMAGE_SIDE);
        goto done;
    }
    *w = im.w;
    *h = im.h;
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

int ptl_image_decode(const char *path, ptl_image *out)
{
    unsigned char *buf = NULL;
    size_t len;
    char why[256];
    int orient = 1;
    out->data = NULL;
    if (read_file(path, &buf, &len, why, sizeof why) != 0)
        goto fail;
    switch (detect(buf, len)) {
    case FMT_JPEG:
        if (jpeg_do(buf, len, 1, out, &orient, why, sizeof why) != 0)
            goto fail;
        break;
    case FMT_PNG:
        if (png_do(buf, len, 1, out, &orient, why, sizeof why) != 0)
            goto fail;
        break;
    default:
        snprintf(why, sizeof why, "not a JPEG or PNG file");
        goto fail;
    }
    free(buf);
    buf = NULL;
    if (ptl_image_orient(out, orient) != 0) {
        ptl_image_free(out);
        return -1;
    }
    return 0;
fail:
    free(buf);
    return ptl_set_error(PTL_ERR_OS, "cannot decode image %s: %s", path, why);
}
