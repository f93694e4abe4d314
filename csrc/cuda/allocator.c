/* Caching device allocator; the policy is described in allocator.h. */
#include <pthread.h>
#include <stdlib.h>

#include "allocator.h"
#include "device.h"

#define ROUND 512
#define SMALL_REQUEST ((size_t)1 << 20)
#define SMALL_SEGMENT ((size_t)2 << 20)
#define MEDIUM_REQUEST ((size_t)10 << 20)
#define MEDIUM_SEGMENT ((size_t)20 << 20)
#define LARGE_GRANULE ((size_t)2 << 20)

typedef struct segment segment;

typedef struct block {
    char *ptr;
    size_t size;
    int allocated;
    segment *seg;
    struct block *prev, *next;   /* address-ordered neighbours within the segment */
    struct block *fprev, *fnext; /* free list of the segment's pool and class */
} block;

struct segment {
    char *ptr;
    size_t size;
    int small;
    int pool;
    segment *next;
};

typedef struct {
    int id;
    int retired;
    block *free_list[2]; /* [0] large, [1] small */
    segment *segments;
} pool;

struct ptl_allocator {
    int device;
    pthread_mutex_t lock;
    pool *pools;
    int num_pools, cap_pools, next_pool_id;
    int current_pool;
    ptl_alloc_stats stats;
};

static pool *find_pool(ptl_allocator *a, int id)
{
    for (int i = 0; i < a->num_pools; i++)
        if (a->pools[i].id == id)
            return &a->pools[i];
    return NULL;
}

static int add_pool(ptl_allocator *a, int id)
{
    if (a->num_pools == a->cap_pools) {
        int cap = a->cap_pools ? 2 * a->cap_pools : 4;
        pool *p = realloc(a->pools, (size_t)cap * sizeof *p);
        if (!p)
            return ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
        a->pools = p;
        a->cap_pools = cap;
    }
    pool *p = &a->pools[a->num_pools++];
    *p = (pool){.id = id};
    return 0;
}

int ptl_alloc_create(int device, ptl_allocator **out)
{
    ptl_allocator *a = calloc(1, sizeof *a);
    if (!a)
        return ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
    a->device = device;
    a->next_pool_id = 1;
    pthread_mutex_init(&a->lock, NULL);
    if (add_pool(a, 0) != 0) {
        pthread_mutex_destroy(&a->lock);
        free(a);
        return -1;
    }
    *out = a;
    return 0;
}

static void free_list_remove(pool *p, block *b)
{
    block **head = &p->free_list[b->seg->small];
    if (b->fprev)
        b->fprev->fnext = b->fnext;
    else
        *head = b->fnext;
    if (b->fnext)
        b->fnext->fprev = b->fprev;
    b->fprev = b->fnext = NULL;
}

static void free_list_push(pool *p, block *b)
{
    block **head = &p->free_list[b->seg->small];
    b->fprev = NULL;
    b->fnext = *head;
    if (*head)
        (*head)->fprev = b;
    *head = b;
}

/* Frees the pool's segments that hold no allocated block; returns 1 if the pool is now empty. */
static int release_unused(ptl_allocator *a, pool *p)
{
    segment **link = &p->segments;
    while (*link) {
        segment *s = *link;
        block *first = NULL;
        for (block *b = p->free_list[s->small]; b; b = b->fnext)
            if (b->seg == s && b->size == s->size) {
                first = b;
                break;
            }
        if (!first) {
            link = &s->next;
            continue;
        }
        free_list_remove(p, first);
        cudaFree(s->ptr);
        a->stats.reserved -= (int64_t)s->size;
        a->stats.num_segments--;
        *link = s->next;
        free(first);
        free(s);
    }
    return p->segments == NULL;
}

static void drop_empty_retired(ptl_allocator *a)
{
    for (int i = 0; i < a->num_pools;) {
        if (a->pools[i].retired && a->pools[i].segments == NULL)
            a->pools[i] = a->pools[--a->num_pools];
        else
            i++;
    }
}

