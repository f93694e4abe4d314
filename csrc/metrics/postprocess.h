/* Post-processing of the head outputs into detections, the two ways Ultralytics 8.4.190 does it.
 *
 * Inputs are NHWC-flattened head outputs: boxes (B, A, 4) = l, t, r, b in grid units, scores
 * (B, A, nc) = logits; anchors are the cells of P3, P4, P5 (strides 8, 16, 32), each level row-major,
 * so A = sum_l (H/s_l)(W/s_l) for an input of H x W pixels (both multiples of 32). Scores are
 * sigmoid(logit) computed as torch does, 1 / (1 + exp(-x)) in float32 (exp rounded from double).
 *
 * End-to-end (end2end=True; the one-to-one head): per image, the top-k anchors by their largest class
 * logit, then the top-k (anchor, class) pairs of those anchors' class rows, decoded straight to pixel
 * xyxy, kept while score > conf. Output out (B, k, 6) = x1, y1, x2, y2, score, class (pixels, score
 * descending), k = min(max_det, A); count (B): the rows of each image that passed `conf`; rows past
 * count are zero. Ranking uses the logits: sigmoid is monotone, so this is the order on scores with
 * ties among equal scores broken by the larger logit. Remaining ties (equal logits; torch.topk leaves
 * them open) go to the lower anchor index, then to the earlier anchor in the first selection and the
 * lower class. NaN logits rank below everything.
 *
 * NMS (end2end=False, the default of 8.4.190's validation and prediction; the one-to-many head): boxes
 * decoded through centre/size (dist2bbox xywh, times the stride, then xywh2xyxy, in float32 as torch
 * does); every (anchor, class) pair with score > conf is a candidate (multi_label, as the validator
 * calls it), or only each anchor's best class (first on ties; none when a score is NaN) when its score
 * > conf (multi_label = 0, as the predictor calls it); more than max_nms keep the max_nms best; candidates ranked by score descending, ties to the lower pair index
 * a * nc + c; greedy NMS as torchvision.ops.nms on the boxes offset by class * max_wh (class-aware;
 * agnostic: no offset): a candidate is dropped when its IoU with a kept box, inter / (area_kept +
 * area - inter) in float32, exceeds iou (compared in double). Output out (B, max_det, 6) as above,
 * at most max_det rows per image, score descending; rows past count are zero. */
#ifndef PTL_METRICS_POSTPROCESS_H
#define PTL_METRICS_POSTPROCESS_H

#include <math.h>
#include <string.h>

#include "../ops/fpmath.h"
#include "../ptl.h"
#include "../runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_PP_MAX_DET 1024 /* largest max_det the kernels accept */
#define PTL_NMS_MAX_NMS 30000 /* non_max_suppression's defaults */
#define PTL_NMS_MAX_WH 7680
#define PTL_NMS_MAX_CAND 32768 /* largest max_nms the kernels accept */

/* Validates the shapes; returns k (> 0) or -1 after setting an error. */
int64_t ptl_postprocess_check(int64_t B, int64_t A, int64_t nc, int img_h, int img_w, int max_det);

int ptl_postprocess_cpu(const float *boxes, const float *scores, int64_t B, int64_t A, int64_t nc,
                        int img_h, int img_w, int max_det, float conf, float *out, int32_t *count);

/* NMS path: validates the shapes and settings; returns 0 or -1 after setting an error. */
int ptl_nms_check(int64_t B, int64_t A, int64_t nc, int img_h, int img_w, int max_det, int max_nms, double iou);

int ptl_nms_cpu(const float *boxes, const float *scores, int64_t B, int64_t A, int64_t nc, int img_h, int img_w,
                int max_det, float conf, double iou, int max_nms, int agnostic, int multi_label, float *out,
                int32_t *count);

#ifdef PTL_WITH_CUDA
/* Device pointers; all work on the device's stream, no synchronisation. `keys` is scratch of
 * B * A uint64 values on the device. */
int ptl_postprocess_cuda(ptl_runtime *rt, int device, const float *boxes, const float *scores, int64_t B,
                         int64_t A, int64_t nc, int img_h, int img_w, int max_det, float conf,
                         uint64_t *keys, float *out, int32_t *count);
/* `keys` is scratch of B * max_nms uint64 values on the device. */
int ptl_nms_cuda(ptl_runtime *rt, int device, const float *boxes, const float *scores, int64_t B, int64_t A,
                 int64_t nc, int img_h, int img_w, int max_det, float conf, double iou, int max_nms, int agnostic,
                 int multi_label, uint64_t *keys, float *out, int32_t *count);
#endif

/* Anchor centre (grid units) and stride of anchor `a` for an img_h x img_w input. */
PTL_HD void ptl_pp_anchor(int64_t a, int img_h, int img_w, float *ax, float *ay, float *stride)
{
    int s = 8;
    for (int l = 0; l < 3; l++, s *= 2) {
        int64_t w = img_w / s, n = (int64_t)(img_h / s) * w;
        if (a < n || l == 2) {
            *ax = (float)(a % w) + 0.5f;
            *ay = (float)(a / w) + 0.5f;
            *stride = (float)s;
            return;
        }
        a -= n;
    }
}

/* torch's float32 sigmoid, 1 / (1 + e) with e = exp(-x) rounded to float32 */
PTL_HD float ptl_pp_sigmoid(float x) { return PTL_FDIV(1.0f, PTL_FADD(1.0f, (float)exp(-(double)x))); }

