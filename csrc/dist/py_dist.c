/* Python bindings of the host collectives (dist.h): dist_listen, dist_join -> a _DistGroup object, and
 * ptl._C.DistributedError. Every wait runs with the GIL released; every PTL_DIST_POLL_MS it takes the GIL
 * back to honour Ctrl-C and to call the optional `watch()` (the launcher's check of its child ranks): an
 * exception there stops the wait, tells the peers why, and propagates. */
#include <unistd.h>

#include "py_dist.h"

/* One interpreter per process; module.c owns the module state layout. */
static PyObject *group_type, *dist_error;

typedef struct {
    PyObject_HEAD
    ptl_dist_group *g;
    PyObject *module;
    int busy; /* a call is waiting with the GIL released: the group is not for two threads at once */
} GroupObject;

/* Raises the pending ptl error: peer failures and timeouts as DistributedError, the rest as usual. */
static PyObject *raise_dist(PyObject *module)
{
    if (ptl_error_kind_get() == PTL_ERR_RUNTIME) {
        PyErr_SetString(dist_error, ptl_error_message());
        ptl_error_clear();
        return NULL;
    }
    return ptl_raise(module);
}

/* ---- waiting with the GIL released ---- */

typedef struct {
    PyThreadState *ts;
    PyObject *watch;                  /* None or a callable */
    PyObject *exc_type, *exc, *exc_tb; /* the exception that stopped the wait */
} wait_ctx;

static int wait_check(void *p, char *why, size_t cap)
{
    wait_ctx *c = p;
    PyEval_RestoreThread(c->ts);
    int stop = PyErr_CheckSignals() < 0;
    if (!stop && c->watch != Py_None) {
        PyObject *r = PyObject_CallNoArgs(c->watch);
        stop = r == NULL;
        Py_XDECREF(r);
    }
    if (stop) {
        PyErr_Fetch(&c->exc_type, &c->exc, &c->exc_tb);
        PyErr_NormalizeException(&c->exc_type, &c->exc, &c->exc_tb);
        PyObject *s = c->exc ? PyObject_Str(c->exc) : NULL;
        const char *text = s ? PyUnicode_AsUTF8(s) : NULL;
        snprintf(why, cap, "%s%s%s", c->exc ? Py_TYPE(c->exc)->tp_name : "interrupted", text && text[0] ? ": " : "",
                 text ? text : "");
        PyErr_Clear();
        Py_XDECREF(s);
    }
    c->ts = PyEval_SaveThread();
    return stop;
}

/* Runs call(g, arg) with the GIL released and watch checked. 0, or -1 with a Python exception set. */
typedef int (*group_call)(ptl_dist_group *g, void *arg, const ptl_dist_poll *watch);

static int run_waiting(PyObject *module, ptl_dist_group *g, PyObject *watch, group_call call, void *arg)
{
    if (watch != Py_None && !PyCallable_Check(watch)) {
        PyErr_SetString(PyExc_TypeError, "watch: expected None or a callable");
        return -1;
    }
    wait_ctx c = {NULL, watch, NULL, NULL, NULL};
    ptl_dist_poll poll = {wait_check, &c};
    c.ts = PyEval_SaveThread();
    int rc = call(g, arg, &poll);
    PyEval_RestoreThread(c.ts);
    if (c.exc_type) {
        PyErr_Restore(c.exc_type, c.exc, c.exc_tb);
        return -1;
    }
    if (rc != 0) {
        raise_dist(module);
        return -1;
    }
    return 0;
}

/* A method's call on the group: it must be open and not waiting in another thread. */
static int group_wait(GroupObject *o, PyObject *watch, group_call call, void *arg)
{
    if (!o->g) {
        PyErr_SetString(PyExc_RuntimeError, "ptl.distributed: the group is closed");
        return -1;
    }
    if (o->busy) {
        PyErr_SetString(PyExc_RuntimeError, "ptl.distributed: the group is already waiting in another thread");
        return -1;
    }
    o->busy = 1;
    int rc = run_waiting(o->module, o->g, watch, call, arg);
    o->busy = 0;
    return rc;
}

/* ---- buffers ---- */

