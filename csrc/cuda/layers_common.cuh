/* Device helpers shared by the CUDA layer kernels (csrc/cuda/{activation,batchnorm,conv2d,maxpool,upsample,
 * concat,attention,elementwise}.cu): element loads/stores that compute in float32, dtype dispatch, launch
 * sizing, and the deterministic per-channel column reduction used by BatchNorm and the conv bias
 * gradient. */
#ifndef PTL_CUDA_LAYERS_COMMON_CUH
#define PTL_CUDA_LAYERS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "conv2d.h"
#include "device.h"
#include "launch.cuh"
#include "layer_scratch.h"

__device__ __forceinline__ float ptl_ld(const float *p) { return *p; }
__device__ __forceinline__ float ptl_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ptl_ld(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ void ptl_st(float *p, float v) { *p = v; }
__device__ __forceinline__ void ptl_st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void ptl_st(__half *p, float v) { *p = __float2half_rn(v); }

/* Runs `body` (a statement using the type alias T) for float32, bfloat16 or float16 activations;
 * any other dtype sets a TypeError naming `fn` and jumps to fail. The body is variadic so that kernel
 * launches (whose template arguments hold commas) can be written inline. */
#define PTL_LAYER_DISPATCH(fn, dt, ...)                                                                     \
    do {                                                                                                    \
        if ((dt) == PTL_FLOAT32) {                                                                          \
            typedef float T;                                                                                \
            __VA_ARGS__;                                                                    \
        } else if ((dt) == PTL_BFLOAT16) {                                                                  \
            typedef __nv_bfloat16 T;                                                                        \
            __VA_ARGS__;                                                                    \
        } else if ((dt) == PTL_FLOAT16) {                                                                   \
            typedef __half T;                                                                               \
            __VA_ARGS__;                                                                    \
        } else {                                                                                            \
            ptl_set_error(PTL_ERR_TYPE, "%s: dtype %s is not supported on CUDA (float32, bfloat16 or float16)", \
                          fn, ptl_dtype_name(dt));                                                          \
            goto fail;                                                                                      \
        }                                                                                                   \
    } while (0)

/* V consecutive elements moved as one access (16 bytes when V = 16 / sizeof(T)); element-wise kernels
 * take this path when every width, offset and pointer is a multiple of it (ptl_vec_ok), else V = 1. */
template <typename T, int V>
struct alignas(sizeof(T) * V) ptl_pack {
    T v[V];
};

static inline int ptl_vec_ok(int64_t width, int v, const void *a, const void *b, const void *c)
{
    return width % v == 0 && ptl_aligned16(a, b, c);
}

/* Blocks for a grid-stride loop over n items with `threads` per block: enough to fill the GPU, never
 * more than the work needs. */
static inline unsigned ptl_grid_for(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b > 4096)
        b = 4096;
    return (unsigned)(b < 1 ? 1 : b);
}

/* ---------------------------------------------------------------- deterministic column reduction
 *
 * Sums over the m rows of an (m, c) row-major matrix, K quantities per channel, in a fixed order:
 * the rows are cut into `nchunks` contiguous chunks; block (tile, chunk) has cw x ry threads, thread
 * (tx, ty) sums rows chunk_begin + ty, + ry, ... of channel tile*cw + tx in double, then the ry
 * partial sums are combined by a shared-memory tree in a fixed pattern, and one double per
 * (quantity, chunk, channel) goes to `part` (K * nchunks * c). ptl_colsum_finish combines the chunks
 * with one warp per channel in a fixed pattern. The geometry depends on (m, c) only and no step uses
 * atomics, so results are bitwise reproducible. */

#define PTL_COLSUM_THREADS 256
/* Scratch cap for the partial sums: bounds nchunks for wide tensors. */
#define PTL_COLSUM_MAX_PART_BYTES ((size_t)8 << 20)

typedef struct {
    int cw, ry, ctiles, nchunks;
    int64_t rows_per_chunk;
} ptl_colsum_geom;

static inline ptl_colsum_geom ptl_colsum_geometry(int64_t m, int c, int k)
{
    ptl_colsum_geom g;
    g.cw = 32;
    while (g.cw > 1 && g.cw / 2 >= c)
        g.cw /= 2;
    g.ry = PTL_COLSUM_THREADS / g.cw;
    g.ctiles = (c + g.cw - 1) / g.cw;
    int64_t nch = (512 + g.ctiles - 1) / g.ctiles;              /* about 512 blocks in all */
    const int64_t by_rows = (m + 4 * (int64_t)g.ry - 1) / (4 * (int64_t)g.ry); /* >= 4 rows per thread */
    const int64_t by_mem = (int64_t)(PTL_COLSUM_MAX_PART_BYTES / ((size_t)k * sizeof(double) * (size_t)c));
    if (nch > by_rows)
        nch = by_rows;
    if (nch > by_mem)
        nch = by_mem;
    if (nch < 1)
        nch = 1;
    g.rows_per_chunk = (m + nch - 1) / nch;
    g.nchunks = (int)((m + g.rows_per_chunk - 1) / g.rows_per_chunk);
    return g;
}

static inline size_t ptl_colsum_part_bytes(int64_t m, int c, int k)
{
    const ptl_colsum_geom g = ptl_colsum_geometry(m, c, k);
    return (size_t)k * g.nchunks * (size_t)c * sizeof(double);
}

