/* Per-device layer scratch. BatchNorm (statistics and gradient sums) and the attention backward keep
 * partial results in one buffer per device; it grows (an allocation, outside any step if reserved
 * beforehand) when a call needs more than it holds. An executor reserves the largest of the sizes
 * below for its shapes once, when it fills a shape slot, so no step allocates (and none does inside
 * a CUDA-graph capture). */
#ifndef PTL_CUDA_LAYER_SCRATCH_H
#define PTL_CUDA_LAYER_SCRATCH_H

#include <stddef.h>
#include <stdint.h>

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ptl_cuda_ctx;

int ptl_layers_cuda_reserve(struct ptl_cuda_ctx *ctx, size_t bytes);
/* The scratch, grown to at least `bytes` if needed. */
int ptl_layers_cuda_scratch(struct ptl_cuda_ctx *ctx, size_t bytes, void **out);
/* How many times the scratch has been (re)allocated: a recording made at another generation holds a
 * stale address (another network's larger shape grew it) and must be made again. */
uint64_t ptl_layers_cuda_scratch_generation(struct ptl_cuda_ctx *ctx);
size_t ptl_batchnorm_cuda_scratch_bytes(int64_t m, int c);
size_t ptl_attention_cuda_scratch_bytes(ptl_dtype dt, int n, int heads);
size_t ptl_maxpool5_cuda_scratch_bytes(int n, int h, int w, int c); /* the argmaxes, one byte a channel */

#ifdef __cplusplus
}
#endif

#endif
