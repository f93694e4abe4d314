/* ptl.Tensor: a contiguous, typed view of refcounted storage on one device; NumPy interop; errors. */
#define PTL_NUMPY_IMPORT
#include "py.h"

#include "numpy_api.h"

static const struct {
    ptl_dtype dt;
    int npy;
} npy_map[] = {
    {PTL_FLOAT32, NPY_FLOAT32}, {PTL_FLOAT64, NPY_FLOAT64}, {PTL_FLOAT16, NPY_FLOAT16},
    {PTL_INT32, NPY_INT32},     {PTL_INT64, NPY_INT64},     {PTL_UINT8, NPY_UINT8},
};

int ptl_dtype_to_npy(ptl_dtype dt)
{
    for (size_t i = 0; i < sizeof npy_map / sizeof npy_map[0]; i++)
        if (npy_map[i].dt == dt)
            return npy_map[i].npy;
    return -1;
}

int ptl_dtype_from_npy(int type_num)
{
    for (size_t i = 0; i < sizeof npy_map / sizeof npy_map[0]; i++)
        if (PyArray_EquivTypenums(npy_map[i].npy, type_num))
            return (int)npy_map[i].dt;
    return -1;
}

static const char DTYPES_EXPECTED[] = "float32, float64, float16, bfloat16, int32, int64 or uint8";

/* ------------------------------------------------------------------ errors */

PyObject *ptl_raise(PyObject *module)
{
    ptl_error_kind kind = ptl_error_kind_get();
    const char *msg = ptl_error_message();
    PyObject *exc;
    switch (kind) {
    case PTL_ERR_VALUE: exc = PyExc_ValueError; break;
    case PTL_ERR_TYPE: exc = PyExc_TypeError; break;
    case PTL_ERR_MEMORY: exc = PyExc_MemoryError; break;
    case PTL_ERR_INDEX: exc = PyExc_IndexError; break;
    case PTL_ERR_KEY: exc = PyExc_KeyError; break;
    case PTL_ERR_OS: exc = PyExc_OSError; break;
    case PTL_ERR_CUDA: exc = ptl_state(module)->cuda_error; break;
    case PTL_ERR_RUNTIME: exc = PyExc_RuntimeError; break;
    default:
        if (PyErr_Occurred())
            return NULL;
        exc = PyExc_RuntimeError;
        msg = "ptl: operation failed without an error message";
    }
    PyErr_SetString(exc, msg);
    ptl_error_clear();
    return NULL;
}

int ptl_raise_int(PyObject *module)
{
    ptl_raise(module);
    return -1;
}

/* ------------------------------------------------------------------ argument parsing */

