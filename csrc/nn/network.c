/* YOLO26 network builder: scale table, layer records, state_dict names, flat buffers, init. */
#include "network.h"

#include "../ops/philox.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double depth;
    int width4; /* width multiple times 4 */
    int max_ch;
} scale_row;

static int scale_lookup(char scale, scale_row *r)
{
    switch (scale) {
    case 'n': *r = (scale_row){0.50, 1, 1024}; return 0;
    case 's': *r = (scale_row){0.50, 2, 1024}; return 0;
    case 'm': *r = (scale_row){0.50, 4, 512}; return 0;
    case 'l': *r = (scale_row){1.00, 4, 512}; return 0;
    case 'x': *r = (scale_row){1.00, 6, 512}; return 0;
    default: return -1;
    }
}

/* ---------------------------------------------------------------------------------- builder core */

typedef struct {
    ptl_network *net;
    scale_row sc;
    int layer;
    int head; /* entries registered now belong to this Detect head (0 = none) */
    int no_dx_next;
} builder;

static int grow(void **p, int *cap, int n, size_t elem)
{
    if (n < *cap)
        return 0;
    int nc = *cap ? 2 * *cap : 64;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q)
        return ptl_set_error(PTL_ERR_MEMORY, "network builder: out of memory");
    *p = q;
    *cap = nc;
    return 0;
}

static int add_entry(builder *b, int is_buffer, int init, double bound, int ndim, const int64_t *shape,
                     int64_t *off_out, const char *fmt, ...)
{
    ptl_network *net = b->net;
    if (grow((void **)&net->entries, &net->cap_entries, net->nentries, sizeof(ptl_net_entry)))
        return -1;
    ptl_net_entry *e = &net->entries[net->nentries++];
    memset(e, 0, sizeof *e);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name, sizeof e->name, fmt, ap);
    va_end(ap);
    e->is_buffer = is_buffer;
    e->init = init;
    e->bound = bound;
    e->ndim = ndim;
    e->numel = 1;
    for (int i = 0; i < ndim; i++) {
        e->shape[i] = shape[i];
        e->numel *= shape[i];
    }
    e->layer = b->layer;
    e->head = b->head;
    int64_t *total = is_buffer ? &net->nbuffers : &net->nparams;
    e->offset = *total;
    *total += e->numel;
    *off_out = e->offset;
    return 0;
}

static int new_value(builder *b, int C, int down)
{
    ptl_network *net = b->net;
    if (grow((void **)&net->values, &net->cap_values, net->nvalues, sizeof(ptl_net_value)))
        return -1;
    ptl_net_value *v = &net->values[net->nvalues];
    memset(v, 0, sizeof *v);
    v->C = C;
    v->down = down;
    return net->nvalues++;
}

static int push_op(builder *b, const ptl_net_op *op)
{
    ptl_network *net = b->net;
    if (grow((void **)&net->ops, &net->cap_ops, net->nops, sizeof(ptl_net_op)))
        return -1;
    net->ops[net->nops] = *op;
    net->ops[net->nops].layer = b->layer;
    return net->nops++;
}

static ptl_net_op blank_op(ptl_net_op_kind kind)
{
    ptl_net_op op;
    memset(&op, 0, sizeof op);
    op.kind = kind;
    op.out = op.out2 = op.z = -1;
    return op;
}

/* Appends channels [c0, c0 + nc) of value v to op's inputs; grad: the backward writes their gradient,
 * keep: it reads their activation. */
static int input(builder *b, ptl_net_op *op, int v, int c0, int nc, int grad, int keep)
{
    if (op->nin == PTL_NET_MAX_PARTS)
        return ptl_set_error(PTL_ERR_RUNTIME, "network builder: an op of more than %d inputs", PTL_NET_MAX_PARTS);
    if (v < 0 || v >= b->net->nvalues || c0 < 0 || nc < 1 || c0 + nc > b->net->values[v].C)
        return ptl_set_error(PTL_ERR_RUNTIME, "network builder: input %d of an op reads no channels of a value",
                             op->nin);
    op->ins[op->nin] = (ptl_net_part){v, c0, nc};
    op->grad_in |= (uint8_t)(grad ? 1u << op->nin : 0);
    op->keep_in |= (uint8_t)(keep ? 1u << op->nin : 0);
    op->nin++;
    return 0;
}

