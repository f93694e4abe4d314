/* Python bindings of the nn area: the YOLO26 network (csrc/nn/network.h) behind a capsule.
 * Arrays cross as NumPy arrays: the flat parameter, gradient and buffer storage as zero-copy views
 * that keep the network alive, head outputs and input gradients as fresh copies. */
#include "../py.h"

#include <string.h>

#include "../numpy_api.h"

#include "network.h"

#define NET_CAPSULE "ptl.network"

static void net_capsule_free(PyObject *cap)
{
    ptl_network_free((ptl_network *)PyCapsule_GetPointer(cap, NET_CAPSULE));
}

static ptl_network *net_arg(PyObject *obj)
{
    ptl_network *net = (ptl_network *)PyCapsule_GetPointer(obj, NET_CAPSULE);
    if (!net) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "net: expected a network handle from network_create");
    }
    return net;
}

static int npy_type(ptl_dtype dt) { return dt == PTL_FLOAT64 ? NPY_FLOAT64 : NPY_FLOAT32; }

static PyObject *py_network_create(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"scale", "num_classes", "dtype", "seed", NULL};
    const char *scale, *dtname = "float32";
    int nc = 80;
    unsigned long long seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|isK:network_create", kwlist, &scale, &nc, &dtname, &seed))
        return NULL;
    if (strlen(scale) != 1 || !strchr("nsmlx", scale[0]))
        return PyErr_Format(PyExc_ValueError, "scale: expected one of 'n', 's', 'm', 'l', 'x', got '%s'", scale);
    int dt = ptl_dtype_from_name(dtname);
    if (dt != PTL_FLOAT32 && dt != PTL_FLOAT64)
        return PyErr_Format(PyExc_ValueError, "dtype: the CPU network computes in float32 or float64, got '%s'",
                            dtname);
    ptl_network *net = ptl_network_create(scale[0], nc, (ptl_dtype)dt, seed);
    if (!net)
        return ptl_raise(self);
    PyObject *cap = PyCapsule_New(net, NET_CAPSULE, net_capsule_free);
    if (!cap)
        ptl_network_free(net);
    return cap;
}

/* [(name, is_buffer, offset, shape, layer)] in state_dict order. */
static PyObject *py_network_entries(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O:network_entries", &cap))
        return NULL;
    ptl_network *net = net_arg(cap);
    if (!net)
        return NULL;
    PyObject *list = PyList_New(net->nentries);
    if (!list)
        return NULL;
    for (int i = 0; i < net->nentries; i++) {
        const ptl_net_entry *e = &net->entries[i];
        PyObject *shape = PyTuple_New(e->ndim);
        if (!shape)
            goto fail;
        for (int d = 0; d < e->ndim; d++)
            PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(e->shape[d]));
        PyObject *t = Py_BuildValue("(siLNi)", e->name, e->is_buffer, (long long)e->offset, shape, e->layer);
        if (!t)
            goto fail;
        PyList_SET_ITEM(list, i, t);
    }
    return list;
fail:
    Py_DECREF(list);
    return NULL;
}

static PyObject *py_network_info(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O:network_info", &cap))
        return NULL;
    ptl_network *net = net_arg(cap);
    if (!net)
        return NULL;
    PyObject *layers = PyList_New(24);
    if (!layers)
        return NULL;
    for (int l = 0; l < 24; l++)
        PyList_SET_ITEM(layers, l, PyLong_FromLongLong(ptl_network_layer_params(net, l)));
    /* Bytes of the per-shape arenas (activations, their gradients, attention maps) of the last
     * prepared (batch, height, width); 0 before the first forward. */
    long long arena = (long long)((2 * net->act_numel + net->attn_numel + net->max_value_numel) *
                                  (int64_t)ptl_dtype_size(net->dtype));
    return Py_BuildValue("{s:C,s:i,s:s,s:L,s:L,s:(iii),s:(iii),s:i,s:N,s:(iii),s:L}", "scale", net->scale,
                         "num_classes", net->nc, "dtype", ptl_dtype_name(net->dtype), "num_parameters",
                         (long long)net->nparams, "num_buffers", (long long)net->nbuffers, "strides", net->stride[0],
                         net->stride[1], net->stride[2], "channels", net->ch[0], net->ch[1], net->ch[2], "training",
                         net->training, "layer_parameters", layers, "batch_shape", net->B, net->H, net->W,
                         "arena_bytes", arena);
}

