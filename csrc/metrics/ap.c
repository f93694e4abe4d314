/* AP per class, precision/recall at the best mean F1, mAP and fitness (spec §8.4-8.6). The grids,
 * interpolation and integration follow numpy's linspace, interp and trapezoid exactly, so a NumPy
 * transcription of the spec agrees to rounding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

#define NCURVE 1000 /* confidence grid of the P/R/F1 curves */
#define NAP 101     /* recall grid of AP */
#define SMOOTH 101  /* box filter width on the mean F1 curve */

static double grid(int i, int num) { return i == num - 1 ? 1.0 : (double)i * (1.0 / (double)(num - 1)); }

double ptl_interp(double x, const double *xp, const double *fp, int64_t n, double left, double right)
{
    if (x > xp[n - 1])
        return right;
    if (x < xp[0])
        return left;
    int64_t lo = 0, hi = n; /* j = last index with xp[j] <= x */
    while (lo < hi) {
        int64_t mid = lo + ((hi - lo) >> 1);
        if (x >= xp[mid])
            lo = mid + 1;
        else
            hi = mid;
    }
    int64_t j = lo - 1;
    if (j == n - 1 || xp[j] == x)
        return fp[j];
    double slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
    double y = slope * (x - xp[j]) + fp[j];
    if (isnan(y)) {
        y = slope * (x - xp[j + 1]) + fp[j + 1];
        if (isnan(y) && fp[j] == fp[j + 1])
            y = fp[j];
    }
    return y;
}

/* AP of one recall/precision column (n points): envelope, 101-point linear interpolation, trapezoid.
 * mrec and mpre have room for n + 2 values. */
static double compute_ap(const double *recall, const double *precision, int64_t n, double *mrec, double *mpre)
{
    mrec[0] = 0.0;
    mpre[0] = 1.0;
    for (int64_t i = 0; i < n; i++) {
        mrec[i + 1] = recall[i];
        mpre[i + 1] = precision[i];
    }
    mrec[n + 1] = 1.0;
    mpre[n + 1] = 0.0;
    for (int64_t i = n; i >= 0; i--)
        mpre[i] = fmax(mpre[i], mpre[i + 1]);
    double ap = 0.0, prev_x = 0.0, prev_y = ptl_interp(0.0, mrec, mpre, n + 2, mpre[0], mpre[n + 1]);
    for (int i = 1; i < NAP; i++) {
        double x = grid(i, NAP), y = ptl_interp(x, mrec, mpre, n + 2, mpre[0], mpre[n + 1]);
        ap += (x - prev_x) * (y + prev_y) / 2.0;
        prev_x = x;
        prev_y = y;
    }
    return ap;
}

typedef struct {
    double conf;
    int64_t index;
} conf_index;