/* The whole of value v as op's next input. */
static int input_value(builder *b, ptl_net_op *op, int v, int grad, int keep)
{
    return v < 0 ? -1 : input(b, op, v, 0, b->net->values[v].C, grad, keep);
}

/* out = base + "." + the formatted suffix (names are far shorter than PTL_NET_NAME_LEN; a longer
 * one is cut, never overflowed). */
static void sub(char *out, const char *base, const char *fmt, ...)
{
    char tail[PTL_NET_NAME_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tail, sizeof tail, fmt, ap);
    va_end(ap);
    size_t a = strlen(base), t = strlen(tail);
    if (a > PTL_NET_NAME_LEN - 2)
        a = PTL_NET_NAME_LEN - 2;
    if (a + 1 + t > PTL_NET_NAME_LEN - 1)
        t = PTL_NET_NAME_LEN - 2 - a;
    memmove(out, base, a);
    out[a] = '.';
    memcpy(out + a + 1, tail, t);
    out[a + 1 + t] = 0;
}

/* Declares a Conv (conv + BN + optional SiLU): registers its parameters in state_dict order. The op
 * is emitted later (conv_emit), since modules register in constructor order, not execution order. */
static int conv_decl(builder *b, ptl_net_op *op, const char *name, int cin, int cout, int k, int s, int g,
                     int act)
{
    *op = blank_op(PTL_OP_CONV);
    op->cin = cin;
    op->cout = cout;
    op->k = k;
    op->s = s;
    op->g = g;
    op->act = act;
    int64_t wshape[4] = {cout, cin / g, k, k}, cshape[1] = {cout};
    double bound = 1.0 / sqrt((double)(cin / g) * k * k);
    op->nparams = 3;
    op->nbuffers = 2;
    if (add_entry(b, 0, PTL_INIT_UNIFORM, bound, 4, wshape, &op->param[PTL_CONV_W], "%s.conv.weight", name) ||
        add_entry(b, 0, PTL_INIT_ONES, 0, 1, cshape, &op->param[PTL_CONV_GAMMA], "%s.bn.weight", name) ||
        add_entry(b, 0, PTL_INIT_ZEROS, 0, 1, cshape, &op->param[PTL_CONV_BETA], "%s.bn.bias", name) ||
        add_entry(b, 1, PTL_INIT_ZEROS, 0, 1, cshape, &op->buffer[PTL_BN_RUNNING_MEAN], "%s.bn.running_mean", name) ||
        add_entry(b, 1, PTL_INIT_ONES, 0, 1, cshape, &op->buffer[PTL_BN_RUNNING_VAR], "%s.bn.running_var", name))
        return -1;
    op->stat_off = b->net->nstats;
    b->net->nstats += 2 * cout;
    return 0;
}

/* Emits a declared conv on value `in`; returns the output value id or -1. */
static int conv_emit(builder *b, ptl_net_op *op, int in)
{
    ptl_network *net = b->net;
    int down = net->values[in].down * op->s;
    if (input_value(b, op, in, !b->no_dx_next, 1))
        return -1;
    b->no_dx_next = 0;
    if ((op->z = new_value(b, op->cout, down)) < 0)
        return -1;
    if ((op->out = new_value(b, op->cout, down)) < 0)
        return -1;
    if (push_op(b, op) < 0)
        return -1;
    return op->out;
}

static int conv(builder *b, int in, const char *name, int cout, int k, int s, int g, int act)
{
    ptl_net_op op;
    if (conv_decl(b, &op, name, b->net->values[in].C, cout, k, s, g, act))
        return -1;
    return conv_emit(b, &op, in);
}

static int add(builder *b, int x, int y)
{
    ptl_net_op op = blank_op(PTL_OP_ADD);
    if (input_value(b, &op, x, 1, 0) || input_value(b, &op, y, 1, 0))
        return -1;
    op.out = new_value(b, b->net->values[x].C, b->net->values[x].down);
    if (op.out < 0 || push_op(b, &op) < 0)
        return -1;
    return op.out;
}

/* Concatenates channel ranges (value, c0, nc) in order. */
static int cat(builder *b, int nparts, const ptl_net_part *parts)
{
    ptl_net_op op = blank_op(PTL_OP_CAT);
    int C = 0;
    for (int i = 0; i < nparts; i++) {
        if (input(b, &op, parts[i].value, parts[i].c0, parts[i].nc, 1, 0))
            return -1;
        C += parts[i].nc;
    }
    op.out = new_value(b, C, b->net->values[parts[0].value].down);
    if (op.out < 0 || push_op(b, &op) < 0)
        return -1;
    return op.out;
}

