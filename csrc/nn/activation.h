/* SiLU, and the activation choice shared by the fused BatchNorm+activation kernels (batchnorm.h).
 * Element type: float32 or float64 on the CPU (the float64 path exists for finite-difference checks). */
#ifndef PTL_NN_ACTIVATION_H
#define PTL_NN_ACTIVATION_H

#include <math.h>

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PTL_ACT_NONE = 0, PTL_ACT_SILU = 1 } ptl_act;

/* One formula for both backends. silu(z) = z*sigmoid(z); silu'(z) = s*(1 + z*(1 - s)), s = sigmoid(z). */
PTL_HD float ptl_sigmoidf(float z) { return 1.0f / (1.0f + expf(-z)); }
PTL_HD double ptl_sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

/* y[i] = silu(x[i]) for i < n. y may alias x. */
int ptl_silu_forward(ptl_dtype dt, int64_t n, const void *x, void *y);
/* dx[i] = dy[i] * silu'(x[i]) (overwrite). dx may alias dy. */
int ptl_silu_backward(ptl_dtype dt, int64_t n, const void *x, const void *dy, void *dx);

#ifdef PTL_WITH_CUDA
struct ptl_cuda_ctx;
int ptl_silu_forward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t n, const void *x, void *y);
int ptl_silu_backward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t n, const void *x, const void *dy,
                           void *dx);
#endif

#ifdef __cplusplus
}
#endif

#endif
