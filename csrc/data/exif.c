/* EXIF orientation: the Orientation tag (0x0112) of the first IFD of a TIFF-structured block, as JPEG's APP1
 * and PNG's eXIf chunk carry it. */
#include <string.h>

#include "codec.h"

int ptl_exif_tiff_orientation(const unsigned char *p, size_t n)
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

int ptl_exif_app1_orientation(const unsigned char *p, size_t n)
{
    if (n < 14 || memcmp(p, "Exif\0\0", 6) != 0)
        return 1;
    return ptl_exif_tiff_orientation(p + 6, n - 6);
}
