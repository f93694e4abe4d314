"""COCO's evaluation of a validation, on request: ``Trainer(coco_eval=True)`` installs
:class:`COCOEvaluator`, which after every validation writes ``predictions.json`` in COCO's result format and
reports COCO's AP (IoU 0.50:0.95), AP50, AP75, AP small / medium / large and AR (1, 10, 100 detections;
small / medium / large) through ``faster-coco-eval`` (or ``pycocotools`` when only that is installed)
beside ptl's own mAP.

The two differ by definition, not by error: ptl computes Ultralytics 8.4.190's AP (greedy matching per
confidence, AP from a 101-point interpolated envelope with its own sentinels, all of a class's 300
detections per image, boxes in the letterboxed input), COCO matches per image and area range, keeps 100
detections per image and evaluates in the original images' pixels.

Ground truth: the validation split's YOLO labels as the loader scanned them, converted in memory to a
COCO object (boxes in each image's original pixels, no crowd regions). Ids: ``image_id`` is the file
name's number when every validation file is named by one (COCO's own files: their COCO ids), else the
image's position in the scanned list; ``category_id`` is the class index + 1 (Ultralytics' ids for a
non-COCO-91 dataset). Predictions are the validation's detections (conf > 0.001, at most 300 per image)
mapped back to the original image (letterbox padding and gain undone, clipped), boxes rounded to 3
decimals and scores to 5, as Ultralytics writes them. A validation image that replaced a file failing to
decode is left out of the predictions (its file's labels then count as missed).

Metrics go to ``trainer.callback_metrics`` as ``metrics/coco/AP``, ``metrics/coco/AP50``, ... (see
``STAT_NAMES``).
"""
import contextlib
import io
import json
import logging
import os

import numpy as np

from . import metrics as _metrics
from .callbacks import Callback
from .runlog import write_atomic

log = logging.getLogger(__name__)

__all__ = ["COCOEvaluator", "ground_truth", "evaluate", "STAT_NAMES"]

# COCOeval.summarize()'s 12 stats for boxes, in order
STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")
DEFINITIONS = ("COCO's AP differs from ptl's mAP by definition (per-image matching by area range, 100 "
               "detections per image, COCO's interpolation), not by error: docs/training.md")


def image_ids(files):
    """COCO image ids of the scanned files: their numeric stems when all have distinct ones, else 0..n-1."""
    stems = [os.path.splitext(os.path.basename(f))[0] for f in files]
    if stems and all(s.isdigit() for s in stems) and len({int(s) for s in stems}) == len(stems):
        return [int(s) for s in stems]
    return list(range(len(files)))


def ground_truth(loader, names):
    """The loader's scanned labels as a COCO ground-truth dataset (a dict of images, annotations,
    categories) in the original images' pixels."""
    info = loader.info
    ids = image_ids(info["files"])
    shapes = np.asarray(info["shapes"], np.float64).reshape(-1, 2)
    images = [{"id": ids[i], "file_name": os.path.basename(f), "height": int(shapes[i, 0]),
               "width": int(shapes[i, 1])} for i, f in enumerate(info["files"])]
    anns = []
    for k, (i, c, cx, cy, w, h) in enumerate(np.asarray(info["labels"], np.float64)):
        i = int(i)
        H, W = shapes[i]
        bw, bh = w * W, h * H
        anns.append({"id": k + 1, "image_id": ids[i], "category_id": int(c) + 1,
                     "bbox": [cx * W - bw / 2, cy * H - bh / 2, bw, bh], "area": bw * bh, "iscrowd": 0})
    cats = [{"id": c + 1, "name": str(n)} for c, n in enumerate(names)]
    return {"images": images, "annotations": anns, "categories": cats}


