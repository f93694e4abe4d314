#include "rng.h"

void rng_fill_cpu(void *dst, ptl_dtype dt, int64_t n, ptl_rng_kind kind, uint64_t seed, uint64_t offset, float a,
                  float b)
{
#pragma omp parallel for schedule(static) if (n > (1 << 15))
    for (int64_t j = 0; j < n; j++)
        ptl_rng_store(dst, dt, j, ptl_rng_draw(kind, seed, offset, j, a, b));
}

void fill_cpu(void *dst, ptl_dtype dt, int64_t n, double value)
{
    size_t es = ptl_dtype_size(dt);
    unsigned char elem[8];
    ptl_convert_one(elem, dt, &value, PTL_FLOAT64, 0);
    for (int64_t i = 0; i < n; i++)
        memcpy((unsigned char *)dst + (size_t)i * es, elem, es);
}
