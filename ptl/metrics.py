"""Validation metrics as Ultralytics 8.4.190 computes them: post-processing (NMS of the one-to-many
head, the default, or the end-to-end top-k of the one-to-one head), matching, AP per class with its
curves, precision/recall at the best F1, fitness and the confusion matrix.

The computing kernels are in C (``csrc/metrics``; both post-processings also on CUDA); this module only
converts arrays and accumulates per-image results. ``docs/ultralytics_parity.md`` lists every rule and
where it differs from the older one in ``spec/yolo26.md`` §8.

Pipeline for one validation epoch (boxes stay in the network input's pixels, as 8.4.190 matches)::

    m = DetectionMetrics(names)
    for batch:
        out = model.forward(images)
        dets = postprocess(*out["one2many"], imgsz=(H, W))     # list of (n_i, 6) per image
        for det, (gt_boxes, gt_cls) in zip(dets, batch):        # gt: target_boxes(...) of the image
            m.update(det[:, :4], det[:, 4], det[:, 5], gt_boxes, gt_cls)
    results = m.compute()

Definitions (8.4.190):

* Matching per image, in descending confidence, at IoU thresholds 0.50:0.05:0.95 (float32): every
  prediction with a same-class IoU >= 0.5 somewhere takes, per threshold, the still unclaimed ground
  truth of highest IoU and is a true positive there when that IoU reaches the threshold. IoU is
  ``box_iou``'s float32 computation.
* AP per class and threshold: precision/recall with the sentinels (0, 1) in front and
  (recall[-1], 0), (1, 0) behind, the envelope made monotone from the right, interpolated linearly at
  101 recall points and integrated with the trapezoidal rule. Classes are those present in the ground
  truth; a class with no prediction has AP 0.
* Precision/recall/F1 per class on a 1000-point confidence grid; reported at the confidence maximising
  the mean F1 over classes after a 101-point box filter.
* Fitness = mAP50-95.

Ties 8.4.190 leaves to NumPy's and torch's unstable sorts are broken deterministically: equal
confidences keep prediction order.
"""
import numpy as np

from . import _C

__all__ = [
    "IOU_THRESHOLDS", "CURVE_X", "postprocess", "letterbox_params", "scale_boxes", "target_boxes",
    "match_predictions", "ap_per_class", "ConfusionMatrix", "DetectionMetrics",
]

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10).astype(np.float32)  # torch.linspace(0.5, 0.95, 10)
CURVE_X = np.linspace(0, 1, 1000)  # confidence (and recall) grid of the curves
NMS_IOU = 0.7  # default.yaml's `iou`
MAX_NMS = 30000  # non_max_suppression's max_nms
CONFUSION_IOU = 0.45  # ConfusionMatrix.process_batch's matching IoU


def _imgsz(imgsz):
    if isinstance(imgsz, (int, np.integer)):
        return int(imgsz), int(imgsz)
    try:
        h, w = imgsz
        return int(h), int(w)
    except (TypeError, ValueError):
        raise TypeError("imgsz: expected an int or (H, W), got %r" % (imgsz,)) from None


