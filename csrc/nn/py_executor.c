/* Python bindings of the network executor (executor.h), one set for every device: an executor handle
 * (a capsule that keeps its description's capsule alive) and ptl.Tensors over its memory: master
 * storage, head outputs (overwritten by the next forward of the shape) and gradients. */
#include "../py.h"

#include <string.h>

#include "../cpu/backend_cpu_fast.h"
#include "executor.h"
#include "py_network.h"
#ifdef PTL_WITH_CUDA
#include "../cuda/device.h"
#endif

#define EXEC_CAPSULE "ptl.net_executor"

static void exec_capsule_free(PyObject *cap)
{
    ptl_net_exec_free((ptl_net_exec *)PyCapsule_GetPointer(cap, EXEC_CAPSULE));
    Py_XDECREF((PyObject *)PyCapsule_GetContext(cap));
}

ptl_net_exec *ptl_py_executor(PyObject *obj)
{
    ptl_net_exec *x = PyCapsule_IsValid(obj, EXEC_CAPSULE) ? PyCapsule_GetPointer(obj, EXEC_CAPSULE) : NULL;
    if (!x)
        PyErr_SetString(PyExc_TypeError, "net: expected an executor handle from executor_create");
    return x;
}

/* executor_create(net, device='cpu', dtype=None, cpu_kernels=None): dtype is the compute dtype (None: the
 * network's on the CPU, float32 on CUDA). On the CPU the executor runs on the description's own storage,
 * with the kernels cpu_kernels names ('fast', 'reference'; None: PTL_CPU_KERNELS, else the default, see
 * ../cpu/backend_cpu_fast.h). */
static PyObject *py_create(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"net", "device", "dtype", "cpu_kernels", NULL};
    PyObject *net_cap, *dev_obj = Py_None, *dt_obj = Py_None;
    const char *kernels = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOz:executor_create", kwlist, &net_cap, &dev_obj, &dt_obj,
                                     &kernels))
        return NULL;
    ptl_network *net = ptl_py_network(net_cap);
    ptl_device dev;
    if (!net || ptl_parse_device(dev_obj, "device", &dev) < 0)
        return NULL;
    ptl_dtype dt = dev.type == PTL_CPU ? net->dtype : PTL_FLOAT32;
    if (dt_obj != Py_None && ptl_parse_dtype(dt_obj, "dtype", &dt) < 0)
        return NULL;
    ptl_runtime *rt = ptl_state(self)->rt;
    ptl_net_exec *x = NULL;
    int rc;
    if (dev.type == PTL_CPU) {
        const ptl_net_backend *be;
        Py_BEGIN_ALLOW_THREADS;
        rc = ptl_net_cpu_backend_choose(kernels, dt, &be);
        if (rc == 0)
            rc = ptl_net_exec_create(net, be, NULL, rt, dev, dt, 1, &x);
        Py_END_ALLOW_THREADS;
    } else {
        if (kernels)
            return PyErr_Format(PyExc_ValueError, "cpu_kernels: for a CPU executor only (device is cuda:%d)",
                                dev.index);
#ifdef PTL_WITH_CUDA
        ptl_cuda_ctx *ctx;
        Py_BEGIN_ALLOW_THREADS;
        rc = ptl_cuda_ctx_get(rt, dev.index, &ctx);
        if (rc == 0)
            rc = ptl_net_exec_create(net, &ptl_net_backend_cuda, ctx, rt, dev, dt, 0, &x);
        Py_END_ALLOW_THREADS;
#else
        rc = ptl_set_error(PTL_ERR_VALUE, "device: 'cuda:%d' requested but ptl was built without CUDA", dev.index);
#endif
    }
    if (rc)
        return ptl_raise(self);
    PyObject *cap = PyCapsule_New(x, EXEC_CAPSULE, exec_capsule_free);
    if (!cap) {
        ptl_net_exec_free(x);
        return NULL;
    }
    Py_INCREF(net_cap);
    if (PyCapsule_SetContext(cap, net_cap) < 0) {
        Py_DECREF(net_cap);
        Py_DECREF(cap);
        return NULL;
    }
    return cap;
}

