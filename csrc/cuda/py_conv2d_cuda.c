/* Python bindings of the CUDA convolution plans (conv2d.h), for tests and benchmarks:
 * ptl._C.layer_cuda_conv2d_* (compiled only in CUDA builds). A convolution runs through a plan object
 * and writes into caller-provided outputs and workspace, so a benchmark loop allocates nothing. Also the
 * device's layer scratch and plan cache, for tests. The other layer ops have one binding for both
 * devices (../nn/py_layers.c). */
#include "../py.h"
#include "conv2d.h"
#include "device.h"
#include "layer_scratch.h"

#define PLAN_CAPSULE "ptl._C.conv2d_plan"

static int is_act_dtype(ptl_dtype dt) { return dt == PTL_FLOAT32 || dt == PTL_BFLOAT16 || dt == PTL_FLOAT16; }

/* A CUDA activation tensor. `like` (may be NULL) fixes device and dtype; without it any CUDA device and
 * float32/bfloat16/float16 are accepted. */
static PtlTensor *cuda_arg(PyObject *m, PyObject *obj, const char *name, PtlTensor *like, int ndim,
                           const int64_t *shape)
{
    PtlTensor *t = ptl_tensor_arg(m, obj, name, like ? (int)like->dtype : -1, like ? &like->storage->device : NULL,
                                  ndim, shape);
    if (!t)
        return NULL;
    if (t->storage->device.type != PTL_CUDA) {
        PyErr_Format(PyExc_ValueError, "%s: expected a CUDA tensor, got one on the CPU", name);
        return NULL;
    }
    if (!is_act_dtype(t->dtype)) {
        PyErr_Format(PyExc_TypeError, "%s: expected dtype float32, bfloat16 or float16, got %s", name,
                     ptl_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

static PtlTensor *opt_cuda_arg(PyObject *m, PyObject *obj, const char *name, PtlTensor *like, int ndim,
                               const int64_t *shape, int *err)
{
    if (obj == Py_None)
        return NULL;
    PtlTensor *t = cuda_arg(m, obj, name, like, ndim, shape);
    if (!t)
        *err = 1;
    return t;
}

static ptl_cuda_ctx *ctx_of(PyObject *m, PtlTensor *t)
{
    ptl_cuda_ctx *ctx;
    return ptl_py_exec_ctx(m, t->storage->device, &ctx) < 0 ? NULL : ctx;
}

static void *data_or_null(PtlTensor *t) { return t ? ptl_tensor_data(t) : NULL; }

#define RUN(call)                                                                                            \
    do {                                                                                                     \
        int rc_;                                                                                             \
        Py_BEGIN_ALLOW_THREADS rc_ = (call);                                                                 \
        Py_END_ALLOW_THREADS if (rc_ != 0) goto fail;                                                        \
    } while (0)

/* ------------------------------------------------------------------ conv2d */

static void plan_capsule_free(PyObject *cap)
{
    ptl_conv2d_plan_destroy((ptl_conv2d_plan *)PyCapsule_GetPointer(cap, PLAN_CAPSULE));
}

static ptl_conv2d_plan *plan_arg(PyObject *obj)
{
    if (!PyCapsule_IsValid(obj, PLAN_CAPSULE)) {
        PyErr_SetString(PyExc_TypeError, "plan: expected a plan from layer_cuda_conv2d_plan");
        return NULL;
    }
    return (ptl_conv2d_plan *)PyCapsule_GetPointer(obj, PLAN_CAPSULE);
}

/* layer_cuda_conv2d_plan(x, w, stride, groups, deterministic=True, allow_tf32=False, find=False,
 * workspace_limit=0) -> plan for x's shape/dtype/device and w (cout, k, k, cin/groups). */
static PyObject *py_conv2d_plan(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"x", "w", "stride", "groups", "deterministic", "allow_tf32", "find", "workspace_limit", NULL};
    PyObject *xo, *wo;
    int stride, groups, det = 1, tf32 = 0, find = 0;
    unsigned long long limit = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOii|pppK:layer_cuda_conv2d_plan", kw, &xo, &wo, &stride, &groups,
                                     &det, &tf32, &find, &limit))
        return NULL;
    PtlTensor *x = cuda_arg(m, xo, "x", NULL, 4, NULL), *w;
    if (!x || !(w = cuda_arg(m, wo, "w", x, 4, NULL)))
        return NULL;
    if (w->shape[1] != w->shape[2]) {
        PyErr_Format(PyExc_ValueError, "w: expected a square kernel (cout, k, k, cin/groups), got %lldx%lld",
                     (long long)w->shape[1], (long long)w->shape[2]);
        return NULL;
    }
    if (groups <= 0 || x->shape[3] % groups || w->shape[3] * groups != x->shape[3]) {
        PyErr_Format(PyExc_ValueError, "w: expected %lld/groups input channels (groups=%d), got %lld",
                     (long long)x->shape[3], groups, (long long)w->shape[3]);
        return NULL;
    }
    ptl_conv2d_desc d;
    if (ptl_conv2d_init(&d, (int)x->shape[0], (int)x->shape[1], (int)x->shape[2], (int)x->shape[3], (int)w->shape[0],
                        (int)w->shape[1], stride, groups))
        return ptl_raise(m);
    ptl_cuda_ctx *ctx = ctx_of(m, x);
    if (!ctx)
        return NULL;
    ptl_conv2d_plan_opts o = ptl_conv2d_plan_opts_default();
    o.deterministic = det;
    o.allow_tf32 = tf32;
    o.find = find;
    o.workspace_limit = (size_t)limit;
    ptl_conv2d_plan *plan = NULL;
    const ptl_dtype dt = x->dtype;
    RUN(ptl_conv2d_plan_create(ctx, &d, dt, &o, &plan));
    PyObject *cap = PyCapsule_New(plan, PLAN_CAPSULE, plan_capsule_free);
    if (!cap)
        ptl_conv2d_plan_destroy(plan);
    return cap;
fail:
    return ptl_raise(m);
}

