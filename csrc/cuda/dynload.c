/* cuBLAS, cuBLASLt, cuDNN and NCCL opened at run time: same-named forwarding functions (dynload.h).
 *
 * Each list entry is X(return type, function, (parameters), (arguments), value returned when the
 * library cannot be loaded). The compiler checks each definition against the library's header, so a
 * wrong entry does not build. Adding a library (NCCL) is its list, the four lines that expand it
 * (POINTER, SYMBOL_NAME, POINTER_ADDRESS, FORWARD), one enum value and one row in `libs`. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cudnn.h>
#include <nccl.h>
#include <pthread.h>

#include "../dynlib.h"
#include "../ptl.h"
#include "dynload.h"

#define PTL_STR_(x) #x
#define PTL_STR(x) PTL_STR_(x) /* expands macros first: cublasCreate names cublasCreate_v2 */

#define CUBLASLT_FUNCTIONS(X)                                                                                   \
    X(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle), (handle), CUBLAS_STATUS_NOT_INITIALIZED)      \
    X(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t handle), (handle), CUBLAS_STATUS_NOT_INITIALIZED)

#define CUBLAS_FUNCTIONS(X)                                                                                     \
    X(cublasStatus_t, cublasCreate, (cublasHandle_t * handle), (handle), CUBLAS_STATUS_NOT_INITIALIZED)          \
    X(cublasStatus_t, cublasDestroy, (cublasHandle_t handle), (handle), CUBLAS_STATUS_NOT_INITIALIZED)           \
    X(cublasStatus_t, cublasSetStream, (cublasHandle_t handle, cudaStream_t stream), (handle, stream),          \
      CUBLAS_STATUS_NOT_INITIALIZED)                                                                            \
    X(const char *, cublasGetStatusName, (cublasStatus_t status), (status), "CUBLAS_NOT_LOADED")               \
    X(const char *, cublasGetStatusString, (cublasStatus_t status), (status), "cuBLAS is not loaded")          \
    X(cublasStatus_t, cublasGemmEx,                                                                             \
      (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,          \
       const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B, cudaDataType Btype,       \
       int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,       \
       cublasGemmAlgo_t algo),                                                                                  \
      (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType,  \
       algo),                                                                                                   \
      CUBLAS_STATUS_NOT_INITIALIZED)                                                                            \
    X(cublasStatus_t, cublasGemmStridedBatchedEx,                                                               \
      (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,          \
       const void *alpha, const void *A, cudaDataType Atype, int lda, long long int strideA, const void *B,    \
       cudaDataType Btype, int ldb, long long int strideB, const void *beta, void *C, cudaDataType Ctype,      \
       int ldc, long long int strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo), \
      (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype,  \
       ldc, strideC, batchCount, computeType, algo),                                                            \
      CUBLAS_STATUS_NOT_INITIALIZED)

