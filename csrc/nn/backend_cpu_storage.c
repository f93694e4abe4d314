/* The reference CPU backend with low-precision storage: every value the CUDA executor keeps in its
 * compute dtype (activations, their gradients, the conv weight copy and the conv weight/bias gradients
 * before they reach the master) is rounded to bfloat16 or float16 (round to nearest even) right after the
 * float32 kernel writes it, while the arithmetic inside each kernel stays float32 and the master storage
 * (parameters, gradients, BatchNorm statistics, head outputs) stays float32, as on CUDA. It is the oracle
 * of the CUDA network in bfloat16/float16 (tests/test_network_cuda.py): the two differ only in rounding
 * inside the kernels (cuDNN's and cuBLAS's float32 accumulation orders, attention's rounded scores), not
 * in what is stored. float32 executors only; chosen as cpu_kernels "bfloat16-storage" /
 * "float16-storage" (backend_cpu_fast.h). */
#include <pthread.h>

#include "../ops/half.h"
#include "backend_cpu_storage.h"

static int round_values(ptl_dtype storage, float *p, int64_t n)
{
    uint32_t *u = (uint32_t *)p;
    if (storage == PTL_BFLOAT16) {
        for (int64_t i = 0; i < n; i++)
            u[i] = ptl_bf16_to_f32_bits(ptl_f32_to_bf16_bits(u[i]));
    } else {
        for (int64_t i = 0; i < n; i++)
            u[i] = ptl_f16_to_f32_bits(ptl_f32_to_f16_bits(u[i]));
    }
    return 0;
}

/* rows x [off, off + c) of a (rows, stride) matrix */
static int round_columns(ptl_dtype storage, float *p, int64_t rows, int c, int stride, int off)
{
    for (int64_t r = 0; r < rows; r++)
        round_values(storage, p + r * stride + off, c);
    return 0;
}

/* What a layer call stores: after a forward its outputs and saved buffer, after a backward the channels of its
 * input gradients it wrote. */
static int round_call(ptl_dtype storage, const ptl_net_call *c, int backward)
{
    for (int k = 0; !backward && k < c->nout; k++)
        if (c->out[k].data)
            round_columns(storage, c->out[k].data, ptl_net_arg_rows(c, &c->out[k]), c->out[k].nc, c->out[k].c,
                          c->out[k].c0);
    if (!backward)
        return round_values(storage, c->saved, ptl_net_op_saved_numel(c->op, c->B, c->in[0].h, c->in[0].w));
    for (int j = 0; j < c->nin; j++)
        if (c->in[j].grad)
            round_columns(storage, c->in[j].grad, ptl_net_arg_rows(c, &c->in[j]), c->in[j].nc, c->in[j].c, c->in[j].c0);
    return 0;
}

