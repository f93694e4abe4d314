/* Python bindings of the data area: the loader object, its batches as NumPy arrays, normalisation. The
 * scan and the cache fill run as jobs (job.h) so Ctrl-C reaches Python while they work. */
#include "../py.h"

#include "../numpy_api.h"
#include "dataset.h"
#include "job.h"
#include "normalize.h"
#include "py_data.h"
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

/* Runs fn(arg) as a job while this thread waits with the GIL released, checking for signals every 100 ms.
 * Returns 0, -1 with the job's ptl error, or -2 with a Python exception (Ctrl-C: the job is cancelled). */
static int run_interruptible(ptl_job_fn fn, void *arg)
{
    ptl_job *j;
    int done, rc;
    if (ptl_job_start(fn, arg, &j) != 0)
        return -1;
    while (1) {
        Py_BEGIN_ALLOW_THREADS
        done = ptl_job_wait(j, 100);
        Py_END_ALLOW_THREADS
        if (done)
            break;
        if (PyErr_CheckSignals() < 0) {
            ptl_job_cancel(j);
            Py_BEGIN_ALLOW_THREADS
            ptl_job_join(j);
            Py_END_ALLOW_THREADS
            return -2;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_job_join(j);
    Py_END_ALLOW_THREADS
    return rc;
}

static PyObject *loader_next(PyObject *self, PyObject *args)
{
    LoaderObject *o = (LoaderObject *)self;
    ptl_batch_view v;
    int rc;
    ptl_loader *L = loader_of(o);
    SlotObject *holder = NULL;
    PyObject *img = NULL, *tg = NULL, *idx = NULL, *src = NULL, *meta = NULL;
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
    src = array_copy(1, dn, NPY_INT64, v.sources, sizeof(int64_t) * (size_t)v.n);
    meta = array_copy(2, dm, NPY_FLOAT64, v.meta, sizeof(double) * 6 * (size_t)v.n);
    if (!tg || !idx || !src || !meta)
        goto fail;
    return Py_BuildValue("(NNNNiiN)", img, tg, idx, meta, v.epoch, v.batch, src);
fail:
    Py_XDECREF(holder);
    Py_XDECREF(img);
    Py_XDECREF(tg);
    Py_XDECREF(idx);
    Py_XDECREF(src);
    Py_XDECREF(meta);
    return NULL;
}

static PyObject *loader_sample(PyObject *self, PyObject *args)
{
    LoaderObject *o = (LoaderObject *)self;
    int epoch, index, mosaic, h, w, cap, nt = 0, rc;
    double meta[6];
    int64_t source = -1;
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
    rc = ptl_loader_sample(L, epoch, index, mosaic, px, tg, &nt, meta, &source);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        ptl_raise(o->module);
        goto done;
    }
    npy_intp dt[2] = {nt, 5}, dm[1] = {6};
    PyObject *t = array_copy(2, dt, NPY_FLOAT32, tg, sizeof(float) * 5 * (size_t)nt);
    PyObject *m = array_copy(1, dm, NPY_FLOAT64, meta, sizeof meta);
    if (t && m)
        out = Py_BuildValue("(ONNL)", img, t, m, (long long)source);
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

static PyObject *loader_batch_shapes(PyObject *self, PyObject *args)
{
    (void)args;
    ptl_loader *L = loader_of((LoaderObject *)self);
    if (!L)
        return NULL;
    npy_intp d[2] = {ptl_loader_num_batches(L), 2};
    PyObject *a = PyArray_SimpleNew(2, d, NPY_INT64);
    if (!a)
        return NULL;
    int64_t *p = PyArray_DATA((PyArrayObject *)a);
    for (npy_intp b = 0; b < d[0]; b++) {
        int h, w;
        ptl_loader_batch_shape(L, (int)b, &h, &w);
        p[2 * b] = h, p[2 * b + 1] = w;
    }
    return a;
}

static PyObject *loader_global_len(PyObject *self, PyObject *args)
{
    (void)args;
    ptl_loader *L = loader_of((LoaderObject *)self);
    return L ? PyLong_FromLong(ptl_loader_num_global_batches(L)) : NULL;
}

/* int64 (num_batches, 3): per batch of this rank, its global batch, first position in the order, size. */
static PyObject *loader_batch_slices(PyObject *self, PyObject *args)
{
    (void)args;
    ptl_loader *L = loader_of((LoaderObject *)self);
    if (!L)
        return NULL;
    npy_intp d[2] = {ptl_loader_num_batches(L), 3};
    PyObject *a = PyArray_SimpleNew(2, d, NPY_INT64);
    if (!a)
        return NULL;
    int64_t *p = PyArray_DATA((PyArrayObject *)a);
    for (npy_intp b = 0; b < d[0]; b++) {
        int gb, start, n;
        ptl_loader_batch_slice(L, (int)b, &gb, &start, &n);
        p[3 * b] = gb, p[3 * b + 1] = start, p[3 * b + 2] = n;
    }
    return a;
}

static PyObject *loader_batch_indices(PyObject *self, PyObject *args)
{
    LoaderObject *o = (LoaderObject *)self;
    ptl_loader *L = loader_of(o);
    int epoch, b, gb, start, n, rc;
    if (!L || !PyArg_ParseTuple(args, "ii:batch_indices", &epoch, &b))
        return NULL;
    if (b < 0 || b >= ptl_loader_num_batches(L))
        return PyErr_Format(PyExc_IndexError, "batch %d out of range [0, %d)", b, ptl_loader_num_batches(L));
    ptl_loader_batch_slice(L, b, &gb, &start, &n);
    npy_intp d[1] = {n};
    PyObject *a = PyArray_SimpleNew(1, d, NPY_INT64);
    if (!a)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_loader_batch_indices(L, epoch, b, PyArray_DATA((PyArrayObject *)a), n, &n);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        Py_DECREF(a);
        return ptl_raise(o->module);
    }
    return a;
}

static PyObject *loader_fixed_order(PyObject *self, PyObject *args)
{
    (void)args;
    ptl_loader *L = loader_of((LoaderObject *)self);
    return L ? PyBool_FromLong(ptl_loader_fixed_order(L)) : NULL;
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

static int fill_job(void *arg, const atomic_int *cancel) { return ptl_loader_fill_cache(arg, cancel); }

static PyObject *loader_fill_cache(PyObject *self, PyObject *args)
{
    (void)args;
    LoaderObject *o = (LoaderObject *)self;
    ptl_loader *L = loader_of(o);
    if (!L)
        return NULL;
    int rc = run_interruptible(fill_job, L);
    if (rc == -2)
        return NULL;
    if (rc != 0)
        return ptl_raise(o->module);
    Py_RETURN_NONE;
}

static PyObject *loader_num_failed(PyObject *self, PyObject *args)
{
    (void)args;
    ptl_loader *L = loader_of((LoaderObject *)self);
    return L ? PyLong_FromLong(ptl_loader_num_failed(L)) : NULL;
}

static PyObject *loader_problems(PyObject *self, PyObject *args)
{
    LoaderObject *o = (LoaderObject *)self;
    int start;
    ptl_loader *L = loader_of(o);
    if (!L || !PyArg_ParseTuple(args, "i:problems", &start))
        return NULL;
    int n = ptl_loader_num_problems(L);
    PyObject *out = PyList_New(0);
    char msg[1200];
    for (int i = start < 0 ? 0 : start; out && i < n; i++) {
        if (ptl_loader_problem(L, i, msg, sizeof msg) != 0) {
            Py_DECREF(out);
            return ptl_raise(o->module);
        }
        PyObject *s = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
        if (!s || PyList_Append(out, s) < 0) {
            Py_XDECREF(s);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(s);
    }
    return out;
}

static PyMethodDef loader_methods[] = {
    {"start", loader_start, METH_VARARGS, "start(epoch, mosaic): begin producing the batches of `epoch`."},
    {"next", loader_next, METH_VARARGS,
     "next() -> (images uint8 (N,H,W,3), targets float32 (T,6), indices int64 (N,), meta float64 (N,6), "
     "epoch, batch, sources int64 (N,)) or None at the end of the epoch."},
    {"sample", loader_sample, METH_VARARGS,
     "sample(epoch, index, mosaic) -> (image, targets (k,5), meta, source index)."},
    {"num_batches", loader_len, METH_NOARGS, "Batches per epoch (of this rank)."},
    {"num_global_batches", loader_global_len, METH_NOARGS, "Batches of the epoch's global plan (all ranks)."},
    {"batch_slices", loader_batch_slices, METH_NOARGS,
     "int64 (num_batches, 3): per batch of this rank, (global batch, first position in the epoch's order, size)."},
    {"batch_indices", loader_batch_indices, METH_VARARGS,
     "batch_indices(epoch, batch) -> int64 dataset indices of this rank's batch in that epoch (no images built)."},
    {"batch_shapes", loader_batch_shapes, METH_NOARGS, "int64 (num_batches, 2): (h, w) of every batch."},
    {"fixed_order", loader_fixed_order, METH_NOARGS, "Whether the batches keep one order every epoch (rect)."},
    {"cache_info", loader_cache_info, METH_NOARGS, "(bytes the cache needs, bytes filled)."},
    {"fill_cache", loader_fill_cache, METH_NOARGS, "Fill the RAM cache, or check and write the disk cache, now."},
    {"num_failed", loader_num_failed, METH_NOARGS, "Files that failed to decode since the scan (replaced)."},
    {"problems", loader_problems, METH_VARARGS, "problems(start) -> messages of the problems met from `start` on."},
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


/* labels[i]: a label file path (str), or (name, rows) with rows convertible to float32 (k, 5) (cls cx cy w h)
 * and name saying where they come from. The converted arrays are kept alive in *keep. */
static int label_list(PyObject *seq, Py_ssize_t n, ptl_label_src **out, PyObject **keep)
{
    ptl_label_src *v = PyMem_Calloc(n ? n : 1, sizeof(ptl_label_src));
    PyObject *arrays = PyList_New(0);
    if (!v || !arrays) {
        PyMem_Free(v);
        Py_XDECREF(arrays);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyList_GET_ITEM(seq, i), *name, *rows;
        if (PyUnicode_Check(it)) {
            if (!(v[i].path = PyUnicode_AsUTF8(it)))
                goto fail;
            continue;
        }
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2 || !PyUnicode_Check(name = PyTuple_GET_ITEM(it, 0))) {
            PyErr_Format(PyExc_TypeError, "labels[%zd]: expected a label file path or a (name, rows) tuple", i);
            goto fail;
        }
        rows = PyTuple_GET_ITEM(it, 1);
        PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(rows, NPY_FLOAT32, 2, 2, NPY_ARRAY_C_CONTIGUOUS);
        if (!a)
            goto fail;
        int bad = PyArray_DIM(a, 1) != 5 || PyList_Append(arrays, (PyObject *)a) < 0;
        Py_DECREF(a); /* kept by the list */
        if (bad) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "labels[%zd]: rows must be (k, 5): cls cx cy w h", i);
            goto fail;
        }
        if (!(v[i].name = PyUnicode_AsUTF8(name)))
            goto fail;
        v[i].rows = PyArray_DATA(a);
        v[i].nrows = (int)PyArray_DIM(a, 0);
    }
    *out = v;
    *keep = arrays;
    return 0;
fail:
    PyMem_Free(v);
    Py_DECREF(arrays);
    return -1;
}

typedef struct {
    const char *const *images;
    const ptl_label_src *labels;
    int n;
    ptl_scan_cfg cfg;
    ptl_dataset *ds;
} scan_args;

static int scan_job(void *arg, const atomic_int *cancel)
{
    scan_args *a = arg;
    return ptl_dataset_scan(a->images, a->labels, a->n, &a->cfg, cancel, &a->ds);
}

/* The scan's results for Python (problems, counts, shapes, files). */
static PyObject *scan_info(const ptl_dataset *ds)
{
    PyObject *log = PyList_New(ds->log.n), *shapes = NULL, *files = NULL, *unsup = NULL;
    npy_intp dims[2] = {ds->n, 2};
    if (!log || !(shapes = PyArray_SimpleNew(2, dims, NPY_INT64)) || !(files = PyList_New(ds->n)) ||
        !(unsup = PyDict_New()))
        goto fail;
    for (int i = 0; i < ds->log.n; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(ds->log.msg[i], (Py_ssize_t)strlen(ds->log.msg[i]), "replace");
        if (!s)
            goto fail;
        PyList_SET_ITEM(log, i, s);
    }
    for (int i = 0; i < ds->n; i++) {
        int64_t *p = (int64_t *)PyArray_DATA((PyArrayObject *)shapes) + 2 * i;
        p[0] = ds->items[i].h0;
        p[1] = ds->items[i].w0;
        PyObject *s = PyUnicode_DecodeFSDefault(ds->items[i].image);
        if (!s)
            goto fail;
        PyList_SET_ITEM(files, i, s);
    }
    for (int f = 0; f < PTL_FMT_COUNT; f++) {
        PyObject *c = ds->n_unsupported[f] ? PyLong_FromLong(ds->n_unsupported[f]) : NULL;
        if (ds->n_unsupported[f] && (!c || PyDict_SetItemString(unsup, ptl_image_format_name(f), c) < 0)) {
            Py_XDECREF(c);
            goto fail;
        }
        Py_XDECREF(c);
    }
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:L,s:i,s:N,s:N,s:N,s:N}", "n", ds->n, "skipped", ds->n_skipped,
                         "duplicates", ds->n_duplicates, "missing_labels", ds->n_missing_labels, "labeled",
                         ds->n_labeled, "empty", ds->n_empty, "boxes", (long long)ds->n_boxes, "max_labels",
                         ds->max_labels, "log", log, "shapes", shapes, "files", files, "unsupported", unsup);
