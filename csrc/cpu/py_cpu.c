/* Python bindings of the fast CPU backend (csrc/cpu/), for tests and benchmarks: ptl._C.cpu_* functions.
 * Every output is passed in (overwritten or accumulated as the C function does), so a benchmark times
 * the kernel alone. Tensors are float32 CPU tensors. */
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

/* Weights in the plan's layout: (cout, k, k, cin/groups) or (cout, cin/groups, k, k). */
static PtlTensor *weights_arg(PyObject *m, PyObject *obj, const char *name, const ptl_cpu_conv2d_plan *p)
{
    const ptl_conv2d_desc *d = ptl_cpu_conv2d_plan_desc(p);
    const int64_t cig = d->cin / d->groups;
    const int64_t ohwi[4] = {d->cout, d->k, d->k, cig}, oihw[4] = {d->cout, cig, d->k, d->k};
    return arg(m, obj, name, 4, ptl_cpu_conv2d_plan_opts(p)->weights == PTL_CPU_WEIGHTS_OHWI ? ohwi : oihw);
}

/* cpu_conv2d_forward(plan, x, w, bias|None, y): y = conv(x, w) (+ bias). */
static PyObject *py_cpu_conv2d_forward(PyObject *m, PyObject *args)
{
    PyObject *po, *xo, *wo, *bo, *yo;
    void *ws;
    size_t wsb;
    if (!PyArg_ParseTuple(args, "OOOOO:cpu_conv2d_forward", &po, &xo, &wo, &bo, &yo))
        return NULL;
    const ptl_cpu_conv2d_plan *p = plan_arg(po, &ws, &wsb);
    if (!p)
        return NULL;
    const ptl_conv2d_desc *d = ptl_cpu_conv2d_plan_desc(p);
    const int64_t xs[4] = {d->n, d->h, d->w, d->cin}, ys[4] = {d->n, d->ho, d->wo, d->cout}, bs[1] = {d->cout};
    PtlTensor *x, *w, *b = NULL, *y;
    if (!(x = arg(m, xo, "x", 4, xs)) || !(w = weights_arg(m, wo, "w", p)) || !(y = arg(m, yo, "y", 4, ys)))
        return NULL;
    if (bo != Py_None && !(b = arg(m, bo, "bias", 1, bs)))
        return NULL;
    RUN(ptl_cpu_conv2d_forward(p, ptl_tensor_data(x), ptl_tensor_data(w), b ? ptl_tensor_data(b) : NULL,
                               ptl_tensor_data(y), ws, wsb));
    Py_RETURN_NONE;
}

/* cpu_conv2d_backward_input(plan, dy, w, dx): dx = dL/dx. */
static PyObject *py_cpu_conv2d_backward_input(PyObject *m, PyObject *args)
{
    PyObject *po, *dyo, *wo, *dxo;
    void *ws;
    size_t wsb;
    if (!PyArg_ParseTuple(args, "OOOO:cpu_conv2d_backward_input", &po, &dyo, &wo, &dxo))
        return NULL;
    const ptl_cpu_conv2d_plan *p = plan_arg(po, &ws, &wsb);
    if (!p)
        return NULL;
    const ptl_conv2d_desc *d = ptl_cpu_conv2d_plan_desc(p);
    const int64_t xs[4] = {d->n, d->h, d->w, d->cin}, ys[4] = {d->n, d->ho, d->wo, d->cout};
    PtlTensor *dy, *w, *dx;
    if (!(dy = arg(m, dyo, "dy", 4, ys)) || !(w = weights_arg(m, wo, "w", p)) || !(dx = arg(m, dxo, "dx", 4, xs)))
        return NULL;
    RUN(ptl_cpu_conv2d_backward_input(p, ptl_tensor_data(dy), ptl_tensor_data(w), ptl_tensor_data(dx), ws, wsb));
    Py_RETURN_NONE;
}

/* cpu_conv2d_backward_weight(plan, x, dy, dw): dw += dL/dw. */
static PyObject *py_cpu_conv2d_backward_weight(PyObject *m, PyObject *args)
{
    PyObject *po, *xo, *dyo, *dwo;
    void *ws;
    size_t wsb;
    if (!PyArg_ParseTuple(args, "OOOO:cpu_conv2d_backward_weight", &po, &xo, &dyo, &dwo))
        return NULL;
    const ptl_cpu_conv2d_plan *p = plan_arg(po, &ws, &wsb);
    if (!p)
        return NULL;
    const ptl_conv2d_desc *d = ptl_cpu_conv2d_plan_desc(p);
    const int64_t xs[4] = {d->n, d->h, d->w, d->cin}, ys[4] = {d->n, d->ho, d->wo, d->cout};
    PtlTensor *x, *dy, *dw;
    if (!(x = arg(m, xo, "x", 4, xs)) || !(dy = arg(m, dyo, "dy", 4, ys)) || !(dw = weights_arg(m, dwo, "dw", p)))
        return NULL;
    RUN(ptl_cpu_conv2d_backward_weight(p, ptl_tensor_data(x), ptl_tensor_data(dy), ptl_tensor_data(dw), ws, wsb));
    Py_RETURN_NONE;
}

