/* A call that enqueues work on a queue (a cuDNN execution plan's run, a cuBLAS product, a BatchNorm pass of
 * several kernels), made again with the same pointers and sizes on the same queue, is relaunched as a CUDA
 * graph of what it enqueued the previous time.
 *
 * Why: an eager step of yolo26n makes 560 such calls (332 convolution calls, 228 BatchNorm passes), and made
 * directly they cost their host time each time: cudnnBackendExecute and cublasGemmEx 5-9 us re-deriving
 * what their plan already fixed, our own launches ~2-3 us each. A graph's launch costs a few us whatever it holds. In an eager step every call's pointers
 * repeat (the network's memory is laid out once per shape), so each call is recorded at its second sight
 * and relaunched from its third. The graph holds the very kernels with the very parameters the call
 * enqueues, so the results are the same bits. A stream that is being captured (the network's recorder) gets
 * the call itself. PTL_CALL_GRAPHS=0 in the environment, or ptl_call_graphs_set(0), makes every call
 * directly (for comparisons). */
#ifndef PTL_CUDA_CALL_GRAPH_H
#define PTL_CUDA_CALL_GRAPH_H

#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ptl_cuda_ctx;

/* What identifies a call: its kind, its queue's context, its tensors and scratch, its sizes and flags (cast
 * to pointers); unused entries zero. Two calls with equal keys must enqueue the same work. */
#define PTL_CALL_KEY 16
/* Graphs held at most in the process: each holds ~0.35 MiB of device memory (H100, driver 580), and one
 * training shape of yolo26n needs 560. At the limit every table lets its graphs go and the calls in use are
 * recorded again (call_graph.c's flush). */
#define PTL_CALL_GRAPHS_LIMIT 2048
typedef struct {
    const void *v[PTL_CALL_KEY];
} ptl_call_key;

typedef struct ptl_call_graphs ptl_call_graphs;

/* A table of up to `keys` calls' graphs (more: it starts again empty); NULL on host memory failure (error
 * set). */
ptl_call_graphs *ptl_call_graphs_create(int keys);
/* Frees it and its graphs (a graph still running on the device is freed when it completes). */
void ptl_call_graphs_destroy(ptl_call_graphs *t);
/* The table of ctx's queue for calls that have no plan of their own to keep one (made on first use, freed
 * with the queue); NULL with the error set on failure. */
ptl_call_graphs *ptl_call_graphs_of(struct ptl_cuda_ctx *ctx);

/* Runs issue(arg), which enqueues the call on `stream`, or relaunches the graph recorded from it for `key`
 * (see above). A call whose capture fails (a library refusing it) is made directly from then on. 0, or -1
 * with the error set (by issue, or naming the CUDA call that failed). Thread-safe. */
int ptl_call_graph_run(ptl_call_graphs *t, cudaStream_t stream, const ptl_call_key *key, int (*issue)(void *arg),
                       void *arg);

/* Whether calls are relaunched as graphs (1, the default) or made directly (0); set returns the previous. */
int ptl_call_graphs_enabled(void);
int ptl_call_graphs_set(int on);
/* How many calls have been recorded as graphs since the process began, and how many of those graphs are
 * held now (for tests and benchmarks). */
int64_t ptl_call_graphs_made(void);
int64_t ptl_call_graphs_live(void);
/* Sets the limit of graphs held, for tests (n <= 0: PTL_CALL_GRAPHS_LIMIT again), and lets every graph go, as
 * at the limit (but leaves the setting on or off); returns the previous limit. */
int64_t ptl_call_graphs_set_limit(int64_t n);

#ifdef __cplusplus
}
#endif

#endif
