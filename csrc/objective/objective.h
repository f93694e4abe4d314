/* The end-to-end detection objective as Ultralytics 8.4.190's E2ELoss computes it (spec §2 anchors and
 * decoding, §3 assigner, losses, o2m/o2o mix; docs/ultralytics_parity.md lists where 8.4.190 differs).
 *
 * Inputs per branch (0 = one-to-many, 1 = one-to-one), NHWC-derived head layout:
 *   boxes  (B, A, 4)  raw l, t, r, b in grid units
 *   scores (B, A, nc) class logits
 * Anchors: levels P3, P4, P5 (strides 8, 16, 32), each row-major (y outer, x inner); H, W are the image
 * size in pixels, multiples of 32, A = sum over levels of (H/s)(W/s).
 * Targets: rows (image_index, class, cx, cy, w, h) normalised to the image, prepared on the host by
 * ptl_obj_targets_build (validation, per-image packing in row order, pixel xyxy).
 *
 * Outputs: losses[PTL_OBJ_NUM_LOSSES] float32 (host memory for the CPU, device memory for CUDA):
 *   [0]     total = w_o2m * (o2m box + cls + l1) + w_o2o * (o2o box + cls + l1)
 *   [1..3]  o2m branch (box, cls, l1) = B * gain * L   (gains: args->gain, the spec's 7.5, 0.5, 1.5 by
 *           default; before the branch weight)
 *   [4..6]  o2o branch, same
 *   [7..9]  loss items: o2o (gain * L for box, cls, l1), before x B and the weight (spec §3.4)
 * and grad_scale * d total / d boxes, d total / d scores of each branch (overwritten, same dtype as the
 * outputs; grad_scale is the loss scale of float16 training, 1 otherwise; the losses are unscaled).
 *
 * Ties (torch.topk leaves them to the implementation): every top-k over anchors orders by value
 * descending, then by anchor index ascending, over ALL anchors (zero-metric anchors included, so a
 * GT with fewer than k non-zero metrics takes the lowest-index zero-metric anchors, which count only
 * when they are its candidates). Conflicts go to the GT with the largest CIoU, first GT (row order
 * within the image) on equal values. */
#ifndef PTL_OBJECTIVE_H
#define PTL_OBJECTIVE_H

#include "../ptl.h"
#include "../runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_OBJ_NUM_LOSSES 10
#define PTL_OBJ_NUM_LEVELS 3

/* Assigner settings of the two branches (8.4.190's E2ELoss: tal_topk 10; 7 and topk2 1). */
#define PTL_OBJ_TOPK_O2M 10
#define PTL_OBJ_TOPK2_O2M 10
#define PTL_OBJ_TOPK_O2O 7
#define PTL_OBJ_TOPK2_O2O 1

/* Default loss gains (default.yaml box / cls / dfl). */
#define PTL_OBJ_GAIN_BOX 7.5
#define PTL_OBJ_GAIN_CLS 0.5
#define PTL_OBJ_GAIN_L1 1.5

/* Targets packed per image: GT j of image b is entry b*M + j (j < count[b], row order kept). Rows
 * with zero or negative width/height, and rows whose pixel x1+y1+x2+y2 <= 0 (torchref's padding test),
 * are dropped. */
typedef struct {
    int B, M;
    int64_t total;    /* sum of count */
    int32_t *count;   /* [B] */
    int32_t *cls;     /* [B*M] */
    float *box_f;     /* [B*M*4] pixel xyxy computed in float32 (torchref's order of operations) */
    double *box_d;    /* [B*M*4] the same in float64 */
} ptl_obj_targets;

/* Validates rows (n, 6) float32 (host) and packs them. Errors: image index or class not an integer in
 * range, non-finite values -> PTL_ERR_VALUE naming the row. */
int ptl_obj_targets_build(const float *rows, int64_t n, int B, int H, int W, int nc, ptl_obj_targets *out);
void ptl_obj_targets_free(ptl_obj_targets *t);

/* Number of anchors for an image of H x W pixels, or -1 (error set) when not multiples of 32. */
int64_t ptl_obj_num_anchors(int H, int W);

/* o2m weight of epoch e (0-based) of E (spec §3.4); o2o weight = max(1 - w, 0). */
double ptl_obj_o2m_weight(int epoch, int epochs);

typedef struct {
    int B, H, W, nc;
    int64_t A;
    ptl_dtype dtype;             /* of boxes/scores/grads: CPU float32|float64; CUDA float32|bfloat16|float16 */
    const void *boxes[2], *scores[2];
    void *grad_boxes[2], *grad_scores[2]; /* NULL: no gradient for that tensor */
    double o2m_weight;
    double gain[3];    /* box, cls, l1 (PTL_OBJ_GAIN_* by default) */
    double grad_scale; /* multiplies the gradients only */
    /* CUDA only: a device float32 that multiplies the gradients too (the optimizer's loss scale, read
     * on the device so that no step waits for it); NULL = 1 */
    const float *grad_scale_dev;
    float *losses;
    /* Optional assignment exchange for tests, per branch [B*A]: the GT index within the image
     * (-1 background) and the normalised target score n[a] (float64 for float64 outputs on the CPU,
     * else float32). With assign_in set they are read instead of running the assigner. */
    int32_t *assign_gt[2];
    void *assign_score[2];
    int assign_in;
} ptl_obj_args;

/* Checks a given assignment (assign_in) of one branch, gt [B*A] on the host: every entry is -1 or the
 * index of a kept target of its image (< count[b]); `arg` names it in the PTL_ERR_VALUE error. Without
 * this a bad index reads past the packed targets. */
int ptl_obj_check_assignment(const int32_t *gt, int B, int64_t A, const ptl_obj_targets *tg, const char *arg);

/* The values of args checked for a call on `dev` (what ptl_objective checks first). */
int ptl_obj_check_args(const ptl_obj_args *args, ptl_device_type dev);
/* The objective on ctx's device (NULL: the CPU), after ptl_obj_check_args. */
struct ptl_cuda_ctx;
int ptl_objective(struct ptl_cuda_ctx *ctx, const ptl_obj_args *args, const ptl_obj_targets *tg);
int ptl_objective_cpu(const ptl_obj_args *args, const ptl_obj_targets *tg);

#ifdef PTL_WITH_CUDA
/* Device workspace of the CUDA objective: device buffers sized for (B, A, M) and grown only when a
 * call needs more, plus two pinned host staging buffers for the targets (used alternately, each
 * guarded by an event recorded after its upload, so the host never writes one that a queued copy
 * still reads; waiting on that event is waiting for the copy of two calls back). */
typedef struct ptl_obj_workspace ptl_obj_workspace;

int ptl_obj_workspace_create(ptl_runtime *rt, int device, ptl_obj_workspace **out);
void ptl_obj_workspace_destroy(ptl_obj_workspace *ws);

/* Everything runs on the device's stream; no host-device synchronisation. args->losses, grads and the
 * assignment buffers are device pointers. assign_score is float32 on CUDA. */
int ptl_objective_cuda(ptl_obj_workspace *ws, const ptl_obj_args *args, const ptl_obj_targets *tg);
#endif

#ifdef __cplusplus
}
#endif

#endif
