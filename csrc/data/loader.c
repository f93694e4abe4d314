/* Dataset scan, RAM cache, per-sample pipelines (§7.3-7.9, §8.1) and the worker threads that fill a ring
 * of batches. A sample is a pure function of (seed, epoch, dataset index, mosaic on/off) and the config:
 * every draw comes from its own Philox stream, mosaic partners are drawn uniformly from the dataset (not
 * from a timing-dependent buffer), and the cache holds exactly the bytes an uncached load produces. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "augment_rows.h"
#include "dataset.h"
#include "sample_rng.h"

/* ------------------------------------------------------------------------------------------------ */
/* Dataset scan                                                                                       */

typedef struct {
    const char *const *images, *const *labels;
    int n, nc, imgsz;
    atomic_int next;
    ptl_item *items;
    ptl_log *logs;  /* one per item */
    char *status;   /* 0 ok, 1 skipped, 2 internal error */
    int *dups, *missing;
    pthread_mutex_t err_mu;
    char err[512];
    ptl_error_kind err_kind;
} scan_ctx;

static void *scan_worker(void *arg)
{
    scan_ctx *c = arg;
    int i;
    while ((i = atomic_fetch_add(&c->next, 1)) < c->n) {
        ptl_item *it = &c->items[i];
        char why[256];
        it->image = strdup(c->images[i]);
        it->label = strdup(c->labels[i]);
        if (!it->image || !it->label) {
            c->status[i] = 2;
            pthread_mutex_lock(&c->err_mu);
            snprintf(c->err, sizeof c->err, "out of memory scanning the dataset");
            c->err_kind = PTL_ERR_MEMORY;
            pthread_mutex_unlock(&c->err_mu);
            continue;
        }
        if (ptl_image_probe(it->image, &it->w0, &it->h0, why, sizeof why) != 0) {
            c->status[i] = ptl_log_add(&c->logs[i], "%s: %s; image skipped", it->image, why) ? 2 : 1;
            continue;
        }
        ptl_load_size(it->w0, it->h0, c->imgsz, &it->w, &it->h);
        FILE *f = fopen(it->label, "r");
        if (f)
            fclose(f);
        else
            c->missing[i] = 1;
        int r = ptl_labels_read(it->label, c->nc, &it->labels, &it->n, &c->logs[i], &c->dups[i]);
        if (r < 0) {
            c->status[i] = 2;
            pthread_mutex_lock(&c->err_mu);
            snprintf(c->err, sizeof c->err, "%s", ptl_error_message());
            c->err_kind = ptl_error_kind_get();
            pthread_mutex_unlock(&c->err_mu);
        } else if (r > 0) {
            c->status[i] = 1;
        }
    }
    return NULL;
}

static void item_free(ptl_item *it)
{
    free(it->image);
    free(it->label);
    free(it->labels);
}

void ptl_dataset_free(ptl_dataset *ds)
{
    if (!ds)
        return;
    for (int i = 0; i < ds->n; i++)
        item_free(&ds->items[i]);
    free(ds->items);
    ptl_log_free(&ds->log);
    free(ds);
}

int ptl_dataset_scan(const char *const *images, const char *const *labels, int n, int nc, int imgsz,
                     int threads, ptl_dataset **out)
{
    scan_ctx c;
    pthread_t *th = NULL;
    int started = 0;
    ptl_dataset *ds = NULL;
    memset(&c, 0, sizeof c);
    *out = NULL;
    if (n < 0 || nc <= 0 || imgsz < 32)
        return ptl_set_error(PTL_ERR_VALUE, "dataset scan: bad n=%d, nc=%d or imgsz=%d", n, nc, imgsz);
    c.images = images, c.labels = labels, c.n = n, c.nc = nc, c.imgsz = imgsz;
    atomic_init(&c.next, 0);
    pthread_mutex_init(&c.err_mu, NULL);
    c.items = calloc(n ? n : 1, sizeof(ptl_item));
    c.logs = calloc(n ? n : 1, sizeof(ptl_log));
    c.status = calloc(n ? n : 1, 1);
    c.dups = calloc(n ? n : 1, sizeof(int));
    c.missing = calloc(n ? n : 1, sizeof(int));
    ds = calloc(1, sizeof *ds);
    if (threads < 1)
        threads = 1;
    if (threads > n)
        threads = n > 0 ? n : 1;
    th = calloc(threads, sizeof(pthread_t));
    if (!c.items || !c.logs || !c.status || !c.dups || !c.missing || !ds || !th) {
        ptl_set_error(PTL_ERR_MEMORY, "out of memory scanning %d images", n);
        goto fail;
    }
    for (; started < threads; started++)
        if (pthread_create(&th[started], NULL, scan_worker, &c) != 0)
            break;
    if (started == 0)
        scan_worker(&c);
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    if (c.err[0]) {
        ptl_set_error(c.err_kind, "%s", c.err);
        goto fail;
    }
    ds->items = calloc(n ? n : 1, sizeof(ptl_item));
    if (!ds->items) {
        ptl_set_error(PTL_ERR_MEMORY, "out of memory scanning %d images", n);
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < c.logs[i].n; k++)
            if (ptl_log_add(&ds->log, "%s", c.logs[i].msg[k]) != 0)
                goto fail;
        ds->n_duplicates += c.dups[i];
        if (c.status[i] == 0) {
            ds->n_missing_labels += c.missing[i];
            ds->items[ds->n++] = c.items[i];
            if (c.items[i].n > ds->max_labels)
                ds->max_labels = c.items[i].n;
            memset(&c.items[i], 0, sizeof(ptl_item));
        } else {
            ds->n_skipped++;
        }
    }
    *out = ds;
    ds = NULL;
