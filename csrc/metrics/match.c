/* Letterbox inverse and per-image matching (spec §8.2.4, §8.3). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

void ptl_iou_thresholds(double t[PTL_NUM_IOU])
{
    double step = (0.95 - 0.5) / (PTL_NUM_IOU - 1);
    for (int i = 0; i < PTL_NUM_IOU - 1; i++)
        t[i] = (double)i * step + 0.5;
    t[PTL_NUM_IOU - 1] = 0.95;
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

/* Plain IoU as the spec writes it, ground truth first: inter / (area_gt + area_pred - inter + 1e-7). */
static double box_iou(const double *g, const double *p)
{
    double w = fmin(g[2], p[2]) - fmax(g[0], p[0]);
    double h = fmin(g[3], p[3]) - fmax(g[1], p[1]);
    double inter = (w > 0.0 ? w : 0.0) * (h > 0.0 ? h : 0.0);
    double ag = (g[2] - g[0]) * (g[3] - g[1]), ap = (p[2] - p[0]) * (p[3] - p[1]);
    return inter / (ag + ap - inter + 1e-7);
}

/* For every threshold t, a prediction's first pair after sorting by IoU is its highest-IoU ground
 * truth whenever that IoU reaches t, so the best ground truth per prediction is found once; ties go
 * to the lower ground-truth index (the spec leaves them open). Then, per t and per ground truth, the
 * lowest prediction index among those whose best pair points at it is the true positive. */
int ptl_match_predictions(int64_t n, const double *pred_boxes, const int64_t *pred_cls, int64_t m,
                          const double *gt_boxes, const int64_t *gt_cls, uint8_t *tp)
{
    int64_t *best = NULL, *taken = NULL;
    double *best_iou = NULL;
    double thr[PTL_NUM_IOU];
    if (n < 0 || m < 0)
        return ptl_set_error(PTL_ERR_VALUE, "match_predictions: negative box count");
    memset(tp, 0, (size_t)n * PTL_NUM_IOU);
    if (n == 0 || m == 0)
        return 0;
    best = (int64_t *)malloc((size_t)n * sizeof *best);
    best_iou = (double *)malloc((size_t)n * sizeof *best_iou);
    taken = (int64_t *)malloc((size_t)m * sizeof *taken);
    if (!best || !best_iou || !taken) {
        ptl_set_error(PTL_ERR_MEMORY, "match_predictions: out of host memory");
        goto fail;
    }
    for (int64_t j = 0; j < n; j++) {
        best[j] = -1;
        best_iou[j] = 0.0;
        for (int64_t g = 0; g < m; g++) {
            if (gt_cls[g] != pred_cls[j])
                continue;
            double iou = box_iou(gt_boxes + g * 4, pred_boxes + j * 4);
            if (best[j] < 0 || iou > best_iou[j]) {
                best[j] = g;
                best_iou[j] = iou;
            }
        }
    }
    ptl_iou_thresholds(thr);
    for (int t = 0; t < PTL_NUM_IOU; t++) {
        for (int64_t g = 0; g < m; g++)
            taken[g] = 0;
        for (int64_t j = 0; j < n; j++) {
            if (best[j] >= 0 && best_iou[j] >= thr[t] && !taken[best[j]]) {
                taken[best[j]] = 1;
                tp[j * PTL_NUM_IOU + t] = 1;
            }
        }
    }
    free(best);
    free(best_iou);
    free(taken);
    return 0;
fail:
    free(best);
    free(best_iou);
    free(taken);
    return -1;
}
