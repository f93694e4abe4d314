/* Python bindings of the objective area. */
#include "../py.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "objective.h"
#ifdef PTL_WITH_CUDA
#include "../cuda/device.h"
#endif

#ifdef PTL_WITH_CUDA
static void workspace_destroy(void *ws) { ptl_obj_workspace_destroy((ptl_obj_workspace *)ws); }

/* Runs the CUDA objective with the device's workspace (created on first use, kept in the device
 * context and freed with it); the context's ext lock serialises callers that released the GIL. */
static int objective_cuda(ptl_runtime *rt, int device, const ptl_obj_args *a, const ptl_obj_targets *tg)
{
    ptl_cuda_ctx *ctx;
    if (ptl_cuda_ctx_get(rt, device, &ctx) != 0)
        return -1;
    pthread_mutex_lock(&ctx->ext_lock);
    ptl_ctx_ext *ext = &ctx->ext[PTL_CTX_OBJECTIVE];
    int rc = 0;
    if (!ext->ptr) {
        ptl_obj_workspace *ws = NULL;
        rc = ptl_obj_workspace_create(rt, device, &ws);
        if (rc == 0)
            *ext = (ptl_ctx_ext){ws, workspace_destroy};
    }
    if (rc == 0)
        rc = ptl_objective_cuda((ptl_obj_workspace *)ext->ptr, a, tg);
    pthread_mutex_unlock(&ctx->ext_lock);
    return rc;
}

/* A given assignment is validated on the host (a copy, then a wait: assign_in is a test path, never a
 * training step) so that a bad index raises instead of reading past the targets on the device. */
static int check_device_assignment(ptl_runtime *rt, ptl_device dev, const ptl_obj_args *a, const ptl_obj_targets *tg)
{
    ptl_device cpu = {PTL_CPU, 0};
    size_t nbytes = sizeof(int32_t) * (size_t)a->B * (size_t)a->A;
    int32_t *host = (int32_t *)malloc(nbytes ? nbytes : 1);
    if (!host)
        return ptl_set_error(PTL_ERR_MEMORY, "objective: out of host memory");
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        rc = ptl_copy_bytes(rt, host, cpu, a->assign_gt[i], dev, nbytes);
        if (rc == 0)
            rc = ptl_obj_check_assignment(host, a->B, a->A, tg, i ? "assign_gt[1]" : "assign_gt[0]");
    }
    free(host);
    return rc;
}
#endif

/* The n tensors of sequence obj. Each item's reference is stored in held[] (released by the caller)
 * rather than dropped here: a sequence need not keep its items alive (its __getitem__ may build them),
 * and a list may be changed by another thread while the GIL is released. */
static int tensor_seq(PyObject *module, PyObject *obj, const char *arg, int n, PtlTensor **out, PyObject **held)
{
    if (!PySequence_Check(obj) || PySequence_Size(obj) != n) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a sequence of %d tensors", arg, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *it = PySequence_GetItem(obj, i);
        if (!it)
            return -1;
        held[i] = it;
        char name[96];
        snprintf(name, sizeof name, "%s[%d]", arg, i);
        out[i] = ptl_tensor_arg(module, it, name, -1, NULL, -1, NULL);
        if (!out[i])
            return -1;
    }
    return 0;
}

static int same_place(PtlTensor *t, const char *arg, int dt, ptl_device dev, int ndim, const int64_t *shape)
{
    if (dt >= 0 && t->dtype != (ptl_dtype)dt) {
        PyErr_Format(PyExc_TypeError, "%s: expected dtype %s, got %s", arg, ptl_dtype_name((ptl_dtype)dt),
                     ptl_dtype_name(t->dtype));
        return -1;
    }
    if (t->storage->device.type != dev.type || t->storage->device.index != dev.index) {
        PyErr_Format(PyExc_ValueError, "%s: expected a tensor on the outputs' device", arg);
        return -1;
    }
    if (t->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: expected %d dimensions, got %d", arg, ndim, t->ndim);
        return -1;
    }
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) {
            PyErr_Format(PyExc_ValueError, "%s: expected size %lld in dimension %d, got %lld", arg,
                         (long long)shape[i], i, (long long)t->shape[i]);
            return -1;
        }
    return 0;
}

