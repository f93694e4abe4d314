/* The fast CPU backend of the network executor (backend_cpu_fast.c) and the choice between it and the
 * reference one (../nn/backend_cpu.c) for a CPU executor. */
#ifndef PTL_CPU_BACKEND_CPU_FAST_H
#define PTL_CPU_BACKEND_CPU_FAST_H

#include <stdint.h>

#include "../nn/executor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU kernels a CPU executor uses unless told otherwise: "fast" (float32 networks in a build with
 * oneDNN; the reference elsewhere) or "reference". The environment variable overrides the default. */
#define PTL_CPU_KERNELS_DEFAULT "fast"
#define PTL_CPU_KERNELS_ENV "PTL_CPU_KERNELS"

/* The fast backend's table, or NULL in a build without oneDNN. float32: a float64 executor on it runs
 * the reference kernels except for its convolutions, whose plans it refuses. */
const ptl_net_backend *ptl_net_backend_cpu_fast(void);

/* The backend of a CPU executor computing in dt. kernels: "fast", "reference", "bfloat16-storage" or
 * "float16-storage" (the reference rounding what CUDA stores in low precision, ../nn/backend_cpu_storage.h;
 * float32 only), or NULL for the environment's PTL_CPU_KERNELS, else PTL_CPU_KERNELS_DEFAULT. An explicit "fast" that cannot be had
 * (float64, no oneDNN) is an error; the default and the environment fall back to the reference. */
int ptl_net_cpu_backend_choose(const char *kernels, ptl_dtype dt, const ptl_net_backend **out);

/* Per-kernel wall time of the fast backend since the last reset (benchmarks): entry e's name, seconds
 * and calls; NULL past the last entry. Not synchronised: read it while no executor runs. */
#define PTL_CPU_FAST_ENTRIES 15
const char *ptl_cpu_fast_stats(int e, double *secs, int64_t *ncalls);
void ptl_cpu_fast_stats_reset(void);

#ifdef __cplusplus
}
#endif

#endif