/* A 1-D NumPy view of the flat "params", "grads" or "buffers" storage; it keeps the network alive. */
static PyObject *py_network_array(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    const char *which;
    if (!PyArg_ParseTuple(args, "Os:network_array", &cap, &which))
        return NULL;
    ptl_network *net = net_arg(cap);
    if (!net)
        return NULL;
    void *data;
    npy_intp n;
    if (!strcmp(which, "params")) {
        data = net->params;
        n = net->nparams;
    } else if (!strcmp(which, "grads")) {
        data = net->grads;
        n = net->nparams;
    } else if (!strcmp(which, "buffers")) {
        data = net->buffers;
        n = net->nbuffers;
    } else {
        return PyErr_Format(PyExc_ValueError, "which: expected 'params', 'grads' or 'buffers', got '%s'", which);
    }
    PyObject *arr = PyArray_SimpleNewFromData(1, &n, npy_type(net->dtype), data);
    if (!arr)
        return NULL;
    Py_INCREF(cap);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, cap) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *py_network_init(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "OK:network_init", &cap, &seed))
        return NULL;
    ptl_network *net = net_arg(cap);
    if (!net)
        return NULL;
    ptl_network_init(net, seed);
    Py_RETURN_NONE;
}

static PyObject *py_network_set_training(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    int flag;
    if (!PyArg_ParseTuple(args, "Op:network_set_training", &cap, &flag))
        return NULL;
    ptl_network *net = net_arg(cap);
    if (!net)
        return NULL;
    net->training = flag;
    Py_RETURN_NONE;
}

/* A C-contiguous array of the network dtype with the given shape (entries < 0 match anything). */
static PyArrayObject *array_arg(PyObject *obj, const char *arg, ptl_network *net, int ndim, const npy_intp *shape)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a NumPy array, got %.100s", arg, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_TYPE(a) != npy_type(net->dtype) || !PyArray_IS_C_CONTIGUOUS(a) || PyArray_NDIM(a) != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: expected a C-contiguous %d-D %s array", arg, ndim,
                     ptl_dtype_name(net->dtype));
        return NULL;
    }
    for (int d = 0; d < ndim; d++)
        if (shape[d] >= 0 && PyArray_DIM(a, d) != shape[d]) {
            PyErr_Format(PyExc_ValueError, "%s: dimension %d is %ld, expected %ld", arg, d, (long)PyArray_DIM(a, d),
                         (long)shape[d]);
            return NULL;
        }
    return a;
}

/* forward(net, images (B, H, W, 3) NHWC in the network dtype)
 *   -> (boxes_o2m (B,A,4), scores_o2m (B,A,nc), boxes_o2o, scores_o2o). */
static PyObject *py_network_forward(PyObject *self, PyObject *args)
{
    PyObject *cap, *img;
    if (!PyArg_ParseTuple(args, "OO:network_forward", &cap, &img))
        return NULL;
    ptl_network *net = net_arg(cap);
    if (!net)
        return NULL;
    npy_intp ishape[4] = {-1, -1, -1, 3};
    PyArrayObject *im = array_arg(img, "images", net, 4, ishape);
    if (!im)
        return NULL;
    int B = (int)PyArray_DIM(im, 0), H = (int)PyArray_DIM(im, 1), W = (int)PyArray_DIM(im, 2);
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_network_forward(net, PyArray_DATA(im), B, H, W);
    Py_END_ALLOW_THREADS;
    if (rc)
        return ptl_raise(self);
    PyObject *outs[4] = {NULL, NULL, NULL, NULL};
    size_t esz = ptl_dtype_size(net->dtype);
    for (int i = 0; i < 4; i++) {
        npy_intp shape[3] = {B, net->A, i % 2 ? net->nc : 4};
        outs[i] = PyArray_SimpleNew(3, shape, npy_type(net->dtype));
        if (!outs[i])
            goto fail;
        memcpy(PyArray_DATA((PyArrayObject *)outs[i]), net->out[i / 2][i % 2],
               (size_t)(shape[0] * shape[1] * shape[2]) * esz);
    }
    return Py_BuildValue("(NNNN)", outs[0], outs[1], outs[2], outs[3]);
fail:
    for (int i = 0; i < 4; i++)
        Py_XDECREF(outs[i]);
    return NULL;
}

