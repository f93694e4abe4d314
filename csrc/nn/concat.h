/* Channel concatenation and split of NHWC tensors viewed as (m, c) rows, m = N*H*W.
 * Concat's backward is a split; a split (C2f/C2PSA chunking) is a channel-slice copy whose backward is
 * a concat. Element type: float32 or float64 on the CPU. */
#ifndef PTL_NN_CONCAT_H
#define PTL_NN_CONCAT_H

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* For each row r < m and j < c:
 *   dst[r*dst_c + dst_off + j] (= or +=) src[r*src_c + src_off + j]     (accumulate = 0 or 1)
 * src_c/dst_c are the row lengths (channel counts) of the two tensors, which must not overlap. */
int ptl_channel_copy(ptl_dtype dt, int64_t m, int c, const void *src, int src_c, int src_off, void *dst,
                     int dst_c, int dst_off, int accumulate);

/* y (m, sum cs) = concat(xs[0] (m, cs[0]), ..., xs[k-1]) along channels, in order. */
int ptl_concat_forward(ptl_dtype dt, int64_t m, int k, const void *const *xs, const int *cs, void *y);
/* dxs[i] (=, or += where accumulate[i] != 0; accumulate may be NULL for all-overwrite) = the slice of
 * dy that xs[i] filled. dxs[i] may be NULL to skip that input (no gradient needed). */
int ptl_concat_backward(ptl_dtype dt, int64_t m, int k, const void *dy, const int *cs, void *const *dxs,
                        const int *accumulate);

#ifdef PTL_WITH_CUDA
struct ptl_cuda_ctx;
int ptl_channel_copy_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *src, int src_c,
                          int src_off, void *dst, int dst_c, int dst_off, int accumulate);
#endif

#ifdef __cplusplus
}
#endif

#endif