#define CUDNN_FUNCTIONS(X)                                                                                      \
    X(const char *, cudnnGetErrorString, (cudnnStatus_t status), (status), "cuDNN is not loaded")              \
    X(cudnnStatus_t, cudnnCreate, (cudnnHandle_t * handle), (handle), CUDNN_STATUS_NOT_INITIALIZED)             \
    X(cudnnStatus_t, cudnnDestroy, (cudnnHandle_t handle), (handle), CUDNN_STATUS_NOT_INITIALIZED)              \
    X(cudnnStatus_t, cudnnSetStream, (cudnnHandle_t handle, cudaStream_t stream), (handle, stream),             \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnCreateTensorDescriptor, (cudnnTensorDescriptor_t * desc), (desc),                    \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnDestroyTensorDescriptor, (cudnnTensorDescriptor_t desc), (desc),                     \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnSetTensor4dDescriptor,                                                                \
      (cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format, cudnnDataType_t dataType, int n, int c, int h, \
       int w),                                                                                                  \
      (desc, format, dataType, n, c, h, w), CUDNN_STATUS_NOT_INITIALIZED)                                       \
    X(cudnnStatus_t, cudnnCreateFilterDescriptor, (cudnnFilterDescriptor_t * desc), (desc),                    \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnDestroyFilterDescriptor, (cudnnFilterDescriptor_t desc), (desc),                     \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnSetFilter4dDescriptor,                                                                \
      (cudnnFilterDescriptor_t desc, cudnnDataType_t dataType, cudnnTensorFormat_t format, int k, int c, int h, \
       int w),                                                                                                  \
      (desc, dataType, format, k, c, h, w), CUDNN_STATUS_NOT_INITIALIZED)                                       \
    X(cudnnStatus_t, cudnnCreateConvolutionDescriptor, (cudnnConvolutionDescriptor_t * desc), (desc),          \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnDestroyConvolutionDescriptor, (cudnnConvolutionDescriptor_t desc), (desc),           \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnSetConvolution2dDescriptor,                                                           \
      (cudnnConvolutionDescriptor_t desc, int pad_h, int pad_w, int u, int v, int dilation_h, int dilation_w,  \
       cudnnConvolutionMode_t mode, cudnnDataType_t computeType),                                               \
      (desc, pad_h, pad_w, u, v, dilation_h, dilation_w, mode, computeType), CUDNN_STATUS_NOT_INITIALIZED)      \
    X(cudnnStatus_t, cudnnSetConvolutionGroupCount, (cudnnConvolutionDescriptor_t desc, int groupCount),        \
      (desc, groupCount), CUDNN_STATUS_NOT_INITIALIZED)                                                         \
    X(cudnnStatus_t, cudnnSetConvolutionMathType, (cudnnConvolutionDescriptor_t desc, cudnnMathType_t mathType), \
      (desc, mathType), CUDNN_STATUS_NOT_INITIALIZED)                                                           \
    X(cudnnStatus_t, cudnnGetConvolution2dForwardOutputDim,                                                     \
      (const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t inputTensorDesc,             \
       const cudnnFilterDescriptor_t filterDesc, int *n, int *c, int *h, int *w),                               \
      (convDesc, inputTensorDesc, filterDesc, n, c, h, w), CUDNN_STATUS_NOT_INITIALIZED)                        \
    X(cudnnStatus_t, cudnnGetConvolutionForwardAlgorithm_v7,                                                    \
      (cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc, const cudnnFilterDescriptor_t filterDesc,  \
       const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t destDesc,                     \
       const int requestedAlgoCount, int *returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t *perfResults),       \
      (handle, srcDesc, filterDesc, convDesc, destDesc, requestedAlgoCount, returnedAlgoCount, perfResults),    \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnGetConvolutionBackwardDataAlgorithm_v7,                                               \
      (cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc, \
       const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc,                     \
       const int requestedAlgoCount, int *returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t *perfResults),   \
      (handle, filterDesc, diffDesc, convDesc, gradDesc, requestedAlgoCount, returnedAlgoCount, perfResults),   \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnGetConvolutionBackwardFilterAlgorithm_v7,                                             \
      (cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc, const cudnnTensorDescriptor_t diffDesc,    \
       const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,                     \
       const int requestedAlgoCount, int *returnedAlgoCount, cudnnConvolutionBwdFilterAlgoPerf_t *perfResults), \
      (handle, srcDesc, diffDesc, convDesc, gradDesc, requestedAlgoCount, returnedAlgoCount, perfResults),      \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnGetConvolutionForwardWorkspaceSize,                                                   \
      (cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,         \
       const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,                        \
       cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes),                                                    \
      (handle, xDesc, wDesc, convDesc, yDesc, algo, sizeInBytes), CUDNN_STATUS_NOT_INITIALIZED)                 \
    X(cudnnStatus_t, cudnnGetConvolutionBackwardDataWorkspaceSize,                                              \
      (cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,        \
       const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,                       \
       cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes),                                                \
      (handle, wDesc, dyDesc, convDesc, dxDesc, algo, sizeInBytes), CUDNN_STATUS_NOT_INITIALIZED)               \
    X(cudnnStatus_t, cudnnGetConvolutionBackwardFilterWorkspaceSize,                                            \
      (cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,        \
       const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,                     \
       cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes),                                              \
      (handle, xDesc, dyDesc, convDesc, gradDesc, algo, sizeInBytes), CUDNN_STATUS_NOT_INITIALIZED)             \
    X(cudnnStatus_t, cudnnConvolutionForward,                                                                   \
      (cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,            \
       const cudnnFilterDescriptor_t wDesc, const void *w, const cudnnConvolutionDescriptor_t convDesc,         \
       cudnnConvolutionFwdAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta,          \
       const cudnnTensorDescriptor_t yDesc, void *y),                                                           \
      (handle, alpha, xDesc, x, wDesc, w, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, yDesc, y),     \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnConvolutionBackwardData,                                                              \
      (cudnnHandle_t handle, const void *alpha, const cudnnFilterDescriptor_t wDesc, const void *w,            \
       const cudnnTensorDescriptor_t dyDesc, const void *dy, const cudnnConvolutionDescriptor_t convDesc,       \
       cudnnConvolutionBwdDataAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta,      \
       const cudnnTensorDescriptor_t dxDesc, void *dx),                                                         \
      (handle, alpha, wDesc, w, dyDesc, dy, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, dxDesc, dx), \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnConvolutionBackwardFilter,                                                            \
      (cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,            \
       const cudnnTensorDescriptor_t dyDesc, const void *dy, const cudnnConvolutionDescriptor_t convDesc,       \
       cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta,    \
       const cudnnFilterDescriptor_t dwDesc, void *dw),                                                         \
      (handle, alpha, xDesc, x, dyDesc, dy, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, dwDesc, dw), \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnBackendCreateDescriptor,                                                              \
      (cudnnBackendDescriptorType_t descriptorType, cudnnBackendDescriptor_t * descriptor),                     \
      (descriptorType, descriptor), CUDNN_STATUS_NOT_INITIALIZED)                                               \
    X(cudnnStatus_t, cudnnBackendDestroyDescriptor, (cudnnBackendDescriptor_t descriptor), (descriptor),        \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnBackendFinalize, (cudnnBackendDescriptor_t descriptor), (descriptor),                 \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnBackendSetAttribute,                                                                  \
      (cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t attributeName,                         \
       cudnnBackendAttributeType_t attributeType, int64_t elementCount, const void *arrayOfElements),          \
      (descriptor, attributeName, attributeType, elementCount, arrayOfElements), CUDNN_STATUS_NOT_INITIALIZED)  \
    X(cudnnStatus_t, cudnnBackendGetAttribute,                                                                  \
      (cudnnBackendDescriptor_t const descriptor, cudnnBackendAttributeName_t attributeName,                   \
       cudnnBackendAttributeType_t attributeType, int64_t requestedElementCount, int64_t *elementCount,        \
       void *arrayOfElements),                                                                                  \
      (descriptor, attributeName, attributeType, requestedElementCount, elementCount, arrayOfElements),        \
      CUDNN_STATUS_NOT_INITIALIZED)                                                                             \
    X(cudnnStatus_t, cudnnBackendExecute,                                                                       \
      (cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan, cudnnBackendDescriptor_t variantPack),     \
      (handle, executionPlan, variantPack), CUDNN_STATUS_NOT_INITIALIZED)

