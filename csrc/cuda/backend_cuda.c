/* The executor's CUDA backend (../nn/executor.h): the device context's allocator and stream, cuDNN /
 * cuBLAS conv plans from the device's plan cache, the CUDA layer kernels, and the graph recorder. */
#include "../nn/attention.h"
#include "../nn/batchnorm.h"
#include "../nn/concat.h"
#include "../nn/elementwise.h"
#include "../nn/executor.h"
#include "../nn/maxpool.h"
#include "../nn/upsample.h"
#include "../nn/weight_cast.h"
#include "conv2d.h"
#include "conv2d_bn.h"
#include "device.h"
#include "layer_scratch.h"
#include "recorder.h"
#include "side_stream.h"

static int cuda_activate(ptl_cuda_ctx *ctx)
{
    if (cudaSetDevice(ctx->device) != cudaSuccess)
        return ptl_cuda_fail("cudaSetDevice", cudaGetLastError());
    return 0;
}

static int cuda_alloc(ptl_cuda_ctx *ctx, size_t bytes, ptl_net_buf *b)
{
    return ptl_alloc_malloc(ctx->alloc, 0, bytes, &b->ptr, &b->block);
}

static void cuda_release(ptl_cuda_ctx *ctx, ptl_net_buf *b) { ptl_alloc_free(ctx->alloc, b->block); }

static int cuda_copy(ptl_cuda_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    PTL_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream));
    return 0;
fail:
    return -1;
}

