/* An item's image after the load-time resize (§7.2), from wherever it is: the RAM cache, a mapped disk
 * cache file, or the image file decoded now. All three hold the same bytes: the decode (with the pixel limit
 * and, for large JPEGs, DCT scaling) followed by one bilinear resize to the item's load size.
 *
 * A file that fails to decode (corrupt or truncated data, a declared size over max_pixels, a size that
 * changed since the scan) is reported once and never read again: its samples show the next item in dataset
 * order that decodes (wrapping around), with that item's labels. Whether a file decodes does not depend on
 * timing, so the replacement is the same for every worker count, cache mode and run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cpu/threads.h"
#include "loader_impl.h"

int ptl_src_init(ptl_loader *L, const char *const *cache_paths)
{
    int n = L->ds->n;
    atomic_init(&L->cache_filled, 0);
    L->bad = calloc((size_t)n, sizeof(atomic_char));
    if (!L->bad)
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory creating the loader");
    for (int i = 0; i < n; i++)
        atomic_init(&L->bad[i], 0);
    if (L->cfg.cache == PTL_CACHE_NONE)
        return 0;
    L->cache_state = calloc((size_t)n, sizeof(atomic_int));
    if (!L->cache_state)
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory creating the loader");
    for (int i = 0; i < n; i++) {
        atomic_init(&L->cache_state[i], SRC_EMPTY);
        L->cache_needed += (int64_t)L->ds->items[i].w * L->ds->items[i].h * 3;
    }
    if (L->cfg.cache == PTL_CACHE_RAM) {
        L->cache = calloc((size_t)n, sizeof(uint8_t *));
        return L->cache ? 0 : ptl_set_error(PTL_ERR_MEMORY, "out of memory creating the loader");
    }
    if (!cache_paths)
        return ptl_set_error(PTL_ERR_VALUE, "cache='disk' needs a cache file path for every image");
    L->cache_paths = calloc((size_t)n, sizeof(char *));
    if (!L->cache_paths)
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory creating the loader");
    for (int i = 0; i < n; i++)
        if (!(L->cache_paths[i] = strdup(cache_paths[i])))
            return ptl_set_error(PTL_ERR_MEMORY, "out of memory creating the loader");
    return 0;
}

void ptl_src_free(ptl_loader *L)
{
    int n = L->ds ? L->ds->n : 0;
    for (int i = 0; L->cache && i < n; i++)
        free(L->cache[i]);
    for (int i = 0; L->cache_paths && i < n; i++)
        free(L->cache_paths[i]);
    free(L->cache);
    free(L->cache_paths);
    free((void *)L->cache_state);
    free((void *)L->bad);
    ptl_log_free(&L->problems);
    pthread_mutex_destroy(&L->log_mu);
}

void ptl_src_release(scratch_t *sc)
{
    for (int k = 0; k < sc->nmaps; k++)
        ptl_dcache_unmap(sc->maps[k].p, sc->maps[k].n);
    sc->nmaps = 0;
}

static void report(ptl_loader *L, int failed, const char *msg)
{
    pthread_mutex_lock(&L->log_mu);
    L->n_failed += failed;
    /* A message that cannot be stored (out of memory) is lost; the count above stays right. */
    if (ptl_log_add(&L->problems, "%s", msg) != 0)
        ptl_error_clear();
    pthread_mutex_unlock(&L->log_mu);
}

static void mark_bad(ptl_loader *L, int idx, const char *why)
{
    char zero = 0, msg[1200];
    if (!atomic_compare_exchange_strong(&L->bad[idx], &zero, 1))
        return;
    snprintf(msg, sizeof msg, "%s; image replaced by the next image that decodes", why);
    report(L, 1, msg);
}

static ptl_dcache_key key_of(const ptl_loader *L, const ptl_item *it)
{
    ptl_dcache_key k = {it->src_size, it->src_mtime_ns, it->w0, it->h0, it->w, it->h, L->cfg.scale_pixels};
    return k;
}

