/* The Attention core of spec §1.2, on the qkv convolution's NHWC output.
 *
 * Sizes: b images, n = H*W positions, `heads` heads, kd key dim, hd head dim; dim = heads*hd,
 * cq = heads*(2*kd + hd) qkv channels; scale = kd^-0.5.
 *   qkv  (b, n, cq)        head h owns channels [h*(2kd+hd), (h+1)*(2kd+hd)): q (kd), k (kd), v (hd)
 *   attn (b, heads, n, n)  saved softmax P[i][j] = softmax_j(scale * sum_d q[d][i] k[d][j])
 *   o    (b, n, dim)       o[i][h*hd + d] = sum_j v[d][j] P[i][j]   (head-major channels, as (B,dim,H,W))
 *   v    (b, n, dim)       optional dense copy of v in the same head-major order (the `pe` depthwise
 *                          conv's input); NULL to skip.
 * Element type: float32 or float64 on the CPU. Work is split over (image, head) pairs; each output is
 * summed in a fixed order (thread-count independent). */
#ifndef PTL_NN_ATTENTION_H
#define PTL_NN_ATTENTION_H

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* (b, n, heads, kd, hd) of an executor layer call c (ptl_net_call, executor.h) of an attention op */
#define PTL_ATTENTION_CALL_DIMS(c) (c)->B, (c)->in[0].h * (c)->in[0].w, (c)->op->heads, (c)->op->kd, (c)->op->hd

int ptl_attention_forward(ptl_dtype dt, int b, int n, int heads, int kd, int hd, const void *qkv, void *attn,
                          void *o, void *v);
/* dqkv = dL/dqkv (overwrite) given d_o = dL/do and, optionally, dv = an extra gradient for v in the
 * (b, n, dim) layout (from the pe branch; NULL if none). Reads qkv and the saved attn. */
int ptl_attention_backward(ptl_dtype dt, int b, int n, int heads, int kd, int hd, const void *qkv,
                           const void *attn, const void *d_o, const void *dv, void *dqkv);

#ifdef PTL_WITH_CUDA
struct ptl_cuda_ctx;
int ptl_attention_forward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int b, int n, int heads, int kd, int hd,
                               const void *qkv, void *attn, void *o, void *v);
int ptl_attention_backward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int b, int n, int heads, int kd, int hd,
                                const void *qkv, const void *attn, const void *d_o, const void *dv,
                                void *dqkv);
#endif

#ifdef __cplusplus
}
#endif

#endif
