/* CPU reference of the executor's weight casts and head copies (weight_cast.h). The head copies walk
 * their output element by element with the CUDA kernels' index arithmetic (../cuda/weight_cast.cu);
 * the weight casts walk each record in nested loops, and ptl_net_wcast_check compares that walk with the CUDA
 * kernels' tiles (ptl_net_wcast_tiles). */
#include "weight_cast.h"

#include <stdlib.h>
#include <string.h>

#include "conv2d.h"

static int check_dt(const char *fn, ptl_dtype dt)
{
    if (dt == PTL_FLOAT32 || dt == PTL_FLOAT64)
        return 0;
    return ptl_set_error(PTL_ERR_TYPE, "%s: CPU tensors must be float32 or float64, got %s", fn, ptl_dtype_name(dt));
}

/* On the CPU the "cast" is the layout copy OIHW -> OHWI in the network dtype. */
int ptl_net_weight_cast(ptl_dtype dt, const ptl_wcast_entry *tab, int n, const void *params, void *wc)
{
    if (check_dt("net_weight_cast", dt))
        return -1;
    const size_t esz = ptl_dtype_size(dt);
    for (int i = 0; i < n; i++) {
        const ptl_wcast_entry *e = &tab[i];
        PTL_CHECK(ptl_conv2d_weight_from_oihw(dt, e->cout, e->cin_g, e->k, (const char *)params + e->src * esz,
                                              (char *)wc + e->dst * esz));
    }
    return 0;
fail:
    return -1;
}

/* Each master element receives exactly one addition, so the order over elements does not matter; each copy
 * element is cleared once read. */
#define GRAD(T)                                                                                          \
    for (int r = 0; r < n; r++) {                                                                        \
        const ptl_wcast_entry *e = &tab[r];                                                              \
        const int cig = e->cin_g, kk = e->k * e->k;                                                      \
        T *g = (T *)wgc + e->dst;                                                                        \
        T *out = (T *)grads + e->src;                                                                    \
        for (int co = 0; co < e->cout; co++)                                                             \
            for (int t = 0; t < kk; t++)                                                                 \
                for (int ci = 0; ci < cig; ci++) {                                                       \
                    T *gi = &g[((int64_t)co * kk + t) * cig + ci];                                       \
                    out[((int64_t)co * cig + ci) * kk + t] += *gi;                                       \
                    *gi = 0;                                                                             \
                }                                                                                        \
    }

int ptl_net_weight_grad(ptl_dtype dt, const ptl_wcast_entry *tab, int n, void *wgc, void *grads)
{
    if (check_dt("net_weight_grad", dt))
        return -1;
    if (dt == PTL_FLOAT32) {
        GRAD(float)
    } else {
        GRAD(double)
    }
    return 0;
}

static int min_int(int64_t a, int64_t b) { return (int)(a < b ? a : b); }

int ptl_net_wcast_tiles(const ptl_wcast_entry *tab, int n, ptl_wcast_tile *tiles)
{
    int count = 0;
    for (int i = 0; i < n; i++) {
        const ptl_wcast_entry *e = &tab[i];
        const int cig = e->cin_g, kk = e->k * e->k;
        if (kk == 1 || cig == 1) { /* the two layouts agree */
            const int64_t size = (int64_t)e->cout * cig * kk;
            for (int64_t j = 0; j < size; j += PTL_WCAST_TILE, count++)
                if (tiles) {
                    const int nc = min_int(PTL_WCAST_TILE, size - j);
                    tiles[count] = (ptl_wcast_tile){e->src + j, e->dst + j, 1, nc, nc, 1};
                }
            continue;
        }
        /* whole output channels where one fits, else one in runs of input channels */
        const int rows = min_int(PTL_WCAST_TILE / ((int64_t)cig * kk), PTL_WCAST_STAGE / ((int64_t)kk * (cig + 1)));
        const int nc = rows ? cig : min_int(PTL_WCAST_TILE / kk, PTL_WCAST_STAGE / kk - 1);
        if (nc < 1)
            return ptl_set_error(PTL_ERR_VALUE,
                                 "weight table: a %dx%d kernel has more taps than the weight kernels stage (%d)", e->k,
                                 e->k, PTL_WCAST_STAGE / 2 - 1);
        const int step = rows ? rows : 1;
        for (int co = 0; co < e->cout; co += step)
            for (int c0 = 0; c0 < cig; c0 += nc, count++)
                if (tiles)
                    tiles[count] = (ptl_wcast_tile){e->src + ((int64_t)co * cig + c0) * kk,
                                                    e->dst + (int64_t)co * kk * cig + c0,
                                                    min_int(step, e->cout - co),
                                                    min_int(nc, cig - c0),
                                                    cig,
                                                    kk};
    }
    return count;
}

