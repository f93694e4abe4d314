"""Which head validation and prediction use, as 8.4.190's ``nms`` option: the one-to-many head with NMS by
default (``nms=None``), the one-to-one head's top-k without NMS with ``end2end=True`` (``nms=False``).
Validation: ``Trainer(end2end=...)``, ``ptl.train --end2end``. Prediction: ``Detector.predict``,
``Trainer.predict``, ``ptl.predict --end2end``, checked against 8.4.190's own predictor (marker
``ultralytics``)."""
import os
import re

import numpy as np
import pytest

import ptl
import ptl.engine
from ptl import metrics
from ptl.data import DetectionData
from ptl.trainer import Trainer

from oracles import signal_state_dict

IMGSZ = 64


def confident_detector(seed=0):
    """yolo26n (80 classes) whose class biases put many scores above validation's conf 0.001, so both
    heads give detections (at its initialisation every score is near 1e-5)."""
    model = ptl.Detector("yolo26n", seed=seed)
    rng = np.random.default_rng(seed)
    sd = model.state_dict()
    for k, v in sd.items():
        if class_bias(k):
            sd[k] = rng.normal(-3.0, 1.0, v.shape).astype(v.dtype)
    model.load_state_dict(sd, verbose=False)
    return model


def class_bias(name):
    return re.fullmatch(r"model\.23\.(one2one_)?cv3\.\d\.2\.bias", name) is not None


def val_data(coco256):
    return DetectionData(str(coco256 / "data.yaml"), imgsz=IMGSZ, batch_size=4, workers=2, verbose=False)


def validate_recording(model, data, monkeypatch, **kw):
    """Trainer.validate's logged metrics and the detections it measured, per batch."""
    seen = []
    update = ptl.engine._update_metrics

    def spy(met, dets, batch, h, w):
        seen.append([d.copy() for d in dets])
        return update(met, dets, batch, h, w)
    monkeypatch.setattr(ptl.engine, "_update_metrics", spy)
    tr = Trainer(accelerator="cpu", enable_progress_bar=False, logger=False, enable_checkpointing=False,
                 limit_val_batches=2, **kw)
    return tr.validate(model, data)[0], seen


def expected_detections(model, data, end2end, batches=2):
    """The detections of the val batches from the public pieces: an eval forward, the chosen head's outputs
    through metrics.postprocess at validation's conf 0.001 (NMS multi-label as 8.4.190's validator)."""
    out = []
    model.eval()
    try:
        for j, batch in enumerate(data.val_loader()):
            if j >= batches:
                break
            heads = model.forward(batch.images)
            b, s = heads["one2one" if end2end else "one2many"]
            h, w = batch.images.shape[1:3]
            out.append(metrics.postprocess(b, s, (h, w), conf=0.001, end2end=end2end))
    finally:
        model.train()
    return out


def test_validation_head_follows_end2end(coco256, monkeypatch):
    model, data = confident_detector(), val_data(coco256)
    seen = {}
    for end2end in (False, True):
        _, seen[end2end] = validate_recording(model, data, monkeypatch, end2end=end2end)
        want = expected_detections(model, data, end2end)
        assert len(seen[end2end]) == len(want) == 2
        for got_batch, want_batch in zip(seen[end2end], want):
            assert len(got_batch) == len(want_batch)
            for g, w in zip(got_batch, want_batch):
                assert g.shape[0] > 0
                np.testing.assert_array_equal(g, w)
    # the two heads are different detections: the default is not the one-to-one top-k
    nms, top_k = seen[False][0][0], seen[True][0][0]
    assert nms.shape != top_k.shape or not np.array_equal(nms, top_k)


def test_default_is_nms_and_end2end_is_recorded(coco256, monkeypatch):
    model, data = confident_detector(seed=1), val_data(coco256)
    default, seen_default = validate_recording(model, data, monkeypatch)
    nms, seen_nms = validate_recording(model, data, monkeypatch, end2end=False)
    assert default == nms
    assert all(np.array_equal(a, b) for x, y in zip(seen_default, seen_nms) for a, b in zip(x, y))
    assert Trainer(accelerator="cpu").hparams()["trainer"]["end2end"] is False
    assert Trainer(accelerator="cpu", end2end=True).hparams()["trainer"]["end2end"] is True
    with pytest.raises(ptl.ConfigError, match="end2end: expected True or False"):
        Trainer(accelerator="cpu", end2end="yes")


