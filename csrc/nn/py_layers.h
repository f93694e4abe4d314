/* The convolution plans of the layer test bindings (py_layers.c: ptl._C.layer_conv2d_plan), for the
 * backend-only questions about them and the fast CPU backend's plans (../cuda/py_conv2d_cuda.c,
 * ../cpu/py_cpu.c). */
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
    int weights_oihw; /* its weights are (cout, cin/groups, k, k), not OHWI (a fast CPU plan's option) */
    void *plan;       /* the backend's (ptl_conv2d_plan on CUDA) */
    void *ws;         /* a CPU plan's own workspace of ws_bytes, used by the calls not handed one */
    size_t ws_bytes;
} ptl_py_conv_plan;

/* obj's plan, or NULL after raising TypeError naming `plan`. */
ptl_py_conv_plan *ptl_py_conv_plan_arg(PyObject *obj);
/* A capsule holding a copy of *p (and, for a CPU plan, the workspace its backend asks for); NULL after
 * raising, p->plan freed. */
PyObject *ptl_py_conv_plan_new(const ptl_py_conv_plan *p);

#endif