static int unary(builder *b, ptl_net_op_kind kind, int in, int up)
{
    ptl_net_op op = blank_op(kind);
    const ptl_net_value *v = &b->net->values[in];
    if (input_value(b, &op, in, 1, 1))
        return -1;
    op.out = new_value(b, v->C, up ? v->down / 2 : v->down);
    if (op.out < 0 || push_op(b, &op) < 0)
        return -1;
    return op.out;
}

/* --------------------------------------------------------------------------------------- blocks */

static int bottleneck(builder *b, int x, const char *name, int c2, double e, int k1, int shortcut)
{
    char n1[PTL_NET_NAME_LEN], n2[PTL_NET_NAME_LEN];
    int c1 = b->net->values[x].C;
    int h = (int)(c2 * e);
    ptl_net_op cv1, cv2;
    sub(n1, name, "cv1");
    sub(n2, name, "cv2");
    if (conv_decl(b, &cv1, n1, c1, h, k1, 1, 1, 1) || conv_decl(b, &cv2, n2, h, c2, 3, 1, 1, 1))
        return -1;
    int y = conv_emit(b, &cv1, x);
    if (y < 0 || (y = conv_emit(b, &cv2, y)) < 0)
        return -1;
    return (shortcut && c1 == c2) ? add(b, x, y) : y;
}

static int c3k(builder *b, int x, const char *name, int c2, int n)
{
    char nm[PTL_NET_NAME_LEN];
    int c1 = b->net->values[x].C, h = c2 / 2;
    ptl_net_op cv1, cv2, cv3;
    sub(nm, name, "cv1");
    if (conv_decl(b, &cv1, nm, c1, h, 1, 1, 1, 1))
        return -1;
    sub(nm, name, "cv2");
    if (conv_decl(b, &cv2, nm, c1, h, 1, 1, 1, 1))
        return -1;
    sub(nm, name, "cv3");
    if (conv_decl(b, &cv3, nm, 2 * h, c2, 1, 1, 1, 1))
        return -1;
    int a = conv_emit(b, &cv1, x);
    for (int i = 0; i < n && a >= 0; i++) {
        sub(nm, name, "m.%d", i);
        a = bottleneck(b, a, nm, h, 1.0, 3, 1);
    }
    if (a < 0)
        return -1;
    int bb = conv_emit(b, &cv2, x);
    if (bb < 0)
        return -1;
    ptl_net_part parts[2] = {{a, 0, h}, {bb, 0, h}};
    int y = cat(b, 2, parts);
    return y < 0 ? -1 : conv_emit(b, &cv3, y);
}

static int attention(builder *b, int x, const char *name, int dim, int heads)
{
    char nm[PTL_NET_NAME_LEN];
    int hd = dim / heads, kd = hd / 2;
    ptl_net_op qkv, proj, pe;
    sub(nm, name, "qkv");
    if (conv_decl(b, &qkv, nm, dim, dim + 2 * kd * heads, 1, 1, 1, 0))
        return -1;
    sub(nm, name, "proj");
    if (conv_decl(b, &proj, nm, dim, dim, 1, 1, 1, 0))
        return -1;
    sub(nm, name, "pe");
    if (conv_decl(b, &pe, nm, dim, dim, 3, 1, dim, 0))
        return -1;
    int t = conv_emit(b, &qkv, x);
    if (t < 0)
        return -1;
    ptl_net_op at = blank_op(PTL_OP_ATTN);
    if (input_value(b, &at, t, 1, 1))
        return -1;
    at.heads = heads;
    at.kd = kd;
    at.hd = hd;
    at.out = new_value(b, dim, b->net->values[t].down);
    at.out2 = new_value(b, dim, b->net->values[t].down);
    if (at.out < 0 || at.out2 < 0 || push_op(b, &at) < 0)
        return -1;
    int p = conv_emit(b, &pe, at.out2);
    if (p < 0)
        return -1;
    int s = add(b, at.out, p);
    return s < 0 ? -1 : conv_emit(b, &proj, s);
}