static PyObject *wrap(PyObject *self, PyObject *cap, ptl_net_exec *x, void *ptr, int ndim, const int64_t *shape,
                      ptl_dtype dt)
{
    return (PyObject *)ptl_tensor_wrap(self, ptr, x->device, ndim, shape, dt, cap);
}

/* executor_tensors(x) -> (params, grads, buffers): 1-D tensors over the master storage. */
static PyObject *py_tensors(PyObject *self, PyObject *cap)
{
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x)
        return NULL;
    const int64_t np[1] = {x->net->nparams}, nb[1] = {x->net->nbuffers};
    PyObject *p = wrap(self, cap, x, x->own_params, 1, np, x->mdt);
    PyObject *g = p ? wrap(self, cap, x, x->grads, 1, np, x->mdt) : NULL;
    PyObject *b = g ? wrap(self, cap, x, x->own_buffers, 1, nb, x->mdt) : NULL;
    if (!b) {
        Py_XDECREF(p);
        Py_XDECREF(g);
        return NULL;
    }
    return Py_BuildValue("(NNN)", p, g, b);
}

/* The four head outputs of the current shape as tensors over the executor's buffers. */
PyObject *ptl_py_executor_outputs(PyObject *self, PyObject *cap, ptl_net_exec *x)
{
    const ptl_net_layout *L = &x->cur->L;
    PyObject *o[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++) {
        const int64_t shape[3] = {L->B, L->A, i % 2 ? x->net->nc : 4};
        if (!(o[i] = wrap(self, cap, x, ptl_net_exec_output(x, i / 2, i % 2), 3, shape, x->mdt))) {
            for (int j = 0; j < i; j++)
                Py_DECREF(o[j]);
            return NULL;
        }
    }
    return Py_BuildValue("(NNNN)", o[0], o[1], o[2], o[3]);
}

/* images: (B, H, W, 3) in the compute dtype on the executor's device. */
static PtlTensor *images_arg(PyObject *self, ptl_net_exec *x, PyObject *img)
{
    const int64_t shape[4] = {-1, -1, -1, 3};
    return ptl_tensor_arg(self, img, "images", (int)x->cdt, &x->device, 4, shape);
}

/* The four output gradients (master dtype on the device, shaped like the outputs, or None = zero). */
int ptl_py_executor_grads(PyObject *self, ptl_net_exec *x, PyObject *const d[4], const void *ptrs[2][2])
{
    static const char *names[4] = {"d_boxes", "d_scores", "d_boxes_o2o", "d_scores_o2o"};
    const ptl_net_layout *L = &x->cur->L;
    for (int i = 0; i < 4; i++) {
        ptrs[i / 2][i % 2] = NULL;
        if (d[i] == Py_None)
            continue;
        const int64_t shape[3] = {L->B, L->A, i % 2 ? x->net->nc : 4};
        PtlTensor *t = ptl_tensor_arg(self, d[i], names[i], (int)x->mdt, &x->device, 3, shape);
        if (!t)
            return -1;
        ptrs[i / 2][i % 2] = ptl_tensor_data(t);
    }
    return 0;
}

/* executor_forward(x, images) -> (boxes_o2m, scores_o2m, boxes_o2o, scores_o2o). */
static PyObject *py_forward(PyObject *self, PyObject *args)
{
    PyObject *cap, *img;
    if (!PyArg_ParseTuple(args, "OO:executor_forward", &cap, &img))
        return NULL;
    ptl_net_exec *x = ptl_py_executor(cap);
    PtlTensor *t = x ? images_arg(self, x, img) : NULL;
    if (!t)
        return NULL;
    const void *data = ptl_tensor_data(t);
    const int B = (int)t->shape[0], H = (int)t->shape[1], W = (int)t->shape[2];
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_net_exec_forward(x, data, B, H, W);
    Py_END_ALLOW_THREADS;
    if (rc)
        return ptl_raise(self);
    return ptl_py_executor_outputs(self, cap, x);
}

/* executor_backward(x, d_boxes, d_scores, d_boxes_o2o, d_scores_o2o, input_grad=False) -> d images
 * (B, H, W, 3) in the compute dtype, or None; parameter gradients add. */
