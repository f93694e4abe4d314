/* uint8 NHWC images -> float32 / bfloat16 / float16 NHWC divided by 255 (spec §7.9: no mean/std).
 * Both backends convert with the same PTL_HD rounding helpers (ops/half.h), so their outputs are
 * bit-identical. */
#ifndef PTL_DATA_NORMALIZE_H
#define PTL_DATA_NORMALIZE_H

#include <stdint.h>

#include "../ops/fpmath.h"
#include "../ops/half.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = src[i] / 255 in dtype dt (PTL_FLOAT32, PTL_BFLOAT16 or PTL_FLOAT16). */
int ptl_normalize_u8_cpu(const uint8_t *src, void *dst, ptl_dtype dt, int64_t n);

#ifdef PTL_WITH_CUDA
/* The same on the device, on `stream` (a cudaStream_t). */
int ptl_normalize_u8_cuda(const uint8_t *src, void *dst, ptl_dtype dt, int64_t n, void *stream);
#endif

#ifdef __cplusplus
}
#endif

#endif
