/* BatchNorm (+ fused SiLU) over (m, c) rows (CUDA), the semantics of ../nn/batchnorm.h.
 *
 * Activations x, y, dy, dx in float32, bfloat16 or float16; gamma, beta, running statistics, saved
 * mean/invstd and dgamma/dbeta always float32. Statistics are summed in double by the deterministic
 * column reduction of layers_common.cuh (fixed geometry, fixed-order trees, no atomics), so every
 * result is bitwise reproducible run to run. Launches per call: training forward 3 (partial sums,
 * per-channel finish, apply), backward 3 (the same), eval forward 2 and eval backward 1 (3 when
 * dgamma/dbeta are wanted), and 2 after a convolution that summed its output itself (finish, apply:
 * conv2d_bn.h); a pass of two or three that comes again with the same pointers is relaunched as one graph
 * (call_graph.h). The partial sums live in the per-device layer scratch (conv2d.h). */
#include "../nn/batchnorm.h"
#include "call_graph.h"
#include "conv2d_bn.h"
#include "layers_common.cuh"

/* Forward statistics: sums of (x - shift) and (x - shift)^2, shift = the channel's first value, which
 * keeps the one-pass variance free of cancellation. */
template <typename T>
struct bn_stat_op {
    static constexpr int K = 2;
    static constexpr int ROWS_AT_ONCE = 4;
    typedef T Row; /* raw, not float: a float row took 6 more registers and made these sums 8% slower at P1 */
    const T *x;
    int c;
    __device__ Row load(int64_t r, int ch) const { return x[r * c + ch]; }
    __device__ void add(const Row &xv, int ch, double *acc) const
    {
        const double v = (double)ptl_ld(&xv) - (double)ptl_ld(x + ch);
        acc[0] += v;
        acc[1] += v * v;
    }
};

/* Backward sums: g = dy * act'(z) and g * xhat, as the CPU reference computes them (float32); dy's rows are
 * ld apart. */
template <typename T>
struct bn_grad_op {
    static constexpr int K = 2;
    static constexpr int ROWS_AT_ONCE = 4;
    struct Row {
        T x, dy;
    };
    const T *x, *dy;
    const float *gamma, *beta, *mean, *invstd;
    int c, ld, silu;
    __device__ Row load(int64_t r, int ch) const { return {x[r * c + ch], dy[r * ld + ch]}; }
    __device__ void add(const Row &v, int ch, double *acc) const
    {
        const float xhat = (ptl_ld(&v.x) - mean[ch]) * invstd[ch];
        float g = ptl_ld(&v.dy);
        if (silu) {
            const float z = xhat * gamma[ch] + beta[ch];
            const float s = ptl_sigmoidf(z);
            g = g * (s * (1.0f + z * (1.0f - s)));
        }
        acc[0] += (double)g;
        acc[1] += (double)(g * xhat);
    }
};

/* The channel's mean, 1/std and running statistics from its sums s and q of (x - shift) and (x - shift)^2 over
 * m rows (lane 0 of the channel's warp stores them). */
__device__ __forceinline__ void bn_fwd_store(int64_t m, int ch, double shift, double s, double q, float rm0, float rv0,
                                             float *rm, float *rv, float *smean, float *sinv)
{
    const double ms = s / (double)m;
    double var = q / (double)m - ms * ms;
    if (var < 0.0)
        var = 0.0;
    const double mean = shift + ms;
    const double unbiased = m > 1 ? var * (double)m / (double)(m - 1) : var;
    smean[ch] = (float)mean;
    sinv[ch] = (float)(1.0 / sqrt(var + PTL_BN_EPS));
    rm[ch] = (float)((1.0 - PTL_BN_MOMENTUM) * (double)rm0 + PTL_BN_MOMENTUM * mean);
    rv[ch] = (float)((1.0 - PTL_BN_MOMENTUM) * (double)rv0 + PTL_BN_MOMENTUM * unbiased);
}

