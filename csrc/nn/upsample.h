/* Nearest-neighbour x2 upsampling, NHWC: y[b][Y][X][ch] = x[b][Y/2][X/2][ch] (spec §1.1).
 *   x (n, h, w, c), y (n, 2h, 2w, c): c channels of each pixel, whose channels are ldx (x, dx) and ldy (y, dy)
 *   elements apart (>= c; more for the channels of a wider tensor, a Concat built in place)
 * Element type: float32 or float64 on the CPU. */
#ifndef PTL_NN_UPSAMPLE_H
#define PTL_NN_UPSAMPLE_H

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

int ptl_upsample2x_forward(ptl_dtype dt, int n, int h, int w, int c, const void *x, int ldx, void *y, int ldy);
/* dx = (accumulate ? dx : 0) + sum of dy over each 2x2 block (summed in scan order). */
int ptl_upsample2x_backward(ptl_dtype dt, int n, int h, int w, int c, const void *dy, int ldy, void *dx, int ldx,
                            int accumulate);

#ifdef PTL_WITH_CUDA
struct ptl_cuda_ctx;
int ptl_upsample2x_forward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c,
                                const void *x, int ldx, void *y, int ldy);
int ptl_upsample2x_backward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c,
                                 const void *dy, int ldy, void *dx, int ldx, int accumulate);
#endif

#ifdef __cplusplus
}
#endif

#endif
