/* EMA update over a flat float32 buffer (8.4.190's ModelEMA lerp); the CPU reference is csrc/optim/ema.c. */
#include "../optim/optim.h"
#include "device.h"
#include "launch.cuh"

__global__ void ema_kernel(float *ema, const float *model, int64_t n, float one_minus_d)
{
    ptl_wait_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        ema[i] = ptl_ema_elem_f(ema[i], model[i], one_minus_d);
}

extern "C" int ptl_ema_update_cuda(struct CUstream_st *stream, float *ema, const float *model, int64_t n, double decay)
{
    if (n == 0)
        return 0;
    {
        int64_t blocks = (n + 255) / 256;
        if (blocks > 4096)
            blocks = 4096;
        ptl_launch(ema_kernel, (unsigned)blocks, 256, 0, stream, ema, model, n, (float)(1.0 - decay));
        PTL_LAUNCH_CHECK("ema_kernel");
    }
    return 0;
fail:
    return -1;
}
