"""What a fit and a validation print, in Ultralytics 8.4.190's formats: the model, dataset and optimizer
lines at the start of a fit and the per-class validation table.

The model line counts from the network's op description (``_C.network_ops``: the ops the executor runs),
so it describes the network ptl trains:

* **layers**: the leaf modules Ultralytics' ``model_info`` counts in the same network: one ``Conv2d`` per
  convolution, one ``BatchNorm2d`` per convolution with batch norm, one ``Identity`` per convolution
  without activation (``Conv(act=False)``) plus the box decoder (``DFL``, an identity at reg_max 1), one
  ``Concat`` per neck layer that only concatenates (a block's inner split and concatenation are not
  modules), one ``Upsample`` per upsampling, one ``MaxPool2d`` per layer that pools (SPPF applies one
  module three times) and the distinct ``SiLU`` modules (Ultralytics' convolutions share one; each
  one-to-one head tower is a copy with its own: 1 + 2);
* **parameters** and **gradients**: the flat parameter buffer (every parameter is trained);
* **GFLOPs** at the training image size, counted as Ultralytics' ``get_flops`` (thop) counts them:
  2 x (the multiply-adds of every convolution and of attention's two products, plus 4 per batch-norm
  output element), both heads included.
"""
import collections
import logging
import os

import numpy as np

from . import _C
from .optim import choose_optimizer

log = logging.getLogger(__name__)

__all__ = ["model_summary", "summary_line", "dataset_line", "optimizer_line", "validation_table", "print_fit_summary"]

# Ultralytics' print_results formats (models/yolo/detect/val.py)
TABLE_HEADER = ("%22s" + "%11s" * 6) % ("Class", "Images", "Instances", "Box(P", "R", "mAP50", "mAP50-95)")
TABLE_ROW = "%22s" + "%11i" * 2 + "%11.3g" * 4


def _hw(imgsz):
    if isinstance(imgsz, (int, np.integer)):
        return int(imgsz), int(imgsz)
    h, w = imgsz
    return int(h), int(w)


def count_layers(desc):
    """Ultralytics' leaf-module count of the network described by ``desc`` (see the module doc)."""
    ops = desc["ops"]
    kinds = collections.Counter(o["kind"] for o in ops)
    unactivated = sum(o["kind"] == "conv" and not o["silu"] for o in ops)
    per_layer = collections.defaultdict(list)
    for o in ops:
        per_layer[o["layer"]].append(o["kind"])
    concat_layers = sum(k == ["cat"] for k in per_layer.values())
    pool_layers = sum("maxpool5" in k for k in per_layer.values())
    heads = [o for o in ops if o["kind"] == "head"]
    decoder = 1 if heads else 0
    o2o_towers = len({o["box"] for o in heads if o["branch"] == 1})
    silu = (1 + o2o_towers) if any(o["kind"] == "conv" and o["silu"] for o in ops) else 0
    return (kinds["conv"] + kinds["conv_bias"] + kinds["conv"] + unactivated + decoder + concat_layers
            + kinds["upsample2x"] + pool_layers + silu)


