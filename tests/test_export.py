"""ONNX export (ptl/export.py): the graph passes onnx.checker and, run by onnxruntime on the CPU, gives
Detector.predict's end-to-end detections (``end2end=True``; boxes within 1e-3 px, scores within 1e-5, the
same classes) and Detector.forward's raw one-to-one outputs (1e-5 relative)."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import ptl

from oracles import signal_state_dict

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

REPO = pathlib.Path(__file__).resolve().parent.parent
PT = pathlib.Path(__file__).resolve().parent / "data" / "yolo26n_3cls_fp16.pt"


def signal_model(scale, num_classes=80, seed=0):
    """A detector whose outputs depend on the image: BatchNorm away from its init and conv weights at twice
    the init's scale (the init shrinks activations layer by layer, leaving outputs near their biases)."""
    det = ptl.Detector("yolo26" + scale, num_classes=num_classes, seed=seed)
    sd = signal_state_dict(det, seed)
    det.load_state_dict(sd)
    return det.eval()


def coco_batch(coco256, imgsz, n):
    """n val images letterboxed by ptl's loader to imgsz (int: square), uint8 NHWC."""
    from ptl.data import image_batches
    files = sorted((coco256 / "images" / "val2017").glob("*.jpg"))[:n]
    batch = next(image_batches([str(f) for f in files], imgsz=imgsz, batch_size=n, workers=1))
    return np.ascontiguousarray(batch.images)


def session(model_proto):
    return ort.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"])


def nchw(images):
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32) / np.float32(255)


def assert_same_detections(rows, res, box_tol=1e-3, score_tol=1e-5, tie=1e-6):
    """ONNX rows (k, 6) of one image against Detector.predict's end-to-end result (all k rows: conf=-1).

    Rank by rank the scores agree within score_tol. Each row is ptl's row of the same rank (class equal, box
    within box_tol), except inside a run of ranks whose ptl scores are within `tie` of their neighbours: float
    rounding (a folded BatchNorm, another summation order) may order exact or near ties differently, so there
    the rows must be the same set. Only the last run, at the k-th place, may hold rows ptl cut off.
    Returns how many rows sit at ptl's own rank. predict clips boxes to the image (8.4.190's predictor does),
    the graph does not (nor does 8.4.190's export): the rows are clipped here to compare."""
    k = len(rows)
    h, w = res.orig_shape
    rows = rows.copy()
    rows[:, [0, 2]] = np.clip(rows[:, [0, 2]], 0, w)
    rows[:, [1, 3]] = np.clip(rows[:, [1, 3]], 0, h)
    ref_s, ref_b, ref_c = res["scores"], res["boxes"], res["classes"]
    assert len(ref_s) == k
    assert np.abs(rows[:, 4] - ref_s).max() <= score_tol
    same, start = 0, 0
    for end in range(1, k + 1):
        if end < k and ref_s[end - 1] - ref_s[end] <= tie:
            continue
        free = list(range(start, end))
        for i in range(start, end):
            hit = next((j for j in free if ref_c[j] == rows[i, 5]
                        and np.abs(ref_b[j] - rows[i, :4]).max() <= box_tol), None)
            if hit is None:
                assert end == k and ref_s[i] - ref_s[k - 1] <= tie, (
                    "rank %d: %s matches no ptl row of ranks %d..%d" % (i, rows[i], start, end - 1))
                continue
            free.remove(hit)
            same += hit == i
        start = end
    return same


def check_round_trip(det, images, imgsz, **kw):
    """Exports det (raw outputs too), runs onnxruntime, compares with predict and forward."""
    from ptl.export import build_onnx
    m = build_onnx(det, imgsz, batch=len(images), raw_outputs=True, **kw)
    onnx.checker.check_model(m, full_check=True)
    dets, boxes, scores = session(m).run(["output0", "boxes", "scores"], {"images": nchw(images)})
    out = det.forward(images)["one2one"]
    for got, want in ((boxes, out[0]), (scores, out[1])):
        assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    res = det.predict(images, conf=-1.0, end2end=True)  # every one of the k rows, as the graph gives them
    k = min(300, boxes.shape[1])
    assert dets.shape == (len(images), k, 6) and dets.dtype == np.float32
    same = [assert_same_detections(d, r) for d, r in zip(dets, res)]
    return dets, same


def test_export_n_640_matches_predict(coco256, tmp_path):
    det = signal_model("n")
    images = coco_batch(coco256, 640, 1)
    dets, same = check_round_trip(det, images, 640)
    assert same[0] >= 250  # most ranks are unambiguous; ties are rare with a signal
    assert len(np.unique(dets[0, :, 5])) > 1
    # the file written by Detector.export is the same graph, checked
    path = det.export(tmp_path / "n.onnx", imgsz=640)
    m = onnx.load(str(path))
    onnx.checker.check_model(m, full_check=True)
    assert m.opset_import[0].version >= 17
    assert [i.name for i in m.graph.input] == ["images"] and [o.name for o in m.graph.output] == ["output0"]
    meta = {p.key: p.value for p in m.metadata_props}
    assert meta["imgsz"] == "[640, 640]" and meta["end2end"] == "True" and meta["model"] == "yolo26n"
    assert not any(n.op_type == "BatchNormalization" for n in m.graph.node)  # folded into the convs
    ops = ptl._C.network_ops(det._net)["ops"]
    convs = sum(op["kind"] in ("conv", "conv_bias") for op in ops)
    head = sum(op["kind"] in ("conv", "conv_bias") and op["layer"] == 23 for op in ops)
    assert sum(n.op_type == "Conv" for n in m.graph.node) == convs - head // 2  # the one-to-many head is left out
    got = session(m).run(None, {"images": nchw(images)})[0]
    assert np.array_equal(got, dets)