/* Decodes item idx and resizes it into dst (it->w x it->h). */
static int decode_resized(const ptl_loader *L, int idx, uint8_t *dst)
{
    const ptl_item *it = &L->ds->items[idx];
    ptl_decode_req rq = {L->cfg.max_pixels, L->cfg.scale_pixels, it->w, it->h, it->w0, it->h0};
    ptl_image im = {0, 0, NULL};
    int w0, h0;
    if (ptl_image_decode(it->image, &rq, &im, &w0, &h0) != 0)
        return -1;
    ptl_resize_bilinear(im.data, im.w, im.h, (size_t)im.w * 3, dst, it->w, it->h, (size_t)it->w * 3);
    ptl_image_free(&im);
    return 0;
}

/* Writes the disk cache file of idx from px; a failure is reported once per loader and loading goes on. */
static void disk_store(ptl_loader *L, int idx, const uint8_t *px)
{
    ptl_dcache_key k = key_of(L, &L->ds->items[idx]);
    if (ptl_dcache_write(L->cache_paths[idx], &k, px) == 0) {
        if (atomic_exchange(&L->cache_state[idx], SRC_READY) != SRC_READY)
            atomic_fetch_add(&L->cache_filled, (long long)k.w * k.h * 3);
        return;
    }
    pthread_mutex_lock(&L->log_mu);
    int first = !L->write_failed;
    L->write_failed = 1;
    pthread_mutex_unlock(&L->log_mu);
    if (first) {
        char msg[1200];
        snprintf(msg, sizeof msg, "%s; images without a cache file are decoded instead", ptl_error_message());
        report(L, 0, msg);
    }
    ptl_error_clear();
}

/* One item, no replacement: 0, or -1 with the decode's error. */
static int load_one(ptl_loader *L, scratch_t *sc, uint8_t *buf, int idx, const uint8_t **px)
{
    const ptl_item *it = &L->ds->items[idx];
    if (L->cfg.cache == PTL_CACHE_RAM) {
        int st = atomic_load_explicit(&L->cache_state[idx], memory_order_acquire), want = SRC_EMPTY;
        if (st == SRC_READY) {
            *px = L->cache[idx];
            return 0;
        }
        /* One thread claims the item and decodes into the cache; others meanwhile decode into buf. */
        if (st == SRC_EMPTY && atomic_compare_exchange_strong(&L->cache_state[idx], &want, SRC_FILLING)) {
            uint8_t *owned = malloc((size_t)it->w * it->h * 3);
            if (!owned || decode_resized(L, idx, owned) != 0) {
                if (!owned)
                    ptl_set_error(PTL_ERR_MEMORY, "out of memory caching %s", it->image);
                free(owned);
                atomic_store_explicit(&L->cache_state[idx], SRC_EMPTY, memory_order_release);
                return -1;
            }
            L->cache[idx] = owned;
            atomic_fetch_add(&L->cache_filled, (long long)it->w * it->h * 3);
            atomic_store_explicit(&L->cache_state[idx], SRC_READY, memory_order_release);
            *px = owned;
            return 0;
        }
    } else if (L->cfg.cache == PTL_CACHE_DISK && sc && sc->nmaps < PTL_SAMPLE_MAPS &&
               atomic_load(&L->cache_state[idx]) == SRC_READY) {
        ptl_dcache_key k = key_of(L, it);
        void *map;
        size_t len;
        if (ptl_dcache_map(L->cache_paths[idx], &k, px, &map, &len) == 0) {
            sc->maps[sc->nmaps].p = map;
            sc->maps[sc->nmaps].n = len;
            sc->nmaps++;
            return 0;
        }
    }
    if (decode_resized(L, idx, buf) != 0)
        return -1;
    if (L->cfg.cache == PTL_CACHE_DISK)
        disk_store(L, idx, buf);
    *px = buf;
    return 0;
}

