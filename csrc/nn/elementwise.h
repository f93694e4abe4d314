/* Element-wise helpers for residual adds and gradient fan-in. Element type: float32 or float64 on the
 * CPU. Backward of y = a + b is dy for both: copy it (ptl_copy) or add it (ptl_accumulate). */
#ifndef PTL_NN_ELEMENTWISE_H
#define PTL_NN_ELEMENTWISE_H

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = a + b; y may alias a or b. */
int ptl_add(ptl_dtype dt, int64_t n, const void *a, const void *b, void *y);
/* y += x. */
int ptl_accumulate(ptl_dtype dt, int64_t n, const void *x, void *y);
/* y = x (no overlap). */
int ptl_copy(ptl_dtype dt, int64_t n, const void *x, void *y);
/* y = 0. */
int ptl_zero(ptl_dtype dt, int64_t n, void *y);

#ifdef PTL_WITH_CUDA
struct ptl_cuda_ctx;
int ptl_add_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t n, const void *a, const void *b, void *y);
int ptl_accumulate_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t n, const void *x, void *y);
/* bytes zero bytes at p, as a kernel (early launch: no graph memset node) */
int ptl_zero_cuda(struct ptl_cuda_ctx *ctx, void *p, size_t bytes);
/* y = a + b for (m, c) rows a and b, y's rows ldy elements apart (a channel slice of a wider output); and its
 * backward: the slice of dy into g0 and g1 ((m, c); each NULL, overwritten or, with acc, added to). */
int ptl_add_rows_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *a, const void *b, void *y,
                      int ldy);
int ptl_add_rows_backward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *dy, int ldy,
                               void *g0, int acc0, void *g1, int acc1);
#endif

#ifdef __cplusplus
}
#endif

#endif
