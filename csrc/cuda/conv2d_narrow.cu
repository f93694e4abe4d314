/* Direct kernels for 3x3 ungrouped convolutions with few input channels (conv2d_narrow.h). Weights are OHWI:
 * w[co * TAPS + (ky * 3 + kx) * CIN + ci], TAPS = 9 * CIN. */
#include "conv2d_narrow.h"
#include "layers_common.cuh"
#include "mma.cuh"

#define NARROW_K 3

/* One thread per (R consecutive output pixels, V output channels): per tap and input channel it loads R inputs
 * and V weights and does R * V products, so that loads do not bound it. The weights wait in shared memory as
 * floats, tap-major ([tap][co]), read 16 bytes at a time. An input outside the image adds 0 * w. PACK: y's
 * rows take V-element stores (16-byte aligned), else element by element. */
template <typename T, typename I, int CIN, int V, int R, bool PACK>
__global__ void narrow_forward_kernel(I items, I pixels, ptl_conv2d_desc d, const T *x, const T *w, T *y)
{
    ptl_wait_prior();
    static_assert(V % 4 == 0, "V output channels: whole float4 loads of the weights");
    constexpr int TAPS = NARROW_K * NARROW_K * CIN;
    __shared__ __align__(16) float ws[NARROW_K * NARROW_K * PTL_NARROW_MAX_CIN * PTL_NARROW_MAX_COUT];
    for (int i = threadIdx.x; i < TAPS * d.cout; i += blockDim.x)
        ws[(i % TAPS) * d.cout + i / TAPS] = ptl_ld(w + i);
    __syncthreads();
    typedef ptl_pack<T, V> P;
    const I stride = (I)gridDim.x * blockDim.x;
    const int cg = d.cout / V;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += stride) {
        const int co0 = (int)(i % cg) * V;
        const I p0 = i / cg * R;
        int iy0[R], ix0[R];
        I base[R]; /* the image's first element */
#pragma unroll
        for (int r = 0; r < R; r++) {
            I pix = p0 + r < pixels ? p0 + r : p0;
            const int ox = (int)(pix % d.wo);
            pix /= d.wo;
            iy0[r] = (int)(pix % d.ho) * d.stride - d.pad;
            ix0[r] = ox * d.stride - d.pad;
            base[r] = pix / d.ho * d.h * d.w;
        }
        float acc[R][V];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int k = 0; k < V; k++)
                acc[r][k] = 0.0f;
#pragma unroll
        for (int ky = 0; ky < NARROW_K; ky++)
#pragma unroll
            for (int kx = 0; kx < NARROW_K; kx++)
#pragma unroll
                for (int ci = 0; ci < CIN; ci++) {
                    float xv[R];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const int iy = iy0[r] + ky, ix = ix0[r] + kx;
                        xv[r] = iy >= 0 && iy < d.h && ix >= 0 && ix < d.w
                                    ? ptl_ld(x + (base[r] + (I)iy * d.w + ix) * CIN + ci)
                                    : 0.0f;
                    }
                    const float *wr = ws + ((ky * NARROW_K + kx) * CIN + ci) * d.cout + co0;
                    float wv[V];
#pragma unroll
                    for (int k = 0; k < V; k += 4) { /* 16-byte aligned: cout and co0 are multiples of V */
                        const float4 q = reinterpret_cast<const float4 *>(wr + k)[0];
                        wv[k] = q.x, wv[k + 1] = q.y, wv[k + 2] = q.z, wv[k + 3] = q.w;
                    }
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int k = 0; k < V; k++)
                            acc[r][k] += xv[r] * wv[k];
                }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (p0 + r >= pixels)
                break;
            T *out = y + (p0 + r) * d.cout + co0;
            if (PACK) {
                P yv;
#pragma unroll
                for (int k = 0; k < V; k++)
                    ptl_st(&yv.v[k], acc[r][k]);
                reinterpret_cast<P *>(out)[0] = yv;
            } else {
#pragma unroll
                for (int k = 0; k < V; k++)
                    ptl_st(out + k, acc[r][k]);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------ weight gradient
 *
 * dw[co][tap] += sum over the output pixels p of dy[p][co] * xcol[p][tap]: a GEMM of M = cout, N = TAPS, K = the
 * pixels, on tensor cores (mma.sync m16n8k16, float32 accumulation). Each warp takes tiles of WG_TW pixels of one
 * output row: it stages the tile's dy rows (pixel-major, as stored) and the three input rows under the tile in
 * shared memory, in 16-byte blocks with all of a lane's loads in flight before its stores (an element-by-element
 * staging was bounded by its index arithmetic: 34 against 18 us at the n stem); A's fragments (dy transposed) come
 * from ldmatrix.trans, B's (the taps) from the input rows, each lane's taps fixed at an offset. The warps of a block
 * add their sums in warp order in shared memory, each block writes its partial sums, and the finish adds the
 * blocks' in order (double) into dw. Warp w takes the tiles w, w + warps, ...; the warp count depends on the shape
 * alone, so the bits do too. */

