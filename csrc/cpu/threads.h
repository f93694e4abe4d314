/* Threads of ptl's CPU kernels (OpenMP teams: the reference kernels of csrc/nn, the fast kernels of this
 * folder, and oneDNN, which runs on the same libgomp).
 *
 * The team size and the wait policy are fixed when libgomp loads (it reads its environment once, before
 * any of ptl's code runs), so ptl/_openmp.py sets them before it imports ptl._C:
 *   PTL_NUM_THREADS  threads per team (default: OMP_NUM_THREADS if set, else the CPUs the process may
 *                    run on, os.sched_getaffinity);
 *   idle threads spin about 20 us and then sleep (GOMP_SPINCOUNT=1000 unless GOMP_SPINCOUNT or
 *   OMP_WAIT_POLICY is set), instead of libgomp's default of about 6 ms, which under a competing load
 *   takes the CPU from the threads doing the work. */
#ifndef PTL_CPU_THREADS_H
#define PTL_CPU_THREADS_H

#ifdef __cplusplus
extern "C" {
#endif

/* The team size a parallel region of the calling thread gets. */
int ptl_cpu_threads(void);

#ifdef __cplusplus
}
#endif

#endif
