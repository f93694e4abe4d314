/* CUDA detection objective: the same assignment as csrc/objective/objective.c (float32 instance of
 * objective_math.h, bit for bit), the same losses and gradients up to float32 rounding, without
 * host-device synchronisation.
 *
 * The targets' upload and the reset of both branches' state run on the workspace's own stream while the
 * forward still runs. Then each launch, on the device's stream, covers both branches (one-to-many and
 * one-to-one, each with its own buffers; a block works for one of them), so the objective is one chain of
 * seven launches on one stream, with no join between streams:
 *   select    OBJ_SEL_SPLIT blocks per (branch, image, GT): candidates (STAL box), metric, top-k (block
 *             merge of per-thread top-k lists, then the GT's last block merges the blocks' lists; keys =
 *             value bits, then anchor descending so ties go to the lower anchor), the zero-metric fill
 *             of the documented tie rule, claims per anchor
 *   conflict  one warp per selection: the claimant that flips the anchor's claim count to -1 resolves it
 *             (largest CIoU over all GTs, first GT on ties); the result is the same whichever warp does it
 *   top1      (o2o only, topk2 = 1) atomicMax of (metric, anchor) keys per GT
 *   stats     the top-1 winners kept (o2o); atomicMax of metric/overlap bits per GT (non-negative
 *             floats order like their bits)
 *   nval      normalised target per anchor + per-block partial sums of T; the branch's last block to
 *             finish sums them
 *   cls       BCE over all anchors x classes and its gradient, per-block partial sums
 *   box       CIoU + L1 over the foreground and their gradients, per-block partial sums; the branch's last
 *             block sums the branch's partial sums, and the last branch to finish writes the losses
 * (The BCE and the boxes in one launch were slower back to back: benchmarks/RESULTS.md.)
 * Every sum is per block, then summed by one block in a fixed order: results are deterministic. Atomics are
 * only integer max/add/CAS whose outcome does not depend on their order. */
#include <stdint.h>

#include "../objective/objective.h"
#include "../objective/objective_math.h"
#include "../ops/half.h"
#include "device.h"
#include "launch.cuh"

#define OBJ_THREADS 256
/* A GT's candidates (~A for a box covering the image) are scored by OBJ_SEL_SPLIT blocks, spread over SMs, and
 * its last block merges their top-k lists: 20.1 us a launch at b4 against 23.2 for one block of 512 threads
 * (benchmarks/RESULTS.md, call 80). */
#define OBJ_SEL_THREADS 256
#define OBJ_SEL_SPLIT 4
#define OBJ_NB 2048 /* most blocks of a branch's grid-stride part = length of its partial-sum arrays */
#define OBJ_KMAX PTL_OBJ_TOPK_O2M
#define OBJ_NCTR 5 /* block counters a call (ObjCall.ctr) */

struct ptl_obj_workspace {
    ptl_runtime *rt;
    int device;
    void *dbuf, *dblock;
    size_t dcap;
    void *pinned[2];
    size_t pcap[2];
    cudaEvent_t ev[2];
    int ev_used[2], turn;
    /* the stream of the upload and the resets, at the device stream's priority */
    cudaStream_t side;
    /* fork: the device stream's earlier work; ready: the upload and resets done; done: the call's last
     * launch, after which its buffers are free again */
    cudaEvent_t fork, ready, done;
    int done_used;
};

struct ObjGeom {
    int lw[PTL_OBJ_NUM_LEVELS], lh[PTL_OBJ_NUM_LEVELS];
    int64_t loff[PTL_OBJ_NUM_LEVELS + 1];
    int64_t A;
    int B, M, nc, H, W;
};

/* One branch's buffers. */
struct ObjBufs {
    const int32_t *count, *cls;
    const float *gbox;
    int32_t *owner, *claim, *sel;
    float *palign, *povl, *nval;
    unsigned long long *gtkey;
    unsigned int *amax, *omax;
    unsigned long long *seltop; /* per (GT, part) its block's top-k keys, descending */
    int32_t *selnum, *seldone;  /* their counts; per GT the parts done */
    double *part;               /* 4 x OBJ_NB: box, cls, l1, T */
};

/* What the launches of one call read: both branches' buffers, inputs, outputs and settings. */
struct ObjCall {
    ObjBufs w[2];
    const void *boxes[2], *scores[2];
    void *gboxes[2], *gscores[2];
    int topk[2], top1[2];
    double kcls[2], kbox[2], kl1[2]; /* the gradients' scales before the division by T */
    double wt[2], gain[3];
    const float *dscale; /* the loss scale on the device, or NULL */
    float *losses;
    double *res;  /* per branch: box, cls, l1, T */
    int32_t *ctr; /* blocks done: [0, 2) nval per branch, [2, 4) box per branch; [4] branches done */
    unsigned nb_anchor, nb_cls; /* blocks per branch of the per-anchor kernels and of the BCE */
    ptl_dtype dt;
};

template <typename T>
__device__ __forceinline__ T obj_pick(const T (&a)[2], int br)
{
    return br ? a[1] : a[0];
}

__device__ __forceinline__ float obj_ld(const void *p, ptl_dtype dt, int64_t i)
{
    if (dt == PTL_FLOAT32)
        return ((const float *)p)[i];
    if (dt == PTL_BFLOAT16)
        return ptl_bits_to_f32(ptl_bf16_to_f32_bits(((const uint16_t *)p)[i]));
    return ptl_bits_to_f32(ptl_f16_to_f32_bits(((const uint16_t *)p)[i]));
}

__device__ __forceinline__ void obj_st(void *p, ptl_dtype dt, int64_t i, float v)
{
    if (dt == PTL_FLOAT32)
        ((float *)p)[i] = v;
    else if (dt == PTL_BFLOAT16)
        ((uint16_t *)p)[i] = ptl_f32_to_bf16_bits(ptl_f32_to_bits(v));
    else
        ((uint16_t *)p)[i] = ptl_f32_to_f16_bits(ptl_f32_to_bits(v));
}

__device__ __forceinline__ void obj_anchor(const ObjGeom &g, int64_t a, float *ax, float *ay, float *s)
{
    int l = 0;
    while (l + 1 < PTL_OBJ_NUM_LEVELS && a >= g.loff[l + 1])
        l++;
    int64_t r = a - g.loff[l];
    *ax = (float)(r % g.lw[l]) + 0.5f;
    *ay = (float)(r / g.lw[l]) + 0.5f;
    *s = (float)(8 << l);
}

