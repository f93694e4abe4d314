/* Python bindings of the CUDA layer kernels, for tests and benchmarks: ptl._C.layer_cuda_* functions
 * (compiled only in CUDA builds; module.c registers them under PTL_WITH_CUDA).
 *
 * Activations are CUDA tensors of dtype float32, bfloat16 or float16, all of one call on one device
 * with one dtype; BatchNorm parameters, running statistics and saved statistics are float32 there.
 * Forwards that return tensors allocate them; backwards write into the tensors they are given
 * (activation gradients overwritten, parameter gradients accumulated). Convolutions run through a
 * plan object (layer_cuda_conv2d_plan) and write into caller-provided outputs and workspace, so a
 * benchmark loop allocates nothing. */
#include "../nn/activation.h"
#include "../nn/attention.h"
#include "../nn/batchnorm.h"
#include "../nn/concat.h"
#include "../nn/elementwise.h"
#include "../nn/maxpool.h"
#include "../nn/upsample.h"
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

/* A float32 tensor on like's device (BatchNorm parameters and statistics). */
static PtlTensor *farg(PyObject *m, PyObject *obj, const char *name, PtlTensor *like, int ndim, const int64_t *shape)
{
    return ptl_tensor_arg(m, obj, name, PTL_FLOAT32, &like->storage->device, ndim, shape);
}

static PtlTensor *opt_farg(PyObject *m, PyObject *obj, const char *name, PtlTensor *like, int ndim,
                           const int64_t *shape, int *err)
{
    if (obj == Py_None)
        return NULL;
    PtlTensor *t = farg(m, obj, name, like, ndim, shape);
    if (!t)
        *err = 1;
    return t;
}

static ptl_cuda_ctx *ctx_of(PyObject *m, PtlTensor *t)
{
    ptl_cuda_ctx *ctx = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = ptl_cuda_ctx_get(ptl_state(m)->rt, t->storage->device.index, &ctx);
    Py_END_ALLOW_THREADS if (rc != 0) return (ptl_cuda_ctx *)ptl_raise(m);
    return ctx;
}

static PtlTensor *new_like(PyObject *m, PtlTensor *like, int ndim, const int64_t *shape, ptl_dtype dt)
{
    return ptl_tensor_empty(m, ndim, shape, dt, like->storage->device);
}

static void *data_or_null(PtlTensor *t) { return t ? ptl_tensor_data(t) : NULL; }

#define RUN(call)                                                                                            \
    do {                                                                                                     \
        int rc_;                                                                                             \
        Py_BEGIN_ALLOW_THREADS rc_ = (call);                                                                 \
        Py_END_ALLOW_THREADS if (rc_ != 0) goto fail;                                                        \
    } while (0)

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

/* ------------------------------------------------------------------ batchnorm / silu */

/* layer_cuda_batchnorm_forward(x, gamma, beta, running_mean, running_var, training, act) ->
 * (y, save_mean, save_invstd); x (..., c) CUDA, the others float32 (c,) on x's device. */