/* The tiles' walks, in the master's order (copy 0) or the copy's, against want[i] (the master element of copy
 * element i, -1 in the padding); seen counts the visits. */
static int check_tiles(const ptl_wcast_tile *tiles, int ntiles, int64_t total, const int64_t *want, int copy,
                       uint8_t *seen, uint8_t *slots)
{
    const char *order = copy ? "copy" : "master";
    memset(seen, 0, (size_t)total);
    for (int t = 0; t < ntiles; t++) {
        const ptl_wcast_tile *tl = &tiles[t];
        const int size = ptl_wcast_tile_size(tl);
        if (tl->rows < 1 || tl->nc < 1 || tl->kk < 1 || size > PTL_WCAST_TILE)
            return ptl_set_error(PTL_ERR_RUNTIME, "weight table: tile %d holds %d x %d x %d elements", t, tl->rows,
                                 tl->nc, tl->kk);
        memset(slots, 0, PTL_WCAST_STAGE);
        /* each thread's walk, as the kernels take it: from its first element, a block's stride at a time */
        const ptl_wcast_pos stride = ptl_wcast_tile_at(tl, PTL_WCAST_THREADS, copy);
        for (int x = 0; x < PTL_WCAST_THREADS && x < size; x++) {
            ptl_wcast_pos p = ptl_wcast_tile_at(tl, x, copy);
            for (int i = x; i < size; i += PTL_WCAST_THREADS, ptl_wcast_pos_add(tl, copy, &p, &stride)) {
                const ptl_wcast_pos want_p = ptl_wcast_tile_at(tl, i, copy);
                if (p.r != want_p.r || p.c != want_p.c || p.tap != want_p.tap)
                    return ptl_set_error(PTL_ERR_RUNTIME,
                                         "weight table: tile %d's walk (%s order) reaches element %d at (%d, %d, %d), "
                                         "not (%d, %d, %d)",
                                         t, order, i, p.r, p.c, p.tap, want_p.r, want_p.c, want_p.tap);
                const int64_t src = ptl_wcast_tile_src(tl, p.r, p.c, p.tap);
                const int64_t dst = ptl_wcast_tile_dst(tl, p.r, p.c, p.tap);
                const int slot = ptl_wcast_tile_slot(tl, p.r, p.c, p.tap);
                /* the kernels take the master's order as consecutive: element i at src + i */
                if (dst < 0 || dst >= total || want[dst] != src || seen[dst] || (!copy && src != tl->src + i))
                    return ptl_set_error(PTL_ERR_RUNTIME,
                                         "weight table: tile %d's element %d (%s order) maps copy %lld to master %lld, "
                                         "expected master %lld once",
                                         t, i, order, (long long)dst, (long long)src,
                                         (long long)(dst >= 0 && dst < total ? want[dst] : -2));
                if (tl->kk > 1 && (slot < 0 || slot >= PTL_WCAST_STAGE || slots[slot]))
                    return ptl_set_error(PTL_ERR_RUNTIME,
                                         "weight table: tile %d's element %d takes staging slot %d twice or past the "
                                         "staging",
                                         t, i, slot);
                seen[dst] = 1;
                if (tl->kk > 1)
                    slots[slot] = 1;
            }
        }
    }
    for (int64_t i = 0; i < total; i++)
        if (seen[i] != (want[i] >= 0))
            return ptl_set_error(PTL_ERR_RUNTIME, "weight table: the tiles (%s order) %s copy element %lld", order,
                                 seen[i] ? "write the padding" : "miss", (long long)i);
    return 0;
}

