"""Issue 14: what a fit prints and leaves in its run folder (summary lines, validation table, results.csv,
plots, COCO evaluation, progress), checked on a 2-epoch CPU fit at 128 on coco256 and on hand-made inputs.
Confusion-matrix counts are tested in test_metrics.py."""
import contextlib
import csv
import io
import logging
import json
import os
import re
import sys
import types

import numpy as np
import pytest

import ptl
from ptl import coco_eval, metrics, plots, report
from ptl.callbacks import ProgressBar
from ptl.data import label_path
from ptl.loggers import CSVLogger, TensorBoardLogger
from ptl.runlog import RESULTS_COLUMNS

from oracles import pycocotools_stats

PICTURES = ["confusion_matrix.png", "confusion_matrix_normalized.png", "BoxPR_curve.png", "BoxP_curve.png",
            "BoxR_curve.png", "BoxF1_curve.png", "labels.jpg", "train_batch0.jpg", "train_batch1.jpg",
            "train_batch2.jpg", "val_batch0_labels.jpg", "val_batch0_pred.jpg", "results.png"]
FIT = dict(max_epochs=2, limit_train_batches=3, limit_val_batches=2, accelerator="cpu", seed=0)


def fit_data(coco256):
    return ptl.DetectionData(str(coco256 / "data.yaml"), imgsz=128, batch_size=8, workers=2, verbose=False)


@pytest.fixture(scope="module")
def fitted(coco256, tmp_path_factory):
    """One fit with every report on: both loggers, COCO evaluation, plots; its stderr captured."""
    root = tmp_path_factory.mktemp("reports")
    tr = ptl.Trainer(default_root_dir=str(root), coco_eval=True, log_every_n_steps=2,
                     logger=[CSVLogger(root, "exp"), TensorBoardLogger(root, "exp")], **FIT)
    err = io.StringIO()
    handler = logging.StreamHandler(err)  # the fit's messages go through the ptl logger (as the CLI shows them)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("ptl")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stderr(err):
            tr.fit(ptl.Detector("yolo26n"), fit_data(coco256))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return tr, err.getvalue()


def test_fit_writes_every_picture_and_log(fitted):
    pytest.importorskip("matplotlib")
    from PIL import Image
    tr, _ = fitted
    log = tr.log_dir
    assert log == os.path.join(os.path.dirname(log), "version_0") and os.path.basename(os.path.dirname(log)) == "exp"
    for name in PICTURES:
        with Image.open(os.path.join(log, name)) as im:
            im.verify()  # a complete file of its format
            assert im.format == ("PNG" if name.endswith(".png") else "JPEG") and min(im.size) > 100, name
    assert not [f for f in os.listdir(log) if ".tmp" in f]  # every write was renamed into place
    with Image.open(os.path.join(log, "train_batch0.jpg")) as im:
        assert im.size == (3 * 128 * 4, 3 * 128 * 4)  # 8 images, 3 x 3 tiles, enlarged 4 x
    for name in ("hparams.yaml", "metrics.csv", "results.csv", "predictions.json"):
        assert os.path.getsize(os.path.join(log, name)) > 0
    # Ultralytics' weights/best.pt and last.pt as the EMA weights ptl writes, beside the full checkpoints
    assert sorted(os.listdir(os.path.join(log, "weights"))) == ["best.safetensors", "last.safetensors"]
    assert sorted(os.listdir(os.path.join(log, "checkpoints"))) == ["best.ckpt", "last.ckpt"]


def test_hparams_yaml_reads_back(fitted):
    import yaml
    from ptl.checkpoint import jsonable
    tr, _ = fitted
    with open(os.path.join(tr.log_dir, "hparams.yaml")) as f:
        back = yaml.safe_load(f)
    assert back == jsonable(tr.hparams())
    assert back["trainer"]["max_epochs"] == 2 and back["trainer"]["limit_val_batches"] == 2
    assert back["data"]["imgsz"] in (128, [128, 128]) and back["model"]["optimizer"] == "auto"


