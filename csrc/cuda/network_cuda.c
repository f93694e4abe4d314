/* The CUDA executor of the YOLO26 network: the CPU description's op list (../nn/network.c) run with
 * the CUDA layer kernels and per-shape cuDNN plans. It mirrors network.c's executor op for op (same
 * forward order, reverse-order backward, same no_dx rule, the same additions in the same order) so the
 * two compute the same function; see network_cuda.h for the precision scheme. Unlike the CPU executor,
 * gradients of values whose lives in the backward do not overlap share memory (plan_gradients), and
 * the first write of each gradient overwrites instead of adding to a zeroed arena. */
#include "network_cuda.h"

#include "graph.h"

#include <stdlib.h>
#include <string.h>

#include "../nn/activation.h"
#include "../nn/attention.h"
#include "../nn/batchnorm.h"
#include "../nn/concat.h"
#include "../nn/elementwise.h"
#include "../nn/maxpool.h"
#include "../nn/upsample.h"
#include "conv2d.h"
#include "device.h"

/* Elements every device sub-buffer starts on: 256 bytes for float32, what cuDNN's vectorised kernels
 * like. */
#define ALIGN_ELEMS 64

typedef struct {
    void *ptr, *block;
} dbuf;

#define NET_SHAPES 2

typedef struct {
    int B, H, W; /* 0: slot empty */
    int64_t A, level_off[3];
    int64_t *voff;     /* per value: element offset in act */
    int64_t *goff;     /* per value: element offset of its gradient in gact (slots are shared: plan_gradients) */
    int64_t *attn_off; /* per op: element offset in attn */
    int64_t act_numel, gact_numel, attn_numel, max_value_numel;
    dbuf act, gact, attn, scratch, ws;
    size_t ws_bytes;
    dbuf out[2][2];
    ptl_conv2d_plan **plans; /* per op (convs only) */
    uint64_t last_use;

    /* the recording (ptl_network_cuda_record): a forward graph and a backward graph, and the mode */
    ptl_cuda_graph *rec_fwd, *rec_bwd;
    int rec_training;
    uint64_t rec_scratch_gen; /* the layer scratch's generation the graphs point into */
} net_shape;

struct ptl_network_cuda {
    ptl_runtime *rt;
    int device;
    ptl_dtype dt;
    size_t esz;
    int nc, training, fwd_training, have_forward;
    int stride[3];
    int input;
    int nvalues, nops;
    ptl_net_value *values; /* copies; value offsets here are this executor's */
    ptl_net_op *ops;
    int64_t nparams, nbuffers, nstats;
    ptl_conv2d_plan_opts opts;

    /* fixed: float32 flat storage and the compute-dtype weight copies */
    dbuf params, grads, buffers, stats;
    dbuf wc, wgc, wtab;
    int nw;
    int64_t wtotal;
    int64_t *op_w, *op_b; /* per op: offset of its weight / bias in wc (-1: none) */

    /* Gradient slots (shape independent; see plan_gradients): each value's gradient lives from the
     * backward step of its first writer to that of its producer, and values whose lives do not overlap
     * share memory. The first writer overwrites (first bit set), so nothing is zeroed in bulk. */
    int *gborn, *gdie;  /* per value: backward steps (-1: never written) */
    uint32_t *gfirst;   /* per op: bit j = first writer of input j (0 in, 1 in2, 2+p cat part p) */
    int *gzero_op;      /* per value: op before whose backward its slot is zeroed (-1: none) */
    int *zero_list, *zero_begin; /* the values of gzero_op grouped by op: zero_list[zero_begin[i]..[i+1]) */

    /* Per-shape state, for the last NET_SHAPES shapes used (a training fit's full batches and its
     * partial last batch), so that switching between them neither remakes plans nor drops a recording. */
    net_shape slot[NET_SHAPES];
    net_shape *cur; /* the current shape's slot (B == 0: none yet) */
    uint64_t clock; /* use counter: the least recently used slot is reused first */
};

