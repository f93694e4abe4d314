/* ptl._C: module definition and state. Each area's binding file registers its own functions. */
#include "py.h"
#ifdef PTL_WITH_CUDA
#include "cuda/device.h"
#endif

typedef int (*ptl_register_fn)(PyObject *module);

int ptl_register_objective(PyObject *module);
int ptl_register_optim(PyObject *module);
int ptl_register_data(PyObject *module);
int ptl_register_nn(PyObject *module);
int ptl_register_executor(PyObject *module);
int ptl_register_metrics(PyObject *module);
int ptl_register_layers(PyObject *module);
int ptl_register_io(PyObject *module);
int ptl_register_train(PyObject *module);
int ptl_register_network_ops(PyObject *module);
int ptl_register_dist(PyObject *module);
int ptl_register_cpu(PyObject *module);
#ifdef PTL_WITH_CUDA
int ptl_register_conv2d_cuda(PyObject *module);
int ptl_register_nccl(PyObject *module);
#endif

static const ptl_register_fn registrations[] = {
    ptl_register_tensor, ptl_register_cuda,   ptl_register_random, ptl_register_objective,
    ptl_register_optim,  ptl_register_data,   ptl_register_nn,     ptl_register_executor, ptl_register_metrics,
    ptl_register_layers, ptl_register_io,     ptl_register_train,  ptl_register_network_ops,
    ptl_register_dist,   ptl_register_cpu,
#ifdef PTL_WITH_CUDA
    ptl_register_conv2d_cuda, ptl_register_nccl,
#endif
};

ptl_module_state *ptl_state(PyObject *module) { return (ptl_module_state *)PyModule_GetState(module); }

int ptl_py_exec_ctx(PyObject *module, ptl_device dev, struct ptl_cuda_ctx **out)
{
    *out = NULL;
    if (dev.type == PTL_CPU)
        return 0;
#ifdef PTL_WITH_CUDA
    ptl_runtime *rt = ptl_state(module)->rt; /* Python API: read before the GIL is released */
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_cuda_ctx_get(rt, dev.index, out);
    Py_END_ALLOW_THREADS
    return rc ? ptl_raise_int(module) : 0;
#else
    (void)module;
    PyErr_Format(PyExc_ValueError, "device: 'cuda:%d' requested but ptl was built without CUDA", dev.index);
    return -1;
#endif
}

static int module_exec(PyObject *m)
{
    ptl_module_state *st = ptl_state(m);
    st->rt = ptl_runtime_create();
    if (!st->rt) {
        PyErr_NoMemory();
        return -1;
    }
    st->cuda_error = PyErr_NewExceptionWithDoc(
        "ptl.CudaError",
        "A CUDA runtime, cuBLAS or cuDNN call failed; the message names the call and its status.",
        PyExc_RuntimeError, NULL);
    if (!st->cuda_error || PyModule_AddObjectRef(m, "CudaError", st->cuda_error) < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "WITH_CUDA",
#ifdef PTL_WITH_CUDA
                                1
#else
                                0
#endif
                                ) < 0)
        return -1;
    for (size_t i = 0; i < sizeof registrations / sizeof registrations[0]; i++)
        if (registrations[i](m) < 0)
            return -1;
    return 0;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    ptl_module_state *st = ptl_state(m);
    Py_VISIT(st->tensor_type);
    Py_VISIT(st->cuda_error);
    return 0;
}

static int module_clear(PyObject *m)
{
    ptl_module_state *st = ptl_state(m);
    Py_CLEAR(st->tensor_type);
    Py_CLEAR(st->cuda_error);
    return 0;
}

static void module_free(void *m)
{
    ptl_module_state *st = ptl_state((PyObject *)m);
    module_clear((PyObject *)m);
    if (st->rt) {
        ptl_runtime_release(st->rt);
        st->rt = NULL;
    }
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

struct PyModuleDef ptl_moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ptl._C",
    .m_doc = "ptl's C extension: tensors, CUDA runtime, kernels, network, objective, optimizer, data.",
    .m_size = sizeof(ptl_module_state),
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&ptl_moduledef); }
