/* TIFF through libtiff (>= 4.5 for per-file error handlers): every photometric interpretation and
 * compression libtiff reads, through its RGBA interface (8 bits per channel; the alpha channel of an image
 * that has one is dropped after libtiff premultiplies the colours by it); the Orientation tag applied like
 * EXIF's; only the first page. Any libtiff error (a short strip, bad compressed data) is corruption. */
#ifdef PTL_WITH_TIFF
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tiffio.h>

#include "codec.h"

typedef struct {
    const unsigned char *p;
    toff_t n, pos;
    char err[200];
} tiff_mem;

static tmsize_t mem_read(thandle_t h, void *dst, tmsize_t size)
{
    tiff_mem *m = (tiff_mem *)h;
    if (size < 0)
        return 0;
    toff_t k = m->pos >= m->n ? 0 : m->n - m->pos;
    if ((toff_t)size < k)
        k = (toff_t)size;
    memcpy(dst, m->p + m->pos, (size_t)k);
    m->pos += k;
    return (tmsize_t)k;
}

static tmsize_t mem_write(thandle_t h, void *src, tmsize_t size)
{
    (void)h, (void)src, (void)size;
    return 0;
}

static toff_t mem_seek(thandle_t h, toff_t off, int whence)
{
    tiff_mem *m = (tiff_mem *)h;
    toff_t base = whence == SEEK_CUR ? m->pos : whence == SEEK_END ? m->n : 0;
    m->pos = base + off;
    return m->pos;
}

static int mem_close(thandle_t h)
{
    (void)h;
    return 0;
}

static toff_t mem_size(thandle_t h) { return ((tiff_mem *)h)->n; }

static int mem_map(thandle_t h, void **base, toff_t *size)
{
    tiff_mem *m = (tiff_mem *)h;
    *base = (void *)m->p;
    *size = m->n;
    return 1;
}

static void mem_unmap(thandle_t h, void *base, toff_t size) { (void)h, (void)base, (void)size; }

static int on_error(TIFF *tif, void *user, const char *module, const char *fmt, va_list ap)
{
    tiff_mem *m = user;
    (void)tif, (void)module;
    if (!m->err[0])
        vsnprintf(m->err, sizeof m->err, fmt, ap);
    return 1;
}

static int on_warning(TIFF *tif, void *user, const char *module, const char *fmt, va_list ap)
{
    (void)tif, (void)user, (void)module, (void)fmt, (void)ap;
    return 1; /* unknown tags and the like: the pixels are unaffected */
}

int ptl_decode_tiff(const unsigned char *buf, size_t len, const ptl_codec_req *rq, ptl_codec_out *o)
{
    tiff_mem m = {buf, (toff_t)len, 0, ""};
    TIFFRGBAImage ri;
    int ri_open = 0, rc = -1;
    uint32_t *raster = NULL;
    char emsg[1024] = "";
    TIFFOpenOptions *opts = TIFFOpenOptionsAlloc();
    if (!opts) {
        o->oom = 1;
        snprintf(o->why, sizeof o->why, "out of memory");
        return -1;
    }
    TIFFOpenOptionsSetErrorHandlerExtR(opts, on_error, &m);
    TIFFOpenOptionsSetWarningHandlerExtR(opts, on_warning, &m);
    TIFF *tif = TIFFClientOpenExt("image", "rm", (thandle_t)&m, mem_read, mem_write, mem_seek, mem_close, mem_size,
                                  mem_map, mem_unmap, opts);
    TIFFOpenOptionsFree(opts);
    if (!tif) {
        snprintf(o->why, sizeof o->why, "corrupt TIFF: %s", m.err[0] ? m.err : "cannot read the header");
        return -1;
    }
    uint32_t w = 0, h = 0;
    uint16_t orient = ORIENTATION_TOPLEFT;
    TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &w);
    TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &h);
    TIFFGetFieldDefaulted(tif, TIFFTAG_ORIENTATION, &orient);
    if (w == 0 || h == 0 || w > 0x7fffffff || h > 0x7fffffff) {
        snprintf(o->why, sizeof o->why, "corrupt TIFF: size %ux%u", w, h);
        goto done;
    }
    o->w0 = (int)w;
    o->h0 = (int)h;
    o->orient = orient >= 1 && orient <= 8 ? orient : 1;
    if (ptl_codec_check_size(rq, o, "TIFF") != 0)
        goto done;
    if (!TIFFRGBAImageOK(tif, emsg)) {
        snprintf(o->why, sizeof o->why, "TIFF layout not supported: %s", emsg);
        goto done;
    }
    if (!rq->pixels) {
        rc = 0;
        goto done;
    }
    if (!TIFFRGBAImageBegin(&ri, tif, 1, emsg)) {
        snprintf(o->why, sizeof o->why, "corrupt TIFF: %s", emsg);
        goto done;
    }
    ri_open = 1;
    ri.req_orientation = orient; /* the raster in stored order; the orientation is applied by the caller */
    raster = malloc((size_t)w * h * 4);
    uint8_t *img = raster ? ptl_codec_alloc(o, (int)w, (int)h, "TIFF") : NULL;
    if (!raster || !img) {
        o->oom = 1;
        snprintf(o->why, sizeof o->why, "out of memory decoding a %ux%u TIFF", w, h);
        goto done;
    }
    if (!TIFFRGBAImageGet(&ri, raster, w, h) || m.err[0]) {
        free(img);
        snprintf(o->why, sizeof o->why, "corrupt TIFF image data: %s", m.err[0] ? m.err : "read failed");
        goto done;
    }
    for (size_t i = 0; i < (size_t)w * h; i++) {
        uint32_t px = raster[i];
        img[3 * i] = (uint8_t)TIFFGetR(px), img[3 * i + 1] = (uint8_t)TIFFGetG(px), img[3 * i + 2] = (uint8_t)TIFFGetB(px);
    }
    o->img.w = (int)w;
    o->img.h = (int)h;
    o->img.data = img;
    rc = 0;
done:
    if (ri_open)
        TIFFRGBAImageEnd(&ri);
    free(raster);
    TIFFClose(tif);
    return rc;
}
#else
typedef int ptl_decode_tiff_unused; /* built without libtiff: decode.c reports TIFF files as unsupported */
#endif