void ptl_alloc_destroy(ptl_allocator *a)
{
    if (!a)
        return;
    /* Blocks still handed out belong to storages that outlive the runtime only at interpreter exit;
     * their segments are released with the process. */
    for (int i = 0; i < a->num_pools; i++)
        release_unused(a, &a->pools[i]);
    free(a->pools);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

static size_t round_size(size_t n) { return (n + ROUND - 1) / ROUND * ROUND; }

static size_t segment_size(size_t n)
{
    if (n <= SMALL_REQUEST)
        return SMALL_SEGMENT;
    if (n < MEDIUM_REQUEST)
        return MEDIUM_SEGMENT;
    return (n + LARGE_GRANULE - 1) / LARGE_GRANULE * LARGE_GRANULE;
}

static block *best_fit(pool *p, int small, size_t size)
{
    block *best = NULL;
    for (block *b = p->free_list[small]; b; b = b->fnext)
        if (b->size >= size && (!best || b->size < best->size))
            best = b;
    return best;
}

static int new_segment(ptl_allocator *a, pool *p, int small, size_t size, block **out)
{
    size_t bytes = small ? SMALL_SEGMENT : segment_size(size);
    void *ptr = NULL;
    cudaError_t st = cudaMalloc(&ptr, bytes);
    if (st != cudaSuccess) {
        cudaGetLastError();
        /* Give cached memory of every pool back to the driver once, then retry. */
        for (int i = 0; i < a->num_pools; i++)
            release_unused(a, &a->pools[i]);
        a->stats.num_alloc_retries++;
        st = cudaMalloc(&ptr, bytes);
        if (st != cudaSuccess) {
            cudaGetLastError();
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            return ptl_set_error(PTL_ERR_CUDA,
                                 "cudaMalloc failed: CUDA out of memory on cuda:%d trying to allocate %.2f MiB "
                                 "(%.2f MiB allocated by ptl, %.2f MiB reserved, %.2f MiB free of %.2f MiB)",
                                 a->device, size / 1048576.0, a->stats.allocated / 1048576.0,
                                 a->stats.reserved / 1048576.0, free_b / 1048576.0, total_b / 1048576.0);
        }
    }
    segment *s = calloc(1, sizeof *s);
    block *b = calloc(1, sizeof *b);
    if (!s || !b) {
        free(s);
        free(b);
        cudaFree(ptr);
        return ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
    }
    *s = (segment){.ptr = ptr, .size = bytes, .small = small, .pool = p->id, .next = p->segments};
    p->segments = s;
    *b = (block){.ptr = ptr, .size = bytes, .seg = s};
    a->stats.reserved += (int64_t)bytes;
    a->stats.num_segments++;
    if (a->stats.reserved > a->stats.max_reserved)
        a->stats.max_reserved = a->stats.reserved;
    *out = b;
    return 0;
}

int ptl_alloc_malloc(ptl_allocator *a, int pool_id, size_t nbytes, void **ptr, void **handle)
{
    *ptr = NULL;
    *handle = NULL;
    if (nbytes == 0)
        return 0;
    size_t size = round_size(nbytes);
    int small = size <= SMALL_REQUEST;
    pthread_mutex_lock(&a->lock);
    pool *p = find_pool(a, pool_id);
    block *b = NULL;
    if (!p || p->retired) {
        ptl_set_error(PTL_ERR_VALUE, "memory pool %d does not exist or was released", pool_id);
        goto fail;
    }
    b = best_fit(p, small, size);
    if (b)
        free_list_remove(p, b);
    else if (new_segment(a, p, small, size, &b) != 0)
        goto fail;
    /* Split off the tail when it is worth keeping as a block of its own. */
    size_t rest = b->size - size;
    if (rest >= (small ? ROUND : SMALL_REQUEST + 1)) {
        block *tail = calloc(1, sizeof *tail);
        if (tail) {
            *tail = (block){.ptr = b->ptr + size, .size = rest, .seg = b->seg, .prev = b, .next = b->next};
            if (b->next)
                b->next->prev = tail;
            b->next = tail;
            b->size = size;
            free_list_push(p, tail);
        }
    }
    b->allocated = 1;
    a->stats.allocated += (int64_t)b->size;
    if (a->stats.allocated > a->stats.max_allocated)
        a->stats.max_allocated = a->stats.allocated;
    pthread_mutex_unlock(&a->lock);
    *ptr = b->ptr;
    *handle = b;
    return 0;
fail:
    pthread_mutex_unlock(&a->lock);
    return -1;
}

void ptl_alloc_free(ptl_allocator *a, void *handle)
{
    block *b = handle;
    if (!b)
        return;
    pthread_mutex_lock(&a->lock);
    pool *p = find_pool(a, b->seg->pool);
    a->stats.allocated -= (int64_t)b->size;
    b->allocated = 0;
    if (b->prev && !b->prev->allocated) {
        block *prev = b->prev;
        free_list_remove(p, prev);
        prev->size += b->size;
        prev->next = b->next;
        if (b->next)
            b->next->prev = prev;
        free(b);
        b = prev;
    }
    if (b->next && !b->next->allocated) {
        block *next = b->next;
        free_list_remove(p, next);
        b->size += next->size;
        b->next = next->next;
        if (next->next)
            next->next->prev = b;
        free(next);
    }
    free_list_push(p, b);
    if (p->retired && release_unused(a, p))
        drop_empty_retired(a);
    pthread_mutex_unlock(&a->lock);
}

int ptl_alloc_empty_cache(ptl_allocator *a)
{
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < a->num_pools; i++)
        release_unused(a, &a->pools[i]);
    drop_empty_retired(a);
    pthread_mutex_unlock(&a->lock);
    return 0;
}