def postprocess(boxes, scores, imgsz, max_det=300, conf=0.001, end2end=False, iou=NMS_IOU, max_nms=MAX_NMS,
                agnostic=False, multi_label=True, as_tensors=False):
    """Detections from raw head outputs, on the tensors' device.

    boxes: (B, A, 4) l, t, r, b in grid units; scores: (B, A, nc) logits -- ``ptl.Tensor`` (CPU or
    CUDA, float32) or NumPy arrays. imgsz: the network input size, int or (H, W), multiples of 32.

    ``end2end=False`` (8.4.190's default, ``nms=None``): pass the one-to-many head's outputs; every
    (anchor, class) pair with score > conf is a candidate (``multi_label``, as the validator calls it;
    ``multi_label=False``, as its predictor: only each anchor's best class), at most ``max_nms`` of
    them, then class-aware NMS at ``iou`` (class-agnostic with ``agnostic``), at most ``max_det`` kept.
    8.4.190 predicts with conf 0.25, multi_label=False; validates with conf 0.001, multi_label=True.
    ``end2end=True`` (``nms=False``): pass the one-to-one head's outputs; top-``max_det`` (anchor, class)
    pairs, no NMS (``iou``, ``max_nms``, ``agnostic``, ``multi_label`` unused).

    Returns a list of B float32 arrays (n_i, 6) = x1, y1, x2, y2, score, class in input pixels, score
    descending, every score > conf. With ``as_tensors=True`` returns the raw ``(out (B, k, 6), count
    (B,))`` tensors on the device instead (rows past count are zero).
    """
    import ptl

    if not isinstance(boxes, ptl.Tensor):
        boxes = ptl.tensor(np.ascontiguousarray(boxes, dtype=np.float32))
    if not isinstance(scores, ptl.Tensor):
        scores = ptl.tensor(np.ascontiguousarray(scores, dtype=np.float32), device=boxes.device)
    h, w = _imgsz(imgsz)
    if end2end:
        out, count = _C.postprocess(boxes, scores, h, w, int(max_det), float(conf))
    else:
        out, count = _C.nms(boxes, scores, h, w, int(max_det), float(conf), float(iou), int(max_nms),
                            bool(agnostic), bool(multi_label))
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
    """Map xyxy boxes from the letterboxed input back to the original image: subtract the padding
    ``pad = (left, top)``, divide by ``gain`` (a float or (gain_x, gain_y)), clip to ``orig_shape =
    (h, w)``. Returns a new float64 (n, 4) array. (Validation itself matches in input pixels.)"""
    b = np.array(boxes, dtype=np.float64, copy=True).reshape(-1, 4)
    gx, gy = (gain, gain) if np.isscalar(gain) else gain
    h, w = orig_shape
    _C.scale_boxes(b, float(gx), float(gy), float(pad[0]), float(pad[1]), float(w), float(h))
    return b


def target_boxes(xywhn, imgsz):
    """Ground-truth boxes (m, 4) normalised cx, cy, w, h -> float32 xyxy input pixels, as 8.4.190's
    validator prepares them (``xywh2xyxy(bbox) * (W, H, W, H)`` in float32)."""
    h, w = _imgsz(imgsz)
    b = np.asarray(xywhn, dtype=np.float32).reshape(-1, 4)
    half = b[:, 2:] / np.float32(2)
    xyxy = np.concatenate([b[:, :2] - half, b[:, :2] + half], 1)
    return xyxy * np.array([w, h, w, h], np.float32)


def _rows(x, dtype, width, name):
    """x as a C-contiguous (n, width) array, or ValueError naming it."""
    a = np.ascontiguousarray(x, dtype=dtype)
    if a.size % width:
        raise ValueError("%s: expected an (n, %d) array, got shape %s" % (name, width, a.shape))
    return a.reshape(-1, width)


def _vec(x, dtype):
    return np.ascontiguousarray(x, dtype=dtype).reshape(-1)


def match_predictions(pred_boxes, pred_cls, gt_boxes, gt_cls):
    """True positives (n, 10) bool of one image's predictions (xyxy, in descending confidence) at the 10
    IoU thresholds, against its ground truth (xyxy, same coordinates). Boxes are used as float32."""
    pb = _rows(pred_boxes, np.float32, 4, "pred_boxes")
    pc = _vec(pred_cls, np.int64)
    gb = _rows(gt_boxes, np.float32, 4, "gt_boxes")
    gc = _vec(gt_cls, np.int64)
    if len(pc) != len(pb) or len(gc) != len(gb):
        raise ValueError("match_predictions: %d pred boxes vs %d classes, %d gt boxes vs %d classes"
                         % (len(pb), len(pc), len(gb), len(gc)))
    tp = np.zeros((len(pb), len(IOU_THRESHOLDS)), dtype=np.uint8)
    _C.match_predictions(pb, pc, gb, gc, tp)
    return tp.astype(bool)


