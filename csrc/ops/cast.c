#include "cast.h"

void cast_cpu(void *dst, ptl_dtype ddt, const void *src, ptl_dtype sdt, int64_t n)
{
    if (ddt == sdt) {
        memcpy(dst, src, (size_t)n * ptl_dtype_size(ddt));
        return;
    }
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; i++)
        ptl_convert_one(dst, ddt, src, sdt, i);
}
