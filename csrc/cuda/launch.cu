/* Whether launches may start early (launch.cuh): decided per device as its context is made. */
#include <stdlib.h>

#include "launch.cuh"

int ptl_cuda_pdl = -1;

/* Compiled like every kernel of the module, so its PTX version is theirs on this device. */
__global__ void pdl_probe_kernel(int *unused)
{
    ptl_wait_prior();
    if (unused)
        *unused = 0;
}

int ptl_cuda_pdl_setup(void)
{
    const char *env = getenv("PTL_PDL");
    cudaFuncAttributes fa;
    PTL_CUDA_TRY(cudaFuncGetAttributes(&fa, pdl_probe_kernel));
    {
        /* griddepcontrol needs code compiled for compute_90 or later (PTX compiled for an older target and
         * run by a newer device has no wait in it) */
        const int on = fa.ptxVersion >= 90 && !(env && env[0] == '0' && env[1] == '\0');
        ptl_cuda_pdl = ptl_cuda_pdl == -1 ? on : (ptl_cuda_pdl && on);
    }
    return 0;
fail:
    return -1;
}
