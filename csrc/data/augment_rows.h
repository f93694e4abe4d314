/* The fused tail of the training pipeline: the warp (or copy) of the mosaic/letterbox canvas into the
 * batch, with HSV jitter and the flips applied to each output row while it is still in L1. Gives the
 * same bytes as ptl_warp, then ptl_hsv, then ptl_flip_ud / ptl_flip_lr (dataset.h). */
#ifndef PTL_DATA_AUGMENT_ROWS_H
#define PTL_DATA_AUGMENT_ROWS_H

#include "dataset.h"

typedef struct {
    int hsv, flip_lr, flip_ud;
    uint8_t lh[256], ls[256], lv[256]; /* the per-sample HSV tables of spec §7.6 */
    uint8_t fill[3];                   /* PTL_FILL after HSV */
    /* The tables composed with the RGB->HSV->RGB arithmetic (augment.c): ls of the saturation of
     * (V, V - min), and the HSV->RGB factors of lh of each hue H in [-32, 152] before the mod 180. */
    const uint16_t (*hrow[185])[4];
    uint8_t sat[256 * 256];
} ptl_post;

/* hsv_r: the gains times the draws (as ptl_hsv), or NULL for no HSV. */
void ptl_post_init(ptl_post *p, const double *hsv_r, int flip_lr, int flip_ud);
/* ptl_warp of src into dst followed by the post-processing. */
int ptl_warp_post(const uint8_t *src, int w_in, int h_in, uint8_t *dst, int w_out, int h_out, const double M[9],
                  const ptl_post *post);
/* Row y of a warp's input, columns [x0, x1): a pointer to pixel x0. It stays valid through the next call
 * when that call passes keep = y (the warp asks for the two rows it blends, each keeping the other). */
typedef const uint8_t *(*ptl_row_fn)(void *ctx, int y, int x0, int x1, int keep);
/* Whether ptl_warp(M) separates into rows and columns (no rotation, shear or perspective): then
 * ptl_warp_rows can read the input through a row function instead of an image (the mosaic tiles without a
 * canvas). Same bytes as ptl_warp_post. */
int ptl_warp_is_separable(const double M[9]);
int ptl_warp_rows(ptl_row_fn row, void *ctx, int w_in, int h_in, uint8_t *dst, int w_out, int h_out,
                  const double M[9], const ptl_post *post);
/* The identity warp (a w x h copy) followed by the post-processing. */
void ptl_copy_post(const uint8_t *src, int w, int h, uint8_t *dst, const ptl_post *post);
/* The part [r0, r2) x [r1, r3) of a w_in x h_in input that the warp M to w_out x h_out can read (with a
 * margin): the rest of the input need not be filled. The whole input for a projective M. */
void ptl_warp_source_rect(const double M[9], int w_in, int h_in, int w_out, int h_out, int r[4]);
/* The box part of ptl_flip_lr (lr = 1) or ptl_flip_ud (lr = 0). */
void ptl_boxes_flip(ptl_boxes *bx, int w, int h, int lr);

#endif
