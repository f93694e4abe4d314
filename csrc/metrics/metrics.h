/* Validation metrics on the CPU (spec §8.3-8.6): mapping boxes back through the letterbox, matching
 * predictions to ground truth at 10 IoU thresholds, AP per class, precision/recall at the best mean
 * F1, fitness. These run once per validation, so they stay on the host, in double precision. */
#ifndef PTL_METRICS_H
#define PTL_METRICS_H

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_NUM_IOU 10

/* The IoU thresholds 0.50, 0.55, ..., 0.95, computed as numpy.linspace(0.5, 0.95, 10) does. */
void ptl_iou_thresholds(double t[PTL_NUM_IOU]);

/* In place, n boxes xyxy: subtract the letterbox padding, divide by the resize gain, clip to the
 * original width x height. */
void ptl_scale_boxes(double *boxes, int64_t n, double gain_x, double gain_y, double pad_x, double pad_y,
                     double width, double height);

/* One image: predictions (n, 4) xyxy with classes, ground truth (m, 4) with classes.
 * tp (n, 10): 1 where the prediction is a true positive at that threshold. Predictions must be in
 * descending score order for the spec's "lowest index wins" rule to mean "highest score wins". */
int ptl_match_predictions(int64_t n, const double *pred_boxes, const int64_t *pred_cls, int64_t m,
                          const double *gt_boxes, const int64_t *gt_cls, uint8_t *tp);

/* AP results. The caller provides arrays with room for `capacity` classes (the number of ground-truth
 * boxes is always enough); the function fills `nclasses` of them. */
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
    double mp, mr, map50, map, fitness;
    int64_t best_index; /* index of the best mean-F1 point on the 1000-point confidence grid */
    double best_conf;   /* its confidence */
    int any_tp;         /* 0: no true positive anywhere, every metric reported as 0 */
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
