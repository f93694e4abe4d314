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

#define NS_THREADS 256

__device__ __forceinline__ float ns_ld(const uint16_t *p, int64_t i) { return ptl_bits_to_f32(ptl_bf16_to_f32_bits(p[i])); }
__device__ __forceinline__ uint16_t ns_bf(float v) { return ptl_f32_to_bf16_bits(ptl_f32_to_bits(v)); }

static unsigned ns_blocks(int64_t n)
{
    int64_t b = (n + NS_THREADS - 1) / NS_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 8192 ? 8192 : b);
}

extern "C" int ptl_newton_schulz_arena_cuda(struct CUstream_st *stream, struct cublasContext *cublas, uint16_t *ws,
                                            int64_t tx, int64_t ta, const int64_t *sgtab, int64_t nsg)
{
    uint16_t *X = ws, *P = ws + tx, *A = P + tx, *BM = A + ta;
    const float one = 1.0f, zero = 0.0f;
    const float ka = (float)PTL_NS_A, kb = (float)PTL_NS_B, kc = (float)PTL_NS_C;
    if (nsg == 0)
        return 0;
    for (int it = 0; it < PTL_NS_STEPS; it++) {
        for (int64_t s = 0; s < nsg; s++) { /* A = X X^T */
            const int64_t *e = sgtab + 7 * s;
            int r = (int)e[0], c = (int)e[1], cnt = (int)e[2];
            PTL_CUBLAS_TRY(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, r, r, c, &one, X + e[3],
                                                      CUDA_R_16BF, c, e[5], X + e[3], CUDA_R_16BF, c, e[5], &zero,
                                                      A + e[4], CUDA_R_16BF, r, e[6], cnt, CUBLAS_COMPUTE_32F,
                                                      CUBLAS_GEMM_DEFAULT));
        }
        /* Bm = b A + c A A: the GEMM's beta term reads the copy of A it overwrites (baddbmm) */
        PTL_CUDA_TRY(cudaMemcpyAsync(BM, A, (size_t)ta * sizeof *A, cudaMemcpyDeviceToDevice, stream));
        for (int64_t s = 0; s < nsg; s++) {
            const int64_t *e = sgtab + 7 * s;
            int r = (int)e[0], cnt = (int)e[2];
            PTL_CUBLAS_TRY(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, r, r, r, &kc, A + e[4],
                                                      CUDA_R_16BF, r, e[6], A + e[4], CUDA_R_16BF, r, e[6], &kb,
                                                      BM + e[4], CUDA_R_16BF, r, e[6], cnt, CUBLAS_COMPUTE_32F,
                                                      CUBLAS_GEMM_DEFAULT));
        }
        /* X = a X + Bm X (row-major), through P */
        PTL_CUDA_TRY(cudaMemcpyAsync(P, X, (size_t)tx * sizeof *X, cudaMemcpyDeviceToDevice, stream));
        for (int64_t s = 0; s < nsg; s++) {
            const int64_t *e = sgtab + 7 * s;
            int r = (int)e[0], c = (int)e[1], cnt = (int)e[2];
            PTL_CUBLAS_TRY(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, c, r, r, &one, X + e[3],
                                                      CUDA_R_16BF, c, e[5], BM + e[4], CUDA_R_16BF, r, e[6], &ka,
                                                      P + e[3], CUDA_R_16BF, c, e[5], cnt, CUBLAS_COMPUTE_32F,
                                                      CUBLAS_GEMM_DEFAULT));
        }
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
        PTL_CHECK(ptl_newton_schulz_arena_cuda(stream, cublas, ws, batch * xs, batch * as, sg, 1));
        ptl_launch(ns_store_kernel, grid, NS_THREADS, 0, stream, ws, out, rows, cols, xs);
        PTL_LAUNCH_CHECK("ns_store_kernel");
    }
    return 0;
fail:
    return -1;
}