template <typename T>
__global__ void bn_fwd_finish(int64_t m, int c, int nchunks, const double *part, const T *x, float *rm,
                              float *rv, float *smean, float *sinv)
{
    ptl_wait_prior();
    const int ch = ptl_colsum_finish_channel();
    if (ch >= c)
        return;
    /* loaded by every lane before the sums, so that their latency hides behind the sums' */
    const float shift = ptl_ld(x + ch), rm0 = rm[ch], rv0 = rv[ch];
    double sums[2];
    ptl_colsum_finish_n<2>(part, nchunks, c, 0, ch, sums);
    if (threadIdx.x & 31)
        return;
    bn_fwd_store(m, ch, (double)shift, sums[0], sums[1], rm0, rv0, rm, rv, smean, sinv);
}

/* The finish from the fused convolution's chunks (conv2d_bn.cu): chunk i's sums are relative to its own shift
 * h_i over n_i rows; moved to the channel's first value h_0 (chunk 0's shift) with d = h_i - h_0, they are
 * s_i + n_i d and q_i + d (2 s_i + n_i d). Lane l takes chunks l, l + 32, ... in order, then a fixed shuffle
 * tree combines the lanes. */
__global__ void bn_fwd_finish_chunks(int64_t m, int c, int nchunks, const double *part, float *rm, float *rv,
                                     float *smean, float *sinv)
{
    ptl_wait_prior();
    const int ch = ptl_colsum_finish_channel(), lane = threadIdx.x & 31;
    if (ch >= c)
        return;
    const int64_t qs = (int64_t)nchunks * c;
    const double h0 = part[2 * qs + ch];
    const float rm0 = rm[ch], rv0 = rv[ch];
    double s = 0.0, q = 0.0;
    /* U chunks' loads at once, then their additions in order (one chunk at a time kept a load in flight) */
    constexpr int U = 4;
    for (int i0 = lane; i0 < nchunks; i0 += 32 * U) {
        double v[U][4];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = i0 + 32 * u;
            const int64_t at = (int64_t)(i < nchunks ? i : 0) * c + ch;
#pragma unroll
            for (int k = 0; k < 4; k++)
                v[u][k] = i < nchunks ? part[k * qs + at] : 0.0;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const double d = v[u][2] - h0;
            s += v[u][0] + v[u][3] * d;
            q += v[u][1] + d * (2.0 * v[u][0] + v[u][3] * d);
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        s += __shfl_down_sync(0xffffffffu, s, off);
        q += __shfl_down_sync(0xffffffffu, q, off);
    }
    if (lane == 0)
        bn_fwd_store(m, ch, h0, s, q, rm0, rv0, rm, rv, smean, sinv);
}

__global__ void bn_eval_stats(int c, const float *rm, const float *rv, float *smean, float *sinv)
{
    ptl_wait_prior();
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    smean[ch] = rm[ch];
    sinv[ch] = (float)(1.0 / sqrt((double)rv[ch] + PTL_BN_EPS));
}

/* V per-channel floats from p + ch0: 16-byte loads when V is a multiple of 4 (the launches take V > 1 only when
 * every per-channel array is 16-byte aligned), else one by one; a load per element and array made the small
 * layers' passes a third slower. */
template <int V>
__device__ __forceinline__ void bn_channel_params(const float *p, int ch0, float *out)
{
    if (V % 4 == 0) {
#pragma unroll
        for (int k = 0; k < V; k += 4) {
            const float4 q = *reinterpret_cast<const float4 *>(p + ch0 + k);
            out[k] = q.x;
            out[k + 1] = q.y;
            out[k + 2] = q.z;
            out[k + 3] = q.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; k++)
            out[k] = p[ch0 + k];
    }
}

/* The element-wise passes move V elements per thread (ptl_pack), indexing with I = int when m*ld fits; y's
 * and dy's rows are ld apart (x's and dx's c). */
