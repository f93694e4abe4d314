/* PNG through libpng: palette, gray, 16-bit and alpha converted to 8-bit RGB (alpha dropped); the declared
 * size checked before any pixel buffer exists; a warning while the image data is read that says data is
 * missing or damaged is corruption (libpng reports most missing data as errors; excess data after the last
 * row, or a bad ancillary chunk, leaves every pixel decoded and is ignored). */
#define _GNU_SOURCE /* strcasestr */
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

typedef struct {
    const unsigned char *p;
    size_t n, pos;
    int in_data; /* reading the image data: a warning now means damaged data */
    char msg[200];
} png_ctx;

static void png_read_mem(png_structp png, png_bytep dst, png_size_t len)
{
    png_ctx *m = (png_ctx *)png_get_io_ptr(png);
    if (len > m->n - m->pos)
        png_error(png, "truncated PNG (premature end of data)");
    memcpy(dst, m->p + m->pos, len);
    m->pos += len;
}

static void png_err(png_structp png, png_const_charp msg)
{
    png_ctx *m = (png_ctx *)png_get_error_ptr(png);
    snprintf(m->msg, sizeof m->msg, "corrupt PNG: %s", msg);
    png_longjmp(png, 1);
}

/* libpng's warnings have no codes: these words are in every one that means missing or damaged data. */
static int missing_data(const char *msg)
{
    static const char *const words[] = {"truncated", "not enough", "damaged", "missing"};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (strcasestr(msg, words[i]))
            return 1;
    return 0;
}

static void png_warn(png_structp png, png_const_charp msg)
{
    png_ctx *m = (png_ctx *)png_get_error_ptr(png);
    if (m->in_data && missing_data(msg)) {
        snprintf(m->msg, sizeof m->msg, "corrupt PNG image data: %s", msg);
        png_longjmp(png, 1);
    }
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
        return ptl_exif_tiff_orientation(p, n);
#else
    (void)png;
    (void)info;
#endif
    return 1;
}

int ptl_decode_png(const unsigned char *buf, size_t len, const ptl_codec_req *rq, ptl_codec_out *o)
{
    png_ctx m = {buf, len, 0, 0, ""};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &m, png_err, png_warn);
    png_infop info = NULL;
    uint8_t *volatile img = NULL;
    png_bytep *volatile rows = NULL;
    if (png)
        info = png_create_info_struct(png);
    if (!png || !info) {
        png_destroy_read_struct(&png, NULL, NULL);
        o->oom = 1;
        snprintf(o->why, sizeof o->why, "out of memory");
        return -1;
    }
    if (setjmp(png_jmpbuf(png))) {
        if (!o->oom)
            snprintf(o->why, sizeof o->why, "%s", m.msg[0] ? m.msg : "corrupt PNG");
        free(rows);
        free(img);
        png_destroy_read_struct(&png, &info, NULL);
        return -1;
    }
    png_set_read_fn(png, &m, png_read_mem);
    png_read_info(png, info);
    o->orient = png_orientation(png, info);
    int w = (int)png_get_image_width(png, info), h = (int)png_get_image_height(png, info);
    o->w0 = w;
    o->h0 = h;
    int bad = ptl_codec_check_size(rq, o, "PNG") != 0;
    if (bad || !rq->pixels) {
        png_destroy_read_struct(&png, &info, NULL);
        return bad ? -1 : 0;
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
    img = ptl_codec_alloc(o, w, h, "PNG");
    rows = malloc(sizeof(png_bytep) * (size_t)h);
    if (!img || !rows) {
        o->oom = 1;
        snprintf(o->why, sizeof o->why, "out of memory decoding a %dx%d PNG", w, h);
        png_error(png, "out of memory");
    }
    for (int y = 0; y < h; y++)
        rows[y] = img + (size_t)y * w * 3;
    m.in_data = 1;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    o->img.w = w;
    o->img.h = h;
    o->img.data = img;
    return 0;
}