int ptl_parse_device(PyObject *obj, const char *arg, ptl_device *out)
{
    if (obj == NULL || obj == Py_None) {
        *out = (ptl_device){PTL_CPU, 0};
        return 0;
    }
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a device string ('cpu', 'cuda' or 'cuda:N'), got %.100s", arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char *s = PyUnicode_AsUTF8(obj);
    if (!s)
        return -1;
    if (strcmp(s, "cpu") == 0) {
        *out = (ptl_device){PTL_CPU, 0};
        return 0;
    }
    if (strcmp(s, "cuda") == 0) {
        *out = (ptl_device){PTL_CUDA, 0};
        return 0;
    }
    if (strncmp(s, "cuda:", 5) == 0 && s[5] >= '0' && s[5] <= '9') {
        char *end;
        long idx = strtol(s + 5, &end, 10);
        if (*end == 0 && idx < 1024) {
            *out = (ptl_device){PTL_CUDA, (int)idx};
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "%s: unknown device %R (expected 'cpu', 'cuda' or 'cuda:N')", arg, obj);
    return -1;
}

PyObject *ptl_device_str(ptl_device dev)
{
    if (dev.type == PTL_CPU)
        return PyUnicode_FromString("cpu");
    return PyUnicode_FromFormat("cuda:%d", dev.index);
}

int ptl_parse_dtype(PyObject *obj, const char *arg, ptl_dtype *out)
{
    if (PyUnicode_Check(obj)) {
        const char *s = PyUnicode_AsUTF8(obj);
        if (!s)
            return -1;
        int dt = ptl_dtype_from_name(s);
        if (dt < 0) {
            PyErr_Format(PyExc_ValueError, "%s: unknown dtype %R (expected %s)", arg, obj, DTYPES_EXPECTED);
            return -1;
        }
        *out = (ptl_dtype)dt;
        return 0;
    }
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter2(obj, &descr) || descr == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a dtype name or NumPy dtype (%s), got %.100s", arg,
                     DTYPES_EXPECTED, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int dt = ptl_dtype_from_npy(descr->type_num);
    Py_DECREF(descr);
    if (dt < 0) {
        PyErr_Format(PyExc_TypeError, "%s: unsupported dtype %R (expected %s)", arg, obj, DTYPES_EXPECTED);
        return -1;
    }
    *out = (ptl_dtype)dt;
    return 0;
}

int ptl_parse_shape(PyObject *obj, const char *arg, int *ndim, int64_t *shape)
{
    if (PyLong_Check(obj)) {
        long long v = PyLong_AsLongLong(obj);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 0) {
            PyErr_Format(PyExc_ValueError, "%s: sizes must be >= 0, got %lld", arg, v);
            return -1;
        }
        *ndim = 1;
        shape[0] = v;
        return 0;
    }
    PyObject *seq = PySequence_Fast(obj, "");
    if (!seq) {
        PyErr_Format(PyExc_TypeError, "%s: expected an int or a sequence of ints, got %.100s", arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > PTL_MAX_DIMS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: at most %d dimensions, got %zd", arg, PTL_MAX_DIMS, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyLong_Check(item) && !PyIndex_Check(item)) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_TypeError, "%s: dimension %zd must be an int, got %.100s", arg, i,
                         Py_TYPE(item)->tp_name);
            return -1;
        }
        long long v = PyLong_AsLongLong(item);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (v < 0) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "%s: sizes must be >= 0, got %lld in dimension %zd", arg, v, i);
            return -1;
        }
        shape[i] = v;
    }
    Py_DECREF(seq);
    *ndim = (int)n;
    return 0;
}

/* ------------------------------------------------------------------ tensor core */

int64_t ptl_tensor_numel(const PtlTensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

size_t ptl_tensor_nbytes(const PtlTensor *t) { return (size_t)ptl_tensor_numel(t) * ptl_dtype_size(t->dtype); }

int ptl_is_tensor(PyObject *module, PyObject *obj)
{
    return PyObject_TypeCheck(obj, (PyTypeObject *)ptl_state(module)->tensor_type);
}

static int checked_nbytes(int ndim, const int64_t *shape, ptl_dtype dt, size_t *out)
{
    uint64_t n = ptl_dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] != 0 && n > (UINT64_MAX >> 2) / (uint64_t)shape[i]) {
            PyErr_SetString(PyExc_ValueError, "shape: tensor size overflows");
            return -1;
        }
        n *= (uint64_t)shape[i];
    }
    *out = (size_t)n;
    return 0;
}

static PtlTensor *tensor_alloc(PyObject *module)
{
    PyTypeObject *tp = (PyTypeObject *)ptl_state(module)->tensor_type;
    PtlTensor *t = (PtlTensor *)tp->tp_alloc(tp, 0);
    return t;
}

PtlTensor *ptl_tensor_empty(PyObject *module, int ndim, const int64_t *shape, ptl_dtype dt, ptl_device dev)
{
    size_t nbytes;
    if (checked_nbytes(ndim, shape, dt, &nbytes) < 0)
        return NULL;
    PtlTensor *t = tensor_alloc(module);
    if (!t)
        return NULL;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->dtype = dt;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_storage_new(ptl_state(module)->rt, dev, nbytes, &t->storage);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        Py_DECREF(t);
        return (PtlTensor *)ptl_raise(module);
    }
    return t;
}