/* A uint32 whose unsigned order is the float order; NaN maps to 0 (lowest). */
PTL_HD uint32_t ptl_pp_order(float f)
{
    uint32_t u;
    if (f != f)
        return 0u;
#if defined(__CUDA_ARCH__)
    u = __float_as_uint(f);
#else
    memcpy(&u, &f, sizeof u);
#endif
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Unique ranking key: larger value first, then lower index. */
PTL_HD uint64_t ptl_pp_key(float v, uint32_t index)
{
    return ((uint64_t)ptl_pp_order(v) << 32) | (uint64_t)(0xFFFFFFFFu - index);
}

PTL_HD uint32_t ptl_pp_key_index(uint64_t key) { return 0xFFFFFFFFu - (uint32_t)(key & 0xFFFFFFFFu); }

/* Writes one output row for the pick (anchor a, class c, logit v). */
PTL_HD void ptl_pp_row(const float *box, int64_t a, int c, float v, int img_h, int img_w, float *row)
{
    float ax, ay, s;
    ptl_pp_anchor(a, img_h, img_w, &ax, &ay, &s);
    row[0] = (ax - box[0]) * s;
    row[1] = (ay - box[1]) * s;
    row[2] = (ax + box[2]) * s;
    row[3] = (ay + box[3]) * s;
    row[4] = ptl_pp_sigmoid(v);
    row[5] = (float)c;
}

/* NMS path: the pixel xyxy box of anchor `a` through dist2bbox(xywh=True) * stride and xywh2xyxy. */
PTL_HD void ptl_nms_box(const float *box, int64_t a, int img_h, int img_w, float *xyxy)
{
    float ax, ay, s;
    ptl_pp_anchor(a, img_h, img_w, &ax, &ay, &s);
    float x1 = PTL_FSUB(ax, box[0]), y1 = PTL_FSUB(ay, box[1]);
    float x2 = PTL_FADD(ax, box[2]), y2 = PTL_FADD(ay, box[3]);
    float cx = PTL_FMUL(PTL_FDIV(PTL_FADD(x1, x2), 2.0f), s), cy = PTL_FMUL(PTL_FDIV(PTL_FADD(y1, y2), 2.0f), s);
    float hw = PTL_FDIV(PTL_FMUL(PTL_FSUB(x2, x1), s), 2.0f), hh = PTL_FDIV(PTL_FMUL(PTL_FSUB(y2, y1), s), 2.0f);
    xyxy[0] = PTL_FSUB(cx, hw);
    xyxy[1] = PTL_FSUB(cy, hh);
    xyxy[2] = PTL_FADD(cx, hw);
    xyxy[3] = PTL_FADD(cy, hh);
}

/* The box NMS compares: xyxy offset by class * max_wh (0 when agnostic), and its area, in float32. */
PTL_HD void ptl_nms_offset_box(const float *xyxy, int c, int agnostic, float *ob)
{
    float off = agnostic ? 0.0f : PTL_FMUL((float)c, (float)PTL_NMS_MAX_WH);
    for (int k = 0; k < 4; k++)
        ob[k] = PTL_FADD(xyxy[k], off);
    ob[4] = PTL_FMUL(PTL_FSUB(ob[2], ob[0]), PTL_FSUB(ob[3], ob[1]));
}

/* std::max / std::min as torchvision's kernel calls them (first argument: the kept box). */
PTL_HD float ptl_nms_max(float a, float b) { return a < b ? b : a; }
PTL_HD float ptl_nms_min(float a, float b) { return b < a ? b : a; }

/* torchvision's CPU nms: does kept box k (offset, with area) suppress box b? */
PTL_HD int ptl_nms_suppresses(const float *k, const float *b, double iou)
{
    float w = PTL_FSUB(ptl_nms_min(k[2], b[2]), ptl_nms_max(k[0], b[0]));
    float h = PTL_FSUB(ptl_nms_min(k[3], b[3]), ptl_nms_max(k[1], b[1]));
    w = ptl_nms_max(0.0f, w);
    h = ptl_nms_max(0.0f, h);
    float inter = PTL_FMUL(w, h);
    float ovr = PTL_FDIV(inter, PTL_FSUB(PTL_FADD(k[4], b[4]), inter));
    return (double)ovr > iou;
}

/* NMS ranking key of pair j = a * nc + c with score s (> conf >= 0, so the key is > 0). */
PTL_HD uint64_t ptl_nms_key(float s, uint32_t j) { return ptl_pp_key(s, j); }

/* Single-label candidate of anchor a (its class row `row`): the key of its best class when that score
 * exceeds conf, else 0 (torch's max over the row: the first maximum, NaN wins and then fails conf). */
PTL_HD uint64_t ptl_nms_anchor_key(const float *row, int64_t a, int64_t nc, float conf)
{
    int64_t best = 0;
    float bs = ptl_pp_sigmoid(row[0]);
    for (int64_t c = 1; c < nc && bs == bs; c++) {
        float s = ptl_pp_sigmoid(row[c]);
        if (s > bs || s != s) {
            bs = s;
            best = c;
        }
    }
    return bs > conf ? ptl_nms_key(bs, (uint32_t)(a * nc + best)) : 0;
}

/* One output row of the kept pair j. */
PTL_HD void ptl_nms_row(const float *boxes, const float *scores, int64_t nc, uint32_t j, int img_h, int img_w,
                        float *row)
{
    int64_t a = j / nc;
    int c = (int)(j % nc);
    ptl_nms_box(boxes + a * 4, a, img_h, img_w, row);
    row[4] = ptl_pp_sigmoid(scores[a * nc + c]);
    row[5] = (float)c;
}

#ifdef __cplusplus
}
#endif

#endif
