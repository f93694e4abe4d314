/* MuSGD, SGD (nesterov) and AdamW over the flat buffers on the device (spec §4.3, §4.8); the CPU reference
 * is csrc/optim/musgd.c. One step is: gradient statistics (grad_clip.cu), Muon momentum into the bf16
 * arena, per-matrix normalisation, NS5 (newton_schulz.cu), the update of every parameter, the scaler
 * update, and a memset of the gradients. Every kernel reads the found-inf flag and the clip coefficient
 * from the scalar buffer, so a skipped step needs no host sync. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../optim/optim.h"
#include "device.h"
#include "launch.cuh"

#define OPT_THREADS 256

/* Per-group coefficients, rounded on the host exactly as the CPU reference rounds them. */
typedef struct {
    int kind[PTL_OPT_MAX_GROUPS];
    float mu[PTL_OPT_MAX_GROUPS], one_minus_mu[PTL_OPT_MAX_GROUPS], wd[PTL_OPT_MAX_GROUPS];
    float alpha_muon[PTL_OPT_MAX_GROUPS], alpha_sgd[PTL_OPT_MAX_GROUPS];
    double lr[PTL_OPT_MAX_GROUPS], b1[PTL_OPT_MAX_GROUPS], wd_d[PTL_OPT_MAX_GROUPS];
    double beta2, eps;
    int nesterov, scaler, world;
} opt_dev_hp;

__device__ __forceinline__ float opt_inv_scale(const float *s, int scaler, int world)
{
    return ptl_grad_inv_scale_f(scaler ? (double)s[PTL_OPT_S_SCALE] : 1.0, world);
}

__device__ __forceinline__ int64_t opt_arena_index(const int64_t *row, int64_t e)
{
    int64_t rows = row[PTL_PT_ROWS], cols = row[PTL_PT_COLS];
    return row[PTL_PT_XOFF] + (row[PTL_PT_TALL] ? (e % cols) * rows + e / cols : e);
}