/* layer_cuda_conv2d_plan_info(plan) -> dict: output shape, workspace bytes, algorithms, tensor-core use. */
static PyObject *py_conv2d_plan_info(PyObject *m, PyObject *po)
{
    (void)m;
    ptl_conv2d_plan *p = plan_arg(po);
    if (!p)
        return NULL;
    const ptl_conv2d_desc *d = ptl_conv2d_plan_desc(p);
    int algo[3], top[3];
    ptl_conv2d_plan_algos(p, algo, top);
    return Py_BuildValue("{s(iiii)s(iiii)snsss(iii)s(OOO)}", "x_shape", d->n, d->h, d->w, d->cin, "y_shape", d->n,
                         d->ho, d->wo, d->cout, "workspace", (Py_ssize_t)ptl_conv2d_plan_workspace(p), "dtype",
                         ptl_dtype_name(ptl_conv2d_plan_dtype(p)), "algos", algo[0], algo[1], algo[2], "tensor_op",
                         top[0] ? Py_True : Py_False, top[1] ? Py_True : Py_False, top[2] ? Py_True : Py_False);
}

/* The workspace tensor (any dtype, CUDA, on x's device) or None: pointer and size in bytes. */
static int ws_arg(PyObject *m, PyObject *obj, PtlTensor *like, void **ptr, size_t *bytes)
{
    *ptr = NULL;
    *bytes = 0;
    if (obj == Py_None)
        return 0;
    PtlTensor *t = ptl_tensor_arg(m, obj, "workspace", -1, &like->storage->device, -1, NULL);
    if (!t)
        return -1;
    *ptr = ptl_tensor_data(t);
    *bytes = ptl_tensor_nbytes(t);
    return 0;
}

static int plan_matches(const ptl_conv2d_plan *p, PtlTensor *x)
{
    if (ptl_conv2d_plan_dtype(p) != x->dtype) {
        PyErr_Format(PyExc_TypeError, "plan: made for dtype %s, tensors are %s",
                     ptl_dtype_name(ptl_conv2d_plan_dtype(p)), ptl_dtype_name(x->dtype));
        return -1;
    }
    return 0;
}

