/* A convolution with BatchNorm's statistics in its epilogue (conv2d_bn.h).
 *
 * The convolution is an implicit GEMM over NHWC activations and OHWI weights: output row r = (n, ho, wo) times
 * output channel o, summed over k = (kh, kw, ci), so that both operands are read along k in runs of 8 channels
 * (16 bytes; hence channel counts that are multiples of 8). A block of 4 warps computes 64-row tiles of BN output
 * channels: the operands' 32-wide k slices are staged in shared memory by cp.async, 3 or 4 deep, zero-filled
 * outside the image (the padding) and past k's end, and each warp multiplies its 16 rows by all BN channels with
 * mma.sync (m16n8k16, float32 accumulation). The epilogue rounds the tile to the dtype in shared memory, stores it
 * in 16-byte rows, and adds the stored values (as double, minus the block's shift) to the channel's two sums.
 *
 * A block takes the row tiles blockIdx.y, + gridDim.y, ... and runs their k slices as one pipeline, so that the
 * next tile's loads are in flight during a tile's epilogue. gridDim.y (the chunks, at most MAX_CHUNKS) depends on
 * the shape alone, so every block's rows, its shift (the value of its first row) and its order of additions are
 * the same every run. The loads' index arithmetic is incremental (no division per k slice): with a division and a
 * general loop per slice the kernel was instruction-bound, two to four times slower (RESULTS.md, issue 22). */
#include "conv2d_bn.h"
#include "../nn/batchnorm.h"
#include "call_graph.h"
#include "layers_common.cuh"
#include "mma.cuh"

#include <stdlib.h>
#include <string.h>

