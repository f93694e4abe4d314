/* The per-device layer scratch (layer_scratch.h). One buffer per device context (kept in its ext slot
 * and freed with it), from the context's allocator (default pool, so it never belongs to a graph's
 * private pool). Work runs on the context's one stream, so freeing the old buffer when growing is safe
 * for kernels still queued on it. A recorded graph holds the buffer's address, so each growth counts a
 * generation that recordings compare before replaying. */
#include "layer_scratch.h"

#include <pthread.h>
#include <stdlib.h>

#include "device.h"

typedef struct {
    ptl_cuda_ctx *ctx;
    void *ptr, *block;
    size_t bytes;
    uint64_t generation;
} layer_scratch;

static void scratch_destroy(void *p)
{
    layer_scratch *s = (layer_scratch *)p;
    if (s->block)
        ptl_alloc_free(s->ctx->alloc, s->block);
    free(s);
}

int ptl_layers_cuda_scratch(ptl_cuda_ctx *ctx, size_t bytes, void **out)
{
    int rc = 0;
    pthread_mutex_lock(&ctx->ext_lock);
    ptl_ctx_ext *ext = &ctx->ext[PTL_CTX_LAYER_SCRATCH];
    if (!ext->ptr) {
        layer_scratch *s = (layer_scratch *)calloc(1, sizeof *s);
        if (s) {
            s->ctx = ctx;
            ext->ptr = s;
            ext->destroy = scratch_destroy;
        } else {
            rc = ptl_set_error(PTL_ERR_MEMORY, "layer scratch: out of host memory");
        }
    }
    layer_scratch *s = (layer_scratch *)ext->ptr;
    if (rc == 0 && s->bytes < bytes) {
        size_t want = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes;
        void *ptr = NULL, *block = NULL;
        if (s->block)
            ptl_alloc_free(ctx->alloc, s->block);
        s->ptr = s->block = NULL;
        s->bytes = 0;
        rc = ptl_alloc_malloc(ctx->alloc, 0, want, &ptr, &block);
        if (rc == 0) {
            s->ptr = ptr;
            s->block = block;
            s->bytes = want;
            s->generation++;
        }
    }
    if (rc == 0)
        *out = s->ptr;
    pthread_mutex_unlock(&ctx->ext_lock);
    return rc;
}

int ptl_layers_cuda_reserve(ptl_cuda_ctx *ctx, size_t bytes)
{
    void *p;
    return ptl_layers_cuda_scratch(ctx, bytes, &p);
}

uint64_t ptl_layers_cuda_scratch_generation(ptl_cuda_ctx *ctx)
{
    pthread_mutex_lock(&ctx->ext_lock);
    const layer_scratch *s = (const layer_scratch *)ctx->ext[PTL_CTX_LAYER_SCRATCH].ptr;
    const uint64_t g = s ? s->generation : 0;
    pthread_mutex_unlock(&ctx->ext_lock);
    return g;
}
