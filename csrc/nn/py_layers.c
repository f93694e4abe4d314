/* Python bindings of the layer kernels, for tests and benchmarks: ptl._C.layer_* functions. Each runs on
 * the device of its first tensor through the executor's backend table (executor.h): on the CPU the table
 * that cpu_kernels names, as executor_create's does (the reference kernels, float32 and float64, by
 * default; 'fast': the oneDNN-backed float32 kernels, ../cpu/backend_cpu_fast.h), on CUDA the CUDA
 * kernels (float32, bfloat16, float16; BatchNorm parameters and statistics float32 there). A
 * convolution runs through a plan of that backend (layer_conv2d_plan; the fast backend's from
 * ../cpu/py_cpu.c's cpu_conv2d_plan), as the executor runs it; the CUDA-only questions about a plan are
 * ../cuda/py_conv2d_cuda.c's. Forwards return their outputs, written into the tensors given for them or
 * into new ones (so a benchmark can time the kernel alone, and a test can prove every element written);
 * backwards write into the gradient tensors they are given (activation gradients overwritten, parameter
 * gradients accumulated, as the C functions do). */
#include <stdlib.h>
#include <string.h>

#include "../cpu/activation.h"
#include "../cpu/backend_cpu_fast.h"
#include "../py.h"
#include "activation.h"
#include "attention.h"
#include "batchnorm.h"
#include "concat.h"
#include "conv2d.h"
#include "elementwise.h"
#include "executor.h"
#include "maxpool.h"
#include "py_layers.h"
#include "upsample.h"

static const ptl_device CPU = {PTL_CPU, 0};

static int act_dtype_ok(ptl_device dev, ptl_dtype dt)
{
    return dev.type == PTL_CPU ? dt == PTL_FLOAT32 || dt == PTL_FLOAT64
                               : dt == PTL_FLOAT32 || dt == PTL_BFLOAT16 || dt == PTL_FLOAT16;
}

/* An activation tensor. like (may be NULL) fixes device and dtype; without it any device, with the dtypes
 * its kernels take. */
