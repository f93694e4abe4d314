/* JPEG through libjpeg(-turbo): 8-bit RGB from YCbCr, grayscale, CMYK/YCCK; the declared size checked
 * before any pixel buffer exists; libjpeg's warnings that mean missing or damaged entropy data treated as
 * corruption (its default is to fill the missing rows with gray); DCT scaling (scale_num / 8) for large
 * images when the caller only needs a smaller size. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
/* after jpeglib.h: its configuration decides which warning codes jerror.h declares */
#include <jerror.h>

#include "codec.h"

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    int truncated; /* the data ended before the image did */
    char msg[JMSG_LENGTH_MAX];
} jerr_t;

static void jerr_exit(j_common_ptr c)
{
    jerr_t *e = (jerr_t *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jb, 1);
}

/* Warnings that mean the image data is incomplete or damaged. Others (extraneous bytes between markers,
 * an unknown JFIF revision, a bad ICC marker) leave every pixel decoded and are ignored. */
static int missing_data(int code)
{
    switch (code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_MUST_RESYNC:
    case JWRN_HUFF_BAD_CODE:
#if JPEG_LIB_VERSION >= 70 || defined(C_ARITH_CODING_SUPPORTED) || defined(D_ARITH_CODING_SUPPORTED)
    case JWRN_ARITH_BAD_CODE:
#endif
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_NOT_SEQUENTIAL:
        return 1;
    default:
        return 0;
    }
}

static void jerr_emit(j_common_ptr c, int level)
{
    jerr_t *e = (jerr_t *)c->err;
    if (level < 0 && missing_data(c->err->msg_code)) {
        (*c->err->format_message)(c, e->msg);
        e->truncated = c->err->msg_code == JWRN_JPEG_EOF;
        longjmp(e->jb, 1);
    }
}

static void jerr_output(j_common_ptr c) { (void)c; }

static int jpeg_orientation(struct jpeg_decompress_struct *ci)
{
    for (jpeg_saved_marker_ptr m = ci->marker_list; m; m = m->next)
        if (m->marker == JPEG_APP0 + 1) {
            int o = ptl_exif_app1_orientation(m->data, m->data_length);
            if (o != 1)
                return o;
        }
    return 1;
}

/* The smallest scale n / 8 whose output still covers tw x th (stored orientation), 8 when none is smaller. */
static int dct_scale(int w, int h, int tw, int th)
{
    for (int n = 1; n < 8; n++) {
        long sw = ((long)w * n + 7) / 8, sh = ((long)h * n + 7) / 8;
        if (sw >= tw && sh >= th)
            return n;
    }
    return 8;
}

int ptl_decode_jpeg(const unsigned char *buf, size_t len, const ptl_codec_req *rq, ptl_codec_out *o)
{
    struct jpeg_decompress_struct ci;
    jerr_t je;
    unsigned char *volatile row = NULL;
    uint8_t *volatile img = NULL;
    memset(&je, 0, sizeof je);
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jerr_exit;
    je.pub.emit_message = jerr_emit;
    je.pub.output_message = jerr_output;
    if (setjmp(je.jb)) {
        if (je.truncated)
            snprintf(o->why, sizeof o->why, "truncated JPEG (premature end of data)");
        else
            snprintf(o->why, sizeof o->why, "corrupt JPEG: %s", je.msg);
        free(row);
        free(img);
        jpeg_destroy_decompress(&ci);
        return -1;
    }
    jpeg_create_decompress(&ci);
    jpeg_mem_src(&ci, buf, (unsigned long)len);
    jpeg_save_markers(&ci, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&ci, TRUE);
    o->orient = jpeg_orientation(&ci);
    o->w0 = (int)ci.image_width;
    o->h0 = (int)ci.image_height;
    int bad = ptl_codec_check_size(rq, o, "JPEG") != 0;
    if (bad || !rq->pixels) {
        jpeg_destroy_decompress(&ci);
        return bad ? -1 : 0;
    }
    int cmyk = ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK;
    int gray = ci.jpeg_color_space == JCS_GRAYSCALE;
    ci.out_color_space = cmyk ? JCS_CMYK : gray ? JCS_GRAYSCALE : JCS_RGB;
    int64_t npx = (int64_t)o->w0 * o->h0;
    if (rq->scale_pixels > 0 && npx > rq->scale_pixels && rq->target_w > 0 && rq->target_h > 0) {
        int sw = o->orient >= 5, tw = sw ? rq->target_h : rq->target_w, th = sw ? rq->target_w : rq->target_h;
        ci.scale_num = (unsigned)dct_scale(o->w0, o->h0, tw, th);
        ci.scale_denom = 8;
    }
    jpeg_start_decompress(&ci);
    int w = (int)ci.output_width, h = (int)ci.output_height, nc = ci.output_components;
    img = ptl_codec_alloc(o, w, h, "JPEG");
    row = malloc((size_t)w * nc);
    if (!img || !row) {
        o->oom = 1;
        snprintf(o->why, sizeof o->why, "out of memory decoding a %dx%d JPEG", w, h);
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
    }
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
    free(row);
    o->img.w = w;
    o->img.h = h;
    o->img.data = img;
    return 0;
}
