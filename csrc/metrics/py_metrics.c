/* Python bindings of the metrics area. postprocess works on ptl Tensors (CPU or CUDA); the per-
 * validation functions take contiguous host buffers (NumPy arrays) that ptl/metrics.py prepares,
 * including the output arrays, so this file needs no NumPy C API. */
#include <string.h>

#include "../py.h"
#include "metrics.h"
#include "postprocess.h"

/* A C-contiguous buffer of `numel` items (any if < 0) of kind 'f' (float), 'i' (signed) or 'u'
 * (unsigned) and the given item size. */
static int buffer_arg(PyObject *obj, const char *arg, char kind, Py_ssize_t itemsize, int writable,
                      Py_ssize_t numel, Py_buffer *view)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous%s array, got %.100s", arg,
                     writable ? " writable" : "", Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char *fmt = view->format ? view->format : "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<')
        fmt++;
    char k = 0;
    if (strlen(fmt) == 1) {
        if (strchr("fde", *fmt))
            k = 'f';
        else if (strchr("bhilq", *fmt))
            k = 'i';
        else if (strchr("BHILQ?", *fmt))
            k = 'u';
    }
    if (k != kind || view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s%d items, got format '%s' of %zd bytes", arg,
                     kind == 'f' ? "float" : kind == 'i' ? "int" : "uint", (int)(8 * itemsize), view->format,
                     view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    if (numel >= 0 && view->len != numel * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items, got %zd", arg, numel, view->len / itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

#ifdef PTL_WITH_CUDA
#define ON_CUDA(call) (call)
#else
#define ON_CUDA(call) ptl_set_error(PTL_ERR_VALUE, "ptl was built without CUDA")
#endif

/* A postprocess or NMS call: the head outputs it reads, the detections it writes and, on CUDA, its sort
 * keys. */
typedef struct {
    PtlTensor *boxes, *scores, *out, *count, *keys;
    int64_t B, A, nc;
    ptl_device dev;
    ptl_runtime *rt;
} det_call;

/* boxes (B, A, 4) and scores (B, A, nc), float32 on one device. -1 after raising. */
static int det_inputs(PyObject *self, PyObject *bo, PyObject *so, det_call *c)
{
    const int64_t bshape[3] = {-1, -1, 4};
    if (!(c->boxes = ptl_tensor_arg(self, bo, "boxes", PTL_FLOAT32, NULL, 3, bshape)))
        return -1;
    c->B = c->boxes->shape[0];
    c->A = c->boxes->shape[1];
    c->dev = c->boxes->storage->device;
    c->rt = ptl_state(self)->rt;
    const int64_t sshape[3] = {c->B, c->A, -1};
    if (!(c->scores = ptl_tensor_arg(self, so, "scores", PTL_FLOAT32, &c->dev, 3, sshape)))
        return -1;
    c->nc = c->scores->shape[2];
    return 0;
}

/* out (B, k, 6) float32 and count (B) int32 on the inputs' device, and nkeys int64 sort keys on CUDA.
 * -1 after raising, with nothing held. */
static int det_outputs(PyObject *self, det_call *c, int64_t k, int64_t nkeys)
{
    const int64_t oshape[3] = {c->B, k, 6}, cshape[1] = {c->B}, kshape[1] = {nkeys};
    if (!(c->out = ptl_tensor_empty(self, 3, oshape, PTL_FLOAT32, c->dev)) ||
        !(c->count = ptl_tensor_empty(self, 1, cshape, PTL_INT32, c->dev)) ||
        (c->dev.type != PTL_CPU && !(c->keys = ptl_tensor_empty(self, 1, kshape, PTL_INT64, c->dev)))) {
        Py_CLEAR(c->out);
        Py_CLEAR(c->count);
        return -1;
    }
    return 0;
}

#define DET_DATA(c) ptl_tensor_data((c).out), ptl_tensor_data((c).count)

/* (out, count) of a call whose kernel returned rc, or NULL after raising. */
static PyObject *det_result(PyObject *self, det_call *c, int rc)
{
    Py_CLEAR(c->keys);
    if (rc != 0) {
        Py_CLEAR(c->out);
        Py_CLEAR(c->count);
        return ptl_raise(self);
    }
    return Py_BuildValue("(NN)", (PyObject *)c->out, (PyObject *)c->count);
}

static PyObject *py_postprocess(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"boxes", "scores", "img_h", "img_w", "max_det", "conf", NULL};
    PyObject *bo, *so;
    int img_h, img_w, max_det = 300, rc;
    float conf = 0.001f;
    det_call c = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOii|if:postprocess", kwlist, &bo, &so, &img_h, &img_w, &max_det,
                                     &conf) ||
        det_inputs(self, bo, so, &c))
        return NULL;
    const int64_t k = ptl_postprocess_check(c.B, c.A, c.nc, img_h, img_w, max_det);
    if (k < 0)
        return ptl_raise(self);
    if (det_outputs(self, &c, k, c.B * c.A))
        return NULL;
    const float *boxes = ptl_tensor_data(c.boxes), *scores = ptl_tensor_data(c.scores);
    Py_BEGIN_ALLOW_THREADS;
    rc = c.dev.type == PTL_CPU ? ptl_postprocess_cpu(boxes, scores, c.B, c.A, c.nc, img_h, img_w, max_det, conf,
                                                     DET_DATA(c))
                               : ON_CUDA(ptl_postprocess_cuda(c.rt, c.dev.index, boxes, scores, c.B, c.A, c.nc, img_h,
                                                              img_w, max_det, conf, ptl_tensor_data(c.keys),
                                                              DET_DATA(c)));
    Py_END_ALLOW_THREADS;
    return det_result(self, &c, rc);
}

