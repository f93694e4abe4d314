/* Warp-level tensor-core helpers shared by our own GEMM-shaped kernels (conv2d_bn.cu, conv2d_narrow.cu): shared-
 * memory 8x8 matrix loads (ldmatrix) and the 16x8x16 multiply-add with float32 accumulation (mma.sync), for
 * bfloat16 and float16 operands. Fragment layouts as in PTX's "Matrix Fragments for mma.m16n8k16". */
#ifndef PTL_CUDA_MMA_CUH
#define PTL_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* Four 8x8 matrices of 16-bit elements: lanes 8q .. 8q + 7 give the addresses of matrix q's rows (16 bytes each);
 * lane l receives element (l / 4, 2 (l % 4) + {0, 1}) of each in r[q], or with trans of its transpose. */
static __device__ __forceinline__ void ldmatrix_x4(uint32_t *r, const void *p)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t *r, const void *p)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* c (16x8, float32) += a (16x16, row-major) * b (16x8, column-major). */
template <typename T>
__device__ __forceinline__ void mma_16816(float *c, const uint32_t *a, const uint32_t *b);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float *c, const uint32_t *a, const uint32_t *b)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float *c, const uint32_t *a, const uint32_t *b)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#endif