static PtlTensor *arg(PyObject *m, PyObject *obj, const char *name, PtlTensor *like, int ndim, const int64_t *shape)
{
    PtlTensor *t = ptl_tensor_arg(m, obj, name, like ? (int)like->dtype : -1, like ? &like->storage->device : NULL,
                                  ndim, shape);
    if (t && !like && !act_dtype_ok(t->storage->device, t->dtype)) {
        PyErr_Format(PyExc_TypeError, "%s: expected dtype %s, got %s", name,
                     t->storage->device.type == PTL_CPU ? "float32 or float64" : "float32, bfloat16 or float16",
                     ptl_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

static PtlTensor *opt_arg(PyObject *m, PyObject *obj, const char *name, PtlTensor *like, int ndim,
                          const int64_t *shape, int *err)
{
    if (obj == Py_None)
        return NULL;
    PtlTensor *t = arg(m, obj, name, like, ndim, shape);
    if (!t)
        *err = 1;
    return t;
}

/* An output, a new reference: obj (NULL or None: a new tensor) on like's device, of dtype dt and this shape. */
static PtlTensor *out_arg(PyObject *m, PyObject *obj, const char *name, PtlTensor *like, int ndim,
                          const int64_t *shape, ptl_dtype dt)
{
    if (!obj || obj == Py_None)
        return ptl_tensor_empty(m, ndim, shape, dt, like->storage->device);
    PtlTensor *t = ptl_tensor_arg(m, obj, name, (int)dt, &like->storage->device, ndim, shape);
    Py_XINCREF(t);
    return t;
}

/* BatchNorm parameters and statistics: x's dtype on the CPU, float32 on CUDA, on x's device. */
static ptl_dtype par_dtype(PtlTensor *x) { return x->storage->device.type == PTL_CPU ? x->dtype : PTL_FLOAT32; }

static PtlTensor *par(PyObject *m, PyObject *obj, const char *name, PtlTensor *x, const int64_t *shape)
{
    return ptl_tensor_arg(m, obj, name, (int)par_dtype(x), &x->storage->device, 1, shape);
}

static PtlTensor *opt_par(PyObject *m, PyObject *obj, const char *name, PtlTensor *x, const int64_t *shape, int *err)
{
    if (obj == Py_None)
        return NULL;
    PtlTensor *t = par(m, obj, name, x, shape);
    if (!t)
        *err = 1;
    return t;
}

/* A CPU tensor of the CPU kernels' dtypes (the CPU-only bindings: convolutions, concat). */
static PtlTensor *cpu_arg(PyObject *m, PyObject *obj, const char *name, int dt, int ndim, const int64_t *shape)
{
    PtlTensor *t = ptl_tensor_arg(m, obj, name, dt, &CPU, ndim, shape);
    if (t && !act_dtype_ok(CPU, t->dtype)) {
        PyErr_Format(PyExc_TypeError, "%s: expected dtype float32 or float64, got %s", name,
                     ptl_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

/* The kernels of t's device and its execution context. */
typedef struct {
    const ptl_net_backend *be;
    struct ptl_cuda_ctx *ctx;
} kernels;

/* cpu_kernels: the name of a CPU table (ptl_net_cpu_backend_choose's; NULL: the reference). */
static int kernels_of(PyObject *m, PtlTensor *t, const char *cpu_kernels, kernels *k)
{
    const ptl_device dev = t->storage->device;
    if (dev.type != PTL_CPU && cpu_kernels) {
        PyErr_Format(PyExc_ValueError, "cpu_kernels: for CPU tensors only (got a tensor on cuda:%d)", dev.index);
        return -1;
    }
    if (ptl_py_exec_ctx(m, dev, &k->ctx) < 0)
        return -1;
#ifdef PTL_WITH_CUDA
    if (dev.type != PTL_CPU) {
        k->be = &ptl_net_backend_cuda;
        return 0;
    }
#endif
    return ptl_net_cpu_backend_choose(cpu_kernels ? cpu_kernels : "reference", t->dtype, &k->be) ? ptl_raise_int(m)
                                                                                                 : 0;
}

static void *data_or_null(PtlTensor *t) { return t ? ptl_tensor_data(t) : NULL; }

/* Runs a kernel without the GIL; on failure raises its error and goes to the function's `fail`. */
#define RUN(call)                                                                                            \
    do {                                                                                                     \
        int rc_;                                                                                             \
        Py_BEGIN_ALLOW_THREADS rc_ = (call);                                                                 \
        Py_END_ALLOW_THREADS if (rc_ != 0) {                                                                 \
            ptl_raise(m);                                                                                    \
            goto fail;                                                                                       \
        }                                                                                                    \
    } while (0)

/* Keyword-taking bindings' entries of the method table. */
#define KEYWORDS(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

/* ------------------------------------------------------------------ conv2d */

static int conv_desc(PyObject *m, PtlTensor *x, PtlTensor *w, int stride, int groups, ptl_conv2d_desc *d)
{
    if (w->shape[1] != w->shape[2]) {
        PyErr_Format(PyExc_ValueError, "w: expected a square kernel (cout, k, k, cin/groups), got %lldx%lld",
                     (long long)w->shape[1], (long long)w->shape[2]);
        return -1;
    }
    if (groups <= 0 || x->shape[3] % groups || w->shape[3] * groups != x->shape[3]) {
        PyErr_Format(PyExc_ValueError, "w: expected %lld/groups input channels (groups=%d), got %lld",
                     (long long)x->shape[3], groups, (long long)w->shape[3]);
        return -1;
    }
    if (ptl_conv2d_init(d, (int)x->shape[0], (int)x->shape[1], (int)x->shape[2], (int)x->shape[3],
                        (int)w->shape[0], (int)w->shape[1], stride, groups)) {
        ptl_raise(m);
        return -1;
    }
    return 0;
}

#define PLAN_CAPSULE "ptl._C.conv2d_plan"

static void plan_capsule_free(PyObject *cap)
{
    ptl_py_conv_plan *p = PyCapsule_GetPointer(cap, PLAN_CAPSULE);
    p->be->conv_plan_free(p->plan);
    free(p->ws);
    free(p);
}

ptl_py_conv_plan *ptl_py_conv_plan_arg(PyObject *obj)
{
    if (!PyCapsule_IsValid(obj, PLAN_CAPSULE)) {
        PyErr_SetString(PyExc_TypeError, "plan: expected a plan from layer_conv2d_plan or cpu_conv2d_plan");
        return NULL;
    }
    return PyCapsule_GetPointer(obj, PLAN_CAPSULE);
}

PyObject *ptl_py_conv_plan_new(const ptl_py_conv_plan *plan)
{
    ptl_py_conv_plan *p = malloc(sizeof *p);
    PyObject *cap;
    if (!p) {
        PyErr_NoMemory();
        goto fail;
    }
    *p = *plan;
    /* A CPU plan holds the workspace of its backend (the fast one's weight reorders and oneDNN scratchpad;
     * the reference asks for none), as the executor holds it; CUDA calls are handed theirs. */
    p->ws_bytes = p->device.type == PTL_CPU ? p->be->conv_workspace(p->plan, PTL_CONV_WS_ALL) : 0;
    p->ws = NULL;
    if (p->ws_bytes && !(p->ws = malloc(p->ws_bytes))) {
        PyErr_NoMemory();
        goto fail;
    }
    if ((cap = PyCapsule_New(p, PLAN_CAPSULE, plan_capsule_free)))
        return cap;
fail:
    plan->be->conv_plan_free(plan->plan);
    if (p)
        free(p->ws);
    free(p);
    return NULL;
}

/* layer_conv2d_plan(x, w, stride, groups, deterministic=True, allow_tf32=False, find=False, forward_only=False)
 * -> the plan of x's device's backend for x's shape and dtype and w (cout, k, k, cin/groups). The options
 * choose CUDA's algorithms (the CPU reference has one); CUDA plans come from the device's plan cache. */
static PyObject *py_conv2d_plan(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"x", "w", "stride", "groups", "deterministic", "allow_tf32", "find", "forward_only", NULL};
    PyObject *xo, *wo;
    int stride, groups;
    ptl_net_conv_opts o = {.deterministic = 1};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOii|pppp:layer_conv2d_plan", kw, &xo, &wo, &stride, &groups,
                                     &o.deterministic, &o.allow_tf32, &o.find, &o.forward_only))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", NULL, 4, NULL), *w;
    ptl_conv2d_desc d;
    kernels k;
    if (!x || !(w = arg(m, wo, "w", x, 4, NULL)) || conv_desc(m, x, w, stride, groups, &d) ||
        kernels_of(m, x, NULL, &k))
        return NULL;
    ptl_py_conv_plan p = {.be = k.be, .ctx = k.ctx, .device = x->storage->device, .dt = x->dtype, .d = d};
    const uint8_t bias = 1; /* a forward may be given one */
    RUN(k.be->conv_plans(k.ctx, 1, &d, x->dtype, &o, &bias, &p.plan));
    return ptl_py_conv_plan_new(&p);
fail:
    return NULL;
}

enum { CONV_X, CONV_Y, CONV_W, CONV_B };

/* A tensor of the plan: on its device, in its dtype, of the shape of its role (x, y, w or bias). */
static PtlTensor *plan_tensor(PyObject *m, const ptl_py_conv_plan *p, PyObject *obj, const char *name, int role)
{
    const ptl_conv2d_desc *d = &p->d;
    const int64_t cig = d->cin / d->groups, oihw = p->weights_oihw;
    const int64_t shapes[4][4] = {{d->n, d->h, d->w, d->cin},
                                  {d->n, d->ho, d->wo, d->cout},
                                  {d->cout, oihw ? cig : d->k, d->k, oihw ? d->k : cig},
                                  {d->cout}};
    PtlTensor *t = ptl_tensor_arg(m, obj, name, -1, &p->device, role == CONV_B ? 1 : 4, shapes[role]);
    if (t && t->dtype != p->dt) {
        PyErr_Format(PyExc_TypeError, "plan: made for dtype %s, %s is %s", ptl_dtype_name(p->dt), name,
                     ptl_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

/* A call's plan, its tensors by role (None given as NULL where the role is in `optional`, a bit mask), and
 * the workspace (a tensor of any dtype on the plan's device; None: the plan's own, if any). -1 after
 * raising. */
typedef struct {
    const ptl_py_conv_plan *p;
    PtlTensor *t[4];
    void *ws;
    size_t ws_bytes;
} conv_call;

static int conv_call_args(PyObject *m, PyObject *po, PyObject *const *objs, const char *const *names,
                          const int *roles, int n, unsigned optional, PyObject *wso, conv_call *c)
{
    if (!(c->p = ptl_py_conv_plan_arg(po)))
        return -1;
    for (int i = 0; i < n; i++) {
        c->t[i] = NULL;
        if (objs[i] == Py_None && (optional >> i & 1))
            continue;
        if (!(c->t[i] = plan_tensor(m, c->p, objs[i], names[i], roles[i])))
            return -1;
    }
    c->ws = c->p->ws;
    c->ws_bytes = c->p->ws_bytes;
    if (wso != Py_None) {
        PtlTensor *ws = ptl_tensor_arg(m, wso, "workspace", -1, &c->p->device, -1, NULL);
        if (!ws)
            return -1;
        c->ws = ptl_tensor_data(ws);
        c->ws_bytes = ptl_tensor_nbytes(ws);
    }
    return 0;
}

#define D(i) data_or_null(c.t[i])

/* layer_conv2d_forward(plan, x, w, bias|None, y=None, workspace=None) -> y: y = conv(x, w) (+ bias), into
 * y when given, else into a new tensor. */
static PyObject *py_conv2d_forward(PyObject *m, PyObject *args)
{
    PyObject *o[4], *po, *wso = Py_None;
    o[3] = Py_None;
    conv_call c;
    if (!PyArg_ParseTuple(args, "OOOO|OO:layer_conv2d_forward", &po, &o[0], &o[1], &o[2], &o[3], &wso) ||
        conv_call_args(m, po, o, (const char *[]){"x", "w", "bias", "y"}, (const int[]){CONV_X, CONV_W, CONV_B, CONV_Y},
                       4, 0xc, wso, &c))
        return NULL;
    const ptl_conv2d_desc *d = &c.p->d;
    const int64_t ys[4] = {d->n, d->ho, d->wo, d->cout};
    PtlTensor *y = c.t[3];
    if (y)
        Py_INCREF(y);
    else if (!(y = ptl_tensor_empty(m, 4, ys, c.p->dt, c.p->device)))
        return NULL;
    RUN(c.p->be->conv_forward(c.p->ctx, c.p->plan, D(0), D(1), D(2), ptl_tensor_data(y), c.ws, c.ws_bytes));
    return (PyObject *)y;
fail:
    Py_DECREF(y);
    return NULL;
}

/* layer_conv2d_backward_input(plan, dy, w, dx, workspace=None, add=False): dx = dL/dx, or with add dx +=
 * dL/dx as the executor adds it for an input with several consumers. On the CPU a workspace of w's size takes
 * the reference's transposed-weight path (groups 1). */
static PyObject *py_conv2d_backward_input(PyObject *m, PyObject *args)
{
    PyObject *o[3], *po, *wso = Py_None;
    int add = 0;
    conv_call c;
    PtlTensor *scratch = NULL;
    if (!PyArg_ParseTuple(args, "OOOO|Op:layer_conv2d_backward_input", &po, &o[0], &o[1], &o[2], &wso, &add) ||
        conv_call_args(m, po, o, (const char *[]){"dy", "w", "dx"}, (const int[]){CONV_Y, CONV_W, CONV_X}, 3, 0, wso,
                       &c))
        return NULL;
    const ptl_net_backend *be = c.p->be;
    if (!add) {
        RUN(be->conv_backward_input(c.p->ctx, c.p->plan, D(0), D(1), D(2), c.ws, c.ws_bytes));
        Py_RETURN_NONE;
    }
    if (!(scratch = ptl_tensor_empty(m, 4, c.t[2]->shape, c.p->dt, c.p->device)))
        return NULL;
    RUN(ptl_net_conv_backward_input_add(be, c.p->ctx, c.p->plan, c.p->dt, ptl_tensor_numel(scratch), D(0), D(1),
                                        D(2), ptl_tensor_data(scratch), c.ws, c.ws_bytes));
    Py_DECREF(scratch);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(scratch);
    return NULL;
}

/* layer_conv2d_backward_weight(plan, x, dy, dw, workspace=None): dw += dL/dw. */
static PyObject *py_conv2d_backward_weight(PyObject *m, PyObject *args)
{
    PyObject *o[3], *po, *wso = Py_None;
    conv_call c;
    if (!PyArg_ParseTuple(args, "OOOO|O:layer_conv2d_backward_weight", &po, &o[0], &o[1], &o[2], &wso) ||
        conv_call_args(m, po, o, (const char *[]){"x", "dy", "dw"}, (const int[]){CONV_X, CONV_Y, CONV_W}, 3, 0, wso,
                       &c))
        return NULL;
    RUN(c.p->be->conv_backward_weight(c.p->ctx, c.p->plan, D(0), D(1), D(2), c.ws, c.ws_bytes));
    Py_RETURN_NONE;
fail:
    return NULL;
}

/* layer_conv2d_backward_bias(plan, dy, db, workspace=None): db += sum of dy over (n, ho, wo). */
static PyObject *py_conv2d_backward_bias(PyObject *m, PyObject *args)
{
    PyObject *o[2], *po, *wso = Py_None;
    conv_call c;
    if (!PyArg_ParseTuple(args, "OOO|O:layer_conv2d_backward_bias", &po, &o[0], &o[1], &wso) ||
        conv_call_args(m, po, o, (const char *[]){"dy", "db"}, (const int[]){CONV_Y, CONV_B}, 2, 0, wso, &c))
        return NULL;
    RUN(c.p->be->conv_backward_bias(c.p->ctx, c.p->plan, D(0), D(1), c.ws, c.ws_bytes));
    Py_RETURN_NONE;
fail:
    return NULL;
}

#undef D

/* layer_conv2d_weight_layout(w, to_ohwi): OIHW (cout, cin_g, k, k) <-> OHWI (cout, k, k, cin_g). */
static PyObject *py_conv2d_weight_layout(PyObject *m, PyObject *args)
{
    PyObject *wo;
    int to_ohwi;
    if (!PyArg_ParseTuple(args, "Op:layer_conv2d_weight_layout", &wo, &to_ohwi))
        return NULL;
    PtlTensor *w = cpu_arg(m, wo, "w", -1, 4, NULL), *out;
    if (!w)
        return NULL;
    const int cout = (int)w->shape[0];
    const int cig = (int)(to_ohwi ? w->shape[1] : w->shape[3]), k = (int)(to_ohwi ? w->shape[2] : w->shape[1]);
    const int64_t os[4] = {cout, to_ohwi ? k : cig, k, to_ohwi ? cig : k};
    if (!(out = ptl_tensor_empty(m, 4, os, w->dtype, CPU)))
        return NULL;
    RUN(to_ohwi ? ptl_conv2d_weight_from_oihw(w->dtype, cout, cig, k, ptl_tensor_data(w), ptl_tensor_data(out))
                : ptl_conv2d_weight_to_oihw(w->dtype, cout, cig, k, ptl_tensor_data(w), ptl_tensor_data(out)));
    return (PyObject *)out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* ------------------------------------------------------------------ batchnorm / silu */

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

/* layer_batchnorm_forward(x, gamma, beta, running_mean, running_var, training, act, y=None, save_mean=None,
 * save_invstd=None, *, cpu_kernels=None) -> (y, save_mean, save_invstd); x is (..., c); the running
 * statistics are updated in training. */
static PyObject *py_batchnorm_forward(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"x", "gamma", "beta", "running_mean", "running_var", "training", "act", "y", "save_mean",
                         "save_invstd", "cpu_kernels", NULL};
    PyObject *xo, *go, *bo, *rmo, *rvo, *acto, *yo = NULL, *smo = NULL, *sio = NULL;
    const char *kn = NULL;
    int training;
    ptl_act act;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOpO|OOO$z:layer_batchnorm_forward", kw, &xo, &go, &bo, &rmo,
                                     &rvo, &training, &acto, &yo, &smo, &sio, &kn) ||
        parse_act(acto, &act))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", NULL, -1, NULL), *g, *b, *rm, *rv, *y = NULL, *sm = NULL, *si = NULL;
    if (!x)
        return NULL;
    if (x->ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "x: expected at least 1 dimension (channels last)");
        return NULL;
    }
    const int64_t cs[1] = {x->shape[x->ndim - 1]};
    if (!(g = par(m, go, "gamma", x, cs)) || !(b = par(m, bo, "beta", x, cs)) ||
        !(rm = par(m, rmo, "running_mean", x, cs)) || !(rv = par(m, rvo, "running_var", x, cs)) ||
        kernels_of(m, x, kn, &k))
        return NULL;
    if (!(y = out_arg(m, yo, "y", x, x->ndim, x->shape, x->dtype)) ||
        !(sm = out_arg(m, smo, "save_mean", x, 1, cs, par_dtype(x))) ||
        !(si = out_arg(m, sio, "save_invstd", x, 1, cs, par_dtype(x))))
        goto fail;
    const int64_t c = cs[0], rows = c ? ptl_tensor_numel(x) / c : 0;
    RUN(k.be->batchnorm_forward(k.ctx, x->dtype, rows, (int)c, ptl_tensor_data(x), ptl_tensor_data(g),
                                ptl_tensor_data(b), ptl_tensor_data(rm), ptl_tensor_data(rv), training, act,
                                ptl_tensor_data(sm), ptl_tensor_data(si), ptl_tensor_data(y), (int)c));
    return Py_BuildValue("(NNN)", y, sm, si);
fail:
    Py_XDECREF(y);
    Py_XDECREF(sm);
    Py_XDECREF(si);
    return NULL;
}

/* layer_conv2d_batchnorm_forward(plan, x, w, gamma, beta, running_mean, running_var, act, workspace=None)
 * -> (z, y, save_mean, save_invstd): z = conv(x, w), then y = BatchNorm(z) in training mode, as the network's
 * Conv layers run them (on CUDA fused with PTL_CONV_BN=1 where the plan allows it: ../cuda/conv2d_bn.h). */
static PyObject *py_conv2d_batchnorm_forward(PyObject *m, PyObject *args)
{
    PyObject *o[2], *po, *go, *bo, *rmo, *rvo, *acto, *wso = Py_None;
    conv_call c;
    ptl_act act;
    if (!PyArg_ParseTuple(args, "OOOOOOOO|O:layer_conv2d_batchnorm_forward", &po, &o[0], &o[1], &go, &bo, &rmo,
                          &rvo, &acto, &wso) ||
        parse_act(acto, &act) ||
        conv_call_args(m, po, o, (const char *[]){"x", "w"}, (const int[]){CONV_X, CONV_W}, 2, 0, wso, &c))
        return NULL;
    const ptl_conv2d_desc *d = &c.p->d;
    const int64_t ys[4] = {d->n, d->ho, d->wo, d->cout}, cs[1] = {d->cout};
    PtlTensor *x = c.t[0], *g, *b, *rm, *rv, *z = NULL, *y = NULL, *sm = NULL, *si = NULL;
    if (!(g = par(m, go, "gamma", x, cs)) || !(b = par(m, bo, "beta", x, cs)) ||
        !(rm = par(m, rmo, "running_mean", x, cs)) || !(rv = par(m, rvo, "running_var", x, cs)))
        return NULL;
    if (!(z = out_arg(m, NULL, "z", x, 4, ys, x->dtype)) || !(y = out_arg(m, NULL, "y", x, 4, ys, x->dtype)) ||
        !(sm = out_arg(m, NULL, "save_mean", x, 1, cs, par_dtype(x))) ||
        !(si = out_arg(m, NULL, "save_invstd", x, 1, cs, par_dtype(x))))
        goto fail;
    RUN(ptl_net_conv_batchnorm_forward(c.p->be, c.p->ctx, c.p->plan, c.p->dt, ys[0] * ys[1] * ys[2], d->cout,
                                       ptl_tensor_data(x), ptl_tensor_data(c.t[1]), ptl_tensor_data(z), c.ws,
                                       c.ws_bytes, ptl_tensor_data(g), ptl_tensor_data(b), ptl_tensor_data(rm),
                                       ptl_tensor_data(rv), act, ptl_tensor_data(sm), ptl_tensor_data(si),
                                       ptl_tensor_data(y), d->cout));
    return Py_BuildValue("(NNNN)", z, y, sm, si);
fail:
    Py_XDECREF(z);
    Py_XDECREF(y);
    Py_XDECREF(sm);
    Py_XDECREF(si);
    return NULL;
}

/* layer_batchnorm_backward(x, dy, gamma, beta, save_mean, save_invstd, training, act, dx, dgamma, dbeta, *,
 * cpu_kernels=None): dx overwritten (may be dy itself); dgamma/dbeta (or None) accumulated. */
static PyObject *py_batchnorm_backward(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"x",   "dy", "gamma",  "beta",  "save_mean",   "save_invstd", "training",
                         "act", "dx", "dgamma", "dbeta", "cpu_kernels", NULL};
    PyObject *xo, *dyo, *go, *bo, *smo, *sio, *acto, *dxo, *dgo, *dbo;
    const char *kn = NULL;
    int training, err = 0;
    ptl_act act;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOpOOOO|$z:layer_batchnorm_backward", kw, &xo, &dyo, &go, &bo,
                                     &smo, &sio, &training, &acto, &dxo, &dgo, &dbo, &kn) ||
        parse_act(acto, &act))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", NULL, -1, NULL), *dy, *g, *b, *sm, *si, *dx, *dg, *db;
    if (!x)
        return NULL;
    if (x->ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "x: expected at least 1 dimension (channels last)");
        return NULL;
    }
    const int64_t cs[1] = {x->shape[x->ndim - 1]};
    if (!(dy = arg(m, dyo, "dy", x, x->ndim, x->shape)) || !(dx = arg(m, dxo, "dx", x, x->ndim, x->shape)) ||
        !(g = par(m, go, "gamma", x, cs)) || !(b = par(m, bo, "beta", x, cs)) ||
        !(sm = par(m, smo, "save_mean", x, cs)) || !(si = par(m, sio, "save_invstd", x, cs)))
        return NULL;
    dg = opt_par(m, dgo, "dgamma", x, cs, &err);
    db = err ? NULL : opt_par(m, dbo, "dbeta", x, cs, &err);
    if (err || kernels_of(m, x, kn, &k))
        return NULL;
    const int64_t c = cs[0], rows = c ? ptl_tensor_numel(x) / c : 0;
    RUN(k.be->batchnorm_backward(k.ctx, x->dtype, rows, (int)c, ptl_tensor_data(x), ptl_tensor_data(dy), (int)c,
                                 ptl_tensor_data(g), ptl_tensor_data(b), ptl_tensor_data(sm), ptl_tensor_data(si),
                                 training, act, ptl_tensor_data(dx), data_or_null(dg), data_or_null(db)));
    Py_RETURN_NONE;
