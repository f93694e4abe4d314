/* One training step in one call from Python (ARCHITECTURE.md §1): upload and normalise the batch,
 * forward, objective, backward and, when the step is due, the optimizer step and the EMA update. Python
 * computes the step's scalars (learning rates, momenta, EMA decay, o2m weight) and runs callbacks
 * between steps. Each stage is the code its own binding runs (the network through its C API, the rest
 * through the same argument checks as from Python), so a fused step and the separate calls compute the
 * same bits.
 *
 * On CUDA with a recording (network_cuda_record), the forward and the backward are the recorded graphs
 * (the objective runs eagerly between them); with plan["record"] set and no recording yet, the step
 * runs eagerly and then records its forward and backward (the warm-up, ARCHITECTURE.md §3 rule 2). */
#include "../py.h"

#include "../nn/py_network.h"
#include "../objective/objective.h"

/* plan[key], a borrowed reference; KeyError naming the key when missing. */
static PyObject *plan_item(PyObject *plan, const char *key)
{
    PyObject *v = PyDict_GetItemString(plan, key);
    if (!v)
        PyErr_Format(PyExc_KeyError, "plan: missing '%s'", key);
    return v;
}

/* Calls a binding with a new argument tuple (stolen) and optional keywords; returns 0 or -1. */
static int call_binding(PyObject *(*fn)(PyObject *, PyObject *), PyObject *module, PyObject *args)
{
    if (!args)
        return -1;
    PyObject *r = fn(module, args);
    Py_DECREF(args);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int call_binding_kw(PyObject *(*fn)(PyObject *, PyObject *, PyObject *), PyObject *module, PyObject *args,
                           PyObject *kw)
{
    if (!args)
        return -1;
    PyObject *r = fn(module, args, kw);
    Py_DECREF(args);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

PyDoc_STRVAR(train_step_doc,
             "train_step(plan, images, targets, o2m_weight, optimize, lrs, momenta, wds, ema_decay) -> losses\n--\n\n"
             "One training step (csrc/train/py_train_step.c). plan (a dict made once per batch shape): net (network\n"
             "handle), input (device or CPU tensor (B, H, W, 3) in the compute dtype), staging (CUDA uint8 tensor or\n"
             "None), grads (four tensors shaped like the head outputs), img_h, img_w, gains, scale_from (or None),\n"
             "optim (the _optim_step keywords but lrs/momenta/wds), ema (pairs (ema, live) of tensors, or None),\n"
             "record (CUDA: record the network after this step when not recorded yet). images: the loader's uint8\n"
             "batch; targets: (n, 6) float32. Returns the objective's (10,) losses on the step's device.");

static PyObject *py_train_step(PyObject *module, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"plan", "images", "targets", "o2m_weight", "optimize", "lrs", "momenta", "wds",
                             "ema_decay", NULL};
    PyObject *plan, *images, *targets, *lrs, *moms, *wds;
    double o2m, ema_decay;
    int optimize;
    PyObject *losses = NULL, *outs = NULL, *okw = NULL, *skw = NULL;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOdpOOOd:train_step", kwlist, &PyDict_Type, &plan, &images,
                                     &targets, &o2m, &optimize, &lrs, &moms, &wds, &ema_decay))
        return NULL;
    PyObject *cap = plan_item(plan, "net"), *input = plan_item(plan, "input"), *staging = plan_item(plan, "staging"),
             *grads = plan_item(plan, "grads"), *gains = plan_item(plan, "gains"),
             *scale_from = plan_item(plan, "scale_from"), *optim = plan_item(plan, "optim"),
             *ema = plan_item(plan, "ema"), *rec = plan_item(plan, "record");
    if (!cap || !input || !staging || !grads || !gains || !scale_from || !optim || !ema || !rec)
        return NULL;
    ptl_net_exec *x = ptl_py_executor(cap);
    if (!x)
        return NULL;
    PtlTensor *in = ptl_tensor_arg(module, input, "plan['input']", (int)x->cdt, &x->device, 4, NULL);
    if (!in)
        return NULL;
    int B = (int)in->shape[0], H = (int)in->shape[1], W = (int)in->shape[2];
    ptl_device dev = in->storage->device;
    const void *d_out[2][2];
    if (!PyTuple_Check(grads) || PyTuple_GET_SIZE(grads) != 4) {
        PyErr_SetString(PyExc_TypeError, "plan['grads']: expected a tuple of four tensors");
        return NULL;
    }
    for (int i = 0; i < 4; i++) {
        PtlTensor *g = ptl_tensor_arg(module, PyTuple_GET_ITEM(grads, i), "plan['grads']", -1, &dev, 3, NULL);
        if (!g)
            return NULL;
        d_out[i / 2][i % 2] = ptl_tensor_data(g);
    }
    const int want_record = PyObject_IsTrue(rec);
    if (want_record < 0)
        return NULL;

    /* upload + normalise */
    if (call_binding(ptl_py_data_upload, module, Py_BuildValue("(OOO)", images, input, staging)) < 0)
        return NULL;

    /* forward */
    int replay = 0;
    const void *img = ptl_tensor_data(in);
    Py_BEGIN_ALLOW_THREADS;
    /* the shape's slot first (a partial batch in between keeps the full shape's recording) */
    rc = ptl_net_exec_prepare(x, B, H, W);
    replay = rc == 0 && ptl_net_recorded(x);
    if (rc == 0)
        rc = replay ? ptl_net_replay(x, PTL_NET_REPLAY_FORWARD) : ptl_net_exec_forward(x, img, B, H, W);
    Py_END_ALLOW_THREADS;
    if (rc)
        return ptl_raise(module);
    /* Ctrl-C between stages (a CPU step can take seconds), never between the optimizer and the EMA */
    if (PyErr_CheckSignals() < 0)
        return NULL;

    /* objective: d total / d outputs into the plan's gradient tensors */
    if (!(outs = ptl_py_executor_outputs(module, cap, x)))
        goto fail;
    const int64_t lshape[1] = {PTL_OBJ_NUM_LOSSES};
    if (!(losses = (PyObject *)ptl_tensor_empty(module, 1, lshape, PTL_FLOAT32, dev)))
        goto fail;
    if (!(okw = Py_BuildValue("{s:O}", "gains", gains)))
        goto fail;
    if (scale_from != Py_None && PyDict_SetItemString(okw, "scale_from", scale_from) < 0)
        goto fail;
    if (call_binding_kw(ptl_py_objective, module,
                        Py_BuildValue("(OOiidOO)", outs, targets, H, W, o2m, losses, grads), okw) < 0)
        goto fail;

    /* backward */
    Py_BEGIN_ALLOW_THREADS;
    rc = replay ? ptl_net_replay(x, PTL_NET_REPLAY_BACKWARD) : ptl_net_exec_backward(x, d_out, NULL);
    if (rc == 0 && !replay && want_record)
        rc = ptl_net_record(x, img, B, H, W, d_out);
    Py_END_ALLOW_THREADS;
    if (rc) {
        ptl_raise(module);
        goto fail;
    }
    if (PyErr_CheckSignals() < 0)
        goto fail;

    /* optimizer step (clip, update, scaler, zero the gradients) and EMA, when due */
    if (optimize) {
        if (!PyDict_Check(optim)) {
            PyErr_SetString(PyExc_TypeError, "plan['optim']: expected the _optim_step keywords");
            goto fail;
        }
        if (!(skw = PyDict_Copy(optim)) || PyDict_SetItemString(skw, "lrs", lrs) < 0 ||
            PyDict_SetItemString(skw, "momenta", moms) < 0 || PyDict_SetItemString(skw, "wds", wds) < 0)
            goto fail;
        if (call_binding_kw(ptl_py_optim_step, module, PyTuple_New(0), skw) < 0)
            goto fail;
        if (ema != Py_None) {
            Py_ssize_t n = PySequence_Length(ema);
            if (n < 0)
                goto fail;
            for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *pair = PySequence_GetItem(ema, i), *a = NULL;
                if (!pair)
                    goto fail;
                if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2)
                    a = Py_BuildValue("(OOd)", PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1), ema_decay);
                else
                    PyErr_SetString(PyExc_TypeError, "plan['ema']: expected (ema, live) tensor tuples");
                Py_DECREF(pair);
                if (call_binding(ptl_py_optim_ema, module, a) < 0)
                    goto fail;
            }
        }
    }
    Py_DECREF(outs);
    Py_DECREF(okw);
    Py_XDECREF(skw);
    return losses;
fail:
    Py_XDECREF(outs);
    Py_XDECREF(losses);
    Py_XDECREF(okw);
    Py_XDECREF(skw);
    return NULL;
}

static PyMethodDef methods[] = {
    {"train_step", (PyCFunction)(void (*)(void))py_train_step, METH_VARARGS | METH_KEYWORDS, train_step_doc},
    {NULL, NULL, 0, NULL},
};

int ptl_register_train(PyObject *module) { return PyModule_AddFunctions(module, methods); }