/* overlap and metric of GT j (entry bj) of image b with anchor a */
__device__ float obj_pair(const ObjGeom &g, const ObjBufs &w, const void *boxes, const void *scores, ptl_dtype dt,
                          int b, int64_t bj, int64_t a, float *al)
{
    const float *gb = w.gbox + bj * 4;
    float e[4], ax, ay, s, d[4];
    obj_f_stal_box(gb, e);
    obj_anchor(g, a, &ax, &ay, &s);
    int64_t ba = (int64_t)b * g.A + a;
    for (int k = 0; k < 4; k++)
        d[k] = obj_ld(boxes, dt, ba * 4 + k);
    return obj_f_pair(gb, e, ax, ay, s, d, obj_ld(scores, dt, ba * g.nc + w.cls[bj]), al);
}

__device__ __forceinline__ unsigned long long obj_key(float v, int64_t a)
{
    return ((unsigned long long)__float_as_uint(v) << 32) | (unsigned long long)(0xFFFFFFFFu - (uint32_t)a);
}

__device__ __forceinline__ int64_t obj_key_anchor(unsigned long long k)
{
    return (int64_t)(0xFFFFFFFFu - (uint32_t)(k & 0xFFFFFFFFull));
}

__device__ void obj_claim(const ObjBufs &w, int64_t ba, int j, float al, float u)
{
    atomicAdd(&w.claim[ba], 1);
    w.owner[ba] = j;
    w.palign[ba] = al;
    w.povl[ba] = u;
}

/* Both branches' state reset in one launch instead of a memset each: the partial sums and the call's block
 * counters, and where the branches assign (na anchors, ng GTs a branch; 0 when the assignment is given) the
 * owners (-1), claim counts, and per GT its key, maxima and count of finished selection parts. */
__global__ void obj_init_kernel(ObjCall c, int64_t na, int64_t ng)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < 4 * OBJ_NB || i < na || i < ng;
         i += stride) {
        if (i < OBJ_NCTR)
            c.ctr[i] = 0;
        for (int br = 0; br < 2; br++) {
            const ObjBufs &w = c.w[br];
            if (i < 4 * OBJ_NB)
                w.part[i] = 0;
            if (i < na) {
                w.owner[i] = -1;
                w.claim[i] = 0;
            }
            if (i < ng) {
                w.gtkey[i] = 0;
                w.amax[i] = 0;
                w.omax[i] = 0;
                w.seldone[i] = 0;
            }
        }
    }
}

/* OBJ_SEL_SPLIT blocks per (branch, image, GT). */
__global__ void __launch_bounds__(OBJ_SEL_THREADS) obj_select_kernel(ObjGeom g, ObjCall c)
{
    ptl_wait_prior();
    __shared__ unsigned long long top[OBJ_KMAX];
    __shared__ unsigned long long wmax[OBJ_SEL_THREADS / 32];
    __shared__ int ntop, last;
    const int64_t per = (int64_t)g.B * g.M * OBJ_SEL_SPLIT;
    const int br = (int64_t)blockIdx.x >= per;
    const int64_t blk = (int64_t)blockIdx.x - br * per;
    const ObjBufs w = obj_pick(c.w, br);
    const void *const boxes = obj_pick(c.boxes, br), *const scores = obj_pick(c.scores, br);
    const ptl_dtype dt = c.dt;
    const int topk = obj_pick(c.topk, br);
    const int part = (int)(blk % OBJ_SEL_SPLIT);
    const int64_t bj = blk / OBJ_SEL_SPLIT;
    int b = (int)(bj / g.M), j = (int)(bj % g.M);
    int32_t *sel = w.sel + bj * topk;
    if (j >= w.count[b]) {
        if (part == 0 && (int)threadIdx.x < topk)
            sel[threadIdx.x] = -1;
        return;
    }
    const float *gb = w.gbox + bj * 4;
    float e[4];
    obj_f_stal_box(gb, e);
    int x0[PTL_OBJ_NUM_LEVELS], x1[PTL_OBJ_NUM_LEVELS], y0[PTL_OBJ_NUM_LEVELS], y1[PTL_OBJ_NUM_LEVELS];
    int64_t cnt[PTL_OBJ_NUM_LEVELS + 1];
    cnt[0] = 0;
    for (int l = 0; l < PTL_OBJ_NUM_LEVELS; l++) {
        float s = (float)(8 << l);
        obj_f_cell_range(e[0], e[2], s, g.lw[l], &x0[l], &x1[l]);
        obj_f_cell_range(e[1], e[3], s, g.lh[l], &y0[l], &y1[l]);
        cnt[l + 1] = cnt[l] + (int64_t)(x1[l] - x0[l]) * (y1[l] - y0[l]);
    }
    const int gc = w.cls[bj];
    unsigned long long loc[OBJ_KMAX];
    int nloc = 0;
    for (int64_t i = part * blockDim.x + threadIdx.x; i < cnt[PTL_OBJ_NUM_LEVELS]; i += blockDim.x * OBJ_SEL_SPLIT) {
        int l = 0;
        while (i >= cnt[l + 1])
            l++;
        int64_t r = i - cnt[l];
        int nx = x1[l] - x0[l];
        int y = y0[l] + (int)(r / nx), x = x0[l] + (int)(r % nx);
        int64_t a = g.loff[l] + (int64_t)y * g.lw[l] + x;
        int64_t ba = (int64_t)b * g.A + a;
        float d[4], al;
        for (int k = 0; k < 4; k++)
            d[k] = obj_ld(boxes, dt, ba * 4 + k);
        obj_f_pair(gb, e, (float)x + 0.5f, (float)y + 0.5f, (float)(8 << l), d, obj_ld(scores, dt, ba * g.nc + gc),
                   &al);
        if (!(al > 0))
            continue;
        unsigned long long key = obj_key(al, a);
        if (nloc == topk && key <= loc[topk - 1])
            continue;
        int p = nloc < topk ? nloc++ : topk - 1;
        while (p > 0 && loc[p - 1] < key) {
            loc[p] = loc[p - 1];
            p--;
        }
        loc[p] = key;
    }
    /* merge: topk rounds of a block-wide max over the threads' list heads */
    int head = 0;
    if (threadIdx.x == 0)
        ntop = 0;
    for (int round = 0; round < topk; round++) {
        unsigned long long v = head < nloc ? loc[head] : 0ull;
        for (int off = 16; off > 0; off >>= 1) {
            unsigned long long o = __shfl_down_sync(0xffffffffu, v, off);
            v = o > v ? o : v;
        }
        __syncthreads();
        if ((threadIdx.x & 31) == 0)
            wmax[threadIdx.x >> 5] = v;
        __syncthreads();
        unsigned long long m = 0;
        for (int q = 0; q < OBJ_SEL_THREADS / 32; q++)
            m = wmax[q] > m ? wmax[q] : m;
        if (m == 0)
            break;
        if (head < nloc && loc[head] == m)
            head++;
        if (threadIdx.x == 0)
            top[ntop++] = m;
    }
    __syncthreads();
    /* the parts' lists to global memory; the GT's last block to finish merges them (the top-k of the union is
     * the top-k of the parts' top-k lists, whichever block merges) */
    unsigned long long *mine = w.seltop + (bj * OBJ_SEL_SPLIT + part) * OBJ_KMAX;
    if ((int)threadIdx.x < ntop)
        mine[threadIdx.x] = top[threadIdx.x];
    if (threadIdx.x == 0)
        w.selnum[bj * OBJ_SEL_SPLIT + part] = ntop;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(&w.seldone[bj], 1) == OBJ_SEL_SPLIT - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    if (threadIdx.x == 0) {
        const unsigned long long *lists = w.seltop + bj * OBJ_SEL_SPLIT * OBJ_KMAX;
        int at[OBJ_SEL_SPLIT], n[OBJ_SEL_SPLIT];
        for (int r = 0; r < OBJ_SEL_SPLIT; r++) {
            at[r] = 0;
            n[r] = __ldcg(&w.selnum[bj * OBJ_SEL_SPLIT + r]);
        }
        int k = 0;
        for (; k < topk; k++) {
            unsigned long long best = 0;
            int from = -1;
            for (int r = 0; r < OBJ_SEL_SPLIT; r++) {
                const unsigned long long v = at[r] < n[r] ? __ldcg(&lists[r * OBJ_KMAX + at[r]]) : 0ull;
                if (v > best) {
                    best = v;
                    from = r;
                }
            }
            if (from < 0)
                break;
            top[k] = best;
            at[from]++;
        }
        ntop = k;
    }
    __syncthreads();
    /* the selected anchors claimed one per thread (distinct anchors: no order among them to keep); one thread
     * doing them in turn was a chain of dependent loads and atomics */
    if ((int)threadIdx.x < ntop) {
        const int64_t a = obj_key_anchor(top[threadIdx.x]);
        float al, u = obj_pair(g, w, boxes, scores, dt, b, bj, a, &al);
        obj_claim(w, (int64_t)b * g.A + a, j, al, u);
        sel[threadIdx.x] = (int32_t)a;
    }
    if (threadIdx.x != 0)
        return;
    int ns = ntop;
    /* fewer than topk non-zero metrics: lowest-index zero-metric anchors, kept where candidates */
    int r = topk - ntop;
    for (int64_t a = 0; a < g.A && r > 0; a++) {
        int held = 0;
        for (int i = 0; i < ntop; i++)
            held |= obj_key_anchor(top[i]) == a;
        if (held)
            continue;
        r--;
        float ax, ay, s;
        obj_anchor(g, a, &ax, &ay, &s);
        if (!obj_f_inside(e, PTL_FMUL(ax, s), PTL_FMUL(ay, s)))
            continue;
        float al, u = obj_pair(g, w, boxes, scores, dt, b, bj, a, &al);
        obj_claim(w, (int64_t)b * g.A + a, j, al, u);
        sel[ns++] = (int32_t)a;
    }
    for (; ns < topk; ns++)
        sel[ns] = -1;
}