static int64_t align_up(int64_t n) { return (n + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS; }

static int dalloc(ptl_cuda_ctx *ctx, size_t bytes, dbuf *b)
{
    b->ptr = b->block = NULL;
    return ptl_alloc_malloc(ctx->alloc, 0, bytes ? bytes : 1, &b->ptr, &b->block);
}

static void dfree(ptl_cuda_ctx *ctx, dbuf *b)
{
    if (b->block)
        ptl_alloc_free(ctx->alloc, b->block);
    b->ptr = b->block = NULL;
}

static int is_conv(const ptl_net_op *op) { return op->kind == PTL_OP_CONV || op->kind == PTL_OP_CONV_BIAS; }

/* The weight-cast table: every conv weight, then (for a conv with bias) its bias, in op order. */
static int build_wtab(ptl_network_cuda *net, ptl_cuda_ctx *ctx)
{
    ptl_wcast_entry *tab = NULL;
    int n = 0;
    int64_t cursor = 0;
    for (int i = 0; i < net->nops; i++)
        if (is_conv(&net->ops[i]))
            n += net->ops[i].kind == PTL_OP_CONV_BIAS ? 2 : 1;
    tab = calloc((size_t)(n ? n : 1), sizeof *tab);
    net->op_w = malloc((size_t)net->nops * sizeof(int64_t));
    net->op_b = malloc((size_t)net->nops * sizeof(int64_t));
    if (!tab || !net->op_w || !net->op_b) {
        ptl_set_error(PTL_ERR_MEMORY, "network_cuda: out of host memory");
        goto fail;
    }
    n = 0;
    for (int i = 0; i < net->nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        net->op_w[i] = net->op_b[i] = -1;
        if (!is_conv(op))
            continue;
        int cin_g = op->cin / op->g;
        tab[n] = (ptl_wcast_entry){op->w_off, cursor, op->cout, cin_g, op->k, 0};
        net->op_w[i] = cursor;
        cursor += align_up((int64_t)op->cout * cin_g * op->k * op->k);
        n++;
        if (op->kind == PTL_OP_CONV_BIAS) {
            tab[n] = (ptl_wcast_entry){op->bias_off, cursor, op->cout, 1, 1, 0};
            net->op_b[i] = cursor;
            cursor += align_up(op->cout);
            n++;
        }
    }
    net->nw = n;
    net->wtotal = cursor;
    ptl_device dev = {PTL_CUDA, net->device};
    PTL_CHECK(dalloc(ctx, (size_t)n * sizeof *tab, &net->wtab));
    PTL_CHECK(ptl_copy_bytes(net->rt, net->wtab.ptr, dev, tab, (ptl_device){PTL_CPU, 0}, (size_t)n * sizeof *tab));
    PTL_CHECK(dalloc(ctx, (size_t)cursor * net->esz, &net->wc));
    PTL_CHECK(dalloc(ctx, (size_t)cursor * net->esz, &net->wgc));
    /* padding stays zero in both, so no stale bits are ever read as weights */
    PTL_CHECK(ptl_memset_device(net->rt, dev, net->wc.ptr, 0, (size_t)cursor * net->esz));
    PTL_CHECK(ptl_memset_device(net->rt, dev, net->wgc.ptr, 0, (size_t)cursor * net->esz));
    free(tab);
    return 0;
fail:
    free(tab);
    return -1;
}

/* Copies one flat host storage (float32 or float64) to/from a float32 device buffer. */
static int flat_copy(ptl_network_cuda *net, float *dptr, void *host, ptl_dtype hdt, int64_t n, int to_device)
{
    ptl_device dev = {PTL_CUDA, net->device}, cpu = {PTL_CPU, 0};
    if (n == 0)
        return 0;
    if (hdt == PTL_FLOAT32)
        return to_device ? ptl_copy_bytes(net->rt, dptr, dev, host, cpu, (size_t)n * 4)
                         : ptl_copy_bytes(net->rt, host, cpu, dptr, dev, (size_t)n * 4);
    float *tmp = malloc((size_t)n * sizeof(float));
    if (!tmp)
        return ptl_set_error(PTL_ERR_MEMORY, "network_cuda: out of host memory");
    int rc;
    if (to_device) {
        for (int64_t i = 0; i < n; i++)
            tmp[i] = (float)((const double *)host)[i];
        rc = ptl_copy_bytes(net->rt, dptr, dev, tmp, cpu, (size_t)n * 4);
    } else {
        rc = ptl_copy_bytes(net->rt, tmp, cpu, dptr, dev, (size_t)n * 4);
        if (rc == 0)
            for (int64_t i = 0; i < n; i++)
                ((double *)host)[i] = tmp[i];
    }
    free(tmp);
    return rc;
}

int ptl_network_cuda_copy(ptl_network_cuda *net, ptl_network *cpu, const char *which, int to_device)
{
    if (cpu->nparams != net->nparams || cpu->nbuffers != net->nbuffers || cpu->nc != net->nc)
        return ptl_set_error(PTL_ERR_VALUE, "network_cuda: the CPU network has a different structure");
    ptl_cuda_ctx *ctx;
    if (ptl_cuda_ctx_get(net->rt, net->device, &ctx))
        return -1;
    if (!strcmp(which, "params"))
        return flat_copy(net, net->params.ptr, cpu->params, cpu->dtype, net->nparams, to_device);
    if (!strcmp(which, "grads"))
        return flat_copy(net, net->grads.ptr, cpu->grads, cpu->dtype, net->nparams, to_device);
    if (!strcmp(which, "buffers"))
        return flat_copy(net, net->buffers.ptr, cpu->buffers, cpu->dtype, net->nbuffers, to_device);
    return ptl_set_error(PTL_ERR_VALUE, "which: expected 'params', 'grads' or 'buffers', got '%s'", which);
}

static int value_channels(const ptl_network_cuda *net, int v) { return net->values[v].C; }

/* The order in which the backward writes and reads gradients, replayed once: for every value the first
 * and last backward step that touch its gradient, for every write whether it is the first (then it
 * overwrites), and which slots must be zeroed because their first write covers only some channels or
 * nothing writes them before they are read. */
static int plan_gradients(ptl_network_cuda *net)
{
    const int nv = net->nvalues, nops = net->nops;
    char *touched = calloc((size_t)nv, 1);
    net->gborn = malloc((size_t)nv * sizeof(int));
    net->gdie = malloc((size_t)nv * sizeof(int));
    net->gzero_op = malloc((size_t)nv * sizeof(int));
    net->gfirst = calloc((size_t)nops, sizeof(uint32_t));
    if (!touched || !net->gborn || !net->gdie || !net->gzero_op || !net->gfirst) {
        free(touched);
        return ptl_set_error(PTL_ERR_MEMORY, "network_cuda: out of host memory");
    }
    for (int v = 0; v < nv; v++) {
        net->gborn[v] = net->gdie[v] = net->gzero_op[v] = -1;
    }
    net->gdie[net->input] = nops; /* the image gradient is read after the last step */
    for (int t = 0; t < nops; t++) {
        const int i = nops - 1 - t;
        const ptl_net_op *op = &net->ops[i];
        /* reads: the op's own outputs (and the conv's z, written and read within this step) */
        const int outs[3] = {op->out, op->z, op->kind == PTL_OP_ATTN ? op->out2 : -1};
        for (int j = 0; j < 3; j++) {
            const int v = outs[j];
            if (v < 0)
                continue;
            if (j == 1) { /* z: written by the BatchNorm backward of this very step */
                net->gborn[v] = t;
                touched[v] = 1;
            } else if (!touched[v]) { /* read but never written: must read as zero */
                net->gborn[v] = t;
                net->gzero_op[v] = i;
                touched[v] = 1;
            }
            net->gdie[v] = t;
        }
        /* writes */
        int nin = 0, ins[2 + PTL_NET_MAX_PARTS], full[2 + PTL_NET_MAX_PARTS];
        switch (op->kind) {
        case PTL_OP_CONV:
        case PTL_OP_CONV_BIAS:
        case PTL_OP_ATTN:
            if (!op->no_dx) {
                ins[0] = op->in;
                full[0] = 1;
                nin = 1;
            }
            break;
        case PTL_OP_ADD:
            ins[0] = op->in;
            ins[1] = op->in2;
            full[0] = full[1] = 1;
            nin = 2;
            break;
        case PTL_OP_CAT:
            for (int p = 0; p < op->nparts; p++) {
                ins[2 + p] = op->parts[p].value;
                full[2 + p] = op->parts[p].c0 == 0 && op->parts[p].nc == value_channels(net, op->parts[p].value);
            }
            ins[0] = ins[1] = -1;
            nin = 2 + op->nparts;
            break;
        default: /* pool, up, head */
            ins[0] = op->in;
            full[0] = 1;
            nin = 1;
            break;
        }
        for (int j = 0; j < nin; j++) {
            const int v = ins[j];
            if (v < 0 || touched[v])
                continue;
            touched[v] = 1;
            net->gborn[v] = t;
            net->gfirst[i] |= 1u << j;
            if (!full[j])
                net->gzero_op[v] = i;
        }
    }
    free(touched);
    net->zero_list = malloc((size_t)(nv ? nv : 1) * sizeof(int));
    net->zero_begin = malloc((size_t)(nops + 1) * sizeof(int));
    if (!net->zero_list || !net->zero_begin)
        return ptl_set_error(PTL_ERR_MEMORY, "network_cuda: out of host memory");
    int k = 0;
    for (int i = 0; i < nops; i++) {
        net->zero_begin[i] = k;
        for (int v = 0; v < nv; v++)
            if (net->gzero_op[v] == i)
                net->zero_list[k++] = v;
    }
    net->zero_begin[nops] = k;
    return 0;
}

/* First-fit placement of the gradient slots by birth step; returns the arena size in elements. */
static int64_t place_gradients(ptl_network_cuda *net, const int64_t *size)
{
    net_shape *const S = net->cur;
    const int nv = net->nvalues;
    int64_t total = 0;
    int *order = malloc((size_t)nv * sizeof(int)), *placed = malloc((size_t)nv * sizeof(int));
    if (!order || !placed) {
        free(order);
        free(placed);
        return -1;
    }
    int n = 0, np = 0;
    for (int t = 0; t <= net->nops; t++)
        for (int v = 0; v < nv; v++)
            if (net->gborn[v] == t)
                order[n++] = v;
    for (int k = 0; k < n; k++) {
        const int v = order[k];
        int64_t off = 0;
        for (;;) {
            int moved = 0;
            for (int q = 0; q < np; q++) {
                const int u = placed[q];
                if (net->gdie[u] < net->gborn[v])
                    continue; /* dead before v is born */
                if (off < S->goff[u] + size[u] && S->goff[u] < off + size[v]) {
                    off = S->goff[u] + size[u];
                    moved = 1;
                }
            }
            if (!moved)
                break;
        }
        S->goff[v] = off;
        placed[np++] = v;
        total = off + size[v] > total ? off + size[v] : total;
    }
    free(order);
    free(placed);
    return total;
}

ptl_network_cuda *ptl_network_cuda_create(ptl_runtime *rt, const ptl_network *cpu, int device, ptl_dtype compute)
{
    ptl_network_cuda *net = NULL;
    ptl_cuda_ctx *ctx;
    if (compute != PTL_FLOAT32 && compute != PTL_BFLOAT16 && compute != PTL_FLOAT16) {
        ptl_set_error(PTL_ERR_VALUE, "dtype: the CUDA network computes in float32, bfloat16 or float16, got %s",
                      ptl_dtype_name(compute));
        return NULL;
    }
    if (ptl_cuda_ctx_get(rt, device, &ctx))
        return NULL;
    net = calloc(1, sizeof *net);
    if (!net) {
        ptl_set_error(PTL_ERR_MEMORY, "network_cuda: out of host memory");
        return NULL;
    }
    net->rt = rt;
    net->device = device;
    net->dt = compute;
    net->esz = ptl_dtype_size(compute);
    net->nc = cpu->nc;
    net->training = cpu->training;
    memcpy(net->stride, cpu->stride, sizeof net->stride);
    net->input = cpu->input;
    net->nvalues = cpu->nvalues;
    net->nops = cpu->nops;
    net->nparams = cpu->nparams;
    net->nbuffers = cpu->nbuffers;
    net->nstats = cpu->nstats;
    net->opts = ptl_conv2d_plan_opts_default();
    net->values = malloc((size_t)net->nvalues * sizeof *net->values);
    net->ops = malloc((size_t)net->nops * sizeof *net->ops);
    net->cur = &net->slot[0];
    if (!net->values || !net->ops) {
        ptl_set_error(PTL_ERR_MEMORY, "network_cuda: out of host memory");
        goto fail;
    }
    for (int k = 0; k < NET_SHAPES; k++) {
        net_shape *s = &net->slot[k];
        s->voff = calloc((size_t)net->nvalues, sizeof(int64_t));
        s->goff = calloc((size_t)net->nvalues, sizeof(int64_t));
        s->attn_off = calloc((size_t)net->nops, sizeof(int64_t));
        s->plans = calloc((size_t)net->nops, sizeof *s->plans);
        if (!s->voff || !s->goff || !s->attn_off || !s->plans) {
            ptl_set_error(PTL_ERR_MEMORY, "network_cuda: out of host memory");
            goto fail;
        }
    }
    memcpy(net->values, cpu->values, (size_t)net->nvalues * sizeof *net->values);
    memcpy(net->ops, cpu->ops, (size_t)net->nops * sizeof *net->ops);
    PTL_CHECK(dalloc(ctx, (size_t)net->nparams * 4, &net->params));
    PTL_CHECK(dalloc(ctx, (size_t)net->nparams * 4, &net->grads));
    PTL_CHECK(dalloc(ctx, (size_t)net->nbuffers * 4, &net->buffers));
    PTL_CHECK(dalloc(ctx, (size_t)net->nstats * 4, &net->stats));
    PTL_CHECK(ptl_memset_device(rt, (ptl_device){PTL_CUDA, device}, net->grads.ptr, 0, (size_t)net->nparams * 4));
    PTL_CHECK(ptl_memset_device(rt, (ptl_device){PTL_CUDA, device}, net->stats.ptr, 0, (size_t)net->nstats * 4));
    PTL_CHECK(plan_gradients(net));
    PTL_CHECK(build_wtab(net, ctx));
    PTL_CHECK(flat_copy(net, net->params.ptr, cpu->params, cpu->dtype, net->nparams, 1));
    PTL_CHECK(flat_copy(net, net->buffers.ptr, cpu->buffers, cpu->dtype, net->nbuffers, 1));
    return net;
fail:
    ptl_network_cuda_free(net);
    return NULL;
}

static void retire_slot(net_shape *s)
{
    ptl_cuda_graph_destroy(s->rec_fwd);
    ptl_cuda_graph_destroy(s->rec_bwd);
    s->rec_fwd = s->rec_bwd = NULL;
}

void ptl_network_cuda_retire(ptl_network_cuda *net)
{
    for (int k = 0; k < NET_SHAPES; k++)
        retire_slot(&net->slot[k]);
}

static void free_slot(ptl_network_cuda *net, ptl_cuda_ctx *ctx, net_shape *s)
{
    retire_slot(s);
    if (s->plans)
        for (int i = 0; i < net->nops; i++) {
            ptl_conv2d_plan_destroy(s->plans[i]);
            s->plans[i] = NULL;
        }
    dfree(ctx, &s->act);
    dfree(ctx, &s->gact);
    dfree(ctx, &s->attn);
    dfree(ctx, &s->scratch);
    dfree(ctx, &s->ws);
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 2; j++)
            dfree(ctx, &s->out[b][j]);
    s->ws_bytes = 0;
    s->B = s->H = s->W = 0;
    s->A = 0;
    if (s == net->cur)
        net->have_forward = 0;
}