fail:
    return NULL;
}

/* SiLU alone (the network fuses it into BatchNorm): not a backend-table entry, so each table's kernel by name. */
static int silu(kernels *k, int backward, ptl_dtype dt, int64_t n, const void *x, const void *dy, void *out)
{
#ifdef PTL_WITH_CUDA
    if (k->ctx)
        return backward ? ptl_silu_backward_cuda(k->ctx, dt, n, x, dy, out) : ptl_silu_forward_cuda(k->ctx, dt, n, x, out);
#endif
    if (k->be == ptl_net_backend_cpu_fast())
        return backward ? ptl_cpu_silu_backward(n, x, dy, out) : ptl_cpu_silu_forward(n, x, out);
    return backward ? ptl_silu_backward(dt, n, x, dy, out) : ptl_silu_forward(dt, n, x, out);
}

/* layer_silu_forward(x, y=None, *, cpu_kernels=None) -> y */
static PyObject *py_silu_forward(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"x", "y", "cpu_kernels", NULL};
    PyObject *xo, *yo = NULL;
    const char *kn = NULL;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$z:layer_silu_forward", kw, &xo, &yo, &kn))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", NULL, -1, NULL), *y;
    if (!x || kernels_of(m, x, kn, &k) || !(y = out_arg(m, yo, "y", x, x->ndim, x->shape, x->dtype)))
        return NULL;
    RUN(silu(&k, 0, x->dtype, ptl_tensor_numel(x), ptl_tensor_data(x), NULL, ptl_tensor_data(y)));
    return (PyObject *)y;
