/* CPU reference of the end-to-end post-processing (postprocess.h). */
#include "postprocess.h"

#include <stdlib.h>

int64_t ptl_postprocess_check(int64_t B, int64_t A, int64_t nc, int img_h, int img_w, int max_det)
{
    if (B < 0 || nc < 1) {
        ptl_set_error(PTL_ERR_VALUE, "postprocess: expected batch >= 0 and classes >= 1, got B=%lld nc=%lld",
                      (long long)B, (long long)nc);
        return -1;
    }
    if (img_h <= 0 || img_w <= 0 || img_h % 32 || img_w % 32) {
        ptl_set_error(PTL_ERR_VALUE, "postprocess: imgsz must be positive multiples of 32, got %dx%d", img_h,
                      img_w);
        return -1;
    }
    int64_t expect = 0;
    for (int s = 8; s <= 32; s *= 2)
        expect += (int64_t)(img_h / s) * (img_w / s);
    if (A != expect) {
        ptl_set_error(PTL_ERR_VALUE,
                      "postprocess: %lld anchors do not match imgsz %dx%d (strides 8/16/32 give %lld)",
                      (long long)A, img_h, img_w, (long long)expect);
        return -1;
    }
    if (max_det < 1 || max_det > PTL_PP_MAX_DET) {
        ptl_set_error(PTL_ERR_VALUE, "postprocess: max_det must be in [1, %d], got %d", PTL_PP_MAX_DET, max_det);
        return -1;
    }
    if ((int64_t)max_det * nc > 0xFFFFFFFFll) {
        ptl_set_error(PTL_ERR_VALUE, "postprocess: max_det * classes too large");
        return -1;
    }
    return A < max_det ? A : max_det;
}

static int key_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int ptl_postprocess_cpu(const float *boxes, const float *scores, int64_t B, int64_t A, int64_t nc,
                        int img_h, int img_w, int max_det, float conf, float *out, int32_t *count)
{
    uint64_t *keys = NULL, *cand = NULL;
    int64_t k = ptl_postprocess_check(B, A, nc, img_h, img_w, max_det);
    if (k < 0)
        return -1;
    keys = (uint64_t *)malloc((size_t)A * sizeof *keys);
    cand = (uint64_t *)malloc((size_t)(k * nc) * sizeof *cand);
    if (!keys || !cand) {
        ptl_set_error(PTL_ERR_MEMORY, "postprocess: out of host memory");
        goto fail;
    }
    for (int64_t b = 0; b < B; b++) {
        const float *sc = scores + b * A * nc, *bx = boxes + b * A * 4;
        for (int64_t a = 0; a < A; a++) {
            uint64_t best = 0;
            for (int64_t c = 0; c < nc; c++) {
                uint64_t key = ptl_pp_key(sc[a * nc + c], (uint32_t)a);
                if (c == 0 || key > best)
                    best = key;
            }
            keys[a] = best;
        }
        qsort(keys, (size_t)A, sizeof *keys, key_desc);
        for (int64_t r = 0; r < k; r++) {
            int64_t a = ptl_pp_key_index(keys[r]);
            for (int64_t c = 0; c < nc; c++)
                cand[r * nc + c] = ptl_pp_key(sc[a * nc + c], (uint32_t)(r * nc + c));
        }
        qsort(cand, (size_t)(k * nc), sizeof *cand, key_desc);
        float *o = out + b * k * 6;
        int32_t n = 0;
        for (int64_t i = 0; i < k; i++) {
            int64_t j = ptl_pp_key_index(cand[i]), a = ptl_pp_key_index(keys[j / nc]);
            int c = (int)(j % nc);
            ptl_pp_row(bx + a * 4, a, c, sc[a * nc + c], img_h, img_w, o + n * 6);
            if (!(o[n * 6 + 4] > conf))
                break; /* scores are sorted, so the kept picks are a prefix */
            n++;
        }
        memset(o + n * 6, 0, (size_t)(k - n) * 6 * sizeof *o);
        count[b] = n;
    }
    free(keys);
    free(cand);
    return 0;
fail:
    free(keys);
    free(cand);
    return -1;
}