void ptl_network_cuda_free(ptl_network_cuda *net)
{
    ptl_cuda_ctx *ctx;
    if (!net)
        return;
    if (ptl_cuda_ctx_get(net->rt, net->device, &ctx) == 0) {
        for (int k = 0; k < NET_SHAPES; k++)
            free_slot(net, ctx, &net->slot[k]);
        dfree(ctx, &net->params);
        dfree(ctx, &net->grads);
        dfree(ctx, &net->buffers);
        dfree(ctx, &net->stats);
        dfree(ctx, &net->wc);
        dfree(ctx, &net->wgc);
        dfree(ctx, &net->wtab);
    }
    for (int k = 0; k < NET_SHAPES; k++) {
        free(net->slot[k].voff);
        free(net->slot[k].goff);
        free(net->slot[k].attn_off);
        free(net->slot[k].plans);
    }
    free(net->values);
    free(net->ops);
    free(net->gborn);
    free(net->gdie);
    free(net->gfirst);
    free(net->gzero_op);
    free(net->zero_list);
    free(net->zero_begin);
    free(net->op_w);
    free(net->op_b);
    free(net);
}

void ptl_network_cuda_set_conv_options(ptl_network_cuda *net, int deterministic, int allow_tf32, int find)
{
    ptl_network_cuda_retire(net);
    net->opts.deterministic = deterministic;
    net->opts.allow_tf32 = allow_tf32;
    net->opts.find = find;
    /* plans are remade at the next prepare of each shape (a slot's old buffers go when it is reused) */
    for (int k = 0; k < NET_SHAPES; k++)
        net->slot[k].B = net->slot[k].H = net->slot[k].W = 0;
    net->have_forward = 0;
}

