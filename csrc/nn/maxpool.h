/* Max-pool, kernel 5, stride 1, padding 2 (SPPF, spec §1.1), NHWC; padded cells never win.
 *   x, y (n, h, w, c): c channels of each pixel, whose channels are ldx (x, dx) and ldy (y, dy) elements
 *   apart (>= c; more for the channels of a wider tensor, a Concat built in place)
 * Ties: the backward routes each output's gradient to the FIRST maximum of its 5x5 window in scan
 * order (rows top to bottom, then columns left to right), i.e. a later equal value does not replace
 * the current maximum. A NaN wins (and propagates) like in PyTorch.
 * Element type: float32 or float64 on the CPU; deterministic for any thread count. */
#ifndef PTL_NN_MAXPOOL_H
#define PTL_NN_MAXPOOL_H

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_MAXPOOL_K 5

int ptl_maxpool5_forward(ptl_dtype dt, int n, int h, int w, int c, const void *x, int ldx, void *y, int ldy);
/* dx = (accumulate ? dx : 0) + routed dy. The argmax is recomputed from x. */
int ptl_maxpool5_backward(ptl_dtype dt, int n, int h, int w, int c, const void *x, int ldx, const void *dy, int ldy,
                          void *dx, int accumulate);

#ifdef PTL_WITH_CUDA
struct ptl_cuda_ctx;
/* arg (NULL: none), n h w c bytes: each output channel's argmax cell (0..24, rows first), which the forward
 * writes for the backward to read (what a training forward keeps, executor.h's kept bytes); a backward given
 * none finds them again. */
int ptl_maxpool5_forward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c, const void *x,
                              int ldx, void *y, int ldy, uint8_t *arg);
int ptl_maxpool5_backward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c,
                               const void *x, int ldx, const uint8_t *arg, const void *dy, int ldy, void *dx,
                               int accumulate);
#endif

#ifdef __cplusplus
}
#endif

#endif
