/* One training step in plain C (train_step.h). */
#include "train_step.h"

#include <string.h>

#include "../data/normalize.h"
#include "../fault.h"
#ifdef PTL_WITH_CUDA
#include "../cuda/device.h"
#include "../cuda/nccl_comm.h"
#include "../cuda/upload_queue.h"
#include "../data/dataset.h"
#endif

/* The data-parallel part of a plan: a communicator of `world` ranks on the network's device and the
 * BatchNorm statistics to broadcast. */
static int check_dist(const ptl_step_plan *p)
{
    const ptl_net_exec *x = p->net;
    if (p->world < 1)
        return ptl_set_error(PTL_ERR_VALUE, "plan: world %d (the number of ranks, >= 1)", p->world);
    if (p->hp.world != p->world)
        return ptl_set_error(PTL_ERR_VALUE, "plan: the optimizer divides by %d ranks, the plan has %d", p->hp.world,
                             p->world);
    if (p->all_reduce_in_graph && x->device.type != PTL_CUDA)
        return ptl_set_error(PTL_ERR_VALUE, "plan: all_reduce_in_graph needs a CUDA network (NCCL in the graph)");
    if (p->world == 1 && !p->nccl && !p->group)
        return 0;
    if (x->device.type == PTL_CPU) {
        if (!p->group)
            return ptl_set_error(PTL_ERR_VALUE, "plan: %d CPU ranks need the job's host group", p->world);
        if (ptl_dist_world(p->group) != p->world)
            return ptl_set_error(PTL_ERR_VALUE, "plan: world %d but the host group has %d ranks", p->world,
                                 ptl_dist_world(p->group));
    } else {
#ifdef PTL_WITH_CUDA
        if (!p->nccl)
            return ptl_set_error(PTL_ERR_VALUE, "plan: %d GPU ranks need the job's NCCL communicator", p->world);
        if (ptl_nccl_comm_world(p->nccl) != p->world)
            return ptl_set_error(PTL_ERR_VALUE, "plan: world %d but the NCCL communicator has %d ranks", p->world,
                                 ptl_nccl_comm_world(p->nccl));
        if (ptl_nccl_comm_ctx(p->nccl) != x->ctx)
            return ptl_set_error(PTL_ERR_VALUE, "plan: the NCCL communicator is not on the network's device (cuda:%d)",
                                 x->device.index);
#else
        return ptl_set_error(PTL_ERR_RUNTIME, "plan: ptl was built without CUDA");
#endif
    }
    if (!p->bn || p->nbn != x->net->nbuffers)
        return ptl_set_error(PTL_ERR_VALUE, "plan: the BatchNorm statistics to broadcast (%lld elements) are not the "
                             "network's %lld", (long long)(p->bn ? p->nbn : 0), (long long)x->net->nbuffers);
    return 0;
}

int ptl_step_plan_check(const ptl_step_plan *p)
{
    const ptl_net_exec *x = p->net;
    if (!x)
        return ptl_set_error(PTL_ERR_VALUE, "plan: no network");
    if (p->B < 1 || p->H < 32 || p->W < 32 || p->H % 32 || p->W % 32)
        return ptl_set_error(PTL_ERR_VALUE, "plan: batch shape %dx%dx%d (height and width: multiples of 32)", p->B,
                             p->H, p->W);
    if (x->cdt != PTL_FLOAT32 && x->cdt != PTL_BFLOAT16 && x->cdt != PTL_FLOAT16)
        return ptl_set_error(PTL_ERR_TYPE, "plan: the upload normalises into float32, bfloat16 or float16, not %s",
                             ptl_dtype_name(x->cdt));
    if (x->device.type == PTL_CUDA && !p->staging)
        return ptl_set_error(PTL_ERR_VALUE, "plan: the upload staging buffer is missing");
    for (int i = 0; i < 4; i++)
        if (!p->grads[i / 2][i % 2])
            return ptl_set_error(PTL_ERR_VALUE, "plan: output gradient %d is missing", i);
    if (p->nema < 0 || p->nema > PTL_STEP_MAX_EMA)
        return ptl_set_error(PTL_ERR_VALUE, "plan: %d EMA pairs (at most %d)", p->nema, PTL_STEP_MAX_EMA);
    for (int i = 0; i < p->nema; i++)
        if (!p->ema[i].ema || !p->ema[i].live || p->ema[i].n < 0)
            return ptl_set_error(PTL_ERR_VALUE, "plan: EMA pair %d is incomplete", i);
    if (p->opt.dtype != x->mdt)
        return ptl_set_error(PTL_ERR_TYPE, "plan: optimizer buffers in %s, the network's master storage in %s",
                             ptl_dtype_name(p->opt.dtype), ptl_dtype_name(x->mdt));
    return check_dist(p);
}

/* The host batch into `input`, the network input of the current shape (ptl_net_exec_input: the forward then
 * copies nothing): normalised on the CPU, or copied to the device's staging buffer on the upload stream (beside
 * the previous step's work, ../cuda/upload_queue.h) and normalised there (asynchronously; the loader slot's fence
 * tells the loader when the copy has read its pixels). */
