/* Stand-in for the CUDA header of the same name, just enough for csrc/cuda/network_cuda.c and device.h
 * to compile without CUDA (tests/network_cuda_cpu/harness.c). */
#pragma once
#include <stddef.h>
typedef int cudaError_t;
#define cudaSuccess 0
typedef struct CUstream_st *cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s);
