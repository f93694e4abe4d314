/* The CUDA-only test and benchmark bindings of the layers (compiled only in CUDA builds): the algorithms
 * of a CUDA convolution plan (the plans and their calls are ../nn/py_layers.c's layer_conv2d_*, one family
 * for both devices), the device's plan cache and its layer scratch. */
#include "../nn/py_layers.h"
#include "conv2d.h"
#include "conv2d_bn.h"
#include "device.h"
#include "layer_scratch.h"

/* layer_cuda_conv2d_plan_info(plan) -> dict: shapes, workspace bytes, algorithms, tensor-core use, the path
 * that runs it (ptl_conv2d_plan_path), whether its convolution with BatchNorm runs fused (conv2d_bn.h),
 * whether its backward data adds to dx in one call (ptl_conv2d_plan_adds_input_grad). */
static PyObject *py_conv2d_plan_info(PyObject *m, PyObject *po)
{
    (void)m;
    const ptl_py_conv_plan *pp = ptl_py_conv_plan_arg(po);
    if (!pp)
        return NULL;
    if (pp->device.type != PTL_CUDA)
        return PyErr_Format(PyExc_ValueError, "plan: expected a CUDA plan, got one for the CPU");
    const ptl_conv2d_plan *p = pp->plan;
    const ptl_conv2d_desc *d = ptl_conv2d_plan_desc(p);
    int algo[3], top[3];
    ptl_conv2d_plan_algos(p, algo, top);
    return Py_BuildValue("{s(iiii)s(iiii)snsss(iii)s(OOO)sssOsO}", "x_shape", d->n, d->h, d->w, d->cin, "y_shape",
                         d->n, d->ho, d->wo, d->cout, "workspace", (Py_ssize_t)ptl_conv2d_plan_workspace(p), "dtype",
                         ptl_dtype_name(ptl_conv2d_plan_dtype(p)), "algos", algo[0], algo[1], algo[2], "tensor_op",
                         top[0] ? Py_True : Py_False, top[1] ? Py_True : Py_False, top[2] ? Py_True : Py_False,
                         "path", ptl_conv2d_plan_path(p), "conv_bn_fused",
                         ptl_conv2d_bn_fused(p) ? Py_True : Py_False, "adds_input_grad",
                         ptl_conv2d_plan_adds_input_grad(p) ? Py_True : Py_False);
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
    {"layer_cuda_conv2d_plan_info", py_conv2d_plan_info, METH_O, "(plan from layer_conv2d_plan on CUDA) -> dict"},
    {"layer_cuda_reserve_scratch", py_reserve_scratch, METH_VARARGS, "(device_index, bytes)"},
    {"layer_cuda_conv2d_plan_cache", py_conv2d_plan_cache, METH_VARARGS, "(device_index) -> (held, made)"},
    {NULL, NULL, 0, NULL},
};

int ptl_register_conv2d_cuda(PyObject *module) { return PyModule_AddFunctions(module, methods); }