#define WG_TW 64        /* output pixels a tile (4 k-steps of 16) */
#define WG_WARPS 4      /* warps a block */
#define WG_MAX_WARPS 4096 /* fixed, never the device's SM count: the same bits on every GPU */
#define WG_FINISH_LOADS 8 /* partial sums a finish thread has in flight */
#define WG_FINISH_ROWS 32

struct narrow_wg_geom {
    int tpr;     /* tiles an output row */
    int tiles;   /* n * ho * tpr */
    int warps;   /* a multiple of WG_WARPS */
    int blocks;  /* warps / WG_WARPS: the partial sums' rows */
    int span;    /* input columns under a tile */
    int upr;     /* 8-element blocks of x that cover a row of the tile's input, however it falls */
    int xrow;    /* upr * 8: an input row's pitch in xs */
    int pitch;   /* dy tile row pitch in elements */
    int xs, dys; /* per warp: input rows and dy tile, in elements (multiples of 8: 16-byte aligned) */
};

static narrow_wg_geom narrow_wg_geometry(const ptl_conv2d_desc *d)
{
    narrow_wg_geom g;
    g.tpr = (d->wo + WG_TW - 1) / WG_TW;
    g.tiles = d->n * d->ho * g.tpr; /* at most the output's elements: int (ptl_conv2d_narrow_wgrad_takes) */
    const int w = g.tiles < WG_MAX_WARPS ? g.tiles : WG_MAX_WARPS;
    g.warps = (w + WG_WARPS - 1) / WG_WARPS * WG_WARPS;
    g.blocks = g.warps / WG_WARPS;
    g.span = (WG_TW - 1) * d->stride + NARROW_K;
    g.upr = (g.span * d->cin + 14) / 8;
    /* rows an odd number of 16-byte units apart: ldmatrix's eight rows fall in distinct banks */
    g.pitch = d->cout + 8;
    if (g.pitch / 8 % 2 == 0)
        g.pitch += 8;
    g.xrow = g.upr * 8;
    g.xs = NARROW_K * g.xrow;
    g.dys = WG_TW * g.pitch;
    return g;
}

static size_t narrow_wg_smem(const ptl_conv2d_desc *d, const narrow_wg_geom *g, size_t esz)
{
    const size_t tiles = (size_t)WG_WARPS * (g->xs + g->dys) * esz, sums = (size_t)d->cout * 9 * d->cin * sizeof(float);
    return tiles > sums ? tiles : sums;
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi)
{
    return (uint32_t)*reinterpret_cast<const uint16_t *>(&lo) | (uint32_t)*reinterpret_cast<const uint16_t *>(&hi)
                                                                    << 16;
}

/* MT: 16-channel tiles of cout; the taps in NT 8-wide tiles. part: (blocks, cout * TAPS) float32. The registers are
 * capped for NARROW_WG_MIN_BLOCKS blocks an SM: no spills (-Xptxas -v) but at 3 input channels and 64 outputs,
 * where 3 blocks and 80 bytes of spills beat 2 blocks (the m stem's weight gradient on an H100: 68 against 79 us,
 * benchmarks/layers_cuda.py). */