def count_flops(desc, imgsz):
    """Floating-point operations of one forward at ``imgsz`` (int or (h, w)), as thop counts them for
    Ultralytics (see the module doc)."""
    H, W = _hw(imgsz)
    values = desc["values"]
    macs = 0
    for o in desc["ops"]:
        if o["kind"] in ("conv", "conv_bias"):
            _, down = values[o["out"]]
            out = (H // down) * (W // down) * o["cout"]
            macs += out * (o["cin"] // o["groups"]) * o["k"] ** 2
            if o["kind"] == "conv":
                macs += 4 * out  # thop's batch-norm rule: 2 per element, doubled for the affine part
        elif o["kind"] == "attention":
            _, down = values[o["in"]]
            tokens = (H // down) * (W // down)
            macs += o["heads"] * tokens * tokens * (o["kd"] + o["hd"])  # q^T k and v p^T
    return 2 * macs


def model_summary(model, imgsz=640):
    """{"name", "layers", "parameters", "gradients", "gflops"} of a :class:`ptl.Detector` at ``imgsz``."""
    desc = _C.network_ops(model._net)
    n = model.num_parameters()
    return {"name": model.model_name.replace("yolo", "YOLO"), "layers": count_layers(desc), "parameters": n,
            "gradients": n, "gflops": count_flops(desc, imgsz) / 1e9}


def summary_line(model, imgsz=640):
    """``YOLO26n summary: 260 layers, 2,572,280 parameters, 2,572,280 gradients, 6.2 GFLOPs`` (Ultralytics'
    ``model_info`` line)."""
    s = model_summary(model, imgsz)
    return "%s summary: %s layers, %s parameters, %s gradients, %.1f GFLOPs" % (
        s["name"], format(s["layers"], ","), format(s["parameters"], ","), format(s["gradients"], ","), s["gflops"])


def dataset_line(split, loader, where=None):
    """One split's scan: images, instances, backgrounds (no labels: empty or missing label file), corrupt
    files (skipped at the scan or failed to decode since) and duplicate label rows removed."""
    info = loader.info
    missing = info["missing_labels"]
    backgrounds = info["empty"] + missing
    parts = ["%s images" % format(info["n"], ","), "%s instances" % format(info["boxes"], ","),
             "%d backgrounds%s" % (backgrounds, " (%d without a label file)" % missing if missing else ""),
             "%d corrupt" % loader.skipped_files]
    if info["duplicates"]:
        parts.append("%d duplicate label rows removed" % info["duplicates"])
    return "%s: %s%s" % (split, "%s: " % where if where else "", ", ".join(parts))


def optimizer_line(optimizer, name, lr, momentum, auto=False):
    """Ultralytics' ``optimizer: MuSGD(lr=0.01, momentum=0.9) with parameter groups 57 weight(decay=0.0),
    64 weight(decay=0.0005), 63 bias(decay=0.0)``: tensors per kind (batch-norm weights, decayed weights --
    Muon's under MuSGD --, biases) and the scaled weight decay. ``auto``: optimizer=auto chose; a line
    before says so, as Ultralytics does."""
    counts, decay = collections.Counter(), 0.0
    for g in optimizer.param_groups:
        counts[g["param_group"]] += len(g["params"])
        if g["param_group"] in ("weight", "muon") and g["params"]:
            decay = g["weight_decay"]
    weights = counts["muon"] if name == "MuSGD" else counts["weight"]
    line = "optimizer: %s(lr=%s, momentum=%s) with parameter groups %d weight(decay=0.0), %d weight(decay=%s), " \
           "%d bias(decay=0.0)" % (name, lr, momentum, counts["bn"], weights, decay, counts["bias"])
    if auto:
        line = ("optimizer: 'optimizer=auto' chose %s (MuSGD above 10,000 iterations, else AdamW); the lr0, "
                "momentum and warmup_bias_lr given are not used\n%s" % (name, line))
    return line


def validation_table(results, names, per_class=True):
    """The lines of Ultralytics' validation table from ``DetectionMetrics.compute()``'s results: the header,
    ``all`` (images seen, instances, mean P, R, mAP50, mAP50-95), then one row per class present in the
    ground truth (images containing it, its instances, its P, R, AP50, AP50-95) unless ``per_class`` is
    False."""
    lines = [TABLE_HEADER, TABLE_ROW % ("all", results["seen"], int(np.sum(results["n_gt"])), results["precision"],
                                        results["recall"], results["mAP50"], results["mAP50-95"])]
    if per_class:
        for i, c in enumerate(results["classes"]):
            lines.append(TABLE_ROW % (names[int(c)] if names is not None else str(int(c)), results["n_images"][i],
                                      results["n_gt"][i], results["p"][i], results["r"][i], results["ap50"][i],
                                      results["ap50_95"][i]))
    if not np.sum(results["n_gt"]):
        lines.append("no labels in the validation set: the metrics are 0")
    return lines


def fit_lines(trainer):
    """The lines a fit prints at its start: model, datasets, optimizer."""
    eng = trainer._engine
    data = trainer.datamodule
    lines = [summary_line(trainer.model, data.imgsz_hw)]
    for split, loader in (("train", eng.train_loader), ("val", eng.val_loader)):
        if loader is not None:
            where = data.cfg.get(split)
            where = os.path.join(data.cfg["path"], where) if isinstance(where, str) else None
            lines.append(dataset_line(split, loader, where))
    name, lr, momentum, _ = choose_optimizer(eng.cfg)
    lines.append(optimizer_line(eng.opt, name, lr, momentum, auto=eng.cfg.optimizer.lower() == "auto"))
    return lines


def print_fit_summary(trainer, stream=None):
    """Says :func:`fit_lines` (rank 0 only): to ``stream``, or through the ``ptl.report`` logger."""
    if not getattr(trainer, "is_global_zero", True):
        return
    lines = fit_lines(trainer)
    if stream is None:  # through the ptl.report logger, as every message of a fit
        for line in "\n".join(lines).splitlines():  # one record per line (the optimizer's may be two)
            log.info("%s", line)
        return
    stream.write("\n".join(lines) + "\n")
    stream.flush()
