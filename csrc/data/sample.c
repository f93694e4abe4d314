/* One sample's pipeline (§7.3-7.9, §8.1): a pure function of (seed, epoch, dataset index, mosaic on/off)
 * and the config. Every draw comes from the sample's own Philox stream in a fixed order, and mosaic
 * partners are drawn uniformly from the dataset (not from a timing-dependent buffer).
 *   training:   mosaic of 4 tiles on a 2W x 2H canvas then the affine warp to W x H, or (no mosaic, and
 *               always with rect) the letterbox to the batch shape then the affine warp; then HSV and flips;
 *   validation: the letterbox to the batch shape without scale-up.
 * W x H is imgsz_w x imgsz_h, or the batch's shape for rect. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loader_impl.h"
#include "sample_rng.h"

static inline int imax(int a, int b) { return a > b ? a : b; }
static inline int imin(int a, int b) { return a < b ? a : b; }

void ptl_scratch_free(scratch_t *s)
{
    ptl_src_release(s);
    free(s->resized);
    free(s->canvas);
    free(s->boxes.b);
    free(s->post);
    free(s->rows);
    memset(s, 0, sizeof *s);
}

int ptl_scratch_init(scratch_t *s, const ptl_loader *L)
{
    size_t S = (size_t)L->cfg.imgsz_h * L->cfg.imgsz_w * 3, B = (size_t)L->max_h * L->max_w * 3;
    memset(s, 0, sizeof *s);
    s->resized = malloc(S);
    s->canvas = malloc(4 * S > B ? 4 * S : B);
    s->boxes.cap = L->cap;
    s->boxes.b = malloc(sizeof(float) * 5 * (size_t)L->cap);
    s->post = malloc(sizeof(ptl_post));
    s->rows = malloc(2 * 2 * (size_t)L->cfg.imgsz_w * 3);
    if (!s->resized || !s->canvas || !s->boxes.b || !s->post || !s->rows) {
        ptl_scratch_free(s);
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory for loader scratch buffers (imgsz %dx%d)",
                             L->cfg.imgsz_h, L->cfg.imgsz_w);
    }
    return 0;
}

/* Labels of item it as pixel xyxy boxes of a (w, h) image shifted by (ox, oy), appended to bx. */
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

/* The four tiles of §7.4 around (xc, yc) on the 2W x 2H canvas: boxes into bx (clipped to the canvas),
 * the tiles' rows into mr; with !tiles the canvas is also filled where the warp M reads it. */
static int mosaic(ptl_loader *L, scratch_t *s, int idx, const uint32_t partner[3], int xc, int yc, int W, int H,
                  int tiles, const double M[9], mosaic_rows *mr, int64_t *source)
{
    ptl_boxes *bx = &s->boxes;
    int W2 = 2 * W, H2 = 2 * H, rr[4] = {0, 0, 0, 0};
    size_t quarter = (size_t)W * H * 3;
    mr->yc = yc, mr->tag[0] = mr->tag[1] = -1, mr->buf[0] = s->rows, mr->buf[1] = s->rows + (size_t)W2 * 3;
    /* Otherwise the canvas is built where the warp reads it (rr): tiles copied there, the rest filled. */
    if (!tiles)
        ptl_warp_source_rect(M, W2, H2, W, H, rr);
    for (int k = 0; k < 4; k++) {
        const uint8_t *px;
        int id = k == 0 ? idx : (int)partner[k - 1], used;
        const int *a = mr->a[k], *b = mr->b[k];
        /* Tiles read together are decoded (when not cached) into quarters of the unused canvas. */
        if (ptl_src_load(L, s, tiles ? s->canvas + k * quarter : s->resized, id, &px, &used) != 0)
            return -1;
        if (k == 0)
            *source = used;
        const ptl_item *it = &L->ds->items[used];
        ptl_mosaic_rects(k, it->w, it->h, xc, yc, W, H, mr->a[k], mr->b[k]);
        mr->px[k] = px, mr->w[k] = it->w;
        int x0 = imax(a[0], rr[0]), x1 = imin(a[2], rr[2]), y0 = imax(a[1], rr[1]), y1 = imin(a[3], rr[3]);
        for (int y = y0; x1 > x0 && y < y1; y++)
            memcpy(s->canvas + ((size_t)y * W2 + x0) * 3,
                   px + ((size_t)(b[1] + y - a[1]) * it->w + b[0] + x0 - a[0]) * 3, (size_t)(x1 - x0) * 3);
        add_boxes(bx, it, it->w, it->h, a[0] - b[0], a[1] - b[1]);
    }
    for (int y = rr[1]; y < rr[3]; y++) {
        /* Row y holds a left tile (0 or 2) ending at xc and a right one (1 or 3) starting there. */
        const int *l = y < yc ? mr->a[0] : mr->a[2], *r = y < yc ? mr->a[1] : mr->a[3];
        int hl = y >= l[1] && y < l[3], hr = y >= r[1] && y < r[3];
        uint8_t *row = s->canvas + (size_t)y * W2 * 3;
        fill_span(row, rr[0], rr[2], rr[0], hl ? l[0] : hr ? xc : rr[2]);
        fill_span(row, rr[0], rr[2], hr ? r[2] : hl ? xc : rr[2], rr[2]);
    }
    int k = 0;
    for (int i = 0; i < bx->n; i++) {
        float *bb = bx->b + 5 * i;
        for (int j = 1; j < 5; j += 2) {
            bb[j] = fminf(fmaxf(bb[j], 0.f), (float)W2);
            bb[j + 1] = fminf(fmaxf(bb[j + 1], 0.f), (float)H2);
        }
        if (bb[3] > bb[1] && bb[4] > bb[2])
            memmove(bx->b + 5 * k++, bb, 5 * sizeof(float));
    }
    bx->n = k;
    return 0;
}

