#include "../ops/rng.h"
#include "device.h"
#include "launch.cuh"

static unsigned grid_for(int64_t n)
{
    int64_t blocks = (n + 255) / 256;
    return (unsigned)(blocks > 65536 ? 65536 : blocks);
}

__global__ void rng_fill_kernel(void *dst, ptl_dtype dt, int64_t n, ptl_rng_kind kind, uint64_t seed, uint64_t offset,
                                float a, float b)
{
    ptl_wait_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride)
        ptl_rng_store(dst, dt, j, ptl_rng_draw(kind, seed, offset, j, a, b));
}

__global__ void fill_kernel(unsigned char *dst, int64_t n, int es, uint64_t pattern)
{
    ptl_wait_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        for (int k = 0; k < es; k++)
            dst[i * es + k] = (unsigned char)(pattern >> (8 * k));
}

extern "C" int rng_fill_cuda(struct CUstream_st *stream, void *dst, ptl_dtype dt, int64_t n, ptl_rng_kind kind,
                             uint64_t seed, uint64_t offset, float a, float b)
{
    if (n == 0)
        return 0;
    ptl_launch(rng_fill_kernel, grid_for(n), 256, 0, stream, dst, dt, n, kind, seed, offset, a, b);
    PTL_LAUNCH_CHECK("rng_fill_kernel");
    return 0;
fail:
    return -1;
}

extern "C" int fill_cuda(struct CUstream_st *stream, void *dst, ptl_dtype dt, int64_t n, double value)
{
    uint64_t pattern = 0;
    if (n == 0)
        return 0;
    ptl_convert_one(&pattern, dt, &value, PTL_FLOAT64, 0); /* little-endian: element bytes first */
    ptl_launch(fill_kernel, grid_for(n), 256, 0, stream, (unsigned char *)dst, n, (int)ptl_dtype_size(dt), pattern);
    PTL_LAUNCH_CHECK("fill_kernel");
    return 0;
fail:
    return -1;
}
