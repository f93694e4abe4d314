/* The loader's ring of batch slots and its worker threads: a slot is filled one sample at a time by any
 * worker (each sample is independent, see sample.c), handed to the consumer in batch order, and reused once
 * released (and, on CUDA, once the upload from it finished). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader_impl.h"

static void slot_free(slot_t *s)
{
    ptl_host_fence_destroy(s->fence);
    ptl_host_free(s->images, s->is_pinned);
    free(s->boxes);
    free(s->counts);
    free(s->targets);
    free(s->indices);
    free(s->sources);
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
    s->sources = malloc(sizeof(int64_t) * B);
    s->meta = malloc(sizeof(double) * B * 6);
    if (!s->boxes || !s->counts || !s->targets || !s->indices || !s->sources || !s->meta) {
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
                    ptl_plan_slice(L, b, &f->global_batch, &f->start, &f->n);
                    f->state = f->n ? SLOT_FILLING : SLOT_READY; /* an empty slice of the last global batch */
                    f->batch = b;
                    f->h = L->bshape[2 * f->global_batch];
                    f->w = L->bshape[2 * f->global_batch + 1];
                    f->next_sample = f->done = 0;
                    pthread_cond_broadcast(&L->cv_work);
                    if (!f->n) { /* nothing to build: it is ready, and that was this call's work */
                        pthread_cond_broadcast(&L->cv_ready);
                        return 1;
                    }
                    break;
                }
        }
    }
    if (!s)
        return 0;
    int i = s->next_sample++, gen = L->gen, epoch = L->epoch, mos = L->mosaic_on;
    int idx = L->order[s->start + i];
    size_t img_bytes = (size_t)s->h * s->w * 3;
    L->inflight++;
    int wait_fence = s->fence_pending;
    pthread_mutex_unlock(&L->mu);
    if (wait_fence)
        ptl_host_fence_wait(s->fence);
    s->indices[i] = idx;
    int rc = ptl_build_sample(L, sc, epoch, idx, mos, s->h, s->w, s->images + i * img_bytes,
                              s->boxes + (size_t)i * L->cap * 5, &s->counts[i], s->meta + 6 * i, &s->sources[i]);
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
    int ok = ptl_scratch_init(&sc, L) == 0;
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
        ptl_scratch_free(&sc);
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

int ptl_loader_create(ptl_dataset *ds, const ptl_loader_cfg *cfg, const char *const *cache_paths, ptl_loader **out)
{
    ptl_loader *L = NULL;
    *out = NULL;
    if (!ds || ds->n == 0) {
        ptl_set_error(PTL_ERR_VALUE, "the dataset has no usable images");
        goto fail_ds;
    }
    if (cfg->imgsz_h < 32 || cfg->imgsz_h % 32 != 0 || cfg->imgsz_w < 32 || cfg->imgsz_w % 32 != 0 || cfg->batch < 1 ||
        cfg->workers < 0 || cfg->workers > 256 || cfg->cache < PTL_CACHE_NONE || cfg->cache > PTL_CACHE_DISK ||
        cfg->max_pixels <= 0 || cfg->scale_pixels < 0) {
        ptl_set_error(PTL_ERR_VALUE, "loader config: imgsz %dx%d (positive multiples of 32), batch %d (>= 1), "
                                     "workers %d (0..256), cache %d, max_pixels %lld (> 0), scale_pixels %lld (>= 0)",
                      cfg->imgsz_h, cfg->imgsz_w, cfg->batch, cfg->workers, cfg->cache, (long long)cfg->max_pixels,
                      (long long)cfg->scale_pixels);
        goto fail_ds;
    }
    if (cfg->world < 1 || cfg->rank < 0 || cfg->rank >= cfg->world || (int64_t)cfg->batch * cfg->world > 1 << 30 ||
        (cfg->shard != PTL_SHARD_SPLIT && cfg->shard != PTL_SHARD_DEAL)) {
        ptl_set_error(PTL_ERR_VALUE, "loader config: rank %d of world %d (0 <= rank < world), shard %d, batch %d",
                      cfg->rank, cfg->world, cfg->shard, cfg->batch);
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
    pthread_mutex_init(&L->log_mu, NULL);
    int B = cfg->batch;
    L->cap = (cfg->train ? 4 : 1) * ds->max_labels + 1;
    L->threads = calloc(cfg->workers ? (size_t)cfg->workers : 1, sizeof(pthread_t));
    if (!L->threads) {
        ptl_set_error(PTL_ERR_MEMORY, "out of memory creating the loader");
        goto fail;
    }
    if (ptl_src_init(L, cache_paths) != 0 || ptl_plan_init(L) != 0)
        goto fail;
    /* Enough batches in flight to keep every worker busy, plus two ready ahead of the consumer. */
    L->nslots = cfg->prefetch > 0 ? cfg->prefetch : (cfg->workers + B) / B + 2;
    if (L->nslots < 3 && cfg->prefetch <= 0)
        L->nslots = 3;
    L->slots = calloc((size_t)L->nslots, sizeof(slot_t));
    if (!L->slots) {
        ptl_set_error(PTL_ERR_MEMORY, "out of memory creating the loader");
        goto fail;
    }
    for (int k = 0; k < L->nslots; k++)
        if (slot_init(&L->slots[k], L) != 0)
            goto fail;
    if (ptl_scratch_init(&L->main_scratch, L) != 0)
        goto fail;
    *out = L;
    return 0;
fail:
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
    ptl_src_free(L);
    ptl_scratch_free(&L->main_scratch);
    ptl_plan_free(L);
    free(L->threads);
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv_work);
    pthread_cond_destroy(&L->cv_ready);
    ptl_dataset_free(L->ds);
    free(L);
}

