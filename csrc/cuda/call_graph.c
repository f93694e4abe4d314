#include "call_graph.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "graph.h"

typedef struct {
    ptl_call_key key;
    ptl_cuda_graph *graph;
    int used;
    int refused; /* a capture of this call failed: it is made directly */
} slot;

/* Open addressing, linear probing, at most half full: `keys` calls in a table of 2^k >= 2 * keys slots. */
struct ptl_call_graphs {
    pthread_mutex_t lock;
    int keys, count;
    unsigned mask;
    slot *s;
    ptl_call_graphs *prev, *next; /* every table, for the flush */
};

static int enabled = -1; /* -1: the environment not read yet */
static int64_t made, live, relaunched, limit = PTL_CALL_GRAPHS_LIMIT;

/* Every table; held before a table's own lock, never while a caller holds one. */
static pthread_mutex_t registry = PTHREAD_MUTEX_INITIALIZER;
static ptl_call_graphs *tables;
static int64_t relaunched_at_flush;

int ptl_call_graphs_enabled(void)
{
    int on = __atomic_load_n(&enabled, __ATOMIC_RELAXED);
    if (on < 0) {
        const char *env = getenv("PTL_CALL_GRAPHS");
        int unset = -1;
        on = !(env && env[0] == '0' && env[1] == '\0');
        if (!__atomic_compare_exchange_n(&enabled, &unset, on, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            on = unset;
    }
    return on;
}

int ptl_call_graphs_set(int on)
{
    const int prev = ptl_call_graphs_enabled();
    __atomic_store_n(&enabled, on ? 1 : 0, __ATOMIC_RELAXED);
    return prev;
}

int64_t ptl_call_graphs_made(void) { return __atomic_load_n(&made, __ATOMIC_RELAXED); }
int64_t ptl_call_graphs_live(void) { return __atomic_load_n(&live, __ATOMIC_RELAXED); }

ptl_call_graphs *ptl_call_graphs_create(int keys)
{
    ptl_call_graphs *t = (ptl_call_graphs *)calloc(1, sizeof *t);
    unsigned n = 2;
    while (n < 2u * (unsigned)keys)
        n *= 2;
    if (t)
        t->s = (slot *)calloc(n, sizeof *t->s);
    if (!t || !t->s) {
        free(t);
        ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    t->keys = keys;
    t->mask = n - 1;
    pthread_mutex_lock(&registry);
    t->next = tables;
    if (tables)
        tables->prev = t;
    tables = t;
    pthread_mutex_unlock(&registry);
    return t;
}

static void clear(ptl_call_graphs *t)
{
    for (unsigned i = 0; i <= t->mask; i++)
        if (t->s[i].graph) {
            ptl_cuda_graph_destroy(t->s[i].graph);
            __atomic_sub_fetch(&live, 1, __ATOMIC_RELAXED);
        }
    memset(t->s, 0, (t->mask + 1) * sizeof *t->s);
    t->count = 0;
}

void ptl_call_graphs_destroy(ptl_call_graphs *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&registry);
    if (t->prev)
        t->prev->next = t->next;
    else
        tables = t->next;
    if (t->next)
        t->next->prev = t->prev;
    pthread_mutex_unlock(&registry);
    clear(t);
    pthread_mutex_destroy(&t->lock);
    free(t->s);
    free(t);
}

static void destroy_ext(void *p) { ptl_call_graphs_destroy((ptl_call_graphs *)p); }

/* A queue's calls without a plan: one network shape's BatchNorm passes (two per layer) several times over. */
#define QUEUE_KEYS 2048

ptl_call_graphs *ptl_call_graphs_of(ptl_cuda_ctx *ctx)
{
    ptl_ctx_ext *ext = &ctx->ext[PTL_CTX_CALL_GRAPHS];
    ptl_call_graphs *t = (ptl_call_graphs *)__atomic_load_n(&ext->ptr, __ATOMIC_ACQUIRE);
    if (t)
        return t;
    pthread_mutex_lock(&ctx->ext_lock);
    if (!ext->ptr && (t = ptl_call_graphs_create(QUEUE_KEYS))) {
        ext->destroy = destroy_ext;
        __atomic_store_n(&ext->ptr, t, __ATOMIC_RELEASE);
    }
    t = (ptl_call_graphs *)ext->ptr;
    pthread_mutex_unlock(&ctx->ext_lock);
    return t;
}

/* At the limit of graphs held (PTL_CALL_GRAPHS_LIMIT unless a test set another), every table lets its graphs
 * go (those of networks and shapes no longer used among them), and the calls in use are recorded again.
 * Unless the graphs were hardly relaunched since the last flush: then the calls in use need more graphs
 * than the limit (or none lives long enough to be reused), recording would only repeat, and calls are made
 * directly from then on (ptl_call_graphs_enabled says 0). */
static void flush(void)
{
    pthread_mutex_lock(&registry);
    const int64_t n = __atomic_load_n(&relaunched, __ATOMIC_RELAXED);
    if (n - relaunched_at_flush < __atomic_load_n(&limit, __ATOMIC_RELAXED) / 8)
        __atomic_store_n(&enabled, 0, __ATOMIC_RELAXED);
    relaunched_at_flush = n;
    for (ptl_call_graphs *t = tables; t; t = t->next) {
        pthread_mutex_lock(&t->lock);
        clear(t);
        pthread_mutex_unlock(&t->lock);
    }
    pthread_mutex_unlock(&registry);
}

int64_t ptl_call_graphs_set_limit(int64_t n)
{
    const int64_t prev = __atomic_exchange_n(&limit, n > 0 ? n : PTL_CALL_GRAPHS_LIMIT, __ATOMIC_RELAXED);
    const int on = ptl_call_graphs_enabled();
    flush();
    __atomic_store_n(&enabled, on, __ATOMIC_RELAXED);
    return prev;
}

/* The key's slot: its own, or the empty one where it would go. */
static slot *probe(ptl_call_graphs *t, const ptl_call_key *key)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the key's words */
    for (int i = 0; i < PTL_CALL_KEY; i++) {
        h ^= (uint64_t)(uintptr_t)key->v[i];
        h *= 1099511628211ull;
    }
    for (unsigned i = (unsigned)(h ^ (h >> 32)) & t->mask;; i = (i + 1) & t->mask)
        if (!t->s[i].used || !memcmp(&t->s[i].key, key, sizeof *key))
            return &t->s[i];
}

/* The call captured from `stream` into s->graph and launched; a capture that fails marks the slot and makes
 * the call directly. */
static int record(slot *s, cudaStream_t stream, int (*issue)(void *), void *arg)
{
    ptl_cuda_graph *g = NULL;
    if (ptl_cuda_graph_begin(stream) == 0) {
        const int failed = issue(arg);
        if (ptl_cuda_graph_end(stream, !failed, &g) == 0 && g) {
            s->graph = g;
            __atomic_add_fetch(&made, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&live, 1, __ATOMIC_RELAXED);
            return ptl_cuda_graph_launch(g, stream);
        }
    }
    /* nothing was enqueued while capturing: the direct call below is the call's only run */
    (void)cudaGetLastError();
    ptl_error_clear();
    s->refused = 1;
    return issue(arg);
}

int ptl_call_graph_run(ptl_call_graphs *t, cudaStream_t stream, const ptl_call_key *key, int (*issue)(void *arg),
                       void *arg)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    slot *s;
    int rc, full = 0;
    if (!t || !ptl_call_graphs_enabled())
        return issue(arg);
    PTL_CUDA_TRY(cudaStreamIsCapturing(stream, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        return issue(arg);
    pthread_mutex_lock(&t->lock);
    s = probe(t, key);
    if (!s->used) { /* first sight */
        if (t->count == t->keys) {
            clear(t);
            s = probe(t, key);
        }
        s->used = 1;
        s->key = *key;
        t->count++;
        rc = issue(arg);
    } else if (s->graph) {
        rc = ptl_cuda_graph_launch(s->graph, stream);
        __atomic_add_fetch(&relaunched, 1, __ATOMIC_RELAXED);
    } else if (s->refused) {
        rc = issue(arg);
    } else if (__atomic_load_n(&live, __ATOMIC_RELAXED) >= __atomic_load_n(&limit, __ATOMIC_RELAXED)) {
        rc = issue(arg);
        full = 1;
    } else {
        rc = record(s, stream, issue, arg);
    }
    pthread_mutex_unlock(&t->lock);
    if (full)
        flush();
    return rc;
fail:
    return -1;
}