int ptl_net_wcast_check(const ptl_wcast_entry *tab, int n, const ptl_wcast_tile *tiles, int ntiles, int64_t total)
{
    int64_t *want = malloc((size_t)(total ? total : 1) * sizeof *want);
    uint8_t *seen = malloc((size_t)(total ? total : 1)), *slots = malloc(PTL_WCAST_STAGE);
    int rc = -1;
    if (!want || !seen || !slots) {
        ptl_set_error(PTL_ERR_MEMORY, "weight table check: out of memory");
        goto fail;
    }
    int64_t i = 0;
    for (int r = 0; r < n; r++) {
        const ptl_wcast_entry *e = &tab[r];
        const int cig = e->cin_g, kk = e->k * e->k;
        const int64_t end = r + 1 < n ? tab[r + 1].dst : total;
        if (e->dst != i || end > total) {
            ptl_set_error(PTL_ERR_RUNTIME, "weight table: record %d starts at %lld, expected %lld", r,
                          (long long)e->dst, (long long)i);
            goto fail;
        }
        for (int co = 0; co < e->cout; co++)
            for (int t = 0; t < kk; t++)
                for (int ci = 0; ci < cig; ci++)
                    want[i++] = e->src + ((int64_t)co * cig + ci) * kk + t;
        if (i > end) {
            ptl_set_error(PTL_ERR_RUNTIME, "weight table: record %d runs past the next", r);
            goto fail;
        }
        while (i < end)
            want[i++] = -1;
    }
    if (i != total) {
        ptl_set_error(PTL_ERR_RUNTIME, "weight table: covers %lld of %lld elements", (long long)i, (long long)total);
        goto fail;
    }
    for (int copy = 0; copy < 2; copy++)
        if (check_tiles(tiles, ntiles, total, want, copy, seen, slots))
            goto fail;
    rc = 0;
fail:
    free(want);
    free(seen);
    free(slots);
    return rc;
}

/* The head copies for element type T and index type I: the 32-bit one where ptl_net_head_fits32, as the CUDA
 * copies choose, so that these run the index arithmetic CUDA runs. */
#define HEAD_OUT(T, I, index)                                                                            \
    do {                                                                                                 \
        for (I i = 0; i < (I)total; i++)                                                                 \
            ((T *)out)[index(i, (I)hw, C, (I)A, (I)a0)] = ((const T *)map)[i];                           \
    } while (0)
#define HEAD_GRAD(T, I, index)                                                                           \
    do {                                                                                                 \
        for (I i = 0; i < (I)total; i++) {                                                               \
            const T v = ((const T *)d_out)[index(i, (I)hw, C, (I)A, (I)a0)];                             \
            ((T *)gmap)[i] = accumulate ? ((T *)gmap)[i] + v : v;                                        \
        }                                                                                                \
    } while (0)
#define HEAD_TYPES(copy)                                                                                 \
    do {                                                                                                 \
        const int narrow_ = ptl_net_head_fits32(B, hw, C, A, 0);                                         \
        if (dt == PTL_FLOAT32 && narrow_)                                                                \
            copy(float, uint32_t, ptl_net_head_index32);                                                 \
        else if (dt == PTL_FLOAT32)                                                                      \
            copy(float, int64_t, ptl_net_head_index);                                                    \
        else if (narrow_)                                                                                \
            copy(double, uint32_t, ptl_net_head_index32);                                                \
        else                                                                                             \
            copy(double, int64_t, ptl_net_head_index);                                                   \
    } while (0)

int ptl_net_head_out(ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0, const void *map, void *out)
{
    if (check_dt("net_head_out", dt))
        return -1;
    const int64_t total = (int64_t)B * hw * C;
    HEAD_TYPES(HEAD_OUT);
    return 0;
}

int ptl_net_head_grad(ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0, const void *d_out, void *gmap,
                      int accumulate)
{
    if (check_dt("net_head_grad", dt))
        return -1;
    const int64_t total = (int64_t)B * hw * C;
    HEAD_TYPES(HEAD_GRAD);
    return 0;
}