static PyObject *py_batchnorm_forward(PyObject *m, PyObject *args)
{
    PyObject *xo, *go, *bo, *rmo, *rvo, *acto;
    int training;
    ptl_act act;
    if (!PyArg_ParseTuple(args, "OOOOOpO:layer_cuda_batchnorm_forward", &xo, &go, &bo, &rmo, &rvo, &training,
                          &acto) ||
        parse_act(acto, &act))
        return NULL;
    PtlTensor *x = cuda_arg(m, xo, "x", NULL, -1, NULL), *g, *b, *rm, *rv, *y = NULL, *sm = NULL, *si = NULL;
    if (!x)
        return NULL;
    if (x->ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "x: expected at least 1 dimension (channels last)");
        return NULL;
    }
    const int64_t cs[1] = {x->shape[x->ndim - 1]};
    if (!(g = farg(m, go, "gamma", x, 1, cs)) || !(b = farg(m, bo, "beta", x, 1, cs)) ||
        !(rm = farg(m, rmo, "running_mean", x, 1, cs)) || !(rv = farg(m, rvo, "running_var", x, 1, cs)))
        return NULL;
    ptl_cuda_ctx *ctx = ctx_of(m, x);
    if (!ctx)
        return NULL;
    if (!(y = new_like(m, x, x->ndim, x->shape, x->dtype)) || !(sm = new_like(m, x, 1, cs, PTL_FLOAT32)) ||
        !(si = new_like(m, x, 1, cs, PTL_FLOAT32)))
        goto cleanup;
    const int64_t c = cs[0], rows = c ? ptl_tensor_numel(x) / c : 0;
    RUN(ptl_batchnorm_forward_cuda(ctx, x->dtype, rows, (int)c, ptl_tensor_data(x), ptl_tensor_data(g),
                                   ptl_tensor_data(b), ptl_tensor_data(rm), ptl_tensor_data(rv), training, act,
                                   ptl_tensor_data(sm), ptl_tensor_data(si), ptl_tensor_data(y)));
    return Py_BuildValue("(NNN)", y, sm, si);
fail:
    ptl_raise(m);
cleanup:
    Py_XDECREF(y);
    Py_XDECREF(sm);
    Py_XDECREF(si);
    return NULL;
}

/* layer_cuda_batchnorm_backward(x, dy, gamma, beta, save_mean, save_invstd, training, act, dx,
 * dgamma|None, dbeta|None): dx overwritten (may be dy itself), dgamma/dbeta accumulated. */
static PyObject *py_batchnorm_backward(PyObject *m, PyObject *args)
{
    PyObject *xo, *dyo, *go, *bo, *smo, *sio, *acto, *dxo, *dgo, *dbo;
    int training, err = 0;
    ptl_act act;
    if (!PyArg_ParseTuple(args, "OOOOOOpOOOO:layer_cuda_batchnorm_backward", &xo, &dyo, &go, &bo, &smo, &sio,
                          &training, &acto, &dxo, &dgo, &dbo) ||
        parse_act(acto, &act))
        return NULL;
    PtlTensor *x = cuda_arg(m, xo, "x", NULL, -1, NULL), *dy, *g, *b, *sm, *si, *dx, *dg, *db;
    if (!x)
        return NULL;
    if (x->ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "x: expected at least 1 dimension (channels last)");
        return NULL;
    }
    const int64_t cs[1] = {x->shape[x->ndim - 1]};
    if (!(dy = cuda_arg(m, dyo, "dy", x, x->ndim, x->shape)) || !(dx = cuda_arg(m, dxo, "dx", x, x->ndim, x->shape)) ||
        !(g = farg(m, go, "gamma", x, 1, cs)) || !(b = farg(m, bo, "beta", x, 1, cs)) ||
        !(sm = farg(m, smo, "save_mean", x, 1, cs)) || !(si = farg(m, sio, "save_invstd", x, 1, cs)))
        return NULL;
    dg = opt_farg(m, dgo, "dgamma", x, 1, cs, &err);
    db = err ? NULL : opt_farg(m, dbo, "dbeta", x, 1, cs, &err);
    if (err)
        return NULL;
    ptl_cuda_ctx *ctx = ctx_of(m, x);
    if (!ctx)
        return NULL;
    const int64_t c = cs[0], rows = c ? ptl_tensor_numel(x) / c : 0;
    RUN(ptl_batchnorm_backward_cuda(ctx, x->dtype, rows, (int)c, ptl_tensor_data(x), ptl_tensor_data(dy),
                                    ptl_tensor_data(g), ptl_tensor_data(b), ptl_tensor_data(sm), ptl_tensor_data(si),
                                    training, act, ptl_tensor_data(dx), data_or_null(dg), data_or_null(db)));
    Py_RETURN_NONE;
fail:
    return ptl_raise(m);
}

