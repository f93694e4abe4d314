/* The optimizer's library entry points (optim.h): the argument checks every step runs first, and the
 * dispatch of a step or an EMA update to the device the buffers live on. A step that passes its checks
 * writes nothing before it can no longer fail (except by a device fault). */
#include <math.h>

#include "../fault.h"
#include "optim.h"
#ifdef PTL_WITH_CUDA
#include "../cuda/device.h"
#endif

int ptl_optim_check(const ptl_optim_buffers *b, const ptl_optim_hp *hp, ptl_device_type dev)
{
    if (hp->ngroups < 1 || hp->ngroups > PTL_OPT_MAX_GROUPS)
        return ptl_set_error(PTL_ERR_VALUE, "kinds: expected 1 to %d groups, got %d", PTL_OPT_MAX_GROUPS, hp->ngroups);
    int need_ws = 0, need_s1 = 0;
    for (int k = 0; k < hp->ngroups; k++) {
        if (hp->kind[k] < PTL_OPT_SGD || hp->kind[k] > PTL_OPT_ADAMW)
            return ptl_set_error(PTL_ERR_VALUE, "kinds: group %d has unknown kind %d", k, hp->kind[k]);
        if (!isfinite(hp->lr[k]) || !isfinite(hp->momentum[k]) || !isfinite(hp->wd[k]))
            return ptl_set_error(PTL_ERR_VALUE, "lrs, momenta, wds: group %d has lr %g, momentum %g, decay %g", k,
                                 hp->lr[k], hp->momentum[k], hp->wd[k]);
        need_ws |= hp->kind[k] == PTL_OPT_MUON;
        need_s1 |= hp->kind[k] != PTL_OPT_SGD;
    }
    if (hp->world < 1)
        return ptl_set_error(PTL_ERR_VALUE, "world: expected the number of ranks whose gradients were summed (>= 1), "
                             "got %d", hp->world);
    if (hp->growth_interval < 1)
        return ptl_set_error(PTL_ERR_VALUE, "growth_interval: expected >= 1, got %d", hp->growth_interval);
    if (b->tx < 0 || b->ta < 0 || b->nmuon < 0)
        return ptl_set_error(PTL_ERR_VALUE, "tx, ta, nmuon: expected sizes >= 0, got %lld, %lld, %lld",
                             (long long)b->tx, (long long)b->ta, (long long)b->nmuon);
    if (!b->params || !b->grads || !b->state2 || !b->scalars)
        return ptl_set_error(PTL_ERR_VALUE, "optimizer: params, grads, state2 and scalars are required");
    if (need_s1 && !b->state1)
        return ptl_set_error(PTL_ERR_VALUE, "state1: required for Muon and AdamW groups");
    if (dev == PTL_CUDA) {
        if (b->dtype != PTL_FLOAT32)
            return ptl_set_error(PTL_ERR_TYPE, "params: CUDA buffers must be float32, got %s",
                                 ptl_dtype_name(b->dtype));
        if (!b->ws_f64)
            return ptl_set_error(PTL_ERR_VALUE, "ws_f64: missing (CUDA steps keep their partial sums there)");
        if (need_ws && !b->ws_bf16)
            return ptl_set_error(PTL_ERR_VALUE, "ws_bf16: missing (the Newton-Schulz arenas, 2 tx + 2 ta)");
        return 0; /* the tables live on the device: checked when they were built (ptl/optim.py) */
    }
    if (b->dtype != PTL_FLOAT32 && b->dtype != PTL_FLOAT64)
        return ptl_set_error(PTL_ERR_TYPE, "params: expected float32 or float64, got %s", ptl_dtype_name(b->dtype));
    for (int64_t pi = 0; pi < b->nparams; pi++) {
        const int64_t *row = b->ptab + pi * PTL_PT_NCOLS;
        const int64_t grp = row[PTL_PT_GROUP];
        if (grp < 0 || grp >= hp->ngroups)
            return ptl_set_error(PTL_ERR_VALUE, "optimizer: parameter %lld is in group %lld of %d", (long long)pi,
                                 (long long)grp, hp->ngroups);
        if (row[PTL_PT_OFF] < 0 || row[PTL_PT_NUMEL] < 0 || row[PTL_PT_OFF] > b->n ||
            row[PTL_PT_NUMEL] > b->n - row[PTL_PT_OFF])
            return ptl_set_error(PTL_ERR_VALUE, "optimizer: parameter %lld lies outside the flat buffer", (long long)pi);
        const int64_t r = row[PTL_PT_ROWS], c = row[PTL_PT_COLS];
        if (hp->kind[grp] == PTL_OPT_MUON && (r <= 0 || c <= 0 || r * c != row[PTL_PT_NUMEL]))
            return ptl_set_error(PTL_ERR_VALUE, "optimizer: parameter %lld has a bad 2-D view", (long long)pi);
        if (row[PTL_PT_FROZEN] != 0 && (row[PTL_PT_FROZEN] != 1 || row[PTL_PT_MIDX] >= 0))
            return ptl_set_error(PTL_ERR_VALUE, "optimizer: parameter %lld has frozen flag %lld (0, or 1 for a "
                                 "parameter outside the Newton-Schulz work)", (long long)pi,
                                 (long long)row[PTL_PT_FROZEN]);
    }
    /* the gradient statistics walk the chunk table, not ptab */
    for (int64_t c = 0; c < b->nchunks; c++) {
        const int64_t *ch = b->call + 3 * c;
        if (ch[0] < 0 || ch[1] < 0 || ch[0] > b->n || ch[1] > b->n - ch[0] || ch[2] < 0 || ch[2] >= b->nparams)
            return ptl_set_error(PTL_ERR_VALUE,
                                 "call: chunk %lld (start %lld, length %lld, parameter %lld) lies outside the flat "
                                 "buffer of %lld elements or the %lld parameters",
                                 (long long)c, (long long)ch[0], (long long)ch[1], (long long)ch[2], (long long)b->n,
                                 (long long)b->nparams);
        if (b->ptab[ch[2] * PTL_PT_NCOLS + PTL_PT_FROZEN])
            return ptl_set_error(PTL_ERR_VALUE, "call: chunk %lld belongs to frozen parameter %lld (the clip norm "
                                 "leaves frozen parameters out)", (long long)c, (long long)ch[2]);
    }
    return 0;
}

