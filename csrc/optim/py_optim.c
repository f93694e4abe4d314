/* Python bindings of the optim area: the optimizer step, the EMA update and a standalone Newton-Schulz
 * (tests and benchmarks). The tables are built and checked by ptl/optim.py. */
#include <stdio.h>

#include "py_optim.h"
#ifdef PTL_WITH_CUDA
#include "../cuda/device.h"
#endif


/* A tensor argument on `dev` with dtype dt, 1 or 2 dimensions as given, or NULL (with an exception). */
static PtlTensor *table_arg(PyObject *module, PyObject *obj, const char *arg, const ptl_device *dev, int64_t cols)
{
    int64_t shape[2] = {-1, cols};
    return ptl_tensor_arg(module, obj, arg, PTL_INT64, dev, 2, shape);
}

static int parse_group_seq(PyObject *seq, const char *arg, int n, double *out, int *iout)
{
    PyObject *fast = PySequence_Fast(seq, arg);
    if (!fast)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "%s: expected %d values (one per group), got %zd", arg, n,
                     PySequence_Fast_GET_SIZE(fast));
        Py_DECREF(fast);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(fast, i);
        if (iout) {
            long v = PyLong_AsLong(it);
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(fast);
                return -1;
            }
            iout[i] = (int)v;
        } else {
            double v = PyFloat_AsDouble(it);
            if (v == -1.0 && PyErr_Occurred()) {
                Py_DECREF(fast);
                return -1;
            }
            out[i] = v;
        }
    }
    Py_DECREF(fast);
    return 0;
}

#define NS_GRAPH_NAME "ptl.optim.ns_graph"

static void ns_graph_free(PyObject *cap)
{
    ptl_ns_graph *g = (ptl_ns_graph *)PyCapsule_GetPointer(cap, NS_GRAPH_NAME);
#ifdef PTL_WITH_CUDA
    ptl_ns_graph_release(g);
#endif
    PyMem_Free(g);
}

/* _optim_ns_graph(): a fresh replay slot for one optimizer's Newton-Schulz work (see optim.h). */
static PyObject *py_optim_ns_graph(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    ptl_ns_graph *g = (ptl_ns_graph *)PyMem_Calloc(1, sizeof *g);
    if (!g)
        return PyErr_NoMemory();
    PyObject *cap = PyCapsule_New(g, NS_GRAPH_NAME, ns_graph_free);
    if (!cap)
        PyMem_Free(g);
    return cap;
}

/* _optim_ns_graph_state(slot) -> (state, eager_runs, why, lanes): state 0 eager, 1 replaying, 2 capture failed;
 * lanes: the streams its products run on beside each other (0: one stream). */
static PyObject *py_optim_ns_graph_state(PyObject *module, PyObject *cap)
{
    (void)module;
    ptl_ns_graph *g = (ptl_ns_graph *)PyCapsule_GetPointer(cap, NS_GRAPH_NAME);
    if (!g)
        return NULL;
    return Py_BuildValue("iisi", g->state, g->eager_runs, g->why, g->lanes ? PTL_NS_LANES : 0);
}

/* The keywords of _optim_step as buffers, settings and replay slot (lrs, momenta, wds optional: a
 * training-step plan gets them per step). Converts only; the step checks the values. */
