/* Direct kernels for 3x3 ungrouped convolutions with few input channels (conv2d_narrow.h). Weights are OHWI:
 * w[co * TAPS + (ky * 3 + kx) * CIN + ci], TAPS = 9 * CIN. */
#include "conv2d_narrow.h"
#include "layers_common.cuh"
#include "mma.cuh"

#define NARROW_K 3

/* The forward in float32, and wherever the tensor-core forward does not take: one thread per (R consecutive output
 * pixels, V output channels): per tap and input channel it loads R inputs and V weights and does R * V products, so
 * that loads do not bound it. The weights wait in shared memory as floats, tap-major ([tap][co]), read 16 bytes at a
 * time. An input outside the image adds 0 * w. PACK: y's rows take V-element stores (16-byte aligned), else element
 * by element. */
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

/* ---------------------------------------------------------------------------- tensor-core tiles (bf16, fp16)
 *
 * The kernels below take tiles of NARROW_TW output pixels of one output row, a warp a tile at a time. A warp stages
 * the three input rows under its tile in shared memory (xs) as the aligned 8-element blocks of x that cover them:
 * one 16-byte load and one store each, all of a lane's loads in flight before its stores (an element-by-element
 * staging was bounded by its index arithmetic: 34 against 18 us for the n stem's weight gradient). Row ky starts in
 * xs at its head, the offset of its first element in its block; columns outside the image are zero. */

#define NARROW_TW 64   /* output pixels a tile (4 k-steps of 16) */
#define NARROW_WARPS 4 /* warps a block */

struct narrow_geom {
    int tpr;     /* tiles an output row */
    int tiles;   /* n * ho * tpr */
    int warps;   /* a multiple of NARROW_WARPS */
    int blocks;  /* warps / NARROW_WARPS */
    int span;    /* input columns under a tile */
    int upr;     /* 8-element blocks of x that cover a row of the tile's input, however it falls */
    int xrow;    /* upr * 8: an input row's pitch in xs */
    int pitch;   /* the weight gradient's dy tile row pitch in elements */
    int xs, dys; /* per warp: input rows and dy tile, in elements (multiples of 8: 16-byte aligned) */
};

/* max_warps: the most warps to launch (each takes the tiles w, w + warps, ...). */
static narrow_geom narrow_geometry(const ptl_conv2d_desc *d, int max_warps)
{
    narrow_geom g;
    g.tpr = (d->wo + NARROW_TW - 1) / NARROW_TW;
    g.tiles = d->n * d->ho * g.tpr; /* at most the output's elements: int (narrow_mma_takes) */
    const int w = g.tiles < max_warps ? g.tiles : max_warps;
    g.warps = (w + NARROW_WARPS - 1) / NARROW_WARPS * NARROW_WARPS;
    g.blocks = g.warps / NARROW_WARPS;
    g.span = (NARROW_TW - 1) * d->stride + NARROW_K;
    g.upr = (g.span * d->cin + 14) / 8;
    /* rows an odd number of 16-byte units apart: ldmatrix's eight rows fall in distinct banks */
    g.pitch = d->cout + 8;
    if (g.pitch / 8 % 2 == 0)
        g.pitch += 8;
    g.xrow = g.upr * 8;
    g.xs = NARROW_K * g.xrow;
    g.dys = NARROW_TW * g.pitch;
    return g;
}

/* Whether x's 16-byte blocks can be loaded whole: aligned, and none passes its end. */
static int narrow_x_vec(const ptl_conv2d_desc *d, const void *x)
{
    return ptl_aligned16(x, NULL, NULL) && (int64_t)d->n * d->h * d->w * d->cin % 8 == 0;
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi)
{
    return (uint32_t)*reinterpret_cast<const uint16_t *>(&lo) | (uint32_t)*reinterpret_cast<const uint16_t *>(&hi)
                                                                    << 16;
}

/* Tile t: its output row (n * ho + oy) and first pixel, its pixels, and the input position under that pixel. */
struct narrow_tile {
    int row, ox0, np, img, iy0, ix0;
};

