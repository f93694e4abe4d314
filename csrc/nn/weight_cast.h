/* The executor's own copies (executor.h): the per-forward cast of every conv weight (master OIHW ->
 * compute-dtype OHWI), its reverse for the weight gradients (added into the master gradient), and the
 * copies between a level's map and the (B, A, C) head outputs. CPU reference here (weight_cast.c),
 * CUDA in ../cuda/weight_cast.cu; the index arithmetic below (PTL_HD) is shared by both.
 *
 * The weight-cast table has one record per conv weight (or cast bias): src offset in the flat OIHW
 * master parameters, dst offset in the compute-dtype OHWI copy, and (cout, cin_g, k); a bias is
 * (n, 1, 1). Records are sorted by dst, starting at 0; elements between one record's end and the next
 * start (alignment padding) are never written. */
#ifndef PTL_NN_WEIGHT_CAST_H
#define PTL_NN_WEIGHT_CAST_H

#include <stdint.h>

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t src, dst;
    int cout, cin_g, k, pad_;
} ptl_wcast_entry;

/* The CUDA weight kernels' work items: one block takes one tile, `rows` output channels of one record from
 * its channel co0 and in each the input channels [c0, c0 + nc) of its cin_g, every one of its kk = k * k taps;
 * src and dst are the master and copy offsets of the tile's element (co0, c0, tap 0). A record whose two
 * layouts agree (1x1, depthwise, biases) is cut into tiles of nc consecutive elements with kk = 1 and rows = 1.
 * Any other tile is staged through shared memory, so that the block reads and writes both layouts in their
 * own order, consecutively across a warp. */
typedef struct {
    int64_t src, dst;
    int rows, nc, cin_g, kk;
} ptl_wcast_tile;

/* At most this many elements a tile, and floats of staging (a staged row holds nc + 1 floats a tap, which keeps
 * a warp's taps off one shared-memory bank). */
#define PTL_WCAST_TILE 4096
#define PTL_WCAST_STAGE 4608

/* The table as a backend reads it, in the backend's memory: the records (the CPU walks them) and their tiles
 * (the CUDA kernels'); the copy's elements, padding included. */
typedef struct {
    const ptl_wcast_entry *tab;
    const ptl_wcast_tile *tiles;
    int n, ntiles;
    int64_t total;
} ptl_wcast_table;

PTL_HD int ptl_wcast_tile_size(const ptl_wcast_tile *t) { return t->rows * t->nc * t->kk; }

/* Element (r, c, tap) of a tile (its r-th output channel, c-th input channel): offsets in the master and in
 * the copy, and its staging slot. */
PTL_HD int64_t ptl_wcast_tile_src(const ptl_wcast_tile *t, int r, int c, int tap)
{
    return t->src + ((int64_t)r * t->cin_g + c) * t->kk + tap;
}

PTL_HD int64_t ptl_wcast_tile_dst(const ptl_wcast_tile *t, int r, int c, int tap)
{
    return t->dst + ((int64_t)r * t->kk + tap) * t->cin_g + c;
}

PTL_HD int ptl_wcast_tile_slot(const ptl_wcast_tile *t, int r, int c, int tap)
{
    return (r * t->kk + tap) * (t->nc + 1) + c;
}

/* An element's coordinates in a tile. */
typedef struct {
    int r, c, tap;
} ptl_wcast_pos;

/* The tile's i-th element in the master's order (r, c, tap) or (copy) in the copy's (r, tap, c). */
PTL_HD ptl_wcast_pos ptl_wcast_tile_at(const ptl_wcast_tile *t, int i, int copy)
{
    ptl_wcast_pos p;
    const int per = t->nc * t->kk, j = i - (p.r = i / per) * per;
    if (copy)
        p.c = j - (p.tap = j / t->nc) * t->nc;
    else
        p.tap = j - (p.c = j / t->kk) * t->kk;
    return p;
}

/* The CUDA kernels' threads a block: thread x takes a tile's elements x, x + PTL_WCAST_THREADS, ... */
#define PTL_WCAST_THREADS 256

/* p's element advanced by the element count whose coordinates are s (ptl_wcast_tile_at), in the same order:
 * digits added with carries, so that a thread walks its elements without the divisions (three 32-bit
 * divisions an element made the kernels bound by their instructions). */
