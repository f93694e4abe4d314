/* Python bindings of the io area: the safetensors writer and reader. They move raw bytes; ptl/io.py
 * maps NumPy dtypes to safetensors names and back. _atomic_write_fault arms the writer's test hook. */
#include <string.h>

#include "../py.h"
#include "atomic_file.h"
#include "safetensors.h"

static PyObject *decode_utf8(const char *s, size_t n, const char *path, const char *what)
{
    PyObject *o = PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "strict");
    if (!o) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "'%s' is not a valid safetensors file: a %s is not UTF-8", path, what);
    }
    return o;
}

static PyObject *py_safetensors_save(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "entries", "metadata", NULL};
    PyObject *path_bytes = NULL, *entries, *metadata = Py_None, *seq = NULL, *meta_items = NULL, *ret = NULL;
    ptl_st_entry *ents = NULL;
    Py_buffer *views = NULL;
    const char **mkeys = NULL, **mvals = NULL;
    Py_ssize_t n = 0, got = 0, nmeta = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|O:safetensors_save", kwlist, PyUnicode_FSConverter,
                                     &path_bytes, &entries, &metadata))
        return NULL;
    const char *path = PyBytes_AS_STRING(path_bytes);
    /* a tuple snapshot: the names and buffers are used with the GIL released, when another thread could
     * change a list of entries */
    seq = PySequence_Tuple(entries);
    if (!seq) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "entries: expected a sequence of (name, dtype, shape, buffer)");
        goto fail;
    }
    n = PySequence_Fast_GET_SIZE(seq);
    ents = (ptl_st_entry *)PyMem_Calloc((size_t)(n ? n : 1), sizeof *ents);
    views = (Py_buffer *)PyMem_Calloc((size_t)(n ? n : 1), sizeof *views);
    if (!ents || !views) {
        PyErr_NoMemory();
        goto fail;
    }
    for (; got < n; got++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, got), *shape, *buf;
        ptl_st_entry *e = &ents[got];
        if (!PyArg_ParseTuple(item, "ssOO;entries: expected (name, dtype, shape, buffer)", &e->name, &e->dtype,
                              &shape, &buf))
            goto fail;
        if (ptl_parse_shape(shape, "shape", &e->ndim, e->shape) < 0)
            goto fail;
        if (PyObject_GetBuffer(buf, &views[got], PyBUF_C_CONTIGUOUS) < 0)
            goto fail;
        e->data = views[got].buf;
        e->nbytes = (size_t)views[got].len;
    }
    if (metadata != Py_None) {
        if (!PyDict_Check(metadata)) {
            PyErr_SetString(PyExc_TypeError, "metadata: expected a dict of str to str or None");
            goto fail;
        }
        meta_items = PyDict_Items(metadata);
        if (!meta_items)
            goto fail;
        nmeta = PyList_GET_SIZE(meta_items);
        mkeys = (const char **)PyMem_Calloc((size_t)(nmeta ? nmeta : 1), sizeof *mkeys);
        mvals = (const char **)PyMem_Calloc((size_t)(nmeta ? nmeta : 1), sizeof *mvals);
        if (!mkeys || !mvals) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t i = 0; i < nmeta; i++) {
            PyObject *kv = PyList_GET_ITEM(meta_items, i);
            PyObject *k = PyTuple_GET_ITEM(kv, 0), *v = PyTuple_GET_ITEM(kv, 1);
            if (!PyUnicode_Check(k) || !PyUnicode_Check(v)) {
                PyErr_SetString(PyExc_TypeError, "metadata: keys and values must be str");
                goto fail;
            }
            Py_ssize_t klen, vlen;
            mkeys[i] = PyUnicode_AsUTF8AndSize(k, &klen);
            mvals[i] = mkeys[i] ? PyUnicode_AsUTF8AndSize(v, &vlen) : NULL;
            if (!mvals[i])
                goto fail;
            if (strlen(mkeys[i]) != (size_t)klen || strlen(mvals[i]) != (size_t)vlen) {
                PyErr_SetString(PyExc_ValueError, "metadata: keys and values must not contain NUL characters");
                goto fail;
            }
        }
    }
    {
        int rc;
        Py_BEGIN_ALLOW_THREADS;
        rc = ptl_safetensors_write(path, ents, n, mkeys, mvals, nmeta);
        Py_END_ALLOW_THREADS;
        if (rc != 0) {
            ptl_raise(self);
            goto fail;
        }
    }
    ret = Py_NewRef(Py_None);