fail:
    for (int i = 0; i < n && c.items; i++)
        item_free(&c.items[i]);
    for (int i = 0; i < n && c.logs; i++)
        ptl_log_free(&c.logs[i]);
    free(c.items);
    free(c.logs);
    free(c.status);
    free(c.dups);
    free(c.missing);
    free(th);
    pthread_mutex_destroy(&c.err_mu);
    ptl_dataset_free(ds);
    return *out ? 0 : -1;
}

/* ------------------------------------------------------------------------------------------------ */
/* Loader                                                                                             */

enum { SLOT_FREE = 0, SLOT_FILLING, SLOT_READY, SLOT_HELD };

typedef struct {
    int state, batch, n, h, w, next_sample, done;
    uint8_t *images;
    int is_pinned;
    float *boxes;    /* n * cap * 5, per sample */
    int *counts;     /* n */
    float *targets;  /* packed for the consumer: n * cap * 6 */
    int64_t *indices;
    double *meta;
    void *fence;
    int fence_pending;
} slot_t;

typedef struct {
    uint8_t *resized; /* imgsz * imgsz * 3 */
    uint8_t *canvas;  /* (2 imgsz)^2 * 3 */
    ptl_boxes boxes;
    ptl_post *post;   /* per-sample HSV tables (66 kB: not on the thread's stack) */
    uint8_t *rows;    /* two rows of the mosaic canvas, 2 * 2 imgsz * 3 */
} scratch_t;

