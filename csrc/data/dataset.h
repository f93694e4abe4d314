/* The data pipeline: YOLO datasets, image decoding, resize/letterbox, augmentation, loader threads.
 * Images are 8-bit RGB, HWC, row-major; boxes inside the pipeline are pixel xyxy. Every random choice a
 * sample makes comes from a counter-based stream keyed by (seed, epoch, index) (sample_rng.h), so a
 * sample's bytes do not depend on thread count, timing, caching or worker persistence. */
#ifndef PTL_DATA_DATASET_H
#define PTL_DATA_DATASET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../ptl.h"

#define PTL_FILL 114 /* padding value of mosaic, warp and letterbox */
#define PTL_MIN_IMAGE_SIDE 10
/* Default pixel limit of a declared image size: Pillow's MAX_IMAGE_PIXELS (2^30 / 4 / 3). */
#define PTL_MAX_PIXELS_DEFAULT 89478485LL
/* Default size above which a JPEG is decoded at a reduced DCT scale (4096 x 4096 pixels). */
#define PTL_JPEG_SCALE_PIXELS_DEFAULT 16777216LL

typedef struct {
    int w, h;
    uint8_t *data; /* w*h*3, owned */
} ptl_image;

void ptl_image_free(ptl_image *im);

/* ---- decode.c and the decoders (codec.h) ---- */
typedef enum {
    PTL_FMT_UNKNOWN = 0,
    PTL_FMT_JPEG,
    PTL_FMT_PNG,
    PTL_FMT_BMP,
    PTL_FMT_WEBP,
    PTL_FMT_TIFF,
    PTL_FMT_COUNT
} ptl_image_format;

const char *ptl_image_format_name(int format);
/* Whether this build decodes the format (WebP and TIFF need their libraries at build time). */
int ptl_image_format_built(int format);

/* Reads the header (and checks the file is complete) without keeping pixels. Returns 0 with the displayed
 * size (EXIF orientation applied) in *w, *h; -1 with a reason in `why` for a bad file (also one whose
 * declared size exceeds max_pixels); -2 when the format's decoder is not built. *format: what the first
 * bytes say. */
int ptl_image_probe(const char *path, int64_t max_pixels, int *w, int *h, int *format, char *why, size_t whylen);

typedef struct {
    int64_t max_pixels;        /* a larger declared size fails before any pixel buffer exists */
    int64_t scale_pixels;      /* JPEGs with more pixels decode at the smallest DCT scale n/8 covering the
                                * target (0: never) */
    int target_w, target_h;    /* the size the caller resizes to (displayed orientation) */
    int expect_w0, expect_h0;  /* displayed size the scan saw, checked at the header (0: any) */
} ptl_decode_req;

/* Decodes an image file to 8-bit RGB with EXIF orientation applied (out may be smaller than the displayed
 * size *w0 x *h0 after DCT scaling). Grayscale, CMYK/YCCK, palette, 16-bit and alpha images are converted
 * (alpha dropped). Returns -1 with ptl_set_error naming the file: PTL_ERR_OS for a bad or changed file,
 * PTL_ERR_MEMORY when an allocation failed. */
int ptl_image_decode(const char *path, const ptl_decode_req *req, ptl_image *out, int *w0, int *h0);
/* Applies EXIF orientation `o` (1..8) to an RGB image in place (may swap w and h). */
int ptl_image_orient(ptl_image *im, int o);

/* ---- resize.c ---- */
/* Bilinear resize with pixel-centre alignment (OpenCV INTER_LINEAR convention). Strides in bytes. */
void ptl_resize_bilinear(const uint8_t *src, int sw, int sh, size_t sstride, uint8_t *dst, int dw, int dh,
                         size_t dstride);
/* Size after the load-time resize of §7.2 into a W x H frame: r = min(W / w0, H / h0), aspect kept
 * (for W = H = imgsz: long side = imgsz). */
void ptl_load_size(int w0, int h0, int W, int H, int *w, int *h);
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

/* The mosaic layout of §7.4 for tile k of size (w, h) with centre (xc, yc) on a 2 sw x 2 sh canvas:
 * a = destination (x1a, y1a, x2a, y2a), b = source (x1b, y1b, x2b, y2b). */
