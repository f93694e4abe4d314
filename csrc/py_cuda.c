/* Bindings behind ptl.cuda: device queries, synchronisation, allocator statistics and private pools. */
#include "dynlib.h"
#include "py.h"
#include "runtime_impl.h"

#ifdef PTL_WITH_CUDA
#include "cuda/device.h"
#include "cuda/dynload.h"
#include "cuda/call_graph.h"
#endif

static PyObject *py_device_count(PyObject *module, PyObject *unused)
{
    (void)unused;
    return PyLong_FromLong(ptl_cuda_device_count(ptl_state(module)->rt));
}

#ifdef PTL_WITH_CUDA
/* The context of device `index` (created if needed), or NULL with an exception set. */
static ptl_cuda_ctx *ctx_arg(PyObject *module, int index)
{
    ptl_cuda_ctx *ctx = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_cuda_ctx_get(ptl_state(module)->rt, index, &ctx);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return (ptl_cuda_ctx *)ptl_raise(module);
    return ctx;
}

/* The same for a Python int argument. */
static ptl_cuda_ctx *ctx_of(PyObject *module, PyObject *arg)
{
    int index = (int)PyLong_AsLong(arg);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    return ctx_arg(module, index);
}
#endif

static PyObject *no_cuda(void)
{
    PyErr_SetString(PyExc_ValueError, "device: no CUDA device is available (ptl was built without CUDA: rebuild it "
                                      "with the CUDA toolkit's nvcc on PATH, see README's Install)");
    return NULL;
}

static PyObject *py_get_device_name(PyObject *module, PyObject *arg)
{
#ifdef PTL_WITH_CUDA
    ptl_cuda_ctx *ctx = ctx_of(module, arg);
    if (!ctx)
        return NULL;
    struct cudaDeviceProp prop;
    cudaError_t st = cudaGetDeviceProperties(&prop, ctx->device);
    if (st != cudaSuccess) {
        ptl_cuda_fail("cudaGetDeviceProperties", st);
        return ptl_raise(module);
    }
    return PyUnicode_FromString(prop.name);
#else
    (void)module;
    (void)arg;
    return no_cuda();
#endif
}

static PyObject *py_synchronize(PyObject *module, PyObject *arg)
{
#ifdef PTL_WITH_CUDA
    ptl_cuda_ctx *ctx = ctx_of(module, arg);
    if (!ctx)
        return NULL;
    cudaError_t st;
    Py_BEGIN_ALLOW_THREADS
    st = cudaStreamSynchronize(ctx->stream);
    if (st == cudaSuccess)
        st = cudaDeviceSynchronize();
    Py_END_ALLOW_THREADS
    if (st != cudaSuccess) {
        ptl_cuda_fail("cudaStreamSynchronize", st);
        return ptl_raise(module);
    }
    Py_RETURN_NONE;
#else
    (void)module;
    (void)arg;
    return no_cuda();
#endif
}

static PyObject *py_memory_stats(PyObject *module, PyObject *arg)
{
#ifdef PTL_WITH_CUDA
    ptl_cuda_ctx *ctx = ctx_of(module, arg);
    if (!ctx)
        return NULL;
    ptl_alloc_stats s;
    ptl_alloc_get_stats(ctx->alloc, &s);
    return Py_BuildValue("{sLsLsLsLsLsL}", "allocated", (long long)s.allocated, "max_allocated",
                         (long long)s.max_allocated, "reserved", (long long)s.reserved, "max_reserved",
                         (long long)s.max_reserved, "num_segments", (long long)s.num_segments, "num_alloc_retries",
                         (long long)s.num_alloc_retries);
#else
    (void)module;
    (void)arg;
    return no_cuda();
#endif
}

/* Whether kernel launches may start before the kernel ahead of them has finished (cuda/launch.cuh); made
 * for every device whose context exists, `index`'s included. */
static PyObject *py_early_launch(PyObject *module, PyObject *arg)
{
#ifdef PTL_WITH_CUDA
    if (!ctx_of(module, arg))
        return NULL;
    return PyBool_FromLong(ptl_cuda_pdl == 1);
#else
    (void)module;
    (void)arg;
    return no_cuda();
#endif
}