static int upload(const ptl_step_plan *p, const ptl_step_args *a, void *input)
{
    const ptl_net_exec *x = p->net;
    const int64_t n = (int64_t)p->B * p->H * p->W * 3;
    if (ptl_fault_hit(PTL_FAULT_UPLOAD))
        return -1;
    if (x->device.type == PTL_CPU)
        return ptl_normalize_u8_cpu(a->images, input, x->cdt, n);
#ifdef PTL_WITH_CUDA
    ptl_cuda_ctx *ctx = x->ctx;
    cudaStream_t copy;
    PTL_CHECK(ptl_cuda_upload(ctx, p->staging, a->images, (size_t)n, &copy));
    PTL_CHECK(ptl_normalize_u8_cuda(p->staging, input, x->cdt, n, ctx->stream));
    PTL_CHECK(ptl_cuda_upload_read(ctx));
    if (a->loader)
        PTL_CHECK(ptl_loader_record_fence(a->loader, a->slot, copy));
    return 0;
fail:
    return -1;
#else
    return ptl_set_error(PTL_ERR_RUNTIME, "upload: ptl was built without CUDA");
#endif
}

static int interrupted(const ptl_step_args *a) { return a->interrupted && a->interrupted(a->interrupted_arg); }

/* The losses of a step without images: zeros. */
static int zero_losses(const ptl_net_exec *x, float *losses)
{
    const size_t bytes = sizeof(float) * PTL_OBJ_NUM_LOSSES;
    if (x->device.type == PTL_CPU) {
        memset(losses, 0, bytes);
        return 0;
    }
#ifdef PTL_WITH_CUDA
    PTL_CUDA_TRY(cudaMemsetAsync(losses, 0, bytes, x->ctx->stream));
    return 0;
fail:
    return -1;
#else
    return ptl_set_error(PTL_ERR_RUNTIME, "train_step: ptl was built without CUDA");
#endif
}

/* A job's step communicates (its plan has a communicator). */
static int communicates(const ptl_step_plan *p) { return p->nccl != NULL || p->group != NULL; }

/* The GPU half of communicate, queued on the step's stream; also the recorder's tail (ptl_net_tail). */
static int communicate_nccl(void *arg)
{
#ifdef PTL_WITH_CUDA
    const ptl_step_plan *p = arg;
    if (ptl_nccl_all_reduce_sum(p->nccl, p->opt.grads, p->opt.n, p->opt.dtype))
        return -1;
    return ptl_nccl_broadcast(p->nccl, p->bn, p->nbn, p->net->mdt, 0);
#else
    (void)arg;
    return ptl_set_error(PTL_ERR_RUNTIME, "train_step: ptl was built without CUDA");
#endif
}

/* Data parallelism, before the optimizer: the sum of the ranks' gradients, then rank 0's BatchNorm running
 * statistics, on every rank. */
static int communicate(const ptl_step_plan *p, const ptl_step_args *a)
{
    const ptl_net_exec *x = p->net;
    if (x->device.type == PTL_CPU) {
        if (ptl_dist_all_reduce_sum(p->group, p->opt.grads, p->opt.n, p->opt.dtype, a->watch))
            return -1;
        return ptl_dist_broadcast(p->group, p->bn, (size_t)p->nbn * x->msz, a->watch);
    }
    return communicate_nccl((void *)p);
}

/* The recorded tail of the backward: the communication, when the plan records it in the graph. */
static const ptl_net_tail *graph_tail(const ptl_step_plan *p, ptl_net_tail *t)
{
    if (!p->all_reduce_in_graph || !p->nccl)
        return NULL;
    *t = (ptl_net_tail){communicate_nccl, (void *)p};
    return t;
}

/* Upload, forward, objective and backward of one batch (and, after the first eager step of the shape, the
 * recording); oa and tg checked and built by the caller. *communicated: the replayed backward's graph
 * also ran the communication. */