static PyObject *py_backward(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"net", "d_boxes", "d_scores", "d_boxes_o2o", "d_scores_o2o", "input_grad", NULL};
    PyObject *cap, *d[4];
    int want = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|p:executor_backward", kwlist, &cap, &d[0], &d[1], &d[2], &d[3],
                                     &want))
        return NULL;
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x)
        return NULL;
    if (!x->have_forward) {
        PyErr_SetString(PyExc_RuntimeError, "executor_backward: run a forward first (a backward consumes its "
                                           "forward: the gradients reuse the activations' memory)");
        return NULL;
    }
    const void *ptrs[2][2];
    if (ptl_py_executor_grads(self, x, d, ptrs) < 0)
        return NULL;
    PtlTensor *dimg = NULL;
    if (want) {
        const ptl_net_layout *L = &x->cur->L;
        const int64_t shape[4] = {L->B, L->H, L->W, 3};
        if (!(dimg = ptl_tensor_empty(self, 4, shape, x->cdt, x->device)))
            return NULL;
    }
    void *dptr = dimg ? ptl_tensor_data(dimg) : NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_net_exec_backward(x, ptrs, dptr);
    Py_END_ALLOW_THREADS;
    if (rc) {
        Py_XDECREF(dimg);
        return ptl_raise(self);
    }
    if (!dimg)
        Py_RETURN_NONE;
    return (PyObject *)dimg;
}

static PyObject *py_prepare(PyObject *self, PyObject *args)
{
    PyObject *cap;
    int B, H, W, rc;
    if (!PyArg_ParseTuple(args, "Oiii:executor_prepare", &cap, &B, &H, &W))
        return NULL;
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x)
        return NULL;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_net_exec_prepare(x, B, H, W);
    Py_END_ALLOW_THREADS;
    if (rc)
        return ptl_raise(self);
    Py_RETURN_NONE;
}

/* executor_plan(x, shapes[, forward_only]): the conv plans of a sequence of (B, H, W) shapes, made now, for
 * their no-grad layouts when forward_only. */
static PyObject *py_plan(PyObject *self, PyObject *args)
{
    PyObject *cap, *shapes, *seq = NULL, *ret = NULL;
    int *bhw = NULL, rc;
    int forward_only = 0;
    if (!PyArg_ParseTuple(args, "OO|p:executor_plan", &cap, &shapes, &forward_only))
        return NULL;
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x || !(seq = PySequence_Fast(shapes, "shapes: expected a sequence of (batch, height, width)")))
        return NULL;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > INT_MAX / 3) {
        PyErr_Format(PyExc_ValueError, "shapes: %zd shapes are too many", n);
        goto fail;
    }
    if (!(bhw = malloc((size_t)(n ? n : 1) * 3 * sizeof *bhw))) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, k);
        if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "iii", &bhw[3 * k], &bhw[3 * k + 1], &bhw[3 * k + 2])) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "shapes[%zd]: expected a tuple (batch, height, width) of ints", k);
            goto fail;
        }
    }
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_net_exec_plan(x, (int)n, bhw, forward_only);
    Py_END_ALLOW_THREADS;
    if (rc) {
        ptl_raise(self);
        goto fail;
    }
    Py_INCREF(Py_None);
    ret = Py_None;
fail:
    Py_XDECREF(seq);
    free(bhw);
    return ret;
}

/* executor_sync(x, 'params'|'grads'|'buffers', to_device): copies between the executor's storage and
 * the description's host storage (a no-op on the CPU). */
static PyObject *py_sync(PyObject *self, PyObject *args)
{
    PyObject *cap;
    const char *which;
    int to_device, rc;
    if (!PyArg_ParseTuple(args, "Osp:executor_sync", &cap, &which, &to_device))
        return NULL;
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x)
        return NULL;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_net_exec_sync(x, which, to_device);
    Py_END_ALLOW_THREADS;
    if (rc)
        return ptl_raise(self);
    Py_RETURN_NONE;
}

static PyObject *py_zero_grad(PyObject *self, PyObject *cap)
{
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x)
        return NULL;
    if (ptl_net_exec_zero_grad(x))
        return ptl_raise(self);
    Py_RETURN_NONE;
}