void ptl_network_cuda_set_training(ptl_network_cuda *net, int training)
{
    if (training != net->training)
        ptl_network_cuda_retire(net);
    net->training = training;
}
int ptl_network_cuda_training(const ptl_network_cuda *net) { return net->training; }

typedef struct {
    int h, w;
    int64_t m;
} vdims;

static vdims dims_of(const ptl_network_cuda *net, int v)
{
    net_shape *const S = net->cur;
    vdims d;
    d.h = S->H / net->values[v].down;
    d.w = S->W / net->values[v].down;
    d.m = (int64_t)S->B * d.h * d.w;
    return d;
}

int ptl_network_cuda_prepare(ptl_network_cuda *net, int B, int H, int W)
{
    ptl_cuda_ctx *ctx;
    if (B < 1)
        return ptl_set_error(PTL_ERR_VALUE, "images: batch size must be >= 1 (got %d)", B);
    if (H < 32 || W < 32 || H % 32 || W % 32)
        return ptl_set_error(PTL_ERR_VALUE, "images: height and width must be positive multiples of 32 (got %dx%d)",
                             H, W);
    if (net->cur->B == B && net->cur->H == H && net->cur->W == W)
        return 0;
    net->have_forward = 0;
    /* a slot that holds the shape already: switch to it (plans, buffers and recording as they were) */
    for (int k = 0; k < NET_SHAPES; k++) {
        net_shape *s = &net->slot[k];
        if (s->B == B && s->H == H && s->W == W) {
            net->cur = s;
            s->last_use = ++net->clock;
            return 0;
        }
    }
    if (ptl_cuda_ctx_get(net->rt, net->device, &ctx))
        return -1;
    /* else an empty slot, or the least recently used one */
    net_shape *victim = &net->slot[0];
    for (int k = 1; k < NET_SHAPES; k++) {
        net_shape *s = &net->slot[k];
        if (victim->B != 0 && (s->B == 0 || s->last_use < victim->last_use))
            victim = s;
    }
    free_slot(net, ctx, victim);
    net->cur = victim;
    victim->last_use = ++net->clock;
    net->cur->B = B;
    net->cur->H = H;
    net->cur->W = W;
    int64_t off = 0, maxv = 0, attn = 0, gtotal;
    size_t layer_scratch = 0, ws = 0;
    int64_t *size = malloc((size_t)net->nvalues * sizeof(int64_t));
    if (!size) {
        ptl_set_error(PTL_ERR_MEMORY, "network_cuda: out of host memory");
        goto fail;
    }
    for (int i = 0; i < net->nvalues; i++) {
        vdims d = dims_of(net, i);
        int64_t n = d.m * net->values[i].C;
        net->cur->voff[i] = off;
        size[i] = align_up(n);
        off += size[i];
        maxv = n > maxv ? n : maxv;
    }
    gtotal = place_gradients(net, size);
    free(size);
    if (gtotal < 0) {
        ptl_set_error(PTL_ERR_MEMORY, "network_cuda: out of host memory");
        goto fail;
    }
    net->cur->gact_numel = gtotal;
    for (int i = 0; i < net->nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        if (op->kind == PTL_OP_ATTN) {
            vdims d = dims_of(net, op->in);
            int64_t n = (int64_t)d.h * d.w;
            net->cur->attn_off[i] = attn;
            attn += align_up((int64_t)B * op->heads * n * n);
            size_t s = ptl_attention_cuda_scratch_bytes(net->dt, (int)n, op->heads);
            layer_scratch = s > layer_scratch ? s : layer_scratch;
        }
        if (op->kind == PTL_OP_CONV) {
            size_t s = ptl_batchnorm_cuda_scratch_bytes(dims_of(net, op->out).m, op->cout);
            layer_scratch = s > layer_scratch ? s : layer_scratch;
        }
        if (is_conv(op)) {
            ptl_conv2d_desc d;
            vdims di = dims_of(net, op->in);
            PTL_CHECK(ptl_conv2d_init(&d, B, di.h, di.w, op->cin, op->cout, op->k, op->s, op->g));
            PTL_CHECK(ptl_conv2d_plan_acquire(ctx, &d, net->dt, &net->opts, &net->cur->plans[i]));
            size_t s = ptl_conv2d_plan_workspace(net->cur->plans[i]);
            ws = s > ws ? s : ws;
        }
    }
    net->cur->act_numel = off;
    net->cur->attn_numel = attn;
    net->cur->max_value_numel = maxv;
    net->cur->A = 0;
    for (int l = 0; l < 3; l++) {
        net->cur->level_off[l] = net->cur->A;
        net->cur->A += (int64_t)(H / net->stride[l]) * (W / net->stride[l]);
    }
    PTL_CHECK(ptl_layers_cuda_reserve(ctx, layer_scratch));
    PTL_CHECK(dalloc(ctx, (size_t)off * net->esz, &net->cur->act));
    PTL_CHECK(dalloc(ctx, (size_t)gtotal * net->esz, &net->cur->gact));
    PTL_CHECK(dalloc(ctx, (size_t)attn * net->esz, &net->cur->attn));
    PTL_CHECK(dalloc(ctx, (size_t)maxv * net->esz, &net->cur->scratch));
    PTL_CHECK(dalloc(ctx, ws, &net->cur->ws));
    net->cur->ws_bytes = ws;
    for (int b = 0; b < 2; b++) {
        PTL_CHECK(dalloc(ctx, (size_t)B * net->cur->A * 4 * sizeof(float), &net->cur->out[b][0]));
        PTL_CHECK(dalloc(ctx, (size_t)B * net->cur->A * net->nc * sizeof(float), &net->cur->out[b][1]));
    }
    return 0;
fail:
    free_slot(net, ctx, net->cur);
    return -1;
}

