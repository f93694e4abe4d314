/* Detection confusion matrix, one image at a time, with the rules of Ultralytics 8.4.190's
 * ConfusionMatrix.process_batch (see metrics.h). */
#include <math.h>
#include <stdlib.h>

#include "metrics.h"

typedef struct {
    float conf;
    int64_t index;
} conf_index;

/* descending confidence, input order on ties (NumPy's stable argsort of -conf) */
static int by_conf_desc(const void *a, const void *b)
{
    const conf_index *x = (const conf_index *)a, *y = (const conf_index *)b;
    if (x->conf != y->conf)
        return x->conf > y->conf ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

int ptl_confusion_update(int64_t *matrix, int64_t nc, int64_t n, const float *pred_boxes, const float *pred_conf,
                         const int64_t *pred_cls, int64_t m, const float *gt_boxes, const int64_t *gt_cls,
                         double conf_thres, double iou_thres)
{
    int64_t *kept = NULL, *gt_match = NULL;
    uint8_t *matched = NULL;
    float *iou = NULL;
    conf_index *order = NULL;
    int64_t nk = 0, nr = nc + 1, nord = 0;
    /* NumPy and torch compare float32 values with a Python float in float32 */
    float thr = (float)iou_thres;
    int rc = -1;
    if (nc < 1 || n < 0 || m < 0)
        return ptl_set_error(PTL_ERR_VALUE, "confusion_matrix: expected classes >= 1 and counts >= 0");
    for (int64_t i = 0; i < n; i++)
        if (pred_cls[i] < 0 || pred_cls[i] >= nc)
            return ptl_set_error(PTL_ERR_VALUE, "pred_cls: prediction %lld has class %lld, outside [0, %lld)",
                                 (long long)i, (long long)pred_cls[i], (long long)nc);
    for (int64_t g = 0; g < m; g++)
        if (gt_cls[g] < 0 || gt_cls[g] >= nc)
            return ptl_set_error(PTL_ERR_VALUE, "gt_cls: ground truth %lld has class %lld, outside [0, %lld)",
                                 (long long)g, (long long)gt_cls[g], (long long)nc);
    if (m > 0 && n == 0) { /* checked before the confidence filter, as Ultralytics does */
        for (int64_t g = 0; g < m; g++)
            matrix[nc * nr + gt_cls[g]]++;
        return 0;
    }
    kept = (int64_t *)malloc((size_t)(n ? n : 1) * sizeof *kept);
    if (!kept)
        goto oom;
    for (int64_t i = 0; i < n; i++)
        if (pred_conf[i] > (float)conf_thres)
            kept[nk++] = i;
    if (m == 0) {
        for (int64_t k = 0; k < nk; k++)
            matrix[pred_cls[kept[k]] * nr + nc]++;
        rc = 0;
        goto done;
    }
    iou = (float *)malloc((size_t)(m * (nk ? nk : 1)) * sizeof *iou);
    gt_match = (int64_t *)malloc((size_t)m * sizeof *gt_match);
    matched = (uint8_t *)calloc((size_t)(nk ? nk : 1), 1);
    order = (conf_index *)malloc((size_t)(nk ? nk : 1) * sizeof *order);
    if (!iou || !gt_match || !matched || !order)
        goto oom;
    for (int64_t g = 0; g < m; g++) {
        gt_match[g] = -1;
        for (int64_t k = 0; k < nk; k++)
            iou[g * nk + k] = ptl_box_iou_f(gt_boxes + g * 4, pred_boxes + kept[k] * 4);
    }
    /* candidates: detections with some IoU above the threshold, by descending confidence */
    for (int64_t k = 0; k < nk; k++) {
        int any = 0;
        for (int64_t g = 0; g < m && !any; g++)
            any = iou[g * nk + k] > thr;
        if (any) {
            order[nord].conf = pred_conf[kept[k]];
            order[nord].index = k;
            nord++;
        }
    }
    qsort(order, (size_t)nord, sizeof *order, by_conf_desc);
    for (int64_t o = 0; o < nord; o++) {
        int64_t k = order[o].index, best = 0;
        float bv = iou[k];
        for (int64_t g = 1; g < m && bv == bv; g++) {
            float v = iou[g * nk + k];
            if (v > bv || v != v) {
                bv = v;
                best = g;
            }
        }
        if (bv > thr) {
            gt_match[best] = k;
            for (int64_t q = 0; q < nk; q++) /* a matched ground truth is out of every later match */
                iou[best * nk + q] = 0.0f;
        }
    }
    for (int64_t g = 0; g < m; g++) {
        if (gt_match[g] >= 0) {
            matched[gt_match[g]] = 1;
            matrix[pred_cls[kept[gt_match[g]]] * nr + gt_cls[g]]++; /* off the diagonal: FP and FN at once */
        } else {
            matrix[nc * nr + gt_cls[g]]++;
        }
    }
    for (int64_t k = 0; k < nk; k++)
        if (!matched[k])
            matrix[pred_cls[kept[k]] * nr + nc]++;
    rc = 0;
    goto done;
oom:
    ptl_set_error(PTL_ERR_MEMORY, "confusion_matrix: out of host memory");
done:
    free(kept);
    free(gt_match);
    free(matched);
    free(iou);
    free(order);
    return rc;
}
