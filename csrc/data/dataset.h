/* The data pipeline: YOLO datasets, image decoding, resize/letterbox, augmentation, loader threads.
 * Images are 8-bit RGB, HWC, row-major; boxes inside the pipeline are pixel xyxy. Every random choice a
 * sample makes comes from a counter-based stream keyed by (seed, epoch, index) (sample_rng.h), so a
 * sample's bytes do not depend on thread count, timing, caching or worker persistence. */
#ifndef PTL_DATA_DATASET_H
#define PTL_DATA_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "../ptl.h"

#define PTL_FILL 114 /* padding value of mosaic, warp and letterbox */
#define PTL_MIN_IMAGE_SIDE 10

typedef struct {
    int w, h;
    uint8_t *data; /* w*h*3, owned */
} ptl_image;

void ptl_image_free(ptl_image *im);

/* ---- decode.c ---- */
/* Reads the header (and checks the file is complete) without decoding pixels. On a bad file returns -1
 * and writes a reason into `why`; *w, *h are the displayed size (EXIF orientation applied). */
int ptl_image_probe(const char *path, int *w, int *h, char *why, size_t whylen);
/* Decodes a JPEG or PNG (detected from its first bytes) to 8-bit RGB with EXIF orientation applied.
 * Grayscale and CMYK/YCCK JPEGs, palette/gray/16-bit/alpha PNGs are converted (alpha dropped).
 * Returns -1 with ptl_set_error naming the file on failure. */
int ptl_image_decode(const char *path, ptl_image *out);
/* Applies EXIF orientation `o` (1..8) to an RGB image in place (may swap w and h). */
int ptl_image_orient(ptl_image *im, int o);

/* ---- resize.c ---- */
/* Bilinear resize with pixel-centre alignment (OpenCV INTER_LINEAR convention). Strides in bytes. */
void ptl_resize_bilinear(const uint8_t *src, int sw, int sh, size_t sstride, uint8_t *dst, int dw, int dh,
                         size_t dstride);
/* Size after the load-time resize of §7.2 (long side = imgsz, aspect kept). */
void ptl_load_size(int w0, int h0, int imgsz, int *w, int *h);
/* Letterbox (§7.8) of src into a W x H canvas: fills `dst`, returns the ratio and the left/top pad. */
typedef struct {
    double r;
    int left, top, new_w, new_h;
} ptl_letterbox_params;
void ptl_letterbox_params_get(int w, int h, int W, int H, int scaleup, ptl_letterbox_params *p);
void ptl_letterbox(const uint8_t *src, int w, int h, uint8_t *dst, int W, int H, const ptl_letterbox_params *p);

/* ---- augment.c ---- */
/* Boxes: n rows of (cls, x1, y1, x2, y2) in pixels. */
typedef struct {
    float *b;  /* 5 floats a box */
    int n, cap;
} ptl_boxes;

/* The mosaic layout of §7.4 for tile k of size (w, h) with centre (xc, yc) on a 2s x 2s canvas:
 * a = destination (x1a, y1a, x2a, y2a), b = source (x1b, y1b, x2b, y2b). */
void ptl_mosaic_rects(int k, int w, int h, int xc, int yc, int s, int a[4], int b[4]);

/* The affine/perspective matrix M = T S R P C of §7.5 from uniform draws u[0..7] in [0, 1). */
typedef struct {
    float degrees, translate, scale, shear, perspective;
} ptl_affine_cfg;
void ptl_affine_matrix(const ptl_affine_cfg *c, int w_in, int h_in, int w_out, int h_out, const double u[8],
                       double M[9], double *sigma);
/* Output pixel (x, y) samples the input bilinearly at M^-1 (x, y) (projective when M[6] or M[7] != 0);
 * taps outside the input read PTL_FILL. */
int ptl_warp(const uint8_t *src, int w_in, int h_in, uint8_t *dst, int w_out, int h_out, const double M[9]);
/* Maps boxes through M, clips to the output and filters them with the rule of §7.5 (in place). */
void ptl_boxes_affine(ptl_boxes *bx, const double M[9], double sigma, int w_out, int h_out, float area_thr);
/* HSV jitter (§7.6) with gains already multiplied by the draws: r[3] = U(-1,1) * (h, s, v) gains. */
void ptl_hsv(uint8_t *img, int w, int h, const double r[3]);
void ptl_flip_lr(uint8_t *img, int w, int h, ptl_boxes *bx);
void ptl_flip_ud(uint8_t *img, int w, int h, ptl_boxes *bx);

/* ---- labels.c ---- */
typedef struct {
    char **msg;
    int n, cap;
} ptl_log;

