/* Fast CPU attention core with the layouts and semantics of ../nn/attention.h (float32), plus a
 * workspace: per (image, head) task the keys and values are first copied transposed, (kd, n) and
 * (hd, n), so that each query's scores and each output gradient's dot products with the values are
 * vector operations over the n positions. Every sum keeps the reference's order over its index, so the
 * scores, the outputs for given probabilities and the whole backward equal the reference's bit for bit;
 * the softmax takes exp in float (vector.h) where the reference takes it in double, within 1e-7 relative.
 * Work is split over (image, head) tasks: thread-count independent. */
#ifndef PTL_CPU_ATTENTION_H
#define PTL_CPU_ATTENTION_H

#include <stddef.h>

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

size_t ptl_cpu_attention_workspace(int b, int n, int heads, int kd, int hd);

int ptl_cpu_attention_forward(int b, int n, int heads, int kd, int hd, const float *qkv, float *attn, float *o,
                              float *v, void *workspace, size_t workspace_bytes);
int ptl_cpu_attention_backward(int b, int n, int heads, int kd, int hd, const float *qkv, const float *attn,
                               const float *d_o, const float *dv, float *dqkv, void *workspace,
                               size_t workspace_bytes);

#ifdef __cplusplus
}
#endif

#endif