/* layer_cuda_conv2d_forward(plan, x, w, bias|None, y, workspace|None): y = conv(x, w) (+ bias). */
static PyObject *py_conv2d_forward(PyObject *m, PyObject *args)
{
    PyObject *po, *xo, *wo, *bo, *yo, *wso;
    int err = 0;
    if (!PyArg_ParseTuple(args, "OOOOOO:layer_cuda_conv2d_forward", &po, &xo, &wo, &bo, &yo, &wso))
        return NULL;
    ptl_conv2d_plan *p = plan_arg(po);
    if (!p)
        return NULL;
    const ptl_conv2d_desc *d = ptl_conv2d_plan_desc(p);
    const int64_t xs[4] = {d->n, d->h, d->w, d->cin}, ws[4] = {d->cout, d->k, d->k, d->cin / d->groups},
                  ys[4] = {d->n, d->ho, d->wo, d->cout}, bs[1] = {d->cout};
    PtlTensor *x = cuda_arg(m, xo, "x", NULL, 4, xs), *w, *b, *y;
    if (!x || plan_matches(p, x) || !(w = cuda_arg(m, wo, "w", x, 4, ws)) || !(y = cuda_arg(m, yo, "y", x, 4, ys)))
        return NULL;
    b = opt_cuda_arg(m, bo, "bias", x, 1, bs, &err);
    void *wsp;
    size_t wsb;
    if (err || ws_arg(m, wso, x, &wsp, &wsb))
        return NULL;
    ptl_cuda_ctx *ctx = ctx_of(m, x);
    if (!ctx)
        return NULL;
    RUN(ptl_conv2d_forward_cuda(ctx, p, ptl_tensor_data(x), ptl_tensor_data(w), data_or_null(b), ptl_tensor_data(y),
                                wsp, wsb));
    Py_RETURN_NONE;
fail:
    return ptl_raise(m);
}

/* layer_cuda_conv2d_backward_input(plan, dy, w, dx, workspace|None): dx = dL/dx. */
static PyObject *py_conv2d_backward_input(PyObject *m, PyObject *args)
{
    PyObject *po, *dyo, *wo, *dxo, *wso;
    if (!PyArg_ParseTuple(args, "OOOOO:layer_cuda_conv2d_backward_input", &po, &dyo, &wo, &dxo, &wso))
        return NULL;
    ptl_conv2d_plan *p = plan_arg(po);
    if (!p)
        return NULL;
    const ptl_conv2d_desc *d = ptl_conv2d_plan_desc(p);
    const int64_t xs[4] = {d->n, d->h, d->w, d->cin}, ws[4] = {d->cout, d->k, d->k, d->cin / d->groups},
                  ys[4] = {d->n, d->ho, d->wo, d->cout};
    PtlTensor *dy = cuda_arg(m, dyo, "dy", NULL, 4, ys), *w, *dx;
    if (!dy || plan_matches(p, dy) || !(w = cuda_arg(m, wo, "w", dy, 4, ws)) ||
        !(dx = cuda_arg(m, dxo, "dx", dy, 4, xs)))
        return NULL;
    void *wsp;
    size_t wsb;
    if (ws_arg(m, wso, dy, &wsp, &wsb))
        return NULL;
    ptl_cuda_ctx *ctx = ctx_of(m, dy);
    if (!ctx)
        return NULL;
    RUN(ptl_conv2d_backward_input_cuda(ctx, p, ptl_tensor_data(dy), ptl_tensor_data(w), ptl_tensor_data(dx), wsp, wsb));
    Py_RETURN_NONE;
fail:
    return ptl_raise(m);
}

/* layer_cuda_conv2d_backward_weight(plan, x, dy, dw, workspace|None): dw += dL/dw. */
static PyObject *py_conv2d_backward_weight(PyObject *m, PyObject *args)
{
    PyObject *po, *xo, *dyo, *dwo, *wso;
    if (!PyArg_ParseTuple(args, "OOOOO:layer_cuda_conv2d_backward_weight", &po, &xo, &dyo, &dwo, &wso))
        return NULL;
    ptl_conv2d_plan *p = plan_arg(po);
    if (!p)
        return NULL;
    const ptl_conv2d_desc *d = ptl_conv2d_plan_desc(p);
    const int64_t xs[4] = {d->n, d->h, d->w, d->cin}, ws[4] = {d->cout, d->k, d->k, d->cin / d->groups},
                  ys[4] = {d->n, d->ho, d->wo, d->cout};
    PtlTensor *x = cuda_arg(m, xo, "x", NULL, 4, xs), *dy, *dw;
    if (!x || plan_matches(p, x) || !(dy = cuda_arg(m, dyo, "dy", x, 4, ys)) ||
        !(dw = cuda_arg(m, dwo, "dw", x, 4, ws)))
        return NULL;
    void *wsp;
    size_t wsb;
    if (ws_arg(m, wso, x, &wsp, &wsb))
        return NULL;
    ptl_cuda_ctx *ctx = ctx_of(m, x);
    if (!ctx)
        return NULL;
    RUN(ptl_conv2d_backward_weight_cuda(ctx, p, ptl_tensor_data(x), ptl_tensor_data(dy), ptl_tensor_data(dw), wsp,
                                        wsb));
    Py_RETURN_NONE;
fail:
    return ptl_raise(m);
}

