/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), host and device.
 *
 * ptl's streams: a generator is (seed, offset). Draw j of a request that starts at `offset` comes from
 * the 128-bit block philox(key = seed, counter = offset + j/4), word j%4; a request of n draws
 * consumes ceil(n/4) blocks, and the caller advances its offset by that many. Every consumer of
 * randomness (fills, initialisation, augmentation) derives its numbers this way, so results depend
 * only on (seed, offset), never on thread count or device. */
#ifndef PTL_OPS_PHILOX_H
#define PTL_OPS_PHILOX_H

#include "../ptl.h"
#include "fpmath.h"

typedef struct {
    uint32_t v[4];
} ptl_philox_block;

PTL_HD void ptl_philox_mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo)
{
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

PTL_HD ptl_philox_block ptl_philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                          uint32_t k1)
{
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, lo0, hi1, lo1;
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        ptl_philox_mulhilo(0xD2511F53u, c0, &hi0, &lo0);
        ptl_philox_mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    ptl_philox_block out = {{c0, c1, c2, c3}};
    return out;
}

/* The block of ptl's stream (seed, block index). */
PTL_HD ptl_philox_block ptl_philox_at(uint64_t seed, uint64_t block)
{
    return ptl_philox4x32_10((uint32_t)block, (uint32_t)(block >> 32), 0, 0, (uint32_t)seed, (uint32_t)(seed >> 32));
}

/* Uniform float in [0, 1) from the top 24 bits (exact in float). */
PTL_HD float ptl_u32_to_unit(uint32_t x) { return (float)(x >> 8) * 5.9604644775390625e-08f; }

/* Natural log for x in (0, 1] (normals only need that range): x = m * 2^e with m in [sqrt(1/2), sqrt(2)),
 * log m = 2 atanh(s), s = (m - 1)/(m + 1), odd series to s^11 (|s| < 0.172: error below 1e-9). */
PTL_HD float ptl_logf_unit(float x)
{
    uint32_t b = ptl_f32_to_bits(x);
    int e = (int)((b >> 23) & 0xff) - 127;
    uint32_t mb = (b & 0x7fffffu) | 0x3f800000u;
    if (mb > 0x3fb504f3u) { /* m > sqrt(2): halve it */
        mb -= 0x00800000u;
        e += 1;
    }
    float m = ptl_bits_to_f32(mb);
    float s = PTL_FDIV(PTL_FSUB(m, 1.0f), PTL_FADD(m, 1.0f));
    float z = PTL_FMUL(s, s);
    float p = fmaf(z, 1.0f / 11.0f, 1.0f / 9.0f);
    p = fmaf(z, p, 1.0f / 7.0f);
    p = fmaf(z, p, 1.0f / 5.0f);
    p = fmaf(z, p, 1.0f / 3.0f);
    p = fmaf(z, p, 1.0f);
    float logm = PTL_FMUL(PTL_FMUL(2.0f, s), p);
    return fmaf((float)e, 0.693147180559945f, logm);
}

/* sin and cos of 2*pi*u for u in [0, 1): quadrant from 4u (exact), Taylor series on [0, pi/2). */
PTL_HD void ptl_sincos_2pi(float u, float *s_out, float *c_out)
{
    float t = PTL_FMUL(u, 4.0f);
    int q = (int)t;
    float th = PTL_FMUL(PTL_FSUB(t, (float)q), 1.57079632679489662f);
    float z = PTL_FMUL(th, th);
    float s = fmaf(z, 1.6059043836821613e-10f, -2.5052108385441720e-08f); /* 1/13!, -1/11! */
    s = fmaf(z, s, 2.7557319223985893e-06f);
    s = fmaf(z, s, -1.9841269841269841e-04f);
    s = fmaf(z, s, 8.3333333333333333e-03f);
    s = fmaf(z, s, -1.6666666666666666e-01f);
    s = fmaf(PTL_FMUL(z, th), s, th);
    float c = fmaf(z, -1.1470745597729725e-11f, 2.0876756987868099e-09f); /* -1/14!, 1/12! */
    c = fmaf(z, c, -2.7557319223985891e-07f);
    c = fmaf(z, c, 2.4801587301587302e-05f);
    c = fmaf(z, c, -1.3888888888888889e-03f);
    c = fmaf(z, c, 4.1666666666666664e-02f);
    c = fmaf(z, c, -0.5f);
    c = fmaf(z, c, 1.0f);
    switch (q & 3) {
    case 0: *s_out = s; *c_out = c; break;
    case 1: *s_out = c; *c_out = -s; break;
    case 2: *s_out = -s; *c_out = -c; break;
    default: *s_out = -c; *c_out = s; break;
    }
}

/* Box-Muller on a pair of words: two standard normals. */
PTL_HD void ptl_box_muller(uint32_t a, uint32_t b, float *z0, float *z1)
{
    float u1 = (float)((a >> 8) + 1u) * 5.9604644775390625e-08f; /* (0, 1] */
    float u2 = ptl_u32_to_unit(b);
    float r = PTL_FSQRT(PTL_FMUL(-2.0f, ptl_logf_unit(u1)));
    float s, c;
    ptl_sincos_2pi(u2, &s, &c);
    *z0 = PTL_FMUL(r, c);
    *z1 = PTL_FMUL(r, s);
}

#endif