#define AT(base, off) ((char *)(base) + (size_t)(off) * esz)
#define F32(base, off) ((float *)(base) + (off))

static int forward_op(ptl_network_cuda *net, ptl_cuda_ctx *ctx, int i)
{
    net_shape *const S = net->cur;
    const ptl_net_op *op = &net->ops[i];
    const size_t esz = net->esz;
    const ptl_dtype dt = net->dt;
    const int64_t *vo = S->voff;
    const ptl_net_value *V = net->values;
    void *act = S->act.ptr;
    switch (op->kind) {
    case PTL_OP_CONV:
    case PTL_OP_CONV_BIAS: {
        const void *w = AT(net->wc.ptr, net->op_w[i]);
        if (op->kind == PTL_OP_CONV_BIAS)
            return ptl_conv2d_forward_cuda(ctx, S->plans[i], AT(act, vo[op->in]), w, AT(net->wc.ptr, net->op_b[i]),
                                           AT(act, vo[op->out]), S->ws.ptr, S->ws_bytes);
        PTL_CHECK(ptl_conv2d_forward_cuda(ctx, S->plans[i], AT(act, vo[op->in]), w, NULL, AT(act, vo[op->z]),
                                          S->ws.ptr, S->ws_bytes));
        return ptl_batchnorm_forward_cuda(ctx, dt, dims_of(net, op->out).m, op->cout, AT(act, vo[op->z]),
                                          F32(net->params.ptr, op->gamma_off), F32(net->params.ptr, op->beta_off),
                                          F32(net->buffers.ptr, op->rmean_off), F32(net->buffers.ptr, op->rvar_off),
                                          net->training, op->act ? PTL_ACT_SILU : PTL_ACT_NONE,
                                          F32(net->stats.ptr, op->stat_off),
                                          F32(net->stats.ptr, op->stat_off + op->cout), AT(act, vo[op->out]));
    }
    case PTL_OP_ADD:
        return ptl_add_cuda(ctx, dt, dims_of(net, op->out).m * V[op->out].C, AT(act, vo[op->in]), AT(act, vo[op->in2]),
                            AT(act, vo[op->out]));
    case PTL_OP_CAT: {
        int64_t m = dims_of(net, op->out).m;
        int dst = 0;
        for (int p = 0; p < op->nparts; p++) {
            const ptl_net_part *pt = &op->parts[p];
            PTL_CHECK(ptl_channel_copy_cuda(ctx, dt, m, pt->nc, AT(act, vo[pt->value]), V[pt->value].C, pt->c0,
                                            AT(act, vo[op->out]), V[op->out].C, dst, 0));
            dst += pt->nc;
        }
        return 0;
    }
    case PTL_OP_POOL: {
        vdims d = dims_of(net, op->in);
        return ptl_maxpool5_forward_cuda(ctx, dt, S->B, d.h, d.w, V[op->in].C, AT(act, vo[op->in]),
                                         AT(act, vo[op->out]));
    }
    case PTL_OP_UP: {
        vdims d = dims_of(net, op->in);
        return ptl_upsample2x_forward_cuda(ctx, dt, S->B, d.h, d.w, V[op->in].C, AT(act, vo[op->in]),
                                           AT(act, vo[op->out]));
    }
    case PTL_OP_ATTN: {
        vdims d = dims_of(net, op->in);
        return ptl_attention_forward_cuda(ctx, dt, S->B, d.h * d.w, op->heads, op->kd, op->hd, AT(act, vo[op->in]),
                                          AT(S->attn.ptr, S->attn_off[i]), AT(act, vo[op->out]),
                                          op->out2 >= 0 ? AT(act, vo[op->out2]) : NULL);
    }
    case PTL_OP_HEAD: {
        vdims d = dims_of(net, op->in);
        return ptl_net_head_out_cuda(ctx->stream, dt, S->B, (int64_t)d.h * d.w, V[op->in].C, S->A,
                                     S->level_off[op->level], AT(act, vo[op->in]),
                                     S->out[op->branch][op->box ? 0 : 1].ptr);
    }
    }
fail:
    return -1;
}