PyDoc_STRVAR(objective_doc,
             "objective(outputs, targets, img_h, img_w, o2m_weight, losses, grads=None, assign_gt=None,\n"
             "          assign_score=None, assign_in=False, gains=(7.5, 0.5, 1.5), grad_scale=1.0,\n"
             "          scale_from=None)\n--\n\n"
             "The end-to-end detection objective (csrc/objective/objective.h). outputs = (boxes_o2m,\n"
             "scores_o2m, boxes_o2o, scores_o2o) with boxes (B, A, 4) and scores (B, A, nc); targets a CPU\n"
             "float32 tensor (n, 6); losses a float32 (10,) tensor on the outputs' device (written);\n"
             "grads four tensors shaped and typed like outputs (overwritten); assign_gt / assign_score\n"
             "two (B, A) int32 / compute-precision tensors per branch, written, or read when assign_in;\n"
             "gains the (box, cls, l1) loss gains; grad_scale multiplies the gradients (float16 loss scale), and\n"
             "so does entry i of a CUDA float32 tensor given as scale_from=(tensor, i), read on the device.");

PyObject *ptl_py_objective(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"outputs", "targets", "img_h", "img_w", "o2m_weight", "losses", "grads",
                         "assign_gt", "assign_score", "assign_in", "gains", "grad_scale", "scale_from", NULL};
    PyObject *outputs, *targets_obj, *losses_obj, *grads_obj = Py_None, *agt_obj = Py_None, *asc_obj = Py_None;
    PyObject *scale_obj = Py_None;
    Py_ssize_t scale_index = 0;
    PyObject *held[12] = {NULL}; /* outputs 0-3, grads 4-7, assign_gt 8-9, assign_score 10-11 */
    PyObject *ret = NULL;
    int H, W, assign_in = 0;
    double o2m_weight, gains[3] = {PTL_OBJ_GAIN_BOX, PTL_OBJ_GAIN_CLS, PTL_OBJ_GAIN_L1}, grad_scale = 1.0;
    PtlTensor *out[4], *grads[4], *agt[2], *asc[2];
    ptl_obj_targets tg;
    ptl_obj_args a;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOiidO|OOOp(ddd)d(On):objective", kw, &outputs, &targets_obj,
                                      &H, &W, &o2m_weight, &losses_obj, &grads_obj, &agt_obj, &asc_obj,
                                      &assign_in, &gains[0], &gains[1], &gains[2], &grad_scale, &scale_obj,
                                      &scale_index))
        return NULL;
    if (tensor_seq(module, outputs, "outputs", 4, out, held) < 0)
        goto fail;
    ptl_device dev = out[0]->storage->device;
    ptl_dtype dt = out[0]->dtype;
    if (out[1]->ndim != 3) {
        PyErr_Format(PyExc_ValueError, "outputs[1]: expected scores (B, A, nc), got %d dimensions", out[1]->ndim);
        goto fail;
    }
    int64_t B = out[1]->shape[0], A = out[1]->shape[1], nc = out[1]->shape[2];
    int64_t want_a = ptl_obj_num_anchors(H, W);
    if (want_a < 0) {
        ptl_raise(module);
        goto fail;
    }
    if (A != want_a) {
        PyErr_Format(PyExc_ValueError, "outputs: %lld anchors do not match img_size %dx%d (%lld anchors)",
                     (long long)A, H, W, (long long)want_a);
        goto fail;
    }
    if (B <= 0 || nc <= 0 || B > INT32_MAX || nc > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "outputs: batch size and number of classes must be positive");
        goto fail;
    }
    if (dev.type == PTL_CPU && dt != PTL_FLOAT32 && dt != PTL_FLOAT64) {
        PyErr_Format(PyExc_TypeError, "outputs: CPU outputs must be float32 or float64, got %s", ptl_dtype_name(dt));
        goto fail;
    }
    if (dev.type == PTL_CUDA && dt != PTL_FLOAT32 && dt != PTL_BFLOAT16 && dt != PTL_FLOAT16) {
        PyErr_Format(PyExc_TypeError, "outputs: CUDA outputs must be float32, bfloat16 or float16, got %s",
                     ptl_dtype_name(dt));
        goto fail;
    }
    const int64_t bshape[3] = {B, A, 4}, sshape[3] = {B, A, nc}, lshape[1] = {PTL_OBJ_NUM_LOSSES},
                  ashape[2] = {B, A};
    const char *onames[4] = {"outputs[0]", "outputs[1]", "outputs[2]", "outputs[3]"};
    for (int i = 0; i < 4; i++)
        if (same_place(out[i], onames[i], dt, dev, 3, i % 2 ? sshape : bshape) < 0)
            goto fail;
    PtlTensor *tt = ptl_tensor_arg(module, targets_obj, "targets", PTL_FLOAT32, NULL, 2, NULL);
    if (!tt)
        goto fail;
    if (tt->storage->device.type != PTL_CPU || tt->shape[1] != 6) {
        PyErr_SetString(PyExc_ValueError, "targets: expected a CPU float32 tensor of shape (n, 6)");
        goto fail;
    }
    PtlTensor *lt = ptl_tensor_arg(module, losses_obj, "losses", PTL_FLOAT32, NULL, 1, NULL);
    if (!lt || same_place(lt, "losses", PTL_FLOAT32, dev, 1, lshape) < 0)
        goto fail;
    memset(&a, 0, sizeof a);
    if (grads_obj != Py_None) {
        if (tensor_seq(module, grads_obj, "grads", 4, grads, held + 4) < 0)
            goto fail;
        const char *gnames[4] = {"grads[0]", "grads[1]", "grads[2]", "grads[3]"};
        for (int i = 0; i < 4; i++) {
            if (same_place(grads[i], gnames[i], dt, dev, 3, i % 2 ? sshape : bshape) < 0)
                goto fail;
            (i % 2 ? a.grad_scores : a.grad_boxes)[i / 2] = ptl_tensor_data(grads[i]);
        }
    }
    int score_dt = dev.type == PTL_CPU && dt == PTL_FLOAT64 ? PTL_FLOAT64 : PTL_FLOAT32;
    if ((agt_obj == Py_None) != (asc_obj == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "assign_gt and assign_score: give both or neither");
        goto fail;
    }
    if (assign_in && agt_obj == Py_None) {
        PyErr_SetString(PyExc_ValueError, "assign_in: needs assign_gt and assign_score");
        goto fail;
    }
    if (agt_obj != Py_None) {
        if (tensor_seq(module, agt_obj, "assign_gt", 2, agt, held + 8) < 0 ||
            tensor_seq(module, asc_obj, "assign_score", 2, asc, held + 10) < 0)
            goto fail;
        for (int i = 0; i < 2; i++) {
            if (same_place(agt[i], "assign_gt", PTL_INT32, dev, 2, ashape) < 0 ||
                same_place(asc[i], "assign_score", score_dt, dev, 2, ashape) < 0)
                goto fail;
            a.assign_gt[i] = (int32_t *)ptl_tensor_data(agt[i]);
            a.assign_score[i] = ptl_tensor_data(asc[i]);
        }
        a.assign_in = assign_in;
    }
    if (!(o2m_weight >= 0 && o2m_weight <= 1)) {
        char msg[96];
        snprintf(msg, sizeof msg, "o2m_weight: expected a value in [0, 1], got %g", o2m_weight);
        PyErr_SetString(PyExc_ValueError, msg);
        goto fail;
    }
    a.B = (int)B;
    a.H = H;
    a.W = W;
    a.nc = (int)nc;
    a.A = A;
    a.dtype = dt;
    for (int i = 0; i < 2; i++) {
        a.boxes[i] = ptl_tensor_data(out[2 * i]);
        a.scores[i] = ptl_tensor_data(out[2 * i + 1]);
    }
    a.o2m_weight = o2m_weight;
    for (int k = 0; k < 3; k++) {
        if (!(gains[k] >= 0 && gains[k] < INFINITY)) {
            char msg[96];
            snprintf(msg, sizeof msg, "gains[%d]: expected a finite value >= 0, got %g", k, gains[k]);
            PyErr_SetString(PyExc_ValueError, msg);
            goto fail;
        }
        a.gain[k] = gains[k];
    }
    if (!(grad_scale > 0 && grad_scale < INFINITY)) {
        char msg[96];
        snprintf(msg, sizeof msg, "grad_scale: expected a finite value > 0, got %g", grad_scale);
        PyErr_SetString(PyExc_ValueError, msg);
        goto fail;
    }
    a.grad_scale = grad_scale;
    if (scale_obj != Py_None) {
        PtlTensor *st = ptl_tensor_arg(module, scale_obj, "scale_from", PTL_FLOAT32, NULL, 1, NULL);
        if (!st)
            goto fail;
        if (dev.type != PTL_CUDA || st->storage->device.type != PTL_CUDA || st->storage->device.index != dev.index) {
            PyErr_SetString(PyExc_ValueError, "scale_from: a float32 tensor on the outputs' CUDA device is needed");
            goto fail;
        }
        if (scale_index < 0 || scale_index >= st->shape[0]) {
            PyErr_Format(PyExc_IndexError, "scale_from: index %zd out of range for %lld entries", scale_index,
                         (long long)st->shape[0]);
            goto fail;
        }
        a.grad_scale_dev = (const float *)ptl_tensor_data(st) + scale_index;
    }
    a.losses = (float *)ptl_tensor_data(lt);
    /* looked up while holding the GIL: PyModule_GetState is part of the Python API */
    ptl_runtime *rt = ptl_state(module)->rt;

    Py_BEGIN_ALLOW_THREADS
    rc = ptl_obj_targets_build((const float *)ptl_tensor_data(tt), tt->shape[0], a.B, H, W, a.nc, &tg);
    if (rc == 0) {
        if (dev.type == PTL_CPU) {
            rc = ptl_objective_cpu(&a, &tg);
        } else {
#ifdef PTL_WITH_CUDA
            if (a.assign_in)
                rc = check_device_assignment(rt, dev, &a, &tg);
            if (rc == 0)
                rc = objective_cuda(rt, dev.index, &a, &tg);
#else
            (void)rt;
            rc = ptl_set_error(PTL_ERR_RUNTIME, "objective: ptl was built without CUDA");
#endif
        }
        ptl_obj_targets_free(&tg);
    }
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        ptl_raise(module);
        goto fail;
    }
    ret = Py_NewRef(Py_None);
fail:
    for (int i = 0; i < 12; i++)
        Py_XDECREF(held[i]);
    return ret;
}

static PyObject *py_o2m_weight(PyObject *module, PyObject *args)
{
    int e, n;
    (void)module;
    if (!PyArg_ParseTuple(args, "ii:objective_o2m_weight", &e, &n))
        return NULL;
    if (n < 1 || e < 0) {
        PyErr_Format(PyExc_ValueError, "epochs: expected epoch >= 0 and epochs >= 1, got %d of %d", e, n);
        return NULL;
    }
    return PyFloat_FromDouble(ptl_obj_o2m_weight(e, n));
}

static PyMethodDef methods[] = {
    {"objective", (PyCFunction)(void (*)(void))ptl_py_objective, METH_VARARGS | METH_KEYWORDS, objective_doc},
    {"objective_o2m_weight", py_o2m_weight, METH_VARARGS, "o2m weight of a 0-based epoch (spec §3.4)."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_objective(PyObject *module) { return PyModule_AddFunctions(module, methods); }