#define NARROW_WG_MIN_BLOCKS ((MT == 1 ? 5 : MT == 2 ? 4 : 3) - (CIN == 4))
template <typename T, int CIN, int MT>
__global__ void __launch_bounds__(WG_WARPS * 32, NARROW_WG_MIN_BLOCKS)
    narrow_wgrad_kernel(ptl_conv2d_desc d, narrow_wg_geom g, const T *x, const T *dy, float *part, int x_vec,
                        int dy_vec)
{
    ptl_wait_prior();
    constexpr int TAPS = NARROW_K * NARROW_K * CIN, NT = (TAPS + 7) / 8;
    /* a lane's 8-element blocks: of an input row (upr <= 32 * XU at stride <= 2), of the dy tile (64 * cout / 8 <=
     * 32 * DU) */
    constexpr int XU = (((WG_TW - 1) * 2 + NARROW_K) * CIN + 14) / 8 / 32 + 1, DU = 4 * MT;
    extern __shared__ __align__(16) unsigned char narrow_wg_smem_raw[];
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    T *xs = reinterpret_cast<T *>(narrow_wg_smem_raw) + warp * (g.xs + g.dys);
    T *dys = xs + g.xs;
    const int sc = d.stride * CIN; /* one pixel along a tap's input row */
    int off[NT], tky[NT];          /* this lane's tap of each N tile: its element in its row, the row (-1 past TAPS) */
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int n = j * 8 + gq, ky = n / (NARROW_K * CIN);
        off[j] = ky * g.xrow + n - ky * NARROW_K * CIN;
        tky[j] = n < TAPS ? ky : -1;
    }
    /* this lane's dy blocks: (k * cout + c) << 6 | k for pixel k, channels c .. c + 7; -1 past the tile */
    int dslot[DU];
    const int c8 = d.cout / 8;
#pragma unroll
    for (int i = 0; i < DU; i++) {
        const int u = lane + 32 * i, k = u / c8;
        dslot[i] = u < WG_TW * c8 ? (k * d.cout + (u - k * c8) * 8) << 6 | k : -1;
    }
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                acc[i][j][r] = 0.0f;
    T zero;
    ptl_st(&zero, 0.0f);
    for (int t = blockIdx.x * WG_WARPS + warp; t < g.tiles; t += g.warps) {
        const int row = t / g.tpr, ox0 = (t - row * g.tpr) * WG_TW, img = row / d.ho, oy = row - img * d.ho;
        const int np = min(WG_TW, d.wo - ox0);
        const int iy0 = oy * d.stride - d.pad, ix0 = ox0 * d.stride - d.pad;
        /* the input rows' elements under the tile, rel 0 .. span * CIN, valid in [lo, hi) (columns outside the
         * image: zero); row ky sits in xs from its head, the element's offset in an aligned 8-element block of x, so
         * that whole blocks move */
        const int lo = max(0, -ix0) * CIN, hi = max(lo, min(g.span, d.w - ix0) * CIN);
        int s0[NARROW_K];
        uint4 xv[NARROW_K][XU];
#pragma unroll
        for (int ky = 0; ky < NARROW_K; ky++) {
            const int iy = iy0 + ky;
            s0[ky] = ((img * d.h + iy) * d.w + ix0) * CIN;
#pragma unroll
            for (int i = 0; i < XU; i++) {
                const int rel0 = 8 * (lane + 32 * i) - (s0[ky] & 7);
                xv[ky][i] = make_uint4(0, 0, 0, 0);
                if (iy >= 0 && iy < d.h && lane + 32 * i < g.upr && rel0 + 8 > lo && rel0 < hi) {
                    if (x_vec)
                        xv[ky][i] = *reinterpret_cast<const uint4 *>(x + s0[ky] + rel0);
                    else
                        for (int q = 0; q < 8; q++)
                            if (rel0 + q >= lo && rel0 + q < hi)
                                reinterpret_cast<T *>(&xv[ky][i])[q] = x[s0[ky] + rel0 + q];
                }
            }
        }
        /* dy four blocks a lane at a time; the input rows are stored with the first four */
        const T *src = dy + ((int64_t)row * d.wo + ox0) * d.cout;
#pragma unroll
        for (int i0 = 0; i0 < DU; i0 += 4) {
            uint4 dv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int ds = dslot[i0 + i];
                dv[i] = make_uint4(0, 0, 0, 0);
                if (ds >= 0 && (ds & 63) < np) {
                    if (dy_vec)
                        dv[i] = *reinterpret_cast<const uint4 *>(src + (ds >> 6));
                    else
                        for (int q = 0; q < 8; q++)
                            reinterpret_cast<T *>(&dv[i])[q] = src[(ds >> 6) + q];
                }
            }
            if (i0 == 0) {
                __syncwarp(); /* the last tile's reads are done */
#pragma unroll
                for (int ky = 0; ky < NARROW_K; ky++)
#pragma unroll
                    for (int i = 0; i < XU; i++) {
                        const int rel0 = 8 * (lane + 32 * i) - (s0[ky] & 7);
                        if (lane + 32 * i < g.upr) {
                            if (rel0 < lo || rel0 + 8 > hi) /* a block across the image's edge */
#pragma unroll
                                for (int q = 0; q < 8; q++)
                                    if (rel0 + q < lo || rel0 + q >= hi)
                                        reinterpret_cast<T *>(&xv[ky][i])[q] = zero;
                            *reinterpret_cast<uint4 *>(xs + ky * g.xrow + 8 * (lane + 32 * i)) = xv[ky][i];
                        }
                    }
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int ds = dslot[i0 + i];
                if (ds >= 0)
                    *reinterpret_cast<uint4 *>(dys + (ds >> 6) + (ds & 63) * (g.pitch - d.cout)) = dv[i];
            }
        }
        const int h0 = s0[0] & 7, h1 = s0[1] & 7, h2 = s0[2] & 7;
        int toff[NT];
