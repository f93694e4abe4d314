/* Element-wise dtype conversion. One element converter (ptl_convert_one) is shared by the CPU loop
 * and the CUDA kernel, so both give the same bits.
 * Rules: to float16/bfloat16 the value first becomes float32 (exact from float32/16/bf16; float64 and
 * 64-bit integers round once to float32, then once more to 16 bits), then rounds to nearest even
 * (csrc/ops/half.h). Float to integer truncates toward zero and saturates; NaN becomes 0. */
#ifndef PTL_OPS_CAST_H
#define PTL_OPS_CAST_H

#include <string.h>

#include "../ptl.h"
#include "fpmath.h"
#include "half.h"

PTL_HD double ptl_load_f64(const void *p, ptl_dtype dt, int64_t i)
{
    switch (dt) {
    case PTL_FLOAT32: return ((const float *)p)[i];
    case PTL_FLOAT64: return ((const double *)p)[i];
    case PTL_FLOAT16: return ptl_bits_to_f32(ptl_f16_to_f32_bits(((const uint16_t *)p)[i]));
    case PTL_BFLOAT16: return ptl_bits_to_f32(ptl_bf16_to_f32_bits(((const uint16_t *)p)[i]));
    case PTL_INT32: return ((const int32_t *)p)[i];
    case PTL_INT64: return (double)((const int64_t *)p)[i];
    case PTL_UINT8: return ((const uint8_t *)p)[i];
    default: return 0;
    }
}

PTL_HD int64_t ptl_saturate_i64(double v, double lo, double hi)
{
    if (v != v)
        return 0;
    if (v <= lo)
        return (int64_t)lo;
    if (v >= hi)
        return (int64_t)hi;
    return (int64_t)v;
}

PTL_HD void ptl_convert_one(void *dst, ptl_dtype ddt, const void *src, ptl_dtype sdt, int64_t i)
{
    if (sdt == PTL_INT64 && ddt == PTL_INT64) { /* beyond 2^53 a trip through double would round */
        ((int64_t *)dst)[i] = ((const int64_t *)src)[i];
        return;
    }
    if ((sdt == PTL_FLOAT32 || sdt == PTL_FLOAT16 || sdt == PTL_BFLOAT16) &&
        (ddt == PTL_FLOAT32 || ddt == PTL_FLOAT16 || ddt == PTL_BFLOAT16)) {
        /* Pure bit manipulation: no float unit touches the value, so NaN payloads survive on both. */
        uint32_t b = sdt == PTL_FLOAT32   ? ((const uint32_t *)src)[i]
                     : sdt == PTL_FLOAT16 ? ptl_f16_to_f32_bits(((const uint16_t *)src)[i])
                                          : ptl_bf16_to_f32_bits(((const uint16_t *)src)[i]);
        if (ddt == PTL_FLOAT32)
            ((uint32_t *)dst)[i] = b;
        else if (ddt == PTL_FLOAT16)
            ((uint16_t *)dst)[i] = ptl_f32_to_f16_bits(b);
        else
            ((uint16_t *)dst)[i] = ptl_f32_to_bf16_bits(b);
        return;
    }
    double v = ptl_load_f64(src, sdt, i);
    switch (ddt) {
    case PTL_FLOAT32: ((float *)dst)[i] = (float)v; break;
    case PTL_FLOAT64: ((double *)dst)[i] = v; break;
    case PTL_FLOAT16: ((uint16_t *)dst)[i] = ptl_f32_to_f16_bits(ptl_f32_to_bits((float)v)); break;
    case PTL_BFLOAT16: ((uint16_t *)dst)[i] = ptl_f32_to_bf16_bits(ptl_f32_to_bits((float)v)); break;
    case PTL_INT32: ((int32_t *)dst)[i] = (int32_t)ptl_saturate_i64(v, -2147483648.0, 2147483647.0); break;
    case PTL_INT64:
        ((int64_t *)dst)[i] = ptl_saturate_i64(v, -9223372036854775808.0, 9223372036854774784.0);
        break;
    case PTL_UINT8: ((uint8_t *)dst)[i] = (uint8_t)ptl_saturate_i64(v, 0.0, 255.0); break;
    default: break;
    }
}

#ifdef __cplusplus
extern "C" {
#endif

void cast_cpu(void *dst, ptl_dtype ddt, const void *src, ptl_dtype sdt, int64_t n);

#ifdef PTL_WITH_CUDA
struct CUstream_st;
int cast_cuda(struct CUstream_st *stream, void *dst, ptl_dtype ddt, const void *src, ptl_dtype sdt, int64_t n);
#endif

#ifdef __cplusplus
}
#endif

#endif