int ptl_py_optim_parse(PyObject *module, PyObject *args, PyObject *kw, ptl_optim_buffers *b, ptl_optim_hp *hp,
                       ptl_ns_graph **graph, ptl_device *devp, int *have_rates)
{
    static char *kwlist[] = {"params", "grads", "state1", "state2", "scalars", "ptab", "call", "cmuon", "sgtab",
                             "ws_bf16", "ws_f64", "tx", "ta", "nmuon", "kinds", "lrs", "momenta", "wds", "muon_w",
                             "sgd_w", "beta2", "eps", "nesterov", "max_norm", "scaler", "growth_factor",
                             "backoff_factor", "growth_interval", "ns_bf16", "zero_grad", "ns_graph", "world", NULL};
    PyObject *o_p, *o_g, *o_s1, *o_s2, *o_sc, *o_pt, *o_ca, *o_cm, *o_sg, *o_wb, *o_wf, *o_kinds, *o_lrs = NULL,
                                                                                             *o_mom = NULL,
                                                                                             *o_wds = NULL,
                                                                                             *o_graph = Py_None;
    long long tx, ta, nmuon;
    memset(hp, 0, sizeof *hp);
    hp->muon_w = PTL_OPT_MUON_W;
    hp->sgd_w = PTL_OPT_SGD_W;
    hp->beta2 = PTL_OPT_BETA2;
    hp->eps = PTL_OPT_EPS;
    hp->nesterov = 1;
    hp->max_norm = PTL_OPT_MAX_NORM;
    hp->growth_factor = PTL_OPT_GROWTH_FACTOR;
    hp->backoff_factor = PTL_OPT_BACKOFF_FACTOR;
    hp->growth_interval = PTL_OPT_GROWTH_INTERVAL;
    hp->zero_grad = 1;
    hp->world = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOOOOLLLO|OOOddddpdpddippOi:_optim_step", kwlist, &o_p, &o_g,
                                     &o_s1, &o_s2, &o_sc, &o_pt, &o_ca, &o_cm, &o_sg, &o_wb, &o_wf, &tx, &ta, &nmuon,
                                     &o_kinds, &o_lrs, &o_mom, &o_wds, &hp->muon_w, &hp->sgd_w, &hp->beta2, &hp->eps,
                                     &hp->nesterov, &hp->max_norm, &hp->scaler, &hp->growth_factor,
                                     &hp->backoff_factor, &hp->growth_interval, &hp->ns_bf16, &hp->zero_grad,
                                     &o_graph, &hp->world))
        return -1;
    *graph = NULL;
    if (o_graph != Py_None && !(*graph = (ptl_ns_graph *)PyCapsule_GetPointer(o_graph, NS_GRAPH_NAME)))
        return -1;
    PtlTensor *p = ptl_tensor_arg(module, o_p, "params", -1, NULL, 1, NULL);
    if (!p)
        return -1;
    ptl_device dev = p->storage->device;
    int64_t n = p->shape[0], shape1[1] = {n}, shape_sc[1] = {-1};
    PtlTensor *g = ptl_tensor_arg(module, o_g, "grads", p->dtype, &dev, 1, shape1);
    if (!g)
        return -1;
    PtlTensor *s1 = NULL;
    if (o_s1 != Py_None && !(s1 = ptl_tensor_arg(module, o_s1, "state1", p->dtype, &dev, 1, shape1)))
        return -1;
    PtlTensor *s2 = ptl_tensor_arg(module, o_s2, "state2", p->dtype, &dev, 1, shape1);
    PtlTensor *sc = s2 ? ptl_tensor_arg(module, o_sc, "scalars", p->dtype, &dev, 1, shape_sc) : NULL;
    if (!sc)
        return -1;
    if (sc->shape[0] < PTL_OPT_S_N) {
        PyErr_Format(PyExc_ValueError, "scalars: expected at least %d entries, got %lld", PTL_OPT_S_N,
                     (long long)sc->shape[0]);
        return -1;
    }
    PtlTensor *pt = table_arg(module, o_pt, "ptab", &dev, PTL_PT_NCOLS);
    PtlTensor *ca = pt ? table_arg(module, o_ca, "call", &dev, 3) : NULL;
    PtlTensor *cm = ca ? table_arg(module, o_cm, "cmuon", &dev, 3) : NULL;
    ptl_device cpu = {PTL_CPU, 0};
    PtlTensor *sg = cm ? table_arg(module, o_sg, "sgtab", &cpu, 7) : NULL;
    if (!sg)
        return -1;
    PtlTensor *wb = NULL, *wf = NULL;
    if (o_wb != Py_None && !(wb = ptl_tensor_arg(module, o_wb, "ws_bf16", PTL_BFLOAT16, &dev, 1, NULL)))
        return -1;
    if (o_wf != Py_None && !(wf = ptl_tensor_arg(module, o_wf, "ws_f64", PTL_FLOAT64, &dev, 1, NULL)))
        return -1;
    hp->ngroups = (int)PyObject_Length(o_kinds);
    if (hp->ngroups < 0)
        return -1;
    if (hp->ngroups < 1 || hp->ngroups > PTL_OPT_MAX_GROUPS) {
        PyErr_Format(PyExc_ValueError, "kinds: expected 1 to %d groups, got %d", PTL_OPT_MAX_GROUPS, hp->ngroups);
        return -1;
    }
    if (parse_group_seq(o_kinds, "kinds", hp->ngroups, NULL, hp->kind) < 0)
        return -1;
    *have_rates = o_lrs && o_mom && o_wds;
    if (*have_rates && (ptl_py_optim_rates(o_lrs, o_mom, o_wds, hp) < 0))
        return -1;
    *b = (ptl_optim_buffers){
        .params = ptl_tensor_data(p),
        .grads = ptl_tensor_data(g),
        .state1 = s1 ? ptl_tensor_data(s1) : NULL,
        .state2 = ptl_tensor_data(s2),
        .scalars = ptl_tensor_data(sc),
        .n = n,
        .dtype = p->dtype,
        .ptab = (const int64_t *)ptl_tensor_data(pt),
        .call = (const int64_t *)ptl_tensor_data(ca),
        .cmuon = (const int64_t *)ptl_tensor_data(cm),
        .sgtab = (const int64_t *)ptl_tensor_data(sg),
        .nparams = pt->shape[0],
        .nchunks = ca->shape[0],
        .nmuon_chunks = cm->shape[0],
        .nsg = sg->shape[0],
        .nmuon = nmuon,
        .tx = tx,
        .ta = ta,
        .ws_bf16 = wb ? ptl_tensor_data(wb) : NULL,
        .ws_f64 = wf ? ptl_tensor_data(wf) : NULL,
    };
    if (wf && wf->shape[0] < b->nchunks + b->nmuon_chunks + b->nmuon) {
        PyErr_SetString(PyExc_ValueError, "ws_f64: smaller than the chunk tables need");
        return -1;
    }
    if (wb && tx >= 0 && ta >= 0 && wb->shape[0] < 2 * tx + 2 * ta) {
        PyErr_SetString(PyExc_ValueError, "ws_bf16: smaller than 2 tx + 2 ta");
        return -1;
    }
    *devp = dev;
    return 0;
}

