/* CPU reference of the detection objective (spec §2, §3) and the host-side target preparation shared
 * with the CUDA backend. The per-precision code lives in objective_cpu_tmpl.h (float32 and float64). */
#include "objective.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../fault.h"
#include "objective_math.h"
#ifdef PTL_WITH_CUDA
#include "../cuda/device.h"
#endif

int64_t ptl_obj_num_anchors(int H, int W)
{
    if (H <= 0 || W <= 0 || H % 32 || W % 32) {
        ptl_set_error(PTL_ERR_VALUE, "img_size: height and width must be positive multiples of 32, got %dx%d", H, W);
        return -1;
    }
    int64_t A = 0;
    for (int l = 0; l < PTL_OBJ_NUM_LEVELS; l++)
        A += (int64_t)(H / (8 << l)) * (W / (8 << l));
    return A;
}

double ptl_obj_o2m_weight(int epoch, int epochs)
{
    double den = epochs - 1 > 1 ? (double)(epochs - 1) : 1.0;
    double frac = 1.0 - epoch / den;
    if (frac < 0)
        frac = 0;
    return frac * (0.8 - 0.1) + 0.1;
}

void ptl_obj_targets_free(ptl_obj_targets *t)
{
    free(t->count);
    free(t->cls);
    free(t->box_f);
    free(t->box_d);
    memset(t, 0, sizeof(*t));
}

int ptl_obj_targets_build(const float *rows, int64_t n, int B, int H, int W, int nc, ptl_obj_targets *out)
{
    int32_t *fill = NULL;
    memset(out, 0, sizeof(*out));
    out->B = B;
    out->count = (int32_t *)calloc((size_t)B + 1, sizeof(int32_t));
    fill = (int32_t *)calloc((size_t)B + 1, sizeof(int32_t));
    if (!out->count || !fill) {
        ptl_set_error(PTL_ERR_MEMORY, "objective: out of host memory for the targets");
        goto fail;
    }
    for (int64_t i = 0; i < n; i++) {
        const float *r = rows + 6 * i;
        for (int k = 0; k < 6; k++)
            if (!isfinite(r[k])) {
                ptl_set_error(PTL_ERR_VALUE, "targets: row %lld has a non-finite value", (long long)i);
                goto fail;
            }
        if (r[0] != floorf(r[0]) || r[0] < 0 || r[0] >= B) {
            ptl_set_error(PTL_ERR_VALUE, "targets: row %lld has image index %g, expected an integer in [0, %d)",
                          (long long)i, (double)r[0], B);
            goto fail;
        }
        if (r[1] != floorf(r[1]) || r[1] < 0 || r[1] >= nc) {
            ptl_set_error(PTL_ERR_VALUE, "targets: row %lld has class %g, out of range for num_classes=%d",
                          (long long)i, (double)r[1], nc);
            goto fail;
        }
    }
    /* first pass counts the rows kept, second pass fills them in row order */
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = 0; i < n; i++) {
            const float *r = rows + 6 * i;
            if (!(r[4] > 0) || !(r[5] > 0))
                continue;
            float cx = r[2] * (float)W, cy = r[3] * (float)H, w = r[4] * (float)W, h = r[5] * (float)H;
            float hw = w / 2, hh = h / 2;
            float fb[4] = {cx - hw, cy - hh, cx + hw, cy + hh};
            if (!(((fb[0] + fb[1]) + fb[2]) + fb[3] > 0))
                continue;
            int b = (int)r[0];
            if (pass == 0) {
                out->count[b]++;
                continue;
            }
            int64_t e = (int64_t)b * out->M + fill[b]++;
            out->cls[e] = (int32_t)r[1];
            memcpy(out->box_f + 4 * e, fb, sizeof fb);
            double dcx = (double)r[2] * W, dcy = (double)r[3] * H, dw = (double)r[4] * W, dh = (double)r[5] * H;
            double *db = out->box_d + 4 * e;
            db[0] = dcx - dw / 2;
            db[1] = dcy - dh / 2;
            db[2] = dcx + dw / 2;
            db[3] = dcy + dh / 2;
        }
        if (pass == 0) {
            for (int b = 0; b < B; b++) {
                if (out->count[b] > out->M)
                    out->M = out->count[b];
                out->total += out->count[b];
            }
            size_t m = (size_t)B * (size_t)out->M + 1;
            out->cls = (int32_t *)calloc(m, sizeof(int32_t));
            out->box_f = (float *)calloc(m * 4, sizeof(float));
            out->box_d = (double *)calloc(m * 4, sizeof(double));
            if (!out->cls || !out->box_f || !out->box_d) {
                ptl_set_error(PTL_ERR_MEMORY, "objective: out of host memory for the targets");
                goto fail;
            }
        }
    }
    free(fill);
    return 0;
