/* Glue between the network's binding files (py_nn.c: the description; py_executor.c: the executor)
 * and the fused training step (../train/py_train_step.c). Each raises TypeError/ValueError and
 * returns NULL / -1 on a bad argument. */
#ifndef PTL_NN_PY_NETWORK_H
#define PTL_NN_PY_NETWORK_H

#include "../py.h"
#include "executor.h"

ptl_network *ptl_py_network(PyObject *obj);
ptl_net_exec *ptl_py_executor(PyObject *obj);
/* The four head outputs of the current shape as tensors over the executor's buffers (owner: cap). */
PyObject *ptl_py_executor_outputs(PyObject *module, PyObject *cap, ptl_net_exec *x);
/* Four output-gradient tensors (or None) as pointers, checked against the current shape. */
int ptl_py_executor_grads(PyObject *module, ptl_net_exec *x, PyObject *const d[4], const void *ptrs[2][2]);

#endif