int ptl_log_add(ptl_log *lg, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void ptl_log_free(ptl_log *lg);

/* Parses a YOLO label file (§7.1). Missing file = no objects. Returns 0 with *labels (n*5 floats:
 * cls cx cy w h) when the file is usable (duplicates removed, each reported); returns 1 and logs the
 * reason (file and line) when the image must be skipped; -1 on allocation failure. */
int ptl_labels_read(const char *path, int nc, float **labels, int *n, ptl_log *lg, int *n_dup);

/* ---- loader.c ---- */
typedef struct {
    char *image, *label;
    int w0, h0;     /* displayed size of the file */
    int w, h;       /* after the load-time resize */
    int n;          /* boxes */
    float *labels;  /* n*5: cls cx cy w h, normalised */
} ptl_item;

typedef struct {
    int n;
    ptl_item *items;
    int max_labels;
    int n_skipped, n_duplicates, n_missing_labels;
    ptl_log log; /* one message per problem, in file order */
} ptl_dataset;

/* Scans n (image, label) pairs with `threads` threads: probes images, reads labels, drops bad items. */
int ptl_dataset_scan(const char *const *images, const char *const *labels, int n, int nc, int imgsz,
                     int threads, ptl_dataset **out);
void ptl_dataset_free(ptl_dataset *ds);

typedef struct {
    int imgsz, batch, workers, train, rect, cache, persistent, prefetch;
    uint64_t seed;
    float mosaic, degrees, translate, scale, shear, perspective;
    float hsv_h, hsv_s, hsv_v, flipud, fliplr;
    int pinned; /* ring in page-locked memory (CUDA builds) */
} ptl_loader_cfg;

typedef struct ptl_loader ptl_loader;

/* Takes ownership of ds. */
int ptl_loader_create(ptl_dataset *ds, const ptl_loader_cfg *cfg, ptl_loader **out);
void ptl_loader_destroy(ptl_loader *L);
int ptl_loader_num_batches(const ptl_loader *L);
/* Starts producing the batches of `epoch` (stops the previous one). */
int ptl_loader_start(ptl_loader *L, int epoch, int mosaic_on);

typedef struct {
    int slot, n, h, w, epoch, batch;
    uint8_t *images;   /* n*h*w*3 */
    int n_targets;
    float *targets;    /* n_targets*6: image index in batch, cls, cx, cy, w, h (normalised) */
    int64_t *indices;  /* dataset index of each image */
    double *meta;      /* n*6: h0, w0, ratio, pad left, pad top, flipped (0/1; val: 0) */
} ptl_batch_view;

/* Waits up to timeout_ms for the next batch. Returns 0 with the batch, 1 at the end of the epoch,
 * 2 on timeout, -1 on error (a worker's failure or a misuse). The slot stays reserved until
 * ptl_loader_release. */
int ptl_loader_next(ptl_loader *L, int timeout_ms, ptl_batch_view *out);
void ptl_loader_release(ptl_loader *L, int slot);
/* Builds one sample outside the threads (tests): image w*h*3 (imgsz square for train) and boxes. */
int ptl_loader_sample(ptl_loader *L, int epoch, int index, int mosaic_on, uint8_t *img, float *targets,
                      int *n_targets, double meta[6]);
/* Image size (h, w) of sample `index` and the capacity of its target rows. */
int ptl_loader_sample_shape(const ptl_loader *L, int index, int *h, int *w, int *cap);
/* Cache statistics: bytes needed for the whole dataset, bytes filled so far. */
void ptl_loader_cache_info(const ptl_loader *L, int64_t *needed, int64_t *filled);
/* Decodes and caches every image now (with the worker count of the loader). */
int ptl_loader_fill_cache(ptl_loader *L);

/* ---- pinned host memory (csrc/cuda/pinned_host.c in CUDA builds, aligned malloc otherwise) ---- */
/* Page-locked when want_pinned and a CUDA device is usable (then *is_pinned = 1), else 64-byte aligned
 * ordinary memory. NULL with ptl_set_error on failure. */
void *ptl_host_alloc(size_t nbytes, int want_pinned, int *is_pinned);
void ptl_host_free(void *p, int is_pinned);
/* Fences: an asynchronous upload from a ring slot records one on its stream; the data threads wait on it
 * before they overwrite that slot. Without CUDA these are no-ops. */
int ptl_host_fence_record(void **fence, void *stream);
void ptl_host_fence_wait(void *fence);
void ptl_host_fence_destroy(void *fence);
/* Records a fence for ring slot `slot` on `stream` (a cudaStream_t). */
int ptl_loader_record_fence(ptl_loader *L, int slot, void *stream);

#endif
