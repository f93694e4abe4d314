/* The graph recorder's network part (ARCHITECTURE.md §3) for an executor on the CUDA backend: after an
 * eager forward and backward of the current shape (the warm-up), ptl_net_record captures, without
 * running them, one forward of `images` and one backward of `d_out` (no image gradient) as two graphs
 * kept in the shape's slot. ptl_net_replay then runs exactly that work, the forward, the backward or
 * both, one launch each: same pointers (the caller keeps images and d_out alive and in place, and
 * writes the next d_out between the two), weights cast from the live parameters, gradients added to
 * the live flat gradient, BN running statistics updated as eagerly. It is used only in the BN mode
 * and on the weights it was made with (validation in eval mode on the EMA's weights leaves it for the
 * next epoch); a change of conv options retires it (executor.c), and so does a growth of the device's
 * shared layer scratch (layer_scratch.h) by another executor. The executor keeps the slots of the two
 * most recently used shapes, so a partial batch in between leaves the full shape's recording usable.
 * Given a tail (executor.h), a third graph holds a second capture of the backward followed by the tail's
 * work (the data-parallel step's all-reduce and broadcast), launched instead of the backward's.
 *
 * These are the CUDA backend's record/replay/recorded/recording_free entries; callers use
 * ptl_net_record / ptl_net_replay / ptl_net_recorded (executor.h). */
#ifndef PTL_CUDA_RECORDER_H
#define PTL_CUDA_RECORDER_H

#include "../nn/executor.h"

#ifdef __cplusplus
extern "C" {
#endif

int ptl_net_cuda_record(ptl_net_exec *x, const void *images, int B, int H, int W, const void *const d_out[2][2],
                        const ptl_net_tail *tail);
int ptl_net_cuda_replay(ptl_net_exec *x, int part);
/* 1 while the current shape's recording is usable (its mode and weights are the current ones); one whose
 * layer scratch another executor has since grown (and so moved) is retired here. */
int ptl_net_cuda_recorded(ptl_net_exec *x);
void ptl_net_cuda_recording_free(ptl_net_recording *rec);
void ptl_net_cuda_recording_nodes(ptl_net_exec *x, int64_t nodes[3]);

#ifdef __cplusplus
}
#endif

#endif