int ptl_src_load(ptl_loader *L, scratch_t *sc, uint8_t *buf, int idx, const uint8_t **px, int *used)
{
    int n = L->ds->n;
    for (int k = 0; k < n; k++) {
        int j = (idx + k) % n;
        if (atomic_load(&L->bad[j]))
            continue;
        if (load_one(L, sc, buf, j, px) == 0) {
            *used = j;
            return 0;
        }
        if (ptl_error_kind_get() != PTL_ERR_OS)
            return -1; /* out of memory: not the file's fault */
        mark_bad(L, j, ptl_error_message());
    }
    return ptl_set_error(PTL_ERR_OS, "none of the %d images of the dataset decodes (see the warnings)", n);
}

/* ---- filling the cache up front ---- */

typedef struct {
    ptl_loader *L;
    const atomic_int *cancel;
    atomic_int next, failed;
    pthread_mutex_t mu;
    char msg[1024];
    ptl_error_kind kind;
} fill_ctx;

static void fill_fail(fill_ctx *f, ptl_error_kind kind, const char *msg)
{
    pthread_mutex_lock(&f->mu);
    if (!atomic_load(&f->failed)) {
        snprintf(f->msg, sizeof f->msg, "%s", msg);
        f->kind = kind;
    }
    atomic_store(&f->failed, 1);
    pthread_mutex_unlock(&f->mu);
}

/* Disk: a valid file is kept; a missing, stale or torn one is written again. */
static int fill_disk(ptl_loader *L, uint8_t *buf, int i)
{
    ptl_dcache_key k = key_of(L, &L->ds->items[i]);
    if (ptl_dcache_valid(L->cache_paths[i], &k)) {
        if (atomic_exchange(&L->cache_state[i], SRC_READY) != SRC_READY)
            atomic_fetch_add(&L->cache_filled, (long long)k.w * k.h * 3);
        return 0;
    }
    if (decode_resized(L, i, buf) != 0)
        return -1;
    disk_store(L, i, buf);
    return 0;
}

static void *fill_worker(void *arg)
{
    fill_ctx *f = arg;
    ptl_loader *L = f->L;
    uint8_t *buf = NULL;
    int i;
    while (!atomic_load(&f->failed) && (i = atomic_fetch_add(&f->next, 1)) < L->ds->n) {
        if (f->cancel && atomic_load(f->cancel)) {
            fill_fail(f, PTL_ERR_RUNTIME, "filling the cache was interrupted");
            break;
        }
        if (atomic_load(&L->bad[i]) || atomic_load(&L->cache_state[i]) == SRC_READY)
            continue;
        if (!buf && !(buf = malloc((size_t)L->cfg.imgsz_h * L->cfg.imgsz_w * 3))) {
            fill_fail(f, PTL_ERR_MEMORY, "out of memory filling the cache");
            break;
        }
        const uint8_t *px;
        int rc = L->cfg.cache == PTL_CACHE_RAM ? load_one(L, NULL, buf, i, &px) : fill_disk(L, buf, i);
        if (rc == 0)
            continue;
        if (ptl_error_kind_get() == PTL_ERR_OS)
            mark_bad(L, i, ptl_error_message());
        else
            fill_fail(f, ptl_error_kind_get(), ptl_error_message());
    }
    free(buf);
    return NULL;
}

int ptl_src_fill(ptl_loader *L, const atomic_int *cancel)
{
    if (L->cfg.cache == PTL_CACHE_NONE)
        return 0;
    fill_ctx f;
    memset(&f, 0, sizeof f);
    f.L = L;
    f.cancel = cancel;
    atomic_init(&f.next, 0);
    atomic_init(&f.failed, 0);
    pthread_mutex_init(&f.mu, NULL);
    /* a one-off before the first epoch: every CPU the process may use decodes (each image by one thread, so
     * the bytes do not depend on how many) */
    const int cpus = ptl_cpu_threads();
    int nt = L->cfg.workers > cpus ? L->cfg.workers : cpus, started = 0;
    nt = nt < L->ds->n ? nt : L->ds->n > 0 ? L->ds->n : 1;
    pthread_t *th = calloc((size_t)nt, sizeof(pthread_t));
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