fail:
    Py_DECREF(y);
    return NULL;
}

/* layer_silu_backward(x, dy, dx=None, *, cpu_kernels=None) -> dx */
static PyObject *py_silu_backward(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"x", "dy", "dx", "cpu_kernels", NULL};
    PyObject *xo, *dyo, *dxo = NULL;
    const char *kn = NULL;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O$z:layer_silu_backward", kw, &xo, &dyo, &dxo, &kn))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", NULL, -1, NULL), *dy, *dx;
    if (!x || !(dy = arg(m, dyo, "dy", x, x->ndim, x->shape)) || kernels_of(m, x, kn, &k) ||
        !(dx = out_arg(m, dxo, "dx", x, x->ndim, x->shape, x->dtype)))
        return NULL;
    RUN(silu(&k, 1, x->dtype, ptl_tensor_numel(x), ptl_tensor_data(x), ptl_tensor_data(dy), ptl_tensor_data(dx)));
    return (PyObject *)dx;
fail:
    Py_DECREF(dx);
    return NULL;
}

/* ------------------------------------------------------------------ maxpool / upsample */

/* A value of a layer call: an (n, h, w, c) tensor's memory t_data and its gradient's. */
static ptl_net_arg nhwc_arg(PtlTensor *t, void *t_data, void *grad)
{
    const int c = (int)t->shape[3];
    return (ptl_net_arg){t_data, grad, (int)t->shape[1], (int)t->shape[2], c, 0, c, 0};
}