int ptl_alloc_pool_create(ptl_allocator *a)
{
    pthread_mutex_lock(&a->lock);
    int id = a->next_pool_id++;
    int rc = add_pool(a, id);
    pthread_mutex_unlock(&a->lock);
    return rc == 0 ? id : -1;
}

int ptl_alloc_pool_release(ptl_allocator *a, int pool_id)
{
    pthread_mutex_lock(&a->lock);
    pool *p = find_pool(a, pool_id);
    if (!p || pool_id == 0 || p->retired) {
        pthread_mutex_unlock(&a->lock);
        return ptl_set_error(PTL_ERR_VALUE, "memory pool %d cannot be released (unknown, default or released)",
                             pool_id);
    }
    p->retired = 1;
    if (a->current_pool == pool_id)
        a->current_pool = 0;
    if (release_unused(a, p))
        drop_empty_retired(a);
    pthread_mutex_unlock(&a->lock);
    return 0;
}

void ptl_alloc_get_stats(ptl_allocator *a, ptl_alloc_stats *out)
{
    pthread_mutex_lock(&a->lock);
    *out = a->stats;
    pthread_mutex_unlock(&a->lock);
}

void ptl_alloc_reset_peak(ptl_allocator *a)
{
    pthread_mutex_lock(&a->lock);
    a->stats.max_allocated = a->stats.allocated;
    a->stats.max_reserved = a->stats.reserved;
    pthread_mutex_unlock(&a->lock);
}

int ptl_alloc_current_pool(ptl_allocator *a)
{
    pthread_mutex_lock(&a->lock);
    int id = a->current_pool;
    pthread_mutex_unlock(&a->lock);
    return id;
}

void ptl_alloc_set_current_pool(ptl_allocator *a, int pool_id)
{
    pthread_mutex_lock(&a->lock);
    a->current_pool = pool_id;
    pthread_mutex_unlock(&a->lock);
}
