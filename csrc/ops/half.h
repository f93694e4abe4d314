/* float32 <-> bfloat16 / float16 conversions, round to nearest even, on raw bits (host and device).
 * float16 follows NumPy exactly (overflow to Inf, gradual underflow, NaN payload kept, an all-zero
 * truncated payload becomes 1). bfloat16 NaNs keep sign and top payload bits and are made quiet. */
#ifndef PTL_OPS_HALF_H
#define PTL_OPS_HALF_H

#include "../ptl.h"

PTL_HD uint16_t ptl_f32_to_bf16_bits(uint32_t x)
{
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

PTL_HD uint32_t ptl_bf16_to_f32_bits(uint16_t h) { return (uint32_t)h << 16; }

PTL_HD uint16_t ptl_f32_to_f16_bits(uint32_t f)
{
    uint16_t sign = (uint16_t)((f >> 16) & 0x8000u);
    uint32_t a = f & 0x7fffffffu;
    uint32_t e = a >> 23;
    if (a >= 0x7f800000u) {
        if (a == 0x7f800000u)
            return (uint16_t)(sign | 0x7c00u);
        uint16_t h = (uint16_t)(0x7c00u + ((a & 0x7fffffu) >> 13));
        return (uint16_t)(sign | (h == 0x7c00u ? 0x7c01u : h));
    }
    if (e >= 143) /* >= 2^16: beyond float16 even after rounding */
        return (uint16_t)(sign | 0x7c00u);
    if (e >= 113) { /* normal float16 */
        uint32_t q = ((e - 112) << 10) | ((a & 0x7fffffu) >> 13);
        uint32_t rem = a & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (q & 1u)))
            q++; /* may carry into the exponent, up to Inf: that is the correct rounding */
        return (uint16_t)(sign | q);
    }
    /* subnormal float16 (units of 2^-24) or zero */
    uint32_t shift = 126 - e;
    if (shift > 25)
        return sign;
    uint32_t sig = (a & 0x7fffffu) | 0x800000u;
    uint32_t q = sig >> shift;
    uint32_t rem = sig & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

PTL_HD uint32_t ptl_f16_to_f32_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0) {
        if (m == 0)
            return sign;
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        return sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    if (e == 31)
        return sign | 0x7f800000u | (m << 13);
    return sign | ((e + 112) << 23) | (m << 13);
}

#endif