fail:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(ents);
    PyMem_Free(views);
    PyMem_Free(mkeys);
    PyMem_Free(mvals);
    Py_XDECREF(meta_items);
    Py_XDECREF(seq);
    Py_XDECREF(path_bytes);
    return ret;
}

static PyObject *py_safetensors_load(PyObject *self, PyObject *args)
{
    PyObject *path_bytes = NULL, *list = NULL, *meta = NULL, *ret = NULL;
    ptl_st_file f;
    int rc, opened = 0;
    if (!PyArg_ParseTuple(args, "O&:safetensors_load", PyUnicode_FSConverter, &path_bytes))
        return NULL;
    const char *path = PyBytes_AS_STRING(path_bytes);
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_safetensors_open(path, &f);
    Py_END_ALLOW_THREADS;
    if (rc != 0) {
        ptl_raise(self);
        goto fail;
    }
    opened = 1;
    list = PyList_New(0);
    meta = PyDict_New();
    if (!list || !meta)
        goto fail;
    for (int64_t i = 0; i < f.nmeta; i++) {
        PyObject *k = decode_utf8(f.meta_keys[i], f.meta_key_lens[i], path, "metadata key");
        PyObject *v = k ? decode_utf8(f.meta_values[i], f.meta_value_lens[i], path, "metadata value") : NULL;
        int bad = !v || PyDict_SetItem(meta, k, v) < 0;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (bad)
            goto fail;
    }
    for (int64_t i = 0; i < f.n; i++) {
        const ptl_st_info *t = &f.tensors[i];
        PyObject *name = decode_utf8(t->name, t->name_len, path, "tensor name");
        PyObject *shape = name ? PyTuple_New(t->ndim) : NULL;
        PyObject *data = shape ? PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(t->end - t->begin)) : NULL;
        PyObject *item = NULL;
        if (data) {
            for (int d = 0; d < t->ndim; d++)
                PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(t->shape[d]));
            char *dst = PyByteArray_AS_STRING(data);
            Py_BEGIN_ALLOW_THREADS;
            rc = ptl_safetensors_read(&f, i, dst);
            Py_END_ALLOW_THREADS;
            if (rc != 0)
                ptl_raise(self);
            else
                item = Py_BuildValue("(OsOO)", name, t->dtype, shape, data);
        }
        Py_XDECREF(name);
        Py_XDECREF(shape);
        Py_XDECREF(data);
        if (!item || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
    ret = Py_BuildValue("(OO)", list, meta);
fail:
    if (opened)
        ptl_safetensors_close(&f);
    Py_XDECREF(list);
    Py_XDECREF(meta);
    Py_XDECREF(path_bytes);
    return ret;
}

static PyObject *py_atomic_write_fault(PyObject *self, PyObject *args)
{
    long long after_bytes;
    int pause_ms = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "L|i:_atomic_write_fault", &after_bytes, &pause_ms))
        return NULL;
    ptl_atomic_set_fault((int64_t)after_bytes, pause_ms);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"safetensors_save", (PyCFunction)(void (*)(void))py_safetensors_save, METH_VARARGS | METH_KEYWORDS,
     "safetensors_save(path, entries, metadata=None)\n"
     "entries: [(name, dtype name, shape, C-contiguous buffer)]; written atomically."},
    {"_atomic_write_fault", py_atomic_write_fault, METH_VARARGS,
     "_atomic_write_fault(after_bytes, pause_ms=0): tests only. The next atomic write fails (ENOSPC) after\n"
     "after_bytes bytes, first pausing pause_ms milliseconds; after_bytes < 0 disarms."},
    {"safetensors_load", py_safetensors_load, METH_VARARGS,
     "safetensors_load(path) -> ([(name, dtype name, shape, bytearray)], metadata dict)"},
    {NULL, NULL, 0, NULL},
};

int ptl_register_io(PyObject *module) { return PyModule_AddFunctions(module, methods); }