/* executor_use_weights(x, params, buffers): forwards read these (master dtype on the executor's device,
 * the network's sizes) until executor_use_weights(x, None, None); the caller keeps them alive. */
static PyObject *py_use_weights(PyObject *self, PyObject *args)
{
    PyObject *cap, *po, *bo;
    if (!PyArg_ParseTuple(args, "OOO:executor_use_weights", &cap, &po, &bo))
        return NULL;
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x)
        return NULL;
    if ((po == Py_None) != (bo == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "params, buffers: give both or neither");
        return NULL;
    }
    void *pp = NULL, *bp = NULL;
    if (po != Py_None) {
        const int64_t np[1] = {x->net->nparams}, nb[1] = {x->net->nbuffers};
        PtlTensor *p = ptl_tensor_arg(self, po, "params", (int)x->mdt, &x->device, 1, np);
        PtlTensor *b = p ? ptl_tensor_arg(self, bo, "buffers", (int)x->mdt, &x->device, 1, nb) : NULL;
        if (!b)
            return NULL;
        pp = ptl_tensor_data(p);
        bp = ptl_tensor_data(b);
    }
    ptl_net_exec_use_weights(x, pp, bp);
    Py_RETURN_NONE;
}

/* executor_configure(x, training=None, share_gradients=None, deterministic=None, allow_tf32=None, find=None,
 * share_activations=None, grad=None, side_lag=None, branches=None, attached=None, workspace_limit=None,
 * queue_workspace_limit=None, cat_in_place=None): sets what is given. The conv options (CUDA algorithm choice
 * and its workspace limit, bytes, 0: none), memory sharing, the side lag, the queues' workspace limit (bytes,
 * 0: none), the branches and the Concats built in place apply at the next prepare of each shape; grad=False
 * makes the next forwards forward-only. */
/* *out = v for an int v given (not None; out of int's range: -1); -1 with an exception set on failure. */
static int int_arg(PyObject *v, int *out)
{
    if (v == Py_None)
        return 0;
    const long n = PyLong_AsLong(v);
    if (n == -1 && PyErr_Occurred())
        return -1;
    *out = n < INT_MIN || n > INT_MAX ? -1 : (int)n;
    return 0;
}

static PyObject *py_configure(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"net",  "training",          "share_gradients", "deterministic", "allow_tf32",
                             "find", "share_activations", "grad",            "side_lag",      "branches",
                             "attached", "workspace_limit", "queue_workspace_limit", "cat_in_place", NULL};
    PyObject *cap, *v[7] = {Py_None, Py_None, Py_None, Py_None, Py_None, Py_None, Py_None}, *lag = Py_None,
                   *branches = Py_None, *attached = Py_None, *limit[2] = {Py_None, Py_None}, *in_place = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOOOOOOOOOOOO:executor_configure", kwlist, &cap, &v[0], &v[1],
                                     &v[2], &v[3], &v[4], &v[5], &v[6], &lag, &branches, &attached, &limit[0],
                                     &limit[1], &in_place))
        return NULL;
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x)
        return NULL;
    int n = x->side_lag, on = x->branches, att = x->attached;
    if (int_arg(lag, &n) || int_arg(branches, &on) || int_arg(attached, &att))
        return NULL;
    size_t bytes[2] = {x->opts.workspace_limit, x->queue_ws_limit};
    for (int k = 0; k < 2; k++) {
        if (limit[k] == Py_None)
            continue;
        const long long b = PyLong_AsLongLong(limit[k]);
        if (b == -1 && PyErr_Occurred())
            return NULL;
        if (b < 0)
            return PyErr_Format(PyExc_ValueError, "%s must be >= 0 bytes (0: no limit), got %lld", kwlist[11 + k], b);
        bytes[k] = (size_t)b;
    }
    const int cat = in_place == Py_None ? x->cat_in_place : PyObject_IsTrue(in_place);
    if (cat < 0)
        return NULL;
    /* the Concats first: they may change the branches found */
    if ((in_place != Py_None && ptl_net_exec_set_cat_in_place(x, cat)) ||
        (lag != Py_None && ptl_net_exec_set_side_lag(x, n)) ||
        ((branches != Py_None || attached != Py_None) && ptl_net_exec_set_branches(x, on, att)))
        return ptl_raise(self);
    if (limit[1] != Py_None)
        ptl_net_exec_set_queue_workspace_limit(x, bytes[1]);
    int f[7];
    for (int i = 0; i < 7; i++)
        if (v[i] != Py_None && (f[i] = PyObject_IsTrue(v[i])) < 0)
            return NULL;
    if (v[0] != Py_None)
        ptl_net_exec_set_training(x, f[0]);
    if (v[6] != Py_None)
        ptl_net_exec_set_grad(x, f[6]);
    if (v[1] != Py_None || v[5] != Py_None) {
        int share = x->share;
        if (v[1] != Py_None)
            share = f[1] ? share | PTL_NET_SHARE_GRADIENTS : share & ~PTL_NET_SHARE_GRADIENTS;
        if (v[5] != Py_None)
            share = f[5] ? share | PTL_NET_SHARE_ACTIVATIONS : share & ~PTL_NET_SHARE_ACTIVATIONS;
        ptl_net_exec_set_share_memory(x, share);
    }
    if (v[2] != Py_None || v[3] != Py_None || v[4] != Py_None || limit[0] != Py_None) {
        ptl_net_conv_opts o = x->opts;
        o.workspace_limit = bytes[0];
        o.deterministic = v[2] != Py_None ? f[2] : o.deterministic;
        o.allow_tf32 = v[3] != Py_None ? f[3] : o.allow_tf32;
        o.find = v[4] != Py_None ? f[4] : o.find;
        ptl_net_exec_set_conv_options(x, &o);
    }
    Py_RETURN_NONE;
}