/* One warp per selected (branch, image, GT, k) entry. An anchor that several GTs selected goes to the GT of the
 * largest overlap (CIoU), the first on ties, and to GT 0 when GT 0's overlap is NaN: what a scan over the
 * GTs in order, replacing the best only by a strictly greater value, picks. Lane l scans GTs l, l + 32, ...
 * and a shuffle tree combines the lanes, both by obj_conflict_beats; one thread scanning every GT made this a
 * chain as long as the image's GT count. */

/* Whether GT j with overlap ov replaces the best so far (best < 0: none): a larger overlap, or an equal one of
 * a lower GT; a NaN overlap never does (GT 0's is handled apart). */
__device__ __forceinline__ bool obj_conflict_beats(float ov, int j, float bov, int best)
{
    return j >= 0 && ov == ov && (best < 0 || ov > bov || (ov == bov && j < best));
}

__global__ void obj_conflict_kernel(ObjGeom g, ObjCall c)
{
    ptl_wait_prior();
    const int64_t wi = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int64_t n0 = (int64_t)g.B * g.M * c.topk[0];
    const int br = wi >= n0;
    const int64_t i = wi - br * n0;
    const int lane = threadIdx.x & 31;
    const int topk = obj_pick(c.topk, br);
    if (i >= (int64_t)g.B * g.M * topk)
        return;
    const ObjBufs w = obj_pick(c.w, br);
    const void *const boxes = obj_pick(c.boxes, br), *const scores = obj_pick(c.scores, br);
    const ptl_dtype dt = c.dt;
    const int32_t a = w.sel[i];
    if (a < 0)
        return;
    const int b = (int)(i / ((int64_t)g.M * topk));
    const int64_t ba = (int64_t)b * g.A + a;
    int won = 0;
    if (lane == 0) {
        const int c = w.claim[ba];
        won = c > 1 && atomicCAS(&w.claim[ba], c, -1) == c;
    }
    if (!__shfl_sync(0xffffffffu, won, 0))
        return;
    const int n = w.count[b];
    int best = -1;
    float bov = 0.0f, bal = 0.0f, ov0 = 0.0f, al0 = 0.0f;
    for (int j = lane; j < n; j += 32) {
        float al, ov = obj_pair(g, w, boxes, scores, dt, b, (int64_t)b * g.M + j, a, &al);
        if (j == 0) {
            ov0 = ov;
            al0 = al;
        }
        if (obj_conflict_beats(ov, j, bov, best)) {
            best = j;
            bov = ov;
            bal = al;
        }
    }
    for (int off = 16; off > 0; off /= 2) {
        const int oj = __shfl_xor_sync(0xffffffffu, best, off);
        const float oov = __shfl_xor_sync(0xffffffffu, bov, off), oal = __shfl_xor_sync(0xffffffffu, bal, off);
        if (obj_conflict_beats(oov, oj, bov, best)) {
            best = oj;
            bov = oov;
            bal = oal;
        }
    }
    if (lane != 0)
        return;
    if (ov0 != ov0) { /* lane 0 scanned GT 0 (n >= 2 here) */
        best = 0;
        bov = ov0;
        bal = al0;
    }
    w.owner[ba] = best;
    w.palign[ba] = bal;
    w.povl[ba] = bov;
}

