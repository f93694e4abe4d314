/* Attention core (CUDA), the semantics and layouts of ../nn/attention.h. The products run on cuBLAS
 * (strided-batched over the heads of one image, float32 accumulation, no TF32), the softmax and its
 * backward are our kernels (one block per row, fixed-order tree reductions).
 *
 * cuBLAS is column-major: a row-major (r x c) matrix with leading dimension ld is its transpose in
 * column-major. With Qc, Kc, Vc the column-major (d x n) views of q, k, v inside qkv (ld = cq) and P
 * the saved softmax (row i = query i, ld n), per head:
 *   S^T = Kc^T Qc           (attn, scaled by kd^-0.5)       O^T = Vc P^T        (o, ld dim)
 *   dV^T = dO^T P           dP^T = Vc^T dO^T (float32)      dZ = P (dP - r) * scale (our kernel)
 *   dQ^T = Kc dZ^T          dK^T = Qc dZ
 * The backward keeps dP (float32) and dZ (activation dtype) for one image in the layer scratch. */
#include <math.h>

#include "../nn/attention.h"
#include "layers_common.cuh"

#define SM_THREADS 256

__device__ __forceinline__ float block_reduce(float v, float *sh, int is_max)
{
    const int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int half = SM_THREADS / 2; half > 0; half /= 2) {
        if (t < half)
            sh[t] = is_max ? fmaxf(sh[t], sh[t + half]) : sh[t] + sh[t + half];
        __syncthreads();
    }
    const float r = sh[0];
    __syncthreads();
    return r;
}

/* In place: each row of p (rows x n) becomes softmax of itself. */
template <typename T>
__global__ void softmax_rows_kernel(int n, T *p)
{
    ptl_wait_prior();
    __shared__ float sh[SM_THREADS];
    T *row = p + (int64_t)blockIdx.x * n;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n; j += SM_THREADS)
        mx = fmaxf(mx, ptl_ld(row + j));
    mx = block_reduce(mx, sh, 1);
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += SM_THREADS)
        s += expf(ptl_ld(row + j) - mx);
    s = block_reduce(s, sh, 0);
    const float inv = 1.0f / s;
    for (int j = threadIdx.x; j < n; j += SM_THREADS)
        ptl_st(row + j, expf(ptl_ld(row + j) - mx) * inv);
}

/* dZ_ij = P_ij (dP_ij - r_i) * scale, r_i = sum_j P_ij dP_ij. */
template <typename T>
__global__ void softmax_bwd_kernel(int n, float scale, const T *P, const float *dP, T *dZ)
{
    ptl_wait_prior();
    __shared__ float sh[SM_THREADS];
    const int64_t off = (int64_t)blockIdx.x * n;
    float r = 0.0f;
    for (int j = threadIdx.x; j < n; j += SM_THREADS)
        r += ptl_ld(P + off + j) * dP[off + j];
    r = block_reduce(r, sh, 0);
    for (int j = threadIdx.x; j < n; j += SM_THREADS)
        ptl_st(dZ + off + j, ptl_ld(P + off + j) * (dP[off + j] - r) * scale);
}

/* dst (b, n, dim) <-> the v slots of qkv (b, n, cq): to_dense copies v out, else dv goes into dqkv. */
template <typename T>
__global__ void v_copy_kernel(int64_t total, int heads, int kd, int hd, const T *src, T *dst, int to_dense)
{
    ptl_wait_prior();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int dim = heads * hd, per = 2 * kd + hd, cq = heads * per;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int64_t row = i / dim;
        const int j = (int)(i % dim), h = j / hd, d = j % hd;
        const int64_t q = row * cq + (int64_t)h * per + 2 * kd + d;
        if (to_dense)
            dst[i] = src[q];
        else
            dst[q] = src[i];
    }
}

static cudaDataType cuda_type(ptl_dtype dt)
{
    return dt == PTL_FLOAT32 ? CUDA_R_32F : dt == PTL_BFLOAT16 ? CUDA_R_16BF : CUDA_R_16F;
}