def predictions(dets, batch, ids):
    """COCO result records of one validation batch: ``dets`` the batch's detections (n, 6) per image in
    input pixels, ``batch.meta`` the letterbox of each image, ``ids`` the image ids by dataset index."""
    out = []
    for k, d in enumerate(dets):
        if batch.sources[k] != batch.indices[k]:  # a replacement image: not the file its index names
            continue
        d = np.asarray(d, np.float64).reshape(-1, 6)
        if not len(d):
            continue
        h0, w0, gy, gx, pl, pt = batch.meta[k]
        xyxy = _metrics.scale_boxes(d[:, :4], (gx, gy), (pl, pt), (h0, w0))
        image_id = ids[int(batch.indices[k])]
        for (x1, y1, x2, y2), score, cls in zip(xyxy, d[:, 4], d[:, 5]):
            out.append({"image_id": image_id, "category_id": int(cls) + 1,
                        "bbox": [round(x1, 3), round(y1, 3), round(x2 - x1, 3), round(y2 - y1, 3)],
                        "score": round(float(score), 5)})
    return out


def _backend():
    """(COCO class, COCOeval class, name) of the installed evaluator: faster-coco-eval, else pycocotools."""
    try:
        from faster_coco_eval import COCO, COCOeval_faster
        return COCO, COCOeval_faster, "faster-coco-eval"
    except ImportError:
        pass
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
        return COCO, COCOeval, "pycocotools"
    except ImportError:
        raise ImportError("coco_eval=True needs faster-coco-eval or pycocotools: pip install faster-coco-eval") \
            from None


def evaluate(gt, results):
    """COCO's 12 box stats (dict by STAT_NAMES) of result records against a ground-truth dataset dict."""
    COCO, COCOeval, name = _backend()
    if not results:  # COCO's loaders refuse an empty result list; nothing detected scores 0
        return dict.fromkeys(STAT_NAMES, 0.0)
    with contextlib.redirect_stdout(io.StringIO()):  # both libraries print their progress
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes(results)
        ev = COCOeval(coco_gt, coco_dt, "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {k: float(v) for k, v in zip(STAT_NAMES, ev.stats)}


class COCOEvaluator(Callback):
    """Collects each validation's detections, writes ``predictions.json`` (into the run folder while fitting,
    else ``log_dir`` or ``default_root_dir``) and evaluates them with COCO's definition (module doc).
    ``stats`` holds the last evaluation; ``verbose`` prints it after the validation table."""

    def __init__(self, verbose=True):
        self.verbose = bool(verbose)
        self.stats = None
        self._records, self._gt = None, (None, None)  # (loader, its ground truth), converted once
        _backend()  # fails now, not after the first validation

    def on_validation_start(self, trainer, pl_module):
        self.stats = None
        if getattr(trainer, "sanity_checking", False):  # the sanity check's few batches are not a validation
            self._records = None
            return
        self._records = []
        loader = trainer.datamodule.val_loader()
        self._ids = image_ids(loader.info["files"])

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._records is not None and outputs is not None:
            self._records += predictions(outputs, batch, self._ids)

    def on_validation_epoch_end(self, trainer, pl_module):
        if self._records is None or not getattr(trainer, "is_global_zero", True):
            return
        data = trainer.datamodule
        loader = data.val_loader()
        if self._gt[0] is not loader:
            self._gt = (loader, ground_truth(loader, data.names))
        folder = trainer.log_dir or trainer.default_root_dir  # validate() without an earlier fit: the root
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, "predictions.json")
        write_atomic(self.path, json.dumps(self._records).encode())
        self.stats = evaluate(self._gt[1], self._records)
        trainer.log_dict({"metrics/coco/" + k: v for k, v in self.stats.items()})
        self._records = None

    def on_validation_end(self, trainer, pl_module):
        if self.verbose and self.stats is not None and getattr(trainer, "is_global_zero", True):
            s = self.stats
            log.info("COCO (%s, %s): AP %.3f  AP50 %.3f  AP75 %.3f  APs %.3f  APm %.3f  APl %.3f  AR1 %.3f  AR10 %.3f  "
                     "AR100 %.3f  ARs %.3f  ARm %.3f  ARl %.3f", _backend()[2], os.path.basename(self.path),
                     *(s[k] for k in STAT_NAMES))
            log.info("%s", DEFINITIONS)
