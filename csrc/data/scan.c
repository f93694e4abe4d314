/* The dataset scan: every image probed (format, size, completeness, the pixel limit) and its labels read and
 * checked, with worker threads; bad items are dropped with one message each, files whose decoder is not
 * built are counted per format, and the label counts (with boxes, empty, missing) are summed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../file_info.h"
#include "dataset.h"

enum { ST_OK = 0, ST_SKIPPED, ST_ERROR, ST_UNSUPPORTED };

typedef struct {
    const char *const *images;
    const ptl_label_src *labels;
    const ptl_scan_cfg *cfg;
    const atomic_int *cancel;
    int n;
    atomic_int next;
    ptl_item *items;
    ptl_log *logs;   /* one per item */
    char *status;    /* ST_* */
    char *format;    /* per item, for ST_UNSUPPORTED */
    char *found;     /* the label file exists (or rows were given) */
    int *dups;
    pthread_mutex_t err_mu;
    char err[512];
    ptl_error_kind err_kind;
} scan_ctx;

static void scan_fail(scan_ctx *c, int i, ptl_error_kind kind, const char *msg)
{
    c->status[i] = ST_ERROR;
    pthread_mutex_lock(&c->err_mu);
    if (!c->err[0]) {
        snprintf(c->err, sizeof c->err, "%s", msg);
        c->err_kind = kind;
    }
    pthread_mutex_unlock(&c->err_mu);
}

static void scan_one(scan_ctx *c, int i)
{
    ptl_item *it = &c->items[i];
    const ptl_label_src *ls = &c->labels[i];
    char why[256];
    int fmt = PTL_FMT_UNKNOWN, found = 1;
    it->index = i;
    it->image = strdup(c->images[i]);
    it->label = strdup(ls->path ? ls->path : ls->name ? ls->name : "");
    if (!it->image || !it->label) {
        scan_fail(c, i, PTL_ERR_MEMORY, "out of memory scanning the dataset");
        return;
    }
    int pr = ptl_image_probe(it->image, c->cfg->max_pixels, &it->w0, &it->h0, &fmt, why, sizeof why);
    if (pr == -2) {
        c->status[i] = ST_UNSUPPORTED;
        c->format[i] = (char)fmt;
        return;
    }
    if (pr != 0) {
        c->status[i] = ptl_log_add(&c->logs[i], "%s: %s; image skipped", it->image, why) ? ST_ERROR : ST_SKIPPED;
        return;
    }
    ptl_file_info st;
    if (ptl_file_info_get(-1, it->image, &st) == 0) {
        it->src_size = (int64_t)st.size;
        it->src_mtime_ns = st.mtime_ns;
    }
    ptl_load_size(it->w0, it->h0, c->cfg->load_w, c->cfg->load_h, &it->w, &it->h);
    int r = ls->path ? ptl_labels_read(ls->path, &c->cfg->rules, &it->labels, &it->n, &found, &c->logs[i], &c->dups[i])
                     : ptl_labels_rows(it->label, ls->rows, ls->nrows, &c->cfg->rules, &it->labels, &it->n,
                                       &c->logs[i], &c->dups[i]);
    c->found[i] = (char)found;
    if (r < 0)
        scan_fail(c, i, ptl_error_kind_get(), ptl_error_message());
    else if (r > 0)
        c->status[i] = ST_SKIPPED;
}

static void *scan_worker(void *arg)
{
    scan_ctx *c = arg;
    int i;
    while ((i = atomic_fetch_add(&c->next, 1)) < c->n) {
        if (c->cancel && atomic_load(c->cancel)) {
            scan_fail(c, i, PTL_ERR_RUNTIME, "the dataset scan was interrupted");
            continue;
        }
        scan_one(c, i);
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

/* The library a format needs, for the message about files skipped without it. */
static const char *format_library(int f)
{
    return f == PTL_FMT_WEBP ? "libwebp (apt-get install libwebp-dev)"
                             : f == PTL_FMT_TIFF ? "libtiff >= 4.5 (apt-get install libtiff-dev)" : "its library";
}

/* The per-item results, in file order, into ds. */
static int collect(scan_ctx *c, ptl_dataset *ds)
{
    for (int i = 0; i < c->n; i++) {
        for (int k = 0; k < c->logs[i].n; k++)
            if (ptl_log_add(&ds->log, "%s", c->logs[i].msg[k]) != 0)
                return -1;
        ds->n_duplicates += c->dups[i];
        if (c->status[i] == ST_OK) {
            ptl_item *it = &c->items[i];
            ds->n_missing_labels += !c->found[i];
            ds->n_labeled += it->n > 0;
            ds->n_empty += c->found[i] && it->n == 0;
            ds->n_boxes += it->n;
            if (it->n > ds->max_labels)
                ds->max_labels = it->n;
            ds->items[ds->n++] = *it;
            memset(it, 0, sizeof(ptl_item));
        } else {
            ds->n_skipped++;
            if (c->status[i] == ST_UNSUPPORTED)
                ds->n_unsupported[(int)c->format[i]]++;
        }
    }
    for (int f = 0; f < PTL_FMT_COUNT; f++)
        if (ds->n_unsupported[f] &&
            ptl_log_add(&ds->log, "%d %s images skipped: ptl was built without %s decoding; install %s and rebuild ptl",
                        ds->n_unsupported[f], ptl_image_format_name(f), ptl_image_format_name(f),
                        format_library(f)) != 0)
            return -1;
    return 0;
}

int ptl_dataset_scan(const char *const *images, const ptl_label_src *labels, int n, const ptl_scan_cfg *cfg,
                     const atomic_int *cancel, ptl_dataset **out)
{
    scan_ctx c;
    pthread_t *th = NULL;
    int started = 0, threads = cfg->threads;
    ptl_dataset *ds = NULL;
    memset(&c, 0, sizeof c);
    *out = NULL;
    if (n < 0 || cfg->rules.nc <= 0 || cfg->load_w < 32 || cfg->load_h < 32 || cfg->max_pixels <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "dataset scan: bad n=%d, nc=%d, load size %dx%d or max_pixels %lld", n,
                             cfg->rules.nc, cfg->load_w, cfg->load_h, (long long)cfg->max_pixels);
    c.images = images, c.labels = labels, c.cfg = cfg, c.cancel = cancel, c.n = n;
    atomic_init(&c.next, 0);
    pthread_mutex_init(&c.err_mu, NULL);
    size_t m = n ? (size_t)n : 1;
    c.items = calloc(m, sizeof(ptl_item));
    c.logs = calloc(m, sizeof(ptl_log));
    c.status = calloc(m, 1);
    c.format = calloc(m, 1);
    c.found = calloc(m, 1);
    c.dups = calloc(m, sizeof(int));
    ds = calloc(1, sizeof *ds);
    if (threads < 1)
        threads = 1;
    if (threads > n)
        threads = n > 0 ? n : 1;
    th = calloc((size_t)threads, sizeof(pthread_t));
    if (ds)
        ds->items = calloc(m, sizeof(ptl_item));
    if (!c.items || !c.logs || !c.status || !c.format || !c.found || !c.dups || !ds || !ds->items || !th) {
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
    if (collect(&c, ds) != 0)
        goto fail;
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
    free(c.format);
    free(c.found);
    free(c.dups);
    free(th);
    pthread_mutex_destroy(&c.err_mu);
    ptl_dataset_free(ds);
    return *out ? 0 : -1;
}
