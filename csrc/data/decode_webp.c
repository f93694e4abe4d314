/* WebP (lossy and lossless, still images) through libwebp; alpha dropped. Animated files are reported as
 * unsupported. EXIF orientation of WebP is not applied (OpenCV and Pillow do not apply it either). */
#ifdef PTL_WITH_WEBP
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <webp/decode.h>

#include "codec.h"

int ptl_decode_webp(const unsigned char *buf, size_t len, const ptl_codec_req *rq, ptl_codec_out *o)
{
    WebPBitstreamFeatures f;
    o->orient = 1;
    VP8StatusCode st = WebPGetFeatures(buf, len, &f);
    if (st != VP8_STATUS_OK) {
        snprintf(o->why, sizeof o->why, "corrupt WebP (header status %d)", (int)st);
        return -1;
    }
    o->w0 = f.width;
    o->h0 = f.height;
    if (f.has_animation) {
        snprintf(o->why, sizeof o->why, "animated WebP is not supported");
        return -1;
    }
    /* The RIFF size field says how long the file must be: a shorter one is truncated. */
    uint32_t riff = (uint32_t)buf[4] | (uint32_t)buf[5] << 8 | (uint32_t)buf[6] << 16 | (uint32_t)buf[7] << 24;
    if ((uint64_t)riff + 8 > len) {
        snprintf(o->why, sizeof o->why, "truncated WebP (%zu of %llu bytes)", len, (unsigned long long)riff + 8);
        return -1;
    }
    if (ptl_codec_check_size(rq, o, "WebP") != 0)
        return -1;
    if (!rq->pixels)
        return 0;
    uint8_t *img = ptl_codec_alloc(o, f.width, f.height, "WebP");
    if (!img)
        return -1;
    size_t stride = (size_t)f.width * 3;
    if (!WebPDecodeRGBInto(buf, len, img, stride * (size_t)f.height, (int)stride)) {
        free(img);
        snprintf(o->why, sizeof o->why, "corrupt WebP image data");
        return -1;
    }
    o->img.w = f.width;
    o->img.h = f.height;
    o->img.data = img;
    return 0;
}
#else
typedef int ptl_decode_webp_unused; /* built without libwebp: decode.c reports WebP files as unsupported */
#endif
