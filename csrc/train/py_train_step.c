/* Python bindings of the training step (train_step.h): a plan made once per batch shape from a dict
 * (see ptl/engine.py Engine._plan), and the per-step call, which converts its arguments, runs the whole
 * step in C with the GIL released and returns the losses tensor (the only object it makes). */
#include "../py.h"

#include "../dist/py_dist.h"
#include "../fault.h"
#include "../nn/py_network.h"
#include "../optim/py_optim.h"
#include "train_step.h"
#ifdef PTL_WITH_CUDA
#include "../cuda/py_nccl.h"
#include "../cuda/upload_queue.h"
#endif

#define PLAN_CAPSULE "ptl.train_step_plan"

static void plan_free(PyObject *cap)
{
    PyMem_Free(PyCapsule_GetPointer(cap, PLAN_CAPSULE));
    Py_XDECREF((PyObject *)PyCapsule_GetContext(cap));
}

/* The job's communicator of this rank (refetched before every step: a closed one fails there). */
static int plan_comm(const ptl_step_plan *p, PyObject *comm, ptl_dist_group **group, struct ptl_nccl_comm **nccl)
{
    *group = NULL, *nccl = NULL;
    if (p->net->device.type == PTL_CPU)
        return (*group = ptl_py_dist_group(comm)) ? 0 : -1;
#ifdef PTL_WITH_CUDA
    return (*nccl = ptl_py_nccl_comm(comm)) ? 0 : -1;
#else
    PyErr_SetString(PyExc_RuntimeError, "plan['comm']: ptl was built without CUDA");
    return -1;
#endif
}

/* world > 1 (or a one-rank communicator at world 1): comm (a _DistGroup on the CPU, a _NcclComm on CUDA), bn
 * (the network's flat BatchNorm statistics) and watch (None or a callable the host collectives call while
 * they wait). */
static int convert_dist(PyObject *module, const ptl_net_exec *x, PyObject *comm, PyObject *bn, PyObject *watch,
                        ptl_step_plan *p)
{
    if (comm == Py_None) {
        PyErr_Format(PyExc_TypeError, "plan['comm']: world %d needs the job's communicator (a _DistGroup on the CPU, "
                     "a _NcclComm on CUDA), got None", p->world);
        return -1;
    }
    if (plan_comm(p, comm, &p->group, &p->nccl) < 0)
        return -1;
    const int64_t nbn = x->net->nbuffers;
    PtlTensor *t = ptl_tensor_arg(module, bn, "plan['bn']", (int)x->mdt, &x->device, 1, &nbn);
    if (!t)
        return -1;
    p->bn = ptl_tensor_data(t);
    p->nbn = nbn;
    if (watch != Py_None && !PyCallable_Check(watch)) {
        PyErr_SetString(PyExc_TypeError, "plan['watch']: expected None or a callable");
        return -1;
    }
    return 0;
}

