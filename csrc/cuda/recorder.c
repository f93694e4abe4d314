/* The graph recorder of the CUDA executor (recorder.h): captures of what ptl_net_exec_forward and
 * ptl_net_exec_backward (and a caller's tail after it) queue on the device's stream, and on the side
 * streams forked from it and joined to it, kept in the shape's slot. */
#include "recorder.h"

#include <stdlib.h>

#include "device.h"
#include "graph.h"
#include "layer_scratch.h"

struct ptl_net_recording {
    ptl_cuda_graph *fwd, *bwd;
    ptl_cuda_graph *bwd_tail; /* the backward and the tail, or NULL (recorded without a tail) */
    int training;            /* the BN mode baked into the graphs */
    const void *params, *buffers; /* the weights the graphs read */
    uint64_t scratch_gen;    /* the layer scratches' generation the graphs point into (scratch_generation) */
};

/* The generations of the layer scratches the executor's queues use (each only grows, so the sum changes
 * whenever one is reallocated). */
static uint64_t scratch_generation(const ptl_net_exec *x)
{
    uint64_t g = ptl_layers_cuda_scratch_generation(x->ctx);
    for (int k = 0; k < PTL_NET_SIDE_STREAMS; k++)
        if (x->side[k])
            g += ptl_layers_cuda_scratch_generation(x->side[k]);
    return g;
}

void ptl_net_cuda_recording_free(ptl_net_recording *rec)
{
    if (!rec)
        return;
    ptl_cuda_graph_destroy(rec->fwd);
    ptl_cuda_graph_destroy(rec->bwd);
    ptl_cuda_graph_destroy(rec->bwd_tail);
    free(rec);
}

/* Captures one call of the forward (bwd 0), or of the backward (bwd 1) followed by the tail if one is
 * given, into *out without running it. */
static int capture(ptl_net_exec *x, int bwd, const void *images, const void *const d_out[2][2],
                   const ptl_net_tail *tail, ptl_cuda_graph **out)
{
    const ptl_net_layout *L = &x->cur->L;
    if (ptl_cuda_graph_begin(x->ctx->stream))
        return -1;
    const int ok = (bwd ? ptl_net_exec_backward(x, d_out, NULL) == 0 && (!tail || tail->run(tail->arg) == 0)
                        : ptl_net_exec_forward(x, images, L->B, L->H, L->W) == 0);
    if (ptl_cuda_graph_end(x->ctx->stream, ok, out) || !ok)
        return -1;
    return 0;
}

int ptl_net_cuda_record(ptl_net_exec *x, const void *images, int B, int H, int W, const void *const d_out[2][2],
                        const ptl_net_tail *tail)
{
    ptl_net_slot *const S = x->cur;
    if (!S->warm || S->L.B != B || S->L.H != H || S->L.W != W)
        return ptl_set_error(PTL_ERR_RUNTIME, "network record: run one eager forward and backward of this shape "
                                              "first (the warm-up makes every plan and buffer)");
    ptl_net_cuda_recording_free(S->rec);
    S->rec = calloc(1, sizeof *S->rec);
    if (!S->rec)
        return ptl_set_error(PTL_ERR_MEMORY, "network record: out of host memory");
    /* nothing runs: outputs, gradients and BN statistics stay those of the warm-up */
    if (capture(x, 0, images, d_out, NULL, &S->rec->fwd) || capture(x, 1, images, d_out, NULL, &S->rec->bwd))
        goto fail;
    /* the backward's capture ran nothing: the second one reads the same captured forward */
    x->have_forward = tail != NULL;
    if (tail && capture(x, 1, images, d_out, tail, &S->rec->bwd_tail))
        goto fail;
    S->rec->training = x->training;
    S->rec->params = x->params;
    S->rec->buffers = x->buffers;
    S->rec->scratch_gen = scratch_generation(x);
    return 0;
fail:
    ptl_net_cuda_recording_free(S->rec);
    S->rec = NULL;
    x->have_forward = 0;
    return -1;
}

int ptl_net_cuda_replay(ptl_net_exec *x, int part)
{
    ptl_net_slot *const S = x->cur;
    if (!ptl_net_cuda_recorded(x))
        return ptl_set_error(PTL_ERR_RUNTIME, "network replay: nothing recorded for this shape, mode and weights "
                                              "(or the recording was retired by a change of conv options, or by "
                                              "another network growing the device's layer scratch)");
    const int bwd_only = part == PTL_NET_REPLAY_BACKWARD || part == PTL_NET_REPLAY_BACKWARD_TAIL;
    if (bwd_only && !x->have_forward)
        return ptl_set_error(PTL_ERR_RUNTIME, "network replay: the backward needs a forward of this shape first");
    if (part == PTL_NET_REPLAY_BACKWARD_TAIL && !S->rec->bwd_tail)
        return ptl_set_error(PTL_ERR_RUNTIME, "network replay: this shape was recorded without a tail");
    if (cudaSetDevice(x->ctx->device) != cudaSuccess)
        return ptl_cuda_fail("cudaSetDevice", cudaGetLastError());
    if (!bwd_only) {
        x->have_forward = 0;
        if (ptl_cuda_graph_launch(S->rec->fwd, x->ctx->stream))
            return -1;
        x->fwd_training = S->rec->training;
        x->have_forward = 1;
    }
    if (part != PTL_NET_REPLAY_FORWARD) {
        x->have_forward = 0; /* as after an eager backward */
        if (ptl_cuda_graph_launch(part == PTL_NET_REPLAY_BACKWARD_TAIL ? S->rec->bwd_tail : S->rec->bwd,
                                  x->ctx->stream))
            return -1;
    }
    return 0;
}

int ptl_net_cuda_recorded(ptl_net_exec *x)
{
    ptl_net_slot *const S = x->cur;
    if (S->rec && scratch_generation(x) != S->rec->scratch_gen) {
        ptl_net_cuda_recording_free(S->rec); /* the shared layer scratch moved: the graphs point at freed memory */
        S->rec = NULL;
    }
    return S->rec && S->rec->training == x->training && S->rec->params == x->params &&
           S->rec->buffers == x->buffers;
}

void ptl_net_cuda_recording_nodes(ptl_net_exec *x, int64_t nodes[3])
{
    const ptl_net_recording *rec = ptl_net_cuda_recorded(x) ? x->cur->rec : NULL;
    nodes[0] = rec ? (int64_t)ptl_cuda_graph_nodes(rec->fwd) : 0;
    nodes[1] = rec ? (int64_t)ptl_cuda_graph_nodes(rec->bwd) : 0;
    nodes[2] = rec ? (int64_t)ptl_cuda_graph_nodes(rec->bwd_tail) : 0;
}