__global__ void obj_top1_kernel(ObjGeom g, ObjBufs w)
{
    ptl_wait_prior();
    int64_t n = (int64_t)g.B * g.A;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int j = w.owner[i];
        if (j < 0)
            continue;
        int64_t b = i / g.A;
        atomicMax(&w.gtkey[b * g.M + j], obj_key(w.palign[i], i - b * g.A));
    }
}

/* The branch of block blockIdx.x of a launch of nb blocks per branch, and the block's index within it. */
__device__ __forceinline__ int obj_branch(unsigned nb, unsigned *blk)
{
    const int br = blockIdx.x >= nb;
    *blk = blockIdx.x - (br ? nb : 0);
    return br;
}

__global__ void obj_stats_kernel(ObjGeom g, ObjCall c)
{
    ptl_wait_prior();
    unsigned blk;
    const int br = obj_branch(c.nb_anchor, &blk);
    const ObjBufs w = obj_pick(c.w, br);
    const int top1 = obj_pick(c.top1, br);
    int64_t n = (int64_t)g.B * g.A;
    for (int64_t i = (int64_t)blk * blockDim.x + threadIdx.x; i < n; i += (int64_t)c.nb_anchor * blockDim.x) {
        int j = w.owner[i];
        if (j < 0)
            continue;
        int64_t b = i / g.A, a = i - b * g.A, bj = b * g.M + j;
        if (top1) {
            /* the GT's top-1 over all anchors by (metric, lower index): its best positive when that
             * metric is > 0, else anchor 0 */
            unsigned long long best = w.gtkey[bj];
            if (best != obj_key(w.palign[i], a) || ((best >> 32) == 0 && a != 0)) {
                w.owner[i] = -1;
                continue;
            }
        }
        atomicMax(&w.amax[bj], __float_as_uint(w.palign[i]));
        atomicMax(&w.omax[bj], __float_as_uint(w.povl[i]));
    }
}

/* Block sum of v (double) into *out (thread 0 writes it); every thread of the block must call it. */
__device__ void obj_block_sum(double v, double *out)
{
    __shared__ double red[OBJ_THREADS / 32];
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, off);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0;
        for (int q = 0; q < (int)(blockDim.x >> 5); q++)
            s += red[q];
        *out = s;
    }
}

/* Whether this block is the last of `total` to reach this point (each counts itself in *ctr once); the partial
 * sums every block wrote by thread 0 (obj_block_sum) are then visible to it. Every thread of the block must
 * call it; only thread 0 waits for its writes (the other threads' outputs are read by later launches). */
__device__ bool obj_last_block(int32_t *ctr, unsigned total)
{
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ctr, 1) == (int)total - 1;
        if (last)
            __threadfence();
    }
    __syncthreads();
    return last;
}

/* By the branch's last block: partial array k (in a fixed order) into res[k] for k in [k0, k1); k == 3 is T,
 * at least 1. Only the first nb partial sums were written this call (the rest are zeros, which add nothing);
 * each thread loads its share at once, then adds it in order. */
__device__ void obj_sum_parts(const ObjBufs &w, int k0, int k1, unsigned nb, double *res)
{
    __shared__ double tot;
    for (int k = k0; k < k1; k++) {
        double v[OBJ_NB / OBJ_THREADS];
#pragma unroll
        for (int q = 0; q < OBJ_NB / OBJ_THREADS; q++) {
            const unsigned i = threadIdx.x + q * OBJ_THREADS;
            v[q] = i < nb ? __ldcg(&w.part[k * OBJ_NB + i]) : 0.0;
        }
        double s = 0;
#pragma unroll
        for (int q = 0; q < OBJ_NB / OBJ_THREADS; q++)
            s += v[q];
        obj_block_sum(s, &tot);
        __syncthreads();
        if (threadIdx.x == 0)
            res[k] = k == 3 ? (tot > 1 ? tot : 1.0) : tot;
        __syncthreads();
    }
}

/* The normalised targets and T's partial sums, then T (the branch's last block). */
__global__ void __launch_bounds__(OBJ_THREADS) obj_nval_kernel(ObjGeom g, ObjCall c)
{
    ptl_wait_prior();
    unsigned blk;
    const int br = obj_branch(c.nb_anchor, &blk);
    const ObjBufs w = obj_pick(c.w, br);
    int64_t n = (int64_t)g.B * g.A;
    double acc = 0;
    for (int64_t i = (int64_t)blk * blockDim.x + threadIdx.x; i < n; i += (int64_t)c.nb_anchor * blockDim.x) {
        int j = w.owner[i];
        float v = 0;
        if (j >= 0) {
            int64_t bj = (i / g.A) * g.M + j;
            v = PTL_FDIV(PTL_FMUL(w.palign[i], __uint_as_float(w.omax[bj])),
                         PTL_FADD(__uint_as_float(w.amax[bj]), 1e-9f));
            acc += (double)v;
        }
        w.nval[i] = v;
    }
    obj_block_sum(acc, &w.part[3 * OBJ_NB + blk]);
    if (obj_last_block(&c.ctr[br], c.nb_anchor))
        obj_sum_parts(w, 3, 4, c.nb_anchor, c.res + 4 * br);
}

/* T from given targets (the assignment passed in): partial sums, then T (the branch's last block). */
__global__ void __launch_bounds__(OBJ_THREADS) obj_tsum_kernel(ObjGeom g, ObjCall c)
{
    ptl_wait_prior();
    unsigned blk;
    const int br = obj_branch(c.nb_anchor, &blk);
    const ObjBufs w = obj_pick(c.w, br);
    int64_t n = (int64_t)g.B * g.A;
    double acc = 0;
    for (int64_t i = (int64_t)blk * blockDim.x + threadIdx.x; i < n; i += (int64_t)c.nb_anchor * blockDim.x)
        if (w.owner[i] >= 0)
            acc += (double)w.nval[i];
    obj_block_sum(acc, &w.part[3 * OBJ_NB + blk]);
    if (obj_last_block(&c.ctr[br], c.nb_anchor))
        obj_sum_parts(w, 3, 4, c.nb_anchor, c.res + 4 * br);
}

/* V consecutive scores as floats: one 16-byte load per 8 half-width or 4 float32 values when V is 8 (the
 * caller checks alignment), else element by element. */
