/* CUDA end-to-end post-processing (postprocess.h); the CPU reference is csrc/metrics/postprocess.c.
 * Keys are the unique 64-bit ranking keys of postprocess.h, so "top k" is exact: a block finds the
 * k-th largest key by radix select (block_select.cuh), gathers the keys at or above it and sorts those
 * k with a bitonic sort in shared memory. One block per image. */
#include "../metrics/postprocess.h"
#include "block_select.cuh"
#include "device.h"
#include "launch.cuh"

#define PP_THREADS 1024

__global__ void pp_anchor_keys(const float *scores, int64_t BA, int64_t A, int64_t nc, uint64_t *keys)
{
    ptl_wait_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < BA; i += stride) {
        const float *row = scores + i * nc;
        uint32_t a = (uint32_t)(i % A);
        uint64_t best = ptl_pp_key(row[0], a);
        for (int64_t c = 1; c < nc; c++) {
            uint64_t key = ptl_pp_key(row[c], a);
            best = key > best ? key : best;
        }
        keys[i] = best;
    }
}

struct AnchorKeys {
    const uint64_t *keys;
    __device__ uint64_t operator()(int64_t i) const { return keys[i]; }
};

struct ClassKeys {
    const float *scores; /* this image's (A, nc) */
    const int *anchor;   /* rank -> anchor, in shared memory */
    int64_t nc;
    __device__ uint64_t operator()(int64_t j) const
    {
        return ptl_pp_key(scores[(int64_t)anchor[j / nc] * nc + j % nc], (uint32_t)j);
    }
};

struct TopkShared {
    BlockSelectShared sel;
    int filled;
    int kept;
    uint64_t buf[PTL_PP_MAX_DET];
    int anchor[PTL_PP_MAX_DET];
};

/* Leaves the k largest of the n unique keys in sh->buf[0..k), descending. */
template <typename KeyOf>
__device__ void block_topk(KeyOf key_of, int64_t n, int k, TopkShared *sh)
{
    int tid = threadIdx.x;
    if (tid == 0)
        sh->filled = 0;
    uint64_t kth = block_kth_key(key_of, n, (unsigned)k, &sh->sel);
    for (int64_t i = tid; i < n; i += blockDim.x) {
        uint64_t key = key_of(i);
        if (key >= kth)
            sh->buf[atomicAdd(&sh->filled, 1)] = key;
    }
    int p = 1;
    while (p < k)
        p *= 2;
    __syncthreads();
    for (int i = k + tid; i < p; i += blockDim.x)
        sh->buf[i] = 0; /* real keys are > 0 */
    __syncthreads();
    block_bitonic_desc(sh->buf, p);
}

__global__ void __launch_bounds__(PP_THREADS)
pp_select(const float *boxes, const float *scores, const uint64_t *keys, int64_t A, int64_t nc, int k,
          int img_h, int img_w, float conf, float *out, int32_t *count)
{
    ptl_wait_prior();
    __shared__ TopkShared sh;
    int64_t b = blockIdx.x;
    int tid = threadIdx.x;
    const float *sc = scores + b * A * nc, *bx = boxes + b * A * 4;

    block_topk(AnchorKeys{keys + b * A}, A, k, &sh);
    for (int r = tid; r < k; r += blockDim.x)
        sh.anchor[r] = (int)ptl_pp_key_index(sh.buf[r]);
    __syncthreads();

    block_topk(ClassKeys{sc, sh.anchor, nc}, (int64_t)k * nc, k, &sh);
    if (tid == 0)
        sh.kept = k;
    __syncthreads();
    float *o = out + b * (int64_t)k * 6;
    for (int i = tid; i < k; i += blockDim.x) {
        int64_t j = ptl_pp_key_index(sh.buf[i]);
        int64_t a = sh.anchor[j / nc];
        int c = (int)(j % nc);
        ptl_pp_row(bx + a * 4, a, c, sc[a * nc + c], img_h, img_w, o + (int64_t)i * 6);
        if (!(o[(int64_t)i * 6 + 4] > conf))
            atomicMin(&sh.kept, i); /* scores are sorted, so the kept picks are a prefix */
    }
    __syncthreads();
    for (int i = sh.kept + tid; i < k; i += blockDim.x)
        for (int e = 0; e < 6; e++)
            o[(int64_t)i * 6 + e] = 0.0f;
    if (tid == 0)
        count[b] = sh.kept;
}

extern "C" int ptl_postprocess_cuda(ptl_runtime *rt, int device, const float *boxes, const float *scores,
                                    int64_t B, int64_t A, int64_t nc, int img_h, int img_w, int max_det,
                                    float conf, uint64_t *keys, float *out, int32_t *count)
{
    ptl_cuda_ctx *ctx;
    int64_t k = ptl_postprocess_check(B, A, nc, img_h, img_w, max_det);
    if (k < 0)
        return -1;
    if (B == 0)
        return 0;
    if (B > 0x7FFFFFFF)
        return ptl_set_error(PTL_ERR_VALUE, "postprocess: batch too large");
    PTL_CHECK(ptl_cuda_ctx_get(rt, device, &ctx));
    {
        int64_t blocks = (B * A + 255) / 256;
        if (blocks > 65536)
            blocks = 65536;
        ptl_launch(pp_anchor_keys, (unsigned)blocks, 256, 0, ctx->stream, scores, B * A, A, nc, keys);
        PTL_LAUNCH_CHECK("pp_anchor_keys");
        ptl_launch(pp_select, (unsigned)B, PP_THREADS, 0, ctx->stream, boxes, scores, keys, A, nc, (int)k, img_h, img_w,
                   conf, out, count);
        PTL_LAUNCH_CHECK("pp_select");
    }
    return 0;
fail:
    return -1;
}