#define REF ptl_net_backend_cpu
/* Each table below differs only in the storage dtype its entries round to. */
#define STORAGE_BACKEND(NAME, STORAGE)                                                                             \
    static int NAME##_conv_forward(ptl_exec_ctx *ctx, const void *p, const void *x, const void *w, const void *b,  \
                                   void *y, void *ws, size_t wsb)                                                  \
    {                                                                                                              \
        const ptl_conv2d_desc *d = ptl_net_cpu_plan_desc(p);                                                       \
        return REF.conv_forward(ctx, p, x, w, b, y, ws, wsb) ||                                                    \
               round_values(STORAGE, y, (int64_t)d->n * d->ho * d->wo * d->cout);                                  \
    }                                                                                                              \
    static int NAME##_conv_backward_input(ptl_exec_ctx *ctx, const void *p, const void *dy, const void *w,         \
                                          void *dx, void *ws, size_t wsb)                                          \
    {                                                                                                              \
        const ptl_conv2d_desc *d = ptl_net_cpu_plan_desc(p);                                                       \
        return REF.conv_backward_input(ctx, p, dy, w, dx, ws, wsb) ||                                              \
               round_values(STORAGE, dx, (int64_t)d->n * d->h * d->w * d->cin);                                    \
    }                                                                                                              \
    /* as CUDA adds it: the float32 gradient added, then rounded once */                                           \
    static int NAME##_conv_backward_input_add(ptl_exec_ctx *ctx, const void *p, const void *dy, const void *w,     \
                                              void *dx, void *scratch, void *ws, size_t wsb)                       \
    {                                                                                                              \
        const ptl_conv2d_desc *d = ptl_net_cpu_plan_desc(p);                                                       \
        const int64_t n = (int64_t)d->n * d->h * d->w * d->cin;                                                    \
        return REF.conv_backward_input(ctx, p, dy, w, scratch, ws, wsb) ||                                         \
               REF.accumulate(ctx, PTL_FLOAT32, n, scratch, dx) || round_values(STORAGE, dx, n);                   \
    }                                                                                                              \
    static int NAME##_conv_backward_weight(ptl_exec_ctx *ctx, const void *p, const void *x, const void *dy,        \
                                           void *dw, void *ws, size_t wsb)                                         \
    {                                                                                                              \
        const ptl_conv2d_desc *d = ptl_net_cpu_plan_desc(p);                                                       \
        return REF.conv_backward_weight(ctx, p, x, dy, dw, ws, wsb) ||                                             \
               round_values(STORAGE, dw, (int64_t)d->cout * d->k * d->k * (d->cin / d->groups));                   \
    }                                                                                                              \
    static int NAME##_conv_backward_bias(ptl_exec_ctx *ctx, const void *p, const void *dy, void *db, void *ws,     \
                                         size_t wsb)                                                               \
    {                                                                                                              \
        return REF.conv_backward_bias(ctx, p, dy, db, ws, wsb) ||                                                  \
               round_values(STORAGE, db, ptl_net_cpu_plan_desc(p)->cout);                                          \
    }                                                                                                              \
    static int NAME##_weight_cast(ptl_exec_ctx *ctx, ptl_dtype dt, const ptl_wcast_table *t, const void *params,  \
                                  void *wc)                                                                        \
    {                                                                                                              \
        return REF.weight_cast(ctx, dt, t, params, wc) || round_values(STORAGE, wc, t->total);                     \
    }                                                                                                              \
    static int NAME##_batchnorm_forward(ptl_exec_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *x,          \
                                        const void *g, const void *b, void *rm, void *rv, int tr, ptl_act act,     \
                                        void *sm, void *si, void *y, int ld)                                       \
    {                                                                                                              \
        return REF.batchnorm_forward(ctx, dt, m, c, x, g, b, rm, rv, tr, act, sm, si, y, ld) ||                    \
               round_columns(STORAGE, y, m, c, ld, 0);                                                             \
    }                                                                                                              \
    static int NAME##_batchnorm_backward(ptl_exec_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *x,         \
                                         const void *dy, int ld, const void *g, const void *b, const void *sm,     \
                                         const void *si, int tr, ptl_act act, void *dx, void *dg, void *db)        \
    {                                                                                                              \
        return REF.batchnorm_backward(ctx, dt, m, c, x, dy, ld, g, b, sm, si, tr, act, dx, dg, db) ||              \
               round_values(STORAGE, dx, m * c);                                                                   \
    }                                                                                                              \
    static int NAME##_add(ptl_exec_ctx *ctx, ptl_dtype dt, int64_t n, const void *a, const void *b, void *y)       \
    {                                                                                                              \
        return REF.add(ctx, dt, n, a, b, y) || round_values(STORAGE, y, n);                                        \
    }                                                                                                              \
    static int NAME##_accumulate(ptl_exec_ctx *ctx, ptl_dtype dt, int64_t n, const void *x, void *y)               \
    {                                                                                                              \
        return REF.accumulate(ctx, dt, n, x, y) || round_values(STORAGE, y, n);                                    \
    }                                                                                                              \
    static int NAME##_channel_copy(ptl_exec_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *src, int sc,     \
                                   int so, void *dst, int dc, int dof, int acc)                                    \
    {                                                                                                              \
        return REF.channel_copy(ctx, dt, m, c, src, sc, so, dst, dc, dof, acc) ||                                  \
               (acc && round_columns(STORAGE, dst, m, c, dc, dof));                                                \
    }                                                                                                              \
    static int NAME##_layer_forward(ptl_exec_ctx *ctx, const ptl_net_call *c)                                    \
    {                                                                                                              \
        return REF.layer[c->op->kind].forward(ctx, c) || round_call(STORAGE, c, 0);                                \
    }                                                                                                              \
    static int NAME##_layer_backward(ptl_exec_ctx *ctx, const ptl_net_call *c)                                   \
    {                                                                                                              \
        return REF.layer[c->op->kind].backward(ctx, c) || round_call(STORAGE, c, 1);                               \
    }                                                                                                              \
    static int NAME##_head_grad(ptl_exec_ctx *ctx, ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0,  \
                                const void *d, void *gmap, int acc)                                                \
    {                                                                                                              \
        return REF.head_grad(ctx, dt, B, hw, C, A, a0, d, gmap, acc) || round_values(STORAGE, gmap, B * hw * C);   \
    }                                                                                                              \
    static ptl_net_backend NAME##_table(void)                                                                      \
    {                                                                                                              \
        ptl_net_backend t = REF;                                                                                   \
        t.name = #NAME;                                                                                            \
        t.cast_biases = 1; /* as CUDA: biases through the rounded weight copy, their gradients too */              \
        t.conv_forward = NAME##_conv_forward;                                                                      \
        t.conv_backward_input = NAME##_conv_backward_input;                                                        \
        t.conv_backward_input_add = NAME##_conv_backward_input_add;                                                \
        t.conv_backward_weight = NAME##_conv_backward_weight;                                                      \
        t.conv_backward_bias = NAME##_conv_backward_bias;                                                          \
        t.weight_cast = NAME##_weight_cast;                                                                        \
        t.batchnorm_forward = NAME##_batchnorm_forward;                                                            \
        t.batchnorm_backward = NAME##_batchnorm_backward;                                                          \
        t.add = NAME##_add;                                                                                        \
        t.accumulate = NAME##_accumulate;                                                                          \
        t.channel_copy = NAME##_channel_copy;                                                                      \
        for (int k = 0; k < PTL_NET_OP_KINDS; k++)                                                                 \
            if (t.layer[k].forward) {                                                                              \
                t.layer[k].forward = NAME##_layer_forward;                                                         \
                t.layer[k].backward = NAME##_layer_backward;                                                       \
            }                                                                                                      \
        t.head_grad = NAME##_head_grad;                                                                            \
        return t;                                                                                                  \
    }

STORAGE_BACKEND(bfloat16_storage, PTL_BFLOAT16)
STORAGE_BACKEND(float16_storage, PTL_FLOAT16)

static ptl_net_backend bf16_table, f16_table;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void make_tables(void)
{
    bf16_table = bfloat16_storage_table();
    f16_table = float16_storage_table();
}

const ptl_net_backend *ptl_net_backend_cpu_storage(ptl_dtype storage)
{
    pthread_once(&tables_once, make_tables);
    return storage == PTL_BFLOAT16 ? &bf16_table : storage == PTL_FLOAT16 ? &f16_table : NULL;
}