template <int V>
__device__ __forceinline__ void obj_ld_v(const void *p, ptl_dtype dt, int64_t i, float *x)
{
    if (V == 8 && dt != PTL_FLOAT32) {
        const uint4 u = *reinterpret_cast<const uint4 *>((const uint16_t *)p + i);
        const uint32_t h[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint16_t e = (uint16_t)(h[k / 2] >> (16 * (k % 2)));
            x[k] = ptl_bits_to_f32(dt == PTL_BFLOAT16 ? ptl_bf16_to_f32_bits(e) : ptl_f16_to_f32_bits(e));
        }
    } else if (V == 8) {
        const float4 u0 = reinterpret_cast<const float4 *>((const float *)p + i)[0];
        const float4 u1 = reinterpret_cast<const float4 *>((const float *)p + i)[1];
        const float f[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
        for (int k = 0; k < 8; k++)
            x[k] = f[k];
    } else {
#pragma unroll
        for (int k = 0; k < V; k++)
            x[k] = obj_ld(p, dt, i + k);
    }
}

template <int V>
__device__ __forceinline__ void obj_st_v(void *p, ptl_dtype dt, int64_t i, const float *x)
{
    if (V == 8 && dt != PTL_FLOAT32) {
        uint32_t h[4] = {0, 0, 0, 0};
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint32_t b = ptl_f32_to_bits(x[k]);
            h[k / 2] |= (uint32_t)(dt == PTL_BFLOAT16 ? ptl_f32_to_bf16_bits(b) : ptl_f32_to_f16_bits(b))
                        << (16 * (k % 2));
        }
        *reinterpret_cast<uint4 *>((uint16_t *)p + i) = make_uint4(h[0], h[1], h[2], h[3]);
    } else if (V == 8) {
        reinterpret_cast<float4 *>((float *)p + i)[0] = make_float4(x[0], x[1], x[2], x[3]);
        reinterpret_cast<float4 *>((float *)p + i)[1] = make_float4(x[4], x[5], x[6], x[7]);
    } else {
#pragma unroll
        for (int k = 0; k < V; k++)
            obj_st(p, dt, i + k, x[k]);
    }
}

/* The BCE of logit x against target t and its gradient's unscaled part sigmoid(x) - t, from one e = exp(-|x|):
 * the sigmoid as 1 / (1 + e) or e / (1 + e) by the sign of x. e and the division by the hardware's
 * approximations (within a few ulp: the gradient needs no more, and the assignment, which must agree with the
 * CPU's bit for bit, does not use them); the BCE's log1p by CUDA's (1 ulp: its value is the reported loss). */
__device__ __forceinline__ float obj_cls_term(float x, float t, float *dx)
{
    const float e = __expf(-fabsf(x));
    *dx = __fdividef(x >= 0 ? 1.0f : e, 1.0f + e) - t;
    return (x > 0 ? x : 0.0f) - x * t + log1pf(e);
}

/* Classification BCE and its gradient over the branch's anchors x classes, V consecutive classes of one
 * anchor a thread (8 when nc and the pointers allow 16-byte access: one owner lookup and one division per 8
 * scores); blk of nb blocks; its partial sum of the BCE. I: the group index's type, 32-bit unsigned where
 * B * A * nc fits (its division is several times cheaper). */
template <typename I, int V>
__device__ __forceinline__ double obj_cls_part(const ObjGeom &g, const ObjBufs &w, const void *scores,
                                               void *gscores, ptl_dtype dt, float k, unsigned blk, unsigned nb)
{
    const I ncv = (I)(g.nc / V);
    const I n = (I)g.B * (I)g.A * ncv;
    double acc = 0;
    for (I i = (I)blk * blockDim.x + threadIdx.x; i < n; i += (I)nb * blockDim.x) {
        const I ba = i / ncv;
        const int c0 = (int)(i - ba * ncv) * V;
        const int j = w.owner[ba];
        const int tc = j >= 0 ? w.cls[(ba / g.A) * g.M + j] : -1;
        const float tv = j >= 0 ? w.nval[ba] : 0.0f;
        const int64_t e = (int64_t)ba * g.nc + c0;
        float x[V], gx[V];
        obj_ld_v<V>(scores, dt, e, x);
#pragma unroll
        for (int q = 0; q < V; q++) {
            float d;
            acc += (double)obj_cls_term(x[q], c0 + q == tc ? tv : 0.0f, &d);
            gx[q] = d * k;
        }
        if (gscores)
            obj_st_v<V>(gscores, dt, e, gx);
    }
    return acc;
}

/* CIoU + L1 over the branch's foreground anchors and their gradients (zero elsewhere); blk of nb blocks; its
 * partial sums of both losses. */
__device__ void obj_box_part(const ObjGeom &g, const ObjBufs &w, const void *boxes, void *gboxes,
                             ptl_dtype dt, float kb, float kl, unsigned blk, unsigned nb, double *box_sum,
                             double *l1_sum)
{
    int64_t n = (int64_t)g.B * g.A;
    double accb = 0, accl = 0;
    for (int64_t i = (int64_t)blk * blockDim.x + threadIdx.x; i < n; i += (int64_t)nb * blockDim.x) {
        int j = w.owner[i];
        float t = j >= 0 ? w.nval[i] : 0.0f;
        float gd[4] = {0, 0, 0, 0};
        if (j >= 0 && t != 0) {
            int64_t b = i / g.A;
            float ax, ay, s;
            obj_anchor(g, i - b * g.A, &ax, &ay, &s);
            const float *gb = w.gbox + (b * g.M + j) * 4;
            float tx1 = gb[0] / s, ty1 = gb[1] / s, tx2 = gb[2] / s, ty2 = gb[3] / s;
            float d[4];
            for (int q = 0; q < 4; q++)
                d[q] = obj_ld(boxes, dt, i * 4 + q);
            float cg[4];
            float ci = obj_f_ciou_grad(ax - d[0], ay - d[1], ax + d[2], ay + d[3], tx1, ty1, tx2, ty2, cg);
            accb += (double)((1 - ci) * t);
            float W = (float)g.W, H = (float)g.H;
            float tn[4] = {((ax - tx1) * s) / W, ((ay - ty1) * s) / H, ((tx2 - ax) * s) / W, ((ty2 - ay) * s) / H};
            float norm[4] = {W, H, W, H};
            float l1 = 0;
            for (int q = 0; q < 4; q++) {
                float diff = (d[q] * s) / norm[q] - tn[q];
                l1 += diff < 0 ? -diff : diff;
                float sg = diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f);
                gd[q] = kl * t * sg / 4 * s / norm[q];
            }
            accl += (double)(l1 / 4 * t);
            float kt = PTL_FMUL(kb, t);
            gd[0] = PTL_FADD(gd[0], PTL_FMUL(kt, cg[0]));
            gd[1] = PTL_FADD(gd[1], PTL_FMUL(kt, cg[1]));
            gd[2] = PTL_FSUB(gd[2], PTL_FMUL(kt, cg[2]));
            gd[3] = PTL_FSUB(gd[3], PTL_FMUL(kt, cg[3]));
        }
        if (gboxes)
            for (int q = 0; q < 4; q++)
                obj_st(gboxes, dt, i * 4 + q, gd[q]);
    }
    *box_sum = accb;
    *l1_sum = accl;
}