/* A writable C-contiguous float32/float64 buffer (a NumPy array, or a CPU ptl.Tensor). */
typedef struct {
    Py_buffer view;
    int has_view;
    void *data;
    int64_t count;
    ptl_dtype dt;
} float_buf;

static int float_buf_get(PyObject *module, PyObject *obj, const char *arg, float_buf *b)
{
    memset(b, 0, sizeof *b);
    if (ptl_is_tensor(module, obj)) {
        PtlTensor *t = (PtlTensor *)obj;
        if (t->storage->device.type != PTL_CPU) {
            PyErr_Format(PyExc_ValueError, "%s: the host collective takes CPU buffers (CUDA ones go through NCCL)", arg);
            return -1;
        }
        b->data = ptl_tensor_data(t), b->count = ptl_tensor_numel(t), b->dt = t->dtype;
    } else {
        if (PyObject_GetBuffer(obj, &b->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            return -1;
        b->has_view = 1;
        const char *f = b->view.format ? b->view.format : "B";
        if (f[0] == '<' || f[0] == '=' || f[0] == '@')
            f++;
        b->dt = f[0] == 'f' && !f[1] ? PTL_FLOAT32 : f[0] == 'd' && !f[1] ? PTL_FLOAT64 : PTL_NUM_DTYPES;
        b->data = b->view.buf;
        b->count = b->dt < PTL_NUM_DTYPES ? (int64_t)(b->view.len / b->view.itemsize) : 0;
    }
    if (b->dt != PTL_FLOAT32 && b->dt != PTL_FLOAT64) {
        if (b->has_view)
            PyBuffer_Release(&b->view);
        PyErr_Format(PyExc_TypeError, "%s: expected a contiguous writable float32 or float64 buffer", arg);
        return -1;
    }
    return 0;
}

static void float_buf_release(float_buf *b)
{
    if (b->has_view)
        PyBuffer_Release(&b->view);
}

/* ---- the group object ---- */

static void group_dealloc(PyObject *self)
{
    GroupObject *o = (GroupObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    Py_BEGIN_ALLOW_THREADS
    ptl_dist_close(o->g);
    Py_END_ALLOW_THREADS
    Py_XDECREF(o->module);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static int call_barrier(ptl_dist_group *g, void *arg, const ptl_dist_poll *watch)
{
    (void)arg;
    return ptl_dist_barrier(g, watch);
}

static PyObject *group_barrier(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"watch", NULL};
    PyObject *watch = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:barrier", names, &watch) ||
        group_wait((GroupObject *)self, watch, call_barrier, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int call_all_reduce(ptl_dist_group *g, void *arg, const ptl_dist_poll *watch)
{
    float_buf *b = arg;
    return ptl_dist_all_reduce_sum(g, b->data, b->count, b->dt, watch);
}

ptl_dist_group *ptl_py_dist_group(PyObject *obj)
{
    if (!group_type || !PyObject_TypeCheck(obj, (PyTypeObject *)group_type)) {
        PyErr_Format(PyExc_TypeError, "expected a ptl._C._DistGroup, got %s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    GroupObject *o = (GroupObject *)obj;
    if (!o->g)
        PyErr_SetString(PyExc_RuntimeError, "ptl.distributed: the group is closed");
    return o->g;
}

ptl_dist_group *ptl_py_dist_acquire(PyObject *obj)
{
    ptl_dist_group *g = ptl_py_dist_group(obj);
    if (!g)
        return NULL;
    GroupObject *o = (GroupObject *)obj;
    if (o->busy) {
        PyErr_SetString(PyExc_RuntimeError, "ptl.distributed: the group is already waiting in another thread");
        return NULL;
    }
    o->busy = 1;
    return g;
}

void ptl_py_dist_release(PyObject *obj) { ((GroupObject *)obj)->busy = 0; }

PyObject *ptl_py_dist_raise(PyObject *module) { return raise_dist(module); }

static int all_reduce_watched(PyObject *group_obj, void *buf, int64_t count, ptl_dtype dt, PyObject *watch)
{
    if (!ptl_py_dist_group(group_obj))
        return -1;
    float_buf b = {.data = buf, .count = count, .dt = dt};
    return group_wait((GroupObject *)group_obj, watch, call_all_reduce, &b);
}

int ptl_py_dist_all_reduce(PyObject *group_obj, void *buf, int64_t count, ptl_dtype dt)
{
    return all_reduce_watched(group_obj, buf, count, dt, Py_None);
}

static PyObject *group_all_reduce(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"buffer", "watch", NULL};
    PyObject *obj, *watch = Py_None;
    float_buf b;
    GroupObject *o = (GroupObject *)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:all_reduce_", names, &obj, &watch) ||
        float_buf_get(o->module, obj, "buffer", &b) < 0)
        return NULL;
    int rc = all_reduce_watched(self, b.data, b.count, b.dt, watch);
    float_buf_release(&b);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

typedef struct {
    void *data;
    size_t n;
} raw_buf;

static int call_broadcast(ptl_dist_group *g, void *arg, const ptl_dist_poll *watch)
{
    raw_buf *b = arg;
    return ptl_dist_broadcast(g, b->data, b->n, watch);
}

static PyObject *group_broadcast(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"buffer", "watch", NULL};
    PyObject *obj, *watch = Py_None;
    Py_buffer view;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:broadcast_", names, &obj, &watch) ||
        PyObject_GetBuffer(obj, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    raw_buf b = {view.buf, (size_t)view.len};
    int rc = group_wait((GroupObject *)self, watch, call_broadcast, &b);
    PyBuffer_Release(&view);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

typedef struct {
    const void *data;
    size_t n;
    void *out;
    size_t out_n;
    size_t *sizes;
} blob_call;

static int call_broadcast_bytes(ptl_dist_group *g, void *arg, const ptl_dist_poll *watch)
{
    blob_call *b = arg;
    return ptl_dist_broadcast_bytes(g, b->data, b->n, &b->out, &b->out_n, watch);
}

static PyObject *group_broadcast_bytes(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"data", "watch", NULL};
    GroupObject *o = (GroupObject *)self;
    PyObject *obj = Py_None, *watch = Py_None;
    Py_buffer view = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:broadcast_bytes", names, &obj, &watch))
        return NULL;
    int is_root = o->g && ptl_dist_rank(o->g) == 0;
    if (is_root == (obj == Py_None)) {
        PyErr_SetString(PyExc_ValueError, is_root ? "broadcast_bytes: rank 0 must pass the data"
                                                  : "broadcast_bytes: only rank 0 passes data (the others pass None)");
        return NULL;
    }
    if (obj != Py_None && PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    blob_call b = {view.buf, (size_t)view.len, NULL, 0, NULL};
    int rc = group_wait(o, watch, call_broadcast_bytes, &b);
    if (obj != Py_None)
        PyBuffer_Release(&view);
    if (rc < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(b.out, (Py_ssize_t)b.out_n);
    free(b.out);
    return out;
}

static int call_all_gather(ptl_dist_group *g, void *arg, const ptl_dist_poll *watch)
{
    blob_call *b = arg;
    return ptl_dist_all_gather(g, b->data, b->n, &b->out, b->sizes, watch);
}

static int call_gather(ptl_dist_group *g, void *arg, const ptl_dist_poll *watch)
{
    blob_call *b = arg;
    return ptl_dist_gather(g, b->data, b->n, &b->out, b->sizes, watch);
}

/* all_gather / gather: every rank's bytes as a list in rank order; with root_only (gather), None on the
   ranks that receive nothing */
static PyObject *collect_blobs(PyObject *self, PyObject *args, PyObject *kw, const char *format,
                               int (*call)(ptl_dist_group *, void *, const ptl_dist_poll *), int root_only)
{
    static char *names[] = {"data", "watch", NULL};
    GroupObject *o = (GroupObject *)self;
    PyObject *obj, *watch = Py_None, *out = NULL;
    Py_buffer view;
    if (!PyArg_ParseTupleAndKeywords(args, kw, format, names, &obj, &watch) ||
        PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    int world = o->g ? ptl_dist_world(o->g) : 1;
    size_t *sizes = PyMem_Calloc((size_t)world, sizeof *sizes);
    if (!sizes) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    blob_call b = {view.buf, (size_t)view.len, NULL, 0, sizes};
    int rc = group_wait(o, watch, call, &b);
    PyBuffer_Release(&view);
    if (rc == 0 && root_only && !b.out) {
        out = Py_NewRef(Py_None);
    } else if (rc == 0 && (out = PyList_New(world))) {
        size_t off = 0;
        for (int r = 0; r < world; r++) {
            PyObject *item = PyBytes_FromStringAndSize((char *)b.out + off, (Py_ssize_t)sizes[r]);
            if (!item) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, r, item);
            off += sizes[r];
        }
    }
    free(b.out);
    PyMem_Free(sizes);
    return out;
}

static PyObject *group_all_gather(PyObject *self, PyObject *args, PyObject *kw)
{
    return collect_blobs(self, args, kw, "O|O:all_gather", call_all_gather, 0);
}

static PyObject *group_gather(PyObject *self, PyObject *args, PyObject *kw)
{
    return collect_blobs(self, args, kw, "O|O:gather", call_gather, 1);
}

static PyObject *group_abort(PyObject *self, PyObject *args)
{
    GroupObject *o = (GroupObject *)self;
    const char *reason;
    if (!PyArg_ParseTuple(args, "s:abort", &reason))
        return NULL;
    if (o->g && !o->busy) {
        ptl_dist_abort(o->g, reason);
        ptl_error_clear();
    }
    Py_RETURN_NONE;
}

static PyObject *group_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    GroupObject *o = (GroupObject *)self;
    if (o->busy) {
        PyErr_SetString(PyExc_RuntimeError, "ptl.distributed: the group is waiting in another thread");
        return NULL;
    }
    ptl_dist_group *g = o->g;
    o->g = NULL;
    Py_BEGIN_ALLOW_THREADS
    ptl_dist_close(g); /* a failed group lingers a moment so the peers read why */
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *group_info(PyObject *self, PyObject *unused)
{
    (void)unused;
    GroupObject *o = (GroupObject *)self;
    if (!o->g)
        return Py_BuildValue("{s:O}", "closed", Py_True);
    const char *broken = ptl_dist_broken(o->g);
    return Py_BuildValue("{s:O,s:i,s:i,s:d,s:K,s:z}", "closed", Py_False, "rank", ptl_dist_rank(o->g), "world",
                         ptl_dist_world(o->g), "timeout", ptl_dist_timeout(o->g), "sequence",
                         (unsigned long long)ptl_dist_sequence(o->g), "broken", broken);
}

static PyObject *group_set_timeout(PyObject *self, PyObject *args)
{
    GroupObject *o = (GroupObject *)self;
    double t;
    if (!PyArg_ParseTuple(args, "d:set_timeout", &t))
        return NULL;
    if (!o->g) {
        PyErr_SetString(PyExc_RuntimeError, "ptl.distributed: the group is closed");
        return NULL;
    }
    if (ptl_dist_set_timeout(o->g, t) != 0)
        return ptl_raise(o->module);
    Py_RETURN_NONE;
}

static PyMethodDef group_methods[] = {
    {"barrier", (PyCFunction)(void (*)(void))group_barrier, METH_VARARGS | METH_KEYWORDS,
     "barrier(watch=None): returns once every rank has called it."},
    {"all_reduce_", (PyCFunction)(void (*)(void))group_all_reduce, METH_VARARGS | METH_KEYWORDS,
     "all_reduce_(buffer, watch=None): in place, the sum over ranks added in rank order (float32/float64)."},
    {"broadcast_", (PyCFunction)(void (*)(void))group_broadcast, METH_VARARGS | METH_KEYWORDS,
     "broadcast_(buffer, watch=None): in place, rank 0's bytes (every rank passes the same size)."},
    {"broadcast_bytes", (PyCFunction)(void (*)(void))group_broadcast_bytes, METH_VARARGS | METH_KEYWORDS,
     "broadcast_bytes(data (rank 0) or None (others), watch=None) -> rank 0's bytes."},
    {"all_gather", (PyCFunction)(void (*)(void))group_all_gather, METH_VARARGS | METH_KEYWORDS,
     "all_gather(data, watch=None) -> [bytes of rank 0, rank 1, ...]."},
    {"gather", (PyCFunction)(void (*)(void))group_gather, METH_VARARGS | METH_KEYWORDS,
     "gather(data, watch=None) -> [bytes of rank 0, rank 1, ...] on rank 0, None on the others."},
    {"abort", group_abort, METH_VARARGS, "abort(reason): fail the job on purpose; the peers are told why."},
    {"close", group_close, METH_NOARGS, "Close the connections."},
    {"info", group_info, METH_NOARGS, "{closed, rank, world, timeout, sequence, broken}."},
    {"set_timeout", group_set_timeout, METH_VARARGS, "set_timeout(seconds)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot group_slots[] = {
    {Py_tp_dealloc, group_dealloc},
    {Py_tp_methods, group_methods},
    {Py_tp_doc, "A rendezvous group of ranks and its host collectives (internal; use ptl.distributed)."},
    {0, NULL},
};
static PyType_Spec group_spec = {"ptl._C._DistGroup", sizeof(GroupObject), 0, Py_TPFLAGS_DEFAULT, group_slots};

/* ---- module functions ---- */

static PyObject *dist_listen(PyObject *module, PyObject *args)
{
    int port, fd, bound, rc;
    if (!PyArg_ParseTuple(args, "i:dist_listen", &port))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_dist_listen(port, &fd, &bound);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(module);
    return Py_BuildValue("(ii)", fd, bound);
}

typedef struct {
    const char *host;
    int port, rank, world, listen_fd;
    double timeout;
    ptl_dist_group *out;
} join_call;

static int call_join(ptl_dist_group *unused, void *arg, const ptl_dist_poll *watch)
{
    (void)unused;
    join_call *j = arg;
    return ptl_dist_join(j->host, j->port, j->rank, j->world, j->timeout, j->listen_fd, watch, &j->out);
}

static PyObject *dist_join(PyObject *module, PyObject *args, PyObject *kw)
{
    static char *names[] = {"host", "port", "rank", "world", "timeout", "listen_fd", "watch", NULL};
    join_call j = {NULL, 0, 0, 0, -1, PTL_DIST_TIMEOUT_DEFAULT_S, NULL};
    PyObject *watch = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ziii|diO:dist_join", names, &j.host, &j.port, &j.rank, &j.world,
                                     &j.timeout, &j.listen_fd, &watch))
        return NULL;
    GroupObject *o = PyObject_New(GroupObject, (PyTypeObject *)group_type);
    if (!o) {
        if (j.listen_fd >= 0)
            close(j.listen_fd);
        return NULL;
    }
    Py_INCREF(module);
    o->module = module, o->g = NULL, o->busy = 0;
    if (run_waiting(module, NULL, watch, call_join, &j) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    o->g = j.out;
    return (PyObject *)o;
}

static PyMethodDef methods[] = {
    {"dist_listen", dist_listen, METH_VARARGS,
     "dist_listen(port) -> (fd, port): rank 0's listening socket (port 0: any free port)."},
    {"dist_join", (PyCFunction)(void (*)(void))dist_join, METH_VARARGS | METH_KEYWORDS,
     "dist_join(host, port, rank, world, timeout=DIST_TIMEOUT_S, listen_fd=-1, watch=None) -> group. Rank 0 "
     "admits the others (on listen_fd, which it closes, or on port), the others connect to host:port."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_dist(PyObject *module)
{
    if (!group_type && !(group_type = PyType_FromSpec(&group_spec)))
        return -1;
    if (!dist_error &&
        !(dist_error = PyErr_NewExceptionWithDoc(
              "ptl.DistributedError",
              "A rank of a distributed job failed, timed out or disagreed with the others; the message names the "
              "rank and the reason.",
              PyExc_RuntimeError, NULL)))
        return -1;
    PyObject *timeout = PyFloat_FromDouble(PTL_DIST_TIMEOUT_DEFAULT_S);
    int rc = timeout && PyModule_AddObjectRef(module, "DistributedError", dist_error) == 0 &&
                     PyModule_AddObjectRef(module, "DIST_TIMEOUT_S", timeout) == 0 &&
                     PyModule_AddIntConstant(module, "DIST_POLL_MS", PTL_DIST_POLL_MS) == 0
                 ? 0
                 : -1;
    Py_XDECREF(timeout);
    if (rc < 0)
        return -1;
    return PyModule_AddFunctions(module, methods);
}
