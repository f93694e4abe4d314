/* CPU reference of the image normalisation (see normalize.h). */
#include "normalize.h"

int ptl_normalize_u8_cpu(const uint8_t *src, void *dst, ptl_dtype dt, int64_t n)
{
    switch (dt) {
    case PTL_FLOAT32: {
        float *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = (float)src[i] / 255.0f;
        return 0;
    }
    case PTL_BFLOAT16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = ptl_f32_to_bf16_bits(ptl_f32_to_bits((float)src[i] / 255.0f));
        return 0;
    }
    case PTL_FLOAT16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = ptl_f32_to_f16_bits(ptl_f32_to_bits((float)src[i] / 255.0f));
        return 0;
    }
    default:
        return ptl_set_error(PTL_ERR_TYPE, "normalize: output dtype must be float32, bfloat16 or float16, got %s",
                             ptl_dtype_name(dt));
    }
}
