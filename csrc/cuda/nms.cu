/* CUDA NMS post-processing of the one-to-many head (postprocess.h); the CPU reference is
 * csrc/metrics/nms.c and both use the same header functions, so they keep the same detections.
 * Per image, one block: (1) nms_candidates counts the candidates (pairs or anchors) with score > conf, finds the
 * min(count, max_nms)-th best ranking key by radix select, gathers the keys at or above it into the
 * image's slice of `keys` and sorts them (bitonic, in global memory); (2) nms_greedy walks the sorted
 * candidates in chunks of a block: every thread tests its candidate against the boxes kept before the
 * chunk, then one thread settles the chunk in rank order against the boxes kept within it, until
 * max_det boxes are kept. */
#include "../metrics/postprocess.h"
#include "block_select.cuh"
#include "device.h"
#include "launch.cuh"

#define NMS_SELECT_THREADS 1024
#define NMS_GREEDY_THREADS 512

/* The candidates' keys: over the A * nc pairs (multi-label) or over the A anchors (best class only). */
struct PairKeys {
    const float *scores; /* this image's (A, nc) logits */
    int64_t nc;
    float conf;
    int multi_label;
    __device__ uint64_t operator()(int64_t j) const
    {
        if (!multi_label)
            return ptl_nms_anchor_key(scores + j * nc, j, nc, conf);
        float s = ptl_pp_sigmoid(scores[j]);
        return s > conf ? ptl_nms_key(s, (uint32_t)j) : 0;
    }
};

__global__ void __launch_bounds__(NMS_SELECT_THREADS)
nms_candidates(const float *scores, int64_t A, int64_t nc, float conf, int max_nms, int multi_label, int cap,
               uint64_t *keys, int32_t *ncand)
{
    ptl_wait_prior();
    __shared__ BlockSelectShared sel;
    __shared__ unsigned total, filled;
    int64_t b = blockIdx.x, n = multi_label ? A * nc : A;
    int tid = threadIdx.x;
    PairKeys key_of{scores + b * A * nc, nc, conf, multi_label};
    uint64_t *buf = keys + b * (int64_t)cap;
    if (tid == 0) {
        total = 0;
        filled = 0;
    }
    __syncthreads();
    unsigned mine = 0;
    for (int64_t j = tid; j < n; j += blockDim.x)
        mine += key_of(j) != 0;
    atomicAdd(&total, mine);
    __syncthreads();
    unsigned k = total < (unsigned)max_nms ? total : (unsigned)max_nms;
    if (k == 0) {
        if (tid == 0)
            ncand[b] = 0;
        return;
    }
    uint64_t kth = block_kth_key(key_of, n, k, &sel);
    for (int64_t j = tid; j < n; j += blockDim.x) {
        uint64_t key = key_of(j);
        if (key != 0 && key >= kth)
            buf[atomicAdd(&filled, 1u)] = key;
    }
    int p = 1;
    while (p < (int)k)
        p *= 2;
    __syncthreads();
    for (int i = (int)k + tid; i < p; i += blockDim.x)
        buf[i] = 0; /* candidates' keys are > 0 */
    __syncthreads();
    block_bitonic_desc(buf, p);
    if (tid == 0)
        ncand[b] = (int32_t)k;
}

__global__ void __launch_bounds__(NMS_GREEDY_THREADS)
nms_greedy(const float *boxes, const float *scores, const uint64_t *keys, const int32_t *ncand, int64_t A,
           int64_t nc, int cap, int img_h, int img_w, int max_det, double iou, int agnostic, float *out,
           int32_t *count)
{
    ptl_wait_prior();
    __shared__ float kept_box[PTL_PP_MAX_DET][5];
    __shared__ int kept_rank[PTL_PP_MAX_DET];
    __shared__ float cand_box[NMS_GREEDY_THREADS][5];
    __shared__ int alive[NMS_GREEDY_THREADS];
    __shared__ int nk;
    int64_t b = blockIdx.x;
    int tid = threadIdx.x;
    const float *sc = scores + b * A * nc, *bx = boxes + b * A * 4;
    const uint64_t *buf = keys + b * (int64_t)cap;
    int n = ncand[b];
    if (tid == 0)
        nk = 0;
    __syncthreads();
    for (int base = 0; base < n && nk < max_det; base += blockDim.x) {
        int before = nk, r = base + tid;
        alive[tid] = 0;
        if (r < n) {
            float row[6];
            ptl_nms_row(bx, sc, nc, ptl_pp_key_index(buf[r]), img_h, img_w, row);
            ptl_nms_offset_box(row, (int)row[5], agnostic, cand_box[tid]);
            int drop = 0;
            for (int k = 0; k < before && !drop; k++)
                drop = ptl_nms_suppresses(kept_box[k], cand_box[tid], iou);
            alive[tid] = !drop;
        }
        __syncthreads();
        if (tid == 0) {
            int m = n - base < (int)blockDim.x ? n - base : (int)blockDim.x, kept = nk;
            for (int t = 0; t < m && kept < max_det; t++) {
                if (!alive[t])
                    continue;
                int drop = 0;
                for (int k = before; k < kept && !drop; k++)
                    drop = ptl_nms_suppresses(kept_box[k], cand_box[t], iou);
                if (drop)
                    continue;
                for (int e = 0; e < 5; e++)
                    kept_box[kept][e] = cand_box[t][e];
                kept_rank[kept++] = base + t;
            }
            nk = kept;
        }
        __syncthreads();
    }
    float *o = out + b * (int64_t)max_det * 6;
    for (int i = tid; i < max_det; i += blockDim.x) {
        if (i < nk) {
            ptl_nms_row(bx, sc, nc, ptl_pp_key_index(buf[kept_rank[i]]), img_h, img_w, o + (int64_t)i * 6);
        } else {
            for (int e = 0; e < 6; e++)
                o[(int64_t)i * 6 + e] = 0.0f;
        }
    }
    if (tid == 0)
        count[b] = nk;
}

extern "C" int ptl_nms_cuda(ptl_runtime *rt, int device, const float *boxes, const float *scores, int64_t B,
                            int64_t A, int64_t nc, int img_h, int img_w, int max_det, float conf, double iou,
                            int max_nms, int agnostic, int multi_label, uint64_t *keys, float *out,
                            int32_t *count)
{
    ptl_cuda_ctx *ctx;
    int32_t *ncand;
    int cap = 1;
    if (ptl_nms_check(B, A, nc, img_h, img_w, max_det, max_nms, iou) < 0)
        return -1;
    if (B == 0)
        return 0;
    if (B > 0x7FFFFFFF)
        return ptl_set_error(PTL_ERR_VALUE, "nms: batch too large");
    while (cap < max_nms)
        cap *= 2;
    /* the candidate counts live in `count` until nms_greedy overwrites them with the kept counts */
    ncand = count;
    PTL_CHECK(ptl_cuda_ctx_get(rt, device, &ctx));
    ptl_launch(nms_candidates, (unsigned)B, NMS_SELECT_THREADS, 0, ctx->stream, scores, A, nc, conf, max_nms,
               multi_label, cap, keys, ncand);
    PTL_LAUNCH_CHECK("nms_candidates");
    ptl_launch(nms_greedy, (unsigned)B, NMS_GREEDY_THREADS, 0, ctx->stream, boxes, scores, keys, ncand, A, nc, cap,
               img_h, img_w, max_det, iou, agnostic, out, count);
    PTL_LAUNCH_CHECK("nms_greedy");
    return 0;
fail:
    return -1;
}
