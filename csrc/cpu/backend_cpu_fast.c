/* The executor's fast CPU backend (executor.h), float32: oneDNN convolution plans (conv2d.h) and the
 * vectorised kernels of this folder. Memory, the weight copies, the head's reshapes and anything
 * float64 are the reference backend's (../nn/backend_cpu.c): the table starts as a copy of it.
 *
 * BatchNorm and attention take a workspace that the table's calls do not carry; it is this backend's
 * layer scratch (like CUDA's per-device one), reserved by every executor's prepare for its largest shape
 * (a row called alone, as the layer test bindings call it, grows it to its need) and used under a lock, so
 * that executors in several threads never share it at the same time. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../nn/attention.h"
#include "../nn/backend_cpu_storage.h"
#include "../nn/executor.h"
#include "attention.h"
#include "backend_cpu_fast.h"
#include "batchnorm.h"
#include "conv2d.h"
#include "elementwise.h"
#include "maxpool.h"
#include "upsample.h"

/* ------------------------------------------------------------------------- per-kernel time */

static const char *const entry_names[PTL_CPU_FAST_ENTRIES] = {
    "conv2d_forward",    "conv2d_backward_input", "conv2d_backward_weight", "conv2d_backward_bias",
    "batchnorm_forward", "batchnorm_backward",    "attention_forward",      "attention_backward",
    "add",               "accumulate",            "channel_copy",           "maxpool5_forward",
    "maxpool5_backward", "upsample2x_forward",    "upsample2x_backward"};
static double seconds[PTL_CPU_FAST_ENTRIES];
static int64_t calls[PTL_CPU_FAST_ENTRIES];

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Returns `call`'s status after adding its wall time to entry e. */
#define TIMED(e, call)                                                                                       \
    do {                                                                                                     \
        const double t0_ = now();                                                                            \
        const int rc_ = (call);                                                                              \
        seconds[e] += now() - t0_;                                                                           \
        calls[e]++;                                                                                          \
        return rc_;                                                                                          \
    } while (0)

const char *ptl_cpu_fast_stats(int e, double *secs, int64_t *ncalls)
{
    if (e < 0 || e >= PTL_CPU_FAST_ENTRIES)
        return NULL;
    *secs = seconds[e];
    *ncalls = calls[e];
    return entry_names[e];
}

void ptl_cpu_fast_stats_reset(void)
{
    memset(seconds, 0, sizeof seconds);
    memset(calls, 0, sizeof calls);
}

/* ------------------------------------------------------------------------- layer scratch */

static pthread_mutex_t scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static void *scratch;
static size_t scratch_bytes;

/* Grows the scratch to `bytes`; the caller holds the lock. */
static int scratch_grow(size_t bytes)
{
    if (bytes <= scratch_bytes)
        return 0;
    free(scratch);
    scratch_bytes = 0;
    if (!(scratch = malloc(bytes)))
        return ptl_set_error(PTL_ERR_MEMORY, "network: out of host memory for %zu bytes of layer scratch", bytes);
    scratch_bytes = bytes;
    return 0;
}

static int fast_reserve_scratch(ptl_exec_ctx *ctx, size_t bytes)
{
    (void)ctx;
    pthread_mutex_lock(&scratch_lock);
    const int rc = scratch_grow(bytes);
    pthread_mutex_unlock(&scratch_lock);
    return rc;
}

/* Runs `call` (which uses scratch, scratch_bytes) holding the scratch's lock, the scratch grown to `bytes`
 * first; returns from the caller. */
#define WITH_SCRATCH(e, bytes, call)                                                                         \
    do {                                                                                                     \
        pthread_mutex_lock(&scratch_lock);                                                                   \
        int rc_ = scratch_grow(bytes);                                                                       \
        if (rc_ == 0) {                                                                                      \
            const double t0_ = now();                                                                        \
            rc_ = (call);                                                                                    \
            seconds[e] += now() - t0_;                                                                       \
            calls[e]++;                                                                                      \
        }                                                                                                    \
        pthread_mutex_unlock(&scratch_lock);                                                                 \
        return rc_;                                                                                          \
    } while (0)