struct ptl_loader {
    ptl_dataset *ds;
    ptl_loader_cfg cfg;
    int nb, cap;           /* batches per epoch, boxes per sample */
    int *order;            /* dataset indices of this epoch in batch order */
    int *bshape;           /* per batch: h, w */
    int max_h, max_w;
    /* cache */
    uint8_t **cache;
    atomic_int *cache_state; /* 0 empty, 1 being filled, 2 ready */
    int64_t cache_needed;
    atomic_llong cache_filled;
    /* threads and ring */
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

static void scratch_free(scratch_t *s)
{
    free(s->resized);
    free(s->canvas);
    free(s->boxes.b);
    free(s->post);
    free(s->rows);
    memset(s, 0, sizeof *s);
}

static int scratch_init(scratch_t *s, const ptl_loader *L)
{
    size_t S = (size_t)L->cfg.imgsz;
    memset(s, 0, sizeof *s);
    s->resized = malloc(S * S * 3);
    s->canvas = malloc(4 * S * S * 3 > (size_t)L->max_h * L->max_w * 3 ? 4 * S * S * 3
                                                                      : (size_t)L->max_h * L->max_w * 3);
    s->boxes.cap = L->cap;
    s->boxes.b = malloc(sizeof(float) * 5 * (size_t)L->cap);
    s->post = malloc(sizeof(ptl_post));
    s->rows = malloc(2 * 2 * S * 3);
    if (!s->resized || !s->canvas || !s->boxes.b || !s->post || !s->rows) {
        scratch_free(s);
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory for loader scratch buffers (imgsz %d)", L->cfg.imgsz);
    }
    return 0;
}

/* The image `idx` after the load-time resize: from the cache, or decoded into buf (imgsz^2 * 3 bytes). */
static int load_image(ptl_loader *L, uint8_t *buf, int idx, const uint8_t **px, int *w, int *h)
{
    const ptl_item *it = &L->ds->items[idx];
    ptl_image im = {0, 0, NULL};
    uint8_t *dst = buf, *owned = NULL;
    int claimed = 0;
    *w = it->w;
    *h = it->h;
    if (L->cfg.cache) {
        int st = atomic_load_explicit(&L->cache_state[idx], memory_order_acquire);
        if (st == 2) {
            *px = L->cache[idx];
            return 0;
        }
        int zero = 0;
        if (st == 0 && atomic_compare_exchange_strong(&L->cache_state[idx], &zero, 1)) {
            claimed = 1;
            owned = malloc((size_t)it->w * it->h * 3);
            if (!owned) {
                ptl_set_error(PTL_ERR_MEMORY, "out of memory caching %s", it->image);
                goto fail;
            }
            dst = owned;
        }
    }
    if (ptl_image_decode(it->image, &im) != 0)
        goto fail;
    if (im.w != it->w0 || im.h != it->h0) {
        ptl_set_error(PTL_ERR_OS, "image %s changed size since the dataset scan (%dx%d, now %dx%d)", it->image,
                      it->w0, it->h0, im.w, im.h);
        goto fail;
    }
    ptl_resize_bilinear(im.data, im.w, im.h, (size_t)im.w * 3, dst, it->w, it->h, (size_t)it->w * 3);
    ptl_image_free(&im);
    if (claimed) {
        L->cache[idx] = owned;
        atomic_fetch_add(&L->cache_filled, (long long)it->w * it->h * 3);
        atomic_store_explicit(&L->cache_state[idx], 2, memory_order_release);
    }
    *px = dst;
    return 0;
fail:
    ptl_image_free(&im);
    free(owned);
    if (claimed)
        atomic_store_explicit(&L->cache_state[idx], 0, memory_order_release);
    return -1;
}

/* Labels of item idx as pixel xyxy boxes of a (w, h) image scaled by (gx, gy) and shifted by (ox, oy),
 * appended to bx. */
static void add_boxes(ptl_boxes *bx, const ptl_item *it, double w, double h, double ox, double oy)
{
    for (int i = 0; i < it->n && bx->n < bx->cap; i++) {
        const float *l = it->labels + 5 * i;
        float *b = bx->b + 5 * bx->n++;
        b[0] = l[0];
        b[1] = (float)((l[1] - l[3] / 2) * w + ox);
        b[2] = (float)((l[2] - l[4] / 2) * h + oy);
        b[3] = (float)((l[1] + l[3] / 2) * w + ox);
        b[4] = (float)((l[2] + l[4] / 2) * h + oy);
    }
}

static inline int imax(int a, int b) { return a > b ? a : b; }
static inline int imin(int a, int b) { return a < b ? a : b; }

/* PTL_FILL over the columns [x0, x1) of an RGB row, clipped to [lo, hi). */
static void fill_span(uint8_t *row, int lo, int hi, int x0, int x1)
{
    x0 = imax(x0, lo), x1 = imin(x1, hi);
    if (x1 > x0)
        memset(row + (size_t)x0 * 3, PTL_FILL, (size_t)(x1 - x0) * 3);
}

/* The mosaic canvas of §7.4 read row by row from its tiles (a ptl_row_fn), the last two rows kept: the
 * separable warp needs no canvas in memory. */
typedef struct {
    const uint8_t *px[4];
    int w[4], a[4][4], b[4][4]; /* tile sizes, destination and source rectangles */
    int yc, tag[2];
    uint8_t *buf[2];
} mosaic_rows;

static const uint8_t *mosaic_row(void *ctx, int y, int x0, int x1, int keep)
{
    mosaic_rows *m = ctx;
    if (m->tag[0] == y)
        return m->buf[0];
    if (m->tag[1] == y)
        return m->buf[1];
    int slot = m->tag[0] == keep ? 1 : 0, cur = x0;
    uint8_t *row = m->buf[slot];
    m->tag[slot] = y;
    /* A left tile (0 or 2) ends at xc and a right one (1 or 3) starts there; the rest is PTL_FILL. */
    for (int k = y < m->yc ? 0 : 2, end = k + 2; k < end; k++) {
        const int *a = m->a[k], *b = m->b[k];
        int s0 = imax(a[0], x0), s1 = imin(a[2], x1);
        if (y < a[1] || y >= a[3] || s1 <= s0)
            continue;
        if (s0 > cur)
            memset(row + (size_t)(cur - x0) * 3, PTL_FILL, (size_t)(s0 - cur) * 3);
        memcpy(row + (size_t)(s0 - x0) * 3, m->px[k] + ((size_t)(b[1] + y - a[1]) * m->w[k] + b[0] + s0 - a[0]) * 3,
               (size_t)(s1 - s0) * 3);
        cur = s1;
    }
    if (x1 > cur)
        memset(row + (size_t)(cur - x0) * 3, PTL_FILL, (size_t)(x1 - cur) * 3);
    return row;
}

/* Builds sample `idx` into img (W x H x 3, W = H = imgsz for train); writes normalised (cls cx cy w h)
 * rows to tg and their count, and meta = (h0, w0, gain y, gain x, pad left, pad top). */
static int build_sample(ptl_loader *L, scratch_t *s, int epoch, int idx, int mosaic_on, int H, int W,
                        uint8_t *img, float *tg, int *ntg, double meta[6])
{
    const ptl_loader_cfg *c = &L->cfg;
    const ptl_item *it = &L->ds->items[idx];
    ptl_boxes *bx = &s->boxes;
    const uint8_t *px;
    int w, h;
    bx->n = 0;
    meta[0] = it->h0, meta[1] = it->w0;
    meta[2] = (double)it->h / it->h0, meta[3] = (double)it->w / it->w0;
    meta[4] = meta[5] = 0;
    if (!c->train) {
        ptl_letterbox_params p;
        if (load_image(L, s->resized, idx, &px, &w, &h) != 0)
            return -1;
        ptl_letterbox_params_get(w, h, W, H, 0, &p);
        ptl_letterbox(px, w, h, img, W, H, &p);
        add_boxes(bx, it, w * p.r, h * p.r, p.left, p.top);
        meta[2] *= p.r, meta[3] *= p.r, meta[4] = p.left, meta[5] = p.top;
    } else {
        int S = c->imgsz, win, hin;
        ptl_sample_rng g;
        double u_mos, u_xc, u_yc, u_aff[8], u_hsv[3], u_ud, u_lr, M[9], sigma;
        uint32_t partner[3];
        ptl_sample_rng_init(&g, c->seed, (uint32_t)epoch, (uint32_t)idx, PTL_STREAM_AUG);
        /* Fixed draw order whatever the branches taken, so close_mosaic changes nothing else. */
        u_mos = ptl_sample_uniform(&g);
        u_xc = ptl_sample_uniform(&g);
        u_yc = ptl_sample_uniform(&g);
        for (int k = 0; k < 3; k++)
            partner[k] = ptl_sample_below(&g, (uint32_t)L->ds->n);
        for (int k = 0; k < 8; k++)
            u_aff[k] = ptl_sample_uniform(&g);
        for (int k = 0; k < 3; k++)
            u_hsv[k] = ptl_sample_uniform(&g);
        u_ud = ptl_sample_uniform(&g);
        u_lr = ptl_sample_uniform(&g);
        ptl_affine_cfg ac = {c->degrees, c->translate, c->scale, c->shear, c->perspective};
        mosaic_rows mr;
        int tiles = 0; /* the warp reads the mosaic tiles row by row */
        if (mosaic_on && u_mos < c->mosaic) {
            int S2 = 2 * S, rr[4] = {0, 0, 0, 0};
            int xc = (int)(S / 2.0 + u_xc * S), yc = (int)(S / 2.0 + u_yc * S);
            win = hin = S2;
            ptl_affine_matrix(&ac, win, hin, S, S, u_aff, M, &sigma);
            tiles = ptl_warp_is_separable(M);
            mr.yc = yc, mr.tag[0] = mr.tag[1] = -1, mr.buf[0] = s->rows, mr.buf[1] = s->rows + (size_t)S2 * 3;
            /* Otherwise the canvas is built where the warp reads it (rr): tiles copied there, the rest filled. */
            if (!tiles)
                ptl_warp_source_rect(M, S2, S2, S, S, rr);
            for (int k = 0; k < 4; k++) {
                int id = k == 0 ? idx : (int)partner[k - 1];
                const int *a = mr.a[k], *b = mr.b[k];
                /* Tiles read together are decoded (when not cached) into quarters of the unused canvas. */
                if (load_image(L, tiles ? s->canvas + (size_t)k * S * S * 3 : s->resized, id, &px, &w, &h) != 0)
                    return -1;
                ptl_mosaic_rects(k, w, h, xc, yc, S, mr.a[k], mr.b[k]);
                mr.px[k] = px, mr.w[k] = w;
                int x0 = imax(a[0], rr[0]), x1 = imin(a[2], rr[2]), y0 = imax(a[1], rr[1]), y1 = imin(a[3], rr[3]);
                for (int y = y0; x1 > x0 && y < y1; y++)
                    memcpy(s->canvas + ((size_t)y * S2 + x0) * 3,
                           px + ((size_t)(b[1] + y - a[1]) * w + b[0] + x0 - a[0]) * 3, (size_t)(x1 - x0) * 3);
                add_boxes(bx, &L->ds->items[id], w, h, a[0] - b[0], a[1] - b[1]);
            }
            for (int y = rr[1]; y < rr[3]; y++) {
                /* Row y holds a left tile (0 or 2) ending at xc and a right one (1 or 3) starting there. */
                const int *l = y < yc ? mr.a[0] : mr.a[2], *r = y < yc ? mr.a[1] : mr.a[3];
                int hl = y >= l[1] && y < l[3], hr = y >= r[1] && y < r[3];
                uint8_t *row = s->canvas + (size_t)y * S2 * 3;
                fill_span(row, rr[0], rr[2], rr[0], hl ? l[0] : hr ? xc : rr[2]);
                fill_span(row, rr[0], rr[2], hr ? r[2] : hl ? xc : rr[2], rr[2]);
            }
            int k = 0;
            for (int i = 0; i < bx->n; i++) {
                float *bb = bx->b + 5 * i;
                for (int j = 1; j < 5; j++)
                    bb[j] = fminf(fmaxf(bb[j], 0.f), (float)S2);
                if (bb[3] > bb[1] && bb[4] > bb[2])
                    memmove(bx->b + 5 * k++, bb, 5 * sizeof(float));
            }
            bx->n = k;
        } else {
            ptl_letterbox_params p;
            if (load_image(L, s->resized, idx, &px, &w, &h) != 0)
                return -1;
            ptl_letterbox_params_get(w, h, S, S, 1, &p);
            ptl_letterbox(px, w, h, s->canvas, S, S, &p);
            add_boxes(bx, it, w * p.r, h * p.r, p.left, p.top);
            win = hin = S;
            ptl_affine_matrix(&ac, win, hin, S, S, u_aff, M, &sigma);
        }
        int identity = win == S && M[0] == 1 && M[1] == 0 && M[2] == 0 && M[3] == 0 && M[4] == 1 && M[5] == 0 &&
                       M[6] == 0 && M[7] == 0;
        int hsv = c->hsv_h != 0 || c->hsv_s != 0 || c->hsv_v != 0;
        double r[3] = {(2 * u_hsv[0] - 1) * c->hsv_h, (2 * u_hsv[1] - 1) * c->hsv_s, (2 * u_hsv[2] - 1) * c->hsv_v};
        ptl_post *post = s->post;
        ptl_post_init(post, hsv ? r : NULL, u_lr < c->fliplr, u_ud < c->flipud);
        if (identity)
            ptl_copy_post(s->canvas, S, S, img, post);
        else if (tiles ? ptl_warp_rows(mosaic_row, &mr, win, hin, img, S, S, M, post)
                       : ptl_warp_post(s->canvas, win, hin, img, S, S, M, post))
            return -1;
        ptl_boxes_affine(bx, M, sigma, S, S, 0.10f);
        if (post->flip_ud)
            ptl_boxes_flip(bx, S, S, 0);
        if (post->flip_lr)
            ptl_boxes_flip(bx, S, S, 1);
    }
    for (int i = 0; i < bx->n; i++) {
        const float *b = bx->b + 5 * i;
        float *t = tg + 5 * i;
        t[0] = b[0];
        t[1] = (b[1] + b[3]) / 2 / W;
        t[2] = (b[2] + b[4]) / 2 / H;
        t[3] = (b[3] - b[1]) / W;
        t[4] = (b[4] - b[2]) / H;
    }
    *ntg = bx->n;
    return 0;
}

static void slot_free(slot_t *s)
{
    ptl_host_fence_destroy(s->fence);
    ptl_host_free(s->images, s->is_pinned);
    free(s->boxes);
    free(s->counts);
    free(s->targets);
    free(s->indices);
    free(s->meta);
    memset(s, 0, sizeof *s);
}

static int slot_init(slot_t *s, const ptl_loader *L)
{
    size_t B = (size_t)L->cfg.batch, cap = (size_t)L->cap;
    memset(s, 0, sizeof *s);
    s->images = ptl_host_alloc(B * L->max_h * L->max_w * 3, L->cfg.pinned, &s->is_pinned);
    if (!s->images)
        return -1;
    s->boxes = malloc(sizeof(float) * B * cap * 5);
    s->counts = calloc(B, sizeof(int));
    s->targets = malloc(sizeof(float) * B * cap * 6);
    s->indices = malloc(sizeof(int64_t) * B);
    s->meta = malloc(sizeof(double) * B * 6);
    if (!s->boxes || !s->counts || !s->targets || !s->indices || !s->meta) {
        slot_free(s);
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory for the loader's batch ring");
    }
    return 0;
}

/* Takes one sample task, runs it with the lock released. Called and returns with L->mu held.
 * Returns 1 when a task ran, 0 when none was available. */
static int run_one_task(ptl_loader *L, scratch_t *sc)
{
    slot_t *s = NULL;
    if (L->err || !L->running)
        return 0;
    for (int pass = 0; pass < 2 && !s; pass++) {
        int best = -1;
        for (int k = 0; k < L->nslots; k++)
            if (L->slots[k].state == SLOT_FILLING && L->slots[k].next_sample < L->slots[k].n &&
                (best < 0 || L->slots[k].batch < L->slots[best].batch))
                best = k;
        if (best >= 0) {
            s = &L->slots[best];
            break;
        }
        if (pass == 0 && L->assign_next < L->nb && L->assign_next - L->consume_next < L->nslots) {
            for (int k = 0; k < L->nslots; k++)
                if (L->slots[k].state == SLOT_FREE) {
                    slot_t *f = &L->slots[k];
                    int b = L->assign_next++;
                    int start = b * L->cfg.batch, end = start + L->cfg.batch;
                    if (end > L->ds->n)
                        end = L->ds->n;
                    f->state = SLOT_FILLING;
                    f->batch = b;
                    f->n = end - start;
                    f->h = L->bshape[2 * b];
                    f->w = L->bshape[2 * b + 1];
                    f->next_sample = f->done = 0;
                    pthread_cond_broadcast(&L->cv_work);
                    break;
                }
        }
    }
    if (!s)
        return 0;
    int i = s->next_sample++, gen = L->gen, epoch = L->epoch, mos = L->mosaic_on;
    int idx = L->order[s->batch * L->cfg.batch + i];
    size_t img_bytes = (size_t)s->h * s->w * 3;
    L->inflight++;
    int wait_fence = s->fence_pending;
    pthread_mutex_unlock(&L->mu);
    if (wait_fence)
        ptl_host_fence_wait(s->fence);
    s->indices[i] = idx;
    int rc = build_sample(L, sc, epoch, idx, mos, s->h, s->w, s->images + i * img_bytes,
                          s->boxes + (size_t)i * L->cap * 5, &s->counts[i], s->meta + 6 * i);
    char msg[900];
    ptl_error_kind kind = PTL_ERR_NONE;
    if (rc != 0) {
        snprintf(msg, sizeof msg, "%s", ptl_error_message());
        kind = ptl_error_kind_get();
    }
    pthread_mutex_lock(&L->mu);
    L->inflight--;
    if (gen == L->gen) {
        if (rc != 0) {
            if (!L->err) {
                L->err = 1;
                L->err_kind = kind;
                snprintf(L->errmsg, sizeof L->errmsg, "data loader worker failed: %s", msg);
            }
        } else if (++s->done == s->n) {
            s->state = SLOT_READY;
            s->fence_pending = 0;
        }
    }
    pthread_cond_broadcast(&L->cv_ready);
    return 1;
}

static void *worker_main(void *arg)
{
    ptl_loader *L = arg;
    scratch_t sc;
    int ok = scratch_init(&sc, L) == 0;
    pthread_mutex_lock(&L->mu);
    if (!ok && !L->err) {
        L->err = 1;
        L->err_kind = PTL_ERR_MEMORY;
        snprintf(L->errmsg, sizeof L->errmsg, "data loader worker failed: %s", ptl_error_message());
        pthread_cond_broadcast(&L->cv_ready);
    }
    while (!L->stop) {
        if (!ok || !run_one_task(L, &sc))
            pthread_cond_wait(&L->cv_work, &L->mu);
    }
    pthread_mutex_unlock(&L->mu);
    if (ok)
        scratch_free(&sc);
    return NULL;
}

static void threads_stop(ptl_loader *L)
{
    if (!L->nthreads)
        return;
    pthread_mutex_lock(&L->mu);
    L->stop = 1;
    pthread_cond_broadcast(&L->cv_work);
    pthread_mutex_unlock(&L->mu);
    for (int t = 0; t < L->nthreads; t++)
        pthread_join(L->threads[t], NULL);
    L->nthreads = 0;
    L->stop = 0;
}

static int threads_start(ptl_loader *L)
{
    int want = L->cfg.workers;
    if (L->nthreads || want <= 0)
        return 0;
    for (int t = 0; t < want; t++) {
        if (pthread_create(&L->threads[t], NULL, worker_main, L) != 0) {
            threads_stop(L);
            return ptl_set_error(PTL_ERR_RUNTIME, "cannot start data loader thread %d of %d", t + 1, want);
        }
        L->nthreads = t + 1;
    }
    return 0;
}

static int cmp_ar(const void *a, const void *b)
{
    const double *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

int ptl_loader_create(ptl_dataset *ds, const ptl_loader_cfg *cfg, ptl_loader **out)
{
    ptl_loader *L = NULL;
    double *ar = NULL;
    *out = NULL;
    if (!ds || ds->n == 0) {
        ptl_set_error(PTL_ERR_VALUE, "the dataset has no usable images");
        goto fail_ds;
    }
    if (cfg->imgsz < 32 || cfg->imgsz % 32 != 0 || cfg->batch < 1 || cfg->workers < 0 || cfg->workers > 256) {
        ptl_set_error(PTL_ERR_VALUE, "loader config: imgsz %d (a positive multiple of 32), batch %d (>= 1), "
                                     "workers %d (0..256)", cfg->imgsz, cfg->batch, cfg->workers);
        goto fail_ds;
    }
    L = calloc(1, sizeof *L);
    if (!L) {
        ptl_set_error(PTL_ERR_MEMORY, "out of memory creating the loader");
        goto fail_ds;
    }
    L->ds = ds;
    L->cfg = *cfg;
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->cv_work, NULL);
    pthread_cond_init(&L->cv_ready, NULL);
    int n = ds->n, B = cfg->batch, S = cfg->imgsz;
    L->nb = (n + B - 1) / B;
    L->cap = (cfg->train ? 4 : 1) * ds->max_labels + 1;
    L->order = malloc(sizeof(int) * n);
    L->bshape = malloc(sizeof(int) * 2 * L->nb);
    L->threads = calloc(cfg->workers ? cfg->workers : 1, sizeof(pthread_t));
    if (!L->order || !L->bshape || !L->threads)
        goto oom;
    for (int i = 0; i < n; i++)
        L->order[i] = i;
    L->max_h = L->max_w = S;
    for (int b = 0; b < L->nb; b++)
        L->bshape[2 * b] = L->bshape[2 * b + 1] = S;
    if (!cfg->train && cfg->rect) {
        /* Rectangular validation batches (§8.1): sort by aspect h/w (stable), shape per batch. */
        ar = malloc(sizeof(double) * 2 * n);
        if (!ar)
            goto oom;
        for (int i = 0; i < n; i++)
            ar[2 * i] = (double)ds->items[i].h0 / ds->items[i].w0, ar[2 * i + 1] = i;
        qsort(ar, n, 2 * sizeof(double), cmp_ar);
        L->max_h = L->max_w = 0;
        for (int b = 0; b < L->nb; b++) {
            int s0 = b * B, e0 = s0 + B < n ? s0 + B : n;
            double mn = ar[2 * s0], mx = ar[2 * (e0 - 1)], sh0 = 1, sh1 = 1;
            if (mx < 1)
                sh0 = mx;
            else if (mn > 1)
                sh1 = 1 / mn;
            int hh = (int)ceil(sh0 * S / 32 + 0.5) * 32, ww = (int)ceil(sh1 * S / 32 + 0.5) * 32;
            L->bshape[2 * b] = hh, L->bshape[2 * b + 1] = ww;
            L->max_h = hh > L->max_h ? hh : L->max_h;
            L->max_w = ww > L->max_w ? ww : L->max_w;
            for (int i = s0; i < e0; i++)
                L->order[i] = (int)ar[2 * i + 1];
        }
    }
    if (cfg->cache) {
        L->cache = calloc(n, sizeof(uint8_t *));
        L->cache_state = calloc(n, sizeof(atomic_int));
        if (!L->cache || !L->cache_state)
            goto oom;
        for (int i = 0; i < n; i++) {
            atomic_init(&L->cache_state[i], 0);
            L->cache_needed += (int64_t)ds->items[i].w * ds->items[i].h * 3;
        }
    }
    atomic_init(&L->cache_filled, 0);
    /* Enough batches in flight to keep every worker busy, plus two ready ahead of the consumer. */
    L->nslots = cfg->prefetch > 0 ? cfg->prefetch : (cfg->workers + B) / B + 2;
    if (L->nslots < 3 && cfg->prefetch <= 0)
        L->nslots = 3;
    L->slots = calloc(L->nslots, sizeof(slot_t));
    if (!L->slots)
        goto oom;
    for (int k = 0; k < L->nslots; k++)
        if (slot_init(&L->slots[k], L) != 0)
            goto fail;
    if (scratch_init(&L->main_scratch, L) != 0)
        goto fail;
    free(ar);
    *out = L;
    return 0;
oom:
    ptl_set_error(PTL_ERR_MEMORY, "out of memory creating the loader");
fail:
    free(ar);
    ptl_loader_destroy(L);
    return -1;
fail_ds:
    ptl_dataset_free(ds);
    return -1;
}

void ptl_loader_destroy(ptl_loader *L)
{
    if (!L)
        return;
    threads_stop(L);
    if (L->slots)
        for (int k = 0; k < L->nslots; k++)
            slot_free(&L->slots[k]);
    free(L->slots);
    if (L->cache)
        for (int i = 0; i < L->ds->n; i++)
            free(L->cache[i]);
    free(L->cache);
    free((void *)L->cache_state);
    scratch_free(&L->main_scratch);
    free(L->order);
    free(L->bshape);
    free(L->threads);
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv_work);
    pthread_cond_destroy(&L->cv_ready);
    ptl_dataset_free(L->ds);
    free(L);
}

