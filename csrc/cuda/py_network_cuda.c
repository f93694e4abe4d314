/* Python bindings of the CUDA network executor (network_cuda.h) behind a capsule. Parameters,
 * gradients, BN buffers and head outputs cross as ptl.Tensors that alias the network's device memory
 * (they keep the network alive); head outputs are overwritten by the next forward. */
#include "../py.h"

#include <string.h>

#include "network_cuda.h"

#define NETC_CAPSULE "ptl.network_cuda"
#define NET_CPU_CAPSULE "ptl.network" /* csrc/nn/py_nn.c */

static void netc_capsule_free(PyObject *cap)
{
    ptl_network_cuda_free((ptl_network_cuda *)PyCapsule_GetPointer(cap, NETC_CAPSULE));
}

static ptl_network_cuda *netc_arg(PyObject *obj)
{
    ptl_network_cuda *net = (ptl_network_cuda *)PyCapsule_GetPointer(obj, NETC_CAPSULE);
    if (!net) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "net: expected a CUDA network handle from network_cuda_create");
    }
    return net;
}

static ptl_network *cpu_arg(PyObject *obj)
{
    ptl_network *net = (ptl_network *)PyCapsule_GetPointer(obj, NET_CPU_CAPSULE);
    if (!net) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "cpu_net: expected a network handle from network_create");
    }
    return net;
}

static ptl_device dev_of(const ptl_network_cuda *net) { return (ptl_device){PTL_CUDA, ptl_network_cuda_device(net)}; }

static PyObject *py_create(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"cpu_net", "device", "dtype", NULL};
    PyObject *cpu_cap;
    int device = 0;
    const char *dtname = "float32";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|is:network_cuda_create", kwlist, &cpu_cap, &device, &dtname))
        return NULL;
    ptl_network *cpu = cpu_arg(cpu_cap);
    if (!cpu)
        return NULL;
    int dt = ptl_dtype_from_name(dtname);
    if (dt != PTL_FLOAT32 && dt != PTL_BFLOAT16 && dt != PTL_FLOAT16)
        return PyErr_Format(PyExc_ValueError, "dtype: expected 'float32', 'bfloat16' or 'float16', got '%s'", dtname);
    ptl_runtime *rt = ptl_state(self)->rt;
    ptl_network_cuda *net;
    Py_BEGIN_ALLOW_THREADS;
    net = ptl_network_cuda_create(rt, cpu, device, (ptl_dtype)dt);
    Py_END_ALLOW_THREADS;
    if (!net)
        return ptl_raise(self);
    PyObject *cap = PyCapsule_New(net, NETC_CAPSULE, netc_capsule_free);
    if (!cap)
        ptl_network_cuda_free(net);
    return cap;
}

static PyObject *py_copy(PyObject *self, PyObject *args)
{
    PyObject *cap, *cpu_cap;
    const char *which;
    int to_device;
    if (!PyArg_ParseTuple(args, "OOsp:network_cuda_copy", &cap, &cpu_cap, &which, &to_device))
        return NULL;
    ptl_network_cuda *net = netc_arg(cap);
    ptl_network *cpu = net ? cpu_arg(cpu_cap) : NULL;
    if (!cpu)
        return NULL;
    if (strcmp(which, "params") && strcmp(which, "grads") && strcmp(which, "buffers"))
        return PyErr_Format(PyExc_ValueError, "which: expected 'params', 'grads' or 'buffers', got '%s'", which);
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_network_cuda_copy(net, cpu, which, to_device);
    Py_END_ALLOW_THREADS;
    if (rc)
        return ptl_raise(self);
    Py_RETURN_NONE;
}

static PyObject *wrap_flat(PyObject *self, PyObject *cap, ptl_network_cuda *net, void *ptr, int64_t n)
{
    int64_t shape[1] = {n};
    return (PyObject *)ptl_tensor_wrap(self, ptr, dev_of(net), 1, shape, PTL_FLOAT32, cap);
}

/* (params, grads, buffers): 1-D float32 tensors over the flat device storage. */
static PyObject *py_tensors(PyObject *self, PyObject *args)
{
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O:network_cuda_tensors", &cap))
        return NULL;
    ptl_network_cuda *net = netc_arg(cap);
    if (!net)
        return NULL;
    PyObject *p = wrap_flat(self, cap, net, ptl_network_cuda_params(net), ptl_network_cuda_num_params(net));
    PyObject *g = p ? wrap_flat(self, cap, net, ptl_network_cuda_grads(net), ptl_network_cuda_num_params(net)) : NULL;
    PyObject *b = g ? wrap_flat(self, cap, net, ptl_network_cuda_buffers(net), ptl_network_cuda_num_buffers(net))
                    : NULL;
    if (!b) {
        Py_XDECREF(p);
        Py_XDECREF(g);
        return NULL;
    }
    return Py_BuildValue("(NNN)", p, g, b);
}