int ptl_loader_num_batches(const ptl_loader *L) { return L->nb; }

int ptl_loader_num_global_batches(const ptl_loader *L) { return L->nb_global; }

void ptl_loader_batch_slice(const ptl_loader *L, int b, int *global_batch, int *start, int *count)
{
    ptl_plan_slice(L, b, global_batch, start, count);
}

int ptl_loader_batch_indices(ptl_loader *L, int epoch, int b, int64_t *out, int cap, int *count)
{
    if (epoch < 0 || b < 0 || b >= L->nb)
        return ptl_set_error(PTL_ERR_INDEX, "epoch %d, batch %d: expected epoch >= 0 and batch in [0, %d)", epoch, b,
                             L->nb);
    int gb, start, n;
    ptl_plan_slice(L, b, &gb, &start, &n);
    if (n > cap)
        return ptl_set_error(PTL_ERR_VALUE, "batch %d has %d images, room for %d", b, n, cap);
    int *order = malloc(sizeof(int) * (size_t)L->ds->n);
    if (!order)
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory planning epoch %d", epoch);
    ptl_plan_epoch(L, epoch, order);
    for (int i = 0; i < n; i++)
        out[i] = order[start + i];
    free(order);
    *count = n;
    return 0;
}

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
    ptl_plan_epoch(L, epoch, L->order);
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
    out->n = s->n, out->h = s->h, out->w = s->w, out->epoch = L->epoch, out->batch = s->global_batch;
    out->images = s->images;
    out->n_targets = nt;
    out->targets = s->targets;
    out->indices = s->indices;
    out->sources = s->sources;
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
    *h = L->cfg.imgsz_h, *w = L->cfg.imgsz_w;
    *cap = L->cap;
    if (L->cfg.rect)
        for (int k = 0; k < L->ds->n; k++)
            if (L->order[k] == index) {
                *h = L->bshape[2 * (k / L->global_batch)];
                *w = L->bshape[2 * (k / L->global_batch) + 1];
            }
    return 0;
}

int ptl_loader_sample(ptl_loader *L, int epoch, int index, int mosaic_on, uint8_t *img, float *targets,
                      int *n_targets, double meta[6], int64_t *source)
{
    if (index < 0 || index >= L->ds->n)
        return ptl_set_error(PTL_ERR_INDEX, "sample index %d out of range [0, %d)", index, L->ds->n);
    int H, W, cap;
    scratch_t sc;
    ptl_loader_sample_shape(L, index, &H, &W, &cap);
    if (ptl_scratch_init(&sc, L) != 0)
        return -1;
    int rc = ptl_build_sample(L, &sc, epoch, index, mosaic_on, H, W, img, targets, n_targets, meta, source);
    ptl_scratch_free(&sc);
    return rc;
}

void ptl_loader_cache_info(const ptl_loader *L, int64_t *needed, int64_t *filled)
{
    *needed = L->cache_needed;
    *filled = atomic_load((atomic_llong *)&L->cache_filled);
}

int ptl_loader_fill_cache(ptl_loader *L, const atomic_int *cancel) { return ptl_src_fill(L, cancel); }

void ptl_loader_batch_shape(const ptl_loader *L, int b, int *h, int *w)
{
    int gb, start, n;
    ptl_plan_slice(L, b, &gb, &start, &n);
    *h = L->bshape[2 * gb];
    *w = L->bshape[2 * gb + 1];
}

int ptl_loader_fixed_order(const ptl_loader *L) { return L->rect_order; }

int ptl_loader_num_failed(ptl_loader *L)
{
    pthread_mutex_lock(&L->log_mu);
    int n = L->n_failed;
    pthread_mutex_unlock(&L->log_mu);
    return n;
}

int ptl_loader_num_problems(ptl_loader *L)
{
    pthread_mutex_lock(&L->log_mu);
    int n = L->problems.n;
    pthread_mutex_unlock(&L->log_mu);
    return n;
}

int ptl_loader_problem(ptl_loader *L, int i, char *buf, size_t n)
{
    pthread_mutex_lock(&L->log_mu);
    int ok = i >= 0 && i < L->problems.n;
    if (ok)
        snprintf(buf, n, "%s", L->problems.msg[i]);
    pthread_mutex_unlock(&L->log_mu);
    return ok ? 0 : ptl_set_error(PTL_ERR_INDEX, "problem %d out of range", i);
}