static int convert_plan(PyObject *module, PyObject *d, ptl_step_plan *p)
{
    static char *keys[] = {"net", "shape", "staging", "grads", "gains", "scale_from", "optim", "ema", "record",
                           "world", "comm", "bn", "watch", "all_reduce_in_graph", NULL};
    PyObject *net, *staging, *grads, *scale, *optim, *ema, *comm = Py_None, *bn = Py_None, *watch = Py_None;
    PyObject *none = PyTuple_New(0);
    p->world = 1;
    const int ok = none && PyArg_ParseTupleAndKeywords(none, d, "O(iii)OO(ddd)OO!Op|iOOOp:train_step_plan", keys, &net,
                                                       &p->B, &p->H, &p->W, &staging, &grads, &p->gains[0],
                                                       &p->gains[1], &p->gains[2], &scale, &PyDict_Type, &optim, &ema,
                                                       &p->record, &p->world, &comm, &bn, &watch,
                                                       &p->all_reduce_in_graph);
    Py_XDECREF(none);
    if (!ok || !(p->net = ptl_py_executor(net)))
        return -1;
    const ptl_net_exec *x = p->net;
    const int64_t n = (int64_t)p->B * p->H * p->W * 3, A = ptl_obj_num_anchors(p->H, p->W);
    if (A < 0)
        return ptl_raise_int(module);
    if (staging != Py_None) {
        PtlTensor *st = ptl_tensor_arg(module, staging, "plan['staging']", PTL_UINT8, &x->device, 1, &n);
        if (!st)
            return -1;
        p->staging = ptl_tensor_data(st);
#ifdef PTL_WITH_CUDA
        if (x->device.type == PTL_CUDA && ptl_cuda_upload_open(x->ctx))
            return ptl_raise_int(module);
#endif
    }
    if (!PyTuple_Check(grads) || PyTuple_GET_SIZE(grads) != 4) {
        PyErr_SetString(PyExc_TypeError, "plan['grads']: expected a tuple of four tensors");
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        const int64_t shape[3] = {p->B, A, i % 2 ? x->net->nc : 4};
        PtlTensor *g = ptl_tensor_arg(module, PyTuple_GET_ITEM(grads, i), "plan['grads']", (int)x->mdt, &x->device,
                                      3, shape);
        if (!g)
            return -1;
        p->grads[i / 2][i % 2] = ptl_tensor_data(g);
    }
    if (scale != Py_None) {
        PyObject *t;
        Py_ssize_t k;
        if (!PyArg_ParseTuple(scale, "On;plan['scale_from']: expected (tensor, index)", &t, &k))
            return -1;
        PtlTensor *st = ptl_tensor_arg(module, t, "plan['scale_from']", PTL_FLOAT32, &x->device, 1, NULL);
        if (!st)
            return -1;
        if (k < 0 || k >= st->shape[0]) {
            PyErr_Format(PyExc_IndexError, "plan['scale_from']: index %zd out of range", k);
            return -1;
        }
        p->scale_dev = (const float *)ptl_tensor_data(st) + k;
    }
    ptl_device odev;
    int have_rates;
    PyObject *empty = PyTuple_New(0);
    const int rc = empty ? ptl_py_optim_parse(module, empty, optim, &p->opt, &p->hp, &p->ns_graph, &odev, &have_rates)
                         : -1;
    Py_XDECREF(empty);
    if (rc < 0)
        return -1;
    if (odev.type != x->device.type || odev.index != x->device.index) {
        PyErr_SetString(PyExc_ValueError, "plan['optim']: the optimizer's buffers must live where the network does");
        return -1;
    }
    p->hp.world = p->world;
    if ((p->world > 1 || comm != Py_None) && convert_dist(module, x, comm, bn, watch, p) < 0)
        return -1;
    if (ema != Py_None) {
        PyObject *fast = PySequence_Fast(ema, "plan['ema']: expected (ema, live) tensor pairs");
        if (!fast)
            return -1;
        p->nema = (int)PySequence_Fast_GET_SIZE(fast);
        for (int i = 0; i < p->nema && i < PTL_STEP_MAX_EMA; i++) {
            PyObject *e, *l;
            PtlTensor *te, *tl = NULL;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "OO;plan['ema']: expected (ema, live) pairs", &e,
                                  &l) ||
                !(te = ptl_tensor_arg(module, e, "plan['ema']", (int)x->mdt, &x->device, -1, NULL)) ||
                !(tl = ptl_tensor_arg(module, l, "plan['ema']", (int)x->mdt, &x->device, -1, NULL)) ||
                ptl_tensor_numel(te) != ptl_tensor_numel(tl)) {
                if (tl && !PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "plan['ema']: a pair's tensors differ in size");
                Py_DECREF(fast);
                return -1;
            }
            p->ema[i] = (ptl_step_ema){ptl_tensor_data(te), ptl_tensor_data(tl), ptl_tensor_numel(te)};
        }
        Py_DECREF(fast);
    }
    return ptl_step_plan_check(p) ? ptl_raise_int(module) : 0;
}

PyDoc_STRVAR(plan_doc, "train_step_plan(plan) -> handle\n--\n\n"
                       "The fixed arguments of train_step for one batch shape, from a dict: net (executor handle),\n"
                       "input (tensor (B, H, W, 3) in the compute dtype on the network's device), staging (CUDA\n"
                       "uint8 tensor of B*H*W*3 elements, or None), grads (four tensors shaped like the head\n"
                       "outputs), gains, scale_from ((tensor, index) or None), optim (the _optim_step keywords but\n"
                       "lrs/momenta/wds), ema (pairs (ema, live) of tensors, or None), record (CUDA: record the\n"
                       "network after the first eager step); data parallelism: world (ranks, default 1) and, with\n"
                       "world > 1 (or a one-rank communicator), comm (the job's _DistGroup on the CPU, _NcclComm\n"
                       "on CUDA), bn (the network's flat BatchNorm statistics), watch (None or a callable run\n"
                       "while the host collectives wait) and all_reduce_in_graph (CUDA, with record: the\n"
                       "communication recorded with the backward). The handle keeps the dict alive.");

