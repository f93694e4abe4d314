/* Windows BMP read directly: OS/2 and Windows headers (12 to 124 bytes), uncompressed 1/4/8-bit palette,
 * 16/24/32-bit (BI_RGB or BI_BITFIELDS masks; alpha dropped), bottom-up or top-down rows. RLE-compressed
 * files are reported as unsupported. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

static uint32_t rd16(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A channel of a BI_BITFIELDS pixel: shift and width of the mask, scaled to 8 bits. */
typedef struct {
    int shift, bits;
} field;

static field field_of(uint32_t mask)
{
    field f = {0, 0};
    if (!mask)
        return f;
    while (!(mask & 1))
        mask >>= 1, f.shift++;
    while (mask & 1)
        mask >>= 1, f.bits++;
    return f;
}

static uint8_t field_get(uint32_t px, field f)
{
    if (!f.bits)
        return 0;
    uint32_t v = (px >> f.shift) & ((f.bits >= 32 ? 0 : 1u << f.bits) - 1);
    if (f.bits >= 8)
        return (uint8_t)(v >> (f.bits - 8));
    uint32_t top = (1u << f.bits) - 1;
    return (uint8_t)((v * 255 + top / 2) / top);
}

enum { BI_RGB = 0, BI_RLE8 = 1, BI_RLE4 = 2, BI_BITFIELDS = 3, BI_ALPHABITFIELDS = 6 };

int ptl_decode_bmp(const unsigned char *buf, size_t len, const ptl_codec_req *rq, ptl_codec_out *o)
{
    o->orient = 1;
    if (len < 26 || buf[0] != 'B' || buf[1] != 'M') {
        snprintf(o->why, sizeof o->why, "corrupt BMP: file too short for its header");
        return -1;
    }
    uint32_t off = rd32(buf + 10), hs = rd32(buf + 14);
    if (hs != 12 && hs < 40) {
        snprintf(o->why, sizeof o->why, "corrupt BMP: unknown header size %u", hs);
        return -1;
    }
    if ((size_t)14 + hs > len) {
        snprintf(o->why, sizeof o->why, "corrupt BMP: file too short for its %u-byte header", hs);
        return -1;
    }
    const unsigned char *d = buf + 14;
    int64_t w, h;
    uint32_t bpp, comp = BI_RGB, ncolors = 0;
    int core = hs == 12;
    if (core) {
        w = rd16(d + 4), h = rd16(d + 6), bpp = rd16(d + 10);
    } else {
        w = (int32_t)rd32(d + 4), h = (int32_t)rd32(d + 8), bpp = rd16(d + 14);
        comp = rd32(d + 16), ncolors = rd32(d + 32);
    }
    int top_down = h < 0;
    if (top_down)
        h = -h;
    if (w <= 0 || h <= 0 || w > 0x7fffffff || h > 0x7fffffff) {
        snprintf(o->why, sizeof o->why, "corrupt BMP: size %lldx%lld", (long long)w, (long long)h);
        return -1;
    }
    o->w0 = (int)w;
    o->h0 = (int)h;
    if (comp == BI_RLE8 || comp == BI_RLE4) {
        snprintf(o->why, sizeof o->why, "RLE-compressed BMP is not supported");
        return -1;
    }
    if (comp != BI_RGB && comp != BI_BITFIELDS && comp != BI_ALPHABITFIELDS) {
        snprintf(o->why, sizeof o->why, "BMP compression %u is not supported", comp);
        return -1;
    }
    if (bpp != 1 && bpp != 4 && bpp != 8 && bpp != 16 && bpp != 24 && bpp != 32) {
        snprintf(o->why, sizeof o->why, "corrupt BMP: %u bits per pixel", bpp);
        return -1;
    }
    size_t stride = (size_t)((w * bpp + 31) / 32) * 4;
    if (off < 14 + hs || (size_t)off > len || (len - off) / stride < (size_t)h) {
        snprintf(o->why, sizeof o->why, "truncated BMP (%zu bytes of pixel data for %lld rows of %zu)",
                 len > off ? len - off : 0, (long long)h, stride);
        return -1;
    }
    if (ptl_codec_check_size(rq, o, "BMP") != 0)
        return -1;
    /* The channel masks: in the header from version 2 (52 bytes) on, else right after a 40-byte header. */
    uint32_t mr = 0, mg = 0, mb = 0;
    if (bpp == 16 || bpp == 32) {
        if (comp == BI_RGB) {
            mr = bpp == 16 ? 0x7c00 : 0xff0000, mg = bpp == 16 ? 0x03e0 : 0xff00, mb = bpp == 16 ? 0x1f : 0xff;
        } else {
            const unsigned char *mk = d + 40;
            if ((size_t)(mk - buf) + 12 > len) {
                snprintf(o->why, sizeof o->why, "corrupt BMP: no room for the channel masks");
                return -1;
            }
            mr = rd32(mk), mg = rd32(mk + 4), mb = rd32(mk + 8);
        }
    }
    /* The palette follows the header (and the masks of a 40-byte BI_BITFIELDS header). */
    const unsigned char *pal = NULL;
    uint32_t npal = 0, esz = core ? 3 : 4;
    if (bpp <= 8) {
        npal = ncolors ? ncolors : 1u << bpp;
        if (npal > 1u << bpp)
            npal = 1u << bpp;
        pal = d + hs;
        if ((size_t)(pal - buf) + (size_t)npal * esz > len) {
            snprintf(o->why, sizeof o->why, "corrupt BMP: palette of %u colors past the end of the file", npal);
            return -1;
        }
    }
    if (!rq->pixels)
        return 0;
    uint8_t *img = ptl_codec_alloc(o, (int)w, (int)h, "BMP");
    if (!img)
        return -1;
    field fr = field_of(mr), fg = field_of(mg), fb = field_of(mb);
    for (int64_t y = 0; y < h; y++) {
        const unsigned char *s = buf + off + stride * (size_t)(top_down ? y : h - 1 - y);
        uint8_t *q = img + (size_t)y * w * 3;
        for (int64_t x = 0; x < w; x++, q += 3) {
            if (bpp == 24) {
                q[0] = s[3 * x + 2], q[1] = s[3 * x + 1], q[2] = s[3 * x];
            } else if (bpp == 16 || bpp == 32) {
                uint32_t px = bpp == 16 ? rd16(s + 2 * x) : rd32(s + 4 * x);
                q[0] = field_get(px, fr), q[1] = field_get(px, fg), q[2] = field_get(px, fb);
            } else {
                uint32_t k = (s[x * bpp / 8] >> (8 - bpp - (x * bpp) % 8)) & ((1u << bpp) - 1);
                if (k >= npal) {
                    q[0] = q[1] = q[2] = 0;
                } else {
                    const unsigned char *c = pal + (size_t)k * esz;
                    q[0] = c[2], q[1] = c[1], q[2] = c[0];
                }
            }
        }
    }
    o->img.w = (int)w;
    o->img.h = (int)h;
    o->img.data = img;
    return 0;
}
