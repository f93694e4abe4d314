/* Gradient unscaling, Inf/NaN detection and global-norm clipping (spec §4.8, §6), CPU reference.
 * Nothing is written to the gradients: the step multiplies each gradient by inv_scale and then by coef
 * as it reads it, which rounds exactly like unscaling and clipping in place first. With hp->world > 1 the
 * gradients hold the sum over the ranks and inv_scale also divides by the world size (one rounding), so
 * the norm, the clip and the update see the mean gradient. */
#include "optim.h"

static double load(const void *p, ptl_dtype dt, int64_t i)
{
    return dt == PTL_FLOAT64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static void store(void *p, ptl_dtype dt, int64_t i, double v)
{
    if (dt == PTL_FLOAT64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

/* Rounds to the buffers' precision: double arithmetic followed by this rounding gives the correctly
 * rounded float32 result for + - * / sqrt (53 >= 2 * 24 + 2 bits). */
static double rnd(double x, ptl_dtype dt) { return dt == PTL_FLOAT64 ? x : (double)(float)x; }

int ptl_grad_stats_cpu(const ptl_optim_buffers *b, const ptl_optim_hp *hp, double *inv_scale, double *coef)
{
    ptl_dtype dt = b->dtype;
    const double scale = hp->scaler ? load(b->scalars, dt, PTL_OPT_S_SCALE) : 1.0;
    *inv_scale = dt == PTL_FLOAT64 ? 1.0 / (scale * hp->world) : (double)ptl_grad_inv_scale_f(scale, hp->world);
    *coef = 1.0;
    store(b->scalars, dt, PTL_OPT_S_FOUND_INF, 0.0);
    store(b->scalars, dt, PTL_OPT_S_COEF, 1.0);
    if (!hp->scaler && !(hp->max_norm > 0))
        return 0;
    {
        double ss = 0;
        const int64_t *ch = b->call;
        for (int64_t c = 0; c < b->nchunks; c++) {
            int64_t s = ch[3 * c], len = ch[3 * c + 1];
            double part = 0;
            for (int64_t i = 0; i < len; i++) {
                double g = rnd(load(b->grads, dt, s + i) * *inv_scale, dt);
                part += g * g;
            }
            ss += part;
        }
        int found = hp->scaler && !isfinite(ss);
        double norm = rnd(sqrt(ss), dt);
        if (hp->max_norm > 0) {
            double c = rnd(rnd(hp->max_norm, dt) / rnd(norm + rnd(1e-6, dt), dt), dt);
            if (!(c >= 1.0))
                *coef = c;
        }
        store(b->scalars, dt, PTL_OPT_S_FOUND_INF, found ? 1.0 : 0.0);
        store(b->scalars, dt, PTL_OPT_S_NORM, norm);
        store(b->scalars, dt, PTL_OPT_S_COEF, *coef);
    }
    return 0;
}
