/* The reference CPU backend with bfloat16/float16 storage of the compute-dtype values
 * (backend_cpu_storage.c): the CPU oracle of the CUDA network in low precision. */
#ifndef PTL_NN_BACKEND_CPU_STORAGE_H
#define PTL_NN_BACKEND_CPU_STORAGE_H

#include "executor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The table rounding to `storage` (PTL_BFLOAT16 or PTL_FLOAT16; NULL for any other dtype). Its executors
 * compute in float32. */
const ptl_net_backend *ptl_net_backend_cpu_storage(ptl_dtype storage);

#ifdef __cplusplus
}
#endif

#endif