static int psablock(builder *b, int x, const char *name, int c, int heads)
{
    char nm[PTL_NET_NAME_LEN];
    sub(nm, name, "attn");
    int a = attention(b, x, nm, c, heads);
    if (a < 0 || (x = add(b, x, a)) < 0)
        return -1;
    ptl_net_op f0, f1;
    sub(nm, name, "ffn.0");
    if (conv_decl(b, &f0, nm, c, 2 * c, 1, 1, 1, 1))
        return -1;
    sub(nm, name, "ffn.1");
    if (conv_decl(b, &f1, nm, 2 * c, c, 1, 1, 1, 0))
        return -1;
    int f = conv_emit(b, &f0, x);
    if (f < 0 || (f = conv_emit(b, &f1, f)) < 0)
        return -1;
    return add(b, x, f);
}

static int c3k2(builder *b, int x, const char *name, int c2, int n, int use_c3k, double e, int attn)
{
    char nm[PTL_NET_NAME_LEN];
    int c1 = b->net->values[x].C;
    int c = (int)(c2 * e);
    ptl_net_op cv1, cv2;
    sub(nm, name, "cv1");
    if (conv_decl(b, &cv1, nm, c1, 2 * c, 1, 1, 1, 1))
        return -1;
    sub(nm, name, "cv2");
    if (conv_decl(b, &cv2, nm, (2 + n) * c, c2, 1, 1, 1, 1))
        return -1;
    int t = conv_emit(b, &cv1, x);
    if (t < 0)
        return -1;
    ptl_net_part parts[PTL_NET_MAX_PARTS];
    if (n + 1 > PTL_NET_MAX_PARTS)
        return ptl_set_error(PTL_ERR_RUNTIME, "network builder: C3k2 with %d blocks", n);
    parts[0] = (ptl_net_part){t, 0, 2 * c};
    ptl_net_part second = {t, c, c};
    int y = cat(b, 1, &second);
    for (int i = 0; i < n && y >= 0; i++) {
        if (attn) {
            sub(nm, name, "m.%d.0", i);
            y = bottleneck(b, y, nm, c, 0.5, 3, 1);
            sub(nm, name, "m.%d.1", i);
            if (y >= 0)
                y = psablock(b, y, nm, c, c / 64 > 1 ? c / 64 : 1);
        } else if (use_c3k) {
            sub(nm, name, "m.%d", i);
            y = c3k(b, y, nm, c, 2);
        } else {
            sub(nm, name, "m.%d", i);
            y = bottleneck(b, y, nm, c, 0.5, 3, 1);
        }
        parts[i + 1] = (ptl_net_part){y, 0, c};
    }
    if (y < 0)
        return -1;
    int z = cat(b, n + 1, parts);
    return z < 0 ? -1 : conv_emit(b, &cv2, z);
}

static int sppf(builder *b, int x, const char *name, int c2)
{
    char nm[PTL_NET_NAME_LEN];
    int c1 = b->net->values[x].C, h = c1 / 2;
    ptl_net_op cv1, cv2;
    sub(nm, name, "cv1");
    if (conv_decl(b, &cv1, nm, c1, h, 1, 1, 1, 0))
        return -1;
    sub(nm, name, "cv2");
    if (conv_decl(b, &cv2, nm, 4 * h, c2, 1, 1, 1, 1))
        return -1;
    int y0 = conv_emit(b, &cv1, x);
    int y1 = y0 < 0 ? -1 : unary(b, PTL_OP_POOL, y0, 0);
    int y2 = y1 < 0 ? -1 : unary(b, PTL_OP_POOL, y1, 0);
    int y3 = y2 < 0 ? -1 : unary(b, PTL_OP_POOL, y2, 0);
    if (y3 < 0)
        return -1;
    ptl_net_part parts[4] = {{y0, 0, h}, {y1, 0, h}, {y2, 0, h}, {y3, 0, h}};
    int y = cat(b, 4, parts);
    if (y < 0 || (y = conv_emit(b, &cv2, y)) < 0)
        return -1;
    return c1 == c2 ? add(b, x, y) : y;
}

