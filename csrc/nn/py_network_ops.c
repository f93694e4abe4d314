/* Python binding of the network's op description (network.h): the value table and the op list, in
 * execution order, exactly as the executor runs them. Exporters (ptl/export.py) build their graphs
 * from it, so an exported model is the network ptl trains, not a second description of it. */
#include "../py.h"

#include "batchnorm.h"
#include "network.h"

/* The capsule name of a network handle (network_create in py_nn.c). */
#define NET_CAPSULE "ptl.network"

/* Adds key -> int to dict d; returns -1 on failure. */
static int put_int(PyObject *d, const char *key, long long v)
{
    PyObject *o = PyLong_FromLongLong(v);
    int rc = o ? PyDict_SetItemString(d, key, o) : -1;
    Py_XDECREF(o);
    return rc;
}

static PyObject *op_dict(const ptl_net_op *op)
{
    PyObject *d = Py_BuildValue("{s:s,s:i,s:i,s:i}", "kind", ptl_net_op_kind_name(op->kind), "layer", op->layer, "in",
                                op->ins[0].value, "out", op->out);
    if (!d)
        return NULL;
    int rc = 0;
    switch (op->kind) {
    case PTL_OP_CONV:
    case PTL_OP_CONV_BIAS:
        rc = put_int(d, "cin", op->cin) || put_int(d, "cout", op->cout) || put_int(d, "k", op->k) ||
             put_int(d, "stride", op->s) || put_int(d, "groups", op->g) || put_int(d, "w_off", op->param[PTL_CONV_W]);
        if (!rc && op->kind == PTL_OP_CONV)
            rc = put_int(d, "silu", op->act) || put_int(d, "gamma_off", op->param[PTL_CONV_GAMMA]) ||
                 put_int(d, "beta_off", op->param[PTL_CONV_BETA]) ||
                 put_int(d, "rmean_off", op->buffer[PTL_BN_RUNNING_MEAN]) ||
                 put_int(d, "rvar_off", op->buffer[PTL_BN_RUNNING_VAR]);
        if (!rc && op->kind == PTL_OP_CONV_BIAS)
            rc = put_int(d, "bias_off", op->param[PTL_CONV_BIAS]);
        break;
    case PTL_OP_ADD:
        rc = put_int(d, "in2", op->ins[1].value);
        break;
    case PTL_OP_CAT: {
        PyObject *parts = PyList_New(op->nin);
        if (!parts)
            goto fail;
        for (int i = 0; i < op->nin; i++) {
            PyObject *t = Py_BuildValue("(iii)", op->ins[i].value, op->ins[i].c0, op->ins[i].nc);
            if (!t) {
                Py_DECREF(parts);
                goto fail;
            }
            PyList_SET_ITEM(parts, i, t);
        }
        rc = PyDict_SetItemString(d, "parts", parts);
        Py_DECREF(parts);
        break;
    }
    case PTL_OP_ATTN:
        rc = put_int(d, "out2", op->out2) || put_int(d, "heads", op->heads) || put_int(d, "kd", op->kd) ||
             put_int(d, "hd", op->hd);
        break;
    case PTL_OP_HEAD:
        rc = put_int(d, "branch", op->branch) || put_int(d, "level", op->level) || put_int(d, "box", op->box);
        break;
    default: /* the one-input layers: in and out only */
        break;
    }
    if (rc)
        goto fail;
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

/* network_ops(net) -> {"input": value id, "values": [(channels, downsampling)], "strides": (8, 16, 32),
 * "num_classes": nc, "bn_eps": eps, "ops": [op dict]}; offsets index the flat params / buffers
 * (network_array); a conv is conv -> BatchNorm (running statistics in eval mode) -> optional SiLU. */
static PyObject *py_network_ops(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap, *values = NULL, *ops = NULL;
    if (!PyArg_ParseTuple(args, "O:network_ops", &cap))
        return NULL;
    const ptl_network *net = (const ptl_network *)PyCapsule_GetPointer(cap, NET_CAPSULE);
    if (!net) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "net: expected a network handle from network_create");
        return NULL;
    }
    values = PyList_New(net->nvalues);
    ops = values ? PyList_New(net->nops) : NULL;
    if (!ops)
        goto fail;
    for (int i = 0; i < net->nvalues; i++) {
        PyObject *t = Py_BuildValue("(ii)", net->values[i].C, net->values[i].down);
        if (!t)
            goto fail;
        PyList_SET_ITEM(values, i, t);
    }
    for (int i = 0; i < net->nops; i++) {
        PyObject *d = op_dict(&net->ops[i]);
        if (!d)
            goto fail;
        PyList_SET_ITEM(ops, i, d);
    }
    return Py_BuildValue("{s:i,s:N,s:(iii),s:i,s:d,s:N}", "input", net->input, "values", values, "strides",
                         net->stride[0], net->stride[1], net->stride[2], "num_classes", net->nc, "bn_eps",
                         (double)PTL_BN_EPS, "ops", ops);
fail:
    Py_XDECREF(values);
    Py_XDECREF(ops);
    return NULL;
}

static PyMethodDef methods[] = {
    {"network_ops", py_network_ops, METH_VARARGS,
     "network_ops(net) -> {'input', 'values': [(C, down)], 'strides', 'num_classes', 'bn_eps', 'ops': [dict]}: the op "
     "list the executor runs, in order."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_network_ops(PyObject *module) { return PyModule_AddFunctions(module, methods); }