void ptl_mosaic_rects(int k, int w, int h, int xc, int yc, int sw, int sh, int a[4], int b[4]);

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

/* Label rules (§7.1) for nc classes; single_cls: any non-negative integer class is accepted (duplicates
 * are found with the classes as given) and every kept row becomes class 0. */
typedef struct {
    int nc, single_cls;
} ptl_label_rules;

/* Parses a YOLO label file (§7.1). Sets *found (the file exists; missing = no objects). Returns 0 with
 * *labels (n*5 floats: cls cx cy w h) when the file is usable (duplicates removed, each reported); returns
 * 1 and logs the reason (file and line) when the image must be skipped; -1 on allocation failure. */
int ptl_labels_read(const char *path, const ptl_label_rules *r, float **labels, int *n, int *found, ptl_log *lg,
                    int *n_dup);
/* The same checks on rows given in memory (nrows x 5: cls cx cy w h); messages name `name` and the row. */
int ptl_labels_rows(const char *name, const float *rows, int nrows, const ptl_label_rules *r, float **labels, int *n,
                    ptl_log *lg, int *n_dup);

/* ---- scan.c ---- */
typedef struct {
    char *image, *label;     /* image path; label file, or the name of the rows' source */
    int index;               /* position in the scanned list */
    int w0, h0;              /* displayed size of the file */
    int w, h;                /* after the load-time resize */
    int n;                   /* boxes */
    float *labels;           /* n*5: cls cx cy w h, normalised */
    int64_t src_size;        /* the image file at the scan (validates the disk cache) */
    int64_t src_mtime_ns;
} ptl_item;

typedef struct {
    int n;
    ptl_item *items;
    int max_labels;
    int n_skipped, n_duplicates;
    int n_labeled, n_empty, n_missing_labels; /* usable images: with boxes, empty label, no label file */
    int64_t n_boxes;
    int n_unsupported[PTL_FMT_COUNT];         /* files skipped because their decoder is not built */
    ptl_log log;                              /* one message per problem, in file order */
} ptl_dataset;

/* One image's labels: a YOLO label file, or rows given in memory (COCO JSON, parsed in Python). */
typedef struct {
    const char *path;  /* label file, or NULL with rows */
    const char *name;  /* rows: their source, for messages */
    const float *rows; /* nrows x 5: cls cx cy w h, normalised */
    int nrows;
} ptl_label_src;

typedef struct {
    ptl_label_rules rules;
    int load_w, load_h;  /* the load-time resize frame (§7.2) */
    int threads;
    int64_t max_pixels;
} ptl_scan_cfg;

/* Scans n images and their labels with cfg->threads threads: probes images, reads labels, drops bad items.
 * Stops early with an error when *cancel becomes nonzero (cancel may be NULL). */
int ptl_dataset_scan(const char *const *images, const ptl_label_src *labels, int n, const ptl_scan_cfg *cfg,
                     const atomic_int *cancel, ptl_dataset **out);
void ptl_dataset_free(ptl_dataset *ds);

/* ---- the loader (loader.c, batch_plan.c, image_source.c, disk_cache.c, sample.c) ---- */
enum { PTL_CACHE_NONE = 0, PTL_CACHE_RAM = 1, PTL_CACHE_DISK = 2 };
/* How the ranks of a data-parallel job share an epoch (batch_plan.c); with world = 1 both are the whole epoch.
 * SPLIT (training): the epoch's global batches hold batch * world images, in the single-process order of a
 *   batch of that size; rank r takes the r-th slice of each (a last, partial global batch is split as evenly
 *   as possible, so a rank's slice may be empty). Every rank has the same number of batches.
 * DEAL (validation): the global batches are the single-process ones of `batch` images; rank r takes batches
 *   r, r + world, r + 2 world, ... whole, so every image meets the same batch and letterbox as in one process. */
enum { PTL_SHARD_SPLIT = 0, PTL_SHARD_DEAL = 1 };

typedef struct {
    int imgsz_h, imgsz_w;  /* training frame (multiples of 32); rect and validation use a square one */
    int batch, workers, train, rect, cache, persistent, prefetch;
    uint64_t seed;
    float mosaic, degrees, translate, scale, shear, perspective;
    float hsv_h, hsv_s, hsv_v, flipud, fliplr;
    int pinned;            /* ring in page-locked memory (CUDA builds) */
    int64_t max_pixels, scale_pixels; /* decode limits (ptl_decode_req) */
    int rank, world, shard; /* this process's share of every epoch (PTL_SHARD_*); world 1: all of it */
} ptl_loader_cfg;

