/* Python bindings of the data pipeline's pieces, for tests: NumPy in, NumPy out. */
#include "../py.h"

#include "../numpy_api.h"
#include "dataset.h"
#include "py_data.h"

static PyObject *array_copy(int nd, npy_intp *dims, int type, const void *src, size_t nbytes)
{
    PyObject *a = PyArray_SimpleNew(nd, dims, type);
    if (a && nbytes)
        memcpy(PyArray_DATA((PyArrayObject *)a), src, nbytes);
    return a;
}

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
    int k, w, h, xc, yc, sw, sh, a[4], b[4];
    if (!PyArg_ParseTuple(args, "iiiiiii", &k, &w, &h, &xc, &yc, &sw, &sh))
        return NULL;
    ptl_mosaic_rects(k, w, h, xc, yc, sw, sh, a, b);
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

static PyObject *t_decode(PyObject *module, PyObject *args)
{
    const char *path;
    ptl_decode_req rq = {0, 0, 0, 0, 0, 0};
    long long maxp, scale;
    int w0, h0, rc;
    ptl_image im;
    if (!PyArg_ParseTuple(args, "siiLL", &path, &rq.target_w, &rq.target_h, &maxp, &scale))
        return NULL;
    rq.max_pixels = maxp, rq.scale_pixels = scale;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_image_decode(path, &rq, &im, &w0, &h0);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(module);
    npy_intp d[3] = {im.h, im.w, 3};
    PyObject *out = array_copy(3, d, NPY_UINT8, im.data, (size_t)im.w * im.h * 3);
    ptl_image_free(&im);
    return out ? Py_BuildValue("(Nii)", out, w0, h0) : NULL;
}

static PyMethodDef methods[] = {
    {"data_t_resize", t_resize, METH_VARARGS, "(img, w, h) -> bilinear resize (tests)."},
    {"data_t_letterbox", t_letterbox, METH_VARARGS, "(img, H, W, scaleup) -> (img, r, left, top) (tests)."},
    {"data_t_mosaic_rects", t_mosaic_rects, METH_VARARGS, "(k, w, h, xc, yc, sw, sh) -> (dst, src) (tests)."},
    {"data_t_affine_matrix", t_affine_matrix, METH_VARARGS,
     "(w_in, h_in, w_out, h_out, u[8], degrees, translate, scale, shear, perspective) -> (M, sigma) (tests)."},
    {"data_t_warp", t_warp, METH_VARARGS, "(img, M, w_out, h_out) -> img (tests)."},
    {"data_t_boxes_affine", t_boxes_affine, METH_VARARGS,
     "(boxes (n,5) cls x1 y1 x2 y2, M, sigma, w_out, h_out, area_thr) -> kept boxes (tests)."},
    {"data_t_hsv", t_hsv, METH_VARARGS, "(img, (r0, r1, r2)) -> img (tests)."},
    {"data_t_flip", t_flip, METH_VARARGS, "(img, boxes, lr) -> (img, boxes) (tests)."},
    {"data_t_decode", t_decode, METH_VARARGS,
     "(path, target_w, target_h, max_pixels, scale_pixels) -> (decoded image, w0, h0) as the loader decodes "
     "before its resize (tests: the pixel limit and the DCT-scaled size)."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_data_pieces(PyObject *module) { return PyModule_AddFunctions(module, methods); }
