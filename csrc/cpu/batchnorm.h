/* Fast CPU BatchNorm (+ optional SiLU) over NHWC activations viewed as (m, c) rows: the semantics,
 * constants and argument order of ../nn/batchnorm.h (the reference), float32, plus a workspace.
 *
 * The rows are cut into fixed chunks (a function of m and c only); each chunk's per-channel sums are
 * accumulated in double over its rows in order, vectorised across channels, and the chunks are added
 * in order, so results do not depend on the thread count. The batch variance is taken in one pass
 * around a shift (the first row), E[(x-s)^2] - E[x-s]^2 in double, where the reference makes two passes;
 * the element-wise passes use ptl_cpu_expf (vector.h). Results agree with the reference within 1e-5
 * relative (tests/test_cpu_fast.py). */
#ifndef PTL_CPU_BATCHNORM_H
#define PTL_CPU_BATCHNORM_H

#include <stddef.h>

#include "../nn/activation.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of workspace the two calls below need for (m, c). */
size_t ptl_cpu_batchnorm_workspace(int64_t m, int c);

/* y's and dy's rows are ld >= c elements apart (../nn/batchnorm.h). */
int ptl_cpu_batchnorm_forward(int64_t m, int c, const float *x, const float *gamma, const float *beta,
                              float *running_mean, float *running_var, int training, ptl_act act, float *save_mean,
                              float *save_invstd, float *y, int ld, void *workspace, size_t workspace_bytes);

/* dx overwritten (may alias dy when ld == c), dgamma/dbeta accumulated (either may be NULL). */
int ptl_cpu_batchnorm_backward(int64_t m, int c, const float *x, const float *dy, int ld, const float *gamma,
                               const float *beta, const float *save_mean, const float *save_invstd, int training,
                               ptl_act act, float *dx, float *dgamma, float *dbeta, void *workspace,
                               size_t workspace_bytes);

#ifdef __cplusplus
}
#endif

#endif