/* Conv backward from dy: bias and weight gradients (compute dtype, into the zeroed wgc), then dx
 * into grad(in): written directly by the first writer of that gradient, else through scratch. */
static int conv_backward(ptl_network_cuda *net, ptl_cuda_ctx *ctx, int i, const void *dy, int want_input_grad)
{
    net_shape *const S = net->cur;
    const ptl_net_op *op = &net->ops[i];
    const size_t esz = net->esz;
    const ptl_conv2d_plan *p = S->plans[i];
    if (op->kind == PTL_OP_CONV_BIAS)
        PTL_CHECK(ptl_conv2d_backward_bias_cuda(ctx, p, dy, AT(net->wgc.ptr, net->op_b[i]), S->ws.ptr,
                                                S->ws_bytes));
    PTL_CHECK(ptl_conv2d_backward_weight_cuda(ctx, p, AT(S->act.ptr, S->voff[op->in]), dy,
                                              AT(net->wgc.ptr, net->op_w[i]), S->ws.ptr, S->ws_bytes));
    /* the image gradient is computed only when the caller asks for it */
    if (op->no_dx || (op->in == net->input && !want_input_grad))
        return 0;
    void *gin = AT(S->gact.ptr, S->goff[op->in]);
    const void *w = AT(net->wc.ptr, net->op_w[i]);
    if (net->gfirst[i] & 1u)
        return ptl_conv2d_backward_input_cuda(ctx, p, dy, w, gin, S->ws.ptr, S->ws_bytes);
    PTL_CHECK(ptl_conv2d_backward_input_cuda(ctx, p, dy, w, S->scratch.ptr, S->ws.ptr, S->ws_bytes));
    return ptl_accumulate_cuda(ctx, net->dt, dims_of(net, op->in).m * op->cin, S->scratch.ptr, gin);
fail:
    return -1;
}

/* grad(dst) = grad(src) when this is dst's first writer, else grad(dst) += grad(src). */
static int pass_through(ptl_network_cuda *net, ptl_cuda_ctx *ctx, int first, int64_t n, const void *src, void *dst)
{
    if (first) {
        PTL_CUDA_TRY(cudaMemcpyAsync(dst, src, (size_t)n * net->esz, cudaMemcpyDeviceToDevice, ctx->stream));
        return 0;
    }
    return ptl_accumulate_cuda(ctx, net->dt, n, src, dst);
fail:
    return -1;
}