/* The backend table's layer call (executor.h) of op on the (n, h, w, c) input `in`, as the executor makes it:
 * x its activation, dx its gradient (written, or added with accumulate); the caller adds the outputs. */
static ptl_net_call layer_call(const kernels *k, const ptl_net_op *op, PtlTensor *in, void *x, void *dx,
                               int accumulate)
{
    ptl_net_call c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.be = k->be;
    c.dt = in->dtype;
    c.B = (int)in->shape[0];
    c.nin = 1;
    c.in[0] = nhwc_arg(in, x, dx);
    c.in[0].accumulate = accumulate;
    return c;
}

/* The uint8 tensor of x's shape on its device where a CUDA forward keeps (and a backward reads) the argmaxes:
 * NULL for None; *err set on a bad one. The CPU kernels find the argmaxes again in their backward. */
static PtlTensor *argmax_arg(PyObject *m, PyObject *obj, PtlTensor *x, int *err)
{
    if (!obj || obj == Py_None)
        return NULL;
    if (x->storage->device.type == PTL_CPU) {
        PyErr_SetString(PyExc_ValueError, "argmax: kept by the CUDA kernels only (the CPU's backward finds them)");
        *err = 1;
        return NULL;
    }
    PtlTensor *t = ptl_tensor_arg(m, obj, "argmax", PTL_UINT8, &x->storage->device, 4, x->shape);
    *err = !t;
    return t;
}

/* layer_maxpool5_forward(x, y=None, *, argmax=None, cpu_kernels=None) -> y */
static PyObject *py_maxpool5_forward(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"x", "y", "argmax", "cpu_kernels", NULL};
    PyObject *xo, *yo = NULL, *ao = NULL;
    const char *kn = NULL;
    int err = 0;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$Oz:layer_maxpool5_forward", kw, &xo, &yo, &ao, &kn))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", NULL, 4, NULL), *y;
    if (!x || kernels_of(m, x, kn, &k))
        return NULL;
    PtlTensor *am = argmax_arg(m, ao, x, &err);
    if (err || !(y = out_arg(m, yo, "y", x, 4, x->shape, x->dtype)))
        return NULL;
    const ptl_net_op op = {.kind = PTL_OP_POOL};
    ptl_net_call c = layer_call(&k, &op, x, ptl_tensor_data(x), NULL, 0);
    c.out[c.nout++] = nhwc_arg(y, ptl_tensor_data(y), NULL);
    c.kept = data_or_null(am);
    RUN(k.be->layer[PTL_OP_POOL].forward(k.ctx, &c));
    return (PyObject *)y;
fail:
    Py_DECREF(y);
    return NULL;
}

/* layer_maxpool5_backward(x, dy, dx, accumulate, *, argmax=None, cpu_kernels=None) */
static PyObject *py_maxpool5_backward(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"x", "dy", "dx", "accumulate", "argmax", "cpu_kernels", NULL};
    PyObject *xo, *dyo, *dxo, *ao = NULL;
    const char *kn = NULL;
    int acc, err = 0;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOp|$Oz:layer_maxpool5_backward", kw, &xo, &dyo, &dxo, &acc,
                                     &ao, &kn))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", NULL, 4, NULL), *dy, *dx;
    if (!x || !(dy = arg(m, dyo, "dy", x, 4, x->shape)) || !(dx = arg(m, dxo, "dx", x, 4, x->shape)) ||
        kernels_of(m, x, kn, &k))
        return NULL;
    PtlTensor *am = argmax_arg(m, ao, x, &err);
    if (err)
        return NULL;
    const ptl_net_op op = {.kind = PTL_OP_POOL};
    ptl_net_call c = layer_call(&k, &op, x, ptl_tensor_data(x), ptl_tensor_data(dx), acc);
    c.out[c.nout++] = nhwc_arg(dy, NULL, ptl_tensor_data(dy));
    c.kept = data_or_null(am);
    RUN(k.be->layer[PTL_OP_POOL].backward(k.ctx, &c));
    Py_RETURN_NONE;
fail:
    return NULL;
}

/* layer_upsample2x_forward(x, y=None, *, cpu_kernels=None) -> y */
static PyObject *py_upsample2x_forward(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"x", "y", "cpu_kernels", NULL};
    PyObject *xo, *yo = NULL;
    const char *kn = NULL;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$z:layer_upsample2x_forward", kw, &xo, &yo, &kn))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", NULL, 4, NULL), *y;
    if (!x || kernels_of(m, x, kn, &k))
        return NULL;
    const int64_t ys[4] = {x->shape[0], 2 * x->shape[1], 2 * x->shape[2], x->shape[3]};
    if (!(y = out_arg(m, yo, "y", x, 4, ys, x->dtype)))
        return NULL;
    const ptl_net_op op = {.kind = PTL_OP_UP};
    ptl_net_call c = layer_call(&k, &op, x, ptl_tensor_data(x), NULL, 0);
    c.out[c.nout++] = nhwc_arg(y, ptl_tensor_data(y), NULL);
    RUN(k.be->layer[PTL_OP_UP].forward(k.ctx, &c));
    return (PyObject *)y;
fail:
    Py_DECREF(y);
    return NULL;
}

/* layer_upsample2x_backward(dy, dx, accumulate, *, cpu_kernels=None) */
static PyObject *py_upsample2x_backward(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"dy", "dx", "accumulate", "cpu_kernels", NULL};
    PyObject *dyo, *dxo;
    const char *kn = NULL;
    int acc;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOp|$z:layer_upsample2x_backward", kw, &dyo, &dxo, &acc, &kn))
        return NULL;
    PtlTensor *dx = arg(m, dxo, "dx", NULL, 4, NULL), *dy;
    if (!dx)
        return NULL;
    const int64_t ys[4] = {dx->shape[0], 2 * dx->shape[1], 2 * dx->shape[2], dx->shape[3]};
    if (!(dy = arg(m, dyo, "dy", dx, 4, ys)) || kernels_of(m, dx, kn, &k))
        return NULL;
    const ptl_net_op op = {.kind = PTL_OP_UP};
    ptl_net_call c = layer_call(&k, &op, dx, NULL, ptl_tensor_data(dx), acc); /* its gradient needs no input */
    c.out[c.nout++] = nhwc_arg(dy, NULL, ptl_tensor_data(dy));
    RUN(k.be->layer[PTL_OP_UP].backward(k.ctx, &c));
    Py_RETURN_NONE;