static size_t fast_bn_scratch_bytes(int64_t m, int c) { return ptl_cpu_batchnorm_workspace(m, c); }

static size_t fast_attention_scratch_bytes(const ptl_net_call *c)
{
    return ptl_cpu_attention_workspace(PTL_ATTENTION_CALL_DIMS(c));
}

/* ------------------------------------------------------------------------- convolutions */

static int fast_conv_plan(ptl_exec_ctx *ctx, const ptl_conv2d_desc *d, ptl_dtype dt, const ptl_net_conv_opts *o,
                          int bias, void **plan)
{
    (void)ctx;
    (void)o;
    if (dt != PTL_FLOAT32)
        return ptl_set_error(PTL_ERR_VALUE, "network: the fast CPU backend computes in float32, not %s",
                             ptl_dtype_name(dt));
    const ptl_cpu_conv2d_opts po = {PTL_CPU_WEIGHTS_OHWI, bias, PTL_CPU_CONV_ALL};
    ptl_cpu_conv2d_plan *p = NULL;
    if (ptl_cpu_conv2d_plan_create(d, &po, &p))
        return -1;
    *plan = p;
    return 0;
}

static void fast_conv_plan_free(void *plan) { ptl_cpu_conv2d_plan_destroy(plan); }

static int fast_conv_plans(ptl_exec_ctx *ctx, int n, const ptl_conv2d_desc *d, ptl_dtype dt,
                           const ptl_net_conv_opts *o, const uint8_t *bias, void **plans)
{
    return ptl_net_conv_plans_each(fast_conv_plan, fast_conv_plan_free, ctx, n, d, dt, o, bias, plans);
}

static size_t fast_conv_workspace(const void *plan, ptl_conv_ws_part part)
{
    (void)part; /* every direction sizes its oneDNN scratch within the one workspace */
    return ptl_cpu_conv2d_plan_workspace(plan);
}

static int fast_conv_forward(ptl_exec_ctx *ctx, const void *p, const void *x, const void *w, const void *bias, void *y,
                             void *ws, size_t wsb)
{
    (void)ctx;
    TIMED(0, ptl_cpu_conv2d_forward(p, x, w, bias, y, ws, wsb));
}

static int fast_conv_backward_input(ptl_exec_ctx *ctx, const void *p, const void *dy, const void *w, void *dx, void *ws,
                                    size_t wsb)
{
    (void)ctx;
    TIMED(1, ptl_cpu_conv2d_backward_input(p, dy, w, dx, ws, wsb));
}

static int fast_conv_backward_weight(ptl_exec_ctx *ctx, const void *p, const void *x, const void *dy, void *dw,
                                     void *ws, size_t wsb)
{
    (void)ctx;
    TIMED(2, ptl_cpu_conv2d_backward_weight(p, x, dy, dw, ws, wsb));
}

static int fast_conv_backward_bias(ptl_exec_ctx *ctx, const void *p, const void *dy, void *db, void *ws, size_t wsb)
{
    (void)ctx, (void)ws, (void)wsb;
    TIMED(3, ptl_cpu_conv2d_backward_bias(p, dy, db));
}

/* ------------------------------------------------------------------------- layers */

static int fast_batchnorm_forward(ptl_exec_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *x, const void *g,
                                  const void *b, void *rm, void *rv, int tr, ptl_act act, void *sm, void *si, void *y,
                                  int ld)
{
    if (dt != PTL_FLOAT32)
        return ptl_net_backend_cpu.batchnorm_forward(ctx, dt, m, c, x, g, b, rm, rv, tr, act, sm, si, y, ld);
    WITH_SCRATCH(4, fast_bn_scratch_bytes(m, c),
                 ptl_cpu_batchnorm_forward(m, c, x, g, b, rm, rv, tr, act, sm, si, y, ld, scratch, scratch_bytes));
}