template <typename T, typename I, int V>
__global__ void bn_apply(I groups, int c, int ld, const T *x, const float *gamma, const float *beta,
                         const float *smean, const float *sinv, int silu, T *y)
{
    ptl_wait_prior();
    const I stride = (I)gridDim.x * blockDim.x;
    for (I gi = (I)blockIdx.x * blockDim.x + threadIdx.x; gi < groups; gi += stride) {
        const I r = gi * V / c;
        const int ch0 = (int)(gi * V - r * c);
        const ptl_pack<T, V> xv = reinterpret_cast<const ptl_pack<T, V> *>(x)[gi];
        float mu[V], is[V], ga[V], be[V];
        bn_channel_params<V>(smean, ch0, mu);
        bn_channel_params<V>(sinv, ch0, is);
        bn_channel_params<V>(gamma, ch0, ga);
        bn_channel_params<V>(beta, ch0, be);
        ptl_pack<T, V> yv;
#pragma unroll
        for (int k = 0; k < V; k++) {
            const float z = (ptl_ld(&xv.v[k]) - mu[k]) * is[k] * ga[k] + be[k];
            ptl_st(&yv.v[k], silu ? z * ptl_sigmoidf(z) : z);
        }
        reinterpret_cast<ptl_pack<T, V> *>(y)[(r * ld + ch0) / V] = yv;
    }
}

template <typename T, int V>
static void bn_apply_launch(cudaStream_t st, int64_t m, int c, int ld, const T *x, const float *gamma,
                            const float *beta, const float *smean, const float *sinv, int silu, T *y)
{
    const int64_t groups = m * c / V;
    if (m * ld < INT32_MAX)
        ptl_launch(bn_apply<T, int, V>, ptl_grid_for(groups, 256), 256, 0, st, (int)groups, c, ld, x, gamma, beta,
                   smean, sinv, silu, y);
    else
        ptl_launch(bn_apply<T, int64_t, V>, ptl_grid_for(groups, 256), 256, 0, st, groups, c, ld, x, gamma, beta,
                   smean, sinv, silu, y);
}

/* mean_g / mean_gx (float, as the CPU rounds them) for the dx pass, and dgamma/dbeta accumulation. */
__global__ void bn_bwd_finish(int64_t m, int c, int nchunks, const double *part, float *mean_g, float *mean_gx,
                              float *dgamma, float *dbeta)
{
    ptl_wait_prior();
    const int ch = ptl_colsum_finish_channel();
    if (ch >= c)
        return;
    /* loaded before the sums, as in bn_fwd_finish */
    const float db0 = dbeta ? dbeta[ch] : 0.0f, dg0 = dgamma ? dgamma[ch] : 0.0f;
    double sums[2];
    ptl_colsum_finish_n<2>(part, nchunks, c, 0, ch, sums);
    const double sg = sums[0], sgx = sums[1];
    if (threadIdx.x & 31)
        return;
    mean_g[ch] = (float)(sg / (double)m);
    mean_gx[ch] = (float)(sgx / (double)m);
    if (dbeta)
        dbeta[ch] = (float)((double)db0 + sg);
    if (dgamma)
        dgamma[ch] = (float)((double)dg0 + sgx);
}

/* dx may alias dy (ld == c): each element is read and then written by the same thread. */
template <typename T, typename I, int V>
__global__ void bn_bwd_apply(I groups, int c, int ld, const T *x, const T *dy, const float *gamma, const float *beta,
                             const float *smean, const float *sinv, const float *mean_g, const float *mean_gx,
                             int training, int silu, T *dx)
{
    ptl_wait_prior();
    const I stride = (I)gridDim.x * blockDim.x;
    for (I gi = (I)blockIdx.x * blockDim.x + threadIdx.x; gi < groups; gi += stride) {
        const I r = gi * V / c;
        const int ch0 = (int)(gi * V - r * c);
        const ptl_pack<T, V> xv = reinterpret_cast<const ptl_pack<T, V> *>(x)[gi];
        const ptl_pack<T, V> dyv = reinterpret_cast<const ptl_pack<T, V> *>(dy)[(r * ld + ch0) / V];
        float mu[V], is[V], ga[V], be[V], mg[V], mgx[V];
        bn_channel_params<V>(smean, ch0, mu);
        bn_channel_params<V>(sinv, ch0, is);
        bn_channel_params<V>(gamma, ch0, ga);
        if (silu)
            bn_channel_params<V>(beta, ch0, be);
        if (training) {
            bn_channel_params<V>(mean_g, ch0, mg);
            bn_channel_params<V>(mean_gx, ch0, mgx);
        }
        ptl_pack<T, V> dxv;
#pragma unroll
        for (int k = 0; k < V; k++) {
            const float xhat = (ptl_ld(&xv.v[k]) - mu[k]) * is[k];
            float g = ptl_ld(&dyv.v[k]);
            if (silu) {
                const float z = xhat * ga[k] + be[k];
                const float s = ptl_sigmoidf(z);
                g = g * (s * (1.0f + z * (1.0f - s)));
            }
            const float scale = ga[k] * is[k];
            ptl_st(&dxv.v[k], training ? scale * (g - mg[k] - xhat * mgx[k]) : scale * g);
        }
        reinterpret_cast<ptl_pack<T, V> *>(dx)[gi] = dxv;
    }
}