static int c2psa(builder *b, int x, const char *name, int n)
{
    char nm[PTL_NET_NAME_LEN];
    int c1 = b->net->values[x].C, c = c1 / 2;
    ptl_net_op cv1, cv2;
    sub(nm, name, "cv1");
    if (conv_decl(b, &cv1, nm, c1, 2 * c, 1, 1, 1, 1))
        return -1;
    sub(nm, name, "cv2");
    if (conv_decl(b, &cv2, nm, 2 * c, c1, 1, 1, 1, 1))
        return -1;
    int t = conv_emit(b, &cv1, x);
    if (t < 0)
        return -1;
    ptl_net_part second = {t, c, c};
    int y = cat(b, 1, &second);
    for (int i = 0; i < n && y >= 0; i++) {
        sub(nm, name, "m.%d", i);
        y = psablock(b, y, nm, c, c / 64);
    }
    if (y < 0)
        return -1;
    ptl_net_part parts[2] = {{t, 0, c}, {y, 0, c}};
    int z = cat(b, 2, parts);
    return z < 0 ? -1 : conv_emit(b, &cv2, z);
}

/* A final 1x1 conv with bias. */
static int conv_bias_decl(builder *b, ptl_net_op *op, const char *name, int cin, int cout, int box, int level)
{
    *op = blank_op(PTL_OP_CONV_BIAS);
    op->cin = cin;
    op->cout = cout;
    op->k = op->s = op->g = 1;
    int64_t wshape[4] = {cout, cin, 1, 1}, bshape[1] = {cout};
    double bound = 1.0 / sqrt((double)cin);
    op->nparams = 2;
    if (add_entry(b, 0, PTL_INIT_UNIFORM, bound, 4, wshape, &op->param[PTL_CONV_W], "%s.weight", name) ||
        add_entry(b, 0, box ? PTL_INIT_BOX_BIAS : PTL_INIT_CLS_BIAS, bound, 1, bshape, &op->param[PTL_CONV_BIAS],
                  "%s.bias", name))
        return -1;
    b->net->entries[b->net->nentries - 1].level = level;
    return 0;
}

typedef struct {
    ptl_net_op box[3][3]; /* [level][stage] */
    ptl_net_op cls[3][5];
} head_ops;

static int head_decl(builder *b, head_ops *h, const char *prefix, const int *ch, int nc, int cc)
{
    char nm[128];
    int cb = ch[0] / 4 > 16 ? ch[0] / 4 : 16;
    for (int i = 0; i < 3; i++) {
        snprintf(nm, sizeof nm, "model.23.%scv2.%d.0", prefix, i);
        if (conv_decl(b, &h->box[i][0], nm, ch[i], cb, 3, 1, 1, 1))
            return -1;
        snprintf(nm, sizeof nm, "model.23.%scv2.%d.1", prefix, i);
        if (conv_decl(b, &h->box[i][1], nm, cb, cb, 3, 1, 1, 1))
            return -1;
        snprintf(nm, sizeof nm, "model.23.%scv2.%d.2", prefix, i);
        if (conv_bias_decl(b, &h->box[i][2], nm, cb, 4, 1, i))
            return -1;
    }
    for (int i = 0; i < 3; i++) {
        snprintf(nm, sizeof nm, "model.23.%scv3.%d.0.0", prefix, i);
        if (conv_decl(b, &h->cls[i][0], nm, ch[i], ch[i], 3, 1, ch[i], 1))
            return -1;
        snprintf(nm, sizeof nm, "model.23.%scv3.%d.0.1", prefix, i);
        if (conv_decl(b, &h->cls[i][1], nm, ch[i], cc, 1, 1, 1, 1))
            return -1;
        snprintf(nm, sizeof nm, "model.23.%scv3.%d.1.0", prefix, i);
        if (conv_decl(b, &h->cls[i][2], nm, cc, cc, 3, 1, cc, 1))
            return -1;
        snprintf(nm, sizeof nm, "model.23.%scv3.%d.1.1", prefix, i);
        if (conv_decl(b, &h->cls[i][3], nm, cc, cc, 1, 1, 1, 1))
            return -1;
        snprintf(nm, sizeof nm, "model.23.%scv3.%d.2", prefix, i);
        if (conv_bias_decl(b, &h->cls[i][4], nm, cc, nc, 0, i))
            return -1;
    }
    return 0;
}

static int head_out(builder *b, int in, int branch, int level, int box)
{
    ptl_net_op op = blank_op(PTL_OP_HEAD);
    if (input_value(b, &op, in, 1, 0))
        return -1;
    op.branch = branch;
    op.level = level;
    op.box = box;
    return push_op(b, &op) < 0 ? -1 : 0;
}