def test_fit_records_end2end_and_resuming_with_the_other_value_warns(coco256, tmp_path):
    import yaml
    data = val_data(coco256)
    kw = dict(accelerator="cpu", enable_progress_bar=False, limit_train_batches=1, limit_val_batches=1, seed=0,
              default_root_dir=str(tmp_path))
    tr = Trainer(max_epochs=1, end2end=True, **kw)
    tr.fit(ptl.Detector("yolo26n"), data)
    assert yaml.safe_load(open(tr.log_dir + "/hparams.yaml"))["trainer"]["end2end"] is True
    last = tr.log_dir + "/checkpoints/last.ckpt"
    with pytest.warns(ptl.ResumeWarning) as caught:  # also: another max_epochs
        Trainer(max_epochs=2, end2end=False, **kw).fit(ptl.Detector("yolo26n"), data, ckpt_path=last)
    assert any("end2end True -> False" in str(w.message) for w in caught)


def test_cli_end2end_flag(coco256, tmp_path):
    from ptl import train
    base = ["--data", str(coco256 / "data.yaml"), "--imgsz", "64", "--batch", "4", "--workers", "2", "--device",
            "cpu", "--project", str(tmp_path)]
    for flags, want in (([], False), (["--end2end"], True), (["end2end=true"], True)):
        _, _, trainer = train._build(*train.resolve(base + flags))
        assert trainer.end2end is want


# ------------------------------------------------------------------------------------------- prediction

def signal_detector(seed=0, num_classes=3):
    """yolo26n whose outputs depend on the image (BatchNorm away from its init, conv weights at twice the
    init's scale), class biases that put about half the anchors above predict's conf 0.25, and box biases
    that make neighbouring boxes overlap, so that NMS suppresses."""
    det = ptl.Detector("yolo26n", num_classes=num_classes, seed=seed)
    sd = signal_state_dict(det, seed)
    for k in sd:
        if class_bias(k):
            sd[k] = np.full_like(sd[k], -1.15)
        elif re.fullmatch(r"model\.23\.(one2one_)?cv2\.\d\.2\.bias", k):
            sd[k] = np.full_like(sd[k], 3.0)
    det.load_state_dict(sd, verbose=False)
    return det


def coco_images(coco256, n=2):
    """n val images letterboxed by ptl's loader to 160, cropped to 128 x 160 (uint8 NHWC)."""
    from ptl.data import image_batches
    files = sorted((coco256 / "images" / "val2017").glob("*.jpg"))[:n]
    batch = next(image_batches([str(f) for f in files], imgsz=160, batch_size=n, workers=1))
    return np.ascontiguousarray(batch.images[:, 16:144]), files


def clipped(rows, h, w):
    b = rows[:, :4].copy()
    b[:, [0, 2]] = np.clip(b[:, [0, 2]], 0, w)
    b[:, [1, 3]] = np.clip(b[:, [1, 3]], 0, h)
    return b


def test_predict_defaults_are_the_predictors(coco256):
    det = signal_detector()
    x, _ = coco_images(coco256)
    h, w = x.shape[1:3]
    heads = det.eval().forward(x)
    det.train()
    default = det.predict(x)
    nms = metrics.postprocess(*heads["one2many"], (h, w), conf=0.25, iou=0.7, multi_label=False)
    top_k = metrics.postprocess(*heads["one2one"], (h, w), conf=0.25, end2end=True)
    for r, want, every in zip(default, nms, top_k):
        assert 0 < len(r) < len(every) == 300  # NMS suppressed some of the anchors above conf
        np.testing.assert_array_equal(r.boxes, clipped(want, h, w))
        np.testing.assert_array_equal(r.scores, want[:, 4])
        np.testing.assert_array_equal(r.classes, want[:, 5])
    for r, want in zip(det.predict(x, end2end=True), top_k):
        np.testing.assert_array_equal(r.boxes, clipped(want, h, w))
        np.testing.assert_array_equal(r.scores, want[:, 4])
    # iou and conf reach the NMS: no suppression at iou 1 (then max_det cuts), fewer rows at a higher conf
    loose = det.predict(x, iou=1.0)
    assert all(len(a) > len(b) for a, b in zip(loose, default))
    assert all(len(a) < len(b) for a, b in zip(det.predict(x, conf=0.27), default))
    with pytest.raises(ValueError, match="iou"):
        det.predict(x, iou=1.5)


