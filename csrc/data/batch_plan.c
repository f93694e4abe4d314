/* The order of the images and the shape of each batch. Square batches of imgsz_h x imgsz_w by default;
 * rectangular ones (validation §8.1; training with rect, as Ultralytics' set_rectangle): images sorted by
 * aspect ratio h / w (stable), each batch letterboxed to ceil(shape * S / 32 + pad) * 32 with shape
 * [max_ar, 1] for an all-landscape batch, [1, 1 / min_ar] for an all-portrait one, else [1, 1], S the
 * long side of imgsz, pad 0.5 for validation and 0 for training. The shapes never change after creation.
 * Training batches are reshuffled every epoch unless rect gives batches of differing shapes: then the sorted
 * order is kept (Ultralytics turns shuffle off for rect).
 *
 * Data parallelism (PTL_SHARD_* in dataset.h): the order and the shapes are those of one process whose batch
 * is the global batch, and every rank computes them alike from (seed, epoch); a rank then takes its share.
 * Neither padding nor dropping: the union of the ranks' batches is the single-process epoch, each image
 * once. (PyTorch's DistributedSampler pads the epoch with repeated images or drops its tail to give every
 * rank as many images; here a rank's slice of the last global batch may be smaller, even empty, instead.) */
#include <math.h>
#include <stdlib.h>

#include "loader_impl.h"
#include "sample_rng.h"

static int cmp_ar(const void *a, const void *b)
{
    const double *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

static int rect_shapes(ptl_loader *L)
{
    int n = L->ds->n, B = L->global_batch;
    int S = L->cfg.imgsz_h > L->cfg.imgsz_w ? L->cfg.imgsz_h : L->cfg.imgsz_w;
    double pad = L->cfg.train ? 0.0 : 0.5;
    double *ar = malloc(sizeof(double) * 2 * (size_t)n);
    if (!ar)
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory sorting %d images by aspect ratio", n);
    for (int i = 0; i < n; i++)
        ar[2 * i] = (double)L->ds->items[i].h0 / L->ds->items[i].w0, ar[2 * i + 1] = i;
    qsort(ar, (size_t)n, 2 * sizeof(double), cmp_ar);
    L->max_h = L->max_w = 0;
    int differ = 0;
    for (int b = 0; b < L->nb_global; b++) {
        int s0 = b * B, e0 = s0 + B < n ? s0 + B : n;
        double mn = ar[2 * s0], mx = ar[2 * (e0 - 1)], sh0 = 1, sh1 = 1;
        if (mx < 1)
            sh0 = mx;
        else if (mn > 1)
            sh1 = 1 / mn;
        int hh = (int)ceil(sh0 * S / 32 + pad) * 32, ww = (int)ceil(sh1 * S / 32 + pad) * 32;
        L->bshape[2 * b] = hh, L->bshape[2 * b + 1] = ww;
        differ |= hh != L->bshape[0] || ww != L->bshape[1];
        L->max_h = hh > L->max_h ? hh : L->max_h;
        L->max_w = ww > L->max_w ? ww : L->max_w;
        for (int i = s0; i < e0; i++)
            L->order[i] = (int)ar[2 * i + 1];
    }
    L->rect_order = L->cfg.train && differ;
    free(ar);
    return 0;
}

int ptl_plan_init(ptl_loader *L)
{
    int n = L->ds->n, world = L->cfg.world, rank = L->cfg.rank;
    L->global_batch = L->cfg.shard == PTL_SHARD_SPLIT ? L->cfg.batch * world : L->cfg.batch;
    L->nb_global = (n + L->global_batch - 1) / L->global_batch;
    L->nb = L->cfg.shard == PTL_SHARD_SPLIT ? L->nb_global : (L->nb_global - rank + world - 1) / world;
    L->order = malloc(sizeof(int) * (size_t)n);
    L->bshape = malloc(sizeof(int) * 2 * (size_t)L->nb_global);
    if (!L->order || !L->bshape)
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory planning %d batches", L->nb_global);
    for (int i = 0; i < n; i++)
        L->order[i] = i;
    L->max_h = L->cfg.imgsz_h, L->max_w = L->cfg.imgsz_w;
    for (int b = 0; b < L->nb_global; b++)
        L->bshape[2 * b] = L->cfg.imgsz_h, L->bshape[2 * b + 1] = L->cfg.imgsz_w;
    return L->cfg.rect ? rect_shapes(L) : 0;
}

void ptl_plan_epoch(const ptl_loader *L, int epoch, int *order)
{
    int n = L->ds->n;
    if (!L->cfg.train || L->rect_order) {
        if (order != L->order)
            for (int i = 0; i < n; i++)
                order[i] = L->order[i];
        return;
    }
    ptl_sample_rng g;
    ptl_sample_rng_init(&g, L->cfg.seed, (uint32_t)epoch, 0xFFFFFFFFu, PTL_STREAM_SHUFFLE);
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)ptl_sample_below(&g, (uint32_t)i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

void ptl_plan_slice(const ptl_loader *L, int b, int *global_batch, int *start, int *count)
{
    int n = L->ds->n, B = L->cfg.batch, world = L->cfg.world, rank = L->cfg.rank;
    if (L->cfg.shard == PTL_SHARD_DEAL) {
        int gb = rank + b * world, s0 = gb * B;
        *global_batch = gb, *start = s0, *count = n - s0 < B ? n - s0 : B;
        return;
    }
    int s0 = b * L->global_batch, in_batch = n - s0 < L->global_batch ? n - s0 : L->global_batch;
    *global_batch = b;
    if (in_batch == L->global_batch) {
        *start = s0 + rank * B, *count = B;
    } else { /* the last global batch: sizes differ by at most one, the first ranks take the extra images */
        int q = in_batch / world, m = in_batch % world;
        *start = s0 + rank * q + (rank < m ? rank : m);
        *count = q + (rank < m);
    }
}

void ptl_plan_free(ptl_loader *L)
{
    free(L->order);
    free(L->bshape);
    L->order = L->bshape = NULL;
}