int ptl_loader_num_batches(const ptl_loader *L) { return L->nb; }

int ptl_loader_start(ptl_loader *L, int epoch, int mosaic_on)
{
    if (epoch < 0)
        return ptl_set_error(PTL_ERR_VALUE, "epoch must be >= 0, got %d", epoch);
    if (!L->cfg.persistent)
        threads_stop(L);
    pthread_mutex_lock(&L->mu);
    L->gen++;
    L->running = 0;
    while (L->inflight > 0)
        pthread_cond_wait(&L->cv_ready, &L->mu);
    for (int k = 0; k < L->nslots; k++)
        if (L->slots[k].state == SLOT_FILLING || L->slots[k].state == SLOT_READY)
            L->slots[k].state = SLOT_FREE;
    L->err = 0;
    L->epoch = epoch;
    L->mosaic_on = mosaic_on;
    L->assign_next = L->consume_next = 0;
    if (L->cfg.train) {
        int n = L->ds->n;
        ptl_sample_rng g;
        ptl_sample_rng_init(&g, L->cfg.seed, (uint32_t)epoch, 0xFFFFFFFFu, PTL_STREAM_SHUFFLE);
        for (int i = 0; i < n; i++)
            L->order[i] = i;
        for (int i = n - 1; i > 0; i--) {
            int j = (int)ptl_sample_below(&g, (uint32_t)i + 1), t = L->order[i];
            L->order[i] = L->order[j];
            L->order[j] = t;
        }
    }
    L->running = 1;
    pthread_cond_broadcast(&L->cv_work);
    pthread_mutex_unlock(&L->mu);
    return threads_start(L);
}

