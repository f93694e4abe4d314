/* Converters of the optim bindings, shared with the training-step plan (../train/py_train_step.c). */
#ifndef PTL_OPTIM_PY_OPTIM_H
#define PTL_OPTIM_PY_OPTIM_H

#include "../py.h"
#include "optim.h"

/* The keywords of _optim_step (see ptl/optim.py FlatOptimizer.step_kwargs) as buffers, settings, the
 * replay slot and the buffers' device; lrs/momenta/wds may be absent (*have_rates = 0). Converts and
 * checks the tensors' types and sizes only: ptl_optim_step checks the values. -1 after raising. */
int ptl_py_optim_parse(PyObject *module, PyObject *args, PyObject *kw, ptl_optim_buffers *b, ptl_optim_hp *hp,
                       ptl_ns_graph **graph, ptl_device *dev, int *have_rates);
/* The per-group learning rates, momenta and weight decays (one value per group of hp). */
int ptl_py_optim_rates(PyObject *lrs, PyObject *momenta, PyObject *wds, ptl_optim_hp *hp);

#endif
