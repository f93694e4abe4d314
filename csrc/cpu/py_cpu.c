/* Python bindings of the fast CPU backend (csrc/cpu/), for tests and benchmarks: ptl._C.cpu_* functions.
 * Every output is passed in (overwritten or accumulated as the C function does), so a benchmark times
 * the kernel alone. Tensors are float32 CPU tensors. */
#include <stdlib.h>
#include <string.h>

#include "../py.h"
#include "activation.h"
#include "attention.h"
#include "batchnorm.h"
#include "conv2d.h"
#include "elementwise.h"
#include "maxpool.h"
#include "backend_cpu_fast.h"
#include "threads.h"
#include "upsample.h"

static const ptl_device CPU = {PTL_CPU, 0};

static PtlTensor *arg(PyObject *m, PyObject *obj, const char *name, int ndim, const int64_t *shape)
{
    return ptl_tensor_arg(m, obj, name, PTL_FLOAT32, &CPU, ndim, shape);
}

/* The other tensors of a call, checked by their specifications (float32, on the CPU). */
static int tensors(PyObject *m, int n, PyObject *const *objs, const ptl_tensor_spec *specs, PtlTensor **ts)
{
    return ptl_tensor_args(m, n, objs, specs, PTL_FLOAT32, &CPU, ts);
}

#define DATA(t) ((t) ? ptl_tensor_data(t) : NULL)

#define RUN(call)                                                                                            \
    do {                                                                                                     \
        int rc_;                                                                                             \
        Py_BEGIN_ALLOW_THREADS rc_ = (call);                                                                 \
        Py_END_ALLOW_THREADS if (rc_ != 0) return ptl_raise(m);                                              \
    } while (0)

/* ------------------------------------------------------------------ threads */

static PyObject *py_cpu_threads(PyObject *m, PyObject *noargs)
{
    (void)m;
    (void)noargs;
    return PyLong_FromLong(ptl_cpu_threads());
}

/* ------------------------------------------------------------------ conv2d plans */

/* A plan with the workspace its calls need, owned by a capsule. */
typedef struct {
    ptl_cpu_conv2d_plan *plan;
    void *workspace;
    size_t workspace_bytes;
} conv_plan_box;

static const char PLAN_CAPSULE[] = "ptl.cpu_conv2d_plan";

static void plan_box_free(PyObject *capsule)
{
    conv_plan_box *b = PyCapsule_GetPointer(capsule, PLAN_CAPSULE);
    if (!b)
        return;
    ptl_cpu_conv2d_plan_destroy(b->plan);
    free(b->workspace);
    free(b);
}

static const ptl_cpu_conv2d_plan *plan_arg(PyObject *obj, void **ws, size_t *ws_bytes)
{
    conv_plan_box *b = PyCapsule_GetPointer(obj, PLAN_CAPSULE);
    if (!b)
        return NULL;
    *ws = b->workspace;
    *ws_bytes = b->workspace_bytes;
    return b->plan;
}

static PyObject *py_cpu_conv2d_available(PyObject *m, PyObject *noargs)
{
    (void)m;
    (void)noargs;
    return PyBool_FromLong(ptl_cpu_conv2d_available());
}