static PyObject *py_silu_forward(PyObject *m, PyObject *xo)
{
    PtlTensor *x = cuda_arg(m, xo, "x", NULL, -1, NULL), *y;
    ptl_cuda_ctx *ctx;
    if (!x || !(ctx = ctx_of(m, x)) || !(y = new_like(m, x, x->ndim, x->shape, x->dtype)))
        return NULL;
    RUN(ptl_silu_forward_cuda(ctx, x->dtype, ptl_tensor_numel(x), ptl_tensor_data(x), ptl_tensor_data(y)));
    return (PyObject *)y;
fail:
    Py_DECREF(y);
    return ptl_raise(m);
}

static PyObject *py_silu_backward(PyObject *m, PyObject *args)
{
    PyObject *xo, *dyo;
    if (!PyArg_ParseTuple(args, "OO:layer_cuda_silu_backward", &xo, &dyo))
        return NULL;
    PtlTensor *x = cuda_arg(m, xo, "x", NULL, -1, NULL), *dy, *dx;
    ptl_cuda_ctx *ctx;
    if (!x || !(dy = cuda_arg(m, dyo, "dy", x, x->ndim, x->shape)) || !(ctx = ctx_of(m, x)) ||
        !(dx = new_like(m, x, x->ndim, x->shape, x->dtype)))
        return NULL;
    RUN(ptl_silu_backward_cuda(ctx, x->dtype, ptl_tensor_numel(x), ptl_tensor_data(x), ptl_tensor_data(dy),
                               ptl_tensor_data(dx)));
    return (PyObject *)dx;
fail:
    Py_DECREF(dx);
    return ptl_raise(m);
}

/* ------------------------------------------------------------------ maxpool / upsample */

static PyObject *py_maxpool5_forward(PyObject *m, PyObject *xo)
{
    PtlTensor *x = cuda_arg(m, xo, "x", NULL, 4, NULL), *y;
    ptl_cuda_ctx *ctx;
    if (!x || !(ctx = ctx_of(m, x)) || !(y = new_like(m, x, 4, x->shape, x->dtype)))
        return NULL;
    RUN(ptl_maxpool5_forward_cuda(ctx, x->dtype, (int)x->shape[0], (int)x->shape[1], (int)x->shape[2],
                                  (int)x->shape[3], ptl_tensor_data(x), ptl_tensor_data(y)));
    return (PyObject *)y;
fail:
    Py_DECREF(y);
    return ptl_raise(m);
}

/* layer_cuda_maxpool5_backward(x, dy, dx, accumulate) */
static PyObject *py_maxpool5_backward(PyObject *m, PyObject *args)
{
    PyObject *xo, *dyo, *dxo;
    int acc;
    if (!PyArg_ParseTuple(args, "OOOp:layer_cuda_maxpool5_backward", &xo, &dyo, &dxo, &acc))
        return NULL;
    PtlTensor *x = cuda_arg(m, xo, "x", NULL, 4, NULL), *dy, *dx;
    ptl_cuda_ctx *ctx;
    if (!x || !(dy = cuda_arg(m, dyo, "dy", x, 4, x->shape)) || !(dx = cuda_arg(m, dxo, "dx", x, 4, x->shape)) ||
        !(ctx = ctx_of(m, x)))
        return NULL;
    RUN(ptl_maxpool5_backward_cuda(ctx, x->dtype, (int)x->shape[0], (int)x->shape[1], (int)x->shape[2],
                                   (int)x->shape[3], ptl_tensor_data(x), ptl_tensor_data(dy), ptl_tensor_data(dx),
                                   acc));
    Py_RETURN_NONE;
fail:
    return ptl_raise(m);
}

