"""Validation metrics (spec section 8): end-to-end post-processing, matching, AP, P/R, fitness.

The computing kernels are in C (``csrc/metrics``; post-processing also on CUDA); this module only
converts arrays and accumulates per-image results.

Pipeline for one validation epoch::

    m = DetectionMetrics()
    for batch:
        dets = postprocess(boxes, scores, imgsz=(H, W))          # list of (n_i, 6) per image
        for det, image in zip(dets, batch):
            b = scale_boxes(det[:, :4], gain, pad, orig_shape)    # back through the letterbox
            m.update(b, det[:, 4], det[:, 5], gt_boxes, gt_cls)   # gt in original pixels, xyxy
    results = m.compute()   # precision, recall, mAP50, mAP50-95, fitness, per-class AP

Definitions (spec 8.3-8.6, Ultralytics' own metric):

* Matching per image, at IoU thresholds 0.50:0.05:0.95: each prediction takes its highest-IoU
  ground truth of the same class; a ground truth claimed by several predictions goes to the lowest
  prediction index (the highest score). IoU is computed in double precision.
* AP per class and threshold: envelope of the precision/recall curve, linearly interpolated at 101
  recall points, integrated with the trapezoidal rule. Classes are those present in the ground truth.
* Precision/recall: at the confidence maximising the 101-point box-smoothed mean F1 over classes.
* Fitness = mAP50-95. If nothing is a true positive at any threshold, every metric is 0.

Ties the spec leaves open (Ultralytics' sorts are unstable) are broken deterministically: equal
scores keep prediction order, equal IoUs go to the lower ground-truth index.

Known differences from pycocotools' COCOeval (so the two do not agree exactly; see
tests/test_metrics.py for the measured gap on coco256; COCO's formula applied to this module's
matches reproduces pycocotools to 2e-4 there):

1. AP integration: COCO takes the mean of the step-interpolated precision at 101 recall points
   (precision at the first recall >= r, 0 past the largest recall reached); here the envelope gets
   an extra point (recall 1, precision 0), is interpolated linearly and integrated with the
   trapezoidal rule. The extra point is the big one: a class whose recall stops at r_max with
   precision p gains about (1 - r_max) * p / 2 that COCO does not count, so this AP is usually the
   higher one (+0.05 mAP on the synthetic coco256 test, where 15% of the objects are missed).
2. Matching: COCO matches per image and class greedily in score order, each prediction taking the
   highest-IoU *unmatched* ground truth; here a prediction's only candidate is its highest-IoU ground
   truth, and a ground truth wanted by several predictions goes to the highest score (the others
   become false positives even if another ground truth was free).
3. COCO sorts detections per image and keeps ``maxDets`` (100 by default; 300 here) per image
   *before* the dataset-wide sort;
   it uses ``iscrowd`` ignore regions and area ranges (not used here); IoU thresholds are compared
   with ``>=`` in both, but COCO computes IoU without the 1e-7 epsilon and with boxes in
   ``x, y, w, h`` (no +1).
4. COCO averages over categories that have ground truth, like here, but gives -1 (excluded) for a
   category with neither ground truth nor predictions.
"""
import numpy as np

from . import _C

__all__ = [
    "IOU_THRESHOLDS", "postprocess", "letterbox_params", "scale_boxes", "match_predictions", "ap_per_class",
    "DetectionMetrics",
]

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)


def _imgsz(imgsz):
    if isinstance(imgsz, (int, np.integer)):
        return int(imgsz), int(imgsz)
    try:
        h, w = imgsz
        return int(h), int(w)
    except (TypeError, ValueError):
        raise TypeError("imgsz: expected an int or (H, W), got %r" % (imgsz,)) from None


