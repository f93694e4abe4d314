/* The network executor (executor.h): master storage, shape slots, and the forward and backward of the
 * description's op list over a backend table. */
#include "executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_conv(const ptl_net_op *op) { return op->kind == PTL_OP_CONV || op->kind == PTL_OP_CONV_BIAS; }

/* The kinds forward_op/backward_op run themselves; every other kind is a row of the backend's `layer`
 * table. */
static int has_own_case(ptl_net_op_kind k)
{
    return k == PTL_OP_CONV || k == PTL_OP_CONV_BIAS || k == PTL_OP_HEAD;
}

static int oom(void) { return ptl_set_error(PTL_ERR_MEMORY, "network executor: out of host memory"); }

static int activate(const ptl_net_backend *be, ptl_exec_ctx *ctx) { return be->activate ? be->activate(ctx) : 0; }

static int balloc(ptl_net_exec *x, size_t bytes, ptl_net_buf *b)
{
    b->ptr = b->block = NULL;
    return x->be->alloc(x->ctx, bytes ? bytes : 1, b);
}

static void bfree(ptl_net_exec *x, ptl_net_buf *b)
{
    if (b->block)
        x->be->release(x->ctx, b);
    b->ptr = b->block = NULL;
}

/* ----------------------------------------------------------------------------------- slots */

static void retire_slot(ptl_net_exec *x, ptl_net_slot *s)
{
    if (s->rec && x->be->recording_free)
        x->be->recording_free(s->rec);
    s->rec = NULL;
}

int ptl_net_record(ptl_net_exec *x, const void *images, int B, int H, int W, const void *const d_out[2][2],
                   const ptl_net_tail *tail)
{
    if (!x->be->record)
        return ptl_set_error(PTL_ERR_RUNTIME, "network record: the %s backend has no graph recorder", x->be->name);
    if (tail && !tail->run)
        return ptl_set_error(PTL_ERR_VALUE, "network record: a tail without its function");
    return x->be->record(x, images, B, H, W, d_out, tail);
}

static void use_main_queue(ptl_net_exec *x);

/* A backward adds its weight gradients into wgc, which the last backward's weight_grad left zero; after a
 * backward that failed before its weight_grad, wgc is zeroed first (on the main queue). */
static int wgc_clean(ptl_net_exec *x)
{
    if (!x->wgc_dirty)
        return 0;
    use_main_queue(x);
    if (activate(x->be, x->ctx) || x->be->zero(x->ctx, x->wgc.ptr, (size_t)x->wt.total * x->csz))
        return -1;
    x->wgc_dirty = 0;
    return 0;
}

int ptl_net_replay(ptl_net_exec *x, int part)
{
    if (!x->be->replay)
        return ptl_set_error(PTL_ERR_RUNTIME, "network replay: the %s backend has no graph recorder", x->be->name);
    if (part == PTL_NET_REPLAY_FORWARD)
        return x->be->replay(x, part);
    if (wgc_clean(x))
        return -1;
    if (x->be->replay(x, part)) {
        x->wgc_dirty = 1;
        return -1;
    }
    return 0;
}

int ptl_net_recorded(ptl_net_exec *x) { return x->be->recorded ? x->be->recorded(x) : 0; }

void ptl_net_recording_nodes(ptl_net_exec *x, int64_t nodes[3])
{
    nodes[0] = nodes[1] = nodes[2] = 0;
    if (x->be->recording_nodes)
        x->be->recording_nodes(x, nodes);
}

void ptl_net_exec_retire(ptl_net_exec *x)
{
    for (int k = 0; k < PTL_NET_SHAPES; k++)
        retire_slot(x, &x->slot[k]);
}

static void free_slot(ptl_net_exec *x, ptl_net_slot *s)
{
    retire_slot(x, s);
    if (s->plans)
        for (int i = 0; i < x->net->nops; i++) {
            if (s->plans[i])
                x->be->conv_plan_free(s->plans[i]);
            s->plans[i] = NULL;
        }
    bfree(x, &s->arena);
    bfree(x, &s->saved);
    bfree(x, &s->kept);
    free(s->kept_off);
    s->kept_off = NULL;
    s->kept_bytes = 0;
    for (int k = 0; k < PTL_NET_QUEUES; k++) {
        bfree(x, &s->ws[k]);
        s->ws_bytes[k] = 0;
    }
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 2; j++)
            bfree(x, &s->out[b][j]);
    s->warm = 0;
    s->L.B = s->L.H = s->L.W = 0;
    s->L.A = 0;
    if (s == x->cur)
        x->have_forward = 0;
}

int ptl_net_conv_plans_each(int (*one)(ptl_exec_ctx *ctx, const ptl_conv2d_desc *d, ptl_dtype dt,
                                       const ptl_net_conv_opts *o, int bias, void **plan),
                            void (*drop)(void *plan), ptl_exec_ctx *ctx, int n, const ptl_conv2d_desc *d, ptl_dtype dt,
                            const ptl_net_conv_opts *o, const uint8_t *bias, void **plans)
{
    for (int i = 0; i < n; i++)
        if (one(ctx, &d[i], dt, o, bias[i], &plans[i])) {
            while (i-- > 0)
                drop(plans[i]);
            return -1;
        }
    return 0;
}

/* The conv descriptors of shape (B, H, W) into d (and whether each adds a bias), in op order; their count. */
static int conv_descs(const ptl_net_exec *x, int B, int H, int W, ptl_conv2d_desc *d, uint8_t *bias)
{
    const ptl_network *net = x->net;
    const ptl_net_layout L = {.B = B, .H = H, .W = W};
    int n = 0;
    for (int i = 0; i < net->nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        if (!is_conv(op))
            continue;
        const ptl_net_dims di = ptl_net_value_dims(net, &L, op->ins[0].value);
        if (ptl_conv2d_init(&d[n], B, di.h, di.w, op->cin, op->cout, op->k, op->s, op->g))
            return -1;
        bias[n++] = op->kind == PTL_OP_CONV_BIAS;
    }
    return n;
}

static int check_shape(int B, int H, int W)
{
    if (B < 1)
        return ptl_set_error(PTL_ERR_VALUE, "images: batch size must be >= 1 (got %d)", B);
    if (H < 32 || W < 32 || H % 32 || W % 32)
        return ptl_set_error(PTL_ERR_VALUE, "images: height and width must be positive multiples of 32 (got %dx%d)",
                             H, W);
    return 0;
}

/* The conv plans of `count` shapes (bhw: B, H, W each) at once, for no-grad layouts when forward_only: into
 * s's plans when s is given (one shape), else made and dropped (the backend's plan cache keeps them). */
static int plan_shapes(ptl_net_exec *x, int count, const int *bhw, int forward_only, ptl_net_slot *s)
{
    ptl_net_conv_opts o = x->opts;
    o.forward_only = forward_only;
    const int per = x->net->nops;
    ptl_conv2d_desc *d = malloc((size_t)count * per * sizeof *d);
    uint8_t *bias = malloc((size_t)count * per);
    void **plans = malloc((size_t)count * per * sizeof *plans);
    int n = 0, rc = -1;
    if (!d || !bias || !plans) {
        oom();
        goto fail;
    }
    for (int k = 0; k < count; k++) {
        const int made = conv_descs(x, bhw[3 * k], bhw[3 * k + 1], bhw[3 * k + 2], d + n, bias + n);
        if (made < 0)
            goto fail;
        n += made;
    }
    PTL_CHECK(x->be->conv_plans(x->ctx, n, d, x->cdt, &o, bias, plans));
    if (s) {
        for (int i = 0, j = 0; i < per; i++)
            if (is_conv(&x->net->ops[i]))
                s->plans[i] = plans[j++];
    } else {
        for (int j = 0; j < n; j++)
            x->be->conv_plan_free(plans[j]);
    }
    rc = 0;
fail:
    free(d);
    free(bias);
    free(plans);
    return rc;
}

int ptl_net_exec_plan(ptl_net_exec *x, int count, const int *bhw, int forward_only)
{
    if (count < 0)
        return ptl_set_error(PTL_ERR_VALUE, "shapes: a negative count (%d)", count);
    for (int k = 0; k < count; k++)
        if (check_shape(bhw[3 * k], bhw[3 * k + 1], bhw[3 * k + 2]))
            return -1;
    if (count == 0)
        return 0;
    if (activate(x->be, x->ctx))
        return -1;
    return plan_shapes(x, count, bhw, forward_only != 0, NULL);
}

static void make_call(ptl_net_exec *x, int i, int backward, int want_input_grad, ptl_net_call *c);