/* Emits a declared conv or conv-with-bias on value `in`. */
static int emit_any(builder *b, ptl_net_op *op, int in)
{
    if (op->kind == PTL_OP_CONV)
        return conv_emit(b, op, in);
    if (input_value(b, op, in, !b->no_dx_next, 1))
        return -1;
    b->no_dx_next = 0;
    op->out = new_value(b, op->cout, b->net->values[in].down);
    return (op->out < 0 || push_op(b, op) < 0) ? -1 : op->out;
}

/* The one-to-one branch (1) reads the features detached: its first convs send no gradient back. */
static int head_emit(builder *b, head_ops *h, int branch)
{
    ptl_network *net = b->net;
    for (int i = 0; i < 3; i++) {
        int y = net->feat[i];
        for (int s = 0; s < 3 && y >= 0; s++) {
            b->no_dx_next = branch == 1 && s == 0;
            y = emit_any(b, &h->box[i][s], y);
        }
        if (y < 0 || head_out(b, y, branch, i, 1))
            return -1;
        y = net->feat[i];
        for (int s = 0; s < 5 && y >= 0; s++) {
            b->no_dx_next = branch == 1 && s == 0;
            y = emit_any(b, &h->cls[i][s], y);
        }
        if (y < 0 || head_out(b, y, branch, i, 0))
            return -1;
    }
    return 0;
}

/* ----------------------------------------------------------------------------------- the graph */

static int ch_out(const builder *b, int c_yaml)
{
    int c = c_yaml < b->sc.max_ch ? c_yaml : b->sc.max_ch;
    return (c * b->sc.width4 + 31) / 32 * 8; /* ceil(c * width / 8) * 8 */
}

static int reps(const builder *b, int n)
{
    if (n <= 1)
        return n;
    int r = (int)nearbyint(n * b->sc.depth);
    return r > 1 ? r : 1;
}

static int build(builder *b)
{
    ptl_network *net = b->net;
    int *L = net->layer_out;
    char nm[32];
    int mlx = net->scale == 'm' || net->scale == 'l' || net->scale == 'x';
#define NAME(i) (snprintf(nm, sizeof nm, "model.%d", (i)), nm)
#define STEP(i, expr)                                                                              \
    do {                                                                                           \
        b->layer = (i);                                                                            \
        if ((L[i] = (expr)) < 0)                                                                   \
            return -1;                                                                             \
    } while (0)
    int x = new_value(b, 3, 1);
    if (x < 0)
        return -1;
    net->input = x;
    STEP(0, conv(b, x, NAME(0), ch_out(b, 64), 3, 2, 1, 1));
    STEP(1, conv(b, L[0], NAME(1), ch_out(b, 128), 3, 2, 1, 1));
    STEP(2, c3k2(b, L[1], NAME(2), ch_out(b, 256), reps(b, 2), mlx, 0.25, 0));
    STEP(3, conv(b, L[2], NAME(3), ch_out(b, 256), 3, 2, 1, 1));
    STEP(4, c3k2(b, L[3], NAME(4), ch_out(b, 512), reps(b, 2), mlx, 0.25, 0));
    STEP(5, conv(b, L[4], NAME(5), ch_out(b, 512), 3, 2, 1, 1));
    STEP(6, c3k2(b, L[5], NAME(6), ch_out(b, 512), reps(b, 2), 1, 0.5, 0));
    STEP(7, conv(b, L[6], NAME(7), ch_out(b, 1024), 3, 2, 1, 1));
    STEP(8, c3k2(b, L[7], NAME(8), ch_out(b, 1024), reps(b, 2), 1, 0.5, 0));
    STEP(9, sppf(b, L[8], NAME(9), ch_out(b, 1024)));
    STEP(10, c2psa(b, L[9], NAME(10), reps(b, 2)));
    STEP(11, unary(b, PTL_OP_UP, L[10], 1));
    {
        ptl_net_part p[2] = {{L[11], 0, net->values[L[11]].C}, {L[6], 0, net->values[L[6]].C}};
        STEP(12, cat(b, 2, p));
    }
    STEP(13, c3k2(b, L[12], NAME(13), ch_out(b, 512), reps(b, 2), 1, 0.5, 0));
    STEP(14, unary(b, PTL_OP_UP, L[13], 1));
    {
        ptl_net_part p[2] = {{L[14], 0, net->values[L[14]].C}, {L[4], 0, net->values[L[4]].C}};
        STEP(15, cat(b, 2, p));
    }
    STEP(16, c3k2(b, L[15], NAME(16), ch_out(b, 256), reps(b, 2), 1, 0.5, 0));
    STEP(17, conv(b, L[16], NAME(17), ch_out(b, 256), 3, 2, 1, 1));
    {
        ptl_net_part p[2] = {{L[17], 0, net->values[L[17]].C}, {L[13], 0, net->values[L[13]].C}};
        STEP(18, cat(b, 2, p));
    }
    STEP(19, c3k2(b, L[18], NAME(19), ch_out(b, 512), reps(b, 2), 1, 0.5, 0));
    STEP(20, conv(b, L[19], NAME(20), ch_out(b, 512), 3, 2, 1, 1));
    {
        ptl_net_part p[2] = {{L[20], 0, net->values[L[20]].C}, {L[10], 0, net->values[L[10]].C}};
        STEP(21, cat(b, 2, p));
    }
    STEP(22, c3k2(b, L[21], NAME(22), ch_out(b, 1024), 1, 1, 0.5, 1));
#undef STEP
#undef NAME
    int feats[3] = {L[16], L[19], L[22]};
    for (int i = 0; i < 3; i++) {
        net->feat[i] = feats[i];
        net->ch[i] = net->values[feats[i]].C;
        net->stride[i] = net->values[feats[i]].down;
    }
    L[23] = -1;
    b->layer = 23;
    if (!net->cls_width) { /* spec §1.5: cc = max(ch0, min(nc, 100)) */
        int capped = net->nc < 100 ? net->nc : 100;
        net->cls_width = net->ch[0] > capped ? net->ch[0] : capped;
    }
    head_ops o2m, o2o;
    b->head = 1;
    if (head_decl(b, &o2m, "", net->ch, net->nc, net->cls_width))
        return -1;
    b->head = 2;
    if (head_decl(b, &o2o, "one2one_", net->ch, net->nc, net->cls_width))
        return -1;
    b->head = 0;
    if (head_emit(b, &o2m, 0) || head_emit(b, &o2o, 1))
        return -1;
    return 0;
}