fail:
    Py_XDECREF(log);
    Py_XDECREF(shapes);
    Py_XDECREF(files);
    Py_XDECREF(unsup);
    return NULL;
}

static PyObject *data_loader(PyObject *module, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"images", "labels", "nc", "imgsz", "batch", "workers", "train", "rect", "cache",
                             "persistent", "prefetch", "seed", "mosaic", "degrees", "translate", "scale",
                             "shear", "perspective", "hsv_h", "hsv_s", "hsv_v", "flipud", "fliplr", "pinned",
                             "single_cls", "max_pixels", "scale_pixels", "cache_paths", "rank", "world", "shard",
                             NULL};
    PyObject *images, *labels, *cache_obj = Py_None, *info = NULL, *keep = NULL, *r = NULL;
    ptl_loader_cfg c;
    scan_args sa;
    unsigned long long seed = 0;
    long long max_pixels = PTL_MAX_PIXELS_DEFAULT, scale_pixels = PTL_JPEG_SCALE_PIXELS_DEFAULT;
    int nc, single_cls = 0, rc;
    const char **im = NULL, **cp = NULL;
    ptl_label_src *lb = NULL;
    ptl_loader *L = NULL;
    LoaderObject *o = NULL;
    memset(&c, 0, sizeof c);
    memset(&sa, 0, sizeof sa);
    c.world = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!i(ii)iippipiKfffffffffffp|pLLOiii:data_loader", kwlist,
                                     &PyList_Type, &images, &PyList_Type, &labels, &nc, &c.imgsz_h, &c.imgsz_w,
                                     &c.batch, &c.workers, &c.train, &c.rect, &c.cache, &c.persistent, &c.prefetch,
                                     &seed, &c.mosaic, &c.degrees, &c.translate, &c.scale, &c.shear, &c.perspective,
                                     &c.hsv_h, &c.hsv_s, &c.hsv_v, &c.flipud, &c.fliplr, &c.pinned, &single_cls,
                                     &max_pixels, &scale_pixels, &cache_obj, &c.rank, &c.world, &c.shard))
        return NULL;
    c.seed = seed;
    c.max_pixels = max_pixels;
    c.scale_pixels = scale_pixels;
    Py_ssize_t n = PyList_GET_SIZE(images);
    if (PyList_GET_SIZE(labels) != n)
        return PyErr_Format(PyExc_ValueError, "labels: expected %zd entries (one per image), got %zd", n,
                            PyList_GET_SIZE(labels));
    if (n > 0x7fffffff)
        return PyErr_Format(PyExc_ValueError, "images: too many (%zd)", n);
    if (str_list(images, "images", n, &im) < 0 || label_list(labels, n, &lb, &keep) < 0)
        goto done;
    sa.images = im, sa.labels = lb, sa.n = (int)n;
    sa.cfg.rules.nc = nc, sa.cfg.rules.single_cls = single_cls;
    sa.cfg.load_w = c.imgsz_w, sa.cfg.load_h = c.imgsz_h;
    sa.cfg.threads = c.workers > 0 ? c.workers : 1;
    sa.cfg.max_pixels = c.max_pixels;
    rc = run_interruptible(scan_job, &sa);
    if (rc == -2)
        goto done;
    if (rc != 0) {
        ptl_raise(module);
        goto done;
    }
    if (!(info = scan_info(sa.ds)))
        goto done;
    if (sa.ds->n == 0) {
        r = Py_BuildValue("(OO)", Py_None, info);
        goto done;
    }
    if (c.cache == PTL_CACHE_DISK) {
        /* cache_paths follows images; the loader wants one per usable image. */
        if (!PyList_Check(cache_obj) || PyList_GET_SIZE(cache_obj) != n) {
            PyErr_Format(PyExc_ValueError, "cache_paths: expected a list of %zd paths (one per image)", n);
            goto done;
        }
        const char **all;
        if (str_list(cache_obj, "cache_paths", n, &all) < 0)
            goto done;
        cp = PyMem_Calloc((size_t)sa.ds->n, sizeof(char *));
        if (!cp) {
            PyMem_Free(all);
            PyErr_NoMemory();
            goto done;
        }
        for (int i = 0; i < sa.ds->n; i++)
            cp[i] = all[sa.ds->items[i].index];
        PyMem_Free(all);
    }
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_loader_create(sa.ds, &c, cp, &L);
    Py_END_ALLOW_THREADS
    sa.ds = NULL; /* owned by the loader (freed by it on failure) */
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
    r = Py_BuildValue("(NO)", o, info);