PtlTensor *ptl_tensor_view(PyObject *module, PtlTensor *base, size_t byte_offset, int ndim, const int64_t *shape,
                           ptl_dtype dt)
{
    size_t nbytes;
    if (checked_nbytes(ndim, shape, dt, &nbytes) < 0)
        return NULL;
    if (base->offset + byte_offset + nbytes > base->storage->nbytes) {
        PyErr_SetString(PyExc_ValueError, "view: range exceeds the base tensor's storage");
        return NULL;
    }
    PtlTensor *t = tensor_alloc(module);
    if (!t)
        return NULL;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->dtype = dt;
    t->offset = base->offset + byte_offset;
    t->storage = base->storage;
    ptl_storage_incref(t->storage);
    t->owner = base->owner;
    Py_XINCREF(t->owner);
    return t;
}

PtlTensor *ptl_tensor_wrap(PyObject *module, void *data, ptl_device dev, int ndim, const int64_t *shape,
                           ptl_dtype dt, PyObject *owner)
{
    size_t nbytes;
    if (checked_nbytes(ndim, shape, dt, &nbytes) < 0)
        return NULL;
    PtlTensor *t = tensor_alloc(module);
    if (!t)
        return NULL;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->dtype = dt;
    if (ptl_storage_borrow(ptl_state(module)->rt, dev, data, nbytes, &t->storage) != 0) {
        Py_DECREF(t);
        return (PtlTensor *)ptl_raise(module);
    }
    t->owner = owner;
    Py_XINCREF(owner);
    return t;
}