def postprocess(boxes, scores, imgsz, max_det=300, conf=0.001, as_tensors=False):
    """End-to-end top-k of the one-to-one head (spec 8.2), on the tensors' device.

    boxes: (B, A, 4) l, t, r, b in grid units; scores: (B, A, nc) logits -- ``ptl.Tensor`` (CPU or
    CUDA, float32) or NumPy arrays. imgsz: the network input size, int or (H, W), multiples of 32.
    Returns a list of B float32 arrays (n_i, 6) = x1, y1, x2, y2, score, class in input pixels, score
    descending, n_i <= max_det, every score > conf. With ``as_tensors=True`` returns the raw
    ``(out (B, k, 6), count (B,))`` tensors on the device instead (rows past count are zero).
    """
    import ptl

    if not isinstance(boxes, ptl.Tensor):
        boxes = ptl.tensor(np.ascontiguousarray(boxes, dtype=np.float32))
    if not isinstance(scores, ptl.Tensor):
        scores = ptl.tensor(np.ascontiguousarray(scores, dtype=np.float32), device=boxes.device)
    h, w = _imgsz(imgsz)
    out, count = _C.postprocess(boxes, scores, h, w, int(max_det), float(conf))
    if as_tensors:
        return out, count
    out, count = out.numpy(), count.numpy()
    return [out[b, : count[b]].copy() for b in range(out.shape[0])]


def letterbox_params(orig_shape, input_shape):
    """(gain, (pad_x, pad_y)) of a letterbox from orig_shape (h, w) to input_shape (H, W), as
    Ultralytics' scale_boxes derives them when the loader did not record them."""
    h0, w0 = orig_shape
    h1, w1 = input_shape
    gain = min(h1 / h0, w1 / w0)
    pad = (round((w1 - w0 * gain) / 2 - 0.1), round((h1 - h0 * gain) / 2 - 0.1))
    return gain, pad


def scale_boxes(boxes, gain, pad, orig_shape):
    """Map xyxy boxes from the letterboxed input back to the original image (spec 8.2.4): subtract
    the padding ``pad = (left, top)``, divide by ``gain`` (a float or (gain_x, gain_y)), clip to
    ``orig_shape = (h, w)``. Returns a new float64 (n, 4) array."""
    b = np.array(boxes, dtype=np.float64, copy=True).reshape(-1, 4)
    gx, gy = (gain, gain) if np.isscalar(gain) else gain
    h, w = orig_shape
    _C.scale_boxes(b, float(gx), float(gy), float(pad[0]), float(pad[1]), float(w), float(h))
    return b


def _rows(x, dtype, width, name):
    """x as a C-contiguous (n, width) array, or ValueError naming it."""
    a = np.ascontiguousarray(x, dtype=dtype)
    if a.size % width:
        raise ValueError("%s: expected an (n, %d) array, got shape %s" % (name, width, a.shape))
    return a.reshape(-1, width)


def match_predictions(pred_boxes, pred_cls, gt_boxes, gt_cls):
    """True positives (n, 10) bool of one image's predictions (xyxy, score-sorted) at the 10 IoU
    thresholds, against its ground truth (spec 8.3)."""
    pb = _rows(pred_boxes, np.float64, 4, "pred_boxes")
    pc = np.ascontiguousarray(pred_cls, dtype=np.int64).reshape(-1)
    gb = _rows(gt_boxes, np.float64, 4, "gt_boxes")
    gc = np.ascontiguousarray(gt_cls, dtype=np.int64).reshape(-1)
    if len(pc) != len(pb) or len(gc) != len(gb):
        raise ValueError("match_predictions: %d pred boxes vs %d classes, %d gt boxes vs %d classes"
                         % (len(pb), len(pc), len(gb), len(gc)))
    tp = np.zeros((len(pb), len(IOU_THRESHOLDS)), dtype=np.uint8)
    _C.match_predictions(pb, pc, gb, gc, tp)
    return tp.astype(bool)


