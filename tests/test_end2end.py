"""Which head validation measures (``Trainer(end2end=...)``, ``--end2end``), as 8.4.190's ``nms`` option:
the one-to-many head with NMS by default, the one-to-one head's top-k without NMS with end2end=True."""
import re

import numpy as np
import pytest

import ptl
import ptl.engine
from ptl import metrics
from ptl.data import DetectionData
from ptl.trainer import Trainer

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
    for flags, want in (([], False), (["--end2end"], True)):
        _, _, trainer = train._build(train.build_parser().parse_args(base + flags))
        assert trainer.end2end is want
