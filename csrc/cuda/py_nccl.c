/* Python bindings of the NCCL communicator (nccl_comm.h): nccl_version, nccl_library, nccl_unique_id and
 * nccl_comm -> a _NcclComm object whose collectives take CUDA ptl.Tensors on its device. */
#include "dynload.h"
#include "py_nccl.h"

static PyObject *comm_type;

typedef struct {
    PyObject_HEAD
    ptl_nccl_comm *c;
    int device;
    PyObject *module;
} CommObject;

static void comm_dealloc(PyObject *self)
{
    CommObject *o = (CommObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    Py_BEGIN_ALLOW_THREADS
    ptl_nccl_comm_destroy(o->c);
    Py_END_ALLOW_THREADS
    Py_XDECREF(o->module);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static ptl_nccl_comm *comm_of(CommObject *o)
{
    if (!o->c)
        PyErr_SetString(PyExc_RuntimeError, "the NCCL communicator is closed");
    return o->c;
}

/* A float CUDA tensor on the communicator's device. */
static PtlTensor *device_tensor(CommObject *o, PyObject *obj)
{
    ptl_device dev = {PTL_CUDA, o->device};
    return ptl_tensor_arg(o->module, obj, "tensor", -1, &dev, -1, NULL);
}

static PyObject *comm_all_reduce(PyObject *self, PyObject *args)
{
    CommObject *o = (CommObject *)self;
    PyObject *obj;
    int rc;
    ptl_nccl_comm *c = comm_of(o);
    if (!c || !PyArg_ParseTuple(args, "O:all_reduce_", &obj))
        return NULL;
    PtlTensor *t = device_tensor(o, obj);
    if (!t)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_nccl_all_reduce_sum(c, ptl_tensor_data(t), ptl_tensor_numel(t), t->dtype);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(o->module);
    Py_RETURN_NONE;
}

static PyObject *comm_broadcast(PyObject *self, PyObject *args)
{
    CommObject *o = (CommObject *)self;
    PyObject *obj;
    int root = 0, rc;
    ptl_nccl_comm *c = comm_of(o);
    if (!c || !PyArg_ParseTuple(args, "O|i:broadcast_", &obj, &root))
        return NULL;
    PtlTensor *t = device_tensor(o, obj);
    if (!t)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_nccl_broadcast(c, ptl_tensor_data(t), ptl_tensor_numel(t), t->dtype, root);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(o->module);
    Py_RETURN_NONE;
}

static PyObject *comm_watch(PyObject *self, PyObject *unused)
{
    (void)unused;
    CommObject *o = (CommObject *)self;
    ptl_nccl_comm *c = comm_of(o);
    if (!c)
        return NULL;
    if (ptl_nccl_watch(c) != 0)
        return ptl_raise(o->module);
    Py_RETURN_NONE;
}

static PyObject *comm_check(PyObject *self, PyObject *unused)
{
    (void)unused;
    CommObject *o = (CommObject *)self;
    ptl_nccl_comm *c = comm_of(o);
    if (!c)
        return NULL;
    if (ptl_nccl_check(c) != 0)
        return ptl_raise(o->module);
    Py_RETURN_NONE;
}

static PyObject *comm_counts(PyObject *self, PyObject *unused)
{
    (void)unused;
    ptl_nccl_comm *c = comm_of((CommObject *)self);
    if (!c)
        return NULL;
    int64_t n[3];
    ptl_nccl_counts(c, n);
    return Py_BuildValue("{s:L,s:L,s:L}", "queued", (long long)n[0], "captured", (long long)n[1], "replays",
                         (long long)n[2]);
}

static PyObject *comm_abort(PyObject *self, PyObject *args)
{
    CommObject *o = (CommObject *)self;
    const char *why;
    if (!PyArg_ParseTuple(args, "s:abort", &why))
        return NULL;
    if (o->c) {
        Py_BEGIN_ALLOW_THREADS
        ptl_nccl_abort(o->c, why);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *comm_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    CommObject *o = (CommObject *)self;
    ptl_nccl_comm *c = o->c;
    o->c = NULL;
    Py_BEGIN_ALLOW_THREADS
    ptl_nccl_comm_destroy(c);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

ptl_nccl_comm *ptl_py_nccl_comm(PyObject *obj)
{
    if (!comm_type || !PyObject_TypeCheck(obj, (PyTypeObject *)comm_type)) {
        PyErr_Format(PyExc_TypeError, "expected a ptl._C._NcclComm, got %s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return comm_of((CommObject *)obj);
}

static PyMethodDef comm_methods[] = {
    {"all_reduce_", comm_all_reduce, METH_VARARGS,
     "all_reduce_(tensor): in place on the device's stream, the sum over ranks (enqueued, not waited for)."},
    {"broadcast_", comm_broadcast, METH_VARARGS, "broadcast_(tensor, root=0): in place, root's values everywhere."},
    {"watch", comm_watch, METH_NOARGS, "Start the watchdog's clock on the work queued so far (a replayed graph)."},
    {"check", comm_check, METH_NOARGS, "Raise ptl.CudaError if NCCL failed or the watchdog aborted."},
    {"counts", comm_counts, METH_NOARGS,
     "counts() -> {'queued', 'captured', 'replays'}: collectives queued on the stream or captured into a graph, "
     "and replays of such graphs watched."},
    {"abort", comm_abort, METH_VARARGS, "abort(why): end NCCL's kernels now; later calls fail with why."},
    {"close", comm_close, METH_NOARGS, "Finalize and free the communicator."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot comm_slots[] = {
    {Py_tp_dealloc, comm_dealloc},
    {Py_tp_methods, comm_methods},
    {Py_tp_doc, "An NCCL communicator of one rank (internal; use ptl.distributed)."},
    {0, NULL},
};
static PyType_Spec comm_spec = {"ptl._C._NcclComm", sizeof(CommObject), 0, Py_TPFLAGS_DEFAULT, comm_slots};

static PyObject *py_nccl_version(PyObject *module, PyObject *unused)
{
    (void)unused;
    int v, rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_nccl_version(&v);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(module);
    return PyLong_FromLong(v);
}

static PyObject *py_nccl_library(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    const char *p = ptl_nccl_library_path();
    if (!p)
        Py_RETURN_NONE;
    return PyUnicode_DecodeFSDefault(p);
}

static PyObject *py_nccl_unique_id(PyObject *module, PyObject *unused)
{
    (void)unused;
    uint8_t id[PTL_NCCL_ID_BYTES];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_nccl_unique_id(id);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(module);
    return PyBytes_FromStringAndSize((const char *)id, sizeof id);
}

/* Ctrl-C stops a communicator's creation (the other ranks' creation then times out or fails). */
typedef struct {
    PyThreadState *ts;
} signal_ctx;

static int signals_check(void *p, char *why, size_t cap)
{
    signal_ctx *c = p;
    PyEval_RestoreThread(c->ts);
    int stop = PyErr_CheckSignals() < 0;
    c->ts = PyEval_SaveThread();
    if (stop)
        snprintf(why, cap, "interrupted");
    return stop;
}

static PyObject *py_nccl_comm(PyObject *module, PyObject *args, PyObject *kw)
{
    static char *names[] = {"unique_id", "world", "rank", "device", "timeout", NULL};
    Py_buffer id;
    int world, rank, device, rc;
    double timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*iiid:nccl_comm", names, &id, &world, &rank, &device, &timeout))
        return NULL;
    if (id.len != PTL_NCCL_ID_BYTES) {
        PyBuffer_Release(&id);
        return PyErr_Format(PyExc_ValueError, "unique_id: expected %d bytes (from nccl_unique_id), got %zd",
                            PTL_NCCL_ID_BYTES, id.len);
    }
    ptl_nccl_comm *c = NULL;
    signal_ctx sc;
    ptl_dist_poll watch = {signals_check, &sc};
    sc.ts = PyEval_SaveThread();
    rc = ptl_nccl_comm_create(ptl_state(module)->rt, device, id.buf, world, rank, timeout, &watch, &c);
    PyEval_RestoreThread(sc.ts);
    PyBuffer_Release(&id);
    if (rc != 0) {
        if (PyErr_Occurred()) { /* Ctrl-C: the KeyboardInterrupt goes up */
            ptl_error_clear();
            return NULL;
        }
        return ptl_raise(module);
    }
    CommObject *o = PyObject_New(CommObject, (PyTypeObject *)comm_type);
    if (!o) {
        ptl_nccl_comm_destroy(c);
        return NULL;
    }
    o->c = c, o->device = device;
    Py_INCREF(module);
    o->module = module;
    return (PyObject *)o;
}

static PyMethodDef methods[] = {
    {"nccl_version", py_nccl_version, METH_NOARGS, "NCCL's version code (opens the library; no GPU needed)."},
    {"nccl_library", py_nccl_library, METH_NOARGS, "The NCCL file opened, or None before nccl_version()."},
    {"nccl_unique_id", py_nccl_unique_id, METH_NOARGS, "A new job's ncclUniqueId (rank 0 makes it), 128 bytes."},
    {"nccl_comm", (PyCFunction)(void (*)(void))py_nccl_comm, METH_VARARGS | METH_KEYWORDS,
     "nccl_comm(unique_id, world, rank, device, timeout) -> this rank's communicator on cuda:device."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_nccl(PyObject *module)
{
    if (!comm_type && !(comm_type = PyType_FromSpec(&comm_spec)))
        return -1;
    return PyModule_AddFunctions(module, methods);
}
