/* Python bindings of the objective area. */
#include "../py.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "objective.h"

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

static PyObject *py_objective(PyObject *module, PyObject *args, PyObject *kwargs)
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
    if (B > INT32_MAX || nc > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "outputs: batch size and number of classes must fit in 32 bits");
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
    a.assign_in = assign_in;
    for (int k = 0; k < 3; k++)
        a.gain[k] = gains[k];
    a.grad_scale = grad_scale;
    if (scale_obj != Py_None) {
        PtlTensor *st = ptl_tensor_arg(module, scale_obj, "scale_from", PTL_FLOAT32, NULL, 1, NULL);
        if (!st)
            goto fail;
        if (st->storage->device.type != dev.type || st->storage->device.index != dev.index) {
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
    struct ptl_cuda_ctx *ctx;
    if (ptl_py_exec_ctx(module, dev, &ctx) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_obj_targets_build((const float *)ptl_tensor_data(tt), tt->shape[0], a.B, H, W, a.nc, &tg);
    if (rc == 0) {
        rc = ptl_objective(ctx, &a, &tg);
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
    {"objective", (PyCFunction)(void (*)(void))py_objective, METH_VARARGS | METH_KEYWORDS, objective_doc},
    {"objective_o2m_weight", py_o2m_weight, METH_VARARGS, "o2m weight of a 0-based epoch (spec §3.4)."},
    {NULL, NULL, 0, NULL},
};

/* The losses layout and the default gains of objective.h, for ptl/objective.py. */
static const char *const loss_names[PTL_OBJ_NUM_LOSSES] = {"total",   "o2m_box", "o2m_cls",  "o2m_l1",   "o2o_box",
                                                           "o2o_cls", "o2o_l1",  "item_box", "item_cls", "item_l1"};

int ptl_register_objective(PyObject *module)
{
    if (PyModule_AddFunctions(module, methods) < 0)
        return -1;
    PyObject *names = PyTuple_New(PTL_OBJ_NUM_LOSSES);
    for (int i = 0; names && i < PTL_OBJ_NUM_LOSSES; i++) {
        PyObject *s = PyUnicode_FromString(loss_names[i]);
        if (!s) {
            Py_CLEAR(names);
            break;
        }
        PyTuple_SET_ITEM(names, i, s);
    }
    if (ptl_py_add(module, "OBJECTIVE_LOSSES", names) < 0 ||
        ptl_py_add(module, "OBJECTIVE_GAINS",
                     Py_BuildValue("(ddd)", PTL_OBJ_GAIN_BOX, PTL_OBJ_GAIN_CLS, PTL_OBJ_GAIN_L1)) < 0 ||
        ptl_py_add(module, "OBJECTIVE_STRIDES", Py_BuildValue("(iii)", 8, 16, 32)) < 0)
        return -1;
    return 0;
}