def test_predict_files_trainer_and_cli_take_end2end(coco256, tmp_path):
    from ptl.predict import main
    det = signal_detector(seed=1)
    path = tmp_path / "w.safetensors"
    det.save(path)
    _, files = coco_images(coco256, 1)
    f = str(files[0])
    tr = Trainer(accelerator="cpu", enable_progress_bar=False, logger=False, enable_checkpointing=False)
    for end2end in (False, True):
        r = det.predict(f, imgsz=128, end2end=end2end)[0]
        t = tr.predict(det, f, imgsz=128, end2end=end2end)[0]
        assert np.array_equal(r.boxes, t.boxes) and np.array_equal(r.scores, t.scores)
        args = ["--model", str(path), "--source", f, "--imgsz", "128", "--save-txt", "--no-save", "--save-conf",
                "--project", str(tmp_path)] + (["--end2end"] if end2end else [])
        assert main(args) == 0
        run = sorted((tmp_path / "runs" / "predict").iterdir())[-1]
        rows = np.loadtxt(run / "labels" / (files[0].stem + ".txt"), ndmin=2)
        assert rows.shape[0] == len(r) and np.abs(rows[:, 5] - r.scores).max() < 1e-6
    assert len(det.predict(f, imgsz=128)[0]) != len(det.predict(f, imgsz=128, end2end=True)[0])
    assert main(["--model", str(path), "--source", f, "--iou", "2"]) == 2


@pytest.mark.ultralytics
@pytest.mark.parametrize("end2end", [False, True])
def test_predict_equals_ultralytics_predictor(coco256, end2end):
    """8.4.190's YOLO.predict with its defaults (conf 0.25, iou 0.7, nms=None: the one-to-many head, best
    class per anchor) or nms=False, on the same weights and the same network-ready tensor: the same
    detections, boxes within 1e-3 px, scores within 1e-5 (its predictor folds BatchNorm into the convs)."""
    torch = pytest.importorskip("torch")
    ultralytics = pytest.importorskip("ultralytics")
    assert ultralytics.__version__ == "8.4.190"
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO
    from ultralytics.nn.tasks import DetectionModel
    det = signal_detector(seed=2)
    yolo = YOLO("yolo26n.yaml")
    yolo.model = DetectionModel("yolo26n.yaml", nc=3, verbose=False)
    yolo.model.names = {0: "a", 1: "b", 2: "c"}
    missing, unexpected = yolo.model.load_state_dict({k: torch.from_numpy(v) for k, v in det.state_dict().items()},
                                                     strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
    x, _ = coco_images(coco256)
    nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2), dtype=np.float32) / np.float32(255)
    kw = {"nms": False} if end2end else {}
    want = yolo.predict(torch.from_numpy(nchw), device="cpu", verbose=False, **kw)
    got = det.predict(nchw, end2end=end2end)
    for g, u in zip(got, want):
        ub, us, uc = (u.boxes.xyxy.numpy(), u.boxes.conf.numpy(), u.boxes.cls.numpy())
        assert 0 < len(g) == len(us)
        np.testing.assert_allclose(g.scores, us, rtol=0, atol=1e-5)
        free = list(range(len(us)))
        for i in range(len(g)):  # ranks may swap between scores within 1e-5; rows must pair up
            j = next((j for j in free if uc[j] == g.classes[i] and abs(us[j] - g.scores[i]) <= 1e-5
                      and np.abs(ub[j] - g.boxes[i]).max() <= 1e-3), None)
            assert j is not None, "ptl row %d %s %s has no Ultralytics row" % (i, g.boxes[i], g.scores[i])
            free.remove(j)