namespace {

constexpr int BM = 64, THREADS = 128, BK = 32;
/* Stages of k slices: the 64-wide channel tile takes one less, to keep a block's shared memory under 48 KB. (64-wide
 * slices four deep, in dynamic shared memory, summed 13% less over yolo26n's layers: RESULTS.md, calls 74-75.) */
template <int BN>
constexpr int stages(void)
{
    return BN == 64 ? 3 : 4;
}
/* At most this many blocks share a channel tile: their partial sums are what the finish reads. */
constexpr int MAX_CHUNKS = 256;
/* Quantities per chunk and channel in the partial sums: sum of (v - shift), of its squares, the shift, rows. */
constexpr int PARTS = 4;

struct conv_args {
    int h, w, cin, cout, stride, pad, ho, wo, K, m, tiles_m;
};

int tile_n(int cout) { return cout >= 64 ? 64 : cout > 16 ? 32 : 16; }

int chunks(int64_t m)
{
    const int64_t tiles_m = (m + BM - 1) / BM;
    return (int)(tiles_m < MAX_CHUNKS ? tiles_m : MAX_CHUNKS);
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;"); }

template <int N>
__device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

/* The A operand's loader of one thread: rows tid / AKC + RP * i (i < RPT) of its block's current tile, the 8
 * channels at k = kt * BK + (tid % AKC) * 8 of k slice kt, walked tile after tile. */
template <int KS>
struct a_loader {
    static constexpr int AKC = BK / 8, RP = THREADS / AKC, RPT = BM / RP;
    int tile, kt, k, ci, kh, kw; /* the next slice to load: its tile (of the block's), its k and k's (kh, kw, ci) */
    int base[RPT], hb[RPT], wb[RPT]; /* per row: the offset of its (n, hb, wb) in x, its first input row, column */
    bool rok[RPT];

    __device__ void start_tile(const conv_args &a, int tm, int kc)
    {
#pragma unroll
        for (int i = 0; i < RPT; i++) {
            const int r = tm * BM + (int)threadIdx.x / AKC + RP * i;
            rok[i] = r < a.m;
            const int rr = rok[i] ? r : 0, t = rr / a.wo, wo = rr - t * a.wo, img = t / a.ho, ho = t - img * a.ho;
            hb[i] = ho * a.stride - a.pad;
            wb[i] = wo * a.stride - a.pad;
            base[i] = ((img * a.h + hb[i]) * a.w + wb[i]) * a.cin;
        }
        kt = 0;
        k = kc * 8;
        const int tap = KS > 1 ? k / a.cin : 0;
        ci = k - tap * a.cin;
        kh = tap / KS;
        kw = tap - kh * KS;
    }

    template <typename T>
    __device__ void issue(const conv_args &a, const T *x, T *dst, int col)
    {
        const bool kok = k < a.K;
        const int toff = (kh * a.w + kw) * a.cin + ci;
#pragma unroll
        for (int i = 0; i < RPT; i++) {
            const bool ok = kok && rok[i] && (unsigned)(hb[i] + kh) < (unsigned)a.h &&
                            (unsigned)(wb[i] + kw) < (unsigned)a.w;
            cp_async16(dst + ((int)threadIdx.x / AKC + RP * i) * (BK + 8) + col, ok ? x + base[i] + toff : x, ok);
        }
        k += BK;
        ci += BK;
        if (KS > 1)
            while (ci >= a.cin) {
                ci -= a.cin;
                if (++kw == KS) {
                    kw = 0;
                    ++kh;
                }
            }
    }
};

/* Grid (channel tiles, chunks); part as conv2d_bn.h's finish reads it: part[(q * chunks + chunk) * cout + o].
 * Shared-memory rows of BK + 8 elements (80 bytes): ldmatrix's eight 16-byte rows fall in distinct banks. */
template <typename T, int BN, int KS>
__global__ void __launch_bounds__(THREADS) conv_bn_stats(conv_args a, const T *__restrict__ x,
                                                         const T *__restrict__ w, T *__restrict__ y,
                                                         double *__restrict__ part)
{
    ptl_wait_prior();
    constexpr int STAGES = stages<BN>(), LDS = BK + 8, NB = BN / 16, CS = BN + 8, G = THREADS / BN, CPR = BN / 8,
                  AKC = BK / 8, BJ = (BN * AKC + THREADS - 1) / THREADS;
    __shared__ alignas(16) T As[STAGES][BM][LDS];
    __shared__ alignas(16) T Bs[STAGES][BN][LDS];
    __shared__ alignas(16) T Cs[BM][CS];
    __shared__ double red[2][THREADS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, kc = tid % AKC;
    const int n0 = blockIdx.x * BN, ktiles = (a.K + BK - 1) / BK;
    const int ntiles = (a.tiles_m - (int)blockIdx.y + (int)gridDim.y - 1) / (int)gridDim.y, total = ntiles * ktiles;
    /* the B loads: piece j of this thread is row (tid + j * THREADS) / AKC of the slice, k chunk tid % AKC */
    const T *bsrc[BJ];
    bool bok[BJ];
#pragma unroll
    for (int j = 0; j < BJ; j++) {
        const int c = tid + j * THREADS, n = n0 + c / AKC;
        bok[j] = c < BN * AKC && n < a.cout;
        bsrc[j] = bok[j] ? w + (size_t)n * a.K + kc * 8 : w;
    }
    a_loader<KS> ld;
    ld.tile = 0;
    ld.start_tile(a, blockIdx.y, kc);
    int loaded = 0;
    auto load = [&](int stage) {
        ld.issue(a, x, &As[stage][0][0], kc * 8);
        const int k0 = ld.kt * BK;
#pragma unroll
        for (int j = 0; j < BJ; j++) {
            const int c = tid + j * THREADS;
            if (BN * AKC % THREADS == 0 || c < BN * AKC) {
                const bool ok = bok[j] && k0 + kc * 8 < a.K;
                cp_async16(&Bs[stage][c / AKC][kc * 8], ok ? bsrc[j] + k0 : w, ok);
            }
        }
        if (++ld.kt == ktiles && ++ld.tile < ntiles)
            ld.start_tile(a, blockIdx.y + ld.tile * gridDim.y, kc);
        loaded++;
    };
    /* the statistics: thread tid sums rows tid / BN, + G, ... of channel n0 + tid % BN */
    const int scol = tid % BN, srow = tid / BN;
    const bool scol_ok = n0 + scol < a.cout;
    double shift = 0.0, s = 0.0, q = 0.0;
    int rows_done = 0;
    float acc[2 * NB][4];
#pragma unroll
    for (int j = 0; j < 2 * NB; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[j][e] = 0.0f;
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (loaded < total)
            load(st);
        cp_async_commit();
    }
    const int lj = lane >> 3, lr = lane & 7;
    int kt = 0, tile = 0;
    for (int it = 0; it < total; it++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (loaded < total)
            load(loaded % STAGES);
        cp_async_commit();
        const int sg = it % STAGES;
        /* every fragment of the slice first, then the products: the loads' latencies overlap */
        uint32_t af[BK / 16][4], bf[BK / 16][NB][4];
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            ldmatrix_x4(af[kk], &As[sg][warp * 16 + (lj & 1) * 8 + lr][kk * 16 + (lj >> 1) * 8]);
#pragma unroll
            for (int nb = 0; nb < NB; nb++)
                ldmatrix_x4(bf[kk][nb], &Bs[sg][nb * 16 + (lj >> 1) * 8 + lr][kk * 16 + (lj & 1) * 8]);
        }
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
            for (int nb = 0; nb < NB; nb++) {
                mma_16816<T>(acc[2 * nb], af[kk], bf[kk][nb]);
                mma_16816<T>(acc[2 * nb + 1], af[kk], bf[kk][nb] + 2);
            }
        if (++kt < ktiles)
            continue;
        /* the tile's epilogue; accumulator (j, e): row warp * 16 + lane / 4 (+ 8 for e >= 2), channel
         * j * 8 + 2 * (lane % 4) + e % 2 */
        const int m0 = ((int)blockIdx.y + tile * (int)gridDim.y) * BM;
#pragma unroll
        for (int j = 0; j < 2 * NB; j++) {
            const int r = warp * 16 + (lane >> 2), c = j * 8 + 2 * (lane & 3);
            ptl_st(&Cs[r][c], acc[j][0]);
            ptl_st(&Cs[r][c + 1], acc[j][1]);
            ptl_st(&Cs[r + 8][c], acc[j][2]);
            ptl_st(&Cs[r + 8][c + 1], acc[j][3]);
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[j][e] = 0.0f;
        }
        __syncthreads();
        const int rows = a.m - m0 < BM ? a.m - m0 : BM;
        for (int c = tid; c < BM * CPR; c += THREADS) {
            const int r = c / CPR, col = (c % CPR) * 8;
            if (r < rows && n0 + col < a.cout)
                *reinterpret_cast<uint4 *>(y + (size_t)(m0 + r) * a.cout + n0 + col) =
                    *reinterpret_cast<const uint4 *>(&Cs[r][col]);
        }
        if (scol_ok) {
            if (tile == 0)
                shift = (double)ptl_ld(&Cs[0][scol]);
            for (int r = srow; r < rows; r += G) {
                const double d = (double)ptl_ld(&Cs[r][scol]) - shift;
                s += d;
                q += d * d;
            }
        }
        rows_done += rows;
        kt = 0;
        tile++;
    }
    red[0][tid] = s;
    red[1][tid] = q;
    __syncthreads();
    if (tid < BN && n0 + tid < a.cout) {
        double S = 0.0, Q = 0.0;
        for (int g = 0; g < G; g++) {
            S += red[0][g * BN + tid];
            Q += red[1][g * BN + tid];
        }
        const int64_t nch = gridDim.y, at = (int64_t)blockIdx.y * a.cout + n0 + tid, qs = nch * a.cout;
        part[at] = S;
        part[qs + at] = Q;
        part[2 * qs + at] = shift;
        part[3 * qs + at] = (double)rows_done;
    }
}

template <typename T, int BN>
void launch(const conv_args &a, int ks, int nch, const void *x, const void *w, void *z, double *part,
            cudaStream_t st)
{
    const dim3 grid((unsigned)((a.cout + BN - 1) / BN), (unsigned)nch);
    if (ks == 1)
        ptl_launch(conv_bn_stats<T, BN, 1>, grid, THREADS, 0, st, a, (const T *)x, (const T *)w, (T *)z, part);
    else
        ptl_launch(conv_bn_stats<T, BN, 3>, grid, THREADS, 0, st, a, (const T *)x, (const T *)w, (T *)z, part);
}

template <typename T>
void launch_tiles(const conv_args &a, int ks, int nch, const void *x, const void *w, void *z, double *part,
                  cudaStream_t st)
{
    switch (tile_n(a.cout)) {
    case 64:
        launch<T, 64>(a, ks, nch, x, w, z, part, st);
        break;
    case 32:
        launch<T, 32>(a, ks, nch, x, w, z, part, st);
        break;
    default:
        launch<T, 16>(a, ks, nch, x, w, z, part, st);
    }
}

/* PTL_CONV_BN=1 fuses (read at each call, so that tests and benchmarks may switch it); unset or anything else, the
 * plan's convolution and BatchNorm's pass run as before (conv2d_bn.h says why that is the default). */
int fusion_on(void)
{
    const char *e = getenv("PTL_CONV_BN");
    return e && !strcmp(e, "1");
}

} // namespace

extern "C" int ptl_conv2d_bn_fused(const ptl_conv2d_plan *p)
{
    const ptl_conv2d_desc *d = ptl_conv2d_plan_desc(p);
    const ptl_dtype dt = ptl_conv2d_plan_dtype(p);
    const int64_t m = (int64_t)d->n * d->ho * d->wo, in = (int64_t)d->n * d->h * d->w * d->cin;
    return fusion_on() && (dt == PTL_BFLOAT16 || dt == PTL_FLOAT16) && d->groups == 1 && (d->k == 1 || d->k == 3) &&
           d->cin % 8 == 0 && d->cout % 8 == 0 && m * d->cout < INT32_MAX && in < INT32_MAX;
}

extern "C" size_t ptl_conv2d_bn_part_bytes(int64_t m, int c)
{
    return m > 0 && c > 0 ? (size_t)PARTS * chunks(m) * (size_t)c * sizeof(double) : 0;
}

namespace {

/* One fused pass's arguments (a call of call_graph.h). */
typedef struct {
    ptl_cuda_ctx *ctx;
    const ptl_conv2d_plan *plan;
    const void *x, *w, *gamma, *beta;
    void *z, *running_mean, *running_var, *save_mean, *save_invstd, *y, *scratch;
    int ld, silu;
} conv_bn_call;

int issue(void *arg)
{
    const conv_bn_call *k = (const conv_bn_call *)arg;
    const ptl_conv2d_desc *d = ptl_conv2d_plan_desc(k->plan);
    const ptl_dtype dt = ptl_conv2d_plan_dtype(k->plan);
    const int64_t m = (int64_t)d->n * d->ho * d->wo;
    const conv_args a = {d->h,  d->w,  d->cin, d->cout, d->stride, d->pad, d->ho, d->wo, d->k * d->k * d->cin,
                         (int)m, (int)((m + BM - 1) / BM)};
    const int nch = chunks(m);
    double *part = (double *)k->scratch;
    if (dt == PTL_BFLOAT16)
        launch_tiles<__nv_bfloat16>(a, d->k, nch, k->x, k->w, k->z, part, k->ctx->stream);
    else
        launch_tiles<__half>(a, d->k, nch, k->x, k->w, k->z, part, k->ctx->stream);
    PTL_LAUNCH_CHECK("conv_bn_stats");
    return ptl_batchnorm_forward_from_sums_cuda(k->ctx, dt, m, d->cout, nch, part, k->z, k->gamma, k->beta,
                                                k->running_mean, k->running_var, k->silu, k->save_mean,
                                                k->save_invstd, k->y, k->ld);
fail:
    return -1;
}

} // namespace

extern "C" int ptl_conv2d_bn_forward_cuda(ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *x, const void *w,
                                          void *z, void *workspace, size_t workspace_bytes, const void *gamma,
                                          const void *beta, void *running_mean, void *running_var, ptl_act act,
                                          void *save_mean, void *save_invstd, void *y, int ld)
{
    const ptl_conv2d_desc *d = ptl_conv2d_plan_desc(p);
    const ptl_dtype dt = ptl_conv2d_plan_dtype(p);
    const int64_t m = (int64_t)d->n * d->ho * d->wo;
    if (!ptl_conv2d_bn_fused(p) || !ptl_aligned16(x, w, z))
        return ptl_conv2d_forward_cuda(ctx, p, x, w, NULL, z, workspace, workspace_bytes) ||
                       ptl_batchnorm_forward_cuda(ctx, dt, m, d->cout, z, gamma, beta, running_mean, running_var, 1,
                                                  act, save_mean, save_invstd, y, ld)
                   ? -1
                   : 0;
    conv_bn_call k = {ctx, p, x, w, gamma, beta, z, running_mean, running_var, save_mean, save_invstd, y, NULL, ld,
                      act == PTL_ACT_SILU};
    if (ptl_batchnorm_check("conv2d_bn_forward_cuda", m, d->cout, ld, act) ||
        ptl_layers_cuda_scratch(ctx, ptl_batchnorm_cuda_scratch_bytes(m, d->cout), &k.scratch))
        return -1;
    /* three launches, relaunched as one graph once their pointers repeat (an eager step's do) */
    const ptl_call_key key = {{(const void *)issue, ctx, p, x, w, gamma, beta, z, running_mean, running_var,
                               save_mean, save_invstd, y, k.scratch,
                               (const void *)(uintptr_t)(((uint64_t)ld << 1) | (uint64_t)k.silu)}};
    ptl_call_graphs *t = ptl_call_graphs_of(ctx);
    if (!t)
        return -1;
    return ptl_call_graph_run(t, ctx->stream, &key, issue, &k);
}
