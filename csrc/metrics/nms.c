/* CPU reference of the NMS post-processing of the one-to-many head (see postprocess.h): Ultralytics
 * 8.4.190's non_max_suppression, multi-label as its validator calls it or best-class as its predictor. */
#include <stdlib.h>

#include "postprocess.h"

int ptl_nms_check(int64_t B, int64_t A, int64_t nc, int img_h, int img_w, int max_det, int max_nms, double iou)
{
    if (ptl_postprocess_check(B, A, nc, img_h, img_w, max_det) < 0)
        return -1;
    if ((uint64_t)A * (uint64_t)nc > 0xFFFFFFFFull)
        return ptl_set_error(PTL_ERR_VALUE, "nms: anchors * classes must be below 2^32, got %lld x %lld",
                             (long long)A, (long long)nc);
    if (max_nms < 1 || max_nms > PTL_NMS_MAX_CAND)
        return ptl_set_error(PTL_ERR_VALUE, "nms: max_nms must be in [1, %d], got %d", PTL_NMS_MAX_CAND, max_nms);
    if (!(iou >= 0.0 && iou <= 1.0))
        return ptl_set_error(PTL_ERR_VALUE, "nms: iou must be in [0, 1], got %g", iou);
    return 0;
}

static int key_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int ptl_nms_cpu(const float *boxes, const float *scores, int64_t B, int64_t A, int64_t nc, int img_h, int img_w,
                int max_det, float conf, double iou, int max_nms, int agnostic, int multi_label, float *out,
                int32_t *count)
{
    uint64_t *keys = NULL;
    float(*kept)[5] = NULL;
    int rc = -1;
    if (ptl_nms_check(B, A, nc, img_h, img_w, max_det, max_nms, iou) < 0)
        return -1;
    keys = (uint64_t *)malloc((size_t)(A * nc > 0 ? A * nc : 1) * sizeof *keys);
    kept = (float(*)[5])malloc((size_t)max_det * sizeof *kept);
    if (!keys || !kept) {
        ptl_set_error(PTL_ERR_MEMORY, "nms: out of host memory");
        goto fail;
    }
    for (int64_t b = 0; b < B; b++) {
        const float *sc = scores + b * A * nc, *bx = boxes + b * A * 4;
        float *o = out + b * (int64_t)max_det * 6;
        int64_t n = 0;
        if (multi_label) {
            for (int64_t j = 0; j < A * nc; j++) {
                float s = ptl_pp_sigmoid(sc[j]);
                if (s > conf)
                    keys[n++] = ptl_nms_key(s, (uint32_t)j);
            }
        } else {
            for (int64_t a = 0; a < A; a++) {
                uint64_t key = ptl_nms_anchor_key(sc + a * nc, a, nc, conf);
                if (key)
                    keys[n++] = key;
            }
        }
        /* best first; past max_nms the rest is dropped before NMS, as non_max_suppression does */
        qsort(keys, (size_t)n, sizeof *keys, key_desc);
        if (n > max_nms)
            n = max_nms;
        int32_t nk = 0;
        for (int64_t r = 0; r < n && nk < max_det; r++) {
            uint32_t j = ptl_pp_key_index(keys[r]);
            float row[6], ob[5];
            ptl_nms_row(bx, sc, nc, j, img_h, img_w, row);
            ptl_nms_offset_box(row, (int)row[5], agnostic, ob);
            int drop = 0;
            for (int32_t k = 0; k < nk && !drop; k++)
                drop = ptl_nms_suppresses(kept[k], ob, iou);
            if (drop)
                continue;
            for (int e = 0; e < 5; e++)
                kept[nk][e] = ob[e];
            for (int e = 0; e < 6; e++)
                o[nk * 6 + e] = row[e];
            nk++;
        }
        for (int64_t i = (int64_t)nk * 6; i < (int64_t)max_det * 6; i++)
            o[i] = 0.0f;
        count[b] = nk;
    }
    rc = 0;
fail:
    free(keys);
    free(kept);
    return rc;
}