fail:
    return NULL;
}

/* ------------------------------------------------------------------ concat */

#define MAX_CAT 16

/* Checks a sequence of (..., c_i) tensors sharing the leading dims of `like` (or of the first). */
static int cat_list(PyObject *m, PyObject *seq, const char *name, PtlTensor *like, int allow_none, int *k,
                    PtlTensor **ts, int *cs)
{
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of tensors");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n < 1 || n > MAX_CAT) {
        PyErr_Format(PyExc_ValueError, "%s: expected 1 to %d tensors, got %zd", name, MAX_CAT, n);
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(fast, i);
        char nm[64];
        snprintf(nm, sizeof nm, "%s[%zd]", name, i);
        if (o == Py_None && allow_none) {
            ts[i] = NULL;
            cs[i] = -1;
            continue;
        }
        PtlTensor *t = cpu_arg(m, o, nm, like ? (int)like->dtype : -1, like ? like->ndim : -1, NULL);
        if (!t)
            goto fail;
        if (!like)
            like = t;
        for (int d = 0; d + 1 < like->ndim; d++)
            if (t->shape[d] != like->shape[d]) {
                PyErr_Format(PyExc_ValueError, "%s: leading dimensions differ from the others", nm);
                goto fail;
            }
        ts[i] = t;
        cs[i] = (int)t->shape[t->ndim - 1];
    }
    *k = (int)n;
    Py_DECREF(fast);
    return 0;
fail:
    Py_DECREF(fast);
    return -1;
}

static PyObject *py_concat_forward(PyObject *m, PyObject *seq)
{
    PtlTensor *ts[MAX_CAT], *y;
    int cs[MAX_CAT], k;
    const void *xs[MAX_CAT];
    if (cat_list(m, seq, "xs", NULL, 0, &k, ts, cs))
        return NULL;
    int64_t shape[PTL_MAX_DIMS];
    const int nd = ts[0]->ndim;
    for (int d = 0; d < nd; d++)
        shape[d] = ts[0]->shape[d];
    shape[nd - 1] = 0;
    for (int i = 0; i < k; i++) {
        shape[nd - 1] += cs[i];
        xs[i] = ptl_tensor_data(ts[i]);
    }
    if (!(y = ptl_tensor_empty(m, nd, shape, ts[0]->dtype, CPU)))
        return NULL;
    const int64_t rows = ptl_tensor_numel(ts[0]) / (cs[0] ? cs[0] : 1);
    RUN(ptl_concat_forward(y->dtype, rows, k, xs, cs, ptl_tensor_data(y)));
    return (PyObject *)y;
fail:
    Py_DECREF(y);
    return NULL;
}

/* layer_concat_backward(dy, dxs, accumulate): dxs a list of tensors or None, accumulate a list of bools
 * or None. */
static PyObject *py_concat_backward(PyObject *m, PyObject *args)
{
    PyObject *dyo, *dxso, *acco;
    if (!PyArg_ParseTuple(args, "OOO:layer_concat_backward", &dyo, &dxso, &acco))
        return NULL;
    PtlTensor *dy = cpu_arg(m, dyo, "dy", -1, -1, NULL), *ts[MAX_CAT];
    int cs[MAX_CAT], k, acc[MAX_CAT], total = 0;
    void *dxs[MAX_CAT];
    if (!dy || cat_list(m, dxso, "dxs", dy, 1, &k, ts, cs))
        return NULL;
    for (int i = 0; i < k; i++) {
        if (cs[i] < 0) {
            PyErr_Format(PyExc_ValueError, "dxs[%d]: None needs its channel count; pass a tensor", i);
            return NULL;
        }
        total += cs[i];
        dxs[i] = ptl_tensor_data(ts[i]);
        acc[i] = 0;
    }
    if (total != dy->shape[dy->ndim - 1]) {
        PyErr_Format(PyExc_ValueError, "dxs: channel counts sum to %d, dy has %lld", total,
                     (long long)dy->shape[dy->ndim - 1]);
        return NULL;
    }
    if (acco != Py_None) {
        if (!PySequence_Check(acco) || PySequence_Size(acco) != k) {
            PyErr_Format(PyExc_ValueError, "accumulate: expected None or %d booleans", k);
            return NULL;
        }
        for (int i = 0; i < k; i++) {
            PyObject *it = PySequence_GetItem(acco, i);
            acc[i] = it ? PyObject_IsTrue(it) : -1;
            Py_XDECREF(it);
            if (acc[i] < 0)
                return NULL;
        }
    }
    const int64_t rows = total ? ptl_tensor_numel(dy) / total : 0;
    RUN(ptl_concat_backward(dy->dtype, rows, k, ptl_tensor_data(dy), cs, dxs, acc));
    Py_RETURN_NONE;
fail:
    return NULL;
}

/* layer_channel_copy(src, src_off, dst, dst_off, c, accumulate, *, cpu_kernels=None) */
static PyObject *py_channel_copy(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"src", "src_off", "dst", "dst_off", "c", "accumulate", "cpu_kernels", NULL};
    PyObject *so, *dso;
    const char *kn = NULL;
    int soff, doff, c, acc;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OiOiip|$z:layer_channel_copy", kw, &so, &soff, &dso, &doff, &c,
                                     &acc, &kn))
        return NULL;
    PtlTensor *s = arg(m, so, "src", NULL, -1, NULL), *d;
    if (!s || !(d = arg(m, dso, "dst", s, s->ndim, NULL)) || kernels_of(m, s, kn, &k))
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
    RUN(k.be->channel_copy(k.ctx, s->dtype, rows, c, ptl_tensor_data(s), sc, soff, ptl_tensor_data(d), dc, doff, acc));
    Py_RETURN_NONE;
fail:
    return NULL;
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

/* layer_attention_forward(qkv, heads, kd, hd, o=None, attn=None, v=None, *, cpu_kernels=None) -> (o, attn, v);
 * qkv (b, h, w, heads*(2kd+hd)). */
static PyObject *py_attention_forward(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"qkv", "heads", "kd", "hd", "o", "attn", "v", "cpu_kernels", NULL};
    PyObject *qo, *oo = NULL, *ao = NULL, *vo = NULL;
    const char *kn = NULL;
    int heads, kd, hd;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oiii|OOO$z:layer_attention_forward", kw, &qo, &heads, &kd, &hd,
                                     &oo, &ao, &vo, &kn))
        return NULL;
    PtlTensor *q = arg(m, qo, "qkv", NULL, 4, NULL), *o = NULL, *at = NULL, *v = NULL;
    if (!q || attn_sizes(q, heads, kd, hd) || kernels_of(m, q, kn, &k))
        return NULL;
    const int b = (int)q->shape[0], n = (int)(q->shape[1] * q->shape[2]);
    const int64_t os[4] = {b, q->shape[1], q->shape[2], (int64_t)heads * hd}, as[4] = {b, heads, n, n};
    if (!(o = out_arg(m, oo, "o", q, 4, os, q->dtype)) || !(at = out_arg(m, ao, "attn", q, 4, as, q->dtype)) ||
        !(v = out_arg(m, vo, "v", q, 4, os, q->dtype)))
        goto fail;
    const ptl_net_op op = {.kind = PTL_OP_ATTN, .heads = heads, .kd = kd, .hd = hd};
    ptl_net_call c = layer_call(&k, &op, q, ptl_tensor_data(q), NULL, 0);
    c.out[c.nout++] = nhwc_arg(o, ptl_tensor_data(o), NULL);
    c.out[c.nout++] = nhwc_arg(v, ptl_tensor_data(v), NULL);
    c.saved = ptl_tensor_data(at);
    RUN(k.be->layer[PTL_OP_ATTN].forward(k.ctx, &c));
    return Py_BuildValue("(NNN)", o, at, v);
