/* End-to-end post-processing of the one-to-one head (spec §8.2): per image, the top-k anchors by
 * their largest class logit, then the top-k (anchor, class) pairs of those anchors' class rows,
 * decoded to pixel xyxy with sigmoid scores, kept while score > conf.
 *
 * Inputs are NHWC-flattened head outputs: boxes (B, A, 4) = l, t, r, b in grid units, scores
 * (B, A, nc) = logits; anchors are the cells of P3, P4, P5 (strides 8, 16, 32), each level row-major,
 * so A = sum_l (H/s_l)(W/s_l) for an input of H x W pixels (both multiples of 32).
 * Output: out (B, k, 6) = x1, y1, x2, y2, score, class (pixels, score descending), k = min(max_det, A);
 * count (B): the rows of each image that passed `conf`; rows past count are zero.
 *
 * Ranking uses the logits: sigmoid is monotone, so this is the spec's order on probabilities with
 * ties among equal probabilities broken by the larger logit. Remaining ties (equal logits; the spec
 * leaves them open, §12.4) go to the lower anchor index, then to the earlier anchor in the first
 * selection and the lower class. NaN logits rank below everything. The score is sigmoid computed in
 * double and rounded to float, so CPU and CUDA agree bit for bit. */
#ifndef PTL_METRICS_POSTPROCESS_H
#define PTL_METRICS_POSTPROCESS_H

#include <math.h>
#include <string.h>

#include "../ptl.h"
#include "../runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_PP_MAX_DET 1024 /* largest max_det the kernels accept */

/* Validates the shapes; returns k (> 0) or -1 after setting an error. */
int64_t ptl_postprocess_check(int64_t B, int64_t A, int64_t nc, int img_h, int img_w, int max_det);

int ptl_postprocess_cpu(const float *boxes, const float *scores, int64_t B, int64_t A, int64_t nc,
                        int img_h, int img_w, int max_det, float conf, float *out, int32_t *count);

#ifdef PTL_WITH_CUDA
/* Device pointers; all work on the device's stream, no synchronisation. `keys` is scratch of
 * B * A uint64 values on the device. */
int ptl_postprocess_cuda(ptl_runtime *rt, int device, const float *boxes, const float *scores, int64_t B,
                         int64_t A, int64_t nc, int img_h, int img_w, int max_det, float conf,
                         uint64_t *keys, float *out, int32_t *count);
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

PTL_HD float ptl_pp_sigmoid(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

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

#ifdef __cplusplus
}
#endif

#endif