/* Whether calls repeated with the same pointers on a queue are relaunched as graphs (cuda/call_graph.h);
 * None leaves it, a bool sets it. Returns (previous setting, graphs made so far, graphs held now). */
static PyObject *py_call_graphs(PyObject *module, PyObject *arg)
{
    (void)module;
#ifdef PTL_WITH_CUDA
    int prev;
    if (arg == Py_None) {
        prev = ptl_call_graphs_enabled();
    } else {
        const int on = PyObject_IsTrue(arg);
        if (on < 0)
            return NULL;
        prev = ptl_call_graphs_set(on);
    }
    return Py_BuildValue("(OLL)", prev ? Py_True : Py_False, (long long)ptl_call_graphs_made(),
                         (long long)ptl_call_graphs_live());
#else
    (void)arg;
    return no_cuda();
#endif
}

/* Sets the limit of call graphs held and lets every graph go (tests of the flush); 0 restores the default.
 * Returns the previous limit. */
static PyObject *py_call_graphs_limit(PyObject *module, PyObject *arg)
{
    (void)module;
#ifdef PTL_WITH_CUDA
    const long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong((long long)ptl_call_graphs_set_limit((int64_t)n));
#else
    (void)arg;
    return no_cuda();
#endif
}

/* Allocator control: op 0 reset peaks, 1 empty cache, 2 create pool, 3 release pool `arg`,
 * 4 set current pool to `arg` (returns the previous one). */
static PyObject *py_allocator_op(PyObject *module, PyObject *args)
{
    int index, op, arg = 0;
    if (!PyArg_ParseTuple(args, "ii|i:_allocator_op", &index, &op, &arg))
        return NULL;
#ifdef PTL_WITH_CUDA
    ptl_cuda_ctx *ctx = ctx_arg(module, index);
    if (!ctx)
        return NULL;
    int rc = 0;
    switch (op) {
    case 0: ptl_alloc_reset_peak(ctx->alloc); break;
    case 1:
        Py_BEGIN_ALLOW_THREADS
        rc = ptl_alloc_empty_cache(ctx->alloc);
        Py_END_ALLOW_THREADS
        break;
    case 2:
        rc = ptl_alloc_pool_create(ctx->alloc);
        if (rc >= 0)
            return PyLong_FromLong(rc);
        break;
    case 3: rc = ptl_alloc_pool_release(ctx->alloc, arg); break;
    case 4:
        rc = ptl_alloc_current_pool(ctx->alloc);
        ptl_alloc_set_current_pool(ctx->alloc, arg);
        return PyLong_FromLong(rc);
    default: PyErr_Format(PyExc_ValueError, "op: unknown allocator operation %d", op); return NULL;
    }
    if (rc < 0)
        return ptl_raise(module);
    Py_RETURN_NONE;
#else
    (void)module;
    (void)index;
    (void)op;
    (void)arg;
    return no_cuda();
#endif
}

/* The folders searched for pip-installed CUDA libraries (ptl.cuda passes sys.path). */
static PyObject *py_set_library_roots(PyObject *module, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "roots: expected a sequence of folder names");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const char **roots = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof *roots);
    if (!roots) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        roots[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
        if (!roots[i]) {
            PyMem_Free(roots);
            Py_DECREF(seq);
            return NULL;
        }
    }
    int rc = ptl_dynlib_set_roots(roots, (int)n);
    PyMem_Free(roots);
    Py_DECREF(seq);
    if (rc != 0)
        return ptl_raise(module);
    Py_RETURN_NONE;
}

/* Opens a library the way the CUDA ones are opened (tests use it with libraries they build).
 * Arguments: name, soname, wheel_dir, package, extra, [symbols]; returns the file opened. */
static PyObject *py_dynlib_probe(PyObject *module, PyObject *args)
{
    const char *name, *soname, *wheel_dir, *package, *extra;
    PyObject *symbols;
    if (!PyArg_ParseTuple(args, "sssssO!:_dynlib_probe", &name, &soname, &wheel_dir, &package, &extra, &PyList_Type,
                          &symbols))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(symbols);
    const char **names = PyMem_Calloc((size_t)n + 1, sizeof *names);
    void **addresses = PyMem_Calloc((size_t)n + 1, sizeof *addresses);
    void ***slots = PyMem_Calloc((size_t)n + 1, sizeof *slots);
    PyObject *result = NULL;
    if (!names || !addresses || !slots) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        slots[i] = &addresses[i];
        if (!(names[i] = PyUnicode_AsUTF8(PyList_GET_ITEM(symbols, i))))
            goto done;
    }
    ptl_dynlib lib = {name, soname, {wheel_dir}, package, extra, names, (void **const *)slots};
    char path[1024];
    if (ptl_dynlib_open(&lib, path, sizeof path) != 0)
        ptl_raise(module);
    else
        result = PyUnicode_FromString(path);
