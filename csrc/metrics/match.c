/* Letterbox inverse, the float32 box IoU and per-image matching at 10 IoU thresholds, as Ultralytics
 * 8.4.190's DetectionValidator matches (BaseValidator.match_predictions, greedy branch). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../ops/fpmath.h"
#include "metrics.h"

void ptl_iou_thresholds(float t[PTL_NUM_IOU])
{
    /* numpy.linspace(0.5, 0.95, 10) rounded to float32 equals torch.linspace's float32 values */
    double step = (0.95 - 0.5) / (PTL_NUM_IOU - 1);
    for (int i = 0; i < PTL_NUM_IOU - 1; i++)
        t[i] = (float)((double)i * step + 0.5);
    t[PTL_NUM_IOU - 1] = 0.95f;
}

static double clip(double v, double hi) { return v < 0.0 ? 0.0 : v > hi ? hi : v; }

void ptl_scale_boxes(double *boxes, int64_t n, double gain_x, double gain_y, double pad_x, double pad_y,
                     double width, double height)
{
    for (int64_t i = 0; i < n; i++) {
        double *b = boxes + i * 4;
        b[0] = clip((b[0] - pad_x) / gain_x, width);
        b[1] = clip((b[1] - pad_y) / gain_y, height);
        b[2] = clip((b[2] - pad_x) / gain_x, width);
        b[3] = clip((b[3] - pad_y) / gain_y, height);
    }
}

/* torch.minimum / maximum propagate NaN */
static float nan_min(float a, float b) { return a != a || b != b ? NAN : fminf(a, b); }
static float nan_max(float a, float b) { return a != a || b != b ? NAN : fmaxf(a, b); }

/* box_iou's float32 operations in its order; the clamp keeps NaN like torch.clamp. */
float ptl_box_iou_f(const float *a, const float *b)
{
    float w = PTL_FSUB(nan_min(a[2], b[2]), nan_max(a[0], b[0]));
    float h = PTL_FSUB(nan_min(a[3], b[3]), nan_max(a[1], b[1]));
    w = w < 0.0f ? 0.0f : w;
    h = h < 0.0f ? 0.0f : h;
    float inter = PTL_FMUL(w, h);
    float area_a = PTL_FMUL(PTL_FSUB(a[2], a[0]), PTL_FSUB(a[3], a[1]));
    float area_b = PTL_FMUL(PTL_FSUB(b[2], b[0]), PTL_FSUB(b[3], b[1]));
    return PTL_FDIV(inter, PTL_FADD(PTL_FSUB(PTL_FADD(area_a, area_b), inter), 1e-7f));
}

int ptl_match_predictions(int64_t n, const float *pred_boxes, const int64_t *pred_cls, int64_t m,
                          const float *gt_boxes, const int64_t *gt_cls, uint8_t *tp)
{
    float *iou = NULL, thr[PTL_NUM_IOU];
    uint8_t *claimed = NULL;
    if (n < 0 || m < 0)
        return ptl_set_error(PTL_ERR_VALUE, "match_predictions: negative box count");
    memset(tp, 0, (size_t)n * PTL_NUM_IOU);
    if (n == 0 || m == 0)
        return 0;
    iou = (float *)malloc((size_t)m * sizeof *iou);
    claimed = (uint8_t *)calloc((size_t)(m * PTL_NUM_IOU), 1);
    if (!iou || !claimed) {
        free(iou);
        free(claimed);
        return ptl_set_error(PTL_ERR_MEMORY, "match_predictions: out of host memory");
    }
    ptl_iou_thresholds(thr);
    for (int64_t j = 0; j < n; j++) {
        int any = 0;
        for (int64_t g = 0; g < m; g++) {
            /* IoU times the class-equality mask, so another class counts as IoU 0 */
            iou[g] = gt_cls[g] == pred_cls[j] ? ptl_box_iou_f(gt_boxes + g * 4, pred_boxes + j * 4) : 0.0f;
            any |= iou[g] >= thr[0];
        }
        if (!any)
            continue;
        for (int t = 0; t < PTL_NUM_IOU; t++) {
            /* argmax over the unclaimed targets (claimed ones count as 0); NumPy's argmax takes the
             * first maximum, and a NaN is the maximum */
            int64_t best = 0;
            float bv = claimed[t] ? 0.0f : iou[0];
            for (int64_t g = 1; g < m && bv == bv; g++) {
                float v = claimed[g * PTL_NUM_IOU + t] ? 0.0f : iou[g];
                if (v > bv || v != v) {
                    bv = v;
                    best = g;
                }
            }
            if (bv >= thr[t]) {
                tp[j * PTL_NUM_IOU + t] = 1;
                claimed[best * PTL_NUM_IOU + t] = 1;
            }
        }
    }
    free(iou);
    free(claimed);
    return 0;
}