static PyObject *py_nms(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"boxes", "scores", "img_h", "img_w", "max_det", "conf", "iou",
                             "max_nms", "agnostic", "multi_label", NULL};
    PyObject *bo, *so;
    int img_h, img_w, max_det = 300, max_nms = PTL_NMS_MAX_NMS, agnostic = 0, multi_label = 1, rc;
    float conf = 0.001f;
    double iou = 0.7;
    det_call c = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOii|ifdipp:nms", kwlist, &bo, &so, &img_h, &img_w, &max_det, &conf,
                                     &iou, &max_nms, &agnostic, &multi_label) ||
        det_inputs(self, bo, so, &c))
        return NULL;
    if (ptl_nms_check(c.B, c.A, c.nc, img_h, img_w, max_det, max_nms, iou) < 0)
        return ptl_raise(self);
    int64_t cap = 1; /* the CUDA sort's keys per image: max_nms rounded up to a power of two */
    while (cap < max_nms)
        cap *= 2;
    if (det_outputs(self, &c, max_det, c.B * cap))
        return NULL;
    const float *boxes = ptl_tensor_data(c.boxes), *scores = ptl_tensor_data(c.scores);
    Py_BEGIN_ALLOW_THREADS;
    rc = c.dev.type == PTL_CPU ? ptl_nms_cpu(boxes, scores, c.B, c.A, c.nc, img_h, img_w, max_det, conf, iou, max_nms,
                                             agnostic, multi_label, DET_DATA(c))
                               : ON_CUDA(ptl_nms_cuda(c.rt, c.dev.index, boxes, scores, c.B, c.A, c.nc, img_h, img_w,
                                                      max_det, conf, iou, max_nms, agnostic, multi_label,
                                                      ptl_tensor_data(c.keys), DET_DATA(c)));
    Py_END_ALLOW_THREADS;
    return det_result(self, &c, rc);
}

static PyObject *py_scale_boxes(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *bo;
    double gx, gy, px, py, w, h;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "Odddddd:scale_boxes", &bo, &gx, &gy, &px, &py, &w, &h))
        return NULL;
    if (!(gx > 0.0) || !(gy > 0.0))
        return PyErr_Format(PyExc_ValueError, "scale_boxes: gain must be positive, got (%g, %g)", gx, gy);
    if (buffer_arg(bo, "boxes", 'f', 8, 1, -1, &b) < 0)
        return NULL;
    if (b.len % 32) {
        PyBuffer_Release(&b);
        return PyErr_Format(PyExc_ValueError, "boxes: expected (n, 4), got %zd values", b.len / 8);
    }
    ptl_scale_boxes((double *)b.buf, b.len / 32, gx, gy, px, py, w, h);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

