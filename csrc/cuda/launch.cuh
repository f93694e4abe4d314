/* Kernel launches with programmatic dependent launch (Hopper and later).
 *
 * A training step is ~1500 short kernels in one stream, and between two of them the GPU idles while the
 * second grid is scheduled after the first has drained. ptl_launch marks each launch as allowed to start
 * early (cudaLaunchAttributeProgrammaticStreamSerialization), so the next kernel's blocks are already
 * resident when the previous grid ends, eagerly and in the recorder's graphs alike.
 *
 * The rule that keeps this correct: every kernel starts with ptl_wait_prior(), which waits until the grid
 * ahead of it has completed and its writes are visible, before the kernel reads or writes anything, and
 * then lets the kernel after it be scheduled in turn. So the order of every read and write, and every
 * bit, is that of plain launches (tests/test_cuda_sources.py checks the rule on the sources). The
 * attribute is used only where the device runs code compiled for compute_90 or later (the wait exists
 * there) and not with PTL_PDL=0 (for comparisons): ptl_cuda_pdl, set as each device's context is made. */
#ifndef PTL_CUDA_LAUNCH_CUH
#define PTL_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>

#include <stdint.h>
#include <utility>

#include "device.h"

/* Whether every pointer allows 16-byte vector accesses (NULL counts as aligned: it is not read). */
static inline int ptl_aligned16(const void *a, const void *b, const void *c)
{
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15) == 0;
}

__device__ __forceinline__ void ptl_wait_prior(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* kernel<<<grid, block, smem, stream>>>(args...), with the early start where ptl_cuda_pdl allows it. A
 * failed launch is left for the caller's PTL_LAUNCH_CHECK (cudaGetLastError reports it). */
template <typename... P, typename... A>
static inline void ptl_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                              A &&...args)
{
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = ptl_cuda_pdl == 1 ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

#endif