static int cuda_upload(ptl_cuda_ctx *ctx, void *dst, const void *host, size_t bytes)
{
    PTL_CUDA_TRY(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    PTL_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
    return 0;
fail:
    return -1;
}

static int cuda_download(ptl_cuda_ctx *ctx, void *host, const void *src, size_t bytes)
{
    PTL_CUDA_TRY(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    PTL_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
    return 0;
fail:
    return -1;
}

/* ------------------------------------------------------------------------- layers */

/* the layer rows (executor.h's ptl_net_call) */
#define IN(c) (c)->in[0]

/* A training forward keeps each output's argmax cell (c->kept), so that the backward is a gather alone. */
static int cuda_maxpool_forward(ptl_cuda_ctx *ctx, const ptl_net_call *c)
{
    return ptl_maxpool5_forward_cuda(ctx, c->dt, PTL_NET_CALL_NHWC_SLICE(c), PTL_NET_IN_AT(c, data),
                                     PTL_NET_OUT_AT(c, data), c->kept);
}

static int cuda_maxpool_backward(ptl_cuda_ctx *ctx, const ptl_net_call *c)
{
    return ptl_maxpool5_backward_cuda(ctx, c->dt, PTL_NET_CALL_NHWC_SLICE(c), PTL_NET_IN_AT(c, data), c->kept,
                                      PTL_NET_OUT_AT(c, grad), ptl_net_arg_at(IN(c).grad, &IN(c), c->dt),
                                      IN(c).accumulate);
}

static size_t cuda_maxpool_kept_bytes(const ptl_net_call *c)
{
    return ptl_maxpool5_cuda_scratch_bytes(c->B, IN(c).h, IN(c).w, IN(c).nc);
}

/* a backward without kept argmaxes finds them in the layer scratch */
static size_t cuda_maxpool_scratch_bytes(const ptl_net_call *c)
{
    return c->kept ? 0 : ptl_maxpool5_cuda_scratch_bytes(c->B, IN(c).h, IN(c).w, IN(c).nc);
}

static int cuda_upsample_forward(ptl_cuda_ctx *ctx, const ptl_net_call *c)
{
    return ptl_upsample2x_forward_cuda(ctx, c->dt, PTL_NET_CALL_NHWC_SLICE(c), PTL_NET_IN_AT(c, data),
                                       PTL_NET_OUT_AT(c, data));
}

static int cuda_upsample_backward(ptl_cuda_ctx *ctx, const ptl_net_call *c)
{
    return ptl_upsample2x_backward_cuda(ctx, c->dt, PTL_NET_CALL_NHWC_SLICE(c), PTL_NET_OUT_AT(c, grad),
                                        PTL_NET_IN_AT(c, grad), IN(c).accumulate);
}

/* An Add whose output is a channel slice (a Concat's part built in place) in one launch each way; else the
 * rows every backend shares (copy_layers.c), whose channel copies give the same bits in two launches. */
static int add_into_slice(const ptl_net_call *c)
{
    const ptl_net_arg *o = &c->out[0];
    return (o->c0 || o->nc != o->c) && c->nin == 2 && c->in[0].c == o->nc && c->in[1].c == o->nc;
}

/* an input's gradient for the fused backward: NULL where none is wanted or it shares the output's slot */
static void *add_grad(const ptl_net_call *c, int j) { return c->in[j].grad == c->out[0].grad ? NULL : c->in[j].grad; }

static int cuda_add_forward(ptl_cuda_ctx *ctx, const ptl_net_call *c)
{
    if (!add_into_slice(c))
        return ptl_net_add_forward(ctx, c);
    return ptl_add_rows_cuda(ctx, c->dt, ptl_net_arg_rows(c, &c->out[0]), c->out[0].nc, c->in[0].data,
                             c->in[1].data, PTL_NET_OUT_AT(c, data));
}

static int cuda_add_backward(ptl_cuda_ctx *ctx, const ptl_net_call *c)
{
    if (!add_into_slice(c))
        return ptl_net_add_backward(ctx, c);
    return ptl_add_rows_backward_cuda(ctx, c->dt, ptl_net_arg_rows(c, &c->out[0]), c->out[0].nc,
                                      PTL_NET_OUT_AT(c, grad), add_grad(c, 0), c->in[0].accumulate, add_grad(c, 1),
                                      c->in[1].accumulate);
}

static int cuda_attention_forward(ptl_cuda_ctx *ctx, const ptl_net_call *c)
{
    return ptl_attention_forward_cuda(ctx, c->dt, PTL_ATTENTION_CALL_DIMS(c), IN(c).data, c->saved, c->out[0].data,
                                      PTL_NET_CALL_OUT(c, 1, data));
}

static int cuda_attention_backward(ptl_cuda_ctx *ctx, const ptl_net_call *c)
{
    return ptl_attention_backward_cuda(ctx, c->dt, PTL_ATTENTION_CALL_DIMS(c), IN(c).data, c->saved, c->out[0].grad,
                                       PTL_NET_CALL_OUT(c, 1, grad), IN(c).grad);
}

/* the CUDA attention's scratch depends on the positions and heads only */
static size_t cuda_attention_scratch_bytes(const ptl_net_call *c)
{
    return ptl_attention_cuda_scratch_bytes(c->dt, IN(c).h * IN(c).w, c->op->heads);
}

/* ------------------------------------------------------------------------- conv plans */

static int cuda_conv_plans(ptl_cuda_ctx *ctx, int n, const ptl_conv2d_desc *d, ptl_dtype dt, const ptl_net_conv_opts *o,
                           const uint8_t *bias, void **plans)
{
    (void)bias; /* the CUDA plan serves forwards with and without a bias */
    ptl_conv2d_plan_opts po = ptl_conv2d_plan_opts_default();
    po.deterministic = o->deterministic;
    po.allow_tf32 = o->allow_tf32;
    po.find = o->find;
    po.forward_only = o->forward_only;
    po.workspace_limit = o->workspace_limit;
    return ptl_conv2d_plans_acquire(ctx, n, d, dt, &po, (ptl_conv2d_plan **)plans);
}

static void cuda_conv_plan_free(void *plan) { ptl_conv2d_plan_destroy((ptl_conv2d_plan *)plan); }

static size_t cuda_conv_workspace(const void *plan, ptl_conv_ws_part part)
{
    const ptl_conv2d_plan *p = (const ptl_conv2d_plan *)plan;
    return part == PTL_CONV_WS_PARAM_GRADS ? ptl_conv2d_plan_param_grads_workspace(p)
           : part == PTL_CONV_WS_DATA      ? ptl_conv2d_plan_data_workspace(p)
                                           : ptl_conv2d_plan_workspace(p);
}

static int cuda_conv_forward(ptl_cuda_ctx *ctx, const void *plan, const void *x, const void *w, const void *bias,
                             void *y, void *ws, size_t ws_bytes)
{
    return ptl_conv2d_forward_cuda(ctx, (const ptl_conv2d_plan *)plan, x, w, bias, y, ws, ws_bytes);
}

static int cuda_conv_batchnorm_forward(ptl_cuda_ctx *ctx, const void *plan, const void *x, const void *w, void *z,
                                       void *ws, size_t ws_bytes, const void *gamma, const void *beta,
                                       void *running_mean, void *running_var, ptl_act act, void *save_mean,
                                       void *save_invstd, void *y, int ld)
{
    return ptl_conv2d_bn_forward_cuda(ctx, (const ptl_conv2d_plan *)plan, x, w, z, ws, ws_bytes, gamma, beta,
                                      running_mean, running_var, act, save_mean, save_invstd, y, ld);
}

static int cuda_conv_backward_input(ptl_cuda_ctx *ctx, const void *plan, const void *dy, const void *w, void *dx,
                                    void *ws, size_t ws_bytes)
{
    return ptl_conv2d_backward_input_cuda(ctx, (const ptl_conv2d_plan *)plan, dy, w, dx, ws, ws_bytes);
}

static int cuda_conv_backward_input_add(ptl_cuda_ctx *ctx, const void *plan, const void *dy, const void *w,
                                        void *dx, void *scratch, void *ws, size_t ws_bytes)
{
    return ptl_conv2d_backward_input_add_cuda(ctx, (const ptl_conv2d_plan *)plan, dy, w, dx, scratch, ws, ws_bytes);
}

static int cuda_conv_backward_weight(ptl_cuda_ctx *ctx, const void *plan, const void *x, const void *dy, void *dw,
                                     void *ws, size_t ws_bytes)
{
    return ptl_conv2d_backward_weight_cuda(ctx, (const ptl_conv2d_plan *)plan, x, dy, dw, ws, ws_bytes);
}

static int cuda_conv_backward_bias(ptl_cuda_ctx *ctx, const void *plan, const void *dy, void *db, void *ws,
                                   size_t ws_bytes)
{
    return ptl_conv2d_backward_bias_cuda(ctx, (const ptl_conv2d_plan *)plan, dy, db, ws, ws_bytes);
}

const ptl_net_backend ptl_net_backend_cuda = {
    .name = "cuda",
    .device = PTL_CUDA,
    .cast_biases = 1,
    .activate = cuda_activate,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .zero = ptl_zero_cuda,
    .copy = cuda_copy,
    .upload = cuda_upload,
    .download = cuda_download,
    .conv_plans = cuda_conv_plans,
    .conv_plan_free = cuda_conv_plan_free,
    .conv_workspace = cuda_conv_workspace,
    .bn_scratch_bytes = ptl_batchnorm_cuda_scratch_bytes,
    .reserve_scratch = ptl_layers_cuda_reserve,
    .weight_cast = ptl_net_weight_cast_cuda,
    .weight_grad = ptl_net_weight_grad_cuda,
    .conv_forward = cuda_conv_forward,
    .conv_backward_input = cuda_conv_backward_input,
    .conv_backward_input_add = cuda_conv_backward_input_add,
    .conv_backward_weight = cuda_conv_backward_weight,
    .conv_backward_bias = cuda_conv_backward_bias,
    .batchnorm_forward = ptl_batchnorm_forward_cuda,
    .conv_batchnorm_forward = cuda_conv_batchnorm_forward,
    .batchnorm_backward = ptl_batchnorm_backward_cuda,
    .add = ptl_add_cuda,
    .accumulate = ptl_accumulate_cuda,
    .channel_copy = ptl_channel_copy_cuda,
    .layer = {PTL_NET_CAT_LAYER,
              [PTL_OP_ADD] = {cuda_add_forward, cuda_add_backward, .slices = PTL_NET_SLICE_OUT},
              [PTL_OP_POOL] = {cuda_maxpool_forward, cuda_maxpool_backward, cuda_maxpool_scratch_bytes,
                               .slices = PTL_NET_SLICE_IN | PTL_NET_SLICE_OUT, .kept_bytes = cuda_maxpool_kept_bytes},
              [PTL_OP_UP] = {cuda_upsample_forward, cuda_upsample_backward, .slices = PTL_NET_SLICE_IN | PTL_NET_SLICE_OUT},
              [PTL_OP_ATTN] = {cuda_attention_forward, cuda_attention_backward, cuda_attention_scratch_bytes, 1}},
    .head_out = ptl_net_head_out_cuda,
    .head_grad = ptl_net_head_grad_cuda,
    .side_open = ptl_cuda_side_open,
    .side_fork = ptl_cuda_side_fork,
    .side_mark = ptl_cuda_side_mark,
    .side_await = ptl_cuda_side_await,
    .record = ptl_net_cuda_record,
    .replay = ptl_net_cuda_replay,
    .recorded = ptl_net_cuda_recorded,
    .recording_free = ptl_net_cuda_recording_free,
    .recording_nodes = ptl_net_cuda_recording_nodes,
};
