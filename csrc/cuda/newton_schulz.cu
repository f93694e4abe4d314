/* Newton-Schulz quintic orthogonalisation in bfloat16 through cuBLAS (8.4.190's
 * zeropower_via_newtonschulz5); the CPU reference is csrc/optim/newton_schulz.c (with bf16 = 1 it rounds
 * at the same points).
 *
 * Same-shape matrices are batched: each product is one cublasGemmStridedBatchedEx per shape (bf16 in and
 * out, float32 accumulation). The stages round to bfloat16 once each, like 8.4.190's bmm and baddbmm:
 * A = X X^T; Bm = b A + c A A (GEMM with beta on a copy of A); X = a X + Bm X (GEMM with beta on a copy
 * of X). Row-major matrices are handed to column-major cuBLAS as their transposes. */
#include "../optim/optim.h"
#include "device.h"
#include "launch.cuh"

#include <stdlib.h>

#define NS_THREADS 256

__device__ __forceinline__ float ns_ld(const uint16_t *p, int64_t i) { return ptl_bits_to_f32(ptl_bf16_to_f32_bits(p[i])); }
__device__ __forceinline__ uint16_t ns_bf(float v) { return ptl_f32_to_bf16_bits(ptl_f32_to_bits(v)); }

static unsigned ns_blocks(int64_t n)
{
    int64_t b = (n + NS_THREADS - 1) / NS_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 8192 ? 8192 : b);
}

/* One product of an NS5 iteration for shape group e (a row of sgtab) on (cublas, its stream): stage 0 A = X X^T;
 * 1 Bm = b A + c A A (the beta term reads the copy of A it overwrites, as baddbmm); 2 P = a X + Bm X (row-major,
 * P holding a copy of X). */
