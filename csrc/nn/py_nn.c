/* Python bindings of the network description (csrc/nn/network.h) behind a capsule: its structure,
 * initialisation and host storage (zero-copy NumPy views that keep the network alive). The executor's
 * bindings are in py_executor.c. */
#include "../py.h"

#include <string.h>

#include "../numpy_api.h"

#include "network.h"
#include "py_network.h"

#define NET_CAPSULE "ptl.network"

static void net_capsule_free(PyObject *cap)
{
    ptl_network_free((ptl_network *)PyCapsule_GetPointer(cap, NET_CAPSULE));
}

ptl_network *ptl_py_network(PyObject *obj)
{
    ptl_network *net = PyCapsule_IsValid(obj, NET_CAPSULE) ? PyCapsule_GetPointer(obj, NET_CAPSULE) : NULL;
    if (!net)
        PyErr_SetString(PyExc_TypeError, "net: expected a network handle from network_create");
    return net;
}

static int npy_type(ptl_dtype dt) { return dt == PTL_FLOAT64 ? NPY_FLOAT64 : NPY_FLOAT32; }

static PyObject *py_network_create(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"scale", "num_classes", "dtype", "seed", "cls_width", NULL};
    const char *scale, *dtname = "float32";
    int nc = 80, cls_width = 0;
    unsigned long long seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|isKi:network_create", kwlist, &scale, &nc, &dtname, &seed,
                                     &cls_width))
        return NULL;
    if (strlen(scale) != 1 || !strchr("nsmlx", scale[0]))
        return PyErr_Format(PyExc_ValueError, "scale: expected one of 'n', 's', 'm', 'l', 'x', got '%s'", scale);
    int dt = ptl_dtype_from_name(dtname);
    if (dt != PTL_FLOAT32 && dt != PTL_FLOAT64)
        return PyErr_Format(PyExc_ValueError, "dtype: the CPU network computes in float32 or float64, got '%s'",
                            dtname);
    ptl_network *net = ptl_network_create(scale[0], nc, cls_width, (ptl_dtype)dt, seed);
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
    ptl_network *net = ptl_py_network(cap);
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
    ptl_network *net = ptl_py_network(cap);
    if (!net)
        return NULL;
    PyObject *layers = PyList_New(24);
    if (!layers)
        return NULL;
    for (int l = 0; l < 24; l++)
        PyList_SET_ITEM(layers, l, PyLong_FromLongLong(ptl_network_layer_params(net, l)));
    return Py_BuildValue("{s:C,s:i,s:i,s:s,s:L,s:L,s:(iii),s:(iii),s:N}", "scale", net->scale, "num_classes",
                         net->nc, "cls_width", net->cls_width, "dtype", ptl_dtype_name(net->dtype), "num_parameters",
                         (long long)net->nparams, "num_buffers", (long long)net->nbuffers, "strides", net->stride[0],
                         net->stride[1], net->stride[2], "channels", net->ch[0], net->ch[1], net->ch[2],
                         "layer_parameters", layers);
}

/* A 1-D NumPy view of the flat "params", "grads" or "buffers" storage; it keeps the network alive. */
static PyObject *py_network_array(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    const char *which;
    if (!PyArg_ParseTuple(args, "Os:network_array", &cap, &which))
        return NULL;
    ptl_network *net = ptl_py_network(cap);
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
    ptl_network *net = ptl_py_network(cap);
    if (!net)
        return NULL;
    ptl_network_init(net, seed);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"network_create", (PyCFunction)(void (*)(void))py_network_create, METH_VARARGS | METH_KEYWORDS,
     "network_create(scale, num_classes=80, dtype='float32', seed=0, cls_width=0) -> handle of a new YOLO26 "
     "network (cls_width 0: the class branch's default width)."},
    {"network_entries", py_network_entries, METH_VARARGS,
     "network_entries(net) -> [(name, is_buffer, offset, shape, layer)] in state_dict order."},
    {"network_info", py_network_info, METH_VARARGS, "network_info(net) -> dict of sizes, strides, channels, class-branch width."},
    {"network_array", py_network_array, METH_VARARGS,
     "network_array(net, 'params'|'grads'|'buffers') -> 1-D NumPy view of that flat storage."},
    {"network_init", py_network_init, METH_VARARGS, "network_init(net, seed): re-initialise (spec §1.7)."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_nn(PyObject *module)
{
    return PyModule_AddFunctions(module, methods);
}