done:
    ptl_dataset_free(sa.ds);
    Py_XDECREF(info);
    Py_XDECREF(keep);
    PyMem_Free(im);
    PyMem_Free(lb);
    PyMem_Free(cp);
    return r;
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

static PyMethodDef methods[] = {
    {"data_loader", (PyCFunction)(void (*)(void))data_loader, METH_VARARGS | METH_KEYWORDS,
     "data_loader(images, labels, nc, imgsz (h, w), batch, workers, train, rect, cache (0 none, 1 ram, 2 disk), "
     "persistent, prefetch, seed, mosaic, degrees, translate, scale, shear, perspective, hsv_h, hsv_s, hsv_v, "
     "flipud, fliplr, pinned, single_cls=False, max_pixels=DATA_MAX_PIXELS, scale_pixels=DATA_JPEG_SCALE_PIXELS, "
     "cache_paths=None, rank=0, world=1, shard=0 (0 split, 1 deal)) -> (loader or None when no image is usable, "
     "info dict). labels[i]: a label file path or (name, rows (k, 5)). Scans the files (problems go to "
     "info['log']); cache_paths (disk cache): one file per image; rank/world/shard: this process's share of every "
     "epoch (csrc/data/dataset.h)."},
    {"data_normalize", data_normalize, METH_VARARGS,
     "data_normalize(src uint8 Tensor, dst float Tensor on the same device): dst = src / 255."},
    {"data_upload", ptl_py_data_upload, METH_VARARGS,
     "data_upload(images uint8 ndarray, dst Tensor, staging uint8 Tensor (CUDA only)): asynchronous copy to "
     "the device and normalisation into dst on the device's stream."},
    {NULL, NULL, 0, NULL},
};

