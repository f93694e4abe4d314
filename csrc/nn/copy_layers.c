/* Add and Concat as layer rows (executor.h), written once over the calling backend's copy kernels (add,
 * accumulate, copy, channel_copy), so that every backend runs them with its own kernels. */
#include "executor.h"

static int64_t rows(const ptl_net_call *c) { return ptl_net_arg_rows(c, &c->out[0]); }

/* whether the output is some channels of its value (a Concat built in place) */
static int out_slice(const ptl_net_call *c) { return c->out[0].c0 || c->out[0].nc != c->out[0].c; }

/* Into a slice: the first input copied, the second added, the one rounding of a + b as the add kernel. */
int ptl_net_add_forward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    const ptl_net_arg *o = &c->out[0];
    if (!out_slice(c))
        return c->be->add(ctx, c->dt, rows(c) * o->c, c->in[0].data, c->in[1].data, o->data);
    for (int j = 0; j < 2; j++)
        if (c->be->channel_copy(ctx, c->dt, rows(c), o->nc, c->in[j].data, c->in[j].c, 0, o->data, o->c, o->c0, j))
            return -1;
    return 0;
}

/* each input's gradient is the output's: copied by its first writer, added by the others */
int ptl_net_add_backward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    const ptl_net_arg *o = &c->out[0];
    const int64_t n = rows(c) * o->c;
    for (int j = 0; j < c->nin; j++) {
        void *g = c->in[j].grad;
        const int acc = c->in[j].accumulate;
        if (!g || g == o->grad) /* no gradient wanted, or one sharing the output's slot (net_plan.c) */
            continue;
        if (out_slice(c) ? c->be->channel_copy(ctx, c->dt, rows(c), o->nc, o->grad, o->c, o->c0, g, c->in[j].c, 0, acc)
            : acc        ? c->be->accumulate(ctx, c->dt, n, o->grad, g)
                         : c->be->copy(ctx, g, o->grad, (size_t)n * ptl_dtype_size(c->dt)))
            return -1;
    }
    return 0;
}

/* a part built in place (net_plan.h's ptl_net_cat_in_place) is its own destination, and sends no gradient */
int ptl_net_cat_forward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    for (int j = 0, dst = 0; j < c->nin; dst += c->in[j].nc, j++) {
        const ptl_net_arg *in = &c->in[j];
        if (in->data == c->out[0].data && in->c0 == dst)
            continue;
        if (c->be->channel_copy(ctx, c->dt, rows(c), in->nc, in->data, in->c, in->c0, c->out[0].data, c->out[0].c, dst,
                                0))
            return -1;
    }
    return 0;
}

int ptl_net_cat_backward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    for (int j = 0, src = 0; j < c->nin; src += c->in[j].nc, j++) {
        const ptl_net_arg *in = &c->in[j];
        if (in->grad && c->be->channel_copy(ctx, c->dt, rows(c), in->nc, c->out[0].grad, c->out[0].c, src, in->grad,
                                            in->c, in->c0, in->accumulate))
            return -1;
    }
    return 0;
}