/* What runs beside the rest, as the layout sees it. */
static ptl_net_concurrency concurrency(const ptl_net_exec *x)
{
    const ptl_net_concurrency cc = {x->side_lag, x->branches ? &x->br : NULL, x->attached};
    return cc;
}

/* The branch op i runs in beside the rest (-1: none). */
static int branch_of(const ptl_net_exec *x, int i)
{
    const ptl_net_concurrency cc = concurrency(x);
    return ptl_net_branch_of(&cc, i);
}

int ptl_net_exec_param_grads_lag(const ptl_net_exec *x, int i, const void *p)
{
    return x->side_lag && branch_of(x, i) < 0 &&
           (!x->queue_ws_limit || x->be->conv_workspace(p, PTL_CONV_WS_PARAM_GRADS) <= x->queue_ws_limit);
}

/* The side queue of branch b, and the one of its parameter gradients. */
static int branch_queue(const ptl_net_exec *x, int b) { return PTL_NET_SIDE_DETACHED + x->br.b[b].attached; }
static int branch_wgrad_queue(const ptl_net_exec *x, int b)
{
    return PTL_NET_SIDE_DETACHED_WGRAD + x->br.b[b].attached;
}

/* Whether branch b's conv parameter gradients lag its steps on a queue of their own (branch_pass). */
static int branch_wgrad_apart(const ptl_net_exec *x, int b)
{
    return x->side_lag && x->side[branch_queue(x, b)] && x->side[branch_wgrad_queue(x, b)];
}

/* The conv workspaces that go in the arena (ptl_net_layout_build's op_ws, in elements), from slot s's
 * plans: those of a conv run in order on the main queue whose calls need more than the queue limit, for its
 * forward and for its backward step (its input gradient, and its weight gradients unless they lag). */
static void arena_workspaces(const ptl_net_exec *x, const ptl_net_slot *s, int fwd_only, int64_t *op_ws)
{
    for (int i = 0; i < x->net->nops; i++) {
        const void *p = s->plans[i];
        op_ws[2 * i] = op_ws[2 * i + 1] = 0;
        if (!p || !x->queue_ws_limit || branch_of(x, i) >= 0)
            continue;
        const size_t d = x->be->conv_workspace(p, PTL_CONV_WS_DATA),
                     w = fwd_only || ptl_net_exec_param_grads_lag(x, i, p)
                             ? 0
                             : x->be->conv_workspace(p, PTL_CONV_WS_PARAM_GRADS),
                     b = d > w ? d : w;
        if (b <= x->queue_ws_limit)
            continue;
        op_ws[2 * i] = (int64_t)((d + x->csz - 1) / x->csz);
        op_ws[2 * i + 1] = (int64_t)((b + x->csz - 1) / x->csz); /* a forward-only layout places none */
    }
}

/* Slot s's (the current one's) kept bytes: each op's whose backend row keeps some for its backward
 * (ptl_net_layer.kept_bytes), in one buffer; a forward-only layout keeps none. */
static int fill_kept(ptl_net_exec *x, ptl_net_slot *s)
{
    const ptl_network *net = x->net;
    int64_t *off = malloc((size_t)(net->nops ? net->nops : 1) * sizeof *off);
    size_t total = 0;
    if (!off)
        return oom();
    for (int i = 0; i < net->nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        size_t (*bytes)(const ptl_net_call *) = has_own_case(op->kind) ? NULL : x->be->layer[op->kind].kept_bytes;
        off[i] = -1;
        if (bytes && !s->L.forward_only) {
            ptl_net_call c;
            make_call(x, i, 0, 0, &c);
            const size_t b = bytes(&c);
            if (b) {
                off[i] = (int64_t)total;
                total += (size_t)ptl_net_align_up((int64_t)b);
            }
        }
    }
    PTL_CHECK(balloc(x, total, &s->kept));
    s->kept_off = off;
    s->kept_bytes = total;
    return 0;
fail:
    free(off);
    return -1;
}

/* Allocates slot s's (the current one's) buffers for its layout and plans. */
static int fill_slot(ptl_net_exec *x, ptl_net_slot *s)
{
    const ptl_network *net = x->net;
    const ptl_net_layout *L = &s->L;
    /* each queue's needs (0 main, 1 + k side queue k): conv workspace, layer scratch */
    size_t ws[PTL_NET_QUEUES] = {0}, layer_scratch[PTL_NET_QUEUES] = {0};
    const int wgrad = x->side_lag && x->side[PTL_NET_SIDE_WGRAD] && !L->forward_only;
    PTL_CHECK(balloc(x, (size_t)L->arena_numel * x->csz, &s->arena));
    PTL_CHECK(balloc(x, (size_t)L->saved_numel * x->csz, &s->saved));
    PTL_CHECK(fill_kept(x, s)); /* before the scratch: a row's kept bytes may spare it its scratch */
    for (int i = 0; i < net->nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        /* a branch op's calls run on its queue, its parameter gradients on their own queue where they lag
         * (branch_pass); any other's parameter gradients on the weight-gradient queue when there is one */
        const int br = branch_of(x, i), k = br < 0 ? -1 : branch_queue(x, br);
        const int own = k >= 0 && x->side[k] ? 1 + k : 0;
        const int own_pg =
            br >= 0 && !L->forward_only && branch_wgrad_apart(x, br) ? 1 + branch_wgrad_queue(x, br) : own;
        size_t b = 0;
        if (is_conv(op)) {
            /* a conv with its workspace in the arena needs its queue's for lagging weight gradients alone */
            const int lag = ptl_net_exec_param_grads_lag(x, i, s->plans[i]);
            const int pg = wgrad && lag ? 1 + PTL_NET_SIDE_WGRAD : own_pg;
            const int in_arena = L->ws_numel[2 * i] || L->ws_numel[2 * i + 1];
            const size_t w = in_arena ? 0 : x->be->conv_workspace(s->plans[i], PTL_CONV_WS_DATA),
                         wp = in_arena && !lag ? 0 : x->be->conv_workspace(s->plans[i], PTL_CONV_WS_PARAM_GRADS);
            ws[own] = w > ws[own] ? w : ws[own];
            ws[pg] = wp > ws[pg] ? wp : ws[pg];
            if (op->kind == PTL_OP_CONV && x->be->bn_scratch_bytes)
                b = x->be->bn_scratch_bytes(ptl_net_value_dims(net, L, op->out).m, op->cout);
        } else if (!has_own_case(op->kind) && x->be->layer[op->kind].scratch_bytes) {
            ptl_net_call c;
            make_call(x, i, 0, 0, &c);
            b = x->be->layer[op->kind].scratch_bytes(&c);
        }
        layer_scratch[own] = b > layer_scratch[own] ? b : layer_scratch[own];
    }
    for (int k = 0; k < PTL_NET_QUEUES; k++) {
        ptl_exec_ctx *c = k ? x->side[k - 1] : x->ctx;
        if (x->be->reserve_scratch && c)
            PTL_CHECK(x->be->reserve_scratch(c, layer_scratch[k]));
        if (k == 0 || ws[k]) {
            PTL_CHECK(balloc(x, ws[k], &s->ws[k]));
            s->ws_bytes[k] = ws[k];
        }
    }
    for (int b = 0; b < 2; b++) {
        PTL_CHECK(balloc(x, (size_t)L->B * L->A * 4 * x->msz, &s->out[b][0]));
        PTL_CHECK(balloc(x, (size_t)L->B * L->A * net->nc * x->msz, &s->out[b][1]));
    }
    return 0;
fail:
    return -1;
}