typedef struct ptl_loader ptl_loader;

/* Takes ownership of ds. cache_paths: with cfg->cache == PTL_CACHE_DISK, the cache file of each item of ds
 * (in item order; its folder exists), else NULL. */
int ptl_loader_create(ptl_dataset *ds, const ptl_loader_cfg *cfg, const char *const *cache_paths, ptl_loader **out);
void ptl_loader_destroy(ptl_loader *L);
/* Batches per epoch of this rank, and of the epoch's global plan (the same unless sharded by DEAL). */
int ptl_loader_num_batches(const ptl_loader *L);
int ptl_loader_num_global_batches(const ptl_loader *L);
/* The (h, w) of this rank's batch b (fixed for the loader's life). */
void ptl_loader_batch_shape(const ptl_loader *L, int b, int *h, int *w);
/* This rank's batch b of an epoch: the global batch it belongs to, and where its images start in the epoch's
 * order and how many there are (0 for an empty slice of a SPLIT plan). */
void ptl_loader_batch_slice(const ptl_loader *L, int b, int *global_batch, int *start, int *count);
/* The dataset indices of this rank's batch b in `epoch` (count entries, see ptl_loader_batch_slice); plans
 * the epoch's order without disturbing a running epoch. */
int ptl_loader_batch_indices(ptl_loader *L, int epoch, int b, int64_t *out, int cap, int *count);
/* Whether training batches keep one order (rect with differing shapes, as Ultralytics: no shuffle). */
int ptl_loader_fixed_order(const ptl_loader *L);
/* Starts producing the batches of `epoch` (stops the previous one). */
int ptl_loader_start(ptl_loader *L, int epoch, int mosaic_on);

typedef struct {
    int slot, n, h, w, epoch, batch; /* batch: the global batch index (see PTL_SHARD_*) */
    uint8_t *images;   /* n*h*w*3 */
    int n_targets;
    float *targets;    /* n_targets*6: image index in batch, cls, cx, cy, w, h (normalised) */
    int64_t *indices;  /* dataset index of each image */
    int64_t *sources;  /* dataset index whose file each image shows (differs after a replacement) */
    double *meta;      /* n*6: h0, w0, gain y, gain x, pad left, pad top (train: no pad) */
} ptl_batch_view;

/* Waits up to timeout_ms for the next batch. Returns 0 with the batch, 1 at the end of the epoch,
 * 2 on timeout, -1 on error (a worker's failure or a misuse). The slot stays reserved until
 * ptl_loader_release. */
int ptl_loader_next(ptl_loader *L, int timeout_ms, ptl_batch_view *out);
void ptl_loader_release(ptl_loader *L, int slot);
/* Builds one sample outside the threads (tests): image w*h*3 (the batch shape of its batch) and boxes;
 * *source as in ptl_batch_view. */
int ptl_loader_sample(ptl_loader *L, int epoch, int index, int mosaic_on, uint8_t *img, float *targets,
                      int *n_targets, double meta[6], int64_t *source);
/* Image size (h, w) of sample `index` and the capacity of its target rows. */
int ptl_loader_sample_shape(const ptl_loader *L, int index, int *h, int *w, int *cap);
/* Cache statistics: bytes needed for the whole dataset, bytes filled so far. */
void ptl_loader_cache_info(const ptl_loader *L, int64_t *needed, int64_t *filled);
/* Fills the RAM cache, or checks and writes the disk cache files, now (with the loader's worker count).
 * Stops early with an error when *cancel becomes nonzero (cancel may be NULL). */
int ptl_loader_fill_cache(ptl_loader *L, const atomic_int *cancel);
/* Files that failed to decode after the scan (each is replaced, see image_source.c). */
int ptl_loader_num_failed(ptl_loader *L);
/* Problems met while loading (a failed file with its reason, a cache file that could not be written), one
 * message each, in the order met: how many, and message i copied into buf. */
int ptl_loader_num_problems(ptl_loader *L);
int ptl_loader_problem(ptl_loader *L, int i, char *buf, size_t n);

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