/* cpu_conv2d_plan(n, h, w, cin, cout, k, stride, groups, weights="ohwi", bias=False, directions=7) -> plan */
static PyObject *py_cpu_conv2d_plan(PyObject *m, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"n", "h", "w", "cin", "cout", "k", "stride", "groups", "weights", "bias", "directions",
                             NULL};
    int n, h, w, cin, cout, k, stride, groups, bias = 0, directions = PTL_CPU_CONV_ALL;
    const char *layout = "ohwi";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiiiiiii|spi:cpu_conv2d_plan", kwlist, &n, &h, &w, &cin, &cout, &k,
                                     &stride, &groups, &layout, &bias, &directions))
        return NULL;
    ptl_cpu_conv2d_opts o = {.bias = bias, .directions = directions};
    if (!strcmp(layout, "ohwi"))
        o.weights = PTL_CPU_WEIGHTS_OHWI;
    else if (!strcmp(layout, "oihw"))
        o.weights = PTL_CPU_WEIGHTS_OIHW;
    else
        return PyErr_Format(PyExc_ValueError, "weights: expected 'ohwi' or 'oihw', got '%s'", layout);
    ptl_conv2d_desc d;
    if (ptl_conv2d_init(&d, n, h, w, cin, cout, k, stride, groups))
        return ptl_raise(m);
    conv_plan_box *b = calloc(1, sizeof *b);
    if (!b)
        return PyErr_NoMemory();
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = ptl_cpu_conv2d_plan_create(&d, &o, &b->plan);
    Py_END_ALLOW_THREADS if (rc)
    {
        free(b);
        return ptl_raise(m);
    }
    b->workspace_bytes = ptl_cpu_conv2d_plan_workspace(b->plan);
    if (b->workspace_bytes && !(b->workspace = malloc(b->workspace_bytes))) {
        ptl_cpu_conv2d_plan_destroy(b->plan);
        free(b);
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(b, PLAN_CAPSULE, plan_box_free);
    if (!cap) {
        ptl_cpu_conv2d_plan_destroy(b->plan);
        free(b->workspace);
        free(b);
    }
    return cap;
}

/* cpu_conv2d_plan_info(plan) -> {"workspace": bytes, "forward": impl, "backward_input": impl,
 * "backward_weight": impl} */
static PyObject *py_cpu_conv2d_plan_info(PyObject *m, PyObject *po)
{
    (void)m;
    void *ws;
    size_t wsb;
    const ptl_cpu_conv2d_plan *p = plan_arg(po, &ws, &wsb);
    if (!p)
        return NULL;
    return Py_BuildValue("{s:n,s:s,s:s,s:s}", "workspace", (Py_ssize_t)wsb, "forward",
                         ptl_cpu_conv2d_plan_impl(p, PTL_CPU_CONV_FORWARD), "backward_input",
                         ptl_cpu_conv2d_plan_impl(p, PTL_CPU_CONV_BACKWARD_INPUT), "backward_weight",
                         ptl_cpu_conv2d_plan_impl(p, PTL_CPU_CONV_BACKWARD_WEIGHT));
}

enum { CONV_X, CONV_Y, CONV_W, CONV_B };

/* A call's plan (with its workspace) and its tensors by role, checked against the plan's shapes (weights
 * in its layout: OHWI or OIHW); None is accepted (as NULL) where the argument's bit is set in `optional`. */
typedef struct {
    const ptl_cpu_conv2d_plan *p;
    void *ws;
    size_t ws_bytes;
    PtlTensor *t[4];
} conv_call;

static int conv_call_args(PyObject *m, PyObject *po, PyObject *const *objs, const char *const *names,
                          const int *roles, int n, unsigned optional, conv_call *c)
{
    if (!(c->p = plan_arg(po, &c->ws, &c->ws_bytes)))
        return -1;
    const ptl_conv2d_desc *d = ptl_cpu_conv2d_plan_desc(c->p);
    const int64_t cig = d->cin / d->groups;
    const int ohwi = ptl_cpu_conv2d_plan_opts(c->p)->weights == PTL_CPU_WEIGHTS_OHWI;
    const int64_t shapes[4][4] = {{d->n, d->h, d->w, d->cin},
                                  {d->n, d->ho, d->wo, d->cout},
                                  {d->cout, ohwi ? d->k : cig, d->k, ohwi ? cig : d->k},
                                  {d->cout}};
    for (int i = 0; i < n; i++) {
        c->t[i] = NULL;
        if (objs[i] == Py_None && (optional >> i & 1))
            continue;
        if (!(c->t[i] = arg(m, objs[i], names[i], roles[i] == CONV_B ? 1 : 4, shapes[roles[i]])))
            return -1;
    }
    return 0;
}