def ap_per_class(tp, conf, pred_cls, gt_cls):
    """AP per class and threshold, P/R/F1 at the best mean-F1 confidence, mAP50, mAP50-95, fitness
    (spec 8.4-8.6) over a whole dataset. Returns a dict:

    ``classes`` (distinct ground-truth classes, ascending), ``n_gt``, ``n_pred``, ``ap`` (nclasses, 10),
    ``ap50``, ``ap50_95`` (per class), ``p``, ``r``, ``f1`` (per class), ``precision``, ``recall`` (means),
    ``mAP50``, ``mAP50-95``, ``fitness``, ``best_conf``.
    """
    tp = _rows(tp, np.uint8, len(IOU_THRESHOLDS), "tp")
    conf = np.ascontiguousarray(conf, dtype=np.float64).reshape(-1)
    pc = np.ascontiguousarray(pred_cls, dtype=np.int64).reshape(-1)
    gc = np.ascontiguousarray(gt_cls, dtype=np.int64).reshape(-1)
    if not (len(tp) == len(conf) == len(pc)):
        raise ValueError("ap_per_class: tp, conf and pred_cls lengths differ (%d, %d, %d)"
                         % (len(tp), len(conf), len(pc)))
    cap = max(len(gc), 1)
    classes = np.zeros(cap, np.int64)
    n_gt, n_pred = np.zeros(cap, np.int64), np.zeros(cap, np.int64)
    ap = np.zeros((cap, len(IOU_THRESHOLDS)), np.float64)
    p, r, f1 = np.zeros(cap), np.zeros(cap), np.zeros(cap)
    s = _C.ap_per_class(tp, conf, pc, gc, classes, n_gt, n_pred, ap, p, r, f1)
    k = s["nclasses"]
    ap = ap[:k]
    return {
        "classes": classes[:k], "n_gt": n_gt[:k], "n_pred": n_pred[:k], "ap": ap,
        "ap50": ap[:, 0].copy(), "ap50_95": ap.mean(1) if k else np.zeros(0),
        "p": p[:k], "r": r[:k], "f1": f1[:k],
        "precision": s["mp"], "recall": s["mr"], "mAP50": s["map50"], "mAP50-95": s["map"],
        "fitness": s["fitness"], "best_conf": s["best_conf"],
    }


class DetectionMetrics:
    """Accumulates one validation pass image by image; ``compute()`` gives the spec's metrics."""

    def __init__(self, names=None):
        """names: optional class names (list or dict), used as the keys of ``ap_per_class``."""
        self.names = names
        self.reset()

    def reset(self):
        self._tp, self._conf, self._cls, self._gt = [], [], [], []

    def update(self, pred_boxes, pred_scores, pred_cls, gt_boxes, gt_cls):
        """One image: predictions (xyxy, score-sorted as postprocess returns them) and ground truth,
        both in the same (original-image) coordinates."""
        order = np.argsort(-np.asarray(pred_scores, dtype=np.float64).reshape(-1), kind="stable")
        pb = np.asarray(pred_boxes, dtype=np.float64).reshape(-1, 4)[order]
        pc = np.asarray(pred_cls).reshape(-1)[order].astype(np.int64)
        self._tp.append(match_predictions(pb, pc, gt_boxes, gt_cls))
        self._conf.append(np.asarray(pred_scores, dtype=np.float64).reshape(-1)[order])
        self._cls.append(pc)
        self._gt.append(np.asarray(gt_cls).reshape(-1).astype(np.int64))

    def compute(self):
        cat = lambda xs, shape: np.concatenate(xs) if xs else np.zeros(shape)  # noqa: E731
        res = ap_per_class(cat(self._tp, (0, len(IOU_THRESHOLDS))), cat(self._conf, 0),
                           cat(self._cls, 0), cat(self._gt, 0))
        key = (lambda c: self.names[c]) if self.names is not None else (lambda c: c)
        res["ap_per_class"] = {key(int(c)): float(a) for c, a in zip(res["classes"], res["ap50_95"])}
        return res