static void pack(ptl_loader *L, slot_t *s, ptl_batch_view *out)
{
    int nt = 0;
    for (int i = 0; i < s->n; i++)
        for (int j = 0; j < s->counts[i]; j++) {
            float *t = s->targets + 6 * (size_t)nt++;
            const float *b = s->boxes + ((size_t)i * L->cap + j) * 5;
            t[0] = (float)i;
            memcpy(t + 1, b, 5 * sizeof(float));
        }
    out->slot = (int)(s - L->slots);
    out->n = s->n, out->h = s->h, out->w = s->w, out->epoch = L->epoch, out->batch = s->batch;
    out->images = s->images;
    out->n_targets = nt;
    out->targets = s->targets;
    out->indices = s->indices;
    out->meta = s->meta;
}

int ptl_loader_next(ptl_loader *L, int timeout_ms, ptl_batch_view *out)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L)
        until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&L->mu);
    int rc;
    while (1) {
        if (L->err) {
            ptl_set_error(L->err_kind, "%s", L->errmsg);
            rc = -1;
            break;
        }
        if (!L->running) {
            ptl_set_error(PTL_ERR_RUNTIME, "the loader was not started (call start(epoch) first)");
            rc = -1;
            break;
        }
        if (L->consume_next >= L->nb) {
            rc = 1;
            break;
        }
        slot_t *s = NULL;
        int held = 0;
        for (int k = 0; k < L->nslots; k++) {
            held += L->slots[k].state == SLOT_HELD;
            if (L->slots[k].batch == L->consume_next && L->slots[k].state == SLOT_READY)
                s = &L->slots[k];
        }
        if (s) {
            s->state = SLOT_HELD;
            L->consume_next++;
            pack(L, s, out);
            pthread_cond_broadcast(&L->cv_work);
            rc = 0;
            break;
        }
        if (held == L->nslots) {
            ptl_set_error(PTL_ERR_RUNTIME, "all %d batches of the loader's ring are still referenced; release "
                                           "old batches (or raise prefetch) before asking for more", L->nslots);
            rc = -1;
            break;
        }
        if (L->nthreads == 0) {
            if (!run_one_task(L, &L->main_scratch)) {
                ptl_set_error(PTL_ERR_RUNTIME, "loader has no work to do for batch %d", L->consume_next);
                rc = -1;
                break;
            }
            continue;
        }
        if (pthread_cond_timedwait(&L->cv_ready, &L->mu, &until) != 0) {
            rc = 2;
            break;
        }
    }
    int finished = rc == 1 && !L->cfg.persistent;
    pthread_mutex_unlock(&L->mu);
    if (finished)
        threads_stop(L);
    return rc;
}

