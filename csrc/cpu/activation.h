/* Fast CPU SiLU with the semantics of ../nn/activation.h (float32), vectorised with ptl_cpu_expf
 * (vector.h; within 2e-7 relative of the reference's expf-based values). The network's SiLUs are fused
 * into BatchNorm (batchnorm.h); these serve any standalone use. */
#ifndef PTL_CPU_ACTIVATION_H
#define PTL_CPU_ACTIVATION_H

#include <stdint.h>

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[i] = silu(x[i]); y may alias x. */
int ptl_cpu_silu_forward(int64_t n, const float *x, float *y);
/* dx[i] = dy[i] * silu'(x[i]); dx may alias dy. */
int ptl_cpu_silu_backward(int64_t n, const float *x, const float *dy, float *dx);

#ifdef __cplusplus
}
#endif

#endif
