/* Element-wise add/accumulate (CUDA), the add of two (m, c) rows into a channel slice of a wider output with
 * its backward (an Add whose output is a Concat's part built in place), and the executor's zeroing. */

#include "../nn/elementwise.h"
#include "layers_common.cuh"

/* ---------------------------------------------------------------- add / accumulate
 * V elements a thread: a 16-byte pack where the length and the pointers allow (ew_launch), else one. */

template <typename T, int V>
__global__ void add_kernel(int64_t groups, const T *a, const T *b, T *y)
{
    ptl_wait_prior();
    typedef ptl_pack<T, V> P;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const P pa = reinterpret_cast<const P *>(a)[i], pb = reinterpret_cast<const P *>(b)[i];
        P py;
#pragma unroll
        for (int k = 0; k < V; k++)
            ptl_st(&py.v[k], ptl_ld(&pa.v[k]) + ptl_ld(&pb.v[k]));
        reinterpret_cast<P *>(y)[i] = py;
    }
}

/* y += x; its own kernel so that profiles tell gradient accumulation from the forward's adds. */
template <typename T, int V>
__global__ void accumulate_kernel(int64_t groups, const T *x, T *y)
{
    ptl_wait_prior();
    typedef ptl_pack<T, V> P;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const P px = reinterpret_cast<const P *>(x)[i];
        P py = reinterpret_cast<const P *>(y)[i];
#pragma unroll
        for (int k = 0; k < V; k++)
            ptl_st(&py.v[k], ptl_ld(&py.v[k]) + ptl_ld(&px.v[k]));
        reinterpret_cast<P *>(y)[i] = py;
    }
}

/* kernel<T, V> over n elements on ctx's stream, in a PTL_LAYER_DISPATCH: V = a 16-byte pack's elements where n
 * and the pointers p0..p2 allow, else 1. */
#define EW_LAUNCH(kernel, n, p0, p1, p2, ...)                                                                    \
    do {                                                                                                         \
        constexpr int vv_ = 16 / sizeof(T);                                                                      \
        if (ptl_vec_ok(n, vv_, p0, p1, p2))                                                                     \
            ptl_launch(kernel<T, vv_>, ptl_grid_for((n) / vv_, 256), 256, 0, ctx->stream, (n) / vv_, __VA_ARGS__); \
        else                                                                                                     \
            ptl_launch(kernel<T, 1>, ptl_grid_for(n, 256), 256, 0, ctx->stream, n, __VA_ARGS__);                 \
    } while (0)

static int check_n(const char *fn, int64_t n)
{
    if (n < 0)
        return ptl_set_error(PTL_ERR_VALUE, "%s: negative length %lld", fn, (long long)n);
    return 0;
}

extern "C" int ptl_add_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t n, const void *a, const void *b, void *y)
{
    if (check_n("add_cuda", n))
        return -1;
    if (n == 0)
        return 0;
    PTL_LAYER_DISPATCH("add_cuda", dt, EW_LAUNCH(add_kernel, n, a, b, y, (const T *)a, (const T *)b, (T *)y));
    PTL_LAUNCH_CHECK("add_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_accumulate_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t n, const void *x, void *y)
{
    if (check_n("accumulate_cuda", n))
        return -1;
    if (n == 0)
        return 0;
    PTL_LAYER_DISPATCH("accumulate_cuda", dt, EW_LAUNCH(accumulate_kernel, n, x, y, y, (const T *)x, (T *)y));
    PTL_LAUNCH_CHECK("accumulate_kernel");
    return 0;
fail:
    return -1;
}

/* ---------------------------------------------------------------- add into a channel slice
 * Row r of y starts ldy elements after row r - 1 (y: the slice's first channel); a and b are (m, c). One launch
 * where copying a into the slice and adding b took two, with the same one rounding of a + b. */

template <typename T, typename I, int V>
__global__ void add_rows_kernel(I groups, int cg, const T *a, const T *b, T *y, int ldyg)
{
    ptl_wait_prior();
    typedef ptl_pack<T, V> P;
    const I stride = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const I r = i / cg;
        const P pa = reinterpret_cast<const P *>(a)[i], pb = reinterpret_cast<const P *>(b)[i];
        P py;
#pragma unroll
        for (int k = 0; k < V; k++)
            ptl_st(&py.v[k], ptl_ld(&pa.v[k]) + ptl_ld(&pb.v[k]));
        reinterpret_cast<P *>(y)[r * ldyg + (i - r * cg)] = py;
    }
}

/* The backward: the slice of dy (rows ldy apart) into the two (m, c) input gradients g0 and g1, each overwritten
 * or added to (acc0, acc1); either may be NULL. */
template <typename T, typename I, int V>
__global__ void add_rows_backward_kernel(I groups, int cg, const T *dy, int ldyg, T *g0, int acc0, T *g1, int acc1)
{
    ptl_wait_prior();
    typedef ptl_pack<T, V> P;
    const I stride = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const I r = i / cg;
        const P d = reinterpret_cast<const P *>(dy)[r * ldyg + (i - r * cg)];
        T *const gs[2] = {g0, g1};
        const int accs[2] = {acc0, acc1};
#pragma unroll
        for (int j = 0; j < 2; j++) {
            if (!gs[j])
                continue;
            P *g = reinterpret_cast<P *>(gs[j]) + i;
            if (accs[j]) {
                P v = *g;
#pragma unroll
                for (int k = 0; k < V; k++)
                    ptl_st(&v.v[k], ptl_ld(&v.v[k]) + ptl_ld(&d.v[k]));
                *g = v;
            } else {
                *g = d;
            }
        }
    }
}