PtlTensor *ptl_tensor_arg(PyObject *module, PyObject *obj, const char *arg, int dt, const ptl_device *dev, int ndim,
                          const int64_t *shape)
{
    if (!ptl_is_tensor(module, obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a ptl.Tensor, got %.100s", arg, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PtlTensor *t = (PtlTensor *)obj;
    if (dt >= 0 && t->dtype != (ptl_dtype)dt) {
        PyErr_Format(PyExc_TypeError, "%s: expected dtype %s, got %s", arg, ptl_dtype_name((ptl_dtype)dt),
                     ptl_dtype_name(t->dtype));
        return NULL;
    }
    if (dev && (t->storage->device.type != dev->type || t->storage->device.index != dev->index)) {
        PyObject *want = ptl_device_str(*dev), *got = ptl_device_str(t->storage->device);
        PyErr_Format(PyExc_ValueError, "%s: expected a tensor on %U, got one on %U", arg, want, got);
        Py_XDECREF(want);
        Py_XDECREF(got);
        return NULL;
    }
    if (ndim >= 0 && t->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: expected %d dimensions, got %d", arg, ndim, t->ndim);
        return NULL;
    }
    if (shape)
        for (int i = 0; i < t->ndim; i++)
            if (shape[i] >= 0 && shape[i] != t->shape[i]) {
                PyErr_Format(PyExc_ValueError, "%s: expected size %lld in dimension %d, got %lld", arg,
                             (long long)shape[i], i, (long long)t->shape[i]);
                return NULL;
            }
    return t;
}

/* ------------------------------------------------------------------ conversions */

/* A new tensor holding `src` converted to (dev, dt). */
static PtlTensor *tensor_convert(PyObject *module, PtlTensor *src, ptl_device dev, ptl_dtype dt)
{
    ptl_runtime *rt = ptl_state(module)->rt;
    ptl_device sdev = src->storage->device;
    int64_t n = ptl_tensor_numel(src);
    PtlTensor *dst = ptl_tensor_empty(module, src->ndim, src->shape, dt, dev);
    PtlTensor *tmp = NULL;
    if (!dst)
        return NULL;
    int rc = 0;
    int same_device = sdev.type == dev.type && sdev.index == dev.index;
    if (dt != src->dtype && !same_device) {
        /* convert where the data is, then move it */
        tmp = ptl_tensor_empty(module, src->ndim, src->shape, dt, sdev);
        if (!tmp)
            goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    if (dt == src->dtype)
        rc = ptl_copy_bytes(rt, ptl_tensor_data(dst), dev, ptl_tensor_data(src), sdev, ptl_tensor_nbytes(src));
    else if (same_device)
        rc = ptl_convert(rt, dev, ptl_tensor_data(dst), dt, ptl_tensor_data(src), src->dtype, n);
    else {
        rc = ptl_convert(rt, sdev, ptl_tensor_data(tmp), dt, ptl_tensor_data(src), src->dtype, n);
        if (rc == 0)
            rc = ptl_copy_bytes(rt, ptl_tensor_data(dst), dev, ptl_tensor_data(tmp), sdev, ptl_tensor_nbytes(tmp));
    }
    Py_END_ALLOW_THREADS
    Py_XDECREF(tmp);
    tmp = NULL;
    if (rc != 0) {
        ptl_raise(module);
        goto fail;
    }
    return dst;
fail:
    Py_XDECREF(tmp);
    Py_DECREF(dst);
    return NULL;
}

/* ptl.tensor(array, dtype=None, device="cpu") */
static PyObject *py_tensor(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"data", "dtype", "device", NULL};
    PyObject *data, *dtype_obj = Py_None, *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO:tensor", kw, &data, &dtype_obj, &device_obj))
        return NULL;
    ptl_device dev;
    ptl_dtype want = PTL_FLOAT32;
    if (ptl_parse_device(device_obj, "device", &dev) < 0)
        return NULL;
    if (dtype_obj != Py_None && ptl_parse_dtype(dtype_obj, "dtype", &want) < 0)
        return NULL;
    if (ptl_is_tensor(module, data)) {
        PtlTensor *src = (PtlTensor *)data;
        return (PyObject *)tensor_convert(module, src, dev, dtype_obj == Py_None ? src->dtype : want);
    }
    PyArrayObject *arr = (PyArrayObject *)PyArray_FROMANY(data, NPY_NOTYPE, 0, 0, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED);
    PtlTensor *host = NULL;
    PyObject *out = NULL;
    if (!arr) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "data: expected a NumPy array or nested sequence of numbers, got %.100s",
                     Py_TYPE(data)->tp_name);
        return NULL;
    }
    int src_dt = ptl_dtype_from_npy(PyArray_TYPE(arr));
    if (PyArray_TYPE(arr) == NPY_BOOL)
        src_dt = PTL_UINT8;
    if (src_dt < 0) {
        PyErr_Format(PyExc_TypeError, "data: arrays of dtype %R are not supported (expected %s)",
                     (PyObject *)PyArray_DESCR(arr), DTYPES_EXPECTED);
        goto done;
    }
    if (PyArray_NDIM(arr) > PTL_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "data: at most %d dimensions, got %d", PTL_MAX_DIMS, PyArray_NDIM(arr));
        goto done;
    }
    int64_t shape[PTL_MAX_DIMS];
    for (int i = 0; i < PyArray_NDIM(arr); i++)
        shape[i] = PyArray_DIM(arr, i);
    host = ptl_tensor_empty(module, PyArray_NDIM(arr), shape, (ptl_dtype)src_dt, (ptl_device){PTL_CPU, 0});
    if (!host)
        goto done;
    memcpy(ptl_tensor_data(host), PyArray_DATA(arr), ptl_tensor_nbytes(host));
    if (dtype_obj == Py_None)
        want = (ptl_dtype)src_dt;
    if (dev.type == PTL_CPU && want == host->dtype) {
        out = (PyObject *)host;
        host = NULL;
    } else {
        out = (PyObject *)tensor_convert(module, host, dev, want);
    }
done:
    Py_XDECREF(host);
    Py_DECREF(arr);
    return out;
}

static PyObject *make_filled(PyObject *module, PyObject *args, PyObject *kwargs, const char *fname, int zero)
{
    static char *kw[] = {"shape", "dtype", "device", NULL};
    PyObject *shape_obj, *dtype_obj = Py_None, *device_obj = Py_None;
    char fmt[32];
    snprintf(fmt, sizeof fmt, "O|OO:%s", fname);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, fmt, kw, &shape_obj, &dtype_obj, &device_obj))
        return NULL;
    int ndim;
    int64_t shape[PTL_MAX_DIMS];
    ptl_dtype dt = PTL_FLOAT32;
    ptl_device dev;
    if (ptl_parse_shape(shape_obj, "shape", &ndim, shape) < 0 ||
        (dtype_obj != Py_None && ptl_parse_dtype(dtype_obj, "dtype", &dt) < 0) ||
        ptl_parse_device(device_obj, "device", &dev) < 0)
        return NULL;
    PtlTensor *t = ptl_tensor_empty(module, ndim, shape, dt, dev);
    if (!t || !zero)
        return (PyObject *)t;
    int rc = 0;
    size_t nbytes = ptl_tensor_nbytes(t);
    if (dev.type == PTL_CPU) {
        memset(ptl_tensor_data(t), 0, nbytes);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = ptl_memset_device(ptl_state(module)->rt, dev, ptl_tensor_data(t), 0, nbytes);
        Py_END_ALLOW_THREADS
    }
    if (rc != 0) {
        Py_DECREF(t);
        return ptl_raise(module);
    }
    return (PyObject *)t;
}

