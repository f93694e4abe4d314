/* cuBLAS, cuBLASLt, cuDNN and NCCL are not linked: cuda/dynload.c defines every function of theirs that ptl
 * calls, under the library's own name, and forwards it to the library opened on first use (found in
 * the pip wheels of the `ptl[cuda]` extra or on the system library path, see ../dynlib.h). Call
 * sites stay plain cuBLAS/cuDNN calls; a function not yet in dynload.c's lists stops the build (setup.py
 * checks that no cuBLAS/cuDNN symbol is left undefined). */
#ifndef PTL_CUDA_DYNLOAD_H
#define PTL_CUDA_DYNLOAD_H

#ifdef __cplusplus
extern "C" {
#endif

/* Opens the libraries and resolves their functions, once; 0, or -1 (PTL_ERR_CUDA) naming the library
 * that is missing and the package that provides it. Thread-safe; a failure is retried next call. */
int ptl_cuda_libraries_load(void);

/* NCCL (data parallelism over GPUs) is opened on its own, when the first communicator is made: the same
 * search, wheel nvidia-nccl-cu13 (nvidia/nccl/lib) first. 0, or -1 (PTL_ERR_CUDA) naming what to install.
 * Its file once open, else NULL. */
int ptl_nccl_library_load(void);
const char *ptl_nccl_library_path(void);

/* How many libraries there are, and library i's name (e.g. "cuDNN"), soname and wheel package; its
 * file is set once ptl_cuda_libraries_load succeeded (else NULL). */
int ptl_cuda_library_count(void);
void ptl_cuda_library_info(int i, const char **name, const char **soname, const char **package, const char **path);

#ifdef __cplusplus
}
#endif

#endif
