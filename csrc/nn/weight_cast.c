/* CPU reference of the executor's weight casts and head copies (weight_cast.h). The head copies walk
 * their output element by element with the CUDA kernels' index arithmetic (../cuda/weight_cast.cu);
 * the weight casts walk each record in nested loops (several times faster than the per-element
 * search), and ptl_net_wcast_check compares that walk with the search and the CUDA kernels' runs. */
#include "weight_cast.h"

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

/* Each master element receives exactly one addition, so the order over elements does not matter. */
#define GRAD(T)                                                                                          \
    for (int r = 0; r < n; r++) {                                                                        \
        const ptl_wcast_entry *e = &tab[r];                                                              \
        const int cig = e->cin_g, kk = e->k * e->k;                                                      \
        const T *g = (const T *)wgc + e->dst;                                                            \
        T *out = (T *)grads + e->src;                                                                    \
        for (int co = 0; co < e->cout; co++)                                                             \
            for (int t = 0; t < kk; t++)                                                                 \
                for (int ci = 0; ci < cig; ci++)                                                         \
                    out[((int64_t)co * cig + ci) * kk + t] += g[((int64_t)co * kk + t) * cig + ci];      \
    }

int ptl_net_weight_grad(ptl_dtype dt, const ptl_wcast_entry *tab, int n, const void *wgc, void *grads)
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

int ptl_net_wcast_check(const ptl_wcast_entry *tab, int n, int64_t total)
{
    int64_t i = 0;
    for (int r = 0; r < n; r++) {
        const ptl_wcast_entry *e = &tab[r];
        const int cig = e->cin_g, kk = e->k * e->k;
        const int64_t end = r + 1 < n ? tab[r + 1].dst : total;
        if (e->dst != i)
            return ptl_set_error(PTL_ERR_RUNTIME, "weight table: record %d starts at %lld, expected %lld", r,
                                 (long long)e->dst, (long long)i);
        for (int co = 0; co < e->cout; co++)
            for (int t = 0; t < kk; t++)
                for (int ci = 0; ci < cig; ci++, i++) {
                    const int64_t want = e->src + ((int64_t)co * cig + ci) * kk + t;
                    const int found = ptl_wcast_find(tab, n, i);
                    const int64_t got = ptl_wcast_src(&tab[found], i - tab[found].dst);
                    if (found != r || got != want)
                        return ptl_set_error(PTL_ERR_RUNTIME,
                                             "weight table: element %lld maps to record %d offset %lld, expected "
                                             "record %d offset %lld",
                                             (long long)i, found, (long long)got, r, (long long)want);
                }
        for (; i < end; i++) /* padding: in record r, mapped to nothing */
            if (ptl_wcast_find(tab, n, i) != r || ptl_wcast_src(&tab[r], i - e->dst) != -1)
                return ptl_set_error(PTL_ERR_RUNTIME, "weight table: padding element %lld is mapped", (long long)i);
    }
    if (i != total)
        return ptl_set_error(PTL_ERR_RUNTIME, "weight table: covers %lld of %lld elements", (long long)i,
                             (long long)total);
    for (int oihw = 0; oihw < 2; oihw++)
        for (int64_t i0 = 0; i0 < total; i0 += 4) {
            ptl_wcast_walk w;
            ptl_wcast_walk_at(&w, tab, n, i0, oihw);
            for (int u = 0; u < PTL_WCAST_RUN && i0 + u < total; u++, ptl_wcast_walk_next(&w)) {
                /* OHWI order: the copy's element i0 + u; master order: the record's master element at the same
                 * offset; either way the pair the search gives for the copy element */
                const ptl_wcast_entry *e = &tab[ptl_wcast_find(tab, n, i0 + u)];
                const int64_t j = i0 + u - e->dst, size = (int64_t)e->cout * e->cin_g * e->k * e->k;
                const int64_t src = w.e != e ? -2 : ptl_wcast_walk_src(&w), dst = ptl_wcast_walk_dst(&w);
                const int64_t want_src = oihw ? (j < size ? e->src + j : -1) : ptl_wcast_src(e, j);
                const int dst_ok = want_src < 0 ? dst == -1
                                   : oihw       ? dst >= e->dst && ptl_wcast_src(e, dst - e->dst) == src
                                                : dst == i0 + u;
                if (src != want_src || !dst_ok)
                    return ptl_set_error(PTL_ERR_RUNTIME,
                                         "weight table: the %s walk from element %lld maps element %lld to master "
                                         "%lld and copy %lld, expected master %lld",
                                         oihw ? "master-order" : "copy-order", (long long)i0, (long long)(i0 + u),
                                         (long long)src, (long long)dst, (long long)want_src);
            }
        }
    return 0;
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
