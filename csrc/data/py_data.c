/* Python bindings of the data area: the loader object, its batches as NumPy arrays, normalisation. */
#include "../py.h"

#include "../numpy_api.h"
#include "dataset.h"
#include "normalize.h"
#ifdef PTL_WITH_CUDA
#include "../cuda/device.h"
#endif

/* Heap types of this file (one interpreter per process; module.c owns the module state layout). */
static PyObject *loader_type, *slot_type;

typedef struct {
    PyObject_HEAD
    ptl_loader *L;
    PyObject *module;
} LoaderObject;

/* Owns one ring slot: the images array of a batch views the slot and keeps this object alive; the slot
 * goes back to the ring when the last reference dies. */
typedef struct {
    PyObject_HEAD
    LoaderObject *loader;
    int slot;
} SlotObject;

static void slot_dealloc(PyObject *self)
{
    SlotObject *s = (SlotObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    if (s->loader && s->loader->L)
        ptl_loader_release(s->loader->L, s->slot);
    Py_XDECREF(s->loader);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyType_Slot slot_slots[] = {
    {Py_tp_dealloc, slot_dealloc},
    {Py_tp_doc, "A batch's claim on one slot of the loader's ring (internal)."},
    {0, NULL},
};
static PyType_Spec slot_spec = {"ptl._C._DataSlot", sizeof(SlotObject), 0, Py_TPFLAGS_DEFAULT, slot_slots};

static void loader_dealloc(PyObject *self)
{
    LoaderObject *o = (LoaderObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    /* The workers never take the GIL, so joining them while holding it cannot deadlock. */
    ptl_loader_destroy(o->L);
    Py_XDECREF(o->module);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static ptl_loader *loader_of(LoaderObject *o)
{
    if (!o->L)
        PyErr_SetString(PyExc_RuntimeError, "the loader is closed");
    return o->L;
}

static PyObject *loader_start(PyObject *self, PyObject *args)
{
    LoaderObject *o = (LoaderObject *)self;
    int epoch, mosaic, rc;
    ptl_loader *L = loader_of(o);
    if (!L || !PyArg_ParseTuple(args, "ip:start", &epoch, &mosaic))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_loader_start(L, epoch, mosaic);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(o->module);
    Py_RETURN_NONE;
}

static PyObject *array_copy(int nd, npy_intp *dims, int type, const void *src, size_t nbytes)
{
    PyObject *a = PyArray_SimpleNew(nd, dims, type);
    if (a && nbytes)
        memcpy(PyArray_DATA((PyArrayObject *)a), src, nbytes);
    return a;
}

static PyObject *loader_next(PyObject *self, PyObject *args)
{
    LoaderObject *o = (LoaderObject *)self;
    ptl_batch_view v;
    int rc;
    ptl_loader *L = loader_of(o);
    SlotObject *holder = NULL;
    PyObject *img = NULL, *tg = NULL, *idx = NULL, *meta = NULL;
    if (!L || !PyArg_ParseTuple(args, ":next"))
        return NULL;
    /* Short waits so Ctrl-C reaches Python while the workers are busy. */
    do {
        Py_BEGIN_ALLOW_THREADS
        rc = ptl_loader_next(L, 100, &v);
        Py_END_ALLOW_THREADS
        if (rc == 2 && PyErr_CheckSignals() < 0)
            return NULL;
    } while (rc == 2);
    if (rc < 0)
        return ptl_raise(o->module);
    if (rc == 1)
        Py_RETURN_NONE;
    holder = PyObject_New(SlotObject, (PyTypeObject *)slot_type);
    if (!holder) {
        ptl_loader_release(L, v.slot);
        return NULL;
    }
    Py_INCREF(o);
    holder->loader = o;
    holder->slot = v.slot;
    npy_intp di[4] = {v.n, v.h, v.w, 3}, dt[2] = {v.n_targets, 6}, dn[1] = {v.n}, dm[2] = {v.n, 6};
    img = PyArray_SimpleNewFromData(4, di, NPY_UINT8, v.images);
    if (!img)
        goto fail;
    rc = PyArray_SetBaseObject((PyArrayObject *)img, (PyObject *)holder);
    holder = NULL; /* stolen, even on failure */
    if (rc < 0)
        goto fail;
    tg = array_copy(2, dt, NPY_FLOAT32, v.targets, sizeof(float) * 6 * (size_t)v.n_targets);
    idx = array_copy(1, dn, NPY_INT64, v.indices, sizeof(int64_t) * (size_t)v.n);
    meta = array_copy(2, dm, NPY_FLOAT64, v.meta, sizeof(double) * 6 * (size_t)v.n);
    if (!tg || !idx || !meta)
        goto fail;
    return Py_BuildValue("(NNNNii)", img, tg, idx, meta, v.epoch, v.batch);
fail:
    Py_XDECREF(holder);
    Py_XDECREF(img);
    Py_XDECREF(tg);
    Py_XDECREF(idx);
    Py_XDECREF(meta);
    return NULL;
}

static PyObject *loader_sample(PyObject *self, PyObject *args)
{
    LoaderObject *o = (LoaderObject *)self;
    int epoch, index, mosaic, h, w, cap, nt = 0, rc;
    double meta[6];
    ptl_loader *L = loader_of(o);
    float *tg = NULL;
    PyObject *img = NULL, *out = NULL;
    if (!L || !PyArg_ParseTuple(args, "iip:sample", &epoch, &index, &mosaic))
        return NULL;
    if (ptl_loader_sample_shape(L, index, &h, &w, &cap) != 0)
        return ptl_raise(o->module);
    npy_intp di[3] = {h, w, 3};
    img = PyArray_SimpleNew(3, di, NPY_UINT8);
    tg = malloc(sizeof(float) * 5 * (size_t)cap);
    if (!img || !tg) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    uint8_t *px = PyArray_DATA((PyArrayObject *)img);
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_loader_sample(L, epoch, index, mosaic, px, tg, &nt, meta);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        ptl_raise(o->module);
        goto done;
    }
    npy_intp dt[2] = {nt, 5}, dm[1] = {6};
    PyObject *t = array_copy(2, dt, NPY_FLOAT32, tg, sizeof(float) * 5 * (size_t)nt);
    PyObject *m = array_copy(1, dm, NPY_FLOAT64, meta, sizeof meta);
    if (t && m)
        out = Py_BuildValue("(ONN)", img, t, m);
    else {
        Py_XDECREF(t);
        Py_XDECREF(m);
    }
done:
    free(tg);
    Py_XDECREF(img);
    return out;
}

static PyObject *loader_len(PyObject *self, PyObject *args)
{
    (void)args;
    ptl_loader *L = loader_of((LoaderObject *)self);
    return L ? PyLong_FromLong(ptl_loader_num_batches(L)) : NULL;
}

static PyObject *loader_cache_info(PyObject *self, PyObject *args)
{
    (void)args;
    int64_t needed, filled;
    ptl_loader *L = loader_of((LoaderObject *)self);
    if (!L)
        return NULL;
    ptl_loader_cache_info(L, &needed, &filled);
    return Py_BuildValue("(LL)", (long long)needed, (long long)filled);
}

static PyObject *loader_fill_cache(PyObject *self, PyObject *args)
{
    (void)args;
    LoaderObject *o = (LoaderObject *)self;
    ptl_loader *L = loader_of(o);
    int rc;
    if (!L)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_loader_fill_cache(L);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(o->module);
    Py_RETURN_NONE;
}

static PyMethodDef loader_methods[] = {
    {"start", loader_start, METH_VARARGS, "start(epoch, mosaic): begin producing the batches of `epoch`."},
    {"next", loader_next, METH_VARARGS,
     "next() -> (images uint8 (N,H,W,3), targets float32 (T,6), indices int64 (N,), meta float64 (N,6), "
     "epoch, batch) or None at the end of the epoch."},
    {"sample", loader_sample, METH_VARARGS, "sample(epoch, index, mosaic) -> (image, targets (k,5), meta)."},
    {"num_batches", loader_len, METH_NOARGS, "Batches per epoch."},
    {"cache_info", loader_cache_info, METH_NOARGS, "(bytes the RAM cache needs, bytes filled)."},
    {"fill_cache", loader_fill_cache, METH_NOARGS, "Decode every image into the RAM cache now."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot loader_slots[] = {
    {Py_tp_dealloc, loader_dealloc},
    {Py_tp_methods, loader_methods},
    {Py_tp_doc, "The C data loader (internal; use ptl.DetectionData)."},
    {0, NULL},
};
static PyType_Spec loader_spec = {"ptl._C._DataLoader", sizeof(LoaderObject), 0, Py_TPFLAGS_DEFAULT,
                                  loader_slots};

static int str_list(PyObject *seq, const char *arg, Py_ssize_t n, const char ***out)
{
    const char **v = PyMem_Calloc(n ? n : 1, sizeof(char *));
    if (!v) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyList_GET_ITEM(seq, i);
        if (!PyUnicode_Check(it)) {
            PyErr_Format(PyExc_TypeError, "%s[%zd]: expected a str path", arg, i);
            PyMem_Free(v);
            return -1;
        }
        if (!(v[i] = PyUnicode_AsUTF8(it))) {
            PyMem_Free(v);
            return -1;
        }
    }
    *out = v;
    return 0;
}

static PyObject *data_loader(PyObject *module, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"images", "labels", "nc", "imgsz", "batch", "workers", "train", "rect", "cache",
                             "persistent", "prefetch", "seed", "mosaic", "degrees", "translate", "scale",
                             "shear", "perspective", "hsv_h", "hsv_s", "hsv_v", "flipud", "fliplr", "pinned",
                             NULL};
    PyObject *images, *labels, *info = NULL, *log = NULL;
    ptl_loader_cfg c;
    unsigned long long seed = 0;
    int nc, rc;
    const char **im = NULL, **lb = NULL;
    ptl_dataset *ds = NULL;
    ptl_loader *L = NULL;
    LoaderObject *o = NULL;
    memset(&c, 0, sizeof c);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!iiiippppiKfffffffffffp:data_loader", kwlist, &PyList_Type,
                                     &images, &PyList_Type, &labels, &nc, &c.imgsz, &c.batch, &c.workers,
                                     &c.train, &c.rect, &c.cache, &c.persistent, &c.prefetch, &seed, &c.mosaic,
                                     &c.degrees, &c.translate, &c.scale, &c.shear, &c.perspective, &c.hsv_h,
                                     &c.hsv_s, &c.hsv_v, &c.flipud, &c.fliplr, &c.pinned))
        return NULL;
    c.seed = seed;
    Py_ssize_t n = PyList_GET_SIZE(images);
    if (PyList_GET_SIZE(labels) != n)
        return PyErr_Format(PyExc_ValueError, "labels: expected %zd paths (one per image), got %zd", n,
                            PyList_GET_SIZE(labels));
    if (n > 0x7fffffff)
        return PyErr_Format(PyExc_ValueError, "images: too many (%zd)", n);
    if (str_list(images, "images", n, &im) < 0 || str_list(labels, "labels", n, &lb) < 0)
        goto done;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_dataset_scan(im, lb, (int)n, nc, c.imgsz, c.workers > 0 ? c.workers : 1, &ds);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        ptl_raise(module);
        goto done;
    }
    log = PyList_New(ds->log.n);
    if (!log)
        goto done;
    for (int i = 0; i < ds->log.n; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(ds->log.msg[i], (Py_ssize_t)strlen(ds->log.msg[i]), "replace");
        if (!s)
            goto done;
        PyList_SET_ITEM(log, i, s);
    }
    npy_intp dims[2] = {ds->n, 2};
    PyObject *shapes = PyArray_SimpleNew(2, dims, NPY_INT64);
    if (!shapes)
        goto done;
    for (int i = 0; i < ds->n; i++) {
        int64_t *p = (int64_t *)PyArray_DATA((PyArrayObject *)shapes) + 2 * i;
        p[0] = ds->items[i].h0;
        p[1] = ds->items[i].w0;
    }
    PyObject *files = PyList_New(ds->n);
    if (!files) {
        Py_DECREF(shapes);
        goto done;
    }
    for (int i = 0; i < ds->n; i++) {
        PyObject *s = PyUnicode_DecodeFSDefault(ds->items[i].image);
        if (!s) {
            Py_DECREF(shapes);
            Py_DECREF(files);
            goto done;
        }
        PyList_SET_ITEM(files, i, s);
    }
    info = Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:N,s:N,s:N}", "n", ds->n, "skipped", ds->n_skipped, "duplicates",
                         ds->n_duplicates, "missing_labels", ds->n_missing_labels, "max_labels", ds->max_labels,
                         "log", log, "shapes", shapes, "files", files);
    log = NULL;
    if (!info)
        goto done;
    if (ds->n == 0) {
        PyObject *r = Py_BuildValue("(OO)", Py_None, info);
        Py_CLEAR(info);
        ptl_dataset_free(ds);
        ds = NULL;
        PyMem_Free(im);
        PyMem_Free(lb);
        return r;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_loader_create(ds, &c, &L);
    Py_END_ALLOW_THREADS
    ds = NULL; /* owned by the loader (freed by it on failure) */
    if (rc != 0) {
        ptl_raise(module);
        goto done;
    }
    o = PyObject_New(LoaderObject, (PyTypeObject *)loader_type);
    if (!o) {
        ptl_loader_destroy(L);
        goto done;
    }
    o->L = L;
    Py_INCREF(module);
    o->module = module;
    PyMem_Free(im);
    PyMem_Free(lb);
    return Py_BuildValue("(NN)", o, info);
done:
    ptl_dataset_free(ds);
    Py_XDECREF(log);
    Py_XDECREF(info);
    PyMem_Free(im);
    PyMem_Free(lb);
    return NULL;
}