__device__ double opt_block_sum(double v, double *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = OPT_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

/* m <- lerp(m, g, 1 - mu); X <- bf16(u) (transposed for tall matrices); part[c] = sum of bf16(u)^2. */
__global__ void muon_momentum_kernel(const float *g, float *m, const int64_t *cmuon, const int64_t *ptab,
                                     const float *scalars, opt_dev_hp hp, uint16_t *X, double *part)
{
    ptl_wait_prior();
    __shared__ double sh[OPT_THREADS];
    if (scalars[PTL_OPT_S_FOUND_INF] != 0.0f)
        return;
    int64_t c = blockIdx.x, start = cmuon[3 * c], len = cmuon[3 * c + 1];
    const int64_t *row = ptab + cmuon[3 * c + 2] * PTL_PT_NCOLS;
    int grp = (int)row[PTL_PT_GROUP];
    float inv = opt_inv_scale(scalars, hp.scaler, hp.world), coef = scalars[PTL_OPT_S_COEF];
    float mu = hp.mu[grp], omm = hp.one_minus_mu[grp];
    double acc = 0;
    for (int64_t i = threadIdx.x; i < len; i += OPT_THREADS) {
        int64_t k = start + i;
        float u = ptl_muon_momentum_f(m + k, ptl_grad_used_f(g[k], inv, coef), omm, mu, hp.nesterov);
        uint16_t ub = ptl_f32_to_bf16_bits(ptl_f32_to_bits(u));
        double uf = ptl_bits_to_f32(ptl_bf16_to_f32_bits(ub));
        X[opt_arena_index(row, k - row[PTL_PT_OFF])] = ub;
        acc += uf * uf;
    }
    double s = opt_block_sum(acc, sh);
    if (threadIdx.x == 0)
        part[c] = s;
}

/* One thread per parameter: the bf16 denominator ||X||_F + eps of each orthogonalised matrix. */
__global__ void muon_norm_kernel(const int64_t *ptab, int64_t nparams, const double *part, double *den)
{
    ptl_wait_prior();
    int64_t pi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (pi >= nparams)
        return;
    const int64_t *row = ptab + pi * PTL_PT_NCOLS;
    if (row[PTL_PT_MIDX] < 0)
        return;
    double ss = 0;
    for (int64_t c = row[PTL_PT_CFIRST]; c < row[PTL_PT_CFIRST] + row[PTL_PT_CCOUNT]; c++)
        ss += part[c];
    float norm = ptl_round_bf16((float)sqrt(ss));
    den[row[PTL_PT_MIDX]] = ptl_round_bf16(__fadd_rn(norm, (float)PTL_NS_EPS));
}

__global__ void muon_div_kernel(const int64_t *cmuon, const int64_t *ptab, const float *scalars, const double *den,
                                uint16_t *X)
{
    ptl_wait_prior();
    if (scalars[PTL_OPT_S_FOUND_INF] != 0.0f)
        return;
    int64_t c = blockIdx.x, start = cmuon[3 * c], len = cmuon[3 * c + 1];
    const int64_t *row = ptab + cmuon[3 * c + 2] * PTL_PT_NCOLS;
    float d = (float)den[row[PTL_PT_MIDX]];
    for (int64_t i = threadIdx.x; i < len; i += OPT_THREADS) {
        int64_t xi = opt_arena_index(row, start + i - row[PTL_PT_OFF]);
        float v = ptl_bits_to_f32(ptl_bf16_to_f32_bits(X[xi]));
        X[xi] = ptl_f32_to_bf16_bits(ptl_f32_to_bits(__fdiv_rn(v, d)));
    }
}

/* Every parameter: Muon share (from the orthogonalised arena), then SGD, or AdamW. */
__global__ void optim_update_kernel(float *p, const float *g, float *s1, float *s2, const int64_t *call,
                                    const int64_t *ptab, const float *scalars, opt_dev_hp hp, const uint16_t *X)
{
    ptl_wait_prior();
    if (scalars[PTL_OPT_S_FOUND_INF] != 0.0f)
        return;
    int64_t c = blockIdx.x, start = call[3 * c], len = call[3 * c + 1];
    const int64_t *row = ptab + call[3 * c + 2] * PTL_PT_NCOLS;
    int grp = (int)row[PTL_PT_GROUP], kind = hp.kind[grp];
    float inv = opt_inv_scale(scalars, hp.scaler, hp.world), coef = scalars[PTL_OPT_S_COEF];
    if (kind == PTL_OPT_ADAMW) {
        ptl_adamw_coef ac = ptl_adamw_coefs(hp.lr[grp], hp.b1[grp], hp.beta2, hp.eps, hp.wd_d[grp],
                                            (double)scalars[PTL_OPT_S_STEP] + 1.0);
        for (int64_t i = threadIdx.x; i < len; i += OPT_THREADS) {
            int64_t k = start + i;
            ptl_adamw_elem_f(p + k, s1 + k, s2 + k, ptl_grad_used_f(g[k], inv, coef), &ac);
        }
        return;
    }
    float mu = hp.mu[grp], wd = hp.wd[grp], alpha = hp.alpha_sgd[grp];
    float amu = hp.alpha_muon[grp];
    float factor = kind == PTL_OPT_MUON ? (float)ptl_muon_factor(row[PTL_PT_D2], row[PTL_PT_D1]) : 1.0f;
    for (int64_t i = threadIdx.x; i < len; i += OPT_THREADS) {
        int64_t k = start + i;
        if (kind == PTL_OPT_MUON) {
            float o = ptl_bits_to_f32(ptl_bf16_to_f32_bits(X[opt_arena_index(row, k - row[PTL_PT_OFF])]));
            if (factor != 1.0f)
                o = ptl_round_bf16(__fmul_rn(o, factor));
            p[k] = fmaf(amu, o, p[k]);
        }
        ptl_sgd_elem_f(p + k, s2 + k, ptl_grad_used_f(g[k], inv, coef), mu, wd, alpha, hp.nesterov);
    }
}

/* Step counters and the GradScaler update (after every kernel that reads the flag or the scale). */
__global__ void optim_finish_kernel(float *s, int scaler, double growth_factor, double backoff_factor,
                                    int growth_interval)
{
    ptl_wait_prior();
    int found = s[PTL_OPT_S_FOUND_INF] != 0.0f;
    if (found)
        s[PTL_OPT_S_SKIPPED] = s[PTL_OPT_S_SKIPPED] + 1.0f;
    else
        s[PTL_OPT_S_STEP] = s[PTL_OPT_S_STEP] + 1.0f;
    if (scaler) {
        double scale = s[PTL_OPT_S_SCALE], growth = s[PTL_OPT_S_GROWTH];
        ptl_scaler_update(&scale, &growth, found, growth_factor, backoff_factor, growth_interval, 1);
        s[PTL_OPT_S_SCALE] = (float)scale;
        s[PTL_OPT_S_GROWTH] = (float)growth;
    }
}

static opt_dev_hp opt_dev_coefs(const ptl_optim_hp *hp)
{
    opt_dev_hp d;
    memset(&d, 0, sizeof d);
    for (int k = 0; k < hp->ngroups; k++) {
        double lr = hp->lr[k], mu = hp->momentum[k];
        d.kind[k] = hp->kind[k];
        d.mu[k] = (float)mu;
        d.one_minus_mu[k] = (float)(1.0 - mu);
        d.wd[k] = (float)hp->wd[k];
        d.alpha_muon[k] = (float)(-(lr * hp->muon_w));
        d.alpha_sgd[k] = (float)(-(lr * (hp->kind[k] == PTL_OPT_MUON ? hp->sgd_w : 1.0)));
        d.lr[k] = lr;
        d.b1[k] = mu;
        d.wd_d[k] = hp->wd[k];
    }
    d.beta2 = hp->beta2;
    d.eps = hp->eps;
    d.nesterov = hp->nesterov;
    d.scaler = hp->scaler;
    d.world = hp->world;
    return d;
}

extern "C" void ptl_ns_graph_release(ptl_ns_graph *g)
{
    if (!g)
        return;
    if (g->exec) {
        cudaGraphExecDestroy((cudaGraphExec_t)g->exec);
        g->exec = NULL;
    }
    ptl_ns_lanes_destroy(g->lanes);
    g->lanes = NULL;
}

/* PTL_NS_LANES=0 keeps the Newton-Schulz products on one stream, for comparison. */
static int lanes_on(void)
{
    const char *e = getenv("PTL_NS_LANES");
    return !(e && !strcmp(e, "0"));
}

/* Captures the arena's NS5 into g->exec; on failure records why and leaves g eager (returns 0 either way
 * unless a CUDA error outside the capture itself occurred). */
static int ns_capture(struct CUstream_st *stream, struct cublasContext *cublas, const ptl_optim_buffers *b,
                      ptl_ns_graph *g)
{
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t st = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (st != cudaSuccess) {
        snprintf(g->why, sizeof g->why, "cudaStreamBeginCapture: %s", cudaGetErrorString(st));
        g->state = PTL_NSG_FAILED;
        cudaGetLastError();
        return 0;
    }
    int rc = ptl_newton_schulz_arena_cuda(stream, cublas, g->lanes, (uint16_t *)b->ws_bf16, b->tx, b->ta, b->sgtab,
                                          b->nsg);
    st = cudaStreamEndCapture(stream, &graph);
    if (rc != 0 || st != cudaSuccess) {
        snprintf(g->why, sizeof g->why, "capture: %s", rc != 0 ? ptl_error_message() : cudaGetErrorString(st));
        ptl_error_clear();
        if (graph)
            cudaGraphDestroy(graph);
        g->state = PTL_NSG_FAILED;
        cudaGetLastError();
        return 0;
    }
    st = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (st != cudaSuccess) {
        snprintf(g->why, sizeof g->why, "cudaGraphInstantiate: %s", cudaGetErrorString(st));
        g->state = PTL_NSG_FAILED;
        cudaGetLastError();
        return 0;
    }
    g->exec = exec;
    g->state = PTL_NSG_REPLAY;
    return 0;
}

extern "C" int ptl_optim_step_cuda(struct CUstream_st *stream, struct cublasContext *cublas, const ptl_optim_buffers *b,
                                   const ptl_optim_hp *hp, ptl_ns_graph *g)
{
    float *scalars = (float *)b->scalars;
    int has_muon = 0;
    opt_dev_hp d;
    if (hp->ngroups < 1 || hp->ngroups > PTL_OPT_MAX_GROUPS) {
        ptl_set_error(PTL_ERR_VALUE, "optimizer: %d parameter groups (1 to %d supported)", hp->ngroups,
                      PTL_OPT_MAX_GROUPS);
        return -1;
    }
    for (int k = 0; k < hp->ngroups; k++) {
        if (hp->kind[k] < PTL_OPT_SGD || hp->kind[k] > PTL_OPT_ADAMW) {
            ptl_set_error(PTL_ERR_VALUE, "optimizer: group %d has unknown kind %d", k, hp->kind[k]);
            return -1;
        }
        has_muon |= hp->kind[k] == PTL_OPT_MUON;
    }
    d = opt_dev_coefs(hp);
    /* The lanes, made at the first step before anything is written and before the first (eager) run, which sets up
     * their handles' workspaces outside any capture. Where they cannot be made (device memory), the products stay
     * on one stream: the same bits, only slower. */
    if (has_muon && b->nmuon_chunks > 0 && g && g->state == PTL_NSG_EAGER && g->eager_runs == 0 && !g->lanes &&
        lanes_on() && ptl_ns_lanes_create(&g->lanes))
        ptl_error_clear();
    PTL_CHECK(ptl_grad_stats_cuda(stream, b, hp));
    if (has_muon && b->nmuon_chunks > 0) {
        uint16_t *X = (uint16_t *)b->ws_bf16;
        double *mpart = (double *)b->ws_f64 + b->nchunks, *den = mpart + b->nmuon_chunks;
        ptl_launch(muon_momentum_kernel, (unsigned)b->nmuon_chunks, OPT_THREADS, 0, stream, (const float *)b->grads,
                   (float *)b->state1, b->cmuon, b->ptab, scalars, d, X, mpart);
        PTL_LAUNCH_CHECK("muon_momentum_kernel");
        ptl_launch(muon_norm_kernel, (unsigned)((b->nparams + 127) / 128), 128, 0, stream, b->ptab, b->nparams, mpart,
                   den);
        PTL_LAUNCH_CHECK("muon_norm_kernel");
        ptl_launch(muon_div_kernel, (unsigned)b->nmuon_chunks, OPT_THREADS, 0, stream, b->cmuon, b->ptab, scalars, den,
                   X);
        PTL_LAUNCH_CHECK("muon_div_kernel");
        if (g && g->state == PTL_NSG_EAGER && g->eager_runs >= 1)
            PTL_CHECK(ns_capture(stream, cublas, b, g));
        if (g && g->state == PTL_NSG_REPLAY) {
            PTL_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)g->exec, stream));
        } else {
            PTL_CHECK(ptl_newton_schulz_arena_cuda(stream, cublas, g ? g->lanes : NULL, X, b->tx, b->ta, b->sgtab,
                                                   b->nsg));
            if (g)
                g->eager_runs++;
        }
    }
    if (b->nchunks > 0) {
        ptl_launch(optim_update_kernel, (unsigned)b->nchunks, OPT_THREADS, 0, stream, (float *)b->params,
                   (const float *)b->grads, (float *)b->state1, (float *)b->state2, b->call, b->ptab, scalars, d,
                   (const uint16_t *)b->ws_bf16);
        PTL_LAUNCH_CHECK("optim_update_kernel");
    }
    ptl_launch(optim_finish_kernel, 1, 1, 0, stream, scalars, hp->scaler, hp->growth_factor, hp->backoff_factor,
               hp->growth_interval);
    PTL_LAUNCH_CHECK("optim_finish_kernel");
    if (hp->zero_grad && b->n > 0)
        PTL_CUDA_TRY(cudaMemsetAsync(b->grads, 0, sizeof(float) * (size_t)b->n, stream));
    return 0;
fail:
    return -1;
}