/* ------------------------------------------------------------------------------ initialisation */

/* Uniform [0, 1): draw number `i` of ptl's Philox stream `seed` (csrc/ops/philox.h). */
static double init_uniform(uint64_t seed, uint64_t i)
{
    ptl_philox_block blk = ptl_philox_at(seed, i >> 2);
    return (double)ptl_u32_to_unit(blk.v[i & 3]);
}

static void set_elem(ptl_network *net, void *base, int64_t i, double v)
{
    if (net->dtype == PTL_FLOAT64)
        ((double *)base)[i] = v;
    else
        ((float *)base)[i] = (float)v;
}

void ptl_network_init(ptl_network *net, uint64_t seed)
{
    uint64_t draw = 0;
    size_t esz = ptl_dtype_size(net->dtype);
    int64_t o2m_begin = -1, o2o_begin = -1, o2o_end = 0;
    /* Parameters of each head are contiguous and laid out identically (o2o registered right after
     * o2m), so the copy is one block. */
    for (int i = 0; i < net->nentries; i++) {
        const ptl_net_entry *e = &net->entries[i];
        void *base = e->is_buffer ? net->buffers : net->params;
        if (e->head == 2) {
            if (!e->is_buffer) {
                if (o2o_begin < 0)
                    o2o_begin = e->offset;
                o2o_end = e->offset + e->numel;
            }
            continue; /* copied from the one-to-many head below */
        }
        if (e->head == 1 && !e->is_buffer && o2m_begin < 0)
            o2m_begin = e->offset;
        switch (e->init) {
        case PTL_INIT_ONES:
            for (int64_t j = 0; j < e->numel; j++)
                set_elem(net, base, e->offset + j, 1.0);
            break;
        case PTL_INIT_ZEROS:
            for (int64_t j = 0; j < e->numel; j++)
                set_elem(net, base, e->offset + j, 0.0);
            break;
        default: /* uniform draws, biases included (then overwritten: §1.7 step 3) */
            for (int64_t j = 0; j < e->numel; j++)
                set_elem(net, base, e->offset + j, (2.0 * init_uniform(seed, draw++) - 1.0) * e->bound);
            break;
        }
    }
    memcpy((char *)net->params + o2o_begin * esz, (char *)net->params + o2m_begin * esz,
           (size_t)(o2o_end - o2o_begin) * esz);
    /* BN buffers of the o2o head are reset like every other; then the bias prior, both heads. */
    for (int i = 0; i < net->nentries; i++) {
        const ptl_net_entry *e = &net->entries[i];
        void *base = e->is_buffer ? net->buffers : net->params;
        if (e->head == 2 && e->is_buffer)
            for (int64_t j = 0; j < e->numel; j++)
                set_elem(net, base, e->offset + j, e->init == PTL_INIT_ONES ? 1.0 : 0.0);
        if (e->init == PTL_INIT_BOX_BIAS)
            for (int64_t j = 0; j < e->numel; j++)
                set_elem(net, base, e->offset + j, 2.0);
        if (e->init == PTL_INIT_CLS_BIAS) {
            double cells = 640.0 / net->stride[e->level];
            double v = log(5.0 / net->nc / (cells * cells));
            for (int64_t j = 0; j < e->numel; j++)
                set_elem(net, base, e->offset + j, v);
        }
    }
}

