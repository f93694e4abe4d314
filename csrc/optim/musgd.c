/* MuSGD, SGD (nesterov) and AdamW over the flat buffers (spec §4.3), CPU reference: one parameter at a
 * time, Newton-Schulz in the buffers' precision (or bfloat16-rounded with hp->ns_bf16). */
#include <stdlib.h>
#include <string.h>

#include "optim.h"

static double scalar_get(const ptl_optim_buffers *b, int i)
{
    return b->dtype == PTL_FLOAT64 ? ((const double *)b->scalars)[i] : (double)((const float *)b->scalars)[i];
}

static void scalar_set(const ptl_optim_buffers *b, int i, double v)
{
    if (b->dtype == PTL_FLOAT64)
        ((double *)b->scalars)[i] = v;
    else
        ((float *)b->scalars)[i] = (float)v;
}

/* Muon part of one float32 parameter: momentum, NS5 of the direction, p -= lr * muon_w * O. */
static void muon_f32(const ptl_optim_buffers *b, const ptl_optim_hp *hp, const int64_t *row, float inv, float coef,
                     float *x, float *work)
{
    int64_t off = row[PTL_PT_OFF], rows = row[PTL_PT_ROWS], cols = row[PTL_PT_COLS];
    int grp = (int)row[PTL_PT_GROUP], tall = rows > cols;
    int64_t r = tall ? cols : rows, c = tall ? rows : cols;
    float *p = (float *)b->params + off, *m = (float *)b->state1 + off;
    const float *g = (const float *)b->grads + off;
    float mu = (float)hp->momentum[grp], omm = (float)(1.0 - hp->momentum[grp]);
    float alpha = (float)(-(hp->lr[grp] * hp->muon_w));
    float factor = (float)ptl_muon_factor(row[PTL_PT_D2], row[PTL_PT_D1]);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t e = i * cols + j;
            float u = ptl_muon_momentum_f(m + e, ptl_grad_used_f(g[e], inv, coef), omm, mu, hp->nesterov);
            x[tall ? j * rows + i : e] = u;
        }
    ptl_ns5_normalise_f32(x, r * c, hp->ns_bf16);
    ptl_ns5_iterate_f32(x, r, c, hp->ns_bf16, work);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t e = i * cols + j;
            float o = x[tall ? j * rows + i : e];
            if (factor != 1.0f)
                o = hp->ns_bf16 ? ptl_round_bf16(o * factor) : o * factor;
            p[e] = fmaf(alpha, o, p[e]);
        }
}

static void muon_f64(const ptl_optim_buffers *b, const ptl_optim_hp *hp, const int64_t *row, double inv, double coef,
                     double *x, double *work)
{
    int64_t off = row[PTL_PT_OFF], rows = row[PTL_PT_ROWS], cols = row[PTL_PT_COLS];
    int grp = (int)row[PTL_PT_GROUP], tall = rows > cols;
    int64_t r = tall ? cols : rows, c = tall ? rows : cols;
    double *p = (double *)b->params + off, *m = (double *)b->state1 + off;
    const double *g = (const double *)b->grads + off;
    double mu = hp->momentum[grp], omm = 1.0 - hp->momentum[grp];
    double alpha = -(hp->lr[grp] * hp->muon_w);
    double factor = ptl_muon_factor(row[PTL_PT_D2], row[PTL_PT_D1]);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t e = i * cols + j;
            double u = ptl_muon_momentum_d(m + e, g[e] * inv * coef, omm, mu, hp->nesterov);
            x[tall ? j * rows + i : e] = u;
        }
    ptl_ns5_normalise_f64(x, r * c);
    ptl_ns5_iterate_f64(x, r, c, work);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t e = i * cols + j;
            p[e] = p[e] + alpha * (x[tall ? j * rows + i : e] * factor);
        }
}

/* Called by ptl_optim_step after ptl_optim_check. The work buffers are made before anything is
 * written, so a failure leaves parameters and state as they were. */
