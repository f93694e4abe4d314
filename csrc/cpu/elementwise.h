/* Fast CPU element-wise kernels with the semantics of ../nn/elementwise.h and ../nn/concat.h (float32):
 * residual add, gradient accumulation, channel-slice copy (concat, split and head copies, forward and
 * backward). Vectorised (vector.h) and spread over the team in fixed chunks; every element is computed by
 * one thread, so results do not depend on the thread count (and equal the reference's bit for bit: each
 * element is one addition). */
#ifndef PTL_CPU_ELEMENTWISE_H
#define PTL_CPU_ELEMENTWISE_H

#include <stdint.h>

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = a + b; y may alias a or b. */
int ptl_cpu_add(int64_t n, const float *a, const float *b, float *y);
/* y += x (x and y do not overlap). */
int ptl_cpu_accumulate(int64_t n, const float *x, float *y);
/* For each row r < m and j < c: dst[r*dst_c + dst_off + j] (= or +=) src[r*src_c + src_off + j]; src and
 * dst do not overlap. */
int ptl_cpu_channel_copy(int64_t m, int c, const float *src, int src_c, int src_off, float *dst, int dst_c,
                         int dst_off, int accumulate);

#ifdef __cplusplus
}
#endif

#endif