def ap_per_class(tp, conf, pred_cls, gt_cls):
    """8.4.190's ``ap_per_class`` over a whole dataset: tp (n, 10), conf (n,), pred_cls (n,), gt_cls (m,).

    Returns a dict; per class (``classes``: the distinct ground-truth classes, ascending):
    ``n_gt``, ``n_pred``, ``ap`` (nclasses, 10), ``ap50``, ``ap50_95``, and at the best-F1 confidence
    ``p``, ``r``, ``f1``, ``tp``, ``fp`` (counts as 8.4.190 rounds them); curves on ``px`` = CURVE_X:
    ``p_curve``, ``r_curve``, ``f1_curve`` (nclasses, 1000) against confidence and ``pr_curve``
    (nclasses, 1000), the IoU-0.5 precision envelope against recall (8.4.190's ``prec_values``);
    overall ``precision``, ``recall`` (means over classes), ``mAP50``, ``mAP75``, ``mAP50-95``,
    ``fitness`` (= mAP50-95), ``best_conf`` and its grid index ``best_index``.
    """
    tp = _rows(tp, np.uint8, len(IOU_THRESHOLDS), "tp")
    conf = _vec(conf, np.float64)
    pc = _vec(pred_cls, np.int64)
    gc = _vec(gt_cls, np.int64)
    if not (len(tp) == len(conf) == len(pc)):
        raise ValueError("ap_per_class: tp, conf and pred_cls lengths differ (%d, %d, %d)"
                         % (len(tp), len(conf), len(pc)))
    cap = max(len(gc), 1)
    classes = np.zeros(cap, np.int64)
    n_gt, n_pred = np.zeros(cap, np.int64), np.zeros(cap, np.int64)
    ap = np.zeros((cap, len(IOU_THRESHOLDS)), np.float64)
    per = {k: np.zeros(cap) for k in ("p", "r", "f1", "tp", "fp")}
    curves = {k: np.zeros((cap, len(CURVE_X))) for k in ("p_curve", "r_curve", "f1_curve", "pr_curve")}
    s = _C.ap_per_class(tp, conf, pc, gc, classes, n_gt, n_pred, ap, per["p"], per["r"], per["f1"], per["tp"],
                        per["fp"], curves["p_curve"], curves["r_curve"], curves["f1_curve"], curves["pr_curve"])
    k = s["nclasses"]
    ap = ap[:k]
    res = {"classes": classes[:k], "n_gt": n_gt[:k], "n_pred": n_pred[:k], "ap": ap,
           "ap50": ap[:, 0].copy(), "ap50_95": ap.mean(1) if k else np.zeros(0),
           "px": CURVE_X.copy(), "precision": s["mp"], "recall": s["mr"], "mAP50": s["map50"],
           "mAP75": s["map75"], "mAP50-95": s["map"], "fitness": s["fitness"], "best_conf": s["best_conf"],
           "best_index": s["best_index"]}
    res.update({name: v[:k] for name, v in per.items()})
    res.update({name: v[:k] for name, v in curves.items()})
    return res


class ConfusionMatrix:
    """8.4.190's detection ``ConfusionMatrix``: ``matrix`` (nc + 1, nc + 1) int64 indexed
    [predicted, true], the last row and column for the background (a missed ground truth counts in
    the background row, an unmatched prediction in the background column). Per image, predictions
    with conf > ``conf`` are matched class-agnostically, in descending confidence, each to the
    unclaimed ground truth of highest IoU when it exceeds ``iou``; a match of another class counts
    off the diagonal (one false positive and one false negative at once)."""

    def __init__(self, num_classes, conf=0.25, iou=CONFUSION_IOU):
        """conf: 8.4.190's ``process_batch`` default; its validator passes its own ``conf`` (0.001)."""
        if int(num_classes) < 1:
            raise ValueError("num_classes: expected >= 1, got %r" % (num_classes,))
        self.num_classes, self.conf, self.iou = int(num_classes), float(conf), float(iou)
        self.matrix = np.zeros((self.num_classes + 1, self.num_classes + 1), np.int64)

    def update(self, pred_boxes, pred_conf, pred_cls, gt_boxes, gt_cls):
        """One image: predictions (n, 4) xyxy with confidences and classes, ground truth (m, 4) xyxy with
        classes, in the same coordinates. Classes must lie in [0, num_classes)."""
        pb = _rows(pred_boxes, np.float32, 4, "pred_boxes")
        pf, pc = _vec(pred_conf, np.float32), _vec(pred_cls, np.int64)
        gb, gc = _rows(gt_boxes, np.float32, 4, "gt_boxes"), _vec(gt_cls, np.int64)
        _C.confusion_update(self.matrix, pb, pf, pc, gb, gc, self.conf, self.iou)

    def tp_fp(self):
        """(true positives, false positives) per class, background left out."""
        tp = np.diagonal(self.matrix).copy()
        fp = self.matrix.sum(1) - tp
        return tp[:-1], fp[:-1]


