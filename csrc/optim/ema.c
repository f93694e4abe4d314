/* EMA of the weights and BatchNorm buffers (8.4.190's ModelEMA: a lerp towards the model), CPU reference. */
#include "optim.h"

/* Called by ptl_ema_update after ptl_ema_check. */
int ptl_ema_update_cpu(void *ema, const void *model, int64_t n, ptl_dtype dt, double decay)
{
    if (dt == PTL_FLOAT32) {
        float w = (float)(1.0 - decay);
        float *e = (float *)ema;
        const float *m = (const float *)model;
        for (int64_t i = 0; i < n; i++)
            e[i] = ptl_ema_elem_f(e[i], m[i], w);
    } else if (dt == PTL_FLOAT64) {
        double *e = (double *)ema, w = 1.0 - decay;
        const double *m = (const double *)model;
        for (int64_t i = 0; i < n; i++)
            e[i] = ptl_lerpd(e[i], m[i], w);
    } else {
        return ptl_set_error(PTL_ERR_TYPE, "ema: buffers must be float32 or float64, got %s", ptl_dtype_name(dt)), -1;
    }
    return 0;
}
