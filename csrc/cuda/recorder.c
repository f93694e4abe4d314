/* The graph recorder of the CUDA executor (recorder.h): captures of what ptl_net_exec_forward and
 * ptl_net_exec_backward queue on the device's stream, kept in the shape's slot. */
#include "recorder.h"

#include <stdlib.h>

#include "device.h"
#include "graph.h"
#include "layer_scratch.h"

struct ptl_net_recording {
    ptl_cuda_graph *fwd, *bwd;
    int training;            /* the BN mode baked into the graphs */
    const void *params, *buffers; /* the weights the graphs read */
    uint64_t scratch_gen;    /* the layer scratch's generation the graphs point into */
};

void ptl_net_cuda_recording_free(ptl_net_recording *rec)
{
    if (!rec)
        return;
    ptl_cuda_graph_destroy(rec->fwd);
    ptl_cuda_graph_destroy(rec->bwd);
    free(rec);
}

/* Captures one call of forward (bwd 0) or backward (bwd 1) into *out without running it. */
static int capture(ptl_net_exec *x, int bwd, const void *images, const void *const d_out[2][2],
                   ptl_cuda_graph **out)
{
    const ptl_net_layout *L = &x->cur->L;
    if (ptl_cuda_graph_begin(x->ctx->stream))
        return -1;
    const int ok =
        (bwd ? ptl_net_exec_backward(x, d_out, NULL) : ptl_net_exec_forward(x, images, L->B, L->H, L->W)) == 0;
    if (ptl_cuda_graph_end(x->ctx->stream, ok, out) || !ok)
        return -1;
    return 0;
}

int ptl_net_cuda_record(ptl_net_exec *x, const void *images, int B, int H, int W, const void *const d_out[2][2])
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
    if (capture(x, 0, images, d_out, &S->rec->fwd) || capture(x, 1, images, d_out, &S->rec->bwd)) {
        ptl_net_cuda_recording_free(S->rec);
        S->rec = NULL;
        x->have_forward = 0;
        return -1;
    }
    S->rec->training = x->training;
    S->rec->params = x->params;
    S->rec->buffers = x->buffers;
    S->rec->scratch_gen = ptl_layers_cuda_scratch_generation(x->ctx);
    return 0;
}

int ptl_net_cuda_replay(ptl_net_exec *x, int part)
{
    ptl_net_slot *const S = x->cur;
    if (!ptl_net_cuda_recorded(x))
        return ptl_set_error(PTL_ERR_RUNTIME, "network replay: nothing recorded for this shape, mode and weights "
                                              "(or the recording was retired by a change of conv options, or by "
                                              "another network growing the device's layer scratch)");
    if (part == PTL_NET_REPLAY_BACKWARD && !x->have_forward)
        return ptl_set_error(PTL_ERR_RUNTIME, "network replay: the backward needs a forward of this shape first");
    if (cudaSetDevice(x->ctx->device) != cudaSuccess)
        return ptl_cuda_fail("cudaSetDevice", cudaGetLastError());
    if (part != PTL_NET_REPLAY_BACKWARD) {
        x->have_forward = 0;
        if (ptl_cuda_graph_launch(S->rec->fwd, x->ctx->stream))
            return -1;
        x->fwd_training = S->rec->training;
        x->have_forward = 1;
    }
    if (part != PTL_NET_REPLAY_FORWARD) {
        x->have_forward = 0; /* as after an eager backward */
        if (ptl_cuda_graph_launch(S->rec->bwd, x->ctx->stream))
            return -1;
    }
    return 0;
}

int ptl_net_cuda_recorded(ptl_net_exec *x)
{
    ptl_net_slot *const S = x->cur;
    if (S->rec && ptl_layers_cuda_scratch_generation(x->ctx) != S->rec->scratch_gen) {
        ptl_net_cuda_recording_free(S->rec); /* the shared layer scratch moved: the graphs point at freed memory */
        S->rec = NULL;
    }
    return S->rec && S->rec->training == x->training && S->rec->params == x->params &&
           S->rec->buffers == x->buffers;
}