void ptl_loader_release(ptl_loader *L, int slot)
{
    pthread_mutex_lock(&L->mu);
    if (slot >= 0 && slot < L->nslots && L->slots[slot].state == SLOT_HELD) {
        L->slots[slot].state = SLOT_FREE;
        pthread_cond_broadcast(&L->cv_work);
    }
    pthread_mutex_unlock(&L->mu);
}

int ptl_loader_record_fence(ptl_loader *L, int slot, void *stream)
{
    if (slot < 0 || slot >= L->nslots)
        return ptl_set_error(PTL_ERR_INDEX, "ring slot %d out of range", slot);
    slot_t *s = &L->slots[slot];
    if (ptl_host_fence_record(&s->fence, stream) != 0)
        return -1;
    pthread_mutex_lock(&L->mu);
    s->fence_pending = 1;
    pthread_mutex_unlock(&L->mu);
    return 0;
}

int ptl_loader_sample_shape(const ptl_loader *L, int index, int *h, int *w, int *cap)
{
    if (index < 0 || index >= L->ds->n)
        return ptl_set_error(PTL_ERR_INDEX, "sample index %d out of range [0, %d)", index, L->ds->n);
    *h = *w = L->cfg.imgsz;
    *cap = L->cap;
    if (!L->cfg.train)
        for (int k = 0; k < L->ds->n; k++)
            if (L->order[k] == index) {
                *h = L->bshape[2 * (k / L->cfg.batch)];
                *w = L->bshape[2 * (k / L->cfg.batch) + 1];
            }
    return 0;
}

