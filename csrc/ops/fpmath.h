/* Explicitly rounded float arithmetic for code that must give the same bits on the CPU and the GPU.
 * nvcc contracts a*b+c into one FMA unless told otherwise; the host build uses -ffp-contract=off.
 * Writing every product, sum and quotient through these macros (and fused steps through fmaf, which is
 * correctly rounded on both) makes both backends perform the same IEEE operations in the same order. */
#ifndef PTL_OPS_FPMATH_H
#define PTL_OPS_FPMATH_H

#include <math.h>
#include <string.h>

#include "../ptl.h"

#if defined(__CUDA_ARCH__)
#define PTL_FMUL(a, b) __fmul_rn((a), (b))
#define PTL_FADD(a, b) __fadd_rn((a), (b))
#define PTL_FSUB(a, b) __fsub_rn((a), (b))
#define PTL_FDIV(a, b) __fdiv_rn((a), (b))
#define PTL_FSQRT(a) __fsqrt_rn(a)
#else
#define PTL_FMUL(a, b) ((float)(a) * (float)(b))
#define PTL_FADD(a, b) ((float)(a) + (float)(b))
#define PTL_FSUB(a, b) ((float)(a) - (float)(b))
#define PTL_FDIV(a, b) ((float)(a) / (float)(b))
#define PTL_FSQRT(a) sqrtf(a)
#endif

PTL_HD float ptl_bits_to_f32(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

PTL_HD uint32_t ptl_f32_to_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

#endif