static PyObject *py_upsample2x_forward(PyObject *m, PyObject *xo)
{
    PtlTensor *x = cuda_arg(m, xo, "x", NULL, 4, NULL), *y;
    ptl_cuda_ctx *ctx;
    if (!x || !(ctx = ctx_of(m, x)))
        return NULL;
    const int64_t ys[4] = {x->shape[0], 2 * x->shape[1], 2 * x->shape[2], x->shape[3]};
    if (!(y = new_like(m, x, 4, ys, x->dtype)))
        return NULL;
    RUN(ptl_upsample2x_forward_cuda(ctx, x->dtype, (int)x->shape[0], (int)x->shape[1], (int)x->shape[2],
                                    (int)x->shape[3], ptl_tensor_data(x), ptl_tensor_data(y)));
    return (PyObject *)y;
fail:
    Py_DECREF(y);
    return ptl_raise(m);
}

/* layer_cuda_upsample2x_backward(dy, dx, accumulate) */
static PyObject *py_upsample2x_backward(PyObject *m, PyObject *args)
{
    PyObject *dyo, *dxo;
    int acc;
    if (!PyArg_ParseTuple(args, "OOp:layer_cuda_upsample2x_backward", &dyo, &dxo, &acc))
        return NULL;
    PtlTensor *dx = cuda_arg(m, dxo, "dx", NULL, 4, NULL), *dy;
    ptl_cuda_ctx *ctx;
    if (!dx)
        return NULL;
    const int64_t ys[4] = {dx->shape[0], 2 * dx->shape[1], 2 * dx->shape[2], dx->shape[3]};
    if (!(dy = cuda_arg(m, dyo, "dy", dx, 4, ys)) || !(ctx = ctx_of(m, dx)))
        return NULL;
    RUN(ptl_upsample2x_backward_cuda(ctx, dx->dtype, (int)dx->shape[0], (int)dx->shape[1], (int)dx->shape[2],
                                     (int)dx->shape[3], ptl_tensor_data(dy), ptl_tensor_data(dx), acc));
    Py_RETURN_NONE;
fail:
    return ptl_raise(m);
}

/* ------------------------------------------------------------------ channel copy */

/* layer_cuda_channel_copy(src, src_off, dst, dst_off, c, accumulate) */
static PyObject *py_channel_copy(PyObject *m, PyObject *args)
{
    PyObject *so, *dso;
    int soff, doff, c, acc;
    if (!PyArg_ParseTuple(args, "OiOiip:layer_cuda_channel_copy", &so, &soff, &dso, &doff, &c, &acc))
        return NULL;
    PtlTensor *s = cuda_arg(m, so, "src", NULL, -1, NULL), *d;
    ptl_cuda_ctx *ctx;
    if (!s || !(d = cuda_arg(m, dso, "dst", s, s->ndim, NULL)) || !(ctx = ctx_of(m, s)))
        return NULL;
    if (s->ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "src: expected at least 1 dimension (channels last)");
        return NULL;
    }
    for (int i = 0; i + 1 < s->ndim; i++)
        if (s->shape[i] != d->shape[i]) {
            PyErr_SetString(PyExc_ValueError, "dst: leading dimensions differ from src's");
            return NULL;
        }
    const int sc = (int)s->shape[s->ndim - 1], dc = (int)d->shape[d->ndim - 1];
    const int64_t rows = sc ? ptl_tensor_numel(s) / sc : 0;
    RUN(ptl_channel_copy_cuda(ctx, s->dtype, rows, c, ptl_tensor_data(s), sc, soff, ptl_tensor_data(d), dc, doff, acc));
    Py_RETURN_NONE;
fail:
    return ptl_raise(m);
}

/* ------------------------------------------------------------------ attention */

static int attn_sizes(PtlTensor *qkv, int heads, int kd, int hd)
{
    if (heads <= 0 || kd <= 0 || hd <= 0) {
        PyErr_Format(PyExc_ValueError, "heads, kd, hd: must be positive (got %d, %d, %d)", heads, kd, hd);
        return -1;
    }
    if (qkv->shape[3] != (int64_t)heads * (2 * kd + hd)) {
        PyErr_Format(PyExc_ValueError, "qkv: expected heads*(2*kd+hd) = %d channels, got %lld", heads * (2 * kd + hd),
                     (long long)qkv->shape[3]);
        return -1;
    }
    return 0;
}