/* kernel<T, I, V> over the (m, c) rows, V a 16-byte pack's elements where c, ld and the pointers allow, I = int
 * where the slice's last element's index fits. */
#define ROWS_LAUNCH(kernel, m, c, ld, p0, p1, p2, ...)                                                             \
    do {                                                                                                           \
        constexpr int vv_ = 16 / sizeof(T);                                                                        \
        const int v_ = ptl_vec_ok((c) | (ld), vv_, p0, p1, p2) ? vv_ : 1;                                          \
        const int64_t groups_ = (m) * ((c) / v_);                                                                  \
        const unsigned grid_ = ptl_grid_for(groups_, 256);                                                         \
        const int small_ = (m) * (int64_t)(ld) < INT32_MAX;                                                        \
        if (v_ > 1 && small_)                                                                                      \
            ptl_launch(kernel<T, int, vv_>, grid_, 256, 0, ctx->stream, (int)groups_, (c) / vv_, __VA_ARGS__);     \
        else if (v_ > 1)                                                                                           \
            ptl_launch(kernel<T, int64_t, vv_>, grid_, 256, 0, ctx->stream, groups_, (c) / vv_, __VA_ARGS__);      \
        else if (small_)                                                                                           \
            ptl_launch(kernel<T, int, 1>, grid_, 256, 0, ctx->stream, (int)groups_, (c), __VA_ARGS__);             \
        else                                                                                                       \
            ptl_launch(kernel<T, int64_t, 1>, grid_, 256, 0, ctx->stream, groups_, (c), __VA_ARGS__);              \
    } while (0)

static int check_rows(const char *fn, int64_t m, int c, int ld)
{
    if (m < 0 || c < 0 || ld < c)
        return ptl_set_error(PTL_ERR_VALUE, "%s: bad rows (m=%lld, c=%d, ld=%d)", fn, (long long)m, c, ld);
    return 0;
}

extern "C" int ptl_add_rows_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *a, const void *b,
                                 void *y, int ldy)
{
    if (check_rows("add_rows_cuda", m, c, ldy))
        return -1;
    if (m == 0 || c == 0)
        return 0;
    PTL_LAYER_DISPATCH("add_rows_cuda", dt,
                       ROWS_LAUNCH(add_rows_kernel, m, c, ldy, a, b, y, (const T *)a, (const T *)b, (T *)y,
                                   ldy / v_));
    PTL_LAUNCH_CHECK("add_rows_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int ptl_add_rows_backward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *dy, int ldy,
                                          void *g0, int acc0, void *g1, int acc1)
{
    if (check_rows("add_rows_backward_cuda", m, c, ldy))
        return -1;
    if (m == 0 || c == 0 || !(g0 || g1))
        return 0;
    PTL_LAYER_DISPATCH("add_rows_backward_cuda", dt,
                       ROWS_LAUNCH(add_rows_backward_kernel, m, c, ldy, dy, g0, g1, (const T *)dy, ldy / v_, (T *)g0,
                                   acc0, (T *)g1, acc1));
    PTL_LAUNCH_CHECK("add_rows_backward_kernel");
    return 0;
fail:
    return -1;
}

/* ---------------------------------------------------------------- zero
 * A kernel, not cudaMemsetAsync: in a recorded graph a memset node ends the early launch of the kernel after
 * it (that kernel starts only once the memset has finished and it is then scheduled, microseconds later). 16
 * bytes a thread where the pointer and the size allow, else one byte. */

template <typename W>
__global__ void zero_kernel(int64_t n, W *p)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = W{};
}

extern "C" int ptl_zero_cuda(ptl_cuda_ctx *ctx, void *p, size_t bytes)
{
    if (bytes == 0)
        return 0;
    if (bytes % 16 == 0 && ptl_aligned16(p, NULL, NULL)) {
        const int64_t n = (int64_t)(bytes / 16);
        ptl_launch(zero_kernel<uint4>, ptl_grid_for(n, 256), 256, 0, ctx->stream, n, (uint4 *)p);
    } else {
        ptl_launch(zero_kernel<uint8_t>, ptl_grid_for((int64_t)bytes, 256), 256, 0, ctx->stream, (int64_t)bytes,
                   (uint8_t *)p);
    }
    PTL_LAUNCH_CHECK("zero_kernel");
    return 0;
fail:
    return -1;
}