/* executor_set_frozen(x, flags): flags is None (nothing frozen) or a sequence of 0/1 (or bools), one per
 * tensor of the network in network_entries order (ptl_net_exec_set_frozen). */
static PyObject *py_set_frozen(PyObject *self, PyObject *args)
{
    PyObject *cap, *flags;
    if (!PyArg_ParseTuple(args, "OO:executor_set_frozen", &cap, &flags))
        return NULL;
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x)
        return NULL;
    uint8_t *mask = NULL;
    Py_ssize_t n = 0;
    if (flags != Py_None) {
        PyObject *seq = PySequence_Fast(flags, "frozen: expected None or a sequence of 0/1 flags, one per tensor");
        if (!seq)
            return NULL;
        n = PySequence_Fast_GET_SIZE(seq);
        mask = PyMem_Malloc(n ? (size_t)n : 1);
        if (!mask) {
            Py_DECREF(seq);
            return PyErr_NoMemory();
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            const long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                PyMem_Free(mask);
                return PyErr_Format(PyExc_TypeError, "frozen: flag %zd is not an int or a bool", i);
            }
            mask[i] = (uint8_t)(v == 0 || v == 1 ? v : 2); /* 2: what the library's check rejects */
        }
        Py_DECREF(seq);
    }
    const int rc = ptl_net_exec_set_frozen(x, mask, (int64_t)n);
    PyMem_Free(mask);
    if (rc)
        return ptl_raise(self);
    Py_RETURN_NONE;
}

/* The current shape's conv workspaces: per conv op with a plan, (op, bytes its forward and input gradient
 * need, bytes its weight and bias gradients need, whether those run beside the following steps, whether
 * its workspace is in the arena). */
static PyObject *conv_workspaces(const ptl_net_exec *x)
{
    PyObject *list = PyList_New(0);
    for (int i = 0; list && x->cur->L.B && i < x->net->nops; i++) {
        const void *p = x->cur->plans[i];
        if (!p)
            continue;
        const int64_t *arena = x->cur->L.ws_numel + 2 * i;
        PyObject *t = Py_BuildValue("(iLLOO)", i, (long long)x->be->conv_workspace(p, PTL_CONV_WS_DATA),
                                    (long long)x->be->conv_workspace(p, PTL_CONV_WS_PARAM_GRADS),
                                    ptl_net_exec_param_grads_lag(x, i, p) ? Py_True : Py_False,
                                    arena[0] || arena[1] ? Py_True : Py_False);
        if (!t || PyList_Append(list, t))
            Py_CLEAR(list);
        Py_XDECREF(t);
    }
    return list;
}

