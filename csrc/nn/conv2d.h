/* 2-D convolution, NHWC activations, "same"-style padding k//2 (spec §1.1), any stride and groups.
 *
 * Layouts:
 *   x  (n, h, w, cin)                      input
 *   y  (n, ho, wo, cout)                   output, ho = (h + 2*pad - k)/stride + 1 (floor), same for wo
 *   wt (cout, k, k, cin/groups)            weight, "OHWI" (cuDNN's KRSC for NHWC). PyTorch/Ultralytics
 *                                          state_dict tensors are OIHW (cout, cin/groups, k, k); convert
 *                                          with ptl_conv2d_weight_from_oihw / _to_oihw.
 *   bias (cout) or NULL
 * Output channel co belongs to group co / (cout/groups) and reads input channels
 * [g*cin/groups, (g+1)*cin/groups).
 *
 * Element type: float32 or float64 on the CPU. Every output element is summed by one thread in a fixed
 * order, so results are bit-identical for any thread count. */
#ifndef PTL_NN_CONV2D_H
#define PTL_NN_CONV2D_H

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n, h, w, cin;    /* input */
    int cout, k, stride, groups;
    int pad;             /* k / 2 */
    int ho, wo;          /* output spatial size */
} ptl_conv2d_desc;

/* Fills *d and checks the sizes (positive, channels divisible by groups, output not empty). */
int ptl_conv2d_init(ptl_conv2d_desc *d, int n, int h, int w, int cin, int cout, int k, int stride, int groups);

/* y = conv(x, wt) (+ bias) (overwrite). */
int ptl_conv2d_forward(const ptl_conv2d_desc *d, ptl_dtype dt, const void *x, const void *wt, const void *bias,
                       void *y);
/* dx = dL/dx given dy (overwrite). */
int ptl_conv2d_backward_input(const ptl_conv2d_desc *d, ptl_dtype dt, const void *dy, const void *wt, void *dx);
/* The same, faster for groups == 1: `workspace` holds ptl_conv2d_backward_input_workspace(d) elements
 * of dtype dt (scratch, contents ignored; may be NULL, or the size may be 0, to use the plain path). */
int64_t ptl_conv2d_backward_input_workspace(const ptl_conv2d_desc *d);
int ptl_conv2d_backward_input_ws(const ptl_conv2d_desc *d, ptl_dtype dt, const void *dy, const void *wt,
                                 void *workspace, void *dx);
/* dwt += dL/dwt given x and dy. */
int ptl_conv2d_backward_weight(const ptl_conv2d_desc *d, ptl_dtype dt, const void *x, const void *dy, void *dwt);
/* dbias += sum of dy over (n, ho, wo). */
int ptl_conv2d_backward_bias(const ptl_conv2d_desc *d, ptl_dtype dt, const void *dy, void *dbias);

/* Weight layout conversion between OIHW (cout, cin_g, k, k) and OHWI (cout, k, k, cin_g); src and dst
 * must not overlap. */
int ptl_conv2d_weight_from_oihw(ptl_dtype dt, int cout, int cin_g, int k, const void *src, void *dst);
int ptl_conv2d_weight_to_oihw(ptl_dtype dt, int cout, int cin_g, int k, const void *src, void *dst);

/* CUDA: cuDNN needs a per-shape plan (algorithm and workspace chosen once); its API is declared by the
 * CUDA implementation (csrc/cuda/conv2d.cu) on top of ptl_conv2d_desc, with the same layouts. */

#ifdef __cplusplus
}
#endif

#endif
