/* Shared host/device math of the detection objective (spec §2, §3): CIoU and its gradient, sigmoid,
 * the task-aligned metric, BCE, the STAL candidate box. One formula for both backends:
 *   obj_f_*  float32 (CPU reference for float32 outputs, and the CUDA kernels)
 *   obj_d_*  float64 (CPU only; finite-difference tests and the float64 reference path). */
#ifndef PTL_OBJECTIVE_MATH_H
#define PTL_OBJECTIVE_MATH_H

#include <math.h>

#include "../ops/fpmath.h"
#include "../ptl.h"

#define PTL_OBJ_4_PI2 0.40528473456935108578 /* 4 / pi^2 */
/* STAL: GT sides under this many pixels are widened to it for the candidate test (the assigner's
 * stride_val = strides[1] in 8.4.190; spec §3.2 widened sides under 8 to 16). */
#define PTL_OBJ_STAL_SIDE 16

/* float32 exp and atan from IEEE multiplies and adds only (Cephes' polynomials), so the CPU and the
 * GPU get the same bits: libm's atanf/expf and CUDA's differ by an ulp here and there, and the
 * assigner's u^6 turns such an ulp into near-tie flips between backends. Accuracy: a few ulp. */
PTL_HD float obj_pow2f(int n)
{
    return ptl_bits_to_f32((uint32_t)(n + 127) << 23);
}

PTL_HD float obj_expf(float x)
{
    if (x != x)
        return x;
    if (x > 88.72283905206835f)
        return INFINITY;
    if (x < -103.97208f)
        return 0.0f;
    float fn = floorf(PTL_FADD(PTL_FMUL(x, 1.44269504088896341f), 0.5f));
    int n = (int)fn;
    float r = PTL_FSUB(PTL_FSUB(x, PTL_FMUL(fn, 0.693359375f)), PTL_FMUL(fn, -2.12194440e-4f));
    float p = 1.9875691500e-4f;
    p = PTL_FADD(PTL_FMUL(p, r), 1.3981999507e-3f);
    p = PTL_FADD(PTL_FMUL(p, r), 8.3334519073e-3f);
    p = PTL_FADD(PTL_FMUL(p, r), 4.1665795894e-2f);
    p = PTL_FADD(PTL_FMUL(p, r), 1.6666665459e-1f);
    p = PTL_FADD(PTL_FMUL(p, r), 5.0000001201e-1f);
    float y = PTL_FADD(PTL_FADD(PTL_FMUL(PTL_FMUL(p, r), r), r), 1.0f);
    int h = n / 2;
    return PTL_FMUL(PTL_FMUL(y, obj_pow2f(h)), obj_pow2f(n - h));
}

PTL_HD float obj_atanf(float x)
{
    if (x != x)
        return x;
    float sign = x < 0 ? -1.0f : 1.0f;
    float a = x < 0 ? -x : x, y0 = 0.0f;
    if (a > 2.414213562373095f) {
        y0 = 1.5707963267948966f;
        a = PTL_FDIV(-1.0f, a);
    } else if (a > 0.4142135623730950f) {
        y0 = 0.7853981633974483f;
        a = PTL_FDIV(PTL_FSUB(a, 1.0f), PTL_FADD(a, 1.0f));
    }
    float z = PTL_FMUL(a, a);
    float p = 8.05374449538e-2f;
    p = PTL_FSUB(PTL_FMUL(p, z), 1.38776856032e-1f);
    p = PTL_FADD(PTL_FMUL(p, z), 1.99777106478e-1f);
    p = PTL_FSUB(PTL_FMUL(p, z), 3.33329491539e-1f);
    float y = PTL_FADD(PTL_FMUL(PTL_FMUL(p, z), a), a);
    return PTL_FMUL(sign, PTL_FADD(y0, y));
}

#define OBJ_MIN(a, b) ((a) < (b) ? (a) : (b))
#define OBJ_MAX(a, b) ((a) > (b) ? (a) : (b))

#define OBJ_T float
#define OBJ_FN(n) obj_f_##n
#define OBJ_MUL(a, b) PTL_FMUL(a, b)
#define OBJ_ADD(a, b) PTL_FADD(a, b)
#define OBJ_SUB(a, b) PTL_FSUB(a, b)
#define OBJ_DIV(a, b) PTL_FDIV(a, b)
#define OBJ_SQRT(a) PTL_FSQRT(a)
#define OBJ_EXP(a) obj_expf(a)
#define OBJ_ATAN(a) obj_atanf(a)
#define OBJ_LOG1P(a) log1pf(a)
#include "objective_tmpl.h"

#ifndef __CUDACC__
#define OBJ_T double
#define OBJ_FN(n) obj_d_##n
#define OBJ_MUL(a, b) ((a) * (b))
#define OBJ_ADD(a, b) ((a) + (b))
#define OBJ_SUB(a, b) ((a) - (b))
#define OBJ_DIV(a, b) ((a) / (b))
#define OBJ_SQRT(a) sqrt(a)
#define OBJ_EXP(a) exp(a)
#define OBJ_ATAN(a) atan(a)
#define OBJ_LOG1P(a) log1p(a)
#include "objective_tmpl.h"
#endif

#endif