/* ptl.from_numpy(array): a CPU tensor sharing the array's memory (no copy). */
static PyObject *py_from_numpy(PyObject *module, PyObject *obj)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "array: expected a NumPy array, got %.100s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (!PyArray_IS_C_CONTIGUOUS(arr) || !PyArray_ISALIGNED(arr) || !PyArray_ISWRITEABLE(arr)) {
        PyErr_SetString(PyExc_ValueError, "array: expected a C-contiguous, aligned, writeable array "
                                          "(use ptl.tensor to copy other arrays)");
        return NULL;
    }
    int dt = ptl_dtype_from_npy(PyArray_TYPE(arr));
    if (dt < 0) {
        PyErr_Format(PyExc_TypeError, "array: dtype %R is not supported (expected %s)", (PyObject *)PyArray_DESCR(arr),
                     DTYPES_EXPECTED);
        return NULL;
    }
    if (PyArray_NDIM(arr) > PTL_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "array: at most %d dimensions, got %d", PTL_MAX_DIMS, PyArray_NDIM(arr));
        return NULL;
    }
    int64_t shape[PTL_MAX_DIMS];
    for (int i = 0; i < PyArray_NDIM(arr); i++)
        shape[i] = PyArray_DIM(arr, i);
    return (PyObject *)ptl_tensor_wrap(module, PyArray_DATA(arr), (ptl_device){PTL_CPU, 0}, PyArray_NDIM(arr),
                                       shape, (ptl_dtype)dt, obj);
}

static PyObject *py_empty(PyObject *m, PyObject *a, PyObject *k) { return make_filled(m, a, k, "empty", 0); }
static PyObject *py_zeros(PyObject *m, PyObject *a, PyObject *k) { return make_filled(m, a, k, "zeros", 1); }

/* ------------------------------------------------------------------ Tensor type */

static void tensor_dealloc(PtlTensor *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->storage) {
        ptl_storage *s = self->storage;
        self->storage = NULL;
        Py_BEGIN_ALLOW_THREADS
        ptl_storage_decref(s);
        Py_END_ALLOW_THREADS
    }
    Py_CLEAR(self->owner);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *tensor_new_forbidden(PyTypeObject *tp, PyObject *args, PyObject *kwargs)
{
    (void)tp;
    (void)args;
    (void)kwargs;
    PyErr_SetString(PyExc_TypeError, "ptl.Tensor cannot be created directly; use ptl.tensor, ptl.empty or ptl.zeros");
    return NULL;
}

static PyObject *tensor_get_shape(PtlTensor *self, void *closure)
{
    (void)closure;
    PyObject *t = PyTuple_New(self->ndim);
    if (!t)
        return NULL;
    for (int i = 0; i < self->ndim; i++)
        PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(self->shape[i]));
    return t;
}

static PyObject *tensor_get_dtype(PtlTensor *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(ptl_dtype_name(self->dtype));
}

static PyObject *tensor_get_device(PtlTensor *self, void *c)
{
    (void)c;
    return ptl_device_str(self->storage->device);
}

static PyObject *tensor_get_nbytes(PtlTensor *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(ptl_tensor_nbytes(self));
}

static PyObject *tensor_get_ndim(PtlTensor *self, void *c)
{
    (void)c;
    return PyLong_FromLong(self->ndim);
}

static PyObject *tensor_get_data_ptr(PtlTensor *self, void *c)
{
    (void)c;
    return PyLong_FromVoidPtr(ptl_tensor_data(self));
}