static int backward_op(ptl_network_cuda *net, ptl_cuda_ctx *ctx, int i, const void *const d_out[2][2],
                       int want_input_grad)
{
    net_shape *const S = net->cur;
    const ptl_net_op *op = &net->ops[i];
    const size_t esz = net->esz;
    const ptl_dtype dt = net->dt;
    const int64_t *vo = S->voff, *go = S->goff;
    const ptl_net_value *V = net->values;
    const uint32_t first = net->gfirst[i];
    void *act = S->act.ptr, *g = S->gact.ptr;
    switch (op->kind) {
    case PTL_OP_CONV:
        PTL_CHECK(ptl_batchnorm_backward_cuda(
            ctx, dt, dims_of(net, op->out).m, op->cout, AT(act, vo[op->z]), AT(g, go[op->out]),
            F32(net->params.ptr, op->gamma_off), F32(net->params.ptr, op->beta_off), F32(net->stats.ptr, op->stat_off),
            F32(net->stats.ptr, op->stat_off + op->cout), net->fwd_training, op->act ? PTL_ACT_SILU : PTL_ACT_NONE,
            AT(g, go[op->z]), F32(net->grads.ptr, op->gamma_off), F32(net->grads.ptr, op->beta_off)));
        return conv_backward(net, ctx, i, AT(g, go[op->z]), want_input_grad);
    case PTL_OP_CONV_BIAS:
        return conv_backward(net, ctx, i, AT(g, go[op->out]), want_input_grad);
    case PTL_OP_ADD: {
        int64_t n = dims_of(net, op->out).m * V[op->out].C;
        PTL_CHECK(pass_through(net, ctx, first & 1u, n, AT(g, go[op->out]), AT(g, go[op->in])));
        return pass_through(net, ctx, first & 2u, n, AT(g, go[op->out]), AT(g, go[op->in2]));
    }
    case PTL_OP_CAT: {
        int64_t m = dims_of(net, op->out).m;
        int src = 0;
        for (int p = 0; p < op->nparts; p++) {
            const ptl_net_part *pt = &op->parts[p];
            /* a first writer of only some channels finds its slot zeroed (gzero_op) and adds */
            const int overwrite = (first >> (2 + p)) & 1u && net->gzero_op[pt->value] != i;
            PTL_CHECK(ptl_channel_copy_cuda(ctx, dt, m, pt->nc, AT(g, go[op->out]), V[op->out].C, src,
                                            AT(g, go[pt->value]), V[pt->value].C, pt->c0, !overwrite));
            src += pt->nc;
        }
        return 0;
    }
    case PTL_OP_POOL: {
        vdims d = dims_of(net, op->in);
        return ptl_maxpool5_backward_cuda(ctx, dt, S->B, d.h, d.w, V[op->in].C, AT(act, vo[op->in]),
                                          AT(g, go[op->out]), AT(g, go[op->in]), !(first & 1u));
    }
    case PTL_OP_UP: {
        vdims d = dims_of(net, op->in);
        return ptl_upsample2x_backward_cuda(ctx, dt, S->B, d.h, d.w, V[op->in].C, AT(g, go[op->out]),
                                            AT(g, go[op->in]), !(first & 1u));
    }
    case PTL_OP_ATTN: {
        vdims d = dims_of(net, op->in);
        void *gin = AT(g, go[op->in]);
        void *dst = first & 1u ? gin : S->scratch.ptr;
        PTL_CHECK(ptl_attention_backward_cuda(ctx, dt, S->B, d.h * d.w, op->heads, op->kd, op->hd,
                                              AT(act, vo[op->in]), AT(S->attn.ptr, S->attn_off[i]),
                                              AT(g, go[op->out]), op->out2 >= 0 ? AT(g, go[op->out2]) : NULL, dst));
        return first & 1u ? 0 : ptl_accumulate_cuda(ctx, dt, d.m * V[op->in].C, S->scratch.ptr, gin);
    }
    case PTL_OP_HEAD: {
        const float *src = d_out[op->branch][op->box ? 0 : 1];
        vdims d = dims_of(net, op->in);
        if (!src) {
            if (first & 1u)
                PTL_CUDA_TRY(cudaMemsetAsync(AT(g, go[op->in]), 0, (size_t)d.m * V[op->in].C * esz, ctx->stream));
            return 0;
        }
        return ptl_net_head_grad_cuda(ctx->stream, dt, S->B, (int64_t)d.h * d.w, V[op->in].C, S->A,
                                      S->level_off[op->level], src, AT(g, go[op->in]), !(first & 1u));
    }
    }
fail:
    return -1;
}

int ptl_network_cuda_forward(ptl_network_cuda *net, const void *images, int B, int H, int W)
{
    ptl_cuda_ctx *ctx;
    if (ptl_network_cuda_prepare(net, B, H, W))
        return -1;
    if (ptl_cuda_ctx_get(net->rt, net->device, &ctx))
        return -1;
    const size_t esz = net->esz;
    net->have_forward = 0;
    net->fwd_training = net->training;
    PTL_CHECK(ptl_net_weight_cast_cuda(ctx->stream, net->dt, net->wtab.ptr, net->nw, net->wtotal, net->params.ptr,
                                       net->wc.ptr));
    PTL_CUDA_TRY(cudaMemcpyAsync(AT(net->cur->act.ptr, net->cur->voff[net->input]), images, (size_t)B * H * W * 3 * esz,
                                 cudaMemcpyDeviceToDevice, ctx->stream));
    for (int i = 0; i < net->nops; i++)
        PTL_CHECK(forward_op(net, ctx, i));
    net->have_forward = 1;
    return 0;
fail:
    net->have_forward = 0;
    return -1;
}

int ptl_network_cuda_backward(ptl_network_cuda *net, const void *const d_out[2][2], void *d_images)
{
    net_shape *const S = net->cur;
    ptl_cuda_ctx *ctx;
    if (!net->have_forward)
        return ptl_set_error(PTL_ERR_RUNTIME, "network backward needs a successful forward of the same shape first");
    if (ptl_cuda_ctx_get(net->rt, net->device, &ctx))
        return -1;
    const size_t esz = net->esz;
    PTL_CUDA_TRY(cudaMemsetAsync(net->wgc.ptr, 0, (size_t)net->wtotal * esz, ctx->stream));
    for (int i = net->nops - 1; i >= 0; i--) {
        for (int k = net->zero_begin[i]; k < net->zero_begin[i + 1]; k++) {
            const int v = net->zero_list[k];
            PTL_CUDA_TRY(cudaMemsetAsync(AT(S->gact.ptr, S->goff[v]), 0,
                                         (size_t)dims_of(net, v).m * net->values[v].C * esz, ctx->stream));
        }
        PTL_CHECK(backward_op(net, ctx, i, d_out, d_images != NULL));
    }
    PTL_CHECK(ptl_net_weight_grad_cuda(ctx->stream, net->dt, net->wtab.ptr, net->nw, net->wtotal, net->wgc.ptr,
                                       net->grads.ptr));
    if (d_images)
        PTL_CUDA_TRY(cudaMemcpyAsync(d_images, AT(S->gact.ptr, S->goff[net->input]),
                                     (size_t)S->B * S->H * S->W * 3 * esz, cudaMemcpyDeviceToDevice,
                                     ctx->stream));
    return 0;
fail:
    return -1;
}

