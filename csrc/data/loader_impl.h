/* The loader's state and the interfaces between its files (internal to csrc/data):
 *   loader.c        the ring of batch slots, the worker threads, start/next/release, the cache fill
 *   batch_plan.c    the order of the images and the shape of each batch (square, rectangular)
 *   image_source.c  an item's image after the load-time resize: RAM cache, disk cache or decode, and the
 *                   replacement of files that fail to decode
 *   disk_cache.c    the cache file format: check, map, atomic write
 *   sample.c        one sample's pipeline (mosaic, letterbox, affine, HSV, flips) */
#ifndef PTL_DATA_LOADER_IMPL_H
#define PTL_DATA_LOADER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "augment_rows.h"
#include "dataset.h"

enum { SLOT_FREE = 0, SLOT_FILLING, SLOT_READY, SLOT_HELD };

typedef struct {
    int state, batch, n, h, w, next_sample, done;
    int global_batch, start; /* the batch's index in the global plan; its first position in the order */
    uint8_t *images;
    int is_pinned;
    float *boxes;    /* n * cap * 5, per sample */
    int *counts;     /* n */
    float *targets;  /* packed for the consumer: n * cap * 6 */
    int64_t *indices, *sources;
    double *meta;
    void *fence;
    int fence_pending;
} slot_t;

/* Disk cache files mapped while one sample is built: at most the four mosaic tiles. */
#define PTL_SAMPLE_MAPS 4

/* One thread's buffers for building samples. */
typedef struct {
    uint8_t *resized; /* imgsz_h * imgsz_w * 3: a decoded image after the load-time resize */
    uint8_t *canvas;  /* 4 * imgsz_h * imgsz_w * 3 (mosaic canvas or its tile quarters), or a batch image */
    ptl_boxes boxes;
    ptl_post *post;   /* per-sample HSV tables (66 kB: not on the thread's stack) */
    uint8_t *rows;    /* two rows of the mosaic canvas, 2 * 2 imgsz_w * 3 */
    struct {
        void *p;
        size_t n;
    } maps[PTL_SAMPLE_MAPS];
    int nmaps;
} scratch_t;

/* An item's image source state (image_source.c). */
enum { SRC_EMPTY = 0, SRC_FILLING, SRC_READY };

struct ptl_loader {
    ptl_dataset *ds;
    ptl_loader_cfg cfg;
    int nb, cap;           /* this rank's batches per epoch, boxes per sample */
    /* batch_plan.c */
    int nb_global;         /* batches of the epoch's global plan */
    int global_batch;      /* images per global batch: batch * world (SPLIT) or batch (DEAL) */
    int *order;            /* dataset indices of this epoch in batch order */
    int *bshape;           /* per global batch: h, w */
    int max_h, max_w;
    int rect_order;        /* rect training with differing shapes: the sorted order, every epoch */
    /* image_source.c */
    uint8_t **cache;            /* RAM cache: per item, the resized image */
    char **cache_paths;         /* disk cache: per item, its file */
    atomic_int *cache_state;    /* per item: SRC_* (RAM: bytes held; disk: a valid file exists) */
    int64_t cache_needed;
    atomic_llong cache_filled;
    atomic_char *bad;           /* per item: 1 once its file failed to decode */
    pthread_mutex_t log_mu;
    ptl_log problems;
    int n_failed, write_failed;
    /* threads and ring (loader.c) */
    pthread_t *threads;
    int nthreads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_ready;
    int stop, running, epoch, mosaic_on, gen;
    int assign_next, consume_next, inflight;
    int nslots;
    slot_t *slots;
    int err;
    ptl_error_kind err_kind;
    char errmsg[1024];
    scratch_t main_scratch; /* for workers == 0 and ptl_loader_sample */
};

/* batch_plan.c: the order and batch shapes (once), the order of an epoch (into `order`, n entries), this
 * rank's share. */
int ptl_plan_init(ptl_loader *L);
void ptl_plan_epoch(const ptl_loader *L, int epoch, int *order);
void ptl_plan_free(ptl_loader *L);
void ptl_plan_slice(const ptl_loader *L, int b, int *global_batch, int *start, int *count);

/* image_source.c */
int ptl_src_init(ptl_loader *L, const char *const *cache_paths);
void ptl_src_free(ptl_loader *L);
/* The image of item idx after the load-time resize (*px, w x h of the item used): from the RAM cache, a
 * mapped disk cache file, or decoded into buf (imgsz_h * imgsz_w * 3 bytes). A file that fails to decode is
 * reported once and replaced by the next item in dataset order that decodes: *used says which item's image
 * (and labels) the caller gets. Mapped files stay mapped until ptl_src_release(sc). */
int ptl_src_load(ptl_loader *L, scratch_t *sc, uint8_t *buf, int idx, const uint8_t **px, int *used);
void ptl_src_release(scratch_t *sc);
int ptl_src_fill(ptl_loader *L, const atomic_int *cancel);

/* disk_cache.c: a cache file is a 64-byte header (the key below) and the w * h * 3 pixels. */
typedef struct {
    int64_t src_size, src_mtime_ns; /* the image file it was made from */
    int w0, h0, w, h;
    int64_t scale_pixels;           /* the JPEG DCT-scaling threshold it was decoded with */
} ptl_dcache_key;
/* 1 when path holds a complete cache file of key, 0 when not (missing, stale, torn or foreign). */
int ptl_dcache_valid(const char *path, const ptl_dcache_key *k);
/* Maps a valid file: 0 with the pixels at *px (unmap with ptl_dcache_unmap), 1 when it is not valid. */
int ptl_dcache_map(const char *path, const ptl_dcache_key *k, const uint8_t **px, void **map, size_t *len);
void ptl_dcache_unmap(void *map, size_t len);
/* Writes px (k->w * k->h * 3 bytes) as path atomically: a temporary file in the same folder, flushed, then
 * renamed over path. -1 with ptl_set_error (PTL_ERR_OS) on failure, leaving no temporary file. */
int ptl_dcache_write(const char *path, const ptl_dcache_key *k, const uint8_t *px);

/* sample.c */
int ptl_scratch_init(scratch_t *s, const ptl_loader *L);
void ptl_scratch_free(scratch_t *s);
/* Builds sample idx into img (W x H x 3: its batch's shape); writes normalised (cls cx cy w h) rows to tg
 * and their count, meta = (h0, w0, gain y, gain x, pad left, pad top) and the item whose file it shows. */
int ptl_build_sample(ptl_loader *L, scratch_t *s, int epoch, int idx, int mosaic_on, int H, int W, uint8_t *img,
                     float *tg, int *ntg, double meta[6], int64_t *source);

#endif