/* NCCL, for data parallelism over GPUs (cuda/nccl_comm.c); only a job of several GPUs opens it. */
#define NCCL_FUNCTIONS(X)                                                                                       \
    X(ncclResult_t, ncclGetVersion, (int *version), (version), ncclSystemError)                                 \
    X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId), (uniqueId), ncclSystemError)                    \
    X(ncclResult_t, ncclCommInitRankConfig,                                                                     \
      (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config),                    \
      (comm, nranks, commId, rank, config), ncclSystemError)                                                    \
    X(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t * asyncError), (comm, asyncError),    \
      ncclSystemError)                                                                                          \
    X(ncclResult_t, ncclCommFinalize, (ncclComm_t comm), (comm), ncclSystemError)                               \
    X(ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm), ncclSystemError)                                \
    X(ncclResult_t, ncclCommAbort, (ncclComm_t comm), (comm), ncclSystemError)                                  \
    X(ncclResult_t, ncclAllReduce,                                                                              \
      (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,            \
       ncclComm_t comm, cudaStream_t stream),                                                                   \
      (sendbuff, recvbuff, count, datatype, op, comm, stream), ncclSystemError)                                 \
    X(ncclResult_t, ncclBroadcast,                                                                              \
      (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,  \
       cudaStream_t stream),                                                                                    \
      (sendbuff, recvbuff, count, datatype, root, comm, stream), ncclSystemError)                               \
    X(const char *, ncclGetErrorString, (ncclResult_t result), (result), "NCCL is not loaded")                 \
    X(const char *, ncclGetLastError, (ncclComm_t comm), (comm), "NCCL is not loaded")