static PyObject *py_info(PyObject *self, PyObject *cap)
{
    (void)self;
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x)
        return NULL;
    int64_t fixed, shape;
    ptl_net_exec_memory(x, &fixed, &shape);
    const ptl_net_layout *L = &x->cur->L;
    int64_t nodes[3];
    ptl_net_recording_nodes(x, nodes);
    int branch_ops[2] = {0, 0};
    for (int i = 0; i < x->net->nops; i++)
        if (x->br.op[i])
            branch_ops[x->br.b[x->br.op[i] - 1].attached]++;
    PyObject *spans = PyList_New(x->br.n);
    for (int b = 0; spans && b < x->br.n; b++) {
        const ptl_net_branch *B = &x->br.b[b];
        PyObject *t = Py_BuildValue("{s:i,s:i,s:O,s:i,s:i}", "fork", B->fork, "join", B->join, "attached",
                                    B->attached ? Py_True : Py_False, "first", B->first, "last", B->last);
        if (!t)
            Py_CLEAR(spans);
        else
            PyList_SET_ITEM(spans, b, t);
    }
    PyObject *dev = spans ? ptl_device_str(x->device) : NULL;
    if (!dev) {
        Py_XDECREF(spans);
        return NULL;
    }
    PyObject *info = Py_BuildValue("{s:N,s:s,s:s,s:s,s:i,s:L,s:(iii),s:L,s:L,s:L,s:L,s:O,s:O,s:(LLL),s:i,s:i,s:i,s:i,"
                         "s:i,s:O,s:i,s:i,s:N,s:(ii),s:O,s:O,s:(OO),s:{s:O,s:O,s:O,s:L},s:L,s:i}",
                         "device", dev, "backend", x->be->name, "dtype", ptl_dtype_name(x->cdt), "master_dtype",
                         ptl_dtype_name(x->mdt), "training", x->training, "num_parameters", (long long)x->net->nparams,
                         "batch_shape", L->B, L->H, L->W, "anchors", (long long)L->A, "fixed_bytes", (long long)fixed,
                         "shape_bytes", (long long)shape, "arena_bytes", (long long)(L->arena_numel * (int64_t)x->csz),
                         "forward_only", L->forward_only ? Py_True : Py_False, "recorded",
                         ptl_net_recorded(x) ? Py_True : Py_False, "recorded_nodes", (long long)nodes[0],
                         (long long)nodes[1], (long long)nodes[2], "have_forward", x->have_forward, "frozen_tensors",
                         x->nfrozen, "backward_ops", x->backward_ops, "ops", x->net->nops, "side_lag", x->side_lag,
                         "side_stream", x->side[PTL_NET_SIDE_WGRAD] ? Py_True : Py_False, "branches", x->branches,
                         "attached", x->attached, "branch_plan", spans, "branch_ops", branch_ops[0],
                         branch_ops[1], "branch_stream", x->side[PTL_NET_SIDE_DETACHED] ? Py_True : Py_False,
                         "attached_stream", x->side[PTL_NET_SIDE_ATTACHED] ? Py_True : Py_False,
                         "branch_wgrad_streams", x->side[PTL_NET_SIDE_DETACHED_WGRAD] ? Py_True : Py_False,
                         x->side[PTL_NET_SIDE_ATTACHED_WGRAD] ? Py_True : Py_False, "conv_options",
                         "deterministic", x->opts.deterministic ? Py_True : Py_False, "allow_tf32",
                         x->opts.allow_tf32 ? Py_True : Py_False, "find", x->opts.find ? Py_True : Py_False,
                         "workspace_limit", (long long)x->opts.workspace_limit, "queue_workspace_limit",
                         (long long)x->queue_ws_limit, "shared_add_gradients", L->grad_aliases);
    PyObject *convs = info ? conv_workspaces(x) : NULL;
    PyObject *cat = info ? Py_BuildValue("(Oi)", x->cat_in_place ? Py_True : Py_False, x->cat_parts) : NULL;
    /* per queue (main, then the side queues in PTL_NET_SIDE_* order) */
    PyObject *ws = info ? PyTuple_New(PTL_NET_QUEUES) : NULL;
    for (int q = 0; ws && q < PTL_NET_QUEUES; q++) {
        PyObject *b = PyLong_FromLongLong((long long)x->cur->ws_bytes[q]);
        if (!b)
            Py_CLEAR(ws);
        else
            PyTuple_SET_ITEM(ws, q, b);
    }
    if (!convs || !cat || !ws || PyDict_SetItemString(info, "conv_workspaces", convs) ||
        PyDict_SetItemString(info, "cat_in_place", cat) || PyDict_SetItemString(info, "workspace_bytes", ws)) {
        Py_XDECREF(convs);
        Py_XDECREF(cat);
        Py_XDECREF(ws);
        Py_XDECREF(info);
        return NULL;
    }
    Py_DECREF(convs);
    Py_DECREF(cat);
    Py_DECREF(ws);
    return info;
}

