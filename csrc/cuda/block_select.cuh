/* Block-wide exact selection on unique 64-bit ranking keys (postprocess.h): the k-th largest key by an
 * 8-pass radix select (one byte per pass), computed by one thread block. Shared by the end-to-end top-k
 * (postprocess.cu) and the NMS candidates (nms.cu). */
#ifndef PTL_CUDA_BLOCK_SELECT_CUH
#define PTL_CUDA_BLOCK_SELECT_CUH

#include <stdint.h>

struct BlockSelectShared {
    unsigned hist[256];
    uint64_t prefix;
    unsigned remaining;
};

/* The k-th largest (1 <= k <= n) of key_of(0 .. n-1), returned to every thread of the block. Keys
 * above the result are unique wherever this is used (zero keys may repeat). Ends with a barrier. */
template <typename KeyOf>
__device__ uint64_t block_kth_key(KeyOf key_of, int64_t n, unsigned k, BlockSelectShared *sh)
{
    int tid = threadIdx.x;
    if (tid == 0) {
        sh->prefix = 0;
        sh->remaining = k;
    }
    uint64_t mask = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x)
            sh->hist[i] = 0;
        __syncthreads();
        uint64_t prefix = sh->prefix;
        for (int64_t i = tid; i < n; i += blockDim.x) {
            uint64_t key = key_of(i);
            if ((key & mask) == prefix)
                atomicAdd(&sh->hist[(key >> shift) & 0xFF], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            unsigned rem = sh->remaining;
            for (int d = 255; d >= 0; d--) {
                if (sh->hist[d] >= rem) {
                    sh->prefix = prefix | ((uint64_t)d << shift);
                    break;
                }
                rem -= sh->hist[d];
            }
            sh->remaining = rem;
        }
        __syncthreads();
        mask |= (uint64_t)0xFF << shift;
    }
    uint64_t kth = sh->prefix;
    __syncthreads();
    return kth;
}

/* Sorts buf[0 .. p) descending, p a power of two, with the whole block (bitonic network). */
__device__ inline void block_bitonic_desc(uint64_t *buf, int p)
{
    int tid = threadIdx.x;
    for (int size = 2; size <= p; size *= 2) {
        for (int stride = size / 2; stride > 0; stride /= 2) {
            for (int i = tid; i < p; i += blockDim.x) {
                int j = i ^ stride;
                if (j > i) {
                    uint64_t x = buf[i], y = buf[j];
                    if ((x < y) == ((i & size) == 0)) {
                        buf[i] = y;
                        buf[j] = x;
                    }
                }
            }
            __syncthreads();
        }
    }
}

#endif