/* The wheels: CUDA 13's cuBLAS wheel installs into nvidia/cu13/lib, CUDA 12's into nvidia/cublas/lib. */
#if CUBLAS_VER_MAJOR >= 13
#define CUBLAS_PACKAGE "nvidia-cublas"
#else
#define CUBLAS_PACKAGE "nvidia-cublas-cu" PTL_STR(CUBLAS_VER_MAJOR)
#endif
#define CUBLAS_WHEEL_DIRS {"nvidia/cu" PTL_STR(CUBLAS_VER_MAJOR) "/lib", "nvidia/cublas/lib"}
#define CUDA_EXTRA "ptl[cuda]"

/* Per function: a typed pointer, its name and its address for the loader. `fn` arrives macro-expanded
 * (cublasCreate as cublasCreate_v2), so the symbol, the pointer and the definition all use the real name. */
#define POINTER_NAME(fn) ptr_##fn
#define POINTER(ret, fn, params, args, fail) static __typeof__(&fn) POINTER_NAME(fn);
#define SYMBOL_NAME(ret, fn, params, args, fail) PTL_STR(fn),
#define POINTER_ADDRESS(ret, fn, params, args, fail) (void **)&POINTER_NAME(fn),

CUBLASLT_FUNCTIONS(POINTER)
CUBLAS_FUNCTIONS(POINTER)
CUDNN_FUNCTIONS(POINTER)
NCCL_FUNCTIONS(POINTER)
static const char *const cublaslt_symbols[] = {CUBLASLT_FUNCTIONS(SYMBOL_NAME) NULL};
static const char *const cublas_symbols[] = {CUBLAS_FUNCTIONS(SYMBOL_NAME) NULL};
static const char *const cudnn_symbols[] = {CUDNN_FUNCTIONS(SYMBOL_NAME) NULL};
static const char *const nccl_symbols[] = {NCCL_FUNCTIONS(SYMBOL_NAME) NULL};
static void **const cublaslt_slots[] = {CUBLASLT_FUNCTIONS(POINTER_ADDRESS)};
static void **const cublas_slots[] = {CUBLAS_FUNCTIONS(POINTER_ADDRESS)};
static void **const cudnn_slots[] = {CUDNN_FUNCTIONS(POINTER_ADDRESS)};
static void **const nccl_slots[] = {NCCL_FUNCTIONS(POINTER_ADDRESS)};