fail:
    Py_XDECREF(o);
    Py_XDECREF(at);
    Py_XDECREF(v);
    return NULL;
}

/* layer_attention_backward(qkv, attn, d_o, dv_or_None, heads, kd, hd, dqkv, *, cpu_kernels=None): dqkv
 * overwritten. */
static PyObject *py_attention_backward(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"qkv", "attn", "d_o", "dv", "heads", "kd", "hd", "dqkv", "cpu_kernels", NULL};
    PyObject *qo, *ao, *doo, *dvo, *dqo;
    const char *kn = NULL;
    int heads, kd, hd, err = 0;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOiiiO|$z:layer_attention_backward", kw, &qo, &ao, &doo, &dvo,
                                     &heads, &kd, &hd, &dqo, &kn))
        return NULL;
    PtlTensor *q = arg(m, qo, "qkv", NULL, 4, NULL), *at, *d_o, *dv, *dq;
    if (!q || attn_sizes(q, heads, kd, hd))
        return NULL;
    const int b = (int)q->shape[0], n = (int)(q->shape[1] * q->shape[2]);
    const int64_t os[4] = {b, q->shape[1], q->shape[2], (int64_t)heads * hd}, as[4] = {b, heads, n, n};
    if (!(at = arg(m, ao, "attn", q, 4, as)) || !(d_o = arg(m, doo, "d_o", q, 4, os)) ||
        !(dq = arg(m, dqo, "dqkv", q, 4, q->shape)))
        return NULL;
    dv = opt_arg(m, dvo, "dv", q, 4, os, &err);
    if (err || kernels_of(m, q, kn, &k))
        return NULL;
    const ptl_net_op op = {.kind = PTL_OP_ATTN, .heads = heads, .kd = kd, .hd = hd};
    ptl_net_call c = layer_call(&k, &op, q, ptl_tensor_data(q), ptl_tensor_data(dq), 0);
    c.out[c.nout++] = nhwc_arg(d_o, NULL, ptl_tensor_data(d_o));
    c.out[c.nout++] = nhwc_arg(d_o, NULL, data_or_null(dv));
    c.saved = ptl_tensor_data(at);
    RUN(k.be->layer[PTL_OP_ATTN].backward(k.ctx, &c));
    Py_RETURN_NONE;
fail:
    return NULL;
}

/* ------------------------------------------------------------------ elementwise */

/* layer_add(a, b, y=None, *, cpu_kernels=None) -> y = a + b */
static PyObject *py_add(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"a", "b", "y", "cpu_kernels", NULL};
    PyObject *ao, *bo, *yo = NULL;
    const char *kn = NULL;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O$z:layer_add", kw, &ao, &bo, &yo, &kn))
        return NULL;
    PtlTensor *a = arg(m, ao, "a", NULL, -1, NULL), *b, *y;
    if (!a || !(b = arg(m, bo, "b", a, a->ndim, a->shape)) || kernels_of(m, a, kn, &k) ||
        !(y = out_arg(m, yo, "y", a, a->ndim, a->shape, a->dtype)))
        return NULL;
    RUN(k.be->add(k.ctx, a->dtype, ptl_tensor_numel(a), ptl_tensor_data(a), ptl_tensor_data(b), ptl_tensor_data(y)));
    return (PyObject *)y;
fail:
    Py_DECREF(y);
    return NULL;
}

/* The Add row's call (executor.h) of two (n, h, w, c) inputs shaped like a into channels [y_off, y_off + c) of y
 * (n, h, w, C), as the executor makes it for an Add built into a Concat's slice, its memory left for the caller;
 * -1 where y does not fit (raised). */
static int add_into_call(const kernels *k, const ptl_net_op *op, PtlTensor *a, PtlTensor *y, int y_off,
                         ptl_net_call *c)
{
    const int ch = (int)a->shape[3], yc = (int)y->shape[3];
    for (int d = 0; d < 3; d++)
        if (y->shape[d] != a->shape[d]) {
            PyErr_SetString(PyExc_ValueError, "y: leading dimensions differ from the inputs'");
            return -1;
        }
    if (y_off < 0 || y_off + ch > yc) {
        PyErr_Format(PyExc_ValueError, "y_off: channels [%d, %d) do not fit in y's %d", y_off, y_off + ch, yc);
        return -1;
    }
    *c = layer_call(k, op, a, NULL, NULL, 0);
    c->nin = 2;
    c->in[1] = c->in[0];
    c->out[0] = (ptl_net_arg){NULL, NULL, (int)y->shape[1], (int)y->shape[2], yc, y_off, ch, 0};
    c->nout = 1;
    return 0;
}

/* layer_add_into(a, b, y, y_off, *, cpu_kernels=None): y[..., y_off:y_off + c] = a + b through the backend's Add
 * row. */
static PyObject *py_add_into(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"a", "b", "y", "y_off", "cpu_kernels", NULL};
    PyObject *ao, *bo, *yo;
    const char *kn = NULL;
    int y_off;
    kernels k;
    ptl_net_call c;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOi|$z:layer_add_into", kw, &ao, &bo, &yo, &y_off, &kn))
        return NULL;
    PtlTensor *a = arg(m, ao, "a", NULL, 4, NULL), *b, *y;
    const ptl_net_op op = {.kind = PTL_OP_ADD};
    if (!a || !(b = arg(m, bo, "b", a, 4, a->shape)) || !(y = arg(m, yo, "y", a, 4, NULL)) ||
        kernels_of(m, a, kn, &k) || add_into_call(&k, &op, a, y, y_off, &c))
        return NULL;
    c.in[0].data = ptl_tensor_data(a);
    c.in[1].data = ptl_tensor_data(b);
    c.out[0].data = ptl_tensor_data(y);
    RUN(k.be->layer[PTL_OP_ADD].forward(k.ctx, &c));
    Py_RETURN_NONE;
fail:
    return NULL;
}

/* layer_add_into_backward(dy, dy_off, da, db, accumulate_a, accumulate_b, *, cpu_kernels=None): the Add row's
 * backward from channels [dy_off, dy_off + c) of dy into da and db (n, h, w, c; either may be None), each
 * overwritten or added to. */