/* layer_cuda_conv2d_backward_bias(plan, dy, db, workspace|None): db += sum of dy over (n, ho, wo). */
static PyObject *py_conv2d_backward_bias(PyObject *m, PyObject *args)
{
    PyObject *po, *dyo, *dbo, *wso;
    if (!PyArg_ParseTuple(args, "OOOO:layer_cuda_conv2d_backward_bias", &po, &dyo, &dbo, &wso))
        return NULL;
    ptl_conv2d_plan *p = plan_arg(po);
    if (!p)
        return NULL;
    const ptl_conv2d_desc *d = ptl_conv2d_plan_desc(p);
    const int64_t ys[4] = {d->n, d->ho, d->wo, d->cout}, bs[1] = {d->cout};
    PtlTensor *dy = cuda_arg(m, dyo, "dy", NULL, 4, ys), *db;
    if (!dy || plan_matches(p, dy) || !(db = cuda_arg(m, dbo, "db", dy, 1, bs)))
        return NULL;
    void *wsp;
    size_t wsb;
    if (ws_arg(m, wso, dy, &wsp, &wsb))
        return NULL;
    ptl_cuda_ctx *ctx = ctx_of(m, dy);
    if (!ctx)
        return NULL;
    RUN(ptl_conv2d_backward_bias_cuda(ctx, p, ptl_tensor_data(dy), ptl_tensor_data(db), wsp, wsb));
    Py_RETURN_NONE;
fail:
    return ptl_raise(m);
}

/* layer_cuda_reserve_scratch(device_index, bytes): grows the per-device layer scratch once. */
static PyObject *py_reserve_scratch(PyObject *m, PyObject *args)
{
    int index;
    unsigned long long bytes;
    ptl_cuda_ctx *ctx = NULL;
    int rc;
    if (!PyArg_ParseTuple(args, "iK:layer_cuda_reserve_scratch", &index, &bytes))
        return NULL;
    Py_BEGIN_ALLOW_THREADS rc = ptl_cuda_ctx_get(ptl_state(m)->rt, index, &ctx);
    if (rc == 0)
        rc = ptl_layers_cuda_reserve(ctx, (size_t)bytes);
    Py_END_ALLOW_THREADS if (rc != 0) return ptl_raise(m);
    Py_RETURN_NONE;
}

/* layer_cuda_conv2d_plan_cache(device_index) -> (plans held, plans made) by the device's plan cache. */
static PyObject *py_conv2d_plan_cache(PyObject *m, PyObject *args)
{
    int index;
    int64_t held = 0, made = 0;
    ptl_cuda_ctx *ctx = NULL;
    if (!PyArg_ParseTuple(args, "i:layer_cuda_conv2d_plan_cache", &index))
        return NULL;
    if (ptl_cuda_ctx_get(ptl_state(m)->rt, index, &ctx))
        return ptl_raise(m);
    ptl_conv2d_plan_cache_stats(ctx, &held, &made);
    return Py_BuildValue("LL", (long long)held, (long long)made);
}

static PyMethodDef methods[] = {
    {"layer_cuda_conv2d_plan", (PyCFunction)(void (*)(void))py_conv2d_plan, METH_VARARGS | METH_KEYWORDS,
     "(x, w, stride, groups, deterministic=True, allow_tf32=False, find=False, workspace_limit=0) -> plan"},
    {"layer_cuda_conv2d_plan_info", py_conv2d_plan_info, METH_O, "(plan) -> dict"},
    {"layer_cuda_conv2d_forward", py_conv2d_forward, METH_VARARGS, "(plan, x, w, bias|None, y, workspace|None)"},
    {"layer_cuda_conv2d_backward_input", py_conv2d_backward_input, METH_VARARGS,
     "(plan, dy, w, dx, workspace|None); dx ="},
    {"layer_cuda_conv2d_backward_weight", py_conv2d_backward_weight, METH_VARARGS,
     "(plan, x, dy, dw, workspace|None); dw +="},
    {"layer_cuda_conv2d_backward_bias", py_conv2d_backward_bias, METH_VARARGS, "(plan, dy, db, workspace|None); db +="},
    {"layer_cuda_reserve_scratch", py_reserve_scratch, METH_VARARGS, "(device_index, bytes)"},
    {"layer_cuda_conv2d_plan_cache", py_conv2d_plan_cache, METH_VARARGS, "(device_index) -> (held, made)"},
    {NULL, NULL, 0, NULL},
};

int ptl_register_conv2d_cuda(PyObject *module) { return PyModule_AddFunctions(module, methods); }
