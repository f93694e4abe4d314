/* Fills from ptl's Philox streams (csrc/ops/philox.h) and constant fills.
 * uniform: low + u*(high - low) with u in [0, 1) from 24 bits; normal: mean + std*z, Box-Muller on
 * word pairs (words 0,1 of a block give draws 0 (cos) and 1 (sin), words 2,3 give draws 2 and 3).
 * Values are computed in float32 (float64 tensors get the same float32 draw widened) and rounded to
 * the tensor's dtype. Each fill of n elements consumes ceil(n/4) blocks from `offset`. */
#ifndef PTL_OPS_RNG_H
#define PTL_OPS_RNG_H

#include "../ptl.h"
#include "cast.h"
#include "philox.h"

typedef enum { PTL_RNG_UNIFORM = 0, PTL_RNG_NORMAL = 1 } ptl_rng_kind;

PTL_HD float ptl_rng_draw(ptl_rng_kind kind, uint64_t seed, uint64_t offset, int64_t j, float a, float b)
{
    ptl_philox_block blk = ptl_philox_at(seed, offset + (uint64_t)(j >> 2));
    int w = (int)(j & 3);
    if (kind == PTL_RNG_UNIFORM)
        return fmaf(ptl_u32_to_unit(blk.v[w]), PTL_FSUB(b, a), a);
    float z0, z1;
    ptl_box_muller(blk.v[w & 2], blk.v[(w & 2) + 1], &z0, &z1);
    return fmaf((w & 1) ? z1 : z0, b, a);
}

/* Writes a float32 value as element i of dst. */
PTL_HD void ptl_rng_store(void *dst, ptl_dtype dt, int64_t i, float v)
{
    switch (dt) {
    case PTL_FLOAT32: ((float *)dst)[i] = v; break;
    case PTL_FLOAT64: ((double *)dst)[i] = (double)v; break;
    case PTL_FLOAT16: ((uint16_t *)dst)[i] = ptl_f32_to_f16_bits(ptl_f32_to_bits(v)); break;
    case PTL_BFLOAT16: ((uint16_t *)dst)[i] = ptl_f32_to_bf16_bits(ptl_f32_to_bits(v)); break;
    default: break;
    }
}

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks consumed by a fill of n elements. */
static inline uint64_t ptl_rng_blocks(int64_t n) { return (uint64_t)((n + 3) / 4); }

/* kind UNIFORM: (a, b) = (low, high); NORMAL: (a, b) = (mean, std). dt must be a float dtype. */
void rng_fill_cpu(void *dst, ptl_dtype dt, int64_t n, ptl_rng_kind kind, uint64_t seed, uint64_t offset, float a,
                  float b);
/* Sets every element to `value` (converted to dt by the rules of csrc/ops/cast.h). */
void fill_cpu(void *dst, ptl_dtype dt, int64_t n, double value);

#ifdef PTL_WITH_CUDA
struct CUstream_st;
int rng_fill_cuda(struct CUstream_st *stream, void *dst, ptl_dtype dt, int64_t n, ptl_rng_kind kind, uint64_t seed,
                  uint64_t offset, float a, float b);
int fill_cuda(struct CUstream_st *stream, void *dst, ptl_dtype dt, int64_t n, double value);
#endif

#ifdef __cplusplus
}
#endif

#endif
