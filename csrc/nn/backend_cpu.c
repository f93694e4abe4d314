/* The executor's CPU backend (executor.h): host memory and the CPU reference kernels of this folder.
 * The execution context is unused (NULL). New blocks are filled with NaN bytes, so anything the
 * executor reads before writing shows in its results instead of passing silently. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "batchnorm.h"
#include "concat.h"
#include "elementwise.h"
#include "executor.h"
#include "maxpool.h"
#include "upsample.h"
#include "weight_cast.h"

static atomic_long live_blocks;

long ptl_net_cpu_live_blocks(void) { return atomic_load(&live_blocks); }

static int cpu_alloc(ptl_exec_ctx *ctx, size_t bytes, ptl_net_buf *b)
{
    (void)ctx;
    b->ptr = b->block = malloc(bytes);
    if (!b->ptr)
        return ptl_set_error(PTL_ERR_MEMORY, "network: out of host memory for %zu bytes", bytes);
    memset(b->ptr, 0xff, bytes);
    atomic_fetch_add(&live_blocks, 1);
    return 0;
}

static void cpu_release(ptl_exec_ctx *ctx, ptl_net_buf *b)
{
    (void)ctx;
    free(b->block);
    atomic_fetch_sub(&live_blocks, 1);
}

static int cpu_zero(ptl_exec_ctx *ctx, void *p, size_t bytes)
{
    (void)ctx;
    memset(p, 0, bytes);
    return 0;
}

static int cpu_copy(ptl_exec_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memcpy(dst, src, bytes);
    return 0;
}

/* ------------------------------------------------------------------------- conv plans */

typedef struct {
    ptl_conv2d_desc d;
    ptl_dtype dt;
} cpu_plan;

static int cpu_conv_plan(ptl_exec_ctx *ctx, const ptl_conv2d_desc *d, ptl_dtype dt, const ptl_net_conv_opts *o,
                         int bias, void **plan)
{
    (void)ctx;
    (void)o;
    (void)bias;
    cpu_plan *p = malloc(sizeof *p);
    if (!p)
        return ptl_set_error(PTL_ERR_MEMORY, "network: out of host memory");
    p->d = *d;
    p->dt = dt;
    *plan = p;
    return 0;
}

static void cpu_conv_plan_free(void *plan) { free(plan); }

static int cpu_conv_plans(ptl_exec_ctx *ctx, int n, const ptl_conv2d_desc *d, ptl_dtype dt, const ptl_net_conv_opts *o,
                          const uint8_t *bias, void **plans)
{
    return ptl_net_conv_plans_each(cpu_conv_plan, cpu_conv_plan_free, ctx, n, d, dt, o, bias, plans);
}

const ptl_conv2d_desc *ptl_net_cpu_plan_desc(const void *plan) { return &((const cpu_plan *)plan)->d; }

static size_t cpu_conv_workspace(const void *plan, ptl_conv_ws_part part)
{
    (void)plan;
    (void)part;
    return 0;
}

/* The CPU kernels take no context: each entry below drops it. */
#define WITHOUT_CTX(name, call, ...)                                                                         \
    static int name(ptl_exec_ctx *ctx, __VA_ARGS__)                                                          \
    {                                                                                                        \
        (void)ctx;                                                                                           \
        return call;                                                                                         \
    }
#define PLAN(p) (&((const cpu_plan *)(p))->d), ((const cpu_plan *)(p))->dt

WITHOUT_CTX(cpu_conv_forward, ((void)ws, (void)wsb, ptl_conv2d_forward(PLAN(p), x, w, bias, y)), const void *p,
            const void *x, const void *w, const void *bias, void *y, void *ws, size_t wsb)
/* The executor hands no workspace here (cpu_conv_workspace: its arithmetic is the plain path's); a caller
 * handing one of the transposed weights' size (the layer test bindings) gets the transposed-weight path. */
static int cpu_conv_backward_input(ptl_exec_ctx *ctx, const void *p, const void *dy, const void *w, void *dx,
                                   void *ws, size_t wsb)
{
    (void)ctx;
    const cpu_plan *cp = p;
    const size_t need = (size_t)ptl_conv2d_backward_input_workspace(&cp->d) * ptl_dtype_size(cp->dt);
    return ptl_conv2d_backward_input_ws(&cp->d, cp->dt, dy, w, need && wsb >= need ? ws : NULL, dx);
}
WITHOUT_CTX(cpu_conv_backward_weight, ((void)ws, (void)wsb, ptl_conv2d_backward_weight(PLAN(p), x, dy, dw)),
            const void *p, const void *x, const void *dy, void *dw, void *ws, size_t wsb)
WITHOUT_CTX(cpu_conv_backward_bias, ((void)ws, (void)wsb, ptl_conv2d_backward_bias(PLAN(p), dy, db)), const void *p,
            const void *dy, void *db, void *ws, size_t wsb)

/* ------------------------------------------------------------------------- weights, layers */

WITHOUT_CTX(cpu_weight_cast, ptl_net_weight_cast(dt, t->tab, t->n, params, wc), ptl_dtype dt, const ptl_wcast_table *t,
            const void *params, void *wc)
WITHOUT_CTX(cpu_weight_grad, ptl_net_weight_grad(dt, t->tab, t->n, wgc, grads), ptl_dtype dt, const ptl_wcast_table *t,
            void *wgc, void *grads)