/* cpu_conv2d_backward_bias(plan, dy, db): db += sum of dy over (n, ho, wo). */
static PyObject *py_cpu_conv2d_backward_bias(PyObject *m, PyObject *args)
{
    PyObject *po, *dyo, *dbo;
    void *ws;
    size_t wsb;
    if (!PyArg_ParseTuple(args, "OOO:cpu_conv2d_backward_bias", &po, &dyo, &dbo))
        return NULL;
    const ptl_cpu_conv2d_plan *p = plan_arg(po, &ws, &wsb);
    if (!p)
        return NULL;
    const ptl_conv2d_desc *d = ptl_cpu_conv2d_plan_desc(p);
    const int64_t ys[4] = {d->n, d->ho, d->wo, d->cout}, bs[1] = {d->cout};
    PtlTensor *dy, *db;
    if (!(dy = arg(m, dyo, "dy", 4, ys)) || !(db = arg(m, dbo, "db", 1, bs)))
        return NULL;
    RUN(ptl_cpu_conv2d_backward_bias(p, ptl_tensor_data(dy), ptl_tensor_data(db)));
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
    PyObject *xo, *go, *bo, *rmo, *rvo, *acto, *smo, *sio, *yo;
    int training;
    ptl_act act;
    if (!PyArg_ParseTuple(args, "OOOOOpOOOO:cpu_batchnorm_forward", &xo, &go, &bo, &rmo, &rvo, &training, &acto, &smo,
                          &sio, &yo) ||
        parse_act(acto, &act))
        return NULL;
    int64_t rows, cs[1];
    PtlTensor *x = rows_arg(m, xo, "x", &rows, cs), *g, *b, *rm, *rv, *sm, *si, *y;
    if (!x || !(g = arg(m, go, "gamma", 1, cs)) || !(b = arg(m, bo, "beta", 1, cs)) ||
        !(rm = arg(m, rmo, "running_mean", 1, cs)) || !(rv = arg(m, rvo, "running_var", 1, cs)) ||
        !(sm = arg(m, smo, "save_mean", 1, cs)) || !(si = arg(m, sio, "save_invstd", 1, cs)) ||
        !(y = arg(m, yo, "y", x->ndim, x->shape)))
        return NULL;
    WITH_WORKSPACE(ptl_cpu_batchnorm_workspace(rows, (int)cs[0]),
                   ptl_cpu_batchnorm_forward(rows, (int)cs[0], ptl_tensor_data(x), ptl_tensor_data(g),
                                             ptl_tensor_data(b), ptl_tensor_data(rm), ptl_tensor_data(rv), training,
                                             act, ptl_tensor_data(sm), ptl_tensor_data(si), ptl_tensor_data(y), ws_,
                                             wsb_));
    Py_RETURN_NONE;
}

/* cpu_batchnorm_backward(x, dy, gamma, beta, save_mean, save_invstd, training, act, dx, dgamma|None,
 * dbeta|None): dx =, dgamma/dbeta += */