def test_results_csv_has_ultralytics_columns(fitted):
    tr, _ = fitted
    with open(os.path.join(tr.log_dir, "results.csv"), newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(RESULTS_COLUMNS) + ["lr/pg0", "lr/pg1", "lr/pg2"]
    assert rows[0] == ["epoch", "time", "train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision(B)",
                       "metrics/recall(B)", "metrics/mAP50(B)", "metrics/mAP50-95(B)", "val/box_loss", "val/cls_loss",
                       "val/dfl_loss", "lr/pg0", "lr/pg1", "lr/pg2"]
    assert [r[0] for r in rows[1:]] == ["1", "2"]
    times = [float(r[1]) for r in rows[1:]]
    assert 0 < times[0] < times[1]  # seconds so far, as Ultralytics
    for r, epoch_row in zip(rows[1:], tr._epoch_rows):
        assert all(re.fullmatch(r"-?[0-9.]+(e[-+][0-9]+)?", v) for v in r)
        assert r[4] == "%.6g" % epoch_row["train/l1_loss"] and r[11] == "%.6g" % epoch_row["val/l1_loss"]
        assert r[8] == "%.6g" % epoch_row["metrics/mAP50-95"]
        assert r[12:] == ["%.6g" % v for k, v in epoch_row.items() if k.startswith("lr/pg")]
    assert rows[-1][12:] == ["%.6g" % lr for _, lr, *_ in tr.group_schedule()]


def test_metrics_csv_and_tensorboard_scalars(fitted):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tr, _ = fitted
    with open(os.path.join(tr.log_dir, "metrics.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    epoch_rows = [r for r in rows if r["metrics/mAP50-95"] != ""]
    step_rows = [r for r in rows if r["train/box_loss_step"] != ""]
    assert [r["epoch"] for r in epoch_rows] == ["0", "1"] and [r["step"] for r in epoch_rows] == ["3", "6"]
    assert [r["step"] for r in step_rows] == ["2", "4", "6"]  # every 2 training batches
    assert float(step_rows[0]["train/box_loss_step"]) == pytest.approx(float(tr.loss_history[1][7]), rel=1e-5)
    ea = EventAccumulator(tr.log_dir)
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {"train/box_loss", "train/cls_loss", "train/l1_loss", "val/box_loss", "metrics/mAP50-95", "fitness",
            "lr/pg0_weight", "train/box_loss_step", "epoch", "metrics/coco/AP"} <= tags
    assert [e.step for e in ea.Scalars("train/box_loss_step")] == [2, 4, 6]
    assert [(e.step, e.value) for e in ea.Scalars("metrics/mAP50-95")] == [
        (3, pytest.approx(tr.val_history[0]["logged"]["metrics/mAP50-95"])),
        (6, pytest.approx(tr.val_history[1]["logged"]["metrics/mAP50-95"]))]
    assert "_hparams_/session_start_info" in ea.Tags()["tensors"]


def test_fit_prints_summary_and_tables(fitted, coco256):
    tr, err = fitted
    lines = err.splitlines()
    lines = lines[next(i for i, ln in enumerate(lines) if ln.startswith("YOLO26n summary")):]  # after the scan's
    assert lines[0] == "YOLO26n summary: 260 layers, 2,572,280 parameters, 2,572,280 gradients, 0.2 GFLOPs"
    assert lines[1].startswith("train: ") and "128 images, 929 instances, 2 backgrounds (2 without a label file), " \
                                                "0 corrupt" in lines[1]
    assert lines[2].startswith("val: ") and "128 images, 898 instances, 0 backgrounds, 0 corrupt" in lines[2]
    assert lines[4] == "optimizer: AdamW(lr=0.000119, momentum=0.9) with parameter groups 114 weight(decay=0.0), " \
                       "126 weight(decay=0.0005), 126 bias(decay=0.0)"
    assert err.count(report.TABLE_HEADER) == 2  # after each validation
    res = tr._engine.last_results
    table = report.validation_table(res, tr.datamodule.names)
    assert "\n".join(table) in err
    # the per-class rows carry the C metrics of each class present in the 32 validated images (2 batches of 16)
    start = err.rfind(report.TABLE_HEADER)  # the last validation's table
    shown = err[start:].splitlines()[1:len(table)]
    assert shown[0].split()[:2] == ["all", "32"] and int(shown[0].split()[2]) == int(np.sum(res["n_gt"])) > 32
    per_class = res["per_class"]
    assert len(shown) - 1 == len(per_class) > 5
    for ln in shown[1:]:
        name, cells = ln[:22].strip(), ln[22:].split()
        c = per_class[name]
        assert [int(cells[0]), int(cells[1])] == [c["n_images"], c["n_gt"]]
        assert [float(x) for x in cells[2:]] == [float("%.3g" % c[k]) for k in ("precision", "recall", "ap50",
                                                                                 "ap50_95")]
    assert sum(c["n_gt"] for c in per_class.values()) == int(np.sum(res["n_gt"]))
    assert tr.ap_per_class == {k: v["ap50_95"] for k, v in per_class.items()}
    assert err.count("COCO (") == 2 and coco_eval.DEFINITIONS in err
    assert "\r" not in err and "\x1b" not in err  # not a TTY: plain lines
    assert sum(ln.startswith("validation ") for ln in lines) == 2 * 2  # 2 batches per validation


def test_plots_do_not_change_the_fit(fitted, coco256, tmp_path):
    """The same fit without plots, loggers, COCO or progress bar: the same digests."""
    tr, _ = fitted
    quiet = ptl.Trainer(default_root_dir=str(tmp_path), plots=False, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, **FIT)
    quiet.fit(ptl.Detector("yolo26n"), fit_data(coco256))
    assert quiet.digest() == tr.digest()
    assert os.listdir(tmp_path) == []


def test_crash_keeps_results_rows_and_plots_results(coco256, tmp_path):
    class Crash(ptl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.current_epoch == 1:
                raise RuntimeError("boom")

    tr = ptl.Trainer(default_root_dir=str(tmp_path), max_epochs=3, limit_train_batches=1, limit_val_batches=1,
                     accelerator="cpu", callbacks=[Crash()], enable_progress_bar=False, enable_model_summary=False)
    data = ptl.DetectionData(str(coco256 / "data.yaml"), imgsz=64, batch_size=4, workers=1, verbose=False)
    with pytest.raises(RuntimeError, match="boom"):
        tr.fit(ptl.Detector("yolo26n"), data)
    with open(os.path.join(tr.log_dir, "results.csv")) as f:
        rows = f.read().splitlines()
    assert len(rows) == 2 and rows[1].startswith("1,")
    if plots.available():
        assert os.path.exists(os.path.join(tr.log_dir, "results.png"))
        assert os.path.exists(os.path.join(tr.log_dir, "train_batch0.jpg"))  # the first epoch ended
        assert not os.path.exists(os.path.join(tr.log_dir, "confusion_matrix.png"))  # drawn at the fit's end


def test_summary_line_counts():
    m = ptl.Detector("yolo26n", num_classes=80)
    s = report.model_summary(m, 640)
    assert s["parameters"] == s["gradients"] == sum(int(np.prod(shape)) for _, _, shape in m.parameter_table())
    assert s["layers"] == 260
    # convolutions scale with the area, attention (one block at stride 32) with its square
    desc = ptl._C.network_ops(m._net)
    att = [o for o in desc["ops"] if o["kind"] == "attention"]
    assert len(att) == 2
    f1, f2 = report.count_flops(desc, (128, 128)), report.count_flops(desc, (256, 256))
    attn = lambda t: sum(2 * o["heads"] * t * t * (o["kd"] + o["hd"]) for o in att)  # noqa: E731
    assert f2 - attn(64) == 4 * (f1 - attn(16))
    assert report.summary_line(m, (128, 160)) == (
        "YOLO26n summary: 260 layers, 2,572,280 parameters, 2,572,280 gradients, %.1f GFLOPs"
        % (report.count_flops(desc, (128, 160)) / 1e9))


def synthetic_results(names, n_images=12, seed=0):
    rng = np.random.default_rng(seed)
    met = metrics.DetectionMetrics(names)
    for _ in range(n_images):
        gt = rng.uniform(0, 200, (4, 2))
        gt = np.concatenate([gt, gt + rng.uniform(10, 60, (4, 2))], 1)
        gc = rng.integers(0, len(names), 4)
        met.update(gt + rng.normal(0, 2, gt.shape), rng.uniform(0.1, 1, 4), gc, gt, gc)
    return met.compute()


def test_validation_table_format():
    names = ["cat", "dog", "traffic light"]
    res = synthetic_results(names)
    lines = report.validation_table(res, names)
    assert lines[0] == "                 Class     Images  Instances      Box(P          R      mAP50  mAP50-95)"
    assert len(lines) == 2 + len(res["classes"]) and all(len(ln) == 88 for ln in lines[:2])
    f = lines[1].split()
    assert f[:3] == ["all", "12", "48"] and float(f[3]) == float("%.3g" % res["precision"])
    assert float(f[6]) == float("%.3g" % res["mAP50-95"])
    for ln, c, i in zip(lines[2:], res["classes"], range(len(res["classes"]))):
        assert ln[:22].strip() == names[c] and int(ln[22:33]) == res["n_images"][i] and int(ln[33:44]) == res["n_gt"][i]
        assert float(ln[77:88]) == float("%.3g" % res["ap50_95"][i])
    assert report.validation_table(res, names, per_class=False) == lines[:2]
    long = "a class name of 30 characters"
    assert report.validation_table(res, names[:2] + [long])[-1].startswith(long + "  ")  # widened, not cut


class _TTY(io.StringIO):
    def isatty(self):
        return True


def _bar_trainer(res, names):
    return types.SimpleNamespace(num_training_batches=4, num_val_batches=3, current_epoch=0, sanity_checking=False, max_epochs_effective=2,
                                 progress_metrics=lambda: {"train/box_loss": 1.5},
                                 _engine=types.SimpleNamespace(last_results=res),
                                 datamodule=types.SimpleNamespace(names=names))


@pytest.mark.parametrize("tty", [True, False])
def test_progress_bar_shows_validation_then_the_table(tty):
    names = ["cat", "dog"]
    res = synthetic_results(names)
    out = _TTY() if tty else io.StringIO()
    tr = _bar_trainer(res, names)
    bar = ProgressBar(stream=out, lines_per_epoch=2)
    bar.on_train_epoch_start(tr, None)
    for i in range(4):
        bar.on_train_batch_end(tr, None, None, None, i)
    bar.on_validation_start(tr, None)
    for j in range(3):
        bar.on_validation_batch_end(tr, None, [], None, j)
    bar.on_validation_end(tr, None)
    text = out.getvalue()
    assert text.endswith("\n".join(report.validation_table(res, names)) + "\n")
    if tty:  # one line redrawn per phase, ended by a newline
        assert text.count("\r") == 4 + 3 and "validation 3/3" in text.split("\n")[1]
    else:
        assert "\r" not in text and "\x1b" not in text
        lines = text.splitlines()
        assert [ln.split()[0] for ln in lines[:5]] == ["epoch"] * 2 + ["validation"] * 3  # 4 // 2 and 3 // 2
        assert lines[4].startswith("validation 3/3") and lines[5] == report.TABLE_HEADER


def test_optimizer_line_counts_groups():
    m = ptl.Detector("yolo26n", num_classes=3)
    opt = ptl.optim.FlatOptimizer(m.flat_parameters, m.flat_gradients,
                                  m.parameter_table(), optimizer="MuSGD", lr0=0.01, momentum=0.9,
                                  weight_decay=0.0005)
    table = m.parameter_table()
    bn = sum(name.endswith(".bn.weight") for name, _, _ in table)
    muon = sum(len(shape) in (2, 4) for _, _, shape in table)
    bias = sum(name.endswith(".bias") for name, _, _ in table)
    assert bn and muon and bias and bn + muon + bias == len(table)
    assert report.optimizer_line(opt, "MuSGD", 0.01, 0.9) == (
        "optimizer: MuSGD(lr=0.01, momentum=0.9) with parameter groups %d weight(decay=0.0), %d weight(decay=0.0005), "
        "%d bias(decay=0.0)" % (bn, muon, bias))
    assert report.optimizer_line(opt, "MuSGD", 0.01, 0.9, auto=True).startswith("optimizer: 'optimizer=auto' chose")


# ---- COCO -----------------------------------------------------------------------------------------------

def _coco_gt_from_files(coco256):
    """COCO ground truth built independently of ptl: the label files and image sizes read here."""
    from PIL import Image
    d = ptl.data.read_data_yaml(str(coco256 / "data.yaml"))
    files = ptl.data.image_files(d["val"], d["path"])
    images, anns = [], []
    for f in files:
        with Image.open(f) as im:
            w, h = im.size
        iid = int(os.path.splitext(os.path.basename(f))[0])
        images.append({"id": iid, "file_name": os.path.basename(f), "height": h, "width": w})
        lp = label_path(f)
        rows = np.loadtxt(lp, ndmin=2) if os.path.exists(lp) and os.path.getsize(lp) else np.zeros((0, 5))
        for c, cx, cy, bw, bh in rows:
            anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": int(c) + 1, "iscrowd": 0,
                         "bbox": [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h], "area": bw * w * bh * h})
    return {"images": images, "annotations": anns,
            "categories": [{"id": i + 1, "name": n} for i, n in enumerate(d["names"])]}


def _run_evaluator(coco256, tmp_path, make_dets):
    """Feeds every validation batch of coco256 (imgsz 128) through a COCOEvaluator with detections made
    from the batch by make_dets(batch, h, w)."""
    data = ptl.DetectionData(str(coco256 / "data.yaml"), imgsz=128, batch_size=8, workers=2, verbose=False)
    logged = {}
    tr = types.SimpleNamespace(datamodule=data, log_dir=str(tmp_path), default_root_dir=str(tmp_path),
                               log_dict=logged.update)
    ev = coco_eval.COCOEvaluator(verbose=False)
    ev.on_validation_start(tr, None)
    for j, batch in enumerate(data.val_loader()):
        h, w = batch.images.shape[1:3]
        ev.on_validation_batch_end(tr, None, make_dets(batch, h, w), batch, j)
    ev.on_validation_epoch_end(tr, None)
    return ev, logged


def _gt_dets(batch, h, w, rng, jitter, keep=1.0, wrong=0.0):
    out = []
    for k in range(len(batch)):
        r = batch.targets[batch.targets[:, 0] == k]
        boxes = metrics.target_boxes(r[:, 2:6], (h, w)).astype(np.float64)
        cls = r[:, 1].copy()
        sel = rng.random(len(boxes)) < keep
        boxes, cls = boxes[sel] + rng.normal(0, jitter, (sel.sum(), 4)), cls[sel]
        flip = rng.random(len(cls)) < wrong
        cls[flip] = rng.integers(0, 80, flip.sum())
        fp = rng.uniform(0, min(h, w) - 20, (2, 2))
        boxes = np.concatenate([boxes, np.concatenate([fp, fp + 15], 1)])
        scores = np.concatenate([rng.uniform(0.3, 1.0, len(cls)), rng.uniform(0.001, 0.5, 2)])
        cls = np.concatenate([cls, rng.integers(0, 80, 2)])
        out.append(np.concatenate([boxes, scores[:, None], cls[:, None]], 1).astype(np.float32))
    return out


def test_coco_eval_equals_pycocotools_on_predictions_json(coco256, tmp_path):
    rng = np.random.default_rng(0)
    ev, logged = _run_evaluator(coco256, tmp_path, lambda b, h, w: _gt_dets(b, h, w, rng, 1.0, 0.85, 0.05))
    with open(os.path.join(tmp_path, "predictions.json")) as f:
        results = json.load(f)
    assert results and set(results[0]) == {"image_id", "category_id", "bbox", "score"}
    gt = _coco_gt_from_files(coco256)
    assert len(gt["annotations"]) == 898
    ref = pycocotools_stats(gt, results)
    got = [ev.stats[k] for k in coco_eval.STAT_NAMES]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)
    assert 0.3 < ev.stats["AP"] < 0.95 and logged["metrics/coco/AP"] == ev.stats["AP"]


def test_coco_eval_maps_boxes_back_to_the_original_images(coco256, tmp_path):
    """The ground truth itself, as detections in the letterboxed input: COCO's AP is 1 when the letterbox is
    undone correctly."""
    rng = np.random.default_rng(1)

    def exact(batch, h, w):
        return [d[: len(d) - 2] for d in _gt_dets(batch, h, w, rng, 0.0)]  # no jitter, no false positive
    ev, _ = _run_evaluator(coco256, tmp_path, exact)
    assert ev.stats["AP50"] == pytest.approx(1.0, abs=2e-3) and ev.stats["AP"] > 0.95


def test_scan_labels_are_the_label_files(coco256):
    data = fit_data(coco256)
    info = data.val_loader().info
    gt = _coco_gt_from_files(coco256)
    assert len(info["labels"]) == info["boxes"] == len(gt["annotations"])
    mine = coco_eval.ground_truth(data.val_loader(), data.names)
    np.testing.assert_allclose([a["bbox"] for a in mine["annotations"]], [a["bbox"] for a in gt["annotations"]],
                               atol=1e-3)
    assert [a["category_id"] for a in mine["annotations"]] == [a["category_id"] for a in gt["annotations"]]
    assert [i["id"] for i in mine["images"]] == [i["id"] for i in gt["images"]]


# ---- the Ultralytics tier -------------------------------------------------------------------------------

@pytest.mark.ultralytics
@pytest.mark.parametrize("scale", ["n", "s"] + [pytest.param(s, marks=pytest.mark.slow) for s in "mlx"])  # m..x: 30-60 s
def test_summary_line_matches_ultralytics(scale):
    """Layers, parameters and GFLOPs of Ultralytics 8.4.190's model_info for the same network and sizes."""
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import model_info
    theirs = DetectionModel("yolo26%s.yaml" % scale, nc=80, verbose=False)
    ours = ptl.Detector("yolo26" + scale, num_classes=80)
    for imgsz in (128, 640, (256, 320)):
        layers, params, grads, gflops = model_info(theirs, verbose=True, imgsz=list(imgsz) if isinstance(imgsz, tuple)
                                                   else imgsz)
        s = report.model_summary(ours, imgsz)
        assert (s["layers"], s["parameters"], s["gradients"]) == (layers, params, grads)
        assert gflops > 0 and abs(s["gflops"] - gflops) <= 0.01 * gflops, (imgsz, s["gflops"], gflops)


@pytest.mark.ultralytics
def test_optimizer_line_matches_ultralytics():
    import logging
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import LOGGER
    theirs = DetectionModel("yolo26n.yaml", nc=80, verbose=False)
    ours = ptl.Detector("yolo26n", num_classes=80)
    said = []

    class Catch(logging.Handler):
        def emit(self, record):
            said.append(re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage()))
    handler, level = Catch(), LOGGER.level
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)  # YOLO_VERBOSE=False (test_ultralytics_parity) raises it
    try:
        for name, lr in (("AdamW", 0.000119), ("MuSGD", 0.01), ("SGD", 0.01)):
            said.clear()
            stub = types.SimpleNamespace(args=types.SimpleNamespace(lr0=lr), data={"nc": 80})
            BaseTrainer.build_optimizer(stub, theirs, name=name, lr=lr, momentum=0.9, decay=0.0005)
            opt = ptl.optim.FlatOptimizer(ours.flat_parameters, ours.flat_gradients,
                                          ours.parameter_table(), optimizer=name, lr0=lr, momentum=0.9,
                                          weight_decay=0.0005)
            assert report.optimizer_line(opt, name, lr, 0.9) == said[-1]
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)


