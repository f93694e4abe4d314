"""The end-to-end YOLO26 detection objective (spec §2, §3): task-aligned assignment, BCE, CIoU and L1
losses of the one-to-many and one-to-one branches and their scheduled mix, with the gradient of the
total with respect to the head outputs. The work happens in C (``csrc/objective``), on the CPU or on
the outputs' CUDA device without host-device synchronisation.

Layout (``outputs``): ``(boxes_o2m, scores_o2m, boxes_o2o, scores_o2o)``, boxes ``(B, A, 4)`` raw
l, t, r, b in grid units, scores ``(B, A, nc)`` logits; anchors P3, P4, P5 (strides 8, 16, 32), each
level row-major. CPU: float32 or float64; CUDA: float32, bfloat16 or float16 (float32 math inside).

``targets``: float32 ``(n, 6)`` rows ``(image_index, class, cx, cy, w, h)`` normalised to the image.
They are read on the host (the loader produces them there); a CUDA tensor is copied to the host first.

The ``losses`` vector (float32, on the outputs' device, see ``LOSS_NAMES``):
    0      total = w_o2m * sum(o2m) + w_o2o * sum(o2o), w_o2o = max(1 - w_o2m, 0)
    1..3   o2m (box, cls, l1) = B * gain * L  (gains default to 7.5, 0.5, 1.5), before the branch weight
    4..6   o2o (box, cls, l1), same
    7..9   loss items: o2o (box, cls, l1) with gains, before x B and the weight (what is logged)

Tie-breaking (the spec leaves it open): top-k selections order by value, then by lower anchor index,
over all anchors; an anchor claimed by several objects goes to the largest CIoU, then the first
object (in row order within its image).
"""
import numpy as np

from . import _C

# Layout and defaults from csrc/objective/objective.h (one source), exported by the extension.
LOSS_NAMES = _C.OBJECTIVE_LOSSES
LOSS = {name: i for i, name in enumerate(LOSS_NAMES)}  # index of each entry of the losses vector
STRIDES = _C.OBJECTIVE_STRIDES
GAINS = _C.OBJECTIVE_GAINS  # box, cls, l1 (spec §10: box / cls / dfl)


def o2m_weight(epoch, epochs):
    """Weight of the one-to-many branch during 0-based ``epoch`` of ``epochs`` (spec §3.4):
    0.8 at epoch 0, decaying linearly to 0.1 at the last epoch; the o2o weight is ``1 - w``."""
    return _C.objective_o2m_weight(int(epoch), int(epochs))