static PyObject *py_add_into_backward(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"dy", "dy_off", "da", "db", "accumulate_a", "accumulate_b", "cpu_kernels", NULL};
    PyObject *dyo, *dao, *dbo;
    const char *kn = NULL;
    int dy_off, acc_a, acc_b, err = 0;
    kernels k;
    ptl_net_call c;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OiOOpp|$z:layer_add_into_backward", kw, &dyo, &dy_off, &dao, &dbo,
                                     &acc_a, &acc_b, &kn))
        return NULL;
    PtlTensor *dy = arg(m, dyo, "dy", NULL, 4, NULL);
    if (!dy)
        return NULL;
    PtlTensor *da = opt_arg(m, dao, "da", dy, 4, NULL, &err), *g = da;
    PtlTensor *db = err ? NULL : opt_arg(m, dbo, "db", dy, 4, da ? da->shape : NULL, &err);
    if (err)
        return NULL;
    if (!g && !(g = db)) {
        PyErr_SetString(PyExc_ValueError, "da, db: at least one gradient is needed");
        return NULL;
    }
    const ptl_net_op op = {.kind = PTL_OP_ADD};
    if (kernels_of(m, dy, kn, &k) || add_into_call(&k, &op, g, dy, dy_off, &c))
        return NULL;
    c.in[0].grad = data_or_null(da);
    c.in[0].accumulate = acc_a;
    c.in[1].grad = data_or_null(db);
    c.in[1].accumulate = acc_b;
    c.out[0].grad = ptl_tensor_data(dy);
    RUN(k.be->layer[PTL_OP_ADD].backward(k.ctx, &c));
    Py_RETURN_NONE;
fail:
    return NULL;
}

/* layer_zero(t, *, cpu_kernels=None): every byte of t zero, through the backend's zeroing. */
static PyObject *py_zero(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"t", "cpu_kernels", NULL};
    PyObject *to;
    const char *kn = NULL;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$z:layer_zero", kw, &to, &kn))
        return NULL;
    PtlTensor *t = arg(m, to, "t", NULL, -1, NULL);
    if (!t || kernels_of(m, t, kn, &k))
        return NULL;
    RUN(k.be->zero(k.ctx, ptl_tensor_data(t), (size_t)ptl_tensor_numel(t) * ptl_dtype_size(t->dtype)));
    Py_RETURN_NONE;
fail:
    return NULL;
}

/* layer_accumulate(x, y, *, cpu_kernels=None): y += x. */
static PyObject *py_accumulate(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"x", "y", "cpu_kernels", NULL};
    PyObject *xo, *yo;
    const char *kn = NULL;
    kernels k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$z:layer_accumulate", kw, &xo, &yo, &kn))
        return NULL;
    PtlTensor *x = arg(m, xo, "x", NULL, -1, NULL), *y;
    if (!x || !(y = arg(m, yo, "y", x, x->ndim, x->shape)) || kernels_of(m, x, kn, &k))
        return NULL;
    RUN(k.be->accumulate(k.ctx, x->dtype, ptl_tensor_numel(x), ptl_tensor_data(x), ptl_tensor_data(y)));
    Py_RETURN_NONE;
fail:
    return NULL;
}

static PyMethodDef methods[] = {
    {"layer_conv2d_plan", KEYWORDS(py_conv2d_plan),
     "(x, w_ohwi, stride, groups, deterministic=True, allow_tf32=False, find=False, forward_only=False) -> plan"},
    {"layer_conv2d_forward", py_conv2d_forward, METH_VARARGS, "(plan, x, w, bias|None, y=None, workspace=None) -> y"},
    {"layer_conv2d_backward_input", py_conv2d_backward_input, METH_VARARGS, "(plan, dy, w, dx, workspace=None); dx ="},
    {"layer_conv2d_backward_weight", py_conv2d_backward_weight, METH_VARARGS, "(plan, x, dy, dw, workspace=None); dw +="},
    {"layer_conv2d_backward_bias", py_conv2d_backward_bias, METH_VARARGS, "(plan, dy, db, workspace=None); db +="},
    {"layer_conv2d_weight_layout", py_conv2d_weight_layout, METH_VARARGS, "(w, to_ohwi) -> w in the other layout"},
    {"layer_batchnorm_forward", KEYWORDS(py_batchnorm_forward),
     "(x, gamma, beta, running_mean, running_var, training, act, y=None, save_mean=None, save_invstd=None, *, "
     "cpu_kernels=None) -> (y, save_mean, save_invstd)"},
    {"layer_conv2d_batchnorm_forward", py_conv2d_batchnorm_forward, METH_VARARGS,
     "(plan, x, w, gamma, beta, running_mean, running_var, act, workspace=None) -> (z, y, save_mean, save_invstd)"},
    {"layer_batchnorm_backward", KEYWORDS(py_batchnorm_backward),
     "(x, dy, gamma, beta, save_mean, save_invstd, training, act, dx, dgamma|None, dbeta|None, *, cpu_kernels=None)"},
    {"layer_silu_forward", KEYWORDS(py_silu_forward), "(x, y=None, *, cpu_kernels=None) -> silu(x)"},
    {"layer_silu_backward", KEYWORDS(py_silu_backward), "(x, dy, dx=None, *, cpu_kernels=None) -> dx"},
    {"layer_maxpool5_forward", KEYWORDS(py_maxpool5_forward), "(x, y=None, *, argmax=None, cpu_kernels=None) -> y"},
    {"layer_maxpool5_backward", KEYWORDS(py_maxpool5_backward),
     "(x, dy, dx, accumulate, *, argmax=None, cpu_kernels=None)"},
    {"layer_upsample2x_forward", KEYWORDS(py_upsample2x_forward), "(x, y=None, *, cpu_kernels=None) -> y"},
    {"layer_upsample2x_backward", KEYWORDS(py_upsample2x_backward), "(dy, dx, accumulate, *, cpu_kernels=None)"},
    {"layer_concat_forward", py_concat_forward, METH_O, "([x0, x1, ...]) -> y"},
    {"layer_concat_backward", py_concat_backward, METH_VARARGS, "(dy, [dx0, ...], accumulate|None)"},
    {"layer_channel_copy", KEYWORDS(py_channel_copy),
     "(src, src_off, dst, dst_off, c, accumulate, *, cpu_kernels=None)"},
    {"layer_attention_forward", KEYWORDS(py_attention_forward),
     "(qkv, heads, kd, hd, o=None, attn=None, v=None, *, cpu_kernels=None) -> (o, attn, v)"},
    {"layer_attention_backward", KEYWORDS(py_attention_backward),
     "(qkv, attn, d_o, dv|None, heads, kd, hd, dqkv, *, cpu_kernels=None); dqkv ="},
    {"layer_add", KEYWORDS(py_add), "(a, b, y=None, *, cpu_kernels=None) -> a + b"},
    {"layer_accumulate", KEYWORDS(py_accumulate), "(x, y, *, cpu_kernels=None); y += x"},
    {"layer_add_into", KEYWORDS(py_add_into), "(a, b, y, y_off, *, cpu_kernels=None); y[..., y_off:y_off+c] = a + b"},
    {"layer_add_into_backward", KEYWORDS(py_add_into_backward),
     "(dy, dy_off, da|None, db|None, accumulate_a, accumulate_b, *, cpu_kernels=None); da, db = (or +=) the slice"},
    {"layer_zero", KEYWORDS(py_zero), "(t, *, cpu_kernels=None); t = 0 through the backend's zeroing"},
    {NULL, NULL, 0, NULL},
};

int ptl_register_layers(PyObject *module) { return PyModule_AddFunctions(module, methods); }
