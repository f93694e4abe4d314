/* Core definitions shared by every C and CUDA file: dtypes, devices, errors.
 * Safe to include from C (gcc) and CUDA (nvcc); no Python here. */
#ifndef PTL_H
#define PTL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__CUDACC__)
#define PTL_HD __host__ __device__ __forceinline__
#else
#define PTL_HD static inline
#endif

#define PTL_MAX_DIMS 8

typedef enum {
    PTL_FLOAT32 = 0,
    PTL_FLOAT64,
    PTL_FLOAT16,
    PTL_BFLOAT16,
    PTL_INT32,
    PTL_INT64,
    PTL_UINT8,
    PTL_NUM_DTYPES
} ptl_dtype;

size_t ptl_dtype_size(ptl_dtype dt);
const char *ptl_dtype_name(ptl_dtype dt);
/* Returns -1 for an unknown name. */
int ptl_dtype_from_name(const char *name);

typedef enum { PTL_CPU = 0, PTL_CUDA = 1 } ptl_device_type;

typedef struct {
    ptl_device_type type;
    int index; /* CUDA ordinal; 0 for the CPU */
} ptl_device;

/* Errors: library functions return 0 on success and -1 on failure after calling ptl_set_error.
 * The message lives in thread-local storage, so functions may fail while the GIL is released;
 * the Python glue turns it into an exception (ptl_raise in py.h) once it holds the GIL again. */
typedef enum {
    PTL_ERR_NONE = 0,
    PTL_ERR_RUNTIME, /* RuntimeError */
    PTL_ERR_VALUE,   /* ValueError */
    PTL_ERR_TYPE,    /* TypeError */
    PTL_ERR_MEMORY,  /* MemoryError (host) */
    PTL_ERR_CUDA,    /* ptl.CudaError (device runtime, cuBLAS, cuDNN, out of device memory) */
    PTL_ERR_INDEX,   /* IndexError */
    PTL_ERR_KEY,     /* KeyError */
    PTL_ERR_OS       /* OSError */
} ptl_error_kind;

int ptl_set_error(ptl_error_kind kind, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
ptl_error_kind ptl_error_kind_get(void);
const char *ptl_error_message(void);
void ptl_error_clear(void);

#define PTL_CHECK(expr)          \
    do {                         \
        if ((expr) != 0)         \
            goto fail;           \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