/* Captures one call of forward (bwd 0) or backward (bwd 1) into *out without running it. */
static int capture(ptl_network_cuda *net, ptl_cuda_ctx *ctx, int bwd, const void *images,
                   const void *const d_out[2][2], ptl_cuda_graph **out)
{
    net_shape *const S = net->cur;
    if (ptl_cuda_graph_begin(ctx->stream))
        return -1;
    const int ok = (bwd ? ptl_network_cuda_backward(net, d_out, NULL)
                        : ptl_network_cuda_forward(net, images, S->B, S->H, S->W)) == 0;
    if (ptl_cuda_graph_end(ctx->stream, ok, out) || !ok)
        return -1;
    return 0;
}

int ptl_network_cuda_record(ptl_network_cuda *net, const void *images, int B, int H, int W,
                            const void *const d_out[2][2])
{
    net_shape *const S = net->cur;
    ptl_cuda_ctx *ctx;
    if (!net->have_forward || S->B != B || S->H != H || S->W != W)
        return ptl_set_error(PTL_ERR_RUNTIME, "network record: run one eager forward and backward of this shape "
                                              "first (the warm-up makes every plan and buffer)");
    if (ptl_cuda_ctx_get(net->rt, net->device, &ctx))
        return -1;
    retire_slot(S);
    /* nothing runs: outputs, gradients and BN statistics stay those of the warm-up */
    if (capture(net, ctx, 0, images, d_out, &S->rec_fwd) || capture(net, ctx, 1, images, d_out, &S->rec_bwd)) {
        retire_slot(S);
        net->have_forward = 0;
        return -1;
    }
    S->rec_training = net->training;
    S->rec_scratch_gen = ptl_layers_cuda_scratch_generation(ctx);
    return 0;
}

int ptl_network_cuda_replay(ptl_network_cuda *net, int part)
{
    net_shape *const S = net->cur;
    ptl_cuda_ctx *ctx;
    if (!ptl_network_cuda_recorded(net))
        return ptl_set_error(PTL_ERR_RUNTIME, "network replay: nothing recorded (or the recording was retired by "
                                              "a change of shape, mode or conv options, or by another network "
                                              "growing the device's layer scratch)");
    if (part == PTL_REPLAY_BACKWARD && !net->have_forward)
        return ptl_set_error(PTL_ERR_RUNTIME, "network replay: the backward needs a forward of this shape first");
    if (ptl_cuda_ctx_get(net->rt, net->device, &ctx))
        return -1;
    if (part != PTL_REPLAY_BACKWARD) {
        net->have_forward = 0;
        if (ptl_cuda_graph_launch(S->rec_fwd, ctx->stream))
            return -1;
        net->fwd_training = S->rec_training;
        net->have_forward = 1;
    }
    if (part != PTL_REPLAY_FORWARD && ptl_cuda_graph_launch(S->rec_bwd, ctx->stream))
        return -1;
    return 0;
}

int ptl_network_cuda_recorded(ptl_network_cuda *net)
{
    net_shape *const S = net->cur;
    ptl_cuda_ctx *ctx;
    if (S->rec_fwd && (ptl_cuda_ctx_get(net->rt, net->device, &ctx) ||
                       ptl_layers_cuda_scratch_generation(ctx) != S->rec_scratch_gen))
        retire_slot(S); /* the shared layer scratch moved: the graphs point at freed memory */
    return S->rec_fwd != NULL;
}

int ptl_network_cuda_zero_grad(ptl_network_cuda *net)
{
    return ptl_memset_device(net->rt, (ptl_device){PTL_CUDA, net->device}, net->grads.ptr, 0,
                             (size_t)net->nparams * sizeof(float));
}

float *ptl_network_cuda_params(ptl_network_cuda *net) { return net->params.ptr; }
float *ptl_network_cuda_grads(ptl_network_cuda *net) { return net->grads.ptr; }
float *ptl_network_cuda_buffers(ptl_network_cuda *net) { return net->buffers.ptr; }
int64_t ptl_network_cuda_num_params(const ptl_network_cuda *net) { return net->nparams; }
int64_t ptl_network_cuda_num_buffers(const ptl_network_cuda *net) { return net->nbuffers; }
ptl_dtype ptl_network_cuda_dtype(const ptl_network_cuda *net) { return net->dt; }
int ptl_network_cuda_device(const ptl_network_cuda *net) { return net->device; }
int ptl_network_cuda_num_classes(const ptl_network_cuda *net) { return net->nc; }
int ptl_network_cuda_have_forward(const ptl_network_cuda *net) { return net->have_forward; }

float *ptl_network_cuda_output(ptl_network_cuda *net, int branch, int which)
{
    return net->cur->out[branch & 1][which & 1].ptr;
}

void ptl_network_cuda_shape(const ptl_network_cuda *net, int *B, int *H, int *W, int64_t *A)
{
    *B = net->cur->B;
    *H = net->cur->H;
    *W = net->cur->W;
    *A = net->cur->A;
}

void ptl_network_cuda_memory(const ptl_network_cuda *net, int64_t *fixed_bytes, int64_t *shape_bytes)
{
    *fixed_bytes = (2 * net->nparams + net->nbuffers + net->nstats) * 4 + 2 * net->wtotal * (int64_t)net->esz;
    *shape_bytes = 0;
    for (int k = 0; k < NET_SHAPES; k++) {
        const net_shape *s = &net->slot[k];
        if (s->B)
            *shape_bytes += (s->act_numel + s->gact_numel + s->attn_numel + s->max_value_numel) * (int64_t)net->esz +
                            (int64_t)s->ws_bytes + 2 * (int64_t)s->B * s->A * (4 + net->nc) * 4;
    }
}