/* In load order: cuBLAS needs cuBLASLt, and cuDNN's sub-libraries find both already loaded. */
enum { LIB_CUBLASLT, LIB_CUBLAS, LIB_CUDNN, NUM_LIBS };
static const ptl_dynlib libs[NUM_LIBS] = {
    [LIB_CUBLASLT] = {"cuBLASLt", "libcublasLt.so." PTL_STR(CUBLAS_VER_MAJOR), CUBLAS_WHEEL_DIRS, CUBLAS_PACKAGE,
                      CUDA_EXTRA, cublaslt_symbols, cublaslt_slots},
    [LIB_CUBLAS] = {"cuBLAS", "libcublas.so." PTL_STR(CUBLAS_VER_MAJOR), CUBLAS_WHEEL_DIRS, CUBLAS_PACKAGE,
                    CUDA_EXTRA, cublas_symbols, cublas_slots},
    [LIB_CUDNN] = {"cuDNN", "libcudnn.so." PTL_STR(CUDNN_MAJOR), {"nvidia/cudnn/lib"},
                   "nvidia-cudnn-cu" PTL_STR(CUBLAS_VER_MAJOR), CUDA_EXTRA, cudnn_symbols, cudnn_slots},
};

/* NCCL is opened apart from the others: a single-GPU fit never needs it. */
static const ptl_dynlib nccl_lib = {"NCCL", "libnccl.so." PTL_STR(NCCL_MAJOR), {"nvidia/nccl/lib"},
                                    "nvidia-nccl-cu" PTL_STR(CUBLAS_VER_MAJOR), CUDA_EXTRA, nccl_symbols, nccl_slots};

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded, nccl_loaded; /* set (release) once every slot is filled */
static char paths[NUM_LIBS][1024], nccl_path[1024];

int ptl_cuda_libraries_load(void)
{
    if (__atomic_load_n(&loaded, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&load_lock);
    int rc = 0;
    for (int i = 0; i < NUM_LIBS && rc == 0 && !loaded; i++)
        rc = ptl_dynlib_open(&libs[i], paths[i], sizeof paths[i]);
    if (rc == 0)
        __atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&load_lock);
    return rc;
}

int ptl_nccl_library_load(void)
{
    if (__atomic_load_n(&nccl_loaded, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&load_lock);
    int rc = nccl_loaded ? 0 : ptl_dynlib_open(&nccl_lib, nccl_path, sizeof nccl_path);
    if (rc == 0)
        __atomic_store_n(&nccl_loaded, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&load_lock);
    return rc;
}

const char *ptl_nccl_library_path(void) { return __atomic_load_n(&nccl_loaded, __ATOMIC_ACQUIRE) ? nccl_path : NULL; }

int ptl_cuda_library_count(void) { return NUM_LIBS; }

void ptl_cuda_library_info(int i, const char **name, const char **soname, const char **package, const char **path)
{
    *name = libs[i].name;
    *soname = libs[i].soname;
    *package = libs[i].package;
    *path = __atomic_load_n(&loaded, __ATOMIC_ACQUIRE) ? paths[i] : NULL;
}

/* The forwarding definitions. Without the library they return `fail`; ptl_cuda_ctx_get loads the
 * libraries before any handle exists, so that error has already been reported by then. */
#define FORWARD(ret, fn, params, args, fail)                                                        \
    ret fn params                                                                                   \
    {                                                                                               \
        if (!__atomic_load_n(&loaded, __ATOMIC_ACQUIRE) && ptl_cuda_libraries_load() != 0)         \
            return fail;                                                                            \
        return POINTER_NAME(fn) args;                                                               \
    }

#define FORWARD_NCCL(ret, fn, params, args, fail)                                                   \
    ret fn params                                                                                   \
    {                                                                                               \
        if (!__atomic_load_n(&nccl_loaded, __ATOMIC_ACQUIRE) && ptl_nccl_library_load() != 0)      \
            return fail;                                                                            \
        return POINTER_NAME(fn) args;                                                               \
    }

CUBLASLT_FUNCTIONS(FORWARD)
CUBLAS_FUNCTIONS(FORWARD)
CUDNN_FUNCTIONS(FORWARD)
NCCL_FUNCTIONS(FORWARD_NCCL)
