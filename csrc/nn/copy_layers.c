/* Add and Concat as layer rows (executor.h), written once over the calling backend's copy kernels (add,
 * accumulate, copy, channel_copy), so that every backend runs them with its own kernels. */
#include "executor.h"

static int64_t rows(const ptl_net_call *c) { return ptl_net_arg_rows(c, &c->out[0]); }

int ptl_net_add_forward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    return c->be->add(ctx, c->dt, rows(c) * c->out[0].c, c->in[0].data, c->in[1].data, c->out[0].data);
}

/* each input's gradient is the output's: copied by its first writer, added by the others */
int ptl_net_add_backward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    const int64_t n = rows(c) * c->out[0].c;
    for (int j = 0; j < c->nin; j++) {
        void *g = c->in[j].grad;
        if (g && (c->in[j].accumulate ? c->be->accumulate(ctx, c->dt, n, c->out[0].grad, g)
                                      : c->be->copy(ctx, g, c->out[0].grad, (size_t)n * ptl_dtype_size(c->dt))))
            return -1;
    }
    return 0;
}

int ptl_net_cat_forward(ptl_exec_ctx *ctx, const ptl_net_call *c)
{
    for (int j = 0, dst = 0; j < c->nin; dst += c->in[j].nc, j++) {
        const ptl_net_arg *in = &c->in[j];
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