/* ---------------------------------------------------------------------------------- lifecycle */

ptl_network *ptl_network_create(char scale, int nc, int cls_width, ptl_dtype dtype, uint64_t seed)
{
    builder b;
    memset(&b, 0, sizeof b);
    if (scale_lookup(scale, &b.sc)) {
        ptl_set_error(PTL_ERR_VALUE, "scale must be one of n, s, m, l, x (got '%c')", scale);
        return NULL;
    }
    if (nc < 1) {
        ptl_set_error(PTL_ERR_VALUE, "num_classes must be >= 1 (got %d)", nc);
        return NULL;
    }
    if (cls_width < 0 || cls_width > PTL_NET_MAX_CLS_WIDTH) {
        ptl_set_error(PTL_ERR_VALUE, "cls_width must be 0 (the default width) or 1..%d (got %d)",
                      PTL_NET_MAX_CLS_WIDTH, cls_width);
        return NULL;
    }
    if (dtype != PTL_FLOAT32 && dtype != PTL_FLOAT64) {
        ptl_set_error(PTL_ERR_VALUE, "network dtype must be float32 or float64 (got %s)", ptl_dtype_name(dtype));
        return NULL;
    }
    ptl_network *net = calloc(1, sizeof *net);
    if (!net) {
        ptl_set_error(PTL_ERR_MEMORY, "network: out of memory");
        return NULL;
    }
    net->scale = scale;
    net->nc = nc;
    net->cls_width = cls_width;
    net->dtype = dtype;
    b.net = net;
    if (build(&b))
        goto fail;
    size_t esz = ptl_dtype_size(dtype);
    net->params = calloc((size_t)net->nparams, esz);
    net->grads = calloc((size_t)net->nparams, esz);
    net->buffers = calloc((size_t)net->nbuffers, esz);
    if (!net->params || !net->grads || !net->buffers) {
        ptl_set_error(PTL_ERR_MEMORY, "network: out of memory for %lld parameters", (long long)net->nparams);
        goto fail;
    }
    ptl_network_init(net, seed);
    return net;
fail:
    ptl_network_free(net);
    return NULL;
}

const char *ptl_net_op_kind_name(ptl_net_op_kind kind)
{
    switch (kind) {
    case PTL_OP_CONV: return "conv";
    case PTL_OP_CONV_BIAS: return "conv_bias";
    case PTL_OP_ADD: return "add";
    case PTL_OP_CAT: return "cat";
    case PTL_OP_POOL: return "maxpool5";
    case PTL_OP_UP: return "upsample2x";
    case PTL_OP_ATTN: return "attention";
    case PTL_OP_HEAD: return "head";
    }
    return "unknown";
}

int64_t ptl_net_op_saved_numel(const ptl_net_op *op, int B, int h, int w)
{
    const int64_t n = (int64_t)h * w;
    return op->kind == PTL_OP_ATTN ? (int64_t)B * op->heads * n * n : 0;
}

void ptl_network_free(ptl_network *net)
{
    if (!net)
        return;
    free(net->entries);
    free(net->values);
    free(net->ops);
    free(net->params);
    free(net->grads);
    free(net->buffers);
    free(net);
}

int64_t ptl_network_layer_params(const ptl_network *net, int layer)
{
    int64_t n = 0;
    for (int i = 0; i < net->nentries; i++)
        if (net->entries[i].layer == layer && !net->entries[i].is_buffer)
            n += net->entries[i].numel;
    return n;
}