int ptl_py_optim_rates(PyObject *lrs, PyObject *momenta, PyObject *wds, ptl_optim_hp *hp)
{
    if (parse_group_seq(lrs, "lrs", hp->ngroups, hp->lr, NULL) < 0 ||
        parse_group_seq(momenta, "momenta", hp->ngroups, hp->momentum, NULL) < 0 ||
        parse_group_seq(wds, "wds", hp->ngroups, hp->wd, NULL) < 0)
        return -1;
    return 0;
}

static PyObject *py_optim_step(PyObject *module, PyObject *args, PyObject *kw)
{
    ptl_optim_buffers b;
    ptl_optim_hp hp;
    ptl_ns_graph *graph;
    ptl_device dev;
    int have_rates, rc;
    if (ptl_py_optim_parse(module, args, kw, &b, &hp, &graph, &dev, &have_rates) < 0)
        return NULL;
    if (!have_rates) {
        PyErr_SetString(PyExc_TypeError, "_optim_step: lrs, momenta and wds are required");
        return NULL;
    }
    struct ptl_cuda_ctx *ctx;
    if (ptl_py_exec_ctx(module, dev, &ctx) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_optim_step(ctx, &b, &hp, graph);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(module);
    Py_RETURN_NONE;
}

/* _optim_ema(ema, model, decay): ema <- lerp(ema, model, 1 - decay), elementwise. */
static PyObject *py_optim_ema(PyObject *module, PyObject *args)
{
    PyObject *o_e, *o_m;
    double decay;
    if (!PyArg_ParseTuple(args, "OOd:_optim_ema", &o_e, &o_m, &decay))
        return NULL;
    PtlTensor *e = ptl_tensor_arg(module, o_e, "ema", -1, NULL, -1, NULL);
    if (!e)
        return NULL;
    ptl_device dev = e->storage->device;
    PtlTensor *m = ptl_tensor_arg(module, o_m, "model", e->dtype, &dev, -1, NULL);
    if (!m)
        return NULL;
    int64_t n = ptl_tensor_numel(e);
    if (ptl_tensor_numel(m) != n) {
        PyErr_Format(PyExc_ValueError, "model: expected %lld elements like ema, got %lld", (long long)n,
                     (long long)ptl_tensor_numel(m));
        return NULL;
    }
    struct ptl_cuda_ctx *ctx;
    if (ptl_py_exec_ctx(module, dev, &ctx) < 0)
        return NULL;
    int rc;
    void *ed = ptl_tensor_data(e);
    const void *md = ptl_tensor_data(m);
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_ema_update(ctx, ed, md, n, e->dtype, decay);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(module);
    Py_RETURN_NONE;
}

/* _optim_newton_schulz(x, out, bf16): NS5 of each float32 matrix of x [B, rows, cols] into out.
 * On CUDA the work is bfloat16 (bf16 is ignored); it allocates its workspace (not a hot path). */
static PyObject *py_optim_newton_schulz(PyObject *module, PyObject *args)
{
    PyObject *o_x, *o_out;
    int bf16 = 0;
    if (!PyArg_ParseTuple(args, "OO|p:_optim_newton_schulz", &o_x, &o_out, &bf16))
        return NULL;
    PtlTensor *x = ptl_tensor_arg(module, o_x, "x", PTL_FLOAT32, NULL, 3, NULL);
    if (!x)
        return NULL;
    ptl_device dev = x->storage->device;
    PtlTensor *out = ptl_tensor_arg(module, o_out, "out", PTL_FLOAT32, &dev, 3, x->shape);
    if (!out)
        return NULL;
    int64_t bsz = x->shape[0], rows = x->shape[1], cols = x->shape[2];
    if (rows < 1 || cols < 1) {
        PyErr_Format(PyExc_ValueError, "x: matrices must be non-empty, got %lld x %lld", (long long)rows,
                     (long long)cols);
        return NULL;
    }
    int rc = 0;
    if (dev.type == PTL_CPU) {
        Py_BEGIN_ALLOW_THREADS
        rc = ptl_newton_schulz_cpu((const float *)ptl_tensor_data(x), (float *)ptl_tensor_data(out), bsz, rows, cols,
                                   bf16);
        Py_END_ALLOW_THREADS
    } else {
#ifdef PTL_WITH_CUDA
        ptl_cuda_ctx *ctx;
        if (ptl_py_exec_ctx(module, dev, &ctx) < 0)
            return NULL;
        int64_t r = rows < cols ? rows : cols, al = PTL_NS_ALIGN;
        int64_t xs = (rows * cols + al - 1) / al * al, as = (r * r + al - 1) / al * al;
        int64_t wsn[1] = {2 * bsz * xs + 2 * bsz * as}, nn[1] = {bsz > 0 ? bsz : 1};
        PtlTensor *ws = ptl_tensor_empty(module, 1, wsn, PTL_BFLOAT16, dev);
        if (!ws)
            return NULL;
        PtlTensor *norms = ptl_tensor_empty(module, 1, nn, PTL_FLOAT32, dev);
        if (!norms) {
            Py_DECREF(ws);
            return NULL;
        }
        Py_BEGIN_ALLOW_THREADS
        rc = ptl_newton_schulz_cuda(ctx->stream, ctx->cublas, (const float *)ptl_tensor_data(x),
                                    (float *)ptl_tensor_data(out), bsz, rows, cols, (uint16_t *)ptl_tensor_data(ws),
                                    (float *)ptl_tensor_data(norms));
        Py_END_ALLOW_THREADS
        Py_DECREF(ws);
        Py_DECREF(norms);
#else
        PyErr_SetString(PyExc_RuntimeError, "x: this build has no CUDA support");
        return NULL;
#endif
    }
    if (rc != 0)
        return ptl_raise(module);
    Py_RETURN_NONE;
}

/* _optim_copy(dst, src): copies src's elements into the existing tensor dst (same dtype and element count,
 * any devices). Checkpoint import and EMA initialisation write into buffers the network already holds. */
static PyObject *py_optim_copy(PyObject *module, PyObject *args)
{
    PyObject *o_d, *o_s;
    if (!PyArg_ParseTuple(args, "OO:_optim_copy", &o_d, &o_s))
        return NULL;
    PtlTensor *d = ptl_tensor_arg(module, o_d, "dst", -1, NULL, -1, NULL);
    PtlTensor *s = d ? ptl_tensor_arg(module, o_s, "src", d->dtype, NULL, -1, NULL) : NULL;
    if (!s)
        return NULL;
    if (ptl_tensor_numel(d) != ptl_tensor_numel(s)) {
        PyErr_Format(PyExc_ValueError, "src: expected %lld elements like dst, got %lld",
                     (long long)ptl_tensor_numel(d), (long long)ptl_tensor_numel(s));
        return NULL;
    }
    int rc;
    ptl_runtime *rt = ptl_state(module)->rt; /* Python API: before the GIL is released */
    Py_BEGIN_ALLOW_THREADS
    rc = ptl_copy_bytes(rt, ptl_tensor_data(d), d->storage->device, ptl_tensor_data(s),
                        s->storage->device, ptl_tensor_nbytes(d));
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return ptl_raise(module);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"_optim_copy", py_optim_copy, METH_VARARGS, "Copy src into the existing tensor dst."},
    {"_optim_step", (PyCFunction)(void (*)(void))py_optim_step, METH_VARARGS | METH_KEYWORDS,
     "One optimizer step over flat buffers (see ptl/optim.py)."},
    {"_optim_ns_graph", py_optim_ns_graph, METH_NOARGS, "A replay slot for the Newton-Schulz work."},
    {"_optim_ns_graph_state", py_optim_ns_graph_state, METH_O, "(state, eager_runs, why) of a replay slot."},
    {"_optim_ema", py_optim_ema, METH_VARARGS, "ema <- lerp(ema, model, 1 - decay)."},
    {"_optim_newton_schulz", py_optim_newton_schulz, METH_VARARGS, "Batched NS5 orthogonalisation."},
    {NULL, NULL, 0, NULL},
};