static PyObject *py_zero_grad(PyObject *self, PyObject *args)
{
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O:network_cuda_zero_grad", &cap))
        return NULL;
    ptl_network_cuda *net = netc_arg(cap);
    if (!net)
        return NULL;
    if (ptl_network_cuda_zero_grad(net))
        return ptl_raise(self);
    Py_RETURN_NONE;
}

static PyObject *py_set_training(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    int flag;
    if (!PyArg_ParseTuple(args, "Op:network_cuda_set_training", &cap, &flag))
        return NULL;
    ptl_network_cuda *net = netc_arg(cap);
    if (!net)
        return NULL;
    ptl_network_cuda_set_training(net, flag);
    Py_RETURN_NONE;
}

static PyObject *py_set_conv_options(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"net", "deterministic", "allow_tf32", "find", NULL};
    PyObject *cap;
    int det = 1, tf32 = 0, find = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|ppp:network_cuda_set_conv_options", kwlist, &cap, &det, &tf32,
                                     &find))
        return NULL;
    ptl_network_cuda *net = netc_arg(cap);
    if (!net)
        return NULL;
    ptl_network_cuda_set_conv_options(net, det, tf32, find);
    Py_RETURN_NONE;
}

static PyObject *py_prepare(PyObject *self, PyObject *args)
{
    PyObject *cap;
    int B, H, W;
    if (!PyArg_ParseTuple(args, "Oiii:network_cuda_prepare", &cap, &B, &H, &W))
        return NULL;
    ptl_network_cuda *net = netc_arg(cap);
    if (!net)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_network_cuda_prepare(net, B, H, W);
    Py_END_ALLOW_THREADS;
    if (rc)
        return ptl_raise(self);
    Py_RETURN_NONE;
}

/* The four float32 head outputs of the current shape as tensors over the network's buffers. */
static PyObject *outputs(PyObject *self, PyObject *cap, ptl_network_cuda *net)
{
    int B, H, W;
    int64_t A;
    ptl_network_cuda_shape(net, &B, &H, &W, &A);
    PyObject *o[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++) {
        int64_t shape[3] = {B, A, i % 2 ? ptl_network_cuda_num_classes(net) : 4};
        o[i] = (PyObject *)ptl_tensor_wrap(self, ptl_network_cuda_output(net, i / 2, i % 2), dev_of(net), 3, shape,
                                           PTL_FLOAT32, cap);
        if (!o[i]) {
            for (int j = 0; j < i; j++)
                Py_DECREF(o[j]);
            return NULL;
        }
    }
    return Py_BuildValue("(NNNN)", o[0], o[1], o[2], o[3]);
}

/* images: (B, H, W, 3) on the network's device in its compute dtype. */
static PtlTensor *images_arg(PyObject *self, ptl_network_cuda *net, PyObject *img, int *B, int *H, int *W)
{
    ptl_device dev = dev_of(net);
    int64_t ishape[4] = {-1, -1, -1, 3};
    PtlTensor *t = ptl_tensor_arg(self, img, "images", (int)ptl_network_cuda_dtype(net), &dev, 4, ishape);
    if (t) {
        *B = (int)t->shape[0];
        *H = (int)t->shape[1];
        *W = (int)t->shape[2];
    }
    return t;
}

/* forward(net, images (B, H, W, 3) on the network's device in its compute dtype)
 *   -> (boxes_o2m, scores_o2m, boxes_o2o, scores_o2o), float32 views overwritten by the next forward. */
static PyObject *py_forward(PyObject *self, PyObject *args)
{
    PyObject *cap, *img;
    int B, H, W;
    if (!PyArg_ParseTuple(args, "OO:network_cuda_forward", &cap, &img))
        return NULL;
    ptl_network_cuda *net = netc_arg(cap);
    PtlTensor *t = net ? images_arg(self, net, img, &B, &H, &W) : NULL;
    if (!t)
        return NULL;
    const void *data = ptl_tensor_data(t);
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_network_cuda_forward(net, data, B, H, W);
    Py_END_ALLOW_THREADS;
    if (rc)
        return ptl_raise(self);
    return outputs(self, cap, net);
}