def test_export_ultralytics_weights_non_square(coco256):
    """Weights from an Ultralytics .pt, a non-square input."""
    det = ptl.Detector.load(PT).eval()
    images = coco_batch(coco256, 640, 2)[:, 64:576]  # 512 x 640
    check_round_trip(det, np.ascontiguousarray(images), (512, 640))


def test_dynamic_batch_and_max_det(coco256):
    det = signal_model("n", num_classes=7, seed=1)
    images = coco_batch(coco256, 128, 3)[:, :, :96]  # 128 x 96
    images = np.ascontiguousarray(images)
    from ptl.export import build_onnx
    m = build_onnx(det, (128, 96), dynamic=True, max_det=40)
    onnx.checker.check_model(m, full_check=True)
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    s = session(m)
    all3 = s.run(None, {"images": nchw(images)})[0]
    assert all3.shape == (3, 40, 6)
    res = det.predict(images, conf=-1.0, max_det=40, end2end=True)
    for i in range(3):
        one = s.run(None, {"images": nchw(images[i:i + 1])})[0]
        assert one.shape == (1, 40, 6)
        assert_same_detections(one[0], res[i])
        assert_same_detections(all3[i], res[i])


def test_half_export_runs():
    det = signal_model("n", num_classes=3, seed=2)
    x = (np.random.default_rng(0).random((1, 3, 64, 64))).astype(np.float32)
    from ptl.export import build_onnx
    full = session(build_onnx(det, 64)).run(None, {"images": x})[0]
    m = build_onnx(det, 64, half=True)
    onnx.checker.check_model(m, full_check=True)
    half = session(m).run(None, {"images": x.astype(np.float16)})[0]
    assert half.dtype == np.float16 and half.shape == full.shape
    assert np.all(np.diff(half[0, :, 4].astype(np.float32)) <= 0)
    assert np.abs(half[0, :, 4].astype(np.float32) - full[0, :, 4]).max() < 5e-3  # scores in fp16 precision


def test_export_errors(tmp_path, monkeypatch):
    det = ptl.Detector("yolo26n", num_classes=3)
    with pytest.raises(ValueError, match="imgsz"):
        det.export(tmp_path / "x.onnx", imgsz=100)
    with pytest.raises(ValueError, match="batch"):
        det.export(tmp_path / "x.onnx", imgsz=64, batch=0)
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ImportError, match=r"ptl\[export\]"):
        det.export(tmp_path / "x.onnx", imgsz=64)
    assert not (tmp_path / "x.onnx").exists()


def test_export_after_a_short_fit_through_the_cli(coco256, tmp_path):
    data = ptl.DetectionData(str(coco256 / "data.yaml"), imgsz=64, batch_size=4, workers=2, verbose=False)
    model = ptl.Detector("yolo26n", num_classes=data.num_classes)
    tr = ptl.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, accelerator="cpu",
                     default_root_dir=tmp_path, enable_progress_bar=False)
    tr.fit(model, data)
    best = pathlib.Path(tr.log_dir) / "weights" / "best.safetensors"
    out = tmp_path / "fitted.onnx"
    r = subprocess.run([sys.executable, "-m", "ptl.export", "--model", str(best), "--imgsz", "96", "128",
                        "--output", str(out)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    m = onnx.load(str(out))
    onnx.checker.check_model(m, full_check=True)
    images = np.ascontiguousarray(coco_batch(coco256, 128, 1)[:, 16:112])  # 96 x 128
    dets = session(m).run(None, {"images": nchw(images)})[0]
    fitted = ptl.Detector.load(best)
    assert_same_detections(dets[0], fitted.predict(images, conf=-1.0, end2end=True)[0])
    from ptl.export import main
    assert main(["--model", str(best), "--imgsz", "100"]) == 2  # a bad size: one line, status 2


@pytest.mark.slow
@pytest.mark.parametrize("scale,imgsz", [("n", (384, 640)), ("s", 640), ("s", (640, 480))])
def test_export_matches_predict_more_sizes(coco256, scale, imgsz):
    det = signal_model(scale, seed=4)
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    images = np.ascontiguousarray(coco_batch(coco256, 640, 2)[:, (640 - h) // 2:(640 + h) // 2,
                                                           (640 - w) // 2:(640 + w) // 2])
    check_round_trip(det, images, imgsz)
