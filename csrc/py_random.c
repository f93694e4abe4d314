/* Bindings of the RNG and constant fills (csrc/ops/rng.h). */
#include "ops/rng.h"
#include "py.h"

#ifdef PTL_WITH_CUDA
#include "cuda/device.h"
#endif

static int is_float(ptl_dtype dt)
{
    return dt == PTL_FLOAT32 || dt == PTL_FLOAT64 || dt == PTL_FLOAT16 || dt == PTL_BFLOAT16;
}

/* _rng_fill(tensor, kind, seed, offset, a, b): kind 0 uniform [a, b), 1 normal (mean a, std b).
 * Returns the number of Philox blocks consumed. */
static PyObject *py_rng_fill(PyObject *module, PyObject *args)
{
    PyObject *tobj;
    int kind;
    unsigned long long seed, offset;
    float a, b;
    if (!PyArg_ParseTuple(args, "OiKKff:_rng_fill", &tobj, &kind, &seed, &offset, &a, &b))
        return NULL;
    PtlTensor *t = ptl_tensor_arg(module, tobj, "tensor", -1, NULL, -1, NULL);
    if (!t)
        return NULL;
    if (!is_float(t->dtype)) {
        PyErr_Format(PyExc_TypeError, "tensor: random fills need a floating-point dtype, got %s",
                     ptl_dtype_name(t->dtype));
        return NULL;
    }
    if (kind != PTL_RNG_UNIFORM && kind != PTL_RNG_NORMAL) {
        PyErr_Format(PyExc_ValueError, "kind: expected 0 (uniform) or 1 (normal), got %d", kind);
        return NULL;
    }
    int64_t n = ptl_tensor_numel(t);
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    if (t->storage->device.type == PTL_CPU) {
        rng_fill_cpu(ptl_tensor_data(t), t->dtype, n, (ptl_rng_kind)kind, seed, offset, a, b);
    } else {
#ifdef PTL_WITH_CUDA
        ptl_cuda_ctx *ctx;
        rc = ptl_cuda_ctx_get(ptl_state(module)->rt, t->storage->device.index, &ctx);
        if (rc == 0)
            rc = rng_fill_cuda(ctx->stream, ptl_tensor_data(t), t->dtype, n, (ptl_rng_kind)kind, seed, offset, a, b);
#endif
    }
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(module);
    return PyLong_FromUnsignedLongLong(ptl_rng_blocks(n));
}

/* _fill(tensor, value): every element set to value (converted by the cast rules). */
static PyObject *py_fill(PyObject *module, PyObject *args)
{
    PyObject *tobj;
    double value;
    if (!PyArg_ParseTuple(args, "Od:_fill", &tobj, &value))
        return NULL;
    PtlTensor *t = ptl_tensor_arg(module, tobj, "tensor", -1, NULL, -1, NULL);
    if (!t)
        return NULL;
    int64_t n = ptl_tensor_numel(t);
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    if (t->storage->device.type == PTL_CPU) {
        fill_cpu(ptl_tensor_data(t), t->dtype, n, value);
    } else {
#ifdef PTL_WITH_CUDA
        ptl_cuda_ctx *ctx;
        rc = ptl_cuda_ctx_get(ptl_state(module)->rt, t->storage->device.index, &ctx);
        if (rc == 0)
            rc = fill_cuda(ctx->stream, ptl_tensor_data(t), t->dtype, n, value);
#endif
    }
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(module);
    Py_RETURN_NONE;
}

static PyObject *py_philox(PyObject *module, PyObject *args)
{
    (void)module;
    unsigned int c0, c1, c2, c3, k0, k1;
    if (!PyArg_ParseTuple(args, "IIIIII:_philox4x32_10", &c0, &c1, &c2, &c3, &k0, &k1))
        return NULL;
    ptl_philox_block r = ptl_philox4x32_10(c0, c1, c2, c3, k0, k1);
    return Py_BuildValue("(kkkk)", (unsigned long)r.v[0], (unsigned long)r.v[1], (unsigned long)r.v[2],
                         (unsigned long)r.v[3]);
}

static PyMethodDef methods[] = {
    {"_rng_fill", py_rng_fill, METH_VARARGS, "Fill a float tensor from ptl's Philox stream (internal)."},
    {"_fill", py_fill, METH_VARARGS, "Fill a tensor with a constant (internal)."},
    {"_philox4x32_10", py_philox, METH_VARARGS, "One Philox4x32-10 block (counter c0..c3, key k0, k1)."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_random(PyObject *module) { return PyModule_AddFunctions(module, methods); }