/* The four output gradients (float32 device tensors shaped like the outputs, or None = zero) as pointers. */
static int d_out_args(PyObject *self, ptl_network_cuda *net, PyObject *const d[4], const void *ptrs[2][2])
{
    static const char *names[4] = {"d_boxes", "d_scores", "d_boxes_o2o", "d_scores_o2o"};
    int B, H, W;
    int64_t A;
    ptl_network_cuda_shape(net, &B, &H, &W, &A);
    ptl_device dev = dev_of(net);
    for (int i = 0; i < 4; i++) {
        ptrs[i / 2][i % 2] = NULL;
        if (d[i] == Py_None)
            continue;
        int64_t shape[3] = {B, A, i % 2 ? ptl_network_cuda_num_classes(net) : 4};
        PtlTensor *t = ptl_tensor_arg(self, d[i], names[i], PTL_FLOAT32, &dev, 3, shape);
        if (!t)
            return -1;
        ptrs[i / 2][i % 2] = ptl_tensor_data(t);
    }
    return 0;
}

/* backward(net, d_boxes, d_scores, d_boxes_o2o, d_scores_o2o, input_grad=False): float32 tensors on the
 * device shaped like the outputs, or None (zero). Parameter gradients accumulate; returns d images
 * (B, H, W, 3) in the compute dtype, or None. */
static PyObject *py_backward(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"net", "d_boxes", "d_scores", "d_boxes_o2o", "d_scores_o2o", "input_grad", NULL};
    PyObject *cap, *d[4];
    int want = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|p:network_cuda_backward", kwlist, &cap, &d[0], &d[1], &d[2],
                                     &d[3], &want))
        return NULL;
    ptl_network_cuda *net = netc_arg(cap);
    if (!net)
        return NULL;
    if (!ptl_network_cuda_have_forward(net)) {
        PyErr_SetString(PyExc_RuntimeError, "network_cuda_backward: run a forward first");
        return NULL;
    }
    const void *ptrs[2][2];
    if (d_out_args(self, net, d, ptrs) < 0)
        return NULL;
    PtlTensor *dimg = NULL;
    if (want) {
        int B, H, W;
        int64_t A;
        ptl_network_cuda_shape(net, &B, &H, &W, &A);
        int64_t shape[4] = {B, H, W, 3};
        dimg = ptl_tensor_empty(self, 4, shape, ptl_network_cuda_dtype(net), dev_of(net));
        if (!dimg)
            return NULL;
    }
    void *dptr = dimg ? ptl_tensor_data(dimg) : NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_network_cuda_backward(net, ptrs, dptr);
    Py_END_ALLOW_THREADS;
    if (rc) {
        Py_XDECREF(dimg);
        return ptl_raise(self);
    }
    if (!dimg)
        Py_RETURN_NONE;
    return (PyObject *)dimg;
}

/* record(net, images, d_boxes, d_scores, d_boxes_o2o, d_scores_o2o): captures one forward + backward
 * (not run) for replay; the caller keeps every tensor alive and in place while the recording lives. */
static PyObject *py_record(PyObject *self, PyObject *args)
{
    PyObject *cap, *img, *d[4];
    int B, H, W;
    if (!PyArg_ParseTuple(args, "OOOOOO:network_cuda_record", &cap, &img, &d[0], &d[1], &d[2], &d[3]))
        return NULL;
    ptl_network_cuda *net = netc_arg(cap);
    PtlTensor *t = net ? images_arg(self, net, img, &B, &H, &W) : NULL;
    if (!t)
        return NULL;
    const void *ptrs[2][2];
    if (d_out_args(self, net, d, ptrs) < 0)
        return NULL;
    const void *data = ptl_tensor_data(t);
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_network_cuda_record(net, data, B, H, W, ptrs);
    Py_END_ALLOW_THREADS;
    if (rc)
        return ptl_raise(self);
    Py_RETURN_NONE;
}

/* replay(net, part="both"|"forward"|"backward"): runs the recording; returns the head outputs like forward
 * (None for "backward"). */
