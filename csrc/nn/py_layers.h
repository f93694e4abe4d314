/* The convolution plans of the layer test bindings (py_layers.c: ptl._C.layer_conv2d_plan), for the
 * CUDA-only queries about them (../cuda/py_conv2d_cuda.c). */
#ifndef PTL_NN_PY_LAYERS_H
#define PTL_NN_PY_LAYERS_H

#include "../py.h"
#include "executor.h"

/* A plan of the backend of its tensors' device, with the context it runs in. */
typedef struct {
    const ptl_net_backend *be;
    ptl_exec_ctx *ctx;
    ptl_device device;
    ptl_dtype dt;
    ptl_conv2d_desc d;
    void *plan; /* the backend's (ptl_conv2d_plan on CUDA) */
} ptl_py_conv_plan;

/* obj's plan, or NULL after raising TypeError naming `plan`. */
ptl_py_conv_plan *ptl_py_conv_plan_arg(PyObject *obj);

#endif