/* cpu_conv2d_forward(plan, x, w, bias|None, y): y = conv(x, w) (+ bias). */
static PyObject *py_cpu_conv2d_forward(PyObject *m, PyObject *args)
{
    PyObject *po, *o[4];
    conv_call c;
    if (!PyArg_ParseTuple(args, "OOOOO:cpu_conv2d_forward", &po, &o[0], &o[1], &o[2], &o[3]) ||
        conv_call_args(m, po, o, (const char *[]){"x", "w", "bias", "y"}, (const int[]){CONV_X, CONV_W, CONV_B, CONV_Y},
                       4, 1u << 2, &c))
        return NULL;
    RUN(ptl_cpu_conv2d_forward(c.p, DATA(c.t[0]), DATA(c.t[1]), DATA(c.t[2]), DATA(c.t[3]), c.ws, c.ws_bytes));
    Py_RETURN_NONE;
}

/* cpu_conv2d_backward_input(plan, dy, w, dx): dx = dL/dx. */
static PyObject *py_cpu_conv2d_backward_input(PyObject *m, PyObject *args)
{
    PyObject *po, *o[3];
    conv_call c;
    if (!PyArg_ParseTuple(args, "OOOO:cpu_conv2d_backward_input", &po, &o[0], &o[1], &o[2]) ||
        conv_call_args(m, po, o, (const char *[]){"dy", "w", "dx"}, (const int[]){CONV_Y, CONV_W, CONV_X}, 3, 0, &c))
        return NULL;
    RUN(ptl_cpu_conv2d_backward_input(c.p, DATA(c.t[0]), DATA(c.t[1]), DATA(c.t[2]), c.ws, c.ws_bytes));
    Py_RETURN_NONE;
}

/* cpu_conv2d_backward_weight(plan, x, dy, dw): dw += dL/dw. */
static PyObject *py_cpu_conv2d_backward_weight(PyObject *m, PyObject *args)
{
    PyObject *po, *o[3];
    conv_call c;
    if (!PyArg_ParseTuple(args, "OOOO:cpu_conv2d_backward_weight", &po, &o[0], &o[1], &o[2]) ||
        conv_call_args(m, po, o, (const char *[]){"x", "dy", "dw"}, (const int[]){CONV_X, CONV_Y, CONV_W}, 3, 0, &c))
        return NULL;
    RUN(ptl_cpu_conv2d_backward_weight(c.p, DATA(c.t[0]), DATA(c.t[1]), DATA(c.t[2]), c.ws, c.ws_bytes));
    Py_RETURN_NONE;
}