/* layer_cuda_attention_forward(qkv, heads, kd, hd) -> (o, attn, v) */
static PyObject *py_attention_forward(PyObject *m, PyObject *args)
{
    PyObject *qo;
    int heads, kd, hd;
    if (!PyArg_ParseTuple(args, "Oiii:layer_cuda_attention_forward", &qo, &heads, &kd, &hd))
        return NULL;
    PtlTensor *q = cuda_arg(m, qo, "qkv", NULL, 4, NULL), *o = NULL, *at = NULL, *v = NULL;
    ptl_cuda_ctx *ctx;
    if (!q || attn_sizes(q, heads, kd, hd) || !(ctx = ctx_of(m, q)))
        return NULL;
    const int b = (int)q->shape[0], n = (int)(q->shape[1] * q->shape[2]);
    const int64_t os[4] = {b, q->shape[1], q->shape[2], (int64_t)heads * hd}, as[4] = {b, heads, n, n};
    if (!(o = new_like(m, q, 4, os, q->dtype)) || !(at = new_like(m, q, 4, as, q->dtype)) ||
        !(v = new_like(m, q, 4, os, q->dtype)))
        goto cleanup;
    RUN(ptl_attention_forward_cuda(ctx, q->dtype, b, n, heads, kd, hd, ptl_tensor_data(q), ptl_tensor_data(at),
                                   ptl_tensor_data(o), ptl_tensor_data(v)));
    return Py_BuildValue("(NNN)", o, at, v);
fail:
    ptl_raise(m);
cleanup:
    Py_XDECREF(o);
    Py_XDECREF(at);
    Py_XDECREF(v);
    return NULL;
}

/* layer_cuda_attention_backward(qkv, attn, d_o, dv|None, heads, kd, hd, dqkv): dqkv overwritten. */
static PyObject *py_attention_backward(PyObject *m, PyObject *args)
{
    PyObject *qo, *ao, *doo, *dvo, *dqo;
    int heads, kd, hd, err = 0;
    if (!PyArg_ParseTuple(args, "OOOOiiiO:layer_cuda_attention_backward", &qo, &ao, &doo, &dvo, &heads, &kd, &hd,
                          &dqo))
        return NULL;
    PtlTensor *q = cuda_arg(m, qo, "qkv", NULL, 4, NULL), *at, *d_o, *dv, *dq;
    ptl_cuda_ctx *ctx;
    if (!q || attn_sizes(q, heads, kd, hd))
        return NULL;
    const int b = (int)q->shape[0], n = (int)(q->shape[1] * q->shape[2]);
    const int64_t os[4] = {b, q->shape[1], q->shape[2], (int64_t)heads * hd}, as[4] = {b, heads, n, n};
    if (!(at = cuda_arg(m, ao, "attn", q, 4, as)) || !(d_o = cuda_arg(m, doo, "d_o", q, 4, os)) ||
        !(dq = cuda_arg(m, dqo, "dqkv", q, 4, q->shape)))
        return NULL;
    dv = opt_cuda_arg(m, dvo, "dv", q, 4, os, &err);
    if (err || !(ctx = ctx_of(m, q)))
        return NULL;
    RUN(ptl_attention_backward_cuda(ctx, q->dtype, b, n, heads, kd, hd, ptl_tensor_data(q), ptl_tensor_data(at),
                                    ptl_tensor_data(d_o), data_or_null(dv), ptl_tensor_data(dq)));
    Py_RETURN_NONE;
fail:
    return ptl_raise(m);
}

/* ------------------------------------------------------------------ elementwise */

