/* One training step in plain C (ARCHITECTURE.md §1): upload and normalise the batch, forward,
 * objective, backward and, when the step is due, the optimizer step and the EMA update.
 *
 * A plan (ptl_step_plan) is made once per batch shape: the network executor, the buffers the step
 * writes (upload staging, output gradients), the objective's settings, the optimizer's
 * buffers, tables and fixed settings, the EMA pairs. The per-step call passes only what changes:
 * the batch, its targets and the schedule's scalars.
 *
 * With the backend's recorder (CUDA) and plan->record, the first step of the shape runs eagerly and
 * then records its forward and backward (the warm-up, §3 rule 2); later steps of the shape replay
 * them, with the objective run eagerly between the two.
 *
 * Data parallelism (world > 1, docs/training.md "Several GPUs and nodes"): each rank runs this step on its
 * shard of the global batch with the objective's gradients scaled by the world size (Ultralytics'
 * `loss *= world_size`). On the steps the optimizer runs, after the backward: one all-reduce (sum) of the
 * flat gradient over the ranks (NCCL on the step's stream; on the CPU the host collective, which adds in
 * rank order), then rank 0's BatchNorm running statistics to every rank (a broadcast), then the optimizer,
 * which divides by the world size as it unscales (optim.h, ptl_grad_inv_scale_f), and the EMA. Every rank
 * then holds the same parameters, optimizer state, BN statistics and EMA. Accumulation micro-batches do not
 * communicate. A rank whose shard of a step is empty (the last, partial global batch) still takes part:
 * it calls the step without images (network = 0), which skips upload, forward, objective and backward.
 * With a recording, the all-reduce and the broadcast stay eager after the replayed backward, or, with
 * all_reduce_in_graph (CUDA), they are recorded with the backward in a second graph (a tail, executor.h)
 * that the steps of the optimizer replay; the micro-batches that do not communicate replay the backward
 * alone. Either way the same NCCL calls run in the same order on the same stream, so the results are the
 * same bits.
 *
 * Failure: every argument of every stage is checked before anything is written, so a bad argument
 * changes nothing. Past the checks, a failure of upload, forward, objective or backward leaves the
 * parameters, the optimizer state and the EMA as they were (the forward may have moved the BN running
 * statistics, the backward added to the gradients); the optimizer writes nothing before it can no
 * longer fail, and the EMA update, checked before the optimizer ran, cannot fail after it (device
 * faults aside: they leave the device unusable). */
#ifndef PTL_TRAIN_TRAIN_STEP_H
#define PTL_TRAIN_TRAIN_STEP_H

#include <stdint.h>

#include "../dist/dist.h"
#include "../nn/executor.h"
#include "../objective/objective.h"
#include "../optim/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ptl_loader;
struct ptl_nccl_comm;

#define PTL_STEP_MAX_EMA 2

typedef struct {
    void *ema;
    const void *live;
    int64_t n;
} ptl_step_ema;

typedef struct {
    ptl_net_exec *net;
    int B, H, W;          /* the batch shape; the step normalises its images into the network's input */
    uint8_t *staging;     /* CUDA: B*H*W*3 bytes on the device, the upload's landing place; NULL on the CPU */
    void *grads[2][2];    /* d total / d outputs, master dtype, shaped like the outputs */
    double gains[3];      /* box, cls, l1 */
    const float *scale_dev; /* CUDA float16 training: the optimizer's loss scale on the device, else NULL */
    ptl_optim_buffers opt;
    ptl_optim_hp hp;      /* fixed settings; the step fills in lr, momentum and wd */
    ptl_ns_graph *ns_graph;
    int nema;
    ptl_step_ema ema[PTL_STEP_MAX_EMA];
    int record;           /* record the network after the first eager step of the shape (CUDA) */
    int all_reduce_in_graph; /* with record and nccl: record the communication with the backward */
    /* data parallelism: world >= 1 ranks; with world > 1 the job's communicator (CUDA: nccl, on the
     * network's device; CPU: the host group) and the network's flat BatchNorm running statistics (bn,
     * nbn elements in the master dtype on the network's device), which rank 0 broadcasts. A communicator
     * of one rank may be given at world 1: the step then communicates as a job's would (tests). */
    int world;
    struct ptl_nccl_comm *nccl;
    ptl_dist_group *group;
    void *bn;
    int64_t nbn;
} ptl_step_plan;

typedef struct {
    int network;           /* 1: run upload, forward, objective and backward on images; 0: this rank has no
                            * images in this step (only with optimize and world > 1) */
    const uint8_t *images; /* host (B, H, W, 3) uint8 */
    struct ptl_loader *loader; /* the loader whose ring slot holds images (the upload fence), or NULL */
    int slot;
    const float *targets;  /* host (n, 6): image, class, cx, cy, w, h (normalised) */
    int64_t ntargets;
    double o2m_weight;
    int optimize;          /* run the optimizer step and the EMA update after the backward */
    const double *lr, *momentum, *wd; /* one per parameter group */
    double ema_decay;
    /* called between stages (before the optimizer, never between it and the EMA); nonzero stops the step
     * with that error already set (Ctrl-C). May be NULL. */
    int (*interrupted)(void *arg);
    void *interrupted_arg;
    const ptl_dist_poll *watch; /* CPU ranks: checked while the host collectives wait (Ctrl-C); may be NULL */
} ptl_step_args;

/* Checks the fixed part of a plan (made once per shape). */
int ptl_step_plan_check(const ptl_step_plan *p);

/* One step; losses: PTL_OBJ_NUM_LOSSES float32 on the network's device (the objective's layout; zeros
 * without images). */
int ptl_train_step(const ptl_step_plan *p, const ptl_step_args *a, float *losses);

#ifdef __cplusplus
}
#endif

#endif