static PyObject *py_cpu_batchnorm_backward(PyObject *m, PyObject *args)
{
    PyObject *xo, *dyo, *go, *bo, *smo, *sio, *acto, *dxo, *dgo, *dbo;
    int training;
    ptl_act act;
    if (!PyArg_ParseTuple(args, "OOOOOOpOOOO:cpu_batchnorm_backward", &xo, &dyo, &go, &bo, &smo, &sio, &training,
                          &acto, &dxo, &dgo, &dbo) ||
        parse_act(acto, &act))
        return NULL;
    int64_t rows, cs[1];
    PtlTensor *x = rows_arg(m, xo, "x", &rows, cs), *dy, *g, *b, *sm, *si, *dx, *dg = NULL, *db = NULL;
    if (!x || !(dy = arg(m, dyo, "dy", x->ndim, x->shape)) || !(g = arg(m, go, "gamma", 1, cs)) ||
        !(b = arg(m, bo, "beta", 1, cs)) || !(sm = arg(m, smo, "save_mean", 1, cs)) ||
        !(si = arg(m, sio, "save_invstd", 1, cs)) || !(dx = arg(m, dxo, "dx", x->ndim, x->shape)))
        return NULL;
    if ((dgo != Py_None && !(dg = arg(m, dgo, "dgamma", 1, cs))) || (dbo != Py_None && !(db = arg(m, dbo, "dbeta", 1, cs))))
        return NULL;
    WITH_WORKSPACE(ptl_cpu_batchnorm_workspace(rows, (int)cs[0]),
                   ptl_cpu_batchnorm_backward(rows, (int)cs[0], ptl_tensor_data(x), ptl_tensor_data(dy),
                                              ptl_tensor_data(g), ptl_tensor_data(b), ptl_tensor_data(sm),
                                              ptl_tensor_data(si), training, act, ptl_tensor_data(dx),
                                              dg ? ptl_tensor_data(dg) : NULL, db ? ptl_tensor_data(db) : NULL, ws_,
                                              wsb_));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ silu */

/* cpu_silu_forward(x, y); cpu_silu_backward(x, dy, dx) */
static PyObject *py_cpu_silu_forward(PyObject *m, PyObject *args)
{
    PyObject *xo, *yo;
    if (!PyArg_ParseTuple(args, "OO:cpu_silu_forward", &xo, &yo))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", -1, NULL), *y;
    if (!x || !(y = arg(m, yo, "y", x->ndim, x->shape)))
        return NULL;
    RUN(ptl_cpu_silu_forward(ptl_tensor_numel(x), ptl_tensor_data(x), ptl_tensor_data(y)));
    Py_RETURN_NONE;
}

static PyObject *py_cpu_silu_backward(PyObject *m, PyObject *args)
{
    PyObject *xo, *dyo, *dxo;
    if (!PyArg_ParseTuple(args, "OOO:cpu_silu_backward", &xo, &dyo, &dxo))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", -1, NULL), *dy, *dx;
    if (!x || !(dy = arg(m, dyo, "dy", x->ndim, x->shape)) || !(dx = arg(m, dxo, "dx", x->ndim, x->shape)))
        return NULL;
    RUN(ptl_cpu_silu_backward(ptl_tensor_numel(x), ptl_tensor_data(x), ptl_tensor_data(dy), ptl_tensor_data(dx)));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ element-wise, attention */

/* cpu_add(a, b, y): y = a + b; cpu_accumulate(x, y): y += x (same shapes) */
static PyObject *py_cpu_add(PyObject *m, PyObject *args)
{
    PyObject *ao, *bo, *yo;
    if (!PyArg_ParseTuple(args, "OOO:cpu_add", &ao, &bo, &yo))
        return NULL;
    PtlTensor *a = arg(m, ao, "a", -1, NULL), *b, *y;
    if (!a || !(b = arg(m, bo, "b", a->ndim, a->shape)) || !(y = arg(m, yo, "y", a->ndim, a->shape)))
        return NULL;
    RUN(ptl_cpu_add(ptl_tensor_numel(a), ptl_tensor_data(a), ptl_tensor_data(b), ptl_tensor_data(y)));
    Py_RETURN_NONE;
}

static PyObject *py_cpu_accumulate(PyObject *m, PyObject *args)
{
    PyObject *xo, *yo;
    if (!PyArg_ParseTuple(args, "OO:cpu_accumulate", &xo, &yo))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", -1, NULL), *y;
    if (!x || !(y = arg(m, yo, "y", x->ndim, x->shape)))
        return NULL;
    RUN(ptl_cpu_accumulate(ptl_tensor_numel(x), ptl_tensor_data(x), ptl_tensor_data(y)));
    Py_RETURN_NONE;
}

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

/* cpu_attention_forward(qkv (b, n, cq), heads, kd, hd, attn (b, heads, n, n), o (b, n, dim), v|None) */
static PyObject *py_cpu_attention_forward(PyObject *m, PyObject *args)
{
    PyObject *qo, *ao, *oo, *vo;
    int heads, kd, hd;
    if (!PyArg_ParseTuple(args, "OiiiOOO:cpu_attention_forward", &qo, &heads, &kd, &hd, &ao, &oo, &vo))
        return NULL;
    if (heads <= 0 || kd <= 0 || hd <= 0)
        return PyErr_Format(PyExc_ValueError, "heads, kd, hd: expected positive sizes, got %d, %d, %d", heads, kd, hd);
    const int64_t qs[3] = {-1, -1, (int64_t)heads * (2 * kd + hd)};
    PtlTensor *qkv = arg(m, qo, "qkv", 3, qs), *at, *o, *v = NULL;
    if (!qkv)
        return NULL;
    const int b = (int)qkv->shape[0], n = (int)qkv->shape[1];
    const int64_t as[4] = {b, heads, n, n}, os[3] = {b, n, (int64_t)heads * hd};
    if (!(at = arg(m, ao, "attn", 4, as)) || !(o = arg(m, oo, "o", 3, os)) ||
        (vo != Py_None && !(v = arg(m, vo, "v", 3, os))))
        return NULL;
    WITH_WORKSPACE(ptl_cpu_attention_workspace(b, n, heads, kd, hd),
                   ptl_cpu_attention_forward(b, n, heads, kd, hd, ptl_tensor_data(qkv), ptl_tensor_data(at),
                                             ptl_tensor_data(o), v ? ptl_tensor_data(v) : NULL, ws_, wsb_));
    Py_RETURN_NONE;
}

/* cpu_attention_backward(qkv, attn, d_o, dv|None, heads, kd, hd, dqkv): dqkv = */
static PyObject *py_cpu_attention_backward(PyObject *m, PyObject *args)
{
    PyObject *qo, *ao, *doo, *dvo, *dqo;
    int heads, kd, hd;
    if (!PyArg_ParseTuple(args, "OOOOiiiO:cpu_attention_backward", &qo, &ao, &doo, &dvo, &heads, &kd, &hd, &dqo))
        return NULL;
    if (heads <= 0 || kd <= 0 || hd <= 0)
        return PyErr_Format(PyExc_ValueError, "heads, kd, hd: expected positive sizes, got %d, %d, %d", heads, kd, hd);
    const int64_t qs[3] = {-1, -1, (int64_t)heads * (2 * kd + hd)};
    PtlTensor *qkv = arg(m, qo, "qkv", 3, qs), *at, *d_o, *dv = NULL, *dq;
    if (!qkv)
        return NULL;
    const int b = (int)qkv->shape[0], n = (int)qkv->shape[1];
    const int64_t as[4] = {b, heads, n, n}, os[3] = {b, n, (int64_t)heads * hd};
    if (!(at = arg(m, ao, "attn", 4, as)) || !(d_o = arg(m, doo, "d_o", 3, os)) ||
        (dvo != Py_None && !(dv = arg(m, dvo, "dv", 3, os))) || !(dq = arg(m, dqo, "dqkv", 3, qkv->shape)))
        return NULL;
    WITH_WORKSPACE(ptl_cpu_attention_workspace(b, n, heads, kd, hd),
                   ptl_cpu_attention_backward(b, n, heads, kd, hd, ptl_tensor_data(qkv), ptl_tensor_data(at),
                                              ptl_tensor_data(d_o), dv ? ptl_tensor_data(dv) : NULL,
                                              ptl_tensor_data(dq), ws_, wsb_));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ max-pool, upsample */

/* cpu_maxpool5_forward(x, y); cpu_maxpool5_backward(x, dy, dx, accumulate), all (n, h, w, c) */
static PyObject *py_cpu_maxpool5_forward(PyObject *m, PyObject *args)
{
    PyObject *xo, *yo;
    if (!PyArg_ParseTuple(args, "OO:cpu_maxpool5_forward", &xo, &yo))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", 4, NULL), *y;
    if (!x || !(y = arg(m, yo, "y", 4, x->shape)))
        return NULL;
    RUN(ptl_cpu_maxpool5_forward((int)x->shape[0], (int)x->shape[1], (int)x->shape[2], (int)x->shape[3],
                                 ptl_tensor_data(x), ptl_tensor_data(y)));
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
    RUN(ptl_cpu_maxpool5_backward((int)x->shape[0], (int)x->shape[1], (int)x->shape[2], (int)x->shape[3],
                                  ptl_tensor_data(x), ptl_tensor_data(dy), ptl_tensor_data(dx), acc));
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
    RUN(ptl_cpu_upsample2x_forward((int)x->shape[0], (int)x->shape[1], (int)x->shape[2], (int)x->shape[3],
                                   ptl_tensor_data(x), ptl_tensor_data(y)));
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
    RUN(ptl_cpu_upsample2x_backward((int)dx->shape[0], (int)dx->shape[1], (int)dx->shape[2], (int)dx->shape[3],
                                    ptl_tensor_data(dy), ptl_tensor_data(dx), acc));
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