static int by_conf_desc(const void *a, const void *b)
{
    const conf_index *x = (const conf_index *)a, *y = (const conf_index *)b;
    if (x->conf != y->conf)
        return x->conf > y->conf ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static int by_value(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Index of class c in the sorted class list, or -1. */
static int64_t class_slot(const int64_t *classes, int64_t nc, int64_t c)
{
    int64_t lo = 0, hi = nc;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (classes[mid] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < nc && classes[lo] == c ? lo : -1;
}

int ptl_ap_per_class(int64_t n, const uint8_t *tp, const double *conf, const int64_t *pred_cls, int64_t m,
                     const int64_t *gt_cls, ptl_ap_result *res)
{
    conf_index *order = NULL;
    int64_t *sorted_gt = NULL, *start = NULL, *members = NULL, *fill = NULL;
    double *p_curve = NULL, *r_curve = NULL, *negconf = NULL, *recall = NULL, *precision = NULL, *mrec = NULL,
           *mpre = NULL, *col_r = NULL, *col_p = NULL, *smooth_in = NULL;
    int64_t nc = 0, maxp = 1;
    int rc = -1;

    if (n < 0 || m < 0)
        return ptl_set_error(PTL_ERR_VALUE, "ap_per_class: negative count");
    /* NaN has no place in the confidence order: the sort's comparison would be inconsistent */
    for (int64_t i = 0; i < n; i++)
        if (isnan(conf[i]))
            return ptl_set_error(PTL_ERR_VALUE, "conf: prediction %lld has a NaN confidence", (long long)i);
    res->nclasses = 0;
    res->mp = res->mr = res->map50 = res->map = res->fitness = 0.0;
    res->best_index = 0;
    res->best_conf = 0.0;
    res->any_tp = 0;
    for (int64_t i = 0; i < n * PTL_NUM_IOU; i++)
        if (tp[i]) {
            res->any_tp = 1;
            break;
        }

    /* distinct ground-truth classes and their counts */
    sorted_gt = (int64_t *)malloc((size_t)(m ? m : 1) * sizeof *sorted_gt);
    if (!sorted_gt) {
        ptl_set_error(PTL_ERR_MEMORY, "ap_per_class: out of host memory");
        goto fail;
    }
    memcpy(sorted_gt, gt_cls, (size_t)m * sizeof *sorted_gt);
    qsort(sorted_gt, (size_t)m, sizeof *sorted_gt, by_value);
    for (int64_t i = 0; i < m; i++) {
        if (i == 0 || sorted_gt[i] != sorted_gt[i - 1]) {
            if (nc == res->capacity) {
                ptl_set_error(PTL_ERR_VALUE, "ap_per_class: more classes than the result capacity %lld",
                              (long long)res->capacity);
                goto fail;
            }
            res->classes[nc] = sorted_gt[i];
            res->n_gt[nc] = 0;
            nc++;
        }
        res->n_gt[nc - 1]++;
    }
    res->nclasses = nc;
    for (int64_t c = 0; c < nc; c++) {
        res->n_pred[c] = 0;
        res->precision[c] = res->recall[c] = res->f1[c] = 0.0;
        for (int t = 0; t < PTL_NUM_IOU; t++)
            res->ap[c * PTL_NUM_IOU + t] = 0.0;
    }
    if (nc == 0 || !res->any_tp) {
        rc = 0; /* nothing to rank: every metric stays 0 */
        goto fail;
    }

    /* predictions by descending confidence (stable), bucketed per class */
    order = (conf_index *)malloc((size_t)(n ? n : 1) * sizeof *order);
    start = (int64_t *)calloc((size_t)nc + 1, sizeof *start);
    fill = (int64_t *)calloc((size_t)nc, sizeof *fill);
    members = (int64_t *)malloc((size_t)(n ? n : 1) * sizeof *members);
    if (!order || !start || !fill || !members) {
        ptl_set_error(PTL_ERR_MEMORY, "ap_per_class: out of host memory");
        goto fail;
    }
    for (int64_t i = 0; i < n; i++) {
        order[i].conf = conf[i];
        order[i].index = i;
    }
    qsort(order, (size_t)n, sizeof *order, by_conf_desc);
    for (int64_t i = 0; i < n; i++) {
        int64_t s = class_slot(res->classes, nc, pred_cls[i]);
        if (s >= 0)
            res->n_pred[s]++;
    }
    for (int64_t c = 0; c < nc; c++)
        start[c + 1] = start[c] + res->n_pred[c];
    for (int64_t i = 0; i < n; i++) {
        int64_t idx = order[i].index, s = class_slot(res->classes, nc, pred_cls[idx]);
        if (s >= 0)
            members[start[s] + fill[s]++] = idx;
    }

    for (int64_t c = 0; c < nc; c++)
        if (res->n_pred[c] > maxp)
            maxp = res->n_pred[c];
    p_curve = (double *)calloc((size_t)(nc * NCURVE), sizeof *p_curve);
    r_curve = (double *)calloc((size_t)(nc * NCURVE), sizeof *r_curve);
    negconf = (double *)malloc((size_t)maxp * sizeof *negconf);
    recall = (double *)malloc((size_t)(maxp * PTL_NUM_IOU) * sizeof *recall);
    precision = (double *)malloc((size_t)(maxp * PTL_NUM_IOU) * sizeof *precision);
    col_r = (double *)malloc((size_t)maxp * sizeof *col_r);
    col_p = (double *)malloc((size_t)maxp * sizeof *col_p);
    mrec = (double *)malloc((size_t)(maxp + 2) * sizeof *mrec);
    mpre = (double *)malloc((size_t)(maxp + 2) * sizeof *mpre);
    smooth_in = (double *)malloc((NCURVE + SMOOTH - 1) * sizeof *smooth_in);
    if (!p_curve || !r_curve || !negconf || !recall || !precision || !col_r || !col_p || !mrec || !mpre ||
        !smooth_in) {
        ptl_set_error(PTL_ERR_MEMORY, "ap_per_class: out of host memory");
        goto fail;
    }

    for (int64_t c = 0; c < nc; c++) {
        int64_t np_ = res->n_pred[c];
        const int64_t *mem = members + start[c];
        if (np_ == 0)
            continue; /* AP 0, curves 0 */
        double n_l = (double)res->n_gt[c];
        for (int t = 0; t < PTL_NUM_IOU; t++) {
            double tpc = 0.0, fpc = 0.0;
            for (int64_t i = 0; i < np_; i++) {
                int hit = tp[mem[i] * PTL_NUM_IOU + t] != 0;
                tpc += hit;
                fpc += 1 - hit;
                recall[i * PTL_NUM_IOU + t] = tpc / (n_l + 1e-16);
                precision[i * PTL_NUM_IOU + t] = tpc / (tpc + fpc);
            }
        }
        for (int64_t i = 0; i < np_; i++) {
            negconf[i] = -conf[mem[i]];
            col_r[i] = recall[i * PTL_NUM_IOU];
            col_p[i] = precision[i * PTL_NUM_IOU];
        }
        for (int i = 0; i < NCURVE; i++) {
            double x = -grid(i, NCURVE);
            r_curve[c * NCURVE + i] = ptl_interp(x, negconf, col_r, np_, 0.0, col_r[np_ - 1]);
            p_curve[c * NCURVE + i] = ptl_interp(x, negconf, col_p, np_, 1.0, col_p[np_ - 1]);
        }
        for (int t = 0; t < PTL_NUM_IOU; t++) {
            for (int64_t i = 0; i < np_; i++) {
                col_r[i] = recall[i * PTL_NUM_IOU + t];
                col_p[i] = precision[i * PTL_NUM_IOU + t];
            }
            res->ap[c * PTL_NUM_IOU + t] = compute_ap(col_r, col_p, np_, mrec, mpre);
        }
    }

    /* mean F1 over classes, box-filtered with edge padding, first argmax */
    {
        const int half = SMOOTH / 2;
        double mean_f1[NCURVE];
        for (int i = 0; i < NCURVE; i++) {
            double s = 0.0;
            for (int64_t c = 0; c < nc; c++) {
                double p = p_curve[c * NCURVE + i], r = r_curve[c * NCURVE + i];
                s += 2.0 * p * r / (p + r + 1e-16);
            }
            mean_f1[i] = s / (double)nc;
        }
        for (int i = 0; i < NCURVE + SMOOTH - 1; i++)
            smooth_in[i] = i < half ? mean_f1[0] : i >= half + NCURVE ? mean_f1[NCURVE - 1] : mean_f1[i - half];
        double best = -INFINITY;
        for (int i = 0; i < NCURVE; i++) {
            double s = 0.0;
            for (int j = 0; j < SMOOTH; j++)
                s += smooth_in[i + j] * (1.0 / SMOOTH);
            if (s > best) {
                best = s;
                res->best_index = i;
            }
        }
        res->best_conf = grid((int)res->best_index, NCURVE);
    }
    {
        double sp = 0.0, sr = 0.0, s50 = 0.0, sall = 0.0;
        for (int64_t c = 0; c < nc; c++) {
            double p = p_curve[c * NCURVE + res->best_index], r = r_curve[c * NCURVE + res->best_index];
            res->precision[c] = p;
            res->recall[c] = r;
            res->f1[c] = 2.0 * p * r / (p + r + 1e-16);
            sp += p;
            sr += r;
            s50 += res->ap[c * PTL_NUM_IOU];
            for (int t = 0; t < PTL_NUM_IOU; t++)
                sall += res->ap[c * PTL_NUM_IOU + t];
        }
        res->mp = sp / (double)nc;
        res->mr = sr / (double)nc;
        res->map50 = s50 / (double)nc;
        res->map = sall / (double)(nc * PTL_NUM_IOU);
        res->fitness = res->map;
    }
    rc = 0;
fail:
    free(order);
    free(sorted_gt);
    free(start);
    free(members);
    free(fill);
    free(p_curve);
    free(r_curve);
    free(negconf);
    free(recall);
    free(precision);
    free(col_r);
    free(col_p);
    free(mrec);
    free(mpre);
    free(smooth_in);
    return rc;
}
