#include "graph.h"

#include <stdlib.h>

#include "device.h"

struct ptl_cuda_graph {
    cudaGraphExec_t exec;
    size_t nodes; /* the captured graph's node count */
};

int ptl_cuda_graph_begin(cudaStream_t stream)
{
    PTL_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    return 0;
fail:
    return -1;
}

int ptl_cuda_graph_end(cudaStream_t stream, int keep, ptl_cuda_graph **out)
{
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    ptl_cuda_graph *g = NULL;
    *out = NULL;
    /* a failed call inside the capture may already have ended it (and invalidated the graph) */
    cudaError_t st = cudaStreamEndCapture(stream, &graph);
    if (!keep) {
        if (graph)
            cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        return 0;
    }
    PTL_CUDA_TRY(st);
    size_t nodes = 0;
    PTL_CUDA_TRY(cudaGraphGetNodes(graph, NULL, &nodes));
    /* kernels keep the priority of the stream they were captured on (ptl_cuda_ctx_open_queue) */
    PTL_CUDA_TRY(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority));
    if (!(g = (ptl_cuda_graph *)malloc(sizeof *g))) {
        ptl_set_error(PTL_ERR_MEMORY, "graph recorder: out of host memory");
        goto fail;
    }
    g->exec = exec;
    g->nodes = nodes;
    cudaGraphDestroy(graph);
    *out = g;
    return 0;
fail:
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    return -1;
}

int ptl_cuda_graph_launch(ptl_cuda_graph *g, cudaStream_t stream)
{
    PTL_CUDA_TRY(cudaGraphLaunch(g->exec, stream));
    return 0;
fail:
    return -1;
}

size_t ptl_cuda_graph_nodes(const ptl_cuda_graph *g) { return g ? g->nodes : 0; }

void ptl_cuda_graph_destroy(ptl_cuda_graph *g)
{
    if (!g)
        return;
    cudaGraphExecDestroy(g->exec);
    free(g);
}
