/* BatchNorm2d over NHWC activations viewed as (m, c) rows, m = N*H*W, optionally fused with SiLU
 * (the Conv block's BN-apply+SiLU forward and SiLU-backward+BN-backward).
 *
 * Constants are the spec's (§1.1): eps 1e-3, momentum 0.03.
 * Training: normalise with the batch mean and the biased batch variance; update
 *   running_mean <- (1-momentum)*running_mean + momentum*mean,
 *   running_var  <- (1-momentum)*running_var  + momentum*var*m/(m-1)   (unbiased; m == 1 uses var).
 * Eval: normalise with the running statistics (nothing is updated).
 * Either way the forward writes save_mean/save_invstd (per channel: the mean and 1/sqrt(var+eps) it
 * used), which the backward reads together with x, so nothing else needs to be kept.
 *
 * Element type: float32 or float64 on the CPU; gamma, beta, running_*, save_* and dgamma/dbeta have
 * the same dtype as x there. (On CUDA, with float16/bfloat16 activations, they are float32.)
 * Statistics are accumulated in double in a fixed order: results do not depend on the thread count. */
#ifndef PTL_NN_BATCHNORM_H
#define PTL_NN_BATCHNORM_H

#include "../ptl.h"
#include "activation.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_BN_EPS 1e-3
#define PTL_BN_MOMENTUM 0.03

/* The arguments every backend's BatchNorm checks: m rows of c channels (both positive), rows ld >= c apart,
 * act NONE or SILU; -1 after ptl_set_error naming fn otherwise. */
int ptl_batchnorm_check(const char *fn, int64_t m, int c, int ld, ptl_act act);

/* y = act(gamma*(x - mean)*invstd + beta). In training mode running_mean/running_var are updated.
 * y must not alias x when the backward will be run (the backward reads x). y's rows are ld >= c elements
 * apart (x's c): c channels of a wider tensor, such as a Concat built in place. */
int ptl_batchnorm_forward(ptl_dtype dt, int64_t m, int c, const void *x, const void *gamma, const void *beta,
                          void *running_mean, void *running_var, int training, ptl_act act, void *save_mean,
                          void *save_invstd, void *y, int ld);

/* Given dy = dL/dy of the forward above (same training flag and act; its rows ld apart), writes dx
 * (overwrite, rows c apart) and ADDS to dgamma and dbeta. With act = SILU the pre-activation is recomputed
 * from x, gamma, beta and the saved statistics. dx may alias dy when ld == c. dgamma/dbeta may be NULL to skip
 * them. */
int ptl_batchnorm_backward(ptl_dtype dt, int64_t m, int c, const void *x, const void *dy, int ld, const void *gamma,
                           const void *beta, const void *save_mean, const void *save_invstd, int training,
                           ptl_act act, void *dx, void *dgamma, void *dbeta);

#ifdef PTL_WITH_CUDA
struct ptl_cuda_ctx;
int ptl_batchnorm_forward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *x,
                               const void *gamma, const void *beta, void *running_mean, void *running_var,
                               int training, ptl_act act, void *save_mean, void *save_invstd, void *y, int ld);
int ptl_batchnorm_backward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *x,
                                const void *dy, int ld, const void *gamma, const void *beta, const void *save_mean,
                                const void *save_invstd, int training, ptl_act act, void *dx, void *dgamma,
                                void *dbeta);
#endif

#ifdef __cplusplus
}
#endif

#endif