static PyObject *py_train_step_plan(PyObject *module, PyObject *dict)
{
    if (!PyDict_Check(dict))
        return PyErr_Format(PyExc_TypeError, "plan: expected a dict, got %.100s", Py_TYPE(dict)->tp_name);
    ptl_step_plan *p = PyMem_Calloc(1, sizeof *p);
    if (!p)
        return PyErr_NoMemory();
    PyObject *cap = NULL;
    if (convert_plan(module, dict, p) < 0 || !(cap = PyCapsule_New(p, PLAN_CAPSULE, plan_free))) {
        PyMem_Free(p);
        return NULL;
    }
    Py_INCREF(dict);
    if (PyCapsule_SetContext(cap, dict) < 0) {
        Py_DECREF(dict);
        Py_DECREF(cap);
        return NULL;
    }
    return cap;
}

/* Ctrl-C between stages: the step runs without the GIL, so this takes it just to look. */
static int check_signals(void *arg)
{
    (void)arg;
    PyGILState_STATE g = PyGILState_Ensure();
    const int rc = PyErr_CheckSignals();
    PyGILState_Release(g);
    return rc < 0 ? ptl_set_error(PTL_ERR_RUNTIME, "train_step: interrupted") : 0;
}

/* While a host collective of the step waits: Ctrl-C, then the plan's watch (the launcher's check of the
 * ranks it started). An exception stops the wait, stays set and goes up once the step has returned; its
 * text is what the peers are told. */
static int check_wait(void *arg, char *why, size_t cap)
{
    PyObject *watch = arg;
    PyGILState_STATE g = PyGILState_Ensure();
    int stop = PyErr_CheckSignals() < 0;
    if (!stop && watch != Py_None) {
        PyObject *r = PyObject_CallNoArgs(watch);
        stop = r == NULL;
        Py_XDECREF(r);
    }
    if (stop) {
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        PyObject *text = exc ? PyObject_Str(exc) : NULL;
        const char *t = text ? PyUnicode_AsUTF8(text) : NULL;
        PyErr_Clear();
        snprintf(why, cap, "%s%s%s", exc ? Py_TYPE(exc)->tp_name : "interrupted", t && t[0] ? ": " : "", t ? t : "");
        Py_XDECREF(text);
        PyErr_Restore(type, exc, tb);
    }
    PyGILState_Release(g);
    return stop;
}

PyDoc_STRVAR(train_step_doc,
             "train_step(plan, images, targets, o2m_weight, optimize, lrs, momenta, wds, ema_decay) -> losses\n--\n\n"
             "One training step (csrc/train/train_step.h) with a plan from train_step_plan. images: the loader's\n"
             "uint8 batch (B, H, W, 3), or None when this rank of a data-parallel job has no images in the step\n"
             "(then optimize must be true; targets are ignored); targets: a CPU float32 tensor (n, 6). Returns\n"
             "the objective's losses on the step's device (ptl.objective.LOSSES names the entries).");

