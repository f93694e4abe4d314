/* Validation metrics on the CPU, as Ultralytics 8.4.190 computes them (docs/ultralytics_parity.md):
 * the float32 box IoU of its box_iou, greedy matching of predictions to ground truth at 10 IoU
 * thresholds, AP per class with its curves, precision/recall at the best smoothed mean F1, fitness, and
 * the detection confusion matrix. These run once per validation, so they stay on the host; the
 * ranking and integration are in double precision like its NumPy code. */
#ifndef PTL_METRICS_H
#define PTL_METRICS_H

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_NUM_IOU 10
#define PTL_AP_CURVE 1000 /* confidence (and recall) grid of the P/R/F1 and PR curves */
#define PTL_AP_RECALL 101 /* recall grid of the AP integral */
#define PTL_AP_SMOOTH 101 /* box filter width on the mean F1 curve: round(1000 * 0.1 * 2) // 2 + 1 */
#define PTL_CM_IOU 0.45   /* ConfusionMatrix.process_batch's matching IoU */
#define PTL_CM_CONF 0.25  /* and its default confidence (the validator passes its own conf, 0.001) */

/* The IoU thresholds 0.50, 0.55, ..., 0.95 as float32 (torch.linspace(0.5, 0.95, 10)). */
void ptl_iou_thresholds(float t[PTL_NUM_IOU]);

/* In place, n boxes xyxy: subtract the letterbox padding, divide by the resize gain, clip to the
 * original width x height. */
void ptl_scale_boxes(double *boxes, int64_t n, double gain_x, double gain_y, double pad_x, double pad_y,
                     double width, double height);

/* IoU of two xyxy boxes in float32 with box_iou's operations: inter / ((area_a + area_b - inter) + 1e-7). */
float ptl_box_iou_f(const float *a, const float *b);

/* One image: predictions (n, 4) xyxy in descending confidence order, ground truth (m, 4); classes int64.
 * tp (n, 10): 1 where the prediction is a true positive at that threshold. Greedy per threshold, in
 * prediction order: each prediction with a same-class IoU >= 0.5 somewhere takes the unclaimed ground
 * truth of highest IoU (first index on ties), a true positive when that IoU reaches the threshold. */
int ptl_match_predictions(int64_t n, const float *pred_boxes, const int64_t *pred_cls, int64_t m,
                          const float *gt_boxes, const int64_t *gt_cls, uint8_t *tp);

/* One image into the (nc + 1) x (nc + 1) confusion matrix, indexed [predicted][true], background last:
 * predictions with conf > conf_thres, class-agnostic greedy matching in descending confidence (stable),
 * each taking the unclaimed ground truth of highest IoU when it exceeds iou_thres. Counts are added. */
int ptl_confusion_update(int64_t *matrix, int64_t nc, int64_t n, const float *pred_boxes, const float *pred_conf,
                         const int64_t *pred_cls, int64_t m, const float *gt_boxes, const int64_t *gt_cls,
                         double conf_thres, double iou_thres);

/* AP results. The caller provides arrays with room for `capacity` classes (the number of ground-truth
 * boxes is always enough); the function fills `nclasses` of them. The curve arrays may be NULL. */
typedef struct {
    int64_t capacity;
    int64_t nclasses;   /* distinct classes present in the ground truth, ascending */
    int64_t *classes;   /* [capacity] */
    int64_t *n_gt;      /* [capacity] ground-truth boxes per class */
    int64_t *n_pred;    /* [capacity] predictions per class */
    double *ap;         /* [capacity * 10] AP per class and threshold */
    double *precision;  /* [capacity] at the best mean-F1 confidence */
    double *recall;     /* [capacity] */
    double *f1;         /* [capacity] */
    double *tp, *fp;    /* [capacity] round(r * n_gt), round(tp / (p + 1e-16) - tp) at that confidence */
    double *p_curve, *r_curve, *f1_curve; /* [capacity * 1000] vs confidence (or NULL) */
    double *pr_curve;   /* [capacity * 1000] precision envelope vs recall at IoU 0.5 (or NULL) */
    double mp, mr, map50, map75, map, fitness;
    int64_t best_index; /* index of the best mean-F1 point on the 1000-point confidence grid */
    double best_conf;   /* its confidence */
} ptl_ap_result;

/* n predictions over the whole dataset (tp (n, 10), confidence, class), m ground-truth classes. */
int ptl_ap_per_class(int64_t n, const uint8_t *tp, const double *conf, const int64_t *pred_cls, int64_t m,
                     const int64_t *gt_cls, ptl_ap_result *res);

/* numpy.interp(x, xp, fp, left, right) for ascending xp (duplicates allowed), same branch rules. */
double ptl_interp(double x, const double *xp, const double *fp, int64_t n, double left, double right);

#ifdef __cplusplus
}
#endif

#endif