#pragma unroll
        for (int j = 0; j < NT; j++)
            toff[j] = off[j] + (tky[j] == 0 ? h0 : tky[j] == 1 ? h1 : h2);
        __syncwarp();
        for (int k0 = 0; k0 < np; k0 += 16) {
            uint32_t a[MT][4];
            const int q = lane / 8;
#pragma unroll
            for (int i = 0; i < MT; i++)
                ldmatrix_x4_trans(a[i], dys + (k0 + (q >> 1) * 8 + (lane & 7)) * g.pitch + i * 16 + (q & 1) * 8);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                uint32_t b[2] = {0, 0};
                if (tky[j] >= 0) {
                    const T *xr = xs + toff[j] + (k0 + 2 * tq) * sc;
                    b[0] = pack2(xr[0], xr[sc]);
                    b[1] = pack2(xr[8 * sc], xr[9 * sc]);
                }
#pragma unroll
                for (int i = 0; i < MT; i++)
                    mma_16816<T>(acc[i][j], a[i], b);
            }
        }
    }
    /* the block's sums, warp after warp, then its partial row */
    float *sums = reinterpret_cast<float *>(narrow_wg_smem_raw);
    const int nout = d.cout * TAPS;
    for (int w = 0; w < WG_WARPS; w++) {
        __syncthreads();
        if (warp == w)
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        const int m = i * 16 + gq + (r >= 2 ? 8 : 0), n = j * 8 + 2 * tq + (r & 1);
                        if (m < d.cout && n < TAPS)
                            sums[m * TAPS + n] = (w ? sums[m * TAPS + n] : 0.0f) + acc[i][j][r];
                    }
    }
    __syncthreads();
    for (int o = threadIdx.x; o < nout; o += blockDim.x)
        part[(int64_t)blockIdx.x * nout + o] = sums[o];
}

/* dw[o] += the blocks' partial sums of output o, in double: thread row y of an output adds blocks y, y +
 * WG_FINISH_ROWS, ... in order (WG_FINISH_LOADS loaded at a time), then the rows meet in a fixed tree. */
