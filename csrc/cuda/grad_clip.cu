/* Gradient unscaling, Inf/NaN detection and global-norm clipping on the device (spec §4.8, §6); the CPU
 * reference is csrc/optim/grad_clip.c (which also says how hp->world averages the ranks' summed gradients).
 * Per-chunk partial sums (double) then one fixed-order reduction: deterministic, and nothing comes back to
 * the host. */
#include "../optim/optim.h"
#include "device.h"
#include "launch.cuh"

#define GC_THREADS 256

/* Block-wide sum of one double per thread, in a fixed tree order; valid in thread 0. */
__device__ double gc_block_sum(double v, double *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = GC_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

__device__ float gc_inv_scale(const float *scalars, int scaler, int world)
{
    return ptl_grad_inv_scale_f(scaler ? (double)scalars[PTL_OPT_S_SCALE] : 1.0, world);
}

__global__ void grad_partial_kernel(const float *g, const int64_t *call, const float *scalars, int scaler,
                                    int world, double *part)
{
    ptl_wait_prior();
    __shared__ double sh[GC_THREADS];
    int64_t c = blockIdx.x, start = call[3 * c], len = call[3 * c + 1];
    float inv = gc_inv_scale(scalars, scaler, world);
    double acc = 0;
    for (int64_t i = threadIdx.x; i < len; i += GC_THREADS) {
        float v = PTL_FMUL(g[start + i], inv);
        acc += (double)v * (double)v;
    }
    double s = gc_block_sum(acc, sh);
    if (threadIdx.x == 0)
        part[c] = s;
}

__global__ void grad_finalize_kernel(const double *part, int64_t nchunks, float *scalars, float max_norm, int scaler)
{
    ptl_wait_prior();
    __shared__ double sh[GC_THREADS];
    double acc = 0;
    for (int64_t i = threadIdx.x; i < nchunks; i += GC_THREADS)
        acc += part[i];
    double ss = gc_block_sum(acc, sh);
    if (threadIdx.x == 0) {
        int found = scaler && !isfinite(ss);
        float norm = (float)sqrt(ss), coef = 1.0f;
        if (max_norm > 0.0f) {
            float c = __fdiv_rn(max_norm, __fadd_rn(norm, 1e-6f));
            if (!(c >= 1.0f))
                coef = c;
        }
        scalars[PTL_OPT_S_FOUND_INF] = found ? 1.0f : 0.0f;
        scalars[PTL_OPT_S_NORM] = norm;
        scalars[PTL_OPT_S_COEF] = coef;
    }
}

__global__ void grad_reset_kernel(float *scalars)
{
    ptl_wait_prior();
    scalars[PTL_OPT_S_FOUND_INF] = 0.0f;
    scalars[PTL_OPT_S_COEF] = 1.0f;
}

extern "C" int ptl_grad_stats_cuda(struct CUstream_st *stream, const ptl_optim_buffers *b, const ptl_optim_hp *hp)
{
    float *scalars = (float *)b->scalars;
    double *part = (double *)b->ws_f64;
    if ((!hp->scaler && !(hp->max_norm > 0)) || b->nchunks == 0) {
        ptl_launch(grad_reset_kernel, 1, 1, 0, stream, scalars);
        PTL_LAUNCH_CHECK("grad_reset_kernel");
        return 0;
    }
    ptl_launch(grad_partial_kernel, (unsigned)b->nchunks, GC_THREADS, 0, stream, (const float *)b->grads, b->call,
               scalars, hp->scaler, hp->world, part);
    PTL_LAUNCH_CHECK("grad_partial_kernel");
    ptl_launch(grad_finalize_kernel, 1, GC_THREADS, 0, stream, part, b->nchunks, scalars,
               hp->max_norm > 0 ? (float)hp->max_norm : 0.0f, hp->scaler);
    PTL_LAUNCH_CHECK("grad_finalize_kernel");
    return 0;
fail:
    return -1;
}
