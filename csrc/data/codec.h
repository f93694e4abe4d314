/* The image decoders behind ptl_image_probe / ptl_image_decode (decode.c): one file per format. Each reads
 * a whole file held in memory. Internal to csrc/data. */
#ifndef PTL_DATA_CODEC_H
#define PTL_DATA_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "dataset.h"

/* What a decoder is asked for. */
typedef struct {
    int pixels;            /* 0: header only (size, orientation, cheap validity checks) */
    int64_t max_pixels;    /* a declared w * h above this fails before any pixel buffer exists (> 0) */
    int target_w, target_h; /* the size the caller resizes to, in displayed orientation (0: unknown) */
    int64_t scale_pixels;  /* JPEG: above this many pixels decode at a reduced DCT scale (0: never) */
    int expect_w0, expect_h0; /* the displayed size the dataset scan saw, checked with the header (0: any) */
} ptl_codec_req;

/* What a decoder found. `w0, h0` are the declared (stored) size, `orient` the EXIF orientation (1-8);
 * with pixels, `img` holds the decoded stored-orientation RGB image (smaller than w0 x h0 after DCT
 * scaling). On failure: -1 with a reason in `why`; `oom` set when it was an allocation failure. */
typedef struct {
    int w0, h0, orient, oom;
    ptl_image img;
    char why[256];
} ptl_codec_out;

int ptl_decode_jpeg(const unsigned char *buf, size_t len, const ptl_codec_req *rq, ptl_codec_out *o);
int ptl_decode_png(const unsigned char *buf, size_t len, const ptl_codec_req *rq, ptl_codec_out *o);
int ptl_decode_bmp(const unsigned char *buf, size_t len, const ptl_codec_req *rq, ptl_codec_out *o);
/* Without the library at build time (PTL_WITH_WEBP / PTL_WITH_TIFF undefined) these are never called:
 * decode.c reports the format as unsupported. */
int ptl_decode_webp(const unsigned char *buf, size_t len, const ptl_codec_req *rq, ptl_codec_out *o);
int ptl_decode_tiff(const unsigned char *buf, size_t len, const ptl_codec_req *rq, ptl_codec_out *o);

/* The shared header checks of every decoder (declared size, pixel limit, the size the scan saw), called
 * once w0, h0 and orient are known. */
int ptl_codec_check_size(const ptl_codec_req *rq, ptl_codec_out *o, const char *fmt);
/* An RGB buffer of w x h or NULL (sets oom and the reason). */
uint8_t *ptl_codec_alloc(ptl_codec_out *o, int w, int h, const char *fmt);

/* EXIF orientation (1-8; 1 when absent or unreadable) of a TIFF-structured block (exif.c). */
int ptl_exif_tiff_orientation(const unsigned char *p, size_t n);
/* The same from a JPEG APP1 payload ("Exif\0\0" + TIFF). */
int ptl_exif_app1_orientation(const unsigned char *p, size_t n);

#endif