/* The images array of a batch -> its pixels, element count and (when it views a ring slot) the slot. */
static int images_arg(PyObject *obj, const uint8_t **px, int64_t *n, SlotObject **slot)
{
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != NPY_UINT8 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj)) {
        PyErr_SetString(PyExc_TypeError, "images: expected a C-contiguous uint8 NumPy array");
        return -1;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    PyObject *base = PyArray_BASE(a);
    *px = PyArray_DATA(a);
    *n = PyArray_SIZE(a);
    *slot = base && Py_TYPE(base) == (PyTypeObject *)slot_type ? (SlotObject *)base : NULL;
    return 0;
}

static PyObject *data_normalize(PyObject *module, PyObject *args)
{
    PyObject *so, *dobj;
    int rc;
    if (!PyArg_ParseTuple(args, "OO:data_normalize", &so, &dobj))
        return NULL;
    PtlTensor *src = ptl_tensor_arg(module, so, "src", PTL_UINT8, NULL, -1, NULL);
    if (!src)
        return NULL;
    PtlTensor *dst = ptl_tensor_arg(module, dobj, "dst", -1, &src->storage->device, -1, NULL);
    if (!dst)
        return NULL;
    int64_t n = ptl_tensor_numel(src);
    if (ptl_tensor_numel(dst) != n)
        return PyErr_Format(PyExc_ValueError, "dst: expected %lld elements like src, got %lld", (long long)n,
                            (long long)ptl_tensor_numel(dst));
    if (dst->dtype != PTL_FLOAT32 && dst->dtype != PTL_BFLOAT16 && dst->dtype != PTL_FLOAT16)
        return PyErr_Format(PyExc_TypeError, "dst: expected float32, bfloat16 or float16, got %s",
                            ptl_dtype_name(dst->dtype));
    const uint8_t *s = ptl_tensor_data(src);
    void *d = ptl_tensor_data(dst);
    if (src->storage->device.type == PTL_CPU) {
        Py_BEGIN_ALLOW_THREADS
        rc = ptl_normalize_u8_cpu(s, d, dst->dtype, n);
        Py_END_ALLOW_THREADS
    } else {
#ifdef PTL_WITH_CUDA
        ptl_cuda_ctx *ctx;
        rc = ptl_cuda_ctx_get(ptl_state(module)->rt, src->storage->device.index, &ctx);
        if (rc == 0)
            rc = ptl_normalize_u8_cuda(s, d, dst->dtype, n, ctx->stream);
#else
        rc = ptl_set_error(PTL_ERR_RUNTIME, "built without CUDA");
#endif
    }
    if (rc != 0)
        return ptl_raise(module);
    Py_RETURN_NONE;
}