def num_anchors(img_size):
    h, w = _hw(img_size)
    return sum((h // s) * (w // s) for s in STRIDES)


def _hw(img_size):
    if isinstance(img_size, (int, np.integer)):
        return int(img_size), int(img_size)
    try:
        h, w = img_size
        return int(h), int(w)
    except (TypeError, ValueError):
        raise TypeError("img_size: expected an int or (H, W), got %r" % (img_size,)) from None


def _as_tensor(x, name):
    if isinstance(x, _C.Tensor):
        return x, False
    if isinstance(x, np.ndarray):
        if x.dtype not in (np.float32, np.float64):
            raise TypeError("%s: expected a float32 or float64 array, got %s" % (name, x.dtype))
        return _C.tensor(np.ascontiguousarray(x)), True
    raise TypeError("%s: expected a ptl.Tensor or a NumPy array, got %s" % (name, type(x).__name__))


def _targets(targets):
    if isinstance(targets, _C.Tensor):
        targets = targets.numpy()
    t = np.asarray(targets)
    if t.size == 0:
        t = t.reshape(0, 6)
    if t.ndim != 2 or t.shape[1] != 6:
        raise ValueError("targets: expected shape (n, 6), got %s" % (t.shape,))
    return _C.tensor(np.ascontiguousarray(t, dtype=np.float32))


def objective(outputs, targets, *, img_size, num_classes=None, o2m_weight=0.8, grads=None,
              return_assignment=False, assignment=None, gains=GAINS, grad_scale=1.0, scale_from=None):
    """Loss and gradients of one batch.

    outputs: ``(boxes_o2m, scores_o2m, boxes_o2o, scores_o2o)``, ptl.Tensors (CPU or CUDA) or NumPy.
    targets: ``(n, 6)`` float32 rows; img_size: ``(H, W)`` pixels (or one int), multiples of 32;
    num_classes: checked against the scores when given; o2m_weight: see ``o2m_weight()``.
    grads: optional four tensors to write d total / d outputs into (else they are allocated).
    return_assignment: also return, per branch, the assigned object per anchor (int32 (B, A), -1 for
    background) and its normalised target score. assignment: such a dict to use instead of running
    the assigner (targets held fixed, e.g. for finite-difference checks). gains: the (box, cls, l1)
    loss gains (spec defaults 7.5, 0.5, 1.5). grad_scale: multiplies the gradients, not the losses
    (float16 training's loss scale); ``scale_from=(tensor, i)``: entry i of a float32 tensor on the
    outputs' CUDA device multiplies them too, read on the device (the optimizer's loss scale).

    Returns a dict: ``losses`` (the (10,) vector above), ``grads`` (4-tuple), and with
    ``return_assignment`` an ``assignment`` dict ``{"o2m": (gt, score), "o2o": (gt, score)}``.
    NumPy inputs give NumPy results; tensors give tensors on the outputs' device (no host read).
    """
    if len(outputs) != 4:
        raise ValueError("outputs: expected (boxes_o2m, scores_o2m, boxes_o2o, scores_o2o)")
    conv = [_as_tensor(x, "outputs[%d]" % i) for i, x in enumerate(outputs)]
    outs = [c[0] for c in conv]
    as_numpy = any(c[1] for c in conv)
    h, w = _hw(img_size)
    s = outs[1]
    if len(s.shape) != 3:
        raise ValueError("outputs[1]: expected scores (B, A, nc), got shape %s" % (tuple(s.shape),))
    bsz, na, nc = s.shape
    if num_classes is not None and int(num_classes) != nc:
        raise ValueError("num_classes: %d does not match the scores' %d classes" % (num_classes, nc))
    dev, dt = s.device, s.dtype
    tg = _targets(targets)
    losses = _C.empty((len(LOSS_NAMES),), dtype="float32", device=dev)
    if grads is None:
        grads = tuple(_C.empty(tuple(o.shape), dtype=dt, device=dev) for o in outs)
    score_dt = "float64" if (dt == "float64" and dev == "cpu") else "float32"
    agt = asc = None
    if assignment is not None:
        if not isinstance(assignment, dict) or set(assignment) < {"o2m", "o2o"}:
            raise TypeError("assignment: expected a dict {'o2m': (gt, score), 'o2o': (gt, score)}")
        agt = [_as_assign(assignment[k][0], "int32", dev) for k in ("o2m", "o2o")]
        asc = [_as_assign(assignment[k][1], score_dt, dev) for k in ("o2m", "o2o")]
    elif return_assignment:
        agt = [_C.empty((bsz, na), dtype="int32", device=dev) for _ in range(2)]
        asc = [_C.empty((bsz, na), dtype=score_dt, device=dev) for _ in range(2)]
    gains = tuple(float(g) for g in gains)
    if len(gains) != 3:
        raise ValueError("gains: expected (box, cls, l1), got %r" % (gains,))
    extra = {} if scale_from is None else {"scale_from": (scale_from[0], int(scale_from[1]))}
    _C.objective(outs, tg, h, w, float(o2m_weight), losses, grads, agt, asc, assignment is not None, gains,
                 float(grad_scale), **extra)
    res = {"losses": losses, "grads": tuple(grads)}
    if return_assignment and agt is not None:
        res["assignment"] = {"o2m": (agt[0], asc[0]), "o2o": (agt[1], asc[1])}
    if as_numpy:
        res = _to_numpy(res)
    return res


def _as_assign(x, dtype, dev):
    if isinstance(x, _C.Tensor):
        return x
    return _C.tensor(np.ascontiguousarray(x, dtype=dtype), device=dev)


def _to_numpy(obj):
    if isinstance(obj, _C.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: _to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to_numpy(v) for v in obj)
    return obj


def loss_items(losses):
    """Names -> Python floats of a losses vector (reads the device: a synchronisation)."""
    v = losses.numpy() if isinstance(losses, _C.Tensor) else np.asarray(losses)
    return {k: float(x) for k, x in zip(LOSS_NAMES, v)}