static int fast_batchnorm_backward(ptl_exec_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *x, const void *dy,
                                   int ld, const void *g, const void *b, const void *sm, const void *si, int tr,
                                   ptl_act act, void *dx, void *dg, void *db)
{
    if (dt != PTL_FLOAT32)
        return ptl_net_backend_cpu.batchnorm_backward(ctx, dt, m, c, x, dy, ld, g, b, sm, si, tr, act, dx, dg, db);
    WITH_SCRATCH(5, fast_bn_scratch_bytes(m, c),
                 ptl_cpu_batchnorm_backward(m, c, x, dy, ld, g, b, sm, si, tr, act, dx, dg, db, scratch,
                                            scratch_bytes));
}

/* The layer rows (executor.h's ptl_net_call): float32 to the fast kernel, the rest to the reference's row. */
#define IN(c) (c)->in[0]
#define FLOAT32_OR_REFERENCE(c, kind, direction)                                                             \
    if ((c)->dt != PTL_FLOAT32)                                                                              \
    return ptl_net_backend_cpu.layer[kind].direction(ctx, c)

static int fast_attention_forward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    FLOAT32_OR_REFERENCE(c, PTL_OP_ATTN, forward);
    WITH_SCRATCH(6, fast_attention_scratch_bytes(c),
                 ptl_cpu_attention_forward(PTL_ATTENTION_CALL_DIMS(c), IN(c).data, c->saved, c->out[0].data,
                                              PTL_NET_CALL_OUT(c, 1, data), scratch, scratch_bytes));
}

static int fast_attention_backward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    FLOAT32_OR_REFERENCE(c, PTL_OP_ATTN, backward);
    WITH_SCRATCH(7, fast_attention_scratch_bytes(c),
                 ptl_cpu_attention_backward(PTL_ATTENTION_CALL_DIMS(c), IN(c).data, c->saved, c->out[0].grad,
                                               PTL_NET_CALL_OUT(c, 1, grad), IN(c).grad, scratch, scratch_bytes));
}

static int fast_maxpool_forward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    FLOAT32_OR_REFERENCE(c, PTL_OP_POOL, forward);
    TIMED(11, ptl_cpu_maxpool5_forward(PTL_NET_CALL_NHWC_SLICE(c), PTL_NET_IN_AT(c, data), PTL_NET_OUT_AT(c, data)));
}

static int fast_maxpool_backward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    FLOAT32_OR_REFERENCE(c, PTL_OP_POOL, backward);
    TIMED(12, ptl_cpu_maxpool5_backward(PTL_NET_CALL_NHWC_SLICE(c), PTL_NET_IN_AT(c, data), PTL_NET_OUT_AT(c, grad),
                                        ptl_net_arg_at(IN(c).grad, &IN(c), c->dt), IN(c).accumulate));
}

static int fast_upsample_forward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    FLOAT32_OR_REFERENCE(c, PTL_OP_UP, forward);
    TIMED(13, ptl_cpu_upsample2x_forward(PTL_NET_CALL_NHWC_SLICE(c), PTL_NET_IN_AT(c, data), PTL_NET_OUT_AT(c, data)));
}

static int fast_upsample_backward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    FLOAT32_OR_REFERENCE(c, PTL_OP_UP, backward);
    TIMED(14, ptl_cpu_upsample2x_backward(PTL_NET_CALL_NHWC_SLICE(c), PTL_NET_OUT_AT(c, grad), PTL_NET_IN_AT(c, grad),
                                          IN(c).accumulate));
}

/* Entries without a workspace: float32 to the fast kernel (timed as entry e), the rest to the reference. */
#define FAST_OR_REFERENCE(e, name, fast_call, reference, args, ...)                                          \
    static int fast_##name(ptl_exec_ctx *ctx, ptl_dtype dt, __VA_ARGS__)                                     \
    {                                                                                                        \
        if (dt == PTL_FLOAT32)                                                                               \
            TIMED(e, fast_call);                                                                             \
        return ptl_net_backend_cpu.reference args;                                                           \
    }

FAST_OR_REFERENCE(8, add, ptl_cpu_add(n, a, b, y), add, (ctx, dt, n, a, b, y), int64_t n, const void *a,
                  const void *b, void *y)
FAST_OR_REFERENCE(9, accumulate, ptl_cpu_accumulate(n, x, y), accumulate, (ctx, dt, n, x, y), int64_t n,
                  const void *x, void *y)
