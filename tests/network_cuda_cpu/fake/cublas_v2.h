/* Stand-in for the CUDA header of the same name, just enough for csrc/cuda/network_cuda.c and device.h
 * to compile without CUDA (tests/network_cuda_cpu/harness.c). */
#pragma once
typedef int cublasStatus_t;
#define CUBLAS_STATUS_SUCCESS 0
typedef void *cublasHandle_t;