static PyGetSetDef tensor_getset[] = {
    {"shape", (getter)tensor_get_shape, NULL, "Sizes of the dimensions (a tuple).", NULL},
    {"dtype", (getter)tensor_get_dtype, NULL, "Element type name, e.g. 'float32' or 'bfloat16'.", NULL},
    {"device", (getter)tensor_get_device, NULL, "'cpu' or 'cuda:N'.", NULL},
    {"nbytes", (getter)tensor_get_nbytes, NULL, "Bytes of data (elements x element size).", NULL},
    {"ndim", (getter)tensor_get_ndim, NULL, "Number of dimensions.", NULL},
    {"data_ptr", (getter)tensor_get_data_ptr, NULL, "Address of the first element (host or device).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* t.numpy(): a new NumPy array with a copy of the data; bfloat16 comes back as float32. */
static PyObject *tensor_numpy(PtlTensor *self, PyObject *unused)
{
    (void)unused;
    PyObject *module = ptl_module_of((PyObject *)self);
    if (!module)
        return NULL;
    ptl_dtype out_dt = self->dtype == PTL_BFLOAT16 ? PTL_FLOAT32 : self->dtype;
    npy_intp dims[PTL_MAX_DIMS];
    for (int i = 0; i < self->ndim; i++)
        dims[i] = (npy_intp)self->shape[i];
    PyArrayObject *arr = (PyArrayObject *)PyArray_SimpleNew(self->ndim, dims, ptl_dtype_to_npy(out_dt));
    if (!arr)
        return NULL;
    PtlTensor *src = self;
    int rc = 0;
    if (out_dt != self->dtype) {
        src = tensor_convert(module, self, self->storage->device, out_dt);
        if (!src)
            goto fail;
    } else {
        Py_INCREF(src);
    }
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_copy_bytes(ptl_state(module)->rt, PyArray_DATA(arr), (ptl_device){PTL_CPU, 0}, ptl_tensor_data(src),
                        src->storage->device, ptl_tensor_nbytes(src));
    Py_END_ALLOW_THREADS
    Py_DECREF(src);
    if (rc != 0) {
        ptl_raise(module);
        goto fail;
    }
    return (PyObject *)arr;
fail:
    Py_DECREF(arr);
    return NULL;
}

static PyObject *tensor_array(PtlTensor *self, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"dtype", "copy", NULL};
    PyObject *dtype = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:__array__", kw, &dtype, &copy))
        return NULL;
    if (copy == Py_False) {
        PyErr_SetString(PyExc_ValueError, "__array__: a ptl.Tensor cannot be viewed without a copy (copy=False)");
        return NULL;
    }
    PyObject *arr = tensor_numpy(self, NULL);
    if (!arr || dtype == Py_None)
        return arr;
    PyObject *res = PyObject_CallMethod(arr, "astype", "O", dtype);
    Py_DECREF(arr);
    return res;
}

/* t.to(device=None, dtype=None) */
static PyObject *tensor_to(PtlTensor *self, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"device", "dtype", NULL};
    PyObject *device_obj = Py_None, *dtype_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:to", kw, &device_obj, &dtype_obj))
        return NULL;
    PyObject *module = ptl_module_of((PyObject *)self);
    if (!module)
        return NULL;
    ptl_device dev = self->storage->device;
    ptl_dtype dt = self->dtype;
    if (device_obj != Py_None && ptl_parse_device(device_obj, "device", &dev) < 0)
        return NULL;
    if (dtype_obj != Py_None && ptl_parse_dtype(dtype_obj, "dtype", &dt) < 0)
        return NULL;
    if (dt == self->dtype && dev.type == self->storage->device.type && dev.index == self->storage->device.index) {
        Py_INCREF(self);
        return (PyObject *)self;
    }
    return (PyObject *)tensor_convert(module, self, dev, dt);
}

static PyObject *tensor_numel(PtlTensor *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromLongLong(ptl_tensor_numel(self));
}

static PyObject *tensor_item(PtlTensor *self, PyObject *unused)
{
    (void)unused;
    if (ptl_tensor_numel(self) != 1) {
        PyErr_Format(PyExc_ValueError, "item: the tensor has %lld elements, expected 1",
                     (long long)ptl_tensor_numel(self));
        return NULL;
    }
    PyObject *arr = tensor_numpy(self, NULL);
    if (!arr)
        return NULL;
    PyObject *res = PyObject_CallMethod(arr, "item", NULL);
    Py_DECREF(arr);
    return res;
}