template <typename T>
__global__ void narrow_wgrad_finish(int nout, int blocks, const float *part, T *dw)
{
    ptl_wait_prior();
    __shared__ double red[WG_FINISH_ROWS][32];
    const int o = blockIdx.x * 32 + threadIdx.x;
    double s = 0.0;
    if (o < nout)
        for (int b0 = threadIdx.y; b0 < blocks; b0 += WG_FINISH_ROWS * WG_FINISH_LOADS) {
            float v[WG_FINISH_LOADS];
#pragma unroll
            for (int i = 0; i < WG_FINISH_LOADS; i++) {
                const int b = b0 + i * WG_FINISH_ROWS;
                v[i] = b < blocks ? part[(int64_t)b * nout + o] : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < WG_FINISH_LOADS; i++)
                if (b0 + i * WG_FINISH_ROWS < blocks)
                    s += (double)v[i];
        }
    red[threadIdx.y][threadIdx.x] = s;
    for (int h = WG_FINISH_ROWS / 2; h > 0; h /= 2) {
        __syncthreads();
        if ((int)threadIdx.y < h)
            red[threadIdx.y][threadIdx.x] += red[threadIdx.y + h][threadIdx.x];
    }
    if (threadIdx.y == 0 && o < nout)
        ptl_st(dw + o, (float)((double)ptl_ld(dw + o) + red[0][threadIdx.x]));
}

/* Runs the body with NAME a compile-time constant equal to value, 1 .. 4 (PTL_NARROW_MAX_CIN input channels; as
 * many 16-channel tiles of PTL_NARROW_MAX_COUT output channels). */
#define NARROW_DISPATCH4(NAME, value, ...)                                                                        \
    do {                                                                                                          \
        switch (value) {                                                                                          \
        case 1: {                                                                                                 \
            constexpr int NAME = 1;                                                                               \
            __VA_ARGS__;                                                                                          \
        } break;                                                                                                  \
        case 2: {                                                                                                 \
            constexpr int NAME = 2;                                                                               \
            __VA_ARGS__;                                                                                          \
        } break;                                                                                                  \
        case 3: {                                                                                                 \
            constexpr int NAME = 3;                                                                               \
            __VA_ARGS__;                                                                                          \
        } break;                                                                                                  \
        default: {                                                                                                \
            constexpr int NAME = 4;                                                                               \
            __VA_ARGS__;                                                                                          \
        } break;                                                                                                  \
        }                                                                                                         \
    } while (0)
#define NARROW_CIN_DISPATCH(d, ...) NARROW_DISPATCH4(CIN, (d)->cin, __VA_ARGS__)

extern "C" int ptl_conv2d_narrow_takes(const ptl_conv2d_desc *d)
{
    return d->k == NARROW_K && d->groups == 1 && d->cin >= 1 && d->cin <= PTL_NARROW_MAX_CIN &&
           d->cout <= PTL_NARROW_MAX_COUT && d->cout % 8 == 0;
}

extern "C" int ptl_conv2d_narrow_wgrad_takes(const ptl_conv2d_desc *d, ptl_dtype dt)
{
    return ptl_conv2d_narrow_takes(d) && (dt == PTL_BFLOAT16 || dt == PTL_FLOAT16) && d->stride <= 2 &&
           ptl_conv2d_int32_ok(d);
}

extern "C" size_t ptl_conv2d_narrow_wgrad_workspace(const ptl_conv2d_desc *d)
{
    return (size_t)narrow_wg_geometry(d).blocks * d->cout * 9 * d->cin * sizeof(float);
}

/* Output pixels a forward thread computes. */
#define NARROW_R 4