int ptl_net_exec_prepare(ptl_net_exec *x, int B, int H, int W)
{
    if (check_shape(B, H, W))
        return -1;
    /* the current mode's slots: a slot that holds the shape already is switched to (plans, buffers and
     * recording as they were), else an empty one, or the least recently used one, is filled */
    const int first = x->training ? 0 : PTL_NET_TRAIN_SHAPES;
    const int end = x->training ? PTL_NET_TRAIN_SHAPES : PTL_NET_SHAPES;
    ptl_net_slot *victim = &x->slot[first];
    for (int k = first; k < end; k++) {
        ptl_net_slot *s = &x->slot[k];
        if (s->L.B == B && s->L.H == H && s->L.W == W && s->L.forward_only == !x->grad) {
            if (s != x->cur) {
                x->have_forward = 0;
                x->cur = s;
                s->last_use = ++x->clock;
            }
            return 0;
        }
        if (victim->L.B != 0 && (s->L.B == 0 || s->last_use < victim->last_use))
            victim = s;
    }
    if (activate(x->be, x->ctx))
        return -1;
    x->have_forward = 0;
    free_slot(x, victim);
    x->cur = victim;
    victim->last_use = ++x->clock;
    /* the plans first: the layout places the largest conv workspaces in the arena */
    const int flags = x->share | (x->grad ? 0 : PTL_NET_FORWARD_ONLY), bhw[3] = {B, H, W};
    const ptl_net_concurrency cc = concurrency(x);
    int64_t *op_ws = malloc((size_t)2 * x->net->nops * sizeof *op_ws);
    int rc = op_ws ? plan_shapes(x, 1, bhw, !x->grad, victim) : oom();
    if (rc == 0) {
        arena_workspaces(x, victim, !x->grad, op_ws);
        rc = ptl_net_layout_build(x->net, &x->gp, B, H, W, flags, &cc, op_ws, &victim->L) || fill_slot(x, victim);
    }
    free(op_ws);
    if (rc) {
        free_slot(x, victim);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------------------------- lifecycle */

void ptl_net_exec_free(ptl_net_exec *x)
{
    if (!x)
        return;
    (void)activate(x->be, x->ctx);
    for (int k = 0; k < PTL_NET_SHAPES; k++) {
        free_slot(x, &x->slot[k]);
        free(x->slot[k].plans);
        ptl_net_layout_free(&x->slot[k].L);
    }
    for (int i = 0; i < 4; i++)
        bfree(x, &x->own[i]);
    bfree(x, &x->wc);
    bfree(x, &x->wgc);
    bfree(x, &x->wtab);
    bfree(x, &x->wtiles);
    ptl_net_grad_plan_free(&x->gp);
    ptl_net_wtab_free(&x->wt);
    free(x->op_frozen);
    free(x->op_needed);
    free(x->grad_needed);
    ptl_net_branches_free(&x->br);
    free(x->run.ops);
    free(x);
}

/* The environment's variable `name`, a whole number of MiB, in bytes, else fallback. */
static size_t env_mib(const char *name, size_t fallback)
{
    const char *env = getenv(name);
    char *end;
    const unsigned long long v = env && *env >= '0' && *env <= '9' ? strtoull(env, &end, 10) : 0;
    return env && *env >= '0' && *env <= '9' && *end == '\0' && v < (1ull << 40) ? (size_t)v << 20 : fallback;
}

/* The environment's variable `name` when it is one digit in [0, max], else fallback. */
static int env_digit(const char *name, int max, int fallback)
{
    const char *env = getenv(name);
    if (env && env[0] >= '0' && env[0] <= '0' + max && env[1] == '\0')
        return env[0] - '0';
    return fallback;
}

/* The plans of the ops the executor runs: into ops, the description's, with its Concats built in place (on)
 * where every kernel involved takes channel slices (the conv's BatchNorm writes a slice of its output on every
 * backend); their gradient plan and branches into gp and br (zeroed; freed on failure). Returns the parts
 * placed, -1 on failure. */
static int plans_make(const ptl_net_exec *x, int on, ptl_net_op *ops, ptl_net_grad_plan *gp, ptl_net_branches *br)
{
    uint8_t slices[PTL_NET_OP_KINDS];
    for (int k = 0; k < PTL_NET_OP_KINDS; k++)
        slices[k] = has_own_case((ptl_net_op_kind)k) ? 0 : (uint8_t)x->be->layer[k].slices;
    slices[PTL_OP_CONV] = PTL_NET_SLICE_OUT;
    int parts = 0;
    if (on)
        parts = ptl_net_cat_in_place(x->desc, slices, ops);
    else
        memcpy(ops, x->desc->ops, (size_t)x->desc->nops * sizeof *ops);
    ptl_network run = *x->desc;
    run.ops = ops;
    if (parts < 0 || ptl_net_grad_plan_build(&run, gp) || ptl_net_branches_find(&run, br)) {
        ptl_net_grad_plan_free(gp);
        ptl_net_branches_free(br);
        return -1;
    }
    return parts;
}

int ptl_net_exec_create(const ptl_network *net, const ptl_net_backend *be, ptl_exec_ctx *ctx, ptl_runtime *rt,
                        ptl_device device, ptl_dtype compute, int alias_host, ptl_net_exec **out)
{
    *out = NULL;
    if (be->device == PTL_CPU && compute != net->dtype)
        return ptl_set_error(PTL_ERR_VALUE, "dtype: the CPU network computes in its own dtype %s, got %s",
                             ptl_dtype_name(net->dtype), ptl_dtype_name(compute));
    if (be->device == PTL_CUDA && compute != PTL_FLOAT32 && compute != PTL_BFLOAT16 && compute != PTL_FLOAT16)
        return ptl_set_error(PTL_ERR_VALUE, "dtype: the CUDA network computes in float32, bfloat16 or float16, got %s",
                             ptl_dtype_name(compute));
    if (!alias_host && net->dtype != PTL_FLOAT32)
        return ptl_set_error(PTL_ERR_VALUE, "a %s network stays on the CPU (float64 is for gradient checks)",
                             ptl_dtype_name(net->dtype));
    if (alias_host && be->device != PTL_CPU)
        return ptl_set_error(PTL_ERR_VALUE, "network executor: only the CPU backend runs on host storage");
    for (int i = 0; i < net->nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        if (has_own_case(op->kind))
            continue;
        const ptl_net_layer *r = &be->layer[op->kind];
        if (!r->forward || !r->backward)
            return ptl_set_error(PTL_ERR_VALUE, "network executor: the %s backend has no kernels for op %d's kind %s",
                                 be->name, i, ptl_net_op_kind_name(op->kind));
        if (r->overwrites && (op->nin != 1 || op->ins[0].c0 || op->ins[0].nc != net->values[op->ins[0].value].C))
            return ptl_set_error(PTL_ERR_VALUE, "network executor: the %s backend's %s overwrites its input gradient, "
                                 "so op %d must read one whole value", be->name, ptl_net_op_kind_name(op->kind), i);
    }
    if (activate(be, ctx))
        return -1;
    ptl_net_exec *x = calloc(1, sizeof *x);
    if (!x)
        return oom();
    x->desc = net;
    x->run = *net;
    x->net = &x->run;
    x->cat_in_place = env_digit("PTL_CAT_IN_PLACE", 1, 1);
    if (!(x->run.ops = malloc((size_t)(net->nops ? net->nops : 1) * sizeof *x->run.ops))) {
        free(x);
        return oom();
    }
    x->be = be;
    x->ctx = ctx;
    x->rt = rt;
    x->device = device;
    x->mdt = alias_host ? net->dtype : PTL_FLOAT32;
    x->cdt = compute;
    x->msz = ptl_dtype_size(x->mdt);
    x->csz = ptl_dtype_size(compute);
    x->training = 1;
    x->share = PTL_NET_SHARE_GRADIENTS | PTL_NET_SHARE_ACTIVATIONS;
    x->grad = 1;
    x->opts = (ptl_net_conv_opts){.deterministic = 1,
                                  .workspace_limit = env_mib("PTL_CONV_WORKSPACE_MIB", PTL_NET_CONV_WORKSPACE_LIMIT)};
    x->queue_ws_limit = env_mib("PTL_QUEUE_WORKSPACE_MIB", PTL_NET_QUEUE_WORKSPACE_LIMIT);
    x->cur = &x->slot[0];
    for (int k = 0; k < PTL_NET_SIDE_MAX_LAG; k++)
        x->side_op[k] = -1;
    x->aliased = alias_host;
    for (int k = 0; k < PTL_NET_SHAPES; k++) {
        PTL_CHECK(ptl_net_layout_alloc(net, &x->slot[k].L));
        if (!(x->slot[k].plans = calloc((size_t)net->nops, sizeof(void *)))) {
            oom();
            goto fail;
        }
    }
    if ((x->cat_parts = plans_make(x, x->cat_in_place, x->run.ops, &x->gp, &x->br)) < 0)
        goto fail;
    PTL_CHECK(ptl_net_wtab_build(net, be->cast_biases, &x->wt));
    x->op_frozen = calloc((size_t)net->nops, 1);
    x->op_needed = calloc((size_t)net->nops, 1);
    x->grad_needed = calloc((size_t)net->nvalues, 1);
    if (!x->op_frozen || !x->op_needed || !x->grad_needed) {
        oom();
        goto fail;
    }
    PTL_CHECK(ptl_net_exec_set_frozen(x, NULL, 0));
    const int64_t sizes[4] = {net->nparams, net->nparams, net->nbuffers, net->nstats};
    void **dst[4] = {&x->params, &x->grads, &x->buffers, &x->stats};
    for (int i = 0; i < 4; i++) {
        if (alias_host && i < 3) {
            *dst[i] = i == 0 ? net->params : i == 1 ? net->grads : net->buffers;
            continue;
        }
        PTL_CHECK(balloc(x, (size_t)sizes[i] * x->msz, &x->own[i]));
        *dst[i] = x->own[i].ptr;
        if (i != 2)
            PTL_CHECK(be->zero(ctx, *dst[i], (size_t)sizes[i] * x->msz));
    }
    x->own_params = x->params;
    x->own_buffers = x->buffers;
    if (!alias_host) {
        PTL_CHECK(ptl_net_exec_sync(x, "params", 1));
        PTL_CHECK(ptl_net_exec_sync(x, "buffers", 1));
    }
    PTL_CHECK(balloc(x, (size_t)x->wt.n * sizeof(ptl_wcast_entry), &x->wtab));
    PTL_CHECK(be->upload(ctx, x->wtab.ptr, x->wt.tab, (size_t)x->wt.n * sizeof(ptl_wcast_entry)));
    PTL_CHECK(balloc(x, (size_t)x->wt.ntiles * sizeof(ptl_wcast_tile), &x->wtiles));
    PTL_CHECK(be->upload(ctx, x->wtiles.ptr, x->wt.tiles, (size_t)x->wt.ntiles * sizeof(ptl_wcast_tile)));
    x->wtable = (ptl_wcast_table){x->wtab.ptr, x->wtiles.ptr, x->wt.n, x->wt.ntiles, x->wt.total};
    PTL_CHECK(balloc(x, (size_t)x->wt.total * x->csz, &x->wc));
    PTL_CHECK(balloc(x, (size_t)x->wt.total * x->csz, &x->wgc));
    /* padding stays zero in both, so no stale bits are ever read as weights */
    PTL_CHECK(be->zero(ctx, x->wc.ptr, (size_t)x->wt.total * x->csz));
    PTL_CHECK(be->zero(ctx, x->wgc.ptr, (size_t)x->wt.total * x->csz));
    x->attached = 1;
    if (be->side_open) {
        PTL_CHECK(ptl_net_exec_set_side_lag(x, env_digit("PTL_SIDE_LAG", PTL_NET_SIDE_MAX_LAG, PTL_NET_SIDE_LAG)));
        PTL_CHECK(ptl_net_exec_set_branches(x, env_digit("PTL_SIDE_BRANCHES", 1, 1), env_digit("PTL_SIDE_ATTACHED", 1, 1)));
    }
    *out = x;
    return 0;
fail:
    ptl_net_exec_free(x);
    return -1;
}

int ptl_net_exec_sync(ptl_net_exec *x, const char *which, int to_device)
{
    const ptl_network *net = x->net;
    void *host, *dev;
    int64_t n;
    if (!strcmp(which, "params")) {
        host = net->params;
        dev = x->own_params;
        n = net->nparams;
    } else if (!strcmp(which, "grads")) {
        host = net->grads;
        dev = x->grads;
        n = net->nparams;
    } else if (!strcmp(which, "buffers")) {
        host = net->buffers;
        dev = x->own_buffers;
        n = net->nbuffers;
    } else {
        return ptl_set_error(PTL_ERR_VALUE, "which: expected 'params', 'grads' or 'buffers', got '%s'", which);
    }
    if (x->aliased || n == 0)
        return 0;
    if (activate(x->be, x->ctx))
        return -1;
    const size_t bytes = (size_t)n * x->msz;
    return to_device ? x->be->upload(x->ctx, dev, host, bytes) : x->be->download(x->ctx, host, dev, bytes);
}

void ptl_net_exec_set_training(ptl_net_exec *x, int training) { x->training = !!training; }

void ptl_net_exec_set_grad(ptl_net_exec *x, int grad) { x->grad = !!grad; }

void ptl_net_exec_use_weights(ptl_net_exec *x, void *params, void *buffers)
{
    x->params = params ? params : x->own_params;
    x->buffers = buffers ? buffers : x->own_buffers;
    x->have_forward = 0;
}

/* The description's tensor at `offset` of the params (is_buffer 0) or buffers (1), -1 when none. */
static int entry_at(const ptl_network *net, int is_buffer, int64_t offset)
{
    for (int e = 0; e < net->nentries; e++)
        if (net->entries[e].is_buffer == is_buffer && net->entries[e].offset == offset)
            return e;
    return -1;
}

/* Which of op's tensors the mask freezes (PTL_NET_FROZEN_* bits: parameter k's bit k; BN_EVAL when its
 * buffers are); an error when it freezes some of the op's buffers only. */
static int op_frozen_bits(const ptl_network *net, const ptl_net_op *op, const uint8_t *frozen, uint8_t *bits)
{
    int e[PTL_NET_MAX_OP_PARAMS + PTL_NET_MAX_OP_BUFFERS], nbuf = 0;
    *bits = 0;
    for (int k = 0; k < op->nparams + op->nbuffers; k++) {
        const int is_buffer = k >= op->nparams;
        const int64_t off = is_buffer ? op->buffer[k - op->nparams] : op->param[k];
        if ((e[k] = entry_at(net, is_buffer, off)) < 0)
            return ptl_set_error(PTL_ERR_RUNTIME, "network description: op of layer %d has no tensor at %s offset "
                                 "%lld", op->layer, is_buffer ? "buffer" : "parameter", (long long)off);
        if (frozen && frozen[e[k]]) {
            *bits |= (uint8_t)(is_buffer ? 0 : 1u << k);
            nbuf += is_buffer;
        }
    }
    if (nbuf == op->nbuffers && nbuf)
        *bits |= PTL_NET_FROZEN_BN_EVAL;
    else if (nbuf)
        return ptl_set_error(PTL_ERR_VALUE, "frozen: %s and %s are frozen together or not at all (frozen running "
                             "statistics run in eval mode)", net->entries[e[op->nparams]].name,
                             net->entries[e[op->nparams + 1]].name);
    return 0;
}

/* From the ops' frozen bits, in op order (producers first): whether each op's backward runs and each value's
 * gradient is needed (need, zeroed): a value needs one when an op writing it trains a parameter or passes the
 * gradient on to an input that needs one; the image needs one only when asked (the backward's d_images).
 * Returns the count of backwards that run. */
static int needs_of(const ptl_network *net, const uint8_t *frozen_bits, uint8_t *op_needed, uint8_t *need)
{
    int nbackward = 0;
    for (int i = 0; i < net->nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        const uint8_t all = (uint8_t)((1u << op->nparams) - 1);
        int needed = (frozen_bits[i] & all) != all;
        for (int j = 0; j < op->nin; j++)
            needed |= (op->grad_in >> j & 1u) && need[op->ins[j].value];
        if (op->out >= 0)
            need[op->out] |= (uint8_t)needed;
        if (op->out2 >= 0)
            need[op->out2] |= (uint8_t)needed;
        op_needed[i] = (uint8_t)needed;
        nbackward += needed;
    }
    return nbackward;
}

int ptl_net_exec_set_frozen(ptl_net_exec *x, const uint8_t *frozen, int64_t n)
{
    const ptl_network *net = x->net;
    if (frozen && n != net->nentries)
        return ptl_set_error(PTL_ERR_VALUE, "frozen: expected one flag per tensor of the network (%d), got %lld",
                             net->nentries, (long long)n);
    int nfrozen = 0;
    for (int64_t e = 0; frozen && e < n; e++) {
        if (frozen[e] > 1)
            return ptl_set_error(PTL_ERR_VALUE, "frozen: the flag of %s is not 0 or 1", net->entries[e].name);
        nfrozen += frozen[e];
    }
    /* bits: per op its frozen bits, then whether its backward runs; nothing of x changes before all is known */
    uint8_t *bits = calloc(2 * (size_t)net->nops, 1), *need = calloc((size_t)net->nvalues, 1);
    if (!bits || !need) {
        oom();
        goto fail;
    }
    for (int i = 0; i < net->nops; i++)
        PTL_CHECK(op_frozen_bits(net, &net->ops[i], frozen, &bits[i]));
    const int nbackward = needs_of(net, bits, bits + net->nops, need);
    memcpy(x->op_frozen, bits, (size_t)net->nops);
    memcpy(x->op_needed, bits + net->nops, (size_t)net->nops);
    memcpy(x->grad_needed, need, (size_t)net->nvalues);
    free(bits);
    free(need);
    x->nfrozen = nfrozen;
    x->backward_ops = nbackward;
    ptl_net_exec_retire(x);
    x->have_forward = 0;
    return 0;
fail:
    free(bits);
    free(need);
    return -1;
}

static void drop_slots(ptl_net_exec *x)
{
    for (int k = 0; k < PTL_NET_SHAPES; k++)
        free_slot(x, &x->slot[k]);
    x->have_forward = 0;
}

void ptl_net_exec_set_conv_options(ptl_net_exec *x, const ptl_net_conv_opts *o)
{
    x->opts = *o;
    drop_slots(x);
}

void ptl_net_exec_set_queue_workspace_limit(ptl_net_exec *x, size_t bytes)
{
    x->queue_ws_limit = bytes;
    drop_slots(x);
}

int ptl_net_exec_set_side_lag(ptl_net_exec *x, int lag)
{
    if (lag < 0 || lag > PTL_NET_SIDE_MAX_LAG)
        return ptl_set_error(PTL_ERR_VALUE, "side_lag must be in [0, %d] (got %d)", PTL_NET_SIDE_MAX_LAG, lag);
    ptl_exec_ctx **side = &x->side[PTL_NET_SIDE_WGRAD];
    if (lag && x->be->side_open && !*side && x->be->side_open(x->ctx, PTL_NET_SIDE_WGRAD, side))
        return -1;
    x->side_lag = lag;
    drop_slots(x);
    return 0;
}

int ptl_net_exec_set_branches(ptl_net_exec *x, int on, int attached)
{
    if (on < 0 || on > PTL_NET_BRANCHES_EARLY)
        return ptl_set_error(PTL_ERR_VALUE, "branches must be 0, 1 or %d (got %d)", PTL_NET_BRANCHES_EARLY, on);
    if (attached < 0 || attached > 1)
        return ptl_set_error(PTL_ERR_VALUE, "attached must be 0 or 1 (got %d)", attached);
    for (int k = PTL_NET_SIDE_DETACHED; on && x->be->side_open && k <= PTL_NET_SIDE_ATTACHED_WGRAD; k++)
        if (!x->side[k] && x->be->side_open(x->ctx, k, &x->side[k]))
            return -1;
    x->branches = x->br.n ? on : 0;
    x->attached = attached;
    drop_slots(x);
    return 0;
}

void ptl_net_exec_set_share_memory(ptl_net_exec *x, int share)
{
    x->share = share & (PTL_NET_SHARE_GRADIENTS | PTL_NET_SHARE_ACTIVATIONS);
    drop_slots(x);
}

int ptl_net_exec_set_cat_in_place(ptl_net_exec *x, int on)
{
    if (on < 0 || on > 1)
        return ptl_set_error(PTL_ERR_VALUE, "cat_in_place must be 0 or 1 (got %d)", on);
    /* the new plans are made aside, so that a failure leaves the executor as it was */
    ptl_net_op *ops = malloc((size_t)(x->net->nops ? x->net->nops : 1) * sizeof *ops);
    ptl_net_grad_plan gp;
    ptl_net_branches br;
    memset(&gp, 0, sizeof gp);
    memset(&br, 0, sizeof br);
    const int parts = ops ? plans_make(x, on, ops, &gp, &br) : oom();
    if (parts < 0) {
        free(ops);
        return -1;
    }
    drop_slots(x);
    free(x->run.ops);
    x->run.ops = ops;
    ptl_net_grad_plan_free(&x->gp);
    ptl_net_branches_free(&x->br);
    x->gp = gp;
    x->br = br;
    x->cat_in_place = on;
    x->cat_parts = parts;
    memset(x->grad_needed, 0, (size_t)x->net->nvalues);
    x->backward_ops = needs_of(x->net, x->op_frozen, x->op_needed, x->grad_needed);
    x->branches = x->br.n ? x->branches : 0;
    return 0;
}

int ptl_net_exec_zero_grad(ptl_net_exec *x)
{
    if (activate(x->be, x->ctx))
        return -1;
    return x->be->zero(x->ctx, x->grads, (size_t)x->net->nparams * x->msz);
}

void *ptl_net_exec_output(ptl_net_exec *x, int branch, int which) { return x->cur->out[branch & 1][which & 1].ptr; }

void *ptl_net_exec_input(ptl_net_exec *x)
{
    return (char *)x->cur->arena.ptr + (size_t)x->cur->L.voff[x->net->input] * x->csz;
}

void ptl_net_exec_memory(const ptl_net_exec *x, int64_t *fixed_bytes, int64_t *shape_bytes)
{
    const ptl_network *net = x->net;
    int64_t fixed = 2 * x->wt.total * (int64_t)x->csz + x->wt.n * (int64_t)sizeof(ptl_wcast_entry) +
                    x->wt.ntiles * (int64_t)sizeof(ptl_wcast_tile);
    const int64_t sizes[4] = {net->nparams, net->nparams, net->nbuffers, net->nstats};
    for (int i = 0; i < 4; i++)
        fixed += x->own[i].block ? sizes[i] * (int64_t)x->msz : 0;
    int64_t shape = 0;
    for (int k = 0; k < PTL_NET_SHAPES; k++) {
        const ptl_net_slot *s = &x->slot[k];
        if (s->L.B)
            shape += (s->L.arena_numel + s->L.saved_numel) * (int64_t)x->csz + (int64_t)s->kept_bytes +
                     2 * (int64_t)s->L.B * s->L.A * (4 + net->nc) * (int64_t)x->msz;
        for (int q = 0; s->L.B && q < PTL_NET_QUEUES; q++)
            shape += (int64_t)s->ws_bytes[q];
    }
    *fixed_bytes = fixed;
    *shape_bytes = shape;
}

/* ------------------------------------------------------------------------------ execution */

#define AT(base, off) ((char *)(base) + (size_t)(off) * x->csz)  /* compute dtype */
#define PAR(base, off) ((char *)(base) + (size_t)(off) * x->msz) /* master dtype */

/* The workspace of conv op i's forward (step 0) or backward step (1) and its bytes: its own in the arena
 * (ptl_net_layout's ws_off), else its queue's. */
static void *op_workspace(const ptl_net_exec *x, int i, int step, size_t *bytes)
{
    const ptl_net_layout *L = &x->cur->L;
    const int64_t n = L->ws_numel[2 * i + step];
    *bytes = n ? (size_t)n * x->csz : x->q_ws_bytes;
    return n ? AT(x->cur->arena.ptr, L->ws_off[2 * i + step]) : x->q_ws;
}

static ptl_net_dims dims(const ptl_net_exec *x, int v) { return ptl_net_value_dims(x->net, &x->cur->L, v); }

/* Whether value v's gradient is wanted: it depends on a trainable parameter, or the image gradient is
 * asked for (every value depends on the image). */
static int needs(const ptl_net_exec *x, int v, int want_input_grad) { return want_input_grad || x->grad_needed[v]; }

static ptl_net_arg value_arg(ptl_net_exec *x, int v, int grad)
{
    const ptl_net_dims d = dims(x, v);
    const int C = x->net->values[v].C;
    void *arena = x->cur->arena.ptr;
    void *g = grad ? AT(arena, x->cur->L.goff[v]) : NULL;
    return (ptl_net_arg){AT(arena, x->cur->L.voff[v]), g, d.h, d.w, C, 0, C, 0};
}

/* Op i's layer call on the current shape. A backward's call has the gradients: the outputs', each input's
 * that its op writes and something needs (overwritten by the first writer of a whole value, else added: a
 * first writer of only some channels finds its slot zeroed), and the trainable parameters'; of the
 * activations only the inputs the op keeps. */
static void make_call(ptl_net_exec *x, int i, int backward, int want_input_grad, ptl_net_call *c)
{
    const ptl_net_op *op = &x->net->ops[i];
    ptl_net_slot *const S = x->cur;
    const uint8_t fz = x->op_frozen[i];
    memset(c, 0, sizeof *c);
    c->op = op;
    c->be = x->be;
    c->dt = x->cdt;
    c->B = S->L.B;
    c->training = (backward ? x->fwd_training : x->training) && !(fz & PTL_NET_FROZEN_BN_EVAL);
    c->nin = op->nin;
    for (int j = 0; j < op->nin; j++) {
        const ptl_net_part *in = &op->ins[j];
        c->in[j] = value_arg(x, in->value,
                             backward && (op->grad_in >> j & 1u) && needs(x, in->value, want_input_grad));
        if (backward && !(op->keep_in >> j & 1u))
            c->in[j].data = NULL; /* its memory may hold another value by now */
        c->in[j].c0 = in->c0;
        c->in[j].nc = in->nc;
        c->in[j].accumulate = !(x->gp.first[i] >> j & 1u) || x->gp.zero_op[in->value] == i;
    }
    const int outs[2] = {op->out, op->out2};
    for (int k = 0; k < 2; k++)
        if (outs[k] >= 0) {
            c->out[c->nout] = value_arg(x, outs[k], backward);
            if (backward)
                c->out[c->nout].data = NULL; /* dead after its last forward reader */
            if (k == 0 && op->out_nc) { /* its part of a Concat built in place */
                c->out[0].c0 = op->out_c0;
                c->out[0].nc = op->out_nc;
            }
            c->nout++;
        }
    c->saved = AT(S->saved.ptr, S->L.saved_off[i]);
    c->kept = S->kept_off && S->kept_off[i] >= 0 ? (char *)S->kept.ptr + S->kept_off[i] : NULL;
    for (int k = 0; k < op->nparams; k++) {
        c->params[k] = PAR(x->params, op->param[k]);
        c->grads[k] = fz & (1u << k) ? NULL : PAR(x->grads, op->param[k]);
    }
    for (int k = 0; k < op->nbuffers; k++)
        c->buffers[k] = PAR(x->buffers, op->buffer[k]);
}

/* Where conv op i's output (grad 0) or its gradient (1) starts and its row stride: its channels of a Concat
 * built in place, or the whole value. */
static void *conv_out(const ptl_net_exec *x, const ptl_net_op *op, int grad, int *ld)
{
    const ptl_net_layout *L = &x->cur->L;
    *ld = x->net->values[op->out].C;
    return AT(x->cur->arena.ptr, (grad ? L->goff : L->voff)[op->out] + op->out_c0);
}

int ptl_net_conv_batchnorm_forward(const ptl_net_backend *be, ptl_exec_ctx *ctx, const void *plan, ptl_dtype dt,
                                   int64_t m, int c, const void *x, const void *w, void *z, void *ws, size_t ws_bytes,
                                   const void *gamma, const void *beta, void *running_mean, void *running_var,
                                   ptl_act act, void *save_mean, void *save_invstd, void *y, int ld)
{
    if (be->conv_batchnorm_forward)
        return be->conv_batchnorm_forward(ctx, plan, x, w, z, ws, ws_bytes, gamma, beta, running_mean, running_var,
                                          act, save_mean, save_invstd, y, ld);
    PTL_CHECK(be->conv_forward(ctx, plan, x, w, NULL, z, ws, ws_bytes));
    return be->batchnorm_forward(ctx, dt, m, c, z, gamma, beta, running_mean, running_var, 1, act, save_mean,
                                 save_invstd, y, ld);
fail:
    return -1;
}

int ptl_net_conv_backward_input_add(const ptl_net_backend *be, ptl_exec_ctx *ctx, const void *plan, ptl_dtype dt,
                                    int64_t n, const void *dy, const void *w, void *dx, void *scratch, void *ws,
                                    size_t ws_bytes)
{
    if (be->conv_backward_input_add)
        return be->conv_backward_input_add(ctx, plan, dy, w, dx, scratch, ws, ws_bytes);
    PTL_CHECK(be->conv_backward_input(ctx, plan, dy, w, scratch, ws, ws_bytes));
    return be->accumulate(ctx, dt, n, scratch, dx);
fail:
    return -1;
}

static int forward_op(ptl_net_exec *x, int i)
{
    const ptl_net_backend *be = x->be;
    ptl_net_slot *const S = x->cur;
    const ptl_net_op *op = &x->net->ops[i];
    const ptl_net_value *V = x->net->values;
    const int64_t *vo = S->L.voff;
    const ptl_dtype dt = x->cdt;
    void *act = S->arena.ptr;
    switch (op->kind) {
    case PTL_OP_CONV:
    case PTL_OP_CONV_BIAS: {
        const void *w = AT(x->wc.ptr, x->wt.op_w[i]);
        const void *in = AT(act, vo[op->ins[0].value]);
        size_t wsb;
        void *ws = op_workspace(x, i, 0, &wsb);
        if (op->kind == PTL_OP_CONV_BIAS) {
            const void *bias =
                x->wt.op_b[i] >= 0 ? AT(x->wc.ptr, x->wt.op_b[i]) : PAR(x->params, op->param[PTL_CONV_BIAS]);
            return be->conv_forward(x->q, S->plans[i], in, w, bias, AT(act, vo[op->out]), ws, wsb);
        }
        int ld;
        void *y = conv_out(x, op, 0, &ld), *z = AT(act, vo[op->z]);
        const int64_t m = dims(x, op->out).m;
        void *gamma = PAR(x->params, op->param[PTL_CONV_GAMMA]), *beta = PAR(x->params, op->param[PTL_CONV_BETA]);
        void *rm = PAR(x->buffers, op->buffer[PTL_BN_RUNNING_MEAN]);
        void *rv = PAR(x->buffers, op->buffer[PTL_BN_RUNNING_VAR]);
        void *sm = PAR(x->stats, op->stat_off), *si = PAR(x->stats, op->stat_off + op->cout);
        const ptl_act a = op->act ? PTL_ACT_SILU : PTL_ACT_NONE;
        if (x->training && !(x->op_frozen[i] & PTL_NET_FROZEN_BN_EVAL))
            return ptl_net_conv_batchnorm_forward(be, x->q, S->plans[i], dt, m, op->cout, in, w, z, ws, wsb, gamma,
                                                  beta, rm, rv, a, sm, si, y, ld);
        PTL_CHECK(be->conv_forward(x->q, S->plans[i], in, w, NULL, z, ws, wsb));
        return be->batchnorm_forward(x->q, dt, m, op->cout, z, gamma, beta, rm, rv, 0, a, sm, si, y, ld);
    }
    case PTL_OP_HEAD: {
        const int in = op->ins[0].value;
        const ptl_net_dims d = dims(x, in);
        return be->head_out(x->q, dt, S->L.B, (int64_t)d.h * d.w, V[in].C, S->L.A, S->L.level_off[op->level],
                            AT(act, vo[in]), S->out[op->branch][op->box ? 0 : 1].ptr);
    }
    default: {
        ptl_net_call c;
        make_call(x, i, 0, 0, &c);
        return be->layer[op->kind].forward(x->q, &c);
    }
    }
fail:
    return -1;
}

/* Whether conv op i's backward makes parameter gradients (its weight or its bias trains). */
static int conv_trains(const ptl_net_exec *x, int i)
{
    const uint8_t fz = x->op_frozen[i];
    return !(fz & PTL_NET_FROZEN_W) || (x->net->ops[i].kind == PTL_OP_CONV_BIAS && !(fz & PTL_NET_FROZEN_BIAS));
}

/* Conv op i's bias and weight gradients (of its trainable tensors), queued on ctx with workspace ws. */
static int conv_param_grads(ptl_net_exec *x, ptl_exec_ctx *ctx, int i, void *ws, size_t ws_bytes)
{
    const ptl_net_backend *be = x->be;
    ptl_net_slot *const S = x->cur;
    const ptl_net_op *op = &x->net->ops[i];
    const void *p = S->plans[i];
    const uint8_t fz = x->op_frozen[i];
    const void *dy = AT(S->arena.ptr, S->L.goff[op->kind == PTL_OP_CONV ? op->z : op->out]);
    if (op->kind == PTL_OP_CONV_BIAS && !(fz & PTL_NET_FROZEN_BIAS)) {
        void *db = x->wt.op_b[i] >= 0 ? AT(x->wgc.ptr, x->wt.op_b[i]) : PAR(x->grads, op->param[PTL_CONV_BIAS]);
        PTL_CHECK(be->conv_backward_bias(ctx, p, dy, db, ws, ws_bytes));
    }
    if (!(fz & PTL_NET_FROZEN_W))
        PTL_CHECK(be->conv_backward_weight(ctx, p, AT(S->arena.ptr, S->L.voff[op->ins[0].value]), dy,
                                           AT(x->wgc.ptr, x->wt.op_w[i]), ws, ws_bytes));
    return 0;
fail:
    return -1;
}

/* Has later ops queued on side queue k's context and workspace (k < 0: the main queue's, as also without
 * side queues); in_branch: 0, or 1 + attached for a branch's ops. */
static void use_queue(ptl_net_exec *x, int k, int in_branch)
{
    const int q = k >= 0 && x->side[k] ? 1 + k : 0;
    x->q = q ? x->side[k] : x->ctx;
    x->q_ws = x->cur->ws[q].ptr;
    x->q_ws_bytes = x->cur->ws_bytes[q];
    x->in_branch = in_branch;
}

static void use_main_queue(ptl_net_exec *x) { use_queue(x, -1, 0); }

/* The backward's scratch of the queue now in use. */
static void *scratch_of(const ptl_net_exec *x)
{
    const ptl_net_layout *L = &x->cur->L;
    return AT(x->cur->arena.ptr, x->in_branch ? L->branch_scratch_off[x->in_branch - 1] : L->scratch_off);
}

/* The weight-gradient work of mark m (queued side_lag steps ago), at the start of a backward step: awaited
 * on the main queue, or, without side queues, run now. */
static int side_settle(ptl_net_exec *x, int m)
{
    const int i = x->side_op[m];
    if (i < 0)
        return 0;
    x->side_op[m] = -1;
    if (x->side[PTL_NET_SIDE_WGRAD])
        return x->be->side_await(x->ctx, PTL_NET_SIDE_WGRAD, m, -1);
    return conv_param_grads(x, x->ctx, i, x->cur->ws[0].ptr, x->cur->ws_bytes[0]);
}

/* Whether branch b runs beside the rest (the executor runs branches of its kind apart). */
static int branch_apart(const ptl_net_exec *x, int b)
{
    return x->branches && (!x->br.b[b].attached || x->attached);
}

/* The mark of branch b on its queue: one per branch, in order of fork, cycling (an await of a mark recorded
 * again later waits for more, never less). */
static int branch_mark(const ptl_net_exec *x, int b)
{
    int n = 0;
    for (int k = 0; k < b; k++)
        n += x->br.b[k].attached == x->br.b[b].attached;
    return n % PTL_NET_SIDE_MARKS;
}

/* The backward's parameter gradients of branch b's conv op i (step slot m of its pass): on their own queue,
 * forked from the branch's and marked m there, or, without that queue, left for branch_settle to run. */
static int branch_param_grads(ptl_net_exec *x, int b, int *pending, int m, int i)
{
    const int kw = branch_wgrad_queue(x, b);
    pending[m] = i;
    if (!branch_wgrad_apart(x, b))
        return 0;
    PTL_CHECK(x->be->side_fork(x->ctx, kw, branch_queue(x, b)));
    PTL_CHECK(conv_param_grads(x, x->side[kw], i, x->cur->ws[1 + kw].ptr, x->cur->ws_bytes[1 + kw]));
    return x->be->side_mark(x->ctx, kw, m);
fail:
    return -1;
}

/* Those of step slot m, side_lag steps later (the layout keeps what they read until then): the branch's
 * queue waits for them, or, without their queue, they run now on it. */
static int branch_settle(ptl_net_exec *x, int b, int *pending, int m)
{
    const int i = pending[m];
    if (i < 0)
        return 0;
    pending[m] = -1;
    if (branch_wgrad_apart(x, b))
        return x->be->side_await(x->ctx, branch_wgrad_queue(x, b), m, branch_queue(x, b));
    return conv_param_grads(x, x->q, i, x->q_ws, x->q_ws_bytes);
}

/* One pass of branch b: its forwards in order, or its backwards (each with its zeroing) in reverse, queued
 * on its side queue between a fork and its mark, or, without side queues, run now. With a side lag the
 * backward's conv parameter gradients of step t run beside the branch's steps after it, and are done by
 * step t + side_lag (as the main queue's are: side_settle), all of them by the branch's mark. */
static int forward_op(ptl_net_exec *x, int i);
static int backward_step(ptl_net_exec *x, int i, const void *const d_out[2][2], int want);
static int branch_pass(ptl_net_exec *x, int b, int backward, const void *const d_out[2][2], int want)
{
    const ptl_net_branch *B = &x->br.b[b];
    const int k = branch_queue(x, b), lag = backward ? x->side_lag : 0, steps = B->last - B->first + 1;
    int pending[PTL_NET_SIDE_MAX_LAG];
    for (int m = 0; m < PTL_NET_SIDE_MAX_LAG; m++)
        pending[m] = -1;
    if (x->side[k])
        PTL_CHECK(x->be->side_fork(x->ctx, k, -1));
    use_queue(x, k, 1 + B->attached);
    for (int n = 0; n < steps + lag; n++) {
        const int i = backward ? B->last - n : B->first + n;
        if (lag)
            PTL_CHECK(branch_settle(x, b, pending, n % lag));
        if (n >= steps || x->br.op[i] != b + 1)
            continue;
        PTL_CHECK(backward ? backward_step(x, i, d_out, want) : forward_op(x, i));
        if (lag && is_conv(&x->net->ops[i]) && (want || x->op_needed[i]) && conv_trains(x, i))
            PTL_CHECK(branch_param_grads(x, b, pending, n % lag, i));
    }
    use_main_queue(x);
    return x->side[k] ? x->be->side_mark(x->ctx, k, branch_mark(x, b)) : 0;
fail:
    use_main_queue(x);
    return -1;
}

/* Whether the branches' passes start at their forks: on their side queues, or, without side queues, when
 * asked (PTL_NET_BRANCHES_EARLY), on the main queue. */
static int branch_early(const ptl_net_exec *x)
{
    return x->branches && (x->side[PTL_NET_SIDE_DETACHED] || x->branches == PTL_NET_BRANCHES_EARLY);
}

/* The join of branch b's pass: the main queue waits for its mark, or, without side queues, the pass runs
 * now unless it ran at the fork (the latest and the earliest points it may run, which the CPU tests use). */
static int branch_join(ptl_net_exec *x, int b, int backward, const void *const d_out[2][2], int want)
{
    const int k = branch_queue(x, b);
    if (x->side[k])
        return x->be->side_await(x->ctx, k, branch_mark(x, b), -1);
    return branch_early(x) ? 0 : branch_pass(x, b, backward, d_out, want);
}

/* The backward joins of the branches that join before op i's step (-1: at the backward's end), in reverse
 * order of fork. */
static int branch_joins(ptl_net_exec *x, int i, const void *const d_out[2][2], int want)
{
    for (int b = x->br.n - 1; b >= 0; b--)
        if (x->br.b[b].join == i && branch_apart(x, b))
            PTL_CHECK(branch_join(x, b, 1, d_out, want));
    return 0;
fail:
    return -1;
}

/* After a failure: nothing is left pending, and the side queues' work joins the main queue's (a graph
 * capture must not end with a queue apart); the failure's error is kept. */
static void side_abandon(ptl_net_exec *x)
{
    for (int m = 0; m < PTL_NET_SIDE_MAX_LAG; m++)
        x->side_op[m] = -1;
    use_main_queue(x);
    char msg[1024];
    const ptl_error_kind kind = ptl_error_kind_get();
    snprintf(msg, sizeof msg, "%s", ptl_error_message());
    for (int k = 0; k < PTL_NET_SIDE_STREAMS; k++)
        if (x->side[k] && x->be->side_mark(x->ctx, k, 0) == 0)
            (void)x->be->side_await(x->ctx, k, 0, -1);
    ptl_set_error(kind, "%s", msg);
}

/* Conv backward from dy: bias and weight gradients (in order, or beside the following steps: side_lag; a
 * branch's lagging ones are queued by its pass), then dx into grad(in) when wanted: written directly by the
 * first writer of that gradient, else added (by the backend's conv_backward_input_add where it has one, else
 * through scratch). */
static int conv_backward(ptl_net_exec *x, int i, const void *dy, int want_input_grad)
{
    const ptl_net_backend *be = x->be;
    ptl_net_slot *const S = x->cur;
    const ptl_net_op *op = &x->net->ops[i];
    const void *p = S->plans[i];
    const int in = op->ins[0].value;
    const int param_grads = conv_trains(x, i) && !(x->in_branch && x->side_lag);
    size_t wsb;
    void *ws = op_workspace(x, i, 1, &wsb);
    if (param_grads && !ptl_net_exec_param_grads_lag(x, i, p))
        PTL_CHECK(conv_param_grads(x, x->q, i, ws, wsb));
    else if (param_grads) {
        const int m = (x->net->nops - 1 - i) % x->side_lag;
        if (x->side[PTL_NET_SIDE_WGRAD]) {
            PTL_CHECK(be->side_fork(x->ctx, PTL_NET_SIDE_WGRAD, -1));
            PTL_CHECK(conv_param_grads(x, x->side[PTL_NET_SIDE_WGRAD], i, S->ws[1 + PTL_NET_SIDE_WGRAD].ptr,
                                      S->ws_bytes[1 + PTL_NET_SIDE_WGRAD]));
            PTL_CHECK(be->side_mark(x->ctx, PTL_NET_SIDE_WGRAD, m));
        }
        x->side_op[m] = i;
    }
    if (!(op->grad_in & 1u) || !needs(x, in, want_input_grad))
        return 0;
    void *gin = AT(S->arena.ptr, S->L.goff[in]);
    const void *w = AT(x->wc.ptr, x->wt.op_w[i]);
    if (x->gp.first[i] & 1u)
        return be->conv_backward_input(x->q, p, dy, w, gin, ws, wsb);
    return ptl_net_conv_backward_input_add(be, x->q, p, x->cdt, dims(x, in).m * op->cin, dy, w, gin, scratch_of(x),
                                           ws, wsb);
fail:
    return -1;
}

static int backward_op(ptl_net_exec *x, int i, const void *const d_out[2][2], int want_input_grad)
{
    const ptl_net_backend *be = x->be;
    ptl_net_slot *const S = x->cur;
    const ptl_net_op *op = &x->net->ops[i];
    const ptl_net_value *V = x->net->values;
    const int64_t *vo = S->L.voff, *go = S->L.goff;
    const ptl_dtype dt = x->cdt;
    const uint32_t first = x->gp.first[i];
    void *const arena = S->arena.ptr; /* activations at vo, gradients at go */
    void *const scratch = scratch_of(x);
    const uint8_t fz = x->op_frozen[i];
    int ld;
    const void *dy;
    switch (op->kind) {
    case PTL_OP_CONV:
        dy = conv_out(x, op, 1, &ld);
        PTL_CHECK(be->batchnorm_backward(
            x->q, dt, dims(x, op->out).m, op->cout, AT(arena, vo[op->z]), dy, ld,
            PAR(x->params, op->param[PTL_CONV_GAMMA]), PAR(x->params, op->param[PTL_CONV_BETA]),
            PAR(x->stats, op->stat_off),
            PAR(x->stats, op->stat_off + op->cout), x->fwd_training && !(fz & PTL_NET_FROZEN_BN_EVAL),
            op->act ? PTL_ACT_SILU : PTL_ACT_NONE, AT(arena, go[op->z]),
            fz & PTL_NET_FROZEN_GAMMA ? NULL : PAR(x->grads, op->param[PTL_CONV_GAMMA]),
            fz & PTL_NET_FROZEN_BETA ? NULL : PAR(x->grads, op->param[PTL_CONV_BETA])));
        return conv_backward(x, i, AT(arena, go[op->z]), want_input_grad);
    case PTL_OP_CONV_BIAS:
        return conv_backward(x, i, AT(arena, go[op->out]), want_input_grad);
    case PTL_OP_HEAD: {
        const int in = op->ins[0].value;
        const void *src = d_out[op->branch][op->box ? 0 : 1];
        const ptl_net_dims d = dims(x, in);
        if (!src)
            return first & 1u ? be->zero(x->q, AT(arena, go[in]), (size_t)d.m * V[in].C * x->csz) : 0;
        return be->head_grad(x->q, dt, S->L.B, (int64_t)d.h * d.w, V[in].C, S->L.A, S->L.level_off[op->level], src,
                             AT(arena, go[in]), !(first & 1u));
    }
    default: {
        const ptl_net_layer *r = &be->layer[op->kind];
        ptl_net_call c;
        make_call(x, i, 1, want_input_grad, &c);
        /* a backward that always overwrites writes the scratch where its input gradient adds */
        void *const gin = c.in[0].grad;
        if (r->overwrites && gin && c.in[0].accumulate)
            c.in[0].grad = scratch;
        PTL_CHECK(r->backward(x->q, &c));
        if (c.in[0].grad == gin)
            return 0;
        return be->accumulate(x->q, dt, ptl_net_arg_rows(&c, &c.in[0]) * c.in[0].c, scratch, gin);
    }
    }
fail:
    return -1;
}

int ptl_net_exec_forward(ptl_net_exec *x, const void *images, int B, int H, int W)
{
    if (ptl_net_exec_prepare(x, B, H, W) || activate(x->be, x->ctx))
        return -1;
    x->have_forward = 0;
    x->fwd_training = x->training;
    use_main_queue(x);
    PTL_CHECK(x->be->weight_cast(x->ctx, x->cdt, &x->wtable, x->params, x->wc.ptr));
    if (images != ptl_net_exec_input(x))
        PTL_CHECK(x->be->copy(x->ctx, ptl_net_exec_input(x), images, (size_t)B * H * W * 3 * x->csz));
    for (int i = 0; i < x->net->nops; i++) {
        for (int b = 0; branch_early(x) && b < x->br.n; b++)
            if (x->br.b[b].fork == i && branch_apart(x, b))
                PTL_CHECK(branch_pass(x, b, 0, NULL, 0));
        if (branch_of(x, i) < 0)
            PTL_CHECK(forward_op(x, i));
    }
    for (int b = 0; b < x->br.n; b++)
        if (branch_apart(x, b))
            PTL_CHECK(branch_join(x, b, 0, NULL, 0));
    x->have_forward = 1;
    return 0;
fail:
    side_abandon(x);
    x->have_forward = 0;
    return -1;
}

/* Backward step of op i: the zeroing of the gradients it writes first in part, then its backward. A gradient
 * nothing needs is never written, read or zeroed: all its writers (the consumers of its value) skip it and
 * so does its reader (the producer, which then has nothing to do); every needed gradient keeps the writers,
 * first writer and zeroing of the gradient plan. */
static int backward_step(ptl_net_exec *x, int i, const void *const d_out[2][2], int want)
{
    ptl_net_slot *const S = x->cur;
    for (int k = x->gp.zero_begin[i]; k < x->gp.zero_begin[i + 1]; k++) {
        const int v = x->gp.zero_list[k];
        if (needs(x, v, want))
            PTL_CHECK(x->be->zero(x->q, AT(S->arena.ptr, S->L.goff[v]),
                                  (size_t)dims(x, v).m * x->net->values[v].C * x->csz));
    }
    if (want || x->op_needed[i])
        PTL_CHECK(backward_op(x, i, d_out, want));
    return 0;
fail:
    return -1;
}

int ptl_net_exec_backward(ptl_net_exec *x, const void *const d_out[2][2], void *d_images)
{
    ptl_net_slot *const S = x->cur;
    if (!x->have_forward)
        return ptl_set_error(PTL_ERR_RUNTIME, "network backward needs a successful forward of the same shape first");
    if (S->L.forward_only)
        return ptl_set_error(PTL_ERR_RUNTIME, "network backward: the last forward ran without gradients (it kept "
                                              "nothing for a backward); run it again with gradients on");
    PTL_CHECK(activate(x->be, x->ctx));
    use_main_queue(x);
    PTL_CHECK(wgc_clean(x));
    x->wgc_dirty = 1;
    const int want = d_images != NULL;
    /* the branches' backwards in reverse order of fork: on each queue the one joined first comes first */
    for (int b = x->br.n - 1; branch_early(x) && b >= 0; b--)
        if (branch_apart(x, b))
            PTL_CHECK(branch_pass(x, b, 1, d_out, want));
    /* backward step t runs op nops-1-t; a branch joins before its join op's step (-1: at the end) */
    for (int i = x->net->nops - 1; i >= 0; i--) {
        if (x->side_lag)
            PTL_CHECK(side_settle(x, (x->net->nops - 1 - i) % x->side_lag));
        PTL_CHECK(branch_joins(x, i, d_out, want));
        if (branch_of(x, i) < 0)
            PTL_CHECK(backward_step(x, i, d_out, want));
    }
    for (int t = x->net->nops; t < x->net->nops + x->side_lag; t++)
        PTL_CHECK(side_settle(x, t % x->side_lag));
    PTL_CHECK(branch_joins(x, -1, d_out, want));
    PTL_CHECK(x->be->weight_grad(x->ctx, x->cdt, &x->wtable, x->wgc.ptr, x->grads));
    x->wgc_dirty = 0;
    if (d_images)
        PTL_CHECK(x->be->copy(x->ctx, d_images, AT(S->arena.ptr, S->L.goff[x->net->input]),
                              (size_t)S->L.B * S->L.H * S->L.W * 3 * x->csz));
    /* the gradients took the memory of the activations they outlive: the next backward needs a new forward */
    x->have_forward = 0;
    S->warm = 1;
    return 0;
fail:
    side_abandon(x);
    x->have_forward = 0;
    return -1;
}