/* BCE of both branches: per branch nb_cls blocks, each its partial sum. */
template <typename I, int V>
__global__ void __launch_bounds__(OBJ_THREADS) obj_cls_kernel(ObjGeom g, ObjCall c)
{
    ptl_wait_prior();
    unsigned blk;
    const int br = obj_branch(c.nb_cls, &blk);
    const ObjBufs w = obj_pick(c.w, br);
    const double ds = c.dscale ? (double)*c.dscale : 1.0;
    const void *const scores = obj_pick(c.scores, br);
    void *const gscores = obj_pick(c.gscores, br);
    const float k = (float)(obj_pick(c.kcls, br) * ds / c.res[4 * br + 3]);
    /* the dtype a constant in each call, so the conversions are chosen once, not per element */
    double acc;
    if (c.dt == PTL_BFLOAT16)
        acc = obj_cls_part<I, V>(g, w, scores, gscores, PTL_BFLOAT16, k, blk, c.nb_cls);
    else if (c.dt == PTL_FLOAT16)
        acc = obj_cls_part<I, V>(g, w, scores, gscores, PTL_FLOAT16, k, blk, c.nb_cls);
    else
        acc = obj_cls_part<I, V>(g, w, scores, gscores, PTL_FLOAT32, k, blk, c.nb_cls);
    obj_block_sum(acc, &w.part[1 * OBJ_NB + blk]);
}

/* CIoU + L1 of both branches (per branch nb_anchor blocks), then the branch's last block sums the partial sums
 * (the BCE's too), and the last branch to finish writes the losses (loss components times the batch size,
 * each branch's and the weighted total). */
__global__ void __launch_bounds__(OBJ_THREADS) obj_box_kernel(ObjGeom g, ObjCall c)
{
    ptl_wait_prior();
    __shared__ int last;
    unsigned blk;
    const int br = obj_branch(c.nb_anchor, &blk);
    const ObjBufs w = obj_pick(c.w, br);
    const double *res = c.res + 4 * br;
    const double ds = c.dscale ? (double)*c.dscale : 1.0;
    double accb, accl;
    obj_box_part(g, w, obj_pick(c.boxes, br), obj_pick(c.gboxes, br), c.dt,
                 (float)(obj_pick(c.kbox, br) * ds / res[3]), (float)(obj_pick(c.kl1, br) * ds / res[3]), blk,
                 c.nb_anchor, &accb, &accl);
    obj_block_sum(accb, &w.part[0 * OBJ_NB + blk]);
    obj_block_sum(accl, &w.part[2 * OBJ_NB + blk]);
    if (!obj_last_block(&c.ctr[2 + br], c.nb_anchor))
        return;
    obj_sum_parts(w, 0, 3, c.nb_anchor > c.nb_cls ? c.nb_anchor : c.nb_cls, c.res + 4 * br);
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&c.ctr[4], 1) == 1;
    }
    __syncthreads();
    if (!last || threadIdx.x != 0)
        return;
    __threadfence();
    double total = 0;
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < 3; k++) {
            const double comp = c.gain[k] * __ldcg(&c.res[4 * b + k]) / __ldcg(&c.res[4 * b + 3]);
            c.losses[1 + 3 * b + k] = (float)(g.B * comp);
            total += c.wt[b] * g.B * comp;
            if (b == 1)
                c.losses[7 + k] = (float)comp;
        }
    c.losses[0] = (float)total;
}

extern "C" int ptl_obj_workspace_create(ptl_runtime *rt, int device, ptl_obj_workspace **out)
{
    ptl_cuda_ctx *ctx;
    ptl_obj_workspace *ws = (ptl_obj_workspace *)calloc(1, sizeof(*ws));
    if (!ws)
        return ptl_set_error(PTL_ERR_MEMORY, "objective: out of host memory");
    ws->rt = rt;
    ws->device = device;
    if (ptl_cuda_ctx_get(rt, device, &ctx) != 0)
        goto fail;
    for (int i = 0; i < 2; i++)
        PTL_CUDA_TRY(cudaEventCreateWithFlags(&ws->ev[i], cudaEventDisableTiming));
    {
        int prio;
        PTL_CUDA_TRY(cudaStreamGetPriority(ctx->stream, &prio));
        PTL_CUDA_TRY(cudaStreamCreateWithPriority(&ws->side, cudaStreamNonBlocking, prio));
    }
    PTL_CUDA_TRY(cudaEventCreateWithFlags(&ws->ready, cudaEventDisableTiming));
    PTL_CUDA_TRY(cudaEventCreateWithFlags(&ws->fork, cudaEventDisableTiming));
    PTL_CUDA_TRY(cudaEventCreateWithFlags(&ws->done, cudaEventDisableTiming));
    *out = ws;
    return 0;
fail:
    ptl_obj_workspace_destroy(ws);
    return -1;
}

extern "C" void ptl_obj_workspace_destroy(ptl_obj_workspace *ws)
{
    ptl_cuda_ctx *ctx;
    if (!ws)
        return;
    if (ptl_cuda_ctx_get(ws->rt, ws->device, &ctx) == 0) {
        for (int i = 0; i < 2; i++) {
            if (ws->ev[i]) {
                cudaEventSynchronize(ws->ev[i]);
                cudaEventDestroy(ws->ev[i]);
            }
            if (ws->pinned[i])
                cudaFreeHost(ws->pinned[i]);
        }
        if (ws->side) {
            cudaStreamSynchronize(ws->side);
            cudaStreamDestroy(ws->side);
        }
        cudaEvent_t evs[3] = {ws->ready, ws->fork, ws->done};
        for (int i = 0; i < 3; i++)
            if (evs[i])
                cudaEventDestroy(evs[i]);
        if (ws->dblock)
            ptl_alloc_free(ctx->alloc, ws->dblock);
    }
    free(ws);
}

static size_t obj_align(size_t n) { return (n + 255) & ~(size_t)255; }

/* Blocks of 256 threads for n items, at most OBJ_NB (the partial-sum arrays' length). */
static unsigned obj_blocks(int64_t n)
{
    const int64_t nb = (n + OBJ_THREADS - 1) / OBJ_THREADS;
    return (unsigned)(nb < 1 ? 1 : nb > OBJ_NB ? OBJ_NB : nb);
}