FAST_OR_REFERENCE(10, channel_copy, ptl_cpu_channel_copy(m, c, src, sc, so, dst, dc, dof, acc), channel_copy,
                  (ctx, dt, m, c, src, sc, so, dst, dc, dof, acc), int64_t m, int c, const void *src, int sc, int so,
                  void *dst, int dc, int dof, int acc)

/* ------------------------------------------------------------------------- the table */

static ptl_net_backend table;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void make_table(void)
{
    table = ptl_net_backend_cpu;
    table.name = "cpu-fast";
    table.conv_plans = fast_conv_plans;
    table.conv_plan_free = fast_conv_plan_free;
    table.conv_workspace = fast_conv_workspace;
    table.bn_scratch_bytes = fast_bn_scratch_bytes;
    table.reserve_scratch = fast_reserve_scratch;
    table.conv_forward = fast_conv_forward;
    table.conv_backward_input = fast_conv_backward_input;
    table.conv_backward_weight = fast_conv_backward_weight;
    table.conv_backward_bias = fast_conv_backward_bias;
    table.batchnorm_forward = fast_batchnorm_forward;
    table.batchnorm_backward = fast_batchnorm_backward;
    table.add = fast_add;
    table.accumulate = fast_accumulate;
    table.channel_copy = fast_channel_copy;
    table.layer[PTL_OP_POOL] =
        (ptl_net_layer){fast_maxpool_forward, fast_maxpool_backward, NULL, 0, PTL_NET_SLICE_IN | PTL_NET_SLICE_OUT};
    table.layer[PTL_OP_UP] =
        (ptl_net_layer){fast_upsample_forward, fast_upsample_backward, NULL, 0, PTL_NET_SLICE_IN | PTL_NET_SLICE_OUT};
    table.layer[PTL_OP_ATTN] = (ptl_net_layer){fast_attention_forward, fast_attention_backward,
                                               fast_attention_scratch_bytes, 1};
}

const ptl_net_backend *ptl_net_backend_cpu_fast(void)
{
    if (!ptl_cpu_conv2d_available())
        return NULL;
    pthread_once(&table_once, make_table);
    return &table;
}

int ptl_net_cpu_backend_choose(const char *kernels, ptl_dtype dt, const ptl_net_backend **out)
{
    const int explicit_choice = kernels != NULL;
    const char *from = "cpu_kernels";
    if (!kernels) {
        from = PTL_CPU_KERNELS_ENV;
        kernels = getenv(PTL_CPU_KERNELS_ENV);
        if (!kernels || !*kernels)
            kernels = PTL_CPU_KERNELS_DEFAULT;
    }
    if (!strcmp(kernels, "reference")) {
        *out = &ptl_net_backend_cpu;
        return 0;
    }
    const int bf16 = !strcmp(kernels, "bfloat16-storage");
    if (bf16 || !strcmp(kernels, "float16-storage")) {
        if (dt != PTL_FLOAT32)
            return ptl_set_error(PTL_ERR_VALUE, "%s: '%s' computes in float32; this network is %s", from, kernels,
                                 ptl_dtype_name(dt));
        *out = ptl_net_backend_cpu_storage(bf16 ? PTL_BFLOAT16 : PTL_FLOAT16);
        return 0;
    }
    if (strcmp(kernels, "fast"))
        return ptl_set_error(PTL_ERR_VALUE,
                             "%s: expected 'fast', 'reference', 'bfloat16-storage' or 'float16-storage', got '%s'",
                             from, kernels);
    const ptl_net_backend *fast = ptl_net_backend_cpu_fast();
    if (fast && dt == PTL_FLOAT32) {
        *out = fast;
        return 0;
    }
    /* a preference (the default or the environment) falls back where the fast kernels do not apply */
    if (explicit_choice)
        return ptl_set_error(PTL_ERR_VALUE, "cpu_kernels: 'fast' %s",
                             fast ? "computes in float32 only; this network is float64"
                                  : "needs oneDNN, which this ptl was built without (apt-get install libdnnl-dev, "
                                    "then rebuild)");
    *out = &ptl_net_backend_cpu;
    return 0;
}
