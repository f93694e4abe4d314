/* Fast CPU 5x5 stride-1 max-pool (padding 2), NHWC, with the semantics of ../nn/maxpool.h (float32): a
 * NaN wins; the backward routes each output's gradient to the first maximum of its window in scan
 * order, and each input gradient receives its contributions in output scan order, so both directions
 * equal the reference bit for bit. Vectorised across channels; one task per image. */
#ifndef PTL_CPU_MAXPOOL_H
#define PTL_CPU_MAXPOOL_H

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ldx, ldy: elements between the pixels of x (and dx) and of y (and dy), >= c (../nn/maxpool.h) */
int ptl_cpu_maxpool5_forward(int n, int h, int w, int c, const float *x, int ldx, float *y, int ldy);
/* dx = (accumulate ? dx : 0) + routed dy; the argmax is recomputed from x. */
int ptl_cpu_maxpool5_backward(int n, int h, int w, int c, const float *x, int ldx, const float *dy, int ldy, float *dx,
                              int accumulate);

#ifdef __cplusplus
}
#endif

#endif