PyObject *ptl_py_data_upload(PyObject *module, PyObject *args)
{
    PyObject *io, *dobj, *stobj = Py_None;
    const uint8_t *px;
    int64_t n;
    SlotObject *slot;
    int rc;
    if (!PyArg_ParseTuple(args, "OO|O:data_upload", &io, &dobj, &stobj))
        return NULL;
    if (images_arg(io, &px, &n, &slot) < 0)
        return NULL;
    PtlTensor *dst = ptl_tensor_arg(module, dobj, "dst", -1, NULL, -1, NULL);
    if (!dst)
        return NULL;
    if (ptl_tensor_numel(dst) != n)
        return PyErr_Format(PyExc_ValueError, "dst: expected %lld elements like images, got %lld", (long long)n,
                            (long long)ptl_tensor_numel(dst));
    if (dst->dtype != PTL_FLOAT32 && dst->dtype != PTL_BFLOAT16 && dst->dtype != PTL_FLOAT16)
        return PyErr_Format(PyExc_TypeError, "dst: expected float32, bfloat16 or float16, got %s",
                            ptl_dtype_name(dst->dtype));
    if (dst->storage->device.type == PTL_CPU) {
        void *d = ptl_tensor_data(dst);
        Py_BEGIN_ALLOW_THREADS
        rc = ptl_normalize_u8_cpu(px, d, dst->dtype, n);
        Py_END_ALLOW_THREADS
        if (rc != 0)
            return ptl_raise(module);
        Py_RETURN_NONE;
    }
#ifdef PTL_WITH_CUDA
    {
        ptl_device dev = dst->storage->device;
        PtlTensor *st = ptl_tensor_arg(module, stobj, "staging", PTL_UINT8, &dev, -1, NULL);
        ptl_cuda_ctx *ctx;
        if (!st)
            return NULL;
        if (ptl_tensor_numel(st) < n)
            return PyErr_Format(PyExc_ValueError, "staging: needs at least %lld elements, has %lld", (long long)n,
                                (long long)ptl_tensor_numel(st));
        if (ptl_cuda_ctx_get(ptl_state(module)->rt, dev.index, &ctx) != 0)
            return ptl_raise(module);
        uint8_t *sd = ptl_tensor_data(st);
        PTL_CUDA_TRY(cudaMemcpyAsync(sd, px, (size_t)n, cudaMemcpyHostToDevice, ctx->stream));
        if (ptl_normalize_u8_cuda(sd, ptl_tensor_data(dst), dst->dtype, n, ctx->stream) != 0)
            goto fail;
        if (slot && slot->loader->L && ptl_loader_record_fence(slot->loader->L, slot->slot, ctx->stream) != 0)
            goto fail;
        Py_RETURN_NONE;
    fail:
        return ptl_raise(module);
    }
#else
    (void)stobj;
    (void)slot;
    PyErr_SetString(PyExc_RuntimeError, "dst: a CUDA tensor, but ptl was built without CUDA");
    return NULL;
#endif
}