/* The data area's defaults and the image formats of this build, for Python. */
static int add_constants(PyObject *module)
{
    PyObject *formats = PyDict_New();
    if (!formats)
        return -1;
    for (int f = PTL_FMT_JPEG; f < PTL_FMT_COUNT; f++)
        if (PyDict_SetItemString(formats, ptl_image_format_name(f), ptl_image_format_built(f) ? Py_True : Py_False) <
            0) {
            Py_DECREF(formats);
            return -1;
        }
    if (PyModule_AddObject(module, "DATA_FORMATS", formats) < 0) {
        Py_DECREF(formats);
        return -1;
    }
    PyObject *mp = PyLong_FromLongLong(PTL_MAX_PIXELS_DEFAULT), *sp = PyLong_FromLongLong(PTL_JPEG_SCALE_PIXELS_DEFAULT);
    int rc = mp && sp && PyModule_AddObjectRef(module, "DATA_MAX_PIXELS", mp) == 0 &&
                     PyModule_AddObjectRef(module, "DATA_JPEG_SCALE_PIXELS", sp) == 0
                 ? 0
                 : -1;
    Py_XDECREF(mp);
    Py_XDECREF(sp);
    return rc;
}

int ptl_register_data(PyObject *module)
{
    if (!loader_type && !(loader_type = PyType_FromSpec(&loader_spec)))
        return -1;
    if (!slot_type && !(slot_type = PyType_FromSpec(&slot_spec)))
        return -1;
    if (add_constants(module) < 0 || ptl_register_data_pieces(module) < 0)
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