static PyObject *py_replay(PyObject *self, PyObject *args)
{
    PyObject *cap;
    const char *part_name = "both";
    if (!PyArg_ParseTuple(args, "O|s:network_cuda_replay", &cap, &part_name))
        return NULL;
    ptl_network_cuda *net = netc_arg(cap);
    if (!net)
        return NULL;
    int part = !strcmp(part_name, "both") ? PTL_REPLAY_BOTH
               : !strcmp(part_name, "forward") ? PTL_REPLAY_FORWARD
               : !strcmp(part_name, "backward") ? PTL_REPLAY_BACKWARD
                                                : -1;
    if (part < 0)
        return PyErr_Format(PyExc_ValueError, "part: expected 'both', 'forward' or 'backward', got '%s'", part_name);
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_network_cuda_replay(net, part);
    Py_END_ALLOW_THREADS;
    if (rc)
        return ptl_raise(self);
    if (part == PTL_REPLAY_BACKWARD)
        Py_RETURN_NONE;
    return outputs(self, cap, net);
}

static PyObject *py_retire(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O:network_cuda_retire", &cap))
        return NULL;
    ptl_network_cuda *net = netc_arg(cap);
    if (!net)
        return NULL;
    ptl_network_cuda_retire(net);
    Py_RETURN_NONE;
}

static PyObject *py_info(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O:network_cuda_info", &cap))
        return NULL;
    ptl_network_cuda *net = netc_arg(cap);
    if (!net)
        return NULL;
    int B, H, W;
    int64_t A, fixed, shape;
    ptl_network_cuda_shape(net, &B, &H, &W, &A);
    ptl_network_cuda_memory(net, &fixed, &shape);
    return Py_BuildValue("{s:i,s:s,s:i,s:L,s:(iii),s:L,s:L,s:L,s:O}", "device", ptl_network_cuda_device(net), "dtype",
                         ptl_dtype_name(ptl_network_cuda_dtype(net)), "training", ptl_network_cuda_training(net),
                         "num_parameters", (long long)ptl_network_cuda_num_params(net), "batch_shape", B, H, W,
                         "anchors", (long long)A, "fixed_bytes", (long long)fixed, "shape_bytes", (long long)shape,
                         "recorded", ptl_network_cuda_recorded(net) ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"network_cuda_record", py_record, METH_VARARGS,
     "network_cuda_record(net, images, d_boxes, d_scores, d_boxes_o2o, d_scores_o2o): capture one forward + "
     "backward (not run) for replay, after an eager warm-up of the same shape."},
    {"network_cuda_replay", py_replay, METH_VARARGS,
     "network_cuda_replay(net, part='both') -> head outputs (None for 'backward'): run the recorded forward, "
     "backward or both, one launch each."},
    {"network_cuda_retire", py_retire, METH_VARARGS, "network_cuda_retire(net): drop the recording."},
    {"network_cuda_create", (PyCFunction)(void (*)(void))py_create, METH_VARARGS | METH_KEYWORDS,
     "network_cuda_create(cpu_net, device=0, dtype='float32') -> handle of the CUDA executor of a CPU network "
     "(its parameters and BN buffers are uploaded)."},
    {"network_cuda_copy", py_copy, METH_VARARGS,
     "network_cuda_copy(net, cpu_net, 'params'|'grads'|'buffers', to_device): synchronous flat copy."},
    {"network_cuda_tensors", py_tensors, METH_VARARGS,
     "network_cuda_tensors(net) -> (params, grads, buffers) float32 device tensors over the flat storage."},
    {"network_cuda_zero_grad", py_zero_grad, METH_VARARGS, "network_cuda_zero_grad(net): grads = 0 (asynchronous)."},
    {"network_cuda_set_training", py_set_training, METH_VARARGS, "network_cuda_set_training(net, flag)."},
    {"network_cuda_set_conv_options", (PyCFunction)(void (*)(void))py_set_conv_options, METH_VARARGS | METH_KEYWORDS,
     "network_cuda_set_conv_options(net, deterministic=True, allow_tf32=False, find=False): applies at the next "
     "prepare."},
    {"network_cuda_prepare", py_prepare, METH_VARARGS,
     "network_cuda_prepare(net, B, H, W): allocate buffers and make conv plans for this shape."},
    {"network_cuda_forward", py_forward, METH_VARARGS,
     "network_cuda_forward(net, images NHWC device tensor in the compute dtype) -> 4 float32 head outputs."},
    {"network_cuda_backward", (PyCFunction)(void (*)(void))py_backward, METH_VARARGS | METH_KEYWORDS,
     "network_cuda_backward(net, d_boxes, d_scores, d_boxes_o2o, d_scores_o2o, input_grad=False) -> d images or "
     "None; parameter gradients accumulate."},
    {"network_cuda_info", py_info, METH_VARARGS, "network_cuda_info(net) -> dict."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_network_cuda(PyObject *module)
{
    return PyModule_AddFunctions(module, methods);
}
