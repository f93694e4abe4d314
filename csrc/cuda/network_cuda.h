/* The YOLO26 network on one CUDA device: the op list of a CPU description (../nn/network.h) executed
 * with the CUDA layer kernels and cuDNN convolution plans, computing the same function as the CPU
 * executor in float32, bfloat16 or float16.
 *
 * Precision: parameters, their gradients, the BatchNorm running statistics and the saved batch
 * statistics are float32 in the CPU layout (flat buffers, conv weights OIHW). Activations and their
 * gradients are in the compute dtype. Every forward starts with ONE kernel that casts all conv
 * weights and biases to the compute dtype, reordering OIHW -> OHWI (cuDNN's KRSC for NHWC), into a
 * preallocated buffer; the backward computes conv weight/bias gradients in the compute dtype into a
 * buffer of that layout (zeroed first) and ends with ONE kernel that adds them, back in OIHW and in
 * float32, to the flat gradient (+=). BatchNorm gamma/beta gradients are added in float32 directly.
 * Head outputs (boxes (B, A, 4) and scores (B, A, nc) per branch) and their gradients are float32.
 *
 * Hot path: forward and backward launch kernels on the device's stream only. All memory (per-shape
 * arenas, conv workspace, layer scratch) and all cuDNN plans (algorithm choice) are made by
 * ptl_network_cuda_prepare, which is a no-op when the shape is unchanged (or held in the other of the
 * two shape slots); every pointer a step uses is then fixed, so a step can be captured in a CUDA graph. Activations get one slot per op output, as on
 * the CPU; activation gradients share slots whenever their lives in the backward do not overlap. */
#ifndef PTL_CUDA_NETWORK_CUDA_H
#define PTL_CUDA_NETWORK_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "../nn/network.h"
#include "../runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ptl_network_cuda ptl_network_cuda;

/* Copies the description (ops, values, sizes) of `cpu` and uploads its parameters and BN buffers
 * (float32 or float64 on the host; stored float32). compute: float32, bfloat16 or float16. */
ptl_network_cuda *ptl_network_cuda_create(ptl_runtime *rt, const ptl_network *cpu, int device, ptl_dtype compute);
void ptl_network_cuda_free(ptl_network_cuda *net);

/* Copies the flat float32 "params", "grads" or "buffers" between the device and a CPU network of the
 * same structure (to_device 1: CPU -> device). Synchronous. */
int ptl_network_cuda_copy(ptl_network_cuda *net, ptl_network *cpu, const char *which, int to_device);

/* Allocates the per-shape buffers and creates every conv plan for (B, H, W); a no-op when unchanged.
 * deterministic/allow_tf32/find are passed to the conv plans (defaults: 1, 0, 0). */
int ptl_network_cuda_prepare(ptl_network_cuda *net, int B, int H, int W);
void ptl_network_cuda_set_conv_options(ptl_network_cuda *net, int deterministic, int allow_tf32, int find);

void ptl_network_cuda_set_training(ptl_network_cuda *net, int training);
int ptl_network_cuda_training(const ptl_network_cuda *net);
/* 1 after a successful forward of the current shape (a backward may run). */
int ptl_network_cuda_have_forward(const ptl_network_cuda *net);

/* images: device pointer, (B, H, W, 3) in the compute dtype. Results in the buffers of
 * ptl_network_cuda_output. Calls prepare. */
int ptl_network_cuda_forward(ptl_network_cuda *net, const void *images, int B, int H, int W);

/* After a forward of the current shape: d_out[branch][0] = d loss / d boxes (B, A, 4), [1] = d loss
 * / d scores (B, A, nc), float32 device pointers; NULL means zero. Parameter gradients accumulate
 * (+=) into the float32 flat gradient. d_images (compute dtype, (B, H, W, 3)) is written when not
 * NULL; otherwise the first conv's input gradient is not computed at all. */
int ptl_network_cuda_backward(ptl_network_cuda *net, const void *const d_out[2][2], void *d_images);

/* The graph recorder's network part (ARCHITECTURE.md §3): after an eager forward and backward of the
 * current shape (the warm-up), captures, without running them, one forward of `images` and one backward
 * of `d_out` (no image gradient) as two graphs. ptl_network_cuda_replay then runs exactly that work, the
 * forward, the backward or both, one launch each: same pointers (the caller keeps images and d_out
 * alive and in place, and writes the next d_out between the two), weights cast from the live
 * parameters, gradients added to the live flat gradient, BN running statistics updated as eagerly. A
 * change of train/eval mode or conv options retires it, and so does a growth of the device's shared
 * layer scratch (conv2d.h) by another network. The executor keeps the buffers, plans and recording of
 * the two most recently used shapes (a fit's full batches and its partial last batch), so switching
 * between them costs nothing; a third shape takes the least recently used shape's place. */
enum { PTL_REPLAY_BOTH = 0, PTL_REPLAY_FORWARD = 1, PTL_REPLAY_BACKWARD = 2 };
int ptl_network_cuda_record(ptl_network_cuda *net, const void *images, int B, int H, int W,
                            const void *const d_out[2][2]);