int ptl_loader_sample(ptl_loader *L, int epoch, int index, int mosaic_on, uint8_t *img, float *targets,
                      int *n_targets, double meta[6])
{
    if (index < 0 || index >= L->ds->n)
        return ptl_set_error(PTL_ERR_INDEX, "sample index %d out of range [0, %d)", index, L->ds->n);
    int H, W, cap;
    scratch_t sc;
    ptl_loader_sample_shape(L, index, &H, &W, &cap);
    if (scratch_init(&sc, L) != 0)
        return -1;
    int rc = build_sample(L, &sc, epoch, index, mosaic_on, H, W, img, targets, n_targets, meta);
    scratch_free(&sc);
    return rc;
}

void ptl_loader_cache_info(const ptl_loader *L, int64_t *needed, int64_t *filled)
{
    *needed = L->cache_needed;
    *filled = atomic_load((atomic_llong *)&L->cache_filled);
}

typedef struct {
    ptl_loader *L;
    atomic_int next;
    atomic_int failed;
    pthread_mutex_t mu;
    char msg[1024];
    ptl_error_kind kind;
} fill_ctx;

static void *fill_worker(void *arg)
{
    fill_ctx *f = arg;
    scratch_t sc;
    memset(&sc, 0, sizeof sc);
    int i;
    while (!atomic_load(&f->failed) && (i = atomic_fetch_add(&f->next, 1)) < f->L->ds->n) {
        const uint8_t *px;
        int w, h;
        int st = atomic_load(&f->L->cache_state[i]);
        if (st == 2)
            continue;
        if ((!sc.resized && scratch_init(&sc, f->L) != 0) || load_image(f->L, sc.resized, i, &px, &w, &h) != 0) {
            pthread_mutex_lock(&f->mu);
            if (!atomic_load(&f->failed)) {
                snprintf(f->msg, sizeof f->msg, "%s", ptl_error_message());
                f->kind = ptl_error_kind_get();
            }
            atomic_store(&f->failed, 1);
            pthread_mutex_unlock(&f->mu);
        }
    }
    scratch_free(&sc);
    return NULL;
}

int ptl_loader_fill_cache(ptl_loader *L)
{
    if (!L->cfg.cache)
        return 0;
    fill_ctx f;
    memset(&f, 0, sizeof f);
    f.L = L;
    atomic_init(&f.next, 0);
    atomic_init(&f.failed, 0);
    pthread_mutex_init(&f.mu, NULL);
    int nt = L->cfg.workers > 0 ? L->cfg.workers : 1, started = 0;
    pthread_t *th = calloc(nt, sizeof(pthread_t));
    if (th)
        for (; started < nt; started++)
            if (pthread_create(&th[started], NULL, fill_worker, &f) != 0)
                break;
    if (started == 0)
        fill_worker(&f);
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    free(th);
    pthread_mutex_destroy(&f.mu);
    if (atomic_load(&f.failed))
        return ptl_set_error(f.kind, "%s", f.msg);
    return 0;
}