/* F provides `static constexpr int K`, `static constexpr int ROWS_AT_ONCE`, `Row load(int64_t row, int ch)` reading a
 * row's raw values and `void add(const Row &, int ch, double *acc)` adding them to acc[0..K). A thread loads
 * ROWS_AT_ONCE rows before adding any: that is what gets their loads in flight together where a row is much
 * arithmetic (BatchNorm's backward sums, grouped without it, got slower; staged, 1.4x faster: RESULTS.md, issue 22). */
template <typename F>
__global__ void ptl_colsum_partials(int64_t m, int c, int64_t rows_per_chunk, F f, double *part)
{
    ptl_wait_prior();
    constexpr int K = F::K;
    __shared__ double sh[K][PTL_COLSUM_THREADS];
    const int tx = threadIdx.x, ty = threadIdx.y, cw = blockDim.x, ry = blockDim.y;
    const int ch = blockIdx.x * cw + tx;
    const int chunk = blockIdx.y;
    const int64_t r0 = (int64_t)chunk * rows_per_chunk;
    int64_t r1 = r0 + rows_per_chunk;
    if (r1 > m)
        r1 = m;
    double acc[K];
#pragma unroll
    for (int q = 0; q < K; q++)
        acc[q] = 0.0;
    if (ch < c) {
        /* Whole groups of rows first, with no bound test between them (a test after each row keeps one row's
         * loads in flight), then the rest one by one; the additions keep the rows' order either way. */
        constexpr int U = F::ROWS_AT_ONCE;
        const int64_t first = r0 + ty;
        int64_t n = first < r1 ? (r1 - first + ry - 1) / ry : 0, r = first;
        for (; n >= U; n -= U, r += U * (int64_t)ry) {
            typename F::Row v[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                v[u] = f.load(r + u * (int64_t)ry, ch);
#pragma unroll
            for (int u = 0; u < U; u++)
                f.add(v[u], ch, acc);
        }
        for (; n > 0; n--, r += ry)
            f.add(f.load(r, ch), ch, acc);
    }
    const int tid = ty * cw + tx;
#pragma unroll
    for (int q = 0; q < K; q++)
        sh[q][tid] = acc[q];
    __syncthreads();
    for (int half = ry / 2; half > 0; half /= 2) {
        if (ty < half)
#pragma unroll
            for (int q = 0; q < K; q++)
                sh[q][tid] += sh[q][tid + half * cw];
        __syncthreads();
    }
    if (ty == 0 && ch < c)
#pragma unroll
        for (int q = 0; q < K; q++)
            part[((int64_t)q * gridDim.y + chunk) * c + ch] = sh[q][tx];
}

/* Sums of quantities q0 .. q0 + N - 1 of channel ch over the chunks, by the 32 lanes of one warp: lane l
 * adds chunks l, l + 32, ... in ascending order, then a fixed shuffle tree combines the lanes. The N chains
 * run interleaved in one loop, each in that order, so their bits do not depend on N. Every lane of the
 * warp must call it with the same (q0, ch); all get the results. Finishing kernels run one warp per channel
 * (PTL_COLSUM_FINISH_WARPS per block, launched by ptl_colsum_finish_blocks). */
#define PTL_COLSUM_FINISH_WARPS 4
template <int N>
__device__ __forceinline__ void ptl_colsum_finish_n(const double *part, int nchunks, int c, int q0, int ch,
                                                    double *out)
{
    const int lane = threadIdx.x & 31;
    const double *p = part + (int64_t)q0 * nchunks * c + ch;
    double s[N];
#pragma unroll
    for (int k = 0; k < N; k++)
        s[k] = 0.0;
    for (int i = lane; i < nchunks; i += 32)
#pragma unroll
        for (int k = 0; k < N; k++)
            s[k] += p[((int64_t)k * nchunks + i) * c];
#pragma unroll
    for (int off = 16; off > 0; off /= 2)
#pragma unroll
        for (int k = 0; k < N; k++)
            s[k] += __shfl_down_sync(0xffffffffu, s[k], off);
#pragma unroll
    for (int k = 0; k < N; k++)
        out[k] = __shfl_sync(0xffffffffu, s[k], 0);
}

/* ptl_colsum_finish_n of quantity q alone. */
__device__ __forceinline__ double ptl_colsum_finish(const double *part, int nchunks, int c, int q, int ch)
{
    double s;
    ptl_colsum_finish_n<1>(part, nchunks, c, q, ch, &s);
    return s;
}

/* The channel of the calling warp in a finishing kernel (>= c: the warp has nothing to do). */
__device__ __forceinline__ int ptl_colsum_finish_channel(void)
{
    return blockIdx.x * PTL_COLSUM_FINISH_WARPS + (int)(threadIdx.x >> 5);
}

static inline unsigned ptl_colsum_finish_blocks(int c)
{
    return (unsigned)((c + PTL_COLSUM_FINISH_WARPS - 1) / PTL_COLSUM_FINISH_WARPS);
}
#define PTL_COLSUM_FINISH_THREADS (32 * PTL_COLSUM_FINISH_WARPS)

template <typename F>
static inline void ptl_colsum_launch(const ptl_colsum_geom &g, int64_t m, int c, F f, double *part,
                                     cudaStream_t stream)
{
    dim3 grid((unsigned)g.ctiles, (unsigned)g.nchunks), block((unsigned)g.cw, (unsigned)g.ry);
    ptl_launch(ptl_colsum_partials<F>, grid, block, 0, stream, m, c, g.rows_per_chunk, f, part);
}

#endif