fail:
    free(fill);
    ptl_obj_targets_free(out);
    return -1;
}

int ptl_obj_check_assignment(const int32_t *gt, int B, int64_t A, const ptl_obj_targets *tg, const char *arg)
{
    for (int b = 0; b < B; b++)
        for (int64_t a = 0; a < A; a++) {
            int32_t j = gt[(int64_t)b * A + a];
            if (j < -1 || j >= tg->count[b])
                return ptl_set_error(PTL_ERR_VALUE,
                                     "%s: image %d anchor %lld is assigned to target %d, but the image has %d "
                                     "targets (use -1 for background)",
                                     arg, b, (long long)a, (int)j, (int)tg->count[b]);
        }
    return 0;
}

#define OBJ_IS_DOUBLE 0
#define OBJ_T float
#define OBJ_FN(n) obj_f_##n
#define OBJ_CPU(n) obj_cpu_f_##n
#define OBJ_MUL(a, b) PTL_FMUL(a, b)
#define OBJ_ADD(a, b) PTL_FADD(a, b)
#define OBJ_DIV(a, b) PTL_FDIV(a, b)
#define OBJ_SUB(a, b) PTL_FSUB(a, b)
#include "objective_cpu_tmpl.h"

#define OBJ_IS_DOUBLE 1
#define OBJ_T double
#define OBJ_FN(n) obj_d_##n
#define OBJ_CPU(n) obj_cpu_d_##n
#define OBJ_MUL(a, b) ((a) * (b))
#define OBJ_ADD(a, b) ((a) + (b))
#define OBJ_DIV(a, b) ((a) / (b))
#define OBJ_SUB(a, b) ((a) - (b))
#include "objective_cpu_tmpl.h"

int ptl_obj_check_args(const ptl_obj_args *a, ptl_device_type dev)
{
    const int64_t want_a = ptl_obj_num_anchors(a->H, a->W);
    if (want_a < 0)
        return -1;
    if (a->A != want_a)
        return ptl_set_error(PTL_ERR_VALUE, "outputs: %lld anchors do not match img_size %dx%d (%lld anchors)",
                             (long long)a->A, a->H, a->W, (long long)want_a);
    if (a->B <= 0 || a->nc <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "outputs: batch size and number of classes must be positive");
    if (dev == PTL_CPU && a->dtype != PTL_FLOAT32 && a->dtype != PTL_FLOAT64)
        return ptl_set_error(PTL_ERR_TYPE, "outputs: CPU outputs must be float32 or float64, got %s",
                             ptl_dtype_name(a->dtype));
    if (dev == PTL_CUDA && a->dtype != PTL_FLOAT32 && a->dtype != PTL_BFLOAT16 && a->dtype != PTL_FLOAT16)
        return ptl_set_error(PTL_ERR_TYPE, "outputs: CUDA outputs must be float32, bfloat16 or float16, got %s",
                             ptl_dtype_name(a->dtype));
    if (!(a->o2m_weight >= 0 && a->o2m_weight <= 1))
        return ptl_set_error(PTL_ERR_VALUE, "o2m_weight: expected a value in [0, 1], got %g", a->o2m_weight);
    for (int k = 0; k < 3; k++)
        if (!(a->gain[k] >= 0 && a->gain[k] < INFINITY))
            return ptl_set_error(PTL_ERR_VALUE, "gains[%d]: expected a finite value >= 0, got %g", k, a->gain[k]);
    if (!(a->grad_scale > 0 && a->grad_scale < INFINITY))
        return ptl_set_error(PTL_ERR_VALUE, "grad_scale: expected a finite value > 0, got %g", a->grad_scale);
    if (a->grad_scale_dev && dev != PTL_CUDA)
        return ptl_set_error(PTL_ERR_VALUE, "scale_from: a float32 tensor on the outputs' CUDA device is needed");
    if (a->assign_in && (!a->assign_gt[0] || !a->assign_gt[1] || !a->assign_score[0] || !a->assign_score[1]))
        return ptl_set_error(PTL_ERR_VALUE, "assign_in: needs assign_gt and assign_score");
    if (!a->losses)
        return ptl_set_error(PTL_ERR_VALUE, "losses: required");
    return 0;
}