static PyObject *py_add(PyObject *m, PyObject *args)
{
    PyObject *ao, *bo;
    if (!PyArg_ParseTuple(args, "OO:layer_cuda_add", &ao, &bo))
        return NULL;
    PtlTensor *a = cuda_arg(m, ao, "a", NULL, -1, NULL), *b, *y;
    ptl_cuda_ctx *ctx;
    if (!a || !(b = cuda_arg(m, bo, "b", a, a->ndim, a->shape)) || !(ctx = ctx_of(m, a)) ||
        !(y = new_like(m, a, a->ndim, a->shape, a->dtype)))
        return NULL;
    RUN(ptl_add_cuda(ctx, a->dtype, ptl_tensor_numel(a), ptl_tensor_data(a), ptl_tensor_data(b), ptl_tensor_data(y)));
    return (PyObject *)y;
fail:
    Py_DECREF(y);
    return ptl_raise(m);
}

/* layer_cuda_accumulate(x, y): y += x. */
static PyObject *py_accumulate(PyObject *m, PyObject *args)
{
    PyObject *xo, *yo;
    if (!PyArg_ParseTuple(args, "OO:layer_cuda_accumulate", &xo, &yo))
        return NULL;
    PtlTensor *x = cuda_arg(m, xo, "x", NULL, -1, NULL), *y;
    ptl_cuda_ctx *ctx;
    if (!x || !(y = cuda_arg(m, yo, "y", x, x->ndim, x->shape)) || !(ctx = ctx_of(m, x)))
        return NULL;
    RUN(ptl_accumulate_cuda(ctx, x->dtype, ptl_tensor_numel(x), ptl_tensor_data(x), ptl_tensor_data(y)));
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
    {"layer_cuda_batchnorm_forward", py_batchnorm_forward, METH_VARARGS,
     "(x, gamma, beta, running_mean, running_var, training, act) -> (y, save_mean, save_invstd)"},
    {"layer_cuda_batchnorm_backward", py_batchnorm_backward, METH_VARARGS,
     "(x, dy, gamma, beta, save_mean, save_invstd, training, act, dx, dgamma|None, dbeta|None)"},
    {"layer_cuda_silu_forward", py_silu_forward, METH_O, "(x) -> silu(x)"},
    {"layer_cuda_silu_backward", py_silu_backward, METH_VARARGS, "(x, dy) -> dx"},
    {"layer_cuda_maxpool5_forward", py_maxpool5_forward, METH_O, "(x) -> y"},
    {"layer_cuda_maxpool5_backward", py_maxpool5_backward, METH_VARARGS, "(x, dy, dx, accumulate)"},
    {"layer_cuda_upsample2x_forward", py_upsample2x_forward, METH_O, "(x) -> y"},
    {"layer_cuda_upsample2x_backward", py_upsample2x_backward, METH_VARARGS, "(dy, dx, accumulate)"},
    {"layer_cuda_channel_copy", py_channel_copy, METH_VARARGS, "(src, src_off, dst, dst_off, c, accumulate)"},
    {"layer_cuda_attention_forward", py_attention_forward, METH_VARARGS, "(qkv, heads, kd, hd) -> (o, attn, v)"},
    {"layer_cuda_attention_backward", py_attention_backward, METH_VARARGS,
     "(qkv, attn, d_o, dv|None, heads, kd, hd, dqkv)"},
    {"layer_cuda_add", py_add, METH_VARARGS, "(a, b) -> a + b"},
    {"layer_cuda_accumulate", py_accumulate, METH_VARARGS, "(x, y); y += x"},
    {"layer_cuda_reserve_scratch", py_reserve_scratch, METH_VARARGS, "(device_index, bytes)"},
    {"layer_cuda_conv2d_plan_cache", py_conv2d_plan_cache, METH_VARARGS, "(device_index) -> (held, made)"},
    {NULL, NULL, 0, NULL},
};

int ptl_register_layers_cuda(PyObject *module) { return PyModule_AddFunctions(module, methods); }
