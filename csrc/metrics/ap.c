/* AP per class and its curves, precision/recall at the best smoothed mean F1, mAP and fitness, with the
 * rules of Ultralytics 8.4.190's ap_per_class / compute_ap / Metric (docs/ultralytics_parity.md).
 * The grids, interpolation and integration follow NumPy's linspace, interp and trapezoid (including
 * trapezoid's pairwise summation), so the results agree with that NumPy code to the last bits except
 * where it sums in another order (means over classes, the box filter). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

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

/* numpy.add.reduce of a contiguous float64 array (its pairwise summation, blocks of 128, 8 lanes). */
static double pairwise_sum(const double *a, int64_t n)
{
    if (n < 8) {
        double s = -0.0;
        for (int64_t i = 0; i < n; i++)
            s += a[i];
        return s;
    }
    if (n <= 128) {
        double r[8];
        int64_t i;
        for (int k = 0; k < 8; k++)
            r[k] = a[k];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int k = 0; k < 8; k++)
                r[k] += a[i + k];
        double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++)
            s += a[i];
        return s;
    }
    int64_t h = n / 2;
    h -= h % 8;
    return pairwise_sum(a, h) + pairwise_sum(a + h, n - h);
}

/* compute_ap: the recall/precision column of n >= 1 points gets the sentinels (0, 1) in front and
 * (recall[-1], 0), (1, 0) behind -- precision falls to 0 right at the last recall reached --, the
 * envelope is made monotone from the right, sampled by linear interpolation at 101 recall points and
 * integrated with the trapezoidal rule. mrec and mpre have room for n + 3 values and keep the envelope. */
static double compute_ap(const double *recall, const double *precision, int64_t n, double *mrec, double *mpre)
{
    double y[PTL_AP_RECALL], terms[PTL_AP_RECALL - 1];
    mrec[0] = 0.0;
    mpre[0] = 1.0;
    for (int64_t i = 0; i < n; i++) {
        mrec[i + 1] = recall[i];
        mpre[i + 1] = precision[i];
    }
    mrec[n + 1] = recall[n - 1];
    mpre[n + 1] = 0.0;
    mrec[n + 2] = 1.0;
    mpre[n + 2] = 0.0;
    for (int64_t i = n + 1; i >= 0; i--)
        mpre[i] = fmax(mpre[i], mpre[i + 1]);
    for (int i = 0; i < PTL_AP_RECALL; i++)
        y[i] = ptl_interp(grid(i, PTL_AP_RECALL), mrec, mpre, n + 3, mpre[0], mpre[n + 2]);
    for (int i = 0; i < PTL_AP_RECALL - 1; i++)
        terms[i] = (grid(i + 1, PTL_AP_RECALL) - grid(i, PTL_AP_RECALL)) * (y[i + 1] + y[i]) / 2.0;
    return pairwise_sum(terms, PTL_AP_RECALL - 1);
}

typedef struct {
    double conf;
    int64_t index;
} conf_index;

/* descending confidence; equal confidences keep the input order (NumPy's default sort leaves that open) */
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

static void *zalloc(size_t n, size_t size) { return calloc(n ? n : 1, size); }