/* cpu_conv2d_backward_bias(plan, dy, db): db += sum of dy over (n, ho, wo). */
static PyObject *py_cpu_conv2d_backward_bias(PyObject *m, PyObject *args)
{
    PyObject *po, *o[2];
    conv_call c;
    if (!PyArg_ParseTuple(args, "OOO:cpu_conv2d_backward_bias", &po, &o[0], &o[1]) ||
        conv_call_args(m, po, o, (const char *[]){"dy", "db"}, (const int[]){CONV_Y, CONV_B}, 2, 0, &c))
        return NULL;
    RUN(ptl_cpu_conv2d_backward_bias(c.p, DATA(c.t[0]), DATA(c.t[1])));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ batchnorm */

static int parse_act(PyObject *obj, ptl_act *act)
{
    if (obj == Py_None) {
        *act = PTL_ACT_NONE;
        return 0;
    }
    if (PyUnicode_Check(obj) && PyUnicode_CompareWithASCIIString(obj, "silu") == 0) {
        *act = PTL_ACT_SILU;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "act: expected None or 'silu', got %R", obj);
    return -1;
}

/* x (..., c): rows m and channels c, and the per-channel shape. */
static PtlTensor *rows_arg(PyObject *m, PyObject *obj, const char *name, int64_t *rows, int64_t *cs)
{
    PtlTensor *x = arg(m, obj, name, -1, NULL);
    if (!x)
        return NULL;
    if (x->ndim < 1 || x->shape[x->ndim - 1] < 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected channels last and at least one channel", name);
        return NULL;
    }
    cs[0] = x->shape[x->ndim - 1];
    *rows = ptl_tensor_numel(x) / cs[0];
    return x;
}

/* A workspace the binding allocates per call (the kernels themselves allocate nothing). */
#define WITH_WORKSPACE(bytes, call)                                                                          \
    do {                                                                                                     \
        const size_t wsb_ = (bytes);                                                                         \
        void *ws_ = malloc(wsb_ ? wsb_ : 1);                                                                 \
        if (!ws_)                                                                                            \
            return PyErr_NoMemory();                                                                         \
        int rc_;                                                                                             \
        Py_BEGIN_ALLOW_THREADS rc_ = (call);                                                                 \
        Py_END_ALLOW_THREADS free(ws_);                                                                      \
        if (rc_ != 0)                                                                                        \
            return ptl_raise(m);                                                                             \
    } while (0)

/* cpu_batchnorm_forward(x, gamma, beta, running_mean, running_var, training, act, save_mean, save_invstd, y) */
static PyObject *py_cpu_batchnorm_forward(PyObject *m, PyObject *args)
{
    PyObject *xo, *o[7], *acto;
    int training;
    ptl_act act;
    if (!PyArg_ParseTuple(args, "OOOOOpOOOO:cpu_batchnorm_forward", &xo, &o[0], &o[1], &o[2], &o[3], &training, &acto,
                          &o[4], &o[5], &o[6]) ||
        parse_act(acto, &act))
        return NULL;
    int64_t rows, cs[1];
    PtlTensor *x = rows_arg(m, xo, "x", &rows, cs), *t[7];
    if (!x || tensors(m, 7, o,
                      (const ptl_tensor_spec[]){{"gamma", 1, cs}, {"beta", 1, cs}, {"running_mean", 1, cs},
                                                {"running_var", 1, cs}, {"save_mean", 1, cs}, {"save_invstd", 1, cs},
                                                {"y", x->ndim, x->shape}},
                      t))
        return NULL;
    WITH_WORKSPACE(ptl_cpu_batchnorm_workspace(rows, (int)cs[0]),
                   ptl_cpu_batchnorm_forward(rows, (int)cs[0], DATA(x), DATA(t[0]), DATA(t[1]), DATA(t[2]), DATA(t[3]),
                                             training, act, DATA(t[4]), DATA(t[5]), DATA(t[6]), ws_, wsb_));
    Py_RETURN_NONE;
}

/* cpu_batchnorm_backward(x, dy, gamma, beta, save_mean, save_invstd, training, act, dx, dgamma|None,
 * dbeta|None): dx =, dgamma/dbeta += */
static PyObject *py_cpu_batchnorm_backward(PyObject *m, PyObject *args)
{
    PyObject *xo, *o[8], *acto;
    int training;
    ptl_act act;
    if (!PyArg_ParseTuple(args, "OOOOOOpOOOO:cpu_batchnorm_backward", &xo, &o[0], &o[1], &o[2], &o[3], &o[4],
                          &training, &acto, &o[5], &o[6], &o[7]) ||
        parse_act(acto, &act))
        return NULL;
    int64_t rows, cs[1];
    PtlTensor *x = rows_arg(m, xo, "x", &rows, cs), *t[8];
    if (!x || tensors(m, 8, o,
                      (const ptl_tensor_spec[]){{"dy", x->ndim, x->shape}, {"gamma", 1, cs}, {"beta", 1, cs},
                                                {"save_mean", 1, cs}, {"save_invstd", 1, cs}, {"dx", x->ndim, x->shape},
                                                {"dgamma", 1, cs, 1}, {"dbeta", 1, cs, 1}},
                      t))
        return NULL;
    WITH_WORKSPACE(ptl_cpu_batchnorm_workspace(rows, (int)cs[0]),
                   ptl_cpu_batchnorm_backward(rows, (int)cs[0], DATA(x), DATA(t[0]), DATA(t[1]), DATA(t[2]),
                                              DATA(t[3]), DATA(t[4]), training, act, DATA(t[5]), DATA(t[6]),
                                              DATA(t[7]), ws_, wsb_));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ silu, element-wise */

/* A call's tensors, all of one shape: the first's (of `ndim` dims, any if < 0), and n more (n <= 2). */
static PtlTensor *same_shape_args(PyObject *m, PyObject *args, const char *format, const char *const *names, int ndim,
                                  int n, PtlTensor **t)
{
    PyObject *o[3];
    if (!PyArg_ParseTuple(args, format, &o[0], &o[1], &o[2]))
        return NULL;
    PtlTensor *x = arg(m, o[0], names[0], ndim, NULL);
    for (int i = 0; x && i < n; i++)
        if (!(t[i] = arg(m, o[i + 1], names[i + 1], x->ndim, x->shape)))
            return NULL;
    return x;
}

/* cpu_silu_forward(x, y); cpu_silu_backward(x, dy, dx) */
static PyObject *py_cpu_silu_forward(PyObject *m, PyObject *args)
{
    PtlTensor *x, *t[1];
    if (!(x = same_shape_args(m, args, "OO:cpu_silu_forward", (const char *[]){"x", "y"}, -1, 1, t)))
        return NULL;
    RUN(ptl_cpu_silu_forward(ptl_tensor_numel(x), DATA(x), DATA(t[0])));
    Py_RETURN_NONE;
}

static PyObject *py_cpu_silu_backward(PyObject *m, PyObject *args)
{
    PtlTensor *x, *t[2];
    if (!(x = same_shape_args(m, args, "OOO:cpu_silu_backward", (const char *[]){"x", "dy", "dx"}, -1, 2, t)))
        return NULL;
    RUN(ptl_cpu_silu_backward(ptl_tensor_numel(x), DATA(x), DATA(t[0]), DATA(t[1])));
    Py_RETURN_NONE;
}

/* cpu_add(a, b, y): y = a + b; cpu_accumulate(x, y): y += x (same shapes) */
static PyObject *py_cpu_add(PyObject *m, PyObject *args)
{
    PtlTensor *a, *t[2];
    if (!(a = same_shape_args(m, args, "OOO:cpu_add", (const char *[]){"a", "b", "y"}, -1, 2, t)))
        return NULL;
    RUN(ptl_cpu_add(ptl_tensor_numel(a), DATA(a), DATA(t[0]), DATA(t[1])));
    Py_RETURN_NONE;
}

static PyObject *py_cpu_accumulate(PyObject *m, PyObject *args)
{
    PtlTensor *x, *t[1];
    if (!(x = same_shape_args(m, args, "OO:cpu_accumulate", (const char *[]){"x", "y"}, -1, 1, t)))
        return NULL;
    RUN(ptl_cpu_accumulate(ptl_tensor_numel(x), DATA(x), DATA(t[0])));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ copies, attention */

/* cpu_channel_copy(src, src_off, dst, dst_off, c, accumulate): rows of src (..., src_c) and dst (..., dst_c) */
static PyObject *py_cpu_channel_copy(PyObject *m, PyObject *args)
{
    PyObject *so, *dso;
    int src_off, dst_off, c, acc;
    if (!PyArg_ParseTuple(args, "OiOiip:cpu_channel_copy", &so, &src_off, &dso, &dst_off, &c, &acc))
        return NULL;
    int64_t ms, md, cs[1], cd[1];
    PtlTensor *src = rows_arg(m, so, "src", &ms, cs), *dst;
    if (!src || !(dst = rows_arg(m, dso, "dst", &md, cd)))
        return NULL;
    if (ms != md)
        return PyErr_Format(PyExc_ValueError, "dst: expected %lld rows like src, got %lld", (long long)ms,
                            (long long)md);
    RUN(ptl_cpu_channel_copy(ms, c, ptl_tensor_data(src), (int)cs[0], src_off, ptl_tensor_data(dst), (int)cd[0],
                             dst_off, acc));
    Py_RETURN_NONE;
}

/* qkv (b, n, heads * (2 kd + hd)) of an attention call, and the shapes of its attn and o. */
static PtlTensor *qkv_arg(PyObject *m, PyObject *obj, int heads, int kd, int hd, int64_t *as, int64_t *os)
{
    if (heads <= 0 || kd <= 0 || hd <= 0) {
        PyErr_Format(PyExc_ValueError, "heads, kd, hd: expected positive sizes, got %d, %d, %d", heads, kd, hd);
        return NULL;
    }
    const int64_t qs[3] = {-1, -1, (int64_t)heads * (2 * kd + hd)};
    PtlTensor *qkv = arg(m, obj, "qkv", 3, qs);
    if (!qkv)
        return NULL;
    const int64_t b = qkv->shape[0], n = qkv->shape[1];
    memcpy(as, (int64_t[4]){b, heads, n, n}, 4 * sizeof *as);
    memcpy(os, (int64_t[3]){b, n, (int64_t)heads * hd}, 3 * sizeof *os);
    return qkv;
}

#define ATTN_SIZES(qkv) (int)(qkv)->shape[0], (int)(qkv)->shape[1], heads, kd, hd

/* cpu_attention_forward(qkv (b, n, cq), heads, kd, hd, attn (b, heads, n, n), o (b, n, dim), v|None) */
static PyObject *py_cpu_attention_forward(PyObject *m, PyObject *args)
{
    PyObject *qo, *o[3];
    int heads, kd, hd;
    if (!PyArg_ParseTuple(args, "OiiiOOO:cpu_attention_forward", &qo, &heads, &kd, &hd, &o[0], &o[1], &o[2]))
        return NULL;
    int64_t as[4], os[3];
    PtlTensor *qkv = qkv_arg(m, qo, heads, kd, hd, as, os), *t[3];
    if (!qkv || tensors(m, 3, o, (const ptl_tensor_spec[]){{"attn", 4, as}, {"o", 3, os}, {"v", 3, os, 1}}, t))
        return NULL;
    WITH_WORKSPACE(ptl_cpu_attention_workspace(ATTN_SIZES(qkv)),
                   ptl_cpu_attention_forward(ATTN_SIZES(qkv), DATA(qkv), DATA(t[0]), DATA(t[1]), DATA(t[2]), ws_,
                                             wsb_));
    Py_RETURN_NONE;
}

/* cpu_attention_backward(qkv, attn, d_o, dv|None, heads, kd, hd, dqkv): dqkv = */
static PyObject *py_cpu_attention_backward(PyObject *m, PyObject *args)
{
    PyObject *qo, *o[4];
    int heads, kd, hd;
    if (!PyArg_ParseTuple(args, "OOOOiiiO:cpu_attention_backward", &qo, &o[0], &o[1], &o[2], &heads, &kd, &hd, &o[3]))
        return NULL;
    int64_t as[4], os[3];
    PtlTensor *qkv = qkv_arg(m, qo, heads, kd, hd, as, os), *t[4];
    if (!qkv || tensors(m, 4, o,
                        (const ptl_tensor_spec[]){{"attn", 4, as}, {"d_o", 3, os}, {"dv", 3, os, 1},
                                                  {"dqkv", 3, qkv->shape}},
                        t))
        return NULL;
    WITH_WORKSPACE(ptl_cpu_attention_workspace(ATTN_SIZES(qkv)),
                   ptl_cpu_attention_backward(ATTN_SIZES(qkv), DATA(qkv), DATA(t[0]), DATA(t[1]), DATA(t[2]),
                                              DATA(t[3]), ws_, wsb_));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ max-pool, upsample */

/* cpu_maxpool5_forward(x, y); cpu_maxpool5_backward(x, dy, dx, accumulate), all (n, h, w, c) */
#define NHWC(t) (int)(t)->shape[0], (int)(t)->shape[1], (int)(t)->shape[2], (int)(t)->shape[3]

static PyObject *py_cpu_maxpool5_forward(PyObject *m, PyObject *args)
{
    PtlTensor *x, *t[1];
    if (!(x = same_shape_args(m, args, "OO:cpu_maxpool5_forward", (const char *[]){"x", "y"}, 4, 1, t)))
        return NULL;
    RUN(ptl_cpu_maxpool5_forward(NHWC(x), DATA(x), DATA(t[0])));
    Py_RETURN_NONE;
}

static PyObject *py_cpu_maxpool5_backward(PyObject *m, PyObject *args)
{
    PyObject *xo, *dyo, *dxo;
    int acc;
    if (!PyArg_ParseTuple(args, "OOOp:cpu_maxpool5_backward", &xo, &dyo, &dxo, &acc))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", 4, NULL), *dy, *dx;
    if (!x || !(dy = arg(m, dyo, "dy", 4, x->shape)) || !(dx = arg(m, dxo, "dx", 4, x->shape)))
        return NULL;
    RUN(ptl_cpu_maxpool5_backward(NHWC(x), DATA(x), DATA(dy), DATA(dx), acc));
    Py_RETURN_NONE;
}

/* cpu_upsample2x_forward(x (n, h, w, c), y (n, 2h, 2w, c)); cpu_upsample2x_backward(dy, dx, accumulate) */
static PyObject *py_cpu_upsample2x_forward(PyObject *m, PyObject *args)
{
    PyObject *xo, *yo;
    if (!PyArg_ParseTuple(args, "OO:cpu_upsample2x_forward", &xo, &yo))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", 4, NULL), *y;
    if (!x)
        return NULL;
    const int64_t ys[4] = {x->shape[0], 2 * x->shape[1], 2 * x->shape[2], x->shape[3]};
    if (!(y = arg(m, yo, "y", 4, ys)))
        return NULL;
    RUN(ptl_cpu_upsample2x_forward(NHWC(x), DATA(x), DATA(y)));
    Py_RETURN_NONE;
}

static PyObject *py_cpu_upsample2x_backward(PyObject *m, PyObject *args)
{
    PyObject *dyo, *dxo;
    int acc;
    if (!PyArg_ParseTuple(args, "OOp:cpu_upsample2x_backward", &dyo, &dxo, &acc))
        return NULL;
    PtlTensor *dx = arg(m, dxo, "dx", 4, NULL), *dy;
    if (!dx)
        return NULL;
    const int64_t ys[4] = {dx->shape[0], 2 * dx->shape[1], 2 * dx->shape[2], dx->shape[3]};
    if (!(dy = arg(m, dyo, "dy", 4, ys)))
        return NULL;
    RUN(ptl_cpu_upsample2x_backward(NHWC(dx), DATA(dy), DATA(dx), acc));
    Py_RETURN_NONE;
}

/* cpu_kernel_stats(reset=False) -> {entry: (seconds, calls)} of the fast backend's kernels since the last
 * reset (benchmarks); reset=True starts the totals again. */
static PyObject *py_cpu_kernel_stats(PyObject *m, PyObject *args, PyObject *kw)
{
    (void)m;
    static char *kwlist[] = {"reset", NULL};
    int reset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:cpu_kernel_stats", kwlist, &reset))
        return NULL;
    PyObject *d = PyDict_New();
    double secs;
    int64_t ncalls;
    const char *name;
    for (int e = 0; d && (name = ptl_cpu_fast_stats(e, &secs, &ncalls)); e++) {
        PyObject *v = Py_BuildValue("(dL)", secs, (long long)ncalls);
        if (!v || PyDict_SetItemString(d, name, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    if (d && reset)
        ptl_cpu_fast_stats_reset();
    return d;
}

static PyMethodDef methods[] = {
    {"cpu_threads", py_cpu_threads, METH_NOARGS, "() -> threads of ptl's CPU kernels in the calling thread"},
    {"cpu_conv2d_available", py_cpu_conv2d_available, METH_NOARGS, "() -> whether this build has oneDNN"},
    {"cpu_conv2d_plan", (PyCFunction)(void (*)(void))py_cpu_conv2d_plan, METH_VARARGS | METH_KEYWORDS,
     "(n, h, w, cin, cout, k, stride, groups, weights='ohwi', bias=False, directions=7) -> plan"},
    {"cpu_conv2d_plan_info", py_cpu_conv2d_plan_info, METH_O, "(plan) -> workspace bytes and oneDNN impls"},
    {"cpu_conv2d_forward", py_cpu_conv2d_forward, METH_VARARGS, "(plan, x, w, bias|None, y); y ="},
    {"cpu_conv2d_backward_input", py_cpu_conv2d_backward_input, METH_VARARGS, "(plan, dy, w, dx); dx ="},
    {"cpu_conv2d_backward_weight", py_cpu_conv2d_backward_weight, METH_VARARGS, "(plan, x, dy, dw); dw +="},
    {"cpu_conv2d_backward_bias", py_cpu_conv2d_backward_bias, METH_VARARGS, "(plan, dy, db); db +="},
    {"cpu_batchnorm_forward", py_cpu_batchnorm_forward, METH_VARARGS,
     "(x, gamma, beta, running_mean, running_var, training, act, save_mean, save_invstd, y)"},
    {"cpu_batchnorm_backward", py_cpu_batchnorm_backward, METH_VARARGS,
     "(x, dy, gamma, beta, save_mean, save_invstd, training, act, dx, dgamma|None, dbeta|None)"},
    {"cpu_silu_forward", py_cpu_silu_forward, METH_VARARGS, "(x, y); y = silu(x)"},
    {"cpu_silu_backward", py_cpu_silu_backward, METH_VARARGS, "(x, dy, dx); dx = dy * silu'(x)"},
    {"cpu_add", py_cpu_add, METH_VARARGS, "(a, b, y); y = a + b"},
    {"cpu_accumulate", py_cpu_accumulate, METH_VARARGS, "(x, y); y += x"},
    {"cpu_channel_copy", py_cpu_channel_copy, METH_VARARGS, "(src, src_off, dst, dst_off, c, accumulate)"},
    {"cpu_attention_forward", py_cpu_attention_forward, METH_VARARGS, "(qkv, heads, kd, hd, attn, o, v|None)"},
    {"cpu_attention_backward", py_cpu_attention_backward, METH_VARARGS,
     "(qkv, attn, d_o, dv|None, heads, kd, hd, dqkv); dqkv ="},
    {"cpu_maxpool5_forward", py_cpu_maxpool5_forward, METH_VARARGS, "(x, y)"},
    {"cpu_maxpool5_backward", py_cpu_maxpool5_backward, METH_VARARGS, "(x, dy, dx, accumulate)"},
    {"cpu_upsample2x_forward", py_cpu_upsample2x_forward, METH_VARARGS, "(x, y)"},
    {"cpu_upsample2x_backward", py_cpu_upsample2x_backward, METH_VARARGS, "(dy, dx, accumulate)"},
    {"cpu_kernel_stats", (PyCFunction)(void (*)(void))py_cpu_kernel_stats, METH_VARARGS | METH_KEYWORDS,
     "(reset=False) -> {entry: (seconds, calls)} of the fast backend's kernels since the last reset (benchmarks)"},
    {NULL, NULL, 0, NULL},
};

int ptl_register_cpu(PyObject *module) { return PyModule_AddFunctions(module, methods); }