int ptl_optim_step(struct ptl_cuda_ctx *ctx, const ptl_optim_buffers *b, const ptl_optim_hp *hp, ptl_ns_graph *g)
{
    if (ptl_optim_check(b, hp, ctx ? PTL_CUDA : PTL_CPU) || ptl_fault_hit(PTL_FAULT_OPTIMIZER))
        return -1;
    if (!ctx)
        return ptl_optim_step_cpu(b, hp);
#ifdef PTL_WITH_CUDA
    return ptl_optim_step_cuda(ctx->stream, ctx->cublas, b, hp, g);
#else
    (void)g;
    return ptl_set_error(PTL_ERR_RUNTIME, "optimizer: ptl was built without CUDA");
#endif
}

int ptl_ema_check(ptl_device_type dev, ptl_dtype dt, double decay)
{
    if (!(decay >= 0.0 && decay <= 1.0))
        return ptl_set_error(PTL_ERR_VALUE, "decay: expected a value in [0, 1], got %g", decay);
    if (dev == PTL_CUDA ? dt != PTL_FLOAT32 : dt != PTL_FLOAT32 && dt != PTL_FLOAT64)
        return ptl_set_error(PTL_ERR_TYPE, "ema: %s buffers must be float32%s, got %s", dev == PTL_CUDA ? "CUDA" : "CPU",
                             dev == PTL_CUDA ? "" : " or float64", ptl_dtype_name(dt));
    return ptl_fault_hit(PTL_FAULT_EMA);
}

int ptl_ema_update(struct ptl_cuda_ctx *ctx, void *ema, const void *model, int64_t n, ptl_dtype dt, double decay)
{
    if (ptl_ema_check(ctx ? PTL_CUDA : PTL_CPU, dt, decay))
        return -1;
    if (!ctx)
        return ptl_ema_update_cpu(ema, model, n, dt, decay);
#ifdef PTL_WITH_CUDA
    return ptl_ema_update_cuda(ctx->stream, (float *)ema, (const float *)model, n, decay);
#else
    return ptl_set_error(PTL_ERR_RUNTIME, "ema: ptl was built without CUDA");
#endif
}
