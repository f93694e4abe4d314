#include "../ops/cast.h"
#include "device.h"
#include "launch.cuh"

__global__ void cast_kernel(void *dst, ptl_dtype ddt, const void *src, ptl_dtype sdt, int64_t n)
{
    ptl_wait_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        ptl_convert_one(dst, ddt, src, sdt, i);
}

extern "C" int cast_cuda(struct CUstream_st *stream, void *dst, ptl_dtype ddt, const void *src, ptl_dtype sdt,
                         int64_t n)
{
    if (n == 0)
        return 0;
    if (ddt == sdt) {
        PTL_CUDA_TRY(cudaMemcpyAsync(dst, src, (size_t)n * ptl_dtype_size(ddt), cudaMemcpyDeviceToDevice, stream));
        return 0;
    }
    {
        int64_t blocks = (n + 255) / 256;
        if (blocks > 65536)
            blocks = 65536;
        ptl_launch(cast_kernel, (unsigned)blocks, 256, 0, stream, dst, ddt, src, sdt, n);
        PTL_LAUNCH_CHECK("cast_kernel");
    }
    return 0;
fail:
    return -1;
}