/* The training sample of idx into img (W x H). */
static int train_sample(ptl_loader *L, scratch_t *s, int epoch, int idx, int mosaic_on, int H, int W, uint8_t *img,
                        double meta[6], int64_t *source)
{
    const ptl_loader_cfg *c = &L->cfg;
    ptl_boxes *bx = &s->boxes;
    ptl_sample_rng g;
    double u_mos, u_xc, u_yc, u_aff[8], u_hsv[3], u_ud, u_lr, M[9], sigma;
    uint32_t partner[3];
    int win, hin, tiles = 0; /* tiles: the warp reads the mosaic tiles row by row */
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
    if (!c->rect && mosaic_on && u_mos < c->mosaic) {
        int xc = (int)(W / 2.0 + u_xc * W), yc = (int)(H / 2.0 + u_yc * H);
        win = 2 * W, hin = 2 * H;
        ptl_affine_matrix(&ac, win, hin, W, H, u_aff, M, &sigma);
        tiles = ptl_warp_is_separable(M);
        if (mosaic(L, s, idx, partner, xc, yc, W, H, tiles, M, &mr, source) != 0)
            return -1;
    } else {
        const uint8_t *px;
        int used;
        ptl_letterbox_params p;
        if (ptl_src_load(L, s, s->resized, idx, &px, &used) != 0)
            return -1;
        *source = used;
        const ptl_item *it = &L->ds->items[used];
        ptl_letterbox_params_get(it->w, it->h, W, H, 1, &p);
        ptl_letterbox(px, it->w, it->h, s->canvas, W, H, &p);
        add_boxes(bx, it, it->w * p.r, it->h * p.r, p.left, p.top);
        win = W, hin = H;
        ptl_affine_matrix(&ac, win, hin, W, H, u_aff, M, &sigma);
    }
    const ptl_item *it = &L->ds->items[*source];
    meta[0] = it->h0, meta[1] = it->w0;
    meta[2] = (double)it->h / it->h0, meta[3] = (double)it->w / it->w0;
    int identity = win == W && hin == H && M[0] == 1 && M[1] == 0 && M[2] == 0 && M[3] == 0 && M[4] == 1 &&
                   M[5] == 0 && M[6] == 0 && M[7] == 0;
    int hsv = c->hsv_h != 0 || c->hsv_s != 0 || c->hsv_v != 0;
    double r[3] = {(2 * u_hsv[0] - 1) * c->hsv_h, (2 * u_hsv[1] - 1) * c->hsv_s, (2 * u_hsv[2] - 1) * c->hsv_v};
    ptl_post *post = s->post;
    ptl_post_init(post, hsv ? r : NULL, u_lr < c->fliplr, u_ud < c->flipud);
    if (identity)
        ptl_copy_post(s->canvas, W, H, img, post);
    else if (tiles ? ptl_warp_rows(mosaic_row, &mr, win, hin, img, W, H, M, post)
                   : ptl_warp_post(s->canvas, win, hin, img, W, H, M, post))
        return -1;
    ptl_boxes_affine(bx, M, sigma, W, H, 0.10f);
    if (post->flip_ud)
        ptl_boxes_flip(bx, W, H, 0);
    if (post->flip_lr)
        ptl_boxes_flip(bx, W, H, 1);
    return 0;
}

int ptl_build_sample(ptl_loader *L, scratch_t *s, int epoch, int idx, int mosaic_on, int H, int W, uint8_t *img,
                     float *tg, int *ntg, double meta[6], int64_t *source)
{
    ptl_boxes *bx = &s->boxes;
    int rc;
    bx->n = 0;
    meta[4] = meta[5] = 0;
    if (L->cfg.train) {
        rc = train_sample(L, s, epoch, idx, mosaic_on, H, W, img, meta, source);
    } else {
        const uint8_t *px;
        int used;
        ptl_letterbox_params p;
        rc = ptl_src_load(L, s, s->resized, idx, &px, &used);
        if (rc == 0) {
            const ptl_item *it = &L->ds->items[used];
            *source = used;
            ptl_letterbox_params_get(it->w, it->h, W, H, 0, &p);
            ptl_letterbox(px, it->w, it->h, img, W, H, &p);
            add_boxes(bx, it, it->w * p.r, it->h * p.r, p.left, p.top);
            meta[0] = it->h0, meta[1] = it->w0;
            meta[2] = (double)it->h / it->h0 * p.r, meta[3] = (double)it->w / it->w0 * p.r;
            meta[4] = p.left, meta[5] = p.top;
        }
    }
    ptl_src_release(s);
    if (rc != 0)
        return -1;
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
