/* Python bindings of the fast CPU backend (csrc/cpu/) that are not layer calls: ptl._C.cpu_* functions.
 * Its layers run through the layer bindings (../nn/py_layers.c: layer_*(..., cpu_kernels="fast"), its
 * convolutions with layer_conv2d_* on a plan from cpu_conv2d_plan). */
#include <string.h>

#include "../nn/py_layers.h"
#include "backend_cpu_fast.h"
#include "conv2d.h"
#include "threads.h"

static PyObject *py_cpu_threads(PyObject *m, PyObject *noargs)
{
    (void)m;
    (void)noargs;
    return PyLong_FromLong(ptl_cpu_threads());
}

static PyObject *py_cpu_conv2d_available(PyObject *m, PyObject *noargs)
{
    (void)m;
    (void)noargs;
    return PyBool_FromLong(ptl_cpu_conv2d_available());
}

/* cpu_conv2d_plan(n, h, w, cin, cout, k, stride, groups, weights="ohwi", bias=False, directions=7) -> a plan
 * of the fast backend for layer_conv2d_forward and the backwards, with the oneDNN options that the
 * executor's plans fix (OHWI weights, a bias, every direction). */
static PyObject *py_cpu_conv2d_plan(PyObject *m, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"n", "h", "w", "cin", "cout", "k", "stride", "groups", "weights", "bias", "directions",
                             NULL};
    int n, h, w, cin, cout, k, stride, groups, bias = 0, directions = PTL_CPU_CONV_ALL;
    const char *layout = "ohwi";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiiiiiii|spi:cpu_conv2d_plan", kwlist, &n, &h, &w, &cin, &cout, &k,
                                     &stride, &groups, &layout, &bias, &directions))
        return NULL;
    ptl_cpu_conv2d_opts o = {.bias = bias, .directions = directions};
    if (!strcmp(layout, "ohwi"))
        o.weights = PTL_CPU_WEIGHTS_OHWI;
    else if (!strcmp(layout, "oihw"))
        o.weights = PTL_CPU_WEIGHTS_OIHW;
    else
        return PyErr_Format(PyExc_ValueError, "weights: expected 'ohwi' or 'oihw', got '%s'", layout);
    ptl_py_conv_plan p = {.be = ptl_net_backend_cpu_fast(), .device = {PTL_CPU, 0}, .dt = PTL_FLOAT32,
                          .weights_oihw = o.weights == PTL_CPU_WEIGHTS_OIHW};
    ptl_cpu_conv2d_plan *plan;
    int rc;
    if (ptl_conv2d_init(&p.d, n, h, w, cin, cout, k, stride, groups))
        return ptl_raise(m);
    Py_BEGIN_ALLOW_THREADS rc = ptl_cpu_conv2d_plan_create(&p.d, &o, &plan);
    Py_END_ALLOW_THREADS if (rc) return ptl_raise(m);
    p.plan = plan;
    return ptl_py_conv_plan_new(&p);
}

/* cpu_conv2d_plan_info(plan) -> {"workspace": bytes, "forward": impl, "backward_input": impl,
 * "backward_weight": impl}: oneDNN's implementation of each direction of a cpu_conv2d_plan. */
static PyObject *py_cpu_conv2d_plan_info(PyObject *m, PyObject *po)
{
    (void)m;
    const ptl_py_conv_plan *p = ptl_py_conv_plan_arg(po);
    if (!p)
        return NULL;
    if (p->be != ptl_net_backend_cpu_fast())
        return PyErr_Format(PyExc_ValueError, "plan: expected a plan from cpu_conv2d_plan");
    return Py_BuildValue("{s:n,s:s,s:s,s:s}", "workspace", (Py_ssize_t)p->ws_bytes, "forward",
                         ptl_cpu_conv2d_plan_impl(p->plan, PTL_CPU_CONV_FORWARD), "backward_input",
                         ptl_cpu_conv2d_plan_impl(p->plan, PTL_CPU_CONV_BACKWARD_INPUT), "backward_weight",
                         ptl_cpu_conv2d_plan_impl(p->plan, PTL_CPU_CONV_BACKWARD_WEIGHT));
}

/* cpu_kernel_stats(reset=False) -> {entry: (seconds, calls)} of the fast backend's kernels since the last
 * reset (benchmarks); reset=True starts the totals again. */
static PyObject *py_cpu_kernel_stats(PyObject *m, PyObject *args, PyObject *kw)
{
    (void)m;
    static char *kwlist[] = {"reset", NULL};
    int reset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:cpu_kernel_stats", kwlist, &reset))
        return NULL;
    PyObject *d = PyDict_New();
    double secs;
    int64_t ncalls;
    const char *name;
    for (int e = 0; d && (name = ptl_cpu_fast_stats(e, &secs, &ncalls)); e++) {
        PyObject *v = Py_BuildValue("(dL)", secs, (long long)ncalls);
        if (!v || PyDict_SetItemString(d, name, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    if (d && reset)
        ptl_cpu_fast_stats_reset();
    return d;
}

static PyMethodDef methods[] = {
    {"cpu_threads", py_cpu_threads, METH_NOARGS, "() -> threads of ptl's CPU kernels in the calling thread"},
    {"cpu_conv2d_available", py_cpu_conv2d_available, METH_NOARGS, "() -> whether this build has oneDNN"},
    {"cpu_conv2d_plan", (PyCFunction)(void (*)(void))py_cpu_conv2d_plan, METH_VARARGS | METH_KEYWORDS,
     "(n, h, w, cin, cout, k, stride, groups, weights='ohwi', bias=False, directions=7) -> plan for layer_conv2d_*"},
    {"cpu_conv2d_plan_info", py_cpu_conv2d_plan_info, METH_O, "(plan) -> workspace bytes and oneDNN impls"},
    {"cpu_kernel_stats", (PyCFunction)(void (*)(void))py_cpu_kernel_stats, METH_VARARGS | METH_KEYWORDS,
     "(reset=False) -> {entry: (seconds, calls)} of the fast backend's kernels since the last reset (benchmarks)"},
    {NULL, NULL, 0, NULL},
};

int ptl_register_cpu(PyObject *module) { return PyModule_AddFunctions(module, methods); }