/* backward(net, d_boxes_o2m, d_scores_o2m, d_boxes_o2o, d_scores_o2o, input_grad=False)
 * Each gradient is an array shaped like the forward's output or None (zero). Parameter gradients
 * accumulate into the flat gradient storage; returns d images (B, H, W, 3) or None. */
static PyObject *py_network_backward(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"net", "d_boxes", "d_scores", "d_boxes_o2o", "d_scores_o2o", "input_grad", NULL};
    PyObject *cap, *d[4];
    int want = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|p:network_backward", kwlist, &cap, &d[0], &d[1], &d[2], &d[3],
                                     &want))
        return NULL;
    ptl_network *net = net_arg(cap);
    if (!net)
        return NULL;
    if (!net->have_forward) {
        PyErr_SetString(PyExc_RuntimeError, "network_backward: run a forward first");
        return NULL;
    }
    static const char *names[4] = {"d_boxes", "d_scores", "d_boxes_o2o", "d_scores_o2o"};
    const void *ptrs[2][2] = {{NULL, NULL}, {NULL, NULL}};
    for (int i = 0; i < 4; i++) {
        if (d[i] == Py_None)
            continue;
        npy_intp shape[3] = {net->B, net->A, i % 2 ? net->nc : 4};
        PyArrayObject *a = array_arg(d[i], names[i], net, 3, shape);
        if (!a)
            return NULL;
        ptrs[i / 2][i % 2] = PyArray_DATA(a);
    }
    PyObject *dimg = NULL;
    if (want) {
        npy_intp shape[4] = {net->B, net->H, net->W, 3};
        dimg = PyArray_SimpleNew(4, shape, npy_type(net->dtype));
        if (!dimg)
            return NULL;
    }
    void *dptr = dimg ? PyArray_DATA((PyArrayObject *)dimg) : NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_network_backward(net, ptrs, dptr);
    Py_END_ALLOW_THREADS;
    if (rc) {
        Py_XDECREF(dimg);
        return ptl_raise(self);
    }
    if (!dimg)
        Py_RETURN_NONE;
    return dimg;
}

static PyMethodDef methods[] = {
    {"network_create", (PyCFunction)(void (*)(void))py_network_create, METH_VARARGS | METH_KEYWORDS,
     "network_create(scale, num_classes=80, dtype='float32', seed=0) -> handle of a new YOLO26 network."},
    {"network_entries", py_network_entries, METH_VARARGS,
     "network_entries(net) -> [(name, is_buffer, offset, shape, layer)] in state_dict order."},
    {"network_info", py_network_info, METH_VARARGS, "network_info(net) -> dict of sizes, strides, channels."},
    {"network_array", py_network_array, METH_VARARGS,
     "network_array(net, 'params'|'grads'|'buffers') -> 1-D NumPy view of that flat storage."},
    {"network_init", py_network_init, METH_VARARGS, "network_init(net, seed): re-initialise (spec §1.7)."},
    {"network_set_training", py_network_set_training, METH_VARARGS,
     "network_set_training(net, flag): BatchNorm uses batch (True) or running (False) statistics."},
    {"network_forward", py_network_forward, METH_VARARGS,
     "network_forward(net, images NHWC) -> (boxes, scores, boxes_o2o, scores_o2o)."},
    {"network_backward", (PyCFunction)(void (*)(void))py_network_backward, METH_VARARGS | METH_KEYWORDS,
     "network_backward(net, d_boxes, d_scores, d_boxes_o2o, d_scores_o2o, input_grad=False) -> d images or "
     "None; parameter gradients accumulate."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_nn(PyObject *module)
{
    return PyModule_AddFunctions(module, methods);
}