static int ns_product(cublasHandle_t cublas, int stage, const int64_t *e, uint16_t *X, uint16_t *P, uint16_t *A,
                      uint16_t *BM)
{
    const float one = 1.0f, zero = 0.0f;
    const float ka = (float)PTL_NS_A, kb = (float)PTL_NS_B, kc = (float)PTL_NS_C;
    const int r = (int)e[0], c = (int)e[1], cnt = (int)e[2];
    if (stage == 0)
        PTL_CUBLAS_TRY(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, r, r, c, &one, X + e[3],
                                                  CUDA_R_16BF, c, e[5], X + e[3], CUDA_R_16BF, c, e[5], &zero, A + e[4],
                                                  CUDA_R_16BF, r, e[6], cnt, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else if (stage == 1)
        PTL_CUBLAS_TRY(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, r, r, r, &kc, A + e[4],
                                                  CUDA_R_16BF, r, e[6], A + e[4], CUDA_R_16BF, r, e[6], &kb, BM + e[4],
                                                  CUDA_R_16BF, r, e[6], cnt, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        PTL_CUBLAS_TRY(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, c, r, r, &one, X + e[3],
                                                  CUDA_R_16BF, c, e[5], BM + e[4], CUDA_R_16BF, r, e[6], &ka, P + e[3],
                                                  CUDA_R_16BF, c, e[5], cnt, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
fail:
    return -1;
}

/* Lanes for the arena's NS5. Each of its 15 stages (three products an iteration, five iterations) is one product
 * per shape group, independent of the others', so with lanes the groups' products of a stage run on
 * PTL_NS_LANES streams of their own, each with its own cuBLAS handle (a handle's workspace serves one stream at a
 * time), between the stages' copies on the caller's stream: in a graph, a stage takes about its largest product
 * instead of the sum of yolo26n's ~40. The same products of the same data as on one stream, and a new handle
 * chooses the kernels the caller's does, so the bits are those of one stream. */
struct ptl_ns_lanes {
    int device;
    cudaStream_t s[PTL_NS_LANES];
    cublasHandle_t h[PTL_NS_LANES];
    cudaEvent_t fork, join[PTL_NS_LANES];
};

extern "C" void ptl_ns_lanes_destroy(ptl_ns_lanes *l)
{
    if (!l)
        return;
    cudaSetDevice(l->device);
    for (int i = 0; i < PTL_NS_LANES; i++) {
        if (l->s[i])
            cudaStreamSynchronize(l->s[i]);
        if (l->h[i])
            cublasDestroy(l->h[i]);
        if (l->join[i])
            cudaEventDestroy(l->join[i]);
        if (l->s[i])
            cudaStreamDestroy(l->s[i]);
    }
    if (l->fork)
        cudaEventDestroy(l->fork);
    free(l);
}

extern "C" int ptl_ns_lanes_create(ptl_ns_lanes **out)
{
    int least = 0, greatest = 0;
    ptl_ns_lanes *l = (ptl_ns_lanes *)calloc(1, sizeof *l);
    *out = NULL;
    if (!l)
        return ptl_set_error(PTL_ERR_MEMORY, "newton_schulz: out of host memory for its lanes");
    PTL_CUDA_TRY(cudaGetDevice(&l->device));
    /* at the step's own priority (device.c puts the device's queue at the greatest) */
    PTL_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    PTL_CUDA_TRY(cudaEventCreateWithFlags(&l->fork, cudaEventDisableTiming));
    for (int i = 0; i < PTL_NS_LANES; i++) {
        PTL_CUDA_TRY(cudaStreamCreateWithPriority(&l->s[i], cudaStreamNonBlocking, greatest));
        PTL_CUDA_TRY(cudaEventCreateWithFlags(&l->join[i], cudaEventDisableTiming));
        PTL_CUBLAS_TRY(cublasCreate(&l->h[i]));
        PTL_CUBLAS_TRY(cublasSetStream(l->h[i], l->s[i]));
    }
    *out = l;
    return 0;
fail:
    ptl_ns_lanes_destroy(l);
    return -1;
}

extern "C" int ptl_newton_schulz_arena_cuda(struct CUstream_st *stream, struct cublasContext *cublas,
                                            ptl_ns_lanes *lanes, uint16_t *ws, int64_t tx, int64_t ta,
                                            const int64_t *sgtab, int64_t nsg)
{
    uint16_t *X = ws, *P = ws + tx, *A = P + tx, *BM = A + ta;
    if (nsg == 0)
        return 0;
    for (int it = 0; it < PTL_NS_STEPS; it++)
        for (int stage = 0; stage < 3; stage++) {
            if (lanes) {
                PTL_CUDA_TRY(cudaEventRecord(lanes->fork, stream));
                for (int i = 0; i < PTL_NS_LANES; i++)
                    PTL_CUDA_TRY(cudaStreamWaitEvent(lanes->s[i], lanes->fork, 0));
            }
            for (int64_t g = 0; g < nsg; g++)
                PTL_CHECK(ns_product(lanes ? lanes->h[g % PTL_NS_LANES] : cublas, stage, sgtab + 7 * g, X, P, A, BM));
            if (lanes)
                for (int i = 0; i < PTL_NS_LANES; i++) {
                    PTL_CUDA_TRY(cudaEventRecord(lanes->join[i], lanes->s[i]));
                    PTL_CUDA_TRY(cudaStreamWaitEvent(stream, lanes->join[i], 0));
                }
            /* Bm's beta term and P's read copies of A and X; X takes P's result */
            if (stage == 0)
                PTL_CUDA_TRY(cudaMemcpyAsync(BM, A, (size_t)ta * sizeof *A, cudaMemcpyDeviceToDevice, stream));
            else if (stage == 1)
                PTL_CUDA_TRY(cudaMemcpyAsync(P, X, (size_t)tx * sizeof *X, cudaMemcpyDeviceToDevice, stream));
            else
                PTL_CUDA_TRY(cudaMemcpyAsync(X, P, (size_t)tx * sizeof *X, cudaMemcpyDeviceToDevice, stream));
        }
    return 0;
fail:
    return -1;
}

/* Standalone path: float32 [batch][rows][cols] -> bf16 wide-orientation arena, per-matrix normalisation. */
__global__ void ns_load_kernel(const float *x, uint16_t *X, int64_t rows, int64_t cols, int64_t xs)
{
    ptl_wait_prior();
    int64_t b = blockIdx.y, n = rows * cols;
    const float *xb = x + b * n;
    uint16_t *Xb = X + b * xs;
    int tall = rows > cols;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / cols, j = e % cols;
        Xb[tall ? j * rows + i : e] = ns_bf(xb[e]);
    }
}

__global__ void ns_norm_kernel(const uint16_t *X, int64_t n, int64_t xs, float *den)
{
    ptl_wait_prior();
    __shared__ double sh[NS_THREADS];
    const uint16_t *Xb = X + (int64_t)blockIdx.x * xs;
    double acc = 0;
    for (int64_t i = threadIdx.x; i < n; i += NS_THREADS) {
        double v = ns_ld(Xb, i);
        acc += v * v;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = NS_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float norm = ptl_round_bf16((float)sqrt(sh[0]));
        den[blockIdx.x] = ptl_round_bf16(__fadd_rn(norm, (float)PTL_NS_EPS));
    }
}

__global__ void ns_div_kernel(uint16_t *X, int64_t n, int64_t xs, const float *den)
{
    ptl_wait_prior();
    int64_t b = blockIdx.y;
    uint16_t *Xb = X + b * xs;
    float d = den[b];
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
        Xb[e] = ns_bf(__fdiv_rn(ns_ld(Xb, e), d));
}

__global__ void ns_store_kernel(const uint16_t *X, float *out, int64_t rows, int64_t cols, int64_t xs)
{
    ptl_wait_prior();
    int64_t b = blockIdx.y, n = rows * cols;
    const uint16_t *Xb = X + b * xs;
    float *ob = out + b * n;
    int tall = rows > cols;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / cols, j = e % cols;
        ob[e] = ns_ld(Xb, tall ? j * rows + i : e);
    }
}

extern "C" int ptl_newton_schulz_cuda(struct CUstream_st *stream, struct cublasContext *cublas, const float *x,
                                      float *out, int64_t batch, int64_t rows, int64_t cols, uint16_t *ws, float *norms)
{
    int64_t r = rows < cols ? rows : cols, c = rows < cols ? cols : rows, n = rows * cols;
    int64_t xs = (n + PTL_NS_ALIGN - 1) / PTL_NS_ALIGN * PTL_NS_ALIGN;
    int64_t as = (r * r + PTL_NS_ALIGN - 1) / PTL_NS_ALIGN * PTL_NS_ALIGN;
    int64_t sg[7] = {r, c, batch, 0, 0, xs, as};
    if (batch == 0)
        return 0;
    if (batch > 65535) {
        ptl_set_error(PTL_ERR_VALUE, "newton_schulz: at most 65535 matrices per call, got %lld", (long long)batch);
        return -1;
    }
    {
        dim3 grid(ns_blocks(n) > 64 ? 64 : ns_blocks(n), (unsigned)batch);
        ptl_launch(ns_load_kernel, grid, NS_THREADS, 0, stream, x, ws, rows, cols, xs);
        PTL_LAUNCH_CHECK("ns_load_kernel");
        ptl_launch(ns_norm_kernel, (unsigned)batch, NS_THREADS, 0, stream, ws, n, xs, norms);
        PTL_LAUNCH_CHECK("ns_norm_kernel");
        ptl_launch(ns_div_kernel, grid, NS_THREADS, 0, stream, ws, n, xs, norms);
        PTL_LAUNCH_CHECK("ns_div_kernel");
        PTL_CHECK(ptl_newton_schulz_arena_cuda(stream, cublas, NULL, ws, batch * xs, batch * as, sg, 1));
        ptl_launch(ns_store_kernel, grid, NS_THREADS, 0, stream, ws, out, rows, cols, xs);
        PTL_LAUNCH_CHECK("ns_store_kernel");
    }
    return 0;
fail:
    return -1;
}