template <typename T, int V>
static void bn_bwd_apply_launch(cudaStream_t st, int64_t m, int c, int ld, const T *x, const T *dy,
                                const float *gamma, const float *beta, const float *smean, const float *sinv,
                                const float *mean_g, const float *mean_gx, int training, int silu, T *dx)
{
    const int64_t groups = m * c / V;
    if (m * ld < INT32_MAX)
        ptl_launch(bn_bwd_apply<T, int, V>, ptl_grid_for(groups, 256), 256, 0, st, (int)groups, c, ld, x, dy, gamma,
                   beta, smean, sinv, mean_g, mean_gx, training, silu, dx);
    else
        ptl_launch(bn_bwd_apply<T, int64_t, V>, ptl_grid_for(groups, 256), 256, 0, st, groups, c, ld, x, dy, gamma,
                   beta, smean, sinv, mean_g, mean_gx, training, silu, dx);
}

extern "C" size_t ptl_batchnorm_cuda_scratch_bytes(int64_t m, int c)
{
    if (m <= 0 || c <= 0)
        return 0;
    /* partial sums (the unfused pass's or the fused convolution's), then mean_g and mean_gx for the backward */
    const size_t colsum = ptl_colsum_part_bytes(m, c, 2), fused = ptl_conv2d_bn_part_bytes(m, c);
    return (colsum > fused ? colsum : fused) + 2 * (size_t)c * sizeof(float);
}

/* The apply, 16 bytes a thread where widths and pointers allow. */
template <typename T>
static int bn_apply_any(cudaStream_t st, int64_t m, int c, int ld, const T *x, const float *gamma, const float *beta,
                        const float *smean, const float *sinv, int silu, T *y)
{
    if (ptl_vec_ok(c | ld, 16 / sizeof(T), x, y, y) && ptl_aligned16(gamma, beta, smean) &&
        ptl_aligned16(sinv, NULL, NULL))
        bn_apply_launch<T, 16 / sizeof(T)>(st, m, c, ld, x, gamma, beta, smean, sinv, silu, y);
    else
        bn_apply_launch<T, 1>(st, m, c, ld, x, gamma, beta, smean, sinv, silu, y);
    PTL_LAUNCH_CHECK("bn_apply");
    return 0;
fail:
    return -1;
}

template <typename T>
static int bn_forward(ptl_cuda_ctx *ctx, int64_t m, int c, const T *x, const float *gamma, const float *beta,
                      float *rm, float *rv, int training, int silu, float *smean, float *sinv, T *y, int ld,
                      void *scratch)
{
    cudaStream_t st = ctx->stream;
    const unsigned cblocks = (unsigned)((c + 127) / 128);
    if (training) {
        const ptl_colsum_geom g = ptl_colsum_geometry(m, c, 2);
        double *part = (double *)scratch;
        ptl_colsum_launch(g, m, c, bn_stat_op<T>{x, c}, part, st);
        PTL_LAUNCH_CHECK("bn_stat_partials");
        ptl_launch(bn_fwd_finish<T>, ptl_colsum_finish_blocks(c), PTL_COLSUM_FINISH_THREADS, 0, st, m, c, g.nchunks,
                   part, x, rm, rv, smean, sinv);
        PTL_LAUNCH_CHECK("bn_fwd_finish");
    } else {
        ptl_launch(bn_eval_stats, cblocks, 128, 0, st, c, rm, rv, smean, sinv);
        PTL_LAUNCH_CHECK("bn_eval_stats");
    }
    return bn_apply_any<T>(st, m, c, ld, x, gamma, beta, smean, sinv, silu, y);
fail:
    return -1;
}