int ptl_ap_per_class(int64_t n, const uint8_t *tp, const double *conf, const int64_t *pred_cls, int64_t m,
                     const int64_t *gt_cls, ptl_ap_result *res)
{
    conf_index *order = NULL;
    int64_t *sorted_gt = NULL, *start = NULL, *members = NULL, *fill = NULL;
    double *own_p = NULL, *own_r = NULL, *own_f1 = NULL, *negconf = NULL, *recall = NULL, *precision = NULL,
           *mrec = NULL, *mpre = NULL, *col_r = NULL, *col_p = NULL, *smooth_in = NULL;
    double *p_curve, *r_curve, *f1_curve;
    int64_t nc = 0, maxp = 1;
    int rc = -1;

    if (n < 0 || m < 0)
        return ptl_set_error(PTL_ERR_VALUE, "ap_per_class: negative count");
    /* NaN has no place in the confidence order: the sort's comparison would be inconsistent */
    for (int64_t i = 0; i < n; i++)
        if (isnan(conf[i]))
            return ptl_set_error(PTL_ERR_VALUE, "conf: prediction %lld has a NaN confidence", (long long)i);
    res->nclasses = 0;
    res->mp = res->mr = res->map50 = res->map75 = res->map = res->fitness = 0.0;
    res->best_index = 0;
    res->best_conf = 0.0;

    /* distinct ground-truth classes and their counts */
    sorted_gt = (int64_t *)zalloc((size_t)m, sizeof *sorted_gt);
    if (!sorted_gt)
        goto oom;
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
    p_curve = res->p_curve ? res->p_curve : (own_p = (double *)zalloc((size_t)(nc * PTL_AP_CURVE), sizeof *own_p));
    r_curve = res->r_curve ? res->r_curve : (own_r = (double *)zalloc((size_t)(nc * PTL_AP_CURVE), sizeof *own_r));
    f1_curve = res->f1_curve ? res->f1_curve
                             : (own_f1 = (double *)zalloc((size_t)(nc * PTL_AP_CURVE), sizeof *own_f1));
    if (!p_curve || !r_curve || !f1_curve)
        goto oom;
    for (int64_t c = 0; c < nc; c++) {
        res->n_pred[c] = 0;
        res->precision[c] = res->recall[c] = res->f1[c] = res->tp[c] = res->fp[c] = 0.0;
        for (int t = 0; t < PTL_NUM_IOU; t++)
            res->ap[c * PTL_NUM_IOU + t] = 0.0;
        for (int i = 0; i < PTL_AP_CURVE; i++) {
            p_curve[c * PTL_AP_CURVE + i] = r_curve[c * PTL_AP_CURVE + i] = f1_curve[c * PTL_AP_CURVE + i] = 0.0;
            if (res->pr_curve)
                res->pr_curve[c * PTL_AP_CURVE + i] = 0.0;
        }
    }
    if (nc == 0) {
        rc = 0; /* no ground truth: every metric stays 0 */
        goto fail;
    }

    /* predictions by descending confidence, bucketed per class */
    order = (conf_index *)zalloc((size_t)n, sizeof *order);
    start = (int64_t *)zalloc((size_t)nc + 1, sizeof *start);
    fill = (int64_t *)zalloc((size_t)nc, sizeof *fill);
    members = (int64_t *)zalloc((size_t)n, sizeof *members);
    if (!order || !start || !fill || !members)
        goto oom;
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
    negconf = (double *)malloc((size_t)maxp * sizeof *negconf);
    recall = (double *)malloc((size_t)(maxp * PTL_NUM_IOU) * sizeof *recall);
    precision = (double *)malloc((size_t)(maxp * PTL_NUM_IOU) * sizeof *precision);
    col_r = (double *)malloc((size_t)maxp * sizeof *col_r);
    col_p = (double *)malloc((size_t)maxp * sizeof *col_p);
    mrec = (double *)malloc((size_t)(maxp + 3) * sizeof *mrec);
    mpre = (double *)malloc((size_t)(maxp + 3) * sizeof *mpre);
    smooth_in = (double *)malloc((PTL_AP_CURVE + PTL_AP_SMOOTH - 1) * sizeof *smooth_in);
    if (!negconf || !recall || !precision || !col_r || !col_p || !mrec || !mpre || !smooth_in)
        goto oom;

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
        for (int i = 0; i < PTL_AP_CURVE; i++) {
            double x = -grid(i, PTL_AP_CURVE);
            r_curve[c * PTL_AP_CURVE + i] = ptl_interp(x, negconf, col_r, np_, 0.0, col_r[np_ - 1]);
            p_curve[c * PTL_AP_CURVE + i] = ptl_interp(x, negconf, col_p, np_, 1.0, col_p[np_ - 1]);
        }
        for (int t = 0; t < PTL_NUM_IOU; t++) {
            for (int64_t i = 0; i < np_; i++) {
                col_r[i] = recall[i * PTL_NUM_IOU + t];
                col_p[i] = precision[i * PTL_NUM_IOU + t];
            }
            res->ap[c * PTL_NUM_IOU + t] = compute_ap(col_r, col_p, np_, mrec, mpre);
            if (t == 0 && res->pr_curve)
                for (int i = 0; i < PTL_AP_CURVE; i++)
                    res->pr_curve[c * PTL_AP_CURVE + i] =
                        ptl_interp(grid(i, PTL_AP_CURVE), mrec, mpre, np_ + 3, mpre[0], mpre[np_ + 2]);
        }
    }

    /* F1 per class and point; its mean over classes, box-filtered with edge padding; first argmax */
    {
        const int half = PTL_AP_SMOOTH / 2;
        double mean_f1[PTL_AP_CURVE];
        for (int i = 0; i < PTL_AP_CURVE; i++) {
            double s = 0.0;
            for (int64_t c = 0; c < nc; c++) {
                int64_t k = c * PTL_AP_CURVE + i;
                f1_curve[k] = 2.0 * p_curve[k] * r_curve[k] / (p_curve[k] + r_curve[k] + 1e-16);
                s += f1_curve[k];
            }
            mean_f1[i] = s / (double)nc;
        }
        for (int i = 0; i < PTL_AP_CURVE + PTL_AP_SMOOTH - 1; i++)
            smooth_in[i] = i < half ? mean_f1[0] : i >= half + PTL_AP_CURVE ? mean_f1[PTL_AP_CURVE - 1] : mean_f1[i - half];
        double best = -INFINITY;
        for (int i = 0; i < PTL_AP_CURVE; i++) {
            double s = 0.0;
            for (int j = 0; j < PTL_AP_SMOOTH; j++)
                s += smooth_in[i + j] * (1.0 / PTL_AP_SMOOTH);
            if (s > best) {
                best = s;
                res->best_index = i;
            }
        }
        res->best_conf = grid((int)res->best_index, PTL_AP_CURVE);
    }
    {
        double sp = 0.0, sr = 0.0, s50 = 0.0, s75 = 0.0, sall = 0.0;
        for (int64_t c = 0; c < nc; c++) {
            int64_t k = c * PTL_AP_CURVE + res->best_index;
            double p = p_curve[k], r = r_curve[k];
            res->precision[c] = p;
            res->recall[c] = r;
            res->f1[c] = f1_curve[k];
            res->tp[c] = nearbyint(r * (double)res->n_gt[c]);
            res->fp[c] = nearbyint(res->tp[c] / (p + 1e-16) - res->tp[c]);
            sp += p;
            sr += r;
            s50 += res->ap[c * PTL_NUM_IOU];
            s75 += res->ap[c * PTL_NUM_IOU + 5];
            for (int t = 0; t < PTL_NUM_IOU; t++)
                sall += res->ap[c * PTL_NUM_IOU + t];
        }
        res->mp = sp / (double)nc;
        res->mr = sr / (double)nc;
        res->map50 = s50 / (double)nc;
        res->map75 = s75 / (double)nc;
        res->map = sall / (double)(nc * PTL_NUM_IOU);
        res->fitness = isnan(res->map) ? 0.0 : res->map; /* weights (0, 0, 0, 1) on nan_to_num'd means */
    }
    rc = 0;
    goto fail;
oom:
    ptl_set_error(PTL_ERR_MEMORY, "ap_per_class: out of host memory");
fail:
    free(order);
    free(sorted_gt);
    free(start);
    free(members);
    free(fill);
    free(own_p);
    free(own_r);
    free(own_f1);
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