int ptl_optim_step_cpu(const ptl_optim_buffers *b, const ptl_optim_hp *hp)
{
    int f64 = b->dtype == PTL_FLOAT64;
    size_t es = f64 ? sizeof(double) : sizeof(float);
    void *x = NULL, *work = NULL;
    double inv, coef;
    int64_t maxrc = 0, maxr = 0;
    for (int64_t pi = 0; pi < b->nparams; pi++) {
        const int64_t *row = b->ptab + pi * PTL_PT_NCOLS;
        if (hp->kind[row[PTL_PT_GROUP]] != PTL_OPT_MUON || row[PTL_PT_FROZEN])
            continue;
        const int64_t r = row[PTL_PT_ROWS], c = row[PTL_PT_COLS], mn = r < c ? r : c;
        maxrc = r * c > maxrc ? r * c : maxrc;
        maxr = mn > maxr ? mn : maxr;
    }
    if (maxrc > 0) {
        x = malloc(es * (size_t)maxrc);
        work = malloc(es * (size_t)(3 * maxr * maxr + maxrc));
        if (!x || !work) {
            ptl_set_error(PTL_ERR_MEMORY, "optimizer: out of memory");
            goto fail;
        }
    }
    PTL_CHECK(ptl_grad_stats_cpu(b, hp, &inv, &coef));
    if (scalar_get(b, PTL_OPT_S_FOUND_INF) == 0.0) {
        double step = scalar_get(b, PTL_OPT_S_STEP) + 1.0;
        for (int64_t pi = 0; pi < b->nparams; pi++) {
            const int64_t *row = b->ptab + pi * PTL_PT_NCOLS;
            if (row[PTL_PT_FROZEN]) /* freeze: no update, decay or momentum (its gradient is not read) */
                continue;
            int grp = (int)row[PTL_PT_GROUP], kind = hp->kind[grp];
            int64_t off = row[PTL_PT_OFF], n = row[PTL_PT_NUMEL];
            double lr = hp->lr[grp], mu = hp->momentum[grp], wd = hp->wd[grp];
            if (kind == PTL_OPT_MUON) {
                if (f64)
                    muon_f64(b, hp, row, inv, coef, (double *)x, (double *)work);
                else
                    muon_f32(b, hp, row, (float)inv, (float)coef, (float *)x, (float *)work);
            }
            if (kind == PTL_OPT_ADAMW) {
                ptl_adamw_coef ac = ptl_adamw_coefs(lr, mu, hp->beta2, hp->eps, wd, step);
                for (int64_t e = off; e < off + n; e++) {
                    if (f64)
                        ptl_adamw_elem_d((double *)b->params + e, (double *)b->state1 + e, (double *)b->state2 + e,
                                         ((const double *)b->grads)[e] * inv * coef, &ac);
                    else
                        ptl_adamw_elem_f((float *)b->params + e, (float *)b->state1 + e, (float *)b->state2 + e,
                                         ptl_grad_used_f(((const float *)b->grads)[e], (float)inv, (float)coef),
                                         &ac);
                }
                continue;
            }
            double alpha = -(lr * (kind == PTL_OPT_MUON ? hp->sgd_w : 1.0));
            for (int64_t e = off; e < off + n; e++) {
                if (f64)
                    ptl_sgd_elem_d((double *)b->params + e, (double *)b->state2 + e,
                                   ((const double *)b->grads)[e] * inv * coef, mu, wd, alpha, hp->nesterov);
                else
                    ptl_sgd_elem_f((float *)b->params + e, (float *)b->state2 + e,
                                   ptl_grad_used_f(((const float *)b->grads)[e], (float)inv, (float)coef),
                                   (float)mu, (float)wd, (float)alpha, hp->nesterov);
            }
        }
        scalar_set(b, PTL_OPT_S_STEP, step);
    } else {
        scalar_set(b, PTL_OPT_S_SKIPPED, scalar_get(b, PTL_OPT_S_SKIPPED) + 1.0);
    }
    if (hp->scaler) {
        double scale = scalar_get(b, PTL_OPT_S_SCALE), growth = scalar_get(b, PTL_OPT_S_GROWTH);
        ptl_scaler_update(&scale, &growth, scalar_get(b, PTL_OPT_S_FOUND_INF) != 0.0, hp->growth_factor,
                          hp->backoff_factor, hp->growth_interval, !f64);
        scalar_set(b, PTL_OPT_S_SCALE, scale);
        scalar_set(b, PTL_OPT_S_GROWTH, growth);
    }
    if (hp->zero_grad)
        memset(b->grads, 0, es * (size_t)b->n);
    free(x);
    free(work);
    return 0;
fail:
    free(x);
    free(work);
    return -1;
}