__device__ __forceinline__ narrow_tile narrow_tile_at(const ptl_conv2d_desc &d, const narrow_geom &g, int t)
{
    narrow_tile u;
    u.row = t / g.tpr;
    u.ox0 = (t - u.row * g.tpr) * NARROW_TW;
    u.np = min(NARROW_TW, d.wo - u.ox0);
    u.img = u.row / d.ho;
    u.iy0 = (u.row - u.img * d.ho) * d.stride - d.pad;
    u.ix0 = u.ox0 * d.stride - d.pad;
    return u;
}

/* Tap k (OHWI order, (ky * 3 + kx) * CIN + ci): its element in its input row of xs (before the row's head) and
 * that row, -1 past the taps. */
template <int CIN>
__device__ __forceinline__ void narrow_tap(int k, int xrow, int *off, int *ky)
{
    const int r = k / (NARROW_K * CIN);
    *off = r * xrow + k - r * NARROW_K * CIN;
    *ky = k < NARROW_K * NARROW_K * CIN ? r : -1;
}

/* The input rows under a tile: loaded into registers, then stored into a warp's xs. */
template <typename T, int CIN>
struct narrow_rows {
    /* a lane's blocks a row: upr <= 32 * XU at stride <= 2 */
    static constexpr int XU = (((NARROW_TW - 1) * 2 + NARROW_K) * CIN + 14) / 8 / 32 + 1;
    int s0[NARROW_K]; /* row ky's first element in x (rel 0) */
    int lo, hi;       /* a row's elements rel 0 .. span * CIN inside the image: [lo, hi) */
    uint4 v[NARROW_K][XU];

    __device__ __forceinline__ void load(const ptl_conv2d_desc &d, const narrow_geom &g, const T *x, int x_vec,
                                         const narrow_tile &u, int lane)
    {
        lo = max(0, -u.ix0) * CIN;
        hi = max(lo, min(g.span, d.w - u.ix0) * CIN);
#pragma unroll
        for (int ky = 0; ky < NARROW_K; ky++) {
            const int iy = u.iy0 + ky;
            s0[ky] = ((u.img * d.h + iy) * d.w + u.ix0) * CIN;
#pragma unroll
            for (int i = 0; i < XU; i++) {
                const int rel0 = 8 * (lane + 32 * i) - head(ky);
                v[ky][i] = make_uint4(0, 0, 0, 0);
                if (iy >= 0 && iy < d.h && lane + 32 * i < g.upr && rel0 + 8 > lo && rel0 < hi) {
                    if (x_vec)
                        v[ky][i] = *reinterpret_cast<const uint4 *>(x + s0[ky] + rel0);
                    else
                        for (int q = 0; q < 8; q++)
                            if (rel0 + q >= lo && rel0 + q < hi)
                                reinterpret_cast<T *>(&v[ky][i])[q] = x[s0[ky] + rel0 + q];
                }
            }
        }
    }

    /* After the warp's last reads of xs. */
    __device__ __forceinline__ void store(T *xs, const narrow_geom &g, int lane)
    {
        T zero;
        ptl_st(&zero, 0.0f);
#pragma unroll
        for (int ky = 0; ky < NARROW_K; ky++)
#pragma unroll
            for (int i = 0; i < XU; i++) {
                const int rel0 = 8 * (lane + 32 * i) - head(ky);
                if (lane + 32 * i < g.upr) {
                    if (rel0 < lo || rel0 + 8 > hi) /* a block across the image's edge */
#pragma unroll
                        for (int q = 0; q < 8; q++)
                            if (rel0 + q < lo || rel0 + q >= hi)
                                reinterpret_cast<T *>(&v[ky][i])[q] = zero;
                    *reinterpret_cast<uint4 *>(xs + ky * g.xrow + 8 * (lane + 32 * i)) = v[ky][i];
                }
            }
    }

    __device__ __forceinline__ int head(int ky) const { return s0[ky] & 7; }
    /* the head of row ky, ky < 0 (no row) giving 0 */
    __device__ __forceinline__ int head_of(int ky) const { return ky == 1 ? head(1) : ky == 2 ? head(2) : head(0); }
};