static int network_pass(const ptl_step_plan *p, const ptl_step_args *a, ptl_obj_args *oa, const ptl_obj_targets *tg,
                        int *communicated)
{
    ptl_net_exec *x = p->net;
    /* the shape's slot first (a partial batch in between keeps the full shape's recording), then its input */
    PTL_CHECK(ptl_net_exec_prepare(x, p->B, p->H, p->W));
    void *const input = ptl_net_exec_input(x);
    PTL_CHECK(upload(p, a, input));
    const int replay = ptl_net_recorded(x);
    PTL_CHECK(ptl_fault_hit(PTL_FAULT_FORWARD));
    PTL_CHECK(replay ? ptl_net_replay(x, PTL_NET_REPLAY_FORWARD) : ptl_net_exec_forward(x, input, p->B, p->H, p->W));
    if (interrupted(a))
        goto fail;

    /* objective: d total / d outputs into the plan's gradient buffers */
    for (int br = 0; br < 2; br++) {
        oa->boxes[br] = ptl_net_exec_output(x, br, 0);
        oa->scores[br] = ptl_net_exec_output(x, br, 1);
    }
    PTL_CHECK(ptl_objective(x->ctx, oa, tg));

    PTL_CHECK(ptl_fault_hit(PTL_FAULT_BACKWARD));
    const void *const d[2][2] = {{p->grads[0][0], p->grads[0][1]}, {p->grads[1][0], p->grads[1][1]}};
    ptl_net_tail tail;
    const ptl_net_tail *t = graph_tail(p, &tail);
    if (replay && t && a->optimize) {
        PTL_CHECK(ptl_net_replay(x, PTL_NET_REPLAY_BACKWARD_TAIL));
        *communicated = 1;
#ifdef PTL_WITH_CUDA
        PTL_CHECK(ptl_nccl_watch(p->nccl)); /* the watchdog times the graph's collectives */
#endif
    } else {
        PTL_CHECK(replay ? ptl_net_replay(x, PTL_NET_REPLAY_BACKWARD) : ptl_net_exec_backward(x, d, NULL));
    }
    if (!replay && p->record && x->be->record)
        PTL_CHECK(ptl_net_record(x, input, p->B, p->H, p->W, d, t));
    return 0;
fail:
    return -1;
}

int ptl_train_step(const ptl_step_plan *p, const ptl_step_args *a, float *losses)
{
    ptl_net_exec *x = p->net;
    ptl_obj_targets tg = {0};
    ptl_optim_hp hp = p->hp;

    /* checks: every stage's arguments, before anything is written */
    if (ptl_step_plan_check(p))
        return -1;
    if (!losses)
        return ptl_set_error(PTL_ERR_VALUE, "train_step: losses are required");
    if (!a->network && !(a->optimize && communicates(p)))
        return ptl_set_error(PTL_ERR_VALUE, "train_step: a step without images only takes part in the optimizer "
                             "step of a data-parallel job (optimize, with the job's communicator)");
    if (a->network && (!a->images || (a->ntargets > 0 && !a->targets) || a->ntargets < 0))
        return ptl_set_error(PTL_ERR_VALUE, "train_step: images, targets and losses are required");
    const ptl_device_type dev = x->device.type;
    if (a->optimize) {
        for (int k = 0; k < hp.ngroups; k++) {
            hp.lr[k] = a->lr[k];
            hp.momentum[k] = a->momentum[k];
            hp.wd[k] = a->wd[k];
        }
        if (ptl_optim_check(&p->opt, &hp, dev))
            return -1;
        for (int i = 0; i < p->nema; i++)
            if (ptl_ema_check(dev, x->mdt, a->ema_decay))
                return -1;
    }
#ifdef PTL_WITH_CUDA
    /* a communicator the watchdog aborted, or NCCL's asynchronous error, fails here with the reason */
    if (p->nccl && ptl_nccl_check(p->nccl))
        return -1;
#endif
    ptl_obj_args oa = {0};
    int communicated = 0;
    if (a->network) {
        oa.B = p->B;
        oa.H = p->H;
        oa.W = p->W;
        oa.nc = x->net->nc;
        oa.A = ptl_obj_num_anchors(p->H, p->W);
        oa.dtype = x->mdt;
        for (int br = 0; br < 2; br++) {
            oa.grad_boxes[br] = p->grads[br][0];
            oa.grad_scores[br] = p->grads[br][1];
        }
        oa.o2m_weight = a->o2m_weight;
        for (int k = 0; k < 3; k++)
            oa.gain[k] = p->gains[k];
        oa.grad_scale = (double)p->world; /* each rank's gradient at the global batch's scale */
        oa.grad_scale_dev = p->scale_dev;
        oa.losses = losses;
        if (ptl_obj_check_args(&oa, dev))
            return -1;
        if (ptl_obj_targets_build(a->targets, a->ntargets, p->B, p->H, p->W, oa.nc, &tg))
            return -1;
        PTL_CHECK(network_pass(p, a, &oa, &tg, &communicated));
    } else {
        PTL_CHECK(zero_losses(x, losses));
    }
    if (interrupted(a))
        goto fail;

    /* when due: the ranks' gradients and BN statistics, the optimizer step (clip, update, scaler, zero the
     * gradients) and the EMA */
    if (a->optimize) {
        if (communicates(p) && !communicated)
            PTL_CHECK(communicate(p, a));
        PTL_CHECK(ptl_optim_step(x->ctx, &p->opt, &hp, p->ns_graph));
        for (int i = 0; i < p->nema; i++)
            PTL_CHECK(ptl_ema_update(x->ctx, p->ema[i].ema, p->ema[i].live, p->ema[i].n, x->mdt, a->ema_decay));
    }
    ptl_obj_targets_free(&tg);
    return 0;
fail:
    ptl_obj_targets_free(&tg);
    return -1;
}
