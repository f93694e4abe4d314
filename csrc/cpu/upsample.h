/* Fast CPU nearest x2 upsampling, NHWC, with the semantics of ../nn/upsample.h (float32); the backward
 * sums each 2x2 block in the reference's order, so both directions equal the reference bit for bit. */
#ifndef PTL_CPU_UPSAMPLE_H
#define PTL_CPU_UPSAMPLE_H

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ldx, ldy: elements between the pixels of x (and dx) and of y (and dy), >= c (../nn/upsample.h) */
int ptl_cpu_upsample2x_forward(int n, int h, int w, int c, const float *x, int ldx, float *y, int ldy);
/* dx = (accumulate ? dx : 0) + sum of dy over each 2x2 block. */
int ptl_cpu_upsample2x_backward(int n, int h, int w, int c, const float *dy, int ldy, float *dx, int ldx,
                                int accumulate);

#ifdef __cplusplus
}
#endif

#endif