/* The layouts and defaults of optim.h, by name, for ptl/optim.py (one source: this header). */
static const char *const table_columns[] = {"off",  "numel", "rows", "cols", "group", "xoff",
                                            "tall", "midx",  "d2",   "d1",   "cfirst", "ccount", "frozen"};
static const char *const scalar_slots[] = {"scale", "growth", "found_inf", "norm", "coef", "step", "skipped"};
_Static_assert(sizeof table_columns / sizeof *table_columns == PTL_PT_NCOLS, "optim.h: ptab columns");
_Static_assert(sizeof scalar_slots / sizeof *scalar_slots == PTL_OPT_S_SKIPPED + 1, "optim.h: scalar slots");

static PyObject *names(const char *const *v, int n)
{
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *s = PyUnicode_FromString(v[i]);
        if (!s) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

int ptl_register_optim(PyObject *module)
{
    if (PyModule_AddFunctions(module, methods) < 0)
        return -1;
    PyObject *defaults = Py_BuildValue(
        "{s:i,s:i,s:d,s:d,s:d,s:d,s:d,s:d,s:d,s:i,s:(ddd),s:i,s:{s:i,s:i,s:i}}", "chunk", PTL_OPT_CHUNK, "ns_align",
        PTL_NS_ALIGN, "muon_w", PTL_OPT_MUON_W, "sgd_w", PTL_OPT_SGD_W, "beta2", PTL_OPT_BETA2, "eps", PTL_OPT_EPS,
        "max_norm", PTL_OPT_MAX_NORM, "growth_factor", PTL_OPT_GROWTH_FACTOR, "backoff_factor",
        PTL_OPT_BACKOFF_FACTOR, "growth_interval", PTL_OPT_GROWTH_INTERVAL, "ns_coeffs", PTL_NS_A, PTL_NS_B, PTL_NS_C,
        "max_groups", PTL_OPT_MAX_GROUPS, "kinds", "sgd", PTL_OPT_SGD, "muon", PTL_OPT_MUON, "adamw", PTL_OPT_ADAMW);
    if (ptl_py_add(module, "OPTIM_DEFAULTS", defaults) < 0 ||
        ptl_py_add(module, "OPTIM_TABLE_COLUMNS", names(table_columns, PTL_PT_NCOLS)) < 0 ||
        ptl_py_add(module, "OPTIM_SCALARS", names(scalar_slots, PTL_OPT_S_SKIPPED + 1)) < 0 ||
        PyModule_AddIntConstant(module, "OPTIM_NUM_SCALARS", PTL_OPT_S_N) < 0 ||
        PyModule_AddIntConstant(module, "NS_LANES", PTL_NS_LANES) < 0)
        return -1;
    return 0;
}