/* ------------------------------------------------------------------------------------- forward on tensor cores
 *
 * A tile's y (pixels x cout) = xcol (pixels x TAPS) w^T, 16 pixels at a time on mma.sync m16n8k16 (float32 sums), K =
 * TAPS in KT steps of 16 (zero past TAPS). w's fragments stay in registers; xcol's come from xs at each lane's tap
 * offsets. One lane adds each output's products, in the mma's fixed order: bitwise reproducible. MT: 16-channel tiles
 * of cout (its 8-channel halves past cout skipped). */
template <typename T, int CIN, int MT>
__global__ void __launch_bounds__(NARROW_WARPS * 32)
    narrow_forward_mma_kernel(ptl_conv2d_desc d, narrow_geom g, const T *x, const T *w, T *y, int x_vec)
{
    ptl_wait_prior();
    constexpr int TAPS = NARROW_K * NARROW_K * CIN, KT = (TAPS + 15) / 16, NTL = 2 * MT;
    extern __shared__ __align__(16) unsigned char narrow_fwd_smem_raw[];
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    T *xs = reinterpret_cast<T *>(narrow_fwd_smem_raw) + warp * g.xs;
    const int sc = d.stride * CIN; /* one pixel along a tap's input row */
    T zero;
    ptl_st(&zero, 0.0f);
    /* this lane's taps kt * 16 + 2 tq + {0, 1, 8, 9} (A's columns): the element in its row, the row (-1 past TAPS);
     * its weights (B's fragments): output channel nt * 8 + gq at taps kt * 16 + 2 tq + {0, 1} and {8, 9} */
    int off[KT][4], tky[KT][4];
    uint32_t b[NTL][KT][2];
#pragma unroll
    for (int kt = 0; kt < KT; kt++) {
#pragma unroll
        for (int e = 0; e < 4; e++)
            narrow_tap<CIN>(kt * 16 + 2 * tq + (e & 1) + (e >> 1) * 8, g.xrow, &off[kt][e], &tky[kt][e]);
#pragma unroll
        for (int nt = 0; nt < NTL; nt++) {
            const int co = nt * 8 + gq;
            T wv[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int k = kt * 16 + 2 * tq + (e & 1) + (e >> 1) * 8;
                wv[e] = co < d.cout && k < TAPS ? w[co * TAPS + k] : zero;
            }
            b[nt][kt][0] = pack2(wv[0], wv[1]);
            b[nt][kt][1] = pack2(wv[2], wv[3]);
        }
    }
    for (int t = blockIdx.x * NARROW_WARPS + warp; t < g.tiles; t += g.warps) {
        const narrow_tile u = narrow_tile_at(d, g, t);
        const int np = u.np;
        narrow_rows<T, CIN> rows;
        rows.load(d, g, x, x_vec, u, lane);
        __syncwarp(); /* the last tile's reads are done */
        rows.store(xs, g, lane);
        int toff[KT][4];
#pragma unroll
        for (int kt = 0; kt < KT; kt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                toff[kt][e] = tky[kt][e] < 0 ? -1 : off[kt][e] + rows.head_of(tky[kt][e]);
        __syncwarp();
        T *yt = y + ((int64_t)u.row * d.wo + u.ox0) * d.cout;
        for (int m0 = 0; m0 < np; m0 += 16) {
            const int p0 = (m0 + gq) * sc, p1 = p0 + 8 * sc; /* pixels m0 + gq and m0 + gq + 8 */
            uint32_t a[KT][4];
#pragma unroll
            for (int kt = 0; kt < KT; kt++) {
                T v[4][2];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    v[e][0] = toff[kt][e] >= 0 ? xs[toff[kt][e] + p0] : zero;
                    v[e][1] = toff[kt][e] >= 0 ? xs[toff[kt][e] + p1] : zero;
                }
                a[kt][0] = pack2(v[0][0], v[1][0]);
                a[kt][1] = pack2(v[0][1], v[1][1]);
                a[kt][2] = pack2(v[2][0], v[3][0]);
                a[kt][3] = pack2(v[2][1], v[3][1]);
            }
#pragma unroll
            for (int nt = 0; nt < NTL; nt++) {
                if (nt * 8 >= d.cout)
                    break;
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int kt = 0; kt < KT; kt++)
                    mma_16816<T>(c, a[kt], b[nt][kt]);
                T o[4];
#pragma unroll
                for (int e = 0; e < 4; e++)
                    ptl_st(&o[e], c[e]);
                if (m0 + gq < np)
                    *reinterpret_cast<uint32_t *>(yt + (m0 + gq) * d.cout + nt * 8 + 2 * tq) = pack2(o[0], o[1]);
                if (m0 + gq + 8 < np)
                    *reinterpret_cast<uint32_t *>(yt + (m0 + gq + 8) * d.cout + nt * 8 + 2 * tq) = pack2(o[2], o[3]);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------ weight gradient
 *
 * dw[co][tap] += sum over the output pixels p of dy[p][co] * xcol[p][tap]: a GEMM of M = cout, N = TAPS, K = the
 * pixels, on tensor cores (mma.sync m16n8k16, float32 accumulation). A warp's tile: the input rows in xs, the tile's
 * dy rows (pixel-major, as stored) beside them in 16-byte blocks; A's fragments (dy transposed) come from
 * ldmatrix.trans, B's (the taps) from the input rows, each lane's taps fixed at an offset. The warps of a block add
 * their sums in warp order in shared memory, each block writes its partial sums, and the finish adds the blocks' in
 * order (double) into dw. Warp w takes the tiles w, w + warps, ...; the warp count depends on the shape alone, so the
 * bits do too. */

#define WG_MAX_WARPS 4096 /* fixed, never the device's SM count: the same bits on every GPU */
#define WG_FINISH_LOADS 8 /* partial sums a finish thread has in flight */
#define WG_FINISH_ROWS 32

static size_t narrow_wg_smem(const ptl_conv2d_desc *d, const narrow_geom *g, size_t esz)
{
    const size_t tiles = (size_t)NARROW_WARPS * (g->xs + g->dys) * esz;
    const size_t sums = (size_t)d->cout * 9 * d->cin * sizeof(float);
    return tiles > sums ? tiles : sums;
}

/* MT: 16-channel tiles of cout; the taps in NT 8-wide tiles. part: (blocks, cout * TAPS) float32. The registers are
 * capped for NARROW_WG_MIN_BLOCKS blocks an SM: no spills (-Xptxas -v) but at 3 input channels and 64 outputs,
 * where 3 blocks and 80 bytes of spills beat 2 blocks (the m stem's weight gradient on an H100: 68 against 79 us,
 * benchmarks/layers_cuda.py). */
#define NARROW_WG_MIN_BLOCKS ((MT == 1 ? 5 : MT == 2 ? 4 : 3) - (CIN == 4))
template <typename T, int CIN, int MT>
__global__ void __launch_bounds__(NARROW_WARPS * 32, NARROW_WG_MIN_BLOCKS)
    narrow_wgrad_kernel(ptl_conv2d_desc d, narrow_geom g, const T *x, const T *dy, float *part, int x_vec,
                        int dy_vec)
{
    ptl_wait_prior();
    constexpr int TAPS = NARROW_K * NARROW_K * CIN, NT = (TAPS + 7) / 8;
    constexpr int DU = 4 * MT; /* a lane's 8-element blocks of the dy tile: 64 * cout / 8 <= 32 * DU */
    extern __shared__ __align__(16) unsigned char narrow_wg_smem_raw[];
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    T *xs = reinterpret_cast<T *>(narrow_wg_smem_raw) + warp * (g.xs + g.dys);
    T *dys = xs + g.xs;
    const int sc = d.stride * CIN; /* one pixel along a tap's input row */
    int off[NT], tky[NT];          /* this lane's tap of each N tile: its element in its row, the row (-1 past TAPS) */
#pragma unroll
    for (int j = 0; j < NT; j++)
        narrow_tap<CIN>(j * 8 + gq, g.xrow, &off[j], &tky[j]);
    /* this lane's dy blocks: (k * cout + c) << 6 | k for pixel k, channels c .. c + 7; -1 past the tile */
    int dslot[DU];
    const int c8 = d.cout / 8;
#pragma unroll
    for (int i = 0; i < DU; i++) {
        const int u = lane + 32 * i, k = u / c8;
        dslot[i] = u < NARROW_TW * c8 ? (k * d.cout + (u - k * c8) * 8) << 6 | k : -1;
    }
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                acc[i][j][r] = 0.0f;
    for (int t = blockIdx.x * NARROW_WARPS + warp; t < g.tiles; t += g.warps) {
        const narrow_tile u = narrow_tile_at(d, g, t);
        const int np = u.np;
        narrow_rows<T, CIN> rows;
        rows.load(d, g, x, x_vec, u, lane);
        /* dy four blocks a lane at a time; the input rows are stored with the first four */
        const T *src = dy + ((int64_t)u.row * d.wo + u.ox0) * d.cout;
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
                rows.store(xs, g, lane);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int ds = dslot[i0 + i];
                if (ds >= 0)
                    *reinterpret_cast<uint4 *>(dys + (ds >> 6) + (ds & 63) * (g.pitch - d.cout)) = dv[i];
            }
        }
        int toff[NT];
#pragma unroll
        for (int j = 0; j < NT; j++)
            toff[j] = off[j] + rows.head_of(tky[j]);
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
    for (int w = 0; w < NARROW_WARPS; w++) {
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

/* Whether the tensor-core kernels take d in dtype dt (a forward here that does): their inputs, at most two input
 * pixels a tap apart (narrow_rows::XU), int indices. */
static int narrow_mma_takes(const ptl_conv2d_desc *d, ptl_dtype dt)
{
    return ptl_conv2d_narrow_takes(d) && (dt == PTL_BFLOAT16 || dt == PTL_FLOAT16) && d->stride <= 2 &&
           ptl_conv2d_int32_ok(d);
}

extern "C" int ptl_conv2d_narrow_wgrad_takes(const ptl_conv2d_desc *d, ptl_dtype dt) { return narrow_mma_takes(d, dt); }

extern "C" size_t ptl_conv2d_narrow_wgrad_workspace(const ptl_conv2d_desc *d)
{
    return (size_t)narrow_geometry(d, WG_MAX_WARPS).blocks * d->cout * 9 * d->cin * sizeof(float);
}

/* The tensor-core forward: a warp a tile. */
template <typename T>
static int narrow_forward_mma(cudaStream_t stream, const ptl_conv2d_desc *d, const T *x, const T *w, T *y)
{
    const narrow_geom g = narrow_geometry(d, INT_MAX);
    const size_t smem = (size_t)NARROW_WARPS * g.xs * sizeof(T); /* under 48 KB: 4 * 3 * 528 elements at most */
    const int x_vec = narrow_x_vec(d, x);
    NARROW_CIN_DISPATCH(d, NARROW_DISPATCH4(MT, (d->cout + 15) / 16,
                                            ptl_launch(narrow_forward_mma_kernel<T, CIN, MT>, g.blocks,
                                                       NARROW_WARPS * 32, smem, stream, *d, g, x, w, y, x_vec)));
    PTL_LAUNCH_CHECK("narrow_forward_mma_kernel");
    return 0;
fail:
    return -1;
}

/* Output pixels a forward thread computes. */
#define NARROW_R 4

extern "C" int ptl_conv2d_narrow_forward(cudaStream_t stream, const char *fn, ptl_dtype dt, const ptl_conv2d_desc *d,
                                         const void *x, const void *w, void *y)
{
    /* y's channel pairs stored as 32-bit words */
    if (narrow_mma_takes(d, dt) && ptl_aligned16(y, NULL, NULL)) {
        if (dt == PTL_BFLOAT16)
            return narrow_forward_mma(stream, d, (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w,
                                      (__nv_bfloat16 *)y);
        return narrow_forward_mma(stream, d, (const __half *)x, (const __half *)w, (__half *)y);
    }
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
static int narrow_wgrad_launch(cudaStream_t stream, const ptl_conv2d_desc *d, const narrow_geom &g, const T *x,
                               const T *dy, float *part)
{
    const size_t smem = narrow_wg_smem(d, &g, sizeof(T));
    const int x_vec = narrow_x_vec(d, x);
    if (smem > 48 * 1024)
        PTL_CUDA_TRY(cudaFuncSetAttribute(narrow_wgrad_kernel<T, CIN, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)smem));
    ptl_launch(narrow_wgrad_kernel<T, CIN, MT>, g.blocks, NARROW_WARPS * 32, smem, stream, *d, g, x, dy, part, x_vec,
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
    const narrow_geom g = narrow_geometry(d, WG_MAX_WARPS);
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