WITHOUT_CTX(cpu_batchnorm_forward, ptl_batchnorm_forward(dt, m, c, x, g, b, rm, rv, tr, act, sm, si, y, ld),
            ptl_dtype dt, int64_t m, int c, const void *x, const void *g, const void *b, void *rm, void *rv, int tr,
            ptl_act act, void *sm, void *si, void *y, int ld)
WITHOUT_CTX(cpu_batchnorm_backward, ptl_batchnorm_backward(dt, m, c, x, dy, ld, g, b, sm, si, tr, act, dx, dg, db),
            ptl_dtype dt, int64_t m, int c, const void *x, const void *dy, int ld, const void *g, const void *b,
            const void *sm, const void *si, int tr, ptl_act act, void *dx, void *dg, void *db)
WITHOUT_CTX(cpu_add, ptl_add(dt, n, a, b, y), ptl_dtype dt, int64_t n, const void *a, const void *b, void *y)
WITHOUT_CTX(cpu_accumulate, ptl_accumulate(dt, n, x, y), ptl_dtype dt, int64_t n, const void *x, void *y)
WITHOUT_CTX(cpu_channel_copy, ptl_channel_copy(dt, m, c, src, sc, so, dst, dc, dof, acc), ptl_dtype dt, int64_t m,
            int c, const void *src, int sc, int so, void *dst, int dc, int dof, int acc)
/* the layer rows (executor.h's ptl_net_call) */
#define IN(c) (c)->in[0]
WITHOUT_CTX(cpu_maxpool_forward, ptl_maxpool5_forward(c->dt, PTL_NET_CALL_NHWC_SLICE(c), PTL_NET_IN_AT(c, data),
                                                      PTL_NET_OUT_AT(c, data)), const ptl_net_call *c)
WITHOUT_CTX(cpu_maxpool_backward, ptl_maxpool5_backward(c->dt, PTL_NET_CALL_NHWC_SLICE(c), PTL_NET_IN_AT(c, data),
                                                        PTL_NET_OUT_AT(c, grad), ptl_net_arg_at(IN(c).grad, &IN(c), c->dt),
                                                        IN(c).accumulate), const ptl_net_call *c)
WITHOUT_CTX(cpu_upsample_forward, ptl_upsample2x_forward(c->dt, PTL_NET_CALL_NHWC_SLICE(c), PTL_NET_IN_AT(c, data),
                                                         PTL_NET_OUT_AT(c, data)), const ptl_net_call *c)
WITHOUT_CTX(cpu_upsample_backward, ptl_upsample2x_backward(c->dt, PTL_NET_CALL_NHWC_SLICE(c), PTL_NET_OUT_AT(c, grad),
                                                           PTL_NET_IN_AT(c, grad), IN(c).accumulate),
            const ptl_net_call *c)
WITHOUT_CTX(cpu_attention_forward, ptl_attention_forward(c->dt, PTL_ATTENTION_CALL_DIMS(c), IN(c).data, c->saved,
                                                         c->out[0].data, PTL_NET_CALL_OUT(c, 1, data)),
            const ptl_net_call *c)
WITHOUT_CTX(cpu_attention_backward, ptl_attention_backward(c->dt, PTL_ATTENTION_CALL_DIMS(c), IN(c).data, c->saved,
                                                           c->out[0].grad, PTL_NET_CALL_OUT(c, 1, grad), IN(c).grad),
            const ptl_net_call *c)
WITHOUT_CTX(cpu_head_out, ptl_net_head_out(dt, B, hw, C, A, a0, map, out), ptl_dtype dt, int B, int64_t hw, int C,
            int64_t A, int64_t a0, const void *map, void *out)
WITHOUT_CTX(cpu_head_grad, ptl_net_head_grad(dt, B, hw, C, A, a0, d, gmap, acc), ptl_dtype dt, int B, int64_t hw,
            int C, int64_t A, int64_t a0, const void *d, void *gmap, int acc)

const ptl_net_backend ptl_net_backend_cpu = {
    .name = "cpu",
    .device = PTL_CPU,
    .cast_biases = 0,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .upload = cpu_copy,
    .download = cpu_copy,
    .conv_plans = cpu_conv_plans,
    .conv_plan_free = cpu_conv_plan_free,
    .conv_workspace = cpu_conv_workspace,
    .weight_cast = cpu_weight_cast,
    .weight_grad = cpu_weight_grad,
    .conv_forward = cpu_conv_forward,
    .conv_backward_input = cpu_conv_backward_input,
    .conv_backward_weight = cpu_conv_backward_weight,
    .conv_backward_bias = cpu_conv_backward_bias,
    .batchnorm_forward = cpu_batchnorm_forward,
    .batchnorm_backward = cpu_batchnorm_backward,
    .add = cpu_add,
    .accumulate = cpu_accumulate,
    .channel_copy = cpu_channel_copy,
    .layer = {PTL_NET_COPY_LAYERS,
              [PTL_OP_POOL] = {cpu_maxpool_forward, cpu_maxpool_backward, .slices = PTL_NET_SLICE_IN | PTL_NET_SLICE_OUT},
              [PTL_OP_UP] = {cpu_upsample_forward, cpu_upsample_backward, .slices = PTL_NET_SLICE_IN | PTL_NET_SLICE_OUT},
              [PTL_OP_ATTN] = {cpu_attention_forward, cpu_attention_backward, .overwrites = 1}},
    .head_out = cpu_head_out,
    .head_grad = cpu_head_grad,
};