def test_without_matplotlib_one_notice_and_no_plots(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(plots._notice, "given", False)
    assert not plots.available() and not plots.available()
    assert capsys.readouterr().err.count("matplotlib is not installed") == 1
    cb = plots.Plots()
    cb.setup(types.SimpleNamespace(loggers=[CSVLogger(tmp_path)], log_dir=str(tmp_path)), None, "fit")
    assert not cb._active


def test_validate_prints_the_table_and_writes_nothing(coco256, tmp_path):
    out = io.StringIO()
    data = ptl.DetectionData(str(coco256 / "data.yaml"), imgsz=64, batch_size=4, workers=1, verbose=False)
    tr = ptl.Trainer(default_root_dir=str(tmp_path), accelerator="cpu", limit_val_batches=1,
                     callbacks=[ProgressBar(stream=out)])
    tr.validate(ptl.Detector("yolo26n"), data)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("validation 1/1")
    assert lines[1] == report.TABLE_HEADER and lines[2].split()[:2] == ["all", "8"]  # validation batches are twice the training batch
    assert len(lines) == 3 + len(tr._engine.last_results["classes"]) and os.listdir(tmp_path) == []


def test_smooth_is_the_filter_that_picks_best_conf():
    rng = np.random.default_rng(3)
    y = rng.random(1000)
    nf = 101  # round(1000 * 0.1 * 2) // 2 + 1
    ref = np.convolve(np.concatenate([np.full(50, y[0]), y, np.full(50, y[-1])]), np.ones(nf) / nf, "valid")
    np.testing.assert_allclose(metrics.smooth(y), ref, rtol=0, atol=1e-12)
    assert metrics.smooth(y, 0.05).shape == (1000,) and np.array_equal(metrics.smooth(y, 0.0), y)
    res = synthetic_results(["a", "b", "c"])
    assert res["best_index"] == int(np.argmax(metrics.smooth(res["f1_curve"].mean(0))))
    with pytest.raises(ValueError, match="box_filter: expected n >= 1"):
        metrics.smooth(np.zeros(0))