class DetectionMetrics:
    """Accumulates one validation pass image by image; ``compute()`` gives 8.4.190's metrics."""

    def __init__(self, names=None, num_classes=None, confusion_conf=0.001):
        """names: optional class names (list or dict), used as the keys of the per-class results.
        num_classes (default: len(names)): size of the confusion matrix, which is kept when known;
        confusion_conf: its confidence threshold (8.4.190's validator passes its conf, 0.001)."""
        self.names = names
        nc = num_classes if num_classes is not None else (len(names) if names is not None else None)
        self.num_classes, self.confusion_conf = nc, float(confusion_conf)
        self.reset()

    def reset(self):
        self._tp, self._conf, self._cls, self._gt, self._img = [], [], [], [], []
        self.confusion = ConfusionMatrix(self.num_classes, self.confusion_conf) if self.num_classes else None

    def update(self, pred_boxes, pred_scores, pred_cls, gt_boxes, gt_cls):
        """One image: predictions (xyxy, scores, classes) and ground truth (xyxy, classes), both in the
        same coordinates (the network input's pixels, as 8.4.190). Predictions are matched in
        descending score order (equal scores keep their order)."""
        scores = _vec(pred_scores, np.float32)
        order = np.argsort(-scores, kind="stable")
        pb = _rows(pred_boxes, np.float32, 4, "pred_boxes")[order]
        pc = _vec(pred_cls, np.int64)[order]
        gc = _vec(gt_cls, np.int64)
        gb = _rows(gt_boxes, np.float32, 4, "gt_boxes")
        self._tp.append(match_predictions(pb, pc, gb, gc))
        self._conf.append(scores[order].astype(np.float64))
        self._cls.append(pc)
        self._gt.append(gc)
        self._img.append(np.unique(gc))
        if self.confusion is not None:
            self.confusion.update(pb, scores[order], pc, gb, gc)

    def compute(self):
        """``ap_per_class``'s dict over everything seen, plus ``n_images`` (images containing each class),
        ``per_class`` ({name: {"n_images", "n_gt", "precision", "recall", "ap50", "ap50_95"}}),
        ``ap_per_class`` ({name: AP50-95}) and ``confusion_matrix`` (when the class count is known)."""
        cat = lambda xs, shape, dt: np.concatenate(xs) if xs else np.zeros(shape, dt)  # noqa: E731
        res = ap_per_class(cat(self._tp, (0, len(IOU_THRESHOLDS)), bool), cat(self._conf, 0, np.float64),
                           cat(self._cls, 0, np.int64), cat(self._gt, 0, np.int64))
        imgs = cat(self._img, 0, np.int64)
        res["n_images"] = np.array([(imgs == c).sum() for c in res["classes"]], np.int64)
        key = (lambda c: self.names[c]) if self.names is not None else (lambda c: c)
        res["per_class"] = {
            key(int(c)): {"n_images": int(ni), "n_gt": int(ng), "precision": float(p), "recall": float(r),
                          "ap50": float(a50), "ap50_95": float(a)}
            for c, ni, ng, p, r, a50, a in zip(res["classes"], res["n_images"], res["n_gt"], res["p"], res["r"],
                                               res["ap50"], res["ap50_95"])}
        res["ap_per_class"] = {k: v["ap50_95"] for k, v in res["per_class"].items()}
        if self.confusion is not None:
            res["confusion_matrix"] = self.confusion.matrix.copy()
        return res
