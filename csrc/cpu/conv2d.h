/* Fast CPU 2-D convolution through oneDNN, with the layouts and semantics of ../nn/conv2d.h (the plain-C
 * reference, the oracle of every test): NHWC activations, k/2 padding, any stride and groups (depthwise
 * included), forward and input gradient overwrite, weight and bias gradients ACCUMULATE (+=). float32.
 *
 * A plan is made once per shape (like the CUDA plans of ../cuda/conv2d.h): it holds oneDNN's primitives
 * for the requested directions, the weight reorders between the caller's layout and the layout oneDNN
 * chose, and memory objects whose data pointers are set per call. The executing calls allocate nothing;
 * they need a caller-owned workspace of ptl_cpu_conv2d_plan_workspace(plan) bytes (reordered weights and
 * oneDNN's scratchpad). A plan runs on one thread at a time; oneDNN spreads each call over the OpenMP
 * team of the calling thread (threads.h).
 *
 * The weights may be given in OHWI (cout, k, k, cin/groups), as the reference kernels take them, or in
 * OIHW (cout, cin/groups, k, k), the network's master layout (PyTorch's), which then needs no conversion.
 *
 * Reproducibility: results are bitwise identical run to run and for any thread count (tested in
 * tests/test_cpu_fast.py with 1-3 threads: oneDNN's forward and input gradient kernels split output
 * elements, not their sums, across threads; oneDNN does not promise it). The weight gradient is computed one
 * image at a time by a single-threaded primitive (the images spread over the team) and the images' parts
 * are added in image order. The bias gradient is summed in double in pixel order, as the reference sums
 * it (bitwise equal to it). The weight gradient uses at most n (batch) threads.
 *
 * Built without oneDNN (PTL_WITH_DNNL undefined), ptl_cpu_conv2d_available() is 0 and making a plan
 * fails with a message saying so. */
#ifndef PTL_CPU_CONV2D_H
#define PTL_CPU_CONV2D_H

#include <stddef.h>

#include "../nn/conv2d.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ptl_cpu_conv2d_plan ptl_cpu_conv2d_plan;

typedef enum { PTL_CPU_WEIGHTS_OHWI = 0, PTL_CPU_WEIGHTS_OIHW = 1 } ptl_cpu_weight_layout;

enum {
    PTL_CPU_CONV_FORWARD = 1,
    PTL_CPU_CONV_BACKWARD_INPUT = 2,
    PTL_CPU_CONV_BACKWARD_WEIGHT = 4, /* also the bias gradient */
    PTL_CPU_CONV_ALL = 7
};

typedef struct {
    ptl_cpu_weight_layout weights;
    int bias;       /* 1: the forward adds a bias (cout values), 0: it takes none */
    int directions; /* PTL_CPU_CONV_* bits: which calls the plan serves */
} ptl_cpu_conv2d_opts;

/* 1 when this build has oneDNN. */
int ptl_cpu_conv2d_available(void);

/* Builds the plan for `d` (float32). oneDNN compiles its kernels here, not in the calls below. */
int ptl_cpu_conv2d_plan_create(const ptl_conv2d_desc *d, const ptl_cpu_conv2d_opts *opts,
                               ptl_cpu_conv2d_plan **out);
void ptl_cpu_conv2d_plan_destroy(ptl_cpu_conv2d_plan *p);

/* Workspace bytes every call below needs (the largest over the plan's directions). */
size_t ptl_cpu_conv2d_plan_workspace(const ptl_cpu_conv2d_plan *p);
/* oneDNN's implementation name of one direction (PTL_CPU_CONV_FORWARD, ...), "" if not planned. */
const char *ptl_cpu_conv2d_plan_impl(const ptl_cpu_conv2d_plan *p, int direction);

/* y = conv(x, w) (+ bias) (overwrite). bias must be given exactly when the plan has one. */
int ptl_cpu_conv2d_forward(const ptl_cpu_conv2d_plan *p, const float *x, const float *w, const float *bias,
                           float *y, void *workspace, size_t workspace_bytes);
/* dx = dL/dx (overwrite). */
int ptl_cpu_conv2d_backward_input(const ptl_cpu_conv2d_plan *p, const float *dy, const float *w, float *dx,
                                  void *workspace, size_t workspace_bytes);
/* dw += dL/dw, in the plan's weight layout. */
int ptl_cpu_conv2d_backward_weight(const ptl_cpu_conv2d_plan *p, const float *x, const float *dy, float *dw,
                                   void *workspace, size_t workspace_bytes);
/* dbias += sum of dy over (n, ho, wo). */
int ptl_cpu_conv2d_backward_bias(const ptl_cpu_conv2d_plan *p, const float *dy, float *dbias);

#ifdef __cplusplus
}
#endif

#endif