/* network_check_weight_table(net, cast_biases) -> (records, tiles, elements): builds the weight-cast table a
 * backend with or without cast biases uses and checks the CUDA kernels' tiles against the per-record walk
 * (tests). */
static PyObject *py_check_weight_table(PyObject *self, PyObject *args)
{
    PyObject *cap;
    int cast_biases;
    if (!PyArg_ParseTuple(args, "Op:network_check_weight_table", &cap, &cast_biases))
        return NULL;
    ptl_network *net = ptl_py_network(cap);
    if (!net)
        return NULL;
    ptl_net_wtab wt;
    if (ptl_net_wtab_build(net, cast_biases, &wt))
        return ptl_raise(self);
    const int rc = ptl_net_wcast_check(wt.tab, wt.n, wt.tiles, wt.ntiles, wt.total);
    PyObject *res = rc ? NULL : Py_BuildValue("(iiL)", wt.n, wt.ntiles, (long long)wt.total);
    ptl_net_wtab_free(&wt);
    return rc ? ptl_raise(self) : res;
}

static PyObject *py_cpu_live_blocks(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(ptl_net_cpu_live_blocks());
}

/* ------------------------------------------------------------------------------ the recorder */

/* executor_record(x, images, d_boxes, d_scores, d_boxes_o2o, d_scores_o2o): captures one forward and one
 * backward (not run) for replay; the caller keeps every tensor alive and in place while it lives. */
static PyObject *py_record(PyObject *self, PyObject *args)
{
    PyObject *cap, *img, *d[4];
    if (!PyArg_ParseTuple(args, "OOOOOO:executor_record", &cap, &img, &d[0], &d[1], &d[2], &d[3]))
        return NULL;
    ptl_net_exec *x = ptl_py_executor(cap);
    PtlTensor *t = x ? images_arg(self, x, img) : NULL;
    if (!t)
        return NULL;
    const void *ptrs[2][2];
    if (ptl_py_executor_grads(self, x, d, ptrs) < 0)
        return NULL;
    const void *data = ptl_tensor_data(t);
    const int B = (int)t->shape[0], H = (int)t->shape[1], W = (int)t->shape[2];
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_net_record(x, data, B, H, W, ptrs, NULL);
    Py_END_ALLOW_THREADS;
    if (rc)
        return ptl_raise(self);
    Py_RETURN_NONE;
}

/* executor_replay(x, part='both'|'forward'|'backward') -> the head outputs (None for 'backward'). */
static PyObject *py_replay(PyObject *self, PyObject *args)
{
    PyObject *cap;
    const char *name = "both";
    if (!PyArg_ParseTuple(args, "O|s:executor_replay", &cap, &name))
        return NULL;
    const int part = !strcmp(name, "both") ? PTL_NET_REPLAY_BOTH
                     : !strcmp(name, "forward") ? PTL_NET_REPLAY_FORWARD
                     : !strcmp(name, "backward") ? PTL_NET_REPLAY_BACKWARD
                                                 : -1;
    if (part < 0)
        return PyErr_Format(PyExc_ValueError, "part: expected 'both', 'forward' or 'backward', got '%s'", name);
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_net_replay(x, part);
    Py_END_ALLOW_THREADS;
    if (rc)
        return ptl_raise(self);
    if (part == PTL_NET_REPLAY_BACKWARD)
        Py_RETURN_NONE;
    return ptl_py_executor_outputs(self, cap, x);
}