template <typename T>
static int bn_forward_from_sums(ptl_cuda_ctx *ctx, int64_t m, int c, int nchunks, const double *part, const T *x,
                                const float *gamma, const float *beta, float *rm, float *rv, int silu, float *smean,
                                float *sinv, T *y, int ld)
{
    cudaStream_t st = ctx->stream;
    ptl_launch(bn_fwd_finish_chunks, ptl_colsum_finish_blocks(c), PTL_COLSUM_FINISH_THREADS, 0, st, m, c, nchunks,
               part, rm, rv, smean, sinv);
    PTL_LAUNCH_CHECK("bn_fwd_finish_chunks");
    return bn_apply_any<T>(st, m, c, ld, x, gamma, beta, smean, sinv, silu, y);
fail:
    return -1;
}

template <typename T>
static int bn_backward(ptl_cuda_ctx *ctx, int64_t m, int c, const T *x, const T *dy, int ld, const float *gamma,
                       const float *beta, const float *smean, const float *sinv, int training, int silu, T *dx,
                       float *dgamma, float *dbeta, void *scratch)
{
    cudaStream_t st = ctx->stream;
    const float *mean_g = NULL, *mean_gx = NULL;
    if (scratch) {
        const ptl_colsum_geom g = ptl_colsum_geometry(m, c, 2);
        double *part = (double *)scratch;
        float *mg = (float *)((char *)scratch + ptl_colsum_part_bytes(m, c, 2));
        ptl_colsum_launch(g, m, c, bn_grad_op<T>{x, dy, gamma, beta, smean, sinv, c, ld, silu}, part, st);
        PTL_LAUNCH_CHECK("bn_grad_partials");
        ptl_launch(bn_bwd_finish, ptl_colsum_finish_blocks(c), PTL_COLSUM_FINISH_THREADS, 0, st, m, c, g.nchunks, part,
                   mg, mg + c, dgamma, dbeta);
        PTL_LAUNCH_CHECK("bn_bwd_finish");
        mean_g = mg;
        mean_gx = mg + c;
    }
    if (ptl_vec_ok(c | ld, 16 / sizeof(T), x, dy, dx) && ptl_aligned16(gamma, beta, smean) &&
        ptl_aligned16(sinv, mean_g, mean_gx))
        bn_bwd_apply_launch<T, 16 / sizeof(T)>(st, m, c, ld, x, dy, gamma, beta, smean, sinv, mean_g, mean_gx,
                                               training, silu, dx);
    else
        bn_bwd_apply_launch<T, 1>(st, m, c, ld, x, dy, gamma, beta, smean, sinv, mean_g, mean_gx, training, silu,
                                  dx);
    PTL_LAUNCH_CHECK("bn_bwd_apply");
    return 0;
fail:
    return -1;
}

/* One pass's arguments (a call of call_graph.h): its tensors in the dtype dt, the layer scratch (NULL: no sums). */
typedef struct {
    ptl_cuda_ctx *ctx;
    ptl_dtype dt;
    int64_t m;
    int c, ld, training, silu;
    const void *x, *dy, *gamma, *beta;
    void *running_mean, *running_var, *mean, *invstd, *out, *dgamma, *dbeta, *scratch;
} bn_call;

static int issue_forward(void *arg)
{
    const bn_call *k = (const bn_call *)arg;
    PTL_LAYER_DISPATCH("batchnorm_forward_cuda", k->dt,
                       return bn_forward<T>(k->ctx, k->m, k->c, (const T *)k->x, (const float *)k->gamma,
                                            (const float *)k->beta, (float *)k->running_mean,
                                            (float *)k->running_var, k->training, k->silu, (float *)k->mean,
                                            (float *)k->invstd, (T *)k->out, k->ld, k->scratch));
fail:
    return -1;
}