static PyObject *py_match_predictions(PyObject *self, PyObject *args)
{
    PyObject *pbo, *pco, *gbo, *gco, *tpo;
    Py_buffer pb = {0}, pc = {0}, gb = {0}, gc = {0}, tp = {0};
    PyObject *ret = NULL;
    int rc;
    if (!PyArg_ParseTuple(args, "OOOOO:match_predictions", &pbo, &pco, &gbo, &gco, &tpo))
        return NULL;
    if (buffer_arg(pco, "pred_cls", 'i', 8, 0, -1, &pc) < 0)
        goto fail;
    if (buffer_arg(pbo, "pred_boxes", 'f', 4, 0, 4 * (pc.len / 8), &pb) < 0)
        goto fail;
    if (buffer_arg(gco, "gt_cls", 'i', 8, 0, -1, &gc) < 0)
        goto fail;
    if (buffer_arg(gbo, "gt_boxes", 'f', 4, 0, 4 * (gc.len / 8), &gb) < 0)
        goto fail;
    if (buffer_arg(tpo, "tp", 'u', 1, 1, PTL_NUM_IOU * (pc.len / 8), &tp) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_match_predictions(pc.len / 8, pb.buf, pc.buf, gc.len / 8, gb.buf, gc.buf, tp.buf);
    Py_END_ALLOW_THREADS;
    if (rc != 0) {
        ptl_raise(self);
        goto fail;
    }
    ret = Py_NewRef(Py_None);
fail:
    PyBuffer_Release(&pb);
    PyBuffer_Release(&pc);
    PyBuffer_Release(&gb);
    PyBuffer_Release(&gc);
    PyBuffer_Release(&tp);
    return ret;
}

static PyObject *py_confusion_update(PyObject *self, PyObject *args)
{
    enum { MAT, PB, PCONF, PCLS, GB, GCLS, NBUF };
    static const char *names[NBUF] = {"matrix", "pred_boxes", "pred_conf", "pred_cls", "gt_boxes", "gt_cls"};
    static const char kinds[NBUF] = {'i', 'f', 'f', 'i', 'f', 'i'};
    static const int sizes[NBUF] = {8, 4, 4, 8, 4, 8};
    PyObject *o[NBUF];
    Py_buffer b[NBUF];
    double conf, iou;
    int got = 0, rc;
    PyObject *ret = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOOdd:confusion_update", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &conf, &iou))
        return NULL;
    for (; got < NBUF; got++)
        if (buffer_arg(o[got], names[got], kinds[got], sizes[got], got == MAT, -1, &b[got]) < 0)
            goto fail;
    Py_ssize_t cells = b[MAT].len / 8, n = b[PCLS].len / 8, m = b[GCLS].len / 8, side = 1;
    while (side * side < cells)
        side++;
    if (side * side != cells || side < 2) {
        PyErr_Format(PyExc_ValueError, "matrix: expected (nc + 1, nc + 1) int64 with nc >= 1, got %zd cells", cells);
        goto fail;
    }
    if (b[PB].len != 16 * n || b[PCONF].len != 4 * n || b[GB].len != 16 * m) {
        PyErr_Format(PyExc_ValueError, "confusion_update: %zd predictions need pred_boxes (n, 4) and pred_conf (n), "
                     "%zd ground truths need gt_boxes (m, 4)", n, m);
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_confusion_update(b[MAT].buf, side - 1, n, b[PB].buf, b[PCONF].buf, b[PCLS].buf, m, b[GB].buf,
                              b[GCLS].buf, conf, iou);
    Py_END_ALLOW_THREADS;
    if (rc != 0) {
        ptl_raise(self);
        goto fail;
    }
    ret = Py_NewRef(Py_None);
fail:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&b[i]);
    return ret;
}

static PyObject *py_ap_per_class(PyObject *self, PyObject *args)
{
    enum { TP, CONF, PCLS, GCLS, CLASSES, NGT, NPRED, AP, P, R, F1, TPC, FPC, PCUR, RCUR, F1CUR, PRCUR, NBUF };
    static const char *names[NBUF] = {"tp", "conf", "pred_cls", "gt_cls", "classes", "n_gt", "n_pred", "ap",
                                      "precision", "recall", "f1", "tp_out", "fp_out", "p_curve", "r_curve",
                                      "f1_curve", "pr_curve"};
    static const char kinds[NBUF] = {'u', 'f', 'i', 'i', 'i', 'i', 'i', 'f', 'f', 'f', 'f', 'f', 'f', 'f', 'f', 'f', 'f'};
    PyObject *o[NBUF];
    Py_buffer b[NBUF];
    int got = 0, rc;
    PyObject *ret = NULL;
    ptl_ap_result res;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOOO:ap_per_class", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                          &o[7], &o[8], &o[9], &o[10], &o[11], &o[12], &o[13], &o[14], &o[15], &o[16]))
        return NULL;
    for (; got < NBUF; got++)
        if (buffer_arg(o[got], names[got], kinds[got], got == TP ? 1 : 8, got >= CLASSES, -1, &b[got]) < 0)
            goto fail;
    Py_ssize_t n = b[CONF].len / 8, m = b[GCLS].len / 8, cap = b[CLASSES].len / 8;
    for (int i = 0; i < NBUF; i++) {
        Py_ssize_t want = i == TP ? PTL_NUM_IOU * n : i == PCLS ? 8 * n : i == AP ? 8 * PTL_NUM_IOU * cap
                          : i >= PCUR ? 8 * PTL_AP_CURVE * cap : i > CLASSES ? 8 * cap : b[i].len;
        if (b[i].len != want) {
            PyErr_Format(PyExc_ValueError, "%s: expected %zd bytes, got %zd", names[i], want, b[i].len);
            goto fail;
        }
    }
    if (cap < m) {
        PyErr_Format(PyExc_ValueError, "classes: room for %zd classes, need up to %zd (one per ground truth)",
                     cap, m);
        goto fail;
    }
    res.capacity = cap;
    res.classes = b[CLASSES].buf;
    res.n_gt = b[NGT].buf;
    res.n_pred = b[NPRED].buf;
    res.ap = b[AP].buf;
    res.precision = b[P].buf;
    res.recall = b[R].buf;
    res.f1 = b[F1].buf;
    res.tp = b[TPC].buf;
    res.fp = b[FPC].buf;
    res.p_curve = b[PCUR].buf;
    res.r_curve = b[RCUR].buf;
    res.f1_curve = b[F1CUR].buf;
    res.pr_curve = b[PRCUR].buf;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_ap_per_class(n, b[TP].buf, b[CONF].buf, b[PCLS].buf, m, b[GCLS].buf, &res);
    Py_END_ALLOW_THREADS;
    if (rc != 0) {
        ptl_raise(self);
        goto fail;
    }
    ret = Py_BuildValue("{s:L,s:d,s:d,s:d,s:d,s:d,s:d,s:L,s:d}", "nclasses", (long long)res.nclasses, "mp", res.mp,
                        "mr", res.mr, "map50", res.map50, "map75", res.map75, "map", res.map, "fitness",
                        res.fitness, "best_index", (long long)res.best_index, "best_conf", res.best_conf);
fail:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&b[i]);
    return ret;
}