PTL_HD void ptl_wcast_pos_add(const ptl_wcast_tile *t, int copy, ptl_wcast_pos *p, const ptl_wcast_pos *s)
{
    if (copy) {
        const int k1 = (p->c += s->c) >= t->nc;
        p->c -= k1 ? t->nc : 0;
        const int k2 = (p->tap += s->tap + k1) >= t->kk;
        p->tap -= k2 ? t->kk : 0;
        p->r += s->r + k2;
    } else {
        const int k1 = (p->tap += s->tap) >= t->kk;
        p->tap -= k1 ? t->kk : 0;
        const int k2 = (p->c += s->c + k1) >= t->nc;
        p->c -= k2 ? t->nc : 0;
        p->r += s->r + k2;
    }
}

/* Index in the (B, A, C) head output of element i of a level's (B, hw, C) map at anchor offset a0; the
 * 32-bit version for the CUDA kernels where the map and the output have fewer than 2^32 elements (its two
 * divisions per element are several times cheaper). */
#define PTL_NET_HEAD_INDEX(name, I)                                                                            \
    PTL_HD I name(I i, I hw, int C, I A, I a0)                                                                 \
    {                                                                                                          \
        const I row = i / (I)C, b = row / hw;                                                                  \
        return (b * A + a0 + (row - b * hw)) * (I)C + (i - row * (I)C);                                        \
    }
PTL_NET_HEAD_INDEX(ptl_net_head_index, int64_t)
PTL_NET_HEAD_INDEX(ptl_net_head_index32, uint32_t)

/* Whether the 32-bit version serves a copy: the map's and the output's elements, plus `slack` (a CUDA grid's
 * stride), below 2^32. The CPU copies choose the same way, so they run the index arithmetic CUDA runs. */
PTL_HD int ptl_net_head_fits32(int B, int64_t hw, int C, int64_t A, int64_t slack)
{
    return (int64_t)B * hw * C + slack <= (int64_t)UINT32_MAX && (int64_t)B * A * C + slack <= (int64_t)UINT32_MAX;
}

/* wc[OHWI] = params[OIHW] for every record (CPU: float32 or float64 in and out). */
int ptl_net_weight_cast(ptl_dtype dt, const ptl_wcast_entry *tab, int n, const void *params, void *wc);
/* grads[OIHW] += wgc[OHWI] for every record, and wgc's elements then set to zero (the executor's next backward
 * adds into them without zeroing first). */
int ptl_net_weight_grad(ptl_dtype dt, const ptl_wcast_entry *tab, int n, void *wgc, void *grads);
/* Cuts the n records into tiles: writes them to `tiles` (NULL: only counts) and returns their number, or -1
 * (a kernel too large for a tile's staging). */
int ptl_net_wcast_tiles(const ptl_wcast_entry *tab, int n, ptl_wcast_tile *tiles);
/* Checks that the records lie back to back over a copy of `total` elements and that the tiles (in either
 * order) map every element of each record's copy to its master element as the per-record walk does, exactly
 * once, each within its staging; -1 naming the first mismatch (tests). */
int ptl_net_wcast_check(const ptl_wcast_entry *tab, int n, const ptl_wcast_tile *tiles, int ntiles, int64_t total);
/* out[(b*A + a0 + i)*C + c] = map[(b*hw + i)*C + c] for a level's map (B, hw, C); the backward
 * gmap[...] (= or +=, accumulate 0 or 1) d_out[...]. */
int ptl_net_head_out(ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0, const void *map, void *out);
int ptl_net_head_grad(ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0, const void *d_out, void *gmap,
                      int accumulate);

#ifdef PTL_WITH_CUDA
struct ptl_cuda_ctx;
/* The same on the device: compute dtype dt (float32, bfloat16, float16) for wc, wgc and the maps;
 * float32 for params, grads, the head outputs and d_out. The weight kernels take the table's tiles. */
int ptl_net_weight_cast_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, const ptl_wcast_table *t, const void *params,
                             void *wc);
int ptl_net_weight_grad_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, const ptl_wcast_table *t, void *wgc,
                             void *grads);
int ptl_net_head_out_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0,
                          const void *map, void *out);
int ptl_net_head_grad_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int B, int64_t hw, int C, int64_t A,
                           int64_t a0, const void *d_out, void *gmap, int accumulate);
#endif

#ifdef __cplusplus
}
#endif

#endif
