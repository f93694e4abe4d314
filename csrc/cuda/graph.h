/* A sequence of work captured from one stream (without running it) and replayed with one launch: the
 * building block of the graph recorder (ARCHITECTURE.md §3). Capture is thread-local, so work that
 * other threads queue meanwhile (loader uploads) neither joins nor breaks it. */
#ifndef PTL_CUDA_GRAPH_H
#define PTL_CUDA_GRAPH_H

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ptl_cuda_graph ptl_cuda_graph;

/* Starts capturing `stream`. Everything queued on it until ptl_cuda_graph_end is recorded, not run. */
int ptl_cuda_graph_begin(cudaStream_t stream);
/* Ends the capture; keep = 0 discards it (the work between begin and end failed), keep = 1 instantiates
 * it into *out. Always leaves the stream out of capture mode. */
int ptl_cuda_graph_end(cudaStream_t stream, int keep, ptl_cuda_graph **out);
int ptl_cuda_graph_launch(ptl_cuda_graph *g, cudaStream_t stream);
/* The number of nodes (kernels, copies, NCCL's kernels) captured; 0 for NULL. */
size_t ptl_cuda_graph_nodes(const ptl_cuda_graph *g);
void ptl_cuda_graph_destroy(ptl_cuda_graph *g);

#ifdef __cplusplus
}
#endif

#endif