done:
    PyMem_Free(names);
    PyMem_Free(addresses);
    PyMem_Free(slots);
    return result;
}

/* [(name, soname, pip package, file or None)] of the CUDA libraries; with load=True opens them first. */
static PyObject *py_cuda_libraries(PyObject *module, PyObject *arg)
{
#ifdef PTL_WITH_CUDA
    int load = PyObject_IsTrue(arg);
    if (load < 0)
        return NULL;
    if (load) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = ptl_cuda_libraries_load();
        Py_END_ALLOW_THREADS
        if (rc != 0)
            return ptl_raise(module);
    }
    int n = ptl_cuda_library_count();
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        const char *name, *soname, *package, *path;
        ptl_cuda_library_info(i, &name, &soname, &package, &path);
        PyObject *item = Py_BuildValue("(sssz)", name, soname, package, path);
        if (!item)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, item);
    }
    return out;
#else
    (void)module;
    (void)arg;
    return no_cuda();
#endif
}

/* cuBLAS's and cuDNN's names for their success status, through the forwarding functions (they load the
 * libraries on first call; no GPU needed): tests check that the forwarders reach the libraries. */
static PyObject *py_cuda_status_names(PyObject *module, PyObject *unused)
{
    (void)unused;
#ifdef PTL_WITH_CUDA
    const char *blas, *dnn;
    Py_BEGIN_ALLOW_THREADS
    blas = cublasGetStatusName(CUBLAS_STATUS_SUCCESS);
    dnn = cudnnGetErrorString(CUDNN_STATUS_SUCCESS);
    Py_END_ALLOW_THREADS
    (void)module;
    return Py_BuildValue("(ss)", blas, dnn);
#else
    (void)module;
    return no_cuda();
#endif
}

static PyMethodDef methods[] = {
    {"cuda_device_count", py_device_count, METH_NOARGS, "Number of usable CUDA devices (0 without driver/GPU)."},
    {"cuda_get_device_name", py_get_device_name, METH_O, "Name of CUDA device `index`."},
    {"cuda_synchronize", py_synchronize, METH_O, "Wait for all work queued on device `index`."},
    {"cuda_memory_stats", py_memory_stats, METH_O, "Caching-allocator statistics of device `index` (bytes)."},
    {"cuda_early_launch", py_early_launch, METH_O, "Whether kernels start early (programmatic dependent launch)."},
    {"cuda_call_graphs", py_call_graphs, METH_O,
     "(previous, made, held): calls repeated on a queue relaunched as graphs; None queries, a bool sets."},
    {"_cuda_call_graphs_limit", py_call_graphs_limit, METH_O,
     "Set the call graphs' limit and let them go (tests); 0: the default."},
    {"_allocator_op", py_allocator_op, METH_VARARGS, "Allocator control (internal; see ptl.cuda)."},
    {"_set_library_roots", py_set_library_roots, METH_O, "Folders searched for pip-installed CUDA libraries."},
    {"_dynlib_probe", py_dynlib_probe, METH_VARARGS, "Open a library as the CUDA ones are (tests)."},
    {"_cuda_status_names", py_cuda_status_names, METH_NOARGS, "cuBLAS's and cuDNN's success names (tests)."},
    {"cuda_libraries", py_cuda_libraries, METH_O, "[(name, soname, package, file)] of the run-time CUDA libraries."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_cuda(PyObject *module)
{
#ifdef PTL_WITH_CUDA
    if (PyModule_AddIntConstant(module, "CALL_GRAPHS_LIMIT", PTL_CALL_GRAPHS_LIMIT) < 0)
        return -1;
#endif
    return PyModule_AddFunctions(module, methods);
}