extern "C" int ptl_conv2d_narrow_forward(cudaStream_t stream, const char *fn, ptl_dtype dt, const ptl_conv2d_desc *d,
                                         const void *x, const void *w, void *y)
{
    const int64_t pixels = (int64_t)d->n * d->ho * d->wo;
    const int i32 = ptl_conv2d_int32_ok(d);
    PTL_LAYER_DISPATCH(fn, dt, NARROW_CIN_DISPATCH(d, {
        constexpr int V = 16 / sizeof(T); /* divides cout (ptl_conv2d_narrow_takes) */
        const int64_t n = (pixels + NARROW_R - 1) / NARROW_R * (d->cout / V);
        const T *xt = (const T *)x, *wt = (const T *)w;
        T *yt = (T *)y;
        if (i32 && ptl_aligned16(y, y, y))
            ptl_launch(narrow_forward_kernel<T, int, CIN, V, NARROW_R, true>, ptl_grid_for(n, 256), 256, 0, stream,
                       (int)n, (int)pixels, *d, xt, wt, yt);
        else if (i32)
            ptl_launch(narrow_forward_kernel<T, int, CIN, V, NARROW_R, false>, ptl_grid_for(n, 256), 256, 0, stream,
                       (int)n, (int)pixels, *d, xt, wt, yt);
        else
            ptl_launch(narrow_forward_kernel<T, int64_t, CIN, V, NARROW_R, false>, ptl_grid_for(n, 256), 256, 0,
                       stream, n, pixels, *d, xt, wt, yt);
    }));
    PTL_LAUNCH_CHECK("narrow_forward_kernel");
    return 0;
fail:
    return -1;
}

template <typename T, int CIN, int MT>
static int narrow_wgrad_launch(cudaStream_t stream, const ptl_conv2d_desc *d, const narrow_wg_geom &g, const T *x,
                               const T *dy, float *part)
{
    const size_t smem = narrow_wg_smem(d, &g, sizeof(T));
    /* x's 16-byte blocks in one load each where none can pass its end */
    const int x_vec = ptl_aligned16(x, NULL, NULL) && (int64_t)d->n * d->h * d->w * d->cin % 8 == 0;
    if (smem > 48 * 1024)
        PTL_CUDA_TRY(cudaFuncSetAttribute(narrow_wgrad_kernel<T, CIN, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)smem));
    ptl_launch(narrow_wgrad_kernel<T, CIN, MT>, g.blocks, WG_WARPS * 32, smem, stream, *d, g, x, dy, part, x_vec,
               ptl_aligned16(dy, NULL, NULL));
    PTL_LAUNCH_CHECK("narrow_wgrad_kernel");
    return 0;
fail:
    return -1;
}

/* The partial sums for d's CIN and 16-channel tiles of cout, then the finish. */
template <typename T>
static int narrow_wgrad_run(cudaStream_t stream, const ptl_conv2d_desc *d, const T *x, const T *dy, T *dw, float *part)
{
    const narrow_wg_geom g = narrow_wg_geometry(d);
    const int nout = d->cout * 9 * d->cin;
    NARROW_CIN_DISPATCH(d, NARROW_DISPATCH4(MT, (d->cout + 15) / 16,
                                            PTL_CHECK((narrow_wgrad_launch<T, CIN, MT>(stream, d, g, x, dy, part)))));
    ptl_launch(narrow_wgrad_finish<T>, (nout + 31) / 32, dim3(32, WG_FINISH_ROWS), 0, stream, nout, g.blocks,
               (const float *)part, dw);
    PTL_LAUNCH_CHECK("narrow_wgrad_finish");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_conv2d_narrow_backward_weight(cudaStream_t stream, const char *fn, ptl_dtype dt,
                                                 const ptl_conv2d_desc *d, const void *x, const void *dy, void *dw,
                                                 void *workspace, size_t workspace_bytes)
{
    if (!ptl_conv2d_narrow_wgrad_takes(d, dt))
        return ptl_set_error(PTL_ERR_VALUE, "%s: the direct weight gradient does not take this convolution", fn);
    if (workspace_bytes < ptl_conv2d_narrow_wgrad_workspace(d) || !workspace)
        return ptl_set_error(PTL_ERR_VALUE, "%s: the direct weight gradient needs a workspace of %zu bytes, got %zu",
                             fn, ptl_conv2d_narrow_wgrad_workspace(d), workspace ? workspace_bytes : (size_t)0);
    float *part = (float *)workspace;
    if (dt == PTL_BFLOAT16)
        return narrow_wgrad_run(stream, d, (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)dy, (__nv_bfloat16 *)dw,
                                part);
    return narrow_wgrad_run(stream, d, (const __half *)x, (const __half *)dy, (__half *)dw, part);
}
