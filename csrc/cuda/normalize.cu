/* CUDA version of the image normalisation (CPU reference: csrc/data/normalize.c). */
#include <cuda_runtime.h>

#include "../data/normalize.h"
#include "device.h"
#include "launch.cuh"

template <int KIND>
__global__ void normalize_u8_kernel(const uint8_t *__restrict__ src, void *__restrict__ dst, int64_t n)
{
    ptl_wait_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float x = (float)src[i] / 255.0f;
        if (KIND == 0)
            ((float *)dst)[i] = x;
        else if (KIND == 1)
            ((uint16_t *)dst)[i] = ptl_f32_to_bf16_bits(ptl_f32_to_bits(x));
        else
            ((uint16_t *)dst)[i] = ptl_f32_to_f16_bits(ptl_f32_to_bits(x));
    }
}

extern "C" int ptl_normalize_u8_cuda(const uint8_t *src, void *dst, ptl_dtype dt, int64_t n, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (n <= 0)
        return 0;
    int threads = 256;
    int64_t want = (n + threads - 1) / threads;
    int blocks = (int)(want < 65535 * 4 ? want : 65535 * 4);
    switch (dt) {
    case PTL_FLOAT32:
        ptl_launch(normalize_u8_kernel<0>, blocks, threads, 0, st, src, dst, n);
        break;
    case PTL_BFLOAT16:
        ptl_launch(normalize_u8_kernel<1>, blocks, threads, 0, st, src, dst, n);
        break;
    case PTL_FLOAT16:
        ptl_launch(normalize_u8_kernel<2>, blocks, threads, 0, st, src, dst, n);
        break;
    default:
        return ptl_set_error(PTL_ERR_TYPE, "normalize: output dtype must be float32, bfloat16 or float16, got %s",
                             ptl_dtype_name(dt));
    }
    PTL_LAUNCH_CHECK("normalize_u8_kernel");
    return 0;
fail:
    return -1;
}