static PyObject *py_retire(PyObject *self, PyObject *cap)
{
    (void)self;
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x)
        return NULL;
    ptl_net_exec_retire(x);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"executor_create", (PyCFunction)(void (*)(void))py_create, METH_VARARGS | METH_KEYWORDS,
     "executor_create(net, device='cpu', dtype=None, cpu_kernels=None) -> an executor of the network on that "
     "device ('fast' or 'reference' CPU kernels; None: PTL_CPU_KERNELS, else fast where it applies)."},
    {"executor_tensors", py_tensors, METH_O, "executor_tensors(x) -> (params, grads, buffers) over its storage."},
    {"executor_forward", py_forward, METH_VARARGS,
     "executor_forward(x, images NHWC in the compute dtype) -> the four head outputs."},
    {"executor_backward", (PyCFunction)(void (*)(void))py_backward, METH_VARARGS | METH_KEYWORDS,
     "executor_backward(x, d_boxes, d_scores, d_boxes_o2o, d_scores_o2o, input_grad=False) -> d images or None."},
    {"executor_prepare", py_prepare, METH_VARARGS, "executor_prepare(x, B, H, W): buffers and plans of a shape."},
    {"executor_plan", py_plan, METH_VARARGS,
     "executor_plan(x, [(B, H, W), ...][, forward_only]): the conv plans of these shapes (no-grad layouts')."},
    {"executor_sync", py_sync, METH_VARARGS, "executor_sync(x, which, to_device): storage <-> host copy."},
    {"executor_zero_grad", py_zero_grad, METH_O, "executor_zero_grad(x): grads = 0."},
    {"executor_use_weights", py_use_weights, METH_VARARGS,
     "executor_use_weights(x, params, buffers): forwards on other weights (None, None: its own)."},
    {"executor_configure", (PyCFunction)(void (*)(void))py_configure, METH_VARARGS | METH_KEYWORDS,
     "executor_configure(x, training=None, share_gradients=None, deterministic=None, allow_tf32=None, find=None, "
     "share_activations=None, grad=None, side_lag=None, branches=None, attached=None, workspace_limit=None, "
     "queue_workspace_limit=None, cat_in_place=None)."},
    {"executor_set_frozen", py_set_frozen, METH_VARARGS,
     "executor_set_frozen(x, flags): freeze the tensors flagged 1 (network_entries order; None: none)."},
    {"executor_info", py_info, METH_O, "executor_info(x) -> dict."},
    {"executor_record", py_record, METH_VARARGS,
     "executor_record(x, images, d_boxes, d_scores, d_boxes_o2o, d_scores_o2o): capture for replay (CUDA)."},
    {"executor_replay", py_replay, METH_VARARGS, "executor_replay(x, part='both') -> head outputs or None (CUDA)."},
    {"executor_retire", py_retire, METH_O, "executor_retire(x): drop the recordings."},
    {"network_check_weight_table", py_check_weight_table, METH_VARARGS,
     "network_check_weight_table(net, cast_biases) -> (records, elements): the CUDA weight kernels' index "
     "search checked (tests)."},
    {"executor_cpu_live_blocks", py_cpu_live_blocks, METH_NOARGS, "Blocks the CPU backend holds (tests)."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_executor(PyObject *module)
{
    if (PyModule_AddIntConstant(module, "NET_SIDE_LAG", PTL_NET_SIDE_LAG) < 0 ||
        PyModule_AddIntConstant(module, "NET_SIDE_MAX_LAG", PTL_NET_SIDE_MAX_LAG) < 0 ||
        PyModule_AddIntConstant(module, "NET_QUEUE_WORKSPACE_LIMIT", (long)PTL_NET_QUEUE_WORKSPACE_LIMIT) < 0 ||
        PyModule_AddIntConstant(module, "NET_CONV_WORKSPACE_LIMIT", (long)PTL_NET_CONV_WORKSPACE_LIMIT) < 0)
        return -1;
    return PyModule_AddFunctions(module, methods);
}