/* ---- the pipeline's pieces, for tests (NumPy in, NumPy out) ---- */

static PyArrayObject *image_arg(PyObject *obj, const char *arg)
{
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(obj, NPY_UINT8, 3, 3, NPY_ARRAY_C_CONTIGUOUS);
    if (!a)
        return NULL;
    if (PyArray_DIM(a, 2) != 3 || PyArray_DIM(a, 0) < 1 || PyArray_DIM(a, 1) < 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected an (H, W, 3) image", arg);
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

static PyObject *new_image(int h, int w)
{
    npy_intp d[3] = {h, w, 3};
    return PyArray_SimpleNew(3, d, NPY_UINT8);
}

static int matrix_arg(PyObject *obj, double M[9])
{
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(obj, NPY_FLOAT64, 2, 2, NPY_ARRAY_C_CONTIGUOUS);
    if (!a)
        return -1;
    if (PyArray_DIM(a, 0) != 3 || PyArray_DIM(a, 1) != 3) {
        Py_DECREF(a);
        PyErr_SetString(PyExc_ValueError, "M: expected a 3x3 matrix");
        return -1;
    }
    memcpy(M, PyArray_DATA(a), 9 * sizeof(double));
    Py_DECREF(a);
    return 0;
}

static PyObject *t_resize(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *io;
    int w, h;
    if (!PyArg_ParseTuple(args, "Oii", &io, &w, &h))
        return NULL;
    if (w < 1 || h < 1)
        return PyErr_Format(PyExc_ValueError, "w, h: expected positive sizes, got %d, %d", w, h);
    PyArrayObject *a = image_arg(io, "img");
    if (!a)
        return NULL;
    PyObject *out = new_image(h, w);
    if (out)
        ptl_resize_bilinear(PyArray_DATA(a), (int)PyArray_DIM(a, 1), (int)PyArray_DIM(a, 0),
                            (size_t)PyArray_DIM(a, 1) * 3, PyArray_DATA((PyArrayObject *)out), w, h, (size_t)w * 3);
    Py_DECREF(a);
    return out;
}

static PyObject *t_letterbox(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *io;
    int H, W, up;
    if (!PyArg_ParseTuple(args, "Oiip", &io, &H, &W, &up))
        return NULL;
    PyArrayObject *a = image_arg(io, "img");
    if (!a)
        return NULL;
    ptl_letterbox_params p;
    int w = (int)PyArray_DIM(a, 1), h = (int)PyArray_DIM(a, 0);
    ptl_letterbox_params_get(w, h, W, H, up, &p);
    PyObject *out = new_image(H, W);
    if (out)
        ptl_letterbox(PyArray_DATA(a), w, h, PyArray_DATA((PyArrayObject *)out), W, H, &p);
    Py_DECREF(a);
    return out ? Py_BuildValue("(Ndii)", out, p.r, p.left, p.top) : NULL;
}

static PyObject *t_mosaic_rects(PyObject *m, PyObject *args)
{
    (void)m;
    int k, w, h, xc, yc, s, a[4], b[4];
    if (!PyArg_ParseTuple(args, "iiiiii", &k, &w, &h, &xc, &yc, &s))
        return NULL;
    ptl_mosaic_rects(k, w, h, xc, yc, s, a, b);
    return Py_BuildValue("((iiii)(iiii))", a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]);
}

static PyObject *t_affine_matrix(PyObject *m, PyObject *args)
{
    (void)m;
    ptl_affine_cfg c;
    int wi, hi, wo, ho;
    double u[8], M[9], sigma;
    if (!PyArg_ParseTuple(args, "iiii(dddddddd)fffff", &wi, &hi, &wo, &ho, &u[0], &u[1], &u[2], &u[3], &u[4],
                          &u[5], &u[6], &u[7], &c.degrees, &c.translate, &c.scale, &c.shear, &c.perspective))
        return NULL;
    ptl_affine_matrix(&c, wi, hi, wo, ho, u, M, &sigma);
    npy_intp d[2] = {3, 3};
    PyObject *out = array_copy(2, d, NPY_FLOAT64, M, sizeof M);
    return out ? Py_BuildValue("(Nd)", out, sigma) : NULL;
}

static PyObject *t_warp(PyObject *module, PyObject *args)
{
    PyObject *io, *mo;
    int wo, ho, rc;
    double M[9];
    if (!PyArg_ParseTuple(args, "OOii", &io, &mo, &wo, &ho) || matrix_arg(mo, M) < 0)
        return NULL;
    PyArrayObject *a = image_arg(io, "img");
    if (!a)
        return NULL;
    PyObject *out = new_image(ho, wo);
    if (!out) {
        Py_DECREF(a);
        return NULL;
    }
    rc = ptl_warp(PyArray_DATA(a), (int)PyArray_DIM(a, 1), (int)PyArray_DIM(a, 0),
                  PyArray_DATA((PyArrayObject *)out), wo, ho, M);
    Py_DECREF(a);
    if (rc != 0) {
        Py_DECREF(out);
        return ptl_raise(module);
    }
    return out;
}

static PyArrayObject *boxes_arg(PyObject *obj)
{
    PyArrayObject *b = (PyArrayObject *)PyArray_FROMANY(obj, NPY_FLOAT32, 2, 2,
                                                        NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ENSURECOPY);
    if (b && PyArray_DIM(b, 1) != 5) {
        PyErr_SetString(PyExc_ValueError, "boxes: expected (n, 5) rows of cls, x1, y1, x2, y2");
        Py_CLEAR(b);
    }
    return b;
}

static PyObject *t_boxes_affine(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *bo, *mo;
    double M[9], sigma;
    int wo, ho;
    float thr;
    if (!PyArg_ParseTuple(args, "OOdiif", &bo, &mo, &sigma, &wo, &ho, &thr) || matrix_arg(mo, M) < 0)
        return NULL;
    PyArrayObject *b = boxes_arg(bo);
    if (!b)
        return NULL;
    ptl_boxes bx = {PyArray_DATA(b), (int)PyArray_DIM(b, 0), (int)PyArray_DIM(b, 0)};
    ptl_boxes_affine(&bx, M, sigma, wo, ho, thr);
    npy_intp d[2] = {bx.n, 5};
    PyObject *out = array_copy(2, d, NPY_FLOAT32, bx.b, sizeof(float) * 5 * (size_t)bx.n);
    Py_DECREF(b);
    return out;
}

static PyObject *t_hsv(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *io;
    double r[3];
    if (!PyArg_ParseTuple(args, "O(ddd)", &io, &r[0], &r[1], &r[2]))
        return NULL;
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(io, NPY_UINT8, 3, 3,
                                                        NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ENSURECOPY);
    if (!a)
        return NULL;
    ptl_hsv(PyArray_DATA(a), (int)PyArray_DIM(a, 1), (int)PyArray_DIM(a, 0), r);
    return (PyObject *)a;
}

static PyObject *t_flip(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *io, *bo;
    int lr;
    if (!PyArg_ParseTuple(args, "OOp", &io, &bo, &lr))
        return NULL;
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(io, NPY_UINT8, 3, 3,
                                                        NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ENSURECOPY);
    PyArrayObject *b = a ? boxes_arg(bo) : NULL;
    if (!b) {
        Py_XDECREF(a);
        return NULL;
    }
    ptl_boxes bx = {PyArray_DATA(b), (int)PyArray_DIM(b, 0), (int)PyArray_DIM(b, 0)};
    if (lr)
        ptl_flip_lr(PyArray_DATA(a), (int)PyArray_DIM(a, 1), (int)PyArray_DIM(a, 0), &bx);
    else
        ptl_flip_ud(PyArray_DATA(a), (int)PyArray_DIM(a, 1), (int)PyArray_DIM(a, 0), &bx);
    return Py_BuildValue("(NN)", a, b);
}

static PyMethodDef methods[] = {
    {"data_loader", (PyCFunction)(void (*)(void))data_loader, METH_VARARGS | METH_KEYWORDS,
     "data_loader(images, labels, nc, imgsz, batch, workers, train, rect, cache, persistent, prefetch, seed, "
     "mosaic, degrees, translate, scale, shear, perspective, hsv_h, hsv_s, hsv_v, flipud, fliplr, pinned) -> "
     "(loader or None when no image is usable, info dict). Scans the files (problems go to info['log'])."},
    {"data_normalize", data_normalize, METH_VARARGS,
     "data_normalize(src uint8 Tensor, dst float Tensor on the same device): dst = src / 255."},
    {"data_upload", ptl_py_data_upload, METH_VARARGS,
     "data_upload(images uint8 ndarray, dst Tensor, staging uint8 Tensor (CUDA only)): asynchronous copy to "
     "the device and normalisation into dst on the device's stream."},
    {"data_t_resize", t_resize, METH_VARARGS, "(img, w, h) -> bilinear resize (tests)."},
    {"data_t_letterbox", t_letterbox, METH_VARARGS, "(img, H, W, scaleup) -> (img, r, left, top) (tests)."},
    {"data_t_mosaic_rects", t_mosaic_rects, METH_VARARGS, "(k, w, h, xc, yc, s) -> (dst, src) (tests)."},
    {"data_t_affine_matrix", t_affine_matrix, METH_VARARGS,
     "(w_in, h_in, w_out, h_out, u[8], degrees, translate, scale, shear, perspective) -> (M, sigma) (tests)."},
    {"data_t_warp", t_warp, METH_VARARGS, "(img, M, w_out, h_out) -> img (tests)."},
    {"data_t_boxes_affine", t_boxes_affine, METH_VARARGS,
     "(boxes (n,5) cls x1 y1 x2 y2, M, sigma, w_out, h_out, area_thr) -> kept boxes (tests)."},
    {"data_t_hsv", t_hsv, METH_VARARGS, "(img, (r0, r1, r2)) -> img (tests)."},
    {"data_t_flip", t_flip, METH_VARARGS, "(img, boxes, lr) -> (img, boxes) (tests)."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_data(PyObject *module)
{
    if (!loader_type && !(loader_type = PyType_FromSpec(&loader_spec)))
        return -1;
    if (!slot_type && !(slot_type = PyType_FromSpec(&slot_spec)))
        return -1;
    return PyModule_AddFunctions(module, methods);
}

int ptl_py_batch_images(PyObject *obj, const uint8_t **px, int64_t *n, struct ptl_loader **L, int *slot)
{
    SlotObject *s;
    if (images_arg(obj, px, n, &s) < 0)
        return -1;
    *L = s && s->loader ? s->loader->L : NULL;
    *slot = s ? s->slot : -1;
    return 0;
}
