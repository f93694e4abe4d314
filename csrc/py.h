/* Python glue shared by every binding file: module state, the Tensor object, argument parsing.
 * Binding files only convert arguments and call into the C library; compute happens with the GIL
 * released (Py_BEGIN_ALLOW_THREADS) and errors come back through ptl_raise. */
#ifndef PTL_PY_H
#define PTL_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ptl.h"
#include "runtime.h"

typedef struct {
    PyObject *tensor_type;
    PyObject *cuda_error;
    ptl_runtime *rt;
} ptl_module_state;

typedef struct {
    PyObject_HEAD
    ptl_storage *storage;
    size_t offset; /* bytes into storage */
    int ndim;
    int64_t shape[PTL_MAX_DIMS];
    ptl_dtype dtype;
    PyObject *owner; /* keeps borrowed memory alive (ptl_tensor_wrap), else NULL */
} PtlTensor;

extern struct PyModuleDef ptl_moduledef;

ptl_module_state *ptl_state(PyObject *module);
/* The module that owns a Tensor type instance (for methods). */
PyObject *ptl_module_of(PyObject *tensor);

/* Raises the pending thread-local ptl error as a Python exception; always returns NULL. */
PyObject *ptl_raise(PyObject *module);
/* Same for int-returning glue: returns -1. */
int ptl_raise_int(PyObject *module);

/* Argument parsing. Each raises TypeError/ValueError naming `arg` and returns -1 on failure. */
int ptl_parse_device(PyObject *obj, const char *arg, ptl_device *out);
int ptl_parse_dtype(PyObject *obj, const char *arg, ptl_dtype *out);
int ptl_parse_shape(PyObject *obj, const char *arg, int *ndim, int64_t *shape);
PyObject *ptl_device_str(ptl_device dev);

/* Tensor helpers. */
static inline void *ptl_tensor_data(PtlTensor *t) { return (char *)t->storage->data + t->offset; }
int64_t ptl_tensor_numel(const PtlTensor *t);
size_t ptl_tensor_nbytes(const PtlTensor *t);
int ptl_is_tensor(PyObject *module, PyObject *obj);
/* New uninitialised tensor. */
PtlTensor *ptl_tensor_empty(PyObject *module, int ndim, const int64_t *shape, ptl_dtype dt, ptl_device dev);
/* A tensor sharing `base`'s storage, starting `byte_offset` bytes into base's data. */
PtlTensor *ptl_tensor_view(PyObject *module, PtlTensor *base, size_t byte_offset, int ndim,
                           const int64_t *shape, ptl_dtype dt);
/* A tensor over memory that `owner` keeps alive (a new reference to owner is held). */
PtlTensor *ptl_tensor_wrap(PyObject *module, void *data, ptl_device dev, int ndim, const int64_t *shape,
                           ptl_dtype dt, PyObject *owner);
/* Checks that obj is a Tensor of dtype `dt` (or any if dt < 0) on `dev` (or any if NULL), with `ndim`
 * dims (any if < 0) and, where shape != NULL, the given sizes (entries < 0 match anything). */
PtlTensor *ptl_tensor_arg(PyObject *module, PyObject *obj, const char *arg, int dt, const ptl_device *dev,
                          int ndim, const int64_t *shape);

/* Adds obj (a new reference, stolen; NULL fails) to the module as `name`. */
static inline int ptl_py_add(PyObject *module, const char *name, PyObject *obj)
{
    if (!obj)
        return -1;
    const int rc = PyModule_AddObjectRef(module, name, obj);
    Py_DECREF(obj);
    return rc;
}

/* The execution context of `dev` for library calls: NULL on the CPU, the device's CUDA context
 * (created on first use, with the GIL released) otherwise. -1 after raising. */
struct ptl_cuda_ctx;
int ptl_py_exec_ctx(PyObject *module, ptl_device dev, struct ptl_cuda_ctx **out);

/* Argument converters shared by a binding and the training-step plan (csrc/train/py_train_step.c). */
struct ptl_loader;
/* A loader batch's images: the pixels of a C-contiguous uint8 array and, when the array lives in a
 * loader slot, that slot (the upload's fence); *L = NULL otherwise (csrc/data/py_data.c). */
int ptl_py_batch_images(PyObject *obj, const uint8_t **px, int64_t *n, struct ptl_loader **L, int *slot);

int ptl_register_tensor(PyObject *module);
int ptl_register_cuda(PyObject *module);
int ptl_register_random(PyObject *module);

#endif