int ptl_network_cuda_replay(ptl_network_cuda *net, int part);
/* 1 while a recording is usable; a recording whose layer scratch another network has since grown (and
 * so moved) is retired here. */
int ptl_network_cuda_recorded(ptl_network_cuda *net);
void ptl_network_cuda_retire(ptl_network_cuda *net);

/* grads = 0 (asynchronously, on the device's stream). */
int ptl_network_cuda_zero_grad(ptl_network_cuda *net);

/* Device pointers of the float32 flat storage: "params", "grads", "buffers" (BN running stats). */
float *ptl_network_cuda_params(ptl_network_cuda *net);
float *ptl_network_cuda_grads(ptl_network_cuda *net);
float *ptl_network_cuda_buffers(ptl_network_cuda *net);
int64_t ptl_network_cuda_num_params(const ptl_network_cuda *net);
int64_t ptl_network_cuda_num_buffers(const ptl_network_cuda *net);
ptl_dtype ptl_network_cuda_dtype(const ptl_network_cuda *net);
int ptl_network_cuda_device(const ptl_network_cuda *net);
int ptl_network_cuda_num_classes(const ptl_network_cuda *net);

/* The float32 head output of the last forward (branch 0 = one-to-many, 1 = one-to-one; which 0 =
 * boxes, 1 = scores), valid until the next forward or prepare of another shape; NULL before prepare. */
float *ptl_network_cuda_output(ptl_network_cuda *net, int branch, int which);
/* Current shape (0s before prepare) and anchors A. */
void ptl_network_cuda_shape(const ptl_network_cuda *net, int *B, int *H, int *W, int64_t *A);

/* Device bytes held: parameters/gradients/buffers/weight copies, and the per-shape arenas. */
void ptl_network_cuda_memory(const ptl_network_cuda *net, int64_t *fixed_bytes, int64_t *shape_bytes);

/* ---- kernels (network_cuda_kernels.cu) ---- */

/* One record per conv weight or bias: src offset in the flat float32 OIHW parameters, dst offset in
 * the compute-dtype OHWI buffer, and (cout, cin_g, k); a bias is (n, 1, 1). Records are sorted by
 * dst, starting at 0; elements between one record's end and the next start (alignment padding) are
 * left alone. */
typedef struct {
    int64_t src, dst;
    int cout, cin_g, k, pad_;
} ptl_wcast_entry;

/* The last record starting at or before element `i` of the OHWI buffer (records sorted by dst). */
PTL_HD int ptl_wcast_find(const ptl_wcast_entry *tab, int n, int64_t i)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tab[mid].dst <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Offset in OIHW (cout, cin_g, k, k) of element j of the same tensor in OHWI (cout, k, k, cin_g), or
 * -1 when j lies in the padding after the tensor. */
PTL_HD int64_t ptl_wcast_src(const ptl_wcast_entry *e, int64_t j)
{
    const int cin_g = e->cin_g, k = e->k;
    if (j >= (int64_t)e->cout * cin_g * k * k)
        return -1;
    const int ci = (int)(j % cin_g);
    int64_t r = j / cin_g;
    const int kw = (int)(r % k);
    r /= k;
    const int kh = (int)(r % k);
    const int64_t co = r / k;
    return e->src + ((co * cin_g + ci) * k + kh) * k + kw;
}

/* Index in the (B, A, C) head output of element i of a level's (B, hw, C) map at anchor offset a0. */
PTL_HD int64_t ptl_net_head_index(int64_t i, int64_t hw, int C, int64_t A, int64_t a0)
{
    const int64_t row = i / C, b = row / hw;
    return (b * A + a0 + (row - b * hw)) * C + (i - row * C);
}

struct CUstream_st;
/* dst[OHWI] = (compute) src[OIHW] for every record. */
int ptl_net_weight_cast_cuda(struct CUstream_st *stream, ptl_dtype dt, const ptl_wcast_entry *tab, int n,
                             int64_t total, const float *src, void *dst);
/* grad[OIHW] += (float) g[OHWI] for every record. */
int ptl_net_weight_grad_cuda(struct CUstream_st *stream, ptl_dtype dt, const ptl_wcast_entry *tab, int n,
                             int64_t total, const void *g, float *grad);
/* Head outputs: out[(b*A + a0 + i)*C + c] = (float) map[(b*hw + i)*C + c] for a level's NHWC map
 * (B, hw, C) in the compute dtype; and the backward gmap[...] (= or +=, accumulate 0 or 1)
 * (compute) d_out[...]. */
int ptl_net_head_out_cuda(struct CUstream_st *stream, ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0,
                          const void *map, float *out);
int ptl_net_head_grad_cuda(struct CUstream_st *stream, ptl_dtype dt, int B, int64_t hw, int C, int64_t A,
                           int64_t a0, const float *d_out, void *gmap, int accumulate);

#ifdef __cplusplus
}
#endif

#endif