static int issue_backward(void *arg)
{
    const bn_call *k = (const bn_call *)arg;
    PTL_LAYER_DISPATCH("batchnorm_backward_cuda", k->dt,
                       return bn_backward<T>(k->ctx, k->m, k->c, (const T *)k->x, (const T *)k->dy, k->ld,
                                             (const float *)k->gamma, (const float *)k->beta, (const float *)k->mean,
                                             (const float *)k->invstd, k->training, k->silu, (T *)k->out,
                                             (float *)k->dgamma, (float *)k->dbeta, k->scratch));
fail:
    return -1;
}

/* A pass of two or three launches, through the queue's call graphs: one graph launch once its pointers
 * repeat (an eager step's do), where its launches would cost their host time each. */
static int run(const bn_call *k, int (*issue)(void *))
{
    const ptl_call_key key = {{(const void *)issue, k->ctx, k->x, k->dy, k->gamma, k->beta, k->running_mean,
                               k->running_var, k->mean, k->invstd, k->out, k->dgamma, k->dbeta, k->scratch,
                               (const void *)(uintptr_t)k->m,
                               (const void *)(uintptr_t)(((uint64_t)k->ld << 40) | ((uint64_t)k->c << 8) |
                                                         ((uint64_t)k->dt << 2) | ((uint64_t)k->training << 1) |
                                                         (uint64_t)k->silu)}};
    ptl_call_graphs *t = ptl_call_graphs_of(k->ctx);
    if (!t)
        return -1;
    return ptl_call_graph_run(t, k->ctx->stream, &key, issue, (void *)k);
}

extern "C" int ptl_batchnorm_forward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *x,
                                          const void *gamma, const void *beta, void *running_mean,
                                          void *running_var, int training, ptl_act act, void *save_mean,
                                          void *save_invstd, void *y, int ld)
{
    bn_call k = {ctx, dt, m, c, ld, training, act == PTL_ACT_SILU, x, NULL, gamma, beta, running_mean, running_var,
                 save_mean, save_invstd, y, NULL, NULL, NULL};
    if (ptl_batchnorm_check("batchnorm_forward_cuda", m, c, ld, act))
        return -1;
    if (training && ptl_layers_cuda_scratch(ctx, ptl_batchnorm_cuda_scratch_bytes(m, c), &k.scratch))
        return -1;
    return run(&k, issue_forward);
}

extern "C" int ptl_batchnorm_backward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *x,
                                           const void *dy, int ld, const void *gamma, const void *beta,
                                           const void *save_mean, const void *save_invstd, int training,
                                           ptl_act act, void *dx, void *dgamma, void *dbeta)
{
    bn_call k = {ctx, dt, m, c, ld, training, act == PTL_ACT_SILU, x, dy, gamma, beta, NULL, NULL,
                 (void *)save_mean, (void *)save_invstd, dx, dgamma, dbeta, NULL};
    if (ptl_batchnorm_check("batchnorm_backward_cuda", m, c, ld, act))
        return -1;
    if (!(training || dgamma || dbeta)) /* one launch: nothing for a graph to save */
        return issue_backward(&k);
    if (ptl_layers_cuda_scratch(ctx, ptl_batchnorm_cuda_scratch_bytes(m, c), &k.scratch))
        return -1;
    return run(&k, issue_backward);
}

extern "C" int ptl_batchnorm_forward_from_sums_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, int nchunks,
                                                    const double *part, const void *z, const void *gamma,
                                                    const void *beta, void *running_mean, void *running_var, int silu,
                                                    void *save_mean, void *save_invstd, void *y, int ld)
{
    PTL_LAYER_DISPATCH("batchnorm_forward_from_sums_cuda", dt,
                       return bn_forward_from_sums<T>(ctx, m, c, nchunks, part, (const T *)z, (const float *)gamma,
                                                      (const float *)beta, (float *)running_mean,
                                                      (float *)running_var, silu, (float *)save_mean,
                                                      (float *)save_invstd, (T *)y, ld));
fail:
    return -1;
}
