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

/* The longest run a CUDA thread walks: 16 bytes of bfloat16 or float16 (float32's are 4 elements). */
#define PTL_WCAST_RUN 8

/* The last record starting at or before element `i` of the OHWI copy. */
PTL_HD int ptl_wcast_find(const ptl_wcast_entry *tab, int n, int64_t i)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tab[mid].dst <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Offset in OIHW (cout, cin_g, k, k) of element j of the same tensor in OHWI (cout, k, k, cin_g), or
 * -1 when j lies in the padding after the tensor. */
PTL_HD int64_t ptl_wcast_src(const ptl_wcast_entry *e, int64_t j)
{
    const int cin_g = e->cin_g, k = e->k;
    if (j >= (int64_t)e->cout * cin_g * k * k)
        return -1;
    const int ci = (int)(j % cin_g);
    int64_t r = j / cin_g;
    const int kw = (int)(r % k);
    r /= k;
    const int kh = (int)(r % k);
    const int64_t co = r / k;
    return e->src + ((co * cin_g + ci) * k + kh) * k + kw;
}

/* A walk over consecutive elements of the OHWI copy from element i on (the CUDA kernels' per-thread runs): the
 * record, and the element's coordinates (co, kh, kw, ci) in it, found once and then advanced one element at a
 * time without a division (a search and four 64-bit divisions per element made the cast instruction-bound).
 * With oihw the offsets within each record are taken in the master order instead: the walk's element i is
 * then master element src + (i - dst) of its record, so that a run's master elements are consecutive (the
 * gradient's read-add-writes) while the copy's are gathered. Either order visits each element once. */
typedef struct {
    const ptl_wcast_entry *e, *last;
    int64_t i, next, co; /* the element; where the record after e starts (INT64_MAX: e is the last) */
    int kh, kw, ci, oihw;
} ptl_wcast_walk;

PTL_HD void ptl_wcast_walk_at(ptl_wcast_walk *w, const ptl_wcast_entry *tab, int n, int64_t i, int oihw)
{
    const ptl_wcast_entry *e = tab + ptl_wcast_find(tab, n, i);
    int64_t j = i - e->dst;
    w->e = e;
    w->last = tab + n - 1;
    w->i = i;
    w->next = e < w->last ? e[1].dst : INT64_MAX;
    w->oihw = oihw;
    if (oihw) {
        w->kw = (int)(j % e->k);
        j /= e->k;
        w->kh = (int)(j % e->k);
        j /= e->k;
        w->ci = (int)(j % e->cin_g);
        w->co = j / e->cin_g;
    } else {
        w->ci = (int)(j % e->cin_g);
        j /= e->cin_g;
        w->kw = (int)(j % e->k);
        j /= e->k;
        w->kh = (int)(j % e->k);
        w->co = j / e->k;
    }
}

/* The walk's element's offsets in the master parameters and in the copy; -1 in the padding after a record. */
PTL_HD int64_t ptl_wcast_walk_src(const ptl_wcast_walk *w)
{
    const ptl_wcast_entry *e = w->e;
    return w->co < e->cout ? e->src + ((w->co * e->cin_g + w->ci) * e->k + w->kh) * e->k + w->kw : -1;
}

PTL_HD int64_t ptl_wcast_walk_dst(const ptl_wcast_walk *w)
{
    const ptl_wcast_entry *e = w->e;
    return w->co < e->cout ? e->dst + ((w->co * e->k + w->kh) * e->k + w->kw) * e->cin_g + w->ci : -1;
}

/* past a record's end co only grows: the padding maps to nothing */
PTL_HD void ptl_wcast_walk_next(ptl_wcast_walk *w)
{
    const ptl_wcast_entry *e = w->e;
    if (++w->i == w->next) {
        w->e++;
        w->next = w->e < w->last ? w->e[1].dst : INT64_MAX;
        w->co = 0;
        w->kh = w->kw = w->ci = 0;
    } else if (w->oihw) {
        if (++w->kw == e->k) {
            w->kw = 0;
            if (++w->kh == e->k) {
                w->kh = 0;
                if (++w->ci == e->cin_g) {
                    w->ci = 0;
                    w->co++;
                }
            }
        }
    } else if (++w->ci == e->cin_g) {
        w->ci = 0;
        if (++w->kw == e->k) {
            w->kw = 0;
            if (++w->kh == e->k) {
                w->kh = 0;
                w->co++;
            }
        }
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
/* grads[OIHW] += wgc[OHWI] for every record. */
int ptl_net_weight_grad(ptl_dtype dt, const ptl_wcast_entry *tab, int n, const void *wgc, void *grads);
/* Checks that the per-element search (ptl_wcast_find, ptl_wcast_src) maps every element of a copy of `total`
 * elements as the per-record walk does, and that the CUDA kernels' walks (ptl_wcast_walk in both orders,
 * PTL_WCAST_RUN elements from every multiple of 4) map them as the search does; -1 naming the first mismatch
 * (tests). */
int ptl_net_wcast_check(const ptl_wcast_entry *tab, int n, int64_t total);
/* out[(b*A + a0 + i)*C + c] = map[(b*hw + i)*C + c] for a level's map (B, hw, C); the backward
 * gmap[...] (= or +=, accumulate 0 or 1) d_out[...]. */
int ptl_net_head_out(ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0, const void *map, void *out);
int ptl_net_head_grad(ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0, const void *d_out, void *gmap,
                      int accumulate);

#ifdef PTL_WITH_CUDA
struct ptl_cuda_ctx;
/* The same on the device: compute dtype dt (float32, bfloat16, float16) for wc, wgc and the maps;
 * float32 for params, grads, the head outputs and d_out. tab lives on the device. */
int ptl_net_weight_cast_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, const ptl_wcast_entry *tab, int n,
                             int64_t total, const void *params, void *wc);
int ptl_net_weight_grad_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, const ptl_wcast_entry *tab, int n,
                             int64_t total, const void *wgc, void *grads);
int ptl_net_head_out_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0,
                          const void *map, void *out);
int ptl_net_head_grad_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int B, int64_t hw, int C, int64_t A,
                           int64_t a0, const void *d_out, void *gmap, int accumulate);
#endif

#ifdef __cplusplus
}
#endif

#endif