static int check(const char *fn, ptl_dtype dt, int b, int n, int heads, int kd, int hd)
{
    if (dt != PTL_FLOAT32 && dt != PTL_BFLOAT16 && dt != PTL_FLOAT16)
        return ptl_set_error(PTL_ERR_TYPE, "%s: dtype %s is not supported on CUDA (float32, bfloat16 or float16)", fn,
                             ptl_dtype_name(dt));
    if (b <= 0 || n <= 0 || heads <= 0 || kd <= 0 || hd <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "%s: sizes must be positive (b=%d n=%d heads=%d kd=%d hd=%d)", fn, b, n,
                             heads, kd, hd);
    return 0;
}

/* One strided-batched GEMM over the heads; element offsets and strides in elements. float32 products
 * use CUBLAS_COMPUTE_32F_PEDANTIC so that no handle setting can turn TF32 on. */
static int gemm(ptl_cuda_ctx *ctx, ptl_dtype dt, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                float alpha, const void *A, int lda, long long sa, const void *B, int ldb, long long sb, float beta,
                void *C, cudaDataType ctype, int ldc, long long sc, int batch)
{
    const cudaDataType t = cuda_type(dt);
    const cublasComputeType_t comp = dt == PTL_FLOAT32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    PTL_CUBLAS_TRY(cublasGemmStridedBatchedEx(ctx->cublas, ta, tb, m, n, k, &alpha, A, t, lda, sa, B, t, ldb, sb,
                                              &beta, C, ctype, ldc, sc, batch, comp, CUBLAS_GEMM_DEFAULT));
    return 0;
fail:
    return -1;
}

extern "C" size_t ptl_attention_cuda_scratch_bytes(ptl_dtype dt, int n, int heads)
{
    if (n <= 0 || heads <= 0)
        return 0;
    const size_t nn = (size_t)heads * n * n;
    /* dP (float32), then dZ (activation dtype), 256-byte aligned */
    return ((nn * sizeof(float) + 255) & ~(size_t)255) + nn * ptl_dtype_size(dt);
}

extern "C" int ptl_attention_forward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int b, int n, int heads, int kd, int hd,
                                          const void *qkv, void *attn, void *o, void *v)
{
    if (check("attention_forward_cuda", dt, b, n, heads, kd, hd))
        return -1;
    {
        const int per = 2 * kd + hd, cq = heads * per, dim = heads * hd;
        const size_t es = ptl_dtype_size(dt);
        const long long nn = (long long)n * n;
        const float scale = (float)(1.0 / sqrt((double)kd));
        const char *q = (const char *)qkv;
        char *a = (char *)attn, *out = (char *)o;
        for (int bi = 0; bi < b; bi++) {
            const char *base = q + (size_t)bi * n * cq * es;
            char *ab = a + (size_t)bi * heads * nn * es;
            if (gemm(ctx, dt, CUBLAS_OP_T, CUBLAS_OP_N, n, n, kd, scale, base + kd * es, cq, per, base, cq, per, 0.0f,
                     ab, cuda_type(dt), n, nn, heads))
                return -1;
        }
        PTL_LAYER_DISPATCH("attention_forward_cuda", dt,
                           ptl_launch(softmax_rows_kernel<T>, (unsigned)((int64_t)b * heads * n), SM_THREADS, 0,
                                      ctx->stream, n, (T *)attn));
        PTL_LAUNCH_CHECK("softmax_rows_kernel");
        for (int bi = 0; bi < b; bi++) {
            const char *base = q + (size_t)bi * n * cq * es;
            const char *ab = a + (size_t)bi * heads * nn * es;
            if (gemm(ctx, dt, CUBLAS_OP_N, CUBLAS_OP_N, hd, n, n, 1.0f, base + 2 * kd * es, cq, per, ab, n, nn, 0.0f,
                     out + (size_t)bi * n * dim * es, cuda_type(dt), dim, hd, heads))
                return -1;
        }
        if (v) {
            const int64_t total = (int64_t)b * n * dim;
            PTL_LAYER_DISPATCH("attention_forward_cuda", dt,
                               ptl_launch(v_copy_kernel<T>, ptl_grid_for(total, 256), 256, 0, ctx->stream, total, heads,
                                          kd, hd, (const T *)qkv, (T *)v, 1));
            PTL_LAUNCH_CHECK("v_copy_kernel");
        }
    }
    return 0;
fail:
    return -1;
}