static PyObject *py_box_filter(PyObject *self, PyObject *args)
{
    PyObject *yo, *outo;
    long long width;
    Py_buffer y, out;
    int rc;
    if (!PyArg_ParseTuple(args, "OOL:box_filter", &yo, &outo, &width))
        return NULL;
    if (buffer_arg(yo, "y", 'f', 8, 0, -1, &y) < 0)
        return NULL;
    if (buffer_arg(outo, "out", 'f', 8, 1, y.len / 8, &out) < 0) {
        PyBuffer_Release(&y);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_box_filter(y.buf, (int64_t)(y.len / 8), (int64_t)width, out.buf);
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&y);
    PyBuffer_Release(&out);
    if (rc != 0) {
        ptl_raise(self);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"postprocess", (PyCFunction)(void (*)(void))py_postprocess, METH_VARARGS | METH_KEYWORDS,
     "postprocess(boxes, scores, img_h, img_w, max_det=300, conf=0.001) -> (out (B, k, 6), count (B,))\n"
     "End-to-end top-k of the o2o head on the tensors' device."},
    {"nms", (PyCFunction)(void (*)(void))py_nms, METH_VARARGS | METH_KEYWORDS,
     "nms(boxes, scores, img_h, img_w, max_det=300, conf=0.001, iou=0.7, max_nms=30000, agnostic=False, "
     "multi_label=True) -> (out (B, max_det, 6), count (B,))\nClass-aware NMS of the o2m head on the tensors' device."},
    {"scale_boxes", py_scale_boxes, METH_VARARGS,
     "scale_boxes(boxes f64 (n, 4), gain_x, gain_y, pad_x, pad_y, width, height): in place."},
    {"match_predictions", py_match_predictions, METH_VARARGS,
     "match_predictions(pred_boxes f32 (n, 4), pred_cls i64 (n), gt_boxes f32 (m, 4), gt_cls i64 (m), "
     "tp u8 (n, 10) out)"},
    {"confusion_update", py_confusion_update, METH_VARARGS,
     "confusion_update(matrix i64 (nc+1, nc+1) inout, pred_boxes f32 (n, 4), pred_conf f32, pred_cls i64, "
     "gt_boxes f32 (m, 4), gt_cls i64, conf, iou)"},
    {"ap_per_class", py_ap_per_class, METH_VARARGS,
     "ap_per_class(tp u8 (n, 10), conf f64, pred_cls i64, gt_cls i64, classes, n_gt, n_pred (i64 out), "
     "ap (cap, 10), precision, recall, f1, tp, fp (cap), p_curve, r_curve, f1_curve, pr_curve (cap, 1000) "
     "(f64 out)) -> dict of scalars"},
    {"box_filter", py_box_filter, METH_VARARGS,
     "box_filter(y f64 (n), out f64 (n) out, width): the centred mean over width (odd) points, edges repeated"},
    {NULL, NULL, 0, NULL},
};

int ptl_register_metrics(PyObject *module) { return PyModule_AddFunctions(module, methods); }