#ifdef PTL_WITH_CUDA
static void workspace_destroy(void *ws) { ptl_obj_workspace_destroy((ptl_obj_workspace *)ws); }

/* A given assignment is validated on the host (a copy, then a wait: assign_in is a test path, never a
 * training step) so that a bad index raises instead of reading past the targets on the device. */
static int check_device_assignment(ptl_cuda_ctx *ctx, const ptl_obj_args *a, const ptl_obj_targets *tg)
{
    const size_t nbytes = sizeof(int32_t) * (size_t)a->B * (size_t)a->A;
    int32_t *host = (int32_t *)malloc(nbytes ? nbytes : 1);
    if (!host)
        return ptl_set_error(PTL_ERR_MEMORY, "objective: out of host memory");
    for (int i = 0; i < 2; i++) {
        PTL_CUDA_TRY(cudaMemcpyAsync(host, a->assign_gt[i], nbytes, cudaMemcpyDeviceToHost, ctx->stream));
        PTL_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
        PTL_CHECK(ptl_obj_check_assignment(host, a->B, a->A, tg, i ? "assign_gt[1]" : "assign_gt[0]"));
    }
    free(host);
    return 0;
fail:
    free(host);
    return -1;
}

/* The CUDA objective with the device's workspace (created on first use, kept in the device context and
 * freed with it); the context's ext lock serialises callers. */
static int objective_cuda(ptl_cuda_ctx *ctx, const ptl_obj_args *a, const ptl_obj_targets *tg)
{
    if (a->assign_in && check_device_assignment(ctx, a, tg))
        return -1;
    pthread_mutex_lock(&ctx->ext_lock);
    ptl_ctx_ext *ext = &ctx->ext[PTL_CTX_OBJECTIVE];
    int rc = 0;
    if (!ext->ptr) {
        ptl_obj_workspace *ws = NULL;
        rc = ptl_obj_workspace_create(ctx->rt, ctx->device, &ws);
        if (rc == 0)
            *ext = (ptl_ctx_ext){ws, workspace_destroy};
    }
    if (rc == 0)
        rc = ptl_objective_cuda((ptl_obj_workspace *)ext->ptr, a, tg);
    pthread_mutex_unlock(&ctx->ext_lock);
    return rc;
}
#endif

int ptl_objective(struct ptl_cuda_ctx *ctx, const ptl_obj_args *a, const ptl_obj_targets *tg)
{
    if (ptl_obj_check_args(a, ctx ? PTL_CUDA : PTL_CPU) || ptl_fault_hit(PTL_FAULT_OBJECTIVE))
        return -1;
    if (!ctx)
        return ptl_objective_cpu(a, tg);
#ifdef PTL_WITH_CUDA
    return objective_cuda(ctx, a, tg);
#else
    return ptl_set_error(PTL_ERR_RUNTIME, "objective: ptl was built without CUDA");
#endif
}

int ptl_objective_cpu(const ptl_obj_args *args, const ptl_obj_targets *tg)
{
    if (args->dtype == PTL_FLOAT32)
        return obj_cpu_f_run(args, tg);
    if (args->dtype == PTL_FLOAT64)
        return obj_cpu_d_run(args, tg);
    return ptl_set_error(PTL_ERR_TYPE, "objective: CPU outputs must be float32 or float64, got %s",
                         ptl_dtype_name(args->dtype));
}