extern "C" int ptl_attention_backward_cuda(ptl_cuda_ctx *ctx, ptl_dtype dt, int b, int n, int heads, int kd, int hd,
                                           const void *qkv, const void *attn, const void *d_o, const void *dv,
                                           void *dqkv)
{
    void *scratch;
    if (check("attention_backward_cuda", dt, b, n, heads, kd, hd))
        return -1;
    if (ptl_layers_cuda_scratch(ctx, ptl_attention_cuda_scratch_bytes(dt, n, heads), &scratch))
        return -1;
    {
        const int per = 2 * kd + hd, cq = heads * per, dim = heads * hd;
        const size_t es = ptl_dtype_size(dt);
        const long long nn = (long long)n * n;
        const float scale = (float)(1.0 / sqrt((double)kd));
        float *dP = (float *)scratch;
        char *dZ = (char *)scratch + (((size_t)heads * nn * sizeof(float) + 255) & ~(size_t)255);
        const char *q = (const char *)qkv, *a = (const char *)attn, *go = (const char *)d_o;
        char *dq = (char *)dqkv;
        if (dv) {
            const int64_t total = (int64_t)b * n * dim;
            PTL_LAYER_DISPATCH("attention_backward_cuda", dt,
                               ptl_launch(v_copy_kernel<T>, ptl_grid_for(total, 256), 256, 0, ctx->stream, total, heads,
                                          kd, hd, (const T *)dv, (T *)dqkv, 0));
            PTL_LAUNCH_CHECK("v_copy_kernel");
        }
        for (int bi = 0; bi < b; bi++) {
            const char *base = q + (size_t)bi * n * cq * es;
            const char *ab = a + (size_t)bi * heads * nn * es;
            const char *gob = go + (size_t)bi * n * dim * es;
            char *dbase = dq + (size_t)bi * n * cq * es;
            /* dV^T = dO^T P (+ the extra dv already in place) */
            if (gemm(ctx, dt, CUBLAS_OP_N, CUBLAS_OP_T, hd, n, n, 1.0f, gob, dim, hd, ab, n, nn, dv ? 1.0f : 0.0f,
                     dbase + 2 * kd * es, cuda_type(dt), cq, per, heads))
                return -1;
            /* dP^T = Vc^T dO^T, float32 */
            if (gemm(ctx, dt, CUBLAS_OP_T, CUBLAS_OP_N, n, n, hd, 1.0f, base + 2 * kd * es, cq, per, gob, dim, hd, 0.0f,
                     dP, CUDA_R_32F, n, nn, heads))
                return -1;
            PTL_LAYER_DISPATCH("attention_backward_cuda", dt,
                               ptl_launch(softmax_bwd_kernel<T>, (unsigned)((int64_t)heads * n), SM_THREADS, 0,
                                          ctx->stream, n, scale, (const T *)ab, dP, (T *)dZ));
            PTL_LAUNCH_CHECK("softmax_bwd_kernel");
            /* dQ^T = Kc dZ^T ; dK^T = Qc dZ  (dZ row-major = dZ^T column-major) */
            if (gemm(ctx, dt, CUBLAS_OP_N, CUBLAS_OP_N, kd, n, n, 1.0f, base + kd * es, cq, per, dZ, n, nn, 0.0f, dbase,
                     cuda_type(dt), cq, per, heads))
                return -1;
            if (gemm(ctx, dt, CUBLAS_OP_N, CUBLAS_OP_T, kd, n, n, 1.0f, base, cq, per, dZ, n, nn, 0.0f,
                     dbase + kd * es, cuda_type(dt), cq, per, heads))
                return -1;
        }
    }
    return 0;
fail:
    return -1;
}