extern "C" int ptl_objective_cuda(ptl_obj_workspace *ws, const ptl_obj_args *ar, const ptl_obj_targets *tg)
{
    ptl_cuda_ctx *ctx;
    ObjGeom g;
    ObjCall c;
    cudaStream_t st;
    const int64_t B = ar->B, A = ar->A, M = tg->M, BA = B * A, BM = B * M, ncls = BA * ar->nc;
    const int v8 = ar->nc % 8 == 0 && ptl_aligned16(ar->scores[0], ar->grad_scores[0], NULL) &&
                   ptl_aligned16(ar->scores[1], ar->grad_scores[1], NULL);
    const int narrow = ncls <= (int64_t)UINT32_MAX - (int64_t)OBJ_NB * OBJ_THREADS; /* i + stride fits */
    static_assert(PTL_OBJ_TOPK2_O2M == PTL_OBJ_TOPK_O2M && PTL_OBJ_TOPK2_O2O == 1,
                  "the CUDA top-k2 step handles topk2 == 1 only");
    static_assert(PTL_OBJ_TOPK_O2O <= OBJ_KMAX, "the selection's lists hold OBJ_KMAX keys");

    if (ar->dtype != PTL_FLOAT32 && ar->dtype != PTL_BFLOAT16 && ar->dtype != PTL_FLOAT16)
        return ptl_set_error(PTL_ERR_TYPE, "objective: CUDA outputs must be float32, bfloat16 or float16, got %s",
                             ptl_dtype_name(ar->dtype));
    if (ptl_cuda_ctx_get(ws->rt, ws->device, &ctx) != 0)
        return -1;
    st = ctx->stream;

    /* device workspace: targets, then per branch its per-anchor and per-GT buffers and partial sums (the offsets
     * below are within a branch's), then the branches' results and the block counters */
    size_t tgt_bytes = obj_align(sizeof(int32_t) * (size_t)(B + BM) + sizeof(float) * 4 * (size_t)BM);
    size_t off_owner = 0, off_claim = off_owner + obj_align(4 * (size_t)BA);
    size_t off_palign = off_claim + obj_align(4 * (size_t)BA), off_povl = off_palign + obj_align(4 * (size_t)BA);
    size_t off_nval = off_povl + obj_align(4 * (size_t)BA), off_sel = off_nval + obj_align(4 * (size_t)BA);
    size_t off_key = off_sel + obj_align(4 * (size_t)BM * OBJ_KMAX), off_amax = off_key + obj_align(8 * (size_t)BM);
    size_t off_omax = off_amax + obj_align(4 * (size_t)BM), off_seltop = off_omax + obj_align(4 * (size_t)BM);
    size_t off_selnum = off_seltop + obj_align(8 * (size_t)BM * OBJ_SEL_SPLIT * OBJ_KMAX);
    size_t off_seldone = off_selnum + obj_align(4 * (size_t)BM * OBJ_SEL_SPLIT);
    size_t off_part = off_seldone + obj_align(4 * (size_t)BM);
    size_t branch_bytes = off_part + obj_align(sizeof(double) * 4 * OBJ_NB);
    size_t off_res = tgt_bytes + 2 * branch_bytes, off_ctr = off_res + obj_align(sizeof(double) * 8);
    size_t need = off_ctr + obj_align(sizeof(int32_t) * OBJ_NCTR);
    int grown = 0;
    if (need > ws->dcap) {
        /* grown geometrically: the box count per image varies from batch to batch */
        const size_t cap = need > 2 * ws->dcap ? need : 2 * ws->dcap;
        if (ws->dblock)
            ptl_alloc_free(ctx->alloc, ws->dblock);
        ws->dblock = ws->dbuf = NULL;
        ws->dcap = 0;
        if (ptl_alloc_malloc(ctx->alloc, 0, cap, &ws->dbuf, &ws->dblock) != 0)
            return -1;
        ws->dcap = cap;
        grown = 1;
    }
    char *base = (char *)ws->dbuf;
    for (int br = 0; br < 2; br++) {
        ObjBufs &w = c.w[br];
        char *bb = base + tgt_bytes + br * branch_bytes;
        w.count = (const int32_t *)base;
        w.cls = w.count + B;
        w.gbox = (const float *)(w.cls + BM);
        w.owner = (int32_t *)(bb + off_owner);
        w.claim = (int32_t *)(bb + off_claim);
        w.palign = (float *)(bb + off_palign);
        w.povl = (float *)(bb + off_povl);
        w.nval = (float *)(bb + off_nval);
        w.sel = (int32_t *)(bb + off_sel);
        w.gtkey = (unsigned long long *)(bb + off_key);
        w.amax = (unsigned int *)(bb + off_amax);
        w.omax = (unsigned int *)(bb + off_omax);
        w.seltop = (unsigned long long *)(bb + off_seltop);
        w.selnum = (int32_t *)(bb + off_selnum);
        w.seldone = (int32_t *)(bb + off_seldone);
        w.part = (double *)(bb + off_part);
        c.boxes[br] = ar->boxes[br];
        c.scores[br] = ar->scores[br];
        c.gboxes[br] = ar->grad_boxes[br];
        c.gscores[br] = ar->grad_scores[br];
        c.topk[br] = br ? PTL_OBJ_TOPK_O2O : PTL_OBJ_TOPK_O2M;
        c.top1[br] = (br ? PTL_OBJ_TOPK2_O2O : PTL_OBJ_TOPK2_O2M) != c.topk[br];
    }
    c.res = (double *)(base + off_res);
    c.ctr = (int32_t *)(base + off_ctr);
    c.dt = ar->dtype;
    c.dscale = ar->grad_scale_dev;
    c.losses = ar->losses;
    c.wt[0] = ar->o2m_weight;
    c.wt[1] = ar->o2m_weight < 1 ? 1 - ar->o2m_weight : 0;
    for (int k = 0; k < 3; k++)
        c.gain[k] = ar->gain[k];
    for (int br = 0; br < 2; br++) {
        const double bsc = c.wt[br] * (double)B * ar->grad_scale;
        c.kcls[br] = bsc * ar->gain[1];
        c.kbox[br] = bsc * ar->gain[0];
        c.kl1[br] = bsc * ar->gain[2];
    }

    /* The side stream writes the workspace before the forward's outputs are ready: after the previous call's last
     * launch (the last reader of its targets and buffers), or, the first time and when the workspace was just
     * reallocated, after everything queued on the device stream (the memory's earlier users). */
    PTL_CUDA_TRY(cudaEventRecord(ws->fork, st));
    PTL_CUDA_TRY(cudaStreamWaitEvent(ws->side, grown || !ws->done_used ? ws->fork : ws->done, 0));
    /* targets: host -> pinned staging (waiting only for the upload of two calls back) -> device */
    {
        size_t tb = sizeof(int32_t) * (size_t)(B + BM) + sizeof(float) * 4 * (size_t)BM;
        int t = ws->turn;
        if (ws->ev_used[t])
            PTL_CUDA_TRY(cudaEventSynchronize(ws->ev[t]));
        if (ws->pcap[t] < tb) {
            if (ws->pinned[t])
                PTL_CUDA_TRY(cudaFreeHost(ws->pinned[t]));
            ws->pinned[t] = NULL;
            ws->pcap[t] = 0;
            PTL_CUDA_TRY(cudaHostAlloc(&ws->pinned[t], tb * 2, cudaHostAllocDefault));
            ws->pcap[t] = tb * 2;
        }
        char *p = (char *)ws->pinned[t];
        memcpy(p, tg->count, sizeof(int32_t) * (size_t)B);
        memcpy(p + 4 * B, tg->cls, sizeof(int32_t) * (size_t)BM);
        memcpy(p + 4 * (B + BM), tg->box_f, sizeof(float) * 4 * (size_t)BM);
        PTL_CUDA_TRY(cudaMemcpyAsync(base, p, tb, cudaMemcpyHostToDevice, ws->side));
        PTL_CUDA_TRY(cudaEventRecord(ws->ev[t], ws->side));
        ws->ev_used[t] = 1;
        ws->turn ^= 1;
    }

    g.A = A;
    g.B = (int)B;
    g.M = (int)M;
    g.nc = ar->nc;
    g.H = ar->H;
    g.W = ar->W;
    g.loff[0] = 0;
    for (int l = 0; l < PTL_OBJ_NUM_LEVELS; l++) {
        g.lw[l] = ar->W / (8 << l);
        g.lh[l] = ar->H / (8 << l);
        g.loff[l + 1] = g.loff[l] + (int64_t)g.lw[l] * g.lh[l];
    }
    c.nb_anchor = obj_blocks(BA);
    c.nb_cls = obj_blocks(v8 ? ncls / 8 : ncls);
    {
        const int64_t na = ar->assign_in ? 0 : BA, ng = ar->assign_in ? 0 : BM;
        int64_t n = na > ng ? na : ng;
        n = n > 4 * OBJ_NB ? n : 4 * OBJ_NB;
        ptl_launch(obj_init_kernel, obj_blocks(n), OBJ_THREADS, 0, ws->side, c, na, ng);
        PTL_LAUNCH_CHECK("obj_init_kernel");
    }
    PTL_CUDA_TRY(cudaEventRecord(ws->ready, ws->side));
    PTL_CUDA_TRY(cudaStreamWaitEvent(st, ws->ready, 0));

    /* the assignment of both branches (or the given one), then the normalised targets and T */
    if (ar->assign_in) {
        for (int br = 0; br < 2; br++) {
            PTL_CUDA_TRY(cudaMemcpyAsync(c.w[br].owner, ar->assign_gt[br], 4 * (size_t)BA, cudaMemcpyDeviceToDevice,
                                         st));
            PTL_CUDA_TRY(cudaMemcpyAsync(c.w[br].nval, ar->assign_score[br], 4 * (size_t)BA,
                                         cudaMemcpyDeviceToDevice, st));
        }
        ptl_launch(obj_tsum_kernel, 2 * c.nb_anchor, OBJ_THREADS, 0, st, g, c);
        PTL_LAUNCH_CHECK("obj_tsum_kernel");
    } else {
        if (BM > 0) {
            ptl_launch(obj_select_kernel, (unsigned)(2 * BM * OBJ_SEL_SPLIT), OBJ_SEL_THREADS, 0, st, g, c);
            PTL_LAUNCH_CHECK("obj_select_kernel");
            const int64_t nsel = BM * (c.topk[0] + c.topk[1]); /* a warp per entry */
            ptl_launch(obj_conflict_kernel, (unsigned)((nsel * 32 + OBJ_THREADS - 1) / OBJ_THREADS), OBJ_THREADS, 0,
                       st, g, c);
            PTL_LAUNCH_CHECK("obj_conflict_kernel");
            for (int br = 0; br < 2; br++)
                if (c.top1[br]) {
                    ptl_launch(obj_top1_kernel, c.nb_anchor, OBJ_THREADS, 0, st, g, c.w[br]);
                    PTL_LAUNCH_CHECK("obj_top1_kernel");
                }
            ptl_launch(obj_stats_kernel, 2 * c.nb_anchor, OBJ_THREADS, 0, st, g, c);
            PTL_LAUNCH_CHECK("obj_stats_kernel");
        }
        ptl_launch(obj_nval_kernel, 2 * c.nb_anchor, OBJ_THREADS, 0, st, g, c);
        PTL_LAUNCH_CHECK("obj_nval_kernel");
        for (int br = 0; br < 2; br++) {
            if (ar->assign_gt[br])
                PTL_CUDA_TRY(
                    cudaMemcpyAsync(ar->assign_gt[br], c.w[br].owner, 4 * (size_t)BA, cudaMemcpyDeviceToDevice, st));
            if (ar->assign_score[br])
                PTL_CUDA_TRY(cudaMemcpyAsync(ar->assign_score[br], c.w[br].nval, 4 * (size_t)BA,
                                             cudaMemcpyDeviceToDevice, st));
        }
    }

    /* the losses and gradients */
    if (v8 && narrow)
        ptl_launch(obj_cls_kernel<uint32_t, 8>, 2 * c.nb_cls, OBJ_THREADS, 0, st, g, c);
    else if (v8)
        ptl_launch(obj_cls_kernel<int64_t, 8>, 2 * c.nb_cls, OBJ_THREADS, 0, st, g, c);
    else if (narrow)
        ptl_launch(obj_cls_kernel<uint32_t, 1>, 2 * c.nb_cls, OBJ_THREADS, 0, st, g, c);
    else
        ptl_launch(obj_cls_kernel<int64_t, 1>, 2 * c.nb_cls, OBJ_THREADS, 0, st, g, c);
    PTL_LAUNCH_CHECK("obj_cls_kernel");
    ptl_launch(obj_box_kernel, 2 * c.nb_anchor, OBJ_THREADS, 0, st, g, c);
    PTL_LAUNCH_CHECK("obj_box_kernel");
    PTL_CUDA_TRY(cudaEventRecord(ws->done, st));
    ws->done_used = 1;
    return 0;
fail:
    return -1;
}