static PyObject *py_train_step(PyObject *module, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"plan", "images", "targets", "o2m_weight", "optimize", "lrs", "momenta", "wds",
                             "ema_decay", NULL};
    PyObject *cap, *images, *targets, *lrs, *moms, *wds;
    ptl_step_args a = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOdpOOOd:train_step", kwlist, &cap, &images, &targets,
                                     &a.o2m_weight, &a.optimize, &lrs, &moms, &wds, &a.ema_decay))
        return NULL;
    ptl_step_plan *p = PyCapsule_IsValid(cap, PLAN_CAPSULE) ? PyCapsule_GetPointer(cap, PLAN_CAPSULE) : NULL;
    if (!p) {
        PyErr_SetString(PyExc_TypeError, "plan: expected a handle from train_step_plan");
        return NULL;
    }
    a.network = images != Py_None;
    if (a.network) {
        int64_t n;
        if (ptl_py_batch_images(images, &a.images, &n, &a.loader, &a.slot) < 0)
            return NULL;
        if (n != (int64_t)p->B * p->H * p->W * 3) {
            PyErr_Format(PyExc_ValueError, "images: expected the plan's (%d, %d, %d, 3) batch, got %lld bytes", p->B,
                         p->H, p->W, (long long)n);
            return NULL;
        }
        const ptl_device cpu = {PTL_CPU, 0};
        const int64_t tshape[2] = {-1, 6};
        PtlTensor *t = ptl_tensor_arg(module, targets, "targets", PTL_FLOAT32, &cpu, 2, tshape);
        if (!t)
            return NULL;
        a.targets = ptl_tensor_data(t);
        a.ntargets = t->shape[0];
    }
    /* data parallelism: the communicator must still be open (the plan's dict holds it) */
    PyObject *plan_dict = PyCapsule_GetContext(cap);
    const int dist = p->nccl || p->group;
    PyObject *comm = dist ? PyDict_GetItemString(plan_dict, "comm") : NULL;
    PyObject *watch = dist ? PyDict_GetItemString(plan_dict, "watch") : NULL;
    if (comm && plan_comm(p, comm, &p->group, &p->nccl) < 0)
        return NULL;
    ptl_dist_poll poll = {check_wait, watch ? watch : Py_None};
    a.watch = &poll;
    ptl_optim_hp rates = p->hp;
    if (a.optimize && ptl_py_optim_rates(lrs, moms, wds, &rates) < 0)
        return NULL;
    a.lr = rates.lr;
    a.momentum = rates.momentum;
    a.wd = rates.wd;
    a.interrupted = check_signals;
    const int64_t lshape[1] = {PTL_OBJ_NUM_LOSSES};
    PtlTensor *losses = ptl_tensor_empty(module, 1, lshape, PTL_FLOAT32, p->net->device);
    if (!losses)
        return NULL;
    float *ld = ptl_tensor_data(losses);
    /* CPU ranks: the group is this call's while it waits without the GIL */
    PyObject *held = p->group && a.optimize ? comm : NULL;
    if (held && !ptl_py_dist_acquire(held)) {
        Py_DECREF(losses);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = ptl_train_step(p, &a, ld);
    Py_END_ALLOW_THREADS;
    if (held)
        ptl_py_dist_release(held);
    if (rc) {
        Py_DECREF(losses);
        if (PyErr_Occurred()) { /* Ctrl-C or the watch's exception: it goes up */
            ptl_error_clear();
            return NULL;
        }
        return p->group && ptl_dist_broken(p->group) ? ptl_py_dist_raise(module) : ptl_raise(module);
    }
    return (PyObject *)losses;
}

/* _fault_inject(stage): arms a test failure at the next step's `stage` ('upload', 'forward', 'objective',
 * 'backward', 'optimizer', 'ema'; None disarms). */
static PyObject *py_fault_inject(PyObject *module, PyObject *arg)
{
    (void)module;
    if (arg == Py_None) {
        ptl_fault_arm(PTL_FAULT_NONE);
        Py_RETURN_NONE;
    }
    const char *name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    for (int s = PTL_FAULT_NONE + 1; name && s < PTL_FAULT_NUM; s++)
        if (!strcmp(name, ptl_fault_name((ptl_fault_stage)s))) {
            ptl_fault_arm((ptl_fault_stage)s);
            Py_RETURN_NONE;
        }
    return PyErr_Format(PyExc_ValueError, "stage: expected one of upload, forward, objective, backward, optimizer, "
                                          "ema or None, got %R",
                        arg);
}

static PyMethodDef methods[] = {
    {"train_step_plan", py_train_step_plan, METH_O, plan_doc},
    {"train_step", (PyCFunction)(void (*)(void))py_train_step, METH_VARARGS | METH_KEYWORDS, train_step_doc},
    {"_fault_inject", py_fault_inject, METH_O, "Arms a test failure at a stage of the next training step."},
    {NULL, NULL, 0, NULL},
};

int ptl_register_train(PyObject *module) { return PyModule_AddFunctions(module, methods); }