static PyObject *tensor_repr(PtlTensor *self)
{
    PyObject *shape = tensor_get_shape(self, NULL), *dev = ptl_device_str(self->storage->device);
    PyObject *res = NULL;
    if (shape && dev)
        res = PyUnicode_FromFormat("ptl.Tensor(shape=%R, dtype=%s, device='%U')", shape, ptl_dtype_name(self->dtype),
                                   dev);
    Py_XDECREF(shape);
    Py_XDECREF(dev);
    return res;
}

static Py_ssize_t tensor_len(PtlTensor *self)
{
    if (self->ndim == 0) {
        PyErr_SetString(PyExc_TypeError, "len() of a 0-d tensor");
        return -1;
    }
    return (Py_ssize_t)self->shape[0];
}

static PyMethodDef tensor_methods[] = {
    {"numpy", (PyCFunction)tensor_numpy, METH_NOARGS,
     "numpy()\n--\n\nA NumPy copy of the data (bfloat16 is returned as float32)."},
    {"__array__", (PyCFunction)(void (*)(void))tensor_array, METH_VARARGS | METH_KEYWORDS, NULL},
    {"to", (PyCFunction)(void (*)(void))tensor_to, METH_VARARGS | METH_KEYWORDS,
     "to(device=None, dtype=None)\n--\n\nA copy on another device and/or dtype (self if nothing changes)."},
    {"numel", (PyCFunction)tensor_numel, METH_NOARGS, "Number of elements."},
    {"item", (PyCFunction)tensor_item, METH_NOARGS, "The value of a one-element tensor as a Python number."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot tensor_slots[] = {
    {Py_tp_dealloc, tensor_dealloc},
    {Py_tp_new, tensor_new_forbidden},
    {Py_tp_repr, tensor_repr},
    {Py_tp_getset, tensor_getset},
    {Py_tp_methods, tensor_methods},
    {Py_sq_length, tensor_len},
    {Py_mp_length, tensor_len},
    {Py_tp_doc, "A contiguous tensor owned by ptl's C extension (CPU or CUDA memory)."},
    {0, NULL},
};

static PyType_Spec tensor_spec = {
    .name = "ptl.Tensor",
    .basicsize = sizeof(PtlTensor),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = tensor_slots,
};

PyObject *ptl_module_of(PyObject *tensor) { return PyType_GetModuleByDef(Py_TYPE(tensor), &ptl_moduledef); }

static PyMethodDef module_methods[] = {
    {"tensor", (PyCFunction)(void (*)(void))py_tensor, METH_VARARGS | METH_KEYWORDS,
     "tensor(data, dtype=None, device='cpu')\n--\n\nA new tensor holding a copy of `data` (a NumPy array, nested "
     "sequence or ptl.Tensor). Non-contiguous arrays are copied; bool becomes uint8."},
    {"from_numpy", py_from_numpy, METH_O,
     "from_numpy(array)\n--\n\nA CPU tensor sharing the memory of a C-contiguous, aligned, writeable NumPy array "
     "(the array is kept alive by the tensor)."},
    {"empty", (PyCFunction)(void (*)(void))py_empty, METH_VARARGS | METH_KEYWORDS,
     "empty(shape, dtype='float32', device='cpu')\n--\n\nA new uninitialised tensor."},
    {"zeros", (PyCFunction)(void (*)(void))py_zeros, METH_VARARGS | METH_KEYWORDS,
     "zeros(shape, dtype='float32', device='cpu')\n--\n\nA new tensor of zeros."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_tensor(PyObject *module)
{
    import_array1(-1);
    ptl_module_state *st = ptl_state(module);
    st->tensor_type = PyType_FromModuleAndSpec(module, &tensor_spec, NULL);
    if (!st->tensor_type || PyModule_AddObjectRef(module, "Tensor", st->tensor_type) < 0)
        return -1;
    return PyModule_AddFunctions(module, module_methods);
}
